"""Host time of one replica record (Note [Replica state records]) with and
without its bitwise hash, by the number of tensors in it: how much of the
hash's host cost is the hash kernel's launch (fixed) and how much is per
tensor.  Beside it, torch.cuda._sleep(0): one bare kernel launch through a
Python binding, this host's launch cost.  Tensors of 256 x 64 float32 on
the device; each variant 400 records, median of 7 rounds; the records are
drained between loops.  Not a test; no timed assertion.

    python tools/replica_hash_cost.py [--device cuda] [--rounds 7] [--iters 400]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

import kdebug
from kdebug import _C

SIZES = (1, 4, 16, 64, 128)


def main(argv=None) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--iters", type=int, default=400)
    a = p.parse_args(argv)
    cuda = a.device == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    fr = kdebug.FlightRecorder(every=10 ** 9, trace="/tmp/kdebug_replica_hash_cost.kdt")
    ts = [torch.randn(256, 64, device=a.device) for _ in range(max(SIZES))]
    names = {n: _C.intern_names([f"t{i}" for i in range(n)]) for n in SIZES}

    def loop(n: int, hashed: bool) -> float:
        t, nm = ts[:n], names[n]
        if hashed:
            fr._open_window()
        sync()
        t0 = time.perf_counter_ns()
        for _ in range(a.iters):
            _C.record_state("kdebug::cost", nm, t)
        t1 = time.perf_counter_ns()
        if hashed:
            fr._close_window()
        sync()
        fr._drain(wait=True, copy=True)
        fr._rec.discard(fr._rec.seen)
        return (t1 - t0) / a.iters / 1e3

    def launches() -> float:
        sync()
        t0 = time.perf_counter_ns()
        for _ in range(a.iters):
            torch.cuda._sleep(0)
        t1 = time.perf_counter_ns()
        sync()
        return (t1 - t0) / a.iters / 1e3

    res: dict = {}
    with fr:
        for n in SIZES:
            loop(n, False), loop(n, True)
        for _ in range(a.rounds):
            for n in SIZES:
                for hashed in (False, True):
                    res.setdefault((n, hashed), []).append(loop(n, hashed))
            if cuda:
                res.setdefault("launch", []).append(launches())
    fr.close()
    print(f"{a.device}, torch {torch.__version__}, median of {a.rounds} rounds x {a.iters} records")
    if cuda:
        print(f"torch.cuda._sleep(0), one bare kernel launch: {statistics.median(res['launch']):.2f} us")
    print("| tensors | record us | hashed us | the hash adds us | per tensor |")
    print("|---|---|---|---|---|")
    for n in SIZES:
        plain, hashed = statistics.median(res[(n, False)]), statistics.median(res[(n, True)])
        print(f"| {n} | {plain:.2f} | {hashed:.2f} | {hashed - plain:.2f} | {(hashed - plain) / n:.3f} |")


if __name__ == "__main__":
    main()
