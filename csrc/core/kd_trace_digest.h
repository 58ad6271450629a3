/* kd_trace_digest.h - the digest primitives shared by the trace reader's files
 * (kd_trace_digest.c, kd_trace_read.c, kd_trace_tree.c).  Python-free. */
#ifndef KD_TRACE_DIGEST_H
#define KD_TRACE_DIGEST_H

#include <stddef.h>
#include <stdint.h>

#include "kd_trace.h"

/* One step of the digests: for a fixed h a bijection of v, for a fixed v a
 * bijection of h, so two records that differ in one value always get
 * different digests.  (Equality between runs is all they are used for.) */
static inline uint64_t kd_dg_mix(uint64_t h, uint64_t v)
{
    h = (h ^ v) * 0x9E3779B97F4A7C15ull;
    return h ^ (h >> 29);
}

/* Digest of the bytes p[0..n), never 0 (0 means "absent"). */
uint64_t kd_dg_bytes(const uint8_t *p, size_t n);

/* Digest of an op's rendered text up to its output ("  ->  "), or of all of it. */
uint64_t kd_text_prefix_digest(const uint8_t *s, size_t n);

/* Note [Returned values]: digest of an op text's output when it is a plain
 * value -- numbers, True / False / None, inf / nan, tuples and lists of them,
 * what .item() and other ops that return no tensor hand the program -- and 0
 * when the text has no output or its output is anything else (a tensor). */
uint64_t kd_text_value_digest(const uint8_t *s, size_t n);

/* The KD_DG_N digests of an op record from its parts: the digest of its name's
 * bytes, its depth, kd_text_prefix_digest and kd_text_value_digest of its
 * text, its KD_OPF_* flags and its encoded input / output hash trees.  An op
 * with no output hash is compared by its returned value, when it returned one
 * (Note [Returned values]).  A live op and its trace record digest alike
 * (Note [Launch table]). */
void kd_op_digests(uint64_t name_dg, uint32_t depth, uint64_t text_pdg, uint64_t text_vdg, uint32_t flags,
                   const uint8_t *in_tree, size_t in_len, const uint8_t *out_tree, size_t out_len,
                   uint64_t out[KD_DG_N]);

/* The KD_DG_N digests of a decoded op record (kd_tr_digests), computed once by kd_tr_open. */
void kd_tr_op_digests(const kd_tr *r, const kd_tr_op *op, uint64_t out[KD_DG_N]);

#endif
