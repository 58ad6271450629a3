"""The standalone repro of a compiled-vs-eager mismatch (Note [Minifier],
kdebug/minify.py): repro.py compiles the minimal graph with torch.compile,
runs it and eager on inputs.pt, and compares every output at the
tolerances the minifier used."""
from __future__ import annotations

import operator
import os
import textwrap

import torch

from . import _files, numerics
from .constraint_repro import REPRO_MODULE

_SCRIPT = '''\
import os
import sys

import torch
{imports}

TOLERANCES = {tolerances}  # per output leaf: (rtol, atol), as the minifier judged them


{repro_module}
{forward}


def leaves(out):
    if isinstance(out, torch.Tensor):
        yield out
    elif isinstance(out, (list, tuple)):
        for o in out:
            yield from leaves(o)


def outside(c, e, rtol, atol):
    """Elements outside atol + rtol * |eager| (NaN where both are NaN, and equal infinities, match)."""
    c, e = c.double(), e.double()
    matched = (c.isnan() & e.isnan()) | (c.isinf() & (c == e))
    diff = torch.where(matched, torch.zeros_like(c), (c - e).abs())
    return ~(diff <= atol + rtol * e.abs()) & ~matched, diff


if __name__ == "__main__":
    here = os.path.dirname(os.path.abspath(__file__))
    data = torch.load(os.path.join(here, "inputs.pt"), weights_only={weights_only})
    model = Repro(data["attrs"])
    copies = lambda: [x.clone() if isinstance(x, torch.Tensor) else x for x in data["args"]]
    with torch.no_grad():
        eager = list(leaves(model(*copies())))
        compiled = list(leaves(torch.compile(model, fullgraph=True)(*copies())))
    reproduced = False
    for i, (c, e) in enumerate(zip(compiled, eager)):
        rtol, atol = TOLERANCES[i] if i < len(TOLERANCES) else (0.0, 0.0)
        bad, diff = outside(c, e, rtol, atol)
        if bool(bad.any()):
            reproduced = True
            finite = diff[diff.isfinite()]
            print(f"REPRODUCED output {{i}} ({{c.dtype}} {{list(c.shape)}}): {{int(bad.sum())}} of {{c.numel()}} elements "
                  f"outside rtol {{rtol:g}}, atol {{atol:g}}; max |compiled - eager| "
                  f"{{float(finite.max()) if finite.numel() else float('nan'):.6g}}")
    if not reproduced:
        print("not reproduced: torch.compile's outputs are within tolerance of eager's")
    sys.exit(1 if reproduced else 0)
'''


def write_accuracy_repro(gm: torch.fx.GraphModule, inputs, directory: str, rtol: float | None,
                         atol: float | None) -> str:
    """Writes repro.py, inputs.pt and graph.txt for ``gm`` on ``inputs``
    into ``directory``; returns repro.py's path."""
    from .constraint_repro import _imports, _real

    code = gm.graph.python_code("self")
    imports, missing, _ = _imports(code.globals, None)
    attrs: dict = {}
    weights_only = True
    for n in gm.graph.nodes:
        if n.op == "get_attr":
            attrs[n.target] = _real(operator.attrgetter(n.target)(gm))
        elif n.op == "call_module":
            attrs[n.target] = gm.get_submodule(n.target)
            weights_only = False
    with torch.no_grad():
        outs = gm(*[x.clone() if isinstance(x, torch.Tensor) else x for x in inputs])
    from .minify import _leaves

    tols = [numerics.tolerances(t.dtype, rtol, atol) for t in _leaves(outs)]
    with _files.replaced_atomically(os.path.join(directory, "inputs.pt"), "wb") as f:  # never through a link
        torch.save({"args": list(inputs), "attrs": attrs}, f)
    with _files.replaced_atomically(os.path.join(directory, "graph.txt")) as f:
        f.write(gm.print_readable(print_output=False, include_stride=True, include_device=True))
    text = _SCRIPT.format(repro_module=REPRO_MODULE, imports="\n".join(imports), tolerances=repr(tols),
                          forward=textwrap.indent(code.src.strip("\n"), "    "), weights_only=weights_only)
    if missing:
        text = f"# WARNING: not standalone: {', '.join(missing)} could not be imported\n" + text
    path = os.path.join(directory, "repro.py")
    with _files.replaced_atomically(path) as f:
        f.write(text)
    return path
