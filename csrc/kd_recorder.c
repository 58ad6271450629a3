/* kd_recorder.c - the Recorder type: one ring, the launches drained from it,
 * its counters and error messages.  Writing a launch into the ring (the hot
 * path) is kd_launch.c; hashing its tensors, kd_launch_hash.c. */
#include <stdlib.h>
#include <string.h>

#include "kd_args.h"
#include "kd_cuda_hash.h"
#include "kd_defer.h"
#include "kd_hook.h"
#include "kd_launch.h"
#include "kd_launch_table.h"
#include "kd_module.h"
#include "kd_recorder.h"
#include "kd_clock.h"
#include "kd_types.h"
#include "kd_view.h"
#include "kd_graph.h"
#include "kd_results.h"
#include "kd_shim.h"

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
        detail = s != NULL ? PyUnicode_AsUTF8(s) : NULL;
        if (detail == NULL) { /* str() of the error raised, or its text is not UTF-8: no detail */
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

/* Whether a launch record has a hash side still waiting for its GPU result. */
static int launch_pending(const kd_payload *p, uint32_t n)
{
    kd_arg_iter it = kd_args_begin(p, n);
    while (kd_args_next(&it))
        if (it.hash != NULL && (it.hash->flags & (KD_HF_PENDING_PRE | KD_HF_PENDING_POST)))
            return 1;
    return 0;
}

/* The drain's room in the store (Note [One copy per drained launch]). */
static kd_payload *room_drain(void *ctx, uint32_t n)
{
    kd_recorder *r = ctx;
    uint64_t base = r->table.store.npayloads;
    kd_payload *dst = NULL;
    if ((r->ring_objs == NULL || grow_store_objs(r, base + n) == 0))
        dst = kd_store_room(&r->table.store, n);
    if (dst == NULL)
        r->drain_failures++;
    return dst;
}

/* p: the launch, copied into the store's room: taken here, or left there. */
static int visit_drain(void *ctx, uint64_t first, const kd_payload *p, uint32_t n)
{
    kd_recorder *r = ctx;
    if (r->drain_holds_pending && launch_pending(p, n)) {
        if (p->tag == KD_TAG_LAUNCH)
            r->held_from = p->launch.launch_index;
        return 1; /* Note [Results in flight]: it stays in the ring for a later drain */
    }
    if (p->tag != KD_TAG_LAUNCH) { /* cannot happen (the ring reads headers only): be safe */
        r->drain_failures++;
        return 0;
    }
    uint64_t base = r->table.store.npayloads;
    kd_store_take(&r->table.store, n);
    if (r->ring_objs != NULL) {
        for (uint32_t i = 0; i < n; i++) {
            PyObject **slot = &r->ring_objs[(first + i) & r->ring->mask];
            r->store_objs[base + i] = *slot; /* ownership moves to the store */
            *slot = NULL;
        }
    }
    return 0;
}

/* How flush_hashes takes the results of the hashes it launches. */
enum { FLUSH_ONLY, COLLECT_WAIT, COLLECT_READY };

/* Queued GPU hashes of this recorder: launched, and their results in its
 * records: with COLLECT_WAIT all of them (one device synchronization when any
 * is in flight), with COLLECT_READY those already read back (Note [Reading
 * results without waiting]: never waits; the rest begin reading back).
 * 0, or -1 when the collect failed (said as the recorder's error). */
static int flush_hashes(kd_recorder *r, int how)
{
    kd_defer_flush();
    char msg[300];
    if (how == COLLECT_WAIT && r->anchor != NULL && r->anchor->refs > 0 && kd_collect_gpu_results() != 0)
        snprintf(msg, sizeof msg, "reading GPU hashes: %s", kd_collect_gpu_error());
    else if (how == COLLECT_READY && kd_cuda_hash_collect_ready() != 0)
        snprintf(msg, sizeof msg, "reading GPU hashes back without waiting: %s", kd_cuda_last_error());
    else
        return 0;
    kd_recorder_error(r, msg);
    return -1;
}

/* Moves the ring's launches into the store; with hold, stopping at the first
 * one still waiting for a GPU result (held_from). */
static uint64_t read_ring(kd_recorder *r, int hold)
{
    r->drain_holds_pending = hold;
    r->held_from = UINT64_MAX;
    kd_ring_read_to(r->ring, room_drain, r->drain_cap, visit_drain, r);
    r->drain_holds_pending = 0;
    return r->table.store.nlaunches;
}

/* Note [Results in flight]: after a successful collect, a record still
 * waiting for a GPU result waits for a result held by a replay queued after
 * this reader's marks (another thread's, in a loop, say): the ring read
 * stops there and leaves it and the launches after it for a later drain,
 * rather than moving it into the store, where its result could no longer be
 * delivered and its result index would stand where its hash belongs.  After
 * a failed collect (said as an error) nothing more will come for such
 * records: they are taken, their waiting sides absent. */
uint64_t kd_recorder_drain(kd_recorder *r)
{
    int ok = flush_hashes(r, COLLECT_WAIT) == 0; /* results land in the ring: before it is read */
    return read_ring(r, ok && r->anchor != NULL && r->anchor->refs > 0);
}

/* A failed read-back without waiting is not fatal: its launches stay held
 * for a blocking drain, which collects them. */
uint64_t kd_recorder_drain_ready(kd_recorder *r)
{
    flush_hashes(r, COLLECT_READY);
    return read_ring(r, 1);
}

/* ---- Note [Steps held in the ring] (core/kd_ring.h): digests and forgetting without a drain ---- */

typedef struct {
    uint64_t sum, count;
    int waiting;
} digest_scan;

static int visit_digest(void *ctx, uint64_t first, const kd_payload *p, uint32_t n)
{
    (void)first;
    digest_scan *d = ctx;
    if (launch_pending(p, n)) { /* its GPU hashes are not read back yet */
        d->waiting = 1;
        return 1;
    }
    d->sum += kd_launch_digest_term(p, n, kd_strings);
    d->count++;
    return 0;
}

/* The digest of launches [a, b), from the store and the ring together (the
 * store holds the older ones); 0, or 1 when one of them still waits for its
 * GPU hashes or is still being written (no digest yet), -1 out of memory. */
int kd_recorder_range_digest(kd_recorder *r, uint64_t a, uint64_t b, uint64_t *digest, uint64_t *recorded)
{
    if (r->scan_scratch == NULL && (r->scan_scratch = PyMem_Malloc(sizeof(kd_payload) * KD_BUILD_SLOTS)) == NULL)
        return -1;
    digest_scan d = {0, 0, 0};
    if (b <= a) { /* nothing to read: no walk from the ring's tail to find where it would be */
        *digest = kd_digest_finish(0, 0);
        *recorded = 0;
        return 0;
    }
    const kd_store *s = &r->table.store;
    for (uint64_t i = kd_store_lower_bound(s, a), hi = kd_store_lower_bound(s, b); i < hi; i++) {
        const kd_payload *p = kd_store_launch(s, i);
        d.sum += kd_launch_digest_term(p, (uint32_t)p->launch.nslots + 1, kd_strings);
        d.count++;
    }
    if (kd_ring_scan(r->ring, a, b, r->scan_scratch, KD_BUILD_SLOTS, visit_digest, &d) != 0 || d.waiting)
        return 1;
    *digest = kd_digest_finish(d.sum, d.count);
    *recorded = d.count;
    return 0;
}

/* ------------------------------------------------------------------ */
/* The Recorder Python type                                            */

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
    kd_ltab_init(&self->table);
    /* A DebugMode per step makes a Recorder per step: the ring of the last
     * one is taken over instead of allocated again. */
    self->ring = kd_ring_reuse(capacity, policy);
    self->drain_cap = KD_BUILD_SLOTS;
    self->held_from = UINT64_MAX;
    self->store_objects = store_objects;
    self->anchor = kd_result_anchor_new(self);
    if (self->ring && store_objects)
        self->ring_objs = PyMem_Calloc(self->ring->capacity, sizeof(PyObject *));
    if (self->ring == NULL || self->anchor == NULL ||
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
    kd_ltab_free(&self->table);
    PyMem_Free(self->ring_objs);
    PyMem_Free(self->store_objs);
    PyMem_Free(self->scan_scratch);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* start(mode, ops, all_threads=False): launches on this thread (or, with
 * all_threads, on every thread with no recorder of its own) go to this one. */
static PyObject *rec_start(kd_recorder *self, PyObject *args, PyObject *kw)
{
    kd_clock_anchor(); /* Note [Launch timestamps from the TSC]: where a microsecond does not matter */
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
    kd_defer_flush_quiet(); /* nothing of this recording waits past its end */
    kd_defer_read_back_early(); /* Note [Reading back before the ring fills] */
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

static PyObject *rec_drain(kd_recorder *self, PyObject *args, PyObject *kwargs)
{
    kd_clock_anchor(); /* Note [Launch timestamps from the TSC]: where a microsecond does not matter */
    static char *kwlist[] = {"wait", NULL};
    int wait = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|$p:drain", kwlist, &wait))
        return NULL;
    return PyLong_FromUnsignedLongLong(wait ? kd_recorder_drain(self) : kd_recorder_drain_ready(self));
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
    flush_hashes(self, FLUSH_ONLY); /* what is still to come lands nowhere: the ring is cleared */
    kd_launch_views_detach(self); /* kept views keep their records */
    drop_objects(self);
    kd_ltab_clear(&self->table); /* a new generation */
    kd_ring_clear(self->ring);
    self->errors = self->unrecorded = self->suppressed = self->drain_failures = 0;
    self->hash_unsupported = self->readonly_changed = self->output_bytes = self->outputs_skipped = 0;
    Py_CLEAR(self->outputs);
    Py_CLEAR(self->custom);
    self->nmessages = 0;
    self->next_launch_index = 0;
    Py_RETURN_NONE;
}

/* forget(n): drops the oldest n stored launches (all when n >= len); the
 * rest keep their order at store indices shifted down by n.  Views of the
 * recorder detach first (they keep their records).  The ring, counters and
 * launch indices are untouched (Note [Flight recorder] in kdebug/flight.py). */
/* Drops the oldest n stored launches (views detach); -1 with a ValueError
 * naming `who` on a recorder that keeps argument objects. */
static int forget_stored(kd_recorder *self, uint64_t n, const char *who)
{
    if (self->store_objects) {
        PyErr_Format(PyExc_ValueError, "%s() is not available on a recorder that keeps argument "
                                       "objects (store_objects=True)", who);
        return -1;
    }
    if (n) {
        kd_launch_views_detach(self); /* kept views keep their records */
        kd_ltab_forget(&self->table, n);
    }
    return 0;
}

static PyObject *rec_forget(kd_recorder *self, PyObject *arg)
{
    Py_ssize_t n = PyNumber_AsSsize_t(arg, PyExc_OverflowError);
    if (n == -1 && PyErr_Occurred())
        return NULL;
    if (n < 0) {
        PyErr_SetString(PyExc_ValueError, "forget(n) takes n >= 0");
        return NULL;
    }
    if (forget_stored(self, (uint64_t)n, "forget") != 0)
        return NULL;
    Py_RETURN_NONE;
}

/* settle(*, wait=True): the GPU hashes of the ring's records, read back
 * into them (wait) or those already read back (not wait: begins reading
 * back the rest, never synchronizes); nothing moves out of the ring. */
static PyObject *rec_settle(kd_recorder *self, PyObject *args, PyObject *kwargs)
{
    kd_clock_anchor(); /* Note [Launch timestamps from the TSC]: where a microsecond does not matter */
    static char *kwlist[] = {"wait", NULL};
    int wait = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|$p:settle", kwlist, &wait))
        return NULL;
    flush_hashes(self, wait ? COLLECT_WAIT : COLLECT_READY);
    Py_RETURN_NONE;
}

/* digest(start, stop, ticket=None) -> RangeDigest | None (Note [Steps held
 * in the ring]); ticket: where launch `start` is thought to begin in the
 * ring (the ring's head just before it was launched), which the scan starts
 * from when it holds that launch's header (else where it would anyway). */
static PyObject *rec_digest(kd_recorder *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"start", "stop", "ticket", NULL};
    PyObject *start, *stop, *ticket = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO|O:digest", kwlist, &start, &stop, &ticket))
        return NULL;
    unsigned long long a = PyLong_AsUnsignedLongLong(start), b = a;
    if (!(a == (unsigned long long)-1 && PyErr_Occurred()))
        b = PyLong_AsUnsignedLongLong(stop);
    if (PyErr_Occurred())
        return NULL; /* not an int, negative or past 2**64 - 1 */
    if (b < a) {
        PyErr_SetString(PyExc_ValueError, "digest(start, stop): stop >= start");
        return NULL;
    }
    if (ticket != Py_None) {
        unsigned long long t = PyLong_AsUnsignedLongLong(ticket);
        if (t == (unsigned long long)-1 && PyErr_Occurred())
            return NULL;
        kd_ring_hint(self->ring, t, a);
    }
    uint64_t digest = 0, recorded = 0;
    int st = kd_recorder_range_digest(self, a, b, &digest, &recorded);
    if (st < 0)
        return PyErr_NoMemory();
    if (st > 0)
        Py_RETURN_NONE;
    return KD_RECORD(kd_RangeDigestType, PyLong_FromUnsignedLongLong(digest),
                     PyLong_FromUnsignedLongLong(recorded));
}

/* discard(launch_index) -> launches dropped: every stored launch and every
 * launch still in the ring whose launch index is below it, without moving
 * any out of the ring (Note [Steps held in the ring]); the ring's part stops
 * at a launch still being written. */
static PyObject *rec_discard(kd_recorder *self, PyObject *arg)
{
    unsigned long long upto = PyLong_AsUnsignedLongLong(arg);
    if (upto == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    uint64_t k = kd_store_lower_bound(&self->table.store, upto);
    if (forget_stored(self, k, "discard") != 0)
        return NULL;
    uint64_t gone = kd_ring_discard(self->ring, upto);
    return PyLong_FromUnsignedLongLong((unsigned long long)(k + gone));
}

/* position(launch_index) -> the store index of the first stored launch whose
 * launch index is >= launch_index (len(self) when none is): kd_store_lower_bound. */
static PyObject *rec_position(kd_recorder *self, PyObject *arg)
{
    unsigned long long want = PyLong_AsUnsignedLongLong(arg);
    if (want == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    return PyLong_FromUnsignedLongLong(kd_store_lower_bound(&self->table.store, want));
}

static Py_ssize_t rec_len(kd_recorder *self) { return (Py_ssize_t)self->table.store.nlaunches; }

static PyObject *rec_launch(kd_recorder *self, PyObject *arg)
{
    Py_ssize_t i = PyNumber_AsSsize_t(arg, PyExc_IndexError);
    if (i == -1 && PyErr_Occurred())
        return NULL;
    if (i < 0)
        i += (Py_ssize_t)self->table.store.nlaunches;
    if (i < 0 || (uint64_t)i >= self->table.store.nlaunches) {
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
        (unsigned long long)self->table.store.nlaunches, "dropped",
        (unsigned long long)(kd_ring_lost_fast(g) + self->drain_failures), "refused",
        (unsigned long long)atomic_load(&g->refused), "errors",
        (unsigned long long)self->errors, "unrecorded", (unsigned long long)self->unrecorded,
        "suppressed", (unsigned long long)self->suppressed, "capacity",
        (unsigned long long)g->capacity, "slots_used",
        (unsigned long long)(atomic_load(&g->head) - atomic_load(&g->tail)), "store_bytes",
        (unsigned long long)(self->table.store.payload_cap * sizeof(kd_payload)), "overflow",
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

/* problem_counts() -> ProblemCounts: the counters of stats() that DebugMode
 * warns about when they grow, read at every exit without building stats()'s
 * dict (Note [Problems at exit] in kdebug/mode.py). */
/* The counters problem_counts() and problem_state() report, in
 * ProblemCounts' field order. */
enum { KD_NPROBLEMS = 5 };
static void problem_values(kd_recorder *self, uint64_t c[KD_NPROBLEMS])
{
    c[0] = kd_ring_lost_fast(self->ring) + self->drain_failures; /* dropped */
    c[1] = self->errors;
    c[2] = self->outputs_skipped;
    c[3] = self->readonly_changed;
    c[4] = self->hash_unsupported;
}

static PyObject *rec_problem_counts(kd_recorder *self, PyObject *unused)
{
    (void)unused;
    uint64_t c[KD_NPROBLEMS];
    problem_values(self, c);
    return KD_RECORD(kd_ProblemCountsType, PyLong_FromUnsignedLongLong((unsigned long long)c[0]),
                     PyLong_FromUnsignedLongLong((unsigned long long)c[1]),
                     PyLong_FromUnsignedLongLong((unsigned long long)c[2]),
                     PyLong_FromUnsignedLongLong((unsigned long long)c[3]),
                     PyLong_FromUnsignedLongLong((unsigned long long)c[4]));
}

/* problem_state() -> bytes: problem_counts()'s counters packed, compared
 * whole: DebugMode's exit reads it alone and looks at the counters only when
 * it changed (Note [Problems at exit]).  Not a sum: a count can also fall
 * (a ring clear; and before 2026-11-29 the dropped count of a ring with a
 * launch in flight, kd_ring_lost), and a fall must not hide a rise. */
static PyObject *rec_problem_state(kd_recorder *self, PyObject *unused)
{
    (void)unused;
    uint64_t c[KD_NPROBLEMS];
    problem_values(self, c);
    return PyBytes_FromStringAndSize((const char *)c, sizeof c);
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
    PyObject *const *objs = &PyTuple_GET_ITEM(argv, 0);
    const Py_ssize_t n = PyTuple_GET_SIZE(argv);
    int recorded = 0;
    if (!kd_launch_record(self, (kd_kernel_info *)info, objs, n, stream, &recorded)) { /* Note [Records made in one pass] */
        kd_pending p;
        kd_launch_begin(self, (kd_kernel_info *)info, objs, n, stream, &p);
        kd_launch_end(self, &p, objs, n, 0);
        recorded = p.ok;
    }
    return PyBool_FromLong(recorded);
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

/* Launches seen so far (the next launch index): a counter, O(1), unlike
 * stats(), whose "dropped" walks the unread ring once it went round
 * (kd_ring_lost_fast). */
static PyObject *rec_get_seen(kd_recorder *self, void *c)
{
    (void)c;
    return PyLong_FromUnsignedLongLong((unsigned long long)self->next_launch_index);
}

/* Ring slots holding records not yet drained (head - tail): O(1). */
static PyObject *rec_get_slots_used(kd_recorder *self, void *c)
{
    (void)c;
    kd_ring *g = self->ring;
    return PyLong_FromUnsignedLongLong((unsigned long long)(atomic_load(&g->head) - atomic_load(&g->tail)));
}

/* After the last drain: the first launch it left waiting for a GPU result. */
static PyObject *rec_get_held_from(kd_recorder *self, void *c)
{
    (void)c;
    if (self->held_from == UINT64_MAX)
        Py_RETURN_NONE;
    return PyLong_FromUnsignedLongLong((unsigned long long)self->held_from);
}

/* The ring's next ticket (head): where the next launch will begin unless another thread's comes first. */
static PyObject *rec_get_ticket(kd_recorder *self, void *c)
{
    (void)c;
    return PyLong_FromUnsignedLongLong((unsigned long long)atomic_load(&self->ring->head));
}

/* Launches held: stored, and in the ring not yet drained (a walk of the ring's headers). */
static PyObject *rec_get_held_launches(kd_recorder *self, void *c)
{
    (void)c;
    return PyLong_FromUnsignedLongLong(
        (unsigned long long)(self->table.store.nlaunches + kd_ring_unread_launches(self->ring)));
}

/* The ring's capacity in slots. */
static PyObject *rec_get_capacity(kd_recorder *self, void *c)
{
    (void)c;
    return PyLong_FromUnsignedLongLong((unsigned long long)self->ring->capacity);
}

static PyGetSetDef rec_getset[] = {
    {"seen", (getter)rec_get_seen, NULL, "launches seen so far (stats()['seen'] without its cost)", NULL},
    {"slots_used", (getter)rec_get_slots_used, NULL,
     "ring slots not yet drained (stats()['slots_used'] without its cost)", NULL},
    {"capacity", (getter)rec_get_capacity, NULL, "the ring's capacity in slots", NULL},
    {"ticket", (getter)rec_get_ticket, NULL,
     "the ring's next ticket: where the next launch begins unless another thread's comes first (a hint for "
     "digest())", NULL},
    {"held_launches", (getter)rec_get_held_launches, NULL,
     "launches held: stored (len(self)) and still in the ring (a walk of its headers)", NULL},
    {"held_from", (getter)rec_get_held_from, NULL,
     "after the last drain: the launch index of the first launch left in the ring waiting for its GPU "
     "hashes, or None", NULL},
    {"owner_thread", (getter)rec_get_owner_thread, NULL,
     "threading.get_ident() of the thread that last started it", NULL},
    {"outputs", (getter)rec_get_outputs, NULL,
     "{launch_index: {arg name: clone}} recorded by record_outputs()", NULL},
    {"custom", (getter)rec_get_custom, NULL,
     "{(launch_index, arg index, 0 pre / 1 post): value} from a custom hash_fn", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

/* hash_window(n, spec) -> previous n (Note [Hash windows] in kd_launch.c). */
static PyObject *rec_hash_window(kd_recorder *self, PyObject *args)
{
    int n, spec;
    if (!PyArg_ParseTuple(args, "ii:hash_window", &n, &spec))
        return NULL;
    if (n < 0 || spec < 0) {
        PyErr_SetString(PyExc_ValueError, "hash_window(n, spec): n >= 0 and a spec id >= 0");
        return NULL;
    }
    int prev = self->hash_window;
    self->hash_window = n;
    self->window_spec = spec;
    return PyLong_FromLong(prev);
}

/* prefault() -> bytes touched (Note [Ring prefault] in core/kd_ring.c). */
static PyObject *rec_prefault(kd_recorder *self, PyObject *unused)
{
    (void)unused;
    if (self->started) {
        PyErr_SetString(PyExc_RuntimeError, "Recorder.prefault(): call it before start(), while nothing writes the ring");
        return NULL;
    }
    if (self->ring == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Recorder.prefault(): this recorder has no ring");
        return NULL;
    }
    return PyLong_FromUnsignedLongLong(kd_ring_prefault(self->ring));
}

/* resident() -> bytes of the ring in memory now (Note [Spare rings] in core/kd_ring.c). */
static PyObject *rec_resident(kd_recorder *self, PyObject *unused)
{
    (void)unused;
    return PyLong_FromUnsignedLongLong(self->ring != NULL ? kd_ring_resident(self->ring) : 0);
}

static PyMethodDef rec_methods[] = {
    {"prefault", (PyCFunction)rec_prefault, METH_NOARGS,
     "prefault() -> bytes: touch every page of the ring now, so launches never fault it in (Note [Ring prefault]); "
     "only while not started."},
    {"resident", (PyCFunction)rec_resident, METH_NOARGS,
     "resident() -> bytes of the ring resident in memory now (pages a launch or prefault() touched)."},
    {"hash_window", (PyCFunction)rec_hash_window, METH_VARARGS,
     "hash_window(n, spec) -> previous n: while n > 0 every launch into this recorder is hashed bitwise too, "
     "with hash spec `spec` where nothing else asked for a hash (Note [Hash windows])."},
    {"start", (PyCFunction)(void (*)(void))rec_start, METH_VARARGS | METH_KEYWORDS,
     "start(mode=None, ops=None, all_threads=False): record launches from now on."},
    {"stop", (PyCFunction)rec_stop, METH_NOARGS, "Stop recording."},
    {"drain", (PyCFunction)(void (*)(void))rec_drain, METH_VARARGS | METH_KEYWORDS,
     "drain(*, wait=True): move complete launches from the ring to the store, with their GPU hashes "
     "(collected first: one device synchronization when any is in flight); returns the stored count. "
     "wait=False never synchronizes: it takes the hashes already read back, begins reading back the "
     "rest, and stops at the first launch still waiting for one (held_from)."},
    {"settle", (PyCFunction)(void (*)(void))rec_settle, METH_VARARGS | METH_KEYWORDS,
     "settle(*, wait=True): GPU hashes into the ring's records without draining it: all of them (one device "
     "synchronization when any is in flight), or wait=False those already read back (the rest begin "
     "reading back)."},
    {"digest", (PyCFunction)(void (*)(void))rec_digest, METH_VARARGS | METH_KEYWORDS,
     "digest(start, stop, ticket=None) -> RangeDigest(digest, recorded) of the launches with launch index in [start, "
     "stop), stored or still in the ring (the same digest as _C.range_digest over them once stored), or None "
     "while one of them waits for its GPU hashes or is being written (Note [Steps held in the ring])."},
    {"discard", (PyCFunction)rec_discard, METH_O,
     "discard(launch_index) -> count: drop every stored launch and every launch in the ring before "
     "launch_index, without draining the ring (views detach)."},
    {"clear", (PyCFunction)rec_clear, METH_NOARGS, "Forget every launch and counter."},
    {"forget", (PyCFunction)rec_forget, METH_O,
     "forget(n): drop the oldest n stored launches; the rest move down by n (views detach)."},
    {"set_ops", (PyCFunction)rec_set_ops, METH_O,
     "set_ops(ops): while recording, the operators list that launches are placed in."},
    {"splice", (PyCFunction)rec_splice, METH_VARARGS,
     "splice(ops, items, merged): ops[:] = items, with `merged` kernel records among them."},
    {"launch", (PyCFunction)rec_launch, METH_O, "launch(i): view of stored launch i."},
    {"position", (PyCFunction)rec_position, METH_O,
     "position(launch_index) -> the index of the first stored launch whose launch_index is >= launch_index "
     "(len(self) when none is): a binary search over the stored launches, in launch order."},
    {"stats", (PyCFunction)rec_stats, METH_NOARGS, "Counters: launches, dropped, errors, ..."},
    {"problem_counts", (PyCFunction)rec_problem_counts, METH_NOARGS,
     "problem_counts() -> ProblemCounts: dropped, errors, outputs_skipped, readonly_changed, hash_unsupported."},
    {"problem_state", (PyCFunction)rec_problem_state, METH_NOARGS,
     "problem_state() -> bytes: problem_counts()' counters packed (equal bytes: no counter moved)."},
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