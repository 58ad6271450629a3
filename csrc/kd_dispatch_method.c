/* kd_dispatch_method.c - DebugMode.__torch_dispatch__ as a C method.
 *
 * Note [A C __torch_dispatch__]
 * DebugMode.__torch_dispatch__ is a C method (dispatch_method, put on the
 * class by mode._configure through _dispatch_method) that calls
 * kd_dispatch_op (kd_dispatch.c, Note [Fast aten-op recording]): no Python
 * frame per op.  torch wraps every Python __torch_dispatch__ in
 * torch._dynamo.disable, two more Python frames and four eval-frame switches
 * per op, so that dynamo never traces into it; this method does what that
 * wrapper does only when it matters: if an eval-frame callback is set on this
 * thread (an aten op from a region dynamo is running), it is cleared for the
 * call and restored after, so the Python helpers called from kd_dispatch_op
 * and the ops' own Python code are never traced.  Where torch lacks the C
 * eval-frame calls, the Python wrapper in mode.py (dispatch(mode, ...)) stays.
 */
#include "kd_dispatch_method.h"
#include "kd_dispatch.h"

/* Set by _dispatch_method (strong references). */
static PyObject *get_eval_cb_fn; /* torch._C._dynamo.eval_frame.get_eval_frame_callback */
static PyObject *set_eval_cb_fn; /* torch._C._dynamo.eval_frame.set_eval_frame */
static PyObject *empty_args;     /* (): the method's default args */

/* DebugMode.__torch_dispatch__(self, func, types, args=(), kwargs=None), as
 * a method descriptor (Note [A C __torch_dispatch__]). */
static PyObject *dispatch_method(PyObject *self, PyObject *const *a, Py_ssize_t n, PyObject *kwnames)
{
    static const char *const names[4] = {"func", "types", "args", "kwargs"};
    PyObject *v[4] = {NULL, NULL, empty_args, Py_None};
    if (n > 4) {
        PyErr_Format(PyExc_TypeError, "__torch_dispatch__() takes at most 4 arguments (%zd given)", n);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++)
        v[i] = a[i];
    Py_ssize_t nk = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    for (Py_ssize_t k = 0; k < nk; k++) {
        PyObject *key = PyTuple_GET_ITEM(kwnames, k);
        int j = 0;
        while (j < 4 && PyUnicode_CompareWithASCIIString(key, names[j]) != 0)
            j++;
        if (j == 4 || j < n) {
            PyErr_Format(PyExc_TypeError, "__torch_dispatch__() got %s argument '%U'",
                         j == 4 ? "an unexpected keyword" : "multiple values for", key);
            return NULL;
        }
        v[j] = a[n + k];
    }
    if (v[0] == NULL || v[1] == NULL) {
        PyErr_SetString(PyExc_TypeError, "__torch_dispatch__() missing 'func' or 'types'");
        return NULL;
    }
    PyObject *cb = PyObject_CallNoArgs(get_eval_cb_fn);
    if (cb == NULL)
        return NULL;
    PyObject *prior = NULL;
    if (cb != Py_None) { /* what torch._dynamo.disable would do around a Python method */
        prior = PyObject_CallOneArg(set_eval_cb_fn, Py_None);
        if (prior == NULL) {
            Py_DECREF(cb);
            return NULL;
        }
    }
    Py_DECREF(cb);
    PyObject *result = kd_dispatch_op(self, v[0], v[1], v[2], v[3]);
    if (prior != NULL) {
        PyObject *et, *ev, *etb;
        PyErr_Fetch(&et, &ev, &etb);
        PyObject *r = PyObject_CallOneArg(set_eval_cb_fn, prior);
        Py_DECREF(prior);
        if (r == NULL) {
            Py_CLEAR(result);
            Py_XDECREF(et);
            Py_XDECREF(ev);
            Py_XDECREF(etb);
        } else {
            Py_DECREF(r);
            PyErr_Restore(et, ev, etb);
        }
    }
    return result;
}

static PyMethodDef dispatch_method_def = {
    "__torch_dispatch__", (PyCFunction)(void (*)(void))dispatch_method, METH_FASTCALL | METH_KEYWORDS,
    "kdebug's DebugMode.__torch_dispatch__ (Note [A C __torch_dispatch__] in csrc/kd_dispatch_method.c).",
};

/* _dispatch_method(cls, get_eval_frame_callback, set_eval_frame) -> a method
 * descriptor of cls to install as cls.__torch_dispatch__ */
static PyObject *kd_dispatch_method_new(PyObject *m, PyObject *args)
{
    (void)m;
    PyObject *cls, *get_cb, *set_cb;
    if (!PyArg_ParseTuple(args, "O!OO", &PyType_Type, &cls, &get_cb, &set_cb))
        return NULL;
    if (!PyCallable_Check(get_cb) || !PyCallable_Check(set_cb)) {
        PyErr_SetString(PyExc_TypeError, "_dispatch_method: the eval-frame functions must be callable");
        return NULL;
    }
    Py_XSETREF(get_eval_cb_fn, Py_NewRef(get_cb));
    Py_XSETREF(set_eval_cb_fn, Py_NewRef(set_cb));
    return PyDescr_NewMethod((PyTypeObject *)cls, &dispatch_method_def);
}

static PyMethodDef dispatch_method_methods[] = {
    {"_dispatch_method", kd_dispatch_method_new, METH_VARARGS,
     "_dispatch_method(cls, get_eval_frame_callback, set_eval_frame): cls.__torch_dispatch__ in C."},
    {NULL, NULL, 0, NULL},
};

/* Adds _dispatch_method to module m; -1 with an exception on failure. */
int kd_dispatch_method_module_init(PyObject *m)
{
    empty_args = PyTuple_New(0);
    if (empty_args == NULL)
        return -1;
    return PyModule_AddFunctions(m, dispatch_method_methods);
}
