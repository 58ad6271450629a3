"""What torch.compile did with a program: its graphs, graph breaks,
recompilations and guards, as a typed report.

Note [Compile inspector]
~~~~~~~~~~~~~~~~~~~~~~~~
Dynamo already records what an accelerator team asks about; kdebug reads
its records instead of re-deriving them.  The source is torch's structured
trace (torch._logging.trace_structured, the "torch.__trace" logger, which
emits only while it has a handler; kdebug/_upstream.py,
structured_trace_logger): ``CompileInspector`` adds a handler for the time
of a ``with`` block and keeps these events, each tagged by dynamo with its
frame id and frame compile id (the compile id "F/C"):

- ``compilation_metrics``, one per frame compile: function, file, first
  line, guard_count, shape_env_guard_count, graph_op_count / node count /
  input count, recompile_reason, fail_type / fail_reason, compile time.
  These are dynamo's CompilationMetrics fields (a dataclass), not text;
  a frame compile that made a graph is one CompiledGraph.
- the ``recompile_reasons`` artifact (JSON): for each cached entry, the
  guard that failed, as "0/0: tensor 'x' size mismatch at index 0.
  expected 8, actual 9" (the compile id of the entry whose guard failed,
  then dynamo's own sentence).
- the ``dynamo_graph_break_reason`` artifact: dynamo's message, whose first
  two lines are "Graph break in user code at FILE:LINE" and "Graph Break
  Reason: ..." (the same format in 2.11 and 2.13); torch has no structured
  record of a break's user location outside torch._dynamo.explain, which
  resets dynamo and so cannot watch a running program.
- ``dynamo_cpp_guards_str``: the guard tree dynamo installed, one
  "+- KIND: check  # where" line per guard; parsed into Guard records
  (kind, check, source, where).  Python-level Guard objects reach only
  torch._dynamo.optimize(guard_export_fn=...), which a program's own
  torch.compile calls do not pass.

Text is parsed only in those two places, and what does not parse is kept
whole (GraphBreak.reason then holds the message; nothing is dropped
silently: ``unparsed`` counts lines kdebug could not read).
"""
from __future__ import annotations

import dataclasses
import json
import linecache
import logging
import re
import threading

from . import _upstream


@dataclasses.dataclass(frozen=True)
class Guard:
    kind: str  # TENSOR_MATCH, TYPE_MATCH, GLOBAL_STATE, ...
    check: str  # dynamo's text of the check
    source: str | None  # the guarded value, e.g. L['x'] (None: ambient state)
    where: str | None  # the user line (or torch line) that made the guard

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class CompiledGraph:
    """One frame compile by dynamo (compile id F/C: frame F, its C-th compile)."""

    compile_id: str
    function: str
    file: str | None
    line: int | None
    op_count: int | None
    node_count: int | None
    input_count: int | None
    guard_count: int | None
    shape_env_guard_count: int | None
    compile_seconds: float | None
    recompile_reason: str | None
    fail_type: str | None
    fail_reason: str | None
    guards: list[Guard] = dataclasses.field(default_factory=list)

    @property
    def is_resume(self) -> bool:
        """The rest of a function after a graph break (dynamo's torch_dynamo_resume_in_*)."""
        return self.function.startswith("torch_dynamo_resume_in_")

    @property
    def is_module_wrapper(self) -> bool:
        """Dynamo's own frame for torch.compile(module) (``inner`` in
        torch/_dynamo/external_utils.py, torch 2.13): every module compiled
        that way runs through this one frame, so the function name says
        nothing of which module, and another module's first compile counts as
        a recompilation of the frame (Note [Compiled modules share a frame])."""
        f = (self.file or "").replace("\\", "/")
        return self.function == "inner" and f.endswith("/_dynamo/external_utils.py")

    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        d["guards"] = [g.to_json() for g in self.guards]
        d["is_resume"] = self.is_resume
        d["is_module_wrapper"] = self.is_module_wrapper
        return d


@dataclasses.dataclass(frozen=True)
class GraphBreak:
    compile_id: str | None
    reason: str  # dynamo's reason, first line (the whole message when it did not parse)
    file: str | None
    line: int | None
    code: str | None  # the user's source line
    detail: str  # dynamo's full explanation and hints

    def where(self) -> str:
        if self.file is None:
            return "unknown location"
        return f"{self.file}:{self.line}" + (f": {self.code}" if self.code else "")

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class Recompile:
    compile_id: str  # the new compile
    function: str | None
    failed_guards: tuple  # (cached entry's compile id, dynamo's reason) per cached entry checked

    def to_json(self) -> dict:
        return {"compile_id": self.compile_id, "function": self.function,
                "failed_guards": [{"entry": e, "reason": r} for e, r in self.failed_guards]}


@dataclasses.dataclass
class CompileReport:
    graphs: list[CompiledGraph]
    graph_breaks: list[GraphBreak]
    recompiles: list[Recompile]
    unparsed: int = 0  # structured-trace payloads kdebug could not read (kept out, counted)

    @property
    def graph_count(self) -> int:
        """Graphs dynamo made and handed to the backend: a frame compile whose
        graph holds no op (a resumption after a break that only returns)
        makes none, as dynamo's explain() counts (they were counted: 12
        graphs where the backend was called 10 times)."""
        return sum(1 for g in self.graphs if g.op_count and g.fail_type is None)

    @property
    def break_count(self) -> int:
        return len(self.graph_breaks)

    def unique_breaks(self) -> list[tuple[GraphBreak, int]]:
        """Breaks grouped by place and reason (a break repeats in every recompile of its frame)."""
        seen: dict = {}
        for b in self.graph_breaks:
            key = (b.file, b.line, b.reason)
            if key in seen:
                seen[key][1] += 1
            else:
                seen[key] = [b, 1]
        return [(b, n) for b, n in seen.values()]

    def to_json(self) -> dict:
        return {"graph_count": self.graph_count, "graph_break_count": self.break_count,
                "recompile_count": len(self.recompiles), "unparsed": self.unparsed,
                "graphs": [g.to_json() for g in self.graphs],
                "graph_breaks": [b.to_json() for b in self.graph_breaks],
                "recompiles": [r.to_json() for r in self.recompiles]}

    def summary(self, guards: bool = False) -> str:
        ub = self.unique_breaks()
        lines = [f"kdebug compile inspector: {self.graph_count} graph(s) from {len(self.graphs)} frame compile(s), "
                 f"{self.break_count} graph break(s) ({len(ub)} distinct), {len(self.recompiles)} recompilation(s)"]
        if ub:
            lines.append("\ngraph breaks:")
            for b, n in ub:
                lines.append(f"  {b.where()}" + (f"  (x{n})" if n > 1 else ""))
                lines.append(f"    reason: {b.reason}")
        if self.recompiles:
            lines.append("\nrecompilations (the guard that failed):")
            for r in self.recompiles:
                lines.append(f"  {r.compile_id} {r.function or '?'}:")
                for entry, reason in r.failed_guards:
                    lines.append(f"    cached {entry}: {reason}")
        lines.append("\ngraphs:")
        for g in self.graphs:
            where = f"{g.file}:{g.line}" if g.file else "?"
            if g.fail_type:
                lines.append(f"  {g.compile_id} {g.function} ({where}): FAILED {g.fail_type}: {_first_line(g.fail_reason)}")
            else:
                lines.append(f"  {g.compile_id} {g.function} ({where}): {g.op_count} ops, {g.guard_count} guards"
                             + (f" ({g.shape_env_guard_count} on shapes)" if g.shape_env_guard_count else ""))
            if guards:
                for gd in g.guards:
                    lines.append(f"      {gd.kind}: {gd.check}" + (f"  [{gd.where}]" if gd.where else ""))
        if any(g.is_module_wrapper for g in self.graphs):
            # Note [Compiled modules share a frame]: dynamo compiles torch.compile(module) through
            # one wrapper frame of its own (torch 2.13), whatever the module: its metrics name
            # that frame, and a second module's first compile is a recompilation of it (its guards
            # on the module failed), counted against the frame's recompile limit: on torch 2.13 the
            # ninth distinct nn.Sequential of a process ran uncompiled (recompile_limit = 8)
            lines.append("\nnote: 'inner' (torch/_dynamo/external_utils.py) is dynamo's own frame for "
                         "torch.compile(module): every module compiled that way runs through it, so it does "
                         "not say which module, and another module's first compile is counted as a "
                         "recompilation of it (its guards on the module failed, e.g. fn._modules or the "
                         "module's type). They share the frame's torch._dynamo.config.recompile_limit: "
                         "modules compiled past it run uncompiled")
        if self.unparsed:
            lines.append(f"\n{self.unparsed} structured-trace record(s) could not be read (left out)")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()


def _first_line(reason: str | None) -> str:
    """A failure's first telling line (after dynamo's "backend=... raised:")."""
    text = (reason or "").split("raised:", 1)[-1].strip()
    return text.splitlines()[0] if text else "?"


_BREAK_AT = re.compile(r"Graph break[^\n]* in user code at (.+):(\d+)\s*$", re.M)
_BREAK_REASON = re.compile(r"^Graph Break Reason:\s*(.*)$", re.M)
_GUARD_LINE = re.compile(r"\+- ([A-Z][A-Z0-9_]+): (.*)$")
_MANAGER_SOURCE = re.compile(r"\+- \w*GuardManager: source=([^,]+),")
_RECOMPILE = re.compile(r"^\s*(\d+/\d+):\s*(.*)$", re.S)


def parse_break(payload: str, compile_id: str | None) -> GraphBreak | None:
    m = _BREAK_AT.search(payload)
    r = _BREAK_REASON.search(payload)
    if not m and not r:
        return None
    file, line = (m.group(1), int(m.group(2))) if m else (None, None)
    code = linecache.getline(file, line).strip() or None if file else None
    reason = r.group(1).strip() if r else payload.strip().splitlines()[0]
    detail = payload[r.end():].split("\nUser code traceback:")[0].strip() if r else ""
    if reason.startswith("Encountered graph break when attempting to trace") and detail:
        # 2.13: that line is the same for every break in a call; what broke is the next one
        # ("Unsupported Tensor.item() call ...", "Failed to trace builtin operator")
        reason = detail.splitlines()[0].strip()
    return GraphBreak(compile_id=compile_id, reason=reason, file=file, line=line, code=code, detail=detail)


def parse_guards(text: str) -> list[Guard]:
    """Guards of dynamo's guard tree text (one per '+- KIND: check' line)."""
    out: list[Guard] = []
    sources: list[tuple[int, str]] = []  # (depth, source) of the GuardManagers above
    for raw in text.splitlines():
        depth = raw.find("+-")
        if depth < 0:
            continue
        ms = _MANAGER_SOURCE.search(raw)
        if ms:
            sources = [s for s in sources if s[0] < depth] + [(depth, ms.group(1))]
            continue
        m = _GUARD_LINE.search(raw)
        if not m:
            continue
        sources = [s for s in sources if s[0] < depth]
        check, _, where = m.group(2).partition("  #")
        where = where.strip().lstrip("#").strip() or None
        out.append(Guard(kind=m.group(1), check=check.strip(), source=sources[-1][1] if sources else None,
                         where=where))
    return out


class _Handler(logging.Handler):
    def __init__(self, sink):
        super().__init__(logging.DEBUG)
        self.sink = sink

    def emit(self, record: logging.LogRecord) -> None:
        meta = getattr(record, "metadata", None)
        if isinstance(meta, dict):
            self.sink(meta, getattr(record, "payload", None))


_WANTED = ("compilation_metrics", "dynamo_cpp_guards_str", "artifact")


class CompileInspector:
    """``with CompileInspector() as insp: ...`` then ``insp.report()``:
    what dynamo did inside the block (Note [Compile inspector])."""

    def __init__(self):
        self._lock = threading.Lock()
        self._events: list[tuple[str, str | None, dict, str | None]] = []
        self._handler = _Handler(self._record)
        self._logger = None

    def _record(self, meta: dict, payload) -> None:
        name = next((k for k in _WANTED if k in meta), None)
        if name is None:
            return
        if name == "artifact" and meta["artifact"].get("name") not in ("recompile_reasons",
                                                                         "dynamo_graph_break_reason"):
            return
        cid = None
        if meta.get("frame_id") is not None:
            cid = f"{meta['frame_id']}/{meta.get('frame_compile_id')}"
        with self._lock:
            self._events.append((name, cid, meta[name], payload))

    def __enter__(self) -> CompileInspector:
        self._logger = _upstream.structured_trace_logger()
        self._saved_level = self._logger.level
        if not self._logger.isEnabledFor(logging.DEBUG):
            self._logger.setLevel(logging.DEBUG)
        self._logger.addHandler(self._handler)
        return self

    def __exit__(self, *exc) -> None:
        self._logger.removeHandler(self._handler)
        self._logger.setLevel(self._saved_level)

    def report(self) -> CompileReport:
        with self._lock:
            events = list(self._events)
        graphs: list[CompiledGraph] = []
        guards: dict[str, list[Guard]] = {}
        breaks: list[GraphBreak] = []
        reasons: dict[str, list] = {}
        unparsed = 0
        for name, cid, meta, payload in events:
            if name == "compilation_metrics":
                graphs.append(_graph(meta, cid))
            elif name == "dynamo_cpp_guards_str" and cid and payload:
                guards[cid] = parse_guards(payload)
            elif meta.get("name") == "dynamo_graph_break_reason":
                b = parse_break(payload or "", cid)
                if b is None:
                    unparsed += 1
                elif not any(x.compile_id == cid and (x.file, x.line, x.reason) == (b.file, b.line, b.reason)
                             for x in breaks):
                    breaks.append(b)  # dynamo logs a break once per tracing attempt: one per compile
            elif meta.get("name") == "recompile_reasons" and cid:
                try:
                    got = json.loads(payload) if payload and payload.lstrip().startswith(("[", '"')) else payload
                except ValueError:
                    got = payload
                items = got if isinstance(got, list) else [got]
                parsed = []
                for item in items:
                    m = _RECOMPILE.match(str(item))
                    parsed.append((m.group(1), m.group(2).strip()) if m else ("?", str(item)))
                reasons[cid] = parsed
        for g in graphs:
            g.guards = guards.get(g.compile_id, [])
        by_id = {g.compile_id: g for g in graphs}
        recompiles = [Recompile(cid, by_id[cid].function if cid in by_id else None, tuple(r))
                      for cid, r in reasons.items()]
        return CompileReport(graphs=graphs, graph_breaks=breaks, recompiles=recompiles, unparsed=unparsed)


def _graph(m: dict, cid: str | None) -> CompiledGraph:
    def num(k):
        v = m.get(k)
        return v if isinstance(v, (int, float)) and not isinstance(v, bool) else None

    return CompiledGraph(
        compile_id=str(m.get("compile_id") or cid), function=str(m.get("co_name") or "?"),
        file=m.get("co_filename"), line=num("co_firstlineno"), op_count=num("graph_op_count"),
        node_count=num("graph_node_count"), input_count=num("graph_input_count"), guard_count=num("guard_count"),
        shape_env_guard_count=num("shape_env_guard_count"), compile_seconds=num("entire_frame_compile_time_s"),
        recompile_reason=m.get("recompile_reason"), fail_type=m.get("fail_type"), fail_reason=m.get("fail_reason"))


def inspect_compile(fn=None, *args, **kwargs):
    """``inspect_compile(fn, *args, **kwargs)``: calls fn (compiled with
    torch.compile(fn, backend="eager") unless it is compiled already, so
    that only dynamo's work is measured) once on the arguments and returns
    the CompileReport.  ``inspect_compile()``: a CompileInspector, for
    ``with kdebug.inspect_compile() as insp: ...; insp.report()``."""
    if fn is None:
        if args or kwargs:
            raise TypeError("inspect_compile() takes the function first: inspect_compile(fn, *args)")
        return CompileInspector()
    import torch

    compiled = fn if _is_compiled(fn) else torch.compile(fn, backend="eager")
    with CompileInspector() as insp:
        compiled(*args, **kwargs)
    return insp.report()


def _is_compiled(fn) -> bool:
    import torch

    return isinstance(fn, torch.nn.Module) and hasattr(fn, "_orig_mod") or hasattr(fn, "_torchdynamo_orig_callable")
