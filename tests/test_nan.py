"""First NaN / inf (issue 18 part 4, Note [First non-finite value]): planted
causes in real torch.compile'd CPU kernels, forward and backward; the
expected culprit is the kernel computing the planted op (Inductor names
kernels after the aten ops they fuse)."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
import torch

import kdebug
from kdebug import DebugMode
from kdebug.testing import wrong_lowering

aten = torch.ops.aten


@pytest.fixture(autouse=True)
def _fresh():
    torch._dynamo.reset()
    kdebug.provenance.install()
    yield
    torch._dynamo.reset()


def _verdict(fn, *args, check_finite=True, backward=False):
    with DebugMode(check_finite=check_finite) as dm:
        out = fn(*args)
        if backward:
            out.backward()
    return dm, dm.first_nonfinite(), out


def _index_of_op(dm, name):
    return next(i for i, op in enumerate(dm.operators) if name in str(getattr(op, "op", "")))


def test_wrong_lowering_nan_above_names_the_tanh_kernel():
    torch.manual_seed(0)
    lin = torch.nn.Linear(16, 16)
    x = torch.randn(8, 16) * 3
    with torch._inductor.config.patch(fx_graph_cache=False), wrong_lowering(aten.tanh.default, nan_above=0.5):
        f = torch.compile(lambda x: torch.tanh(lin(x)).relu() * 2)
        f(x)
        dm, rep, out = _verdict(f, x)
    assert torch.isnan(out).any()  # the planted fault happened
    first = rep.first
    assert first is not None and first.kind == "kernel" and "tanh" in first.name, rep.summary()
    assert first.status == "origin"
    assert sum(t.stats.nan for t in first.outputs) == int(torch.isnan(out).sum())
    # the addmm it read was finite and recorded
    assert all(t.stats is not None and not t.nonfinite for t in first.inputs if "before" in t.where
               or "written" in t.where)


def test_log_of_a_negative_value_forward():
    torch.manual_seed(0)
    x, w = torch.randn(8, 8), torch.randn(8, 8)
    f = torch.compile(lambda x, w: (torch.log(x @ w - 1.0) * 2).sum(-1))
    f(x, w)
    dm, rep, out = _verdict(f, x, w)
    assert torch.isnan(out).any() and torch.isnan(torch.log(x @ w - 1.0)).any()
    first = rep.first
    assert first is not None and "log" in first.name, rep.summary()
    assert "log" in first.hint and "negative" in first.hint
    # its input is the mm's output: recorded, finite, so the verdict is definite even without --inputs
    assert first.unchecked_inputs == []
    mm = _index_of_op(dm, "mm")
    assert first.index > mm
    # the user's source line of the log
    assert any("torch.log" in s for s in first.source), first.source
    assert any("log" in c for c in first.code_lines), first.code_lines


def test_zero_by_zero_division():
    x = torch.rand(6, 5) + 0.1
    x[2] = 0.0  # a row of zeros: its normalization is 0/0
    f = torch.compile(lambda x: (x * 2) / (x * 2).sum(-1, keepdim=True))
    f(x)
    dm, rep, out = _verdict(f, x, check_finite="inputs")
    assert torch.isnan(out[2]).all() and torch.isfinite(out[[0, 1, 3, 4, 5]]).all()
    first = rep.first
    assert first is not None and "div" in first.name, rep.summary()
    assert sum(t.stats.nan for t in first.outputs) == 5
    assert "division by zero" in first.hint
    assert not rep.entered and first.unchecked_inputs == []  # x checked before the launch: finite


def test_fp16_overflow_of_exp():
    x = torch.linspace(-4, 14, 64).to(torch.float16).view(8, 8)  # exp(>11.1) > 65504
    f = torch.compile(lambda x: torch.exp(x * 1.0) + 1)
    f(x)
    dm, rep, out = _verdict(f, x, check_finite="inputs")
    assert out.dtype == torch.float16 and torch.isinf(out).any()
    first = rep.first
    assert first is not None and "exp" in first.name, rep.summary()
    assert sum(t.stats.posinf for t in first.outputs) == int(torch.isinf(out).sum())
    assert first.outputs[0].dtype == "float16"
    assert "overflow" in first.hint and "65504" in first.hint
    assert first.max_finite_input == 14.0  # x's largest magnitude, shown
    assert "14" in first.hint


def test_sqrt_of_a_negative_value_in_backward():
    # the where-gradient trap: forward masks sqrt of negatives away, backward's
    # d sqrt(x) = 0.5 / sqrt(x) is NaN there, and NaN * 0 stays NaN
    torch.manual_seed(0)
    x = torch.randn(32, requires_grad=True)
    f = torch.compile(lambda x: torch.where(x > 0, torch.sqrt(x), torch.zeros_like(x)).sum())
    f(x).backward()
    x.grad = None
    dm, rep, loss = _verdict(f, x, backward=True)
    assert torch.isfinite(loss) and torch.isnan(x.grad).any()
    first = rep.first
    assert first is not None and first.kind == "kernel" and "sqrt" in first.name, rep.summary()
    assert first.index > _index_of_op(dm, "ones_like")  # after autograd seeded the backward
    assert "negative" in first.hint


def test_eager_aten_op_is_named():
    t = torch.tensor([1.0, -2.0, 3.0])
    with DebugMode(check_finite="inputs") as dm:
        u = t * 2
        v = torch.sqrt(u)
        v + 1
    rep = dm.first_nonfinite()
    assert rep.first is not None and rep.first.kind == "aten" and "sqrt" in rep.first.name, rep.summary()
    assert rep.inherited == 1  # the add read the NaN
    assert rep.first.inputs[0].stats.absmax == 6.0


def test_nan_from_outside_the_recording_is_told_apart_with_inputs():
    x = torch.randn(4, 4)
    x[1, 1] = math.nan
    f = torch.compile(lambda x: torch.relu(x) * 3)
    f(x)
    _, rep, _ = _verdict(f, x, check_finite="inputs")
    assert rep.first is None and rep.entered, rep.summary()
    assert "ENTERED FROM OUTSIDE" in rep.summary()
    # without input stats it cannot tell: it names the kernel and says its input was not checked
    _, rep2, _ = _verdict(f, x, check_finite=True)
    assert rep2.first is not None and rep2.first.unchecked_inputs, rep2.summary()
    assert "not checked" in rep2.summary()


def test_clean_run_names_nothing():
    torch.manual_seed(0)
    m = torch.nn.Linear(8, 8)
    f = torch.compile(lambda x: torch.log(m(x).exp() + 1).sum())
    x = torch.randn(4, 8)
    f(x).backward()
    _, rep, _ = _verdict(f, x, backward=True)
    assert rep.clean and rep.first is None and rep.steps > 0
    assert "no recorded step wrote NaN or inf" in rep.summary()


def test_check_finite_flag_is_validated():
    with pytest.raises(ValueError, match="check_finite"):
        DebugMode(check_finite="yes")
    with pytest.raises(ValueError, match="check_finite"):
        DebugMode(check_finite=2)


SCRIPT = """
import torch
x = torch.randn(16, 16)
w = torch.randn(16, 16, requires_grad=True)
f = torch.compile(lambda x, w: torch.log(x @ w - 2.0).mean(0).sum() + torch.log(w.abs() + 1).sum())
f(x, w).backward()
print("script done")
"""


def test_cli(tmp_path):
    script = tmp_path / "prog.py"
    script.write_text(SCRIPT)
    out = tmp_path / "v.json"
    env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(os.path.abspath(__file__)))}
    p = subprocess.run([sys.executable, "-m", "kdebug", "nan", "--json", str(out), str(script)],
                       capture_output=True, text=True, env=env, timeout=600)
    assert p.returncode == 1, p.stdout + p.stderr
    assert "script done" in p.stdout
    v = json.loads(out.read_text())
    assert v["first"] is not None and "log" in v["first"]["name"] and v["first"]["status"] == "origin"
    assert any("torch.log" in s for s in v["first"]["source"])
    p2 = subprocess.run([sys.executable, "-m", "kdebug", "nan", str(tmp_path / "missing.py")],
                        capture_output=True, text=True, env=env, timeout=120)
    assert p2.returncode == 2 and "no such script" in p2.stderr


def test_verdict_from_a_trace_file(tmp_path):
    torch.manual_seed(0)
    x, w = torch.randn(8, 8), torch.randn(8, 8)
    f = torch.compile(lambda x, w: (torch.log(x @ w - 1.0) * 2).sum(-1))
    f(x, w)
    path = tmp_path / "run.kdt"
    with DebugMode(check_finite=True, trace=str(path)) as dm:
        f(x, w)
    live = dm.first_nonfinite()
    rep = kdebug.finite.check(str(path))
    assert rep.first is not None and live.first is not None
    assert (rep.first.index, rep.first.name) == (live.first.index, live.first.name)
    assert [t.stats for t in rep.first.outputs] == [t.stats for t in live.first.outputs]
    assert "log" in rep.first.name


def test_a_recording_without_stats_is_a_clear_error():
    f = torch.compile(lambda x: torch.log(x))
    x = torch.randn(8)
    f(x)
    with DebugMode() as dm, DebugMode.log_tensor_hashes("bitwise"):
        f(x)
    with pytest.raises(ValueError, match="check_finite=True"):
        dm.first_nonfinite()
