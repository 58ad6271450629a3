/* kd_shim.h - the extern "C" face of kd_torch.cpp, the one file that includes
 * libtorch headers.  Every function here is noexcept in effect: no C++
 * exception crosses into C, and none sets a Python exception.
 */
#ifndef KD_SHIM_H
#define KD_SHIM_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kd_tensor_meta {
    int32_t ndim;
    int32_t dtype;        /* c10::ScalarType */
    int32_t device_type;  /* c10::DeviceType */
    int32_t device_index;
    int64_t storage_offset;
    uint64_t data_ptr;    /* element 0 of the view; 0 when it has no storage */
    const int64_t *sizes;   /* borrowed from the TensorImpl: valid while obj lives */
    const int64_t *strides;
    int32_t math_bits;    /* KD_MATH_CONJ | KD_MATH_NEG: its values are not its bytes */
    uint64_t storage_nbytes; /* the bytes its storage holds (0: none) */
} kd_tensor_meta;

/* Whether every element of the view lies inside its storage.  A storage can
 * shrink under a view (t.untyped_storage().resize_(0), set_() on another
 * view): reading such a view's elements reads memory that is not its own, so
 * kdebug's hashes check this first and hash nothing then.  itemsize 0 (an
 * unknown dtype, which no hash reads by its bytes: each hash path refuses it
 * on its own): nothing to check here, 1. */
static inline int kd_meta_in_storage(const kd_tensor_meta *m, int itemsize)
{
    if (itemsize <= 0)
        return 1;
    if (m->storage_offset < 0)
        return 0;
    uint64_t last = (uint64_t)m->storage_offset; /* the last element's index */
    for (int32_t d = 0; d < m->ndim; d++) {
        if (m->sizes[d] == 0)
            return 1; /* no element */
        if (m->sizes[d] < 0 || m->strides[d] < 0)
            return 0;
        uint64_t span = (uint64_t)(m->sizes[d] - 1);
        if (m->strides[d] != 0 && span > (UINT64_MAX - last) / (uint64_t)m->strides[d])
            return 0;
        last += span * (uint64_t)m->strides[d];
    }
    if (last >= UINT64_MAX / (uint64_t)itemsize)
        return 0;
    return (last + 1) * (uint64_t)itemsize <= m->storage_nbytes;
}

/* A view with torch's lazy conjugate / negative bit set: the logical values
 * are the conjugate / negation of what its memory holds.  Hashes take the
 * logical values, so such a tensor goes to the slow path (kdebug/hashing.py
 * resolves the bits) instead of being hashed from its bytes. */
enum { KD_MATH_CONJ = 1, KD_MATH_NEG = 2 };

/* Fills *out from a torch.Tensor (or subclass) object.  Returns 1 for a
 * tensor, 0 for anything else, -1 for a tensor whose metadata cannot be read
 * (sparse, nested, ...: the reason is in kd_shim_last_error()). */
int kd_shim_tensor_meta(PyObject *obj, kd_tensor_meta *out);

/* A quantized tensor's quantizer parameters (Note [Quantized tensors'
 * parameters] in kdebug/hashing.py): head = {qscheme code, axis (-1 per
 * tensor)}; per tensor, scale and zero_point; per channel, the quantizer's own
 * scales and zero points (metadata borrowed from them: valid while obj lives).
 * 1 filled, 0 not a quantized tensor, -1 error (kd_shim_last_error). */
typedef struct kd_qparams {
    int64_t head[2];
    int per_channel;
    double scale;
    int64_t zero_point;
    kd_tensor_meta scales, zero_points;
} kd_qparams;
int kd_shim_qparams(PyObject *obj, kd_qparams *out);

/* Note [Prefetching the gradients] (kd_torch.cpp): prefetch, a link at a
 * time for all n parameters, the chain that reading each one's .grad
 * follows.  A hint only: nothing changes, never raises.  GIL held. */
void kd_shim_prefetch_grads(PyObject *const *params, Py_ssize_t n);
int kd_shim_prefetch_set(int on); /* the previous setting */

/* Whether tensor object obj plainly holds data of its own, as
 * kdebug._upstream.has_no_data's fast path decides (a dense tensor, not meta,
 * no functionalization, functorch or Python dispatch key): 1 (*device set
 * to device type * 256 + index + 1), 0 when it may not (ask Python), -1 not
 * a tensor.  The caller checks the Python type.  Never raises. */
int kd_shim_plain_data(PyObject *obj, int *device);

/* A Python tensor (new reference) for an AtenTensorHandle (an at::Tensor *,
 * as Inductor's C shim hands them out): the tensor's own Python object when it
 * has one, else a new one.  NULL when handle is NULL or undefined, or on
 * failure (kd_shim_last_error() says why).  GIL held.  Note [C++ wrapper
 * launches]. */
PyObject *kd_shim_wrap_handle(void *handle);

/* c10::ScalarType of a torch.dtype object, or -1. */
int kd_shim_dtype_scalar_type(PyObject *dtype);

/* Number of c10::ScalarType values this torch knows. */
int kd_shim_num_scalar_types(void);

/* kdebug's entry in at::impl::ThreadLocalPythonObjects, the Python objects
 * that torch carries into autograd worker threads (and every other place
 * that copies at::ThreadLocalState).  _get returns a borrowed reference, or
 * NULL when unset; _set with NULL unsets.  Returns 0, or -1 on failure. */
PyObject *kd_shim_tls_recorder_get(void);
int kd_shim_tls_recorder_set(PyObject *obj);

/* A clone of a tensor (new reference), made with Python dispatch and autograd
 * off so no DebugMode sees it; on CUDA it is queued on the current stream.
 * NULL on failure (kd_shim_last_error() says why). */
PyObject *kd_shim_clone(PyObject *tensor);

/* An uninitialized tensor shaped like `tensor` (new reference): its strides
 * when it is dense (*same_strides = 1), else contiguous (*same_strides = 0),
 * as clone() would give.  No dispatch mode sees it.  NULL on failure. */
PyObject *kd_shim_empty_like(PyObject *tensor, int *same_strides);

/* dst.copy_(src), queued on the current stream, no dispatch mode seeing it.
 * Returns 0, or -1 on failure. */
int kd_shim_copy(PyObject *dst, PyObject *src);

/* A reference to a tensor's storage (keeps its memory allocated without
 * counting as a use of the tensor itself: autograd's AccumulateGrad, for one,
 * copies a gradient whose tensor has extra users).  *data is the storage's
 * data pointer now.  NULL when the tensor has none.  Release it with
 * kd_shim_storage_release (no GIL needed). */
void *kd_shim_storage_hold(PyObject *tensor, uint64_t *data);
uint64_t kd_shim_storage_data(void *storage);
/* The data pointer of a tensor's storage (Python's
 * t.untyped_storage().data_ptr()); 0 for a non-tensor or one with no storage. */
uint64_t kd_shim_storage_ptr(PyObject *tensor);
void kd_shim_storage_release(void *storage);

/* Note [Fresh buffers] (kd_fresh.c): a weak reference to a tensor's storage
 * (its StorageImpl: the object, not its memory, stays allocated while the
 * reference lives, so its address names no other storage meanwhile), with
 * *key that address; NULL when the tensor has none.  kd_shim_storage_key:
 * the address alone (0: none).  Release with kd_shim_storage_weak_release
 * (no GIL needed). */
void *kd_shim_storage_weak(PyObject *tensor, uint64_t *key);
uint64_t kd_shim_storage_key(PyObject *tensor);
int kd_shim_storage_weak_alive(void *weak); /* 1 while the storage has users */
void kd_shim_storage_weak_release(void *weak);

/* The raw handle (cudaStream_t for CUDA) of the current stream of a device,
 * 0 when there is none. */
uint64_t kd_shim_current_stream(int device_type, int device_index);

/* Note [C++ op observer] (kd_op_observer.c): the C side of kdebug's
 * RecordFunction callback.  want() is asked, without the GIL, at the end of
 * every outermost dispatcher op on a thread that has the callback: whether
 * this thread records ops now (thread-locals only).  record() is then called
 * with the GIL held: the id of the op's qualified name ("aten::mm.out") in
 * kdebug's string table (0: not interned, the table is full), whether it is
 * an empty* op (its output holds whatever memory it got), its arguments and
 * outputs as Python objects (borrowed; tensors wrapped, other values as
 * placeholders of their type), their names' ids and KD_ROLE_* roles. */
typedef int (*kd_op_want_fn)(void);
typedef void (*kd_op_record_fn)(uint32_t name_id, int empty, PyObject *const *args, const uint32_t *name_ids,
                                const uint8_t *roles, int nargs);
/* The string table's id of the n bytes at s (0: the table is full), GIL
 * held: the shim interns the op's and its arguments' names through it, once
 * per op and thread for ops of a fixed schema (Note [Op names interned once]
 * in kd_torch.cpp). */
typedef uint32_t (*kd_op_intern_fn)(const char *s, size_t n);

/* Adds the op observer (thread-local to this thread and the threads torch
 * carries its state to, or global: every thread; one of each kind is
 * registered, counted per add, and while the global one is registered the
 * thread-local one records nothing, so no op is recorded twice).  Returns its
 * handle, 0 on failure (kd_shim_last_error() says why).  GIL held. */
uint64_t kd_shim_op_observer_add(int global, kd_op_want_fn want, kd_op_record_fn record, kd_op_intern_fn intern);

/* Drops one add of an observer (kd_shim_op_observer_add's handle; a
 * thread-local one on the thread that added it), removing it with the last.
 * Returns 0, or -1 on failure.  GIL held. */
int kd_shim_op_observer_remove(uint64_t handle);

/* Opens (1) or closes (0) the thread-local op observer on this thread: its
 * entries in this thread's RecordFunction callbacks (its own add, or the copy
 * torch carried to autograd's thread) are re-enabled or disabled, so that a
 * closed observer costs an op nothing (Note [Op observer gated by graph
 * calls] in kd_op_observer.c).  Returns how many entries changed, -1 on
 * failure.  Any thread, GIL held or not. */
int kd_shim_op_observer_gate(int open);

/* How many ops this thread's recording callbacks (thread-local or global;
 * not the depth-only twin) saw start: tests' evidence that a closed observer
 * does not run. */
uint64_t kd_shim_op_observer_starts(void);

/* Note [C++ write guard] (kd_write_guard.c): one byte range a dispatcher op
 * is about to write, as the guard hands it over. */
typedef struct kd_write_range {
    int device_type, device_index;
    uint64_t stream; /* the device's current stream (0: none) */
    uint64_t lo, hi; /* bytes [lo, hi); lo == hi: empty */
} kd_write_range;

/* Asked without the GIL at the start of every dispatcher op on any thread:
 * 0 nothing to guard (the callback returns at once), 1 guard writes of CUDA
 * memory, 2 guard every write (tests: kdebug.testing.write_guard_probe). */
typedef int (*kd_write_level_fn)(void);
/* Called with the GIL held before the op runs: the ranges it writes (n of
 * them), or unbounded = 1 when what it writes cannot be known (no schema, a
 * written tensor without strided storage): then n is 0.  `op` is the op's
 * qualified name at level 2 only ("?" otherwise: formatting it costs). */
typedef void (*kd_write_guard_fn)(const char *op, const kd_write_range *w, int n, int unbounded);

/* Adds the write guard: a global RecordFunction start callback with the op's
 * inputs.  Reference-counted; returns 0, or -1 (kd_shim_last_error()).  GIL held. */
int kd_shim_write_guard_add(kd_write_level_fn level, kd_write_guard_fn guard);
/* Drops one add of the write guard, removing it with the last.  GIL held. */
int kd_shim_write_guard_remove(void);
/* Disables (paused != 0) or enables again the installed guard's callback in
 * torch: while disabled, ops pay nothing for it.  0, or -1 with
 * kd_shim_last_error().  GIL held. */
int kd_shim_write_guard_pause(int paused);

/* The dispatcher's registration epoch the per-thread op tables check (Note
 * [Op info cache] in kd_torch.cpp); 0 before the write guard or the op
 * observer was first added. */
uint64_t kd_shim_op_epoch(void);

/* The message of the last failure in this thread (static storage). */
const char *kd_shim_last_error(void);

#ifdef __cplusplus
}
#endif

#endif
