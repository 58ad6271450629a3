/* kd_store.c - the drained launch store (kd_store.h). */
#include "kd_store.h"

#include "kd_args.h"
#include "kd_grow.h"

#include <stdlib.h>
#include <string.h>

void kd_store_init(kd_store *s) { memset(s, 0, sizeof *s); }

void kd_store_free(kd_store *s)
{
    free(s->payloads);
    free(s->launch_off);
    kd_store_init(s);
}

void kd_store_clear(kd_store *s)
{
    s->npayloads = 0;
    s->dead = 0;
    s->nlaunches = 0;
    s->front = 0;
}

void kd_store_drop_front(kd_store *s, uint64_t n)
{
    if (n >= s->nlaunches) {
        kd_store_clear(s);
        return;
    }
    s->front += n;
    s->nlaunches -= n;
    s->dead = s->launch_off[s->front];
}

uint64_t kd_store_lower_bound(const kd_store *s, uint64_t want)
{
    uint64_t lo = 0, hi = s->nlaunches;
    while (lo < hi) {
        uint64_t mid = lo + (hi - lo) / 2;
        if (kd_store_launch(s, mid)->launch.launch_index < want)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* Moves the live launches to the front of both arrays (Note [Dropping from
 * the front]). */
static void compact(kd_store *s)
{
    uint64_t dead = s->dead;
    if (dead)
        memmove(s->payloads, &s->payloads[dead], (size_t)(s->npayloads - dead) * sizeof(kd_payload));
    for (uint64_t i = 0; i < s->nlaunches; i++)
        s->launch_off[i] = s->launch_off[s->front + i] - dead;
    s->npayloads -= dead;
    s->dead = 0;
    s->front = 0;
}

/* Room for one more launch of n payloads; -1 when out of memory (the store
 * is unchanged but perhaps compacted). */
static int make_room(kd_store *s, uint32_t n)
{
    if (s->npayloads + n <= s->payload_cap && s->front + s->nlaunches + 1 <= s->launch_cap)
        return 0;
    if (s->dead || s->front) {
        compact(s);
        /* twice what is live, so that the next compaction is as far away as this one moved */
        uint64_t want_p = 2 * (s->npayloads + n), want_l = 2 * (s->nlaunches + 1);
        if (want_p > s->payload_cap)
            (void)kd_grow((void **)&s->payloads, &s->payload_cap, want_p, sizeof(kd_payload));
        if (want_l > s->launch_cap)
            (void)kd_grow((void **)&s->launch_off, &s->launch_cap, want_l, sizeof(uint64_t));
    }
    if (kd_grow((void **)&s->payloads, &s->payload_cap, s->npayloads + n, sizeof(kd_payload)) != 0 ||
        kd_grow((void **)&s->launch_off, &s->launch_cap, s->front + s->nlaunches + 1, sizeof(uint64_t)) != 0)
        return -1;
    return 0;
}

kd_payload *kd_store_room(kd_store *s, uint32_t n)
{
    if (n == 0 || make_room(s, n) != 0)
        return NULL;
    return &s->payloads[s->npayloads];
}

void kd_store_take(kd_store *s, uint32_t n)
{
    s->launch_off[s->front + s->nlaunches++] = s->npayloads;
    s->npayloads += n;
}

int kd_store_append(kd_store *s, const kd_payload *p, uint32_t n)
{
    if (n == 0 || p[0].tag != KD_TAG_LAUNCH)
        return -1;
    kd_payload *dst = kd_store_room(s, n);
    if (dst == NULL)
        return -1;
    memcpy(dst, p, (size_t)n * sizeof(kd_payload));
    kd_store_take(s, n);
    return 0;
}

uint32_t kd_launch_arg_offset(const kd_payload *launch, uint32_t k)
{
    kd_arg_iter it = kd_args_begin(launch, 1u + launch->launch.nslots);
    while (kd_args_next(&it))
        if (it.index == k)
            return it.off;
    return 0;
}
