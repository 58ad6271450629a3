/* kd_trace_search.c - searches over an opened trace: which record last wrote
 * a piece of memory or produced a value (kd_tr_last_writer), and the byte
 * extent of a tensor argument.  Python-free. */
#include <stdlib.h>

#include "kd_args.h"
#include "kd_hash.h"
#include "kd_trace.h"

void kd_tensor_extent(const kd_payload *p, uint64_t *lo, uint64_t *hi)
{
    const kd_tensor_arg *t = &p->tensor;
    int isz = kd_itemsize(t->dtype);
    if (isz <= 0)
        isz = 1;
    uint64_t span = 0;
    for (uint32_t d = 0; d < t->ndim; d++) {
        int64_t size, stride;
        kd_tensor_dim(p, d, &size, &stride);
        if (size <= 0) {
            *lo = *hi = t->data_ptr;
            return;
        }
        span += (uint64_t)(size - 1) * (uint64_t)(stride < 0 ? -stride : stride);
    }
    *lo = t->data_ptr;
    *hi = t->data_ptr + (span + 1) * (uint64_t)isz;
}

int64_t kd_tr_last_writer(const kd_tr *r, uint64_t before, int dev_type, int dev_index,
                          uint64_t lo, uint64_t hi, uint64_t leaf, uint64_t *args_mask)
{
    *args_mask = 0;
    uint32_t cap = (uint32_t)r->max_nslots + 1;
    kd_payload *p = malloc((cap ? cap : 1) * sizeof *p);
    if (p == NULL)
        return -1;
    int64_t found = -1;
    for (uint64_t i = before < r->nrec ? before : r->nrec; i-- > 0 && found < 0;) {
        if (r->rec_type[i] == KD_REC_OP) {
            kd_tr_op op;
            if (leaf && kd_tr_op_get(r, i, &op) == 0 && (op.flags & KD_OPF_OUT_HASH) &&
                kd_tree_has_leaf(op.out_tree, op.out_len, leaf))
                found = (int64_t)i;
            continue;
        }
        if (hi <= lo)
            continue;
        uint32_t n = kd_tr_launch(r, i, p, cap);
        if (n == 0)
            continue;
        kd_arg_iter it = kd_args_begin(p, n);
        while (kd_args_next(&it)) {
            const kd_payload *q = it.arg;
            uint32_t a = it.index;
            if (q->tag == KD_TAG_TENSOR && (q->tensor.role & KD_ROLE_WRITE) &&
                q->tensor.device_type == dev_type && q->tensor.device_index == dev_index) {
                uint64_t a0, a1;
                kd_tensor_extent(q, &a0, &a1);
                if (a0 < a1 && a0 < hi && lo < a1) {
                    found = (int64_t)i;
                    if (a < 64)
                        *args_mask |= 1ull << a;
                }
            }
        }
    }
    free(p);
    return found;
}
