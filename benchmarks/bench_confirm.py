"""What `kdebug hunt --confirm` costs over a plain `kdebug hunt` on the
built-in workload (issue 15's goal: < 2x), and what the element-level re-run
(Note [Element-level differences]) adds to a plain hunt.

    python benchmarks/bench_confirm.py [--repeats 3]

Each repeat runs `kdebug hunt --no-magnitude`, `kdebug hunt` and
`kdebug hunt --confirm` (fresh processes, as a user would), in a rotating
order; prints the wall times, their medians and the ratios, and writes
benchmarks/results/confirm_<host>.json.
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


VARIANTS = {"no_magnitude": ["--no-magnitude"], "plain": [], "confirm": ["--confirm"]}


def hunt(variant: str) -> tuple[float, int, str]:
    with tempfile.TemporaryDirectory() as d:
        cmd = [sys.executable, "-m", "kdebug", "hunt", "--keep", d] + VARIANTS[variant]
        t0 = time.perf_counter()
        p = subprocess.run(cmd, capture_output=True, text=True)
        return time.perf_counter() - t0, p.returncode, p.stdout


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    rows = []
    names = list(VARIANTS)
    for r in range(a.repeats):
        for variant in names[r % 3:] + names[:r % 3]:
            wall, rc, out = hunt(variant)
            confirmed = out.count("CONFIRMED by replay") - out.count("NOT CONFIRMED")
            rows.append({"variant": variant, "confirm": variant == "confirm", "wall_s": round(wall, 2), "exit": rc,
                         "confirmed_roots": confirmed})
            print(f"repeat {r}: hunt {' '.join(VARIANTS[variant])}: {wall:.1f} s, exit {rc}"
                  + (f", {confirmed} root(s) confirmed" if variant == "confirm" else ""), flush=True)
    med = {v: statistics.median(x["wall_s"] for x in rows if x["variant"] == v) for v in names}
    plain, conf = med["plain"], med["confirm"]
    print(f"median: hunt --no-magnitude {med['no_magnitude']:.1f} s, hunt {plain:.1f} s, hunt --confirm {conf:.1f} s; "
          f"confirm / hunt {conf / plain:.2f}x, hunt / hunt --no-magnitude {plain / med['no_magnitude']:.2f}x")
    out = a.out or os.path.join(HERE, "results", f"confirm_{platform.node() or 'host'}.json")
    with open(out, "w") as f:
        json.dump({"rows": rows, "median_plain_s": plain, "median_confirm_s": conf, "ratio": conf / plain,
                   "median_no_magnitude_s": med["no_magnitude"], "magnitude_ratio": plain / med["no_magnitude"],
                   "cpus": os.cpu_count(), "python": sys.version.split()[0]}, f, indent=1)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
