"""``kdebug hunt --nproc N script.py``: a distributed job hunted run to run,
rank by rank, and its replicas compared within each run.

Note [Hunting ranks]
The job is started ``--runs`` times (2 by default) through torch's launcher,
as ``kdebug record --nproc N`` starts it (cli.launcher_cmd): run i writes
``run{i}.rank{R}.kdt``.  Two comparisons follow, both by engines that exist:

- run to run, rank R of every run against rank R of run 0 (compare.compare:
  the single-process hunt's engine, with its roots and data flow).  A rank
  whose only roots are collectives did not compute anything differently
  itself: what it received from another rank changed.  A rank with a root
  that is no collective is where a difference started (its *origin*).  The
  summary names the ranks that diverged, their first roots, and the origin
  ranks;
- within each run, every rank against rank 0 (crossrank.compare_ranks, Note
  [Cross-rank comparison]): replicas that must agree.

The hunt DIVERGES (exit 1) when either finds a difference: rank R's runs
differ, or a run's replicas disagree.  hunt.json records both, per rank and
per run.

``--confirm`` proves the first roots of one rank by replay (Note [Proof by
replay]): the rank where the difference started (the first origin rank, else
the first rank that diverged).  The job is started again in pairs, the
replay specs in every rank's environment but acting only in that rank
(Spec.rank against RANK, set by torch's launcher), and that rank's traces of
the pair are compared; the verdicts go to hunt.json ``confirm`` with the
rank.  ``--try-fixes``, ``--in-process`` and ``--html`` are not supported
with --nproc yet, and the element-level magnitude re-run is not made: they
are refused (or said to be skipped), never silently ignored.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from . import collectives

UNSUPPORTED = (("try_fixes", "--try-fixes"), ("in_process", "--in-process"), ("html", "--html"))


def unsupported_options(args) -> list[str]:
    """The hunt options given that --nproc does not support yet."""
    return [flag for attr, flag in UNSUPPORTED if getattr(args, attr, None)]


def _record_job(i, nproc: int, out: str, target: list[str], module: bool, env: dict | None = None) -> int:
    """Starts the job once through torch's launcher (run i: a number, or a
    label such as 'confirm root 1'), every rank recording into rank_path(out, R)."""
    from .cli import launcher_cmd
    from .compare import side_name

    name = side_name(i)
    print(f"kdebug hunt: {name}: {nproc} rank(s) through torch.distributed.run", file=sys.stderr)
    proc = subprocess.run(launcher_cmd(nproc, out, target, module), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, env={**os.environ, **(env or {})})
    if proc.returncode != 0:
        print(proc.stdout[-4000:], file=sys.stderr)
        print(f"kdebug hunt: {name} exited with status {proc.returncode}; fix the program first", file=sys.stderr)
    return proc.returncode


def _confirm_rank(args, rank: int, rep, stem0: str, tmp: str, target: list[str], module: bool) -> list[dict]:
    """--confirm for one rank (Note [Hunting ranks]): its report's roots
    (run 0 against a later run) proved by replay in that rank while the
    whole job runs; one verdict per root, as the single-process hunt's."""
    from .cli import _confirm
    from .ranks import rank_path

    def record_pair(label: str, envs: list, prefix: str):
        paths = []
        for k, env in enumerate(envs):
            out = os.path.join(tmp, f"{prefix}run{k}.kdt")
            if _record_job(f"{label}, job {k}", args.nproc, out, target, module, env) != 0:
                return None
            paths.append(rank_path(out, rank))
        return paths

    print(f"\nkdebug hunt: confirming rank {rank}'s roots by replay in rank {rank} (the job runs whole)")
    return _confirm(rep, rank_path(stem0, rank), target, module, False, tmp, False,
                    tries=args.confirm_tries, record_pair=record_pair, rank=rank)


def _root_entry(root) -> dict:
    return {"root": root.step_a.label(), "kind": root.kind,
            "collective": root.step_a.kind == "aten" and collectives.is_collective_name(root.step_a.name),
            "consequences": root.consequences}


def rank_result(rank: int, reports: list) -> dict:
    """One rank's run-to-run result (hunt.json ``ranks[R]``)."""
    bad = [r for r in reports if not r.ok]
    roots = [_root_entry(x) for x in bad[0].roots[:5]] if bad else []
    structural = list(bad[0].structural[:3]) if bad else []
    own = [x for x in roots if x["kind"] == "root" and not x["collective"]]
    return {"rank": rank, "match": not bad, "roots": roots, "structural": structural,
            "origin": bool(own), "diverged_runs": [r.runs[1] for r in bad]}


def hunt_ranks(args, tmp: str, target: list[str], module: bool, what: str) -> int:
    """Note [Hunting ranks]; 0 match, 1 diverge, 2 error."""
    import kdebug

    from . import _files
    from .compare import compare_many
    from .crossrank import compare_ranks
    from .ranks import RankedRun, rank_path

    nproc = args.nproc
    t0 = time.perf_counter()
    print(f"kdebug hunt: {args.runs} runs of {what}, each {nproc} rank(s) started through torch.distributed.run; "
          "rank R compared with rank R run to run, and each run's replicas with each other")
    if not getattr(args, "no_magnitude", False):
        print("kdebug hunt: (with --nproc the element-level magnitude re-run is not made yet)")
    stems = []
    for i in range(args.runs):
        out = os.path.join(tmp, f"run{i}.kdt")
        if _record_job(i, nproc, out, target, module) != 0:
            return 2
        stems.append(out)
    try:
        jobs = [kdebug.load(s) for s in stems]
    except kdebug.TraceFileError as e:
        print(f"kdebug hunt: {e}", file=sys.stderr)
        return 2
    for s, job in zip(stems, jobs):
        if not isinstance(job, RankedRun) or job.ranks != list(range(nproc)):
            got = job.ranks if isinstance(job, RankedRun) else "one process's trace"
            print(f"kdebug hunt: {s}: expected the traces of ranks 0..{nproc - 1}, found {got} (did the program "
                  "call init_process_group? every rank must run under the launcher)", file=sys.stderr)
            return 2
    ranks, first_bad = {}, {}
    try:
        for r in range(nproc):
            print(f"\n=== rank {r}: run to run ===")
            reports = compare_many([rank_path(s, r) for s in stems])
            for rep in reports:
                print(rep)
            ranks[r] = rank_result(r, reports)
            bad = [rep for rep in reports if not rep.ok]
            if bad:
                first_bad[r] = bad[0]
        print()
        replicas = []
        for i, job in enumerate(jobs):
            rep = compare_ranks(job)
            print(f"=== run {i}: replicas across ranks ===")
            print(rep)
            first = next((c.findings[0] for c in rep.comparisons if c.findings), None)
            replicas.append({"run": i, "match": rep.ok,
                             "ranks": {c.rank: {"match": c.ok, "findings": [f"{f.what} {f.text}" for f in
                                                                            c.findings[:5]],
                                                "structural": list(c.report.structural[:3])}
                                       for c in rep.comparisons},
                             "first": f"{first.what} {first.text}" if first else None})
    except Exception as e:  # an unreadable trace: say so, exit 2
        print(f"kdebug hunt: could not compare the runs: {e}", file=sys.stderr)
        return 2
    run_diverged = [r for r, x in ranks.items() if not x["match"]]
    rep_diverged = [x["run"] for x in replicas if not x["match"]]
    diverged = bool(run_diverged or rep_diverged)
    print("\nkdebug hunt: summary")
    if not run_diverged:
        print(f"  run to run: every rank's runs match ({nproc} rank(s))")
    else:
        origins = [r for r in run_diverged if ranks[r]["origin"]]
        print(f"  run to run: rank(s) {run_diverged} of {nproc} diverged")
        for r in run_diverged:
            x = ranks[r]
            first = x["roots"][0]["root"] if x["roots"] else (x["structural"][0] if x["structural"] else "?")
            how = ("a step computed differently here (origin)" if x["origin"] else
                   "only collectives differ here: it received another rank's difference" if x["roots"] else
                   "the runs' structure differs")
            print(f"    rank {r}: first root {first}; {how}")
        if origins:
            print(f"  the difference started on rank(s) {origins}")
        else:
            print("  no rank computed differently from identical inputs: the difference entered through "
                  "collectives or from outside the recording")
    if not rep_diverged:
        print(f"  replicas: every run's replicas agree across ranks ({args.runs} run(s))")
    else:
        for x in replicas:
            if not x["match"]:
                print(f"  replicas: run {x['run']} DIVERGES across ranks: first at {x['first'] or 'structure'}")
    confirm, confirm_rank = None, None
    if getattr(args, "confirm", False) and run_diverged:
        origins = [r for r in run_diverged if ranks[r]["origin"]]
        r = confirm_rank = (origins or run_diverged)[0]
        if first_bad[r].roots:  # run 0 against the first run that differs (compare_many)
            confirm = _confirm_rank(args, r, first_bad[r], stems[0], tmp, target, module)
        else:
            print(f"kdebug hunt: --confirm: rank {r}'s runs differ only in structure; nothing to replay")
    hunt = {"what": what, "runs": args.runs, "nproc": nproc, "in_process": False,
            "paths": [os.path.basename(rank_path(s, 0)) for s in stems],
            "rank_paths": {r: [os.path.basename(rank_path(s, r)) for s in stems] for r in range(nproc)},
            "ranks": ranks, "replicas": replicas, "fixes": {}}
    if confirm is not None:
        hunt["confirm"], hunt["confirm_rank"] = confirm, confirm_rank
    with _files.replaced_atomically(os.path.join(tmp, "hunt.json")) as f:
        json.dump(hunt, f, indent=1)
    where = (f"traces in {tmp}" if args.keep else "traces removed; kdebug hunt --keep DIR keeps them")
    print(f"\nkdebug hunt: {'runs DIVERGE' if diverged else 'all runs match'} "
          f"({time.perf_counter() - t0:.1f}s; {where})")
    return 1 if diverged else 0
