"""One kernel launch or aten-op call, alone: a standalone repro, and
re-launches on its recorded inputs.

    kdebug.repro.write("run.kdt", 12, "repro12/")          # kdebug repro run.kdt --launch 12 -o repro12
    kdebug.repro.write("run.kdt", None, "op7/", op=7)       # kdebug repro run.kdt --op 7 -o op7
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
aliased arguments, would be another input.  One re-run can capture several
steps (the hunt's roots).

An aten op (op #N: ``--op N``; torch's own such as aten::randn or
aten::convolution_backward, or a custom op of the program such as
kdebug_zoo::jitter_matmul) is captured the same way by the dispatch mode of
Note [Proof by replay], right before and after the call: its positional and
keyword arguments as a tree (tensors as above; numbers, strings, dtypes,
devices, layouts, lists; a torch.Generator by its state, the numbers it will
draw), its outputs (every one of a multi-output op, named "output[i] name"
from the schema), and the op's identity (namespace, name, overload).  For an
op that draws random numbers (tagged nondeterministic_seeded) the default
generators' states are saved too and restored before every call: the repro
draws what the recorded call drew, and "reproducing" a random op means the
same numbers from the same generator state; its run-to-run difference can
only come from the state (the seed), which the rerun verdict says.  A custom
op is not part of torch: the repro imports the module that registered it
(recorded from the op's definition; the program's ``-m`` module when that
ran as ``__main__``) and, when that is not importable, says so and exits 2
rather than failing obscurely (``--import MODULE`` names another).  The
switches that pick algorithms (cuDNN benchmark / deterministic, TF32,
float32 matmul precision, deterministic algorithms) are saved and applied.

The re-run is checked against the trace: its hashes of the step's
arguments before it must equal the trace's (else the program does not reach
it with the same inputs twice, and the repro says the inputs are the
re-run's, not the trace's), and the re-run's source of the kernel must be
one the trace holds for that name.

The directory written holds ``repro.py`` (kdebug/_repro_script.py, copied:
it imports torch only), ``inputs.pt`` (the arguments before and after, the
async_compile call or the op's identity), ``kernel_source.cpp`` or ``.py``
(a kernel's source, read back by the script: edit it to try a fix) and
``launch.json`` (which step of which trace, the argument names).  It is
written into a fresh sibling directory and renamed into place, so a failure
never leaves a half-written repro; the arguments' storages (before and after)
are capped by ``max_bytes`` (``--max-bytes``, default 2 GiB): past it the
re-run stops copying, nothing is written, and the error gives the size and
the flag.  The script rebuilds the kernel with torch._inductor.async_compile
as the generated module does (or looks the op up in torch.ops), launches it
on fresh copies of the saved arguments and compares every tensor argument
and output with the saved "after", bitwise; exit 1 on a mismatch.

``relaunch`` runs the same script with ``--times K`` and reads its verdict:
K launches on identical inputs with more than one different output (by
their bits) is a step that is nondeterministic by itself (atomics, split
reductions, an op that varies per call); one output means the run-to-run
difference came from elsewhere (its inputs, config, autotuning, the seed).
``kdebug rerun`` and the hunt's re-run (Note [Element-level differences])
both use it: one mechanism.

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

from ._stdin import run as _run_program  # (not `from . import`: the package's lazy names import torch)

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_repro_script.py")


class ReproError(ValueError):
    """Why a repro cannot be made: says what to do."""


@dataclass
class Program:
    """How to run the recorded program again: what kdebug._runner takes.
    ``nproc``: a distributed job, started whole through torch's launcher as
    ``kdebug record --nproc`` starts it (cli.launcher_cmd); what is captured
    is captured in ``rank`` only (replay.Spec.rank), whose trace is read."""

    target: list
    module: bool = False
    builtin: bool = False
    fix: str | None = None
    nproc: int | None = None
    rank: int = -1

    def runner_cmd(self, out: str) -> list:
        from .cli import _runner_cmd, launcher_cmd

        if self.nproc is not None:
            return launcher_cmd(self.nproc, out, list(self.target), self.module, self.fix, self.builtin)
        return _runner_cmd(out, list(self.target), self.module, self.fix, self.builtin)

    def trace_of(self, out: str) -> str:
        """The trace that ``runner_cmd(out)`` writes for the rank that matters."""
        if self.nproc is None:
            return out
        from .ranks import rank_path

        return rank_path(out, max(self.rank, 0))

    def text(self) -> str:
        head = "the built-in workload" if self.builtin else "python -m" if self.module else "python"
        job = f" ({self.nproc} rank(s) through torch.distributed.run, rank {self.rank} captured)" \
            if self.nproc is not None else ""
        return " ".join([head] + list(self.target)) + job


@dataclass
class Target:
    """One step of a trace to reproduce: a kernel launch (``index``: its
    launch number, kernel #N) or an aten op (``index``: its position among
    the trace's operators, op #N), the ``occurrence``-th step of its name."""

    kind: str          # "kernel" or "op"
    index: int
    name: str
    occurrence: int

    def label(self) -> str:
        return f"{'launch' if self.kind == 'kernel' else 'op'} {self.index} ({self.name})"


@dataclass
class Repro:
    """What ``write`` made: the directory, its script, and what the re-run found."""

    dir: str
    script: str
    kernel: str        # the kernel's or op's name
    launch: int        # its launch number (kernel) or operator index (op)
    notes: list = field(default_factory=list)
    kind: str = "kernel"
    random: bool = False   # an op that draws random numbers (its generator states are restored)
    imports: list = field(default_factory=list)  # modules the script imports first (custom ops)


@dataclass
class Rerun:
    """``rerun``'s verdict: ``distinct`` different outputs in ``times`` launches."""

    kernel: str
    launch: int
    times: int
    distinct: int
    matches_recorded: int
    notes: list = field(default_factory=list)
    kind: str = "kernel"
    random: bool = False

    @property
    def varies(self) -> bool:
        return self.distinct > 1

    @property
    def verdict(self) -> str:
        return "intrinsic" if self.varies else "stable"

    def summary(self) -> str:
        """The hunt's line: 're-launched 20x on the recorded inputs: 20 different outputs -- ...'."""
        head = f"re-launched {self.times}x on the recorded inputs: {self.distinct} different output" \
               f"{'s' if self.distinct != 1 else ''}"
        if self.varies:
            what = "the op itself" if self.kind == "op" else "the kernel itself: atomics, split reductions"
            return head + f" -- INTRINSICALLY NONDETERMINISTIC (its outputs vary on identical inputs: {what})"
        more = (" (a random op: with its generator state restored it draws the same numbers, so a run-to-run "
                "difference in it comes from the generator's state: the seed)" if self.random else "")
        return head + (" -- STABLE on its inputs: the run-to-run difference came from elsewhere (its inputs, "
                       "its config or autotuning, the generator seed, or another process)" + more)

    def text(self) -> str:
        return f"{self.kernel} ({'op' if self.kind == 'op' else 'launch'} {self.launch}) {self.summary()}"

    def to_json(self) -> dict:
        return {"times": self.times, "distinct": self.distinct, "matches_recorded": self.matches_recorded,
                "verdict": self.verdict, "random": self.random, "text": self.summary()}


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
        job = job_of(run)
        if "--builtin" in opts:
            return Program(target, builtin=True, fix=fix, **job)
        return Program(target, module="-m" in opts, fix=fix, **job) if target else None
    if (head.endswith("/kdebug") or head == "kdebug" or head.endswith("kdebug/__main__.py")) \
            and len(argv) > 1 and argv[1] == "record" and "--" in argv:
        return command(argv[argv.index("--"):])
    return None


def job_of(run) -> dict:
    """A rank of a job under torch's launcher (META's rank and world size):
    {"nproc", "rank"} -- the job is started whole again and captured in that
    rank; {} for one process's trace."""
    w, r = run.meta.get("world_size"), run.meta.get("rank")
    if type(w) is int and type(r) is int and 0 <= r < w:
        return {"nproc": w, "rank": r}
    return {}


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


def target_of(run, launch: int | None = None, op: int | None = None) -> Target:
    """The Target of kernel launch ``launch`` or of operator ``op`` (op #N)."""
    if op is None:
        call, n = locate(run, launch)
        return Target("kernel", launch, call.kernel_name, n)
    from .calls import _KernelCall
    from .compare import _op_name

    ops = run.operators
    if not 0 <= op < len(ops) or isinstance(ops[op], _KernelCall):
        raise ReproError(f"operator {op} of {run.path} is not an aten op (it holds {len(ops)} operators); op #N in "
                         "kdebug diff and the report is --op N, kernel #N is --launch N")
    name = _op_name(ops[op])
    n = sum(1 for x in ops[:op] if not isinstance(x, _KernelCall) and _op_name(x) == name)
    return Target("op", op, name, n)


# ---------------------------------------------------------------- capture

DEFAULT_MAX_BYTES = 2 << 30  # inputs.pt: the arguments before and after, whole storages


def _size(n: int) -> str:
    for unit, k in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << k:
            return f"{n / (1 << k):.1f} {unit}"
    return f"{n} bytes"


def capture_many(trace: str, targets: list, out_dir: str, program: Program | None = None, quiet: bool = False,
                 max_bytes: int = DEFAULT_MAX_BYTES) -> list:
    """Re-runs the program once, recording each target's arguments before
    and after (Note [Standalone repro]); returns, per target, (the saved
    data, notes) or a ReproError saying why it could not be saved."""
    import torch

    import kdebug

    from . import replay
    from .collectives import is_collective_name

    # a collective cannot run alone: its output is its group's (Note [Collective records])
    alone = {i: ReproError(f"{t.label()} is a collective: its output depends on the other ranks of its group, so "
                           "it cannot be launched on its own; kdebug hunt --nproc N --confirm proves a collective "
                           "root by replaying the whole job")
             for i, t in enumerate(targets) if t.kind == "op" and is_collective_name(t.name)}
    if len(alone) == len(targets):
        return [alone[i] for i in range(len(targets))]
    run = kdebug.load(trace, quiet=True)
    program = program or program_of(run)
    job = job_of(run)
    if program is not None and program.nproc is None and job:
        # a rank's trace with the program given after --: still that job, started whole
        import dataclasses

        program = dataclasses.replace(program, **job)
    if program is None:
        raise ReproError(f"{trace} does not say how its program was run (it was not recorded by kdebug record or "
                         "kdebug hunt); give it after --: ... -- python script.py args (run from the directory it "
                         "was recorded in)")
    if not program.builtin and not program.module and not os.path.exists(program.target[0]):
        raise ReproError(f"the recorded program {program.target[0]} is not here: run from the directory it was "
                         "recorded in, or give it after --")
    os.makedirs(out_dir, exist_ok=True)
    rerun_trace = os.path.join(out_dir, "capture-run.kdt")
    specs = [replay.Spec(t.name, t.occurrence, [], "io", os.path.join(out_dir, f"capture{i}.pt"),
                         op=t.kind == "op", max_bytes=max_bytes, rank=program.rank)
             for i, t in enumerate(targets) if i not in alone]
    for sp in specs:
        if os.path.exists(sp.path):
            os.unlink(sp.path)
    if not quiet:
        print(f"kdebug: re-running {program.text()} to capture "
              f"{', '.join(t.label() for i, t in enumerate(targets) if i not in alone)}", file=sys.stderr)
    proc = _run_program(program.runner_cmd(rerun_trace), {**os.environ, replay.ENV: replay.to_env(specs)})
    if proc.returncode != 0:
        raise ReproError(f"the re-run exited with status {proc.returncode}:\n{proc.stdout[-3000:]}")
    again = kdebug.load(program.trace_of(rerun_trace), quiet=True)
    out = []
    left = iter(specs)
    for i, t in enumerate(targets):
        if i in alone:
            out.append(alone[i])
            continue
        sp = next(left)
        try:
            data = _read_capture(t, sp.path, max_bytes)
            if t.kind == "op":
                _op_module(data, program)
            out.append((data, _check(run, again, t, data)))
        except ReproError as e:
            out.append(e)
    return out


def _read_capture(t: Target, path: str, max_bytes: int) -> dict:
    import torch

    if not os.path.exists(path):
        raise ReproError(f"the re-run never reached {t.label()} (occurrence {t.occurrence + 1} of that name): it "
                         "ran other kernels or ops than the trace")
    data = torch.load(path, weights_only=True)
    if "too_big" in data:
        n = data["too_big"]
        if data.get("too_big_stage") == "before":  # the copy after it was not taken: about as much again
            held, need = f"{_size(n)} before the launch (and about as much again after it)", 2 * n
        else:
            held, need = f"{_size(n)} before and after the launch", n
        raise ReproError(f"{t.label()}: its arguments' storages hold {held}, more than --max-bytes {max_bytes} "
                         f"({_size(max_bytes)}); nothing was written. Raise the limit to write it anyway: "
                         f"--max-bytes {need}")
    if "error" in data:
        raise ReproError(data["error"])
    if t.kind == "kernel" and not data.get("definition"):
        raise ReproError(f"the re-run found no async_compile definition of {t.name} in its generated "
                         "module (not an Inductor C++ or Triton kernel?)")
    return data


def _op_module(data: dict, program: Program) -> None:
    """A custom op registered by the program's main module: name the module
    the repro can import (``-m MODULE`` programs), else the script's file."""
    ident = data["op"]
    if ident.get("custom") and ident.get("module") == "__main__":
        ident["module"] = program.target[0] if program.module and program.target else None
        if not program.module and not program.builtin and program.target:
            ident["file"] = os.path.abspath(program.target[0])


def capture(trace: str, launch: int, out_dir: str, program: Program | None = None, quiet: bool = False,
            op: int | None = None, max_bytes: int = DEFAULT_MAX_BYTES):
    """Re-runs the program recording launch ``launch``'s (or op ``op``'s)
    arguments before and after (Note [Standalone repro]); returns (the saved
    data, its Target, notes)."""
    import kdebug

    t = target_of(kdebug.load(trace, quiet=True), launch, op)
    got = capture_many(trace, [t], out_dir, program, quiet, max_bytes)[0]
    if isinstance(got, ReproError):
        raise got
    return got[0], t, got[1]


def _check(run, again, t: Target, data: dict) -> list:
    """Notes on how far the re-run's step is the trace's (Note [Standalone repro])."""
    from . import kernel_code
    from .compare import steps_of

    notes = []
    mine = steps_of(run)
    if t.kind == "kernel":
        step = next((s for s in mine if s.kind == "kernel" and s.kernel_number == t.index), None)
    else:
        step = mine[t.index] if t.index < len(mine) else None
    same = [s for s in steps_of(again) if s.name == t.name and (s.kind == "kernel") == (t.kind == "kernel")]
    other = same[t.occurrence] if t.occurrence < len(same) else None
    what = "launch" if t.kind == "kernel" else "op"
    if step is not None and t.kind == "op" and not step.pre and not step.reads:
        notes.append("the op has no tensor inputs: nothing to check against the trace's hashes")
    elif step is None or other is None or not step.pre or not other.pre:
        notes.append("could not check the captured inputs against the trace's hashes (none recorded)")
    elif other.pre == step.pre:
        notes.append(f"the captured inputs are bitwise those of the traced {what} (their hashes match)")
    else:
        differ = sorted(k for k in step.pre if other.pre.get(k) != step.pre.get(k))
        notes.append(f"WARNING: the re-run reached this {what} with other inputs than the trace "
                     f"({', '.join(step.labels.get(k, k) for k in differ)} differ: the program varies before it); "
                     f"the repro runs it on the re-run's inputs and compares with the re-run's outputs")
    if step is not None and other is not None and step.post and other.post and step.post != other.post:
        notes.append(f"the re-run's {what} wrote other values than the traced one (expected where it varies from "
                     "run to run): the repro checks against the re-run's outputs")
    if t.kind == "op":
        ident = data["op"]
        if ident.get("random"):
            notes.append(f"{t.name} draws random numbers: the repro restores the generator state captured right "
                         "before the call, so it draws what the re-run drew; between runs it differs only if the "
                         "seed does")
        if ident.get("custom"):
            notes.append(f"{t.name} is a custom op of the program, not part of torch: the repro imports "
                         + (f"module {ident['module']} to register it (make it importable: PYTHONPATH)"
                            if ident.get("module") else "nothing that registers it: run it with --import MODULE "
                                                        "(the program's module that defines it) on PYTHONPATH"))
        return notes
    sha = kernel_code.digest(data["definition"]["args"][1])
    known = [e.code_sha256 for e in run.provenance(t.name) if e.code_sha256]
    if known and sha not in known:
        notes.append(f"WARNING: the re-run compiled other code for {t.name} than the trace holds "
                     f"(sha256 {sha[:12]} not among {', '.join(k[:12] for k in known)})")
    return notes


# ---------------------------------------------------------------- write / rerun

def _write_dir(out_dir: str, trace: str, t: Target, data: dict, arg_names) -> str:
    """Writes the repro into a fresh sibling directory, then moves it to
    ``out_dir`` (replacing an earlier repro there): never a half-written one."""
    import torch

    parent = os.path.dirname(os.path.abspath(out_dir))
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise ReproError(f"{out_dir} exists and is not a directory")
    if os.path.isdir(out_dir) and os.listdir(out_dir) and not os.path.exists(os.path.join(out_dir, "launch.json")):
        raise ReproError(f"{out_dir} exists and is not a repro directory (no launch.json): give a new or empty "
                         "directory")
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".kdebug-repro-", dir=parent)
    try:
        info = {"trace": os.path.abspath(trace), "launch": t.index, "kind": t.kind}
        if t.kind == "kernel":
            d = data["definition"]
            ext = "cpp" if d["method"] == "cpp_pybinding" else "py"
            with open(os.path.join(tmp, "kernel_source." + ext), "w") as f:
                f.write(d["args"][1])
            info.update(kernel=t.name, arg_names=list(arg_names), kind="cpp" if ext == "cpp" else "triton")
        else:
            ident = data["op"]
            info.update(kind="op", op=f"{ident['namespace']}::{ident['op']}.{ident['overload']}",
                        arg_names=list(data["names"]), random=ident["random"], custom=ident["custom"],
                        module=ident.get("module"), file=ident.get("file"))
        torch.save(data, os.path.join(tmp, "inputs.pt"))
        with open(os.path.join(tmp, "launch.json"), "w") as f:
            json.dump(info, f, indent=1)
        shutil.copyfile(SCRIPT, os.path.join(tmp, "repro.py"))
        old = None
        if os.path.isdir(out_dir):
            old = tempfile.mkdtemp(prefix=".kdebug-repro-old-", dir=parent)
            os.rename(out_dir, os.path.join(old, "d"))
        os.rename(tmp, out_dir)
        if old:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return os.path.join(out_dir, "repro.py")


def _made(out_dir: str, trace: str, t: Target, data: dict, notes: list, run) -> Repro:
    names = ()
    if t.kind == "kernel":
        names = next(k.arg_names for k in run.kernels if k.launch_index == t.index)
    script = _write_dir(out_dir, trace, t, data, names)
    ident = data.get("op") or {}
    return Repro(out_dir, script, t.name, t.index, notes, t.kind, bool(ident.get("random")),
                 [ident["module"]] if ident.get("module") else [])


def write(trace: str, launch: int | None, out_dir: str, program: Program | None = None, quiet: bool = False,
          op: int | None = None, max_bytes: int = DEFAULT_MAX_BYTES) -> Repro:
    """Writes a standalone repro of launch ``launch`` (or aten op ``op``,
    op #N) of ``trace`` into ``out_dir`` (Note [Standalone repro]);
    ``program``: how to re-run the program when the trace does not say
    (``command(["python", "x.py"])``); ``max_bytes``: the most bytes of
    argument storages to save (ReproError past it, nothing written)."""
    import kdebug

    run = kdebug.load(trace, quiet=True)
    t = target_of(run, launch, op)
    return write_many(trace, [t], [out_dir], program, quiet, max_bytes)[0]


def write_many(trace: str, targets: list, out_dirs: list, program: Program | None = None, quiet: bool = False,
               max_bytes: int = DEFAULT_MAX_BYTES, raise_first: bool = True) -> list:
    """One re-run, one repro per target (Repro, or the ReproError that
    stopped it when ``raise_first`` is False)."""
    import kdebug

    run = kdebug.load(trace, quiet=True)
    with tempfile.TemporaryDirectory(prefix="kdebug-repro-") as tmp:
        got = capture_many(trace, targets, tmp, program, quiet, max_bytes)
        out = []
        for t, d, g in zip(targets, out_dirs, got):
            if isinstance(g, ReproError):
                if raise_first:
                    raise g
                out.append(g)
                continue
            out.append(_made(d, trace, t, g[0], g[1], run))
    return out


def script_env(imports_dir: str | None = None) -> dict:
    """The environment a repro script runs in from kdebug: this one, with the
    current directory importable (a custom op's module)."""
    path = [p for p in [os.getcwd(), imports_dir, os.environ.get("PYTHONPATH")] if p]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(path)}


def run_script(script: str, times: int = 1, env: dict | None = None, save: str | None = None,
               timeout: float | None = None) -> tuple[int, dict | None, str]:
    """Runs a repro script in a fresh process: (exit status, its JSON verdict or None, its output);
    ``save``: where it saves the recorded outputs and the first launch's that differ."""
    with tempfile.TemporaryDirectory(prefix="kdebug-rerun-") as tmp:
        out = os.path.join(tmp, "verdict.json")
        cmd = [sys.executable, script, "--times", str(times), "--json", out] + (["--save", save] if save else [])
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                              timeout=timeout)
        verdict = None
        if os.path.exists(out):
            with open(out) as f:
                verdict = json.load(f)
    return proc.returncode, verdict, proc.stdout


def relaunch(rep: Repro, times: int, save: str | None = None) -> Rerun:
    """Note [Standalone repro]: the repro ``rep`` launched ``times`` times on
    its recorded inputs in a fresh process, and its verdict; what
    ``kdebug rerun`` and the hunt's re-run (Note [Element-level differences])
    both use."""
    if times < 2:
        raise ReproError("--times must be at least 2 to tell whether the outputs vary")
    status, verdict, text = run_script(rep.script, times, script_env(), save)
    if verdict is None:
        raise ReproError(f"the re-launches failed (status {status}):\n{text[-3000:]}")
    return Rerun(rep.kernel, rep.launch, times, verdict["distinct"], verdict["matches_recorded"], list(rep.notes),
                 rep.kind, rep.random)


def rerun(trace: str, launch: int | None, times: int = 20, program: Program | None = None, quiet: bool = False,
          op: int | None = None, max_bytes: int = DEFAULT_MAX_BYTES) -> Rerun:
    """Launches ``launch`` (or aten op ``op``) of ``trace`` ``times`` times on
    its recorded inputs (a repro, run with --times): does it vary by itself?"""
    if times < 2:
        raise ReproError("--times must be at least 2 to tell whether the outputs vary")
    with tempfile.TemporaryDirectory(prefix="kdebug-rerun-") as tmp:
        rep = write(trace, launch, os.path.join(tmp, "repro"), program, quiet, op, max_bytes)
        return relaunch(rep, times)


def hunt_roots(hunt_dir: str) -> tuple[str, list]:
    """(run 0's trace, the Targets of its roots in rank order) of a kept hunt
    (kdebug hunt --keep DIR): kernel and aten-op roots alike."""
    import kdebug

    from .compare import compare_many
    from .report import kept_hunt

    try:
        hunt = kept_hunt(os.path.join(hunt_dir, "hunt.json"))  # its traces: files of that directory
        paths = [os.path.join(hunt_dir, p) for p in hunt["paths"]]
        if len(paths) < 2:
            raise ValueError("it names fewer than two runs")
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ReproError(f"{hunt_dir} is not a kept hunt (kdebug hunt --keep DIR writes hunt.json): {e}") from None
    run = kdebug.load(paths[0], quiet=True)
    out, seen = [], set()
    for rep in compare_many(paths):
        for root in rep.roots:
            a = root.step_a
            if root.kind != "root" or a.label() in seen:
                continue
            seen.add(a.label())
            out.append(target_of(run, a.kernel_number) if a.kind == "kernel" else target_of(run, op=a.index))
    return paths[0], out


def hunt_root(hunt_dir: str, n: int = 1) -> tuple[str, Target]:
    """(trace, Target) of root ``n`` (from 1) a kept hunt names."""
    trace, roots = hunt_roots(hunt_dir)
    if not roots:
        raise ReproError(f"the hunt in {hunt_dir} names no root (its runs match, or its differences come from "
                         "outside the recording)")
    if not 1 <= n <= len(roots):
        raise ReproError(f"the hunt in {hunt_dir} names {len(roots)} root(s): give --root 1 to {len(roots)}")
    return trace, roots[n - 1]
