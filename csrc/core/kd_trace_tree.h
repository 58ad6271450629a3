/* kd_trace_tree.h - walking the hash trees inside trace records (kd_trace_tree.c),
 * shared with the trace reader.  Python-free. */
#ifndef KD_TRACE_TREE_H
#define KD_TRACE_TREE_H

#include "kd_cursor.h"

/* Validates the tree node at c->pos and everything under it, leaving c after it; fails c on a malformed tree. */
void kd_tree_skip(kd_cur *c);

#endif
