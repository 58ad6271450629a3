/* kd_tree.h - aten-op arguments and results as pytrees, walked in C (kd_tree.c). */
#ifndef KD_TREE_H
#define KD_TREE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* Every tensor leaf hashed (GPU ones queued: PendingHash leaves; CPU ones
 * value_fn(HashValues)); None when no leaf is a tensor; NotImplemented for a
 * tree this does not know (use Python's pytree).  A new reference, or NULL
 * with an exception. */
PyObject *kd_tree_hash(PyObject *obj, int kinds, int spec, unsigned long long stream, PyObject *value_fn);
/* Every tensor leaf cloned (no dispatch mode sees it), or NotImplemented. */
PyObject *kd_tree_clone(PyObject *obj);
/* Every tensor leaf as its Extent (device type, index, lo, hi) byte range, other
 * leaves None; NotImplemented for a tree this does not know. */
PyObject *kd_tree_extents(PyObject *obj);

/* Adds tree_resolve and tree_extents to module m; -1 with an exception on failure. */
int kd_tree_module_init(PyObject *m);

#endif
