"""kdebug.DebugMode: upstream torch.utils._debug_mode.DebugMode plus a C launch
recorder that sees every kernel Inductor's generated code launches."""
from __future__ import annotations

import contextlib
import inspect
import os
import threading
import weakref
from typing import Any

import torch

from . import _C, _active, _argtext, _aten_hooks, _flags, _upstream, collectives, cudagraphs, hashing, inductor, program_reads, values
from ._boundary import HashHook, OpInfo
from .calls import _VERBOSE, RECORDED_ATTRIBUTES, _AtenOpCall, _CppKernelCall, _KernelCall, make_call

_UPSTREAM_PARAMS = {n: p for n, p in inspect.signature(_upstream.DebugMode.__init__).parameters.items()
                    if n != "self"}
_UPSTREAM_FLAGS = list(_UPSTREAM_PARAMS)
_UPSTREAM_FLAG_SET = frozenset(_UPSTREAM_FLAGS)
_UPSTREAM_DEFAULTS = {n: p.default for n, p in _UPSTREAM_PARAMS.items()}
_u = _upstream.utils_module

# Note [Hash hooks per spec]
# A built-in hash_fn's fast-path entry (a HashHook) and aten-op hooks are a
# function of its spec id and hash_inputs alone: hashing.parse gives one spec
# per id, made once and never changed, and the hooks only read it.  So they
# are made once per (spec id, hash_inputs) and shared by every
# log_tensor_hashes() that asks for them (a loop entering one per step made
# them every step); a frame only reads its entry and hooks.  A callable
# hash_fn gets its own hooks each time.
_hash_hooks: dict[tuple[int, bool], tuple[HashHook, tuple]] = {}


def _builtin_hash_hooks(spec_id: int, spec, inputs: bool) -> tuple[HashHook, tuple]:
    """(fast-path entry, aten-op hooks) of a built-in hash spec (Note [Hash hooks per spec])."""
    made = _hash_hooks.get((spec_id, inputs))
    if made is None or made[0].spec is not spec:
        made = (HashHook(spec=spec, hash_inputs=inputs, spec_id=spec_id, kinds=spec.kinds, value_fn=spec.value),
                _aten_hooks.hash_hooks(spec.aten_fn(), inputs))
        _hash_hooks[(spec_id, inputs)] = made
    return made


class _SettingsContext:
    """A log_tensor_hashes() / record_outputs() context: ``push()`` enters it
    on this thread (Note [Aten-op hash settings per thread],
    kdebug/_aten_hooks.py).  Left on another thread it raises and stays
    entered, so it can still be left right."""

    def __init__(self, push, after_exit=None) -> None:
        self._push = push
        self._after_exit = after_exit  # called once the context is left (record_outputs(to=...))
        self._frame: _aten_hooks.Frame | None = None

    def __enter__(self) -> None:
        if self._frame is not None:
            raise RuntimeError("this log_tensor_hashes() / record_outputs() context is already entered")
        if not _configured:  # its hooks read ops' facts through the dispatch path (upstream's own DebugMode)
            _configure()
        _upstream.install_hook_runners(_aten_hooks.run_pre_log_hooks, _aten_hooks.run_hooks)
        self._frame = self._push()

    def __exit__(self, *exc) -> None:
        frame = self._frame
        if frame is None:
            raise RuntimeError("a log_tensor_hashes() / record_outputs() context was exited without "
                               "being entered (or twice)")
        if frame.thread == threading.get_ident():
            self._frame = None
        try:
            _aten_hooks.pop(frame, hashing.remove_custom)
        finally:
            _C.defer_flush()
            if self._after_exit is not None and self._frame is None:
                self._after_exit()


# namespaces whose schemas declare every argument an op writes (as in csrc/kd_torch.cpp's trusted_namespace)
_DECLARING = ("aten::", "prim::", "prims::", "_c10d_functional::")


def _op_info(func) -> OpInfo:
    """What the aten-op fast path needs to know of an op, once per op
    (kd_dispatch.c caches it)."""
    name = _upstream.get_op_name(func)
    text = str(func)
    empty = "empty" in text
    # profiler contexts and annotations: always through upstream's own code
    special = name.startswith("profiler::_record_function") or name.startswith("debug_mode_ops::")
    # Note [Collective records]: c10d ops are recorded by kdebug/collectives.py
    special = special or collectives.is_collective(func)
    pos: tuple | None = ()
    names: tuple | None = ()
    outs: tuple = ()
    try:
        arguments = func._schema.arguments
    except AttributeError:  # no schema: it may write anything
        arguments = pos = names = None
    else:
        pos = tuple(i for i, a in enumerate(arguments)
                    if a.alias_info is not None and a.alias_info.is_write and not a.kwarg_only)
        names = tuple(a.name for a in arguments if a.alias_info is not None and a.alias_info.is_write)
        outs = tuple(a.name for a in arguments if a.is_out)
    declared = pos is None or bool(pos) or bool(names)  # what the schema says, or no schema
    try:  # a view op (as_strided, view, slice, ...): its output aliases an argument, nothing written
        returns = func._schema.returns
        view = not declared and bool(returns) and all(
            r.alias_info is not None and not r.alias_info.is_write for r in returns)
    except AttributeError:
        view = False
    if not declared and not name.startswith(_DECLARING) and any("Tensor" in str(a.type) for a in arguments):
        # Note [C++ write guard]: outside the namespaces whose schemas declare every
        # mutation, an op that takes tensors may write them undeclared: c10d::allreduce_
        # (DDP's bucket, written in place by NCCL after kdebug queued hashes of the views
        # the reducer filled), custom ops.  Unknown writes: queued GPU work goes first (a
        # view by its schema stays one for Note [Fresh buffers]).
        pos = names = None
    writes = pos is None or bool(pos) or bool(names)
    # OpOverload.__call__ is `self._op(*args, **kwargs)`: call _op, one Python frame less
    op = func._op if type(func) is _upstream.OpOverload and hasattr(func, "_op") else func
    nb = next(((i, a.kwarg_only) for i, a in enumerate(arguments) if a.name == "non_blocking"), None) \
        if arguments is not None else None
    if nb is not None:
        op = _settling(op, None if nb[1] else nb[0])
    return OpInfo(special=special,
                  hash_skipped=empty or "profiler" in text,  # upstream's hash hooks skip these
                  makes_empty=empty,  # its output holds whatever memory it got (Note [Fresh buffers])
                  writes=writes, written_pos=pos, written_names=names, out_names=outs, callable=op, view=view)


def _settling(op, position: int | None):
    """Note [Non-blocking copies to the host]: an op with a ``non_blocking``
    argument (copy_, _to_copy) that copies a device tensor into host memory
    returns before the copy has landed, and the fast path hashes its output
    right after it returns.  Called in the op's place: when the copy was
    non-blocking, wrote a CPU tensor and read a device tensor, the source
    device's current stream (the one the copy was queued on) is synchronized
    first, so the hash is of the bytes the copy wrote.  One synchronization
    per such copy, only for these copies; blocking copies and copies to the
    device are untouched."""
    def call(*args, **kwargs):
        r = op(*args, **kwargs)
        nb = kwargs.get("non_blocking", args[position] if position is not None and len(args) > position else False)
        if nb is True and isinstance(r, torch.Tensor) and r.device.type == "cpu":
            src = next((a for a in args if isinstance(a, torch.Tensor) and a.device.type != "cpu"), None)
            if src is not None:
                _upstream.synchronize_current_stream(src.device)
        return r

    return call


def _stream_tick(mode) -> None:
    st = mode._stream
    if not st.closed and st.due():
        st.write_new()


def _tree_hash_py(obj, spec):
    """Hashes of the tensor leaves of a tree the C walker does not know."""
    tree_all, tree_map = _upstream.tree_all, _upstream.tree_map
    t = tree_map(lambda x: hashing.start_value(x, spec) if isinstance(x, torch.Tensor) else None, obj)
    return None if tree_all(lambda x: x is None, t) else t


def _tree_clone_py(obj):
    return _upstream.tree_map(lambda x: x.clone() if isinstance(x, torch.Tensor) else x, obj)


def _spec_value(r, spec_id):
    return hashing.spec(spec_id).value(r)


_configured = False


def _configure() -> None:
    """Hands the C formatter and the aten-op fast path what they call."""
    global _configured
    # leaves rendered with str() / repr(), as upstream does (int and bool: by the C code itself);
    # others go to _argtext.leaf_text (Note [Stable argument text])
    _C._configure_fmt(torch.Tensor, torch.nn.Parameter, tuple(_argtext.PLAIN), _argtext.leaf_text)
    # A fresh _OpCall's attributes: the fast path sets them without running the
    # constructor, unless one is mutable (then sharing it would be wrong).
    probe = _upstream._OpCall(None, (), {}, 0)
    for attr in ("args", "kwargs"):
        if hasattr(probe, attr):
            delattr(probe, attr)
    template: dict | None = dict(vars(probe))
    if not all(v is None or isinstance(v, (bool, int, float, str, tuple)) for v in template.values()):
        template = None
    _upstream.install_hook_runners(_aten_hooks.run_pre_log_hooks, _aten_hooks.run_hooks)
    _C._configure_dispatch(_op_info, _aten_hooks.through_upstream, _stream_tick, _tree_hash_py,
                           _tree_clone_py, _aten_hooks._local, _u, _upstream._OpCall, template,
                           _upstream.dispatch_stack_depth)
    # Note [Fast aten-op recording]: __torch_dispatch__ as a C method, which
    # does itself what torch's dynamo-disable wrapper around a Python one does
    get_cb, set_cb = _upstream.eval_frame_callbacks()
    if get_cb is not None and set_cb is not None:
        DebugMode.__torch_dispatch__ = _C._dispatch_method(DebugMode, get_cb, set_cb)
    _configured = True


_dispatch = _C.dispatch


def _undo_failed_enter(undo: list, exc: BaseException) -> None:
    """Note [Transactional enter]: undoes the steps of a failed __enter__,
    last first, as the ExitStack the steps used to register with did: every
    undo runs, and one that raises replaces the failure (chained to it)."""
    with contextlib.ExitStack() as stack:
        for fn, *args in undo:
            stack.callback(fn, *args)
        raise exc


def _compile_skipping_modes() -> list[str]:
    """Class names of dispatch modes on this thread's stack that make dynamo
    skip compiled frames (not infra modes, ignore_compile_internals False)."""
    if not _upstream.dispatch_stack_depth():  # no mode on the stack (at every enter: the usual case)
        return []
    out = []
    for m in _upstream.dispatch_modes():
        try:
            if m.is_infra_mode() or m.ignore_compile_internals():
                continue
        except AttributeError:  # a mode class without these (older torch)
            continue
        out.append(type(m).__name__)
    return out


class _OperatorList(list):
    """``debug_mode.operators``: a list that upstream appends aten-op records to,
    into which kernel records are merged (in launch order) when it is read.

    Appending does not merge, so recording stays cheap; every way of reading
    the list merges first."""

    __slots__ = ("_mode",)

    def __init__(self, mode, items=()):
        super().__init__(items)
        self._mode = weakref.ref(mode)

    def _sync(self):
        mode = self._mode()
        if mode is not None:
            mode._flush()


def _syncing(name):
    base = getattr(list, name)

    def method(self, *args, **kwargs):
        self._sync()
        return base(self, *args, **kwargs)

    method.__name__ = name
    method.__doc__ = base.__doc__
    return method


for _name in ("__iter__", "__getitem__", "__len__", "__contains__", "__reversed__", "__repr__",
              "__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__", "__add__", "__mul__",
              "__rmul__", "__iadd__", "__imul__", "__setitem__", "__delitem__", "index", "count",
              "copy", "pop", "remove", "insert", "extend", "sort", "reverse", "clear"):
    setattr(_OperatorList, _name, _syncing(_name))
del _name


class DebugMode(_upstream.DebugMode):
    """``torch.utils._debug_mode.DebugMode`` with kernel-level recording.

    Accepts every flag of upstream's constructor, and:

    record_triton_kernels: record every kernel launched by Inductor-generated code
        (Triton on GPUs, C++ on CPUs) into a C ring buffer.  Default True, as
        upstream records Triton kernels whenever a DebugMode is active.
    kernels_only: record kernel launches only, without pushing a
        TorchDispatchMode (aten ops are then not intercepted at all: the
        cheapest way to record).
    record_all_threads: also record launches from threads that have not
        entered a DebugMode themselves (dispatch modes are per thread, so aten
        ops are still recorded only on this thread).
    ring_capacity: ring size in 128-byte slots (a launch takes one slot plus
        one per argument).  Memory is touched only as it fills.
    overflow: 'overwrite' keeps the newest launches when the ring is full,
        'drop_new' keeps the oldest.  Either way the number of lost launches
        is counted, reported in ``kernel_stats`` and warned about.
    batch_gpu_work: queue GPU hashes and output copies and launch them in
        batches, each before anything could overwrite its tensors (Note
        [Deferred GPU work] in csrc/kd_defer.h).  Only where every writer is
        seen: aten ops by the dispatch mode, or under kernels_only by a C++
        dispatcher guard (Note [C++ write guard] in csrc/kd_write_guard.c);
        off under record_all_threads.  Writers outside the dispatcher (raw
        CUDA from C extensions, Triton kernels launched directly) stay
        unseen: pass False there.  False launches them one tensor at a time,
        right after each kernel.
    trace: a file path: the run is streamed to this trace file while it is
        recorded (whole chunks, at most every second while aten ops run, and
        at exit), so it survives a process that dies; ``kdebug.load`` reads it.
    check_finite: True takes the stats hash of what every kernel and aten op
        writes, for ``first_nonfinite()`` (Note [First non-finite value] in
        kdebug/finite.py); "inputs" also of what they read, before they run.
    """

    def __init__(
        self,
        *,
        record_triton_kernels: bool = True,
        kernels_only: bool = False,
        record_all_threads: bool = False,
        ring_capacity: int = 1 << 20,
        overflow: str = "overwrite",
        batch_gpu_work: bool = True,
        trace: str | None = None,
        record_final_state: bool = False,
        check_finite: bool | str = False,
        record_extern_ops: bool = False,
        op_path: str = "python",
        **upstream_flags: Any,
    ) -> None:
        unknown = sorted(set(upstream_flags) - _UPSTREAM_FLAG_SET) if upstream_flags else None
        if unknown:
            raise TypeError(
                f"DebugMode got unknown flag(s) {', '.join(unknown)}. kdebug accepts upstream "
                f"DebugMode's flags ({', '.join(_UPSTREAM_FLAGS)}) and record_triton_kernels, "
                "kernels_only, record_all_threads, ring_capacity, overflow, batch_gpu_work, trace, "
                "record_final_state, check_finite, record_extern_ops, op_path."
            )
        # Note [Flag validation] (kdebug/_flags.py)
        f = _flags.debug_mode_flags(
            (record_triton_kernels, kernels_only, record_all_threads, ring_capacity, overflow, batch_gpu_work,
             trace, record_final_state, check_finite, record_extern_ops, op_path),
            upstream_flags, _UPSTREAM_DEFAULTS)
        self._recorder = None
        self._stream = None
        self._entered = False
        self._enter_thread = 0
        self._hook_owner: _aten_hooks.ThreadHooks | None = None  # Note [Aten-op hash settings per thread]
        self._shadowing = None
        self._seen_at_enter = 0
        self._nested_hidden = 0  # Note [Nested DebugModes]
        self._unfollowed = 0  # Note [Launches no recording follows]: on other threads, while this one recorded
        self._unfollowed_at: int | None = None
        self._fresh: dict = _C._fresh_storages()  # Note [Fresh buffers] (csrc/kd_fresh.c)
        self._trace_path = f["trace"]
        super().__init__(**upstream_flags)
        _upstream.name_every_dtype()  # a quantized tensor's text (once per process)
        self.record_triton_kernels = f["record_triton_kernels"]
        # Note [C++ op observer] (csrc/kd_op_observer.c): op_path='c++' records every
        # outermost aten op from C++ and pushes no dispatch mode (kernels_only);
        # record_extern_ops the ops a compiled graph's call issues (its extern calls)
        self.op_path = f["op_path"]
        self.record_extern_ops = f["record_extern_ops"]
        self.kernels_only = f["kernels_only"] or self.op_path == "c++"
        self._op_mode = (_C.OPS_ALL if self.op_path == "c++" else _C.OPS_EXTERN if self.record_extern_ops else 0)
        self._op_handle = None
        self.record_all_threads = f["record_all_threads"]
        # aten ops on other threads are not intercepted: their writes would be unseen.
        # Under kernels_only no dispatch mode sees aten ops: the C++ write guard
        # does (Note [C++ write guard] in csrc/kd_write_guard.c), installed by
        # the queue from its first GPU hash on
        self.batch_gpu_work = f["batch_gpu_work"] and not self.record_all_threads
        self._defer_mode = 0 if not self.batch_gpu_work else 2 if self.kernels_only else 1
        self._prev_defer = None
        self._defer_failures = 0
        self.record_final_state = f["record_final_state"]
        self.final_state: dict | None = None  # Note [Final state], taken at exit when asked for
        self._reads_installed = False  # Note [Program reads] (kdebug/program_reads.py)
        # Note [First non-finite value] (kdebug/finite.py): the stats hash of what
        # every step writes ("inputs": and reads), entered with the mode
        self.check_finite = f["check_finite"]
        self._finite_ctx = None
        try:
            self._recorder = _C.Recorder(f["ring_capacity"], f["overflow"],
                                         store_objects=bool(self.store_original_args))
        except MemoryError:
            raise MemoryError(
                f"DebugMode(ring_capacity={f['ring_capacity']}) could not reserve its ring "
                f"({f['ring_capacity'] * _C.SLOT_BYTES} bytes of address space): pass a smaller ring_capacity "
                "(the default, 2**20 slots, is 128 MiB, touched only as it fills)") from None
        self._materialized = 0
        self._flush_lock = threading.RLock()  # Note [One flush at a time]
        self._flush_owner: int | None = None
        self._bypass: dict[str, int] = {}  # reason -> graph calls (a dict: a Counter took 1 us to make)
        self._graphs_at_enter: cudagraphs.Snapshot | None = None
        self._graphs_at_exit: cudagraphs.Snapshot | None = None  # None while recording
        self._warned: set[str] = set()
        self._reported = {"dropped": 0, "errors": 0, "unrecorded": 0, "outputs_skipped": 0,
                          "readonly_changed": 0, "hash_unsupported": 0}
        self._problem_state = b""  # Recorder.problem_state() when last fully looked at (b"": look again)
        self._pending_calls: list = []  # _C.PendingCall: aten calls with hashes still on the GPU
        # Note [Fast aten-op recording]: with these flags every aten-op record
        # is made by the C formatter (kd_fmt.c), text-identical to upstream's;
        # anything else goes through upstream's __torch_dispatch__.
        self._fast = (self.record_realtensor and not self.store_original_args and not self.record_ids
                      and not self.record_tensor_attributes and not self.record_stack_trace
                      and not self.record_torchfunction)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        # Note [Fast aten-op recording] (csrc/kd_dispatch.c): one C call, which
        # hands anything it does not handle to upstream's __torch_dispatch__.
        # _configure() replaces this method by the C one where torch has the
        # eval-frame calls it needs.
        return _dispatch(self, func, types, args, kwargs)

    # -- records made by upstream's Python code (Note [Stable argument text]) --
    def _record_call(self, call) -> None:
        """Upstream's, with arguments whose text is not their value (a
        torch.Generator, an object whose repr holds an address) shown by
        value / type name (kdebug/_argtext.py), as the C formatter shows them,
        and a called object whose name holds an address by a stable name."""
        if isinstance(call, _upstream._OpCall) and not isinstance(call.op, _upstream.OpOverload):
            call.op = _argtext.stable_op(call.op, _upstream.get_op_name(call.op))
        if isinstance(call, _upstream._OpCall) and hasattr(call, "args") and hasattr(call, "kwargs"):
            (args, kwargs), changed = _argtext.stable_tree((call.args, call.kwargs))
            if changed:
                if self.store_original_args:
                    # keep the objects, but fix their text now: the state an op
                    # starts from, not the one at rendering time
                    orig = call.args, call.kwargs
                    call.args, call.kwargs = args, kwargs
                    call.stringify_args(self.record_tensor_attributes, None)
                    call.args, call.kwargs = orig
                else:
                    call.args, call.kwargs = args, kwargs
        super()._record_call(call)

    def _record_call_output(self, call, output) -> None:
        if self.record_output:
            output = _argtext.stable_tree(output)[0]
        super()._record_call_output(call, output)

    def _stringify_output(self, call, output) -> None:
        """The aten-op fast path's fallback for an output the C formatter does
        not know (kd_dispatch.c): upstream's stringify_output, stable texts."""
        call.stringify_output(_argtext.stable_tree(output)[0], self.record_tensor_attributes, None)

    # -- operators: upstream's list, with kernel records merged in on read --
    @property
    def operators(self) -> list:
        return self._ops

    @operators.setter
    def operators(self, value) -> None:
        lock = getattr(self, "_flush_lock", None)  # upstream's __init__ sets the list before ours makes the lock
        if lock is None:
            self._set_operators(value)
            return
        with lock:  # Note [One flush at a time]: never under a flush merging into the old list
            self._set_operators(value)

    def _set_operators(self, value) -> None:
        self._ops = _OperatorList(self, value)
        self._materialized = 0
        if getattr(self, "_recorder", None) is not None:
            # kept kernel records keep their launches (Note [Launch views keep
            # their record], csrc/kd_view.c); new launches go to the new list
            self._recorder.clear()
            # its counters start again from 0: what they count next is new (before,
            # drops up to the number already warned about went unreported)
            self._problem_state = b""
            if hasattr(self, "_reported"):  # the recorder's counters; graph_unknown counts the recording's window
                self._reported = {k: (v if k == "graph_unknown" else 0) for k, v in self._reported.items()}
            self._recorder.set_ops(self._ops)
            items = list.__getitem__(self._ops, slice(None))
            kernels = sum(isinstance(x, _KernelCall) for x in items)
            if kernels:  # kernel records given back: not aten ops (Note [Launch order])
                self._recorder.splice(self._ops, items, kernels)

    # Note [One flush at a time]
    # A flush drains the ring, then merges launches [_materialized, n) into
    # the list.  Between the two it runs code that can let another flush in:
    # the drain may release the GIL (Note [Results in flight]), values.drain
    # and the aten-hash resolution run Python.  Two flushes merging the same
    # range put its records in twice; two merging adjacent ranges out of
    # order put later launches before earlier ones of the same op position.
    # So flushes take turns (a lock), and one started on a thread already
    # inside a flush returns at once: that read sees the list as it was
    # before this flush, and the next read sees the rest.  Setting
    # ``operators`` (a reset) takes the same lock, so it never swaps the list
    # and clears the recorder under a flush merging into the old one.  The
    # lock is reentrant: a signal handler that reads the list on a thread
    # that holds it, before the owner is set or after it is cleared, runs its
    # own whole flush before or after the other instead of deadlocking.
    def _flush(self) -> None:
        """Drains the C ring and merges new kernel records into ``operators``."""
        rec = self._recorder
        if rec is None:
            return
        me = threading.get_ident()
        if self._flush_owner == me:
            return
        with self._flush_lock:
            self._flush_owner = me
            try:
                self._flush_locked(rec)
            finally:
                self._flush_owner = None

    def _flush_locked(self, rec) -> None:
        n = rec.drain()  # collects GPU hashes: one synchronization, only when results are read
        if values._sinks:  # Note [Recorded values on disk]: stream the kept outputs
            values.drain(rec)
        self._resolve_aten_hashes()
        if n > self._materialized:
            new = []
            for i in range(self._materialized, n):
                launch = rec.launch(i)
                new.append((launch.py_index, launch.launch_index, make_call(launch, rec)))
            self._materialized = n
            new.sort(key=lambda t: (t[0], t[1]))
            ops = self._ops
            old = list.__getitem__(ops, slice(None))
            # Note [Launch order]: a launch's py_index is the number of aten ops
            # recorded before it (len(ops) less the kernel records merged in,
            # which splice() sets together with the list).  Counting list
            # entries instead placed a kernel launched on another thread (the
            # autograd device thread) between a drain and its merge too early,
            # so its position changed from run to run.  Where the n-th op sits:
            op_at = [i for i, x in enumerate(old) if not isinstance(x, _KernelCall)]
            merged: list = []
            prev = 0
            for nops, _, call in new:
                pos = op_at[nops] if nops < len(op_at) else len(old)
                if pos > prev:
                    merged.extend(old[prev:pos])
                    prev = pos
                merged.append(call)
            merged.extend(old[prev:])
            rec.splice(ops, merged, len(merged) - len(op_at))
        self._report_problems()

    # Note [Fresh buffers] (csrc/kd_fresh.c): written arguments that still hold
    # the memory an aten::empty* op got get None for input hashes; self._fresh
    # is the table, followed by every op the mode sees.

    def _resolve_aten_hashes(self) -> None:
        if not self._pending_calls:
            return
        tree_map = _upstream.tree_map

        def value(x):
            return x.value() if isinstance(x, hashing.Pending) else x

        for pending in self._pending_calls:
            log = {}
            for key, v in pending.call.log.items():
                v = _C.tree_resolve(v, _spec_value)
                log[key] = tree_map(value, v) if pending.by_pytree else v  # pytree-made trees (rare)
            pending.call.log = log
        self._pending_calls.clear()

    # -- hashes and recorded outputs --
    @staticmethod
    def log_tensor_hashes(hash_fn="norm", hash_inputs: bool = False,
                          check_inputs_unchanged: bool = False):
        """Hash tensors around every kernel launch and aten op, as upstream does.

        hash_fn: "norm" (upstream's float64 L1, deterministic for NaN/inf),
            "hash_tensor" (upstream's XOR hash), "bitwise" (kdebug's 64-bit
            hash of the bytes in logical order), a list of them, or a callable
            (slow path).
        hash_inputs: also hash, before each launch, the arguments the kernel
            reads (call.pre_hashes); after the launch the arguments it writes
            are hashed (call.post_hashes).  Fresh output buffers are never
            hashed before the launch: they hold uninitialized memory.
        check_inputs_unchanged: verify (bitwise) that every argument a kernel
            only reads is unchanged by the launch; a kernel that wrote to one
            is reported (call.readonly_violations, a KdebugWarning).
        """

        def push() -> _aten_hooks.Frame:
            inputs, check = _flags.hash_flags(hash_inputs, check_inputs_unchanged)
            spec_id, spec = hashing.parse(hash_fn)
            prev = _C._set_hash_config(spec.kinds, inputs, check, spec_id)
            if spec.fn is not None:
                hashing.push_custom(spec.fn)
                # a callable hash_fn: upstream's code runs the hooks (no fast-path entry)
                entry, hooks = None, _aten_hooks.hash_hooks(spec.fn, inputs)
            else:
                entry, hooks = _builtin_hash_hooks(spec_id, spec, inputs)
            return _aten_hooks.push("hash", entry, hooks, prev, _C._set_hash_config, spec.fn)

        return _SettingsContext(push)

    @staticmethod
    def record_outputs(max_bytes: int = 4 << 30, *, filter=None, to=None, aten: bool | None = None):
        """Keep clones of what every kernel writes (call.record["output"]) and of
        aten-op outputs (as upstream).  Kernel outputs are cloned on the
        kernel's stream without synchronizing; at most ``max_bytes`` of them are
        kept, the rest are counted and reported instead of running out of memory.

        filter: only these launches keep outputs: a regular expression searched
            in the kernel name, a range of launch indices, or a callable
            (kernel_name, launch_index) -> bool.  Aten ops keep theirs only
            with aten=True (then a pattern or callable is asked about the op
            name, the callable with launch_index None).
        to: a DebugMode recording to a trace, or a directory: the kept outputs
            are streamed to <trace>.values (<dir>/kdebug.values) as they are
            produced and released from memory; ``kdebug.load(trace).values(N)``
            reads launch N's back (Note [Recorded values on disk],
            kdebug/values.py)."""
        if filter is None and to is None and aten is None:
            def push() -> _aten_hooks.Frame:
                budget = _flags.max_bytes(max_bytes)
                prev = _C._set_record_outputs(True, budget)
                return _aten_hooks.push("record", None, _aten_hooks.record_hooks(), prev, _C._set_record_outputs)

            return _SettingsContext(push)

        flt = values.OutputFilter(filter, aten)  # bad filters fail here, before anything is entered
        state: dict = {}

        def push_filtered() -> _aten_hooks.Frame:
            budget = _flags.max_bytes(max_bytes)
            sink = values.Sink(flt, *values.destination(to, DebugMode))
            fid = state["fid"] = values.register(sink)
            try:
                prev = _C._set_record_outputs(True, budget, fid)
            except BaseException:
                values.unregister(fid)
                raise
            hooks = values.record_hooks(flt) if flt.aten else (None, None, None)
            return _aten_hooks.push("record", "filtered", hooks, prev, _C._set_record_outputs)

        def after_exit() -> None:
            for msg in values.unregister(state.pop("fid", 0)):
                inductor.warn(msg, stacklevel=3)

        return _SettingsContext(push_filtered, after_exit)

    # -- entering and leaving --
    def __enter__(self):
        """Pushes the dispatch mode, starts the kernel recorder and opens the
        trace: all of it or, when a step fails (an unwritable trace path),
        none of it (Note [Transactional enter])."""
        if self._entered:
            raise RuntimeError("this kdebug DebugMode is already recording (its recorder is already "
                               "recording); a DebugMode can be entered only once at a time")
        inductor.install()
        if not _configured:
            _configure()
        for msg in inductor.config_bypass_warnings():
            self._warn_once(msg, msg)
        for name in _compile_skipping_modes():
            self._warn_once(
                "skipping-mode:" + name,
                f"the dispatch mode {name} is active and its ignore_compile_internals() is False: "
                "dynamo does not run torch.compile'd frames while it is on the stack (torch may keep "
                "running them eagerly afterwards), so kdebug records their aten ops but no kernels. "
                "Enter DebugMode outside that mode, or give the mode ignore_compile_internals() = True.")
        # Note [Transactional enter]: each step registers its undo; a failing
        # step undoes the ones before it, so a failed __enter__ leaves no
        # dispatch mode pushed and no recorder running.  The undos are kept in
        # a plain list and handed to an ExitStack only when a step fails
        # (_undo_failed_enter): an ExitStack made on every enter cost about
        # 3 us, a tenth of a whole construct / enter / exit.
        undo: list = []
        try:
            if not self.kernels_only:
                super().__enter__()
                undo.append((super().__exit__, None, None, None))
                _active.enter_dispatch()
                undo.append((_active.exit_dispatch,))
            if self.record_triton_kernels:
                outer = _active.recording()  # before this one starts
                self._recorder.start(self, self._ops, self.record_all_threads)
                undo.append((self._recorder.stop,))
                held = list.__getitem__(self._ops, slice(None))  # a DebugMode entered again
                self._recorder.splice(self._ops, held, sum(isinstance(x, _KernelCall) for x in held) if held else 0)
                _active.start_recording(self, self.record_all_threads)
                undo.append((_active.stop_recording, self, self.record_all_threads))
                if self._op_mode:
                    self._op_handle = _C._op_observer(self._recorder, self._op_mode, self.record_all_threads)
                    undo.append((self._remove_op_observer,))
                # Note [Nested DebugModes]: a thread-local recorder takes this
                # thread's launches from the one recording before it
                self._shadowing = outer if outer is not None and not self.record_all_threads else None
                self._seen_at_enter = self._recorder.seen
                self._unfollowed_at = _C.unfollowed_launches()
                if self._graphs_at_enter is None:  # Note [CUDA graph replays]: what this recording saw
                    self._graphs_at_enter = cudagraphs.snapshot()
                self._graphs_at_exit = None
            self._defer_failures = _C.defer_failures()  # Note [Problems at exit]
            prev_defer = _C._set_defer(self._defer_mode)
            undo.append((_C._set_defer, prev_defer))
            if self._trace_path is not None:
                if self._stream is None:
                    from . import ranks
                    from .trace import Stream

                    info = ranks.current()  # Note [Ranks]: a rank of a job writes run.rank{R}.kdt
                    path = self._trace_path if info is None else ranks.rank_path(self._trace_path, info.rank)
                    self.trace_path = path
                    self._stream = Stream(self, path)
                else:
                    self._stream.reopen()  # entered again: append to the same trace
            if self.check_finite:
                ctx = DebugMode.log_tensor_hashes("stats", hash_inputs=self.check_finite == "inputs")
                ctx.__enter__()
                self._finite_ctx = ctx
                undo.append((self._leave_finite,))
            if self.record_final_state and not self.kernels_only:
                # Note [Program reads]: print / tolist / numpy / pickle of a tensor, recorded
                program_reads.install(self)
                undo.append((program_reads.uninstall, self))
                self._reads_installed = True
            self._prev_defer = prev_defer
            self._entered = True
            self._enter_thread = threading.get_ident()
            self._hook_owner = _aten_hooks.this_thread()
        except BaseException as e:
            _undo_failed_enter(undo, e)
            raise
        return self

    def __exit__(self, *exc):
        if not self._entered:
            raise RuntimeError("DebugMode.__exit__ was called without a matching __enter__ (or twice): "
                               "use `with DebugMode() as dm:`, or call __enter__ before __exit__")
        if (self.record_triton_kernels and not self.record_all_threads
                and (threading.get_ident() != self._enter_thread or _active.recording() is not self)):
            # checked before anything is undone: the mode stays whole, and can still be exited right
            raise RuntimeError("a kdebug DebugMode must be exited on the thread that entered it, "
                               "innermost first")
        self._entered = False
        if self._reads_installed:
            self._reads_installed = False
            program_reads.uninstall(self)
        try:
            self._leave_finite()
            if self._prev_defer is not None:
                _C._set_defer(self._prev_defer)  # flushes what this mode deferred
                self._prev_defer = None
            self._remove_op_observer()
            if self.record_triton_kernels:
                _active.stop_recording(self, self.record_all_threads)
                self._recorder.stop()
                missed = self._unfollowed_launches()
                self._unfollowed, self._unfollowed_at = missed, None
                if missed > self._reported.get("other_thread_launches", 0):
                    self._reported["other_thread_launches"] = missed
                    inductor.warn(
                        f"{missed} compiled kernel launch(es) ran on threads this recording does not follow "
                        "(it follows the thread that entered it and the threads torch starts from it): they are "
                        "not recorded, and a comparison cannot see them. DebugMode(record_all_threads=True) "
                        "records every thread (kdebug hunt / record --all-threads)", stacklevel=2)
                if self._graphs_at_enter is not None:  # later replays are not this recording's
                    self._graphs_at_exit = cudagraphs.snapshot()
                self._note_shadowed()
        finally:
            if not self.kernels_only:
                _active.exit_dispatch()
                super().__exit__(*exc)
        if self.record_final_state:
            from . import collectives, final_state

            collectives.settle(self)  # callbacks of completed collectives finish before the heap is walked
            try:
                self.final_state = final_state.snapshot()
            except Exception as e:  # never the program's problem: the verdict stays conservative
                self._warn_once("final-state", f"kdebug could not take the final state ({e!r}): differing "
                                "tensors nothing read count as possibly kept")
        if self._recorder is not None and not self.kernels_only:
            from . import ranks

            if ranks.current() is not None:  # Note [DDP final parameters]
                from . import ddp_final

                try:
                    ddp_final.mark_final_parameters(self)
                except Exception as e:  # never the program's problem
                    self._warn_once("ddp-final", f"kdebug could not record the DDP modules' final parameters "
                                    f"({e!r}); compare them with kdebug.replicated")
        if self._stream is not None:
            self._stream.close()
        self._report_problems()

    def _remove_op_observer(self) -> None:
        handle, self._op_handle = self._op_handle, None
        if handle is not None:
            _C._op_observer_remove(self._recorder, handle)

    def _leave_finite(self) -> None:
        ctx, self._finite_ctx = self._finite_ctx, None
        if ctx is not None:
            ctx.__exit__(None, None, None)

    def first_nonfinite(self):
        """Note [First non-finite value]: the first kernel launch or aten op
        that wrote NaN or inf from finite inputs, as a kdebug.finite.FiniteReport
        (``.first`` is None when there is none).  Needs check_finite (or a
        'stats' hash kind in log_tensor_hashes); reading it synchronizes the
        device once, to collect the stats."""
        from . import finite

        return finite.check(self)

    def _note_shadowed(self) -> None:
        """Note [Nested DebugModes]: launches this mode recorded while it was
        nested in another kdebug DebugMode on the same thread went to this
        mode's recorder only (one recorder per thread takes a launch), so the
        outer one counts them as not recorded: its recording is incomplete,
        and it says so (kernel_stats, complete, debug_string, a warning)."""
        outer, self._shadowing = self._shadowing, None
        if outer is None or outer is self:
            return
        seen = self._recorder.seen
        n = seen - self._seen_at_enter if seen >= self._seen_at_enter else seen  # cleared meanwhile
        if n > 0:
            outer._nested_hidden += n
            outer._warn_once(
                "nested",
                f"{n} kernel launch(es) ran inside a nested kdebug DebugMode and were recorded only "
                "by that inner mode (one recorder takes a launch): this outer recording is "
                "incomplete (said once: kernel_stats['nested_unrecorded'] counts every such launch, of "
                "every inner mode). Read them from the inner mode, or do not nest DebugModes.")

    @staticmethod
    def check_hash_mismatches(logs1: list, logs2: list, compare_inputs: bool = False) -> list[dict]:
        """Upstream's check, which compares aten ops and Triton kernels, extended
        to C++ kernels (call_type 'cpp kernel') and aten ops recorded from C++
        (call_type 'aten op', Note [C++ op observer]), in log order."""
        if len(logs1) != len(logs2):
            raise ValueError(f"Log lengths don't match: {len(logs1)} vs {len(logs2)}")
        out: list[dict] = []
        start = 0
        for i, (a, b) in enumerate(zip(logs1, logs2)):
            if not isinstance(a, (_CppKernelCall, _AtenOpCall)):
                continue
            out += _upstream.DebugMode.check_hash_mismatches(logs1[start:i], logs2[start:i], compare_inputs)
            start = i + 1
            what = "C++ kernel" if isinstance(a, _CppKernelCall) else "aten op"
            if type(b) is not type(a) or a.kernel_name != b.kernel_name:
                raise ValueError(f"Operators don't match at index {i}: {a.kernel_name} vs {getattr(b, 'kernel_name', b)}")
            if a.kwargs_str != b.kwargs_str:
                raise ValueError(f"{what} call args don't match for {a.kernel_name} at index {i}:"
                                 f"\n\nlog1: {a.kwargs_str}\n\nlog2: {b.kwargs_str}")
            for is_input, h1, h2 in ((False, a.post_hashes, b.post_hashes), (True, a.pre_hashes, b.pre_hashes)):
                if is_input and not compare_inputs:
                    continue
                if (h1 is None) != (h2 is None) or (h1 and set(h1) != set(h2)):
                    raise ValueError(f"{what} {'pre' if is_input else 'post'}-hash presence inconsistent "
                                     f"for {a.kernel_name} at index {i}")
                for key in h1 or {}:
                    if h1[key] != h2[key]:
                        out.append({"call_type": "cpp kernel" if what == "C++ kernel" else "aten op", "call": a.kernel_name, "arg_name": key,
                                    "pytree_path": None, "hash1": h1[key], "hash2": h2[key],
                                    "rel_diff": _upstream.compute_rel_diff(h1[key], h2[key]),
                                    "is_input_hash": is_input})
        return out + _upstream.DebugMode.check_hash_mismatches(logs1[start:], logs2[start:], compare_inputs)

    # -- trace files --
    def save(self, path) -> dict:
        """Writes the run to a trace file (docs/trace-format.md); ``kdebug.load``
        reads it back in any process.  Returns the writer's counters."""
        from . import trace

        return trace.save(self, os.fspath(path))

    # -- what went wrong --
    def _warn_once(self, key: str, msg: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            inductor.warn(msg, stacklevel=4)

    def _note_bypass(self, reason: str) -> None:
        self._bypass[reason] = self._bypass.get(reason, 0) + 1
        self._warn_once(
            "bypass:" + reason,
            f"a compiled graph runs through {reason}: its kernel launches do not pass through "
            "Python or kdebug's C++ launch hook and are NOT recorded, so this recording is incomplete. "
            + {
                "CUDA-graph replay": "Compile with mode='default' (not 'reduce-overhead') or set "
                "torch._inductor.config.triton.cudagraphs=False to record every launch.",
                "cpp_wrapper": "It was compiled without kdebug's launch hook (outside a kdebug recording, or by "
                "another kdebug build): call torch._dynamo.reset() and run it again inside the recording so it "
                "is recompiled with the hook (Note [C++ wrapper launches]), or set "
                "torch._inductor.config.cpp_wrapper=False.",
                "AOTInductor": "The package was compiled without kdebug's launch hook: compile it again with "
                "torch._inductor.aoti_compile_and_package inside a kdebug DebugMode (recording), load it with "
                "aoti_load_package, and run it under the recording (Note [C++ wrapper launches]).",
            }.get(reason, ""),
        )

    # counter -> what the warning says (Note: each warns once per new count)
    _PROBLEMS = {
        "dropped": lambda s, msgs: (
            f"{s['dropped']} kernel launch record(s) were dropped because the ring "
            f"({s['capacity']} slots, overflow={s['overflow']!r}) was full. Pass a larger "
            "DebugMode(ring_capacity=...) to keep them."),
        "outputs_skipped": lambda s, msgs: (
            f"record_outputs kept {s['output_bytes']} bytes of kernel outputs, its budget; "
            f"{s['outputs_skipped']} output(s) were not recorded. Raise it with "
            "DebugMode.record_outputs(max_bytes=...)."),
        "readonly_changed": lambda s, msgs: (
            f"{s['readonly_changed']} argument(s) that a kernel only reads changed during the "
            "launch: the kernel wrote to memory it should only read. See call.readonly_violations."),
        "hash_unsupported": lambda s, msgs: (
            f"{s['hash_unsupported']} tensor(s) have a dtype the requested hash cannot decode "
            "(recorded as Unhashed, equal to nothing); hash_fn='bitwise' hashes every dtype by its bytes."),
        "errors": lambda s, msgs: (
            f"{s['errors']} error(s) inside the launch hook; {s['unrecorded']} launch(es) "
            f"were not recorded. First: {msgs[0] if msgs else '?'}"),
    }

    # Note [Problems at exit]
    # Every exit (and every read of the records) asks whether a counter that
    # is warned about grew: the deferred GPU work's failures, the recorder's
    # ProblemCounts, the CUDA graphs.  The counters are read without the
    # dicts of defer_stats() and Recorder.stats() (_C.defer_failures,
    # Recorder.problem_state, then Recorder.problem_counts only when one of
    # them moved); those are read, with what the messages say, only when one
    # of them grew.  The CUDA graphs are listed only when _C.graph_activity()
    # moved during the recording (kdebug/cudagraphs.py since()).  A DebugMode
    # per step so pays a few us less per step, and warns as before.
    def _report_problems(self) -> None:
        if self._recorder is None:
            return
        failed = _C.defer_failures()
        if failed > self._defer_failures:
            self._defer_failures = failed
            d = _C.defer_stats()
            inductor.warn(f"kdebug could not queue its batched GPU work ({d['hash_failures']} hash(es) "
                          f"missing, {d['copy_failures']} recorded output(s) not copied): {d['last_error']}. "
                          "DebugMode(batch_gpu_work=False) hashes and copies one tensor at a time.",
                          stacklevel=4)
        graphs, unknown = self._graph_state()
        if unknown > self._reported.get("graph_unknown", 0):
            self._reported["graph_unknown"] = unknown
            inductor.warn(f"{unknown} replay(s) of CUDA graphs captured while kdebug was not recording: their "
                          "kernels are NOT recorded, so this recording is incomplete. Start recording before the "
                          "first calls of the compiled function (its warm-up and capture), or call "
                          "torch._dynamo.reset() before recording so its graphs are captured again.", stacklevel=4)
        for g in graphs:
            if (not g.complete or g.undescribed_kernels > 0 or g.other_nodes > 0) and \
                    f"graph:{g.graph_id}" not in self._warned:
                self._warned.add(f"graph:{g.graph_id}")
                inductor.warn(g.text() + ("" if g.complete else " -- this recording is incomplete"), stacklevel=4)
        state = self._recorder.problem_state()  # the counters, packed: equal, none moved since the last full look
        if state == self._problem_state:
            return
        p, r = self._recorder.problem_counts(), self._reported
        if any(getattr(p, key) > r[key] for key in self._PROBLEMS):  # ProblemCounts has each key
            s = self._recorder.stats()
            for key, message in self._PROBLEMS.items():
                if s[key] > self._reported.get(key, 0):
                    self._reported[key] = s[key]
                    msgs = self._recorder.messages() if key == "errors" else []
                    inductor.warn(message(s, msgs), stacklevel=4)
        # only once every warning went out: a warning raised as an error (-W error)
        # leaves the rest to the next look
        self._problem_state = state

    @property
    def kernel_stats(self) -> dict[str, Any]:
        """Counters of the kernel recorder: launches recorded, dropped (ring
        overflow), errors and unrecorded launches (failures inside the hook),
        suppressed (compile-time and autotuning launches, and kernels a hash_fn
        launches itself: left out on purpose), seen (launches that reached this
        recorder), launches that bypassed Python (CUDA graphs, cpp_wrapper,
        AOTI), and nested_unrecorded: launches a kdebug DebugMode nested in this
        one took instead (Note [Nested DebugModes]).  ``complete`` is False when
        any launch is missing."""
        self._flush()
        s = dict(self._recorder.stats())
        s["bypassed_graph_calls"] = dict(self._bypass)
        s["nested_unrecorded"] = self._nested_hidden
        s["other_thread_launches"] = self._unfollowed_launches()
        graphs, unknown = self._graph_state()
        s["cuda_graphs"] = len(graphs)
        s["cuda_graph_replays"] = sum(g.replays for g in graphs)
        s["unrecorded_graph_replays"] = unknown
        s["complete"] = not (s["dropped"] or s["unrecorded"] or self._bypass or self._nested_hidden or unknown
                             or s["other_thread_launches"] or any(not g.complete for g in graphs))
        s["error_messages"] = self._recorder.messages()
        return s

    def _unfollowed_launches(self) -> int:
        """Note [Launches no recording follows]: compiled launches on threads
        this recording did not follow, over its entries so far."""
        live = _C.unfollowed_launches() - self._unfollowed_at if self._unfollowed_at is not None else 0
        return self._unfollowed + live

    def _graph_state(self) -> tuple[list, int]:
        """(graphs captured or replayed since this recording began, replays of
        graphs captured without kdebug since then)."""
        if self._graphs_at_enter is None or not cudagraphs.supported():
            return [], 0
        return cudagraphs.since(self._graphs_at_enter, self._graphs_at_exit)

    @property
    def cuda_graphs(self) -> list:
        """The CUDA graphs this recording saw captured or replayed
        (kdebug.cudagraphs.GraphInfo: launches, replays, what the graph holds
        that kdebug does not record; Note [CUDA graph replays])."""
        return self._graph_state()[0]

    @property
    def complete(self) -> bool:
        """True when every kernel launch in the recorded region is in ``operators``."""
        return self.kernel_stats["complete"]

    @property
    def kernels(self) -> list[_KernelCall]:
        """Only the kernel launches, in launch order."""
        return [op for op in self.operators if isinstance(op, _KernelCall)]

    def debug_string(self, show_stack_trace: bool | None = None, verbose: bool = False) -> str:
        """Upstream's debug string, with kernel lines rendered by kdebug's C core.
        ``verbose=True`` adds each kernel argument's role, strides, storage offset and
        pointer, and the launch config, and ends with each kernel's generated
        module, source hash, fused FX nodes and user source lines.  An incomplete recording starts with a
        '# kdebug: INCOMPLETE' line saying what is missing."""
        unrecorded = [a for a in self.record_tensor_attributes or () if a not in RECORDED_ATTRIBUTES]
        if unrecorded and not self.store_original_args and self.kernels:
            self._warn_once(
                "kernel-attributes", f"record_tensor_attributes {', '.join(map(repr, unrecorded))}: kernel "
                "records keep only " + ", ".join(RECORDED_ATTRIBUTES) + " of their tensor arguments, so "
                "kernel lines leave these out. DebugMode(store_original_args=True) keeps the tensors and "
                "renders every attribute.")
        token = _VERBOSE.set(verbose)
        try:
            out = super().debug_string(show_stack_trace)
        finally:
            _VERBOSE.reset(token)
        if verbose:  # Note [Kernel code]: what each kernel is, once per kernel
            from . import kernel_code, provenance

            more = kernel_code.section((k.kernel_name for k in self.kernels), provenance.provenances)
            out = out + "\n" + more if more else out
        header = self._incomplete_header()
        return header + out if header else out

    def _incomplete_header(self) -> str:
        s = self._recorder.stats() if self._recorder is not None else None
        if s is None:
            return ""
        parts = []
        if s["dropped"]:
            parts.append(f"{s['dropped']} launch(es) dropped (ring full)")
        if s["unrecorded"]:
            parts.append(f"{s['unrecorded']} launch(es) not recorded (hook errors)")
        for reason, n in self._bypass.items():
            parts.append(f"{n} graph call(s) through {reason} not recorded")
        graphs, unknown = self._graph_state()
        if unknown:
            parts.append(f"{unknown} replay(s) of CUDA graphs captured before recording began not recorded")
        for g in graphs:
            if not g.complete:
                parts.append(g.text())
        if self._nested_hidden:
            parts.append(f"{self._nested_hidden} launch(es) recorded only by a nested DebugMode")
        other = self._unfollowed_launches()
        if other:
            parts.append(f"{other} launch(es) on threads this recording does not follow (record_all_threads=True)")
        if not parts:
            return ""
        return "# kdebug: INCOMPLETE: " + "; ".join(parts) + "\n"

    def reset(self) -> None:
        super().reset()
        if getattr(self, "_recorder", None) is not None:
            self._bypass.clear()
            self._nested_hidden = 0
            self._unfollowed = 0
            if self._unfollowed_at is not None:
                self._unfollowed_at = _C.unfollowed_launches()
            self._reported = {k: 0 for k in self._reported}  # (super().reset() cleared the recorder's counters)


def get_active_debug_mode():
    """The active DebugMode on this thread, upstream's or kdebug's: the same
    answer as upstream's torch.utils._debug_mode.get_active_debug_mode
    (Note [Active mode] in kdebug/_active.py), or None."""
    return _active.debug_mode()
