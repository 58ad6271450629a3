/* kd_fresh.c - the storages a DebugMode knows to hold uninitialized memory.
 *
 * Note [Fresh buffers]
 * A tensor made by an aten::empty* op holds whatever memory the allocator
 * gave until something writes it (nn.Linear's init runs empty, then
 * uniform_; DDP's gradient bucket is empty, then as_strided views filled by
 * the reducer).  Hashing it before that write would make two runs differ in
 * memory nobody computed, so under hash_inputs an op's written arguments
 * that are still fresh get None for input hashes (as out= buffers do), and a
 * view op of a fresh buffer is not hashed (mode.py, kd_dispatch.c,
 * kd_hash_args.c).  The table (mode._fresh, a dict) is keyed by the storage
 * itself, not its data pointer, and holds a weak reference to it:
 *   - a storage freed and its memory reused by a tensor some op computed
 *     (an op returning a tuple, a compiled graph's output: allocations
 *     kdebug never sees) is not that storage: keyed by data pointer, the
 *     computed tensor was taken for fresh and its input hashes were lost;
 *   - the weak reference keeps the storage object (not its memory) from
 *     being freed while the entry lives, so its address names no other
 *     storage meanwhile; entries of storages with no users left are dropped
 *     whenever the table doubles, so it stays bounded.
 * A storage stops being fresh when an op the mode sees writes it: every
 * argument its schema writes (positional or keyword, tensors or lists of
 * them; every tensor argument when the schema cannot say) and every tensor
 * it returns (kd_op_writes.c, kd_op_track_fresh).  Writes kdebug does not see
 * as ops (a compiled kernel writing a graph input, a Python extension
 * writing through data_ptr) leave it fresh: that tensor's later input hashes
 * are None, never a hash of memory nobody computed. */
#include "kd_fresh.h"

#include "kd_shim.h"

static const char CAPSULE[] = "kdebug.fresh_storage";

static void release_weak(PyObject *capsule)
{
    kd_shim_storage_weak_release(PyCapsule_GetPointer(capsule, CAPSULE));
}

int kd_fresh_check(PyObject *fresh) { return PyDict_CheckExact(fresh); }

/* Drops the entries whose storage has no users left. */
static int purge(PyObject *fresh)
{
    PyObject *dead = PyList_New(0);
    if (dead == NULL)
        return -1;
    PyObject *k, *v;
    Py_ssize_t pos = 0;
    while (PyDict_Next(fresh, &pos, &k, &v))
        if (!(PyCapsule_IsValid(v, CAPSULE) && kd_shim_storage_weak_alive(PyCapsule_GetPointer(v, CAPSULE))) &&
            PyList_Append(dead, k) < 0) {
            Py_DECREF(dead);
            return -1;
        }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(dead); i++)
        if (PyDict_DelItem(fresh, PyList_GET_ITEM(dead, i)) < 0) {
            Py_DECREF(dead);
            return -1;
        }
    Py_DECREF(dead);
    return 0;
}

static int mark_one(PyObject *fresh, PyObject *t, int add)
{
    if (!add) {
        if (PyDict_GET_SIZE(fresh) == 0)
            return 0;
        uint64_t key = kd_shim_storage_key(t);
        if (key == 0)
            return 0;
        PyObject *k = PyLong_FromUnsignedLongLong(key);
        if (k == NULL)
            return -1;
        int has = PyDict_Contains(fresh, k);
        int rc = has > 0 ? PyDict_DelItem(fresh, k) : has;
        Py_DECREF(k);
        return rc < 0 ? -1 : 0;
    }
    uint64_t key = 0;
    void *weak = kd_shim_storage_weak(t, &key);
    if (weak == NULL)
        return 0; /* no tensor, or no storage: nothing to mark */
    PyObject *cap = PyCapsule_New(weak, CAPSULE, release_weak);
    if (cap == NULL) {
        kd_shim_storage_weak_release(weak);
        return -1;
    }
    PyObject *k = PyLong_FromUnsignedLongLong(key);
    int rc = k ? PyDict_SetItem(fresh, k, cap) : -1;
    Py_XDECREF(k);
    Py_DECREF(cap);
    Py_ssize_t n = PyDict_GET_SIZE(fresh);
    if (rc == 0 && n >= 64 && (n & (n - 1)) == 0) /* the table doubled: drop the dead */
        rc = purge(fresh);
    return rc;
}

int kd_fresh_mark(PyObject *fresh, PyObject *o, int add)
{
    if (PyList_Check(o) || PyTuple_Check(o)) {
        PyObject *fast = PySequence_Fast(o, "");
        if (fast == NULL)
            return -1;
        int rc = 0;
        for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(fast) && rc == 0; i++)
            rc = mark_one(fresh, PySequence_Fast_GET_ITEM(fast, i), add);
        Py_DECREF(fast);
        return rc;
    }
    return mark_one(fresh, o, add);
}

int kd_fresh_contains(PyObject *fresh, PyObject *t)
{
    if (PyDict_GET_SIZE(fresh) == 0)
        return 0;
    uint64_t key = kd_shim_storage_key(t);
    if (key == 0)
        return 0;
    PyObject *k = PyLong_FromUnsignedLongLong(key);
    if (k == NULL)
        return -1;
    int in = PyDict_Contains(fresh, k);
    Py_DECREF(k);
    return in;
}

/* _fresh_storages() -> a new, empty table (DebugMode._fresh). */
static PyObject *fresh_storages(PyObject *m, PyObject *unused)
{
    (void)m, (void)unused;
    return PyDict_New();
}

static PyMethodDef fresh_methods[] = {
    {"_fresh_storages", fresh_storages, METH_NOARGS,
     "_fresh_storages() -> a DebugMode's table of fresh storages (Note [Fresh buffers])."},
    {NULL, NULL, 0, NULL},
};

int kd_fresh_module_init(PyObject *m) { return PyModule_AddFunctions(m, fresh_methods); }
