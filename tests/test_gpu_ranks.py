"""Collectives on a 1-rank NCCL group recorded with device-side hashes:
the recorded output hash is the result's, no synchronization is added, and
nothing hangs (the worker runs in a subprocess with a timeout)."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKER = os.path.join(ROOT, "tests", "dist_scripts", "gpu_collectives.py")


@pytest.mark.gpu
def test_gpu_collective_hashes_on_a_one_rank_nccl_group():
    p = subprocess.run([sys.executable, WORKER], env={**os.environ, "PYTHONPATH": ROOT}, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=300)  # a hang fails here
    assert p.returncode == 0, p.stdout[-4000:]
    got = json.loads(next(line for line in p.stdout.splitlines() if line.startswith("KDJSON "))[7:])
    assert got["syncs_error"] is None, f"a synchronization inside the recorded region: {got['syncs_error']}"
    recs = got["records"]
    eager = recs["c10d::allreduce_"]
    assert len(eager) == 1 and eager[0]["done"] and eager[0]["error"] is None
    assert eager[0]["post"] == got["eager_result"] != "None"
    assert eager[0]["pre"] == got["eager_input"]
    if got["premul"]:  # the output differs from the input: the hash was taken after the collective wrote it
        assert eager[0]["post"] != eager[0]["pre"]
    # Inductor may lower it to the in-place all_reduce_ on its own buffer
    functional = [r for k, v in recs.items() if k.startswith("_c10d_functional::all_reduce") for r in v]
    assert len(functional) == 1 and functional[0]["done"] and functional[0]["error"] is None
    assert functional[0]["post"] == got["functional_result"] != "None"
    assert got["stats"]["collectives_incomplete"] == 0 and got["stats"]["collectives_failed"] == 0
