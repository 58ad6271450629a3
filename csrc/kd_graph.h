/* kd_graph.h - recording CUDA-graph capture and replays (Note [CUDA graph
 * replays] in kd_graph.c). */
#ifndef KD_GRAPH_H
#define KD_GRAPH_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#include "kd_cuda_hash.h"

struct kd_recorder;
typedef struct kd_graph kd_graph;

/* The graph this thread is capturing into, or NULL. */
extern _Thread_local kd_graph *kd_tls_graph;

/* Captures the hashes of n tensors (kd_cuda_hash_enqueue's arguments) into
 * g; *k0 receives the graph-relative index of the first result.  Returns 0,
 * or -1 (message in *error). */
int kd_graph_hash(kd_graph *g, int device, uint64_t stream, int kinds, const kd_cuda_tensor *t, int n,
                  int64_t *k0, const char **error);

/* The launch at ring tickets [first, first + n) of r was recorded while g was
 * captured: keep a copy as g's template and mark the ring's record captured
 * (no values: it did not run). */
void kd_graph_add_launch(kd_graph *g, struct kd_recorder *r, uint64_t first, uint32_t n);

/* A launch during g's capture that could not be recorded. */
void kd_graph_note_unrecorded(kd_graph *g);

/* 1 while any capture kdebug saw begin is open (on any thread). */
int kd_graph_any_open(void);

/* A tensor of a launch during g's capture that could not be hashed in it. */
void kd_graph_note_hash_error(kd_graph *g);

/* A recorded output (record_outputs) skipped because the launch was captured. */
void kd_graph_note_output_skipped(kd_graph *g);

PyObject *kd_mod_graph_capture_begin(PyObject *m, PyObject *args);
PyObject *kd_mod_graph_capture_started(PyObject *m, PyObject *args);
PyObject *kd_mod_graph_unknown_replay(PyObject *m, PyObject *unused);
PyObject *kd_mod_graph_capture_end(PyObject *m, PyObject *arg);
PyObject *kd_mod_graph_replay(PyObject *m, PyObject *args);
PyObject *kd_mod_graph_replay_queued(PyObject *m, PyObject *ok);

/* Note [Results in flight]: every GPU hash result taken before the call read
 * back, waiting for other threads' replays that hold results before them.
 * 0, or -1 with kd_collect_gpu_error() saying why (a CUDA error, or another
 * thread's replay not queued within 5 s).  GIL held; may release it while
 * waiting. */
int kd_collect_gpu_results(void);
const char *kd_collect_gpu_error(void);
PyObject *kd_mod_graph_release(PyObject *m, PyObject *arg);
PyObject *kd_mod_graph_stats(PyObject *m, PyObject *unused);
PyObject *kd_mod_graph_activity(PyObject *m, PyObject *unused);

#endif
