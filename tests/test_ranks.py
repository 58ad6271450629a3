"""Per-rank traces, collective records and the cross-rank comparison, on gloo
(CPU) through torch's launcher (kdebug record --nproc 2)."""
import os
import subprocess
import sys

import pytest

import kdebug
from kdebug.ranks import rank_path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "tests", "dist_scripts", "ddp_step.py")


def test_rank_path():
    assert rank_path("run.kdt", 3) == "run.rank3.kdt"
    assert rank_path("/a.b/run", 0) == "/a.b/run.rank0"
    with pytest.raises(ValueError):
        rank_path("run.kdt", -1)


def _record(tmp_path, **env):
    out = str(tmp_path / "run.kdt")
    p = subprocess.run([sys.executable, "-m", "kdebug", "record", "--nproc", "2", "-o", out, "--", SCRIPT],
                       env={**os.environ, "PYTHONPATH": ROOT, **env}, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:]
    return out


@pytest.mark.distributed
def test_planted_collective_output_names_collective_and_rank(tmp_path):
    out = _record(tmp_path, KD_FAULT="collective:1")
    run = kdebug.load(out)
    assert run.ranks == [0, 1] and run[1].meta["rank"] == 1 and run[1].meta["world_size"] == 2
    assert run[0].meta["groups"][0]["ranks"] == [0, 1]
    rep = kdebug.compare_ranks(run)
    assert not rep.ok
    first = rep.comparisons[0].findings[0]
    assert rep.comparisons[0].rank == 1
    assert first.step.name.startswith("c10d::allreduce_")
    assert "on rank 1" in first.text


@pytest.mark.distributed
def test_replicas_match(tmp_path):
    out = _record(tmp_path)
    rep = kdebug.compare_ranks(kdebug.load(out))
    assert rep.ok, str(rep)
    names = [op._name for op in kdebug.load(out)[1].operators if hasattr(op, "_name")]
    assert sum(n.startswith("c10d::allreduce_") for n in names) >= 2  # DDP's gradient all-reduces, both steps


@pytest.mark.distributed
@pytest.mark.parametrize("form", ["outer", "inner"])  # torch.compile(DDP(model)), DDP(torch.compile(model))
def test_planted_rank_local_kernel_fault_named_by_diff_ranks(tmp_path, form):
    out = _record(tmp_path, KD_FAULT="kernel:1", KD_FORM=form)
    run = kdebug.load(out)
    assert all(len(r.kernels) > 0 for r in run), "the compiled DDP program's kernels were not recorded"
    p = subprocess.run([sys.executable, "-m", "kdebug", "diff", out, "--ranks"], env={**os.environ, "PYTHONPATH": ROOT},
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
    assert p.returncode == 1, p.stdout
    first = next(line for line in p.stdout.splitlines() if "REPLICAS DIVERGE" in line)
    assert "rank-local root" in first and "cpp_fused_relu" in first and "on rank 1" in first, p.stdout


def test_runner_says_when_torch_compile_captured_no_graph():
    import torch

    from kdebug import _runner, _upstream

    _upstream.dynamo_reset()

    @torch.compile(backend="eager")
    def nothing(x):
        torch._dynamo.graph_break()
        return x

    nothing(torch.ones(2))
    got = _upstream.dynamo_frame_counts()
    assert got is not None and got[0] >= 1 and got[1] == 0
    hint = _runner.nothing_compiled_hint(0)
    assert hint is not None and "captured no graph" in hint and "DDP(torch.compile(model))" in hint
    assert _runner.nothing_compiled_hint(3) is None  # kernels were recorded: nothing to say

    @torch.compile(backend="eager")
    def something(x):
        return x * 2

    something(torch.ones(2))
    assert _runner.nothing_compiled_hint(0) is None  # a graph was captured (eager backend: no kernel)
    _upstream.dynamo_reset()
