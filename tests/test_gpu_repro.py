"""kdebug repro / rerun and the hunt's re-launches on the GPU (issue 18,
Note [Standalone repro]): Triton kernels and CUDA aten ops, including a
random op whose CUDA generator state is restored."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WITHOUT_KDEBUG = "import sys, runpy; sys.modules['kdebug'] = None; sys.argv = sys.argv[1:]; " \
                 "runpy.run_path(sys.argv[0], run_name='__main__')"


def kdebug_cli(*args, cwd):
    return subprocess.run([sys.executable, "-m", "kdebug", *args], capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, "PYTHONPATH": REPO}, timeout=900)


def standalone(script, *args, cwd):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([sys.executable, "-c", WITHOUT_KDEBUG, str(script), *args], capture_output=True,
                          text=True, cwd=cwd, env=env, timeout=900)


def test_hunt_on_cuda_relaunches_the_triton_root_k_times(tmp_path):
    p = kdebug_cli("hunt", "--device", "cuda", "--keep", "h", "--rerun-times", "5", cwd=tmp_path)
    assert p.returncode == 1, p.stdout + p.stderr
    m = json.loads((tmp_path / "h" / "hunt.json").read_text())["magnitude"][0]
    assert "triton" in m["root"] and m["rerun"]["times"] == 5, m
    r = m["rerun"]
    assert f"re-launched 5x on the recorded inputs: {r['distinct']} different output" in p.stdout
    assert r["verdict"] == ("intrinsic" if r["distinct"] > 1 else "stable")
    src = (tmp_path / "h" / m["repro"] / "kernel_source.py").read_text()
    assert "@triton.jit" in src or "triton" in src
    again = standalone(tmp_path / "h" / m["repro"] / "repro.py", "--times", "3", cwd=tmp_path)
    assert again.returncode in (0, 1), again.stdout + again.stderr
    assert "launched 3 time(s) on the recorded inputs" in again.stdout


def _op_index(trace, name) -> int:
    import kdebug
    from kdebug.compare import steps_of

    return next(s.index for s in steps_of(kdebug.load(str(trace), quiet=True)) if s.kind == "aten" and s.name == name)


def test_repro_of_cuda_randn_restores_the_cuda_generator(tmp_path):
    p = kdebug_cli("record", "-o", "u.kdt", "--", "python", "-m", "kdebug.zoo", "unseeded_input", "--device", "cuda",
                   cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    n = _op_index(tmp_path / "u.kdt", "aten::randn")
    p = kdebug_cli("repro", "u.kdt", "--op", str(n), "-o", "rn", cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    data = torch.load(tmp_path / "rn" / "inputs.pt", weights_only=True)
    assert "cuda" in data["before"]["rng"]
    ok = standalone(tmp_path / "rn" / "repro.py", "--times", "3", cwd=tmp_path)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "1 different output(s); 3 of 3 match" in ok.stdout


def test_repro_of_a_cuda_custom_op_with_its_module(tmp_path):
    p = kdebug_cli("record", "-o", "j.kdt", "--", "python", "-m", "kdebug.zoo", "extern_jitter", "--device", "cuda",
                   cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    n = _op_index(tmp_path / "j.kdt", "kdebug_zoo::jitter_matmul")
    p = kdebug_cli("rerun", "j.kdt", "--op", str(n), "--times", "20", cwd=tmp_path)
    assert p.returncode == 1, p.stdout + p.stderr  # 1 to 8 ULP per call: varies
    assert "INTRINSICALLY NONDETERMINISTIC" in p.stdout
