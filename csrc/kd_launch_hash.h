/* kd_launch_hash.h - hashing a launch's tensors (kd_launch_hash.c), used by
 * the launch path (kd_launch.c). */
#ifndef KD_LAUNCH_HASH_H
#define KD_LAUNCH_HASH_H

#include "kd_cuda_hash.h"
#include "kd_recorder.h"
#include "kd_shim.h" /* kd_tensor_meta */

/* Calls kd_hash_tensor made into Python code (the slow and custom hashers)
 * on this thread: a caller holding tensor metadata across hashes knows by it
 * whether Python code ran (Note [Records made in one pass]). */
extern _Thread_local uint64_t kd_tls_hash_python_calls;
extern PyObject *kd_slow_hasher; /* slow_hasher(tensor, kinds) -> HashValues, for non-CPU and quantized tensors */
extern PyObject *kd_custom_hasher; /* custom(recorder, launch_index, arg_index, when, tensor) */

/* The CUDA tensors one launch hashes before or after it runs: handed to the
 * deferred queue or launched as hash kernels of up to KD_CUDA_BATCH tensors
 * (Note [Hashing on the GPU]). */
#define KD_GPU_BATCH_MAX 128
typedef struct kd_gpu_batch {
    kd_cuda_tensor t[KD_GPU_BATCH_MAX];
    PyObject *obj[KD_GPU_BATCH_MAX]; /* borrowed: the launch's arguments */
    uint64_t pos[KD_GPU_BATCH_MAX];  /* ring ticket of the hash record (relative to the launch before it is reserved) */
    int w[KD_GPU_BATCH_MAX];
    int device[KD_GPU_BATCH_MAX];
    int kinds[KD_GPU_BATCH_MAX];
    int n;
    uint64_t stream;
} kd_gpu_batch;

/* Once both sides of a checked read-only argument's hash are known: whether
 * the launch changed its bytes (check_inputs_unchanged); counted on r. */
void kd_note_readonly_change(kd_recorder *r, kd_hash_rec *h);

/* Side w of the hash record at ring ticket `pos` waits for GPU result `index`
 * on `device` (index < 0: queuing failed, `error` says why; counted on r). */
void kd_await_gpu_result(kd_recorder *r, uint64_t pos, int w, int device, int64_t index, const char *error);

/* Hash kernels for the batch now, on its stream: one per run of up to
 * KD_CUDA_BATCH entries of one device and kind; entry i's hash record is at
 * ring ticket base + pos[i].  Empties the batch. */
/* Hash kernels launched by kd_batch_flush (not deferred): defer_stats()'s direct_hash_launches.  GIL. */
extern uint64_t kd_direct_hash_launches;

void kd_batch_flush(kd_recorder *r, kd_gpu_batch *b, uint64_t base);

/* Hands a batch to the deferred queue (Note [Deferred GPU work]); what the
 * queue refuses is launched right away.  Empties the batch. */
void kd_batch_defer(kd_recorder *r, kd_gpu_batch *b, uint64_t base);

/* Hashes tensor object o with `kinds` into slot `w` (0 pre, 1 post) of h.
 * CUDA tensors go to the batch b (queued on `stream`), CPU tensors are hashed
 * here, anything else through the slow Python path.  `known`: o's metadata
 * as kd_shim_tensor_meta read it since o last changed (no Python code ran
 * in between that could change it), or NULL to read it here.  Never raises:
 * failures are counted on r. */
void kd_hash_tensor(kd_recorder *r, PyObject *o, int kinds, kd_hash_rec *h, int w,
                    uint64_t launch_index, Py_ssize_t arg, kd_gpu_batch *b, uint64_t stream,
                    uint64_t pos, const kd_tensor_meta *known);

#endif
