"""Where a recorded step with hashes / outputs spends its time (GPU machine).

    python tools/profile_hash_step.py            # all modes
Prints, per mode: wall ms/step (median), GPU busy ms in the step, kernel
counts and GPU time of kdebug's own kernels, and a cProfile top list.
"""
import cProfile
import pstats
import statistics
import sys
import time

import torch

import kdebug
from kdebug.workloads import RECORDING_MODES, transformer_step, recorded_step

step, x = transformer_step()
which = sys.argv[1:] or list(RECORDING_MODES)


def one(name):
    return recorded_step(step, x, name)


from torch.profiler import ProfilerActivity, profile

for name in which:
    for _ in range(3):
        one(name)
    ts = []
    for _ in range(15):
        t0 = time.perf_counter()
        one(name)
        ts.append((time.perf_counter() - t0) * 1e3)
    d0 = kdebug._C.defer_stats()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        one(name)
    d1 = kdebug._C.defer_stats()
    print(f"   deferred: {d1['queued_hashes'] - d0['queued_hashes']} hashes, {d1['queued_copies'] - d0['queued_copies']} copies, "
          f"{(d1['queued_bytes'] - d0['queued_bytes']) / 1e6:.1f} MB, {d1['hash_launches'] - d0['hash_launches']} hash launches, "
          f"{d1['hazard_flushes'] - d0['hazard_flushes']} hazard flushes, {d1['shared_hashes'] - d0['shared_hashes']} shared")
    gpu = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    ours = [e for e in gpu if "hash_kernel" in e.name or "kd_" in e.name]
    busy = sum(e.device_time for e in gpu) / 1e3
    ob = sorted(e.device_time for e in ours)
    print(f"== {name}: wall {statistics.median(ts):.2f} ms (min {min(ts):.2f}); gpu kernels {len(gpu)} busy {busy:.2f} ms; "
          f"kdebug kernels {len(ours)} {sum(ob)/1e3:.2f} ms"
          + (f" (median {ob[len(ob)//2]:.1f} us, p90 {ob[int(len(ob)*.9)]:.1f} us, max {ob[-1]:.1f} us)" if ob else ""))
    names = {}
    for e in gpu:
        k = e.name[:50]
        names.setdefault(k, [0, 0.0])
        names[k][0] += 1
        names[k][1] += e.device_time
    top = sorted(names.items(), key=lambda kv: -kv[1][1])[:6]
    for k, (c, t) in top:
        print(f"   {t/1e3:7.3f} ms {c:4d}x  {k}")
    if name != "untraced":
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(5):
            one(name)
        pr.disable()
        pstats.Stats(pr).sort_stats("tottime").print_stats(14)
