// kd_cuda_util.cuh - device and host helpers shared by kdebug's CUDA files
// (kd_cuda_hash.cu, kd_cuda_copy.cu).  CUDA runtime only.
#ifndef KD_CUDA_UTIL_CUH
#define KD_CUDA_UTIL_CUH

#include <cuda_runtime.h>
#include <stdint.h>

#include "kd_cuda_hash.h" // kd_cuda_tensor

// Offset in elements of logical element e of a strided view.
__device__ __forceinline__ int64_t kd_elem_offset(const kd_cuda_tensor &T, int64_t e)
{
    int64_t off = 0;
    if (T.numel <= 0xffffffffll) { // 32-bit division: several times cheaper on the GPU
        uint32_t u = (uint32_t)e;
        for (int d = T.ndim - 1; d >= 0; --d) {
            uint32_t s = (uint32_t)T.sizes[d];
            off += (int64_t)(u % s) * T.strides[d];
            u /= s;
        }
        return off;
    }
    for (int d = T.ndim - 1; d >= 0; --d) {
        int64_t s = T.sizes[d];
        off += (e % s) * T.strides[d];
        e /= s;
    }
    return off;
}

// Makes device d current for its scope, restoring the previous one.
struct KdDeviceGuard {
    int prev = -1;
    explicit KdDeviceGuard(int d)
    {
        cudaGetDevice(&prev);
        if (prev != d)
            cudaSetDevice(d);
        else
            prev = -1;
    }
    ~KdDeviceGuard()
    {
        if (prev >= 0)
            cudaSetDevice(prev);
    }
};

#endif
