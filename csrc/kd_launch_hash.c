/* kd_launch_hash.c - hashing a launch's tensors: CPU tensors here, CUDA
 * tensors batched for the hash kernels or handed to the deferred queue
 * (Note [Deferred GPU work]), other devices and custom hashers through Python;
 * and GPU results delivered into the ring records (Note [GPU hash results]). */
#include <string.h>

#include "kd_cuda_graph.h"
#include "kd_cuda_hash.h"
#include "kd_defer.h"
#include "kd_graph.h"
#include "kd_hash.h"
#include "kd_hash_py.h"
#include "kd_launch_hash.h"
#include "kd_trace_digest.h"
#include "kd_cuda_describe.h"
#include "kd_launch.h"
#include "kd_recorder.h"
#include "kd_results.h"
#include "kd_shim.h"

PyObject *kd_slow_hasher = NULL;
uint64_t kd_direct_hash_launches = 0;
PyObject *kd_custom_hasher = NULL;

/* Once both sides of a checked read-only argument's hash are known: whether
 * the launch changed its bytes (check_inputs_unchanged). */
void kd_note_readonly_change(kd_recorder *r, kd_hash_rec *h)
{
    if ((h->flags & KD_HF_CHECKED) && !(h->flags & (KD_HF_PENDING_PRE | KD_HF_PENDING_POST | KD_HF_CHANGED)) &&
        h->bitwise[0] != h->bitwise[1]) {
        h->flags |= KD_HF_CHANGED;
        r->readonly_changed++;
    }
}

/* Note [Unhashed values]: a hash kind the tensor's dtype cannot decode
 * (norm / hash_tensor / stats of float4_e2m1fn_x2 or of a quantized dtype).
 * The record is flagged and counted, and no value is shown for those kinds
 * (kdebug/calls.py gives hashing.Unhashed); their fields get a random nonce
 * (l1: a NaN) so that the digests of two such records (kd_tr_hash_digest:
 * diff, hunt) never match -- unless the same side's bitwise hash was computed
 * (hash_fn=["bitwise", "stats"], the hunt's): then the marker is derived from
 * that hash, so that two tensors with the same bytes match by them (a nonce
 * there made every such tensor of a hunt a false root) and any other bytes
 * differ, as hashing.Unhashed does for aten ops.  GPU results the same way:
 * rec_deliver clears the side's pending flag before it marks them. */
static void mark_unsupported(kd_recorder *r, kd_hash_rec *h, int w, int kinds)
{
    static _Atomic uint64_t counter;
    const uint8_t side = (uint8_t)(w ? KD_HF_POST : KD_HF_PRE);
    const uint8_t pending = (uint8_t)(w ? KD_HF_PENDING_POST : KD_HF_PENDING_PRE);
    uint64_t x;
    if ((h->kinds & KD_HK_BITWISE) && (h->flags & side) && !(h->flags & pending)) /* the bytes' hash is known */
        x = (h->bitwise[w] ^ (uint64_t)kinds) * 0x9E3779B97F4A7C15ull;
    else
        x = kd_now_ns() + atomic_fetch_add_explicit(&counter, 1, memory_order_relaxed) * 0x9E3779B97F4A7C15ull;
    x ^= x >> 31, x *= 0xBF58476D1CE4E5B9ull, x ^= x >> 29; /* mixed: a nonce or the bytes' marker, not a count */
    uint64_t nan = 0x7FF8000000000000ull | (x & ((1ull << 51) - 1)) | 1;
    if (kinds & (KD_HK_NORM | KD_HK_STATS)) {
        memcpy(&h->l1[w], &nan, sizeof nan);
        h->nan[w] = h->posinf[w] = h->neginf[w] = 0;
    }
    if (kinds & KD_HK_XOR)
        h->xor64[w] = x;
    if (kinds & KD_HK_STATS) { /* sum shares xor64's bytes: stats and hash_tensor are exclusive */
        memcpy(&h->sum[w], &nan, sizeof nan);
        memcpy(&h->absmax[w], &nan, sizeof nan);
    }
    h->flags |= KD_HF_UNSUPPORTED;
    r->hash_unsupported++;
}

_Thread_local uint64_t kd_tls_hash_python_calls;

/* A collected GPU result for the hash record at ring ticket `pos` (Note [GPU
 * hash results]): filled in unless the record was drained or lapped since
 * (a drain collects first, so only a cleared or lapped record misses it). */
static void rec_deliver(void *owner, uint64_t pos, int w, const kd_cuda_result *res)
{
    kd_recorder *r = owner;
    uint64_t head = atomic_load_explicit(&r->ring->head, memory_order_relaxed);
    uint64_t tail = atomic_load_explicit(&r->ring->tail, memory_order_relaxed);
    if (pos < tail || head - pos > r->ring->capacity)
        return;
    kd_hash_rec *h = &kd_ring_payload(r->ring, pos)->hash;
    uint8_t pending = (uint8_t)(w ? KD_HF_PENDING_POST : KD_HF_PENDING_PRE);
    if (!(h->flags & pending))
        return;
    if (res->unsupported == KD_CUDA_NOT_COMPUTED) { /* Note [Results in flight]: no value, said so */
        h->flags &= (uint8_t)~(w ? (KD_HF_POST | KD_HF_PENDING_POST) : (KD_HF_PRE | KD_HF_PENDING_PRE));
        kd_recorder_error(r, "a CUDA graph replay raised before it was queued: the hashes of its launches "
                             "were not computed");
        return;
    }
    h->bitwise[w] = kd_hash_finish(res->S, res->nbytes);
    h->l1[w] = res->l1;
    h->nan[w] = res->nan, h->posinf[w] = res->posinf, h->neginf[w] = res->neginf;
    if (h->kinds & KD_HK_STATS) /* Note [Room for the stats]: sum shares xor64's bytes */
        h->sum[w] = res->sum, h->absmax[w] = res->absmax;
    else
        h->xor64[w] = res->xor64;
    h->flags &= (uint8_t)~pending; /* this side's bitwise hash is known now: the marker follows it */
    if (res->unsupported && (h->kinds & (KD_HK_NORM | KD_HK_XOR | KD_HK_STATS)))
        mark_unsupported(r, h, w, h->kinds & (KD_HK_NORM | KD_HK_XOR | KD_HK_STATS));
    kd_note_readonly_change(r, h);
}

/* Side w of the hash record at ring ticket `pos` waits for GPU result `index`
 * (index < 0: queuing failed, `error` says why). */
void kd_await_gpu_result(kd_recorder *r, uint64_t pos, int w, int device, int64_t index, const char *error)
{
    kd_hash_rec *h = &kd_ring_payload(r->ring, pos)->hash;
    if (index >= 0 && kd_results_expect(device, index, rec_deliver, NULL, r->anchor, pos, w) == 0) {
        h->bitwise[w] = (uint64_t)index; /* until the result arrives */
        h->flags |= (uint8_t)(w ? KD_HF_PENDING_POST : KD_HF_PENDING_PRE);
        return;
    }
    h->flags &= (uint8_t)~(w ? (KD_HF_POST | KD_HF_PENDING_POST) : (KD_HF_PRE | KD_HF_PENDING_PRE));
    char msg[300];
    snprintf(msg, sizeof msg, "queuing GPU hashes: %s",
             index >= 0 ? "more GPU hash results in flight than kdebug can track" : error ? error : "");
    kd_recorder_error(r, msg);
}

/* Where a deferred hash lands: the hash payload at ring ticket `pos`, unless
 * the ring has been lapped since (that launch is then counted as lost). */
static void ring_sink(PyObject *owner, uint64_t pos, int w, int device, int64_t index, const char *error)
{
    kd_recorder *r = (kd_recorder *)owner;
    uint64_t head = atomic_load_explicit(&r->ring->head, memory_order_relaxed);
    if (head - pos > r->ring->capacity)
        return;
    kd_await_gpu_result(r, pos, w, device, index, error);
}

/* Hash kernels for the batch now, on its stream: one per run of up to
 * KD_CUDA_BATCH entries of one device and kind; entry i's hash record is at
 * ring ticket base + pos[i]. */
void kd_batch_flush(kd_recorder *r, kd_gpu_batch *b, uint64_t base)
{
    int i = 0;
    while (i < b->n) {
        int j = i + 1;
        while (j < b->n && j - i < KD_CUDA_BATCH && b->device[j] == b->device[i] && b->kinds[j] == b->kinds[i])
            j++;
        if (kd_tls_graph != NULL) {
            /* Note [CUDA graph replays]: captured into the graph; the record
             * keeps the graph-relative index for the template */
            int64_t k0 = 0;
            const char *err = NULL;
            int rc = kd_graph_hash(kd_tls_graph, b->device[i], b->stream, b->kinds[i], &b->t[i], j - i, &k0, &err);
            for (int k = i; k < j; k++) {
                kd_hash_rec *h = &kd_ring_payload(r->ring, base + b->pos[k])->hash;
                int w = b->w[k];
                if (rc == 0) {
                    h->bitwise[w] = (uint64_t)(k0 + (k - i));
                    h->flags |= (uint8_t)(w ? KD_HF_PENDING_POST : KD_HF_PENDING_PRE);
                } else {
                    h->flags &= (uint8_t)~(w ? (KD_HF_POST | KD_HF_PENDING_POST) : (KD_HF_PRE | KD_HF_PENDING_PRE));
                }
            }
            if (rc != 0) {
                char msg[300];
                snprintf(msg, sizeof msg, "capturing GPU hashes into a CUDA graph: %s", err ? err : "");
                kd_recorder_error(r, msg);
            }
            i = j;
            continue;
        }
        int64_t first;
        const char *err = NULL;
        if (kd_graph_any_open() && kd_cuda_stream_capturing(b->stream)) {
            /* another thread's capture (e.g. the autograd engine's device
             * thread during make_graphed_callables' backward): a hash kernel
             * here would be captured with a fixed result slot, and the
             * launch did not run */
            first = -1;
            err = "a launch from another thread than the one capturing a CUDA graph into its stream: not hashed";
        } else {
            first = kd_cuda_hash_enqueue(b->device[i], b->stream, b->kinds[i], &b->t[i], j - i);
            err = first < 0 ? kd_cuda_last_error() : NULL;
        }
        if (first >= 0)
            kd_direct_hash_launches++;
        for (int k = i; k < j; k++)
            kd_await_gpu_result(r, base + b->pos[k], b->w[k], b->device[k], first < 0 ? -1 : first + (k - i), err);
        i = j;
    }
    b->n = 0;
}

/* Hands a batch to the deferred queue (Note [Deferred GPU work]); what the
 * queue refuses is launched right away. */
void kd_batch_defer(kd_recorder *r, kd_gpu_batch *b, uint64_t base)
{
    int refused = 0;
    for (int i = 0; i < b->n; i++) {
        uint64_t pos = base + b->pos[i];
        kd_hash_rec *h = &kd_ring_payload(r->ring, pos)->hash;
        h->flags |= (uint8_t)(b->w[i] ? KD_HF_PENDING_POST : KD_HF_PENDING_PRE);
        if (!kd_defer_hash(b->obj[i], &b->t[i], b->device[i], b->stream, b->kinds[i], ring_sink,
                           (PyObject *)r, pos, b->w[i])) {
            /* compacted to the front, with absolute tickets */
            b->t[refused] = b->t[i], b->pos[refused] = pos, b->w[refused] = b->w[i];
            b->device[refused] = b->device[i], b->kinds[refused] = b->kinds[i];
            refused++;
        }
    }
    b->n = refused;
    kd_batch_flush(r, b, 0);
}

/* A quint4x2 / quint2x4 tensor's packed bytes, as int_repr() gives them (two
 * or four values a byte): m becomes a 1-D view of them (quint8: still
 * quantized, for its parameters); 0 for a view that is not contiguous from
 * its storage's start. */
static int packed_bytes(kd_tensor_meta *m, int64_t *size)
{
    static const int64_t one[1] = {1};
    const int bits = m->dtype == KD_ST_QUINT4X2 ? 4 : 2;
    int64_t numel = 1, expect = 1;
    for (int32_t d = m->ndim - 1; d >= 0; d--) {
        if (m->sizes[d] != 1 && m->strides[d] != expect)
            return 0;
        expect *= m->sizes[d];
        numel *= m->sizes[d];
    }
    if (m->storage_offset != 0)
        return 0;
    size[0] = (numel * bits + 7) / 8;
    m->dtype = KD_ST_QUINT8;
    m->ndim = 1;
    m->sizes = size;
    m->strides = one;
    return 1;
}

/* Note [Quantized tensors' parameters] (kdebug/hashing.py): the digest the
 * bitwise hash of a quantized CPU tensor is mixed with, as hashing.py's
 * qparams_digest computes it (from kd_shim_qparams' values).  1 done, 0 not
 * quantized, -1 not readable. */
static int qparams_digest(PyObject *o, uint64_t *out)
{
    kd_qparams q;
    int got = kd_shim_qparams(o, &q);
    if (got <= 0)
        return got;
    static const int64_t two[1] = {2}, one[1] = {1}, step[1] = {1};
    kd_view head = {q.head, KD_ST_LONG, 8, 1, two, step};
    uint64_t d = kd_hash_bitwise(&head);
    if (!q.per_channel) {
        kd_view sc = {&q.scale, KD_ST_DOUBLE, 8, 1, one, step};
        kd_view zp = {&q.zero_point, KD_ST_LONG, 8, 1, one, step};
        *out = kd_dg_mix(kd_dg_mix(d, kd_hash_bitwise(&sc)), kd_hash_bitwise(&zp));
        return 1;
    }
    const kd_tensor_meta *parts[2] = {&q.scales, &q.zero_points};
    for (int i = 0; i < 2; i++) {
        const kd_tensor_meta *p = parts[i];
        int isz = kd_itemsize(p->dtype);
        int64_t numel = 1;
        for (int32_t k = 0; k < p->ndim; k++)
            numel *= p->sizes[k];
        if (p->device_type != KD_DEV_CPU || isz == 0 || p->math_bits || (p->data_ptr == 0 && numel > 0) ||
            !kd_meta_in_storage(p, isz))
            return -1; /* (a quantized CUDA tensor is hashed by hashing.py, on the host) */
        kd_view v = {(const void *)(uintptr_t)p->data_ptr, p->dtype, isz, p->ndim, p->sizes, p->strides};
        d = kd_dg_mix(d, kd_hash_bitwise(&v));
    }
    *out = d;
    return 1;
}

/* Queues a CUDA tensor's hashes; 0 if this build or view cannot (the caller
 * falls back to the slow path). */
static int batch_add(kd_gpu_batch *b, const kd_tensor_meta *m, int kinds,
                     kd_hash_rec *h, int w, uint64_t stream, PyObject *obj, uint64_t pos)
{
    kd_cuda_tensor probe;
    if (b == NULL || kd_dtype_quantized(m->dtype) || !kd_cuda_describe(m, &probe))
        return 0; /* (quantized: hashed with its parameters by hashing.py, Note [Quantized tensors' parameters]) */
    if (b->n == KD_GPU_BATCH_MAX)
        return 0; /* a launch with more hashed tensors: the rest take the slow path */
    kd_cuda_tensor *t = &b->t[b->n];
    *t = probe;
    if (t->numel == 0) {
        /* nothing to read: the empty tensor's values are known */
        h->bitwise[w] = kd_hash_finish(0, 0);
        return 1;
    }
    b->w[b->n] = w;
    b->obj[b->n] = obj;
    b->pos[b->n] = pos;
    b->device[b->n] = m->device_index;
    b->kinds[b->n] = kinds;
    b->stream = stream;
    b->n++;
    return 1;
}

/* Hashes tensor object o with `kinds` into slot `w` (0 pre, 1 post) of h.
 * CUDA tensors go to the batch b (queued on `stream`), CPU tensors are hashed
 * here, anything else through the slow Python path. */
void kd_hash_tensor(kd_recorder *r, PyObject *o, int kinds, kd_hash_rec *h, int w,
                    uint64_t launch_index, Py_ssize_t arg, kd_gpu_batch *b, uint64_t stream,
                    uint64_t pos, const kd_tensor_meta *known)
{
    kd_tensor_meta m;
    if (known != NULL)
        m = *known;
    else if (kd_shim_tensor_meta(o, &m) != 1)
        return;
    h->kinds |= (uint8_t)kinds;
    int64_t packed_size[1];
    if ((m.dtype == KD_ST_QUINT4X2 || m.dtype == KD_ST_QUINT2X4) && !packed_bytes(&m, packed_size)) {
        h->flags |= KD_HF_UNSUPPORTED;
        kd_recorder_error(r, "a sub-byte quantized tensor (quint4x2 / quint2x4) that is not contiguous was not hashed");
        return;
    }
    if (!kd_meta_in_storage(&m, kd_itemsize(m.dtype))) {
        /* its elements are not its storage's: nothing is read (kd_shim.h) */
        h->flags |= KD_HF_UNSUPPORTED; /* counted as a hook error (its message says why), not as a dtype */
        kd_recorder_error(r, "a tensor whose storage is smaller than its view (resized under it) was not hashed");
        return;
    }
    h->flags |= (uint8_t)(w ? KD_HF_POST : KD_HF_PRE);
    int std_kinds = kinds & (KD_HK_BITWISE | KD_HK_NORM | KD_HK_XOR | KD_HK_STATS);
    if (std_kinds && !m.math_bits && batch_add(b, &m, std_kinds, h, w, stream, o, pos)) {
        /* queued */
    } else if (m.device_type == KD_DEV_CPU && !m.math_bits) {
        kd_view v = {(const void *)(uintptr_t)m.data_ptr, m.dtype, kd_itemsize(m.dtype),
                     m.ndim, m.sizes, m.strides};
        kd_view vi = v; /* the values the norm, hash_tensor and stats read: a quantized tensor's integers */
        vi.scalar_type = kd_quant_int_dtype(m.dtype);
        int64_t numel = 1;
        for (int d = 0; d < m.ndim; d++)
            numel *= m.sizes[d];
        /* an empty tensor may have no storage: its hashes need none */
        if (v.itemsize == 0 || (m.data_ptr == 0 && numel > 0)) {
            h->flags &= (uint8_t)~(w ? KD_HF_POST : KD_HF_PRE); /* no value of any kind */
            h->flags |= KD_HF_UNSUPPORTED;
            r->hash_unsupported++;
        } else {
            if (kinds & KD_HK_BITWISE) {
                h->bitwise[w] = kd_hash_bitwise(&v);
                uint64_t qd;
                int q = kd_dtype_quantized(m.dtype) ? qparams_digest(o, &qd) : 0;
                if (q > 0) {
                    h->bitwise[w] = kd_dg_mix(h->bitwise[w], qd);
                } else if (q < 0) { /* its integers without its scales are not its values: no value */
                    h->flags &= (uint8_t)~(w ? KD_HF_POST : KD_HF_PRE);
                    kd_recorder_error(r, "a quantized tensor whose quantizer kdebug could not read was not hashed");
                    return;
                }
            }
            if (kinds & KD_HK_STATS) { /* the norm's fields too, in one pass */
                kd_stats n;
                if (kd_hash_stats(&vi, &n) == 0) {
                    h->l1[w] = n.norm.l1;
                    h->nan[w] = n.norm.nan, h->posinf[w] = n.norm.posinf, h->neginf[w] = n.norm.neginf;
                    h->sum[w] = n.sum, h->absmax[w] = n.absmax;
                } else {
                    mark_unsupported(r, h, w, KD_HK_STATS | (kinds & KD_HK_NORM));
                }
            } else if (kinds & KD_HK_NORM) {
                kd_norm n;
                if (kd_hash_norm(&vi, &n) == 0) {
                    h->l1[w] = n.l1;
                    h->nan[w] = n.nan, h->posinf[w] = n.posinf, h->neginf[w] = n.neginf;
                } else {
                    mark_unsupported(r, h, w, KD_HK_NORM);
                }
            }
            if ((kinds & KD_HK_XOR) && kd_hash_xor64(&vi, &h->xor64[w]) != 0)
                mark_unsupported(r, h, w, KD_HK_XOR);
        }
    } else if (std_kinds && kd_tls_graph != NULL && m.device_type != KD_DEV_CPU) {
        /* Note [CUDA graph replays]: the slow path copies the tensor to the
         * host (a synchronization the capture forbids, and values that do not
         * exist yet); not hashed, counted on the graph */
        h->flags &= (uint8_t)~(w ? KD_HF_POST : KD_HF_PRE);
        kd_graph_note_hash_error(kd_tls_graph);
        kd_recorder_error(r, "a tensor kdebug hashes only on the host, during a CUDA graph capture: not hashed");
    } else if (std_kinds) {
        kd_tls_hash_python_calls++;
        PyObject *res = kd_slow_hasher ? PyObject_CallFunction(kd_slow_hasher, "Oi", o, std_kinds) : NULL;
        unsigned long long v[9]; /* a HashValues (Note [HashValues] in kd_hash_py.c) */
        int ok = res != NULL && Py_TYPE(res) == kd_HashValuesType;
        for (int i = 0; ok && i < 9; i++) {
            PyObject *x = PyStructSequence_GET_ITEM(res, i);
            if (i == 1 || i == 7 || i == 8) {
                double d = PyFloat_AsDouble(x);
                memcpy(&v[i], &d, 8);
            } else {
                v[i] = PyLong_AsUnsignedLongLongMask(x);
            }
            if (PyErr_Occurred())
                ok = 0;
        }
        if (ok) {
            h->bitwise[w] = v[0];
            memcpy(&h->l1[w], &v[1], 8);
            h->nan[w] = v[2], h->posinf[w] = v[3], h->neginf[w] = v[4];
            if (kinds & KD_HK_STATS) {
                memcpy(&h->sum[w], &v[7], 8);
                memcpy(&h->absmax[w], &v[8], 8);
            } else {
                h->xor64[w] = v[5];
            }
            if (v[6])
                mark_unsupported(r, h, w, kinds & (KD_HK_NORM | KD_HK_XOR | KD_HK_STATS));
        } else {
            h->flags &= (uint8_t)~(w ? KD_HF_POST : KD_HF_PRE); /* nothing computed: no values */
            kd_recorder_error(r, m.math_bits ? "hashing a conjugate / negative view" : "hashing a device tensor");
        }
        Py_XDECREF(res);
    }
    if ((kinds & KD_HK_CUSTOM) && kd_custom_hasher != NULL && kd_tls_graph != NULL) {
        /* the hash_fn would read a captured tensor's values on the host */
        kd_graph_note_hash_error(kd_tls_graph);
        kd_recorder_error(r, "the custom hash_fn does not run during a CUDA graph capture: not hashed");
    } else if ((kinds & KD_HK_CUSTOM) && kd_custom_hasher != NULL) {
        kd_tls_hash_python_calls++;
        PyObject *res = PyObject_CallFunction(kd_custom_hasher, "OKniO", (PyObject *)r,
                                              (unsigned long long)launch_index, arg, w, o);
        if (res == NULL)
            kd_recorder_error(r, "the custom hash_fn raised");
        Py_XDECREF(res);
    }
}
