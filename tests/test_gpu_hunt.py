"""The determinism hunt on the GPU (issue 4): a compiled index_add's Triton
kernel (tl.atomic_add) named as the non-deterministic kernel, in process, from
trace files written with GPU hashes, and by `kdebug hunt --device cuda`."""
from __future__ import annotations

import re
import subprocess
import sys

import pytest
import torch

import kdebug
from kdebug import DebugMode, testing

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)


def test_index_add_triton_kernel_is_named(index_add_case):
    cf, x, ind = index_add_case
    with pytest.raises(AssertionError) as e:
        kdebug.assert_deterministic(cf, x, ind, runs=4)
    text = str(e.value)
    assert re.search(r"FIRST DIVERGENCE: kernel #\d+ triton_\w*index_add", text), text
    assert "inputs identical, output" in text and "non-deterministic" in text
    assert "grid (" in text


def _record_runs(n, tmp_path, index_add_case, block_step) -> list:
    """n trace files of a deterministic transformer step, then the atomic kernel."""
    cf, x, ind = index_add_case
    step, inp = block_step
    paths = []
    for i in range(n):
        p = tmp_path / f"run{i}.kdt"
        with DebugMode(trace=p), DebugMode.log_tensor_hashes(["bitwise", "norm"], hash_inputs=True):
            step(inp)
            cf(x, ind)
        paths.append(str(p))
    return paths


def test_gpu_runs_through_trace_files(index_add_case, tmp_path, block_step):
    paths = _record_runs(3, tmp_path, index_add_case, block_step)
    runs = [kdebug.load(p) for p in paths]
    assert all(r.complete for r in runs)
    ks = runs[0].kernels
    assert len(ks) > 20 and all(k.kind == "triton" for k in ks)
    assert all(k.post_hashes for k in ks if k.written)  # GPU hashes resolved before writing
    reps = [kdebug.compare(paths[0], p) for p in paths[1:]]
    bad = [r for r in reps if not r.ok]
    assert bad, "three runs of a compiled index_add with 200k colliding adds were identical"
    d = bad[0].divergence
    assert d.kind == "output" and "index_add" in d.step_a.name
    # everything before it (the transformer step's kernels) matched
    assert d.step_a.index == len(runs[0]) - 1 or all(
        "index_add" in s.name for s, _ in d.inherited)


def test_hunt_cli_on_cuda():
    p = subprocess.run([sys.executable, "-m", "kdebug", "hunt", "--runs", "3", "--device", "cuda"],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 1, p.stdout + p.stderr
    assert re.search(r"FIRST DIVERGENCE: kernel #\d+ triton_\w*index_add", p.stdout), p.stdout
    assert "non-deterministic" in p.stdout
    print(p.stdout)


def test_gpu_report_and_perfetto_export(index_add_case, tmp_path, block_step):
    """The HTML report and the Perfetto export of GPU runs (issue 5): Triton
    grids and configs in the rows, CUDA stream tracks in the export."""
    import json

    from kdebug import report
    from kdebug.export import export_perfetto

    paths = _record_runs(4, tmp_path, index_add_case, block_step)
    meta, _ = report.build(paths)
    bad = [c for c in meta["comparisons"] if not c["ok"]]
    assert bad, "four runs of a compiled index_add were identical"
    d = bad[0]["divergence"]
    assert "index_add" in d["a"]["name"] and d["a"]["grid"] and d["kind"] == "output"
    st = report.write_html(str(tmp_path / "gpu.html"), paths)
    assert st["bytes"] > 0 and "output divergence" in st["verdict"]
    out = tmp_path / "run0.json"
    export_perfetto(paths[0], str(out))
    ev = json.loads(out.read_text())["traceEvents"]
    slices = [e for e in ev if e["ph"] == "X"]
    assert slices and all(e["cat"] == "triton" and e["pid"] >= 100 for e in slices)
    assert all("grid" in e["args"] and e["args"].get("num_warps") for e in slices)
    procs = {e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "process_name"}
    threads = {e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "thread_name"}
    assert f"cuda:{torch.cuda.current_device()}" in procs
    assert any(t.startswith("stream 0x") for t in threads)
    ia = next(e for e in slices if "index_add" in e["name"])
    assert any("post bitwise 0x" in v for v in ia["args"]["args"].values())


def test_perturbed_triton_kernel_of_the_python_wrapper_is_named(tmp_path):
    """kdebug.testing.perturb_kernel_output on a Triton kernel (Note [Triton
    faults]): the fault lands between the kernel and kdebug's post-launch
    hashes, so the recorded hash and the step's result both change, and the
    compare names that launch."""
    def f(x):
        return (torch.sin(x) * 2).sum(dim=1).relu() + 1

    cf = torch.compile(f)
    x = torch.randn(512, 256, device="cuda")
    want = cf(x)  # compiles and launches once: the launchers exist
    a = tmp_path / "a.kdt"
    with DebugMode(trace=a), DebugMode.log_tensor_hashes(["bitwise"]):
        clean = cf(x)
    ra = kdebug.load(str(a))
    n = len(ra.kernels)  # Triton launches of one call
    assert n >= 1 and all(k.kind == "triton" and k.kernel_name.startswith("triton_") for k in ra.kernels)
    with testing.perturb_kernel_output("triton_", None, occurrence=n, value=1000.0) as st:
        first = cf(x)  # launches 0 .. n-1: untouched
        second = cf(x)  # launch n: the second call's first kernel
    assert st["hits"] == 1 and torch.equal(clean, want) and torch.equal(first, want)
    assert not torch.equal(second, want)  # the fault changed the program's result, not only a hash
    assert torch.equal(cf(x), want)  # the block's exit put the launchers back
    c = tmp_path / "c.kdt"
    with DebugMode(trace=c), DebugMode.log_tensor_hashes(["bitwise"]):
        with testing.perturb_kernel_output("triton_", None, value=1000.0) as st:
            cf(x)
    rep = kdebug.compare(str(a), str(c))
    assert st["hits"] == 1 and not rep.ok, str(rep)
    d = rep.divergence
    assert d.kind == "output" and d.step_a.name == ra.kernels[0].kernel_name, str(rep)
