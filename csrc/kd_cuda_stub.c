/* kd_cuda_stub.c - kd_cuda_hash.h for builds without CUDA: nothing is available. */
#include <stddef.h>

#include "kd_cuda_hash.h"

int kd_cuda_available(void) { return 0; }

int64_t kd_cuda_hash_enqueue(int device, uint64_t stream, int kinds, const kd_cuda_tensor *t, int n)
{
    (void)device, (void)stream, (void)kinds, (void)t, (void)n;
    return -1;
}

int kd_cuda_hash_collect(void) { return 0; }

int kd_cuda_hash_collect_ready(void) { return 0; }

int64_t kd_cuda_hash_unread(void) { return 0; }

int kd_cuda_stream_wait(int device, uint64_t from, uint64_t to)
{
    (void)device, (void)from, (void)to;
    return -1;
}

int64_t kd_cuda_hash_outstanding(void) { return 0; }

uint64_t kd_cuda_syncs(void) { return 0; }

const char *kd_cuda_last_error(void) { return "kdebug was built without CUDA"; }

#include "kd_cuda_copy.h"

int kd_cuda_copy_enqueue(int device, uint64_t stream, const kd_cuda_copy *c, int n)
{
    (void)device, (void)stream, (void)c, (void)n;
    return -1;
}

const char *kd_cuda_last_copy_error(void) { return "kdebug was built without CUDA"; }

#include "kd_cuda_graph.h"

int kd_cuda_hash_enqueue_graph(int device, uint64_t stream, int kinds, const kd_cuda_tensor *t, int n,
                               const int64_t *dev_base, int64_t k0, double *partials, int64_t pcap,
                               int64_t *pnext)
{
    (void)device, (void)stream, (void)kinds, (void)t, (void)n, (void)dev_base, (void)k0;
    (void)partials, (void)pcap, (void)pnext;
    return -1;
}

int kd_cuda_hash_prepare(int device)
{
    (void)device;
    return -1;
}

int64_t kd_cuda_hash_reserve(int device, int64_t n)
{
    (void)device, (void)n;
    return -1;
}

int kd_cuda_hash_queued(int device, int64_t first, int never)
{
    (void)device, (void)first, (void)never;
    return -1;
}

void kd_cuda_hash_marks(int64_t *marks)
{
    for (int d = 0; d < 64; d++)
        marks[d] = 0;
}

int kd_cuda_hash_collected_to(const int64_t *marks)
{
    (void)marks;
    return 1;
}

void *kd_cuda_graph_alloc(int device, int64_t partials)
{
    (void)device, (void)partials;
    return NULL;
}

void kd_cuda_graph_free(int device, void *mem) { (void)device, (void)mem; }

int kd_cuda_graph_set_base(int device, uint64_t stream, int64_t *dev_base, int64_t base)
{
    (void)device, (void)stream, (void)dev_base, (void)base;
    return -1;
}

int kd_cuda_stream_capturing(uint64_t stream)
{
    (void)stream;
    return 0;
}

int kd_cuda_graph_count_nodes(uint64_t stream, int64_t *kernels, int64_t *others)
{
    (void)stream;
    *kernels = *others = 0;
    return -1;
}

const char *kd_cuda_graph_last_error(void) { return "kdebug was built without CUDA"; }
