"""What `kdebug hunt --confirm` costs over a plain `kdebug hunt` on the
built-in workload (issue 15's goal: < 2x).

    python benchmarks/bench_confirm.py [--repeats 3]

Each repeat runs `kdebug hunt` and `kdebug hunt --confirm` (fresh processes,
as a user would), in alternating order; prints the wall times, their medians
and the ratio, and writes benchmarks/results/confirm_<host>.json.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def hunt(confirm: bool) -> tuple[float, int, str]:
    with tempfile.TemporaryDirectory() as d:
        cmd = [sys.executable, "-m", "kdebug", "hunt", "--keep", d] + (["--confirm"] if confirm else [])
        t0 = time.perf_counter()
        p = subprocess.run(cmd, capture_output=True, text=True)
        return time.perf_counter() - t0, p.returncode, p.stdout


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    rows = []
    for r in range(a.repeats):
        for confirm in ((False, True) if r % 2 == 0 else (True, False)):
            wall, rc, out = hunt(confirm)
            confirmed = out.count("CONFIRMED by replay") - out.count("NOT CONFIRMED")
            rows.append({"confirm": confirm, "wall_s": round(wall, 2), "exit": rc, "confirmed_roots": confirmed})
            print(f"repeat {r}: hunt{' --confirm' if confirm else ''}: {wall:.1f} s, exit {rc}"
                  + (f", {confirmed} root(s) confirmed" if confirm else ""), flush=True)
    plain = statistics.median(x["wall_s"] for x in rows if not x["confirm"])
    conf = statistics.median(x["wall_s"] for x in rows if x["confirm"])
    print(f"median: hunt {plain:.1f} s, hunt --confirm {conf:.1f} s, ratio {conf / plain:.2f}x")
    out = a.out or os.path.join(HERE, "results", f"confirm_{platform.node() or 'host'}.json")
    with open(out, "w") as f:
        json.dump({"rows": rows, "median_plain_s": plain, "median_confirm_s": conf, "ratio": conf / plain,
                   "cpus": os.cpu_count(), "python": sys.version.split()[0]}, f, indent=1)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
