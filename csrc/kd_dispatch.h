/* kd_dispatch.h - DebugMode.__torch_dispatch__'s work, in C (kd_dispatch.c). */
#ifndef KD_DISPATCH_H
#define KD_DISPATCH_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* One aten op under mode (DebugMode.__torch_dispatch__'s body, Note [Fast
 * aten-op recording]): the op's result, or NULL with an exception. */
PyObject *kd_dispatch_op(PyObject *mode, PyObject *func, PyObject *types, PyObject *args,
                         PyObject *kwargs);

/* The op's OpInfo (mode._op_info's, cached; borrowed), or NULL with an exception. */
PyObject *kd_dispatch_op_info(PyObject *func);

/* Interns the dispatch path's attribute names and adds its functions to
 * module m (kd_dispatch_method.c's too); -1 with an exception on failure. */
int kd_dispatch_module_init(PyObject *m);

#endif
