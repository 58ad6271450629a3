/* kd_record.h - the fixed-size, plain-data records kdebug's ring holds.
 *
 * Note [Record layout]
 * Every launch is stored as a run of 120-byte payloads in consecutive ring
 * slots: one KD_TAG_LAUNCH header, then one payload per kernel argument, and,
 * for a tensor of more than KD_INLINE_DIMS dimensions, KD_TAG_DIMS
 * continuation payloads right after that argument.  A payload never holds a
 * pointer to a Python object: names and launch configs are ids into the
 * interned string table (kd_strtab.h), tensors are reduced to their metadata.
 * 120 bytes is chosen so that a ring slot (payload + 8-byte commit stamp) is
 * exactly two cache lines, a 4-d tensor fits in one payload, and each payload
 * keeps spare bytes (8 to 32) for later fields without changing the size.
 * The sizes are pinned with static_assert below; the trace format (issue 4)
 * writes these payloads verbatim, so a change here is a format change.
 * Readers find the arguments with kd_args.h (Note [Argument payloads]).
 */
#ifndef KD_RECORD_H
#define KD_RECORD_H

#include <assert.h>
#include <stddef.h>
#include <stdint.h>

#define KD_PAYLOAD_BYTES 120
#define KD_INLINE_DIMS 4
#define KD_CONT_DIMS 7
#define KD_MAX_NDIM 64

enum kd_tag {
    KD_TAG_EMPTY = 0,
    KD_TAG_LAUNCH = 1,
    KD_TAG_TENSOR = 2,
    KD_TAG_INT = 3,
    KD_TAG_FLOAT = 4,
    KD_TAG_BOOL = 5,
    KD_TAG_NONE = 6,
    KD_TAG_OTHER = 7, /* a value of another Python type: its type name id */
    KD_TAG_DIMS = 8,  /* continuation: more (size, stride) pairs */
    KD_TAG_HASH = 9,  /* the hashes of the tensor argument before it (kd_hash_rec) */
};

/* Tensor argument flags. */
enum kd_tensor_flag {
    KD_TF_HASHED = 1, /* a KD_TAG_HASH payload follows the argument's dims */
};

/* Hash kinds, a bit mask (Notes in kd_hash.h). */
enum kd_hash_kind { KD_HK_BITWISE = 1, KD_HK_NORM = 2, KD_HK_XOR = 4, KD_HK_CUSTOM = 8, KD_HK_STATS = 16 };

/* Note [Room for the stats]
 * The stats hash (Note [The stats hash] in kd_hash.h) shares the norm's
 * fields and adds a sum and an absmax per side: 32 bytes, where a hash
 * payload has 16 spare.  The sum shares its bytes with hash_tensor's xor64,
 * so one record holds either: a hash configuration asking for both "stats"
 * and "hash_tensor" is refused where it is set (kdebug.hashing.parse and
 * kd_hash_config's setter), and the payload keeps its 120 bytes, so records,
 * rings and launches keep their sizes. */
#define KD_HK_CONFLICT(k) (((k) & KD_HK_STATS) && ((k) & KD_HK_XOR))

/* kd_hash_rec.flags */
enum kd_hash_flag {
    KD_HF_PRE = 1,          /* pre-launch values present */
    KD_HF_POST = 2,         /* post-launch values present */
    KD_HF_CHANGED = 4,      /* a read-only argument's bytes changed during the launch */
    KD_HF_UNSUPPORTED = 8,  /* the dtype cannot be hashed by this kind (counted) */
    KD_HF_CHECKED = 16,     /* read-only check done (pre and post bitwise taken) */
    KD_HF_PENDING_PRE = 32, /* pre values are on the GPU: bitwise[0] holds the result index */
    KD_HF_PENDING_POST = 64,/* post values likewise, in bitwise[1] */
};

enum kd_kind { KD_KIND_TRITON = 1, KD_KIND_CPP = 2, KD_KIND_ATEN = 3 /* Note [C++ op observer] */ };

/* Argument roles, a bit mask. */
enum kd_role { KD_ROLE_READ = 1, KD_ROLE_WRITE = 2 };

/* Launch flags. */
enum kd_launch_flag {
    KD_LF_GRID = 1,       /* grid[] holds the grid the launcher used */
    KD_LF_CONFIG = 2,     /* config_id / num_warps / num_stages are set */
    KD_LF_RAISED = 4,     /* the launch itself raised an exception */
    KD_LF_ARG_ERROR = 8,  /* some argument could not be described (counted) */
    KD_LF_CAPTURED = 16,  /* launched while a CUDA graph was captured: did not run, no values (graph_id) */
    KD_LF_REPLAYED = 32,  /* a replay of a captured launch (graph_id, replay_index; Note [CUDA graph replays]) */
};

/* Device types: c10::DeviceType values for the two we name. */
enum { KD_DEV_CPU = 0, KD_DEV_CUDA = 1 };

typedef struct kd_launch {
    uint8_t tag; /* KD_TAG_LAUNCH */
    uint8_t kind;
    uint8_t flags;
    uint8_t device_type;
    int8_t device_index;
    uint8_t num_stages;
    uint16_t num_warps;
    uint16_t nargs;     /* arguments that follow */
    uint16_t nslots;    /* payloads that follow (>= nargs) */
    uint16_t call_depth;
    uint16_t reserved0;
    uint32_t name_id;
    uint32_t config_id; /* interned "XBLOCK=1024, R0_BLOCK=8" */
    uint32_t grid[3];
    uint32_t shared_mem; /* bytes of shared memory the launcher asked for */
    uint64_t launch_index; /* 0-based launch number within the recorder */
    uint64_t py_index;     /* len(debug_mode.operators) at launch time */
    uint64_t stream;       /* raw cudaStream_t, 0 for CPU kernels */
    uint64_t thread_id;
    uint64_t t_start_ns;   /* CLOCK_MONOTONIC before the launch */
    uint64_t t_end_ns;     /* after the launch call returned (host side) */
    uint32_t graph_id;     /* KD_LF_CAPTURED / KD_LF_REPLAYED: the CUDA graph (1, 2, ... in capture order) */
    uint32_t reserved1;
    uint64_t replay_index; /* KD_LF_REPLAYED: 0 for the graph's first replay */
    uint8_t spare[16];
} kd_launch;

typedef struct kd_tensor_arg {
    uint8_t tag; /* KD_TAG_TENSOR */
    uint8_t role;
    uint8_t dtype; /* c10::ScalarType */
    uint8_t ndim;
    uint8_t device_type;
    int8_t device_index;
    uint8_t flags;
    uint8_t reserved0;
    uint32_t name_id;
    uint32_t reserved1;
    int64_t storage_offset; /* in elements */
    uint64_t data_ptr;      /* address of element 0 of the view */
    uint64_t pre_hash;
    uint64_t post_hash;
    int64_t sizes[KD_INLINE_DIMS];
    int64_t strides[KD_INLINE_DIMS];
} kd_tensor_arg;

/* Every argument payload starts like this: tag, role, then name_id at byte 8. */
typedef struct kd_scalar_arg {
    uint8_t tag; /* KD_TAG_INT / FLOAT / BOOL / NONE / OTHER */
    uint8_t role;
    uint8_t reserved[6];
    uint32_t name_id;
    uint32_t reserved1;
    union {
        int64_t i;
        double f;
        uint32_t type_name_id; /* KD_TAG_OTHER */
    } value;
    uint8_t spare[KD_PAYLOAD_BYTES - 24];
} kd_scalar_arg;

typedef struct kd_dims_cont {
    uint8_t tag; /* KD_TAG_DIMS */
    uint8_t count;
    uint8_t reserved[6];
    int64_t sizes[KD_CONT_DIMS];
    int64_t strides[KD_CONT_DIMS];
} kd_dims_cont;

/* Hash values of one tensor argument (a KD_TAG_HASH payload right after its
 * dims).  Which fields hold values: kinds x (KD_HF_PRE / KD_HF_POST). */
typedef struct kd_hash_rec {
    uint8_t tag; /* KD_TAG_HASH */
    uint8_t kinds;
    uint8_t flags;
    uint8_t reserved0;
    uint16_t spec;   /* which log_tensor_hashes() spec asked (Python side) */
    uint16_t reserved1;
    uint64_t bitwise[2]; /* [0] pre, [1] post */
    double l1[2];
    uint64_t nan[2], posinf[2], neginf[2];
    union {                 /* Note [Room for the stats] */
        uint64_t xor64[2];  /* KD_HK_XOR */
        double sum[2];      /* KD_HK_STATS */
    };
    double absmax[2];       /* KD_HK_STATS */
} kd_hash_rec;

typedef union kd_payload {
    uint8_t tag;
    kd_launch launch;
    kd_tensor_arg tensor;
    kd_scalar_arg scalar;
    kd_dims_cont dims;
    kd_hash_rec hash;
    uint8_t bytes[KD_PAYLOAD_BYTES];
} kd_payload;

static_assert(sizeof(kd_launch) == KD_PAYLOAD_BYTES, "kd_launch size");
static_assert(sizeof(kd_tensor_arg) == 112, "kd_tensor_arg size");
static_assert(sizeof(kd_scalar_arg) == KD_PAYLOAD_BYTES, "kd_scalar_arg size");
static_assert(sizeof(kd_dims_cont) == KD_PAYLOAD_BYTES, "kd_dims_cont size");
static_assert(offsetof(kd_tensor_arg, name_id) == offsetof(kd_scalar_arg, name_id),
              "arguments share their name_id offset");
static_assert(offsetof(kd_tensor_arg, role) == offsetof(kd_scalar_arg, role),
              "arguments share their role offset");
static_assert(sizeof(kd_hash_rec) == KD_PAYLOAD_BYTES, "kd_hash_rec size");
static_assert(sizeof(kd_payload) == KD_PAYLOAD_BYTES, "kd_payload size");

/* Number of payloads a tensor of ndim dimensions occupies. */
static inline uint32_t kd_tensor_payloads(uint32_t ndim)
{
    if (ndim <= KD_INLINE_DIMS)
        return 1;
    return 1 + (ndim - KD_INLINE_DIMS + KD_CONT_DIMS - 1) / KD_CONT_DIMS;
}

/* Payloads taken by the argument starting at p[0] (dims and hashes included). */
static inline uint32_t kd_arg_payloads(const kd_payload *p)
{
    if (p->tag != KD_TAG_TENSOR)
        return 1;
    return kd_tensor_payloads(p->tensor.ndim) + ((p->tensor.flags & KD_TF_HASHED) ? 1 : 0);
}

/* The hash payload of a tensor argument starting at p[0], or NULL. */
static inline kd_hash_rec *kd_arg_hash(kd_payload *p)
{
    if (p->tag != KD_TAG_TENSOR || !(p->tensor.flags & KD_TF_HASHED))
        return NULL;
    return &p[kd_tensor_payloads(p->tensor.ndim)].hash;
}

/* Size and stride of dimension d of the tensor argument starting at p[0]. */
static inline void kd_tensor_dim(const kd_payload *p, uint32_t d, int64_t *size,
                                 int64_t *stride)
{
    if (d < KD_INLINE_DIMS) {
        *size = p[0].tensor.sizes[d];
        *stride = p[0].tensor.strides[d];
        return;
    }
    d -= KD_INLINE_DIMS;
    const kd_dims_cont *c = &p[1 + d / KD_CONT_DIMS].dims;
    *size = c->sizes[d % KD_CONT_DIMS];
    *stride = c->strides[d % KD_CONT_DIMS];
}

#endif
