"""What recording aten ops costs, per path, on a compiled transformer step
(kdebug.workloads.transformer_step: forward + backward; CPU by default).

Configurations (each a whole step, median of --n steps, interleaved rounds):
  untraced           no recording
  null_mode          a do-nothing Python TorchDispatchMode (the floor of any Python op recording)
  upstream           torch.utils._debug_mode.DebugMode()
  kdebug_py          kdebug.DebugMode() (the Python dispatch mode path, upstream parity)
  kdebug_cpp         kdebug.DebugMode(op_path="c++") (Note [C++ op observer])
  ko_hash            DebugMode(kernels_only=True) + log_tensor_hashes()
  ko_extern_hash     DebugMode(kernels_only=True, record_extern_ops=True) + log_tensor_hashes()

    python benchmarks/bench_ops.py [--device cpu] [--n 30] [--out benchmarks/results/ops_cpu.json]
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


def _sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cpu")
    p.add_argument("--n", type=int, default=30)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    step, x = transformer_step(a.device)
    cfgs = _configs()
    times = {k: [] for k in cfgs}
    records = {}
    for _ in range(a.rounds):  # interleaved: drift hits every configuration alike
        for name, make in cfgs.items():
            for _ in range(a.n):
                ctx = make()
                _sync(a.device)
                t0 = time.perf_counter()
                with ctx as m:
                    step(x)
                    _sync(a.device)
                times[name].append((time.perf_counter() - t0) * 1e3)
            if m is not None and hasattr(m, "operators"):
                ops = m.operators
                records[name] = {"records": len(ops),
                                 "aten": sum(1 for o in ops if getattr(o, "kind", None) == "aten"
                                             or isinstance(o, upstream._OpCall))}
    base = statistics.median(times["untraced"])
    floor = statistics.median(times["null_mode"])
    table = {}
    for name, ts in times.items():
        med = statistics.median(ts)
        table[name] = {"median_ms": round(med, 3), "x_untraced": round(med / base, 3),
                       "x_null_mode": round(med / floor, 3), **records.get(name, {})}
    ko = table["ko_hash"]["median_ms"]
    table["ko_extern_hash"]["x_ko_hash"] = round(table["ko_extern_hash"]["median_ms"] / ko, 3)
    for name, row in table.items():
        print(f"{name:16s} {row['median_ms']:9.3f} ms  x{row['x_untraced']:.3f} untraced  "
              f"x{row['x_null_mode']:.3f} null-mode  records={row.get('records', '-')} aten={row.get('aten', '-')}")
    print(f"ko_extern_hash / ko_hash: x{table['ko_extern_hash']['x_ko_hash']:.3f}")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"device": a.device, "torch": torch.__version__, "steps_per_config": a.n * a.rounds,
                       "workload": "kdebug.workloads.transformer_step (compiled forward + backward)",
                       "table": table}, f, indent=1)


if __name__ == "__main__":
    main()
