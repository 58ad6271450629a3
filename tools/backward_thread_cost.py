"""Where DebugMode(kernels_only=True) costs on a compiled training step:
the same Transformer step (benchmarks' GPU size) forward only, forward +
backward with the backward on autograd's device thread (the default on
CUDA), and forward + backward with the backward on the calling thread
(torch.autograd.set_multithreading_enabled(False)), each untraced and
recorded, in shuffled cycles.  Not a test: the tool behind the analysis in
docs/flight-recorder.md ("Where the cost goes").

    python tools/backward_thread_cost.py [--cycles 12] [--steps 10] [--all-threads]
"""
from __future__ import annotations

import argparse
import random
import statistics
import time

import torch

from kdebug import DebugMode
from kdebug.workloads import STEP_SIZES, Transformer


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--cycles", type=int, default=12)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--all-threads", action="store_true", help="also DebugMode(record_all_threads=True)")
    a = p.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("backward_thread_cost.py needs CUDA (on CPU the backward runs on the calling thread)")
    blocks, d, heads, shape = STEP_SIZES["cuda"]
    torch.manual_seed(0)
    model = Transformer(blocks, d, heads).cuda()
    x = torch.randn(*shape, d, device="cuda")
    compiled = torch.compile(model)

    def fwdbwd():
        model.zero_grad(set_to_none=True)
        compiled(x).float().pow(2).mean().backward()

    def fwd():
        with torch.no_grad():
            compiled(x)

    def one_thread():
        with torch.autograd.set_multithreading_enabled(False):
            fwdbwd()

    workloads = {"fwd+bwd (backward on autograd's device thread)": fwdbwd, "fwd only (no_grad)": fwd,
                 "fwd+bwd, backward on the calling thread": one_thread}
    for f in workloads.values():
        for _ in range(4):
            f()
    modes = {"untraced": lambda: None,
             "kernels_only": lambda: DebugMode(kernels_only=True, ring_capacity=1 << 16, overflow="overwrite")}
    if a.all_threads:
        modes["kernels_only, record_all_threads"] = lambda: DebugMode(
            kernels_only=True, record_all_threads=True, ring_capacity=1 << 16, overflow="overwrite")

    def timed(f, ctx):
        torch.cuda.synchronize()
        t = time.perf_counter()
        if ctx is None:
            for _ in range(a.steps):
                f()
        else:
            with ctx:
                for _ in range(a.steps):
                    f()
        torch.cuda.synchronize()
        return (time.perf_counter() - t) * 1e3 / a.steps

    print(f"Transformer{(blocks, d, heads)} on {tuple(shape)}; {a.cycles} shuffled cycles x {a.steps} steps; "
          f"torch {torch.__version__}")
    print("| workload | mode | ms / step | x untraced | median paired ratio |")
    print("|---|---|---|---|---|")
    for name, f in workloads.items():
        t = {m: [] for m in modes}
        for c in range(a.cycles):
            order = list(modes)
            random.Random(c).shuffle(order)
            for m in order:
                t[m].append(timed(f, modes[m]()))
        base = statistics.median(t["untraced"])
        for m, v in t.items():
            med = statistics.median(v)
            paired = statistics.median(b / u for u, b in zip(t["untraced"], v))
            print(f"| {name} | {m} | {med:.3f} | {med / base:.3f} | {paired:.3f} |")


if __name__ == "__main__":
    main()
