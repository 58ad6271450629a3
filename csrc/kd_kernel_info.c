/* kd_kernel_info.c - KernelInfo, what kdebug knows about one kernel: its name,
 * argument names and roles, interned once when the kernel is first recorded. */
#include "kd_kernel_info.h"

#include <string.h>
#include "kd_module.h"
#include "kd_record.h"

static void info_dealloc(kd_kernel_info *self)
{
    PyMem_Free(self->name_ids);
    PyMem_Free(self->roles);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static uint32_t intern_obj(PyObject *s)
{
    Py_ssize_t n;
    const char *c = PyUnicode_AsUTF8AndSize(s, &n);
    if (c == NULL)
        return 0;
    if (memchr(c, '\0', (size_t)n) != NULL) { /* the table keeps C strings */
        PyErr_SetString(PyExc_ValueError, "a kernel or argument name contains a NUL character");
        return 0;
    }
    uint32_t id = kd_strtab_intern(kd_strings, c, (size_t)n);
    if (id == 0)
        PyErr_SetString(PyExc_MemoryError, "kdebug's string table is full");
    return id;
}

/* KernelInfo(kind, name, arg_names, roles, device_type, device_index, launcher_args=0) */
static PyObject *info_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    int kind, dtype, dindex, extra = 0;
    PyObject *name, *names, *roles;
    static char *kwlist[] = {"kind", "name", "arg_names", "roles", "device_type",
                             "device_index", "launcher_args", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "iUOOii|i", kwlist, &kind, &name, &names,
                                     &roles, &dtype, &dindex, &extra))
        return NULL;
    if (extra < 0 || extra > 64) {
        PyErr_SetString(PyExc_ValueError, "launcher_args must be 0..64");
        return NULL;
    }
    if (kind != KD_KIND_TRITON && kind != KD_KIND_CPP) {
        PyErr_SetString(PyExc_ValueError, "kind must be 1 (triton) or 2 (cpp)");
        return NULL;
    }
    if (dtype < 0 || dtype > UINT8_MAX || dindex < -1 || dindex > INT8_MAX) {
        /* stored in 8 bits: a larger value would be recorded as another device */
        PyErr_Format(PyExc_ValueError, "device_type must be 0..255 and device_index -1..127 (got %d, %d)",
                     dtype, dindex);
        return NULL;
    }
    /* tuples (copies of lists): a role's __index__ is Python code that could
     * change a list read below */
    PyObject *ns = PySequence_Tuple(names);
    PyObject *rs = ns ? PySequence_Tuple(roles) : NULL;
    kd_kernel_info *self = NULL;
    if (rs == NULL)
        goto error;
    Py_ssize_t n = PyTuple_GET_SIZE(ns);
    if (PyTuple_GET_SIZE(rs) != n) {
        PyErr_SetString(PyExc_ValueError, "arg_names and roles differ in length");
        goto error;
    }
    self = (kd_kernel_info *)type->tp_alloc(type, 0);
    if (self == NULL)
        goto error;
    self->kind = (uint8_t)kind;
    self->device_type = (uint8_t)dtype;
    self->device_index = (int8_t)dindex;
    self->name_id = intern_obj(name);
    if (self->name_id == 0)
        goto error;
    self->nnames = (uint32_t)n;
    self->launcher_args = (uint32_t)extra;
    self->name_ids = PyMem_Calloc((size_t)n + 1, sizeof(uint32_t));
    self->roles = PyMem_Calloc((size_t)n + 1, 1);
    if (self->name_ids == NULL || self->roles == NULL) {
        PyErr_NoMemory();
        goto error;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *s = PyTuple_GET_ITEM(ns, i);
        if (!PyUnicode_Check(s)) {
            PyErr_SetString(PyExc_TypeError, "arg_names must hold str");
            goto error;
        }
        if ((self->name_ids[i] = intern_obj(s)) == 0)
            goto error;
        long role = PyLong_AsLong(PyTuple_GET_ITEM(rs, i));
        if (role == -1 && PyErr_Occurred())
            goto error;
        if (role < 0 || role > 3) {
            PyErr_SetString(PyExc_ValueError, "a role is 0..3 (1 read, 2 write)");
            goto error;
        }
        self->roles[i] = (uint8_t)role;
    }
    Py_DECREF(ns);
    Py_DECREF(rs);
    return (PyObject *)self;
error:
    Py_XDECREF(ns);
    Py_XDECREF(rs);
    Py_XDECREF(self);
    return NULL;
}

static PyObject *info_get_name(kd_kernel_info *self, void *c)
{
    (void)c;
    return PyUnicode_FromString(kd_strtab_get(kd_strings, self->name_id, NULL));
}

static PyObject *info_get_arg_names(kd_kernel_info *self, void *c)
{
    (void)c;
    PyObject *t = PyTuple_New(self->nnames);
    for (uint32_t i = 0; t && i < self->nnames; i++) {
        PyObject *s = PyUnicode_FromString(kd_strtab_get(kd_strings, self->name_ids[i], NULL));
        if (s == NULL) {
            Py_CLEAR(t);
            break;
        }
        PyTuple_SET_ITEM(t, i, s);
    }
    return t;
}

static PyObject *info_get_roles(kd_kernel_info *self, void *c)
{
    (void)c;
    PyObject *t = PyTuple_New(self->nnames);
    for (uint32_t i = 0; t && i < self->nnames; i++)
        PyTuple_SET_ITEM(t, i, PyLong_FromLong(self->roles[i]));
    return t;
}

static PyObject *info_get_launcher_args(kd_kernel_info *self, void *c)
{
    (void)c;
    return PyLong_FromUnsignedLong(self->launcher_args);
}

static PyGetSetDef info_getset[] = {
    {"launcher_args", (getter)info_get_launcher_args, NULL,
     "trailing launcher arguments not passed to the kernel (not recorded)", NULL},
    {"name", (getter)info_get_name, NULL, "kernel name", NULL},
    {"arg_names", (getter)info_get_arg_names, NULL, "argument names", NULL},
    {"roles", (getter)info_get_roles, NULL, "argument roles (1 read, 2 write)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject kd_KernelInfoType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kdebug._C.KernelInfo",
    .tp_basicsize = sizeof(kd_kernel_info),
    .tp_dealloc = (destructor)info_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "What kdebug knows about one kernel: name, argument names and roles.",
    .tp_new = info_new,
    .tp_getset = info_getset,
};
