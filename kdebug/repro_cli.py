"""`kdebug repro` and `kdebug rerun`: one kernel launch alone (Note
[Standalone repro] in kdebug/repro.py).  Imports nothing heavy until run."""
from __future__ import annotations

import argparse
import os
import sys

from ._argtypes import output_dir


def add_parser(sub) -> None:
    r = sub.add_parser("repro", help="write a standalone script that launches one recorded kernel (or calls one aten "
                                     "op) on its recorded inputs and checks its outputs (exit 0 written, 2 error)")
    _common(r)
    r.add_argument("-o", "--output", required=True, metavar="DIR", type=output_dir,
                   help="directory to write the repro into")
    r.add_argument("--check", action="store_true", help="also run the written repro once and say what it found")
    r.set_defaults(fn=_repro)
    q = sub.add_parser("rerun", help="re-launch one recorded kernel (or aten op) K times on its recorded inputs: do "
                                     "its outputs vary? (exit 0 stable, 1 varies, 2 error)")
    _common(q)
    q.add_argument("--times", type=int, default=20, metavar="K", help="launches (default 20)")
    q.set_defaults(fn=_rerun)


def _common(p) -> None:
    p.add_argument("trace", nargs="?", default=None, help="the trace (.kdt) holding the launch")
    p.add_argument("--launch", type=int, metavar="N", default=None, help="launch N (kernel #N in diff and report)")
    p.add_argument("--op", type=int, metavar="N", default=None, help="aten op N (op #N in diff and report)")
    p.add_argument("--from-hunt", metavar="DIR", default=None,
                   help="a root of a kept hunt (kdebug hunt --keep DIR), kernel or aten op, in its run 0")
    p.add_argument("--root", type=int, metavar="N", default=1, help="with --from-hunt: its root N (default 1)")
    p.add_argument("--max-bytes", type=int, metavar="B", default=None,
                   help="the most bytes of argument storages to save, before and after (default 2 GiB)")
    p.set_defaults(command=None)
    p.epilog = ("The launch's arguments are captured by re-running the program the trace recorded (kdebug record / "
                "hunt traces say which); for another trace, end with -- python script.py [args].")


def _target(args, who: str):
    from . import repro

    if args.max_bytes is not None and args.max_bytes < 1:
        raise repro.ReproError("--max-bytes must be a positive number of bytes")
    if args.from_hunt:
        if args.trace or args.launch is not None or args.op is not None:
            raise repro.ReproError("give either --from-hunt DIR or TRACE --launch N / --op N, not both")
        trace, t = repro.hunt_root(args.from_hunt, args.root)
        launch, op = (t.index, None) if t.kind == "kernel" else (None, t.index)
    else:
        if not args.trace or (args.launch is None) == (args.op is None):
            raise repro.ReproError(f"give the launch: kdebug {who} TRACE --launch N or --op N (or --from-hunt DIR)")
        trace, launch, op = args.trace, args.launch, args.op
        if not os.path.exists(trace):
            raise repro.ReproError(f"no such trace: {trace}")
    program = None
    if args.command:
        program = repro.command(args.command)
        if program is None:
            raise repro.ReproError("give the program after --, e.g. -- python script.py args")
    return trace, launch, op, program


def _repro(args: argparse.Namespace) -> int:
    import kdebug

    from . import repro

    try:
        trace, launch, op, program = _target(args, "repro")
        rep = repro.write(trace, launch, args.output, program, op=op, max_bytes=_max_bytes(args))
    except (repro.ReproError, kdebug.TraceFileError, OSError) as e:
        print(f"kdebug repro: {e}", file=sys.stderr)
        return 2
    for n in rep.notes:
        print(f"kdebug repro: {n}")
    what = f"launch {launch}" if op is None else f"op {op}"
    needs = (f"needs torch and the program's module {', '.join(rep.imports)} (a custom op)" if rep.imports
             else "needs only torch: copy the directory")
    print(f"kdebug repro: wrote {rep.dir} for {what} ({rep.kernel}); run it with: python {rep.script} ({needs})")
    if args.check:
        status, _, text = repro.run_script(rep.script, 1, repro.script_env())
        print(text.rstrip())
        print(f"kdebug repro: the repro exited with status {status} (0 reproduced, 1 mismatch, 2 error)")
    return 0


def _max_bytes(args) -> int:
    from . import repro

    return repro.DEFAULT_MAX_BYTES if args.max_bytes is None else args.max_bytes


def _rerun(args: argparse.Namespace) -> int:
    import kdebug

    from . import repro

    try:
        trace, launch, op, program = _target(args, "rerun")
        verdict = repro.rerun(trace, launch, args.times, program, op=op, max_bytes=_max_bytes(args))
    except (repro.ReproError, kdebug.TraceFileError, OSError) as e:
        print(f"kdebug rerun: {e}", file=sys.stderr)
        return 2
    for n in verdict.notes:
        print(f"kdebug rerun: {n}")
    print(verdict.text())
    print(f"  {verdict.matches_recorded} of {verdict.times} launches match the recorded outputs bitwise")
    return 1 if verdict.varies else 0
