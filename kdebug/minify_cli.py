"""`kdebug minify script.py`: run a script whose torch.compile uses
kdebug.backends.constrained(..., mode='strict') and write, for each
violation that stops it, a minimal standalone repro (Note [Minifier])."""
from __future__ import annotations

import argparse
import json
import sys

from ._argtypes import output_path


def add_parser(sub) -> None:
    m = sub.add_parser("minify", help="run a script whose constrained backend is strict: shrink each violating "
                                      "graph to a minimal standalone repro (exit 1 when one was written, 0 when "
                                      "no violation stopped the script, 2 on error); numerical mismatches: "
                                      "kdebug.minify(fn, *args) in Python")
    m.add_argument("--json", metavar="PATH", type=output_path,
                   help="also write the results as JSON ('-': to stdout, instead of text)")
    m.add_argument("-m", dest="module_name", metavar="MODULE", default=None,
                   help="run a module, as python -m MODULE [args...] would")
    m.add_argument("command", nargs=argparse.REMAINDER, help="script.py [args...]")
    m.set_defaults(fn=run)


def run(args: argparse.Namespace) -> int:
    from . import cli
    from ._files import output_problem, replaced_atomically  # (not `from . import`: that imports torch)
    from ._runner import run_for_status

    found = cli.program_target("minify", args.command, args.module_name)
    if found is None:
        return 2
    target, module = found
    to_stdout = args.json == "-"
    problem = args.json and not to_stdout and output_problem(args.json, cli.program_files(target, module))
    if problem:
        print(f"kdebug minify: {problem}", file=sys.stderr)
        return 2
    from .backends import checks, clear_violations, minified, minify_by_default, violations

    clear_violations()
    old = minify_by_default(True)
    try:
        status = run_for_status(target, module)
    finally:
        minify_by_default(old)
    results, vs = minified(), violations()
    out = {"program": " ".join(target), "exit_status": status, "graphs_checked": len(checks()),
           "violations": len(vs), "minified": [r.to_json() for r in results]}
    if to_stdout:
        json.dump(out, sys.stdout, indent=1)
        print()
    else:
        print(f"kdebug minify: {len(checks())} graph(s) checked, {len(vs)} violation(s), "
              f"{len(results)} minimal repro(s)")
        for r in results:
            print(f"  - {r.failure}: {r.nodes_before} -> {r.nodes_after} call nodes ({', '.join(r.ops)})")
            print(f"    python {r.repro}")
        if vs and not results:
            print("  no minimal repro: the backend is in warn mode (minify runs in strict mode), or "
                  "minifying failed (the error message says why)")
        if not checks():
            print("  no graph was checked: compile with backend=kdebug.backends.constrained(caps, mode='strict')")
    if args.json and not to_stdout:
        with replaced_atomically(args.json) as f:
            json.dump(out, f, indent=1)
    if results:
        return 1
    return 2 if status and not vs else 0
