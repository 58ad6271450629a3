"""Cost of hunting a distributed job: ``kdebug hunt --nproc 4`` of a gloo
DDP step on CPU against ``kdebug hunt --nproc 1`` of the same script (issue
19's goal: < 3x), Note [Hunting ranks] in kdebug/hunt_ranks.py.

    python benchmarks/bench_ranks.py [--rounds 3] [--nproc 4] [--out benchmarks/results/ranks_cpu.json]

Each round runs the two hunts one after the other (the order alternates from
round to round), each in a fresh process as a user would start it, and
measures its wall time and the CPU time of it and its children (the ranks,
the launcher).  Reported: the median of the rounds and their ratio.  The
script is tests/dist_scripts/ddp_step.py (torch.compile(DDP(model)), two
steps, every rank on the same batch); both hunts must end with "all runs
match" (exit 0), or the round is an error.

On a machine with fewer cores than ranks the ranks share cores: the wall
time then measures that sharing as much as kdebug, and the CPU time says
what the work cost.  The JSON records the cores and the load average.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "tests", "dist_scripts", "ddp_step.py")


def hunt(nproc: int) -> dict:
    """One ``kdebug hunt --nproc nproc`` of the script: wall and CPU seconds."""
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    env.pop("KD_FAULT", None)
    with tempfile.TemporaryDirectory(prefix="bench-ranks-") as tmp:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        p = subprocess.run([sys.executable, "-m", "kdebug", "hunt", "--nproc", str(nproc), "--keep", tmp, SCRIPT],
                           env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        wall = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode != 0:
        raise SystemExit(f"bench_ranks: the {nproc}-rank hunt exited {p.returncode}:\n{p.stdout[-3000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall_s": round(wall, 2), "cpu_s": round(cpu, 2)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--nproc", type=int, default=4)
    ap.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "ranks_cpu.json"))
    a = ap.parse_args()
    rounds = []
    load0 = os.getloadavg()
    for i in range(a.rounds):
        order = [1, a.nproc] if i % 2 == 0 else [a.nproc, 1]
        got = {}
        for n in order:
            got[n] = hunt(n)
            print(f"round {i}: hunt --nproc {n}: {got[n]['wall_s']:.1f}s wall, {got[n]['cpu_s']:.1f}s CPU",
                  flush=True)
        rounds.append({"single": got[1], "ranks": got[a.nproc]})
    med = {k: {m: statistics.median(r[k][m] for r in rounds) for m in ("wall_s", "cpu_s")}
           for k in ("single", "ranks")}
    ratio = {m: round(med["ranks"][m] / med["single"][m], 2) for m in ("wall_s", "cpu_s")}
    out = {"what": f"kdebug hunt --nproc {a.nproc} vs --nproc 1 of tests/dist_scripts/ddp_step.py (gloo, CPU), "
                   "2 runs each, fresh processes",
           "goal": f"ranks / single < 3 (wall)", "nproc": a.nproc, "rounds": rounds, "median": med,
           "ratio": ratio, "cpu_count": os.cpu_count(), "loadavg_start": [round(x, 2) for x in load0],
           "loadavg_end": [round(x, 2) for x in os.getloadavg()],
           "note": "a shared machine: other work ran beside it; ranks beyond the cores share them"}
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)
    print(f"median: single {med['single']['wall_s']:.1f}s wall / {med['single']['cpu_s']:.1f}s CPU; "
          f"{a.nproc} ranks {med['ranks']['wall_s']:.1f}s wall / {med['ranks']['cpu_s']:.1f}s CPU; "
          f"ratio {ratio['wall_s']}x wall, {ratio['cpu_s']}x CPU (goal < 3x); wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
