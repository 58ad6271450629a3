/* kd_view.c - Launch: a read-only view of one stored launch record.
 * Python objects for a launch are made only when the user asks for them. */
#include "kd_args.h"
#include "kd_hash_py.h"
#include "kd_module.h"
#include "kd_recorder.h"
#include "kd_view.h"
#include "kd_types.h"
#include "kd_render.h"

/* Note [Launch views keep their record]
 * A view names a record by (launch table, store index): a Recorder's table
 * (Note [Launch table]), or a LaunchTable's (a kdebug.Run's, which is only
 * ever appended to).  A recorder's table is cleared
 * and refilled from index 0 (dm.operators = [], reset()), so a kept view
 * would silently become another launch.  Each recorder therefore links its
 * live views (GIL) and, before clearing, gives every view of the current
 * generation its own copy of its record: payloads, kept argument objects and
 * the dicts of recorded outputs and custom hashes.  A view that could not be
 * copied (out of memory) raises a clear error instead of showing another
 * launch; so does one whose generation is gone for any other reason. */
typedef struct kd_launch_view {
    PyObject_HEAD
    PyObject *owner;            /* strong ref: the Recorder or LaunchTable holding the table */
    kd_ltab *tab;               /* its launch table (Note [Launch table]) */
    struct kd_launch_view **head; /* its list of live views (GIL) */
    kd_recorder *rec;           /* owner when it is a Recorder (objects, outputs, custom hashes), else NULL */
    uint64_t index;
    uint64_t generation;        /* tab->generation when made */
    struct kd_launch_view *prev, *next; /* *head: live views (GIL) */
    kd_payload *own;            /* its record, once detached from the store */
    PyObject *own_objects;      /* tuple or None, once detached */
    PyObject *own_outputs;      /* the recorder's dicts when detached (or NULL) */
    PyObject *own_custom;
    int lost;                   /* detaching failed: the record is gone */
} kd_launch_view;

/* A new view of tab's launch `index` (tab inside owner; rec: owner when a
 * Recorder, else NULL), linked into the live views at *head. */
static PyObject *view_new(PyObject *owner, kd_ltab *tab, kd_launch_view **head, kd_recorder *rec, uint64_t index)
{
    kd_launch_view *v = PyObject_New(kd_launch_view, &kd_LaunchType);
    if (v == NULL)
        return NULL;
    v->owner = Py_NewRef(owner);
    v->tab = tab;
    v->head = head;
    v->rec = rec;
    v->index = index;
    v->generation = tab->generation;
    v->own = NULL;
    v->own_objects = v->own_outputs = v->own_custom = NULL;
    v->lost = 0;
    v->prev = NULL;
    v->next = *head;
    if (*head != NULL)
        (*head)->prev = v;
    *head = v;
    return (PyObject *)v;
}

PyObject *kd_launch_view_new(kd_recorder *r, uint64_t index)
{
    return view_new((PyObject *)r, &r->table, &r->views, r, index);
}

PyObject *kd_table_view_new(PyObject *owner, kd_ltab *tab, struct kd_launch_view **head, uint64_t index)
{
    return view_new(owner, tab, head, NULL, index);
}

/* Removes v from its recorder's list of live views. */
static void unlink_view(kd_launch_view *v)
{
    if (v->prev != NULL)
        v->prev->next = v->next;
    else if (*v->head == v)
        *v->head = v->next;
    if (v->next != NULL)
        v->next->prev = v->prev;
    v->prev = v->next = NULL;
}

/* Unlinks and frees a view (and its own copy, if detached). */
static void view_dealloc(kd_launch_view *v)
{
    unlink_view(v);
    PyMem_Free(v->own);
    Py_XDECREF(v->own_objects);
    Py_XDECREF(v->own_outputs);
    Py_XDECREF(v->own_custom);
    Py_XDECREF(v->owner);
    PyObject_Free(v);
}

static PyObject *get_objects(kd_launch_view *v, void *c);

static long injected_detach_faults = 0; /* GIL; tests: the next N copies fail as out of memory would */

/* _inject_detach_faults(n): the next n record copies fail (tests only). */
PyObject *kd_inject_detach_faults(PyObject *m, PyObject *arg)
{
    (void)m;
    long n = PyLong_AsLong(arg);
    if (n == -1 && PyErr_Occurred())
        return NULL;
    injected_detach_faults = n < 0 ? 0 : n;
    Py_RETURN_NONE;
}

/* Gives v its own copy of its record (Note [Launch views keep their record]). */
static void detach_view(kd_launch_view *v)
{
    kd_recorder *r = v->rec;
    if (v->own != NULL || v->lost || v->generation != v->tab->generation || v->index >= v->tab->store.nlaunches)
        return;
    const kd_payload *h = kd_store_launch(&v->tab->store, v->index);
    size_t n = 1u + h->launch.nslots;
    PyObject *objs = get_objects(v, NULL);
    kd_payload *own = PyMem_Malloc(n * sizeof(kd_payload));
    if (injected_detach_faults > 0) {
        injected_detach_faults--;
        PyMem_Free(own);
        own = NULL;
    }
    if (own == NULL || objs == NULL) {
        PyMem_Free(own);
        Py_XDECREF(objs);
        PyErr_Clear();
        v->lost = 1;
        return;
    }
    memcpy(own, h, n * sizeof(kd_payload));
    v->own = own;
    v->own_objects = objs;
    v->own_outputs = r ? Py_XNewRef(r->outputs) : NULL;
    v->own_custom = r ? Py_XNewRef(r->custom) : NULL;
}

/* Every live view of r's current generation takes its own copy (before r is cleared). */
void kd_launch_views_detach(kd_recorder *r)
{
    for (kd_launch_view *v = r->views; v != NULL; v = v->next)
        detach_view(v);
}

/* The record v shows, or NULL with a RuntimeError when it is gone. */
static const kd_payload *hdr(kd_launch_view *v)
{
    if (v->own != NULL)
        return v->own;
    if (v->lost || v->generation != v->tab->generation || v->index >= v->tab->store.nlaunches) {
        PyErr_SetString(PyExc_RuntimeError,
                        "kdebug: this kernel record was cleared (dm.operators was reset) and could not "
                        "be kept (out of memory); its launch is no longer available");
        return NULL;
    }
    return kd_store_launch(&v->tab->store, v->index);
}

static PyObject *str_id(uint32_t id)
{
    size_t n;
    const char *s = kd_strtab_get(kd_strings, id, &n);
    return PyUnicode_DecodeUTF8(s, (Py_ssize_t)n, "replace");
}

static const char *device_type_name(int t)
{
    static const char *names[] = {"cpu", "cuda", "mkldnn", "opengl", "opencl", "ideep",
                                  "hip", "fpga", "maia", "xla", "vulkan", "metal",
                                  "xpu", "mps", "meta", "hpu", "ve", "lazy", "ipu",
                                  "mtia", "privateuseone"};
    if (t >= 0 && t < (int)(sizeof names / sizeof names[0]))
        return names[t];
    return "unknown";
}

static PyObject *device_str(int type, int index)
{
    if (index < 0)
        return PyUnicode_FromString(device_type_name(type));
    return PyUnicode_FromFormat("%s:%d", device_type_name(type), index);
}

#define U64(expr) PyLong_FromUnsignedLongLong((unsigned long long)(expr))

static PyObject *get_kind(kd_launch_view *v, void *c)
{
    (void)c;
    const kd_payload *h = hdr(v);
    if (h == NULL)
        return NULL;
    return PyUnicode_FromString(h->launch.kind == KD_KIND_CPP ? "cpp" : h->launch.kind == KD_KIND_ATEN ? "aten" : "triton");
}
static PyObject *get_name(kd_launch_view *v, void *c)
{
    (void)c;
    const kd_payload *h = hdr(v);
    return h == NULL ? NULL : str_id(h->launch.name_id);
}
static PyObject *get_grid(kd_launch_view *v, void *c)
{
    (void)c;
    const kd_payload *hp = hdr(v);
    if (hp == NULL)
        return NULL;
    const kd_launch *l = &hp->launch;
    if (!(l->flags & KD_LF_GRID))
        Py_RETURN_NONE;
    return Py_BuildValue("(III)", l->grid[0], l->grid[1], l->grid[2]);
}
/* The chosen config's fields (closure: which), None without a config. */
enum { CFG_TEXT, CFG_WARPS, CFG_STAGES, CFG_SHARED };
static PyObject *get_config_field(kd_launch_view *v, void *which)
{
    const kd_payload *hp = hdr(v);
    if (hp == NULL)
        return NULL;
    const kd_launch *l = &hp->launch;
    if (!(l->flags & KD_LF_CONFIG))
        Py_RETURN_NONE;
    switch ((int)(intptr_t)which) {
    case CFG_TEXT: return str_id(l->config_id);
    case CFG_WARPS: return PyLong_FromLong(l->num_warps);
    case CFG_STAGES: return PyLong_FromLong(l->num_stages);
    default: return PyLong_FromUnsignedLong(l->shared_mem);
    }
}
static PyObject *get_device(kd_launch_view *v, void *c)
{
    (void)c;
    const kd_payload *hp = hdr(v);
    if (hp == NULL)
        return NULL;
    const kd_launch *l = &hp->launch;
    return device_str(l->device_type, l->device_index);
}
static PyObject *get_stream(kd_launch_view *v, void *c)
{
    (void)c;
    const kd_payload *h = hdr(v);
    return h == NULL ? NULL : U64(h->launch.stream);
}
static PyObject *get_thread(kd_launch_view *v, void *c)
{
    (void)c;
    const kd_payload *h = hdr(v);
    return h == NULL ? NULL : U64(h->launch.thread_id);
}
static PyObject *get_index(kd_launch_view *v, void *c)
{
    (void)c;
    const kd_payload *h = hdr(v);
    return h == NULL ? NULL : U64(h->launch.launch_index);
}
static PyObject *get_store_index(kd_launch_view *v, void *c)
{
    (void)c;
    if (v->own != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "this launch record was cleared from its recorder's store "
                        "(the view keeps its own copy): it has no store index");
        return NULL;
    }
    return hdr(v) == NULL ? NULL : U64(v->index);
}
static PyObject *get_py_index(kd_launch_view *v, void *c)
{
    (void)c;
    const kd_payload *h = hdr(v);
    return h == NULL ? NULL : U64(h->launch.py_index);
}
static PyObject *get_depth(kd_launch_view *v, void *c)
{
    (void)c;
    const kd_payload *h = hdr(v);
    return h == NULL ? NULL : PyLong_FromLong(h->launch.call_depth);
}
static PyObject *get_t0(kd_launch_view *v, void *c)
{
    (void)c;
    const kd_payload *h = hdr(v);
    return h == NULL ? NULL : U64(h->launch.t_start_ns);
}
static PyObject *get_t1(kd_launch_view *v, void *c)
{
    (void)c;
    const kd_payload *h = hdr(v);
    return h == NULL ? NULL : U64(h->launch.t_end_ns);
}
static PyObject *get_nargs(kd_launch_view *v, void *c)
{
    (void)c;
    const kd_payload *h = hdr(v);
    return h == NULL ? NULL : PyLong_FromLong(h->launch.nargs);
}
static PyObject *get_raised(kd_launch_view *v, void *c)
{
    (void)c;
    const kd_payload *h = hdr(v);
    return h == NULL ? NULL : PyBool_FromLong(h->launch.flags & KD_LF_RAISED);
}

/* Note [CUDA graph replays]: None, or {"graph": id, "replay": index or None (captured, not run)}. */
static PyObject *get_cuda_graph(kd_launch_view *v, void *c)
{
    (void)c;
    const kd_payload *h = hdr(v);
    if (h == NULL)
        return NULL;
    if (h->launch.flags & KD_LF_REPLAYED)
        return Py_BuildValue("{s:k,s:K}", "graph", (unsigned long)h->launch.graph_id, "replay",
                             (unsigned long long)h->launch.replay_index);
    if (h->launch.flags & KD_LF_CAPTURED)
        return Py_BuildValue("{s:k,s:O}", "graph", (unsigned long)h->launch.graph_id, "replay", Py_None);
    Py_RETURN_NONE;
}

static PyObject *int_tuple(const kd_payload *p, int strides)
{
    uint32_t nd = p->tensor.ndim;
    PyObject *t = PyTuple_New(nd);
    for (uint32_t d = 0; t && d < nd; d++) {
        int64_t size, stride;
        kd_tensor_dim(p, d, &size, &stride);
        PyObject *x = PyLong_FromLongLong(strides ? stride : size);
        if (x == NULL) {
            Py_CLEAR(t);
            break;
        }
        PyTuple_SET_ITEM(t, d, x);
    }
    return t;
}

/* One argument as a TensorArg or a ScalarArg (Note [Typed boundaries] in kd_types.c). */
static PyObject *arg_record(const kd_payload *a)
{
    const kd_scalar_arg *s = &a->scalar;
    if (a->tag == KD_TAG_TENSOR) {
        const kd_tensor_arg *t = &a->tensor;
        return KD_RECORD(kd_TensorArgType, PyUnicode_FromString("tensor"), str_id(t->name_id),
                         PyLong_FromLong(t->role), PyLong_FromLong(t->dtype), int_tuple(a, 0), int_tuple(a, 1),
                         PyLong_FromLongLong(t->storage_offset), U64(t->data_ptr),
                         device_str(t->device_type, t->device_index));
    }
    const char *kind;
    PyObject *value;
    switch (a->tag) {
    case KD_TAG_INT: kind = "int", value = PyLong_FromLongLong((long long)s->value.i); break;
    case KD_TAG_FLOAT: kind = "float", value = PyFloat_FromDouble(s->value.f); break;
    case KD_TAG_BOOL: kind = "bool", value = PyBool_FromLong(s->value.i != 0); break;
    case KD_TAG_NONE: kind = "none", value = Py_NewRef(Py_None); break;
    default: kind = "other", value = str_id(s->value.type_name_id); break;
    }
    return KD_RECORD(kd_ScalarArgType, PyUnicode_FromString(kind), str_id(s->name_id), PyLong_FromLong(s->role),
                     value);
}

/* t, a tuple of one item per argument filled by walk it, or NULL with a
 * RuntimeError when the walk stopped short (its other items are unset). */
static PyObject *args_done(PyObject *t, const kd_arg_iter *it)
{
    if (t != NULL && kd_args_truncated(it)) {
        Py_DECREF(t);
        PyErr_SetString(PyExc_RuntimeError, "kdebug: this launch record is corrupt (its arguments run past its payloads)");
        return NULL;
    }
    return t;
}

static PyObject *get_args(kd_launch_view *v, void *c)
{
    (void)c;
    const kd_payload *h = hdr(v);
    if (h == NULL)
        return NULL;
    PyObject *t = PyTuple_New(h->launch.nargs);
    kd_arg_iter it = kd_args_begin(h, 1u + h->launch.nslots);
    while (t && kd_args_next(&it)) {
        PyObject *x = arg_record(it.arg);
        if (x == NULL) {
            Py_CLEAR(t);
            break;
        }
        PyTuple_SET_ITEM(t, it.index, x);
    }
    return args_done(t, &it);
}

/* The argument objects kept with store_original_args, or None. */
static PyObject *get_objects(kd_launch_view *v, void *c)
{
    (void)c;
    kd_recorder *r = v->rec;
    if (v->own != NULL)
        return Py_NewRef(v->own_objects);
    const kd_payload *h = hdr(v);
    if (h == NULL)
        return NULL;
    if (r == NULL || (r->store_objs == NULL && !r->store_objects))
        Py_RETURN_NONE; /* a LaunchTable keeps no objects */
    uint64_t base = kd_store_offset(&r->table.store, v->index); /* never dropped: Note [Dropping from the front] */
    PyObject *t = PyTuple_New(h->launch.nargs);
    kd_arg_iter it = kd_args_begin(h, 1u + h->launch.nslots);
    while (t && kd_args_next(&it)) {
        PyObject *o = NULL;
        if (r->store_objs != NULL && base + it.off < r->store_objs_cap)
            o = r->store_objs[base + it.off];
        PyTuple_SET_ITEM(t, it.index, Py_NewRef(o ? o : Py_None));
    }
    return args_done(t, &it);
}

static PyObject *hash_side(const kd_hash_rec *h, int w)
{
    /* a side still waiting for its GPU result holds the result's index, not a
     * hash: absent, as the trace writer and the launch digests take it */
    if (!(h->flags & (w ? KD_HF_POST : KD_HF_PRE)) || (h->flags & (w ? KD_HF_PENDING_POST : KD_HF_PENDING_PRE)))
        Py_RETURN_NONE;
    const int stats = (h->kinds & KD_HK_STATS) != 0; /* Note [Room for the stats] */
    return kd_hash_values(h->bitwise[w], h->l1[w], h->nan[w], h->posinf[w], h->neginf[w], stats ? 0 : h->xor64[w],
                          (h->flags & KD_HF_UNSUPPORTED) != 0, stats ? h->sum[w] : 0.0,
                          stats ? h->absmax[w] : 0.0);
}

/* Per argument: None, or an ArgHashes (kinds, flags, spec, pre, post) where
 * pre / post are None or a HashValues (Note [HashValues] in kd_hash_py.c). */
static PyObject *get_hashes(kd_launch_view *v, void *c)
{
    (void)c;
    const kd_payload *h = hdr(v);
    if (h == NULL)
        return NULL;
    PyObject *t = PyTuple_New(h->launch.nargs);
    kd_arg_iter it = kd_args_begin(h, 1u + h->launch.nslots);
    while (t && kd_args_next(&it)) {
        PyObject *x;
        const kd_hash_rec *hr = it.hash;
        if (hr != NULL) {
            x = KD_RECORD(kd_ArgHashesType, PyLong_FromLong(hr->kinds), PyLong_FromLong(hr->flags),
                          PyLong_FromLong(hr->spec), hash_side(hr, 0), hash_side(hr, 1));
        } else {
            x = Py_NewRef(Py_None);
        }
        if (x == NULL) {
            Py_CLEAR(t);
            break;
        }
        PyTuple_SET_ITEM(t, it.index, x);
    }
    return args_done(t, &it);
}

/* A dict of the recorder's (outputs or custom hashes) as of this view's
 * generation: a new empty dict when there is none. */
static PyObject *recorder_dict(kd_launch_view *v, PyObject *own, PyObject *live)
{
    if (hdr(v) == NULL)
        return NULL;
    PyObject *d = v->own != NULL ? own : live;
    return d != NULL ? Py_NewRef(d) : PyDict_New();
}
static PyObject *get_outputs(kd_launch_view *v, void *c)
{
    (void)c;
    return recorder_dict(v, v->own_outputs, v->rec ? v->rec->outputs : NULL);
}
static PyObject *get_custom(kd_launch_view *v, void *c)
{
    (void)c;
    return recorder_dict(v, v->own_custom, v->rec ? v->rec->custom : NULL);
}
static PyObject *get_detached(kd_launch_view *v, void *c)
{
    (void)c;
    return PyBool_FromLong(v->own != NULL);
}

static kd_render_ctx render_ctx(void)
{
    kd_render_ctx c = {kd_strings, kd_dtype_names, 256};
    return c;
}

typedef size_t (*render_fn)(const kd_render_ctx *, const kd_payload *, int, char *, size_t);

static PyObject *render_with(kd_launch_view *v, PyObject *args, PyObject *kw, render_fn fn)
{
    int verbose = 0;
    static char *kwlist[] = {"verbose", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|p", kwlist, &verbose))
        return NULL;
    const kd_payload *h = hdr(v);
    if (h == NULL)
        return NULL;
    kd_render_ctx ctx = render_ctx();
    int flags = verbose ? KD_RENDER_VERBOSE : 0;
    char buf[1024];
    size_t n = fn(&ctx, h, flags, buf, sizeof buf);
    if (n < sizeof buf)
        return PyUnicode_DecodeUTF8(buf, (Py_ssize_t)n, "replace");
    char *big = PyMem_Malloc(n + 1);
    if (big == NULL)
        return PyErr_NoMemory();
    fn(&ctx, h, flags, big, n + 1);
    PyObject *s = PyUnicode_DecodeUTF8(big, (Py_ssize_t)n, "replace");
    PyMem_Free(big);
    return s;
}

static PyObject *view_render(kd_launch_view *v, PyObject *args, PyObject *kw)
{
    return render_with(v, args, kw, kd_render_launch);
}

static PyObject *view_render_args(kd_launch_view *v, PyObject *args, PyObject *kw)
{
    return render_with(v, args, kw, kd_render_args);
}

static PyMethodDef view_methods[] = {
    {"render", (PyCFunction)(void (*)(void))view_render, METH_VARARGS | METH_KEYWORDS,
     "render(verbose=False): the launch as one line of text (rendered in C)."},
    {"render_args", (PyCFunction)(void (*)(void))view_render_args, METH_VARARGS | METH_KEYWORDS,
     "render_args(verbose=False): 'name=value, ...' for every argument."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef view_getset[] = {
    {"kind", (getter)get_kind, NULL, "'triton', 'cpp' or 'aten' (an op recorded by the C++ op observer)", NULL},
    {"kernel_name", (getter)get_name, NULL, "kernel name", NULL},
    {"grid", (getter)get_grid, NULL, "(x, y, z) as launched, or None", NULL},
    {"config", (getter)get_config_field, NULL, "block sizes of the chosen config, or None", (void *)CFG_TEXT},
    {"num_warps", (getter)get_config_field, NULL, "num_warps of the chosen config", (void *)CFG_WARPS},
    {"num_stages", (getter)get_config_field, NULL, "num_stages of the chosen config", (void *)CFG_STAGES},
    {"shared_mem", (getter)get_config_field, NULL, "shared memory bytes of the launcher", (void *)CFG_SHARED},
    {"device", (getter)get_device, NULL, "device string", NULL},
    {"stream", (getter)get_stream, NULL, "raw CUDA stream (0 for CPU kernels)", NULL},
    {"thread_id", (getter)get_thread, NULL, "Python thread ident of the launching thread", NULL},
    {"launch_index", (getter)get_index, NULL, "0-based launch number in this recorder", NULL},
    {"store_index", (getter)get_store_index, NULL, "position in the recorder's store (trace writer)", NULL},
    {"py_index", (getter)get_py_index, NULL, "len(operators) when launched", NULL},
    {"call_depth", (getter)get_depth, NULL, "DebugMode call depth of the launch", NULL},
    {"t_start_ns", (getter)get_t0, NULL, "CLOCK_MONOTONIC before the launch (Note [Launch timestamps from the TSC])", NULL},
    {"t_end_ns", (getter)get_t1, NULL, "CLOCK_MONOTONIC after the launch returned", NULL},
    {"nargs", (getter)get_nargs, NULL, "number of arguments", NULL},
    {"raised", (getter)get_raised, NULL, "whether the launch raised", NULL},
    {"cuda_graph", (getter)get_cuda_graph, NULL,
     "None, or {'graph': id, 'replay': index, or None for the capture (did not run)}", NULL},
    {"args", (getter)get_args, NULL, "per argument: a TensorArg or a ScalarArg (Note [Typed boundaries])", NULL},
    {"objects", (getter)get_objects, NULL, "argument objects kept, or None", NULL},
    {"hashes", (getter)get_hashes, NULL, "per argument: None or an ArgHashes (kinds, flags, spec, pre, post)", NULL},
    {"outputs", (getter)get_outputs, NULL, "the recorder's {launch_index: {name: clone}} of this record's generation", NULL},
    {"custom", (getter)get_custom, NULL, "the recorder's custom hash values of this record's generation", NULL},
    {"detached", (getter)get_detached, NULL, "whether the view holds its own copy (its recorder was cleared)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject kd_LaunchType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kdebug._C.Launch",
    .tp_basicsize = sizeof(kd_launch_view),
    .tp_dealloc = (destructor)view_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A read-only view of one recorded kernel launch.",
    .tp_methods = view_methods,
    .tp_getset = view_getset,
};
