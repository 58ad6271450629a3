"""Proof by replay: show that a root the hunt named is what made the runs differ.

Note [Proof by replay]
A root is blamed for every later step whose outputs changed because of it
(Note [Data flow]).  ``kdebug hunt --confirm`` checks that claim by running the
program twice more, each in a fresh process and recorded as usual:

- run C *captures* what the root launch wrote (its differing written
  arguments, right after the launch) into a file;
- run D *replays* it: right after the same launch (the same kernel, the same
  occurrence of its name), its written arguments are overwritten with run C's
  values (what the launch wrote by itself is kept first: a second sample for
  Note [Element-level differences]).

If the root is the cause, run D matches run C from the root on: nothing the
root was blamed for differs any more (the root's own post-launch hashes may
still show its own values, taken inside the launch).  What still differs
after it is reported.  A kernel is found by its name and occurrence, its
arguments by position, so the two runs need the same kernels in the same
order (a structural difference is reported as "not confirmed").  The proof
needs the root to differ again: when it wrote the same outputs by itself in
runs C and D (a race that did not fire, RNG bookkeeping that happened to
agree), the replay changed nothing and a clean comparison proves nothing, so
the verdict is "not proven" (seen on the H100: cuDNN attention's philox
outputs, equal in both re-runs, were once called CONFIRMED).

Replayable: Inductor C++ kernels (CPU), Triton kernels (a wrapper on the
autotuner's ``run``), and aten ops, found by their name and occurrence among
the ops a dispatch mode above kdebug's own sees, their outputs named by the
path of the differing hash ("out/1": output[1]).  A mode "sample" serves
Note [Element-level differences]: at the launch it keeps what the kernel
wrote and launches it again on copies of its arguments as they were before.
A mode "io" serves Note [Standalone repro] (kdebug/repro.py): it saves every
argument of the launch before and after it, with the kernel's definition.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field

import torch

from ._upstream import TorchDispatchMode, caching_autotuner, disable_torch_dispatch

ENV = "KDEBUG_REPLAY"  # JSON list of Specs: set by kdebug hunt for the runner


@dataclass
class Spec:
    """Which launch to capture, replay or sample: the ``occurrence``-th launch
    (from 0) of the kernel or aten op named ``name``, its arguments at
    ``positions`` (kernels) or its outputs at hash ``paths`` (aten ops)."""

    name: str
    occurrence: int
    positions: list
    mode: str          # "capture", "replay", "sample" or "io"
    path: str          # the file of captured tensors
    hits: int = 0
    op: bool = False   # an aten op, not a kernel
    paths: list = field(default_factory=list)

    def to_env(self) -> str:
        return to_env([self])


def to_env(specs: list) -> str:
    """The value of ENV that activates ``specs`` in a runner process."""
    return json.dumps([asdict(sp) for sp in specs])


_specs: dict[str, list[Spec]] = {}   # by kernel / op name
_calls: dict[str, int] = {}
_saved: dict[int, list] = {}         # id(spec) -> replayed tensors


def activate(spec) -> None:
    """Capture / replay / sample ``spec`` (a Spec or a list of them) in this
    process (None: stop).  Aten-op specs act only inside ``op_mode()``."""
    specs = [] if spec is None else (list(spec) if isinstance(spec, (list, tuple)) else [spec])
    _specs.clear()
    _calls.clear()
    _saved.clear()
    for sp in specs:
        _specs.setdefault(sp.name, []).append(sp)
        if sp.mode == "replay":
            _saved[id(sp)] = torch.load(sp.path, weights_only=True)


def op_mode():
    """The dispatch mode that acts on the active aten-op specs, to enter
    *inside* the recording DebugMode (so it sits above it on the mode stack:
    kdebug's mode records the op as it ran, with its extents, and the replay
    acts on what it returned), or a context that does nothing."""
    import contextlib

    return _OpReplay() if any(sp.op for sp in specs()) else contextlib.nullcontext()


def activate_from_env() -> None:
    text = os.environ.get(ENV)
    if text:
        data = json.loads(text)
        activate([Spec(**d) for d in (data if isinstance(data, list) else [data])])


def specs() -> list[Spec]:
    return [sp for xs in _specs.values() for sp in xs]


def _clone(x):
    return x.detach().clone() if isinstance(x, torch.Tensor) else x


def _before_launch(name: str, args) -> tuple[Spec | None, list | None]:
    """Counts a launch of ``name``; returns its Spec when this launch is the
    one asked for, with a copy of every argument for a "sample"."""
    k = _calls.get(name, 0)
    _calls[name] = k + 1
    sp = next((x for x in _specs.get(name, ()) if x.occurrence == k), None)
    if sp is None or sp.mode not in ("sample", "io"):
        return sp, None
    with disable_torch_dispatch(), torch.no_grad():
        if sp.mode == "io":
            try:
                return sp, snapshot(args)
            except TypeError as e:  # said in the saved file, never raised into the program
                return sp, {"error": str(e)}
        return sp, [_clone(a) for a in args]


def _after_launch(sp: Spec | None, args, pre, relaunch, kwargs=None) -> None:
    """Right after the launch ``_before_launch`` picked: capture, replay or sample."""
    if sp is None:
        return
    with disable_torch_dispatch(), torch.no_grad():
        if sp.mode == "io":
            _save_io(sp, args, pre, kwargs)
        else:
            _act(sp, [args[i] for i in sp.positions], pre, relaunch)
    sp.hits += 1


def _act(sp: Spec, outs: list, pre=None, relaunch=None) -> None:
    if sp.mode == "capture":
        torch.save([t.detach().clone().cpu() for t in outs], sp.path)
    elif sp.mode == "replay":
        torch.save([t.detach().clone().cpu() for t in outs], sp.path + ".natural")
        for t, v in zip(outs, _saved.get(id(sp)) or []):
            t.copy_(v.to(t.device))
    elif sp.mode == "sample":
        _sample(sp, outs, pre, relaunch)


def _sample(sp: Spec, outs: list, pre, relaunch) -> None:
    """Note [Element-level differences]: launches the kernel again on copies of
    its pre-launch arguments until it writes something else (at most
    magnitude.SAMPLES launches in all); saves what it wrote and the first other
    result, or None."""
    from . import _C
    from .magnitude import SAMPLES

    natural = [t.detach().clone().cpu() for t in outs]
    other, launches = None, 1
    if pre is not None and relaunch is not None:
        while launches < SAMPLES and other is None:
            args = [_clone(a) for a in pre]
            _C._set_compiling(True)  # not recorded: counted as suppressed
            try:
                relaunch(args)
            finally:
                _C._set_compiling(False)
            launches += 1
            got = [args[i].detach().cpu() for i in sp.positions]
            if any(not torch.equal(a.view(torch.uint8) if a.dtype.is_floating_point else a,
                                   b.view(torch.uint8) if b.dtype.is_floating_point else b)
                   for a, b in zip(got, natural)):
                other = [g.clone() for g in got]
    torch.save({"natural": natural, "other": other, "launches": launches}, sp.path)


def wrap(inner, name: str):
    """inner (a C++ kernel's function) between the launch's capture / replay /
    sample; runs inside kdebug's CppKernel, so its post-launch hashes see what
    this writes."""
    def replaying(*args):
        sp, pre = _before_launch(name, args)
        r = inner(*args)
        _after_launch(sp, args, pre, lambda a: inner(*a))
        return r

    replaying._kd_replay = True
    replaying._kd_inner = inner
    replaying._kd_name = name
    return replaying


def attach(scope: dict) -> None:
    """Wraps the specs' kernels among a generated module's globals (called
    when kdebug instruments a module)."""
    if not _specs:
        return
    from . import _C

    CachingAutotuner = caching_autotuner()
    if any(sp.mode == "io" for sp in specs()):
        _definitions(scope)

    for key, obj in list(scope.items()):
        if isinstance(obj, _C.CppKernel) and obj.info.name in _specs \
                and not getattr(obj.__wrapped__, "_kd_replay", False):
            scope[key] = _C.CppKernel(wrap(obj.__wrapped__, obj.info.name), obj.info)
        elif isinstance(obj, CachingAutotuner) and getattr(obj.fn, "__name__", None) in _specs \
                and "run" not in obj.__dict__:
            bound, name = obj.run, obj.fn.__name__

            def run(*args, _bound=bound, _name=name, **kwargs):
                sp, pre = _before_launch(_name, args)
                r = _bound(*args, **kwargs)
                _after_launch(sp, args, pre, lambda a: _bound(*a, **kwargs), kwargs)
                return r

            obj.run = run


# ---------------------------------------------------------------- mode "io"

_defs: dict[str, dict] = {}  # kernel name -> its async_compile call (mode "io")


def _definitions(scope: dict) -> None:
    """Reads, from the generated module that defines ``scope``, the
    async_compile call of each kernel an "io" spec names: {"method":
    "cpp_pybinding" or "triton", "args": [...], "kwargs": {...}}, the
    arguments as the module wrote them (Note [Kernel code])."""
    import ast

    path = scope.get("__file__")
    names = {sp.name for sp in specs() if sp.mode == "io"}
    if not path or not names:
        return
    try:
        with open(path) as f:
            tree = ast.parse(f.read())
    except (OSError, SyntaxError, ValueError):
        return
    for node in tree.body:
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name) and node.targets[0].id in names
                and isinstance(node.value, ast.Call) and isinstance(node.value.func, ast.Attribute)
                and isinstance(node.value.func.value, ast.Name) and node.value.func.value.id == "async_compile"):
            continue
        try:
            args = [ast.literal_eval(a) for a in node.value.args]
            kwargs = {k.arg: ast.literal_eval(k.value) for k in node.value.keywords if k.arg}
        except ValueError:
            continue
        _defs[node.targets[0].id] = {"method": node.value.func.attr, "args": args, "kwargs": kwargs,
                                     "module": path}


def snapshot(args) -> dict:
    """Every argument of a launch as it is now, for torch.save: each distinct
    storage the tensors view copied once to the CPU as bytes, each tensor as
    (storage, dtype, offset, size, stride, device), so views and aliases
    come back as the kernel saw them (a kernel indexes raw memory: a
    contiguous clone of a strided view would be another input); other
    arguments (sizes, flags) as their values."""
    storages: list = []
    index: dict = {}
    out = []
    for a in args:
        if isinstance(a, torch.Tensor):
            if a.layout != torch.strided:
                raise TypeError(f"a {a.layout} tensor argument (only strided tensors are saved)")
            st = a.untyped_storage()
            key = (str(a.device), st.data_ptr(), st.nbytes())
            if key not in index:
                index[key] = len(storages)
                copy = st.cpu() if a.device.type != "cpu" else st.clone()
                storages.append(torch.empty(0, dtype=torch.uint8).set_(copy))
            out.append({"storage": index[key], "dtype": str(a.dtype).removeprefix("torch."),
                        "offset": a.storage_offset(), "size": list(a.shape), "stride": list(a.stride()),
                        "device": str(a.device)})
        elif a is None or isinstance(a, (bool, int, float, str)):
            out.append({"value": a})
        else:
            raise TypeError(f"an argument of type {type(a).__name__} (tensors, numbers, strings and None "
                            "are saved)")
    return {"storages": storages, "args": out}


def _save_io(sp: Spec, args, pre, kwargs) -> None:
    """Mode "io": the launch's arguments before (``pre``) and after it, its
    keyword arguments but the stream, and the kernel's definition."""
    kw = {k: v for k, v in (kwargs or {}).items() if k != "stream"}
    if "error" in pre:
        torch.save({"name": sp.name, "error": f"cannot save the launch's arguments: {pre['error']}"}, sp.path)
        return
    try:
        data = {"name": sp.name, "definition": _defs.get(sp.name), "before": pre, "after": snapshot(args),
                "kwargs": {k: v for k, v in kw.items() if v is None or isinstance(v, (bool, int, float, str))},
                "torch": str(torch.__version__)}
    except TypeError as e:
        data = {"name": sp.name, "error": f"cannot save the launch's arguments: {e}"}
    torch.save(data, sp.path)


def _at_path(out, path: str):
    """The output leaf a hash key ("out/", "out/1", "out/0/2") names, or None."""
    parts = [p for p in path.split("/")[1:] if p != ""]
    x = out
    for p in parts:
        if isinstance(x, (list, tuple)) and p.isdigit() and int(p) < len(x):
            x = x[int(p)]
        elif isinstance(x, dict) and p in x:
            x = x[p]
        else:
            return None
    return x if isinstance(x, torch.Tensor) else None


class _OpReplay(TorchDispatchMode):
    """Above kdebug's DebugMode (entered inside it): counts aten ops by name
    and captures / replays the outputs of the one a Spec names, right after
    it ran."""

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        return True  # compiled frames keep running compiled (their extern ops still come here)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        from . import _upstream

        out = func(*args, **(kwargs or {}))
        name = _upstream.get_op_name(func)
        if name in _specs:
            sp, _ = _before_launch(name, ())
            if sp is not None and sp.op:
                outs = [_at_path(out, p) for p in sp.paths]
                if all(t is not None for t in outs):
                    with disable_torch_dispatch(), torch.no_grad():
                        _act(sp, outs)
                    sp.hits += 1
        return out


def write_hits() -> None:
    """Writes how many launches each spec reached beside its file."""
    for sp in specs():
        with open(sp.path + ".hits", "w") as f:
            f.write(str(sp.hits))


def read_hits(path: str) -> int:
    try:
        with open(path + ".hits") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 0


def locate(run, step) -> tuple[str, int] | None:
    """(name, occurrence) of a step of ``run``: how many earlier launches (or
    aten ops) had its name.  None where it is not found."""
    if step.kind == "kernel":
        n = 0
        for k in run.kernels:
            if k.launch_index == step.kernel_number:
                return step.name, n
            if k.kernel_name == step.name:
                n += 1
        return None
    from .compare import _op_name
    from .calls import _KernelCall

    ops = run.operators
    n = 0
    for i in range(min(step.index, len(ops))):
        op = ops[i]
        if not isinstance(op, _KernelCall) and _op_name(op) == step.name:
            n += 1
    return step.name, n


def spec_for(run, root, mode: str, path: str) -> Spec | None:
    """The Spec that captures / replays / samples ``root``'s differing outputs."""
    where = locate(run, root.step_a)
    if where is None:
        return None
    name, occurrence = where
    a = root.step_a
    if a.kind == "kernel":
        positions = [a.arg_names.index(k) for k in root.keys if k in a.arg_names]
        return Spec(name, occurrence, positions, mode, path)
    paths = [k for k in root.keys if k.startswith("out/")]
    return Spec(name, occurrence, [], mode, path, op=True, paths=paths) if paths else None


def judge(original, root, replayed, hits: int, recurred: bool | None = None) -> dict:
    """Whether the replayed comparison (run D against run C) clears what
    ``root`` of ``original`` was blamed for: {"confirmed", "text", "still"}.

    Confirmed when the replayed step is no longer a consequential root and
    whatever still differs starts at other roots: the original's other roots,
    or steps whose inputs are identical in the replayed runs (the next root,
    which the replayed one had hidden among its heirs, standing alone).  Not
    confirmed when the replayed step still has consequences or a difference
    comes from outside the recording that the original did not have.

    ``recurred``: whether the root, left to itself in the replay run, wrote
    other outputs than in the capture run (None: unknown).  When it did not,
    the replay replaced its outputs by equal ones and a clean re-run proves
    nothing: the verdict is "not proven" (confirmed None), never CONFIRMED."""
    v = _judge(original, root, replayed, hits)
    if recurred is False and v["confirmed"]:
        return {"confirmed": None, "still": v["still"],
                "text": "NOT PROVEN: in the two re-runs it wrote the same outputs by itself (its difference did "
                        "not recur), so the replay had nothing to replace; run the hunt with --confirm again"}
    return v


def _judge(original, root, replayed, hits: int) -> dict:
    if hits < 1:
        return {"confirmed": False, "still": [],
                "text": "NOT CONFIRMED: the replay never reached the launch (another kernel order in the re-runs?)"}
    if replayed.structural:
        return {"confirmed": False, "still": [], "text": "NOT CONFIRMED: the re-runs launched other kernels"}
    others = {x.step_a.label() for x in original.roots if x is not root}
    still = [x.step_a.label() for x in replayed.roots]
    if not replayed.roots:
        text = (f"CONFIRMED by replay: with its outputs taken from the run before, the re-run matches "
                f"it ({root.consequences} later launch(es)/op(s) it was blamed for now match)")
        return {"confirmed": True, "still": [], "text": text}
    itself = root.step_a.label()
    unexplained = [x.step_a.label() for x in replayed.roots
                   if x.step_a.label() == itself or (x.kind != "root" and x.step_a.label() not in others)]
    if unexplained:
        return {"confirmed": False, "still": still, "text": "NOT CONFIRMED: with its outputs replayed the re-run "
                                                            "still differs at " + ", ".join(unexplained[:3])}
    known = [t for t in still if t in others]
    new = [t for t in still if t not in others]
    parts = []
    if known:
        parts.append("the other roots (" + ", ".join(known[:3]) + ")")
    if new:
        parts.append("the next root, now standing alone with identical inputs (" + ", ".join(new[:3]) + ")")
    return {"confirmed": True, "still": still,
            "text": "CONFIRMED by replay: what it was blamed for now matches; what still differs starts at "
                    + " and ".join(parts)}
