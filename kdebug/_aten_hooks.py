"""Per-thread aten-op hooks of kdebug's log_tensor_hashes() and record_outputs().

Note [Aten-op hash settings per thread]
Upstream DebugMode keeps dispatch hooks in three process-global lists
(_DISPATCH_RECORD_HOOKS, _DISPATCH_LOG_HOOKS, _DISPATCH_PRE_LOG_HOOKS) that
its contexts append to and leave with list.pop(), and its hash contexts set
process-global Triton hash functions they restore on exit.  Two threads each
inside their own context saw each other's hooks, and an exit on one thread
popped the hook the other had pushed.  kdebug's contexts therefore never
touch those globals.  What they ask for is kept per thread, as the kernel
side keeps its settings (Note [Hash settings per thread] in
csrc/kd_recorder.h):

  - each thread has one ThreadHooks, a stack of Frames (one per entered
    context, innermost last); entering or leaving changes only the calling
    thread's;
  - an aten op recorded on a thread uses that thread's hash frames, or, where
    that thread entered none, those of the thread that entered the DebugMode
    recording it (its _hook_owner): aten ops that autograd's device threads
    run under the mode are hashed as the mode's thread asked.  Recorded
    outputs likewise, part by part;
  - the C fast path (csrc/kd_dispatch.c, own_hooks) reads the summary each
    ThreadHooks keeps (hash_code, hash_entry, record_code); where it cannot do
    the frames' work itself (a callable hash_fn, nested contexts, any hook in
    upstream's global lists) the op goes to upstream's __torch_dispatch__,
    whose hook runners (_run_dispatch_pre_log_hooks / _run_dispatch_hooks in
    its module) kdebug wraps once (_upstream.install_hook_runners): they run
    upstream's global hooks and this thread's frames, in the order they were
    entered on this thread (a frame runs after the global hooks that were
    installed when it was entered), and run upstream's originals untouched
    where the thread has no frames, so upstream DebugMode used alone behaves
    as before;
  - a context must be left on the thread that entered it, innermost first.
    Leaving one out of order removes that context's own frame only (the
    contexts still open keep their settings, and the one entered after it
    will restore what was before it) and then raises a RuntimeError saying
    so; leaving it on another thread raises and changes nothing, so it can
    still be left right.

kdebug's contexts do not set upstream's Triton hash globals either: kdebug
records kernels itself, and those globals would reach every thread's
upstream DebugMode.
"""
from __future__ import annotations

import itertools
import threading
from typing import Any, Callable

import torch

from . import _C, _upstream, collectives

PRE, LOG, RECORD = 0, 1, 2  # a Frame's hooks and positions, in this order


def _global_hooks() -> tuple[list, list, list]:
    """Upstream's global hook lists: pre-log, log, record."""
    record, log, pre = _upstream.dispatch_hook_lists()
    return pre, log, record


class _Local(threading.local):
    hooks: "ThreadHooks | None" = None  # this thread's, made on first use
    dispatching: Any = None  # the kdebug DebugMode whose op upstream's __torch_dispatch__ runs now


_local = _Local()
_seq = itertools.count()


class Frame:
    """One entered log_tensor_hashes() ("hash") or record_outputs() ("record")."""

    __slots__ = ("part", "entry", "hooks", "positions", "seq", "prev", "restore", "thread", "custom")

    def __init__(self, part: str, entry: tuple | None, hooks: tuple, prev: tuple,
                 restore: Callable, custom: Callable | None) -> None:
        self.part = part
        self.entry = entry  # the fast path's entry (kd_dispatch.c), None: it cannot do this frame's work
        self.hooks = hooks  # (pre-log, log, record) hook or None, as upstream's hooks are called
        record, log, pre = _upstream.dispatch_hook_lists()
        self.positions = (len(pre), len(log), len(record))  # of upstream's (PRE, LOG, RECORD), at entry
        self.seq = next(_seq)
        self.prev = prev  # the kernel-side settings to restore: restore(*prev)
        self.restore = restore
        self.thread = threading.get_ident()
        self.custom = custom  # a callable hash_fn pushed for kernels (kdebug.hashing)


class ThreadHooks:
    """One thread's entered contexts and the summary the C fast path reads:
    hash_code / record_code 0 (none), 1 (one frame the fast path does itself:
    hash_entry for hashes), 2 (go through upstream's code)."""

    __slots__ = ("frames", "hash_code", "hash_entry", "record_code", "__weakref__")

    def __init__(self) -> None:
        self.frames: list[Frame] = []
        self.hash_code = 0
        self.hash_entry: tuple | None = None
        self.record_code = 0

    def _summarize(self) -> None:
        # one pass (run at every enter and exit of a context): the hash frames,
        # and the record frames with an aten-op hook.  A record frame without
        # one (a filter that leaves aten ops out) records kernels only; one with
        # an entry (a filter: kdebug/values.py) goes through upstream's code
        nhash = nrecord = 0
        first_hash = first_record = None
        for f in self.frames:
            if f.part == "hash":
                nhash += 1
                first_hash = first_hash or f
            elif f.part == "record" and f.hooks[RECORD] is not None:
                nrecord += 1
                first_record = first_record or f
        one = nhash == 1 and first_hash.entry is not None
        self.hash_code = 0 if not nhash else 1 if one else 2
        self.hash_entry = first_hash.entry if one else None
        self.record_code = 0 if not nrecord else 1 if nrecord == 1 and first_record.entry is None else 2

    def has(self, part: str) -> bool:
        return any(f.part == part for f in self.frames)


def this_thread() -> ThreadHooks:
    """The calling thread's ThreadHooks (made on first use)."""
    th = _local.hooks
    if th is None:
        th = _local.hooks = ThreadHooks()
    return th


def push(part: str, entry: tuple | None, hooks: tuple, prev: tuple, restore: Callable,
         custom: Callable | None = None) -> Frame:
    """Enters a context on this thread: its frame, innermost."""
    th = this_thread()
    f = Frame(part, entry, hooks, prev, restore, custom)
    th.frames.append(f)
    th._summarize()
    return f


def pop(frame: Frame, remove_custom: Callable) -> None:
    """Leaves ``frame``'s context (Note [Aten-op hash settings per thread]):
    restores the kernel-side settings it replaced, unless a context of its
    part entered after it is still open (that one restores them instead)."""
    me = threading.get_ident()
    if frame.thread != me:
        raise RuntimeError(
            f"a kdebug DebugMode.log_tensor_hashes() / record_outputs() context entered on thread "
            f"{frame.thread} was exited on thread {me}: exit it on the thread that entered it "
            "(nothing was changed)")
    th = this_thread()
    frames = th.frames
    at = len(frames) - 1  # a frame is in the list once: looked for from the innermost, where it usually is
    while at >= 0 and frames[at] is not frame:
        at -= 1
    if at < 0:
        raise RuntimeError("a kdebug DebugMode.log_tensor_hashes() / record_outputs() context was exited "
                           "twice, or without being entered")
    later = [f for f in frames[at + 1:] if f.part == frame.part] if at + 1 < len(frames) else []
    del th.frames[at]
    th._summarize()
    if frame.custom is not None:
        remove_custom(frame.custom)
    if later:
        later[0].prev = frame.prev  # it now restores what was before this one
    else:
        frame.restore(*frame.prev)
    if at != len(th.frames):
        raise RuntimeError(
            f"kdebug DebugMode.{'log_tensor_hashes' if frame.part == 'hash' else 'record_outputs'}() "
            f"was exited before {len(th.frames) - at} context(s) entered after it on this thread: exit "
            "contexts innermost first. Only this context's settings were removed; the ones still open "
            "keep theirs")


# ---------------------------------------------------------------- kdebug's hooks

def _tree(fn: Callable, obj):
    # a tensor with no data of its own has nothing to hash (Inductor's pattern
    # matcher traces its patterns on meta tensors, AOTInductor and export trace
    # on fake ones, under the active mode): its hash is None, as for any
    # argument that is no tensor
    return _upstream.tree_map(lambda x: fn(x) if isinstance(x, torch.Tensor) and not _upstream.has_no_data(x)
                              else None, obj)


def hash_hooks(fn: Callable, hash_inputs: bool) -> tuple:
    """(pre-log, log, record) hooks doing what upstream's log_tensor_hashes()
    hooks do with the per-tensor hash ``fn``: call.log["input_hash"] (when
    hash_inputs) and call.log["hash"], of the values the fast path hashes
    (Note [Hashes of one op on every path], csrc/kd_hash_args.c): no hash of
    an out= or fresh buffer's memory before the op, none of a fresh buffer's
    views, the written arguments of an in-place op that returns nothing."""
    def logged(key: str, values):
        # None: nothing hashed (no tensor in it: item(), equal(); then the value is compared)
        tree = None if values is None else _tree(fn, values)
        return None if tree is None or _upstream.tree_all(lambda x: x is None, tree) else {key: tree}

    def pre(func, types, args, kwargs, call):
        return logged("input_hash", _C.op_hash_inputs(_local.dispatching, func, tuple(args), dict(kwargs or {})))

    def log(func, types, args, kwargs, result):
        return logged("hash", _C.op_hash_outputs(_local.dispatching, func, tuple(args), dict(kwargs or {}),
                                                 result, hash_inputs))

    return (pre if hash_inputs else None, log, None)


def record_hooks() -> tuple:
    """(pre-log, log, record) hooks doing what upstream's record_outputs()
    hook does: call.record["output"], a clone of each output tensor."""
    def record(func, types, args, kwargs, result):
        return {"output": _upstream.tree_map(lambda x: x.clone() if isinstance(x, torch.Tensor) else x, result)}

    return (None, None, record)


# ---------------------------------------------------------------- upstream's hook runners

def _frames() -> list[Frame]:
    """The frames whose hooks an aten op on this thread runs: this thread's
    hash frames, or its DebugMode's thread's where it has none; the same for
    record frames; in the order they were entered."""
    mine = _local.hooks
    owner = getattr(_local.dispatching, "_hook_owner", None)
    out: list[Frame] = []
    for part in ("hash", "record"):
        src = mine if mine is not None and mine.has(part) else owner
        if src is not None:
            out += [f for f in src.frames if f.part == part]
    out.sort(key=lambda f: f.seq)
    return out


def _merged(global_hooks: list, frames: list[Frame], kind: int) -> list:
    """Upstream's global hooks of one kind with the frames' hooks, each frame's
    after the global hooks installed when it was entered."""
    out: list = []
    g = 0
    snapshot = list(global_hooks)
    for f in frames:
        hook = f.hooks[kind]
        if hook is None:
            continue
        end = min(f.positions[kind], len(snapshot))
        out += snapshot[g:end]
        g = max(g, end)
        out.append(hook)
    return out + snapshot[g:]


def _checked(hook, *args):
    out = hook(*args)
    if out is not None and not isinstance(out, dict):  # as upstream checks its hooks' results
        raise AssertionError(f"hook must return None or dict, got {type(out).__name__}")
    return out


def run_pre_log_hooks(original: Callable, call, func, types, args, kwargs) -> None:
    """Upstream's _run_dispatch_pre_log_hooks, with this thread's frames."""
    frames = _frames()
    if not frames:
        return original(call, func, types, args, kwargs)
    for hook in _merged(_global_hooks()[PRE], frames, PRE):
        out = _checked(hook, func, types, args, kwargs, call)
        if out is not None:
            if call.log is None:
                call.log = {}
            call.log.update(out)


def run_hooks(original: Callable, call, func, types, args, kwargs, result) -> None:
    """Upstream's _run_dispatch_hooks, with this thread's frames."""
    frames = _frames()
    if not frames:
        return original(call, func, types, args, kwargs, result)
    lists = _global_hooks()
    records = _merged(lists[RECORD], frames, RECORD)
    if records:
        record: dict = {}
        for hook in records:
            out = _checked(hook, func, types, args, kwargs, result)
            if out is not None:
                record.update(out)
        if record:
            call.record = record
    logs = _merged(lists[LOG], frames, LOG)
    if logs:
        if call.log is None:
            call.log = {}
        for hook in logs:
            out = _checked(hook, func, types, args, kwargs, result)
            if out is not None:
                call.log.update(out)


def through_upstream(mode, func, types, args, kwargs):
    """Upstream's __torch_dispatch__ for an op of kdebug's ``mode`` (the fast
    path's fallback), with ``mode`` known to the hook runners above."""
    if collectives.is_collective(func):  # Note [Collective records]
        return collectives.dispatch(mode, func, types, args, kwargs)
    prev = _local.dispatching
    _local.dispatching = mode
    try:
        result = _upstream.DebugMode.__torch_dispatch__(mode, func, types, args, kwargs)
    finally:
        _local.dispatching = prev
    if mode._fresh:  # Note [Fresh buffers] (csrc/kd_fresh.c): what the op wrote is no longer fresh
        _C.op_track_fresh(mode, func, tuple(args), dict(kwargs or {}), result)
    return result
