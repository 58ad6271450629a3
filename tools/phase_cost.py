"""Where a recorded launch's host time goes, per launching thread (Note
[Phase timers] in csrc/kd_phase_timers.h): the transformer training step of
tools/flight_cost.py, untraced, DebugMode(kernels_only), with bitwise hashes
batched, and FlightRecorder (never comparing), on a diagnostic build:

    KDEBUG_PHASE_TIMERS=1 python setup.py build_ext --inplace --force
    python tools/phase_cost.py --device cuda [--workload gpu-bound] [--rounds 5] [--steps 20]

Per mode and thread (main: the thread that runs the loop; other: autograd's
device thread, which launches the backward on CUDA): Triton launches the hook
recorded, and µs per launch in kd_launch_begin, in the launch itself (torch's
launcher and the driver), in kd_launch_end; launches while nothing recorded
and µs per such launch; dispatcher ops the C++ write guard saw and µs per op.
Medians of ms per step over interleaved rounds.  Not a test.
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
PHASES = ("begin", "launch", "end", "plain", "guard")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--workload", choices=["transformer", "gpu-bound"], default="transformer")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=20)
    a = p.parse_args()
    try:
        _C._phase_timers(True)
    except RuntimeError as e:
        raise SystemExit(f"phase_cost: {e}")
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

    def ko(hashes):
        def run(n):
            with DebugMode(kernels_only=True):
                if hashes:
                    with DebugMode.log_tensor_hashes("bitwise"):
                        plain(n)
                else:
                    plain(n)
        return run

    fr = kdebug.FlightRecorder(every=10 ** 9, keep_steps=4, trace="/tmp/kdebug_phase_cost.kdt")

    def flight(n):
        with fr:
            for _ in range(n):
                step(x)
                fr.step()

    modes = {"untraced": plain, "kernels_only": ko(False), "ko+bitwise batched": ko(True),
             "flight never compares": flight}
    main_id = threading.main_thread().ident
    times = {k: [] for k in modes}
    acc: dict = {k: {} for k in modes}  # mode -> thread label -> phase -> [count, ns]
    for m in modes.values():
        m(2)
    for _ in range(a.rounds):
        for k, m in modes.items():
            sync()
            _C._phase_timers(True)
            t0 = time.perf_counter()
            m(a.steps)
            sync()
            times[k].append((time.perf_counter() - t0) * 1e3 / a.steps)
            for row in _C._phase_timers(True):
                label = "main" if row["thread"] == main_id else "other"
                per = acc[k].setdefault(label, {ph: [0, 0] for ph in PHASES})
                for ph in PHASES:
                    per[ph][0] += row[ph][0]
                    per[ph][1] += row[ph][1]
    base = statistics.median(times["untraced"])
    steps = a.rounds * a.steps
    print(f"{dev} {a.workload}: {blocks} blocks d={d} batch {shape}; {a.rounds} rounds x {a.steps} steps; torch {torch.__version__}")
    print("| mode | ms / step | x untraced | thread | recorded launches / step | begin µs | launch µs | end µs "
          "| unrecorded launches / step | their µs | guarded ops / step | guard µs |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")

    def us(c_ns):
        c, ns = c_ns
        return f"{ns / c / 1e3:.2f}" if c else "-"

    for k in modes:
        med = statistics.median(times[k])
        for label, per in sorted(acc[k].items()):
            print(f"| {k} | {med:.3f} | {med / base:.3f} | {label} | {per['begin'][0] / steps:.1f} | {us(per['begin'])} "
                  f"| {us(per['launch'])} | {us(per['end'])} | {per['plain'][0] / steps:.1f} | {us(per['plain'])} "
                  f"| {per['guard'][0] / steps:.1f} | {us(per['guard'])} |")


if __name__ == "__main__":
    main()
