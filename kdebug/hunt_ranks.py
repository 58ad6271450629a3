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
rank.  The element-level re-run (Note [Element-level differences]) is made
for the same rank: the job is started once more with that rank capturing
its roots' inputs (repro.Program's nproc and rank), and each root's repro is
launched on its own, in one process; a collective root is not (it needs the
other ranks) and says so.

``--try-fixes`` starts the whole job ``--runs`` times per fix, the fix
applied in every rank (the runner's --fix); a fix REMOVES the divergence
when every rank's runs match and every run's replicas agree.

``--html OUT.html`` writes one page per rank, named as the traces are
(OUT.rank{R}.html): rank R's runs compared as the single-process report
compares runs, with the job's summary (every rank's line, the replicas)
and, on the rank they were made for, the proof by replay and the re-run.

``--in-process`` is refused: the ranks are processes of their own, started
by torch's launcher.
"""
from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass

from ._stdin import run as _run_program  # (not `from . import`: the package's lazy names import torch)

UNSUPPORTED = (("in_process", "--in-process"),)

# Note [Gloo exit race] (kdebug/_runner.py): what a rank prints when torch's
# gloo thread aborts it at interpreter exit
EXIT_RACE = "terminate called without an active exception"


def exit_race(output: str, nproc: int) -> bool:
    """Whether a failed job's output is torch's gloo exit race: a rank
    aborted by std::terminate after every rank's runner said its program
    finished with status 0 (Note [Gloo exit race])."""
    import re

    from ._runner import FINISHED

    pattern = re.escape(FINISHED).replace(r"\{rank\}", r"(\d+)").replace(r"\{status\}", r"(-?\d+)")
    ok = {int(r) for r, s in re.findall(pattern, output) if s == "0"}
    return EXIT_RACE in output and ok == set(range(nproc))


def unsupported_options(args) -> list[str]:
    """The hunt options given that --nproc cannot take (the ranks are
    processes of their own, started by torch's launcher)."""
    return [flag for attr, flag in UNSUPPORTED if getattr(args, attr, None)]


def _record_job(i, nproc: int, out: str, target: list[str], module: bool, env: dict | None = None,
                fix: str | None = None) -> int:
    """Starts the job once through torch's launcher (run i: a number, or a
    label such as 'confirm root 1'), every rank recording into rank_path(out, R)
    (``fix``: the runner's --fix, applied in every rank)."""
    from .cli import launcher_cmd
    from .compare import side_name

    name = side_name(i) + (f", fix {fix}" if fix else "")
    print(f"kdebug hunt: {name}: {nproc} rank(s) through torch.distributed.run", file=sys.stderr)
    proc = _run_program(launcher_cmd(nproc, out, target, module, fix), {**os.environ, **(env or {})})
    if proc.returncode != 0:
        print(proc.stdout[-4000:], file=sys.stderr)
        if exit_race(proc.stdout, nproc):
            print(f"kdebug hunt: {name}: every rank's program finished with status 0, then a rank was aborted "
                  f"at exit by std::terminate (\"{EXIT_RACE}\"), exit status {proc.returncode}: most likely a "
                  "known torch race at exit (a gloo thread releasing its last collective's tensors during "
                  "interpreter shutdown): run the hunt again; if it recurs every time, look for threads your "
                  "program or its extensions leave running at exit.", file=sys.stderr)
        else:
            print(f"kdebug hunt: {name} exited with status {proc.returncode}"
                  + ("" if fix else "; fix the program first"), file=sys.stderr)
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
    from .compare import is_collective  # (here: the options --nproc refuses are checked without torch)

    return {"root": root.step_a.label(), "kind": root.kind, "collective": is_collective(root.step_a),
            "consequences": root.consequences}


# How a rank's runs differ (hunt.json ranks[R]["how"]); the first three make
# it an origin, where the difference started
_HOW = {
    "computed": "a step computed differently here from identical inputs (origin)",
    "outside": "an input changed outside the recording here: data, RNG or a step not recorded (origin)",
    "structure": "the runs launched different work here (origin)",
    "config": "autotuning chose another launch config for a kernel here, with identical outputs (origin",  # + _pin()
    "shapes": "a step ran with other shapes or scalar arguments here (origin)",
    "received": "only collectives differ here",
}


def _pin() -> str:
    """How this torch pins autotuning's choice, closing _HOW["config"]'s parenthesis."""
    from . import _upstream

    pin = _upstream.autotuning_pin()
    return f"; {pin} {'pins' if ' and ' not in pin else 'pin'} the choice)"


def rank_result(rank: int, reports: list) -> dict:
    """One rank's run-to-run result (hunt.json ``ranks[R]``)."""
    bad = [r for r in reports if not r.ok]
    if not bad:
        return {"rank": rank, "match": True, "roots": [], "structural": [], "origin": False, "how": None,
                "diverged_runs": []}
    every = [_root_entry(x) for x in bad[0].roots]
    if any(x["kind"] == "root" and not x["collective"] for x in every):
        how = "computed"
    elif any(x["kind"] != "root" for x in every):
        how = "outside"
    elif every:
        how = "received"
    else:
        config, shapes = list(getattr(bad[0], "config_changes", ())), list(getattr(bad[0], "shape_changes", ()))
        # a report that differs by its CONFIG / SHAPES lines alone: not other work
        how = "structure" if bad[0].structural or not (config or shapes) else "shapes" if shapes else "config"
        changed = shapes if how == "shapes" else config
    return {"rank": rank, "match": False, "roots": every[:5], "structural": list(bad[0].structural[:3]),
            "changed": [x.label() for x, _ in changed[:3]] if how in ("config", "shapes") else [],
            "origin": how != "received", "how": how, "diverged_runs": [r.runs[1] for r in bad]}


@dataclass
class JobVerdict:
    """A job's runs judged (Note [Hunting ranks]): per rank, its run-to-run
    result (rank_result) and the first report that differs; per run, its
    replicas across ranks."""

    ranks: dict
    first_bad: dict
    replicas: list
    grouped: bool = True  # some rank initialized a process group (META groups)

    @property
    def run_diverged(self) -> list[int]:
        return [r for r, x in self.ranks.items() if not x["match"]]

    @property
    def rep_diverged(self) -> list[int]:
        return [x["run"] for x in self.replicas if not x["match"]]

    @property
    def diverged(self) -> bool:
        return bool(self.run_diverged or self.rep_diverged)

    @property
    def origins(self) -> list[int]:
        return [r for r in self.run_diverged if self.ranks[r]["origin"]]

    def focus(self) -> int | None:
        """The rank where the difference started: the first origin rank,
        else the first rank whose runs differ; None when they all match."""
        return (self.origins or self.run_diverged or [None])[0]

    def summary(self, nproc: int, runs: int) -> list[str]:
        out = []
        if not self.run_diverged:
            out.append(f"run to run: every rank's runs match ({nproc} rank(s))")
        else:
            out.append(f"run to run: rank(s) {self.run_diverged} of {nproc} diverged")
            for r in self.run_diverged:
                x = self.ranks[r]
                how = x.get("how") or "received"
                if how == "structure":
                    first = f"first difference: {x['structural'][0] if x['structural'] else 'none named'}"
                elif how in ("config", "shapes"):
                    first = f"first difference at {(x.get('changed') or ['a step'])[0]}"
                elif how == "outside":
                    first = f"first difference at {x['roots'][0]['root']}"
                else:
                    first = f"first root {x['roots'][0]['root']}"
                text = _HOW[how]
                if how == "config":
                    text += _pin()
                if how == "received":
                    text += (": it received another rank's difference" if self.origins else
                             ", and no rank computed differently or took other inputs: the collective returned "
                             "another result here (its reduction order, its transport)")
                out.append(f"  rank {r}: {first}; {text}")
            if self.origins:
                out.append(f"the difference started on rank(s) {self.origins}")
            else:
                out.append(f"the difference first appears in collective outputs, on rank(s) {self.run_diverged}")
        if not self.grouped:
            out.append("WARNING: no rank initialized a process group (init_process_group was never called): the "
                       "ranks ran as separate processes, no collective ran, nothing had to agree across ranks")
        if nproc == 1:
            out.append("replicas: one rank, nothing to compare across ranks")
        elif not self.rep_diverged:
            out.append(f"replicas: every run's replicas agree across ranks ({runs} run(s))")
        else:
            for x in self.replicas:
                if not x["match"]:
                    out.append(f"replicas: run {x['run']} DIVERGES across ranks: first at {x['first'] or 'structure'}")
        return out


def _record_jobs(args, tmp: str, target: list[str], module: bool, fix: str | None = None) -> list[str] | None:
    """The job started ``args.runs`` times; the stems of its traces (run i:
    rank R writes rank_path(stem i, R)), or None when a run failed."""
    stems = []
    for i in range(args.runs):
        out = os.path.join(tmp, f"{'fix-' + fix + '-' if fix else ''}run{i}.kdt")
        if _record_job(i, args.nproc, out, target, module, fix=fix) != 0:
            return None
        stems.append(out)
    return stems


def _load_jobs(stems: list[str], nproc: int) -> list | None:
    import kdebug

    from .ranks import RankedRun

    try:
        jobs = [kdebug.load(s) for s in stems]
    except kdebug.TraceFileError as e:
        print(f"kdebug hunt: {e}", file=sys.stderr)
        return None
    for s, job in zip(stems, jobs):
        if not isinstance(job, RankedRun) or job.ranks != list(range(nproc)):
            got = job.ranks if isinstance(job, RankedRun) else "one process's trace"
            print(f"kdebug hunt: {s}: expected the traces of ranks 0..{nproc - 1}, found {got} (did the program "
                  "call init_process_group? every rank must run under the launcher)", file=sys.stderr)
            return None
    return jobs


def judge_job(stems: list[str], jobs: list, nproc: int, quiet: bool = False) -> JobVerdict:
    """Rank R run to run, and each run's replicas across ranks; prints the
    reports unless ``quiet``.  Raises what an unreadable trace raises."""
    from .compare import compare_many, format_report
    from .crossrank import compare_ranks
    from .ranks import rank_path

    ranks, first_bad = {}, {}
    for r in range(nproc):
        if not quiet:
            print(f"\n=== rank {r}: run to run ===")
        reports = compare_many([rank_path(s, r) for s in stems])
        if not quiet:
            for rep in reports:
                print(format_report(rep, gaps_listed_after=True))  # say_gaps lists them, once
        ranks[r] = rank_result(r, reports)
        bad = [rep for rep in reports if not rep.ok]
        if bad:
            first_bad[r] = bad[0]
    if not quiet:
        print()
    replicas = []
    for i, job in enumerate(jobs):
        rep = compare_ranks(job)
        if not quiet:
            print(f"=== run {i}: replicas across ranks ===")
            print(rep)
        first = next((c.findings[0] for c in rep.comparisons if c.findings), None)
        replicas.append({"run": i, "match": rep.ok,
                         "ranks": {c.rank: {"match": c.ok, "findings": [f"{f.what} {f.text}" for f in
                                                                        c.findings[:5]],
                                            "structural": list(c.report.structural[:3])}
                                   for c in rep.comparisons},
                         "first": f"{first.what} {first.text}" if first else None})
    grouped = any("groups" in job[r].meta for job in jobs for r in job.ranks)
    return JobVerdict(ranks, first_bad, replicas, grouped)


def _try_fixes(args, tmp: str, target: list[str], module: bool) -> dict:
    """--try-fixes for a job: each fix applied in every rank, the job run
    ``--runs`` times; {fix text: whether every rank's runs match and every
    run's replicas agree}."""
    print("\nkdebug hunt: trying fixes (each applied in every rank; the whole job runs again)")
    out = {}
    for fix, text in args.fixes.items():
        stems = _record_jobs(args, tmp, target, module, fix)
        jobs = _load_jobs(stems, args.nproc) if stems is not None else None
        if jobs is None:  # kept in hunt.json as null: tried, not judged
            out[text] = None
            print(f"  {text}: the job failed with it (its output is above)")
            continue
        try:
            v = judge_job(stems, jobs, args.nproc, quiet=True)
        except Exception as e:  # an unreadable trace: this fix is not judged
            out[text] = None
            print(f"  {text}: its runs could not be compared: {e}")
            continue
        out[text] = not v.diverged
        print(f"  {text}: {'REMOVES the divergence' if not v.diverged else 'does not remove it'}")
        if v.diverged:  # where it still differs: the ranks' lines, without the replicas' details
            for line in v.summary(args.nproc, args.runs):
                if not line.startswith("replicas:"):
                    print(f"      {line}")
            if v.rep_diverged:
                print(f"      replicas: run(s) {v.rep_diverged} still disagree across ranks")
    return out


def _magnitude_rank(args, rank: int, rep, stem0: str, tmp: str, target: list[str], module: bool) -> list[dict]:
    """The element-level re-run (Note [Element-level differences]) for one
    rank's roots: the job is started once more, capturing in that rank."""
    from . import repro
    from .cli import _magnitude
    from .ranks import rank_path

    program = repro.Program(list(target), module=module, nproc=args.nproc, rank=rank)
    return _magnitude(rep, rank_path(stem0, rank), target, module, False, tmp, False, args.rerun_times,
                      program=program)


def page_hunt(hunt: dict, rank: int) -> dict:
    """What rank ``rank``'s report page shows of a --nproc hunt.json (as
    written to disk: checked by report.read_hunt_json, rank keys strings):
    its traces, the job's summary, the fixes, and the proof by replay and the
    re-run only on the rank they were made for."""
    out = {"what": f"{hunt.get('what') or 'the job'} (rank {rank} of {hunt['nproc']})",
           "paths": list(hunt["rank_paths"].get(str(rank), [])), "fixes": hunt.get("fixes", {}),
           "rank": rank, "nproc": hunt["nproc"], "summary": list(hunt.get("summary", []))}
    if hunt.get("confirm_rank") == rank and "confirm" in hunt:
        out["confirm"] = hunt["confirm"]
    if hunt.get("magnitude_rank") == rank and "magnitude" in hunt:
        out["magnitude"] = hunt["magnitude"]
    return out


def page_path(html: str, rank: int) -> str:
    """Rank R's page of ``--html OUT``: OUT.rank{R}.html (OUT.html's stem)."""
    from .ranks import rank_path

    ext = os.path.splitext(html)[1]
    return rank_path(html if ext and os.sep not in ext else html + ".html", rank)


def _write_pages(html: str, stems: list[str], hunt: dict) -> int:
    """--html for a job: rank R's page at page_path(html, R); 0, or 2 (the
    hunt lists the traces' gaps itself: the pages load them quietly)."""
    from .cli import _write_report
    from .ranks import rank_path

    for r in range(hunt["nproc"]):
        if _write_report(page_path(html, r), [rank_path(s, r) for s in stems], page_hunt(hunt, r),
                         said=True) != 0:
            return 2
    return 0


def hunt_ranks(args, tmp: str, target: list[str], module: bool, what: str) -> int:
    """Note [Hunting ranks]; 0 match, 1 diverge, 2 error."""
    from . import _files
    from .cli import program_files
    from .ranks import rank_path

    nproc = args.nproc
    if args.html:
        for r in range(nproc):
            problem = _files.output_problem(page_path(args.html, r), program_files(target, module))
            if problem:
                print(f"kdebug hunt: {problem}", file=sys.stderr)
                return 2
    t0 = time.perf_counter()
    print(f"kdebug hunt: {args.runs} runs of {what}, each {nproc} rank(s) started through torch.distributed.run; "
          "rank R compared with rank R run to run, and each run's replicas with each other")
    stems = _record_jobs(args, tmp, target, module)
    jobs = _load_jobs(stems, nproc) if stems is not None else None
    if jobs is None:
        return 2
    try:
        v = judge_job(stems, jobs, nproc)
    except Exception as e:  # an unreadable trace: say so, exit 2
        print(f"kdebug hunt: could not compare the runs: {e}", file=sys.stderr)
        return 2
    summary = v.summary(nproc, args.runs)
    print("\nkdebug hunt: summary")
    for line in summary:
        print(f"  {line}")
    hunt = {"what": what, "runs": args.runs, "nproc": nproc, "in_process": False,
            "paths": [os.path.basename(rank_path(s, 0)) for s in stems],
            "rank_paths": {r: [os.path.basename(rank_path(s, r)) for s in stems] for r in range(nproc)},
            "ranks": v.ranks, "replicas": v.replicas, "summary": summary, "fixes": {}}
    focus = v.focus()
    if focus is not None:
        hunt["focus_rank"] = focus
        hunt["paths"] = list(hunt["rank_paths"][focus])
    if args.try_fixes and v.diverged:
        hunt["fixes"] = _try_fixes(args, tmp, target, module)
    if focus is not None and not getattr(args, "no_magnitude", False):
        if v.first_bad[focus].roots:
            hunt["magnitude"] = _magnitude_rank(args, focus, v.first_bad[focus], stems[0], tmp, target, module)
            hunt["magnitude_rank"] = focus
    if getattr(args, "confirm", False) and focus is not None:
        if v.first_bad[focus].roots:  # run 0 against the first run that differs (compare_many)
            hunt["confirm"] = _confirm_rank(args, focus, v.first_bad[focus], stems[0], tmp, target, module)
            hunt["confirm_rank"] = focus
        else:
            print(f"kdebug hunt: --confirm: rank {focus}'s runs differ only in structure; nothing to replay")
    with _files.replaced_atomically(os.path.join(tmp, "hunt.json")) as f:
        json.dump(hunt, f, indent=1)
    # Note [A match needs whole recordings] (kdebug/cli.py), for every rank of every run
    gaps = [f"run {i}: {p}" for i, job in enumerate(jobs) for p in job.gaps()]
    if args.html:
        if _write_pages(args.html, stems, json.loads(json.dumps(hunt))) != 0:
            return 2
        print(f"kdebug hunt: one page per rank; start with {page_path(args.html, focus or 0)}"
              + (f" (rank {focus}, where the difference started)" if focus is not None else ""))
    where = (f"traces in {tmp}" if args.keep else "traces removed; kdebug hunt --keep DIR keeps them")
    from .cli import say_gaps

    no_verdict = say_gaps(gaps, v.diverged, (r for job in jobs for r in job))
    verdict = "runs DIVERGE" if v.diverged else "no verdict (the recordings are incomplete)" if no_verdict else \
        "all runs match"
    print(f"\nkdebug hunt: {verdict} ({time.perf_counter() - t0:.1f}s; {where})")
    return 1 if v.diverged else 2 if no_verdict else 0
