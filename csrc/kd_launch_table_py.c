/* kd_launch_table_py.c - the Python face of the launch table (Note [Launch
 * table] in core/kd_launch_table.h): a recorder's launch digests, a live aten
 * op's digests, and filling a recorder's table from a trace reader. */
#include "kd_launch_table_py.h"

#include "kd_hash_tree.h"
#include "kd_launch_table.h"
#include "kd_module.h"
#include "kd_recorder.h"
#include "kd_trace.h"
#include "kd_trace_digest.h"
#include "kd_trace_py.h"

/* launch_digests(recorder) -> bytes: nlaunches x KD_DG_N native u64, the
 * digests of the recorder's drained launches in store order. */
static PyObject *launch_digests(PyObject *self, PyObject *arg)
{
    (void)self;
    if (!PyObject_TypeCheck(arg, &kd_RecorderType)) {
        PyErr_Format(PyExc_TypeError, "launch_digests() takes a Recorder, not %.100s", Py_TYPE(arg)->tp_name);
        return NULL;
    }
    const kd_ltab *t = &((kd_recorder *)arg)->table;
    uint64_t n = t->store.nlaunches;
    PyObject *out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(n * KD_DG_N * sizeof(uint64_t)));
    if (out == NULL)
        return NULL;
    kd_ltab_digests(t, 0, n, kd_strings, (uint64_t *)(void *)PyBytes_AS_STRING(out));
    return out;
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
                  kd_text_prefix_digest((const uint8_t *)text, (size_t)tl), flags, KD_BYTES(ib), KD_BYTES(ob), dg);
#undef KD_BYTES
    Py_XDECREF(ib);
    Py_XDECREF(ob);
    return PyBytes_FromStringAndSize((const char *)dg, sizeof dg);
}

/* The written-spec -> this process's spec map of dict d as an array (*n entries). */
static uint16_t *spec_array(PyObject *d, uint32_t *n)
{
    PyObject *k, *v;
    Py_ssize_t pos = 0;
    long top = -1;
    while (PyDict_Next(d, &pos, &k, &v)) {
        long x = PyLong_AsLong(k);
        if (x == -1 && PyErr_Occurred())
            return NULL;
        if (x < 0 || x > 0xffff) {
            PyErr_SetString(PyExc_ValueError, "table_fill: hash spec ids are 0 to 65535");
            return NULL;
        }
        top = x > top ? x : top;
    }
    *n = (uint32_t)(top + 1);
    uint16_t *a = PyMem_Calloc(*n ? *n : 1, sizeof *a);
    if (a == NULL)
        return (uint16_t *)PyErr_NoMemory();
    pos = 0;
    while (PyDict_Next(d, &pos, &k, &v)) {
        long s = PyLong_AsLong(v);
        if (s == -1 && PyErr_Occurred()) {
            PyMem_Free(a);
            return NULL;
        }
        a[PyLong_AsLong(k)] = (uint16_t)s;
    }
    return a;
}

/* table_fill(recorder, reader, spec_map, start, stop) -> list of the record
 * indices of the launches among records [start, stop), appended to the
 * (stopped) recorder's table with global string ids and this process's hash
 * spec ids (spec_map: written id -> this process's; others become 0). */
static PyObject *table_fill(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *ro, *reader, *spec_map;
    unsigned long long start, stop;
    if (!PyArg_ParseTuple(args, "O!O!O!KK", &kd_RecorderType, &ro, &kd_TraceReaderType, &reader, &PyDict_Type,
                          &spec_map, &start, &stop))
        return NULL;
    kd_recorder *rec = (kd_recorder *)ro;
    if (rec->started) {
        PyErr_SetString(PyExc_RuntimeError, "table_fill: the recorder is recording");
        return NULL;
    }
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
    int64_t n = kd_ltab_fill_trace(&rec->table, r, start, stop, &ids, idx);
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
     "launch_digests(recorder) -> bytes: the recorder's launches' digests, nlaunches x 5 native u64"},
    {"op_digests", op_digests, METH_VARARGS,
     "op_digests(depth, flags, name, text, in_tree, out_tree) -> bytes: an aten op's 5 native u64 digests"},
    {"table_fill", table_fill, METH_VARARGS,
     "table_fill(recorder, reader, spec_map, start, stop) -> record indices of the launches appended"},
    {NULL, NULL, 0, NULL},
};

int kd_launch_table_module_init(PyObject *m)
{
    return PyModule_AddFunctions(m, table_methods);
}
