/* kd_module.c - the kdebug._C module: global tables and module setup. */
#include <string.h>

#include "kd_py.h"
#include "kd_shim.h"

kd_strtab *kd_strings = NULL;
const char *kd_dtype_names[256];

static PyObject *mod_intern(PyObject *m, PyObject *arg)
{
    (void)m;
    Py_ssize_t n;
    const char *s = PyUnicode_AsUTF8AndSize(arg, &n);
    if (s == NULL)
        return NULL;
    uint32_t id = kd_strtab_intern(kd_strings, s, (size_t)n);
    if (id == 0) {
        PyErr_SetString(PyExc_ValueError,
                        "cannot intern this string (kdebug's string table is full, or it "
                        "contains a NUL character)");
        return NULL;
    }
    return PyLong_FromUnsignedLong(id);
}

static PyObject *mod_string(PyObject *m, PyObject *arg)
{
    (void)m;
    unsigned long id = PyLong_AsUnsignedLong(arg);
    if (id == (unsigned long)-1 && PyErr_Occurred())
        return NULL;
    size_t n;
    const char *s = kd_strtab_get(kd_strings, (uint32_t)id, &n);
    return PyUnicode_DecodeUTF8(s, (Py_ssize_t)n, "replace");
}

/* _set_dtype_names({torch.dtype: "f32", ...}): abbreviations for rendering. */
static PyObject *mod_set_dtype_names(PyObject *m, PyObject *arg)
{
    (void)m;
    if (!PyDict_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "expected a dict {torch.dtype: str}");
        return NULL;
    }
    PyObject *k, *v;
    Py_ssize_t pos = 0;
    int n = 0;
    while (PyDict_Next(arg, &pos, &k, &v)) {
        int st = kd_shim_dtype_scalar_type(k);
        if (st < 0 || st >= 256 || !PyUnicode_Check(v))
            continue;
        Py_ssize_t len;
        const char *s = PyUnicode_AsUTF8AndSize(v, &len);
        if (s == NULL)
            return NULL;
        uint32_t id = kd_strtab_intern(kd_strings, s, (size_t)len);
        kd_dtype_names[st] = kd_strtab_get(kd_strings, id, NULL); /* never freed */
        n++;
    }
    return PyLong_FromLong(n);
}

static PyObject *mod_scalar_type(PyObject *m, PyObject *arg)
{
    (void)m;
    int st = kd_shim_dtype_scalar_type(arg);
    if (st < 0) {
        PyErr_SetString(PyExc_TypeError, "expected a torch.dtype");
        return NULL;
    }
    return PyLong_FromLong(st);
}

/* tensor_meta(t): what the launch hook reads from a tensor (for tests). */
static PyObject *mod_tensor_meta(PyObject *m, PyObject *arg)
{
    (void)m;
    kd_tensor_meta t;
    int r = kd_shim_tensor_meta(arg, &t);
    if (r == 0)
        Py_RETURN_NONE;
    if (r < 0) {
        PyErr_SetString(PyExc_ValueError, kd_shim_last_error());
        return NULL;
    }
    PyObject *sizes = PyTuple_New(t.ndim), *strides = PyTuple_New(t.ndim);
    for (int i = 0; sizes && strides && i < t.ndim; i++) {
        PyTuple_SET_ITEM(sizes, i, PyLong_FromLongLong(t.sizes[i]));
        PyTuple_SET_ITEM(strides, i, PyLong_FromLongLong(t.strides[i]));
    }
    return Py_BuildValue("{sisNsNsLsKsisi}", "scalar_type", t.dtype, "shape", sizes,
                         "stride", strides, "storage_offset", (long long)t.storage_offset,
                         "data_ptr", (unsigned long long)t.data_ptr, "device_type",
                         t.device_type, "device_index", t.device_index);
}

static PyObject *mod_now_ns(PyObject *m, PyObject *unused)
{
    (void)m;
    (void)unused;
    return PyLong_FromUnsignedLongLong(kd_now_ns());
}

static PyObject *mod_inject(PyObject *m, PyObject *arg)
{
    (void)m;
    long n = PyLong_AsLong(arg);
    if (n == -1 && PyErr_Occurred())
        return NULL;
    kd_injected_faults = n < 0 ? 0 : n;
    Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
    {"_inject_hook_faults", mod_inject, METH_O,
     "Tests only: the next n launch descriptions fail inside the hook, as a real failure would."},
    {"intern", mod_intern, METH_O, "intern(s) -> id in kdebug's string table"},
    {"string", mod_string, METH_O, "string(id) -> the interned string"},
    {"_set_dtype_names", mod_set_dtype_names, METH_O,
     "Set the dtype abbreviations used when rendering."},
    {"scalar_type", mod_scalar_type, METH_O, "c10::ScalarType number of a torch.dtype"},
    {"tensor_meta", mod_tensor_meta, METH_O,
     "The metadata the launch hook reads from a tensor, as a dict (None for non-tensors)."},
    {"now_ns", mod_now_ns, METH_NOARGS, "CLOCK_MONOTONIC in ns, the launch timestamps' clock."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT, "kdebug._C",
    "kdebug's C core: the launch recorder, its ring buffer and the Inductor hooks.", -1,
    module_methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__C(void)
{
    if (kd_strings == NULL) {
        kd_strings = kd_strtab_new(1u << 22);
        if (kd_strings == NULL)
            return PyErr_NoMemory();
    }
    PyObject *m = PyModule_Create(&moduledef);
    if (m == NULL)
        return NULL;
    if (PyType_Ready(&kd_RecorderType) != 0 || PyType_Ready(&kd_LaunchType) != 0 ||
        PyModule_AddObjectRef(m, "Recorder", (PyObject *)&kd_RecorderType) != 0 ||
        PyModule_AddObjectRef(m, "Launch", (PyObject *)&kd_LaunchType) != 0 ||
        kd_hook_module_init(m) != 0 || kd_fmt_module_init(m) != 0 ||
        PyModule_AddIntConstant(m, "KIND_TRITON", KD_KIND_TRITON) != 0 ||
        PyModule_AddIntConstant(m, "KIND_CPP", KD_KIND_CPP) != 0 ||
        PyModule_AddIntConstant(m, "ROLE_READ", KD_ROLE_READ) != 0 ||
        PyModule_AddIntConstant(m, "ROLE_WRITE", KD_ROLE_WRITE) != 0 ||
        PyModule_AddIntConstant(m, "SLOT_BYTES", (long)sizeof(kd_slot)) != 0 ||
        PyModule_AddIntConstant(m, "NUM_SCALAR_TYPES", kd_shim_num_scalar_types()) != 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
