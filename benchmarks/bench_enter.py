"""Host cost of making, entering and leaving a recording per step: what
``benchmarks/bench_ops.py`` pays every step on top of the recording itself
(issue 20's ko_extern_hash), side by side with the floor (a do-nothing dispatch
mode) and upstream's DebugMode with its hash context.

    python benchmarks/bench_enter.py [--n 2000] [--rounds 5] [--json PATH]

Each configuration runs ``--n`` iterations of ``with <mode>: <body>`` in a
loop, ``--rounds`` times, interleaved; the body is nothing, or one call of a
small compiled CPU function (one C++ kernel).  Reported: µs per iteration (min
and median over rounds) and the ratio of the min to the untraced call's
(body "call") or to the do-nothing mode's (body "nothing").  CPU host time
only: on a GPU host the same code runs after a device synchronization, where
it may run slower (docs/benchmarks.md).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time

import torch


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--json")
    a = p.parse_args(argv)
    import kdebug
    from torch.utils._debug_mode import DebugMode as Upstream

    from kdebug.workloads import NullDispatchMode

    K = kdebug.DebugMode
    cf = torch.compile(lambda x: (x * 2 + 1).sin())
    x = torch.randn(8)
    configs = {
        "untraced": lambda: contextlib.nullcontext(),
        "do-nothing dispatch mode": lambda: NullDispatchMode(),
        "upstream DebugMode + log_tensor_hashes": lambda: _both(Upstream(), Upstream.log_tensor_hashes()),
        "kdebug kernels_only + log_tensor_hashes": lambda: _both(K(kernels_only=True), K.log_tensor_hashes()),
        "kdebug kernels_only, record_extern_ops + log_tensor_hashes":
            lambda: _both(K(kernels_only=True, record_extern_ops=True), K.log_tensor_hashes()),
    }
    for make in configs.values():  # compile, warm every path
        with make():
            cf(x)
    res: dict = {}
    for _ in range(a.rounds):
        for body in ("nothing", "call"):
            for name, make in configs.items():
                res.setdefault((name, body), []).append(_loop(make, cf, x, a.n, body == "call"))
    floor = {"nothing": min(res[("do-nothing dispatch mode", "nothing")]),
             "call": min(res[("untraced", "call")])}
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), {a.n} iterations x {a.rounds} rounds")
    print("| with ... | body | us / iteration (min) | median | x floor (min) |")
    print("|---|---|---|---|---|")
    rows = []
    for (name, body), v in res.items():
        ratio = min(v) / floor[body]
        rows.append({"config": name, "body": body, "us_min": min(v), "us_median": statistics.median(v),
                     "x_floor": ratio})
        print(f"| {name} | {body} | {min(v):.2f} | {statistics.median(v):.2f} | {ratio:.2f} |")
    print("floor: the do-nothing dispatch mode for body 'nothing', the untraced call for body 'call'")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"torch": torch.__version__, "n": a.n, "rounds": a.rounds, "rows": rows}, f, indent=1)
    return 0


@contextlib.contextmanager
def _both(a, b):
    with a, b:
        yield


def _loop(make, cf, x, n: int, call: bool) -> float:
    t0 = time.perf_counter_ns()
    if call:
        for _ in range(n):
            with make():
                cf(x)
    else:
        for _ in range(n):
            with make():
                pass
    return (time.perf_counter_ns() - t0) / n / 1e3


if __name__ == "__main__":
    sys.exit(main())
