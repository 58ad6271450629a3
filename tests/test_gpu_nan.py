"""First NaN / inf on the GPU (issue 18 part 4): planted causes in real
Triton kernels, forward and backward, named from stats computed by kdebug's
CUDA hash kernel with no synchronization until the verdict is read.
Marked gpu: not run on the CPU machine."""
from __future__ import annotations

import pytest
import torch

import kdebug
from kdebug import DebugMode, _C
from kdebug.testing import wrong_lowering

pytestmark = pytest.mark.gpu
aten = torch.ops.aten


@pytest.fixture(autouse=True)
def _fresh():
    torch._dynamo.reset()
    kdebug.provenance.install()
    yield
    torch._dynamo.reset()


def _first(fn, args, backward=False, check="inputs"):
    def run():
        r = fn(*args)
        if backward:
            r.backward()
        return r

    run()
    torch.cuda.synchronize()
    with DebugMode(check_finite=check) as dm:
        out = run()
    return dm, dm.first_nonfinite(), out


def test_log_of_a_negative_value_triton():
    torch.manual_seed(0)
    x, w = torch.randn(64, 64, device="cuda"), torch.randn(64, 64, device="cuda")
    f = torch.compile(lambda x, w: torch.log(x @ w - 1.0).sum(-1))
    dm, rep, out = _first(f, (x, w), check=True)
    assert torch.isnan(out).any()
    assert rep.first is not None and rep.first.kind == "kernel" and "log" in rep.first.name, rep.summary()
    assert rep.first.name.startswith("triton_")
    assert "negative" in rep.first.hint and rep.first.unchecked_inputs == []


def test_fp16_exp_overflow_and_bf16_is_finite():
    x = torch.linspace(-4, 14, 4096, device="cuda").half()
    f = torch.compile(lambda x: torch.exp(x * 1.0) + 1)
    dm, rep, out = _first(f, (x,))
    assert torch.isinf(out).any()
    assert rep.first is not None and "exp" in rep.first.name and "65504" in rep.first.hint, rep.summary()
    assert sum(t.stats.posinf for t in rep.first.outputs) == int(torch.isinf(out).sum())
    torch._dynamo.reset()
    _, rep2, out2 = _first(f, (x.bfloat16(),))  # bf16's range holds exp(14)
    assert torch.isfinite(out2).all() and rep2.first is None, rep2.summary()


def test_sqrt_under_where_in_backward_triton():
    torch.manual_seed(0)
    x = torch.randn(4096, device="cuda", requires_grad=True)
    f = torch.compile(lambda x: torch.where(x > 0, torch.sqrt(x), torch.zeros_like(x)).sum())
    dm, rep, loss = _first(f, (x,), backward=True)
    assert torch.isfinite(loss) and torch.isnan(x.grad).any()
    assert rep.first is not None and "sqrt" in rep.first.name, rep.summary()
    ones = next(i for i, op in enumerate(dm.operators) if "ones_like" in str(getattr(op, "op", "")))
    assert rep.first.index > ones


def test_wrong_lowering_nan_above_triton():
    torch.manual_seed(0)
    lin = torch.nn.Linear(256, 256).cuda()
    x = torch.randn(64, 256, device="cuda") * 3
    with torch._inductor.config.patch(fx_graph_cache=False), wrong_lowering(aten.tanh.default, nan_above=0.5):
        f = torch.compile(lambda x: torch.tanh(lin(x)).relu() * 2)
        dm, rep, out = _first(f, (x,))
    assert torch.isnan(out).any()
    assert rep.first is not None and "tanh" in rep.first.name and rep.first.status == "origin", rep.summary()


def test_no_synchronization_until_the_verdict_is_read():
    torch.manual_seed(0)
    x, w = torch.randn(256, 256, device="cuda"), torch.randn(256, 256, device="cuda", requires_grad=True)
    f = torch.compile(lambda x, w: torch.log(x @ w - 1.0).mean())
    for _ in range(2):  # compile, and the variant dynamo may make under the mode
        with DebugMode(check_finite=True) as dm:
            f(x, w).backward()
        dm.first_nonfinite()
    torch.cuda.synchronize()
    syncs0 = _C.gpu_info()["syncs"]
    torch.cuda.set_sync_debug_mode("error")
    try:
        with DebugMode(check_finite=True) as dm:
            f(x, w).backward()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert _C.gpu_info()["syncs"] == syncs0
    rep = dm.first_nonfinite()  # reading: one synchronization
    assert _C.gpu_info()["syncs"] == syncs0 + 1
    assert rep.first is not None and "log" in rep.first.name, rep.summary()
