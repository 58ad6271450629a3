/* kd_hash_args.c - what an aten op's hashes are taken of when upstream's hook
 * runners hash it (kdebug/_aten_hooks.py's hash_hooks), as the fast path
 * takes them (kd_dispatch.c).
 *
 * Note [Hashes of one op on every path]
 * An aten op's hashes are made on one of two paths: the fast path
 * (kd_dispatch.c, a built-in hash_fn under a DebugMode whose flags its C
 * formatter serves) or upstream's __torch_dispatch__ with kdebug's hooks (a
 * callable hash_fn, or a mode with record_stack_trace and the other flags
 * that take upstream's path).  Both must hash the same values, or one
 * recording shows what the other calls unknown: the hooks hashed every
 * argument as upstream's do, so under them
 *   - an out= buffer's input hash and a fresh buffer's (Note [Fresh buffers]
 *     in mode.py: made by empty* and not written yet) were hashes of
 *     whatever memory the allocator gave - a value nobody computed, which
 *     differs run to run;
 *   - a view of a fresh buffer (DDP's bucket views) was hashed, the same
 *     uninitialized memory;
 *   - an in-place op that returns nothing (the foreach and fused optimizer
 *     steps: Note [Writes returned by no output]) got the hash None, as if it
 *     wrote nothing.
 * These two functions give the hooks the fast path's values, from the same
 * OpInfo (kd_dispatch_op_info) and the same helpers (kd_op_writes.c); the
 * fresh table is the DebugMode's own (mode._fresh, Note [Fresh buffers] in
 * kd_fresh.c), followed by every op either path runs (op_track_fresh after
 * an op upstream's code ran).  Under a mode that is not kdebug's (upstream's
 * own DebugMode with kdebug's log_tensor_hashes) no buffer is known fresh.
 */
#include "kd_hash_args.h"

#include "kd_dispatch.h"
#include "kd_fresh.h"
#include "kd_op_writes.h"

static PyObject *str_fresh;

/* mode._fresh (a new reference), an empty table when mode keeps none (not a
 * kdebug DebugMode: no attribute), or NULL with an error (one that is not
 * kdebug's table, as the fast path says). */
static PyObject *fresh_of(PyObject *mode)
{
    PyObject *f = mode == Py_None ? NULL : PyObject_GetAttr(mode, str_fresh);
    if (f == NULL) {
        if (mode != Py_None && !PyErr_ExceptionMatches(PyExc_AttributeError))
            return NULL;
        PyErr_Clear();
        return PyDict_New();
    }
    if (!kd_fresh_check(f)) {
        Py_DECREF(f);
        PyErr_SetString(PyExc_TypeError, "kdebug: DebugMode._fresh must be its table of fresh storages");
        return NULL;
    }
    return f;
}

/* 1 when the op's hashes are left out (upstream's empty* and profiler ops, a
 * view of a fresh buffer), 0 when not, -1 with an error. */
static int skipped(PyObject *info, PyObject *fresh, PyObject *args)
{
    if (kd_op_flag(info, KD_OPI_HASH_SKIPPED))
        return 1;
    return kd_op_flag(info, KD_OPI_VIEW) ? kd_op_reads_fresh(fresh, args) : 0;
}

/* The arguments every function here takes first, (mode, func, args: tuple,
 * kwargs: dict, ...), n of them: mode's fresh table (a new reference) with
 * *info the op's OpInfo (borrowed), or NULL with an error (usage: the
 * signature a TypeError shows). */
static PyObject *op_context(PyObject *const *a, Py_ssize_t n, Py_ssize_t want, const char *usage,
                            PyObject **info)
{
    if (n != want || !PyTuple_Check(a[2]) || !PyDict_Check(a[3])) {
        PyErr_SetString(PyExc_TypeError, usage);
        return NULL;
    }
    *info = kd_dispatch_op_info(a[1]);
    return *info == NULL ? NULL : fresh_of(a[0]);
}

/* op_hash_inputs(mode, func, args, kwargs) -> (args, kwargs) | None */
static PyObject *op_hash_inputs(PyObject *m, PyObject *const *a, Py_ssize_t n)
{
    (void)m;
    PyObject *info;
    PyObject *fresh = op_context(a, n, 4, "op_hash_inputs(mode, func, args: tuple, kwargs: dict)", &info);
    if (fresh == NULL)
        return NULL;
    PyObject *out = NULL;
    int skip = skipped(info, fresh, a[2]);
    if (skip != 0) {
        out = skip < 0 ? NULL : Py_NewRef(Py_None);
        goto done;
    }
    PyObject *hargs = kd_op_flag(info, KD_OPI_WRITES) && PyDict_GET_SIZE(fresh) > 0
                          ? kd_op_without_fresh(fresh, info, a[2])
                          : Py_NewRef(a[2]);
    PyObject *hkw = hargs ? kd_op_without_outs(info, a[3]) : NULL;
    out = hkw ? PyTuple_Pack(2, hargs, hkw) : NULL; /* the tree the fast path hashes: (args, kwargs) */
    Py_XDECREF(hargs);
    Py_XDECREF(hkw);
done:
    Py_DECREF(fresh);
    return out;
}

/* op_hash_outputs(mode, func, args, kwargs, result, add_fresh) -> values | None:
 * what the op's output hash is taken of (its result, or the arguments an
 * in-place op that returns nothing wrote), None when it gets none.  The
 * mode's fresh table follows the op; with add_fresh (hash_inputs, as on the
 * fast path) what an empty* op made becomes fresh. */
static PyObject *op_hash_outputs(PyObject *m, PyObject *const *a, Py_ssize_t n)
{
    (void)m;
    PyObject *info;
    PyObject *fresh = op_context(a, n, 6, "op_hash_outputs(mode, func, args: tuple, kwargs: dict, result, "
                                          "add_fresh: bool)", &info);
    if (fresh == NULL)
        return NULL;
    int track = PyObject_IsTrue(a[5]);
    if (track < 0) {
        Py_DECREF(fresh);
        return NULL;
    }
    PyObject *out = NULL;
    int skip = skipped(info, fresh, a[2]); /* before the table follows the op, as the fast path asks */
    if (skip >= 0 && kd_op_track_fresh(fresh, info, a[2], a[3], a[4], track) < 0)
        skip = -1;
    if (skip != 0) {
        out = skip < 0 ? NULL : Py_NewRef(Py_None);
        goto done;
    }
    out = kd_op_written_values(info, a[2], a[3], a[4]);
    if (out == Py_None)
        Py_SETREF(out, Py_NewRef(a[4]));
done:
    Py_DECREF(fresh);
    return out;
}

/* op_track_fresh(mode, func, args, kwargs, result): what the op wrote is no
 * longer fresh in mode's table (upstream's __torch_dispatch__ ran it:
 * kdebug/_aten_hooks.py's through_upstream, with or without hash hooks). */
static PyObject *op_track_fresh(PyObject *m, PyObject *const *a, Py_ssize_t n)
{
    (void)m;
    PyObject *info;
    PyObject *fresh = op_context(a, n, 5, "op_track_fresh(mode, func, args: tuple, kwargs: dict, result)", &info);
    if (fresh == NULL)
        return NULL;
    int rc = kd_op_track_fresh(fresh, info, a[2], a[3], a[4], 0);
    Py_DECREF(fresh);
    if (rc < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef hash_args_methods[] = {
    {"op_hash_inputs", (PyCFunction)(void (*)(void))op_hash_inputs, METH_FASTCALL,
     "op_hash_inputs(mode, func, args, kwargs) -> (args, kwargs) | None: what an op's input hashes are taken "
     "of (Note [Hashes of one op on every path])."},
    {"op_hash_outputs", (PyCFunction)(void (*)(void))op_hash_outputs, METH_FASTCALL,
     "op_hash_outputs(mode, func, args, kwargs, result, add_fresh) -> values | None: what an op's output "
     "hash is taken of (Note [Hashes of one op on every path])."},
    {"op_track_fresh", (PyCFunction)(void (*)(void))op_track_fresh, METH_FASTCALL,
     "op_track_fresh(mode, func, args, kwargs, result): what the op wrote is no longer fresh (Note [Fresh "
     "buffers])."},
    {NULL, NULL, 0, NULL},
};

int kd_hash_args_module_init(PyObject *m)
{
    str_fresh = PyUnicode_InternFromString("_fresh");
    if (str_fresh == NULL)
        return -1;
    return PyModule_AddFunctions(m, hash_args_methods);
}
