/* kd_store.h - launches drained from the ring, kept in order for reading.
 *
 * A growable array of payloads plus the offset of each launch header.  The
 * store grows only when the ring is drained (when the user reads results),
 * never on the launch path.
 */
#ifndef KD_STORE_H
#define KD_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "kd_record.h"

/* Note [Dropping from the front]
 * The flight recorder drops its oldest launches at every drain (forget)
 * while keeping the last few windows of steps.  Moving the kept launches to
 * the front each time moved about three windows of records per window
 * recorded.  So a drop only advances `front` (launches) and `dead`
 * (payloads); the space is reclaimed when an append finds the arrays full:
 * the live launches move to the front once, and the arrays then grow to
 * twice what is live, so a compaction moves at most as many payloads as
 * were appended since the last one.  Offsets in launch_off are indexes into
 * payloads (dead ones included) and change only at a compaction; a parallel
 * array indexed the same way (the Recorder's store_objs) is valid only for
 * a store that never drops (the Recorder refuses forget() there). */
typedef struct kd_store {
    kd_payload *payloads; /* [dead, npayloads): the live launches' payloads */
    uint64_t npayloads;   /* end of the used payloads, dropped ones included */
    uint64_t payload_cap;
    uint64_t dead;        /* payloads of dropped launches not yet reclaimed */
    uint64_t *launch_off; /* launch_off[front + i]: header offset of live launch i */
    uint64_t front;       /* launch_off entries of dropped launches */
    uint64_t nlaunches;   /* live launches */
    uint64_t launch_cap;
} kd_store;

void kd_store_init(kd_store *s);
void kd_store_free(kd_store *s);
void kd_store_clear(kd_store *s);

/* Appends one launch (n payloads, header first).  Returns 0, or -1 when out
 * of memory (nothing appended). */
int kd_store_append(kd_store *s, const kd_payload *p, uint32_t n);

/* Room for one more launch of n payloads at the end of the store, for the
 * caller to write in place, or NULL when out of memory; kd_store_take(s, n)
 * then appends what was written there (until then the store is unchanged:
 * a later kd_store_room may give the same room again). */
kd_payload *kd_store_room(kd_store *s, uint32_t n);
void kd_store_take(kd_store *s, uint32_t n);

/* Drops the first n launches (all of them when n >= nlaunches); launch i
 * becomes launch i - n.  O(1): nothing moves (Note [Dropping from the
 * front]).  Never allocates. */
void kd_store_drop_front(kd_store *s, uint64_t n);

/* Offset in payloads of live launch i's header (i < nlaunches). */
static inline uint64_t kd_store_offset(const kd_store *s, uint64_t i)
{
    return s->launch_off[s->front + i];
}

/* Header payload of launch i (i < nlaunches); args follow it. */
static inline const kd_payload *kd_store_launch(const kd_store *s, uint64_t i)
{
    return &s->payloads[kd_store_offset(s, i)];
}

/* The store index of the first live launch whose launch index is >= want
 * (nlaunches when none is): a binary search, for stores whose launches are
 * in launch-index order (a ring drained in order; lost launches leave gaps,
 * which it steps over).  The flight recorder finds a step's launches with it
 * (kdebug/flight.py, FlightRecorder._drain). */
uint64_t kd_store_lower_bound(const kd_store *s, uint64_t want);

/* Payloads the live launches take. */
static inline uint64_t kd_store_live_payloads(const kd_store *s)
{
    return s->npayloads - s->dead;
}

/* Offset (from the header) of the payload that starts argument k of a launch,
 * or 0 when k is out of range. */
uint32_t kd_launch_arg_offset(const kd_payload *launch, uint32_t k);

#endif
