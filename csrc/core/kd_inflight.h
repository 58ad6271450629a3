/* kd_inflight.h - GPU hash results reserved before the work that writes them
 * is queued.
 *
 * Note [Results in flight]
 * Most GPU hash results are written by a hash kernel queued in the same
 * locked call that takes their indices (kd_cuda_hash_enqueue), so by the time
 * a collect synchronizes the device, every taken index has its writer queued.
 * A CUDA graph replay is different (Note [CUDA graph replays] in
 * kd_graph.c): its K indices are reserved before CUDAGraph.replay queues the
 * graph whose hash kernels write them, and torch's replay runs without the
 * GIL.  A collect in that gap (another thread reading hashes, or the ring
 * filling up) would synchronize, read those slots while nothing had written
 * them, and hand zeros over as hashes, then clear slots the graph writes
 * later.  So each such reservation is held here until its writer is queued
 * (kd_inflight_done) and a collect stops at the first index still held
 * (kd_inflight_limit); the results after it wait for the next collect.  A
 * reader that needs every result (a recorder's drain, a PendingHash, a
 * hash_collect()) waits, with the GIL released, until the other threads'
 * replays holding results before the ones it wants are queued
 * (kd_collect_gpu_results in kd_graph.c, at most 5 s).
 * A reservation whose writer will never run (the replay raised) is ended
 * with void=1: its results are delivered marked KD_CUDA_NOT_COMPUTED, and
 * their records get no hash and an error that says why.  A void entry keeps
 * its slot here until a collect passes it; a reservation refused for want
 * of slots collects first.
 * No locking here: the caller holds its own lock (kd_cuda_hash.cu's mutex).
 */
#ifndef KD_INFLIGHT_H
#define KD_INFLIGHT_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KD_INFLIGHT_MAX 64 /* reservations held at once per device */

typedef struct kd_inflight {
    int64_t first[KD_INFLIGHT_MAX];
    int64_t n[KD_INFLIGHT_MAX];
    uint8_t state[KD_INFLIGHT_MAX]; /* 0 free, 1 held, 2 void (writer never queued, not yet collected) */
    int used;                       /* entries not free */
} kd_inflight;

/* Holds [first, first + n).  0, or -1 when KD_INFLIGHT_MAX are held. */
int kd_inflight_add(kd_inflight *f, int64_t first, int64_t n);

/* The writer of the reservation starting at `first` is queued (void=0), or
 * will never be (void=1).  0, or -1 when no held reservation starts there. */
int kd_inflight_done(kd_inflight *f, int64_t first, int void_);

/* The end of what a collect may read: the first index of the earliest held
 * reservation, or `next` (every index taken so far) when none is held. */
int64_t kd_inflight_limit(const kd_inflight *f, int64_t next);

/* 1 when `index` lies in a void reservation. */
int kd_inflight_is_void(const kd_inflight *f, int64_t index);

/* Forgets void reservations that end at or before `collected`. */
void kd_inflight_collected(kd_inflight *f, int64_t collected);

/* Reservations still held (not void). */
int kd_inflight_held(const kd_inflight *f);

#ifdef __cplusplus
}
#endif

#endif
