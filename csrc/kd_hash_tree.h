/* kd_hash_tree.h - the hash-tree codec (kd_hash_tree.c), used by TraceWriter
 * and TraceReader (kd_trace_py.c). */
#ifndef KD_HASH_TREE_H
#define KD_HASH_TREE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "kd_cursor.h"

/* The KD_T_* bytes of hash tree o; NULL with an exception on failure. */
PyObject *kd_hash_tree_bytes(PyObject *o);

/* The hash tree at c, read from bytes kd_tr_open validated (the cursor still
 * checks bounds); norm values are made with make_norm.  NULL with an exception
 * on failure. */
PyObject *kd_hash_tree_get(kd_cur *c, PyObject *make_norm, int depth);

/* tree_leaf_digest(value) -> the digest kd_tr_last_writer looks for in op
 * outputs; NULL with an exception on failure (self unused). */
PyObject *kd_mod_tree_leaf_digest(PyObject *self, PyObject *o);

#endif
