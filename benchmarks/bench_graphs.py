"""Cost of recording CUDA-graph replays (Note [CUDA graph replays]): a
compiled transformer step under mode="reduce-overhead", replayed untraced and
recorded with hashes (kernels_only=True + log_tensor_hashes("bitwise"); the
graph's own hash kernels, one slot-setting kernel per replay), interleaved
rounds, one synchronization per loop.

    python benchmarks/bench_graphs.py [--rounds 7] [--steps 50] [--json P]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--d", type=int, default=512)
    p.add_argument("--json")
    args = p.parse_args(argv)
    import kdebug
    from kdebug.workloads import Transformer

    torch.manual_seed(0)
    model = Transformer(4, args.d, 8).cuda().eval()
    x = torch.randn(8, 256, args.d, device="cuda")
    f = torch.compile(model, mode="reduce-overhead")
    K = kdebug.DebugMode

    def loop(n):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.no_grad():
            for _ in range(n):
                f(x)
        torch.cuda.synchronize()
        return (time.perf_counter() - t0) * 1e3 / n

    dm = K(kernels_only=True, ring_capacity=1 << 20)
    with dm, K.log_tensor_hashes("bitwise"):  # warm-up and capture under kdebug
        loop(5)
    plain, rec = [], []
    for _ in range(args.rounds):
        plain.append(loop(args.steps))
        dm = K(kernels_only=True, ring_capacity=1 << 20)
        with dm, K.log_tensor_hashes("bitwise"):
            rec.append(loop(args.steps))
        st = dm.kernel_stats
    (g,) = [g for g in dm.cuda_graphs if g.replays]
    a, b = statistics.median(plain), statistics.median(rec)
    print(f"reduce-overhead transformer (4 blocks, d={args.d}, batch (8, 256)), torch {torch.__version__}: "
          f"graph with {g.launches} recorded launches, {g.hashes} hashes/replay, {g.kernel_nodes} kernel nodes")
    print("| mode | ms / replay | x plain |")
    print("|---|---|---|")
    print(f"| plain replay | {a:.3f} | 1.000 |")
    print(f"| recorded, bitwise hashes | {b:.3f} | {b / a:.3f} |")
    print(f"complete={st['complete']}, replays recorded in the last round: {st['cuda_graph_replays']}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"plain_ms": plain, "recorded_ms": rec, "ratio": b / a, "launches": g.launches,
                       "hashes": g.hashes, "kernel_nodes": g.kernel_nodes, "torch": torch.__version__}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
