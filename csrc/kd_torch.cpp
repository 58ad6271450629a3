// kd_torch.cpp - the only kdebug file that includes libtorch headers.
// It reads tensor metadata straight from the at::Tensor behind a Python
// object and exposes it through the extern "C" API of kd_shim.h.  Every entry
// point catches c10::Error, std::exception and everything else, so no C++
// exception reaches the C code that calls it.
#include "kd_phase_timers.h"
#include "kd_shim.h"

#include <atomic>
#include <cstdio>
#include <cstring>
#include <exception>
#include <vector>

#include <ATen/EmptyTensor.h>
#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>
#include <ATen/ThreadLocalPythonObjects.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/Allocator.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/ScalarType.h>
#include <c10/core/TensorOptions.h>
#include <c10/util/strides.h>
#include <c10/core/Stream.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/Exception.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/PyInterpreter.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/version.h>

namespace {

thread_local char last_error[256] = "";

void set_error(const char *what)
{
    std::snprintf(last_error, sizeof last_error, "%s", what);
}

// Whether obj is a torch.Tensor (its class or a subclass: nn.Parameter,
// Buffer, a tensor subclass).  torch's THPVariable_Check answers a non-exact
// class through PyObject_IsInstance, which calls torch.Tensor's metaclass's
// __instancecheck__ (a special-method lookup and a bound-method call: about
// 80 ns more than for an exact tensor on the CPU machine, paid by every
// nn.Parameter among a kernel's arguments; perf put _PyObject_LookupSpecial
// at 12 us a step on autograd's thread in the H200 transformer step).  A subtype check of the object's
// own class reads its MRO in C, and admits only objects laid out as a
// THPVariable, which THPVariable_Unpack needs (an __instancecheck__ could
// claim any object).  Checked against torch 2.11 and 2.13 (THPVariableClass
// is torch.Tensor, set once torch is imported).
bool is_tensor(PyObject *obj)
{
    if (THPVariable_CheckExact(obj))
        return true;
    return THPVariableClass != nullptr && PyType_Check(THPVariableClass) &&
           PyType_IsSubtype(Py_TYPE(obj), reinterpret_cast<PyTypeObject *>(THPVariableClass));
}

} // namespace

// Note [Plain replica tensors] (kd_state_record.c): the dispatch keys that
// make a tensor a wrapper or give it no data of its own, beside meta: torch's
// _is_functional_tensor (Functionalize) and functorch's
// is_functorch_wrapped_tensor (its maybe_get_level: a batched tensor,
// FuncTorchBatched or BatchedNestedTensor; a grad wrapper,
// FuncTorchGradWrapper; a functional tensor), and a Python subclass
// (Python).  Checked against torch 2.11 and 2.13.
extern "C" int kd_shim_plain_data(PyObject *obj, int *device)
{
    try {
        if (!is_tensor(obj))
            return -1;
        const at::Tensor &t = THPVariable_Unpack(obj);
        if (!t.defined() || t.layout() != c10::kStrided)
            return 0;
        static const c10::DispatchKeySet wrapped({c10::DispatchKey::Functionalize,
                                                  c10::DispatchKey::FuncTorchGradWrapper,
                                                  c10::DispatchKey::FuncTorchBatched,
                                                  c10::DispatchKey::BatchedNestedTensor,
                                                  c10::DispatchKey::Python});
        const c10::TensorImpl *impl = t.unsafeGetTensorImpl();
        if (!(impl->key_set() & wrapped).empty())
            return 0;
        const c10::Device dev = t.device();
        if (dev.type() == c10::DeviceType::Meta || !impl->has_storage())
            return 0;
        *device = static_cast<int>(dev.type()) * 256 + static_cast<int>(dev.index()) + 1;
        return 1;
    } catch (...) {
        return 0;
    }
}

/* Note [Prefetching the gradients]
 * The flight recorder's gradient record reads p.grad of every parameter
 * once a step (kd_state_record.c, record_grads), right after the backward
 * ran on autograd's device thread, on another core: each read follows a
 * chain of pointers (the parameter's object, its TensorImpl, its
 * AutogradMeta, the gradient's TensorImpl), each link a cache miss, and
 * taken one parameter after another the misses come one at a time.
 * kd_shim_prefetch_grads takes the chain a link at a time for all the
 * parameters, so that the misses of one link overlap.  On the H200 host,
 * timed inside the transformer + AdamW step with it on and off in
 * alternation (tools/prefetch_ab.py): the gradient record of 50 parameters
 * took 93-95 us a step against 108.  The same for the state records (their
 * tensors' objects, TensorImpls and StorageImpls) and for each kernel
 * launch's arguments measured no difference and was not kept.  A prefetch
 * never faults and changes no value; the loads that find the next link
 * read objects the caller holds (the parameters) and the AutogradMeta they
 * own, as torch's own p.grad getter does.  Checked against torch 2.11 and
 * 2.13 (THPVariable's cdata, TensorImpl::autograd_meta,
 * torch::autograd::AutogradMeta::grad_).  _C._prefetch_grads switches it,
 * for the tool that times it. */
static std::atomic<int> prefetch_on{1};

extern "C" int kd_shim_prefetch_set(int on)
{
    return prefetch_on.exchange(on != 0, std::memory_order_relaxed);
}

namespace {
inline void prefetch_object(const void *p, size_t size)
{
    const char *c = static_cast<const char *>(p);
    for (size_t off = 0; off < size; off += 64)
        __builtin_prefetch(c + off, 0, 3);
}

inline const c10::TensorImpl *impl_of(PyObject *obj)
{
    if (!is_tensor(obj))
        return nullptr;
    const at::Tensor &t = THPVariable_Unpack(obj);
    return t.defined() ? t.unsafeGetTensorImpl() : nullptr;
}
} // namespace

extern "C" void kd_shim_prefetch_grads(PyObject *const *params, Py_ssize_t n)
{
    if (!prefetch_on.load(std::memory_order_relaxed) || n < 2)
        return;
    try {
        for (Py_ssize_t i = 0; i < n; i++)
            prefetch_object(params[i], sizeof(THPVariable));
        for (Py_ssize_t i = 0; i < n; i++)
            if (const c10::TensorImpl *impl = impl_of(params[i]))
                prefetch_object(impl, sizeof(c10::TensorImpl));
        for (Py_ssize_t i = 0; i < n; i++)
            if (const c10::TensorImpl *impl = impl_of(params[i]))
                if (const c10::AutogradMetaInterface *meta = impl->autograd_meta())
                    prefetch_object(meta, sizeof(torch::autograd::AutogradMeta));
        for (Py_ssize_t i = 0; i < n; i++) {
            const c10::TensorImpl *impl = impl_of(params[i]);
            const auto *am = impl ? static_cast<const torch::autograd::AutogradMeta *>(impl->autograd_meta())
                                  : nullptr;
            if (am != nullptr && am->grad_.defined())
                prefetch_object(am->grad_.unsafeGetTensorImpl(), sizeof(c10::TensorImpl));
        }
    } catch (...) { // only ever a hint
    }
}

// A strided tensor's metadata (kd_shim_tensor_meta; the quantizer's tensors of kd_shim_qparams).
static void fill_meta(const at::Tensor &t, kd_tensor_meta *out)
{
    const c10::TensorImpl *impl = t.unsafeGetTensorImpl();
    out->ndim = static_cast<int32_t>(impl->dim());
    out->dtype = static_cast<int32_t>(t.scalar_type());
    const c10::Device dev = t.device();
    out->device_type = static_cast<int32_t>(dev.type());
    out->device_index = dev.index();
    out->sizes = impl->sizes().data();
    out->strides = impl->strides().data();
    out->storage_offset = impl->storage_offset();
    out->math_bits = (impl->is_conj() ? KD_MATH_CONJ : 0) | (impl->is_neg() ? KD_MATH_NEG : 0);
    // const_data_ptr does not materialize copy-on-write storage: reading
    // metadata must never change the program's memory.
    out->data_ptr = impl->has_storage()
                        ? reinterpret_cast<uint64_t>(t.const_data_ptr())
                        : 0;
    // unsafe_storage(): storage() throws for tensors whose storage access
    // is forbidden (functional wrappers); a symbolic size throws in
    // nbytes(): then the bound is unknown (UINT64_MAX: not checked)
    out->storage_nbytes = 0;
    const c10::Storage &st = impl->unsafe_storage();
    if (st) {
        try {
            out->storage_nbytes = static_cast<uint64_t>(st.nbytes());
        } catch (...) {
            out->storage_nbytes = UINT64_MAX;
        }
    }
}

extern "C" int kd_shim_tensor_meta(PyObject *obj, kd_tensor_meta *out)
{
    try {
        if (!is_tensor(obj))
            return 0;
        const at::Tensor &t = THPVariable_Unpack(obj);
        if (!t.defined()) {
            set_error("undefined tensor");
            return -1;
        }
        if (t.layout() != c10::kStrided) {
            set_error("tensor layout is not strided (sparse or other): no strides to record");
            return -1;
        }
        fill_meta(t, out);
        return 1;
    } catch (const c10::Error &e) {
        set_error(e.what_without_backtrace());
    } catch (const std::exception &e) {
        set_error(e.what());
    } catch (...) {
        set_error("unknown C++ exception reading tensor metadata");
    }
    PyErr_Clear(); // a C++ accessor may have left a Python error behind
    return -1;
}

extern "C" int kd_shim_qparams(PyObject *obj, kd_qparams *out)
{
    try {
        if (!is_tensor(obj))
            return 0;
        const at::Tensor &t = THPVariable_Unpack(obj);
        if (!t.defined() || !t.is_quantized())
            return 0;
        std::memset(out, 0, sizeof *out);
        // q_scale / q_per_channel_scales are dispatcher ops: never a Python mode's records
        c10::impl::ExcludeDispatchKeyGuard no_python(
            c10::DispatchKeySet({c10::DispatchKey::Python, c10::DispatchKey::PythonTLSSnapshot}));
        const c10::QScheme q = t.qscheme();
        // the codes of kdebug/hashing.py's _QSCHEME
        switch (q) {
        case c10::kPerTensorAffine: out->head[0] = 0; break;
        case c10::kPerChannelAffine: out->head[0] = 1; break;
        case c10::kPerTensorSymmetric: out->head[0] = 2; break;
        case c10::kPerChannelSymmetric: out->head[0] = 3; break;
        case c10::kPerChannelAffineFloatQParams: out->head[0] = 4; break;
        default: out->head[0] = 99; break;
        }
        if (q == c10::kPerTensorAffine || q == c10::kPerTensorSymmetric) {
            out->head[1] = -1;
            out->scale = t.q_scale();
            out->zero_point = t.q_zero_point();
            return 1;
        }
        out->per_channel = 1;
        out->head[1] = t.q_per_channel_axis();
        // the quantizer's own tensors: their memory lives with the quantizer, which t holds
        fill_meta(t.q_per_channel_scales(), &out->scales);
        fill_meta(t.q_per_channel_zero_points(), &out->zero_points);
        return 1;
    } catch (const c10::Error &e) {
        set_error(e.what_without_backtrace());
    } catch (const std::exception &e) {
        set_error(e.what());
    } catch (...) {
        set_error("unknown C++ exception reading a quantized tensor's parameters");
    }
    PyErr_Clear();
    return -1;
}

extern "C" PyObject *kd_shim_wrap_handle(void *handle)
{
    try {
        // AtenTensorHandle is an at::Tensor * (torch/csrc/inductor/aoti_torch/
        // utils.h, tensor_handle_to_tensor_pointer; torch 2.11, 2.13)
        const at::Tensor *t = static_cast<const at::Tensor *>(handle);
        if (t == nullptr || !t->defined()) {
            set_error("a tensor argument is null or undefined");
            return nullptr;
        }
        PyObject *o = THPVariable_Wrap(*t);
        if (o == nullptr) {
            PyErr_Clear();
            set_error("could not give a C++ tensor a Python object");
        }
        return o;
    } catch (const c10::Error &e) {
        set_error(e.what_without_backtrace());
    } catch (const std::exception &e) {
        set_error(e.what());
    } catch (...) {
        set_error("unknown C++ exception wrapping a tensor handle");
    }
    PyErr_Clear();
    return nullptr;
}

extern "C" int kd_shim_dtype_scalar_type(PyObject *dtype)
{
    try {
        if (!THPDtype_Check(dtype))
            return -1;
        return static_cast<int>(reinterpret_cast<THPDtype *>(dtype)->scalar_type);
    } catch (...) {
        PyErr_Clear();
        return -1;
    }
}

extern "C" int kd_shim_num_scalar_types(void)
{
    return static_cast<int>(c10::ScalarType::NumOptions);
}

namespace {
const std::string &tls_key()
{
    static const std::string key = "kdebug.recorder";
    return key;
}
} // namespace

extern "C" PyObject *kd_shim_tls_recorder_get(void)
{
    try {
        if (!at::impl::ThreadLocalPythonObjects::contains(tls_key()))
            return nullptr;
        const auto &obj = at::impl::ThreadLocalPythonObjects::get(tls_key());
        PyObject *p = obj ? obj->ptr(getPyInterpreter()) : nullptr;
        return p == Py_None ? nullptr : p;
    } catch (...) {
        return nullptr;
    }
}

// Note [Erasing the thread's recorder entry]
// An entry left in torch's thread-local Python objects (even one holding
// None) is a SafePyObject the thread's exit destroys, which takes the GIL:
// a thread that recorded and ended while the interpreter was finalizing was
// stopped inside that destructor (pthread_exit through a noexcept frame):
// "terminate called without an active exception", the process aborted at
// exit, about half the runs of 4 threads each entering DebugMode (found by a
// review; torch erases its own "context" entry for the same reason).  torch
// 2.13 has erase(): "unset" erases the entry.  torch 2.11 has none: "unset"
// is an entry holding None there, and that risk stays.
extern "C" int kd_shim_tls_recorder_set(PyObject *obj)
{
    try {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 13)
        if (obj == nullptr) {
            at::impl::ThreadLocalPythonObjects::erase(tls_key());
            return 0;
        }
#endif
        if (obj == nullptr)
            obj = Py_None;
        Py_INCREF(obj); // SafePyObject steals a reference
        at::impl::ThreadLocalPythonObjects::set(
            tls_key(), std::make_shared<c10::SafePyObject>(obj, getPyInterpreter()));
        return 0;
    } catch (const std::exception &e) {
        set_error(e.what());
    } catch (...) {
        set_error("unknown C++ exception setting the thread-local recorder");
    }
    return -1;
}

extern "C" PyObject *kd_shim_clone(PyObject *obj)
{
    try {
        if (!is_tensor(obj)) {
            set_error("not a tensor");
            return nullptr;
        }
        const at::Tensor &t = THPVariable_Unpack(obj);
        c10::impl::ExcludeDispatchKeyGuard no_python(
            c10::DispatchKeySet({c10::DispatchKey::Python, c10::DispatchKey::PythonTLSSnapshot}));
        at::NoGradGuard no_grad;
        return THPVariable_Wrap(t.clone());
    } catch (const c10::Error &e) {
        set_error(e.what_without_backtrace());
    } catch (const std::exception &e) {
        set_error(e.what());
    } catch (...) {
        set_error("unknown C++ exception cloning a tensor");
    }
    PyErr_Clear();
    return nullptr;
}

extern "C" PyObject *kd_shim_empty_like(PyObject *obj, int *same_strides)
{
    try {
        if (!is_tensor(obj)) {
            set_error("not a tensor");
            return nullptr;
        }
        const at::Tensor &t = THPVariable_Unpack(obj);
        // Straight from the device's allocator, through no dispatcher at all
        // (so no dispatch mode or Python kernel can see it): the source's
        // strides when it is dense (what clone() gives), else contiguous.
        c10::Allocator *alloc = c10::GetAllocator(t.device().type());
        c10::DeviceGuard device_guard(t.device());
        // The dense backend key of the source's device (CPU, CUDA, ...): a
        // set holding only a backend *component* bit has no dispatchable
        // key, and every op on the tensor fails ("no tensor arguments").
        // TensorImpl adds the autograd keys that go with it.
        const auto ks = c10::DispatchKeySet(c10::computeDispatchKey(t.scalar_type(), t.layout(), t.device()));
        c10::DimVector strides = c10::contiguous_strides(t.sizes());
        if (t.is_non_overlapping_and_dense())
            strides.assign(t.strides().begin(), t.strides().end());
        at::Tensor e = at::detail::empty_strided_generic(t.sizes(), strides, alloc, ks, t.scalar_type());
        *same_strides = e.strides() == t.strides() ? 1 : 0;
        if (!*same_strides && !e.is_contiguous()) {
            set_error("could not make a contiguous destination");
            return nullptr;
        }
        return THPVariable_Wrap(std::move(e));
    } catch (const c10::Error &e) {
        set_error(e.what_without_backtrace());
    } catch (const std::exception &e) {
        set_error(e.what());
    } catch (...) {
        set_error("unknown C++ exception allocating a tensor");
    }
    PyErr_Clear();
    return nullptr;
}

extern "C" int kd_shim_copy(PyObject *dst, PyObject *src)
{
    try {
        if (!is_tensor(dst) || !is_tensor(src)) {
            set_error("not a tensor");
            return -1;
        }
        at::Tensor d = THPVariable_Unpack(dst);
        const at::Tensor &s = THPVariable_Unpack(src);
        c10::impl::ExcludeDispatchKeyGuard no_python(
            c10::DispatchKeySet({c10::DispatchKey::Python, c10::DispatchKey::PythonTLSSnapshot}));
        at::NoGradGuard no_grad;
        d.copy_(s, /*non_blocking=*/true);
        return 0;
    } catch (const c10::Error &e) {
        set_error(e.what_without_backtrace());
    } catch (const std::exception &e) {
        set_error(e.what());
    } catch (...) {
        set_error("unknown C++ exception copying a tensor");
    }
    PyErr_Clear();
    return -1;
}

extern "C" void *kd_shim_storage_hold(PyObject *obj, uint64_t *data)
{
    try {
        if (!is_tensor(obj))
            return nullptr;
        const at::Tensor &t = THPVariable_Unpack(obj);
        if (!t.has_storage())
            return nullptr;
        c10::Storage st = t.storage();
        c10::StorageImpl *impl = st.unsafeReleaseStorageImpl(); // our reference now
        *data = reinterpret_cast<uint64_t>(static_cast<const c10::StorageImpl *>(impl)->data());
        return impl;
    } catch (...) {
        set_error("could not reference a tensor's storage");
    }
    return nullptr;
}

extern "C" uint64_t kd_shim_storage_ptr(PyObject *obj)
{
    try {
        if (!is_tensor(obj))
            return 0;
        const at::Tensor &t = THPVariable_Unpack(obj);
        if (!t.has_storage())
            return 0;
        return reinterpret_cast<uint64_t>(t.storage().data());
    } catch (...) {
        set_error("could not read a tensor's storage pointer");
    }
    return 0;
}

// The storage of a Python tensor (nullptr for a non-tensor or one with none);
// unsafe_storage(): storage() throws for tensors whose storage access is
// forbidden (functional wrappers).
static const c10::Storage *storage_of(PyObject *obj)
{
    if (!is_tensor(obj))
        return nullptr;
    const at::Tensor &t = THPVariable_Unpack(obj);
    if (!t.has_storage())
        return nullptr;
    const c10::Storage &st = t.unsafeGetTensorImpl()->unsafe_storage();
    return st ? &st : nullptr;
}

extern "C" void *kd_shim_storage_weak(PyObject *obj, uint64_t *key)
{
    try {
        const c10::Storage *st = storage_of(obj);
        if (st == nullptr)
            return nullptr;
        *key = reinterpret_cast<uint64_t>(st->unsafeGetStorageImpl());
        return new c10::weak_intrusive_ptr<c10::StorageImpl>(st->getWeakStorageImpl());
    } catch (...) {
        set_error("could not reference a tensor's storage");
    }
    return nullptr;
}

extern "C" uint64_t kd_shim_storage_key(PyObject *obj)
{
    try {
        const c10::Storage *st = storage_of(obj);
        return st ? reinterpret_cast<uint64_t>(st->unsafeGetStorageImpl()) : 0;
    } catch (...) {
        set_error("could not read a tensor's storage");
    }
    return 0;
}

extern "C" int kd_shim_storage_weak_alive(void *h)
{
    return h != nullptr && !static_cast<c10::weak_intrusive_ptr<c10::StorageImpl> *>(h)->expired();
}

extern "C" void kd_shim_storage_weak_release(void *h)
{
    delete static_cast<c10::weak_intrusive_ptr<c10::StorageImpl> *>(h);
}

extern "C" uint64_t kd_shim_storage_data(void *h)
{
    return reinterpret_cast<uint64_t>(static_cast<const c10::StorageImpl *>(h)->data());
}

extern "C" void kd_shim_storage_release(void *h)
{
    if (h != nullptr)
        c10::intrusive_ptr<c10::StorageImpl>::reclaim(static_cast<c10::StorageImpl *>(h)); // drops it
}

extern "C" uint64_t kd_shim_current_stream(int device_type, int device_index)
{
    try {
        const auto type = static_cast<c10::DeviceType>(device_type);
        if (!c10::impl::hasDeviceGuardImpl(type))
            return 0;
        const c10::Stream s = c10::impl::getDeviceGuardImpl(type)->getStream(
            c10::Device(type, static_cast<c10::DeviceIndex>(device_index)));
        return reinterpret_cast<uint64_t>(s.native_handle());
    } catch (...) {
        return 0;
    }
}

// ---- what the dispatcher ops are, per thread (Note [Op info cache]) ----
//
// Note [Op info cache]
// The write guard (Note [C++ write guard] in kd_write_guard.c) and the op
// observer (Note [C++ op observer]) run at every dispatcher op on every
// thread, and each needs the op's schema: which arguments it writes, their
// names.  RecordFunction::operator_name() copies the op's two name strings
// and Dispatcher::findOp hashes them into the operator table: together most
// of the guard's ~0.65 us an op on the H200 host.  RecordFunction::name()
// and overload_name() instead return the schema's own strings, whose
// addresses stay put while the op is registered; so each thread keeps a
// small direct-mapped table from that address pair to what the callbacks
// need (the schema, its argument count, the written arguments, whether its
// namespace declares every mutation).  An entry is good only for the
// registration epoch it was made in: a listener on the dispatcher bumps the
// epoch at every operator (schema) registration and deregistration, so an
// address a dropped op's string leaves behind and a later op reuses never
// hits a stale entry, and an op that gains its schema late is read again.
// A record that is not a dispatcher op (a RECORD_FUNCTION scope named by a
// string) has no operator name and is never cached.  Checked against torch
// 2.11 and 2.13 (RecordFunction::name / overload_name return the schema's
// c_str() for ops; c10::OpRegistrationListener).
namespace {

std::atomic<uint64_t> op_epoch{1};
std::atomic<bool> op_epoch_listening{false};

struct EpochListener final : c10::OpRegistrationListener {
    void onOperatorRegistered(const c10::OperatorHandle &) override { op_epoch.fetch_add(1, std::memory_order_acq_rel); }
    void onOperatorDeregistered(const c10::OperatorHandle &) override { op_epoch.fetch_add(1, std::memory_order_acq_rel); }
};

// Installs the epoch listener once (GIL; before any callback that reads the
// table is added).  Kept for the life of the process.
void ensure_epoch_listener()
{
    static c10::RegistrationHandleRAII *handle = nullptr;
    if (handle != nullptr)
        return;
    handle = new c10::RegistrationHandleRAII(
        c10::Dispatcher::singleton().addRegistrationListener(std::make_unique<EpochListener>()));
    op_epoch_listening.store(true, std::memory_order_release);
}

constexpr int kInfoSlots = 256; // a power of two
constexpr int kMaxWriteArgs = 12;
constexpr int kIdArgs = 24; // names interned once: ops of at most this many arguments
constexpr int kIdRes = 4;   // and results (Note [Op names interned once])

struct OpInfo {
    const char *name = nullptr; // the schema's strings (the key)
    const char *ovl = nullptr;
    uint64_t epoch = 0;
    const c10::FunctionSchema *schema = nullptr; // nullptr: the op has no schema
    size_t nargs = 0;
    bool unbounded = false; // no schema, a vararg schema, or more written arguments than kMaxWriteArgs
    bool trusted = false;   // its namespace declares every mutation (trusted_namespace)
    uint8_t nw = 0;         // written arguments (alias_info isWrite), their indices:
    uint8_t widx[kMaxWriteArgs] = {};
    // Note [Op names interned once]: filled at the op's first record on this thread
    bool ids_ok = false;
    bool empty = false;     // an empty* op: its output holds whatever memory it got
    uint8_t nin_ids = 0, nres_ids = 0;
    uint32_t qual_id = 0;
    uint32_t write_mask = 0; // arguments the schema says it writes (bit i: argument i)
    uint32_t arg_id[kIdArgs] = {};
    uint32_t res_id[kIdRes] = {};
};
thread_local OpInfo op_infos[kInfoSlots];
thread_local OpInfo op_info_scratch; // before the listener is installed: read every time

bool trusted_namespace(const std::string &name);

// What dispatcher op `fn` is, or nullptr when it is not one.  May throw (c10).
const OpInfo *op_info(const at::RecordFunction &fn)
{
    const char *nm = fn.name();
    const char *ov = fn.overload_name();
    const uint64_t epoch = op_epoch.load(std::memory_order_acquire);
    const bool listening = op_epoch_listening.load(std::memory_order_acquire);
    const size_t h = ((reinterpret_cast<uintptr_t>(nm) >> 4) ^ (reinterpret_cast<uintptr_t>(ov) >> 6)) &
                     static_cast<size_t>(kInfoSlots - 1);
    OpInfo &e = op_infos[h];
    if (listening && e.name == nm && e.ovl == ov && e.epoch == epoch)
        return &e;
    std::optional<c10::OperatorName> opname = fn.operator_name();
    if (!opname.has_value())
        return nullptr;
    OpInfo &d = listening ? e : op_info_scratch;
    d.name = nullptr; // not a valid key while it is filled
    d.ids_ok = false;
    d.schema = nullptr;
    d.nargs = 0;
    d.unbounded = false;
    d.nw = 0;
    d.trusted = trusted_namespace(opname->name);
    auto handle = c10::Dispatcher::singleton().findOp(*opname);
    if (!handle.has_value() || !handle->hasSchema()) {
        d.unbounded = true;
    } else {
        const c10::FunctionSchema &schema = handle->schema();
        d.schema = &schema;
        d.nargs = schema.arguments().size();
        d.unbounded = schema.is_vararg();
        for (size_t i = 0; i < d.nargs; i++) {
            const c10::AliasInfo *a = schema.arguments()[i].alias_info();
            if (a == nullptr || !a->isWrite())
                continue;
            if (d.nw == kMaxWriteArgs || i > 255) {
                d.unbounded = true;
                break;
            }
            d.widx[d.nw++] = static_cast<uint8_t>(i);
        }
    }
    d.ovl = ov;
    d.epoch = epoch; // read before the lookup: a registration meanwhile makes the next use read it again
    d.name = nm;
    return &d;
}

} // namespace

// ---- the op observer (Note [C++ op observer] in kd_op_observer.c) ----
namespace {

kd_op_want_fn op_want = nullptr;     // set by kd_shim_op_observer_add (GIL)
kd_op_record_fn op_record = nullptr;
kd_op_intern_fn op_intern = nullptr;

constexpr int kMaxOpArgs = 128;
constexpr size_t kNameBytes = 64;

// This thread's observer state: the depth of the dispatcher ops running
// (only the outermost is recorded) and scratch for describing one op, in
// static thread storage so the callback allocates nothing of its own.
struct OpScratch {
    PyObject *objs[kMaxOpArgs];
    uint32_t ids[kMaxOpArgs]; // the names' ids in kdebug's string table
    uint8_t roles[kMaxOpArgs];
    char argname[kMaxOpArgs][kNameBytes]; // the op's argument and result names, copied (record_op)
    char resname[kMaxOpArgs][kNameBytes];
    uint32_t argid[kMaxOpArgs];
    uint32_t resid[kMaxOpArgs];
    char qual[256];
};
thread_local OpScratch op_scratch;

// One registered callback's per-thread state: the depth of the dispatcher
// ops running (only the outermost is recorded) and that op's inputs, taken
// at its start: RecordFunction's inputs() are the dispatcher's boxed copies,
// destroyed once the start callbacks ran.  Copies of IValues (reference
// counts, no allocation) in thread storage.
struct ObsState {
    int depth = 0;
    int ninputs = -1; // -1: the outermost op is not recorded
    c10::IValue inputs[kMaxOpArgs];
};
thread_local ObsState tls_state;   // the thread-local callback's
thread_local uint64_t op_starts = 0; // starts seen on this thread (kd_shim_op_observer_starts)
thread_local ObsState glob_state;  // the global callback's

// Registrations (GIL): one callback of each kind, reference-counted, so
// nested recordings never see an op twice.  While the global one is
// registered it records every thread's ops and the thread-local one
// records none (Note [C++ op observer]).
std::atomic<int> global_refs{0};
uint64_t global_handle = 0;
thread_local int tls_refs = 0;
thread_local uint64_t tls_handle = 0;
thread_local uint64_t tls_depth_handle = 0; // its depth-only twin (Note [Op observer gated by graph calls])

// Start: counts the op's depth (an outermost FUNCTION-scope record counts
// only when it is a dispatcher op: ops inside a non-op RECORD_FUNCTION stay
// outermost); at an outermost op that this thread records (`records`,
// want()), keeps its inputs in st.
void op_start(ObsState &st, const at::RecordFunction &fn, bool records)
{
    try {
        if (st.depth > 0) {
            st.depth++;
            return;
        }
        if (op_info(fn) == nullptr) // Note [Op info cache]
            return;
        st.depth = 1;
        st.ninputs = -1;
        // not inside an intra-op parallel region: its worker threads run parts
        // of an op already running, and the thread that waits for them may hold
        // the GIL the record would take
        if (!records || op_want == nullptr || at::in_parallel_region() || !op_want())
            return;
        c10::ArrayRef<const c10::IValue> ins = fn.inputs();
        size_t n = ins.size() < static_cast<size_t>(kMaxOpArgs) ? ins.size() : kMaxOpArgs;
        for (size_t i = 0; i < n; i++)
            st.inputs[i] = ins[i];
        st.ninputs = static_cast<int>(n);
    } catch (...) {
    }
}

// The thread-local callback's start: records nothing while the global one is registered.
std::unique_ptr<at::ObserverContext> op_start_tls(const at::RecordFunction &fn)
{
    op_starts++;
    op_start(tls_state, fn, global_refs.load(std::memory_order_relaxed) == 0);
    return nullptr;
}

// The thread-local callback's depth-only twin, on while the callback is off
// (Note [Op observer gated by graph calls] in kd_op_observer.c): op_start on
// the same state, never keeping inputs (registered without inputs or
// outputs, with op_end_tls as its end: nothing kept, nothing recorded), so
// that an op running when the callback comes on (a compiled graph called
// inside an eager op's implementation) still makes the ops under it nested.
// Not counted in op_starts.
std::unique_ptr<at::ObserverContext> op_depth_start(const at::RecordFunction &fn)
{
    op_start(tls_state, fn, false);
    return nullptr;
}

// The global callback's start (record_all_threads).
std::unique_ptr<at::ObserverContext> op_start_global(const at::RecordFunction &fn)
{
    op_starts++;
    op_start(glob_state, fn, true);
    return nullptr;
}

// A placeholder object of the Python type that stands for an IValue kdebug
// does not describe by value (a list, a string, a device...): borrowed, made
// once (the C side records its type name only).
PyObject *placeholder(const c10::IValue &v)
{
    static PyObject *empty_tuple = PyTuple_New(0);
    static PyObject *empty_str = PyUnicode_InternFromString("");
    if (v.isList() || v.isTuple() || v.isIntList() || v.isTensorList())
        return empty_tuple;
    return empty_str;
}

// Appends one value (a Tensor, a scalar, None, or a placeholder) as argument
// `id` (its name's id; `name`, the same name as text, is read only for a
// tensor list, whose elements are named "name[i]") with `role`; tensor lists
// become one argument per tensor.  Returns the new count.  New references
// land in objs[] (dropped by the caller).
int add_value(OpScratch &s, int n, const c10::IValue &v, const char *name, uint32_t id, uint8_t role)
{
    auto put = [&](PyObject *o, uint32_t nm) {
        if (n >= kMaxOpArgs || o == nullptr) {
            Py_XDECREF(o);
            return;
        }
        s.ids[n] = nm;
        s.roles[n] = role;
        s.objs[n++] = o;
    };
    if (v.isTensor()) {
        const at::Tensor &t = v.toTensor();
        put(t.defined() ? THPVariable_Wrap(t) : Py_NewRef(Py_None), id);
    } else if (v.isTensorList()) {
        auto list = v.toTensorList();
        for (size_t i = 0; i < list.size(); i++) {
            char nm[kNameBytes];
            std::snprintf(nm, sizeof nm, "%s[%zu]", name != nullptr ? name : "", i);
            const at::Tensor t = list.get(i);
            put(t.defined() ? THPVariable_Wrap(t) : Py_NewRef(Py_None), op_intern(nm, std::strlen(nm)));
        }
    } else if (v.isNone()) {
        put(Py_NewRef(Py_None), id);
    } else if (v.isBool()) {
        put(PyBool_FromLong(v.toBool()), id);
    } else if (v.isInt()) {
        put(PyLong_FromLongLong(v.toInt()), id);
    } else if (v.isDouble()) {
        put(PyFloat_FromDouble(v.toDouble()), id);
    } else {
        put(Py_NewRef(placeholder(v)), id);
    }
    return n;
}

// Whether two IValues are the same defined tensor (one TensorImpl).
bool same_tensor(const c10::IValue &a, const c10::IValue &b)
{
    return a.isTensor() && b.isTensor() && a.toTensor().defined() &&
           a.toTensor().unsafeGetTensorImpl() == b.toTensor().unsafeGetTensorImpl();
}

/* Note [Op names interned once]
 * An op's record names the op ("aten::add.Tensor") and each of its arguments
 * and results by the schema; the C side keeps names as ids in kdebug's string
 * table.  Formatting and interning every name at every op (snprintf, then a
 * hash and a compare under the table's lock) was about 0.35 us of the C++
 * path's 3.7 us per eager op on the 2-core CPU machine (perf).  So an op's
 * names are interned at its first record on a thread, into its op info slot
 * (Note [Op info cache]): for an op with a schema of fixed arity (no varargs)
 * and at most kIdArgs arguments and kIdRes results, recorded with as many
 * inputs and outputs as the schema has.  They are reused while the slot holds
 * that op at that registration epoch (a registration refills the slot, ids
 * included).  A record with a tensor-list argument or result, named per
 * element ("tensors[2]", "result[0]"), and any other op take the per-call
 * path: the same names (name_op), interned at each record.  An id never changes: the table only grows, and a
 * full table (id 0) caches nothing. */

// The qualified name of fn ("aten::mm.out") into buf.
void qualified_name(const at::RecordFunction &fn, char *buf, size_t size)
{
    const char *ovl = fn.overload_name();
    if (ovl[0] == '\0')
        std::snprintf(buf, size, "%s", fn.name());
    else
        std::snprintf(buf, size, "%s.%s", fn.name(), ovl);
}

bool is_empty_op(const char *qual)
{
    return std::strstr(qual, "::empty") != nullptr || std::strstr(qual, "::new_empty") != nullptr;
}

// The names of an op's first nins arguments and nouts results into
// s.argname / s.resname and its arguments' roles into in_role, copied out of
// the schema (nullptr: none): the schema's names, "argN" past its arguments,
// "result" / "resultN" for unnamed results.
void name_op(const c10::FunctionSchema *schema, size_t nins, size_t nouts, OpScratch &s, uint8_t *in_role)
{
    for (size_t i = 0; i < nins; i++) {
        in_role[i] = 1; // KD_ROLE_READ
        if (schema != nullptr && i < schema->arguments().size()) {
            const c10::Argument &a = schema->arguments()[i];
            std::snprintf(s.argname[i], kNameBytes, "%s", a.name().c_str());
            if (a.alias_info() != nullptr && a.alias_info()->isWrite())
                in_role[i] = 2; // KD_ROLE_WRITE: recorded after the op, so only its result
        } else {
            std::snprintf(s.argname[i], kNameBytes, "arg%zu", i);
        }
    }
    for (size_t j = 0; j < nouts; j++) {
        if (schema != nullptr && j < schema->returns().size() && !schema->returns()[j].name().empty())
            std::snprintf(s.resname[j], kNameBytes, "%s", schema->returns()[j].name().c_str());
        else if (nouts == 1)
            std::snprintf(s.resname[j], kNameBytes, "result");
        else
            std::snprintf(s.resname[j], kNameBytes, "result%zu", j);
    }
}

// Interns d's names into d (GIL held; before any tensor is wrapped: the
// schema is read), through name_op and this thread's scratch, which the
// record then fills again.  False when the op takes the per-call path.
bool intern_names(OpInfo &d, const at::RecordFunction &fn, size_t nin, size_t nout)
{
    const c10::FunctionSchema *schema = d.schema;
    if (schema == nullptr || d.unbounded || nin != d.nargs || nin > static_cast<size_t>(kIdArgs) ||
        nout > static_cast<size_t>(kIdRes) || nout != schema->returns().size())
        return false;
    OpScratch &s = op_scratch;
    qualified_name(fn, s.qual, sizeof s.qual);
    const uint32_t q = op_intern(s.qual, std::strlen(s.qual));
    if (q == 0)
        return false;
    uint8_t role[kIdArgs];
    name_op(schema, nin, nout, s, role);
    uint32_t mask = 0;
    for (size_t i = 0; i < nin; i++) {
        d.arg_id[i] = op_intern(s.argname[i], std::strlen(s.argname[i]));
        if (d.arg_id[i] == 0)
            return false;
        if (role[i] == 2)
            mask |= 1u << i;
    }
    for (size_t j = 0; j < nout; j++) {
        d.res_id[j] = op_intern(s.resname[j], std::strlen(s.resname[j]));
        if (d.res_id[j] == 0)
            return false;
    }
    d.qual_id = q;
    d.empty = is_empty_op(s.qual);
    d.write_mask = mask;
    d.nin_ids = static_cast<uint8_t>(nin);
    d.nres_ids = static_cast<uint8_t>(nout);
    d.ids_ok = true;
    return true;
}

// Describes the finished op (GIL held) and hands it to the C side: with the
// names op interned once when it can (Note [Op names interned once]), else
// named (name_op) and interned here.
void record_op(const at::RecordFunction &fn, const OpInfo &op, const c10::IValue *inputs, int nin)
{
    OpScratch &s = op_scratch;
    c10::ArrayRef<const c10::IValue> ins(inputs, static_cast<size_t>(nin));
    const std::vector<c10::IValue> &outs = fn.outputs();
    const size_t nins = ins.size() < static_cast<size_t>(kMaxOpArgs) ? ins.size() : kMaxOpArgs;
    const size_t nouts = outs.size() < static_cast<size_t>(kMaxOpArgs) ? outs.size() : kMaxOpArgs;
    // a tensor list, argument or result, is named per element ("tensors[2]",
    // "result[0]") from the text of its name, which only the per-call path formats
    bool cached = op.ids_ok && nins == op.nin_ids && nouts == op.nres_ids;
    for (size_t i = 0; cached && i < nins; i++)
        cached = !ins[i].isTensorList();
    for (size_t j = 0; cached && j < nouts; j++)
        cached = !outs[j].isTensorList();
    uint32_t qual_id;
    bool empty;
    uint8_t in_role[kMaxOpArgs];
    if (cached) {
        qual_id = op.qual_id;
        empty = op.empty;
        for (size_t i = 0; i < nins; i++) {
            in_role[i] = (op.write_mask >> i) & 1u ? 2 : 1;
            s.argid[i] = op.arg_id[i];
        }
        for (size_t j = 0; j < nouts; j++)
            s.resid[j] = op.res_id[j];
    } else {
        qualified_name(fn, s.qual, sizeof s.qual);
        qual_id = op_intern(s.qual, std::strlen(s.qual));
        empty = is_empty_op(s.qual);
        // Every name and role first, copied out of the schema before any tensor
        // is wrapped: a wrap can run the garbage collector, whose finalizers may
        // drop the op (a torch.library.Library) and free its schema.
        name_op(op.schema, nins, nouts, s, in_role);
        for (size_t i = 0; i < nins; i++)
            s.argid[i] = op_intern(s.argname[i], std::strlen(s.argname[i]));
        for (size_t j = 0; j < nouts; j++)
            s.resid[j] = op_intern(s.resname[j], std::strlen(s.resname[j]));
    }
    int n = 0;
    for (size_t i = 0; i < nins; i++)
        n = add_value(s, n, ins[i], s.argname[i], s.argid[i], in_role[i]);
    for (size_t j = 0; j < nouts; j++) {
        bool aliased = false; // in-place / out=: already recorded as the written argument
        for (size_t i = 0; i < ins.size() && !aliased; i++)
            aliased = same_tensor(outs[j], ins[i]);
        if (!aliased)
            n = add_value(s, n, outs[j], s.resname[j], s.resid[j], 2);
    }
    op_record(qual_id, empty ? 1 : 0, s.objs, s.ids, s.roles, n);
    for (int i = 0; i < n; i++)
        Py_DECREF(s.objs[i]);
}

// End: when the outermost op with kept inputs ends, records it under the GIL
// (the thread's pending Python error, if any, is kept); never throws.
void op_end(ObsState &st, const at::RecordFunction &fn)
{
    if (st.depth == 0)
        return; // a non-op record outside any op
    if (--st.depth > 0)
        return; // nested in an op: the outermost op is what is recorded
    const int nin = st.ninputs;
    st.ninputs = -1;
    if (nin < 0 || op_record == nullptr || !Py_IsInitialized())
        return;
    try {
        const OpInfo *found = op_info(fn); // Note [Op info cache]
        if (found == nullptr)
            return;
        PyGILState_STATE g = PyGILState_Ensure();
        PyObject *et, *ev, *etb;
        PyErr_Fetch(&et, &ev, &etb);
        try {
            // Waiting for the GIL let other threads run: one may have dropped
            // a library and with it the schema `found` points into.  A
            // registration since the lookup is seen in the epoch; look again.
            if (found->epoch != op_epoch.load(std::memory_order_acquire))
                found = op_info(fn);
            if (found != nullptr) { // else no longer an op kdebug can name: not recorded
                // Note [Op names interned once]: at the op's first record (the slot is
                // this thread's; nothing ran since op_info returned it)
                if (!found->ids_ok)
                    intern_names(const_cast<OpInfo &>(*found), fn, static_cast<size_t>(nin), fn.outputs().size());
                const OpInfo op = *found; // ops the record runs may reuse its slot
                record_op(fn, op, st.inputs, nin);
            }
        } catch (...) {
        }
        PyErr_Clear();
        PyErr_Restore(et, ev, etb);
        for (int i = 0; i < nin; i++)
            st.inputs[i] = c10::IValue(); // drop the references (under the GIL: a tensor's last may free its PyObject)
        PyGILState_Release(g);
    } catch (...) {
    }
}

// The two callbacks' ends, each with its own per-thread state.
void op_end_tls(const at::RecordFunction &fn, at::ObserverContext *) { op_end(tls_state, fn); }
void op_end_global(const at::RecordFunction &fn, at::ObserverContext *) { op_end(glob_state, fn); }

} // namespace

extern "C" uint64_t kd_shim_op_observer_add(int global, kd_op_want_fn want, kd_op_record_fn record,
                                           kd_op_intern_fn intern)
{
    try {
        op_want = want;
        op_record = record;
        op_intern = intern;
        ensure_epoch_listener(); // Note [Op info cache]
        uint64_t &handle = global ? global_handle : tls_handle;
        if (handle == 0) {
            auto cb = at::RecordFunctionCallback(global ? op_start_global : op_start_tls,
                                                 global ? op_end_global : op_end_tls)
                          .needsInputs(true)
                          .needsOutputs(true)
                          .scopes({at::RecordScope::FUNCTION});
            handle = global ? at::addGlobalCallback(cb) : at::addThreadLocalCallback(cb);
            if (!global) {
                // off until the gate closes the recording callback (kd_shim_op_observer_gate)
                tls_depth_handle = at::addThreadLocalCallback(
                    at::RecordFunctionCallback(op_depth_start, op_end_tls).scopes({at::RecordScope::FUNCTION}));
                at::disableCallback(tls_depth_handle);
            }
        }
        if (global)
            global_refs++;
        else
            tls_refs++;
        return handle;
    } catch (const std::exception &e) {
        set_error(e.what());
    } catch (...) {
        set_error("unknown C++ exception adding the op observer");
    }
    return 0;
}

extern "C" int kd_shim_op_observer_remove(uint64_t handle)
{
    try {
        if (handle != 0 && handle == global_handle && global_refs > 0) {
            if (--global_refs == 0) {
                global_handle = 0;
                at::removeCallback(handle);
            }
            return 0;
        }
        if (handle != 0 && handle == tls_handle && tls_refs > 0) {
            if (--tls_refs == 0) {
                tls_handle = 0;
                if (tls_depth_handle != 0)
                    at::removeCallback(tls_depth_handle);
                tls_depth_handle = 0;
                at::removeCallback(handle);
            }
            return 0;
        }
        set_error("not an op observer of this thread (a thread-local one is removed on the thread that added it)");
    } catch (const std::exception &e) {
        set_error(e.what());
    } catch (...) {
        set_error("unknown C++ exception removing the op observer");
    }
    return -1;
}

extern "C" int kd_shim_op_observer_gate(int open)
{
    try {
        // Note [Op observer gated by graph calls] in kd_op_observer.c.  The
        // thread's callbacks are read through at::get_record_function_tls_()
        // (RecordFunctionCallbacksEntry: callback_, enabled_, handle_;
        // checked against torch 2.11 and 2.13).  At most one entry per thread
        // (one add, counted), but a carried copy could sit beside it: every
        // entry of this callback is switched.
        // open: the recording callback on, its depth-only twin off; closed: the reverse
        const bool want = open != 0;
        uint64_t on[8], off[8];
        int non = 0, noff = 0;
        for (const auto &e : at::get_record_function_tls_().sorted_tls_callbacks_) {
            bool rec = e.callback_.start() == op_start_tls, twin = e.callback_.start() == op_depth_start;
            if (!rec && !twin)
                continue;
            bool should = rec ? want : !want;
            if (e.enabled_ == should)
                continue;
            if (should && non < 8)
                on[non++] = e.handle_;
            else if (!should && noff < 8)
                off[noff++] = e.handle_;
        }
        // the handles first: switching one rebuilds the list being read (no
        // op runs between the two switches)
        for (int i = 0; i < non; i++)
            at::reenableCallback(on[i]);
        for (int i = 0; i < noff; i++)
            at::disableCallback(off[i]);
        return non + noff;
    } catch (const std::exception &e) {
        set_error(e.what());
    } catch (...) {
        set_error("unknown C++ exception switching the op observer");
    }
    return -1;
}

extern "C" uint64_t kd_shim_op_observer_starts(void) { return op_starts; }

// ---- the write guard (Note [C++ write guard] in kd_write_guard.c) ----
namespace {

kd_write_level_fn wg_level = nullptr; // set by kd_shim_write_guard_add (GIL)
kd_write_guard_fn wg_guard = nullptr;
int wg_refs = 0;                      // GIL
uint64_t wg_handle = 0;

constexpr int kMaxWrites = 64;

// Appends the bytes tensor t covers to w (at most kMaxWrites); false when they
// cannot be bounded (no strided storage, too many writes).  level 1 keeps only
// CUDA tensors.
bool add_write(const at::Tensor &t, int level, kd_write_range *w, int &n)
{
    if (!t.defined())
        return true;
    const c10::Device dev = t.device();
    if (level < 2 && dev.type() != c10::DeviceType::CUDA)
        return true; // a CPU write cannot touch the GPU queue
    if (t.layout() != c10::kStrided || !t.has_storage() || n >= kMaxWrites)
        return false;
    const c10::TensorImpl *impl = t.unsafeGetTensorImpl();
    const uint64_t data = reinterpret_cast<uint64_t>(t.const_data_ptr());
    const int64_t item = static_cast<int64_t>(t.element_size());
    int64_t min = 0, max = 0;
    bool empty = false;
    for (int64_t d = 0; d < impl->dim(); d++) {
        const int64_t size = impl->sizes()[d], stride = impl->strides()[d];
        if (size == 0)
            empty = true;
        const int64_t span = (size - 1) * stride;
        if (span < 0)
            min += span;
        else
            max += span;
    }
    kd_write_range &r = w[n++];
    r.device_type = static_cast<int>(dev.type());
    r.device_index = dev.index();
    r.stream = 0; // CPU and the like have no stream handle
    if (dev.type() == c10::DeviceType::CUDA && c10::impl::hasDeviceGuardImpl(dev.type()))
        r.stream = reinterpret_cast<uint64_t>(c10::impl::getDeviceGuardImpl(dev.type())->getStream(dev).native_handle());
    r.lo = r.hi = data;
    if (!empty) {
        r.lo = data + static_cast<uint64_t>(min * item);
        r.hi = data + static_cast<uint64_t>((max + 1) * item);
    }
    return true;
}

// Whether ops of qualified name `name`'s namespace declare every argument they
// write in their schema (alias_info isWrite).
bool trusted_namespace(const std::string &name)
{
    static const char *const trusted[] = {"aten::", "prim::", "prims::", "_c10d_functional::"};
    for (const char *t : trusted)
        if (name.compare(0, std::strlen(t), t) == 0)
            return true;
    return false;
}

// Start of every dispatcher op (any thread, with or without the GIL): when
// something is to be guarded, the byte ranges of the tensors its schema says
// it writes (alias_info isWrite: in-place self, out=, mutable lists) go to
// the C side under the GIL before the op runs.
std::unique_ptr<at::ObserverContext> write_guard_start_impl(const at::RecordFunction &fn)
{
    kd_write_level_fn level_fn = wg_level;
    const int level = level_fn != nullptr ? level_fn() : 0;
    if (level == 0)
        return nullptr;
    kd_write_range w[kMaxWrites];
    int n = 0;
    bool unbounded = false;
    const OpInfo *op = nullptr;
    try {
        op = op_info(fn); // Note [Op info cache]
        if (op == nullptr)
            return nullptr; // a user's record_function scope, not an op: its ops come on their own
        // parts of an op already guarded, run by intra-op workers whose caller may hold the GIL
        if (at::in_parallel_region())
            return nullptr;
        c10::ArrayRef<const c10::IValue> ins = fn.inputs();
        if (op->unbounded || ins.size() != op->nargs)
            unbounded = true;
        for (int k = 0; k < op->nw && !unbounded; k++) {
            const c10::IValue &v = ins[op->widx[k]];
            if (v.isTensor()) {
                unbounded = !add_write(v.toTensor(), level, w, n);
            } else if (v.isTensorList()) {
                auto list = v.toTensorList();
                for (size_t j = 0; j < list.size() && !unbounded; j++)
                    unbounded = !add_write(list.get(j), level, w, n);
            } else if (v.isList()) { // Tensor?[] and the like
                for (const c10::IValue &e : v.toListRef())
                    if (e.isTensor() && !unbounded)
                        unbounded = !add_write(e.toTensor(), level, w, n);
            } else if (!v.isNone()) {
                unbounded = true; // a written value kdebug cannot read as tensors
            }
        }
        // Outside the namespaces whose schemas declare every mutation
        // (aten, prims, functional collectives), an op that declares none
        // but takes tensors may still write them: c10d::allreduce_ and
        // the other eager collectives do, custom ops may.  Doubt: flush.
        if (op->nw == 0 && !unbounded && !op->trusted)
            for (const c10::IValue &v : ins)
                if (v.isTensor() || v.isTensorList() || v.isList())
                    unbounded = true;
    } catch (...) {
        unbounded = true; // any doubt: everything queued goes first
    }
    if (!unbounded && n == 0)
        return nullptr; // writes nothing that matters here: no GIL
    if (!Py_IsInitialized())
        return nullptr;
    char qual[256] = "?";
    if (op != nullptr && level == 2) { // named only for the probe's log (kdebug.testing)
        const char *ovl = fn.overload_name();
        if (ovl[0] == '\0')
            std::snprintf(qual, sizeof qual, "%s", fn.name());
        else
            std::snprintf(qual, sizeof qual, "%s.%s", fn.name(), ovl);
    }
    PyGILState_STATE g = PyGILState_Ensure();
    kd_write_guard_fn guard = wg_guard;
    if (guard != nullptr)
        guard(qual, w, unbounded ? 0 : n, unbounded ? 1 : 0);
    PyGILState_Release(g);
    return nullptr;
}

std::unique_ptr<at::ObserverContext> write_guard_start(const at::RecordFunction &fn)
{
#ifdef KD_PHASE_TIMERS
    const uint64_t t0 = KD_PT_NOW(); // Note [Phase timers]
    auto out = write_guard_start_impl(fn);
    KD_PT_ADD(KD_PT_GUARD, t0);
    return out;
#else
    return write_guard_start_impl(fn);
#endif
}

} // namespace

extern "C" int kd_shim_write_guard_add(kd_write_level_fn level, kd_write_guard_fn guard)
{
    try {
        wg_level = level;
        wg_guard = guard;
        ensure_epoch_listener(); // Note [Op info cache]
        if (wg_refs == 0) {
            auto cb = at::RecordFunctionCallback(write_guard_start)
                          .needsInputs(true)
                          .scopes({at::RecordScope::FUNCTION});
            wg_handle = at::addGlobalCallback(cb);
        }
        wg_refs++;
        return 0;
    } catch (const std::exception &e) {
        set_error(e.what());
    } catch (...) {
        set_error("unknown C++ exception adding the write guard");
    }
    return -1;
}

extern "C" int kd_shim_write_guard_remove(void)
{
    try {
        if (wg_refs <= 0) {
            set_error("the write guard is not installed");
            return -1;
        }
        if (--wg_refs == 0) {
            at::removeCallback(wg_handle);
            wg_handle = 0;
        }
        return 0;
    } catch (const std::exception &e) {
        set_error(e.what());
    } catch (...) {
        set_error("unknown C++ exception removing the write guard");
    }
    return -1;
}

extern "C" int kd_shim_write_guard_pause(int paused)
{
    try {
        if (wg_refs <= 0) {
            set_error("the write guard is not installed");
            return -1;
        }
        // a disabled callback costs an op nothing: RecordFunction neither runs
        // nor boxes inputs for it (each thread sees the change at its next op)
        if (paused)
            at::disableCallback(wg_handle);
        else
            at::reenableCallback(wg_handle);
        return 0;
    } catch (const std::exception &e) {
        set_error(e.what());
    } catch (...) {
        set_error("unknown C++ exception pausing the write guard");
    }
    return -1;
}

extern "C" uint64_t kd_shim_op_epoch(void)
{
    return op_epoch_listening.load(std::memory_order_acquire) ? op_epoch.load(std::memory_order_acquire) : 0;
}

extern "C" const char *kd_shim_last_error(void) { return last_error; }
