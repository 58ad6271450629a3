"""Run-to-run comparison: name the first kernel where two runs diverge.

``compare(run_a, run_b)`` walks two recordings launch by launch, in order, on
their hashes (record with ``DebugMode.log_tensor_hashes("bitwise",
hash_inputs=True)``), after aligning the two launch sequences as a diff tool
would (structural differences are reported, never fatal).  The first launch
whose hashes differ is classified:

- *output divergence*: its inputs were identical and its outputs were not:
  this launch is non-deterministic;
- *input divergence*: it read different values.  The memory's last writer in
  the run is looked up: a recorded kernel whose written arguments overlap the
  input's address range, or an aten op whose output hash is the input's hash;
  when there is none, the difference came from outside the recorded launches
  (a graph input, RNG, an op run with no DebugMode).

Every later launch whose hashes differ too is counted as having inherited the
difference.
"""
from __future__ import annotations

import difflib
import os
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import torch

from . import _C, _upstream
from .calls import TensorInfo, _KernelCall


@dataclass
class Step:
    """One launch or aten op of a run, as the comparison sees it."""

    index: int                 # position in the run (operators order)
    kind: str                  # "kernel" or "aten"
    name: str
    grid: Any = None
    config: Any = None
    kernel_number: int | None = None  # launch index among kernels
    pre: dict = field(default_factory=dict)   # arg name -> hash (before)
    post: dict = field(default_factory=dict)  # arg name -> hash (after)
    tensors: dict = field(default_factory=dict)  # arg name -> TensorInfo (kernels)
    arg_names: tuple = ()

    @property
    def key(self) -> tuple:
        return (self.kind, self.name)

    def label(self) -> str:
        if self.kind == "kernel":
            return f"kernel #{self.kernel_number} {self.name}"
        return f"op #{self.index} {self.name}"


def _step(i: int, op) -> Step:
    """The Step of operators entry ``op`` at position i."""
    if isinstance(op, _KernelCall):
        tensors = dict(op.tensor_info)
        pre = dict(op.pre_hashes or {})
        for n in _aliased_inputs(tensors):
            pre.pop(n, None)
        return Step(i, "kernel", op.kernel_name, op.grid, op.config, op.launch_index,
                    pre, dict(op.post_hashes or {}), tensors, tuple(op.arg_names))
    log = getattr(op, "log", None) or {}
    pre = {"inputs": log["input_hash"]} if log.get("input_hash") is not None else {}
    post = {"output": log["hash"]} if log.get("hash") is not None else {}
    name = op._name if hasattr(op, "_name") else _upstream.get_call_name(op)
    return Step(i, "aten", name, pre=pre, post=post)


def steps_of(run) -> list[Step]:
    """Every comparable step of a run (a DebugMode, a kdebug.Run or a trace path)."""
    side = _Side.of(run)
    return [side.step(i) for i in range(side.n)]


def _aliased_inputs(tensors: dict) -> list[str]:
    """Read-only arguments whose memory overlaps an argument the same launch
    writes.  Inductor passes a concatenation's whole buffer as an input while
    the kernel writes its slices: before the launch part of it holds memory
    nobody wrote yet, so its pre-launch hash is not compared (what the kernel
    really read shows in an earlier writer's outputs or in its own)."""
    written = [_extent(t) for t in tensors.values() if isinstance(t, TensorInfo) and t.writes]
    if not written:
        return []
    return [n for n, t in tensors.items()
            if isinstance(t, TensorInfo) and t.reads and not t.writes
            and any(_overlaps(_extent(t), w) for w in written)]


class _Side:
    """One run as the engine sees it: digest columns from the C trace reader
    (key, config, shape, pre, post per record) and Steps made on demand.  A live
    DebugMode is encoded into an in-memory trace first, so every run is
    compared the same way."""

    def __init__(self, run):
        from .trace import Run, load, save

        if isinstance(run, (str, os.PathLike)):
            run = load(os.fspath(run))
        if isinstance(run, Run):
            self.run = run
            self._call = run.call
        elif hasattr(run, "operators") and hasattr(run, "_recorder"):
            ops = list(run.operators)
            self.run = Run(save(run, None), "<DebugMode>")
            self._call = ops.__getitem__
        else:
            raise TypeError(f"compare() takes DebugMode objects, kdebug.Run objects or trace file paths, "
                            f"not {type(run).__name__}")
        self.n = len(self.run)
        self.dig = torch.frombuffer(self.run.digests(), dtype=torch.int64).view(self.n, 5) \
            if self.n else torch.zeros((0, 5), dtype=torch.int64)
        self._steps: dict[int, Step] = {}

    @classmethod
    def of(cls, run) -> "_Side":
        return run if isinstance(run, _Side) else cls(run)

    def step(self, i: int) -> Step:
        s = self._steps.get(i)
        if s is None:
            s = self._steps[i] = _step(i, self._call(i))
        return s


class _Pairs:
    """Aligned (step in run a, step in run b) pairs at given positions, made on demand."""

    def __init__(self, A: _Side, B: _Side, ia, ib):
        self._A, self._B, self._ia, self._ib = A, B, ia, ib

    def __len__(self) -> int:
        return len(self._ia)

    def __getitem__(self, k):
        if isinstance(k, slice):
            return [self[j] for j in range(*k.indices(len(self)))]
        return self._A.step(int(self._ia[k])), self._B.step(int(self._ib[k]))

    def __iter__(self):
        return (self[j] for j in range(len(self)))


def _leaves(tree) -> list:
    if isinstance(tree, dict):
        return [x for v in tree.values() for x in _leaves(v)]
    if isinstance(tree, (list, tuple)) and not _is_hash_tuple(tree):
        return [x for v in tree for x in _leaves(v)]
    return [tree]


def _is_hash_tuple(t) -> bool:
    # a list of hash_fn kinds gives a tuple of plain values per tensor
    return isinstance(t, tuple) and bool(t) and all(isinstance(x, (int, float)) for x in t)


def _fmt_hash(h) -> str:
    if isinstance(h, tuple):
        return " / ".join(_fmt_hash(x) for x in h)
    if isinstance(h, int):
        return f"0x{h & 0xFFFFFFFFFFFFFFFF:016x}"
    return str(h)


def _extent(t: TensorInfo) -> tuple[int, int]:
    if t.numel() == 0:
        return (t.data_ptr, t.data_ptr)
    itemsize = getattr(t.dtype, "itemsize", 1)
    span = sum((s - 1) * st for s, st in zip(t.shape, t.stride))
    return (t.data_ptr, t.data_ptr + (span + 1) * itemsize)


def _fmt_pair(ha, hb, a: int, b: int) -> str:
    """'run 0 bitwise 0x.., run 1 0x..; norm x vs y' for (bitwise, norm) pairs."""
    if (isinstance(ha, tuple) and isinstance(hb, tuple) and len(ha) == len(hb) == 2
            and isinstance(ha[0], int) and isinstance(ha[1], float)):
        return (f"run {a} bitwise {_fmt_hash(ha[0])}, run {b} {_fmt_hash(hb[0])}; "
                f"norm {ha[1]:.10g} vs {hb[1]:.10g}")
    return f"run {a} {_fmt_hash(ha)}, run {b} {_fmt_hash(hb)}"


def _overlaps(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return a[0] < b[1] and b[0] < a[1] and a[0] < a[1] and b[0] < b[1]


@dataclass
class Divergence:
    kind: str                  # "input" or "output"
    step_a: Step
    step_b: Step
    arg: str                   # argument name ("inputs"/"output" for aten ops)
    arg_index: int | None
    hash_a: Any
    hash_b: Any
    writer: Step | None = None          # input divergence: the last recorded writer in run a
    writer_args: list = field(default_factory=list)
    # input divergence: the memory changed after its last recorded write
    # (that write's hashes match between the runs), or no recorded launch wrote it
    outside: bool = False
    inherited: list = field(default_factory=list)  # (step_a, step_b) pairs that differ later
    hints: list = field(default_factory=list)


@dataclass
class Report:
    runs: tuple[int, int]
    n_a: int
    n_b: int
    compared: int                       # aligned pairs walked
    hashed: int                         # pairs with any hash on both sides
    divergence: Divergence | None
    structural: list = field(default_factory=list)  # human-readable lines
    config_changes: Any = field(default_factory=list)  # (step_a, step_b) pairs: grid / config differ
    shape_changes: Any = field(default_factory=list)   # (step_a, step_b) pairs: argument shapes differ
    kernels_b: int = 0                                  # kernel launches in run b
    # the alignment behind the report, for kdebug.report: opcodes, aligned
    # positions pa / pb, positions (into pa) of pairs whose hashes / configs /
    # shapes differ, the divergence's position (or None)
    alignment: Any = field(default=None, repr=False, compare=False)

    @property
    def ok(self) -> bool:
        return (self.divergence is None and not self.structural and not len(self.config_changes)
                and not len(self.shape_changes))

    def __bool__(self) -> bool:
        return self.ok

    def __str__(self) -> str:
        return format_report(self)


def _first_diff(da: dict, db: dict, arg_names: Sequence[str]) -> tuple[str, Any, Any] | None:
    for name in (list(arg_names) or sorted(set(da) | set(db))):
        if name in da or name in db:
            a, b = da.get(name), db.get(name)
            if a != b:
                return name, a, b
    for name in sorted(set(da) | set(db)):  # aten trees: keys outside arg_names
        a, b = da.get(name), db.get(name)
        if a != b:
            return name, a, b
    return None


_ATOMIC_OPS = ("index_add", "scatter_add", "index_put", "scatter_reduce", "embedding_dense_backward")


def _hints(step: Step, kind: str, config_changed: bool) -> list[str]:
    out = []
    name = step.name
    if any(k in name for k in _ATOMIC_OPS):
        out.append("this accumulates with atomic adds (index_add / scatter_add / index_put(accumulate=True) / "
                   "embedding backward), whose order varies run to run: torch.use_deterministic_algorithms(True) "
                   "makes Inductor and aten use a deterministic implementation")
    elif step.kind == "kernel" and ("_red_" in name or "_per_" in name or name.startswith(("triton_red", "triton_per"))):
        out.append("reduction kernel: try torch._inductor.config.deterministic = True "
                   "(fixed reduction order), or force its reduction config")
    if kind == "output" and step.kind == "kernel" and not out:
        out.append("look for atomic adds (tl.atomic_add / atomic_add) or a split reduction in the kernel's source; "
                   "torch.use_deterministic_algorithms(True) and torch._inductor.config.deterministic = True "
                   "remove the usual causes")
    if config_changed:
        out.append("autotuning picked different launch configs in the two runs: pin them "
                   "(torch._inductor.config.max_autotune=False, or a fixed config) to compare like with like")
    return out


def _first_leaf_diff(a, b):
    la, lb = _leaves(a), _leaves(b)
    for x, y in zip(la, lb):
        if x != y:
            return x
    return la[0] if la else None


# records differing in their first and last divergence this far apart or more
# are not aligned element by element (difflib is quadratic in the worst case)
ALIGN_LIMIT = 40000


def _align(ka: torch.Tensor, kb: torch.Tensor) -> tuple[list, bool]:
    """difflib-style opcodes aligning two key columns: common prefix and suffix
    found with tensor ops, the part between aligned by difflib.  The flag is
    False when that part was too long to align."""
    na, nb = len(ka), len(kb)
    n = min(na, nb)
    neq = (ka[:n] != kb[:n]).nonzero()
    p = n if len(neq) == 0 else int(neq[0])
    if p == na == nb:
        return ([("equal", 0, na, 0, nb)] if na else []), True
    m = n - p
    neq = (ka[na - m:].flip(0) != kb[nb - m:].flip(0)).nonzero() if m else neq[:0]
    s = m if len(neq) == 0 else int(neq[0])
    a1, b1 = na - s, nb - s
    ops: list = [("equal", 0, p, 0, p)] if p else []
    aligned = True
    if (a1 - p) + (b1 - p) <= ALIGN_LIMIT:
        sm = difflib.SequenceMatcher(None, ka[p:a1].tolist(), kb[p:b1].tolist(), autojunk=False)
        ops += [(t, i1 + p, i2 + p, j1 + p, j2 + p) for t, i1, i2, j1, j2 in sm.get_opcodes()]
    else:
        ops.append(("replace", p, a1, p, b1))
        aligned = False
    if s:
        ops.append(("equal", a1, na, b1, nb))
    return ops, aligned


def _device_key(t: TensorInfo) -> tuple[int, int]:
    return (1 if t.device.type == "cuda" else 0 if t.device.type == "cpu" else -1,
            -1 if t.device.index is None else t.device.index)


def compare(run_a, run_b, *, runs: tuple[int, int] = (0, 1)) -> Report:
    """Compares two runs: DebugMode objects, kdebug.Run objects or trace file paths."""
    A, B = _Side.of(run_a), _Side.of(run_b)
    ops, aligned = _align(A.dig[:, 0], B.dig[:, 0])
    structural: list[str] = []
    seg_a, seg_b = [], []
    for tag, i1, i2, j1, j2 in ops:
        if tag == "equal":
            seg_a.append(torch.arange(i1, i2))
            seg_b.append(torch.arange(j1, j2))
            continue
        left = ", ".join(A.step(i).label() for i in range(i1, min(i2, i1 + 3))) + (" ..." if i2 - i1 > 3 else "")
        right = ", ".join(B.step(j).label() for j in range(j1, min(j2, j1 + 3))) + (" ..." if j2 - j1 > 3 else "")
        if tag == "replace":
            structural.append(f"run {runs[0]} launched [{left}] ({i2 - i1} step(s)) where run {runs[1]} "
                              f"launched [{right}] ({j2 - j1} step(s))")
        elif tag == "delete":
            structural.append(f"only run {runs[0]} launched [{left}] ({i2 - i1} step(s))")
        else:
            structural.append(f"only run {runs[1]} launched [{right}] ({j2 - j1} step(s))")
    if not aligned:
        structural.append(f"the runs differ over more than {ALIGN_LIMIT} steps: that part was not aligned")
    if len(seg_a) == 1 and len(seg_a[0]) == A.n == B.n:  # aligned one to one: no copy, no gather
        pa = pb = seg_a[0]
        da, db = A.dig, B.dig
    else:
        pa = torch.cat(seg_a) if seg_a else torch.zeros(0, dtype=torch.int64)
        pb = torch.cat(seg_b) if seg_b else torch.zeros(0, dtype=torch.int64)
        da, db = A.dig[pa], B.dig[pb]
    ne = da != db  # one pass over both digest tables
    cfg = ne[:, 1].nonzero().flatten()
    shp = ne[:, 2].nonzero().flatten()
    diff = (ne[:, 3] | ne[:, 4]).nonzero().flatten()
    hashed = int((((da[:, 3] | da[:, 4]) != 0) & ((db[:, 3] | db[:, 4]) != 0)).sum())
    config_changes = _Pairs(A, B, pa[cfg], pb[cfg])
    shape_changes = _Pairs(A, B, pa[shp], pb[shp])
    div = None
    root = None
    for k in diff.tolist():
        a, b = A.step(int(pa[k])), B.step(int(pb[k]))
        d_in = _first_diff(a.pre, b.pre, a.arg_names)
        d_out = _first_diff(a.post, b.post, a.arg_names)
        if d_in is None and d_out is None:
            continue  # equal values with unequal encodings (not expected)
        kind = "input" if d_in is not None else "output"
        arg, ha, hb = d_in if d_in is not None else d_out
        idx = a.arg_names.index(arg) if arg in a.arg_names else None
        div = Divergence(kind, a, b, arg, idx, ha, hb)
        if kind == "input":
            target = a.tensors.get(arg)
            leaf_value = _first_leaf_diff(ha, hb) if a.kind == "aten" else ha
            leaf = _C.tree_leaf_digest(leaf_value) if leaf_value is not None else 0
            lo, hi = _extent(target) if isinstance(target, TensorInfo) else (0, 0)
            dt, di = _device_key(target) if isinstance(target, TensorInfo) else (-1, -1)
            found = A.run._reader.last_writer(a.index, dt, di, lo, hi, leaf)
            if found is not None:
                w = div.writer = A.step(found[0])
                mask = found[1]
                div.writer_args = ([n for bit, n in enumerate(w.arg_names) if mask >> bit & 1]
                                   if w.kind == "kernel" else ["output"])
                # the writer's own hashes of what it wrote: equal in both runs means
                # the bytes changed after it wrote them, outside the recorded launches
                pos = (pa == found[0]).nonzero().flatten()
                wb = B.step(int(pb[int(pos[0])])) if len(pos) else None
                div.outside = wb is not None and all(
                    w.post.get(n) is not None and w.post.get(n) == wb.post.get(n) for n in div.writer_args)
            else:
                div.outside = True
        later = diff[diff > k]
        div.inherited = _Pairs(A, B, pa[later], pb[later])
        culprit = div.writer if div.writer is not None else a
        div.hints = _hints(culprit, kind, bool(len(cfg)) and int(cfg[0]) <= k)
        root = k
        break
    alignment = {"opcodes": ops, "aligned": aligned, "pa": pa, "pb": pb, "diff": diff, "config": cfg,
                 "shape": shp, "root": root}
    return Report(runs, A.n, B.n, len(pa), hashed, div, structural, config_changes, shape_changes,
                  B.run.types.count(1), alignment)


def format_report(r: Report) -> str:
    a, b = r.runs
    lines = [f"Run {b}: comparing with run {a} ... {r.kernels_b} kernels, {r.n_b - r.kernels_b} aten ops "
             f"({r.compared} aligned, {r.hashed} hashed)"]
    for s in r.structural[:10]:
        lines.append(f"  STRUCTURE: {s}")
    if len(r.structural) > 10:
        lines.append(f"  ... {len(r.structural) - 10} more structural differences")
    for x, y in r.config_changes[:5]:
        lines.append(f"  CONFIG: {x.label()} grid {x.grid} config {x.config} in run {a}, "
                     f"grid {y.grid} config {y.config} in run {b}")
    if len(r.config_changes) > 5:
        lines.append(f"  ... {len(r.config_changes) - 5} more launches with another grid or config")
    for x, y in r.shape_changes[:5]:
        lines.append(f"  SHAPES: {x.label()} has other argument shapes in run {b}")
    if len(r.shape_changes) > 5:
        lines.append(f"  ... {len(r.shape_changes) - 5} more launches with other shapes")
    d = r.divergence
    if d is None:
        if r.hashed == 0:
            lines.append("  nothing to compare: record with DebugMode.log_tensor_hashes('bitwise', hash_inputs=True)")
        elif r.ok:
            lines.append(f"  all {r.compared} launches and ops have matching inputs and outputs")
            lines.append("  still possible: work outside the recorded launches (Python, ops run with no "
                         "DebugMode), RNG state, autotuning choosing other kernels")
        return "\n".join(lines)
    s = d.step_a
    where = f"{s.label()}" + (f"  grid {s.grid}" if s.grid is not None else "")
    lines.append(f"  FIRST DIVERGENCE: {where}")
    idx = f" (index {d.arg_index})" if d.arg_index is not None else ""
    if d.kind == "output":
        lines.append(f"    inputs identical, output {d.arg}{idx} differs ({_fmt_pair(d.hash_a, d.hash_b, a, b)})")
        lines.append(f"    -> this {'kernel' if s.kind == 'kernel' else 'op'} is non-deterministic; "
                     f"{len(d.inherited)} later launches/ops inherited the difference")
    else:
        lines.append(f"    input {d.arg}{idx} differs ({_fmt_pair(d.hash_a, d.hash_b, a, b)})")
        if d.writer is not None and d.outside:
            lines.append(f"    -> last recorded write: {d.writer.label()} ({', '.join(d.writer_args)}), whose "
                         "output matched between the runs: the memory changed after it, outside the recorded "
                         "launches (an op run with no DebugMode, a raw pointer write, another thread)")
        elif d.writer is not None:
            lines.append(f"    -> likely cause: {d.writer.label()} wrote it (its {', '.join(d.writer_args)}, "
                         "not hashed): that launch is the non-deterministic one")
        else:
            lines.append("    -> no recorded launch wrote it: the difference came from outside the recorded "
                         "launches (a graph input, RNG, an op run with no DebugMode)")
        lines.append(f"    {len(d.inherited)} later launches/ops inherited the difference")
    for h in d.hints:
        lines.append(f"    hint: {h}")
    return "\n".join(lines)


def _record(fn, args, kwargs, hash_fn):
    from .mode import DebugMode

    with DebugMode() as dm:
        with DebugMode.log_tensor_hashes(hash_fn=hash_fn, hash_inputs=True):
            fn(*args, **kwargs)
    dm.operators  # noqa: B018  (drain and resolve while the mode's objects are alive)
    return dm


def _recorded_reports(fn, args, kwargs, runs: int, hash_fn) -> list[Report]:
    """Records ``fn(*args, **kwargs)`` ``runs`` times and compares each run with
    the first (encoded once); stops at the first report that is not ok or
    compared no hash.  What assert_deterministic and the pytest plugin check."""
    first = _Side.of(_record(fn, args, kwargs, hash_fn))
    reports: list[Report] = []
    for i in range(1, runs):
        rep = compare(first, _record(fn, args, kwargs, hash_fn), runs=(0, i))
        reports.append(rep)
        if not rep.ok or rep.hashed == 0:
            break
    return reports


def assert_deterministic(fn, *args, runs: int = 2, hash_fn="bitwise", **kwargs) -> list[Report]:
    """Runs ``fn(*args, **kwargs)`` ``runs`` times under a DebugMode with
    bitwise input and output hashes and compares every run with the first.
    Raises AssertionError with the first-divergence report when they differ."""
    if runs < 2:
        raise ValueError("assert_deterministic needs runs >= 2")
    reports = _recorded_reports(fn, args, kwargs, runs, hash_fn)
    rep = reports[-1]
    if not rep.ok:
        raise AssertionError("kdebug: runs differ\n" + str(rep))
    if rep.hashed == 0:
        raise AssertionError("kdebug: nothing was hashed; is fn running compiled code under this thread?\n"
                             + str(rep))
    return reports


def compare_many(runs: Iterable) -> list[Report]:
    """Every run compared with the first (encoded once)."""
    runs = list(runs)
    first = _Side.of(runs[0])
    return [compare(first, r, runs=(0, i)) for i, r in enumerate(runs[1:], 1)]
