/* kd_recorder.h - the Recorder type (kd_recorder.c): one ring, the launches
 * drained from it, its counters and error messages. */
#ifndef KD_RECORDER_H
#define KD_RECORDER_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#include "kd_record.h"
#include "kd_ring.h"
#include "kd_launch_table.h"

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
 * settings, so exits in any order across threads leave nothing behind; a
 * context left out of order on its own thread hands what it replaced to the
 * one entered after it.  The aten-op side of the same contexts is per thread
 * too: Note [Aten-op hash settings per thread] in kdebug/_aten_hooks.py. */
typedef struct kd_hash_config {
    int kinds;            /* KD_HK_* */
    int hash_inputs;      /* pre-launch hashes of what the kernel reads */
    int check_readonly;   /* verify read-only arguments are unchanged */
    int spec;             /* Python-side id of the hash_fn spec */
    int record_outputs;   /* clone what the kernel writes */
    uint64_t output_budget; /* bytes of clones kept at most */
    int output_filter;    /* 0: every launch; else the id of a Python filter (Note [Recorded values on disk]) */
} kd_hash_config;

/* A Recorder owns one ring and the launches drained from it.
 * Each field says what protects it; "GIL" fields are touched only with the
 * GIL held (the launch hooks always hold it). */
typedef struct kd_recorder {
    PyObject_HEAD
    kd_ring *ring;              /* atomics inside */
    kd_ltab table;              /* GIL; the drained launches and their generation (Note [Launch table]) */
    PyObject **ring_objs;       /* GIL; [capacity] strong refs when store_objects */
    PyObject **store_objs;      /* GIL; parallel to store.payloads */
    uint64_t store_objs_cap;    /* GIL */
    uint32_t drain_cap;
    kd_payload *scan_scratch;   /* GIL; KD_BUILD_SLOTS payloads for digest(), made at its first call */
    int store_objects;
    PyObject *ops;              /* GIL; strong ref to the operators list while started */
    Py_ssize_t merged;          /* GIL; kernel records merged into ops: set together with
                                 * ops' contents (splice), so len(ops) - merged is the
                                 * number of aten ops whatever thread reads it */
    PyObject *mode;             /* GIL; strong ref to the DebugMode while started */
    int started;                /* GIL */
    int all_threads;            /* GIL */
    int op_mode;                /* GIL; KD_OPS_*: what the C++ op observer records into it (kd_op_observer.h) */
    struct kd_recorder *prev;   /* GIL; this thread's recorder before start() */
    PyObject *prev_tls_obj;     /* GIL; ThreadLocalPythonObjects entry before start() */
    uint64_t next_launch_index; /* GIL */
    uint64_t errors;            /* GIL; failures inside the hook */
    uint64_t unrecorded;        /* GIL; launches not recorded because of such a failure */
    uint64_t suppressed;        /* GIL; launches left out on purpose (compile, benchmark) */
    uint64_t drain_failures;    /* GIL; launches lost when the store could not grow */
    int drain_holds_pending;    /* GIL; during a drain: stop at a launch still waiting for a GPU result */
    uint64_t held_from;         /* GIL; after the last drain: the launch index of the first launch it left in
                                 * the ring waiting for a GPU result, or UINT64_MAX */
    uint64_t hash_unsupported;  /* GIL; tensors a hash kind could not decode */
    uint64_t readonly_changed;  /* GIL; read-only arguments whose bytes changed */
    uint64_t output_bytes;      /* GIL; bytes of recorded outputs */
    uint64_t outputs_skipped;   /* GIL; outputs not recorded: budget exceeded */
    PyObject *outputs;          /* GIL; {launch_index: {name: clone}} */
    PyObject *custom;           /* GIL; {(launch_index, arg, when): value} */
    struct kd_result_anchor *anchor; /* GIL; its GPU hash results in flight (Note [GPU hash results]) */
    unsigned long owner_thread; /* GIL; the thread that started it */
    kd_hash_config owner_hcfg;  /* GIL; that thread's kd_hcfg (Note [Hash settings per thread]) */
    int hash_window;            /* GIL; > 0: launches into it are hashed bitwise too (Note [Hash windows]) */
    int window_spec;            /* GIL; the spec such a launch gets when nothing else asks for hashes */
    struct kd_launch_view *views; /* GIL; live Launch views (Note [Launch views keep their record]) */
    int nmessages;
    char messages[KD_MAX_ERROR_MESSAGES][KD_ERROR_MESSAGE_BYTES];
} kd_recorder;

extern PyTypeObject kd_RecorderType;

/* Counts a failure inside the hook with its message (and the pending Python
 * exception's text, which it clears). */
void kd_recorder_error(kd_recorder *r, const char *what);

/* Moves every complete launch from the ring into the store, after collecting
 * its GPU hashes in flight (one device synchronization; they land in the ring
 * records first).  Returns the number of launches in the store. */
uint64_t kd_recorder_drain(kd_recorder *r);
/* Note [Reading results without waiting]: the drain without a device
 * synchronization (results already read back only); stops at the first
 * launch still waiting for one (held_from). */
uint64_t kd_recorder_drain_ready(kd_recorder *r);

/* The digest of the launches with launch index in [a, b), stored or still in
 * the ring (Note [Steps held in the ring] in core/kd_ring.h): 0 with *digest
 * and *recorded (launches found), 1 while one still waits for its GPU
 * hashes or is being written, -1 out of memory.  GIL. */
int kd_recorder_range_digest(kd_recorder *r, uint64_t a, uint64_t b, uint64_t *digest, uint64_t *recorded);

#endif
