"""Proof by replay: show that a root the hunt named is what made the runs differ.

Note [Proof by replay]
A root is blamed for every later step whose outputs changed because of it
(Note [Data flow]).  ``kdebug hunt --confirm`` checks that claim by running the
program twice more, each in a fresh process and recorded as usual:

- run C *captures* what the root launch wrote (its differing written
  arguments, right after the launch) into a file;
- run D *replays* it: right after the same launch (the same kernel, the same
  occurrence of its name), its written arguments are overwritten with run C's
  values.

If the root is the cause, run D matches run C from the root on: nothing the
root was blamed for differs any more (the root's own post-launch hashes may
still show its own values, taken inside the launch).  What still differs
after it is reported.  A kernel is found by its name and occurrence, its
arguments by position, so the two runs need the same kernels in the same
order (a structural difference is reported as "not confirmed").

Supported: Inductor C++ kernels (CPU) and Triton kernels (a wrapper on the
autotuner's ``run``); an aten-op root is reported as not replayable.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass

import torch

ENV = "KDEBUG_REPLAY"  # JSON of a Spec: set by kdebug hunt --confirm for the runner


@dataclass
class Spec:
    """Which launch to capture or replay: the ``occurrence``-th launch (from 0)
    of the kernel named ``name``, its arguments at ``positions``."""

    name: str
    occurrence: int
    positions: list
    mode: str          # "capture" or "replay"
    path: str          # the file of captured tensors
    hits: int = 0

    def to_env(self) -> str:
        return json.dumps(asdict(self))


_spec: Spec | None = None
_calls = 0
_saved: list | None = None


def activate(spec: Spec | None) -> None:
    """Capture / replay ``spec`` in this process (None: stop)."""
    global _spec, _calls, _saved
    _spec, _calls, _saved = spec, 0, None
    if spec is not None and spec.mode == "replay":
        _saved = torch.load(spec.path, weights_only=True)


def activate_from_env() -> None:
    text = os.environ.get(ENV)
    if text:
        activate(Spec(**json.loads(text)))


def _after_launch(args) -> None:
    """Called after every launch of the spec's kernel with its arguments."""
    global _calls
    spec = _spec
    if spec is None:
        return
    k = _calls
    _calls += 1
    if k != spec.occurrence:
        return
    with torch._C._DisableTorchDispatch(), torch.no_grad():
        if spec.mode == "capture":
            torch.save([args[i].detach().clone().cpu() for i in spec.positions], spec.path)
        else:
            for i, t in zip(spec.positions, _saved or []):
                args[i].copy_(t.to(args[i].device))
    spec.hits += 1


def wrap(inner):
    """inner (a C++ kernel's function) followed by the capture / replay; runs
    inside kdebug's CppKernel, so its post-launch hashes see what this writes."""
    def replaying(*args):
        r = inner(*args)
        _after_launch(args)
        return r

    replaying._kd_replay = True
    replaying._kd_inner = inner
    return replaying


def attach(scope: dict) -> None:
    """Wraps the spec's kernel among a generated module's globals (called
    when kdebug instruments a module)."""
    spec = _spec
    if spec is None:
        return
    from torch._inductor.runtime.triton_heuristics import CachingAutotuner

    from . import _C

    for key, obj in list(scope.items()):
        if isinstance(obj, _C.CppKernel) and obj.info.name == spec.name \
                and not getattr(obj.__wrapped__, "_kd_replay", False):
            scope[key] = _C.CppKernel(wrap(obj.__wrapped__), obj.info)
        elif isinstance(obj, CachingAutotuner) and getattr(obj.fn, "__name__", None) == spec.name \
                and "run" not in obj.__dict__:
            bound = obj.run

            def run(*args, _bound=bound, **kwargs):
                r = _bound(*args, **kwargs)
                _after_launch(args)
                return r

            obj.run = run


def write_hits(spec: Spec | None = None) -> None:
    """Writes how many launches were captured / replayed beside the file."""
    spec = spec or _spec
    if spec is not None:
        with open(spec.path + ".hits", "w") as f:
            f.write(str(spec.hits))


def read_hits(path: str) -> int:
    try:
        with open(path + ".hits") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 0


def locate(run, step) -> tuple[str, int] | None:
    """(kernel name, occurrence) of a kernel step of ``run``: how many earlier
    launches had its name.  None for an aten op."""
    if step.kind != "kernel":
        return None
    n = 0
    for k in run.kernels:
        if k.launch_index == step.kernel_number:
            return step.name, n
        if k.kernel_name == step.name:
            n += 1
    return None


def judge(original, root, replayed, hits: int) -> dict:
    """Whether the replayed comparison (run D against run C) clears what
    ``root`` of ``original`` was blamed for: {"confirmed", "text", "still"}."""
    if hits < 1:
        return {"confirmed": False, "still": [],
                "text": "NOT CONFIRMED: the replay never reached the launch (another kernel order in the re-runs?)"}
    if replayed.structural:
        return {"confirmed": False, "still": [], "text": "NOT CONFIRMED: the re-runs launched other kernels"}
    others = {(x.step_a.name) for x in original.roots if x is not root}
    still = [x.step_a.label() for x in replayed.roots]
    if not replayed.roots:
        text = (f"CONFIRMED by replay: with its outputs taken from the run before, the re-run matches "
                f"it ({root.consequences} later launch(es)/op(s) it was blamed for now match)")
        return {"confirmed": True, "still": [], "text": text}
    if all(x.step_a.name in others for x in replayed.roots) and not any(
            x.step_a.name == root.step_a.name and x.step_a.kernel_number == root.step_a.kernel_number
            for x in replayed.roots):
        return {"confirmed": True, "still": still,
                "text": "CONFIRMED by replay: what it was blamed for now matches; the rest differs only at the "
                        "other roots (" + ", ".join(still[:3]) + ")"}
    return {"confirmed": False, "still": still, "text": "NOT CONFIRMED: with its outputs replayed the re-run still "
                                                        "differs at " + ", ".join(still[:3])}
