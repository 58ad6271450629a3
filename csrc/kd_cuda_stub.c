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
