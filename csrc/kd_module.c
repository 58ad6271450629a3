/* kd_module.c - the kdebug._C module: global tables and module setup. */
#include <string.h>

#include "kd_cuda_hash.h"
#include "kd_defer.h"
#include "kd_hash.h"
#include "kd_py.h"
#include "kd_results.h"
#include "kd_shim.h"

kd_strtab *kd_strings = NULL;
const char *kd_dtype_names[256];

static PyObject *mod_intern(PyObject *m, PyObject *arg)
{
    (void)m;
    Py_ssize_t n;
    const char *s = PyUnicode_AsUTF8AndSize(arg, &n);
    if (s == NULL)
        return NULL;
    uint32_t id = kd_strtab_intern(kd_strings, s, (size_t)n);
    if (id == 0) {
        PyErr_SetString(PyExc_ValueError,
                        "cannot intern this string (kdebug's string table is full, or it "
                        "contains a NUL character)");
        return NULL;
    }
    return PyLong_FromUnsignedLong(id);
}

static PyObject *mod_string(PyObject *m, PyObject *arg)
{
    (void)m;
    unsigned long id = PyLong_AsUnsignedLong(arg);
    if (id == (unsigned long)-1 && PyErr_Occurred())
        return NULL;
    size_t n;
    const char *s = kd_strtab_get(kd_strings, (uint32_t)id, &n);
    return PyUnicode_DecodeUTF8(s, (Py_ssize_t)n, "replace");
}

/* _set_dtype_names({torch.dtype: "f32", ...}): abbreviations for rendering. */
static PyObject *mod_set_dtype_names(PyObject *m, PyObject *arg)
{
    (void)m;
    if (!PyDict_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "expected a dict {torch.dtype: str}");
        return NULL;
    }
    PyObject *k, *v;
    Py_ssize_t pos = 0;
    int n = 0;
    while (PyDict_Next(arg, &pos, &k, &v)) {
        int st = kd_shim_dtype_scalar_type(k);
        if (st < 0 || st >= 256 || !PyUnicode_Check(v))
            continue;
        Py_ssize_t len;
        const char *s = PyUnicode_AsUTF8AndSize(v, &len);
        if (s == NULL)
            return NULL;
        uint32_t id = kd_strtab_intern(kd_strings, s, (size_t)len);
        kd_dtype_names[st] = kd_strtab_get(kd_strings, id, NULL); /* never freed */
        n++;
    }
    return PyLong_FromLong(n);
}

static PyObject *mod_scalar_type(PyObject *m, PyObject *arg)
{
    (void)m;
    int st = kd_shim_dtype_scalar_type(arg);
    if (st < 0) {
        PyErr_SetString(PyExc_TypeError, "expected a torch.dtype");
        return NULL;
    }
    return PyLong_FromLong(st);
}

/* tensor_meta(t): what the launch hook reads from a tensor (for tests). */
static PyObject *mod_tensor_meta(PyObject *m, PyObject *arg)
{
    (void)m;
    kd_tensor_meta t;
    int r = kd_shim_tensor_meta(arg, &t);
    if (r == 0)
        Py_RETURN_NONE;
    if (r < 0) {
        PyErr_SetString(PyExc_ValueError, kd_shim_last_error());
        return NULL;
    }
    PyObject *sizes = PyTuple_New(t.ndim), *strides = PyTuple_New(t.ndim);
    for (int i = 0; sizes && strides && i < t.ndim; i++) {
        PyTuple_SET_ITEM(sizes, i, PyLong_FromLongLong(t.sizes[i]));
        PyTuple_SET_ITEM(strides, i, PyLong_FromLongLong(t.strides[i]));
    }
    return Py_BuildValue("{sisNsNsLsKsisi}", "scalar_type", t.dtype, "shape", sizes,
                         "stride", strides, "storage_offset", (long long)t.storage_offset,
                         "data_ptr", (unsigned long long)t.data_ptr, "device_type",
                         t.device_type, "device_index", t.device_index);
}

static PyObject *mod_now_ns(PyObject *m, PyObject *unused)
{
    (void)m;
    (void)unused;
    return PyLong_FromUnsignedLongLong(kd_now_ns());
}

static PyObject *mod_inject(PyObject *m, PyObject *arg)
{
    (void)m;
    long n = PyLong_AsLong(arg);
    if (n == -1 && PyErr_Occurred())
        return NULL;
    kd_injected_faults = n < 0 ? 0 : n;
    Py_RETURN_NONE;
}

/* _set_hash_config(kinds, hash_inputs, check_readonly, spec) -> this thread's
 * previous settings as a tuple (Note [Hash settings per thread] in kd_py.h) */
static PyObject *mod_set_hash_config(PyObject *m, PyObject *args)
{
    (void)m;
    int kinds, inputs, check, spec;
    if (!PyArg_ParseTuple(args, "iiii", &kinds, &inputs, &check, &spec))
        return NULL;
    if (KD_HK_CONFLICT(kinds)) {
        PyErr_SetString(PyExc_ValueError, "kdebug: the stats and hash_tensor hashes cannot be recorded together "
                                          "(Note [Room for the stats]); ask for one of them");
        return NULL;
    }
    PyObject *prev = Py_BuildValue("(iiii)", kd_hcfg.kinds, kd_hcfg.hash_inputs,
                                   kd_hcfg.check_readonly, kd_hcfg.spec);
    kd_hcfg.kinds = kinds;
    kd_hcfg.hash_inputs = inputs;
    kd_hcfg.check_readonly = check;
    kd_hcfg.spec = spec;
    kd_hcfg_publish();
    return prev;
}

/* _set_record_outputs(on, budget_bytes) -> this thread's previous settings as a tuple */
static PyObject *mod_set_record_outputs(PyObject *m, PyObject *args)
{
    (void)m;
    int on;
    unsigned long long budget;
    if (!PyArg_ParseTuple(args, "pK", &on, &budget))
        return NULL;
    PyObject *prev = Py_BuildValue("(OK)", kd_hcfg.record_outputs ? Py_True : Py_False,
                                   (unsigned long long)kd_hcfg.output_budget);
    kd_hcfg.record_outputs = on;
    kd_hcfg.output_budget = budget;
    kd_hcfg_publish();
    return prev;
}

PyObject *kd_stats_type = NULL;

/* _set_hashers(slow, custom, stats_type): Python callbacks for device tensors
 * and custom hash_fns, and kdebug.hashing.Stats (the trace's tree codec) */
static PyObject *mod_set_hashers(PyObject *m, PyObject *args)
{
    (void)m;
    PyObject *slow, *custom, *stats = Py_None;
    if (!PyArg_ParseTuple(args, "OO|O", &slow, &custom, &stats))
        return NULL;
    if (stats != Py_None && !PyType_Check(stats)) {
        PyErr_SetString(PyExc_TypeError, "_set_hashers: stats_type must be a class");
        return NULL;
    }
    Py_XSETREF(kd_slow_hasher, slow == Py_None ? NULL : Py_NewRef(slow));
    Py_XSETREF(kd_custom_hasher, custom == Py_None ? NULL : Py_NewRef(custom));
    Py_XSETREF(kd_stats_type, stats == Py_None ? NULL : Py_NewRef(stats));
    Py_RETURN_NONE;
}

/* Note [HashValues]: every hash entry point returns a _C.HashValues, a named
 * struct sequence (bitwise, l1, nan, posinf, neginf, xor64, unsupported, sum,
 * absmax): the kinds asked for hold values, the others 0.  The first seven
 * fields keep the order of the 7-tuple it replaces. */
static PyStructSequence_Field hash_values_fields[] = {
    {"bitwise", "the bitwise hash (Note [The bitwise hash])"},
    {"l1", "the L1 norm of the finite elements (Note [The norm hash])"},
    {"nan", "NaN elements"},
    {"posinf", "+inf elements"},
    {"neginf", "-inf elements"},
    {"xor64", "hash_tensor's value (Note [The hash_tensor hash])"},
    {"unsupported", "1 when a kind asked for cannot decode the dtype"},
    {"sum", "the float64 sum of the finite elements (Note [The stats hash])"},
    {"absmax", "the largest |x| of the finite elements (Note [The stats hash])"},
    {NULL, NULL},
};

static PyStructSequence_Desc hash_values_desc = {
    "kdebug._C.HashValues", "A tensor's hash values (Note [HashValues] in csrc/kd_module.c).",
    hash_values_fields, 9,
};

PyTypeObject *kd_HashValuesType = NULL;

PyObject *kd_hash_values(uint64_t bitwise, double l1, uint64_t nan, uint64_t posinf, uint64_t neginf,
                         uint64_t x, int unsupported, double sum, double absmax)
{
    PyObject *r = PyStructSequence_New(kd_HashValuesType);
    if (r == NULL)
        return NULL;
    PyObject *v[9] = {PyLong_FromUnsignedLongLong(bitwise), PyFloat_FromDouble(l1),
                      PyLong_FromUnsignedLongLong(nan), PyLong_FromUnsignedLongLong(posinf),
                      PyLong_FromUnsignedLongLong(neginf), PyLong_FromUnsignedLongLong(x),
                      PyLong_FromLong(unsupported), PyFloat_FromDouble(sum), PyFloat_FromDouble(absmax)};
    int ok = 1;
    for (int i = 0; i < 9; i++) {
        if (v[i] == NULL)
            ok = 0;
        PyStructSequence_SET_ITEM(r, i, v[i] ? v[i] : Py_NewRef(Py_None));
    }
    if (!ok) {
        Py_DECREF(r);
        return NULL;
    }
    return r;
}

/* The HashValues of a collected GPU result. */
static PyObject *result_values(const kd_cuda_result *r)
{
    return kd_hash_values(kd_hash_finish(r->S, r->nbytes), r->l1, r->nan, r->posinf, r->neginf, r->xor64,
                          (int)r->unsupported, r->sum, r->absmax);
}

/* hash(t, kinds) -> HashValues of a CPU tensor (Note [HashValues]) */
static PyObject *mod_hash(PyObject *m, PyObject *args)
{
    (void)m;
    PyObject *t;
    int kinds = KD_HK_BITWISE | KD_HK_NORM | KD_HK_XOR;
    if (!PyArg_ParseTuple(args, "O|i", &t, &kinds))
        return NULL;
    if (KD_HK_CONFLICT(kinds)) {
        PyErr_SetString(PyExc_ValueError, "kdebug: the stats and hash_tensor hashes cannot be asked for together "
                                          "(Note [Room for the stats]); ask for one of them");
        return NULL;
    }
    kd_tensor_meta meta;
    int r = kd_shim_tensor_meta(t, &meta);
    if (r != 1) {
        PyErr_SetString(PyExc_TypeError, r == 0 ? "expected a tensor" : kd_shim_last_error());
        return NULL;
    }
    if (meta.device_type != KD_DEV_CPU) {
        PyErr_SetString(PyExc_ValueError, "kdebug._C.hash takes CPU tensors");
        return NULL;
    }
    if (meta.math_bits) {
        PyErr_SetString(PyExc_ValueError, "kdebug._C.hash takes tensors without the conjugate / negative "
                        "bit: resolve them first (resolve_conj(), resolve_neg())");
        return NULL;
    }
    kd_view v = {(const void *)(uintptr_t)meta.data_ptr, meta.dtype, kd_itemsize(meta.dtype),
                 meta.ndim, meta.sizes, meta.strides};
    if (v.itemsize == 0) {
        PyErr_SetString(PyExc_TypeError, "kdebug cannot hash this dtype");
        return NULL;
    }
    uint64_t bitwise = 0, x = 0;
    kd_stats n;
    memset(&n, 0, sizeof n);
    int unsupported = 0;
    Py_BEGIN_ALLOW_THREADS
    if (kinds & KD_HK_BITWISE)
        bitwise = kd_hash_bitwise(&v);
    if (kinds & KD_HK_STATS) { /* the norm's fields too, in the same pass */
        if (kd_hash_stats(&v, &n) != 0)
            unsupported = 1;
    } else if ((kinds & KD_HK_NORM) && kd_hash_norm(&v, &n.norm) != 0) {
        unsupported = 1;
    }
    if ((kinds & KD_HK_XOR) && kd_hash_xor64(&v, &x) != 0)
        unsupported = 1;
    Py_END_ALLOW_THREADS
    return kd_hash_values(bitwise, n.norm.l1, n.norm.nan, n.norm.posinf, n.norm.neginf, x, unsupported, n.sum,
                          n.absmax);
}

/* A hash still on the GPU (an aten-op record's leaf, or hash_async's result).
 * handle is the result's index once queued, KD_PENDING_DEFERRED until the
 * deferred queue is flushed (Note [Deferred GPU work]), KD_PENDING_FAILED if
 * queuing failed; the result is delivered into it when the device's results
 * are collected (Note [GPU hash results]). */
typedef struct {
    PyObject_HEAD
    long long handle;
    int device;
    int spec;
    int have;
    kd_cuda_result res;
} kd_pending_hash;

#define KD_PENDING_DEFERRED (-1)
#define KD_PENDING_FAILED (-2)

static PyTypeObject kd_PendingHashType;

static void pending_deliver(void *owner, uint64_t aux, int w, const kd_cuda_result *res)
{
    (void)aux, (void)w;
    kd_pending_hash *p = owner;
    p->res = *res;
    p->have = 1;
}

/* p now waits for GPU result `index` (< 0: queuing failed). */
static void pending_await(kd_pending_hash *p, int device, int64_t index)
{
    p->device = device;
    p->handle = index;
    if (index < 0 || kd_results_expect(device, index, pending_deliver, p, NULL, 0, 0) != 0)
        p->handle = KD_PENDING_FAILED;
}

static void pending_sink(PyObject *owner, uint64_t aux, int w, int device, int64_t index, const char *error)
{
    (void)aux, (void)w, (void)error;
    pending_await((kd_pending_hash *)owner, device, index);
}

static kd_pending_hash *pending_new(int spec)
{
    kd_pending_hash *p = PyObject_New(kd_pending_hash, &kd_PendingHashType);
    if (p != NULL) {
        p->handle = KD_PENDING_DEFERRED;
        p->device = 0;
        p->spec = spec;
        p->have = 0;
    }
    return p;
}

static void pending_dealloc(kd_pending_hash *p)
{
    if (p->handle >= 0 && !p->have)
        kd_results_forget(p->device, p->handle, p);
    PyObject_Free(p);
}

/* The HashValues of p (flushing and collecting when needed: one synchronization),
 * Py_None if queuing it failed, NULL with an error if its result is missing. */
static PyObject *pending_fetch(kd_pending_hash *p)
{
    if (p->handle == KD_PENDING_DEFERRED)
        kd_defer_flush();
    if (p->handle < 0) /* queuing failed: counted in defer_stats, reported by DebugMode */
        Py_RETURN_NONE;
    if (!p->have && kd_cuda_hash_collect() != 0) {
        PyErr_SetString(PyExc_RuntimeError, kd_cuda_last_error());
        return NULL;
    }
    if (!p->have) {
        PyErr_SetString(PyExc_RuntimeError, "kdebug: a GPU hash result never arrived");
        return NULL;
    }
    return result_values(&p->res);
}

static PyObject *pending_repr(kd_pending_hash *self)
{
    return PyUnicode_FromFormat("<kdebug pending GPU hash %lld>", self->handle);
}

static PyTypeObject kd_PendingHashType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kdebug._C.PendingHash",
    .tp_basicsize = sizeof(kd_pending_hash),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_dealloc = (destructor)pending_dealloc,
    .tp_repr = (reprfunc)pending_repr,
    .tp_doc = "A hash queued on the GPU; its value arrives when results are read (hash_fetch).",
};

/* hash_async(t, kinds, stream) -> HashValues now (CPU tensors), a PendingHash
 * for a result queued on the GPU (fetch it with hash_fetch), or NotImplemented
 * (another device, or a build without CUDA: use the slow path). */
static PyObject *mod_hash_async(PyObject *m, PyObject *args)
{
    PyObject *t;
    int kinds;
    unsigned long long stream;
    if (!PyArg_ParseTuple(args, "OiK", &t, &kinds, &stream))
        return NULL;
    kd_tensor_meta meta;
    int r = kd_shim_tensor_meta(t, &meta);
    if (r != 1) {
        PyErr_SetString(PyExc_TypeError, r == 0 ? "expected a tensor" : kd_shim_last_error());
        return NULL;
    }
    if (meta.math_bits) /* the slow path resolves them (kdebug/hashing.py) */
        Py_RETURN_NOTIMPLEMENTED;
    if (meta.device_type == KD_DEV_CPU) {
        PyObject *a = Py_BuildValue("(Oi)", t, kinds);
        PyObject *res = a ? mod_hash(m, a) : NULL;
        Py_XDECREF(a);
        return res;
    }
    kd_cuda_tensor ct;
    if (!kd_cuda_describe(&meta, &ct))
        Py_RETURN_NOTIMPLEMENTED;
    if (ct.numel == 0)
        return kd_hash_values(kd_hash_finish(0, 0), 0.0, 0, 0, 0, 0, 0, 0.0, 0.0);
    if (stream == 0) /* the tensor's device's current stream */
        stream = kd_shim_current_stream(meta.device_type, meta.device_index);
    kd_pending_hash *p = pending_new(0);
    if (p == NULL)
        return NULL;
    int64_t idx = kd_cuda_hash_enqueue(meta.device_index, stream, kinds, &ct, 1);
    if (idx < 0) {
        Py_DECREF(p);
        PyErr_SetString(PyExc_RuntimeError, kd_cuda_last_error());
        return NULL;
    }
    pending_await(p, meta.device_index, idx);
    if (p->handle < 0) {
        Py_DECREF(p);
        PyErr_SetString(PyExc_RuntimeError, "kdebug: more GPU hash results in flight than it can track");
        return NULL;
    }
    return (PyObject *)p;
}

/* hash_fetch(pending) -> the HashValues of a queued GPU hash (collects if needed) */
static PyObject *mod_hash_fetch(PyObject *m, PyObject *arg)
{
    (void)m;
    if (Py_TYPE(arg) != &kd_PendingHashType) {
        PyErr_Format(PyExc_TypeError, "hash_fetch expects a PendingHash (from hash_async), not %s",
                     Py_TYPE(arg)->tp_name);
        return NULL;
    }
    PyObject *r = pending_fetch((kd_pending_hash *)arg);
    if (r == Py_None) {
        Py_DECREF(r);
        PyErr_SetString(PyExc_RuntimeError, "kdebug could not queue this GPU hash");
        return NULL;
    }
    return r;
}

static PyObject *mod_hash_collect(PyObject *m, PyObject *unused)
{
    (void)m;
    (void)unused;
    kd_defer_flush();
    if (kd_cuda_hash_collect() != 0) {
        PyErr_SetString(PyExc_RuntimeError, kd_cuda_last_error());
        return NULL;
    }
    return PyLong_FromUnsignedLongLong(kd_cuda_syncs());
}

static PyObject *mod_gpu_info(PyObject *m, PyObject *unused)
{
    (void)m;
    (void)unused;
    return Py_BuildValue("{sOsKsLsK}", "available", kd_cuda_available() ? Py_True : Py_False,
                         "syncs", (unsigned long long)kd_cuda_syncs(), "in_flight",
                         (long long)kd_cuda_hash_outstanding(), "waiting",
                         (unsigned long long)kd_results_waiting());
}

/* ---- hashing aten-op arguments and results as pytrees (the fast path) ---- */

/* Rebuilds an exact list / tuple / dict tree with every other object mapped by
 * leaf(o, ctx) (a new reference, NULL with an exception, or NotImplemented to
 * give up: the caller then falls back to Python's pytree). */
typedef PyObject *(*kd_leaf_fn)(PyObject *o, void *ctx);

static PyObject *tree_map_c(PyObject *o, kd_leaf_fn leaf, void *ctx, int depth)
{
    if (depth > 32)
        Py_RETURN_NOTIMPLEMENTED;
    if (PyList_CheckExact(o) || PyTuple_CheckExact(o)) {
        int is_list = PyList_CheckExact(o);
        Py_ssize_t n = is_list ? PyList_GET_SIZE(o) : PyTuple_GET_SIZE(o);
        PyObject *out = is_list ? PyList_New(n) : PyTuple_New(n);
        for (Py_ssize_t i = 0; out && i < n; i++) {
            PyObject *x = tree_map_c(is_list ? PyList_GET_ITEM(o, i) : PyTuple_GET_ITEM(o, i), leaf, ctx,
                                     depth + 1);
            if (x == NULL || x == Py_NotImplemented) {
                Py_DECREF(out);
                return x;
            }
            if (is_list)
                PyList_SET_ITEM(out, i, x);
            else
                PyTuple_SET_ITEM(out, i, x);
        }
        return out;
    }
    if (PyDict_CheckExact(o)) {
        PyObject *out = PyDict_New(), *k, *v;
        Py_ssize_t pos = 0;
        while (out && PyDict_Next(o, &pos, &k, &v)) {
            PyObject *x = tree_map_c(v, leaf, ctx, depth + 1);
            if (x == NULL || x == Py_NotImplemented) {
                Py_DECREF(out);
                return x;
            }
            int rc = PyDict_SetItem(out, k, x);
            Py_DECREF(x);
            if (rc != 0) {
                Py_DECREF(out);
                return NULL;
            }
        }
        return out;
    }
    return leaf(o, ctx);
}

/* Subclasses of containers (namedtuples, torch.return_types, ...) are pytree
 * nodes upstream descends into: leave them to Python. */
static int is_other_node(PyObject *o) { return PyTuple_Check(o) || PyList_Check(o) || PyDict_Check(o); }

static PyObject *clone_leaf(PyObject *o, void *ctx)
{
    (void)ctx;
    if (is_other_node(o))
        Py_RETURN_NOTIMPLEMENTED;
    kd_tensor_meta meta;
    int r = kd_shim_tensor_meta(o, &meta);
    if (r == 0)
        return Py_NewRef(o);
    PyObject *c = r > 0 ? kd_defer_clone(o, &meta, 0) : NULL;
    if (c == NULL)
        Py_RETURN_NOTIMPLEMENTED;
    return c;
}

/* tree_clone(obj) -> obj with every tensor leaf cloned (no dispatch mode sees
 * it, queued on the current stream), or NotImplemented for unknown trees. */
PyObject *kd_tree_clone(PyObject *obj) { return tree_map_c(obj, clone_leaf, NULL, 0); }

/* (device type, device index, first byte, one past the last byte) of the
 * memory a tensor leaf covers, None for other leaves (Note [Data flow] in
 * compare.py: what an aten op read and wrote). */
static PyObject *extent_leaf(PyObject *o, void *ctx)
{
    (void)ctx;
    if (is_other_node(o))
        Py_RETURN_NOTIMPLEMENTED;
    kd_tensor_meta m;
    int r = kd_shim_tensor_meta(o, &m);
    if (r == 0)
        Py_RETURN_NONE;
    if (r < 0)
        Py_RETURN_NOTIMPLEMENTED;
    uint64_t span = 1;
    for (int d = 0; d < m.ndim; d++) {
        if (m.sizes[d] == 0) {
            span = 0;
            break;
        }
        span += (uint64_t)(m.sizes[d] - 1) * (uint64_t)(m.strides[d] < 0 ? -m.strides[d] : m.strides[d]);
    }
    int itemsize = kd_itemsize(m.dtype);
    uint64_t lo = m.data_ptr, hi = m.data_ptr + span * (uint64_t)(itemsize > 0 ? itemsize : 1);
    return Py_BuildValue("(iiKK)", m.device_type, m.device_index, (unsigned long long)lo, (unsigned long long)hi);
}

/* tree_extents(obj) -> obj with every tensor leaf replaced by its extent
 * (extent_leaf), or NotImplemented for a tree this does not know. */
PyObject *kd_tree_extents(PyObject *obj) { return tree_map_c(obj, extent_leaf, NULL, 0); }

static PyObject *mod_tree_extents(PyObject *m, PyObject *obj)
{
    (void)m;
    return kd_tree_extents(obj);
}

typedef struct hash_ctx {
    int kinds, spec, all_none;
    unsigned long long stream;
    PyObject *value_fn;
} hash_ctx;

/* None for a non-tensor; value_fn(HashValues) for a hash done now; a
 * PendingHash for one queued on the GPU. */
static PyObject *hash_leaf(PyObject *o, void *vctx)
{
    hash_ctx *c = vctx;
    if (is_other_node(o))
        Py_RETURN_NOTIMPLEMENTED;
    kd_tensor_meta meta;
    int r = kd_shim_tensor_meta(o, &meta);
    if (r == 0)
        Py_RETURN_NONE;
    if (r < 0)
        Py_RETURN_NOTIMPLEMENTED;
    c->all_none = 0;
    kd_cuda_tensor ct;
    if (kd_defer_enabled() && !meta.math_bits && kd_cuda_describe(&meta, &ct) && ct.numel > 0) {
        kd_pending_hash *p = pending_new(c->spec);
        if (p == NULL)
            return NULL;
        uint64_t stream = c->stream ? c->stream : kd_shim_current_stream(meta.device_type, meta.device_index);
        if (kd_defer_hash(o, &ct, meta.device_index, stream, c->kinds, pending_sink, (PyObject *)p, 0, 0))
            return (PyObject *)p;
        Py_DECREF(p); /* not queued: hashed right away below */
    }
    PyObject *a = Py_BuildValue("(OiK)", o, c->kinds, c->stream);
    PyObject *h = a ? mod_hash_async(NULL, a) : NULL;
    Py_XDECREF(a);
    if (h == NULL || h == Py_NotImplemented)
        return h;
    if (Py_TYPE(h) == &kd_PendingHashType) {
        ((kd_pending_hash *)h)->spec = c->spec;
        return h;
    }
    PyObject *v = PyObject_CallFunctionObjArgs(c->value_fn, h, NULL);
    Py_DECREF(h);
    return v;
}

/* tree_hash(obj, kinds, spec, stream, value_fn) -> the tree of hashes (None
 * when no leaf is a tensor), or NotImplemented */
PyObject *kd_tree_hash(PyObject *obj, int kinds, int spec, unsigned long long stream, PyObject *value_fn)
{
    hash_ctx c = {kinds, spec, 1, stream, value_fn};
    PyObject *t = tree_map_c(obj, hash_leaf, &c, 0);
    if (t != NULL && t != Py_NotImplemented && c.all_none) {
        Py_DECREF(t);
        Py_RETURN_NONE;
    }
    return t;
}

/* PendingHash -> value_fn(HashValues, spec); anything else unchanged. */
static PyObject *resolve_leaf(PyObject *o, void *ctx)
{
    if (Py_TYPE(o) != &kd_PendingHashType)
        return Py_NewRef(o);
    kd_pending_hash *p = (kd_pending_hash *)o;
    PyObject *r = pending_fetch(p);
    if (r == NULL || r == Py_None)
        return r;
    PyObject *v = PyObject_CallFunction((PyObject *)ctx, "Oi", r, p->spec);
    Py_DECREF(r);
    return v;
}

/* tree_resolve(obj, value_fn) -> obj with PendingHash leaves replaced by their values */
static PyObject *mod_tree_resolve(PyObject *m, PyObject *args)
{
    (void)m;
    PyObject *obj, *value_fn;
    if (!PyArg_ParseTuple(args, "OO", &obj, &value_fn))
        return NULL;
    PyObject *t = tree_map_c(obj, resolve_leaf, value_fn, 0);
    if (t == Py_NotImplemented) { /* deeper than any op's output: leave it */
        Py_DECREF(t);
        return Py_NewRef(obj);
    }
    return t;
}

/* ---- deferred GPU work (Note [Deferred GPU work]) ---- */

static PyObject *mod_set_defer(PyObject *m, PyObject *arg)
{
    (void)m;
    int on = PyObject_IsTrue(arg);
    if (on < 0)
        return NULL;
    return PyBool_FromLong(kd_defer_set(on));
}

static PyObject *mod_defer_flush(PyObject *m, PyObject *unused)
{
    (void)m, (void)unused;
    return PyLong_FromLong(kd_defer_flush());
}

static PyObject *mod_defer_stats(PyObject *m, PyObject *unused)
{
    (void)m, (void)unused;
    kd_defer_stats st;
    kd_defer_get_stats(&st);
    return Py_BuildValue("{sKsKsKsKsKsKsKsKsKsKsKsKss}", "queued_hashes", (unsigned long long)st.queued_hashes,
                         "shared_hashes", (unsigned long long)st.shared_hashes,
                         "queued_bytes", (unsigned long long)st.queued_bytes,
                         "queued_copies", (unsigned long long)st.queued_copies,
                         "flushes", (unsigned long long)st.flushes,
                         "hash_launches", (unsigned long long)st.hash_launches,
                         "copy_launches", (unsigned long long)st.copy_launches,
                         "hazard_flushes", (unsigned long long)st.hazard_flushes,
                         "stream_flushes", (unsigned long long)st.stream_flushes,
                         "hash_failures", (unsigned long long)st.hash_failures,
                         "copy_failures", (unsigned long long)st.copy_failures,
                         "pending", (unsigned long long)st.pending,
                         "last_error", kd_defer_last_error());
}

static PyObject *mod_empty_like(PyObject *m, PyObject *t)
{
    (void)m;
    int same = 0;
    PyObject *r = kd_shim_empty_like(t, &same);
    if (r == NULL)
        PyErr_SetString(PyExc_RuntimeError, kd_shim_last_error());
    return r;
}

static PyMethodDef module_methods[] = {
    {"_empty_like", mod_empty_like, METH_O, "_empty_like(t): what record_outputs copies into (tests)."},
    {"_set_defer", mod_set_defer, METH_O, "_set_defer(on) -> previous: batch GPU hashes / copies (Note [Deferred GPU work])."},
    {"defer_flush", mod_defer_flush, METH_NOARGS, "defer_flush(): launch every deferred GPU hash / copy now."},
    {"defer_stats", mod_defer_stats, METH_NOARGS, "defer_stats() -> counters of the deferred GPU work."},
    {"tree_resolve", mod_tree_resolve, METH_VARARGS,
     "tree_resolve(obj, value_fn): replace PendingHash leaves by value_fn(HashValues, spec)."},
    {"tree_extents", mod_tree_extents, METH_O,
     "tree_extents(obj) -> obj with tensor leaves as (device type, index, lo, hi) byte ranges, or NotImplemented."},
    {"hash_async", mod_hash_async, METH_VARARGS,
     "hash_async(t, kinds, stream) -> HashValues, PendingHash (GPU, queued), or NotImplemented"},
    {"hash_fetch", mod_hash_fetch, METH_O, "hash_fetch(pending) -> HashValues (collects if needed)"},
    {"hash_collect", mod_hash_collect, METH_NOARGS,
     "Synchronize once and read every queued GPU hash back; returns kdebug's sync count."},
    {"gpu_info", mod_gpu_info, METH_NOARGS, "{'available', 'syncs', 'in_flight'} of GPU hashing"},
    {"_set_hash_config", mod_set_hash_config, METH_VARARGS,
     "Set what launches hash: (kinds, hash_inputs, check_readonly, spec); returns the previous."},
    {"_set_record_outputs", mod_set_record_outputs, METH_VARARGS,
     "Set output recording: (on, budget_bytes); returns the previous."},
    {"_set_hashers", mod_set_hashers, METH_VARARGS, "Set the slow and custom hash callbacks."},
    {"hash", mod_hash, METH_VARARGS,
     "hash(t, kinds=7) -> HashValues of a CPU tensor."},
    {"_inject_detach_faults", kd_inject_detach_faults, METH_O,
     "Tests only: the next n copies of kept launch records (Recorder.clear) fail, as out of memory would."},
    {"_inject_hook_faults", mod_inject, METH_O,
     "Tests only: the next n launch descriptions fail inside the hook, as a real failure would."},
    {"intern", mod_intern, METH_O, "intern(s) -> id in kdebug's string table"},
    {"string", mod_string, METH_O, "string(id) -> the interned string"},
    {"_set_dtype_names", mod_set_dtype_names, METH_O,
     "Set the dtype abbreviations used when rendering."},
    {"scalar_type", mod_scalar_type, METH_O, "c10::ScalarType number of a torch.dtype"},
    {"tensor_meta", mod_tensor_meta, METH_O,
     "The metadata the launch hook reads from a tensor, as a dict (None for non-tensors)."},
    {"tree_leaf_digest", kd_mod_tree_leaf_digest, METH_O,
     "tree_leaf_digest(hash value) -> the digest TraceReader.last_writer looks for in op outputs."},
    {"now_ns", mod_now_ns, METH_NOARGS, "CLOCK_MONOTONIC in ns, the launch timestamps' clock."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT, "kdebug._C",
    "kdebug's C core: the launch recorder, its ring buffer and the Inductor hooks.", -1,
    module_methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__C(void)
{
    if (kd_strings == NULL) {
        kd_strings = kd_strtab_new(1u << 22);
        if (kd_strings == NULL)
            return PyErr_NoMemory();
    }
    PyObject *m = PyModule_Create(&moduledef);
    if (m == NULL)
        return NULL;
    if (kd_HashValuesType == NULL) {
        kd_HashValuesType = PyStructSequence_NewType(&hash_values_desc);
        if (kd_HashValuesType == NULL)
            return NULL;
    }
    if (PyType_Ready(&kd_RecorderType) != 0 || PyType_Ready(&kd_LaunchType) != 0 ||
        PyModule_AddObjectRef(m, "HashValues", (PyObject *)kd_HashValuesType) != 0 ||
        PyType_Ready(&kd_PendingHashType) != 0 ||
        PyModule_AddObjectRef(m, "PendingHash", (PyObject *)&kd_PendingHashType) != 0 ||
        PyModule_AddObjectRef(m, "Recorder", (PyObject *)&kd_RecorderType) != 0 ||
        PyModule_AddObjectRef(m, "Launch", (PyObject *)&kd_LaunchType) != 0 ||
        kd_hook_module_init(m) != 0 || kd_fmt_module_init(m) != 0 || kd_dispatch_module_init(m) != 0 || kd_trace_module_init(m) != 0 ||
        PyModule_AddIntConstant(m, "KIND_TRITON", KD_KIND_TRITON) != 0 ||
        PyModule_AddIntConstant(m, "HASH_BITWISE", KD_HK_BITWISE) != 0 ||
        PyModule_AddIntConstant(m, "HASH_NORM", KD_HK_NORM) != 0 ||
        PyModule_AddIntConstant(m, "HASH_XOR", KD_HK_XOR) != 0 ||
        PyModule_AddIntConstant(m, "HASH_CUSTOM", KD_HK_CUSTOM) != 0 ||
        PyModule_AddIntConstant(m, "HASH_STATS", KD_HK_STATS) != 0 ||
        PyModule_AddIntConstant(m, "KIND_CPP", KD_KIND_CPP) != 0 ||
        PyModule_AddIntConstant(m, "ROLE_READ", KD_ROLE_READ) != 0 ||
        PyModule_AddIntConstant(m, "ROLE_WRITE", KD_ROLE_WRITE) != 0 ||
        PyModule_AddIntConstant(m, "SLOT_BYTES", (long)sizeof(kd_slot)) != 0 ||
        PyModule_AddIntConstant(m, "NUM_SCALAR_TYPES", kd_shim_num_scalar_types()) != 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
