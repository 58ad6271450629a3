"""Checks one FX graph against an accelerator's capabilities: a list of
typed, JSON-serializable Violation records (Note [Constraint backend] in
kdebug/backends/constrained.py)."""
from __future__ import annotations

import dataclasses
import fnmatch
import operator
import re
import types

import torch

from . import _upstream
from .capabilities import AcceleratorAdapter

CONSTRAINTS = ("dtype", "alignment", "max_bytes", "layout", "denied_op", "not_allowed_op", "unsupported")

# torch-level (dynamo graph) calls that make a view or a copy to a new
# layout: they move no data through a kernel, or they are the fix, so the
# layout rule does not apply to what they read
_VIEW_METHODS = {"view", "view_as", "reshape", "reshape_as", "transpose", "permute", "t", "expand", "expand_as",
                 "narrow", "select", "unsqueeze", "squeeze", "flatten", "unflatten", "as_strided", "chunk", "split",
                 "unbind", "movedim", "diagonal", "contiguous", "__getitem__", "detach", "clone", "mT", "T"}
_COPY_ATEN = {"aten.clone", "aten.contiguous", "aten.copy", "aten.copy_", "aten._unsafe_view", "aten.alias"}


@dataclasses.dataclass(frozen=True)
class Violation:
    """One node of one graph that breaks one constraint."""

    constraint: str  # one of CONSTRAINTS
    stage: str  # dynamo (pre-AOT), forward, backward, inference
    compile_id: str | None  # dynamo's, e.g. "0/1"
    node: str  # the FX node's name
    target: str  # its op, e.g. aten.addmm.default, torch.Tensor.double
    value: str  # which tensor: "output", "input 0 (x)", "op"
    expected: str
    actual: str
    shape: tuple | None = None
    dtype: str | None = None
    stride: tuple | None = None
    source: str | None = None  # the user's line: "file.py:12 in forward: return self.proj(x.double())"
    stack_trace: str | None = None
    repro: str | None = None  # the standalone repro directory written for it (strict mode)

    def message(self) -> str:
        where = f" at {self.source}" if self.source else " (no user source line recorded for this node)"
        meta = ""
        if self.shape is not None:
            meta = f" [{self.dtype} {list(self.shape)} stride {list(self.stride or ())}]"
        return (f"{self.constraint}: {self.stage} graph {self.compile_id or '?'}, node {self.node} ({self.target}), "
                f"{self.value}{meta}: expected {self.expected}, got {self.actual}{where}")

    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        for k in ("shape", "stride"):
            if d[k] is not None:
                d[k] = list(d[k])
        return d

    @classmethod
    def from_json(cls, d: dict) -> Violation:
        d = dict(d)
        for k in ("shape", "stride"):
            if d.get(k) is not None:
                d[k] = tuple(d[k])
        return cls(**{f.name: d.get(f.name) for f in dataclasses.fields(cls)})


@dataclasses.dataclass
class GraphCheck:
    """The result of checking one graph."""

    stage: str
    compile_id: str | None
    nodes: int
    violations: list[Violation]
    unchecked: list[str]  # what could not be decided (symbolic sizes), never counted as passing or failing

    def to_json(self) -> dict:
        return {"stage": self.stage, "compile_id": self.compile_id, "nodes": self.nodes,
                "violations": [v.to_json() for v in self.violations], "unchecked": list(self.unchecked)}


def target_names(node: torch.fx.Node) -> list[str]:
    """The names a denylist or allowlist entry may use for a node's op, most
    specific first: aten.addmm.default, aten.addmm; torch.Tensor.double,
    double; torch.nn.functional.linear / torch._C._nn.linear, linear."""
    t = node.target
    if node.op == "call_method":
        return [f"torch.Tensor.{t}", str(t)]
    if node.op == "call_module":
        return [f"module.{t}", str(t)]
    if isinstance(t, _upstream.OpOverload):
        ns, rest = str(t).split(".", 1) if "." in str(t) else ("aten", str(t))
        packet = rest.split(".")[0]
        return [f"{ns}.{rest}", f"{ns}.{packet}", f"{ns}::{packet}"]
    if isinstance(t, _upstream.OpOverloadPacket):
        return [str(t), str(t).replace(".", "::", 1)]
    mod = getattr(t, "__module__", None) or ""
    name = getattr(t, "__qualname__", None) or getattr(t, "__name__", None) or str(t)
    if isinstance(t, types.BuiltinFunctionType) and getattr(t, "__name__", None):
        # torch.conv2d, torch.matmul: C functions whose qualname names the class holding them
        # (_VariableFunctionsClass.conv2d on 2.13): named as torch names them, so denied_ops match
        name = t.__name__
    out = []
    if mod:
        mod = {"torch._C._nn": "torch.nn.functional", "torch._C._VariableFunctions": "torch",
               "_operator": "operator"}.get(mod, mod)
        out.append(f"{mod}.{name}")
    out.append(name)
    return out


def display_target(node: torch.fx.Node) -> str:
    return target_names(node)[0]


def _matches(names: list[str], patterns) -> str | None:
    for p in patterns:
        for n in names:
            if n == p or fnmatch.fnmatchcase(n, p):
                return p
    return None


def _is_aten(node: torch.fx.Node) -> bool:
    return isinstance(node.target, (_upstream.OpOverload, _upstream.OpOverloadPacket))


def _layout_exempt(node: torch.fx.Node) -> bool:
    """Views and copies to a new layout (see _VIEW_METHODS)."""
    t = node.target
    if node.op == "call_method":
        return t in _VIEW_METHODS
    if isinstance(t, _upstream.OpOverload):
        if any(r.alias_info is not None and not r.alias_info.is_write for r in t._schema.returns):
            return True
        return target_names(node)[1] in _COPY_ATEN
    if t is operator.getitem:
        return True
    return getattr(t, "__name__", "") in _VIEW_METHODS


_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)\n\s*(.*)')


def user_source(stack_trace: str | None) -> str | None:
    """The innermost user frame of an FX node's stack_trace as
    "file:line in fn: code", or None."""
    if not stack_trace:
        return None
    frames = _FRAME.findall(stack_trace)
    if not frames:
        return None
    f, line, fn, code = frames[-1]
    return f"{f}:{line} in {fn}: {code.strip()}"


def node_value(node: torch.fx.Node):
    """The fake value FX recorded for a node: meta['val'] (aten graphs) or
    meta['example_value'] (dynamo graphs); None if neither."""
    m = node.meta
    return m["val"] if "val" in m else m.get("example_value")


def _tensors(value, prefix: str):
    if isinstance(value, torch.Tensor):
        yield prefix, value
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            yield from _tensors(v, f"{prefix}[{i}]")


def _concrete(x) -> int | None:
    if isinstance(x, int):
        return x
    try:
        from torch.fx.experimental.symbolic_shapes import is_concrete_int

        return int(x) if is_concrete_int(x) else None
    except Exception:
        return None


class _Checker:
    def __init__(self, adapter: AcceleratorAdapter, stage: str, compile_id: str | None):
        self.adapter = adapter
        self.caps = adapter.capabilities()
        self.stage = stage
        self.compile_id = compile_id
        self.violations: list[Violation] = []
        self.unchecked: list[str] = []
        self._seen: set = set()  # (node, value-id, constraint): one record per tensor and rule

    def add(self, node, constraint: str, value: str, expected: str, actual: str, t: torch.Tensor | None) -> None:
        st = node.meta.get("stack_trace")
        self.violations.append(Violation(
            constraint=constraint, stage=self.stage, compile_id=self.compile_id, node=node.name,
            target=display_target(node) if node.op not in ("placeholder", "get_attr") else node.op,
            value=value, expected=expected, actual=actual,
            shape=None if t is None else tuple(_concrete(s) if _concrete(s) is not None else str(s) for s in t.shape),
            dtype=None if t is None else str(t.dtype).removeprefix("torch."),
            stride=None if t is None else tuple(_concrete(s) if _concrete(s) is not None else str(s)
                                                for s in _strides(t)),
            source=user_source(st), stack_trace=st))

    def tensor(self, node, t: torch.Tensor, value: str, layout: bool) -> None:
        key = (node.name, value)
        if key in self._seen:
            return
        self._seen.add(key)
        caps = self.caps
        if caps.dtypes is not None and t.dtype not in caps.dtypes:
            allowed = ", ".join(sorted(str(d).removeprefix("torch.") for d in caps.dtypes))
            self.add(node, "dtype", value, f"one of {allowed}", str(t.dtype).removeprefix("torch."), t)
        bad = []
        for i, s in enumerate(t.shape):
            a = caps.alignment_of(i, t.dim())
            if a == 1:
                continue
            n = _concrete(s)
            if n is None:
                self.unchecked.append(f"{node.name} {value}: dim {i} is symbolic ({s}); alignment {a} not checked")
                continue
            if n % a and not (n == 1 and caps.exempt_unit_dims):
                bad.append(f"dim {i} = {n} (multiple of {a} needed)")
        if bad:
            self.add(node, "alignment", value, "sizes aligned as declared", "; ".join(bad), t)
        if caps.max_tensor_bytes is not None:
            held = _bytes_held(t)
            if held is None:
                self.unchecked.append(f"{node.name} {value}: symbolic size; max_tensor_bytes not checked")
            elif held > caps.max_tensor_bytes:
                self.add(node, "max_bytes", value, f"at most {caps.max_tensor_bytes} bytes", f"{held} bytes", t)
        if layout and caps.layout != "any" and t.layout == torch.strided:
            ok = _layout_ok(t, caps.layout)
            if ok is None:
                self.unchecked.append(f"{node.name} {value}: symbolic strides; layout not checked")
            elif not ok:
                self.add(node, "layout", value, caps.layout, "strided (stride " + str(list(_strides(t))) + ")", t)

    def node(self, node: torch.fx.Node) -> None:
        caps = self.caps
        if node.op == "output":
            return
        if node.op in ("call_function", "call_method", "call_module"):
            names = target_names(node)
            hit = _matches(names, caps.denied_ops)
            if hit:
                self.add(node, "denied_op", "op", f"no op matching {hit!r} (denied_ops)", names[0], None)
            if caps.allowed_ops is not None and self.stage != "dynamo" and _is_aten(node) \
                    and not _matches(names, caps.allowed_ops):
                self.add(node, "not_allowed_op", "op", "an op in allowed_ops", names[0], None)
            why = self.adapter.supports(node, self.stage)
            if why:
                self.add(node, "unsupported", "op", f"an op {self.adapter.name} supports", str(why), None)
            if caps.layout != "any" and not _layout_exempt(node):
                for i, a in enumerate(node.all_input_nodes):
                    for path, t in _tensors(node_value(a), ""):
                        self.tensor_input(node, a, i, path, t)
        for path, t in _tensors(node_value(node), ""):
            self.tensor(node, t, "output" + path, layout=node.op in ("placeholder", "get_attr"))

    def tensor_input(self, node, producer, i: int, path: str, t: torch.Tensor) -> None:
        """The layout rule on what a compute op reads (recorded on the reader)."""
        key = (node.name, f"in{i}{path}")
        if key in self._seen or t.layout != torch.strided:
            return
        self._seen.add(key)
        ok = _layout_ok(t, self.caps.layout)
        if ok is None:
            self.unchecked.append(f"{node.name} input {i}: symbolic strides; layout not checked")
        elif not ok:
            self.add(node, "layout", f"input {i} ({producer.name}{path})", self.caps.layout,
                     "strided (stride " + str(list(_strides(t))) + ")", t)


def _strides(t: torch.Tensor) -> tuple:
    try:
        return tuple(t.stride())
    except RuntimeError:  # sparse and other layouts without strides
        return ()


def _bytes_held(t: torch.Tensor) -> int | None:
    """The bytes of memory tensor t addresses: the span from its first element
    to its last (a broadcast view, stride 0, holds its storage's bytes, not
    numel's: an attention mask expanded over batch and heads was flagged at
    64 MB for 64 KB; found by an adversarial pass); numel's bytes where a
    stride is symbolic; None where a size is."""
    numel = _concrete(t.numel())
    if numel is None:
        return None
    if numel == 0:
        return 0
    sizes = [_concrete(x) for x in t.shape]
    strides = [_concrete(x) for x in t.stride()] if t.layout == torch.strided else [None]
    if None in sizes or None in strides:
        return numel * t.element_size()
    return (1 + sum((n - 1) * abs(st) for n, st in zip(sizes, strides))) * t.element_size()


def _layout_ok(t: torch.Tensor, layout: str) -> bool | None:
    try:
        if layout == "contiguous":
            return bool(t.is_contiguous())
        return bool(_upstream.is_non_overlapping_and_dense(t))
    except Exception:  # data-dependent (symbolic) strides
        return None


def check_graph(gm: torch.fx.GraphModule, adapter: AcceleratorAdapter, stage: str,
                compile_id: str | None = None) -> GraphCheck:
    """Every node of ``gm`` against the adapter's capabilities."""
    c = _Checker(adapter, stage, compile_id)
    n = 0
    for node in gm.graph.nodes:
        n += 1
        c.node(node)
    return GraphCheck(stage=stage, compile_id=compile_id, nodes=n, violations=c.violations, unchecked=c.unchecked)
