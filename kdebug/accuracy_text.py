"""The accuracy verdict as text (kdebug accuracy, compare_eager, pytest), and
the one-line hints for known causes of compiled-vs-eager drift."""
from __future__ import annotations

import math

_REDUCTIONS = ("sum", "mean", "var_mean", "var", "amax", "amin", "prod", "argmax", "argmin", "cumsum",
               "logsumexp", "norm")
_ORDER_FREE = ("amax", "amin", "argmax", "argmin")  # the same result in any order of the elements
_TRANSCENDENTAL = ("exp", "log", "tanh", "erf", "sigmoid", "sin", "cos", "pow", "rsqrt", "sqrt", "gelu",
                   "expm1", "log1p", "atan", "softplus")
_DECOMPOSED = {"var_mean": "layer_norm / group_norm / batch_norm", "rsqrt": "layer_norm / rms_norm",
               "amax": "softmax / log_softmax", "erf": "gelu", "logsumexp": "log_softmax / cross_entropy"}


def _g(x) -> str:
    if x is None:
        return "-"
    if isinstance(x, float) and (math.isinf(x) or math.isnan(x)):
        return str(x)
    return f"{x:.3g}"


def _bases(nodes) -> set:
    out = set()
    for n in nodes:
        base = n.rstrip("0123456789").rstrip("_")
        out.add(base)
    return out


def hints(kernel, buffer) -> list[str]:
    """Known causes that fit this kernel: its fused nodes and its dtype.
    Empty when none does; a hint is a lead, not a finding."""
    out = []
    bases = _bases(kernel.nodes)
    dtype = buffer.diff.dtype if buffer is not None and buffer.diff is not None else ""
    if dtype in ("bfloat16", "float16"):
        out.append(f"{dtype} output: Inductor keeps intermediates of fused {dtype} code in float32 where eager "
                   "rounds each op; torch._inductor.config.emulate_precision_casts=True rounds as eager does")
    summed = bases & set(_REDUCTIONS) - set(_ORDER_FREE)
    if summed:
        out.append("a reduction (" + ", ".join(sorted(summed)) + "): the compiled kernel sums "
                   "in another order or splits it (torch._inductor.config.split_reductions=False keeps one pass)")
    if bases & set(_ORDER_FREE) and not summed:  # a max or min is the same in any order: its inputs differ
        out.append("a max / min (" + ", ".join(sorted(bases & set(_ORDER_FREE))) + ") does not depend on the order "
                   "of its elements: what differs is what it reads, computed in the fused code before it")
    if bases & set(_TRANSCENDENTAL):
        out.append("transcendental functions (" + ", ".join(sorted(bases & set(_TRANSCENDENTAL))) + "): "
                   "generated code may use faster approximations than eager's library kernels")
    dec = sorted({v for k, v in _DECOMPOSED.items() if k in bases})
    if dec:
        out.append("decomposed ops (" + "; ".join(dec) + "): Inductor computes these from a decomposition, "
                   "eager from one fused kernel")
    return out


def _buffer_line(b) -> str:
    d = b.diff
    r = d.ratio()
    ulp = f", max {d.max_ulp} ulp" if d.max_ulp is not None else ""
    nf = f", {d.nonfinite_introduced} NaN/Inf introduced" if d.nonfinite_introduced else ""
    return (f"{b.buffer} (FX node {b.node}, {d.dtype}{list(d.shape)}): error vs float64 {_g(r)}x eager's "
            f"(compiled RMS {_g(d.err_compiled)}, eager {_g(d.err_eager)}); vs eager max abs {_g(d.max_abs)}, "
            f"max rel {_g(d.max_rel)}, RMSE {_g(d.rmse)}, {d.mismatch_pct:.3g}% outside rtol={d.rtol:g} "
            f"atol={d.atol:g}{ulp}{nf}")


def culprit_lines(report) -> list[str]:
    k = report.culprit
    if k is None:
        return []
    where = f"graph {k.graph}" if k.graph else "a graph"
    lines = [f"CULPRIT: {k.kernel} ({k.kind}, {where}, call {k.index} of its graph)",
             "  computes worse than eager from inputs that matched eager within tolerance:"]
    worst = k.worst()
    for b in k.buffers:
        if b.diff is not None and b.worse(report.factor):
            lines.append("  " + _buffer_line(b))
            if b.local is not None:
                lines.append(f"    judged on its own inputs (eager and float64 from what the compiled kernels "
                             f"before it wrote): error {_g(b.local.ratio())}x eager's")
    if worst is not None and worst.diff is not None and worst.diff.worst_index is not None:
        c, e, r = worst.diff.worst_values
        lines.append(f"  worst element {worst.buffer}{list(worst.diff.worst_index)}: compiled {c!r}, eager {e!r}, "
                     f"float64 {r!r}")
    if k.nodes:
        lines.append("  fuses FX nodes: " + ", ".join(k.nodes))
    for s in k.source[:6]:
        lines.append("  user code: " + s)
    for h in hints(k, worst):
        lines.append("  hint: " + h)
    return lines


def summary(report) -> str:
    n_calls = len(report.kernels)
    lines = [f"kdebug accuracy: {report.graphs} graph(s), {report.graph_calls_checked} graph call(s) checked"
             + (f" ({report.graph_calls_unchecked} more run, not checked)" if report.graph_calls_unchecked else "")
             + f", {n_calls} kernel/extern call(s), {report.compared()} buffer(s) compared with eager and float64"]
    c = report.culprit
    if report.graph_calls_checked == 0:
        lines.append("NOTHING CHECKED: no compiled graph call could be checked (see the notes below); "
                     "this is not a verdict")
    elif c is not None:
        lines += culprit_lines(report)
        later = [k for k in report.kernels if k.status == "inherited"]
        if later:
            lines.append(f"  {len(later)} later call(s) inherited the difference (first: {later[0].kernel})")
        others = [k for k in report.kernels if k.status == "worse" and k is not c]
        if others:
            lines.append(f"  {len(others)} other root(s), also worse than eager from matching inputs: "
                         + ", ".join(f"{k.kernel} (graph {k.graph})" for k in others[:5]))
    elif report.compared() == 0:
        lines.append("NOTHING COMPARED: compiled graph calls were checked but no buffer their kernels wrote could "
                     "be compared with eager (see why below); this is not a verdict")
    elif report.no_verdict:  # Note [Output spill]: values over every budget could hide the culprit
        u, lost = report.unverified, report.unrecorded
        text = "NO VERDICT: no compared kernel computes worse than eager, but"
        if lost:
            text += (f" {len(lost)} call(s) wrote buffers over every budget, not recorded nor judged "
                     f"(first: {lost[0].kernel}, graph {lost[0].graph})")
        if u:
            text += (f"{' and' if lost else ''} {len(u)} call(s) outside tolerance of eager read such buffers "
                     f"(first: {u[0].kernel}), so whether they introduced the difference is unknown")
        lines.append(text + "; raise the budgets (--max-disk-bytes) to judge them")
    else:
        lines.append(f"no kernel computes worse than eager (factor {report.factor:g} against float64)")
        d = report.first_divergent
        if d is not None:
            w = d.worst()
            lines.append(f"  first kernel outside tolerance of eager from matching inputs: {d.kernel}, "
                         "no worse than eager against float64:")
            if w is not None and w.diff is not None:
                lines.append("  " + _buffer_line(w))
            for h in hints(d, w):
                lines.append("  hint: " + h)
    for o in report.outputs:
        if o.diff is None:
            lines.append(f"{o.path}: not compared ({o.why_not})")
        else:
            d = o.diff
            state = "within tolerance" if d.within_tolerance else f"{d.mismatch_pct:.3g}% outside tolerance"
            lines.append(f"{o.path}: {state} of eager (max abs {_g(d.max_abs)}, max rel {_g(d.max_rel)}; "
                         f"error vs float64 compiled {_g(d.err_compiled)}, eager {_g(d.err_eager)})")
    unchecked = sum(1 for k in report.kernels for b in k.buffers if b.diff is None)
    if unchecked:
        reasons: dict = {}
        for k in report.kernels:
            for b in k.buffers:
                if b.diff is None:
                    reasons[b.why_not] = reasons.get(b.why_not, 0) + 1
        lines.append(f"{unchecked} written buffer(s) not compared: "
                     + "; ".join(f"{n} {why}" for why, n in sorted(reasons.items(), key=lambda t: -t[1])))
    sp = getattr(report, "spill", None)
    if sp is not None and sp.spilled():  # Note [Output spill]
        lines.append(sp.line())
    lines += ["note: " + n for n in report.notes]
    return "\n".join(lines)
