/* kd_cuda_graph.h - CUDA runtime calls for recording CUDA-graph replays
 * (Note [CUDA graph replays] in kd_graph.c); kd_cuda_stub.c answers them in
 * builds without CUDA. */
#ifndef KD_CUDA_GRAPH_H
#define KD_CUDA_GRAPH_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* A graph's device buffer: int64 base (the replay's first result index),
 * int64 spare, then `partials` doubles.  NULL on failure. */
void *kd_cuda_graph_alloc(int device, int64_t partials);
void kd_cuda_graph_free(int device, void *mem);

/* Queues *dev_base = base on `stream` (one tiny kernel, before the replay). */
int kd_cuda_graph_set_base(int device, uint64_t stream, int64_t *dev_base, int64_t base);

/* 1 when `stream` is capturing a CUDA graph. */
int kd_cuda_stream_capturing(uint64_t stream);

/* Kernel nodes and other work nodes (copies, memsets, host and child-graph
 * nodes; not events or empty nodes) of the graph being captured on `stream`.
 * Returns 0, or -1 (kd_cuda_graph_last_error()). */
int kd_cuda_graph_count_nodes(uint64_t stream, int64_t *kernels, int64_t *others);

const char *kd_cuda_graph_last_error(void);

#ifdef __cplusplus
}
#endif

#endif
