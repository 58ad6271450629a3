// kd_cuda_hash.cu - the GPU side of kdebug's tensor hashes
// (Note [Hashing on the GPU] in kd_cuda_hash.h; definitions in kd_hash.h).
// No libtorch headers here: the CUDA runtime only.
#include "kd_cuda_hash.h"
#include "kd_cuda_util.cuh"
#include "kd_hash.h" // the definition: kd_fmix64, KD_HASH_GOLDEN
#include "kd_inflight.h"
#include "kd_results.h"

#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>
#include <mutex>
#include <vector>

namespace {

constexpr int kThreads = 256;         // threads per block
constexpr int kCapacity = KD_CUDA_CAPACITY; // results in flight per device
constexpr int kNormBlocks = 1024;     // max blocks per tensor when the norm is asked for
constexpr int kMaxBlocks = 4096;      // otherwise
constexpr int64_t kPartials = 1 << 20; // the norm's per-block partial sums: a ring per device
constexpr uint64_t kGolden = KD_HASH_GOLDEN;
constexpr int kMaxStreams = 8;        // hash streams a read-back without waiting orders itself after
enum { HK_BITWISE = 1, HK_NORM = 2, HK_XOR = 4, HK_STATS = 16 };

// The kernel's parameter block, sized to the batch: a launch copies all of
// it, and most batches hold one to four tensors.
template <int CAP> struct BatchT {
    kd_cuda_tensor t[CAP];
    int64_t slot[CAP];
    int first_block[CAP + 1];
    int n;
    int kinds;
    int64_t pbase; // block b's norm partial goes to partials[pbase + b]
    int64_t pstride; // stats: block b's sum partial goes to partials[pbase + pstride + b]
    const long long *base; // CUDA graphs: slots are relative to *base, read when the kernel runs (else null)
};
using Batch = BatchT<KD_CUDA_BATCH>;

__device__ __forceinline__ uint64_t fmix64(uint64_t k) { return kd_fmix64(k); }


// Element bits, by one load of the element's width when it is aligned.
__device__ __forceinline__ uint64_t load_bits(const uint8_t *p, int isz, bool aligned)
{
    if (aligned) {
        switch (isz) {
        case 1: return *p;
        case 2: return *reinterpret_cast<const uint16_t *>(p);
        case 4: return *reinterpret_cast<const uint32_t *>(p);
        case 8: return *reinterpret_cast<const uint64_t *>(p);
        default: break;
        }
    }
    uint64_t u = 0;
    for (int i = 0; i < isz && i < 8; i++)
        u |= (uint64_t)p[i] << (8 * i);
    return u;
}

// Word p of the logical byte stream (zero-padded past nbytes).
__device__ uint64_t word_at(const kd_cuda_tensor &T, uint64_t p, uint64_t nbytes)
{
    const uint8_t *base = reinterpret_cast<const uint8_t *>(T.data);
    uint64_t b0 = p * 8;
    if (T.contiguous) {
        if (b0 + 8 <= nbytes && ((T.data + b0) & 7) == 0)
            return *reinterpret_cast<const uint64_t *>(base + b0);
        uint64_t w = 0;
        for (int k = 0; k < 8 && b0 + k < nbytes; k++)
            w |= (uint64_t)base[b0 + k] << (8 * k);
        return w;
    }
    uint64_t w = 0;
    int isz = T.itemsize;
    if ((T.data % (uint64_t)(isz < 8 ? isz : 8)) == 0 && (isz == 1 || isz == 2 || isz == 4 || isz == 8 || isz == 16)) {
        // whole elements (or halves of 16-byte ones) by typed loads
        if (isz == 16) {
            const uint8_t *ep = base + kd_elem_offset(T, (int64_t)(p / 2)) * 16 + (p % 2) * 8;
            return *reinterpret_cast<const uint64_t *>(ep);
        }
        const int per = 8 / isz;
        const int64_t e0 = (int64_t)(b0 / isz);
        for (int k = 0; k < per && e0 + k < T.numel; k++) {
            const uint8_t *ep = base + kd_elem_offset(T, e0 + k) * isz;
            w |= load_bits(ep, isz, true) << (8 * isz * k);
        }
        return w;
    }
    int k = 0;
    while (k < 8 && b0 + k < nbytes) {
        uint64_t b = b0 + k;
        int64_t e = (int64_t)(b / isz);
        int bi = (int)(b % isz);
        const uint8_t *ep = base + kd_elem_offset(T, e) * isz;
        while (k < 8 && bi < isz && b0 + k < nbytes) {
            w |= (uint64_t)ep[bi] << (8 * k);
            k++;
            bi++;
        }
    }
    return w;
}

// ---- value decoding (mirrors kd_hash.c) ----

__device__ double f8(uint8_t x, int eb, int mb, int bias, bool fnuz, bool fn)
{
    if (fnuz && x == 0x80)
        return __longlong_as_double(0x7ff8000000000000ll);
    int s = x >> 7, e = (x >> mb) & ((1 << eb) - 1), m = x & ((1 << mb) - 1);
    if (fn && e == (1 << eb) - 1 && m == (1 << mb) - 1)
        return __longlong_as_double(0x7ff8000000000000ll);
    if (!fn && !fnuz && e == (1 << eb) - 1)
        return m ? __longlong_as_double(0x7ff8000000000000ll) : (s ? -INFINITY : INFINITY);
    double v = e == 0 ? ldexp((double)m, 1 - bias - mb) : ldexp((double)((1 << mb) + m), e - bias - mb);
    return s ? -v : v;
}

__device__ double dec_float_bits(int st, uint64_t u)
{
    switch (st) {
    case 5: { // half
        uint16_t h = (uint16_t)u;
        int s = h >> 15, e = (h >> 10) & 0x1f, m = h & 0x3ff;
        if (e == 31) {
            uint32_t u = ((uint32_t)s << 31) | 0x7f800000u | ((uint32_t)m << 13);
            return (double)__uint_as_float(u);
        }
        double v = e == 0 ? ldexp((double)m, -24) : ldexp((double)(1024 + m), e - 25);
        return s ? -v : v;
    }
    case 15: // bfloat16
        return (double)__uint_as_float((uint32_t)(uint16_t)u << 16);
    case 6:
        return (double)__uint_as_float((uint32_t)u);
    case 7:
        return __longlong_as_double((long long)u);
    case 23: return f8((uint8_t)u, 5, 2, 15, false, false);
    case 24: return f8((uint8_t)u, 4, 3, 7, false, true);
    case 25: return f8((uint8_t)u, 5, 2, 16, true, false);
    case 26: return f8((uint8_t)u, 4, 3, 8, true, false);
    case 44: return (uint8_t)u == 0xff ? __longlong_as_double(0x7ff8000000000000ll) : ldexp(1.0, (int)(uint8_t)u - 127);
    default: return 0.0;
    }
}

__device__ int value_kind(int st)
{
    switch (st) {
    case 5: case 15: case 6: case 7: case 23: case 24: case 25: case 26: case 44: return 0;
    case 11: case 0: case 1: case 2: case 3: case 4: case 27: case 28: case 29: return 1;
    case 8: case 9: case 10: return 2;
    default: return -1;
    }
}

__device__ int64_t dec_int_bits(int st, uint64_t u)
{
    switch (st) {
    case 11: return (uint8_t)u != 0;
    case 0: return (uint8_t)u;
    case 1: return (int8_t)u;
    case 2: return (int16_t)u;
    case 27: return (uint16_t)u;
    case 3: return (int32_t)u;
    case 28: return (uint32_t)u;
    default: return (int64_t)u;
    }
}

// Exact integer reductions (sum / xor): any order gives the same result.
struct SumOp {
    __device__ unsigned long long operator()(unsigned long long a, unsigned long long b) const { return a + b; }
};
struct XorOp {
    __device__ unsigned long long operator()(unsigned long long a, unsigned long long b) const { return a ^ b; }
};
// absmax: of non-negative doubles' bits (ordered like the values) or of integers
struct MaxOp {
    __device__ unsigned long long operator()(unsigned long long a, unsigned long long b) const { return a > b ? a : b; }
};

template <class Op> __device__ __forceinline__ unsigned long long warp_reduce(unsigned long long v, Op op)
{
    for (int o = 16; o > 0; o >>= 1)
        v = op(v, __shfl_down_sync(0xffffffffu, v, o));
    return v;
}

// The block's reduction, in thread 0 (uniform control flow: every thread calls it).
template <int NT, class Op> __device__ unsigned long long block_reduce(unsigned long long v, Op op)
{
    __shared__ unsigned long long part[NT / 32];
    v = warp_reduce(v, op);
    if ((threadIdx.x & 31) == 0)
        part[threadIdx.x >> 5] = v;
    __syncthreads();
    unsigned long long t = 0;
    if (threadIdx.x == 0)
        for (int i = 0; i < NT / 32; i++)
            t = op(t, part[i]);
    __syncthreads();
    return t;
}

// One thread's values (Notes [The norm hash], [The stats hash] in kd_hash.h).
struct ValueAcc {
    double l1 = 0.0, sum = 0.0, amax = 0.0;
    unsigned long long nan = 0, pinf = 0, ninf = 0, x = 0, isum = 0, iamax = 0;
};

__device__ __forceinline__ void add_finite(ValueAcc &a, double v)
{
    double m = fabs(v);
    a.l1 += m;
    a.sum += v;
    a.amax = m > a.amax ? m : a.amax;
}

__device__ __forceinline__ void add_float(ValueAcc &a, double v)
{
    a.x ^= (unsigned long long)__double_as_longlong(v);
    if (isnan(v)) a.nan++;
    else if (isinf(v)) (v > 0 ? a.pinf : a.ninf)++;
    else add_finite(a, v);
}

// add_float for a batch that asks for the norm alone: its fields only (l1
// takes the same additions in the same order)
__device__ __forceinline__ void add_norm(ValueAcc &a, double v)
{
    if (isnan(v)) a.nan++;
    else if (isinf(v)) (v > 0 ? a.pinf : a.ninf)++;
    else a.l1 += fabs(v);
}

__device__ __forceinline__ void add_value(ValueAcc &a, int kind, int st, int isz, const uint8_t *p, bool aligned)
{
    if (kind == 0) {
        add_float(a, dec_float_bits(st, load_bits(p, isz, aligned)));
    } else if (kind == 1) {
        int64_t iv = dec_int_bits(st, load_bits(p, isz, aligned));
        a.x ^= (unsigned long long)iv;
        a.l1 += fabs((double)(float)iv);
        a.isum += (unsigned long long)iv;
        unsigned long long m = st == 29 || iv >= 0 ? (unsigned long long)iv : 0ull - (unsigned long long)iv;
        a.iamax = m > a.iamax ? m : a.iamax;
    } else {
        int hs = isz / 2;
        int fst = st == 8 ? 5 : st == 9 ? 6 : 7;
        double re = dec_float_bits(fst, load_bits(p, hs, aligned)), im = dec_float_bits(fst, load_bits(p + hs, hs, aligned));
        a.x ^= (unsigned long long)__double_as_longlong(re) ^ (unsigned long long)__double_as_longlong(im);
        if (isnan(re) || isnan(im)) {
            a.nan++;
        } else if (isinf(re) || isinf(im)) {
            a.pinf++;
        } else { // stats over the real components (Note [The stats hash])
            a.l1 += hypot(re, im);
            a.sum += re;
            a.sum += im;
            double m = fmax(fabs(re), fabs(im));
            a.amax = m > a.amax ? m : a.amax;
        }
    }
}

// The block's sum of v, by a fixed tree in sh (every thread gets it; uniform control flow).
__device__ double block_sum_tree(double *sh, double v)
{
    sh[threadIdx.x] = v;
    __syncthreads();
    for (int w = kThreads / 2; w >= 32; w >>= 1) {
        if ((int)threadIdx.x < w)
            sh[threadIdx.x] += sh[threadIdx.x + w];
        __syncthreads();
    }
    // the last five levels in warp 0, the same pairs in the same order (lane i
    // adds lane i + w; what lanes >= w compute is never read), without a
    // __syncthreads per level: the same bits as the shared-memory tree
    if (threadIdx.x < 32) {
        double x = sh[threadIdx.x];
        for (int w = 16; w > 0; w >>= 1)
            x += __shfl_down_sync(0xffffffffu, x, w);
        if (threadIdx.x == 0)
            sh[0] = x;
    }
    __syncthreads();
    double t = sh[0];
    __syncthreads();
    return t;
}

// Three counts summed over the block in one pass (exact integer sums), in thread 0.
__device__ void block_count3(unsigned long long &a, unsigned long long &b, unsigned long long &c)
{
    __shared__ unsigned long long part[3][kThreads / 32];
    for (int o = 16; o > 0; o >>= 1) {
        a += __shfl_down_sync(0xffffffffu, a, o);
        b += __shfl_down_sync(0xffffffffu, b, o);
        c += __shfl_down_sync(0xffffffffu, c, o);
    }
    if ((threadIdx.x & 31) == 0) {
        part[0][threadIdx.x >> 5] = a;
        part[1][threadIdx.x >> 5] = b;
        part[2][threadIdx.x >> 5] = c;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        a = b = c = 0;
        for (int i = 0; i < kThreads / 32; i++)
            a += part[0][i], b += part[1][i], c += part[2][i];
    }
    __syncthreads();
}

// The sum of the n partials at p in a fixed order: thread i takes partials
// i, i + NT, ...; then a tree (every thread gets it).
__device__ double sum_partials(double *sh, const double *p, int n)
{
    volatile const double *vp = p;
    double v = 0.0;
    for (int i = threadIdx.x; i < n; i += kThreads)
        v += vp[i];
    return block_sum_tree(sh, v);
}

template <int CAP>
__global__ void __launch_bounds__(kThreads) hash_kernel(const __grid_constant__ BatchT<CAP> b, kd_cuda_result *res, double *partials)
{
    constexpr int NT = kThreads;
    // Note [CUDA graph replays]: base -1, no room was reserved for this replay
    // (every block returns: no block waits for another)
    if (b.base != nullptr && *b.base < 0)
        return;
    // the tensor this block hashes: the last ti with first_block[ti] <= blockIdx.x
    int lo = 0, hi = b.n - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if ((int)blockIdx.x >= b.first_block[mid])
            lo = mid;
        else
            hi = mid - 1;
    }
    const int ti = lo;
    const kd_cuda_tensor &T = b.t[ti];
    const int lb = blockIdx.x - b.first_block[ti];
    const int nb = b.first_block[ti + 1] - b.first_block[ti];
    // Note [CUDA graph replays] (kd_graph.c): a kernel captured into a graph
    // finds its result slot from the replay's base, set on the device per replay
    const int slot = (int)((b.slot[ti] + (b.base != nullptr ? *b.base : 0)) % kCapacity);
    kd_cuda_result *R = &res[slot];
    const uint64_t nbytes = (uint64_t)T.numel * (uint64_t)T.itemsize;
    const uint64_t stride = (uint64_t)nb * kThreads;
    const uint64_t start = (uint64_t)lb * kThreads + threadIdx.x;

    if (b.kinds & HK_BITWISE) {
        const uint64_t nwords = (nbytes + 7) / 8;
        unsigned long long S = 0;
        if (T.contiguous && (T.data & 15) == 0) {
            // two words per 16-byte load
            const uint64_t npairs = nbytes / 16;
            const ulonglong2 *q = reinterpret_cast<const ulonglong2 *>(T.data);
            for (uint64_t i = start; i < npairs; i += stride) {
                ulonglong2 v = q[i];
                S += fmix64(v.x ^ ((2 * i + 1) * kGolden));
                S += fmix64(v.y ^ ((2 * i + 2) * kGolden));
            }
            for (uint64_t p = 2 * npairs + start; p < nwords; p += stride)
                S += fmix64(word_at(T, p, nbytes) ^ ((p + 1) * kGolden));
        } else {
            for (uint64_t p = start; p < nwords; p += stride)
                S += fmix64(word_at(T, p, nbytes) ^ ((p + 1) * kGolden));
        }
        S = block_reduce<NT>(S, SumOp());
        if (threadIdx.x == 0 && S)
            atomicAdd(reinterpret_cast<unsigned long long *>(&R->S), S);
    }

    if (b.kinds & (HK_NORM | HK_XOR | HK_STATS)) {
        const int kind = value_kind(T.scalar_type);
        const uint8_t *base = reinterpret_cast<const uint8_t *>(T.data);
        const int isz = T.itemsize;
        ValueAcc acc;
        if (kind >= 0) {
            const uint64_t numel = (uint64_t)T.numel;
            const int st = T.scalar_type;
            uint64_t e = start;
            if (T.contiguous && kind == 0 && st == 6 && (T.data & 3) == 0) {
                // float32: four independent loads in flight, added in element order
                const float *f = reinterpret_cast<const float *>(T.data);
                if (b.kinds == HK_NORM) { // the norm alone: only its fields, the same l1 additions
                    for (; e + 3 * stride < numel; e += 4 * stride) {
                        float v0 = f[e], v1 = f[e + stride], v2 = f[e + 2 * stride], v3 = f[e + 3 * stride];
                        add_norm(acc, (double)v0);
                        add_norm(acc, (double)v1);
                        add_norm(acc, (double)v2);
                        add_norm(acc, (double)v3);
                    }
                }
                for (; e + 3 * stride < numel; e += 4 * stride) {
                    float v0 = f[e], v1 = f[e + stride], v2 = f[e + 2 * stride], v3 = f[e + 3 * stride];
                    add_float(acc, (double)v0);
                    add_float(acc, (double)v1);
                    add_float(acc, (double)v2);
                    add_float(acc, (double)v3);
                }
            }
            // elements are aligned to their size when element 0 is (the half
            // width for complex numbers)
            const int unit = kind == 2 ? isz / 2 : isz;
            const bool aligned = (T.data % (uint64_t)unit) == 0;
            for (; e < numel; e += stride) {
                const uint8_t *p = base + (T.contiguous ? (int64_t)e : kd_elem_offset(T, (int64_t)e)) * isz;
                add_value(acc, kind, st, isz, p, aligned);
            }
        } else if (lb == 0 && threadIdx.x == 0) {
            R->unsupported = 1;
        }
        double l1 = acc.l1, sum = acc.sum;
        unsigned long long nan = acc.nan, pinf = acc.pinf, ninf = acc.ninf, x = acc.x;
        const bool stats = (b.kinds & HK_STATS) != 0;
        if (b.kinds & HK_XOR) {
            x = block_reduce<NT>(x, XorOp());
            if (threadIdx.x == 0 && x)
                atomicXor(reinterpret_cast<unsigned long long *>(&R->xor64), x);
        }
        if (stats) {
            // exact and order-free: the integer sum, the absmax
            unsigned long long isum = block_reduce<NT>(acc.isum, SumOp());
            unsigned long long amax = block_reduce<NT>(kind == 1 ? acc.iamax : (unsigned long long)__double_as_longlong(acc.amax), MaxOp());
            if (threadIdx.x == 0) {
                if (isum) atomicAdd(reinterpret_cast<unsigned long long *>(&R->isum), isum);
                if (amax) atomicMax(reinterpret_cast<unsigned long long *>(&R->amax), amax);
            }
        }
        if (b.kinds & (HK_NORM | HK_STATS)) {
            block_count3(nan, pinf, ninf);
            if (threadIdx.x == 0) {
                if (nan) atomicAdd(reinterpret_cast<unsigned long long *>(&R->nan), nan);
                if (pinf) atomicAdd(reinterpret_cast<unsigned long long *>(&R->posinf), pinf);
                if (ninf) atomicAdd(reinterpret_cast<unsigned long long *>(&R->neginf), ninf);
            }
            // the float64 sum: a fixed tree in the block; the tensor's last
            // block then adds the blocks' partials with the whole block, in a
            // fixed order (thread i takes partials i, i + NT, ...; then a tree)
            // (the stats' signed sum likewise, in partials pstride further on)
            __shared__ double sh[kThreads];
            __shared__ bool last;
            double tot = block_sum_tree(sh, l1);
            double stot = stats ? block_sum_tree(sh, sum) : 0.0;
            if (threadIdx.x == 0) {
                partials[b.pbase + blockIdx.x] = tot;
                if (stats)
                    partials[b.pbase + b.pstride + blockIdx.x] = stot;
                __threadfence();
                last = atomicAdd(&R->ticket, 1u) == (unsigned)nb - 1;
            }
            __syncthreads();
            if (last) { // uniform in the block
                __threadfence();
                double v = sum_partials(sh, partials + b.pbase + b.first_block[ti], nb);
                double sv = stats ? sum_partials(sh, partials + b.pbase + b.pstride + b.first_block[ti], nb) : 0.0;
                if (threadIdx.x == 0) {
                    R->l1 = v;
                    if (stats) {
                        // every block's atomics precede its ticket: all visible here
                        const unsigned long long isum = *reinterpret_cast<volatile unsigned long long *>(&R->isum);
                        const unsigned long long amax = *reinterpret_cast<volatile unsigned long long *>(&R->amax);
                        if (kind == 1) {
                            R->sum = T.scalar_type == 29 ? (double)isum : (double)(long long)isum;
                            R->absmax = (double)amax;
                        } else {
                            R->sum = sv;
                            R->absmax = __longlong_as_double((long long)amax);
                        }
                    }
                }
            }
        }
    }
    if (lb == 0 && threadIdx.x == 0)
        R->nbytes = nbytes;
}

// ---- host side ----

struct DeviceState {
    kd_cuda_result *res = nullptr; // [kCapacity]
    double *partials = nullptr;    // [kPartials], a ring (Note [Norm partials])
    int64_t next = 0;              // results queued
    int64_t collected = 0;         // results copied to the host
    int64_t pnext = 0;             // next free partial
    uint64_t pstream = 0;          // the stream of every launch since the partials last wrapped
    bool pmixed = false;           // ... or launches on several streams since then
    std::vector<kd_cuda_result> stage; // [kCapacity]: collected results on their way to kd_results_deliver
    kd_inflight inflight{};        // reservations whose writer is not queued yet (Note [Results in flight])
    // Note [Reading results without waiting]
    cudaStream_t copy_stream = nullptr; // non-blocking: ordered after the hash streams by events only
    cudaEvent_t copy_done = nullptr;    // recorded after the copy and the clearing of its slots
    kd_cuda_result *pinned = nullptr;   // [kCapacity] page-locked host copy of the results
    int64_t copy_from = -1, copy_to = -1; // results [from, to) on their way to `pinned` (-1: none)
    bool copy_needs_sync = false;        // its event was not recorded: only a blocking collect delivers it
    bool graph_since_sync = false;       // a CUDA graph replay reserved results since the device was last
                                         // synchronized: its hash kernels run on a stream not tracked here
    uint64_t streams[kMaxStreams] = {};  // streams hash kernels ran on since the last copy began
    cudaEvent_t stream_ev[kMaxStreams] = {};
    int nstreams = 0;
    bool streams_overflow = false;       // more than kMaxStreams: the copy waits for the device
};

// Note [Norm partials]
// Each block of a norm launch writes its partial sum to partials[pbase + block]
// and the tensor's last block adds them up in order.  Launches take their
// partials from a ring; a launch only reads its own partials while it runs,
// so reuse after a wrap is safe when every launch since the previous wrap was
// on the same stream (they ran in order).  After launches on several streams,
// a wrap waits for the device first (counted in kd_cuda_syncs).

std::mutex mu;
DeviceState devs[64];
uint64_t syncs = 0;
char last_error[256] = "";
int available = -1;

void set_error(const char *what, cudaError_t e)
{
    std::snprintf(last_error, sizeof last_error, "%s: %s (%d)", what, cudaGetErrorString(e), (int)e);
}


int ensure(DeviceState &s)
{
    if (s.res != nullptr)
        return 0;
    cudaError_t e = cudaMalloc(&s.res, sizeof(kd_cuda_result) * kCapacity);
    if (e == cudaSuccess)
        e = cudaMemset(s.res, 0, sizeof(kd_cuda_result) * kCapacity);
    if (e == cudaSuccess)
        e = cudaMalloc(&s.partials, sizeof(double) * kPartials);
    if (e != cudaSuccess) {
        set_error("allocating kdebug's hash buffers", e);
        return -1;
    }
    return 0;
}

template <int CAP>
void launch(const Batch &full, int blocks, cudaStream_t st, DeviceState &s, double *partials = nullptr)
{
    BatchT<CAP> b; // full.n <= CAP: only the tensors the batch holds are copied
    std::memcpy(b.t, full.t, sizeof(kd_cuda_tensor) * full.n);
    std::memcpy(b.slot, full.slot, sizeof(int64_t) * full.n);
    for (int i = 0; i <= CAP; i++)
        b.first_block[i] = full.first_block[i <= full.n ? i : full.n];
    b.n = full.n;
    b.kinds = full.kinds;
    b.pbase = full.pbase;
    b.pstride = full.pstride;
    b.base = full.base;
    hash_kernel<CAP><<<blocks, kThreads, 0, st>>>(b, s.res, partials != nullptr ? partials : s.partials);
}

int sync_device(const char *why)
{
    cudaError_t e = cudaDeviceSynchronize();
    syncs++;
    if (e != cudaSuccess) {
        set_error(why, e);
        return -1;
    }
    return 0;
}

// Hands results [from, to) of `stage` (index i: result from + i) to their
// receivers and marks them collected.
void deliver(int device, DeviceState &s, const kd_cuda_result *stage, int64_t from, int64_t to)
{
    for (int64_t i = from; i < to; i++) {
        kd_cuda_result r = stage[(size_t)(i - from)];
        if (s.inflight.used && kd_inflight_is_void(&s.inflight, i)) {
            r = kd_cuda_result{}; // its writer never ran: not a hash of anything (Note [Results in flight])
            r.unsupported = KD_CUDA_NOT_COMPUTED;
        }
        kd_results_deliver(device, i, &r);
    }
    s.collected = to;
    kd_inflight_collected(&s.inflight, to);
}

// The read-back without waiting has landed in `pinned`: its results go out.
void deliver_copy(int device, DeviceState &s)
{
    const int64_t from = s.copy_from, to = s.copy_to;
    s.copy_from = s.copy_to = -1;
    s.copy_needs_sync = false;
    const int64_t first = from % kCapacity, n = to - from;
    const int64_t run1 = n < kCapacity - first ? n : kCapacity - first;
    deliver(device, s, s.pinned + first, from, from + run1);
    if (run1 < n)
        deliver(device, s, s.pinned, from + run1, to);
}

// Reads back every result whose writer is queued: up to the first
// reservation still held (Note [Results in flight]); the rest waits.
int collect_locked(int device)
{
    DeviceState &s = devs[device];
    const int64_t limit = kd_inflight_limit(&s.inflight, s.next);
    if (limit == s.collected)
        return 0;
    KdDeviceGuard g(device);
    if (sync_device("synchronizing to read hashes") != 0)
        return -1;
    // the device is idle: every hash stream and queued replay is done, every partial free
    // (a replay whose reservation is still held is not queued yet: it still rules out a
    // read-back without waiting)
    s.nstreams = 0;
    s.streams_overflow = false;
    s.graph_since_sync = kd_inflight_held(&s.inflight) > 0;
    s.pmixed = false;
    if (s.copy_from >= 0) { // a read-back without waiting was under way: it is done now
        if (s.copy_needs_sync) { // its slots were not cleared (Note [Reading results without waiting])
            const int64_t f = s.copy_from % kCapacity, m = s.copy_to - s.copy_from;
            const int64_t r1 = m < kCapacity - f ? m : kCapacity - f;
            cudaError_t e = cudaMemset(s.res + f, 0, sizeof(kd_cuda_result) * r1);
            if (e == cudaSuccess && r1 < m)
                e = cudaMemset(s.res, 0, sizeof(kd_cuda_result) * (m - r1));
            if (e != cudaSuccess) {
                set_error("clearing read-back hash slots", e);
                return -1;
            }
        }
        deliver_copy(device, s);
    }
    if (limit == s.collected)
        return 0;
    int64_t n = limit - s.collected;
    if (s.stage.empty())
        s.stage.resize(kCapacity);
    int64_t first = s.collected % kCapacity;
    int64_t run1 = n < kCapacity - first ? n : kCapacity - first;
    cudaError_t e = cudaMemcpy(s.stage.data(), s.res + first, sizeof(kd_cuda_result) * run1,
                               cudaMemcpyDeviceToHost);
    if (e == cudaSuccess)
        e = cudaMemset(s.res + first, 0, sizeof(kd_cuda_result) * run1);
    if (e == cudaSuccess && run1 < n) {
        e = cudaMemcpy(s.stage.data() + run1, s.res, sizeof(kd_cuda_result) * (n - run1),
                       cudaMemcpyDeviceToHost);
        if (e == cudaSuccess)
            e = cudaMemset(s.res, 0, sizeof(kd_cuda_result) * (n - run1));
    }
    if (e != cudaSuccess) {
        set_error("reading hashes back", e);
        return -1;
    }
    deliver(device, s, s.stage.data(), s.collected, limit);
    return 0;
}

// A hash kernel ran on `stream` (Note [Reading results without waiting]).
void note_stream(DeviceState &s, uint64_t stream)
{
    for (int i = 0; i < s.nstreams; i++)
        if (s.streams[i] == stream)
            return;
    if (s.nstreams == kMaxStreams)
        s.streams_overflow = true;
    else
        s.streams[s.nstreams++] = stream;
}

// Note [Reading results without waiting]
// kd_cuda_hash_collect synchronizes the device: right for a user reading
// results now, wasteful for a reader that can take them later (the flight
// recorder's compare, every K steps).  kd_cuda_hash_collect_ready never
// waits.  It delivers a read-back begun earlier once its event has passed
// (cudaEventQuery), then begins the next one for every result queued since:
// on a stream of its own (non-blocking, so the legacy default stream does
// not order it), after an event recorded on each stream a hash kernel ran on
// since the last read-back began, a cudaMemcpyAsync of the results into
// page-locked memory, a cudaMemsetAsync clearing their slots, and the event.
// Results stay "not collected" until delivered, so make_room never reuses a
// slot whose clearing may still be queued; a blocking collect that meets a
// read-back in flight synchronizes (which finishes it) and delivers it
// first, so results go out once and in index order.  It takes no part once a
// CUDA graph replay has reserved results since the device was last
// synchronized (the replay's stream is not tracked: a copy ordered after the
// other streams only would read its slots before the replay wrote them), nor
// after kernels on more than kMaxStreams streams: those results wait for a
// blocking collect, whose synchronization clears both conditions.
int begin_copy(int device, DeviceState &s)
{
    const int64_t from = s.collected, to = s.next;
    if (to == from || s.inflight.used || s.graph_since_sync || s.streams_overflow)
        return 0;
    cudaError_t e = cudaSuccess;
    if (s.copy_stream == nullptr)
        e = cudaStreamCreateWithFlags(&s.copy_stream, cudaStreamNonBlocking);
    if (e == cudaSuccess && s.copy_done == nullptr)
        e = cudaEventCreateWithFlags(&s.copy_done, cudaEventDisableTiming);
    if (e == cudaSuccess && s.pinned == nullptr)
        e = cudaHostAlloc(reinterpret_cast<void **>(&s.pinned), sizeof(kd_cuda_result) * kCapacity,
                          cudaHostAllocDefault);
    for (int i = 0; e == cudaSuccess && i < s.nstreams; i++) {
        if (s.stream_ev[i] == nullptr)
            e = cudaEventCreateWithFlags(&s.stream_ev[i], cudaEventDisableTiming);
        if (e == cudaSuccess)
            e = cudaEventRecord(s.stream_ev[i], reinterpret_cast<cudaStream_t>(s.streams[i]));
        if (e == cudaSuccess)
            e = cudaStreamWaitEvent(s.copy_stream, s.stream_ev[i], 0);
    }
    const int64_t first = from % kCapacity, n = to - from;
    const int64_t run1 = n < kCapacity - first ? n : kCapacity - first;
    const size_t sz = sizeof(kd_cuda_result);
    if (e == cudaSuccess)
        e = cudaMemcpyAsync(s.pinned + first, s.res + first, sz * run1, cudaMemcpyDeviceToHost, s.copy_stream);
    if (e == cudaSuccess && run1 < n)
        e = cudaMemcpyAsync(s.pinned, s.res, sz * (n - run1), cudaMemcpyDeviceToHost, s.copy_stream);
    if (e != cudaSuccess) { // nothing cleared: the results stay for a blocking collect
        set_error("reading hashes back without waiting", e);
        s.streams_overflow = true; // none without waiting until a blocking collect
        return -1;
    }
    // from here on the results are in the copy's hands: a failure leaves it for a
    // blocking collect, whose synchronization finishes what was queued
    s.copy_from = from;
    s.copy_to = to;
    s.nstreams = 0;
    e = cudaMemsetAsync(s.res + first, 0, sz * run1, s.copy_stream);
    if (e == cudaSuccess && run1 < n)
        e = cudaMemsetAsync(s.res, 0, sz * (n - run1), s.copy_stream);
    if (e == cudaSuccess)
        e = cudaEventRecord(s.copy_done, s.copy_stream);
    if (e != cudaSuccess) {
        set_error("reading hashes back without waiting", e);
        s.copy_needs_sync = true;
        s.streams_overflow = true;
        return -1;
    }
    return 0;
}

// Room for n more results: read the ring back when it is full; a reservation
// still held can leave too little even then (Note [Results in flight]).
int make_room(int device, int64_t n)
{
    DeviceState &s = devs[device];
    if (s.next + n - s.collected <= kCapacity)
        return 0;
    if (collect_locked(device) != 0)
        return -1;
    if (s.next + n - s.collected > kCapacity) {
        std::snprintf(last_error, sizeof last_error,
                      "no room for GPU hash results: %lld are held behind CUDA graph replays not yet queued",
                      (long long)(s.next - s.collected));
        return -1;
    }
    return 0;
}

// Reserves `blocks` partials for a launch on `stream` (Note [Norm partials]).
int reserve_partials(DeviceState &s, int blocks, uint64_t stream, int64_t *base)
{
    if (s.pnext + blocks > kPartials) {
        if (s.pmixed || s.pstream != stream) {
            if (sync_device("waiting for hash launches on several streams") != 0)
                return -1;
        }
        s.pnext = 0;
        s.pmixed = false;
        s.pstream = stream;
    } else if (s.pnext == 0) {
        s.pstream = stream;
    } else if (s.pstream != stream) {
        s.pmixed = true;
    }
    *base = s.pnext;
    s.pnext += blocks;
    return 0;
}

// The blocks each tensor of a batch gets (first_block), and their total.
int plan_blocks(Batch &b, const kd_cuda_tensor *t, int n, int kinds)
{
    const bool norm = (kinds & (HK_NORM | HK_STATS)) != 0;
    const int cap = norm ? kNormBlocks : kMaxBlocks;
    int blocks = 0;
    for (int i = 0; i < n; i++) {
        b.t[i] = t[i];
        uint64_t nbytes = (uint64_t)t[i].numel * (uint64_t)t[i].itemsize;
        uint64_t work = t[i].numel > (int64_t)(nbytes / 8) ? (uint64_t)t[i].numel : nbytes / 8;
        uint64_t want = (work + (uint64_t)kThreads * 8 - 1) / ((uint64_t)kThreads * 8);
        int nb = want < 1 ? 1 : want > (uint64_t)cap ? cap : (int)want;
        b.first_block[i] = blocks;
        blocks += nb;
    }
    b.first_block[n] = blocks;
    return blocks;
}

/* Note [One hash kernel per batch]
 * A batch of up to KD_CUDA_BATCH (128) tensors is one kernel launch: the
 * tensors travel in the kernel's parameter block (__grid_constant__, 160
 * bytes a tensor), sized to the batch (1, 4, 16, 64 or 128 tensors: a launch
 * copies all of it).  128 tensors take about 21 KB, within the 32 KB of
 * kernel parameters CUDA 12.1 allows from Volta on; a toolkit before 12.1
 * (4 KB) launches the batch 16 tensors at a time (kLaunchCap), each launch
 * with its share of the blocks, slots and norm partials, so the results are
 * the same.  Why: the flight recorder's replica records hash about 200
 * gradients, parameters and optimizer states per step, which took 14 hash
 * launches in batches of 16 (a few microseconds of host time each); a block
 * finds its tensor by a binary search over first_block. */
#if defined(KD_CUDA_LAUNCH_CAP) // a build that tests the split (KDEBUG_CUDA_LAUNCH_CAP=16 python setup.py ...)
constexpr int kLaunchCap = KD_CUDA_LAUNCH_CAP;
#elif defined(CUDART_VERSION) && CUDART_VERSION >= 12010
constexpr int kLaunchCap = KD_CUDA_BATCH;
#else
constexpr int kLaunchCap = 16;
#endif
static_assert(kLaunchCap >= 16 && kLaunchCap <= KD_CUDA_BATCH, "a launch takes 16 to KD_CUDA_BATCH tensors");
static_assert(sizeof(BatchT<KD_CUDA_BATCH>) <= 32764, "the batch must fit CUDA's kernel parameters");

// One launch of the hash kernel for b (b.n <= kLaunchCap), its parameter
// block sized to b.n.
void launch_one(const Batch &b, int blocks, cudaStream_t st, DeviceState &s, double *partials)
{
    if (b.n == 1)
        launch<1>(b, blocks, st, s, partials);
    else if (b.n <= 4)
        launch<4>(b, blocks, st, s, partials);
    else if (b.n <= 16)
        launch<16>(b, blocks, st, s, partials);
    else if (b.n <= 64 && kLaunchCap >= 64)
        launch<(kLaunchCap >= 64 ? 64 : kLaunchCap)>(b, blocks, st, s, partials);
    else
        launch<kLaunchCap>(b, blocks, st, s, partials); // b.n <= kLaunchCap
}

// The hash kernel(s) for batch b (Note [One hash kernel per batch]); the
// runtime's error for the launches.
cudaError_t launch_batch(const Batch &b, int blocks, cudaStream_t st, DeviceState &s, double *partials = nullptr)
{
    if (b.n <= kLaunchCap) {
        launch_one(b, blocks, st, s, partials);
        return cudaGetLastError();
    }
    for (int i = 0; i < b.n; i += kLaunchCap) {
        const int n = b.n - i < kLaunchCap ? b.n - i : kLaunchCap;
        Batch part;
        std::memcpy(part.t, b.t + i, sizeof(kd_cuda_tensor) * n);
        std::memcpy(part.slot, b.slot + i, sizeof(int64_t) * n);
        for (int k = 0; k <= n; k++)
            part.first_block[k] = b.first_block[i + k] - b.first_block[i];
        part.n = n;
        part.kinds = b.kinds;
        part.pbase = b.pbase + b.first_block[i]; // block k of this part is block first_block[i] + k of the batch
        part.pstride = b.pstride;
        part.base = b.base;
        launch_one(part, part.first_block[n], st, s, partials);
        cudaError_t e = cudaGetLastError();
        if (e != cudaSuccess)
            return e;
    }
    return cudaSuccess;
}

} // namespace

extern "C" int kd_cuda_available(void)
{
    if (available < 0) {
        int n = 0;
        available = cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
    }
    return available;
}

extern "C" int64_t kd_cuda_hash_enqueue(int device, uint64_t stream, int kinds, const kd_cuda_tensor *t, int n)
{
    if (device < 0 || device >= 64 || n <= 0 || n > KD_CUDA_BATCH) {
        std::snprintf(last_error, sizeof last_error, "bad hash batch (device %d, %d tensors)", device, n);
        return -1;
    }
    std::lock_guard<std::mutex> lock(mu);
    DeviceState &s = devs[device];
    KdDeviceGuard g(device);
    if (ensure(s) != 0)
        return -1;
    if (make_room(device, n) != 0)
        return -1; // the ring is full: read it back first (one synchronization)
    Batch b;
    b.n = n;
    b.kinds = kinds;
    b.pbase = 0;
    b.pstride = 0;
    b.base = nullptr;
    const bool norm = (kinds & (HK_NORM | HK_STATS)) != 0;
    int blocks = plan_blocks(b, t, n, kinds);
    for (int i = 0; i < n; i++)
        b.slot[i] = s.next + i;
    // the stats take a second run of partials for their signed sum
    b.pstride = (kinds & HK_STATS) ? blocks : 0;
    if (norm && reserve_partials(s, (kinds & HK_STATS) ? 2 * blocks : blocks, stream, &b.pbase) != 0)
        return -1;
    cudaError_t e = launch_batch(b, blocks, reinterpret_cast<cudaStream_t>(stream), s);
    if (e != cudaSuccess) {
        set_error("launching kdebug's hash kernel", e);
        return -1;
    }
    note_stream(s, stream);
    int64_t first = s.next;
    s.next += n;
    return first;
}

extern "C" int kd_cuda_hash_enqueue_graph(int device, uint64_t stream, int kinds, const kd_cuda_tensor *t, int n,
                                          const int64_t *dev_base, int64_t k0, double *partials, int64_t pcap,
                                          int64_t *pnext)
{
    if (device < 0 || device >= 64 || n <= 0 || n > KD_CUDA_BATCH || dev_base == nullptr) {
        std::snprintf(last_error, sizeof last_error, "bad graph hash batch (device %d, %d tensors)", device, n);
        return -1;
    }
    std::lock_guard<std::mutex> lock(mu);
    DeviceState &s = devs[device];
    KdDeviceGuard g(device);
    if (ensure(s) != 0)
        return -1;
    Batch b;
    b.n = n;
    b.kinds = kinds;
    b.pbase = 0;
    b.pstride = 0;
    b.base = reinterpret_cast<const long long *>(dev_base);
    int blocks = plan_blocks(b, t, n, kinds);
    for (int i = 0; i < n; i++)
        b.slot[i] = k0 + i;
    b.pstride = (kinds & HK_STATS) ? blocks : 0;
    if (kinds & (HK_NORM | HK_STATS)) {
        // the graph's own partials (Note [CUDA graph replays]): replays reuse them in stream order
        int64_t need = (kinds & HK_STATS) ? 2 * (int64_t)blocks : blocks;
        if (partials == nullptr || pnext == nullptr || *pnext + need > pcap) {
            std::snprintf(last_error, sizeof last_error,
                          "the CUDA graph's room for norm / stats partial sums is used up (%lld of %lld)",
                          pnext ? (long long)*pnext : 0ll, (long long)pcap);
            return -2;
        }
        b.pbase = *pnext;
        *pnext += need;
    }
    cudaError_t e = launch_batch(b, blocks, reinterpret_cast<cudaStream_t>(stream), s, partials);
    if (e != cudaSuccess) {
        set_error("capturing kdebug's hash kernel into a CUDA graph", e);
        return -1;
    }
    return 0;
}

extern "C" int kd_cuda_hash_prepare(int device)
{
    if (device < 0 || device >= 64) {
        std::snprintf(last_error, sizeof last_error, "bad device %d", device);
        return -1;
    }
    std::lock_guard<std::mutex> lock(mu);
    KdDeviceGuard g(device);
    return ensure(devs[device]);
}

extern "C" int64_t kd_cuda_hash_reserve(int device, int64_t n)
{
    if (device < 0 || device >= 64 || n <= 0 || n > kCapacity / 2) {
        std::snprintf(last_error, sizeof last_error,
                      "cannot reserve %lld GPU hash results at once (at most %d)", (long long)n, kCapacity / 2);
        return -1;
    }
    std::lock_guard<std::mutex> lock(mu);
    DeviceState &s = devs[device];
    KdDeviceGuard g(device);
    if (ensure(s) != 0)
        return -1;
    if (make_room(device, n) != 0)
        return -1;
    int64_t first = s.next;
    bool added = kd_inflight_add(&s.inflight, first, n) == 0;
    if (!added && s.inflight.used > kd_inflight_held(&s.inflight) && collect_locked(device) == 0)
        added = kd_inflight_add(&s.inflight, first, n) == 0; // void entries keep their slots until collected
    if (!added) {
        std::snprintf(last_error, sizeof last_error,
                      "%d CUDA graph replays on device %d hold GPU hash results not yet queued", KD_INFLIGHT_MAX,
                      device);
        return -1;
    }
    s.graph_since_sync = true; // Note [Reading results without waiting]: no read-back without waiting
    s.next += n;
    return first;
}

extern "C" void kd_cuda_hash_marks(int64_t *marks)
{
    std::lock_guard<std::mutex> lock(mu);
    for (int d = 0; d < 64; d++)
        marks[d] = devs[d].next;
}

extern "C" int kd_cuda_hash_collected_to(const int64_t *marks)
{
    std::lock_guard<std::mutex> lock(mu);
    for (int d = 0; d < 64; d++)
        if (devs[d].collected < marks[d])
            return 0;
    return 1;
}

extern "C" int kd_cuda_hash_queued(int device, int64_t first, int never)
{
    if (device < 0 || device >= 64 || first < 0)
        return -1;
    std::lock_guard<std::mutex> lock(mu);
    return kd_inflight_done(&devs[device].inflight, first, never);
}

extern "C" int kd_cuda_stream_wait(int device, uint64_t from, uint64_t to)
{
    if (device < 0 || device >= 64 || from == to)
        return 0;
    std::lock_guard<std::mutex> lock(mu);
    KdDeviceGuard g(device);
    static cudaEvent_t events[64];
    cudaError_t e = cudaSuccess;
    if (events[device] == nullptr)
        e = cudaEventCreateWithFlags(&events[device], cudaEventDisableTiming);
    if (e == cudaSuccess)
        e = cudaEventRecord(events[device], reinterpret_cast<cudaStream_t>(from));
    if (e == cudaSuccess)
        e = cudaStreamWaitEvent(reinterpret_cast<cudaStream_t>(to), events[device], 0);
    if (e != cudaSuccess) {
        set_error("ordering streams after kdebug's hash kernels", e);
        return -1;
    }
    return 0;
}

extern "C" int kd_cuda_hash_collect(void)
{
    std::lock_guard<std::mutex> lock(mu);
    int rc = 0;
    for (int d = 0; d < 64; d++)
        if (devs[d].next != devs[d].collected && collect_locked(d) != 0)
            rc = -1;
    return rc;
}

extern "C" int kd_cuda_hash_collect_ready(void)
{
    std::lock_guard<std::mutex> lock(mu);
    int rc = 0;
    for (int d = 0; d < 64; d++) {
        DeviceState &s = devs[d];
        if (s.next == s.collected)
            continue;
        KdDeviceGuard g(d);
        if (s.copy_from >= 0) {
            if (s.copy_needs_sync)
                continue;
            cudaError_t e = cudaEventQuery(s.copy_done);
            if (e == cudaErrorNotReady)
                continue;
            if (e != cudaSuccess) {
                set_error("reading hashes back without waiting", e);
                rc = -1;
                continue; // the next blocking collect synchronizes and reports it
            }
            deliver_copy(d, s);
        }
        if (begin_copy(d, s) != 0)
            rc = -1;
    }
    return rc;
}

extern "C" int64_t kd_cuda_hash_unread(void)
{
    std::lock_guard<std::mutex> lock(mu);
    int64_t n = 0;
    for (int d = 0; d < 64; d++)
        n += devs[d].next - (devs[d].copy_from >= 0 ? devs[d].copy_to : devs[d].collected);
    return n;
}

extern "C" int64_t kd_cuda_hash_outstanding(void)
{
    std::lock_guard<std::mutex> lock(mu);
    int64_t n = 0;
    for (int d = 0; d < 64; d++)
        n += devs[d].next - devs[d].collected;
    return n;
}

extern "C" uint64_t kd_cuda_syncs(void) { return syncs; }

extern "C" const char *kd_cuda_last_error(void) { return last_error; }
