"""kdebug.minify (Note [Minifier]): a constraint violation and compiled-vs-eager
mismatches shrink to a few nodes, and the written repro.py reproduces them in
an isolated interpreter (python -I: no kdebug on its path)."""
import os
import subprocess
import sys

import pytest
import torch

import kdebug
from kdebug.capabilities import AcceleratorCapabilities
from kdebug.minify import MinifyError
from kdebug.testing import wrong_lowering


def _run_isolated(path):
    return subprocess.run([sys.executable, "-I", path], capture_output=True, text=True, timeout=300)


class Deep(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(32, 32) for _ in range(6))

    def forward(self, x):
        for i, layer in enumerate(self.layers):
            x = torch.relu(layer(x)) + x * 0.5
            x = x / (x.norm(dim=-1, keepdim=True) + 1)
            if i == 3:
                x = x.double().sin().float()
        return x.sum(-1)


def test_violation_in_a_deep_graph_minifies_to_the_violating_op(tmp_path):
    caps = AcceleratorCapabilities(name="npu", dtypes={torch.float32, torch.float16})
    r = kdebug.minify(Deep(), torch.randn(16, 32), constraints=caps, out=str(tmp_path / "min"))
    assert r.kind == "constraint"
    assert r.nodes_before >= 30
    assert 1 <= r.nodes_after <= 3
    assert "torch.Tensor.double" in r.ops
    for name in ("repro.py", "inputs.pt", "graph.txt", "minify.log"):
        assert os.path.exists(os.path.join(r.directory, name))
    head = open(r.repro).read().split("import os")[0]
    assert f"{r.nodes_before} call nodes before minifying, {r.nodes_after} after" in head
    p = _run_isolated(r.repro)
    assert p.returncode == 1, p.stdout + p.stderr
    assert "REPRODUCED dtype" in p.stdout and "float64" in p.stdout


def test_no_violation_is_a_clear_error(tmp_path):
    caps = AcceleratorCapabilities(name="npu", dtypes={torch.float32, torch.float64})
    try:
        kdebug.minify(Deep(), torch.randn(16, 32), constraints=caps, out=str(tmp_path / "min"))
    except MinifyError as e:
        assert "breaks the constraints" in str(e)
    else:
        raise AssertionError("minify of a graph without violations must raise MinifyError")
    assert not (tmp_path / "min").exists()


def _mlp_tanh(x, w):
    y = x @ w
    y = y * 0.5 + 1
    z = torch.tanh(y)
    z = z - y.mean()
    return torch.relu(z) * 2


def test_planted_wrong_lowering_minifies_to_the_op(tmp_path):
    x, w = torch.randn(8, 16), torch.randn(16, 16)
    tanh = torch.ops.aten.tanh.default
    with wrong_lowering(tanh, scale=1.5):
        r = kdebug.minify(_mlp_tanh, x, w, out=str(tmp_path / "min"), note="compiled with a planted wrong tanh")
    assert r.kind == "accuracy"
    assert r.nodes_before >= 6 and r.nodes_after <= 2, r.ops
    assert any("tanh" in op for op in r.ops)
    # the plant lives in the compiler of the process that planted it: the
    # repro alone runs a correct compiler and says so ...
    p = _run_isolated(r.repro)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "not reproduced" in p.stdout
    # ... and run by a compiler with the same wrong lowering (its caches off:
    # the run above cached the right kernel), it reproduces
    root = os.path.dirname(os.path.dirname(os.path.abspath(kdebug.__file__)))
    code = (f"import sys, runpy; sys.path.insert(0, {root!r}); import torch; "
            "from kdebug.testing import wrong_lowering; import torch._inductor.config as ic, torch._functorch.config as fc; "
            "ic.fx_graph_cache = False; fc.enable_autograd_cache = False\n"
            f"with wrong_lowering(torch.ops.aten.tanh.default, scale=1.5): runpy.run_path({r.repro!r}, "
            "run_name='__main__')")
    p = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, timeout=300)
    assert p.returncode == 1, p.stdout + p.stderr
    assert "REPRODUCED output 0" in p.stdout


def _bf16_chain(x):
    for _ in range(4):
        x = x * 1.1 + 0.3
        x = torch.sin(x)
    return x


def test_genuine_bfloat16_mismatch_reproduces_standalone(tmp_path):
    # Inductor computes bfloat16 arithmetic with float32 intermediates and
    # constants; eager rounds differently: some elements differ by one bf16
    # ulp (2**-7 near 1), outside rtol = atol = 1e-3. A real, standalone
    # difference of the installed compiler, no plant.
    x = torch.randn(1000, dtype=torch.bfloat16)
    r = kdebug.minify(_bf16_chain, x, rtol=1e-3, atol=1e-3, out=str(tmp_path / "min"))
    assert r.nodes_before >= 12 and r.nodes_after <= 2, r.ops
    assert "bfloat16" in r.failure
    p = _run_isolated(r.repro)
    assert p.returncode == 1, p.stdout + p.stderr
    assert "REPRODUCED output 0 (torch.bfloat16" in p.stdout


_STRICT_SCRIPT = '''
import torch
import kdebug.backends as kb
from kdebug.capabilities import AcceleratorCapabilities


class Deep(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(32, 32) for _ in range(6))

    def forward(self, x):
        for i, layer in enumerate(self.layers):
            x = torch.relu(layer(x)) + x * 0.5
            if i == 3:
                x = x.double().sin().float()
        return x.sum(-1)


caps = AcceleratorCapabilities(name="npu", dtypes={torch.float32})
torch.compile(Deep(), backend=kb.constrained(caps, mode="strict"))(torch.randn(16, 32))
'''


def test_cli_minify_writes_a_minimal_repro_beside_the_strict_one(tmp_path):
    import json

    (tmp_path / "deep.py").write_text(_STRICT_SCRIPT)
    root = os.path.dirname(os.path.dirname(os.path.abspath(kdebug.__file__)))
    env = dict(os.environ, PYTHONPATH=root)
    p = subprocess.run([sys.executable, "-m", "kdebug", "minify", "--json", "out.json", "deep.py"], cwd=tmp_path,
                       env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 1, p.stdout + p.stderr
    out = json.loads((tmp_path / "out.json").read_text())
    assert out["violations"] >= 1 and len(out["minified"]) == 1
    m = out["minified"][0]
    assert m["nodes_before"] >= 20 and m["nodes_after"] == 1 and m["ops"] == ["torch.Tensor.double"]
    repro = tmp_path / m["repro"]
    assert repro.parent.name == "minimal" and (repro.parent.parent / "repro.py").exists()
    q = _run_isolated(str(repro))
    assert q.returncode == 1 and "REPRODUCED dtype" in q.stdout, q.stdout + q.stderr


def test_minify_never_writes_through_a_link_in_its_directory(tmp_path):
    """A results directory holding links where minify writes (graph.txt,
    minify.log): refused, the files the links point to untouched (minify
    wrote through them: found by an adversarial pass); a directory that is a
    link is refused too."""
    import kdebug
    import kdebug.backends as kb
    from kdebug._files import LinkRefused

    def f(x):
        return (x.double() * 2).float()

    out = tmp_path / "out"
    out.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    (out / "graph.txt").symlink_to(victim)
    caps = kb.AcceleratorCapabilities(dtypes={"float32"})
    with pytest.raises(LinkRefused):
        kdebug.minify(f, torch.randn(4, 16), constraints=caps, out=str(out))
    assert victim.read_text() == "precious" and not (tmp_path / "new.txt").exists()
    (tmp_path / "linked").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    (tmp_path / "elsewhere").mkdir()
    with pytest.raises(LinkRefused):
        kdebug.minify(f, torch.randn(4, 16), constraints=caps, out=str(tmp_path / "linked"))
    assert list((tmp_path / "elsewhere").iterdir()) == []


def test_a_mismatch_from_random_draws_is_not_called_a_compiler_error(tmp_path):
    """An MLP with dropout in training mode: compiled and eager draw other
    random numbers by design; minify shrank it to the dropout and called it
    Inductor's error.  It is refused, saying how to compare without it; in
    eval() mode nothing differs."""
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Dropout(0.1), torch.nn.Linear(64, 8))
    x = torch.randn(16, 64)
    with pytest.raises(MinifyError, match="draws random numbers") as e:
        kdebug.minify(m, x, out=str(tmp_path / "train"))
    assert "eval()" in str(e.value) and "fallback_random" in str(e.value)
    assert not (tmp_path / "train" / "repro.py").exists()
    torch._dynamo.reset()
    with pytest.raises(MinifyError, match="within tolerance"):
        kdebug.minify(m.eval(), x, out=str(tmp_path / "eval"))
