/* kd_state_record.c - records of replica state (Note [Replica state records]).
 *
 * Note [Replica state records]
 * The flight recorder compares, across the ranks of a data-parallel job,
 * what must be the same on every rank: the gradients the optimizer step
 * starts from (reduced across ranks) and the parameters and optimizer state
 * it leaves (kdebug/flight.py, Note [Flight recorder]).  Each such set of
 * tensors becomes one record in the recorder's ring, as if a kernel named
 * `name` had written them all: kd_launch_begin / kd_launch_end with every
 * argument in the W role and nothing launched between, so the tensors are
 * hashed by the launch path itself (on the GPU: kdebug's hash kernel on the
 * device's current stream, batched, read back without a synchronization),
 * and the record takes part in step digests, dumps and compares like any
 * launch.  The caller groups tensors by device (a record has one device) and
 * passes at most KD_GPU_BATCH_MAX (STATE_RECORD_MAX) of them per record: the
 * launch path queues that many CUDA tensors of one launch on the GPU and
 * hashes the rest on the host, through a copy (seen on the H200: a record of
 * an AdamW state of 200 tensors made the step 2.8x slower).
 *
 * A record's GPU hashes are launched at once (kd_tls_hash_now), never left
 * in the deferred queue (Note [Deferred GPU work]): nothing is launched
 * between the record's begin and end, so there is no later kernel to batch
 * them with, and a queued hash in a kernels_only recording installs the C++
 * write guard (Note [C++ write guard]), which makes torch box every op's
 * inputs on every thread for as long as the recording lasts.  The flight
 * recorder's optimizer window hashes nothing but these records under
 * hashes="compared": launched at once, they leave the guard uninstalled
 * (on the H200, releasing the guard after each window saved 0.13-0.45 ms of
 * a 7.6-8.8 ms transformer step).  One hash kernel per record (up to
 * KD_CUDA_BATCH = KD_GPU_BATCH_MAX tensors: Note [One hash kernel per batch]
 * in kd_cuda_hash.cu), in the same stream order.  Not covered: a
 * compiled optimizer step's own launches in the window are hashed through
 * the queue as any launch, and install the guard for the rest of the
 * recording; so do copies of a record's tensors under a user's
 * record_outputs (kd_defer_clone).
 */
#include <string.h>

#include "kd_cpp_launch.h"
#include "kd_hook.h"
#include "kd_kernel_info.h"
#include "kd_launch.h"
#include "kd_launch_hash.h"
#include "kd_module.h"
#include "kd_recorder.h"
#include "kd_shim.h"
#include "kd_state_record.h"

/* Counts a record kdebug's string table had no room to name; returns False. */
static PyObject *table_full(kd_recorder *r)
{
    kd_recorder_error(r, "a replica state record was not recorded: kdebug's string table is full");
    r->unrecorded++;
    Py_RETURN_FALSE;
}

/* Note [Replica names interned once]
 * A replica record's argument names (about 260 a step under the flight
 * recorder: every gradient, parameter and optimizer state) were interned at
 * every record, each a hash and a mutex in kd_strings, about 40% of
 * record_state's own time (perf, the CPU machine).  The flight recorder's
 * plans are cached across steps, so it interns each record's names once
 * (intern_names: their ids packed as native uint32) and hands record_state
 * the ids; a list of str still works (kdebug.replicated marks).  Ids never
 * change (kd_strtab.h); an id 0 is a name the full table could not take.  A
 * NUL in a name (torch allows one in a parameter's name; the table takes
 * none) is interned as the two characters \0 (intern_label): the record
 * was dropped whole before, reported as a full table. */

/* The string id of a tensor's name: a NUL in it (torch takes
 * register_parameter("w\x00x", ...); kd_strings takes no NUL) is written as
 * the two characters \0.  0: the table is full (or out of memory). */
static uint32_t intern_label(const char *s, Py_ssize_t len)
{
    if (memchr(s, '\0', (size_t)len) == NULL)
        return kd_strtab_intern(kd_strings, s, (size_t)len);
    char *buf = PyMem_Malloc((size_t)len * 2 + 1);
    if (buf == NULL)
        return 0;
    size_t k = 0;
    for (Py_ssize_t i = 0; i < len; i++) {
        if (s[i] == '\0') {
            buf[k++] = '\\';
            buf[k++] = '0';
        } else {
            buf[k++] = s[i];
        }
    }
    uint32_t id = kd_strtab_intern(kd_strings, buf, k);
    PyMem_Free(buf);
    return id;
}

/* The string id of name object nm (a str: intern_label), into *id; -1 with a
 * TypeError naming `who` for anything else. */
static int name_id(PyObject *nm, const char *who, uint32_t *id)
{
    Py_ssize_t len;
    const char *s = PyUnicode_Check(nm) ? PyUnicode_AsUTF8AndSize(nm, &len) : NULL;
    if (s == NULL) {
        if (!PyErr_Occurred())
            PyErr_Format(PyExc_TypeError, "%s: each name must be a str", who);
        return -1;
    }
    *id = intern_label(s, len); /* 0: the table is full (record_state counts it) */
    return 0;
}

/* intern_names(names) -> bytes: the names' string ids, native uint32 each */
static PyObject *intern_names(PyObject *m, PyObject *arg)
{
    (void)m;
    if (!PyList_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "intern_names takes a list of str");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(arg);
    PyObject *out = PyBytes_FromStringAndSize(NULL, n * (Py_ssize_t)sizeof(uint32_t));
    if (out == NULL)
        return NULL;
    uint32_t *ids = (uint32_t *)PyBytes_AS_STRING(out);
    for (Py_ssize_t i = 0; i < n; i++)
        if (name_id(PyList_GET_ITEM(arg, i), "intern_names", &ids[i]) != 0) {
            Py_DECREF(out);
            return NULL;
        }
    return out;
}

/* record_state(name, arg_names, tensors) -> bool; arg_names: a list of str
 * or intern_names' bytes (Note [Replica names interned once]) */
static PyObject *record_state(PyObject *m, PyObject *args)
{
    (void)m;
    const char *name;
    PyObject *names, *tensors;
    if (!PyArg_ParseTuple(args, "sOO!:record_state", &name, &names, &PyList_Type, &tensors))
        return NULL;
    const int by_id = PyBytes_Check(names);
    if (!by_id && !PyList_Check(names)) {
        PyErr_SetString(PyExc_TypeError, "record_state: give the names as a list of str or intern_names' bytes");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(tensors);
    const int one_name_each = by_id ? PyBytes_GET_SIZE(names) == n * (Py_ssize_t)sizeof(uint32_t)
                                    : PyList_GET_SIZE(names) == n;
    if (n < 1 || n > KD_GPU_BATCH_MAX || !one_name_each) {
        PyErr_Format(PyExc_ValueError, "record_state takes 1 to %d tensors, each with a name", KD_GPU_BATCH_MAX);
        return NULL;
    }
    if (by_id) {
        const uint32_t *given = (const uint32_t *)PyBytes_AS_STRING(names);
        const uint32_t count = kd_strtab_count(kd_strings);
        for (Py_ssize_t i = 0; i < n; i++)
            if (given[i] > count) {
                PyErr_SetString(PyExc_ValueError, "record_state: a name id that intern_names did not give");
                return NULL;
            }
    }
    kd_recorder *r = kd_active_recorder();
    if (r == NULL)
        Py_RETURN_FALSE;
    uint32_t name_ids[KD_GPU_BATCH_MAX];
    uint8_t roles[KD_GPU_BATCH_MAX];
    PyObject *objs[KD_GPU_BATCH_MAX];
    kd_kernel_info info;
    memset(&info, 0, sizeof info);
    info.kind = KD_KIND_ATEN;
    info.name_id = kd_strtab_intern(kd_strings, name, strlen(name));
    if (info.name_id == 0)
        return table_full(r);
    info.device_type = KD_DEV_CPU;
    info.device_index = -1;
    uint64_t stream = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (by_id) {
            memcpy(&name_ids[i], PyBytes_AS_STRING(names) + i * (Py_ssize_t)sizeof(uint32_t), sizeof(uint32_t));
        } else if (name_id(PyList_GET_ITEM(names, i), "record_state", &name_ids[i]) != 0) {
            return NULL;
        }
        if (name_ids[i] == 0)
            return table_full(r);
        roles[i] = KD_ROLE_WRITE;
        objs[i] = PyList_GET_ITEM(tensors, i);
        if (i == 0 && !kd_launch_device_of(objs[0], &info, &stream)) {
            PyErr_SetString(PyExc_TypeError, "record_state takes tensors");
            return NULL;
        }
    }
    info.nnames = (uint32_t)n;
    info.name_ids = name_ids;
    info.roles = roles;
    kd_pending p;
    memset(&kd_tls_capture, 0, sizeof kd_tls_capture); /* no grid: nothing was launched */
    /* The record runs Python code (the mode's call_depth, hashers): it may
     * empty the caller's list or stop and drop the recorder, so both are held
     * here, as the launch hooks hold theirs. */
    for (Py_ssize_t i = 0; i < n; i++)
        Py_INCREF(objs[i]);
    Py_INCREF(r);
    int was = kd_tls_hash_now;
    kd_tls_hash_now = 1;
    kd_launch_begin(r, &info, objs, n, stream, &p);
    kd_launch_end(r, &p, objs, n, 0);
    kd_tls_hash_now = was;
    Py_DECREF(r);
    for (Py_ssize_t i = 0; i < n; i++)
        Py_DECREF(objs[i]);
    Py_RETURN_TRUE;
}

/* Note [Plain replica tensors]
 * The flight recorder reuses a step's record layout for the gradients while
 * each has data of its own on the device it had (kdebug/flight.py,
 * _grads_plan; the gradients are new tensors every step).  Asked of Python,
 * that took about 1.4 us a gradient on the H200 host (p.grad.device, a
 * torch.device made and compared, and _upstream.has_no_data), 69 us of an
 * AdamW step of 50 parameters.  replica_devices asks it of all of them at
 * once: for each tensor of one of the plain Python types given (torch.Tensor,
 * nn.Parameter) that the shim finds plainly holding data
 * (kd_shim_plain_data: the fast path of has_no_data, by dispatch keys), a
 * device code; None for None; and no answer at all (None) as soon as one is
 * anything else, so the caller takes its Python path, which decides. */

/* replica_devices(tensors, plain_types) -> [int | None] | None */
static PyObject *replica_devices(PyObject *m, PyObject *args)
{
    (void)m;
    PyObject *tensors, *types;
    if (!PyArg_ParseTuple(args, "O!O!:replica_devices", &PyList_Type, &tensors, &PyTuple_Type, &types))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(tensors), nt = PyTuple_GET_SIZE(types);
    PyObject *out = PyList_New(n);
    if (out == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *t = PyList_GET_ITEM(tensors, i);
        if (t == Py_None) {
            PyList_SET_ITEM(out, i, Py_NewRef(Py_None));
            continue;
        }
        int plain_type = 0;
        for (Py_ssize_t k = 0; k < nt && !plain_type; k++)
            plain_type = (PyObject *)Py_TYPE(t) == PyTuple_GET_ITEM(types, k);
        int dev = 0;
        PyObject *code = plain_type && kd_shim_plain_data(t, &dev) == 1 ? PyLong_FromLong(dev) : NULL;
        if (code == NULL) {
            Py_DECREF(out);
            if (PyErr_Occurred())
                return NULL;
            Py_RETURN_NONE;
        }
        PyList_SET_ITEM(out, i, code);
    }
    return out;
}

static PyMethodDef state_record_methods[] = {
    {"replica_devices", replica_devices, METH_VARARGS,
     "replica_devices(tensors, plain_types) -> per tensor a device code (None for None), or None when one is "
     "not plainly a tensor of its own data (Note [Plain replica tensors])."},
    {"record_state", record_state, METH_VARARGS,
     "record_state(name, arg_names, tensors) -> bool: one record, as if kernel `name` wrote `tensors` (all on "
     "one device), into this thread's active recorder (False: none); arg_names: a list of str or "
     "intern_names' bytes; Note [Replica state records]."},
    {"intern_names", intern_names, METH_O,
     "intern_names(names) -> bytes: the names' string ids (native uint32 each; 0: kdebug's string table is "
     "full), for record_state (Note [Replica names interned once])."},
    {NULL, NULL, 0, NULL},
};

int kd_state_record_module_init(PyObject *m)
{
    if (PyModule_AddIntConstant(m, "STATE_RECORD_MAX", KD_GPU_BATCH_MAX) != 0)
        return -1;
    return PyModule_AddFunctions(m, state_record_methods);
}
