/* kd_cuda_describe.h - a tensor's metadata as the CUDA kernels take it
 * (kd_cuda_describe.c). */
#ifndef KD_CUDA_DESCRIBE_H
#define KD_CUDA_DESCRIBE_H

#include "kd_cuda_hash.h" /* kd_cuda_tensor */
#include "kd_shim.h"      /* kd_tensor_meta */

/* Describes a tensor for the CUDA hash kernel.  Returns 1 when this build can
 * hash it there (a CUDA tensor of a known dtype, at most KD_CUDA_MAX_DIMS
 * dims), else 0 (the caller uses another path). */
int kd_cuda_describe(const kd_tensor_meta *m, kd_cuda_tensor *t);

#endif
