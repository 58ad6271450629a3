/* kd_hash_py.c - hashing tensors from Python: _C.HashValues (Note
 * [HashValues]), hash() of a CPU tensor, and PendingHash, a hash still on the
 * GPU (hash_async / hash_fetch / hash_collect). */
#include <string.h>

#include "kd_cuda_hash.h"
#include "kd_defer.h"
#include "kd_hash.h"
#include "kd_record.h"
#include "kd_hash_py.h"
#include "kd_cuda_describe.h"
#include "kd_cuda_graph.h"
#include "kd_graph.h"
#include "kd_results.h"
#include "kd_shim.h"

/* kd_meta_in_storage (kd_shim.h) said no */
#define STORAGE_TOO_SMALL                                                                                    \
    "kdebug cannot hash this tensor: its storage is smaller than its view (resized or replaced under it); "  \
    "its elements are not memory it owns"

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
    "kdebug._C.HashValues", "A tensor's hash values (Note [HashValues] in csrc/kd_hash_py.c).",
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
/* Fills *meta from tensor t; returns 0, or sets TypeError and returns -1. */
static int tensor_meta(PyObject *t, kd_tensor_meta *meta)
{
    int r = kd_shim_tensor_meta(t, meta);
    if (r == 1)
        return 0;
    PyErr_SetString(PyExc_TypeError, r == 0 ? "expected a tensor" : kd_shim_last_error());
    return -1;
}

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
    if (tensor_meta(t, &meta) < 0)
        return NULL;
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
    if (!kd_meta_in_storage(&meta, v.itemsize)) {
        PyErr_SetString(PyExc_ValueError, STORAGE_TOO_SMALL);
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


static void pending_deliver(void *owner, uint64_t aux, int w, const kd_cuda_result *res)
{
    (void)aux, (void)w;
    kd_pending_hash *p = owner;
    if (res->unsupported == KD_CUDA_NOT_COMPUTED) { /* Note [Results in flight]: nothing computed it */
        p->handle = KD_PENDING_FAILED;
        return;
    }
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

void kd_pending_sink(PyObject *owner, uint64_t aux, int w, int device, int64_t index, const char *error)
{
    (void)aux, (void)w, (void)error;
    pending_await((kd_pending_hash *)owner, device, index);
}

kd_pending_hash *kd_pending_new(int spec)
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
PyObject *kd_pending_fetch(kd_pending_hash *p)
{
    if (p->handle == KD_PENDING_DEFERRED)
        kd_defer_flush();
    if (p->handle < 0) /* queuing failed: counted in defer_stats, reported by DebugMode */
        Py_RETURN_NONE;
    if (!p->have && p->handle >= 0 && kd_collect_gpu_results() != 0) {
        PyErr_SetString(PyExc_RuntimeError, kd_collect_gpu_error());
        return NULL;
    }
    if (p->handle < 0) /* its replay raised before it was queued: not computed (Note [Results in flight]) */
        Py_RETURN_NONE;
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

PyTypeObject kd_PendingHashType = {
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
uint64_t kd_capture_unhashed = 0;

int kd_hash_capturing(uint64_t stream)
{
    return kd_tls_graph != NULL || kd_cuda_stream_capturing(stream);
}

PyObject *kd_mod_hash_async(PyObject *m, PyObject *args)
{
    PyObject *t;
    int kinds;
    unsigned long long stream;
    if (!PyArg_ParseTuple(args, "OiK", &t, &kinds, &stream))
        return NULL;
    kd_tensor_meta meta;
    if (tensor_meta(t, &meta) < 0)
        return NULL;
    if (meta.math_bits) /* the slow path resolves them (kdebug/hashing.py) */
        Py_RETURN_NOTIMPLEMENTED;
    if (meta.device_type == KD_DEV_CPU) { /* (mod_hash checks its storage) */
        PyObject *a = Py_BuildValue("(Oi)", t, kinds);
        PyObject *res = a ? mod_hash(m, a) : NULL;
        Py_XDECREF(a);
        return res;
    }
    if (!kd_meta_in_storage(&meta, kd_itemsize(meta.dtype))) {
        /* here, not as kd_cuda_describe's refusal: that answers NotImplemented,
         * and the slow path would read the view with torch */
        PyErr_SetString(PyExc_ValueError, STORAGE_TOO_SMALL);
        return NULL;
    }
    kd_cuda_tensor ct;
    if (!kd_cuda_describe(&meta, &ct))
        Py_RETURN_NOTIMPLEMENTED;
    if (ct.numel == 0)
        return kd_hash_values(kd_hash_finish(0, 0), 0.0, 0, 0, 0, 0, 0, 0.0, 0.0);
    if (stream == 0) /* the tensor's device's current stream */
        stream = kd_shim_current_stream(meta.device_type, meta.device_index);
    kd_pending_hash *p = kd_pending_new(0);
    if (p == NULL)
        return NULL;
    if (kd_hash_capturing(stream)) {
        /* Note [CUDA graph replays]: the stream captures a CUDA graph, so the
         * tensor holds no values yet, and a hash kernel queued here would be
         * captured into the graph writing a fixed result slot at every replay
         * (others' later).  No value (counted: gpu_info()["unhashed_in_capture"]). */
        kd_capture_unhashed++;
        p->handle = KD_PENDING_FAILED;
        return (PyObject *)p;
    }
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

/* hash_fetch(pending) -> the HashValues of a queued GPU hash (collects if
 * needed), or None when it has none: asked for during a CUDA graph capture of
 * its stream (Note [CUDA graph replays]), or its queuing failed (counted).
 * It raised there, and upstream's aten-op hooks (kdebug/hashing.py's aten_fn)
 * raised that into the program's op under a capture. */
static PyObject *mod_hash_fetch(PyObject *m, PyObject *arg)
{
    (void)m;
    if (Py_TYPE(arg) != &kd_PendingHashType) {
        PyErr_Format(PyExc_TypeError, "hash_fetch expects a PendingHash (from hash_async), not %s",
                     Py_TYPE(arg)->tp_name);
        return NULL;
    }
    return kd_pending_fetch((kd_pending_hash *)arg);
}

static PyObject *mod_hash_collect(PyObject *m, PyObject *unused)
{
    (void)m;
    (void)unused;
    kd_defer_flush();
    if (kd_collect_gpu_results() != 0) {
        PyErr_SetString(PyExc_RuntimeError, kd_collect_gpu_error());
        return NULL;
    }
    return PyLong_FromUnsignedLongLong(kd_cuda_syncs());
}

static PyObject *mod_gpu_info(PyObject *m, PyObject *unused)
{
    (void)m;
    (void)unused;
    return Py_BuildValue("{sOsKsLsKsK}", "available", kd_cuda_available() ? Py_True : Py_False,
                         "syncs", (unsigned long long)kd_cuda_syncs(), "in_flight",
                         (long long)kd_cuda_hash_outstanding(), "waiting",
                         (unsigned long long)kd_results_waiting(), "unhashed_in_capture",
                         (unsigned long long)kd_capture_unhashed);
}

static PyMethodDef hash_methods[] = {
    {"hash_async", kd_mod_hash_async, METH_VARARGS,
     "hash_async(t, kinds, stream) -> HashValues, PendingHash (GPU, queued), or NotImplemented"},
    {"hash_fetch", mod_hash_fetch, METH_O, "hash_fetch(pending) -> HashValues | None (collects if needed; None: no value)"},
    {"hash_collect", mod_hash_collect, METH_NOARGS,
     "Synchronize once and read every queued GPU hash back; returns kdebug's sync count."},
    {"gpu_info", mod_gpu_info, METH_NOARGS, "{'available', 'syncs', 'in_flight'} of GPU hashing"},
    {"hash", mod_hash, METH_VARARGS,
     "hash(t, kinds=7) -> HashValues of a CPU tensor."},
    {NULL, NULL, 0, NULL},
};

int kd_hash_py_module_init(PyObject *m)
{
    if (kd_HashValuesType == NULL) {
        kd_HashValuesType = PyStructSequence_NewType(&hash_values_desc);
        if (kd_HashValuesType == NULL)
            return -1;
    }
    if (PyModule_AddObjectRef(m, "HashValues", (PyObject *)kd_HashValuesType) != 0 ||
        PyType_Ready(&kd_PendingHashType) != 0 ||
        PyModule_AddObjectRef(m, "PendingHash", (PyObject *)&kd_PendingHashType) != 0)
        return -1;
    return PyModule_AddFunctions(m, hash_methods);
}
