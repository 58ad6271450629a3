/* kd_hash_tree.c - the hash-tree codec: aten-op hash pytrees (tuples, lists,
 * dicts, None, hash values, Stats) as KD_T_* bytes in a trace, and back
 * (Note [Trace format] in kd_trace.h). */
#include "kd_hash_tree.h"
#include "kd_module.h"
#include "kd_trace.h"

#include <string.h>

static int tree_put(kd_buf *b, PyObject *o, int depth)
{
    if (depth > KD_TREE_MAX_DEPTH) {
        PyErr_SetString(PyExc_ValueError, "hash tree nested more than 64 levels");
        return -1;
    }
    if (o == Py_None) {
        kd_buf_u8(b, KD_T_NONE);
    } else if (PyBool_Check(o)) {
        kd_buf_u8(b, KD_T_BOOL);
        kd_buf_u8(b, o == Py_True);
    } else if (PyLong_Check(o)) {
        int overflow = 0;
        long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
        if (v == -1 && PyErr_Occurred())
            return -1;
        if (!overflow) {
            kd_buf_u8(b, KD_T_I64);
            kd_buf_u64(b, (uint64_t)v);
        } else {
            unsigned long long u = PyLong_AsUnsignedLongLong(o);
            if (u == (unsigned long long)-1 && PyErr_Occurred()) {
                PyErr_Clear();
                goto as_repr;
            }
            kd_buf_u8(b, KD_T_U64);
            kd_buf_u64(b, u);
        }
    } else if (PyFloat_Check(o)) {
        PyObject *l1 = PyFloat_CheckExact(o) ? NULL : PyObject_GetAttrString(o, "l1_finite");
        if (l1 == NULL) {
            PyErr_Clear();
            kd_buf_u8(b, KD_T_F64);
            kd_buf_f64(b, PyFloat_AS_DOUBLE(o));
        } else { /* kdebug.hashing.NormHash */
            double d = PyFloat_AsDouble(l1);
            Py_DECREF(l1);
            if (d == -1.0 && PyErr_Occurred())
                return -1; /* l1_finite that is no number: its error, not a SystemError */
            kd_buf_u8(b, KD_T_NORM);
            kd_buf_f64(b, d);
            static const char *names[] = {"nan", "posinf", "neginf"};
            for (int i = 0; i < 3; i++) {
                PyObject *c = PyObject_GetAttrString(o, names[i]);
                if (c == NULL)
                    return -1;
                unsigned long long u = PyLong_AsUnsignedLongLong(c);
                Py_DECREF(c);
                if (PyErr_Occurred())
                    return -1;
                kd_buf_varint(b, u);
            }
        }
    } else if (kd_stats_type != NULL && Py_TYPE(o) == (PyTypeObject *)kd_stats_type) {
        /* kdebug.hashing.Stats (format 1.2) */
        static const char *fnames[] = {"l1", "sum", "absmax", "nan", "posinf", "neginf"};
        kd_buf_u8(b, KD_T_STATS);
        for (int i = 0; i < 6; i++) {
            PyObject *c = PyObject_GetAttrString(o, fnames[i]);
            if (c == NULL)
                return -1;
            if (i < 3) {
                double d = PyFloat_AsDouble(c);
                Py_DECREF(c);
                if (PyErr_Occurred())
                    return -1;
                kd_buf_f64(b, d);
            } else {
                unsigned long long u = PyLong_AsUnsignedLongLong(c);
                Py_DECREF(c);
                if (PyErr_Occurred())
                    return -1;
                kd_buf_varint(b, u);
            }
        }
    } else if (PyList_Check(o) || PyTuple_Check(o)) {
        /* a copy of a list (Note [Formatting runs user code] in kd_fmt.c: a
         * repr below may change it; the count written first must hold) */
        const int is_list = PyList_Check(o);
        PyObject *seq = is_list ? PyList_GetSlice(o, 0, PY_SSIZE_T_MAX) : Py_NewRef(o);
        if (seq == NULL)
            return -1;
        Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
        kd_buf_u8(b, is_list ? KD_T_LIST : KD_T_TUPLE);
        kd_buf_varint(b, (uint64_t)n);
        int rc = 0;
        for (Py_ssize_t i = 0; i < n && rc == 0; i++)
            rc = tree_put(b, PySequence_Fast_GET_ITEM(seq, i), depth + 1);
        Py_DECREF(seq);
        if (rc != 0)
            return -1;
    } else if (PyDict_Check(o)) {
        PyObject *items = PyDict_Items(o); /* its pairs, held (as the list above) */
        if (items == NULL)
            return -1;
        kd_buf_u8(b, KD_T_DICT);
        kd_buf_varint(b, (uint64_t)PyList_GET_SIZE(items));
        int rc = 0;
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(items) && rc == 0; i++) {
            PyObject *k = PyTuple_GET_ITEM(PyList_GET_ITEM(items, i), 0);
            PyObject *v = PyTuple_GET_ITEM(PyList_GET_ITEM(items, i), 1);
            PyObject *ks = PyUnicode_Check(k) ? Py_NewRef(k) : PyObject_Repr(k);
            Py_ssize_t n = 0;
            const char *s = ks != NULL ? PyUnicode_AsUTF8AndSize(ks, &n) : NULL;
            if (s == NULL) {
                Py_XDECREF(ks);
                rc = -1;
                break;
            }
            kd_buf_varint(b, (uint64_t)n);
            kd_buf_put(b, s, (size_t)n);
            Py_DECREF(ks);
            rc = tree_put(b, v, depth + 1);
        }
        Py_DECREF(items);
        if (rc != 0)
            return -1;
    } else {
    as_repr:;
        PyObject *r = PyObject_Repr(o);
        if (r == NULL)
            return -1;
        Py_ssize_t n;
        const char *s = PyUnicode_AsUTF8AndSize(r, &n);
        if (s == NULL) {
            Py_DECREF(r);
            return -1;
        }
        kd_buf_u8(b, KD_T_STR);
        kd_buf_varint(b, (uint64_t)n);
        kd_buf_put(b, s, (size_t)n);
        Py_DECREF(r);
    }
    if (b->oom) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

/* Decoding: the bytes were validated by kd_tr_open; the cursor still checks bounds. */
PyObject *kd_hash_tree_get(kd_cur *c, PyObject *make_norm, int depth)
{
    uint8_t tag = kd_cur_u8(c);
    if (c->bad || depth > KD_TREE_MAX_DEPTH) {
        PyErr_SetString(PyExc_ValueError, "malformed hash tree");
        return NULL;
    }
    switch (tag) {
    case KD_T_NONE:
        Py_RETURN_NONE;
    case KD_T_BOOL:
        return PyBool_FromLong(kd_cur_u8(c));
    case KD_T_I64:
        return PyLong_FromLongLong((long long)kd_cur_u64(c));
    case KD_T_U64:
        return PyLong_FromUnsignedLongLong(kd_cur_u64(c));
    case KD_T_F64: {
        return PyFloat_FromDouble(kd_cur_f64(c));
    }
    case KD_T_NORM: {
        double d = kd_cur_f64(c);
        unsigned long long a = kd_cur_varint(c), b = kd_cur_varint(c), e = kd_cur_varint(c);
        return PyObject_CallFunction(make_norm, "dKKK", d, a, b, e);
    }
    case KD_T_STATS: {
        double l1 = kd_cur_f64(c), sum = kd_cur_f64(c), amax = kd_cur_f64(c);
        unsigned long long a = kd_cur_varint(c), b = kd_cur_varint(c), e = kd_cur_varint(c);
        if (kd_stats_type == NULL) {
            PyErr_SetString(PyExc_RuntimeError, "kdebug: no Stats type registered to read a stats hash");
            return NULL;
        }
        return PyObject_CallFunction(kd_stats_type, "dddKKK", l1, sum, amax, a, b, e);
    }
    case KD_T_STR: {
        size_t n = kd_cur_len(c);
        PyObject *s = PyUnicode_DecodeUTF8((const char *)c->p + c->pos, (Py_ssize_t)n, "replace");
        c->pos += n;
        return s;
    }
    case KD_T_LIST:
    case KD_T_TUPLE: {
        uint64_t n = kd_cur_varint(c);
        if (n > c->end - c->pos) {
            PyErr_SetString(PyExc_ValueError, "malformed hash tree");
            return NULL;
        }
        PyObject *l = tag == KD_T_LIST ? PyList_New((Py_ssize_t)n) : PyTuple_New((Py_ssize_t)n);
        if (l == NULL)
            return NULL;
        for (uint64_t i = 0; i < n; i++) {
            PyObject *x = kd_hash_tree_get(c, make_norm, depth + 1);
            if (x == NULL) {
                Py_DECREF(l);
                return NULL;
            }
            if (tag == KD_T_LIST)
                PyList_SET_ITEM(l, (Py_ssize_t)i, x);
            else
                PyTuple_SET_ITEM(l, (Py_ssize_t)i, x);
        }
        return l;
    }
    case KD_T_DICT: {
        uint64_t n = kd_cur_varint(c);
        PyObject *d = PyDict_New();
        if (d == NULL)
            return NULL;
        for (uint64_t i = 0; i < n; i++) {
            size_t kl = kd_cur_len(c);
            PyObject *k = PyUnicode_DecodeUTF8((const char *)c->p + c->pos, (Py_ssize_t)kl, "replace");
            c->pos += kl;
            PyObject *v = k ? kd_hash_tree_get(c, make_norm, depth + 1) : NULL;
            if (v == NULL || PyDict_SetItem(d, k, v) != 0) {
                Py_XDECREF(k);
                Py_XDECREF(v);
                Py_DECREF(d);
                return NULL;
            }
            Py_DECREF(k);
            Py_DECREF(v);
        }
        return d;
    }
    default:
        PyErr_SetString(PyExc_ValueError, "malformed hash tree");
        return NULL;
    }
}

/* The KD_T_* bytes of hash tree o; NULL with an exception on failure. */
PyObject *kd_hash_tree_bytes(PyObject *o)
{
    kd_buf b = {0};
    if (tree_put(&b, o, 0) != 0) {
        kd_buf_free(&b);
        return NULL;
    }
    PyObject *r = PyBytes_FromStringAndSize((const char *)b.p, (Py_ssize_t)b.len);
    kd_buf_free(&b);
    return r;
}

/* tree_leaf_digest(value) -> the digest kd_tr_last_writer looks for. */
PyObject *kd_mod_tree_leaf_digest(PyObject *self, PyObject *o)
{
    (void)self;
    if (PyTuple_Check(o) && PyTuple_GET_SIZE(o) > 0) /* several kinds: match on the first */
        o = PyTuple_GET_ITEM(o, 0);
    kd_buf b = {0};
    if (tree_put(&b, o, 0) != 0) {
        kd_buf_free(&b);
        return NULL;
    }
    uint64_t d = kd_tree_leaf_digest(b.p, b.len);
    kd_buf_free(&b);
    return PyLong_FromUnsignedLongLong(d);
}
