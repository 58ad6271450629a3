"""Where kdebug plugs into Inductor (see Note [Where kdebug hooks Inductor] in
csrc/kd_hook.c).  ``install()`` is idempotent and runs when the first kdebug
DebugMode is entered; with no DebugMode active every hook costs one C call.

Python code here runs once per kernel (describing it) or once per generated
module (wrapping its C++ kernels), never once per launch.
"""
from __future__ import annotations

import ast
import contextlib
import functools
import re
import threading
import warnings
from typing import Any

import torch

from . import _C, _active, _upstream, cpp_launch, cudagraphs, replay
from ._boundary import TritonLaunch

_lock = threading.Lock()
_installed = False
_stash: dict[int, tuple[Any, list[str], str]] = {}  # cpp_pybinding result -> (obj, argtypes, source)
_STASH_LIMIT = 100_000

# c10::DeviceType numbers of the device types Inductor generates kernels for
_DEVICE_TYPES = {"cpu": 0, "cuda": 1, "hip": 6, "xpu": 12, "mps": 13, "mtia": 19}


class KdebugWarning(UserWarning):
    """A recording problem the user must know about: launches that were not
    recorded, dropped records, errors inside the hook."""


# ---------------------------------------------------------------- fresh buffers

_ALLOCATORS = ("empty_strided", "empty_strided_cpu", "empty_strided_cuda", "empty_strided_xpu",
               "empty_strided_mtia", "empty_strided_cpu_pinned", "alloc_from_pool", "empty_strided_p2p")


def _call_name(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def fresh_args(source: str) -> dict[str, frozenset[int]]:
    """Note [Fresh buffers]: for each kernel called in a generated module's
    call(), the positions of arguments whose buffer was freshly allocated and
    not used by anything before that call.  Their bytes before the launch are
    uninitialized memory: the kernel only writes them (Inductor still names
    such a buffer in_out_ptr when it reuses it in place), so they are never
    hashed before the launch.  A kernel called from several places keeps the
    positions that are fresh at all of them."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return {}
    return _fresh_args_of(tree)


def _fresh_args_of(tree: ast.AST) -> dict[str, frozenset[int]]:
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "call"]
    if not calls:
        return {}
    fresh: set[str] = set()
    alias: dict[str, str] = {}
    out: dict[str, frozenset[int]] = {}

    def base(node) -> str | None:
        if isinstance(node, ast.Name):
            return alias.get(node.id, node.id)
        if isinstance(node, ast.Call) and _call_name(node.func) == "reinterpret_tensor" and node.args:
            return base(node.args[0])
        return None

    def used(call: ast.Call) -> None:
        for a in [*call.args, *(k.value for k in call.keywords)]:
            b = base(a)
            if b is not None:
                fresh.discard(b)

    def visit(stmts) -> None:
        for st in stmts:
            if isinstance(st, ast.Assign) and len(st.targets) == 1 and isinstance(st.targets[0], ast.Name):
                t, v = st.targets[0].id, st.value
                if isinstance(v, ast.Call) and _call_name(v.func) in _ALLOCATORS:
                    alias.pop(t, None)
                    fresh.add(t)
                    continue
                b = base(v)
                if b is not None:  # `bufA = bufB` / reinterpret_tensor(bufB, ...): the same memory
                    alias[t] = b
                    continue
            if isinstance(st, ast.Expr) and isinstance(st.value, ast.Call):
                c = st.value
                f = c.func
                kernel = None
                if isinstance(f, ast.Name):
                    kernel = f.id
                elif isinstance(f, ast.Attribute) and f.attr == "run" and isinstance(f.value, ast.Name):
                    kernel = f.value.id
                if kernel is not None:
                    pos = frozenset(i for i, a in enumerate(c.args) if base(a) in fresh)
                    out[kernel] = out[kernel] & pos if kernel in out else pos
                used(c)
                continue
            for node in ast.walk(st):
                if isinstance(node, ast.Call):
                    used(node)
            for field in ("body", "orelse", "finalbody"):
                if isinstance(getattr(st, field, None), list) and not isinstance(st, ast.FunctionDef):
                    visit(getattr(st, field))

    for fn in calls:
        fresh.clear()
        alias.clear()
        visit(fn.body)
    return out


def _module_fresh_args(scope: dict) -> dict[str, frozenset[int]]:
    path = scope.get("__file__")
    if not path:
        return {}
    try:
        with open(path) as f:
            return fresh_args(f.read())
    except OSError:
        return {}


# ---------------------------------------------------------------- Triton


def _role(name: str, mutated: frozenset[str]) -> int:
    write = name.startswith(("out_ptr", "in_out_ptr")) or name in mutated
    if name.startswith("out_ptr") and name not in mutated:
        return 2  # fresh output buffer: written, never read
    read = not name.startswith("out_ptr") or name.startswith("in_out_ptr")
    return (1 if read else 0) | (2 if write else 0)


def triton_roles(names: list[str], mutated: frozenset[str], fresh=()) -> list[int]:
    """KD_ROLE_* of a Triton kernel's arguments (_role), a fresh buffer
    (Note [Fresh buffers]: positions in ``fresh``) written only; the Python
    wrapper's autotuners and the C++ wrapper's calls (Note [C++ wrapper
    launches])."""
    roles = [_role(n, mutated) for n in names]
    for i in fresh:
        if i < len(roles) and roles[i] & 2:
            roles[i] = 2
    return roles


def triton_call_params(triton_meta: dict, constexprs: frozenset[str] = frozenset()) -> list[tuple[str, str]]:
    """(name, signature type) of the arguments a call of an Inductor Triton
    kernel passes, in order: the signature's non-constexpr parameters and the
    ones specialized to a constant (triton_meta["constants"]: xnumel = 1 of a
    one-row reduction is passed, then compiled in; a user kernel's argument
    given as None is passed as -1); not the config's meta-parameters
    (XBLOCK, ...) nor any parameter the kernel declares ``tl.constexpr``
    (``constexprs``, from jit_constexprs: a user-defined kernel's constexpr
    argument is in the constants, and not passed).  CachingAutotuner.run()
    gets these, and so does the C++ wrapper's call (H100, torch 2.11; torch
    2.13's ir.UserDefinedTritonKernel.codegen for the constexprs)."""
    signature = triton_meta.get("signature") or {}
    constants = triton_meta.get("constants") or {}
    return [(n, t) for n, t in signature.items()
            if n not in constexprs and (t != "constexpr" or n in constants)]


def jit_constexprs(fn) -> frozenset[str]:
    """The names of the parameters a Triton JITFunction declares
    ``tl.constexpr`` (through the Autotuner / Heuristics wrappers around
    it); empty when fn is none of these."""
    for _ in range(8):
        params = getattr(fn, "params", None)
        if params is not None:
            try:
                return frozenset(p.name for p in params if getattr(p, "is_constexpr", False))
            except (TypeError, AttributeError):
                return frozenset()
        fn = getattr(fn, "fn", None)
        if fn is None:
            break
    return frozenset()


def triton_kernel_info(autotuner) -> _C.KernelInfo:
    """Describes a CachingAutotuner: name, argument names in call order, roles."""
    meta = getattr(autotuner, "inductor_meta", None) or {}
    name = meta.get("kernel_name") or autotuner.fn.__name__
    constexprs = jit_constexprs(getattr(autotuner, "fn", None)) | frozenset(meta.get("declared_constexpr_names") or ())
    names = [n for n, _ in triton_call_params(autotuner.triton_meta, constexprs)]
    mutated = frozenset(getattr(autotuner, "mutated_arg_names", ()) or ())
    roles = triton_roles(names, mutated, getattr(autotuner, "_kdebug_fresh", ()))  # Note [Fresh buffers]
    dev_type = getattr(getattr(autotuner, "device_props", None), "type", "cuda")
    dev_index = autotuner.triton_meta.get("device", 0)
    if not isinstance(dev_index, int):
        dev_index = getattr(dev_index, "index", 0) or 0
    # Inductor appends launcher-only arguments to a user kernel's call (extra_launcher_args: the grid
    # it computed, torch >= 2.7); run() takes them, the kernel does not: they are not recorded
    extra = len(meta.get("extra_launcher_args") or ())
    return _C.KernelInfo(_C.KIND_TRITON, name, names, roles,
                         _DEVICE_TYPES.get(dev_type, 1), dev_index, extra)


def _wrap_runner(launcher, cfg_id: int, warps: int, stages: int, shared: int) -> bool:
    scope = getattr(launcher, "__globals__", None)
    if not isinstance(scope, dict) or "runner" not in scope:
        return False
    runner = scope["runner"]
    if not isinstance(runner, _C.RunnerHook):
        scope["runner"] = _C.RunnerHook(runner, cfg_id, warps, stages, shared)
    return True


def triton_finish(autotuner, args: tuple) -> TritonLaunch | None:
    """After a recorded launch whose grid the runner hook did not see (the
    launcher's first recorded call): wrap the launcher's runner so later
    launches report their grid from C, and compute this launch's grid."""
    launchers = getattr(autotuner, "launchers", None) or []
    if len(launchers) != 1:
        return None
    launcher = launchers[0]
    cfg = launcher.config
    cfg_id = _C.intern(", ".join(f"{k}={v}" for k, v in cfg.kwargs.items()))
    warps = int(getattr(cfg, "num_warps", 0) or 0)
    stages = int(getattr(cfg, "num_stages", 0) or 0)
    shared = int(getattr(launcher, "shared", 0) or 0)
    for target in (launcher, getattr(autotuner, "_cached_launcher", None)):
        if target is not None:
            _wrap_runner(target, cfg_id, warps, stages, shared)
    _, grid = autotuner._interpret_args_grid(args, cfg)
    g = [int(x) for x in grid]
    return TritonLaunch(grid_x=g[0], grid_y=g[1], grid_z=g[2], config_id=cfg_id, num_warps=warps,
                        num_stages=stages, shared_mem=shared)


# ---------------------------------------------------------------- C++

_KERNEL_SIG = re.compile(r'extern\s+"C"\s+void\s+kernel\s*\(([^)]*)\)', re.S)


def _param_names(source: str, n: int) -> list[str]:
    m = _KERNEL_SIG.search(source)
    if m is None:
        return [f"arg{i}" for i in range(n)]
    params = [p.strip() for p in m.group(1).split(",") if p.strip()]
    names = [re.findall(r"[A-Za-z_]\w*", p)[-1] for p in params]
    return names if len(names) == n else [f"arg{i}" for i in range(n)]


def cpp_kernel_info(name: str, argtypes: list[str], source: str,
                    fresh: frozenset[int] = frozenset()) -> _C.KernelInfo:
    """Roles from the pybinding's argument types: ``const T*`` is read, ``T*``
    written (and read too for in_out_ptr / in_ptr, unless the buffer is
    fresh, Note [Fresh buffers], or written before it is read, Note [Written
    before read]), scalars read."""
    names = _param_names(source, len(argtypes))
    first = written_first(source)
    fresh = fresh | frozenset(i for i, n in enumerate(names) if n in first)
    return _C.KernelInfo(_C.KIND_CPP, name, names, cpp_roles(names, argtypes, fresh), 0, -1)


# Note [Written before read]
# Inductor's C++ kernels name a buffer in_out_ptrM when nodes of the kernel
# update it in place, and emit `auto out_ptrN = in_out_ptrM;` /
# `auto in_ptrK = in_out_ptrM;` for the names it had as a plain output / input
# before (KernelArgs.aliases(), torch/_inductor/codegen/common.py, 2.11-2.13).
# An in_out_ptr aliased to an output and to no input holds a buffer that this
# kernel first produces (a layer norm's variance, then its rsqrt in place):
# its bytes before the launch are never read.  They are whatever the memory
# held - a dead buffer reused, or uninitialized memory where the call site
# allocated it fresh (Note [Fresh buffers] keeps only positions fresh at every
# call site of a kernel) - so hashing them as an input made false roots "from
# outside the recording" (seen on CPU in a 2-rank hunt of a compiled
# transformer: a layer-norm kernel called at three sites, fresh at one, its
# input hash of garbage values 1e38 vs 2e14).  Such an argument is written
# only.  Triton kernels emit no such lines and keep their roles; so do the
# C++ wrapper's kernels (kdebug/cpp_launch.py).
_ALIAS = re.compile(r"\bauto\s+(in_ptr|out_ptr)\d+\s*=\s*(in_out_ptr\d+)\s*;")


def written_first(source: str) -> frozenset[str]:
    """The in_out_ptr parameters of a C++ kernel's source that it writes
    before it reads them (Note [Written before read])."""
    outs, ins = set(), set()
    for kind, inout in _ALIAS.findall(source or ""):
        (outs if kind == "out_ptr" else ins).add(inout)
    return frozenset(outs - ins)


def cpp_roles(names: list[str], argtypes: list[str], fresh: frozenset[int] = frozenset()) -> list[int]:
    """KD_ROLE_* of a C++ kernel's arguments from their C types (the Python
    wrapper's pybinding and the C++ wrapper's calls: Note [C++ wrapper
    launches])."""
    roles = []
    for i, (n, t) in enumerate(zip(names, argtypes)):
        t = t.strip()
        if "*" in t and not t.startswith("const"):
            reads = n.startswith(("in_out_ptr", "in_ptr")) and i not in fresh
            roles.append(2 | (1 if reads else 0))
        else:
            roles.append(1)
    return roles


def _wrap_cpp(scope: dict, key: str, argtypes: list[str], source: str,
              fresh: dict[str, frozenset[int]]) -> None:
    fn = scope.get(key)
    if fn is None or isinstance(fn, _C.CppKernel) or not callable(fn):
        return
    scope[key] = _C.CppKernel(fn, cpp_kernel_info(key, argtypes, source, fresh.get(key, frozenset())))


def _mark_fresh_triton(scope: dict, fresh: dict[str, frozenset[int]]) -> None:
    CachingAutotuner = _upstream.caching_autotuner()
    for key, positions in fresh.items():
        obj = scope.get(key)
        if isinstance(obj, CachingAutotuner) and positions:
            obj._kdebug_fresh = positions


def _patched_cpp_pybinding(orig):
    def cpp_pybinding(self, argtypes, source_code):
        result = orig(self, argtypes, source_code)
        if len(_stash) < _STASH_LIMIT:
            _stash[id(result)] = (result, list(argtypes), source_code)
        return result

    cpp_pybinding.__wrapped__ = orig
    return cpp_pybinding


def _patched_wait(orig):
    def wait(self, scope):
        pending = {}
        for key, value in list(scope.items()):
            entry = _stash.get(id(value))
            if entry is not None and entry[0] is value:
                pending[key] = _stash.pop(id(value))
        result = orig(self, scope)
        fresh = _module_fresh_args(scope)
        for key, (_, argtypes, source) in pending.items():
            _wrap_cpp(scope, key, argtypes, source, fresh)
        _mark_fresh_triton(scope, fresh)
        replay.attach(scope)
        return result

    wait.__wrapped__ = orig
    return wait


def _wrap_loaded_modules() -> None:
    """Wraps the C++ kernels of generated modules loaded before kdebug was."""
    for mod in _upstream.generated_modules():
        path = getattr(mod, "__file__", None)
        if not path:
            continue
        try:
            with open(path) as f:
                text = f.read()
            tree = ast.parse(text)
        except (OSError, SyntaxError, ValueError):
            continue
        fresh = _fresh_args_of(tree)
        _mark_fresh_triton(mod.__dict__, fresh)
        for node in tree.body:
            if not (isinstance(node, ast.Assign) and len(node.targets) == 1
                    and isinstance(node.targets[0], ast.Name) and isinstance(node.value, ast.Call)):
                continue
            call = node.value
            if not (isinstance(call.func, ast.Attribute) and call.func.attr == "cpp_pybinding"
                    and len(call.args) == 2):
                continue
            try:
                argtypes = ast.literal_eval(call.args[0])
                source = ast.literal_eval(call.args[1])
            except ValueError:
                continue
            _wrap_cpp(mod.__dict__, node.targets[0].id, list(argtypes), source, fresh)
        replay.attach(mod.__dict__)


# ---------------------------------------------------------------- bypass paths

def graph_bypass_reason(graph, hooked_ok: bool = True) -> str | None:
    """Why a compiled graph's launches are not recorded, or None.  A C++
    wrapper module lowered under this kdebug's recording reports its
    launches (Note [C++ wrapper launches]) unless hooked_ok is False (its
    kernels are still not callable from Python: the accuracy check)."""
    fx_kwargs = getattr(graph, "fx_kwargs", None) or {}
    hooked = hooked_ok and cpp_launch.graph_hooked(graph)
    if fx_kwargs.get("aot_mode") and not hooked:
        return "AOTInductor"
    if fx_kwargs.get("cpp_wrapper") and not hooked:
        return "cpp_wrapper"
    cudagraphs = fx_kwargs.get("cudagraphs")
    if cudagraphs is not None and bool(getattr(cudagraphs, "value", cudagraphs)):
        return "CUDA-graph replay"
    return None


# Note [Accuracy check] (kdebug/accuracy.py): the check running, if any; it
# sees every compiled graph's call, before (inputs) and after.
_graph_observer = None


@contextlib.contextmanager
def observing_graph_calls(observer):
    """Calls observer.before(graph, inputs) / observer.after(graph, token)
    around every compiled graph's call until the block ends (one at a time)."""
    global _graph_observer
    if _graph_observer is not None:
        raise RuntimeError("kdebug: an accuracy check is already running in this process; "
                           "checks cannot nest")
    _graph_observer = observer
    try:
        yield observer
    finally:
        _graph_observer = None


def _observed_call(orig, graph, inputs):
    observer = _graph_observer
    token = observer.before(graph, inputs)
    out = orig(graph, inputs)
    observer.after(graph, token)
    return out


def _patched_graph_call(orig):
    def __call__(self, inputs):
        # records_here: autograd's device thread runs a compiled backward on CUDA with the
        # recorder torch carried to it, which the Python-side state (thread-local) does not know of
        if _active.records_here():
            reason = graph_bypass_reason(self)
            graphed = reason == "CUDA-graph replay" and cudagraphs.supported()
            if graphed:
                # its replays are recorded (Note [CUDA graph replays]); nothing
                # is deferred during the call: cudagraph trees check that no
                # tensor of their pool outlives a call untracked
                reason = None
                _C.defer_flush()
                prev_defer = _C._set_defer(False)
            if reason is not None:
                mode = _active.recording_here()  # on autograd's device thread: the carried one
                if mode is not None:
                    mode._note_bypass(reason)
                _C.defer_flush()  # its launches are unseen writers (Note [Deferred GPU work])
            # Note [C++ op observer]: the ops this call issues are its extern calls
            _C._graph_call(True)
            try:
                if _graph_observer is not None:
                    return _observed_call(orig, self, inputs)
                return orig(self, inputs)
            finally:
                _C._graph_call(False)
                if graphed:
                    _C._set_defer(prev_defer)
        if _graph_observer is not None:
            return _observed_call(orig, self, inputs)
        return orig(self, inputs)

    __call__.__wrapped__ = orig
    return __call__


# Note [One caller per hooked AOTI model]
# AOTInductor's boxed_run holds the GIL while it waits for a free model of its
# container (a model runs one call at a time; num_runners of them).  Without
# kdebug a running model never needs the GIL, so that wait ends.  A hooked
# model's kernel launches take the GIL (Note [C++ wrapper launches]) and,
# while recording, run Python code (a new tensor object, a hash function, the
# garbage collector), during which the interpreter can hand the GIL to a
# thread that then calls the same model and waits for it holding the GIL:
# the running model never gets the GIL back (found by an adversarial test:
# six threads, one package, record_all_threads=True, hung every time).  So a
# call of a hooked model first takes a lock of its loader, in Python, where
# waiting releases the GIL: one caller at a time enters boxed_run.  Unhooked
# models never need the GIL and are not serialized.
_aoti_locks: dict[int, threading.RLock] = {}


def _aoti_lock(model) -> threading.RLock:
    key = id(getattr(model, "loader", model))
    lock = _aoti_locks.get(key)
    if lock is None:
        lock = _aoti_locks.setdefault(key, threading.RLock())  # atomic under the GIL
    return lock


def _patched_aoti_call(orig):
    def __call__(self, *args, **kwargs):
        mode = _active.recording_here()  # autograd's device thread too (an AOTI model called in a backward)
        hooked = cpp_launch.aoti_hooked(self)
        if mode is not None and not hooked:
            mode._note_bypass("AOTInductor")
            _C.defer_flush()
        if not hooked:
            return orig(self, *args, **kwargs)
        with _aoti_lock(self):  # Note [One caller per hooked AOTI model]
            return orig(self, *args, **kwargs)

    __call__.__wrapped__ = orig
    return __call__


def _autotuning(orig):
    """Note [Autotuning is not the program]: the autotuner's first call of a
    kernel with several configs benchmarks them at run time, and before each
    benchmark it may copy mutated arguments to pinned CPU memory and back
    (CachingAutotuner.bench, outside upstream's benchmarking flag).  Those aten
    ops and launches happen only in a run whose autotuning was not cached, so
    recording them makes two runs of the same program look structurally
    different (seen on the H100: empty_strided / as_strided / copy_ in the
    first hunt run only).  The whole autotuning counts as compiling: nothing
    in it is recorded (its launches count as suppressed)."""
    @functools.wraps(orig)
    def autotuning(self, *args, **kwargs):
        _C._set_compiling(True)
        try:
            return orig(self, *args, **kwargs)
        finally:
            _C._set_compiling(False)

    return autotuning


def _on_compile_start(args) -> None:
    if _upstream.is_cudagraph_recording(args):
        return  # the capture runs the program's launches (Note [CUDA graph replays])
    _C._set_compiling(True)


def _on_compile_end(args) -> None:
    if _upstream.is_cudagraph_recording(args):
        return
    _C._set_compiling(False)


# ---------------------------------------------------------------- install


def install() -> None:
    """Installs every hook (once per process)."""
    global _installed
    if _installed:
        return
    with _lock:
        if _installed:
            return
        from . import mode as _mode

        _C._set_dtype_names(dict(_upstream.dtype_abbrs))
        _C._configure(
            benchmark_globals=vars(_upstream.utils_module),
            count_globals=vars(_upstream.mode_module),
            get_active_debug_mode=_upstream.upstream_get_active_debug_mode,
            mode_class=_mode.DebugMode,
        )
        # Note [Active mode]: upstream's get_active_debug_mode and kdebug's are one function
        _upstream.install_get_active_debug_mode(_active.debug_mode)
        AC = _upstream.async_compile_class()
        AC.cpp_pybinding = _patched_cpp_pybinding(AC.cpp_pybinding)
        AC.wait = _patched_wait(AC.wait)

        th = _upstream.triton_heuristics_module()
        th.get_active_debug_mode = _C._inductor_get_active_debug_mode
        th.CachingAutotuner.run = _C.RunHook(th.CachingAutotuner.run, triton_kernel_info, triton_finish)
        for name in ("autotune_to_one_config", "coordinate_descent_tuning"):
            if hasattr(th.CachingAutotuner, name):
                setattr(th.CachingAutotuner, name, _autotuning(getattr(th.CachingAutotuner, name)))

        CompiledFxGraph = _upstream.compiled_fx_graph()
        CompiledFxGraph.__call__ = _patched_graph_call(CompiledFxGraph.__call__)
        AOTICompiledModel = _upstream.aoti_compiled_model()
        if AOTICompiledModel is not None:
            AOTICompiledModel.__call__ = _patched_aoti_call(AOTICompiledModel.__call__)

        cpp_launch.install()  # Note [C++ wrapper launches]

        _upstream.register_lasting_compile_callbacks(_on_compile_start, _on_compile_end)

        _wrap_loaded_modules()
        cudagraphs.install()  # Note [CUDA graph replays]
        from . import provenance

        provenance.install()  # Note [Kernel provenance]
        _installed = True


@functools.lru_cache(maxsize=None)
def _cuda_available() -> bool:
    return torch.cuda.is_available()


def config_bypass_warnings() -> list[str]:
    """Global Inductor settings that make launches skip Python."""
    cfg = _upstream.inductor_config()
    out = []
    if getattr(cfg, "cpp_wrapper", False):
        out.append("torch._inductor.config.cpp_wrapper=True: graphs compiled during this recording report "
                   "their launches through kdebug's C++ launch hook, but C++-wrapper modules compiled "
                   "before it are not recorded; call torch._dynamo.reset() before recording to recompile "
                   "them (Note [C++ wrapper launches])")
    # supported() first: where kdebug records graph replays (a CUDA build) the
    # setting is not read at all (a config read costs 1.5 us, at every enter)
    if _cuda_available() and not cudagraphs.supported() and getattr(cfg.triton, "cudagraphs", False):
        out.append("torch._inductor.config.triton.cudagraphs=True: launches replayed from CUDA graphs "
                   "are not recorded; set it to False (or compile with mode='default') while recording")
    return out


def warn(msg: str, stacklevel: int = 3) -> None:
    warnings.warn(f"kdebug: {msg}", KdebugWarning, stacklevel=stacklevel)
