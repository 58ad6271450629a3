"""The accuracy check (Note [Accuracy check]): real Inductor C++ kernels,
culprits planted with kdebug.testing.wrong_lowering, whose true kernel is
known from the planted op."""
from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import kdebug
from kdebug import accuracy, numerics
from kdebug.testing import wrong_lowering

aten = torch.ops.aten
pytest_plugins = ["pytester"]


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(16, 32)
        self.b = torch.nn.Linear(32, 8)

    def forward(self, x):
        return self.b(torch.tanh(self.a(x)).relu() * 2)


class Block(torch.nn.Module):
    """linear, layer_norm, gelu, softmax: reductions and transcendental ops."""

    def __init__(self, dtype=torch.float32):
        super().__init__()
        self.lin = torch.nn.Linear(32, 64, dtype=dtype)
        self.ln = torch.nn.LayerNorm(64, dtype=dtype)

    def forward(self, x):
        return torch.softmax(torch.nn.functional.gelu(self.ln(self.lin(x))), dim=-1)


def _step(model, x):
    def run():
        model(x).sum().backward()
    return run


def _planted_op_in(kernel, name: str, via: tuple = ()) -> bool:
    # Inductor names a fused kernel after the aten ops it fuses (before
    # decomposition: softmax computes exp), independent of kdebug's verdict
    return (any(n in kernel.kernel for n in (name,) + via)
            or any(n.rstrip("0123456789").rstrip("_") == name for n in kernel.nodes))


def test_planted_tanh_lowering_is_the_culprit_forward_and_backward():
    torch.manual_seed(0)
    m, x = MLP(), torch.randn(8, 16)
    with wrong_lowering(aten.tanh.default, scale=1.001):
        cm = torch.compile(m)
        rep = accuracy.check(_step(cm, x))
    assert rep.graph_calls_checked == 2  # forward and backward
    c = rep.culprit
    assert c is not None, rep.summary()
    assert c.kind == "cpp" and _planted_op_in(c, "tanh"), rep.summary()
    # nothing before the culprit was worse, and something after inherited it
    first = rep.kernels.index(c)
    assert all(k.status in ("ok", "unchecked") for k in rep.kernels[:first])
    assert any(k.status == "inherited" for k in rep.kernels[first + 1:]), rep.summary()
    w = c.worst()
    assert w.diff.err_compiled > 4 * w.diff.err_eager
    # scale 1.001 on a value of order 1: about 1e-3 relative, far above float32's rounding
    assert 5e-4 < w.diff.max_rel < 2e-3
    assert "CULPRIT: " + c.kernel in rep.summary()


def test_planted_exp_inside_softmax_and_nan_are_named():
    torch.manual_seed(0)
    m, x = Block(), torch.randn(4, 32)
    with wrong_lowering(aten.exp.default, scale=1.0 + 1e-3):
        rep = accuracy.check(lambda: torch.compile(m)(x))
    c = rep.culprit
    assert c is not None and _planted_op_in(c, "exp", via=("softmax",)), rep.summary()

    torch.manual_seed(0)
    m2 = MLP()
    with wrong_lowering(aten.tanh.default, nan_above=0.5):
        rep = accuracy.check(lambda: torch.compile(m2)(torch.randn(8, 16)))
    c = rep.culprit
    assert c is not None and _planted_op_in(c, "tanh"), rep.summary()
    assert c.worst().diff.nonfinite_introduced > 0
    assert "NaN/Inf introduced" in rep.summary()


def test_a_model_within_tolerance_names_no_culprit():
    torch.manual_seed(0)
    m, x = Block(), torch.randn(4, 32)
    rep = accuracy.compare_eager(m, x)
    assert rep.culprit is None, rep.summary()
    assert rep.compared() >= 3
    assert rep.outputs and rep.outputs_within_tolerance(), rep.summary()
    assert "no kernel computes worse than eager" in rep.summary()


@pytest.mark.parametrize("emulate", [False, True])
def test_bf16_layer_norm_softmax_is_not_worse_than_eager(emulate):
    # bf16: compiled and eager differ (Inductor keeps float32 intermediates);
    # against float64 the compiled side is not worse, so no culprit
    torch.manual_seed(0)
    m, x = Block(torch.bfloat16), torch.randn(16, 32, dtype=torch.bfloat16)
    cfg = torch._inductor.config
    old = cfg.emulate_precision_casts
    cfg.emulate_precision_casts = emulate
    try:
        rep = accuracy.compare_eager(m, x)
    finally:
        cfg.emulate_precision_casts = old
    assert rep.culprit is None, rep.summary()
    assert rep.compared() >= 3
    assert all(o.diff is not None and o.diff.dtype == "bfloat16" for o in rep.outputs)


def test_nested_outputs_and_a_graph_break():
    torch.manual_seed(0)
    lin = torch.nn.Linear(8, 8)

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = lin

        def forward(self, x):
            h = torch.tanh(self.lin(x))
            torch._dynamo.graph_break()
            return {"h": h, "pair": (h.sum(), [torch.sigmoid(h) * 3])}

    with wrong_lowering(aten.sigmoid.default, scale=1.01):
        rep = accuracy.compare_eager(M(), torch.randn(4, 8))
    assert rep.graphs >= 2
    paths = sorted(o.path for o in rep.outputs)
    assert paths == ["output['h']", "output['pair'][0]", "output['pair'][1][0]"]
    bad = [o for o in rep.outputs if not o.diff.within_tolerance]
    assert [o.path for o in bad] == ["output['pair'][1][0]"]
    assert rep.culprit is not None and _planted_op_in(rep.culprit, "sigmoid"), rep.summary()


def test_random_nodes_are_not_compared():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Dropout(0.5), torch.nn.Linear(16, 4))
    m.train()
    rep = accuracy.check(_step(torch.compile(m), torch.randn(4, 8)))
    assert rep.culprit is None, rep.summary()
    reasons = {b.why_not for k in rep.kernels for b in k.buffers if b.diff is None}
    assert any(r and "random" in r for r in reasons), rep.summary()


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="factor"):
        accuracy.check(lambda: None, factor=0.5)
    with pytest.raises(ValueError, match="calls_per_graph"):
        accuracy.check(lambda: None, calls_per_graph=0)
    # a negative or NaN tolerance put every element outside it ("100% outside rtol=-1") and was taken
    for bad in (-1, float("nan"), float("inf"), "1e-3", True):
        with pytest.raises(ValueError, match="rtol must be None or a finite number >= 0"):
            accuracy.check(lambda: None, rtol=bad)
        with pytest.raises(ValueError, match="atol must be None or a finite number >= 0"):
            kdebug.compare_eager(torch.sin, torch.randn(3), atol=bad)
    with pytest.raises(ValueError, match="reference"):
        kdebug.compare_eager(torch.sin, torch.randn(3), reference="float32")


# ---------------------------------------------------------------- numerics


def test_difference_known_answers():
    c = torch.tensor([1.0, 2.0])
    e = torch.tensor([1.0, 2.5])
    d = numerics.difference(c, e, e.double())
    assert d.max_abs == 0.5 and d.mismatch_pct == 50.0
    assert math.isclose(d.max_rel, 0.2)
    assert math.isclose(d.rmse, math.sqrt(0.25 / 2))
    assert d.err_eager == 0.0 and math.isclose(d.err_compiled, math.sqrt(0.25 / 2))
    assert d.worst_index == (1,) and d.worst_values == (2.0, 2.5, 2.5)
    assert d.worse(4.0)

    one = torch.tensor([1.0])
    assert numerics.difference(torch.nextafter(one, torch.tensor([2.0])), one).max_ulp == 1
    tiny = torch.tensor([torch.finfo(torch.float32).smallest_normal]) * 2.0 ** -23  # smallest subnormal
    assert numerics.difference(-tiny, tiny).max_ulp == 2
    b = torch.tensor([1.0], dtype=torch.bfloat16)
    assert numerics.difference(b + 2.0 ** -7, b).max_ulp == 1  # bf16 has 7 fraction bits

    # eager exact, compiled off by less than the float32 rounding floor: not worse
    r = torch.tensor([3.0], dtype=torch.float64) + 1e-9
    d = numerics.difference(torch.tensor([3.0]), torch.tensor([3.0]), r)
    assert not d.worse(4.0)

    nan = numerics.difference(torch.tensor([float("nan"), 1.0]), torch.tensor([0.0, 1.0]),
                              torch.tensor([0.0, 1.0], dtype=torch.float64))
    assert nan.nonfinite_introduced == 1 and nan.worse(4.0) and not nan.within_tolerance
    assert numerics.tolerances(torch.bfloat16) == (1.6e-2, 1e-5)
    assert numerics.tolerances(torch.int64) == (0.0, 0.0)


# ---------------------------------------------------------------- CLI and pytest

SCRIPT = """
import torch
from kdebug.testing import wrong_lowering
torch.manual_seed(0)
m = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
x = torch.randn(8, 16)
with wrong_lowering(torch.ops.aten.tanh.default, scale={scale}):
    f = torch.compile(m)
    for _ in range(2):
        f(x).sum().backward()
"""


def _cli(tmp_path, scale, *extra):
    script = tmp_path / "prog.py"
    script.write_text(SCRIPT.format(scale=scale))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-m", "kdebug", "accuracy", *extra, str(script)],
                          capture_output=True, text=True, env=env, timeout=600)


def test_cli_names_the_planted_kernel_and_passes_a_clean_script(tmp_path):
    bad = _cli(tmp_path, 1.001, "--json", str(tmp_path / "v.json"))
    assert bad.returncode == 1, bad.stdout + bad.stderr
    line = next(ln for ln in bad.stdout.splitlines() if ln.startswith("CULPRIT: "))
    assert "tanh" in line
    assert "2 graph call(s) checked (2 more run, not checked)" in bad.stdout
    import json

    v = json.loads((tmp_path / "v.json").read_text())
    assert "tanh" in v["culprit"]["kernel"]
    good = _cli(tmp_path, 1.0)
    assert good.returncode == 0, good.stdout + good.stderr
    assert "CULPRIT" not in good.stdout
    missing = subprocess.run([sys.executable, "-m", "kdebug", "accuracy", str(tmp_path / "nope.py")],
                             capture_output=True, text=True)
    assert missing.returncode == 2 and "no such script" in missing.stderr


PYTEST_FILE = """
import pytest, torch
from kdebug.testing import wrong_lowering

def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh())

@pytest.mark.kdebug_matches_eager(rtol=1e-4, atol=1e-5)
def test_marker_clean():
    torch.compile(model())(torch.randn(4, 8))

@pytest.mark.kdebug_matches_eager()
def test_marker_planted():
    with wrong_lowering(torch.ops.aten.tanh.default, scale=1.001):
        torch.compile(model())(torch.randn(4, 8))

def test_fixture_clean(kdebug_accuracy):
    kdebug_accuracy.check(model(), torch.randn(4, 8), rtol=1e-4, atol=1e-5)
"""


def test_pytest_marker_and_fixture(pytester):
    pytester.makepyfile(test_acc=PYTEST_FILE)
    res = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rA")
    res.assert_outcomes(passed=2, failed=1)
    out = res.stdout.str()
    assert "test_marker_planted" in out and "a compiled kernel computes worse than eager" in out
    assert "CULPRIT: " in out and "tanh" in out
    assert "PASSED test_acc.py::test_marker_clean" in out and "PASSED test_acc.py::test_fixture_clean" in out
    assert "kdebug accuracy" in out  # the report section of the failure


# ---------------------------------------------------------------- HTML


def test_html_page_shows_source_heatmap_and_escapes(tmp_path):
    torch.manual_seed(0)
    m, x = MLP(), torch.randn(8, 16)
    with wrong_lowering(aten.tanh.default, scale=1.001):
        rep = accuracy.check(lambda: torch.compile(m)(x))
    c = rep.culprit
    assert c is not None and c.code is not None and "tanh" in c.code  # the generated C++ source
    w = c.worst()
    assert w.diff.heatmap is not None and len(w.diff.heatmap) == 8 and len(w.diff.heatmap[0]) == 32
    path = tmp_path / "acc.html"
    rep.write_html(str(path))
    page = path.read_text()
    assert "Culprit" in page and c.kernel in page and "<svg" in page and page.count("<rect") == 8 * 32
    # hostile text from a program never reaches the page unescaped
    evil = "<script>window.x=1</script>"
    c.kernel, c.nodes, c.source, c.code = evil, (evil,), (evil,), evil
    w.buffer = w.node = evil
    page = kdebug.accuracy_html.render(rep, title=evil)
    assert "<script>" not in page and "&lt;script&gt;" in page
    link = tmp_path / "link.html"
    link.symlink_to(tmp_path / "elsewhere.html")
    with pytest.raises(Exception, match="link"):
        rep.write_html(str(link))
    assert not (tmp_path / "elsewhere.html").exists()


def test_graphs_that_bypass_python_are_reported_not_judged():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh())
    with pytest.warns(kdebug.KdebugWarning):
        rep = accuracy.check(lambda: torch.compile(m, options={"cpp_wrapper": True})(torch.randn(4, 8)))
    assert rep.graph_calls_checked == 0 and rep.graph_calls_unchecked == 1
    text = rep.summary()
    assert "NOTHING CHECKED" in text and "cpp_wrapper" in text
    assert "no kernel computes worse" not in text


def test_reference_runs_that_run_out_of_device_memory_run_on_the_host(monkeypatch):
    # planted: the first reference run on the "device" raises OutOfMemoryError
    # (CPU here: the inputs count as on a device through the patched check)
    from kdebug import reference

    real = reference.run_graph
    calls = []

    def oom_once(gm, inputs, keep, float64=False, host=False, given=None, place=None):
        calls.append(host)
        if not host and len(calls) == 1:
            raise torch.OutOfMemoryError("planted")
        return real(gm, inputs, keep, float64=float64, host=host, given=given, place=place)

    monkeypatch.setattr(reference, "run_graph", oom_once)
    monkeypatch.setattr(accuracy, "_on_device", lambda xs: True)
    torch.manual_seed(0)
    m, x = MLP(), torch.randn(8, 16)
    with wrong_lowering(aten.tanh.default, scale=1.001):
        rep = accuracy.check(lambda: torch.compile(m)(x))
    # eager and float64 on the host, then (a kernel looked worse) the two
    # local reference runs (Note [Local reference]) on the host too
    assert calls == [False, True, True, True, True]
    assert any("ran on the host" in n for n in rep.notes)
    assert rep.culprit is not None and _planted_op_in(rep.culprit, "tanh"), rep.summary()


def _f32_only_pair():
    """kdebug_test_acc::f32_pair(x) -> (2x, x+1): a custom op with two outputs
    that refuses float64, as the H100's memory-efficient attention does."""
    try:
        return torch.ops.kdebug_test_acc.f32_pair.default
    except (AttributeError, RuntimeError):
        pass

    @torch.library.custom_op("kdebug_test_acc::f32_pair", mutates_args=(), schema="(Tensor x) -> (Tensor, Tensor)")
    def f32_pair(x):
        if x.dtype == torch.float64:
            raise RuntimeError("Only fp32, half & bf16 supported at the moment")
        return x * 2, x + 1

    @f32_pair.register_fake
    def _(x):
        return torch.empty_like(x), torch.empty_like(x)

    return torch.ops.kdebug_test_acc.f32_pair.default


def test_a_multi_output_op_that_refuses_float64_runs_in_its_own_dtype():
    """The float64 run falls back to each argument's own dtype for an op that
    refuses float64, also when the op has several outputs (no single dtype of
    its own); the rest of the graph is still checked, and a planted culprit
    after the op is still named."""
    op = _f32_only_pair()
    torch.manual_seed(0)
    x = torch.randn(64, 32)

    def f(x):
        a, b = op(torch.tanh(x))
        return torch.exp(a - b).sum(-1)

    rep = accuracy.check(lambda: torch.compile(f)(x))
    assert not any("stopped at node" in n for n in rep.notes), rep.summary()
    assert rep.culprit is None, rep.summary()
    assert rep.compared() >= 1, rep.summary()
    with wrong_lowering(aten.exp.default, scale=1.001):
        rep = accuracy.check(lambda: torch.compile(f)(x))
    assert not any("stopped at node" in n for n in rep.notes), rep.summary()
    assert rep.culprit is not None and "exp" in rep.culprit.kernel, rep.summary()


def test_a_max_is_not_said_to_sum_in_another_order():
    """A max or min gives the same result in any order of its elements: its
    hint points at what it reads (an adversarial pass found a softmax's amax
    flagged as summing in another order); a sum beside it keeps the sum hint."""
    from types import SimpleNamespace

    from kdebug.accuracy_text import hints

    only_max = " ".join(hints(SimpleNamespace(nodes=["amax", "sub_1", "exp"]), None))
    assert "does not depend on the order" in only_max and "sums in another order" not in only_max
    with_sum = " ".join(hints(SimpleNamespace(nodes=["amax", "exp", "sum_2"]), None))
    assert "a reduction (sum)" in with_sum and "does not depend on the order" not in with_sum
