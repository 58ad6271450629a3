"""DEV STUB (not committed): replaced by the prov helper's module."""
from __future__ import annotations
import contextlib, dataclasses
import torch

@dataclasses.dataclass(frozen=True)
class CallSite:
    index: int
    kernel: str
    kind: str
    args: tuple
    writes: dict
    nodes: tuple
    source: tuple

@dataclasses.dataclass
class GraphRecord:
    name: str
    gm: object
    calls: list
    inputs: list
    outputs: list
    cache_key: str | None = None

_current = None

@contextlib.contextmanager
def capture():
    from torch._inductor.codegen.wrapper import PythonWrapperCodegen
    from torch._inductor.virtualized import V
    from torch._inductor.graph import GraphLowering
    import torch._inductor.config as cfg
    graphs = []
    pending = {}
    o_gkc = PythonWrapperCodegen.generate_kernel_call
    o_ext = PythonWrapperCodegen.generate_extern_kernel_out
    o_ctm = GraphLowering.compile_to_module
    def rec(kernel, kind, args, wb):
        g = V.graph
        lst = pending.setdefault(id(g), [])
        writes = {}
        nodes = set()
        for b in wb:
            buf = g.try_get_buffer(b)
            on = getattr(buf, "origin_node", None) if buf is not None else None
            writes[b] = on.name if on is not None else None
            if buf is not None and hasattr(buf, "get_origins"):
                nodes |= {o.name for o in buf.get_origins()}
        lst.append(CallSite(len(lst), kernel, kind, tuple(a if isinstance(a, str) else None for a in args), writes, tuple(sorted(nodes)), ()))
    def gkc(self, kernel_name, call_args, **kw):
        g = V.graph
        names = [a for a in call_args if isinstance(a, str)]
        # written: buffers that are not graph inputs and are defined by scheduler? approximate: names that are buffers with origin
        wb = [a for a in names if g.try_get_buffer(a) is not None and a not in g.graph_inputs]
        rec(kernel_name, "triton" if kw.get("triton", True) and kw.get("device", None) is not None and getattr(kw.get("device"), "type", "cpu") != "cpu" else "cpp", call_args, [])
        # recompute writes from scheduler: use mutation names of the kernel via buffer origins
        site = pending[id(g)][-1]
        writes = {}
        for a in names:
            buf = g.try_get_buffer(a)
            if buf is None or a in g.graph_inputs:
                continue
            on = getattr(buf, "origin_node", None)
            writes[a] = on.name if on is not None else None
        pending[id(g)][-1] = dataclasses.replace(site, writes=writes)
        return o_gkc(self, kernel_name, call_args, **kw)
    def ext(self, node, *a, **k):
        rec(getattr(node, "python_kernel_name", None) or str(node.op_overload), "extern", [], [node.get_name()])
        return o_ext(self, node, *a, **k)
    def ctm(self, *a, **k):
        mod = o_ctm(self, *a, **k)
        calls = pending.pop(id(self), [])
        graphs.append(GraphRecord(str(self.name), self.module, calls, [n.name for n in self.module.graph.nodes if n.op == "placeholder"], [], getattr(self, "cache_key", None)))
        return mod
    PythonWrapperCodegen.generate_kernel_call = gkc
    PythonWrapperCodegen.generate_extern_kernel_out = ext
    GraphLowering.compile_to_module = ctm
    old = (cfg.fx_graph_cache, getattr(cfg, "autotune_local_cache", None))
    cfg.fx_graph_cache = False
    import torch._functorch.config as fcfg
    olda = fcfg.enable_autograd_cache
    fcfg.enable_autograd_cache = False
    try:
        yield graphs
    finally:
        PythonWrapperCodegen.generate_kernel_call = o_gkc
        PythonWrapperCodegen.generate_extern_kernel_out = o_ext
        GraphLowering.compile_to_module = o_ctm
        cfg.fx_graph_cache = old[0]
        fcfg.enable_autograd_cache = olda

def graph_for(compiled, graphs):
    key = getattr(compiled, "cache_key", None)
    for g in graphs:
        if g.cache_key is not None and g.cache_key == key:
            return g
    return None
