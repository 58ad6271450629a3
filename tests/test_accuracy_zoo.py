"""The accuracy check (Note [Accuracy check]) on models a user would try:
real Inductor C++ kernels, CPU only.  Each case is either clean (no culprit
may be named, and something must have been compared) or has one op lowered
wrongly with kdebug.testing.wrong_lowering, so the kernel that must be named
is known independently of the check: the one computing that op."""
from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from kdebug import accuracy, numerics
from kdebug.testing import wrong_lowering

aten = torch.ops.aten


def _computes(kernel, op: str, via: tuple = ()) -> bool:
    # Inductor names a fused kernel after the aten ops it fuses; the FX node
    # names are the op's name plus a counter
    return (any(n in kernel.kernel for n in (op,) + via)
            or any(n.rstrip("0123456789").rstrip("_") == op for n in kernel.nodes))


def _clean(rep, at_least: int = 1):
    assert rep.culprit is None, rep.summary()
    assert rep.compared() >= at_least, rep.summary()
    assert "no kernel computes worse than eager" in rep.summary()


def _planted(rep, op, via=()):
    c = rep.culprit
    assert c is not None, rep.summary()
    assert _computes(c, op, via), rep.summary()
    first = rep.kernels.index(c)
    assert all(k.status in ("ok", "unchecked") for k in rep.kernels[:first]), rep.summary()


def _written_inputs(rep, prefix="copy_"):
    """Buffer checks of graph inputs updated in place (their node is the copy_ the graph ends with)."""
    return [b for k in rep.kernels for b in k.buffers if b.node and b.node.startswith(prefix)]


# ------------------------------------------------------------- mutation


def test_conv_batchnorm_train_mode_compares_running_stats_and_names_planted_relu():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU()).train()
    x = torch.randn(2, 3, 10, 10)
    rep = accuracy.check(lambda: torch.compile(m)(x).sum().backward())
    _clean(rep, at_least=5)
    # running_mean / running_var / num_batches_tracked: graph inputs the kernel updates in place
    stats = _written_inputs(rep)
    assert len(stats) >= 2 and all(b.diff is not None for b in stats), rep.summary()

    m2 = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU()).train()
    with wrong_lowering(aten.relu.default, scale=1.01):
        rep = accuracy.check(lambda: torch.compile(m2)(x).sum().backward())
    _planted(rep, "relu")


@pytest.mark.parametrize("seed", [1, 2])
def test_cnn_training_step_with_two_batchnorms_is_clean(seed):
    # seed 1: convolution_backward is the aten op eager runs too; its inputs
    # (from the batch-norm backward kernel) are within tolerance of eager's
    # but not equal, and its 1568-term sums amplify that: judged on the
    # inputs it got (Note [Local reference]) it computes as eager would.
    # seed 2: batch norm's backward sums 8192 gradient terms that cancel to
    # a result far smaller than the terms (Note [Accumulation floor])
    torch.manual_seed(seed)
    cnn = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
                        nn.Conv2d(16, 32, 3), nn.BatchNorm2d(32), nn.GELU(), nn.AdaptiveAvgPool2d(1),
                        nn.Flatten(), nn.Linear(32, 10))
    x, y = torch.randn(8, 3, 32, 32), torch.randint(0, 10, (8,))
    rep = accuracy.check(lambda: F.cross_entropy(torch.compile(cnn)(x), y).backward())
    externs = [k for k in rep.kernels if k.kind == "extern" and any(b.diff is not None for b in k.buffers)]
    assert any("convolution_backward" in k.kernel for k in externs), rep.summary()
    assert all(k.status != "worse" for k in externs), rep.summary()
    _clean(rep, at_least=20)


def test_compiled_optimizer_step_writes_its_inputs_and_they_are_compared():
    torch.manual_seed(0)
    m = nn.Linear(16, 16)
    m(torch.randn(4, 16)).sum().backward()
    opt = torch.optim.Adam(m.parameters(), lr=1e-2)
    rep = accuracy.check(lambda: torch.compile(opt.step)())
    # params, exp_avg, exp_avg_sq, step: all written in place by the graph
    written = _written_inputs(rep)
    assert len(written) == 8 and all(b.diff is not None for b in written), rep.summary()
    _clean(rep, at_least=8)

    m2 = nn.Linear(16, 16)
    m2(torch.randn(4, 16)).sum().backward()
    opt2 = torch.optim.Adam(m2.parameters(), lr=1e-2)
    with wrong_lowering(aten.reciprocal.default, scale=1.5):
        rep = accuracy.check(lambda: torch.compile(opt2.step)())
    _planted(rep, "reciprocal")


def test_embedding_scatter_add_index_add_with_int64_indices():
    # a kernel fills the scatter target with zeros, an in-place fallback adds
    # into it afterwards: the zeros are not the scatter_add's value
    torch.manual_seed(0)
    emb = nn.Embedding(50, 16)
    idx = torch.randint(0, 50, (4, 7))

    def f(idx):
        h = emb(idx)
        g = torch.gather(h, 1, idx[..., None].expand(-1, -1, 16) % 7)
        out = torch.zeros(10, 16).scatter_add(0, (idx % 10).reshape(-1, 1).expand(-1, 16), h.reshape(-1, 16))
        ia = torch.zeros(10, 16).index_add(0, (idx % 10).reshape(-1), torch.sigmoid(h.reshape(-1, 16)))
        return g.sum(-1), out, ia

    rep = accuracy.check(lambda: torch.compile(f)(idx))
    _clean(rep, at_least=4)
    scatter = [b for k in rep.kernels for b in k.buffers if b.node == "scatter_add"]
    assert scatter and all(b.diff is not None for b in scatter), rep.summary()
    with wrong_lowering(aten.sigmoid.default, scale=1.01):
        rep = accuracy.check(lambda: torch.compile(f)(idx))
    _planted(rep, "sigmoid")


# ------------------------------------------------------------- shapes and outputs


def test_dynamic_shapes():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))

    def run():
        cm = torch.compile(m, dynamic=True)
        cm(torch.randn(5, 8))
        cm(torch.randn(7, 8))

    rep = accuracy.check(run, calls_per_graph=2)  # one graph (SymInt batch), both shapes checked
    assert rep.graph_calls_checked == 2
    _clean(rep, at_least=4)
    with wrong_lowering(aten.tanh.default, scale=1.01):
        rep = accuracy.check(run)
    _planted(rep, "tanh")


def test_integer_bool_and_view_outputs():
    torch.manual_seed(0)
    x = torch.randn(8, 32)

    def f(x):
        y = torch.sigmoid(x)
        return y.argmax(-1), torch.topk(y, 3, -1), y > 0.5, y.t(), y.reshape(4, 64), y[:, 1:5]

    rep = accuracy.check(lambda: torch.compile(f)(x))
    _clean(rep, at_least=4)
    dtypes = {b.diff.dtype for k in rep.kernels for b in k.buffers if b.diff is not None}
    assert {"int64", "bool", "float32"} <= dtypes, rep.summary()
    # topk returns two tensors: both are compared
    topk = [k for k in rep.kernels if "topk" in k.kernel]
    assert topk and sum(b.diff is not None for b in topk[0].buffers) == 2, rep.summary()
    with wrong_lowering(aten.sigmoid.default, scale=1.01):
        rep = accuracy.check(lambda: torch.compile(f)(x))
    _planted(rep, "sigmoid")


def test_cumsum_after_planted_tanh():
    torch.manual_seed(0)
    x = torch.randn(4, 1000)
    f = lambda x: torch.cumsum(torch.tanh(x), -1)  # noqa: E731
    _clean(accuracy.check(lambda: torch.compile(f)(x)), at_least=2)
    with wrong_lowering(aten.tanh.default, scale=1.01):
        rep = accuracy.check(lambda: torch.compile(f)(x))
    _planted(rep, "tanh")


def test_multiple_graph_breaks_name_the_kernel_in_the_last_graph():
    def f(x):
        x = torch.tanh(x)
        torch._dynamo.graph_break()
        x = torch.sigmoid(x) * 2
        torch._dynamo.graph_break()
        return torch.exp(x)

    x = torch.randn(8, 8)
    with wrong_lowering(aten.exp.default, scale=1.01):
        rep = accuracy.check(lambda: torch.compile(f)(x))
    assert rep.graphs == 3 and rep.graph_calls_checked == 3
    _planted(rep, "exp")


@dataclasses.dataclass
class _Out:
    a: torch.Tensor
    b: dict


def test_dataclass_and_dict_output():
    torch.manual_seed(0)

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.m = nn.Linear(8, 8)

        def forward(self, x):
            h = self.m(x)
            return _Out(torch.tanh(h), {"s": torch.sigmoid(h), "n": h.norm()})

    m, x = M(), torch.randn(4, 8)
    rep = accuracy.compare_eager(m, x)
    _clean(rep)
    assert sorted(o.path for o in rep.outputs) == ["output.a", "output.b['n']", "output.b['s']"]
    assert rep.outputs_within_tolerance()
    with wrong_lowering(aten.sigmoid.default, scale=1.01):
        rep = accuracy.compare_eager(m, x)
    _planted(rep, "sigmoid")
    assert [o.path for o in rep.outputs if not o.diff.within_tolerance] == ["output.b['s']"]


# ------------------------------------------------------------- precision


def test_large_reductions_are_not_a_false_culprit_and_a_planted_exp_still_is():
    # 1e6-element sums in another order than eager's (vectorized, split):
    # both sides round differently, neither is wrong
    torch.manual_seed(0)
    x = torch.randn(1_000_000) + 3.0
    x2 = torch.randn(1000, 1000)

    def f(x, x2):
        return x.sum(), x.mean(), (x * x).sum(), x.var(), x2.sum(0), x2.sum(1), torch.softmax(x2, 0)

    _clean(accuracy.check(lambda: torch.compile(f)(x, x2)), at_least=6)
    # the raised floor must not hide a real 0.1% error in a 1000-term softmax
    g = lambda x2: torch.softmax(x2, 0)  # noqa: E731
    with wrong_lowering(aten.exp.default, scale=1.001):
        rep = accuracy.check(lambda: torch.compile(g)(x2))
    _planted(rep, "exp", via=("softmax",))


def test_causal_masked_softmax_with_minus_inf():
    def f(q, k):
        s = q @ k.transpose(-1, -2) / 4.0
        mask = torch.triu(torch.ones(s.shape[-1], s.shape[-1], dtype=torch.bool), 1)
        return torch.softmax(s.masked_fill(mask, float("-inf")), -1)

    torch.manual_seed(0)
    q, k = torch.randn(2, 8, 16), torch.randn(2, 8, 16)
    _clean(accuracy.check(lambda: torch.compile(f)(q, k)), at_least=2)
    with wrong_lowering(aten.exp.default, scale=1.001):
        rep = accuracy.check(lambda: torch.compile(f)(q, k))
    _planted(rep, "exp", via=("softmax",))


def test_autocast_bf16_on_cpu():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 8))
    x = torch.randn(8, 32)

    def run():
        with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
            torch.compile(m)(x)

    _clean(accuracy.check(run), at_least=3)
    with wrong_lowering(aten.erf.default, scale=1.05):
        rep = accuracy.check(run)
    _planted(rep, "erf", via=("gelu",))


def test_fp16_on_cpu():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(16, 32), nn.LayerNorm(32), nn.Tanh()).half()
    x = torch.randn(4, 16, dtype=torch.half)
    _clean(accuracy.compare_eager(m, x), at_least=2)
    with wrong_lowering(aten.tanh.default, scale=1.05):
        rep = accuracy.compare_eager(m, x)
    _planted(rep, "tanh")


def test_cross_entropy_with_ignore_index_forward_and_backward():
    torch.manual_seed(0)
    lin = nn.Linear(16, 10)
    x, y = torch.randn(8, 16), torch.randint(0, 10, (8,))
    y[2] = y[5] = -100
    loss = lambda x, y: F.cross_entropy(lin(x), y, ignore_index=-100)  # noqa: E731
    rep = accuracy.check(lambda: torch.compile(loss)(x, y).backward())
    assert rep.graph_calls_checked == 2
    _clean(rep, at_least=4)


class _GPTBlock(nn.Module):
    def __init__(self, d=32, h=4):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.h = h

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = (t.view(B, T, self.h, C // self.h).transpose(1, 2) for t in self.qkv(self.ln1(x)).split(C, -1))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(B, T, C))
        return x + self.fc2(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


@pytest.mark.parametrize("mode", [None, "max-autotune-no-cudagraphs"])
def test_gpt_block_forward_backward(mode):
    torch.manual_seed(0)
    m, x = _GPTBlock(), torch.randn(2, 8, 32)
    step = lambda: torch.compile(m, mode=mode)(x).pow(2).mean().backward()  # noqa: E731
    rep = accuracy.check(step)
    assert rep.graph_calls_checked == 2
    _clean(rep, at_least=20)
    # the attention extern call returns a tuple: its output is compared
    sdpa = [b for k in rep.kernels if "scaled_dot_product" in k.kernel for b in k.buffers if b.diff is not None]
    assert sdpa, rep.summary()
    with wrong_lowering(aten.tanh.default, scale=1.01):
        rep = accuracy.check(step)
    _planted(rep, "tanh", via=("gelu",))


def test_exactly_equal_output():
    rep = accuracy.compare_eager(lambda x: (x * 2 + 1).relu(), torch.randn(16, 16))
    _clean(rep)
    assert all(b.diff.max_abs == 0.0 for k in rep.kernels for b in k.buffers if b.diff is not None)
    assert all(o.diff.max_abs == 0.0 for o in rep.outputs)


# ------------------------------------------------------------- hostile input


def test_a_program_that_raises_midway_and_one_that_compiles_nothing():
    def boom():
        torch.compile(torch.tanh)(torch.randn(4))
        raise KeyError("boom")

    with pytest.raises(KeyError, match="boom"):
        accuracy.check(boom)
    # the check stopped: another one runs
    _clean(accuracy.check(lambda: torch.compile(torch.tanh)(torch.randn(4))))
    rep = accuracy.check(lambda: torch.tanh(torch.randn(4)))
    assert rep.compared() == 0 and rep.culprit is None
    assert "NOTHING CHECKED" in rep.summary() and "no kernel computes worse" not in rep.summary()
    # a graph that runs but computes only random numbers (never compared): not a pass either
    rep = accuracy.check(lambda: torch.compile(lambda x: torch.rand_like(x) * 2)(torch.randn(4)))
    assert rep.graph_calls_checked == 1 and rep.compared() == 0 and rep.culprit is None
    assert "NOTHING COMPARED" in rep.summary() and "no kernel computes worse" not in rep.summary()
    from kdebug.pytest_plugin import _accuracy_failure

    assert "no buffer" in _accuracy_failure(rep, False)


def test_nan_and_inf_already_in_the_inputs_are_not_blamed_and_do_not_hide_a_culprit():
    x = torch.randn(8, 8)
    x[1, 2] = float("nan")
    x[3, 3] = float("inf")
    w = torch.randn(8, 8)

    def f(x, w):
        h = (torch.tanh(x) * 2 + x.sum(-1, keepdim=True)) @ w  # NaN / Inf rows, through an extern mm
        return torch.sigmoid(h)

    rep = accuracy.check(lambda: torch.compile(f)(x, w))
    _clean(rep, at_least=2)
    assert rep.first_divergent is None, rep.summary()  # NaN on both sides is not a difference
    with wrong_lowering(aten.sigmoid.default, scale=1.01):
        rep = accuracy.check(lambda: torch.compile(f)(x, w))
    _planted(rep, "sigmoid")  # not "inherited" from the NaN rows


def test_zero_size_tensors():
    f = lambda x, y: (torch.tanh(x) * 2, y.sum(0), torch.sigmoid(y) + 1)  # noqa: E731
    rep = accuracy.check(lambda: torch.compile(f)(torch.randn(0, 4), torch.randn(0, 3)))
    assert rep.culprit is None and rep.first_divergent is None, rep.summary()
    assert rep.compared() >= 1  # y.sum(0) has 3 elements


# ------------------------------------------------------------- numerics


def test_nan_on_both_sides_matches_and_discrete_values_are_never_worse():
    nan = float("nan")
    c = torch.tensor([nan, 1.0, float("inf")])
    d = numerics.difference(c, c.clone(), c.double())
    assert d.mismatch_pct == 0.0 and d.within_tolerance and d.max_rel == 0.0
    assert d.err_compiled == 0.0
    off = numerics.difference(torch.tensor([nan, 1.5, float("inf")]), c, c.double())
    assert off.worst_index == (1,) and off.mismatch_pct == pytest.approx(100 / 3)  # not the NaN element
    # an index flipped at a near-tie: different (exactly compared), not "worse"
    i = numerics.difference(torch.tensor([3, 7]), torch.tensor([3, 2]), torch.tensor([3, 2]))
    assert not i.within_tolerance and i.discrete and not i.worse(4.0)
    # a sum of 1e6 terms: its floor grows with sqrt(terms)
    r = torch.tensor([1000.0], dtype=torch.float64)
    one = numerics.difference(torch.tensor([1000.0]), torch.tensor([1000.0]), r)
    many = numerics.difference(torch.tensor([1000.0]), torch.tensor([1000.0]), r, terms=10 ** 6)
    assert many.floor == pytest.approx(one.floor * 1000)
