/* kd_args.h - the one walk over a launch record's argument payloads.
 *
 * Note [Argument payloads]
 * A launch record (Note [Record layout] in kd_record.h) is rec[0], its
 * KD_TAG_LAUNCH header, then header.nslots payloads that hold header.nargs
 * arguments, in order, each as a run of consecutive payloads:
 *
 *   scalar (INT/FLOAT/BOOL/NONE/OTHER)   1 payload
 *   tensor                               1 payload (ndim <= KD_INLINE_DIMS dims)
 *                                        + one KD_TAG_DIMS per KD_CONT_DIMS more dims
 *                                        + one KD_TAG_HASH when KD_TF_HASHED is set
 *
 * so an argument's length is known from its first payload alone
 * (kd_arg_payloads) and the hash payload, when there is one, is its last.
 * Nothing in the record says where argument k starts: every reader walks the
 * arguments from the first, and every reader walks them with kd_args_next.
 *
 * The walk trusts nothing it reads: the header's nargs and nslots and each
 * tensor's ndim and flags may come from a corrupt trace file or a half-built
 * record.  It reads only rec[0..n) and rec[0..1 + nslots) (the smaller), and
 * stops, before yielding it, at the first argument whose payloads would not
 * all fit; kd_args_truncated then says that fewer than nargs were walked.  A
 * record that is not a launch has no arguments.  The iterator hands out const
 * pointers; a caller that updates the record (hash payloads after a launch)
 * writes through its own pointer at it.off / it.hash_off.
 */
#ifndef KD_ARGS_H
#define KD_ARGS_H

#include <stddef.h>
#include <stdint.h>

#include "kd_record.h"

typedef struct kd_arg_iter {
    const kd_payload *rec; /* the launch record, rec[0] its header */
    uint32_t end;          /* payloads of rec the walk may read */
    uint32_t nargs;        /* arguments the header declares */
    uint32_t next;         /* offset of the next argument's first payload */
    uint32_t walked;       /* arguments yielded so far */
    /* the current argument, once kd_args_next returned 1: */
    uint32_t index;        /* its number, 0-based */
    uint32_t off;          /* offset of its first payload in rec */
    uint32_t npayloads;    /* payloads it takes, dims and hash included (>= 1) */
    uint32_t hash_off;     /* offset of its hash payload in rec, 0 when none */
    const kd_payload *arg; /* &rec[off] */
    const kd_hash_rec *hash; /* &rec[hash_off].hash for a hashed tensor, else NULL */
} kd_arg_iter;

/* A walk over the arguments of launch record rec, of which only rec[0..n) may be read. */
static inline kd_arg_iter kd_args_begin(const kd_payload *rec, uint32_t n)
{
    kd_arg_iter it = {.rec = rec, .next = 1};
    if (rec == NULL || n == 0 || rec[0].tag != KD_TAG_LAUNCH)
        return it; /* end 0, nargs 0: no arguments */
    uint32_t slots = 1u + rec[0].launch.nslots;
    it.end = n < slots ? n : slots;
    it.nargs = rec[0].launch.nargs;
    return it;
}

/* Steps to the next argument: 1 with its fields set, 0 at the end or at an argument that does not fit. */
static inline int kd_args_next(kd_arg_iter *it)
{
    if (it->walked >= it->nargs || it->next >= it->end)
        return 0;
    const kd_payload *a = &it->rec[it->next];
    uint32_t np = kd_arg_payloads(a); /* >= 1, <= 1 + 37 + 1 for any ndim byte */
    if (np > it->end - it->next)
        return 0; /* its dims or hash would lie past the record: corrupt */
    it->index = it->walked++;
    it->off = it->next;
    it->npayloads = np;
    it->arg = a;
    int hashed = a->tag == KD_TAG_TENSOR && (a->tensor.flags & KD_TF_HASHED);
    it->hash_off = hashed ? it->off + np - 1 : 0;
    it->hash = hashed ? &it->rec[it->hash_off].hash : NULL;
    it->next += np;
    return 1;
}

/* After the walk: 1 when it ended before all nargs arguments were yielded (a corrupt or short record). */
static inline int kd_args_truncated(const kd_arg_iter *it)
{
    return it->walked < it->nargs;
}

#endif
