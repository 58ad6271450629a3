"""The accuracy check on Triton kernels (run on the GPU machine)."""
from __future__ import annotations

import pytest
import torch

from kdebug import accuracy
from kdebug.testing import wrong_lowering

pytestmark = pytest.mark.gpu
aten = torch.ops.aten


def _named(kernel, names) -> bool:
    bases = {n.rstrip("0123456789").rstrip("_") for n in kernel.nodes}
    return any(n in kernel.kernel or n in bases for n in names)


def _mlp():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.Tanh(), torch.nn.Linear(128, 16)).cuda()
    return m, torch.randn(32, 64, device="cuda")


def test_planted_triton_culprit_forward_and_backward():
    m, x = _mlp()
    with wrong_lowering(aten.tanh.default, scale=1.001):
        cm = torch.compile(m)
        rep = accuracy.check(lambda: cm(x).sum().backward())
    c = rep.culprit
    assert c is not None and c.kind == "triton" and _named(c, ("tanh",)), rep.summary()
    assert c.code is not None and "@triton.jit" in c.code
    assert rep.graph_calls_checked == 2


@pytest.mark.parametrize("emulate", [False, True])
def test_bf16_layer_norm_softmax_names_no_culprit(emulate):
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.LayerNorm(128), torch.nn.GELU(),
                            torch.nn.Softmax(-1)).cuda().to(torch.bfloat16)
    x = torch.randn(64, 64, device="cuda", dtype=torch.bfloat16)
    cfg = torch._inductor.config
    old = cfg.emulate_precision_casts
    cfg.emulate_precision_casts = emulate
    try:
        rep = accuracy.compare_eager(m, x)
    finally:
        cfg.emulate_precision_casts = old
    assert rep.culprit is None, rep.summary()
    assert rep.compared() >= 3


def test_transformer_step_clean_and_planted():
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(128, 4, 256, dropout=0.0, activation="gelu", batch_first=True).cuda()
    x = torch.randn(8, 32, 128, device="cuda")
    rep = accuracy.check(lambda: torch.compile(layer)(x).sum().backward())
    assert rep.culprit is None, rep.summary()
    with wrong_lowering(aten.erf.default, scale=1.001):
        rep = accuracy.check(lambda: torch.compile(layer)(x).sum().backward())
    assert rep.culprit is not None and _named(rep.culprit, ("erf", "gelu")), rep.summary()
