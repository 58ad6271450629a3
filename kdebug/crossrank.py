"""Cross-rank comparison: do a job's replicas agree, and if not, where did one
start to differ?

Note [Cross-rank comparison]
Ranks of a data-parallel job compute on different data, so most of their
steps differ for a good reason.  What must agree is known:

- the outputs of collectives that leave every rank of the group with the same
  value (all-reduce, broadcast, all-gather: collectives.outputs_agree), which
  is where DDP's gradients are after the reduction;
- tensors the program marks with ``kdebug.replicated(t, name)`` (parameters
  after the optimizer step, a loss that is all-reduced, ...);
- with no mark and no code change, the parameters (and broadcast buffers) of
  every DistributedDataParallel module the program still holds when the
  recording ends (kdebug/ddp_final.py, Note [DDP final parameters]).

Each rank R is compared with rank 0 by the run-to-run engine (kdebug/compare.py:
aligned records, data flow, Note [Data flow]).  By its rules a *root* is a
step whose inputs were identical on both ranks and whose outputs differ: a
step that computed differently on rank R from the same inputs (a bad kernel,
a faulty device) -- a rank-local root, reported whatever its inputs' origin.
An *outside* root is a difference that entered from outside the recording
(each rank's own data): expected, counted, not a divergence by itself; so
is a random draw that gave other numbers from identical inputs (each rank
seeds its own generator, for its own dropout masks: Note [Each rank's own
generator]).  A
collective whose outputs must agree and differ is a root itself, whatever
its inputs (they are meant to differ).  A marked replica that differs is
reported with the first root (rank-local or collective) before it, or as
coming from each rank's own inputs when there is none.

Ranks' replicas DIVERGE when any rank has a consequential rank-local root, a
disagreeing collective or a differing mark.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

import torch

from . import collectives, program_reads
from .compare import Report, Step, _diff_text, _op_text, _root_lines, _Side, _text_delta, draws_random
from .compare import compare as compare_runs

MARK = program_reads.REPLICATED


@dataclass
class RankFinding:
    """One reason a rank's replicas differ from the reference rank's."""

    what: str          # "rank-local root", "collective", "replica"
    step: Step
    position: int      # aligned position
    text: str


@dataclass
class RankComparison:
    rank: int
    reference: int
    report: Report
    findings: list = field(default_factory=list)  # RankFinding, in record order
    outside: int = 0                              # differences from each rank's own inputs
    structure_local: bool = False                 # replicas dump: every structural difference is rank-local

    @property
    def ok(self) -> bool:
        return not self.findings and (not self.report.structural or self.structure_local)


@dataclass
class RanksReport:
    stem: str
    reference: int
    ranks: list
    comparisons: list

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.comparisons)

    def __bool__(self) -> bool:
        return self.ok

    def __str__(self) -> str:
        return format_ranks(self)


# Note [Replica state records] (csrc/kd_state_record.c): the flight recorder's records of what
# must agree across data-parallel ranks; no computation, so never a rank-local root
STATE_RECORDS = {"kdebug::flight_grads": "the gradients its optimizer step started from (after their reduction)",
                 "kdebug::flight_state": "the parameters and optimizer state its optimizer step left",
                 "kdebug::flight_replicated": "a value marked with kdebug.replicated"}


def _differs(a: Step, b: Step) -> list:
    """Outputs hashed on both ranks whose hashes differ (an output one rank
    could not hash is unknown there, never a difference: META stats
    collectives_failed / collectives_incomplete count those)."""
    keys = sorted(set(a.post) | set(b.post))
    return [(a.labels.get(k, k), a.post.get(k), b.post.get(k)) for k in keys
            if a.post.get(k) is not None and b.post.get(k) is not None and a.post.get(k) != b.post.get(k)]


def _optimizer_windows(side, pa):
    """position -> whether it lies inside an optimizer step of a flight dump:
    after a kdebug::flight_grads record and before the flight_state after it."""
    inside, state = [], False
    for k in range(len(pa)):
        name = side.step(int(pa[k])).name if int(pa[k]) >= 0 else ""
        if name == "kdebug::flight_grads":
            state = True
        elif name == "kdebug::flight_state":
            state = False
        inside.append(state)
    return lambda k: 0 <= k < len(inside) and inside[k]


def compare_rank(run_ref, run_r, reference: int, rank: int) -> RankComparison:
    """Rank ``rank``'s run against the reference rank's (Note [Cross-rank comparison])."""
    ref_name, rank_name = f"rank {reference}", f"rank {rank}"  # the sides in the text (compare.side_name)
    rep = compare_runs(run_ref, run_r, runs=(ref_name, rank_name))
    out = RankComparison(rank, reference, rep)
    al = rep.alignment
    pa, pb = al["pa"], al["pb"]
    A, B = _Side.of(run_ref), _Side.of(run_r)
    roots_at = []
    # a flight recorder's dump of compare="replicas" (Note [Flight recorder]): kernels_only, no input
    # hashes, each rank on its own data: a kernel outside an optimizer step cannot be shown to have
    # had identical inputs, so only the optimizer's own launches (between a flight_grads record and
    # the flight_state after it) can be rank-local roots
    flight = (getattr(A, "meta", None) or {}).get("flight") or {}
    windows = _optimizer_windows(A, pa) if flight.get("compare") == "replicas" else None
    if windows is not None:
        # the same replica records in the same order on both ranks: launches one rank made and the
        # other did not (rank 0's evaluation) are its own work, not a replica difference
        def records(side):
            return [side.step(i).name for i in range(side.n) if side.step(i).name in STATE_RECORDS]
        out.structure_local = records(A) == records(B)
    settings = []  # (position, text) of steps called with other floating-point arguments on this rank
    draws = []     # (position, text) of random draws that gave other numbers on this rank
    for x in rep.roots:
        if x.step_a.name in STATE_RECORDS:
            continue  # reported below, as a replica (never "entered from outside": it must agree)
        if x.kind == "root" and windows is not None and not windows(x.position):
            out.outside += 1
            continue
        if x.step_a.kind == "aten" and draws_random(x.step_a.name):
            # Note [Each rank's own generator]: a draw from identical inputs that gave other numbers drew
            # from a generator in another state; ranks seed their own (torch.manual_seed(base + rank), for
            # their own dropout masks), as they read their own data: expected, counted, no divergence; a
            # replica that differs later names it as a possible cause
            draws.append((x.position, f"{x.step_a.label()} drew other random numbers on rank {rank} (its "
                                      "generator was in another state: if what it made must be the same on every "
                                      "rank, seed that generator the same on every rank)"))
            out.outside += 1
            continue
        if x.kind == "outside" and any(lab == "non-tensor arguments / shapes" for lab, _, _ in x.outside_inputs):
            if x.step_a.kind == "aten":
                ta, tb = _op_text(A._call(x.step_a.index)), _op_text(B._call(x.step_b.index))
                if ta and tb and ta != tb and _only_floats_differ(ta, tb):
                    settings.append((x.position, f"{x.step_a.label()} was called with other arguments on rank "
                                                 f"{rank} ({_text_delta(ta, tb, ref_name, rank_name)})"))
        if x.kind == "root":
            lines = _root_lines(x, ref_name, rank_name)
            out.findings.append(RankFinding("rank-local root", x.step_a, x.position,
                                            f"{x.step_a.label()} on rank {rank}: " + "; ".join(lines)))
            roots_at.append((x.position, x.step_a.label()))
        else:
            out.outside += 1
    for k in al["diff"].tolist():
        a, b = A.step(int(pa[k])), B.step(int(pb[k]))
        if a.kind != "aten":
            continue
        if collectives.is_collective_name(a.name) and collectives.outputs_agree(a.name):
            d = _differs(a, b)
            if d and not any(f.position == k for f in out.findings):
                out.findings.append(RankFinding(
                    "collective", a, k,
                    f"{a.label()} on rank {rank}: its output must be the same on every rank of the group, and "
                    f"{_diff_text(d, ref_name, rank_name)} -> the collective itself (or its transport) "
                    f"gave rank {rank} another result"))
                roots_at.append((k, a.label()))
    for k in al["diff"].tolist():
        a, b = A.step(int(pa[k])), B.step(int(pb[k]))
        if a.kind == "aten" and a.name.startswith(MARK):
            keys = sorted(set(a.pre) | set(b.pre))
            d = [(a.labels.get(x, x), a.pre.get(x), b.pre.get(x)) for x in keys if a.pre.get(x) != b.pre.get(x)]
            if not d:
                continue
            before = [lab for pos, lab in sorted(roots_at) if pos < k]
            cause = (f"first root before it: {before[0]}" if before else _setting_before(settings, draws, k) or
                     "no rank-local root or collective before it: the difference came from each rank's own "
                     "inputs (data, RNG), recorded outside")
            text = getattr(A._call(int(pa[k])), "_text", None) or a.name
            out.findings.append(RankFinding("replica", a, k, f"{text} differs on rank {rank} "
                                            f"({_diff_text(d, ref_name, rank_name)}); {cause}"))
    first_replica = None
    for k in al["diff"].tolist():
        a, b = A.step(int(pa[k])), B.step(int(pb[k]))
        if a.name not in STATE_RECORDS:
            continue
        d = _differs(a, b)
        only = sorted(set(a.post) ^ set(b.post))  # e.g. a gradient one rank did not have
        if not d and not only:
            continue
        before = [lab for pos, lab in sorted(roots_at) if pos < k]
        if before:
            cause = f"first root before it: {before[0]}"
        elif first_replica is None and (setting := _setting_before(settings, draws, k)):
            cause = setting
        elif first_replica is not None:
            cause = f"after the replica difference at {first_replica}"
        elif a.name == "kdebug::flight_grads":
            cause = ("no rank-local root or collective recorded before it: the reduction of the gradients (a "
                     "collective the flight recorder does not record) or a change to them after it gave rank "
                     f"{rank} other gradients")
        elif a.name == "kdebug::flight_replicated":
            cause = ("no recorded launch before it differs: the value was computed from each rank's own inputs "
                     "(data, RNG) or changed outside the recorded launches")
        else:
            cause = ("no recorded launch before it differs: the optimizer step's own work (eager ops are not "
                     "recorded) computed another result from the same gradients, or the state was changed "
                     "outside the step")
        first_replica = first_replica or a.label()
        what = [_diff_text(d, ref_name, rank_name)] if d else []
        if only:
            what.append("held on one rank only: " + ", ".join(
                f"{a.labels.get(x, b.labels.get(x, x))} ({ref_name if x in a.post else rank_name})" for x in only[:6])
                + (f" and {len(only) - 6} more" if len(only) > 6 else ""))
        out.findings.append(RankFinding("replica", a, k, f"{a.label()} ({STATE_RECORDS[a.name]}) differs on rank "
                                        f"{rank} ({'; '.join(what)}); {cause}"))
    out.findings.sort(key=lambda f: f.position)
    return out


# Note [Settings one rank had]
# A replica that differs with no rank-local root before it was put down to
# "each rank's own inputs (data, RNG)".  When a step before it was called with
# other non-tensor arguments on that rank (an optimizer's addcdiv_ with
# another step size: one rank's learning rate), the difference came from
# that setting, and the op text says which argument: the cause names it.
# Such a step is not a divergence by itself (ranks may differ in shapes: an
# uneven last batch), only the explanation of one.  Only floating-point
# arguments count: a rank's integer index into its data (select(x, 0,
# rank), every data-parallel job) was named as the setting at first (found
# by a review).  With no such step, the first random draw that differed on
# that rank is named (a value every rank must share, seeded per rank).


_NUMBER = re.compile(r"(?<![\w.])-?\d+(?:\.\d*)?(?:[eE][-+]?\d+)?")


def _only_floats_differ(ta: str, tb: str) -> bool:
    """Whether two op texts differ only in floating-point numbers (a step
    size, a weight decay): not in an integer (a rank's index into its data,
    select(x, 0, rank)), a shape or anything else."""
    na, nb = _NUMBER.findall(ta), _NUMBER.findall(tb)
    if len(na) != len(nb) or _NUMBER.sub("#", ta) != _NUMBER.sub("#", tb):
        return False
    changed = [(x, y) for x, y in zip(na, nb) if x != y]
    return bool(changed) and all(any(c in v for c in ".eE") for x, y in changed for v in (x, y))


def _setting_before(settings: list, draws: list, k: int) -> str | None:
    before = [t for pos, t in sorted(settings) if pos < k]
    if before:
        return (f"no rank-local root before it; first step called with other floating-point arguments: "
                f"{before[0]} -- a setting this rank had (a learning rate, a weight decay)")
    drew = [t for pos, t in sorted(draws) if pos < k]
    if drew:
        return f"no rank-local root before it; first random draw that differed: {drew[0]}"
    return None


def compare_ranks(run, reference: int = 0) -> RanksReport:
    """Every rank of a kdebug.ranks.RankedRun (or its stem path) against
    ``reference`` (Note [Cross-rank comparison])."""
    from . import ranks, trace

    if not isinstance(run, ranks.RankedRun):
        run = trace.load(run)
        if not isinstance(run, ranks.RankedRun):
            raise ValueError(f"{run.path} is one process's trace, not a job's per-rank traces (run.rank0.kdt, ...)")
    if reference not in run.ranks:
        raise ValueError(f"{run.stem}: no trace of reference rank {reference} (ranks {run.ranks})")
    held = {r: _flight_steps(run[r]) for r in run.ranks}
    if all(v is not None for v in held.values()) and not set.intersection(*(set(v) for v in held.values())):
        # (dumps written at one compare may still differ in the older steps each rank holds: a step is
        # held until its rank digested it, one window later on a GPU; those align as a structural prefix)
        text = "; ".join(f"rank {r}: {_span(v)}" for r, v in held.items())
        raise ValueError(f"{run.stem}: the ranks' flight recorder dumps hold no step in common ({text}): they were "
                         "written at different points (a requested fr.dump() on one rank, a signal on another), "
                         "and their records would be compared step against another step; compare dumps written "
                         "at the same point (the divergence's, or fr.dump() on every rank at the same step)")
    ref = _Side.of(run[reference])
    comps = [compare_rank(ref, run[r], reference, r) for r in run.ranks if r != reference]
    return RanksReport(run.stem, reference, run.ranks, comps)


def _flight_steps(run) -> list | None:
    """The steps a flight recorder dump holds (META flight.steps), or None for another trace."""
    flight = (getattr(run, "meta", None) or {}).get("flight")
    if not isinstance(flight, dict):
        return None
    return [k.get("step") for k in flight.get("steps", []) if isinstance(k, dict)]


def _span(steps: list | None) -> str:
    if not steps:
        return "no flight steps"
    return f"step {steps[0]}" if len(steps) == 1 else f"steps {steps[0]}..{steps[-1]}"


def format_ranks(r: RanksReport) -> str:
    lines = [f"kdebug ranks: {len(r.ranks)} rank(s) of {r.stem}, each compared with rank {r.reference}"]
    for c in r.comparisons:
        rep = c.report
        head = f"  rank {c.rank}: {rep.compared} records aligned, {rep.hashed} hashed"
        if c.outside:
            head += (f"; {c.outside} difference(s) entered from outside the recording (each rank's own data "
                     "or RNG: expected in data parallelism)")
        lines.append(head)
        for s in rep.structural[:5]:
            lines.append(f"    STRUCTURE{' (rank-local: the replica records agree)' if c.structure_local else ''}: {s}")
        if not c.findings:
            if rep.hashed == 0:
                lines.append("    nothing to compare: record with log_tensor_hashes (kdebug record does)")
            else:
                lines.append("    replicas MATCH: every collective that must agree did, no step computed "
                             "differently from identical inputs" + (", no marked replica differs"))
            continue
        f = c.findings[0]
        lines.append(f"    REPLICAS DIVERGE: first at {f.what} {f.text}")
        for g in c.findings[1:6]:
            lines.append(f"    also: {g.what} {g.text}")
        if len(c.findings) > 6:
            lines.append(f"    ... {len(c.findings) - 6} more")
    lines.append(f"kdebug ranks: replicas {'match' if r.ok else 'DIVERGE'}")
    return "\n".join(lines)


def replicated(t: torch.Tensor, name: str) -> torch.Tensor:
    """Marks ``t`` as a value every rank must hold identically (parameters
    after the optimizer step, an all-reduced loss): the active kdebug
    DebugMode records its hash under ``name``, and the cross-rank comparison
    reports the first mark that differs, with its root.  Returns ``t``;
    outside a recording it does nothing."""
    from . import _active, _aten_hooks, hashing
    from .mode import DebugMode

    if not isinstance(t, torch.Tensor):
        raise TypeError(f"kdebug.replicated takes a tensor, not {type(t).__name__}")
    if not isinstance(name, str) or not name:
        raise TypeError("kdebug.replicated needs a name (a non-empty string) for the value")
    dm = _active.debug_mode()
    if not isinstance(dm, DebugMode) or dm._recorder is None or not dm._entered:
        return t
    ref = getattr(dm, "_flight", None)  # weakref.ref to a FlightRecorder (kdebug/flight.py)
    flight = ref() if ref is not None else None
    if flight is not None:  # a FlightRecorder's: a record in its ring, compared with its step
        flight._mark(marked_value(t, name), name)
        return t
    entry = _aten_hooks.this_thread().hash_entry
    mark(dm, t, name, entry.spec if entry is not None else hashing.parse("bitwise")[1])
    return t


def marked_value(t: torch.Tensor, name: str) -> torch.Tensor:
    """The tensor whose data a mark of ``t`` hashes (_upstream.replica_value);
    a TypeError saying what to pass for one with no data of its own: its
    detach() under disabled dispatch has no storage, and hashing that crashed."""
    from . import _upstream

    value = _upstream.replica_value(t)
    if value is None:
        raise TypeError(f"kdebug.replicated({name!r}): a {type(t).__name__} has no data of its own to hash "
                        "(a sharded DTensor holds another part on each rank): pass the replicated value, "
                        "e.g. t.full_tensor()")
    if value.layout != torch.strided:
        raise TypeError(f"kdebug.replicated({name!r}): a {value.layout} tensor is not hashed as a replica (its "
                        "indices can be laid out differently on each rank): pass t.coalesce().values() and "
                        "t.coalesce().indices(), or t.to_dense()")
    return value


def mark(dm, t: torch.Tensor, name: str, spec) -> None:
    """Appends the replica record of ``t`` (its hash by ``spec``) named
    ``name`` to kdebug DebugMode ``dm``'s records."""
    from . import _C, _upstream, hashing

    t = marked_value(t, name)
    with _upstream.disable_torch_dispatch():
        h = hashing.start_value(t.detach(), spec)
    call = collectives.CollectiveCall(MARK, f"{MARK}({name!r}, {collectives._shape_text(t)})",
                                      getattr(dm, "call_depth", 0), True)
    call.log["input_hash"] = ((h,), {})
    ext = _C.tree_extents(((t,), {}))
    call._kd_extents = _C.OpExtents((None if ext is NotImplemented else ext, None))
    call.done.set()
    list.append(dm._ops, call)
