/* kd_tree.c - aten-op arguments and results as pytrees, walked in C (the
 * fast path of kdebug/mode.py): every tensor leaf hashed (tree_hash), cloned
 * (tree_clone) or mapped to the bytes it covers (tree_extents), and PendingHash
 * leaves resolved to their values (tree_resolve). */
#include "kd_cuda_hash.h"
#include "kd_defer.h"
#include "kd_hash.h"
#include "kd_hash_py.h"
#include "kd_launch_hash.h"
#include "kd_cuda_describe.h"
#include "kd_shim.h"
#include "kd_tree.h"
#include "kd_types.h"

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

/* The Extent (device type, device index, first byte, one past the last byte)
 * of the memory a tensor leaf covers, None for other leaves (Note [Data flow] in
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
    uint64_t span = 1, numel = 1;
    for (int d = 0; d < m.ndim; d++) {
        if (m.sizes[d] == 0) {
            span = 0;
            numel = 0;
            break;
        }
        span += (uint64_t)(m.sizes[d] - 1) * (uint64_t)(m.strides[d] < 0 ? -m.strides[d] : m.strides[d]);
        numel *= (uint64_t)m.sizes[d];
    }
    int itemsize = kd_itemsize(m.dtype);
    uint64_t isz = (uint64_t)(itemsize > 0 ? itemsize : 1);
    uint64_t lo = m.data_ptr, hi = m.data_ptr + span * isz;
    /* Note [Partial writes] (kdebug/dataflow.py): the bytes the elements cover (a broadcast view's
     * elements overlap: never more than the range) */
    uint64_t nbytes = numel * isz < hi - lo ? numel * isz : hi - lo;
    return KD_RECORD(kd_ExtentType, PyLong_FromLong(m.device_type), PyLong_FromLong(m.device_index),
                     PyLong_FromUnsignedLongLong((unsigned long long)lo), PyLong_FromUnsignedLongLong((unsigned long long)hi),
                     PyLong_FromUnsignedLongLong((unsigned long long)nbytes));
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
    if (kd_dtype_quantized(meta.dtype) && kd_slow_hasher != NULL &&
        (meta.device_type == KD_DEV_CPU ||
         !kd_hash_capturing(c->stream ? c->stream : kd_shim_current_stream(meta.device_type, meta.device_index)))) {
        /* its integers and its quantizer's parameters (Note [Quantized tensors' parameters] in
         * kdebug/hashing.py), computed there; during a CUDA graph capture the path below gives no
         * value, as for any tensor (hashing.py would copy it to the host) */
        PyObject *hv = PyObject_CallFunction(kd_slow_hasher, "Oi", o, c->kinds);
        if (hv == NULL)
            return NULL;
        PyObject *v = PyObject_CallFunctionObjArgs(c->value_fn, hv, NULL);
        Py_DECREF(hv);
        return v;
    }
    kd_cuda_tensor ct;
    if (kd_defer_enabled() && !meta.math_bits && kd_cuda_describe(&meta, &ct) && ct.numel > 0) {
        kd_pending_hash *p = kd_pending_new(c->spec);
        if (p == NULL)
            return NULL;
        uint64_t stream = c->stream ? c->stream : kd_shim_current_stream(meta.device_type, meta.device_index);
        /* capturing a CUDA graph: kd_mod_hash_async below gives no value */
        if (!kd_hash_capturing(stream) && kd_defer_hash(o, &ct, meta.device_index, stream, c->kinds, kd_pending_sink, (PyObject *)p, 0, 0))
            return (PyObject *)p;
        Py_DECREF(p); /* not queued: hashed right away below */
    }
    PyObject *a = Py_BuildValue("(OiK)", o, c->kinds, c->stream);
    PyObject *h = a ? kd_mod_hash_async(NULL, a) : NULL;
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
    const int spec = p->spec;
    Py_INCREF(o); /* a borrowed leaf, and the fetch may release the GIL (Note [Results in flight]) */
    PyObject *r = kd_pending_fetch(p);
    Py_DECREF(o);
    if (r == NULL || r == Py_None)
        return r;
    PyObject *v = PyObject_CallFunction((PyObject *)ctx, "Oi", r, spec);
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

static PyMethodDef tree_methods[] = {
    {"tree_resolve", mod_tree_resolve, METH_VARARGS,
     "tree_resolve(obj, value_fn): replace PendingHash leaves by value_fn(HashValues, spec)."},
    {"tree_extents", mod_tree_extents, METH_O,
     "tree_extents(obj) -> obj with tensor leaves as Extent byte ranges, or NotImplemented."},
    {NULL, NULL, 0, NULL},
};

int kd_tree_module_init(PyObject *m) { return PyModule_AddFunctions(m, tree_methods); }
