// kd_cuda_copy.cu - batched tensor copies for record_outputs (kd_cuda_copy.h).
// No libtorch headers here: the CUDA runtime only.
#include "kd_cuda_copy.h"
#include "kd_cuda_util.cuh"

#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>

namespace {

constexpr int kThreads = 256;
constexpr int kMaxBlocks = 2048; // per tensor

template <int CAP> struct CopyBatchT {
    kd_cuda_copy c[CAP];
    int first_block[CAP + 1];
    int n;
};

char last_error[256] = "";

template <class W> __device__ void copy_elems(const kd_cuda_copy &C, uint64_t start, uint64_t stride)
{
    const kd_cuda_tensor &T = C.src;
    const W *src = reinterpret_cast<const W *>(T.data);
    W *dst = reinterpret_cast<W *>(C.dst);
    for (uint64_t e = start; e < (uint64_t)T.numel; e += stride) {
        int64_t so = kd_elem_offset(T, (int64_t)e);
        dst[C.dst_like_src ? so : (int64_t)e] = src[so];
    }
}

template <int CAP> __global__ void __launch_bounds__(kThreads) copy_kernel(const __grid_constant__ CopyBatchT<CAP> b)
{
    int ti = 0;
    while (ti + 1 < b.n && (int)blockIdx.x >= b.first_block[ti + 1])
        ti++;
    const kd_cuda_copy &C = b.c[ti];
    const kd_cuda_tensor &T = C.src;
    const uint64_t lb = blockIdx.x - b.first_block[ti];
    const uint64_t nb = b.first_block[ti + 1] - b.first_block[ti];
    const uint64_t stride = nb * kThreads, start = lb * kThreads + threadIdx.x;
    if (T.contiguous) {
        // a flat byte range: 16-byte words where both ends are aligned
        const uint64_t nbytes = (uint64_t)T.numel * (uint64_t)T.itemsize;
        const uint8_t *s8 = reinterpret_cast<const uint8_t *>(T.data);
        uint8_t *d8 = reinterpret_cast<uint8_t *>(C.dst);
        uint64_t done = 0;
        if (((T.data | C.dst) & 15) == 0) {
            const uint64_t nw = nbytes / 16;
            const uint4 *s = reinterpret_cast<const uint4 *>(s8);
            uint4 *d = reinterpret_cast<uint4 *>(d8);
            for (uint64_t i = start; i < nw; i += stride)
                d[i] = s[i];
            done = nw * 16;
        }
        for (uint64_t i = done + start; i < nbytes; i += stride)
            d8[i] = s8[i];
        return;
    }
    switch (T.itemsize) {
    case 1: copy_elems<uint8_t>(C, start, stride); break;
    case 2: copy_elems<uint16_t>(C, start, stride); break;
    case 4: copy_elems<uint32_t>(C, start, stride); break;
    case 8: copy_elems<uint64_t>(C, start, stride); break;
    case 16: copy_elems<uint4>(C, start, stride); break;
    default: break; // rejected on the host
    }
}

template <int CAP> void launch(const kd_cuda_copy *c, int n, const int *first_block, cudaStream_t st)
{
    CopyBatchT<CAP> b;
    std::memset(&b, 0, sizeof b);
    std::memcpy(b.c, c, sizeof(kd_cuda_copy) * n);
    for (int i = 0; i <= CAP; i++)
        b.first_block[i] = first_block[i <= n ? i : n];
    b.n = n;
    copy_kernel<CAP><<<first_block[n], kThreads, 0, st>>>(b);
}

} // namespace

extern "C" int kd_cuda_copy_enqueue(int device, uint64_t stream, const kd_cuda_copy *c, int n)
{
    if (n <= 0 || n > KD_CUDA_COPY_BATCH) {
        std::snprintf(last_error, sizeof last_error, "bad copy batch (%d tensors)", n);
        return -1;
    }
    int first_block[KD_CUDA_COPY_BATCH + 1];
    int blocks = 0;
    for (int i = 0; i < n; i++) {
        int isz = c[i].src.itemsize;
        if (!c[i].src.contiguous && isz != 1 && isz != 2 && isz != 4 && isz != 8 && isz != 16) {
            std::snprintf(last_error, sizeof last_error, "cannot copy elements of %d bytes", isz);
            return -1;
        }
        uint64_t work = c[i].src.contiguous ? (uint64_t)c[i].src.numel * isz / 16 : (uint64_t)c[i].src.numel;
        uint64_t want = (work + kThreads * 4 - 1) / (kThreads * 4);
        first_block[i] = blocks;
        blocks += want < 1 ? 1 : want > kMaxBlocks ? kMaxBlocks : (int)want;
    }
    first_block[n] = blocks;
    KdDeviceGuard g(device);
    cudaStream_t st = reinterpret_cast<cudaStream_t>(stream);
    if (n == 1)
        launch<1>(c, n, first_block, st);
    else if (n <= 4)
        launch<4>(c, n, first_block, st);
    else
        launch<KD_CUDA_COPY_BATCH>(c, n, first_block, st);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) {
        std::snprintf(last_error, sizeof last_error, "launching kdebug's copy kernel: %s (%d)",
                      cudaGetErrorString(e), (int)e);
        return -1;
    }
    return 0;
}

extern "C" const char *kd_cuda_last_copy_error(void) { return last_error; }
