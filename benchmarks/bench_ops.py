"""What recording aten ops costs, per path, on a compiled transformer step
(kdebug.workloads.transformer_step: forward + backward; CPU by default).

Configurations (each a whole step; --n x --rounds steps each, interleaved one
step at a time; min and median reported, and the paired ratio: the median over
iterations of a step's time over the untraced / null-mode step run next to it):
  untraced           no recording
  null_mode          a do-nothing Python TorchDispatchMode (the floor of any Python op recording)
  upstream           torch.utils._debug_mode.DebugMode()
  kdebug_py          kdebug.DebugMode() (the Python dispatch mode path, upstream parity)
  kdebug_cpp         kdebug.DebugMode(op_path="c++") (Note [C++ op observer])
  ko_hash            DebugMode(kernels_only=True) + log_tensor_hashes()
  ko_extern_hash     DebugMode(kernels_only=True, record_extern_ops=True) + log_tensor_hashes()

With --loop K, each configuration is also timed entered once around K steps
(as a recording is used around a training loop, without the per-step cost of
making, entering and leaving it), --n rounds in a rotated order.

    python benchmarks/bench_ops.py [--device cpu] [--n 30] [--loop 10] [--out benchmarks/results/ops_cpu.json]
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time

import torch
import torch.utils._debug_mode as upstream

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import kdebug  # noqa: E402
from kdebug.workloads import NullDispatchMode, transformer_step  # noqa: E402

K = kdebug.DebugMode


def _configs():
    return {
        "untraced": lambda: contextlib.nullcontext(),
        "null_mode": lambda: NullDispatchMode(),
        "upstream": lambda: upstream.DebugMode(),
        "kdebug_py": lambda: K(),
        "kdebug_cpp": lambda: K(op_path="c++"),
        "ko_hash": lambda: _both(K(kernels_only=True), K.log_tensor_hashes()),
        "ko_extern_hash": lambda: _both(K(kernels_only=True, record_extern_ops=True), K.log_tensor_hashes()),
    }


@contextlib.contextmanager
def _both(a, b):
    with a as m, b:
        yield m


def per_op_us(n_ops: int = 2000, repeats: int = 15) -> dict:
    """Per-op overhead of each op path on eager CPU ops (torch.add of two
    4-element tensors, n_ops per repeat): the minimum over repeats of the
    time per op, less the untraced time per op.  Isolates the recording
    path from the step's compute, which on a shared CPU machine drowns it."""
    a, b = torch.randn(4), torch.randn(4)
    cfgs = {"untraced": contextlib.nullcontext, "null_mode": NullDispatchMode,
            "upstream": upstream.DebugMode, "kdebug_py": K, "kdebug_cpp": lambda: K(op_path="c++")}
    best = {k: float("inf") for k in cfgs}
    for _ in range(repeats):
        for name, make in cfgs.items():
            with make():
                t0 = time.perf_counter()
                for _ in range(n_ops):
                    torch.add(a, b)
                best[name] = min(best[name], (time.perf_counter() - t0) / n_ops * 1e6)
    return {k: {"us_per_op": round(v, 3), "overhead_us": round(v - best["untraced"], 3)} for k, v in best.items()}


def _paired(ts: list, ref: list) -> float:
    """The median over iterations of a time over the reference's time of the
    same iteration, run next to it."""
    return round(statistics.median(t / u for t, u in zip(ts, ref)), 3)


def _loops(step, x, cfgs, device, k: int, rounds: int) -> dict:
    """Each configuration entered once around k steps (the device synchronized
    before and after), rounds of every configuration in a rotated order:
    ms / step, the median over rounds, and its ratios to the untraced and
    null-mode loops (of the medians, and paired: the median of each round's
    ratio)."""
    names = list(cfgs)
    times = {n: [] for n in names}
    for r in range(rounds + 1):
        order = names[r % len(names):] + names[:r % len(names)]
        for name in order:
            _sync(device)
            t0 = time.perf_counter()
            with cfgs[name]():
                for _ in range(k):
                    step(x)
                _sync(device)
            if r:  # round 0 warms each configuration up
                times[name].append((time.perf_counter() - t0) * 1e3 / k)
    out = {}
    for name, ts in times.items():
        row = {"median_ms": round(statistics.median(ts), 3)}
        for ref in ("untraced", "null_mode"):
            row[f"median_x_{ref}"] = round(statistics.median(ts) / statistics.median(times[ref]), 3)
            row[f"paired_x_{ref}"] = _paired(ts, times[ref])
        out[name] = row
    return out


def _sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cpu")
    p.add_argument("--n", type=int, default=30)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", default=None)
    p.add_argument("--loop", type=int, default=0,
                   help="also time each configuration entered once around K steps (how a recording "
                        "is used around a training loop), --n rounds in a rotated order")
    a = p.parse_args(argv)
    step, x = transformer_step(a.device)
    cfgs = _configs()
    times = {k: [] for k in cfgs}
    records = {}
    for name, make in cfgs.items():  # one warm step each (first-use costs: the observer's registration)
        with make():
            step(x)
    # Interleaved one step at a time: on a shared machine, load that comes and
    # goes hits every configuration alike.  The minimum is the cost with the
    # least interference; the median is reported too.
    for _ in range(a.n * a.rounds):
        for name, make in cfgs.items():
            ctx = make()
            _sync(a.device)
            t0 = time.perf_counter()
            with ctx as m:
                step(x)
                _sync(a.device)
            times[name].append((time.perf_counter() - t0) * 1e3)
            if m is not None and hasattr(m, "operators") and name not in records:
                ops = m.operators
                records[name] = {"records": len(ops),
                                 "aten": sum(1 for o in ops if getattr(o, "kind", None) == "aten"
                                             or isinstance(o, upstream._OpCall))}
    table = {}
    for name, ts in times.items():
        table[name] = {"min_ms": round(min(ts), 3), "median_ms": round(statistics.median(ts), 3),
                       **records.get(name, {})}
    for stat in ("min", "median"):
        base, floor = table["untraced"][stat + "_ms"], table["null_mode"][stat + "_ms"]
        for name, row in table.items():
            row[f"{stat}_x_untraced"] = round(row[stat + "_ms"] / base, 3)
            row[f"{stat}_x_null_mode"] = round(row[stat + "_ms"] / floor, 3)
        row = table["ko_extern_hash"]
        row[f"{stat}_x_ko_hash"] = round(row[stat + "_ms"] / table["ko_hash"][stat + "_ms"], 3)
    for name, row in table.items():
        for ref in ("untraced", "null_mode"):
            row[f"paired_x_{ref}"] = _paired(times[name], times[ref])
    for name, row in table.items():
        print(f"{name:16s} min {row['min_ms']:8.2f} ms x{row['min_x_untraced']:.3f} untraced "
              f"x{row['min_x_null_mode']:.3f} null-mode | median {row['median_ms']:8.2f} ms "
              f"x{row['median_x_untraced']:.3f} x{row['median_x_null_mode']:.3f} | paired "
              f"x{row['paired_x_untraced']:.3f} x{row['paired_x_null_mode']:.3f} | "
              f"records={row.get('records', '-')} aten={row.get('aten', '-')}")
    r = table["ko_extern_hash"]
    print(f"ko_extern_hash / ko_hash: min x{r['min_x_ko_hash']:.3f}, median x{r['median_x_ko_hash']:.3f}")
    loops = None
    if a.loop:
        loops = _loops(step, x, cfgs, a.device, a.loop, a.n)
        print(f"entered once around {a.loop} steps ({a.n} rounds, rotated order; ms / step, median over rounds; "
              f"paired: median of the rounds' ratios)")
        for name, row in loops.items():
            print(f"  {name:16s} {row['median_ms']:8.3f} ms x{row['median_x_untraced']:.3f} untraced "
                  f"x{row['median_x_null_mode']:.3f} null-mode | paired x{row['paired_x_untraced']:.3f} "
                  f"x{row['paired_x_null_mode']:.3f}")
    ops = per_op_us()
    for name, row in ops.items():
        print(f"per op {name:12s} {row['us_per_op']:8.3f} us  (+{row['overhead_us']:.3f} us over untraced)")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"device": a.device, "torch": torch.__version__, "steps_per_config": a.n * a.rounds, "load_avg": os.getloadavg(),
                       "workload": "kdebug.workloads.transformer_step (compiled forward + backward)",
                       "table": table, "entered_once": loops and {"steps_per_loop": a.loop, "rounds": a.n, "table": loops},
                       "per_op_eager_add": ops}, f, indent=1)


if __name__ == "__main__":
    main()
