"""The accuracy verdict as one self-contained HTML page (no script): the
culprit with its generated source, fused FX nodes, user lines, hints and
the error heatmap of its worst buffer, then every checked call.  Every text
that came from the program (kernel names, node names, source, paths) is
escaped."""
from __future__ import annotations

import html
import math

from . import _files, accuracy_text

_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222}
h1{font-size:1.3em} h2{font-size:1.1em;margin-top:1.6em}
table{border-collapse:collapse;font-size:12px} td,th{border:1px solid #ccc;padding:2px 6px;text-align:left}
tr.worse td{background:#fdd} tr.differs td{background:#ffe9c6} tr.inherited td{background:#f3f3f3}
pre{background:#f6f6f6;padding:8px;overflow:auto;max-height:30em;font-size:12px}
.hint{color:#555} .k{font-family:monospace}
"""


def _e(x) -> str:
    return html.escape(str(x), quote=True)


def _g(x) -> str:
    return _e(accuracy_text._g(x))


def _color(v: float, top: float) -> str:
    if not math.isfinite(v):
        return "#000"
    t = 0.0 if top <= 0 else min(1.0, v / top)
    # white -> orange -> dark red
    r = 255 if t < 0.5 else int(255 - (t - 0.5) * 2 * 115)
    g = int(255 - t * 215)
    b = int(255 - min(1.0, t * 2) * 215)
    return f"rgb({r},{g},{b})"


def heatmap_svg(grid, cell: int = 8) -> str:
    """An SVG grid of squares, darker where the error is larger (black: NaN/Inf)."""
    rows, cols = len(grid), len(grid[0]) if grid else 0
    finite = [v for row in grid for v in row if math.isfinite(v)]
    top = max(finite) if finite else 0.0
    rects = []
    for i, row in enumerate(grid):
        for j, v in enumerate(row):
            rects.append(f'<rect x="{j * cell}" y="{i * cell}" width="{cell}" height="{cell}" '
                         f'fill="{_color(v, top)}"><title>{_g(v)}</title></rect>')
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{cols * cell}" height="{rows * cell}" '
            f'role="img" aria-label="error heatmap">{"".join(rects)}</svg>'
            f'<div class="hint">|compiled - float64| on the 2-D slice through the worst element '
            f'(max-pooled to {rows}x{cols} cells); darkest {_g(top)}</div>')


def _kernel_section(title: str, k, report) -> list[str]:
    out = [f"<h2>{_e(title)}: <span class=k>{_e(k.kernel)}</span></h2>",
           f"<p>{_e(k.kind)} call {_e(k.index)} of graph {_e(k.graph)} (graph call {_e(k.graph_call)})</p>"]
    out.append("<table><tr><th>buffer</th><th>FX node</th><th>dtype/shape</th><th>error vs float64 / eager's</th>"
               "<th>max abs</th><th>max rel</th><th>RMSE</th><th>mismatch %</th><th>max ulp</th>"
               "<th>NaN/Inf introduced</th><th>worst element (compiled, eager, float64)</th></tr>")
    for b in k.buffers:
        d = b.diff
        if d is None:
            out.append(f"<tr><td>{_e(b.buffer)}</td><td>{_e(b.node)}</td><td colspan=9>not compared: "
                       f"{_e(b.why_not)}</td></tr>")
            continue
        out.append(f"<tr><td>{_e(b.buffer)}</td><td>{_e(b.node)}</td><td>{_e(d.dtype)}{_e(list(d.shape))}</td>"
                   f"<td>{_g(d.ratio())}x</td><td>{_g(d.max_abs)}</td><td>{_g(d.max_rel)}</td><td>{_g(d.rmse)}</td>"
                   f"<td>{_g(d.mismatch_pct)}</td><td>{_e(d.max_ulp if d.max_ulp is not None else '-')}</td>"
                   f"<td>{_e(d.nonfinite_introduced)}</td><td>{_e(list(d.worst_index or ()))} "
                   f"{_e(d.worst_values)}</td></tr>")
    out.append("</table>")
    w = k.worst()
    if w is not None and w.diff is not None and w.diff.heatmap:
        out.append(f"<h3>Where in {_e(w.buffer)}</h3>" + heatmap_svg(w.diff.heatmap))
    if w is not None and w.diff is not None and w.diff.per_dim:
        for dim, vals in enumerate(w.diff.per_dim):
            if vals is None:
                continue
            worst_at = max(range(len(vals)), key=lambda i: vals[i] if math.isfinite(vals[i]) else math.inf)
            out.append(f"<div class=hint>dimension {dim}: largest error at index {worst_at} "
                       f"({_g(vals[worst_at])}), smallest {_g(min(vals))}</div>")
    if k.nodes:
        out.append("<p>Fuses FX nodes: <span class=k>" + _e(", ".join(k.nodes)) + "</span></p>")
    if k.source:
        out.append("<p>User code:</p><pre>" + _e("\n".join(k.source)) + "</pre>")
    for h in accuracy_text.hints(k, w):
        out.append(f"<p class=hint>Hint: {_e(h)}</p>")
    if k.code:
        out.append("<p>Generated source:</p><pre>" + _e(k.code) + "</pre>")
    return out


def render(report, title: str = "kdebug accuracy") -> str:
    parts = [f"<!doctype html><html><head><meta charset=utf-8><title>{_e(title)}</title><style>{_CSS}</style>"
             "</head><body>", f"<h1>{_e(title)}</h1>", "<pre>" + _e(report.summary()) + "</pre>"]
    if report.culprit is not None:
        parts += _kernel_section("Culprit", report.culprit, report)
    elif report.first_divergent is not None:
        parts += _kernel_section("First kernel outside tolerance (not worse than eager)",
                                 report.first_divergent, report)
    parts.append("<h2>Every checked call</h2><table><tr><th>graph</th><th>call</th><th>kernel</th><th>status</th>"
                 "<th>worst error ratio</th><th>max abs vs eager</th><th>inputs already differing</th></tr>")
    for k in report.kernels:
        w = k.worst()
        ratio = _g(w.diff.ratio()) if w is not None and w.diff is not None else "-"
        mx = _g(w.diff.max_abs) if w is not None and w.diff is not None else "-"
        parts.append(f'<tr class="{_e(k.status)}"><td>{_e(k.graph)}</td><td>{_e(k.index)}</td>'
                     f"<td class=k>{_e(k.kernel)}</td><td>{_e(k.status)}</td><td>{ratio}</td><td>{mx}</td>"
                     f"<td>{_e(', '.join(k.tainted_inputs))}</td></tr>")
    parts.append("</table></body></html>")
    return "".join(parts)


def write_html(path: str, report, title: str = "kdebug accuracy") -> None:
    """Writes the page atomically; refuses a symlinked path (Note [Safe writes])."""
    with _files.replaced_atomically(path) as f:
        f.write(render(report, title))
