/* kd_dispatch.h - DebugMode.__torch_dispatch__'s work, in C (kd_dispatch.c). */
#ifndef KD_DISPATCH_H
#define KD_DISPATCH_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* Interns the dispatch path's attribute names and adds its functions to
 * module m; -1 with an exception on failure. */
int kd_dispatch_module_init(PyObject *m);

#endif
