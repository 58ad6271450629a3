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
    s->nlaunches = 0;
}

void kd_store_drop_front(kd_store *s, uint64_t n)
{
    if (n >= s->nlaunches) {
        kd_store_clear(s);
        return;
    }
    if (n == 0)
        return;
    uint64_t base = s->launch_off[n];
    memmove(s->payloads, &s->payloads[base], (size_t)(s->npayloads - base) * sizeof(kd_payload));
    for (uint64_t i = n; i < s->nlaunches; i++)
        s->launch_off[i - n] = s->launch_off[i] - base;
    s->nlaunches -= n;
    s->npayloads -= base;
}

int kd_store_append(kd_store *s, const kd_payload *p, uint32_t n)
{
    if (n == 0 || p[0].tag != KD_TAG_LAUNCH)
        return -1;
    if (kd_grow((void **)&s->payloads, &s->payload_cap, s->npayloads + n,
                sizeof(kd_payload)) != 0 ||
        kd_grow((void **)&s->launch_off, &s->launch_cap, s->nlaunches + 1,
                sizeof(uint64_t)) != 0)
        return -1;
    memcpy(&s->payloads[s->npayloads], p, (size_t)n * sizeof(kd_payload));
    s->launch_off[s->nlaunches++] = s->npayloads;
    s->npayloads += n;
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
