"""kdebug.minify: shrink a failing graph to the few nodes that still fail,
and write a standalone repro of what is left.

Note [Minifier]
~~~~~~~~~~~~~~~
Two failures are minified, each with a predicate evaluated on a candidate
graph and real inputs:

- a constraint violation (Note [Constraint backend]): the candidate is run
  eagerly, node by node, each node's real value put in meta['val'], and
  checked with the same rules (kdebug/constraint_check.py); it still fails
  when a call node with the same constraint and the same op is flagged.
  Matching the op keeps the minifier from "explaining" a violation by a
  graph input that carries it (delta debugging turns nodes into inputs).
- a numerical mismatch: the candidate is lowered by Inductor (compile_fx,
  its FX graph and AOTAutograd caches off, so every candidate is really
  lowered) and its outputs compared with the candidate run eagerly, leaf
  by leaf, at rtol/atol (numerics.tolerances: the accuracy check's
  defaults per dtype); it still fails when a leaf is outside tolerance or
  NaN/Inf where eager is finite.

Shrinking is torch's own fx minifier (torch._functorch.fx_minifier, reached
through kdebug/_upstream.py): suffix truncation, delta debugging, dead-code
and unused-input removal, run to a fixed point.  Its progress messages
(stderr) go to minify.log in the output directory.

The output directory holds repro.py (torch only), inputs.pt (the minimal
graph's inputs: the concrete values the minifier cut in; random values of
the compiler's shapes where it saw fake tensors) and graph.txt.  The
constraint repro is constraint_repro's script (it re-checks the broken
constraint on the values the graph computes); the accuracy repro compiles
the graph with torch.compile and compares with eager at the same
tolerances.  Both exit 1 when the failure happens again, 0 when not.

A numerical mismatch planted by kdebug.testing.wrong_lowering lives in the
compiler of the process that planted it: its repro.py shows the mismatch
only when run by a compiler with that lowering (the header says so; the
test runs it both ways).  A real compiler bug travels with the compiler.
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import io
import os

import torch

from . import _files, _upstream, numerics
from .capabilities import AcceleratorAdapter, AcceleratorCapabilities, DeclaredAdapter
from .constraint_check import Violation, check_graph

DEFAULT_OUT = os.path.join("kdebug_artifacts", "minified")


class MinifyError(RuntimeError):
    """The program or graph does not fail as asked: nothing to minify."""


@dataclasses.dataclass
class MinifyResult:
    """What kdebug.minify wrote."""

    kind: str                # "constraint" or "accuracy"
    directory: str           # holds repro.py, inputs.pt, graph.txt, minify.log
    repro: str               # repro.py's path
    nodes_before: int        # call nodes of the failing graph
    nodes_after: int         # call nodes of the minimal graph
    failure: str             # what the minimal graph reproduces, in one line
    ops: tuple = ()          # the ops (targets) left in the minimal graph
    graph: torch.fx.GraphModule | None = dataclasses.field(default=None, repr=False)
    inputs: list | None = dataclasses.field(default=None, repr=False)

    def to_json(self) -> dict:
        return {k: v for k, v in dataclasses.asdict(self).items() if k not in ("graph", "inputs")} | {
            "ops": list(self.ops)}


def call_nodes(gm: torch.fx.GraphModule) -> int:
    """The nodes that compute something (call_function / call_method / call_module)."""
    return sum(1 for n in gm.graph.nodes if n.op.startswith("call_"))


def _ops(gm: torch.fx.GraphModule) -> tuple:
    from .constraint_check import display_target

    return tuple(display_target(n) for n in gm.graph.nodes if n.op.startswith("call_"))


# Note [Random draws are not mismatches]
# Inductor draws random numbers from its own stream (philox seeds), not from
# eager's generator: dropout in training mode, torch.rand, bernoulli give
# other values compiled than eager by design.  A mismatch minified to such a
# draw is no compiler error (kdebug.minify shrank an MLP with dropout to the
# dropout and wrote a repro that "REPRODUCED" it: found by an adversarial
# pass); it is refused, saying how to compare without it.
_RANDOM_NAMES = ("dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout", "feature_alpha_dropout",
                 "rand", "randn", "randint", "randperm", "rand_like", "randn_like", "randint_like", "bernoulli",
                 "bernoulli_", "multinomial", "normal", "normal_", "poisson", "rrelu", "rrelu_", "gumbel_softmax",
                 "uniform_", "random_", "exponential_", "geometric_", "log_normal_", "cauchy_", "native_dropout")


def _random_draws(gm: torch.fx.GraphModule) -> list[str]:
    """The call nodes of gm that draw random numbers (by name: torch-level
    calls in a dynamo graph; aten ops also by their nondeterministic_seeded
    tag)."""
    from .constraint_check import display_target

    out = []
    for n in gm.graph.nodes:
        if not n.op.startswith("call_"):
            continue
        tags = getattr(n.target, "tags", ()) or ()
        name = str(getattr(n.target, "__name__", n.target)).split(".")[-1]
        if torch.Tag.nondeterministic_seeded in tags or name in _RANDOM_NAMES:
            out.append(display_target(n))
    return out


# ------------------------------------------------------------ the predicates


class _RealValues(torch.fx.Interpreter):
    """Runs a graph eagerly and records each node's real value as meta['val']."""

    def run_node(self, n):
        out = super().run_node(n)
        n.meta["val"] = out
        return out


def violation_key(v: Violation) -> tuple:
    return (v.constraint, v.target)


def constraint_fails(adapter: AcceleratorAdapter, stage: str, key: tuple):
    """The predicate of a constraint violation: does a call node of the
    candidate still break constraint key[0] with op key[1]?"""

    def fails(gm: torch.fx.GraphModule, inputs) -> bool:
        try:
            with torch.no_grad():
                _RealValues(gm).run(*[x.clone() if isinstance(x, torch.Tensor) else x for x in inputs])
        except Exception:
            return False  # a candidate that does not run reproduces nothing
        check = check_graph(gm, adapter, stage)
        return any(violation_key(v) == key for v in check.violations)

    return fails


def _leaves(out):
    if isinstance(out, torch.Tensor):
        yield out
    elif isinstance(out, (list, tuple)):
        for o in out:
            yield from _leaves(o)


@contextlib.contextmanager
def _caches_off():
    with contextlib.ExitStack() as st:
        for mod, key in _upstream.compile_cache_switches():
            st.enter_context(mod.patch(key, False))
        yield


def compiled_vs_eager(gm: torch.fx.GraphModule, inputs, rtol: float | None, atol: float | None):
    """[(leaf index, numerics.Difference)] of the graph lowered by Inductor
    vs run eagerly on copies of the same inputs."""
    compile_fx, _ = _upstream.inductor_compile_fx()

    def copies():
        return [x.clone() if isinstance(x, torch.Tensor) else x for x in inputs]

    with torch.no_grad():
        eager = list(_leaves(gm(*copies())))
        with _caches_off():
            fn = compile_fx(copy.deepcopy(gm), copies())
        got = list(_leaves(fn(*copies())))
    return [(i, numerics.difference(c, e, rtol=rtol, atol=atol)) for i, (c, e) in enumerate(zip(got, eager))
            if c.shape == e.shape]


def accuracy_fails(rtol: float | None, atol: float | None):
    """The predicate of a numerical mismatch: is a compiled output leaf of
    the candidate outside tolerance of eager's?"""

    def fails(gm: torch.fx.GraphModule, inputs) -> bool:
        if not any(n.op.startswith("call_") for n in gm.graph.nodes):
            return False
        try:
            diffs = compiled_vs_eager(gm, inputs, rtol, atol)
        except Exception:
            return False
        return any(not d.within_tolerance for _, d in diffs)

    return fails


# ---------------------------------------------------------------- shrinking


def minify_graph(gm: torch.fx.GraphModule, inputs, fails) -> tuple[torch.fx.GraphModule, list, str]:
    """torch's fx minifier on (gm, inputs) while fails(gm, inputs): the
    minimal (graph, inputs) and the minifier's log."""
    inputs = [x.detach() if isinstance(x, torch.Tensor) else x for x in inputs]
    if not fails(gm, inputs):
        raise MinifyError("the graph does not fail on these inputs: nothing to minify")
    minifier = _upstream.fx_minifier()
    log = io.StringIO()
    with contextlib.redirect_stderr(log):
        small, small_inputs = minifier(gm, inputs, fails, lambda g, i: None)
    return small, list(small_inputs), log.getvalue()


def _directory(out: str) -> str:
    """A directory for the repro: ``out``, or out-2, out-3, ... when one
    already holds a repro.py; never through a symbolic link (Note [Safe
    writes] in kdebug/_files.py)."""
    d, n = out, 1
    _files.refuse_link(d)
    while os.path.lexists(os.path.join(d, "repro.py")):
        n += 1
        d = f"{out}-{n}"
    os.makedirs(d, exist_ok=True)
    return d


def _adapter(constraints) -> AcceleratorAdapter:
    if isinstance(constraints, AcceleratorCapabilities):
        return DeclaredAdapter(constraints)
    if isinstance(constraints, AcceleratorAdapter):
        return constraints
    raise TypeError("constraints= takes an AcceleratorCapabilities or an AcceleratorAdapter, got "
                    f"{type(constraints).__name__}")


def minify_violation(gm: torch.fx.GraphModule, inputs, violation: Violation,
                     constraints: AcceleratorCapabilities | AcceleratorAdapter, out: str = DEFAULT_OUT) -> MinifyResult:
    """Minifies ``gm`` (of ``violation.stage``) while ``violation``'s
    constraint still breaks on its op; writes the constraint repro."""
    from .constraint_repro import _real, write_repro

    adapter = _adapter(constraints)
    caps = adapter.capabilities()
    real = [_real(x) for x in inputs]
    gm = copy.deepcopy(gm)
    before = call_nodes(gm)
    key = violation_key(violation)
    small, small_inputs, log = minify_graph(gm, real, constraint_fails(adapter, violation.stage, key))
    # the minimal graph's own violations, on its real values (what repro.py re-checks)
    with torch.no_grad():
        _RealValues(small).run(*[x.clone() if isinstance(x, torch.Tensor) else x for x in small_inputs])
    vs = [v for v in check_graph(small, adapter, violation.stage, violation.compile_id).violations
          if violation_key(v) == key]
    d = _directory(out)
    path = write_repro(small, small_inputs, vs, caps, d)
    failure = (f"{violation.constraint} violation of {caps.name} by {violation.target} "
               f"({violation.stage} graph {violation.compile_id or '?'}; originally node {violation.node})")
    _prepend(path, _header(failure, before, call_nodes(small), _ops(small),
                           "exit 1 and REPRODUCED lines when the constraint breaks again"))
    _log(d, log)
    return MinifyResult("constraint", d, path, before, call_nodes(small), failure, _ops(small), small, small_inputs)


def minify_mismatch(gm: torch.fx.GraphModule, inputs, rtol: float | None = None, atol: float | None = None,
                    out: str = DEFAULT_OUT, note: str | None = None) -> MinifyResult:
    """Minifies ``gm`` while Inductor's output stays outside tolerance of
    eager's; writes the accuracy repro (minify_repro.py).  note: a line
    for the header (e.g. how the compiler was changed)."""
    from .constraint_repro import _real
    from .minify_repro import write_accuracy_repro

    real = [_real(x) for x in inputs]
    gm = copy.deepcopy(gm)
    before = call_nodes(gm)
    small, small_inputs, log = minify_graph(gm, real, accuracy_fails(rtol, atol))
    drawn = _random_draws(small)
    if drawn:  # Note [Random draws are not mismatches]
        raise MinifyError(f"the mismatch minifies to {', '.join(sorted(set(drawn)))}, which draws random numbers: "
                          "compiled code draws them from another random stream than eager, so their values differ "
                          "by design, not by a compiler error. Minify with the module in eval() mode (no dropout), "
                          "or with torch._inductor.config.fallback_random = True (compiled code then draws as eager "
                          "does) and the same seed before each run")
    diffs = compiled_vs_eager(small, small_inputs, rtol, atol)
    bad = [(i, d) for i, d in diffs if not d.within_tolerance]
    worst = max(bad, key=lambda p: p[1].max_abs)[1] if bad else None
    failure = ("Inductor's output differs from eager beyond tolerance" +
               (f": max |compiled - eager| {worst.max_abs:.3g} at rtol {worst.rtol:g}, atol {worst.atol:g} "
                f"({worst.dtype})" if worst else ""))
    d = _directory(out)
    path = write_accuracy_repro(small, small_inputs, d, rtol, atol)
    _prepend(path, _header(failure, before, call_nodes(small), _ops(small),
                           "exit 1 and REPRODUCED lines when torch.compile's output is outside tolerance of eager's",
                           note))
    _log(d, log)
    return MinifyResult("accuracy", d, path, before, call_nodes(small), failure, _ops(small), small, small_inputs)


def _header(failure: str, before: int, after: int, ops: tuple, exits: str, note: str | None = None) -> str:
    lines = ["# Minimal repro written by kdebug.minify (Note [Minifier]); it needs only torch.",
             f"# Reproduces: {failure}.",
             f"# Graph: {before} call nodes before minifying, {after} after: {', '.join(ops) or '(none)'}.",
             f"# Written with torch {torch.__version__}. Run: python repro.py  ({exits}; 0 when not).",
             "# Details of the failure follow."]
    if note:
        lines.insert(2, f"# NOTE: {note}")
    return "\n".join(lines) + "\n#\n"


def _prepend(path: str, header: str) -> None:
    with open(path) as f:
        text = f.read()
    with _files.replaced_atomically(path) as f:
        f.write(header + text)


def _log(d: str, log: str) -> None:
    with _files.replaced_atomically(os.path.join(d, "minify.log")) as f:  # never through a link
        f.write(log)


# -------------------------------------------------------- from a program


class _Capture:
    """A dynamo backend that keeps every graph with its example inputs
    (real tensors: dynamo hands its backend the frame's values) and runs it
    eagerly."""

    __name__ = "kdebug_minify_capture"

    def __init__(self):
        self.graphs: list = []

    def __call__(self, gm, example_inputs):
        self.graphs.append((gm, list(example_inputs)))
        return gm.forward


def capture_graphs(fn, *args, **kwargs) -> list:
    """[(GraphModule, example inputs)] of every graph dynamo captures in fn(*args, **kwargs)."""
    cap = _Capture()
    _upstream.dynamo_reset()
    torch.compile(_original(fn), backend=cap)(*args, **kwargs)
    return cap.graphs


def _original(fn):
    orig = getattr(fn, "_orig_mod", None) or getattr(fn, "_torchdynamo_orig_callable", None)
    return orig if orig is not None else fn


def minify(fn, *args, constraints: AcceleratorCapabilities | AcceleratorAdapter | None = None,
           rtol: float | None = None, atol: float | None = None, out: str = DEFAULT_OUT,
           note: str | None = None, **kwargs) -> MinifyResult:
    """Runs fn(*args, **kwargs) once under torch.compile, takes the first
    graph that fails and writes a minimal standalone repro of it under
    ``out`` (Note [Minifier]).

    constraints given: the failure is the first constraint violation of
    the pre-AOT (dynamo) graph.  Otherwise: a compiled output outside
    rtol/atol of eager's (defaults: the accuracy check's, per dtype).
    MinifyError when no graph fails."""
    graphs = capture_graphs(fn, *args, **kwargs)
    if not graphs:
        raise MinifyError("torch.compile captured no graph from fn: nothing to minify")
    if constraints is not None:
        adapter = _adapter(constraints)
        for i, (gm, inputs) in enumerate(graphs):
            probe = copy.deepcopy(gm)
            with torch.no_grad():
                _RealValues(probe).run(*[x.clone() if isinstance(x, torch.Tensor) else x for x in inputs])
            vs = [v for v in check_graph(probe, adapter, "dynamo", f"{i}").violations
                  if not v.target in ("placeholder", "get_attr")]
            if vs:
                return minify_violation(gm, inputs, vs[0], adapter, out)
        raise MinifyError(f"no call node of the {len(graphs)} captured graph(s) breaks the constraints of "
                          f"{adapter.capabilities().name} (graph inputs are not minified: they are the program's)")
    for gm, inputs in graphs:
        if accuracy_fails(rtol, atol)(gm, inputs):
            return minify_mismatch(gm, inputs, rtol, atol, out, note)
    raise MinifyError(f"every output of the {len(graphs)} captured graph(s) compiled by Inductor is within "
                      "tolerance of eager: nothing to minify")
