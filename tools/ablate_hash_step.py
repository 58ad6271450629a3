"""Host-time ablation of log_tensor_hashes() on the GPU transformer step:
median ms/step with the kernel hashing switched off, to see what it costs
(not a correctness mode: the switched-off variant records less).

    python tools/ablate_hash_step.py

Variants run in interleaved rounds.  On the H100 (2026-11-22; 119 kernels and
130 aten ops per step) the untraced step itself moved between 6.8 and 8.7 ms
from round to round, more than any variant differed: switching off the
aten-op tree hashes or the kernel hashes did not measurably change the step
(medians 13.5 ms full, 12.9 without kernel hashes, 11.3 DebugMode alone).
A variant without aten-op hashes patched a Python function that is C now
(csrc/kd_dispatch.c); tools/op_cost.py measures that layer per op instead.
Finding where log_tensor_hashes() spends its time needs a quieter host or a
host-side profiler (tools/spy_step.py), not wall-clock ablation.  Note: never
run the compiled step under another dispatch mode first unless that mode's
ignore_compile_internals() is True (DebugMode's is): with any other mode on
the stack dynamo skips the frame and the step runs eagerly from then on.
"""
import contextlib
import statistics
import time

import torch

import kdebug
from kdebug.workloads import transformer_step

step, x = transformer_step()
K = kdebug.DebugMode


def timed(ctx, n=30):
    ts = []
    for i in range(n + 3):
        t0 = time.perf_counter()
        if ctx is None:
            step(x)
        else:
            with K():
                if ctx:
                    with ctx():
                        step(x)
                else:
                    step(x)
        torch.cuda.synchronize()
        if i >= 3:
            ts.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(ts)




@contextlib.contextmanager
def hash_no_kernels():
    """log_tensor_hashes() with the launch hook's kernel hashing switched off."""
    with K.log_tensor_hashes():
        prev = kdebug._C._set_hash_config(0, 0, 0, 0)
        try:
            yield
        finally:
            kdebug._C._set_hash_config(*prev)


VARIANTS = {"untraced": None, "dm": (), "hash": K.log_tensor_hashes,
            "hash, no kernel hashes": hash_no_kernels}
for ctx in VARIANTS.values():
    timed(ctx, 5)  # warm-up
res = {k: [] for k in VARIANTS}
for _ in range(5):  # interleaved rounds: drift hits every variant alike
    for k, ctx in VARIANTS.items():
        res[k].append(timed(ctx, 10))
base = statistics.median(res["untraced"])
for k, v in res.items():
    m = statistics.median(v)
    print(f"{k:28s} {m:6.2f} ms  {m / base:.2f}x   rounds {' '.join(f'{t:.2f}' for t in v)}")
with K() as dm:
    step(x)
print(f"aten ops per step: {len(dm.operators) - len(dm.kernels)}, kernels {len(dm.kernels)}")
