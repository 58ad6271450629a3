"""Comparison and trace-size benchmark (issue 4).

Records a real compiled training step (TinyBlock, forward + backward, C++
kernels on the CPU) under log_tensor_hashes("bitwise", hash_inputs=True),
then writes two traces of --launches kernel launches (the recorded steps
repeated; the second with one kernel's output perturbed halfway through, a
planted fault) and times, on one core:

  - kdebug.compare(path_a, path_b): load both files, validate, digest, align,
    find the first divergence, classify it;
  - bytes of trace per tensor argument.

Also times `kdebug hunt` on the built-in workload (fresh processes).

    python benchmarks/bench_compare.py [--launches 1000000] [--no-hunt] [--traces DIR]

--traces DIR keeps the two traces (and what recording them measured, in
DIR/bench.json) in DIR; a later run with the same DIR and --launches reuses
them instead of recording and writing again, so its write_s is the one
measured when they were written ("traces_reused": true in the results).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

import torch

import kdebug
from kdebug import DebugMode
from kdebug.testing import perturb_kernel_output
from kdebug.trace import Writer
from kdebug.workloads import TinyBlock, train_step_fn


def record(step, x, steps: int, fault=None, hash_fn="bitwise"):
    """`steps` steps recorded with input and output hashes; with `fault`
    (kernel name, argument, occurrence) one launch's output is perturbed."""
    with DebugMode() as dm, DebugMode.log_tensor_hashes(hash_fn, hash_inputs=True):
        if fault is None:
            for _ in range(steps):
                step(x)
        else:
            with perturb_kernel_output(*fault):
                for _ in range(steps):
                    step(x)
    dm.operators  # noqa: B018
    return dm


def write(path: str, parts, launches_per_part: int, target: int) -> int:
    """Writes the runs in `parts` (DebugModes) repeated until `target` launches."""
    w = Writer(path)
    written = 0
    i = 0
    while written < target:
        dm = parts(i)
        w.write(dm.operators, None, dm._recorder)
        written += launches_per_part
        i += 1
    w.close()
    return written


def _traces(a) -> dict:
    """Records and writes the two traces, or reuses those in a.traces."""
    info = os.path.join(a.traces, "bench.json") if a.traces else None
    if info and os.path.exists(info):
        with open(info) as f:
            rec = json.load(f)
        if (rec["launches_asked"], rec["steps"]) == (a.launches, a.steps) and all(os.path.exists(t) for t in rec["traces"]):
            rec["reused"] = True
            return rec
    torch.manual_seed(0)
    model = TinyBlock(d=64, heads=4)
    x = torch.randn(2, 16, 64)
    step = train_step_fn(model)
    step(x)
    base = record(step, x, a.steps)
    kernels = base.kernels
    per_part = len(kernels)
    k = kernels[len(kernels) // 2]
    name, arg = k.kernel_name, k.written[0]
    bad = record(step, x, a.steps, fault=(name, arg, a.steps // 2))
    tmp = a.traces or tempfile.mkdtemp(prefix="kdebug-bench-")
    os.makedirs(tmp, exist_ok=True)
    pa, pb = os.path.join(tmp, "a.kdt"), os.path.join(tmp, "b.kdt")
    reps = -(-a.launches // per_part)
    half = reps // 2
    t0 = time.perf_counter()
    n = write(pa, lambda i: base, per_part, a.launches)
    t_write = time.perf_counter() - t0
    write(pb, lambda i: bad if i == half else base, per_part, a.launches)
    size = os.path.getsize(pa)
    run_a = kdebug.load(pa)
    tensor_args = run_a.info["tensor_args"]
    del run_a
    rec = {"launches_asked": a.launches, "traces": [pa, pb], "launches": n, "size": size,
           "tensor_args": tensor_args, "write_s": t_write, "planted": name, "steps": a.steps, "reused": False}
    if info:
        with open(info, "w") as f:
            json.dump(rec, f, indent=1)
    return rec


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--launches", type=int, default=1_000_000)
    p.add_argument("--steps", type=int, default=50, help="recorded steps per repeated block")
    p.add_argument("--no-hunt", action="store_true")
    p.add_argument("--keep", action="store_true", help="keep the two trace files")
    p.add_argument("--traces", metavar="DIR",
                   help="write the traces to DIR and keep them; reuse them when DIR already holds them")
    p.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "compare_cpu.json"))
    a = p.parse_args()
    rec = _traces(a)
    pa, pb = rec["traces"]
    torch.set_num_threads(1)
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        rep = kdebug.compare(pa, pb)
        times.append(time.perf_counter() - t0)
    d = rep.divergence
    print(rep)
    res = {
        "machine": platform.processor() or platform.machine(), "torch": torch.__version__,
        "launches_per_trace": rec["launches"], "records_per_trace": rep.n_a, "tensor_args_per_trace": rec["tensor_args"],
        "trace_bytes": rec["size"], "bytes_per_tensor_arg": rec["size"] / rec["tensor_args"],
        "write_s": rec["write_s"], "traces_reused": rec["reused"], "compare_s": times, "compare_s_best": min(times),
        "first_divergence": d.step_a.label() if d else None, "divergence_kind": d.kind if d else None,
        "planted": rec["planted"], "inherited": len(d.inherited) if d else 0,
    }
    if not a.no_hunt:
        t0 = time.perf_counter()
        h = subprocess.run([sys.executable, "-m", "kdebug", "hunt", "--runs", "2"], capture_output=True, text=True)
        res["hunt_builtin_s"] = time.perf_counter() - t0
        res["hunt_exit"] = h.returncode
        res["hunt_first_divergence"] = next((line.strip() for line in h.stdout.splitlines()
                                             if "FIRST DIVERGENCE" in line), None)
    if a.keep:
        res["traces"] = [pa, pb]
    print(json.dumps(res, indent=1))
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)
    if not a.keep and not a.traces:
        for path in (pa, pb):
            os.remove(path)


if __name__ == "__main__":
    main()
