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
