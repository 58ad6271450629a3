"""`kdebug repro` and `kdebug rerun`: one kernel launch alone (Note
[Standalone repro] in kdebug/repro.py).  Imports nothing heavy until run."""
from __future__ import annotations

import argparse
import os
import sys


def add_parser(sub) -> None:
    r = sub.add_parser("repro", help="write a standalone script that launches one recorded kernel on its recorded "
                                     "inputs and checks its outputs (exit 0 written, 2 error)")
    _common(r)
    r.add_argument("-o", "--output", required=True, metavar="DIR", help="directory to write the repro into")
    r.add_argument("--check", action="store_true", help="also run the written repro once and say what it found")
    r.set_defaults(fn=_repro)
    q = sub.add_parser("rerun", help="re-launch one recorded kernel K times on its recorded inputs: do its outputs "
                                     "vary? (exit 0 stable, 1 varies, 2 error)")
    _common(q)
    q.add_argument("--times", type=int, default=20, metavar="K", help="launches (default 20)")
    q.set_defaults(fn=_rerun)


def _common(p) -> None:
    p.add_argument("trace", nargs="?", default=None, help="the trace (.kdt) holding the launch")
    p.add_argument("--launch", type=int, metavar="N", default=None, help="launch N (kernel #N in diff and report)")
    p.add_argument("--from-hunt", metavar="DIR", default=None,
                   help="the first kernel root of a kept hunt (kdebug hunt --keep DIR), launch of its run 0")
    p.set_defaults(command=None)
    p.epilog = ("The launch's arguments are captured by re-running the program the trace recorded (kdebug record / "
                "hunt traces say which); for another trace, end with -- python script.py [args].")


def _target(args, who: str):
    from . import repro

    if args.from_hunt:
        if args.trace or args.launch is not None:
            raise repro.ReproError("give either --from-hunt DIR or TRACE --launch N, not both")
        trace, launch = repro.hunt_root(args.from_hunt)
    else:
        if not args.trace or args.launch is None:
            raise repro.ReproError(f"give the launch: kdebug {who} TRACE --launch N (or --from-hunt DIR)")
        trace, launch = args.trace, args.launch
        if not os.path.exists(trace):
            raise repro.ReproError(f"no such trace: {trace}")
    program = None
    if args.command:
        program = repro.command(args.command)
        if program is None:
            raise repro.ReproError("give the program after --, e.g. -- python script.py args")
    return trace, launch, program


def _repro(args: argparse.Namespace) -> int:
    import kdebug

    from . import repro

    try:
        trace, launch, program = _target(args, "repro")
        rep = repro.write(trace, launch, args.output, program)
    except (repro.ReproError, kdebug.TraceFileError, OSError) as e:
        print(f"kdebug repro: {e}", file=sys.stderr)
        return 2
    for n in rep.notes:
        print(f"kdebug repro: {n}")
    print(f"kdebug repro: wrote {rep.dir} for launch {launch} ({rep.kernel}); run it with: python {rep.script} "
          "(needs only torch: copy the directory)")
    if args.check:
        status, _, text = repro.run_script(rep.script, 1)
        print(text.rstrip())
    return 0


def _rerun(args: argparse.Namespace) -> int:
    import kdebug

    from . import repro

    try:
        trace, launch, program = _target(args, "rerun")
        verdict = repro.rerun(trace, launch, args.times, program)
    except (repro.ReproError, kdebug.TraceFileError, OSError) as e:
        print(f"kdebug rerun: {e}", file=sys.stderr)
        return 2
    for n in verdict.notes:
        print(f"kdebug rerun: {n}")
    print(verdict.text())
    print(f"  {verdict.matches_recorded} of {verdict.times} launches match the recorded outputs bitwise")
    return 1 if verdict.varies else 0
