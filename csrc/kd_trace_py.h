/* kd_trace_py.h - TraceWriter and TraceReader, the Python faces of the trace
 * format (kd_trace_py.c). */
#ifndef KD_TRACE_PY_H
#define KD_TRACE_PY_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "kd_trace.h"

/* Adds TraceWriter, TraceReader and TraceError to module m; -1 with an
 * exception on failure. */
int kd_trace_module_init(PyObject *m);
extern PyTypeObject kd_TraceWriterType;
extern PyTypeObject kd_TraceReaderType;

/* The trace a TraceReader holds, and in *map its file string id -> global id
 * map (made on first use, zeroed; kd_ltab_fill_trace fills it); NULL with an
 * exception when out of memory. */
const kd_tr *kd_trace_reader_ids(PyObject *reader, uint32_t **map);

#endif
