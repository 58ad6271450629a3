"""Hash throughput and the step-time cost of hashing / recording outputs,
side by side with upstream DebugMode in one process.

    python benchmarks/bench_hash.py --device cuda     # GPU: hash kernel GB/s vs copy GB/s, step ratios
    python benchmarks/bench_hash.py --device cpu      # CPU: C hash GB/s per core, step ratios
"""
from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time

import torch

sys.path.insert(0, __import__("os").path.dirname(__file__))
from bench_record import _sync, time_steps  # noqa: E402


def throughput(dev: str) -> dict:
    import kdebug
    from kdebug import _C, hashing

    out = {}
    if dev == "cpu":
        t = torch.randn(64 << 20 >> 2)  # 64 MB
        for name, kinds in (("bitwise", _C.HASH_BITWISE), ("norm", _C.HASH_NORM)):
            _C.hash(t, kinds)
            t0 = time.perf_counter()
            n = 5
            for _ in range(n):
                _C.hash(t, kinds)
            dt = (time.perf_counter() - t0) / n
            out[f"cpu_{name}_GBps_1core"] = t.numel() * 4 / dt / 1e9
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
        torch.cuda._sleep(int(5e7))
        e0.record()
        for _ in range(reps):
            _C.hash_async(t, _C.HASH_BITWISE, torch.cuda.current_stream().cuda_stream)
        e1.record()
        torch.cuda.synchronize()
        _C.hash_collect()
        hash_s = e0.elapsed_time(e1) / 1e3 / reps
        nbytes = t.numel() * 4
        out[f"gpu_{mb}MB"] = {"hash_read_GBps": nbytes / hash_s / 1e9,
                              "copy_GBps_read_plus_write": 2 * nbytes / copy_s / 1e9,
                              "ratio": (nbytes / hash_s) / (2 * nbytes / copy_s)}
    return out


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--json")
    args = p.parse_args(argv)
    dev = args.device
    import kdebug
    from torch.utils._debug_mode import DebugMode as Up

    from kdebug.workloads import STEP_SIZES, transformer_step

    blocks, d, heads, shape = STEP_SIZES[dev]
    step, x = transformer_step(dev)

    read_ms: dict[str, list[float]] = {}

    def mode(cls, *ctx):
        @contextlib.contextmanager
        def run():
            with contextlib.ExitStack() as st:
                dm = st.enter_context(cls())
                for c in ctx:
                    st.enter_context(c())
                yield dm
        return run

    K, U = kdebug.DebugMode, Up
    modes = {
        "untraced": None,
        "kdebug DebugMode() (no hashes)": mode(K),
        "kdebug log_tensor_hashes()": mode(K, lambda: K.log_tensor_hashes()),
        "upstream log_tensor_hashes()": mode(U, lambda: U.log_tensor_hashes()),
        "kdebug log_tensor_hashes(hash_inputs=True)": mode(K, lambda: K.log_tensor_hashes(hash_inputs=True)),
        "upstream log_tensor_hashes(hash_inputs=True)": mode(U, lambda: U.log_tensor_hashes(hash_inputs=True)),
        "kdebug record_outputs()": mode(K, lambda: K.record_outputs()),
        "upstream record_outputs()": mode(U, lambda: U.record_outputs()),
        "kdebug log_tensor_hashes('bitwise', hash_inputs=True)": mode(K, lambda: K.log_tensor_hashes("bitwise", hash_inputs=True)),
    }
    res = {k: [] for k in modes}
    reads = {k: [] for k in modes}
    for _ in range(args.rounds):
        for name, m in modes.items():
            def one():
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
            one()
            for _ in range(args.steps):
                rec, rd = one()
                res[name].append(rec)
                reads[name].append(rd)
    base = statistics.median(res["untraced"])
    print(f"\n{dev}: {blocks} blocks d={d} batch {shape}, fwd+bwd, torch {torch.__version__}")
    print("| mode | ms / step | x untraced | + reading results, ms | x untraced with reading |")
    print("|---|---|---|---|---|")
    table = []
    for name, v in res.items():
        ms = statistics.median(v)
        rd = statistics.median(reads[name])
        table.append((name, ms, ms / base, rd, (ms + rd) / base))
        print(f"| {name} | {ms:.2f} | {ms / base:.2f} | {rd:.2f} | {(ms + rd) / base:.2f} |")
    tp = throughput(dev)
    print("\nthroughput:", json.dumps(tp, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": dev, "table": table, "raw": res, "reads": reads, "throughput": tp,
                       "torch": torch.__version__}, f, indent=1)


if __name__ == "__main__":
    main()
