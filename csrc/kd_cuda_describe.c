/* kd_cuda_describe.c - a tensor's metadata as the CUDA hash and copy kernels
 * take it (kd_cuda_tensor), with its dimensions folded where memory allows. */
#include <string.h>

#include "kd_cuda_describe.h"
#include "kd_hash.h"
#include "kd_record.h"

int kd_cuda_describe(const kd_tensor_meta *m, kd_cuda_tensor *t)
{
    int itemsize = kd_itemsize(m->dtype);
    if (m->device_type != KD_DEV_CUDA || m->ndim > KD_CUDA_MAX_DIMS || itemsize == 0 ||
        !kd_meta_in_storage(m, itemsize) || !kd_cuda_available())
        return 0; /* (a view outside its storage: the kernels would read memory not its own) */
    memset(t, 0, sizeof *t);
    t->data = m->data_ptr;
    t->scalar_type = m->dtype;
    t->itemsize = itemsize;
    t->ndim = m->ndim;
    t->numel = 1;
    t->contiguous = 1;
    int64_t expect = 1;
    for (int d = m->ndim - 1; d >= 0; d--) {
        t->sizes[d] = m->sizes[d];
        t->strides[d] = m->strides[d];
        t->numel *= m->sizes[d];
        if (m->sizes[d] != 1 && m->strides[d] != expect)
            t->contiguous = 0;
        expect *= m->sizes[d];
    }
    /* Fewer dimensions, same element order: drop size-1 dimensions and merge
     * a dimension into the next when they step through memory as one (the
     * GPU pays a division per dimension per element of a strided view). */
    if (!t->contiguous && t->numel > 0) {
        int n = 0;
        for (int d = 0; d < t->ndim; d++) {
            if (t->sizes[d] == 1)
                continue;
            if (n > 0 && t->strides[n - 1] == t->strides[d] * t->sizes[d]) {
                t->sizes[n - 1] *= t->sizes[d];
                t->strides[n - 1] = t->strides[d];
                continue;
            }
            t->sizes[n] = t->sizes[d];
            t->strides[n] = t->strides[d];
            n++;
        }
        for (int d = n; d < t->ndim; d++)
            t->sizes[d] = 0, t->strides[d] = 0;
        t->ndim = n;
    }
    return 1;
}
