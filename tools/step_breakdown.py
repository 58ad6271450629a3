"""Which layer of recording costs what on the training step, host and GPU apart.

    python tools/step_breakdown.py [--device cuda] [--rounds 6] [--steps 8]

Variants, interleaved by round so that drift hits them alike: the untraced
step; a do-nothing TorchDispatchMode; kdebug's kernel hook alone
(DebugMode(kernels_only=True)); kdebug's dispatch mode alone
(record_triton_kernels=False); DebugMode(); DebugMode() + log_tensor_hashes();
upstream's DebugMode().  For each: median ms per step with the final
synchronization ("wall"), the host time until the step returned ("host"), and
the GPU time between events recorded before and after the step ("gpu"), and
the garbage collector's runs and time per step.  Then the aten ops one step
sends through a dispatch mode, per thread.
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import gc
import statistics
import threading
import time

import torch

import kdebug
from kdebug import _upstream
from kdebug.workloads import NullDispatchMode, transformer_step

p = argparse.ArgumentParser()
p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
p.add_argument("--rounds", type=int, default=6)
p.add_argument("--steps", type=int, default=8)
p.add_argument("--only", default="", help="comma-separated variant names (default: all)")
a = p.parse_args()
dev = a.device
cuda = dev == "cuda"
sync = torch.cuda.synchronize if cuda else (lambda: None)


class Counting(NullDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[(threading.current_thread().name, str(func))] += 1
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def nested(*makers):
    with contextlib.ExitStack() as st:
        for m in makers:
            st.enter_context(m())
        yield


K = kdebug.DebugMode
VARIANTS = {
    "untraced": contextlib.nullcontext,
    "trivial dispatch mode": NullDispatchMode,
    "kdebug kernels_only": lambda: K(kernels_only=True),
    "kdebug dispatch only": lambda: K(record_triton_kernels=False),
    "kdebug DebugMode()": K,
    "kdebug + log_tensor_hashes()": lambda: nested(K, K.log_tensor_hashes),
    "upstream DebugMode()": _upstream.DebugMode,
}
if a.only:
    VARIANTS = {k: v for k, v in VARIANTS.items() if k in a.only.split(",") or k == "untraced"}

step, x = transformer_step(dev)


_gc = {"n": [0, 0, 0], "s": [0.0, 0.0, 0.0], "t0": 0.0}


def _on_gc(phase, info):
    if phase == "start":
        _gc["t0"] = time.perf_counter()
    else:
        g = info["generation"]
        _gc["n"][g] += 1
        _gc["s"][g] += time.perf_counter() - _gc["t0"]


def one(make):
    sync()
    if cuda:
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0 = time.perf_counter()
    with make():
        if cuda:
            e0.record()
        step(x)
        if cuda:
            e1.record()
        t1 = time.perf_counter()
    sync()
    t2 = time.perf_counter()
    return (t2 - t0) * 1e3, (t1 - t0) * 1e3, e0.elapsed_time(e1) if cuda else float("nan")


for make in VARIANTS.values():  # warm-up: compiles whatever a mode makes dynamo compile
    one(make)
    one(make)
res = {k: ([], [], []) for k in VARIANTS}
gcs = {k: [[0, 0, 0], [0.0, 0.0, 0.0]] for k in VARIANTS}
gc.callbacks.append(_on_gc)
for _ in range(a.rounds):
    for name, make in VARIANTS.items():
        _gc["n"], _gc["s"] = [0, 0, 0], [0.0, 0.0, 0.0]
        for _ in range(a.steps):
            for lst, v in zip(res[name], one(make)):
                lst.append(v)
        for g in range(3):
            gcs[name][0][g] += _gc["n"][g]
            gcs[name][1][g] += _gc["s"][g]
gc.callbacks.remove(_on_gc)

base = statistics.median(res["untraced"][0])
print(f"{dev}, torch {torch.__version__}: median ms per step over {a.rounds} x {a.steps}")
print(f"{'variant':32s} {'wall':>7s} {'x':>5s} {'host':>7s} {'gpu':>7s}   gc runs per step (gen 0/1/2), gc ms per step")
nsteps = a.rounds * a.steps
for name, (wall, host, gpu) in res.items():
    w = statistics.median(wall)
    runs = "/".join(f"{n / nsteps:.2f}" for n in gcs[name][0])
    print(f"{name:32s} {w:7.2f} {w / base:5.2f} {statistics.median(host):7.2f} {statistics.median(gpu):7.2f}"
          f"   {runs}  {sum(gcs[name][1]) / nsteps * 1e3:.3f}")

c = Counting()
with c:
    step(x)
sync()
per_thread = collections.Counter()
for (th, _), n in c.ops.items():
    per_thread[th] += n
print("\naten ops per step through a dispatch mode, per thread:", dict(per_thread))
for (th, op), n in c.ops.most_common(25):
    print(f"  {n:4d}  {th:12s} {op}")
