"""Host cost of the flight recorder's replica records, per tensor, with
records made in one pass (Note [Records made in one pass] in
csrc/kd_launch.c) and with the launch path's two calls
(kdebug.testing.two_call_records), alternated in one process so that the
host's drift between runs does not decide the comparison.

The records are those of the AdamW benchmark step (kdebug.workloads.
adamw_step: the gradients and the parameters + optimizer state of a small
transformer), made the way an attached FlightRecorder makes them each step
(FlightRecorder._grads_record's plan, _record_replicas of the state plan),
in a loop of their own: warm caches, so this measures the code's own work,
not what it costs inside a training step (docs/flight-recorder.md says why
those differ).  Each round times --iters iterations of every variant in a
rotated order; reported: the median over rounds of µs per recorded tensor.
Not a test; no timed assertion.

    python tools/replica_record_cost.py [--device cuda] [--rounds 7] [--iters 300]
"""
from __future__ import annotations

import argparse
import contextlib
import statistics
import time

import torch

import kdebug
from kdebug import testing
from kdebug.workloads import adamw_step


def main(argv=None) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--iters", type=int, default=300)
    a = p.parse_args(argv)
    step, x, model, opt = adamw_step(a.device)
    fr = kdebug.FlightRecorder(every=10 ** 9, keep_steps=4, trace="/tmp/kdebug_replica_record_cost.kdt")
    fr.attach(opt, model)
    sync = torch.cuda.synchronize if a.device == "cuda" else (lambda: None)
    variants = {}
    with fr:
        for _ in range(3):
            step(x)
        sync()
        state = fr._state_plan(opt)
        grads = fr._grads_plan(opt)
        n_state = sum(len(t) for _, t, _ in state[0])
        n_grads = sum(len(t) for _, t, _ in grads[0])

        def loop(two_call: bool, hashed: bool) -> float:
            ctx = testing.two_call_records() if two_call else contextlib.nullcontext()
            total = 0
            with ctx:
                for i in range(a.iters):
                    if hashed:
                        fr._open_window()
                    t0 = time.perf_counter_ns()
                    fr._record_replicas("kdebug::flight_grads", grads)
                    fr._record_replicas("kdebug::flight_state", state)
                    total += time.perf_counter_ns() - t0
                    if hashed:
                        fr._close_window()
                    if i % 20 == 19:  # as a compare would: results handed over, launches dropped
                        fr._rec.settle(wait=True)
                        fr._rec.discard(fr._rec.seen)
            sync()
            return total / a.iters / (n_state + n_grads) / 1e3

        names = [(f"{'two calls' if two else 'one pass'}, {'bitwise hash' if hashed else 'no hash'}", two, hashed)
                 for hashed in (False, True) for two in (False, True)]
        for r in range(a.rounds):
            order = names[r % len(names):] + names[:r % len(names)]
            for name, two, hashed in order:
                variants.setdefault(name, []).append(loop(two, hashed))
    print(f"{a.device}: {n_grads} gradients + {n_state} state tensors per iteration, "
          f"{a.rounds} rounds x {a.iters} iterations, torch {torch.__version__}")
    print("| variant | µs per tensor (median of rounds) | min | max |")
    print("|---|---|---|---|")
    for name, v in variants.items():
        print(f"| {name} | {statistics.median(v):.3f} | {min(v):.3f} | {max(v):.3f} |")


if __name__ == "__main__":
    main()
