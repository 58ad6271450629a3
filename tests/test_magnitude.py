"""Note [Element-level differences] and aten-op replay (Note [Proof by
replay]): how big a root's difference is, element by element, and replaying
an aten op's output on a real compiled step with an extern op."""
from __future__ import annotations

import dataclasses
import math
import struct

import pytest
import torch

import kdebug
from kdebug import DebugMode, replay, zoo
from kdebug.compare import steps_of
from kdebug.magnitude import element_diff
from kdebug.testing import _scopes, perturb_kernel_output


def _f32_bits(x: float) -> int:
    return struct.unpack("<i", struct.pack("<f", x))[0]


def test_element_diff_counts_and_measures():
    a = torch.zeros(3, 4)
    a[1, 2] = 1.0
    b = a.clone()
    b[1, 2] = 1.25          # |d| = 0.25, rel 0.25 / 1.25
    b[2, 3] = -0.5          # |d| = 0.5 against 0: rel 1
    d = element_diff(a, b)
    assert (d.numel, d.differ) == (12, 2)
    assert d.max_abs == 0.5 and d.max_rel == 1.0
    assert d.first_index == [1, 2]
    # ULP: 1.0 -> 1.25 is 2**21 steps of float32 (mantissa 23 bits); 0 -> -0.5 crosses zero
    assert d.max_ulp == max(_f32_bits(1.25) - _f32_bits(1.0), _f32_bits(0.5))
    assert "2 of 12 elements differ" in d.text() and "first at [1, 2]" in d.text()


def test_element_diff_ulp_in_the_tensors_own_type():
    a = torch.tensor([1.0, 2.0], dtype=torch.bfloat16)
    b = torch.nextafter(a, torch.full_like(a, 10))
    b = torch.nextafter(b, torch.full_like(a, 10))
    d = element_diff(a, b)
    assert d.differ == 2 and d.max_ulp == 2
    assert d.max_abs == pytest.approx(2 * 2.0 ** -6)  # bf16 spacing at 2.0 is 2**-6


def test_element_diff_nan_zero_sign_integers_and_shapes():
    nan = float("nan")
    d = element_diff(torch.tensor([nan, 1.0, 0.0]), torch.tensor([nan, nan, -0.0]))
    assert d.differ == 2 and d.nan_mismatch == 1  # same NaN bits are equal; -0.0 differs bitwise
    assert d.max_abs == 0.0 and d.max_ulp == 0
    d = element_diff(torch.tensor([5, 7, 9]), torch.tensor([5, 4, 9]))
    assert (d.differ, d.max_abs, d.first_index, d.max_ulp) == (1, 3.0, [1], None)
    assert element_diff(torch.ones(2), torch.ones(3)).shape_mismatch
    assert element_diff(torch.ones(2), torch.ones(2)).text() == "all 2 elements identical"
    assert math.isclose(element_diff(torch.tensor([2.0]), torch.tensor([3.0])).max_rel, 1 / 3)


def _record(step):
    with DebugMode(record_final_state=True) as dm, \
            DebugMode.log_tensor_hashes(["bitwise", "norm"], hash_inputs=True), replay.op_mode():
        held = step()  # noqa: F841
    dm.operators  # noqa: B018
    return dm


@pytest.fixture()
def jitter():
    step = zoo.CASES["extern_jitter"].prepare("cpu", warmup=True)
    yield step
    zoo.JITTER_ULPS = None
    replay.activate(None)


def _with_jitter(step, ulps):
    zoo.JITTER_ULPS = ulps
    return _record(step)


def test_an_aten_op_root_is_replayed_and_confirmed(jitter, tmp_path):
    """The extern op is the root; capturing its output in one run and
    replaying it into another (whose op jitters differently) makes the second
    match the first; replaying an innocent op does not."""
    base = _with_jitter(jitter, 1)
    original = kdebug.compare(base, _with_jitter(jitter, 2))
    # a few ULP of one element can round away in the kernels after it: the runs then match, the op
    # listed among the benign roots (Note [Differences that die out]); replaying proves it either way
    root = (original.roots or original.benign)[0]
    assert root.step_a.kind == "aten" and "jitter_matmul" in root.step_a.name
    run_a = kdebug.load(_save(base, tmp_path / "a.kdt"))
    spec = replay.spec_for(run_a, root, "capture", str(tmp_path / "op.pt"))
    assert spec is not None and spec.op and spec.paths == ["out/"]
    runs = []
    for mode, ulps in (("capture", 1), ("replay", 2)):
        replay.activate(dataclasses.replace(spec, mode=mode, hits=0))
        runs.append(_with_jitter(jitter, ulps))
        assert replay.specs()[0].hits == 1
        replay.activate(None)
    verdict = replay.judge(original, root, kdebug.compare(*runs), 1)
    assert verdict["confirmed"] is True, verdict
    natural = torch.load(str(tmp_path / "op.pt") + ".natural", weights_only=True)[0]
    captured = torch.load(str(tmp_path / "op.pt"), weights_only=True)[0]
    d = element_diff(captured, natural)
    assert d.differ == 1 and d.first_index == [0, 0]

    # another op replayed (the addmm after it): the root itself still differs
    innocent = next(s for s in steps_of(run_a) if s.kind == "aten" and s.post and s.index > root.step_a.index)
    assert "addmm" in innocent.name
    name, occ = replay.locate(run_a, innocent)
    ispec = replay.Spec(name, occ, [], "capture", str(tmp_path / "i.pt"), op=True, paths=sorted(innocent.post)[:1])
    runs = []
    for mode, ulps in (("capture", 1), ("replay", 2)):
        replay.activate(dataclasses.replace(ispec, mode=mode, hits=0))
        runs.append(_with_jitter(jitter, ulps))
        replay.activate(None)
    verdict = replay.judge(original, root, kdebug.compare(*runs), 1)
    assert verdict["confirmed"] is False and "jitter_matmul" in verdict["text"]


def _save(dm, path):
    dm.save(str(path))
    return str(path)


def test_relaunching_a_kernel_root_measures_the_planted_difference(tmp_path):
    """A kernel root captured in one run (mode "io", Note [Standalone
    repro]) and re-launched by its repro on copies of its pre-launch
    arguments: the kernel alone writes without the planted perturbation, so
    every re-launch writes the same values (stable on its inputs), none
    matches the recorded (perturbed) output, and exactly the planted element
    differs, by the planted amount."""
    from kdebug import repro

    case = zoo.CASES["backward_planted"]
    step = case.prepare("cpu")
    plant = case.plants[0]
    base = _record(step)
    kern = next(k for k in base.kernels if plant.kernel in k.kernel_name)
    spec = replay.Spec(kern.kernel_name, 0, [], "io", str(tmp_path / "io.pt"))
    replay.activate(spec)
    try:
        for scope in _scopes():
            replay.attach(scope)
        with perturb_kernel_output(plant.kernel, plant.arg, value=0.375) as st:
            _record(step)
        assert st["hits"] == 1 and spec.hits == 1
    finally:
        replay.activate(None)
    data = torch.load(str(tmp_path / "io.pt"), weights_only=True)
    assert data["kind"] == "kernel" and data["definition"]["method"] == "cpp_pybinding"
    t = repro.Target("kernel", kern.launch_index, kern.kernel_name, 0)
    rp = repro.Repro(str(tmp_path / "r"), repro._write_dir(str(tmp_path / "r"), "planted.kdt", t, data,
                                                           kern.arg_names), kern.kernel_name, kern.launch_index)
    verdict = repro.relaunch(rp, 3, save=str(tmp_path / "outs.pt"))
    assert (verdict.times, verdict.distinct, verdict.matches_recorded, verdict.verdict) == (3, 1, 0, "stable")
    assert verdict.summary().startswith("re-launched 3x on the recorded inputs: 1 different output -- STABLE")
    got = torch.load(str(tmp_path / "outs.pt"), weights_only=True)
    i = got["names"].index(plant.arg)
    d = element_diff(got["recorded"][i], got["other"][i])
    assert d.differ == 1 and d.max_abs == pytest.approx(0.375, rel=1e-6)
    assert d.first_index == [0] * got["recorded"][i].dim()
    for name, a, b in zip(got["names"], got["recorded"], got["other"]):  # nothing else was perturbed
        if name != plant.arg:
            assert torch.equal(a, b), name
