"""One kernel launch, alone: a standalone repro, and re-launches on its
recorded inputs.

    kdebug.repro.write("run.kdt", 12, "repro12/")          # kdebug repro run.kdt --launch 12 -o repro12
    kdebug.repro.rerun("run.kdt", 12, times=20)            # kdebug rerun run.kdt --launch 12 --times 20

Note [Standalone repro]
~~~~~~~~~~~~~~~~~~~~~~~
A trace holds each launch's argument hashes, not its values, and each
kernel's generated source (Note [Kernel code]).  To launch one kernel alone,
its arguments are captured by a targeted re-run: the program is run once
more, recorded as usual (kdebug._runner), with a replay Spec of mode "io"
for the launch (Note [Proof by replay]: the same kernel name, the same
occurrence of it).  Right before that launch every argument is saved, right
after it every argument again, and the kernel's async_compile call is read
from the generated module that defines it (its source, and for C++ its
argument types).  A tensor is saved as the storage it views (bytes, copied
once per storage) with its dtype, offset, size and stride: a kernel indexes
raw memory, so a contiguous clone of a strided view, or two clones of
aliased arguments, would be another input.

The re-run is checked against the trace: its hashes of the launch's
arguments before the launch must equal the trace's (else the program does
not reach this launch with the same inputs twice, and the repro says the
inputs are the re-run's, not the trace's), and the re-run's source of the
kernel must be one the trace holds for that name.

The directory written holds ``repro.py`` (kdebug/_repro_script.py, copied:
it imports torch only), ``inputs.pt`` (the arguments before and after, the
async_compile call), ``kernel_source.cpp`` or ``.py`` (the source, read back
by the script: edit it to try a fix) and ``launch.json`` (which launch of
which trace, the argument names).  The script rebuilds the kernel with
torch._inductor.async_compile as the generated module does, launches it on
fresh copies of the saved arguments and compares every tensor argument with
the saved "after", bitwise; exit 1 on a mismatch.  ``rerun`` runs the same
script with ``--times K`` and reads its verdict: K launches on identical
inputs with more than one different output is a kernel that is
nondeterministic by itself (atomics, split reductions); one output means the
run-to-run difference came from elsewhere.

Triton kernels are rebuilt with ``async_compile.triton(name, source,
device_str=...)`` and launched with ``.run(*args, stream=...)`` as the
generated wrapper does; their autotuner may launch them more than once to
benchmark configs (it restores the arguments it mutates).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_repro_script.py")


class ReproError(ValueError):
    """Why a repro cannot be made: says what to do."""


@dataclass
class Program:
    """How to run the recorded program again: what kdebug._runner takes."""

    target: list
    module: bool = False
    builtin: bool = False
    fix: str | None = None

    def runner_cmd(self, out: str) -> list:
        cmd = [sys.executable, "-m", "kdebug._runner", "--out", out]
        if self.fix:
            cmd += ["--fix", self.fix]
        if self.builtin:
            cmd.append("--builtin")
        elif self.module:
            cmd.append("-m")
        return cmd + ["--"] + list(self.target)

    def text(self) -> str:
        head = "the built-in workload" if self.builtin else "python -m" if self.module else "python"
        return " ".join([head] + list(self.target))


@dataclass
class Repro:
    """What ``write`` made: the directory, its script, and what the re-run found."""

    dir: str
    script: str
    kernel: str
    launch: int
    notes: list = field(default_factory=list)


@dataclass
class Rerun:
    """``rerun``'s verdict: ``distinct`` different outputs in ``times`` launches."""

    kernel: str
    launch: int
    times: int
    distinct: int
    matches_recorded: int
    notes: list = field(default_factory=list)

    @property
    def varies(self) -> bool:
        return self.distinct > 1

    def text(self) -> str:
        head = f"{self.kernel} (launch {self.launch}) re-launched {self.times}x on the recorded inputs: " \
               f"{self.distinct} different output(s)"
        if self.varies:
            return head + " -- INTRINSICALLY NONDETERMINISTIC (the kernel itself: atomics, split reductions)"
        return head + (" -- STABLE (the run-to-run difference came from elsewhere: its inputs, config, "
                       "or another process)")


# ---------------------------------------------------------------- the program

def program_of(run) -> Program | None:
    """The program a trace recorded, from its META argv when kdebug started
    it (kdebug record, kdebug hunt's runs); None otherwise."""
    argv = list(run.meta.get("argv") or [])
    if not argv:
        return None
    head = argv[0].replace("\\", "/")
    if head.endswith("kdebug/_runner.py") and ("--" in argv or "--builtin" in argv):
        cut = argv.index("--") if "--" in argv else len(argv)
        opts, target = argv[1:cut], argv[cut + 1:]
        fix = opts[opts.index("--fix") + 1] if "--fix" in opts[:-1] else None
        if "--builtin" in opts:
            return Program(target, builtin=True, fix=fix)
        return Program(target, module="-m" in opts, fix=fix) if target else None
    if (head.endswith("/kdebug") or head == "kdebug" or head.endswith("kdebug/__main__.py")) \
            and len(argv) > 1 and argv[1] == "record" and "--" in argv:
        return command(argv[argv.index("--"):])
    return None


def command(cmd: list) -> Program | None:
    """The Program of ``-- python script.py args`` / ``-- python -m mod args``."""
    from .cli import _split_command

    target, module = _split_command(list(cmd))
    return Program(target, module=module) if target else None


def locate(run, launch: int):
    """(kernel call, occurrence of its name before it) of launch ``launch``."""
    n = 0
    calls = run.kernels
    call = next((k for k in calls if k.launch_index == launch), None)
    if call is None:
        idx = [k.launch_index for k in calls]
        span = f"launches {min(idx)} to {max(idx)}" if idx else "no kernel launches"
        raise ReproError(f"no launch {launch} in {run.path} (it holds {span}); kernel #N in kdebug diff and the "
                         "report is launch N")
    for k in calls:
        if k.launch_index == launch:
            break
        if k.kernel_name == call.kernel_name:
            n += 1
    return call, n


# ---------------------------------------------------------------- capture

def capture(trace: str, launch: int, out_dir: str, program: Program | None = None, quiet: bool = False):
    """Re-runs the program recording launch ``launch``'s arguments before
    and after (Note [Standalone repro]); returns (the saved data, the
    launch's call in the trace, notes)."""
    import torch

    import kdebug

    from . import replay

    run = kdebug.load(trace, quiet=True)
    call, occurrence = locate(run, launch)
    program = program or program_of(run)
    if program is None:
        raise ReproError(f"{trace} does not say how its program was run (it was not recorded by kdebug record or "
                         "kdebug hunt); give it after --: ... -- python script.py args (run from the directory it "
                         "was recorded in)")
    if not program.builtin and not program.module and not os.path.exists(program.target[0]):
        raise ReproError(f"the recorded program {program.target[0]} is not here: run from the directory it was "
                         "recorded in, or give it after --")
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "capture.pt")
    rerun_trace = os.path.join(out_dir, "capture-run.kdt")
    spec = replay.Spec(call.kernel_name, occurrence, [], "io", path)
    if os.path.exists(path):
        os.unlink(path)
    if not quiet:
        print(f"kdebug: re-running {program.text()} to capture launch {launch} ({call.kernel_name})",
              file=sys.stderr)
    proc = subprocess.run(program.runner_cmd(rerun_trace), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, env={**os.environ, replay.ENV: spec.to_env()})
    if proc.returncode != 0:
        raise ReproError(f"the re-run exited with status {proc.returncode}:\n{proc.stdout[-3000:]}")
    if not os.path.exists(path):
        raise ReproError(f"the re-run never reached launch {launch} ({call.kernel_name}, occurrence "
                         f"{occurrence + 1} of that name): it launched other kernels than the trace")
    data = torch.load(path, weights_only=True)
    if "error" in data:
        raise ReproError(data["error"])
    if not data.get("definition"):
        raise ReproError(f"the re-run found no async_compile definition of {call.kernel_name} in its generated "
                         "module (not an Inductor C++ or Triton kernel?)")
    notes = _check(run, call, kdebug.load(rerun_trace, quiet=True), occurrence, data)
    return data, call, notes


def _check(run, call, again, occurrence: int, data: dict) -> list:
    """Notes on how far the re-run's launch is the trace's (Note [Standalone repro])."""
    from . import kernel_code

    notes = []
    same = [k for k in again.kernels if k.kernel_name == call.kernel_name]
    other = same[occurrence] if occurrence < len(same) else None
    if other is None or call.pre_hashes is None or other.pre_hashes is None:
        notes.append("could not check the captured inputs against the trace's hashes (none recorded)")
    elif other.pre_hashes == call.pre_hashes:
        notes.append("the captured inputs are bitwise those of the traced launch (their hashes match)")
    else:
        differ = sorted(k for k in call.pre_hashes if other.pre_hashes.get(k) != call.pre_hashes.get(k))
        notes.append("WARNING: the re-run reached this launch with other inputs than the trace "
                     f"({', '.join(differ)} differ: the program varies before it); the repro launches it on the "
                     "re-run's inputs and compares with the re-run's outputs")
    sha = kernel_code.digest(data["definition"]["args"][1])
    known = [e.code_sha256 for e in run.provenance(call.kernel_name) if e.code_sha256]
    if known and sha not in known:
        notes.append(f"WARNING: the re-run compiled other code for {call.kernel_name} than the trace holds "
                     f"(sha256 {sha[:12]} not among {', '.join(k[:12] for k in known)})")
    return notes


# ---------------------------------------------------------------- write / rerun

def _write_dir(out_dir: str, trace: str, launch: int, call, data: dict) -> str:
    import torch

    os.makedirs(out_dir, exist_ok=True)
    d = data["definition"]
    ext = "cpp" if d["method"] == "cpp_pybinding" else "py"
    with open(os.path.join(out_dir, "kernel_source." + ext), "w") as f:
        f.write(d["args"][1])
    torch.save(data, os.path.join(out_dir, "inputs.pt"))
    info = {"trace": os.path.abspath(trace), "launch": launch, "kernel": call.kernel_name,
            "arg_names": list(call.arg_names), "kind": "cpp" if ext == "cpp" else "triton"}
    with open(os.path.join(out_dir, "launch.json"), "w") as f:
        json.dump(info, f, indent=1)
    script = os.path.join(out_dir, "repro.py")
    shutil.copyfile(SCRIPT, script)
    return script


def write(trace: str, launch: int, out_dir: str, program: Program | None = None, quiet: bool = False) -> Repro:
    """Writes a standalone repro of launch ``launch`` of ``trace`` into
    ``out_dir`` (Note [Standalone repro]); ``program``: how to re-run the
    program when the trace does not say (``command(["python", "x.py"])``)."""
    with tempfile.TemporaryDirectory(prefix="kdebug-repro-") as tmp:
        data, call, notes = capture(trace, launch, tmp, program, quiet)
        script = _write_dir(out_dir, trace, launch, call, data)
    return Repro(out_dir, script, call.kernel_name, launch, notes)


def run_script(script: str, times: int = 1, env: dict | None = None) -> tuple[int, dict | None, str]:
    """Runs a repro script in a fresh process: (exit status, its JSON verdict or None, its output)."""
    with tempfile.TemporaryDirectory(prefix="kdebug-rerun-") as tmp:
        out = os.path.join(tmp, "verdict.json")
        proc = subprocess.run([sys.executable, script, "--times", str(times), "--json", out],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        verdict = None
        if os.path.exists(out):
            with open(out) as f:
                verdict = json.load(f)
    return proc.returncode, verdict, proc.stdout


def rerun(trace: str, launch: int, times: int = 20, program: Program | None = None, quiet: bool = False) -> Rerun:
    """Launches ``launch`` of ``trace`` ``times`` times on its recorded
    inputs (a repro, run with --times): does the kernel vary by itself?"""
    if times < 2:
        raise ReproError("--times must be at least 2 to tell whether the outputs vary")
    with tempfile.TemporaryDirectory(prefix="kdebug-rerun-") as tmp:
        rep = write(trace, launch, tmp, program, quiet)
        status, verdict, text = run_script(rep.script, times)
    if verdict is None:
        raise ReproError(f"the re-launches failed (status {status}):\n{text[-3000:]}")
    return Rerun(rep.kernel, launch, times, verdict["distinct"], verdict["matches_recorded"], rep.notes)


def hunt_root(hunt_dir: str) -> tuple[str, int]:
    """(trace, launch) of the first root a kept hunt (kdebug hunt --keep DIR) names."""
    from .compare import compare_many

    try:
        with open(os.path.join(hunt_dir, "hunt.json")) as f:
            hunt = json.load(f)
        paths = [os.path.join(hunt_dir, p) for p in hunt["paths"]]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ReproError(f"{hunt_dir} is not a kept hunt (kdebug hunt --keep DIR writes hunt.json): {e}") from None
    for rep in compare_many(paths):
        for root in rep.roots:
            if root.kind == "root" and root.step_a.kind == "kernel":
                return paths[0], root.step_a.kernel_number
    raise ReproError(f"the hunt in {hunt_dir} names no kernel root (its runs match, or the roots are aten ops)")
