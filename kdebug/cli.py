"""The ``kdebug`` command (also ``python -m kdebug``)."""
from __future__ import annotations

import argparse
import os
import re
import sys
import time

# (not `from . import _stdin`: that asks the package's lazy names, which import torch)
from ._stdin import begin as _stdin_begin, current_stream as _stdin_stream, run as _run_program
# Note [Terminal-safe text]: trace strings in a line printed escaped (kdebug/_termtext.py imports nothing heavy)
from ._termtext import escape as _escape, output as _output, raw as _raw


def _demo(args: argparse.Namespace) -> int:
    import torch

    import kdebug
    from kdebug.workloads import TinyBlock, train_step_fn

    device = args.device
    if device == "cuda" and not torch.cuda.is_available():
        print("kdebug demo: --device cuda asked for, but torch sees no CUDA device", file=sys.stderr)
        return 2
    torch.manual_seed(0)
    model = TinyBlock(d=args.d, heads=4).to(device)
    x = torch.randn(2, 16, args.d, device=device)
    step = train_step_fn(model)
    t0 = time.perf_counter()
    step(x)  # compile and warm up outside the recording
    compile_s = time.perf_counter() - t0
    with kdebug.DebugMode(record_triton_kernels=True) as dm:
        step(x)
    print(dm.debug_string(verbose=args.verbose))
    kernels = dm.kernels
    stats = dm.kernel_stats
    kinds = sorted({k.kind for k in kernels})
    print(f"\nkdebug demo: compiled a transformer block (forward + backward) on {device} "
          f"in {compile_s:.1f}s; one step launched {len(kernels)} Inductor kernel(s) "
          f"({', '.join(kinds)}) and {len(dm.operators) - len(kernels)} recorded aten op(s).")
    print(f"recorder: {stats['launches']} launches, {stats['dropped']} dropped, "
          f"{stats['errors']} hook errors, complete={stats['complete']}")
    return 0 if stats["complete"] and kernels else 1


def _info(args: argparse.Namespace) -> int:
    import torch

    import kdebug
    from kdebug import inductor

    print(f"kdebug {kdebug.__version__}  torch {torch.__version__}  python {sys.version.split()[0]}")
    try:
        import triton

        print(f"triton {triton.__version__}")
    except ImportError:
        print("triton: not installed (C++ kernels only)")
    print(f"CUDA available: {torch.cuda.is_available()}")
    for w in inductor.config_bypass_warnings():
        print("warning:", w)
    return 0


# ---------------------------------------------------------------- record / show / diff / hunt


# an interpreter's name: python, python3, python3.11, python3.13t, python3.11d (not python_step.py)
_INTERPRETER = re.compile(r"python(\d+(\.\d+)*)?[tdm]*(\.exe)?")


def _is_interpreter(word: str) -> bool:
    return bool(_INTERPRETER.fullmatch(os.path.basename(word))) or word == sys.executable


def _split_command(cmd: list[str]) -> tuple[list[str], bool]:
    """The program part of `python script.py args` / `python -m mod args` /
    `script.py args` / `/usr/bin/env python script.py args`, and whether it is
    a module.  A script whose name begins with "python" (python_step.py) is
    the script, not the interpreter; interpreter options before it stay in
    front of it, for script_problem to refuse."""
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if len(cmd) > 1 and os.path.basename(cmd[0]) == "env" and _is_interpreter(cmd[1]):
        cmd = cmd[1:]
    if cmd and _is_interpreter(cmd[0]):
        cmd = cmd[1:]
    if cmd and cmd[0] == "-m":
        return cmd[1:], True
    return cmd, False


def program_files(target: list[str], module: bool) -> list[str]:
    """The files a program given as `script.py` or `-m a.b` runs, as far as
    they can be found without importing anything (the script; a module's
    file, or its package's __init__.py and __main__.py, on sys.path with the
    working directory first): what an output must never be (Note [An output
    is never an input])."""
    if not target:
        return []
    if not module:
        return [target[0]]
    parts = target[0].split(".")
    found = []
    for root in [os.getcwd()] + [p for p in sys.path if p]:
        base = os.path.join(root, *parts)
        found += [f for f in (base + ".py", os.path.join(base, "__init__.py"), os.path.join(base, "__main__.py"))
                  if os.path.isfile(f)]
        if found:
            break
    return found


def script_problem(target: list[str], module: bool) -> str | None:
    """Why a command's program cannot be run as kdebug runs it (a Python
    script or a module, in its runner), or None."""
    if module or not target:
        return None
    first = target[0]
    if first.startswith("-") and first != "-":
        return (f"python option {first} before the script is not passed on: kdebug runs a script or -m MODULE "
                "in its own interpreter; set it through the environment instead (PYTHONUNBUFFERED=1 for -u, "
                "PYTHONWARNINGS for -W, PYTHONOPTIMIZE for -O, ...), or drop it; -c is not supported")
    if not os.path.exists(first):
        return f"no such script: {first}"
    if os.path.isdir(first):  # python runs a directory's __main__.py
        return None if os.path.isfile(os.path.join(first, "__main__.py")) else \
            f"{first} is a directory without a __main__.py: give the script to run"
    try:
        with open(first, "rb") as f:
            head = f.read(4)
    except OSError as e:
        return f"cannot read {first}: {e.strerror or e}"
    if head == b"\x7fELF" or head[:2] == b"MZ":
        return f"{first} is a compiled program, not a Python script: kdebug runs Python scripts or -m MODULE"
    return None


def program_target(name: str, command: list[str], module_name: str | None = None):
    """(target, is_module) of a subcommand's program (`script.py args` or
    `-m MODULE args`), or None after printing why it cannot run (exit 2)."""
    cmd = list(command)
    if module_name:
        cmd = ["-m", module_name] + cmd
    target, module = _split_command(cmd)
    if not target:
        print(f"kdebug {name}: give the script to run, e.g. kdebug {name} train.py", file=sys.stderr)
        return None
    problem = script_problem(target, module)
    if problem:
        print(f"kdebug {name}: {problem}", file=sys.stderr)
        return None
    return target, module


def _runner_cmd(out: str, target: list[str], module: bool, fix: str | None = None, builtin: bool = False) -> list[str]:
    cmd = [sys.executable, "-m", "kdebug._runner", "--out", out]
    if fix:
        cmd += ["--fix", fix]
    if builtin:
        cmd.append("--builtin")
    elif module:
        cmd.append("-m")
    return cmd + ["--"] + target


def _all_threads(args: argparse.Namespace) -> None:
    """--all-threads: the runner (this process's and the ones it starts)
    records every thread's launches."""
    if getattr(args, "all_threads", False):
        os.environ[ALL_THREADS_ENV] = "1"


ALL_THREADS_ENV = "KDEBUG_RECORD_ALL_THREADS"  # read by kdebug/_runner.py


def _record(args: argparse.Namespace) -> int:
    _all_threads(args)
    target, module = _split_command(args.command)
    if not target:
        print("kdebug record: give the program after --, e.g. kdebug record -o run.kdt -- python train.py",
              file=sys.stderr)
        return 2
    problem = script_problem(target, module)
    if problem:
        print(f"kdebug record: {problem}", file=sys.stderr)
        return 2
    from ._files import output_problem  # (not `from . import _files`: that imports torch)

    problem = output_problem(args.output, program_files(target, module))  # before the program runs, not after
    if problem:
        print(f"kdebug record: {problem}", file=sys.stderr)
        return 2
    if getattr(args, "nproc", None) is not None:
        return _record_ranks(args.output, target, module, args.nproc)
    from . import _runner

    try:
        return _runner.record(args.output, target, module=module)
    except OSError as e:  # the trace could not be created or written (the program's own errors are its status)
        print(f"kdebug record: cannot write {args.output}: {e.strerror or e}", file=sys.stderr)
        return 2


def launcher_cmd(nproc: int, out: str, target: list[str], module: bool, fix: str | None = None,
                 builtin: bool = False) -> list[str]:
    """Note [Ranks]: torch's own launcher (python -m torch.distributed.run)
    starting ``nproc`` ranks of kdebug's runner on one machine; each rank
    writes <out stem>.rank{R}.kdt."""
    runner = _runner_cmd(out, target, module, fix, builtin)[3:]  # after `python -m kdebug._runner`
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
            "--monitor-interval=0.1", "-m", "kdebug._runner"] + runner


def _record_ranks(out: str, target: list[str], module: bool, nproc: int) -> int:
    """kdebug record --nproc N: the ranks' exit status (the launcher's)."""
    import subprocess

    if nproc < 1:
        print("kdebug record: --nproc must be at least 1", file=sys.stderr)
        return 2
    return subprocess.run(launcher_cmd(nproc, out, target, module)).returncode


def _load_or_fail(path: str):
    import kdebug

    try:
        return kdebug.load(path)
    except kdebug.TraceFileError as e:
        print(f"kdebug: {e}", file=sys.stderr)
        return None


def _show(args: argparse.Namespace) -> int:
    run = _load_or_fail(args.trace)
    if run is None:
        return 2
    if args.source is not None:
        return _show_source(run, args.source)
    print(run.debug_string(verbose=args.verbose))
    prov = run.meta.get("kernel_provenance")
    if prov and not args.verbose:  # Note [Kernel provenance]: once per kernel (verbose: in the debug string)
        print("\n# kernel provenance: the post-grad FX nodes each kernel computes")
        for name in prov:
            entries = run.provenance(name)
            for k, e in enumerate(entries):
                more = f" ({k + 1} of {len(entries)} kernels of this name)" if len(entries) > 1 else ""
                print(f"# {_escape(name)}{more}")  # Note [Terminal-safe text]: each line by itself
                for line in e.describe():
                    print(f"#   {_escape(line)}")
    return 0


def _show_source(run, n: int) -> int:
    """kdebug show --source N: launch N's kernel, its fused FX nodes, user
    source lines, module and generated source (Note [Kernel code])."""
    k = next((k for k in run.kernels if k.launch_index == n), None)
    if k is None:
        launches = [k.launch_index for k in run.kernels]
        span = f"launches {min(launches)} to {max(launches)}" if launches else "no kernel launches"
        print(f"kdebug show: no launch {n} in {run.path} (it holds {span}); kernel #N in kdebug diff and the "
              "report is launch N", file=sys.stderr)
        return 2
    entries = run.provenance(k.kernel_name)
    print(f"# launch {n}: {_escape(k.kernel_name)}")  # each line by itself
    if not entries:
        print("# the trace holds no provenance or source for this kernel (recorded before kdebug kept them, "
              "or the kernel was not compiled by Inductor in the recording process)")
        return 0
    if len(entries) > 1:
        print(f"# {len(entries)} different kernels of this name were compiled (names are unique within one "
              "graph only); launch records carry the name, so each is shown")
    for j, e in enumerate(entries):
        if len(entries) > 1:
            print(f"\n# kernel {j + 1} of {len(entries)} of this name")
        for line in e.describe():
            print(f"# {_escape(line)}")
        text = run.kernel_code(e.code_sha256) if e.code_sha256 else None
        if text is not None:
            print(f"# generated source ({len(text)} characters):")
            print(text.strip("\n"))
        elif e.code_sha256:
            print("# generated source: not kept in this trace (META kernel_code_dropped counts these)")
        else:
            print("# generated source: unknown (the kernel is not defined in a generated module kdebug read)")
    return 0


def _diff(args: argparse.Namespace) -> int:
    import kdebug

    if args.ranks:
        return _diff_ranks(args)
    if args.b is None:
        print("kdebug diff: give two traces (or one job's stem with --ranks)", file=sys.stderr)
        return 2
    if args.html:
        from ._files import output_problem

        problem = output_problem(args.html, [args.a, args.b])  # Note [An output is never an input]
        if problem:
            print(f"kdebug diff: {problem}", file=sys.stderr)
            return 2
    a, b = _load_or_fail(args.a), _load_or_fail(args.b)
    if a is None or b is None:
        return 2
    rep = kdebug.compare(a, b)
    print(rep)
    if args.html and _write_report(args.html, [a, b], None, said=True) != 0:
        return 2
    # Note [A match needs whole recordings]: matching but incomplete traces get no verdict
    return {"match": 0, "differ": 1}.get(rep.verdict, 2)


def _diff_ranks(args: argparse.Namespace) -> int:
    """kdebug diff run.kdt --ranks: Note [Cross-rank comparison]."""
    import kdebug
    from .ranks import RankedRun

    if args.b is not None:
        print("kdebug diff --ranks: give one job's trace stem (run.kdt for run.rank0.kdt, ...)", file=sys.stderr)
        return 2
    run = _load_or_fail(args.a)
    if run is None:
        return 2
    if not isinstance(run, RankedRun):
        print(f"kdebug diff --ranks: {args.a} is one process's trace; give the stem of a job's per-rank traces "
              "(kdebug record --nproc N -o run.kdt writes run.rank0.kdt, ...)", file=sys.stderr)
        return 2
    try:
        rep = kdebug.compare_ranks(run, reference=args.reference)
    except ValueError as e:
        print(f"kdebug diff --ranks: {e}", file=sys.stderr)
        return 2
    print(rep)
    gaps = run.gaps()
    if rep.ok and gaps:  # Note [A match needs whole recordings]
        print("kdebug diff --ranks: no verdict: the replicas match in what was recorded, but the recordings are "
              "INCOMPLETE:\n  " + "\n  ".join(gaps[:20]))
        return 2
    return 0 if rep.ok else 1


def _write_report(out: str, runs: list, hunt: dict | None, title: str | None = None, said: bool = False) -> int:
    """Writes the HTML report; 0, or 2 after saying why it could not.
    ``said``: the command already loaded these traces and printed their gaps
    (kdebug hunt, kdebug diff): the report loads them quietly instead of
    warning of the same gaps again (the page shows them)."""
    import kdebug
    from .report import write_html
    from .report_inputs import resolve_inputs

    try:
        if said:
            runs, found = resolve_inputs(runs)
            runs = [kdebug.load(os.fspath(r), quiet=True) if isinstance(r, (str, os.PathLike)) else r
                    for r in runs]
            hunt = hunt or found or None
        st = write_html(out, runs, hunt=hunt, title=title)
    except (kdebug.TraceFileError, FileNotFoundError, ValueError, OSError) as e:
        print(f"kdebug report: {e}", file=sys.stderr)
        return 2
    print(f"kdebug: wrote {out} ({st['bytes'] / 1e6:.1f} MB, {st['records']} records of {st['runs']} run(s), "
          f"{st['seconds']:.1f}s); open it in a browser, no server needed")
    return 0


def _report(args: argparse.Namespace) -> int:
    from .report_inputs import resolve_inputs  # (not `from . import`: that imports torch)

    from ._files import output_problem

    try:  # a hunt.json kdebug did not write, a path that is not there: refused before torch is imported
        runs, _ = resolve_inputs(args.runs)
    except (ValueError, OSError) as e:
        print(f"kdebug report: {e}", file=sys.stderr)
        return 2
    reads = [r for r in list(args.runs) + list(runs) if isinstance(r, (str, os.PathLike))]
    reads += [os.path.join(r, "hunt.json") for r in args.runs if isinstance(r, str) and os.path.isdir(r)]
    problem = output_problem(args.output, reads)  # Note [An output is never an input]
    if problem:
        print(f"kdebug report: {problem}", file=sys.stderr)
        return 2
    return _write_report(args.output, args.runs, None, args.title)


def _export(args: argparse.Namespace) -> int:
    import kdebug
    from ._files import output_problem
    from .export import export_perfetto

    problem = output_problem(args.output, [args.trace])  # Note [An output is never an input]
    if problem:
        print(f"kdebug export: {problem}", file=sys.stderr)
        return 2
    try:
        st = export_perfetto(args.trace, args.output)
    except (kdebug.TraceFileError, OSError) as e:
        print(f"kdebug export: {e}", file=sys.stderr)
        return 2
    print(f"kdebug: wrote {args.output}: {st['launches']} kernel slices, {st['events']} events "
          f"({st['bytes'] / 1e6:.1f} MB); open it at https://ui.perfetto.dev or chrome://tracing")
    return 0


class _Progress:
    """A one-line progress bar on stderr (plain lines when it is not a terminal)."""

    def __init__(self, total: int, label: str):
        self.total, self.label, self.done, self.t0 = total, label, 0, time.perf_counter()
        self.tty = sys.stderr.isatty()
        self.show("starting")

    def show(self, what: str) -> None:
        width = 24
        fill = int(width * self.done / max(self.total, 1))
        line = (f"{self.label} [{'#' * fill}{'.' * (width - fill)}] {self.done}/{self.total} "
                f"{time.perf_counter() - self.t0:5.1f}s  {what}")
        line = _escape(line)  # Note [Terminal-safe text]: the bar's own "\r" goes to the real stderr
        err = _raw(sys.stderr)
        if self.tty:
            err.write("\r" + line.ljust(100)[:100])
        else:
            err.write(line + "\n")
        err.flush()

    def step(self, what: str) -> None:
        self.done += 1
        self.show(what)

    def close(self) -> None:
        if self.tty:
            _raw(sys.stderr).write("\n")


def _record_runs(n: int, target: list[str], module: bool, builtin: bool, tmp: str, fix: str | None,
                 in_process: bool, label: str, envs: list | None = None, prefix: str = "") -> list[str] | None:
    """Records n runs; returns their trace paths, or None (the program failed).
    envs: per run, environment variables to set for it (kdebug hunt --confirm)."""
    import subprocess

    paths = []
    bar = _Progress(n, label)
    for i in range(n):
        out = os.path.join(tmp, f"{prefix}{'fix-' + fix + '-' if fix else ''}run{i}.kdt")
        bar.show(f"recording run {i}")
        env = dict(envs[i]) if envs else {}
        if in_process:
            saved_env = {k: os.environ.get(k) for k in env}
            os.environ.update(env)
            try:
                status = _record_in_process(out, target, module, builtin, fix, tmp, i)
            finally:
                for k, v in saved_env.items():
                    if v is None:
                        os.environ.pop(k, None)
                    else:
                        os.environ[k] = v
                from . import replay

                replay.activate(None)
        else:
            proc = _run_program(_runner_cmd(out, target, module, fix, builtin), {**os.environ, **env})
            status = proc.returncode
            if status != 0:
                bar.close()
                print(proc.stdout[-4000:], file=sys.stderr)
        if status != 0:
            print(f"kdebug hunt: run {i} exited with status {status}"
                  + (f" with fix {fix}" if fix else "; fix the program first"), file=sys.stderr)
            return None
        paths.append(out)
        bar.step(f"recorded run {i}")
    bar.close()
    return paths


def _record_in_process(out: str, target, module: bool, builtin: bool, fix: str | None, tmp: str, i: int) -> int:
    """One run in this process: dynamo reset and a fresh Inductor cache, so
    every run compiles (and autotunes) from scratch."""
    import torch

    from . import _runner, _upstream

    _upstream.dynamo_reset()
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(tmp, f"inductor-cache-{fix or 'base'}-{i}")
    saved, saved_stdin = list(sys.argv), sys.stdin
    shared = _stdin_stream()  # Note [One standard input for every run]
    if shared is not None:
        sys.stdin = shared
    try:
        return _runner.record(out, list(target), module=module, builtin=builtin, fix=fix)
    finally:
        sys.argv = saved
        sys.stdin = saved_stdin
        if fix == "deterministic_algorithms":
            torch.use_deterministic_algorithms(False)


def _compare_runs(paths: list[str], quiet: bool = False):
    from .compare import compare_many

    from .compare import format_report

    reports = compare_many(paths)
    if not quiet:
        for rep in reports:
            print(format_report(rep, gaps_listed_after=True))  # say_gaps lists them, once
    return reports


def _hunt(args: argparse.Namespace) -> int:
    import tempfile

    if args.runs < 2:
        print("kdebug hunt: --runs must be at least 2", file=sys.stderr)
        return 2
    if args.rerun_times < 2:
        print("kdebug hunt: --rerun-times must be at least 2 (to tell whether a root's outputs vary)",
              file=sys.stderr)
        return 2
    if args.confirm_tries < 1:
        print("kdebug hunt: --confirm-tries must be at least 1", file=sys.stderr)
        return 2
    fixes = _chosen_fixes(args.fixes)
    if isinstance(fixes, str):
        print(f"kdebug hunt: {fixes}", file=sys.stderr)
        return 2
    if args.fixes is not None and not args.try_fixes:
        print("kdebug hunt: --fixes chooses the fixes that --try-fixes tries; add --try-fixes", file=sys.stderr)
        return 2
    if getattr(args, "as_program", False):  # the kdebug command itself, not main([...]) called by a program
        _stdin_begin()  # every run reads the same standard input (Note [One standard input for every run])
    args.fixes = fixes
    _all_threads(args)
    builtin = not args.command
    if args.nproc is not None:
        from .hunt_ranks import unsupported_options

        if args.nproc < 1:
            print("kdebug hunt: --nproc must be at least 1", file=sys.stderr)
            return 2
        if builtin:
            print("kdebug hunt --nproc: give the script of the distributed job (it calls "
                  "torch.distributed.init_process_group), e.g. kdebug hunt --nproc 2 train.py", file=sys.stderr)
            return 2
        bad = unsupported_options(args)
        if bad:
            print(f"kdebug hunt --nproc: {', '.join(bad)} cannot be used with --nproc: the ranks are processes "
                  "of their own, started by torch's launcher; hunt without it (docs/distributed.md)", file=sys.stderr)
            return 2
    target, module = ([], False) if builtin else _split_command(args.command)
    if builtin:
        target = ["--device", args.device] if args.device != "cpu" else []
        what = "the built-in workload (BucketedBlock: index_add + a transformer block, forward + backward)"
    else:
        problem = script_problem(target, module)
        if problem:
            print(f"kdebug hunt: {problem}", file=sys.stderr)
            return 2
        _warn_hunt_options_after_script(args.command, target, args.hunt_options)
        what = " ".join(target)
    if args.html and args.nproc is None:  # --nproc writes a page per rank (hunt_ranks checks each)
        from ._files import output_problem  # (not `from . import _files`: that imports torch)

        problem = output_problem(args.html, [] if builtin else program_files(target, module))
        if problem:
            print(f"kdebug hunt: {problem}", file=sys.stderr)
            return 2
    if args.keep is not None and os.path.exists(args.keep) and not os.path.isdir(args.keep):
        print(f"kdebug hunt: --keep {args.keep}: not a directory", file=sys.stderr)
        return 2
    if args.keep is not None and os.path.isdir(args.keep):
        # an earlier hunt's hunt.json or traces would be drawn with this one's (kdebug report DIR reads
        # hunt.json, else run*.kdt: a failed second hunt's traces were shown under the first one's
        # hunt.json, an adversarial review); and kdebug deletes nothing it did not make in this hunt
        ours = re.compile(r"hunt\.json|(confirm[\w-]*-)?(fix-[\w-]+-)?run\d+(\.rank\d+)?\.kdt")  # what hunt writes
        old = sorted(f for f in os.listdir(args.keep) if ours.fullmatch(f))
        if old:
            print(f"kdebug hunt: --keep {args.keep} holds an earlier hunt ({', '.join(old[:4])}"
                  f"{', ...' if len(old) > 4 else ''}): its traces would be mixed with this hunt's; give a new "
                  "directory, or remove that one first", file=sys.stderr)
            return 2
    tmp = args.keep or tempfile.mkdtemp(prefix="kdebug-hunt-")
    try:
        os.makedirs(tmp, exist_ok=True)
        if args.nproc is not None:
            from .hunt_ranks import hunt_ranks

            return hunt_ranks(args, tmp, target, module, what)
        return _hunt_in(args, tmp, target, module, builtin, what)
    finally:
        if not args.keep:  # the traces are kept only when asked for (--keep DIR)
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)


def _chosen_fixes(text: str | None) -> dict | str:
    """--fixes NAME[,NAME]: {name: what it does} of the fixes --try-fixes
    tries (all by default), or why the list is wrong."""
    from ._runner import FIXES

    if text is None:
        return dict(FIXES)
    names = [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in FIXES]
    if bad or not names:
        return (f"--fixes {text!r}: unknown fix(es) {', '.join(map(repr, bad)) or '(none given)'}; "
                f"choose from {', '.join(FIXES)}")
    return {n: FIXES[n] for n in FIXES if n in names}


def _hunt_in(args: argparse.Namespace, tmp: str, target: list[str], module: bool, builtin: bool, what: str) -> int:
    t0 = time.perf_counter()
    print(f"kdebug hunt: {args.runs} runs of {what}, "
          f"{'in this process (fresh dynamo and Inductor cache each)' if args.in_process else 'each in a fresh process'}")
    paths = _record_runs(args.runs, target, module, builtin, tmp, None, args.in_process, "hunt")
    if paths is None:
        return 2
    try:
        from .trace import load

        runs = [load(p, quiet=True) for p in paths]
        reports = _compare_runs(runs)
    except Exception as e:  # an unreadable trace: say so, exit 2
        print(f"kdebug hunt: could not compare the runs: {e}", file=sys.stderr)
        return 2
    diverged = any(not r.ok for r in reports)
    # Note [A match needs whole recordings]
    # The comparison sees only what was recorded.  A run whose recording lost
    # launches (the process ended by os._exit or a signal before the trace's
    # END, a full ring, hook errors, compiled work on threads the recording
    # does not follow, graph calls that bypass the hooks) can match in what
    # it kept and differ in what it lost: a hunt of a script ending in
    # os._exit(0) reported "all runs match" (exit 0) while its printed results
    # differed.  So a hunt whose runs match but are incomplete says so and
    # gives no verdict (exit 2); a divergence found in the recorded parts stands.
    gaps = list(dict.fromkeys(g for rep in reports for g in rep.gaps))  # run 0's in every report: once
    no_verdict = say_gaps(gaps, diverged, runs)  # hunt.json and --html are still written, saying so
    hunt = {"what": what, "runs": args.runs, "in_process": args.in_process,
            "paths": [os.path.basename(p) for p in paths], "fixes": {}}
    if gaps:
        hunt["incomplete"] = gaps
    if args.try_fixes and diverged:
        print("\nkdebug hunt: trying fixes")
        for fix, text in args.fixes.items():
            fpaths = _record_runs(args.runs, target, module, builtin, tmp, fix, args.in_process, f"fix {fix}")
            if fpaths is None:  # kept in hunt.json as null: tried, not judged
                hunt["fixes"][text] = None
                print(f"  {text}: the program failed with it")
                continue
            freps = _compare_runs(fpaths, quiet=True)
            ok = all(r.ok for r in freps)
            if ok and any(r.gaps for r in freps):  # Note [A match needs whole recordings]: not judged
                hunt["fixes"][text] = None
                print(f"  {text}: no verdict: its runs match in what was recorded, but a recording is incomplete")
                continue
            hunt["fixes"][text] = ok
            print(f"  {text}: {'REMOVES the divergence' if ok else 'does not remove it'}")
            if not ok:
                first = next(r for r in freps if not r.ok)
                where = first.divergence.step_a.label() if first.divergence else "structure"
                print(_escape(f"      (first divergence still at {where})"))
    if diverged and not getattr(args, "no_magnitude", False):
        hunt["magnitude"] = _magnitude(next(r for r in reports if not r.ok), paths[0], target, module, builtin,
                                       tmp, args.in_process, args.rerun_times)
    if args.confirm and diverged:
        hunt["confirm"] = _confirm(next(r for r in reports if not r.ok), paths[0], target, module, builtin, tmp,
                                   args.in_process, tries=args.confirm_tries)
    import json

    from . import _files

    with _files.replaced_atomically(os.path.join(tmp, "hunt.json")) as f:
        json.dump(hunt, f, indent=1)
    if args.html and _write_report(args.html, [tmp], hunt, said=True) != 0:
        return 2
    where = (f"traces in {tmp}; kdebug report {tmp} -o report.html draws them" if args.keep else
             "traces removed; kdebug hunt --keep DIR keeps them for kdebug report DIR")
    verdict = "runs DIVERGE" if diverged else "no verdict (the recordings are incomplete)" if no_verdict else \
        "all runs match"
    print(f"\nkdebug hunt: {verdict} ({time.perf_counter() - t0:.1f}s; {where})")
    return 1 if diverged else 2 if no_verdict else 0


def say_gaps(gaps: list[str], diverged: bool, runs) -> bool:
    """Note [A match needs whole recordings]: prints what the hunt's
    recordings missed (``gaps``, "run N: ..." lines) and what that leaves of
    the verdict, with hints from the recorded runs' counters; True when there
    is no verdict (the runs match in what was recorded).  kdebug hunt and
    kdebug hunt --nproc (kdebug/hunt_ranks.py) say it alike."""
    if not gaps:
        return False
    print("\nkdebug hunt: the recordings are INCOMPLETE:\n  " + "\n  ".join(gaps))
    if diverged:
        print("kdebug hunt: the divergence above was found in the recorded parts; what was not recorded was "
              "not compared")
        return False
    runs = list(runs)
    hints = []
    if any(r.meta.get("stats", {}).get("other_thread_launches") for r in runs):
        hints.append("kdebug hunt --all-threads records other threads' launches")
    if any(r.meta.get("stats", {}).get("nested_unrecorded") for r in runs):
        hints.append("the script's own kdebug recording (a FlightRecorder, a DebugMode) took some launches "
                     "from the hunt's: turn it off while hunting")
    print("kdebug hunt: no verdict: the recorded parts match, but what was not recorded was not compared"
          + (f" ({'; '.join(hints)})" if hints else ""))
    return True


def _warn_hunt_options_after_script(command: list[str], target: list[str], names: set[str]) -> None:
    """Options after the script belong to the script, as with python; one
    that is also a hunt option is most likely meant for hunt: say so, loudly.
    ``kdebug hunt [options] -- script.py [args]`` says it is meant for the
    script, and is not warned about."""
    if command and command[0] == "--":
        return
    for a in target[1:]:
        if a.split("=", 1)[0] in names:
            print(f"kdebug hunt: WARNING: {a!r} comes after the script, so it is passed to {target[0]}, not to "
                  f"hunt. Put hunt's options before the script (kdebug hunt {a.split('=', 1)[0]} ... "
                  f"{target[0]}); write kdebug hunt [options] -- {target[0]} ... to pass it on without this "
                  "warning.", file=sys.stderr)


def _confirm(rep, path_a: str, target, module: bool, builtin: bool, tmp: str, in_process: bool,
             limit: int = 3, tries: int = 3, record_pair=None, rank: int = -1) -> list[dict]:
    """Note [Proof by replay] for the first ``limit`` roots of a report; prints
    and returns one verdict per root.  A root whose difference did not recur
    in the re-run pair (a race that happens now and then) proves nothing
    either way: the pair is recorded again, up to ``tries`` pairs in all, and
    the verdict says how many it took (``tries`` in its dict).

    ``record_pair(label, envs, prefix)``: records the capture and replay
    runs with those environments and returns the two traces to compare (or
    None when the program failed); default: two runs of the program
    (_record_runs).  ``rank``: the rank the replay acts in (kdebug hunt
    --nproc: Note [Hunting ranks]); -1 in a single process."""
    import dataclasses

    import kdebug

    from . import replay

    run_a = kdebug.load(path_a)
    out = []
    print("\nkdebug hunt: confirming the roots by replay")
    for n, root in enumerate(rep.roots[:limit], 1):
        file = os.path.join(tmp, f"confirm{n}.pt")
        spec = replay.spec_for(run_a, root, "capture", file) if root.kind == "root" else None
        if spec is not None:
            spec = dataclasses.replace(spec, rank=rank)
        if spec is None:
            why = ("a difference from outside the recording" if root.kind != "root"
                   else "its differing outputs could not be located in the re-run")
            print(_escape(f"  root {n} {root.step_a.label()}: not replayable ({why})"))
            out.append({"root": root.step_a.label(), "confirmed": None, "why": f"not replayable: {why}"})
            continue
        for attempt in range(1, max(1, tries) + 1):
            specs = [spec, dataclasses.replace(spec, mode="replay", hits=0)]
            label = f"confirm root {n}" + (f" (try {attempt} of {tries})" if attempt > 1 else "")
            envs = [{replay.ENV: s.to_env()} for s in specs]
            if record_pair is None:
                cpaths = _record_runs(2, target, module, builtin, tmp, None, in_process, label,
                                      envs=envs, prefix=f"confirm{n}-{attempt}-")
            else:
                cpaths = record_pair(label, envs, f"confirm{n}-{attempt}-")
            if cpaths is None:
                verdict, natural = {"confirmed": None, "why": "the program failed"}, None
                break
            natural, recurred = _natural_pair(spec, root, file)
            verdict = replay.judge(rep, root, kdebug.compare(*cpaths), replay.read_hits(file), recurred)
            if recurred is not False or attempt == tries:
                break
            print(_escape(f"  root {n} {root.step_a.label()}: its difference did not recur in re-run pair {attempt}; "
                        "recording the pair again"))
        verdict["tries"] = attempt
        if attempt > 1 and verdict.get("text"):
            verdict["text"] += f" (re-run pair {attempt} of at most {tries})"
        print(_escape(f"  root {n} {root.step_a.label()}: {verdict.get('text', verdict.get('why'))}"))
        if natural:
            verdict["natural"] = natural
            print(_escape(f"    the two re-runs' own outputs: {natural}"))
        out.append({"root": root.step_a.label(), **verdict})
    return out


def _natural_pair(spec, root, file: str) -> tuple[str | None, bool | None]:
    """Note [Element-level differences]: what the root wrote by itself in the
    capture run against the replay run, element by element, and whether any
    of it differed (None, None when either is missing)."""
    import torch

    from .magnitude import element_diff

    try:
        a = torch.load(file, weights_only=True)
        b = torch.load(file + ".natural", weights_only=True)
    except Exception:
        return None, None
    names = ([root.step_a.arg_names[i] for i in spec.positions] if not spec.op
             else [root.step_a.labels.get(p, p) for p in spec.paths])
    diffs = [element_diff(x, y) for x, y in zip(a, b)]
    recurred = len(a) != len(b) or any(d.differ or d.shape_mismatch for d in diffs)
    return "; ".join(f"{n}: {d.text()}" for n, d in zip(names, diffs)), recurred


def _magnitude(rep, path_a: str, target, module: bool, builtin: bool, tmp: str, in_process: bool,
               times: int = 20, limit: int = 3, program=None) -> list[dict]:
    """Note [Element-level differences]: one re-run that captures the inputs
    of the first ``limit`` roots (kernels and aten ops), then each root's
    repro launched ``times`` times on them (kdebug rerun's mechanism, Note
    [Standalone repro]): its verdict (intrinsically nondeterministic or
    stable on its inputs) and the element-level difference between the
    recorded outputs and the first launch that differs; printed and
    returned per root (a collective is not re-launched: repro.capture_many
    says why).  ``program``: how to re-run it (default: the program of
    ``target``; a distributed job's rank: repro.Program's nproc and rank)."""
    import torch

    import kdebug

    from . import repro
    from .magnitude import element_diff

    run_a = kdebug.load(path_a, quiet=True)
    roots = [r for r in rep.roots[:limit] if r.kind == "root"]
    if not roots:
        return []
    targets = [repro.target_of(run_a, r.step_a.kernel_number) if r.step_a.kind == "kernel"
               else repro.target_of(run_a, op=r.step_a.index) for r in roots]
    print(f"\nkdebug hunt: intrinsic or inherited? (one re-run capturing each root's inputs, then each root "
          f"re-launched {times}x on them)")
    program = program or repro.Program(list(target), module=module, builtin=builtin)
    dirs = [os.path.join(tmp, f"repro-root{n}") for n in range(1, len(roots) + 1)]
    bar = _Progress(1 + len(roots), "re-launch")
    bar.show("capturing the roots' inputs")
    try:
        made = repro.write_many(path_a, targets, dirs, program, quiet=True, raise_first=False)
    except repro.ReproError as e:
        bar.close()
        print(_escape(f"  could not capture the roots' inputs: {e}"))
        return [{"root": r.step_a.label(), "outputs": [], "text": f"not re-launched: {e}"} for r in roots]
    bar.step("captured")
    out = []
    for n, (root, rp) in enumerate(zip(roots, made), 1):
        entry = {"root": root.step_a.label(), "outputs": []}
        if isinstance(rp, repro.ReproError):
            entry["text"] = f"not re-launched: {rp}"
            out.append(entry)
            bar.step(f"root {n}")
            continue
        entry["repro"] = os.path.basename(rp.dir)
        save = os.path.join(tmp, f"repro-root{n}-outputs.pt")
        try:
            verdict = repro.relaunch(rp, times, save)
        except repro.ReproError as e:
            entry["text"] = f"not re-launched: {e}"
            out.append(entry)
            bar.step(f"root {n}")
            continue
        entry["rerun"] = verdict.to_json()
        parts = [verdict.summary(), f"{verdict.matches_recorded} of {times} match the outputs recorded in the "
                                    "capture re-run"]
        try:
            got = torch.load(save, weights_only=True)
        except Exception:
            got = None
        if got and got["other"] is not None:
            for name, a, b in zip(got["names"], got["recorded"], got["other"]):
                d = element_diff(a, b)
                if d.differ:
                    entry["outputs"].append({"arg": name, **d.to_json(), "text": d.text()})
            parts.append("recorded against the first launch that differs: "
                         + "; ".join(f"{o['arg']}: {o['text']}" for o in entry["outputs"]))
        elif got:
            parts.append("every launch wrote the recorded values: no element-level difference to show")
        entry["text"] = "; ".join(parts)
        for note in rp.notes:
            if note.startswith("WARNING"):
                entry["text"] += f" ({note})"
        bar.step(f"root {n}")
        out.append(entry)
    bar.close()
    for entry in out:
        print(_escape(f"  root {entry['root']}: {entry['text']}"))
    return out


def main(argv: list[str] | None = None) -> int:
    import warnings

    from ._argtypes import count, output_dir, output_path

    # torch's CPU wheel does not bring numpy, and importing torch without it
    # warns; kdebug never uses numpy, so its commands do not repeat that warning
    warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
    p = argparse.ArgumentParser(prog="kdebug", description="kernel-level debugger for torch.compile")
    sub = p.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("demo", help="compile a built-in model, record its kernels, print the debug string")
    d.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    d.add_argument("--d", type=count(1, "model width"), default=64, help="model width")
    d.add_argument("--verbose", action="store_true", help="show roles, strides, pointers, configs")
    d.set_defaults(fn=_demo)
    i = sub.add_parser("info", help="versions and settings that affect recording")
    i.set_defaults(fn=_info)
    r = sub.add_parser("record", help="record a program with no code change: kdebug record -o run.kdt -- python script.py",
                       allow_abbrev=False)
    r.add_argument("-o", "--output", required=True, type=output_path,
                   help="trace file to write (streamed while the program runs)")
    r.add_argument("--all-threads", dest="all_threads", action="store_true",
                   help="record compiled kernels launched on every thread, not only the main thread's")
    r.add_argument("--nproc", type=int, default=None, metavar="N",
                   help="start N ranks through torch.distributed.run; rank R writes OUTPUT's stem .rank{R}")
    r.add_argument("command", nargs=argparse.REMAINDER, help="-- python script.py [args...]")
    r.set_defaults(fn=_record)
    s_ = sub.add_parser("show", help="print a trace's debug string")
    s_.add_argument("trace")
    s_.add_argument("--verbose", action="store_true",
                    help="also roles, strides, pointers, configs, and each kernel's module, nodes and user lines")
    s_.add_argument("--source", type=int, metavar="N", default=None,
                    help="print launch N's kernel: its generated source, fused FX nodes and user source lines")
    s_.set_defaults(fn=_show)
    df = sub.add_parser("diff", help="compare two traces: the first divergence (exit 0 same, 1 differ, 2 error or no verdict: a recording is incomplete)")
    df.add_argument("a")
    df.add_argument("b", nargs="?", default=None)
    df.add_argument("--html", metavar="PATH", type=output_path, help="also write the HTML report")
    df.add_argument("--ranks", action="store_true",
                    help="compare a job's ranks (A: the stem of run.rank{R}.kdt): do replicas agree, which rank "
                         "and step diverged first")
    df.add_argument("--reference", type=int, default=0, help="with --ranks: the rank the others are compared with")
    df.set_defaults(fn=_diff)
    rp = sub.add_parser("report", help="write a self-contained HTML report of runs: trace files or a hunt "
                                       "directory (kdebug hunt --keep DIR)")
    rp.add_argument("runs", nargs="+", metavar="RUN_OR_HUNT")
    rp.add_argument("-o", "--output", required=True, type=output_path, help="HTML file to write")
    rp.add_argument("--title", default=None)
    rp.set_defaults(fn=_report)
    ex = sub.add_parser("export", help="export a trace for other viewers: --perfetto (Chrome trace JSON)")
    ex.add_argument("--perfetto", dest="trace", required=True, metavar="TRACE",
                    help="the trace (.kdt) to write as Chrome trace event JSON")
    ex.add_argument("-o", "--output", required=True, type=output_path)
    ex.set_defaults(fn=_export)
    # allow_abbrev=False: the script's own options come after it, and a prefix of a hunt option there
    # (--n, --conf) was taken as that option, or refused as ambiguous
    h = sub.add_parser("hunt", help="run a script N times and name the first kernel where runs diverge "
                                    "(exit 0 all match, 1 diverge, 2 error)", allow_abbrev=False)
    h.add_argument("--all-threads", dest="all_threads", action="store_true",
                   help="record compiled kernels launched on every thread (DebugMode(record_all_threads=True)); "
                        "by default the main thread and the threads torch starts from it")
    h.add_argument("--runs", type=int, default=2)
    h.add_argument("--nproc", type=int, default=None, metavar="N",
                   help="hunt a distributed job: each run starts N ranks through torch.distributed.run; rank R "
                        "is compared with rank R run to run, and each run's replicas across ranks")
    h.add_argument("--in-process", action="store_true",
                   help="run in this process, resetting dynamo and using a fresh Inductor cache each time")
    h.add_argument("--try-fixes", action="store_true",
                   help="re-run with each candidate fix and say which remove the divergence")
    h.add_argument("--fixes", metavar="NAME[,NAME]", default=None,
                   help="with --try-fixes: only these fixes (deterministic_algorithms, inductor_deterministic, "
                        "force_reduction_configs); default all")
    h.add_argument("--confirm", action="store_true",
                   help="prove each root by replay: re-run twice, the second with the root's outputs replaced by "
                        "the first's, and check that what it was blamed for no longer differs")
    h.add_argument("--confirm-tries", dest="confirm_tries", type=int, default=3, metavar="K",
                   help="with --confirm: when a root's difference does not recur in the re-run pair (a race that "
                        "happens now and then), record the pair again, up to K pairs (default 3)")
    h.add_argument("--no-magnitude", dest="no_magnitude", action="store_true",
                   help="skip the re-run that re-launches each root on its inputs (intrinsic or inherited, and how "
                        "big its difference is, element by element)")
    h.add_argument("--rerun-times", dest="rerun_times", type=int, default=20, metavar="K",
                   help="re-launch each root K times on its recorded inputs (default 20; at least 2)")
    h.add_argument("--device", default="cpu", help="device of the built-in workload (no script given)")
    h.add_argument("--keep", metavar="DIR", default=None, type=output_dir,
                   help="write the traces to DIR and keep them (default: a temp dir, removed at the end)")
    h.add_argument("--html", metavar="PATH", type=output_path, help="also write the HTML report of the runs")
    h.add_argument("-m", dest="module_name", metavar="MODULE", default=None,
                   help="hunt a module, as python -m MODULE [args...] would run it")
    h.add_argument("command", nargs=argparse.REMAINDER,
                   help="script.py [args...] (none: the built-in workload); everything after the script is "
                        "the script's, as with python: put hunt's options first")
    h.set_defaults(fn=_hunt, hunt_options={o for a in h._actions for o in a.option_strings})
    from .accuracy_cli import add_parser as add_accuracy  # (not `from . import`: that imports torch)

    add_accuracy(sub)
    from .nan_cli import add_parser as add_nan  # (likewise)
    add_nan(sub)
    from .repro_cli import add_parser as add_repro  # (likewise)
    add_repro(sub)
    from .bringup_cli import add_parser as add_analyze  # (likewise)
    add_analyze(sub)
    from .artifacts_cli import add_parsers as add_artifacts  # (likewise)
    add_artifacts(sub)
    from .minify_cli import add_parser as add_minify  # (likewise)
    add_minify(sub)
    as_program = argv is None  # the kdebug command itself (Note [One standard input for every run])
    argv = list(sys.argv[1:] if argv is None else argv)
    tail = None
    if argv and argv[0] in ("repro", "rerun") and "--" in argv:  # the program after --: not parsed here
        argv, tail = argv[:argv.index("--")], argv[argv.index("--") + 1:]
    args = p.parse_args(argv)
    args.as_program = as_program
    if tail is not None:
        args.command = tail
    if getattr(args, "module_name", None):  # kdebug hunt -m MODULE args...
        args.command = ["-m", args.module_name] + list(args.command)
    try:
        with _output():  # Note [Terminal-safe text]: what the commands print shows trace strings as text
            return args.fn(args)
    except BrokenPipeError:
        # the reader of the output went away (kdebug show run.kdt | head): no traceback; the status a
        # process ended by SIGPIPE has, and nothing more written to the closed pipe at exit
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return 128 + 13


if __name__ == "__main__":
    sys.exit(main())
