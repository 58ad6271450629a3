/* kd_module.h - the kdebug._C module's process-wide tables (kd_module.c),
 * shared by the Python-facing C files. */
#ifndef KD_MODULE_H
#define KD_MODULE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "kd_strtab.h"

/* The process-wide interned string table. */
extern kd_strtab *kd_strings;

/* dtype abbreviations ("f32", ...) indexed by c10::ScalarType. */
extern const char *kd_dtype_names[256];

extern PyObject *kd_stats_type; /* kdebug.hashing.Stats: the KD_T_STATS tree leaf */

#endif
