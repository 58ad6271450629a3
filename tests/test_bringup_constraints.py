"""kdebug.backends.constrained (Note [Constraint backend]): real
torch.compile on the CPU, dynamo, AOTAutograd and Inductor graphs."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings

import pytest
import torch

import kdebug.backends as kb
from kdebug.backends import AcceleratorAdapter, AcceleratorCapabilities, ConstraintViolationError, constrained

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    for var in ("MOCK_STRICT", "MOCK_ALIGNMENT", "MOCK_MAX_MEMORY"):
        monkeypatch.delenv(var, raising=False)
    torch._dynamo.reset()
    kb.clear_violations()
    yield
    torch._dynamo.reset()


def violation_error(excinfo) -> ConstraintViolationError:
    """Ours, from dynamo's BackendCompilerFailed (or raised directly from a lazily compiled backward)."""
    e = excinfo.value
    while not isinstance(e, ConstraintViolationError):
        e = getattr(e, "inner_exception", None) or e.__cause__
        assert e is not None, f"no ConstraintViolationError in {excinfo.value!r}"
    return e


class TinyAttention(torch.nn.Module):  # the seed's Example 1, as written
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(64, 64)

    def forward(self, x):
        return self.proj(x.double())  # Force float64 to trip dtype constraints


def test_seed_example1_dtype_violation_caught_before_lowering_with_standalone_repro(tmp_path, monkeypatch):
    monkeypatch.setenv("MOCK_STRICT", "1")
    monkeypatch.setenv("MOCK_ALIGNMENT", "16")
    caps = AcceleratorCapabilities(name="npu", dtypes={"float32", "float16"})
    with pytest.warns(kdebug_warning(), match="MOCK_ALIGNMENT=16 overrides alignment 1"):
        backend = constrained(caps, mode="warn", repro_dir=str(tmp_path))
    assert backend.mode == "strict" and backend.capabilities.alignment == 16  # the seed's variables win
    compiled = torch.compile(TinyAttention(), backend=backend)
    with pytest.raises(Exception) as ei:
        compiled(torch.randn(32, 64))
    err = violation_error(ei)
    first = err.violations[0]
    assert (first.constraint, first.stage, first.node, first.target) == ("dtype", "dynamo", "double",
                                                                          "torch.Tensor.double")
    assert first.actual == "float64" and first.expected == "one of float16, float32"
    assert "test_bringup_constraints.py" in first.source and "self.proj(x.double())" in first.source
    assert "node double (torch.Tensor.double)" in str(err) and "self.proj(x.double())" in str(err)
    # caught before lowering: only the dynamo graph was checked, nothing reached AOTAutograd / Inductor
    assert [c.stage for c in kb.checks()] == ["dynamo"]
    # the repro runs with torch alone (no kdebug on the path) and reproduces the violation
    assert err.repro and os.path.dirname(err.repro).startswith(str(tmp_path))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, "-I", err.repro], capture_output=True, text=True, cwd=str(tmp_path),
                          env=env)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "REPRODUCED dtype: node double (torch.Tensor.double), output: expected one of float16, float32, " \
           "got dtype torch.float64" in proc.stdout
    assert "kdebug" not in open(err.repro).read().split("import torch", 1)[1].split("REPRODUCED = []")[0]
    assert json.loads(json.dumps(first.to_json()))["constraint"] == "dtype"
    assert kb.Violation.from_json(first.to_json()) == first


def kdebug_warning():
    from kdebug import KdebugWarning

    return KdebugWarning


def sin_model():
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(16, 16)

        def forward(self, x):
            return torch.sin(self.lin(x)).sum()
    torch.manual_seed(0)
    return M()


@pytest.mark.parametrize("then", ["inductor", "eager"])
def test_violation_only_in_backward_is_found_in_the_backward_graph(tmp_path, then):
    # sin's derivative is cos: aten.cos appears in the backward graph only
    caps = AcceleratorCapabilities(name="npu", denied_ops=("aten.cos",))
    m = sin_model()
    compiled = torch.compile(m, backend=constrained(caps, then=then, repro_dir=str(tmp_path)))
    x = torch.randn(8, 16)
    with pytest.raises(Exception) as ei:
        compiled(x).backward()
    err = violation_error(ei)
    assert {v.stage for v in err.violations} == {"backward"}
    assert err.violations[0].constraint == "denied_op" and err.violations[0].target == "aten.cos.default"
    stages = [c.stage for c in kb.checks()]
    assert stages[:2] == ["dynamo", "forward"] and "backward" in stages
    assert all(not c.violations for c in kb.checks() if c.stage != "backward")
    proc = subprocess.run([sys.executable, "-I", err.repro], capture_output=True, text=True)
    assert proc.returncode == 1 and "REPRODUCED denied_op" in proc.stdout, proc.stdout + proc.stderr


def test_inference_graph_is_checked_without_backward():
    caps = AcceleratorCapabilities(denied_ops=("aten.cos*",))
    compiled = torch.compile(sin_model(), backend=constrained(caps, mode="warn"))
    with torch.no_grad():
        compiled(torch.randn(8, 16))
    assert [c.stage for c in kb.checks()] == ["dynamo", "inference"]
    assert kb.violations() == []


def test_warn_mode_records_and_result_equals_eager():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(24, 20), torch.nn.ReLU(), torch.nn.Linear(20, 8))
    x = torch.randn(6, 24)
    caps = AcceleratorCapabilities(name="npu", alignment=16, layout="contiguous", dtypes={"float32"})
    for then in ("inductor", "eager"):
        torch._dynamo.reset()
        kb.clear_violations()
        backend = constrained(caps, mode="warn", then=then)
        with pytest.warns(kdebug_warning(), match="constraint violation"):
            got = torch.compile(model, backend=backend)(x)
        torch.testing.assert_close(got, model(x))
        vs = kb.violations()
        assert vs == backend.violations
        kinds = {v.constraint for v in vs}
        assert "alignment" in kinds
        bad = next(v for v in vs if v.constraint == "alignment" and v.stage == "dynamo" and v.target == "placeholder"
                   and v.shape == (6, 24))  # the input x
        assert "dim 0 = 6 (multiple of 16 needed)" in bad.actual
        assert "dim 1 = 24 (multiple of 16 needed)" in bad.actual


def test_layout_flags_the_reader_of_a_transposed_tensor_not_the_view():
    def f(x):
        return (x.t() * 2).sum(0)
    caps = AcceleratorCapabilities(layout="contiguous")
    compiled = torch.compile(f, backend=constrained(caps, mode="warn", then="eager"))
    x = torch.randn(8, 4)
    with pytest.warns(kdebug_warning()):
        torch.testing.assert_close(compiled(x), f(x))
    dyn = [v for v in kb.violations() if v.stage == "dynamo"]
    # mul reads the transposed view; its output keeps the input's strides (as eager does), so sum reads a
    # strided tensor too; the view itself (t) is not flagged
    assert [(v.node, v.value) for v in dyn] == [("mul", "input 0 (t)"), ("sum_1", "input 0 (mul)")]
    assert dyn[0].stride == (1, 4) and dyn[0].constraint == "layout"


def test_denylist_and_allowlist():
    def f(x):
        return torch.nn.functional.gelu(x @ x.t()) + 1
    x = torch.randn(8, 8)
    caps = AcceleratorCapabilities(denied_ops=("torch.nn.functional.gelu",),
                                   allowed_ops=("aten.mm*", "aten.add*", "aten.permute*", "aten.t*"))
    compiled = torch.compile(f, backend=constrained(caps, mode="warn", then="eager"))
    with pytest.warns(kdebug_warning()):
        torch.testing.assert_close(compiled(x), f(x))
    vs = kb.violations()
    denied = [v for v in vs if v.constraint == "denied_op"]
    assert [(v.stage, v.target) for v in denied] == [("dynamo", "torch.nn.functional.gelu")]
    not_allowed = {v.target for v in vs if v.constraint == "not_allowed_op"}
    assert "aten.gelu.default" in not_allowed
    assert not any(t.startswith(("aten.mm", "aten.add", "aten.t", "aten.permute")) for t in not_allowed)
    assert all(v.stage != "dynamo" for v in vs if v.constraint == "not_allowed_op")  # aten lists: aten graphs


def test_max_bytes_and_adapter_hook(tmp_path):
    class Npu(AcceleratorAdapter):
        name = "npu-v1"

        def capabilities(self):
            return AcceleratorCapabilities(name="npu-v1", max_tensor_bytes=1024)

        def supports(self, node, stage):
            if stage != "dynamo" and "amax" in str(node.target):
                return "no reduction unit for max"
            return None

    def f(x):
        return x.amax(dim=1) + x.sum(dim=1)
    compiled = torch.compile(f, backend=constrained(Npu(), repro_dir=str(tmp_path), then="eager"))
    with pytest.raises(Exception) as ei:
        compiled(torch.randn(32, 16))  # 2048 bytes
    err = violation_error(ei)
    assert {v.constraint for v in err.violations} == {"max_bytes"}
    assert err.violations[0].actual == "2048 bytes"
    kb.clear_violations()
    torch._dynamo.reset()
    compiled = torch.compile(f, backend=constrained(Npu(), mode="warn", then="eager"))
    with pytest.warns(kdebug_warning()):
        compiled(torch.randn(4, 16))
    unsupported = [v for v in kb.violations() if v.constraint == "unsupported"]
    assert unsupported and unsupported[0].actual == "no reduction unit for max"
    assert unsupported[0].target.startswith("aten.amax")


def test_env_override_and_bad_values(monkeypatch):
    monkeypatch.setenv("MOCK_MAX_MEMORY", "512")
    monkeypatch.setenv("MOCK_STRICT", "0")
    with pytest.warns(kdebug_warning(), match="MOCK_MAX_MEMORY=512 overrides max_tensor_bytes 1048576"):
        b = constrained(AcceleratorCapabilities(max_tensor_bytes=1 << 20), mode="strict")
    assert b.mode == "warn" and b.capabilities.max_tensor_bytes == 512
    with pytest.warns(kdebug_warning(), match="constraint violation"):
        torch.compile(lambda x: x * 2, backend=b)(torch.randn(256))  # 1024 bytes > 512: warns, runs
    assert {v.constraint for v in kb.violations()} == {"max_bytes"}
    monkeypatch.setenv("MOCK_ALIGNMENT", "sixteen")
    with pytest.raises(ValueError, match="MOCK_ALIGNMENT='sixteen': expected a positive integer"):
        constrained(AcceleratorCapabilities())
    monkeypatch.delenv("MOCK_ALIGNMENT")
    b = constrained(AcceleratorCapabilities(alignment=8), use_env=False)
    assert b.capabilities.max_tensor_bytes is None and b.mode == "strict"


def test_capabilities_validate_their_fields():
    with pytest.raises(ValueError, match="not a torch dtype"):
        AcceleratorCapabilities(dtypes={"float33"})
    with pytest.raises(ValueError, match="layout must be one of"):
        AcceleratorCapabilities(layout="rowmajor")
    with pytest.raises(ValueError, match="list of op names"):
        AcceleratorCapabilities(denied_ops="aten.mm")
    with pytest.raises(ValueError, match="then must be"):
        constrained(AcceleratorCapabilities(), then="tvm")
    caps = AcceleratorCapabilities(alignment=8, dim_alignment={-1: 16})
    assert caps.alignment_of(2, 3) == 16 and caps.alignment_of(0, 3) == 8
    assert json.loads(json.dumps(caps.to_json()))["dim_alignment"] == {"-1": 16}


def test_dense_layout_torch_level_denied_names_and_broadcast_bytes():
    """Three false answers an adversarial pass found on torch 2.13:
    layout="dense" checked nothing (the prims helper it called is gone: every
    tensor was 'not checked'); denied_ops never matched torch.conv2d /
    torch.matmul (their qualname names the C class holding them); a broadcast
    view was charged numel's bytes against max_tensor_bytes (stride 0 holds
    its storage's)."""
    caps = AcceleratorCapabilities(layout="dense")

    def f(x):
        return torch.relu(x * 2)

    compiled = torch.compile(f, backend=constrained(caps, mode="warn", then="eager"))
    with pytest.warns(kdebug_warning()):
        compiled(torch.randn(8, 128)[:, :64])  # stride (128, 1): gaps between rows
    sliced = [v for v in kb.violations() if v.constraint == "layout" and v.stage == "dynamo"]
    assert sliced and all(v.stride == (128, 1) for v in sliced), kb.violations()
    assert not any("layout not checked" in u for c in kb.checks() for u in c.unchecked)
    kb.clear_violations()
    torch._dynamo.reset()
    compiled = torch.compile(f, backend=constrained(caps, mode="warn", then="eager"))
    compiled(torch.randn(8, 4).t())  # permuted, dense: no violation
    assert [v for v in kb.violations() if v.constraint == "layout"] == []

    kb.clear_violations()
    torch._dynamo.reset()

    def g(x, w):
        return torch.matmul(torch.conv2d(x, w), torch.ones(6, 6))

    caps = AcceleratorCapabilities(denied_ops=("torch.conv2d", "matmul"))
    compiled = torch.compile(g, backend=constrained(caps, mode="warn", then="eager"))
    with pytest.warns(kdebug_warning()):
        compiled(torch.randn(1, 1, 8, 8), torch.randn(1, 1, 3, 3))
    denied = [(v.stage, v.target) for v in kb.violations() if v.constraint == "denied_op"]
    assert denied == [("dynamo", "torch.conv2d"), ("dynamo", "torch.matmul")], kb.violations()

    kb.clear_violations()
    torch._dynamo.reset()

    def h(row, mask):
        return mask.expand(64, 16, 32, 32).sum(dim=(0, 1)) * row

    caps = AcceleratorCapabilities(max_tensor_bytes=1 << 16)  # the mask's view addresses 4 KB; numel 4 MB
    torch.compile(h, backend=constrained(caps, mode="warn", then="eager"))(torch.randn(32), torch.ones(1, 1, 32, 32))
    assert [v for v in kb.violations() if v.constraint == "max_bytes"] == []
    kb.clear_violations()
    torch._dynamo.reset()
    with pytest.warns(kdebug_warning()):  # the same bytes made whole (contiguous) are flagged
        torch.compile(h, backend=constrained(caps, mode="warn", then="eager"))(
            torch.randn(32), torch.ones(64, 16, 32, 32))
    assert [v.actual for v in kb.violations() if v.constraint == "max_bytes"][:1] == [f"{64 * 16 * 32 * 32 * 4} bytes"]


def test_the_repro_of_a_layout_violation_on_a_view_input_reproduces(tmp_path):
    """The strict repro saves each input with its strides: a column slice
    (stride (128, 1)) was saved cloned, contiguous, and its repro said 'not
    reproduced'."""
    caps = AcceleratorCapabilities(layout="contiguous")

    def f(x):
        return torch.relu(x * 2)

    with pytest.raises(Exception) as ei:
        torch.compile(f, backend=constrained(caps, repro_dir=str(tmp_path), then="eager"))(torch.randn(8, 128)[:, :64])
    assert violation_error(ei).violations
    (repro,) = [os.path.join(d, "repro.py") for d, _, files in os.walk(tmp_path) if "repro.py" in files]
    p = subprocess.run([sys.executable, repro], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": REPO})
    assert "REPRODUCED layout" in p.stdout, p.stdout + p.stderr
