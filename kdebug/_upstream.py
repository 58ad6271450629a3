"""Every torch-private name kdebug uses, found here and nowhere else.

Note [Torch-private access]: kdebug builds on torch.utils._debug_mode and
hooks Inductor, so it reads names torch does not promise to keep.  Each
one is reached through this module (the C side's equivalents are in
csrc/kd_torch.cpp), with the torch versions it was checked against, so a
torch upgrade means reading one file.  "2.11, 2.13" means the name has the
form used here in both (the oldest supported torch and the newest tried);
torch 2.11 keeps DebugMode in one module, torch 2.13 splits it into a
package (_mode, _calls, _utils), which is why modules are found by what
they hold rather than by name.  Imports of torch._inductor and
torch._dynamo stay inside the functions: they cost ~1 s and are needed only
once a DebugMode is entered.
"""
from __future__ import annotations

import functools
import sys

import torch

try:
    import torch.utils._debug_mode as _dm
    from torch.utils._debug_mode import DebugMode, _DebugCall, _OpCall, _TritonKernelCall
except ImportError as e:  # pragma: no cover - torch too old
    raise ImportError(
        "kdebug needs torch >= 2.11, whose torch.utils._debug_mode provides DebugMode "
        f"and _TritonKernelCall ({e}). Upgrade torch."
    ) from e

# 2.11, 2.13
from torch.utils._dtype_abbrs import dtype_abbrs
from torch.utils._pytree import tree_all, tree_is_leaf, tree_map  # 2.11, 2.13
from torch.utils._python_dispatch import TorchDispatchMode, _get_dispatch_stack_at  # 2.11, 2.13

OpOverload = torch._ops.OpOverload  # 2.11, 2.13


@functools.cache  # once per process: the table only grows
def name_every_dtype() -> None:
    """Gives every torch dtype that dtype_abbrs (upstream's text of a dtype,
    2.11, 2.13) lacks (quint8, qint8, qint32, ...) the name str() gives it
    less "torch.".  Upstream's tensor text indexes that table and raises
    KeyError on a quantized tensor, stopping the program under its DebugMode
    and kdebug's.  Called when a kdebug DebugMode is made; entries torch has
    are never changed, and the table only grows, once (a name added and
    removed around each call raced with other threads' recordings)."""
    for n in dir(torch):
        d = getattr(torch, n, None)
        if isinstance(d, torch.dtype) and d not in dtype_abbrs:
            dtype_abbrs.setdefault(d, str(d).replace("torch.", ""))
OpOverloadPacket = torch._ops.OpOverloadPacket  # 2.11, 2.13
disable_torch_dispatch = torch._C._DisableTorchDispatch  # 2.11, 2.13: a context manager
dispatch_stack_depth = torch._C._len_torch_dispatch_stack  # 2.11, 2.13: this thread's dispatch modes


def untyped_of(typed: "torch.TypedStorage") -> "torch.UntypedStorage":
    """A TypedStorage's UntypedStorage without its public untyped(), which
    warns 'TypedStorage is deprecated' into the program's output (torch.save
    reaches kdebug's program reads with one); _untyped_storage: 2.11, 2.13."""
    return typed._untyped_storage

mode_module = sys.modules[DebugMode.__module__]
"""Module holding _ACTIVE_DEBUG_MODE_COUNT (torch.utils._debug_mode[._mode]; 2.11, 2.13)."""


def _find_utils_module():
    for name in ("torch.utils._debug_mode._utils", "torch.utils._debug_mode"):
        mod = sys.modules.get(name)
        if mod is not None and hasattr(mod, "_IN_INDUCTOR_BENCHMARK"):
            return mod
    raise ImportError("cannot find upstream DebugMode's _IN_INDUCTOR_BENCHMARK flag")


utils_module = _find_utils_module()
"""Module holding _IN_INDUCTOR_BENCHMARK and the hash / record-output globals (2.11, 2.13)."""

upstream_get_active_debug_mode = _dm.get_active_debug_mode
"""Upstream's own answer (2.11, 2.13): the outermost DebugMode on this
thread's dispatch-mode stack, None when _ACTIVE_DEBUG_MODE_COUNT is 0.
Note [Active mode] (kdebug/_active.py) builds on it; this name keeps the
original after install_get_active_debug_mode replaced upstream's."""

get_call_name = _dm._get_call_name  # 2.11, 2.13
stringify_attributes = utils_module._stringify_attributes
"""Upstream's ``{attr=value, ...}`` text of a tensor's record_tensor_attributes (2.11, 2.13)."""

# Upstream's call types and helpers that ``from kdebug import NAME`` gives
# (kdebug/__init__.py), as the installed torch has them: 2.13 has all but
# _NNModuleCall, 2.11 has _NNModuleCall and may lack the newer ones.
UPSTREAM_EXPORTS = ("_DebugCall", "_OpCall", "_AnnotateCall", "_RedistributeCall", "_OutputPlacementCall",
                    "_NNModuleCall", "_get_call_name", "_stringify_shape", "DebugInterpreter",
                    "TensorIdTracker", "hash_tensor_fn", "norm_hash_fn")


def upstream_export(name: str):
    """torch.utils._debug_mode's NAME (one of UPSTREAM_EXPORTS), or
    AttributeError saying this torch has none."""
    if name in UPSTREAM_EXPORTS:
        for mod in (_dm, mode_module, utils_module):
            if hasattr(mod, name):
                return getattr(mod, name)
    raise AttributeError(f"torch {torch.__version__}'s torch.utils._debug_mode has no {name!r} "
                         f"(kdebug re-exports what it has of: {', '.join(UPSTREAM_EXPORTS)})")


def install_get_active_debug_mode(fn) -> None:
    """Note [Active mode]: makes upstream's get_active_debug_mode (the
    package's name and the one its own module calls, e.g. DebugInterpreter)
    answer with ``fn`` (2.11, 2.13).  Modules that imported the name before
    keep the original."""
    for mod in {id(m): m for m in (_dm, mode_module)}.values():
        if getattr(mod, "get_active_debug_mode", None) is upstream_get_active_debug_mode:
            mod.get_active_debug_mode = fn


def dispatch_hook_lists() -> tuple[list, list, list]:
    """Upstream's registered dispatch hooks: record, log, pre-log (2.13; 2.11
    has no pre-log hooks: an empty list stands in)."""
    u = utils_module
    return u._DISPATCH_RECORD_HOOKS, u._DISPATCH_LOG_HOOKS, getattr(u, "_DISPATCH_PRE_LOG_HOOKS", [])


_HOOK_RUNNERS = ("_run_dispatch_pre_log_hooks", "_run_dispatch_hooks")


def install_hook_runners(run_pre_log, run_log) -> None:
    """Note [Aten-op hash settings per thread] (kdebug/_aten_hooks.py): the
    names upstream's __torch_dispatch__ calls its dispatch hooks through,
    _run_dispatch_pre_log_hooks(call, func, types, args, kwargs) and
    _run_dispatch_hooks(call, func, types, args, kwargs, result), looked up in
    DebugMode's module at each call (2.13: imported into _mode from _utils;
    2.11: defined in torch.utils._debug_mode, with no pre-log hooks), become
    ``run_pre_log(original, ...)`` / ``run_log(original, ...)``.  Once; the
    originals stay reachable through the wrappers."""
    for name, runner in zip(_HOOK_RUNNERS, (run_pre_log, run_log)):
        original = getattr(mode_module, name, None)
        if original is None:
            if name == _HOOK_RUNNERS[0]:
                continue  # torch without pre-log hooks
            raise ImportError(f"torch {torch.__version__}'s DebugMode module has no {name}: kdebug cannot "
                              "keep log_tensor_hashes() settings per thread with it")
        if getattr(original, "_kd_original", None) is not None:
            continue  # installed already

        def run(*args, _original=original, _runner=runner):
            return _runner(_original, *args)

        run._kd_original = original
        run.__name__ = name
        setattr(mode_module, name, run)


def dispatch_modes() -> list:
    """This thread's dispatch modes, outermost first (2.11, 2.13)."""
    return [_get_dispatch_stack_at(i) for i in range(dispatch_stack_depth())]


def eval_frame_callbacks():
    """(get_eval_frame_callback, set_eval_frame) of dynamo's C frame hook
    (2.11, 2.13), or (None, None) where torch has neither."""
    ev = getattr(getattr(torch._C, "_dynamo", None), "eval_frame", None)
    return getattr(ev, "get_eval_frame_callback", None), getattr(ev, "set_eval_frame", None)


def compute_rel_diff(h1, h2):
    fn = getattr(mode_module, "_compute_rel_diff", None) or getattr(_dm, "_compute_rel_diff", None)
    if fn is None:
        fn = getattr(utils_module, "_compute_rel_diff", None)
    if fn is not None:
        try:
            return fn(h1, h2)
        except (TypeError, ValueError):
            pass
    return None


def get_op_name(op) -> str:
    """Upstream's name for an op (what its rendering starts with)."""
    if isinstance(op, OpOverload):
        return op.__qualname__
    if hasattr(op, "__module__") and hasattr(op, "__name__"):
        return f"{op.__module__}.{op.__name__}"
    return str(op)


PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter)
# has_no_data's checks, looked up once: it runs per gradient per optimizer step (the flight recorder)
_is_functional_tensor = torch._is_functional_tensor
_is_functorch_wrapped = torch._C._functorch.is_functorch_wrapped_tensor


def has_no_data(t) -> bool:
    """Whether tensor ``t`` has no memory of its own for kdebug to read: a
    meta tensor, a FakeTensor or a functional / functorch wrapper around one
    (torch._subclasses.fake_tensor.is_fake, 2.11-2.13: AOTInductor's and
    export's tracing runs ops on them under the active dispatch mode), or any
    traceable wrapper subclass (torch.utils._python_dispatch, 2.11-2.13:
    FunctionalTensor, DTensor; its data lives in its inner tensors).  Reading
    such a tensor's data pointer crashed the process (a FakeTensor's is no
    memory at all)."""
    if (type(t) in PLAIN_TENSORS and not t.is_meta and not _is_functional_tensor(t)
            and not _is_functorch_wrapped(t)):
        return False  # the common case, cheaply: no Python subclass (fake or wrapper), no C++ wrapper
    if t.is_meta:
        return True
    from torch._subclasses.fake_tensor import is_fake
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    return is_fake(t) or is_traceable_wrapper_subclass(t)


def replica_value(t):
    """The tensor whose data stands for ``t`` as a replica: ``t`` itself when
    it has data of its own (has_no_data), the local tensor of a DTensor whose
    placements are all Replicate (torch.distributed.tensor.DTensor,
    2.11-2.13: .placements, .to_local(); every rank holds it whole), else
    None (a sharded DTensor: each rank holds another part; a fake tensor)."""
    if not has_no_data(t):
        return t
    try:
        from torch.distributed.tensor import DTensor, Replicate
    except ImportError:
        return None
    if isinstance(t, DTensor) and all(isinstance(p, Replicate) for p in t.placements):
        local = t.to_local()
        return None if has_no_data(local) else local
    return None


def fake_tensor_type() -> type:
    """torch._subclasses.fake_tensor.FakeTensor (2.11-2.13): compile-time
    stand-ins with no real memory, which Note [Final state] leaves out."""
    from torch._subclasses.fake_tensor import FakeTensor

    return FakeTensor


# ---------------------------------------------------------------- Inductor and dynamo

def caching_autotuner() -> type:
    """torch._inductor.runtime.triton_heuristics.CachingAutotuner (2.11, 2.13)."""
    from torch._inductor.runtime.triton_heuristics import CachingAutotuner

    return CachingAutotuner


def triton_heuristics_module():
    """torch._inductor.runtime.triton_heuristics (2.11, 2.13): its
    get_active_debug_mode name is what Triton launches consult."""
    from torch._inductor.runtime import triton_heuristics

    return triton_heuristics


def cuda_graph_class() -> type | None:
    """torch.cuda.graphs.CUDAGraph (2.11, 2.13: the Python subclass of
    torch._C._CUDAGraph whose capture_begin / capture_end / replay call
    super(); Inductor's cudagraph trees and torch.cuda.graph use it), or None
    without CUDA."""
    try:
        from torch.cuda.graphs import CUDAGraph
    except ImportError:  # pragma: no cover - a torch built without CUDA still has the module
        return None
    for name in ("capture_begin", "capture_end", "replay"):
        if name not in CUDAGraph.__dict__:
            return None
    return CUDAGraph


def is_cudagraph_recording(callback_args) -> bool:
    """Whether a dynamo compile callback is cudagraph trees recording a graph
    at run time (CallbackTrigger.CUDAGRAPH_RECORDING; 2.11, 2.13): the run is
    the program's, not a compile."""
    trigger = getattr(callback_args, "callback_trigger", None)
    return getattr(trigger, "name", None) == "CUDAGRAPH_RECORDING"


def async_compile_class() -> type:
    """torch._inductor.async_compile.AsyncCompile (2.11, 2.13: cpp_pybinding, wait)."""
    from torch._inductor import async_compile

    return async_compile.AsyncCompile


def generated_modules() -> list:
    """Inductor's loaded generated modules (PyCodeCache.modules and
    .modules_no_attr; 2.11, 2.13)."""
    from torch._inductor.codecache import PyCodeCache

    mods = list(getattr(PyCodeCache, "modules", []))
    mods += list(getattr(PyCodeCache, "modules_no_attr", {}).values())
    return mods


def compiled_fx_graph() -> type:
    """torch._inductor.output_code.CompiledFxGraph (2.11, 2.13)."""
    from torch._inductor.output_code import CompiledFxGraph

    return CompiledFxGraph


def extern_kernels():
    """The namespace Inductor's generated code calls its extern kernels
    through (``extern_kernels.mm(..., out=buf)``), 2.11-2.13: an attribute of
    torch._inductor.select_algorithm, looked up on each call."""
    from torch._inductor.select_algorithm import extern_kernels as ek

    return ek


def aoti_compiled_model() -> type | None:
    """torch._inductor.package.package.AOTICompiledModel (2.11, 2.13), or None."""
    try:
        from torch._inductor.package.package import AOTICompiledModel
    except ImportError:  # pragma: no cover
        return None
    return AOTICompiledModel


def cpp_wrapper_codegen_classes() -> list:
    """Inductor's C++ wrapper codegen classes (torch._inductor.codegen:
    cpp_wrapper_cpu.CppWrapperCpu, cpp_wrapper_gpu.CppWrapperGpu,
    cpp_wrapper_cpu_array_ref.CppWrapperCpuArrayRef; 2.13, and the same
    names in 2.11).  Each kernel call goes through its
    _generate_kernel_call_helper(kernel_name, call_args, *, device, triton,
    arg_types, raw_keys, raw_args, triton_meta, inductor_meta, ...) (2.13;
    arg_types: C types for C++ kernels, torch.dtype for Triton tensors),
    which writes the call inside ``with V.graph.wrapper_code.debug_printer``
    after set_printer_args(call_args, kernel_name, ...).  Note [C++ wrapper
    launches]."""
    import importlib

    out = []
    for mod, name in (("cpp_wrapper_cpu", "CppWrapperCpu"), ("cpp_wrapper_gpu", "CppWrapperGpu"),
                      ("cpp_wrapper_cpu_array_ref", "CppWrapperCpuArrayRef")):
        try:
            out.append(getattr(importlib.import_module(f"torch._inductor.codegen.{mod}"), name))
        except (ImportError, AttributeError):  # pragma: no cover - a build without it
            continue
    return out


def extern_kernel_out_line() -> type:
    """torch._inductor.codegen.wrapper.ExternKernelOutLine (2.13): its
    codegen(code) calls the wrapper's _generate_extern_kernel_out_helper(
    kernel, out, out_view, args, device, stack_traces) for .node (an
    ir.ExternKernelOut; .op_overload the aten op, args in schema order);
    the C++ wrappers emit that call as a C-shim call inside the debug
    printer manager (kernel_type "extern")."""
    from torch._inductor.codegen.wrapper import ExternKernelOutLine

    return ExternKernelOutLine


def graph_has_tensor(graph, name: str) -> bool:
    """Whether ``name`` is a buffer or an input of a GraphLowering
    (.name_to_buffer, .graph_inputs, .constants; 2.13)."""
    if graph is None:
        return False
    for attr in ("name_to_buffer", "graph_inputs", "constants"):
        d = getattr(graph, attr, None)
        if isinstance(d, dict) and name in d:
            return True
    return False


def deferred_triton_call_wrapper() -> type | None:
    """torch._inductor.codegen.cpp_wrapper_gpu.DeferredTritonCallWrapper
    (2.11, 2.13): generate(wrapper) writes the C++ function each Triton kernel
    of a CUDA C++ wrapper is called through.  Inside it, generate_grid(prefix,
    inductor_meta, params) declares ``uint32_t grid_0, grid_1, grid_2`` and
    generate_launch_kernel(prefix, wrapper, kernel_var_name, params) then
    writes the launch; params is CudaKernelParamCache's entry ("num_warps",
    "shared_mem", "config": config_to_dict(launcher.config), the config's
    kwargs with num_warps / num_stages and, with warp specialization,
    num_consumer_groups / num_buffers_warp_spec).  2.13's lazy path
    (autotune_at_compile_time=False) writes its launch elsewhere
    (_generate_lazy_launch).  None when the module is missing."""
    try:
        from torch._inductor.codegen.cpp_wrapper_gpu import DeferredTritonCallWrapper
    except ImportError:  # pragma: no cover - a build without it
        return None
    return DeferredTritonCallWrapper


def triton_wrapper_args(wrapper, call_args: list, arg_types: list) -> tuple[list, list] | None:
    """A CUDA C++ wrapper's Triton call arguments as it writes them:
    CppWrapperGpu.prepare_triton_wrapper_args(call_args, arg_types) (2.11: a
    staticmethod, 2.13: a method) makes sympy sizes C++ expressions (cexpr of
    the simplified size), floats C++ literals, bools true / false, and marks a
    0-d CPU tensor that stands for a Python scalar UnwrapUnspecArg (its value
    is read inside the call).  None when the wrapper has no such method."""
    prep = getattr(wrapper, "prepare_triton_wrapper_args", None)
    if prep is None:
        return None
    args, types = prep(list(call_args), list(arg_types))
    return list(args), list(types)


def debug_printer_manager_class() -> type:
    """torch._inductor.codegen.debug_utils.DebugPrinterManager (2.11, 2.13):
    each wrapper's .debug_printer; set_printer_args(args, kernel_name,
    arg_signatures, kernel, kernel_type=None) sets .kernel_name, and
    __enter__ / __exit__ emit code before / after the kernel call."""
    from torch._inductor.codegen.debug_utils import DebugPrinterManager

    return DebugPrinterManager


def fx_graph_hash_details() -> type:
    """torch._inductor.codecache.FxGraphHashDetails (2.11, 2.13):
    __init__(gm, example_inputs, fx_kwargs, inputs_to_check); the FX-graph
    cache key (and AOTAutogradCacheDetails, its subclass) hashes the
    pickled instance, so an attribute set on it changes the key."""
    from torch._inductor.codecache import FxGraphHashDetails

    return FxGraphHashDetails


def aot_code_compiler() -> type:
    """torch._inductor.codecache.AotCodeCompiler (2.11, 2.13): the classmethod
    compile(graph, wrapper_code, kernel_code, ...) writes
    config.aot_inductor.metadata into the AOTI model (what
    AOTICompiledModel.get_metadata() returns)."""
    from torch._inductor.codecache import AotCodeCompiler

    return AotCodeCompiler


def current_graph():
    """torch._inductor.virtualized.V.graph, the GraphLowering being lowered
    now (2.11, 2.13: .cpp_wrapper, .aot_mode, .wrapper_code), or None."""
    try:
        from torch._inductor.virtualized import V

        return V.graph
    except Exception:  # no graph set (V's NullHandler raises)
        return None


def wrapper_output(wrapper):
    """The IndentedBuffer a wrapper codegen's writeline writes into while it
    generates its lines (2.13: PythonWrapperCodegen.set_writeline's dispatch
    closure, whose `target` cell is the buffer; a bound IndentedBuffer.writeline
    in other versions; not checked against 2.11), or None when it cannot be
    told (Note [Fresh buffers in C++ wrappers] then treats nothing as fresh)."""
    wl = getattr(wrapper, "writeline", None)
    code = getattr(wl, "__code__", None)
    if code is not None and "target" in code.co_freevars and wl.__closure__:
        try:
            return wl.__closure__[code.co_freevars.index("target")].cell_contents
        except (ValueError, IndexError):
            return None
    out = getattr(wl, "__self__", None)
    return None if out is wrapper else out


def compile_callback_handler():
    """torch._dynamo.callback_handler (2.11, 2.13: register_start_callback,
    register_end_callback)."""
    import torch._dynamo

    return torch._dynamo.callback_handler


def register_lasting_compile_callbacks(start, end) -> None:
    """Registers dynamo compile start/end callbacks that outlive
    torch._dynamo.reset(): reset() (and torch.compiler.reset()) calls
    callback_handler.clear(), which drops every registered callback (2.11,
    2.13), so without this a test or program that resets dynamo turned
    kdebug's compile window off for the rest of the process (seen on the
    H100: cpp_wrapper's compile-time autotuning launches recorded).  The
    handler's clear is wrapped on the instance to put these two back."""
    handler = compile_callback_handler()

    def put_back() -> None:
        if start not in handler.start_callbacks:
            handler.register_start_callback(start)
        if end not in handler.end_callbacks:
            handler.register_end_callback(end)

    put_back()
    orig_clear = handler.clear
    if getattr(orig_clear, "_kdebug_keeps", None) is not None:
        return

    def clear() -> None:
        try:
            orig_clear()
        finally:
            put_back()

    clear._kdebug_keeps = (start, end)  # type: ignore[attr-defined]
    handler.clear = clear


_inductor_config = None


def inductor_config():
    """torch._inductor.config (2.11, 2.13): imported at the first call (every
    DebugMode enter reads it), the module kept from then on."""
    global _inductor_config
    if _inductor_config is None:
        import torch._inductor.config

        _inductor_config = torch._inductor.config
    return _inductor_config


def pin_autotuning() -> str:
    """No autotuning by timing from here on in this process: Inductor's
    deterministic mode where this torch has it (2.12, 2.13), else (2.11) one
    config a reduction (test_configs.force_filter_reduction_configs) and a
    pointwise kernel (triton.autotune_pointwise = False).  Returns what it
    set.  (Seen on H200s, torch 2.11: two ranks, or two runs, timed their own
    candidates and chose XBLOCK 1 and 8 for one reduction, whose sums then
    differ.)"""
    import torch._inductor.config as ic

    if hasattr(ic, "deterministic"):
        ic.deterministic = True
    else:
        ic.test_configs.force_filter_reduction_configs = True
        ic.triton.autotune_pointwise = False
    return autotuning_pin()


def autotuning_pin() -> str:
    """The settings pin_autotuning() makes on this torch, as code to write."""
    import torch._inductor.config as ic

    if hasattr(ic, "deterministic"):
        return "torch._inductor.config.deterministic = True"
    return ("torch._inductor.config.test_configs.force_filter_reduction_configs = True and "
            "torch._inductor.config.triton.autotune_pointwise = False")


def skip_frame(code) -> None:
    """Dynamo's frame hook runs this code object's frames as they are, never
    compiling them (the frames they call are its to compile, as any other):
    torch._dynamo.eval_frame.skip_code (2.11, 2.13); nothing where it is
    missing (a wrapper's frame may then be compiled)."""
    try:
        from torch._dynamo.eval_frame import skip_code
    except ImportError:
        return
    skip_code(code)


def dynamo_reset() -> None:
    """torch._dynamo.reset() (2.11, 2.13): forget compiled frames."""
    import torch._dynamo

    torch._dynamo.reset()


def dynamo_frame_counts() -> tuple[int, int] | None:
    """(frames dynamo was asked to compile, graphs it captured) in this
    process so far, from torch._dynamo.utils.counters (2.11, 2.13); None when
    dynamo was never imported or the counters are not there."""
    import sys

    utils = sys.modules.get("torch._dynamo.utils")
    counters = getattr(utils, "counters", None)
    if counters is None:
        return None
    try:
        return int(counters["frames"]["total"]), int(counters["stats"]["unique_graphs"])
    except (KeyError, TypeError, ValueError):
        return None


__all__ = ["DebugMode", "_DebugCall", "_OpCall", "_TritonKernelCall", "get_op_name", "dtype_abbrs", "mode_module",
           "utils_module", "upstream_get_active_debug_mode", "upstream_export", "UPSTREAM_EXPORTS"]


def synchronize_current_stream(device: torch.device) -> None:
    """Waits for the work queued on ``device``'s current stream
    (torch.cuda / torch.<accelerator> current_stream(device).synchronize();
    2.11, 2.13)."""
    mod = getattr(torch, device.type, None)
    stream = getattr(mod, "current_stream", None) if mod is not None else None
    if stream is not None:
        stream(device).synchronize()
    elif hasattr(torch, "accelerator"):
        torch.accelerator.synchronize(device)


# ---------------------------------------------------------------- kernel provenance (Note [Kernel provenance])

def provenance_tracing_modules() -> list:
    """The modules whose name set_kernel_post_grad_provenance_tracing Inductor
    calls (2.11, 2.13; on 2.11 checked in the installed source: the same
    signature (node_schedule, kernel_name, is_extern=False), the same
    imports): torch._inductor.debug defines it; ir.py and
    scheduler.py import it from there inside the function (so they see a
    replacement), codegen/triton.py and codegen/cpp.py import it at module
    level (their own binding must be replaced too)."""
    import importlib

    out = []
    for name in ("torch._inductor.debug", "torch._inductor.codegen.triton", "torch._inductor.codegen.cpp"):
        try:
            mod = importlib.import_module(name)
        except ImportError:  # pragma: no cover - e.g. a build without the Triton codegen
            continue
        if hasattr(mod, "set_kernel_post_grad_provenance_tracing"):
            out.append(mod)
    return out


def graph_lowering() -> type:
    """torch._inductor.graph.GraphLowering (2.11, 2.13): codegen() emits one
    graph's kernels and returns (wrapper code, kernel code), each a
    ValueWithLineMap whose .value is the source; .module is the post-grad
    GraphModule; is_backward / is_inference say which graph it is;
    .name_to_buffer maps buffer names to IR buffers (their origin_node;
    2.13, not checked on 2.11: provenance.py reads it with getattr);
    compile_to_module() calls codegen() and then sets .cache_key, the
    generated module's PyCodeCache key that CompiledFxGraph.cache_key
    repeats (2.13; read with getattr)."""
    from torch._inductor.graph import GraphLowering

    return GraphLowering


def current_compile_id():
    """torch._guards.CompileContext.current_compile_id() (2.11, 2.13), e.g. 0/0, or None."""
    from torch._guards import CompileContext

    return CompileContext.current_compile_id()


def compile_cache_switches() -> list:
    """(config module, key) of the caches that skip lowering on a hit:
    torch._inductor.config.fx_graph_cache and
    torch._functorch.config.enable_autograd_cache (2.11, 2.13); each config
    module has .patch(key, value), a context manager."""
    import torch._functorch.config
    import torch._inductor.config

    return [(torch._inductor.config, "fx_graph_cache"), (torch._functorch.config, "enable_autograd_cache")]


def inductor_cache_dir() -> str:
    """torch._inductor.runtime.cache_dir_utils.cache_dir() (2.13; not checked
    on 2.11, where provenance.py's caller treats any failure as "no
    provenance file"): Inductor's on-disk cache directory
    (TORCHINDUCTOR_CACHE_DIR)."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    return cache_dir()


def inductor_lowerings() -> dict:
    """torch._inductor.lowering.lowerings (2.11, 2.13): aten op overload (and
    packet) -> the function that lowers it to Inductor IR."""
    import torch._inductor.lowering

    return torch._inductor.lowering.lowerings


def empty_device_cache() -> None:
    """Gives cached, unused device memory back (torch.cuda.empty_cache where
    CUDA is available; 2.11, 2.13)."""
    import gc

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# ---------------------------------------------------------------- torch.distributed
# Note [Collective records] (kdebug/collectives.py) and Note [Ranks]
# (kdebug/ranks.py): what kdebug reads of torch.distributed.  Checked on torch
# 2.13 (CPU, gloo): eager collectives dispatch c10d::<op> with the process
# group, the reduce op and the Work as TorchScript objects (ScriptObject);
# Work.unbox / ProcessGroup.unbox give their Python faces.  Compiled graphs
# call _c10d_functional::<op> and _c10d_functional::wait_tensor.


def _dist():
    try:
        import torch.distributed as dist
    except ImportError:  # pragma: no cover - torch built without distributed
        return None
    return dist if dist.is_available() else None


def dist_rank_world() -> tuple[int, int] | None:
    """(rank, world size) of the initialized default group, or None (2.11, 2.13)."""
    dist = _dist()
    if dist is None or not dist.is_initialized():
        return None
    return dist.get_rank(), dist.get_world_size()


def dist_groups() -> list[dict]:
    """Every process group this process knows: [{"name", "ranks", "backend"}]
    (2.13: distributed_c10d._world.pg_names / pg_group_ranks)."""
    dist = _dist()
    if dist is None or not dist.is_initialized():
        return []
    c = dist.distributed_c10d
    out = []
    try:
        for pg, name in list(c._world.pg_names.items()):
            ranks = sorted(c._world.pg_group_ranks.get(pg, {}))
            try:
                backend = str(dist.get_backend(pg))
            except Exception:  # a group this rank is not in
                backend = "?"
            out.append({"name": str(name), "ranks": ranks, "backend": backend})
    except AttributeError:  # another torch: no layout, never an error
        return []
    return sorted(out, key=lambda g: g["name"])


def unbox_work(obj):
    """The Python Work of a c10d op's Work ScriptObject (2.13: Work.unbox), or None."""
    try:
        return torch._C._distributed_c10d.Work.unbox(obj)
    except Exception:
        return None


def group_of(obj) -> tuple[str, list[int]]:
    """(group name, global ranks) of a c10d op's process group argument: a
    ProcessGroup ScriptObject (eager ops) or a group name (functional ops)."""
    dist = _dist()
    if dist is None:
        return "?", []
    c = dist.distributed_c10d
    try:
        if isinstance(obj, str):
            pg = c._resolve_process_group(obj)
        elif isinstance(obj, torch.ScriptObject):
            pg = torch._C._distributed_c10d.ProcessGroup.unbox(obj)
        else:
            pg = obj
        return str(pg.group_name), list(dist.get_process_group_ranks(pg))
    except Exception:
        return (obj if isinstance(obj, str) else "?"), []


def reduce_op_name(obj) -> str:
    """'SUM', 'AVG', ... of a c10d ReduceOp ScriptObject or a functional op's string."""
    if isinstance(obj, str):
        return obj.upper()
    try:
        op = torch._C._distributed_c10d.ReduceOp.unbox(obj)
        return str(op.op).rsplit(".", 1)[-1]
    except Exception:
        return "?"


# ---------------------------------------------------------------- bring-up (issue 21)
# Note [Constraint backend] (kdebug/backends/constrained.py) and Note
# [Compile inspector] (kdebug/inspect_compile.py) use these.


def unset_fake_mode():
    """torch._subclasses.fake_tensor.unset_fake_temporarily() (2.11, 2.13):
    a context manager in which tensors are real even inside a compile."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    return unset_fake_temporarily()


def size_hint(s) -> int:
    """An int, or a SymInt's example value (SymInt.node.hint; 2.11, 2.13)."""
    if isinstance(s, int):
        return s
    hint = getattr(getattr(s, "node", None), "hint", None)
    if hint is None:
        raise ValueError(f"the symbolic size {s} has no example value")
    return int(hint)


def is_non_overlapping_and_dense(t) -> bool:
    """Whether t's elements fill its memory with no gap and no overlap, in
    some order of its dimensions.  torch._prims_common.is_non_overlapping_and_dense
    where torch has it; 2.13 has only is_non_overlapping_and_dense_or_false
    (checked on 2.13), which answers False where a symbolic stride leaves the
    answer open: such a tensor raises ValueError here instead, so that the
    caller says "not checked" rather than calling it a violation.  (The old
    name alone raised AttributeError on 2.13, taken for a symbolic stride:
    layout="dense" checked nothing.)"""
    pc = torch._prims_common
    fn = getattr(pc, "is_non_overlapping_and_dense", None)
    if fn is not None:
        return fn(t)
    if not all(type(x) is int for x in (*t.shape, *t.stride())):
        raise ValueError("symbolic sizes or strides")
    return pc.is_non_overlapping_and_dense_or_false(t)


def inductor_compile_fx():
    """(compile_fx, compile_fx_inner) of torch._inductor.compile_fx (2.11,
    2.13): compile_fx(gm, example_inputs, inner_compile=...) runs
    AOTAutograd and calls inner_compile(gm, example_inputs, **kw) once per
    forward / backward / inference graph with kw['is_backward'] or
    kw['is_inference'] set (after Inductor's decompositions and graph
    passes); compile_fx_inner lowers one such graph."""
    from torch._inductor.compile_fx import compile_fx, compile_fx_inner

    return compile_fx, compile_fx_inner


def aot_autograd_backend(fw_compiler, bw_compiler, inference_compiler):
    """torch._dynamo.backends.common.aot_autograd (2.11, 2.13), the
    documented way to write a backend that sees the forward and backward
    graphs; compilers return boxed callables (make_boxed_func)."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.aot_autograd import make_boxed_func

    def box(fn):
        return lambda gm, ex: make_boxed_func(fn(gm, ex))

    return aot_autograd(fw_compiler=box(fw_compiler), bw_compiler=box(bw_compiler),
                        inference_compiler=box(inference_compiler))


def structured_trace_logger():
    """torch._logging._internal.trace_log, the "torch.__trace" logger
    (2.11, 2.13): trace_structured() emits a record to it only while it
    has a handler; each record carries .metadata (a dict: the event name
    -> its metadata, plus frame_id / frame_compile_id / attempt) and
    .payload (a string or None)."""
    from torch._logging._internal import trace_log

    return trace_log


def backend_failure_inner(exc: BaseException):
    """The exception a backend raised, from dynamo's BackendCompilerFailed
    (.inner_exception; 2.11, 2.13), or None."""
    return getattr(exc, "inner_exception", None)


def autograd_cache_disabled():
    """torch._functorch.config.patch(enable_autograd_cache=False) (2.11,
    2.13): AOTAutograd compiles (and calls its compilers) even when its
    cache holds the result."""
    import torch._functorch.config

    return torch._functorch.config.patch(enable_autograd_cache=False)


# ---------------------------------------------------------------- artifacts (Note [Compile artifacts])

def inductor_ir_loggers() -> list:
    """[(name, logger)] of Inductor's scheduler-IR artifact loggers
    torch._inductor.debug.ir_pre_fusion_log / ir_post_fusion_log (2.13;
    2.11's debug.py defines the same two loggers, not run here): each
    emits one INFO record per graph lowered ("BEFORE FUSION" / "AFTER
    FUSION" and the scheduler nodes) while it is enabled for INFO; both
    have propagate=False, so enabling them prints nothing elsewhere."""
    import torch._inductor.debug as debug

    out = []
    for name in ("ir_pre_fusion", "ir_post_fusion"):
        lg = getattr(debug, f"{name}_log", None)
        if lg is not None:
            out.append((name, lg))
    return out


def lowering_stage() -> str | None:
    """Which AOTAutograd graph Inductor is lowering now: 'forward',
    'backward' or 'inference', from torch._inductor.virtualized.V.graph
    (a GraphLowering: is_backward / is_inference; 2.13), or None when no
    graph is being lowered."""
    try:
        from torch._inductor.virtualized import V

        g = V.graph
        if getattr(g, "is_backward", False):
            return "backward"
        return "inference" if getattr(g, "is_inference", False) else "forward"
    except Exception:  # no graph set (V's NullHandler raises), or a torch without these names
        return None


def fx_minifier():
    """torch._functorch.fx_minifier.minifier (2.11, 2.13): minifier(fail_f,
    inps, module_fails, dump_state) shrinks a GraphModule run on real inputs
    (truncating suffixes, delta debugging: nodes become inputs holding their
    concrete values) while module_fails(gm, inps) stays True; it returns
    (gm, inps) and prints its progress to stderr.  Only these four
    positional parameters are used: 2.13 adds keyword-only ones (save_dir,
    offload_to_disk, skip_offload, skip_sanity, max_granularity)."""
    from torch._functorch.fx_minifier import minifier

    return minifier
