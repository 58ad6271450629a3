/* kd_hook.c - the launch hooks Inductor's generated code runs through.
 *
 * Note [Where kdebug hooks Inductor]
 *  - Triton: CachingAutotuner.run is replaced by a RunHook, a method
 *    descriptor with vectorcall (no bound-method object per call).  Generated
 *    code calls kernel.run(*args, stream=s); autotuning benchmarks call the
 *    launchers directly, so they never pass here.
 *  - The grid the launcher really used is caught by a RunnerHook wrapped
 *    around the `runner` in each launcher's globals: every generated launcher
 *    ends in runner(grid_0, grid_1, grid_2, stream, ...).  While a recorded
 *    launch is in flight the hook copies the grid and the launcher's config
 *    into this thread's capture; the last launcher call wins, which is the
 *    real launch (autotuning benchmarks, if any, run before it).
 *  - C++ kernels: each cpp_pybinding kernel in a generated module's globals is
 *    replaced by a CppKernel wrapper (kdebug/inductor.py does the swapping).
 *  - Upstream's own Triton recording is kept out of the way by replacing the
 *    get_active_debug_mode name inside triton_heuristics with a filter that
 *    hides kdebug modes (kd_inductor_get_active_debug_mode).
 * With no recorder active each hook costs one C call and one thread-local
 * read before it calls the original.
 */
#include <string.h>

#include "kd_phase_timers.h"
#include "kd_hook.h"
#include "kd_launch.h"
#include "kd_module.h"
#include "kd_recorder.h"
#include "kd_types.h"
#include <structmember.h>

_Thread_local kd_capture kd_tls_capture;

/* Configuration set once by kdebug/inductor.py through _configure(). */
static PyObject *bench_dict = NULL;      /* dict holding _IN_INDUCTOR_BENCHMARK */
static PyObject *bench_key = NULL;
static PyObject *count_dict = NULL;      /* dict holding _ACTIVE_DEBUG_MODE_COUNT */
static PyObject *count_key = NULL;
static PyObject *orig_get_active = NULL; /* upstream get_active_debug_mode */
static PyObject *kd_mode_class = NULL;   /* kdebug.DebugMode */
static long kd_pushed_modes = 0;         /* GIL: kdebug modes on dispatch stacks */

static PyObject *str_stream, *str_benchmark_run, *str_kdebug_info;

int kd_in_benchmark(void)
{
    if (kd_tls_compiling) /* this thread compiles or autotunes (Note [Autotuning is not the program]) */
        return 1;
    if (bench_dict == NULL)
        return 0;
    PyObject *v = PyDict_GetItemWithError(bench_dict, bench_key);
    if (v == NULL) {
        PyErr_Clear();
        return 0;
    }
    return v == Py_True;
}

/* ------------------------------------------------------------------ */
/* RunHook: replaces CachingAutotuner.run                              */

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *orig;     /* the original CachingAutotuner.run function */
    PyObject *builder;  /* builder(autotuner) -> KernelInfo */
    PyObject *finisher; /* finisher(autotuner, args) -> TritonLaunch | None (Note [Typed boundaries]) */
} kd_run_hook;

/* The kernel's KernelInfo (a new reference: a `_kdebug_info` property may
 * make a new object per read, which nothing else keeps alive), or NULL when
 * it is not recorded. */
static kd_kernel_info *triton_info(kd_recorder *r, kd_run_hook *h, PyObject *autotuner)
{
    PyObject *info = PyObject_GetAttr(autotuner, str_kdebug_info);
    if (info == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_AttributeError)) {
            kd_recorder_error(r, "reading a kernel's kdebug info");
            return NULL;
        }
        PyErr_Clear();
        info = PyObject_CallOneArg(h->builder, autotuner);
        if (info == NULL || !PyObject_TypeCheck(info, &kd_KernelInfoType)) {
            Py_XDECREF(info);
            kd_recorder_error(r, "describing a Triton kernel (it will not be recorded)");
            info = Py_NewRef(Py_None);
        }
        if (PyObject_SetAttr(autotuner, str_kdebug_info, info) != 0)
            kd_recorder_error(r, "caching a kernel's kdebug info");
    }
    if (info == Py_None) {
        Py_DECREF(info);
        return NULL;
    }
    if (!PyObject_TypeCheck(info, &kd_KernelInfoType)) { /* set by someone else: not ours to read */
        Py_DECREF(info);
        kd_recorder_error(r, "a Triton kernel's _kdebug_info is not a kdebug KernelInfo (it will not be recorded)");
        return NULL;
    }
    return (kd_kernel_info *)info;
}

static PyObject *run_hook_call(kd_run_hook *self, PyObject *const *args, size_t nargsf,
                               PyObject *kwnames)
{
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    uint64_t t0 = KD_PT_NOW(); /* Note [Phase timers] */
    kd_recorder *r = kd_active_recorder();
    if (r == NULL || nargs < 1) {
        if (r == NULL)
            kd_note_unrecorded_launch();
#ifdef KD_PHASE_TIMERS
        PyObject *plain = PyObject_Vectorcall(self->orig, args, nargsf, kwnames);
        KD_PT_ADD(KD_PT_PLAIN, t0);
        return plain;
#else
        return PyObject_Vectorcall(self->orig, args, nargsf, kwnames);
#endif
    }

    uint64_t stream = 0;
    if (kwnames != NULL) {
        Py_ssize_t nk = PyTuple_GET_SIZE(kwnames);
        for (Py_ssize_t k = 0; k < nk; k++) {
            PyObject *key = PyTuple_GET_ITEM(kwnames, k);
            PyObject *val = args[nargs + k];
            if (key == str_stream || PyUnicode_Compare(key, str_stream) == 0) {
                if (PyLong_Check(val))
                    stream = PyLong_AsUnsignedLongLongMask(val);
            } else if (key == str_benchmark_run ||
                       PyUnicode_Compare(key, str_benchmark_run) == 0) {
                int b = PyObject_IsTrue(val);
                if (b != 0) {
                    PyErr_Clear();
                    r->suppressed++;
                    return PyObject_Vectorcall(self->orig, args, nargsf, kwnames);
                }
            }
        }
        if (PyErr_Occurred())
            PyErr_Clear();
    }
    PyObject *autotuner = args[0];
    kd_kernel_info *info = triton_info(r, self, autotuner);
    KD_PT_ADD(KD_PT_FIND, t0);
    if (info == NULL) {
        r->unrecorded++;
        return PyObject_Vectorcall(self->orig, args, nargsf, kwnames);
    }
    Py_INCREF(r); /* the launch may run Python code that stops the recorder */
    /* the kernel's arguments: not the launcher's own trailing ones (a user kernel's grid) */
    Py_ssize_t nkern = nargs - 1;
    if (info->launcher_args && nkern >= (Py_ssize_t)info->launcher_args)
        nkern -= (Py_ssize_t)info->launcher_args;
    kd_pending p;
    kd_launch_begin(r, info, args + 1, nkern, stream, &p);
    kd_capture saved = kd_tls_capture;
    memset(&kd_tls_capture, 0, sizeof kd_tls_capture);
    kd_tls_capture.active = p.ok;
    KD_PT_ADD(KD_PT_BEGIN, t0);

    uint64_t t1 = KD_PT_NOW();
    PyObject *res = PyObject_Vectorcall(self->orig, args, nargsf, kwnames);
    KD_PT_ADD(KD_PT_LAUNCH, t1);
    uint64_t t2 = KD_PT_NOW();

    kd_tls_capture.active = 0;
    if (p.ok && !kd_tls_capture.have_grid) {
        /* First recorded launch of this launcher: let Python wrap its runner
         * and compute the grid the launcher used. */
        PyObject *et, *ev, *etb;
        PyErr_Fetch(&et, &ev, &etb);
        PyObject *tup = PyTuple_New(nargs - 1);
        for (Py_ssize_t i = 1; tup && i < nargs; i++)
            PyTuple_SET_ITEM(tup, i - 1, Py_NewRef(args[i]));
        PyObject *g = tup ? PyObject_CallFunctionObjArgs(self->finisher, autotuner, tup, NULL)
                          : NULL;
        Py_XDECREF(tup);
        unsigned long long v[KD_TL_N];
        /* the named tuple's type, and its length (tuple.__new__ can make one of any length) */
        if (g != NULL && kd_TritonLaunchType != NULL && Py_TYPE(g) == kd_TritonLaunchType &&
            PyTuple_GET_SIZE(g) == KD_TL_N) {
            int bad = 0;
            for (int i = 0; i < KD_TL_N; i++) {
                v[i] = PyLong_AsUnsignedLongLongMask(PyTuple_GET_ITEM(g, i));
                if (PyErr_Occurred())
                    bad = 1;
            }
            if (!bad) {
                kd_tls_capture.have_grid = 1;
                kd_tls_capture.grid[0] = (uint32_t)v[KD_TL_GRID_X];
                kd_tls_capture.grid[1] = (uint32_t)v[KD_TL_GRID_Y];
                kd_tls_capture.grid[2] = (uint32_t)v[KD_TL_GRID_Z];
                kd_tls_capture.have_config = 1;
                kd_tls_capture.config_id = (uint32_t)v[KD_TL_CONFIG_ID];
                kd_tls_capture.num_warps = (uint16_t)v[KD_TL_NUM_WARPS];
                kd_tls_capture.num_stages = (uint8_t)v[KD_TL_NUM_STAGES];
                kd_tls_capture.shared_mem = (uint32_t)v[KD_TL_SHARED_MEM];
            } else {
                kd_recorder_error(r, "reading the grid of a Triton launch");
            }
        } else if (g == NULL) {
            kd_recorder_error(r, "finding the grid of a Triton launch");
        } else if (Py_TYPE(g) == kd_TritonLaunchType) {
            kd_recorder_error(r, "reading the grid of a Triton launch (a TritonLaunch of the wrong length)");
        } else if (g != Py_None) {
            kd_recorder_error(r, "reading the grid of a Triton launch (not a kdebug._boundary.TritonLaunch)");
        }
        Py_XDECREF(g);
        PyErr_Restore(et, ev, etb);
    }
    kd_launch_end(r, &p, args + 1, nkern, res == NULL);
    kd_tls_capture = saved;
    Py_DECREF(info);
    Py_DECREF(r);
    KD_PT_ADD(KD_PT_END, t2);
    return res;
}

static PyObject *run_hook_descr_get(PyObject *self, PyObject *obj, PyObject *type)
{
    (void)type;
    if (obj == NULL || obj == Py_None)
        return Py_NewRef(self);
    return PyMethod_New(self, obj);
}

static void run_hook_dealloc(kd_run_hook *self)
{
    PyObject_GC_UnTrack(self);
    Py_XDECREF(self->orig);
    Py_XDECREF(self->builder);
    Py_XDECREF(self->finisher);
    PyObject_GC_Del(self);
}

static int run_hook_traverse(kd_run_hook *self, visitproc visit, void *arg)
{
    Py_VISIT(self->orig);
    Py_VISIT(self->builder);
    Py_VISIT(self->finisher);
    return 0;
}

static PyObject *run_hook_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    PyObject *orig, *builder, *finisher;
    static char *kwlist[] = {"orig", "builder", "finisher", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOO", kwlist, &orig, &builder, &finisher))
        return NULL;
    if (!PyCallable_Check(orig) || !PyCallable_Check(builder) || !PyCallable_Check(finisher)) {
        PyErr_SetString(PyExc_TypeError, "RunHook needs three callables");
        return NULL;
    }
    kd_run_hook *self = PyObject_GC_New(kd_run_hook, type);
    if (self == NULL)
        return NULL;
    self->vectorcall = (vectorcallfunc)run_hook_call;
    self->orig = Py_NewRef(orig);
    self->builder = Py_NewRef(builder);
    self->finisher = Py_NewRef(finisher);
    PyObject_GC_Track(self);
    return (PyObject *)self;
}

static PyMemberDef run_hook_members[] = {
    {"__wrapped__", T_OBJECT, offsetof(kd_run_hook, orig), READONLY, "the original run"},
    {"__vectorcalloffset__", T_PYSSIZET, offsetof(kd_run_hook, vectorcall), READONLY, NULL},
    {NULL, 0, 0, 0, NULL},
};

PyTypeObject kd_RunHookType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kdebug._C.RunHook",
    .tp_basicsize = sizeof(kd_run_hook),
    .tp_dealloc = (destructor)run_hook_dealloc,
    .tp_vectorcall_offset = offsetof(kd_run_hook, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL |
                Py_TPFLAGS_METHOD_DESCRIPTOR,
    .tp_doc = "kdebug's replacement for CachingAutotuner.run (Note [Where kdebug hooks Inductor]).",
    .tp_traverse = (traverseproc)run_hook_traverse,
    .tp_descr_get = run_hook_descr_get,
    .tp_new = run_hook_new,
    .tp_members = run_hook_members,
};

/* ------------------------------------------------------------------ */
/* RunnerHook: wraps a launcher's runner to see the grid                */

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *runner;
    uint32_t config_id;
    uint16_t num_warps;
    uint8_t num_stages;
    uint32_t shared_mem;
} kd_runner_hook;

static PyObject *runner_hook_call(kd_runner_hook *self, PyObject *const *args, size_t nargsf,
                                  PyObject *kwnames)
{
    if (kd_tls_capture.active && PyVectorcall_NARGS(nargsf) >= 3) {
        long long g[3];
        int ok = 1;
        for (int i = 0; i < 3 && ok; i++) {
            g[i] = PyLong_Check(args[i]) ? PyLong_AsLongLong(args[i]) : -1;
            if (g[i] < 0 || g[i] > UINT32_MAX)
                ok = 0;
        }
        if (PyErr_Occurred())
            PyErr_Clear();
        if (ok) {
            kd_tls_capture.have_grid = 1;
            for (int i = 0; i < 3; i++)
                kd_tls_capture.grid[i] = (uint32_t)g[i];
            kd_tls_capture.have_config = 1;
            kd_tls_capture.config_id = self->config_id;
            kd_tls_capture.num_warps = self->num_warps;
            kd_tls_capture.num_stages = self->num_stages;
            kd_tls_capture.shared_mem = self->shared_mem;
        }
    }
    return PyObject_Vectorcall(self->runner, args, nargsf, kwnames);
}

static PyObject *runner_hook_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    PyObject *runner;
    unsigned int config_id, warps, stages, shared;
    static char *kwlist[] = {"runner", "config_id", "num_warps", "num_stages", "shared", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OIIII", kwlist, &runner, &config_id, &warps,
                                     &stages, &shared))
        return NULL;
    if (!PyCallable_Check(runner)) {
        PyErr_SetString(PyExc_TypeError, "runner must be callable");
        return NULL;
    }
    kd_runner_hook *self = PyObject_GC_New(kd_runner_hook, type);
    if (self == NULL)
        return NULL;
    self->vectorcall = (vectorcallfunc)runner_hook_call;
    self->runner = Py_NewRef(runner);
    self->config_id = config_id;
    self->num_warps = (uint16_t)warps;
    self->num_stages = (uint8_t)(stages > 255 ? 255 : stages);
    self->shared_mem = shared;
    PyObject_GC_Track(self);
    return (PyObject *)self;
}

static void runner_hook_dealloc(kd_runner_hook *self)
{
    PyObject_GC_UnTrack(self);
    Py_XDECREF(self->runner);
    PyObject_GC_Del(self);
}

static int runner_hook_traverse(kd_runner_hook *self, visitproc visit, void *arg)
{
    Py_VISIT(self->runner);
    return 0;
}

static PyMemberDef runner_hook_members[] = {
    {"__wrapped__", T_OBJECT, offsetof(kd_runner_hook, runner), READONLY, "the original runner"},
    {"__vectorcalloffset__", T_PYSSIZET, offsetof(kd_runner_hook, vectorcall), READONLY, NULL},
    {NULL, 0, 0, 0, NULL},
};

PyTypeObject kd_RunnerHookType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kdebug._C.RunnerHook",
    .tp_basicsize = sizeof(kd_runner_hook),
    .tp_dealloc = (destructor)runner_hook_dealloc,
    .tp_vectorcall_offset = offsetof(kd_runner_hook, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "Wraps a Triton launcher's runner to capture the launch grid.",
    .tp_traverse = (traverseproc)runner_hook_traverse,
    .tp_new = runner_hook_new,
    .tp_members = runner_hook_members,
};

/* ------------------------------------------------------------------ */
/* CppKernel: wraps an Inductor C++ kernel (cpp_pybinding)             */

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *fn;
    kd_kernel_info *info;
} kd_cpp_kernel;

static PyObject *cpp_kernel_call(kd_cpp_kernel *self, PyObject *const *args, size_t nargsf,
                                 PyObject *kwnames)
{
    kd_recorder *r = kd_active_recorder();
    if (r == NULL || kwnames != NULL) {
        if (r == NULL)
            kd_note_unrecorded_launch();
        return PyObject_Vectorcall(self->fn, args, nargsf, kwnames);
    }
    Py_INCREF(r);
    kd_pending p;
    kd_launch_begin(r, self->info, args, PyVectorcall_NARGS(nargsf), 0, &p);
    kd_capture saved = kd_tls_capture;
    memset(&kd_tls_capture, 0, sizeof kd_tls_capture);
    PyObject *res = PyObject_Vectorcall(self->fn, args, nargsf, kwnames);
    kd_launch_end(r, &p, args, PyVectorcall_NARGS(nargsf), res == NULL);
    kd_tls_capture = saved;
    Py_DECREF(r);
    return res;
}

static PyObject *cpp_kernel_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    PyObject *fn, *info;
    static char *kwlist[] = {"fn", "info", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO!", kwlist, &fn, &kd_KernelInfoType, &info))
        return NULL;
    if (!PyCallable_Check(fn)) {
        PyErr_SetString(PyExc_TypeError, "fn must be callable");
        return NULL;
    }
    kd_cpp_kernel *self = PyObject_GC_New(kd_cpp_kernel, type);
    if (self == NULL)
        return NULL;
    self->vectorcall = (vectorcallfunc)cpp_kernel_call;
    self->fn = Py_NewRef(fn);
    self->info = (kd_kernel_info *)Py_NewRef(info);
    PyObject_GC_Track(self);
    return (PyObject *)self;
}

static void cpp_kernel_dealloc(kd_cpp_kernel *self)
{
    PyObject_GC_UnTrack(self);
    Py_XDECREF(self->fn);
    Py_XDECREF(self->info);
    PyObject_GC_Del(self);
}

static int cpp_kernel_traverse(kd_cpp_kernel *self, visitproc visit, void *arg)
{
    Py_VISIT(self->fn);
    return 0;
}

static PyObject *cpp_kernel_repr(kd_cpp_kernel *self)
{
    return PyUnicode_FromFormat("<kdebug C++ kernel %s>",
                                kd_strtab_get(kd_strings, self->info->name_id, NULL));
}

static PyMemberDef cpp_kernel_members[] = {
    {"__wrapped__", T_OBJECT, offsetof(kd_cpp_kernel, fn), READONLY, "the original kernel"},
    {"info", T_OBJECT, offsetof(kd_cpp_kernel, info), READONLY, "the kernel's KernelInfo"},
    {"__vectorcalloffset__", T_PYSSIZET, offsetof(kd_cpp_kernel, vectorcall), READONLY, NULL},
    {NULL, 0, 0, 0, NULL},
};

PyTypeObject kd_CppKernelType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kdebug._C.CppKernel",
    .tp_basicsize = sizeof(kd_cpp_kernel),
    .tp_dealloc = (destructor)cpp_kernel_dealloc,
    .tp_vectorcall_offset = offsetof(kd_cpp_kernel, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_repr = (reprfunc)cpp_kernel_repr,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "An Inductor C++ kernel whose launches kdebug records.",
    .tp_traverse = (traverseproc)cpp_kernel_traverse,
    .tp_new = cpp_kernel_new,
    .tp_members = cpp_kernel_members,
};

/* ------------------------------------------------------------------ */
/* Module functions for the hooks                                      */

/* Stands in for get_active_debug_mode inside triton_heuristics: hides
 * kdebug modes, so upstream's own recording (and its per-launch device
 * synchronization) never runs for them. */
static PyObject *kd_inductor_get_active_debug_mode(PyObject *m, PyObject *unused)
{
    (void)m;
    (void)unused;
    if (count_dict == NULL || orig_get_active == NULL)
        Py_RETURN_NONE;
    PyObject *v = PyDict_GetItemWithError(count_dict, count_key);
    if (v == NULL) {
        if (PyErr_Occurred())
            return NULL;
        return PyObject_CallNoArgs(orig_get_active);
    }
    long count = PyLong_AsLong(v);
    if (count == -1 && PyErr_Occurred())
        return NULL;
    if (count <= kd_pushed_modes)
        Py_RETURN_NONE;
    PyObject *mode = PyObject_CallNoArgs(orig_get_active);
    if (mode == NULL || kd_mode_class == NULL)
        return mode;
    int is_kd = PyObject_IsInstance(mode, kd_mode_class);
    if (is_kd < 0) {
        Py_DECREF(mode);
        return NULL;
    }
    if (is_kd) {
        Py_DECREF(mode);
        Py_RETURN_NONE;
    }
    return mode;
}

static PyObject *kd_configure(PyObject *m, PyObject *args, PyObject *kw)
{
    (void)m;
    PyObject *bd, *cd, *orig, *cls;
    static char *kwlist[] = {"benchmark_globals", "count_globals", "get_active_debug_mode",
                             "mode_class", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O!O!OO", kwlist, &PyDict_Type, &bd,
                                     &PyDict_Type, &cd, &orig, &cls))
        return NULL;
    Py_XSETREF(bench_dict, Py_NewRef(bd));
    Py_XSETREF(count_dict, Py_NewRef(cd));
    Py_XSETREF(orig_get_active, Py_NewRef(orig));
    Py_XSETREF(kd_mode_class, Py_NewRef(cls));
    Py_RETURN_NONE;
}

static PyObject *kd_modes_pushed(PyObject *m, PyObject *arg)
{
    (void)m;
    long d = PyLong_AsLong(arg);
    if (d == -1 && PyErr_Occurred())
        return NULL;
    kd_pushed_modes += d;
    if (kd_pushed_modes < 0)
        kd_pushed_modes = 0;
    return PyLong_FromLong(kd_pushed_modes);
}

static PyObject *kd_set_compiling(PyObject *m, PyObject *arg)
{
    (void)m;
    int on = PyObject_IsTrue(arg);
    if (on < 0)
        return NULL;
    if (on)
        kd_tls_compiling++;
    else if (kd_tls_compiling > 0)
        kd_tls_compiling--;
    return PyLong_FromLong(kd_tls_compiling);
}

static PyMethodDef hook_methods[] = {
    {"_inductor_get_active_debug_mode", kd_inductor_get_active_debug_mode, METH_NOARGS,
     "get_active_debug_mode for triton_heuristics: hides kdebug modes."},
    {"_configure", (PyCFunction)(void (*)(void))kd_configure, METH_VARARGS | METH_KEYWORDS,
     "Point the hooks at upstream DebugMode's module globals."},
    {"_modes_pushed", kd_modes_pushed, METH_O,
     "Add to the count of kdebug modes on dispatch stacks; returns it."},
    {"_set_compiling", kd_set_compiling, METH_O,
     "Enter (True) or leave (False) a compile region on this thread."},
    {NULL, NULL, 0, NULL},
};

int kd_hook_module_init(PyObject *m)
{
    str_stream = PyUnicode_InternFromString("stream");
    str_benchmark_run = PyUnicode_InternFromString("benchmark_run");
    str_kdebug_info = PyUnicode_InternFromString("_kdebug_info");
    bench_key = PyUnicode_InternFromString("_IN_INDUCTOR_BENCHMARK");
    count_key = PyUnicode_InternFromString("_ACTIVE_DEBUG_MODE_COUNT");
    if (!str_stream || !str_benchmark_run || !str_kdebug_info || !bench_key || !count_key)
        return -1;
    if (PyModule_AddFunctions(m, hook_methods) != 0)
        return -1;
    PyTypeObject *types[] = {&kd_KernelInfoType, &kd_RunHookType, &kd_RunnerHookType,
                             &kd_CppKernelType};
    const char *names[] = {"KernelInfo", "RunHook", "RunnerHook", "CppKernel"};
    for (int i = 0; i < 4; i++) {
        if (PyType_Ready(types[i]) != 0)
            return -1;
        if (PyModule_AddObjectRef(m, names[i], (PyObject *)types[i]) != 0)
            return -1;
    }
    return 0;
}
