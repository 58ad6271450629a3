/* kd_cpp_launch.h - kernel launches reported by generated C++ (Inductor's
 * C++ wrapper, AOTInductor models): kd_cpp_launch.c, Note [C++ wrapper
 * launches]. */
#ifndef KD_CPP_LAUNCH_H
#define KD_CPP_LAUNCH_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* Phases of kd_cpp_launch. */
enum { KD_CPP_BEFORE = 0, KD_CPP_AFTER = 1, KD_CPP_UNRECORDED = 2 /* a call kdebug cannot describe */ };

/* Most tensor arguments one reported launch may have; a launch with more is
 * counted as unrecorded. */
#define KD_CPP_MAX_ARGS 256

/* Called by generated C++ (found with dlopen/dlsym, hence exported) before
 * (phase KD_CPP_BEFORE) and after (KD_CPP_AFTER) each kernel launch: kind
 * (KD_KIND_CPP / KD_KIND_TRITON, KD_KIND_ATEN for an extern out= call), the
 * kernel's name, its n tensor arguments
 * as AtenTensorHandles (at::Tensor *) with their names and KD_ROLE_* roles.
 * Takes the GIL; records into this thread's active recorder, if any, through
 * the launch path.  KD_CPP_UNRECORDED: a call kdebug cannot describe ran
 * (counted as unrecorded on the recorder).  Never raises, never throws; returns 0, or -1 when the
 * launch could not be recorded (counted on the recorder). */
__attribute__((visibility("default"))) int kd_cpp_launch(int phase, int kind, const char *kernel_name, int n,
                                                         const char *const *arg_names, void *const *handles,
                                                         const unsigned char *roles);

/* Adds _cpp_launch_stats() to module m; -1 with an exception. */
int kd_cpp_launch_module_init(PyObject *m);

#endif
