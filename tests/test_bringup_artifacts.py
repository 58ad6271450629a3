"""Compile artifacts (Note [Compile artifacts]), kdebug list / clean (Note
[Cleaning artifacts]) and the bring-up HTML report: real torch.compile on
the CPU."""
from __future__ import annotations

import html.parser
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import kdebug
import kdebug.backends as kb
from kdebug import _files, cli
from kdebug.artifacts import ArtifactRun

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(autouse=True)
def fresh():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, x):
        return torch.relu(self.proj(x)).sin().sum()


def _read(p) -> str:
    with open(p, encoding="utf-8") as f:
        return f.read()


def test_capture_writes_forward_and_backward_in_the_documented_layout(tmp_path):
    root = tmp_path / "arts"
    with kdebug.capture_artifacts(str(root)) as cap:
        loss = torch.compile(Net())(torch.randn(4, 8))
        loss.backward()  # the backward graph is lowered here, lazily, under the same compile id
    run = cap.run_dir
    assert os.path.dirname(run) == str(root)
    manifest = json.loads(_read(os.path.join(run, "manifest.json")))
    assert manifest["format"] == "kdebug-artifacts" and manifest["run_id"] == os.path.basename(run)
    assert manifest["complete"] is True and manifest["dropped"] == 0
    assert list(manifest["compiles"]) == ["0_0"] and manifest["compiles"]["0_0"]["compile_id"] == "0/0"
    c = os.path.join(run, "0_0")
    for name in ("dynamo_graph.py", "forward.py", "backward.py", "ir_post_grad_forward.txt",
                 "ir_post_grad_backward.txt", "ir_post_fusion_forward.txt", "ir_post_fusion_backward.txt",
                 "output_code_forward.py", "output_code_backward.py", "meta.json"):
        assert os.path.getsize(os.path.join(c, name)) > 0, name
    assert "torch.relu" in _read(os.path.join(c, "dynamo_graph.py"))  # torch-level, before AOTAutograd
    assert "aten.sin" in _read(os.path.join(c, "forward.py"))
    assert "aten.cos" in _read(os.path.join(c, "backward.py"))  # d/dx sin is cos: only in the backward
    assert "aten.cos" not in _read(os.path.join(c, "forward.py"))
    meta = json.loads(_read(os.path.join(c, "meta.json")))
    assert meta["compile_id"] == "0/0" and meta["stages"] == ["forward", "backward"] and meta["missing"] == []
    for stage in ("forward", "backward"):
        kdir = os.path.join(c, "kernels", stage)
        kernels = sorted(os.listdir(kdir))
        assert kernels and all(k.endswith(".cpp") for k in kernels)
        code = _read(os.path.join(c, f"output_code_{stage}.py"))
        for k in kernels:  # each kernel file is that kernel's source, as the generated module holds it
            assert f"{k[:-4]} = async_compile" in code
            assert _read(os.path.join(kdir, k)).strip("\n") in code
        assert set(meta["kernels"][stage]) == {k[:-4] for k in kernels}
    for rel, size in meta["files"].items():  # sizes recorded are the files' sizes
        assert os.path.getsize(os.path.join(c, rel)) == size


def test_constrained_backend_writes_artifacts_and_refuses_a_link(tmp_path):
    caps = kb.AcceleratorCapabilities(dtypes={"float32", "bool"})
    backend = kb.constrained(caps, mode="warn", then="eager", artifacts=str(tmp_path / "arts"), use_env=False)
    torch.compile(Net(), backend=backend)(torch.randn(4, 8)).backward()
    c = os.path.join(backend.artifacts.run_dir, "0_0")
    assert {"dynamo_graph.py", "forward.py", "backward.py", "meta.json"} <= set(os.listdir(c))
    assert "aten.cos" in _read(os.path.join(c, "backward.py"))
    os.symlink(tmp_path / "arts", tmp_path / "link")
    with pytest.raises(ValueError, match="symbolic link"):
        kb.constrained(caps, artifacts=str(tmp_path / "link"), use_env=False)
    with pytest.raises(_files.LinkRefused):
        kdebug.capture_artifacts(str(tmp_path / "link")).__enter__()


def test_names_from_the_program_are_sanitized():
    from kdebug.artifacts import compile_dir_name, safe_name

    assert safe_name("../../etc/passwd") == "_.._etc_passwd"
    assert safe_name("<script>") == "_script_" and safe_name("") == "_" and safe_name("...") == "_"
    assert compile_dir_name("0/1") == "0_1" and compile_dir_name("!0/1/2") == "ca_0_1_2"


# ---------------------------------------------------------------- list / clean

def _run(root, run_id, created):
    r = ArtifactRun(str(root), run_id=run_id)
    r.add_graph("0/0", "dynamo_output_graph", "class GraphModule: pass\n")
    r.created = created
    r.close()
    return r.run_dir


def _cli(capsys, *argv):
    rc = cli.main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_list_shows_runs_compiles_and_sizes(tmp_path, capsys):
    run = _run(tmp_path, "r1", 1000.0)
    rc, out, _ = _cli(capsys, "list", str(tmp_path), "--json")
    assert rc == 0
    data = json.loads(out)
    (r,) = data["runs"]
    assert r["run_id"] == "r1" and r["problem"] is None and r["complete"] is True
    (c,) = r["compiles"]
    sizes = {f["path"]: f["bytes"] for f in c["files"]}
    assert sizes["dynamo_graph.py"] == len("class GraphModule: pass\n")
    assert sizes["meta.json"] == os.path.getsize(os.path.join(run, "0_0", "meta.json"))
    rc, out, _ = _cli(capsys, "list", str(tmp_path), "--files")
    assert rc == 0 and "r1" in out and "0_0 (compile 0/0)" in out and "dynamo_graph.py" in out


def test_clean_deletes_only_kdebug_runs(tmp_path, capsys):
    old, mid, new = _run(tmp_path, "old", 1000.0), _run(tmp_path, "mid", 2000.0), _run(tmp_path, "new", 3000.0)
    mine = tmp_path / "mine"  # the user's own directory beside the runs
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    rc, out, _ = _cli(capsys, "clean", str(tmp_path), "--dry-run")
    assert rc == 0 and "would delete 3 run(s)" in out
    assert all(os.path.isdir(p) for p in (old, mid, new))
    rc, out, _ = _cli(capsys, "clean", str(tmp_path), "--keep", "2")
    assert rc == 0 and not os.path.exists(old) and os.path.isdir(mid) and os.path.isdir(new)
    rc, out, _ = _cli(capsys, "clean", str(tmp_path), "--older-than", "1")  # created in 1970: older than a day
    assert rc == 0 and not os.path.exists(mid) and not os.path.exists(new)
    assert (mine / "notes.txt").read_text() == "keep me" and "left mine" in out


def test_clean_refuses_foreign_dirs_links_and_unnamed_contents(tmp_path, capsys):
    plain = tmp_path / "plain"
    (plain / "sub").mkdir(parents=True)
    (plain / "sub" / "f.txt").write_text("x")
    rc, _, err = _cli(capsys, "clean", str(plain))
    assert rc == 2 and "no kdebug artifact run" in err and (plain / "sub" / "f.txt").exists()

    arts = tmp_path / "arts"
    run = _run(arts, "r1", 1000.0)
    os.symlink(arts, tmp_path / "artslink")
    rc, _, err = _cli(capsys, "clean", str(tmp_path / "artslink"))
    assert rc == 2 and "symbolic link" in err and os.path.isdir(run)

    outside = tmp_path / "outside"  # a run directory linked in from elsewhere is not followed
    other = _run(outside, "r2", 1000.0)
    os.symlink(other, arts / "r2")
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    os.symlink(victim, os.path.join(run, "0_0", "evil"))  # a link inside a run: removed, never followed
    fake = arts / "r3"  # a manifest from someone else's tool
    fake.mkdir()
    (fake / "manifest.json").write_text(json.dumps({"format": "other", "run_id": "r3"}))
    extra = _run(arts, "r4", 1000.0)
    with open(os.path.join(extra, "user.txt"), "w") as f:
        f.write("not kdebug's")
    rc, out, _ = _cli(capsys, "clean", str(arts))
    assert rc == 0 and not os.path.exists(run)
    assert victim.read_text() == "precious"
    assert os.path.isdir(other) and os.path.islink(arts / "r2") and "left r2: a symbolic link" in out
    assert (fake / "manifest.json").exists() and "left r3" in out
    assert os.path.exists(os.path.join(extra, "user.txt")) and "left r4" in out and "user.txt" in out


# ---------------------------------------------------------------- the HTML report

SCRIPT = """\
import torch
import kdebug.backends as kb

caps = kb.AcceleratorCapabilities(dtypes={"float32"})
backend = kb.constrained(caps, mode="warn", then="eager", use_env=False)

def encoder(x):
    return (x.double() * 2).sum()  # <script>alert('enc')</script>

def decoder(x):
    return x.to(torch.float16) + 1

torch.compile(encoder, backend=backend)(torch.randn(8, 8))
torch.compile(decoder, backend=backend)(torch.randn(8, 8))
"""

BENCH = {"device": "cpu", "rows": [
    {"model": "<script>alert(1)</script>", "backend": "eager", "compile_s": 0.0, "latency_ms_mean": 10.0,
     "latency_ms_std": 0.5, "graphs": 0, "graph_breaks": 0, "violations": 0, "accuracy": {"status": "pass"}},
    {"model": "<script>alert(1)</script>", "backend": "inductor", "latency_ms_mean": 4.0,
     "accuracy": {"status": "fail", "max_abs": 0.25}},
    {"model": "ssm", "backend": "inductor", "latency_ms_mean": 3.0},
]}


class _Tags(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags, self.rows, self.h3 = [], [], []
        self._row, self._in_h3 = None, False

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        if tag == "tr":
            self._row = []
        self._in_h3 = tag == "h3"
        if tag == "h3":
            self.h3.append("")

    def handle_endtag(self, tag):
        if tag == "tr" and self._row is not None:
            self.rows.append(self._row)
            self._row = None
        if tag == "h3":
            self._in_h3 = False

    def handle_data(self, data):
        if self._row is not None:
            self._row.append(data)
        if self._in_h3:
            self.h3[-1] += data


def test_analyze_html_groups_violations_by_model_and_escapes(tmp_path):
    (tmp_path / "script.py").write_text(textwrap.dedent(SCRIPT))
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps(BENCH))
    proc = subprocess.run([sys.executable, "-m", "kdebug", "analyze", "--type", "summary", "--html", "r.html",
                           "--json", "r.json", "--bench", str(bench), "script.py"], capture_output=True, text=True,
                          cwd=str(tmp_path), env={**os.environ, "PYTHONPATH": REPO})
    assert proc.returncode == 1, proc.stderr[-3000:]  # violations found
    page = (tmp_path / "r.html").read_text()
    assert "<script" not in page.lower() and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "&lt;script&gt;alert(&#x27;enc&#x27;)" in page  # the user's source line, escaped
    p = _Tags()
    p.feed(page)
    assert "script" not in p.tags
    by_model = [h for h in p.h3 if "violation(s)" in h]
    assert len(by_model) == 2
    enc = next(h for h in by_model if h.startswith("encoder"))
    dec = next(h for h in by_model if h.startswith("decoder"))
    assert "dtype" in enc and "dtype" in dec and "script.py:" in enc
    data = json.loads((tmp_path / "r.json").read_text())
    n = {m: sum(1 for v in data["constraints"]["violations"] if v["source"] and m in v["source"])
         for m in ("x.double()", "x.to(torch.float16)")}
    assert enc.startswith(f"encoder (") and f": {n['x.double()']} violation(s)" in enc
    assert f": {n['x.to(torch.float16)']} violation(s)" in dec
    rows = {(r[0], r[1]): r for r in p.rows if len(r) == 10}
    hostile = "<script>alert(1)</script>"
    assert rows[(hostile, "inductor")][4] == "2.50x"  # 10 ms eager / 4 ms
    assert rows[(hostile, "inductor")][2] == "—"  # compile_s missing: not invented
    assert rows[(hostile, "inductor")][8:] == ["fail", "0.25"]
    assert rows[("ssm", "inductor")][4] == "—" and rows[("ssm", "inductor")][8] == "—"  # no eager row, no accuracy
    assert data["benchmarks"][0]["rows"][2]["model"] == "ssm"


def test_files_nested_past_the_parser_or_with_odd_rows_are_reported_not_raised(tmp_path):
    """A manifest.json or benchmark file nested past the JSON parser's depth
    stopped `kdebug list` / `clean` / `analyze --bench` with a RecursionError,
    and a benchmark row whose model is a list with a TypeError (after the
    user's script had run): each is now a problem line."""
    from kdebug.artifacts_cli import read_run
    from kdebug.bringup_html import load_bench, speedups

    deep = "[" * 100000 + "]" * 100000
    run = tmp_path / "run1"
    run.mkdir()
    (run / "manifest.json").write_text(deep)
    info = read_run(str(run))
    assert "unreadable" in info.problem and "RecursionError" in info.problem
    (tmp_path / "deep.json").write_text(deep)
    b = load_bench(str(tmp_path / "deep.json"))
    assert b["rows"] == [] and "unreadable" in b["problem"]
    (tmp_path / "rows.json").write_text(json.dumps([
        {"model": ["resnet"], "backend": "eager", "latency_ms_mean": 2.0},
        {"model": "mlp", "backend": "eager", "latency_ms_mean": 4.0},
        {"model": "mlp", "backend": "inductor", "latency_ms_mean": 2.0}]))
    b = load_bench(str(tmp_path / "rows.json"))
    assert [r["model"] for r in b["rows"]] == ["mlp", "mlp"] and "1 row(s)" in b["problem"]
    assert speedups(b["rows"]) == [1.0, 2.0]


@pytest.mark.parametrize("argv", [["--older-than", "nan"], ["--older-than", "inf"], ["--older-than", "-1"],
                                  ["--keep", "-1"], ["--keep", "two"]])
def test_clean_refuses_a_number_that_means_nothing(tmp_path, capsys, argv):
    """--older-than nan was taken and deleted nothing, silently (noticed by an
    adversarial review); Note [Option values]."""
    _run(tmp_path, "r1", 1000.0)
    with pytest.raises(SystemExit) as e:
        cli.main(["clean", str(tmp_path), *argv])
    assert e.value.code == 2 and argv[0] in capsys.readouterr().err
    assert os.path.isdir(os.path.join(tmp_path, "r1"))
