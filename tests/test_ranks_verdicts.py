"""Cross-rank verdicts on a clean data-parallel job written as many are
(BatchNorm, rank-seeded dropout) and on one rank's other learning rate, on
gloo through torch's launcher (a file of its own: the test run's workers
share the slow two-rank recordings)."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


BN_DROPOUT = os.path.join(ROOT, "tests", "dist_scripts", "ddp_bn_dropout.py")


def _diff_ranks_of(tmp_path, script, **env) -> subprocess.CompletedProcess:
    out = str(tmp_path / "run.kdt")
    p = subprocess.run([sys.executable, "-m", "kdebug", "record", "--nproc", "2", "-o", out, "--", script],
                       env={**os.environ, "PYTHONPATH": ROOT, **env}, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:]
    return subprocess.run([sys.executable, "-m", "kdebug", "diff", "--ranks", out],
                          env={**os.environ, "PYTHONPATH": ROOT}, capture_output=True, text=True, timeout=300)


@pytest.mark.distributed
def test_a_clean_job_with_batchnorm_and_rank_seeded_dropout_has_matching_replicas(tmp_path):
    """DDP's broadcast BatchNorm buffers differ at the end of a clean job (each
    rank updated them from its own batch), and ranks seed their own dropout:
    neither is a divergence (Note [DDP final parameters], Note [Each rank's
    own generator])."""
    p = _diff_ranks_of(tmp_path, BN_DROPOUT)
    assert p.returncode == 0 and "replicas MATCH" in p.stdout, p.stdout + p.stderr
    assert "buffer" not in p.stdout


@pytest.mark.distributed
def test_another_learning_rate_on_one_rank_is_named_as_a_setting(tmp_path):
    """Rank 1's optimizer steps once with another learning rate: the differing
    parameters are put down to the optimizer op called with another step size
    on rank 1 (Note [Settings one rank had]), not to each rank's own data."""
    p = _diff_ranks_of(tmp_path, BN_DROPOUT, KD_FAULT="lr:1")
    assert p.returncode == 1, p.stdout + p.stderr
    first = next(line for line in p.stdout.splitlines() if "REPLICAS DIVERGE" in line)
    assert "final DDP0 parameter" in first and "called with other arguments on rank 1" in first, first
    assert "a setting this rank had" in first and "each rank's own inputs" not in first, first

