"""Time of kdebug.compare on two live runs (DebugMode objects, no files).

Records --steps steps of a real compiled training step (the CPU Transformer of
kdebug.workloads.transformer_step: forward + backward, C++ Inductor kernels)
twice, each under log_tensor_hashes("bitwise", hash_inputs=True), then times
``kdebug.compare(dm_a, dm_b)`` --repeats times on one core and prints the
median, the minimum and what the comparison saw, as JSON.  The same two runs
saved as traces are compared from their files too (``files_*``: loading,
validating and digesting both files, then the comparison), the other way in
to the same digests.

    python benchmarks/bench_compare_live.py [--steps 20] [--repeats 7] [--out FILE]

Run it on two checkouts (before / after a change) and compare the medians:
the recording is the same, only the comparison is timed.
"""
from __future__ import annotations

import argparse
import json
import platform
import os
import statistics
import sys
import tempfile
import time

import torch

import kdebug
from kdebug import DebugMode
from kdebug.workloads import transformer_step


def record(step, x, steps: int):
    with DebugMode() as dm, DebugMode.log_tensor_hashes("bitwise", hash_inputs=True):
        for _ in range(steps):
            step(x)
    dm.operators  # noqa: B018  (drain while the mode's objects are alive)
    return dm


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--out", default=None, help="also write the JSON here")
    a = ap.parse_args()
    torch.set_num_threads(1)
    step, x = transformer_step("cpu", warmup=2)
    dms = [record(step, x, a.steps) for _ in range(2)]
    times = []
    rep = None
    for _ in range(a.repeats):
        t0 = time.perf_counter()
        rep = kdebug.compare(dms[0], dms[1])
        times.append(time.perf_counter() - t0)
    with tempfile.TemporaryDirectory() as d:
        paths = [os.path.join(d, f"run{i}.kdt") for i in range(2)]
        for dm, p in zip(dms, paths):
            dm.save(p)
        ftimes = []
        for _ in range(a.repeats):
            t0 = time.perf_counter()
            frep = kdebug.compare(*paths)
            ftimes.append(time.perf_counter() - t0)
    assert str(frep) == str(rep), "the files and the live runs must give the same report"
    res = {
        "what": "kdebug.compare(DebugMode, DebugMode), CPU Transformer train step",
        "steps": a.steps, "records": rep.n_a, "kernels": rep.kernels_b, "hashed": rep.hashed, "ok": rep.ok,
        "median_s": statistics.median(times), "min_s": min(times), "repeats": a.repeats,
        "files_median_s": statistics.median(ftimes), "files_min_s": min(ftimes),
        "torch": torch.__version__, "python": platform.python_version(), "machine": platform.machine(),
    }
    text = json.dumps(res, indent=1)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    sys.exit(main())
