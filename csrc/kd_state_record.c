/* kd_state_record.c - records of replica state (Note [Replica state records]).
 *
 * Note [Replica state records]
 * The flight recorder compares, across the ranks of a data-parallel job,
 * what must be the same on every rank: the gradients the optimizer step
 * starts from (reduced across ranks) and the parameters and optimizer state
 * it leaves (kdebug/flight.py, Note [Flight recorder]).  Each such set of
 * tensors becomes one record in the recorder's ring, as if a kernel named
 * `name` had written them all: kd_launch_begin / kd_launch_end with every
 * argument in the W role and nothing launched between, so the tensors are
 * hashed by the launch path itself (on the GPU: kdebug's hash kernel on the
 * device's current stream, batched, read back without a synchronization),
 * and the record takes part in step digests, dumps and compares like any
 * launch.  The caller groups tensors by device (a record has one device) and
 * passes at most KD_GPU_BATCH_MAX (STATE_RECORD_MAX) of them per record: the
 * launch path queues that many CUDA tensors of one launch on the GPU and
 * hashes the rest on the host, through a copy (seen on the H200: a record of
 * an AdamW state of 200 tensors made the step 2.8x slower).
 *
 * A record's GPU hashes are launched at once (kd_tls_hash_now), never left
 * in the deferred queue (Note [Deferred GPU work]): nothing is launched
 * between the record's begin and end, so there is no later kernel to batch
 * them with, and a queued hash in a kernels_only recording installs the C++
 * write guard (Note [C++ write guard]), which makes torch box every op's
 * inputs on every thread for as long as the recording lasts.  The flight
 * recorder's optimizer window hashes nothing but these records under
 * hashes="compared": launched at once, they leave the guard uninstalled
 * (on the H200, releasing the guard after each window saved 0.13-0.45 ms of
 * a 7.6-8.8 ms transformer step).  One hash kernel per record (up to
 * KD_CUDA_BATCH = KD_GPU_BATCH_MAX tensors: Note [One hash kernel per batch]
 * in kd_cuda_hash.cu), in the same stream order.  Not covered: a
 * compiled optimizer step's own launches in the window are hashed through
 * the queue as any launch, and install the guard for the rest of the
 * recording; so do copies of a record's tensors under a user's
 * record_outputs (kd_defer_clone).
 */
#include <string.h>

#include "kd_cpp_launch.h"
#include "kd_hook.h"
#include "kd_kernel_info.h"
#include "kd_launch.h"
#include "kd_launch_hash.h"
#include "kd_module.h"
#include "kd_recorder.h"
#include "kd_shim.h"
#include "kd_state_record.h"

/* Counts a record kdebug's string table had no room to name; returns False. */
static PyObject *table_full(kd_recorder *r)
{
    kd_recorder_error(r, "a replica state record was not recorded: kdebug's string table is full");
    r->unrecorded++;
    Py_RETURN_FALSE;
}

/* Note [Replica names interned once]
 * A replica record's argument names (about 260 a step under the flight
 * recorder: every gradient, parameter and optimizer state) were interned at
 * every record, each a hash and a mutex in kd_strings, about 40% of
 * record_state's own time (perf, the CPU machine).  The flight recorder's
 * plans are cached across steps, so it interns each record's names once
 * (intern_names: their ids packed as native uint32) and hands record_state
 * the ids; a list of str still works (kdebug.replicated marks).  Ids never
 * change (kd_strtab.h); an id 0 is a name the full table could not take.  A
 * NUL in a name (torch allows one in a parameter's name; the table takes
 * none) is interned as the two characters \0 (intern_label): the record
 * was dropped whole before, reported as a full table. */

/* The string id of a tensor's name: a NUL in it (torch takes
 * register_parameter("w\x00x", ...); kd_strings takes no NUL) is written as
 * the two characters \0.  0: the table is full (or out of memory). */
static uint32_t intern_label(const char *s, Py_ssize_t len)
{
    if (memchr(s, '\0', (size_t)len) == NULL)
        return kd_strtab_intern(kd_strings, s, (size_t)len);
    char *buf = PyMem_Malloc((size_t)len * 2 + 1);
    if (buf == NULL)
        return 0;
    size_t k = 0;
    for (Py_ssize_t i = 0; i < len; i++) {
        if (s[i] == '\0') {
            buf[k++] = '\\';
            buf[k++] = '0';
        } else {
            buf[k++] = s[i];
        }
    }
    uint32_t id = kd_strtab_intern(kd_strings, buf, k);
    PyMem_Free(buf);
    return id;
}

/* The string id of name object nm (a str: intern_label), into *id; -1 with a
 * TypeError naming `who` for anything else. */
static int name_id(PyObject *nm, const char *who, uint32_t *id)
{
    Py_ssize_t len;
    const char *s = PyUnicode_Check(nm) ? PyUnicode_AsUTF8AndSize(nm, &len) : NULL;
    if (s == NULL) {
        if (!PyErr_Occurred())
            PyErr_Format(PyExc_TypeError, "%s: each name must be a str", who);
        return -1;
    }
    *id = intern_label(s, len); /* 0: the table is full (record_state counts it) */
    return 0;
}

/* intern_names(names) -> bytes: the names' string ids, native uint32 each */
static PyObject *intern_names(PyObject *m, PyObject *arg)
{
    (void)m;
    if (!PyList_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "intern_names takes a list of str");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(arg);
    PyObject *out = PyBytes_FromStringAndSize(NULL, n * (Py_ssize_t)sizeof(uint32_t));
    if (out == NULL)
        return NULL;
    uint32_t *ids = (uint32_t *)PyBytes_AS_STRING(out);
    for (Py_ssize_t i = 0; i < n; i++)
        if (name_id(PyList_GET_ITEM(arg, i), "intern_names", &ids[i]) != 0) {
            Py_DECREF(out);
            return NULL;
        }
    return out;
}

/* One replica record of objs[0..n) (1 <= n <= KD_GPU_BATCH_MAX tensors on
 * one device, named by name_ids) into r, as if kernel name_id wrote them
 * all.  -1 with a TypeError when objs[0] is not a tensor. */
static int record_tensors(kd_recorder *r, uint32_t name_id, uint32_t *name_ids, PyObject **objs,
                          Py_ssize_t n)
{
    uint8_t roles[KD_GPU_BATCH_MAX];
    kd_kernel_info info;
    memset(&info, 0, sizeof info);
    info.kind = KD_KIND_ATEN;
    info.name_id = name_id;
    info.device_type = KD_DEV_CPU;
    info.device_index = -1;
    uint64_t stream = 0;
    if (!kd_launch_device_of(objs[0], &info, &stream)) {
        PyErr_SetString(PyExc_TypeError, "record_state takes tensors");
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++)
        roles[i] = KD_ROLE_WRITE;
    info.nnames = (uint32_t)n;
    info.name_ids = name_ids;
    info.roles = roles;
    kd_pending p;
    memset(&kd_tls_capture, 0, sizeof kd_tls_capture); /* no grid: nothing was launched */
    /* The record runs Python code (the mode's call_depth, hashers): it may
     * empty the caller's list or stop and drop the recorder, so both are held
     * here, as the launch hooks hold theirs. */
    for (Py_ssize_t i = 0; i < n; i++)
        Py_INCREF(objs[i]);
    Py_INCREF(r);
    int was = kd_tls_hash_now;
    kd_tls_hash_now = 1;
    int recorded;
    if (!kd_launch_record(r, &info, objs, n, stream, &recorded)) { /* Note [Records made in one pass] */
        kd_launch_begin(r, &info, objs, n, stream, &p);
        kd_launch_end(r, &p, objs, n, 0);
    }
    kd_tls_hash_now = was;
    Py_DECREF(r);
    for (Py_ssize_t i = 0; i < n; i++)
        Py_DECREF(objs[i]);
    return 0;
}

/* Item i of a bytes object of native uint32 name ids (intern_names) or
 * int32 indices (kdebug/flight.py's packed layouts). */
static uint32_t id_at(PyObject *bytes, Py_ssize_t i)
{
    uint32_t v;
    memcpy(&v, PyBytes_AS_STRING(bytes) + i * (Py_ssize_t)sizeof v, sizeof v);
    return v;
}

static int32_t index_at(PyObject *bytes, Py_ssize_t i)
{
    int32_t v;
    memcpy(&v, PyBytes_AS_STRING(bytes) + i * (Py_ssize_t)sizeof v, sizeof v);
    return v;
}

/* Whether the n name ids in intern_names' bytes are ids it gave. */
static int ids_valid(PyObject *bytes, Py_ssize_t n)
{
    const uint32_t count = kd_strtab_count(kd_strings);
    for (Py_ssize_t i = 0; i < n; i++)
        if (id_at(bytes, i) > count)
            return 0;
    return 1;
}

/* record_state(name, arg_names, tensors) -> bool; arg_names: a list of str
 * or intern_names' bytes (Note [Replica names interned once]) */
static PyObject *record_state(PyObject *m, PyObject *args)
{
    (void)m;
    const char *name;
    PyObject *names, *tensors;
    if (!PyArg_ParseTuple(args, "sOO!:record_state", &name, &names, &PyList_Type, &tensors))
        return NULL;
    const int by_id = PyBytes_Check(names);
    if (!by_id && !PyList_Check(names)) {
        PyErr_SetString(PyExc_TypeError, "record_state: give the names as a list of str or intern_names' bytes");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(tensors);
    const int one_name_each = by_id ? PyBytes_GET_SIZE(names) == n * (Py_ssize_t)sizeof(uint32_t)
                                    : PyList_GET_SIZE(names) == n;
    if (n < 1 || n > KD_GPU_BATCH_MAX || !one_name_each) {
        PyErr_Format(PyExc_ValueError, "record_state takes 1 to %d tensors, each with a name", KD_GPU_BATCH_MAX);
        return NULL;
    }
    if (by_id && !ids_valid(names, n)) {
        PyErr_SetString(PyExc_ValueError, "record_state: a name id that intern_names did not give");
        return NULL;
    }
    kd_recorder *r = kd_active_recorder();
    if (r == NULL)
        Py_RETURN_FALSE;
    uint32_t name_ids[KD_GPU_BATCH_MAX];
    PyObject *objs[KD_GPU_BATCH_MAX];
    uint32_t what = kd_strtab_intern(kd_strings, name, strlen(name));
    if (what == 0)
        return table_full(r);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (by_id) {
            name_ids[i] = id_at(names, i);
        } else if (name_id(PyList_GET_ITEM(names, i), "record_state", &name_ids[i]) != 0) {
            return NULL;
        }
        if (name_ids[i] == 0)
            return table_full(r);
        objs[i] = PyList_GET_ITEM(tensors, i);
    }
    if (record_tensors(r, what, name_ids, objs, n) != 0)
        return NULL;
    Py_RETURN_TRUE;
}

/* Note [Plain replica tensors]
 * The flight recorder reuses a step's record layout for the gradients while
 * each has data of its own on the device it had (kdebug/flight.py,
 * _grads_plan; the gradients are new tensors every step).  Asked of Python,
 * that took about 1.4 us a gradient on the H200 host (p.grad.device, a
 * torch.device made and compared, and _upstream.has_no_data), 69 us of an
 * AdamW step of 50 parameters.  replica_devices asks it of all of them at
 * once: for each tensor of one of the plain Python types given (torch.Tensor,
 * nn.Parameter) that the shim finds plainly holding data
 * (kd_shim_plain_data: the fast path of has_no_data, by dispatch keys), a
 * device code; None for None; and no answer at all (None) as soon as one is
 * anything else, so the caller takes its Python path, which decides. */

/* 1 with *device set when t's type is one of plain_types (the very types,
 * no subclass) and the shim finds it plainly holding data of its own
 * (kd_shim_plain_data); 0 otherwise. */
static int plain_device(PyObject *t, PyObject *plain_types, int *device)
{
    int plain_type = 0;
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(plain_types) && !plain_type; k++)
        plain_type = (PyObject *)Py_TYPE(t) == PyTuple_GET_ITEM(plain_types, k);
    return plain_type && kd_shim_plain_data(t, device) == 1;
}

/* replica_devices(tensors, plain_types) -> [int | None] | None */
static PyObject *replica_devices(PyObject *m, PyObject *args)
{
    (void)m;
    PyObject *tensors, *types;
    if (!PyArg_ParseTuple(args, "O!O!:replica_devices", &PyList_Type, &tensors, &PyTuple_Type, &types))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(tensors);
    PyObject *out = PyList_New(n);
    if (out == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *t = PyList_GET_ITEM(tensors, i);
        if (t == Py_None) {
            PyList_SET_ITEM(out, i, Py_NewRef(Py_None));
            continue;
        }
        int dev = 0;
        PyObject *code = plain_device(t, types, &dev) ? PyLong_FromLong(dev) : NULL;
        if (code == NULL) {
            Py_DECREF(out);
            if (PyErr_Occurred())
                return NULL;
            Py_RETURN_NONE;
        }
        PyList_SET_ITEM(out, i, code);
    }
    return out;
}

/* Note [Replica checks in C]
 * The flight recorder's optimizer hooks run every step, inside it, where
 * the interpreter runs 3-5 times slower than in a loop of its own (cold
 * caches: docs/flight-recorder.md).  Their Python was about 120 us of an
 * AdamW step of 50 parameters on the H200 host: listing the parameters of
 * every group and checking them against the cached plan, reading each
 * p.grad and checking it against the cached layout, building each record's
 * list, and the state check (kdebug/flight.py's _StateCheck says what it
 * compares).  These
 * functions do the same checks on the same cached objects, without the
 * interpreter:
 *   - params_unchanged: every param group is a dict whose "params" list
 *     holds, in order, the very objects of the cached parameters;
 *   - record_grads: that, then each parameter's .grad is None where it was
 *     None and otherwise a plain tensor (Note [Plain replica tensors]) on
 *     the device it was on, then the cached records, in order.  Any check
 *     that fails returns None before anything is recorded, and the Python
 *     path decides (it plans again);
 *   - state_unchanged: the state check, in the order the Python made it.
 * They read the same objects the Python did, so they decide the same way;
 * tests in tests/test_flight.py change each thing checked and see the next
 * record follow. */

static PyObject *str_grad, *str_params, *str_sizes, *str_params_attr, *str_keys, *str_dicts, *str_lens,
    *str_held_dicts, *str_held_keys, *str_held, *str_mixed, *str_mixed_keys, *str_others;

/* 1 when groups (opt.param_groups) holds the objects of params (a list), in
 * order, in groups of sizes (a list of int); 0 when not; -1 with an error. */
static int params_unchanged(PyObject *groups, PyObject *sizes, PyObject *params)
{
    if (!PyList_Check(groups) || !PyList_Check(sizes) || !PyList_Check(params) ||
        PyList_GET_SIZE(groups) != PyList_GET_SIZE(sizes))
        return 0;
    Py_ssize_t j = 0, np = PyList_GET_SIZE(params);
    for (Py_ssize_t k = 0; k < PyList_GET_SIZE(groups); k++) {
        PyObject *g = PyList_GET_ITEM(groups, k);
        if (!PyDict_Check(g))
            return 0;
        PyObject *ps = PyDict_GetItemWithError(g, str_params);
        if (ps == NULL)
            return PyErr_Occurred() ? -1 : 0;
        if (!PyList_Check(ps))
            return 0;
        Py_ssize_t want = PyLong_AsSsize_t(PyList_GET_ITEM(sizes, k));
        if (want == -1 && PyErr_Occurred())
            return -1;
        if (PyList_GET_SIZE(ps) != want || j + want > np)
            return 0;
        for (Py_ssize_t i = 0; i < want; i++, j++)
            if (PyList_GET_ITEM(ps, i) != PyList_GET_ITEM(params, j))
                return 0;
    }
    return j == np;
}

/* Whether gradient g (a new reference, or Py_None) fits the cached device
 * code dev (None: no gradient then): 1 yes, 0 no. */
static int grad_fits(PyObject *g, PyObject *dev, PyObject *plain_types)
{
    if (g == Py_None || dev == Py_None)
        return g == Py_None && dev == Py_None;
    int code = 0;
    if (!plain_device(g, plain_types, &code))
        return 0;
    long want = PyLong_AsLong(dev);
    if (want == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    return want == code;
}

/* record_grads(*, what, groups, sizes, params, devices, ids, indices, plain_types) -> int | None
 * (Note [Replica checks in C]): the number of records made, or None when a
 * check failed (nothing recorded). */
static PyObject *record_grads(PyObject *m, PyObject *args, PyObject *kwargs)
{
    (void)m;
    static char *kwlist[] = {"what", "groups", "sizes", "params", "devices", "ids", "indices", "plain_types", NULL};
    const char *what = NULL;
    PyObject *groups = NULL, *sizes = NULL, *params = NULL, *devices = NULL, *ids = NULL, *indices = NULL,
             *plain_types = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|$sOO!O!O!O!O!O!:record_grads", kwlist, &what, &groups,
                                     &PyList_Type, &sizes, &PyList_Type, &params, &PyList_Type, &devices,
                                     &PyList_Type, &ids, &PyList_Type, &indices, &PyTuple_Type, &plain_types))
        return NULL;
    if (what == NULL || groups == NULL || sizes == NULL || params == NULL || devices == NULL || ids == NULL ||
        indices == NULL || plain_types == NULL) {
        PyErr_SetString(PyExc_TypeError, "record_grads: every argument is required");
        return NULL;
    }
    const Py_ssize_t np = PyList_GET_SIZE(params), nrec = PyList_GET_SIZE(ids);
    if (PyList_GET_SIZE(devices) != np || PyList_GET_SIZE(indices) != nrec) {
        PyErr_SetString(PyExc_ValueError, "record_grads: one device per parameter, one index list per record");
        return NULL;
    }
    int same = params_unchanged(groups, sizes, params);
    if (same <= 0)
        return same < 0 ? NULL : Py_NewRef(Py_None);
    /* the records' layout: names and indices of one size, indices in range */
    for (Py_ssize_t k = 0; k < nrec; k++) {
        PyObject *b = PyList_GET_ITEM(ids, k), *x = PyList_GET_ITEM(indices, k);
        if (!PyBytes_Check(b) || !PyBytes_Check(x) || PyBytes_GET_SIZE(b) != PyBytes_GET_SIZE(x) ||
            PyBytes_GET_SIZE(b) % (Py_ssize_t)sizeof(uint32_t) != 0 || PyBytes_GET_SIZE(b) == 0 ||
            PyBytes_GET_SIZE(b) > KD_GPU_BATCH_MAX * (Py_ssize_t)sizeof(uint32_t)) {
            PyErr_SetString(PyExc_ValueError, "record_grads: each record takes 1 to STATE_RECORD_MAX names "
                                              "(intern_names' bytes) and as many int32 indices");
            return NULL;
        }
        const Py_ssize_t n = PyBytes_GET_SIZE(b) / (Py_ssize_t)sizeof(uint32_t);
        if (!ids_valid(b, n)) {
            PyErr_SetString(PyExc_ValueError, "record_grads: a name id that intern_names did not give");
            return NULL;
        }
        for (Py_ssize_t i = 0; i < n; i++) {
            int32_t at = index_at(x, i);
            if (at < 0 || at >= np) {
                PyErr_SetString(PyExc_ValueError, "record_grads: an index past the parameters");
                return NULL;
            }
        }
    }
    PyObject **grads = PyMem_Calloc(np > 0 ? (size_t)np : 1, sizeof(PyObject *));
    if (grads == NULL)
        return PyErr_NoMemory();
    PyObject *out = NULL;
    Py_ssize_t got = 0;
    int fits = 1;
    kd_shim_prefetch_grads(PySequence_Fast_ITEMS(params), np); /* Note [Prefetching the gradients] */
    for (; got < np && fits; got++) {
        grads[got] = PyObject_GetAttr(PyList_GET_ITEM(params, got), str_grad);
        if (grads[got] == NULL) {
            got++;
            goto done; /* .grad raised: the Python path says so */
        }
        fits = grad_fits(grads[got], PyList_GET_ITEM(devices, got), plain_types);
    }
    /* every index must name a gradient (planned from those that were not None) */
    for (Py_ssize_t k = 0; k < nrec && fits; k++) {
        PyObject *x = PyList_GET_ITEM(indices, k);
        for (Py_ssize_t i = 0; i < PyBytes_GET_SIZE(x) / (Py_ssize_t)sizeof(int32_t) && fits; i++)
            fits = grads[index_at(x, i)] != Py_None;
    }
    if (!fits) {
        out = Py_NewRef(Py_None);
        goto done;
    }
    kd_recorder *r = kd_active_recorder();
    if (r == NULL) {
        out = PyLong_FromLong(0);
        goto done;
    }
    uint32_t what_id = kd_strtab_intern(kd_strings, what, strlen(what));
    if (what_id == 0) {
        Py_XDECREF(table_full(r));
        out = PyLong_FromLong(0);
        goto done;
    }
    long made = 0;
    for (Py_ssize_t k = 0; k < nrec; k++) {
        PyObject *b = PyList_GET_ITEM(ids, k), *x = PyList_GET_ITEM(indices, k);
        const Py_ssize_t n = PyBytes_GET_SIZE(b) / (Py_ssize_t)sizeof(uint32_t);
        uint32_t name_ids[KD_GPU_BATCH_MAX];
        PyObject *objs[KD_GPU_BATCH_MAX];
        int full = 0;
        for (Py_ssize_t i = 0; i < n; i++) {
            name_ids[i] = id_at(b, i);
            objs[i] = grads[index_at(x, i)];
            full |= name_ids[i] == 0;
        }
        if (full) { /* a name the full table could not take: that record is not made */
            Py_XDECREF(table_full(r));
            continue;
        }
        if (record_tensors(r, what_id, name_ids, objs, n) != 0)
            goto done;
        made++;
    }
    out = PyLong_FromLong(made);
done:
    for (Py_ssize_t i = 0; i < got; i++)
        Py_XDECREF(grads[i]);
    PyMem_Free(grads);
    return out;
}

/* A new reference to check's attribute `name` that must be a list; NULL
 * with an error otherwise. */
static PyObject *check_list(PyObject *check, PyObject *name)
{
    PyObject *v = PyObject_GetAttr(check, name);
    if (v != NULL && !PyList_Check(v)) {
        PyErr_Format(PyExc_TypeError, "state_unchanged: check.%U must be a list", name);
        Py_CLEAR(v);
    }
    return v;
}

/* The state check (kdebug/flight.py's _StateCheck says what each part is
 * for): 1 unchanged, 0 changed, -1 error. */
static int state_same(PyObject *groups, PyObject *state, PyObject *tensor_type, PyObject **f)
{
    /* f: sizes, params, keys, dicts, lens, held_dicts, held_keys, held, mixed, mixed_keys, others */
    int same = params_unchanged(groups, f[0], f[1]);
    if (same <= 0)
        return same;
    if (!PyDict_Check(state) || PyDict_GET_SIZE(state) != PyList_GET_SIZE(f[2]) ||
        PyList_GET_SIZE(f[3]) != PyList_GET_SIZE(f[2]) || PyList_GET_SIZE(f[4]) != PyList_GET_SIZE(f[3]))
        return 0;
    Py_ssize_t pos = 0, i = 0;
    PyObject *key, *value;
    while (PyDict_Next(state, &pos, &key, &value)) {
        if (i >= PyList_GET_SIZE(f[2]) || key != PyList_GET_ITEM(f[2], i) || value != PyList_GET_ITEM(f[3], i))
            return 0;
        i++;
    }
    for (i = 0; i < PyList_GET_SIZE(f[3]); i++) {
        PyObject *st = PyList_GET_ITEM(f[3], i);
        if (!PyDict_Check(st))
            return 0;
        Py_ssize_t len = PyLong_AsSsize_t(PyList_GET_ITEM(f[4], i));
        if (len == -1 && PyErr_Occurred())
            return -1;
        if (PyDict_GET_SIZE(st) != len)
            return 0;
    }
    const Py_ssize_t nheld = PyList_GET_SIZE(f[7]);
    if (PyList_GET_SIZE(f[5]) != nheld || PyList_GET_SIZE(f[6]) != nheld)
        return 0;
    for (i = 0; i < nheld; i++) {
        PyObject *st = PyList_GET_ITEM(f[5], i);
        if (!PyDict_Check(st))
            return 0;
        PyObject *v = PyDict_GetItemWithError(st, PyList_GET_ITEM(f[6], i));
        if (v == NULL && PyErr_Occurred())
            return -1;
        if (v != PyList_GET_ITEM(f[7], i))
            return 0;
    }
    if (PyList_GET_SIZE(f[8]) == 0)
        return 1;
    if (PyList_GET_SIZE(f[9]) != PyList_GET_SIZE(f[8]))
        return 0;
    for (i = 0; i < PyList_GET_SIZE(f[8]); i++) { /* the same keys, in the same order */
        PyObject *st = PyList_GET_ITEM(f[8], i), *keys = PyList_GET_ITEM(f[9], i);
        if (!PyDict_Check(st) || !PyList_Check(keys) || PyDict_GET_SIZE(st) != PyList_GET_SIZE(keys))
            return 0;
        Py_ssize_t p2 = 0, k = 0;
        while (PyDict_Next(st, &p2, &key, &value)) {
            int eq = PyObject_RichCompareBool(key, PyList_GET_ITEM(keys, k), Py_EQ);
            if (eq <= 0)
                return eq;
            k++;
        }
    }
    for (i = 0; i < PyList_GET_SIZE(f[10]); i++) { /* no value became a tensor */
        PyObject *pair = PyList_GET_ITEM(f[10], i);
        if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2 || !PyDict_Check(PyTuple_GET_ITEM(pair, 0)))
            return 0;
        PyObject *v = PyDict_GetItemWithError(PyTuple_GET_ITEM(pair, 0), PyTuple_GET_ITEM(pair, 1));
        if (v == NULL) {
            if (PyErr_Occurred())
                return -1;
            continue;
        }
        int t = PyObject_IsInstance(v, tensor_type);
        if (t != 0)
            return t < 0 ? -1 : 0;
    }
    return 1;
}

/* state_unchanged(groups, state, check, tensor_type) -> bool (Note [Replica checks in C]) */
static PyObject *state_unchanged(PyObject *m, PyObject *args)
{
    (void)m;
    PyObject *groups, *state, *check, *tensor_type;
    if (!PyArg_ParseTuple(args, "OOOO:state_unchanged", &groups, &state, &check, &tensor_type))
        return NULL;
    PyObject *names[11] = {str_sizes, str_params_attr, str_keys, str_dicts, str_lens, str_held_dicts,
                           str_held_keys, str_held, str_mixed, str_mixed_keys, str_others};
    PyObject *f[11] = {NULL};
    int same = -1;
    for (int i = 0; i < 11; i++)
        if ((f[i] = check_list(check, names[i])) == NULL)
            goto done;
    same = state_same(groups, state, tensor_type, f);
done:
    for (int i = 0; i < 11; i++)
        Py_XDECREF(f[i]);
    if (same < 0)
        return NULL;
    return PyBool_FromLong(same);
}

static PyMethodDef state_record_methods[] = {
    {"replica_devices", replica_devices, METH_VARARGS,
     "replica_devices(tensors, plain_types) -> per tensor a device code (None for None), or None when one is "
     "not plainly a tensor of its own data (Note [Plain replica tensors])."},
    {"record_state", record_state, METH_VARARGS,
     "record_state(name, arg_names, tensors) -> bool: one record, as if kernel `name` wrote `tensors` (all on "
     "one device), into this thread's active recorder (False: none); arg_names: a list of str or "
     "intern_names' bytes; Note [Replica state records]."},
    {"record_grads", (PyCFunction)(void (*)(void))record_grads, METH_VARARGS | METH_KEYWORDS,
     "record_grads(*, what, groups, sizes, params, devices, ids, indices, plain_types) -> int | None: the "
     "flight recorder's gradient records from its cached plan, or None (nothing recorded) when the plan no "
     "longer fits (Note [Replica checks in C])."},
    {"state_unchanged", state_unchanged, METH_VARARGS,
     "state_unchanged(groups, state, check, tensor_type) -> bool: whether opt's parameters and state are "
     "the objects kdebug/flight.py's _StateCheck saw "
     "(Note [Replica checks in C])."},
    {"intern_names", intern_names, METH_O,
     "intern_names(names) -> bytes: the names' string ids (native uint32 each; 0: kdebug's string table is "
     "full), for record_state (Note [Replica names interned once])."},
    {NULL, NULL, 0, NULL},
};

int kd_state_record_module_init(PyObject *m)
{
    if (PyModule_AddIntConstant(m, "STATE_RECORD_MAX", KD_GPU_BATCH_MAX) != 0)
        return -1;
    struct { PyObject **slot; const char *s; } strs[] = {
        {&str_grad, "grad"}, {&str_params, "params"}, {&str_sizes, "sizes"}, {&str_params_attr, "params"},
        {&str_keys, "keys"}, {&str_dicts, "dicts"}, {&str_lens, "lens"}, {&str_held_dicts, "held_dicts"},
        {&str_held_keys, "held_keys"}, {&str_held, "held"}, {&str_mixed, "mixed"},
        {&str_mixed_keys, "mixed_keys"}, {&str_others, "others"}};
    for (size_t i = 0; i < sizeof strs / sizeof strs[0]; i++)
        if (*strs[i].slot == NULL && (*strs[i].slot = PyUnicode_InternFromString(strs[i].s)) == NULL)
            return -1;
    return PyModule_AddFunctions(m, state_record_methods);
}
