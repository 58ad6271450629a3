"""Kernel outputs recorded on request, filtered and streamed to a values file.

Note [Recorded values on disk]
``DebugMode.record_outputs()`` keeps a clone of what every kernel writes,
in memory, within a byte budget.  Finding a bad intermediate (the question
Inductor's AOTI intermediate value printer answers) needs the outputs of a
few kernels, often late in a long run, and often in another process.  So
``record_outputs(filter=..., to=...)``:

- ``filter`` chooses the launches that keep outputs: a regular expression
  searched in the kernel name, a ``range`` of launch indices, or a callable
  ``(kernel_name, launch_index) -> bool``.  The C launch hook asks
  (``kd_output_filter_fn``, csrc/kd_launch.c) after each launch recorded
  under the filter, before anything is cloned, so launches left out cost no
  copy and no budget.  A filter that raises is counted as a hook error of
  the recorder (its launch keeps nothing), never raised into the program.
  Aten ops keep their outputs (call.record, in memory, as upstream) only
  with ``aten=True``; then a pattern is searched in the op name and a
  callable gets ``(op_name, None)``; a range never matches an aten op.
- ``to`` (a DebugMode recording to a trace, or a directory) streams the
  kept outputs to a values file: ``<trace>.values`` or
  ``<directory>/kdebug.values``.  Each launch's clones are written and
  released from memory as soon as they are complete: CPU clones when the
  next filtered launch runs, GPU clones (queued on the kernel's stream
  without a synchronization) when the DebugMode drains its ring (a read, a
  trace tick, exit) and at the latest when the context is left, each
  drain copying all of them to pinned host memory with one synchronization
  per device, not one per kernel.  So memory holds at most the outputs of
  the launches since the last drain.
- the budget (``max_bytes``) counts every byte cloned, kept in memory or
  written; outputs over it are not cloned, counted (the recorder's
  ``outputs_skipped``, warned about), and the values file says which
  launches matched but lost outputs ("skipped" entries, and the summary).
  A write that fails (a full disk) stops the writing, is counted and warned
  about; nothing is dropped silently.
- outputs written to the file are released from memory, so a streamed
  launch's ``call.record`` is None: read it with ``Run.values(N)``.
  Aten-op outputs (``aten=True``) stay in memory only.
- the file is created anew (never through a symbolic link, nor in a
  directory that is one: kdebug/_files.py) and is versioned and validated
  on reading: a foreign, newer, corrupt or truncated file raises
  TraceFileError naming the byte offset; ``partial=True`` reads the entries
  before a truncation (a process that died while writing).

Format (version 1, little-endian): the 16-byte header ``b"KDVALUES"``,
u32 version, u32 0; then entries, each ``b"KDVE"``, u32 n, n bytes of JSON
(an object with "k": "tensor" | "skipped" | "summary"), then for a tensor
entry its ``nbytes`` raw bytes, C-contiguous, with their crc32 in the JSON.

``kdebug.load(trace).values(N)`` (or ``kdebug.values.open(path).values(N)``)
returns {argument name: tensor} for launch N, None when launch N was not
recorded (filtered out), and raises ValuesNotRecorded when it matched but
its outputs were dropped (over the budget, or a failed write).
"""
from __future__ import annotations

import builtins
import ctypes
import itertools
import json
import mmap
import os
import re
import struct
import threading
import zlib
from typing import Any, Callable

import torch

from . import _C, _files, _upstream

MAGIC = b"KDVALUES"
VERSION = 1
ENTRY = b"KDVE"
FILE_NAME = "kdebug.values"
_HEADER = struct.Struct("<8sII")
_ENTRY = struct.Struct("<4sI")
_MAX_JSON = 1 << 20
_MAX_NDIM = 64


def _viewable(d: torch.dtype) -> bool:
    """Whether a tensor of dtype d can be rebuilt from its bytes (not quantized ones)."""
    try:
        t = torch.frombuffer(bytearray(2 * d.itemsize), dtype=torch.uint8).view(d).reshape([2, 1])
        t.contiguous().reshape(-1).view(torch.uint8)
        return d.itemsize > 0
    except (RuntimeError, TypeError, ValueError):
        return False


_DTYPES = {str(d).removeprefix("torch."): d for d in list(vars(torch).values())
           if isinstance(d, torch.dtype) and _viewable(d)}


class ValuesNotRecorded(LookupError):
    """A launch matched the record_outputs filter but its outputs were not kept."""


# ---------------------------------------------------------------- the filter

class OutputFilter:
    """Which launches (and aten ops) keep outputs (Note [Recorded values on disk])."""

    def __init__(self, spec, aten: bool | None) -> None:
        self.spec = spec
        self._cache: dict[str, bool] = {}
        if spec is None:
            self._kernel: Callable[[str, int], bool] = lambda name, i: True
            self._op: Callable[[str], bool] = lambda name: True
        elif isinstance(spec, str):
            try:
                pat = re.compile(spec)
            except re.error as e:
                raise ValueError(f"record_outputs(filter={spec!r}): not a regular expression ({e}); "
                                 "pass a pattern searched in kernel names, a range of launch indices, "
                                 "or a callable (kernel_name, launch_index) -> bool") from None
            self._kernel = lambda name, i: self._cached(pat, name)
            self._op = lambda name: pat.search(name) is not None
        elif isinstance(spec, range):
            self._kernel = lambda name, i: i in spec
            self._op = lambda name: False
        elif callable(spec):
            self._kernel = lambda name, i: bool(spec(name, i))
            self._op = lambda name: bool(spec(name, None))
        else:
            raise TypeError(f"record_outputs(filter=...) got {type(spec).__name__}: pass a regular "
                            "expression (str), a range of launch indices, or a callable "
                            "(kernel_name, launch_index) -> bool")
        if aten is not None and not isinstance(aten, bool):
            raise TypeError(f"record_outputs(aten=...) must be True or False, not {aten!r}")
        self.aten = (spec is None) if aten is None else aten
        # a callable filter may also say where kept aten-op clones go: spec.keep_op(tree) -> the tree kept on
        # call.record (the accuracy check's tiers, Note [Output spill]); else the clones themselves
        self.keep_op = getattr(spec, "keep_op", None) if callable(spec) and not isinstance(spec, (str, range)) else None

    def _cached(self, pat, name: str) -> bool:
        hit = self._cache.get(name)
        if hit is None:
            hit = self._cache[name] = pat.search(name) is not None
        return hit

    def kernel(self, name: str, launch_index: int) -> bool:
        return self._kernel(name, launch_index)

    def op(self, name: str) -> bool:
        return self.aten and self._op(name)


# ---------------------------------------------------------------- writing

def _tensor_bytes(t: torch.Tensor) -> bytes:
    flat = t.detach().contiguous().reshape(-1)
    if flat.numel() == 0:
        return b""
    if flat.device.type != "cpu":
        raise ValueError(f"a {flat.device} tensor reached the values writer (copy it to the host first)")
    return ctypes.string_at(flat.data_ptr(), flat.numel() * flat.element_size())


def _to_host(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """Host copies of the clones: CPU ones as they are; device ones copied
    into pinned memory without blocking, then one synchronization per device
    (the clones were queued on their kernels' streams, so each device is
    synchronized once first, too).  Untested here: no GPU (say so)."""
    devices = {t.device for t in tensors if t.device.type == "cuda"}
    if not devices:
        return tensors
    for d in devices:
        torch.cuda.synchronize(d)
    out = []
    for t in tensors:
        if t.device.type == "cuda":
            h = torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=True)
            h.copy_(t, non_blocking=True)
            out.append(h)
        else:
            out.append(t)
    for d in devices:
        torch.cuda.synchronize(d)
    return out


class Writer:
    """A values file being written (Note [Recorded values on disk])."""

    def __init__(self, path: str, append: bool = False) -> None:
        self.path = path
        if append and os.path.exists(path):
            open(path)  # a whole values file, else TraceFileError: nothing appended after garbage
            self._f = _files.open_append(path)
        else:
            self._f = _files.create_replacing(path)
            self._f.write(_HEADER.pack(MAGIC, VERSION, 0))
        self._f.flush()

    def _entry(self, head: dict, payload: bytes = b"") -> None:
        j = json.dumps(head, separators=(",", ":")).encode()
        self._f.write(_ENTRY.pack(ENTRY, len(j)) + j)
        if payload:
            self._f.write(payload)

    def tensor(self, launch: int, kernel: str, arg: str, t: torch.Tensor) -> int:
        data = _tensor_bytes(t)
        self._entry({"k": "tensor", "launch": launch, "kernel": kernel, "arg": arg,
                     "dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape),
                     "nbytes": len(data), "crc32": zlib.crc32(data)}, data)
        return len(data)

    def skipped(self, launch: int, kernel: str, reason: str) -> None:
        self._entry({"k": "skipped", "launch": launch, "kernel": kernel, "reason": reason})

    def summary(self, d: dict) -> None:
        self._entry({"k": "summary", **d})

    def flush(self) -> None:
        self._f.flush()

    def close(self) -> None:
        self._f.close()


def destination(to, dm_type) -> tuple[str | None, bool]:
    """The values file for record_outputs(to=...): <trace>.values for a
    DebugMode recording to a trace, <dir>/kdebug.values for a directory;
    and whether to append to it: a DebugMode entered again appends to its
    trace, and its values file follows (else the first context's values
    would be lost)."""
    if to is None:
        return None, False
    append = False
    if isinstance(to, dm_type):
        trace = getattr(to, "_trace_path", None)
        if trace is None:
            raise ValueError("record_outputs(to=debug_mode): that DebugMode has no trace; create it with "
                             "DebugMode(trace='run.kdt'), or pass a directory")
        path = os.fspath(trace) + ".values"
        append = getattr(to, "_kd_values_path", None) == path
        to._kd_values_path = path
    else:
        try:
            d = os.fspath(to)
        except TypeError:
            raise TypeError(f"record_outputs(to=...) got {type(to).__name__}: pass a DebugMode recording "
                            "to a trace, or a directory") from None
        if os.path.islink(d):
            raise _files.LinkRefused(d)
        if not os.path.isdir(d):
            raise ValueError(f"record_outputs(to={d!r}): not a directory; create it first, or pass a "
                             "DebugMode recording to a trace")
        path = os.path.join(d, FILE_NAME)
    problem = _files.output_problem(path)
    if problem is not None:
        if os.path.islink(path):
            raise _files.LinkRefused(path)
        raise ValueError(f"record_outputs: {problem}")
    return path, append


class Sink:
    """One entered record_outputs() context with a filter or a destination:
    answers the C hook's filter questions and writes what it kept."""

    def __init__(self, flt: OutputFilter, path: str | None, append: bool = False) -> None:
        self.filter = flt
        self.path = path
        self.writer = Writer(path, append) if path is not None else None
        self.pending: dict[int, tuple[Any, dict[int, str]]] = {}  # id(recorder) -> (recorder, {launch: kernel})
        self.skipped_at_start: dict[int, int] = {}
        self.launches = self.tensors = self.bytes = self.skipped = self.write_failed = 0
        self.error: str | None = None
        self.lock = threading.Lock()
        self.pid = os.getpid()  # Note [Forked children] (kdebug/trace.py): a child never writes the file

    def wants(self, recorder, name: str, launch_index: int) -> bool:
        if self.writer is None:
            return self.filter.kernel(name, launch_index)
        key = id(recorder)
        if key not in self.pending:
            self.pending[key] = (recorder, {})
            self.skipped_at_start[key] = recorder.stats()["outputs_skipped"]
        # CPU clones of earlier launches are complete: write them now
        self.write(recorder, cpu_only=True)
        keep = self.filter.kernel(name, launch_index)
        if keep:
            self.pending[key][1][launch_index] = name
        return keep

    def write(self, recorder, cpu_only: bool = False) -> None:
        """Writes the pending launches of ``recorder`` whose clones are ready
        and releases them (with cpu_only, only all-CPU ones)."""
        entry = self.pending.get(id(recorder))
        if entry is None or not entry[1] or self.writer is None or os.getpid() != self.pid:
            return
        # kdebug's own tensor work: not the program's aten ops (no dispatch mode sees it)
        with self.lock, _upstream.disable_torch_dispatch(), torch.no_grad():
            launches = entry[1]
            outputs = recorder.outputs
            ready = []
            for i in list(launches):  # launch order: indices only grow
                outs = outputs.get(i)
                # none yet (over the budget, or still being cloned on another
                # thread), or on a device: at the drain, as is everything after it
                if cpu_only and (outs is None or any(t.device.type != "cpu" for t in outs.values())):
                    break
                ready.append((i, launches.pop(i), outputs.pop(i, None)))
            if not ready:
                return
            tensors = [t for _, _, outs in ready if outs for t in outs.values()]
            host = iter(_to_host(tensors))
            for i, name, outs in ready:
                if self.error is not None:
                    self.write_failed += 1
                    continue
                try:
                    if not outs:
                        self.writer.skipped(i, name, "budget")
                        self.skipped += 1
                        continue
                    for arg in outs:
                        self.bytes += self.writer.tensor(i, name, arg, next(host))
                        self.tensors += 1
                    self.launches += 1
                except Exception as e:  # a full disk, or anything else: counted, never raised into the run
                    self.error = f"{self.path}: {e}"
                    self.write_failed += 1
            if self.error is None:
                try:
                    self.writer.flush()
                except OSError as e:
                    self.error = f"{self.path}: {e}"

    def close(self) -> list[str]:
        """Writes what is pending and the summary; returns warnings to give."""
        for recorder, _ in list(self.pending.values()):
            self.write(recorder)
        if self.writer is None or os.getpid() != self.pid:
            return []
        over = sum(rec.stats()["outputs_skipped"] - self.skipped_at_start[k]
                   for k, (rec, _) in self.pending.items())
        msgs = []
        try:
            if self.error is None:
                self.writer.summary({"launches": self.launches, "tensors": self.tensors, "bytes": self.bytes,
                                     "launches_skipped": self.skipped, "outputs_over_budget": over,
                                     "launches_not_written": self.write_failed})
            self.writer.close()
        except OSError as e:
            self.error = self.error or f"{self.path}: {e}"
        if self.error is not None:
            msgs.append(f"record_outputs could not write its values file ({self.error}): "
                        f"{self.write_failed} launch(es)' outputs were not written")
        if self.skipped or over:
            msgs.append(f"record_outputs: {over} output(s) of {self.skipped} matching launch(es) were over "
                        f"the byte budget and not recorded ({self.path} lists them); raise "
                        "DebugMode.record_outputs(max_bytes=...)")
        self.pending.clear()
        return msgs


_sinks: dict[int, Sink] = {}
_ids = itertools.count(1)


def _ask(filter_id: int, recorder, name: str, launch_index: int) -> bool:
    """kd_output_filter_fn: whether this launch keeps its outputs."""
    sink = _sinks.get(filter_id)
    return sink is not None and sink.wants(recorder, name, launch_index)


def register(sink: Sink) -> int:
    """A filter id for _C._set_record_outputs, answered by ``sink``."""
    _C._set_output_filter(_ask)
    fid = next(_ids)
    _sinks[fid] = sink
    return fid


def unregister(fid: int) -> list[str]:
    sink = _sinks.pop(fid, None)
    return sink.close() if sink is not None else []


def drain(recorder) -> None:
    """Writes what every open values file has pending from ``recorder``
    (called by DebugMode right after it drains its ring)."""
    for sink in list(_sinks.values()):
        if sink.writer is not None and id(recorder) in sink.pending:
            sink.write(recorder)


def record_hooks(flt: OutputFilter) -> tuple:
    """(pre-log, log, record) hooks: upstream's record_outputs() hook for the
    aten ops the filter lets through."""
    def record(func, types, args, kwargs, result):
        if not flt.op(_upstream.get_op_name(func)):
            return None
        out = _upstream.tree_map(lambda x: x.clone() if isinstance(x, torch.Tensor) else x, result)
        return {"output": flt.keep_op(out) if flt.keep_op is not None else out}

    return (None, None, record)


# ---------------------------------------------------------------- reading

def _error(path: str, offset: int, message: str):
    from .trace import TraceFileError

    return TraceFileError(path, offset, message)


def _int(v, what: str, lo: int = 0) -> int:
    if type(v) is not int or v < lo:
        raise ValueError(f"{what} is not an integer >= {lo}: {v!r}")
    return v


def _str(v, what: str) -> str:
    if type(v) is not str:
        raise ValueError(f"{what} is not a string")
    return v


class Values:
    """A values file read back: ``values(N)`` -> {argument: tensor}."""

    def __init__(self, data, path: str, partial: bool = False) -> None:
        self.path = path
        self._data = data
        self._tensors: dict[int, dict[str, tuple]] = {}
        self.kernels: dict[int, str] = {}
        self.skipped: dict[int, str] = {}
        self.summary: dict | None = None
        self.truncated_at: int | None = None
        n = len(data)
        if n < _HEADER.size:
            raise _error(path, 0, "not a kdebug values file (too short for its header)")
        magic, version, _ = _HEADER.unpack_from(data, 0)
        if magic != MAGIC:
            raise _error(path, 0, "not a kdebug values file (bad magic)")
        if version != VERSION:
            raise _error(path, 8, f"values file version {version}; this kdebug reads version {VERSION}")
        at = _HEADER.size
        while at < n:
            try:
                at = self._entry(at, n)
            except _Truncated as e:
                if not partial:
                    raise _error(path, at, f"truncated entry ({e}): the recording process died while writing; "
                                 f"kdebug.values.open(path, partial=True) reads the entries before byte {at}") from None
                self.truncated_at = at
                break
            except ValueError as e:
                raise _error(path, at, f"corrupt entry: {e}") from None

    def _entry(self, at: int, n: int) -> int:
        if at + _ENTRY.size > n:
            raise _Truncated("entry header")
        tag, jlen = _ENTRY.unpack_from(self._data, at)
        if tag != ENTRY:
            raise ValueError("bad entry tag")
        if jlen > _MAX_JSON:
            raise ValueError(f"entry description of {jlen} bytes (at most {_MAX_JSON})")
        start = at + _ENTRY.size
        if start + jlen > n:
            raise _Truncated("entry description")
        try:
            head = json.loads(bytes(self._data[start:start + jlen]).decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
            raise ValueError(f"entry description is not JSON ({e})") from None
        if not isinstance(head, dict):
            raise ValueError("entry description is not an object")
        end = start + jlen
        kind = head.get("k")
        if kind == "summary":  # one per record_outputs context that wrote here: summed
            summary = self.summary or {}
            for k, v in head.items():
                if k != "k":
                    summary[k] = summary.get(k, 0) + _int(v, f"summary {k!r}")
            self.summary = summary
            return end
        launch = _int(head.get("launch"), "launch")
        kernel = _str(head.get("kernel"), "kernel")
        if self.kernels.setdefault(launch, kernel) != kernel:
            raise ValueError(f"launch {launch} is of two kernels")
        if kind == "skipped":
            self.skipped[launch] = _str(head.get("reason"), "reason")
            return end
        if kind != "tensor":
            raise ValueError(f"unknown entry kind {kind!r}")
        arg = _str(head.get("arg"), "arg")
        dtype = _DTYPES.get(_str(head.get("dtype"), "dtype"))
        if dtype is None:
            raise ValueError(f"unknown dtype {head.get('dtype')!r}")
        shape = head.get("shape")
        if not isinstance(shape, list) or len(shape) > _MAX_NDIM:
            raise ValueError("shape is not a list of at most 64 sizes")
        shape = [_int(s, "a size") for s in shape]
        nbytes = _int(head.get("nbytes"), "nbytes")
        numel = 1
        for s in shape:
            numel *= s
        if numel * dtype.itemsize != nbytes:
            raise ValueError(f"nbytes {nbytes} is not the size of a {dtype} tensor of shape {shape}")
        crc = _int(head.get("crc32"), "crc32")
        if end + nbytes > n:
            raise _Truncated(f"{nbytes} bytes of {arg!r} of launch {launch}")
        args = self._tensors.setdefault(launch, {})
        if arg in args:
            raise ValueError(f"argument {arg!r} of launch {launch} appears twice")
        args[arg] = (end, dtype, shape, nbytes, crc)
        return end + nbytes

    def launches(self) -> list[int]:
        """The launch indices with recorded outputs."""
        return sorted(self._tensors)

    def values(self, n: int) -> dict[str, torch.Tensor] | None:
        """{argument name: tensor} of what launch n wrote; None when launch n
        was not recorded (the filter left it out); ValuesNotRecorded when it
        matched but its outputs were dropped (the byte budget)."""
        if n in self.skipped:
            raise ValuesNotRecorded(f"{self.path}: launch {n} ({self.kernels[n]}) matched the record_outputs "
                                    f"filter but its outputs were not recorded ({self.skipped[n]}: raise "
                                    "DebugMode.record_outputs(max_bytes=...))")
        args = self._tensors.get(n)
        if args is None:
            return None
        return {arg: self._read(n, arg, entry) for arg, entry in args.items()}

    def value(self, n: int, arg: str) -> torch.Tensor:
        """One recorded tensor: argument ``arg`` of launch n (read alone, so
        a caller comparing buffer by buffer holds one at a time); KeyError
        when the file has none."""
        entry = self._tensors.get(n, {}).get(arg)
        if entry is None:
            raise KeyError(f"{self.path}: no recorded value of {arg!r} of launch {n}")
        return self._read(n, arg, entry)

    def _read(self, n: int, arg: str, entry: tuple) -> torch.Tensor:
        off, dtype, shape, nbytes, crc = entry
        raw = bytes(self._data[off:off + nbytes])
        if zlib.crc32(raw) != crc:
            raise _error(self.path, off, f"the bytes of {arg!r} of launch {n} do not match their crc32")
        try:
            if nbytes == 0:
                return torch.empty(shape, dtype=dtype)
            return torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(dtype).reshape(shape)
        except (RuntimeError, TypeError, ValueError) as e:
            raise _error(self.path, off, f"cannot rebuild {arg!r} of launch {n} ({e})") from None

    def problems(self) -> list[str]:
        out = []
        if self.truncated_at is not None:
            out.append(f"{self.path}: entries from byte {self.truncated_at} on are incomplete "
                       "(the recording process died while writing)")
        elif self.summary is None:
            out.append(f"{self.path}: no summary: the recording did not finish")
        if self.skipped:
            out.append(f"{self.path}: {len(self.skipped)} matching launch(es) lost their outputs (byte budget)")
        if self.summary and self.summary.get("launches_not_written"):
            out.append(f"{self.path}: {self.summary['launches_not_written']} launch(es) were not written "
                       "(a write failed)")
        return out


class _Truncated(Exception):
    pass


def open(path, *, partial: bool = False) -> Values:  # noqa: A001 - kdebug.values.open
    """Reads a values file (or <directory>/kdebug.values); a foreign, newer,
    corrupt or truncated one raises TraceFileError naming the byte offset."""
    path = os.fspath(path)
    if os.path.isdir(path):
        path = os.path.join(path, FILE_NAME)
    try:
        with builtins.open(path, "rb") as f:
            try:
                data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            except (ValueError, OSError):
                data = f.read()
    except OSError as e:
        raise _error(path, 0, f"cannot read: {e.strerror}") from None
    return Values(data, path, partial)


def for_run(run, n: int, path: str | None = None) -> dict[str, torch.Tensor] | None:
    """Run.values(n): launch n's recorded outputs from the values file next to
    the trace (<trace>.values) or ``path``, checked against the trace's
    launch n (same kernel)."""
    if path is None:
        path = run.path + ".values"
        if not os.path.exists(path):
            raise FileNotFoundError(f"{path}: no values file next to the trace; record outputs to it with "
                                    "DebugMode.record_outputs(filter=..., to=debug_mode)")
    v = open(path)
    kernel = v.kernels.get(n)
    if kernel is not None:
        names = [k.kernel_name for k in run.kernels if k.launch_index == n]
        if names and names[0] != kernel:
            raise _error(v.path, 0, f"launch {n} is {kernel} in the values file but {names[0]} in the trace "
                                    f"{run.path}: the files are of different runs")
    return v.values(n)
