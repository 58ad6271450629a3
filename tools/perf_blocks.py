"""Where a recording mode's host time goes, by code, compared with the
untraced step in the same process: Linux perf samples attributed to blocks
of steps run in alternation.

One process per mode does not work for this: on the H200 host the same
configuration's interpreter time moved by up to 1 ms a step from one process
to the next, more than the modes differ.  So one process runs the modes in
turn, ``--block`` steps at a time for ``--rounds`` rounds (the order
reversed every other round), recording when each block began and ended
(CLOCK_MONOTONIC); perf samples the whole run with the same clock, and each
sample goes to the block it fell in.

    perf record -k mono -F 20000 -o /tmp/pb.data \\
        python tools/perf_blocks.py run --modes untraced,ko_hash --out /tmp/pb.json
    perf script -i /tmp/pb.data -F comm,tid,time,ip,sym,dso | \\
        python tools/perf_blocks.py attribute /tmp/pb.json --hz 20000 [--base untraced]

``run`` takes the step of ``kdebug.workloads.transformer_step`` (its device:
``--device``); with KD_PERF_CTL set to perf's control fifo (perf record -D -1
--control fifo:PATH) it enables sampling only around the timed blocks.
``attribute`` prints µs per step by thread and library, then, per mode, the
symbols whose time grew most over ``--base``.  A DebugMode is made per step,
as benchmarks/bench_ops.py does.  Not a test.
"""
from __future__ import annotations

import argparse
import bisect
import collections
import contextlib
import json
import os
import statistics
import sys
import time


def _modes():
    from kdebug import DebugMode as K

    @contextlib.contextmanager
    def both(a, b):
        with a as m, b:
            yield m

    return {"untraced": lambda: contextlib.nullcontext(),
            "ko": lambda: K(kernels_only=True),
            "ko_hash": lambda: both(K(kernels_only=True), K.log_tensor_hashes()),
            "ko_hash_per_kernel": lambda: both(K(kernels_only=True, batch_gpu_work=False), K.log_tensor_hashes()),
            "ko_extern": lambda: K(kernels_only=True, record_extern_ops=True),
            "ko_extern_hash": lambda: both(K(kernels_only=True, record_extern_ops=True), K.log_tensor_hashes()),
            "cpp": lambda: K(op_path="c++"),
            "full": lambda: K()}


def run(a) -> int:
    import torch

    from kdebug.workloads import transformer_step

    known = _modes()
    modes = a.modes.split(",")
    sync = torch.cuda.synchronize if a.device == "cuda" else (lambda: None)
    block_modes = set()  # modes entered once around their block (the flight recorder)
    if a.workload == "flight":  # forward + backward + eager AdamW, as bench_flight.py's step
        import kdebug
        from kdebug.workloads import adamw_step

        step, x, model, opt = adamw_step(a.device)
        fr = kdebug.FlightRecorder(every=10, keep_steps=4, trace=os.path.join(a.tmp, "perf_blocks.kdt"))
        fr.attach(opt, model)
        known["flight"] = lambda: fr
        block_modes.add("flight")
    else:
        step, x = transformer_step(a.device)
    bad = [m for m in modes if m not in known]
    if bad:
        raise SystemExit(f"perf_blocks: unknown mode(s) {bad}; known: {', '.join(known)}")
    for m in modes:  # first uses (compiles of variants, hooks installed) before anything is timed
        for _ in range(3):
            with known[m]():
                step(x)
    sync()
    ctl = os.environ.get("KD_PERF_CTL")

    def perf(cmd: str) -> None:
        if ctl:
            with open(ctl, "w") as f:
                f.write(cmd + "\n")

    blocks, per = [], {m: [] for m in modes}
    perf("enable")
    for r in range(a.rounds):
        for m in (modes if r % 2 == 0 else modes[::-1]):
            make = known[m]
            sync()
            t0 = time.monotonic_ns()
            if m in block_modes:
                with make():
                    for _ in range(a.block):
                        step(x)
            else:
                for _ in range(a.block):
                    with make():
                        step(x)
            sync()
            t1 = time.monotonic_ns()
            blocks.append([m, t0, t1])
            per[m].append((t1 - t0) / a.block / 1e6)
    perf("disable")
    for m in modes:
        print(f"{m:20s} ms / step: median {statistics.median(per[m]):.3f}, min {min(per[m]):.3f}")
    with open(a.out, "w") as f:
        json.dump({"block": a.block, "blocks": blocks, "pid": os.getpid()}, f)
    return 0


def parse_line(line: str, pid: int | None = None):
    """(thread, time ns, dso, symbol) of one `perf script -F comm,tid,time,ip,sym,dso`
    line, or None.  The thread is the command name ("main" for the Python
    main thread, whose name is python...; with ``pid``, only the thread of
    that id is "main": other processes named python..., such as Inductor's
    compile workers, which perf follows too, are "child")."""
    head, sep, rest = line.partition(": ")
    if not sep:
        return None
    parts = head.split()
    if len(parts) < 3:
        return None
    try:
        t = int(round(float(parts[-1]) * 1e9))
    except ValueError:
        return None
    rest = rest.strip()
    ip, _, rest = rest.partition(" ")  # the sample's address
    if not rest:
        rest = ip
    i = rest.rfind(" (")
    sym, dso = (rest[:i], rest[i + 2:].rstrip(")")) if i >= 0 else (rest, "?")
    thread = parts[0]
    if thread.startswith("python"):
        thread = "main" if pid is None or parts[-2] == str(pid) else "child"
    return thread, t, dso.rsplit("/", 1)[-1], sym.split("+0x")[0]


def attribute(a) -> int:
    with open(a.blocks) as f:
        info = json.load(f)
    blocks = sorted(info["blocks"], key=lambda b: b[1])
    starts = [b[1] for b in blocks]
    steps = collections.Counter()
    for m, _, _ in blocks:
        steps[m] += info["block"]
    by_sym, by_dso = collections.Counter(), collections.Counter()
    for line in sys.stdin:
        p = parse_line(line, info.get("pid"))
        if p is None:
            continue
        thread, t, dso, sym = p
        k = bisect.bisect_right(starts, t) - 1
        if k < 0 or t > blocks[k][2]:
            continue  # between blocks (synchronizing, making the next mode)
        m = blocks[k][0]
        by_sym[(m, thread, dso, sym)] += 1
        by_dso[(m, thread, dso)] += 1
    modes = list(steps)
    us = 1e6 / a.hz  # µs a sample stands for

    def per_step(count: int, m: str) -> float:
        return count * us / steps[m]

    print("µs / step by thread and library")
    keys = sorted({k[1:] for k in by_dso}, key=lambda k: -max(per_step(by_dso[(m,) + k], m) for m in modes))
    print(f"{'':44s}" + "".join(f"{m:>14s}" for m in modes))
    for k in keys[:a.top]:
        print(f"{(k[0] + ' ' + k[1])[:44]:44s}" + "".join(f"{per_step(by_dso[(m,) + k], m):14.1f}" for m in modes))
    print(f"{'all':44s}" + "".join(
        f"{per_step(sum(v for kk, v in by_dso.items() if kk[0] == m), m):14.1f}" for m in modes))
    base = a.base or modes[0]
    if base not in steps:
        raise SystemExit(f"perf_blocks: no block of --base {base!r}; modes: {', '.join(modes)}")
    syms = {k[1:] for k in by_sym}
    for m in modes:
        if m == base:
            continue
        diff = sorted(((per_step(by_sym[(m,) + k], m) - per_step(by_sym[(base,) + k], base)), k) for k in syms)
        print(f"\n{m} - {base}: symbols whose time grew most (µs / step)")
        for v, k in diff[::-1][:a.top]:
            print(f"{v:9.1f}  {k[0]} | {k[1]} | {k[2]}")
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run the modes in alternating blocks, write the blocks' times")
    r.add_argument("--device", default="cuda")
    r.add_argument("--modes", default="untraced,ko_hash,ko_extern_hash")
    r.add_argument("--rounds", type=int, default=10)
    r.add_argument("--block", type=int, default=25)
    r.add_argument("--workload", choices=("step", "flight"), default="step",
                   help="step: transformer_step's forward + backward; flight: the same + eager AdamW, "
                        "with mode 'flight' (a FlightRecorder(every=10) attached, entered around each block)")
    r.add_argument("--tmp", default="/tmp", help="where the flight recorder's dump path points")
    r.add_argument("--out", required=True)
    t = sub.add_parser("attribute", help="perf script lines on stdin -> µs / step by block's mode")
    t.add_argument("blocks")
    t.add_argument("--hz", type=float, required=True, help="perf record's -F")
    t.add_argument("--base", default=None)
    t.add_argument("--top", type=int, default=40)
    a = p.parse_args(argv)
    return run(a) if a.cmd == "run" else attribute(a)


if __name__ == "__main__":
    sys.exit(main())
