/* kd_runs.h - iterating a strided view in logical order, as contiguous byte
 * runs (kd_runs.c), for the CPU hashes (kd_hash.c).  Python-free. */
#ifndef KD_RUNS_H
#define KD_RUNS_H

#include <stdint.h>

#include "kd_hash.h"

/* A hash's run function: takes nbytes of whole elements at p, in logical order. */
typedef void (*kd_run_fn)(void *ctx, const unsigned char *p, uint64_t nbytes);

/* Calls fn for each maximal run of elements contiguous in memory and in
 * logical order (short runs gathered: Note [Gathering short runs] in
 * kd_runs.c).  Returns the number of elements. */
uint64_t kd_for_each_run(const kd_view *v, kd_run_fn fn, void *ctx);

#endif
