/* kd_module.c - the kdebug._C module: global tables and module setup. */
#include <string.h>

#include "kd_clock.h"
#include "kd_phase_timers.h"
#include "kd_defer.h"
#include "kd_cuda_hash.h"
#include "kd_graph.h"
#include "kd_dispatch.h"
#include "kd_op_observer.h"
#include "kd_fmt.h"
#include "kd_hash_py.h"
#include "kd_hash_tree.h"
#include "kd_hook.h"
#include "kd_launch.h"
#include "kd_launch_hash.h"
#include "kd_module.h"
#include "kd_cpp_launch.h"
#include "kd_state_record.h"
#include "kd_recorder.h"
#include "kd_shim.h"
#include "kd_trace_py.h"
#include "kd_launch_table_py.h"
#include "kd_tree.h"
#include "kd_types.h"
#include "kd_view.h"
#include "kd_write_guard.h"

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

/* _one_pass_records(on) -> bool: whether records of launches that ran already
 * are made in one pass (Note [Records made in one pass]); returns the old
 * setting.  For kdebug.testing.two_call_records. */
static PyObject *mod_one_pass_records(PyObject *m, PyObject *arg)
{
    (void)m;
    int on = PyObject_IsTrue(arg);
    if (on < 0)
        return NULL;
    return PyBool_FromLong(kd_launch_record_enable(on));
}

/* _prefetch_grads(on) -> bool: whether the gradient record prefetches its
 * gradients' pointer chains (Note [Prefetching the gradients] in
 * kd_torch.cpp); returns the old setting.  For the tool that times it; no
 * value changes either way. */
static PyObject *mod_prefetch_grads(PyObject *m, PyObject *arg)
{
    (void)m;
    int on = PyObject_IsTrue(arg);
    if (on < 0)
        return NULL;
    return PyBool_FromLong(kd_shim_prefetch_set(on));
}

/* _set_hash_config(kinds, hash_inputs, check_readonly, spec) -> this thread's
 * previous settings, a HashConfig (Note [Hash settings per thread] in kd_recorder.h) */
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
    PyObject *prev = KD_RECORD(kd_HashConfigType, PyLong_FromLong(kd_hcfg.kinds), PyLong_FromLong(kd_hcfg.hash_inputs),
                               PyLong_FromLong(kd_hcfg.check_readonly), PyLong_FromLong(kd_hcfg.spec));
    kd_hcfg.kinds = kinds;
    kd_hcfg.hash_inputs = inputs;
    kd_hcfg.check_readonly = check;
    kd_hcfg.spec = spec;
    kd_hcfg_publish();
    return prev;
}

/* _set_record_outputs(on, budget_bytes, filter=0) -> this thread's previous settings, an OutputConfig */
static PyObject *mod_set_record_outputs(PyObject *m, PyObject *args)
{
    (void)m;
    int on, filter = 0;
    unsigned long long budget;
    if (!PyArg_ParseTuple(args, "pK|i", &on, &budget, &filter))
        return NULL;
    PyObject *prev = KD_RECORD(kd_OutputConfigType, PyBool_FromLong(kd_hcfg.record_outputs),
                               PyLong_FromUnsignedLongLong((unsigned long long)kd_hcfg.output_budget),
                               PyLong_FromLong(kd_hcfg.output_filter));
    kd_hcfg.record_outputs = on;
    kd_hcfg.output_budget = budget;
    kd_hcfg.output_filter = filter;
    kd_hcfg_publish();
    return prev;
}

/* _set_output_filter(fn or None): fn(filter_id, recorder, kernel_name, launch_index) -> bool,
 * asked after each launch recorded under a record_outputs filter */
static PyObject *mod_set_output_filter(PyObject *m, PyObject *fn)
{
    (void)m;
    if (fn != Py_None && !PyCallable_Check(fn)) {
        PyErr_SetString(PyExc_TypeError, "_set_output_filter: a callable or None");
        return NULL;
    }
    Py_XSETREF(kd_output_filter_fn, fn == Py_None ? NULL : Py_NewRef(fn));
    Py_RETURN_NONE;
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

/* ---- deferred GPU work (Note [Deferred GPU work]) ---- */

static PyObject *mod_set_defer(PyObject *m, PyObject *arg)
{
    (void)m;
    long on = PyLong_AsLong(arg); /* KD_DEFER_*; a bool is 0 / 1 */
    if (on == -1 && PyErr_Occurred())
        return NULL;
    if (on < KD_DEFER_OFF || on > KD_DEFER_GUARDED) {
        PyErr_SetString(PyExc_ValueError, "_set_defer: 0 (off), 1 (dispatch mode guards) or 2 (C++ write guard)");
        return NULL;
    }
    return PyLong_FromLong(kd_defer_set((int)on));
}

static PyObject *mod_defer_flush(PyObject *m, PyObject *unused)
{
    (void)m, (void)unused;
    return PyLong_FromLong(kd_defer_flush_quiet());
}

/* Note [Reading results without waiting] (kd_cuda_hash.cu). */
static PyObject *mod_collect_ready(PyObject *m, PyObject *args)
{
    (void)m;
    long long at_least = 0;
    if (!PyArg_ParseTuple(args, "|L:collect_ready", &at_least))
        return NULL;
    if (at_least > 0) {
        kd_defer_stats st;
        kd_defer_get_stats(&st);
        if (kd_cuda_hash_unread() + (long long)st.pending < at_least)
            return PyLong_FromLong(0);
    }
    int rc = kd_defer_flush();
    if (kd_cuda_hash_collect_ready() != 0)
        rc = -1;
    return PyLong_FromLong(rc);
}

static PyObject *mod_defer_stats(PyObject *m, PyObject *unused)
{
    (void)m, (void)unused;
    kd_defer_stats st;
    kd_defer_get_stats(&st);
    return Py_BuildValue("{sKsKsKsKsKsKsKsKsKsKsKsKsKsKss}", "direct_hash_launches",
                         (unsigned long long)kd_direct_hash_launches, "guard_failures",
                         (unsigned long long)st.guard_failures, "queued_hashes", (unsigned long long)st.queued_hashes,
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

/* defer_failures() -> hash_failures + copy_failures of defer_stats(), without
 * its dict: DebugMode reads it at every enter and exit (Note [Problems at
 * exit] in kdebug/mode.py). */
static PyObject *mod_defer_failures(PyObject *m, PyObject *unused)
{
    (void)m, (void)unused;
    kd_defer_stats st;
    kd_defer_get_stats(&st);
    return PyLong_FromUnsignedLongLong((unsigned long long)(st.hash_failures + st.copy_failures));
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

static PyObject *mod_unfollowed_launches(PyObject *m, PyObject *unused)
{
    (void)m, (void)unused;
    return PyLong_FromUnsignedLongLong(kd_unfollowed_launches);
}

static PyMethodDef module_methods[] = {
    {"graph_capture_begin", kd_mod_graph_capture_begin, METH_VARARGS,
     "graph_capture_begin(device, stream) -> handle: before a CUDA graph capture (Note [CUDA graph replays])."},
    {"graph_capture_started", kd_mod_graph_capture_started, METH_VARARGS,
     "graph_capture_started(handle, stream): the capture is open; this thread's launches go to the graph."},
    {"graph_capture_end", kd_mod_graph_capture_end, METH_O,
     "graph_capture_end(handle) -> dict: before the capture closes; the graph's counters."},
    {"graph_replay", kd_mod_graph_replay, METH_VARARGS,
     "graph_replay(handle, stream) -> replay index (-1: not recorded): right before the replay."},
    {"graph_replay_queued", kd_mod_graph_replay_queued, METH_O,
     "graph_replay_queued(ok): right after the replay (ok False: it raised); Note [Results in flight]."},
    {"graph_unknown_replay", kd_mod_graph_unknown_replay, METH_NOARGS,
     "graph_unknown_replay(): count a replay of a graph captured without kdebug."},
    {"graph_release", kd_mod_graph_release, METH_O, "graph_release(handle): the CUDA graph is gone."},
    {"graph_stats", kd_mod_graph_stats, METH_NOARGS, "graph_stats() -> every graph's counters."},
    {"graph_activity", kd_mod_graph_activity, METH_NOARGS,
     "graph_activity() -> int: graphs registered + replays + unknown replays so far (0: none)."},
    {"unfollowed_launches", mod_unfollowed_launches, METH_NOARGS,
     "unfollowed_launches() -> int: compiled kernel launches on threads no started recorder followed, so far "
     "(Note [Launches no recording follows])."},
    {"_empty_like", mod_empty_like, METH_O, "_empty_like(t): what record_outputs copies into (tests)."},
    {"_set_defer", mod_set_defer, METH_O, "_set_defer(mode) -> previous: batch GPU hashes / copies: 0 off, 1 under a dispatch mode, 2 with the C++ write guard (Note [Deferred GPU work])."},
    {"defer_flush", mod_defer_flush, METH_NOARGS, "defer_flush(): launch every deferred GPU hash / copy now (a quiet point: the C++ write guard pauses until the next is queued)."},
    {"collect_ready", mod_collect_ready, METH_VARARGS,
     "collect_ready(at_least=0) -> 0, or -1 on a CUDA error (kept for a blocking collect): deferred GPU "
     "hashes launched, hashes read back earlier handed to their records, the rest begun reading back; "
     "never waits (Note [Reading results without waiting]).  Does nothing while fewer than at_least "
     "GPU hashes wait that no read-back has begun on."},
    {"defer_stats", mod_defer_stats, METH_NOARGS, "defer_stats() -> counters of the deferred GPU work."},
    {"defer_failures", mod_defer_failures, METH_NOARGS,
     "defer_failures() -> defer_stats()'s hash_failures + copy_failures."},
    {"_set_hash_config", mod_set_hash_config, METH_VARARGS,
     "Set what launches hash: (kinds, hash_inputs, check_readonly, spec); returns the previous."},
    {"_set_record_outputs", mod_set_record_outputs, METH_VARARGS,
     "Set output recording: (on, budget_bytes, filter=0); returns the previous."},
    {"_set_output_filter", mod_set_output_filter, METH_O,
     "_set_output_filter(fn): fn(filter_id, recorder, kernel_name, launch_index) -> bool."},
    {"_set_hashers", mod_set_hashers, METH_VARARGS, "Set the slow and custom hash callbacks."},
    {"_inject_detach_faults", kd_inject_detach_faults, METH_O,
     "Tests only: the next n copies of kept launch records (Recorder.clear) fail, as out of memory would."},
    {"_inject_hook_faults", mod_inject, METH_O,
     "Tests only: the next n launch descriptions fail inside the hook, as a real failure would."},
    {"_prefetch_grads", mod_prefetch_grads, METH_O,
     "_prefetch_grads(on) -> the old setting (Note [Prefetching the gradients]); for the tool that times it."},
    {"_one_pass_records", mod_one_pass_records, METH_O,
     "Tests only: _one_pass_records(on) -> the old setting (Note [Records made in one pass])."},
    {"intern", mod_intern, METH_O, "intern(s) -> id in kdebug's string table"},
    {"string", mod_string, METH_O, "string(id) -> the interned string"},
    {"_set_dtype_names", mod_set_dtype_names, METH_O,
     "Set the dtype abbreviations used when rendering."},
    {"scalar_type", mod_scalar_type, METH_O, "c10::ScalarType number of a torch.dtype"},
    {"tensor_meta", mod_tensor_meta, METH_O,
     "The metadata the launch hook reads from a tensor, as a dict (None for non-tensors)."},
    {"tree_leaf_digest", kd_mod_tree_leaf_digest, METH_O,
     "tree_leaf_digest(hash value) -> the digest TraceReader.last_writer looks for in op outputs."},
    {"now_ns", mod_now_ns, METH_NOARGS, "CLOCK_MONOTONIC in ns, read as the launch timestamps are (Note [Launch timestamps from the TSC])."},
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
    kd_clock_anchor(); /* the TSC's first calibration pair (Note [Launch timestamps from the TSC]) */
    PyObject *m = PyModule_Create(&moduledef);
    if (m == NULL)
        return NULL;
    if (PyType_Ready(&kd_RecorderType) != 0 || PyType_Ready(&kd_LaunchType) != 0 ||
        PyModule_AddObjectRef(m, "Recorder", (PyObject *)&kd_RecorderType) != 0 ||
        PyModule_AddObjectRef(m, "Launch", (PyObject *)&kd_LaunchType) != 0 ||
        kd_types_module_init(m) != 0 || kd_hash_py_module_init(m) != 0 || kd_tree_module_init(m) != 0 ||
        kd_hook_module_init(m) != 0 || kd_fmt_module_init(m) != 0 || kd_dispatch_module_init(m) != 0 || kd_op_observer_module_init(m) != 0 || kd_write_guard_module_init(m) != 0 || kd_phase_timers_module_init(m) != 0 || kd_cpp_launch_module_init(m) != 0 || kd_state_record_module_init(m) != 0 || kd_trace_module_init(m) != 0 || kd_launch_table_module_init(m) != 0 ||
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