/* kd_write_guard.c - deferred GPU work guarded from C++ against aten ops that
 * would overwrite it, with no Python dispatch mode (kernels_only).
 *
 * Note [C++ write guard]
 * Deferring GPU hashes (Note [Deferred GPU work]) is safe only while every
 * writer of a queued tensor is seen before it writes.  Under a dispatch mode
 * kd_dispatch.c sees every aten op on the mode's thread; in kernels_only no
 * mode is pushed, so this guard sees them instead: a global RecordFunction
 * start callback (kd_torch.cpp) that the dispatcher calls before every op on
 * every thread, with the op's boxed inputs.
 *   - Cheap when idle.  The callback first reads one atomic (`armed`, set by
 *     the queue while it holds work, kd_write_guard_arm) and returns at once
 *     when nothing is queued; it is installed only from the first deferred
 *     entry of a kernels_only recording on (kd_defer.c) until deferral is set
 *     off, so a recording that never hashes on the GPU never pays for it.
 *     While installed, torch boxes every op's inputs for it (RecordFunction's
 *     own cost, per op).
 *   - What an op writes.  From its schema: the arguments whose alias_info is
 *     a write (in-place self, out=, mutable tensor lists).  Their byte extents
 *     on the device's current stream go to kd_defer_guard (GIL taken with
 *     PyGILState_Ensure only then: the queue is GIL-protected, and the
 *     callback runs on autograd's threads without it), which flushes the queue
 *     when they overlap queued work or run on another stream.  An op with no
 *     schema, a vararg schema, inputs that do not match it, a written value
 *     that is no tensor, or a written tensor without strided storage: the
 *     queue is flushed before it runs.  So is an op that takes tensors and
 *     declares no write, outside the namespaces whose schemas declare every
 *     mutation (aten, prim, prims, _c10d_functional): the eager collectives'
 *     schemas (c10d::allreduce_(Tensor[] tensors, ...)) do not annotate the
 *     tensors NCCL writes, and a custom op's may not.  Ops that write only CPU memory take
 *     no GIL.  Ops run by intra-op workers (at::parallel_for) are parts of an
 *     op already guarded, and their caller may hold the GIL: skipped.
 *   - Writers still unseen.  Anything that writes GPU memory outside the
 *     dispatcher: raw CUDA from C extensions that are not torch ops (a pybind
 *     function calling its own kernel on a tensor's data_ptr), Triton kernels
 *     launched directly rather than through Inductor's launcher that kdebug
 *     hooks (user @triton.jit kernels called eagerly), cudaMemcpy / NCCL
 *     calls issued by other libraries (CuPy, raw NCCL), and custom ops whose
 *     schema does not declare what they mutate.  A queued hash of a tensor
 *     such a writer overwrites would hash the later bytes.  kdebug cannot
 *     see these; DebugMode(batch_gpu_work=False) hashes each tensor right
 *     after its kernel (the behaviour of kernels_only before this guard).
 *     Storage replaced under a queued tensor (set_, resize_ outside the
 *     dispatcher) is detected at flush (the hash is counted as missing).
 *   - Paused between windows.  Installed, the callback costs every op on
 *     every thread RecordFunction's slow path and the boxing of its inputs
 *     (on the CI host: an eager add_ 2.5 us alone, 3.4-4.2 us with such a
 *     callback, 2.5 again with it disabled), armed or not.  A flush from
 *     Python (_C.defer_flush: a flight recorder's optimizer window closing),
 *     a recording's end and the end of a compiled graph's call (the
 *     outermost on its thread: its last kernels' hashes go then, before the
 *     eager ops that follow it, autograd's and the optimizer's) mark quiet
 *     points: when one leaves the queue empty,
 *     the callback is disabled in torch (kd_write_guard_idle) until the next
 *     entry is queued, which enables it before the entry is armed (in
 *     kd_defer.c's queued(), after admit()'s flush, whose reference drops
 *     may run Python code that reaches another quiet point); if torch
 *     refuses to enable it, the entry is launched at once instead of
 *     waiting unguarded.  A flight
 *     recorder that hashes only its optimizer window so pays the guard on
 *     that window's ops alone, not on every op of the forward and backward.
 *     Flushes on the launch path (a hazard, another stream) do not pause:
 *     the next kernel's outputs follow at once, and a pause and resume cost
 *     about 2 us.  An op already past its start on another thread when an
 *     entry is queued is not guarded either way (as with `armed`): it began
 *     before the entry existed.  The probe never pauses.
 *   - Tests: kdebug.testing.write_guard_probe() installs the guard at level 2
 *     (every write, CPU too) and logs what it saw, so the CPU suite checks
 *     the schema reading on real ops.
 */
#include "kd_write_guard.h"

#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "kd_defer.h"
#include "kd_record.h"
#include "kd_shim.h"

#define KD_PROBE_MAX 4096

static atomic_int armed;   /* deferred GPU work is queued */
static atomic_int probing; /* kdebug.testing.write_guard_probe is on */
static int refs;           /* GIL */
static int paused;         /* GIL: the installed callback is disabled in torch (Paused between windows) */
static char error[256];

typedef struct probe_entry {
    char op[96];
    kd_write_range w;
    int unbounded;
} probe_entry;

static struct {
    probe_entry e[KD_PROBE_MAX];
    int n;
    uint64_t lost;
} probe; /* GIL */

static struct {
    uint64_t ops, ranges, unbounded_flushes, pauses, resumes;
} st; /* GIL */

/* Without the GIL: how much the callback should look at (kd_write_level_fn). */
static int level(void)
{
    if (atomic_load_explicit(&probing, memory_order_relaxed))
        return 2;
    return atomic_load_explicit(&armed, memory_order_acquire) ? 1 : 0;
}

static void probe_log(const char *op, const kd_write_range *w, int unbounded)
{
    if (probe.n >= KD_PROBE_MAX) {
        probe.lost++;
        return;
    }
    probe_entry *p = &probe.e[probe.n++];
    snprintf(p->op, sizeof p->op, "%s", op);
    if (w != NULL)
        p->w = *w;
    else
        memset(&p->w, 0, sizeof p->w);
    p->unbounded = unbounded;
}

/* With the GIL, before op runs: flush what it would overwrite (kd_write_guard_fn). */
static void guard(const char *op, const kd_write_range *w, int n, int unbounded)
{
    st.ops++;
    if (atomic_load_explicit(&probing, memory_order_relaxed)) {
        if (unbounded)
            probe_log(op, NULL, 1);
        for (int i = 0; i < n; i++)
            probe_log(op, &w[i], 0);
    }
    if (!kd_defer_pending())
        return;
    if (unbounded) {
        st.unbounded_flushes++;
        kd_defer_flush();
        return;
    }
    for (int i = 0; i < n; i++)
        if (w[i].device_type == KD_DEV_CUDA) {
            st.ranges++;
            kd_defer_guard(w[i].device_index, w[i].stream, w[i].lo, w[i].hi);
        }
}

int kd_write_guard_acquire(void)
{
    if (kd_write_guard_idle(0) != 0) /* a paused callback serves this user too: enabled, or refused */
        return -1;
    if (kd_shim_write_guard_add(level, guard) != 0) {
        snprintf(error, sizeof error, "kdebug could not install its write guard: %s", kd_shim_last_error());
        return -1;
    }
    refs++;
    return 0;
}

int kd_write_guard_release(void)
{
    if (refs <= 0)
        return 0;
    if (kd_shim_write_guard_remove() != 0) {
        snprintf(error, sizeof error, "kdebug could not remove its write guard: %s", kd_shim_last_error());
        return -1;
    }
    refs--;
    if (refs == 0)
        paused = 0; /* removed: a later install starts enabled */
    return 0;
}

int kd_write_guard_idle(int idle)
{
    int want = idle && !atomic_load_explicit(&probing, memory_order_relaxed);
    if (refs == 0 || want == paused)
        return 0;
    if (kd_shim_write_guard_pause(want) != 0) {
        /* a failed pause leaves it enabled: correct, only slower; a failed resume is the caller's to handle */
        snprintf(error, sizeof error, "kdebug could not %s its write guard: %s", want ? "pause" : "resume",
                 kd_shim_last_error());
        return want ? 0 : -1;
    }
    paused = want;
    if (want)
        st.pauses++;
    else
        st.resumes++;
    return 0;
}

const char *kd_write_guard_error(void) { return error; }

void kd_write_guard_arm(int pending)
{
    atomic_store_explicit(&armed, pending ? 1 : 0, memory_order_release);
}

/* _write_guard_probe(on) -> previous: level-2 guarding with a log (tests). */
static PyObject *mod_probe(PyObject *m, PyObject *arg)
{
    (void)m;
    int on = PyObject_IsTrue(arg);
    if (on < 0)
        return NULL;
    int prev = atomic_load(&probing);
    if (on && !prev) {
        if (kd_write_guard_acquire() != 0) { /* enabled first if paused: the probe sees every op */
            PyErr_SetString(PyExc_RuntimeError, error);
            return NULL;
        }
        probe.n = 0;
        probe.lost = 0;
        atomic_store(&probing, 1);
    } else if (!on && prev) {
        atomic_store(&probing, 0);
        if (kd_write_guard_release() != 0) {
            PyErr_SetString(PyExc_RuntimeError, error);
            return NULL;
        }
    }
    return PyBool_FromLong(prev);
}

/* _write_guard_log() -> [(op, device_type, device_index, stream, lo, hi, unbounded)], lost: what the
 * probe saw since it was turned on (and clears it); read by kdebug.testing into named records. */
static PyObject *mod_probe_log(PyObject *m, PyObject *unused)
{
    (void)m, (void)unused;
    PyObject *l = PyList_New(probe.n);
    for (int i = 0; l != NULL && i < probe.n; i++) {
        const probe_entry *p = &probe.e[i];
        PyObject *d = Py_BuildValue("{sssisisKsKsKsO}", "op", p->op, "device_type", p->w.device_type,
                                    "device_index", p->w.device_index, "stream",
                                    (unsigned long long)p->w.stream, "lo", (unsigned long long)p->w.lo, "hi",
                                    (unsigned long long)p->w.hi, "unbounded", p->unbounded ? Py_True : Py_False);
        if (d == NULL)
            Py_CLEAR(l);
        else
            PyList_SET_ITEM(l, i, d);
    }
    PyObject *r = l ? Py_BuildValue("{sNsK}", "writes", l, "lost", (unsigned long long)probe.lost) : NULL;
    probe.n = 0;
    probe.lost = 0;
    return r;
}

static PyObject *mod_stats(PyObject *m, PyObject *unused)
{
    (void)m, (void)unused;
    return Py_BuildValue("{sisKsKsKsKsOsKsK}", "installed", refs, "ops", (unsigned long long)st.ops, "ranges",
                         (unsigned long long)st.ranges, "unbounded_flushes",
                         (unsigned long long)st.unbounded_flushes, "op_epoch",
                         (unsigned long long)kd_shim_op_epoch(), "paused", paused ? Py_True : Py_False, "pauses",
                         (unsigned long long)st.pauses, "resumes", (unsigned long long)st.resumes);
}

static PyMethodDef methods[] = {
    {"_write_guard_probe", mod_probe, METH_O,
     "_write_guard_probe(on) -> previous: the write guard logs every op's writes (tests)."},
    {"_write_guard_log", mod_probe_log, METH_NOARGS,
     "_write_guard_log() -> {'writes': [...], 'lost': n}: what the probe saw (cleared)."},
    {"write_guard_stats", mod_stats, METH_NOARGS,
     "write_guard_stats() -> counters of the C++ write guard (Note [C++ write guard])."},
    {NULL, NULL, 0, NULL},
};

/* Adds the guard's functions to module m; -1 with an exception. */
int kd_write_guard_module_init(PyObject *m) { return PyModule_AddFunctions(m, methods); }
