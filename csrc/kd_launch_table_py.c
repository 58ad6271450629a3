/* kd_launch_table_py.c - the Python face of the launch table (Note [Launch
 * table] in core/kd_launch_table.h): LaunchTable (a table a trace reader
 * fills, for a kdebug.Run), the launch digests of a table or a recorder's,
 * and a live aten op's digests. */
#include "kd_launch_table_py.h"

#include "kd_hash_tree.h"
#include "kd_launch_table.h"
#include "kd_module.h"
#include "kd_recorder.h"
#include "kd_trace.h"
#include "kd_trace_digest.h"
#include "kd_trace_py.h"
#include "kd_view.h"

/* ---------------- LaunchTable ---------------- */

typedef struct {
    PyObject_HEAD
    kd_ltab table;
    struct kd_launch_view *views; /* GIL; live Launch views of it */
} kd_launch_table;

PyTypeObject kd_LaunchTableType;

static PyObject *lt_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    if (!PyArg_ParseTuple(args, ":LaunchTable") || (kw != NULL && PyDict_GET_SIZE(kw) != 0)) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "LaunchTable() takes no arguments");
        return NULL;
    }
    kd_launch_table *self = (kd_launch_table *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    kd_ltab_init(&self->table);
    self->views = NULL;
    return (PyObject *)self;
}

/* Frees the table (its views hold references to it: none is left). */
static void lt_dealloc(kd_launch_table *self)
{
    kd_ltab_free(&self->table);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static Py_ssize_t lt_len(kd_launch_table *self) { return (Py_ssize_t)self->table.store.nlaunches; }

/* launch(i) -> a Launch view of launch i. */
static PyObject *lt_launch(kd_launch_table *self, PyObject *arg)
{
    Py_ssize_t i = PyLong_AsSsize_t(arg);
    if (i == -1 && PyErr_Occurred())
        return NULL;
    if (i < 0)
        i += (Py_ssize_t)self->table.store.nlaunches;
    if (i < 0 || (uint64_t)i >= self->table.store.nlaunches) {
        PyErr_SetString(PyExc_IndexError, "launch index out of range");
        return NULL;
    }
    return kd_table_view_new((PyObject *)self, &self->table, &self->views, (uint64_t)i);
}

static PyMethodDef lt_methods[] = {
    {"launch", (PyCFunction)lt_launch, METH_O, "launch(i): a view of launch i."},
    {NULL, NULL, 0, NULL},
};

static PySequenceMethods lt_as_sequence = {
    .sq_length = (lenfunc)lt_len,
};

PyTypeObject kd_LaunchTableType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kdebug._C.LaunchTable",
    .tp_basicsize = sizeof(kd_launch_table),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "LaunchTable(): the launches of a run read from a trace (table_fill), with no ring and no hooks: "
              "what a kdebug.Run's kernel records are views of (Note [Launch table]).",
    .tp_new = lt_new,
    .tp_dealloc = (destructor)lt_dealloc,
    .tp_methods = lt_methods,
    .tp_as_sequence = &lt_as_sequence,
};

/* The launch table of a Recorder or a LaunchTable, or NULL with a TypeError. */
static kd_ltab *table_of(PyObject *o, const char *fn)
{
    if (PyObject_TypeCheck(o, &kd_RecorderType))
        return &((kd_recorder *)o)->table;
    if (PyObject_TypeCheck(o, &kd_LaunchTableType))
        return &((kd_launch_table *)o)->table;
    PyErr_Format(PyExc_TypeError, "%s() takes a Recorder or a LaunchTable, not %.100s", fn, Py_TYPE(o)->tp_name);
    return NULL;
}

/* ---------------- functions ---------------- */

/* launch_digests(table) -> bytes: nlaunches x KD_DG_N native u64, the
 * digests of the launches of a LaunchTable or of a Recorder's table (its
 * drained launches), in table order. */
static PyObject *launch_digests(PyObject *self, PyObject *arg)
{
    (void)self;
    const kd_ltab *t = table_of(arg, "launch_digests");
    if (t == NULL)
        return NULL;
    uint64_t n = t->store.nlaunches;
    PyObject *out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(n * KD_DG_N * sizeof(uint64_t)));
    if (out == NULL)
        return NULL;
    kd_ltab_digests(t, 0, n, kd_strings, (uint64_t *)(void *)PyBytes_AS_STRING(out));
    return out;
}

/* range_digest(table, start, stop) -> int: kd_ltab_range_digest of launches
 * [start, stop) of a LaunchTable or a Recorder's table. */
static PyObject *range_digest(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *o;
    unsigned long long start, stop;
    if (!PyArg_ParseTuple(args, "OKK", &o, &start, &stop))
        return NULL;
    const kd_ltab *t = table_of(o, "range_digest");
    if (t == NULL)
        return NULL;
    return PyLong_FromUnsignedLongLong(kd_ltab_range_digest(t, start, stop, kd_strings));
}

/* op_digests(depth, flags, name, text, in_tree, out_tree) -> bytes: the
 * KD_DG_N native u64 digests of a live aten op, equal to those of its trace
 * record (the same arguments as TraceWriter.op). */
static PyObject *op_digests(PyObject *self, PyObject *args)
{
    (void)self;
    unsigned int depth, flags;
    const char *name, *text;
    Py_ssize_t nl, tl;
    PyObject *in_tree, *out_tree;
    if (!PyArg_ParseTuple(args, "IIs#s#OO", &depth, &flags, &name, &nl, &text, &tl, &in_tree, &out_tree))
        return NULL;
    PyObject *ib = NULL, *ob = NULL;
    if (((flags & KD_OPF_IN_HASH) && (ib = kd_hash_tree_bytes(in_tree)) == NULL) ||
        ((flags & KD_OPF_OUT_HASH) && (ob = kd_hash_tree_bytes(out_tree)) == NULL)) {
        Py_XDECREF(ib);
        return NULL;
    }
    uint64_t dg[KD_DG_N];
#define KD_BYTES(o) (o) ? (const uint8_t *)PyBytes_AS_STRING(o) : NULL, (o) ? (size_t)PyBytes_GET_SIZE(o) : 0
    kd_op_digests(kd_dg_bytes((const uint8_t *)name, (size_t)nl), depth,
                  kd_text_prefix_digest((const uint8_t *)text, (size_t)tl),
                  kd_text_value_digest((const uint8_t *)text, (size_t)tl), flags, KD_BYTES(ib), KD_BYTES(ob), dg);
#undef KD_BYTES
    Py_XDECREF(ib);
    Py_XDECREF(ob);
    return PyBytes_FromStringAndSize((const char *)dg, sizeof dg);
}

/* key_digest(kind, name) -> int: the KD_DG_KEY digest of a step of that kind
 * (an aten op's: 2; a launch's: its KD_KIND_*) named `name`, as the signed
 * int64 a digest table's column holds. */
static PyObject *key_digest(PyObject *self, PyObject *args)
{
    (void)self;
    unsigned int kind;
    const char *name;
    Py_ssize_t nl;
    if (!PyArg_ParseTuple(args, "Is#", &kind, &name, &nl))
        return NULL;
    uint64_t d = kd_dg_mix(kind, kd_dg_bytes((const uint8_t *)name, (size_t)nl));
    return PyLong_FromLongLong((long long)d);
}

/* The written-spec -> this process's spec map of dict d as an array (*n entries). */
static uint16_t *spec_array(PyObject *d, uint32_t *n)
{
    /* every key and value converted once, from a copy of the pairs (a key's
     * or value's __index__ is Python code: read twice it could answer
     * differently, or change the dict), then the array sized to the largest */
    PyObject *items = PyDict_Items(d);
    if (items == NULL)
        return NULL;
    const Py_ssize_t np = PyList_GET_SIZE(items);
    uint16_t *pairs = PyMem_Malloc(sizeof *pairs * 2 * (size_t)(np ? np : 1));
    uint16_t *a = NULL;
    long top = -1;
    if (pairs == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < np; i++) {
        PyObject *kv = PyList_GET_ITEM(items, i);
        long x = PyLong_AsLong(PyTuple_GET_ITEM(kv, 0));
        long s = x == -1 && PyErr_Occurred() ? -1 : PyLong_AsLong(PyTuple_GET_ITEM(kv, 1));
        if (PyErr_Occurred())
            goto done;
        if (x < 0 || x > 0xffff || s < 0 || s > 0xffff) {
            PyErr_SetString(PyExc_ValueError, "table_fill: hash spec ids are 0 to 65535");
            goto done;
        }
        pairs[2 * i] = (uint16_t)x;
        pairs[2 * i + 1] = (uint16_t)s;
        top = x > top ? x : top;
    }
    *n = (uint32_t)(top + 1);
    a = PyMem_Calloc(*n ? *n : 1, sizeof *a);
    if (a == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < np; i++)
        a[pairs[2 * i]] = pairs[2 * i + 1];
done:
    PyMem_Free(pairs);
    Py_DECREF(items);
    return a;
}

/* table_fill(table, reader, spec_map, start, stop) -> list of the record
 * indices of the launches among records [start, stop), appended to the
 * LaunchTable with global string ids and this process's hash spec ids
 * (spec_map: written id -> this process's; others become 0). */
static PyObject *table_fill(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *to, *reader, *spec_map;
    unsigned long long start, stop;
    if (!PyArg_ParseTuple(args, "O!O!O!KK", &kd_LaunchTableType, &to, &kd_TraceReaderType, &reader, &PyDict_Type,
                          &spec_map, &start, &stop))
        return NULL;
    uint32_t *map;
    const kd_tr *r = kd_trace_reader_ids(reader, &map);
    if (r == NULL)
        return NULL;
    if (stop > r->nrec)
        stop = r->nrec;
    if (start > stop)
        start = stop;
    kd_ltab_ids ids = {kd_strings, map, NULL, 0};
    uint16_t *spec = spec_array(spec_map, &ids.nspec);
    uint64_t *idx = PyMem_Malloc((size_t)(stop - start + 1) * sizeof *idx);
    if (spec == NULL || idx == NULL) {
        PyMem_Free(spec);
        PyMem_Free(idx);
        return spec == NULL ? NULL : PyErr_NoMemory();
    }
    ids.spec = spec;
    int64_t n = kd_ltab_fill_trace(&((kd_launch_table *)to)->table, r, start, stop, &ids, idx);
    PyMem_Free(spec);
    PyObject *out = NULL;
    if (n == -1) {
        PyErr_NoMemory();
    } else if (n == -2) {
        PyErr_SetString(PyExc_ValueError, "table_fill: a launch record could not be decoded");
    } else if ((out = PyList_New((Py_ssize_t)n)) != NULL) {
        for (int64_t k = 0; k < n; k++) {
            PyObject *x = PyLong_FromUnsignedLongLong(idx[k]);
            if (x == NULL) {
                Py_CLEAR(out);
                break;
            }
            PyList_SET_ITEM(out, (Py_ssize_t)k, x);
        }
    }
    PyMem_Free(idx);
    return out;
}

static PyMethodDef table_methods[] = {
    {"launch_digests", launch_digests, METH_O,
     "launch_digests(table) -> bytes: a LaunchTable's or Recorder's launch digests, nlaunches x 5 native u64"},
    {"range_digest", range_digest, METH_VARARGS,
     "range_digest(table, start, stop) -> int: one order-free digest of launches [start, stop)"},
    {"op_digests", op_digests, METH_VARARGS,
     "op_digests(depth, flags, name, text, in_tree, out_tree) -> bytes: an aten op's 5 native u64 digests"},
    {"key_digest", key_digest, METH_VARARGS,
     "key_digest(kind, name) -> int: the key digest of a step of that kind and name (signed int64)"},
    {"table_fill", table_fill, METH_VARARGS,
     "table_fill(table, reader, spec_map, start, stop) -> record indices of the launches appended"},
    {NULL, NULL, 0, NULL},
};

int kd_launch_table_module_init(PyObject *m)
{
    if (PyType_Ready(&kd_LaunchTableType) != 0 ||
        PyModule_AddObjectRef(m, "LaunchTable", (PyObject *)&kd_LaunchTableType) != 0)
        return -1;
    return PyModule_AddFunctions(m, table_methods);
}
