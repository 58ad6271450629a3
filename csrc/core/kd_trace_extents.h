/* kd_trace_extents.h - checking an op record's extents tree against what kdebug writes (kd_trace_extents.c),
 * for the trace reader.  Python-free. */
#ifndef KD_TRACE_EXTENTS_H
#define KD_TRACE_EXTENTS_H

#include "kd_cursor.h"

/* Checks the extents tree at c->pos (a hash tree kd_tree_skip accepted) and leaves c after it; fails c,
 * at the offending node, with a "malformed extents tree: ..." reason (Note [Extents trees on reading]). */
void kd_extents_check(kd_cur *c);

#endif
