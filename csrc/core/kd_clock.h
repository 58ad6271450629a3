/* kd_clock.h - the clock of launch timestamps: CLOCK_MONOTONIC in
 * nanoseconds, read from the CPU's time-stamp counter where that is safe
 * (Note [Launch timestamps from the TSC] in kd_clock.c). */
#ifndef KD_CLOCK_H
#define KD_CLOCK_H

#include <stdint.h>

/* CLOCK_MONOTONIC now, in ns, from clock_gettime. */
uint64_t kd_clock_monotonic_ns(void);

/* CLOCK_MONOTONIC now, in ns: from the TSC once kd_clock_anchor has found it
 * usable and calibrated it, else from clock_gettime.  Any thread; no
 * allocation, no lock. */
uint64_t kd_clock_ns(void);

/* Where a microsecond does not matter (a recording's start, a drain): checks
 * the TSC once, calibrates it against CLOCK_MONOTONIC and anchors it again.
 * Any thread. */
void kd_clock_anchor(void);

/* What kd_clock_ns reads: 1 the TSC, 0 clock_gettime. */
int kd_clock_uses_tsc(void);

/* Tests: 0 turns the TSC off (clock_gettime from now on), 1 lets kd_clock_anchor
 * use it again where it is usable. */
void kd_clock_allow_tsc(int allow);

#endif
