/* kd_fmt.c - upstream DebugMode's argument strings, made in C.
 *
 * Upstream renders an aten op's argument as str(tree_map(to_str, arg)): every
 * plain tensor becomes "t: f32[8, 256]", then Python's str() of the result
 * (so tensors inside containers show up quoted).  kd_format_arg produces the
 * same text for the cases that cover nearly every op (plain torch.Tensor /
 * nn.Parameter, exact list / tuple / dict, and simple leaves) and returns
 * NotImplemented for anything else, so the caller can fall back to upstream's
 * Python code and stay exact.
 *
 * The one intended difference (Note [Stable argument text] in
 * kdebug/_argtext.py): a leaf whose upstream text is not its value (a
 * torch.Generator, anything whose str()/repr() holds an address) gets the
 * text leaf_text(o, top) gives; that function says NotImplemented for every
 * other leaf, which then falls back to upstream as before.
 *
 * Note [Formatting runs user code]
 * A leaf's str() / repr() and leaf_text are Python code, which may change
 * the containers being formatted (clear a list, pop a dict entry) or drop the
 * last reference to what is being read.  So a list is formatted from a copy
 * (PyList_GetSlice) and a dict from PyDict_Items, each holding references to
 * its elements, never from the live container with a length read before.  An
 * adversarial review found the live loops reading freed elements.  The same
 * rule holds for kd_hash_tree.c's leaf digests.
 */
#include <string.h>

#include "kd_fmt.h"
#include "kd_module.h"
#include "kd_shim.h"

static PyObject *tensor_type = NULL;    /* torch.Tensor */
static PyObject *parameter_type = NULL; /* torch.nn.Parameter */
static PyObject *leaf_types = NULL;     /* tuple of types rendered with str()/repr() */
static PyObject *leaf_text_fn = NULL;   /* kdebug._argtext.leaf_text(o, top), or NULL */

/* Text under construction: in `small` until it outgrows it (most op records
 * do not), then on the heap. */
typedef struct buf {
    char *p;
    size_t len, cap;
    int fail;
    char small[512];
} buf;

static void buf_init(buf *b)
{
    b->p = b->small;
    b->len = 0;
    b->cap = sizeof b->small;
    b->fail = 0;
}

static void put(buf *b, const char *s, size_t n)
{
    if (b->fail)
        return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap * 2;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *p = b->p == b->small ? PyMem_Malloc(cap) : PyMem_Realloc(b->p, cap);
        if (p == NULL) {
            b->fail = 1;
            return;
        }
        if (b->p == b->small)
            memcpy(p, b->small, b->len);
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
}

/* Appends the decimal text of v. */
static void put_int(buf *b, long long v)
{
    char num[24];
    char *e = num + sizeof num, *q = e;
    unsigned long long u = v < 0 ? 0ull - (unsigned long long)v : (unsigned long long)v;
    do {
        *--q = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    if (v < 0)
        *--q = '-';
    put(b, q, (size_t)(e - q));
}

static void puts_(buf *b, const char *s) { put(b, s, strlen(s)); }

static void put_obj(buf *b, PyObject *s)
{
    Py_ssize_t n;
    const char *c = s ? PyUnicode_AsUTF8AndSize(s, &n) : NULL;
    if (c == NULL) {
        b->fail = 1;
        return;
    }
    put(b, c, (size_t)n);
}

/* 1 written, 0 not a plain tensor, -1 error */
static int tensor_str(buf *b, PyObject *o, int quoted)
{
    PyObject *t = (PyObject *)Py_TYPE(o);
    if (t != tensor_type && t != parameter_type)
        return 0;
    kd_tensor_meta m;
    if (kd_shim_tensor_meta(o, &m) != 1 || m.dtype < 0 || m.dtype > 255 ||
        kd_dtype_names[m.dtype] == NULL)
        return 0;
    if (quoted)
        put(b, "'", 1);
    puts_(b, "t: ");
    puts_(b, kd_dtype_names[m.dtype]);
    put(b, "[", 1);
    for (int d = 0; d < m.ndim; d++) {
        if (d)
            put(b, ", ", 2);
        put_int(b, (long long)m.sizes[d]);
    }
    put(b, "]", 1);
    if (quoted)
        put(b, "'", 1);
    return 1;
}

/* A leaf of no type the formatter knows: leaf_text_fn's text (Note [Stable
 * argument text]), or 0 (fall back to upstream) when it says NotImplemented. */
static int leaf_text(buf *b, PyObject *o, int top)
{
    if (leaf_text_fn == NULL)
        return 0;
    PyObject *s = PyObject_CallFunctionObjArgs(leaf_text_fn, o, top ? Py_True : Py_False, NULL);
    if (s == NULL)
        return -1;
    int r = 1;
    if (s == Py_NotImplemented)
        r = 0;
    else if (!PyUnicode_Check(s)) {
        PyErr_SetString(PyExc_TypeError, "kdebug: leaf_text must return a str or NotImplemented");
        r = -1;
    } else
        put_obj(b, s);
    Py_DECREF(s);
    return r == 1 && b->fail ? -1 : r;
}

/* The repr() of a dict key; a key whose repr is not stable gets leaf_text's. */
static int key_text(buf *b, PyObject *k)
{
    if (!PyUnicode_CheckExact(k) && !PyLong_CheckExact(k) && leaf_text_fn != NULL) {
        int r = leaf_text(b, k, 0);
        if (r != 0)
            return r;
    }
    PyObject *kr = PyObject_Repr(k);
    if (kr == NULL)
        return -1;
    put_obj(b, kr);
    Py_DECREF(kr);
    return b->fail ? -1 : 1;
}

/* Appends the rendering of o; top: not inside a container (str, not repr).
 * Returns 1 done, 0 unsupported (fall back), -1 error. */
static int fmt(buf *b, PyObject *o, int top, int depth)
{
    if (depth > 32)
        return 0;
    int r = tensor_str(b, o, !top);
    if (r != 0)
        return r;
    if (PyList_CheckExact(o) || PyTuple_CheckExact(o)) {
        /* Note [Formatting runs user code]: an element's repr (or leaf_text)
         * is Python code that may change a list, so a list is formatted from
         * a copy holding its elements */
        int is_list = PyList_CheckExact(o);
        PyObject *seq = is_list ? PyList_GetSlice(o, 0, PY_SSIZE_T_MAX) : Py_NewRef(o);
        if (seq == NULL)
            return -1;
        Py_ssize_t n = is_list ? PyList_GET_SIZE(seq) : PyTuple_GET_SIZE(seq);
        put(b, is_list ? "[" : "(", 1);
        r = 1;
        for (Py_ssize_t i = 0; i < n && r == 1; i++) {
            if (i)
                put(b, ", ", 2);
            PyObject *x = is_list ? PyList_GET_ITEM(seq, i) : PyTuple_GET_ITEM(seq, i);
            r = fmt(b, x, 0, depth + 1);
        }
        Py_DECREF(seq);
        if (r != 1)
            return r;
        if (!is_list && n == 1)
            put(b, ",", 1);
        put(b, is_list ? "]" : ")", 1);
        return b->fail ? -1 : 1;
    }
    if (PyDict_CheckExact(o)) {
        PyObject *items = PyDict_Items(o); /* a copy of its pairs (Note [Formatting runs user code]) */
        if (items == NULL)
            return -1;
        put(b, "{", 1);
        r = 1;
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(items) && r == 1; i++) {
            PyObject *kv = PyList_GET_ITEM(items, i);
            if (i)
                put(b, ", ", 2);
            if (key_text(b, PyTuple_GET_ITEM(kv, 0)) < 0) {
                r = -1;
                break;
            }
            put(b, ": ", 2);
            r = fmt(b, PyTuple_GET_ITEM(kv, 1), 0, depth + 1);
        }
        Py_DECREF(items);
        if (r != 1)
            return r;
        put(b, "}", 1);
        return b->fail ? -1 : 1;
    }
    if (leaf_types == NULL)
        return 0;
    int ok = PyObject_TypeCheck(o, &PyLong_Type) ? PyLong_CheckExact(o) || PyBool_Check(o)
                                                 : 0;
    if (!ok) {
        PyObject *t = (PyObject *)Py_TYPE(o);
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(leaf_types); i++)
            if (t == PyTuple_GET_ITEM(leaf_types, i)) {
                ok = 1;
                break;
            }
    }
    if (!ok)
        return leaf_text(b, o, top);
    if (PyLong_CheckExact(o)) { /* str and repr agree */
        int overflow;
        long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
        if (!overflow && !(v == -1 && PyErr_Occurred())) {
            put_int(b, v);
            return b->fail ? -1 : 1;
        }
        PyErr_Clear();
    }
    PyObject *s = top ? PyObject_Str(o) : PyObject_Repr(o);
    if (s == NULL)
        return -1;
    put_obj(b, s);
    Py_DECREF(s);
    return b->fail ? -1 : 1;
}

static PyObject *finish(buf *b, int r, const char *prefix)
{
    PyObject *out;
    if (r == 1 && !b->fail)
        out = PyUnicode_DecodeUTF8(b->p, (Py_ssize_t)b->len, "strict");
    else if (r == 0 && !PyErr_Occurred())
        out = Py_NewRef(Py_NotImplemented);
    else {
        if (!PyErr_Occurred())
            PyErr_NoMemory();
        out = NULL;
    }
    (void)prefix;
    if (b->p != b->small)
        PyMem_Free(b->p);
    return out;
}

/* format_args(args: tuple) -> ", ".join(_arg_to_str(a) for a in args), or NotImplemented */
PyObject *kd_format_args(PyObject *m, PyObject *args)
{
    (void)m;
    if (!PyTuple_Check(args)) {
        PyErr_SetString(PyExc_TypeError, "format_args expects a tuple");
        return NULL;
    }
    buf b;
    buf_init(&b);
    int r = 1;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(args) && r == 1; i++) {
        if (i)
            put(&b, ", ", 2);
        r = fmt(&b, PyTuple_GET_ITEM(args, i), 1, 0);
    }
    return finish(&b, r, NULL);
}

/* format_kwargs(kwargs: dict) -> upstream's kwargs_str ("" or ", k=v, ..."), or NotImplemented */
PyObject *kd_format_kwargs(PyObject *m, PyObject *kwargs)
{
    (void)m;
    if (!PyDict_Check(kwargs)) {
        PyErr_SetString(PyExc_TypeError, "format_kwargs expects a dict");
        return NULL;
    }
    PyObject *items = PyDict_Items(kwargs); /* Note [Formatting runs user code] */
    if (items == NULL)
        return NULL;
    buf b;
    buf_init(&b);
    int r = 1;
    for (Py_ssize_t i = 0; r == 1 && i < PyList_GET_SIZE(items); i++) {
        PyObject *kv = PyList_GET_ITEM(items, i);
        put(&b, ", ", 2);
        PyObject *ks = PyObject_Str(PyTuple_GET_ITEM(kv, 0));
        if (ks == NULL) {
            r = -1; /* finish frees the buffer (a heap one only) */
            break;
        }
        put_obj(&b, ks);
        Py_DECREF(ks);
        put(&b, "=", 1);
        r = fmt(&b, PyTuple_GET_ITEM(kv, 1), 1, 0);
    }
    Py_DECREF(items);
    if (b.len == 0 && r == 1)
        put(&b, "", 0);
    return finish(&b, r, NULL);
}

/* 1 if every pytree leaf of o is None (vacuously true for empty containers),
 * 0 if not, -1 if o holds something this does not know (fall back). */
static int all_none(PyObject *o, int depth)
{
    if (o == Py_None)
        return 1;
    if (depth > 32)
        return -1;
    if (PyList_CheckExact(o) || PyTuple_CheckExact(o)) {
        int is_list = PyList_CheckExact(o);
        Py_ssize_t n = is_list ? PyList_GET_SIZE(o) : PyTuple_GET_SIZE(o);
        int res = 1;
        for (Py_ssize_t i = 0; i < n; i++) {
            int r = all_none(is_list ? PyList_GET_ITEM(o, i) : PyTuple_GET_ITEM(o, i), depth + 1);
            if (r < 0)
                return r;
            res &= r;
        }
        return res;
    }
    if (PyDict_CheckExact(o)) {
        PyObject *k, *v;
        Py_ssize_t pos = 0;
        int res = 1;
        while (PyDict_Next(o, &pos, &k, &v)) {
            int r = all_none(v, depth + 1);
            if (r < 0)
                return r;
            res &= r;
        }
        return res;
    }
    return 0;
}

/* format_output(result) -> None (nothing to show), "  ->  ...", or NotImplemented */
PyObject *kd_format_output(PyObject *m, PyObject *result)
{
    (void)m;
    int an = all_none(result, 0);
    if (an == 1)
        Py_RETURN_NONE;
    buf b;
    buf_init(&b);
    put(&b, "  ->  ", 6);
    int r = an < 0 ? 0 : fmt(&b, result, 1, 0);
    return finish(&b, r, NULL);
}

static PyObject *kd_configure_fmt(PyObject *m, PyObject *args)
{
    (void)m;
    PyObject *t, *p, *leaves, *text = Py_None;
    if (!PyArg_ParseTuple(args, "OOO!|O", &t, &p, &PyTuple_Type, &leaves, &text))
        return NULL;
    if (text != Py_None && !PyCallable_Check(text)) {
        PyErr_SetString(PyExc_TypeError, "_configure_fmt: leaf_text must be callable or None");
        return NULL;
    }
    Py_XSETREF(tensor_type, Py_NewRef(t));
    Py_XSETREF(parameter_type, Py_NewRef(p));
    Py_XSETREF(leaf_types, Py_NewRef(leaves));
    Py_XSETREF(leaf_text_fn, text == Py_None ? NULL : Py_NewRef(text));
    Py_RETURN_NONE;
}

static PyMethodDef fmt_methods[] = {
    {"format_args", kd_format_args, METH_O,
     "Upstream DebugMode's args_str for a tuple of op arguments, or NotImplemented."},
    {"format_kwargs", kd_format_kwargs, METH_O,
     "Upstream DebugMode's kwargs_str for a dict, or NotImplemented."},
    {"format_output", kd_format_output, METH_O,
     "Upstream DebugMode's output_str for an op result (None: nothing), or NotImplemented."},
    {"_configure_fmt", kd_configure_fmt, METH_VARARGS,
     "_configure_fmt(torch.Tensor, nn.Parameter, leaf_types, leaf_text=None)"},
    {NULL, NULL, 0, NULL},
};

int kd_fmt_module_init(PyObject *m) { return PyModule_AddFunctions(m, fmt_methods); }
