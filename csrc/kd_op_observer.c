/* kd_op_observer.c - aten ops recorded from C++ (through kd_torch.cpp's
 * RecordFunction callback) into the launch ring, as records of kind
 * KD_KIND_ATEN.
 *
 * Note [C++ op observer]
 * kdebug's DebugMode records aten ops as upstream does, from a Python
 * TorchDispatchMode (Note [Fast aten-op recording]).  That costs a Python
 * call per op, and kernels_only=True, which pushes no mode, sees no op at
 * all -- not even the extern calls of compiled code (aten::mm.out,
 * convolution, SDPA), where cuBLAS / cuDNN nondeterminism lives.  This path
 * observes ops at the dispatcher instead:
 *
 *   - How.  An at::RecordFunction callback (kd_torch.cpp) with inputs and
 *     outputs, scope FUNCTION: the dispatcher calls it for every op on a
 *     thread that has it, before any dispatch key, with the op's IValues.
 *     It is thread-local (added on the entering thread; torch carries
 *     RecordFunction TLS into autograd's threads with at::ThreadLocalState,
 *     as it carries kdebug's recorder for kernels) or, with
 *     record_all_threads, global: the same threads kernels are recorded
 *     from.  A boxed fallback was rejected: a fallback kernel for a key that
 *     every op passes (e.g. a backend-select or a custom key) must be
 *     registered per dispatch key, may not be legal with other fallbacks
 *     (Python, Functionalize) registered for the same key, replaces rather
 *     than observes, and would have to redispatch itself; RecordFunction is
 *     the dispatcher's own observer and costs nothing while unregistered.
 *   - Which ops.  Only the outermost dispatcher op on a thread (a per-thread
 *     depth counter): RecordFunction sees composite ops *and* what they
 *     decompose into (aten::linear, then aten::t and aten::addmm), and the
 *     autograd-level call and its backend-level redispatch of an op is one
 *     RecordFunction (the dispatcher records each op once, at its first
 *     dispatch).  Upstream's Python mode instead sees ops below autograd
 *     and after CompositeImplicitAutograd decompositions (aten::t,
 *     aten::addmm, not aten::linear).  docs/recording.md lists the
 *     differences.  With KD_OPS_EXTERN only ops issued while a compiled
 *     graph's call runs on the thread (kd_tls_in_graph, set by
 *     kdebug/inductor.py around CompiledFxGraph.__call__): the generated
 *     code's extern calls and its buffer allocations (empty_strided, whose
 *     output is not hashed: its memory is whatever it got).
 *   - The record.  At the op's end, one launch record of kind KD_KIND_ATEN
 *     through the kernel launch path (kd_launch_begin / _end): name
 *     "aten::mm.out", one argument per schema argument (tensor lists one per
 *     tensor, lists / strings / devices by type name only) and one per
 *     output that is no input (in-place and out= results are their written
 *     argument).  Roles come from the schema: arguments it writes are 'W',
 *     everything else 'R'; outputs 'W'.  Under log_tensor_hashes() what the
 *     op wrote is hashed by the same code that hashes kernels (CPU here, CUDA
 *     queued on the current stream): the same values as the Python path's
 *     call.log["hash"].  Because the record is made after the op ran, read
 *     arguments' input hashes are their values before the op (the op did
 *     not write them), and written arguments get no input hash.
 *   - Cost.  With KD_OPS_EXTERN the callback is off on a thread outside
 *     compiled graph calls (Note [Op observer gated by graph calls]).  Per
 *     op on an observed thread: RecordFunction's own work (it
 *     boxes the inputs and keeps the outputs for every op, nested ones too,
 *     since callbacks that need inputs ask for them), a lookup of the op in
 *     the thread's table (Note [Op info cache] in kd_torch.cpp) at each
 *     outermost op's start and copies of its input IValues into thread
 *     storage (reference counts).  Per recorded op: the GIL, taken once
 *     (torch's bindings release it around the op), the table's lookup again
 *     for the schema (whose names are interned at the op's first record on
 *     the thread: Note [Op names interned once] in kd_torch.cpp), Python
 *     wrappers of the op's tensors (a tensor that came
 *     from Python already has one; a fresh output gets one, an allocation)
 *     and of its int and float arguments, and the launch path's work into
 *     its per-thread buffer and the ring.  No Python object is kept in a
 *     record.  Measured per eager op: benchmarks/bench_ops.py.
 *   - Threads and the GIL.  The record takes the GIL (torch's bindings
 *     release it around an op, so it is free unless another thread holds
 *     it).  Ops inside an intra-op parallel region (at::parallel_for's
 *     workers, which run part of an op whose caller waits for them) are
 *     never recorded, so no worker ever waits for the GIL its caller holds.
 *     The global callback (record_all_threads) is added and removed at run
 *     time, as torch's own profiler does, although record_function.h asks
 *     for global callbacks at start-up; the thread-local one is the default.
 *   - Reentrancy.  kdebug's own work (hashing, record_outputs clones, the
 *     launch path) runs with this thread's launch context busy, and compiles
 *     and autotuning with kd_tls_compiling set: the observer's want() says no
 *     there, so kdebug never records its own ops, and never recurses.
 */
#include "kd_op_observer.h"

#include <stdatomic.h>
#include <string.h>

#include "kd_hook.h"
#include "kd_kernel_info.h"
#include "kd_defer.h"
#include "kd_launch.h"
#include "kd_launch_ctx.h"
#include "kd_module.h"
#include "kd_recorder.h"
#include "kd_shim.h"

#define KD_OP_MAX_ARGS 128

static _Thread_local int kd_tls_in_graph = 0; /* compiled graphs running on this thread */
static atomic_int ops_all_recorders;        /* started recorders with KD_OPS_ALL */

/* Without the GIL: whether this thread may record the op that just ended. */
static int op_want(void)
{
    if (kd_tls_compiling || (kd_tls_launch_ctx != NULL && kd_tls_launch_ctx->busy))
        return 0; /* compiling, or kdebug's own work (Note [C++ op observer]) */
    return kd_tls_in_graph > 0 || atomic_load_explicit(&ops_all_recorders, memory_order_relaxed) > 0;
}

/* Note [Op observer gated by graph calls]
 * RecordFunction boxes an op's inputs and keeps its outputs for every op on a
 * thread whose callbacks ask for them, before any callback can say no: with
 * record_extern_ops that was every eager op of a training step -- the loss,
 * autograd's own ops (an AccumulateGrad detach per parameter), the
 * optimizer's -- although only ops inside a compiled graph's call are
 * recorded (tools/op_cost.py on the 2-core CPU machine: 0.72 us an eager op
 * over no mode; 0.37-0.40 with this gate and its twin).  So the thread-local callback is switched on only
 * where it can record: on a thread that is inside a compiled graph's call
 * (kd_graph_call), or while any recorder of every op (KD_OPS_ALL) is started;
 * otherwise it is disabled on that thread (at::disableCallback: RecordFunction
 * then neither runs it nor boxes for it).  While it is off, a depth-only twin
 * (no inputs, no outputs: a few tens of ns an op) counts the thread's op
 * depth for it, so that the rule stays "outermost op only": a compiled graph
 * called inside an eager op's implementation (a custom op's Python kernel, a
 * wrapper subclass) runs nested in that op, and its ops are not recorded,
 * with the callback switched or not (record_all_threads, another thread's
 * op_path="c++" recording), as upstream's mode does not see them either;
 * without the twin the op that started while the callback was off was not
 * counted and the graph's ops became outermost (found by an adversarial
 * review).  The switch is per thread: torch
 * carries a thread's callbacks, with their state, to autograd's threads, and
 * a compiled backward's call opens the carried copy there the same way.  The
 * global callback (record_all_threads) is not gated: another thread's graph
 * call cannot be seen from here.  kd_shim_op_observer_starts counts the
 * callback's starts per thread (the tests' evidence). */
static void gate_here(void)
{
    int open = kd_tls_in_graph > 0 || atomic_load_explicit(&ops_all_recorders, memory_order_relaxed) > 0;
    if (kd_shim_op_observer_gate(open) < 0 &&
        PyErr_WarnFormat(PyExc_RuntimeWarning, 1, "kdebug could not switch its op observer (it stays as it "
                         "was: ops are still recorded, at their old cost): %s", kd_shim_last_error()) < 0)
        PyErr_Clear(); /* a warning filter turned it into an error: not the program's to handle */
}

/* With the GIL: records one op into this thread's recorder (never raises).
 * Its names come interned (op_intern; Note [Op names interned once] in
 * kd_torch.cpp). */
static void op_record(uint32_t name_id, int empty, PyObject *const *args, const uint32_t *name_ids,
                      const uint8_t *roles, int nargs)
{
    kd_recorder *r = kd_active_recorder();
    if (r == NULL || r->op_mode == KD_OPS_NONE || (r->op_mode == KD_OPS_EXTERN && kd_tls_in_graph == 0))
        return;
    if (nargs > KD_OP_MAX_ARGS)
        nargs = KD_OP_MAX_ARGS;
    uint32_t ids[KD_OP_MAX_ARGS + 1];
    uint8_t rls[KD_OP_MAX_ARGS + 1];
    kd_kernel_info info; /* read by the launch path only: no Python object */
    memset(&info, 0, sizeof info);
    info.kind = KD_KIND_ATEN;
    info.name_id = name_id;
    if (info.name_id == 0) {
        kd_recorder_error(r, "kdebug's string table is full: an aten op was not recorded");
        r->unrecorded++;
        return;
    }
    uint64_t stream = 0;
    int have_dev = 0;
    for (int i = 0; i < nargs; i++) {
        ids[i] = name_ids[i];
        /* an empty* op's output holds whatever memory it got: never hashed */
        rls[i] = empty ? 0 : roles[i];
        if (!have_dev)
            have_dev = kd_launch_device_of(args[i], &info, &stream);
    }
    info.nnames = (uint32_t)nargs;
    info.name_ids = ids;
    info.roles = rls;
    Py_INCREF(r);
    kd_capture saved = kd_tls_capture; /* an op is launched inside no launcher */
    memset(&kd_tls_capture, 0, sizeof kd_tls_capture);
    int recorded;
    if (!kd_launch_record(r, &info, args, nargs, stream, &recorded)) { /* Note [Records made in one pass] */
        kd_pending p;
        kd_launch_begin(r, &info, args, nargs, stream, &p);
        kd_launch_end(r, &p, args, nargs, 0);
    }
    kd_tls_capture = saved;
    Py_DECREF(r);
    PyErr_Clear();
}

/* With the GIL: the string table's id of an op's or argument's name. */
static uint32_t op_intern(const char *s, size_t n)
{
    return kd_strtab_intern(kd_strings, s, n);
}

/* _op_observer(recorder, mode, all_threads) -> handle: records ops into
 * recorder (mode KD_OPS_*) through a RecordFunction callback on this thread
 * (and the threads torch carries its state to) or, all_threads, every thread. */
static PyObject *kd_op_observer_add(PyObject *m, PyObject *args)
{
    (void)m;
    PyObject *rec;
    int mode, all;
    if (!PyArg_ParseTuple(args, "O!ip", &kd_RecorderType, &rec, &mode, &all))
        return NULL;
    if (mode != KD_OPS_EXTERN && mode != KD_OPS_ALL) {
        PyErr_SetString(PyExc_ValueError, "_op_observer: mode is 1 (extern ops) or 2 (all ops)");
        return NULL;
    }
    uint64_t h = kd_shim_op_observer_add(all, op_want, op_record, op_intern);
    if (h == 0) {
        PyErr_Format(PyExc_RuntimeError, "kdebug could not add its op observer: %s", kd_shim_last_error());
        return NULL;
    }
    ((kd_recorder *)rec)->op_mode = mode;
    if (mode == KD_OPS_ALL)
        atomic_fetch_add(&ops_all_recorders, 1);
    if (!all)
        gate_here(); /* Note [Op observer gated by graph calls] */
    return PyLong_FromUnsignedLongLong(h);
}

/* _op_observer_remove(recorder, handle): undoes _op_observer. */
static PyObject *kd_op_observer_remove(PyObject *m, PyObject *args)
{
    (void)m;
    PyObject *rec;
    unsigned long long h;
    if (!PyArg_ParseTuple(args, "O!K", &kd_RecorderType, &rec, &h))
        return NULL;
    kd_recorder *r = (kd_recorder *)rec;
    if (r->op_mode == KD_OPS_ALL)
        atomic_fetch_sub(&ops_all_recorders, 1);
    r->op_mode = KD_OPS_NONE;
    if (kd_shim_op_observer_remove(h) != 0) {
        PyErr_Format(PyExc_RuntimeError, "kdebug could not remove its op observer: %s", kd_shim_last_error());
        return NULL;
    }
    gate_here(); /* the last recorder of every op gone: the rest are gated again */
    Py_RETURN_NONE;
}

/* _graph_call(entering) -> depth: a compiled graph starts / ends its call on
 * this thread (KD_OPS_EXTERN records the ops issued in between). */
static PyObject *kd_graph_call(PyObject *m, PyObject *arg)
{
    (void)m;
    int enter = PyObject_IsTrue(arg);
    if (enter < 0)
        return NULL;
    if (enter) {
        if (kd_tls_in_graph++ == 0)
            gate_here(); /* Note [Op observer gated by graph calls] */
    } else if (kd_tls_in_graph > 0 && --kd_tls_in_graph == 0) {
        gate_here();
        if (kd_defer_enabled() == KD_DEFER_GUARDED)
            /* Note [C++ write guard], Paused between windows: the call's last hashes go now (if a flush
             * during the call left none, the guard is paused all the same), so the eager ops after it
             * (autograd's, the optimizer's) run with the guard paused */
            kd_defer_flush_quiet();
        kd_defer_read_back_early(); /* Note [Reading back before the ring fills] */
    }
    return PyLong_FromLong(kd_tls_in_graph);
}

/* _recording_here() -> bool: kd_recording_here (kdebug/inductor.py: a compiled
 * graph called on autograd's device thread, whose Python-side state knows no
 * recording, is recorded there all the same). */
static PyObject *kd_py_recording_here(PyObject *m, PyObject *unused)
{
    (void)m, (void)unused;
    return PyBool_FromLong(kd_recording_here());
}

/* _mode_here() -> the DebugMode whose recorder records this thread's launches
 * (kd_recorder_here: on autograd's device thread, the carried one), or None. */
static PyObject *kd_py_mode_here(PyObject *m, PyObject *unused)
{
    (void)m, (void)unused;
    kd_recorder *r = kd_recorder_here();
    return Py_NewRef(r != NULL && r->mode != NULL ? r->mode : Py_None);
}

/* _op_observer_starts() -> how many dispatcher ops this thread's op observer
 * saw start (Note [Op observer gated by graph calls]). */
static PyObject *kd_py_op_observer_starts(PyObject *m, PyObject *unused)
{
    (void)m, (void)unused;
    return PyLong_FromUnsignedLongLong(kd_shim_op_observer_starts());
}

static PyMethodDef op_observer_methods[] = {
    {"_op_observer_starts", kd_py_op_observer_starts, METH_NOARGS,
     "_op_observer_starts() -> dispatcher ops this thread's op observer saw start (tests)."},
    {"_mode_here", kd_py_mode_here, METH_NOARGS,
     "_mode_here() -> the DebugMode recording this thread's launches (its own, carried, global) or None."},
    {"_recording_here", kd_py_recording_here, METH_NOARGS,
     "_recording_here() -> whether a started recorder records this thread's launches (its own, carried, global)."},
    {"_op_observer", kd_op_observer_add, METH_VARARGS,
     "_op_observer(recorder, mode, all_threads) -> handle (Note [C++ op observer])."},
    {"_op_observer_remove", kd_op_observer_remove, METH_VARARGS,
     "_op_observer_remove(recorder, handle): stop recording ops into recorder."},
    {"_graph_call", kd_graph_call, METH_O, "_graph_call(entering) -> this thread's compiled-graph depth."},
    {NULL, NULL, 0, NULL},
};

/* Adds the observer's constants and functions to module m; -1 with an exception. */
int kd_op_observer_module_init(PyObject *m)
{
    if (PyModule_AddIntConstant(m, "KIND_ATEN", KD_KIND_ATEN) != 0 ||
        PyModule_AddIntConstant(m, "OPS_EXTERN", KD_OPS_EXTERN) != 0 ||
        PyModule_AddIntConstant(m, "OPS_ALL", KD_OPS_ALL) != 0)
        return -1;
    return PyModule_AddFunctions(m, op_observer_methods);
}
