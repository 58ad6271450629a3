/* kd_cuda_copy.h - copies of CUDA tensors for record_outputs, many per launch.
 *
 * kd_cuda_copy_enqueue queues one kernel that copies up to KD_CUDA_COPY_BATCH
 * tensors (any strides) into fresh destinations, on the stream of the launch
 * that wrote them.  A destination either has the source's strides (a dense
 * source: torch's empty_like) or is contiguous.  kd_cuda_stub.c provides the
 * same API for builds without CUDA.
 */
#ifndef KD_CUDA_COPY_H
#define KD_CUDA_COPY_H

#include "kd_cuda_hash.h" /* kd_cuda_tensor */

#define KD_CUDA_COPY_BATCH 16 /* copies one kernel takes (its parameter block within 4 KB) */

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kd_cuda_copy {
    kd_cuda_tensor src;
    uint64_t dst;          /* device address of the destination's element 0 */
    int32_t dst_like_src;  /* 1: same strides as src; 0: contiguous */
    int32_t pad;
} kd_cuda_copy;

/* Returns 0, or -1 with kd_cuda_last_copy_error() set. */
int kd_cuda_copy_enqueue(int device, uint64_t stream, const kd_cuda_copy *c, int n);

const char *kd_cuda_last_copy_error(void);

#ifdef __cplusplus
}
#endif

#endif
