"""The HTML report: one self-contained file showing where runs diverge.

``write_html(path, runs)`` compares the runs (trace paths, kdebug.Run or
DebugMode objects; every run with the first, as ``kdebug hunt`` does) and
writes one HTML file with no external scripts, fonts or requests: a summary,
a zoomable timeline per run, a searchable and sortable launch table, the
structural differences side by side and a plot of how the divergence spreads.

Note [Report data]
Nothing here makes a Python object per launch.  Each run's records come from
the C trace reader as fixed-size rows (Note [Trace tables] in kd_trace.h);
their string ids are remapped to one table shared by all runs, and three
per-record columns are added, computed with tensor ops from the comparison's
alignment:

- ``flags`` (u8): DIFF the first divergence or a later launch whose hashes
  differ from its counterpart's (what inherited it), ROOT the first divergence, WRITER the last writer of a diverging input,
  UNALIGNED no counterpart (a structural difference), CONFIG grid / config
  differ, SHAPE argument shapes differ, HASHED some hash was taken;
- ``peer`` (i32): the aligned record of the other run, -1 when none;
- ``spread`` (f32): the share of the bytes the launch wrote that lie in
  arguments whose hashes differ from its counterpart's (an aten op counts 1
  when its output hash differs).  Hashes say whether an argument differs, not
  how many of its elements do: the page labels it so.

Run 0 is described against the first comparison that diverges (run 1 when
none does), every other run against run 0.  The sections are concatenated,
8-byte aligned, gzip-compressed and embedded as base64; the page inflates them
with the browser's DecompressionStream and reads the rows by their offsets.
"""
from __future__ import annotations

import base64
import datetime
import functools
import html
import json
import os
import re
import time
import zlib
from typing import Sequence

import torch

from . import __version__, _files, _upstream
from .calls import _dtype_of
from .compare import Report, _fmt_hash, _Side, compare, format_report, is_collective, root_cause, stats_diff
from .hashing import Stats
# the inputs (trace paths, a kept hunt's hunt.json) are read without torch: kdebug/report_inputs.py
from .report_inputs import _plain_name, kept_hunt, read_hunt_json, resolve_inputs  # noqa: F401

REC_BYTES, ARG_BYTES = 80, 112  # kd_tab_rec / kd_tab_arg (static_assert in kd_trace.h)

DIFF, ROOT, WRITER, UNALIGNED, CONFIG, SHAPE, HASHED = 1, 2, 4, 8, 16, 32, 64

_TEMPLATE = os.path.join(os.path.dirname(__file__), "report_template.html")


# ---------------------------------------------------------------- tables


class _Table:
    """One run's rows (Note [Trace tables]) as tensors, string ids global."""

    def __init__(self, side: _Side, strings: dict[str, int]):
        rec, arg, dims = side.trace.table(0, side.n)
        local = side.trace.strings()
        remap = torch.tensor([strings.setdefault(s, len(strings)) for s in local], dtype=torch.int32)
        self.rec = bytearray(rec)
        self.arg = bytearray(arg)
        self.dims = bytes(dims)
        self.n, self.m = len(rec) // REC_BYTES, len(arg) // ARG_BYTES
        r32 = self._view(self.rec, torch.int32, REC_BYTES)
        a32 = self._view(self.arg, torch.int32, ARG_BYTES)
        for col in (2, 3):  # name_id, text_id / other_id: file ids -> shared ids
            r32[:, col] = remap[r32[:, col].long()]
            a32[:, col] = remap[a32[:, col].long()]
        r16 = self._view(self.rec, torch.int16, REC_BYTES)
        self.nargs = r16[:, 2].long() & 0xFFFF
        self.type = self._view(self.rec, torch.uint8, REC_BYTES)[:, 0]
        self.off = torch.zeros(self.n, dtype=torch.int64)
        if self.n > 1:
            self.off[1:] = torch.cumsum(self.nargs, 0)[:-1]
        self.dig = side.dig

    @staticmethod
    def _view(buf: bytearray, dtype: torch.dtype, row: int) -> torch.Tensor:
        if not buf:
            return torch.zeros((0, row // dtype.itemsize), dtype=dtype)
        return torch.frombuffer(buf, dtype=dtype).view(-1, row // dtype.itemsize)

    @functools.cached_property
    def arg_cols(self):
        """(written, bytes, post-hashed, post-hash columns) per argument row."""
        a8 = self._view(self.arg, torch.uint8, ARG_BYTES)
        a64 = self._view(self.arg, torch.int64, ARG_BYTES)
        a32 = self._view(self.arg, torch.int32, ARG_BYTES)
        tensor = a8[:, 0] == 2
        written = tensor & ((a8[:, 1] & 2) != 0)
        size = _ITEMSIZE[a8[:, 2].long()]
        nbytes = torch.where(tensor, a64[:, 2].clamp(min=0) * size, torch.zeros_like(size))
        hashed_post = (a8[:, 5] & 2) != 0
        # bitwise, l1, xor64 or the stats' sum, nan, +inf, -inf, the stats' absmax (post)
        post = torch.stack([a64[:, 4], a64[:, 6], a64[:, 11], a32[:, 15], a32[:, 17], a32[:, 19], a64[:, 13]], 1)
        return written, nbytes, hashed_post, post


def _itemsizes() -> torch.Tensor:
    out = torch.ones(256, dtype=torch.int64)
    for st in range(256):
        d = _dtype_of(st)
        if isinstance(d, torch.dtype):
            out[st] = d.itemsize
    return out


_ITEMSIZE = _itemsizes()


def _dtype_names() -> dict[int, str]:
    names = {}
    for st in range(256):
        d = _dtype_of(st)
        if isinstance(d, torch.dtype):
            names[st] = _upstream.dtype_abbrs.get(d, str(d).replace("torch.", ""))
    return names


def _spread(ta: _Table, tb: _Table, pa: torch.Tensor, pb: torch.Tensor) -> torch.Tensor:
    """Per aligned pair: the fraction of the bytes written (by b's launch) whose
    post-launch hashes differ from a's; ops: 1 when their output hash differs."""
    m = len(pa)
    frac = torch.zeros(m, dtype=torch.float32)
    if m == 0:
        return frac
    post_differs = (ta.dig[pa, 4] != tb.dig[pb, 4]).float()
    is_op = tb.type[pb] == 2
    frac[is_op] = post_differs[is_op]
    na, nb = ta.nargs[pa], tb.nargs[pb]
    launch = (tb.type[pb] == 1) & (na == nb)
    counts = torch.where(launch, nb, torch.zeros_like(nb))
    total = int(counts.sum())
    if total == 0:
        return frac
    pair = torch.repeat_interleave(torch.arange(m), counts)
    starts = torch.cumsum(counts, 0) - counts
    j = torch.arange(total) - starts[pair]
    ai, bi = ta.off[pa][pair] + j, tb.off[pb][pair] + j
    _, _, hpa, posta = ta.arg_cols
    wb, bytes_b, hpb, postb = tb.arg_cols
    w = wb[bi]
    nbytes = bytes_b[bi].double() * w
    differs = (hpa[ai] & hpb[bi] & (posta[ai] != postb[bi]).any(1)) | (hpa[ai] != hpb[bi])
    num = torch.zeros(m, dtype=torch.float64).index_add_(0, pair, nbytes * differs)
    den = torch.zeros(m, dtype=torch.float64).index_add_(0, pair, nbytes)
    has = den > 0
    frac[has] = (num[has] / den[has]).float()
    # launches writing nothing hashed: whether their hashes differ at all
    nohash = launch & ~has
    frac[nohash] = ((ta.dig[pa[nohash], 3] != tb.dig[pb[nohash], 3]) | (ta.dig[pa[nohash], 4] != tb.dig[pb[nohash], 4])).float()
    return frac


def _hashed(t: _Table) -> torch.Tensor:
    """Per record: some hash was taken."""
    return (t.dig[:, 3] | t.dig[:, 4]) != 0


def _columns(rep: Report, t: _Table, pair_spread: torch.Tensor, for_a: bool):
    """flags / peer / spread of one side (table t) of a comparison (Note
    [Report data]); pair_spread is _spread() of its aligned pairs."""
    al = rep.alignment
    pa, pb = al["pa"], al["pb"]
    me, other = (pa, pb) if for_a else (pb, pa)
    flags = torch.full((t.n,), UNALIGNED, dtype=torch.uint8)
    flags[me] = 0
    flags[_hashed(t)] |= HASHED
    # the divergence and what inherited it, as the engine counts them (pairs
    # before it whose digests differ were found equal value by value)
    if al["root"] is not None:  # every consequential root and what changed because of them
        flags[me[al["roots"]]] |= DIFF | ROOT
        flags[me[al["heirs"]]] |= DIFF
    flags[me[al["config"]]] |= CONFIG
    flags[me[al["shape"]]] |= SHAPE
    d = rep.divergence
    if d is not None and d.writer is not None:
        wi = d.writer.index  # an index in run a
        if for_a:
            flags[wi] |= WRITER
        else:
            pos = (pa == wi).nonzero().flatten()
            if len(pos):
                flags[pb[int(pos[0])]] |= WRITER
    peer = torch.full((t.n,), -1, dtype=torch.int32)
    peer[me] = other.int()
    spread = torch.zeros(t.n, dtype=torch.float32)
    spread[me] = pair_spread
    return flags, peer, spread


# ---------------------------------------------------------------- summary


def _hash_text(h) -> str:
    """'0x.. (bitwise), norm 141.3507390' for a (bitwise, norm) pair."""
    if h is None:
        return "-"
    if isinstance(h, tuple) and len(h) == 2 and isinstance(h[0], int) and isinstance(h[1], float):
        return f"{_fmt_hash(h[0])}, norm {h[1]:.10g}"
    if isinstance(h, tuple) and len(h) == 2 and isinstance(h[0], int) and isinstance(h[1], Stats):
        s = h[1]
        counts = f", nan {s.nan}, +inf {s.posinf}, -inf {s.neginf}" if s.nonfinite else ""
        return f"{_fmt_hash(h[0])}, sum {s.sum:.6g}, absmax {s.absmax:.3g}{counts}"
    return _fmt_hash(h)


def _magnitude(ha, hb) -> str | None:
    """How big a difference is (compare.stats_diff), where both sides have stats."""
    sa = ha[1] if isinstance(ha, tuple) and len(ha) == 2 and isinstance(ha[1], Stats) else ha
    sb = hb[1] if isinstance(hb, tuple) and len(hb) == 2 and isinstance(hb[1], Stats) else hb
    if isinstance(sa, Stats) and isinstance(sb, Stats):
        return stats_diff(sa, sb)
    return None


def _step_json(s) -> dict | None:
    if s is None:
        return None
    return {"index": s.index, "kind": s.kind, "name": s.name, "label": s.label(),
            "grid": list(s.grid) if isinstance(s.grid, (tuple, list)) else s.grid,
            "config": None if s.config is None else str(s.config)}


def _root_json(x, rep: Report) -> dict:
    a, b = rep.runs
    return {"a": _step_json(x.step_a), "b": _step_json(x.step_b), "kind": x.kind,
            "cause": root_cause(x, a, b, bool(rep.settings)),  # the text report's own words
            "outputs": [lab for lab, _, _ in x.outputs], "inputs": [lab for lab, _, _ in x.outside_inputs],
            "consequences": x.consequences, "reaches_end": x.reaches_end, "absorbed": x.absorbed,
            "freed": x.freed, "values": [[lab, str(va), str(vb)] for lab, va, vb in x.values[:10]],
            "code": list(x.code) if x.code else None}


def _comparison_json(rep: Report, limit: int = 2000) -> dict:
    al = rep.alignment
    d = rep.divergence
    div = None
    if d is not None:
        div = {"kind": d.kind, "a": _step_json(d.step_a), "b": _step_json(d.step_b), "arg": d.arg,
               "arg_index": d.arg_index, "hash_a": _hash_text(d.hash_a), "hash_b": _hash_text(d.hash_b),
               "magnitude": _magnitude(d.hash_a, d.hash_b),
               "writer": _step_json(d.writer), "writer_args": list(d.writer_args), "outside": d.outside,
               "inherited": len(d.inherited), "hints": list(d.hints), "collective": is_collective(d.step_a),
               "other_writer": (None if d.other_writer is None else
                                {"b": _step_json(d.other_writer[0]), "a": _step_json(d.other_writer[1])})}
    segs = [list(op) for op in al["opcodes"] if op[0] != "equal"]
    if rep.divergence is None and rep.ok:
        verdict = ("no verdict: incomplete" if rep.gaps else "match") if rep.hashed else "nothing hashed"
    elif rep.divergence is not None:
        verdict = f"{rep.divergence.kind} divergence"
    else:
        verdict = "structure differs"
    pa, pb = al["pa"], al["pb"]
    return {
        "a": rep.runs[0], "b": rep.runs[1], "verdict": verdict, "ok": rep.ok, "text": format_report(rep, terminal=False),
        "gaps": list(rep.gaps),
        "compared": rep.compared, "hashed": rep.hashed, "n_a": rep.n_a, "n_b": rep.n_b,
        "divergence": div, "structural": list(rep.structural), "aligned": al["aligned"],
        "segments": segs[:limit], "segments_total": len(segs),
        "config_changes": [[int(pa[k]), int(pb[k])] for k in al["config"][:limit].tolist()],
        "config_total": len(al["config"]),
        "shape_changes": [[int(pa[k]), int(pb[k])] for k in al["shape"][:limit].tolist()],
        "shape_total": len(al["shape"]),
        "inherited": 0 if d is None else len(d.inherited),
        "diff_total": len(al["roots"]) + len(al["heirs"]),
        "roots": [_root_json(x, rep) for x in rep.roots[:limit]],
        "benign": [_root_json(x, rep) for x in rep.benign[:limit]],
    }


# ---------------------------------------------------------------- build


def build(runs: Sequence, *, hunt: dict | None = None, title: str | None = None) -> tuple[dict, bytes]:
    """The report's description (JSON-able) and its binary sections."""
    t0 = time.perf_counter()
    sides = [_Side.of(r) for r in runs]
    reports = [compare(sides[0], s, runs=(0, i)) for i, s in enumerate(sides[1:], 1)]
    strings: dict[str, int] = {"": 0}
    tables = [_Table(s, strings) for s in sides]
    primary = next((k for k, r in enumerate(reports) if not r.ok), 0)
    # one spread per comparison, shown on both of its sides
    spreads = [_spread(tables[0], t, r.alignment["pa"], r.alignment["pb"]) for r, t in zip(reports, tables[1:])]
    cols = []
    for i, t in enumerate(tables):
        if not reports:
            cols.append((_hashed(t).to(torch.uint8) * HASHED, torch.full((t.n,), -1, dtype=torch.int32),
                         torch.zeros(t.n, dtype=torch.float32)))
        elif i == 0:
            cols.append(_columns(reports[primary], t, spreads[primary], True))
        else:
            cols.append(_columns(reports[i - 1], t, spreads[i - 1], False))
    sections: list[bytes] = []
    offset = 0

    def add(b: bytes) -> list[int]:
        nonlocal offset
        pad = (-len(b)) % 8
        sections.append(b + b"\0" * pad)
        at = offset
        offset += len(b) + pad
        return [at, len(b)]

    run_meta = []
    code: dict[str, str] = {}
    for i, (s, t, (flags, peer, spread)) in enumerate(zip(sides, tables, cols)):
        run = s.trace
        st = run.meta.get("stats", {})
        run_meta.append({
            "label": f"run {i}", "path": run.path, "records": t.n, "kernels": int((t.type == 1).sum()),
            "ops": int((t.type == 2).sum()), "args": t.m, "complete": bool(run.complete),
            "problems": run.problems(), "torch": run.meta.get("torch"), "argv": run.meta.get("argv"),
            "time": run.meta.get("time"), "dropped": st.get("dropped", 0),
            "rec": add(bytes(t.rec)), "arg": add(bytes(t.arg)), "dims": add(t.dims),
            "flags": add(_bytes(flags)), "peer": add(_bytes(peer)), "spread": add(_bytes(spread)),
            # Note [Kernel provenance]: per kernel name, each distinct kernel's lines (escaped by the page)
            "provenance": {name: [e.describe() for e in run.provenance(name)]
                           for name in run.meta.get("kernel_provenance", {})},
            # Note [Kernel code]: per kernel name, each entry's source hash ('' unknown), and each
            # distinct source once in META "code", for all runs (shown escaped, collapsed, by the launch detail)
            "provenance_code": {name: [e.code_sha256 for e in run.provenance(name)]
                                for name in run.meta.get("kernel_provenance", {})},
        })
        code.update(run.meta.get("kernel_code", {}))
    first = sides[0].trace.meta
    workload = (hunt or {}).get("what") or " ".join(first.get("argv") or []) or sides[0].trace.path
    meta = {
        "title": title or "kdebug report",
        "kdebug": __version__, "generated": datetime.datetime.now().isoformat(timespec="seconds"),
        "workload": workload, "hunt": hunt or None, "runs": run_meta,
        "comparisons": [_comparison_json(r) for r in reports], "primary": primary,
        "strings": list(strings), "dtypes": _dtype_names(), "code": code,
        "layout": {"rec": REC_BYTES, "arg": ARG_BYTES},
        "flags": {"DIFF": DIFF, "ROOT": ROOT, "WRITER": WRITER, "UNALIGNED": UNALIGNED, "CONFIG": CONFIG,
                  "SHAPE": SHAPE, "HASHED": HASHED},
        "build_s": round(time.perf_counter() - t0, 3),
    }
    return meta, b"".join(sections)


def _bytes(t: torch.Tensor) -> bytes:
    """The bytes of a CPU tensor, in memory order (no numpy: torch's CPU wheel
    does not bring it)."""
    out = bytearray(t.numel() * t.element_size())
    if out:
        torch.frombuffer(out, dtype=t.dtype).copy_(t.reshape(-1))
    return bytes(out)


def _script_json(obj) -> str:
    """JSON safe inside a <script> element: every "<", ">" and "&" written as
    its \\u escape (valid JSON, so JSON.parse reads the same strings), so no
    "</script>" or "<!--" can end or re-open it; no NaN / Infinity (JSON.parse
    refuses them: the page would not load).  ("<!--" was written "<\\!--",
    which is no JSON escape: a trace holding "<!--" anywhere, a source line's
    HTML comment in a kernel's provenance say, gave a blank page.)"""
    return (json.dumps(obj, separators=(",", ":"), allow_nan=False)
            .replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026"))


_SLOTS = re.compile(r"__KDEBUG_TITLE__|/\*__KDEBUG_META__\*/null|__KDEBUG_DATA__")


def render(meta: dict, blob: bytes) -> str:
    """The page: the template with its three slots filled in one pass, so a
    slot's name inside the title or the data is never filled in again."""
    with open(_TEMPLATE, encoding="utf-8") as f:
        page = f.read()
    fill = {"__KDEBUG_TITLE__": html.escape(meta["title"]), "/*__KDEBUG_META__*/null": _script_json(meta),
            "__KDEBUG_DATA__": base64.b64encode(_gzip(blob)).decode("ascii")}
    return _SLOTS.sub(lambda m: fill[m.group(0)], page)


def _gzip(b: bytes) -> bytes:
    """gzip (what DecompressionStream('gzip') reads), fast level."""
    c = zlib.compressobj(3, zlib.DEFLATED, 31)
    return c.compress(b) + c.flush()


def write_html(path: str, runs: Sequence, *, hunt: dict | None = None, title: str | None = None) -> dict:
    """Writes the report; returns {"path", "bytes", "seconds", "runs", "records"}."""
    t0 = time.perf_counter()
    runs, found = resolve_inputs(runs)
    meta, blob = build(runs, hunt=hunt or found or None, title=title)
    page = render(meta, blob)
    with _files.replaced_atomically(path) as f:  # Note [Safe writes]
        f.write(page)
    return {"path": path, "bytes": os.path.getsize(path), "seconds": time.perf_counter() - t0,
            "runs": len(meta["runs"]), "records": sum(r["records"] for r in meta["runs"]),
            "verdict": [c["verdict"] for c in meta["comparisons"]]}
