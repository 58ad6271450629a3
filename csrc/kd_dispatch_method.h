/* kd_dispatch_method.h - DebugMode.__torch_dispatch__ as a C method
 * (kd_dispatch_method.c, Note [A C __torch_dispatch__]). */
#ifndef KD_DISPATCH_METHOD_H
#define KD_DISPATCH_METHOD_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* Adds _dispatch_method to module m; -1 with an exception on failure. */
int kd_dispatch_method_module_init(PyObject *m);

#endif
