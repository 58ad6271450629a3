"""The launch table (Note [Launch table] in csrc/core/kd_launch_table.h):
filled by the live recorder and by the trace reader, it gives the same
digests for the same real compiled run, and compare reads a live run's
digests from it without encoding the run into trace bytes."""
from __future__ import annotations

import pytest
import torch

import kdebug
from kdebug import _C, DebugMode, compare
from kdebug.compare import _Side
from kdebug.testing import perturb_kernel_output
from kdebug.workloads import TinyBlock, train_step_fn


@pytest.fixture(scope="module")
def step():
    torch.manual_seed(0)
    s = train_step_fn(TinyBlock(32, 2))
    x = torch.randn(2, 8, 32)
    s(x)
    return lambda: s(x)


def record(step, hash_fn="bitwise", fault=None):
    with DebugMode() as dm, DebugMode.log_tensor_hashes(hash_fn, hash_inputs=True):
        if fault is None:
            step()
        else:
            with perturb_kernel_output(*fault) as hit:
                step()
            assert hit["hits"] == 1
    dm.operators  # noqa: B018
    return dm


@pytest.mark.parametrize("hash_fn", ["bitwise", ["bitwise", "norm"], "stats"])
def test_live_and_loaded_tables_give_identical_digests(step, tmp_path, hash_fn):
    dm = record(step, hash_fn)
    path = tmp_path / "run.kdt"
    dm.save(str(path))
    live = _Side.of(dm)
    run = kdebug.load(str(path))
    loaded = _Side.of(run)
    kinds = bytes(run.types)
    assert live.n == loaded.n == len(dm.operators) and kinds.count(1) == live.kernels == len(dm.kernels) >= 5
    assert kinds.count(2) >= 5  # aten ops too (the backward's, the loss)
    # every launch and op hashed on both sides: the digests hold values, not zeros
    assert bool((live.dig[:, 0] != 0).all()) and bool((live.dig[:, 4] != 0).all())
    assert torch.equal(live.dig, loaded.dig)
    # the loaded run's table, filled by the trace reader, digests its launches
    # as the live recorder's table does
    run.operators  # noqa: B018  (decodes every launch into the run's table)
    filled = torch.frombuffer(bytearray(_C.launch_digests(run._rec)), dtype=torch.int64).view(-1, 5)
    recorded = torch.frombuffer(bytearray(_C.launch_digests(dm._recorder)), dtype=torch.int64).view(-1, 5)
    launch_rows = torch.tensor([i for i, t in enumerate(kinds) if t == 1])
    assert torch.equal(filled, loaded.dig[launch_rows])
    assert torch.equal(filled, recorded)


def test_a_changed_output_changes_only_its_launch_digests(step, tmp_path):
    base = record(step)
    name = base.kernels[1].kernel_name
    out = next(n for n, t in base.kernels[1].tensor_info.items() if t.writes)
    bad = record(step, fault=(name, out, 0))
    a, b = _Side.of(base), _Side.of(bad)
    ne = (a.dig != b.dig).any(1).nonzero().flatten().tolist()
    first = next(i for i, op in enumerate(base.operators) if name in getattr(op, "kernel_name", ""))
    assert ne and ne[0] == first
    assert bool((a.dig[first, :3] == b.dig[first, :3]).all())  # same kernel, config, shapes: only the hashes
    bad.save(str(tmp_path / "bad.kdt"))
    base.save(str(tmp_path / "base.kdt"))
    live = compare(base, bad)
    files = compare(str(tmp_path / "base.kdt"), str(tmp_path / "bad.kdt"))
    assert str(live) == str(files)
    # the planted kernel is the root; whether its one changed element reaches the end depends on the
    # step's data (which the module's earlier tests trained): a difference that dies out is a benign root
    # (Note [Differences that die out]), listed as such in both reports
    live_root, file_root = (live.roots or live.benign), (files.roots or files.benign)
    assert live_root and file_root and bool(live.roots) == (not live.ok) and bool(files.roots) == (not files.ok)
    assert live_root[0].step_a.name == file_root[0].step_a.name == name
