"""A standalone repro of a constraint violation: repro.py (the graph's own
code, with a check of the broken constraint after the node that broke it)
and inputs.pt (the example inputs and the graph's attributes), runnable
with torch alone (Note [Constraint backend], kdebug/backends/constrained.py).

``python repro.py`` prints REPRODUCED lines and exits 1 when the violation
happens again on the saved inputs, 0 when it does not, 2 when the graph
raised (run eagerly) before any checked node.
"""
from __future__ import annotations

import operator
import os
import textwrap
import types

import torch

from . import _files, _upstream
from .constraint_check import Violation, node_value

# The generated scripts' module: the graph's parameters and buffers installed
# at their dotted paths (shared with kdebug/minify_repro.py's script).
REPRO_MODULE = '''class Repro(torch.nn.Module):
    def __init__(self, attrs):
        super().__init__()
        for path, value in attrs.items():
            owner = self
            *parents, leaf = path.split(".")
            for p in parents:
                if not hasattr(owner, p):
                    owner.add_module(p, torch.nn.Module())
                owner = getattr(owner, p)
            if isinstance(value, torch.nn.Module):
                owner.add_module(leaf, value)
            else:
                owner.register_buffer(leaf, value)
'''

_HEADER = '''\
# Standalone repro of an accelerator constraint violation, written by kdebug.
# It needs only torch:  python repro.py   (exit 1: reproduced, 0: not, 2: the graph raised first)
#
# graph: {stage} graph {compile_id}; capabilities: {caps}
# inputs.pt: {inputs_note}
#
{violations}
import os
import sys

import torch
{imports}

REPRODUCED = []


def _dense(t):
    """Non-overlapping and dense in some dimension order."""
    dims = sorted((s, st) for s, st in zip(t.shape, t.stride()) if s != 1)
    expected = 1
    for size, stride in sorted(dims, key=lambda p: p[1]):
        if stride != expected:
            return False
        expected *= size
    return True


def check_constraint(value, spec):
    """Re-checks one constraint on the tensor the graph computed."""
    c = spec["constraint"]
    where = f"node {{spec['node']}} ({{spec['target']}}), {{spec['value']}}"
    got = None
    if c in ("denied_op", "not_allowed_op", "unsupported"):
        got = f"{{spec['target']}} ran ({{spec['actual']}})"
    elif not isinstance(value, torch.Tensor):
        return None
    elif c == "dtype" and str(value.dtype).replace("torch.", "") not in spec["dtypes"]:
        got = f"dtype {{value.dtype}}"
    elif c == "alignment":
        bad = [f"dim {{i}} = {{n}} (multiple of {{a}} needed)" for i, (n, a) in enumerate(zip(value.shape, spec["align"]))
               if n % a and not (n == 1 and spec["exempt_unit_dims"])]
        got = "; ".join(bad) or None
    elif c == "max_bytes" and value.numel() * value.element_size() > spec["max_bytes"]:
        got = f"{{value.numel() * value.element_size()}} bytes"
    elif c == "layout":
        ok = value.is_contiguous() if spec["layout"] == "contiguous" else _dense(value)
        got = None if ok else f"stride {{list(value.stride())}} for shape {{list(value.shape)}}"
    if got is not None:
        REPRODUCED.append(f"{{c}}: {{where}}: expected {{spec['expected']}}, got {{got}}")
    return None
{aliases}

{repro_module}
{forward}


if __name__ == "__main__":
    here = os.path.dirname(os.path.abspath(__file__))
    data = torch.load(os.path.join(here, "inputs.pt"), weights_only={weights_only})
    error = None
    try:
        with torch.no_grad():
            Repro(data["attrs"])(*data["args"])
    except Exception as e:  # an op after the checked one may refuse what the graph gives it, as in eager
        error = f"{{type(e).__name__}}: {{e}}"
    for line in REPRODUCED:
        print("REPRODUCED", line)
    if error is not None:
        print("the graph then raised when run eagerly:", error)
    if not REPRODUCED:
        print("not reproduced: every constraint checked before that holds on these inputs")
    sys.exit(1 if REPRODUCED else 2 if error is not None else 0)
'''


def _spec(v: Violation, caps, t) -> dict:
    spec = {"constraint": v.constraint, "node": v.node, "target": v.target, "value": v.value,
            "expected": v.expected, "actual": v.actual}
    if v.constraint == "dtype":
        spec["dtypes"] = sorted(str(d).removeprefix("torch.") for d in (caps.dtypes or ()))
    elif v.constraint == "alignment":
        nd = t.dim() if isinstance(t, torch.Tensor) else 0
        spec["align"] = [caps.alignment_of(i, nd) for i in range(nd)]
        spec["exempt_unit_dims"] = caps.exempt_unit_dims
    elif v.constraint == "max_bytes":
        spec["max_bytes"] = caps.max_tensor_bytes
    elif v.constraint == "layout":
        spec["layout"] = caps.layout
    return spec


def _imports(globals_: dict, check_fn) -> tuple[list[str], list[str], list[str]]:
    """Import lines for the generated code's globals, the names that
    cannot be imported standalone, and the names the code calls the
    script's check_constraint by."""
    lines, missing, aliases = [], [], []
    fixed = {"inf": "from math import inf", "nan": "from math import nan", "NoneType": "NoneType = type(None)",
             "device": "from torch import device", "fx_pytree": "import torch.fx._pytree as fx_pytree",
             "pytree": "import torch.utils._pytree as pytree"}
    for name, obj in sorted(globals_.items()):
        if name == "torch":
            continue
        if obj is check_fn:
            aliases.append(f"{name} = check_constraint")
            continue
        if name in fixed:
            lines.append(fixed[name])
        elif isinstance(obj, types.ModuleType):
            lines.append(f"import {obj.__name__} as {name}")
        else:
            mod, qual = getattr(obj, "__module__", None), getattr(obj, "__qualname__", "")
            if mod and qual and "<" not in qual and "." not in qual and not mod.startswith("__main__"):
                lines.append(f"from {mod} import {qual} as {name}")
            else:
                missing.append(name)
                lines.append(f"{name} = None  # NOT STANDALONE: {obj!r} cannot be imported")
    return lines, missing, aliases


def _real(x):
    """A real tensor of a fake one's shape, strides and dtype (random
    values: the compiler saw only metadata), or x itself when real."""
    if isinstance(x, torch.Tensor) and not isinstance(x, _upstream.fake_tensor_type()):
        if x.layout != torch.strided:
            return x.detach().clone()
        # its strides kept, gaps included: clone() makes a view with gaps contiguous, and the repro of a
        # layout violation on such an input said "not reproduced" (found by an adversarial pass)
        t = torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device=x.device)
        with torch.no_grad():
            t.copy_(x.detach())
        return t
    if isinstance(x, torch.Tensor):
        with _upstream.unset_fake_mode():
            shape = [_upstream.size_hint(s) for s in x.shape]
            stride = [_upstream.size_hint(s) for s in x.stride()]
            t = torch.empty_strided(shape, stride, dtype=x.dtype, device=x.device)
            if t.is_floating_point() or t.is_complex():
                t.normal_()
            else:
                t.zero_()
            return t
    if isinstance(x, torch.SymInt):
        return _upstream.size_hint(x)
    return x


def write_repro(gm: torch.fx.GraphModule, example_inputs, violations: list[Violation], caps, directory: str,
                limit: int = 20) -> str:
    """Writes repro.py, inputs.pt and graph.txt (the graph as
    print_readable shows it) into ``directory``; returns repro.py's path."""
    _files.refuse_link(directory)  # as artifacts= and --html refuse one (Note [Safe writes])
    os.makedirs(directory, exist_ok=True)
    graph = torch.fx.Graph()
    env: dict = {}
    out = graph.graph_copy(gm.graph, env)
    graph.output(out)
    by_node: dict[str, list[Violation]] = {}
    for v in violations[:limit]:
        by_node.setdefault(v.node, []).append(v)
    originals = {n.name: n for n in gm.graph.nodes}
    for name, vs in by_node.items():
        orig = originals[name]
        new = env[orig]
        for v in vs:
            if v.value.startswith("input "):
                idx = int(v.value.split()[1])
                src = orig.all_input_nodes[idx]
                with graph.inserting_before(new):
                    graph.call_function(check_constraint, (env[src], _spec(v, caps, node_value(src))))
            else:
                with graph.inserting_after(new):
                    graph.call_function(check_constraint, (new, _spec(v, caps, node_value(orig))))
    code = graph.python_code("self")
    imports, missing, aliases = _imports(code.globals, check_constraint)
    attrs: dict = {}
    weights_only = True
    for n in gm.graph.nodes:
        if n.op == "get_attr":
            attrs[n.target] = _real(operator.attrgetter(n.target)(gm))
        elif n.op == "call_module":
            attrs[n.target] = gm.get_submodule(n.target)
            weights_only = False
    args = [_real(x) for x in example_inputs]
    fake = any(isinstance(x, _upstream.fake_tensor_type()) for x in example_inputs)
    with _files.replaced_atomically(os.path.join(directory, "inputs.pt"), "wb") as f:  # never through a link
        torch.save({"args": args, "attrs": attrs}, f)
    with _files.replaced_atomically(os.path.join(directory, "graph.txt")) as f:
        f.write(gm.print_readable(print_output=False, include_stride=True, include_device=True))
    v0 = violations[0]
    text = _HEADER.format(repro_module=REPRO_MODULE,
        stage=v0.stage, compile_id=v0.compile_id, caps=caps.name,
        inputs_note=("random values of the shapes, strides and dtypes the compiler saw (it saw fake tensors)"
                     if fake else "the values the compiler was given"),
        violations="\n".join("# " + line for v in violations[:limit] for line in textwrap.wrap(v.message(), 110)),
        imports="\n".join(imports), aliases="\n" + "\n".join(aliases) + "\n" if aliases else "",
        forward=textwrap.indent(code.src.strip("\n"), "    "),
        weights_only=weights_only)
    if missing:
        text = f"# WARNING: not standalone: {', '.join(missing)} could not be imported\n" + text
    path = os.path.join(directory, "repro.py")
    with _files.replaced_atomically(path) as f:
        f.write(text)
    return path


def check_constraint(value, spec):
    """Stands for the repro script's own check_constraint in the copied graph
    (never called here: the script defines the function of that name)."""
    raise AssertionError("kdebug.constraint_repro.check_constraint runs only inside a written repro.py")
