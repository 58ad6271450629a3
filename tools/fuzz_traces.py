"""A long fuzzing campaign over trace files: byte mutations (flips, inserts,
deletes, cuts) and structure-aware META mutations (CRC-valid chunks holding
hostile JSON), each mutant taken through everything kdebug does with a trace
(load, problems, debug_string, compare, the Perfetto export, the report page).
Every mutant must be read or refused with a TraceFileError; anything else is
counted as a failure and its first few are printed.

    PYTHONPATH=. python tools/fuzz_traces.py -n 10000 [--seed 0]

Exit status 0 when no mutant failed.  (tests/test_trace.py and
tests/test_hostile.py run a few hundred of each in the suite.)
"""
from __future__ import annotations

import argparse
import os
import random
import sys
import time
import traceback
import warnings

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))


def _record() -> bytes:
    import torch

    import kdebug

    f = torch.compile(lambda x: torch.sin(x) * 2 + 1)
    g = torch.compile(lambda a: torch.cos(a).sum(0) + 1)
    x = torch.randn(32, 16)
    g(f(x))
    with kdebug.DebugMode() as dm, kdebug.DebugMode.log_tensor_hashes(["bitwise", "norm"], hash_inputs=True):
        g(f(x))
        (x + 1).sum()
    return kdebug.trace.save(dm, None)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=10000, help="mutants (half byte-level, half META)")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    warnings.simplefilter("ignore")
    import kdebug
    from kdebug import TraceFileError, report
    from kdebug.export import perfetto_events
    from tracebytes import hostile_meta, mutate_bytes, with_meta

    data = _record()
    good = kdebug.trace.Run(data)
    base = dict(good.meta)
    rng = random.Random(a.seed)
    counts = {"read": 0, "refused": 0, "failed": 0}
    t0 = time.perf_counter()
    for k in range(a.n):
        kind = "meta" if k % 2 else "bytes"
        mutant = with_meta(data, hostile_meta(rng, base)) if kind == "meta" else mutate_bytes(rng, data)
        try:
            try:
                run = kdebug.trace.Run(mutant, "mutant.kdt")
            except TraceFileError as e:
                assert 0 <= e.offset <= len(mutant), e.offset
                counts["refused"] += 1
                continue
            run.problems()
            run.debug_string()
            run.debug_string(verbose=True)  # Note [Kernel code]: each kernel's module, nodes, lines
            kdebug.compare(good, run)
            perfetto_events(run)
            meta, blob = report.build([good, run])
            report.render(meta, blob)
            counts["read"] += 1
        except Exception:
            counts["failed"] += 1
            if counts["failed"] <= 5:
                print(f"mutant {k} ({kind}) failed:", file=sys.stderr)
                traceback.print_exc()
    print(f"fuzz_traces: {a.n} mutants (seed {a.seed}; {a.n - a.n // 2} byte-level, {a.n // 2} META) in "
          f"{time.perf_counter() - t0:.0f}s: {counts['read']} read through show/diff/export/report, "
          f"{counts['refused']} refused with TraceFileError, {counts['failed']} failed otherwise")
    return 1 if counts["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
