"""Host-time ablation of log_tensor_hashes() on the GPU transformer step:
median ms/step with parts of the aten-op hash path switched off, to see what
each costs (not a correctness mode: the switched-off variants record less).

    python tools/ablate_hash_step.py

On the H100 (2026-11-22; 119 kernels and 130 aten ops per step) switching off
the aten-op tree hashes, the hook check or the fresh-buffer tracking moved the
median step by less than the run-to-run noise (untraced 5.8 / 6.4 ms at the
start / end of one run): the aten-op hash path is not where log_tensor_hashes()
spends its time there.  Note: never run the compiled step under another
dispatch mode first; dynamo guards on the mode stack and recompiles.
"""
import statistics
import time

import torch

import kdebug
from kdebug import mode
from kdebug.workloads import Transformer, train_step_fn

torch.manual_seed(0)
model = Transformer(4, 512, 8).cuda()
x = torch.randn(8, 256, 512, device="cuda")
step = train_step_fn(model)
for _ in range(5):
    step(x)
torch.cuda.synchronize()
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


base = timed(None)
print(f"untraced {base:.2f} ms")
timed(K.log_tensor_hashes, 5)  # warm-up of the hash path
for name, ctx in [("dm", ()), ("hash", K.log_tensor_hashes)]:
    t = timed(ctx)
    print(f"{name:28s} {t:.2f} ms  {t / base:.2f}x")
saved = {}


def patch(obj, attr, value):
    saved[(obj, attr)] = getattr(obj, attr)
    setattr(obj, attr, value)


cache = {}
orig_hooks = mode._own_hooks
patch(mode, "_own_hooks", lambda: cache.setdefault(0, orig_hooks()))
t = timed(K.log_tensor_hashes)
print(f"{'hash, _own_hooks cached':28s} {t:.2f} ms  {t / base:.2f}x")
patch(mode.DebugMode, "_track_fresh", lambda self, f, a, r: None)
t = timed(K.log_tensor_hashes)
print(f"{'+ no _track_fresh':28s} {t:.2f} ms  {t / base:.2f}x")
patch(mode, "_tree_hash", lambda obj, spec, sid: (None, False))
t = timed(K.log_tensor_hashes)
print(f"{'+ no aten tree_hash':28s} {t:.2f} ms  {t / base:.2f}x")
for (o, a), v in saved.items():
    setattr(o, a, v)
t = timed(K.log_tensor_hashes)
print(f"{'hash again (restored)':28s} {t:.2f} ms  {t / base:.2f}x")
t = timed(None)
print(f"{'untraced again':28s} {t:.2f} ms")
with K() as dm:
    step(x)
print(f"aten ops per step: {len(dm.operators) - len(dm.kernels)}, kernels {len(dm.kernels)}")
