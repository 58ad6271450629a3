/* kd_ring.h - a fixed-capacity ring of record payloads, many writers, one reader.
 *
 * Note [Ring protocol]
 * Writers reserve a run of consecutive tickets (one ticket = one slot) with a
 * single atomic operation, fill the payloads, and commit by stamping every
 * slot with ticket + 1 (release).  A launch is therefore contiguous in ticket
 * space (it may wrap around the end of the array).  The reader walks tickets
 * from its cursor; a slot whose stamp is lower than ticket + 1 is still being
 * written (the reader stops there), a higher stamp means a later writer has
 * lapped it (the launch is lost to overwriting).
 *
 * Two policies when the ring is full:
 *   KD_RING_OVERWRITE  writers never wait or fail; the oldest unread launches
 *                      are overwritten.
 *   KD_RING_DROP_NEW   a launch that does not fit is refused and counted.
 * Either way the count of lost launches is exact once the reader has caught up:
 * lost = committed - read (overwritten) + refused.
 *
 * Note [Ring concurrency]
 * Who may run what at the same time, and what protects each field:
 *  - kd_ring_reserve / kd_ring_commit: any number of writer threads, lock-free.
 *    `head`, `committed`, `refused` and the slot stamps are atomics (a stamp
 *    only ever grows); a slot's payload belongs to the writer that reserved it
 *    until its commit stamps it (release), which publishes the payload to a
 *    reader that loads the stamp (acquire).
 *  - Under KD_RING_OVERWRITE a writer can lap another that is still writing
 *    the same slots.  Writers that can lap each other must therefore run the
 *    stretches in which they write payloads, and each commit, under one lock
 *    (kdebug: the GIL; a writer re-checks for a lap, as kd_ring_commit does,
 *    before writing after it let go of the lock).  The lapped launch is then
 *    refused at its commit and counted; without the lock two writers' bytes
 *    could mix in one slot.  KD_RING_DROP_NEW never laps and needs no lock.
 *  - kd_ring_read, kd_ring_lost, kd_ring_clear: one reader at a time (the
 *    caller serializes readers).  `read` and `skipped_slots` are the reader's
 *    alone.  The reader publishes its cursor `tail` (release) after copying;
 *    a drop_new writer loads it (acquire) before reusing a slot, so it never
 *    writes a slot the reader is still copying.
 *  - A reader may run concurrently with writers (test_ring_threads.c, under
 *    ThreadSanitizer: `make -C csrc tsan`) as long as no writer can lap the
 *    slots it copies: always under KD_RING_DROP_NEW; under KD_RING_OVERWRITE
 *    only when the ring cannot fill up meanwhile.  An overwriting writer that
 *    laps the reader is detected (stamps are re-checked after the copy) but
 *    is a data race on the payload bytes: kdebug runs every writer and the
 *    reader with the GIL held, so they never overlap there.
 *  - kd_ring_clear additionally needs no writer running.
 *  - kd_ring_reuse / kd_ring_release share the spare rings (Note [Spare
 *    rings] in kd_ring.c): callers serialize them (kdebug: the GIL).
 * Nothing here allocates except kd_ring_new (and kd_ring_reuse, through it).
 */
#ifndef KD_RING_H
#define KD_RING_H

#include <stdatomic.h>
#include <stdint.h>

#include "kd_record.h"

enum kd_ring_policy { KD_RING_OVERWRITE = 0, KD_RING_DROP_NEW = 1 };

typedef struct kd_slot {
    _Atomic uint64_t stamp;
    kd_payload p;
} kd_slot;

static_assert(sizeof(kd_slot) == 128, "a ring slot is two cache lines");

typedef struct kd_ring {
    kd_slot *slots;
    uint64_t capacity; /* slots, a power of two */
    uint64_t mask;
    int policy;
    _Atomic uint64_t head;      /* next ticket to hand out */
    _Atomic uint64_t tail;      /* reader cursor: tickets before it are consumed */
    _Atomic uint64_t committed; /* launches committed */
    _Atomic uint64_t refused;   /* launches refused: ring full, too large, lapped */
    _Atomic uint64_t reserved;  /* launches given tickets (kd_ring_reserve); kd_ring_lost_fast */
    uint64_t cleared_at;        /* head when the ring was made or last cleared (reader only) */
    uint64_t read;              /* launches the reader returned (reader only) */
    uint64_t skipped_slots;     /* slots the reader skipped as lost (reader only) */
    /* kd_ring_lost's walk so far (reader only): unread launches in
     * [lost_from, lost_upto); valid while no ticket from lost_from on can
     * have been lapped (Note [Counting lost launches]) */
    uint64_t lost_from, lost_upto, lost_unread;
    int lost_memo;
    /* where kd_ring_scan found its last range (reader only): the header at
     * ticket scan_ticket had launch index scan_index (Note [Steps held in
     * the ring]); checked before use, never trusted */
    uint64_t scan_ticket, scan_index;
} kd_ring;

/* Returns a new ring of at least capacity slots (rounded up to a power of two,
 * minimum 16), or NULL when out of memory or capacity is above 2^32. */
kd_ring *kd_ring_new(uint64_t capacity, int policy);
void kd_ring_free(kd_ring *r);

/* kd_ring_new, but taking a ring given to kd_ring_release when its capacity
 * matches (cleared: no launch of its previous life is read again; its
 * tickets begin at slot 0).  kd_ring_release keeps a few rings for that and
 * frees the oldest beyond (Note [Spare rings]).  Callers serialize both
 * (kdebug: the GIL). */
kd_ring *kd_ring_reuse(uint64_t capacity, int policy);
void kd_ring_release(kd_ring *r);

/* Reserves n consecutive slots.  Returns 0 and the first ticket in *first, or
 * -1 when the launch is refused (counted in r->refused). */
int kd_ring_reserve(kd_ring *r, uint32_t n, uint64_t *first);

/* The payload of a reserved ticket. */
static inline kd_payload *kd_ring_payload(kd_ring *r, uint64_t ticket)
{
    return &r->slots[ticket & r->mask].p;
}

/* Publishes the n slots starting at first as one launch.  If a writer has
 * lapped them meanwhile (overwrite policy, ring far too small), the launch is
 * counted as refused instead and 0 is returned; otherwise 1. */
int kd_ring_commit(kd_ring *r, uint64_t first, uint32_t n);

/* Called by the reader for each complete launch, in ticket order; p points to
 * n contiguous payloads (header first) copied from tickets first..first+n.
 * Returns 0 to go on, nonzero to stop. */
typedef int (*kd_ring_visit)(void *ctx, uint64_t first, const kd_payload *p, uint32_t n);

/* Copies out every complete launch from the cursor on, up to the first one
 * still being written, calling visit for each; scratch must hold
 * scratch_cap payloads (a launch larger than that is skipped as lost).
 * Returns the number of launches visited, or -1 if visit asked to stop
 * (the cursor then points at the launch that stopped it). */
int64_t kd_ring_read(kd_ring *r, kd_payload *scratch, uint32_t scratch_cap,
                     kd_ring_visit visit, void *ctx);

/* Where kd_ring_read_to copies a launch of n payloads: room for them, or NULL
 * when the reader has none (the launch is then passed over, read: the reader
 * counts it as its own failure). */
typedef kd_payload *(*kd_ring_room)(void *ctx, uint32_t n);

/* kd_ring_read, copying each launch straight to where room says (Note [One
 * copy per drained launch]): visit then gets that copy, and taking it is the
 * visitor's own step (a launch that visit stops at, or that a writer lapped
 * while it was copied, must leave the room unused).  Launches of more than
 * cap payloads are skipped as lost. */
int64_t kd_ring_read_to(kd_ring *r, kd_ring_room room, uint32_t cap, kd_ring_visit visit, void *ctx);

/* Note [Steps held in the ring]
 * A reader that wants a few launches' contents now and the rest only
 * perhaps later (the flight recorder: each step's compared records now, the
 * whole of the last steps only for a dump) need not copy the ring out:
 *  - kd_ring_scan hands the visitor a copy of each committed launch whose
 *    launch index lies in [lo, hi), consuming nothing (a scan copies only
 *    the launches in its range; a drain copies every launch into a store);
 *  - kd_ring_discard consumes the launches before a launch index without
 *    copying them (counted as read: none of them is lost).
 * Both walk headers as kd_ring_read does (a lapped slot, or the tail end of
 * a launch whose header is gone, is stepped over) and take launch indices
 * to grow in ring order across the ranges asked for (kdebug: a recorder's
 * launch indices are taken in order under the GIL; ranges are training
 * steps, which no launch spans).  A scan starts where the last one found
 * its range when that header is still there with the same index and at or
 * before lo, else at the tail: scans of increasing ranges walk each header
 * about once. */
/* Calls visit(ctx, first ticket, copy, n) for each committed launch with a
 * launch index in [lo, hi), in ring order, its n payloads copied into
 * scratch (cap payloads; a larger launch, or one a writer lapped while it
 * was copied, is passed over as lost), until a launch with index >= hi or
 * head.  Consumes nothing.  Returns 0 when it got there, 1 when it met a
 * launch still in flight first (the range may not be complete yet), -1
 * when visit returned nonzero (which stops it). */
int kd_ring_scan(kd_ring *r, uint64_t lo, uint64_t hi, kd_payload *scratch, uint32_t cap, kd_ring_visit visit,
                 void *ctx);

/* A hint for the next kd_ring_scan: launch `index` is thought to begin at
 * `ticket`.  The scan checks it (that header, committed, with that index)
 * before it uses it. */
void kd_ring_hint(kd_ring *r, uint64_t ticket, uint64_t index);

/* Consumes, from the tail, every committed launch with a launch index below
 * upto (counted as read), stopping at the first launch with a larger index,
 * one in flight, or head.  Returns the launches consumed. */
uint64_t kd_ring_discard(kd_ring *r, uint64_t upto);

/* Committed launches between tail and head that a read would return (a
 * walk of the headers). */
uint64_t kd_ring_unread_launches(kd_ring *r);

/* Launches lost so far: refused plus those overwritten before being read.
 * Exact whenever no launch is in flight, read or not (unread launches are
 * counted by walking the ring as kd_ring_read would; a later call walks only
 * what was written since: Note [Counting lost launches]).  Reader side. */
uint64_t kd_ring_lost(const kd_ring *r);

/* kd_ring_lost's answer, in O(1) where it can be known without the walk:
 * no ticket handed out since the ring was made or cleared has been lapped,
 * the reader skipped no slot and no launch is in flight (Note [Counting lost
 * launches]).  Otherwise kd_ring_lost itself.  Reader side. */
uint64_t kd_ring_lost_fast(const kd_ring *r);

/* Touches every page of the ring's slots (an atomic or of 0 into one byte
 * of each, so no launch changes): a ring's memory is mapped lazily
 * (kd_ring_new), and until each page is first written a launch that reaches
 * it pays a page fault and the kernel's zeroing of the page on the launch
 * path (seen on the H200 host: about 22 faults per transformer step, part of
 * 0.9 to 1.6 µs per launch spent reserving and filling the ring).  Returns
 * the bytes touched.  No writer may run (Note [Ring prefault] in kd_ring.c). */
uint64_t kd_ring_prefault(kd_ring *r);
uint64_t kd_ring_resident(const kd_ring *r);

/* Forget everything: cursor to head, counters to zero.  Reader side only,
 * with no writer running. */
void kd_ring_clear(kd_ring *r);

#endif
