/* kd_phase_timers.h - where a recorded launch's host time goes, per thread.
 *
 * Note [Phase timers]
 * A diagnostic build (KDEBUG_PHASE_TIMERS=1 python setup.py build_ext
 * --inplace --force) times the parts of every Triton launch the hook sees, on the
 * thread that launches it: kd_launch_begin (describing the arguments into the
 * ring), the launch itself (torch's launcher and the driver), kd_launch_end
 * (hashes queued or deferred, the record committed), a launch while nothing
 * records (the same launcher call, for comparison), and the C++ write guard's
 * callback (Note [C++ write guard]) per dispatcher op.  Each thread adds into
 * a slot of its own (relaxed atomics: the reader may run on another thread);
 * _C._phase_timers() reads them.  The ordinary build compiles every timer
 * to nothing and _C._phase_timers() raises.  tools/flight_cost.py --phases prints them.
 */
#ifndef KD_PHASE_TIMERS_H
#define KD_PHASE_TIMERS_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* find, describe, ring: parts of a Triton launch's begin, not a partition
 * of it (finding the recorder and the kernel's info, counted for unrecorded
 * launches too; describing the arguments; reserving and filling the ring,
 * with the pre-launch hashes launched or queued).  describe and ring are
 * timed in kd_launch_begin, so they also count records that have no begin
 * (C++ launches, the op observer, replica state records).  Left out of all
 * three: the hash settings, the deferred queue's stream guard, the header. */
enum { KD_PT_BEGIN, KD_PT_LAUNCH, KD_PT_END, KD_PT_PLAIN, KD_PT_GUARD, KD_PT_FIND, KD_PT_DESCRIBE, KD_PT_RING,
       KD_PT_PRE, KD_PT_WGUARD, KD_PT_AFTER, KD_PT_PUBLISH, KD_PT_FLUSH, KD_PT_ENQUEUE, KD_PT_N };

#ifdef KD_PHASE_TIMERS
uint64_t kd_pt_now(void);
void kd_pt_add(int phase, uint64_t ns);
#define KD_PT_NOW() kd_pt_now()
#define KD_PT_ADD(phase, t0) kd_pt_add((phase), kd_pt_now() - (t0))
#else
#define KD_PT_NOW() ((uint64_t)0)
#define KD_PT_ADD(phase, t0) ((void)(t0))
#endif

#ifdef __cplusplus
}
#endif

#ifndef __cplusplus
#include <Python.h>
int kd_phase_timers_module_init(PyObject *m);
#endif

#endif
