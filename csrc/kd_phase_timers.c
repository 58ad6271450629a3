/* kd_phase_timers.c - Note [Phase timers] (kd_phase_timers.h). */
#include "kd_phase_timers.h"

#include <stdatomic.h>
#include <time.h>

#ifdef KD_PHASE_TIMERS
#include <pthread.h>

#define KD_PT_SLOTS 64

typedef struct {
    _Atomic uint64_t tid;
    _Atomic uint64_t count[KD_PT_N];
    _Atomic uint64_t ns[KD_PT_N];
} pt_slot;

static pt_slot slots[KD_PT_SLOTS];
static atomic_int nslots;
static _Atomic uint64_t overflow; /* additions from threads beyond KD_PT_SLOTS */
static _Thread_local int my_slot = -1;

uint64_t kd_pt_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void kd_pt_add(int phase, uint64_t ns)
{
    if (my_slot < 0) {
        int k = atomic_fetch_add_explicit(&nslots, 1, memory_order_relaxed);
        if (k >= KD_PT_SLOTS) {
            atomic_fetch_add_explicit(&overflow, 1, memory_order_relaxed);
            return; /* my_slot stays unset: counted again next time */
        }
        atomic_store_explicit(&slots[k].tid, (uint64_t)pthread_self(), memory_order_relaxed);
        my_slot = k;
    }
    pt_slot *s = &slots[my_slot];
    atomic_fetch_add_explicit(&s->count[phase], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&s->ns[phase], ns, memory_order_relaxed);
}

static const char *const names[KD_PT_N] = {"begin", "launch", "end", "plain", "guard",
                                              "find", "describe", "ring", "pre", "wguard", "after",
                                              "publish", "flush", "enqueue"};

/* _phase_timers(reset=False) -> [{"thread", "<phase>": (count, ns), ...}] */
static PyObject *mod_phase_timers(PyObject *m, PyObject *args)
{
    (void)m;
    int reset = 0;
    if (!PyArg_ParseTuple(args, "|p", &reset))
        return NULL;
    int n = atomic_load_explicit(&nslots, memory_order_relaxed);
    if (n > KD_PT_SLOTS)
        n = KD_PT_SLOTS;
    PyObject *out = PyList_New(0);
    for (int i = 0; out != NULL && i < n; i++) {
        pt_slot *s = &slots[i];
        PyObject *d = Py_BuildValue("{s:K}", "thread", (unsigned long long)atomic_load(&s->tid));
        for (int p = 0; d != NULL && p < KD_PT_N; p++) {
            uint64_t c = reset ? atomic_exchange(&s->count[p], 0) : atomic_load(&s->count[p]);
            uint64_t t = reset ? atomic_exchange(&s->ns[p], 0) : atomic_load(&s->ns[p]);
            PyObject *v = Py_BuildValue("(KK)", (unsigned long long)c, (unsigned long long)t);
            if (v == NULL || PyDict_SetItemString(d, names[p], v) != 0)
                Py_CLEAR(d);
            Py_XDECREF(v);
        }
        if (d == NULL || PyList_Append(out, d) != 0)
            Py_CLEAR(out);
        Py_XDECREF(d);
    }
    return out;
}
#else
static PyObject *mod_phase_timers(PyObject *m, PyObject *args)
{
    (void)m, (void)args;
    PyErr_SetString(PyExc_RuntimeError, "kdebug was built without phase timers: rebuild with "
                                        "KDEBUG_PHASE_TIMERS=1 python setup.py build_ext --inplace --force");
    return NULL;
}
#endif

static PyMethodDef methods[] = {
    {"_phase_timers", mod_phase_timers, METH_VARARGS,
     "_phase_timers(reset=False) -> per-thread host ns per launch phase (Note [Phase timers]; diagnostic builds)."},
    {NULL, NULL, 0, NULL},
};

int kd_phase_timers_module_init(PyObject *m) { return PyModule_AddFunctions(m, methods); }
