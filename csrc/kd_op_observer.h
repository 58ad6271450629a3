/* kd_op_observer.h - aten ops recorded by a C++ dispatcher observer, not a
 * Python dispatch mode (kd_op_observer.c, Note [C++ op observer]). */
#ifndef KD_OP_OBSERVER_H
#define KD_OP_OBSERVER_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* kd_recorder.op_mode */
enum {
    KD_OPS_NONE = 0,
    KD_OPS_EXTERN = 1, /* only ops issued while a compiled graph runs on the thread */
    KD_OPS_ALL = 2,    /* every outermost dispatcher op */
};

/* Adds _op_observer / _op_observer_remove / _graph_call to module m; -1 with
 * an exception on failure. */
int kd_op_observer_module_init(PyObject *m);

#endif
