"""`kdebug analyze --type guards|constraints|summary script.py`: run a
script once and say what torch.compile did with it (Note [Compile
inspector]) and which constraint violations kdebug.backends.constrained
recorded in it (Note [Constraint backend])."""
from __future__ import annotations

import argparse
import collections
import json
import sys

from ._argtypes import output_path

TYPES = ("guards", "constraints", "summary")


def add_parser(sub) -> None:
    a = sub.add_parser("analyze", help="run a script once: graphs, graph breaks, recompilations and guards "
                                       "(--type guards), constraint violations (--type constraints), or both "
                                       "in brief (summary); exit 1 when violations were found, 2 on error")
    a.add_argument("--type", dest="kind", choices=TYPES, default="summary")
    a.add_argument("--json", metavar="PATH", type=output_path,
                   help="also write the analysis as JSON ('-': to stdout, instead of text)")
    a.add_argument("--html", metavar="PATH", type=output_path,
                   help="also write a self-contained HTML report (violations by model, breaks, recompilations, "
                        "graphs, benchmark results)")
    a.add_argument("--bench", metavar="JSON", action="append", default=None,
                   help="benchmark results to put in the report and JSON (repeatable; default: "
                        "benchmarks/results/bringup_*.json when present)")
    a.add_argument("-m", dest="module_name", metavar="MODULE", default=None,
                   help="analyze a module, as python -m MODULE [args...] would run it")
    a.add_argument("command", nargs=argparse.REMAINDER, help="script.py [args...]")
    a.set_defaults(fn=run)


def constraints_text(vs: list, checked: list) -> str:
    nodes = sum(c.nodes for c in checked)
    unchecked = sum(len(c.unchecked) for c in checked)
    lines = [f"kdebug constraints: {len(vs)} violation(s) in {len(checked)} graph(s) checked ({nodes} nodes)"
             + (f"; {unchecked} value(s) with symbolic sizes not decided" if unchecked else "")]
    if not checked:
        lines.append("  no graph was checked: compile with backend=kdebug.backends.constrained(caps)")
    by_kind = collections.Counter(v.constraint for v in vs)
    if by_kind:
        lines.append("  by constraint: " + ", ".join(f"{k} {n}" for k, n in by_kind.most_common()))
    for v in vs:
        lines.append(f"  - {v.message()}")
        if v.repro:
            lines.append(f"    repro: python {v.repro}/repro.py")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from . import cli
    from ._files import output_problem, replaced_atomically  # (not `from . import`: that imports torch)
    from ._runner import run_for_status

    found = cli.program_target("analyze", args.command, args.module_name)
    if found is None:
        return 2
    target, module = found
    to_stdout = args.json == "-"
    reads = cli.program_files(target, module)  # Note [An output is never an input]
    problem = (args.json and not to_stdout and output_problem(args.json, reads)
               or args.html and output_problem(args.html, reads))
    if problem:
        print(f"kdebug analyze: {problem}", file=sys.stderr)
        return 2
    from .backends import checks, clear_violations, violations
    from .inspect_compile import CompileInspector

    clear_violations()
    with CompileInspector() as insp:
        status = run_for_status(target, module)
    report = insp.report()
    vs, checked = violations(), checks()
    out: dict = {"program": " ".join(target), "exit_status": status}
    text = []
    if args.kind in ("guards", "summary"):
        out["compile"] = report.to_json()
        text.append(report.summary(guards=args.kind == "guards"))
    if args.kind in ("constraints", "summary"):
        out["constraints"] = {"graphs_checked": len(checked), "violations": [v.to_json() for v in vs],
                              "checks": [c.to_json() for c in checked]}
        text.append(constraints_text(vs, checked))
    from . import bringup_html

    bench = bringup_html.find_bench(args.bench)
    if bench:
        out["benchmarks"] = bench
        text.append("benchmarks: " + ", ".join(f"{b['file']} ({len(b['rows'])} row(s)"
                                                + (f"; {b['problem']}" if b["problem"] else "") + ")" for b in bench))
    if args.html:
        bringup_html.write_html(args.html, out, bench)
        text.append(f"HTML report: {args.html}")
    if to_stdout:
        json.dump(out, sys.stdout, indent=1)
        print()
    else:
        print("\n\n".join(text))
    if args.json and not to_stdout:
        with replaced_atomically(args.json) as f:
            json.dump(out, f, indent=1)
    if status:
        print(f"kdebug analyze: the program exited with status {status}; the analysis covers what ran before that",
              file=sys.stderr)
    if args.kind != "guards" and vs:
        return 1
    if status and not report.graphs and not checked:
        return 2
    return 0
