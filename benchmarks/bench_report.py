"""HTML report benchmark (issue 5).

Records a real compiled training step (TinyBlock, forward + backward, C++
kernels on the CPU) under log_tensor_hashes(["bitwise", "norm"],
hash_inputs=True) -- the hashes ``kdebug hunt`` takes -- and writes two traces
of --launches kernel launches (the recorded steps repeated; the second with
one kernel's output perturbed halfway through, a planted fault), as a hunt
directory.  Then measures:

  - ``kdebug report DIR -o report.html`` (in process): seconds and bytes;
  - opening the report in headless Chromium (Playwright, Debian's chromium):
    navigation start to the page's ``window.kdReady`` (data inflated, summary,
    timeline, plot and table drawn), the time a search over the table takes
    to redraw, and a sort of all rows by name; whether the summary names the
    planted kernel;
  - for scale, ``kdebug export --perfetto`` of one run.

    python benchmarks/bench_report.py [--launches 100000] [--no-browser]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time

import torch

from bench_compare import record, write  # the same recorded steps and trace writer
from kdebug.export import export_perfetto
from kdebug.report import write_html
from kdebug.workloads import TinyBlock, train_step_fn

HASHES = ["bitwise", "norm"]  # what kdebug hunt records


def browser_times(path: str, planted: str, shot: str | None) -> dict:
    from playwright.sync_api import sync_playwright

    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=exe, args=["--no-sandbox"])
        page = b.new_page(viewport={"width": 1400, "height": 1000})
        errors = []
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        t0 = time.perf_counter()
        page.goto("file://" + os.path.abspath(path))
        page.wait_for_function("window.kdReady !== undefined", timeout=60000)
        wall = time.perf_counter() - t0
        ready_ms = page.evaluate("window.kdReady")  # since navigation start
        phases = page.evaluate("window.kdPhases")
        script_start_ms = ready_ms - page.evaluate("window.kdLoadMs")
        summary = page.inner_text("#summary")
        before = page.inner_text("#tbl-count")
        t1 = time.perf_counter()
        page.fill("#search", "layer_norm")
        page.wait_for_function(f"document.getElementById('tbl-count').textContent !== {json.dumps(before)}")
        search_s = time.perf_counter() - t1 - 0.12  # minus the input debounce
        page.fill("#search", "")
        page.wait_for_function(f"document.getElementById('tbl-count').textContent === {json.dumps(before)}")
        t2 = time.perf_counter()
        page.click("#tbl-head div[data-key=name]")
        page.wait_for_function("document.querySelector('#tbl-head div[data-key=name]').textContent.endsWith('▲')")
        sort_s = time.perf_counter() - t2
        if shot:
            page.screenshot(path=shot)
        b.close()
    return {"interactive_ms": ready_ms, "script_start_ms": script_start_ms, "phases_ms": phases, "wall_to_ready_s": wall, "search_redraw_s": max(search_s, 0.0),
            "sort_by_name_s": sort_s, "rows": before,
            "console_errors": errors, "summary_names_planted": planted in summary}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--launches", type=int, default=100_000)
    p.add_argument("--steps", type=int, default=20, help="recorded steps per repeated block")
    p.add_argument("--no-browser", action="store_true")
    p.add_argument("--traces", metavar="DIR", default=None,
                   help="keep the two traces (a hunt directory) in DIR, and reuse them when DIR has them")
    p.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "report_cpu.json"))
    a = p.parse_args()
    tmp = a.traces or tempfile.mkdtemp(prefix="kdebug-bench-report-")
    info = os.path.join(tmp, "bench.json")
    if a.traces and os.path.exists(info):
        with open(info) as f:
            n, name = json.load(f)
    else:
        os.makedirs(tmp, exist_ok=True)
        torch.manual_seed(0)
        model = TinyBlock(d=64, heads=4)
        x = torch.randn(2, 16, 64)
        step = train_step_fn(model)
        step(x)
        base = record(step, x, a.steps, hash_fn=HASHES)
        kernels = base.kernels
        per_part = len(kernels)
        k = kernels[len(kernels) // 2]
        name, arg = k.kernel_name, k.written[0]
        bad = record(step, x, a.steps, fault=(name, arg, a.steps // 2), hash_fn=HASHES)
        reps = -(-a.launches // per_part)
        n = write(os.path.join(tmp, "run0.kdt"), lambda i: base, per_part, a.launches)
        write(os.path.join(tmp, "run1.kdt"), lambda i: bad if i == reps // 2 else base, per_part, a.launches)
        with open(info, "w") as f:
            json.dump([n, name], f)
    html = os.path.join(tmp, "report.html")
    times, st = [], None
    for _ in range(3):
        t0 = time.perf_counter()
        st = write_html(html, [tmp])
        times.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    ex = export_perfetto(os.path.join(tmp, "run0.kdt"), os.path.join(tmp, "run0.json"))
    export_s = time.perf_counter() - t0
    res = {
        "machine": platform.processor() or platform.machine(), "torch": torch.__version__,
        "launches_per_run": n, "records": st["records"], "runs": st["runs"],
        "report_s": times, "report_s_best": min(times), "report_bytes": st["bytes"],
        "verdict": st["verdict"], "planted": name,
        "perfetto_s": export_s, "perfetto_bytes": ex["bytes"], "perfetto_events": ex["events"],
    }
    if not a.no_browser:
        try:
            res["browser"] = browser_times(html, name, os.path.join(os.path.dirname(a.out), "report_100k.png"))
        except Exception as e:  # no playwright / chromium: say so in the results
            res["browser"] = {"skipped": f"{type(e).__name__}: {e}"}
    print(json.dumps(res, indent=1))
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)
    if not a.traces:
        shutil.rmtree(tmp)
    else:
        os.remove(html)


if __name__ == "__main__":
    sys.exit(main())
