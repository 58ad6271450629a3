"""Compiled vs eager, kernel by kernel: which kernel computes worse than eager.

Note [Accuracy check]
One run of the compiled program, checked as it goes, graph call by graph
call (kdebug/inductor.py calls `before` / `after` around every compiled
graph's call while a check is active):
- before the call, the graph's inputs are copied (the call may change them);
- during it, a kdebug DebugMode records what every kernel and extern call
  wrote (record_outputs); the kernels' clones are kept in a device, a host
  and a disk tier, each within its budget (Note [Output spill],
  kdebug/spill.py), so recording them never runs out of memory;
- after it, the launches are matched to the graph's call sites in wrapper
  order (kdebug/provenance.py: which buffer each call writes and which
  post-grad FX node that buffer materializes), the graph is interpreted
  eagerly and in float64 on the copied inputs (Note [Reference runs]), and
  every written buffer with a known node is compared three ways
  (Note [Worse, not just different]).  Then the recorded values are dropped,
  so memory holds one graph call's values at a time.
The verdict walks the calls in launch order with the determinism hunt's
words: a kernel whose inputs all matched eager within tolerance and whose
output is *worse* than eager against float64 is a root; the first root is
the culprit.  A kernel that reads a buffer already outside tolerance
inherited the difference.  Buffers no node maps to are not compared; they
pass a difference on when their writer's inputs had one.
Graph calls after the first `calls_per_graph` of each graph are run but
not checked (a training loop would otherwise be checked every step).
"""
from __future__ import annotations

import copy
import dataclasses
import math
import numbers

import torch

from . import _upstream, kernel_code, numerics, provenance, reference, spill


@dataclasses.dataclass
class BufferCheck:
    """One buffer a call wrote, compared (diff) or not (why)."""

    buffer: str
    node: str | None
    param: str | None
    diff: numerics.Difference | None = None
    why_not: str | None = None
    # Note [Local reference]: the kernel judged on its own inputs (eager and
    # float64 computed from what the compiled kernels before it wrote); set
    # where `diff` alone said worse
    local: numerics.Difference | None = None
    lost: bool = False  # its value was not kept: over every budget (Note [Output spill])

    def worse(self, factor: float) -> bool:
        judge = self.local if self.local is not None else self.diff
        return judge is not None and judge.worse(factor)


@dataclasses.dataclass
class KernelCheck:
    """One call of a kernel (or extern op) in one graph call."""

    graph: str
    graph_call: int
    index: int               # position among the graph's calls
    kernel: str
    kind: str
    nodes: tuple
    source: tuple
    buffers: list
    # ok | differs | worse | inherited | unchecked | unverified (outside tolerance, but it read a buffer whose
    # value was not recorded: over every budget, Note [Output spill]; whether it introduced the difference is unknown)
    status: str = "ok"
    tainted_inputs: tuple = ()
    code: str | None = None  # the generated kernel's source (kept for roots: worse or differs)

    def worst(self) -> BufferCheck | None:
        """The compared buffer with the largest error ratio."""
        best, key = None, -1.0
        for b in self.buffers:
            if b.diff is None:
                continue
            r = b.diff.ratio()
            k = (math.inf if b.diff.nonfinite_introduced else (r if r is not None else b.diff.max_abs))
            if k > key:
                best, key = b, k
        return best


@dataclasses.dataclass
class OutputCheck:
    """One leaf of the function's output, compiled vs eager (vs float64)."""

    path: str
    diff: numerics.Difference | None
    why_not: str | None = None


@dataclasses.dataclass
class AccuracyReport:
    factor: float
    rtol: float | None
    atol: float | None
    kernels: list = dataclasses.field(default_factory=list)
    outputs: list = dataclasses.field(default_factory=list)
    notes: list = dataclasses.field(default_factory=list)
    graphs: int = 0
    graph_calls_checked: int = 0
    graph_calls_unchecked: int = 0
    unmatched_launches: int = 0
    spill: spill.SpillStats | None = None  # where the kernel outputs were kept (Note [Output spill])

    @property
    def culprit(self) -> KernelCheck | None:
        """The first kernel that computes worse than eager from inputs that
        still matched (Note [Accuracy check])."""
        return next((k for k in self.kernels if k.status == "worse"), None)

    @property
    def first_divergent(self) -> KernelCheck | None:
        """The first kernel outside tolerance of eager from inputs within it."""
        return next((k for k in self.kernels if k.status in ("differs", "worse")), None)

    @property
    def unverified(self) -> list:
        """Calls outside tolerance that read values that were not recorded
        (over every budget, Note [Output spill]): no verdict about them."""
        return [k for k in self.kernels if k.status == "unverified"]

    @property
    def unrecorded(self) -> list:
        """Calls with a written buffer over every budget (Note [Output spill]):
        not judged, so a check without a culprit has no verdict either."""
        return [k for k in self.kernels if any(b.lost for b in k.buffers)]

    @property
    def no_verdict(self) -> bool:
        """No culprit, but values that were not recorded could hide one."""
        return self.culprit is None and bool(self.unverified or self.unrecorded)

    def compared(self) -> int:
        return sum(1 for k in self.kernels for b in k.buffers if b.diff is not None)

    def outputs_within_tolerance(self) -> bool:
        return all(o.diff is None or o.diff.within_tolerance for o in self.outputs)

    def summary(self) -> str:
        from . import accuracy_text

        return accuracy_text.summary(self)

    def __str__(self) -> str:
        return self.summary()

    def write_html(self, path: str, title: str = "kdebug accuracy") -> None:
        """The verdict as a self-contained HTML page (kdebug/accuracy_html.py)."""
        from . import accuracy_html

        accuracy_html.write_html(path, self, title)

    def to_json(self) -> dict:
        return dataclasses.asdict(self) | {
            "culprit": None if self.culprit is None else dataclasses.asdict(self.culprit)}


# ------------------------------------------------------------- the session


def _clone_inputs(inputs) -> list:
    out = []
    for x in inputs:
        out.append(x.detach().clone() if isinstance(x, torch.Tensor) else x)
    return out


def _on_device(xs) -> bool:
    """Whether any tensor in xs lives off the host (a spill copy is worth it)."""
    return any(isinstance(x, torch.Tensor) and x.device.type != "cpu" for x in xs)


_VALUE = (torch.Tensor, spill.Ref)  # a recorded value, or the store's reference to one (Note [Output spill])


def _written(call) -> dict:
    """{param name: recorded value} of what a recorded call wrote."""
    rec = getattr(call, "record", None)
    if not isinstance(rec, dict):
        return {}
    out = rec.get("output")
    if isinstance(out, dict):
        return {k: v for k, v in out.items() if isinstance(v, _VALUE)}
    if isinstance(out, _VALUE):
        return {"out": out}
    return {}


def _result(call):
    """The recorded result of an aten call (a tensor, or a tuple of them)."""
    rec = getattr(call, "record", None)
    return rec.get("output") if isinstance(rec, dict) else None


def _same_device(v, e, r):
    """The compiled value and its references on one device, for comparing
    them: a GPU one where any is on a GPU (a spilled value, or a reference
    value kept on the host, is copied back for this one comparison)."""
    ts = [t for t in (v, e, r) if isinstance(t, torch.Tensor)]
    dev = next((t.device for t in ts if t.device.type != "cpu"), None)
    if dev is None:
        return v, e, r
    return tuple(t.to(dev) if isinstance(t, torch.Tensor) and t.device != dev else t for t in (v, e, r))


def _is_kernel(call) -> bool:
    return hasattr(call, "kernel_name") and hasattr(call, "arg_names")


def _call_base(call) -> str:
    return reference.op_base(getattr(call, "op", None) or "")


def align(sites: list, calls: list) -> tuple[list, int]:
    """Pairs recorded calls with the graph's call sites, both in order: a
    kernel launch with the next site of its kernel name, an aten op with the
    next extern site of its op (ops that match no site, such as allocations,
    are skipped).  Returns ([(site, call)], launches that matched no site)."""
    pairs, pos, unmatched = [], 0, 0
    for call in calls:
        if _is_kernel(call):
            name = call.kernel_name
            j = next((j for j in range(pos, len(sites)) if sites[j].kind != "extern" and sites[j].kernel == name),
                     None)
            if j is None:
                unmatched += 1
                continue
        else:
            base = _call_base(call)
            j = None
            for k in range(pos, len(sites)):
                if sites[k].kind != "extern":
                    break  # an op never jumps over a kernel site
                if reference.op_base(sites[k].kernel) == base:
                    j = k
                    break
            if j is None:
                continue
        pairs.append((sites[j], call))
        pos = j + 1
    return pairs, unmatched


class Session:
    """A running accuracy check (Note [Accuracy check])."""

    def __init__(self, graphs: list, mode, rtol=None, atol=None, factor: float = 4.0,
                 calls_per_graph: int = 1, store: spill.SpillStore | None = None) -> None:
        self.graphs = graphs  # filled by provenance.capture() as graphs compile
        self.mode = mode
        self.store = store  # Note [Output spill]; None: the outputs stay on call.record
        self.report = AccuracyReport(factor=factor, rtol=rtol, atol=atol,
                                     spill=store.stats if store is not None else None)
        self.calls_per_graph = calls_per_graph
        self._seen: dict = {}
        self._source: dict = {}  # id(graph record) -> its generated module's source

    # -- hooks called by kdebug/inductor.py around a compiled graph's call --
    def before(self, compiled, inputs):
        from . import inductor

        reason = inductor.graph_bypass_reason(compiled, hooked_ok=False)
        if reason is not None:  # its launches never reach Python: nothing to compare
            self.report.graph_calls_unchecked += 1
            note = (f"graph calls launched through {reason} are not checked (their kernels bypass Python); "
                    "compile without it (mode='default', cpp_wrapper=False) to check them")
            if note not in self.report.notes:
                self.report.notes.append(note)
                inductor.warn(f"accuracy check: {note}")
            return None
        g = provenance.graph_for(compiled, self.graphs)
        if g is None:
            self.report.graph_calls_unchecked += 1
            return None
        n = self._seen.get(id(g), 0)
        self._seen[id(g)] = n + 1
        if n >= self.calls_per_graph:
            self.report.graph_calls_unchecked += 1
            return None
        with _upstream.disable_torch_dispatch(), torch.no_grad():
            clones = _clone_inputs(inputs)
        self._source.setdefault(id(g), getattr(compiled, "source_code", None))
        self.mode.operators = []  # this graph call's records only
        if self.store is not None:
            self.store.arm()
        return (g, n, clones)

    def after(self, compiled, token) -> None:
        if token is None:
            return
        g, n, clones = token
        calls = list(self.mode.operators)
        if self.store is not None:
            self.store.finish()  # the last clones placed, the spill file readable
        self.mode.operators = []
        self.report.graph_calls_checked += 1
        self.report.graphs = len({id(x) for x in self.graphs})
        try:
            self._check(g, n, clones, calls)
        finally:
            del calls, clones
            if self.store is not None:
                self.store.release()  # this call's values dropped, its spill file removed

    # -- one graph call --
    def _check(self, g, n, clones, calls) -> None:
        rep = self.report
        pairs, unmatched = align(g.calls, calls)
        rep.unmatched_launches += unmatched
        need = {node for site, _ in pairs for node in site.writes.values() if node}
        rnd = reference.random_nodes(g.gm)
        keep = need - rnd
        store = self.store
        with _upstream.disable_torch_dispatch(), torch.no_grad():
            on_host_copy = ([x.to("cpu") if isinstance(x, torch.Tensor) else x for x in clones]
                            if _on_device(clones) else None)
            e_in, r_in = _clone_inputs(clones), clones
            l_in = (_clone_inputs(clones) if on_host_copy is None
                    else [_clone_inputs([x])[0] for x in on_host_copy])

        def place():  # Note [Output spill]: kept reference values beyond the device budget go to the host
            return (spill.host_placer(store.budgets.device)
                    if store is not None and on_host_copy is not None else None)

        on_host = False  # the local reference runs go where the reference runs went
        try:
            eager = reference.run_graph(g.gm, e_in, keep, float64=False, place=place())
            del e_in
            ref = reference.run_graph(g.gm, r_in, keep, float64=True, place=place())
        except torch.OutOfMemoryError:  # Note [Reference runs]: again, on the host
            if on_host_copy is None:
                raise
            e_in = r_in = eager = ref = None
            _upstream.empty_device_cache()
            rep.notes.append(f"{g.name}: the reference runs ran out of device memory and ran on the host")
            on_host = True
            eager = reference.run_graph(g.gm, _clone_inputs(on_host_copy), keep, float64=False, host=True)
            ref = reference.run_graph(g.gm, on_host_copy, keep, float64=True, host=True)
        for where, why in list(eager.failed.items()) + list(ref.failed.items()):
            rep.notes.append(f"{g.name}: the reference run stopped at node {where}: {why}")
        if ref.approximated:
            rep.notes.append(f"{g.name}: float64 reference computed in the graph's own dtype for "
                             f"{len(ref.approximated)} node(s) whose ops refuse float64: "
                             + ", ".join(sorted(ref.approximated)[:8]))
        status: dict = {name: "ok" for name in g.inputs}  # identical inputs by construction
        first = len(rep.kernels)

        def later_writer(index, buf):  # Note [Last writer] (kdebug/provenance.py)
            return any(c.index > index and buf in c.writes for c in g.calls)

        # node -> the compiled value written for it (Note [Local reference]); spilled ones read back when used
        given = spill.LazyValues(store) if store is not None else {}
        candidates: list = []   # (KernelCheck, BufferCheck, compiled value, terms): worse against the graph's eager
        for site, call in pairs:
            from_store = store is not None and _is_kernel(call)
            written = store.outputs(call.launch_index) if from_store else _written(call)
            refused = store.refused(call.launch_index) if from_store else None
            params = list(getattr(call, "arg_names", ()) or ())
            checks = []
            by_buffer = {}
            if _is_kernel(call):
                for param, value in written.items():
                    i = params.index(param) if param in params else -1
                    buf = site.args[i] if 0 <= i < len(site.args) else None
                    if buf is not None:
                        by_buffer[buf] = (param, value)
            else:
                out = next(iter(written.values()), None)
                bufs = list(site.writes)
                result = _result(call)
                if site.pieces and isinstance(result, (tuple, list)):
                    # a multi-output extern call: the wrapper takes buffers out of its result by index
                    for buf, i in site.pieces.items():
                        if 0 <= i < len(result) and isinstance(result[i], _VALUE):
                            by_buffer[buf] = (f"out[{i}]", result[i])
                elif out is not None and len(bufs) == 1:
                    by_buffer[bufs[0]] = ("out", out)
            # what the call wrote, as recorded (roles W / RW), else as compiled;
            # a multi-output extern call's result tuple itself holds no value
            targets = (list(by_buffer) if _is_kernel(call)
                       else [b for b in site.writes if not site.pieces or b in site.pieces])
            if refused:  # a launch refused by the full tiers cloned nothing: what its site writes, unknown
                targets = list(site.writes)
            inputs = [a for a in site.args if isinstance(a, str) and a not in targets]
            tainted = tuple(a for a in inputs if status.get(a) == "diff")
            unknown_in = tuple(a for a in inputs if status.get(a) == "unknown")
            lost = set()  # buffers whose value was not kept (Note [Output spill]): unknown, not "ok"
            any_out = False
            for buf in targets:
                node = site.writes.get(buf)
                param, value = by_buffer.get(buf, (None, None))
                if store is not None:
                    value = store.slot(value)  # an aten op's Ref: what its slot holds now
                bc = BufferCheck(buffer=buf, node=node, param=param)
                if node is None and later_writer(site.index, buf):
                    bc.why_not = "written again by a later call of the graph: an intermediate value here"
                elif node is None:
                    bc.why_not = "no FX node is known for this buffer"
                elif node in rnd:
                    bc.why_not = "computed from random numbers (Inductor's RNG differs from eager's by design)"
                elif value is None and refused:
                    bc.why_not = refused
                    lost.add(buf)
                    bc.lost = True
                elif value is None:
                    bc.why_not = "its value was not recorded (not matched to the call's result)"
                elif isinstance(value, spill.Dropped):
                    bc.why_not = value.reason
                    lost.add(buf)
                    bc.lost = True
                elif node not in eager.values or node not in ref.values:
                    bc.why_not = "the reference run did not reach this node"
                else:
                    e, r = eager.values[node], ref.values[node]
                    handle = value
                    try:
                        v = store.load(value) if store is not None else value  # one spilled buffer at a time
                    except LookupError as ex:
                        v, bc.why_not = None, str(ex)
                        lost.add(buf)
                        bc.lost = True
                    if v is not None:
                        v, e, r = _same_device(v, e, r)
                        shape = tuple(v.shape)
                        if shape != tuple(e.shape) and v.numel() == e.numel():
                            v = v.reshape(e.shape)
                    if v is None:
                        pass
                    elif tuple(v.shape) != tuple(e.shape):
                        bc.why_not = f"buffer shape {shape} is not the node's {tuple(e.shape)}"
                    else:
                        try:
                            terms = reference.accumulated_terms(g.gm, node, site.nodes)
                            bc.diff = numerics.difference(v, e.to(v.dtype) if e.dtype != v.dtype else e, r,
                                                          rtol=rep.rtol, atol=rep.atol, heatmap=True,
                                                          terms=terms, term_scale=ref.term_scale.get(node))
                            given[node] = handle if store is not None else v
                            if bc.diff.worse(rep.factor):
                                candidates.append((bc, v, terms))
                            if bc.diff.within_tolerance:  # keep the error maps of the ones worth a look
                                bc.diff = dataclasses.replace(bc.diff, heatmap=None)
                        except (RuntimeError, ValueError) as ex:
                            bc.why_not = f"not comparable: {ex}"
                checks.append(bc)
                if bc.diff is not None and not bc.diff.within_tolerance:
                    any_out = True
            for bc in checks:
                if bc.diff is not None:
                    status[bc.buffer] = "diff" if not bc.diff.within_tolerance else "ok"
                elif tainted or any_out:  # not compared: passes on what its writer got
                    status[bc.buffer] = "diff"
                else:  # a value nobody saw, or one computed from such: unknown, never vouched for
                    status[bc.buffer] = "unknown" if (bc.buffer in lost or unknown_in) else "ok"
            kc = KernelCheck(graph=g.name, graph_call=n, index=site.index, kernel=site.kernel, kind=site.kind,
                             nodes=tuple(site.nodes), source=tuple(site.source), buffers=checks,
                             tainted_inputs=tainted)
            compared = [b for b in checks if b.diff is not None]
            if not compared:
                kc.status = "unchecked"
            elif tainted:
                kc.status = "inherited" if any_out else "ok"
            elif unknown_in and (any_out or any(b.diff.worse(rep.factor) for b in compared)):
                kc.status = "unverified"  # it read a value that was not recorded: never named a root
            elif any(b.diff.worse(rep.factor) for b in compared):
                kc.status = "worse"
            elif any_out:
                kc.status = "differs"
            if kc.status in ("worse", "differs") and kc.kind != "extern":
                kc.code = kernel_code.source_of(self._source.get(id(g)), kc.kernel)
            rep.kernels.append(kc)
        self._judge_locally(g, rep.kernels[first:], candidates, given, l_in, rnd, on_host)

    def _judge_locally(self, g, kernels, candidates, given, inputs, rnd, host: bool) -> None:
        """Note [Local reference]: a kernel that looked worse than the graph's
        eager run is judged again against eager and float64 computed from
        the compiled values it read; it stays worse only if it is worse
        there too (differences it was handed, within tolerance but amplified
        by a reduction or a cancellation, are not its doing)."""
        rep = self.report
        worse_roots = [k for k in kernels if k.status == "worse"]
        if not worse_roots:
            return
        keep = {bc.node for bc, _, _ in candidates} - rnd
        try:
            eager = reference.run_graph(g.gm, _clone_inputs(inputs), keep, float64=False, host=host, given=given)
            ref = reference.run_graph(g.gm, inputs, keep, float64=True, host=host, given=given)
        except torch.OutOfMemoryError:
            rep.notes.append(f"{g.name}: the local reference runs ran out of device memory: kernels are judged "
                             "against the graph's eager run only")
            return
        for bc, v, terms in candidates:
            e, r = eager.values.get(bc.node), ref.values.get(bc.node)
            if e is None or r is None or tuple(e.shape) != tuple(v.shape):
                continue
            try:
                bc.local = numerics.difference(v, e.to(v.dtype), r, rtol=rep.rtol, atol=rep.atol, terms=terms,
                                               term_scale=ref.term_scale.get(bc.node))
            except (RuntimeError, ValueError):
                continue
        for k in worse_roots:
            if not any(b.worse(rep.factor) for b in k.buffers if b.diff is not None):
                out = any(b.diff is not None and not b.diff.within_tolerance for b in k.buffers)
                k.status = "differs" if out else "ok"
                if k.status == "ok":
                    k.code = None


# ------------------------------------------------------------- entry points


def _budgets(max_bytes, max_device_bytes, max_host_bytes, max_disk_bytes, spill_dir) -> spill.Budgets:
    """The output tiers' budgets (Note [Output spill]); the deprecated
    max_bytes sets the budget of the tier the clones are made in."""
    if max_bytes is not None:
        import warnings

        on_gpu = torch.cuda.is_available()
        tier = "max_device_bytes" if on_gpu else "max_host_bytes"
        warnings.warn(f"accuracy check: max_bytes (--max-bytes) is deprecated; it now sets {tier} (the tier the "
                      "kernel outputs are made in), and outputs beyond it spill to host memory and disk instead "
                      "of going uncompared. Use max_device_bytes / max_host_bytes / max_disk_bytes "
                      "(--max-device-bytes / --max-host-bytes / --max-disk-bytes).", FutureWarning, stacklevel=3)
        if on_gpu and max_device_bytes is None:
            max_device_bytes = max_bytes
        elif not on_gpu and max_host_bytes is None:
            max_host_bytes = max_bytes
    return spill.Budgets.resolve(max_device_bytes, max_host_bytes, max_disk_bytes, spill_dir)


def check(program, rtol=None, atol=None, factor: float = 4.0, calls_per_graph: int = 1,
          max_bytes: int | None = None, *, max_device_bytes: int | None = None, max_host_bytes: int | None = None,
          max_disk_bytes: int | None = None, spill_dir: str | None = None) -> AccuracyReport:
    """Runs `program()` (code that compiles and calls compiled functions)
    under an accuracy check (Note [Accuracy check]) and returns the report.
    Dynamo's compiled code is reset first (torch._dynamo.reset()): code
    compiled earlier is compiled again, once, inside the check.  Exceptions
    of the program propagate, after the check has stopped.

    The kernel outputs of one graph call are kept on the device up to
    max_device_bytes (default: 1/8 of the free device memory), then in host
    memory up to max_host_bytes (default: 1/4 of the available RAM), then in
    a temporary file under spill_dir (default: the temp directory) up to
    max_disk_bytes (default: half its free space); only what exceeds all
    three is not compared, and the report says so (Note [Output spill]).
    max_bytes is deprecated (it sets the budget of the tier the outputs are
    made in)."""
    from . import inductor
    from .mode import DebugMode

    if factor <= 1.0 or not math.isfinite(factor):
        raise ValueError(f"factor must be a finite number > 1 (got {factor!r}): the compiled error "
                         "must exceed eager's by this factor to count as worse")
    if calls_per_graph < 1:
        raise ValueError(f"calls_per_graph must be >= 1 (got {calls_per_graph!r})")
    for name, tol in (("rtol", rtol), ("atol", atol)):
        if tol is not None and (isinstance(tol, bool) or not isinstance(tol, numbers.Real)
                                or not math.isfinite(tol) or tol < 0):
            raise ValueError(f"{name} must be None or a finite number >= 0 (got {tol!r}): a negative or NaN "
                             "tolerance puts every element outside it")
    budgets = _budgets(max_bytes, max_device_bytes, max_host_bytes, max_disk_bytes, spill_dir)
    inductor.install()
    # Code compiled before the check has no provenance (its post-grad graph is
    # gone) and may have been compiled under other settings: start afresh.
    _upstream.dynamo_reset()
    with provenance.capture() as graphs:
        mode = DebugMode(record_triton_kernels=True)
        store = spill.SpillStore(budgets, lambda: mode._recorder)
        session = Session(graphs, mode, rtol=rtol, atol=atol, factor=factor, calls_per_graph=calls_per_graph,
                          store=store)
        # the store decides what is kept (its filter refuses launches once every tier is full): no C cap
        outputs = DebugMode.record_outputs(max_bytes=spill.NO_CAP, filter=store, aten=True)
        try:
            with inductor.observing_graph_calls(session), mode, outputs:
                program()
        finally:
            store.release()  # a program that raised mid-call leaves no spill file behind
    session.report.graphs = len(graphs)
    if session.report.unmatched_launches:
        session.report.notes.append(
            f"{session.report.unmatched_launches} kernel launch(es) inside checked graph calls matched no "
            "call site of their graph and were not compared")
    return session.report


def _tree_leaves(obj, path="output"):
    """(path, tensor) for every tensor in a nested output: tuples, lists,
    dicts, dataclasses and dict-like objects (HuggingFace ModelOutput)."""
    if isinstance(obj, torch.Tensor):
        yield path, obj
    elif isinstance(obj, dict) or (hasattr(obj, "keys") and hasattr(obj, "__getitem__")
                                   and not isinstance(obj, (str, bytes))):
        for k in obj.keys():
            yield from _tree_leaves(obj[k], f"{path}[{k!r}]")
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from _tree_leaves(v, f"{path}[{i}]")
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            yield from _tree_leaves(getattr(obj, f.name), f"{path}.{f.name}")


def _original(fn):
    """The uncompiled callable behind a torch.compile'd module or function."""
    orig = getattr(fn, "_orig_mod", None) or getattr(fn, "_torchdynamo_orig_callable", None)
    return orig if orig is not None else fn


def _float64_copy(fn, args, kwargs):
    """(fn, args, kwargs) in float64 for the model-level reference: a module
    is deep-copied and converted; a plain function gets float64 arguments
    (weights it closes over are not reached: it may then refuse to run)."""
    conv = (lambda x: x.detach().to(torch.float64) if isinstance(x, torch.Tensor) and x.is_floating_point() else x)
    if isinstance(fn, torch.nn.Module):
        fn = copy.deepcopy(fn).to(torch.float64)
    return fn, torch.utils._pytree.tree_map(conv, args), torch.utils._pytree.tree_map(conv, kwargs)


def compare_eager(fn, *args, reference: str = "float64", rtol: float | None = None, atol: float | None = None,
                  factor: float = 4.0, calls_per_graph: int = 1, max_bytes: int | None = None,
                  max_device_bytes: int | None = None, max_host_bytes: int | None = None,
                  max_disk_bytes: int | None = None, spill_dir: str | None = None,
                  **kwargs) -> AccuracyReport:
    """Compiles fn (or recompiles the function behind a compiled one), runs it
    on args under the accuracy check (Note [Accuracy check]) and compares its
    output with eager's, leaf by leaf.  A module is deep-copied for the eager
    and float64 runs, so its state is not run three times; a plain function
    runs eagerly on copies of the arguments.  Returns an AccuracyReport whose
    `culprit` names the first kernel that computes worse than eager.  The
    budgets (max_device_bytes, max_host_bytes, max_disk_bytes, spill_dir)
    are check()'s (Note [Output spill])."""
    if reference != "float64":
        raise ValueError(f"reference must be 'float64' (got {reference!r})")
    orig = _original(fn)
    rng = torch.random.get_rng_state()
    cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None

    def reset_rng():
        torch.random.set_rng_state(rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state_all(cuda_rng)

    def copy_args():
        return copy.deepcopy((args, kwargs))

    # eager first, on copies: the compiled run then sees the user's own objects
    eager_fn = copy.deepcopy(orig) if isinstance(orig, torch.nn.Module) else orig
    reset_rng()
    a, k = copy_args()
    eager_out = eager_fn(*a, **k)
    ref_out, ref_why = None, None
    f64, a64, k64 = _float64_copy(orig, *copy_args())
    reset_rng()
    try:
        with torch.no_grad():
            ref_out = f64(*a64, **k64)
    except Exception as e:  # e.g. a function whose closed-over weights stay float32
        ref_why = f"{type(e).__name__}: {e}".splitlines()[0][:200]
    compiled = torch.compile(orig)
    reset_rng()
    got: list = []
    report = check(lambda: got.append(compiled(*args, **kwargs)), rtol=rtol, atol=atol, factor=factor,
                   calls_per_graph=calls_per_graph, max_bytes=max_bytes, max_device_bytes=max_device_bytes,
                   max_host_bytes=max_host_bytes, max_disk_bytes=max_disk_bytes, spill_dir=spill_dir)
    out = got[0]
    c_leaves = dict(_tree_leaves(out))
    e_leaves = dict(_tree_leaves(eager_out))
    r_leaves = dict(_tree_leaves(ref_out)) if ref_out is not None else {}
    if ref_why is not None:
        report.notes.append(f"model-level float64 reference skipped: fn did not run in float64 ({ref_why}); "
                            "kernels are still judged against float64")
    for path, c in c_leaves.items():
        e = e_leaves.get(path)
        if e is None:
            report.outputs.append(OutputCheck(path, None, "eager's output has no such leaf"))
            continue
        if tuple(c.shape) != tuple(e.shape):
            report.outputs.append(OutputCheck(path, None, f"shapes differ: {tuple(c.shape)} vs {tuple(e.shape)}"))
            continue
        r = r_leaves.get(path)
        try:
            d = numerics.difference(c.detach(), e.detach().to(c.dtype), r, rtol=rtol, atol=atol)
            report.outputs.append(OutputCheck(path, d))
        except (RuntimeError, ValueError) as ex:
            report.outputs.append(OutputCheck(path, None, f"not comparable: {ex}"))
    for path in e_leaves.keys() - c_leaves.keys():
        report.outputs.append(OutputCheck(path, None, "the compiled output has no such leaf"))
    return report

