"""Run-to-run comparison: name every step where two runs start to differ.

``compare(run_a, run_b)`` aligns two recordings launch by launch as a diff tool
would (structural differences are reported, never fatal), then walks the
aligned steps with their data flow (Note [Data flow] in dataflow.py: each
tensor a step reads is linked to the last earlier step that wrote overlapping
memory).  Record with ``DebugMode.log_tensor_hashes("bitwise", hash_inputs=True)``.

Every step whose written hashes differ is a *root* (every input it read was
identical: it is non-deterministic itself), an *heir* (a differing input traces
to an earlier differing write) or an *outside* root (a differing input traces
to no differing recorded write).  Each root counts the later steps whose
outputs changed because of it; a root that changed nothing later and left no
differing tensor in memory that nothing read is *benign* (RNG bookkeeping,
scratch) and does not make the runs differ.  The remaining roots are ranked by
consequence; the first is the report's FIRST DIVERGENCE.
"""
from __future__ import annotations

import difflib
import functools
import os
import re
from dataclasses import dataclass, field
from typing import Any, Iterable

import torch

from . import _C, _termtext, _upstream, dataflow, program_reads
from .calls import TensorInfo, _KernelCall
from .final_state import FinalState
from .hashing import Stats


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
    reads: list = field(default_factory=list)    # dataflow.Slot per tensor read (Note [Data flow])
    writes: list = field(default_factory=list)   # dataflow.Slot per tensor written
    flow_known: bool = True                      # False: an op recorded without extents
    labels: dict = field(default_factory=dict)   # hash key -> what to call it

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
        aliased = _aliased_inputs(tensors)
        for n in aliased:
            pre.pop(n, None)
        names = tuple(op.arg_names)
        # aliased inputs keep their read slot: no pre-hash to compare, but linked by memory
        reads, writes = dataflow.kernel_slots(tensors, names)
        labels = {s.key: s.label for s in reads + writes}
        return Step(i, "kernel", op.kernel_name, op.grid, op.config, op.launch_index,
                    pre, dict(op.post_hashes or {}), tensors, names, reads, writes, True, labels)
    log = getattr(op, "log", None) or {}
    ext = getattr(op, "_kd_extents", None)
    pre = dataflow.tree_values(log.get("input_hash"), "in", ext.inputs if ext else None)
    post = dataflow.tree_values(log.get("hash"), "out", ext.outputs if ext else None)
    name = _op_name(op)
    if name in program_reads.VALUE_READS:
        if pre:  # Note [Program reads]: the program got the values it read
            post[VALUE] = next(iter(pre.values()))
    elif "hash" not in log:  # a print's value is the digest of the text it made  # Note [Returned values] (csrc/core/kd_trace_digest.c)
        value = returned_value(_op_text(op))
        if value is not None:
            post[VALUE] = value
    slots = dataflow.op_slots(ext, getattr(op, "op", None))
    reads, writes = slots if slots is not None else ([], [])
    if name.startswith("aten::set_"):
        # it shows a storage's bytes: it reads the memory its output now covers (whoever wrote that
        # storage through another tensor is where a difference in it came from)
        reads = reads + [dataflow.Slot("storage/" + s.key, "its storage", s.device, s.lo, s.hi) for s in writes]
    labels = {s.key: s.label for s in reads + writes}
    if VALUE in post:
        labels[VALUE] = _VALUE_SLOT.label
    return Step(i, "aten", name, pre=pre, post=post, reads=reads, writes=writes,
                flow_known=slots is not None, labels=labels)


# Note [Returned values] (csrc/core/kd_trace_digest.c): an op that returns no
# tensor is compared by the value it handed the program, under this key of its
# Step's post, as the output "returned value"
VALUE = "value"
_VALUE_WORDS = frozenset({"True", "False", "None", "inf", "nan", "e", "E", "j", "infj", "nanj"})
_VALUE_CHARS = frozenset("0123456789.+-, ()[]")
_VALUE_SLOT = dataflow.Slot(VALUE, "returned value", ("?", -1), 0, 0)
_STORAGE_SLOT = dataflow.Slot("storage", "the storage it was rebuilt on (torch.load, unpickling, a DataLoader "
                              "worker's batch)", ("?", -1), 0, 0)


def returned_value(text: str) -> str | None:
    """The output of an op's rendered text when it is a plain value (numbers,
    True / False / None, inf / nan, tuples and lists of them), else None:
    the same rule as kd_text_value_digest."""
    k = text.find("  ->  ")
    if k < 0:
        return None
    v = text[k + 6:]
    if not v:
        return None
    i = 0
    while i < len(v):
        c = v[i]
        if ("A" <= c <= "Z") or ("a" <= c <= "z"):
            j = i
            while j < len(v) and (("A" <= v[j] <= "Z") or ("a" <= v[j] <= "z")):
                j += 1
            if v[i:j] not in _VALUE_WORDS:
                return None
            i = j
        elif c in _VALUE_CHARS:
            i += 1
        else:
            return None
    return v


def _op_text(op) -> str:
    """An aten-op entry's rendered text, without its log (a trace's or a live call's)."""
    text = getattr(op, "_text", None)
    if text is not None:
        return text
    from .trace import stored_text

    saved = getattr(op, "log", None)
    try:
        op.log = None
        return stored_text(op.render([]))  # as its trace would hold it
    except Exception:  # noqa: BLE001 (an entry kdebug cannot render is compared without its value)
        return ""
    finally:
        op.log = saved


def _top_args(t: str) -> list[tuple[int, int]]:
    """The spans of an op text's top-level arguments (inside its first
    parentheses; brackets inside an argument kept with it)."""
    open_at = t.find("(")
    if open_at < 0:
        return []
    spans, depth, start = [], 0, open_at + 1
    for k in range(open_at + 1, len(t)):
        c = t[k]
        if c in "([":
            depth += 1
        elif c in ")]":
            if depth == 0:
                spans.append((start, k))
                return spans
            depth -= 1
        elif c == "," and depth == 0:
            spans.append((start, k))
            start = k + 2 if t[k + 1:k + 2] == " " else k + 1
    spans.append((start, len(t)))
    return spans


def _text_delta(ta: str, tb: str, a: "int | str", b: "int | str", width: int = 70) -> str:
    """Where two op texts differ: 'op(..., <the arguments that differ>, ...)
    in run 0, op(..., <theirs>, ...) in run 1', whole arguments (never cut
    inside one)."""
    ta, tb = ta.split("  ->  ")[0], tb.split("  ->  ")[0]
    p = 0
    while p < min(len(ta), len(tb)) and ta[p] == tb[p]:
        p += 1
    s = 0
    while s < min(len(ta), len(tb)) - p and ta[len(ta) - 1 - s] == tb[len(tb) - 1 - s]:
        s += 1

    def part(t: str) -> str:
        spans = _top_args(t)
        d0, d1 = p, max(len(t) - s, p + 1)
        hit = [k for k, (x, y) in enumerate(spans) if x < d1 and y >= d0]
        if not spans or not hit:  # the name differs, or no argument list: the start of the text
            return t[:width] + ("..." if len(t) > width else "")
        k0, k1 = hit[0], hit[-1]
        body = ", ".join(t[x:y] for x, y in spans[k0:k1 + 1])
        body = body[:width] + "..." if len(body) > width else body
        return (t[:t.find("(") + 1] + ("..., " if k0 > 0 else "") + body
                + (", ..." if k1 < len(spans) - 1 else "") + ")")

    return f"{part(ta)} in {side_name(a)}, {part(tb)} in {side_name(b)}"


def _op_name(op) -> str:
    """The name an aten-op entry is compared by (a trace's or a live call's, as its trace would hold it)."""
    if hasattr(op, "_name"):
        return op._name
    from .trace import stored_text

    return stored_text(_upstream.get_call_name(op))


def steps_of(run) -> list[Step]:
    """Every comparable step of a run (a DebugMode, a kdebug.Run or a trace path)."""
    side = _Side.of(run)
    return [side.step(i) for i in range(side.n)]


def _aliased_inputs(tensors: dict) -> list[str]:
    """Read-only arguments whose memory overlaps an argument the same launch
    writes, other than one it writes whole.  Inductor passes a
    concatenation's whole buffer as an input while the kernel writes its
    slices: before the launch part of it holds memory nobody wrote yet, so
    its pre-launch hash is not compared (what the kernel really read shows in
    an earlier writer's outputs or in its own).  An input the launch then
    writes over exactly (the same memory, as in_ptr and out_ptr: a compiled
    function that updates its argument in place, BatchNorm's running
    statistics, an EMA) held the input's values before the launch, and its
    pre-hash is compared: a difference in it is the input's (found by an
    adversarial pass: such a kernel was called non-deterministic with
    "inputs identical" when the state it was given differed)."""
    written = [(dataflow.tensor_extent(t), dataflow.tensor_dense(t))
               for t in tensors.values() if isinstance(t, TensorInfo) and t.writes]
    if not written:
        return []
    aliased = []
    for n, t in tensors.items():
        if not (isinstance(t, TensorInfo) and t.reads and not t.writes):
            continue
        ext = dataflow.tensor_extent(t)
        over = [(w, dense) for w, dense in written if _overlaps(ext, w)]
        if over and not any(w == ext and dense and dataflow.tensor_dense(t) for w, dense in over):
            aliased.append(n)
    return aliased


class _Side:
    """One run as the engine sees it: a digest row per record (key, config,
    shape, pre, post: Note [Launch table] in csrc/core/kd_launch_table.h) and
    Steps made on demand.  A trace's rows come from its reader; a live
    DebugMode's launch rows from its recorder's launch table and its aten
    ops' rows from their hash trees, digested as their trace records would
    be, with nothing encoded.  ``trace`` is the run as a kdebug.Run (a live
    run is encoded into one only when something asks: the HTML report, the
    search for an outside difference's last writer)."""

    def __init__(self, run):
        from .trace import Run, load

        if isinstance(run, (str, os.PathLike)):
            run = load(os.fspath(run))
        if isinstance(run, Run):
            self._trace = run
            self._dm = None
            self._call = run.call
            self.n = len(run)
            self.meta = run.meta
            self.kernels = run.types.count(1)
            self.dig = torch.frombuffer(run.digests(), dtype=torch.int64).view(self.n, 5) \
                if self.n else torch.zeros((0, 5), dtype=torch.int64)
        elif hasattr(run, "operators") and hasattr(run, "_recorder"):
            ops = list(run.operators)
            self._trace = None
            self._dm = run
            self._call = ops.__getitem__
            self.n = len(ops)
            self.meta = _live_meta(run)
            self.dig, self.kernels = _live_digests(ops, run)
        else:
            raise TypeError(f"compare() takes DebugMode objects, kdebug.Run objects or trace file paths, "
                            f"not {type(run).__name__}")
        self._steps: dict[int, Step] = {}

    @property
    def trace(self):
        """The run as a kdebug.Run (a live run: encoded on first use)."""
        if self._trace is None:
            from .trace import Run, save

            self._trace = Run(save(self._dm, None), "<DebugMode>")
        return self._trace

    @classmethod
    def of(cls, run) -> "_Side":
        return run if isinstance(run, _Side) else cls(run)

    def gaps(self) -> list[str]:
        """What this run's recording missed (Note [A match needs whole
        recordings] in kdebug/cli.py): [] when it recorded every launch."""
        if self._dm is None:
            run = self._trace
            return [] if run.complete else (run.problems() or ["the recording is incomplete"])
        if self._dm.complete:
            return []
        from .trace import lost_launches

        st = self._dm.kernel_stats
        out = lost_launches(st)
        if st.get("unrecorded_graph_replays"):  # (a live recording's own counter: no trace holds it)
            out.append(f"{st['unrecorded_graph_replays']} replay(s) of CUDA graphs captured without kdebug were "
                       "not recorded")
        return out or ["the recording is incomplete"]

    def step(self, i: int) -> Step:
        s = self._steps.get(i)
        if s is None:
            s = self._steps[i] = _step(i, self._call(i))
        return s


def _live_meta(dm) -> dict:
    """The checked META keys a trace of dm would hold that compare reads (its final state)."""
    import json

    from .trace import check_meta

    fs = getattr(dm, "final_state", None)
    return check_meta(json.dumps({"final_state": fs})) if fs is not None else {}


def _live_digests(ops: list, dm) -> tuple[torch.Tensor, int]:
    """The digest rows of a live run's operators entries (as its trace's
    reader would compute them) and how many are kernel launches: launches
    from the recorder's launch table, aten ops from their hash trees."""
    from .trace import _op_record

    rec = dm._recorder
    table = _C.launch_digests(rec) if rec is not None else b""
    launch = torch.frombuffer(bytearray(table), dtype=torch.int64).view(-1, 5) if table \
        else torch.zeros((0, 5), dtype=torch.int64)
    rows = []
    op_rows = []
    nl = launch.shape[0]  # op rows follow the launch rows
    attributes = dm.record_tensor_attributes
    for op in ops:
        if isinstance(op, _KernelCall):
            if op._recorder is not rec:
                raise ValueError("a kernel record from another recorder")
            rows.append(op._launch.store_index)
        else:
            rows.append(nl + len(op_rows))
            op_rows.append(_op_digests(_op_record(op, attributes)))
    if op_rows:
        launch = torch.cat([launch, torch.frombuffer(bytearray(b"".join(op_rows)), dtype=torch.int64).view(-1, 5)])
    dig = launch[torch.tensor(rows, dtype=torch.int64)] if rows else torch.zeros((0, 5), dtype=torch.int64)
    return dig, len(ops) - len(op_rows)


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


def _fmt_hash(h) -> str:
    if isinstance(h, tuple):
        return " / ".join(_fmt_hash(x) for x in h)
    if isinstance(h, int):
        return f"0x{h & 0xFFFFFFFFFFFFFFFF:016x}"
    return str(h)


def _same_float(x: float, y: float) -> bool:
    return x == y or (x != x and y != y)


def stats_diff(sa: Stats, sb: Stats) -> str:
    """How big a difference is, from two runs' stats hashes (Note [The stats
    hash] in csrc/core/kd_hash.h): 'absmax 3.1e+02 both; sum differs by +4e-07
    (1.3e-09 relative); nan 0 vs 3'.  Sums and maxima are of the finite
    elements; the relative sum difference is to the larger |sum|."""
    if _same_float(sa.absmax, sb.absmax):
        parts = [f"absmax {sa.absmax:.3g} both"]
    else:
        parts = [f"absmax {sa.absmax:.3g} vs {sb.absmax:.3g}"]
    if _same_float(sa.sum, sb.sum):
        parts.append(f"sum {sa.sum:.6g} both")
    else:
        d = sb.sum - sa.sum
        scale = max(abs(sa.sum), abs(sb.sum))
        rel = f"{abs(d) / scale:.2g} relative" if scale > 0 and d == d else "relative: n/a"
        parts.append(f"sum differs by {d:+.6g} ({rel}; {sa.sum:.6g} vs {sb.sum:.6g})")
    for name in ("nan", "posinf", "neginf"):
        x, y = getattr(sa, name), getattr(sb, name)
        if x or y:
            label = {"nan": "nan", "posinf": "+inf", "neginf": "-inf"}[name]
            parts.append(f"{label} {x} both" if x == y else f"{label} {x} vs {y}")
    return "; ".join(parts)


def side_name(x: "int | str") -> str:
    """'run 1' for run number 1; a label ('rank 1': kdebug/crossrank.py) as it is."""
    return f"run {x}" if isinstance(x, int) else str(x)


def _fmt_pair(ha, hb, a: "int | str", b: "int | str") -> str:
    """'run 0 bitwise 0x.., run 1 0x..; norm x vs y' for (bitwise, norm)
    pairs; with the stats hash, how big the difference is (stats_diff)."""
    if (isinstance(ha, tuple) and isinstance(hb, tuple) and len(ha) == len(hb) == 2
            and isinstance(ha[0], int) and isinstance(ha[1], Stats) and isinstance(hb[1], Stats)):
        return (f"{side_name(a)} bitwise {_fmt_hash(ha[0])}, {side_name(b)} {_fmt_hash(hb[0])}; "
                f"{stats_diff(ha[1], hb[1])}")
    if isinstance(ha, Stats) and isinstance(hb, Stats):
        return stats_diff(ha, hb)
    if (isinstance(ha, tuple) and isinstance(hb, tuple) and len(ha) == len(hb) == 2
            and isinstance(ha[0], int) and isinstance(ha[1], float)):
        return (f"{side_name(a)} bitwise {_fmt_hash(ha[0])}, {side_name(b)} {_fmt_hash(hb[0])}; "
                f"norm {ha[1]:.10g} vs {hb[1]:.10g}")
    return f"{side_name(a)} {_fmt_hash(ha)}, {side_name(b)} {_fmt_hash(hb)}"


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
    # input divergence: run b read what this step wrote, which is not the counterpart of run a's
    # writer (Note [Other tensors passed]): (step in b, its counterpart in a or None)
    other_writer: tuple | None = None
    # input divergence: the memory changed after its last recorded write
    # (that write's hashes match between the runs), or no recorded launch wrote it
    outside: bool = False
    inherited: list = field(default_factory=list)  # (step_a, step_b) pairs that differ later
    hints: list = field(default_factory=list)
    # a kernel's identity as run a's recording knew it: the FX nodes it
    # fuses, the user's source lines, its module (Note [Kernel provenance])
    identity: list = field(default_factory=list)


@dataclass
class Root:
    """A step whose outputs differ between the runs while every input it read
    was identical (``kind`` "root"), or whose differing input came from no
    differing recorded write ("outside"); Note [Data flow]."""

    kind: str                   # "root" or "outside"
    step_a: Step
    step_b: Step
    outputs: list               # (label, hash in run a, hash in run b) of each differing output
    outside_inputs: list = field(default_factory=list)  # (label, hash a, hash b) of inputs from outside
    consequences: int = 0       # later steps whose outputs changed because of it (transitively)
    code: tuple | None = None   # a kernel compiled from other source in the two runs: (sha256 a, sha256 b)
    sent: int = 0               # collectives that read its difference and returned identical outputs: it
                                # went to the other ranks, mixed with theirs (never benign)
    values: list = field(default_factory=list)  # (step label, value a, value b) of the ops, this one or
                                # later ones it changed, that handed the program another value (Note
                                # [Returned values]): never benign
    reaches_end: int = 0        # differing writes from it still in memory when the recording ended:
                                # kept tensors, read or not (Note [Final state]), or, where the final
                                # state is not known, the unread ones (possibly kept)
    kept_known: bool = False    # the final state said which of them were kept
    freed: int = 0              # differing writes from it that nothing recorded read, in memory the
                                # program no longer held at the end (Note [Final state])
    absorbed: int = 0           # later steps that read its differences and wrote identical outputs
    benign: bool = False        # changes no later output and nothing that outlives the recording
    position: int = 0           # aligned position
    first_read: int | None = None  # the aligned position where the program first read another value from it
    keys: list = field(default_factory=list)  # hash keys (argument names) of `outside_inputs` or else `outputs`
    writer: Step | None = None  # "outside": the last recorded write of that input's memory, when one is known
    writer_args: list = field(default_factory=list)
    other_writer: tuple | None = None  # "outside": Divergence.other_writer (Note [Other tensors passed])
    writer_paired: bool = True  # "outside": its writer has a counterpart in the other run
    only_b_writer: Step | None = None  # "outside": run b last wrote that memory with a step run a did not run
    unchecked: list = field(default_factory=list)  # "root": labels of inputs it read that were not compared
                                # (Note [Inputs not compared])
    after_read: str | None = None  # the label of an earlier root whose other values the program read
                                # (Note [Differences the program carried])


@dataclass
class Report:
    runs: tuple  # (side a, side b): run numbers, or labels (side_name)
    n_a: int
    n_b: int
    compared: int                       # aligned pairs walked
    hashed: int                         # pairs with any hash on both sides
    divergence: Divergence | None
    structural: list = field(default_factory=list)  # human-readable lines
    config_changes: Any = field(default_factory=list)  # (step_a, step_b) pairs: grid / config differ
    shape_changes: Any = field(default_factory=list)   # (step_a, step_b) pairs: argument shapes differ
    kernels_b: int = 0                                  # kernel launches in run b
    roots: list = field(default_factory=list)   # consequential Roots, ranked (the first is the divergence)
    benign: list = field(default_factory=list)  # benign Roots: differences nothing later depends on
    # the alignment behind the report, for kdebug.report: opcodes, aligned
    # positions pa / pb, positions (into pa) of pairs whose hashes / configs /
    # shapes differ, the divergence's position (or None)
    alignment: Any = field(default=None, repr=False, compare=False)
    # steps present in one run only that are all uninitialized allocations
    # (Note [Allocation-only differences]): human-readable lines, not structural
    allocations: list = field(default_factory=list)
    # steps re-paired with the same computation elsewhere in the other run
    # (Note [Reordered steps]): human-readable lines, not differences
    reordered: list = field(default_factory=list)
    # in-process runs (assert_deterministic, the pytest plugin): inputs run b read from memory run a
    # wrote last, none of run b's steps before (Note [State a run left]): human-readable lines
    carried: list = field(default_factory=list)
    notes: list = field(default_factory=list)  # lines printed last, as "note: ..."
    settings: list = field(default_factory=list)  # (name, value a, value b) of numeric settings that differ
                                                  # (Note [Settings that change the numbers] in trace.py)
    # what either recording missed, "run N: ..." lines (Note [A match needs whole recordings])
    gaps: list = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """No difference was found in what was recorded.  Whether everything
        was recorded is ``gaps``; ``verdict`` says both."""
        return (self.divergence is None and not self.structural and not len(self.config_changes)
                and not len(self.shape_changes))

    @property
    def verdict(self) -> str:
        """'differ' (a difference in the recorded parts), 'match', or 'no
        verdict': the recorded parts match, but a recording missed launches
        (``gaps``), and what it missed was not compared (Note [A match needs
        whole recordings]), or nothing was hashed, so nothing was compared
        but names and shapes."""
        if not self.ok:
            return "differ"
        return "no verdict" if self.gaps or self.hashed == 0 else "match"

    def __bool__(self) -> bool:
        return self.verdict == "match"

    def __str__(self) -> str:
        return format_report(self)


_ATOMIC_OPS = ("index_add", "scatter_add", "index_put", "scatter_reduce", "embedding_dense_backward")


@functools.lru_cache(maxsize=512)
def draws_random(name: str) -> bool:
    """Whether aten op ``name`` ('aten::randint.low_out') draws from a random
    generator (torch.Tag.nondeterministic_seeded); False for anything else."""
    try:
        ns, rest = name.split("::", 1)
        base, _, overload = rest.partition(".")
        op = getattr(getattr(getattr(torch.ops, ns), base), overload or "default")
        return torch.Tag.nondeterministic_seeded in op.tags
    except (AttributeError, ValueError, RuntimeError):
        return False


def _hints(step: Step, kind: str, config_changed: bool) -> list[str]:
    out = []
    name = step.name
    if step.kind == "aten" and kind == "output" and draws_random(name):
        out.append("this op draws random numbers; with identical inputs, the generator it drew from was in "
                   "another state: seed it before the work (torch.manual_seed(...)), or pass a seeded "
                   "torch.Generator (Inductor draws its kernels' RNG seeds from the default generator with "
                   "aten::randint.low_out)")
    elif any(k in name for k in _ATOMIC_OPS):
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


# records differing in their first and last divergence this far apart or more
# are not aligned element by element (difflib is quadratic in the worst case)
ALIGN_LIMIT = 40000


# Note [Aligning by content]
# Runs are aligned on each step's key (its name, for an aten op): a program
# whose steps all have the same names in the same order pairs position by
# position, and a root and everything it changed line up with their
# counterparts.  Where the sequences of names differ, names alone can pair the
# wrong steps: a training loop's iterations all look alike, and a DataLoader
# with workers rebuilds each batch it receives (aten::empty + aten::set_ from
# the worker's storage) when it arrives, one or two per next() call as timing
# has it; aligned by names, iteration k of one run paired with iteration k+1
# of the other (different weights: invented roots at every addmm, found by a
# trust pass).  So where the names differ, the part between the common prefix
# and suffix is aligned first on each step's whole digest row (name, shapes,
# input and output hashes): identical computations pair whatever their
# position; what is left between two such pairs is aligned by names, as
# before (after a real root every step differs, so that is where its heirs
# pair with their counterparts).


def _content_keys(side: "_Side", weak: torch.Tensor) -> torch.Tensor:
    """Each step's key with its shapes, input and output digests mixed in."""
    d = side.dig
    return weak ^ (d[:, 2] * 0x2545F4914F6CDD1D) ^ (d[:, 3] * 0x1B873593A1D2E3F5) ^ (d[:, 4] * 0x5851F42D4C957F2D)


def _by_content(wa: list, wb: list, sa: list, sb: list) -> list:
    """Opcodes aligning two stretches: identical digest rows first, the gaps
    between them by names (Note [Aligning by content])."""
    ops: list = []
    for t, i1, i2, j1, j2 in difflib.SequenceMatcher(None, sa, sb, autojunk=False).get_opcodes():
        if t == "equal" or i1 == i2 or j1 == j2:
            ops.append((t, i1, i2, j1, j2))
            continue
        sm = difflib.SequenceMatcher(None, wa[i1:i2], wb[j1:j2], autojunk=False)
        ops += [(u, x1 + i1, x2 + i1, y1 + j1, y2 + j1) for u, x1, x2, y1, y2 in sm.get_opcodes()]
    merged: list = []
    for op in ops:
        if merged and merged[-1][0] == op[0] == "equal" and merged[-1][2] == op[1] and merged[-1][4] == op[3]:
            merged[-1] = ("equal", merged[-1][1], op[2], merged[-1][3], op[4])
        else:
            merged.append(op)
    return merged


# Note [Reordered steps]
# Two runs can do the same independent computations in another order with
# the same names in the same places: per-task heads evaluated in the order of
# a Python set (its order follows PYTHONHASHSEED, another in every process),
# dict insertion order that depends on data.  Paired by position, head A of
# one run met head B of the other, and the first of them was reported as an
# input difference "from outside" whose memory "changed after its last
# write" (found by a trust pass).  So after alignment, among the pairs whose
# digest rows differ, a step of run a is re-paired with a step of run b,
# within REORDER_WINDOW aligned positions, whose whole digest row (name,
# shapes, input and output hashes) is identical: the same computation, run
# elsewhere -- except a step that hands the program a value (a print, an
# .item(), a save: Note [Returned values]): which value the program got at
# which point is its output (results stored under names in the order of a
# set: printed or saved under the wrong names), so those keep their place.
# Such steps are listed as REORDERED, not as differences; the
# pairs left over keep their order among themselves.  Only identical rows
# are re-paired, so what the reordering changed (a sum of the heads taken in
# another order) still differs, and is reported.
REORDER_WINDOW = 4096
_REORDER_LIMIT = 200_000  # differing pairs beyond which no re-pairing is tried (a Python loop each)


def _match_identical(items_a: list[int], keys_a: list[int], items_b: list[int], keys_b: list[int],
                     stays, hands_value=None) -> dict[int, int]:
    """Each item of a (in order) matched to the nearest free item of b with
    the same key within REORDER_WINDOW (items are positions, in order;
    Note [Reordered steps]); ``stays(i, j)``: pairing i with j moves nothing,
    so a step that hands the program a value (``hands_value(i)``) may only
    take such a partner."""
    import bisect

    where: dict[int, list[int]] = {}
    for j, kb in zip(items_b, keys_b):
        where.setdefault(kb, []).append(j)
    used: set[int] = set()
    match: dict[int, int] = {}
    for i, ka in zip(items_a, keys_a):
        cand = where.get(ka)
        if not cand:
            continue
        at = bisect.bisect_left(cand, i - REORDER_WINDOW)
        while at < len(cand) and cand[at] in used:
            at += 1
        if at >= len(cand) or cand[at] > i + REORDER_WINDOW:
            continue
        if hands_value is not None and not stays(i, cand[at]) and hands_value(i):
            continue  # which value the program got where is the program's output: never moved
        match[i] = cand[at]
        used.add(cand[at])
    return match


def _reorders(ca: torch.Tensor, cb: torch.Tensor, pa: torch.Tensor, pb: torch.Tensor,
              rows: torch.Tensor, hands_value=None) -> tuple[torch.Tensor, list[int]] | None:
    """Note [Reordered steps]: (pb re-paired, the aligned positions whose
    step moved) among the differing pairs ``rows``, or None when none moved."""
    if len(rows) < 2 or len(rows) > _REORDER_LIMIT:
        return None
    ks = rows.tolist()
    match = _match_identical(ks, ca[pa[rows]].tolist(), ks, cb[pb[rows]].tolist(), lambda k, j: k == j,
                             None if hands_value is None else lambda k: hands_value(int(pa[k])))
    used = set(match.values())
    if not any(k != j for k, j in match.items()):
        return None
    new_pb = pb.clone()
    old = {k: int(pb[k]) for k in ks}
    left_b = [k for k in ks if k not in used]
    left_a = [k for k in ks if k not in match]
    for k, j in match.items():
        new_pb[k] = old[j]
    for k, j in zip(left_a, left_b):  # the rest keep their order among themselves
        new_pb[k] = old[j]
    return new_pb, sorted(k for k, j in match.items() if k != j)


# Note [Steps left unaligned by another order]
# Interleaved threads (kdebug hunt --all-threads over a program whose threads
# each call a compiled function) run the same launches in another order in
# every run.  Aligned by names, such stretches leave steps of each run with no
# partner (an 'insert' and a 'delete' of the same kernel), and the pairs
# around them meet other work: a deterministic program was called structurally
# different, with a differing kernel (found by a trust pass).  So the steps
# alignment left unpaired are matched, with the differing pairs, to identical
# steps (name, shapes, input and output hashes) of the other run, wherever
# they ran (within REORDER_WINDOW positions) -- and the result is taken only
# when it explains every unpaired step: each found an identical partner, and
# every differing pair was either kept whole or both its steps found
# identical partners.  Anything less (one run did work the other did not, a
# value handed to the program at another point, work whose values differ)
# keeps the alignment as it was: STRUCTURE and roots, as before (a review
# found that pairing the leftovers by name hid an extra op as a match,
# moved .item() values, and called a value written by a step only one run
# ran 'from outside').  Steps that hand the program a value never move
# (Note [Reordered steps]).


def _repair_unaligned(ca: torch.Tensor, cb: torch.Tensor, pa: torch.Tensor, pb: torch.Tensor,
                      rows: torch.Tensor, un_a: list[int], un_b: list[int], hands_value=None):
    """Note [Steps left unaligned by another order]: (pa, pb, moved a-steps)
    with every unaligned step of ``un_a`` / ``un_b`` paired to an identical
    step, or None when that does not explain them all."""
    if not un_a or len(un_a) != len(un_b) or len(un_a) + len(rows) > _REORDER_LIMIT:
        return None
    rows_l = rows.tolist()
    old_b = {int(pa[k]): int(pb[k]) for k in rows_l}  # differing pairs: a-step -> its b-step
    pool_a = sorted(list(old_b) + un_a)
    pool_b = sorted(list(old_b.values()) + un_b)
    pairs = _match_identical(pool_a, ca[pool_a].tolist(), pool_b, cb[pool_b].tolist(),
                             lambda i, j: old_b.get(i) == j, hands_value)
    used = set(pairs.values())
    if len(pairs) < len(un_a) or any(i not in pairs for i in un_a) or any(j not in used for j in un_b):
        return None  # an unaligned step with no identical partner: other work, not another order
    for a, b in old_b.items():  # a differing pair is kept whole, or both its steps found partners
        if (a in pairs) != (b in used):
            return None
    keep = torch.ones(len(pa), dtype=torch.bool)
    if rows_l:
        keep[rows] = False
    for a, b in old_b.items():
        if a not in pairs:
            pairs[a] = b  # a difference of its own: it stays, as aligned
    moved = sorted(i for i, j in pairs.items() if old_b.get(i) != j)
    order_a = sorted(pairs)
    all_a = torch.cat([pa[keep], torch.tensor(order_a, dtype=torch.int64)])
    all_b = torch.cat([pb[keep], torch.tensor([pairs[i] for i in order_a], dtype=torch.int64)])
    order = torch.argsort(all_a, stable=True)
    return all_a[order], all_b[order], moved


def _align(ka: torch.Tensor, kb: torch.Tensor, ca: torch.Tensor | None = None,
           cb: torch.Tensor | None = None) -> tuple[list, bool]:
    """difflib-style opcodes aligning two key columns: common prefix and suffix
    found with tensor ops, the part between aligned by difflib -- by content
    first where content keys ``ca`` / ``cb`` are given and the names differ
    (Note [Aligning by content]).  The flag is False when that part was too
    long to align."""
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
        wa, wb = ka[p:a1].tolist(), kb[p:b1].tolist()
        mid = difflib.SequenceMatcher(None, wa, wb, autojunk=False).get_opcodes()
        if ca is not None and cb is not None and any(t != "equal" for t, *_ in mid):
            mid = _by_content(wa, wb, ca[p:a1].tolist(), cb[p:b1].tolist())
        ops += [(t, i1 + p, i2 + p, j1 + p, j2 + p) for t, i1, i2, j1, j2 in mid]
    else:
        ops.append(("replace", p, a1, p, b1))
        aligned = False
    if s:
        ops.append(("equal", a1, na, b1, nb))
    return ops, aligned


def _kept_writes(mm: dataflow.MemoryMap, final) -> set[int] | None:
    """ids of the Writes that still own memory the program held at the end
    (Note [Final state]); None where that is not known: no final state, or one
    that overlaps no memory a compared step still owns."""
    if final is None:
        return None
    kept = {id(w) for dev, lo, hi, w in mm.spans() if final.holds(dev, lo, hi)}
    return kept or None


# Note [Differences that die out]
# A root is benign when its difference reached nothing the program kept at
# the end (Note [Final state]), printed or read (Note [Returned values], Note
# [Program reads]), and died out: every differing tensor written by the steps
# it changed was read into identical outputs (an argmax of a product whose
# last bits moved) or overwritten.  Its own differing outputs may also have
# been freed unread (a workspace nothing reads), but not theirs: a result
# that propagated and was then dropped is what a program's main() does with
# the model it trained when it returns (a DDP step whose rank-local fault
# reached the parameters, held in main()'s locals, was called benign by a
# first version of this rule that let every freed tensor count).  A
# collective that read a difference and returned what it returned before did
# not absorb it: it sent it to the other ranks, mixed with theirs (a
# rank-local fault averaged into every rank's gradients), so such a root is
# never benign.  Before, a
# root that changed any later step counted, so a difference absorbed one step
# after the root was benign and one absorbed two steps after it was not (an
# index_add feeding a matmul feeding an argmax that picked the same classes:
# the program's results were identical and the hunt said DIVERGE; found by a
# trust pass).  An op recorded without memory extents is not linked to what
# it reads, and a step whose outputs are not hashed cannot say whether they
# changed: where one read a difference, it may have gone on unseen, and only
# roots that changed nothing are benign.


# Note [Inputs not compared]
# A root is a step whose inputs were identical; without pre-launch hashes
# (log_tensor_hashes() without hash_inputs=True) an input is known identical
# only through its writers: every byte it read was last written by a
# recorded step whose output was hashed and matched.  Memory no recorded step
# wrote (a graph input, a tensor the caller passed, a buffer filled before
# the recording began) or last written by a step whose output was not hashed
# was not compared at all: the caller passing another x made "inputs
# identical ... this op is non-deterministic" out of an mm that computed
# exactly what it was given.  Such inputs are listed with the root, and the
# verdict says it is non-deterministic or one of them differed.  The walk's
# own memory map holds the writes from the first difference on; the bytes it
# does not own are looked up in a map of the steps before it (built only when
# a root needs it), whose aligned writes with a hash matched in both runs
# (they precede the first difference).


class _Prefix:
    """Who last wrote each byte before the walk's first step, and which of
    those writes were not compared (Note [Inputs not compared])."""

    def __init__(self, A: "_Side", pa: torch.Tensor, start: int):
        self.mm = dataflow.MemoryMap()
        self.unchecked: set[int] = set()
        aligned = set(pa[:start].tolist())
        for j in range(int(pa[start])):
            st = A.step(j)
            for s in st.writes:
                w = dataflow.Write(s, False)
                self.mm.paint(w)
                if j not in aligned or s.key not in st.post:
                    self.unchecked.add(id(w))


def _unowned(mm: dataflow.MemoryMap, unchecked: set, s) -> list | None:
    """The byte ranges of slot s that no write in mm owns, or None when a
    write whose id is in ``unchecked`` owns or overlays any byte of it."""
    if any(id(o) in unchecked for o in mm.partial_over(s.device, s.lo, s.hi)):
        return None
    gaps = []
    for lo, hi, w in mm.pieces(s):
        if w is None:
            gaps.append((lo, hi))
        elif id(w) in unchecked:
            return None
    return gaps


# Note [Differences the program carried]
# The data flow links a step to what it read in memory; a difference the
# program read into Python (tolist, item, print: Note [Program reads]) and
# acted on (indices into a dataset, a branch, a loop count) reaches later
# steps through Python, which kdebug does not trace.  A DataLoader shuffled
# from a generator seeded from the clock drew other indices (aten::random_,
# randperm), read them with tolist, and stacked other samples: each stack
# became a root of its own ("the runs read other tensors here ... a loop
# over a set or a dict"), ranked above the draw by their consequences, and
# the draw came ninth.  So every root that ran after the program read
# another root's values (the read's position, Root.first_read, not the
# other root's) says the program had read them by then, and where
# the first divergence is such a root, its lines name the earlier one.  The
# ranking is left alone: a first version moved the earlier root to the top,
# and a harmless printed random run tag then hid the real root behind it
# (found by a review): which of the two mattered, kdebug cannot see.


def _program_carried(roots: list) -> None:
    """Marks each root that came after the program had read another value
    from an earlier root: after that read, not merely after that root (a
    first version compared the roots' positions, and said "had read other
    values from op #0 before this step" of a draw whose values the program
    read only at the end)."""
    read = sorted((x for x in roots if x.first_read is not None), key=lambda x: x.first_read)
    for x in roots:
        first = next((r for r in read if r is not x and r.first_read < x.position), None)
        if first is not None:
            x.after_read = first.step_a.label()


def _walk_flow(A: "_Side", B: "_Side", pa, pb, diff, shp, final=None) -> tuple[list, list, dict]:
    """Note [Data flow]: walks the aligned steps from the first one whose hashes
    differ, linking every read to the last earlier write of overlapping memory.
    ``final``: run a's final_state.FinalState, or None.
    Returns (consequential roots ranked, benign roots, {root position: aligned
    positions of the steps whose difference came from it})."""
    if len(diff) == 0:
        return [], [], {}
    diffset = set(diff.tolist())
    other_args = set(shp.tolist())  # argument shapes or an op's non-tensor arguments differ
    opaque = False  # a step recorded without extents read a difference (Note [Differences that die out])
    own: set[int] = set()  # ids of the differing Writes of the roots themselves
    mm = dataflow.MemoryMap()
    found: list[Root] = []
    caused: list[list[int]] = []        # per root number: positions it caused
    written: list[list] = []            # per root number: its differing Writes and those it caused
    last = int(diff[-1])
    start = int(diff[0])
    pos_of = {i: k for k, i in enumerate(pa[start:].tolist(), start)}
    unhashed: set[int] = set()  # ids of the walk's Writes whose output run a did not hash
    prefix: list = []           # the _Prefix, once a root needs it

    def not_compared(s) -> bool:
        """Note [Inputs not compared]: whether the bytes of read s are not all
        known identical through a hashed, matching last write."""
        if s.hi <= s.lo or s.device[0] == "?":
            return False
        gaps = _unowned(mm, unhashed, s)  # what the walk's writes do not say
        if gaps is None:
            return True
        for lo, hi in gaps:  # bytes last written before the walk: the prefix's writes say
            if not prefix:
                prefix.append(_Prefix(A, pa, start))
            if _unowned(prefix[0].mm, prefix[0].unchecked, dataflow.Slot(s.key, s.label, s.device, lo, hi)) != []:
                return True
        return False

    for i in range(int(pa[start]), A.n):
        k = pos_of.get(i)
        a = A.step(i)
        if k is None:  # no counterpart (a structural difference): what it wrote differs, from no root
            for s in a.writes:
                mm.paint(dataflow.Write(s, True, 0))
            continue
        if k > last and not a.writes:
            continue
        b = B.step(int(pb[k])) if k in diffset else None
        in_diff, outside, blind, causes = [], [], [], 0
        for s in a.reads:
            hashed = b is not None and (s.key in a.pre or s.key in b.pre)
            if hashed and a.pre.get(s.key) == b.pre.get(s.key):
                continue  # read identical bytes in both runs
            dws = [w for w in mm.writers(s) if w.differs]
            if dws:
                in_diff.append(s)
                for w in dws:
                    causes |= w.causes
                    w.read = True
            elif hashed:
                outside.append(s)
            elif b is not None:
                blind.append(s)  # identical only if its writers say so (Note [Inputs not compared])
        out_diff = [] if b is None else \
            [s for s in a.writes if (s.key in a.post or s.key in b.post) and a.post.get(s.key) != b.post.get(s.key)]
        if b is not None and (VALUE in a.post or VALUE in b.post) and a.post.get(VALUE) != b.post.get(VALUE):
            out_diff.append(_VALUE_SLOT)  # Note [Returned values]: the program got another value
        if b is not None and not a.flow_known:
            # an op recorded without extents: its hashes alone, unlinked
            pre_differs = any(a.pre.get(x) != b.pre.get(x) for x in set(a.pre) | set(b.pre))
            out_keys = [x for x in sorted(set(a.post) | set(b.post)) if a.post.get(x) != b.post.get(x)]
            if out_keys and not pre_differs:
                out_diff = [dataflow.Slot(x, a.labels.get(x, x), ("?", -1), 0, 0) for x in out_keys]
            opaque |= pre_differs  # Note [Differences that die out]: it may carry a difference on unseen
        if out_diff and k in other_args and not in_diff:
            # it was given other arguments (shapes, a generator's state, a scalar): not its own doing
            outside.append(dataflow.Slot("args", "non-tensor arguments / shapes", ("?", -1), 0, 0))
        elif out_diff and in_diff and not causes:
            # its differing input was written by steps only this run ran (a stretch in one run only, such
            # as an allocation-only one that rebinds a tensor's storage): no root to charge, so it is one
            outside.extend(in_diff)
        elif out_diff and not in_diff and a.kind == "aten" and a.name.startswith("aten::set_"):
            # a tensor rebuilt on a storage's bytes (torch.load, unpickling, a DataLoader worker's batch):
            # those bytes came from outside the recording, nothing here computed them
            outside.append(_STORAGE_SLOT)
        if out_diff and (outside or not in_diff):
            n = len(found)
            kind = "outside" if outside else "root"
            found.append(Root(kind, a, b, [(s.label, a.post.get(s.key), b.post.get(s.key)) for s in out_diff],
                              [(s.label, a.pre.get(s.key), b.pre.get(s.key)) for s in outside], position=k,
                              keys=[s.key for s in (outside or out_diff)]))
            caused.append([])
            written.append([])
            causes |= 1 << n
            if _VALUE_SLOT in out_diff:  # Note [Returned values]: it handed the program another value itself
                found[n].values.append((a.label(), a.post.get(VALUE), b.post.get(VALUE)))
                found[n].first_read = k
            if kind == "root" and a.kind == "kernel":
                found[n].code = _code_differs(A, B, a, b)
            if kind == "root":
                found[n].unchecked = [s.label for s in blind if not_compared(s)]
        elif out_diff:
            for r in _bits(causes):
                caused[r].append(k)
                if _VALUE_SLOT in out_diff:
                    found[r].values.append((a.label(), a.post.get(VALUE), b.post.get(VALUE)))
                    if found[r].first_read is None:
                        found[r].first_read = k
        elif causes and is_collective(a):
            for r in _bits(causes):  # Note [Differences that die out]: it went to the other ranks
                found[r].sent += 1
        elif causes:
            for r in _bits(causes):  # read a difference, wrote identical outputs
                found[r].absorbed += 1
            if a.writes and int(A.dig[i, 4]) == 0:
                opaque = True  # its outputs are not hashed: whether the difference went on is not known
        for s in a.writes:
            w = dataflow.Write(s, s in out_diff, causes if s in out_diff else 0)
            mm.paint(w)
            if s.key not in a.post:
                unhashed.add(id(w))
            if w.differs:
                for r in _bits(causes):
                    written[r].append(w)
                    if found[r].position == k:
                        own.add(id(w))  # the root's own differing write
    alive = mm.owners()
    kept = _kept_writes(mm, final)
    for n, r in enumerate(found):
        r.consequences = len(caused[n])
        held = [w for w in written[n] if id(w) in alive]
        unread = [w for w in held if not w.read]
        # a differing tensor the final state says the program still held counts whether or not a step
        # read it (a kept result checked once by an op whose output matched was benign; found by a trust
        # pass); with no final state, an unread one counts as possibly kept
        r.reaches_end = (sum(1 for w in held if id(w) in kept) if kept is not None else len(unread))
        r.freed = sum(1 for w in unread if kept is not None and id(w) not in kept)
        r.kept_known = kept is not None
        # Note [Differences that die out]: what the steps it changed wrote was read into identical
        # outputs or overwritten, none of it left unread (freed or kept)
        dangling = any(id(w) not in own for w in unread)
        r.benign = (r.reaches_end == 0 and not r.values and not r.sent
                    and (r.consequences == 0 or not (opaque or dangling)))
    ranked = sorted((r for r in found if not r.benign), key=lambda r: (-r.consequences, -r.reaches_end, r.position))
    benign = [r for r in found if r.benign]
    inherited = {r.position: torch.tensor(caused[n], dtype=torch.int64) for n, r in enumerate(found)}
    return ranked, benign, inherited


def _bits(x: int):
    n = 0
    while x:
        if x & 1:
            yield n
        x >>= 1
        n += 1


# Note [Allocation-only differences]
# A run can allocate where another does not without computing anything else:
# torch caches (a helper's functools.lru_cache that probes a dtype's size with
# torch.empty((), dtype=...), filled while compiling in a cold run and at run
# time in a run whose graphs came warm from the FX graph cache; seen on the
# H100 under mode="reduce-overhead"), the caching allocator, a lazily made
# workspace.  An uninitialized allocation (aten::empty and its kin) computes
# nothing: a later step that reads its memory before writing it shows up on
# its own, by its input hashes.  So a stretch of steps that differs between
# the runs and holds nothing but such allocations on both sides is reported
# apart (Report.allocations, "ALLOCATION ONLY") and does not make the runs
# differ; a stretch with any other step stays a structural difference.  The
# runs are aligned with an allocation's shape in its key, so only allocations
# of the same shape pair up: an extra allocation, or one of another size (a
# later step using it shows its own shape change), is such a stretch.
_UNINITIALIZED = frozenset({"aten::empty", "aten::empty_strided", "aten::empty_like", "aten::new_empty",
                            "aten::new_empty_strided", "aten::empty_permuted"})
# aten::set_ makes a tensor show a storage's bytes (torch.load, a DataLoader
# worker's batch, unpickling): it computes nothing either, and whoever reads
# the tensor shows by its input hashes what it read
_NO_COMPUTE = _UNINITIALIZED | {"aten::set_"}


# The op path records an allocation as an aten op (kind "aten"), the C++ op
# path as an _AtenOpCall (kind "kernel"): the name decides.  Runs are aligned
# on each step's key (an aten op's key is its name alone), so an allocation's
# key also takes its shape digest: an extra probe allocation pairs with no
# other allocation of another size, and stays a stretch of its own.


def _is_allocation(step: Step) -> bool:
    return step.name.split(".", 1)[0] in _NO_COMPUTE


def _only_allocations(side: "_Side", lo: int, hi: int) -> bool:
    """Whether steps [lo, hi) of a run are all uninitialized allocations (an
    empty range is)."""
    return all(_is_allocation(side.step(i)) for i in range(lo, hi))


@functools.lru_cache(maxsize=None)
def _allocation_keys() -> torch.Tensor:
    """The key digests an allocation step can have: every overload of the
    _NO_COMPUTE ops in this torch's registry, as an aten op (kind 2) and
    as the C++ op path's record (KD_KIND_ATEN, 3)."""
    names = set()
    for op in _NO_COMPUTE:
        names |= {op, op + ".default"}
        packet = getattr(torch.ops.aten, op.split("::", 1)[1], None)
        if packet is not None:
            names |= {f"{op}.{ov}" for ov in packet.overloads()}
    return torch.tensor(sorted({_C.key_digest(kind, n) for n in names for kind in (2, 3)}), dtype=torch.int64)


def _alignment_keys(side: "_Side") -> torch.Tensor:
    """The key column the runs are aligned on: each step's key, with an
    allocation's shape digest folded in (Note [Allocation-only differences])."""
    key = side.dig[:, 0]
    mask = torch.isin(key, _allocation_keys())
    return torch.where(mask, key ^ side.dig[:, 2] ^ 0x5A11C0DE, key) if bool(mask.any()) else key


def compare(run_a, run_b, *, runs: tuple = (0, 1)) -> Report:
    """Compares two runs: DebugMode objects, kdebug.Run objects or trace file
    paths.  ``runs`` names the two sides in the text: run numbers, or labels
    such as ("rank 0", "rank 1")."""
    A, B = _Side.of(run_a), _Side.of(run_b)
    ka, kb = _alignment_keys(A), _alignment_keys(B)
    ca_full, cb_full = _content_keys(A, ka), _content_keys(B, kb)
    ops, aligned = _align(ka, kb, ca_full, cb_full)
    structural: list[str] = []
    allocations: list[str] = []
    seg_a, seg_b = [], []
    un_a: list[int] = []
    un_b: list[int] = []
    for tag, i1, i2, j1, j2 in ops:
        if tag == "equal":
            seg_a.append(torch.arange(i1, i2))
            seg_b.append(torch.arange(j1, j2))
        elif not (_only_allocations(A, i1, i2) and _only_allocations(B, j1, j2)):  # those are listed apart
            un_a += range(i1, i2)
            un_b += range(j1, j2)
    if len(seg_a) == 1 and len(seg_a[0]) == A.n == B.n:  # aligned one to one: no copy, no gather
        pa = pb = seg_a[0]
        da, db = A.dig, B.dig
    else:
        pa = torch.cat(seg_a) if seg_a else torch.zeros(0, dtype=torch.int64)
        pb = torch.cat(seg_b) if seg_b else torch.zeros(0, dtype=torch.int64)
        da, db = A.dig[pa], B.dig[pb]
    ne = da != db  # one pass over both digest tables
    hands_value = lambda i: VALUE in A.step(i).post  # noqa: E731
    moved_at: list[int] = []  # run a's steps that found their partner elsewhere (Note [Reordered steps])
    if aligned and un_a and un_b:  # Note [Steps left unaligned by another order]
        fixed = _repair_unaligned(ca_full, cb_full, pa, pb,
                                  (ne[:, 0] | ne[:, 2] | ne[:, 3] | ne[:, 4]).nonzero().flatten(), un_a, un_b,
                                  hands_value)
        if fixed is not None:  # every unaligned step paired: no stretch is left unaligned
            pa, pb, moved_at = fixed
            ops = [op for op in ops if op[0] == "equal" or _only_allocations(A, op[1], op[2])
                   and _only_allocations(B, op[3], op[4])]
            da, db = A.dig[pa], B.dig[pb]
            ne = da != db
    moved = _reorders(ca_full, cb_full, pa, pb, (ne[:, 0] | ne[:, 2] | ne[:, 3] | ne[:, 4]).nonzero().flatten(),
                      hands_value)
    if moved is not None:  # Note [Reordered steps]
        pb, at = moved
        moved_at = sorted(set(moved_at) | {int(pa[k]) for k in at})
        da, db = A.dig[pa], B.dig[pb]
        ne = da != db
    reordered: list[str] = []
    if moved_at:
        first = moved_at[0]
        k = int((pa == first).nonzero()[0])
        reordered.append(f"{len(moved_at)} step(s) ran in another order in {side_name(runs[1])} than in "
                         f"{side_name(runs[0])} (first: {A.step(first).label()} here, "
                         f"{B.step(int(pb[k])).label()} there): the same computations, on the same inputs")
    for tag, i1, i2, j1, j2 in ops:
        if tag == "equal":
            continue
        left = ", ".join(A.step(i).label() for i in range(i1, min(i2, i1 + 3))) + (" ..." if i2 - i1 > 3 else "")
        right = ", ".join(B.step(j).label() for j in range(j1, min(j2, j1 + 3))) + (" ..." if j2 - j1 > 3 else "")
        # Note [Allocation-only differences]: such a stretch is listed apart
        alloc = _only_allocations(A, i1, i2) and _only_allocations(B, j1, j2)
        verb, out = ("allocated", allocations) if alloc else ("launched", structural)
        if tag == "replace":
            out.append(f"{side_name(runs[0])} {verb} [{left}] ({i2 - i1} step(s)) where {side_name(runs[1])} "
                       f"{verb} [{right}] ({j2 - j1} step(s))")
        elif tag == "delete":
            out.append(f"only {side_name(runs[0])} {verb} [{left}] ({i2 - i1} step(s))")
        else:
            out.append(f"only {side_name(runs[1])} {verb} [{right}] ({j2 - j1} step(s))")
    if not aligned:
        structural.append(f"the runs differ over more than {ALIGN_LIMIT} steps: that part was not aligned")
    cfg = ne[:, 1].nonzero().flatten()
    shp = ne[:, 2].nonzero().flatten()
    diff = (ne[:, 3] | ne[:, 4]).nonzero().flatten()
    hashed = int((((da[:, 3] | da[:, 4]) != 0) & ((db[:, 3] | db[:, 4]) != 0)).sum())
    config_changes = _Pairs(A, B, pa[cfg], pb[cfg])
    shape_changes = _Pairs(A, B, pa[shp], pb[shp])
    final = FinalState.from_meta(A.meta)
    roots, benign, inherited_pos = _walk_flow(A, B, pa, pb, diff, shp, final)
    _program_carried(roots)
    div = None
    root = None
    if roots:
        top = roots[0]
        root = top.position
        a, b = top.step_a, top.step_b
        arg = top.keys[0]
        idx = a.arg_names.index(arg) if arg in a.arg_names else None
        if top.kind == "root":
            _, ha, hb = top.outputs[0]
            div = Divergence("output", a, b, arg, idx, ha, hb)
        else:
            _, ha, hb = top.outside_inputs[0] if top.outside_inputs else top.outputs[0]
            div = Divergence("input", a, b, arg, idx, ha, hb, outside=True)
            for x in roots[:10]:  # the ones the text shows
                if x.kind == "outside":
                    _explain_outside(A, B, x, pa, pb)
            div.writer, div.writer_args, div.other_writer = top.writer, top.writer_args, top.other_writer
        div.inherited = _Pairs(A, B, pa[inherited_pos[top.position]], pb[inherited_pos[top.position]]) \
            if inherited_pos.get(top.position) is not None else _Pairs(A, B, pa[:0], pb[:0])
        div.hints = _hints(a, div.kind, bool(len(cfg)) and int(cfg[0]) <= root)
        if top.code is not None:  # not the kernel's doing: where the constant came from is the question
            div.hints = ["find the value Dynamo compiled into this kernel as a constant (a Python number "
                         "computed from time, an unseeded random draw, a counter, a global): it differed "
                         "between the runs; pass it as a tensor, or make it the same in every run"]
        div.identity = _identity(A, a)
    heirs = sorted({k for x in roots for k in inherited_pos[x.position].tolist()})
    texts = {(int(i), int(j)): (_op_text(A._call(int(i))), _op_text(B._call(int(j))))
             for i, j in zip(pa[shp[:5]].tolist(), pb[shp[:5]].tolist()) if A.step(int(i)).kind == "aten"}
    scalars = {(int(i), int(j)): d for i, j in zip(pa[shp[:5]].tolist(), pb[shp[:5]].tolist())
               if A.step(int(i)).kind == "kernel"
               and (d := _scalar_delta(A._call(int(i)), B._call(int(j)), runs)) is not None}
    alignment = {"shape_texts": texts,  # the first shape changes' op texts, for the report's SHAPES lines
                 "scalar_texts": scalars,  # kernels among them whose tensors are alike: their other scalars
                 "opcodes": ops, "aligned": aligned, "pa": pa, "pb": pb, "diff": diff, "config": cfg,
                 "shape": shp, "root": root, "roots": torch.tensor([x.position for x in roots], dtype=torch.int64),
                 "heirs": torch.tensor(heirs, dtype=torch.int64)}
    rep = Report(runs, A.n, B.n, len(pa), hashed, div, structural, config_changes, shape_changes,
                 B.kernels, roots, benign, alignment, allocations, reordered)
    rep.gaps = [f"{side_name(n)}: {g}" for n, side in zip(runs, (A, B)) for g in side.gaps()]
    ma, mb = getattr(A, "meta", None) or {}, getattr(B, "meta", None) or {}
    ca, cb = _command(ma.get("argv")), _command(mb.get("argv"))
    if ca and cb and ca != cb:
        # two traces of different commands (kdebug diff of any two files): the comparison still runs,
        # and says so (a hunt's runs share one command: kdebug's runner's own arguments are left out)
        rep.notes.append(f"the traces are of different commands: {side_name(runs[0])} ran "
                         f"{' '.join(ca)[:200]!r}, {side_name(runs[1])} ran {' '.join(cb)[:200]!r}")
    if A.kernels == 0 and B.kernels == 0 and (A.n or B.n):
        # dynamo left the code eager (nn.LSTM / nn.GRU, a skipped frame), or nothing was compiled: a
        # match here says nothing of compiled kernels
        rep.notes.append("no compiled kernel was launched in either run: the comparison covers aten ops only "
                         "(nothing was compiled, or torch.compile left this code eager)")
    for key in ("settings", "settings_end"):  # Note [Settings that change the numbers] (trace.py)
        sa, sb = ma.get(key) or {}, mb.get(key) or {}
        rep.settings += [(k, sa[k], sb[k]) for k in sa if k in sb and sa[k] != sb[k]
                         and k not in {x[0] for x in rep.settings}]
    return rep


def _scalar_delta(ca, cb, runs: tuple) -> str | None:
    """'ks1 = 3 in run 0, 5 in run 1' for the non-tensor arguments two
    launches of one kernel were given differently, when their tensor
    arguments have the same shapes, strides and dtypes (an adversarial pass
    found a launch that differed only in a dynamic size's value called one
    with 'other argument shapes'); None otherwise."""
    try:
        ka, kb = ca.kwargs, cb.kwargs
    except Exception:  # noqa: BLE001 (a launch whose arguments cannot be read: the plain SHAPES line)
        return None
    if list(ka) != list(kb):
        return None
    out = []
    for n, va in ka.items():
        vb = kb[n]
        la, lb = _layout(va), _layout(vb)
        if la is not None or lb is not None:
            if la != lb:
                return None
            continue
        if va != vb:
            out.append(f"{n} = {va!r} in {side_name(runs[0])}, {vb!r} in {side_name(runs[1])}")
    return "; ".join(out[:5]) + (f"; and {len(out) - 5} more" if len(out) > 5 else "") if out else None


def _layout(v) -> tuple | None:
    """(shape, stride, dtype) of a kernel argument that is a tensor (a
    recorded TensorInfo, whose stride is a tuple, or the tensor itself with
    store_original_args); None for anything else."""
    if not (hasattr(v, "shape") and hasattr(v, "dtype")):
        return None
    stride = v.stride() if callable(getattr(v, "stride", None)) else getattr(v, "stride", ())
    return tuple(v.shape), tuple(stride), v.dtype


def _command(argv) -> list | None:
    """The program's command line from a trace's META argv: kdebug's runner
    (kdebug record / hunt) recorded its own, the program's after its --."""
    if not argv:
        return None
    first = str(argv[0]).replace("\\", "/")
    if first.endswith(("kdebug/_runner.py", "kdebug/__main__.py", "/kdebug", "kdebug")) and "--" in argv:
        return argv[argv.index("--") + 1:]  # kdebug record / hunt: the program's, after the --
    return list(argv)


def format_report(r: Report, gaps_listed_after: bool = False, *, terminal: bool | None = None) -> str:
    """The report's text; ``gaps_listed_after``: the caller lists the
    recordings' gaps itself after the reports (kdebug hunt does, once for
    all its comparisons), so they are counted here, not listed.
    ``terminal``: each line escaped for a terminal (Note [Terminal-safe
    text]); None: when the command line's output is on (the HTML report
    passes False: it escapes for HTML itself)."""
    if terminal is None:
        terminal = _termtext.terminal.get()
    lines = _report_lines(r, gaps_listed_after)
    return "\n".join(map(_termtext.escape, lines) if terminal else lines)


def _report_lines(r: Report, gaps_listed_after: bool) -> list[str]:
    """format_report's lines, each one line: the strings of the runs in
    them (kernel and op names, argument names) may hold anything."""
    a, b = r.runs
    lines = [f"{side_name(b).capitalize()}: comparing with {side_name(a)} ... {r.kernels_b} kernels, {r.n_b - r.kernels_b} aten ops "
             f"({r.compared} aligned, {r.hashed} hashed)"]
    lines += [f"  note: {t}" for t in r.notes]
    if gaps_listed_after and r.gaps:
        lines.append(f"  INCOMPLETE: {len(r.gaps)} gap(s) in these recordings (listed below)")
    else:
        lines += [f"  INCOMPLETE: {g}" for g in r.gaps[:10]]  # Note [A match needs whole recordings]
    if len(r.gaps) > 10 and not gaps_listed_after:
        lines.append(f"  ... {len(r.gaps) - 10} more gaps in the recordings")
    if r.gaps and not r.ok:
        lines.append("  (the differences below were found in the recorded parts; what was not recorded was not "
                     "compared)")
    for k, va, vb in r.settings:  # Note [Settings that change the numbers]
        lines.append(f"  SETTINGS: {k} was {vb!r} in {side_name(b)}, {va!r} in {side_name(a)}: kernels and "
                     "reductions may differ with it, so a root below may be this setting's doing, not "
                     "non-determinism")
    for s in r.structural[:10]:
        lines.append(f"  STRUCTURE: {s}")
    if len(r.structural) > 10:
        lines.append(f"  ... {len(r.structural) - 10} more structural differences")
    for s in r.allocations[:3]:
        lines.append(f"  ALLOCATION ONLY (not a difference in what was computed): {s}")
    for s in r.reordered:
        lines.append(f"  REORDERED (not a difference in what was computed): {s}")
    if len(r.allocations) > 3:
        lines.append(f"  ... {len(r.allocations) - 3} more allocation-only differences")
    for x, y in r.config_changes[:5]:
        lines.append(f"  CONFIG: {x.label()} grid {x.grid} config {x.config} in {side_name(a)}, "
                     f"grid {y.grid} config {y.config} in {side_name(b)}")
    if len(r.config_changes) > 5:
        lines.append(f"  ... {len(r.config_changes) - 5} more launches with another grid or config")
    for x, y in r.shape_changes[:5]:
        texts = (r.alignment or {}).get("shape_texts", {}).get((x.index, y.index))
        scalars = (r.alignment or {}).get("scalar_texts", {}).get((x.index, y.index))
        if texts is not None:
            ta, tb = texts
            lines.append(f"  SHAPES: {x.label()} was called with other arguments in {side_name(b)}: "
                         f"{_text_delta(ta, tb, a, b)}")
        elif scalars is not None:
            lines.append(f"  SHAPES: {x.label()} was called with other scalar arguments in {side_name(b)} (its "
                         f"tensor arguments' shapes are the same): {scalars}")
        else:
            lines.append(f"  SHAPES: {x.label()} has other argument shapes in {side_name(b)}")
    if len(r.shape_changes) > 5:
        lines.append(f"  ... {len(r.shape_changes) - 5} more launches with other shapes")
    d = r.divergence
    if d is None:
        if r.hashed == 0 and r.structural and r.compared == 0:
            lines.append(f"  nothing to compare: no step of {side_name(b)} lines up with one of {side_name(a)} "
                         "(STRUCTURE above): the runs ran other code")
        elif r.n_b == 0 and r.compared == 0:
            lines.append("  nothing to compare: no launch or op was recorded"
                         + (" (INCOMPLETE: what ran was not recorded)" if r.gaps else ""))
        elif r.hashed == 0:
            lines.append("  nothing to compare: record with DebugMode.log_tensor_hashes('bitwise', hash_inputs=True)")
        elif r.gaps:  # Note [A match needs whole recordings]
            lines.append(f"  NO VERDICT: the {r.compared} recorded launches and ops match, but the recordings are "
                         "incomplete (INCOMPLETE above): what was not recorded was not compared")
        elif r.ok:
            if r.hashed < r.compared:  # a launch with no hashes matched nothing: say which were compared
                lines.append(f"  all {r.hashed} hashed launches and ops have matching inputs and outputs; the other "
                             f"{r.compared - r.hashed} were recorded without hashes and matched by name and shape only"
                             + (f"; {len(r.benign)} benign difference(s) below" if r.benign else ""))
            else:
                lines.append(f"  all {r.compared} launches and ops have matching inputs and outputs"
                             + (f", apart from {len(r.benign)} benign difference(s) below" if r.benign else ""))
            lines.append("  still possible: work outside the recorded launches (Python, ops run with no "
                         "DebugMode), RNG state, autotuning choosing other kernels")
        lines += _benign_lines(r)
        return lines
    top = r.roots[0]
    s = d.step_a
    where = f"{s.label()}" + (f"  grid {s.grid}" if s.grid is not None else "")
    more = f" (root 1 of {len(r.roots)})" if len(r.roots) > 1 else ""
    lines.append(f"  FIRST DIVERGENCE{more}: {where}")
    lines += [f"    {x}" for x in _root_lines(top, a, b, bool(r.settings))]
    lines += [f"    {x}" for x in d.identity]
    for h in d.hints:
        lines.append(f"    hint: {h}")
    if len(r.roots) > 1:
        if any(x.after_read is not None for x in r.roots):  # Note [Differences the program carried]
            lines.append("  OTHER ROOTS (ranked by how much changed because of them; a root after one whose other "
                         "values the program read may follow from it through Python):")
        else:
            lines.append("  OTHER ROOTS (independent of the first; ranked by how much changed because of them):")
        for n, x in enumerate(r.roots[1:10], 2):
            lines.append(f"    root {n}: {x.step_a.label()}")
            lines += [f"      {t}" for t in _root_lines(x, a, b, bool(r.settings))]
        if len(r.roots) > 10:
            lines.append(f"    ... {len(r.roots) - 10} more roots")
    lines += _benign_lines(r)
    if r.carried:  # Note [State a run left]
        lines.append(f"  STATE CARRIED OVER: {side_name(b)} read memory {side_name(a)} wrote last, which no step of "
                     f"{side_name(b)} wrote before it (the runs ran one after the other in this process):")
        lines += [f"    {t}" for t in r.carried[:5]]
        if len(r.carried) > 5:
            lines.append(f"    ... {len(r.carried) - 5} more")
        lines.append("    -> the function updates state it reads (a module's buffers, such as BatchNorm's running "
                     "statistics in training mode; a step counter; a cache; optimizer state): each run started "
                     f"from what the run before it left, so {side_name(b)}'s difference says nothing about "
                     "determinism; reset that state in the function (or put the module in eval mode), or "
                     "compare runs in fresh processes (kdebug hunt)")
    return lines


# Note [State a run left]
# assert_deterministic and the pytest plugin run the function several times
# in one process, one run after the other.  A function that updates state it
# reads (BatchNorm's running statistics in training mode, a counter buffer,
# a cache, an optimizer step) starts each run from what the run before it
# left: run 1's kernel reads a buffer whose bytes differ from run 0's, no
# recorded step of run 1 wrote it, and the verdict said "from outside the
# recorded launches (a graph input, RNG, ...)", true but no help.  The runs
# share one address space, so where run 0's own steps were the last to write
# the memory run 1 read, the report says so, naming the writer: the state
# the function carries from run to run.


def _writes_before(side: _Side, before: int, slot):
    """(step, its writes overlapping ``slot``) for each of the side's steps
    before index ``before`` that wrote elements of that memory, latest first
    (a scan back of at most _UNPAIRED_SCAN steps)."""
    for j in range(before - 1, max(-1, before - 1 - _UNPAIRED_SCAN), -1):
        w = side.step(j)
        if w.kind == "aten" and not _op_writes(w.name):
            continue
        ws = [s for s in w.writes if s.device == slot.device and s.lo < slot.hi and slot.lo < s.hi]
        if ws:
            yield w, ws


def _last_write(side: _Side, before: int, slot) -> Step | None:
    """The side's latest step before index ``before`` that wrote elements
    of memory overlapping ``slot`` (a bounded scan back), or None."""
    return next((w for w, _ in _writes_before(side, before, slot)), None)


def _module_state(fn) -> list[tuple[int, int, str]]:
    """(first byte, end, "buffer 1.running_mean" / "parameter 0.weight") of
    the tensors of the nn.Module behind fn (a module, a compiled one, or a
    bound method of one); empty for anything else."""
    m = getattr(fn, "__self__", fn)
    m = getattr(m, "_orig_mod", m)
    if not isinstance(m, torch.nn.Module):
        return []
    out = []
    try:
        for kind, items in (("buffer", m.named_buffers()), ("parameter", m.named_parameters())):
            for name, t in items:
                if t is not None and t.numel() and t.layout == torch.strided and t.device.type != "meta":
                    lo = t.data_ptr()
                    span = sum((n - 1) * st for n, st in zip(t.shape, t.stride()))
                    out.append((lo, lo + (span + 1) * t.element_size(), f"{kind} {name}"))
    except Exception:  # (a module whose tensors cannot be listed: no names)
        return []
    return out


def _carried_state(A: _Side, B: _Side, r: Report, names: list | None = None) -> list[str]:
    """Note [State a run left]: for runs made one after the other in this
    process, the differing inputs of "outside" roots that run a wrote last
    and run b did not write before reading them (``names``: _module_state's
    list, to name the module's tensor there)."""
    out = []
    a, b = r.runs
    for x in r.roots[:10]:
        if x.kind != "outside":
            continue
        for key, (label, _, _) in zip(x.keys, x.outside_inputs):
            slot = next((s for s in x.step_b.reads if s.key == key), None)
            if slot is None or slot.hi <= slot.lo or slot.device[0] == "?":
                continue
            if _last_write(B, x.step_b.index, slot) is not None:
                continue  # written in run b: not state from run a
            w = _last_write(A, A.n, slot)
            if w is not None:
                held = [n for lo, hi, n in names or () if lo <= slot.lo and slot.hi <= hi]
                out.append(f"{x.step_b.label()} read {label}" + (f" (the module's {held[0]})" if held else "")
                           + f", last written in {side_name(a)} by {w.label()} ({side_name(a)}'s numbering)")
    return out


def _explain_outside(A: _Side, B: _Side, x: "Root", pa: torch.Tensor, pb: torch.Tensor) -> None:
    """Sets an "outside" root's last recorded writer of its differing input
    (its output matched, or is unhashed) and, where run b read another
    tensor there, that one (Note [Other tensors passed])."""
    a, b = x.step_a, x.step_b
    arg = x.keys[0]
    _, ha, hb = x.outside_inputs[0] if x.outside_inputs else x.outputs[0]
    slot = next((s for s in a.reads if s.key == arg), None)
    if slot is None:
        return
    dt = {"cpu": 0, "cuda": 1}.get(slot.device[0], -1)
    leaf = _C.tree_leaf_digest(ha) if ha is not None else 0  # an op writer: by its output hash
    found = A.trace.last_writer(a.index, dt, slot.device[1], slot.lo, slot.hi, leaf)
    if found is None:
        x.only_b_writer = _unpaired_writer(B, b, arg, pb, hb)
        return
    w = x.writer = A.step(found.index)
    x.writer_args = ([n for bit, n in enumerate(w.arg_names) if found.mask >> bit & 1]
                     if w.kind == "kernel" else ["output"])
    x.writer_paired = bool(len((pa == found.index).nonzero()))
    x.other_writer = _other_writer(A, B, b, arg, hb, pa, pb, found.index)
    if x.other_writer is None:
        x.only_b_writer = _unpaired_writer(B, b, arg, pb, hb)


# Note [Writes only one run made]
# An input that differs with no differing recorded write before it in run a
# may have been written in run b by a step run a did not run (an in-place
# update one run made: `w[3, 5] += 1e-3` under torch.no_grad() in one run
# only): STRUCTURE lists the step, and the verdict names it as where the
# difference came from instead of "outside the recorded launches" (found by
# an adversarial pass).  Run b's steps before the read are walked back,
# past writes that cover only part of that memory (a later `w[0] = 0` in
# both runs), to the first that covers all of it (a kernel's W argument; an
# aten op that writes an argument's elements, or whose output is new memory;
# views and metadata changes write nothing); the latest writer on the way
# with no counterpart in run a is reported, unless it wrote all of that
# memory and its output is not what was read (it changed after that write,
# unseen: a review's case of a redundant zero_ in one run, then a write from
# an unrecorded thread).  At most _UNPAIRED_SCAN steps are walked.
_UNPAIRED_SCAN = 20000


@functools.lru_cache(maxsize=4096)
def _op_writes(name: str) -> bool:
    """Whether aten-op record ``name`` ("aten::add_.Tensor") writes memory:
    an argument whose elements it mutates (dataflow.writes_elements), or
    outputs of its own (not a view's alias, not a metadata change:
    _unsafe_view's schema gives its alias no annotation).  A name torch does
    not resolve counts as a writer."""
    ns, _, rest = name.partition("::")
    base, _, overload = rest.partition(".")
    try:
        op = getattr(getattr(getattr(torch.ops, ns), base), overload or "default")
        schema = op._schema
    except Exception:
        return True
    if dataflow.writes_elements(op):
        return True
    if base in dataflow._NO_ELEMENT_WRITES or base == "_unsafe_view" or torch.Tag.inplace_view in op.tags:
        return False
    return all(r.alias_info is None for r in schema.returns)


def _unpaired_writer(B: _Side, b: Step, arg: str, pb: torch.Tensor, hb=None) -> Step | None:
    """Run b's latest step before ``b`` that wrote into the memory ``b``
    read as ``arg`` and has no counterpart in run a, walking back past
    writes that cover only part of it, to the first one that covers all of
    it (Note [Writes only one run made]); None when there is none, or when
    that step wrote the whole of it and not the bytes ``b`` read (hash hb):
    then it changed after that write, unseen."""
    slot = next((s for s in b.reads if s.key == arg), None)
    if slot is None or slot.hi <= slot.lo:
        return None
    paired = set(pb.tolist())
    found = None
    for w, ws in _writes_before(B, b.index, slot):
        if found is None and w.index not in paired:
            exact = [s for s in ws if (s.lo, s.hi) == (slot.lo, slot.hi) and s.dense]
            if exact and hb is not None and all(w.post.get(s.key) is not None and w.post.get(s.key) != hb
                                                for s in exact):
                return None
            found = w
        if any(s.lo <= slot.lo and s.hi >= slot.hi and s.dense for s in ws):
            break  # it wrote all of it: nothing earlier shows in what was read
    return found


# Note [Other tensors passed]
# An input that differs while its last recorded writer's output matched
# between the runs reads as "the memory changed after that write".  But the
# other run may have read another tensor altogether: its read resolves to a
# writer that is not the counterpart of this run's writer (a loop over a set
# whose order follows PYTHONHASHSEED summed the heads in another order, a
# branch on data took the other arm).  Then that is what the verdict says:
# the runs passed other tensors here, naming both writers.


def _other_writer(A: _Side, B: _Side, b: Step, arg: str, hb, pa: torch.Tensor, pb: torch.Tensor,
                  writer_a: int) -> tuple | None:
    """(run b's writer of what its step read as ``arg``, that writer's
    counterpart in run a or None) when it is not the counterpart of run a's
    writer ``writer_a``; None otherwise or when run b's writer is unknown."""
    slot = next((s for s in b.reads if s.key == arg), None)
    if slot is None:
        return None
    dt = {"cpu": 0, "cuda": 1}.get(slot.device[0], -1)
    leaf = _C.tree_leaf_digest(hb) if hb is not None else 0
    found = B.trace.last_writer(b.index, dt, slot.device[1], slot.lo, slot.hi, leaf)
    if found is None:
        return None
    wb = B.step(found.index)
    if not any(w.device == slot.device and w.lo < slot.hi and slot.lo < w.hi for w in wb.writes):
        return None  # an op matched by its output's value, not its memory: not known to be what was read
    k = (pa == writer_a).nonzero().flatten()
    if len(k) and int(pb[int(k[0])]) == found.index:
        return None  # the counterpart of run a's writer: the same tensor, changed after it
    kb = (pb == found.index).nonzero().flatten()
    return wb, (A.step(int(pa[int(kb[0])])) if len(kb) else None)


def _provenance(side: _Side, step: Step) -> list:
    if side._trace is not None:
        return side._trace.provenance(step.name)
    from . import provenance

    return provenance.provenances(step.name)


def _code_differs(A: _Side, B: _Side, a: Step, b: Step) -> tuple | None:
    """(sha256 in run a, in run b) when the two runs compiled the kernel of
    this name from different source, known from their provenance: a value
    specialized into the code (a Python float or int, a global, a shape)
    differed, and the kernel computing differently proves nothing about its
    determinism (Note [Kernel code])."""
    codes_a = {e.code_sha256 for e in _provenance(A, a) if e.code_sha256}
    codes_b = {e.code_sha256 for e in _provenance(B, b) if e.code_sha256}
    if codes_a and codes_b and codes_a.isdisjoint(codes_b):
        texts_a = {_code_text(A, h) for h in codes_a}
        texts_b = {_code_text(B, h) for h in codes_b}
        if None not in texts_a and None not in texts_b \
                and not {_device_free(t) for t in texts_a}.isdisjoint({_device_free(t) for t in texts_b}):
            return None  # the same code compiled for another GPU (ranks of one job, one GPU each)
        return min(codes_a), min(codes_b)
    return None


def _code_text(side: _Side, sha256: str) -> str | None:
    if side._trace is not None:
        return side._trace.kernel_code(sha256)
    from . import kernel_code

    return kernel_code.text(sha256)


# Note [Code of another device]: a Triton kernel's generated source names the
# device it was compiled for (triton_meta's DeviceProperties(..., index=N,
# ...)), so ranks that run one GPU each compile the same kernel into texts
# with different sha256 (seen on 2 H200s, torch 2.11).  Such texts are the
# same code: the index is masked before two texts are compared.
_DEVICE_INDEX = re.compile(r"(DeviceProperties\(type='[a-z]+', index=)\d+")


def _device_free(text: str) -> str:
    return _DEVICE_INDEX.sub(r"\1?", text)


def _identity(side: _Side, step: Step) -> list[str]:
    """What a kernel step computes, from its run's provenance (a trace's META,
    or this process's for a live run): one block per distinct kernel of the
    name, each its fused FX nodes, user source lines and module."""
    if step.kind != "kernel":
        return []
    entries = _provenance(side, step)
    out = []
    for k, e in enumerate(entries):
        which = (f" (kernel {k + 1} of {len(entries)} of this name"
                 + (f", code {e.code_sha256[:12]})" if e.code_sha256 else ")")) if len(entries) > 1 else ""
        out.append("fuses: " + (", ".join(e.nodes) if e.nodes else "(FX nodes unknown)") + which)
        # a provenance file is written by the compile that first produced this code, perhaps another program's
        first = " (when this code was first compiled, perhaps by another script)" if e.origin == "provenance file" else ""
        out += [f"from{first}: {s}" for s in e.source]
        if e.module:
            out.append(f"module: {e.module}")
    return out


def _diff_text(outs: list, a: "int | str", b: "int | str", limit: int = 3) -> str:
    parts = [f"{label} differ (SHAPES above)" if ha is None and hb is None else
             f"{label} differs ({_fmt_pair(ha, hb, a, b)})" for label, ha, hb in outs[:limit]]
    if len(outs) > limit:
        parts.append(f"{len(outs) - limit} more")
    return "; ".join(parts)


def is_collective(step) -> bool:
    """Whether a step is a c10d collective (its output depends on other ranks)."""
    from .collectives import is_collective_name

    return step is not None and step.kind == "aten" and is_collective_name(step.name)


def _pin_hint() -> str:
    import torch._inductor.config as inductor_config

    if hasattr(inductor_config, "deterministic"):
        return ("; torch._inductor.config.deterministic = True (TORCHINDUCTOR_DETERMINISTIC=1) skips the "
                "benchmarking that changes numerics")
    return ("; this torch has no torch._inductor.config.deterministic (newer ones do: it skips the "
            "benchmarking that changes numerics)")


def _launch_differs(x: "Root") -> bool:
    """Whether a root kernel's two launches were configured differently
    (autotuning's choice: Note [Launch table]), both configs known."""
    sa, sb = x.step_a, x.step_b
    return (sa.kind == "kernel" and sa.config is not None and sb.config is not None
            and (sa.config, sa.grid) != (sb.config, sb.grid))


def root_cause(x: "Root", a: "int | str", b: "int | str", settings: bool = False) -> str:
    """What the report's "-> ..." line says made root x differ (without the
    arrow): the text report's and the HTML page's cause (kdebug/report.py), one
    wording for both."""
    return _root_cause(x, a, b, settings)[1][3:]


def _root_lines(x: "Root", a: "int | str", b: "int | str", settings: bool = False) -> list[str]:
    out, why = _root_cause(x, a, b, settings)
    tail = [f"{x.consequences} later launches/ops changed because of it"]
    if x.reaches_end:
        tail.append(f"{x.reaches_end} differing tensor(s) from it still held their value when the recording ended"
                    + ("" if x.kept_known else " (possibly kept: the final state is not known)"))
    if x.freed:
        tail.append(f"{x.freed} differing tensor(s) from it were freed unread")
    if x.absorbed:
        tail.append(f"{x.absorbed} read it and wrote identical outputs")
    if x.sent:
        tail.append(f"{x.sent} collective(s) sent it to the other ranks")
    out.append(f"{why}; " + "; ".join(tail))
    if x.values:  # Note [Returned values], Note [Program reads]
        shown = "; ".join(f"{lab} returned {va} in {side_name(a)}, {vb} in {side_name(b)}"
                          if isinstance(va, str) and isinstance(vb, str) and program_reads.PRINT not in lab else
                          f"{lab} printed other text" if program_reads.PRINT in lab else
                          f"{lab} saved another structure" if program_reads.SAVED in lab else
                          f"{lab} read other values ({_fmt_pair(va, vb, a, b)})"
                          for lab, va, vb in x.values[:3])
        more = f" (and {len(x.values) - 3} more)" if len(x.values) > 3 else ""
        out.append(f"-> the program got other values because of it: {shown}{more}")
    if x.writer is not None and x.other_writer is not None:  # Note [Other tensors passed]
        wb, counterpart = x.other_writer
        twin = (f" (the counterpart of {counterpart.label()} in {side_name(a)})" if counterpart is not None else
                f" (a step only {side_name(b)} ran there)")
        why_path = (f"after it read other values from {x.after_read} (see its root), or a loop over a set or a dict, "
                    "whose order follows PYTHONHASHSEED in each process" if x.after_read else
                    "a loop over a set or a dict, whose order follows PYTHONHASHSEED in each process, or control "
                    "flow on data")
        out.append(f"-> the runs passed other tensors here: {side_name(a)} read what {x.writer.label()} wrote, "
                   f"{side_name(b)} what its {wb.label()} wrote{twin}: the program took another path or order "
                   f"here ({why_path})")
    elif x.only_b_writer is not None:
        pass  # (its own lines above name the writer that mattered)
    elif x.writer is not None and not x.writer_paired:
        out.append(f"-> last recorded write of that memory: {x.writer.label()} ({', '.join(x.writer_args)}), a step "
                   f"only {side_name(a)} ran (STRUCTURE / ALLOCATION ONLY above)")
    elif x.writer is not None:
        between = "the runs" if isinstance(b, int) else f"{side_name(a)} and {side_name(b)}"
        out.append(f"-> last recorded write of that memory: {x.writer.label()} ({', '.join(x.writer_args)}), whose "
                   f"output matched between {between}: it changed after that write")
    if x.after_read and not (x.writer is not None and x.other_writer is not None):
        out.append(f"-> the program had read other values from {x.after_read} before this step (see its root): "
                   "it may follow from them through Python (indices, a branch, a loop), which kdebug does not trace")
    return out


def _root_cause(x: "Root", a: "int | str", b: "int | str", settings: bool = False) -> tuple[list[str], str]:
    """The lines of root x before its cause, and the cause ("-> ...")."""
    what = "kernel" if x.step_a.kind == "kernel" else "op"
    out = []
    if x.kind == "root":
        lead = "" if x.outputs and x.outputs[0][0].startswith("output") else "output "
        if x.unchecked:  # Note [Inputs not compared]
            shown = ", ".join(x.unchecked[:3]) + (f" and {len(x.unchecked) - 3} more" if len(x.unchecked) > 3 else "")
            out.append(f"inputs identical where compared, {lead}{_diff_text(x.outputs, a, b)}")
            out.append(f"not compared: {shown} (no pre-launch hash, and not last written by a recorded step whose "
                       "output was hashed: graph inputs, tensors the caller passed or filled outside the "
                       "recording; log_tensor_hashes(hash_inputs=True) compares them)")
        else:
            out.append(f"inputs identical, {lead}{_diff_text(x.outputs, a, b)}")
        if is_collective(x.step_a) and isinstance(b, int):
            why = ("-> this collective returned another result from this process's identical inputs: its output "
                   "also depends on the other ranks' inputs (a rank whose difference started earlier sends it), "
                   "its reduction order and its transport (kdebug hunt --nproc says which rank it came from)")
        elif x.code is not None:
            why = (f"-> the two runs compiled different code for this kernel (sha256 {x.code[0][:12]} in "
                   f"{side_name(a)}, {x.code[1][:12]} in {side_name(b)}): a value compiled into it as a constant "
                   "(a Python float or int, a global, a shape) differed between the runs, so its other result "
                   "says nothing about its determinism; kdebug show --source N of each run shows the two codes")
        elif _launch_differs(x):
            why = (f"-> this kernel ran with another launch config in {side_name(b)} (config {x.step_b.config}, "
                   f"grid {x.step_b.grid}) than in {side_name(a)} (config {x.step_a.config}, grid "
                   f"{x.step_a.grid}): autotuning chose differently (each process benchmarks on its own), and "
                   "another block size or warp count sums in another order, so its other result says nothing "
                   f"about its determinism{_pin_hint()}")
        elif x.step_a.kind == "aten" and draws_random(x.step_a.name):
            why = ("-> this op drew other random numbers: the generator it uses was in another state "
                   "(an unseeded program, or one seeded from time)")
        elif x.step_a.kind == "aten" and x.step_a.name == program_reads.SAVED:  # Note [What a save wrote]
            why = ("-> the program saved another structure with torch.save: other keys, the same tensors under "
                   "other keys or in another order, or values of other types (a dict or module built from a "
                   "set, whose order follows PYTHONHASHSEED in each process)")
        elif x.unchecked:
            why = (f"-> this {what} is non-deterministic, or an input not compared differed between "
                   f"{side_name(a)} and {side_name(b)}")
        elif settings:
            why = (f"-> this {what} is non-deterministic, or it computed differently under the other setting "
                   "(SETTINGS above)")
        else:
            why = (f"-> this {what} is non-deterministic" if isinstance(b, int) else  # sides named: ranks
                   f"-> this {what} computed another result on {side_name(b)} than on {side_name(a)} from the "
                   "same inputs")
    elif x.other_writer is not None:  # Note [Other tensors passed]
        out.append(f"input {_diff_text(x.outside_inputs, a, b)}")
        why = "-> the runs read other tensors at this step (below)"
    elif x.only_b_writer is not None:  # Note [Writes only one run made]
        out.append(f"input {_diff_text(x.outside_inputs, a, b)}, last written in {side_name(b)} by "
                   f"{x.only_b_writer.label()} ({side_name(b)}'s numbering), a step only {side_name(b)} ran")
        why = (f"-> the difference came from that step, which {side_name(a)} did not run (STRUCTURE above): "
               "the program took another path there")
    elif (x.step_a.kind == "aten" and draws_random(x.step_a.name)
          and all(lab == "non-tensor arguments / shapes" for lab, _, _ in x.outside_inputs)):
        # a draw given a generator object (randn(..., generator=g)): its state is one of the op's
        # arguments, shown by value (seed, offset), so another state reads as another argument
        out.append("input non-tensor arguments / shapes differ (SHAPES above)")
        why = ("-> this op drew other random numbers: the generator passed to it (or its shape arguments) "
               "differed; a torch.Generator seeded differently in each run (from time, a process id, "
               "os.urandom) shows here as another seed")
    elif x.outside_inputs and all(lab == "non-tensor arguments / shapes" for lab, _, _ in x.outside_inputs):
        # a Python number (or a shape) the program computed differently: no tensor differs here
        out.append("input non-tensor arguments / shapes differ (SHAPES above); its tensor inputs are the same")
        why = ("-> the program passed this step another Python number or shape: a value computed in Python "
               "(from time, a counter, an unseeded random module, a .item() of an earlier difference)")
    else:
        out.append(f"input {_diff_text(x.outside_inputs, a, b)}, and no recorded step wrote a differing "
                   "value into it")
        why = ("-> the difference came from outside the recorded launches (a graph input, RNG, memory "
               "torch.empty gave that was read before all of it was written, an op run with no DebugMode, a "
               "write kdebug did not see)")
    return out, why


def _benign_lines(r: "Report") -> list[str]:
    if not r.benign:
        return []
    lines = ["  BENIGN (differences that died out: nothing the program kept at the end, printed or read depends "
             "on them):"]
    for x in r.benign[:10]:
        fate = []
        if x.consequences:  # Note [Differences that die out]
            fate.append(f"changed {x.consequences} later launch(es)/op(s), whose differences died out too")
        if x.absorbed:
            fate.append(f"read by {x.absorbed} later launch(es)/op(s) whose outputs matched")
        if x.freed:
            fate.append(f"{x.freed} differing tensor(s) freed without being read (not held at the end)")
        lines.append(f"    {x.step_a.label()}: {_diff_text(x.outputs, *r.runs, limit=2)}; "
                     + ("; ".join(fate) or "overwritten before anything read it"))
    if len(r.benign) > 10:
        lines.append(f"    ... {len(r.benign) - 10} more")
    return lines


def _record(fn, args, kwargs, hash_fn, all_threads: bool = False):
    from .mode import DebugMode

    with DebugMode(record_final_state=True, record_all_threads=all_threads) as dm:
        with DebugMode.log_tensor_hashes(hash_fn=hash_fn, hash_inputs=True):
            out = fn(*args, **kwargs)  # noqa: F841  (held at exit: part of the final state)
    dm.operators  # noqa: B018  (drain and resolve while the mode's objects are alive)
    return dm


def _op_digests(rec: dict) -> bytes:
    """An aten op's digests from TraceWriter.op's keyword arguments (trace._op_record)."""
    return _C.op_digests(rec["depth"], rec["flags"], rec["name"], rec["text"], rec["input_hashes"],
                         rec["output_hashes"])


def _recorded_reports(fn, args, kwargs, runs: int, hash_fn, all_threads: bool = False) -> list[Report]:
    """Records ``fn(*args, **kwargs)`` ``runs`` times and compares each run with
    the first (encoded once); stops at the first report that is not ok or
    compared no hash (an incomplete one goes on: a later run may differ).
    What assert_deterministic and the pytest plugin check (_failure)."""
    before = _argument_hashes(args, kwargs)
    rng = _rng_state()
    first = _Side.of(_record(fn, args, kwargs, hash_fn, all_threads))
    reports: list[Report] = []
    for i in range(1, runs):
        _set_rng_state(rng)
        other = _Side.of(_record(fn, args, kwargs, hash_fn, all_threads))
        rep = compare(first, other, runs=(0, i))
        if not rep.ok:
            rep.carried = _carried_state(first, other, rep, _module_state(fn))
            changed = [k for k, v in _argument_hashes(args, kwargs).items() if before.get(k) != v]
            if changed:
                rep.notes.append(f"fn changed its argument(s) {', '.join(changed)} in place: each run started from "
                                 "what the run before it left, not from the same inputs; give it inputs it does not "
                                 "change (a function that makes or clones them), or reset them in fn")
        reports.append(rep)
        if not rep.ok or rep.hashed == 0:
            break
    return reports


def _failure(reports: list[Report]) -> tuple[str, Report] | None:
    """(what, report) that fails assert_deterministic / the pytest plugin, or
    None: runs that differ first, then nothing hashed, then a match of
    incomplete recordings (Note [A match needs whole recordings] in
    kdebug/cli.py)."""
    for rep in reports:
        if not rep.ok:
            return "differ", rep
    for rep in reports:
        if rep.hashed == 0:
            return "nothing hashed", rep
    for rep in reports:
        if rep.gaps:
            return "no verdict", rep
    return None


NO_VERDICT = ("kdebug: no verdict: the runs match in what was recorded, but a recording is incomplete, and what "
              "it missed was not compared (compiled work on a thread the recording does not follow: "
              "all_threads=True records every thread)\n")


# Note [Each run from the same generator state]
# assert_deterministic and the pytest plugin run fn several times in one
# process.  fn drawing from torch's default generators (dropout, Inductor's
# kernel seeds, torch.randn) would otherwise start each run where the last
# left them, and a seeded training step was reported as "this op drew other
# random numbers ... seed it", which it was.  Each run starts from the
# default generators' state the first run started from (the CPU one, and
# each CUDA device's once CUDA is initialized); afterwards they are where
# one call of fn leaves them.  Generators fn makes or is given are its own.


def _rng_state() -> tuple:
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    return torch.get_rng_state(), cuda


def _set_rng_state(state: tuple) -> None:
    cpu, cuda = state
    torch.set_rng_state(cpu)
    if cuda is not None:
        torch.cuda.set_rng_state_all(cuda)


def _argument_hashes(args, kwargs) -> dict:
    """{"args[0]" / "kwargs['x']" path: bitwise hash} of every tensor among
    fn's arguments, taken outside any recording (what assert_deterministic
    checks they still hold after the runs)."""
    import torch.utils._pytree as pytree

    from . import hashing

    out = {}
    for path, leaf in pytree.tree_flatten_with_path((tuple(args), dict(kwargs)))[0]:
        if isinstance(leaf, torch.Tensor):
            name = ("args" if path[0].idx == 0 else "kwargs") + pytree.keystr(path[1:])
            try:
                out[name] = hashing.bitwise(leaf, on_host=True)
            except Exception:  # (a tensor kdebug cannot hash: not checked)
                pass
    return out


def assert_deterministic(fn, *args, runs: int = 2, hash_fn="bitwise", all_threads: bool = False,
                         **kwargs) -> list[Report]:
    """Runs ``fn(*args, **kwargs)`` ``runs`` times under a DebugMode with
    bitwise input and output hashes and compares every run with the first.
    Raises AssertionError with the first-divergence report when they differ,
    when nothing was hashed, and when the runs match but a recording is
    incomplete (no verdict).  ``all_threads=True`` records compiled launches
    on every thread (DebugMode(record_all_threads=True)), not only fn's."""
    if runs < 2:
        raise ValueError("assert_deterministic needs runs >= 2")
    reports = _recorded_reports(fn, args, kwargs, runs, hash_fn, all_threads)
    failed = _failure(reports)
    if failed is not None:
        what, rep = failed
        head = {"differ": "kdebug: runs differ\n",
                "nothing hashed": "kdebug: nothing was hashed; is fn running compiled code under this thread?\n",
                "no verdict": NO_VERDICT}[what]
        raise AssertionError(head + str(rep))
    return reports


def compare_many(runs: Iterable) -> list[Report]:
    """Every run compared with the first (encoded once)."""
    runs = list(runs)
    first = _Side.of(runs[0])
    return [compare(first, r, runs=(0, i)) for i, r in enumerate(runs[1:], 1)]
