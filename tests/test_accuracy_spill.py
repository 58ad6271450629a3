"""The accuracy check's output tiers (Note [Output spill], kdebug/spill.py):
with budgets too small for one graph call's kernel outputs, they are kept in
host memory and a temporary values file, and the verdict and every number
compared are those of a check with no budget pressure.  Real Inductor C++
kernels; culprits planted with kdebug.testing.wrong_lowering."""
from __future__ import annotations

import dataclasses
import os
import tempfile
import warnings

import pytest
import torch

from kdebug import _files, accuracy
from kdebug.testing import wrong_lowering
from test_accuracy import MLP, Block, _cli, _planted_op_in, _step

aten = torch.ops.aten


def _mlp_step(**budgets):
    torch.manual_seed(0)
    m, x = MLP(), torch.randn(8, 16)
    with wrong_lowering(aten.tanh.default, scale=1.001):
        cm = torch.compile(m)
        return accuracy.check(_step(cm, x), **budgets)


def _block(**budgets):
    torch.manual_seed(0)
    m, x = Block(), torch.randn(4, 32)
    with wrong_lowering(aten.exp.default, scale=1.0 + 1e-3):
        return accuracy.check(lambda: torch.compile(m)(x), **budgets)


def _verdict(rep):
    """Everything the check concluded, without the graph names (they count
    compilations) and the spill line: per call its kernel, status and every
    buffer's numbers or reason."""
    out = []
    for k in rep.kernels:
        bufs = []
        for b in k.buffers:
            # every number of the comparison (repr: NaN compares equal to NaN)
            nums = None if b.diff is None else repr(dataclasses.astuple(b.diff))
            loc = None if b.local is None else repr(dataclasses.astuple(b.local))
            bufs.append((b.buffer, b.node, b.param, nums, loc, b.why_not))
        out.append((k.graph_call, k.index, k.kernel, k.status, k.tainted_inputs, bufs))
    return out


@pytest.mark.parametrize("case", [_mlp_step, _block])
def test_host_and_disk_tiers_give_the_verdict_and_numbers_of_an_unbudgeted_check(case, tmp_path, monkeypatch):
    free = case()
    assert free.spill is not None and free.spill.to_disk == 0 and free.spill.dropped == 0
    assert free.culprit is not None
    made: list = []
    real_mkdtemp = tempfile.mkdtemp

    def mkdtemp(*a, **k):
        made.append(real_mkdtemp(*a, **k))
        return made[-1]

    monkeypatch.setattr(tempfile, "mkdtemp", mkdtemp)
    spill_dir = tmp_path / "spill"
    spill_dir.mkdir()
    # 600 bytes of host memory: the small buffers of these models fit, their [8, 32] ones go to disk
    tight = case(max_host_bytes=600, max_disk_bytes=1 << 30, spill_dir=str(spill_dir))
    sp = tight.spill
    assert sp.kept_in_place > 0 and sp.to_disk > 0 and sp.disk_bytes > 0, sp
    assert sp.dropped == 0 and sp.launches_refused == 0 and sp.write_errors == 0
    assert sp.host_bytes_peak <= 600
    assert _verdict(tight) == _verdict(free)
    assert tight.culprit.kernel == free.culprit.kernel
    assert _planted_op_in(tight.culprit, "tanh" if case is _mlp_step else "exp", via=("softmax",))
    assert f"{sp.to_disk} to disk" in tight.summary()
    # the values file existed in a private directory under spill_dir, and is gone with it
    assert made and all(os.path.dirname(d) == str(spill_dir) for d in made)
    assert not any(os.path.exists(d) for d in made) and os.listdir(spill_dir) == []


def test_everything_on_disk_and_nothing_in_memory():
    free = _mlp_step()
    rep = _mlp_step(max_host_bytes=0)
    assert rep.spill.kept_in_place == 0 and rep.spill.to_disk > 0
    assert _verdict(rep) == _verdict(free)


@pytest.mark.parametrize("host", [0, 100, 600, 1100])  # from nothing kept to all but one buffer
def test_over_every_budget_is_counted_and_explained_never_a_wrong_culprit(host):
    free = _mlp_step()
    rep = _mlp_step(max_host_bytes=host, max_disk_bytes=0)
    lost = [b for k in rep.kernels for b in k.buffers if b.why_not and "budget" in b.why_not]
    assert rep.spill.dropped + rep.spill.launches_refused > 0
    assert lost and all("--max-disk-bytes" in b.why_not and "spilling to disk is off" in b.why_not for b in lost)
    assert rep.spill.to_disk == 0
    # the planted kernel, or no verdict (a kernel that read a lost value is never a root)
    assert rep.culprit is None or rep.culprit.kernel == free.culprit.kernel, rep.summary()
    for k in rep.kernels:
        if k.status == "worse":
            assert _planted_op_in(k, "tanh"), rep.summary()
    if rep.culprit is None:  # never "no kernel computes worse": it says it could not judge
        assert rep.unrecorded and rep.no_verdict
        assert ("NO VERDICT" in rep.summary() if rep.compared() else "NOTHING COMPARED" in rep.summary())
        assert "no kernel computes worse" not in rep.summary()
    assert "not recorded" in rep.summary()


def test_a_symlinked_or_missing_spill_dir_is_refused_before_the_program_runs(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    link = tmp_path / "link"
    link.symlink_to(real)
    ran = []
    with pytest.raises(_files.LinkRefused, match="symbolic link"):
        accuracy.check(lambda: ran.append(1), spill_dir=str(link))
    with pytest.raises(ValueError, match="not a directory"):
        accuracy.check(lambda: ran.append(1), spill_dir=str(tmp_path / "nope"))
    with pytest.raises(ValueError, match="max_host_bytes"):
        accuracy.check(lambda: ran.append(1), max_host_bytes=-1)
    assert ran == [] and os.listdir(real) == []


def test_max_bytes_is_deprecated_and_sets_the_tier_the_outputs_are_made_in():
    with pytest.warns(FutureWarning, match="max_bytes .*deprecated.*max_host_bytes"):
        rep = _mlp_step(max_bytes=1024, max_disk_bytes=1 << 30)
    assert rep.spill.host_budget == 1024 and rep.spill.to_disk > 0
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        _mlp_step(max_host_bytes=1 << 20)  # the new flags warn nothing


def test_cli_spills_to_disk_and_refuses_a_symlinked_spill_dir(tmp_path):
    d = tmp_path / "spill"
    d.mkdir()
    res = _cli(tmp_path, 1.001, "--max-host-bytes", "0", "--spill-dir", str(d))
    assert res.returncode == 1, res.stdout + res.stderr
    assert "tanh" in next(ln for ln in res.stdout.splitlines() if ln.startswith("CULPRIT: "))
    assert "spilled to host memory" in res.stdout and " to disk (" in res.stdout
    assert os.listdir(d) == []
    (tmp_path / "link").symlink_to(d)
    res = _cli(tmp_path, 1.001, "--spill-dir", str(tmp_path / "link"))
    assert res.returncode == 2 and "symbolic link" in res.stderr, res.stderr
    res = _cli(tmp_path, 1.001, "--max-host-bytes", "600", "--max-disk-bytes", "0")
    assert res.returncode == 2 and "no verdict" in res.stderr, res.stdout + res.stderr
    assert "NO VERDICT" in res.stdout
