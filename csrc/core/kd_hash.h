/* kd_hash.h - tensor fingerprints computed in C (no Python, no torch).
 *
 * Note [The bitwise hash]
 * A 64-bit hash of a tensor's logical elements in logical (row-major) order:
 *   B   = the tensor's elements in logical order, each element's bytes as
 *         they sit in memory (little-endian); L = numel * itemsize bytes.
 *   w_p = the little-endian 64-bit word B[8p .. 8p+8), zero-padded past L,
 *         for p = 0 .. ceil(L/8) - 1.
 *   S   = sum over p of fmix64(w_p XOR ((p + 1) * 0x9E3779B97F4A7C15))  (mod 2^64)
 *   H   = fmix64(S XOR fmix64(L XOR 0x6A09E667F3BCC909))
 * with fmix64 MurmurHash3's 64-bit finalizer.  Each term is a bijection of
 * its word, so flipping any bit changes exactly one term and therefore H;
 * the position enters every term, so moving a value changes H; the sum is
 * the same in any order, so any split of the work (threads, CUDA blocks)
 * gives the same H.  It depends on bytes only: NaNs with equal payloads hash
 * equal, and a transposed view hashes like its contiguous copy.
 *
 * Note [The norm hash]: upstream's value, the L1 norm in float64 (ints and
 * bools cast through float32 first, as upstream does; complex: sum of |z|),
 * summed here over the finite elements only, with the NaN, +inf and -inf
 * elements counted apart, so identical tensors always give identical results.
 *
 * Note [The stats hash]: how big the values are, from the same pass: the
 * norm's fields (L1 over finite elements, NaN / +inf / -inf counts) plus
 *   sum    the sum of the finite elements, accumulated in float64;
 *   absmax the largest |x| over the finite elements (0 when there is none).
 * Integer and bool tensors: sum is the exact int64 sum (wrapping modulo 2^64
 * like torch's, uint64 as unsigned) and absmax the exact largest |x|, both
 * converted to double at the end (exact up to 2^53); their counts are 0.
 * Complex tensors: the counts and L1 are the norm's (per element, |z|); sum
 * and absmax are taken over the real components (re and im) of the finite
 * elements, as torch.view_as_real would see them.  On the CPU the float64
 * sum adds in element order; on the GPU it uses the norm's fixed tree
 * (Note [Hashing on the GPU]), so both are the same on every run of one
 * device, and may differ from each other in the last bits.
 *
 * Note [The hash_tensor hash]: upstream's torch.hash_tensor after an upcast
 * to 64 bits: the XOR of every element's float64 bits (ints: int64), complex
 * as two float64 words.  Kept for compatibility: it is order-blind and equal
 * elements cancel in pairs.
 */
#ifndef KD_HASH_H
#define KD_HASH_H

#include <stddef.h>
#include <stdint.h>

/* Shared with the CUDA kernel (kd_cuda_hash.cu), so both compute one definition. */
#ifdef __CUDACC__
#define KD_HOST_DEVICE __host__ __device__
#else
#define KD_HOST_DEVICE
#endif

/* c10::ScalarType numbers kdebug needs to decode values (stable in c10). */
enum kd_scalar_type {
    KD_ST_BYTE = 0, KD_ST_CHAR = 1, KD_ST_SHORT = 2, KD_ST_INT = 3, KD_ST_LONG = 4,
    KD_ST_HALF = 5, KD_ST_FLOAT = 6, KD_ST_DOUBLE = 7, KD_ST_COMPLEX_HALF = 8,
    KD_ST_COMPLEX_FLOAT = 9, KD_ST_COMPLEX_DOUBLE = 10, KD_ST_BOOL = 11,
    KD_ST_QINT8 = 12, KD_ST_QUINT8 = 13, KD_ST_QINT32 = 14, KD_ST_BFLOAT16 = 15,
    KD_ST_QUINT4X2 = 16, KD_ST_QUINT2X4 = 17, KD_ST_BITS1X8 = 18, KD_ST_BITS2X4 = 19,
    KD_ST_BITS4X2 = 20, KD_ST_BITS8 = 21, KD_ST_BITS16 = 22, KD_ST_F8E5M2 = 23,
    KD_ST_F8E4M3FN = 24, KD_ST_F8E5M2FNUZ = 25, KD_ST_F8E4M3FNUZ = 26, KD_ST_UINT16 = 27,
    KD_ST_UINT32 = 28, KD_ST_UINT64 = 29, KD_ST_F8E8M0FNU = 44, KD_ST_F4E2M1FNX2 = 45,
};

#ifdef __cplusplus
extern "C" {
#endif

/* Bytes per element of a scalar type, 0 if unknown. */
int kd_itemsize(int scalar_type);

static inline KD_HOST_DEVICE uint64_t kd_fmix64(uint64_t k)
{
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33;
    k *= 0xc4ceb9fe1a85ec53ull;
    k ^= k >> 33;
    return k;
}

#define KD_HASH_GOLDEN 0x9E3779B97F4A7C15ull
#define KD_HASH_LSALT 0x6A09E667F3BCC909ull

/* H from the sum S and the logical byte length L. */
static inline KD_HOST_DEVICE uint64_t kd_hash_finish(uint64_t S, uint64_t L)
{
    return kd_fmix64(S ^ kd_fmix64(L ^ KD_HASH_LSALT));
}

/* A view of a strided tensor: element strides, like torch's. */
typedef struct kd_view {
    const void *data; /* address of logical element 0 */
    int scalar_type;
    int itemsize;
    int ndim;
    const int64_t *sizes;
    const int64_t *strides;
} kd_view;

/* Whether scalar type st is a quantized one (its bytes are integers its
 * quantizer's parameters give values to). */
static inline int kd_dtype_quantized(int st)
{
    return st == KD_ST_QINT8 || st == KD_ST_QUINT8 || st == KD_ST_QINT32 || st == KD_ST_QUINT4X2 ||
           st == KD_ST_QUINT2X4;
}

/* The integer type a quantized type's values are stored as (st itself for
 * any other; the sub-byte ones as their packed bytes). */
static inline int kd_quant_int_dtype(int st)
{
    switch (st) {
    case KD_ST_QINT8: return KD_ST_CHAR;
    case KD_ST_QUINT8: case KD_ST_QUINT4X2: case KD_ST_QUINT2X4: return KD_ST_BYTE;
    case KD_ST_QINT32: return KD_ST_INT;
    default: return st;
    }
}

/* The bitwise hash of a view (Note [The bitwise hash]). */
uint64_t kd_hash_bitwise(const kd_view *v);

typedef struct kd_norm {
    double l1;      /* over finite elements */
    uint64_t nan, posinf, neginf;
} kd_norm;

/* The norm hash (Note [The norm hash]); returns -1 for a type it cannot decode. */
int kd_hash_norm(const kd_view *v, kd_norm *out);

typedef struct kd_stats {
    kd_norm norm;  /* the norm hash's fields */
    double sum;    /* over finite elements (Note [The stats hash]) */
    double absmax; /* over finite elements, 0 if none */
} kd_stats;

/* The stats hash (Note [The stats hash]) in one pass; -1 for a type it cannot decode. */
int kd_hash_stats(const kd_view *v, kd_stats *out);

/* The hash_tensor hash (Note [The hash_tensor hash]); -1 if it cannot decode. */
int kd_hash_xor64(const kd_view *v, uint64_t *out);

/* Decodes element i of a contiguous buffer of a floating type as a double
 * (half, bfloat16, the float8 kinds); for tests and the norm. */
double kd_decode_float(int scalar_type, const void *elem);

#ifdef __cplusplus
}
#endif

#endif
