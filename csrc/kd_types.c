/* kd_types.c - the named types that cross between the C extension and Python:
 * the struct sequences C hands out and the NamedTuples Python hands in
 * (Note [Typed boundaries]). */
#include "kd_types.h"
#include "kd_op_writes.h"
#include "kd_trace.h"

#include <string.h>

/* Note [Typed boundaries]
 * No positional tuple crosses between C and Python: every record the
 * extension returns is a struct sequence whose fields are named here (read
 * them by name: arg.name, op.depth), and every record Python hands to C is a
 * NamedTuple from kdebug/_boundary.py, registered once with _register_types,
 * which checks its field names against the indices the C code reads it by
 * (KD_OPI_*, KD_HH_*, KD_TL_*) so the two sides cannot drift apart.  The C
 * fast path keeps reading those by index (a NamedTuple is a tuple), after
 * checking the exact type.  Struct sequences stay tuples only because
 * CPython makes them so; kdebug relies on their order in two places only:
 * HashValues (Note [HashValues] in kd_hash_py.c), and Extent / OpExtents,
 * which the trace's hash-tree codec writes as the tuples they are and
 * TraceReader.op makes typed again (kd_typed_extents; docs/trace-format.md).
 * A tuple that is a value
 * and not a record stays a tuple: Launch.grid (x, y, z), shapes, strides,
 * the trees of hashes, and the trace's info()["version"] (major, minor).
 * tests/test_typed_boundary.py checks that kdebug/_C.pyi names exactly what the
 * module has. */

#define FIELD(name, doc) {name, doc}
#define END {NULL, NULL}

static PyStructSequence_Field tensor_arg_fields[] = {
    FIELD("kind", "'tensor'"),
    FIELD("name", "the kernel's parameter name ('' when unknown)"),
    FIELD("role", "ROLE_READ | ROLE_WRITE bits"),
    FIELD("scalar_type", "the c10::ScalarType number of its dtype"),
    FIELD("shape", "tuple of sizes"),
    FIELD("stride", "tuple of strides, in elements"),
    FIELD("storage_offset", "in elements"),
    FIELD("data_ptr", "the address of its first element"),
    FIELD("device", "'cpu', 'cuda:0', ..."),
    END,
};
static PyStructSequence_Field scalar_arg_fields[] = {
    FIELD("kind", "'int', 'float', 'bool', 'none' or 'other'"),
    FIELD("name", "the kernel's parameter name ('' when unknown)"),
    FIELD("role", "ROLE_READ | ROLE_WRITE bits"),
    FIELD("value", "the value; for 'other' the name of its type"),
    END,
};
static PyStructSequence_Field arg_hashes_fields[] = {
    FIELD("kinds", "the HASH_* kinds either side holds"),
    FIELD("flags", "KD_HF_* bits (kd_record.h): pre, post, unsupported, checked, readonly changed"),
    FIELD("spec", "the hash spec id (kdebug.hashing.spec)"),
    FIELD("pre", "HashValues before the launch, or None"),
    FIELD("post", "HashValues after the launch, or None"),
    END,
};
static PyStructSequence_Field pending_call_fields[] = {
    FIELD("call", "the aten call whose hashes are PendingHash leaves"),
    FIELD("by_pytree", "True when Python's pytree made its hash trees"),
    END,
};
static PyStructSequence_Field extent_fields[] = {
    FIELD("device_type", "c10::DeviceType number (0 cpu, 1 cuda)"),
    FIELD("device_index", "device index, -1 for none"),
    FIELD("lo", "first byte"),
    FIELD("hi", "one past the last byte"),
    FIELD("nbytes", "bytes its elements cover: less than hi - lo for a view with gaps (Note [Partial writes])"),
    END,
};
static PyStructSequence_Field op_extents_fields[] = {
    FIELD("inputs", "extents tree of the inputs, None when kdebug cannot walk them"),
    FIELD("outputs", "extents tree of the result, None when kdebug cannot walk it"),
    END,
};
static PyStructSequence_Field trace_op_fields[] = {
    FIELD("depth", "the call depth"),
    FIELD("flags", "KD_OPF_* bits (kd_trace.h)"),
    FIELD("name", "the op's name"),
    FIELD("text", "the op's rendered line"),
    FIELD("input_hashes", "tree of input hashes, or None"),
    FIELD("output_hashes", "tree of output hashes, or None"),
    FIELD("extents", "OpExtents, or None"),
    END,
};
static PyStructSequence_Field last_write_fields[] = {
    FIELD("index", "the record index of the last writer"),
    FIELD("mask", "bit i: its argument i wrote the range"),
    END,
};
static PyStructSequence_Field trace_table_fields[] = {
    FIELD("records", "bytes of kd_tab_rec rows"),
    FIELD("args", "bytes of kd_tab_arg rows"),
    FIELD("dims", "bytes of int64 sizes"),
    END,
};
static PyStructSequence_Field hash_config_fields[] = {
    FIELD("kinds", "HASH_* kinds"),
    FIELD("hash_inputs", "hash what kernels read before the launch"),
    FIELD("check_readonly", "check that read-only arguments stay unchanged"),
    FIELD("spec", "the hash spec id"),
    END,
};
static PyStructSequence_Field output_config_fields[] = {
    FIELD("on", "record kernel outputs"),
    FIELD("budget", "bytes of outputs to keep at most"),
    FIELD("filter", "0, or the id of the Python filter choosing launches (kdebug/values.py)"),
    END,
};

static PyStructSequence_Field problem_counts_fields[] = {
    FIELD("dropped", "launch records lost (ring full, or not copied out of it)"),
    FIELD("errors", "errors inside the launch hook"),
    FIELD("outputs_skipped", "kernel outputs not kept: over record_outputs' budget"),
    FIELD("readonly_changed", "arguments a kernel only reads that changed during its launch"),
    FIELD("hash_unsupported", "tensors of a dtype the requested hash cannot decode"),
    END,
};
static PyStructSequence_Field range_digest_fields[] = {
    FIELD("digest", "the order-free digest of the recorded launches of the range (kd_ltab_range_digest)"),
    FIELD("recorded", "how many launches of the range are recorded (the others were lost)"),
    END,
};
PyTypeObject *kd_TensorArgType, *kd_ScalarArgType, *kd_ArgHashesType, *kd_PendingCallType, *kd_ExtentType,
    *kd_OpExtentsType, *kd_TraceOpType, *kd_LastWriteType, *kd_TraceTableType, *kd_HashConfigType,
    *kd_OutputConfigType, *kd_ProblemCountsType, *kd_RangeDigestType;

typedef struct {
    const char *name; /* after the last dot: the module attribute */
    const char *doc;
    PyStructSequence_Field *fields;
    PyTypeObject **type;
} seq_def;

static const seq_def seq_defs[] = {
    {"kdebug._C.TensorArg", "A kernel's tensor argument as recorded (Launch.args).", tensor_arg_fields, &kd_TensorArgType},
    {"kdebug._C.ScalarArg", "A kernel's non-tensor argument as recorded (Launch.args).", scalar_arg_fields, &kd_ScalarArgType},
    {"kdebug._C.ArgHashes", "One argument's hash record (Launch.hashes).", arg_hashes_fields, &kd_ArgHashesType},
    {"kdebug._C.PendingCall", "An aten call whose hashes are still on the GPU.", pending_call_fields, &kd_PendingCallType},
    {"kdebug._C.Extent", "The bytes a tensor leaf covers (tree_extents).", extent_fields, &kd_ExtentType},
    {"kdebug._C.OpExtents", "An aten call's extent trees (call._kd_extents).", op_extents_fields, &kd_OpExtentsType},
    {"kdebug._C.TraceOp", "A trace's op record (TraceReader.op).", trace_op_fields, &kd_TraceOpType},
    {"kdebug._C.LastWrite", "The last write found by TraceReader.last_writer.", last_write_fields, &kd_LastWriteType},
    {"kdebug._C.TraceTable", "TraceReader.table's rows (Note [Trace tables]).", trace_table_fields, &kd_TraceTableType},
    {"kdebug._C.HashConfig", "This thread's hash settings (_set_hash_config).", hash_config_fields, &kd_HashConfigType},
    {"kdebug._C.OutputConfig", "This thread's record_outputs settings.", output_config_fields, &kd_OutputConfigType},
    {"kdebug._C.ProblemCounts", "The recorder's counters a DebugMode warns about (Recorder.problem_counts).",
     problem_counts_fields, &kd_ProblemCountsType},
    {"kdebug._C.RangeDigest", "One digest of a range of launch indices (Recorder.digest).", range_digest_fields,
     &kd_RangeDigestType},
};

/* A struct sequence of type t from items[0..n), stolen; NULL if any is NULL. */
PyObject *kd_record(PyTypeObject *t, PyObject *const *items, int n)
{
    PyObject *r = NULL;
    int ok = 1;
    for (int i = 0; i < n; i++)
        ok &= items[i] != NULL;
    if (ok)
        r = PyStructSequence_New(t);
    for (int i = 0; i < n; i++) {
        if (r != NULL)
            PyStructSequence_SET_ITEM(r, i, items[i]);
        else
            Py_XDECREF(items[i]);
    }
    return r;
}

/* ---- Python -> C ---- */

PyTypeObject *kd_OpInfoType, *kd_HashHookType, *kd_TritonLaunchType;
PyObject *kd_RecordHook;

static const char *const op_info_names[KD_OPI_N] = {
    [KD_OPI_SPECIAL] = "special",           [KD_OPI_HASH_SKIPPED] = "hash_skipped",
    [KD_OPI_MAKES_EMPTY] = "makes_empty",   [KD_OPI_WRITES] = "writes",
    [KD_OPI_WRITTEN_POS] = "written_pos",   [KD_OPI_WRITTEN_NAMES] = "written_names",
    [KD_OPI_OUT_NAMES] = "out_names",       [KD_OPI_CALLABLE] = "callable",
    [KD_OPI_VIEW] = "view",
};
static const char *const hash_hook_names[KD_HH_N] = {
    [KD_HH_SPEC] = "spec", [KD_HH_HASH_INPUTS] = "hash_inputs", [KD_HH_SPEC_ID] = "spec_id",
    [KD_HH_KINDS] = "kinds", [KD_HH_VALUE_FN] = "value_fn",
};
static const char *const triton_launch_names[KD_TL_N] = {
    [KD_TL_GRID_X] = "grid_x",       [KD_TL_GRID_Y] = "grid_y",         [KD_TL_GRID_Z] = "grid_z",
    [KD_TL_CONFIG_ID] = "config_id", [KD_TL_NUM_WARPS] = "num_warps",   [KD_TL_NUM_STAGES] = "num_stages",
    [KD_TL_SHARED_MEM] = "shared_mem",
};

/* 0 when cls is a tuple subclass whose _fields are names[0..n) in order; -1
 * with a TypeError saying which differs otherwise. */
static int check_named(PyObject *cls, const char *what, const char *const *names, int n)
{
    if (!PyType_Check(cls) || !PyType_IsSubtype((PyTypeObject *)cls, &PyTuple_Type)) {
        PyErr_Format(PyExc_TypeError, "_register_types: %s must be a NamedTuple class", what);
        return -1;
    }
    PyObject *f = PyObject_GetAttrString(cls, "_fields");
    if (f == NULL)
        return -1;
    int bad = PyTuple_Check(f) ? -1 : 0; /* the first field that differs, -1: none */
    for (int i = 0; bad < 0 && i < n; i++) {
        PyObject *x = i < PyTuple_GET_SIZE(f) ? PyTuple_GET_ITEM(f, i) : NULL;
        if (x == NULL || !PyUnicode_Check(x) || PyUnicode_CompareWithASCIIString(x, names[i]) != 0)
            bad = i;
    }
    if (bad < 0 && PyTuple_GET_SIZE(f) != n)
        bad = n;
    Py_DECREF(f);
    if (bad >= 0) {
        PyErr_Format(PyExc_TypeError, "_register_types: %s's field %d must be %s%s%s (the C side reads "
                     "%d fields by index)", what, bad, bad < n ? "'" : "", bad < n ? names[bad] : "absent",
                     bad < n ? "'" : "", n);
        return -1;
    }
    return 0;
}

/* _register_types(op_info, hash_hook, record_hook, triton_launch): the
 * Python -> C types (kdebug/_boundary.py); replaces earlier ones. */
static PyObject *mod_register_types(PyObject *m, PyObject *args, PyObject *kw)
{
    (void)m;
    static char *kwlist[] = {"op_info", "hash_hook", "record_hook", "triton_launch", NULL};
    PyObject *oi, *hh, *rh, *tl;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "$OOOO", kwlist, &oi, &hh, &rh, &tl))
        return NULL;
    if (check_named(oi, "op_info", op_info_names, KD_OPI_N) != 0 ||
        check_named(hh, "hash_hook", hash_hook_names, KD_HH_N) != 0 ||
        check_named(tl, "triton_launch", triton_launch_names, KD_TL_N) != 0)
        return NULL;
    Py_XSETREF(kd_OpInfoType, (PyTypeObject *)Py_NewRef(oi));
    Py_XSETREF(kd_HashHookType, (PyTypeObject *)Py_NewRef(hh));
    Py_XSETREF(kd_TritonLaunchType, (PyTypeObject *)Py_NewRef(tl));
    Py_XSETREF(kd_RecordHook, Py_NewRef(rh));
    Py_RETURN_NONE;
}

/* ---- extents read back from a trace ---- */

/* Whether o is a plain tuple of four ints (an extent as a trace before 1.4
 * keeps it: its elements cover every byte) or five (1.4: and the bytes they
 * cover). */
static int is_extent_tuple(PyObject *o)
{
    if (!PyTuple_CheckExact(o) || (PyTuple_GET_SIZE(o) != 4 && PyTuple_GET_SIZE(o) != 5))
        return 0;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(o); i++)
        if (!PyLong_CheckExact(PyTuple_GET_ITEM(o, i)))
            return 0;
    return 1;
}

/* o with its 4-int tuples made Extents (an extents tree holds no other ints:
 * non-tensor leaves are None); a new reference, or NULL with an exception. */
static PyObject *typed_leaves(PyObject *o, int depth)
{
    if (depth > KD_TREE_MAX_DEPTH || !(PyTuple_Check(o) || PyList_Check(o) || PyDict_Check(o)))
        return Py_NewRef(o);
    if (is_extent_tuple(o)) {
        PyObject *nbytes = PyTuple_GET_SIZE(o) == 5 ? Py_NewRef(PyTuple_GET_ITEM(o, 4))
                                                    : PyNumber_Subtract(PyTuple_GET_ITEM(o, 3), PyTuple_GET_ITEM(o, 2));
        if (nbytes == NULL)
            return NULL;
        return KD_RECORD(kd_ExtentType, Py_NewRef(PyTuple_GET_ITEM(o, 0)), Py_NewRef(PyTuple_GET_ITEM(o, 1)),
                         Py_NewRef(PyTuple_GET_ITEM(o, 2)), Py_NewRef(PyTuple_GET_ITEM(o, 3)), nbytes);
    }
    if (PyDict_Check(o)) {
        PyObject *d = PyDict_New(), *k, *v;
        Py_ssize_t pos = 0;
        while (d != NULL && PyDict_Next(o, &pos, &k, &v)) {
            PyObject *x = typed_leaves(v, depth + 1);
            if (x == NULL || PyDict_SetItem(d, k, x) != 0)
                Py_CLEAR(d);
            Py_XDECREF(x);
        }
        return d;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(o);
    PyObject *out = PyList_Check(o) ? PyList_New(n) : PyTuple_New(n);
    for (Py_ssize_t i = 0; out != NULL && i < n; i++) {
        PyObject *x = typed_leaves(PySequence_Fast_GET_ITEM(o, i), depth + 1);
        if (x == NULL)
            Py_CLEAR(out);
        else if (PyList_Check(out))
            PyList_SET_ITEM(out, i, x);
        else
            PyTuple_SET_ITEM(out, i, x);
    }
    return out;
}

/* A decoded extents tree as an OpExtents with Extent leaves (kd_types.h). */
PyObject *kd_typed_extents(PyObject *tree)
{
    if (!PyTuple_CheckExact(tree) || PyTuple_GET_SIZE(tree) != 2) { /* not what kdebug writes */
        PyErr_SetString(PyExc_ValueError, "malformed extents tree");
        return NULL;
    }
    return KD_RECORD(kd_OpExtentsType, typed_leaves(PyTuple_GET_ITEM(tree, 0), 0),
                     typed_leaves(PyTuple_GET_ITEM(tree, 1), 0));
}

static PyMethodDef types_methods[] = {
    {"_register_types", (PyCFunction)(void (*)(void))mod_register_types, METH_VARARGS | METH_KEYWORDS,
     "_register_types(*, op_info, hash_hook, record_hook, triton_launch): the NamedTuples Python hands "
     "to C (Note [Typed boundaries])."},
    {NULL, NULL, 0, NULL},
};

/* Makes the struct sequence types once and adds them and _register_types to m. */
int kd_types_module_init(PyObject *m)
{
    for (size_t i = 0; i < sizeof seq_defs / sizeof *seq_defs; i++) {
        const seq_def *s = &seq_defs[i];
        if (*s->type == NULL) {
            int n = 0;
            while (s->fields[n].name != NULL)
                n++;
            PyStructSequence_Desc d = {s->name, s->doc, s->fields, n};
            if ((*s->type = PyStructSequence_NewType(&d)) == NULL)
                return -1;
        }
        if (PyModule_AddObjectRef(m, strrchr(s->name, '.') + 1, (PyObject *)*s->type) != 0)
            return -1;
    }
    return PyModule_AddFunctions(m, types_methods);
}
