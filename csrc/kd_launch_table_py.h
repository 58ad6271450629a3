/* kd_launch_table_py.h - the Python face of the launch table (Note [Launch
 * table] in core/kd_launch_table.h): digests for compare, filling from a trace. */
#ifndef KD_LAUNCH_TABLE_PY_H
#define KD_LAUNCH_TABLE_PY_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

extern PyTypeObject kd_LaunchTableType;

/* Adds LaunchTable, launch_digests, op_digests and table_fill to module m;
 * -1 with an exception on failure. */
int kd_launch_table_module_init(PyObject *m);

#endif
