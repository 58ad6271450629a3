/* kd_dispatch.c - kdebug.DebugMode.__torch_dispatch__'s work, in C.
 *
 * Note [Fast aten-op recording]
 * Upstream DebugMode handles every aten op in Python: it builds an _OpCall,
 * stringifies arguments and output, runs dispatch hooks (hashes, recorded
 * outputs), each through several Python frames.  kdebug's DebugMode does the
 * same work here, in one C call per op, and gives the op to upstream's own
 * __torch_dispatch__ whenever it would do something this file does not:
 *
 *   - flags that change what a record holds (store_original_args, record_ids,
 *     stack traces, tensor attributes, torch-function records: mode._fast is
 *     False), other dispatch modes below this one, tensor-subclass `types`,
 *     profiler / annotation ops (info.special);
 *   - dispatch hooks in upstream's global lists, a callable hash_fn, nested
 *     log_tensor_hashes() / record_outputs() contexts (kdebug's own contexts
 *     are per thread: Note [Aten-op hash settings per thread] in
 *     kdebug/_aten_hooks.py; own_hooks reads their summary);
 *   - arguments the C formatter does not know (kd_fmt.c returns NotImplemented).
 *
 * What it records is what upstream would: the same _OpCall class, with
 * upstream's exact text (kd_fmt.c; tests/test_upstream_parity.py compares
 * whole debug strings), call.log["hash"] / ["input_hash"] and
 * call.record["output"] as upstream's hooks store them, except that GPU
 * hashes are queued (PendingHash leaves, resolved when results are read:
 * DebugMode._resolve_aten_hashes) instead of synchronizing per op.
 *
 * DebugMode.__torch_dispatch__ itself is a C method that calls
 * kd_dispatch_op: no Python frame per op (kd_dispatch_method.c, Note [A C
 * __torch_dispatch__]).  Where torch lacks the C eval-frame calls, the Python
 * wrapper in mode.py (dispatch(mode, ...)) stays.
 *
 * Per op (OpOverload) the facts this needs come from mode._op_info(func) once,
 * cached here: whether it is special, skipped by upstream's hash hooks, an
 * empty*, which arguments its schema writes and which are out= arguments.
 */
#include "kd_dispatch.h"
#include "kd_fresh.h"
#include "kd_hash_args.h"
#include "kd_dispatch_method.h"
#include "kd_fmt.h"
#include "kd_hook.h"
#include "kd_op_writes.h"
#include "kd_tree.h"
#include "kd_types.h"
#include "kd_defer.h"

/* Set once by _configure_dispatch (all strong references). */
static PyObject *op_info_fn;       /* mode._op_info(func) -> info tuple */
static PyObject *upstream_fn;      /* upstream DebugMode.__torch_dispatch__ (unbound) */
static PyObject *stream_tick_fn;   /* mode._stream_tick(mode) */
static PyObject *py_hash_fn;       /* mode._tree_hash_py(obj, spec) -> tree or None */
static PyObject *py_clone_fn;      /* mode._tree_clone_py(obj) -> tree */
static PyObject *thread_hooks;     /* _aten_hooks._local: .hooks is this thread's ThreadHooks or None */
static PyObject *utils_mod;        /* upstream module with the hook lists */
static PyObject *opcall_type;      /* upstream _OpCall */
static PyObject *opcall_template;  /* dict: a fresh _OpCall's attributes, or None: call the class */
static PyObject *len_stack_fn;     /* torch._C._len_torch_dispatch_stack */
static PyObject *info_cache;       /* {func: info tuple} */

static PyObject *s_fast, *s_ops, *s_call_depth, *s_fx_stack_trace, *s_record_output, *s_fresh,
    *s_pending, *s_stream, *s_log, *s_record, *s_hash, *s_input_hash, *s_output, *s_op, *s_args_str,
    *s_kwargs_str, *s_stack_trace, *s_fwd_stack_trace, *s_output_str, *s_stringify_output,
    *s_rec_hooks, *s_log_hooks, *s_pre_hooks, *s_kd_extents, *s_hooks, *s_hook_owner, *s_hash_code,
    *s_hash_entry, *s_record_code, *empty_tuple;


static PyObject *op_info(PyObject *func)
{
    PyObject *info = PyDict_GetItemWithError(info_cache, func);
    if (info != NULL || PyErr_Occurred())
        return info; /* borrowed */
    info = PyObject_CallOneArg(op_info_fn, func);
    if (info == NULL)
        return NULL;
    if (kd_OpInfoType == NULL || Py_TYPE(info) != kd_OpInfoType || PyTuple_GET_SIZE(info) != KD_OPI_N) {
        /* Note [Typed boundaries]: the type, and its length (tuple.__new__ makes one of any length) */
        Py_DECREF(info);
        PyErr_SetString(PyExc_TypeError, "kdebug: _op_info must return a kdebug._boundary.OpInfo");
        return NULL;
    }
    int rc = PyDict_SetItem(info_cache, func, info);
    Py_DECREF(info);
    return rc == 0 ? info : NULL; /* the cache holds it */
}

PyObject *kd_dispatch_op_info(PyObject *func)
{
    if (op_info_fn == NULL || info_cache == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "kdebug: _configure_dispatch was not called");
        return NULL;
    }
    return op_info(func);
}

static PyObject *upstream(PyObject *mode, PyObject *func, PyObject *types, PyObject *args, PyObject *kwargs)
{
    PyObject *a[5] = {mode, func, types, args, kwargs ? kwargs : Py_None};
    return PyObject_Vectorcall(upstream_fn, a, 5, NULL);
}

/* ---- hashes and clones of op arguments / results ---- */

/* Sets *tree to the hashes of every tensor leaf (None when there is none) and
 * *by_pytree when Python's pytree made it.  Returns 0, or -1 with an error. */
static int tree_hash(PyObject *obj, PyObject *entry, PyObject **tree, int *by_pytree)
{
    int kinds = (int)PyLong_AsLong(PyTuple_GET_ITEM(entry, KD_HH_KINDS));
    int spec = (int)PyLong_AsLong(PyTuple_GET_ITEM(entry, KD_HH_SPEC_ID));
    /* stream 0: each tensor's current stream */
    PyObject *t = kd_tree_hash(obj, kinds, spec, 0, PyTuple_GET_ITEM(entry, KD_HH_VALUE_FN));
    if (t == Py_NotImplemented) {
        Py_DECREF(t);
        t = PyObject_CallFunctionObjArgs(py_hash_fn, obj, PyTuple_GET_ITEM(entry, KD_HH_SPEC), NULL);
        *by_pytree = 1;
    }
    *tree = t;
    return t == NULL ? -1 : 0;
}

static PyObject *tree_clone(PyObject *obj)
{
    PyObject *c = kd_tree_clone(obj);
    if (c == Py_NotImplemented) {
        Py_DECREF(c);
        c = PyObject_CallOneArg(py_clone_fn, obj);
    }
    return c;
}

/* ---- the record ---- */

static PyObject *getattr_or(PyObject *o, PyObject *name, PyObject *dflt)
{
    PyObject *v = PyObject_GetAttr(o, name);
    if (v == NULL && PyErr_ExceptionMatches(PyExc_AttributeError)) {
        PyErr_Clear();
        return Py_XNewRef(dflt);
    }
    return v;
}

/* A new _OpCall with upstream's text for (func, args, kwargs), appended to
 * mode._ops; NotImplemented when the formatter does not know the arguments. */
static PyObject *new_op_call(PyObject *mode, PyObject *func, PyObject *args, PyObject *kwargs)
{
    PyObject *a = kd_format_args(NULL, args);
    if (a == NULL || a == Py_NotImplemented)
        return a;
    PyObject *k = kd_format_kwargs(NULL, kwargs);
    if (k == NULL || k == Py_NotImplemented) {
        Py_DECREF(a);
        return k;
    }
    PyObject *call = NULL, *depth = NULL, *depth1 = NULL, *fx = NULL, *ops = NULL;
    depth = PyObject_GetAttr(mode, s_call_depth);
    long d = depth ? PyLong_AsLong(depth) : -1;
    depth1 = d == -1 && PyErr_Occurred() ? NULL : PyLong_FromLong(d + 1);
    if (depth1 == NULL)
        goto done;
    if (opcall_template == Py_None) { /* upstream's constructor, as it is */
        PyObject *cargs[4] = {func, empty_tuple, NULL, depth1};
        cargs[2] = PyDict_New();
        if (cargs[2] == NULL)
            goto done;
        call = PyObject_Vectorcall(opcall_type, cargs, 4, NULL);
        Py_DECREF(cargs[2]);
        if (call == NULL || PyObject_DelAttrString(call, "args") < 0 ||
            PyObject_DelAttrString(call, "kwargs") < 0)
            goto fail;
    } else { /* the attributes upstream's constructor sets, without running it */
        call = PyBaseObject_Type.tp_new((PyTypeObject *)opcall_type, empty_tuple, NULL);
        if (call == NULL)
            goto done;
        PyObject *key, *val;
        Py_ssize_t pos = 0;
        int set = 0; /* the four below, set in upstream's order (interned names: identity) */
        while (PyDict_Next(opcall_template, &pos, &key, &val)) {
            PyObject *v = key == s_op ? (set |= 1, func) : key == s_call_depth ? (set |= 2, depth1)
                        : key == s_args_str ? (set |= 4, a) : key == s_kwargs_str ? (set |= 8, k) : val;
            if (PyObject_SetAttr(call, key, v) < 0)
                goto fail;
        }
        if ((!(set & 1) && PyObject_SetAttr(call, s_op, func) < 0) ||
            (!(set & 2) && PyObject_SetAttr(call, s_call_depth, depth1) < 0) ||
            (!(set & 4) && PyObject_SetAttr(call, s_args_str, a) < 0) ||
            (!(set & 8) && PyObject_SetAttr(call, s_kwargs_str, k) < 0))
            goto fail;
    }
    if (opcall_template == Py_None &&
        (PyObject_SetAttr(call, s_args_str, a) < 0 || PyObject_SetAttr(call, s_kwargs_str, k) < 0))
        goto fail;
    fx = getattr_or(mode, s_fx_stack_trace, Py_None);
    if (fx == NULL)
        goto fail;
    if (PyObject_IsTrue(fx) == 1 &&
        (PyObject_SetAttr(call, s_stack_trace, fx) < 0 || PyObject_SetAttr(call, s_fwd_stack_trace, fx) < 0))
        goto fail;
    ops = PyObject_GetAttr(mode, s_ops);
    if (ops == NULL || PyList_Append(ops, call) < 0) /* upstream appends: no merge on write */
        goto fail;
    goto done;
fail:
    Py_CLEAR(call);
done:
    Py_DECREF(a);
    Py_DECREF(k);
    Py_XDECREF(depth);
    Py_XDECREF(depth1);
    Py_XDECREF(fx);
    Py_XDECREF(ops);
    return call;
}

static int set_output(PyObject *mode, PyObject *call, PyObject *result)
{
    PyObject *rec = PyObject_GetAttr(mode, s_record_output);
    int on = rec ? PyObject_IsTrue(rec) : -1;
    Py_XDECREF(rec);
    if (on <= 0)
        return on;
    PyObject *out = kd_format_output(NULL, result);
    if (out == NULL)
        return -1;
    int rc = 0;
    if (out == Py_NotImplemented) { /* mode._stringify_output: upstream's, with stable texts */
        PyObject *r = PyObject_CallMethodObjArgs(mode, s_stringify_output, call, result, NULL);
        rc = r ? 0 : -1;
        Py_XDECREF(r);
    } else if (out != Py_None) {
        rc = PyObject_SetAttr(call, s_output_str, out);
    }
    Py_DECREF(out);
    return rc;
}

/* ---- kdebug's own hooks ---- */

/* 1 when upstream's global hook lists are all empty (a missing list counts
 * as empty: torch 2.11 has no pre-log hooks), 0 when not, -1 with an error. */
static int global_hooks_empty(void)
{
    PyObject *names[3] = {s_rec_hooks, s_log_hooks, s_pre_hooks};
    for (int i = 0; i < 3; i++) {
        PyObject *lst = PyObject_GetAttr(utils_mod, names[i]);
        if (lst == NULL) {
            if (i == 2 && PyErr_ExceptionMatches(PyExc_AttributeError)) {
                PyErr_Clear();
                continue;
            }
            return -1;
        }
        Py_ssize_t n = PyList_Check(lst) ? PyList_GET_SIZE(lst) : PyObject_Length(lst);
        Py_DECREF(lst);
        if (n < 0)
            return -1;
        if (n > 0)
            return 0;
    }
    return 1;
}

/* A ThreadHooks' summary code `name` (hash_code / record_code: 0 none, 1 one
 * context this file does itself, 2 through upstream); 0 for None, -1 with an error. */
static int hook_code(PyObject *th, PyObject *name)
{
    if (th == NULL || th == Py_None)
        return 0;
    PyObject *v = PyObject_GetAttr(th, name);
    long c = v ? PyLong_AsLong(v) : -1;
    Py_XDECREF(v);
    return c == -1 && PyErr_Occurred() ? -1 : (int)c;
}

/* The hooks an op of `mode` on this thread runs (Note [Aten-op hash settings
 * per thread]): 0 none, 1 only what this file does (*entry: a new reference to
 * the hash entry or NULL, *record: record_outputs()), 2 anything else.  Each
 * part (hashes, recorded outputs) is this thread's, or where this thread
 * entered none, that of the thread that entered `mode` (mode._hook_owner). */
static int own_hooks(PyObject *mode, PyObject **entry, int *record)
{
    *entry = NULL;
    *record = 0;
    int empty = global_hooks_empty();
    if (empty <= 0)
        return empty < 0 ? -1 : 2;
    PyObject *mine = PyObject_GetAttr(thread_hooks, s_hooks);
    PyObject *owner = mine ? PyObject_GetAttr(mode, s_hook_owner) : NULL;
    int res = -1;
    if (owner == NULL)
        goto done;
    int hm = hook_code(mine, s_hash_code), rm = hm < 0 ? -1 : hook_code(mine, s_record_code);
    if (rm < 0)
        goto done;
    PyObject *hsrc = hm > 0 ? mine : owner;
    int hc = hm > 0 ? hm : hook_code(owner, s_hash_code);
    int rc = hc < 0 ? -1 : rm > 0 ? rm : hook_code(owner, s_record_code);
    if (rc < 0)
        goto done;
    res = 2;
    if (hc == 2 || rc == 2)
        goto done;
    if (hc == 1) {
        PyObject *e = PyObject_GetAttr(hsrc, s_hash_entry);
        if (e == NULL) {
            res = -1;
            goto done;
        }
        /* its type, and its length: tuple.__new__ makes one of any length */
        if (kd_HashHookType == NULL || Py_TYPE(e) != kd_HashHookType || PyTuple_GET_SIZE(e) != KD_HH_N) {
            Py_DECREF(e);
            goto done;
        }
        *entry = e;
    }
    *record = rc == 1;
    res = hc || rc;
done:
    Py_XDECREF(mine);
    Py_XDECREF(owner);
    return res;
}

/* Stores a hash tree under call.log[key]; the log dict is made when missing. */
static int log_hash(PyObject *call, PyObject *key, PyObject *tree)
{
    PyObject *log = PyObject_GetAttr(call, s_log);
    if (log == NULL)
        return -1;
    if (log == Py_None) {
        Py_DECREF(log);
        log = PyDict_New();
        if (log == NULL || PyObject_SetAttr(call, s_log, log) < 0) {
            Py_XDECREF(log);
            return -1;
        }
    }
    int rc = PyDict_SetItem(log, key, tree);
    Py_DECREF(log);
    return rc;
}

/* call._kd_extents = OpExtents(inputs, outputs): the memory every tensor
 * leaf read and written covers (kd_tree_extents), the input tree made from
 * what the input hashes were taken of (in_obj) or else (args, kwargs); a side
 * kdebug cannot walk is None.  Note [Data flow] in compare.py. */
static int set_extents(PyObject *call, PyObject *in_obj, PyObject *args, PyObject *kw, PyObject *result)
{
    PyObject *pair = in_obj ? Py_NewRef(in_obj) : PyTuple_Pack(2, args, kw);
    PyObject *in = pair ? kd_tree_extents(pair) : NULL;
    Py_XDECREF(pair);
    PyObject *out = in ? kd_tree_extents(result) : NULL;
    PyObject *both = out ? KD_RECORD(kd_OpExtentsType, Py_NewRef(in == Py_NotImplemented ? Py_None : in),
                                     Py_NewRef(out == Py_NotImplemented ? Py_None : out)) : NULL;
    Py_XDECREF(in);
    Py_XDECREF(out);
    int rc = both ? PyObject_SetAttr(call, s_kd_extents, both) : -1;
    Py_XDECREF(both);
    return rc;
}

/* ---- the method ---- */

static PyObject *dispatch_hooked(PyObject *mode, PyObject *func, PyObject *types, PyObject *args,
                                 PyObject *kwargs, PyObject *info, int writes, PyObject *entry, int record);

/* One aten op under `mode`: the op's result. */
PyObject *kd_dispatch_op(PyObject *mode, PyObject *func, PyObject *types, PyObject *args,
                         PyObject *kwargs)
{
    if (op_info_fn == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "kdebug: _configure_dispatch was not called");
        return NULL;
    }
    if (!PyTuple_Check(args) || (kwargs != Py_None && !PyDict_Check(kwargs)))
        return upstream(mode, func, types, args, kwargs);
    PyObject *info = op_info(func);
    if (info == NULL)
        return NULL;
    PyObject *stream = PyObject_GetAttr(mode, s_stream);
    if (stream == NULL)
        return NULL;
    if (stream != Py_None) { /* DebugMode(trace=...): write due chunks */
        PyObject *r = PyObject_CallOneArg(stream_tick_fn, mode);
        Py_XDECREF(r);
        if (r == NULL) {
            Py_DECREF(stream);
            return NULL;
        }
    }
    Py_DECREF(stream);
    int writes = kd_op_flag(info, KD_OPI_WRITES);
    if (writes && kd_defer_pending())
        kd_op_guard_writes(info, args, kwargs == Py_None ? NULL : kwargs);
    if (kd_in_benchmark()) {
        /* compiling or autotuning (Note [Autotuning is not the program]): not
         * the program, never recorded, whichever path the op would take.
         * dynamo disables the modes while it compiles, but not around
         * DDPOptimizer's compile (torch.compile(DDP(model))), where Inductor
         * traces on fake and meta tensors under this mode */
        return PyObject_Call(func, args, kwargs == Py_None ? NULL : kwargs);
    }
    PyObject *entry;
    int record;
    int hooks = own_hooks(mode, &entry, &record);
    if (hooks < 0)
        return NULL;
    if (hooks == 2)
        return upstream(mode, func, types, args, kwargs);
    /* the entry stays alive for the op although another thread may leave its context meanwhile */
    PyObject *r = dispatch_hooked(mode, func, types, args, kwargs, info, writes, entry, record);
    Py_XDECREF(entry);
    return r;
}

/* The rest of dispatch_op, with the hooks own_hooks found (entry borrowed). */
static PyObject *dispatch_hooked(PyObject *mode, PyObject *func, PyObject *types, PyObject *args,
                                 PyObject *kwargs, PyObject *info, int writes, PyObject *entry, int record)
{
    PyObject *fast = PyObject_GetAttr(mode, s_fast);
    int is_fast = fast ? PyObject_IsTrue(fast) : -1;
    Py_XDECREF(fast);
    if (is_fast < 0)
        return NULL;
    PyObject *depth = is_fast ? PyObject_CallNoArgs(len_stack_fn) : NULL;
    long below = depth ? PyLong_AsLong(depth) : 1;
    Py_XDECREF(depth);
    if (below == -1 && PyErr_Occurred())
        return NULL;
    int ntypes = PyObject_IsTrue(types);
    if (ntypes < 0)
        return NULL;
    if (ntypes || !is_fast || below != 0 || kd_op_flag(info, KD_OPI_SPECIAL))
        return upstream(mode, func, types, args, kwargs);
    if (kwargs == Py_None)
        kwargs = NULL;
    PyObject *kw = kwargs ? Py_NewRef(kwargs) : PyDict_New();
    if (kw == NULL)
        return NULL;

    PyObject *call = NULL, *result = NULL, *fresh = NULL, *pending_list = NULL, *in_obj = NULL;
    int pending = 0, by_pytree = 0;
    int hash_inputs = entry != NULL && PyTuple_GET_ITEM(entry, KD_HH_HASH_INPUTS) == Py_True;
    int skipped = kd_op_flag(info, KD_OPI_HASH_SKIPPED);
    if (!kd_in_benchmark()) {
        call = new_op_call(mode, func, args, kw);
        if (call == NULL)
            goto fail;
        if (call == Py_NotImplemented) {
            Py_DECREF(call);
            PyObject *r = upstream(mode, func, empty_tuple, args, kw);
            Py_DECREF(kw);
            return r;
        }
    }
    /* Note [Fresh buffers] (kd_fresh.c): the mode's table, followed by every op */
    fresh = PyObject_GetAttr(mode, s_fresh);
    if (fresh == NULL || !kd_fresh_check(fresh)) {
        if (fresh != NULL)
            PyErr_SetString(PyExc_TypeError, "kdebug: DebugMode._fresh must be its table of fresh storages");
        goto fail;
    }
    if (entry != NULL && call != NULL && !skipped && kd_op_flag(info, KD_OPI_VIEW)) {
        /* a view of memory nobody wrote yet is not hashed */
        int in = kd_op_reads_fresh(fresh, args);
        if (in < 0)
            goto fail;
        skipped = in;
    }
    if (hash_inputs && call != NULL && !skipped) {
        PyObject *hargs = writes && PyDict_GET_SIZE(fresh) > 0 ? kd_op_without_fresh(fresh, info, args)
                                                                 : Py_NewRef(args);
        PyObject *hkw = hargs ? kd_op_without_outs(info, kw) : NULL;
        PyObject *both = hkw ? PyTuple_Pack(2, hargs, hkw) : NULL;
        Py_XDECREF(hargs);
        Py_XDECREF(hkw);
        PyObject *tree = NULL;
        int rc = both ? tree_hash(both, entry, &tree, &by_pytree) : -1;
        in_obj = both; /* its extents, leaf for leaf with the hash tree (below) */
        if (rc < 0)
            goto fail;
        if (tree != Py_None) {
            PyObject *log = Py_BuildValue("{OO}", s_input_hash, tree);
            rc = log ? PyObject_SetAttr(call, s_log, log) : -1;
            Py_XDECREF(log);
            pending = 1;
            if (rc == 0 && writes) /* an in-place op: its input hashes run before it */
                kd_op_guard_writes(info, args, kw);
        }
        Py_DECREF(tree);
        if (rc < 0)
            goto fail;
    }
    result = PyObject_Call(PyTuple_GET_ITEM(info, KD_OPI_CALLABLE), args, kw);
    if (result == NULL)
        goto fail;
    if (kd_op_track_fresh(fresh, info, args, kw, result, hash_inputs) < 0)
        goto fail;
    if (call == NULL)
        goto done;
    if (set_output(mode, call, result) < 0)
        goto fail;
    if (record) {
        PyObject *out = tree_clone(result);
        PyObject *d = out ? Py_BuildValue("{OO}", s_output, out) : NULL;
        Py_XDECREF(out);
        int rc = d ? PyObject_SetAttr(call, s_record, d) : -1;
        Py_XDECREF(d);
        if (rc < 0)
            goto fail;
    }
    if (entry != NULL) {
        PyObject *log = PyObject_GetAttr(call, s_log);
        if (log == NULL)
            goto fail;
        int none = log == Py_None;
        Py_DECREF(log);
        if (none) {
            log = PyDict_New();
            int rc = log ? PyObject_SetAttr(call, s_log, log) : -1;
            Py_XDECREF(log);
            if (rc < 0)
                goto fail;
        }
        if (!skipped) {
            /* Note [Writes returned by no output] (kd_op_writes.c) */
            PyObject *outs = kd_op_written_values(info, args, kw, result);
            if (outs == NULL)
                goto fail;
            if (outs == Py_None)
                Py_SETREF(outs, Py_NewRef(result));
            PyObject *tree = NULL;
            int byp = 0;
            if (tree_hash(outs, entry, &tree, &byp) < 0) {
                Py_DECREF(outs);
                goto fail;
            }
            int rc = 0;
            if (tree != Py_None) {
                rc = log_hash(call, s_hash, tree);
                pending = 1;
                by_pytree |= byp;
            }
            Py_DECREF(tree);
            if (rc == 0)
                rc = set_extents(call, in_obj, args, kw, outs);
            Py_DECREF(outs);
            if (rc < 0)
                goto fail;
        }
    }
    if (pending) {
        pending_list = PyObject_GetAttr(mode, s_pending);
        PyObject *item = pending_list ? KD_RECORD(kd_PendingCallType, Py_NewRef(call), PyBool_FromLong(by_pytree)) : NULL;
        int rc = item ? PyList_Append(pending_list, item) : -1;
        Py_XDECREF(item);
        if (rc < 0)
            goto fail;
    }
    goto done;
fail:
    Py_CLEAR(result);
done:
    Py_XDECREF(call);
    Py_XDECREF(fresh);
    Py_XDECREF(pending_list);
    Py_XDECREF(in_obj);
    Py_DECREF(kw);
    return result;
}

/* dispatch(mode, func, types, args, kwargs) -> the op's result (the body of
 * the Python __torch_dispatch__ where _dispatch_method's is not installed) */
static PyObject *kd_dispatch(PyObject *m, PyObject *const *a, Py_ssize_t n)
{
    (void)m;
    if (n != 5) {
        PyErr_SetString(PyExc_TypeError, "dispatch(mode, func, types, args, kwargs)");
        return NULL;
    }
    return kd_dispatch_op(a[0], a[1], a[2], a[3], a[4]);
}

/* _configure_dispatch(op_info, upstream_dispatch, stream_tick, tree_hash_py,
 *                     tree_clone_py, thread_hooks, utils_module, _OpCall, template,
 *                     len_dispatch_stack) */
static PyObject *kd_configure_dispatch(PyObject *m, PyObject *args)
{
    (void)m;
    PyObject *o[10];
    if (!PyArg_ParseTuple(args, "OOOOOOOOOO", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &o[6], &o[7], &o[8],
                          &o[9]))
        return NULL;
    if (!PyType_Check(o[7]) || (o[8] != Py_None && !PyDict_Check(o[8]))) {
        PyErr_SetString(PyExc_TypeError, "_configure_dispatch: _OpCall must be a type, template a dict or None");
        return NULL;
    }
    PyObject **slots[10] = {&op_info_fn, &upstream_fn, &stream_tick_fn, &py_hash_fn, &py_clone_fn,
                            &thread_hooks, &utils_mod, &opcall_type, &opcall_template, &len_stack_fn};
    for (int i = 0; i < 10; i++)
        Py_XSETREF(*slots[i], Py_NewRef(o[i]));
    Py_XSETREF(info_cache, PyDict_New());
    if (info_cache == NULL)
        return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef dispatch_methods[] = {
    {"dispatch", (PyCFunction)(void (*)(void))kd_dispatch, METH_FASTCALL,
     "dispatch(mode, func, types, args, kwargs): DebugMode.__torch_dispatch__ (Note [Fast aten-op recording])."},
    {"_configure_dispatch", kd_configure_dispatch, METH_VARARGS,
     "Set the Python pieces the aten-op fast path calls (kdebug.mode)."},
    {NULL, NULL, 0, NULL},
};

int kd_dispatch_module_init(PyObject *m)
{
    struct { PyObject **p; const char *s; } names[] = {
        {&s_fast, "_fast"}, {&s_ops, "_ops"}, {&s_call_depth, "call_depth"},
        {&s_fx_stack_trace, "fx_stack_trace"}, {&s_record_output, "record_output"}, {&s_fresh, "_fresh"},
        {&s_pending, "_pending_calls"}, {&s_stream, "_stream"}, {&s_log, "log"}, {&s_record, "record"},
        {&s_hash, "hash"}, {&s_input_hash, "input_hash"}, {&s_kd_extents, "_kd_extents"}, {&s_output, "output"}, {&s_op, "op"},
        {&s_args_str, "args_str"}, {&s_kwargs_str, "kwargs_str"}, {&s_stack_trace, "stack_trace"},
        {&s_fwd_stack_trace, "fwd_stack_trace"}, {&s_output_str, "output_str"},
        {&s_stringify_output, "_stringify_output"},
        {&s_rec_hooks, "_DISPATCH_RECORD_HOOKS"}, {&s_log_hooks, "_DISPATCH_LOG_HOOKS"},
        {&s_pre_hooks, "_DISPATCH_PRE_LOG_HOOKS"}, {&s_hooks, "hooks"}, {&s_hook_owner, "_hook_owner"},
        {&s_hash_code, "hash_code"}, {&s_hash_entry, "hash_entry"}, {&s_record_code, "record_code"},
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if ((*names[i].p = PyUnicode_InternFromString(names[i].s)) == NULL)
            return -1;
    empty_tuple = PyTuple_New(0);
    if (empty_tuple == NULL)
        return -1;
    if (PyModule_AddFunctions(m, dispatch_methods) != 0)
        return -1;
    if (kd_hash_args_module_init(m) != 0 || kd_fresh_module_init(m) != 0) /* Note [Hashes of one op on every path] */
        return -1;
    return kd_dispatch_method_module_init(m); /* _dispatch_method, its other file */
}
