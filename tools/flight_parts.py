"""Where an attached FlightRecorder's cost per step goes, split by variants
timed side by side in one process (a rotated order each round):

  untraced   the step (compiled transformer forward + backward, eager AdamW)
  hook       + a recorder, not attached, never comparing: the launch hook alone
  records    + attached to the optimizer, never comparing: the gradient and
             state records (Note [Replica state records]) and their hashes
  compares   + a compare every 10 steps (every=10, the default use)

Each variant's cost is the median over rounds of its loop's time less the
variant above it in the same round (so drift between rounds cancels).
--timers also times the recorder's own calls inside the two attached
variants (host time of the gradient record, the state record, closing the
hash window, step() with its compares), so what a part adds can be set
against what its own code takes.  Not a test; no timed assertion.

    python tools/flight_parts.py [--device cuda] [--rounds 21] [--steps 10] [--timers]

Run on the H200 on 2026-11-28 (docs/flight-recorder.md, "Where it goes
now"), without --timers.
"""
from __future__ import annotations

import argparse
import collections
import statistics
import time

import torch

import kdebug
from kdebug.workloads import STEP_SIZES, adamw_step
NAMES = ("untraced", "hook", "records", "compares")


def _timed(acc: dict, name: str, fn):
    def call(*a, **k):
        t0 = time.perf_counter_ns()
        try:
            return fn(*a, **k)
        finally:
            acc[name] += time.perf_counter_ns() - t0
    return call


def main(argv=None) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--rounds", type=int, default=21)
    p.add_argument("--steps", type=int, default=10, help="steps per loop")
    p.add_argument("--timers", action="store_true", help="also time the recorder's own calls (attached variants)")
    a = p.parse_args(argv)
    dev = a.device
    blocks, d, _, shape = STEP_SIZES[dev]
    step_x, x, model, opt = adamw_step(dev)  # as bench_flight.py's transformer + AdamW, warmed up
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)

    def step():
        step_x(x)
    never = 10 ** 9
    frs = {"hook": kdebug.FlightRecorder(every=never, trace="/tmp/kdebug_parts_hook.kdt"),
           "records": kdebug.FlightRecorder(every=never, trace="/tmp/kdebug_parts_records.kdt"),
           "compares": kdebug.FlightRecorder(every=10, trace="/tmp/kdebug_parts_compares.kdt")}
    handles = [frs[k].attach(opt, model) for k in ("records", "compares")]
    timers = {k: collections.Counter() for k in ("records", "compares")}
    if a.timers:
        for k, acc in timers.items():
            fr = frs[k]
            # instance attributes: the attach hooks call these through self
            for meth, label in (("_grads_record", "gradient record (plan + records)"),
                                ("_state_plan", "state plan"), ("_close_window", "close window"),
                                ("step", "step() with its compares")):
                setattr(fr, meth, _timed(acc, label, getattr(fr, meth)))
            records = fr._record_replicas

            def by_kind(what, plan, _acc=acc, _records=records):  # the records' C calls, by record kind
                return _timed(_acc, f"records of {what.split('_')[-1]}", _records)(what, plan)
            fr._record_replicas = by_kind

    def loop(name: str) -> float:
        sync()
        t0 = time.perf_counter()
        if name == "untraced":
            for _ in range(a.steps):
                step()
        else:
            fr = frs[name]
            with fr:
                for _ in range(a.steps):
                    step()
                    if name == "hook":
                        fr.step()  # not attached: the step ends by hand
        sync()
        return (time.perf_counter() - t0) * 1e3 / a.steps

    for n in NAMES[1:]:
        loop(n)  # installs the hooks, warms each recorder
    for acc in timers.values():
        acc.clear()
    times = {n: [] for n in NAMES}
    for r in range(a.rounds):
        k = r % len(NAMES)
        for n in NAMES[k:] + NAMES[:k]:
            times[n].append(loop(n))
    for h in handles:
        h.remove()
    for fr in frs.values():
        fr.close()
    base = statistics.median(times["untraced"])
    print(f"{dev}: transformer {blocks} blocks d={d} batch {shape} + eager AdamW, torch {torch.__version__}; "
          f"{a.rounds} rounds x {a.steps} steps, variants in a rotated order")
    print("| variant | ms / step | x untraced | paired x | added over the line above (median of per-round differences) |")
    print("|---|---|---|---|---|")
    print(f"| untraced | {base:.3f} | 1.000 | 1.000 | |")
    for prev, n in zip(NAMES, NAMES[1:]):
        med = statistics.median(times[n])
        paired = statistics.median(f / u for f, u in zip(times[n], times["untraced"]))
        added = statistics.median(f - u for f, u in zip(times[n], times[prev]))
        print(f"| {n} | {med:.3f} | {med / base:.3f} | {paired:.3f} | {added * 1e3:+.0f} us |")
    if a.timers:
        steps = a.rounds * a.steps
        for k, acc in timers.items():
            parts = ", ".join(f"{label} {ns / steps / 1e3:.1f}" for label, ns in acc.items())
            print(f"{k}: host time of the recorder's calls, us / step: {parts}")


if __name__ == "__main__":
    main()
