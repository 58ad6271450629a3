/* kd_trace_read.c - the trace reader (Note [Trace format] in kd_trace.h).
 * Every byte is bounds-checked; kd_tr_open decodes every record once, so the
 * later per-record calls work on validated data.  Fuzzed by csrc/tests. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kd_cursor.h"
#include "kd_grow.h"
#include "kd_hash.h"
#include "kd_launch_table.h"
#include "kd_trace.h"
#include "kd_trace_digest.h"
#include "kd_trace_extents.h"
#include "kd_trace_tree.h"


static uint32_t get_u32le(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint32_t get_str_id(kd_cur *c, const kd_tr *r)
{
    uint64_t id = kd_cur_varint(c);
    if (id > r->nstr) {
        kd_cur_fail(c, "string id not defined by an earlier STRINGS chunk");
        return 0;
    }
    return (uint32_t)id;
}

const char *kd_tr_string(const kd_tr *r, uint32_t id, size_t *len)
{
    if (id == 0 || id > r->nstr) {
        if (len)
            *len = 0;
        return "";
    }
    if (len)
        *len = r->str_len[id];
    return (const char *)r->data + r->str_off[id];
}

/* ---------------- launch records ---------------- */

static void read_hash_side(kd_cur *c, kd_hash_rec *h, int s)
{
    if (h->kinds & KD_HK_BITWISE)
        h->bitwise[s] = kd_cur_u64(c);
    if (h->kinds & (KD_HK_NORM | KD_HK_STATS)) {
        h->l1[s] = kd_cur_f64(c);
        h->nan[s] = kd_cur_varint(c);
        h->posinf[s] = kd_cur_varint(c);
        h->neginf[s] = kd_cur_varint(c);
    }
    if (h->kinds & KD_HK_XOR)
        h->xor64[s] = kd_cur_u64(c);
    if (h->kinds & KD_HK_STATS) { /* format 1.2 */
        h->sum[s] = kd_cur_f64(c);
        h->absmax[s] = kd_cur_f64(c);
    }
}

/* The fields of decode_launch, on the caller's cursor copy. */
static uint32_t launch_fields(kd_cur *c, const kd_tr *r, const kd_tr_chunk *ch, kd_payload *out,
                              uint32_t cap, uint64_t *tensor_args)
{
    kd_launch l;
    memset(&l, 0, sizeof l);
    if (kd_cur_u8(c) != KD_REC_LAUNCH) {
        kd_cur_fail(c, "not a launch record");
        return 0;
    }
    l.tag = KD_TAG_LAUNCH;
    l.kind = kd_cur_u8(c);
    l.flags = kd_cur_u8(c);
    l.device_type = kd_cur_u8(c);
    l.device_index = (int8_t)kd_cur_u8(c);
    if (!c->bad && l.kind != KD_KIND_TRITON && l.kind != KD_KIND_CPP && l.kind != KD_KIND_ATEN)
        kd_cur_fail(c, "unknown kernel kind");
    l.name_id = get_str_id(c, r);
    l.config_id = get_str_id(c, r);
    l.num_warps = (uint16_t)kd_cur_varint(c);
    l.num_stages = (uint8_t)kd_cur_varint(c);
    l.shared_mem = (uint32_t)kd_cur_varint(c);
    l.call_depth = (uint16_t)kd_cur_varint(c);
    if (l.flags & KD_LF_GRID)
        for (int k = 0; k < 3; k++)
            l.grid[k] = (uint32_t)kd_cur_varint(c);
    if (l.flags & (KD_LF_CAPTURED | KD_LF_REPLAYED)) { /* format 1.3 */
        uint64_t gid = kd_cur_varint(c);
        if (gid > UINT32_MAX)
            kd_cur_fail(c, "CUDA graph id out of range");
        l.graph_id = (uint32_t)gid;
        l.replay_index = kd_cur_varint(c);
    }
    l.launch_index = ch->base_launch + (uint64_t)kd_cur_svarint(c);
    l.py_index = kd_cur_varint(c);
    l.stream = ch->base_stream + (uint64_t)kd_cur_svarint(c);
    l.thread_id = ch->base_thread + (uint64_t)kd_cur_svarint(c);
    l.t_start_ns = ch->base_t + (uint64_t)kd_cur_svarint(c);
    l.t_end_ns = l.t_start_ns + kd_cur_varint(c);
    uint64_t nargs = kd_cur_varint(c);
    if (c->bad)
        return 0;
    if (nargs > 0xffff) {
        kd_cur_fail(c, "too many arguments");
        return 0;
    }
    l.nargs = (uint16_t)nargs;
    uint32_t k = 1;
    uint64_t prev_ptr = 0;
    for (uint64_t a = 0; a < nargs && !c->bad; a++) {
        uint8_t tag = kd_cur_u8(c);
        uint8_t role = kd_cur_u8(c);
        uint32_t name_id = get_str_id(c, r);
        if (c->bad)
            return 0;
        if (tag == KD_TAG_TENSOR) {
            uint8_t tflags = kd_cur_u8(c);
            uint8_t dt = l.device_type;
            int8_t di = l.device_index;
            if (!(tflags & 0x80)) {
                dt = kd_cur_u8(c);
                di = (int8_t)kd_cur_u8(c);
            }
            uint8_t dtype = kd_cur_u8(c);
            uint8_t ndim = kd_cur_u8(c);
            if (c->bad)
                return 0;
            if (ndim > KD_MAX_NDIM) {
                kd_cur_fail(c, "tensor has more than 64 dimensions");
                return 0;
            }
            int hashed = (tflags & KD_TF_HASHED) != 0;
            uint32_t need = kd_tensor_payloads(ndim) + (uint32_t)hashed;
            if (k + need > 0xffffu) {
                kd_cur_fail(c, "launch needs too many payloads");
                return 0;
            }
            if (k + need > cap)
                cap = 0; /* does not fit: keep validating, store nothing more */
            kd_payload *q = cap ? &out[k] : NULL;
            int64_t storage_offset = kd_cur_svarint(c);
            uint64_t data_ptr = prev_ptr + (uint64_t)kd_cur_svarint(c);
            prev_ptr = data_ptr;
            if (q) {
                memset(q, 0, need * sizeof *q);
                kd_tensor_arg *t = &q->tensor;
                t->tag = KD_TAG_TENSOR;
                t->role = role;
                t->name_id = name_id;
                t->flags = (uint8_t)(tflags & KD_TF_HASHED);
                t->device_type = dt;
                t->device_index = di;
                t->dtype = dtype;
                t->ndim = ndim;
                t->storage_offset = storage_offset;
                t->data_ptr = data_ptr;
            }
            for (uint32_t d = 0; d < ndim && !c->bad; d++) {
                int64_t size = (int64_t)kd_cur_varint(c);
                int64_t stride = kd_cur_svarint(c);
                if (q == NULL)
                    continue;
                if (d < KD_INLINE_DIMS) {
                    q->tensor.sizes[d] = size;
                    q->tensor.strides[d] = stride;
                } else {
                    uint32_t e = d - KD_INLINE_DIMS;
                    kd_dims_cont *dc = &q[1 + e / KD_CONT_DIMS].dims;
                    dc->tag = KD_TAG_DIMS;
                    dc->count++;
                    dc->sizes[e % KD_CONT_DIMS] = size;
                    dc->strides[e % KD_CONT_DIMS] = stride;
                }
            }
            if (hashed) {
                kd_payload local;
                kd_hash_rec *h = q ? &q[kd_tensor_payloads(ndim)].hash : &local.hash;
                h->tag = KD_TAG_HASH;
                h->kinds = kd_cur_u8(c);
                h->flags = kd_cur_u8(c);
                h->spec = (uint16_t)kd_cur_varint(c);
                if (!c->bad && (h->kinds & ~(KD_HK_BITWISE | KD_HK_NORM | KD_HK_XOR | KD_HK_CUSTOM | KD_HK_STATS)))
                    kd_cur_fail(c, "unknown hash kind");
                if (!c->bad && KD_HK_CONFLICT(h->kinds))
                    kd_cur_fail(c, "stats and hash_tensor hashes in one record (Note [Room for the stats])");
                if (!c->bad && (h->flags & (KD_HF_PENDING_PRE | KD_HF_PENDING_POST)))
                    kd_cur_fail(c, "hash marked pending in a file");
                if (h->flags & KD_HF_PRE)
                    read_hash_side(c, h, 0);
                if (h->flags & KD_HF_POST)
                    read_hash_side(c, h, 1);
            }
            (*tensor_args)++;
            k += need;
            continue;
        }
        kd_payload scalar;
        memset(&scalar, 0, sizeof scalar);
        kd_scalar_arg *q = &scalar.scalar;
        q->tag = tag;
        q->role = role;
        q->name_id = name_id;
        switch (tag) {
        case KD_TAG_INT:
            q->value.i = kd_cur_svarint(c);
            break;
        case KD_TAG_FLOAT:
            q->value.f = kd_cur_f64(c);
            break;
        case KD_TAG_BOOL:
            q->value.i = kd_cur_u8(c) ? 1 : 0;
            break;
        case KD_TAG_NONE:
            break;
        case KD_TAG_OTHER:
            q->value.type_name_id = get_str_id(c, r);
            break;
        default:
            kd_cur_fail(c, "unknown argument tag");
            return 0;
        }
        if (k + 1 > 0xffffu) {
            kd_cur_fail(c, "launch needs too many payloads");
            return 0;
        }
        if (k + 1 > cap)
            cap = 0;
        if (cap)
            out[k] = scalar;
        k++;
    }
    if (c->bad)
        return 0;
    l.nslots = (uint16_t)(k - 1);
    if (cap)
        out[0].launch = l;
    return k;
}

/* Decodes and validates the launch record at c->pos: stores its payloads in
 * out[0..cap) (cap 0: none).  Returns the payload count (header included;
 * more than cap: not stored), or 0 with c->bad set.  It works on a local copy
 * of the cursor, which stores into out (byte-typed, so aliasing anything)
 * cannot touch. */
static uint32_t decode_launch(kd_cur *c, const kd_tr *r, const kd_tr_chunk *ch, kd_payload *out,
                              uint32_t cap, uint64_t *tensor_args)
{
    kd_cur cur = *c;
    uint32_t k = launch_fields(&cur, r, ch, out, cap, tensor_args);
    *c = cur;
    return k;
}

/* kd_str_digest_fn over a file's strings (ctx: the reader). */
static uint64_t file_str_digest(const void *ctx, uint32_t id)
{
    const kd_tr *r = ctx;
    return id <= r->nstr ? r->str_dg[id] : 0;
}

/* Validates the launch record at c->pos and digests it (kd_launch_digests,
 * Note [Launch table]) through the scratch buffer *buf (grown as needed).
 * Returns the payload count, or 0 with c->bad set (or out of memory: *oom). */
static uint32_t digest_launch(kd_cur *c, kd_tr *r, const kd_tr_chunk *ch, kd_payload **buf, uint64_t *cap,
                              uint64_t *dg, int *oom)
{
    size_t at = c->pos;
    uint64_t ta = 0;
    uint32_t got = decode_launch(c, r, ch, *buf, (uint32_t)*cap, &ta);
    if (got > *cap) { /* too big for the scratch buffer: grow it, decode again */
        if (kd_grow((void **)buf, cap, got, sizeof **buf) != 0) {
            *oom = 1;
            return 0;
        }
        c->pos = at;
        ta = 0;
        got = decode_launch(c, r, ch, *buf, (uint32_t)*cap, &ta);
    }
    if (got == 0 || c->bad)
        return 0;
    r->tensor_args += ta;
    kd_launch_digests(*buf, got, file_str_digest, r, dg);
    return got;
}

static int decode_op(kd_cur *c, const kd_tr *r, kd_tr_op *op)
{
    memset(op, 0, sizeof *op);
    if (kd_cur_u8(c) != KD_REC_OP) {
        kd_cur_fail(c, "not an op record");
        return -1;
    }
    uint64_t flags = kd_cur_varint(c);
    if (flags & ~(uint64_t)(KD_OPF_IN_HASH | KD_OPF_OUT_HASH | KD_OPF_OPCALL | KD_OPF_EXTENTS)) {
        kd_cur_fail(c, "unknown op record flags");
        return -1;
    }
    op->flags = (uint32_t)flags;
    op->depth = (uint32_t)kd_cur_varint(c);
    op->name_id = get_str_id(c, r);
    op->text_id = get_str_id(c, r);
    static const uint32_t side_flag[3] = {KD_OPF_IN_HASH, KD_OPF_OUT_HASH, KD_OPF_EXTENTS};
    for (int side = 0; side < 3; side++) {
        if (!(flags & side_flag[side]))
            continue;
        size_t n = kd_cur_len(c);
        if (c->bad)
            return -1;
        kd_cur sub = {c->p, c->pos, c->pos + n, 0, 0, NULL};
        kd_tree_skip(&sub);
        if (!sub.bad && sub.pos != sub.end)
            kd_cur_fail(&sub, "bytes left over after a hash tree");
        if (!sub.bad && side == 2) { /* Note [Extents trees on reading] */
            sub.pos = c->pos;
            kd_extents_check(&sub);
        }
        if (sub.bad) {
            kd_cur_fail(c, sub.why);
            c->bad_off = sub.bad_off;
            return -1;
        }
        if (side == 2) {
            op->ext_tree = c->p + c->pos;
            op->ext_len = n;
        } else if (side == 1) {
            op->out_tree = c->p + c->pos;
            op->out_len = n;
        } else {
            op->in_tree = c->p + c->pos;
            op->in_len = n;
        }
        c->pos += n;
    }
    return c->bad ? -1 : 0;
}

/* ---------------- the file ---------------- */

static int set_err(kd_tr *r, uint64_t off, const char *why)
{
    r->err_off = off;
    snprintf(r->err, sizeof r->err, "%s", why);
    return -1;
}

/* Whether data[from, size) ends with a whole END chunk (magic, type, a varint body of 1 to 10 bytes, its CRC).
 * Note [Cut or corrupt]: a chunk that runs past the end of the file is a recording cut short (each chunk is
 * written whole, with one write(): a process that dies leaves a prefix of its last one), unless the file still
 * ends with its END chunk: then the chunk's length field is what is wrong, and the file is corrupt. */
static int ends_with_end_chunk(const uint8_t *data, size_t from, size_t size)
{
    for (uint32_t len = 1; len <= 10; len++) {
        if (size - from < KD_CHUNK_HEADER_BYTES + len)
            break;
        const uint8_t *h = data + size - len - KD_CHUNK_HEADER_BYTES;
        if (memcmp(h, "KDCK", 4) == 0 && get_u32le(h + 4) == KD_CHUNK_END && get_u32le(h + 8) == len &&
            kd_crc32(h + KD_CHUNK_HEADER_BYTES, len) == get_u32le(h + 12))
            return 1;
    }
    return 0;
}

/* kd_tr_open's work; *scratch (*scratch_cap payloads) decodes launches to digest them. */
static int read_file(kd_tr *r, const uint8_t *data, size_t size, kd_payload **scratch, uint64_t *scratch_cap)
{
    memset(r, 0, sizeof *r);
    r->data = data;
    r->size = size;
    if (size < 8 || memcmp(data, KD_TRACE_MAGIC, 8) != 0)
        return set_err(r, 0, "not a kdebug trace (no KDTRACE magic)");
    if (size < KD_TRACE_HEADER_BYTES)
        return set_err(r, size, "file ends inside the 32-byte header");
    r->version_major = (uint16_t)(data[8] | data[9] << 8);
    r->version_minor = (uint16_t)(data[10] | data[11] << 8);
    if (r->version_major != KD_TRACE_VERSION_MAJOR)
        return set_err(r, 8, r->version_major > KD_TRACE_VERSION_MAJOR
                                 ? "trace format version is newer than this kdebug reads: upgrade kdebug"
                                 : "unknown trace format version");
    uint32_t hdr = get_u32le(data + 12);
    if (hdr < KD_TRACE_HEADER_BYTES || hdr > size)
        return set_err(r, 12, "bad header length");
    uint64_t str_cap = 0, rec_cap = 0, chunk_cap = 0, meta_cap = 0, meta_cap2 = 0;
    uint64_t rec_cap2 = 0, rec_cap3 = 0, str_cap2 = 0, str_cap3 = 0, str_cap4 = 0, str_cap5 = 0;
    if (kd_grow((void **)&r->str_off, &str_cap, 1, sizeof *r->str_off) ||
        kd_grow((void **)&r->str_len, &str_cap2, 1, sizeof *r->str_len) ||
        kd_grow((void **)&r->str_dg, &str_cap3, 1, sizeof *r->str_dg) ||
        kd_grow((void **)&r->str_pdg, &str_cap4, 1, sizeof *r->str_pdg) ||
        kd_grow((void **)&r->str_vdg, &str_cap5, 1, sizeof *r->str_vdg))
        return set_err(r, 0, "out of memory");
    r->str_dg[0] = r->str_pdg[0] = kd_dg_bytes(NULL, 0);
    r->str_vdg[0] = 0;
    uint64_t dg_cap = 0;
    size_t pos = hdr;
    while (pos < size) {
        if (size - pos < KD_CHUNK_HEADER_BYTES)
            break; /* truncated: a chunk header cut short */
        const uint8_t *h = data + pos;
        if (memcmp(h, "KDCK", 4) != 0)
            return set_err(r, pos, "corrupt: no chunk magic here");
        uint32_t type = get_u32le(h + 4), len = get_u32le(h + 8), crc = get_u32le(h + 12);
        if (type < KD_CHUNK_STRINGS || type > KD_CHUNK_END)
            return set_err(r, pos + 4, "corrupt: unknown chunk type");
        if (len > KD_CHUNK_MAX_BODY)
            return set_err(r, pos + 8, "corrupt: chunk longer than 64 MiB");
        if (type == KD_CHUNK_END && (len < 1 || len > 10))
            return set_err(r, pos + 8, "corrupt: an END chunk holds one varint (1 to 10 bytes)");
        size_t body = pos + KD_CHUNK_HEADER_BYTES;
        if (len > size - body) {
            if (ends_with_end_chunk(data, pos, size)) /* Note [Cut or corrupt] */
                return set_err(r, pos + 8, "corrupt: this chunk's length runs past the end of the file, "
                                           "yet the file ends with a complete END chunk");
            break; /* truncated: the last chunk was cut short */
        }
        if (kd_crc32(data + body, len) != crc)
            return set_err(r, pos + 12, "corrupt: chunk checksum mismatch");
        kd_cur c = {data, body, body + len, 0, 0, NULL};
        r->complete = 0; /* an END chunk counts only as the last chunk */
        if (type == KD_CHUNK_STRINGS) {
            uint64_t n = kd_cur_varint(&c);
            if (!c.bad && n > len)
                kd_cur_fail(&c, "more strings than bytes");
            if (!c.bad && (kd_grow((void **)&r->str_off, &str_cap, r->nstr + n + 1, sizeof *r->str_off) ||
                           kd_grow((void **)&r->str_len, &str_cap2, r->nstr + n + 1, sizeof *r->str_len) ||
                           kd_grow((void **)&r->str_dg, &str_cap3, r->nstr + n + 1, sizeof *r->str_dg) ||
                           kd_grow((void **)&r->str_pdg, &str_cap4, r->nstr + n + 1, sizeof *r->str_pdg) ||
                           kd_grow((void **)&r->str_vdg, &str_cap5, r->nstr + n + 1, sizeof *r->str_vdg)))
                return set_err(r, pos, "out of memory");
            for (uint64_t i = 0; i < n && !c.bad; i++) {
                size_t sl = kd_cur_len(&c);
                if (c.bad)
                    break;
                if (memchr(data + c.pos, 0, sl) != NULL) {
                    kd_cur_fail(&c, "string contains a NUL byte");
                    break;
                }
                r->nstr++;
                r->str_off[r->nstr] = c.pos;
                r->str_len[r->nstr] = (uint32_t)sl;
                const uint8_t *sp = data + c.pos;
                r->str_dg[r->nstr] = kd_dg_bytes(sp, sl);
                r->str_pdg[r->nstr] = kd_text_prefix_digest(sp, sl);
                r->str_vdg[r->nstr] = kd_text_value_digest(sp, sl);
                c.pos += sl;
            }
        } else if (type == KD_CHUNK_RECORDS) {
            uint64_t n = kd_cur_varint(&c);
            kd_tr_chunk ch;
            ch.base_t = kd_cur_varint(&c);
            ch.base_thread = kd_cur_varint(&c);
            ch.base_stream = kd_cur_varint(&c);
            ch.base_launch = kd_cur_varint(&c);
            if (!c.bad && n > len)
                kd_cur_fail(&c, "more records than bytes");
            if (c.bad)
                return set_err(r, c.bad_off, c.why);
            if (kd_grow((void **)&r->chunks, &chunk_cap, r->nchunks + 1, sizeof *r->chunks) ||
                kd_grow((void **)&r->rec_off, &rec_cap, r->nrec + n, sizeof *r->rec_off) ||
                kd_grow((void **)&r->rec_chunk, &rec_cap2, r->nrec + n, sizeof *r->rec_chunk) ||
                kd_grow((void **)&r->rec_type, &rec_cap3, r->nrec + n, sizeof *r->rec_type))
                return set_err(r, pos, "out of memory");
            r->chunks[r->nchunks] = ch;
            if (kd_grow((void **)&r->dg, &dg_cap, (r->nrec + n) * KD_DG_N, sizeof *r->dg))
                return set_err(r, pos, "out of memory");
            for (uint64_t i = 0; i < n && !c.bad; i++) {
                uint64_t at = c.pos;
                uint8_t t = c.pos < c.end ? data[c.pos] : 0;
                uint64_t *dg = &r->dg[r->nrec * KD_DG_N];
                if (t == KD_REC_LAUNCH) {
                    int oom = 0;
                    uint32_t got = digest_launch(&c, r, &ch, scratch, scratch_cap, dg, &oom);
                    if (oom)
                        return set_err(r, pos, "out of memory");
                    if (got > r->max_nslots)
                        r->max_nslots = got;
                } else if (t == KD_REC_OP) {
                    kd_tr_op op;
                    if (decode_op(&c, r, &op) == 0)
                        kd_tr_op_digests(r, &op, dg);
                } else {
                    kd_cur_fail(&c, c.pos < c.end ? "unknown record type" : "chunk holds fewer records than it says");
                }
                if (c.bad)
                    break;
                r->rec_off[r->nrec] = at;
                r->rec_chunk[r->nrec] = r->nchunks;
                r->rec_type[r->nrec] = t;
                r->nrec++;
            }
            r->nchunks++;
        } else if (type == KD_CHUNK_META) {
            if (kd_grow((void **)&r->meta_off, &meta_cap, r->nmeta + 1, sizeof *r->meta_off))
                return set_err(r, pos, "out of memory");
            if (kd_grow((void **)&r->meta_len, &meta_cap2, r->nmeta + 1, sizeof *r->meta_len))
                return set_err(r, pos, "out of memory");
            r->meta_off[r->nmeta] = body;
            r->meta_len[r->nmeta] = len;
            r->nmeta++;
            c.pos = c.end;
        } else { /* END */
            r->end_records = kd_cur_varint(&c);
            if (!c.bad && r->end_records != r->nrec)
                kd_cur_fail(&c, "END chunk's record count differs from the records read");
            r->complete = 1;
        }
        if (!c.bad && c.pos != c.end)
            kd_cur_fail(&c, "bytes left over at the end of the chunk");
        if (c.bad)
            return set_err(r, c.bad_off, c.why);
        pos = body + len;
    }
    r->valid_end = pos;
    r->ignored = size - pos;
    return 0;
}

int kd_tr_open(kd_tr *r, const uint8_t *data, size_t size)
{
    kd_payload *scratch = NULL;
    uint64_t scratch_cap = 0;
    int rc = read_file(r, data, size, &scratch, &scratch_cap);
    free(scratch);
    return rc;
}

void kd_tr_free(kd_tr *r)
{
    free(r->str_off);
    free(r->str_len);
    free(r->str_dg);
    free(r->str_pdg);
    free(r->str_vdg);
    free(r->dg);
    free(r->rec_off);
    free(r->rec_chunk);
    free(r->rec_type);
    free(r->chunks);
    free(r->meta_off);
    free(r->meta_len);
    memset(r, 0, sizeof *r);
}

static kd_cur rec_cursor(const kd_tr *r, uint64_t i)
{
    uint64_t off = r->rec_off[i];
    /* the record lies inside its chunk, validated by kd_tr_open */
    kd_cur c = {r->data, off, r->valid_end, 0, 0, NULL};
    return c;
}

uint32_t kd_tr_launch(const kd_tr *r, uint64_t i, kd_payload *out, uint32_t cap)
{
    if (i >= r->nrec || r->rec_type[i] != KD_REC_LAUNCH || cap == 0)
        return 0;
    kd_cur c = rec_cursor(r, i);
    uint64_t ta = 0;
    uint32_t got = decode_launch(&c, r, &r->chunks[r->rec_chunk[i]], out, cap, &ta);
    return (c.bad || got > cap) ? 0 : got;
}

int kd_tr_op_get(const kd_tr *r, uint64_t i, kd_tr_op *op)
{
    if (i >= r->nrec || r->rec_type[i] != KD_REC_OP)
        return -1;
    kd_cur c = rec_cursor(r, i);
    return decode_op(&c, r, op);
}
