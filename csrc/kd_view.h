/* kd_view.h - Launch, a read-only view of one stored launch record (kd_view.c). */
#ifndef KD_VIEW_H
#define KD_VIEW_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#include "kd_recorder.h"

extern PyTypeObject kd_LaunchType;

/* A new view of r's stored launch `index`; NULL with an exception on failure. */
PyObject *kd_launch_view_new(kd_recorder *r, uint64_t index);
/* A new view of launch `index` of table tab, held by owner (a LaunchTable,
 * which keeps no argument objects, outputs or custom hashes), linked into the
 * live views at *head; NULL with an exception on failure. */
struct kd_launch_view;
PyObject *kd_table_view_new(PyObject *owner, kd_ltab *tab, struct kd_launch_view **head, uint64_t index);
/* Before r's store is cleared: every live view of its current generation
 * takes its own copy of its record (Note [Launch views keep their record]). */
void kd_launch_views_detach(kd_recorder *r);
/* _inject_detach_faults(n): tests only; the next n record copies fail. */
PyObject *kd_inject_detach_faults(PyObject *m, PyObject *arg);

#endif
