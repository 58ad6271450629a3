"""`kdebug accuracy script.py`: the accuracy check (Note [Accuracy check]) of
a whole program, run in this process."""
from __future__ import annotations

import argparse
import json
import math
import sys

from ._argtypes import BYTES, FACTOR, TOLERANCE, count, output_path


def add_parser(sub) -> None:
    a = sub.add_parser("accuracy", help="run a script once and name the first compiled kernel that computes worse "
                                        "than eager against float64 (exit 0 none, 1 culprit found, 2 error)")
    # Note [Option values] (kdebug/_argtypes.py): argparse refuses a negative, NaN or infinite number
    a.add_argument("--rtol", type=TOLERANCE, default=None, help="relative tolerance (default: per dtype, as "
                                                                "torch.testing.assert_close)")
    a.add_argument("--atol", type=TOLERANCE, default=None, help="absolute tolerance (default: per dtype)")
    a.add_argument("--factor", type=FACTOR, default=4.0,
                   help="how many times eager's error (against float64) a kernel's must exceed to be worse "
                        "(default 4)")
    a.add_argument("--calls-per-graph", type=count(1, "graph calls checked"), default=1, metavar="N",
                   help="check the first N calls of each compiled graph (default 1); later calls run unchecked")
    a.add_argument("--max-device-bytes", type=BYTES, default=None, metavar="B",
                   help="kernel outputs of one graph call kept on the GPU where they were made, at most B bytes "
                        "(default: 1/8 of the free device memory); beyond it they spill to host memory")
    a.add_argument("--max-host-bytes", type=BYTES, default=None, metavar="B",
                   help="kernel outputs kept in host memory (pinned copies of GPU outputs; a CPU run's outputs "
                        "themselves), at most B bytes per graph call (default: 1/4 of the available RAM); beyond "
                        "it they spill to a temporary file")
    a.add_argument("--max-disk-bytes", type=BYTES, default=None, metavar="B",
                   help="kernel outputs spilled to a temporary file, at most B bytes per graph call (default: half "
                        "the free space of --spill-dir; 0: no disk spill); only outputs beyond all three budgets "
                        "are not compared, and the report says so")
    a.add_argument("--spill-dir", metavar="DIR", default=None,
                   help="directory for the temporary spill files, removed when each graph call is checked "
                        "(default: the temp directory; a symbolic link is refused)")
    a.add_argument("--max-bytes", type=BYTES, default=None, metavar="B",
                   help="deprecated: sets --max-device-bytes on a GPU machine, --max-host-bytes otherwise")
    a.add_argument("--json", metavar="PATH", type=output_path, help="also write the verdict as JSON")
    a.add_argument("--html", metavar="PATH", type=output_path,
                   help="also write the verdict as an HTML page (culprit source, FX nodes, user lines, error heatmap)")
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
    from . import cli
    from ._files import output_problem, replaced_atomically  # (not `from . import`: that imports torch)
    from ._runner import run_for_status

    found = cli.program_target("accuracy", args.command, args.module_name)
    if found is None:
        return 2
    target, module = found
    for out in (args.json, args.html):
        problem = out and output_problem(out, cli.program_files(target, module))  # Note [An output is never an input]
        if problem:
            print(f"kdebug accuracy: {problem}", file=sys.stderr)
            return 2
    from . import accuracy
    status = [0]

    def program():
        status[0] = run_for_status(target, module)

    try:
        budgets = accuracy._budgets(args.max_bytes, args.max_device_bytes, args.max_host_bytes,
                                    args.max_disk_bytes, args.spill_dir)
    except (ValueError, TypeError, OSError) as e:  # a bad budget, a spill dir that is a link or missing
        print(f"kdebug accuracy: {e}", file=sys.stderr)
        return 2
    try:
        report = accuracy.check(program, rtol=args.rtol, atol=args.atol, factor=args.factor,
                                calls_per_graph=args.calls_per_graph, max_device_bytes=budgets.device,
                                max_host_bytes=budgets.host, max_disk_bytes=budgets.disk,
                                spill_dir=budgets.spill_dir)
    except ValueError as e:
        print(f"kdebug accuracy: {e}", file=sys.stderr)
        return 2
    print(report.summary())
    if status[0]:
        print(f"kdebug accuracy: the program exited with status {status[0]}; the verdict covers the graph calls "
              "made before that", file=sys.stderr)
    if args.json:
        with replaced_atomically(args.json) as f:
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
    if report.no_verdict:
        print("kdebug accuracy: kernel outputs over every budget were not recorded, and no compared kernel is "
              "worse: no verdict (raise --max-disk-bytes)", file=sys.stderr)
        return 2
    return 1 if report.culprit is not None else 0
