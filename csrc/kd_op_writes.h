/* kd_op_writes.h - what an aten op writes (kd_op_writes.c), for the dispatch
 * path (kd_dispatch.c): deferred-work guards and Note [Fresh buffers]. */
#ifndef KD_OP_WRITES_H
#define KD_OP_WRITES_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* The fields of an OpInfo (kdebug/_boundary.py, made by mode._op_info), read
 * by index once kd_dispatch.c checked its type (Note [Typed boundaries]). */
enum { KD_OPI_SPECIAL, KD_OPI_HASH_SKIPPED, KD_OPI_MAKES_EMPTY, KD_OPI_WRITES, KD_OPI_WRITTEN_POS,
       KD_OPI_WRITTEN_NAMES, KD_OPI_OUT_NAMES, KD_OPI_CALLABLE, KD_OPI_VIEW, KD_OPI_N };

/* Whether the OpInfo's boolean field i is True. */
static inline int kd_op_flag(PyObject *info, int i) { return PyTuple_GET_ITEM(info, i) == Py_True; }

/* Flushes deferred GPU work that the op is about to overwrite (Note [Deferred GPU work]); kwargs may be NULL. */
void kd_op_guard_writes(PyObject *info, PyObject *args, PyObject *kwargs);

/* Note [Fresh buffers] (kd_fresh.c): after the op ran, what it wrote (its
 * written arguments, what it returns) is no longer fresh, and with add what
 * an empty* op made is; kwargs may be NULL; 0, or -1 with an error. */
int kd_op_track_fresh(PyObject *fresh, PyObject *info, PyObject *args, PyObject *kwargs, PyObject *result,
                      int add);

/* args with the written arguments that are still fresh replaced by None (new reference), or NULL with an error. */
PyObject *kd_op_without_fresh(PyObject *fresh, PyObject *info, PyObject *args);

/* 1 when a tensor argument of args (top level, or in a list) is still fresh, else 0; -1 with an error. */
int kd_op_reads_fresh(PyObject *fresh, PyObject *args);

/* Note [Writes returned by no output]: the values an op wrote in place when
 * it returns nothing (result None) - the foreach and fused optimizer ops
 * (_foreach_add_, _fused_adam_: Tensor(a!)[] self ... -> ()) - as a tuple of
 * its written arguments in schema order (positional, then keyword), to be
 * hashed as its outputs; Py_None (new reference) when it returned something,
 * writes nothing or writes what kdebug cannot name; NULL with an error. */
PyObject *kd_op_written_values(PyObject *info, PyObject *args, PyObject *kwargs, PyObject *result);

/* kwargs with the op's out= arguments as None, or kwargs itself (new reference); NULL with an error. */
PyObject *kd_op_without_outs(PyObject *info, PyObject *kwargs);

#endif
