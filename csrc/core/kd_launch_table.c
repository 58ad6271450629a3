/* kd_launch_table.c - the launch table and the digests of a launch (Note
 * [Launch table] in kd_launch_table.h).  Python-free. */
#include <stdlib.h>
#include <string.h>

#include "kd_hash.h"
#include "kd_launch_table.h"
#include "kd_args.h"
#include "kd_trace_digest.h"

void kd_ltab_init(kd_ltab *t)
{
    kd_store_init(&t->store);
    t->generation = 0;
}

void kd_ltab_free(kd_ltab *t)
{
    kd_store_free(&t->store);
    t->generation = 0;
}

void kd_ltab_clear(kd_ltab *t)
{
    t->generation++;
    kd_store_clear(&t->store);
}

void kd_ltab_forget(kd_ltab *t, uint64_t n)
{
    t->generation++;
    kd_store_drop_front(&t->store, n);
}

uint64_t kd_strtab_digest(const void *strtab, uint32_t id)
{
    size_t n;
    const char *s = kd_strtab_get((const kd_strtab *)strtab, id, &n);
    return kd_dg_bytes((const uint8_t *)s, n);
}

/* Folds one hash record's sides into *pre / *post (as the trace holds it: a
 * side still pending on the GPU is absent). */
static void fold_hash(uint64_t arg, const kd_hash_rec *h, uint64_t *pre, uint64_t *post, int *any_pre,
                      int *any_post)
{
    kd_hash_rec v = *h;
    if (v.flags & KD_HF_PENDING_PRE)
        v.flags &= (uint8_t)~KD_HF_PRE;
    if (v.flags & KD_HF_PENDING_POST)
        v.flags &= (uint8_t)~KD_HF_POST;
    uint64_t d0 = kd_tr_hash_digest(&v, 0), d1 = kd_tr_hash_digest(&v, 1);
    if (d0) {
        *pre = kd_dg_mix(kd_dg_mix(*pre, arg), d0);
        *any_pre = 1;
    }
    if (d1) {
        *post = kd_dg_mix(kd_dg_mix(*post, arg), d1);
        *any_post = 1;
    }
}

void kd_launch_digests(const kd_payload *p, uint32_t n, kd_str_digest_fn sdg, const void *ctx,
                       uint64_t out[KD_DG_N])
{
    const kd_launch *l = &p[0].launch;
    out[KD_DG_KEY] = kd_dg_mix(l->kind, sdg(ctx, l->name_id));
    uint64_t cf = kd_dg_mix(kd_dg_mix(l->flags & KD_LF_GRID, l->grid[0]), l->grid[1]);
    cf = kd_dg_mix(kd_dg_mix(cf, l->grid[2]), sdg(ctx, l->config_id));
    out[KD_DG_CONFIG] = kd_dg_mix(kd_dg_mix(cf, l->num_warps), l->num_stages);
    uint64_t shape = kd_dg_mix(7, l->nargs), pre = 0, post = 0;
    int any_pre = 0, any_post = 0;
    kd_arg_iter it = kd_args_begin(p, n);
    while (kd_args_next(&it)) {
        const kd_payload *q = it.arg;
        uint32_t a = it.index;
        shape = kd_dg_mix(kd_dg_mix(kd_dg_mix(shape, q->tag), q->scalar.role), sdg(ctx, q->scalar.name_id));
        if (q->tag == KD_TAG_TENSOR) {
            shape = kd_dg_mix(kd_dg_mix(shape, q->tensor.dtype), q->tensor.ndim);
            for (uint32_t d = 0; d < q->tensor.ndim; d++) {
                int64_t size, stride;
                kd_tensor_dim(q, d, &size, &stride);
                shape = kd_dg_mix(kd_dg_mix(shape, (uint64_t)size), (uint64_t)stride);
            }
            if (it.hash != NULL)
                fold_hash(a, it.hash, &pre, &post, &any_pre, &any_post);
        } else if (q->tag == KD_TAG_INT || q->tag == KD_TAG_FLOAT || q->tag == KD_TAG_BOOL) {
            uint64_t v = q->tag == KD_TAG_BOOL ? (q->scalar.value.i != 0) : (uint64_t)q->scalar.value.i;
            shape = kd_dg_mix(shape, v);
        }
    }
    out[KD_DG_SHAPE] = shape;
    out[KD_DG_PRE] = any_pre ? kd_fmix64(pre) | 1 : 0;
    out[KD_DG_POST] = any_post ? kd_fmix64(post) | 1 : 0;
}

uint64_t kd_ltab_digests(const kd_ltab *t, uint64_t start, uint64_t stop, const kd_strtab *strings,
                         uint64_t *out)
{
    if (stop > t->store.nlaunches)
        stop = t->store.nlaunches;
    for (uint64_t i = start; i < stop; i++) {
        const kd_payload *p = kd_store_launch(&t->store, i);
        kd_launch_digests(p, (uint32_t)p->launch.nslots + 1, kd_strtab_digest, strings, &out[(i - start) * KD_DG_N]);
    }
    return stop > start ? stop - start : 0;
}

/* The global id of file string id (interned on first use; 0 if the table is full). */
static uint32_t global_id(const kd_tr *r, kd_ltab_ids *ids, uint32_t id)
{
    if (id == 0 || id > r->nstr)
        return 0;
    if (ids->map[id] == 0) {
        size_t n;
        const char *s = kd_tr_string(r, id, &n);
        ids->map[id] = kd_strtab_intern(ids->strings, s, n);
    }
    return ids->map[id];
}

int64_t kd_ltab_fill_trace(kd_ltab *t, const kd_tr *r, uint64_t start, uint64_t stop, kd_ltab_ids *ids,
                           uint64_t *rec_index)
{
    uint32_t cap = (uint32_t)r->max_nslots + 1;
    kd_payload *p = malloc(cap * sizeof *p);
    if (p == NULL)
        return -1;
    if (stop > r->nrec)
        stop = r->nrec;
    int64_t added = 0;
    for (uint64_t i = start; i < stop; i++) {
        if (r->rec_type[i] != KD_REC_LAUNCH)
            continue;
        uint32_t n = kd_tr_launch(r, i, p, cap);
        if (n == 0) {
            added = -2;
            break;
        }
        p[0].launch.name_id = global_id(r, ids, p[0].launch.name_id);
        p[0].launch.config_id = global_id(r, ids, p[0].launch.config_id);
        kd_arg_iter it = kd_args_begin(p, n);
        while (kd_args_next(&it)) {
            kd_payload *q = &p[it.off]; /* p is ours to update */
            q->scalar.name_id = global_id(r, ids, q->scalar.name_id);
            if (q->tag == KD_TAG_OTHER)
                q->scalar.value.type_name_id = global_id(r, ids, q->scalar.value.type_name_id);
            if (it.hash != NULL) {
                kd_hash_rec *h = &p[it.hash_off].hash;
                h->spec = h->spec < ids->nspec ? ids->spec[h->spec] : 0;
            }
        }
        if (kd_args_truncated(&it)) { /* not all its string ids were mapped */
            added = -2;
            break;
        }
        if (kd_store_append(&t->store, p, n) != 0) {
            added = -1;
            break;
        }
        rec_index[added++] = i;
    }
    free(p);
    return added;
}

uint64_t kd_launch_digest_term(const kd_payload *p, uint32_t n, const kd_strtab *strings)
{
    uint64_t dg[KD_DG_N];
    kd_launch_digests(p, n, kd_strtab_digest, strings, dg);
    return kd_fmix64(kd_dg_mix(kd_dg_mix(dg[KD_DG_KEY], dg[KD_DG_SHAPE]), dg[KD_DG_POST]));
}

uint64_t kd_digest_finish(uint64_t sum, uint64_t count)
{
    return kd_fmix64(sum ^ kd_fmix64(count ^ 0x5851F42D4C957F2Dull));
}

uint64_t kd_ltab_range_digest(const kd_ltab *t, uint64_t start, uint64_t stop, const kd_strtab *strings)
{
    if (stop > t->store.nlaunches)
        stop = t->store.nlaunches;
    uint64_t sum = 0, count = 0;
    for (uint64_t i = start; i < stop; i++, count++) {
        const kd_payload *p = kd_store_launch(&t->store, i);
        sum += kd_launch_digest_term(p, (uint32_t)p->launch.nslots + 1, strings);
    }
    return kd_digest_finish(sum, count);
}
