"""`kdebug nan script.py`: run a script once under DebugMode(check_finite=...)
and name the first kernel launch or aten op that wrote NaN or inf from finite
inputs (Note [First non-finite value] in kdebug/finite.py)."""
from __future__ import annotations

import argparse
import json
import sys

from ._argtypes import output_path


def add_parser(sub) -> None:
    a = sub.add_parser("nan", help="run a script once and name the first kernel or aten op that writes NaN or inf "
                                   "from finite inputs (exit 0 none, 1 found, 2 error)")
    a.add_argument("--inputs", action="store_true",
                   help="also check what every step reads, before it runs (about twice the hashing; tells a NaN "
                        "already in a parameter or program input from one a step made)")
    a.add_argument("--json", metavar="PATH", type=output_path, help="also write the verdict as JSON")
    a.add_argument("-m", dest="module_name", metavar="MODULE", default=None,
                   help="check a module, as python -m MODULE [args...] would run it")
    a.add_argument("command", nargs=argparse.REMAINDER, help="script.py [args...]")
    a.set_defaults(fn=run)


def run(args: argparse.Namespace) -> int:
    from . import cli
    from ._files import output_problem, replaced_atomically  # (not `from . import`: that imports torch)
    from ._runner import run_for_status

    found = cli.program_target("nan", args.command, args.module_name)
    if found is None:
        return 2
    target, module = found
    problem = args.json and output_problem(args.json, cli.program_files(target, module))
    if problem:
        print(f"kdebug nan: {problem}", file=sys.stderr)
        return 2
    import kdebug
    from . import provenance

    provenance.install()  # FX nodes and source lines of every graph the script compiles
    with kdebug.DebugMode(check_finite="inputs" if args.inputs else True) as dm:
        status = run_for_status(target, module)
    try:
        report = dm.first_nonfinite()
    except ValueError as e:  # the program replaced the stats hash with its own log_tensor_hashes everywhere
        print(f"kdebug nan: {e}", file=sys.stderr)
        return 2
    print(report.summary())
    if status:
        print(f"kdebug nan: the program exited with status {status}; the verdict covers what ran before that",
              file=sys.stderr)
    if args.json:
        with replaced_atomically(args.json) as f:
            json.dump(report.to_json(), f, indent=1)
    if report.steps == 0:
        print("kdebug nan: nothing was recorded (does the script run any torch op?)", file=sys.stderr)
        return 2
    return 1 if (report.first is not None or report.entered) else 0
