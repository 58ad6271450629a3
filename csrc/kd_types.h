/* kd_types.h - the named types that cross between the C extension and Python
 * (Note [Typed boundaries] in kd_types.c). */
#ifndef KD_TYPES_H
#define KD_TYPES_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* C -> Python: struct sequences, made once by kd_types_module_init and
 * registered on the module under their names (TensorArg, ScalarArg, ...). */
extern PyTypeObject *kd_TensorArgType;    /* a kernel's tensor argument (Launch.args) */
extern PyTypeObject *kd_ScalarArgType;    /* a kernel's non-tensor argument (Launch.args) */
extern PyTypeObject *kd_ArgHashesType;    /* one argument's hash record (Launch.hashes) */
extern PyTypeObject *kd_PendingCallType;  /* an aten call whose hashes are still on the GPU */
extern PyTypeObject *kd_ExtentType;       /* the bytes a tensor leaf covers (tree_extents) */
extern PyTypeObject *kd_OpExtentsType;    /* an aten call's input and output extent trees */
extern PyTypeObject *kd_TraceOpType;      /* a trace's op record (TraceReader.op) */
extern PyTypeObject *kd_LastWriteType;    /* TraceReader.last_writer's answer */
extern PyTypeObject *kd_TraceTableType;   /* TraceReader.table's three row buffers */
extern PyTypeObject *kd_HashConfigType;   /* _set_hash_config's previous settings */
extern PyTypeObject *kd_OutputConfigType; /* _set_record_outputs's previous settings */
extern PyTypeObject *kd_ProblemCountsType; /* Recorder.problem_counts: what DebugMode warns about */
extern PyTypeObject *kd_RangeDigestType;   /* Recorder.digest: one digest of a launch range */

/* A new struct sequence of type t holding items[0..n), n its field count;
 * steals every item (also on failure).  NULL with an exception when an item
 * is NULL (its maker failed) or on no memory. */
PyObject *kd_record(PyTypeObject *t, PyObject *const *items, int n);
/* kd_record with the items listed: KD_RECORD(kd_ExtentType, a, b, c, d). */
#define KD_RECORD(t, ...)                                                                          \
    kd_record((t), (PyObject *[]){__VA_ARGS__}, (int)(sizeof((PyObject *[]){__VA_ARGS__}) / sizeof(PyObject *)))

/* Python -> C: the NamedTuple classes (and the one marker) kdebug/_boundary.py
 * registers with _register_types; NULL until then.  Field order is checked
 * against the KD_OPI_* / KD_HH_* / KD_TL_* indices at registration. */
extern PyTypeObject *kd_OpInfoType;       /* _op_info's answer (KD_OPI_* in kd_op_writes.h) */
extern PyTypeObject *kd_HashHookType;     /* a log_tensor_hashes hook entry (KD_HH_*) */
extern PyTypeObject *kd_TritonLaunchType; /* the Triton finisher's answer (KD_TL_*) */
extern PyObject *kd_RecordHook;           /* the record_outputs hook entry */

enum { KD_HH_SPEC, KD_HH_HASH_INPUTS, KD_HH_SPEC_ID, KD_HH_KINDS, KD_HH_VALUE_FN, KD_HH_N };
enum { KD_TL_GRID_X, KD_TL_GRID_Y, KD_TL_GRID_Z, KD_TL_CONFIG_ID, KD_TL_NUM_WARPS, KD_TL_NUM_STAGES,
       KD_TL_SHARED_MEM, KD_TL_N };

/* A TraceReader's decoded extents tree (plain tuples) as the dispatch path
 * makes it live: an OpExtents of trees whose 4-int tuples are Extents.  A new
 * reference, or NULL with a ValueError when the tree is no (inputs, outputs)
 * pair. */
PyObject *kd_typed_extents(PyObject *tree);

/* Makes the struct sequence types and adds them and _register_types to
 * module m; -1 with an exception on failure. */
int kd_types_module_init(PyObject *m);

#endif
