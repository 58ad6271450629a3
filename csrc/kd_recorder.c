/* kd_recorder.c - the Recorder type: one ring, the launches drained from it,
 * and the code that writes a launch into the ring (the hot path). */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kd_cuda_hash.h"
#include "kd_defer.h"
#include "kd_hash.h"
#include "kd_py.h"
#include "kd_results.h"
#include "kd_shim.h"

_Thread_local kd_recorder *kd_tls_recorder = NULL;
kd_recorder *kd_global_recorder = NULL; /* GIL */
long kd_started_recorders = 0;           /* GIL */
_Thread_local int kd_tls_compiling = 0;
long kd_injected_faults = 0; /* GIL; tests: make the next N launch descriptions fail */

/* Note [Per-thread launch context]
 * A launch is described in a buffer of its own thread (kd_launch_ctx), not in
 * one the recorder shares between threads: Python code runs in the middle of
 * describing a launch (custom and slow hashers, output clones), and a hasher
 * that releases the GIL lets another thread's launch in.  The rules:
 *  - Python callbacks write only into this thread's context, never into ring
 *    slots.  Before the launch they fill the build buffer, which is copied
 *    into the ring after they are done; after the launch they work on a copy
 *    of the launch's record whose post-launch hash values are then merged
 *    back (merge_post).
 *  - Ring slots are written only in stretches of C that hold the GIL (every
 *    writer holds it) and run no Python code, each starting right after
 *    kd_ring_reserve or after a check that the ring has not lapped the launch:
 *    no other writer can come in between.  Objects a stretch lets go of are
 *    released after it (ctx->released), since releasing one can run Python.
 *  - A thread inside kd_launch_begin / kd_launch_end is `busy`, as
 *    tracemalloc's reentrant flag: a launch it makes meanwhile (a kernel run
 *    by a hash_fn) is the hash's own work, like the aten ops a hash_fn runs,
 *    and is counted as suppressed instead of recorded.  That also keeps a
 *    hash_fn that calls a compiled function from hashing its own launches
 *    without end.  Launches made by the kernel itself, between begin and end,
 *    are recorded as before: the build buffer is free by then.
 *  - The buffers are allocated on a thread's first recorded launch and freed
 *    when the thread exits (a pthread key's destructor): no allocation per
 *    launch.
 */
typedef struct kd_launch_ctx {
    int busy;             /* inside kd_launch_begin / kd_launch_end */
    kd_payload *build;    /* [KD_BUILD_SLOTS] the launch being described */
    PyObject **released;  /* [KD_BUILD_SLOTS] references to drop after a ring stretch */
} kd_launch_ctx;

static _Thread_local kd_launch_ctx *tls_ctx;
static pthread_key_t ctx_key;
static pthread_once_t ctx_once = PTHREAD_ONCE_INIT;
static int ctx_key_ok;

/* Frees a thread's launch context (the pthread key's destructor, at thread exit). */
static void ctx_free(void *p)
{
    kd_launch_ctx *c = p;
    if (c == NULL)
        return;
    free(c->build);
    free(c->released);
    free(c);
}

static void ctx_key_init(void) { ctx_key_ok = pthread_key_create(&ctx_key, ctx_free) == 0; }

/* This thread's launch context, allocated on its first use; NULL when out of
 * memory (the caller counts the launch as unrecorded). */
static kd_launch_ctx *launch_ctx(void)
{
    kd_launch_ctx *c = tls_ctx;
    if (c != NULL)
        return c;
    pthread_once(&ctx_once, ctx_key_init);
    c = calloc(1, sizeof *c);
    if (c != NULL) {
        c->build = calloc(KD_BUILD_SLOTS, sizeof(kd_payload));
        c->released = calloc(KD_BUILD_SLOTS, sizeof(PyObject *));
    }
    if (c == NULL || c->build == NULL || c->released == NULL || !ctx_key_ok ||
        pthread_setspecific(ctx_key, c) != 0) {
        ctx_free(c);
        return NULL;
    }
    tls_ctx = c;
    return c;
}

uint64_t kd_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

kd_recorder *kd_active_recorder(void)
{
    kd_recorder *r = kd_tls_recorder;
    if (r == NULL && kd_started_recorders > 0) {
        /* A thread torch started for us (autograd's device threads run the
         * backward on CUDA) carries the entering thread's recorder in
         * at::ThreadLocalState. */
        PyObject *o = kd_shim_tls_recorder_get();
        if (o != NULL && Py_TYPE(o) == &kd_RecorderType && ((kd_recorder *)o)->started)
            r = (kd_recorder *)o;
        if (r == NULL)
            r = kd_global_recorder;
    }
    if (r == NULL)
        return NULL;
    if ((tls_ctx != NULL && tls_ctx->busy) || kd_tls_compiling || kd_in_benchmark()) {
        r->suppressed++;
        return NULL;
    }
    return r;
}

void kd_recorder_error(kd_recorder *r, const char *what)
{
    r->errors++;
    if (r->nmessages >= KD_MAX_ERROR_MESSAGES) {
        PyErr_Clear();
        return;
    }
    char *dst = r->messages[r->nmessages++];
    const char *detail = "";
    PyObject *type, *value, *tb, *s = NULL;
    PyErr_Fetch(&type, &value, &tb);
    if (value != NULL || type != NULL) {
        s = PyObject_Str(value ? value : type);
        if (s != NULL)
            detail = PyUnicode_AsUTF8(s);
        if (detail == NULL) {
            PyErr_Clear();
            detail = "";
        }
    }
    const char *tname = type ? ((PyTypeObject *)type)->tp_name : "";
    snprintf(dst, KD_ERROR_MESSAGE_BYTES, "%s%s%s%s%s", what, *tname ? ": " : "",
             tname, *detail ? ": " : "", detail);
    Py_XDECREF(s);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
}

/* ---- the launch path (Note [Record layout] in kd_record.h) ---- */

_Thread_local kd_hash_config kd_hcfg = {0, 0, 0, 0, 0, 0};

void kd_hcfg_publish(void)
{
    unsigned long me = PyThread_get_thread_ident();
    for (kd_recorder *r = kd_tls_recorder; r != NULL; r = r->prev)
        r->owner_hcfg = kd_hcfg;
    if (kd_global_recorder != NULL && kd_global_recorder->owner_thread == me)
        kd_global_recorder->owner_hcfg = kd_hcfg;
}

/* The settings a launch on this thread into r uses (Note [Hash settings per thread]). */
static kd_hash_config launch_hcfg(const kd_recorder *r)
{
    kd_hash_config c = kd_hcfg;
    const kd_hash_config *o = &r->owner_hcfg;
    if (!c.kinds && !c.check_readonly) {
        c.kinds = o->kinds;
        c.hash_inputs = o->hash_inputs;
        c.check_readonly = o->check_readonly;
        c.spec = o->spec;
    }
    if (!c.record_outputs) {
        c.record_outputs = o->record_outputs;
        c.output_budget = o->output_budget;
    }
    return c;
}
PyObject *kd_slow_hasher = NULL;
PyObject *kd_custom_hasher = NULL;

/* Describes one argument at b[0..); returns the payloads used, 0 on failure
 * (counted by the caller).  With `hashed`, one more zeroed KD_TAG_HASH
 * payload follows the argument. */
static uint32_t describe_arg(PyObject *o, uint32_t name_id, uint8_t role, int hashed,
                             kd_payload *b, uint32_t room, const char **why)
{
    kd_tensor_meta m;
    int kind = kd_shim_tensor_meta(o, &m);
    if (kind == 1) {
        if (m.ndim < 0 || m.ndim > KD_MAX_NDIM) {
            *why = "tensor with too many dimensions";
            return 0;
        }
        uint32_t np = kd_tensor_payloads((uint32_t)m.ndim) + (hashed ? 1 : 0);
        if (np > room) {
            *why = "launch has more arguments than a record can hold";
            return 0;
        }
        memset(b, 0, sizeof(kd_payload) * np);
        kd_tensor_arg *t = &b[0].tensor;
        t->tag = KD_TAG_TENSOR;
        t->role = role;
        t->dtype = (uint8_t)m.dtype;
        t->ndim = (uint8_t)m.ndim;
        t->device_type = (uint8_t)m.device_type;
        t->device_index = (int8_t)m.device_index;
        t->name_id = name_id;
        t->storage_offset = m.storage_offset;
        t->data_ptr = m.data_ptr;
        for (int32_t d = 0; d < m.ndim; d++) {
            if (d < KD_INLINE_DIMS) {
                t->sizes[d] = m.sizes[d];
                t->strides[d] = m.strides[d];
            } else {
                int32_t k = d - KD_INLINE_DIMS;
                kd_dims_cont *c = &b[1 + k / KD_CONT_DIMS].dims;
                c->tag = KD_TAG_DIMS;
                c->count++;
                c->sizes[k % KD_CONT_DIMS] = m.sizes[d];
                c->strides[k % KD_CONT_DIMS] = m.strides[d];
            }
        }
        if (hashed) {
            t->flags |= KD_TF_HASHED;
            b[np - 1].hash.tag = KD_TAG_HASH;
        }
        return np;
    }
    if (kind < 0) {
        *why = kd_shim_last_error();
        return 0;
    }
    if (room < 1) {
        *why = "launch has more arguments than a record can hold";
        return 0;
    }
    kd_scalar_arg *s = &b[0].scalar;
    memset(b, 0, sizeof(kd_payload));
    s->role = role;
    s->name_id = name_id;
    if (o == Py_None) {
        s->tag = KD_TAG_NONE;
    } else if (PyBool_Check(o)) {
        s->tag = KD_TAG_BOOL;
        s->value.i = o == Py_True;
    } else if (PyLong_Check(o)) {
        int overflow = 0;
        long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
        if (v == -1 && PyErr_Occurred()) {
            PyErr_Clear();
            overflow = 1;
        }
        if (overflow) {
            s->tag = KD_TAG_OTHER;
            s->value.type_name_id = kd_strtab_intern(kd_strings, "int (out of int64 range)", 24);
        } else {
            s->tag = KD_TAG_INT;
            s->value.i = v;
        }
    } else if (PyFloat_Check(o)) {
        s->tag = KD_TAG_FLOAT;
        s->value.f = PyFloat_AS_DOUBLE(o);
    } else {
        const char *tn = Py_TYPE(o)->tp_name;
        s->tag = KD_TAG_OTHER;
        s->value.type_name_id = kd_strtab_intern(kd_strings, tn, strlen(tn));
    }
    return 1;
}

/* The CUDA tensors one launch hashes before or after it runs: handed to the
 * deferred queue or launched as hash kernels of up to KD_CUDA_BATCH tensors
 * (Note [Hashing on the GPU]). */
#define KD_GPU_BATCH_MAX 128
typedef struct gpu_batch {
    kd_cuda_tensor t[KD_GPU_BATCH_MAX];
    PyObject *obj[KD_GPU_BATCH_MAX]; /* borrowed: the launch's arguments */
    uint64_t pos[KD_GPU_BATCH_MAX];  /* ring ticket of the hash record (relative to the launch before it is reserved) */
    int w[KD_GPU_BATCH_MAX];
    int device[KD_GPU_BATCH_MAX];
    int kinds[KD_GPU_BATCH_MAX];
    int n;
    uint64_t stream;
} gpu_batch;

/* Once both sides of a checked read-only argument's hash are known: whether
 * the launch changed its bytes (check_inputs_unchanged). */
static void note_readonly_change(kd_recorder *r, kd_hash_rec *h)
{
    if ((h->flags & KD_HF_CHECKED) && !(h->flags & (KD_HF_PENDING_PRE | KD_HF_PENDING_POST | KD_HF_CHANGED)) &&
        h->bitwise[0] != h->bitwise[1]) {
        h->flags |= KD_HF_CHANGED;
        r->readonly_changed++;
    }
}

/* Note [Unhashed values]: a hash kind the tensor's dtype cannot decode
 * (norm / hash_tensor / stats of float4_e2m1fn_x2).  The record is flagged and
 * counted, and no value is shown for those kinds (kdebug/calls.py gives
 * hashing.Unhashed); their fields get a random nonce (l1: a NaN) so that the
 * digests of two such records (kd_tr_hash_digest: diff, hunt) never match. */
static void mark_unsupported(kd_recorder *r, kd_hash_rec *h, int w, int kinds)
{
    static _Atomic uint64_t counter;
    uint64_t x = kd_now_ns() + atomic_fetch_add_explicit(&counter, 1, memory_order_relaxed) *
                                   0x9E3779B97F4A7C15ull;
    x ^= x >> 31, x *= 0xBF58476D1CE4E5B9ull, x ^= x >> 29; /* mixed: a nonce, not a count */
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
    h->bitwise[w] = kd_hash_finish(res->S, res->nbytes);
    h->l1[w] = res->l1;
    h->nan[w] = res->nan, h->posinf[w] = res->posinf, h->neginf[w] = res->neginf;
    if (h->kinds & KD_HK_STATS) /* Note [Room for the stats]: sum shares xor64's bytes */
        h->sum[w] = res->sum, h->absmax[w] = res->absmax;
    else
        h->xor64[w] = res->xor64;
    if (res->unsupported && (h->kinds & (KD_HK_NORM | KD_HK_XOR | KD_HK_STATS)))
        mark_unsupported(r, h, w, h->kinds & (KD_HK_NORM | KD_HK_XOR | KD_HK_STATS));
    h->flags &= (uint8_t)~pending;
    note_readonly_change(r, h);
}

/* Side w of the hash record at ring ticket `pos` waits for GPU result `index`
 * (index < 0: queuing failed, `error` says why). */
static void await_result(kd_recorder *r, uint64_t pos, int w, int device, int64_t index, const char *error)
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
    await_result(r, pos, w, device, index, error);
}

/* Hash kernels for the batch now, on its stream: one per run of up to
 * KD_CUDA_BATCH entries of one device and kind; entry i's hash record is at
 * ring ticket base + pos[i]. */
static void batch_flush(kd_recorder *r, gpu_batch *b, uint64_t base)
{
    int i = 0;
    while (i < b->n) {
        int j = i + 1;
        while (j < b->n && j - i < KD_CUDA_BATCH && b->device[j] == b->device[i] && b->kinds[j] == b->kinds[i])
            j++;
        int64_t first = kd_cuda_hash_enqueue(b->device[i], b->stream, b->kinds[i], &b->t[i], j - i);
        const char *err = first < 0 ? kd_cuda_last_error() : NULL;
        for (int k = i; k < j; k++)
            await_result(r, base + b->pos[k], b->w[k], b->device[k], first < 0 ? -1 : first + (k - i), err);
        i = j;
    }
    b->n = 0;
}

/* Hands a batch to the deferred queue (Note [Deferred GPU work]); what the
 * queue refuses is launched right away. */
static void batch_defer(kd_recorder *r, gpu_batch *b, uint64_t base)
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
    batch_flush(r, b, 0);
}

int kd_cuda_describe(const kd_tensor_meta *m, kd_cuda_tensor *t)
{
    int itemsize = kd_itemsize(m->dtype);
    if (m->device_type != KD_DEV_CUDA || m->ndim > KD_CUDA_MAX_DIMS || itemsize == 0 ||
        !kd_cuda_available())
        return 0;
    memset(t, 0, sizeof *t);
    t->data = m->data_ptr;
    t->scalar_type = m->dtype;
    t->itemsize = itemsize;
    t->ndim = m->ndim;
    t->numel = 1;
    t->contiguous = 1;
    int64_t expect = 1;
    for (int d = m->ndim - 1; d >= 0; d--) {
        t->sizes[d] = m->sizes[d];
        t->strides[d] = m->strides[d];
        t->numel *= m->sizes[d];
        if (m->sizes[d] != 1 && m->strides[d] != expect)
            t->contiguous = 0;
        expect *= m->sizes[d];
    }
    /* Fewer dimensions, same element order: drop size-1 dimensions and merge
     * a dimension into the next when they step through memory as one (the
     * GPU pays a division per dimension per element of a strided view). */
    if (!t->contiguous && t->numel > 0) {
        int n = 0;
        for (int d = 0; d < t->ndim; d++) {
            if (t->sizes[d] == 1)
                continue;
            if (n > 0 && t->strides[n - 1] == t->strides[d] * t->sizes[d]) {
                t->sizes[n - 1] *= t->sizes[d];
                t->strides[n - 1] = t->strides[d];
                continue;
            }
            t->sizes[n] = t->sizes[d];
            t->strides[n] = t->strides[d];
            n++;
        }
        for (int d = n; d < t->ndim; d++)
            t->sizes[d] = 0, t->strides[d] = 0;
        t->ndim = n;
    }
    return 1;
}

/* Queues a CUDA tensor's hashes; 0 if this build or view cannot (the caller
 * falls back to the slow path). */
static int batch_add(gpu_batch *b, const kd_tensor_meta *m, int kinds,
                     kd_hash_rec *h, int w, uint64_t stream, PyObject *obj, uint64_t pos)
{
    kd_cuda_tensor probe;
    if (b == NULL || !kd_cuda_describe(m, &probe))
        return 0;
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
static void hash_tensor(kd_recorder *r, PyObject *o, int kinds, kd_hash_rec *h, int w,
                        uint64_t launch_index, Py_ssize_t arg, gpu_batch *b, uint64_t stream,
                        uint64_t pos)
{
    kd_tensor_meta m;
    if (kd_shim_tensor_meta(o, &m) != 1)
        return;
    h->kinds |= (uint8_t)kinds;
    h->flags |= (uint8_t)(w ? KD_HF_POST : KD_HF_PRE);
    int std_kinds = kinds & (KD_HK_BITWISE | KD_HK_NORM | KD_HK_XOR | KD_HK_STATS);
    if (std_kinds && !m.math_bits && batch_add(b, &m, std_kinds, h, w, stream, o, pos)) {
        /* queued */
    } else if (m.device_type == KD_DEV_CPU && !m.math_bits) {
        kd_view v = {(const void *)(uintptr_t)m.data_ptr, m.dtype, kd_itemsize(m.dtype),
                     m.ndim, m.sizes, m.strides};
        int64_t numel = 1;
        for (int d = 0; d < m.ndim; d++)
            numel *= m.sizes[d];
        /* an empty tensor may have no storage: its hashes need none */
        if (v.itemsize == 0 || (m.data_ptr == 0 && numel > 0)) {
            h->flags &= (uint8_t)~(w ? KD_HF_POST : KD_HF_PRE); /* no value of any kind */
            h->flags |= KD_HF_UNSUPPORTED;
            r->hash_unsupported++;
        } else {
            if (kinds & KD_HK_BITWISE)
                h->bitwise[w] = kd_hash_bitwise(&v);
            if (kinds & KD_HK_STATS) { /* the norm's fields too, in one pass */
                kd_stats n;
                if (kd_hash_stats(&v, &n) == 0) {
                    h->l1[w] = n.norm.l1;
                    h->nan[w] = n.norm.nan, h->posinf[w] = n.norm.posinf, h->neginf[w] = n.norm.neginf;
                    h->sum[w] = n.sum, h->absmax[w] = n.absmax;
                } else {
                    mark_unsupported(r, h, w, KD_HK_STATS | (kinds & KD_HK_NORM));
                }
            } else if (kinds & KD_HK_NORM) {
                kd_norm n;
                if (kd_hash_norm(&v, &n) == 0) {
                    h->l1[w] = n.l1;
                    h->nan[w] = n.nan, h->posinf[w] = n.posinf, h->neginf[w] = n.neginf;
                } else {
                    mark_unsupported(r, h, w, KD_HK_NORM);
                }
            }
            if ((kinds & KD_HK_XOR) && kd_hash_xor64(&v, &h->xor64[w]) != 0)
                mark_unsupported(r, h, w, KD_HK_XOR);
        }
    } else if (std_kinds) {
        PyObject *res = kd_slow_hasher ? PyObject_CallFunction(kd_slow_hasher, "Oi", o, std_kinds) : NULL;
        unsigned long long v[9]; /* a HashValues (Note [HashValues] in kd_module.c) */
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
    if ((kinds & KD_HK_CUSTOM) && kd_custom_hasher != NULL) {
        PyObject *res = PyObject_CallFunction(kd_custom_hasher, "OKniO", (PyObject *)r,
                                              (unsigned long long)launch_index, arg, w, o);
        if (res == NULL)
            kd_recorder_error(r, "the custom hash_fn raised");
        Py_XDECREF(res);
    }
}

/* Before a CUDA launch runs: flush deferred work it would overwrite. */
static void guard_writes(uint8_t dev_type, PyObject *const *args, Py_ssize_t nargs,
                         const kd_kernel_info *info, uint64_t stream)
{
    if (dev_type != KD_DEV_CUDA || !kd_defer_enabled())
        return;
    for (Py_ssize_t i = 0; i < nargs; i++) {
        uint8_t role = (uint32_t)i < info->nnames ? info->roles[i] : KD_ROLE_READ;
        if (role & KD_ROLE_WRITE)
            kd_defer_guard_tensor(args[i], stream);
    }
}

static int read_call_depth(PyObject *mode)
{
    static PyObject *name = NULL;
    if (mode == NULL)
        return 1;
    if (name == NULL) {
        name = PyUnicode_InternFromString("call_depth");
        if (name == NULL) {
            PyErr_Clear();
            return 1;
        }
    }
    PyObject *v = PyObject_GetAttr(mode, name);
    if (v == NULL) {
        PyErr_Clear();
        return 1;
    }
    long d = PyLong_AsLong(v);
    Py_DECREF(v);
    if (d == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return 1;
    }
    return d < 0 ? 1 : (int)d + 1;
}

/* Describes the launch into this thread's build buffer (Python hashers may
 * run: Note [Per-thread launch context]), then reserves and copies it into the
 * ring.  Returns with p->ok = 0 when nothing was reserved. */
static void launch_begin(kd_recorder *r, kd_launch_ctx *ctx, kd_kernel_info *info,
                         PyObject *const *args, Py_ssize_t nargs, uint64_t stream, kd_pending *p)
{
    int hashing = p->cfg.kinds != 0 || p->cfg.check_readonly;
    kd_payload *b = ctx->build;
    uint32_t used = 1;
    const char *why = NULL;
    int first_tensor_seen = 0;
    uint8_t dev_type = info->device_type;
    int8_t dev_index = info->device_index;
    if (nargs > UINT16_MAX)
        nargs = 0, why = "launch has more than 65535 arguments";
    if (kd_injected_faults > 0) {
        kd_injected_faults--;
        nargs = 0, why = "injected fault (kdebug._C._inject_hook_faults)";
    }
    p->launch_index = r->next_launch_index++;
    p->stream = stream;
    gpu_batch batch;
    batch.n = 0;
    /* Note [Deferred GPU work]: pre-launch hashes of what the launch only reads
     * may wait; under check_inputs_unchanged they run before it. */
    const int defer = kd_defer_enabled() && !p->cfg.check_readonly;
    if (kd_defer_enabled() && dev_type == KD_DEV_CUDA)
        kd_defer_guard(dev_index, stream, 0, 0); /* another stream: flush and order */
    for (Py_ssize_t i = 0; i < nargs; i++) {
        uint32_t name_id = (uint32_t)i < info->nnames ? info->name_ids[i] : 0;
        uint8_t role = (uint32_t)i < info->nnames ? info->roles[i] : KD_ROLE_READ;
        kd_payload *a = &b[used];
        uint32_t k = describe_arg(args[i], name_id, role, hashing, a, KD_BUILD_SLOTS - used, &why);
        if (k == 0)
            break;
        if (a->tag == KD_TAG_TENSOR) {
            if (!first_tensor_seen) {
                first_tensor_seen = 1;
                dev_type = a->tensor.device_type;
                dev_index = a->tensor.device_index;
            }
            kd_hash_rec *h = kd_arg_hash(a);
            if (h != NULL) {
                h->spec = (uint16_t)p->cfg.spec;
                /* before the launch: what the kernel reads (Note [Which arguments are hashed]) */
                int kinds = (role & KD_ROLE_READ) && p->cfg.hash_inputs ? p->cfg.kinds : 0;
                if (p->cfg.check_readonly && role == KD_ROLE_READ)
                    kinds |= KD_HK_BITWISE;
                if (kinds)
                    hash_tensor(r, args[i], kinds, h, 0, p->launch_index, i, &batch, stream,
                                (uint64_t)((kd_payload *)h - b));
            }
        }
        used += k;
    }
    if (why != NULL) { /* nothing recorded: its hashes are not queued */
        char msg[200];
        snprintf(msg, sizeof msg, "could not describe an argument of %s: %s",
                 kd_strtab_get(kd_strings, info->name_id, NULL), why);
        kd_recorder_error(r, msg);
        r->unrecorded++;
        guard_writes(dev_type, args, nargs, info, stream);
        return;
    }
    kd_launch *h = &b[0].launch;
    memset(b, 0, sizeof(kd_payload));
    h->tag = KD_TAG_LAUNCH;
    h->kind = info->kind;
    h->device_type = dev_type;
    h->device_index = dev_index;
    h->nargs = (uint16_t)nargs;
    h->nslots = (uint16_t)(used - 1);
    h->name_id = info->name_id;
    h->stream = stream;
    h->thread_id = (uint64_t)PyThread_get_thread_ident();
    /* aten ops recorded before it: not len(ops), which grows when a drain on
     * another thread merges kernel records in (Note [Launch order]) */
    Py_ssize_t nops = (r->ops != NULL && PyList_Check(r->ops)) ? PyList_GET_SIZE(r->ops) - r->merged : 0;
    h->py_index = nops > 0 ? (uint64_t)nops : 0;
    int depth = read_call_depth(r->mode);
    h->call_depth = (uint16_t)(depth > UINT16_MAX ? UINT16_MAX : depth);
    h->launch_index = p->launch_index;

    /* From reserve to the end of the batch: no Python code runs. */
    if (kd_ring_reserve(r->ring, used, &p->first) != 0) {
        guard_writes(dev_type, args, nargs, info, stream);
        return; /* refused: counted by the ring */
    }
    uint32_t nreleased = 0;
    for (uint32_t i = 0; i < used; i++) {
        uint64_t t = p->first + i;
        memcpy(kd_ring_payload(r->ring, t), &b[i], sizeof(kd_payload));
        if (r->ring_objs != NULL) {
            PyObject **slot = &r->ring_objs[t & r->ring->mask];
            if (*slot != NULL)
                ctx->released[nreleased++] = *slot; /* a lapped launch's: dropped below */
            *slot = NULL;
        }
    }
    if (r->ring_objs != NULL) {
        /* keep the argument objects themselves (store_original_args) */
        uint32_t off = 1;
        for (Py_ssize_t i = 0; i < nargs; i++) {
            r->ring_objs[(p->first + off) & r->ring->mask] = Py_NewRef(args[i]);
            off += kd_arg_payloads(&b[off]);
        }
    }
    if (batch.n && defer)
        batch_defer(r, &batch, p->first);
    else if (batch.n)
        batch_flush(r, &batch, p->first); /* before the kernel, on its stream */
    p->n = used;
    p->ok = 1;
    for (uint32_t i = 0; i < nreleased; i++)
        Py_DECREF(ctx->released[i]);
    guard_writes(dev_type, args, nargs, info, stream);
    uint64_t head = atomic_load_explicit(&r->ring->head, memory_order_relaxed);
    if (head - p->first <= r->ring->capacity) /* not lapped while Python ran above */
        kd_ring_payload(r->ring, p->first)->launch.t_start_ns = kd_now_ns();
}

void kd_launch_begin(kd_recorder *r, kd_kernel_info *info, PyObject *const *args,
                     Py_ssize_t nargs, uint64_t stream, kd_pending *p)
{
    p->ok = 0;
    p->cfg = launch_hcfg(r);
    kd_launch_ctx *ctx = launch_ctx();
    if (ctx == NULL) {
        kd_recorder_error(r, "out of memory for this thread's launch buffer");
        r->unrecorded++;
        guard_writes(info->device_type, args, nargs, info, stream);
        return;
    }
    if (ctx->busy) { /* launched from inside kdebug's own hashing (Note [Per-thread launch context]) */
        r->suppressed++;
        return;
    }
    ctx->busy = 1;
    launch_begin(r, ctx, info, args, nargs, stream, p);
    ctx->busy = 0;
}

/* After the launch, on rec, this thread's copy of the launch's record (rec[0]
 * its header): hashes of what the kernel wrote, the read-only check's second
 * hash, and clones of the outputs (record_outputs).  CUDA hashes go to batch
 * with their ring tickets; nothing here writes the ring. */
static void after_launch(kd_recorder *r, kd_pending *p, PyObject *const *args, Py_ssize_t nargs,
                         kd_payload *rec, gpu_batch *batch)
{
    const kd_hash_config *cfg = &p->cfg;
    PyObject *outs = NULL;
    uint32_t off = 1;
    for (Py_ssize_t i = 0; i < nargs && off <= p->n - 1; i++) {
        kd_payload *a = &rec[off];
        if (a->tag != KD_TAG_TENSOR) {
            off += 1;
            continue;
        }
        uint8_t role = a->tensor.role;
        uint32_t np = kd_tensor_payloads(a->tensor.ndim);
        if ((a->tensor.flags & KD_TF_HASHED) && off + np < p->n) {
            kd_hash_rec *h = &rec[off + np].hash;
            int kinds = (role & KD_ROLE_WRITE) ? cfg->kinds : 0;
            int check = cfg->check_readonly && role == KD_ROLE_READ && (h->flags & KD_HF_PRE);
            if (check)
                kinds |= KD_HK_BITWISE;
            if (kinds)
                hash_tensor(r, args[i], kinds, h, 1, p->launch_index, i, batch, p->stream,
                            p->first + off + np);
            if (check)
                h->flags |= KD_HF_CHECKED; /* compared once merged and the batch is queued */
            np += 1;
        }
        if (cfg->record_outputs && (role & KD_ROLE_WRITE)) {
            kd_tensor_meta m;
            memset(&m, 0, sizeof m);
            m.device_type = -1;
            uint64_t nbytes = 0;
            if (kd_shim_tensor_meta(args[i], &m) == 1) {
                nbytes = (uint64_t)kd_itemsize(m.dtype);
                for (int d = 0; d < m.ndim; d++)
                    nbytes *= (uint64_t)m.sizes[d];
            }
            if (r->output_bytes + nbytes > cfg->output_budget) {
                r->outputs_skipped++;
            } else {
                PyObject *c = kd_defer_clone(args[i], &m, p->stream);
                if (c == NULL) {
                    char msg[200];
                    snprintf(msg, sizeof msg, "record_outputs could not clone an output: %s",
                             kd_shim_last_error());
                    kd_recorder_error(r, msg);
                } else {
                    if (outs == NULL)
                        outs = PyDict_New();
                    PyObject *name = PyUnicode_FromString(
                        kd_strtab_get(kd_strings, a->tensor.name_id, NULL));
                    if (outs == NULL || name == NULL || PyDict_SetItem(outs, name, c) != 0)
                        kd_recorder_error(r, "keeping a recorded output");
                    else
                        r->output_bytes += nbytes;
                    Py_XDECREF(name);
                    Py_DECREF(c);
                }
            }
        }
        off += np;
    }
    if (outs != NULL) {
        PyObject *key = PyLong_FromUnsignedLongLong(p->launch_index);
        if (r->outputs == NULL)
            r->outputs = PyDict_New();
        if (key == NULL || r->outputs == NULL || PyDict_SetItem(r->outputs, key, outs) != 0)
            kd_recorder_error(r, "keeping recorded outputs");
        Py_XDECREF(key);
        Py_DECREF(outs);
    }
}

/* Copies the post-launch side of src (this thread's copy) into dst, the same
 * argument's hash record in the ring: every field hash_tensor fills for side
 * 1.  The pre-launch side stays the ring's: a GPU result may have landed there
 * meanwhile (rec_deliver). */
static void merge_post(kd_hash_rec *dst, const kd_hash_rec *src)
{
    dst->kinds |= src->kinds;
    dst->flags |= (uint8_t)(src->flags & (KD_HF_POST | KD_HF_UNSUPPORTED | KD_HF_CHECKED));
    dst->bitwise[1] = src->bitwise[1];
    dst->l1[1] = src->l1[1];
    dst->nan[1] = src->nan[1];
    dst->posinf[1] = src->posinf[1];
    dst->neginf[1] = src->neginf[1];
    dst->xor64[1] = src->xor64[1]; /* sum[1] too: they share bytes (Note [Room for the stats]) */
    dst->absmax[1] = src->absmax[1];
}

/* Merges rec (after_launch's copy of the launch at ring ticket `first`, n
 * slots) into the ring, queues its CUDA hashes and does the read-only check.
 * Runs no Python code; the ring must not have lapped the launch. */
static void publish_post(kd_recorder *r, kd_pending *p, const kd_payload *rec, gpu_batch *batch)
{
    uint32_t off = 1;
    while (off < p->n) {
        const kd_payload *a = &rec[off];
        uint32_t np = kd_arg_payloads(a);
        if (a->tag == KD_TAG_TENSOR && (a->tensor.flags & KD_TF_HASHED) && np >= 1 && off + np - 1 < p->n)
            merge_post(&kd_ring_payload(r->ring, p->first + off + np - 1)->hash, &rec[off + np - 1].hash);
        off += np ? np : 1;
    }
    if (kd_defer_enabled())
        batch_defer(r, batch, 0);
    else
        batch_flush(r, batch, 0); /* after the kernel, on its stream */
    if (p->cfg.check_readonly) {
        /* values still on the GPU are compared when they arrive (rec_deliver) */
        off = 1;
        while (off < p->n) {
            kd_payload *a = kd_ring_payload(r->ring, p->first + off);
            uint32_t np = kd_arg_payloads(a);
            if (a->tag == KD_TAG_TENSOR && (a->tensor.flags & KD_TF_HASHED))
                note_readonly_change(r, &kd_ring_payload(r->ring, p->first + off + np - 1)->hash);
            off += np ? np : 1;
        }
    }
}

void kd_launch_end(kd_recorder *r, kd_pending *p, PyObject *const *args, Py_ssize_t nargs,
                   int raised)
{
    if (!p->ok)
        return;
    kd_launch_ctx *ctx = tls_ctx; /* kd_launch_begin made it on this thread */
    ctx->busy = 1;
    gpu_batch batch;
    batch.n = 0;
    int post = !raised && (p->cfg.kinds || p->cfg.check_readonly || p->cfg.record_outputs);
    if (post) {
        /* Python hashers run here: on a copy (Note [Per-thread launch context]) */
        for (uint32_t i = 0; i < p->n; i++)
            memcpy(&ctx->build[i], kd_ring_payload(r->ring, p->first + i), sizeof(kd_payload));
        PyObject *et, *ev, *etb;
        PyErr_Fetch(&et, &ev, &etb);
        after_launch(r, p, args, nargs, ctx->build, &batch);
        PyErr_Restore(et, ev, etb);
    }
    /* From here to the commit: no Python code runs.  A writer that lapped the
     * ring owns these slots now; commit counts the launch as lost, so only
     * touch them when not lapped (its CUDA hashes are then never queued). */
    uint64_t head = atomic_load_explicit(&r->ring->head, memory_order_relaxed);
    if (head - p->first <= r->ring->capacity) {
        kd_launch *h = &kd_ring_payload(r->ring, p->first)->launch;
        h->t_end_ns = kd_now_ns();
        if (kd_tls_capture.have_grid) {
            h->grid[0] = kd_tls_capture.grid[0];
            h->grid[1] = kd_tls_capture.grid[1];
            h->grid[2] = kd_tls_capture.grid[2];
            h->flags |= KD_LF_GRID;
        }
        if (kd_tls_capture.have_config) {
            h->config_id = kd_tls_capture.config_id;
            h->num_warps = kd_tls_capture.num_warps;
            h->num_stages = kd_tls_capture.num_stages;
            h->shared_mem = kd_tls_capture.shared_mem;
            h->flags |= KD_LF_CONFIG;
        }
        if (raised)
            h->flags |= KD_LF_RAISED;
        if (post)
            publish_post(r, p, ctx->build, &batch);
    }
    kd_ring_commit(r->ring, p->first, p->n);
    ctx->busy = 0;
}

/* ---- draining ---- */

static int grow_store_objs(kd_recorder *r, uint64_t need)
{
    if (need <= r->store_objs_cap)
        return 0;
    uint64_t cap = r->store_objs_cap ? r->store_objs_cap : 1024;
    while (cap < need)
        cap *= 2;
    PyObject **p = PyMem_Realloc(r->store_objs, cap * sizeof(PyObject *));
    if (p == NULL)
        return -1;
    memset(p + r->store_objs_cap, 0, (cap - r->store_objs_cap) * sizeof(PyObject *));
    r->store_objs = p;
    r->store_objs_cap = cap;
    return 0;
}

static int visit_drain(void *ctx, uint64_t first, const kd_payload *p, uint32_t n)
{
    kd_recorder *r = ctx;
    uint64_t base = r->store.npayloads;
    if ((r->ring_objs != NULL && grow_store_objs(r, base + n) != 0) ||
        kd_store_append(&r->store, p, n) != 0) {
        r->drain_failures++;
        return 0;
    }
    if (r->ring_objs != NULL) {
        for (uint32_t i = 0; i < n; i++) {
            PyObject **slot = &r->ring_objs[(first + i) & r->ring->mask];
            r->store_objs[base + i] = *slot; /* ownership moves to the store */
            *slot = NULL;
        }
    }
    return 0;
}

/* Queued GPU hashes of this recorder: launched, and with collect, their
 * results in its records (one device synchronization when any is in flight). */
static void flush_hashes(kd_recorder *r, int collect)
{
    kd_defer_flush();
    if (collect && r->anchor != NULL && r->anchor->refs > 0 && kd_cuda_hash_collect() != 0) {
        char msg[300];
        snprintf(msg, sizeof msg, "reading GPU hashes: %s", kd_cuda_last_error());
        kd_recorder_error(r, msg);
    }
}

uint64_t kd_recorder_drain(kd_recorder *r)
{
    flush_hashes(r, 1); /* results land in the ring: before it is read */
    kd_ring_read(r->ring, r->drain_scratch, r->drain_cap, visit_drain, r);
    return r->store.nlaunches;
}

/* ------------------------------------------------------------------ */
/* The Recorder Python type                                            */

/* One spare KD_BUILD_SLOTS drain buffer, from the last Recorder freed (under
 * the GIL).  Its contents need no clearing: every payload is written before
 * it is read. */
static kd_payload *spare_scratch;

static kd_payload *take_spare(kd_payload **spare)
{
    kd_payload *b = *spare;
    *spare = NULL;
    return b != NULL ? b : PyMem_Calloc(KD_BUILD_SLOTS, sizeof(kd_payload));
}

static void give_spare(kd_payload **spare, kd_payload *b)
{
    if (*spare == NULL)
        *spare = b;
    else
        PyMem_Free(b);
}

static PyObject *rec_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    unsigned long long capacity = 1ull << 20;
    const char *overflow = "overwrite";
    int store_objects = 0;
    static char *kwlist[] = {"capacity", "overflow", "store_objects", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|Ksp", kwlist, &capacity, &overflow,
                                     &store_objects))
        return NULL;
    int policy;
    if (strcmp(overflow, "overwrite") == 0)
        policy = KD_RING_OVERWRITE;
    else if (strcmp(overflow, "drop_new") == 0)
        policy = KD_RING_DROP_NEW;
    else {
        PyErr_Format(PyExc_ValueError,
                     "overflow must be 'overwrite' (keep the newest launches) or "
                     "'drop_new' (keep the oldest), not '%s'", overflow);
        return NULL;
    }
    if (capacity < 16 || capacity > (1ull << 32)) {
        PyErr_Format(PyExc_ValueError,
                     "ring capacity must be between 16 and 2**32 slots (128 bytes each), got %llu",
                     capacity);
        return NULL;
    }
    kd_recorder *self = (kd_recorder *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    kd_store_init(&self->store);
    /* A DebugMode per step makes a Recorder per step: the ring and scratch
     * buffers of the last one are taken over instead of allocated again. */
    self->ring = kd_ring_reuse(capacity, policy);
    self->drain_cap = KD_BUILD_SLOTS;
    self->drain_scratch = take_spare(&spare_scratch);
    self->store_objects = store_objects;
    self->anchor = kd_result_anchor_new(self);
    if (self->ring && store_objects)
        self->ring_objs = PyMem_Calloc(self->ring->capacity, sizeof(PyObject *));
    if (self->ring == NULL || self->drain_scratch == NULL || self->anchor == NULL ||
        (store_objects && self->ring_objs == NULL)) {
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    return (PyObject *)self;
}

static void drop_objects(kd_recorder *self)
{
    if (self->ring_objs != NULL)
        for (uint64_t i = 0; i < self->ring->capacity; i++)
            Py_CLEAR(self->ring_objs[i]);
    if (self->store_objs != NULL)
        for (uint64_t i = 0; i < self->store_objs_cap; i++)
            Py_CLEAR(self->store_objs[i]);
}

static int rec_clear_refs(kd_recorder *self)
{
    drop_objects(self);
    Py_CLEAR(self->ops);
    Py_CLEAR(self->mode);
    Py_CLEAR(self->prev_tls_obj);
    Py_CLEAR(self->outputs);
    Py_CLEAR(self->custom);
    return 0;
}

static int rec_traverse(kd_recorder *self, visitproc visit, void *arg)
{
    Py_VISIT(self->ops);
    Py_VISIT(self->mode);
    Py_VISIT(self->outputs);
    Py_VISIT(self->custom);
    if (self->ring_objs != NULL)
        for (uint64_t i = 0; i < self->ring->capacity; i++)
            Py_VISIT(self->ring_objs[i]);
    if (self->store_objs != NULL)
        for (uint64_t i = 0; i < self->store_objs_cap; i++)
            Py_VISIT(self->store_objs[i]);
    return 0;
}

static void rec_dealloc(kd_recorder *self)
{
    PyObject_GC_UnTrack(self);
    rec_clear_refs(self);
    kd_result_anchor_drop(self->anchor); /* results still to come find no recorder */
    kd_ring_release(self->ring);
    kd_store_free(&self->store);
    PyMem_Free(self->ring_objs);
    PyMem_Free(self->store_objs);
    give_spare(&spare_scratch, self->drain_scratch);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* start(mode, ops, all_threads=False): launches on this thread (or, with
 * all_threads, on every thread with no recorder of its own) go to this one. */
static PyObject *rec_start(kd_recorder *self, PyObject *args, PyObject *kw)
{
    PyObject *mode = Py_None, *ops = Py_None;
    int all_threads = 0;
    static char *kwlist[] = {"mode", "ops", "all_threads", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|OOp", kwlist, &mode, &ops, &all_threads))
        return NULL;
    if (self->started) {
        PyErr_SetString(PyExc_RuntimeError,
                        "this kdebug recorder is already recording; a DebugMode can be "
                        "entered only once at a time");
        return NULL;
    }
    if (all_threads && kd_global_recorder != NULL) {
        PyErr_SetString(PyExc_RuntimeError,
                        "another DebugMode(record_all_threads=True) is already recording "
                        "every thread; exit it first");
        return NULL;
    }
    Py_XSETREF(self->mode, mode == Py_None ? NULL : Py_NewRef(mode));
    Py_XSETREF(self->ops, ops == Py_None ? NULL : Py_NewRef(ops));
    self->merged = 0; /* mode.py splices the list's own count in before anything launches */
    self->all_threads = all_threads;
    if (all_threads) {
        kd_global_recorder = self;
    } else {
        PyObject *prev = kd_shim_tls_recorder_get();
        if (kd_shim_tls_recorder_set((PyObject *)self) != 0) {
            PyErr_Format(PyExc_RuntimeError, "kdebug could not publish its recorder to torch's "
                         "thread-local state: %s", kd_shim_last_error());
            return NULL;
        }
        Py_XSETREF(self->prev_tls_obj, Py_XNewRef(prev));
        self->prev = kd_tls_recorder;
        kd_tls_recorder = self;
    }
    self->owner_thread = PyThread_get_thread_ident();
    self->owner_hcfg = kd_hcfg;
    self->started = 1;
    kd_started_recorders++;
    Py_INCREF(self); /* the thread-local / global pointer owns one reference */
    Py_RETURN_NONE;
}

static PyObject *rec_stop(kd_recorder *self, PyObject *unused)
{
    (void)unused;
    if (!self->started)
        Py_RETURN_NONE;
    kd_defer_flush(); /* nothing of this recording waits past its end */
    if (self->all_threads) {
        if (kd_global_recorder == self)
            kd_global_recorder = NULL;
    } else {
        if (kd_tls_recorder != self) {
            PyErr_SetString(PyExc_RuntimeError,
                            "a kdebug DebugMode must be exited on the thread that entered it, "
                            "innermost first");
            return NULL;
        }
        kd_tls_recorder = self->prev;
        self->prev = NULL;
        PyObject *prev = self->prev_tls_obj;
        self->prev_tls_obj = NULL;
        kd_shim_tls_recorder_set(prev); /* NULL erases */
        Py_XDECREF(prev);
    }
    self->started = 0;
    kd_started_recorders--;
    Py_CLEAR(self->ops);
    Py_CLEAR(self->mode);
    Py_DECREF(self);
    Py_RETURN_NONE;
}

static PyObject *rec_drain(kd_recorder *self, PyObject *unused)
{
    (void)unused;
    return PyLong_FromUnsignedLongLong(kd_recorder_drain(self));
}

/* splice(ops, items, merged): ops[:] = items and the count of kernel records
 * among them, in one step under the GIL (Note [Launch order] in mode.py). */
static PyObject *rec_splice(kd_recorder *self, PyObject *args)
{
    PyObject *ops, *items;
    Py_ssize_t merged;
    if (!PyArg_ParseTuple(args, "O!O!n", &PyList_Type, &ops, &PyList_Type, &items, &merged))
        return NULL;
    if (PyList_SetSlice(ops, 0, PY_SSIZE_T_MAX, items) < 0)
        return NULL;
    if (ops == self->ops)
        self->merged = merged;
    Py_RETURN_NONE;
}

/* set_ops(ops): while started, launches count aten ops in this list from now
 * on (dm.operators = [] while recording; none of it is kernel records). */
static PyObject *rec_set_ops(kd_recorder *self, PyObject *ops)
{
    if (!PyList_Check(ops)) {
        PyErr_SetString(PyExc_TypeError, "set_ops takes a list");
        return NULL;
    }
    if (self->started) {
        Py_XSETREF(self->ops, Py_NewRef(ops));
        self->merged = 0;
    }
    Py_RETURN_NONE;
}

static PyObject *rec_clear(kd_recorder *self, PyObject *unused)
{
    (void)unused;
    flush_hashes(self, 0); /* what is still to come lands nowhere: the ring is cleared */
    kd_launch_views_detach(self); /* kept views keep their records */
    self->generation++;
    drop_objects(self);
    kd_store_clear(&self->store);
    kd_ring_clear(self->ring);
    self->errors = self->unrecorded = self->suppressed = self->drain_failures = 0;
    self->hash_unsupported = self->readonly_changed = self->output_bytes = self->outputs_skipped = 0;
    Py_CLEAR(self->outputs);
    Py_CLEAR(self->custom);
    self->nmessages = 0;
    self->next_launch_index = 0;
    Py_RETURN_NONE;
}

static Py_ssize_t rec_len(kd_recorder *self) { return (Py_ssize_t)self->store.nlaunches; }

static PyObject *rec_launch(kd_recorder *self, PyObject *arg)
{
    Py_ssize_t i = PyNumber_AsSsize_t(arg, PyExc_IndexError);
    if (i == -1 && PyErr_Occurred())
        return NULL;
    if (i < 0)
        i += (Py_ssize_t)self->store.nlaunches;
    if (i < 0 || (uint64_t)i >= self->store.nlaunches) {
        PyErr_SetString(PyExc_IndexError, "launch index out of range");
        return NULL;
    }
    return kd_launch_view_new(self, (uint64_t)i);
}

static PyObject *rec_stats(kd_recorder *self, PyObject *unused)
{
    (void)unused;
    kd_ring *g = self->ring;
    PyObject *d = Py_BuildValue(
        "{sKsKsKsKsKsKsKsKsKsKss}", "launches",
        (unsigned long long)atomic_load(&g->committed), "stored",
        (unsigned long long)self->store.nlaunches, "dropped",
        (unsigned long long)(kd_ring_lost(g) + self->drain_failures), "refused",
        (unsigned long long)atomic_load(&g->refused), "errors",
        (unsigned long long)self->errors, "unrecorded", (unsigned long long)self->unrecorded,
        "suppressed", (unsigned long long)self->suppressed, "capacity",
        (unsigned long long)g->capacity, "slots_used",
        (unsigned long long)(atomic_load(&g->head) - atomic_load(&g->tail)), "store_bytes",
        (unsigned long long)(self->store.payload_cap * sizeof(kd_payload)), "overflow",
        g->policy == KD_RING_DROP_NEW ? "drop_new" : "overwrite");
    if (d == NULL)
        return NULL;
    PyObject *more = Py_BuildValue("{sKsKsKsKsKsKsK}", "seen", (unsigned long long)self->next_launch_index,
                                   "gpu_syncs",
                                   (unsigned long long)kd_cuda_syncs(), "gpu_hashes_in_flight",
                                   (unsigned long long)kd_cuda_hash_outstanding(), "hash_unsupported",
                                   (unsigned long long)self->hash_unsupported, "readonly_changed",
                                   (unsigned long long)self->readonly_changed, "output_bytes",
                                   (unsigned long long)self->output_bytes, "outputs_skipped",
                                   (unsigned long long)self->outputs_skipped);
    if (more == NULL || PyDict_Update(d, more) != 0) {
        Py_XDECREF(more);
        Py_DECREF(d);
        return NULL;
    }
    Py_DECREF(more);
    return d;
}

static PyObject *rec_messages(kd_recorder *self, PyObject *unused)
{
    (void)unused;
    PyObject *l = PyList_New(self->nmessages);
    for (int i = 0; l && i < self->nmessages; i++) {
        PyObject *s = PyUnicode_DecodeUTF8(self->messages[i], (Py_ssize_t)strlen(self->messages[i]),
                                           "replace");
        if (s == NULL) {
            Py_CLEAR(l);
            break;
        }
        PyList_SET_ITEM(l, i, s);
    }
    return l;
}

static PyObject *rec_is_recording(kd_recorder *self, PyObject *unused)
{
    (void)unused;
    return PyBool_FromLong(self->started);
}

/* Python launches go through the same path as hooked ones (used by tests and
 * by code that wants to log its own kernels): record(info, args, stream=0). */
static PyObject *rec_record(kd_recorder *self, PyObject *args, PyObject *kw)
{
    PyObject *info, *argv;
    unsigned long long stream = 0;
    static char *kwlist[] = {"info", "args", "stream", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O!O!|K", kwlist, &kd_KernelInfoType, &info,
                                     &PyTuple_Type, &argv, &stream))
        return NULL;
    kd_pending p;
    kd_launch_begin(self, (kd_kernel_info *)info, &PyTuple_GET_ITEM(argv, 0),
                    PyTuple_GET_SIZE(argv), stream, &p);
    kd_launch_end(self, &p, &PyTuple_GET_ITEM(argv, 0), PyTuple_GET_SIZE(argv), 0);
    return PyBool_FromLong(p.ok);
}

static PyObject *rec_get_outputs(kd_recorder *self, void *c)
{
    (void)c;
    if (self->outputs == NULL && (self->outputs = PyDict_New()) == NULL)
        return NULL;
    return Py_NewRef(self->outputs);
}

static PyObject *rec_get_custom(kd_recorder *self, void *c)
{
    (void)c;
    if (self->custom == NULL && (self->custom = PyDict_New()) == NULL)
        return NULL;
    return Py_NewRef(self->custom);
}

static PyObject *rec_get_owner_thread(kd_recorder *self, void *c)
{
    (void)c;
    return PyLong_FromUnsignedLong(self->owner_thread);
}

static PyGetSetDef rec_getset[] = {
    {"owner_thread", (getter)rec_get_owner_thread, NULL,
     "threading.get_ident() of the thread that last started it", NULL},
    {"outputs", (getter)rec_get_outputs, NULL,
     "{launch_index: {arg name: clone}} recorded by record_outputs()", NULL},
    {"custom", (getter)rec_get_custom, NULL,
     "{(launch_index, arg index, 0 pre / 1 post): value} from a custom hash_fn", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef rec_methods[] = {
    {"start", (PyCFunction)(void (*)(void))rec_start, METH_VARARGS | METH_KEYWORDS,
     "start(mode=None, ops=None, all_threads=False): record launches from now on."},
    {"stop", (PyCFunction)rec_stop, METH_NOARGS, "Stop recording."},
    {"drain", (PyCFunction)rec_drain, METH_NOARGS,
     "Move complete launches from the ring to the store, with their GPU hashes (collected first: one "
     "device synchronization when any is in flight); returns the stored count."},
    {"clear", (PyCFunction)rec_clear, METH_NOARGS, "Forget every launch and counter."},
    {"set_ops", (PyCFunction)rec_set_ops, METH_O,
     "set_ops(ops): while recording, the operators list that launches are placed in."},
    {"splice", (PyCFunction)rec_splice, METH_VARARGS,
     "splice(ops, items, merged): ops[:] = items, with `merged` kernel records among them."},
    {"launch", (PyCFunction)rec_launch, METH_O, "launch(i): view of stored launch i."},
    {"stats", (PyCFunction)rec_stats, METH_NOARGS, "Counters: launches, dropped, errors, ..."},
    {"messages", (PyCFunction)rec_messages, METH_NOARGS,
     "The first error messages from inside the hook."},
    {"is_recording", (PyCFunction)rec_is_recording, METH_NOARGS, "Whether started."},
    {"record", (PyCFunction)(void (*)(void))rec_record, METH_VARARGS | METH_KEYWORDS,
     "record(info, args, stream=0): record one launch by hand."},
    {NULL, NULL, 0, NULL},
};

static PySequenceMethods rec_as_sequence = {.sq_length = (lenfunc)rec_len};

PyTypeObject kd_RecorderType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kdebug._C.Recorder",
    .tp_basicsize = sizeof(kd_recorder),
    .tp_dealloc = (destructor)rec_dealloc,
    .tp_as_sequence = &rec_as_sequence,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "Recorder(capacity=2**20, overflow='overwrite', store_objects=False): a ring "
              "of launch records and the launches drained from it.",
    .tp_traverse = (traverseproc)rec_traverse,
    .tp_clear = (inquiry)rec_clear_refs,
    .tp_methods = rec_methods,
    .tp_getset = rec_getset,
    .tp_new = rec_new,
};
