/* kd_cpp_launch.c - kernel launches made from generated C++ (Inductor's C++
 * wrapper, cpp_wrapper=True, and AOTInductor models), recorded through the
 * launch path (kd_launch.c) like the launches of the Python wrapper.
 *
 * Note [C++ wrapper launches]
 * With cpp_wrapper=True or AOTInductor, Inductor's generated C++ calls the
 * kernels itself: no CachingAutotuner.run and no pybinding of a C++ kernel is
 * called from Python, so kdebug's launch hooks (Note [Where kdebug hooks
 * Inductor] in kd_hook.c) never see them.  Three places could:
 *
 *   - A CUDA driver callback layer (CUPTI).  Sees every launch, Triton or
 *     not, but only on CUDA (the C++ kernels of CPU graphs are plain
 *     function calls), gives a kernel's raw parameter buffer (pointers, no
 *     tensors: no dtype, shape or roles), and costs a callback per launch
 *     for the whole process.  Rejected: no CPU coverage, no arguments.
 *   - A launcher shim (kdebug replacing Inductor's launch helpers in its C++
 *     runtime headers).  The headers are torch's, precompiled, and differ
 *     between the JIT and AOT wrappers and across versions.  Rejected.
 *   - Inductor's intermediate-value printer codegen (chosen).  Every kernel
 *     call the C++ wrappers emit -- C++ kernels (cpp_wrapper_cpu), Triton
 *     kernels (cpp_wrapper_gpu), extern shim calls -- is written inside
 *     `with V.graph.wrapper_code.debug_printer:` after set_printer_args(
 *     call args, kernel name, arg types, ...): code emitted there runs right
 *     before and right after the launch, with the launch's tensors in scope
 *     as AtenTensorHandles.  kdebug/inductor.py extends that manager: while a
 *     kdebug recording is active at compile time it emits, around each C++
 *     and Triton kernel call, kd_cpp_launch(phase, kind, name, n, names,
 *     handles, roles) (roles from the same rules as the Python path: `T*` vs
 *     `const T*` for C++ kernels, out_ptr / in_out_ptr names and the
 *     kernel's mutated args for Triton).  The generated code finds this
 *     function once, with dlopen(<kdebug's extension>, RTLD_NOLOAD) and
 *     dlsym, and does nothing while kdebug is not loaded; while kdebug is
 *     loaded but not recording, kd_cpp_launch returns at once (no recorder
 *     started, checked without the GIL).  Coverage: every kernel call on CPU and CUDA,
 *     with the tensors' metadata; cost: nothing in modules compiled outside
 *     a recording (no code is emitted), and in hooked modules one call per
 *     launch side.
 *
 * Here: kd_cpp_launch takes the GIL (the C++ wrapper may run without it),
 * finds this thread's active recorder (kd_active_recorder: none while
 * compiling or benchmarking), gives each AtenTensorHandle a Python tensor
 * (kd_shim_wrap_handle: the tensor's own Python object when it has one, a new
 * one for a buffer the C++ wrapper allocated -- an allocation, the same cost
 * as the C++ op observer's fresh outputs, Note [C++ op observer]) and
 * writes the launch with kd_launch_begin / kd_launch_end, so the record, its
 * hashes (CPU in C, CUDA through the GPU hash batch), record_outputs and
 * check_inputs_unchanged are exactly the Python path's.  Between the two
 * phases the pending launch lives in this thread's slot and the GIL is
 * released while the kernel runs.  A launch whose after-phase never comes
 * (the generated code threw between the two) is ended as raised by the
 * next launch on the thread.  What cannot be recorded (too many
 * arguments, a handle that is no tensor) is counted on the recorder
 * (unrecorded) with its reason; nothing raises into the generated code.
 *
 * Extern calls.  The C++ wrappers call extern kernels through C-shim
 * functions (aoti_torch_cpu_mm_out) that call at::cpu:: / at::cuda::
 * directly, outside the dispatcher: neither upstream's mode nor Note [C++ op
 * observer] sees them, although the Python wrapper's extern_kernels.mm(...,
 * out=) is an aten op both see.  out= calls (ExternKernelOut: mm, addmm,
 * bmm, convolution, ...) are reported like kernels, kind KD_KIND_ATEN, named
 * as the op observer names them ("aten::mm.out"), `out` written and the
 * schema's other tensor arguments read: their output hashes equal the
 * Python path's op hashes.  Every other C-shim call (fallbacks whose
 * outputs the shim allocates) reports phase KD_CPP_UNRECORDED and is counted
 * as unrecorded, so such a recording is not complete and says which call.
 *
 * An argument that is a view the wrapper makes for the call
 * (reinterpret_tensor_wrapper(buf, ...)) is made once more inside the hook's
 * block and kept alive by its Python tensor until the after-phase.  Kernel
 * calls kdebug cannot describe (an argument that is no variable or such a
 * view; CPU Triton kernels, called outside the printer manager) report
 * KD_CPP_UNRECORDED too.
 *
 * Scalars.  A kernel's scalar parameters (the sizes of a dynamic-shape
 * graph, ks0, ...; a Triton kernel's xnumel, r0_numel too) are passed by
 * value in call order among the tensors (kd_cpp_launch_v2: a role flag per
 * argument, the value in an int64 or a double array), recorded as the Python
 * wrapper's calls record their Python ints and floats.  A Triton scalar's
 * value is the C++ expression the wrapper passes (prepare_triton_wrapper_args:
 * sympy sizes as cexpr), its int or float kind from the kernel's signature;
 * one whose signature type is neither is refused as unrecorded.  A Python
 * scalar passed as a 0-d CPU tensor (UnwrapUnspecArg, read inside the call)
 * is not seen.
 *
 * Triton grids and configs (HOOK_VERSION 3).  A CUDA C++ wrapper calls each
 * Triton kernel through a function of its own that computes the grid; in a
 * hooked module that function calls kd_cpp_grid(grid, num_warps, num_stages,
 * shared memory, config text) right before the launch, between the call
 * site's two phases: kept in this thread's capture (kd_tls_capture, as the
 * Python path's runner hook does) and written into the record at the
 * after-phase, the config text interned there (with the GIL).  2.13's lazy
 * Triton path (autotune_at_compile_time=False) writes its launch elsewhere:
 * those launches have no grid.  Array-ref (stack-allocated) AOTI
 * models get no hook and are refused like un-hooked packages.
 */
#include "kd_cpp_launch.h"

#include <string.h>

#include "kd_hook.h"
#include "kd_kernel_info.h"
#include "kd_launch.h"
#include "kd_module.h"
#include "kd_recorder.h"
#include "kd_shim.h"

/* A launch between its two phases on this thread. */
typedef struct cpp_pending {
    int active;
    kd_recorder *r; /* strong reference while active */
    kd_pending p;
    int n;
    const char *kernel_name;         /* the generated code's string literals */
    const char *const *arg_names;
    const char *config;              /* kd_cpp_grid's config text, interned at the after-phase */
    PyObject *objs[KD_CPP_MAX_ARGS]; /* strong references while active */
} cpp_pending;

static _Thread_local cpp_pending tls_cpp;
static unsigned long long cpp_calls[2]; /* GIL; tests: phases seen with a recorder */
static PyObject *cpp_fault_hook = NULL; /* GIL; tests: kdebug.testing plants faults through it */

/* Tests only (kdebug.testing.perturb_kernel_output): the fault hook, if set,
 * runs after the kernel, before its record is completed, with the kernel's
 * name and its {argument name: tensor}; what it raises is counted. */
static void run_fault_hook(kd_recorder *r, cpp_pending *c)
{
    PyObject *d = PyDict_New();
    for (int i = 0; d != NULL && i < c->n; i++)
        if (PyDict_SetItemString(d, c->arg_names[i], c->objs[i]) != 0)
            Py_CLEAR(d);
    PyObject *res = d != NULL ? PyObject_CallFunction(cpp_fault_hook, "sO", c->kernel_name, d) : NULL;
    if (res == NULL) {
        PyErr_Clear();
        kd_recorder_error(r, "kdebug.testing's C++-wrapper fault hook raised");
    }
    Py_XDECREF(res);
    Py_XDECREF(d);
}

/* Ends the pending launch of this thread (GIL held) and drops its references. */
static void finish(int raised)
{
    cpp_pending *c = &tls_cpp;
    if (c->config != NULL && kd_tls_capture.have_config) /* the GIL is held here */
        kd_tls_capture.config_id = kd_strtab_intern(kd_strings, c->config, strlen(c->config));
    c->config = NULL;
    if (cpp_fault_hook != NULL && !raised)
        run_fault_hook(c->r, c);
    kd_launch_end(c->r, &c->p, c->objs, c->n, raised);
    for (int i = 0; i < c->n; i++)
        Py_DECREF(c->objs[i]);
    Py_DECREF(c->r);
    c->n = 0;
    c->r = NULL;
    c->active = 0;
}

/* Counts a launch that could not be recorded, with its reason, on r. */
static int refuse(kd_recorder *r, const char *kernel_name, const char *why)
{
    char msg[640];
    snprintf(msg, sizeof msg, "a C++-wrapper launch of %s was not recorded: %s", kernel_name, why);
    kd_recorder_error(r, msg);
    r->unrecorded++;
    return -1;
}

/* Argument i of a launch as a Python object: a tensor for a handle, an int
 * or float for a scalar (KD_CPP_SCALAR_*); NULL with kd_shim_last_error()
 * or *why set. */
static PyObject *arg_object(int i, void *const *handles, const unsigned char *roles, const long long *ivals,
                            const double *fvals, const char **why)
{
    if (roles[i] & KD_CPP_SCALAR_INT) {
        if (ivals == NULL) {
            *why = "a scalar argument without its value";
            return NULL;
        }
        return PyLong_FromLongLong(ivals[i]);
    }
    if (roles[i] & KD_CPP_SCALAR_FLOAT) {
        if (fvals == NULL) {
            *why = "a scalar argument without its value";
            return NULL;
        }
        return PyFloat_FromDouble(fvals[i]);
    }
    PyObject *o = kd_shim_wrap_handle(handles[i]);
    if (o == NULL)
        *why = kd_shim_last_error();
    return o;
}

/* The before-phase with the GIL held: describes the launch into r's ring. */
static int begin(kd_recorder *r, int kind, const char *kernel_name, int n, const char *const *arg_names,
                 void *const *handles, const unsigned char *roles, const long long *ivals, const double *fvals)
{
    cpp_pending *c = &tls_cpp;
    if (n < 0 || n > KD_CPP_MAX_ARGS)
        return refuse(r, kernel_name, "more arguments than kdebug records from C++ (1024); compile with "
                                      "cpp_wrapper=False (the Python wrapper) to record it");
    uint32_t name_ids[KD_CPP_MAX_ARGS];
    uint8_t rls[KD_CPP_MAX_ARGS];
    kd_kernel_info info; /* read by the launch path only: no Python object */
    memset(&info, 0, sizeof info);
    info.kind = (uint8_t)kind;
    info.name_id = kd_strtab_intern(kd_strings, kernel_name, strlen(kernel_name));
    if (info.name_id == 0)
        return refuse(r, kernel_name, "kdebug's string table is full");
    info.device_type = KD_DEV_CPU;
    info.device_index = -1;
    uint64_t stream = 0;
    int placed = 0;
    for (int i = 0; i < n; i++) {
        const char *why = "?";
        PyObject *o = arg_object(i, handles, roles, ivals, fvals, &why);
        if (o == NULL) {
            PyErr_Clear();
            for (int k = 0; k < i; k++)
                Py_DECREF(c->objs[k]);
            return refuse(r, kernel_name, why);
        }
        c->objs[i] = o;
        name_ids[i] = kd_strtab_intern(kd_strings, arg_names[i], strlen(arg_names[i]));
        rls[i] = roles[i] & (KD_ROLE_READ | KD_ROLE_WRITE);
        /* the wrapper launches on the current stream of its first tensor's device */
        if (!placed && !(roles[i] & (KD_CPP_SCALAR_INT | KD_CPP_SCALAR_FLOAT)))
            placed = kd_launch_device_of(o, &info, &stream);
    }
    info.nnames = (uint32_t)n;
    info.name_ids = name_ids;
    info.roles = rls;
    Py_INCREF(r);
    c->r = r;
    c->n = n;
    c->kernel_name = kernel_name;
    c->arg_names = arg_names;
    memset(&kd_tls_capture, 0, sizeof kd_tls_capture); /* kd_cpp_grid may fill it */
    c->config = NULL;
    kd_launch_begin(r, &info, c->objs, n, stream, &c->p);
    c->active = 1;
    return 0;
}

int kd_cpp_launch(int phase, int kind, const char *kernel_name, int n, const char *const *arg_names,
                  void *const *handles, const unsigned char *roles)
{
    /* HOOK_VERSION 1's modules: tensors only; a role with a scalar flag
     * (never emitted by them) is refused in begin, as it has no value */
    return kd_cpp_launch_v2(phase, kind, kernel_name, n, arg_names, handles, roles, NULL, NULL);
}

int kd_cpp_launch_v2(int phase, int kind, const char *kernel_name, int n, const char *const *arg_names,
                     void *const *handles, const unsigned char *roles, const long long *ivals,
                     const double *fvals)
{
    if (!Py_IsInitialized())
        return 0;
    cpp_pending *c0 = &tls_cpp;
    /* Without the GIL: nothing is recording (kd_started_recorders is written
     * under the GIL; a stale read only delays the first recorded launch of a
     * recorder another thread is starting) and nothing is pending here. */
    if (phase == KD_CPP_AFTER ? !c0->active
                              : (!c0->active && kd_tls_recorder == NULL &&
                                 __atomic_load_n(&kd_started_recorders, __ATOMIC_RELAXED) == 0))
        return 0;
    PyGILState_STATE g = PyGILState_Ensure();
    PyObject *et, *ev, *etb;
    PyErr_Fetch(&et, &ev, &etb); /* the caller's error state is not ours */
    int rc = 0;
    cpp_pending *c = &tls_cpp;
    if (phase == KD_CPP_BEFORE) {
        if (c->active) /* the last launch's after-phase never came: it threw */
            finish(1);
        kd_recorder *r = kd_active_recorder();
        if (r == NULL)
            kd_note_unrecorded_launch();
        if (r != NULL) {
            cpp_calls[0]++;
            rc = begin(r, kind == KD_KIND_TRITON || kind == KD_KIND_ATEN ? kind : KD_KIND_CPP,
                       kernel_name != NULL ? kernel_name : "?", n, arg_names, handles, roles, ivals, fvals);
        }
    } else if (phase == KD_CPP_AFTER && c->active) {
        cpp_calls[1]++;
        finish(0);
    } else if (phase == KD_CPP_UNRECORDED) {
        kd_recorder *r = kd_active_recorder();
        if (r != NULL)
            rc = refuse(r, kernel_name != NULL ? kernel_name : "?",
                        "a call in C++-wrapper code that kdebug does not describe (an extern call "
                        "whose outputs the C shim allocates, a CPU Triton kernel, an argument that is "
                        "no plain variable or a scalar of a type kdebug does not record: the warning "
                        "when it was compiled names it); compile with cpp_wrapper=False (the Python "
                        "wrapper) to record it");
    }
    PyErr_Clear();
    PyErr_Restore(et, ev, etb);
    PyGILState_Release(g);
    return rc;
}

void kd_cpp_grid(unsigned gx, unsigned gy, unsigned gz, int num_warps, int num_stages, int shared_mem,
                 const char *config)
{
    cpp_pending *c = &tls_cpp;
    if (!c->active) /* thread-local: no GIL needed */
        return;
    kd_tls_capture.have_grid = 1;
    kd_tls_capture.grid[0] = gx;
    kd_tls_capture.grid[1] = gy;
    kd_tls_capture.grid[2] = gz;
    kd_tls_capture.have_config = 1;
    kd_tls_capture.num_warps = (uint16_t)(num_warps > 0 ? num_warps : 0);
    kd_tls_capture.num_stages = (uint8_t)(num_stages > 0 && num_stages < 256 ? num_stages : 0);
    kd_tls_capture.shared_mem = (uint32_t)(shared_mem > 0 ? shared_mem : 0);
    kd_tls_capture.config_id = 0;
    c->config = config;
}

/* _cpp_launch_stats() -> {"before": n, "after": n}: launch phases that found
 * a recorder in this process (tests: the generated code reached kdebug). */
static PyObject *kd_cpp_launch_stats(PyObject *m, PyObject *unused)
{
    (void)m, (void)unused;
    return Py_BuildValue("{sKsK}", "before", cpp_calls[0], "after", cpp_calls[1]);
}

/* _cpp_launch_fault_hook(fn or None): tests only (run_fault_hook). */
static PyObject *kd_cpp_launch_fault_hook(PyObject *m, PyObject *fn)
{
    (void)m;
    if (fn != Py_None && !PyCallable_Check(fn)) {
        PyErr_SetString(PyExc_TypeError, "_cpp_launch_fault_hook takes a callable or None");
        return NULL;
    }
    Py_XSETREF(cpp_fault_hook, fn == Py_None ? NULL : Py_NewRef(fn));
    Py_RETURN_NONE;
}

static PyMethodDef cpp_launch_methods[] = {
    {"_cpp_launch_fault_hook", kd_cpp_launch_fault_hook, METH_O,
     "_cpp_launch_fault_hook(fn or None): tests only; fn(kernel_name, {arg: tensor}) after each C++-wrapper launch."},
    {"_cpp_launch_stats", kd_cpp_launch_stats, METH_NOARGS,
     "_cpp_launch_stats() -> {'before', 'after'}: C++-wrapper launch phases that found a recorder."},
    {NULL, NULL, 0, NULL},
};

int kd_cpp_launch_module_init(PyObject *m)
{
    return PyModule_AddFunctions(m, cpp_launch_methods);
}
