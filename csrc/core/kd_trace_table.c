/* kd_trace_table.c - a trace's records as fixed-size rows (Note [Trace
 * tables] in kd_trace.h), for the HTML report and the Perfetto export.
 * Python-free. */
#include <stdlib.h>
#include <string.h>

#include "kd_args.h"
#include "kd_grow.h"
#include "kd_trace.h"

static uint32_t sat32(uint64_t v)
{
    return v > UINT32_MAX ? UINT32_MAX : (uint32_t)v;
}

static void put_hashes(kd_tab_arg *a, const kd_hash_rec *h)
{
    a->hash_kinds = h->kinds;
    a->hash_flags = h->flags;
    for (int w = 0; w < 2; w++) {
        a->bitwise[w] = h->bitwise[w];
        a->l1[w] = h->l1[w];
        a->nan[w] = sat32(h->nan[w]);
        a->posinf[w] = sat32(h->posinf[w]);
        a->neginf[w] = sat32(h->neginf[w]);
        a->xor64[w] = h->xor64[w]; /* or the stats' sum: the same bytes */
        a->absmax[w] = (h->kinds & KD_HK_STATS) ? h->absmax[w] : 0.0;
    }
}

/* Appends the argument rows (and tensor sizes) of decoded launch p[0..n). */
static int put_args(kd_tab *t, const kd_payload *p, uint32_t n)
{
    const kd_launch *l = &p[0].launch;
    if (kd_grow((void **)&t->arg, &t->arg_cap, t->narg + l->nargs, sizeof *t->arg) != 0)
        return -1;
    kd_arg_iter it = kd_args_begin(p, n);
    while (kd_args_next(&it)) {
        const kd_payload *q = it.arg;
        kd_tab_arg *a = &t->arg[t->narg++];
        memset(a, 0, sizeof *a);
        a->tag = q->tag;
        a->role = q->scalar.role;
        a->name_id = q->scalar.name_id;
        a->device_type = l->device_type;
        a->device_index = l->device_index;
        switch (q->tag) {
        case KD_TAG_TENSOR: {
            const kd_tensor_arg *x = &q->tensor;
            a->dtype = x->dtype;
            a->ndim = x->ndim;
            a->device_type = x->device_type;
            a->device_index = x->device_index;
            if (kd_grow((void **)&t->dims, &t->dims_cap, t->ndims + x->ndim, sizeof *t->dims) != 0)
                return -1;
            uint64_t numel = 1;
            for (uint32_t d = 0; d < x->ndim; d++) {
                int64_t size, stride;
                kd_tensor_dim(q, d, &size, &stride);
                t->dims[t->ndims++] = size;
                uint64_t s = size > 0 ? (uint64_t)size : 0;
                numel = (s != 0 && numel > INT64_MAX / s) ? (uint64_t)INT64_MAX : numel * s;
            }
            a->value.i = (int64_t)numel;
            if (it.hash != NULL)
                put_hashes(a, it.hash);
            break;
        }
        case KD_TAG_INT:
        case KD_TAG_BOOL:
            a->value.i = q->scalar.value.i;
            break;
        case KD_TAG_FLOAT:
            a->value.f = q->scalar.value.f;
            break;
        case KD_TAG_OTHER:
            a->other_id = q->scalar.value.type_name_id;
            break;
        default:
            break;
        }
    }
    return 0;
}

int kd_tr_table(const kd_tr *r, uint64_t start, uint64_t stop, kd_tab *t)
{
    if (stop > r->nrec)
        stop = r->nrec;
    if (start >= stop)
        return 0;
    if (kd_grow((void **)&t->rec, &t->rec_cap, t->nrec + (stop - start), sizeof *t->rec) != 0)
        return -1;
    uint32_t cap = (uint32_t)r->max_nslots + 1;
    kd_payload *p = malloc(cap * sizeof *p);
    if (p == NULL)
        return -1;
    int rc = 0;
    for (uint64_t i = start; i < stop && rc == 0; i++) {
        kd_tab_rec *row = &t->rec[t->nrec];
        memset(row, 0, sizeof *row);
        if (r->rec_type[i] == KD_REC_OP) {
            kd_tr_op op;
            if (kd_tr_op_get(r, i, &op) != 0) {
                rc = -2;
                break;
            }
            row->type = KD_REC_OP;
            row->kind = (uint8_t)op.flags;
            row->device_type = 255;
            row->device_index = -1;
            row->depth = (uint16_t)op.depth;
            row->name_id = op.name_id;
            row->text_id = op.text_id;
            t->nrec++;
            continue;
        }
        uint32_t n = kd_tr_launch(r, i, p, cap);
        if (n == 0) {
            rc = -2;
            break;
        }
        const kd_launch *l = &p[0].launch;
        row->type = KD_REC_LAUNCH;
        row->kind = l->kind;
        row->device_type = l->device_type;
        row->device_index = l->device_index;
        row->depth = l->call_depth;
        row->name_id = l->name_id;
        row->text_id = l->config_id;
        memcpy(row->grid, l->grid, sizeof row->grid);
        row->num_warps = l->num_warps;
        row->num_stages = l->num_stages;
        row->flags = l->flags;
        row->launch_index = l->launch_index;
        row->stream = l->stream;
        row->thread_id = l->thread_id;
        row->t_start_ns = l->t_start_ns;
        row->t_end_ns = l->t_end_ns;
        row->shared_mem = l->shared_mem;
        t->nrec++;
        uint64_t before = t->narg;
        if (put_args(t, p, n) != 0)
            rc = -1;
        row->nargs = (uint16_t)(t->narg - before); /* the rows written, <= l->nargs */
    }
    free(p);
    return rc;
}

void kd_tab_free(kd_tab *t)
{
    free(t->rec);
    free(t->arg);
    free(t->dims);
    memset(t, 0, sizeof *t);
}
