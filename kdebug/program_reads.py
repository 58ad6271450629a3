"""Reads of tensor values by the program that no dispatch mode sees.

Note [Program reads]
A program hands a tensor's values to the world in ways that call no aten
op: ``print(t)`` / ``repr`` / ``str`` / f-strings (torch formats under
``_disable_current_modes``), ``t.tolist()`` and ``t.numpy()`` /
``np.asarray(t)`` (they read the storage directly), ``torch.save`` /
``pickle`` (``Tensor.__reduce_ex__``, which writes the tensor's whole
storage, a view's base included; ``torch.save`` of a storage itself) and a
storage's ``tolist``.  A recording sees nothing of them,
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
reached the program this way is never benign.  A read on a thread of its
own (an asynchronous checkpoint, a logging thread) goes to the one mode
recording program reads in the process, with its thread's hash spec.  Only
the outermost read counts (``repr``
calling ``tolist`` inside is one read); reads made while no hash spec is
active, of tensors without data (meta, fake) or of tensor subclasses
that are not plain tensors are not recorded.  These records are kdebug's
own and appear in ``operators`` and traces; upstream's DebugMode has none.
The wrappers are installed while at least one such mode is entered and
removed with the last (the methods are restored exactly: an inherited one
is deleted again).

Note [Program reads under torch.compile]
A print or tolist inside a torch.compile'd function is a graph break: Dynamo
compiles the code before it, runs the read itself eagerly, and compiles what
follows as a function of its own.  The read runs while Dynamo's frame hook is
on, and Dynamo compiles any Python frame it meets that is not torch's own:
kdebug's wrappers were compiled as frames of their own (graph breaks on
sys._getframe, the dispatch guards), and what followed the read in the
program ran uncompiled (a trust pass: an eager softmax gave the program
another result under kdebug record, and the compiled index_add race after a
debugging print was never launched, so the hunt said "match").  So:

- the wrapper's own frame is skipped, never compiled on its own
  (_upstream.skip_frame);
- its recording part is a torch._dynamo.disable'd function: its frames, and
  those it calls, are never compiled;
- when Dynamo traces a call of the wrapper (torch.compiler.is_dynamo_compiling(),
  True only while Dynamo traces), it does what it stands for: the object's
  method by name (y.tolist(), which Dynamo knows) or torch.save.  A first
  version disabled the whole wrapper, and torch.Tensor.tolist(y) inside a
  fullgraph function failed where it compiled without kdebug; a second took
  the traced branch under is_compiling(), also True in eager code run while a
  graph compiles (AOTAutograd formatting a tensor), and __repr__ called itself
  without end.
"""
from __future__ import annotations

import hashlib
import sys
import threading

import torch

from . import _C, _upstream

# the pseudo-op names, one per way out
PRINT, TOLIST, NUMPY, PICKLE = "kdebug::print", "kdebug::tolist", "kdebug::numpy", "kdebug::pickle"
SAVED = "kdebug::saved_structure"  # what a torch.save wrote besides tensor values (Note [What a save wrote])
NAMES = frozenset({PRINT, TOLIST, NUMPY, PICKLE, SAVED})
# kdebug.replicated's record (kdebug/crossrank.py, and the final DDP parameters
# of kdebug/ddp_final.py): a value the program declared its result, read with
# its hash; compared as what the program got, as these reads are
REPLICATED = "kdebug::replicated"
VALUE_READS = frozenset({TOLIST, NUMPY, PICKLE, REPLICATED})  # compared by the hash of what they read

# (owner, attribute) -> (the pseudo-op its call records, reads the whole storage)
_ENTRY_POINTS = {(torch.Tensor, "__repr__"): (PRINT, False), (torch.Tensor, "tolist"): (TOLIST, False),
                 (torch.Tensor, "numpy"): (NUMPY, False), (torch.Tensor, "__array__"): (NUMPY, False),
                 (torch.Tensor, "__reduce_ex__"): (PICKLE, True),
                 (torch.UntypedStorage, "tolist"): (TOLIST, True),
                 (torch.TypedStorage, "tolist"): (TOLIST, True)}
_SAVE = ((torch, "save"), (torch.serialization, "save"))  # functions: torch.save(obj, f, ...)

_lock = threading.Lock()
_installed = 0
_saved: dict[tuple, tuple[bool, object]] = {}  # (owner, attr) -> (defined on the owner itself, the original)
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
        if mod.split(".", 1)[0] in _PASS_THROUGH or mod == __name__:  # this module's own wrappers too
            f = f.f_back
            continue
        return (mod == "kdebug" or mod.startswith("kdebug.")) and mod != "kdebug._runner"
    return False


_modes: list = []  # the entered modes that record program reads, first entered first


def _mode_for_this_read():
    """The mode this thread's read goes to: the active kdebug DebugMode on
    this thread when it records program reads; else, on a thread of its own
    (an async checkpoint, a logging thread), the one such mode entered in the
    process, when there is exactly one."""
    from . import _active
    from .mode import DebugMode

    dm = _active.debug_mode()
    if isinstance(dm, DebugMode):
        return dm if dm in _modes else None
    return _modes[0] if len(_modes) == 1 else None


def _data_of(x, whole: bool):
    """(the tensor whose values are read, its shape text) for a tensor or a
    storage; ``whole``: the bytes of the tensor's whole storage (what pickling
    writes, a view's base included); None for what has no data to hash."""
    from .collectives import _shape_text

    if isinstance(x, torch.TypedStorage):
        x = _upstream.untyped_of(x)  # (untyped() warns into the program's output)
    if isinstance(x, torch.UntypedStorage):
        st = x
    elif (isinstance(x, torch.Tensor) and not x.is_meta
          and getattr(type(x), "__torch_dispatch__", None) is torch.Tensor.__torch_dispatch__):
        if not whole:
            return x.detach(), _shape_text(x)
        st = x.untyped_storage()
    else:
        return None  # no data, or a wrapper subclass whose reads are its own
    if st.device.type == "meta":
        return None
    b = torch.empty(0, dtype=torch.uint8, device=st.device).set_(st, 0, (st.nbytes(),), (1,))
    return b, f"storage nbytes={st.nbytes()}"


def _recording(frame):
    """(the mode this read goes to, its hash entry), or None when the read is
    not recorded: no such mode entered, no hash spec active, or kdebug's own."""
    from . import _aten_hooks

    dm = _mode_for_this_read()
    if dm is None or not dm._entered:
        return None
    entry = _aten_hooks.this_thread().hash_entry
    if entry is None and dm._hook_owner is not None:  # a thread of its own: the recording thread's spec
        entry = dm._hook_owner.hash_entry
    if entry is None or _asked_by_kdebug(frame):
        return None
    return dm, entry


def _record(x, name: str, frame, printed: str | None = None, whole: bool = False) -> None:
    """Appends the read of ``x`` (a tensor or a storage) to the mode that
    records program reads, if any (``printed``: the text a print / repr made
    of it)."""
    from . import hashing

    got = _recording(frame)
    if got is None:
        return
    dm, entry = got
    with _upstream.disable_torch_dispatch():
        got = _data_of(x, whole)
        if got is None:
            return
        d, shape = got
        h = hashing.start_value(d, entry.spec)
        ext = _C.tree_extents(((d,), {}))
    text = f"{name}({shape})"
    if printed is not None:  # what reached the program is this text: compared by its digest
        text += f"  ->  {int.from_bytes(hashlib.blake2b(printed.encode(), digest_size=8).digest(), 'little')}"
    call = ProgramRead(name, text, 0)
    call.log["input_hash"] = ((h,), {})
    call._kd_extents = _C.OpExtents((None if ext is NotImplemented else ext, None))
    list.append(dm._ops, call)


def _try_record(x, name: str, frame, printed: str | None = None, whole: bool = False) -> None:
    try:
        _record(x, name, frame, printed, whole)
    except Exception:  # noqa: BLE001 (never the program's problem: the read is just not recorded)
        pass


def _storages(obj, depth: int = 0, out: list | None = None) -> list:
    """The storages handed to torch.save directly or inside dicts, lists and
    tuples (tensors are seen at their own pickling, Tensor.__reduce_ex__)."""
    out = [] if out is None else out
    if len(out) > 10000 or depth > 8:
        return out
    if isinstance(obj, (torch.UntypedStorage, torch.TypedStorage)):
        out.append(obj)
    elif isinstance(obj, dict):
        for v in obj.values():
            _storages(v, depth + 1, out)
    elif isinstance(obj, (list, tuple, set)):
        for v in obj:
            _storages(v, depth + 1, out)
    return out


# Note [What a save wrote]
# torch.save(obj) writes obj's structure as well as its tensors: the keys of
# its dicts, in order, which tensor sits under which key, and its other values
# (a step count, a loss).  Each tensor's pickling is a read of its values
# (kdebug::pickle), in the order pickle meets them; a checkpoint whose keys
# came out in another order (a model's heads built from a set, whose order
# follows PYTHONHASHSEED in each process) pickled the same values in the same
# order under other names, so the runs' saved files differed while every read
# matched (a trust pass).  So a save also records kdebug::saved_structure: the
# digest of obj's skeleton (containers and their keys in order, each tensor's
# dtype and shape; any other value by its type only; 8 levels, 10000 entries),
# compared as what the program got, like a print's text.  Other values count
# by type, not value: a checkpoint's time, run id or RNG state differs in every
# run of a deterministic program, and a first version that compared them by
# repr called such runs divergent (a review); a value computed from a
# differing tensor is read from it (.item(), tolist) and compared there.


def _skeleton(obj, h, depth: int = 0, left: list | None = None, key: bool = False) -> None:
    """Feeds obj's skeleton (Note [What a save wrote]) into hash h; ``key``:
    obj is a dict's key."""
    left = [10000] if left is None else left
    left[0] -= 1
    if left[0] < 0 or depth > 8:
        h.update(b"...")
        return
    if isinstance(obj, torch.Tensor):
        h.update(f"T({obj.dtype},{tuple(obj.shape)})".encode())
    elif isinstance(obj, (torch.UntypedStorage, torch.TypedStorage)):
        st = _upstream.untyped_of(obj) if isinstance(obj, torch.TypedStorage) else obj  # (untyped() warns)
        h.update(f"S({st.nbytes()})".encode())
    elif isinstance(obj, dict):
        h.update(b"{")
        for k, v in obj.items():
            _skeleton(k, h, depth + 1, left, key=True)
            h.update(b":")
            _skeleton(v, h, depth + 1, left)
            h.update(b",")
        h.update(b"}")
    elif isinstance(obj, (list, tuple)):
        h.update(b"[" if isinstance(obj, list) else b"(")
        for v in obj:
            _skeleton(v, h, depth + 1, left)
            h.update(b",")
        h.update(b"]")
    elif key and (obj is None or isinstance(obj, (bool, int, str, bytes))):  # a key names what is under it
        h.update(repr(obj).encode(errors="backslashreplace")[:4096])
    else:  # another value (a time, a run id, an object): its type only
        h.update(f"<{type(obj).__module__}.{type(obj).__qualname__}>".encode(errors="backslashreplace"))


def _record_structure(obj, frame) -> None:
    """kdebug::saved_structure of a torch.save's object (Note [What a save wrote])."""
    got = _recording(frame)
    if got is None:
        return
    dm = got[0]
    h = hashlib.blake2b(digest_size=8)
    _skeleton(obj, h)
    n = "dict" if isinstance(obj, dict) else type(obj).__name__
    call = ProgramRead(SAVED, f"{SAVED}({n})  ->  {int.from_bytes(h.digest(), 'little')}", 0)
    list.append(dm._ops, call)


def _wrapper(orig, name: str, whole: bool = False, saving: bool = False, method: str | None = None):
    eager = torch._dynamo.disable(_reader(orig, name, whole, saving), recursive=True)

    def read(*args, **kwargs):  # Note [Program reads under torch.compile]
        if _dynamo_tracing():  # Dynamo traces a call of it: as it traces what it stands for
            if method is not None and args:  # the object's own method, which Dynamo knows by name
                return getattr(args[0], method)(*args[1:], **kwargs)
            return orig(*args, **kwargs)
        return eager(*args, **kwargs)

    _upstream.skip_frame(read.__code__)  # never compiled as a frame of its own
    read.__wrapped__ = orig
    read.__name__ = getattr(orig, "__name__", "read")
    read.__doc__ = getattr(orig, "__doc__", None)
    return read


# True only while Dynamo traces the code that calls it (it folds the call to a constant); False
# when run, including in the eager code of a compilation (AOTAutograd's logging formats tensors with
# their __repr__: under torch.compiler.is_compiling(), True there, the wrapper called itself by name
# without end).  torch 2.11 and 2.13 have it.
_dynamo_tracing = getattr(torch.compiler, "is_dynamo_compiling", torch.compiler.is_compiling)


def _reader(orig, name: str, whole: bool, saving: bool):
    def read(*args, **kwargs):
        if getattr(_local, "busy", False) or not (args or saving):
            return orig(*args, **kwargs)  # (a call without its object: orig says what is wrong)
        _local.busy = True
        try:
            frame = sys._getframe(1)
            if name == PRINT:  # the text is what the program got
                out = orig(*args, **kwargs)
                _try_record(args[0], name, frame, out if isinstance(out, str) else None)
                return out
            if saving:  # torch.save(obj, f), obj= given by name too: storages in obj (its tensors record at
                # their __reduce_ex__)
                obj = args[0] if args else kwargs.get("obj")
                try:
                    _record_structure(obj, frame)
                except Exception:  # noqa: BLE001 (never the program's problem: the read is just not recorded)
                    pass
                for st in _storages(obj):
                    _try_record(st, name, frame, whole=True)
                _local.busy = False  # the tensors' own pickling inside is the program's read
                return orig(*args, **kwargs)
            _try_record(args[0], name, frame, whole=whole)
            return orig(*args, **kwargs)
        finally:
            _local.busy = False

    return read


def install(mode) -> None:
    """Wraps the entry points (once, however many modes ask); ``mode`` records
    program reads until uninstall(mode)."""
    global _installed
    with _lock:
        _modes.append(mode)
        _installed += 1
        if _installed > 1:
            return
        for (owner, attr), (name, whole) in _ENTRY_POINTS.items():
            own = attr in owner.__dict__
            orig = getattr(owner, attr)
            _saved[(owner, attr)] = (own, owner.__dict__[attr] if own else None)
            setattr(owner, attr, _wrapper(orig, name, whole=whole, method=attr))
        for owner, attr in _SAVE:
            orig = getattr(owner, attr)
            _saved[(owner, attr)] = (True, orig)
            setattr(owner, attr, _wrapper(orig, PICKLE, saving=True))  # torch.save(obj, f, ...): obj is "self"


def uninstall(mode) -> None:
    """Undoes install(mode); the last restores every entry point as it was."""
    global _installed
    with _lock:
        if mode in _modes:
            _modes.remove(mode)
        if _installed == 0:
            return
        _installed -= 1
        if _installed:
            return
        for (owner, attr), (own, orig) in _saved.items():
            if own:
                setattr(owner, attr, orig)
            else:
                delattr(owner, attr)
        _saved.clear()
