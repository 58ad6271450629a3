/* kd_trace_py.c - TraceWriter and TraceReader, the Python faces of the trace
 * format (Note [Trace format] in kd_trace.h).  The hash trees they carry are
 * encoded by kd_hash_tree.c. */
#include "kd_hash_tree.h"
#include "kd_module.h"
#include "kd_recorder.h"
#include "kd_trace_py.h"
#include "kd_args.h"
#include "kd_types.h"
#include "kd_cursor.h"
#include "kd_trace.h"

#include <string.h>

/* ---------------- TraceWriter ---------------- */

typedef struct {
    PyObject_HEAD
    kd_tw w;
    int ready;
} kd_trace_writer;

static PyObject *tw_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    (void)args;
    (void)kw;
    kd_trace_writer *self = (kd_trace_writer *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    if (kd_tw_init(&self->w) != 0) {
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    self->ready = 1;
    return (PyObject *)self;
}

static void tw_dealloc(kd_trace_writer *self)
{
    if (self->ready)
        kd_tw_free(&self->w);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *tw_fail(const char *what)
{
    PyErr_Format(PyExc_MemoryError, "kdebug trace writer: %s", what);
    return NULL;
}

/* launches(recorder, start, stop): stored launches [start, stop). */
static PyObject *tw_launches(kd_trace_writer *self, PyObject *args)
{
    PyObject *ro;
    unsigned long long start, stop;
    if (!PyArg_ParseTuple(args, "O!KK", &kd_RecorderType, &ro, &start, &stop))
        return NULL;
    kd_recorder *r = (kd_recorder *)ro;
    if (stop > r->table.store.nlaunches || start > stop) {
        PyErr_SetString(PyExc_IndexError, "launch range out of the recorder's store");
        return NULL;
    }
    for (uint64_t i = start; i < stop; i++) {
        const kd_payload *p = kd_store_launch(&r->table.store, i);
        if (kd_tw_launch(&self->w, p, (uint32_t)p->launch.nslots + 1, kd_strings) != 0)
            return tw_fail("could not encode a launch (out of memory?)");
    }
    Py_RETURN_NONE;
}

/* op(depth, flags, name, text, input_hashes, output_hashes, extents=None):
 * the fields of a TraceOp, by keyword (Note [Typed boundaries]). */
static PyObject *tw_op(kd_trace_writer *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"depth", "flags", "name", "text", "input_hashes", "output_hashes", "extents", NULL};
    unsigned int depth, flags;
    const char *name, *text;
    Py_ssize_t nl, tl;
    PyObject *in_tree, *out_tree, *ext_tree = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "IIs#s#OO|O", kwlist, &depth, &flags, &name, &nl, &text, &tl,
                                     &in_tree, &out_tree, &ext_tree))
        return NULL;
    if (flags & ~(unsigned int)(KD_OPF_IN_HASH | KD_OPF_OUT_HASH | KD_OPF_OPCALL | KD_OPF_EXTENTS)) {
        /* what the reader would refuse as a corrupt trace */
        PyErr_Format(PyExc_ValueError, "TraceWriter.op: unknown flags 0x%x (KD_OPF_* only)", flags);
        return NULL;
    }
    if (memchr(name, '\0', (size_t)nl) != NULL || memchr(text, '\0', (size_t)tl) != NULL) {
        /* the string table takes no NUL: the record would lose its text */
        PyErr_SetString(PyExc_ValueError, "TraceWriter.op: the op's name or text holds a NUL character "
                                          "(escape it first, as kdebug.trace does: the two characters \\0)");
        return NULL;
    }
    PyObject *ib = NULL, *ob = NULL, *eb = NULL;
    if (((flags & KD_OPF_IN_HASH) && (ib = kd_hash_tree_bytes(in_tree)) == NULL) ||
        ((flags & KD_OPF_OUT_HASH) && (ob = kd_hash_tree_bytes(out_tree)) == NULL) ||
        ((flags & KD_OPF_EXTENTS) && (eb = kd_hash_tree_bytes(ext_tree)) == NULL)) {
        Py_XDECREF(ib);
        Py_XDECREF(ob);
        return NULL;
    }
#define KD_BYTES(o) (o) ? (const uint8_t *)PyBytes_AS_STRING(o) : NULL, (o) ? (size_t)PyBytes_GET_SIZE(o) : 0
    int rc = kd_tw_op(&self->w, depth, flags, name, (size_t)nl, text, (size_t)tl, KD_BYTES(ib), KD_BYTES(ob),
                      KD_BYTES(eb));
#undef KD_BYTES
    Py_XDECREF(ib);
    Py_XDECREF(ob);
    Py_XDECREF(eb);
    if (rc != 0)
        return tw_fail("could not encode an op record (out of memory, or a record over 32 MiB)");
    Py_RETURN_NONE;
}

static PyObject *tw_meta(kd_trace_writer *self, PyObject *arg)
{
    Py_ssize_t n;
    const char *s = PyUnicode_AsUTF8AndSize(arg, &n);
    if (s == NULL)
        return NULL;
    if (kd_tw_meta(&self->w, s, (size_t)n) != 0)
        return tw_fail("out of memory");
    Py_RETURN_NONE;
}

static PyObject *tw_seal(kd_trace_writer *self, PyObject *unused)
{
    (void)unused;
    if (kd_tw_seal(&self->w) != 0)
        return tw_fail("out of memory");
    Py_RETURN_NONE;
}

static PyObject *tw_end(kd_trace_writer *self, PyObject *unused)
{
    (void)unused;
    if (kd_tw_end(&self->w) != 0)
        return tw_fail("out of memory");
    Py_RETURN_NONE;
}

/* take() -> the bytes of every sealed chunk since the last take(). */
static PyObject *tw_take(kd_trace_writer *self, PyObject *unused)
{
    (void)unused;
    PyObject *b = PyBytes_FromStringAndSize((const char *)self->w.out.p, (Py_ssize_t)self->w.out.len);
    if (b != NULL)
        self->w.out.len = 0;
    return b;
}

static PyObject *tw_stats(kd_trace_writer *self, PyObject *unused)
{
    (void)unused;
    return Py_BuildValue("{s:K,s:K,s:K,s:K}", "records", (unsigned long long)kd_tw_records(&self->w),
                         "tensor_args", (unsigned long long)self->w.tensor_args, "launch_bytes",
                         (unsigned long long)self->w.launch_bytes, "refused_strings",
                         (unsigned long long)self->w.refused_strings);
}

static PyMethodDef tw_methods[] = {
    {"launches", (PyCFunction)tw_launches, METH_VARARGS, "launches(recorder, start, stop): encode stored launches."},
    {"op", (PyCFunction)(void (*)(void))tw_op, METH_VARARGS | METH_KEYWORDS,
     "op(depth, flags, name, text, input_hashes, output_hashes, extents=None): encode an op record (a TraceOp's fields)."},
    {"meta", (PyCFunction)tw_meta, METH_O, "meta(json): seal, then a META chunk."},
    {"seal", (PyCFunction)tw_seal, METH_NOARGS, "Close the records encoded so far into chunks."},
    {"end", (PyCFunction)tw_end, METH_NOARGS, "Seal, then the END chunk."},
    {"take", (PyCFunction)tw_take, METH_NOARGS, "take() -> bytes of the sealed chunks not taken yet."},
    {"stats", (PyCFunction)tw_stats, METH_NOARGS, "records, tensor_args, launch_bytes, refused_strings"},
    {NULL, NULL, 0, NULL},
};

PyTypeObject kd_TraceWriterType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kdebug._C.TraceWriter",
    .tp_basicsize = sizeof(kd_trace_writer),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Encodes a recorded run into trace-file chunks (Note [Trace format]).",
    .tp_new = tw_new,
    .tp_dealloc = (destructor)tw_dealloc,
    .tp_methods = tw_methods,
};

/* ---------------- TraceReader ---------------- */

typedef struct {
    PyObject_HEAD
    Py_buffer view;
    int have_view;
    kd_tr r;
    int open;
    uint32_t *gmap; /* file string id -> global id, filled on first use */
} kd_trace_reader;

static PyObject *kd_TraceError;

/* Raises TraceError(offset, message), with .offset and .message set too. */
static void trace_error(uint64_t off, const char *msg)
{
    PyObject *e = PyObject_CallFunction(kd_TraceError, "Ks", (unsigned long long)off, msg);
    if (e == NULL)
        return;
    PyObject *o = PyTuple_GET_ITEM(((PyBaseExceptionObject *)e)->args, 0);
    PyObject *m = PyTuple_GET_ITEM(((PyBaseExceptionObject *)e)->args, 1);
    if (PyObject_SetAttrString(e, "offset", o) == 0 && PyObject_SetAttrString(e, "message", m) == 0)
        PyErr_SetObject(kd_TraceError, e);
    Py_DECREF(e);
}

static PyObject *tr_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    (void)kw;
    PyObject *data;
    if (!PyArg_ParseTuple(args, "O", &data))
        return NULL;
    kd_trace_reader *self = (kd_trace_reader *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    if (PyObject_GetBuffer(data, &self->view, PyBUF_SIMPLE) != 0) {
        Py_DECREF(self);
        return NULL;
    }
    self->have_view = 1;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = kd_tr_open(&self->r, self->view.buf, (size_t)self->view.len);
    Py_END_ALLOW_THREADS
    if (rc != 0) {
        trace_error(self->r.err_off, self->r.err);
        kd_tr_free(&self->r);
        Py_DECREF(self);
        return NULL;
    }
    self->open = 1;
    return (PyObject *)self;
}

static void tr_dealloc(kd_trace_reader *self)
{
    if (self->open)
        kd_tr_free(&self->r);
    PyMem_Free(self->gmap);
    if (self->have_view)
        PyBuffer_Release(&self->view);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *tr_info(kd_trace_reader *self, PyObject *unused)
{
    (void)unused;
    kd_tr *r = &self->r;
    PyObject *meta = PyList_New(r->nmeta), *meta_at = PyList_New(r->nmeta);
    if (meta == NULL || meta_at == NULL) {
        Py_XDECREF(meta);
        Py_XDECREF(meta_at);
        return NULL;
    }
    for (uint32_t i = 0; i < r->nmeta; i++) {
        PyObject *s = PyUnicode_DecodeUTF8((const char *)r->data + r->meta_off[i], r->meta_len[i], "replace");
        PyObject *at = PyLong_FromUnsignedLongLong((unsigned long long)r->meta_off[i]);
        if (s == NULL || at == NULL) {
            Py_XDECREF(s);
            Py_XDECREF(at);
            Py_DECREF(meta);
            Py_DECREF(meta_at);
            return NULL;
        }
        PyList_SET_ITEM(meta, i, s);
        PyList_SET_ITEM(meta_at, i, at);
    }
    /* meta_offsets: the byte offset of each META chunk's body (errors name it) */
    return Py_BuildValue("{s:K,s:O,s:K,s:K,s:K,s:N,s:N,s:(HH),s:K}", "records", (unsigned long long)r->nrec,
                         "complete", r->complete ? Py_True : Py_False, "valid_bytes",
                         (unsigned long long)r->valid_end, "ignored_bytes", (unsigned long long)r->ignored,
                         "tensor_args", (unsigned long long)r->tensor_args, "meta", meta, "meta_offsets", meta_at,
                         "version", r->version_major, r->version_minor, "strings", (unsigned long long)r->nstr);
}

static PyObject *tr_types(kd_trace_reader *self, PyObject *unused)
{
    (void)unused;
    return PyBytes_FromStringAndSize((const char *)self->r.rec_type, (Py_ssize_t)self->r.nrec);
}

/* The reader exports its digest table (computed by kd_tr_open) through the
 * buffer protocol: nrec x KD_DG_N native u64 (key, config, shape, pre, post),
 * writable so torch.frombuffer can view it without a copy or a warning.
 * digests() is that view; it keeps the reader alive. */
static int tr_getbuffer(kd_trace_reader *self, Py_buffer *view, int flags)
{
    uint64_t n = self->r.nrec;
    static uint64_t none;
    return PyBuffer_FillInfo(view, (PyObject *)self, n ? (void *)self->r.dg : (void *)&none,
                             (Py_ssize_t)(n * KD_DG_N * sizeof *self->r.dg), 0, flags);
}

static PyBufferProcs tr_as_buffer = {
    .bf_getbuffer = (getbufferproc)tr_getbuffer,
};

static PyObject *tr_digests(kd_trace_reader *self, PyObject *unused)
{
    (void)unused;
    return PyMemoryView_FromObject((PyObject *)self);
}

static PyObject *tr_string(kd_trace_reader *self, uint32_t id)
{
    size_t n;
    const char *s = kd_tr_string(&self->r, id, &n);
    return PyUnicode_DecodeUTF8(s, (Py_ssize_t)n, "replace");
}

/* op(i, make_norm) -> TraceOp (depth, flags, name, text, input_hashes,
 * output_hashes, extents) */
static PyObject *tr_op(kd_trace_reader *self, PyObject *args)
{
    unsigned long long i;
    PyObject *make_norm;
    if (!PyArg_ParseTuple(args, "KO", &i, &make_norm))
        return NULL;
    kd_tr_op op;
    if (kd_tr_op_get(&self->r, i, &op) != 0) {
        PyErr_SetString(PyExc_IndexError, "not an op record");
        return NULL;
    }
    PyObject *in = Py_NewRef(Py_None), *out = Py_NewRef(Py_None), *ext = Py_NewRef(Py_None);
    if (op.flags & KD_OPF_IN_HASH) {
        kd_cur c = {op.in_tree, 0, op.in_len, 0, 0, NULL};
        Py_SETREF(in, kd_hash_tree_get(&c, make_norm, 0));
    }
    if (in != NULL && (op.flags & KD_OPF_OUT_HASH)) {
        kd_cur c = {op.out_tree, 0, op.out_len, 0, 0, NULL};
        Py_SETREF(out, kd_hash_tree_get(&c, make_norm, 0));
    }
    if (in != NULL && out != NULL && (op.flags & KD_OPF_EXTENTS)) {
        kd_cur c = {op.ext_tree, 0, op.ext_len, 0, 0, NULL};
        Py_SETREF(ext, kd_hash_tree_get(&c, make_norm, 0));
        if (ext != NULL)
            Py_SETREF(ext, kd_typed_extents(ext));
    }
    if (in == NULL || out == NULL || ext == NULL) {
        Py_XDECREF(in);
        Py_XDECREF(out);
        Py_XDECREF(ext);
        return NULL;
    }
    return KD_RECORD(kd_TraceOpType, PyLong_FromUnsignedLong(op.depth), PyLong_FromUnsignedLong(op.flags),
                     tr_string(self, op.name_id), tr_string(self, op.text_id), in, out, ext);
}

const kd_tr *kd_trace_reader_ids(PyObject *reader, uint32_t **map)
{
    kd_trace_reader *self = (kd_trace_reader *)reader;
    if (self->gmap == NULL && (self->gmap = PyMem_Calloc((size_t)self->r.nstr + 1, sizeof *self->gmap)) == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    *map = self->gmap;
    return &self->r;
}

/* table(start, stop) -> TraceTable (records, args, dims): bytes of kd_tab_rec rows,
 * kd_tab_arg rows and int64 sizes (Note [Trace tables]). */
static PyObject *tr_table(kd_trace_reader *self, PyObject *args)
{
    unsigned long long start, stop;
    if (!PyArg_ParseTuple(args, "KK", &start, &stop))
        return NULL;
    kd_tab t = {0};
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = kd_tr_table(&self->r, start, stop, &t);
    Py_END_ALLOW_THREADS
    if (rc != 0) {
        kd_tab_free(&t);
        if (rc == -1)
            return PyErr_NoMemory();
        PyErr_SetString(PyExc_ValueError, "table: a launch record could not be decoded");
        return NULL;
    }
    /* an empty table has no buffers (NULL pointers): empty bytes, so every
     * caller gets three bytes objects */
    PyObject *out = KD_RECORD(kd_TraceTableType,
                              PyBytes_FromStringAndSize(t.rec ? (const char *)t.rec : "", (Py_ssize_t)(t.nrec * sizeof *t.rec)),
                              PyBytes_FromStringAndSize(t.arg ? (const char *)t.arg : "", (Py_ssize_t)(t.narg * sizeof *t.arg)),
                              PyBytes_FromStringAndSize(t.dims ? (const char *)t.dims : "",
                                                        (Py_ssize_t)(t.ndims * sizeof *t.dims)));
    kd_tab_free(&t);
    return out;
}

/* strings() -> list of the file's strings; item k is string id k (0: ""). */
static PyObject *tr_strings(kd_trace_reader *self, PyObject *unused)
{
    (void)unused;
    PyObject *out = PyList_New((Py_ssize_t)self->r.nstr + 1);
    if (out == NULL)
        return NULL;
    for (uint32_t id = 0; id <= self->r.nstr; id++) {
        PyObject *s = id ? tr_string(self, id) : PyUnicode_FromString("");
        if (s == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, id, s);
    }
    return out;
}

/* last_writer(before, dev_type, dev_index, lo, hi, leaf) -> LastWrite (index, mask) or None */
static PyObject *tr_last_writer(kd_trace_reader *self, PyObject *args)
{
    unsigned long long before, lo, hi, leaf;
    int dt, di;
    if (!PyArg_ParseTuple(args, "KiiKKK", &before, &dt, &di, &lo, &hi, &leaf))
        return NULL;
    uint64_t mask = 0;
    int64_t i;
    Py_BEGIN_ALLOW_THREADS
    i = kd_tr_last_writer(&self->r, before, dt, di, lo, hi, leaf, &mask);
    Py_END_ALLOW_THREADS
    if (i < 0)
        Py_RETURN_NONE;
    return KD_RECORD(kd_LastWriteType, PyLong_FromLongLong((long long)i), PyLong_FromUnsignedLongLong(mask));
}

static PyMethodDef tr_methods[] = {
    {"info", (PyCFunction)tr_info, METH_NOARGS, "records, complete, valid/ignored bytes, meta, version"},
    {"types", (PyCFunction)tr_types, METH_NOARGS, "types() -> bytes: 1 launch, 2 op, per record"},
    {"digests", (PyCFunction)tr_digests, METH_NOARGS,
     "digests() -> memoryview of the reader's nrec x 5 u64 digests (no copy)"},
    {"op", (PyCFunction)tr_op, METH_VARARGS, "op(i, make_norm) -> TraceOp"},
    {"table", (PyCFunction)tr_table, METH_VARARGS,
     "table(start, stop) -> TraceTable of bytes: fixed-size rows (Note [Trace tables])"},
    {"strings", (PyCFunction)tr_strings, METH_NOARGS, "strings() -> list: item k is file string id k"},
    {"last_writer", (PyCFunction)tr_last_writer, METH_VARARGS,
     "last_writer(before, dev_type, dev_index, lo, hi, leaf) -> LastWrite or None"},
    {NULL, NULL, 0, NULL},
};

PyTypeObject kd_TraceReaderType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kdebug._C.TraceReader",
    .tp_basicsize = sizeof(kd_trace_reader),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "TraceReader(buffer): validates and indexes a trace (raises TraceError(offset, message)). "
              "Its own buffer is the digest table (see digests()).",
    .tp_new = tr_new,
    .tp_dealloc = (destructor)tr_dealloc,
    .tp_methods = tr_methods,
    .tp_as_buffer = &tr_as_buffer,
};

int kd_trace_module_init(PyObject *m)
{
    kd_TraceError = PyErr_NewExceptionWithDoc("kdebug._C.TraceError",
                                              "A trace file is corrupt, truncated inside its header, "
                                              "foreign or too new: .offset (the byte offset) and .message (also its args).",
                                              PyExc_ValueError, NULL);
    if (kd_TraceError == NULL || PyType_Ready(&kd_TraceWriterType) != 0 ||
        PyType_Ready(&kd_TraceReaderType) != 0 ||
        PyModule_AddObjectRef(m, "TraceError", kd_TraceError) != 0 ||
        PyModule_AddObjectRef(m, "TraceWriter", (PyObject *)&kd_TraceWriterType) != 0 ||
        PyModule_AddObjectRef(m, "TraceReader", (PyObject *)&kd_TraceReaderType) != 0 ||
        PyModule_AddStringConstant(m, "NOT_STORED_TEXT", KD_TW_NOT_STORED) != 0)
        return -1;
    return 0;
}
