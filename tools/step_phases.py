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


def phases(*named):
    """Runs each (name, fn) in turn and adds its time to res[name]."""
    t = time.perf_counter()
    for name, fn in named:
        fn()
        now = time.perf_counter()
        res[name].append(now - t)
        t = now


box = [None]  # the DebugMode; replacing it frees the previous one


def construct():
    box[0] = K()


for _ in range(40):
    torch.cuda.synchronize()
    phases(("untraced", lambda: (step(x), torch.cuda.synchronize())))
    phases(("construct", construct), ("enter", lambda: box[0].__enter__()), ("body", lambda: step(x)),
           ("exit", lambda: box[0].__exit__(None, None, None)), ("sync", torch.cuda.synchronize))
    with K():
        c = K.log_tensor_hashes()
        phases(("hash_enter", c.__enter__), ("hash_body", lambda: step(x)),
               ("hash_exit", lambda: c.__exit__(None, None, None)))
for k, v in res.items():
    print(f"{k:12s} median {statistics.median(v) * 1e3:7.3f} ms  min {min(v) * 1e3:7.3f}")
