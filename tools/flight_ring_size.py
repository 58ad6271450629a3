"""Does the size of the flight recorder's ring change what it costs a step?

The attached recorder (kdebug.workloads.adamw_step: the transformer step of
benchmarks/bench_flight.py + eager AdamW, every=10) with rings of 2**c
slots for each c of --caps, and the untraced step, timed in one process in
a rotated order each round.  A guess to test was that the ring's writes
(about 1,100 slots of 128 bytes a step) leave the host's caches colder for
the step's own work; a ring that fits in the caches would then cost less.
Not a test; no timed assertion.

    python tools/flight_ring_size.py [--device cuda] [--rounds 25] [--caps 15,16,18,20]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

import kdebug
from kdebug.workloads import adamw_step


def main(argv=None) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--rounds", type=int, default=25)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--caps", default="15,16,18,20", help="ring sizes, as powers of two")
    a = p.parse_args(argv)
    step_x, x, model, opt = adamw_step(a.device)
    sync = torch.cuda.synchronize if a.device == "cuda" else (lambda: None)
    frs = {f"ring 2^{c}": kdebug.FlightRecorder(every=10, trace=f"/tmp/kdebug_ring_{c}.kdt", ring_capacity=1 << int(c))
           for c in a.caps.split(",")}
    handles = [fr.attach(opt, model) for fr in frs.values()]
    names = ["untraced", *frs]

    def loop(n: str) -> float:
        sync()
        t0 = time.perf_counter()
        if n == "untraced":
            for _ in range(a.steps):
                step_x(x)
        else:
            with frs[n]:
                for _ in range(a.steps):
                    step_x(x)
        sync()
        return (time.perf_counter() - t0) * 1e3 / a.steps

    for n in names:
        loop(n)
    times = {n: [] for n in names}
    for r in range(a.rounds):
        k = r % len(names)
        for n in names[k:] + names[:k]:
            times[n].append(loop(n))
    for h in handles:
        h.remove()
    base = statistics.median(times["untraced"])
    print(f"{a.device}: {a.rounds} rounds x {a.steps} steps, torch {torch.__version__}; untraced {base:.3f} ms / step")
    print("| ring | ms / step | x untraced | paired x | early drains | incomplete steps |")
    print("|---|---|---|---|---|---|")
    for n, fr in frs.items():
        med = statistics.median(times[n])
        paired = statistics.median(f / u for f, u in zip(times[n], times["untraced"]))
        print(f"| {n} | {med:.3f} | {med / base:.3f} | {paired:.3f} | {fr.stats['early_drains']} | "
              f"{fr.stats['incomplete_steps']} |")
    for fr in frs.values():
        fr.close()


if __name__ == "__main__":
    main()
