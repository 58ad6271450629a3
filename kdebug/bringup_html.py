"""`kdebug analyze --html report.html`: the bring-up analysis as one
self-contained HTML page (no script, no external resource): constraint
violations grouped by model, graph breaks, recompilations, graphs, and the
benchmark suite's results (benchmarks/results/bringup_<device>.json) with
speedups over eager and the accuracy status.

Every text from the program or a results file is escaped.  A value a row
does not have is shown as "—", never filled in; a speedup is shown only where
both the row's and its model's eager latency were measured.
"""
from __future__ import annotations

import glob
import html
import json
import math
import os

from . import _files

_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222}
h1{font-size:1.3em} h2{font-size:1.1em;margin-top:1.6em} h3{font-size:1em;margin-bottom:.3em}
table{border-collapse:collapse;font-size:12px} td,th{border:1px solid #ccc;padding:2px 6px;text-align:left}
td.n{text-align:right;font-variant-numeric:tabular-nums}
tr.fail td{background:#fdd} tr.pass td{background:#efe}
pre{background:#f6f6f6;padding:8px;overflow:auto;max-height:30em;font-size:12px}
.k{font-family:monospace} .hint{color:#555}
"""
MISSING = "—"
DEFAULT_BENCH_GLOB = os.path.join("benchmarks", "results", "bringup_*.json")


def _e(x) -> str:
    return html.escape(str(x), quote=True)


def _num(v, fmt: str = "{:.3g}") -> str:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return MISSING
    return fmt.format(v)


def _get(d, *keys):
    for k in keys:
        if not isinstance(d, dict):
            return None
        d = d.get(k)
    return d


# ---------------------------------------------------------------- benchmark results

def load_bench(path: str) -> dict:
    """A benchmark results file as {"file", "rows", "problem"}: rows is the
    list of row objects (the file may be a list of rows or an object with
    "rows" or "results"); problem says why none could be read."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError, RecursionError) as e:  # (nested past the parser's depth: a RecursionError)
        return {"file": path, "rows": [], "problem": f"unreadable: {type(e).__name__}: {str(e)[:200]}"}
    rows = data if isinstance(data, list) else (_get(data, "rows") or _get(data, "results"))
    if not isinstance(rows, list):
        return {"file": path, "rows": [], "problem": "no list of rows (expected a list, or an object with 'rows')"}
    # a row is an object whose model and backend, where given, are text (a list there stopped the analysis)
    kept = [r for r in rows if isinstance(r, dict)
            and all(r.get(k) is None or isinstance(r.get(k), str) for k in ("model", "backend"))]
    out = {"file": path, "rows": kept, "problem": None}
    if len(kept) != len(rows):
        out["problem"] = (f"{len(rows) - len(kept)} row(s) that are not objects, or whose model or backend is "
                          "not text, left out")
    if isinstance(data, dict):
        out["device"] = data.get("device")
    return out


def find_bench(paths: list[str] | None) -> list[dict]:
    """The given results files, or the benchmark suite's default ones
    (benchmarks/results/bringup_*.json under the current directory)."""
    if paths is None:
        paths = sorted(glob.glob(DEFAULT_BENCH_GLOB))
    return [load_bench(p) for p in paths]


def speedups(rows: list[dict]) -> list[float | None]:
    """Per row: its model's eager latency / its latency (mean ms), where both were measured."""
    eager = {}
    for r in rows:
        m = r.get("latency_ms_mean")
        if r.get("backend") == "eager" and isinstance(m, (int, float)) and not isinstance(m, bool) and m > 0:
            eager.setdefault(r.get("model"), m)
    out = []
    for r in rows:
        m, base = r.get("latency_ms_mean"), eager.get(r.get("model"))
        ok = isinstance(m, (int, float)) and not isinstance(m, bool) and m > 0 and base is not None
        out.append(base / m if ok else None)
    return out


def _bench_section(b: dict) -> list[str]:
    parts = [f"<h3>{_e(b['file'])}" + (f" ({_e(b['device'])})" if b.get("device") else "") + "</h3>"]
    if b.get("problem"):
        parts.append(f"<p class=hint>{_e(b['problem'])}</p>")
    if not b["rows"]:
        return parts
    parts.append("<table><tr><th>model</th><th>backend</th><th>compile s</th><th>latency ms (mean ± std)</th>"
                 "<th>speedup vs eager</th><th>graphs</th><th>graph breaks</th><th>violations</th>"
                 "<th>accuracy</th><th>max abs</th></tr>")
    for r, sp in zip(b["rows"], speedups(b["rows"])):
        acc = r.get("accuracy") if isinstance(r.get("accuracy"), dict) else {}
        status = acc.get("status")
        cls = {"pass": "pass", "ok": "pass", "fail": "fail", "error": "fail"}.get(str(status).lower(), "")
        mean, std = _num(r.get("latency_ms_mean")), _num(r.get("latency_ms_std"))
        lat = MISSING if mean == MISSING else mean + ("" if std == MISSING else f" ± {std}")
        parts.append(
            f'<tr class="{cls}"><td>{_e(r.get("model", MISSING))}</td><td>{_e(r.get("backend", MISSING))}</td>'
            f'<td class=n>{_num(r.get("compile_s"))}</td><td class=n>{_e(lat)}</td>'
            f'<td class=n>{MISSING if sp is None else _e(f"{sp:.2f}x")}</td>'
            f'<td class=n>{_num(r.get("graphs"), "{}")}</td><td class=n>{_num(r.get("graph_breaks"), "{}")}</td>'
            f'<td class=n>{_num(r.get("violations"), "{}")}</td>'
            f'<td>{_e(MISSING if status is None else status)}</td><td class=n>{_num(acc.get("max_abs"))}</td></tr>')
    parts.append("</table>")
    return parts


# ---------------------------------------------------------------- analysis

def model_of(compile_id: str | None, graphs: list[dict], checks: list[dict]) -> str:
    """The model a compile belongs to: the label a check carries, else the
    function dynamo compiled (with its file and line), else the compile id."""
    for c in checks:
        if c.get("compile_id") == compile_id and c.get("model"):
            return str(c["model"])
    frame = str(compile_id).split("/")[0] if compile_id else None
    for g in graphs:
        if g.get("compile_id") == compile_id or (frame and str(g.get("compile_id", "")).split("/")[0] == frame):
            where = f" ({g['file']}:{g['line']})" if g.get("file") else ""
            return f"{g.get('function', '?')}{where}"
    return f"compile {compile_id or '?'}"


def group_violations(analysis: dict) -> dict[str, list[dict]]:
    """{model: its violations} in the order found."""
    graphs = _get(analysis, "compile", "graphs") or []
    checks = _get(analysis, "constraints", "checks") or []
    out: dict[str, list[dict]] = {}
    for v in _get(analysis, "constraints", "violations") or []:
        out.setdefault(model_of(v.get("compile_id"), graphs, checks), []).append(v)
    return out


def render(analysis: dict, bench: list[dict] | None = None, title: str = "kdebug bring-up report") -> str:
    parts = [f"<!doctype html><html><head><meta charset=utf-8><title>{_e(title)}</title><style>{_CSS}</style>"
             "</head><body>", f"<h1>{_e(title)}</h1>"]
    if analysis.get("program"):
        parts.append(f"<p>program: <span class=k>{_e(analysis['program'])}</span>, exit status "
                     f"{_e(analysis.get('exit_status', MISSING))}</p>")
    comp, cons = analysis.get("compile"), analysis.get("constraints")
    facts = []
    if isinstance(comp, dict):
        facts += [("graphs", comp.get("graph_count")), ("graph breaks", comp.get("graph_break_count")),
                  ("recompilations", comp.get("recompile_count"))]
    if isinstance(cons, dict):
        facts += [("graphs checked", cons.get("graphs_checked")), ("constraint violations", len(cons.get("violations") or []))]
    if facts:
        parts.append("<table>" + "".join(f"<tr><th>{_e(k)}</th><td class=n>{_num(v, '{}')}</td></tr>"
                                         for k, v in facts) + "</table>")
    if isinstance(cons, dict):
        groups = group_violations(analysis)
        parts.append("<h2>Constraint violations by model</h2>")
        if not groups:
            parts.append(f"<p>none in {_e(cons.get('graphs_checked', 0))} graph(s) checked</p>")
        for model, vs in groups.items():
            kinds: dict[str, int] = {}
            for v in vs:
                kinds[str(v.get("constraint"))] = kinds.get(str(v.get("constraint")), 0) + 1
            parts.append(f"<h3>{_e(model)}: {len(vs)} violation(s) ("
                         + _e(", ".join(f"{k} {n}" for k, n in kinds.items())) + ")</h3>")
            parts.append("<table><tr><th>constraint</th><th>stage</th><th>compile</th><th>node</th><th>op</th>"
                         "<th>value</th><th>expected</th><th>actual</th><th>user line</th><th>repro</th></tr>")
            for v in vs:
                parts.append("<tr>" + "".join(
                    f"<td{' class=k' if k in ('node', 'target') else ''}>{_e(MISSING if v.get(k) is None else v.get(k))}</td>"
                    for k in ("constraint", "stage", "compile_id", "node", "target", "value", "expected", "actual",
                              "source", "repro")) + "</tr>")
            parts.append("</table>")
    if isinstance(comp, dict):
        breaks = comp.get("graph_breaks") or []
        parts.append(f"<h2>Graph breaks ({len(breaks)})</h2>")
        if breaks:
            parts.append("<table><tr><th>compile</th><th>where</th><th>code</th><th>reason</th></tr>")
            for b in breaks:
                where = f"{b.get('file')}:{b.get('line')}" if b.get("file") else "unknown location"
                parts.append(f"<tr><td>{_e(b.get('compile_id') or MISSING)}</td><td class=k>{_e(where)}</td>"
                             f"<td class=k>{_e(b.get('code') or MISSING)}</td><td>{_e(b.get('reason'))}</td></tr>")
            parts.append("</table>")
        rec = comp.get("recompiles") or []
        parts.append(f"<h2>Recompilations ({len(rec)})</h2>")
        if rec:
            parts.append("<table><tr><th>compile</th><th>function</th><th>cached entry</th><th>guard that failed</th></tr>")
            for r in rec:
                for fg in r.get("failed_guards") or [{}]:
                    parts.append(f"<tr><td>{_e(r.get('compile_id'))}</td><td class=k>{_e(r.get('function') or MISSING)}</td>"
                                 f"<td>{_e(fg.get('entry', MISSING))}</td><td class=k>{_e(fg.get('reason', MISSING))}</td></tr>")
            parts.append("</table>")
        graphs = comp.get("graphs") or []
        parts.append(f"<h2>Graphs ({len(graphs)} frame compile(s))</h2>")
        if graphs:
            parts.append("<table><tr><th>compile</th><th>function</th><th>where</th><th>ops</th><th>guards</th>"
                         "<th>compile s</th><th>failure</th></tr>")
            for g in graphs:
                where = f"{g.get('file')}:{g.get('line')}" if g.get("file") else MISSING
                parts.append(f"<tr><td>{_e(g.get('compile_id'))}</td><td class=k>{_e(g.get('function'))}</td>"
                             f"<td class=k>{_e(where)}</td><td class=n>{_num(g.get('op_count'), '{}')}</td>"
                             f"<td class=n>{_num(g.get('guard_count'), '{}')}</td>"
                             f"<td class=n>{_num(g.get('compile_seconds'))}</td>"
                             f"<td>{_e(g.get('fail_type') or '')}</td></tr>")
            parts.append("</table>")
    if bench:
        parts.append("<h2>Benchmarks</h2><p class=hint>speedup = the model's eager latency / the row's "
                     f"(mean); {MISSING}: not measured</p>")
        for b in bench:
            parts += _bench_section(b)
    parts.append("</body></html>")
    return "".join(parts)


def write_html(path: str, analysis: dict, bench: list[dict] | None = None,
               title: str = "kdebug bring-up report") -> None:
    """Writes the page atomically; refuses a symlinked path (Note [Safe writes])."""
    with _files.replaced_atomically(path) as f:
        f.write(render(analysis, bench, title))
