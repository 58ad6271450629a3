"""Per-launch cost of kdebug's launch hook, by recording mode, on one
compiled function of many small kernels (host-bound: the device time of
each kernel is far below its launch cost, so the host's work is what is
timed).  Not a test; a tool for finding where FlightRecorder / kernels_only
cost goes.

    python tools/hook_cost.py [--device cuda] [--cycles 40] [--calls 100]

Each cycle times a block of --calls calls in every mode, the modes in a
shuffled order, the device synchronized around each block.  Reported: the
median µs per call, and the extra µs per kernel launch over the untraced
call (kdebug's own launch counter says how many launches a call makes).
"""
from __future__ import annotations

import argparse
import random
import statistics
import time

import torch

import kdebug
from kdebug import DebugMode, _C


def body(x, w):
    # separate kernels: reductions over alternating dims and an extern mm
    for _ in range(6):
        x = torch.softmax(x, -1) * 1.5
        x = x - x.mean(0, keepdim=True)
    return x @ w


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--cycles", type=int, default=40)
    p.add_argument("--calls", type=int, default=100)
    p.add_argument("--size", type=int, default=64)
    a = p.parse_args()
    dev = a.device
    x = torch.randn(a.size, a.size, device=dev)
    w = torch.randn(a.size, a.size, device=dev)
    f = torch.compile(body)
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    with DebugMode(kernels_only=True) as dm:
        f(x, w)
    launches = len(dm.kernels)
    with DebugMode(kernels_only=True, record_extern_ops=True) as dm:
        f(x, w)
    with_extern = len(dm.kernels)

    def plain(n):
        for _ in range(n):
            f(x, w)

    def ko(hashes=False, batch=True, extern=False):
        def run(n):
            with DebugMode(kernels_only=True, batch_gpu_work=batch, record_extern_ops=extern,
                           ring_capacity=1 << 16, overflow="overwrite"):
                if hashes:
                    with DebugMode.log_tensor_hashes("bitwise"):
                        plain(n)
                else:
                    plain(n)
        return run

    # made once: making one prefaults its ring (Note [Ring prefault]), about 0.3 s
    # on the CPU machine, which a block of --calls calls would otherwise carry
    fr = kdebug.FlightRecorder(every=10 ** 9, keep_steps=2, trace="/tmp/kdebug_hook_cost.kdt", hashes="all")

    def flight(n):
        with fr:
            for _ in range(n):
                f(x, w)
                fr.step()

    modes = {"untraced": plain, "kernels_only": ko(), "ko+extern": ko(extern=True),
             "ko+bitwise batched": ko(True), "ko+bitwise per kernel": ko(True, batch=False),
             "ko+extern+bitwise batched": ko(True, extern=True), "flight (never compares)": flight}
    for m in modes.values():
        m(3)
    times = {k: [] for k in modes}
    rng = random.Random(0)
    names = list(modes)
    for _ in range(a.cycles):
        rng.shuffle(names)
        for k in names:
            sync()
            t0 = time.perf_counter()
            modes[k](a.calls)
            sync()
            times[k].append((time.perf_counter() - t0) * 1e6 / a.calls)
    base = statistics.median(times["untraced"])
    print(f"{dev}: {launches} kernel launches per call ({with_extern} with extern ops); "
          f"{a.cycles} cycles x {a.calls} calls; torch {torch.__version__}")
    print("| mode | µs / call | x untraced | extra µs / launch |")
    print("|---|---|---|---|")
    for k, v in times.items():
        m = statistics.median(v)
        n = with_extern if "extern" in k else launches
        print(f"| {k} | {m:.1f} | {m / base:.3f} | {(m - base) / n:.2f} |")


if __name__ == "__main__":
    main()
