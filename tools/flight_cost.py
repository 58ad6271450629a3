"""Where FlightRecorder's cost per step goes, side by side in one process:
untraced, DebugMode(kernels_only) alone, with log_tensor_hashes("bitwise")
batched (the C++ write guard, Note [C++ write guard]) and one hash per kernel
(batch_gpu_work=False), and FlightRecorder (every=10 and never comparing).

    python tools/flight_cost.py --device cuda [--workload gpu-bound] [--rounds 7] [--steps 20] [--phases]

Median ms / step over interleaved rounds (wall time, the device synchronized
at each loop's start and end), and hash kernel launches per step (kdebug's
counters: batched + one at a time).  Not a test.

--phases (a diagnostic build: KDEBUG_PHASE_TIMERS=1 python setup.py
build_ext --inplace --force; Note [Phase timers] in csrc/kd_phase_timers.h)
adds, per mode and launching thread (main: the loop's thread; other:
autograd's device thread, which launches the backward on CUDA), the Triton
launches the hook recorded and µs per launch in kd_launch_begin, in the
launch itself, in kd_launch_end; launches while nothing recorded and µs per
such launch; dispatcher ops the C++ write guard saw and µs per op; and
parts of begin per launch: finding the recorder and the kernel's info,
describing the arguments, reserving and filling the ring.
"""
from __future__ import annotations

import argparse
import statistics
import threading
import time

import torch

import kdebug
from kdebug import DebugMode, _C
from kdebug.workloads import Transformer, train_step_fn

SIZES = {("cuda", "transformer"): (4, 512, 8, (8, 256)), ("cuda", "gpu-bound"): (4, 1024, 16, (32, 512)),
         ("cpu", "transformer"): (2, 128, 4, (4, 64)), ("cpu", "gpu-bound"): (2, 256, 4, (8, 128))}
PHASES = ("begin", "launch", "end", "plain", "guard", "find", "describe", "ring", "pre", "wguard", "after", "publish", "flush", "enqueue")  # Note [Phase timers]


def add_phases(acc: dict) -> None:
    """Adds (and resets) the phase timers into acc[thread label][phase] = [count, ns]."""
    main_id = threading.main_thread().ident
    for row in _C._phase_timers(True):
        per = acc.setdefault("main" if row["thread"] == main_id else "other", {ph: [0, 0] for ph in PHASES})
        for ph in PHASES:
            per[ph][0] += row[ph][0]
            per[ph][1] += row[ph][1]


def print_phases(times: dict, phases: dict, base: float, steps: int) -> None:
    print("\n| mode | ms / step | x untraced | thread | recorded launches / step | begin µs | launch µs | end µs "
          "| unrecorded launches / step | their µs | guarded ops / step | guard µs | of begin: find µs | describe µs "
          "| ring µs |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")

    def us(c_ns):
        c, ns = c_ns
        return f"{ns / c / 1e3:.2f}" if c else "-"

    for k, acc in phases.items():
        med = statistics.median(times[k])
        for label, per in sorted(acc.items()):
            print(f"| {k} | {med:.3f} | {med / base:.3f} | {label} | {per['begin'][0] / steps:.1f} | {us(per['begin'])} "
                  f"| {us(per['launch'])} | {us(per['end'])} | {per['plain'][0] / steps:.1f} | {us(per['plain'])} "
                  f"| {per['guard'][0] / steps:.1f} | {us(per['guard'])} | {us(per['find'])} | {us(per['describe'])} "
                  f"| {us(per['ring'])} |")
    print("\nParts (per step: count x µs each): pre = begin before describing (hash settings, the queue's "
          "stream guard); wguard = the launch's writes checked against the queue; after = end's hashing; "
          "publish = end's merge and queueing; flush = the queue's hash launches; enqueue = of flush, the hash kernel's launch")
    for k, acc in phases.items():
        for label, per in sorted(acc.items()):
            parts = "  ".join(f"{ph} {per[ph][0] / steps:.1f}x{us(per[ph])}" for ph in PHASES[8:])
            print(f"  {k} / {label}: {parts}")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--workload", choices=["transformer", "gpu-bound"], default="transformer")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--phases", action="store_true", help="per-thread phase timers (a diagnostic build)")
    a = p.parse_args()
    if a.phases:
        try:
            _C._phase_timers(True)
        except RuntimeError as e:
            raise SystemExit(f"flight_cost: {e}")
    dev = a.device
    blocks, d, heads, shape = SIZES[(dev, a.workload)]
    torch.manual_seed(0)
    model = Transformer(blocks, d, heads).to(dev)
    x = torch.randn(*shape, d, device=dev)
    step = train_step_fn(model)
    for _ in range(5):
        step(x)
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)

    def plain(n):
        for _ in range(n):
            step(x)

    def ko(hashes, batch=True):
        def run(n):
            with DebugMode(kernels_only=True, batch_gpu_work=batch):
                if hashes:
                    with DebugMode.log_tensor_hashes("bitwise"):
                        plain(n)
                else:
                    plain(n)
        return run

    def flight(every):
        # hashes="all": no optimizer is attached; every kernel hashed, as measured before hashes= existed
        fr = kdebug.FlightRecorder(every=every, keep_steps=4, trace="/tmp/kdebug_flight_cost.kdt", hashes="all")

        def run(n):
            with fr:
                for _ in range(n):
                    step(x)
                    fr.step()
        return run

    modes = {"untraced": plain, "kernels_only": ko(False), "ko+bitwise batched": ko(True),
             "ko+bitwise per kernel": ko(True, batch=False), "flight every=10": flight(10),
             "flight never compares": flight(10 ** 9)}
    times = {k: [] for k in modes}
    counts = {k: [0, 0] for k in modes}  # hash kernel launches, steps
    phases: dict = {k: {} for k in modes}
    for m in modes.values():
        m(2)
    for _ in range(a.rounds):
        for k, m in modes.items():
            s0 = _C.defer_stats()
            sync()
            if a.phases:
                _C._phase_timers(True)
            t0 = time.perf_counter()
            m(a.steps)
            sync()
            times[k].append((time.perf_counter() - t0) * 1e3 / a.steps)
            if a.phases:
                add_phases(phases[k])
            s1 = _C.defer_stats()
            counts[k][0] += (s1["hash_launches"] - s0["hash_launches"]) + \
                (s1["direct_hash_launches"] - s0["direct_hash_launches"])
            counts[k][1] += a.steps
    base = statistics.median(times["untraced"])
    print(f"{dev} {a.workload}: {blocks} blocks d={d} batch {shape}; {a.rounds} rounds x {a.steps} steps")
    print("| mode | ms / step | x untraced | min ms | hash kernel launches / step |")
    print("|---|---|---|---|---|")
    for k, v in times.items():
        m = statistics.median(v)
        print(f"| {k} | {m:.3f} | {m / base:.3f} | {min(v):.3f} | {counts[k][0] / counts[k][1]:.1f} |")
    if a.phases:
        print_phases(times, phases, base, a.rounds * a.steps)


if __name__ == "__main__":
    main()
