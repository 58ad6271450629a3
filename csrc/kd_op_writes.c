/* kd_op_writes.c - what an aten op writes, for the dispatch path
 * (kd_dispatch.c): flushing deferred GPU work it is about to overwrite, and
 * Note [Fresh buffers] (kd_fresh.c): which written buffers still hold
 * uninitialized memory, kept out of the input hashes. */
#include "kd_op_writes.h"
#include "kd_fresh.h"
#include "kd_defer.h"
#include "kd_shim.h"

/* ---- which arguments an op writes ---- */

static void guard_one(PyObject *a)
{
    if (PyList_Check(a) || PyTuple_Check(a)) {
        PyObject *fast = PySequence_Fast(a, "");
        if (fast == NULL) {
            PyErr_Clear();
            return;
        }
        for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(fast); i++)
            kd_defer_guard_tensor(PySequence_Fast_GET_ITEM(fast, i), 0);
        Py_DECREF(fast);
    } else if (a != Py_None) {
        kd_defer_guard_tensor(a, 0);
    }
}

/* Calls fn(arg, ctx) on each argument the op's schema writes (written_pos
 * must not be None): positional ones in schema order, then keyword ones;
 * -1 as soon as fn returns -1 or a lookup fails (with an error), else 0. */
static int each_written(PyObject *info, PyObject *args, PyObject *kwargs, int (*fn)(PyObject *, void *), void *ctx)
{
    PyObject *pos = PyTuple_GET_ITEM(info, KD_OPI_WRITTEN_POS);
    Py_ssize_t nargs = PyTuple_GET_SIZE(args);
    for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(pos); j++) {
        Py_ssize_t i = PyLong_AsSsize_t(PyTuple_GET_ITEM(pos, j));
        if (i == -1 && PyErr_Occurred())
            return -1;
        if (i >= 0 && i < nargs && fn(PyTuple_GET_ITEM(args, i), ctx) < 0)
            return -1;
    }
    PyObject *names = PyTuple_GET_ITEM(info, KD_OPI_WRITTEN_NAMES);
    if (kwargs != NULL && PyDict_GET_SIZE(kwargs) > 0 && names != Py_None)
        for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(names); j++) {
            PyObject *a = PyDict_GetItemWithError(kwargs, PyTuple_GET_ITEM(names, j));
            if (a == NULL && PyErr_Occurred())
                return -1;
            if (a != NULL && fn(a, ctx) < 0)
                return -1;
        }
    return 0;
}

static int guard_written(PyObject *a, void *ctx)
{
    (void)ctx;
    guard_one(a);
    return 0;
}

/* Flush deferred GPU work that this op is about to overwrite (Note [Deferred
 * GPU work] in kd_defer.h); an op with no schema may write anything. */
void kd_op_guard_writes(PyObject *info, PyObject *args, PyObject *kwargs)
{
    if (PyTuple_GET_ITEM(info, KD_OPI_WRITTEN_POS) == Py_None) {
        kd_defer_flush();
        return;
    }
    if (each_written(info, args, kwargs, guard_written, NULL) < 0) {
        PyErr_Clear();
        kd_defer_flush(); /* an argument it could not read: any doubt, everything queued goes first */
    }
    PyErr_Clear(); /* the guards report their own failures (kd_defer.c); the op runs */
}

/* ---- Note [Writes returned by no output] ----
 * An op's output hashes are the hashes of what it returns (upstream's
 * log_tensor_hashes hashes the result).  An in-place op that returns nothing
 * - torch.optim's foreach and fused steps: _foreach_add_(Tensor(a!)[] self,
 * ...) -> (), _fused_adamw_(...) -> () - would then leave no hash of what it
 * wrote: the parameters an optimizer step changed looked unchanged to the
 * comparison, a difference in the gradients "died out" at the step, and the
 * next step's reads of the parameters seemed changed "outside the recording"
 * (seen on a compiled DDP step on 2 H200s; on CPU with SGD(foreach=True),
 * runs that ended with other parameters were called matching).  For such an
 * op the written arguments stand in for its outputs: hashed after it ran,
 * in schema order, with their extents as its written extents.  An op that
 * returns something keeps upstream's hashes of its result. */

static int append_written(PyObject *a, void *list)
{
    return a == Py_None ? 0 : PyList_Append((PyObject *)list, a);
}

PyObject *kd_op_written_values(PyObject *info, PyObject *args, PyObject *kwargs, PyObject *result)
{
    if (result != Py_None || PyTuple_GET_ITEM(info, KD_OPI_WRITTEN_POS) == Py_None ||
        !kd_op_flag(info, KD_OPI_WRITES))
        return Py_NewRef(Py_None);
    PyObject *out = PyList_New(0);
    if (out == NULL)
        return NULL;
    if (each_written(info, args, kwargs, append_written, out) < 0) {
        Py_DECREF(out);
        return NULL;
    }
    PyObject *t = PyList_GET_SIZE(out) == 0 ? Py_NewRef(Py_None) : PyList_AsTuple(out);
    Py_DECREF(out);
    return t;
}

/* ---- Note [Fresh buffers] (kd_fresh.c) ---- */

static int forget_written(PyObject *a, void *fresh)
{
    return kd_fresh_mark((PyObject *)fresh, a, 0);
}

int kd_op_track_fresh(PyObject *fresh, PyObject *info, PyObject *args, PyObject *kwargs, PyObject *result,
                      int add)
{
    if (kd_op_flag(info, KD_OPI_MAKES_EMPTY))
        return add ? kd_fresh_mark(fresh, result, 1) : 0;
    if (PyDict_GET_SIZE(fresh) == 0 || kd_op_flag(info, KD_OPI_VIEW)) /* a view writes nothing */
        return 0;
    if (result != Py_None && kd_fresh_mark(fresh, result, 0) < 0) /* what it returns, it wrote */
        return -1;
    if (PyTuple_GET_ITEM(info, KD_OPI_WRITTEN_POS) == Py_None) { /* it may write any argument */
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(args); i++)
            if (kd_fresh_mark(fresh, PyTuple_GET_ITEM(args, i), 0) < 0)
                return -1;
        PyObject *k, *v;
        Py_ssize_t pos = 0;
        while (kwargs != NULL && PyDict_Next(kwargs, &pos, &k, &v))
            if (kd_fresh_mark(fresh, v, 0) < 0)
                return -1;
        return 0;
    }
    return each_written(info, args, kwargs, forget_written, fresh);
}

/* 1 when a is a fresh tensor or a list / tuple holding one, 0 when not, -1 with an error. */
static int holds_fresh(PyObject *fresh, PyObject *a)
{
    if (PyList_Check(a) || PyTuple_Check(a)) {
        for (Py_ssize_t i = 0; i < PySequence_Size(a); i++) {
            PyObject *x = PySequence_GetItem(a, i);
            int in = x ? kd_fresh_contains(fresh, x) : -1;
            Py_XDECREF(x);
            if (in != 0)
                return in;
        }
        return 0;
    }
    return kd_fresh_contains(fresh, a);
}

int kd_op_reads_fresh(PyObject *fresh, PyObject *args)
{
    if (PyDict_GET_SIZE(fresh) == 0)
        return 0;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(args); i++) {
        int in = holds_fresh(fresh, PyTuple_GET_ITEM(args, i));
        if (in != 0)
            return in;
    }
    return 0;
}

/* a (a new reference) with its fresh tensors as None: a tensor, or a copy of a
 * list / tuple; NULL with an error. */
static PyObject *without_fresh_one(PyObject *fresh, PyObject *a)
{
    if (!PyList_Check(a) && !PyTuple_Check(a)) {
        int in = kd_fresh_contains(fresh, a);
        return in < 0 ? NULL : Py_NewRef(in ? Py_None : a);
    }
    PyObject *fast = PySequence_Fast(a, "");
    if (fast == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    PyObject *out = PyList_New(n);
    for (Py_ssize_t i = 0; out != NULL && i < n; i++) {
        PyObject *x = PySequence_Fast_GET_ITEM(fast, i);
        int in = kd_fresh_contains(fresh, x);
        if (in < 0)
            Py_CLEAR(out);
        else
            PyList_SET_ITEM(out, i, Py_NewRef(in ? Py_None : x));
    }
    Py_DECREF(fast);
    if (out != NULL && PyTuple_Check(a))
        Py_SETREF(out, PyList_AsTuple(out));
    return out;
}

/* args with the written arguments that are still fresh replaced by None. */
PyObject *kd_op_without_fresh(PyObject *fresh, PyObject *info, PyObject *args)
{
    PyObject *pos = PyTuple_GET_ITEM(info, KD_OPI_WRITTEN_POS);
    if (pos == Py_None)
        return Py_NewRef(args);
    Py_ssize_t n = PyTuple_GET_SIZE(args);
    PyObject *out = PyTuple_New(n); /* a copy: args itself must not change */
    if (out == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++)
        PyTuple_SET_ITEM(out, i, Py_NewRef(PyTuple_GET_ITEM(args, i)));
    for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(pos); j++) {
        Py_ssize_t i = PyLong_AsSsize_t(PyTuple_GET_ITEM(pos, j));
        if (i < 0 || i >= n)
            continue;
        PyObject *v = without_fresh_one(fresh, PyTuple_GET_ITEM(out, i));
        if (v == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        Py_SETREF(PyTuple_GET_ITEM(out, i), v);
    }
    return out;
}

/* kwargs with the op's out= arguments as None (they hold whatever memory the
 * buffer had before the op), or kwargs itself (new reference). */
PyObject *kd_op_without_outs(PyObject *info, PyObject *kwargs)
{
    PyObject *outs = PyTuple_GET_ITEM(info, KD_OPI_OUT_NAMES);
    if (PyTuple_GET_SIZE(outs) == 0 || PyDict_GET_SIZE(kwargs) == 0)
        return Py_NewRef(kwargs);
    PyObject *out = PyDict_Copy(kwargs);
    for (Py_ssize_t j = 0; out != NULL && j < PyTuple_GET_SIZE(outs); j++) {
        PyObject *name = PyTuple_GET_ITEM(outs, j);
        int has = PyDict_Contains(out, name);
        if (has < 0 || (has && PyDict_SetItem(out, name, Py_None) < 0))
            Py_CLEAR(out);
    }
    return out;
}
