/* kd_trace.h - kdebug trace files (.kdt): a compact, versioned, streamable
 * binary form of a recorded run.  Python-free: the writer encodes launch
 * payloads (kd_record.h) and pre-encoded aten-op records into chunks, the
 * reader validates a whole file and decodes records back.
 *
 * Note [Trace format]
 * The byte-level definition is docs/trace-format.md; in short:
 *   file    = header(32 bytes) chunk*
 *   chunk   = "KDCK" type:u32 body_len:u32 crc32(body):u32 body
 * Chunks are written whole, one write() each, so a process that dies leaves
 * a file whose complete chunks are all readable: the reader stops at the first
 * chunk that runs past the end of the file and reports how many bytes it
 * ignored.  A chunk whose magic, type or CRC is wrong is corruption: an error
 * naming its byte offset.  Inside chunks every integer is a LEB128 varint
 * (signed ones zigzag-coded) except hash values and floats (8 bytes, little
 * endian); strings are defined once in STRINGS chunks, before the RECORDS
 * chunk that first uses them, and referred to by file-local ids.  Every
 * RECORDS chunk starts with base values (time, thread, stream, launch index)
 * its records are coded against, so any record decodes with only its chunk's
 * bases: the reader keeps one offset per record and decodes on demand.
 */
#ifndef KD_TRACE_H
#define KD_TRACE_H

#include <stddef.h>
#include <stdint.h>

#include "kd_crc32.h"
#include "kd_record.h"
#include "kd_strtab.h"

#define KD_TRACE_MAGIC "KDTRACE\x1a"
#define KD_TRACE_VERSION_MAJOR 1
#define KD_TRACE_VERSION_MINOR 4 /* 1.2: the stats hash (kind 16, tree node 10); 1.3: CUDA graph launches (flags 16 / 32 + graph id, replay index); 1.4: an op extent's fifth int, the bytes its elements cover */
#define KD_TRACE_HEADER_BYTES 32
#define KD_CHUNK_HEADER_BYTES 16
#define KD_CHUNK_MAX_BODY (64u << 20)
#define KD_TREE_MAX_DEPTH 64

enum kd_chunk_type {
    KD_CHUNK_STRINGS = 1, /* count, then (len, bytes) per string; ids continue */
    KD_CHUNK_RECORDS = 2, /* bases, then records */
    KD_CHUNK_META = 3,    /* UTF-8 JSON object (later keys override earlier ones) */
    KD_CHUNK_END = 4,     /* the recording finished: total records so far (varint); a
                           * mode entered again appends more chunks and another END */
};

enum kd_rec_type { KD_REC_LAUNCH = 1, KD_REC_OP = 2 };

/* Op-record flags. */
/* KD_OPF_EXTENTS (format 1.1): a third tree, the memory each tensor leaf of
 * the input and output hash trees covers (Note [Data flow] in compare.py). */
enum { KD_OPF_IN_HASH = 1, KD_OPF_OUT_HASH = 2, KD_OPF_OPCALL = 4, KD_OPF_EXTENTS = 8 };

/* Tree node tags of an op record's hash trees (aten ops hash pytrees). */
enum kd_tree_tag {
    KD_T_NONE = 0,
    KD_T_LIST = 1,  /* n, n nodes */
    KD_T_TUPLE = 2, /* n, n nodes */
    KD_T_DICT = 3,  /* n, n x (key: len + bytes, node) */
    KD_T_I64 = 4,   /* 8 bytes, signed */
    KD_T_U64 = 5,   /* 8 bytes, an int >= 2^63 */
    KD_T_F64 = 6,   /* 8 bytes */
    KD_T_NORM = 7,  /* f64 finite L1, varint nan, posinf, neginf (kdebug NormHash) */
    KD_T_BOOL = 8,  /* 1 byte */
    KD_T_STR = 9,   /* len + bytes (repr of another value) */
    KD_T_STATS = 10, /* format 1.2: f64 l1, f64 sum, f64 absmax, varint nan, posinf, neginf (kdebug Stats) */
};

/* ---------------- growable byte buffer ---------------- */
typedef struct kd_buf {
    uint8_t *p;
    size_t len, cap;
    int oom;
} kd_buf;

void kd_buf_free(kd_buf *b);
void kd_buf_put(kd_buf *b, const void *src, size_t n);
void kd_buf_u8(kd_buf *b, uint8_t v);
void kd_buf_varint(kd_buf *b, uint64_t v);
void kd_buf_svarint(kd_buf *b, int64_t v);
void kd_buf_u64(kd_buf *b, uint64_t v);
void kd_buf_f64(kd_buf *b, double v);

/* ---------------- writer ---------------- */
typedef struct kd_tw {
    kd_buf out;          /* whole chunks ready to be written; the caller empties it */
    kd_buf body;         /* the RECORDS chunk being built (after its bases) */
    kd_buf strings;      /* the STRINGS chunk being built */
    uint32_t nstrings_pending;
    kd_strtab *local;    /* file-local string ids */
    uint32_t *gmap;      /* global string id -> local id */
    uint64_t gmap_cap;
    uint64_t nrec_chunk; /* records in body */
    uint64_t nrec_total; /* records in sealed chunks */
    int have_bases;
    uint64_t base_t, base_thread, base_stream, base_launch;
    uint64_t launch_bytes, tensor_args; /* accounting: bytes of launch records, tensor args */
    uint32_t full_id;         /* KD_TW_NOT_STORED's id, interned first */
    uint64_t refused_strings; /* op names / texts the full table could not take: written as full_id */
} kd_tw;

/* What an op's name or text reads as when the writer's string table was full
 * (kd_tw.refused_strings counts them). */
#define KD_TW_NOT_STORED "<not stored: the trace's string table was full>"

int kd_tw_init(kd_tw *w);          /* 0, or -1 out of memory; writes the header to out */
/* kd_tw_init with a string table of at most max_strings strings (tests). */
int kd_tw_init_sized(kd_tw *w, uint32_t max_strings);
void kd_tw_free(kd_tw *w);
/* Appends launch p[0..n) (a header and its argument payloads; string ids of
 * the global table g).  Returns 0, or -1 (malformed launch or out of memory). */
int kd_tw_launch(kd_tw *w, const kd_payload *p, uint32_t n, const kd_strtab *g);
/* Appends an op record: rendered text without its log, and its hash trees
 * (KD_T_* encoded, lengths 0 when absent). */
int kd_tw_op(kd_tw *w, uint32_t depth, uint32_t flags, const char *name, size_t name_len,
             const char *text, size_t text_len, const uint8_t *in_tree, size_t in_len,
             const uint8_t *out_tree, size_t out_len, const uint8_t *ext_tree, size_t ext_len);
int kd_tw_meta(kd_tw *w, const char *json, size_t len);
/* Seals the records built so far into out (a STRINGS chunk first when new
 * strings were used).  Returns 0, or -1 out of memory. */
int kd_tw_seal(kd_tw *w);
int kd_tw_end(kd_tw *w);           /* seal, then the END chunk */
uint64_t kd_tw_records(const kd_tw *w);

/* ---------------- reader (kd_trace_read.c; digests: kd_trace_digest.c; hash
 * trees: kd_trace_tree.c; searches: kd_trace_search.c) ---------------- */
typedef struct kd_tr_chunk {
    uint64_t base_t, base_thread, base_stream, base_launch;
} kd_tr_chunk;

typedef struct kd_tr {
    const uint8_t *data;
    size_t size;
    uint16_t version_major, version_minor;
    uint32_t nstr;
    uint64_t *str_off; /* [nstr + 1], id 0 unused */
    uint32_t *str_len;
    uint64_t *str_dg;  /* digest of each string's bytes */
    uint64_t *str_pdg; /* of an op text's part before its output ("  ->  ") */
    uint64_t *str_vdg; /* of an op text's output when it is a plain value, else 0 (Note [Returned values]) */
    uint64_t nrec;
    uint64_t *rec_off;   /* offset of each record's first byte */
    uint32_t *rec_chunk; /* its chunk's index into chunks */
    uint8_t *rec_type;
    uint32_t nchunks;
    kd_tr_chunk *chunks;
    uint64_t *dg;          /* KD_DG_N digests per record, computed while validating */
    uint32_t nmeta;
    uint64_t *meta_off;
    uint32_t *meta_len;
    int complete;          /* an END chunk is the file's last chunk */
    uint64_t end_records;  /* its record count */
    uint64_t valid_end;    /* bytes read as complete chunks */
    uint64_t ignored;      /* bytes of an incomplete last chunk, not read */
    uint64_t max_nslots;   /* largest decoded launch, in payloads */
    uint64_t tensor_args;
    uint64_t err_off;
    char err[200];
} kd_tr;

/* Validates the whole buffer (it must outlive r) and indexes it.  Returns 0,
 * or -1 with r->err / r->err_off set (the file is corrupt, foreign or from a
 * newer kdebug).  A truncated file is not an error: see r->ignored. */
int kd_tr_open(kd_tr *r, const uint8_t *data, size_t size);
void kd_tr_free(kd_tr *r);

const char *kd_tr_string(const kd_tr *r, uint32_t id, size_t *len);

/* Decodes launch record i into out[0..cap): payloads with *file* string ids
 * and spec fields as written.  Returns the number of payloads, or 0. */
uint32_t kd_tr_launch(const kd_tr *r, uint64_t i, kd_payload *out, uint32_t cap);

typedef struct kd_tr_op {
    uint32_t depth, flags, name_id, text_id;
    const uint8_t *in_tree, *out_tree, *ext_tree;
    size_t in_len, out_len, ext_len;
} kd_tr_op;
int kd_tr_op_get(const kd_tr *r, uint64_t i, kd_tr_op *op);

/* Digests of record i, for comparing runs: identity (kind and name), launch
 * config (grid, block sizes, warps, stages), shapes (argument names, roles,
 * dtypes, sizes, strides; an op's rendered text), hashes before and after
 * (0 when none were taken).  Equal records of two files give equal digests. */
enum { KD_DG_KEY, KD_DG_CONFIG, KD_DG_SHAPE, KD_DG_PRE, KD_DG_POST, KD_DG_N };
void kd_tr_digests(const kd_tr *r, uint64_t i, uint64_t out[KD_DG_N]);

/* Digest of one kernel argument's hash side (w: 0 pre, 1 post), the one
 * kd_launch_digests folds (Note [Launch table]); 0 when that side has no value. */
uint64_t kd_tr_hash_digest(const kd_hash_rec *h, int w);

/* The last record before `before` that wrote memory overlapping [lo, hi) on
 * the device (a launch with a written tensor argument there), or an op whose
 * output tree holds a leaf with digest `leaf` (nonzero).  Returns its index
 * or -1; *args_mask gets the written arguments (bit k: argument k, k < 64). */
int64_t kd_tr_last_writer(const kd_tr *r, uint64_t before, int dev_type, int dev_index,
                          uint64_t lo, uint64_t hi, uint64_t leaf, uint64_t *args_mask);

/* Digest of one tree node's encoding (a leaf hash value), and whether the
 * tree at p[0..n) holds a leaf with that digest. */
uint64_t kd_tree_leaf_digest(const uint8_t *p, size_t n);
int kd_tree_has_leaf(const uint8_t *p, size_t n, uint64_t leaf);

/* Byte extent [lo, hi) of the tensor argument at p[0]; lo == hi when empty. */
void kd_tensor_extent(const kd_payload *p, uint64_t *lo, uint64_t *hi);

/* ---------------- tables (kd_trace_table.c) ----------------
 * Note [Trace tables]
 * Reports and exports need every record's fields at once, not one Python
 * object per launch: kd_tr_table() decodes records [start, stop) into two
 * arrays of fixed-size little-endian rows (kd_tab_rec, kd_tab_arg) and one
 * of int64 sizes (ndim per tensor argument, in argument order), which the
 * HTML report ships to the browser as they are and the Perfetto export reads
 * column-wise.  A record's arguments are the next `nargs` argument rows.
 * The layouts are pinned below; kdebug/report.py and the report's script
 * read them by these offsets. */
typedef struct kd_tab_rec {
    uint8_t type;        /* KD_REC_LAUNCH or KD_REC_OP */
    uint8_t kind;        /* launch: KD_KIND_*; op: KD_OPF_* flags */
    uint8_t device_type; /* launch: c10::DeviceType; op: 255 */
    int8_t device_index;
    uint16_t nargs;
    uint16_t depth;
    uint32_t name_id;    /* file string ids (kd_tr_string) */
    uint32_t text_id;    /* launch: config; op: rendered text */
    uint32_t grid[3];    /* 0 when no grid was recorded */
    uint16_t num_warps;
    uint8_t num_stages;
    uint8_t flags;       /* launch: KD_LF_* */
    uint64_t launch_index;
    uint64_t stream;
    uint64_t thread_id;
    uint64_t t_start_ns, t_end_ns; /* launch only; host clock around the launch call */
    uint32_t shared_mem;
    uint32_t reserved;
} kd_tab_rec;

typedef struct kd_tab_arg {
    uint8_t tag;  /* KD_TAG_TENSOR ... KD_TAG_OTHER */
    uint8_t role; /* KD_ROLE_* */
    uint8_t dtype, ndim;          /* tensors */
    uint8_t hash_kinds, hash_flags; /* tensors: kd_hash_rec kinds / flags, 0 unhashed */
    uint8_t device_type;
    int8_t device_index;
    uint32_t name_id;
    uint32_t other_id;  /* KD_TAG_OTHER: type-name string id */
    union { int64_t i; double f; } value; /* INT / BOOL: i; FLOAT: f; TENSOR: i = numel */
    uint64_t bitwise[2];                 /* [0] pre, [1] post */
    double l1[2];
    uint32_t nan[2], posinf[2], neginf[2]; /* saturated at 2^32 - 1 */
    union {                      /* as in kd_hash_rec (Note [Room for the stats]) */
        uint64_t xor64[2];       /* KD_HK_XOR */
        double sum[2];           /* KD_HK_STATS */
    };
    double absmax[2];            /* KD_HK_STATS */
} kd_tab_arg;

static_assert(sizeof(kd_tab_rec) == 80, "kd_tab_rec layout");
static_assert(sizeof(kd_tab_arg) == 112, "kd_tab_arg layout");

typedef struct kd_tab {
    kd_tab_rec *rec;
    uint64_t nrec, rec_cap;
    kd_tab_arg *arg;
    uint64_t narg, arg_cap;
    int64_t *dims;
    uint64_t ndims, dims_cap;
} kd_tab;

/* Appends records [start, stop) of r to t (zero-initialise t first).  Returns
 * 0, -1 out of memory, or -2 a launch record that does not decode. */
int kd_tr_table(const kd_tr *r, uint64_t start, uint64_t stop, kd_tab *t);
void kd_tab_free(kd_tab *t);

#endif
