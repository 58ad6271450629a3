/* kd_fmt.h - upstream DebugMode's argument strings, made in C (kd_fmt.c). */
#ifndef KD_FMT_H
#define KD_FMT_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* Upstream DebugMode's text, or NotImplemented where the Python functions
 * format_args, format_kwargs, format_output must make it (m unused). */
PyObject *kd_format_args(PyObject *m, PyObject *args);
PyObject *kd_format_kwargs(PyObject *m, PyObject *kwargs);
PyObject *kd_format_output(PyObject *m, PyObject *result);

/* Adds format_args / format_kwargs / format_output to module m; -1 with an
 * exception on failure. */
int kd_fmt_module_init(PyObject *m);

#endif
