"""Test-only fault injection: perturb what one kernel writes, in one run.

    with kdebug.testing.perturb_kernel_output("cpp_fused_add", "out_ptr0", occurrence=0):
        compiled_fn(x)       # that launch's out_ptr0 gets its first element changed

``value=`` is the amount added (default 1).  A hunt across fresh processes
needs runs that differ: give each process its own amount (``kdebug.zoo``
draws it from ``os.urandom``).

The perturbation happens inside the launch (between the kernel and kdebug's
post-launch hashes), exactly as a non-deterministic kernel would behave; no
dispatch mode sees it.  C++ kernels are wrapped in their module's globals;
Triton kernels of the Python wrapper (Inductor's CachingAutotuner) through
their launcher, which kdebug's launch hook calls before it hashes the
outputs (Note [Triton faults]).
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import threading

import torch

from . import _C, _upstream, replay


def _scopes():
    return [m.__dict__ for m in _upstream.generated_modules()]


def _bump(t: torch.Tensor, value) -> None:
    with _upstream.disable_torch_dispatch(), torch.no_grad():
        e = t.as_strided((1,), (1,), t.storage_offset())
        if e.dtype == torch.bool:
            e.logical_not_()
        else:
            e.add_(value)


@contextlib.contextmanager
def perturb_kernel_output(name: str, arg: str | None, occurrence: int = 0, value: float = 1, *,
                          cpp_wrapper: bool = False):
    """Within the block, the ``occurrence``-th launch (counting from 0) of the
    C++ kernels and Python-wrapper Triton kernels whose names contain ``name``
    gets argument ``arg`` (None: the kernel's first written argument)
    perturbed after it ran: ``value`` is added to its first element (a bool
    element is flipped instead).  Yields a dict whose "hits" says how many launches were
    perturbed (1 when the launch happened).  ``cpp_wrapper=True``: the
    kernels (C++ or Triton) of C++-wrapper / AOTInductor code compiled under
    kdebug instead, perturbed from kdebug's launch hook while recording."""
    fault = _Fault(occurrence, value)
    swapped, lacking = [], []
    autotuner = _upstream.caching_autotuner() if not cpp_wrapper else None
    seen: set[int] = set()  # a kernel under two names, or in two scopes, is perturbed once
    for scope in (() if cpp_wrapper else _scopes()):
        for key, obj in list(scope.items()):
            if id(obj) in seen:
                continue
            if autotuner is not None and isinstance(obj, autotuner) and name in key:
                seen.add(id(obj))
                pos = _triton_position(obj, arg, lacking)
                if pos is not None:
                    swapped.append(_perturb_triton(obj, pos, fault))
                continue
            if not isinstance(obj, _C.CppKernel) or name not in obj.info.name:
                continue
            seen.add(id(obj))
            names = list(obj.info.arg_names)
            pos = _written_position(names, list(obj.info.roles), arg)
            if pos is None:  # a kernel of another generated module whose name also matches
                lacking.append(f"{obj.info.name} (it has {names})")
                continue
            inner = obj.__wrapped__
            # the fault is part of the kernel: under kdebug hunt --confirm it
            # goes inside the replay, which then overwrites what it wrote
            replaying = getattr(inner, "_kd_replay", False)
            if replaying:
                inner = inner._kd_inner

            def perturbing(*args, _inner=inner, _pos=pos):
                r = _inner(*args)
                fault.launched(args[_pos])
                return r

            scope[key] = _C.CppKernel(replay.wrap(perturbing, obj.info.name) if replaying else perturbing, obj.info)
            swapped.append(functools.partial(scope.__setitem__, key, obj))
    if cpp_wrapper:
        # Note [C++ wrapper launches]: the launches of C++-wrapper / AOTI code
        # (compiled under kdebug) are perturbed from kdebug's launch hook
        def hook(kernel, tensors):
            if name in kernel and arg in tensors:
                fault.launched(tensors[arg])

        _C._cpp_launch_fault_hook(hook)
        try:
            yield fault.state
        finally:
            _C._cpp_launch_fault_hook(None)
        return
    if not swapped and lacking:
        raise ValueError(f"no loaded kernel whose name contains {name!r} has "
                         + ("a written argument" if arg is None else f"an argument {arg!r}") + ": "
                         + "; ".join(lacking[:4]))
    if not swapped:
        raise ValueError(f"no loaded C++ or Triton kernel's name contains {name!r}: compile and run the function "
                         "first (a Triton kernel must have been launched once)")
    try:
        yield fault.state
    finally:
        for restore in swapped:
            restore()


class _Fault:
    """One perturb_kernel_output block's count of the matching launches,
    whichever path runs them (a C++ kernel's wrapper, a Triton launcher, the
    C++-wrapper launch hook): the ``occurrence``-th gets the fault.
    ``state`` is the dict the block yields."""

    def __init__(self, occurrence: int, value):
        self.occurrence, self.value = occurrence, value
        self.state = {"calls": 0, "hits": 0}

    def launched(self, written: torch.Tensor) -> None:
        """After a matching launch that wrote ``written``."""
        st = self.state
        if st["calls"] == self.occurrence:
            _bump(written, self.value)
            st["hits"] += 1
        st["calls"] += 1


def _written_position(names: list, roles: list, arg: str | None) -> int | None:
    """Position of ``arg`` among a kernel's arguments, or of its first
    written argument when ``arg`` is None; None when there is no such one."""
    if arg is None:
        return next((i for i, r in enumerate(roles) if r & _C.ROLE_WRITE), None)
    return names.index(arg) if arg in names else None


def _triton_position(obj, arg: str | None, lacking: list) -> int | None:
    from .inductor import triton_kernel_info

    info = triton_kernel_info(obj)
    pos = _written_position(list(info.arg_names), list(info.roles), arg)
    if pos is None:
        lacking.append(f"{info.name} (it has {list(info.arg_names)})")
    elif not getattr(obj, "launchers", None) or len(obj.launchers) != 1:
        lacking.append(f"{info.name} (not launched yet: run the function once first)")
        return None
    return pos


class _PerturbingLauncher:
    """Note [Triton faults]: stands for a CachingAutotuner's launcher (and
    its cached fast launcher, torch >= 2.12).  kdebug's launch hook wraps
    CachingAutotuner.run, which calls the launcher: the fault is added on
    the launch's stream after the kernel and before kdebug's post-launch
    hashes are taken or queued, as a kernel that wrote another value would.
    Every other attribute (config, cache_hash, __globals__ for the runner
    hook, ...) is the launcher's own, except ``_is_static``: torch 2.13's
    run() would otherwise rebuild the launcher from its code into a fast
    launcher that bypasses this one."""

    _is_static = False

    def __init__(self, inner, pos: int, fault: "_Fault"):
        self._kd_inner, self._kd_pos, self._kd_fault = inner, pos, fault

    def __call__(self, *args, **kwargs):
        r = self._kd_inner(*args, **kwargs)
        self._kd_fault.launched(args[self._kd_pos])
        return r

    def __getattr__(self, key):
        return getattr(self._kd_inner, key)


def _perturb_triton(obj, pos: int, fault: "_Fault"):
    """Swaps the autotuner's launcher(s) for perturbing ones; returns what
    puts them back."""
    launchers, cached = obj.launchers, obj.__dict__.get("_cached_launcher")
    obj.launchers = [_PerturbingLauncher(launchers[0], pos, fault)]
    if cached is not None:
        obj._cached_launcher = _PerturbingLauncher(cached, pos, fault)

    def restore():
        obj.launchers = launchers
        if "_cached_launcher" in obj.__dict__:
            obj._cached_launcher = cached

    return restore


@contextlib.contextmanager
def launch_while_hashing(hash_fn, other, times: int = 1):
    """Plants a thread interleaving inside kdebug's launch path.

    Yields ``(fn, state)``: use ``fn`` as the ``hash_fn`` of
    ``DebugMode.log_tensor_hashes``.  The first ``times`` calls of ``fn`` on
    the thread that entered this block each run ``other()`` to completion on a
    second thread while this thread waits inside the hash (its own launch is
    then half recorded); every other call just returns ``hash_fn(t)``.  With
    ``record_all_threads=True``, ``other`` launching kernels is exactly the
    interleaving a hash_fn that releases the GIL allows, made certain instead
    of left to the scheduler.  ``state["planted"]`` counts the runs of
    ``other``; an exception it raised is raised again when the block exits.
    """
    import threading

    host = threading.get_ident()
    state = {"planted": 0, "calls": 0}
    go, done = threading.Event(), threading.Event()
    failure: list[BaseException] = []
    stop = [False]

    def partner():
        while True:
            go.wait()
            go.clear()
            if stop[0]:
                return
            try:
                other()
            except BaseException as e:  # re-raised on the host thread
                failure.append(e)
            state["planted"] += 1
            done.set()

    th = threading.Thread(target=partner, name="kdebug-interleave", daemon=True)
    th.start()

    def fn(t):
        if threading.get_ident() == host and state["calls"] < times:
            state["calls"] += 1
            done.clear()
            go.set()
            done.wait()  # releases the GIL with this thread's launch in flight
        return hash_fn(t)

    try:
        yield fn, state
    finally:
        stop[0] = True
        go.set()
        th.join()
    if failure:
        raise failure[0]


@contextlib.contextmanager
def collect_before_replay():
    """Within the block, every replay of a CUDA graph that kdebug saw
    captured reads the GPU hash results back (one synchronization) after
    the replay's own results were reserved and before the graph is queued:
    what a collect on another thread does when it lands in that gap (Note
    [Results in flight] in csrc/core/kd_inflight.h), planted."""
    from . import cudagraphs

    prev = cudagraphs._collect_in_gap
    cudagraphs._collect_in_gap = True
    try:
        yield
    finally:
        cudagraphs._collect_in_gap = prev


@contextlib.contextmanager
def wrong_lowering(op, scale: float | None = None, nan_above: float | None = None):
    """Within the block, Inductor lowers aten ``op`` (e.g. torch.ops.aten.tanh.default)
    wrongly: its result times ``scale``, and/or NaN wherever the result exceeds
    ``nan_above``.  Kernels compiled inside the block compute it so; eager and
    every reference run of the graph compute it right.  A planted culprit for
    the accuracy check (Note [Accuracy check]); compile inside the block, with
    the FX graph cache off (kdebug.accuracy.check turns it off)."""
    if scale is None and nan_above is None:
        raise ValueError("wrong_lowering needs scale= and/or nan_above=")
    lowerings = _upstream.inductor_lowerings()
    aten = torch.ops.aten
    if op not in lowerings:
        raise ValueError(f"Inductor has no lowering for {op} (it may be decomposed before lowering)")
    right = lowerings[op]
    keys = [k for k, v in lowerings.items() if v is right]

    def wrong(*args, **kwargs):
        out = right(*args, **kwargs)
        if scale is not None:
            out = lowerings[aten.mul.Tensor](out, scale)
        if nan_above is not None:
            above = lowerings[aten.gt.Scalar](out, nan_above)
            out = lowerings[aten.where.self](above, lowerings[aten.mul.Tensor](out, float("nan")), out)
        return out

    for k in keys:
        lowerings[k] = wrong
    try:
        yield
    finally:
        for k in keys:
            lowerings[k] = right


@contextlib.contextmanager
def perturb_collective_output(op: str, value: float = 1.0):
    """Within the block, every collective named ``op`` (``"c10d::allreduce_"``,
    ``"_c10d_functional::all_reduce"``) recorded by a kdebug DebugMode in this
    process gets ``value`` added to the first element of its output when it
    completes, before its output hash is taken: a fault inside the
    collective, as a faulty transport would make it (Note [Collective
    records]).  Use it in one rank only.  An eager collective is perturbed
    when it was issued inside the block (its completion may come after the
    block); the perturbation lands when the backend runs its future's
    callbacks, which for a program that waits on the future only (DDP's
    reducer) may be after the program read the output: the recorded hash
    shows it (unless the program wrote the output before the callback ran:
    then it keeps no hash, Note [Outputs written before their hash]), the
    program's later values may not."""
    from . import collectives

    if not isinstance(op, str) or "::" not in op:
        raise ValueError(f"perturb_collective_output: op is a name such as 'c10d::allreduce_', not {op!r}")
    prev = collectives._perturb.get(op)
    collectives._perturb[op] = value
    try:
        yield
    finally:
        if prev is None:
            collectives._perturb.pop(op, None)
        else:
            collectives._perturb[op] = prev


@contextlib.contextmanager
def hold_collective_callbacks():
    """Within the block, the completion callback of every eager collective
    a kdebug DebugMode records (Note [Collective records]) waits, before it
    hashes the output, until ``release()`` (the yielded function) is called
    or the block is left (at most 60 s): a callback the backend's thread runs
    late, as it does when the program holds the GIL (Note [Outputs written
    before their hash]).  A program that waits on the Work itself waits for
    the release too (gloo runs the callbacks before it marks the work done):
    release before waiting."""
    from . import collectives

    ev = threading.Event()
    collectives._hold.append(ev)
    try:
        yield ev.set
    finally:
        collectives._hold.remove(ev)
        ev.set()


@contextlib.contextmanager
def perturb_extern_output(name: str, occurrence: int = 0, value: float = 1):
    """Within the block, the ``occurrence``-th call (from 0) of Inductor's
    extern kernel ``name`` (``extern_kernels.addmm``, ``.mm``, ``.convolution``
    ...: what generated code calls for aten ops it does not lower) computes
    from its first tensor argument with ``value`` added to its first element:
    an extern op whose output differs, as a nondeterministic cuBLAS / cuDNN
    call's would.  The perturbed copy is made where kdebug records nothing
    (as compile-time work), so the recorded op list is unchanged.  Yields a
    dict whose "hits" says how many calls were perturbed."""
    extern_kernels = _upstream.extern_kernels()
    orig = getattr(extern_kernels, name, None)
    if orig is None:
        raise ValueError(f"Inductor has no extern kernel {name!r}")
    state = {"calls": 0, "hits": 0}

    def perturbing(*args, **kwargs):
        if state["calls"] == occurrence and args and isinstance(args[0], torch.Tensor):
            _C._set_compiling(True)  # kdebug's own work: not recorded
            try:
                first = args[0].clone()
                _bump(first, value)
            finally:
                _C._set_compiling(False)
            args = (first,) + tuple(args[1:])
            state["hits"] += 1
        state["calls"] += 1
        return orig(*args, **kwargs)

    setattr(extern_kernels, name, perturbing)
    try:
        yield state
    finally:
        setattr(extern_kernels, name, orig)


@dataclasses.dataclass(frozen=True)
class GuardedWrite:
    """One write the C++ write guard saw before an op ran (Note [C++ write
    guard] in csrc/kd_write_guard.c): the op, the device (torch's DeviceType
    number and index), the stream it would run on, the bytes [lo, hi) it may
    write; ``unbounded`` when the guard could not tell what the op writes (it
    flushes everything queued then)."""
    op: str
    device_type: int
    device_index: int
    stream: int
    lo: int
    hi: int
    unbounded: bool


@contextlib.contextmanager
def write_guard_probe():
    """Within the block, kdebug's C++ write guard looks at every dispatcher op
    on every thread (CPU ones too, whether or not GPU work is queued) and logs
    the byte ranges it would guard.  Yields a list, filled with GuardedWrite
    records when the block ends; ops kdebug's log had no room for are counted
    in ``lost`` of the dict ``write_guard_probe.last``."""
    seen: list[GuardedWrite] = []
    _C._write_guard_log()  # nothing from before
    prev = _C._write_guard_probe(True)
    try:
        yield seen
    finally:
        if not prev:
            _C._write_guard_probe(False)
        log = _C._write_guard_log()
        write_guard_probe.last = {"lost": log["lost"]}
        seen.extend(GuardedWrite(**w) for w in log["writes"])


@contextlib.contextmanager
def two_call_records():
    """Within the block, records that kdebug makes in one pass (Note [Records
    made in one pass] in csrc/kd_launch.c: replica state records, extern ops
    recorded after they ran, ``Recorder.record``) are made by the launch
    path's two calls instead, as before that pass existed; tests compare the
    two paths' records."""
    prev = _C._one_pass_records(False)
    try:
        yield
    finally:
        _C._one_pass_records(prev)
