"""Cost of kdebug's kernel recording, side by side with the untraced compiled
run and with upstream torch.utils._debug_mode.DebugMode, in one process.

    python benchmarks/bench_record.py --device cpu          # C++ kernels
    python benchmarks/bench_record.py --device cuda         # Triton kernels (INDUCTOR-NOTES workload)

Workload: a compiled transformer (pre-norm blocks), forward + backward per step.
Each mode runs in rounds (interleaved, so drift hits all modes alike); the
reported figure is the median step time over all rounds.  Also measured: the
per-launch work of the C hook itself (a C++-kernel wrapper around a no-op C
function, recording vs not) and the step time with hooks installed but no
DebugMode active.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import timeit

import torch


def _sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def time_steps(step, x, device, n):
    out = []
    for _ in range(n):
        _sync(device)
        t0 = time.perf_counter()
        step(x)
        _sync(device)
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def hook_cost_ns(n=200_000):
    """Per-call cost of the C hook: a CppKernel wrapper around "".format (a C
    function that takes any arguments and does nothing with them) called with
    8 tensor args + 1 int, minus the cost of calling "".format directly."""
    import kdebug
    from kdebug import _C

    args = tuple(torch.empty(64, 32) for _ in range(8)) + (2048,)
    info = _C.KernelInfo(_C.KIND_CPP, "bench_kernel", [f"in_ptr{i}" for i in range(8)] + ["xnumel"],
                         [1] * 8 + [1], 0, -1)
    noop = "".format
    wrapped = _C.CppKernel(noop, info)
    raw = min(timeit.repeat(lambda: noop(*args), number=n, repeat=5)) / n
    idle = min(timeit.repeat(lambda: wrapped(*args), number=n, repeat=5)) / n
    # a ring that stays in memory already touched: steady state, not first-touch page faults
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", kdebug.KdebugWarning)  # the ring overflows on purpose
        with kdebug.DebugMode(kernels_only=True, ring_capacity=1 << 14, overflow="overwrite") as dm:
            wrapped(*args)
            rec = min(timeit.repeat(lambda: wrapped(*args), number=n, repeat=5)) / n
        assert dm.kernel_stats["launches"] > 0
    return {"raw_call_ns": raw * 1e9, "hook_idle_ns": (idle - raw) * 1e9,
            "hook_recording_ns": (rec - raw) * 1e9}


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=10, help="steps per mode per round")
    p.add_argument("--json", help="write results here")
    p.add_argument("--blocks", type=int, default=None)
    p.add_argument("--d", type=int, default=None)
    args = p.parse_args(argv)
    dev = args.device
    from kdebug.workloads import Transformer, train_step_fn

    if dev == "cuda":  # INDUCTOR-NOTES workload: 4 blocks, d=512, 8 heads, B8 T256, fp32
        blocks, d, heads, shape = args.blocks or 4, args.d or 512, 8, (8, 256)
    else:
        blocks, d, heads, shape = args.blocks or 2, args.d or 128, 4, (4, 64)
    torch.manual_seed(0)
    model = Transformer(blocks, d, heads).to(dev)
    x = torch.randn(*shape, d, device=dev)
    step = train_step_fn(model)
    for _ in range(3 + args.steps):
        step(x)
    _sync(dev)

    # untraced, before any kdebug hook exists in the process
    pre = time_steps(step, x, dev, args.rounds * args.steps)

    import kdebug
    from torch.utils._debug_mode import DebugMode as UpstreamDebugMode

    with kdebug.DebugMode(kernels_only=True) as probe:  # installs the hooks
        step(x)
    launches = probe.kernel_stats["launches"]

    def run_in(mode_factory):
        def go(n):
            if mode_factory is None:
                return time_steps(step, x, dev, n)
            times = []
            for _ in range(n):
                with mode_factory():
                    t = time_steps(step, x, dev, 1)
                times += t
            return times
        return go

    modes = {
        "untraced (hooks installed)": run_in(None),
        "kdebug kernels_only": run_in(lambda: kdebug.DebugMode(kernels_only=True)),
        "kdebug DebugMode()": run_in(lambda: kdebug.DebugMode()),
        "upstream DebugMode()": run_in(lambda: UpstreamDebugMode()),
    }
    results = {k: [] for k in modes}
    for _ in range(args.rounds):
        for name, go in modes.items():
            go(1)  # warm this mode
            results[name] += go(args.steps)
    base = statistics.median(results["untraced (hooks installed)"])
    table = [("untraced (no kdebug hooks)", statistics.median(pre))]
    table += [(k, statistics.median(v)) for k, v in results.items()]
    hook = hook_cost_ns()
    up = statistics.median(results["upstream DebugMode()"])
    kd = statistics.median(results["kdebug DebugMode()"])
    print(f"\n{dev}: {blocks} blocks d={d} batch {shape}, fwd+bwd, {launches} Inductor launches/step, "
          f"torch {torch.__version__}")
    print("| mode | ms / step | x untraced |")
    print("|---|---|---|")
    for name, ms in table:
        print(f"| {name} | {ms:.2f} | {ms / base:.3f} |")
    print(f"\nkdebug DebugMode() overhead / upstream DebugMode() overhead: "
          f"{(kd - base) / max(up - base, 1e-9):.3f}")
    print(f"C hook per launch: {hook['hook_recording_ns']:.0f} ns recording, "
          f"{hook['hook_idle_ns']:.0f} ns with no DebugMode (call itself {hook['raw_call_ns']:.0f} ns)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": dev, "launches_per_step": launches, "table": table,
                       "raw": {k: v for k, v in results.items()}, "pre_install": pre,
                       "hook": hook, "torch": torch.__version__}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
