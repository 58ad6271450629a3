/* kd_fresh.h - the storages a DebugMode knows to hold uninitialized memory
 * (Note [Fresh buffers], kd_fresh.c). */
#ifndef KD_FRESH_H
#define KD_FRESH_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* 1 when fresh is a fresh-storage table (mode._fresh: a dict of kdebug's
 * making), else 0. */
int kd_fresh_check(PyObject *fresh);

/* Each tensor of o (a tensor, or a list / tuple of them, one level) marked
 * fresh (add) or not (discard); 0, or -1 with an error. */
int kd_fresh_mark(PyObject *fresh, PyObject *o, int add);

/* 1 when tensor t's storage is fresh, 0 when not (or t is no tensor), -1
 * with an error. */
int kd_fresh_contains(PyObject *fresh, PyObject *t);

/* Adds _fresh_storages() to module m; -1 with an exception. */
int kd_fresh_module_init(PyObject *m);

#endif
