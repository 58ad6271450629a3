/* kd_trace_tree.c - the hash trees inside trace records (Note [Trace format] in
 * kd_trace.h): validating one (kd_tree_skip, for the reader) and searching
 * one for a leaf (kd_tree_has_leaf, for kd_tr_last_writer).  Python-free. */
#include "kd_cursor.h"
#include "kd_trace.h"
#include "kd_trace_digest.h"
#include "kd_trace_tree.h"

/* Validates one tree node and everything under it; iterative, with a stack
 * of the open containers. */
void kd_tree_skip(kd_cur *c)
{
    uint64_t left[KD_TREE_MAX_DEPTH + 1]; /* items still to read per open container */
    uint8_t dict[KD_TREE_MAX_DEPTH + 1];
    int open = 0; /* open containers: the depth of the next node */
    for (;;) {
        if (open > KD_TREE_MAX_DEPTH) {
            kd_cur_fail(c, "hash tree nested too deeply");
            break;
        }
        uint8_t tag = kd_cur_u8(c);
        switch (tag) {
        case KD_T_NONE:
            break;
        case KD_T_LIST:
        case KD_T_TUPLE:
        case KD_T_DICT: {
            uint64_t n = kd_cur_varint(c);
            if (n > c->end - c->pos) {
                kd_cur_fail(c, "hash tree has more items than bytes");
                break;
            }
            left[open] = n;
            dict[open] = tag == KD_T_DICT;
            open++;
            break;
        }
        case KD_T_I64:
        case KD_T_U64:
        case KD_T_F64:
            kd_cur_u64(c);
            break;
        case KD_T_NORM:
            kd_cur_u64(c);
            kd_cur_varint(c);
            kd_cur_varint(c);
            kd_cur_varint(c);
            break;
        case KD_T_STATS: /* format 1.2 */
            kd_cur_u64(c);
            kd_cur_u64(c);
            kd_cur_u64(c);
            kd_cur_varint(c);
            kd_cur_varint(c);
            kd_cur_varint(c);
            break;
        case KD_T_BOOL:
            kd_cur_u8(c);
            break;
        case KD_T_STR:
            c->pos += kd_cur_len(c);
            break;
        default:
            kd_cur_fail(c, "unknown hash tree tag");
        }
        /* the next item of the innermost container with items left */
        while (open > 0 && left[open - 1] == 0)
            open--;
        if (open == 0 || c->bad)
            break;
        left[open - 1]--;
        if (dict[open - 1])
            c->pos += kd_cur_len(c);
        if (c->bad)
            break;
    }
}

static int tree_find(kd_cur *c, int depth, uint64_t leaf)
{
    if (depth > KD_TREE_MAX_DEPTH || c->bad)
        return 0;
    size_t start = c->pos;
    uint8_t tag = kd_cur_u8(c);
    if (tag == KD_T_LIST || tag == KD_T_TUPLE || tag == KD_T_DICT) {
        uint64_t n = kd_cur_varint(c);
        for (uint64_t i = 0; i < n && !c->bad; i++) {
            if (tag == KD_T_DICT)
                c->pos += kd_cur_len(c);
            if (tree_find(c, depth + 1, leaf))
                return 1;
        }
        return 0;
    }
    c->pos = start;
    kd_tree_skip(c); /* a leaf */
    return !c->bad && tag != KD_T_NONE && kd_dg_bytes(c->p + start, c->pos - start) == leaf;
}

int kd_tree_has_leaf(const uint8_t *p, size_t n, uint64_t leaf)
{
    kd_cur c = {p, 0, n, 0, 0, NULL};
    return tree_find(&c, 0, leaf);
}
