/* test_ring_threads.c - the ring under concurrent writers and a concurrent
 * reader, as Note [Ring concurrency] (kd_ring.h) allows: built with
 * ThreadSanitizer by `make -C csrc tsan` (and with ASan/UBSan by `make test`).
 *
 * Each writer thread writes launches of 1 to 5 slots whose every payload byte
 * says (writer, sequence number, slot); the reader drains while they write
 * and checks every launch it gets is whole, in each writer's order, and that
 * read + refused accounts for every launch written. */
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <string.h>

#include "../core/kd_ring.h"
#include "kd_check.h"

#define WRITERS 4
#define PER_WRITER 20000

typedef struct {
    kd_ring *ring;
    int id;
    uint64_t written; /* launches reserved and committed */
} writer_arg;

static _Atomic int writers_left;
static _Atomic uint64_t reader_passes; /* reads that returned launches */

/* The byte every non-header payload of launch (writer, seq) holds at slot i. */
static uint8_t fill_byte(int writer, uint64_t seq, uint32_t i)
{
    return (uint8_t)(writer * 31 + seq * 7 + i * 13 + 1);
}

static uint32_t launch_slots(uint64_t seq) { return 1 + (uint32_t)(seq % 5); }

static void *writer(void *p)
{
    writer_arg *w = p;
    for (uint64_t seq = 0; seq < PER_WRITER; seq++) {
        if (seq == PER_WRITER / 2)
            while (atomic_load(&reader_passes) == 0)
                sched_yield(); /* planted: the reader runs while writers are mid-way */
        uint32_t n = launch_slots(seq);
        uint64_t first;
        if (kd_ring_reserve(w->ring, n, &first) != 0)
            continue; /* refused: the ring counts it */
        kd_payload *h = kd_ring_payload(w->ring, first);
        memset(h, 0, sizeof *h);
        h->launch.tag = KD_TAG_LAUNCH;
        h->launch.nslots = (uint16_t)(n - 1);
        h->launch.thread_id = (uint64_t)w->id;
        h->launch.launch_index = seq;
        for (uint32_t i = 1; i < n; i++)
            memset(kd_ring_payload(w->ring, first + i), fill_byte(w->id, seq, i), sizeof(kd_payload));
        if (kd_ring_commit(w->ring, first, n))
            w->written++;
    }
    atomic_fetch_sub(&writers_left, 1);
    return NULL;
}

typedef struct {
    uint64_t next_min[WRITERS]; /* every later launch of writer w has seq >= this */
    uint64_t got[WRITERS];
    uint64_t bad;
} reader_state;

static int visit(void *ctx, uint64_t first, const kd_payload *p, uint32_t n)
{
    (void)first;
    reader_state *st = ctx;
    uint64_t w = p[0].launch.thread_id, seq = p[0].launch.launch_index;
    if (p[0].tag != KD_TAG_LAUNCH || w >= WRITERS || n != launch_slots(seq) || seq < st->next_min[w]) {
        st->bad++;
        return 0;
    }
    for (uint32_t i = 1; i < n; i++)
        for (size_t b = 0; b < sizeof(kd_payload); b++)
            if (p[i].bytes[b] != fill_byte((int)w, seq, i)) {
                st->bad++;
                return 0;
            }
    st->next_min[w] = seq + 1;
    st->got[w]++;
    return 0;
}

/* Runs WRITERS writers against a ring of `capacity` slots while this thread
 * drains it; checks the launches read and the accounting. */
static void run(uint64_t capacity, int policy)
{
    kd_ring *ring = kd_ring_new(capacity, policy);
    CHECK(ring != NULL);
    if (ring == NULL)
        return;
    static kd_payload scratch[8];
    reader_state st;
    memset(&st, 0, sizeof st);
    writer_arg args[WRITERS];
    pthread_t th[WRITERS];
    atomic_store(&writers_left, WRITERS);
    for (int i = 0; i < WRITERS; i++) {
        args[i] = (writer_arg){ring, i, 0};
        CHECK(pthread_create(&th[i], NULL, writer, &args[i]) == 0);
    }
    atomic_store(&reader_passes, 0);
    int64_t ok = 0;
    while (atomic_load(&writers_left) > 0) {
        int64_t got = kd_ring_read(ring, scratch, 8, visit, &st);
        ok |= got < 0;
        if (got > 0)
            atomic_fetch_add(&reader_passes, 1);
    }
    CHECK(ok == 0);
    CHECK(atomic_load(&reader_passes) > 0); /* it read while writers were still writing */
    for (int i = 0; i < WRITERS; i++)
        pthread_join(th[i], NULL);
    CHECK(kd_ring_read(ring, scratch, 8, visit, &st) >= 0); /* what is left */
    uint64_t written = 0, got = 0;
    for (int i = 0; i < WRITERS; i++) {
        written += args[i].written;
        got += st.got[i];
    }
    CHECK(st.bad == 0);
    CHECK(got == written);
    CHECK(atomic_load(&ring->committed) == written);
    CHECK(written + atomic_load(&ring->refused) == (uint64_t)WRITERS * PER_WRITER);
    CHECK(kd_ring_lost(ring) == atomic_load(&ring->refused));
    if (policy == KD_RING_DROP_NEW)
        CHECK(written > 0);
    kd_ring_free(ring);
}

int main(void)
{
    /* drop_new: a small ring, full most of the time; the writers wait on the
     * reader's cursor and never write over a slot it has not read */
    run(64, KD_RING_DROP_NEW);
    /* overwrite: only safe beside a reader while no writer laps it (the ring
     * holds every launch here; lapping readers are serialized by the GIL in
     * kdebug, and kd_ring's single-threaded tests cover lapping) */
    run((uint64_t)WRITERS * PER_WRITER * 5, KD_RING_OVERWRITE);
    printf("%d checks, %d failed\n", checks, failures);
    return failures != 0;
}
