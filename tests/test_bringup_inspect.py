"""kdebug.inspect_compile and kdebug analyze (Note [Compile inspector]):
real torch.compile on the CPU."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import kdebug

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(autouse=True)
def fresh():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def branchy(x):
    y = x.sin()
    if y.sum() > 0:  # data-dependent branch: a graph break
        return y * 2
    return y - 1


def test_data_dependent_branch_breaks_the_graph_with_its_user_line():
    rep = kdebug.inspect_compile(branchy, torch.randn(8))
    assert isinstance(rep, kdebug.CompileReport)
    assert rep.break_count == 1
    b = rep.graph_breaks[0]
    assert b.file == __file__ and b.code == "if y.sum() > 0:  # data-dependent branch: a graph break"
    assert b.line == branchy.__code__.co_firstlineno + 2
    assert "data-dependent" in b.reason.lower()
    # the function before the break and its resumption after it: two graphs
    assert rep.graph_count == 2
    assert [g.is_resume for g in rep.graphs] == [False, True]
    assert rep.recompiles == []
    assert all(g.guard_count and g.guards for g in rep.graphs)
    assert any(g.kind == "TENSOR_MATCH" and g.source == "L['x']" for g in rep.graphs[0].guards)
    json.dumps(rep.to_json())


def test_shape_change_recompiles_with_the_failing_guard_named():
    def f(x):
        return torch.relu(x) * 3
    cf = torch.compile(f, backend="eager")
    with kdebug.inspect_compile() as insp:
        cf(torch.randn(8))
        cf(torch.randn(8))  # same shape: guards pass, no compile
        cf(torch.randn(9))  # size guard fails
    rep = insp.report()
    assert [g.compile_id for g in rep.graphs] == ["0/0", "0/1"]
    assert len(rep.recompiles) == 1
    r = rep.recompiles[0]
    assert r.compile_id == "0/1" and r.function == "f"
    assert r.failed_guards == (("0/0", "tensor 'x' size mismatch at index 0. expected 8, actual 9"),)
    assert rep.graphs[1].recompile_reason and "size mismatch" in rep.graphs[1].recompile_reason
    text = rep.summary()
    assert "cached 0/0: tensor 'x' size mismatch at index 0. expected 8, actual 9" in text


def test_inspector_leaves_the_logger_as_it_found_it():
    from kdebug import _upstream

    log = _upstream.structured_trace_logger()
    before = list(log.handlers)
    with kdebug.inspect_compile():
        assert len(log.handlers) == len(before) + 1
    assert log.handlers == before
    with pytest.raises(TypeError, match="takes the function first"):
        kdebug.inspect_compile(None, 1)


SEED3 = """
import torch

def step(x):
    y = torch.tanh(x)
    if y.mean() > 0:
        y = y * 2
    return y.sum()

compiled = torch.compile(step, backend="eager")
compiled(torch.randn(4, 4))
compiled(torch.randn(5, 4))
"""

CONSTRAINED = """
import torch
import kdebug.backends as kb

caps = kb.AcceleratorCapabilities(name="npu", dtypes={"float32"}, alignment=8)
m = torch.nn.Linear(16, 12)
torch.compile(m, backend=kb.constrained(caps, mode="warn", then="eager"))(torch.randn(8, 16))
"""


def _analyze(tmp_path, script: str, *args: str):
    path = tmp_path / "script.py"
    path.write_text(textwrap.dedent(script))
    env = {**os.environ, "PYTHONPATH": REPO}
    return subprocess.run([sys.executable, "-m", "kdebug", "analyze", *args, str(path)], capture_output=True,
                          text=True, cwd=str(tmp_path), env=env)


def test_cli_analyze_guards_explains_breaks_and_recompiles(tmp_path):
    proc = _analyze(tmp_path, SEED3, "--type", "guards", "--json", str(tmp_path / "g.json"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "graph break(s)" in proc.stdout and "script.py:6: if y.mean() > 0:" in proc.stdout
    assert "size mismatch at index 0. expected 4, actual 5" in proc.stdout
    assert "TENSOR_MATCH" in proc.stdout  # --type guards lists each graph's guards
    data = json.loads((tmp_path / "g.json").read_text())
    assert data["compile"]["graph_break_count"] >= 1 and data["compile"]["recompile_count"] >= 1
    assert "constraints" not in data


def test_cli_analyze_constraints_json_to_stdout(tmp_path):
    proc = _analyze(tmp_path, CONSTRAINED, "--type", "constraints", "--json", "-")
    assert proc.returncode == 1, proc.stderr[-3000:]  # violations found
    data = json.loads(proc.stdout)
    vs = data["constraints"]["violations"]
    assert data["constraints"]["graphs_checked"] >= 2
    assert {v["constraint"] for v in vs} == {"alignment"}
    assert any(v["shape"] == [12, 16] for v in vs)  # the weight: 12 rows
    text = _analyze(tmp_path, CONSTRAINED, "--type", "summary")
    assert text.returncode == 1 and "kdebug constraints:" in text.stdout and "kdebug compile inspector:" in text.stdout


def test_cli_analyze_bad_input(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "kdebug", "analyze", str(tmp_path / "nope.py")],
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": REPO})
    assert proc.returncode == 2 and "no such script" in proc.stderr


def test_break_reasons_name_what_broke_and_empty_frames_are_no_graphs():
    """torch 2.13's first line of every break in a call is the same generic
    sentence ('Encountered graph break when attempting to trace CALL ...');
    the reason is the line that says what broke.  A frame compile that makes
    no graph (a resumption holding no op) is not counted as a graph: the count
    equals the backend's calls (found by an adversarial pass: 12 for 10)."""
    calls = []

    def backend(gm, example_inputs):
        calls.append(gm)
        return gm.forward

    def f(x):
        y = x * 2
        v = y.sum().item()
        print("step")
        return y + v

    torch._dynamo.reset()
    with kdebug.inspect_compile() as ins:
        torch.compile(f, backend=backend)(torch.randn(4))
    rep = ins.report()
    reasons = [b.reason for b in rep.graph_breaks]
    assert any("Tensor.item()" in r for r in reasons) and any("builtin operator" in r for r in reasons), reasons
    assert not any(r.startswith("Encountered graph break") for r in reasons), reasons
    assert rep.graph_count == len(calls), ([(g.compile_id, g.op_count) for g in rep.graphs], len(calls))


def test_modules_compiled_through_dynamos_wrapper_frame_are_said_to_share_it():
    """Note [Compiled modules share a frame]: two different nn.Sequential
    models compiled in one process were listed as one function 'inner' and its
    recompilation, with nothing saying why; the report now marks dynamo's
    wrapper frame and says what sharing it means.  A compiled function is not
    marked."""
    a = torch.compile(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()), backend="eager")
    b = torch.compile(torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2)),
                      backend="eager")
    with kdebug.inspect_compile() as insp:
        a(torch.randn(2, 4))
        b(torch.randn(3, 4))
    r = insp.report()
    wrapped = [g for g in r.graphs if g.is_module_wrapper]
    if not wrapped:
        pytest.skip(f"torch {torch.__version__} compiles a module's forward as its own frame")
    assert len(wrapped) == 2 and len(r.recompiles) == 1
    assert "dynamo's own frame for torch.compile(module)" in r.summary()
    assert all(g["is_module_wrapper"] for g in r.to_json()["graphs"])

    def f(x):
        return torch.sin(x) + 1

    plain = kdebug.inspect_compile(f, torch.randn(4))
    assert plain.graphs and not any(g.is_module_wrapper for g in plain.graphs)
    assert "dynamo's own frame" not in plain.summary()
