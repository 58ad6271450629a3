/* test_clock_threads.c - kd_clock_ns read by several threads while anchors
 * are renewed (Note [Launch timestamps from the TSC]): every reading stays
 * near CLOCK_MONOTONIC, under ASan/UBSan and under ThreadSanitizer
 * (make -C csrc test / make -C csrc tsan). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>

#include "../core/kd_clock.h"
#include "kd_check.h"

#define READERS 4
#define READS 200000

static _Atomic int far_off;
static _Atomic int stop;

static void *reader(void *arg)
{
    (void)arg;
    for (int i = 0; i < READS; i++) {
        uint64_t lo = kd_clock_monotonic_ns(), t = kd_clock_ns(), hi = kd_clock_monotonic_ns();
        /* a sanitized thread can be preempted between the reads: only a reading
         * outside [lo, hi] by more than 50 us counts */
        if (t + 50000 < lo || t > hi + 50000)
            atomic_fetch_add(&far_off, 1);
    }
    return NULL;
}

static void *anchorer(void *arg)
{
    (void)arg;
    struct timespec pause = {0, 200 * 1000};
    while (!atomic_load(&stop)) {
        kd_clock_anchor();
        nanosleep(&pause, NULL);
    }
    return NULL;
}

int main(void)
{
    struct timespec pause = {0, 25 * 1000 * 1000};
    kd_clock_anchor();
    nanosleep(&pause, NULL);
    kd_clock_anchor();
    pthread_t r[READERS], a;
    pthread_create(&a, NULL, anchorer, NULL);
    for (int i = 0; i < READERS; i++)
        pthread_create(&r[i], NULL, reader, NULL);
    for (int i = 0; i < READERS; i++)
        pthread_join(r[i], NULL);
    atomic_store(&stop, 1);
    pthread_join(a, NULL);
    CHECK(atomic_load(&far_off) == 0);
    printf("test_clock_threads (%s): %d checks, %d failures\n", kd_clock_uses_tsc() ? "TSC" : "clock_gettime",
           checks, failures);
    return failures != 0;
}
