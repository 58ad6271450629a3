/* kd_state_record.h - a record of tensors that must hold the same values on
 * every replica (Note [Replica state records] in kd_state_record.c). */
#ifndef KD_STATE_RECORD_H
#define KD_STATE_RECORD_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* Adds record_state() to module m; 0 or -1 with an exception. */
int kd_state_record_module_init(PyObject *m);

#endif
