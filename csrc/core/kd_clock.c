/* kd_clock.c - the clock of launch timestamps.
 *
 * Note [Launch timestamps from the TSC]
 * Every recorded launch takes two timestamps (before the launch call and
 * after it returned), CLOCK_MONOTONIC in ns.  clock_gettime through the vDSO
 * costs about 40 ns in a loop of its own but 100-150 ns inside a training
 * step (measured with perf on the H200 host: its seqlock page and the
 * ordered rdtscp it uses run cold between launches), two per launch: about
 * 35 us of a 8.6 ms flight-recorder step.  So the hot path reads the CPU's
 * time-stamp counter itself and converts it with an anchor:
 *
 *     ns = anchor_ns + ((tsc - anchor_tsc) * mult) >> 32
 *
 * (a 64x64 -> 128-bit multiply; mult is ns per tick in 32.32 fixed point).
 *
 *   - When.  Only where the TSC is what the kernel itself reads for
 *     CLOCK_MONOTONIC: x86-64, the CPU says its TSC is invariant (CPUID
 *     0x80000007 EDX bit 8: constant rate, runs in every C-state), and the
 *     kernel's current clocksource is "tsc" (it checked the TSC's
 *     synchronization across CPUs at boot, and it would switch away from a
 *     TSC it found unstable).  KDEBUG_TSC=0 turns it off.  Anywhere else,
 *     and until calibrated, kd_clock_ns is clock_gettime.
 *   - Calibration.  kd_clock_anchor runs where a microsecond does not matter
 *     (a recording's start, a drain).  Its first call takes a pair (tsc, ns)
 *     -- the tightest of three reads of clock_gettime between two rdtsc --
 *     and later calls, once 20 ms have passed, set mult from that first pair
 *     and a new one: the longer the baseline, the better the rate.  The rate
 *     is CLOCK_MONOTONIC's own, NTP's frequency correction included.
 *   - Anchors.  Each anchor is a fresh pair, so the error never accumulates
 *     from one anchor to the next.  An anchor older than about a second (in
 *     ticks at the calibrated rate) is renewed by kd_clock_ns itself: that
 *     call reads a pair and returns its clock.  A TSC that went backwards (it
 *     must not, with this clocksource) reads as an old anchor too.  Within a
 *     second the difference from CLOCK_MONOTONIC is the rate's error times
 *     the time since the anchor (well under a microsecond for a 20 ms
 *     baseline read to within ~100 ns, and shrinking as the baseline grows)
 *     plus what NTP's slewing changed since (at most its slew rate, 500 ppm,
 *     times that second).  Timestamps are for durations and timelines, never
 *     for order (launch indices order launches; kdebug's timeouts read
 *     kd_clock_monotonic_ns), and a launch's end is never stored before its
 *     start (kd_launch.c).
 *   - Pairs that are not used (found by an adversarial review).  A pair read
 *     across an interrupt or a preemption (more than 5 us from rdtsc to
 *     rdtsc) would put the anchor ahead of the clock by the delay, for every
 *     thread, until the next one: such pairs are not published.  A pair that
 *     the current anchor misses by more than 50 us and 2000 ppm of its age
 *     means the TSC and the clock came apart (a suspend the TSC counted
 *     through: the rate from the first pair would be wrong for the rest of
 *     the process): it becomes the new first pair, and kd_clock_ns reads the
 *     clock until an anchor 20 ms later calibrates again.  tsc_usable is
 *     asked again at most every 10 s by anchors (a clocksource the kernel's
 *     watchdog moved off the TSC, KDEBUG_TSC set later), and a child forked
 *     while another thread wrote the anchor releases the lock.
 *     csrc/tests/test_clock_wrapped.c plants the first two.
 *   - Threads.  The anchor is published under a sequence lock: the writer
 *     (whoever holds the try-lock `writing`; a thread that finds it taken
 *     does not wait) makes the sequence odd, stores the fields and makes it
 *     even again; a reader that sees an odd or changed sequence reads
 *     clock_gettime instead.  Every field is an atomic: no data race for
 *     TSan.  No allocation, no lock, no system call on the hot path.
 */
#include "kd_clock.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(KD_CLOCK_NO_TSC)
#include <cpuid.h>
#include <x86intrin.h>
#define KD_CLOCK_TSC 1
__extension__ typedef unsigned __int128 kd_u128;
#else
#define KD_CLOCK_TSC 0
#endif

enum { MODE_UNCHECKED = 0, MODE_OFF = 1, MODE_UNCALIBRATED = 2, MODE_TSC = 3 };

#define CAL_MIN_NS 20000000ull   /* a baseline of 20 ms before the rate is trusted */
#define ANCHOR_MAX_NS 1000000000ull /* anchors older than this are renewed */

static _Atomic int mode = MODE_UNCHECKED;
static _Atomic int allowed = 1;
static atomic_flag writing = ATOMIC_FLAG_INIT;
#if KD_CLOCK_TSC
static _Atomic uint32_t seq;
static _Atomic uint64_t a_tsc, a_ns, a_mult, a_limit; /* the anchor; a_limit: its age limit in ticks */
static uint64_t cal_tsc, cal_ns;                      /* the first pair (written under `writing`) */
static uint64_t checked_ns;                           /* when tsc_usable last said yes (under `writing`) */
#endif

uint64_t kd_clock_monotonic_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

#if KD_CLOCK_TSC
static int tsc_usable(void)
{
    const char *env = getenv("KDEBUG_TSC");
    if (env != NULL && strcmp(env, "0") == 0)
        return 0;
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid(0x80000000u, &a, &b, &c, &d) || a < 0x80000007u)
        return 0;
    if (!__get_cpuid(0x80000007u, &a, &b, &c, &d) || !(d & (1u << 8)))
        return 0; /* not invariant */
    FILE *f = fopen("/sys/devices/system/clocksource/clocksource0/current_clocksource", "r");
    if (f == NULL)
        return 0;
    char buf[32] = {0};
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == ' '))
        buf[--n] = '\0';
    return strcmp(buf, "tsc") == 0;
}

/* A (tsc, ns) pair: the tightest of three clock_gettime calls between two rdtsc;
 * returns that read's width in ticks (UINT64_MAX: no pair). */
static uint64_t read_pair(uint64_t *tsc, uint64_t *ns)
{
    uint64_t best = UINT64_MAX;
    for (int i = 0; i < 3; i++) {
        uint64_t t0 = __rdtsc();
        uint64_t n = kd_clock_monotonic_ns();
        uint64_t t1 = __rdtsc();
        if (t1 >= t0 && t1 - t0 < best) {
            best = t1 - t0;
            *tsc = t0 + (t1 - t0) / 2;
            *ns = n;
        }
    }
    if (best == UINT64_MAX) { /* the counter went backwards each time: no pair */
        *tsc = 0;
        *ns = 0;
    }
    return best;
}

#define RECHECK_NS 10000000000ull /* anchors ask tsc_usable again at most this often */

/* A child forked while another thread wrote the anchor holds the lock and an
 * odd sequence forever (that thread is gone): released in the child. */
static void after_fork_in_child(void)
{
    atomic_flag_clear_explicit(&writing, memory_order_relaxed);
    const uint32_t s = atomic_load_explicit(&seq, memory_order_relaxed);
    if (s & 1)
        atomic_store_explicit(&seq, s + 1, memory_order_relaxed);
}

#define PAIR_MAX_NS 5000ull    /* a pair read over more than this (an interrupt, a preemption) is not used */
#define JUMP_MAX_PPM 2000ull   /* the clock and the TSC parted by more than this since the last anchor: a
                                * discontinuity (a suspend the TSC ran through): calibrate afresh */

/* With `writing` held: calibrates from the first pair to (t, n) and publishes
 * (t, n) as the anchor; 0 when the baseline is still too short. */
static int publish(uint64_t t, uint64_t n)
{
    if (atomic_load_explicit(&mode, memory_order_relaxed) == MODE_TSC) {
        /* where the current anchor puts t, against where the clock says it is */
        const uint64_t t0 = atomic_load_explicit(&a_tsc, memory_order_relaxed);
        const uint64_t n0 = atomic_load_explicit(&a_ns, memory_order_relaxed);
        const uint64_t m0 = atomic_load_explicit(&a_mult, memory_order_relaxed);
        if (t > t0) {
            const uint64_t age = (uint64_t)(((kd_u128)(t - t0) * m0) >> 32); /* by the TSC */
            const uint64_t pred = n0 + age;
            const uint64_t err = pred > n ? pred - n : n - pred;
            if (err > 50000 && (kd_u128)err * 1000000u > (kd_u128)age * JUMP_MAX_PPM) {
                cal_tsc = t; /* a new first pair; kd_clock_ns reads the clock until calibrated again */
                cal_ns = n;
                atomic_store_explicit(&mode, MODE_UNCALIBRATED, memory_order_release);
                return 0;
            }
        }
    }
    if (t <= cal_tsc || n < cal_ns + CAL_MIN_NS)
        return 0;
    const uint64_t dt = t - cal_tsc, dn = n - cal_ns;
    const uint64_t mult = (uint64_t)(((kd_u128)dn << 32) / dt);
    if (mult == 0)
        return 0;
    const uint64_t limit = (uint64_t)(((kd_u128)ANCHOR_MAX_NS * dt) / dn);
    const uint32_t s = atomic_load_explicit(&seq, memory_order_relaxed);
    atomic_store_explicit(&seq, s + 1, memory_order_relaxed);
    atomic_thread_fence(memory_order_release);
    atomic_store_explicit(&a_tsc, t, memory_order_relaxed);
    atomic_store_explicit(&a_ns, n, memory_order_relaxed);
    atomic_store_explicit(&a_mult, mult, memory_order_relaxed);
    atomic_store_explicit(&a_limit, limit, memory_order_relaxed);
    atomic_store_explicit(&seq, s + 2, memory_order_release);
    return 1;
}
#endif

void kd_clock_anchor(void)
{
#if KD_CLOCK_TSC
    if (atomic_flag_test_and_set_explicit(&writing, memory_order_acquire))
        return; /* another thread anchors now */
    int m = atomic_load_explicit(&mode, memory_order_relaxed);
    if (!atomic_load_explicit(&allowed, memory_order_relaxed)) {
        atomic_store_explicit(&mode, MODE_OFF, memory_order_release);
    } else if (m == MODE_UNCHECKED) {
        static int atfork_added;
        if (!atfork_added)
            atfork_added = pthread_atfork(NULL, NULL, after_fork_in_child) == 0;
        if (!tsc_usable()) {
            atomic_store_explicit(&mode, MODE_OFF, memory_order_release);
        } else {
            read_pair(&cal_tsc, &cal_ns);
            checked_ns = cal_ns;
            atomic_store_explicit(&mode, cal_ns ? MODE_UNCALIBRATED : MODE_OFF, memory_order_release);
        }
    } else if (m == MODE_UNCALIBRATED || m == MODE_TSC) {
        uint64_t t = 0, n = 0;
        const uint64_t w = read_pair(&t, &n);
        if (n != 0 && n - checked_ns > RECHECK_NS) {
            if (tsc_usable()) {
                checked_ns = n;
            } else { /* the kernel moved off the TSC (its watchdog found it unstable), or KDEBUG_TSC=0 was set */
                atomic_store_explicit(&mode, MODE_OFF, memory_order_release);
                n = 0; /* nothing published */
            }
        }
        const uint64_t m0 = atomic_load_explicit(&a_mult, memory_order_relaxed);
        if (n != 0 && (m0 == 0 || (uint64_t)(((kd_u128)w * m0) >> 32) <= PAIR_MAX_NS) && publish(t, n))
            atomic_store_explicit(&mode, MODE_TSC, memory_order_release);
    }
    atomic_flag_clear_explicit(&writing, memory_order_release);
#endif
}

uint64_t kd_clock_ns(void)
{
#if KD_CLOCK_TSC
    if (atomic_load_explicit(&mode, memory_order_acquire) != MODE_TSC)
        return kd_clock_monotonic_ns();
    const uint32_t s1 = atomic_load_explicit(&seq, memory_order_acquire);
    const uint64_t t0 = atomic_load_explicit(&a_tsc, memory_order_relaxed);
    const uint64_t n0 = atomic_load_explicit(&a_ns, memory_order_relaxed);
    const uint64_t mult = atomic_load_explicit(&a_mult, memory_order_relaxed);
    const uint64_t limit = atomic_load_explicit(&a_limit, memory_order_relaxed);
    atomic_thread_fence(memory_order_acquire);
    const uint32_t s2 = atomic_load_explicit(&seq, memory_order_relaxed);
    const uint64_t t = __rdtsc();
    const uint64_t d = t - t0;
    if ((s1 & 1) || s1 != s2 || d > limit) {
        /* being written, or an old anchor (or a counter that went backwards): the
         * clock itself, and a new anchor where no other thread is writing one */
        if (!(s1 & 1) && s1 == s2 && !atomic_flag_test_and_set_explicit(&writing, memory_order_acquire)) {
            /* a bracketed pair (rdtsc, clock, rdtsc), used only when read without an interruption */
            uint64_t pt = 0, pn = 0;
            const uint64_t w = read_pair(&pt, &pn);
            if (pn != 0 && atomic_load_explicit(&mode, memory_order_relaxed) == MODE_TSC &&
                atomic_load_explicit(&seq, memory_order_relaxed) == s1 &&
                (uint64_t)(((kd_u128)w * mult) >> 32) <= PAIR_MAX_NS)
                publish(pt, pn);
            atomic_flag_clear_explicit(&writing, memory_order_release);
            if (pn != 0)
                return pn;
        }
        return kd_clock_monotonic_ns();
    }
    return n0 + (uint64_t)(((kd_u128)d * mult) >> 32);
#else
    return kd_clock_monotonic_ns();
#endif
}

int kd_clock_uses_tsc(void) { return atomic_load_explicit(&mode, memory_order_acquire) == MODE_TSC; }

void kd_clock_allow_tsc(int allow)
{
    while (atomic_flag_test_and_set_explicit(&writing, memory_order_acquire))
        ; /* an anchor being written: it takes well under a microsecond */
    atomic_store_explicit(&allowed, allow ? 1 : 0, memory_order_relaxed);
    if (!allow) {
        atomic_store_explicit(&mode, MODE_OFF, memory_order_release);
    } else {
        int expect = MODE_OFF;
        /* checked again from the start by the next kd_clock_anchor */
        atomic_compare_exchange_strong_explicit(&mode, &expect, MODE_UNCHECKED, memory_order_acq_rel,
                                                memory_order_relaxed);
    }
    atomic_flag_clear_explicit(&writing, memory_order_release);
}
