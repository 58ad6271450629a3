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
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

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


def steps_of(run) -> list[Step]:
    """The comparable steps of a run: a kdebug DebugMode (or a list of Steps)."""
    if isinstance(run, list) and (not run or isinstance(run[0], Step)):
        return run
    ops = run.operators if hasattr(run, "operators") else run
    out: list[Step] = []
    for op in ops:
        i = len(out)
        if isinstance(op, _KernelCall):
            out.append(Step(i, "kernel", op.kernel_name, op.grid, op.config, op.launch_index,
                            dict(op.pre_hashes or {}), dict(op.post_hashes or {}),
                            dict(op.tensor_info), tuple(op.arg_names)))
        else:
            log = getattr(op, "log", None) or {}
            pre = {"inputs": log["input_hash"]} if log.get("input_hash") is not None else {}
            post = {"output": log["hash"]} if log.get("hash") is not None else {}
            out.append(Step(i, "aten", str(getattr(op, "op", op)), pre=pre, post=post))
    return out


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
    config_changes: list = field(default_factory=list)  # (step_a, step_b)

    @property
    def ok(self) -> bool:
        return self.divergence is None and not self.structural and not self.config_changes

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


def _hints(step: Step, kind: str, config_changed: bool) -> list[str]:
    out = []
    name = step.name
    if step.kind == "kernel" and ("_red_" in name or "_per_" in name or name.startswith(("triton_red", "triton_per"))):
        out.append("reduction kernel: try torch._inductor.config.deterministic = True "
                   "(fixed reduction order), or force its reduction config")
    if step.kind == "aten" and any(k in name for k in ("index_add", "scatter_add", "index_put",
                                                          "scatter_reduce", "embedding_dense_backward")):
        out.append("this op accumulates with atomics on CUDA: torch.use_deterministic_algorithms(True)")
    if kind == "output" and step.kind == "kernel" and not out:
        out.append("look for atomic adds (tl.atomic_add) or a split reduction in the kernel's source; "
                   "torch.use_deterministic_algorithms(True) and torch._inductor.config.deterministic = True "
                   "remove the usual causes")
    if config_changed:
        out.append("autotuning picked different launch configs in the two runs: pin them "
                   "(torch._inductor.config.max_autotune=False, or a fixed config) to compare like with like")
    return out


def _last_writer(steps: list[Step], before: int, target: TensorInfo | None, value) -> tuple[Step | None, list]:
    lo, hi = _extent(target) if target is not None else (0, 0)
    for s in reversed(steps[:before]):
        if s.kind == "kernel" and target is not None and hi > lo:
            names = [n for n, t in s.tensors.items()
                     if isinstance(t, TensorInfo) and t.writes and t.device == target.device
                     and _overlaps(_extent(t), (lo, hi))]
            if names:
                return s, names
        if s.kind == "aten" and value is not None and s.post and value in _leaves(s.post.get("output")):
            return s, ["output"]
    return None, []


def _overlaps(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return a[0] < b[1] and b[0] < a[1] and a[0] < a[1] and b[0] < b[1]


def compare(run_a, run_b, *, runs: tuple[int, int] = (0, 1)) -> Report:
    """Compares two runs (kdebug DebugMode objects, or lists of Steps)."""
    A, B = steps_of(run_a), steps_of(run_b)
    sm = difflib.SequenceMatcher(None, [s.key for s in A], [s.key for s in B], autojunk=False)
    pairs: list[tuple[Step, Step]] = []
    structural: list[str] = []
    for tag, i1, i2, j1, j2 in sm.get_opcodes():
        if tag == "equal":
            pairs.extend(zip(A[i1:i2], B[j1:j2]))
            continue
        left = ", ".join(s.label() for s in A[i1:i1 + 3]) + (" ..." if i2 - i1 > 3 else "")
        right = ", ".join(s.label() for s in B[j1:j1 + 3]) + (" ..." if j2 - j1 > 3 else "")
        if tag == "replace":
            structural.append(f"run {runs[0]} launched [{left}] where run {runs[1]} launched [{right}]")
        elif tag == "delete":
            structural.append(f"only run {runs[0]} launched [{left}] ({i2 - i1} step(s))")
        else:
            structural.append(f"only run {runs[1]} launched [{right}] ({j2 - j1} step(s))")
    by_a = {id(x): y for x, y in pairs}
    config_changes = [(a, b) for a, b in pairs if a.kind == "kernel" and (a.grid, a.config) != (b.grid, b.config)]
    changed = {id(a) for a, _ in config_changes}
    hashed = sum(1 for a, b in pairs if (a.pre or a.post) and (b.pre or b.post))
    div = None
    for n, (a, b) in enumerate(pairs):
        d_in = _first_diff(a.pre, b.pre, a.arg_names)
        d_out = _first_diff(a.post, b.post, a.arg_names)
        if d_in is None and d_out is None:
            continue
        kind = "input" if d_in is not None else "output"
        arg, ha, hb = d_in if d_in is not None else d_out
        idx = a.arg_names.index(arg) if arg in a.arg_names else None
        div = Divergence(kind, a, b, arg, idx, ha, hb)
        if kind == "input":
            div.writer, div.writer_args = _last_writer(A, a.index, a.tensors.get(arg), ha)
            w = div.writer
            # the writer's own hashes of what it wrote: equal in both runs means
            # the bytes changed after it wrote them, outside the recorded launches
            wb = by_a.get(id(w)) if w is not None else None
            wrote_same = wb is not None and all(
                w.post.get(n) is not None and w.post.get(n) == wb.post.get(n) for n in div.writer_args)
            div.outside = w is None or wrote_same
        div.inherited = [(x, y) for x, y in pairs[n + 1:] if x.pre != y.pre or x.post != y.post]
        culprit = div.writer if div.writer is not None else a
        div.hints = _hints(culprit, kind, id(a) in changed or any(id(x) in changed for x, _ in pairs[:n]))
        break
    return Report(runs, len(A), len(B), len(pairs), hashed, div, structural, config_changes)


def format_report(r: Report) -> str:
    a, b = r.runs
    lines = [f"Run {b}: comparing with run {a} ... {r.n_b} launches and ops ({r.compared} aligned, {r.hashed} hashed)"]
    for s in r.structural[:10]:
        lines.append(f"  STRUCTURE: {s}")
    if len(r.structural) > 10:
        lines.append(f"  ... {len(r.structural) - 10} more structural differences")
    for x, y in r.config_changes[:5]:
        lines.append(f"  CONFIG: {x.label()} grid {x.grid} config {x.config} in run {a}, "
                     f"grid {y.grid} config {y.config} in run {b}")
    d = r.divergence
    if d is None:
        if r.hashed == 0:
            lines.append("  nothing to compare: record with DebugMode.log_tensor_hashes('bitwise', hash_inputs=True)")
        elif not r.structural and not r.config_changes:
            lines.append(f"  all {r.compared} launches and ops have matching inputs and outputs")
            lines.append("  still possible: work outside the recorded launches (Python, ops run with no "
                         "DebugMode), RNG state, autotuning choosing other kernels")
        return "\n".join(lines)
    s = d.step_a
    where = f"{s.label()}" + (f"  grid {s.grid}" if s.grid is not None else "")
    lines.append(f"  FIRST DIVERGENCE: {where}")
    idx = f" (index {d.arg_index})" if d.arg_index is not None else ""
    if d.kind == "output":
        lines.append(f"    inputs identical, output {d.arg}{idx} differs "
                     f"(run {a} {_fmt_hash(d.hash_a)}, run {b} {_fmt_hash(d.hash_b)})")
        lines.append(f"    -> this {'kernel' if s.kind == 'kernel' else 'op'} is non-deterministic; "
                     f"{len(d.inherited)} later launches/ops inherited the difference")
    else:
        lines.append(f"    input {d.arg}{idx} differs (run {a} {_fmt_hash(d.hash_a)}, run {b} {_fmt_hash(d.hash_b)})")
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


def assert_deterministic(fn, *args, runs: int = 2, hash_fn="bitwise", **kwargs) -> list[Report]:
    """Runs ``fn(*args, **kwargs)`` ``runs`` times under a DebugMode with
    bitwise input and output hashes and compares every run with the first.
    Raises AssertionError with the first-divergence report when they differ."""
    if runs < 2:
        raise ValueError("assert_deterministic needs runs >= 2")
    first = _record(fn, args, kwargs, hash_fn)
    reports = []
    for i in range(1, runs):
        rep = compare(first, _record(fn, args, kwargs, hash_fn), runs=(0, i))
        reports.append(rep)
        if not rep.ok:
            raise AssertionError("kdebug: runs differ\n" + str(rep))
        if rep.hashed == 0:
            raise AssertionError("kdebug: nothing was hashed; is fn running compiled code under this thread?\n"
                                 + str(rep))
    return reports


def compare_many(runs: Iterable) -> list[Report]:
    """Every run compared with the first."""
    runs = list(runs)
    return [compare(runs[0], r, runs=(0, i)) for i, r in enumerate(runs[1:], 1)]
