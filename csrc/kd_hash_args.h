/* kd_hash_args.h - what an aten op's hashes are taken of when upstream's
 * hook runners hash it (kd_hash_args.c, Note [Hashes of one op on every path]). */
#ifndef KD_HASH_ARGS_H
#define KD_HASH_ARGS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* Adds op_hash_inputs / op_hash_outputs to module m; -1 with an exception. */
int kd_hash_args_module_init(PyObject *m);

#endif
