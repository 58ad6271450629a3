"""Trace files (.kdt): save a recorded run, stream it while the program runs,
load it back in another process.

The format (docs/trace-format.md, Note [Trace format] in csrc/core/kd_trace.h) is
written and read by the C core: kernel launches are encoded straight from the
recorder's store, aten ops as their rendered text plus their hash trees.  One
record per entry of ``debug_mode.operators``, in that order.

    debug_mode.save("run.kdt")            # after the run
    DebugMode(trace="run.kdt")            # streamed while it runs
    run = kdebug.load("run.kdt")          # a Run: operators, debug_string(), ...
"""
from __future__ import annotations

import json
import mmap
import os
import stat
import sys
import time
import warnings
from typing import Any

import torch

from . import _C, _files, _termtext, _upstream, hashing, kernel_code, provenance
from .calls import _KernelCall, make_call

TraceError = _C.TraceError
_FLAG_IN, _FLAG_OUT, _FLAG_OPCALL, _FLAG_EXTENTS = 1, 2, 4, 8  # KD_OPF_* (kd_trace.h)
REC_LAUNCH, REC_OP = 1, 2


class TraceFileError(ValueError):
    """A trace file kdebug cannot read: says which file, at which byte, and why."""

    def __init__(self, path: str, offset: int, message: str):
        self.path, self.offset, self.message = path, offset, message
        super().__init__(f"{path}: byte {offset}: {message}. "
                         "Record the run again (kdebug record -o FILE -- python script.py).")


def _specs_meta() -> dict:
    specs = {}
    for i in range(1, len(hashing._specs)):
        s = hashing._specs[i]
        specs[str(i)] = {"names": s.names, "single": s.single, "custom": s.fn is not None}
    return {"hash_specs": specs}


def _meta_base() -> dict:
    from . import __version__

    return {"kdebug": __version__, "torch": torch.__version__, "python": sys.version.split()[0],
            "argv": list(sys.argv), "pid": os.getpid(), "time": time.time(), "settings": numeric_settings(),
            **_specs_meta()}


# Note [Settings that change the numbers]
# Some of torch's process-wide settings change which kernels run or how
# they sum: the CPU thread count (an eager sum or matmul splits its
# reduction by threads), deterministic algorithms, cuDNN's determinism and
# benchmarking, TF32, the float32 matmul precision, Inductor's deterministic
# mode.  Two runs with different settings compute different bits for good
# reasons; a hunt of runs whose thread counts differed called an eager
# aten::sum non-deterministic.  A trace records them when the recording
# starts (META "settings"), and a comparison names those that differ
# (SETTINGS lines) and says a root may come from them; and when it ends
# (META "settings_end": a script sets its thread count after kdebug record
# began recording it).
_SETTINGS_KEYS = ("num_threads", "deterministic_algorithms", "cudnn_deterministic", "cudnn_benchmark",
                  "matmul_allow_tf32", "cudnn_allow_tf32", "float32_matmul_precision", "inductor_deterministic")


def numeric_settings() -> dict:
    """Note [Settings that change the numbers]: their values in this process."""
    out = {"num_threads": torch.get_num_threads(),
           "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
           "cudnn_deterministic": bool(torch.backends.cudnn.deterministic),
           "cudnn_benchmark": bool(torch.backends.cudnn.benchmark),
           "matmul_allow_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
           "cudnn_allow_tf32": bool(torch.backends.cudnn.allow_tf32),
           "float32_matmul_precision": str(torch.get_float32_matmul_precision())}
    import torch._inductor.config as inductor_config

    det = getattr(inductor_config, "deterministic", None)
    if isinstance(det, bool):
        out["inductor_deterministic"] = det
    return out


def _settings(v, key):
    if not isinstance(v, dict):
        raise _Bad(f"META key {key!r} must be an object, not {_show(v)}")
    out = {}
    for k, x in v.items():
        if k not in _SETTINGS_KEYS:
            continue  # (a newer kdebug's: not read)
        if not (type(x) in (bool, int) or (isinstance(x, str) and len(x) <= 64)) or (type(x) is int and not
                                                                                       0 <= x < _COUNT_MAX):
            raise _Bad(f"META key {key}.{k} must be a count, true / false or a short string, not {_show(x)}")
        out[k] = x
    return out


def lost_launches(st: dict) -> list[str]:
    """What a recording's counters (kernel_stats, a trace's META stats) say it
    did not record, a line each: Run.problems and a live comparison's gaps
    (compare._Side.gaps) say it in the same words."""
    out = []
    if st.get("dropped"):
        out.append(f"{st['dropped']} launch record(s) were dropped while recording (ring full)")
    if st.get("unrecorded"):
        out.append(f"{st['unrecorded']} launch(es) were not recorded (hook errors)")
    for reason, n in (st.get("bypassed_graph_calls") or {}).items():
        out.append(f"{n} graph call(s) through {reason} were not recorded")
    if st.get("other_thread_launches"):
        out.append(f"{st['other_thread_launches']} compiled launch(es) ran on threads the recording did not follow "
                   "(record_all_threads=True records them)")
    if st.get("nested_unrecorded"):
        out.append(f"{st['nested_unrecorded']} launch(es) were recorded only by a nested DebugMode (a kdebug "
                   "recording the program entered itself: a FlightRecorder, a DebugMode, assert_deterministic), "
                   "not in this trace")
    return out


def stored_text(s: str) -> str:
    """An op's name or text as a trace stores it: a NUL (a str argument
    rendered with str(), as upstream does) becomes the two characters \\0,
    as in tensor names (csrc/kd_state_record.c): the string table takes
    none; a lone surrogate, which UTF-8 cannot hold, its \\udXXX escape.
    Live compares digest and show this same text."""
    if "\0" in s:
        s = s.replace("\0", "\\0")
    if not s.isascii():
        try:
            s.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate (a str attribute, say): not UTF-8, so written escaped
            s = s.encode("utf-8", "backslashreplace").decode("utf-8")
    return s


def _op_record(op, attributes) -> dict[str, Any]:
    """TraceWriter.op's keyword arguments for a non-kernel entry (the fields of a _C.TraceOp)."""
    log = getattr(op, "log", None)
    saved = log
    try:
        op.log = None
        text = op.render(attributes)
    finally:
        op.log = saved
    log = log or {}
    flags = _FLAG_OPCALL if isinstance(op, _upstream._OpCall) else 0
    if "input_hash" in log:
        flags |= _FLAG_IN
    if "hash" in log:
        flags |= _FLAG_OUT
    extents = getattr(op, "_kd_extents", None)
    if extents is not None:
        flags |= _FLAG_EXTENTS
    name = stored_text(_upstream.get_call_name(op))
    text = stored_text(text)
    return dict(depth=op.call_depth, flags=flags, name=name, text=text, input_hashes=log.get("input_hash"),
                output_hashes=log.get("hash"), extents=extents)


def _create(path: str):
    """Opens a new trace file for writing (Note [Safe writes] in _files.py): an
    existing regular file is unlinked first, not truncated -- a kdebug.Run
    loaded from it maps it (load()), and truncating or rewriting a mapped file
    would make that Run read garbage or kill the process with SIGBUS; the old
    Run keeps reading the old, unlinked file.  A path that is a symbolic link
    is refused (LinkRefused): writing through it would truncate the file it
    points to in place."""
    return _files.create_replacing(path)


class Writer:
    """Encodes operators entries with the C writer and writes whole chunks."""

    def __init__(self, path: str | None = None, meta: dict | None = None):
        self._w = _C.TraceWriter()
        self._f = _create(path) if path is not None else None
        self._chunks: list[bytes] = []
        self.path = path
        # where it was created, whatever the working directory later (Note [A trace another writer replaced])
        self._abspath = os.path.abspath(path) if path is not None else None
        self.custom_skipped = 0
        self._refused_warned = 0
        self._nspecs = len(hashing._specs)
        self._w.meta(json.dumps(meta if meta is not None else _meta_base()))
        self._flush_out()

    def write(self, items, attributes, recorder) -> None:
        if len(hashing._specs) != self._nspecs:  # log_tensor_hashes() specs made since: before their records
            self._nspecs = len(hashing._specs)
            self._w.meta(json.dumps(_specs_meta()))
        run_start = run_stop = None
        custom_launches: set[int] = set()  # kernels whose custom hash values are not written
        for op in items:
            if isinstance(op, _KernelCall):
                if op._recorder is not recorder:
                    raise ValueError("a kernel record from another recorder")
                if recorder.custom:
                    custom_launches.add(op.launch_index)
                i = op._launch.store_index
                if run_stop is not None and i == run_stop:  # extends the run of stored launches
                    run_stop += 1
                    continue
                if run_start is not None:
                    self._w.launches(recorder, run_start, run_stop)
                run_start, run_stop = i, i + 1
                continue
            if run_start is not None:
                self._w.launches(recorder, run_start, run_stop)
                run_start = run_stop = None
            self._w.op(**_op_record(op, attributes))
        if run_start is not None:
            self._w.launches(recorder, run_start, run_stop)
        if custom_launches:
            self.custom_skipped += sum(1 for k in recorder.custom if k[0] in custom_launches)
        self._w.seal()
        self._flush_out()
        refused = self._w.stats()["refused_strings"]
        if refused > self._refused_warned:
            from .inductor import KdebugWarning

            self._refused_warned = refused
            warnings.warn(f"kdebug: the string table of trace {self.path or '(in memory)'} is full (16M distinct "
                          f"texts): {refused} op name(s) / text(s) are written as {_C.NOT_STORED_TEXT!r}, their "
                          "records kept. Record shorter runs per trace file.", KdebugWarning, stacklevel=3)

    def launches(self, recorder, start: int, stop: int) -> None:
        """Stored launches [start, stop) of a recorder's table, as launch records."""
        self._w.launches(recorder, start, stop)

    def marker(self, name: str, text: str) -> None:
        """A record that is no aten op and holds no hashes: only its text
        (the flight recorder's step boundaries)."""
        self._w.op(depth=0, flags=0, name=name, text=text, input_hashes=None, output_hashes=None)

    def seal(self) -> None:
        self._w.seal()
        self._flush_out()

    def meta(self, d: dict) -> None:
        self._w.meta(json.dumps(d, default=str))
        self._flush_out()

    def _flush_out(self) -> None:
        b = self._w.take()
        if not b:
            return
        if self._f is None:
            self._chunks.append(b)
        else:
            self._f.write(b)
            self._f.flush()

    def close(self, end: bool = True) -> None:
        if end:
            self._w.end()
        self._flush_out()
        if self._f is not None:
            self._rescue_if_replaced()
            self._f.close()
            self._f = None

    # Note [A trace another writer replaced]
    # Two processes recording to one path (two `kdebug record -o run.kdt`, ranks
    # of a job that all pass the same trace=, a script started twice) each
    # create the file anew (Note [Safe writes]): the later one unlinks the
    # earlier's file, and the earlier went on writing into a file no name
    # reached, its whole recording lost without a word (an adversarial review:
    # three writers, the last one's records only).  At the end each writer checks
    # whether its file still has a name (its link count: a file renamed, or in a
    # directory renamed, still has one; comparing the path, relative to a working
    # directory the program may have changed, called those replaced); if not
    # (unlinked: replaced, or removed), it copies what it wrote (still readable
    # through its open descriptor) to a path of its own beside where it was
    # created, `run.pid<PID>.kdt`, and warns with both paths.
    rescued: str | None = None

    def _rescue_if_replaced(self) -> None:
        from .inductor import KdebugWarning

        try:
            mine = os.fstat(self._f.fileno())
            if mine.st_nlink > 0:  # still named somewhere: moved or renamed (its directory too), never lost
                return
            stem, ext = os.path.splitext(self._abspath)
            for k in range(100):
                alt = f"{stem}.pid{os.getpid()}{'' if k == 0 else f'.{k}'}{ext or '.kdt'}"
                if not os.path.lexists(alt):
                    break
            with open(f"/proc/self/fd/{self._f.fileno()}", "rb") as src, _files.create_replacing(alt) as dst:
                while True:
                    b = src.read(1 << 20)
                    if not b:
                        break
                    dst.write(b)
            self.rescued = alt
            warnings.warn(f"kdebug: {self.path} was replaced (another writer) or removed while this process (pid "
                          f"{os.getpid()}) recorded into it; this recording is saved as {alt} instead. Give each "
                          "process a trace path of its own.", KdebugWarning, stacklevel=4)
        except OSError as e:  # no /proc, a full disk: at least say it
            warnings.warn(f"kdebug: {self.path} was replaced (another writer) or removed while this process (pid "
                          f"{os.getpid()}) recorded into it, and its recording could not be saved elsewhere ({e}): "
                          "it is lost. Give each process a trace path of its own.", KdebugWarning, stacklevel=4)

    def reopen(self) -> None:
        """Appends to the file again (a DebugMode entered a second time): the
        strings already written stay defined."""
        if self._f is None and self.path is not None:
            self._f = _files.open_append(self.path)

    def getvalue(self) -> bytes:
        return b"".join(self._chunks)

    def stats(self) -> dict:
        return self._w.stats()


def provenance_meta(names) -> dict:
    """META kernel_provenance / kernel_code / kernel_code_dropped for these
    kernel names (Note [Kernel provenance], Note [Kernel code])."""
    meta: dict = {}
    prov = provenance.meta_for(sorted(names))
    if prov:
        meta["kernel_provenance"] = prov
        code, left = kernel_code.meta_for(e["code_sha256"] for es in prov.values() for e in es if e["code_sha256"])
        if code:
            meta["kernel_code"] = code
        if left:
            meta["kernel_code_dropped"] = left
    return meta


def _final_meta(dm) -> dict:
    s = dm.kernel_stats
    keep = ("launches", "dropped", "errors", "unrecorded", "suppressed", "complete", "bypassed_graph_calls",
            "outputs_skipped", "readonly_changed", "hash_unsupported", "nested_unrecorded", "other_thread_launches")
    meta = {"stats": {k: s[k] for k in keep if k in s}, "settings_end": numeric_settings()}
    from . import collectives, ranks

    meta["stats"].update(collectives.stats(dm))  # Note [Collective records]
    st = getattr(dm, "_collectives", None)
    layout = ranks.meta()  # Note [Ranks]; the groups seen at the first collective when they are gone now
    meta.update({**(st.layout or {}), **layout} if st is not None and "groups" not in layout else layout)
    if dm.final_state is not None:
        meta["final_state"] = dm.final_state  # Note [Final state]
    names = {op.kernel_name for op in dm.operators if isinstance(op, _KernelCall)}
    meta.update(provenance_meta(names))  # once per kernel; each distinct source once, by its sha256
    return meta


def _finish(w: Writer, dm) -> None:
    """The last META (the recorder's counters, custom hash values left out) and END."""
    meta = _final_meta(dm)
    if w.custom_skipped:
        meta["custom_hashes_not_saved"] = w.custom_skipped
        warnings.warn(f"{w.custom_skipped} hash value(s) of a custom hash_fn are not saved in traces "
                      "(only 'bitwise', 'norm' and 'hash_tensor' are)", stacklevel=4)
    w.meta(meta)
    w.close()


def save(dm, path: str | None) -> bytes | dict:
    """Writes a DebugMode's whole run to ``path`` (or returns the bytes when path is None)."""
    w = Writer(path)
    w.write(dm.operators, dm.record_tensor_attributes, dm._recorder)
    _finish(w, dm)
    return w.getvalue() if path is None else w.stats()


class Stream:
    """DebugMode(trace=path): the run written as it is recorded.  Each time the
    mode's records are read, at most every ``interval`` seconds while aten ops
    run, and when the mode exits, the new operators entries are appended as
    whole chunks; a process that dies leaves every chunk written before."""

    def __init__(self, dm, path: str, interval: float = 1.0):
        self.dm = dm
        self.w = Writer(path)
        self.written = 0
        self.interval = interval
        self.last = time.monotonic()
        self.closed = False
        self.failed: BaseException | None = None  # streaming stopped on this error (_fail)
        self.pid = os.getpid()  # Note [Forked children]

    # Note [Forked children]
    # A process forked while a recording runs (DataLoader workers, a
    # multiprocessing pool, torch.multiprocessing) inherits the mode, its
    # records and this stream's open file: its own aten ops (a dataset's
    # __getitem__) went on being streamed into the parent's trace, through the
    # shared descriptor, and the hunt refused the corrupt file ("END chunk's
    # record count differs"; found by a trust pass on a training script with
    # DataLoader(num_workers=2)).  Only the process that opened the stream
    # writes it; a child's records stay in its memory and die with it.
    def _ours(self) -> bool:
        return os.getpid() == self.pid

    def reopen(self) -> None:
        if self.closed and self.failed is None:  # a failed stream stays stopped (said once)
            self.w.reopen()
            self.closed = False

    def due(self) -> bool:
        return self._ours() and time.monotonic() - self.last >= self.interval

    def write_new(self, final: bool = False) -> None:
        if not self._ours():
            return
        try:
            self._write_new(final)
        except Exception as e:  # noqa: BLE001 (a full disk, a bad record: never the program's problem)
            self._fail(e)

    def _fail(self, e: BaseException) -> None:
        """Streaming stops (the records stay in the recording) and says so once."""
        from .inductor import KdebugWarning

        self.closed = True
        self.failed = e
        try:
            if self.w._f is not None:
                self.w._f.close()
                self.w._f = None
        except OSError:
            pass
        warnings.warn(f"kdebug: streaming the trace to {self.w.path} failed ({e!r}); it stopped there and the "
                      "file ends without its END chunk (kdebug.load reads its complete chunks). The records stay "
                      "in this recording: dm.save(another_path) writes them all.", KdebugWarning, stacklevel=3)

    def _write_new(self, final: bool) -> None:
        self.dm._flush()  # drain the ring, resolve GPU hashes, merge kernels into operators
        ops = self.dm.operators
        n = list.__len__(ops)
        if n > self.written:
            from . import collectives

            items = list.__getitem__(ops, slice(self.written, n))
            if final:
                collectives.settle(self.dm)
            else:  # Note [Collective records]: up to the first collective still in flight
                k = collectives.first_pending(self.dm, items)
                if k is not None:
                    items = items[:k]
            collectives.resolve(items)
            self.w.write(items, self.dm.record_tensor_attributes, self.dm._recorder)
            self.written += len(items)
        self.last = time.monotonic()

    def close(self) -> None:
        if self.closed or not self._ours():
            return
        self.write_new(final=True)  # collectives still in flight: written without their output hash
        if self.closed:  # the write failed (said)
            return
        try:
            _finish(self.w, self.dm)
        except Exception as e:  # noqa: BLE001
            self._fail(e)
            return
        self.closed = True


# ---------------------------------------------------------------- reading


class _OpCall(_upstream._OpCall):
    """An aten op (or other non-kernel entry) read from a trace: its text and
    hashes.  Named like upstream's class: DebugMode.check_hash_mismatches
    matches calls by type name."""

    def __init__(self, depth: int, name: str, text: str, log: dict | None, is_op: bool):
        self.call_depth = depth
        self.op = _resolve_op(name) if is_op else name
        self._name = name
        self._text = text
        self.log = log
        self.args_str = self.kwargs_str = ""
        self.output_str = None
        self.record = None
        self.stack_trace = self.fwd_stack_trace = None

    def render(self, attributes) -> str:
        return self._text + (f"  # {self.log}" if self.log else "")

    def __repr__(self) -> str:
        return self._text


_ops_by_name: dict[str, Any] = {}
_names_set = False


def _resolve_op(name: str):
    """torch.ops.aten.add.Tensor for 'aten::add.Tensor' when it exists, else the name."""
    op = _ops_by_name.get(name)
    if op is None:
        op = name
        ns, _, rest = name.partition("::") if "::" in name else name.partition(".")
        base, _, overload = rest.partition(".")
        try:
            packet = getattr(getattr(torch.ops, ns), base)
            op = getattr(packet, overload or "default")
        except (AttributeError, RuntimeError):
            pass
        _ops_by_name[name] = op
    return op


# ---------------------------------------------------------------- META

# Note [META schema]
# A META chunk is a JSON object whose bytes the reader checked (CRC), but whose
# values are whatever the file says: a crafted or damaged file may hold a list,
# null, a string where a count belongs, or JSON nested thousands deep.  Every
# key kdebug reads is checked here, once, when the trace is opened: its type
# and its range.  A value that does not fit makes the whole file unreadable
# (TraceFileError naming the META chunk's byte offset), so nothing after it --
# show, diff, export, the HTML report -- ever meets an unexpected type.  Keys
# kdebug does not know are dropped: to read a new key, add it here first.

_COUNT_MAX = 2 ** 63
_MAX_ENTRIES = 4096  # hash_specs / bypassed_graph_calls entries: far more than any run makes


class _Bad(ValueError):
    pass


def _show(v) -> str:
    r = repr(v)
    return f"{type(v).__name__} {r[:40] + '...' if len(r) > 40 else r}"


def _count(v, key):
    if type(v) is not int or not 0 <= v < _COUNT_MAX:
        raise _Bad(f"META key {key!r} must be a count (an integer from 0 to 2**63-1), not {_show(v)}")
    return v


def _flag(v, key):
    if type(v) is not bool:
        raise _Bad(f"META key {key!r} must be true or false, not {_show(v)}")
    return v


def _text(v, key):
    if not isinstance(v, str):
        raise _Bad(f"META key {key!r} must be a string, not {_show(v)}")
    return v


def _texts(v, key):
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise _Bad(f"META key {key!r} must be a list of strings, not {_show(v)}")
    return v


def _seconds(v, key):
    if type(v) not in (int, float) or not 0 <= v < 1e12:  # also refuses NaN and infinities
        raise _Bad(f"META key {key!r} must be a time in seconds since 1970, not {_show(v)}")
    return v


def _object(v, key, size: int = _MAX_ENTRIES) -> dict:
    if not isinstance(v, dict):
        raise _Bad(f"META key {key!r} must be an object, not {_show(v)}")
    if len(v) > size:
        raise _Bad(f"META key {key!r} has {len(v)} entries, more than the {size} kdebug reads")
    return v


def _hash_specs(v, key):
    out = {}
    for k, spec in _object(v, key).items():
        where = f"{key}.{k}"
        if not (k.isascii() and k.isdigit() and 0 < int(k) < 65535):
            raise _Bad(f"META key {where!r}: a hash spec id is an integer from 1 to 65534")
        spec = _object(spec, where)
        custom = _flag(spec.get("custom", False), where + ".custom")
        single = _flag(spec.get("single", False), where + ".single")
        names = spec.get("names")
        if custom:  # a callable: its values are not saved, its names not read
            out[k] = {"names": None, "single": single, "custom": True}
            continue
        if (not isinstance(names, list) or not 0 < len(names) <= 16
                or not all(isinstance(n, str) and n in hashing.KINDS for n in names)):
            raise _Bad(f"META key {where + '.names'!r} must list 1 to 16 of the hashes "
                       f"{', '.join(hashing.KINDS)}, not {_show(names)}")
        out[k] = {"names": names, "single": single, "custom": custom}
    return out


def _stats(v, key):
    v = _object(v, key)
    out = {}
    for k, x in v.items():
        check = _STATS.get(k)
        if check is not None:
            out[k] = check(x, f"{key}.{k}")
    return out


def _bypassed(v, key):
    return {_text(k, key): _count(n, f"{key}.{k}") for k, n in _object(v, key).items()}


_STATS = {"launches": _count, "dropped": _count, "errors": _count, "unrecorded": _count, "suppressed": _count,
          "outputs_skipped": _count, "readonly_changed": _count, "hash_unsupported": _count,
          "nested_unrecorded": _count, "other_thread_launches": _count, "collectives": _count, "collectives_incomplete": _count,
          "collectives_failed": _count, "collectives_unhashed": _count, "collectives_overwritten": _count,
          "complete": _flag, "bypassed_graph_calls": _bypassed}

def _final_state(v, key):
    """Note [Final state]: {"ranges": [[device type, index, lo, hi], ...],
    "tensors": n, "skipped": n}; the ranges' order and overlap are checked
    where they are used (final_state.FinalState.from_meta)."""
    v = _object(v, key)
    ranges = v.get("ranges")
    if not isinstance(ranges, list) or len(ranges) > _MAX_RANGES:
        raise _Bad(f"META key {key + '.ranges'!r} must be a list of at most {_MAX_RANGES} byte ranges, "
                   f"not {_show(ranges)}")
    for r in ranges:
        if not (isinstance(r, list) and len(r) == 4 and isinstance(r[0], str) and len(r[0]) <= 32
                and type(r[1]) is int and -1 <= r[1] < 1 << 16
                and all(type(x) is int and 0 <= x < 1 << 64 for x in r[2:]) and r[2] <= r[3]):
            raise _Bad(f"META key {key + '.ranges'!r}: each range is [device type, index, lo, hi] "
                       f"with lo <= hi, not {_show(r)}")
    return {"ranges": ranges, "tensors": _count(v.get("tensors", 0), key + ".tensors"),
            "skipped": _count(v.get("skipped", 0), key + ".skipped")}


_MAX_RANGES = 1 << 22
_MAX_RANKS = 1 << 20


def _rank(v, key):
    if type(v) is not int or not 0 <= v < _MAX_RANKS:
        raise _Bad(f"META key {key!r} must be a rank (an integer from 0 to {_MAX_RANKS - 1}), not {_show(v)}")
    return v


def _world(v, key):
    if type(v) is not int or not 0 < v <= _MAX_RANKS:
        raise _Bad(f"META key {key!r} must be a world size (an integer from 1 to {_MAX_RANKS}), not {_show(v)}")
    return v


def _groups(v, key):
    """Note [Ranks]: [{"name": str, "ranks": [rank, ...], "backend": str}, ...]."""
    if not isinstance(v, list) or len(v) > _MAX_ENTRIES:
        raise _Bad(f"META key {key!r} must be a list of at most {_MAX_ENTRIES} process groups, not {_show(v)}")
    out = []
    for i, g in enumerate(v):
        where = f"{key}[{i}]"
        g = _object(g, where)
        ranks = g.get("ranks")
        if not isinstance(ranks, list) or len(ranks) > _MAX_RANKS:
            raise _Bad(f"META key {where + '.ranks'!r} must be a list of ranks, not {_show(ranks)}")
        out.append({"name": _text(g.get("name", ""), where + ".name")[:256],
                    "ranks": [_rank(r, where + ".ranks") for r in ranks],
                    "backend": _text(g.get("backend", "?"), where + ".backend")[:64]})
    return out


META_SCHEMA = {"kdebug": _text, "torch": _text, "python": _text, "argv": _texts, "pid": _count,
               "time": _seconds, "hash_specs": _hash_specs, "stats": _stats, "custom_hashes_not_saved": _count,
               "final_state": _final_state, "rank": _rank, "world_size": _world, "groups": _groups,
               "kernel_provenance": lambda v, key: provenance.check_meta(v, key, _Bad),
               "kernel_code": lambda v, key: kernel_code.check_meta(v, key, _Bad), "kernel_code_dropped": _count,
               "flight": lambda v, key: _flight_meta(v, key), "settings": lambda v, key: _settings(v, key),
               "settings_end": lambda v, key: _settings(v, key)}


def _flight_meta(v, key):
    from . import flight  # Note [Flight recorder]

    return flight.check_meta(v, key, _Bad)


def _refuse_constant(name: str):
    raise _Bad(f"{name} is not a JSON number")


def check_meta(text: str) -> dict:
    """The keys kdebug reads from one META chunk's JSON text, each checked
    (Note [META schema]); raises ValueError saying what is wrong."""
    try:
        d = json.loads(text, parse_constant=_refuse_constant)
    except RecursionError:
        raise _Bad("META is JSON nested too deeply") from None
    except _Bad:
        raise
    except ValueError as e:
        raise _Bad(f"META is not valid JSON ({e})") from None
    if not isinstance(d, dict):
        raise _Bad(f"META must be a JSON object, not {_show(d)}")
    return {k: check(d[k], k) for k, check in META_SCHEMA.items() if k in d}


def _entry(op) -> str:
    """One operators entry of the debug string, indented by its call depth;
    on the command line each of its lines escaped by itself (Note
    [Terminal-safe text]: a name or a custom op's string argument cannot
    start a line of its own)."""
    indent = "  " + "  " * op.call_depth
    if not _termtext.terminal.get():
        return indent + op.render(None)
    if isinstance(op, _KernelCall):
        return indent + ("\n" + indent).join(map(_termtext.escape, op.render_lines(None))) + "\n"
    return indent + _termtext.escape(op.render(None))


class Run:
    """A recorded run read from a trace file: the parts of a DebugMode that
    reading needs (``operators``, ``logs``, ``kernels``, ``debug_string()``)."""

    record_tensor_attributes = None

    def __init__(self, data: bytes, path: str = "<bytes>"):
        self.path = path
        self._data = data
        try:
            self._reader = _C.TraceReader(data)
        except TraceError as e:
            raise TraceFileError(path, e.offset, e.message) from None
        info = self._reader.info()
        self.info = info
        self.meta: dict = {}  # Note [META schema]: only checked keys
        for m, at in zip(info["meta"], info["meta_offsets"]):
            try:
                self.meta.update(check_meta(m))
            except _Bad as e:
                raise TraceFileError(path, at, f"corrupt META chunk: {e}") from None
        self.types = self._reader.types()
        self._spec_map = {}
        for k, v in self.meta.get("hash_specs", {}).items():
            names = tuple(v["names"] or ())
            if names and not v["custom"]:  # this process's id for the same names (made once)
                self._spec_map[int(k)] = hashing.parse(names[0] if v.get("single") else list(names))[0]
        global _names_set
        if not _names_set:  # kernel lines render dtypes by name (set once per process)
            _C._set_dtype_names(dict(_upstream.dtype_abbrs))
            _names_set = True
        self._rec = _C.LaunchTable()  # its launches, decoded on first use (Note [Launch table])
        self._store_of: dict[int, int] = {}
        self._calls: dict[int, Any] = {}
        self._ops = None

    def __len__(self) -> int:
        return len(self.types)

    @property
    def complete(self) -> bool:
        """The recording finished (END chunk) and every launch was recorded."""
        st = self.meta.get("stats", {})
        return bool(self.info["complete"]) and st.get("complete", True)

    def problems(self) -> list[str]:
        out = []
        if self.info["ignored_bytes"]:
            out.append(f"{self.path}: the last {self.info['ignored_bytes']} byte(s) are an incomplete chunk "
                       f"(the recording process died while writing); read the {len(self)} complete records "
                       f"before byte {self.info['valid_bytes']}")
        elif not self.info["complete"]:
            out.append(f"{self.path}: the recording did not finish (no END chunk): the process died or "
                       "is still running; its records up to here are read")
        st = self.meta.get("stats", {})
        out += [f"{self.path}: {line}" for line in lost_launches(st)]
        if st.get("collectives_incomplete"):
            out.append(f"{self.path}: {st['collectives_incomplete']} collective(s) had not completed when the "
                       "recording ended: their output hashes are missing (Note [Collective records])")
        if st.get("collectives_failed"):
            out.append(f"{self.path}: {st['collectives_failed']} collective(s) failed: no output hash")
        if st.get("collectives_unhashed"):
            out.append(f"{self.path}: {st['collectives_unhashed']} collective(s) returned a Work without a future "
                       "(this backend): their outputs were not hashed")
        if st.get("collectives_overwritten"):
            out.append(f"{self.path}: {st['collectives_overwritten']} collective(s) had their output written "
                       "before kdebug's completion callback could hash it (the program waited on the Work's "
                       "future, as DDP does, and went on): no output hash, not compared "
                       "(Note [Outputs written before their hash])")
        if self.meta.get("kernel_code_dropped"):
            out.append(f"{self.path}: the generated source of {self.meta['kernel_code_dropped']} kernel(s) "
                       "was not kept (over the size limit, or not seen by the recording process)")
        if self.meta.get("custom_hashes_not_saved"):
            out.append(f"{self.path}: {self.meta['custom_hashes_not_saved']} custom hash value(s) were not saved")
        return out

    def provenance(self, kernel_name: str) -> list:
        """The provenance entries (kdebug.provenance.KernelProvenance) the
        trace holds for kernels named ``kernel_name``: one per distinct
        kernel of that name the recording process compiled or loaded
        (Note [Kernel provenance]); [] when the trace has none."""
        return [provenance.from_json(e) for e in self.meta.get("kernel_provenance", {}).get(kernel_name, ())]

    def kernel_code(self, sha256: str) -> str | None:
        """The generated source with this sha256 (a provenance entry's
        code_sha256) as the trace keeps it, or None (Note [Kernel code])."""
        return self.meta.get("kernel_code", {}).get(sha256)

    def values(self, n: int, path: str | None = None):
        """{argument name: tensor} of what launch n wrote, from the values file
        DebugMode.record_outputs(to=...) streamed next to this trace
        (<trace>.values, or ``path``); None when launch n was not recorded
        (Note [Recorded values on disk] in kdebug/values.py)."""
        from . import values

        return values.for_run(self, n, path)

    def _load_range(self, start: int, stop: int) -> None:
        """Decodes the launch records among [start, stop) into the launch table
        (Note [Launch table]), with this process's string and hash spec ids."""
        base = len(self._rec)
        for k, i in enumerate(_C.table_fill(self._rec, self._reader, self._spec_map, start, stop)):
            self._store_of[i] = base + k

    def call(self, i: int):
        """The operators entry of record i, made on first use."""
        c = self._calls.get(i)
        if c is None:
            if self.types[i] == REC_LAUNCH:
                if i not in self._store_of:
                    self._load_range(i, i + 1)
                c = make_call(self._rec.launch(self._store_of[i]), self._rec)
            else:
                op = self._reader.op(i, hashing.norm_value)
                log = {}
                if op.flags & _FLAG_IN:
                    log["input_hash"] = op.input_hashes
                if op.flags & _FLAG_OUT:
                    log["hash"] = op.output_hashes
                c = _OpCall(op.depth, op.name, op.text, log or None, bool(op.flags & _FLAG_OPCALL))
                if op.flags & _FLAG_EXTENTS:
                    c._kd_extents = op.extents
            self._calls[i] = c
        return c

    @property
    def operators(self) -> list:
        if self._ops is None:
            if len(self._store_of) == 0:
                self._load_range(0, len(self))
            self._ops = [self.call(i) for i in range(len(self))]
        return self._ops

    @property
    def logs(self) -> list:
        return list(self.operators)

    @property
    def kernels(self) -> list:
        return [op for op in self.operators if isinstance(op, _KernelCall)]

    def debug_string(self, verbose: bool = False) -> str:
        from .calls import _VERBOSE

        token = _VERBOSE.set(verbose)
        try:
            lines = [_entry(op) for op in self.operators]
        finally:
            _VERBOSE.reset(token)
        head = "".join(f"# kdebug: INCOMPLETE: {_termtext.line(p)}\n" for p in self.problems())
        if verbose:  # Note [Kernel code]: what each kernel is, once per kernel
            more = kernel_code.section((k.kernel_name for k in self.kernels), self.provenance)
            if more:
                lines.append(more)
        return head + "\n".join(lines)

    def table(self, start: int = 0, stop: int | None = None) -> tuple[bytes, bytes, bytes]:
        """Records [start, stop) as fixed-size rows (Note [Trace tables] in
        csrc/core/kd_trace.h): kd_tab_rec rows, kd_tab_arg rows and int64
        tensor sizes, string ids of this file (strings())."""
        return self._reader.table(start, len(self) if stop is None else stop)

    def strings(self) -> list[str]:
        """This file's strings: item k is string id k (0: "")."""
        return self._reader.strings()

    def last_writer(self, before: int, dev_type: int, dev_index: int, lo: int, hi: int,
                    leaf: int) -> tuple[int, int] | None:
        """The last record before ``before`` that wrote memory overlapping
        [lo, hi) on the device (a launch), or whose output hash tree holds a
        leaf with digest ``leaf`` (an op, leaf nonzero): (record index, mask of
        the written arguments), or None."""
        return self._reader.last_writer(before, dev_type, dev_index, lo, hi, leaf)

    def digests(self) -> memoryview:
        """Per record: key, config, shape, pre, post digests (5 x u64): a view
        of the reader's table, not a copy."""
        return self._reader.digests()

    def __repr__(self) -> str:
        return f"<kdebug.Run {self.path}: {len(self)} records, {self.info['tensor_args']} tensor args>"


# A trace read from a pipe (`kdebug show <(zcat run.kdt.gz)`) is read whole into memory: at most this many bytes
_PIPE_READ_MAX = 8 << 30


def _map(path: str):
    """The file's bytes: mapped read-only (no copy: the reader validates and
    decodes it in place), or read when it cannot be mapped (empty, a pipe,
    up to _PIPE_READ_MAX bytes).  A device or a socket is no trace: /dev/zero
    was read until memory ran out, /dev/urandom for ever (an adversarial
    review)."""
    with open(path, "rb") as f:
        st = os.fstat(f.fileno())
        if not (stat.S_ISREG(st.st_mode) or stat.S_ISFIFO(st.st_mode)):
            raise TraceFileError(str(path), 0, "not a regular file (a device or a socket): no trace to read")
        try:
            return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except (ValueError, OSError):
            data = f.read(_PIPE_READ_MAX + 1)
            if len(data) > _PIPE_READ_MAX:
                raise TraceFileError(str(path), _PIPE_READ_MAX, f"more than {_PIPE_READ_MAX >> 30} GiB read from a "
                                     "pipe without reaching its end: no trace is that large; give the file itself")
            return data


def load(path: str, *, quiet: bool = False):
    """Reads a trace written by ``DebugMode.save`` / ``DebugMode(trace=...)`` /
    ``kdebug record``.  A truncated file (the process died) loads up to its last
    complete chunk, with a warning; a corrupt, foreign or newer file raises
    TraceFileError naming the byte offset.

    The file is memory-mapped, not copied: appending to it (a trace still being
    streamed) is fine, and kdebug's writers replace an existing file rather
    than truncate it, so re-recording to the same path leaves this Run
    reading the old file.  Another program truncating the file in place while
    the Run is in use would end the process with SIGBUS.

    A path that does not exist while per-rank traces of it do
    (``run.rank0.kdt``, ...: a job's ranks, Note [Ranks]) loads them all, as a
    kdebug.ranks.RankedRun (``.ranks``, ``run[r]``)."""
    if not os.path.lexists(os.fspath(path)):
        from . import ranks

        if ranks.rank_files(path):
            return ranks.load_ranks(path, quiet=quiet)
    try:
        data = _map(path)
    except OSError as e:
        raise TraceFileError(str(path), 0, f"cannot read: {e.strerror}") from None
    run = Run(data, str(path))
    if not quiet:
        from .inductor import KdebugWarning

        for p in run.problems():
            warnings.warn(p, KdebugWarning, stacklevel=2)
    return run
