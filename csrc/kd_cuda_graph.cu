// kd_cuda_graph.cu - the GPU side of recording CUDA-graph replays (Note [CUDA
// graph replays] in kd_graph.c): each graph's device buffer (the replay's
// result base and its norm partials), the one-thread kernel that sets the
// base before a replay, and counting what a graph being captured holds.
// CUDA runtime only, no libtorch headers.
#include "kd_cuda_graph.h"
#include "kd_cuda_util.cuh"

#include <cuda_runtime.h>

#include <cstdio>
#include <new>

namespace {

char last_error[256] = "";

// Every failing call's error is also cleared from the runtime's last-error
// state: torch checks cudaGetLastError() after its own calls and would
// report ours as its failure.
void set_error(const char *what, cudaError_t e)
{
    cudaGetLastError();
    std::snprintf(last_error, sizeof last_error, "%s: %s (%d)", what, cudaGetErrorString(e), (int)e);
}

__global__ void set_base_kernel(long long *base, long long value) { *base = value; }

} // namespace

extern "C" void *kd_cuda_graph_alloc(int device, int64_t partials)
{
    KdDeviceGuard g(device);
    void *p = nullptr;
    cudaError_t e = cudaMalloc(&p, sizeof(int64_t) * 2 + sizeof(double) * (size_t)partials);
    if (e == cudaSuccess)
        e = cudaMemset(p, 0, sizeof(int64_t) * 2);
    if (e != cudaSuccess) {
        set_error("allocating a CUDA graph's hash buffer", e);
        return nullptr;
    }
    return p;
}

extern "C" void kd_cuda_graph_free(int device, void *mem)
{
    if (mem == nullptr)
        return;
    KdDeviceGuard g(device);
    cudaFree(mem);
}

extern "C" int kd_cuda_graph_set_base(int device, uint64_t stream, int64_t *dev_base, int64_t base)
{
    KdDeviceGuard g(device);
    set_base_kernel<<<1, 1, 0, reinterpret_cast<cudaStream_t>(stream)>>>(reinterpret_cast<long long *>(dev_base),
                                                                        (long long)base);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) {
        set_error("setting a CUDA graph replay's hash slots", e);
        return -1;
    }
    return 0;
}

extern "C" int kd_cuda_stream_capturing(uint64_t stream)
{
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(reinterpret_cast<cudaStream_t>(stream), &st) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return st == cudaStreamCaptureStatusActive;
}

extern "C" int kd_cuda_graph_count_nodes(uint64_t stream, int64_t *kernels, int64_t *others)
{
    *kernels = *others = 0;
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    unsigned long long id = 0;
    cudaGraph_t graph = nullptr;
    cudaError_t e = cudaStreamGetCaptureInfo(reinterpret_cast<cudaStream_t>(stream), &st, &id, &graph);
    if (e != cudaSuccess || st != cudaStreamCaptureStatusActive || graph == nullptr) {
        cudaGetLastError();
        if (e != cudaSuccess)
            set_error("reading the CUDA graph being captured", e);
        else
            std::snprintf(last_error, sizeof last_error, "the stream is not capturing a CUDA graph");
        return -1;
    }
    size_t n = 0;
    e = cudaGraphGetNodes(graph, nullptr, &n);
    if (e != cudaSuccess) {
        set_error("counting a CUDA graph's nodes", e);
        return -1;
    }
    cudaGraphNode_t *nodes = new (std::nothrow) cudaGraphNode_t[n ? n : 1];
    if (nodes == nullptr)
        return -1;
    e = cudaGraphGetNodes(graph, nodes, &n);
    for (size_t i = 0; e == cudaSuccess && i < n; i++) {
        cudaGraphNodeType t;
        if (cudaGraphNodeGetType(nodes[i], &t) != cudaSuccess) {
            cudaGetLastError();
            (*others)++;
            continue;
        }
        if (t == cudaGraphNodeTypeKernel)
            (*kernels)++;
        else if (t != cudaGraphNodeTypeEmpty && t != cudaGraphNodeTypeWaitEvent && t != cudaGraphNodeTypeEventRecord)
            (*others)++;
    }
    delete[] nodes;
    if (e != cudaSuccess) {
        set_error("listing a CUDA graph's nodes", e);
        return -1;
    }
    return 0;
}

extern "C" const char *kd_cuda_graph_last_error(void) { return last_error; }
