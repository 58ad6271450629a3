"""Whether prefetching the gradients' pointer chains a link at a time for
all parameters (Note [Prefetching the gradients] in csrc/kd_torch.cpp)
makes the flight recorder's gradient record cheaper inside the step, timed
side by side in one process: the untraced step and one recording run with
the prefetch off and on, in a rotated order every round, so that the
host's drift hits every variant alike.
The recording: a FlightRecorder(every=10) attached to the step's eager
AdamW (the transformer + AdamW step of bench_flight.py).

Reported for off and on: ms / step (median over rounds), x untraced, paired x (the
median of each round's ratio), the difference to mask 0 (median of per-round
differences), and the host time of the recorder's own gradient and state
records.  Not a test; no timed assertion.

    python tools/prefetch_ab.py [--device cuda] [--rounds 21] [--steps 10] [--out F.json]
"""
from __future__ import annotations

import argparse
import collections
import json
import statistics
import time

import torch

import kdebug
from kdebug import _C
from kdebug.workloads import STEP_SIZES, adamw_step
from flight_parts import _timed  # (this script's folder, tools/, is on sys.path)


def main(argv=None) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--rounds", type=int, default=21)
    p.add_argument("--steps", type=int, default=10, help="steps per loop")
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    dev = a.device
    blocks, d, _, shape = STEP_SIZES[dev]
    step_x, x, model, opt = adamw_step(dev)
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    masks = {"off": False, "on": True}
    timers = {k: collections.Counter() for k in masks}
    fr = kdebug.FlightRecorder(every=10, trace="/tmp/kdebug_prefetch_ab.kdt")
    handle = fr.attach(opt, model)
    current = {"acc": None}
    grads, records = fr._grads_record, fr._record_replicas

    def grads_record(o):
        return _timed(current["acc"], "gradient record", grads)(o)

    def record_replicas(what, plan):
        return _timed(current["acc"], f"records of {what.split('_')[-1]}", records)(what, plan)
    fr._grads_record, fr._record_replicas = grads_record, record_replicas

    def loop(name: str) -> float:
        sync()
        t0 = time.perf_counter()
        if name == "untraced":
            for _ in range(a.steps):
                step_x(x)
        else:
            was = _C._prefetch_grads(masks[name])
            current["acc"] = timers[name]
            try:
                with fr:
                    for _ in range(a.steps):
                        step_x(x)
                    sync()
            finally:
                _C._prefetch_grads(was)
        sync()
        return (time.perf_counter() - t0) * 1e3 / a.steps

    names = ["untraced", *masks]
    for n in names:
        loop(n)  # warms each variant
    for acc in timers.values():
        acc.clear()
    times = {n: [] for n in names}
    for r in range(a.rounds):
        k = r % len(names)
        for n in names[k:] + names[:k]:
            times[n].append(loop(n))
    handle.remove()
    fr.close()
    base = statistics.median(times["untraced"])
    rows = {}
    print(f"{dev}: transformer {blocks} blocks d={d} batch {shape} + eager AdamW, torch {torch.__version__}; "
          f"FlightRecorder(every=10) attached; {a.rounds} rounds x {a.steps} steps, variants in a rotated order")
    print("| prefetch | ms / step | x untraced | paired x | vs off (median of per-round differences) | records, us / step |")
    print("|---|---|---|---|---|---|")
    print(f"| untraced | {base:.3f} | 1.000 | 1.000 | | |")
    steps = a.rounds * a.steps
    for n in masks:
        med = statistics.median(times[n])
        paired = statistics.median(f / u for f, u in zip(times[n], times["untraced"]))
        vs_off = statistics.median(f - o for f, o in zip(times[n], times["off"]))
        parts = {label: round(ns / steps / 1e3, 1) for label, ns in timers[n].items()}
        rows[n] = {"ms": round(med, 3), "x_untraced": round(med / base, 3), "paired_x": round(paired, 3),
                   "vs_off_us": round(vs_off * 1e3, 1), "records_us_per_step": parts}
        print(f"| {n} | {med:.3f} | {med / base:.3f} | {paired:.3f} | {vs_off * 1e3:+.1f} us | "
              f"{', '.join(f'{k} {v}' for k, v in parts.items()) or '-'} |")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"device": dev, "torch": torch.__version__, "rounds": a.rounds,
                       "steps": a.steps, "untraced_ms": round(base, 3), "rows": rows,
                       "times_ms": times}, f, indent=1)


if __name__ == "__main__":
    main()
