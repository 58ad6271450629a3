"""Which post-grad FX nodes each Inductor kernel computes (Note [Kernel provenance]).

    with kdebug.provenance.capture() as graphs:
        compiled(x).sum().backward()
    for g in graphs:                      # forward, backward, each graph of a graph break
        for c in g.calls:                 # kernels and extern calls, in wrapper order
            print(c.kernel, c.nodes, c.writes, c.source)

    kdebug.provenance.kernel_provenance("cpp_fused_relu_0")   # per kernel name

Note [Kernel provenance]
~~~~~~~~~~~~~~~~~~~~~~~~
Inductor knows, while it generates code, which FX nodes of the post-grad graph
each kernel computes: every kernel it emits (Triton, C++, an extern call such
as extern_kernels.mm) passes through one function,
torch._inductor.debug.set_kernel_post_grad_provenance_tracing(node_schedule,
kernel_name, is_extern), called from the kernel's codegen_comment.  Upstream
uses it only when config.trace.provenance_tracking_level is set; kdebug wraps
it (the wrapper calls the original, so upstream's own tracking is unchanged)
and reads, from its arguments, the IR nodes of the kernel: their ``origins``
(the FX nodes fused into them) and, for each buffer the kernel writes, the
buffer's ``origin_node`` (the one FX node whose value the buffer holds, which
Inductor assigns only when a buffer is exactly that value: ir.assign_origin_node;
otherwise the buffer is written but what it holds is an intermediate, and
``writes`` says None).  Nothing is changed in the code Inductor generates:
the provenance level is not touched (it is part of the FX graph cache key and
turns on extra passes).

GraphLowering.codegen is wrapped too: it is where one graph's kernels are
emitted, in order, and where the wrapper's source is made.  The events of one
codegen are matched to the calls of the wrapper's ``call()`` (read with ast):
the k-th event naming kernel K is the k-th call of K.  That gives each call
site its argument names as the wrapper passes them; the events' own order is
not trusted for wrapper order.  An event with no call in call() (a kernel
launched from elsewhere, e.g. a subgraph) is kept at the end and counted in
GraphRecord.problems.  Origins outside the post-grad graph (Inductor keeps
some from earlier graphs, e.g. pre-grad 'linear') are dropped, counted in
``foreign``.

Source lines come from each node's meta['stack_trace']: the innermost frame
outside torch itself (nn.Linear's own line is not the user's), as
"file:line in fn: code".

Kernels whose module comes from the FX graph cache were not lowered in this
process.  kernel_provenance() then answers, in this order: from a graph
lowered earlier in this process with the same wrapper source (same code, same
graph; origin 'same wrapper source'); from the provenance file a lowering
wrote, in any process, beside Inductor's cache
(<cache dir>/kdebug_provenance/<sha256 of the wrapper source>.json, checked
like a trace's META on reading, ignored and counted in file_errors when it
does not fit; origin 'provenance file'); else from what the generated module
says: the "# Topologically Sorted Source Nodes: [...]" comment Inductor writes
above Triton and extern calls, whose names are Inductor's origins and may be
pre-grad nodes ('matmul' for the post-grad 'mm'); C++ kernel calls have no
such comment, so their nodes are unknown.  Such an answer says what it lacks
in ``unknown``.

The hooks are installed by the first kdebug DebugMode entered, by capture(),
or by install() (kdebug imports nothing until used: Note [Lazy package]).  A
graph lowered before that (a warm-up compile outside kdebug) was not seen: its
kernels are answered like cache hits, above.  Call
kdebug.provenance.install() before compiling to see every graph.

Kernel names are unique within one graph only: two graphs may each have a
cpp_fused_add_0.  kernel_provenance() and the trace's META key
"kernel_provenance" keep, per name, each distinct provenance seen (at most
_PER_NAME); kdebug's launch records carry the name, not the graph, so a name
with several entries is shown with all of them.  Each entry also names the
kernel's generated source, by sha256, and its generated module (Note [Kernel
code] in kdebug/kernel_code.py); entries differing only in their source are
kept apart too.
"""
from __future__ import annotations

import ast
import contextlib
import dataclasses
import hashlib
import re
import threading
import warnings
from dataclasses import dataclass, field
from typing import Any

from . import _upstream, kernel_code


@dataclass(frozen=True)
class CallSite:
    """One kernel or extern call in a compiled graph's wrapper, in wrapper order."""

    index: int
    kernel: str
    kind: str  # 'triton' | 'cpp' | 'extern'
    args: tuple  # argument names as the wrapper passes them (str; None for literals)
    writes: dict  # buffer written -> post-grad FX node it materializes, or None
    nodes: tuple  # post-grad FX node names this call computes, topological order
    source: tuple  # "file:line in fn: code" of those nodes, deduplicated
    pieces: dict = field(default_factory=dict)  # extern call: buffer taken out of its result -> index


@dataclass
class GraphRecord:
    """One graph Inductor lowered: its post-grad graph and its calls."""

    name: str
    gm: Any  # torch.fx.GraphModule (in-process only)
    calls: list
    inputs: list
    outputs: list
    problems: list = field(default_factory=list)  # what could not be mapped, in words
    cache_key: str | None = None  # the generated module's PyCodeCache key (CompiledFxGraph.cache_key)


@dataclass(frozen=True)
class KernelProvenance:
    """What one kernel computes (all its call sites in one graph together)."""

    kernel: str
    kind: str
    nodes: tuple
    source: tuple
    writes: dict
    graph: str  # GraphRecord.name, or '' when not lowered here
    origin: str  # 'lowering' | 'same wrapper source' | 'generated module comments'
    unknown: tuple = ()  # what this answer lacks: 'nodes', 'writes', 'source'
    code_sha256: str = ""  # sha256 of the kernel's generated source, '' unknown (Note [Kernel code])
    module: str = ""  # path of the generated module defining it, '' unknown

    def to_json(self) -> dict:
        return {"kernel": self.kernel, "kind": self.kind, "nodes": list(self.nodes),
                "source": list(self.source), "writes": dict(self.writes), "graph": self.graph,
                "origin": self.origin, "unknown": list(self.unknown),
                "code_sha256": self.code_sha256, "module": self.module}

    def describe(self) -> list[str]:
        """Lines for kdebug show and the HTML report."""
        out = []
        if self.graph:
            out.append(f"graph: {self.graph}")
        if self.module:
            out.append(f"module: {self.module}")
        if self.code_sha256:
            out.append(f"code: sha256 {self.code_sha256}")
        out.append("nodes: " + (", ".join(self.nodes) if self.nodes else "(unknown)"))
        if self.writes:
            out.append("writes: " + ", ".join(f"{b} = {n if n is not None else '?'}"
                                              for b, n in self.writes.items()))
        first = " (when this code was first compiled, perhaps by another script)" \
            if self.origin == "provenance file" else ""
        for s in self.source:
            out.append(f"source{first}: {s}")
        if self.unknown:
            out.append(f"unknown: {', '.join(self.unknown)} (from {self.origin})")
        return out


# ---------------------------------------------------------------- registry

_lock = threading.Lock()
_local = threading.local()  # .events: the event list of the codegen running on this thread
_sinks: list[list] = []  # capture() lists
_by_name: dict[str, list[KernelProvenance]] = {}
_by_wrapper: dict[str, dict[str, KernelProvenance]] = {}  # wrapper source digest -> name -> provenance
_PER_NAME = 8
_NAMES_MAX = 100_000
_WRAPPERS_MAX = 10_000
dropped = 0  # provenance entries not kept (limits above)
errors = 0  # graphs whose provenance could not be read (warned)
file_errors = 0  # provenance files not written or not readable
_installed = False


def _remember(p: KernelProvenance) -> None:
    global dropped
    entries = _by_name.get(p.kernel)
    if entries is None:
        if len(_by_name) >= _NAMES_MAX:
            dropped += 1
            return
        entries = _by_name[p.kernel] = []
    for i, e in enumerate(entries):
        if (e.nodes, e.writes, e.source, e.code_sha256) == (p.nodes, p.writes, p.source, p.code_sha256):
            entries[i] = p  # the same again (a recompile): the newest graph name
            return
    if len(entries) >= _PER_NAME:
        dropped += 1
        return
    entries.append(p)


def provenances(kernel_name: str) -> list[KernelProvenance]:
    """Every distinct provenance of kernels named ``kernel_name`` seen in this
    process (lowered here, or read from a generated module), oldest first."""
    with _lock:
        got = list(_by_name.get(kernel_name, ()))
    if got:
        return got
    p = _from_generated_modules(kernel_name)
    return [p] if p is not None else []


def kernel_provenance(kernel_name: str) -> KernelProvenance | None:
    """The newest provenance of a kernel named ``kernel_name``, or None when no
    graph lowered or module loaded in this process has it (Note [Kernel provenance])."""
    got = provenances(kernel_name)
    return got[-1] if got else None


# ---------------------------------------------------------------- source lines

_FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+), in (.+)$')


def _torch_dirs() -> tuple[str, ...]:
    import os

    import torch

    return (os.path.dirname(torch.__file__) + os.sep,)


def source_line(stack_trace: str | None) -> str | None:
    """The innermost frame of an FX node's stack_trace outside torch, as
    "file:line in fn: code" (the innermost frame when all are torch's)."""
    if not stack_trace or not isinstance(stack_trace, str):
        return None
    frames = []
    lines = stack_trace.splitlines()
    for i, line in enumerate(lines):
        m = _FRAME.match(line)
        if m:
            code = lines[i + 1].strip() if i + 1 < len(lines) and not _FRAME.match(lines[i + 1]) else ""
            frames.append((m.group(1), m.group(2), m.group(3).strip(), code))
    if not frames:
        return None
    torch_dirs = _torch_dirs()
    user = [f for f in frames if not f[0].startswith(torch_dirs)]
    f, line, fn, code = (user or frames)[-1]
    return f"{f}:{line} in {fn}: {code}" if code else f"{f}:{line} in {fn}"


# ---------------------------------------------------------------- events (during codegen)

@dataclass
class _Event:
    kernel: str
    extern: bool
    origins: list  # fx.Node
    writes: dict  # buffer name -> fx.Node or None


def _event(node_schedule, kernel_name, is_extern) -> _Event | None:
    if not isinstance(kernel_name, str) or not kernel_name:
        return None
    origins: list = []
    writes: dict = {}
    if is_extern:
        irs = [node_schedule]
        try:
            outs = [(node_schedule.get_name(), node_schedule)]
        except Exception:  # an extern call with no buffer of its own (NoneLayout): no writes known
            outs = []
    else:
        irs, outs = [], []
        for snode in node_schedule:
            ir = getattr(snode, "node", None)
            if ir is None:  # EnableReduction / DisableReduction markers
                continue
            irs.append(ir)
            for out in snode.get_outputs():
                outs.append((out.get_name(), getattr(out, "node", ir)))
    for ir in irs:
        for o in getattr(ir, "origins", ()) or ():
            origins.append(o)
        on = getattr(ir, "origin_node", None)
        if on is not None:
            origins.append(on)
    for name, buf in outs:
        on = getattr(buf, "origin_node", None)
        writes[name] = on
        mutated = getattr(buf, "get_mutation_names", None)
        for m in (mutated() if callable(mutated) else ()):
            writes.setdefault(m, on)
    return _Event(kernel_name, bool(is_extern), origins, writes)


def _patched_tracing(orig):
    def set_kernel_post_grad_provenance_tracing(node_schedule, kernel_name, is_extern=False):
        events = getattr(_local, "events", None)
        if events is not None:
            try:
                ev = _event(node_schedule, kernel_name, is_extern)
                if ev is not None:
                    events.append(ev)
            except Exception as e:  # never break the user's compile
                events.append(e)
        return orig(node_schedule, kernel_name, is_extern)

    set_kernel_post_grad_provenance_tracing.__wrapped__ = orig
    set_kernel_post_grad_provenance_tracing._kdebug = True
    return set_kernel_post_grad_provenance_tracing


def _patched_codegen(orig):
    def codegen(self, *args, **kwargs):
        saved = getattr(_local, "events", None)
        events: list = []
        _local.events = events
        try:
            result = orig(self, *args, **kwargs)
        finally:
            _local.events = saved
        try:
            _graph_done(self, result, events)
        except Exception as e:  # never break the user's compile
            from .inductor import KdebugWarning

            global errors
            errors += 1
            warnings.warn(f"kdebug: could not read the kernel provenance of a compiled graph "
                          f"({type(e).__name__}: {e}); its kernels have none", KdebugWarning, stacklevel=2)
        return result

    codegen.__wrapped__ = orig
    codegen._kdebug = True
    return codegen


def _patched_compile_to_module(orig):
    def compile_to_module(self, *args, **kwargs):
        result = orig(self, *args, **kwargs)
        rec = self.__dict__.get("_kdebug_graph_record")
        if rec is not None:  # set by codegen(), which runs inside; the key exists only now
            key = getattr(self, "cache_key", None)
            rec.cache_key = key if isinstance(key, str) and key else None
            path = getattr(self, "cache_path", None)
            if isinstance(path, str) and path:
                _set_module(rec, self.__dict__.get("_kdebug_wrapper_digest"), path)
        return result

    compile_to_module.__wrapped__ = orig
    compile_to_module._kdebug = True
    return compile_to_module


def _set_module(rec: GraphRecord, digest: str | None, path: str) -> None:
    """Names the generated module of the kernels lowered in graph ``rec``
    (known only once compile_to_module has written it: Note [Kernel code])."""
    def named(p):
        return dataclasses.replace(p, module=path) if p.graph == rec.name and not p.module else p

    with _lock:
        for name in {c.kernel for c in rec.calls}:
            entries = _by_name.get(name)
            if entries:
                entries[:] = [named(p) for p in entries]
        same = _by_wrapper.get(digest) if digest else None
        if same is not None:
            for name, p in same.items():
                same[name] = named(p)


def install() -> None:
    """Wraps Inductor's provenance function and GraphLowering.codegen (once)."""
    global _installed
    if _installed:
        return
    with _lock:
        if _installed:
            return
        for mod in _upstream.provenance_tracing_modules():
            fn = mod.set_kernel_post_grad_provenance_tracing
            if not getattr(fn, "_kdebug", False):
                mod.set_kernel_post_grad_provenance_tracing = _patched_tracing(fn)
        GL = _upstream.graph_lowering()
        if not getattr(GL.codegen, "_kdebug", False):
            GL.codegen = _patched_codegen(GL.codegen)
        if not getattr(GL.compile_to_module, "_kdebug", False):
            GL.compile_to_module = _patched_compile_to_module(GL.compile_to_module)
        _installed = True


# ---------------------------------------------------------------- the wrapper's calls

def _dotted(node) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return f"{base}.{node.attr}" if base else None
    return None


def _arg_name(node) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Call) and _dotted(node.func) == "reinterpret_tensor" and node.args:
        return _arg_name(node.args[0])  # a view of that buffer
    return None


_LAUNCH_KWARGS = frozenset({"stream", "grid", "triton_meta"})


def wrapper_calls(source: str) -> list[tuple[str, tuple, str | None]]:
    """(callee, argument names, assigned name) of each statement-level call in
    the wrapper's call(), in order; ``X.run(...)`` is a call of X."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    out = []

    def visit(stmts):
        for st in stmts:
            target = None
            call = None
            if isinstance(st, ast.Expr) and isinstance(st.value, ast.Call):
                call = st.value
            elif (isinstance(st, ast.Assign) and isinstance(st.value, ast.Call) and len(st.targets) == 1):
                call = st.value
                t = st.targets[0]
                target = t.id if isinstance(t, ast.Name) else None
            if call is not None:
                name = _dotted(call.func)
                if name is not None:
                    if name.endswith(".run"):
                        name = name[:-4]
                    args = [_arg_name(a) for a in call.args]
                    args += [_arg_name(k.value) for k in call.keywords if k.arg not in _LAUNCH_KWARGS]
                    out.append((name, tuple(args), target))
                continue
            for fld in ("body", "orelse", "finalbody"):
                sub = getattr(st, fld, None)
                if isinstance(sub, list) and not isinstance(st, (ast.FunctionDef, ast.ClassDef)):
                    visit(sub)

    for fn in ast.walk(tree):
        if isinstance(fn, ast.FunctionDef) and fn.name == "call":
            visit(fn.body)
    return out


def _pieces(source: str) -> dict[str, list[tuple[str, int | None]]]:
    """Buffers the wrapper's call() takes out of a multi-output extern call's
    result, with their index: ``buf2 = buf1[0]`` gives {'buf1': [('buf2', 0)]}."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return {}
    out: dict[str, list[str]] = {}
    for fn in ast.walk(tree):
        if isinstance(fn, ast.FunctionDef) and fn.name == "call":
            for st in ast.walk(fn):
                if (isinstance(st, ast.Assign) and len(st.targets) == 1 and isinstance(st.targets[0], ast.Name)
                        and isinstance(st.value, ast.Subscript) and isinstance(st.value.value, ast.Name)):
                    sl = st.value.slice
                    idx = sl.value if isinstance(sl, ast.Constant) and isinstance(sl.value, int) else None
                    out.setdefault(st.value.value.id, []).append((st.targets[0].id, idx))
    return out


# ---------------------------------------------------------------- one graph

_counter = iter(range(1 << 62))


def _graph_name(lowering) -> str:
    kind = ("backward" if getattr(lowering, "is_backward", False)
            else "inference" if getattr(lowering, "is_inference", False) else "forward")
    cid = _upstream.current_compile_id()
    return f"{cid if cid is not None else '?'} {kind} #{next(_counter)}"


def _source_text(result) -> str | None:
    first = result[0] if isinstance(result, tuple) and result else result
    text = getattr(first, "value", first)
    return text if isinstance(text, str) else None


def _kind(ev: _Event) -> str:
    if ev.extern:
        return "extern"
    return "triton" if ev.kernel.startswith("triton") else "cpp" if ev.kernel.startswith("cpp") else "kernel"


def _graph_done(lowering, result, events: list) -> None:
    gm = getattr(lowering, "module", None)
    graph = getattr(gm, "graph", None)
    if graph is None:
        return
    order = {n: i for i, n in enumerate(graph.nodes)}
    problems = [f"{type(e).__name__} reading a kernel's provenance: {e}" for e in events
                if isinstance(e, Exception)]
    events = [e for e in events if isinstance(e, _Event)]
    source = _source_text(result) or ""
    calls = wrapper_calls(source)
    pieces = _pieces(source)
    buffers = getattr(lowering, "name_to_buffer", None) or {}
    pending: dict[str, list[_Event]] = {}
    for ev in events:
        pending.setdefault(ev.kernel, []).append(ev)
    placed: list[tuple[_Event, tuple, str | None]] = []
    for name, args, target in calls:
        q = pending.get(name)
        if q:
            placed.append((q.pop(0), args, target))
        elif _inplace_fallback(name) and args and args[0] is not None:
            # an in-place aten fallback Inductor emits without provenance
            # (aten.scatter_reduce_.two(buf0, ...) after a kernel filled buf0):
            # it writes its first argument (Note [Last writer])
            placed.append((_Event(name, True, [], {args[0]: None}), args, target))
    left = [ev for q in pending.values() for ev in q]
    if left:
        problems.append(f"{len(left)} kernel(s) emitted but not called from call(): "
                        f"{', '.join(sorted({e.kernel for e in left}))}; listed last, without arguments")
    placed += [(ev, (), None) for ev in left]
    foreign = 0
    out_calls = []
    for i, (ev, args, target) in enumerate(placed):
        mine = {n for n in ev.origins if n in order}
        foreign += len({id(n) for n in ev.origins if n not in order})
        nodes = tuple(n.name for n in sorted(mine, key=order.__getitem__))
        lines = []
        for n in sorted(mine, key=order.__getitem__):
            s = source_line(n.meta.get("stack_trace") if hasattr(n, "meta") else None)
            if s is not None and s not in lines:
                lines.append(s)
        passed = {a for a in args if a is not None} | ({target} if target else set())
        writes = {b: (n.name if n is not None and n in order else None)
                  for b, n in ev.writes.items() if not args or b in passed}
        taken = {}
        for piece, idx in pieces.get(target, ()) if ev.extern and target else ():
            buf = buffers.get(piece)  # a MultiOutput: one element of the extern call's result
            on = getattr(buf, "origin_node", None)
            writes[piece] = on.name if on is not None and on in order else None
            if idx is not None:
                taken[piece] = idx
        out_calls.append(CallSite(i, ev.kernel, _kind(ev), args, writes, nodes, tuple(lines), taken))
    out_calls = _last_writers(out_calls, graph)
    if foreign:
        problems.append(f"{foreign} origin node(s) not in the post-grad graph were left out")
    inputs = [n.name for n in graph.nodes if n.op == "placeholder"]
    outs: list = []
    for n in graph.nodes:
        if n.op == "output":
            vals = n.args[0] if n.args else ()
            vals = vals if isinstance(vals, (tuple, list)) else (vals,)
            outs = [v.name if hasattr(v, "name") and hasattr(v, "op") else None for v in vals]
    rec = GraphRecord(_graph_name(lowering), gm, out_calls, inputs, outs, problems)
    lowering.__dict__["_kdebug_graph_record"] = rec  # compile_to_module adds the cache key
    digest = hashlib.sha256(source.encode()).hexdigest() if source else None
    lowering.__dict__["_kdebug_wrapper_digest"] = digest  # and the module's path (Note [Kernel code])
    per_kernel = _per_kernel(rec, kernel_code.of_module(source))  # Note [Kernel code]
    if digest is not None:
        _save_file(digest, per_kernel)
    with _lock:
        for p in per_kernel.values():
            _remember(p)
        if digest is not None and len(_by_wrapper) < _WRAPPERS_MAX:
            _by_wrapper[digest] = per_kernel
        for sink in _sinks:
            sink.append(rec)


def _inplace_fallback(callee: str) -> bool:
    """Whether a wrapper callee names an in-place aten op (aten.index_put_,
    torch.ops.aten.scatter_reduce_.two): it writes its first argument."""
    parts = callee.split(".")
    if "aten" not in parts:
        return False
    rest = parts[parts.index("aten") + 1:]
    return bool(rest) and rest[0].endswith("_") and not rest[0].startswith("_")


def _mutating(node) -> bool:
    """Whether an FX node's op writes its first argument (copy_, index_put_, ...)."""
    schema = getattr(getattr(node, "target", None), "_schema", None)
    if schema is None or not schema.arguments:
        return False
    alias = schema.arguments[0].alias_info
    return alias is not None and bool(alias.is_write)


def _last_writers(calls: list, graph) -> list:
    """Note [Last writer]: a buffer several calls write (a kernel fills it,
    a later one or an in-place fallback scatters into it; a graph input a
    kernel updates in place) holds its FX node's value only after the last
    of them.  Earlier writers' writes map to None (an intermediate); the last
    writer gets the buffer's node, and a graph input written with no node of
    its own gets the graph's last node that mutates it (the copy_ an in-place
    update of an input, such as an optimizer step or batch norm's running
    stats, ends with)."""
    last: dict = {}
    node_of: dict = {}
    for i, c in enumerate(calls):
        for b, n in c.writes.items():
            last[b] = i
            if n is not None:
                node_of.setdefault(b, n)
    placeholders = {n.name for n in graph.nodes if n.op == "placeholder"}
    mutation: dict = {}
    for n in graph.nodes:
        if (n.op == "call_function" and n.args and hasattr(n.args[0], "name")
                and n.args[0].name in placeholders and _mutating(n)):
            mutation[n.args[0].name] = n.name
    out = []
    for i, c in enumerate(calls):
        writes = {}
        for b, n in c.writes.items():
            if last[b] != i:
                writes[b] = None
            else:
                writes[b] = node_of.get(b) or (mutation.get(b) if b in placeholders else None)
        if writes == c.writes:
            out.append(c)
            continue
        nodes = c.nodes or tuple(n for n in writes.values() if n is not None)  # a fallback without origins
        out.append(dataclasses.replace(c, writes=writes, nodes=nodes))
    return out


def _per_kernel(rec: GraphRecord, codes: dict | None = None) -> dict[str, KernelProvenance]:
    """One KernelProvenance per kernel name of a graph (its call sites
    together); ``codes``: kernel name -> sha256 of its source (kernel_code.of_module)."""
    acc: dict[str, tuple[str, list, list, dict]] = {}
    for c in rec.calls:
        kind, nodes, lines, writes = acc.setdefault(c.kernel, (c.kind, [], [], {}))
        nodes += [n for n in c.nodes if n not in nodes]
        lines += [s for s in c.source if s not in lines]
        writes.update(c.writes)
    out = {}
    for name, (kind, nodes, lines, writes) in acc.items():
        unknown = () if nodes else ("nodes",)
        out[name] = KernelProvenance(name, kind, tuple(nodes), tuple(lines), writes, rec.name, "lowering", unknown,
                                     (codes or {}).get(name, ""))
    return out


# ---------------------------------------------------------------- generated modules (FX graph cache)

_SORTED = re.compile(r"#\s*Topologically Sorted Source Nodes:\s*\[([^\]]*)\]")


def _file_for(digest: str) -> str | None:
    import os

    try:
        return os.path.join(_upstream.inductor_cache_dir(), "kdebug_provenance", digest + ".json")
    except Exception:  # no cache directory can be named: no file
        return None


def _save_file(digest: str, per_kernel: dict[str, KernelProvenance]) -> None:
    """Writes a lowered graph's provenance beside Inductor's cache, keyed by
    the digest of its wrapper source, for a later process whose compile is an
    FX graph cache hit (Note [Kernel provenance]).  Best effort: a failure is
    counted in ``file_errors``, never raised."""
    import json
    import os

    global file_errors
    path = _file_for(digest)
    if path is None or os.path.exists(path):
        return
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        from . import _files

        with _files.replaced_atomically(path) as f:
            json.dump({name: [p.to_json()] for name, p in per_kernel.items()}, f)
    except (OSError, ValueError, TypeError):
        file_errors += 1


_FILE_MAX = 64 << 20


def _load_file(digest: str) -> dict[str, KernelProvenance] | None:
    """What _save_file wrote for this wrapper source, checked like a trace's
    META (a damaged or planted file is ignored and counted), or None."""
    import json
    import os

    global file_errors
    path = _file_for(digest)
    if path is None or not os.path.isfile(path):
        return None
    try:
        if os.path.getsize(path) > _FILE_MAX:
            raise ValueError("too large")
        with open(path, encoding="utf-8") as f:
            got = check_meta(json.load(f), "provenance file", ValueError)
        return {name: dataclasses.replace(from_json(entries[0]), origin="provenance file")
                for name, entries in got.items()}
    except (OSError, ValueError, RecursionError):
        file_errors += 1
        return None


def module_provenance(source: str, module: str = "") -> dict[str, KernelProvenance]:
    """Per kernel called in a generated module, what the module itself says:
    the node names of the '# Topologically Sorted Source Nodes: [...]' comment
    right above its call (Inductor writes none above C++ kernel calls).  The
    names are Inductor's origins, which may include nodes of earlier graphs;
    writes and source lines are unknown.  Each answer names its generated
    source and ``module`` (Note [Kernel code])."""
    codes = kernel_code.of_module(source)
    got = _module_provenance(source)
    return {k: dataclasses.replace(p, code_sha256=codes.get(k, p.code_sha256), module=module or p.module)
            for k, p in got.items()}


def _module_provenance(source: str) -> dict[str, KernelProvenance]:
    digest = hashlib.sha256(source.encode()).hexdigest()
    with _lock:
        same = _by_wrapper.get(digest)
    if same is not None:
        return {k: dataclasses.replace(p, origin="same wrapper source") for k, p in same.items()}
    saved = _load_file(digest)
    if saved is not None:
        return saved
    calls = {name for name, _, _ in wrapper_calls(source)}
    out: dict[str, KernelProvenance] = {}
    comment: list[str] | None = None
    for line in source.splitlines():
        s = line.strip()
        m = _SORTED.search(s)
        if m:
            comment = [x.strip() for x in m.group(1).split(",") if x.strip()]
            continue
        if not s or s.startswith("#"):
            continue
        callee = s.split("(", 1)[0].strip()
        if "=" in callee:
            callee = callee.split("=", 1)[1].strip()
        if callee.endswith(".run"):
            callee = callee[:-4]
        if callee in calls and (callee.startswith(("triton", "cpp")) or comment is not None):
            kind = "triton" if callee.startswith("triton") else "cpp" if callee.startswith("cpp") else "extern"
            prev = out.get(callee)
            nodes = list(prev.nodes) if prev else []
            nodes += [n for n in (comment or ()) if n not in nodes]
            # the comment's names are Inductor's origins: some may be pre-grad nodes ('matmul' for 'mm')
            unknown = ("nodes" if not nodes else "post-grad node names", "writes", "source")
            out[callee] = KernelProvenance(callee, kind, tuple(nodes), (), {}, "",
                                           "generated module comments", unknown)
        comment = None
    return out


_module_cache: dict[str, dict[str, KernelProvenance]] = {}  # generated module path -> its kernels


def _from_generated_modules(kernel_name: str) -> KernelProvenance | None:
    for mod in _upstream.generated_modules():
        path = getattr(mod, "__file__", None)
        if not path or ("." not in kernel_name and kernel_name not in vars(mod)):
            continue  # an extern call's name ('extern_kernels.mm') is no module attribute
        got = _module_cache.get(path)
        if got is None:
            try:
                with open(path) as f:
                    got = module_provenance(f.read(), path)
            except (OSError, UnicodeDecodeError):
                continue
            if len(_module_cache) < _WRAPPERS_MAX:
                _module_cache[path] = got
        if kernel_name in got:
            return got[kernel_name]
    return None


# ---------------------------------------------------------------- capture()

@contextlib.contextmanager
def capture():
    """Yields a list that receives one GraphRecord per graph Inductor lowers
    inside the block (forward, backward, each graph of a graph break).  The FX
    graph cache and AOT autograd cache are off for its duration (a cache hit
    skips lowering), and restored after."""
    install()
    sink: list = []
    with contextlib.ExitStack() as stack:
        for cfg, attr in _upstream.compile_cache_switches():
            stack.enter_context(cfg.patch(attr, False))
        with _lock:
            _sinks.append(sink)
        try:
            yield sink
        finally:
            with _lock:
                _sinks.remove(sink)


def graph_for(compiled, graphs: list) -> GraphRecord | None:
    """The GraphRecord (from capture()) of a compiled graph
    (torch._inductor.output_code.CompiledFxGraph), matched by the key of the
    module Inductor generated for it; None when none matches."""
    key = getattr(compiled, "cache_key", None)
    if not key:
        return None
    for g in reversed(graphs):
        if g.cache_key == key:
            return g
    return None


# ---------------------------------------------------------------- traces

def meta_for(kernel_names) -> dict:
    """The META key "kernel_provenance" for the kernels named: {name: [entry, ...]}."""
    out = {}
    for name in kernel_names:
        got = provenances(name)
        if got:
            out[name] = [p.to_json() for p in got]
    return out


_TEXT_MAX = 1 << 16
_LIST_MAX = 1 << 16


def check_meta(v, key: str, bad) -> dict:
    """Checks a "kernel_provenance" value (a trace's META key, a provenance
    file); ``bad(msg)`` makes the exception to raise (Note [META schema] in
    trace.py).  Returns it normalized: {name: [entry, ...]}, each entry a dict
    with every key of KernelProvenance.to_json(), of the right type
    (from_json() makes the objects)."""
    def text(x, where):
        if not isinstance(x, str) or len(x) > _TEXT_MAX:
            raise bad(f"META key {where!r} must be a string of at most {_TEXT_MAX} characters")
        return x

    def texts(x, where):
        if not isinstance(x, list) or len(x) > _LIST_MAX:
            raise bad(f"META key {where!r} must be a list of strings")
        return [text(s, where) for s in x]

    def code_hash(x, where):
        if x != "" and not kernel_code.is_hash(x):
            raise bad(f"META key {where!r} must be '' or a sha256 in lowercase hex")
        return x

    if not isinstance(v, dict) or len(v) > _NAMES_MAX:
        raise bad(f"META key {key!r} must be an object of at most {_NAMES_MAX} kernel names")
    out = {}
    for name, entries in v.items():
        where = f"{key}.{name[:40]}"
        if not isinstance(entries, list) or not 0 < len(entries) <= _PER_NAME:
            raise bad(f"META key {where!r} must be a list of 1 to {_PER_NAME} entries")
        got = []
        for e in entries:
            if not isinstance(e, dict):
                raise bad(f"META key {where!r}: each entry is an object")
            writes = e.get("writes", {})
            if not isinstance(writes, dict) or len(writes) > _LIST_MAX:
                raise bad(f"META key {where + '.writes'!r} must be an object")
            got.append({
                "kernel": text(e.get("kernel", name), where + ".kernel"),
                "kind": text(e.get("kind", ""), where + ".kind"),
                "nodes": texts(e.get("nodes", []), where + ".nodes"),
                "source": texts(e.get("source", []), where + ".source"),
                "writes": {text(b, where + ".writes"): (None if n is None else text(n, where + ".writes"))
                           for b, n in writes.items()},
                "graph": text(e.get("graph", ""), where + ".graph"),
                "origin": text(e.get("origin", ""), where + ".origin"),
                "unknown": texts(e.get("unknown", []), where + ".unknown"),
                # Note [Kernel code]: absent in traces written before it
                "code_sha256": code_hash(e.get("code_sha256", ""), where + ".code_sha256"),
                "module": text(e.get("module", ""), where + ".module")})
        out[text(name, key)] = got
    return out


def from_json(e: dict) -> KernelProvenance:
    """The KernelProvenance of one entry check_meta() returned."""
    return KernelProvenance(e["kernel"], e["kind"], tuple(e["nodes"]), tuple(e["source"]), dict(e["writes"]),
                            e["graph"], e["origin"], tuple(e["unknown"]), e.get("code_sha256", ""),
                            e.get("module", ""))
