"""`kdebug accuracy script.py`: the accuracy check (Note [Accuracy check]) of
a whole program, run in this process."""
from __future__ import annotations

import argparse
import json
import math
import sys


def add_parser(sub) -> None:
    a = sub.add_parser("accuracy", help="run a script once and name the first compiled kernel that computes worse "
                                        "than eager against float64 (exit 0 none, 1 culprit found, 2 error)")
    a.add_argument("--rtol", type=float, default=None, help="relative tolerance (default: per dtype, as "
                                                            "torch.testing.assert_close)")
    a.add_argument("--atol", type=float, default=None, help="absolute tolerance (default: per dtype)")
    a.add_argument("--factor", type=float, default=4.0,
                   help="how many times eager's error (against float64) a kernel's must exceed to be worse "
                        "(default 4)")
    a.add_argument("--calls-per-graph", type=int, default=1, metavar="N",
                   help="check the first N calls of each compiled graph (default 1); later calls run unchecked")
    a.add_argument("--max-bytes", type=int, default=4 << 30,
                   help="budget for the kernel outputs recorded in one graph call (default 4 GiB)")
    a.add_argument("--json", metavar="PATH", help="also write the verdict as JSON")
    a.add_argument("--html", metavar="PATH", help="also write the verdict as an HTML page (culprit source, "
                                                  "FX nodes, user lines, error heatmap)")
    a.add_argument("-m", dest="module_name", metavar="MODULE", default=None,
                   help="check a module, as python -m MODULE [args...] would run it")
    a.add_argument("command", nargs=argparse.REMAINDER, help="script.py [args...]")
    a.set_defaults(fn=run)


def _finite(x):
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    return x


def run(args: argparse.Namespace) -> int:
    from . import _runner, accuracy, cli

    found = cli.program_target("accuracy", args.command, args.module_name)
    if found is None:
        return 2
    target, module = found
    from . import _files

    for out in (args.json, args.html):
        problem = out and _files.output_problem(out)
        if problem:
            print(f"kdebug accuracy: {problem}", file=sys.stderr)
            return 2
    status = [0]

    def program():
        status[0] = _runner.run_for_status(target, module)

    try:
        report = accuracy.check(program, rtol=args.rtol, atol=args.atol, factor=args.factor,
                                calls_per_graph=args.calls_per_graph, max_bytes=args.max_bytes)
    except ValueError as e:
        print(f"kdebug accuracy: {e}", file=sys.stderr)
        return 2
    print(report.summary())
    if status[0]:
        print(f"kdebug accuracy: the program exited with status {status[0]}; the verdict covers the graph calls "
              "made before that", file=sys.stderr)
    if args.json:
        with _files.replaced_atomically(args.json) as f:
            json.dump(_finite(report.to_json()), f, indent=1, default=str)
    if args.html:
        from . import accuracy_html

        accuracy_html.write_html(args.html, report, title=f"kdebug accuracy: {' '.join(target)}")
    if report.graph_calls_checked == 0:
        print("kdebug accuracy: no compiled graph was called: nothing to check (does the script call a "
              "torch.compile'd function?)", file=sys.stderr)
        return 2
    if report.compared() == 0:
        print("kdebug accuracy: compiled graphs ran but no buffer they wrote could be compared with eager "
              "(the report lists why): nothing was checked", file=sys.stderr)
        return 2
    return 1 if report.culprit is not None else 0
