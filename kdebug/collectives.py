"""Collectives as first-class records.

Note [Collective records]
A c10d collective is recorded as one record of its own among the aten ops
(a trace op record named ``c10d::allreduce_``, ``_c10d_functional::all_reduce``
...), whose text names the group (name and global ranks), the reduce op and
every tensor's dtype and shape -- nothing rank-specific, so the records of
two ranks align -- with the hash of what it reads taken before it is issued
and the hash of what it writes taken when it has completed, and the byte
ranges of both (its data flow: Note [Data flow] in dataflow.py).

kdebug's DebugMode sends these ops here (mode._op_info marks them special;
_aten_hooks.through_upstream calls ``dispatch``).  The output is never hashed
when the op returns: the transfer may still be running.  Instead:

- eager ops (``dist.all_reduce`` and friends dispatch ``c10d::<op>``, which
  returns a Work): a callback on the Work's future (``Future.then``) hashes
  the outputs when the work completes.  For gloo it runs on gloo's thread
  after the output is written and before ``Work.wait()`` returns (gloo
  completes the future, running its callbacks, before it marks the work
  done).  For NCCL the future's callbacks run with current CUDA streams that
  wait on the collective's end events, so the hash kernel is queued after
  the collective, on the device, with no host synchronization.
- functional ops (``_c10d_functional.*`` in compiled graphs): their output is
  hashed by ``wait_tensor`` on that output, on the current stream after the
  wait, as Inductor's own code orders its readers.

No hash waits for anything: a collective that never completes (or is still
running when the recording ends) keeps no output hash, and the trace counts
it (META stats ``collectives_incomplete``).  The record stays at the place
the collective was issued; the trace stream writes records only up to the
first collective still in flight, so its record is written complete.

Where no log_tensor_hashes() is entered, collectives are still hashed, with
the bitwise hash: they are few, and comparing replicas needs them.

Note [Outputs written before their hash]
A program that waits on the Work's *future* (DDP's Reducer waits on each
bucket's) is woken by gloo just before the callbacks run, and the callback
is Python: it runs on gloo's thread only once it gets the GIL, which the
program's thread holds while it runs Python.  So the program may be far
ahead when the output is hashed: with DDP on gloo, the next backward was
already copying new gradients into the bucket, and the hash took a mix of
the reduced and the next local gradients (a clean two-rank DDP job was
reported as diverging at an all-reduce in 2 of 3 recordings).  Waiting for
the hash before the program may go on would mean handing the program
another Work (torch's Work made from a future refuses wait(timeout)), and
a hash that needs the GIL in a wait that may hold it can hang.  Instead
the callback checks, after hashing, that nothing wrote the output since
the collective was issued:
- no record made since (recorded when issued, before it runs) writes
  memory that overlaps the output: an op that writes an argument's
  elements (in-place or out=; views of the output, as DDP's bucket views,
  and ops that change only metadata, set_ or resize_, write nothing), or
  another collective (c10d schemas declare no write: a second all-reduce of
  the same tensor writes it).  The records are read through list's own
  methods, as snapshots of the list's tail, never merging kernel records
  into DebugMode.operators from the backend's thread (an adversarial
  review saw records lost that way);
- the tensors' version counters did not move more than the recorded
  in-place writes into their storage explain (every view of a storage
  shares one counter: a recorded write of another row of the same buffer
  moves it too).  A counter that moved further was moved by a write no
  DebugMode recorded (another thread, a disabled dispatch).  Inference
  tensors have no counter: only the records are checked.
Otherwise the output keeps no hash: the record says which write it was,
META stats ``collectives_overwritten`` counts it, and a comparison takes it
as unknown, never as a difference (crossrank._differs).  Not seen: a
compiled kernel writing the output that was launched before the callback
took the GIL and still runs (kernel launches are not records there), and
extents are byte ranges, so a strided write whose gaps hold the output
counts as a write (a hash dropped, never a wrong one).
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from . import _C, _upstream, hashing

NAMESPACES = ("c10d", "_c10d_functional")


@dataclass(frozen=True)
class Kind:
    """Where an eager c10d op's tensors are (argument positions) and what is true of them."""

    reads: tuple      # positions of the tensor arguments it reads
    writes: tuple     # positions of the tensor arguments it writes
    group: int        # position of the process group
    reduce: int | None  # position of the reduce op
    agree: bool       # every rank of the group ends with the same output


EAGER = {
    "allreduce_": Kind((0,), (0,), 1, 2, True),
    "allreduce_coalesced_": Kind((0,), (0,), 1, 2, True),
    "broadcast_": Kind((0,), (0,), 1, None, True),
    "reduce_": Kind((0,), (0,), 1, 2, False),
    "_allgather_base_": Kind((1,), (0,), 2, None, True),
    "allgather_": Kind((1,), (0,), 2, None, True),
    "allgather_coalesced_": Kind((1,), (0,), 2, None, True),
    "allgather_into_tensor_coalesced_": Kind((1,), (0,), 2, None, True),
    "_reduce_scatter_base_": Kind((1,), (0,), 2, 3, False),
    "reduce_scatter_": Kind((1,), (0,), 2, 3, False),
    "reduce_scatter_tensor_coalesced_": Kind((1,), (0,), 2, 3, False),
    "alltoall_base_": Kind((1,), (0,), 2, None, False),
    "alltoall_": Kind((1,), (0,), 2, None, False),
    "gather_": Kind((1,), (0,), 2, None, False),
    "scatter_": Kind((1,), (0,), 2, None, False),
    "send": Kind((0,), (), 1, None, False),
    "recv_": Kind((), (0,), 1, None, False),
    "recv_any_source_": Kind((), (0,), 1, None, False),
    "barrier": Kind((), (), 1, None, False),
}

# functional ops: (position of the group name, position of the reduce op or None, agree)
FUNCTIONAL = {
    "all_reduce": (2, 1, True), "all_reduce_": (2, 1, True),
    "all_reduce_coalesced": (2, 1, True), "all_reduce_coalesced_": (2, 1, True),
    "all_gather_into_tensor": (2, None, True), "all_gather_into_tensor_out": (2, None, True),
    "all_gather_into_tensor_coalesced": (2, None, True),
    "reduce_scatter_tensor": (3, 1, False), "reduce_scatter_tensor_coalesced": (3, 1, False),
    "broadcast": (2, None, True), "broadcast_": (2, None, True),
    "all_to_all_single": (3, None, False),
}

# output agreement by record name, for records read back from traces
AGREE = {f"c10d::{k}": v.agree for k, v in EAGER.items()}
AGREE.update({f"_c10d_functional::{k}": v[2] for k, v in FUNCTIONAL.items()})


def is_collective(func) -> bool:
    """True for the ops this module records (c10d and _c10d_functional)."""
    return getattr(func, "namespace", None) in NAMESPACES


def is_collective_name(name: str) -> bool:
    return name.split("::", 1)[0] in NAMESPACES and name.split("::", 1)[-1].split(".")[0] != "wait_tensor"


def outputs_agree(name: str) -> bool:
    """Every rank of the group must end with the same output (all-reduce,
    broadcast, all-gather), by record name ('c10d::allreduce_.default')."""
    return AGREE.get(name.rsplit(".", 1)[0] if name.count(".") else name, False) or AGREE.get(name, False)


# -------------------------------------------------------------- the records


class CollectiveCall(_upstream._OpCall):
    """A collective's record in ``DebugMode.operators`` (an _OpCall: its name
    is its op's).  ``log`` holds ``input_hash`` from the start and ``hash``
    once it completed; ``done`` says whether it did."""

    def __init__(self, func, text: str, depth: int, agree: bool):
        self.op = func
        self.call_depth = depth
        self.args_str = self.kwargs_str = ""
        self.output_str = None
        self.record = None
        self.log: dict = {}
        self.stack_trace = self.fwd_stack_trace = None
        self.text = text
        self.agree = agree
        self.done = threading.Event()
        self.error: str | None = None

    def render(self, attributes) -> str:
        return self.text + (f"  # {self.log}" if self.log else "")

    def stringify_args(self, *a, **k) -> None:  # the text is made once, at issue
        pass

    def stringify_output(self, *a, **k) -> None:
        pass

    def __repr__(self) -> str:
        return self.text


def _shape_text(x) -> str:
    if isinstance(x, torch.Tensor):
        return f"{_upstream.dtype_abbrs.get(x.dtype, str(x.dtype))}{list(x.shape)}"
    if isinstance(x, (list, tuple)):
        return "[" + ", ".join(_shape_text(y) for y in x) + "]"
    return "-"


def _text(name: str, reads: list, writes: list | None, group, reduce) -> str:
    gname, granks = _upstream.group_of(group)
    parts = [f"in={', '.join(_shape_text(t) for t in reads)}"]
    if writes is not None:
        parts.append(f"out={', '.join(_shape_text(t) for t in writes)}")
    parts.append(f"group={gname} ranks={granks}")
    op = _upstream.reduce_op_name(reduce) if reduce is not None else "?"
    if op != "?":  # eager ops' ReduceOp objects do not say which (torch 2.13)
        parts.append(f"op={op}")
    return f"{name}({' '.join(parts)})"


def _spec():
    """The hash spec of this thread's log_tensor_hashes(), else bitwise."""
    from . import _aten_hooks

    entry = _aten_hooks.this_thread().hash_entry
    if entry is not None:
        return entry.spec
    return hashing.parse("bitwise")[1]


def _hash_tree(obj, spec):
    if isinstance(obj, torch.Tensor):
        with _upstream.disable_torch_dispatch():
            return hashing.start_value(obj, spec)
    if isinstance(obj, (list, tuple)):
        return [_hash_tree(x, spec) for x in obj]
    return None


def _at(args, positions) -> tuple:
    return tuple(args[p] if p < len(args) else None for p in positions)


class _State:
    """One DebugMode's collectives: those still in flight, counters."""

    def __init__(self):
        self.lock = threading.Lock()
        self.pending: list[CollectiveCall] = []      # issued, not completed
        self.by_output: dict[int, tuple] = {}        # functional: data_ptr -> (call, leaf)
        self.issued = 0
        self.failed = 0
        self.layout: dict | None = None  # ranks.meta() at the first collective
        self.unhashed = 0  # completed, but its Work had no future to hash it from
        self.overwritten = 0  # written before its callback hashed it (Note [Outputs written before their hash])


def state(mode) -> _State:
    st = getattr(mode, "_collectives", None)
    if st is None:
        st = mode._collectives = _State()
    return st


def _complete(st: _State, call: CollectiveCall) -> None:
    with st.lock:
        if call in st.pending:
            st.pending.remove(call)
    call.done.set()


_perturb: dict = {}  # kdebug.testing.perturb_collective_output: {op name: value}
_hold: list = []  # kdebug.testing.hold_collective_callbacks: events completion callbacks wait for


def _planted(name: str, outs, v=None) -> None:
    v = _perturb.get(name) if v is None else v
    if v is None:
        return
    for t in outs:
        if isinstance(t, torch.Tensor) and t.numel():
            with _upstream.disable_torch_dispatch(), torch.no_grad():
                t.view(-1)[0] += v
            return


def dispatch(mode, func, types, args, kwargs):
    """Runs collective ``func`` for kdebug DebugMode ``mode``, recording it
    (Note [Collective records]); wait_tensor completes a functional record."""
    kwargs = kwargs or {}
    base = func._schema.name.split("::", 1)[1]
    st = state(mode)
    if func.namespace == "_c10d_functional" and base == "wait_tensor":
        out = func(*args, **kwargs)
        _functional_done(st, args[0] if args else kwargs.get("tensor"))
        return out
    spec = _spec()
    name = f"{func.namespace}::{base}"
    depth = getattr(mode, "call_depth", 0)
    if func.namespace == "c10d":
        kind = EAGER.get(base)
        if kind is None:  # a c10d op kdebug does not know: run it, record nothing about its data
            return func(*args, **kwargs)
        reads, writes = _at(args, kind.reads), _at(args, kind.writes)
        group = args[kind.group] if kind.group < len(args) else None
        reduce = args[kind.reduce] if kind.reduce is not None and kind.reduce < len(args) else None
        call = CollectiveCall(func, _text(name, list(reads), list(writes), group, reduce), depth, kind.agree)
        pre = [None] * len(args)
        for p in kind.reads:
            if p < len(args):
                pre[p] = _hash_tree(args[p], spec)
        call.log["input_hash"] = (tuple(pre), {})
        in_ext = _C.tree_extents((tuple(args[p] if p in kind.reads else None for p in range(len(args))), {}))
        out_ext = _C.tree_extents(tuple(writes))
        call._kd_extents = _C.OpExtents((None if in_ext is NotImplemented else in_ext,
                                         None if out_ext is NotImplemented else out_ext))
        _issue(mode, st, call)
        versions = _versions(writes)
        result = func(*args, **kwargs)
        work = result[-1] if isinstance(result, tuple) else result
        _eager_then(mode, st, call, work, writes, spec, name, versions)
        return result
    gpos, rpos, agree = FUNCTIONAL.get(base, (None, None, False))
    group = args[gpos] if gpos is not None and gpos < len(args) else kwargs.get("group_name")
    reduce = args[rpos] if rpos is not None and rpos < len(args) else None
    first = args[0] if args else None
    call = CollectiveCall(func, _text(name, [first], None, group, reduce), depth, agree)
    call.log["input_hash"] = ((_hash_tree(first, spec),) + (None,) * (len(args) - 1), {})
    in_ext = _C.tree_extents(((first,) + (None,) * (len(args) - 1), {}))
    _issue(mode, st, call)
    out = func(*args, **kwargs)
    outs = list(out) if isinstance(out, (list, tuple)) else [out]
    out_ext = _C.tree_extents(out)
    call._kd_extents = _C.OpExtents((None if in_ext is NotImplemented else in_ext,
                                     None if out_ext is NotImplemented else out_ext))
    call._outputs = [None] * len(outs)
    call._spec = spec
    call._is_list = isinstance(out, (list, tuple))
    with st.lock:
        for i, t in enumerate(outs):
            if isinstance(t, torch.Tensor):
                st.by_output[t.data_ptr()] = (call, i)
    return out


def _issue(mode, st: _State, call: CollectiveCall) -> None:
    if st.layout is None:  # Note [Ranks]: the groups as they were, if they are gone at exit
        from . import ranks

        st.layout = ranks.meta()
    with st.lock:
        st.pending.append(call)
        st.issued += 1
    list.append(mode._ops, call)  # as upstream records an op (Note [Launch order])


def _leaves(writes) -> list:
    """Every tensor of a collective's outputs (a tensor, or lists of them,
    nested: all_gather's Tensor[][])."""
    out = []

    def walk(x):
        if isinstance(x, torch.Tensor):
            out.append(x)
        elif isinstance(x, (list, tuple)):
            for y in x:
                walk(y)
    walk(writes)
    return out


class _Bytes(NamedTuple):
    """A storage's byte range, shaped as an _C.Extent for _overlaps."""

    device_type: int
    device_index: int
    lo: int
    hi: int


_DEV_TYPES = {"cpu": 0, "cuda": 1}  # (dataflow._DEV_NAMES the other way)


def _versions(writes) -> list:
    """(version counter, storage byte range) of each tensor a collective
    writes, when it is issued; the counter None where the tensor keeps none
    (an inference tensor).  Never raises: a tensor it cannot read is left
    out of the version check (the op scan still covers it)."""
    out = []
    for t in _leaves(writes):
        try:
            st = t.untyped_storage()
            rng = _Bytes(_DEV_TYPES.get(t.device.type, -1), -1 if t.device.index is None else t.device.index,
                         st.data_ptr(), st.data_ptr() + st.nbytes())
        except Exception:
            rng = None
        try:
            v = t._version
        except Exception:  # inference tensors track no version
            v = None
        out.append((v, rng))
    return out


def _extent_leaves(tree) -> list:
    from . import dataflow

    return [leaf for _, leaf in dataflow._walk(tree) if leaf is not None]


def _overlaps(a, b) -> bool:
    return (a.device_type, a.device_index) == (b.device_type, b.device_index) and a.lo < b.hi and b.lo < a.hi


def _writes_of(op) -> list:
    """The extents an op recorded after a collective wrote: a collective's
    outputs (c10d schemas declare no write), a mutating op's outputs, none
    for anything else."""
    oe = getattr(op, "_kd_extents", None)
    if oe is None or oe.outputs is None:
        return []
    from . import dataflow

    if not isinstance(op, CollectiveCall) and not dataflow.writes_elements(getattr(op, "op", None)):
        return []  # (a view of the output, as DDP's bucket views, writes nothing)
    return _extent_leaves(oe.outputs)


def _recorded_since(ops, call) -> list | None:
    """The records after ``call`` in ``ops`` (DebugMode.operators), oldest
    first, or None when ``call`` is no longer there.  Read through list's own
    methods, as snapshots of the list's tail: reading it the _OperatorList way
    merges kernel records into it, which the program's thread may be doing
    at the same time (this callback may run on the backend's thread: an
    adversarial review saw recorded ops lost that way), and copying the whole
    list at every collective grew with the recording."""
    window = 64
    while True:
        n = list.__len__(ops)
        tail = list.__getitem__(ops, slice(max(0, n - window), None))  # one consistent snapshot
        for k in range(len(tail) - 1, -1, -1):
            if tail[k] is call:
                return tail[k + 1:]
        if len(tail) >= n:
            return None
        window *= 4


def _written_since(mode, call: CollectiveCall, writes, versions: list) -> str | None:
    """What wrote a collective's output after it was issued, seen when its
    completion callback has hashed it (Note [Outputs written before their
    hash]), or None."""
    ext = getattr(call, "_kd_extents", None)
    mine = _extent_leaves(ext.outputs) if ext is not None and ext.outputs is not None else []
    later = _recorded_since(mode._ops, call)
    writes_since = [(op, _writes_of(op)) for op in (later or [])]
    for op, ws in writes_since:
        if any(_overlaps(x, y) for x in ws for y in mine):
            return f"{getattr(op, 'op', op)} (recorded after it)"
    now = _versions(writes)
    for (v0, rng), (v1, _) in zip(versions, now):
        if v0 is None or v1 is None or v1 == v0:
            continue
        # the counter is shared by every view of a storage: moves explained by recorded writes
        # elsewhere in that storage (checked above not to overlap the output) are not the output's
        if later is None or rng is None:
            return "an in-place write through torch (its version counter moved)"
        explained = sum(1 for _, ws in writes_since if any(_overlaps(x, rng) for x in ws))
        if v1 - v0 > explained:
            return "an in-place write kdebug did not record (its version counter moved)"
    return None


def _eager_then(mode, st: _State, call: CollectiveCall, work, writes, spec, name, versions: list) -> None:
    """Hashes ``writes`` when ``work`` completes (a callback on its future),
    unless they were written since (Note [Outputs written before their hash])."""

    # kdebug.testing.perturb_collective_output: decided when the collective is
    # issued (inside the context or not), not when the backend's thread runs
    # the callback, which may be after the program left the context
    bump = _perturb.get(name)

    held = list(_hold)

    def finish(fut) -> None:
        try:
            for ev in held:  # kdebug.testing.hold_collective_callbacks: a late callback, planted
                ev.wait(60)
            fut.value()  # raises when the collective failed
            base = versions
            if bump is not None:
                _planted(name, _leaves(writes), bump)
                base = _versions(writes)  # (the planted write is not the program's)
            # a list made first, then the tuple: tuple(<generator>) resizes the
            # tuple it builds, which raises SystemError when another thread
            # holds a reference to it meanwhile (the main thread's
            # gc.get_objects() in final_state.snapshot did, at the end of a
            # DDP program, whose last all-reduce's callback runs here then)
            hashes = [_hash_tree(w, spec) for w in writes]
            writer = _written_since(mode, call, writes, base)
            if writer is not None:
                call.error = (f"its output was written by {writer} before kdebug's completion callback could "
                              "hash it: no output hash (Note [Outputs written before their hash])")
                st.overwritten += 1
            else:
                call.log["hash"] = tuple(hashes)
        except Exception as e:  # never the program's problem: the record says why it has no output hash
            call.error = f"{type(e).__name__}: {e}"
            st.failed += 1
        finally:
            _complete(st, call)

    w = _upstream.unbox_work(work) if isinstance(work, torch.ScriptObject) else work
    try:
        fut = w.get_future()
    except Exception as e:  # a Work without a future: no output hash, said so
        call.error = f"no future on its Work ({type(e).__name__})"
        st.unhashed += 1
        _complete(st, call)
        return
    call._future = fut
    if held:
        # planted (kdebug.testing.hold_collective_callbacks): late whichever thread completes the
        # future, the backend's or this one (then() runs the callback at once on a completed future)
        fut.then(lambda f: threading.Thread(target=finish, args=(f,), daemon=True,
                                            name="kdebug-held-collective-callback").start())
    else:
        fut.then(finish)


def _functional_done(st: _State, t) -> None:
    if not isinstance(t, torch.Tensor):
        return
    with st.lock:
        got = st.by_output.pop(t.data_ptr(), None)
    if got is None:
        return
    call, i = got
    if _perturb:
        _planted(f"{call.op.namespace}::{call.op._schema.name.split('::', 1)[1]}", [t])
    call._outputs[i] = _hash_tree(t, call._spec)
    if all(x is not None for x in call._outputs):
        outs = call._outputs
        call.log["hash"] = list(outs) if call._is_list else outs[0]
        _complete(st, call)


def settle(mode, timeout: float = 2.0) -> None:
    """At the end of a recording: a collective whose future has completed
    (the program waited for it) but whose callback is still running on the
    backend's thread gets up to ``timeout`` seconds to finish hashing; one
    still in flight is left alone (never waited for)."""
    st = getattr(mode, "_collectives", None)
    if st is None:
        return
    with st.lock:
        calls = list(st.pending)
    for c in calls:
        fut = getattr(c, "_future", None)
        if fut is not None and fut.done():
            c.done.wait(timeout)


def first_pending(mode, items) -> int | None:
    """Index in ``items`` of the first collective still in flight, or None."""
    st = getattr(mode, "_collectives", None)
    if st is None or not st.pending:
        return None
    with st.lock:
        pending = {id(c) for c in st.pending}
    return next((i for i, x in enumerate(items) if id(x) in pending), None)


def resolve(items) -> None:
    """Replaces GPU hash values still queued in collective records by their values."""
    def value(x):
        if isinstance(x, hashing.Pending):
            return x.value()
        if isinstance(x, list):
            return [value(y) for y in x]
        if isinstance(x, tuple):
            return tuple(value(y) for y in x)
        if isinstance(x, dict):
            return {k: value(v) for k, v in x.items()}
        return x

    for c in items:
        if isinstance(c, CollectiveCall) and c.log:
            c.log = {k: value(v) for k, v in c.log.items()}


def stats(mode) -> dict[str, Any]:
    """{'collectives', 'collectives_incomplete', 'collectives_failed', 'collectives_unhashed',
    'collectives_overwritten'} of a mode."""
    st = getattr(mode, "_collectives", None)
    if st is None:
        return {}
    with st.lock:
        return {"collectives": st.issued, "collectives_incomplete": len(st.pending),
                "collectives_failed": st.failed, "collectives_unhashed": st.unhashed,
                "collectives_overwritten": st.overwritten}
