"""kdebug.backends.constrained: a torch.compile backend that checks every
graph against an accelerator's declared capabilities.

Note [Constraint backend]
~~~~~~~~~~~~~~~~~~~~~~~~~
A team bringing up an accelerator behind Inductor wants to know, before any
kernel exists, which parts of a model its hardware cannot take: a float64
tensor, a dimension that is not a multiple of 16, a strided operand, a
tensor over the on-chip limit, an op with no kernel.  ``constrained(caps)``
returns a dynamo backend that checks, with the same rules
(kdebug/constraint_check.py):

1. the graph dynamo captured (stage "dynamo", torch-level calls, before
   AOTAutograd: the user's own ops, with their source lines), then
2. each graph AOTAutograd makes of it, separately: "forward" and
   "backward" when gradients are needed, "inference" when not.  With
   then="inductor" these are the graphs Inductor lowers
   (torch._inductor.compile_fx's inner_compile hook: after Inductor's
   decompositions and graph passes); with then="eager" they are
   AOTAutograd's aten graphs, run as they are (aot_autograd's compilers).

AOTAutograd's cache is off while the backend compiles (a hit would skip
the forward and backward checks); Inductor's FX graph cache is consulted
after the check, as usual.  Each graph's values are the fake tensors FX recorded on its nodes
(meta['val'] / meta['example_value']), so checking costs no kernel run.
The rules: dtype and alignment and max bytes on every tensor a node makes
(and every graph input); layout on graph inputs and on every tensor a
compute op reads (a view makes no data, so .t() is not flagged, the matmul
reading the transposed tensor is); denied_ops on every call at every stage;
allowed_ops on aten-level calls only; the adapter's supports(node) hook on
every call.  A size that is symbolic (dynamic shapes) is not decided:
GraphCheck.unchecked lists it, it never counts as a pass or a violation.

strict: the first graph with a violation raises ConstraintViolationError
naming each violating node, its op, the user's source line (the node's
stack_trace), the constraint and the values, after writing a standalone
repro (kdebug/constraint_repro.py).  Dynamo wraps an exception raised by a
backend in its BackendCompilerFailed (its message includes ours;
.inner_exception is ours); a backward graph compiled lazily raises from
.backward().  warn: violations are recorded (violations()), one
KdebugWarning per graph says how many, and the graph runs through `then`:
the program's results do not change.

minify=True (or kdebug.backends.constrained.MINIFY_DEFAULT, which `kdebug
minify script.py` sets): in strict mode the violating graph is also shrunk
by kdebug.minify (Note [Minifier]) to the few nodes that still break the
first violation's constraint with its op, written beside the repro as
minimal/; the error names it (ConstraintViolationError.minimal).

The seed's MOCK_STRICT, MOCK_ALIGNMENT and MOCK_MAX_MEMORY override the
mode and capabilities given in code when set (read when the backend is
made; a KdebugWarning says what each replaced).
"""
from __future__ import annotations

import collections
import dataclasses
import os
import threading
import warnings

from .. import _upstream
from ..capabilities import AcceleratorAdapter, AcceleratorCapabilities, DeclaredAdapter, mode_from_env
from ..constraint_check import GraphCheck, Violation, check_graph

MODES = ("strict", "warn")
THEN = ("inductor", "eager")
DEFAULT_REPRO_DIR = os.path.join("kdebug_artifacts", "repros")
MINIFY_DEFAULT = False
"""What minify=None means: `kdebug minify script.py` sets it for the run."""


class ConstraintViolationError(RuntimeError):
    """A graph breaks the accelerator's constraints (strict mode)."""

    def __init__(self, message: str, violations: list[Violation], repro: str | None):
        super().__init__(message)
        self.violations = violations
        self.repro = repro
        self.minimal = None  # the minimal repro's kdebug.minify.MinifyResult (minify=True)


class _Log:
    """Every graph check of this process, in order (violations(), checks())."""

    def __init__(self):
        self.lock = threading.Lock()
        self.checks: list[GraphCheck] = []
        self.minified: list = []  # MinifyResult of every minimal repro written (minify=True)
        self.backend_names: collections.Counter = collections.Counter()

    def add(self, check: GraphCheck) -> None:
        with self.lock:
            self.checks.append(check)


_LOG = _Log()


def violations() -> list[Violation]:
    """Every violation recorded by constrained() backends in this process
    since the last clear_violations(), in the order found."""
    with _LOG.lock:
        return [v for c in _LOG.checks for v in c.violations]


def checks() -> list[GraphCheck]:
    """Every graph checked since the last clear_violations(), violating or not."""
    with _LOG.lock:
        return list(_LOG.checks)


def minify_by_default(on: bool) -> bool:
    """Sets what minify=None means for constrained() backends (MINIFY_DEFAULT); returns the old value."""
    global MINIFY_DEFAULT
    old, MINIFY_DEFAULT = MINIFY_DEFAULT, bool(on)
    return old


def minified() -> list:
    """kdebug.minify.MinifyResult of every minimal repro written since the last clear_violations()."""
    with _LOG.lock:
        return list(_LOG.minified)


def clear_violations() -> None:
    with _LOG.lock:
        _LOG.checks.clear()
        _LOG.minified.clear()


def _warn(msg: str) -> None:
    from ..inductor import KdebugWarning

    warnings.warn(f"kdebug: {msg}", KdebugWarning, stacklevel=3)


class ConstrainedBackend:
    """The backend constrained() returns; torch.compile calls it once per
    graph dynamo captures."""

    __name__ = "kdebug_constrained"

    def __init__(self, accelerator: AcceleratorCapabilities | AcceleratorAdapter, mode: str = "strict",
                 then: str = "inductor", repro_dir: str | None = DEFAULT_REPRO_DIR, use_env: bool = True,
                 artifacts: str | None = None, minify: bool | None = None):
        if isinstance(accelerator, AcceleratorCapabilities):
            accelerator = DeclaredAdapter(accelerator)
        if not isinstance(accelerator, AcceleratorAdapter):
            raise TypeError("constrained() takes an AcceleratorCapabilities or an AcceleratorAdapter, got "
                            f"{type(accelerator).__name__}")
        if mode not in MODES:
            raise ValueError(f"mode must be 'strict' or 'warn', got {mode!r}")
        if then not in THEN:
            raise ValueError(f"then must be 'inductor' or 'eager', got {then!r}")
        caps = accelerator.capabilities()
        if not isinstance(caps, AcceleratorCapabilities):
            raise TypeError(f"{type(accelerator).__name__}.capabilities() returned {type(caps).__name__}, "
                            "not an AcceleratorCapabilities")
        self.overrides: dict[str, str] = {}
        if use_env:
            caps, self.overrides = caps.with_env()
            mode, replaced = mode_from_env(mode)
            if replaced:
                self.overrides["MOCK_STRICT"] = replaced
            for var, old in self.overrides.items():
                _warn(f"{var}={os.environ[var]} overrides {old} given in code")
        self.adapter = _Fixed(accelerator, caps)
        self.capabilities = caps
        self.mode, self.then, self.repro_dir = mode, then, repro_dir
        self.minify = minify
        self.checks: list[GraphCheck] = []
        if artifacts is not None:
            from ..artifacts import dir_problem

            problem = dir_problem(artifacts)
            if problem:
                raise ValueError(f"constrained(artifacts=...): {problem}")
        self.artifacts_dir = artifacts
        self._artifacts = None  # the ArtifactRun, made at the first compile (kdebug/artifacts.py)

    @property
    def artifacts(self):
        """The ArtifactRun this backend writes into (artifacts=dir), or None."""
        return self._artifacts

    def _artifact_scope(self, stage=None):
        import contextlib

        if self.artifacts_dir is None:
            return contextlib.nullcontext()
        from ..artifacts import ArtifactRun

        if self._artifacts is None:
            import atexit

            self._artifacts = ArtifactRun(self.artifacts_dir, source="constrained backend")
            atexit.register(self._artifacts.close)  # the manifest says complete once the process ends
        return self._artifacts.scope(stage)

    @property
    def violations(self) -> list[Violation]:
        """This backend's violations, in the order found."""
        return [v for c in self.checks for v in c.violations]

    def __call__(self, gm, example_inputs):
        cid = _compile_id()
        with self._artifact_scope():  # dynamo emitted its graph before calling us: written from gm
            if self._artifacts is not None:
                self._artifacts.add_graph(cid or "unknown", "dynamo_output_graph",
                                          gm.print_readable(print_output=False))
            return self._compile(gm, example_inputs, cid)

    def _compile(self, gm, example_inputs, cid):
        self._check(gm, example_inputs, "dynamo", cid)
        if self.then == "inductor":
            compile_fx, compile_fx_inner = _upstream.inductor_compile_fx()

            def inner(g, ex, **kw):
                stage = "backward" if kw.get("is_backward") else "inference" if kw.get("is_inference") else "forward"
                self._check(g, ex, stage, _compile_id() or cid)
                with self._artifact_scope(stage):  # a backward compiled lazily is outside __call__
                    return compile_fx_inner(g, ex, **kw)

            # AOTAutograd's cache would hand back a whole compiled forward and
            # backward without calling inner_compile: every graph must be checked
            with _upstream.autograd_cache_disabled():
                return compile_fx(gm, example_inputs, inner_compile=inner)

        def stage_compiler(stage):
            def compile_(g, ex):
                self._check(g, ex, stage, _compile_id() or cid)
                return g
            return compile_

        return _upstream.aot_autograd_backend(stage_compiler("forward"), stage_compiler("backward"),
                                              stage_compiler("inference"))(gm, example_inputs)

    def _check(self, gm, example_inputs, stage: str, cid: str | None) -> None:
        check = check_graph(gm, self.adapter, stage, cid)
        if check.violations and self.mode == "strict":
            repro, problem = self._repro(gm, example_inputs, check)
            if repro:
                check.violations = [dataclasses.replace(v, repro=os.path.dirname(repro)) for v in check.violations]
            self.checks.append(check)
            _LOG.add(check)
            minimal, why = self._minified(gm, example_inputs, check, repro)
            msg = _strict_message(check, self.capabilities, repro, problem)
            if minimal is not None:
                msg += (f"\nminimal repro ({minimal.nodes_before} -> {minimal.nodes_after} call nodes, torch only): "
                        f"python {minimal.repro}")
            elif why:
                msg += f"\nno minimal repro: {why}"
            err = ConstraintViolationError(msg, check.violations, repro)
            err.minimal = minimal
            raise err
        self.checks.append(check)
        _LOG.add(check)
        if check.violations:
            kinds = collections.Counter(v.constraint for v in check.violations)
            _warn(f"{len(check.violations)} constraint violation(s) of {self.capabilities.name} in the {stage} "
                  f"graph {cid or '?'} ({', '.join(f'{k}: {n}' for k, n in kinds.items())}); first: "
                  f"{check.violations[0].message()}. It runs through {self.then}; kdebug.backends.violations() "
                  "lists them")

    def _minified(self, gm, example_inputs, check: GraphCheck, repro: str | None):
        """(MinifyResult, None), or (None, why not) when minify is on, else (None, None)."""
        on = MINIFY_DEFAULT if self.minify is None else self.minify
        if not on or self.repro_dir is None:
            return None, None
        from ..minify import minify_violation

        first = next((v for v in check.violations if v.target not in ("placeholder", "get_attr")), None)
        if first is None:
            return None, "every violation is on a graph input (nothing to shrink)"
        base = os.path.dirname(repro) if repro else os.path.join(self.repro_dir, "unnamed")
        try:
            with _upstream.unset_fake_mode():
                result = minify_violation(gm, example_inputs, first, self.adapter, os.path.join(base, "minimal"))
        except Exception as e:  # the violation is the news: a failed minification must not hide it
            return None, f"{type(e).__name__}: {e}".splitlines()[0][:300]
        with _LOG.lock:
            _LOG.minified.append(result)
        return result, None

    def _repro(self, gm, example_inputs, check: GraphCheck) -> tuple[str | None, str | None]:
        if self.repro_dir is None:
            return None, None
        from ..constraint_repro import write_repro

        name = f"{check.stage}-{(check.compile_id or 'unknown').replace('/', '_')}"
        directory = os.path.join(self.repro_dir, name)
        n = 1
        while os.path.exists(directory):
            n += 1
            directory = os.path.join(self.repro_dir, f"{name}-{n}")
        try:
            return write_repro(gm, example_inputs, check.violations, self.capabilities, directory), None
        except Exception as e:  # the violation is the news: a repro that cannot be written must not hide it
            return None, f"{type(e).__name__}: {e}"


class _Fixed(AcceleratorAdapter):
    """An adapter with its capabilities fixed (environment applied) and
    its supports() hook kept."""

    def __init__(self, inner: AcceleratorAdapter, caps: AcceleratorCapabilities):
        self.inner, self.caps, self.name = inner, caps, getattr(inner, "name", caps.name)

    def capabilities(self) -> AcceleratorCapabilities:
        return self.caps

    def supports(self, node, stage):
        return self.inner.supports(node, stage)


def _compile_id() -> str | None:
    cid = _upstream.current_compile_id()
    return None if cid is None else str(cid)


def _strict_message(check: GraphCheck, caps: AcceleratorCapabilities, repro: str | None,
                    problem: str | None) -> str:
    vs = check.violations
    lines = [f"{len(vs)} constraint violation(s) of {caps.name} in the {check.stage} graph "
             f"{check.compile_id or '?'} (strict mode):"]
    for v in vs[:10]:
        lines.append(f"  - {v.message()}")
    if len(vs) > 10:
        lines.append(f"  ... and {len(vs) - 10} more (ConstraintViolationError.violations has all)")
    if repro:
        lines.append(f"standalone repro (torch only): python {repro}")
    elif problem:
        lines.append(f"no repro: writing it failed ({problem})")
    lines.append("mode='warn' records them and runs the graph instead")
    return "\n".join(lines)


def constrained(accelerator: AcceleratorCapabilities | AcceleratorAdapter | None = None, mode: str = "strict",
                then: str = "inductor", repro_dir: str | None = DEFAULT_REPRO_DIR,
                use_env: bool = True, artifacts: str | None = None,
                minify: bool | None = None) -> ConstrainedBackend:
    """A torch.compile backend checking every graph against ``accelerator``
    (Note [Constraint backend]).  accelerator: capabilities or an adapter
    (None: no constraint but the environment's).  mode: 'strict' raises
    ConstraintViolationError and writes a repro under ``repro_dir`` (None:
    none); 'warn' records and runs.  then: 'inductor' or 'eager' runs the
    graphs.  use_env: MOCK_STRICT / MOCK_ALIGNMENT / MOCK_MAX_MEMORY
    override the arguments when set.  artifacts: a directory where each
    compile's graphs, IR and kernels are saved (kdebug.capture_artifacts's
    layout; Note [Compile artifacts]).  minify: in strict mode also write a
    minimal repro (Note [Minifier]; None: MINIFY_DEFAULT)."""
    return ConstrainedBackend(AcceleratorCapabilities() if accelerator is None else accelerator, mode, then,
                              repro_dir, use_env, artifacts, minify)
