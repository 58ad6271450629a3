"""Cost of kdebug.FlightRecorder per training step, side by side with the
untraced step, in one process (Note [Flight recorder] in kdebug/flight.py).

    python benchmarks/bench_flight.py --device cpu
    python benchmarks/bench_flight.py --device cuda                       # transformer step (goal <= 1.05x)
    python benchmarks/bench_flight.py --device cuda --workload gpu-bound  # large step (goal <= 1.02x)
    python -m torch.distributed.run --nproc-per-node 2 benchmarks/bench_flight.py --device cuda --optimizer adamw
                                   # DDP on 2 GPUs (NCCL): the compare is a collective across the ranks

The recorder stays on across a loop of steps as it would in a training job
(``fr.step()`` after each, a compare every ``--every`` steps: with no process
group that is a drain and the digests, no collective).  Each round times a
loop of ``--steps`` steps untraced and the same loop recorded, interleaved;
the device is synchronized only at the start and end of each loop (as a
training loop would run).  Reported: the median ms / step over rounds, and
kdebug's device synchronizations per step while recording (collecting GPU
hashes at a compare; never per kernel).

Under torch's launcher (WORLD_SIZE set) every rank runs the same loops on its
own GPU (LOCAL_RANK) with the model in DistributedDataParallel (NCCL on CUDA,
gloo on CPU) and the same batch, so the ranks are replicas and the recorder's
compare is its small collective across them.  Rank 0 prints the table; every
rank's ratios are gathered and printed beside it, and --json writes one file
per rank (NAME.rank{R}.json).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch


def _sync(device):
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _init_ranks(dev: str) -> tuple[int, int]:
    """(rank, world size): under torch's launcher, the process group (NCCL on
    CUDA, one GPU a rank; gloo on CPU); else (0, 1)."""
    import os

    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return 0, 1
    import torch.distributed as dist

    if dev == "cuda":
        local = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(local)
        dist.init_process_group("nccl", device_id=local)
    else:
        dist.init_process_group("gloo")
    return dist.get_rank(), dist.get_world_size()


def loop_ms(step, x, device, n, fr=None, attached=False):
    """(wall, process CPU) ms per step over a loop of n steps (one sync
    before and after).  The CPU time is what this process spent, on every
    thread: on a shared machine it moves less than the wall time."""
    _sync(device)
    t0, c0 = time.perf_counter(), time.process_time()
    if fr is None:
        for _ in range(n):
            step(x)
    else:
        with fr:
            for _ in range(n):
                step(x)
                if not attached:
                    fr.step()  # attached: the optimizer's step ends the recorder's step
    _sync(device)
    return (time.perf_counter() - t0) * 1e3 / n, (time.process_time() - c0) * 1e3 / n


SIZES = {  # (blocks, d, heads, (batch, tokens))
    ("cuda", "transformer"): (4, 512, 8, (8, 256)),
    ("cuda", "gpu-bound"): (4, 1024, 16, (32, 512)),
    ("cpu", "transformer"): (2, 128, 4, (4, 64)),
    ("cpu", "gpu-bound"): (2, 256, 4, (8, 128)),  # only a bigger CPU step: nothing is GPU-bound here
}


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--workload", choices=["transformer", "gpu-bound"], default="transformer")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--steps", type=int, default=20, help="steps per loop")
    p.add_argument("--every", type=int, default=10, help="FlightRecorder(every=...)")
    p.add_argument("--keep-steps", type=int, default=4)
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (CPU)")
    p.add_argument("--compare-steps", type=int, default=200, help="steps of the loop timing fr.step() alone")
    p.add_argument("--optimizer", choices=["none", "adamw"], default="none",
                   help="adamw: the step ends with an eager AdamW step, and the recorder is attached to it "
                        "(fr.attach: the replica records of compare='replicas', the recommended use)")
    p.add_argument("--hashes", default="compared",
                   help="FlightRecorder(hashes=...), or several, comma-separated, timed side by side in each round "
                        "(compared: only what the compare uses, under compare='replicas' the optimizer window; "
                        "all: every kernel's outputs)")
    p.add_argument("--compare", choices=["replicas", "all"], default="replicas", help="FlightRecorder(compare=...)")
    p.add_argument("--json", help="write results here")
    args = p.parse_args(argv)
    dev = args.device
    if args.threads:
        torch.set_num_threads(args.threads)
    import kdebug
    from kdebug.workloads import Transformer, train_step_fn

    blocks, d, heads, shape = SIZES[(dev, args.workload)]
    rank, world = _init_ranks(dev)
    if world > 1 and dev == "cuda":
        dev = f"cuda:{torch.cuda.current_device()}"
    torch.manual_seed(0)
    model = Transformer(blocks, d, heads).to(dev)
    x = torch.randn(*shape, d, device=dev)
    if world > 1:
        from torch.nn.parallel import DistributedDataParallel as DDP

        step = train_step_fn(DDP(model, device_ids=[torch.cuda.current_device()] if dev.startswith("cuda") else None))
    else:
        step = train_step_fn(model)
    opt = None
    if args.optimizer == "adamw":
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        fwd_bwd = step

        def step(x):
            loss = fwd_bwd(x)
            opt.step()
            return loss
    for _ in range(5):
        step(x)
    variants = args.hashes.split(",")
    for h in variants:
        if h not in ("compared", "all"):
            p.error(f"--hashes {h!r}: give compared, all or both")
    frs = {h: kdebug.FlightRecorder(every=args.every, keep_steps=args.keep_steps, compare=args.compare, hashes=h,
                                    trace=f"/tmp/kdebug_bench_flight_{h}.kdt") for h in variants}
    handles = [fr.attach(opt, model) for fr in frs.values()] if opt is not None else []
    attached = bool(handles)
    for fr in frs.values():
        loop_ms(step, x, dev, 2, fr, attached)  # installs the hooks, warms the recorder
    seen0 = {h: fr._rec.seen for h, fr in frs.items()}
    untraced, flights = [], {h: [] for h in variants}
    syncs = {h: 0 for h in variants}
    steps_rec = 0
    for i in range(args.rounds):
        # untraced and each recorder in a rotated order: none always runs first
        order = ["untraced"] + variants
        order = order[i % len(order):] + order[:i % len(order)]
        for what in order:
            if what == "untraced":
                untraced.append(loop_ms(step, x, dev, args.steps))
                continue
            fr = frs[what]
            s0 = fr._rec.stats()["gpu_syncs"]
            flights[what].append(loop_ms(step, x, dev, args.steps, fr, attached))
            syncs[what] += fr._rec.stats()["gpu_syncs"] - s0
        steps_rec += args.steps
    for fr in frs.values():
        fr.close()
    for hd in handles:
        hd.remove()
    # records per step (with attach: + 2 replica records)
    launches = {h: (fr._rec.seen - seen0[h]) // steps_rec for h, fr in frs.items()}
    # the compare itself: fr.step() timed alone in a loop of its own (host time of the call)
    # (no attach: fr.step() called by hand; compare='all' so that there is something to compare)
    cfr = kdebug.FlightRecorder(every=args.every, keep_steps=args.keep_steps, trace="/tmp/kdebug_bench_flight_c.kdt",
                                compare="all")
    plain_calls, compare_calls = [], []
    c0 = cfr._rec.stats()["gpu_syncs"]
    with cfr:
        for _ in range(args.compare_steps):
            step(x)
            t0 = time.perf_counter()
            cfr.step()
            (compare_calls if cfr._step % cfr.every == 0 else plain_calls).append((time.perf_counter() - t0) * 1e3)
    csyncs = cfr._rec.stats()["gpu_syncs"] - c0
    cfr.close()
    base = statistics.median(t[0] for t in untraced)
    cbase = statistics.median(t[1] for t in untraced)
    res = {}
    for h, flight in flights.items():
        rec, crec = statistics.median(t[0] for t in flight), statistics.median(t[1] for t in flight)
        # each round's loops ran back to back: their ratio cancels drift between rounds
        res[h] = {"wall_cpu_ms": flight, "ratio": rec / base, "cpu_time_ratio": crec / cbase,
                  "paired_ratio": statistics.median(f[0] / u[0] for u, f in zip(untraced, flight)),
                  "min_ratio": min(t[0] for t in flight) / min(t[0] for t in untraced),
                  "ms": rec, "cpu_ms": crec, "syncs": syncs[h], "launches_per_step": launches[h]}
    if world > 1:
        import torch.distributed as dist

        # (all_gather_object needs numpy, which torch's CPU wheel does not bring)
        mine = torch.tensor([v for h in variants for v in (res[h]["ratio"], res[h]["paired_ratio"])],
                            dtype=torch.float64, device=dev)
        got = [torch.empty_like(mine) for _ in range(world)]
        dist.all_gather(got, mine)
        every = [{h: (round(float(g[2 * i]), 3), round(float(g[2 * i + 1]), 3)) for i, h in enumerate(variants)}
                 for g in got]
        if args.json:
            stem, ext = (args.json[:-5], ".json") if args.json.endswith(".json") else (args.json, "")
            args.json = f"{stem}.rank{rank}{ext}"
    if rank != 0:
        print_ = _quiet
    else:
        print_ = print
    _report(print_, args, dev, blocks, d, shape, launches, opt, variants, base, cbase, res, steps_rec,
            compare_calls, plain_calls, csyncs, cfr)
    if world > 1:
        print_(f"{world} ranks (DistributedDataParallel, {'NCCL' if dev.startswith('cuda') else 'gloo'}), "
               f"every rank's x untraced (median, paired): "
               + "; ".join(f"rank {i} " + ", ".join(f"{h} {a:.3f} / {b:.3f}" for h, (a, b) in e.items())
                           for i, e in enumerate(every)))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": dev, "workload": args.workload, "optimizer": args.optimizer, "compare": args.compare,
                       "every": args.every, "keep_steps": args.keep_steps, "threads": torch.get_num_threads(),
                       "rank": rank, "world_size": world, "all_ranks": every if world > 1 else None,
                       "untraced_wall_cpu_ms": untraced, "flight": res, "steps": steps_rec,
                       "compare_call_ms": compare_calls, "step_call_ms_median": statistics.median(plain_calls) if plain_calls else None,
                       "compare_loop_syncs": csyncs, "waiting_compares": cfr.stats["waiting_compares"],
                       "torch": torch.__version__}, f, indent=1)
    if world > 1:
        torch.distributed.destroy_process_group()
    return 0


def _quiet(*_a, **_k):
    pass


def _report(print, args, dev, blocks, d, shape, launches, opt, variants, base, cbase, res, steps_rec,
            compare_calls, plain_calls, csyncs, cfr):
    print(f"\n{dev} {args.workload}: {blocks} blocks d={d} batch {shape}, fwd+bwd, "
          f"{max(launches.values())} Inductor launches/step, torch {torch.__version__}, "
          f"{torch.get_num_threads()} CPU thread(s); FlightRecorder(every={args.every}, keep_steps={args.keep_steps}, "
          f"compare={args.compare!r})"
          f"{'' if opt is None else ', attached to an eager AdamW step (in every loop)'}; "
          f"{args.rounds} rounds x {args.steps} steps")
    if opt is None and args.compare == "replicas" and "compared" in variants:
        print("(compare='replicas' without an attached optimizer compares nothing: hashes='compared' hashes nothing)")
    print("| mode | wall ms / step | x untraced | paired x | process CPU ms / step | x untraced | kdebug syncs / step |")
    print("|---|---|---|---|---|---|---|")
    print(f"| untraced (hooks installed) | {base:.3f} | 1.000 | 1.000 | {cbase:.3f} | 1.000 | - |")
    for h, r in res.items():
        print(f"| FlightRecorder(hashes={h!r}) | {r['ms']:.3f} | {r['ratio']:.3f} | {r['paired_ratio']:.3f} "
              f"| {r['cpu_ms']:.3f} | {r['cpu_time_ratio']:.3f} | {r['syncs'] / steps_rec:.3f} |")
    print("paired x: the median of the rounds' ratios to the untraced loop of the same round")
    if compare_calls:
        print(f"fr.step() alone, {args.compare_steps} steps: a compare {statistics.median(compare_calls):.3f} ms median "
              f"({len(compare_calls)} compares, max {max(compare_calls):.3f}), other steps "
              f"{statistics.median(plain_calls) * 1e3:.1f} us median; kdebug device synchronizations {csyncs}, "
              f"waiting compares {cfr.stats['waiting_compares']}")


if __name__ == "__main__":
    sys.exit(main())
