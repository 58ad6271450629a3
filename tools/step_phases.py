"""Where the fixed per-step cost of a DebugMode goes, on the GPU step.

    python tools/step_phases.py

Times, per step (median and min of 40, ms): the untraced step; a kdebug
DebugMode's construction (with the previous one's destruction), __enter__, the
step body, __exit__ and the final synchronization; and log_tensor_hashes()'s
__enter__, body and __exit__ inside a DebugMode.
"""
import statistics
import time

import torch

from kdebug import DebugMode as K
from kdebug.workloads import transformer_step

step, x = transformer_step()
res = {k: [] for k in ("untraced", "construct", "enter", "body", "exit", "sync",
                       "hash_enter", "hash_body", "hash_exit")}
dm = None
for _ in range(40):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    step(x)
    torch.cuda.synchronize()
    res["untraced"].append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    dm = K()  # the previous DebugMode is freed here too
    t1 = time.perf_counter()
    dm.__enter__()
    t2 = time.perf_counter()
    step(x)
    t3 = time.perf_counter()
    dm.__exit__(None, None, None)
    t4 = time.perf_counter()
    torch.cuda.synchronize()
    t5 = time.perf_counter()
    for k, a, b in (("construct", t0, t1), ("enter", t1, t2), ("body", t2, t3), ("exit", t3, t4), ("sync", t4, t5)):
        res[k].append(b - a)
    with K():
        c = K.log_tensor_hashes()
        t0 = time.perf_counter()
        c.__enter__()
        t1 = time.perf_counter()
        step(x)
        t2 = time.perf_counter()
        c.__exit__(None, None, None)
        t3 = time.perf_counter()
    for k, a, b in (("hash_enter", t0, t1), ("hash_body", t1, t2), ("hash_exit", t2, t3)):
        res[k].append(b - a)
for k, v in res.items():
    print(f"{k:12s} median {statistics.median(v) * 1e3:7.3f} ms  min {min(v) * 1e3:7.3f}")
