"""kdebug: a kernel-level debugger for torch.compile.

``kdebug.DebugMode`` is a drop-in for ``torch.utils._debug_mode.DebugMode``
whose C launch hook records every kernel Inductor's generated code launches
(Triton on GPUs, C++ on CPUs) into a ring buffer::

    from kdebug import DebugMode, _TritonKernelCall
    with DebugMode(record_triton_kernels=True) as debug_mode:
        out = compiled_fn(x, y)
    print(debug_mode.debug_string())
"""
import sys
import types

__version__ = "0.1.0"

# Note [Lazy package]: importing kdebug imports nothing else; each name below
# is imported (torch first: it loads libtorch before the extension that links
# to it) the first time it is used.  So the CLI's --help and argument errors
# answer without importing torch (~1.5 s).
_EXPORTS = {
    "DebugMode": "mode", "get_active_debug_mode": "mode", "KdebugWarning": "inductor",
    "Report": "compare", "assert_deterministic": "compare", "compare": "compare",
    "Run": "trace", "TraceFileError": "trace", "load": "trace",
    "FlightRecorder": "flight",
    "RankedRun": "ranks", "compare_ranks": "crossrank", "replicated": "crossrank",
    "compare_eager": "accuracy", "AccuracyReport": "accuracy",
    "inspect_compile": "inspect_compile", "CompileReport": "inspect_compile",
    "capture_artifacts": "artifacts",
    "minify": "minify", "MinifyResult": "minify",
    "TensorInfo": "calls", "_CppKernelCall": "calls", "_KernelCall": "calls", "_TritonKernelCall": "calls",
}
# upstream torch.utils._debug_mode's call types and helpers, as the installed
# torch has them (kdebug/_upstream.py, UPSTREAM_EXPORTS): `from kdebug import
# _OpCall` works as it does from upstream's module
_UPSTREAM = ("_DebugCall", "_OpCall", "_AnnotateCall", "_RedistributeCall", "_OutputPlacementCall",
             "_NNModuleCall", "_get_call_name", "_stringify_shape", "DebugInterpreter",
             "TensorIdTracker", "hash_tensor_fn", "norm_hash_fn")
_EXPORTS.update(dict.fromkeys(_UPSTREAM, "_upstream"))


def __getattr__(name: str):
    import importlib
    import importlib.util

    mod = _EXPORTS.get(name)
    if mod is None and (name.startswith("__") or importlib.util.find_spec(f"{__name__}.{name}") is None):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import torch  # noqa: F401

    upstream = importlib.import_module(f"{__name__}._upstream")  # (not `from .`: that asks this function)
    # a first use inside the program's own dispatch mode (upstream's DebugMode around
    # kdebug.DebugMode.log_tensor_hashes()): kdebug's import-time probes are no ops of its
    with upstream.disable_torch_dispatch():
        value = importlib.import_module(f"{__name__}.{mod or name}")
    if mod == "_upstream":
        value = value.upstream_export(name)
    elif mod is not None:
        value = getattr(value, name)
    globals()[name] = value
    return value


class _Package(types.ModuleType):
    """The package's module type: importing the submodule kdebug.compare must
    not replace the function kdebug.compare (the import system sets a
    package attribute per submodule; the eager import used to bind the
    function over it afterwards)."""

    def __setattr__(self, name: str, value) -> None:
        if name in _EXPORTS and isinstance(value, types.ModuleType):
            return  # resolved by __getattr__ to the exported object instead
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


def __dir__() -> list[str]:
    names = set(globals()) | set(_EXPORTS)
    up = sys.modules.get(f"{__name__}._upstream")
    if up is not None:  # upstream names this torch lacks (known once torch is loaded)
        names -= {n for n in _UPSTREAM if not any(hasattr(m, n) for m in (up._dm, up.mode_module, up.utils_module))}
    return sorted(names)


__all__ = [
    "AccuracyReport",
    "DebugMode",
    "KdebugWarning",
    "Report",
    "RankedRun",
    "Run",
    "TraceFileError",
    "TensorInfo",
    "_CppKernelCall",
    "_KernelCall",
    "_TritonKernelCall",
    "assert_deterministic",
    "capture_artifacts",
    "compare",
    "compare_eager",
    "compare_ranks",
    "CompileReport",
    "inspect_compile",
    "get_active_debug_mode",
    "load",
    "minify",
    "MinifyResult",
    "replicated",
]
