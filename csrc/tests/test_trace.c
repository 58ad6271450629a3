/* test_trace.c - the trace writer and reader (kd_trace.h), Python-free, under
 * AddressSanitizer and UBSan: round trips, every truncation, and a fuzzer that
 * flips, inserts and deletes bytes and demands an error or a clean read,
 * never a crash.  Run by csrc/Makefile (`make -C csrc test`). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/kd_launch_table.h"
#include "../core/kd_record.h"
#include "../core/kd_strtab.h"
#include "../core/kd_trace.h"
#include "../core/kd_trace_digest.h"

#include "kd_check.h"

/* A launch of kernel `name` with a 2-d hashed input, a 6-d output (dims
 * continuation), an int and a float. */
static uint32_t make_launch(kd_strtab *g, kd_payload *p, uint64_t index, uint64_t hash)
{
    memset(p, 0, 8 * sizeof *p);
    kd_launch *l = &p[0].launch;
    l->tag = KD_TAG_LAUNCH;
    l->kind = KD_KIND_TRITON;
    l->flags = KD_LF_GRID | KD_LF_CONFIG;
    l->device_type = 1;
    l->device_index = 0;
    l->num_warps = 4;
    l->num_stages = 2;
    l->name_id = kd_strtab_intern(g, "triton_red_fused_sum_0", 22);
    l->config_id = kd_strtab_intern(g, "XBLOCK=64, R0_BLOCK=8", 21);
    l->grid[0] = 64;
    l->grid[1] = 128;
    l->grid[2] = 1;
    l->launch_index = index;
    l->py_index = index * 2;
    l->stream = 0x7f00aa00;
    l->thread_id = 0x7fffdeadbeef;
    l->t_start_ns = 1000000000ull + index * 5000;
    l->t_end_ns = l->t_start_ns + 1234;
    kd_tensor_arg *a = &p[1].tensor;
    a->tag = KD_TAG_TENSOR;
    a->role = KD_ROLE_READ;
    a->dtype = 6; /* float */
    a->ndim = 2;
    a->device_type = 1;
    a->name_id = kd_strtab_intern(g, "in_ptr0", 7);
    a->data_ptr = 0x7f0000001000ull + index * 256;
    a->sizes[0] = 8;
    a->sizes[1] = 4;
    a->strides[0] = 4;
    a->strides[1] = 1;
    a->flags = KD_TF_HASHED;
    kd_hash_rec *h = &p[2].hash;
    h->tag = KD_TAG_HASH;
    /* odd launches carry the stats hash (format 1.2), even ones the norm */
    h->kinds = (index & 1) ? KD_HK_BITWISE | KD_HK_STATS : KD_HK_BITWISE | KD_HK_NORM;
    h->flags = KD_HF_PRE;
    h->bitwise[0] = hash;
    h->l1[0] = 12.5;
    h->nan[0] = 1;
    if (index & 1) {
        h->sum[0] = -3.25;
        h->absmax[0] = 7.5;
    }
    kd_tensor_arg *o = &p[3].tensor;
    o->tag = KD_TAG_TENSOR;
    o->role = KD_ROLE_WRITE;
    o->dtype = 15; /* bfloat16 */
    o->ndim = 6;
    o->device_type = 1;
    o->name_id = kd_strtab_intern(g, "out_ptr0", 8);
    o->data_ptr = 0x7f0000100000ull;
    o->storage_offset = 3;
    for (int d = 0; d < 4; d++) {
        o->sizes[d] = 2;
        o->strides[d] = 1 << (5 - d);
    }
    kd_dims_cont *c = &p[4].dims;
    c->tag = KD_TAG_DIMS;
    c->count = 2;
    c->sizes[0] = 2;
    c->strides[0] = 2;
    c->sizes[1] = 2;
    c->strides[1] = 1;
    p[5].scalar.tag = KD_TAG_INT;
    p[5].scalar.name_id = kd_strtab_intern(g, "xnumel", 6);
    p[5].scalar.value.i = -32;
    p[6].scalar.tag = KD_TAG_FLOAT;
    p[6].scalar.name_id = kd_strtab_intern(g, "eps", 3);
    p[6].scalar.value.f = 1e-5;
    l->nargs = 4;
    l->nslots = 6;
    return 7;
}

static const uint8_t TREE[] = {KD_T_LIST, 2, KD_T_I64, 1, 2, 3, 4, 5, 6, 7, 8, KD_T_NONE};
/* an extents tree as kdebug writes one: (((extent,), {}), extent) with extent (CPU, -1, 0x1000, 0x1040, 64)
 * (Note [Extents trees on reading]) */
#define KD_I64(v) KD_T_I64, (uint8_t)(v), (uint8_t)((uint64_t)(v) >> 8), (uint8_t)((uint64_t)(v) >> 16), \
                  (uint8_t)((uint64_t)(v) >> 24), (uint8_t)((uint64_t)(v) >> 32), (uint8_t)((uint64_t)(v) >> 40), \
                  (uint8_t)((uint64_t)(v) >> 48), (uint8_t)((uint64_t)(v) >> 56)
#define KD_EXTENT KD_T_TUPLE, 5, KD_I64(0), KD_I64(-1), KD_I64(0x1000), KD_I64(0x1040), KD_I64(64)
static const uint8_t EXT[] = {KD_T_TUPLE, 2, KD_T_TUPLE, 2, KD_T_TUPLE, 1, KD_EXTENT, KD_T_DICT, 0, KD_EXTENT};

/* A trace of n launches and n ops, sealed every `every` records. */
static kd_buf make_trace(kd_strtab *g, int n, int every, int end)
{
    kd_tw w;
    kd_buf file = {0};
    if (kd_tw_init(&w) != 0)
        return file;
    kd_tw_meta(&w, "{\"workload\": \"test\"}", 20);
    kd_payload p[8];
    for (int i = 0; i < n; i++) {
        uint32_t np = make_launch(g, p, (uint64_t)i, 0x1234567890abcdefull ^ (uint64_t)i);
        CHECK(kd_tw_launch(&w, p, np, g) == 0);
        /* every other op also carries an extents tree (format 1.1) */
        CHECK(kd_tw_op(&w, 1, KD_OPF_OUT_HASH | KD_OPF_OPCALL | (i % 2 ? KD_OPF_EXTENTS : 0u), "aten::add.Tensor",
                       16, "aten::add.Tensor(t: f32[4], 1)", 30, NULL, 0, TREE, sizeof TREE, EXT, sizeof EXT) == 0);
        if ((i + 1) % every == 0)
            kd_tw_seal(&w);
    }
    if (end)
        kd_tw_end(&w);
    else
        kd_tw_seal(&w);
    kd_buf_put(&file, w.out.p, w.out.len);
    kd_tw_free(&w);
    return file;
}

static void test_roundtrip(void)
{
    kd_strtab *g = kd_strtab_new(1024);
    kd_buf f = make_trace(g, 50, 7, 1);
    kd_tr r;
    CHECK(kd_tr_open(&r, f.p, f.len) == 0);
    CHECK(r.nrec == 100);
    CHECK(r.complete == 1);
    CHECK(r.ignored == 0);
    CHECK(r.nmeta == 1);
    CHECK(r.tensor_args == 100);
    /* bytes per tensor argument, the budget is 64 */
    /* launch records (the ops' text is shared): bytes per tensor argument,
     * the budget is 64; here a 2-d input with bitwise + norm hashes,
     * a 6-d output, an int and a float per launch */
    uint64_t launch_bytes = 0;
    for (uint64_t i = 0; i < r.nrec; i += 2)
        launch_bytes += r.rec_off[i + 1] - r.rec_off[i];
    printf("trace: %zu bytes, %" PRIu64 " bytes of launches, %" PRIu64 " tensor args\n", f.len,
           launch_bytes, r.tensor_args);
    CHECK(launch_bytes / r.tensor_args < 64);
    kd_payload want[8], got[16];
    for (uint64_t i = 0; i < r.nrec; i += 2) {
        uint32_t nw = make_launch(g, want, i / 2, 0x1234567890abcdefull ^ (i / 2));
        uint32_t ng = kd_tr_launch(&r, i, got, 16);
        CHECK(ng == nw);
        /* file string ids: compare through the strings */
        size_t n1, n2;
        const char *s1 = kd_strtab_get(g, want[0].launch.name_id, &n1);
        const char *s2 = kd_tr_string(&r, got[0].launch.name_id, &n2);
        CHECK(n1 == n2 && memcmp(s1, s2, n1) == 0);
        got[0].launch.name_id = want[0].launch.name_id;
        got[0].launch.config_id = want[0].launch.config_id;
        for (uint32_t k = 1; k < ng; k++)
            if (got[k].tag == KD_TAG_TENSOR || got[k].tag == KD_TAG_INT || got[k].tag == KD_TAG_FLOAT)
                got[k].scalar.name_id = want[k].scalar.name_id;
        CHECK(memcmp(want, got, nw * sizeof(kd_payload)) == 0);
        kd_tr_op op;
        CHECK(kd_tr_op_get(&r, i + 1, &op) == 0);
        CHECK(op.depth == 1 && op.out_len == sizeof TREE && memcmp(op.out_tree, TREE, sizeof TREE) == 0);
        CHECK(op.in_tree == NULL);
        if ((i / 2) % 2) /* the writer's op number i / 2 carries extents when odd */
            CHECK(op.ext_len == sizeof EXT && memcmp(op.ext_tree, EXT, sizeof EXT) == 0);
        else
            CHECK(op.ext_tree == NULL && op.ext_len == 0);
        CHECK(kd_tr_launch(&r, i + 1, got, 16) == 0); /* not a launch */
    }
    /* digests: equal launches of two files are equal; a changed hash changes only PRE */
    uint64_t d0[KD_DG_N], d1[KD_DG_N];
    kd_tr_digests(&r, 0, d0);
    kd_tr_digests(&r, 2, d1);
    CHECK(d0[KD_DG_KEY] == d1[KD_DG_KEY] && d0[KD_DG_CONFIG] == d1[KD_DG_CONFIG]);
    CHECK(d0[KD_DG_SHAPE] == d1[KD_DG_SHAPE]);
    CHECK(d0[KD_DG_PRE] != d1[KD_DG_PRE] && d0[KD_DG_PRE] != 0);
    CHECK(d0[KD_DG_POST] == 0);
    kd_tr_digests(&r, 1, d0);
    CHECK(d0[KD_DG_POST] == kd_tree_leaf_digest(TREE, sizeof TREE) && d0[KD_DG_PRE] == 0);
    /* the op's output leaf is found by value; launch 3's output by address */
    uint64_t leaf = kd_tree_leaf_digest(TREE + 2, 9), mask = 0;
    CHECK(kd_tree_has_leaf(TREE, sizeof TREE, leaf));
    CHECK(kd_tr_last_writer(&r, 10, 1, 0, 0, 0, leaf, &mask) == 9);
    CHECK(kd_tr_last_writer(&r, 7, 1, 0, 0x7f0000100000ull + 4, 0x7f0000100000ull + 8, 0, &mask) == 6);
    CHECK(mask == 2);
    CHECK(kd_tr_last_writer(&r, 7, 1, 1, 0x7f0000100000ull, 0x7f0000100008ull, 0, &mask) == -1);
    CHECK(kd_tr_last_writer(&r, 7, 1, 0, 0x10, 0x20, 0, &mask) == -1);
    kd_tr_free(&r);
    kd_buf_free(&f);
    kd_strtab_free(g);
}

/* Table rows (Note [Trace tables]) carry what the records hold. */
static void test_table(void)
{
    kd_strtab *g = kd_strtab_new(1024);
    kd_buf f = make_trace(g, 20, 6, 1);
    kd_tr r;
    CHECK(kd_tr_open(&r, f.p, f.len) == 0);
    kd_tab t = {0};
    CHECK(kd_tr_table(&r, 4, 1000, &t) == 0); /* stop past the end is clipped */
    CHECK(t.nrec == 36 && t.narg == 18 * 4 && t.ndims == 18 * (2 + 6));
    for (uint64_t k = 0; k < t.nrec; k++) {
        const kd_tab_rec *row = &t.rec[k];
        size_t n;
        const char *name = kd_tr_string(&r, row->name_id, &n);
        if (k % 2 == 1) {
            CHECK(row->type == KD_REC_OP && row->nargs == 0 && row->depth == 1);
            CHECK(n == 16 && memcmp(name, "aten::add.Tensor", 16) == 0);
            CHECK((row->kind & ~KD_OPF_EXTENTS) == (KD_OPF_OUT_HASH | KD_OPF_OPCALL) && row->device_type == 255);
            continue;
        }
        uint64_t li = 2 + k / 2;
        CHECK(row->type == KD_REC_LAUNCH && row->kind == KD_KIND_TRITON && row->nargs == 4);
        CHECK(n == 22 && memcmp(name, "triton_red_fused_sum_0", 22) == 0);
        const char *cfg = kd_tr_string(&r, row->text_id, &n);
        CHECK(n == 21 && memcmp(cfg, "XBLOCK=64, R0_BLOCK=8", 21) == 0);
        CHECK(row->grid[0] == 64 && row->grid[1] == 128 && row->grid[2] == 1);
        CHECK(row->num_warps == 4 && row->num_stages == 2 && row->launch_index == li);
        CHECK(row->stream == 0x7f00aa00 && row->thread_id == 0x7fffdeadbeef);
        CHECK(row->t_start_ns == 1000000000ull + li * 5000 && row->t_end_ns == row->t_start_ns + 1234);
    }
    const kd_tab_arg *a = &t.arg[0]; /* launch 2's in_ptr0 */
    CHECK(a->tag == KD_TAG_TENSOR && a->role == KD_ROLE_READ && a->dtype == 6 && a->ndim == 2);
    CHECK(a->hash_kinds == (KD_HK_BITWISE | KD_HK_NORM) && a->hash_flags == KD_HF_PRE);
    CHECK(a->bitwise[0] == (0x1234567890abcdefull ^ 2) && a->l1[0] == 12.5 && a->nan[0] == 1);
    CHECK(t.dims[0] == 8 && t.dims[1] == 4 && a->value.i == 32 && t.arg[1].value.i == 64);
    const kd_tab_arg *s3 = &t.arg[4]; /* launch 3's in_ptr0: the stats hash */
    CHECK(s3->hash_kinds == (KD_HK_BITWISE | KD_HK_STATS) && s3->hash_flags == KD_HF_PRE);
    CHECK(s3->bitwise[0] == (0x1234567890abcdefull ^ 3) && s3->l1[0] == 12.5 && s3->nan[0] == 1);
    CHECK(s3->sum[0] == -3.25 && s3->absmax[0] == 7.5);
    CHECK(t.arg[1].ndim == 6 && t.arg[1].role == KD_ROLE_WRITE && t.arg[1].hash_flags == 0);
    for (int d = 0; d < 6; d++)
        CHECK(t.dims[2 + d] == 2);
    CHECK(t.arg[2].tag == KD_TAG_INT && t.arg[2].value.i == -32);
    CHECK(t.arg[3].tag == KD_TAG_FLOAT && t.arg[3].value.f == 1e-5);
    kd_tab_free(&t);
    kd_tab empty = {0};
    CHECK(kd_tr_table(&r, 50, 10, &empty) == 0 && empty.nrec == 0);
    kd_tr_free(&r);
    kd_buf_free(&f);
    kd_strtab_free(g);
}

/* A crc32 known answer: zlib.crc32(b"123456789") == 0xCBF43926. */
static void test_crc(void)
{
    CHECK(kd_crc32((const uint8_t *)"123456789", 9) == 0xCBF43926u);
    CHECK(kd_crc32(NULL, 0) == 0);
    /* zlib.crc32(bytes(range(256)) * 3) == 0xB0C0DF2A (past the 8-byte steps, odd tail) */
    uint8_t buf[768];
    for (int i = 0; i < 768; i++)
        buf[i] = (uint8_t)i;
    CHECK(kd_crc32(buf, 768) == 0xB0C0DF2Au);
    CHECK(kd_crc32(buf, 13) == 0xE6FE46B8u); /* zlib.crc32(bytes(range(13))) */
    /* the carry-less multiplication path (where the CPU has it) and slicing by
     * 8 against a bit-at-a-time reference: every length to 700 (short buffers,
     * 64-byte blocks, 16-byte blocks, tails), at several alignments */
    uint8_t rnd[720];
    uint64_t s = 1;
    for (int i = 0; i < 720; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        rnd[i] = (uint8_t)(s >> 56);
    }
    int bad = 0;
    for (size_t n = 0; n <= 700; n++)
        for (size_t off = 0; off < 16; off += 5) {
            uint32_t c = 0xFFFFFFFFu;
            for (size_t i = 0; i < n; i++) {
                c ^= rnd[off + i];
                for (int k = 0; k < 8; k++)
                    c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
            }
            c ^= 0xFFFFFFFFu;
            bad += kd_crc32(rnd + off, n) != c || kd_crc32_portable(rnd + off, n) != c;
        }
    CHECK(bad == 0);
}

static void test_truncation(void)
{
    kd_strtab *g = kd_strtab_new(1024);
    kd_buf f = make_trace(g, 20, 5, 1);
    uint64_t last_nrec = 0;
    for (size_t cut = 0; cut <= f.len; cut++) {
        uint8_t *copy = malloc(cut ? cut : 1);
        memcpy(copy, f.p, cut);
        kd_tr r;
        int rc = kd_tr_open(&r, copy, cut);
        if (cut < 8) {
            CHECK(rc == -1 && r.err_off == 0);
        } else if (cut < KD_TRACE_HEADER_BYTES) {
            CHECK(rc == -1);
        } else {
            CHECK(rc == 0);
            CHECK(r.valid_end + r.ignored == cut);
            CHECK(r.nrec >= last_nrec); /* more bytes never read fewer records */
            CHECK(r.nrec % 2 == 0);       /* whole chunks: launch and op pairs here */
            CHECK(r.complete == (cut == f.len));
            last_nrec = r.nrec;
            kd_payload tmp[16];
            for (uint64_t i = 0; i < r.nrec; i += 2)
                CHECK(kd_tr_launch(&r, i, tmp, 16) == 7);
        }
        kd_tr_free(&r);
        free(copy);
    }
    CHECK(last_nrec == 40);
    kd_buf_free(&f);
    kd_strtab_free(g);
}

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint64_t next(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

/* Mutations that keep the checksums right too (re-sealed chunks), so the
 * record decoder itself meets garbage, not just the CRC check. */
static void fix_crcs(uint8_t *p, size_t n)
{
    size_t pos = KD_TRACE_HEADER_BYTES;
    while (pos + KD_CHUNK_HEADER_BYTES <= n) {
        uint32_t len = (uint32_t)p[pos + 8] | (uint32_t)p[pos + 9] << 8 | (uint32_t)p[pos + 10] << 16 |
                       (uint32_t)p[pos + 11] << 24;
        if (len > n - pos - KD_CHUNK_HEADER_BYTES)
            return;
        uint32_t c = kd_crc32(p + pos + KD_CHUNK_HEADER_BYTES, len);
        for (int i = 0; i < 4; i++)
            p[pos + 12 + i] = (uint8_t)(c >> (8 * i));
        pos += KD_CHUNK_HEADER_BYTES + len;
    }
}

static void test_fuzz(void)
{
    kd_strtab *g = kd_strtab_new(1024);
    kd_buf f = make_trace(g, 12, 4, 1);
    int errors = 0, clean = 0;
    for (int it = 0; it < 20000; it++) {
        size_t n = f.len;
        uint8_t *p = malloc(n + 16);
        memcpy(p, f.p, n);
        int muts = 1 + (int)(next() % 4);
        for (int m = 0; m < muts; m++) {
            size_t at = KD_TRACE_HEADER_BYTES + next() % (n - KD_TRACE_HEADER_BYTES);
            switch (next() % 4) {
            case 0:
                p[at] ^= (uint8_t)(1u << (next() % 8));
                break;
            case 1:
                p[at] = (uint8_t)next();
                break;
            case 2: /* delete a byte */
                memmove(p + at, p + at + 1, n - at - 1);
                n--;
                break;
            default: /* insert a byte */
                memmove(p + at + 1, p + at, n - at);
                p[at] = (uint8_t)next();
                n++;
                break;
            }
        }
        if (it % 2)
            fix_crcs(p, n);
        kd_tr r;
        if (kd_tr_open(&r, p, n) != 0) {
            errors++;
            CHECK(r.err[0] != 0 && r.err_off <= n);
        } else {
            clean++;
            kd_payload tmp[64];
            uint64_t dg[KD_DG_N], mask;
            for (uint64_t i = 0; i < r.nrec; i++) {
                kd_tr_launch(&r, i, tmp, 64);
                kd_tr_digests(&r, i, dg);
                kd_tr_op op;
                kd_tr_op_get(&r, i, &op);
            }
            kd_tr_last_writer(&r, r.nrec, 1, 0, 0, UINT64_MAX, 5, &mask);
            kd_tab t = {0};
            CHECK(kd_tr_table(&r, 0, r.nrec, &t) == 0 && t.nrec == r.nrec);
            kd_tab_free(&t);
        }
        kd_tr_free(&r);
        free(p);
    }
    CHECK(errors > 1000);
    CHECK(clean > 10);
    printf("fuzz: 20000 mutated traces, %d rejected with an offset, %d read\n", errors, clean);
    kd_buf_free(&f);
    kd_strtab_free(g);
}

static void test_foreign(void)
{
    kd_tr r;
    const char *png = "\x89PNG\r\n\x1a\n0000000000000000000000000000";
    CHECK(kd_tr_open(&r, (const uint8_t *)png, 36) == -1 && r.err_off == 0);
    kd_tr_free(&r);
    uint8_t hdr[32] = "KDTRACE\x1a";
    hdr[8] = 9; /* a newer major version */
    hdr[12] = 32;
    CHECK(kd_tr_open(&r, hdr, 32) == -1 && r.err_off == 8 && strstr(r.err, "newer") != NULL);
    kd_tr_free(&r);
    hdr[8] = 1;
    CHECK(kd_tr_open(&r, hdr, 32) == 0 && r.nrec == 0 && !r.complete);
    kd_tr_free(&r);
}

/* One flipped bit in any chunk's length field (but the END chunk's own) of a finished trace is corruption, never
 * a recording cut short: the file still ends with its END chunk (Note [Cut or corrupt]). */
static void test_length_flips(void)
{
    kd_strtab *g = kd_strtab_new(1024);
    kd_buf f = make_trace(g, 20, 5, 1);
    int chunks = 0, flips = 0;
    size_t pos = KD_TRACE_HEADER_BYTES;
    while (pos + KD_CHUNK_HEADER_BYTES <= f.len) {
        uint32_t len = (uint32_t)(f.p[pos + 8] | f.p[pos + 9] << 8 | f.p[pos + 10] << 16 | (uint32_t)f.p[pos + 11] << 24);
        uint32_t type = f.p[pos + 4];
        if (type != KD_CHUNK_END) {
            chunks++;
            for (int bit = 0; bit < 32; bit++) {
                uint8_t *copy = malloc(f.len);
                memcpy(copy, f.p, f.len);
                copy[pos + 8 + bit / 8] ^= (uint8_t)(1u << (bit % 8));
                kd_tr r;
                int rc = kd_tr_open(&r, copy, f.len);
                CHECK(rc == -1 && strstr(r.err, "corrupt") != NULL);
                flips++;
                kd_tr_free(&r);
                free(copy);
            }
        }
        pos += KD_CHUNK_HEADER_BYTES + len;
    }
    CHECK(pos == f.len && chunks >= 5 && flips == chunks * 32);
    /* an END chunk whose length is not that of one varint */
    uint8_t *copy = malloc(f.len);
    memcpy(copy, f.p, f.len);
    copy[f.len - 1 - KD_CHUNK_HEADER_BYTES + 8] = 0; /* END's length: 1 -> 0 */
    kd_tr r;
    CHECK(kd_tr_open(&r, copy, f.len) == -1 && strstr(r.err, "END") != NULL);
    kd_tr_free(&r);
    free(copy);
    free(f.p);
    kd_strtab_free(g);
}

/* Note [Flight recorder]: a range's digest is the same in any launch order,
 * changes with any post-launch hash and with the launch count, ignores
 * pre-launch hashes, data pointers and the launch index; forgetting the
 * oldest launches keeps the rest (and starts a new generation). */
static void test_range_digest(void)
{
    kd_strtab *g = kd_strtab_new(1024);
    kd_ltab fwd, rev, changed, other_pre;
    kd_ltab_init(&fwd);
    kd_ltab_init(&rev);
    kd_ltab_init(&changed);
    kd_ltab_init(&other_pre);
    enum { N = 4 };
    kd_payload p[8];
    for (int k = 0; k < N; k++) {
        int i = N - 1 - k;
        for (int pass = 0; pass < 4; pass++) {
            int idx = pass == 1 ? i : k;
            uint32_t np = make_launch(g, p, (uint64_t)(pass == 3 ? idx + 50 : idx), pass == 3 ? 0x1234 : 0xfeed);
            p[2].hash.flags |= KD_HF_POST;
            p[2].hash.bitwise[1] = 100 + (uint64_t)idx + (pass == 2 && idx == 2 ? 899 : 0);
            kd_ltab *t = pass == 0 ? &fwd : pass == 1 ? &rev : pass == 2 ? &changed : &other_pre;
            CHECK(kd_store_append(&t->store, p, np) == 0);
        }
    }
    uint64_t d = kd_ltab_range_digest(&fwd, 0, N, g);
    CHECK(d == kd_ltab_range_digest(&rev, 0, N, g));          /* order-free */
    CHECK(d == kd_ltab_range_digest(&other_pre, 0, N, g));    /* pre hashes, pointers, indices: not in it */
    CHECK(d != kd_ltab_range_digest(&changed, 0, N, g));      /* one output hash differs */
    CHECK(d != kd_ltab_range_digest(&fwd, 0, N - 1, g));      /* one launch fewer */
    CHECK(kd_ltab_range_digest(&fwd, 0, 0, g) == kd_ltab_range_digest(&fwd, 2, 2, g));
    CHECK(kd_ltab_range_digest(&fwd, 0, 99, g) == d);         /* clamped */
    uint64_t tail = kd_ltab_range_digest(&fwd, 1, N, g);
    kd_ltab_forget(&fwd, 1);
    CHECK(fwd.generation == 1 && fwd.store.nlaunches == N - 1);
    CHECK(kd_store_launch(&fwd.store, 0)->launch.launch_index == 1);
    CHECK(kd_ltab_range_digest(&fwd, 0, N - 1, g) == tail);
    kd_ltab_free(&fwd);
    kd_ltab_free(&rev);
    kd_ltab_free(&changed);
    kd_ltab_free(&other_pre);
    kd_strtab_free(g);
}

/* Note [Launch table]: launches put in a table as a drain does and the same
 * launches written, read back and filled into a table of another string id
 * space digest alike, and alike to the reader's own digests; a GPU-pending
 * hash side counts as absent; clearing starts a new generation. */
static void test_launch_table(void)
{
    kd_strtab *g = kd_strtab_new(1024), *g2 = kd_strtab_new(1024);
    kd_strtab_intern(g2, "another", 7); /* g2's ids differ from g's */
    kd_strtab_intern(g2, "out_ptr0", 8);
    kd_ltab live, loaded;
    kd_ltab_init(&live);
    kd_ltab_init(&loaded);
    kd_tw w;
    CHECK(kd_tw_init(&w) == 0);
    enum { N = 12 };
    kd_payload p[8];
    for (int i = 0; i < N; i++) {
        uint32_t np = make_launch(g, p, (uint64_t)i, 0xfeedull * (uint64_t)(i % 3)); /* repeats: equal rows */
        p[2].hash.spec = 1;
        if (i == 5) { /* its post side is still on the GPU */
            p[2].hash.flags |= KD_HF_POST | KD_HF_PENDING_POST;
            p[2].hash.bitwise[1] = 77;
        }
        CHECK(kd_store_append(&live.store, p, np) == 0);
        CHECK(kd_tw_launch(&w, p, np, g) == 0);
        CHECK(kd_tw_op(&w, 0, KD_OPF_OUT_HASH, "aten::mul.Tensor", 16, "aten::mul.Tensor(t: f32[4], 2)", 30, NULL, 0,
                       TREE, sizeof TREE, NULL, 0) == 0);
    }
    CHECK(kd_tw_end(&w) == 0);
    kd_tr r;
    CHECK(kd_tr_open(&r, w.out.p, w.out.len) == 0 && r.nrec == 2 * N);
    uint32_t *map = calloc(r.nstr + 1, sizeof *map);
    uint16_t spec[2] = {0, 7};
    kd_ltab_ids ids = {g2, map, spec, 2};
    uint64_t idx[2 * N];
    CHECK(kd_ltab_fill_trace(&loaded, &r, 0, r.nrec, &ids, idx) == N);
    CHECK(idx[0] == 0 && idx[N - 1] == 2 * (N - 1));
    CHECK(kd_store_launch(&loaded.store, 0)[2].hash.spec == 7);
    CHECK(kd_store_launch(&loaded.store, 0)[0].launch.name_id != kd_store_launch(&live.store, 0)[0].launch.name_id);
    uint64_t a[N * KD_DG_N], b[N * KD_DG_N];
    CHECK(kd_ltab_digests(&live, 0, N, g, a) == N);
    CHECK(kd_ltab_digests(&loaded, 0, N, g2, b) == N);
    CHECK(memcmp(a, b, sizeof a) == 0);
    for (int i = 0; i < N; i++)
        CHECK(memcmp(&a[i * KD_DG_N], &r.dg[2 * i * KD_DG_N], KD_DG_N * sizeof a[0]) == 0);
    CHECK(a[5 * KD_DG_N + KD_DG_POST] == 0 && a[5 * KD_DG_N + KD_DG_PRE] != 0); /* pending: absent */
    CHECK(a[0 * KD_DG_N + KD_DG_PRE] == a[6 * KD_DG_N + KD_DG_PRE]);            /* same hash, same digest */
    CHECK(a[0 * KD_DG_N + KD_DG_PRE] != a[1 * KD_DG_N + KD_DG_PRE]);
    CHECK(a[0 * KD_DG_N + KD_DG_KEY] == a[1 * KD_DG_N + KD_DG_KEY]);
    kd_ltab_clear(&live);
    CHECK(live.generation == 1 && live.store.nlaunches == 0 && kd_ltab_digests(&live, 0, N, g, a) == 0);
    free(map);
    kd_tr_free(&r);
    kd_tw_free(&w);
    kd_ltab_free(&live);
    kd_ltab_free(&loaded);
    kd_strtab_free(g);
    kd_strtab_free(g2);
}

/* Note [Returned values]: an op text's output is digested when it is a plain
 * value (numbers, bools, None, inf / nan, tuples and lists of them), and
 * only then; equal values digest alike, other values differently. */
static uint64_t vdg(const char *s)
{
    return kd_text_value_digest((const uint8_t *)s, strlen(s));
}

static void test_returned_values(void)
{
    const char *values[] = {"aten::_local_scalar_dense(t: f32[])  ->  -45.00395965576172",
                            "aten::is_nonzero(t: b8[])  ->  True",
                            "aten::equal(t: f32[3], t: f32[3])  ->  False",
                            "aten::x(t: f32[])  ->  1e-05",
                            "aten::x(t: f32[])  ->  (3, [inf, -nan], None)",
                            "aten::_local_scalar_dense(t: i64[])  ->  7",
                            "aten::_local_scalar_dense(t: c64[])  ->  (0.5-1.25j)"};
    for (size_t i = 0; i < sizeof values / sizeof values[0]; i++)
        CHECK(vdg(values[i]) != 0);
    CHECK(vdg(values[0]) == vdg("aten::_local_scalar_dense(t: f32[])  ->  -45.00395965576172"));
    CHECK(vdg(values[0]) != vdg("aten::_local_scalar_dense(t: f32[])  ->  -45.003929138183594"));
    CHECK(vdg(values[1]) != vdg(values[2]));
    const char *others[] = {"aten::add.Tensor(t: f32[3], t: f32[3])  ->  t: f32[3]",
                            "aten::split(t: f32[4], 2)  ->  [t: f32[2], t: f32[2]]",
                            "aten::f(t: f32[])  ->  <torch._C.Generator object at 0x7f00>",
                            "aten::g(t: f32[])  ->  ", "aten::h(t: f32[])", "", "aten::k()  ->  Truth",
                            "aten::m()  ->  'text'"};
    for (size_t i = 0; i < sizeof others / sizeof others[0]; i++)
        CHECK(vdg(others[i]) == 0);
}

/* A name or text the string table refuses (a NUL in it) fails the op
 * record; it was written with string id 0, which reads back as "". */
static void test_refused_text(void)
{
    kd_tw w;
    CHECK(kd_tw_init(&w) == 0);
    CHECK(kd_tw_op(&w, 0, 0, "kd::f", 5, "kd::f(a\0b)", 11, NULL, 0, NULL, 0, NULL, 0) == -1);
    CHECK(kd_tw_op(&w, 0, 0, "kd\0f", 5, "kd::f()", 7, NULL, 0, NULL, 0, NULL, 0) == -1);
    CHECK(kd_tw_op(&w, 0, 0, "kd::f", 5, "kd::f()", 7, NULL, 0, NULL, 0, NULL, 0) == 0);
    CHECK(kd_tw_op(&w, 0, 0, "", 0, "", 0, NULL, 0, NULL, 0, NULL, 0) == 0);
    CHECK(kd_tw_end(&w) == 0);
    kd_tr r;
    CHECK(kd_tr_open(&r, w.out.p, w.out.len) == 0 && r.nrec == 2);
    kd_tr_free(&r);
    kd_tw_free(&w);
}

/* A full string table keeps the record: its text reads as KD_TW_NOT_STORED,
 * counted in refused_strings. */
static void test_full_table(void)
{
    kd_tw w;
    CHECK(kd_tw_init_sized(&w, 4) == 0); /* the marker, then three more */
    CHECK(kd_tw_op(&w, 0, 0, "kd::f", 5, "kd::f(1)", 8, NULL, 0, NULL, 0, NULL, 0) == 0);
    CHECK(kd_tw_op(&w, 0, 0, "kd::f", 5, "kd::f(2)", 8, NULL, 0, NULL, 0, NULL, 0) == 0);
    CHECK(w.refused_strings == 0);
    CHECK(kd_tw_op(&w, 0, 0, "kd::f", 5, "kd::f(3)", 8, NULL, 0, NULL, 0, NULL, 0) == 0);
    CHECK(w.refused_strings == 1);
    CHECK(kd_tw_end(&w) == 0);
    kd_tr r;
    CHECK(kd_tr_open(&r, w.out.p, w.out.len) == 0 && r.nrec == 3);
    kd_tr_op op;
    CHECK(kd_tr_op_get(&r, 2, &op) == 0);
    size_t n = 0;
    const char *t = kd_tr_string(&r, op.text_id, &n);
    CHECK(t != NULL && n == sizeof KD_TW_NOT_STORED - 1 && memcmp(t, KD_TW_NOT_STORED, n) == 0);
    CHECK(kd_tr_op_get(&r, 1, &op) == 0);
    t = kd_tr_string(&r, op.text_id, &n);
    CHECK(t != NULL && n == 8 && memcmp(t, "kd::f(2)", 8) == 0);
    kd_tr_free(&r);
    kd_tw_free(&w);
}

/* Note [Extents trees on reading]: an op record whose extents tree is a well-formed hash tree but not what
 * kdebug writes makes the file unreadable, with the reason and the byte of the node that does not fit. */
static void test_malformed_extents(void)
{
    static const uint8_t list_root[] = {KD_T_LIST, 2, KD_T_NONE, KD_T_NONE};
    static const uint8_t three[] = {KD_T_TUPLE, 3, KD_T_NONE, KD_T_NONE, KD_T_NONE};
    static const uint8_t int_leaf[] = {KD_T_TUPLE, 2, KD_T_LIST, 1, KD_I64(7), KD_T_NONE};
    static const uint8_t float_in[] = {KD_T_TUPLE, 2, KD_T_NONE, KD_T_TUPLE, 4, KD_I64(0), KD_I64(0),
                                       KD_T_F64, 0, 0, 0, 0, 0, 0, 0, 0, KD_I64(8)};
    static const uint8_t backwards[] = {KD_T_TUPLE, 2, KD_T_NONE, KD_T_TUPLE, 4, KD_I64(0), KD_I64(0),
                                        KD_I64(64), KD_I64(8)};
    static const uint8_t too_many[] = {KD_T_TUPLE, 2, KD_T_NONE, KD_T_TUPLE, 5, KD_I64(0), KD_I64(0), KD_I64(8),
                                       KD_I64(16), KD_I64(9)};
    static const uint8_t device[] = {KD_T_TUPLE, 2, KD_T_NONE, KD_T_TUPLE, 4, KD_I64(300), KD_I64(0), KD_I64(8),
                                     KD_I64(16)};
    static const uint8_t ok4[] = {KD_T_TUPLE, 2, KD_T_DICT, 1, 1, 'x', KD_T_TUPLE, 4, KD_I64(1), KD_I64(0),
                                  KD_I64(8), KD_I64(16), KD_T_NONE};
    static const struct {
        const uint8_t *tree;
        size_t len;
        const char *why; /* NULL: read */
        size_t node;     /* offset of the node named, in the tree */
    } cases[] = {
        {EXT, sizeof EXT, NULL, 0},
        {ok4, sizeof ok4, NULL, 0},
        {list_root, sizeof list_root, "its root is not the pair", 0},
        {three, sizeof three, "its root is not the pair", 0},
        {int_leaf, sizeof int_leaf, "neither None nor an extent", 4},
        {float_in, sizeof float_in, "other than 4 or 5 integers", 3},
        {backwards, sizeof backwards, "ends before it starts", 3},
        {too_many, sizeof too_many, "more bytes than its range", 3},
        {device, sizeof device, "device type or index", 3},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        kd_tw w;
        CHECK(kd_tw_init(&w) == 0);
        CHECK(kd_tw_op(&w, 0, KD_OPF_EXTENTS, "aten::f", 7, "aten::f()", 9, NULL, 0, NULL, 0, cases[k].tree,
                       cases[k].len) == 0);
        CHECK(kd_tw_end(&w) == 0);
        kd_tr r;
        int rc = kd_tr_open(&r, w.out.p, w.out.len);
        if (cases[k].why == NULL) {
            CHECK(rc == 0 && r.nrec == 1);
        } else {
            CHECK(rc == -1 && strstr(r.err, "malformed extents tree") != NULL && strstr(r.err, cases[k].why) != NULL);
            size_t tree_at = 0; /* where the tree lies in the file */
            for (size_t i = 0; i + cases[k].len <= w.out.len; i++)
                if (memcmp(w.out.p + i, cases[k].tree, cases[k].len) == 0) {
                    tree_at = i;
                    break;
                }
            CHECK(tree_at > 0 && r.err_off == tree_at + cases[k].node);
        }
        kd_tr_free(&r);
        kd_tw_free(&w);
    }
}

int main(void)
{
    test_malformed_extents();
    test_refused_text();
    test_full_table();
    test_crc();
    test_roundtrip();
    test_table();
    test_launch_table();
    test_range_digest();
    test_truncation();
    test_length_flips();
    test_fuzz();
    test_foreign();
    test_returned_values();
    printf("test_trace: %d checks, %d failures\n", checks, failures);
    return failures ? 1 : 0;
}
