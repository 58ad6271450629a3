"""The HTML report and the Perfetto export (issue 5), on real Inductor C++
kernels: a run with a planted fault (one kernel's output perturbed), a run
with an extra kernel (a structural difference).  The browser tests drive
headless Chromium (Debian's chromium, through Playwright) and keep a
screenshot in $KDEBUG_ARTIFACTS (default build/test-artifacts)."""
from __future__ import annotations

import json
import os
import re
import shutil

import pytest
import torch

import kdebug
from kdebug import DebugMode, report
from kdebug.cli import main as cli
from kdebug.export import export_perfetto
from kdebug.testing import perturb_kernel_output
from kdebug.workloads import TinyBlock, train_step_fn

ARTIFACTS = os.environ.get("KDEBUG_ARTIFACTS",
                           os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                        "build", "test-artifacts"))


def _record(fns, fault=None):
    torch.manual_seed(0)
    with DebugMode() as dm, DebugMode.log_tensor_hashes(["bitwise", "norm"], hash_inputs=True):
        if fault is None:
            for f in fns:
                f()
        else:
            with perturb_kernel_output(*fault) as hit:
                for f in fns:
                    f()
            assert hit["hits"] == 1
    dm.operators  # noqa: B018
    return dm


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """run0 / run1 (planted fault in kernel #3) in a hunt-like directory, and
    two / extra (an extra kernel between two steps)."""
    d = tmp_path_factory.mktemp("report")
    torch.manual_seed(0)
    model = TinyBlock(d=32, heads=4)
    x = torch.randn(2, 8, 32)
    step = train_step_fn(model)
    step(x)
    extra_fn = torch.compile(lambda t: (t * 3).sin() + 1)
    extra_fn(x)
    base = _record([lambda: step(x)])
    planted = base.kernels[3].kernel_name
    bad = _record([lambda: step(x)], fault=(planted, "out_ptr0"))
    hunt = d / "hunt"
    hunt.mkdir()
    base.save(str(hunt / "run0.kdt"))
    bad.save(str(hunt / "run1.kdt"))
    two = _record([lambda: step(x), lambda: step(x)])
    extra = _record([lambda: step(x), lambda: extra_fn(x), lambda: step(x)])
    two.save(str(d / "two.kdt"))
    extra.save(str(d / "extra.kdt"))
    return {"dir": d, "hunt": hunt, "planted": planted, "base": base,
            "extra_kernel": extra.kernels[len(base.kernels)].kernel_name}


def test_report_data_marks_root_and_inherited_as_the_comparison_does(runs):
    paths, _ = report.resolve_inputs([str(runs["hunt"])])  # no hunt.json: run*.kdt in order
    assert [os.path.basename(p) for p in paths] == ["run0.kdt", "run1.kdt"]
    meta, blob = report.build(paths)
    rep = kdebug.compare(*paths)
    c = meta["comparisons"][0]
    d = c["divergence"]
    assert c["verdict"] == "output divergence" and not c["ok"]
    assert d["a"]["name"] == runs["planted"] and d["arg"] == "out_ptr0"
    assert d["inherited"] == len(rep.divergence.inherited) > 0
    assert c["text"] == str(rep)
    r1 = meta["runs"][1]
    flags = torch.frombuffer(bytearray(blob[r1["flags"][0]:r1["flags"][0] + r1["flags"][1]]), dtype=torch.uint8)
    peer = torch.frombuffer(bytearray(blob[r1["peer"][0]:r1["peer"][0] + r1["peer"][1]]), dtype=torch.int32)
    spread = torch.frombuffer(bytearray(blob[r1["spread"][0]:r1["spread"][0] + r1["spread"][1]]),
                              dtype=torch.float32)
    root = rep.divergence.step_b.index
    assert (flags & report.ROOT).nonzero().flatten().tolist() == [root]
    diff = (flags & report.DIFF).nonzero().flatten().tolist()
    assert diff[0] == root and len(diff) == 1 + d["inherited"]
    assert diff[1:] == [b.index for _, b in rep.divergence.inherited]
    assert (flags & report.UNALIGNED).sum() == 0 and peer.tolist() == list(range(len(peer)))
    # the planted kernel rewrote all of out_ptr0 (its only output): all its written bytes differ
    assert spread[root] == 1.0 and spread[:root].sum() == 0
    assert r1["kernels"] == len(runs["base"].kernels)
    # the rows carry the recorded launches: kernel names by shared string id
    names = [meta["strings"][i] for i in _names(blob, r1)]
    assert names[root] == runs["planted"]


def _names(blob: bytes, run: dict) -> list[int]:
    off, n = run["rec"]
    rows = torch.frombuffer(bytearray(blob[off:off + n]), dtype=torch.int32).view(-1, report.REC_BYTES // 4)
    return rows[:, 2].tolist()


def test_report_structural_difference_is_unaligned_and_listed(runs):
    d = runs["dir"]
    meta, blob = report.build([str(d / "two.kdt"), str(d / "extra.kdt")])
    c = meta["comparisons"][0]
    assert c["segments_total"] >= 1 and c["structural"]
    tag, i1, i2, j1, j2 = c["segments"][0]
    assert tag == "insert" and i1 == i2 and j2 > j1
    r1 = meta["runs"][1]
    flags = torch.frombuffer(bytearray(blob[r1["flags"][0]:r1["flags"][0] + r1["flags"][1]]), dtype=torch.uint8)
    unal = (flags & report.UNALIGNED).nonzero().flatten().tolist()
    assert unal == list(range(j1, j2))
    names = [meta["strings"][i] for i in _names(blob, r1)]
    assert runs["extra_kernel"] in [names[j] for j in unal]


def test_report_html_is_self_contained(runs, tmp_path):
    out = tmp_path / "r.html"
    st = report.write_html(str(out), [str(runs["hunt"])])
    page = out.read_text()
    assert st["bytes"] == out.stat().st_size and st["runs"] == 2
    assert st["verdict"] == ["output divergence"]
    # no external scripts, styles, fonts, images or requests
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", page, re.I)
    assert "<link" not in page.lower() and "@import" not in page and "@font-face" not in page
    assert not re.search(r"url\(\s*['\"]?(https?:)?//", page)
    assert "fetch(" not in page and "XMLHttpRequest" not in page
    meta = json.loads(re.search(r'<script id="kd-meta" type="application/json">(.*?)</script>', page, re.S)[1])
    assert meta["comparisons"][0]["divergence"]["a"]["name"] == runs["planted"]


def test_markup_in_a_trace_string_keeps_the_page_s_data_valid_json(runs, tmp_path):
    """An HTML comment opener in any string the page carries (a source line's
    comment in a kernel's provenance, a script argument) was written "<\\!--",
    which is no JSON escape: JSON.parse failed and the page was blank (found
    by an adversarial pass).  Every "<", ">" and "&" is a \\u escape now: the
    data reads back the same, and nothing in it can close or comment out
    the script element."""
    inputs, found = report.resolve_inputs([str(runs["hunt"])])
    meta, blob = report.build(inputs, hunt=found or None)
    hostile = "scale <!-- keep in sync --> </script><script>x=1</script> & <b>"
    meta["workload"] = hostile
    meta["runs"][0]["label"] = hostile
    meta["strings"] = [s + hostile if s else s for s in meta["strings"]]
    page = report.render(meta, blob)
    data = re.search(r'<script id="kd-meta" type="application/json">(.*?)</script>', page, re.S)[1]
    assert "<" not in data and ">" not in data
    back = json.loads(data)  # what JSON.parse reads: Python's json refuses "\\!" as JSON.parse does
    assert back["workload"] == hostile and back["runs"][0]["label"] == hostile
    assert back == json.loads(json.dumps(meta))


def test_single_run_report(runs, tmp_path):
    meta, _ = report.build([str(runs["hunt"] / "run0.kdt")])
    assert meta["comparisons"] == [] and meta["runs"][0]["kernels"] == len(runs["base"].kernels)
    assert cli(["report", str(runs["hunt"] / "run0.kdt"), "-o", str(tmp_path / "one.html")]) == 0


def test_cli_report_diff_html_and_errors(runs, tmp_path, capsys):
    h = runs["hunt"]
    assert cli(["report", str(h), "-o", str(tmp_path / "a.html")]) == 0
    assert "wrote" in capsys.readouterr().out
    assert cli(["diff", str(h / "run0.kdt"), str(h / "run1.kdt"), "--html", str(tmp_path / "b.html")]) == 1
    assert (tmp_path / "b.html").stat().st_size > 10000
    bad = tmp_path / "bad.kdt"
    bad.write_bytes(b"not a trace at all")
    capsys.readouterr()
    assert cli(["report", str(bad), "-o", str(tmp_path / "c.html")]) == 2
    err = capsys.readouterr().err
    assert "byte 0" in err and "not a kdebug trace" in err and not (tmp_path / "c.html").exists()
    assert cli(["report", str(tmp_path / "missing.kdt"), "-o", str(tmp_path / "c.html")]) == 2
    assert "no such trace file or hunt directory" in capsys.readouterr().err
    empty = tmp_path / "empty"
    empty.mkdir()
    assert cli(["report", str(empty), "-o", str(tmp_path / "c.html")]) == 2
    assert "kdebug hunt --keep" in capsys.readouterr().err
    assert cli(["export", "--perfetto", str(bad), "-o", str(tmp_path / "x.json")]) == 2


def test_perfetto_export(runs, tmp_path):
    src = runs["hunt"] / "run1.kdt"
    out = tmp_path / "run.json"
    st = export_perfetto(str(src), str(out))
    doc = json.loads(out.read_text())
    ev = doc["traceEvents"]
    run = kdebug.load(str(src))
    kernels = run.kernels
    slices = [e for e in ev if e["ph"] == "X"]
    assert st["launches"] == len(slices) == len(kernels)
    assert [e["name"] for e in slices] == [k.kernel_name for k in kernels]
    for e, k in zip(slices, kernels):
        assert e["cat"] == "cpp" and e["dur"] > 0 and e["ts"] >= 0
        assert e["args"]["kernel #"] == k.launch_index
        assert list(e["args"]["args"]) == list(k.arg_names)
    ts = [e["ts"] for e in slices]
    assert ts == sorted(ts)
    planted = next(e for e in slices if e["name"] == runs["planted"])
    out_arg = planted["args"]["args"]["out_ptr0"]
    want = f"0x{kernels[3].post_hashes['out_ptr0'][0] & (2**64 - 1):016x}"
    assert out_arg.startswith("W f32[") and f"post bitwise {want}" in out_arg and "norm " in out_arg
    ops = [e for e in ev if e["ph"] == "i"]
    assert len(ops) == len(run) - len(kernels) and all(o["cat"] == "aten" for o in ops)
    names = {(e["pid"], e["args"]["name"]) for e in ev if e["ph"] == "M" and e["name"] == "process_name"}
    assert (1, "cpu") in names
    assert cli(["export", "--perfetto", str(src), "-o", str(tmp_path / "cli.json")]) == 0


# ---------------------------------------------------------------- in a real browser


@pytest.fixture(scope="module")
def browser():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("Playwright is not installed (pip install -e '.[test]' installs it)")
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        pytest.skip("no Chromium: install Debian's chromium package (sh tools/setup.sh does) to run the browser tests")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=exe, args=["--no-sandbox"])
        yield b
        b.close()


def _open(browser, path):
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    problems, requests = [], []
    page.on("console", lambda m: problems.append(f"console.{m.type}: {m.text}") if m.type in ("error", "warning") else None)
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    page.on("request", lambda r: requests.append(r.url))
    page.goto("file://" + str(path))
    page.wait_for_function("window.kdReady !== undefined", timeout=30000)
    return page, problems, requests


def test_report_in_chromium(runs, browser, tmp_path):
    out = tmp_path / "report.html"
    report.write_html(str(out), [str(runs["hunt"])])
    page, problems, requests = _open(browser, out)
    planted = runs["planted"]
    assert page.inner_text("#root-name").endswith(planted)
    summary = page.inner_text("#summary")
    assert "output divergence" in summary and "runs diverge" in summary and "inherited the difference" in summary
    # search filters the table; status:root finds the one root cause
    n_all = int(page.inner_text("#tbl-count").split(" of ")[1].split()[0])
    page.fill("#search", "status:root")
    page.wait_for_function("document.getElementById('tbl-count').textContent.startsWith('1 of')")
    row = page.locator(".trow:visible").first
    assert planted in row.inner_text() and "first divergence" in row.inner_text()
    page.fill("#search", "native_layer_norm")
    page.wait_for_function("!document.getElementById('tbl-count').textContent.startsWith('1 of')")
    shown = int(page.inner_text("#tbl-count").split()[0])
    assert 0 < shown < n_all
    visible = page.locator(".trow:visible")
    assert visible.count() == min(shown, visible.count()) and visible.count() > 0
    for k in range(visible.count()):
        assert "native_layer_norm" in visible.nth(k).inner_text()
    # sort by name: the rows shown are in order
    page.fill("#search", "")
    page.wait_for_function(f"document.getElementById('tbl-count').textContent.startsWith('{n_all} of')")
    page.click("#tbl-head div[data-key=name]")
    names = [page.locator(".trow:visible").nth(k).locator("div").nth(3).inner_text() for k in range(8)]
    assert names == sorted(names) and names[0].startswith("aten::")
    # sort by "% differ", descending: the differing rows come first
    page.fill("#search", "")
    page.wait_for_function(f"document.getElementById('tbl-count').textContent.startsWith('{n_all} of')")
    page.click("#tbl-head div[data-key=spread]")
    assert page.locator(".trow:visible").first.locator("div").nth(7).inner_text() == "100.0"
    # hover over the root-cause marker on run 1's timeline row: the tooltip names it
    page.locator("#timeline").scroll_into_view_if_needed()
    x, y = page.evaluate("""() => { const r = RUNS[1], i = r.marks[0], cv = document.getElementById('timeline')
        .getBoundingClientRect(), PW = TL.width - 62; return [cv.left + 56 + (i - TL.x0) / (TL.span / PW) + 1,
        cv.top + 24 + TL.rowH + 14]; }""")
    page.mouse.move(x, y)
    tip = page.locator("#tooltip")
    tip.wait_for(state="visible")
    text = tip.inner_text()
    assert planted in text and "first divergence" in text and "out_ptr0" in text and "run 0:" in text
    # zoom in with the wheel, back out, then to the root cause: the range shown narrows
    full = f"showing 0–{n_all} of {n_all}"
    assert page.inner_text("#tl-range") == full
    page.mouse.wheel(0, -400)
    page.wait_for_function(f"document.getElementById('tl-range').textContent !== {json.dumps(full)}")
    page.click("#zoom-fit")
    assert page.inner_text("#tl-range") == full
    page.click("#zoom-root")
    lo, hi = map(int, page.inner_text("#tl-range").split()[1].split("–"))
    root = page.evaluate("RUNS[1].marks[0]")
    assert lo <= root <= hi and hi - lo < n_all
    x, y = page.evaluate("""() => { const r = RUNS[1], i = r.marks[0], cv = document.getElementById('timeline')
        .getBoundingClientRect(), PW = TL.width - 62; return [cv.left + 56 + (i - TL.x0) / (TL.span / PW) + 1,
        cv.top + 24 + TL.rowH + 14]; }""")
    os.makedirs(ARTIFACTS, exist_ok=True)
    page.mouse.move(x, y)
    tip.wait_for(state="visible")
    page.screenshot(path=os.path.join(ARTIFACTS, "report-tooltip.png"))  # the viewport, tooltip shown
    page.screenshot(path=os.path.join(ARTIFACTS, "report.png"), full_page=True)
    assert problems == []
    assert all(u.startswith(("file:", "data:", "blob:")) for u in requests), requests
    page.close()


def test_structural_report_in_chromium(runs, browser, tmp_path):
    d = runs["dir"]
    out = tmp_path / "struct.html"
    report.write_html(str(out), [str(d / "two.kdt"), str(d / "extra.kdt")])
    page, problems, _ = _open(browser, out)
    text = page.inner_text("#structure")
    assert "run 1 vs run 0" in text and runs["extra_kernel"] in text and "insert" in text
    assert problems == []
    page.close()


# ---------------------------------------------------------------- runs with no kernel launch


@pytest.fixture(scope="module")
def launchless(tmp_path_factory):
    """Traces with no kernel launch: an eager-only run (aten ops only), a run
    that recorded nothing, and a file cut off right after its header."""
    d = tmp_path_factory.mktemp("launchless")
    with DebugMode() as dm, DebugMode.log_tensor_hashes("bitwise", hash_inputs=True):
        (torch.arange(8.0) * 2).sum()
    dm.save(str(d / "eager.kdt"))
    with DebugMode() as empty:
        pass
    empty.save(str(d / "empty.kdt"))
    with open(d / "eager.kdt", "rb") as f:
        head = f.read(40)
    (d / "cut.kdt").write_bytes(head)
    return d


@pytest.mark.parametrize("name", ["eager", "empty", "cut"])
def test_report_and_export_of_runs_without_launches(launchless, name, tmp_path, capsys):
    import warnings

    trace = str(launchless / f"{name}.kdt")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", kdebug.KdebugWarning)  # the cut file warns that it is incomplete
        assert cli(["report", trace, trace, "-o", str(tmp_path / "r.html")]) == 0
        # the cut file is an incomplete recording, the empty one hashed nothing: matching, they get no
        # verdict (Note [A match needs whole recordings]); the page is still written
        assert cli(["diff", trace, trace, "--html", str(tmp_path / "d.html")]) == (0 if name == "eager" else 2)
        assert (tmp_path / "d.html").exists()
        assert cli(["export", "--perfetto", trace, "-o", str(tmp_path / "p.json")]) == 0
    out = capsys.readouterr().out
    assert "wrote" in out and "Traceback" not in out
    meta, _ = report.build([trace, trace])
    ops = {"eager": 3, "empty": 0, "cut": 0}[name]
    assert [r["kernels"] for r in meta["runs"]] == [0, 0] and [r["ops"] for r in meta["runs"]] == [ops, ops]
    events = json.loads((tmp_path / "p.json").read_text())["traceEvents"]
    assert sum(1 for e in events if e.get("cat") == "aten") == ops


def test_report_of_a_run_without_launches_in_chromium(launchless, browser, tmp_path):
    out = tmp_path / "eager.html"
    trace = str(launchless / "eager.kdt")
    report.write_html(str(out), [trace, trace])
    page, problems, _ = _open(browser, out)
    assert "match" in page.inner_text("#summary")
    assert problems == []
    page.close()


def test_page_gives_the_text_reports_cause_of_a_differing_python_number(browser, tmp_path):
    """The page's cause of the first divergence is the text report's: an
    eager add given another Python float (computed from time in a real
    program) read 'no recorded launch wrote it: it came from outside the
    recorded launches (a graph input, RNG, ...)' on the page while the text
    said the program passed another Python number (a trust pass)."""
    x = torch.randn(6, 24, generator=torch.Generator().manual_seed(0))
    paths = []
    for i, v in enumerate((1.9e-08, 2.6e-07)):
        path = tmp_path / f"r{i}.kdt"
        with DebugMode(trace=str(path)), DebugMode.log_tensor_hashes("bitwise", hash_inputs=True):
            (x * 1.0 + v).sum().item()
        paths.append(str(path))
    out = tmp_path / "page.html"
    report.write_html(str(out), paths)
    page, problems, _ = _open(browser, out)
    summary = page.inner_text("#summary")
    assert "another Python number or shape" in summary, summary
    assert "from outside the recorded launches" not in summary, summary
    assert problems == []
    page.close()
