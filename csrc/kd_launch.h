/* kd_launch.h - the launch hot path (kd_launch.c): which recorder a launch
 * goes to, and writing a launch into its ring. */
#ifndef KD_LAUNCH_H
#define KD_LAUNCH_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#include "kd_hook.h"
#include "kd_recorder.h"

extern _Thread_local int kd_tls_compiling;
extern _Thread_local kd_recorder *kd_tls_recorder;
extern kd_recorder *kd_global_recorder;
extern long kd_started_recorders;
extern long kd_injected_faults;
/* Set around a launch whose GPU hashes must run at once rather than wait in
 * the deferred queue (a replica state record, Note [Replica state records]). */
extern _Thread_local int kd_tls_hash_now;

/* This thread's hash settings (Note [Hash settings per thread] in kd_recorder.h). */
extern _Thread_local kd_hash_config kd_hcfg;

/* kd_hcfg changed on this thread: recorders this thread started see it. */
void kd_hcfg_publish(void);

/* CLOCK_MONOTONIC in ns, the launch timestamps' clock. */
uint64_t kd_now_ns(void);

/* The recorder that launches on this thread go to, or NULL.  Also NULL while
 * this thread is compiling or Inductor is benchmarking. */
kd_recorder *kd_active_recorder(void);

/* Note [Launches no recording follows]
 * A recording follows the thread that entered it and the threads torch
 * starts from it (or every thread: record_all_threads).  A compiled kernel
 * launched on another thread while any recorder is started (a worker thread
 * running the compiled model, a thread pool) is in no recording: the hook
 * passes it through, and an in-process comparison or a hunt saw nothing of
 * it and reported the runs as matching.  The launch hooks count such launches
 * here (GIL held), compile-time and benchmarking launches excepted; a
 * DebugMode takes the count's growth over its lifetime as launches it
 * missed (kernel_stats["other_thread_launches"]: not complete). */
extern uint64_t kd_unfollowed_launches;

/* A hook found no recorder for this launch (kd_active_recorder gave NULL):
 * counts it when a recorder is started and none follows this thread. */
void kd_note_unrecorded_launch(void);

/* Whether a started recorder records this thread's launches: its own, the
 * one torch carried to it (autograd's device threads) or a global one.  No
 * side effect (kd_active_recorder counts suppressed launches).  GIL held. */
int kd_recording_here(void);
/* The recorder kd_recording_here finds (borrowed), or NULL. */
kd_recorder *kd_recorder_here(void);

/* A launch issued from C++ (the C++ wrapper hook, the C++ op observer) runs
 * on the current stream of its tensor o's device: sets info's device and
 * *stream (0 for CPU) from o and returns 1, or 0 when o is no tensor. */
int kd_launch_device_of(PyObject *o, kd_kernel_info *info, uint64_t *stream);

/* A launch being recorded: begun before the kernel runs, ended after. */
typedef struct kd_pending {
    uint64_t first;
    uint32_t n;
    int ok;
    uint64_t launch_index;
    uint64_t stream;
    uint32_t kernel_name_id; /* the kernel's name in kd_strings */
    kd_hash_config cfg; /* as it was when the launch began */
} kd_pending;

/* fn(filter_id, recorder, kernel_name, launch_index) -> bool: whether a launch
 * under a record_outputs filter keeps its outputs (set by _set_output_filter;
 * Note [Recorded values on disk] in kdebug/values.py). */
extern PyObject *kd_output_filter_fn;

/* Describes the launch of kernel info with arguments args[0..nargs) into the
 * ring.  Never raises; failures are counted on r. */
void kd_launch_begin(kd_recorder *r, kd_kernel_info *info, PyObject *const *args,
                     Py_ssize_t nargs, uint64_t stream, kd_pending *p);

/* Completes the launch: grid/config from the thread's capture, timing, the
 * raised flag; then commits it. */
void kd_launch_end(kd_recorder *r, kd_pending *p, PyObject *const *args, Py_ssize_t nargs,
                   int raised);

/* Note [Records made in one pass] (kd_launch.c): the record of a launch that
 * ran already, or of tensors no kernel writes, made as kd_launch_begin +
 * kd_launch_end back to back would make it (raised = 0), in one pass.
 * Returns 1 when it did (*recorded: 1 when the record is in the ring, 0 when
 * it was counted as unrecorded or refused, as the two calls count it), 0
 * when it declined without doing anything (the caller makes the two
 * calls). */
int kd_launch_record(kd_recorder *r, kd_kernel_info *info, PyObject *const *args, Py_ssize_t nargs,
                     uint64_t stream, int *recorded);

/* Whether kd_launch_record may run (1, the default) or always declines (0:
 * kdebug.testing compares the two paths' records); returns the old value. */
int kd_launch_record_enable(int on);

#endif
