/* kd_cuda_hash.h - hashing CUDA tensors on the GPU without stalling it.
 *
 * Note [Hashing on the GPU]
 * kd_cuda_hash_enqueue queues one hash kernel for up to KD_CUDA_BATCH tensors
 * on the stream of the launch they belong to, right after it; results land in
 * a device ring of kd_cuda_result.  Nothing synchronizes until the results
 * are needed: kd_cuda_hash_collect (when the user reads results, or when the
 * ring is full) synchronizes the device once and hands every new result to
 * whoever registered for its global index (Note [GPU hash results] in
 * kd_results.h); nothing is kept on the host after that.  Definitions are
 * those of kd_hash.h: bitwise and hash_tensor sums are order-free (64-bit
 * integer add / xor atomics); the norm's float64 sum, and the stats hash's
 * signed float64 sum, use a fixed split (blocks, threads, tree) that depends
 * on the tensor's size only, so they are the same on every run; the stats
 * hash's absmax is an atomic max (order-free), its integer sum an integer add.
 * kd_cuda_stub.c provides the same API for builds without CUDA.
 */
#ifndef KD_CUDA_HASH_H
#define KD_CUDA_HASH_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Tensors one kd_cuda_hash_enqueue takes: one hash kernel whose parameter
 * block holds them all (160 bytes a tensor, about 21 KB for 128: within the
 * 32 KB of kernel parameters CUDA 12.1 allows; a toolkit before 12.1 launches
 * them 16 at a time, Note [One hash kernel per batch] in kd_cuda_hash.cu). */
#define KD_CUDA_BATCH 128
#define KD_CUDA_CAPACITY 8192 /* results in flight per device */
#define KD_CUDA_MAX_DIMS 8

typedef struct kd_cuda_tensor {
    uint64_t data; /* device address of logical element 0 */
    int32_t scalar_type;
    int32_t itemsize;
    int32_t ndim;
    int32_t contiguous;
    int64_t numel;
    int64_t sizes[KD_CUDA_MAX_DIMS];
    int64_t strides[KD_CUDA_MAX_DIMS]; /* elements */
} kd_cuda_tensor;

typedef struct kd_cuda_result {
    uint64_t S;      /* bitwise sum; kd_hash_finish(S, nbytes) is the hash */
    uint64_t nbytes;
    double l1;
    uint64_t nan, posinf, neginf;
    uint64_t xor64;
    uint32_t ticket; /* blocks done (device side) */
    uint32_t unsupported; /* KD_CUDA_NOT_COMPUTED: its writer never ran (Note [Results in flight]) */
    double sum;      /* the stats hash (Note [The stats hash] in kd_hash.h) */
    double absmax;
    uint64_t isum;   /* device side: integer sum (wrapping) */
    uint64_t amax;   /* device side: absmax, as double bits (floats) or an integer */
} kd_cuda_result;

/* kd_cuda_result.unsupported of a result nothing computed: the CUDA graph
 * replay that was to write it raised before it was queued (Note [Results in
 * flight] in kd_inflight.h).  Its receiver records no hash. */
#define KD_CUDA_NOT_COMPUTED 2u

/* 1 when this build hashes on CUDA devices. */
int kd_cuda_available(void);

/* Queues the hashes (kd_hash_kind mask) of n <= KD_CUDA_BATCH tensors on
 * `stream` (a cudaStream_t) of `device`.  Returns the global index of the
 * first result (results are first .. first + n - 1), or -1 on failure with
 * kd_cuda_last_error() set. */
int64_t kd_cuda_hash_enqueue(int device, uint64_t stream, int kinds, const kd_cuda_tensor *t, int n);

/* Note [CUDA graph replays] (kd_graph.c): captures the hash kernel for n
 * tensors into the CUDA graph being captured on `stream`; result i goes to
 * global index *dev_base + k0 + i, *dev_base read on the device when the
 * graph replays.  Norm / stats partial sums use the graph's own buffer
 * (partials[*pnext ...], at most pcap; *pnext advances).  Returns 0, -1 on
 * failure, -2 when the partials buffer is full (kd_cuda_last_error()). */
int kd_cuda_hash_enqueue_graph(int device, uint64_t stream, int kinds, const kd_cuda_tensor *t, int n,
                               const int64_t *dev_base, int64_t k0, double *partials, int64_t pcap,
                               int64_t *pnext);

/* Allocates `device`'s result ring and partials if not yet done: before a
 * CUDA graph capture (cudaMalloc / cudaMemset inside one would break it).
 * Returns 0, or -1 (kd_cuda_last_error()). */
int kd_cuda_hash_prepare(int device);

/* Reserves n consecutive global result indices on `device` for one replay
 * (reading results back first when the ring has no room: one
 * synchronization).  Returns the first, or -1.  The reservation is held
 * (collects stop before it) until kd_cuda_hash_queued (Note [Results in
 * flight] in kd_inflight.h). */
int64_t kd_cuda_hash_reserve(int device, int64_t n);

/* The work writing the reservation that starts at `first` is queued
 * (never=0), or will never be (never=1: its results are delivered as not
 * computed).  Returns 0, or -1 when no such reservation is held. */
int kd_cuda_hash_queued(int device, int64_t first, int never);

/* marks[d] (64 of them) = the results taken so far on device d. */
void kd_cuda_hash_marks(int64_t *marks);

/* 1 when every device has collected every result before its mark. */
int kd_cuda_hash_collected_to(const int64_t *marks);

/* Orders stream `to` after the work queued so far on stream `from` (an event).
 * Returns 0, or -1 on failure. */
int kd_cuda_stream_wait(int device, uint64_t from, uint64_t to);

/* Synchronizes each device with results in flight and hands them to
 * kd_results_deliver, in index order.  Returns 0, or -1 on failure. */
int kd_cuda_hash_collect(void);

/* Note [Reading results without waiting] (kd_cuda_hash.cu): never
 * synchronizes.  Delivers the results of a read-back begun by an earlier call
 * once it has landed, then begins one for every result queued since (none
 * once a CUDA graph replay reserved results since the device was last
 * synchronized).  Returns 0, or -1 on a CUDA error
 * (kd_cuda_last_error(); the results wait for kd_cuda_hash_collect). */
int kd_cuda_hash_collect_ready(void);

/* Results queued and not yet in a read-back (kd_cuda_hash_collect_ready's),
 * on all devices. */
int64_t kd_cuda_hash_unread(void);

/* Results queued but not yet collected, on all devices. */
int64_t kd_cuda_hash_outstanding(void);

/* Device synchronizations kdebug has made (for tests and reports). */
uint64_t kd_cuda_syncs(void);

const char *kd_cuda_last_error(void);

#ifdef __cplusplus
}
#endif

#endif
