"""Kernel provenance (Note [Kernel provenance]): real torch.compile on the CPU
(C++ kernels, extern mm), forward and backward, with a graph break."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
import torch

import kdebug
from kdebug import DebugMode, provenance

from test_report import browser  # noqa: F401  (the Chromium fixture)

HERE = os.path.abspath(__file__)


class Net(torch.nn.Module):
    """matmul + bias + relu + layer_norm, a graph break, then more of it."""

    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(16, 32)
        self.fc2 = torch.nn.Linear(32, 8)

    def forward(self, x):
        h = torch.relu(self.fc1(x))
        h = torch.nn.functional.layer_norm(h, (32,))
        torch._dynamo.graph_break()
        y = self.fc2(h * 3.0)
        return torch.nn.functional.layer_norm(torch.relu(y), (8,))


def _step(model, x):
    model(x).square().sum().backward()


@pytest.fixture(scope="module")
def captured():
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = Net()
    compiled = torch.compile(model)
    x = torch.randn(4, 16, requires_grad=True)
    with provenance.capture() as graphs:
        _step(compiled, x)
    return compiled, x, graphs


def test_every_graph_of_the_program_is_captured(captured):
    _, _, graphs = captured
    kinds = sorted(g.name.split()[1] for g in graphs)
    assert kinds == ["backward", "backward", "forward", "forward"], [g.name for g in graphs]
    for g in graphs:
        assert g.problems == [] or all("origin node(s) not in the post-grad graph" in p for p in g.problems)
        assert g.inputs == [n.name for n in g.gm.graph.nodes if n.op == "placeholder"]
        assert g.calls, g.name


def test_kernel_nodes_are_post_grad_nodes(captured):
    _, _, graphs = captured
    cpp = 0
    for g in graphs:
        names = {n.name for n in g.gm.graph.nodes}
        assert [c.index for c in g.calls] == list(range(len(g.calls)))
        for c in g.calls:
            assert c.kind in ("cpp", "extern"), c
            if c.kind == "cpp":
                cpp += 1
                assert c.kernel.startswith("cpp_fused")
            assert c.nodes, c
            assert set(c.nodes) <= names, (c.kernel, set(c.nodes) - names)
            order = [n.name for n in g.gm.graph.nodes]
            assert list(c.nodes) == sorted(c.nodes, key=order.index)  # topological
            assert set(c.writes.values()) - {None} <= names
    assert cpp >= 4


def test_extern_mm_is_named_with_its_mm_node(captured):
    _, _, graphs = captured
    mm_targets = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default}
    externs = [(g, c) for g in graphs for c in g.calls if c.kind == "extern"]
    assert externs
    for g, c in externs:
        assert c.kernel.startswith("extern_kernels."), c.kernel
        by_name = {n.name: n for n in g.gm.graph.nodes}
        assert any(by_name[n].target in mm_targets for n in c.nodes), c
        (buf, node), = c.writes.items()  # an mm writes its out= buffer, which holds the mm's value
        assert buf in c.args and by_name[node].target in mm_targets


def test_source_lines_point_into_this_file(captured):
    _, _, graphs = captured
    with open(HERE) as f:
        lines = f.read().splitlines()
    seen = 0
    for g in graphs:
        for c in g.calls:
            assert c.source, c
            for s in c.source:
                path, _, rest = s.partition(":")
                assert path == HERE, s
                lineno = int(rest.split(" ", 1)[0])
                code = s.split(": ", 1)[1]
                assert lines[lineno - 1].strip() == code  # the line the source names is that line
                seen += 1
    assert seen


def test_written_buffers_hold_their_nodes_value_shape(captured):
    """The launch records (kdebug's own, independent of provenance) give each
    C++ kernel argument's shape; a written buffer mapped to an FX node has that
    node's shape."""
    compiled, x, graphs = captured
    sites: dict[str, list] = {}
    for g in graphs:
        for c in g.calls:
            if c.kind == "cpp":
                sites.setdefault(c.kernel, []).append((g, c))
    with DebugMode() as dm:
        _step(compiled, x)
    checked = 0
    for k in dm.kernels:
        got = sites.get(k.kernel_name)
        if not got or len(got) != 1:
            continue
        g, c = got[0]
        by_name = {n.name: n for n in g.gm.graph.nodes}
        info = k.tensor_info
        assert len(c.args) == len(k.arg_names)
        for buf, node in c.writes.items():
            if node is None:
                continue
            param = k.arg_names[c.args.index(buf)]
            assert tuple(info[param].shape) == tuple(by_name[node].meta["val"].shape), (k.kernel_name, buf, node)
            checked += 1
    assert checked >= 4


def test_trace_round_trips_provenance_once_per_kernel(captured, tmp_path):
    compiled, x, _ = captured
    path = tmp_path / "run.kdt"
    with DebugMode(trace=str(path)) as dm:
        _step(compiled, x)
    names = {k.kernel_name for k in dm.kernels}
    assert all(k.provenance == provenance.provenances(k.kernel_name) != [] for k in dm.kernels)
    run = kdebug.load(str(path))
    assert set(run.meta["kernel_provenance"]) == names
    for name in names:
        assert run.provenance(name) == provenance.provenances(name)
        assert all(p.nodes and p.origin == "lowering" for p in run.provenance(name))
    out = subprocess.run([sys.executable, "-m", "kdebug", "show", str(path)], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(HERE))})
    assert out.returncode == 0, out.stderr
    tail = out.stdout.split("# kernel provenance", 1)[1]
    for name in names:
        p = run.provenance(name)[0]
        assert f"# {name}" in tail and "nodes: " + ", ".join(p.nodes) in tail


def test_report_shows_provenance_escaped(tmp_path):
    from kdebug import report

    bad = provenance.KernelProvenance("cpp_fused_0", "cpp", ("<script>x</script>",), (), {}, "g", "lowering")
    w = kdebug.trace.Writer(str(tmp_path / "a.kdt"))
    w.meta({"kernel_provenance": {"cpp_fused_0": [bad.to_json()]}})
    w.close()
    run = kdebug.load(str(tmp_path / "a.kdt"))
    assert run.provenance("cpp_fused_0") == [bad]
    meta, _ = report.build([run])
    assert meta["runs"][0]["provenance"] == {"cpp_fused_0": [bad.describe()]}
    page = report.render(meta, b"")
    assert "<script>x</script>" not in page


def test_old_traces_without_provenance_still_load(tmp_path):
    w = kdebug.trace.Writer(str(tmp_path / "old.kdt"))
    w.close()
    run = kdebug.load(str(tmp_path / "old.kdt"))
    assert run.provenance("anything") == [] and "kernel_provenance" not in run.meta


def test_cache_hit_compile_still_names_nodes(tmp_path, monkeypatch):
    """A second compile served by the FX graph cache does not lower: its
    kernels are answered from the same wrapper source lowered before in this
    process, else (a new process) from the file the first compile wrote
    beside Inductor's cache, else from the generated module's own comments
    (extern calls named by Inductor's origins; C++ kernels, which Inductor
    leaves uncommented, say unknown)."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "cache"))
    import torch._inductor.config as icfg
    from kdebug import _upstream

    def fn(a, w):
        return torch.sigmoid(a @ w + 1.0)

    a, w = torch.randn(8, 8), torch.randn(8, 8)
    provenance.install()
    with icfg.patch(fx_graph_cache=True, force_disable_caches=False):
        torch._dynamo.reset()
        with _no_lowering() as lowered:
            torch.compile(fn)(a, w)
        (rec,) = lowered
        first = provenance._per_kernel(rec)
        (cpp,) = [n for n in first if n.startswith("cpp_")]
        assert "extern_kernels.mm" in first and all(p.nodes for p in first.values())
        torch._dynamo.reset()
        with _no_lowering() as lowered:
            torch.compile(fn)(a, w)
        assert lowered == [], "the second compile was not a cache hit"
        sources = [open(m.__file__).read() for m in _upstream.generated_modules()
                   if cpp in vars(m) and getattr(m, "__file__", None)]

        def answers():
            provenance._module_cache.clear()
            got = [provenance.module_provenance(src) for src in sources]
            return [g for g in got if set(g) == set(first)]

        def same(g):
            return all((g[n].nodes, g[n].writes, g[n].source) == (p.nodes, p.writes, p.source)
                       for n, p in first.items())

        saved_names, wrappers = dict(provenance._by_name), dict(provenance._by_wrapper)
        try:
            got = answers()
            assert got and all(same(g) for g in got)
            assert {p.origin for g in got for p in g.values()} == {"same wrapper source"}
            provenance._by_name.pop(cpp)  # kernel_provenance() reads the loaded module
            assert provenance.kernel_provenance(cpp).nodes == first[cpp].nodes
            provenance._by_wrapper.clear()  # a new process
            got = answers()
            assert got and all(same(g) for g in got)
            assert {p.origin for g in got for p in g.values()} == {"provenance file"}
            shutil.rmtree(tmp_path / "cache" / "kdebug_provenance")
            got = answers()
            assert got
            for g in got:
                assert {p.origin for p in g.values()} == {"generated module comments"}
                assert g["extern_kernels.mm"].nodes and "post-grad node names" in g["extern_kernels.mm"].unknown
                assert g[cpp].nodes == () and "nodes" in g[cpp].unknown
                assert all("writes" in p.unknown and "source" in p.unknown for p in g.values())
        finally:
            provenance._by_wrapper.update(wrappers)
            provenance._by_name.update(saved_names)
            provenance._module_cache.clear()


class _no_lowering:
    """Collects the graphs lowered inside it without turning the caches off."""

    def __enter__(self):
        self.sink = []
        provenance._sinks.append(self.sink)
        return self.sink

    def __exit__(self, *exc):
        provenance._sinks.remove(self.sink)


def test_capture_lowers_even_when_the_caches_hold_the_graph(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "cache"))
    import torch._functorch.config as fcfg
    import torch._inductor.config as icfg

    def fn(a):
        return torch.cos(a) * 2.0

    a = torch.randn(16)
    with icfg.patch(fx_graph_cache=True, force_disable_caches=False), fcfg.patch(enable_autograd_cache=True):
        torch._dynamo.reset()
        torch.compile(fn)(a)  # the FX graph cache now holds it
        torch._dynamo.reset()
        with provenance.capture() as graphs:
            assert icfg.fx_graph_cache is False and fcfg.enable_autograd_cache is False
            torch.compile(fn)(a)
        assert icfg.fx_graph_cache is True and fcfg.enable_autograd_cache is True
    (g,) = graphs
    assert g.name.split()[1] == "inference", g.name  # "<compile id> inference #<n>": no autograd
    (c,) = g.calls
    assert c.kind == "cpp" and {"cos", "mul"} <= set(c.nodes)
    assert g.outputs == [c.writes[b] for b in c.writes]


def test_multi_output_extern_call_writes_each_element(tmp_path):
    """torch.sort falls back to aten (an extern call returning a tuple): the
    wrapper takes its elements out as buffers, each holding one getitem node."""
    import operator

    def fn(x):
        v, i = torch.sort(x * 2.0, dim=-1)
        return v.relu() + i.to(torch.float32)

    torch._dynamo.reset()
    with provenance.capture() as graphs:
        torch.compile(fn)(torch.randn(4, 16))
    (g,) = graphs
    by_name = {n.name: n for n in g.gm.graph.nodes}
    (sort,) = [c for c in g.calls if "sort" in c.kernel]
    assert sort.kind == "extern" and "sort" in sort.nodes
    held = [by_name[n] for n in sort.writes.values() if n is not None]
    assert len(held) == 2 and all(n.target is operator.getitem for n in held)
    assert sorted(n.args[1] for n in held) == [0, 1]
    readers = [c for c in g.calls if c.kind == "cpp" and set(c.args) & set(sort.writes)]
    assert readers  # the elements are what the next kernel reads


def test_source_line_takes_the_innermost_frame_outside_torch():
    tdir = os.path.dirname(torch.__file__)
    st = (f'  File "/home/u/model.py", line 7, in forward\n    y = self.fc(x)\n'
          f'  File "{tdir}/nn/modules/linear.py", line 134, in forward\n    return F.linear(input, self.weight)\n')
    assert provenance.source_line(st) == "/home/u/model.py:7 in forward: y = self.fc(x)"
    only_torch = f'  File "{tdir}/nn/modules/linear.py", line 134, in forward\n    return F.linear(x)\n'
    assert provenance.source_line(only_torch) == f"{tdir}/nn/modules/linear.py:134 in forward: return F.linear(x)"
    assert provenance.source_line("no frames here") is None and provenance.source_line(None) is None


def test_launch_detail_in_chromium_shows_provenance_as_text(captured, browser, tmp_path):  # noqa: F811
    """The report's launch detail lists what the launched kernel computes;
    a planted provenance entry holding markup is shown as text, no script runs."""
    from kdebug import report
    from test_report import _open
    from tracebytes import with_meta

    compiled, x, _ = captured
    with DebugMode() as dm:
        _step(compiled, x)
    data = kdebug.trace.save(dm, None)
    first = dm.kernels[0].kernel_name
    real = provenance.provenances(first)
    payload = '<img src=x onerror="window.__kdxss=1"><script>window.__kdxss=2</script>'
    evil = provenance.KernelProvenance("k", "cpp", (payload,), (payload,), {payload: payload}, payload, payload)
    path = tmp_path / "run.kdt"
    path.write_bytes(data)
    planted = tmp_path / "planted.kdt"
    saved = kdebug.load(str(path)).meta["kernel_provenance"]
    other = dm.kernels[-1].kernel_name
    assert other != first
    planted.write_bytes(with_meta(data, {"kernel_provenance": {**saved, other: [evil.to_json()]}}))
    for trace, name, want in ((path, first, real[0].nodes), (planted, other, (payload,))):
        out = tmp_path / (trace.stem + ".html")
        report.write_html(str(out), [str(trace)])
        page, problems, _ = _open(browser, out)
        i = page.evaluate(f"""() => {{ const r = RUNS[0]; for (let i = 0; i < r.n; i++)
            if (r.isLaunch(i) && STR[r.name[i]] === {name!r}) return i; return -1; }}""")
        assert i >= 0
        page.evaluate(f"document.getElementById('detail').innerHTML = describe(RUNS[0], {i})")
        text = page.inner_text("#detail")
        assert "computes" in text and ", ".join(want) in text, text
        assert page.evaluate("window.__kdxss === undefined") and not problems, problems


def test_a_provenance_failure_warns_and_the_compile_goes_on(monkeypatch):
    """kdebug.testing-style planted fault: reading one graph's provenance
    raises; the user's compile and its result are unchanged, a KdebugWarning
    says what happened."""
    from kdebug.inductor import KdebugWarning

    def broken(*a, **k):
        raise RuntimeError("planted")

    monkeypatch.setattr(provenance, "_graph_done", broken)
    before = provenance.errors
    torch._dynamo.reset()
    a = torch.randn(8)
    with provenance.capture() as graphs, pytest.warns(KdebugWarning, match="planted"):
        got = torch.compile(lambda t: t.exp() + 1)(a)
    assert graphs == [] and provenance.errors == before + 1
    torch.testing.assert_close(got, a.exp() + 1)  # computed (compiled exp may differ from eager by an ulp)


def test_graph_for_finds_each_compiled_graphs_record(captured):
    """Each compiled graph Inductor built inside capture() finds its record by
    the key of its generated module (what the accuracy check calls per graph call)."""
    from kdebug import _upstream

    _, _, graphs = captured
    assert all(g.cache_key for g in graphs) and len({g.cache_key for g in graphs}) == len(graphs)
    for g in graphs:
        mods = [m for m in _upstream.generated_modules()
                if getattr(m, "__file__", None) and g.cache_key in os.path.basename(m.__file__)]
        assert mods, g.name  # the key names the generated module's file
        calls_in_module = [name for name, _, _ in provenance.wrapper_calls(open(mods[0].__file__).read())]
        assert [c.kernel for c in g.calls] == [n for n in calls_in_module if n in {c.kernel for c in g.calls}]

    class Compiled:  # stands for CompiledFxGraph: only its cache_key is read
        def __init__(self, key):
            self.cache_key = key

    assert all(provenance.graph_for(Compiled(g.cache_key), graphs) is g for g in graphs)
    assert provenance.graph_for(Compiled("nope"), graphs) is None
    assert provenance.graph_for(Compiled(None), graphs) is None
