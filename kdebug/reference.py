"""Eager and float64 runs of the graph Inductor lowered, node by node.

Note [Reference runs]
The accuracy check (kdebug/accuracy.py) compares what a compiled kernel
wrote with the value of the same FX node computed eagerly, and with that
node computed in float64 (the arbiter).  Both runs interpret the post-grad
graph (torch.fx.Interpreter) on copies of the inputs the compiled graph got:
- eager: every node runs its aten op as eager PyTorch would, in the graph's
  dtypes;
- float64: floating inputs are cast to float64, and every dtype argument of a
  node that names a narrower floating dtype (the casts autocast and the
  bf16/fp16 decompositions insert, `dtype=` of factory ops) is replaced by
  float64, so no rounding to a narrow type happens anywhere.  A node whose op
  refuses float64 runs in its own dtype on inputs rounded to it, and is
  listed in `approximated`: its reference is then only as good as eager.
Nodes that draw random numbers, and everything computed from them, differ
between compiled and eager by construction (Inductor's own RNG); they are
listed in `random` and never compared.
The runs must not change the user's program: they run with no grad, with
torch dispatch modes (a recording DebugMode) disabled, and on a forked RNG.
Device memory: the inputs of a GPU graph are also copied to the host first;
a run that runs out of device memory is run again on the host from that
copy (kdebug/accuracy.py), so the check slows down instead of failing.
Note [Local reference]: with `given` (node name -> the value a compiled
kernel wrote for it), each node is computed from its inputs and kept, and
then replaced by the given value for the nodes after it: every kept value is
then what eager (or float64) computes *from the compiled inputs* of that
node, which judges a kernel on its own arithmetic, not on the (within
tolerance) differences it was handed.
Only the nodes asked for are kept (cloned: a later in-place node could
change them); the interpreter frees everything else after its last use.
The kept values of a GPU graph stay on the device up to the check's device
budget and go to pinned host memory beyond it (`place`, Note [Output
spill], kdebug/spill.py), so a long graph's kept values do not fill the
device.
"""
from __future__ import annotations

import dataclasses
import operator
import re

import torch
import torch.fx

from . import _upstream

_NARROW_FLOATS = (torch.float16, torch.bfloat16, torch.float32)

# ops whose values come from a random generator (by the op's base name)
_RANDOM = re.compile(r"^(rand|randn|randint|randperm|rand_like|randn_like|randint_like|bernoulli|"
                     r"native_dropout|dropout|normal|uniform|multinomial|exponential|geometric|"
                     r"cauchy|log_normal|poisson|inductor_random|inductor_seeds|inductor_seed|"
                     r"inductor_lookup_seed|philox_rand|_fused_dropout|rrelu_with_noise)(_)?$")


@dataclasses.dataclass
class GraphValues:
    """The kept node values of one interpreted run."""

    values: dict            # node name -> tensor (clone)
    failed: dict            # node name -> why its value could not be computed
    approximated: set       # float64 run: nodes computed in their own dtype
    term_scale: dict = dataclasses.field(default_factory=dict)  # float64 run: Note [Accumulation floor]


def op_base(target) -> str:
    """'addmm' for aten.addmm.default, extern_kernels.addmm, 'aten::addmm.out'."""
    name = getattr(target, "__name__", None) if not isinstance(target, str) else target
    if hasattr(target, "_schema"):
        name = target._schema.name.split("::")[-1]
    name = str(name or target)
    for prefix in ("extern_kernels.", "torch.ops.", "aten::", "aten.", "prims::", "prims.", "inductor::",
                   "inductor."):
        if name.startswith(prefix):
            name = name[len(prefix):]
    return name.split(".")[0]


def random_nodes(gm: torch.fx.GraphModule) -> set:
    """Nodes that draw random numbers and every node computed from them."""
    out: set = set()
    for node in gm.graph.nodes:
        if node.op == "call_function" and _RANDOM.match(op_base(node.target)):
            out.add(node.name)
        elif any(a.name in out for a in node.all_input_nodes):
            out.add(node.name)
    return out


def _to64(x):
    if isinstance(x, torch.dtype) and x in _NARROW_FLOATS:
        return torch.float64
    if isinstance(x, torch.Tensor) and x.dtype in _NARROW_FLOATS:
        return x.to(torch.float64)
    if isinstance(x, (list, tuple)):
        return type(x)(_to64(v) for v in x)
    if isinstance(x, dict):
        return {k: _to64(v) for k, v in x.items()}
    return x


def _meta_dtype(node: torch.fx.Node):
    v = node.meta.get("val")
    return v.dtype if isinstance(v, torch.Tensor) else None


def _host(x):
    """x with every tensor on the CPU and every device argument the CPU."""
    if isinstance(x, torch.Tensor):
        return x.cpu()
    if isinstance(x, torch.device):
        return torch.device("cpu")
    if isinstance(x, (list, tuple)):
        return type(x)(_host(v) for v in x)
    if isinstance(x, dict):
        return {k: _host(v) for k, v in x.items()}
    return x


def _down(value, meta):
    """value (fetched arguments, floating tensors in float64) with each tensor
    cast back to the dtype its FX argument node had in the compiled graph:
    meta is the node's args or kwargs, of the same structure.  Each argument
    gets its own dtype, so ops with several outputs (attention) or mixed input
    dtypes fall back correctly."""
    if isinstance(meta, torch.fx.Node):
        dtype = _meta_dtype(meta)
        if (isinstance(value, torch.Tensor) and value.dtype == torch.float64
                and dtype is not None and dtype.is_floating_point):
            return value.to(dtype)
        return value
    if isinstance(meta, (list, tuple)) and isinstance(value, (list, tuple)) and len(meta) == len(value):
        return type(value)(_down(v, m) for v, m in zip(value, meta))
    if isinstance(meta, dict) and isinstance(value, dict):
        return {k: _down(v, meta.get(k)) for k, v in value.items()}
    return value


class _Run(torch.fx.Interpreter):
    def __init__(self, gm, keep: set, float64: bool, host: bool = False, given: dict | None = None,
                 place=None):
        super().__init__(gm, garbage_collect_values=True)
        self.keep = keep
        self.place = place
        self.given = given or {}
        self.float64 = float64
        self.host = host
        self.out = GraphValues({}, {}, set())
        self.current = None

    def run_node(self, n):
        self.current = n.name
        if n.op != "call_function" or not (self.float64 or self.host):
            value = super().run_node(n)
            if self.host:
                value = _host(value)
        else:
            with self._set_current_node(n):
                args, kwargs = self.fetch_args_kwargs_from_env(n)
                if self.host:
                    args, kwargs = _host(args), _host(kwargs)
                try:
                    value = n.target(*_to64(args), **_to64(kwargs)) if self.float64 else n.target(*args, **kwargs)
                except torch.OutOfMemoryError:
                    raise
                except Exception:  # an op without float64 support: its own dtype
                    if not self.float64:
                        raise
                    value = n.target(*_down(args, n.args), **_down(kwargs, n.kwargs))
                    value = _to64(value)
                    self.out.approximated.add(n.name)
        if n.name in self.keep and isinstance(value, torch.Tensor):
            kept = value.detach().clone()
            self.out.values[n.name] = self.place(kept) if self.place is not None else kept
            if self.float64:
                scale = _term_scale(n, self.fetch_args_kwargs_from_env(n)[0])
                if scale is not None:
                    self.out.term_scale[n.name] = scale
        g = self.given.get(n.name)
        if g is not None and isinstance(value, torch.Tensor) and g.numel() == value.numel():
            # Note [Local reference]: later nodes read what the compiled kernel wrote
            g = g.detach().reshape(value.shape).to(device=value.device, dtype=value.dtype)
            value = g.clone()
        return value


def run_graph(gm: torch.fx.GraphModule, inputs: list, keep: set, float64: bool = False,
              host: bool = False, given: dict | None = None, place=None) -> GraphValues:
    """Interprets gm on inputs (which it may change: pass copies), keeping
    the values of the nodes named in keep (Note [Reference runs]); with
    host=True on the CPU, whatever device the graph was compiled for.
    place(kept clone) -> where it is kept (Note [Output spill]: off the
    device beyond a budget); place.done() is called when the run ends.
    torch.OutOfMemoryError propagates (the caller retries on the host)."""
    run = _Run(gm, set(keep), float64, host, given, place)
    args = [_to64(x) if float64 else x for x in (_host(inputs) if host else inputs)]
    devices = sorted({x.device.index or 0 for x in inputs if isinstance(x, torch.Tensor) and x.is_cuda})
    with torch.no_grad(), _upstream.disable_torch_dispatch(), torch.random.fork_rng(devices=devices):
        try:
            run.run(*args)
        except torch.OutOfMemoryError:
            raise
        except Exception as e:  # a node failed: what was kept before it stays valid
            run.out.failed[run.current or "<graph>"] = f"{type(e).__name__}: {e}"[:500]
        finally:
            if place is not None and hasattr(place, "done"):
                place.done()
    return run.out


# Note [Accumulation floor]
# Two correct float32 reductions of K terms that add in different orders
# (eager's cascade sum, Inductor's vectorized and split reductions) differ by
# rounding that grows with K: about eps * sqrt(K) relative to the result, not
# half an eps.  So the error floor of a value computed through a reduction is
# raised by sqrt(K) (numerics.difference's `terms`), where K is the number of
# terms reduced into one output element, multiplied along chained reductions
# inside one kernel (softmax: a sum, then a division by it).  Reductions in
# other kernels are not counted: their outputs are compared where they are
# written.  A sum or mean that cancels has a result much smaller than its
# terms, and rounds like its terms: its floor follows the L2 norm of the
# terms (GraphValues.term_scale) where that is larger than the result.

# ops that add up terms (by base name); the value of K is read from the node's
# meta shapes
_SUMMING = frozenset({"sum", "mean", "var", "var_mean", "std", "std_mean", "prod", "logsumexp", "norm",
                      "linalg_vector_norm", "nansum", "_softmax", "_log_softmax", "softmax", "log_softmax",
                      "cumsum", "cumprod", "logcumsumexp", "mm", "addmm", "bmm", "baddbmm", "matmul",
                      "convolution", "_weight_norm_interface", "native_layer_norm", "native_group_norm",
                      "native_batch_norm", "_native_batch_norm_legit_functional", "_native_batch_norm_legit",
                      "_native_batch_norm_legit_no_training", "scatter_add", "scatter_reduce", "index_add",
                      "index_put", "embedding_dense_backward", "_scaled_dot_product_flash_attention_for_cpu",
                      "_scaled_dot_product_flash_attention_for_cpu_backward", "convolution_backward"})


def _numel(v) -> int | None:
    try:
        return int(v.numel()) if isinstance(v, torch.Tensor) else None
    except Exception:  # symbolic sizes
        return None


def _val(n):
    v = n.meta.get("val") if hasattr(n, "meta") else None
    return v if isinstance(v, torch.Tensor) else None


def _terms_of(node, index: int | None = None) -> int:
    """How many terms one output element of a summing node adds up (1 when
    not a summing op or when its shapes are unknown); `index` picks one
    output of a node with several (what a getitem takes)."""
    if node.op != "call_function" or op_base(node.target) not in _SUMMING:
        return 1
    out = node.meta.get("val")
    if isinstance(out, (tuple, list)):
        if index is not None and 0 <= index < len(out):
            out = out[index]
        else:
            out = next((v for v in out if isinstance(v, torch.Tensor)), None)
    if op_base(node.target) == "convolution_backward" and len(node.args) > 2:
        g, w = _val(node.args[0]), _val(node.args[2])
        try:
            if index == 0 and w is not None:  # grad_input: out-channels x kernel size
                return max(1, int(w.numel()) // max(1, int(w.shape[1])))
            if index in (1, 2) and g is not None:  # grad_weight, grad_bias: batch x output positions
                return max(1, int(g.numel()) // max(1, int(g.shape[1])))
        except Exception:
            return 1
    n_out = _numel(out)
    ins = [_numel(a.meta.get("val")) for a in node.all_input_nodes]
    ins = [n for n in ins if n]
    if not n_out or not ins:
        return 1
    base = op_base(node.target)
    first = node.all_input_nodes[0].meta.get("val") if node.all_input_nodes else None
    if base in ("mm", "bmm", "matmul", "addmm", "baddbmm") and isinstance(first, torch.Tensor):
        a = node.args[1] if base in ("addmm", "baddbmm") and len(node.args) > 1 else node.args[0]
        v = getattr(a, "meta", {}).get("val") if hasattr(a, "meta") else None
        try:
            return max(1, int(v.shape[-1])) if isinstance(v, torch.Tensor) else 1  # the inner dimension
        except Exception:
            return 1
    if base == "convolution" and len(node.args) > 1 and hasattr(node.args[1], "meta"):
        w = node.args[1].meta.get("val")
        try:
            return max(1, int(w.numel()) // max(1, int(w.shape[0])))  # in-channels x kernel size
        except Exception:
            return 1
    k = max(ins) // max(1, n_out)  # reductions: input elements per output element
    if k <= 1:  # same-size outputs (cumsum, softmax, mm with small inner dim): the largest dimension of the inputs
        shapes = [a.meta.get("val").shape for a in node.all_input_nodes if isinstance(a.meta.get("val"), torch.Tensor)]
        try:
            k = max((int(d) for sh in shapes for d in sh), default=1)
        except Exception:
            k = 1
    return max(1, k)


def _term_scale(node, args) -> float | None:
    """For a sum or mean over dimensions: the RMS over its outputs of the
    L2 norm of the terms each one adds up (divided by their count for a
    mean), else None.  A sum that cancels (batch norm's backward) has a
    result far smaller than its terms; its rounding follows the terms."""
    base = op_base(node.target)
    if base not in ("sum", "mean") or not args or not isinstance(args[0], torch.Tensor):
        return None
    x = args[0]
    if not (x.is_floating_point() and x.numel()):
        return None
    dims = args[1] if len(args) > 1 and isinstance(args[1], (list, tuple)) and args[1] else None
    try:
        sq = (x.double() * x.double())
        per_out = sq.sum(dim=list(dims)) if dims is not None else sq.sum()
        k = max(1, x.numel() // max(1, per_out.numel()))
        norm = per_out.sqrt() / (k if base == "mean" else 1)
        return float(torch.sqrt(torch.mean(norm * norm)))
    except Exception:  # odd arguments: no scale, the floor follows the result
        return None


_VIEWS = frozenset({"view", "reshape", "_unsafe_view", "unsqueeze", "squeeze", "permute", "expand", "t",
                    "transpose", "select", "slice", "alias", "as_strided"})


def _transparent(n) -> bool:
    """A node that only takes a piece or a view of another node's value."""
    return n.op == "call_function" and (n.target is operator.getitem or op_base(n.target) in _VIEWS)


def accumulated_terms(gm: torch.fx.GraphModule, node_name: str, within) -> int:
    """Note [Accumulation floor]: terms added up into one element of node
    `node_name`, along the nodes named in `within` (one kernel's fused
    nodes; the node itself always counts)."""
    nodes = {n.name: n for n in gm.graph.nodes}
    within = set(within) | {node_name}
    memo: dict = {}

    def inside(a) -> bool:
        # a getitem or view of a fused node computes nothing: Inductor may
        # leave it out of the kernel's origins (var_mean's variance)
        return a.name in within or _transparent(a)

    def terms(n) -> int:
        if n.name in memo:
            return memo[n.name]
        memo[n.name] = 1  # guards a cycle (there is none in an FX graph)
        parent = n.args[0] if n.op == "call_function" and n.target is operator.getitem and n.args else None
        if hasattr(parent, "all_input_nodes") and len(n.args) > 1 and isinstance(n.args[1], int):
            # one output of a multi-output node: its own count of terms
            up = max((terms(a) for a in parent.all_input_nodes if inside(a)), default=1)
            memo[n.name] = min(up * _terms_of(parent, n.args[1]), 1 << 62)
            return memo[n.name]
        up = max((terms(a) for a in n.all_input_nodes if inside(a)), default=1)
        memo[n.name] = min(up * _terms_of(n), 1 << 62)
        return memo[n.name]

    n = nodes.get(node_name)
    return 1 if n is None else terms(n)
