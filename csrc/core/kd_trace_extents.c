/* kd_trace_extents.c - an op record's extents tree (format 1.1, docs/trace-format.md) checked when a trace
 * is read: Note [Extents trees on reading].  Python-free. */
#include "kd_trace.h"
#include "kd_trace_extents.h"

/* Note [Extents trees on reading]
 * An op record's extents tree says which memory the op read and wrote; the comparison links each read to the
 * last earlier write that overlaps it (Note [Data flow] in kdebug/dataflow.py).  The reader checked only that
 * it is a well-formed hash tree (kd_tree_skip), which is not enough: a CRC-valid file whose tree's root was a
 * list where kdebug writes a tuple loaded as complete, then `kdebug show` died in TraceReader.op with a
 * traceback ("malformed extents tree") while `kdebug diff`, which had not read the tree, called the runs a
 * match.  So the reader checks the tree against what kdebug writes when it opens the file, as it checks every
 * other field, and refuses the file, naming the byte, when it does not fit:
 *
 *   - the root is a 2-tuple (inputs, outputs);
 *   - below it: None, lists, tuples and dicts (keys are not looked at), and extents: a tuple of 4 or 5 ints
 *     (device type, device index, first byte, one past the last byte[, the bytes its elements cover; format
 *     1.4]).  A tuple whose first item is an int is an extent; an int anywhere else, a float, a string or any
 *     other leaf is not kdebug's (kd_tree.c's tree_extents makes every other leaf None);
 *   - an extent's device type is 0 to 255 and its index -128 to 127 (c10's int8), its byte offsets are not
 *     negative, its first byte is not past its end, and the bytes its elements cover are at most that range
 *     (extent_leaf in kd_tree.c never writes more).
 *
 * What the checks cannot see (an address changed to another plausible one) reads as it is. */

static void fail_at(kd_cur *c, size_t at, const char *why)
{
    c->pos = at; /* the error names the node that does not fit */
    kd_cur_fail(c, why);
}

static void check_extent(kd_cur *c, uint64_t n, size_t at)
{
    uint64_t v[5];
    uint8_t tag[5];
    for (uint64_t i = 0; i < n && !c->bad; i++) {
        tag[i] = kd_cur_u8(c);
        if (tag[i] != KD_T_I64 && tag[i] != KD_T_U64) {
            fail_at(c, at, "malformed extents tree: an extent holds something other than 4 or 5 integers");
            return;
        }
        v[i] = kd_cur_u64(c);
    }
    if (c->bad)
        return;
    int64_t type = (int64_t)v[0], index = (int64_t)v[1];
    if (tag[0] != KD_T_I64 || type < 0 || type > 255 || tag[1] != KD_T_I64 || index < -128 || index > 127) {
        fail_at(c, at, "malformed extents tree: an extent's device type or index is out of range");
        return;
    }
    for (uint64_t i = 2; i < n; i++)
        if (tag[i] == KD_T_I64 && (int64_t)v[i] < 0) {
            fail_at(c, at, "malformed extents tree: an extent's byte offset is negative");
            return;
        }
    if (v[2] > v[3]) {
        fail_at(c, at, "malformed extents tree: an extent ends before it starts");
        return;
    }
    if (n == 5 && v[4] > v[3] - v[2])
        fail_at(c, at, "malformed extents tree: an extent covers more bytes than its range");
}

/* One node below the root and everything under it; depth is bounded by kd_tree_skip's check. */
static void check_node(kd_cur *c, int depth)
{
    size_t at = c->pos;
    if (depth > KD_TREE_MAX_DEPTH) {
        fail_at(c, at, "malformed extents tree: nested too deeply");
        return;
    }
    uint8_t tag = kd_cur_u8(c);
    if (tag == KD_T_NONE || c->bad)
        return;
    if (tag != KD_T_LIST && tag != KD_T_TUPLE && tag != KD_T_DICT) {
        fail_at(c, at, "malformed extents tree: a leaf that is neither None nor an extent (device type, "
                       "device index, first byte, one past the last byte)");
        return;
    }
    uint64_t n = kd_cur_varint(c);
    if (tag == KD_T_TUPLE && (n == 4 || n == 5) && c->pos < c->end &&
        (c->p[c->pos] == KD_T_I64 || c->p[c->pos] == KD_T_U64)) {
        check_extent(c, n, at);
        return;
    }
    for (uint64_t i = 0; i < n && !c->bad; i++) {
        if (tag == KD_T_DICT)
            c->pos += kd_cur_len(c);
        check_node(c, depth + 1);
    }
}

void kd_extents_check(kd_cur *c)
{
    size_t at = c->pos;
    uint8_t tag = kd_cur_u8(c);
    uint64_t n = tag == KD_T_TUPLE ? kd_cur_varint(c) : 0;
    if (c->bad)
        return;
    if (tag != KD_T_TUPLE || n != 2) {
        fail_at(c, at, "malformed extents tree: its root is not the pair (inputs, outputs)");
        return;
    }
    check_node(c, 1);
    check_node(c, 1);
}
