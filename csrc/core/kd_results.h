/* kd_results.h - where the results of queued GPU hashes go.
 *
 * Note [GPU hash results]
 * A queued GPU hash has a global index per device (kd_cuda_hash_enqueue).
 * Whoever keeps its value (a launch record of a Recorder, a PendingHash leaf
 * of an aten-op record) registers with kd_results_expect; when the device's
 * results are collected (kd_cuda_hash_collect: one synchronization), each is
 * handed to its registrant by kd_results_deliver and the slot is free again.
 * Nothing is kept after delivery, so memory is bounded by the results in
 * flight (KD_CUDA_CAPACITY per device), however long the process records.
 * A registrant that dies first says so: a direct one by kd_results_forget
 * (it knows its index), one with many results in flight (a Recorder) through
 * an anchor (kd_result_anchor_drop: O(1), the anchor outlives it until its
 * last result arrives).  A result collected before anyone registered for it
 * waits in its slot and is handed over at registration.
 * No Python here: owners are opaque pointers; callers hold the GIL (kdebug
 * serializes every call).
 */
#ifndef KD_RESULTS_H
#define KD_RESULTS_H

#include <stdint.h>

#include "kd_cuda_hash.h" /* kd_cuda_result, KD_CUDA_CAPACITY */

#ifdef __cplusplus
extern "C" {
#endif

#define KD_RESULTS_DEVICES 64

/* Receives the result of `index` (w and aux as registered). */
typedef void (*kd_result_fn)(void *owner, uint64_t aux, int w, const kd_cuda_result *res);

/* Many results, one owner that may die before they arrive. */
typedef struct kd_result_anchor {
    void *owner;   /* NULL once dropped */
    uint64_t refs; /* results registered and not yet delivered or forgotten */
} kd_result_anchor;

kd_result_anchor *kd_result_anchor_new(void *owner);
/* The owner is gone: results still to come are discarded; the anchor is
 * freed when none is left. */
void kd_result_anchor_drop(kd_result_anchor *a);

/* Registers fn(owner, aux, w, result) for `index` on `device`, either with a
 * direct owner (anchor NULL) or through an anchor (owner NULL).  Delivers at
 * once if the result is already there.  Returns 0, or -1 (bad device, or the
 * slot holds another index: more than KD_CUDA_CAPACITY results in flight). */
int kd_results_expect(int device, int64_t index, kd_result_fn fn, void *owner, kd_result_anchor *anchor,
                      uint64_t aux, int w);

/* A direct owner of `index` is gone: its result, if it comes, is dropped. */
void kd_results_forget(int device, int64_t index, const void *owner);

/* Called by kd_cuda_hash_collect for every collected result, in index order. */
void kd_results_deliver(int device, int64_t index, const kd_cuda_result *res);

/* Registrations waiting for their result, on all devices (for tests). */
uint64_t kd_results_waiting(void);

/* Frees the tables (tests; the process's tables live until exit otherwise). */
void kd_results_reset(void);

#ifdef __cplusplus
}
#endif

#endif
