/* kd_inflight.c - Note [Results in flight] (kd_inflight.h). */
#include "kd_inflight.h"

enum { FREE = 0, HELD = 1, VOID = 2 };

int kd_inflight_add(kd_inflight *f, int64_t first, int64_t n)
{
    if (n <= 0 || first < 0)
        return -1;
    for (int i = 0; i < KD_INFLIGHT_MAX; i++) {
        if (f->state[i] == FREE) {
            f->first[i] = first;
            f->n[i] = n;
            f->state[i] = HELD;
            f->used++;
            return 0;
        }
    }
    return -1;
}

int kd_inflight_done(kd_inflight *f, int64_t first, int void_)
{
    for (int i = 0; i < KD_INFLIGHT_MAX; i++) {
        if (f->state[i] == HELD && f->first[i] == first) {
            if (void_) {
                f->state[i] = VOID;
            } else {
                f->state[i] = FREE;
                f->used--;
            }
            return 0;
        }
    }
    return -1;
}

int64_t kd_inflight_limit(const kd_inflight *f, int64_t next)
{
    int64_t lim = next;
    for (int i = 0; i < KD_INFLIGHT_MAX && f->used; i++)
        if (f->state[i] == HELD && f->first[i] < lim)
            lim = f->first[i];
    return lim;
}

int kd_inflight_is_void(const kd_inflight *f, int64_t index)
{
    for (int i = 0; i < KD_INFLIGHT_MAX && f->used; i++)
        if (f->state[i] == VOID && index >= f->first[i] && index - f->first[i] < f->n[i])
            return 1;
    return 0;
}

void kd_inflight_collected(kd_inflight *f, int64_t collected)
{
    for (int i = 0; i < KD_INFLIGHT_MAX && f->used; i++) {
        if (f->state[i] == VOID && f->first[i] + f->n[i] <= collected) {
            f->state[i] = FREE;
            f->used--;
        }
    }
}

int kd_inflight_held(const kd_inflight *f)
{
    int k = 0;
    for (int i = 0; i < KD_INFLIGHT_MAX; i++)
        k += f->state[i] == HELD;
    return k;
}
