/* kd_ring.c - the launch ring; protocol in Note [Ring protocol] (kd_ring.h). */
#ifndef _DEFAULT_SOURCE
#define _DEFAULT_SOURCE 1 /* MAP_ANONYMOUS beside -D_POSIX_C_SOURCE (Note [Ring mapping]) */
#endif
#include "kd_ring.h"

#include <stdlib.h>
#include <unistd.h>
#include <string.h>
#include <sys/mman.h>

/* Slots for a requested capacity: a power of two, at least 16; 0 above 2^32. */
static uint64_t slots_for(uint64_t capacity)
{
    if (capacity > ((uint64_t)1 << 32))
        return 0;
    uint64_t cap = 16;
    while (cap < capacity)
        cap <<= 1;
    return cap;
}

static int known_policy(int policy) { return policy == KD_RING_DROP_NEW ? KD_RING_DROP_NEW : KD_RING_OVERWRITE; }

kd_ring *kd_ring_new(uint64_t capacity, int policy)
{
    uint64_t cap = slots_for(capacity);
    if (cap == 0)
        return NULL;
    kd_ring *r = calloc(1, sizeof *r);
    if (r == NULL)
        return NULL;
    /* Note [Ring mapping]: the slots are an anonymous mapping of their own,
     * zero pages mapped lazily: an unused ring costs address space, not
     * memory.  calloc gave that only while glibc served the block by mmap;
     * after a large free glibc raises its mmap threshold (up to 32 MB) and
     * serves such blocks from the heap, zeroing them with memset: a ring of
     * 8 MB was then touched whole at construction (seen as a flaky fault
     * count in tests/test_flight.py, depending on what ran before). */
    void *slots = mmap(NULL, (size_t)cap * sizeof(kd_slot), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                       -1, 0);
    if (slots == MAP_FAILED) {
        free(r);
        return NULL;
    }
#ifdef MADV_HUGEPAGE
    /* Note [Ring mapping]: the first lap faults its pages in on the launch
     * path; 2 MB pages take one fault where 4 KB pages take 512 (a 4 KB fault
     * cost 5.8 us, 182 ns per 128-byte slot, on the 2-core CI host; with this
     * advice 39 ns).  Advice only: refused (THP off), the ring works as is. */
    (void)madvise(slots, (size_t)cap * sizeof(kd_slot), MADV_HUGEPAGE);
#endif
    r->slots = slots;
    r->capacity = cap;
    r->mask = cap - 1;
    r->policy = known_policy(policy);
    return r;
}

/* Note [Spare rings]
 * A DebugMode made per training step (a pytest test each, a hunt's reruns)
 * would map, fault in and unmap a ring every time.  Rings given to
 * kd_ring_release are kept (KD_RING_SPARES of them: a benchmark alternates
 * several modes, each alive while the next is made) for the next
 * kd_ring_reuse of the same capacity, and each life's tickets begin at slot 0
 * (the start of the old head's next lap), so they land in pages an earlier
 * life wrote and that are still resident: no page fault on the launch path.
 * Going on from the old head instead wrote fresh pages until the ring had
 * lapped (a 128 MB ring: hundreds of steps), a fault every 32 slots.  What a
 * kept ring holds resident is bounded: at release, its pages past the first
 * KD_RING_KEEP_BYTES go back to the system (MADV_DONTNEED, whether launches
 * or a prefault touched them: they read as zero again, so their stale stamps
 * read as "not yet written" too).  Their address space stays: when a new
 * ring cannot be mapped (ulimit -v, strict overcommit) the kept rings are
 * unmapped and it is tried once more.  Not thread-safe: kdebug calls
 * kd_ring_reuse / kd_ring_release with the GIL held. */
#define KD_RING_SPARES 4
#define KD_RING_KEEP_BYTES ((uint64_t)16 << 20)
static kd_ring *spares[KD_RING_SPARES];

kd_ring *kd_ring_reuse(uint64_t capacity, int policy)
{
    uint64_t cap = slots_for(capacity);
    kd_ring *r = NULL;
    for (int i = KD_RING_SPARES - 1; i >= 0 && r == NULL; i--) /* the newest first: its pages are the warmest */
        if (spares[i] != NULL && spares[i]->capacity == cap) {
            r = spares[i];
            memmove(&spares[i], &spares[i + 1], sizeof spares[0] * (size_t)(KD_RING_SPARES - 1 - i));
            spares[KD_RING_SPARES - 1] = NULL; /* kept oldest first, packed */
        }
    if (r == NULL) {
        r = kd_ring_new(capacity, policy);
        if (r == NULL && cap != 0) {
            /* no address space for it (ulimit -v, strict overcommit): the
             * kept rings hold theirs; give it back and try once more */
            for (int i = 0; i < KD_RING_SPARES; i++) {
                kd_ring_free(spares[i]);
                spares[i] = NULL;
            }
            r = kd_ring_new(capacity, policy);
        }
        return r;
    }
    /* No writer holds the ring: its recorder is gone.  Every stale stamp is
     * at most the old head, below every ticket to come. */
    uint64_t h = atomic_load_explicit(&r->head, memory_order_relaxed);
    uint64_t start = (h + r->mask) & ~r->mask;
    atomic_store_explicit(&r->head, start, memory_order_relaxed);
    kd_ring_clear(r);
    r->policy = known_policy(policy);
    return r;
}

void kd_ring_release(kd_ring *r)
{
    if (r == NULL)
        return;
    int k = -1;
    for (int i = 0; i < KD_RING_SPARES && k < 0; i++)
        if (spares[i] == NULL)
            k = i;
    if (k < 0) { /* all kept: the oldest goes */
        kd_ring_free(spares[0]);
        memmove(&spares[0], &spares[1], sizeof spares[0] * (KD_RING_SPARES - 1));
        k = KD_RING_SPARES - 1;
    }
    /* all of it past the kept part, not only what launches wrote: a prefaulted ring is resident whole */
    uint64_t bytes = r->capacity * sizeof(kd_slot);
    if (bytes > KD_RING_KEEP_BYTES)
        (void)madvise((char *)r->slots + KD_RING_KEEP_BYTES, (size_t)(bytes - KD_RING_KEEP_BYTES), MADV_DONTNEED);
    spares[k] = r;
}

void kd_ring_free(kd_ring *r)
{
    if (r == NULL)
        return;
    munmap(r->slots, (size_t)r->capacity * sizeof(kd_slot));
    free(r);
}

int kd_ring_reserve(kd_ring *r, uint32_t n, uint64_t *first)
{
    if (n == 0 || n > r->capacity) {
        atomic_fetch_add_explicit(&r->refused, 1, memory_order_relaxed);
        return -1;
    }
    if (r->policy == KD_RING_OVERWRITE) {
        *first = atomic_fetch_add_explicit(&r->head, n, memory_order_relaxed);
        atomic_fetch_add_explicit(&r->reserved, 1, memory_order_relaxed);
        return 0;
    }
    uint64_t h = atomic_load_explicit(&r->head, memory_order_relaxed);
    for (;;) {
        uint64_t t = atomic_load_explicit(&r->tail, memory_order_acquire);
        if (h + n - t > r->capacity) {
            atomic_fetch_add_explicit(&r->refused, 1, memory_order_relaxed);
            return -1;
        }
        if (atomic_compare_exchange_weak_explicit(&r->head, &h, h + n,
                                                  memory_order_relaxed,
                                                  memory_order_relaxed)) {
            *first = h;
            atomic_fetch_add_explicit(&r->reserved, 1, memory_order_relaxed);
            return 0;
        }
    }
}

int kd_ring_commit(kd_ring *r, uint64_t first, uint32_t n)
{
    /* Lapped while we were writing: a later writer owns these slots now. */
    uint64_t h = atomic_load_explicit(&r->head, memory_order_relaxed);
    if (h - first > r->capacity) {
        atomic_fetch_add_explicit(&r->refused, 1, memory_order_relaxed);
        return 0;
    }
    for (uint32_t i = 0; i < n; i++) {
        uint64_t t = first + i;
        /* Stamps only grow: a commit that raced past the lap check above
         * (writers not serialized, Note [Ring concurrency]) never makes a
         * later ticket's slot read as unwritten again. */
        _Atomic uint64_t *stamp = &r->slots[t & r->mask].stamp;
        uint64_t s = atomic_load_explicit(stamp, memory_order_relaxed);
        while (s < t + 1 &&
               !atomic_compare_exchange_weak_explicit(stamp, &s, t + 1, memory_order_release,
                                                      memory_order_relaxed))
            ;
    }
    atomic_fetch_add_explicit(&r->committed, 1, memory_order_release);
    return 1;
}

/* Stamp of ticket t relative to what a committed slot for t would hold:
 * <0 not yet written, 0 committed for t, >0 overwritten by a later ticket. */
static int slot_state(kd_ring *r, uint64_t t)
{
    uint64_t s = atomic_load_explicit(&r->slots[t & r->mask].stamp,
                                      memory_order_acquire);
    if (s == t + 1)
        return 0;
    return s < t + 1 ? -1 : 1;
}

/* The first ticket a walk from the tail may look at: tickets older than
 * head - capacity are gone. */
static uint64_t walk_start(kd_ring *r, uint64_t head)
{
    uint64_t t = atomic_load_explicit(&r->tail, memory_order_relaxed);
    return head - t > r->capacity ? head - r->capacity : t;
}

/* At ticket t: 0 a committed launch header (*n its slots, complete), -1 in
 * flight (its header or a later slot not committed yet, or its slots not all
 * reserved: cannot happen, taken as in flight), 1 not a header (lapped, or a
 * header-less tail, or a launch a writer lapped: step over it). */
static int header_at(kd_ring *r, uint64_t t, uint64_t head, uint32_t *n)
{
    int st = slot_state(r, t);
    if (st < 0)
        return -1;
    const kd_payload *p = &r->slots[t & r->mask].p;
    if (st > 0 || p->tag != KD_TAG_LAUNCH)
        return 1;
    uint32_t k = 1u + p->launch.nslots;
    if (t + k > head)
        return -1;
    for (uint32_t i = 1; i < k; i++) {
        int s2 = slot_state(r, t + i);
        if (s2 != 0)
            return s2 < 0 ? -1 : 1;
    }
    *n = k;
    return 0;
}

/* Copies launch [t, t + n) into dst; 1 when its header still holds it
 * after the copy, 0 when a writer lapped it meanwhile (the copy is void). */
static int copy_launch(kd_ring *r, uint64_t t, uint32_t n, kd_payload *dst)
{
    for (uint32_t i = 0; i < n; i++)
        memcpy(&dst[i], &r->slots[(t + i) & r->mask].p, sizeof(kd_payload));
    return slot_state(r, t) == 0;
}

/* Note [One copy per drained launch]
 * A drain copied each launch twice: from the ring's slots to a scratch
 * buffer (so that the copy could be checked against a writer lapping it)
 * and from there into the recorder's store.  A flight recorder compare
 * moves every launch of its window this way (734 us for 10 steps of the
 * H200 AdamW step, docs/flight-recorder.md).  kd_ring_read_to copies the
 * slots once, straight into room the reader gives (the end of its store),
 * checks the header after the copy as before, and lets the visitor take
 * the copy (advance its store) only then; a lapped copy is left in the
 * unused room and overwritten by the next. */
static int64_t read_launches(kd_ring *r, kd_payload *scratch, uint32_t cap, kd_ring_room room,
                             kd_ring_visit visit, void *ctx)
{
    int64_t visited = 0;
    uint64_t head = atomic_load_explicit(&r->head, memory_order_acquire);
    uint64_t t0 = atomic_load_explicit(&r->tail, memory_order_relaxed);
    uint64_t t = walk_start(r, head);
    r->skipped_slots += t - t0; /* tickets older than head - capacity are gone for certain */
    while (t < head) {
        uint32_t n = 0;
        int h = header_at(r, t, head, &n);
        if (h < 0)
            break; /* in flight */
        if (h > 0 || n > cap) {
            r->skipped_slots += 1;
            t++;
            continue;
        }
        kd_payload *dst = room != NULL ? room(ctx, n) : scratch;
        if (dst == NULL) { /* the reader has no room: its own failure, counted there */
            r->read++;
            t += n;
            continue;
        }
        if (!copy_launch(r, t, n, dst)) { /* a writer lapped it while it was copied */
            r->skipped_slots += 1;
            t++;
            continue;
        }
        if (visit(ctx, t, dst, n) != 0) {
            atomic_store_explicit(&r->tail, t, memory_order_release);
            r->lost_memo = 0;
            return -1;
        }
        r->read++;
        visited++;
        t += n;
    }
    atomic_store_explicit(&r->tail, t, memory_order_release);
    r->lost_memo = 0; /* the tail moved: kd_ring_lost walks afresh */
    return visited;
}

int64_t kd_ring_read(kd_ring *r, kd_payload *scratch, uint32_t scratch_cap,
                     kd_ring_visit visit, void *ctx)
{
    return read_launches(r, scratch, scratch_cap, NULL, visit, ctx);
}

int64_t kd_ring_read_to(kd_ring *r, kd_ring_room room, uint32_t cap, kd_ring_visit visit, void *ctx)
{
    return read_launches(r, NULL, cap, room, visit, ctx);
}

int kd_ring_scan(kd_ring *r, uint64_t lo, uint64_t hi, kd_payload *scratch, uint32_t cap, kd_ring_visit visit,
                 void *ctx)
{
    uint64_t head = atomic_load_explicit(&r->head, memory_order_acquire);
    uint64_t t = walk_start(r, head);
    /* Note [Steps held in the ring]: the last scan's place, when it is still that header */
    uint64_t m = r->scan_ticket;
    if (m >= t && m < head && r->scan_index <= lo && slot_state(r, m) == 0 &&
        r->slots[m & r->mask].p.tag == KD_TAG_LAUNCH && r->slots[m & r->mask].p.launch.launch_index == r->scan_index)
        t = m;
    int found = 0;
    while (t < head) {
        uint32_t n = 0;
        int h = header_at(r, t, head, &n);
        if (h < 0)
            return 1;
        if (h > 0) {
            t++;
            continue;
        }
        uint64_t index = r->slots[t & r->mask].p.launch.launch_index;
        if (index >= hi)
            return 0;
        if (index >= lo) {
            if (!found) {
                found = 1;
                r->scan_ticket = t;
                r->scan_index = index;
            }
            if (n <= cap && copy_launch(r, t, n, scratch) && visit(ctx, t, scratch, n) != 0)
                return -1; /* (a larger launch, or one lapped while copied, is passed over) */
        }
        t += n;
    }
    return 0;
}

void kd_ring_hint(kd_ring *r, uint64_t ticket, uint64_t index)
{
    r->scan_ticket = ticket;
    r->scan_index = index;
}

uint64_t kd_ring_discard(kd_ring *r, uint64_t upto)
{
    uint64_t head = atomic_load_explicit(&r->head, memory_order_acquire);
    uint64_t t0 = atomic_load_explicit(&r->tail, memory_order_relaxed);
    uint64_t t = walk_start(r, head);
    r->skipped_slots += t - t0; /* lapped before they were read: lost, as kd_ring_read counts them */
    uint64_t gone = 0;
    while (t < head) {
        uint32_t n = 0;
        int h = header_at(r, t, head, &n);
        if (h < 0)
            break;
        if (h > 0) {
            r->skipped_slots++;
            t++;
            continue;
        }
        if (r->slots[t & r->mask].p.launch.launch_index >= upto)
            break;
        r->read++;
        gone++;
        t += n;
    }
    atomic_store_explicit(&r->tail, t, memory_order_release);
    r->lost_memo = 0; /* the tail moved: kd_ring_lost walks afresh */
    return gone;
}

uint64_t kd_ring_unread_launches(kd_ring *r)
{
    uint64_t head = atomic_load_explicit(&r->head, memory_order_acquire);
    uint64_t count = 0;
    for (uint64_t t = walk_start(r, head); t < head;) {
        uint32_t n = 0;
        int h = header_at(r, t, head, &n);
        if (h != 0) {
            t++;
            continue;
        }
        count++;
        t += n;
    }
    return count;
}

/* Note [Counting lost launches]
 * kd_ring_lost counts the unread launches by walking [tail, head).  Called
 * once per training step (a DebugMode's exit, FlightRecorder reading
 * counters) while the ring fills for many steps between drains, a full walk
 * each time made the cost per step grow with the steps since the last drain.
 * So the walk is remembered: the unread launches found in [lost_from,
 * lost_upto) and where it stopped (head, or a launch still in flight).  The
 * next call goes on from lost_upto when the walk would start at the same
 * ticket (the reader has not moved the tail) and head - tail <= capacity:
 * then no ticket from the tail on has been lapped, stamps only grow, so every
 * slot already walked reads as it did.  Otherwise it walks from the start.
 *
 * A DebugMode made per step reads the count once, at its exit, with a ring
 * cleared at its start (kd_ring_reuse): the walk then starts at the tail
 * every time and reads a stamp of every slot the step wrote (about 14 us for
 * 400 small launches on a CPU host, more for a GPU step's launches with many
 * arguments).  kd_ring_lost_fast knows the answer without it in that case:
 * while no ticket handed out since the clear has been lapped (head -
 * cleared_at <= capacity), every slot from the clear on holds its own
 * ticket's stamp; while the reader skipped no slot, every launch it passed
 * was read (r->read); and while every reserved launch is committed
 * (reserved == committed: none in flight, none lapped at its commit), the
 * walk finds each of the others unread in [tail, head).  So read + unread
 * == committed, none was overwritten, and the walk would return refused:
 * kd_ring_lost_fast returns that.  In any other case (a lap, a skip, a
 * launch in flight) it walks.
 *
 * The walk, like kd_ring_read, takes a stamped slot whose payload's tag is
 * KD_TAG_LAUNCH for a launch's header: no argument payload may start with
 * that tag (kdebug's start with KD_TAG_TENSOR .. KD_TAG_HASH), or a walk
 * that starts inside a launch (after a lap) would misread it. */
uint64_t kd_ring_lost_fast(const kd_ring *r)
{
    uint64_t committed = atomic_load_explicit(&r->committed, memory_order_acquire);
    uint64_t head = atomic_load_explicit(&r->head, memory_order_relaxed);
    if (head - r->cleared_at <= r->capacity && r->skipped_slots == 0 &&
        atomic_load_explicit(&r->reserved, memory_order_relaxed) == committed)
        return atomic_load_explicit(&r->refused, memory_order_relaxed);
    return kd_ring_lost(r);
}

uint64_t kd_ring_lost(const kd_ring *r)
{
    uint64_t committed = atomic_load_explicit(&r->committed, memory_order_acquire);
    uint64_t refused = atomic_load_explicit(&r->refused, memory_order_relaxed);
    uint64_t tail = atomic_load_explicit(&r->tail, memory_order_relaxed);
    uint64_t head = atomic_load_explicit(&r->head, memory_order_relaxed);
    /* Launches still unread between tail and head are not lost.  A launch in
     * flight (reserved, not yet committed: its slots' stamps are not written,
     * or not all of them) is stepped over slot by slot, and the walk goes on:
     * launches other threads committed after it are unread, not overwritten
     * (stopping at it counted them as lost: "dropped" warnings for launches
     * that were all read later, with record_all_threads).  One that commits
     * while the walk runs may be counted unread without being in `committed`
     * read above: that can only under-count.  The memo stops at the first
     * launch in flight, where the next walk must look again. */
    uint64_t unread = 0;
    uint64_t memo_t = 0, memo_unread = 0;
    int in_flight = 0;
    kd_ring *rr = (kd_ring *)r;
    /* Walked as kd_ring_read walks: tickets older than head - capacity are
     * gone, and a lapped slot or a header-less tail is skipped, not an end
     * (stopping there counted every unread launch as lost: "20 dropped" of a
     * ring that held 5 of 20). */
    int lapped = head - tail > r->capacity;
    uint64_t from = lapped ? head - r->capacity : tail;
    uint64_t t = from;
    if (!lapped && rr->lost_memo && rr->lost_from == from && rr->lost_upto >= from && rr->lost_upto <= head) {
        t = rr->lost_upto;
        unread = rr->lost_unread;
    }
    while (t < head) {
        int st = slot_state(rr, t);
        if (st < 0) { /* in flight */
            if (!in_flight)
                in_flight = 1, memo_t = t, memo_unread = unread;
            t++;
            continue;
        }
        const kd_payload *p = &rr->slots[t & rr->mask].p;
        if (st > 0 || p->tag != KD_TAG_LAUNCH) {
            t++;
            continue;
        }
        uint32_t n = 1u + p->launch.nslots;
        if (t + n > head) { /* no launch reserved before head ends past it: not a header */
            t++;
            continue;
        }
        int state = 0;
        for (uint32_t i = 1; i < n && state == 0; i++)
            state = slot_state(rr, t + i);
        if (state < 0) { /* its commit is stamping its slots now: in flight */
            if (!in_flight)
                in_flight = 1, memo_t = t, memo_unread = unread;
            t += n; /* its header is stamped, so its extent is known: its argument slots are not read as headers */
            continue;
        }
        if (state > 0) {
            t++;
            continue;
        }
        unread++;
        t += n;
    }
    rr->lost_memo = !lapped;
    rr->lost_from = from;
    rr->lost_upto = in_flight ? memo_t : t;
    rr->lost_unread = in_flight ? memo_unread : unread;
    uint64_t accounted = r->read + unread;
    uint64_t overwritten = committed > accounted ? committed - accounted : 0;
    return refused + overwritten;
}

/* Note [Ring prefault]
 * A recorder meant to stay on for a whole job (the flight recorder) writes
 * its ring round and round: after the first lap every page is resident, and
 * only the first lap pays for the lazy mapping, one fault per page on the
 * launch path.  Touching the pages up front moves that cost to the
 * recorder's construction (a memory pass over the ring) and makes the host
 * memory it uses visible at once rather than after the first lap.  A
 * DebugMode recording a few steps keeps the lazy mapping: an unused ring
 * costs it address space, not memory.  So does a flight recorder whose ring
 * is above 256 MB (kdebug/flight.py): committing that much host memory per
 * rank at construction could get a job killed before its first step. */
static size_t page_size(void)
{
    long ps = sysconf(_SC_PAGESIZE);
    return ps > 0 ? (size_t)ps : 4096;
}

uint64_t kd_ring_prefault(kd_ring *r)
{
    const size_t page = page_size();
    unsigned char *p = (unsigned char *)r->slots;
    size_t bytes = (size_t)r->capacity * sizeof(kd_slot);
    /* an atomic or of 0: one write fault per page, no value changed (a read
     * then a write would fault twice: the zero page, then its copy) */
    for (size_t off = 0; off < bytes; off += page)
        __atomic_fetch_or(&p[off], (unsigned char)0, __ATOMIC_RELAXED);
    if (bytes)
        __atomic_fetch_or(&p[bytes - 1], (unsigned char)0, __ATOMIC_RELAXED);
    return bytes;
}

/* Bytes of the ring resident in memory (mincore), for tests and memory
 * accounting; 0 when the kernel will not say. */
uint64_t kd_ring_resident(const kd_ring *r)
{
    const size_t page = page_size();
    size_t bytes = (size_t)r->capacity * sizeof(kd_slot);
    size_t pages = (bytes + page - 1) / page;
    unsigned char *vec = malloc(pages);
    if (vec == NULL)
        return 0;
    uint64_t resident = 0;
    if (mincore(r->slots, bytes, vec) == 0)
        for (size_t i = 0; i < pages; i++)
            resident += vec[i] & 1;
    free(vec);
    return resident * page;
}

void kd_ring_clear(kd_ring *r)
{
    uint64_t h = atomic_load_explicit(&r->head, memory_order_acquire);
    atomic_store_explicit(&r->tail, h, memory_order_release);
    atomic_store_explicit(&r->committed, 0, memory_order_relaxed);
    atomic_store_explicit(&r->refused, 0, memory_order_relaxed);
    atomic_store_explicit(&r->reserved, 0, memory_order_relaxed);
    r->cleared_at = h;
    r->read = 0;
    r->skipped_slots = 0;
    r->lost_memo = 0;
    r->scan_index = UINT64_MAX; /* no scan memo (Note [Steps held in the ring]) */
}
