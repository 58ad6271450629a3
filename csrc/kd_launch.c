/* kd_launch.c - the launch hot path: which recorder a launch goes to, this
 * thread's launch context (Note [Per-thread launch context]), and writing a
 * launch into the ring before the kernel runs (kd_launch_begin) and after it
 * (kd_launch_end).  The thread's launch context: kd_launch_ctx.c.  Hashing the launch's tensors: kd_launch_hash.c. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kd_args.h"
#include "kd_clock.h"
#include "kd_defer.h"
#include "kd_hash.h"
#include "kd_launch_hash.h"
#include "kd_hook.h"
#include "kd_launch.h"
#include "kd_phase_timers.h"
#include "kd_graph.h"
#include "kd_launch_ctx.h"
#include "kd_module.h"
#include "kd_recorder.h"
#include "kd_shim.h"

_Thread_local kd_recorder *kd_tls_recorder = NULL;
kd_recorder *kd_global_recorder = NULL; /* GIL */
long kd_started_recorders = 0;           /* GIL */
_Thread_local int kd_tls_compiling = 0;
_Thread_local int kd_tls_hash_now = 0;
long kd_injected_faults = 0; /* GIL; tests: make the next N launch descriptions fail */

int kd_launch_device_of(PyObject *o, kd_kernel_info *info, uint64_t *stream)
{
    kd_tensor_meta m;
    if (kd_shim_tensor_meta(o, &m) != 1)
        return 0;
    info->device_type = (uint8_t)m.device_type;
    info->device_index = (int8_t)m.device_index;
    *stream = m.device_type == KD_DEV_CUDA ? kd_shim_current_stream(m.device_type, m.device_index) : 0;
    return 1;
}

uint64_t kd_now_ns(void) { return kd_clock_ns(); } /* Note [Launch timestamps from the TSC] */

/* A launch's end, never before its start (a new clock anchor between the two
 * may step back by the old anchor's error: Note [Launch timestamps from the TSC]). */
static uint64_t end_ns(const kd_launch *h)
{
    uint64_t now = kd_now_ns();
    return now > h->t_start_ns ? now : h->t_start_ns;
}

kd_recorder *kd_recorder_here(void)
{
    if (kd_tls_recorder != NULL || kd_started_recorders <= 0)
        return kd_tls_recorder;
    /* A thread torch started for us (autograd's device threads run the
     * backward on CUDA) carries the entering thread's recorder in
     * at::ThreadLocalState. */
    PyObject *o = kd_shim_tls_recorder_get();
    if (o != NULL && Py_TYPE(o) == &kd_RecorderType && ((kd_recorder *)o)->started)
        return (kd_recorder *)o;
    return kd_global_recorder;
}

kd_recorder *kd_active_recorder(void)
{
    kd_recorder *r = kd_recorder_here();
    if (r == NULL)
        return NULL;
    if ((kd_tls_launch_ctx != NULL && kd_tls_launch_ctx->busy) || kd_tls_compiling || kd_in_benchmark()) {
        r->suppressed++;
        return NULL;
    }
    return r;
}

int kd_recording_here(void) { return kd_recorder_here() != NULL; }

uint64_t kd_unfollowed_launches = 0; /* GIL (Note [Launches no recording follows]) */

void kd_note_unrecorded_launch(void)
{
    if (kd_started_recorders > 0 && !kd_tls_compiling && kd_recorder_here() == NULL && !kd_in_benchmark())
        kd_unfollowed_launches++;
}

/* ---- the launch path (Note [Record layout] in kd_record.h) ---- */

_Thread_local kd_hash_config kd_hcfg = {0, 0, 0, 0, 0, 0, 0};

void kd_hcfg_publish(void)
{
    unsigned long me = PyThread_get_thread_ident();
    for (kd_recorder *r = kd_tls_recorder; r != NULL; r = r->prev)
        r->owner_hcfg = kd_hcfg;
    if (kd_global_recorder != NULL && kd_global_recorder->owner_thread == me)
        kd_global_recorder->owner_hcfg = kd_hcfg;
}

/* Note [Hash windows]
 * A recorder can be told to hash every launch into it bitwise for a while
 * (Recorder.hash_window(n, spec)): the flight recorder's optimizer window
 * (Note [What the flight recorder hashes] in kdebug/flight.py).  It is a
 * count on the recorder, not a log_tensor_hashes() context: contexts are a
 * per-thread stack left innermost first, and the window is opened in an
 * optimizer's step pre-hook and closed in its post-hook, which torch runs in
 * registration order, so two recorders attached to one optimizer, or a
 * user's own context opened and closed by step hooks, would leave them out
 * of order.  A count has no order, may be closed from any thread (leaving
 * the recorder's block after a step that raised on a worker thread), and
 * adds to what the thread's own settings ask (a user's stats hashes for
 * check_finite stay) instead of replacing them: the bitwise kind is added,
 * and the window's spec is used only where no hash was asked for. */

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
        c.output_filter = o->output_filter;
    }
    if (r->hash_window > 0) { /* Note [Hash windows] */
        if (!c.kinds && !c.spec)
            c.spec = r->window_spec;
        c.kinds |= KD_HK_BITWISE;
    }
    return c;
}

/* Describes one argument at b[0..); returns the payloads used, 0 on failure
 * (counted by the caller).  With `hashed`, one more zeroed KD_TAG_HASH
 * payload follows the argument.  `meta` (may be NULL) receives a tensor's
 * metadata as read, for the caller's hashes of it (kd_hash_tensor's `known`:
 * no second reading). */
static uint32_t describe_arg(PyObject *o, uint32_t name_id, uint8_t role, int hashed,
                             kd_payload *b, uint32_t room, const char **why, kd_tensor_meta *meta)
{
    kd_tensor_meta local;
    kd_tensor_meta *mp = meta != NULL ? meta : &local; /* a tensor's metadata, for the caller's hashes */
    int kind = kd_shim_tensor_meta(o, mp);
    if (kind == 1) {
        if (mp->ndim < 0 || mp->ndim > KD_MAX_NDIM) {
            *why = "tensor with too many dimensions";
            return 0;
        }
        uint32_t np = kd_tensor_payloads((uint32_t)mp->ndim) + (hashed ? 1 : 0);
        if (np > room) {
            *why = "launch has more arguments than a record can hold";
            return 0;
        }
        memset(b, 0, sizeof(kd_payload) * np);
        kd_tensor_arg *t = &b[0].tensor;
        t->tag = KD_TAG_TENSOR;
        t->role = role;
        t->dtype = (uint8_t)mp->dtype;
        t->ndim = (uint8_t)mp->ndim;
        t->device_type = (uint8_t)mp->device_type;
        t->device_index = (int8_t)mp->device_index;
        t->name_id = name_id;
        t->storage_offset = mp->storage_offset;
        t->data_ptr = mp->data_ptr;
        for (int32_t d = 0; d < mp->ndim; d++) {
            if (d < KD_INLINE_DIMS) {
                t->sizes[d] = mp->sizes[d];
                t->strides[d] = mp->strides[d];
            } else {
                int32_t k = d - KD_INLINE_DIMS;
                kd_dims_cont *c = &b[1 + k / KD_CONT_DIMS].dims;
                c->tag = KD_TAG_DIMS;
                c->count++;
                c->sizes[k % KD_CONT_DIMS] = mp->sizes[d];
                c->strides[k % KD_CONT_DIMS] = mp->strides[d];
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

/* Whether this thread's launch may use the deferred queue: never while it
 * captures a CUDA graph.  The queue's switch is process-wide and another
 * thread may turn it back on during the capture (DebugMode enter / exit, a
 * compiled graph's call); a deferred hash of a captured launch would run
 * outside the graph on memory the launch never wrote, and the graph's
 * template would keep a pending flag with no graph result index
 * (Note [CUDA graph replays]).  Nor while any capture is open: a launch
 * from another thread into the capturing stream (the autograd engine's) did
 * not run either (kd_batch_flush leaves it unhashed).  Nor for a launch
 * that asked to be hashed at once (kd_tls_hash_now). */
static int defer_here(void)
{
    return kd_defer_enabled() && !kd_tls_hash_now && kd_tls_graph == NULL && !kd_graph_any_open();
}

/* Before a CUDA launch runs: flush deferred work it would overwrite. */
static void guard_writes(uint8_t dev_type, PyObject *const *args, Py_ssize_t nargs,
                         const kd_kernel_info *info, uint64_t stream)
{
    /* the queue may hold other threads' work while a capture is open: only
     * the capturing thread's launches (which do not run now) skip the guard */
    if (dev_type != KD_DEV_CUDA || !kd_defer_enabled() || kd_tls_graph != NULL)
        return;
    for (Py_ssize_t i = 0; i < nargs; i++) {
        uint8_t role = (uint32_t)i < info->nnames ? info->roles[i] : KD_ROLE_READ;
        if (role & KD_ROLE_WRITE)
            kd_defer_guard_tensor(args[i], stream);
    }
}

/* mode.call_depth + 1 (1 without a mode or a usable value).  *pure (may be
 * NULL) is set to 0 when reading it may have run Python code: a type with
 * its own __getattribute__ / __getattr__, a class attribute with a __get__
 * (a property), or a value that is not an int (its __index__). */
static int read_call_depth_pure(PyObject *mode, int *pure)
{
    static PyObject *name = NULL;
    if (pure != NULL)
        *pure = 1;
    if (mode == NULL)
        return 1;
    if (name == NULL) {
        name = PyUnicode_InternFromString("call_depth");
        if (name == NULL) {
            PyErr_Clear();
            return 1;
        }
    }
    if (pure != NULL) {
        PyTypeObject *tp = Py_TYPE(mode);
        PyObject *cls_attr = tp->tp_getattro == PyObject_GenericGetAttr ? _PyType_Lookup(tp, name) : NULL;
        if (tp->tp_getattro != PyObject_GenericGetAttr ||
            (cls_attr != NULL && Py_TYPE(cls_attr)->tp_descr_get != NULL))
            *pure = 0;
    }
    PyObject *v = PyObject_GetAttr(mode, name);
    if (v == NULL) {
        PyErr_Clear();
        return 1;
    }
    if (pure != NULL && !PyLong_CheckExact(v))
        *pure = 0;
    long d = PyLong_AsLong(v);
    Py_DECREF(v);
    if (d == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return 1;
    }
    return d < 0 ? 1 : (int)d + 1;
}

/* Describes args into b[1..) (Note [Record layout] in kd_record.h) and
 * takes the hashes of what the launch reads, before it, into batch (entry
 * positions relative to b).  Returns the payloads used, the header's slot
 * included; *why is set when an argument could not be described, and
 * *dev_type / *dev_index become the first tensor's.  metas and hash_at (both
 * NULL, or room for nargs): each argument's metadata as read, and where its
 * hash payload lies in b (0: none). */
static uint32_t describe_launch(kd_recorder *r, const kd_kernel_info *info, PyObject *const *args,
                                Py_ssize_t nargs, const kd_hash_config *cfg, uint64_t launch_index,
                                uint64_t stream, kd_payload *b, kd_gpu_batch *batch, uint8_t *dev_type,
                                int8_t *dev_index, const char **why, kd_tensor_meta *metas, uint32_t *hash_at)
{
    const int hashing = cfg->kinds != 0 || cfg->check_readonly;
    uint32_t used = 1;
    int first_tensor_seen = 0;
    for (Py_ssize_t i = 0; i < nargs; i++) {
        uint32_t name_id = (uint32_t)i < info->nnames ? info->name_ids[i] : 0;
        uint8_t role = (uint32_t)i < info->nnames ? info->roles[i] : KD_ROLE_READ;
        kd_payload *a = &b[used];
        kd_tensor_meta local;
        kd_tensor_meta *meta = metas != NULL ? &metas[i] : &local;
        if (hash_at != NULL)
            hash_at[i] = 0;
        uint32_t k = describe_arg(args[i], name_id, role, hashing, a, KD_BUILD_SLOTS - used, why, meta);
        if (k == 0)
            break;
        if (a->tag == KD_TAG_TENSOR) {
            if (!first_tensor_seen) {
                first_tensor_seen = 1;
                *dev_type = a->tensor.device_type;
                *dev_index = a->tensor.device_index;
            }
            kd_hash_rec *h = kd_arg_hash(a);
            if (h != NULL) {
                h->spec = (uint16_t)cfg->spec;
                uint64_t pos = (uint64_t)((kd_payload *)h - b);
                if (hash_at != NULL)
                    hash_at[i] = (uint32_t)pos;
                /* before the launch: what the kernel reads (Note [Which arguments are hashed]) */
                int kinds = (role & KD_ROLE_READ) && cfg->hash_inputs ? cfg->kinds : 0;
                if (cfg->check_readonly && role == KD_ROLE_READ)
                    kinds |= KD_HK_BITWISE;
                if (kinds)
                    kd_hash_tensor(r, args[i], kinds, h, 0, launch_index, i, batch, stream, pos, meta);
            }
        }
        used += k;
    }
    return used;
}

/* A launch not recorded because an argument could not be described. */
static void not_described(kd_recorder *r, const kd_kernel_info *info, const char *why)
{
    char msg[200];
    snprintf(msg, sizeof msg, "could not describe an argument of %s: %s",
             kd_strtab_get(kd_strings, info->name_id, NULL), why);
    kd_recorder_error(r, msg);
    r->unrecorded++;
}

/* The launch header at b[0], call_depth read from the recorder's mode (may
 * run Python code: *pure, when given, says whether it could, as
 * read_call_depth_pure). */
static void fill_header(kd_payload *b, kd_recorder *r, const kd_kernel_info *info, uint8_t dev_type,
                        int8_t dev_index, Py_ssize_t nargs, uint32_t used, uint64_t stream,
                        uint64_t launch_index, int *pure)
{
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
    int depth = read_call_depth_pure(r->mode, pure);
    h->call_depth = (uint16_t)(depth > UINT16_MAX ? UINT16_MAX : depth);
    h->launch_index = launch_index;
}

/* The grid and config this thread's launcher capture saw, into the header. */
static void write_capture(kd_launch *h)
{
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
}

/* Describes the launch into this thread's build buffer (Python hashers may
 * run: Note [Per-thread launch context]), then reserves and copies it into the
 * ring.  Returns with p->ok = 0 when nothing was reserved. */
static void launch_begin(kd_recorder *r, kd_launch_ctx *ctx, kd_kernel_info *info,
                         PyObject *const *args, Py_ssize_t nargs, uint64_t stream, kd_pending *p)
{
    uint64_t t_pre = KD_PT_NOW(); /* Note [Phase timers] */
    kd_payload *b = ctx->build;
    uint32_t used = 1;
    const char *why = NULL;
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
    p->kernel_name_id = info->name_id;
    kd_gpu_batch batch;
    batch.n = 0;
    /* Note [Deferred GPU work]: pre-launch hashes of what the launch only reads
     * may wait; under check_inputs_unchanged they run before it. */
    const int defer = defer_here() && !p->cfg.check_readonly;
    if (kd_defer_enabled() && kd_tls_graph == NULL && dev_type == KD_DEV_CUDA)
        kd_defer_guard(dev_index, stream, 0, 0); /* another stream: flush and order */
    uint64_t t_describe = KD_PT_NOW(); /* Note [Phase timers] */
    KD_PT_ADD(KD_PT_PRE, t_pre);
    if (why == NULL)
        used = describe_launch(r, info, args, nargs, &p->cfg, p->launch_index, stream, b, &batch, &dev_type,
                               &dev_index, &why, NULL, NULL);
    if (why != NULL) { /* nothing recorded: its hashes are not queued */
        not_described(r, info, why);
        guard_writes(dev_type, args, nargs, info, stream);
        return;
    }
    fill_header(b, r, info, dev_type, dev_index, nargs, used, stream, p->launch_index, NULL);

    KD_PT_ADD(KD_PT_DESCRIBE, t_describe);
    uint64_t t_ring = KD_PT_NOW();
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
        kd_arg_iter it = kd_args_begin(b, used);
        while (kd_args_next(&it) && (Py_ssize_t)it.index < nargs)
            r->ring_objs[(p->first + it.off) & r->ring->mask] = Py_NewRef(args[it.index]);
    }
    if (batch.n && defer)
        kd_batch_defer(r, &batch, p->first);
    else if (batch.n)
        kd_batch_flush(r, &batch, p->first); /* before the kernel, on its stream */
    p->n = used;
    p->ok = 1;
    for (uint32_t i = 0; i < nreleased; i++)
        Py_DECREF(ctx->released[i]);
    KD_PT_ADD(KD_PT_RING, t_ring);
    uint64_t t_wg = KD_PT_NOW();
    guard_writes(dev_type, args, nargs, info, stream);
    KD_PT_ADD(KD_PT_WGUARD, t_wg);
    uint64_t head = atomic_load_explicit(&r->ring->head, memory_order_relaxed);
    if (head - p->first <= r->ring->capacity) /* not lapped while Python ran above */
        kd_ring_payload(r->ring, p->first)->launch.t_start_ns = kd_now_ns();
}

void kd_launch_begin(kd_recorder *r, kd_kernel_info *info, PyObject *const *args,
                     Py_ssize_t nargs, uint64_t stream, kd_pending *p)
{
    p->ok = 0;
    p->cfg = launch_hcfg(r);
    kd_launch_ctx *ctx = kd_launch_ctx_get();
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
    if (!p->ok && kd_tls_graph != NULL)
        kd_graph_note_unrecorded(kd_tls_graph); /* its replays will lack it (Note [CUDA graph replays]) */
}


/* After the launch, on rec, this thread's copy of the launch's record (rec[0]
 * its header): hashes of what the kernel wrote, the read-only check's second
 * hash, and clones of the outputs (record_outputs).  CUDA hashes go to batch
 * with their ring tickets; nothing here writes the ring. */
PyObject *kd_output_filter_fn = NULL;

/* 1 when the launch's outputs are to be recorded: always without a filter,
 * else what the Python filter (kd_output_filter_fn) answers; a failing filter
 * is counted as a hook error and records nothing.  Runs Python code. */
static int output_wanted(kd_recorder *r, const kd_pending *p)
{
    if (!p->cfg.output_filter)
        return 1;
    if (kd_output_filter_fn == NULL) {
        kd_recorder_error(r, "record_outputs has a filter but no filter function is configured");
        return 0;
    }
    const char *name = kd_strtab_get(kd_strings, p->kernel_name_id, NULL);
    PyObject *res = PyObject_CallFunction(kd_output_filter_fn, "iOsK", p->cfg.output_filter, (PyObject *)r,
                                          name != NULL ? name : "", (unsigned long long)p->launch_index);
    int keep = res != NULL ? PyObject_IsTrue(res) : -1;
    Py_XDECREF(res);
    if (keep < 0) {
        PyObject *et, *ev, *etb;
        PyErr_Fetch(&et, &ev, &etb);
        PyObject *text = ev != NULL ? PyObject_Str(ev) : NULL;
        const char *t = text != NULL ? PyUnicode_AsUTF8(text) : NULL;
        char msg[200];
        snprintf(msg, sizeof msg, "the record_outputs filter raised: %s", t != NULL ? t : "?");
        PyErr_Clear();
        Py_XDECREF(text);
        Py_XDECREF(et);
        Py_XDECREF(ev);
        Py_XDECREF(etb);
        kd_recorder_error(r, msg);
        return 0;
    }
    return keep;
}

static void after_launch(kd_recorder *r, kd_pending *p, PyObject *const *args, Py_ssize_t nargs,
                         kd_payload *rec, kd_gpu_batch *batch)
{
    kd_hash_config cfg_copy = p->cfg;
    if (cfg_copy.record_outputs && kd_tls_graph != NULL) {
        /* a copy captured into a CUDA graph would be overwritten by every replay */
        cfg_copy.record_outputs = 0;
        r->outputs_skipped++;
        kd_graph_note_output_skipped(kd_tls_graph);
    }
    if (cfg_copy.record_outputs && !output_wanted(r, p))
        cfg_copy.record_outputs = 0;
    const kd_hash_config *cfg = &cfg_copy;
    PyObject *outs = NULL;
    kd_arg_iter it = kd_args_begin(rec, p->n);
    while (kd_args_next(&it) && (Py_ssize_t)it.index < nargs) {
        const kd_payload *a = it.arg;
        Py_ssize_t i = it.index;
        if (a->tag != KD_TAG_TENSOR)
            continue;
        uint8_t role = a->tensor.role;
        if (it.hash != NULL) {
            kd_hash_rec *h = &rec[it.hash_off].hash; /* rec is ours to update */
            int kinds = (role & KD_ROLE_WRITE) ? cfg->kinds : 0;
            int check = cfg->check_readonly && role == KD_ROLE_READ && (h->flags & KD_HF_PRE);
            if (check)
                kinds |= KD_HK_BITWISE;
            if (kinds)
                kd_hash_tensor(r, args[i], kinds, h, 1, p->launch_index, i, batch, p->stream,
                               p->first + it.hash_off, NULL);
            if (check)
                h->flags |= KD_HF_CHECKED; /* compared once merged and the batch is queued */
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
 * argument's hash record in the ring: every field kd_hash_tensor fills for side
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
static void publish_post(kd_recorder *r, kd_pending *p, const kd_payload *rec, kd_gpu_batch *batch)
{
    kd_arg_iter it = kd_args_begin(rec, p->n);
    while (kd_args_next(&it))
        if (it.hash != NULL)
            merge_post(&kd_ring_payload(r->ring, p->first + it.hash_off)->hash, it.hash);
    if (defer_here())
        kd_batch_defer(r, batch, 0);
    else
        kd_batch_flush(r, batch, 0); /* after the kernel, on its stream */
    if (p->cfg.check_readonly) {
        /* values still on the GPU are compared when they arrive (rec_deliver);
         * the ring's copy has rec's layout, so rec's walk finds its hash payloads */
        it = kd_args_begin(rec, p->n);
        while (kd_args_next(&it))
            if (it.hash != NULL)
                kd_note_readonly_change(r, &kd_ring_payload(r->ring, p->first + it.hash_off)->hash);
    }
}

void kd_launch_end(kd_recorder *r, kd_pending *p, PyObject *const *args, Py_ssize_t nargs,
                   int raised)
{
    if (!p->ok)
        return;
    kd_launch_ctx *ctx = kd_tls_launch_ctx; /* kd_launch_begin made it on this thread */
    ctx->busy = 1;
    kd_gpu_batch batch;
    batch.n = 0;
    int post = !raised && (p->cfg.kinds || p->cfg.check_readonly || p->cfg.record_outputs);
    if (post) {
        /* Python hashers run here: on a copy (Note [Per-thread launch context]) */
        for (uint32_t i = 0; i < p->n; i++)
            memcpy(&ctx->build[i], kd_ring_payload(r->ring, p->first + i), sizeof(kd_payload));
        PyObject *et, *ev, *etb;
        PyErr_Fetch(&et, &ev, &etb);
        uint64_t t_after = KD_PT_NOW();
        after_launch(r, p, args, nargs, ctx->build, &batch);
        KD_PT_ADD(KD_PT_AFTER, t_after);
        PyErr_Restore(et, ev, etb);
    }
    /* From here to the commit: no Python code runs.  A writer that lapped the
     * ring owns these slots now; commit counts the launch as lost, so only
     * touch them when not lapped (its CUDA hashes are then never queued). */
    uint64_t head = atomic_load_explicit(&r->ring->head, memory_order_relaxed);
    if (head - p->first <= r->ring->capacity) {
        kd_launch *h = &kd_ring_payload(r->ring, p->first)->launch;
        h->t_end_ns = end_ns(h);
        write_capture(h);
        if (raised)
            h->flags |= KD_LF_RAISED;
        if (post) {
            uint64_t t_pub = KD_PT_NOW();
            publish_post(r, p, ctx->build, &batch);
            KD_PT_ADD(KD_PT_PUBLISH, t_pub);
        }
        if (kd_tls_graph != NULL)
            kd_graph_add_launch(kd_tls_graph, r, p->first, p->n); /* Note [CUDA graph replays] */
    } else if (kd_tls_graph != NULL) {
        kd_graph_note_unrecorded(kd_tls_graph); /* lapped: not in the template, its replays lack it */
    }
    kd_ring_commit(r->ring, p->first, p->n);
    ctx->busy = 0;
}

/* Note [Records made in one pass]
 * Some records have no kernel launch between their two halves: a replica
 * state record (kd_state_record.c: the flight recorder makes about 250 a
 * step), an aten op recorded after it ran (kd_op_observer.c), a launch a
 * caller records itself (Recorder.record).  Made as kd_launch_begin +
 * kd_launch_end back to back, each tensor's metadata was read three times
 * (to describe it, for the write guard, for its post-launch hash), and the
 * record was copied out of the ring again for its post-launch hashes.
 * kd_launch_record does the same steps in the same order -- describe each
 * argument and hash what it reads, read call_depth, reserve and copy into
 * the ring, queue those hashes; hash what it writes, merge those hashes
 * into the ring unless lapped, queue them, commit -- with three differences:
 *  - the write guard is left out: nothing is launched, so nothing queued
 *    can be overwritten (an op that ran was guarded before it ran, by the
 *    C++ write guard, Note [C++ write guard]); it only flushed earlier;
 *  - the post-launch hashes go into this thread's build buffer, which
 *    still holds the record (launches on this thread are suppressed while
 *    its context is busy), not into a fresh copy out of the ring;
 *  - they use the metadata read when describing while no Python code ran
 *    since (kd_tls_hash_python_calls did not move; call_depth was read
 *    without Python: read_call_depth_pure); else they read it again.
 * The record's bytes, counters and errors are the two calls' (tests compare
 * them through kdebug.testing.two_call_records, which turns this off).
 * Declined, before anything is done, where the two calls do work this
 * path does not: check_inputs_unchanged, record_outputs, store_original_args,
 * a custom hash_fn, a CUDA graph capture on this thread or open anywhere, a
 * thread already inside kdebug's launch path, injected hook faults, more
 * than KD_RECORD_ARGS arguments.  An adversarial review of its first
 * version (which hashed each argument's writes while describing it, and
 * read call_depth after) found it counted hash errors for records then
 * refused or not described, ran Python code in another order, and left a
 * Python error set: each has a test now. */
static int one_pass_enabled = 1;

int kd_launch_record_enable(int on)
{
    int was = one_pass_enabled;
    one_pass_enabled = on != 0;
    return was;
}

int kd_launch_record(kd_recorder *r, kd_kernel_info *info, PyObject *const *args, Py_ssize_t nargs,
                     uint64_t stream, int *recorded)
{
    *recorded = 0;
    kd_hash_config cfg = launch_hcfg(r);
    if (!one_pass_enabled || cfg.check_readonly || cfg.record_outputs || (cfg.kinds & KD_HK_CUSTOM) ||
        r->ring_objs != NULL || kd_tls_graph != NULL || kd_graph_any_open() || kd_injected_faults > 0 ||
        nargs > KD_RECORD_ARGS)
        return 0;
    kd_launch_ctx *ctx = kd_launch_ctx_get();
    if (ctx == NULL || ctx->busy)
        return 0; /* the two calls count it as they should */
    ctx->busy = 1;
    const int hashing = cfg.kinds != 0;
    kd_payload *b = ctx->build;
    const char *why = NULL;
    uint8_t dev_type = info->device_type;
    int8_t dev_index = info->device_index;
    const uint64_t launch_index = r->next_launch_index++;
    /* what kd_launch_begin does, in its order: describe each argument and
     * hash what it reads, read call_depth, reserve, queue those hashes */
    kd_tensor_meta *metas = ctx->metas; /* each argument's metadata, as described */
    uint32_t *hash_at = ctx->hash_at;   /* each argument's hash payload in b, 0: none */
    const uint64_t python_calls = kd_tls_hash_python_calls;
    kd_gpu_batch batch;
    batch.n = 0;
    const int defer = defer_here();
    if (kd_defer_enabled() && dev_type == KD_DEV_CUDA)
        kd_defer_guard(dev_index, stream, 0, 0); /* another stream: flush and order */
    uint32_t used = describe_launch(r, info, args, nargs, &cfg, launch_index, stream, b, &batch, &dev_type,
                                    &dev_index, &why, metas, hash_at);
    if (why != NULL) { /* nothing recorded: its hashes are not queued */
        not_described(r, info, why);
        ctx->busy = 0;
        return 1;
    }
    int pure = 1;
    fill_header(b, r, info, dev_type, dev_index, nargs, used, stream, launch_index, &pure);
    /* the metadata read above still holds for the hashes below while no
     * Python code ran since (else they read it again, as the two calls did) */
    const int metas_hold = pure && kd_tls_hash_python_calls == python_calls;
    uint64_t first;
    if (kd_ring_reserve(r->ring, used, &first) != 0) {
        ctx->busy = 0;
        return 1; /* refused: counted by the ring */
    }
    for (uint32_t i = 0; i < used; i++)
        memcpy(kd_ring_payload(r->ring, first + i), &b[i], sizeof(kd_payload));
    if (batch.n && defer)
        kd_batch_defer(r, &batch, first);
    else if (batch.n)
        kd_batch_flush(r, &batch, first);
    /* (no write guard: nothing is launched) */
    uint64_t head = atomic_load_explicit(&r->ring->head, memory_order_relaxed);
    if (head - first <= r->ring->capacity)
        kd_ring_payload(r->ring, first)->launch.t_start_ns = kd_now_ns();
    /* what kd_launch_end does: hash what it wrote, on b (still this record:
     * this thread's launches are suppressed while ctx is busy), then merge
     * those hashes into the ring unless another thread lapped it meanwhile */
    batch.n = 0;
    if (hashing) {
        PyObject *et, *ev, *etb;
        PyErr_Fetch(&et, &ev, &etb);
        for (Py_ssize_t i = 0; i < nargs; i++) {
            uint8_t role = (uint32_t)i < info->nnames ? info->roles[i] : KD_ROLE_READ;
            if (hash_at[i] != 0 && (role & KD_ROLE_WRITE))
                kd_hash_tensor(r, args[i], cfg.kinds, &b[hash_at[i]].hash, 1, launch_index, i, &batch, stream,
                               first + hash_at[i], metas_hold ? &metas[i] : NULL);
        }
        PyErr_Restore(et, ev, etb);
    }
    head = atomic_load_explicit(&r->ring->head, memory_order_relaxed);
    if (head - first <= r->ring->capacity) {
        kd_launch *rh = &kd_ring_payload(r->ring, first)->launch;
        rh->t_end_ns = end_ns(rh);
        write_capture(rh); /* a caller's launcher capture, as kd_launch_end reads it */
        if (hashing) {
            kd_pending p = {.first = first, .n = used, .cfg = cfg};
            publish_post(r, &p, b, &batch);
        }
    }
    kd_ring_commit(r->ring, first, used);
    ctx->busy = 0;
    *recorded = 1;
    return 1;
}
