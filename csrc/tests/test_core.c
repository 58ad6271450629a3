/* test_core.c - tests of kdebug's Python-free C core: ring, string table,
 * store, renderer.  Built and run under AddressSanitizer and UBSan by
 * csrc/Makefile (`make -C csrc test`), which the pytest suite calls. */
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <time.h>
#include <stdlib.h>
#include <string.h>

#include "../core/kd_args.h"
#include "../core/kd_clock.h"
#include "../core/kd_hash.h"
#include "../core/kd_inflight.h"
#include "../core/kd_record.h"
#include "../core/kd_render.h"
#include "../core/kd_results.h"
#include "../core/kd_ring.h"
#include "../core/kd_store.h"
#include "../core/kd_strtab.h"

#include "kd_check.h"

/* ---- helpers: write a launch of nargs int args, marked with a value ---- */

static int write_launch(kd_ring *r, uint32_t nargs, uint64_t mark)
{
    uint64_t first;
    if (kd_ring_reserve(r, 1 + nargs, &first) != 0)
        return 0;
    kd_payload *h = kd_ring_payload(r, first);
    memset(h, 0, sizeof *h);
    h->launch.tag = KD_TAG_LAUNCH;
    h->launch.kind = KD_KIND_TRITON;
    h->launch.nargs = (uint16_t)nargs;
    h->launch.nslots = (uint16_t)nargs;
    h->launch.launch_index = mark;
    for (uint32_t i = 0; i < nargs; i++) {
        kd_payload *a = kd_ring_payload(r, first + 1 + i);
        memset(a, 0, sizeof *a);
        a->scalar.tag = KD_TAG_INT;
        a->scalar.value.i = (int64_t)(mark * 1000 + i);
    }
    return kd_ring_commit(r, first, 1 + nargs);
}

typedef struct collect {
    uint64_t marks[100000];
    uint64_t n;
    int bad;
} collect;

static int visit_collect(void *ctx, uint64_t first, const kd_payload *p, uint32_t n)
{
    (void)first;
    collect *c = ctx;
    if (p[0].tag != KD_TAG_LAUNCH || n != 1u + p[0].launch.nslots)
        c->bad++;
    uint64_t mark = p[0].launch.launch_index;
    for (uint32_t i = 1; i < n; i++)
        if (p[i].tag != KD_TAG_INT || p[i].scalar.value.i != (int64_t)(mark * 1000 + i - 1))
            c->bad++;
    if (c->n < 100000)
        c->marks[c->n] = mark;
    c->n++;
    return 0;
}

static kd_payload scratch[4096];

static void test_ring_basic(void)
{
    kd_ring *r = kd_ring_new(64, KD_RING_OVERWRITE);
    CHECK(r != NULL && r->capacity == 64);
    static collect c;
    memset(&c, 0, sizeof c);
    for (uint64_t i = 0; i < 10; i++)
        CHECK(write_launch(r, 3, i) == 1); /* 40 slots */
    CHECK(kd_ring_read(r, scratch, 4096, visit_collect, &c) == 10);
    CHECK(c.n == 10 && c.bad == 0);
    for (uint64_t i = 0; i < 10; i++)
        CHECK(c.marks[i] == i);
    CHECK(kd_ring_lost(r) == 0);
    /* nothing new: reading again returns nothing */
    CHECK(kd_ring_read(r, scratch, 4096, visit_collect, &c) == 0);
    kd_ring_free(r);
}

/* Note [One copy per drained launch]: kd_ring_read_to copies each launch
 * once, into the store's room; a launch the visitor stops at leaves the room
 * unused, and no room passes a launch over as read. */
typedef struct to_store {
    kd_store s;
    collect c;
    uint64_t stop_at;  /* the visitor stops at the launch with this mark */
    int no_room_for;   /* room gives NULL for this launch (counted once) */
    int no_room;
    uint64_t rooms;
} to_store;

static kd_payload *room_to_store(void *ctx, uint32_t n)
{
    to_store *t = ctx;
    t->rooms++;
    if (t->no_room_for >= 0 && t->rooms == (uint64_t)t->no_room_for + 1) {
        t->no_room++;
        return NULL;
    }
    return kd_store_room(&t->s, n);
}

static int visit_to_store(void *ctx, uint64_t first, const kd_payload *p, uint32_t n)
{
    to_store *t = ctx;
    if (p[0].launch.launch_index == t->stop_at)
        return 1;
    CHECK(p == &t->s.payloads[t->s.npayloads]); /* the copy is the store's room: no second copy */
    visit_collect(&t->c, first, p, n);
    kd_store_take(&t->s, n);
    return 0;
}

static void test_ring_read_to(void)
{
    kd_ring *r = kd_ring_new(256, KD_RING_OVERWRITE);
    static to_store t;
    memset(&t, 0, sizeof t);
    kd_store_init(&t.s);
    t.stop_at = 7;
    t.no_room_for = 2; /* the third launch finds no room */
    for (uint64_t i = 0; i < 10; i++)
        CHECK(write_launch(r, (uint32_t)(1 + i % 4), i) == 1);
    /* 0, 1 taken; 2 passed over (no room); 3..6 taken; stops at 7 */
    CHECK(kd_ring_read_to(r, room_to_store, 4096, visit_to_store, &t) == -1);
    CHECK(t.c.n == 6 && t.c.bad == 0 && t.no_room == 1);
    CHECK(t.s.nlaunches == 6);
    uint64_t want[] = {0, 1, 3, 4, 5, 6};
    for (int i = 0; i < 6; i++) {
        CHECK(t.c.marks[i] == want[i]);
        const kd_payload *l = kd_store_launch(&t.s, (uint64_t)i);
        CHECK(l->tag == KD_TAG_LAUNCH && l->launch.launch_index == want[i]);
        CHECK(l->launch.nslots == (uint32_t)(want[i] % 4 + 1));
        CHECK(l[1].tag == KD_TAG_INT && l[1].scalar.value.i == (int64_t)(want[i] * 1000));
    }
    /* 7 was left in the ring: the next read starts there */
    t.stop_at = UINT64_MAX;
    CHECK(kd_ring_read_to(r, room_to_store, 4096, visit_to_store, &t) == 3);
    CHECK(t.s.nlaunches == 9 && t.c.marks[6] == 7 && t.c.marks[8] == 9 && t.c.bad == 0);
    /* a launch larger than cap is skipped as lost, as kd_ring_read does */
    CHECK(write_launch(r, 6, 10) == 1);
    CHECK(kd_ring_read_to(r, room_to_store, 4, visit_to_store, &t) == 0);
    CHECK(t.s.nlaunches == 9);
    kd_store_free(&t.s);
    kd_ring_free(r);
}

/* Note [Ring prefault]: touching the pages changes no launch, written or to come */
static void test_ring_prefault(void)
{
    kd_ring *r = kd_ring_new(1 << 12, KD_RING_OVERWRITE);
    CHECK(r != NULL);
    CHECK(kd_ring_prefault(r) == ((uint64_t)1 << 12) * sizeof(kd_slot));
    static collect c;
    memset(&c, 0, sizeof c);
    for (uint64_t i = 0; i < 10; i++)
        CHECK(write_launch(r, 5, i) == 1);
    CHECK(kd_ring_prefault(r) == ((uint64_t)1 << 12) * sizeof(kd_slot)); /* with launches unread */
    for (uint64_t i = 10; i < 20; i++)
        CHECK(write_launch(r, 5, i) == 1);
    CHECK(kd_ring_read(r, scratch, 4096, visit_collect, &c) == 20);
    CHECK(c.n == 20 && c.bad == 0 && c.marks[0] == 0 && c.marks[19] == 19);
    CHECK(kd_ring_lost(r) == 0);
    kd_ring_free(r);
}

static void test_ring_wrap_overwrite(void)
{
    /* 16 slots, launches of 5 slots: the ring wraps and launches straddle
     * the end of the array. */
    kd_ring *r = kd_ring_new(16, KD_RING_OVERWRITE);
    static collect c;
    memset(&c, 0, sizeof c);
    for (uint64_t i = 0; i < 3; i++)
        write_launch(r, 4, i);
    CHECK(kd_ring_read(r, scratch, 4096, visit_collect, &c) == 3);
    /* now write 7 launches (35 slots) without reading: only the last three
     * fit (15 slots), and one of those may have been partly lapped */
    for (uint64_t i = 3; i < 10; i++)
        write_launch(r, 4, i);
    /* exact before reading too: the cursor's slots are lapped, which is not
     * the end of what is unread (it counted all 7 as lost) */
    CHECK(kd_ring_lost(r) == 4);
    int64_t got = kd_ring_read(r, scratch, 4096, visit_collect, &c);
    CHECK(got == 3);
    CHECK(c.bad == 0);
    CHECK(c.n == 6);
    CHECK(c.marks[3] == 7 && c.marks[4] == 8 && c.marks[5] == 9);
    /* exact count of what was lost: launches 3..6 */
    CHECK(kd_ring_lost(r) == 4);
    kd_ring_free(r);
}

static void test_ring_drop_new(void)
{
    kd_ring *r = kd_ring_new(16, KD_RING_DROP_NEW);
    static collect c;
    memset(&c, 0, sizeof c);
    int ok = 0;
    for (uint64_t i = 0; i < 10; i++)
        ok += write_launch(r, 4, i); /* 5 slots each: 3 fit */
    CHECK(ok == 3);
    CHECK(kd_ring_lost(r) == 7);
    CHECK(kd_ring_read(r, scratch, 4096, visit_collect, &c) == 3);
    CHECK(c.marks[0] == 0 && c.marks[2] == 2);
    /* after reading there is room again */
    CHECK(write_launch(r, 4, 42) == 1);
    CHECK(kd_ring_read(r, scratch, 4096, visit_collect, &c) == 1);
    CHECK(c.marks[3] == 42);
    CHECK(kd_ring_lost(r) == 7);
    /* a launch larger than the ring is refused and counted */
    CHECK(write_launch(r, 40, 43) == 0);
    CHECK(kd_ring_lost(r) == 8);
    kd_ring_clear(r);
    CHECK(kd_ring_lost(r) == 0);
    kd_ring_free(r);
}

/* Note [Counting lost launches]: kd_ring_lost called again and again while
 * the ring fills goes on from its last walk; its count stays exact through a
 * launch in flight, a lap, a read and a clear. */
static void test_ring_lost_incremental(void)
{
    kd_ring *r = kd_ring_new(64, KD_RING_OVERWRITE);
    static collect c;
    memset(&c, 0, sizeof c);
    for (uint64_t i = 0; i < 5; i++) {
        CHECK(write_launch(r, 3, i) == 1); /* 4 slots each */
        CHECK(kd_ring_lost(r) == 0);
    }
    CHECK(r->lost_memo && r->lost_upto == 20 && r->lost_unread == 5); /* walked up to head */
    /* a launch in flight stops the walk; one committed after it is unread, not lost */
    uint64_t first;
    CHECK(kd_ring_reserve(r, 4, &first) == 0 && first == 20);
    CHECK(write_launch(r, 3, 6) == 1);
    CHECK(kd_ring_lost(r) == 0); /* launch 6, committed after the one in flight, is unread */
    CHECK(r->lost_upto == 20 && r->lost_unread == 5); /* the memo stops at the one in flight */
    kd_payload *h = kd_ring_payload(r, first);
    memset(h, 0, sizeof *h);
    h->launch.tag = KD_TAG_LAUNCH;
    h->launch.nargs = h->launch.nslots = 3;
    for (uint32_t i = 1; i < 4; i++)
        memset(kd_ring_payload(r, first + i), 0, sizeof(kd_payload));
    /* its commit half done (header stamped, argument slots not yet): still in flight */
    atomic_store(&r->slots[first & r->mask].stamp, first + 1);
    CHECK(kd_ring_lost(r) == 0);
    CHECK(r->lost_upto == 20 && r->lost_unread == 5);
    CHECK(kd_ring_commit(r, first, 4) == 1);
    CHECK(kd_ring_lost(r) == 0);
    CHECK(r->lost_upto == 28 && r->lost_unread == 7); /* went on from 20 */
    /* lap the ring: 10 more launches (40 slots, 68 in all): the oldest
     * unread launches are overwritten; the walk starts afresh */
    for (uint64_t i = 7; i < 17; i++)
        CHECK(write_launch(r, 3, i) == 1);
    CHECK(kd_ring_lost(r) == 1); /* 17 launches, 16 fit in 64 slots */
    CHECK(!r->lost_memo);
    CHECK(kd_ring_read(r, scratch, 4096, visit_collect, &c) == 16);
    CHECK(kd_ring_lost(r) == 1);
    for (uint64_t i = 17; i < 20; i++) {
        CHECK(write_launch(r, 3, i) == 1);
        CHECK(kd_ring_lost(r) == 1);
    }
    CHECK(r->lost_unread == 3);
    kd_ring_clear(r);
    CHECK(kd_ring_lost(r) == 0);
    CHECK(write_launch(r, 3, 20) == 1);
    CHECK(kd_ring_lost(r) == 0 && r->lost_unread == 1);
    kd_ring_free(r);
}

/* Note [Counting lost launches]: kd_ring_lost_fast answers as the walk does
 * (the counts below are what was written, refused and read: independent of
 * either), without walking while no ticket since the clear was lapped, the
 * reader skipped nothing and no launch is in flight; and walks otherwise. */
static void test_ring_lost_fast(void)
{
    kd_ring *r = kd_ring_new(64, KD_RING_OVERWRITE);
    static collect c;
    memset(&c, 0, sizeof c);
    for (uint64_t i = 0; i < 10; i++)
        CHECK(write_launch(r, 3, i) == 1); /* 40 of 64 slots, unread */
    CHECK(kd_ring_lost_fast(r) == 0 && !r->lost_memo); /* answered without the walk */
    CHECK(kd_ring_lost(r) == 0);
    /* a launch in flight: the walk's answer, whatever it is */
    uint64_t first;
    CHECK(kd_ring_reserve(r, 4, &first) == 0);
    r->lost_memo = 0;
    CHECK(kd_ring_lost_fast(r) == kd_ring_lost(r) && r->lost_memo); /* it walked */
    kd_payload *h = kd_ring_payload(r, first);
    memset(h, 0, sizeof *h);
    h->launch.tag = KD_TAG_LAUNCH;
    h->launch.nargs = h->launch.nslots = 3;
    for (uint32_t i = 1; i < 4; i++)
        memset(kd_ring_payload(r, first + i), 0, sizeof(kd_payload));
    CHECK(kd_ring_commit(r, first, 4) == 1);
    r->lost_memo = 0;
    CHECK(kd_ring_lost_fast(r) == 0 && !r->lost_memo);
    /* read, then a launch larger than the ring: refused, counted without the walk */
    CHECK(kd_ring_read(r, scratch, 4096, visit_collect, &c) == 11);
    CHECK(write_launch(r, 80, 99) == 0);
    CHECK(kd_ring_lost_fast(r) == 1 && !r->lost_memo && kd_ring_lost(r) == 1);
    /* lap the ring (head 44 + 80 slots): 4 of the 20 launches written fit, 16 lost, walked */
    for (uint64_t i = 11; i < 31; i++)
        CHECK(write_launch(r, 3, i) == 1);
    r->lost_memo = 0;
    CHECK(kd_ring_lost_fast(r) == 1 + 4 && kd_ring_lost(r) == 1 + 4);
    CHECK(kd_ring_read(r, scratch, 4096, visit_collect, &c) == 16);
    CHECK(kd_ring_lost_fast(r) == 1 + 4);
    /* cleared: this recording's tickets start at the head, none lapped */
    kd_ring_clear(r);
    for (uint64_t i = 0; i < 12; i++)
        CHECK(write_launch(r, 3, i) == 1);
    CHECK(kd_ring_lost_fast(r) == 0 && !r->lost_memo && kd_ring_lost(r) == 0);
    /* a launch the reader skips (larger than its scratch): lost, walked */
    CHECK(kd_ring_read(r, scratch, 3, visit_collect, &c) == 0);
    CHECK(r->skipped_slots > 0);
    CHECK(kd_ring_lost_fast(r) == kd_ring_lost(r));
    kd_ring_free(r);
    /* drop_new: refused when full, never overwritten */
    r = kd_ring_new(16, KD_RING_DROP_NEW);
    int ok = 0;
    for (uint64_t i = 0; i < 10; i++)
        ok += write_launch(r, 4, i); /* 5 slots each: 3 fit */
    CHECK(ok == 3 && kd_ring_lost_fast(r) == 7 && kd_ring_lost(r) == 7);
    kd_ring_free(r);
}

static void test_ring_reuse(void)
{
    kd_ring *r = kd_ring_new(16, KD_RING_OVERWRITE);
    static collect c;
    memset(&c, 0, sizeof c);
    for (uint64_t i = 0; i < 5; i++)
        write_launch(r, 2, i); /* 15 slots, one of them unread */
    CHECK(kd_ring_read(r, scratch, 4096, visit_collect, &c) == 5);
    write_launch(r, 2, 5);
    kd_ring_release(r);
    /* another capacity: a fresh ring; the spare stays */
    kd_ring *other = kd_ring_reuse(64, KD_RING_OVERWRITE);
    CHECK(other != NULL && other != r && other->capacity == 64);
    kd_ring_free(other);
    CHECK(kd_ring_reuse((uint64_t)1 << 40, KD_RING_OVERWRITE) == NULL); /* too large, as kd_ring_new */
    kd_ring *again = kd_ring_reuse(16, KD_RING_DROP_NEW);
    CHECK(again == r);
    CHECK(again->policy == KD_RING_DROP_NEW);
    /* nothing of its previous life reads back, nothing counts as lost */
    memset(&c, 0, sizeof c);
    CHECK(kd_ring_read(again, scratch, 4096, visit_collect, &c) == 0);
    CHECK(kd_ring_lost(again) == 0);
    /* stale stamps read as unwritten: an in-flight launch stops the reader */
    uint64_t first;
    CHECK(kd_ring_reserve(again, 3, &first) == 0);
    /* its tickets begin a lap: slot 0, the pages written first before */
    CHECK(first == 32 && (first & again->mask) == 0);
    CHECK(kd_ring_read(again, scratch, 4096, visit_collect, &c) == 0);
    kd_payload *h = kd_ring_payload(again, first);
    memset(h, 0, sizeof *h);
    h->launch.tag = KD_TAG_LAUNCH;
    h->launch.nargs = h->launch.nslots = 2;
    h->launch.launch_index = 77;
    for (uint32_t i = 0; i < 2; i++) {
        kd_payload *a = kd_ring_payload(again, first + 1 + i);
        memset(a, 0, sizeof *a);
        a->scalar.tag = KD_TAG_INT;
        a->scalar.value.i = 77000 + i;
    }
    CHECK(kd_ring_commit(again, first, 3) == 1);
    /* wraps past the end of the array, drop_new as asked */
    int ok = 0;
    for (uint64_t i = 78; i < 84; i++)
        ok += write_launch(again, 2, i);
    CHECK(ok == 4); /* 5 launches of 3 slots fit in 16 */
    CHECK(kd_ring_read(again, scratch, 4096, visit_collect, &c) == 5);
    CHECK(c.bad == 0 && c.n == 5 && c.marks[0] == 77 && c.marks[4] == 81);
    CHECK(kd_ring_lost(again) == 2);
    kd_ring_free(again);
}

/* Note [Spare rings]: several rings kept, the newest reused first; a kept
 * ring's pages past the first 16 MB go back and read as never written. */
static void test_ring_spares(void)
{
    kd_ring *a = kd_ring_reuse(16, KD_RING_OVERWRITE), *b = kd_ring_reuse(16, KD_RING_OVERWRITE);
    CHECK(a != NULL && b != NULL && a != b);
    kd_ring_release(a);
    kd_ring_release(b);
    kd_ring *b2 = kd_ring_reuse(16, KD_RING_OVERWRITE), *a2 = kd_ring_reuse(16, KD_RING_OVERWRITE);
    CHECK(b2 == b && a2 == a);
    kd_ring *c = kd_ring_reuse(16, KD_RING_OVERWRITE); /* none kept: a new one */
    CHECK(c != NULL && c != a && c != b);
    /* five released, four kept: the first released is freed (ASan: no leak, no double free) */
    kd_ring *more[2] = {kd_ring_reuse(16, KD_RING_OVERWRITE), kd_ring_reuse(16, KD_RING_OVERWRITE)};
    kd_ring_release(a2);
    kd_ring_release(b2);
    kd_ring_release(c);
    kd_ring_release(more[0]);
    kd_ring_release(more[1]);
    kd_ring *got[4];
    for (int i = 0; i < 4; i++)
        got[i] = kd_ring_reuse(16, KD_RING_OVERWRITE);
    CHECK(got[0] == more[1] && got[1] == more[0] && got[2] == c && got[3] == b2);
    for (int i = 0; i < 4; i++)
        kd_ring_free(got[i]);
    /* 32 MB of slots, written to 24 MB: the last 8 MB are given back at release */
    uint64_t cap = (uint64_t)1 << 18;
    kd_ring *big = kd_ring_reuse(cap, KD_RING_OVERWRITE);
    CHECK(big != NULL);
    uint64_t upto = (uint64_t)3 << 16, first;
    CHECK(kd_ring_reserve(big, (uint32_t)upto, &first) == 0 && first == 0);
    CHECK(kd_ring_commit(big, first, (uint32_t)upto) == 1);
    kd_ring_release(big);
    kd_ring *big2 = kd_ring_reuse(cap, KD_RING_OVERWRITE);
    CHECK(big2 == big && atomic_load(&big2->head) == cap);
    CHECK(atomic_load(&big2->slots[upto - 1].stamp) == 0); /* given back: zero again */
    CHECK(atomic_load(&big2->slots[1000].stamp) == 1001); /* kept: stale, below every ticket to come */
    static collect none;
    CHECK(kd_ring_read(big2, scratch, 4096, visit_collect, &none) == 0);
    kd_ring_free(big2);
}

static void test_ring_in_flight(void)
{
    kd_ring *r = kd_ring_new(64, KD_RING_OVERWRITE);
    static collect c;
    memset(&c, 0, sizeof c);
    write_launch(r, 2, 0);
    /* reserve a launch and leave it uncommitted: the reader stops there */
    uint64_t first;
    CHECK(kd_ring_reserve(r, 3, &first) == 0);
    kd_payload *h = kd_ring_payload(r, first);
    memset(h, 0, sizeof *h);
    h->launch.tag = KD_TAG_LAUNCH;
    h->launch.nslots = 2;
    h->launch.nargs = 2;
    h->launch.launch_index = 1;
    for (int i = 0; i < 2; i++) {
        kd_payload *a = kd_ring_payload(r, first + 1 + (uint64_t)i);
        memset(a, 0, sizeof *a);
        a->scalar.tag = KD_TAG_INT;
        a->scalar.value.i = 1000 + i;
    }
    write_launch(r, 2, 2); /* committed after the in-flight one */
    CHECK(kd_ring_read(r, scratch, 4096, visit_collect, &c) == 1);
    CHECK(kd_ring_commit(r, first, 3) == 1);
    CHECK(kd_ring_read(r, scratch, 4096, visit_collect, &c) == 2);
    CHECK(c.n == 3 && c.marks[1] == 1 && c.marks[2] == 2 && c.bad == 0);
    CHECK(kd_ring_lost(r) == 0);
    kd_ring_free(r);
}

/* Note [Steps held in the ring]: kd_ring_scan visits copies of the launches
 * of a range and consumes nothing; its memo makes increasing ranges start
 * where the last one was found, and an earlier range still starts at the
 * tail; kd_ring_discard consumes what lies before an index as read (none
 * lost); both stop at a launch in flight. */
static void test_ring_scan_and_discard(void)
{
    kd_ring *r = kd_ring_new(256, KD_RING_OVERWRITE);
    static collect c;
    for (uint64_t i = 0; i < 20; i++)
        CHECK(write_launch(r, (uint32_t)(i % 3), i) == 1);
    CHECK(kd_ring_unread_launches(r) == 20);
    for (uint64_t lo = 0; lo < 20; lo += 4) { /* increasing ranges */
        memset(&c, 0, sizeof c);
        CHECK(kd_ring_scan(r, lo, lo + 4, scratch, 4096, visit_collect, &c) == 0);
        CHECK(c.n == 4 && c.bad == 0 && c.marks[0] == lo && c.marks[3] == lo + 3);
        CHECK(r->scan_index == lo);
    }
    memset(&c, 0, sizeof c); /* an earlier range: from the tail again, still right */
    CHECK(kd_ring_scan(r, 2, 5, scratch, 4096, visit_collect, &c) == 0);
    CHECK(c.n == 3 && c.marks[0] == 2 && c.marks[2] == 4 && c.bad == 0);
    memset(&c, 0, sizeof c); /* past head: nothing, complete */
    CHECK(kd_ring_scan(r, 20, 30, scratch, 4096, visit_collect, &c) == 0 && c.n == 0);
    memset(&c, 0, sizeof c); /* a launch larger than the scratch is passed over */
    CHECK(kd_ring_scan(r, 0, 20, scratch, 2, visit_collect, &c) == 0 && c.n == 14);
    CHECK(kd_ring_unread_launches(r) == 20); /* nothing consumed */
    CHECK(atomic_load(&r->tail) == 0);
    CHECK(kd_ring_discard(r, 7) == 7 && atomic_load(&r->tail) > 0);
    CHECK(kd_ring_unread_launches(r) == 13);
    memset(&c, 0, sizeof c); /* what discard dropped is gone from scans, the rest is there */
    CHECK(kd_ring_scan(r, 0, 10, scratch, 4096, visit_collect, &c) == 0);
    CHECK(c.n == 3 && c.marks[0] == 7);
    /* a launch in flight: the scan of a range past it is incomplete, discard stops at it */
    uint64_t first;
    CHECK(kd_ring_reserve(r, 2, &first) == 0);
    kd_payload *h = kd_ring_payload(r, first);
    memset(h, 0, sizeof *h);
    h->launch.tag = KD_TAG_LAUNCH;
    h->launch.nslots = 1;
    h->launch.nargs = 1;
    h->launch.launch_index = 20;
    memset(kd_ring_payload(r, first + 1), 0, sizeof(kd_payload));
    kd_ring_payload(r, first + 1)->scalar.tag = KD_TAG_INT;
    kd_ring_payload(r, first + 1)->scalar.value.i = 20000;
    CHECK(write_launch(r, 1, 21) == 1);
    memset(&c, 0, sizeof c);
    CHECK(kd_ring_scan(r, 18, 22, scratch, 4096, visit_collect, &c) == 1 && c.n == 2);
    memset(&c, 0, sizeof c);
    CHECK(kd_ring_scan(r, 18, 20, scratch, 4096, visit_collect, &c) == 1); /* cannot know 20 is not in it */
    CHECK(kd_ring_discard(r, 100) == 13 && kd_ring_unread_launches(r) == 1); /* (not the one in flight) */
    CHECK(kd_ring_commit(r, first, 2) == 1);
    memset(&c, 0, sizeof c);
    CHECK(kd_ring_scan(r, 20, 22, scratch, 4096, visit_collect, &c) == 0 && c.n == 2 && c.bad == 0);
    CHECK(kd_ring_discard(r, 100) == 2 && kd_ring_unread_launches(r) == 0);
    CHECK(kd_ring_lost(r) == 0 && r->read == 22); /* every launch read, none lost */
    /* lapped: launches overwritten before a discard are lost, not read */
    for (uint64_t i = 22; i < 122; i++)
        CHECK(write_launch(r, 3, i) == 1); /* 400 slots in a ring of 256 */
    uint64_t left = kd_ring_unread_launches(r);
    CHECK(left == 64);
    CHECK(kd_ring_discard(r, 1000) == left);
    CHECK(kd_ring_lost(r) == 100 - left);
    kd_ring_free(r);
}

typedef struct writer_arg {
    kd_ring *r;
    uint64_t base;
    int n;
} writer_arg;

static void *writer(void *p)
{
    writer_arg *a = p;
    for (int i = 0; i < a->n; i++)
        write_launch(a->r, (uint32_t)(i % 7), a->base + (uint64_t)i);
    return NULL;
}

/* A writer as kdebug's are: it writes payloads and commits under one lock
 * (the GIL there), but lets go of it between reserve and commit (the kernel
 * runs then), so other writers can lap its launch meanwhile. */
static pthread_mutex_t gil = PTHREAD_MUTEX_INITIALIZER;

static void *gil_writer(void *p)
{
    writer_arg *a = p;
    for (int i = 0; i < a->n; i++) {
        uint32_t nargs = (uint32_t)(i % 7);
        uint64_t first;
        pthread_mutex_lock(&gil);
        if (kd_ring_reserve(a->r, 1 + nargs, &first) != 0) {
            pthread_mutex_unlock(&gil);
            continue;
        }
        kd_payload *h = kd_ring_payload(a->r, first);
        memset(h, 0, sizeof *h);
        h->launch.tag = KD_TAG_LAUNCH;
        h->launch.nargs = (uint16_t)nargs;
        h->launch.nslots = (uint16_t)nargs;
        h->launch.launch_index = a->base + (uint64_t)i;
        for (uint32_t j = 0; j < nargs; j++) {
            kd_payload *x = kd_ring_payload(a->r, first + 1 + j);
            memset(x, 0, sizeof *x);
            x->scalar.tag = KD_TAG_INT;
            x->scalar.value.i = (int64_t)((a->base + (uint64_t)i) * 1000 + j);
        }
        pthread_mutex_unlock(&gil);
        if (i % 3 == 0)
            sched_yield(); /* the kernel runs: others may lap this launch */
        pthread_mutex_lock(&gil);
        kd_ring_commit(a->r, first, 1 + nargs);
        pthread_mutex_unlock(&gil);
    }
    return NULL;
}

static void test_ring_threads(void)
{
    enum { T = 4, N = 5000 };
    kd_ring *r = kd_ring_new(1 << 18, KD_RING_OVERWRITE);
    pthread_t th[T];
    writer_arg args[T];
    for (int i = 0; i < T; i++) {
        args[i] = (writer_arg){r, (uint64_t)(i + 1) * 100000, N};
        pthread_create(&th[i], NULL, writer, &args[i]);
    }
    for (int i = 0; i < T; i++)
        pthread_join(th[i], NULL);
    static collect c;
    memset(&c, 0, sizeof c);
    CHECK(kd_ring_read(r, scratch, 4096, visit_collect, &c) == T * N);
    CHECK(c.bad == 0);
    /* each thread's launches appear once, in that thread's order */
    uint64_t next[T] = {0};
    int order_ok = 1;
    for (uint64_t i = 0; i < c.n; i++) {
        int t = (int)(c.marks[i] / 100000) - 1;
        if (t < 0 || t >= T || c.marks[i] % 100000 != next[t])
            order_ok = 0;
        else
            next[t]++;
    }
    CHECK(order_ok);
    CHECK(kd_ring_lost(r) == 0);
    kd_ring_free(r);

    /* a small ring under the same load, its writers lapping each other as
     * kdebug's may (Note [Ring concurrency]): what is read plus what is lost
     * equals what was written, exactly, and every launch read is whole */
    r = kd_ring_new(256, KD_RING_OVERWRITE);
    for (int i = 0; i < T; i++) {
        args[i] = (writer_arg){r, (uint64_t)(i + 1) * 100000, N};
        pthread_create(&th[i], NULL, gil_writer, &args[i]);
    }
    for (int i = 0; i < T; i++)
        pthread_join(th[i], NULL);
    memset(&c, 0, sizeof c);
    int64_t got = kd_ring_read(r, scratch, 4096, visit_collect, &c);
    CHECK(got > 0 && c.bad == 0);
    CHECK((uint64_t)got + kd_ring_lost(r) == (uint64_t)T * N);
    kd_ring_free(r);

    r = kd_ring_new(256, KD_RING_DROP_NEW);
    for (int i = 0; i < T; i++) {
        args[i] = (writer_arg){r, (uint64_t)(i + 1) * 100000, N};
        pthread_create(&th[i], NULL, writer, &args[i]);
    }
    for (int i = 0; i < T; i++)
        pthread_join(th[i], NULL);
    memset(&c, 0, sizeof c);
    got = kd_ring_read(r, scratch, 4096, visit_collect, &c);
    CHECK(got > 0 && c.bad == 0);
    CHECK((uint64_t)got + kd_ring_lost(r) == (uint64_t)T * N);
    kd_ring_free(r);
}

/* ---- string table ---- */

typedef struct intern_arg {
    kd_strtab *t;
    uint32_t ids[2000];
} intern_arg;

static void *interner(void *p)
{
    intern_arg *a = p;
    char buf[32];
    for (int i = 0; i < 2000; i++) {
        int n = snprintf(buf, sizeof buf, "kernel_%d", i);
        a->ids[i] = kd_strtab_intern(a->t, buf, (size_t)n);
    }
    return NULL;
}

static void test_strtab(void)
{
    kd_strtab *t = kd_strtab_new(100000);
    CHECK(t != NULL);
    uint32_t a = kd_strtab_intern(t, "in_ptr0", 7);
    uint32_t b = kd_strtab_intern(t, "out_ptr0", 8);
    CHECK(a == 1 && b == 2);
    CHECK(kd_strtab_intern(t, "in_ptr0", 7) == a);
    CHECK(kd_strtab_intern(t, "in_ptr0xyz", 7) == a); /* length-delimited */
    size_t n;
    CHECK_STR(kd_strtab_get(t, b, &n), "out_ptr0");
    CHECK(n == 8);
    CHECK_STR(kd_strtab_get(t, 0, NULL), "");
    CHECK_STR(kd_strtab_get(t, 999, NULL), "");
    CHECK(kd_strtab_intern(t, "a\0b", 3) == 0); /* embedded NUL refused */
    CHECK(kd_strtab_intern(t, "", 0) != 0);
    /* many strings: the index grows, ids stay valid */
    char buf[32];
    uint32_t first = 0;
    for (int i = 0; i < 20000; i++) {
        int k = snprintf(buf, sizeof buf, "s%d", i);
        uint32_t id = kd_strtab_intern(t, buf, (size_t)k);
        if (i == 0)
            first = id;
        CHECK(id != 0 || i < 0);
    }
    CHECK_STR(kd_strtab_get(t, first, NULL), "s0");
    CHECK(kd_strtab_intern(t, "s19999", 6) == first + 19999);
    /* a string longer than a chunk */
    char *big = malloc(200000);
    memset(big, 'x', 199999);
    big[199999] = '\0';
    uint32_t bid = kd_strtab_intern(t, big, 199999);
    CHECK(bid != 0 && strlen(kd_strtab_get(t, bid, NULL)) == 199999);
    free(big);
    kd_strtab_free(t);

    /* full table */
    t = kd_strtab_new(2);
    CHECK(kd_strtab_intern(t, "a", 1) == 1);
    CHECK(kd_strtab_intern(t, "b", 1) == 2);
    CHECK(kd_strtab_intern(t, "c", 1) == 0);
    CHECK(kd_strtab_intern(t, "a", 1) == 1);
    kd_strtab_free(t);

    /* concurrent interning agrees on ids */
    t = kd_strtab_new(100000);
    static intern_arg ia[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        ia[i].t = t;
        pthread_create(&th[i], NULL, interner, &ia[i]);
    }
    for (int i = 0; i < 4; i++)
        pthread_join(th[i], NULL);
    int same = 1;
    for (int i = 0; i < 2000; i++)
        for (int k = 1; k < 4; k++)
            if (ia[k].ids[i] != ia[0].ids[i] || ia[0].ids[i] == 0)
                same = 0;
    CHECK(same);
    CHECK(kd_strtab_count(t) == 2000);
    kd_strtab_free(t);
}

/* ---- store + render ---- */

static const char *dtypes[46];

static void fill_tensor(kd_payload *p, uint32_t name, int ndim, const int64_t *sizes,
                        const int64_t *strides)
{
    uint32_t np = kd_tensor_payloads((uint32_t)ndim);
    memset(p, 0, np * sizeof *p);
    p[0].tensor.tag = KD_TAG_TENSOR;
    p[0].tensor.dtype = 6; /* Float */
    p[0].tensor.ndim = (uint8_t)ndim;
    p[0].tensor.name_id = name;
    p[0].tensor.role = KD_ROLE_READ;
    p[0].tensor.data_ptr = 0x1000;
    for (int d = 0; d < ndim; d++) {
        if (d < KD_INLINE_DIMS) {
            p[0].tensor.sizes[d] = sizes[d];
            p[0].tensor.strides[d] = strides[d];
        } else {
            int k = d - KD_INLINE_DIMS;
            kd_dims_cont *c = &p[1 + k / KD_CONT_DIMS].dims;
            c->tag = KD_TAG_DIMS;
            c->sizes[k % KD_CONT_DIMS] = sizes[d];
            c->strides[k % KD_CONT_DIMS] = strides[d];
        }
    }
}

static void test_render(void)
{
    kd_strtab *t = kd_strtab_new(1000);
    dtypes[6] = "f32";
    dtypes[15] = "bf16";
    kd_render_ctx ctx = {t, dtypes, 46};
    kd_payload p[16];
    memset(p, 0, sizeof p);
    p[0].launch.tag = KD_TAG_LAUNCH;
    p[0].launch.kind = KD_KIND_TRITON;
    p[0].launch.flags = KD_LF_GRID | KD_LF_CONFIG;
    p[0].launch.name_id = kd_strtab_intern(t, "triton_poi_fused_add_0", 22);
    p[0].launch.config_id = kd_strtab_intern(t, "XBLOCK=1024", 11);
    p[0].launch.num_warps = 4;
    p[0].launch.num_stages = 1;
    p[0].launch.grid[0] = 64;
    p[0].launch.grid[1] = 128;
    p[0].launch.grid[2] = 1;
    int64_t s2[2] = {8, 256}, st2[2] = {256, 1};
    fill_tensor(&p[1], kd_strtab_intern(t, "in_ptr0", 7), 2, s2, st2);
    int64_t s6[6] = {1, 2, 3, 4, 5, 6}, st6[6] = {720, 360, 120, 30, 6, 1};
    fill_tensor(&p[2], kd_strtab_intern(t, "out_ptr0", 8), 6, s6, st6); /* 2 payloads */
    p[2].tensor.role = KD_ROLE_WRITE;
    p[4].scalar.tag = KD_TAG_INT;
    p[4].scalar.name_id = kd_strtab_intern(t, "xnumel", 6);
    p[4].scalar.value.i = 2048;
    p[5].scalar.tag = KD_TAG_FLOAT;
    p[5].scalar.name_id = kd_strtab_intern(t, "eps", 3);
    p[5].scalar.value.f = 1e-5;
    int64_t s0[1] = {0}, st0[1] = {1};
    fill_tensor(&p[6], 0, 0, s0, st0); /* 0-dim, no name */
    p[0].launch.nargs = 5;
    p[0].launch.nslots = 6;

    char buf[1024];
    size_t n = kd_render_launch(&ctx, p, 0, buf, sizeof buf);
    const char *want = "[triton] triton_poi_fused_add_0(grid=(64, 128, 1), in_ptr0=t: f32[8, 256], "
                       "out_ptr0=t: f32[1, 2, 3, 4, 5, 6], xnumel=2048, eps=1e-05, arg4=t: f32[])";
    CHECK_STR(buf, want);
    CHECK(n == strlen(want));
    /* truncation keeps snprintf semantics */
    char small[10];
    CHECK(kd_render_launch(&ctx, p, 0, small, sizeof small) == strlen(want));
    CHECK_STR(small, "[triton] ");
    kd_render_args(&ctx, p, 0, buf, sizeof buf);
    CHECK_STR(buf, "in_ptr0=t: f32[8, 256], out_ptr0=t: f32[1, 2, 3, 4, 5, 6], xnumel=2048, "
                   "eps=1e-05, arg4=t: f32[]");
    kd_render_launch(&ctx, p, KD_RENDER_VERBOSE, buf, sizeof buf);
    CHECK(strstr(buf, "in_ptr0=t: f32[8, 256]{R, stride=(256, 1), offset=0, ptr=0x1000}") != NULL);
    CHECK(strstr(buf, "out_ptr0=t: f32[1, 2, 3, 4, 5, 6]{W, stride=(720, 360, 120, 30, 6, 1)") != NULL);
    CHECK(strstr(buf, "# XBLOCK=1024, num_warps=4, num_stages=1") != NULL);

    /* C++ kernel: no grid */
    p[0].launch.kind = KD_KIND_CPP;
    p[0].launch.nargs = 1;
    p[0].launch.nslots = 1;
    kd_render_launch(&ctx, p, 0, buf, sizeof buf);
    CHECK_STR(buf, "[cpp] triton_poi_fused_add_0(in_ptr0=t: f32[8, 256])");

    /* store: append and find argument offsets */
    kd_store s;
    kd_store_init(&s);
    p[0].launch.kind = KD_KIND_TRITON;
    p[0].launch.nargs = 5;
    p[0].launch.nslots = 6;
    for (int i = 0; i < 1000; i++)
        CHECK(kd_store_append(&s, p, 7) == 0 || i < 0);
    CHECK(s.nlaunches == 1000 && s.npayloads == 7000);
    const kd_payload *l = kd_store_launch(&s, 999);
    CHECK(l->tag == KD_TAG_LAUNCH);
    CHECK(kd_launch_arg_offset(l, 0) == 1);
    CHECK(kd_launch_arg_offset(l, 1) == 2);
    CHECK(kd_launch_arg_offset(l, 2) == 4);
    CHECK(kd_launch_arg_offset(l, 4) == 6);
    CHECK(kd_launch_arg_offset(l, 5) == 0);
    int64_t size, stride;
    kd_tensor_dim(&l[2], 5, &size, &stride);
    CHECK(size == 6 && stride == 1);
    CHECK(kd_store_append(&s, &p[1], 1) == -1); /* not a launch header */
    /* drop_front: launch i becomes launch i - n, payloads intact */
    p[0].launch.launch_index = 1000;
    CHECK(kd_store_append(&s, p, 7) == 0);
    kd_store_drop_front(&s, 0);
    CHECK(s.nlaunches == 1001 && s.npayloads == 7007);
    kd_store_drop_front(&s, 998);
    CHECK(s.nlaunches == 3 && kd_store_live_payloads(&s) == 21);
    CHECK(kd_store_launch(&s, 2)->launch.launch_index == 1000);
    CHECK(kd_store_launch(&s, 0)->tag == KD_TAG_LAUNCH && kd_launch_arg_offset(kd_store_launch(&s, 1), 4) == 6);
    CHECK(kd_store_offset(&s, 0) == s.dead && kd_store_offset(&s, 2) == s.dead + 14);
    kd_store_drop_front(&s, 99);
    CHECK(s.nlaunches == 0 && s.npayloads == 0 && kd_store_live_payloads(&s) == 0);
    CHECK(kd_store_append(&s, p, 7) == 0 && s.nlaunches == 1);
    kd_store_free(&s);

    /* Note [Dropping from the front]: a window of launches appended and the
     * oldest dropped, many times over (the flight recorder's drains): every
     * kept launch reads back in order with its own payloads, the space of
     * dropped ones is reclaimed (the arrays stay within four times what is
     * kept), and launches of several sizes cross each compaction. */
    kd_store_init(&s);
    uint64_t next = 0, first = 0, max_cap = 0;
    int ok = 1;
    for (int round = 0; round < 300; round++) {
        for (int k = 0; k < 37; k++, next++) {
            uint32_t np = 1 + (uint32_t)(next % 5);
            p[0].launch.launch_index = next;
            p[0].launch.nslots = (uint16_t)(np - 1);
            ok &= kd_store_append(&s, p, np) == 0;
        }
        uint64_t keep = 40 + (uint64_t)(round % 3) * 30; /* kept: more, or fewer, than a window */
        if (s.nlaunches > keep) {
            first += s.nlaunches - keep;
            kd_store_drop_front(&s, s.nlaunches - keep);
        }
        ok &= s.nlaunches == next - first;
        /* lower_bound: the launch with that index, the first one for an
         * index dropped already, nlaunches past the last */
        ok &= kd_store_lower_bound(&s, first + s.nlaunches / 2) == s.nlaunches / 2;
        ok &= kd_store_lower_bound(&s, first) == 0 && kd_store_lower_bound(&s, 0) == 0;
        ok &= kd_store_lower_bound(&s, next) == s.nlaunches && kd_store_lower_bound(&s, UINT64_MAX) == s.nlaunches;
        for (uint64_t i = 0; i < s.nlaunches && ok; i++) {
            const kd_payload *h = kd_store_launch(&s, i);
            ok &= h->tag == KD_TAG_LAUNCH && h->launch.launch_index == first + i &&
                  h->launch.nslots == (first + i) % 5;
            if (i + 1 < s.nlaunches) /* each launch's payloads end where the next one's begin */
                ok &= kd_store_offset(&s, i + 1) - kd_store_offset(&s, i) == 1u + h->launch.nslots;
        }
        if (s.payload_cap > max_cap)
            max_cap = s.payload_cap;
    }
    CHECK(ok);
    CHECK(max_cap <= 4 * 100 * 5 + 256); /* at most 100 launches of at most 5 payloads kept */
    /* lower_bound over gaps (lost launches): indexes 0, 3, 6, ... */
    kd_store_clear(&s);
    for (uint64_t k = 0; k < 50; k++) {
        p[0].launch.launch_index = 3 * k;
        p[0].launch.nslots = 0;
        CHECK(kd_store_append(&s, p, 1) == 0);
    }
    CHECK(kd_store_lower_bound(&s, 0) == 0 && kd_store_lower_bound(&s, 1) == 1 && kd_store_lower_bound(&s, 3) == 1);
    CHECK(kd_store_lower_bound(&s, 4) == 2 && kd_store_lower_bound(&s, 147) == 49 && kd_store_lower_bound(&s, 148) == 50);
    kd_store_drop_front(&s, 10); /* first live: index 30 */
    CHECK(kd_store_lower_bound(&s, 0) == 0 && kd_store_lower_bound(&s, 31) == 1);
    kd_store_free(&s);
    kd_strtab_free(t);
}

/* ---- the argument walk (Note [Argument payloads]) ---- */

/* A launch record of 4 arguments in 7 payloads, in a heap block of exactly
 * 7 payloads so that ASan sees any read past it:
 *   [0] header  [1] int  [2..4] 6-d tensor (2 payloads) + its hash
 *   [5] 0-d tensor  [6] float */
static kd_payload *arg_record(void)
{
    kd_payload *p = calloc(7, sizeof *p);
    p[0].launch.tag = KD_TAG_LAUNCH;
    p[0].launch.nargs = 4;
    p[0].launch.nslots = 6;
    p[1].scalar.tag = KD_TAG_INT;
    p[1].scalar.value.i = 7;
    int64_t s6[6] = {1, 2, 3, 4, 5, 6}, st6[6] = {720, 360, 120, 30, 6, 1};
    fill_tensor(&p[2], 0, 6, s6, st6);
    p[2].tensor.flags = KD_TF_HASHED;
    p[4].hash.tag = KD_TAG_HASH;
    p[4].hash.spec = 3;
    int64_t s0[1] = {0}, st0[1] = {1};
    fill_tensor(&p[5], 0, 0, s0, st0);
    p[6].scalar.tag = KD_TAG_FLOAT;
    return p;
}

/* Walks rec[0..n) and writes each yielded argument's offset to offs; returns how many. */
static uint32_t walk_offsets(const kd_payload *rec, uint32_t n, uint32_t *offs, int *truncated)
{
    uint32_t k = 0;
    kd_arg_iter it = kd_args_begin(rec, n);
    while (kd_args_next(&it)) {
        CHECK(it.index == k && it.arg == &rec[it.off]);
        offs[k++] = it.off;
    }
    *truncated = kd_args_truncated(&it);
    return k;
}

static void test_arg_walk(void)
{
    kd_payload *p = arg_record();
    uint32_t offs[8];
    int trunc;

    /* the whole record: offsets, lengths and the one hash */
    kd_arg_iter it = kd_args_begin(p, 7);
    static const uint32_t want_off[4] = {1, 2, 5, 6}, want_np[4] = {1, 3, 1, 1};
    uint32_t k = 0;
    while (kd_args_next(&it)) {
        CHECK(k < 4 && it.index == k && it.off == want_off[k] && it.npayloads == want_np[k]);
        if (k == 1) {
            CHECK(it.hash == &p[4].hash && it.hash_off == 4 && it.hash->spec == 3);
        } else {
            CHECK(it.hash == NULL && it.hash_off == 0);
        }
        k++;
    }
    CHECK(k == 4 && !kd_args_truncated(&it));
    CHECK(kd_args_next(&it) == 0); /* stays ended */
    CHECK(kd_launch_arg_offset(p, 2) == 5 && kd_launch_arg_offset(p, 4) == 0);

    /* n cuts the hashed tensor's payloads short: the walk stops before it */
    CHECK(walk_offsets(p, 4, offs, &trunc) == 1 && offs[0] == 1 && trunc);
    CHECK(walk_offsets(p, 5, offs, &trunc) == 2 && offs[1] == 2 && trunc);
    CHECK(walk_offsets(p, 1, offs, &trunc) == 0 && trunc);

    /* a corrupt nslots bounds the walk as a short n does, even with n larger */
    p[0].launch.nslots = 3;
    CHECK(walk_offsets(p, 7, offs, &trunc) == 1 && trunc);
    CHECK(kd_launch_arg_offset(p, 1) == 0);
    p[0].launch.nslots = 6;

    /* a corrupt ndim (37 payloads claimed) or hash flag stops it at that argument */
    p[2].tensor.ndim = 255;
    CHECK(walk_offsets(p, 7, offs, &trunc) == 1 && trunc);
    p[2].tensor.ndim = 6;
    p[5].tensor.flags = KD_TF_HASHED; /* its hash would be p[6], then p[7] for the float */
    CHECK(walk_offsets(p, 7, offs, &trunc) == 3 && offs[2] == 5 && trunc);
    p[5].tensor.flags = 0;

    /* nargs larger than the payloads hold: truncated; smaller: a complete walk of fewer */
    p[0].launch.nargs = 60000;
    CHECK(walk_offsets(p, 7, offs, &trunc) == 4 && trunc);
    p[0].launch.nargs = 2;
    CHECK(walk_offsets(p, 7, offs, &trunc) == 2 && !trunc);
    p[0].launch.nargs = 4;

    /* not a launch header, or nothing to read: no arguments */
    p[0].tag = KD_TAG_INT;
    CHECK(walk_offsets(p, 7, offs, &trunc) == 0 && !trunc);
    p[0].tag = KD_TAG_LAUNCH;
    CHECK(walk_offsets(p, 0, offs, &trunc) == 0 && !trunc);
    CHECK(walk_offsets(NULL, 7, offs, &trunc) == 0 && !trunc);
    free(p);

    /* random headers and argument bytes: every yielded argument lies inside
     * the block and the record, arguments are contiguous from payload 1, and
     * a walk that yields fewer than nargs says it was truncated (ASan checks
     * the reads) */
    uint64_t seed = 0x9e3779b97f4a7c15ull;
    for (int round = 0; round < 2000; round++) {
        uint32_t n = 1 + (uint32_t)(round % 12);
        kd_payload *q = malloc(n * sizeof *q);
        for (uint32_t i = 0; i < n; i++)
            for (size_t b = 0; b < sizeof *q; b++) {
                seed = seed * 6364136223846793005ull + 1442695040888963407ull;
                q[i].bytes[b] = (uint8_t)(seed >> 56);
            }
        q[0].tag = KD_TAG_LAUNCH;
        q[0].launch.nargs %= 16;
        q[0].launch.nslots %= 16;
        for (uint32_t i = 1; i < n; i++)
            q[i].tag = (q[i].tag & 1) ? KD_TAG_TENSOR : KD_TAG_INT;
        uint32_t end = n < 1u + q[0].launch.nslots ? n : 1u + q[0].launch.nslots;
        kd_arg_iter w = kd_args_begin(q, n);
        uint32_t expect_off = 1, count = 0;
        int ok = 1;
        while (kd_args_next(&w)) {
            ok &= w.off == expect_off && w.npayloads >= 1 && w.off + w.npayloads <= end;
            ok &= w.hash == NULL || (w.hash_off == w.off + w.npayloads - 1 && w.hash == &q[w.hash_off].hash);
            expect_off += w.npayloads;
            count++;
        }
        CHECK(ok);
        CHECK(count <= q[0].launch.nargs);
        CHECK(kd_args_truncated(&w) == (count < q[0].launch.nargs));
        free(q);
    }
}

static void test_doubles(void)
{
    /* expected strings are Python's repr() of the same values */
    struct { double v; const char *want; } cases[] = {
        {1.0, "1.0"}, {0.1, "0.1"}, {1e-05, "1e-05"}, {0.0001, "0.0001"},
        {100000.0, "100000.0"}, {1e16, "1e+16"}, {1.5e-07, "1.5e-07"},
        {123456789.123, "123456789.123"}, {-0.0, "-0.0"}, {0.0, "0.0"},
        {1e22, "1e+22"}, {3.141592653589793, "3.141592653589793"},
        {2.5e-310, "2.5e-310"}, {-2.5, "-2.5"}, {1234567890123456.0, "1234567890123456.0"},
        {9007199254740993.0, "9007199254740992.0"}, {0.3, "0.3"}, {1.0 / 3, "0.3333333333333333"},
        {1e300 * 1e10, "inf"}, {-1e300 * 1e10, "-inf"}, {123e-20, "1.23e-18"},
    };
    char buf[64];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        kd_render_double(cases[i].v, buf, sizeof buf);
        CHECK_STR(buf, cases[i].want);
    }
    kd_render_double(NAN, buf, sizeof buf);
    CHECK_STR(buf, "nan");
}

/* ---- hashes ---- */

static uint64_t hash_f32(const float *data, int ndim, const int64_t *sizes, const int64_t *strides)
{
    kd_view v = {data, KD_ST_FLOAT, 4, ndim, sizes, strides};
    return kd_hash_bitwise(&v);
}

static void test_hash_bitwise(void)
{
    /* straight from the definition */
    int64_t s0[1] = {0}, st[2] = {1, 1};
    kd_view empty = {NULL, KD_ST_FLOAT, 4, 1, s0, st};
    CHECK(kd_hash_bitwise(&empty) == kd_fmix64(0 ^ kd_fmix64(0 ^ 0x6A09E667F3BCC909ull)));
    double one = 1.0;
    uint64_t w;
    memcpy(&w, &one, 8);
    int64_t s1[1] = {1};
    kd_view d1 = {&one, KD_ST_DOUBLE, 8, 1, s1, st};
    uint64_t S = kd_fmix64(w ^ 0x9E3779B97F4A7C15ull);
    CHECK(kd_hash_bitwise(&d1) == kd_fmix64(S ^ kd_fmix64(8 ^ 0x6A09E667F3BCC909ull)));
    /* three bytes: one zero-padded word */
    unsigned char b3[3] = {1, 2, 3};
    int64_t s3[1] = {3};
    kd_view v3 = {b3, KD_ST_BYTE, 1, 1, s3, st};
    CHECK(kd_hash_bitwise(&v3) ==
          kd_fmix64(kd_fmix64(0x030201ull ^ 0x9E3779B97F4A7C15ull) ^ kd_fmix64(3 ^ 0x6A09E667F3BCC909ull)));

    /* a transposed view hashes like its contiguous copy; a slice with an offset too */
    float a[6 * 7];
    for (int i = 0; i < 42; i++)
        a[i] = (float)i * 0.37f - 3.0f;
    float at[7 * 6];
    for (int r = 0; r < 6; r++)
        for (int c = 0; c < 7; c++)
            at[c * 6 + r] = a[r * 7 + c];
    int64_t sz[2] = {6, 7}, stc[2] = {7, 1}, stt[2] = {1, 6};
    CHECK(hash_f32(a, 2, sz, stc) == hash_f32(at, 2, sz, stt));
    int64_t szs[2] = {3, 3}, sts[2] = {14, 2}; /* a[1::2, 2::2]-like view */
    float copy[9];
    for (int r = 0; r < 3; r++)
        for (int c = 0; c < 3; c++)
            copy[r * 3 + c] = a[9 + r * 14 + c * 2];
    int64_t szc[2] = {3, 3}, stcc[2] = {3, 1};
    CHECK(hash_f32(a + 9, 2, szs, sts) == hash_f32(copy, 2, szc, stcc));

    /* every single bit flip changes the hash; swapping two elements does too */
    uint64_t h0 = hash_f32(a, 2, sz, stc);
    int flips_ok = 1;
    for (int i = 0; i < 42; i++)
        for (int bit = 0; bit < 32; bit++) {
            uint32_t u;
            memcpy(&u, &a[i], 4);
            u ^= 1u << bit;
            float saved = a[i];
            memcpy(&a[i], &u, 4);
            if (hash_f32(a, 2, sz, stc) == h0)
                flips_ok = 0;
            a[i] = saved;
        }
    CHECK(flips_ok);
    int swaps_ok = 1;
    for (int i = 0; i < 42; i++)
        for (int j = i + 1; j < 42; j++) {
            float t = a[i];
            a[i] = a[j];
            a[j] = t;
            if (hash_f32(a, 2, sz, stc) == h0)
                swaps_ok = 0;
            a[j] = a[i];
            a[i] = t;
        }
    CHECK(swaps_ok);
    CHECK(hash_f32(a, 2, sz, stc) == h0);
    /* equal pairs do not cancel (unlike an XOR hash) */
    float z2[2] = {0, 0}, p2[2] = {5, 5};
    int64_t s2[1] = {2};
    CHECK(hash_f32(z2, 1, s2, st) != hash_f32(p2, 1, s2, st));
    /* NaNs: equal payloads equal, different payloads different */
    uint32_t n1 = 0x7fc00001, n2 = 0x7fc00002;
    float f1[2], f2[2], f3[2];
    memcpy(&f1[0], &n1, 4), memcpy(&f2[0], &n1, 4), memcpy(&f3[0], &n2, 4);
    f1[1] = f2[1] = f3[1] = 1.0f;
    CHECK(hash_f32(f1, 1, s2, st) == hash_f32(f2, 1, s2, st));
    CHECK(hash_f32(f1, 1, s2, st) != hash_f32(f3, 1, s2, st));
    /* a 0-dim tensor is one element */
    kd_view zero_d = {&one, KD_ST_DOUBLE, 8, 0, NULL, NULL};
    CHECK(kd_hash_bitwise(&zero_d) == kd_hash_bitwise(&d1));
}

/* Note [Gathering short runs] in kd_runs.c: views of one-element runs and of
 * short blocks, larger than the gather buffer, hash exactly like their
 * contiguous copies, with every hash and element size. */
static void test_hash_gathered_views(void)
{
    enum { A = 300, B = 40, C = 3, N = A * B * C };
    static const int types[5][2] = {{KD_ST_BYTE, 1}, {KD_ST_HALF, 2}, {KD_ST_FLOAT, 4},
                                    {KD_ST_DOUBLE, 8}, {KD_ST_COMPLEX_DOUBLE, 16}};
    static unsigned char src[N * 16], cp[N * 16];
    uint64_t x = 0x1234567;
    for (size_t i = 0; i < sizeof src; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        src[i] = (unsigned char)(x >> 56);
    }
    /* memory [A][B][C]; view 0: logical (B, A, C) (bands of rows of blocks
     * of C elements), view 1: logical (C, B, A) (bands of rows of single
     * elements, several bands), view 2: logical (A, B, 1) (rows of single
     * elements further apart than the elements of a row) */
    int64_t szs[3][3] = {{B, A, C}, {C, B, A}, {A, B, 1}};
    int64_t sds[3][3] = {{C, B * C, 1}, {1, C, B * C}, {B * C, C, 1}};
    int64_t stcs[3][3] = {{A * C, C, 1}, {B * A, A, 1}, {B, 1, 1}};
    int ok = 1;
    for (int t = 0; t < 5; t++) {
        int st = types[t][0], is = types[t][1];
        for (int which = 0; which < 3; which++) {
            const int64_t *sz = szs[which], *sd = sds[which];
            int64_t k = 0;
            for (int64_t i = 0; i < sz[0]; i++)
                for (int64_t j = 0; j < sz[1]; j++)
                    for (int64_t l = 0; l < sz[2]; l++, k++)
                        memcpy(cp + k * is, src + (i * sd[0] + j * sd[1] + l * sd[2]) * is, (size_t)is);
            kd_view v = {src, st, is, 3, sz, sd};
            kd_view c = {cp, st, is, 3, sz, stcs[which]};
            if (kd_hash_bitwise(&v) != kd_hash_bitwise(&c))
                ok = 0;
            kd_norm nv, nc;
            int rv = kd_hash_norm(&v, &nv), rc = kd_hash_norm(&c, &nc);
            if (rv != rc || (rv == 0 && (memcmp(&nv.l1, &nc.l1, 8) != 0 || nv.nan != nc.nan ||
                                         nv.posinf != nc.posinf || nv.neginf != nc.neginf)))
                ok = 0;
            uint64_t xv = 0, xc = 1;
            if (kd_hash_xor64(&v, &xv) != kd_hash_xor64(&c, &xc) || xv != xc)
                ok = 0;
        }
    }
    CHECK(ok);
    /* and a transposed view is not hashed like the untransposed one */
    int64_t szt[2] = {A * B, C}, stt[2] = {1, A * B}, szn[2] = {A * B, C}, stn[2] = {C, 1};
    kd_view tv = {src, KD_ST_FLOAT, 4, 2, szt, stt}, nv2 = {src, KD_ST_FLOAT, 4, 2, szn, stn};
    CHECK(kd_hash_bitwise(&tv) != kd_hash_bitwise(&nv2));
}

static void test_decode_and_norm(void)
{
    uint16_t h;
    h = 0x3C00; CHECK(kd_decode_float(KD_ST_HALF, &h) == 1.0);
    h = 0xC000; CHECK(kd_decode_float(KD_ST_HALF, &h) == -2.0);
    h = 0x0001; CHECK(kd_decode_float(KD_ST_HALF, &h) == ldexp(1.0, -24));
    h = 0x7C00; CHECK(isinf(kd_decode_float(KD_ST_HALF, &h)));
    h = 0x3F80; CHECK(kd_decode_float(KD_ST_BFLOAT16, &h) == 1.0);
    unsigned char b;
    b = 0x38; CHECK(kd_decode_float(KD_ST_F8E4M3FN, &b) == 1.0);
    b = 0x7F; CHECK(isnan(kd_decode_float(KD_ST_F8E4M3FN, &b)));
    b = 0x7E; CHECK(kd_decode_float(KD_ST_F8E4M3FN, &b) == 448.0);
    b = 0x3C; CHECK(kd_decode_float(KD_ST_F8E5M2, &b) == 1.0);
    b = 0x7C; CHECK(isinf(kd_decode_float(KD_ST_F8E5M2, &b)));
    b = 0x40; CHECK(kd_decode_float(KD_ST_F8E4M3FNUZ, &b) == 1.0);
    b = 0x80; CHECK(isnan(kd_decode_float(KD_ST_F8E5M2FNUZ, &b)));
    b = 127; CHECK(kd_decode_float(KD_ST_F8E8M0FNU, &b) == 1.0);
    b = 0x01; CHECK(kd_decode_float(KD_ST_F8E4M3FN, &b) == ldexp(1.0, -9));

    float v[6] = {1.5f, -2.0f, NAN, INFINITY, -INFINITY, 0.25f};
    int64_t s[1] = {6}, st[1] = {1};
    kd_view fv = {v, KD_ST_FLOAT, 4, 1, s, st};
    kd_norm n;
    CHECK(kd_hash_norm(&fv, &n) == 0);
    CHECK(n.l1 == 3.75 && n.nan == 1 && n.posinf == 1 && n.neginf == 1);
    int64_t iv[3] = {-3, 4, 16777217}; /* through float32, as upstream */
    int64_t s3[1] = {3};
    kd_view lv = {iv, KD_ST_LONG, 8, 1, s3, st};
    CHECK(kd_hash_norm(&lv, &n) == 0 && n.l1 == 3.0 + 4.0 + 16777216.0);
    float cz[4] = {3, 4, 0, -1}; /* complex64: |3+4i| + |0-1i| */
    int64_t s2[1] = {2};
    kd_view cv = {cz, KD_ST_COMPLEX_FLOAT, 8, 1, s2, st};
    CHECK(kd_hash_norm(&cv, &n) == 0 && n.l1 == 6.0);
    uint64_t x;
    double d2[2] = {1.0, 1.0};
    kd_view dv = {d2, KD_ST_DOUBLE, 8, 1, s2, st};
    CHECK(kd_hash_xor64(&dv, &x) == 0 && x == 0); /* equal pairs cancel, as upstream */
    int32_t i2[2] = {5, 3};
    kd_view i2v = {i2, KD_ST_INT, 4, 1, s2, st};
    CHECK(kd_hash_xor64(&i2v, &x) == 0 && x == (5u ^ 3u));
    kd_view bad = {v, 16, 1, 1, s, st}; /* QUInt4x2: cannot decode */
    CHECK(kd_hash_norm(&bad, &n) == -1);

    /* the stats hash (Note [The stats hash]): the norm's fields, plus the sum
     * and absmax of the finite elements */
    kd_stats S;
    CHECK(kd_hash_stats(&fv, &S) == 0);
    CHECK(S.norm.l1 == 3.75 && S.norm.nan == 1 && S.norm.posinf == 1 && S.norm.neginf == 1);
    CHECK(S.sum == 1.5 - 2.0 + 0.25 && S.absmax == 2.0);
    CHECK(kd_hash_stats(&lv, &S) == 0 && S.sum == -3.0 + 4.0 + 16777217.0 && S.absmax == 16777217.0);
    CHECK(S.norm.l1 == 3.0 + 4.0 + 16777216.0 && S.norm.nan == 0);
    CHECK(kd_hash_stats(&cv, &S) == 0 && S.norm.l1 == 6.0 && S.sum == 3 + 4 + 0 - 1 && S.absmax == 4.0);
    int64_t big[2] = {INT64_MIN, 1};
    kd_view bv = {big, KD_ST_LONG, 8, 1, s2, st};
    CHECK(kd_hash_stats(&bv, &S) == 0 && S.absmax == ldexp(1.0, 63) && S.sum == (double)(INT64_MIN + 1));
    uint64_t ub[2] = {UINT64_MAX, 1}; /* uint64 sums wrap as unsigned */
    kd_view uv = {ub, KD_ST_UINT64, 8, 1, s2, st};
    CHECK(kd_hash_stats(&uv, &S) == 0 && S.sum == 0.0 && S.absmax == (double)UINT64_MAX);
    uint16_t hb[3] = {0x3C00, 0xFC00, 0xC200}; /* half: 1, -inf, -3 */
    kd_view hv = {hb, KD_ST_HALF, 2, 1, s3, st};
    CHECK(kd_hash_stats(&hv, &S) == 0 && S.sum == -2.0 && S.absmax == 3.0 && S.norm.neginf == 1);
    /* a strided view (every other float) gives what its contiguous copy gives */
    float vs[3] = {1.5f, NAN, -INFINITY}; /* v[0], v[2], v[4] */
    int64_t s2s[1] = {3}, st2[1] = {2};
    kd_stats A, C;
    kd_view strided = {v, KD_ST_FLOAT, 4, 1, s2s, st2}, contig = {vs, KD_ST_FLOAT, 4, 1, s2s, st};
    CHECK(kd_hash_stats(&strided, &A) == 0 && kd_hash_stats(&contig, &C) == 0);
    CHECK(A.sum == C.sum && A.absmax == C.absmax && A.norm.l1 == C.norm.l1 && A.norm.nan == C.norm.nan &&
          A.norm.neginf == 1 && C.norm.neginf == 1 && A.sum == 1.5);
    CHECK(kd_hash_stats(&bad, &S) == -1);
    int64_t s0[1] = {0};
    kd_view empty = {NULL, KD_ST_FLOAT, 4, 1, s0, st};
    CHECK(kd_hash_stats(&empty, &S) == 0 && S.sum == 0.0 && S.absmax == 0.0 && S.norm.l1 == 0.0);
}

/* ---- GPU result hand-over (kd_results.c) ---- */

typedef struct got_results {
    int n;
    uint64_t aux[8];
    int w[8];
    uint64_t S[8];
} got_results;

static void take_result(void *owner, uint64_t aux, int w, const kd_cuda_result *res)
{
    got_results *g = owner;
    if (g->n < 8) {
        g->aux[g->n] = aux, g->w[g->n] = w, g->S[g->n] = res->S;
        g->n++;
    }
}

static kd_cuda_result result_with(uint64_t S)
{
    kd_cuda_result r;
    memset(&r, 0, sizeof r);
    r.S = S;
    return r;
}

static void test_results(void)
{
    got_results direct = {0}, anchored = {0};
    /* registered first, delivered later: handed over once, slot freed */
    CHECK(kd_results_expect(0, 5, take_result, &direct, NULL, 77, 1) == 0);
    CHECK(kd_results_waiting() == 1);
    /* another index on the same slot while 5 waits: too many in flight */
    CHECK(kd_results_expect(0, 5 + KD_CUDA_CAPACITY, take_result, &direct, NULL, 0, 0) == -1);
    kd_cuda_result r5 = result_with(555);
    kd_results_deliver(0, 5, &r5);
    CHECK(direct.n == 1 && direct.aux[0] == 77 && direct.w[0] == 1 && direct.S[0] == 555);
    CHECK(kd_results_waiting() == 0);
    kd_results_deliver(0, 5, &r5); /* again: nobody waits, nothing handed */
    CHECK(direct.n == 1);
    /* the same slot, one capacity later: free again; two waiters share one
     * result (identical views queued together) */
    CHECK(kd_results_expect(0, 5 + KD_CUDA_CAPACITY, take_result, &direct, NULL, 78, 0) == 0);
    CHECK(kd_results_expect(0, 5 + KD_CUDA_CAPACITY, take_result, &direct, NULL, 79, 1) == 0);
    CHECK(kd_results_waiting() == 2);
    kd_cuda_result r6 = result_with(666);
    kd_results_deliver(0, 5 + KD_CUDA_CAPACITY, &r6);
    CHECK(direct.n == 3 && direct.S[1] == 666 && direct.S[2] == 666);
    CHECK((direct.aux[1] == 78 && direct.aux[2] == 79) || (direct.aux[1] == 79 && direct.aux[2] == 78));
    CHECK(kd_results_waiting() == 0);
    direct.n = 2; /* as if only one of them had come */

    /* delivered before anyone registered: handed over at registration */
    kd_cuda_result r9 = result_with(999);
    kd_results_deliver(3, 9, &r9);
    CHECK(kd_results_expect(3, 9, take_result, &direct, NULL, 1, 0) == 0);
    CHECK(direct.n == 3 && direct.S[2] == 999);

    /* a forgotten direct owner gets nothing; bad devices are refused */
    CHECK(kd_results_expect(0, 11, take_result, &direct, NULL, 2, 0) == 0);
    CHECK(kd_results_expect(0, 11, take_result, &anchored, NULL, 3, 0) == 0);
    kd_results_forget(0, 11, &direct);
    kd_cuda_result r11 = result_with(11);
    kd_results_deliver(0, 11, &r11);
    CHECK(direct.n == 3 && anchored.n == 1 && anchored.aux[0] == 3 && kd_results_waiting() == 0);
    anchored.n = 0;
    /* many waiters: the pool grows */
    got_results many = {0};
    for (int i = 0; i < 1000; i++)
        CHECK(kd_results_expect(2, 1000 + i, take_result, &many, NULL, (uint64_t)i, 0) == 0);
    CHECK(kd_results_waiting() == 1000);
    for (int i = 0; i < 1000; i++) {
        kd_cuda_result ri = result_with((uint64_t)i);
        kd_results_deliver(2, 1000 + i, &ri);
    }
    CHECK(many.n == 8 && kd_results_waiting() == 0); /* take_result keeps the first 8 */
    CHECK(kd_results_expect(-1, 1, take_result, &direct, NULL, 0, 0) == -1);
    CHECK(kd_results_expect(KD_RESULTS_DEVICES, 1, take_result, &direct, NULL, 0, 0) == -1);

    /* an anchor: results arrive while the owner lives; after the drop they are
     * discarded and the anchor is freed with the last one (ASan checks) */
    kd_result_anchor *a = kd_result_anchor_new(&anchored);
    CHECK(a != NULL);
    for (int64_t i = 20; i < 23; i++)
        CHECK(kd_results_expect(1, i, take_result, NULL, a, (uint64_t)i, 0) == 0);
    CHECK(a->refs == 3);
    kd_cuda_result r20 = result_with(20);
    kd_results_deliver(1, 20, &r20);
    CHECK(anchored.n == 1 && anchored.aux[0] == 20 && a->refs == 2);
    kd_result_anchor_drop(a); /* the owner dies with two in flight */
    kd_cuda_result r21 = result_with(21), r22 = result_with(22);
    kd_results_deliver(1, 21, &r21);
    kd_results_deliver(1, 22, &r22);
    CHECK(anchored.n == 1 && kd_results_waiting() == 0);
    kd_result_anchor_drop(kd_result_anchor_new(&anchored)); /* none in flight: freed at once */
    kd_results_reset();
}

/* Note [Results in flight]: a collect stops at the first held reservation */
static void test_inflight(void)
{
    kd_inflight f;
    memset(&f, 0, sizeof f);
    CHECK(kd_inflight_limit(&f, 100) == 100);            /* nothing held: everything taken */
    CHECK(kd_inflight_add(&f, 40, 8) == 0);
    CHECK(kd_inflight_add(&f, 10, 4) == 0);             /* held out of order (two threads' replays) */
    CHECK(kd_inflight_limit(&f, 100) == 10);
    CHECK(kd_inflight_limit(&f, 5) == 5);               /* never past what was taken */
    CHECK(kd_inflight_done(&f, 10, 0) == 0);
    CHECK(kd_inflight_limit(&f, 100) == 40);
    CHECK(kd_inflight_done(&f, 10, 0) == -1);           /* not held any more */
    CHECK(kd_inflight_done(&f, 41, 0) == -1);           /* no reservation starts there */
    CHECK(kd_inflight_done(&f, 40, 1) == 0);            /* its writer never ran: void */
    CHECK(kd_inflight_limit(&f, 100) == 100 && kd_inflight_held(&f) == 0);
    CHECK(!kd_inflight_is_void(&f, 39) && kd_inflight_is_void(&f, 40) && kd_inflight_is_void(&f, 47) &&
          !kd_inflight_is_void(&f, 48));
    kd_inflight_collected(&f, 47);                      /* partly collected: still known */
    CHECK(kd_inflight_is_void(&f, 47));
    kd_inflight_collected(&f, 48);
    CHECK(!kd_inflight_is_void(&f, 47) && f.used == 0);
    for (int i = 0; i < KD_INFLIGHT_MAX; i++)
        CHECK(kd_inflight_add(&f, 1000 + 10 * i, 10) == 0);
    CHECK(kd_inflight_add(&f, 5000, 1) == -1);          /* full: refused, the caller reserves nothing */
    CHECK(kd_inflight_add(&f, 5000, 0) == -1 && kd_inflight_held(&f) == KD_INFLIGHT_MAX);
    CHECK(kd_inflight_limit(&f, 9000) == 1000);
}

/* Note [Launch timestamps from the TSC]: kd_clock_ns agrees with CLOCK_MONOTONIC
 * before calibration (it is clock_gettime), after it (within the anchor's
 * error), across an anchor older than its limit, and with the TSC turned off. */
static void test_clock(void)
{
    struct timespec pause = {0, 25 * 1000 * 1000};
    kd_clock_anchor(); /* the first pair, where the TSC is usable */
    uint64_t a = kd_clock_monotonic_ns(), b = kd_clock_ns(), c = kd_clock_monotonic_ns();
    CHECK(a <= b && b <= c); /* not calibrated yet: clock_gettime itself */
    nanosleep(&pause, NULL);
    kd_clock_anchor(); /* 25 ms later: calibrated where usable */
    printf("clock: %s\n", kd_clock_uses_tsc() ? "TSC" : "clock_gettime");
    int far = 0;
    uint64_t prev = 0;
    for (int i = 0; i < 2000; i++) {
        uint64_t lo = kd_clock_monotonic_ns(), t = kd_clock_ns(), hi = kd_clock_monotonic_ns();
        /* within 20 us of the clock read around it (the anchor's error is well under 1 us) */
        if (t + 20000 < lo || t > hi + 20000)
            far++;
        CHECK(t + 20000 >= prev); /* never far behind the last reading */
        prev = t;
    }
    CHECK(far == 0);
    /* 1.1 s later the anchor is past its limit: renewed by the read itself, still right */
    struct timespec long_pause = {1, 100 * 1000 * 1000};
    nanosleep(&long_pause, NULL);
    uint64_t lo = kd_clock_monotonic_ns(), t = kd_clock_ns(), hi = kd_clock_monotonic_ns();
    CHECK(t + 20000 >= lo && t <= hi + 20000);
    lo = kd_clock_monotonic_ns(), t = kd_clock_ns(), hi = kd_clock_monotonic_ns();
    CHECK(t + 20000 >= lo && t <= hi + 20000);
    kd_clock_allow_tsc(0);
    CHECK(!kd_clock_uses_tsc());
    a = kd_clock_monotonic_ns(), b = kd_clock_ns(), c = kd_clock_monotonic_ns();
    CHECK(a <= b && b <= c); /* off: clock_gettime again */
    kd_clock_allow_tsc(1);
    kd_clock_anchor();
    CHECK(!kd_clock_uses_tsc()); /* checked again: a first pair, not calibrated yet */
}

int main(void)
{
    test_hash_bitwise();
    test_hash_gathered_views();
    test_decode_and_norm();
    test_ring_basic();
    test_ring_wrap_overwrite();
    test_ring_drop_new();
    test_ring_lost_incremental();
    test_ring_lost_fast();
    test_ring_reuse();
    test_ring_spares();
    test_ring_prefault();
    test_ring_read_to();
    test_ring_in_flight();
    test_ring_scan_and_discard();
    test_ring_threads();
    test_strtab();
    test_render();
    test_arg_walk();
    test_doubles();
    test_results();
    test_inflight();
    test_clock();
    printf("%d checks, %d failed\n", checks, failures);
    return failures ? 1 : 0;
}
