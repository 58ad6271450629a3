/* kd_py.h - declarations shared by the Python-facing C files of kdebug._C
 * (kd_module.c, kd_recorder.c, kd_hook.c, kd_view.c, kd_dispatch.c, ...). */
#ifndef KD_PY_H
#define KD_PY_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#include "kd_record.h"
#include "kd_ring.h"
#include "kd_store.h"
#include "kd_strtab.h"

/* The process-wide interned string table (kd_module.c). */
extern kd_strtab *kd_strings;

/* dtype abbreviations ("f32", ...) indexed by c10::ScalarType (kd_module.c). */
extern const char *kd_dtype_names[256];

#define KD_MAX_ERROR_MESSAGES 16
#define KD_ERROR_MESSAGE_BYTES 240
#define KD_BUILD_SLOTS 4096 /* payloads of the largest launch (Note [Per-thread launch context]) */

/* What to hash and keep around each launch (set by log_tensor_hashes() and
 * record_outputs()).  Note [Hash settings per thread]: each thread has its own
 * (kd_hcfg, thread-local); a thread that set none of a part (hashes: kinds or
 * check_readonly; outputs: record_outputs) uses that part of the settings of
 * the thread that started the recorder (kd_recorder.owner_hcfg), so kernels a
 * record_all_threads recording or autograd's threads run are hashed as their
 * DebugMode's thread asked.  Contexts restore their own thread's previous
 * settings, so exits in any order across threads leave nothing behind. */
typedef struct kd_hash_config {
    int kinds;            /* KD_HK_* */
    int hash_inputs;      /* pre-launch hashes of what the kernel reads */
    int check_readonly;   /* verify read-only arguments are unchanged */
    int spec;             /* Python-side id of the hash_fn spec */
    int record_outputs;   /* clone what the kernel writes */
    uint64_t output_budget; /* bytes of clones kept at most */
} kd_hash_config;

/* A Recorder owns one ring and the launches drained from it.
 * Each field says what protects it; "GIL" fields are touched only with the
 * GIL held (the launch hooks always hold it). */
typedef struct kd_recorder {
    PyObject_HEAD
    kd_ring *ring;              /* atomics inside */
    kd_store store;             /* GIL */
    PyObject **ring_objs;       /* GIL; [capacity] strong refs when store_objects */
    PyObject **store_objs;      /* GIL; parallel to store.payloads */
    uint64_t store_objs_cap;    /* GIL */
    kd_payload *drain_scratch;  /* GIL */
    uint32_t drain_cap;
    int store_objects;
    PyObject *ops;              /* GIL; strong ref to the operators list while started */
    Py_ssize_t merged;          /* GIL; kernel records merged into ops: set together with
                                 * ops' contents (splice), so len(ops) - merged is the
                                 * number of aten ops whatever thread reads it */
    PyObject *mode;             /* GIL; strong ref to the DebugMode while started */
    int started;                /* GIL */
    int all_threads;            /* GIL */
    struct kd_recorder *prev;   /* GIL; this thread's recorder before start() */
    PyObject *prev_tls_obj;     /* GIL; ThreadLocalPythonObjects entry before start() */
    uint64_t next_launch_index; /* GIL */
    uint64_t errors;            /* GIL; failures inside the hook */
    uint64_t unrecorded;        /* GIL; launches not recorded because of such a failure */
    uint64_t suppressed;        /* GIL; launches left out on purpose (compile, benchmark) */
    uint64_t drain_failures;    /* GIL; launches lost when the store could not grow */
    uint64_t hash_unsupported;  /* GIL; tensors a hash kind could not decode */
    uint64_t readonly_changed;  /* GIL; read-only arguments whose bytes changed */
    uint64_t output_bytes;      /* GIL; bytes of recorded outputs */
    uint64_t outputs_skipped;   /* GIL; outputs not recorded: budget exceeded */
    PyObject *outputs;          /* GIL; {launch_index: {name: clone}} */
    PyObject *custom;           /* GIL; {(launch_index, arg, when): value} */
    struct kd_result_anchor *anchor; /* GIL; its GPU hash results in flight (Note [GPU hash results]) */
    unsigned long owner_thread; /* GIL; the thread that started it */
    kd_hash_config owner_hcfg;  /* GIL; that thread's kd_hcfg (Note [Hash settings per thread]) */
    uint64_t generation;        /* GIL; clear() calls made: a store index names a record only with it */
    struct kd_launch_view *views; /* GIL; live Launch views (Note [Launch views keep their record]) */
    int nmessages;
    char messages[KD_MAX_ERROR_MESSAGES][KD_ERROR_MESSAGE_BYTES];
} kd_recorder;

extern PyTypeObject kd_RecorderType;
extern PyTypeObject kd_KernelInfoType;
extern PyTypeObject kd_RunHookType;
extern PyTypeObject kd_RunnerHookType;
extern PyTypeObject kd_CppKernelType;
extern PyTypeObject kd_LaunchType;

/* Per-kernel facts, computed once when a kernel is first recorded. */
typedef struct kd_kernel_info {
    PyObject_HEAD
    uint32_t name_id;
    uint8_t kind;
    uint8_t device_type;
    int8_t device_index;
    uint32_t nnames;
    uint32_t *name_ids; /* argument names, in call order */
    uint8_t *roles;     /* KD_ROLE_* per argument */
} kd_kernel_info;

extern _Thread_local kd_hash_config kd_hcfg;

/* kd_hcfg changed on this thread: recorders this thread started see it. */
void kd_hcfg_publish(void);
extern PyObject *kd_slow_hasher; /* slow_hasher(tensor, kinds) -> HashValues, for non-CPU tensors */
extern PyObject *kd_stats_type; /* kdebug.hashing.Stats: the KD_T_STATS tree leaf */
extern PyObject *kd_custom_hasher; /* custom(recorder, launch_index, arg_index, when, tensor) */

/* ---- recorder.c ---- */

/* The recorder that launches on this thread go to, or NULL.  Also NULL while
 * this thread is compiling or Inductor is benchmarking. */
kd_recorder *kd_active_recorder(void);

/* Counts a failure inside the hook with its message (and the pending Python
 * exception's text, which it clears). */
void kd_recorder_error(kd_recorder *r, const char *what);

/* A launch being recorded: begun before the kernel runs, ended after. */
typedef struct kd_pending {
    uint64_t first;
    uint32_t n;
    int ok;
    uint64_t launch_index;
    uint64_t stream;
    kd_hash_config cfg; /* as it was when the launch began */
} kd_pending;

/* Describes the launch of kernel info with arguments args[0..nargs) into the
 * ring.  Never raises; failures are counted on r. */
void kd_launch_begin(kd_recorder *r, kd_kernel_info *info, PyObject *const *args,
                     Py_ssize_t nargs, uint64_t stream, kd_pending *p);

/* Completes the launch: grid/config from the thread's capture, timing, the
 * raised flag; then commits it. */
void kd_launch_end(kd_recorder *r, kd_pending *p, PyObject *const *args, Py_ssize_t nargs,
                   int raised);

/* Moves every complete launch from the ring into the store, after collecting
 * its GPU hashes in flight (one device synchronization; they land in the ring
 * records first).  Returns the number of launches in the store. */
uint64_t kd_recorder_drain(kd_recorder *r);

/* Describes a tensor for the CUDA hash kernel.  Returns 1 when this build can
 * hash it there (a CUDA tensor of a known dtype, at most KD_CUDA_MAX_DIMS
 * dims), else 0 (the caller uses another path). */
struct kd_tensor_meta;
struct kd_cuda_tensor;
int kd_cuda_describe(const struct kd_tensor_meta *m, struct kd_cuda_tensor *t);


/* ---- hook.c: what the runner hook captures during a recorded launch ---- */
typedef struct kd_capture {
    int active;
    int have_grid;
    int have_config;
    uint32_t grid[3];
    uint32_t config_id;
    uint16_t num_warps;
    uint8_t num_stages;
    uint32_t shared_mem;
} kd_capture;

extern _Thread_local kd_capture kd_tls_capture;
extern _Thread_local int kd_tls_compiling;
extern _Thread_local kd_recorder *kd_tls_recorder;
extern kd_recorder *kd_global_recorder;
extern long kd_started_recorders;

extern long kd_injected_faults;



/* Is Inductor benchmarking right now (upstream's _IN_INDUCTOR_BENCHMARK)? */
int kd_in_benchmark(void);

uint64_t kd_now_ns(void);

/* ---- view.c ---- */
PyObject *kd_launch_view_new(kd_recorder *r, uint64_t index);
/* Before r's store is cleared: every live view of its current generation
 * takes its own copy of its record (Note [Launch views keep their record]). */
void kd_launch_views_detach(kd_recorder *r);
/* _inject_detach_faults(n): tests only; the next n record copies fail. */
PyObject *kd_inject_detach_faults(PyObject *m, PyObject *arg);

/* ---- module.c: hook configuration ---- */
int kd_hook_module_init(PyObject *m);
int kd_fmt_module_init(PyObject *m);
int kd_dispatch_module_init(PyObject *m);

/* ---- fmt.c: upstream DebugMode's text (None / NotImplemented as the
 * Python functions format_args, format_kwargs, format_output; m unused) ---- */
PyObject *kd_format_args(PyObject *m, PyObject *args);
PyObject *kd_format_kwargs(PyObject *m, PyObject *kwargs);
PyObject *kd_format_output(PyObject *m, PyObject *result);

/* ---- trace_py.c: TraceWriter, TraceReader ---- */
int kd_trace_module_init(PyObject *m);
PyObject *kd_mod_tree_leaf_digest(PyObject *self, PyObject *o);
extern PyTypeObject kd_TraceWriterType;
extern PyTypeObject kd_TraceReaderType;

#endif
