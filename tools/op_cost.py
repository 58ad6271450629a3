"""Host cost per aten op of each recording layer, on small tensors.

    python tools/op_cost.py [--device cuda] [--ops 3000] [--rounds 7]

A loop of small ops (mm, add, relu_, sum, clone, copy_) runs with no mode, a
do-nothing TorchDispatchMode, upstream's DebugMode, kdebug's DebugMode, and
kdebug's with log_tensor_hashes() / hash_inputs=True / record_outputs(), and
kdebug's kernels_only=True without and with record_extern_ops=True (its C++
op observer; outside compiled graph calls it only counts op depth).
Prints the best-of-rounds microseconds per op for each, interleaved by round so
that drift hits every variant alike.
"""
import argparse
import contextlib
import time

import torch

import kdebug
from kdebug import _upstream
from kdebug.workloads import NullDispatchMode

p = argparse.ArgumentParser()
p.add_argument("--device", default="cpu")
p.add_argument("--ops", type=int, default=3000)
p.add_argument("--rounds", type=int, default=7)
a = p.parse_args()
dev = a.device
sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)

x = torch.randn(8, 8, device=dev)
y = torch.randn(8, 8, device=dev)
buf = torch.empty(8, 8, device=dev)
PER = 6


def body(n):
    for _ in range(n // PER):
        z = torch.mm(x, y)
        z = z + y
        z.relu_()
        z.sum()
        w = z.clone()
        buf.copy_(w)


K = kdebug.DebugMode
VARIANTS = {
    "none": lambda: contextlib.nullcontext(),
    "trivial mode": NullDispatchMode,
    "upstream DebugMode": lambda: _upstream.DebugMode(),
    "kdebug DebugMode": lambda: K(),
    "kdebug + hashes": lambda: _nested(K(), K.log_tensor_hashes),
    "kdebug + hash_inputs": lambda: _nested(K(), lambda: K.log_tensor_hashes(hash_inputs=True)),
    "kdebug + record_outputs": lambda: _nested(K(), K.record_outputs),
    # no Python mode: what these eager ops (outside any compiled graph) pay for kdebug's C++ op observer
    "kdebug kernels_only": lambda: K(kernels_only=True),
    "kdebug ko + extern ops": lambda: K(kernels_only=True, record_extern_ops=True),
}


@contextlib.contextmanager
def _nested(outer, inner):
    with outer, inner():
        yield


def run(make):
    sync()
    t0 = time.perf_counter()
    with make():
        body(a.ops)
    sync()
    return (time.perf_counter() - t0) / a.ops * 1e6


for make in VARIANTS.values():
    run(make)
best = {k: float("inf") for k in VARIANTS}
for _ in range(a.rounds):
    for k, make in VARIANTS.items():
        best[k] = min(best[k], run(make))
base = best["none"]
print(f"device {dev}, {a.ops} ops, best of {a.rounds} rounds")
for k, v in best.items():
    print(f"{k:26s} {v:7.2f} us/op   +{v - base:6.2f} over none")
