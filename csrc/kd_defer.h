/* kd_defer.h - GPU hashes and output copies held back and launched in batches.
 *
 * Note [Deferred GPU work]
 * Hashing or copying each tensor right after the launch that wrote it costs
 * one kernel launch per tensor (~250 per transformer step).  Instead, while
 * every writer of GPU memory that kdebug can know of is seen (recorded
 * kernels, and aten ops: intercepted by the DebugMode's dispatch mode, or
 * under kernels_only, which pushes none, by the C++ write guard: Note [C++
 * write guard] in kd_write_guard.c, installed from the first entry), the work is queued
 * here with a strong reference to its tensor (so the caching allocator cannot
 * hand the memory to anyone else) and launched as one hash kernel per
 * KD_DEFER_VIEWS distinct tensors and one copy kernel per KD_CUDA_COPY_BATCH,
 * on the stream the tensors were written on.  The queue is flushed, before anything runs, when:
 *   - a recorded launch or an aten op is about to write memory overlapping a
 *     queued tensor (kd_defer_guard, from the launch's written arguments and
 *     from the op schema's mutable / out= arguments);
 *   - a launch or op runs on another stream or device (and that stream is
 *     then ordered after kdebug's work, so a writer there cannot overtake it);
 *   - the batch is full, or more than KD_DEFER_MAX_BYTES are held;
 *   - results are read, a hash / record context or the DebugMode exits,
 *     a CUDA graph or AOTInductor model (unseen writers) is about to run.
 * Under kernels_only the op guard is the C++ one (mode KD_DEFER_GUARDED); the
 * flush points above are the same.  Off under record_all_threads.
 * Writers kdebug cannot see, in either mode: GPU memory written outside the
 * dispatcher and outside Inductor's hooked launcher -- raw CUDA from C
 * extensions that are not torch ops, Triton kernels launched directly (a
 * user's @triton.jit called eagerly), other libraries' cudaMemcpy / NCCL
 * calls, custom ops whose schema hides a mutation, and compiled code run on
 * a thread kdebug does not record.  A queued hash of a tensor they overwrite
 * would hash the later bytes (kdebug cannot detect that cheaply: the write
 * is invisible to it by definition); DebugMode(batch_gpu_work=False) /
 * FlightRecorder(batch_gpu_work=False) hash each tensor right after its
 * kernel for programs that have such writers.
 * Pre-launch hashes of arguments a launch only reads are deferred too (the
 * launch cannot change them) except under check_inputs_unchanged, whose
 * point is to catch launches that do.
 * All of this runs with the GIL held.
 */
#ifndef KD_DEFER_H
#define KD_DEFER_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#include "kd_cuda_copy.h"
#include "kd_cuda_hash.h"

#define KD_DEFER_MAX_BYTES (512ull << 20)
#define KD_DEFER_ENTRIES 64 /* hashes queued, sharing at most KD_DEFER_VIEWS distinct views */
/* Distinct views one flush hashes (one kernel; <= KD_CUDA_BATCH).  A fuller
 * queue is held longer, and while it holds work the C++ write guard checks
 * every op that writes GPU memory (Note [C++ write guard]). */
#define KD_DEFER_VIEWS 16

/* Where a deferred hash's result index goes: called once per entry at flush
 * with the result's global index (>= 0), or -1 and a message on failure. */
typedef void (*kd_defer_sink)(PyObject *owner, uint64_t aux, int w, int device, int64_t index,
                              const char *error);

/* Deferral modes: off; on while a dispatch mode guards aten ops (kd_op_writes.c);
 * on with the C++ write guard installed from the first entry on (kernels_only,
 * Note [C++ write guard] in kd_write_guard.c). */
enum { KD_DEFER_OFF = 0, KD_DEFER_MODE = 1, KD_DEFER_GUARDED = 2 };

/* Sets the deferral mode (KD_DEFER_*; other nonzero values: KD_DEFER_MODE),
 * flushing when it changes; returns the previous one. */
int kd_defer_set(int on);
int kd_defer_enabled(void);

/* Queue a hash of `src` (described by t) with `kinds`.  Returns 1 when queued,
 * 0 when deferral is off (the caller hashes now). */
int kd_defer_hash(PyObject *src, const kd_cuda_tensor *t, int device, uint64_t stream, int kinds,
                  kd_defer_sink sink, PyObject *owner, uint64_t aux, int w);

/* Queue a copy of `src` into `dst` (fresh, dst_like_src: same strides, else
 * contiguous).  Returns 1 when queued, 0 when deferral is off. */
int kd_defer_copy(PyObject *src, const kd_cuda_tensor *t, PyObject *dst, uint64_t dst_ptr,
                  int dst_like_src, int device, uint64_t stream);

/* A copy of tensor o (metadata m) as clone() would make it: queued here when
 * deferral is on and o is a CUDA tensor (on `stream`, 0: the current one),
 * else cloned now.  New reference, or NULL (kd_shim_last_error()). */
struct kd_tensor_meta;
PyObject *kd_defer_clone(PyObject *o, const struct kd_tensor_meta *m, uint64_t stream);

/* Before work on (device, stream) that writes bytes [lo, hi) (lo == hi: no
 * write): flushes the queue when it would be unsafe to keep it. */
void kd_defer_guard(int device, uint64_t stream, uint64_t lo, uint64_t hi);

/* kd_defer_guard for a tensor object about to be written on `stream` (0:
 * its device's current stream); flushes when it cannot be bounded. */
void kd_defer_guard_tensor(PyObject *tensor, uint64_t stream);

/* Launches everything queued.  Returns 0, or -1 if some of it failed (counted). */
int kd_defer_flush(void);

/* kd_defer_flush at a quiet point (a flush asked for from Python, a
 * recording's end): the C++ write guard is paused while the queue stays
 * empty (Paused between windows, in Note [C++ write guard]). */
int kd_defer_flush_quiet(void);

/* Note [Reading back before the ring fills]
 * GPU hash results wait in kdebug's device ring (KD_CUDA_CAPACITY results)
 * until something reads them back: a read of the records, a compare.  A
 * recording nobody reads (a DebugMode made per step and dropped, or one long
 * recording read at its end) fills the ring, and the next hash launch then
 * synchronized the device to make room (make_room in kd_cuda_hash.cu): about
 * every 55 steps of the GPU transformer step under kernels_only +
 * log_tensor_hashes().  So the end of a recording and the end of each
 * outermost compiled graph call begin a read-back without waiting
 * (kd_cuda_hash_collect_ready, Note [Reading results without waiting]) once
 * KD_READ_BACK_AT results wait unread, as the flight recorder does at each
 * step: the device is synchronized only when it runs a whole ring behind the
 * host, or when the read-back cannot be done without waiting (a CUDA graph
 * replay reserved results since the last synchronization). */
#define KD_READ_BACK_AT 2048

/* A read-back without waiting when KD_READ_BACK_AT GPU results wait unread
 * (GIL; a failure leaves them for a blocking collect). */
void kd_defer_read_back_early(void);

/* Is any hash or copy queued and not yet launched? */
int kd_defer_pending(void);

/* The byte range [lo, hi) a strided CUDA view covers (lo == hi when empty). */
void kd_defer_extent(const kd_cuda_tensor *t, uint64_t *lo, uint64_t *hi);

typedef struct kd_defer_stats {
    uint64_t queued_hashes, queued_copies; /* entries ever queued */
    uint64_t queued_bytes;                 /* bytes they cover */
    uint64_t shared_hashes;                /* hashes of a view identical to one queued: one result */
    uint64_t flushes, hash_launches, copy_launches;
    uint64_t hazard_flushes, stream_flushes; /* flushes forced by a writer / another stream */
    uint64_t copy_failures, hash_failures;
    uint64_t guard_failures; /* the C++ write guard could not be installed: done at once */
    uint64_t pending;
} kd_defer_stats;

void kd_defer_get_stats(kd_defer_stats *s);
const char *kd_defer_last_error(void);

#endif
