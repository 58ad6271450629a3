/* kd_hash_py.h - hashing tensors from Python (kd_hash_py.c): HashValues and
 * PendingHash, shared with the pytree walks (kd_tree.c) and the launch path. */
#ifndef KD_HASH_PY_H
#define KD_HASH_PY_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#include "kd_cuda_hash.h" /* kd_cuda_result */

/* _C.HashValues (Note [HashValues] in kd_hash_py.c). */
extern PyTypeObject *kd_HashValuesType;

/* A new HashValues of these fields; NULL with an exception on failure. */
PyObject *kd_hash_values(uint64_t bitwise, double l1, uint64_t nan, uint64_t posinf, uint64_t neginf,
                         uint64_t x, int unsupported, double sum, double absmax);

/* A hash still on the GPU (an aten-op record's leaf, or hash_async's result).
 * handle is the result's index once queued, KD_PENDING_DEFERRED until the
 * deferred queue is flushed (Note [Deferred GPU work]), KD_PENDING_FAILED if
 * queuing failed; the result is delivered into it when the device's results
 * are collected (Note [GPU hash results]). */
typedef struct {
    PyObject_HEAD
    long long handle;
    int device;
    int spec;
    int have;
    kd_cuda_result res;
} kd_pending_hash;

#define KD_PENDING_DEFERRED (-1)
#define KD_PENDING_FAILED (-2)

extern PyTypeObject kd_PendingHashType;

/* A new PendingHash for a hash of `spec`, waiting for the deferred queue;
 * NULL with an exception on failure. */
kd_pending_hash *kd_pending_new(int spec);

/* The deferred queue's sink for a PendingHash (owner): it now waits for GPU
 * result `index` of `device` (< 0: queuing failed). */
void kd_pending_sink(PyObject *owner, uint64_t aux, int w, int device, int64_t index, const char *error);

/* The HashValues of p (flushing and collecting when needed: one synchronization),
 * Py_None if queuing it failed, NULL with an error if its result is missing. */
PyObject *kd_pending_fetch(kd_pending_hash *p);

/* hash_async(t, kinds, stream) -> HashValues now (CPU tensors), a PendingHash,
 * or NotImplemented; NULL with an exception on failure (m unused). */
PyObject *kd_mod_hash_async(PyObject *m, PyObject *args);

/* 1 when a hash queued on `stream` now would be captured into a CUDA graph
 * (this thread's kd_tls_graph, or the stream capturing one kdebug did not
 * see): such tensors are not hashed (their values do not exist yet). */
int kd_hash_capturing(uint64_t stream);

/* Tensors left unhashed because their stream was capturing a CUDA graph. */
extern uint64_t kd_capture_unhashed;

/* Adds HashValues, PendingHash and the hash functions to module m; -1 with an
 * exception on failure. */
int kd_hash_py_module_init(PyObject *m);

#endif
