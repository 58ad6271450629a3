"""Where the first NaN or infinity came from (Note [First non-finite value]).

    with kdebug.DebugMode(check_finite=True) as dm:
        loss = compiled(x); loss.backward()
    print(dm.first_nonfinite())          # a FiniteReport; .first is the origin

    kdebug.finite.check(run)             # a DebugMode, a kdebug.Run or a trace path

Note [First non-finite value]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
``check_finite=True`` records the stats hash (Note [The stats hash] in
csrc/core/kd_hash.h) of what every kernel launch and aten op writes: counts of
NaN, +inf and -inf and the largest finite magnitude, computed on the tensor's
device in kdebug's hashing pass (on the GPU queued on the kernel's stream and
read back in bulk: no synchronization per kernel, the device is synchronized
only when results are read).  ``check_finite="inputs"`` also takes the stats of
what each step reads, before it runs (log_tensor_hashes(hash_inputs=True)):
about twice the hashing, and the only way to see values that come from
outside the recording.

The verdict walks the steps (launches and aten ops) in launch order with a
memory map (Note [Data flow], kdebug/dataflow.py): each write is painted with
its stats.  For every read, what it held is known from its pre-launch stats
when taken, else from the recorded writes that own its bytes; a read with
neither (a parameter, a program input, a write kdebug did not see) is from
outside the recording and unchecked.  A step that writes non-finite values is

- the **origin** when none of its reads held non-finite values (the first one
  is the answer; its unchecked reads are listed: with ``check_finite=True``
  a NaN already in a parameter or input would also end here, and
  ``check_finite="inputs"`` tells the two apart);
- **inherited** when a read held them.

A read holding non-finite values that no recorded write put there is where
they **entered from outside** the recording (an input that already held NaN).

Why the first such write is trustworthy even from the memory map alone:
until some step writes a non-finite value, no painted write holds one, so
a stale owner (memory freed and reused without a recorded write, a fresh
buffer Inductor passes as in_out_ptr) can never make a finite read look
non-finite.  After the first non-finite value, a read overlapping a
non-finite write counts as non-finite even where the bytes it read were
finite (partial overlap): later origins may be called inherited, never the
reverse.  Kernel reads that alias the same launch's writes (a concatenation's
whole buffer) are not counted: part of them was not yet written.

The hint reads what the step computes (the kernel's post-grad FX nodes and
name, or the aten op) against the kinds counted: NaN from log/sqrt/pow of a
negative value, -inf from log of zero, ±inf or NaN from a division, +inf from
exp or an overflow of a 16-bit float (the largest finite input magnitude is
shown with the dtype's largest finite value).
"""
from __future__ import annotations

import dataclasses
import math
import re
from typing import Any

from .hashing import Stats

_LOGS = {"log", "log2", "log10", "log1p", "sqrt", "rsqrt", "pow", "acos", "asin", "acosh", "atanh", "xlogy",
         "lgamma", "digamma", "polygamma", "erfinv", "logit"}
_DIVS = {"div", "reciprocal", "true_divide", "divide", "remainder", "fmod", "rsqrt", "softmax", "_softmax",
         "log_softmax", "_log_softmax", "layer_norm", "native_layer_norm", "batch_norm", "var", "std", "norm",
         "mean"}
_GROWS = {"exp", "exp2", "expm1", "pow", "mul", "mm", "bmm", "addmm", "matmul", "sum", "cumsum", "cosh", "sinh",
          "softplus", "square", "add"}
_FMAX = {"float16": 65504.0, "bfloat16": 3.3895313892515355e38, "float32": 3.4028234663852886e38,
         "float64": 1.7976931348623157e308, "float8_e4m3fn": 448.0, "float8_e5m2": 57344.0}
_SHORT = {"f16": "float16", "bf16": "bfloat16", "f32": "float32", "f64": "float64"}


@dataclasses.dataclass(frozen=True)
class TensorCheck:
    """One tensor a step read or wrote, with its stats (None: not checked)."""

    label: str
    stats: Stats | None
    dtype: str | None = None
    where: str = ""  # reads: "before the step" | "written by <step>" | "outside the recording"

    @property
    def nonfinite(self) -> bool:
        return self.stats is not None and self.stats.nonfinite > 0

    def counts(self) -> str:
        s = self.stats
        if s is None:
            return "not checked"
        parts = [f"{n} {k}" for k, n in (("NaN", s.nan), ("+inf", s.posinf), ("-inf", s.neginf)) if n]
        return (", ".join(parts) or "all finite") + f"; max finite |x| {s.absmax:.6g}"

    def to_json(self) -> dict:
        s = self.stats
        return {"label": self.label, "dtype": self.dtype, "where": self.where,
                "stats": None if s is None else {"nan": s.nan, "posinf": s.posinf, "neginf": s.neginf,
                                                 "absmax": s.absmax, "sum": s.sum if math.isfinite(s.sum) else None}}


@dataclasses.dataclass
class NonFiniteStep:
    """A launch or aten op that wrote non-finite values."""

    index: int            # position in the run's operators
    kind: str             # "kernel" | "aten"
    name: str
    label: str            # "kernel #3 cpp_fused_log_0" / "op #7 aten::log"
    outputs: list         # TensorCheck of every written tensor that holds NaN / inf
    inputs: list          # TensorCheck of every tensor it read
    status: str           # "origin" | "inherited"
    nodes: tuple = ()     # post-grad FX nodes (kernels, Note [Kernel provenance])
    source: tuple = ()    # the user's source lines of those nodes
    code_lines: tuple = ()  # generated-source lines that may make them (kernels, in-process only)
    hint: str = ""

    @property
    def unchecked_inputs(self) -> list:
        return [t.label for t in self.inputs if t.stats is None]

    @property
    def max_finite_input(self) -> float | None:
        vals = [t.stats.absmax for t in self.inputs if t.stats is not None]
        return max(vals) if vals else None

    def to_json(self) -> dict:
        return {"index": self.index, "kind": self.kind, "name": self.name, "label": self.label,
                "status": self.status, "outputs": [t.to_json() for t in self.outputs],
                "inputs": [t.to_json() for t in self.inputs], "nodes": list(self.nodes),
                "source": list(self.source), "code_lines": list(self.code_lines), "hint": self.hint,
                "unchecked_inputs": self.unchecked_inputs}

    def describe(self) -> list[str]:
        out = [f"{self.label} ({self.status})"]
        for t in self.outputs:
            out.append(f"  wrote {t.label}{' ' + t.dtype if t.dtype else ''}: {t.counts()}")
        for t in self.inputs:
            out.append(f"  read  {t.label}{' ' + t.dtype if t.dtype else ''}: {t.counts()}"
                       + (f" ({t.where})" if t.where else ""))
        if self.nodes:
            out.append("  FX nodes: " + ", ".join(self.nodes))
        for s in self.source:
            out.append(f"  source: {s}")
        for c in self.code_lines:
            out.append(f"  kernel code: {c}")
        if self.hint:
            out.append(f"  hint: {self.hint}")
        return out


@dataclasses.dataclass
class FiniteReport:
    """The verdict of a check_finite recording (Note [First non-finite value])."""

    first: NonFiniteStep | None          # the first origin
    entered: list                        # (step label, read label) where values came from outside, in order
    inherited: int                       # steps that wrote non-finite values they read
    steps: int                           # steps walked
    unchecked: int                       # steps that wrote tensors without stats (nothing to check)
    inputs_checked: bool                 # pre-launch stats were taken (check_finite="inputs")
    nonfinite_steps: list = dataclasses.field(default_factory=list)  # NonFiniteStep, first 20

    @property
    def clean(self) -> bool:
        return self.first is None and not self.entered and not self.inherited

    def summary(self) -> str:
        lines = []
        if self.entered:
            step, arg = self.entered[0]
            lines.append(f"kdebug nan: non-finite values ENTERED FROM OUTSIDE the recording: {step} read {arg} "
                         "already holding them (no recorded step wrote them)")
        if self.first is not None:
            lines.append(f"kdebug nan: first step to write NaN/inf from finite inputs: {self.first.label}")
            lines += self.first.describe()
            unchecked = self.first.unchecked_inputs
            if unchecked:
                lines.append(f"  note: {', '.join(unchecked)} came from outside the recording and "
                             + ("could not be checked" if self.inputs_checked else
                                "were not checked (check_finite=True hashes what steps write; "
                                "check_finite='inputs' also checks what they read, about twice the hashing)"))
        elif not self.entered:
            lines.append("kdebug nan: no recorded step wrote NaN or inf" if not self.inherited else
                         "kdebug nan: non-finite values were written, but every writer read them already")
        lines.append(f"({self.steps} steps checked, {self.inherited} inherited non-finite values, "
                     f"{self.unchecked} wrote tensors without stats)")
        return "\n".join(lines)

    __str__ = summary

    def to_json(self) -> dict:
        return {"first": self.first.to_json() if self.first else None,
                "entered": [{"step": s, "read": a} for s, a in self.entered], "inherited": self.inherited,
                "steps": self.steps, "unchecked": self.unchecked, "inputs_checked": self.inputs_checked,
                "nonfinite_steps": [s.to_json() for s in self.nonfinite_steps]}


def stats_of(h: Any) -> Stats | None:
    """The Stats in a hash value (one kind, or a tuple of several), or None."""
    if isinstance(h, Stats):
        return h
    if isinstance(h, tuple):
        return next((x for x in h if isinstance(x, Stats)), None)
    return None


class _Painted:
    """A write in the memory map: its slot and stats (dataflow.MemoryMap needs .slot)."""

    __slots__ = ("slot", "stats", "step")

    def __init__(self, slot, stats, step):
        self.slot, self.stats, self.step = slot, stats, step


def _op_dtypes(op) -> list[str]:
    """Dtypes of an aten op's output tensors, read from its rendered line ('-> t: f16[4]')."""
    try:
        text = str(op)
    except Exception:
        return []
    out = text.split("->", 1)[1] if "->" in text else ""
    return [_SHORT.get(m, m) for m in re.findall(r"\b(bf16|f16|f32|f64)\[", out)]


def check(run) -> FiniteReport:
    """The verdict of Note [First non-finite value] for a recorded run (a
    kdebug DebugMode, a kdebug.Run, or a trace path) made with
    check_finite (or log_tensor_hashes with a 'stats' kind)."""
    from . import dataflow
    from .compare import steps_of

    steps = steps_of(run)
    dm_ops = list(run.operators) if hasattr(run, "_recorder") else None
    mm = dataflow.MemoryMap()
    first, entered, inherited, unchecked, inputs_checked = None, [], 0, 0, False
    found: list[NonFiniteStep] = []
    for st in steps:
        if any(stats_of(v) is not None for v in st.pre.values()):
            inputs_checked = True
        writes = [(s, stats_of(st.post.get(s.key))) for s in st.writes]
        if st.writes and all(x is None for _, x in writes):
            unchecked += 1
        aliased = set()
        if st.kind == "kernel":
            wr = [(s.lo, s.hi, s.device) for s in st.writes]
            aliased = {s.key for s in st.reads if s.key not in {w.key for w in st.writes}
                       and any(d == s.device and lo < s.hi and s.lo < hi for lo, hi, d in wr)}
        reads = []
        for s in st.reads:
            if s.key in aliased:
                continue
            pre = stats_of(st.pre.get(s.key))
            owners = mm.writers(s)
            if pre is not None:
                reads.append((s, pre, "before the step", owners))
            elif owners and all(w.stats is not None for w in owners):
                bad = [w for w in owners if w.stats.nonfinite]
                src = bad[0] if bad else owners[-1]
                reads.append((s, src.stats, f"written by {src.step}", owners))
            else:
                reads.append((s, None, "outside the recording" if not owners else "written without stats", owners))
        if st.kind == "aten" and not st.flow_known:  # recorded without extents: its reads are unknown
            reads.append((dataflow.Slot("in/?", "its inputs (no extents recorded)", ("?", -1), 0, 0), None,
                          "not recorded", []))
        for s, x, where, owners in reads:
            if x is not None and x.nonfinite and not any(w.stats is not None and w.stats.nonfinite for w in owners):
                if where == "before the step":
                    entered.append((st.label(), st.labels.get(s.key, s.key)))
        bad_out = [(s, x) for s, x in writes if x is not None and x.nonfinite]
        if bad_out:
            tainted = any(x is not None and x.nonfinite for _, x, _, _ in reads)
            status = "inherited" if tainted else "origin"
            if tainted:
                inherited += 1
            if status == "origin" or len(found) < 20:
                nf = _describe(st, bad_out, reads, status, dm_ops)
                if len(found) < 20:
                    found.append(nf)
                if status == "origin" and first is None:
                    first = nf
        for s, x in writes:
            mm.paint(_Painted(s, x, st.label()))
    writers = sum(1 for st in steps if st.writes)
    if writers and unchecked == writers:
        raise ValueError(f"none of the {writers} recorded steps that wrote tensors has stats, so nothing can be "
                         "said about NaN or inf: record with DebugMode(check_finite=True) (or "
                         "log_tensor_hashes with a 'stats' hash kind)")
    return FiniteReport(first, entered, inherited, len(steps), unchecked, inputs_checked, found)


def _describe(st, bad_out, reads, status: str, dm_ops) -> NonFiniteStep:
    dtypes: dict = {}
    if st.kind == "kernel":
        dtypes = {n: str(t.dtype).replace("torch.", "") for n, t in st.tensors.items() if hasattr(t, "dtype")}
    elif dm_ops is not None and st.index < len(dm_ops):
        ds = _op_dtypes(dm_ops[st.index])
        dtypes = {s.key: ds[i] for i, s in enumerate(st.writes) if i < len(ds)}
    lab = lambda s: st.labels.get(s.key, s.key)  # noqa: E731
    outs = [TensorCheck(lab(s), x, dtypes.get(s.key)) for s, x in bad_out]
    ins = [TensorCheck(lab(s), x, dtypes.get(s.key), where) for s, x, where, _ in reads]
    nodes, source, code = (), (), ()
    if st.kind == "kernel":
        nodes, source = _provenance(st.name)
        if dm_ops is not None:
            code = _code_lines(st.name)
    nf = NonFiniteStep(st.index, st.kind, st.name, st.label(), outs, ins, status, nodes, source, code)
    nf.hint = hint(nf)
    return nf


def _provenance(kernel: str) -> tuple[tuple, tuple]:
    from . import provenance

    try:
        ps = provenance.provenances(kernel)
        if not ps:  # lowered before kdebug's hooks: the generated module's own comments
            p = provenance.kernel_provenance(kernel)
            ps = [p] if p is not None else []
    except Exception:  # provenance is extra: the verdict stands without it
        return (), ()
    nodes, source = [], []
    for p in ps:
        nodes += [n for n in p.nodes if n not in nodes]
        source += [s for s in p.source if s not in source]
    return tuple(nodes), tuple(source)


_SUSPECT = re.compile(r"\b(log|log2|log10|log1p|sqrt|rsqrt|exp|exp2|pow|reciprocal|div)\b|[^/]/[^/=]")


def _code_lines(kernel: str, limit: int = 6) -> tuple:
    """Lines of the kernel's generated source that compute a log, sqrt, exp,
    pow or division (only when one loaded module defines the kernel)."""
    from . import _upstream
    from .kernel_code import source_of

    texts = set()
    for mod in _upstream.generated_modules():
        path = getattr(mod, "__file__", None)
        if not path or kernel not in vars(mod):
            continue
        try:
            with open(path) as f:
                src = source_of(f.read(), kernel)
        except (OSError, UnicodeDecodeError):
            continue
        if src:
            texts.add(src)
    if len(texts) != 1:
        return ()
    out = []
    for line in next(iter(texts)).splitlines():
        s = line.strip()
        if s and not s.startswith(("#", "//", "@", "import", "def ", "extern", "from ")) and _SUSPECT.search(s):
            out.append(s[:160])
            if len(out) == limit:
                break
    return tuple(out)


def _words(nf: NonFiniteStep) -> set:
    text = " ".join((nf.name,) + tuple(nf.nodes) + tuple(nf.code_lines))
    return {w for w in re.split(r"[^A-Za-z0-9]+", text.replace("aten::", "")) if w}


def hint(nf: NonFiniteStep) -> str:
    """What most likely made the values, from what the step computes and
    the kinds of non-finite values it wrote."""
    words = _words(nf)
    nan = sum(t.stats.nan for t in nf.outputs)
    pinf = sum(t.stats.posinf for t in nf.outputs)
    ninf = sum(t.stats.neginf for t in nf.outputs)
    mx = nf.max_finite_input
    mx_text = f"the largest finite input magnitude is {mx:.6g}" if mx is not None else \
        "its inputs' magnitudes were not checked"
    out = []
    if nan and words & _LOGS:
        out.append("NaN from log/sqrt/pow of a negative value")
    if ninf and words & {"log", "log2", "log10", "log1p", "xlogy"}:
        out.append("-inf from log of zero")
    if words & _DIVS and (nan or pinf or ninf):
        out.append("division by zero (x/0 is ±inf, 0/0 is NaN)")
    dtypes = {t.dtype for t in nf.outputs if t.dtype}
    if (pinf or ninf) and (words & _GROWS or dtypes & {"float16", "bfloat16"}):
        lim = ", ".join(f"{d} max {_FMAX[d]:.6g}" for d in sorted(dtypes) if d in _FMAX)
        what = "exp of a large input" if words & {"exp", "exp2", "expm1"} else "a value too large for its dtype"
        out.append(f"overflow: {what}" + (f" ({lim})" if lim else ""))
    if nan and (pinf or ninf) and not out:
        out.append("inf - inf or 0 * inf")
    if not out:
        out.append("look at the kernel's source lines below" if nf.kind == "kernel" else "see the op's inputs")
    return "; ".join(out) + f"; {mx_text}"
