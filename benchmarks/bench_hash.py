"""Hash throughput and the step-time cost of hashing / recording outputs,
side by side with upstream DebugMode in one process.

    python benchmarks/bench_hash.py --device cuda     # GPU: hash kernel GB/s vs copy GB/s, step ratios
    python benchmarks/bench_hash.py --device cpu      # CPU: C hash GB/s per core, step ratios

kdebug's modes and the untraced step run in cycles of one step each, in a
shuffled order per cycle (--cycles); "paired" ratios divide each traced step
by the untraced step of its own cycle.  Upstream's modes, 10-100x slower, run
afterwards in rounds of --steps steps, interleaved with the untraced step.
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import random
import statistics
import sys
import threading
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
from bench_record import _sync, time_steps  # noqa: E402


def throughput(dev: str) -> dict:
    import kdebug
    from kdebug import _C, hashing

    out = {}
    if dev == "cpu":
        t = torch.randn(64 << 20 >> 2)  # 64 MB
        w = torch.randn(512, 2048)  # 4 MB
        views = {"": t,  # contiguous
                 "_transposed_4MB": w.t(),  # runs of one element, gathered
                 "_transposed_64MB": t.view(4096, 4096).t(),
                 "_every_other_column_4MB": w[:, ::2]}
        for vname, v in views.items():
            for name, kinds in (("bitwise", _C.HASH_BITWISE), ("norm", _C.HASH_NORM), ("stats", _C.HASH_STATS)):
                _C.hash(v, kinds)
                t0 = time.perf_counter()
                n = 5
                for _ in range(n):
                    _C.hash(v, kinds)
                dt = (time.perf_counter() - t0) / n
                out[f"cpu_{name}{vname}_GBps_1core"] = v.numel() * 4 / dt / 1e9
        return out
    for mb in (64, 256, 1024):
        t = torch.randn(mb << 20 >> 2, device="cuda")
        dst = torch.empty_like(t)
        for _ in range(3):
            dst.copy_(t)
            hashing.finish(hashing.start(t, _C.HASH_BITWISE))
        torch.cuda.synchronize()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        reps = 20
        torch.cuda._sleep(int(5e7))
        e0.record()
        for _ in range(reps):
            dst.copy_(t)
        e1.record()
        torch.cuda.synchronize()
        copy_s = e0.elapsed_time(e1) / 1e3 / reps
        # keep the GPU busy while Python queues the hashes, so the events time
        # the hash kernels and not the host's launch overhead
        def timed(kinds):
            torch.cuda._sleep(int(5e7))
            e0.record()
            for _ in range(reps):
                _C.hash_async(t, kinds, torch.cuda.current_stream().cuda_stream)
            e1.record()
            torch.cuda.synchronize()
            _C.hash_collect()
            return e0.elapsed_time(e1) / 1e3 / reps
        hash_s = timed(_C.HASH_BITWISE)
        stats_s = timed(_C.HASH_BITWISE | _C.HASH_STATS)  # what a hunt records
        nbytes = t.numel() * 4
        out[f"gpu_{mb}MB"] = {"hash_read_GBps": nbytes / hash_s / 1e9,
                              "bitwise_stats_read_GBps": nbytes / stats_s / 1e9,
                              "copy_GBps_read_plus_write": 2 * nbytes / copy_s / 1e9,
                              "ratio": (nbytes / hash_s) / (2 * nbytes / copy_s)}
    return out


def _quartiles(v: list[float]) -> tuple[float, float, float]:
    q = statistics.quantiles(v, n=4) if len(v) > 1 else [v[0]] * 3
    return q[0], q[1], q[2]


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--cycles", type=int, default=60,
                   help="kdebug block: cycles of one step per mode, in a shuffled order per cycle")
    p.add_argument("--rounds", type=int, default=3, help="upstream block: rounds")
    p.add_argument("--steps", type=int, default=5, help="upstream block: steps per mode and round")
    p.add_argument("--seed", type=int, default=0, help="seed of the per-cycle mode order")
    p.add_argument("--json")
    args = p.parse_args(argv)
    dev = args.device
    import kdebug
    from torch.utils._debug_mode import DebugMode as Up

    from kdebug.workloads import STEP_SIZES, transformer_step

    blocks, d, heads, shape = STEP_SIZES[dev]
    step, x = transformer_step(dev)

    def mode(cls, *ctx):
        @contextlib.contextmanager
        def run():
            with contextlib.ExitStack() as st:
                dm = st.enter_context(cls())
                for c in ctx:
                    st.enter_context(c())
                yield dm
        return run

    def one(m) -> tuple[float, float]:
        """(ms of one synchronized step, ms reading its results)"""
        if m is None:
            return time_steps(step, x, dev, 1)[0], 0.0
        _sync(dev)
        t0 = time.perf_counter()
        with m() as dm:
            step(x)
        _sync(dev)
        t1 = time.perf_counter()
        list(dm.operators)  # reading the results (kdebug: one GPU sync for its hashes)
        t2 = time.perf_counter()
        return (t1 - t0) * 1e3, (t2 - t1) * 1e3

    K, U = kdebug.DebugMode, Up
    kd_modes = {
        "untraced": None,
        "kdebug DebugMode() (no hashes)": mode(K),
        "kdebug log_tensor_hashes()": mode(K, lambda: K.log_tensor_hashes()),
        "kdebug log_tensor_hashes(hash_inputs=True)": mode(K, lambda: K.log_tensor_hashes(hash_inputs=True)),
        # kernels only: no dispatch mode, so no aten-op records or hashes, and
        # each launch's hashes go out right after it (nothing is deferred)
        "kdebug kernels_only=True, log_tensor_hashes()": mode(lambda: K(kernels_only=True),
                                                             lambda: K.log_tensor_hashes()),
        "kdebug record_outputs()": mode(K, lambda: K.record_outputs()),
        "kdebug log_tensor_hashes('bitwise', hash_inputs=True)": mode(K, lambda: K.log_tensor_hashes("bitwise", hash_inputs=True)),
    }
    up_modes = {
        "untraced": None,
        "upstream log_tensor_hashes()": mode(U, lambda: U.log_tensor_hashes()),
        "upstream log_tensor_hashes(hash_inputs=True)": mode(U, lambda: U.log_tensor_hashes(hash_inputs=True)),
        "upstream record_outputs()": mode(U, lambda: U.record_outputs()),
    }

    # kdebug block: every cycle runs one step of each mode in a fresh random
    # order, so that the host's drift (its speed moves by tens of percent
    # within seconds on a leased machine) hits every mode alike and each
    # traced step has an untraced step of the same cycle to compare with
    rng = random.Random(args.seed)
    kd = {k: [] for k in kd_modes}
    kd_reads = {k: [] for k in kd_modes}
    names = list(kd_modes)
    for c in range(args.cycles + 2):
        rng.shuffle(names)
        for name in names:
            rec, rd = one(kd_modes[name])
            if c >= 2:  # two warm-up cycles
                kd[name].append(rec)
                kd_reads[name].append(rd)
    gc.collect()
    # upstream block: 10-100x slower steps, interleaved with the untraced step by round
    up = {k: [] for k in up_modes}
    up_reads = {k: [] for k in up_modes}
    for _ in range(args.rounds):
        for name, m in up_modes.items():
            one(m)
            for _ in range(args.steps):
                rec, rd = one(m)
                up[name].append(rec)
                up_reads[name].append(rd)
        gc.collect()

    print(f"\n{dev}: {blocks} blocks d={d} batch {shape}, fwd+bwd, torch {torch.__version__}")
    host = {"python_threads": [t.name for t in threading.enumerate()], "loadavg": os.getloadavg(),
            "cpus": os.cpu_count()}
    print(f"kdebug: {args.cycles} shuffled cycles; upstream: {args.rounds} rounds x {args.steps} steps; "
          f"host: {host}")
    print("| mode | ms / step | x untraced | paired x untraced, quartiles | + reading results, ms "
          "| x untraced with reading |")
    print("|---|---|---|---|---|---|")
    table = []
    # paired ratios only in the kdebug block, where every cycle has one untraced step
    for res, reads, paired, untraced_name in ((kd, kd_reads, True, "untraced"),
                                              (up, up_reads, False, "untraced (upstream block)")):
        base = statistics.median(res["untraced"])
        for name, v in res.items():
            ms = statistics.median(v)
            rd = statistics.median(reads[name])
            q = _quartiles([t / u for t, u in zip(v, res["untraced"])]) if paired else None
            name_out = untraced_name if name == "untraced" else name
            table.append((name_out, ms, ms / base, rd, (ms + rd) / base, q))
            qs = f"{q[1]:.2f} ({q[0]:.2f}-{q[2]:.2f})" if q else "-"
            print(f"| {name_out} | {ms:.2f} | {ms / base:.2f} | {qs} | {rd:.2f} | {(ms + rd) / base:.2f} |")
    tp = throughput(dev)
    print("\nthroughput:", json.dumps(tp, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": dev, "cycles": args.cycles, "rounds": args.rounds, "steps": args.steps,
                       "table_columns": ["mode", "ms", "x untraced", "ms reading", "x untraced with reading",
                                         "paired x untraced quartiles (kdebug block; None in the upstream block)"],
                       "table": table, "raw": {"kdebug block": kd, "upstream block": up},
                       "reads": {"kdebug block": kd_reads, "upstream block": up_reads},
                       "throughput": tp, "torch": torch.__version__, "host": host}, f, indent=1)


if __name__ == "__main__":
    main()
