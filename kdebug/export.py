"""``kdebug export --perfetto run.kdt -o run.json``: a run in the Chrome trace
event format, which Perfetto UI (ui.perfetto.dev, "Open trace file") and
chrome://tracing open.

Kernel launches are complete ("X") slices, one track per device and CUDA
stream (CPU kernels: per host thread), with the grid, launch config,
arguments (roles, dtypes, shapes) and hashes as slice arguments.  The times
are the recorder's host clock around each launch *call*: on a GPU that is when
the launch was queued and how long queueing took, not when the kernel ran on
the device.  Aten ops carry no timestamps in a trace; they are instant events
on their own track, placed at the end of the launch before them.
"""
from __future__ import annotations

import json
import os
import struct

from . import _files
from .report import ARG_BYTES, REC_BYTES, _dtype_names
from .trace import Run, load

_REC = struct.Struct("<BBBbHHII3IHBBQQQQQII")
_ARG = struct.Struct("<8BIIq2Q2d6I2Q2d")  # the 2Q: xor64, or the stats' sum as float64 bits
assert _REC.size == REC_BYTES and _ARG.size == ARG_BYTES

_KINDS = {1: "triton", 2: "cpp", 3: "aten"}


def _hash(kinds: int, w: int, a: tuple) -> str:
    parts = []
    if kinds & 1:
        parts.append(f"bitwise 0x{a[11 + w]:016x}")
    if kinds & 2:
        s = f"norm {a[13 + w]:.10g}"
        for n, what in ((a[15 + w], "nan"), (a[17 + w], "inf"), (a[19 + w], "-inf")):
            if n:
                s += f" +{n}x{what}"
        parts.append(s)
    if kinds & 4:
        parts.append(f"hash_tensor 0x{a[21 + w]:x}")
    if kinds & 16:  # the stats' sum shares xor64's bytes (Note [Room for the stats] in csrc/core/kd_record.h)
        total = struct.unpack("<d", struct.pack("<Q", a[21 + w]))[0]
        s = f"stats sum {total:.10g}, absmax {a[23 + w]:.6g}, l1 {a[13 + w]:.10g}"
        for n, what in ((a[15 + w], "nan"), (a[17 + w], "+inf"), (a[19 + w], "-inf")):
            if n:
                s += f", {what} {n}"
        parts.append(s)
    if kinds & 8:
        parts.append("custom (not saved)")
    return ", ".join(parts)


def _arg_text(a: tuple, shape: list, strings: list, dtypes: dict) -> str:
    tag, role = a[0], a[1]
    r = ("R" if role & 1 else "") + ("W" if role & 2 else "")
    if tag == 2:
        s = f"{r} {dtypes.get(a[2], a[2])}{list(shape)}"
        kinds, flags = a[4], a[5]
        if flags & 1:
            s += f"; pre {_hash(kinds, 0, a)}"
        if flags & 2:
            s += f"; post {_hash(kinds, 1, a)}"
        if flags & 4:
            s += "; READ-ONLY INPUT CHANGED"
        return s
    if tag == 3:
        return f"{r} int {a[10]}"
    if tag == 4:
        return f"{r} float {struct.unpack('<d', struct.pack('<q', a[10]))[0]!r}"
    if tag == 5:
        return f"{r} bool {bool(a[10])}"
    if tag == 6:
        return f"{r} None"
    return f"{r} {strings[a[9]]}"


def perfetto_events(run: Run) -> list[dict]:
    """The trace events of a run (kdebug.Run)."""
    rec, arg, dims = run.table(0, len(run))
    strings = run.strings()
    dtypes = _dtype_names()
    ndims = len(dims) // 8
    dimv = struct.unpack(f"<{ndims}q", dims) if ndims else ()
    recs = list(_REC.iter_unpack(rec))
    args = list(_ARG.iter_unpack(arg))
    # rows: 0 type, 1 kind, 2-3 device, 4 nargs, 5 depth, 6 name, 7 text / config, 8-10 grid,
    # 11 num_warps, 12 num_stages, 13 flags, 14 launch index, 15 stream, 16 thread,
    # 17 t_start_ns, 18 t_end_ns, 19 shared_mem (kd_tab_rec)
    t0 = min((r[17] for r in recs if r[0] == 1 and r[17]), default=0)
    events: list[dict] = []
    tracks: dict[tuple, tuple[int, int]] = {}
    procs: dict[int, str] = {0: "aten ops (no timestamps: placed at the end of the launch before)"}

    def track(r) -> tuple[int, int]:
        dev_type, dev_index, stream, thread = r[2], r[3], r[15], r[16]
        key = (dev_type, dev_index, stream if dev_type == 1 else thread)
        t = tracks.get(key)
        if t is None:
            pid = 100 + max(dev_index, 0) if dev_type == 1 else 1
            procs.setdefault(pid, f"cuda:{max(dev_index, 0)}" if dev_type == 1 else "cpu")
            tid = 1 + sum(1 for k in tracks if (100 + max(k[1], 0) if k[0] == 1 else 1) == pid)
            tracks[key] = t = (pid, tid)
            name = f"stream 0x{stream:x}" if dev_type == 1 else f"host thread {thread}"
            events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}})
        return t

    k = d = 0
    last_end = 0.0
    for i, r in enumerate(recs):
        if r[0] != 1:
            events.append({"ph": "i", "s": "t", "name": strings[r[6]], "cat": "aten", "pid": 0, "tid": 0,
                           "ts": last_end, "args": {"record": i, "call": strings[r[7]]}})
            continue
        nargs = r[4]
        a_args = {}
        for a in args[k:k + nargs]:
            nd = a[3] if a[0] == 2 else 0
            a_args[strings[a[8]] or f"arg{len(a_args)}"] = _arg_text(a, dimv[d:d + nd], strings, dtypes)
            d += nd
        k += nargs
        pid, tid = track(r)
        ts = (r[17] - t0) / 1000.0
        dur = max((r[18] - r[17]) / 1000.0, 0.001)
        last_end = ts + dur
        sl = {"record": i, "kernel #": r[14], "args": a_args}
        if r[8] or r[9] or r[10]:
            sl["grid"] = [r[8], r[9], r[10]]
        if r[7]:
            sl["config"] = strings[r[7]]
        if r[11]:
            sl["num_warps"], sl["num_stages"] = r[11], r[12]
        if r[19]:
            sl["shared_mem"] = r[19]
        events.append({"ph": "X", "name": strings[r[6]], "cat": _KINDS.get(r[1], "kernel"), "pid": pid,
                       "tid": tid, "ts": ts, "dur": dur, "args": sl})
    for pid, name in procs.items():
        events.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": name}})
    events.append({"ph": "M", "name": "thread_name", "pid": 0, "tid": 0, "args": {"name": "aten ops"}})
    return events


def export_perfetto(trace: str | Run, out: str) -> dict:
    """Writes ``out`` (Chrome trace JSON); returns {"events", "launches", "bytes"}."""
    run = trace if isinstance(trace, Run) else load(os.fspath(trace))
    events = perfetto_events(run)
    other = {"kdebug": "host-clock launch calls; see kdebug/export.py", "source": run.path,
             "torch": run.meta.get("torch"), "argv": run.meta.get("argv"), "problems": run.problems()}
    enc = json.JSONEncoder(separators=(",", ":")).encode  # the C encoder (json.dump streams in Python)
    with _files.replaced_atomically(out) as f:  # Note [Safe writes]
        f.write('{"traceEvents":[')
        for k in range(0, len(events), 4096):
            if k:
                f.write(",")
            f.write(",".join(map(enc, events[k:k + 4096])))
        f.write(f'],"displayTimeUnit":"ns","otherData":{enc(other)}}}')
    return {"events": len(events), "launches": sum(1 for e in events if e["ph"] == "X"),
            "bytes": os.path.getsize(out)}
