/* kd_trace_write.c - the trace writer (Note [Trace format] in kd_trace.h).
 * Runs when recorded launches are drained, never on the launch path. */
#include <stdlib.h>
#include <string.h>

#include "kd_args.h"
#include "kd_grow.h"
#include "kd_trace.h"

/* ---------------- byte buffer ---------------- */

static int buf_reserve(kd_buf *b, size_t n)
{
    if (b->oom)
        return -1;
    if (b->len + n <= b->cap)
        return 0;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + n)
        cap *= 2;
    uint8_t *p = realloc(b->p, cap);
    if (p == NULL) {
        b->oom = 1;
        return -1;
    }
    b->p = p;
    b->cap = cap;
    return 0;
}

void kd_buf_free(kd_buf *b)
{
    free(b->p);
    memset(b, 0, sizeof *b);
}

void kd_buf_put(kd_buf *b, const void *src, size_t n)
{
    if (n == 0 || buf_reserve(b, n) != 0)
        return;
    memcpy(b->p + b->len, src, n);
    b->len += n;
}

void kd_buf_u8(kd_buf *b, uint8_t v)
{
    kd_buf_put(b, &v, 1);
}

void kd_buf_varint(kd_buf *b, uint64_t v)
{
    uint8_t tmp[10];
    size_t n = 0;
    do {
        uint8_t byte = (uint8_t)(v & 0x7f);
        v >>= 7;
        tmp[n++] = (uint8_t)(byte | (v ? 0x80 : 0));
    } while (v);
    kd_buf_put(b, tmp, n);
}

void kd_buf_svarint(kd_buf *b, int64_t v)
{
    kd_buf_varint(b, ((uint64_t)v << 1) ^ (uint64_t)(v >> 63));
}

void kd_buf_u64(kd_buf *b, uint64_t v)
{
    uint8_t tmp[8];
    for (int i = 0; i < 8; i++)
        tmp[i] = (uint8_t)(v >> (8 * i));
    kd_buf_put(b, tmp, 8);
}

void kd_buf_f64(kd_buf *b, double v)
{
    uint64_t u;
    memcpy(&u, &v, 8);
    kd_buf_u64(b, u);
}

/* ---------------- writer ---------------- */

static void put_u32le(uint8_t *d, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        d[i] = (uint8_t)(v >> (8 * i));
}

static void put_chunk(kd_buf *out, uint32_t type, const uint8_t *body, size_t len)
{
    uint8_t h[KD_CHUNK_HEADER_BYTES];
    memcpy(h, "KDCK", 4);
    put_u32le(h + 4, type);
    put_u32le(h + 8, (uint32_t)len);
    put_u32le(h + 12, kd_crc32(body, len));
    kd_buf_put(out, h, sizeof h);
    kd_buf_put(out, body, len);
}

int kd_tw_init(kd_tw *w) { return kd_tw_init_sized(w, 1u << 24); }

int kd_tw_init_sized(kd_tw *w, uint32_t max_strings)
{
    memset(w, 0, sizeof *w);
    w->local = kd_strtab_new(max_strings);
    if (w->local == NULL)
        return -1;
    w->full_id = kd_strtab_intern(w->local, KD_TW_NOT_STORED, sizeof KD_TW_NOT_STORED - 1);
    if (w->full_id == 0)
        return -1;
    /* written with the first STRINGS chunk, like any string */
    kd_buf_varint(&w->strings, sizeof KD_TW_NOT_STORED - 1);
    kd_buf_put(&w->strings, KD_TW_NOT_STORED, sizeof KD_TW_NOT_STORED - 1);
    w->nstrings_pending++;
    uint8_t h[KD_TRACE_HEADER_BYTES] = {0};
    memcpy(h, KD_TRACE_MAGIC, 8);
    h[8] = KD_TRACE_VERSION_MAJOR & 0xff;
    h[9] = KD_TRACE_VERSION_MAJOR >> 8;
    h[10] = KD_TRACE_VERSION_MINOR & 0xff;
    h[11] = KD_TRACE_VERSION_MINOR >> 8;
    put_u32le(h + 12, KD_TRACE_HEADER_BYTES);
    put_u32le(h + 16, KD_PAYLOAD_BYTES); /* informative: the in-memory record size */
    kd_buf_put(&w->out, h, sizeof h);
    return w->out.oom ? -1 : 0;
}

void kd_tw_free(kd_tw *w)
{
    kd_buf_free(&w->out);
    kd_buf_free(&w->body);
    kd_buf_free(&w->strings);
    kd_strtab_free(w->local);
    free(w->gmap);
    memset(w, 0, sizeof *w);
}

uint64_t kd_tw_records(const kd_tw *w)
{
    return w->nrec_total + w->nrec_chunk;
}

/* The local id of s, defining it in the pending STRINGS chunk when new. */
static uint32_t local_id(kd_tw *w, const char *s, size_t len)
{
    uint32_t before = kd_strtab_count(w->local);
    uint32_t id = kd_strtab_intern(w->local, s, len);
    if (id != 0 && id > before) {
        kd_buf_varint(&w->strings, len);
        kd_buf_put(&w->strings, s, len);
        w->nstrings_pending++;
    }
    return id;
}

static uint32_t map_global(kd_tw *w, const kd_strtab *g, uint32_t gid)
{
    if (gid == 0)
        return 0;
    if (gid >= w->gmap_cap) {
        uint64_t old = w->gmap_cap;
        if (kd_grow((void **)&w->gmap, &w->gmap_cap, (uint64_t)gid + 1, sizeof *w->gmap) != 0)
            return 0;
        memset(w->gmap + old, 0, (w->gmap_cap - old) * sizeof *w->gmap);
    }
    if (w->gmap[gid] == 0) {
        size_t len;
        const char *s = kd_strtab_get(g, gid, &len);
        w->gmap[gid] = local_id(w, s, len);
    }
    return w->gmap[gid];
}

static void ensure_bases(kd_tw *w, const kd_launch *l)
{
    if (w->have_bases)
        return;
    w->have_bases = 1;
    if (l != NULL) {
        w->base_t = l->t_start_ns;
        w->base_thread = l->thread_id;
        w->base_stream = l->stream;
        w->base_launch = l->launch_index;
    }
}

static void put_hash_side(kd_buf *b, const kd_hash_rec *h, int s)
{
    if (h->kinds & KD_HK_BITWISE)
        kd_buf_u64(b, h->bitwise[s]);
    if (h->kinds & (KD_HK_NORM | KD_HK_STATS)) {
        kd_buf_f64(b, h->l1[s]);
        kd_buf_varint(b, h->nan[s]);
        kd_buf_varint(b, h->posinf[s]);
        kd_buf_varint(b, h->neginf[s]);
    }
    if (h->kinds & KD_HK_XOR)
        kd_buf_u64(b, h->xor64[s]);
    if (h->kinds & KD_HK_STATS) { /* format 1.2 */
        kd_buf_f64(b, h->sum[s]);
        kd_buf_f64(b, h->absmax[s]);
    }
}

int kd_tw_launch(kd_tw *w, const kd_payload *p, uint32_t n, const kd_strtab *g)
{
    if (n == 0 || p[0].tag != KD_TAG_LAUNCH || (uint32_t)p[0].launch.nslots + 1 != n)
        return -1;
    const kd_launch *l = &p[0].launch;
    if (w->body.len > KD_CHUNK_MAX_BODY / 4 && kd_tw_seal(w) != 0)
        return -1;
    ensure_bases(w, l);
    kd_buf *b = &w->body;
    size_t start = b->len;
    kd_buf_u8(b, KD_REC_LAUNCH);
    kd_buf_u8(b, l->kind);
    kd_buf_u8(b, l->flags);
    kd_buf_u8(b, l->device_type);
    kd_buf_u8(b, (uint8_t)l->device_index);
    kd_buf_varint(b, map_global(w, g, l->name_id));
    kd_buf_varint(b, map_global(w, g, l->config_id));
    kd_buf_varint(b, l->num_warps);
    kd_buf_varint(b, l->num_stages);
    kd_buf_varint(b, l->shared_mem);
    kd_buf_varint(b, l->call_depth);
    if (l->flags & KD_LF_GRID)
        for (int k = 0; k < 3; k++)
            kd_buf_varint(b, l->grid[k]);
    if (l->flags & (KD_LF_CAPTURED | KD_LF_REPLAYED)) { /* format 1.3: Note [CUDA graph replays] */
        kd_buf_varint(b, l->graph_id);
        kd_buf_varint(b, l->replay_index);
    }
    kd_buf_svarint(b, (int64_t)(l->launch_index - w->base_launch));
    kd_buf_varint(b, l->py_index);
    kd_buf_svarint(b, (int64_t)(l->stream - w->base_stream));
    kd_buf_svarint(b, (int64_t)(l->thread_id - w->base_thread));
    kd_buf_svarint(b, (int64_t)(l->t_start_ns - w->base_t));
    kd_buf_varint(b, l->t_end_ns >= l->t_start_ns ? l->t_end_ns - l->t_start_ns : 0);
    kd_buf_varint(b, l->nargs);
    uint64_t prev_ptr = 0;
    kd_arg_iter it = kd_args_begin(p, n);
    while (kd_args_next(&it)) {
        const kd_payload *q = it.arg;
        kd_buf_u8(b, q->tag);
        kd_buf_u8(b, q->scalar.role);
        kd_buf_varint(b, map_global(w, g, q->scalar.name_id));
        switch (q->tag) {
        case KD_TAG_TENSOR: {
            const kd_tensor_arg *t = &q->tensor;
            if (t->ndim > KD_MAX_NDIM)
                return -1;
            w->tensor_args++;
            int same_dev = t->device_type == l->device_type && t->device_index == l->device_index;
            kd_buf_u8(b, (uint8_t)((t->flags & KD_TF_HASHED) | (same_dev ? 0x80 : 0)));
            if (!same_dev) {
                kd_buf_u8(b, t->device_type);
                kd_buf_u8(b, (uint8_t)t->device_index);
            }
            kd_buf_u8(b, t->dtype);
            kd_buf_u8(b, t->ndim);
            kd_buf_svarint(b, t->storage_offset);
            kd_buf_svarint(b, (int64_t)(t->data_ptr - prev_ptr));
            prev_ptr = t->data_ptr;
            for (uint32_t d = 0; d < t->ndim; d++) {
                int64_t size, stride;
                kd_tensor_dim(q, d, &size, &stride);
                kd_buf_varint(b, (uint64_t)size);
                kd_buf_svarint(b, stride);
            }
            if (it.hash != NULL) {
                const kd_hash_rec *h = it.hash;
                /* GPU values not read back are never written as if they were */
                uint8_t flags = h->flags & (uint8_t)~(KD_HF_PENDING_PRE | KD_HF_PENDING_POST);
                if (h->flags & KD_HF_PENDING_PRE)
                    flags &= (uint8_t)~KD_HF_PRE;
                if (h->flags & KD_HF_PENDING_POST)
                    flags &= (uint8_t)~KD_HF_POST;
                kd_buf_u8(b, h->kinds);
                kd_buf_u8(b, flags);
                kd_buf_varint(b, h->spec);
                if (flags & KD_HF_PRE)
                    put_hash_side(b, h, 0);
                if (flags & KD_HF_POST)
                    put_hash_side(b, h, 1);
            }
            break;
        }
        case KD_TAG_INT:
            kd_buf_svarint(b, q->scalar.value.i);
            break;
        case KD_TAG_FLOAT:
            kd_buf_f64(b, q->scalar.value.f);
            break;
        case KD_TAG_BOOL:
            kd_buf_u8(b, q->scalar.value.i ? 1 : 0);
            break;
        case KD_TAG_NONE:
            break;
        case KD_TAG_OTHER:
            kd_buf_varint(b, map_global(w, g, q->scalar.value.type_name_id));
            break;
        default:
            return -1;
        }
    }
    if (kd_args_truncated(&it))
        return -1; /* an argument's payloads run past the record */
    if (b->oom || w->strings.oom)
        return -1;
    w->launch_bytes += b->len - start;
    w->nrec_chunk++;
    return 0;
}

int kd_tw_op(kd_tw *w, uint32_t depth, uint32_t flags, const char *name, size_t name_len,
             const char *text, size_t text_len, const uint8_t *in_tree, size_t in_len,
             const uint8_t *out_tree, size_t out_len, const uint8_t *ext_tree, size_t ext_len)
{
    if (w->body.len + text_len + in_len + out_len + ext_len > KD_CHUNK_MAX_BODY / 4 && kd_tw_seal(w) != 0)
        return -1;
    if (text_len + in_len + out_len + ext_len + name_len > KD_CHUNK_MAX_BODY / 2)
        return -1;
    /* A string with a NUL fails the record (id 0 would read back as an
     * empty text; callers escape it first).  One the full table cannot take
     * is written as KD_TW_NOT_STORED and counted: the record is kept. */
    if (memchr(name, '\0', name_len) != NULL || memchr(text, '\0', text_len) != NULL)
        return -1;
    uint32_t name_id = local_id(w, name, name_len), text_id = local_id(w, text, text_len);
    if (name_id == 0)
        name_id = w->full_id, w->refused_strings++;
    if (text_id == 0)
        text_id = w->full_id, w->refused_strings++;
    ensure_bases(w, NULL);
    kd_buf *b = &w->body;
    kd_buf_u8(b, KD_REC_OP);
    kd_buf_varint(b, flags);
    kd_buf_varint(b, depth);
    kd_buf_varint(b, name_id);
    kd_buf_varint(b, text_id);
    if (flags & KD_OPF_IN_HASH) {
        kd_buf_varint(b, in_len);
        kd_buf_put(b, in_tree, in_len);
    }
    if (flags & KD_OPF_OUT_HASH) {
        kd_buf_varint(b, out_len);
        kd_buf_put(b, out_tree, out_len);
    }
    if (flags & KD_OPF_EXTENTS) {
        kd_buf_varint(b, ext_len);
        kd_buf_put(b, ext_tree, ext_len);
    }
    if (b->oom || w->strings.oom)
        return -1;
    w->nrec_chunk++;
    return 0;
}

int kd_tw_meta(kd_tw *w, const char *json, size_t len)
{
    if (kd_tw_seal(w) != 0)
        return -1;
    put_chunk(&w->out, KD_CHUNK_META, (const uint8_t *)json, len);
    return w->out.oom ? -1 : 0;
}

int kd_tw_seal(kd_tw *w)
{
    if (w->nstrings_pending) {
        kd_buf s = {0};
        kd_buf_varint(&s, w->nstrings_pending);
        kd_buf_put(&s, w->strings.p, w->strings.len);
        if (s.oom) {
            kd_buf_free(&s);
            return -1;
        }
        put_chunk(&w->out, KD_CHUNK_STRINGS, s.p, s.len);
        kd_buf_free(&s);
        w->strings.len = 0;
        w->nstrings_pending = 0;
    }
    if (w->nrec_chunk) {
        kd_buf c = {0};
        kd_buf_varint(&c, w->nrec_chunk);
        kd_buf_varint(&c, w->base_t);
        kd_buf_varint(&c, w->base_thread);
        kd_buf_varint(&c, w->base_stream);
        kd_buf_varint(&c, w->base_launch);
        kd_buf_put(&c, w->body.p, w->body.len);
        if (c.oom) {
            kd_buf_free(&c);
            return -1;
        }
        put_chunk(&w->out, KD_CHUNK_RECORDS, c.p, c.len);
        kd_buf_free(&c);
        w->body.len = 0;
        w->nrec_total += w->nrec_chunk;
        w->nrec_chunk = 0;
        w->have_bases = 0;
    }
    return w->out.oom ? -1 : 0;
}

int kd_tw_end(kd_tw *w)
{
    if (kd_tw_seal(w) != 0)
        return -1;
    kd_buf e = {0};
    kd_buf_varint(&e, w->nrec_total);
    put_chunk(&w->out, KD_CHUNK_END, e.p, e.len);
    kd_buf_free(&e);
    return w->out.oom ? -1 : 0;
}
