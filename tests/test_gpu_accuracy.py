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


# ---------------------------------------------------------------- Note [Output spill] on the GPU

def _calls(rep):
    return [(k.graph_call, k.index, k.kernel, k.status, k.tainted_inputs,
             [(b.buffer, b.node, b.why_not) for b in k.buffers]) for k in rep.kernels]


def _numbers(rep):
    return [(b.diff.max_abs, b.diff.err_compiled, b.diff.err_eager) for k in rep.kernels for b in k.buffers
            if b.diff is not None]


def test_device_host_and_disk_tiers_give_the_verdict_of_an_unbudgeted_check(tmp_path):
    import os

    def step(**budgets):
        m, x = _mlp()
        with wrong_lowering(aten.tanh.default, scale=1.001):
            cm = torch.compile(m)
            return accuracy.check(lambda: cm(x).sum().backward(), **budgets)

    free = step()
    assert free.spill.to_host == 0 and free.spill.to_disk == 0, free.spill
    # [32, 128] float32 buffers are 16 KiB: an 8 KiB device tier drains at every launch (pinned,
    # non-blocking copies), 20 KiB of host memory keeps one of them, the rest go to disk; the
    # reference runs keep their values beyond 8 KiB on the host too
    d = tmp_path / "spill"
    d.mkdir()
    tight = step(max_device_bytes=8 << 10, max_host_bytes=20 << 10, max_disk_bytes=1 << 30, spill_dir=str(d))
    sp = tight.spill
    assert sp.drains > 0 and sp.to_host > 0 and sp.to_disk > 0, sp
    assert sp.dropped == 0 and sp.write_errors == 0 and sp.host_bytes_peak <= 20 << 10
    assert _calls(tight) == _calls(free), tight.summary()
    assert tight.culprit is not None and tight.culprit.kernel == free.culprit.kernel
    assert _named(tight.culprit, ("tanh",)), tight.summary()
    for a, b in zip(_numbers(tight), _numbers(free)):
        assert a == pytest.approx(b, rel=1e-6, abs=0), (a, b)
    assert os.listdir(d) == []
    # nothing on disk either: counted, explained, and never another culprit
    lost = step(max_device_bytes=8 << 10, max_host_bytes=20 << 10, max_disk_bytes=0)
    assert lost.spill.dropped + lost.spill.launches_refused > 0
    assert lost.culprit is None or lost.culprit.kernel == free.culprit.kernel, lost.summary()
    assert "--max-disk-bytes" in lost.summary()


def test_transformer_step_with_forced_spill_names_the_planted_kernel():
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(128, 4, 256, dropout=0.0, activation="gelu", batch_first=True).cuda()
    x = torch.randn(8, 32, 128, device="cuda")
    with wrong_lowering(aten.erf.default, scale=1.001):
        rep = accuracy.check(lambda: torch.compile(layer)(x).sum().backward(),
                             max_device_bytes=256 << 10, max_host_bytes=512 << 10, max_disk_bytes=1 << 30)
    assert rep.spill.drains > 0 and rep.spill.to_disk > 0, rep.spill
    assert rep.culprit is not None and _named(rep.culprit, ("erf", "gelu")), rep.summary()
