/* kd_graph.c - recording the kernels of CUDA graphs: at capture and at every
 * replay.
 *
 * Note [CUDA graph replays]
 * A CUDA graph (torch.cuda.CUDAGraph: Inductor's cudagraph trees under
 * mode="reduce-overhead", or the user's own) replays its kernels without any
 * Python, so the launch hook never sees a replay.  kdebug records them so:
 *  - Capture.  kdebug/cudagraphs.py wraps CUDAGraph.capture_begin /
 *    capture_end; between them this thread's kd_tls_graph is the graph.  The
 *    wrapper's launches still run the launch hook: each is recorded as usual,
 *    flagged KD_LF_CAPTURED (it did not run: its record has no values), and a
 *    copy of its record becomes the graph's template.  Its hash kernels are
 *    captured into the graph itself (kd_cuda_hash_enqueue_graph): result k of
 *    the graph goes to global result index base + k, where base is read on
 *    the device when the kernel runs, from the graph's device buffer.
 *    Deferred GPU work is flushed first and off during the capture, and
 *    record_outputs skips captured launches (a copy captured into the graph
 *    would be overwritten by every replay): counted per graph.
 *  - Replay.  The CUDAGraph.replay wrapper calls kd_mod_graph_replay before
 *    the replay: it reserves the graph's K result indices in the device's
 *    result ring (kd_cuda_hash_reserve: no synchronization unless the ring
 *    is full, as for any hash), queues one one-thread kernel on the replay's
 *    stream that writes their first index to the graph's base (-1 when no
 *    room could be reserved: the graph's hash kernels then write nothing;
 *    after a replay on another stream it first waits for that one), and copies
 *    the template's records into the active recorder's ring, flagged
 *    KD_LF_REPLAYED with the replay index, each hash waiting for its result
 *    (Note [GPU hash results]).  Per replay: one tiny kernel launch, no
 *    synchronization, no hashing on the host; the host's per-kernel work is
 *    the copy of each launch's record (120-byte payloads) and the
 *    registration of its results.  The K indices stay held until the wrapper
 *    says the replay was queued (kd_mod_graph_replay_queued): a collect in
 *    between stops before them (Note [Results in flight] in kd_inflight.h).
 *  - What a graph holds that kdebug cannot describe.  At capture_end the
 *    graph's nodes are counted (cudaGraphGetNodes): kernel nodes beyond the
 *    recorded launches and kdebug's own hash kernels (cuBLAS / cuDNN / aten
 *    kernels, whose results are not hashed in the graph), and other work
 *    nodes (copies, memsets), are reported per graph (kdebug.cudagraphs).
 *  - A graph captured while kdebug was not recording has no template: its
 *    replays are counted as unrecorded (kdebug says so; the recording is
 *    incomplete).
 * The replay's records are the active recorder's, whichever recorder saw the
 * capture: the templates hold no recorder state (names are ids in the
 * process-wide string table).  All of this runs with the GIL held.
 */
#include "kd_clock.h"
#include "kd_graph.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kd_args.h"
#include "kd_cuda_graph.h"
#include "kd_defer.h"
#include "kd_grow.h"
#include "kd_launch.h"
#include "kd_launch_ctx.h"
#include "kd_launch_hash.h"
#include "kd_recorder.h"
#include "kd_results.h"

#define KD_GRAPH_PARTIALS (1 << 16) /* norm / stats partial sums per graph */

struct kd_graph {
    uint32_t id;          /* 1, 2, ... in capture order */
    int device;
    int live;             /* 0 once released */
    int capturing;
    int nested;           /* another capture began inside this one on its thread */
    int defer_was;        /* deferral before the capture */
    uint64_t stream;      /* the capture stream */
    void *mem;            /* device: [int64 base][int64][partials] */
    int64_t pnext;        /* partials used */
    int64_t nhash;        /* K: results per replay */
    kd_payload *tmpl;     /* the captured launches' records, back to back */
    uint64_t tmpl_n, tmpl_cap;
    uint64_t launches;    /* launches in the template */
    uint64_t hash_kernels;/* kdebug's hash kernels captured */
    uint64_t unrecorded;  /* launches during the capture that could not be recorded */
    uint64_t hash_errors; /* hashes that could not be captured */
    uint64_t outputs_skipped;
    int64_t kernel_nodes, other_nodes; /* counted at capture_end (-1: unknown) */
    uint64_t replays;
    uint64_t replay_errors;
    int replayed;         /* a replay's base has been set ... */
    uint64_t last_stream; /* ... on this stream */
    char error[200];
};

_Thread_local kd_graph *kd_tls_graph;

static kd_graph **graphs; /* by id - 1 */
static uint64_t ngraphs, graphs_cap;
static uint64_t unknown_replays; /* replays of graphs captured without kdebug */
/* Graphs made + their replays + unknown replays: what kdebug/cudagraphs.py's
 * since() reports is empty when it did not move (graph_activity()). */
static uint64_t activity;
static uint64_t released;
static int open_captures; /* captures begun (capture_started) and not yet ended */
/* Buffers of graphs released while a capture was open (cudaFree is not
 * allowed then: it would break that capture), freed at the next release or
 * capture_begin with none open. */
static struct {
    void *mem;
    int device;
} *to_free;
static uint64_t nto_free, to_free_cap;

/* Frees g's device buffer now, or later when a capture is open. */
static void free_mem(int device, void *mem)
{
    if (mem == NULL)
        return;
    if (open_captures > 0 && kd_grow((void **)&to_free, &to_free_cap, nto_free + 1, sizeof *to_free) == 0) {
        to_free[nto_free].mem = mem;
        to_free[nto_free].device = device;
        nto_free++;
        return;
    }
    /* out of memory for the list: freed now (the lesser harm than a leak per graph) */
    kd_cuda_graph_free(device, mem); /* cudaFree waits for the device: the graph is gone */
}

/* Frees the buffers free_mem kept, when no capture is open. */
static void free_pending(void)
{
    if (open_captures > 0)
        return;
    for (uint64_t i = 0; i < nto_free; i++)
        kd_cuda_graph_free(to_free[i].device, to_free[i].mem);
    nto_free = 0;
}

static int64_t *dev_base(kd_graph *g) { return (int64_t *)g->mem; }
static double *dev_partials(kd_graph *g) { return (double *)((char *)g->mem + 2 * sizeof(int64_t)); }

static void set_error(kd_graph *g, const char *msg)
{
    if (!g->error[0])
        snprintf(g->error, sizeof g->error, "%s", msg);
}

/* g's capture ended without capture_end (abandoned after an error, or
 * released): this thread stops capturing into it.  restore_defer: deferral
 * goes back to what it was before the capture (not on the launch path, where
 * the flush it may cause must not run). */
static void capture_closed(kd_graph *g, int restore_defer)
{
    if (g->capturing) {
        g->capturing = 0;
        open_captures--;
        if (restore_defer)
            kd_defer_set(g->defer_was);
    }
    if (kd_tls_graph == g)
        kd_tls_graph = NULL;
}

int kd_graph_hash(kd_graph *g, int device, uint64_t stream, int kinds, const kd_cuda_tensor *t, int n,
                  int64_t *k0, const char **error)
{
    if (!kd_cuda_stream_capturing(stream)) {
        /* a kernel queued here would run now, on the graph's stale base:
         * into other hashes' result slots */
        *error = "a hash on a stream that is not capturing the CUDA graph";
        g->hash_errors += (uint64_t)n;
        if (!kd_cuda_stream_capturing(g->stream)) {
            set_error(g, "the capture ended without capture_end (abandoned): later launches are not the graph's");
            capture_closed(g, 0);
        }
        return -1;
    }
    if (g->nested) {
        *error = "a second CUDA graph capture began inside this one on the same thread";
        g->hash_errors += (uint64_t)n;
        return -1;
    }
    if (device != g->device || g->mem == NULL) {
        *error = "a hash on another device than the CUDA graph's";
        g->hash_errors += (uint64_t)n;
        return -1;
    }
    if (g->nhash + n > KD_CUDA_CAPACITY / 2) {
        *error = "the CUDA graph has more hashed tensors than kdebug's result ring holds per replay";
        g->hash_errors += (uint64_t)n;
        set_error(g, *error);
        return -1;
    }
    int rc = kd_cuda_hash_enqueue_graph(device, stream, kinds, t, n, dev_base(g), g->nhash, dev_partials(g),
                                        KD_GRAPH_PARTIALS, &g->pnext);
    if (rc != 0) {
        *error = kd_cuda_last_error();
        g->hash_errors += (uint64_t)n;
        set_error(g, *error);
        return -1;
    }
    *k0 = g->nhash;
    g->nhash += n;
    g->hash_kernels++;
    return 0;
}

void kd_graph_add_launch(kd_graph *g, kd_recorder *r, uint64_t first, uint32_t n)
{
    if (!g->live) { /* released while another thread still captured into it */
        g->unrecorded++;
        return;
    }
    if (kd_grow((void **)&g->tmpl, &g->tmpl_cap, g->tmpl_n + n, sizeof(kd_payload)) != 0) {
        g->unrecorded++;
        set_error(g, "out of memory for the CUDA graph's launch records");
        return;
    }
    kd_payload *dst = &g->tmpl[g->tmpl_n];
    for (uint32_t i = 0; i < n; i++)
        memcpy(&dst[i], kd_ring_payload(r->ring, first + i), sizeof(kd_payload));
    g->tmpl_n += n;
    g->launches++;
    /* the ring's record: captured, did not run, so no values */
    kd_launch *h = &kd_ring_payload(r->ring, first)->launch;
    h->flags |= KD_LF_CAPTURED;
    h->graph_id = g->id;
    kd_arg_iter it = kd_args_begin(dst, n);
    while (kd_args_next(&it))
        if (it.hash != NULL) {
            kd_hash_rec *rh = &kd_ring_payload(r->ring, first + it.hash_off)->hash;
            rh->flags &= (uint8_t)~(KD_HF_PRE | KD_HF_POST | KD_HF_PENDING_PRE | KD_HF_PENDING_POST |
                                    KD_HF_CHECKED);
        }
}

void kd_graph_note_unrecorded(kd_graph *g) { g->unrecorded++; }

void kd_graph_note_hash_error(kd_graph *g) { g->hash_errors++; }

int kd_graph_any_open(void) { return open_captures > 0; }

void kd_graph_note_output_skipped(kd_graph *g) { g->outputs_skipped++; }

/* ---- Python-facing ---- */

static kd_graph *graph_of(PyObject *handle)
{
    unsigned long long id = PyLong_AsUnsignedLongLong(handle);
    if (PyErr_Occurred())
        return NULL;
    if (id == 0 || id > ngraphs || !graphs[id - 1]->live) {
        PyErr_Format(PyExc_ValueError, "no live kdebug CUDA graph %llu", id);
        return NULL;
    }
    return graphs[id - 1];
}

/* graph_capture_begin(device, stream) -> handle (0: no recording on this
 * thread, or a capture already open on it: nothing kept): before
 * CUDAGraph.capture_begin (allocates the graph's device buffer, flushes
 * deferred work). */
PyObject *kd_mod_graph_capture_begin(PyObject *m, PyObject *args)
{
    (void)m;
    int device;
    unsigned long long stream;
    if (!PyArg_ParseTuple(args, "iK", &device, &stream))
        return NULL;
    if (kd_tls_graph != NULL) {
        /* counted, not raised (the program's capture goes on): the inner graph
         * stays unknown (its replays are counted), and the outer one, whose
         * template now gets the inner capture's launches too, captures no more
         * hashes (they would land in the inner graph, on the outer one's slots) */
        kd_graph *outer = kd_tls_graph;
        outer->nested = 1;
        outer->unrecorded++;
        set_error(outer, "a second CUDA graph was captured inside this one on the same thread: "
                         "its launches are mixed into this graph's records");
        return PyLong_FromLong(0);
    }
    free_pending(); /* before the capture begins */
    kd_recorder *r = kd_active_recorder();
    if (r == NULL || !r->started)
        return PyLong_FromLong(0); /* not recording: the graph stays unknown (its replays are counted) */
    kd_defer_flush();
    if (kd_grow((void **)&graphs, &graphs_cap, ngraphs + 1, sizeof(kd_graph *)) != 0)
        return PyErr_NoMemory();
    kd_graph *g = calloc(1, sizeof *g);
    if (g == NULL)
        return PyErr_NoMemory();
    g->device = device;
    g->live = 1;
    g->stream = stream;
    g->kernel_nodes = g->other_nodes = -1;
    g->mem = kd_cuda_graph_alloc(device, KD_GRAPH_PARTIALS);
    if (g->mem == NULL) {
        set_error(g, kd_cuda_graph_last_error());
    } else if (kd_cuda_hash_prepare(device) != 0) {
        /* the result ring, now: its first allocation inside the capture would break it */
        set_error(g, kd_cuda_last_error());
        kd_cuda_graph_free(device, g->mem);
        g->mem = NULL; /* kd_graph_hash refuses: counted as hash errors */
    }
    graphs[ngraphs++] = g;
    activity++;
    g->id = (uint32_t)ngraphs;
    return PyLong_FromUnsignedLong(g->id);
}

/* graph_capture_started(handle, stream): the capture has begun on `stream`:
 * launches on this thread go to the graph from here. */
PyObject *kd_mod_graph_capture_started(PyObject *m, PyObject *args)
{
    (void)m;
    PyObject *handle;
    unsigned long long stream;
    if (!PyArg_ParseTuple(args, "OK", &handle, &stream))
        return NULL;
    kd_graph *g = graph_of(handle);
    if (g == NULL)
        return NULL;
    g->stream = stream;
    if (!g->capturing)
        open_captures++;
    g->capturing = 1;
    g->defer_was = kd_defer_set(0);
    kd_tls_graph = g;
    Py_RETURN_NONE;
}

/* One graph's counters, as a dict (kdebug/cudagraphs.py makes a GraphInfo of it). */
static PyObject *stats_one(kd_graph *g)
{
    return Py_BuildValue(
        "{s:k,s:i,s:K,s:K,s:K,s:L,s:K,s:K,s:K,s:L,s:L,s:K,s:s,s:O}", "graph_id", (unsigned long)g->id,
        "device", g->device, "launches", (unsigned long long)g->launches, "hash_kernels",
        (unsigned long long)g->hash_kernels, "unrecorded", (unsigned long long)g->unrecorded, "hashes",
        (long long)g->nhash, "hash_errors", (unsigned long long)g->hash_errors, "outputs_skipped",
        (unsigned long long)g->outputs_skipped, "replays", (unsigned long long)g->replays, "kernel_nodes",
        (long long)g->kernel_nodes, "other_nodes", (long long)g->other_nodes, "replay_errors",
        (unsigned long long)g->replay_errors, "error", g->error,
        "live", g->live ? Py_True : Py_False);
}

/* graph_capture_end(handle) -> dict: before CUDAGraph.capture_end (the
 * capture is still open: its nodes are counted). */
PyObject *kd_mod_graph_capture_end(PyObject *m, PyObject *handle)
{
    (void)m;
    kd_graph *g = graph_of(handle);
    if (g == NULL)
        return NULL;
    if (g->capturing) {
        if (kd_cuda_graph_count_nodes(g->stream, &g->kernel_nodes, &g->other_nodes) != 0) {
            g->kernel_nodes = g->other_nodes = -1;
            set_error(g, kd_cuda_graph_last_error());
        }
        g->capturing = 0;
        open_captures--;
        kd_defer_set(g->defer_was);
    }
    if (kd_tls_graph == g)
        kd_tls_graph = NULL;
    return stats_one(g);
}

/* Copies g's template into r's ring as replay `replay` whose results start at
 * global index `base` (base < 0: no hashes). */
static void emit_replay(kd_graph *g, kd_recorder *r, uint64_t replay, int64_t base, uint64_t stream)
{
    uint64_t off = 0;
    uint64_t now = kd_now_ns();
    kd_launch_ctx *ctx = r->ring_objs != NULL ? kd_launch_ctx_get() : NULL;
    while (off < g->tmpl_n) {
        const kd_payload *src = &g->tmpl[off];
        uint32_t n = (uint32_t)src->launch.nslots + 1;
        uint64_t first;
        if (kd_ring_reserve(r->ring, n, &first) != 0) { /* refused: counted by the ring */
            off += n;
            continue;
        }
        for (uint32_t i = 0; i < n; i++)
            memcpy(kd_ring_payload(r->ring, first + i), &src[i], sizeof(kd_payload));
        /* store_original_args: a replay keeps no argument objects; a lapped
         * launch's objects left in these slots would be drained as the
         * replay's.  Taken out now, dropped after the commit (as
         * kd_launch_begin does: no Python code runs in between). */
        uint32_t nreleased = 0;
        for (uint32_t i = 0; r->ring_objs != NULL && i < n; i++) {
            PyObject **slot = &r->ring_objs[(first + i) & r->ring->mask];
            if (*slot == NULL)
                continue;
            if (ctx != NULL && nreleased < KD_BUILD_SLOTS)
                ctx->released[nreleased++] = *slot;
            /* else (no memory for this thread's context): leaked, never shown */
            *slot = NULL;
        }
        kd_launch *h = &kd_ring_payload(r->ring, first)->launch;
        h->flags = (uint8_t)((h->flags & ~KD_LF_CAPTURED) | KD_LF_REPLAYED);
        h->graph_id = g->id;
        h->replay_index = replay;
        h->launch_index = r->next_launch_index++;
        h->stream = stream;
        h->thread_id = (uint64_t)PyThread_get_thread_ident();
        h->t_start_ns = h->t_end_ns = now;
        Py_ssize_t nops = (r->ops != NULL && PyList_Check(r->ops)) ? PyList_GET_SIZE(r->ops) - r->merged : 0;
        h->py_index = nops > 0 ? (uint64_t)nops : 0;
        kd_arg_iter it = kd_args_begin(src, n);
        while (kd_args_next(&it)) {
            if (it.hash == NULL)
                continue;
            kd_hash_rec *rh = &kd_ring_payload(r->ring, first + it.hash_off)->hash;
            rh->flags &= (uint8_t)~(KD_HF_PRE | KD_HF_POST | KD_HF_PENDING_PRE | KD_HF_PENDING_POST);
            for (int w = 0; w < 2; w++) {
                uint8_t pend = (uint8_t)(w ? KD_HF_PENDING_POST : KD_HF_PENDING_PRE);
                if (!(it.hash->flags & pend))
                    continue;
                rh->flags |= (uint8_t)(w ? KD_HF_POST : KD_HF_PRE);
                kd_await_gpu_result(r, first + it.hash_off, w, g->device,
                                    base < 0 ? -1 : base + (int64_t)it.hash->bitwise[w],
                                    base < 0 ? "the replay's hash results could not be reserved" : NULL);
            }
        }
        kd_ring_commit(r->ring, first, n);
        for (uint32_t i = 0; i < nreleased; i++)
            Py_DECREF(ctx->released[i]);
        off += n;
    }
}

/* Note [Results in flight]: this thread's replay whose result indices are
 * reserved and whose graph is not queued yet (one at a time: the wrapper
 * calls graph_replay, the replay, then graph_replay_queued). */
static _Thread_local struct {
    int device;
    int64_t first; /* -1: none held */
} tls_held = {0, -1};

static void end_held(int never)
{
    if (tls_held.first >= 0) {
        kd_cuda_hash_queued(tls_held.device, tls_held.first, never);
        tls_held.first = -1;
    }
}

/* Note [Results in flight]: reads back every GPU hash result taken before
 * the call, waiting (the GIL released, at most KD_SETTLE_NS) while another
 * thread's replay holds results before them; results taken later, and this
 * thread's own held replay (queued only after this returns), are not waited
 * for.  0, or -1: a CUDA error, or the other replay never said it was queued
 * in time (its results and those after them stay to be read);
 * kd_collect_gpu_error() says which. */
#define KD_SETTLE_NS 5000000000ull
static int collect_timed_out; /* GIL */

const char *kd_collect_gpu_error(void)
{
    return collect_timed_out ? "a CUDA graph replay on another thread held GPU hash results for more than 5 s"
                             : kd_cuda_last_error();
}

int kd_collect_gpu_results(void)
{
    collect_timed_out = 0;
    int64_t marks[64];
    kd_cuda_hash_marks(marks);
    if (tls_held.first >= 0 && tls_held.device >= 0 && tls_held.device < 64 && tls_held.first < marks[tls_held.device])
        marks[tls_held.device] = tls_held.first;
    uint64_t t0 = 0;
    for (;;) {
        if (kd_cuda_hash_collect() != 0)
            return -1;
        if (kd_cuda_hash_collected_to(marks))
            return 0;
        uint64_t now = kd_clock_monotonic_ns(); /* a timeout: the clock itself, which never steps back */
        if (t0 == 0)
            t0 = now;
        else if (now - t0 > KD_SETTLE_NS) {
            collect_timed_out = 1;
            return -1;
        }
        Py_BEGIN_ALLOW_THREADS
        struct timespec ts = {0, 100000}; /* 0.1 ms: the other replay needs the GIL back to say it was queued */
        nanosleep(&ts, NULL);
        Py_END_ALLOW_THREADS
    }
}

/* graph_replay_queued(ok): right after CUDAGraph.replay returned (ok true)
 * or raised (ok false: the graph's hash results will never be written). */
PyObject *kd_mod_graph_replay_queued(PyObject *m, PyObject *ok)
{
    (void)m;
    int yes = PyObject_IsTrue(ok);
    if (yes < 0)
        return NULL;
    end_held(!yes);
    Py_RETURN_NONE;
}

/* graph_replay(handle, stream) -> replay index: right before CUDAGraph.replay
 * on `stream` (the current stream, where the replay runs).  Without an active
 * recorder nothing is recorded and -1 is returned. */
PyObject *kd_mod_graph_replay(PyObject *m, PyObject *args)
{
    (void)m;
    PyObject *handle;
    unsigned long long stream;
    if (!PyArg_ParseTuple(args, "OK", &handle, &stream))
        return NULL;
    kd_graph *g = graph_of(handle);
    if (g == NULL)
        return NULL;
    kd_defer_flush(); /* the replay's kernels are writers kdebug does not see (Note [Deferred GPU work]) */
    end_held(1); /* a replay before it never said it was queued: its results are not trusted */
    uint64_t replay = g->replays++;
    activity++;
    int64_t base = -1;
    if (g->nhash > 0) {
        /* the base is set even with no recorder: the graph's hash kernels run
         * every replay and need room in the result ring */
        base = kd_cuda_hash_reserve(g->device, g->nhash);
        const char *why = base < 0 ? kd_cuda_last_error() : NULL;
        if (base >= 0)
            tls_held.device = g->device, tls_held.first = base;
        /* CUDA runs the launches of one graph in order whatever their
         * streams, but the base is written outside the graph: on another
         * stream than the previous replay's, it waits for that replay, which
         * reads the base it was given until its last hash kernel ran */
        if (g->replayed && g->last_stream != stream &&
            kd_cuda_stream_wait(g->device, g->last_stream, stream) != 0 && why == NULL) {
            g->replay_errors++;
            set_error(g, kd_cuda_last_error());
        }
        /* no room: base -1, the graph's hash kernels write nothing (with the
         * previous base they would add into results already read back) */
        if (kd_cuda_graph_set_base(g->device, stream, dev_base(g), base < 0 ? -1 : base) != 0 && why == NULL)
            why = kd_cuda_graph_last_error();
        if (why != NULL) {
            g->replay_errors++;
            set_error(g, why);
            base = -1;
            end_held(1); /* reserved, but the graph was not given the base: nothing writes those results */
        }
        g->replayed = 1;
        g->last_stream = stream;
    }
    kd_recorder *r = kd_active_recorder();
    if (r == NULL || !r->started) {
        /* results nobody waits for are dropped when collected (Note [GPU hash results]) */
        return PyLong_FromLongLong(-1);
    }
    emit_replay(g, r, replay, base, stream);
    return PyLong_FromUnsignedLongLong(replay);
}

/* graph_unknown_replay(): a replay of a graph kdebug did not see captured. */
static PyObject *unknown_replay(PyObject *m, PyObject *unused)
{
    (void)m, (void)unused;
    unknown_replays++;
    activity++;
    Py_RETURN_NONE;
}

/* graph_release(handle): the CUDAGraph is gone; its buffer and template are freed. */
PyObject *kd_mod_graph_release(PyObject *m, PyObject *handle)
{
    (void)m;
    kd_graph *g = graph_of(handle);
    if (g == NULL)
        return NULL;
    capture_closed(g, 1); /* released with its capture open (abandoned): that capture is gone */
    g->live = 0;
    free_mem(g->device, g->mem);
    free_pending();
    g->mem = NULL;
    free(g->tmpl);
    g->tmpl = NULL;
    g->tmpl_n = g->tmpl_cap = 0;
    released++;
    Py_RETURN_NONE;
}

/* graph_stats() -> {"graphs": [dict, ...], "unknown_replays": n} (live and released). */
PyObject *kd_mod_graph_stats(PyObject *m, PyObject *unused)
{
    (void)m, (void)unused;
    PyObject *lst = PyList_New(0);
    for (uint64_t i = 0; lst != NULL && i < ngraphs; i++) {
        PyObject *d = stats_one(graphs[i]);
        if (d == NULL || PyList_Append(lst, d) != 0) {
            Py_XDECREF(d);
            Py_CLEAR(lst);
            break;
        }
        Py_DECREF(d);
    }
    if (lst == NULL)
        return NULL;
    return Py_BuildValue("{s:N,s:K,s:K}", "graphs", lst, "unknown_replays", (unsigned long long)unknown_replays,
                         "released", (unsigned long long)released);
}

/* graph_activity() -> int: grows with every graph kdebug registers, every
 * replay and every unknown replay; 0 while there has been none. */
PyObject *kd_mod_graph_activity(PyObject *m, PyObject *unused)
{
    (void)m, (void)unused;
    return PyLong_FromUnsignedLongLong((unsigned long long)activity);
}

PyObject *kd_mod_graph_unknown_replay(PyObject *m, PyObject *unused) { return unknown_replay(m, unused); }
