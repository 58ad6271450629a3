/* test_clock_wrapped.c - kd_clock_ns when the clock misbehaves around it
 * (Note [Launch timestamps from the TSC]), with clock_gettime wrapped
 * (-Wl,--wrap=clock_gettime):
 *   - an anchor renewed by kd_clock_ns itself while an interrupt of 200 us
 *     falls inside its read of the clock: the pair is not used, and no
 *     reading runs ahead of the clock (it ran ~200 us ahead for a second);
 *   - a suspend the TSC ran through (the clock 0.5 s behind it from then on):
 *     the next anchor sees the jump, reads the clock until calibrated again,
 *     and then agrees with it (the rate from the first pair was off for the
 *     rest of the process).
 * Both cases found by an adversarial review. */
#include <stdint.h>
#include <time.h>

#include "../core/kd_clock.h"
#include "kd_check.h"

int __real_clock_gettime(clockid_t c, struct timespec *ts);
static volatile int delay_next; /* the next read of the clock waits 200 us first */
static uint64_t behind;         /* the clock runs this far behind the real one */

static uint64_t real_ns(void)
{
    struct timespec ts;
    __real_clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

int __wrap_clock_gettime(clockid_t c, struct timespec *ts)
{
    if (delay_next) {
        delay_next = 0;
        uint64_t t = real_ns();
        while (real_ns() - t < 200000)
            ;
    }
    int r = __real_clock_gettime(c, ts);
    uint64_t n = (uint64_t)ts->tv_sec * 1000000000ull + (uint64_t)ts->tv_nsec - behind;
    ts->tv_sec = (time_t)(n / 1000000000ull);
    ts->tv_nsec = (long)(n % 1000000000ull);
    return r;
}

static void sleep_ns(long ns)
{
    struct timespec p = {ns / 1000000000L, ns % 1000000000L};
    nanosleep(&p, NULL);
}

/* readings outside [lo - 20 us, hi + 20 us] of the clock read around them */
static int far_readings(int n)
{
    int far = 0;
    for (int i = 0; i < n; i++) {
        uint64_t lo = kd_clock_monotonic_ns(), t = kd_clock_ns(), hi = kd_clock_monotonic_ns();
        if (t + 20000 < lo || t > hi + 20000)
            far++;
    }
    return far;
}

int main(void)
{
    kd_clock_anchor();
    sleep_ns(30000000);
    kd_clock_anchor();
    int tsc = kd_clock_uses_tsc();
    CHECK(far_readings(20000) == 0);

    /* the anchor past its age limit: the next read renews it, interrupted */
    sleep_ns(1100000000L);
    delay_next = 1;
    uint64_t lo = kd_clock_monotonic_ns();
    delay_next = 1;
    uint64_t t = kd_clock_ns();
    uint64_t hi = kd_clock_monotonic_ns();
    CHECK(t + 20000 >= lo && t <= hi + 20000);
    CHECK(far_readings(100000) == 0);
    sleep_ns(300000000L);
    CHECK(far_readings(100000) == 0);

    /* a suspend of 0.5 s the TSC ran through: the clock stood still meanwhile */
    kd_clock_anchor();
    sleep_ns(500000000L);
    behind += 500000000ull;
    kd_clock_anchor(); /* sees the jump */
    CHECK(!kd_clock_uses_tsc());
    CHECK(far_readings(20000) == 0);
    sleep_ns(30000000);
    kd_clock_anchor(); /* calibrated again from the pair after the jump */
    CHECK(kd_clock_uses_tsc() == tsc);
    CHECK(far_readings(20000) == 0);
    sleep_ns(500000000L);
    CHECK(far_readings(100000) == 0);
    printf("test_clock_wrapped (%s): %d checks, %d failures\n", tsc ? "TSC" : "clock_gettime", checks, failures);
    return failures != 0;
}
