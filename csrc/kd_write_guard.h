/* kd_write_guard.h - a dispatcher-level guard of deferred GPU work that needs
 * no Python dispatch mode (kd_write_guard.c, Note [C++ write guard]). */
#ifndef KD_WRITE_GUARD_H
#define KD_WRITE_GUARD_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* Installs the guard (once; reference-counted with kd_write_guard_release).
 * Returns 0, or -1 with kd_write_guard_error() saying why.  GIL held. */
int kd_write_guard_acquire(void);
/* 0, or -1 (kd_write_guard_error) when torch would not remove it: still held. */
int kd_write_guard_release(void);
const char *kd_write_guard_error(void);

/* What the deferred queue tells the guard (no GIL needed to read it): 1 while
 * GPU work is queued, 0 once the queue is empty. */
void kd_write_guard_arm(int pending);

/* idle != 0: nothing is queued at a quiet point; the installed callback is
 * disabled in torch until kd_write_guard_idle(0) (Paused between windows, in
 * Note [C++ write guard]).  Not while probing.  Returns -1 (and
 * kd_write_guard_error) only when it could not enable the callback again:
 * nothing may then be left queued.  GIL held. */
int kd_write_guard_idle(int idle);

/* Adds _write_guard_probe / write_guard_stats to module m; -1 with an exception. */
int kd_write_guard_module_init(PyObject *m);

#endif
