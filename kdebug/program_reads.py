"""Reads of tensor values by the program that no dispatch mode sees.

Note [Program reads]
A program hands a tensor's values to the world in ways that call no aten
op: ``print(t)`` / ``repr`` / ``str`` / f-strings (torch formats under
``_disable_current_modes``), ``t.tolist()`` and ``t.numpy()`` /
``np.asarray(t)`` (they read the storage directly), and ``torch.save`` /
``pickle`` (``Tensor.__reduce_ex__``).  A recording sees nothing of them,
so a differing tensor whose only reader was one of these and which the
program then dropped counted as *freed unread* (benign): a script that
printed, saved or serialized a nondeterministic result was said to match
while its output differed (found by a trust pass on unseen scripts:
torch.save, json.dump(t.tolist()), print(t)).

So while a kdebug DebugMode that records the final state is active
(``record_final_state=True``: ``kdebug hunt`` / ``record`` runs,
``assert_deterministic``, the pytest plugin), those entry points of
``torch.Tensor`` are wrapped, and each read of a tensor is recorded as a
pseudo-op named for the way it left -- ``kdebug::print``,
``kdebug::tolist``, ``kdebug::numpy``, ``kdebug::pickle`` -- with the hash
of the values read (the active ``log_tensor_hashes`` spec) and the
tensor's memory extents.  The comparison links such a read to the step
that wrote the memory, as any op's, and compares what the program got (Note
[Returned values] in csrc/core/kd_trace_digest.c): the values read, or for
a print the text it made (its digest is the record's returned value: a
difference below the printed precision prints the same text, and is read
into an identical output like any absorbed one).  A root whose difference
reached the program this way is never benign.  Only the outermost read counts (``repr``
calling ``tolist`` inside is one read); reads made while no hash spec is
active, of tensors without data (meta, fake) or of tensor subclasses
that are not plain tensors are not recorded.  These records are kdebug's
own and appear in ``operators`` and traces; upstream's DebugMode has none.
The wrappers are installed while at least one such mode is entered and
removed with the last (the methods are restored exactly: an inherited one
is deleted again).
"""
from __future__ import annotations

import hashlib
import sys
import threading

import torch

from . import _C, _upstream

# the pseudo-op names, one per way out
PRINT, TOLIST, NUMPY, PICKLE = "kdebug::print", "kdebug::tolist", "kdebug::numpy", "kdebug::pickle"
NAMES = frozenset({PRINT, TOLIST, NUMPY, PICKLE})
# kdebug.replicated's record (kdebug/crossrank.py, and the final DDP parameters
# of kdebug/ddp_final.py): a value the program declared its result, read with
# its hash; compared as what the program got, as these reads are
REPLICATED = "kdebug::replicated"
VALUE_READS = frozenset({TOLIST, NUMPY, PICKLE, REPLICATED})  # compared by the hash of what they read

# torch.Tensor attribute -> the pseudo-op its call records
_ENTRY_POINTS = {"__repr__": PRINT, "tolist": TOLIST, "numpy": NUMPY, "__array__": NUMPY,
                 "__reduce_ex__": PICKLE}

_lock = threading.Lock()
_installed = 0
_saved: dict[str, tuple[bool, object]] = {}  # name -> (defined on torch.Tensor itself, the original)
_local = threading.local()  # .busy: inside a wrapped call on this thread


class ProgramRead(_upstream._OpCall):
    """A read of a tensor by the program outside torch ops, in
    ``DebugMode.operators``: its text, ``log["input_hash"]`` and extents."""

    def __init__(self, name: str, text: str, depth: int):
        self.op = name
        self.call_depth = depth
        self.args_str = self.kwargs_str = ""
        self.output_str = None
        self.record = None
        self.log: dict = {}
        self.stack_trace = self.fwd_stack_trace = None
        self.text = text

    def render(self, attributes) -> str:
        return self.text + (f"  # {self.log}" if self.log else "")

    def stringify_args(self, *a, **k) -> None:  # the text is made once, at the read
        pass

    def stringify_output(self, *a, **k) -> None:
        pass

    def __repr__(self) -> str:
        return self.text


# modules whose frames stand between a read and the code that asked for it
# (torch.save's pickler, logging's formatting, numpy's asarray, ...)
_PASS_THROUGH = ("torch", "numpy", "pickle", "copyreg", "copy", "json", "logging", "pprint", "reprlib", "io",
                 "_io", "string", "textwrap", "traceback", "warnings", "contextlib", "functools")


def _asked_by_kdebug(frame) -> bool:
    """Whether the nearest frame outside torch, numpy and the standard
    library's formatting / serialization modules is kdebug's own code (its
    replays and repro captures save tensors while recording): not the
    program's read.  The program's own frames, run by kdebug's runner,
    are nearer than the runner's."""
    f = frame
    while f is not None:
        mod = f.f_globals.get("__name__", "") or ""
        if mod.split(".", 1)[0] in _PASS_THROUGH:
            f = f.f_back
            continue
        return (mod == "kdebug" or mod.startswith("kdebug.")) and mod != "kdebug._runner"
    return False


def _record(t, name: str, frame, printed: str | None = None) -> None:
    """Appends the read of ``t`` to the active kdebug DebugMode that records
    program reads, if any (``printed``: the text a print / repr made of it)."""
    from . import _active, _aten_hooks, hashing
    from .collectives import _shape_text
    from .mode import DebugMode

    if (not isinstance(t, torch.Tensor) or t.is_meta
            or getattr(type(t), "__torch_dispatch__", None) is not torch.Tensor.__torch_dispatch__):
        return  # no data, or a wrapper subclass whose reads are its own
    dm = _active.debug_mode()
    if not isinstance(dm, DebugMode) or not dm._entered or dm.kernels_only or not dm.record_final_state:
        return
    entry = _aten_hooks.this_thread().hash_entry
    if entry is None or _asked_by_kdebug(frame):
        return
    with _upstream.disable_torch_dispatch():
        d = t.detach()
        h = hashing.start_value(d, entry.spec)
    text = f"{name}({_shape_text(t)})"
    if printed is not None:  # what reached the program is this text: compared by its digest
        text += f"  ->  {int.from_bytes(hashlib.blake2b(printed.encode(), digest_size=8).digest(), 'little')}"
    call = ProgramRead(name, text, getattr(dm, "call_depth", 0))
    call.log["input_hash"] = ((h,), {})
    ext = _C.tree_extents(((d,), {}))
    call._kd_extents = _C.OpExtents((None if ext is NotImplemented else ext, None))
    list.append(dm._ops, call)


def _try_record(t, name: str, frame, printed: str | None = None) -> None:
    try:
        _record(t, name, frame, printed)
    except Exception:  # noqa: BLE001 (never the program's problem: the read is just not recorded)
        pass


def _wrapper(orig, name: str):
    def read(self, *args, **kwargs):
        if getattr(_local, "busy", False):
            return orig(self, *args, **kwargs)
        _local.busy = True
        try:
            if name == PRINT:  # the text is what the program got
                out = orig(self, *args, **kwargs)
                _try_record(self, name, sys._getframe(1), out if isinstance(out, str) else None)
                return out
            _try_record(self, name, sys._getframe(1))
            return orig(self, *args, **kwargs)
        finally:
            _local.busy = False

    read.__wrapped__ = orig
    read.__name__ = getattr(orig, "__name__", "read")
    read.__doc__ = getattr(orig, "__doc__", None)
    return read


def install() -> None:
    """Wraps the entry points (once, however many modes ask)."""
    global _installed
    with _lock:
        _installed += 1
        if _installed > 1:
            return
        for attr, name in _ENTRY_POINTS.items():
            own = attr in torch.Tensor.__dict__
            orig = getattr(torch.Tensor, attr)
            _saved[attr] = (own, torch.Tensor.__dict__[attr] if own else None)
            setattr(torch.Tensor, attr, _wrapper(orig, name))


def uninstall() -> None:
    """Undoes one install(); the last restores every entry point as it was."""
    global _installed
    with _lock:
        if _installed == 0:
            return
        _installed -= 1
        if _installed:
            return
        for attr, (own, orig) in _saved.items():
            if own:
                setattr(torch.Tensor, attr, orig)
            else:
                delattr(torch.Tensor, attr)
        _saved.clear()
