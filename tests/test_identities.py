"""Structure never depends on identities (issue 15, item 3): an op taking a
torch.Generator (or any object whose repr is an address) records the same
text in every run, so comparisons see the generator's value, not where it
lives (Note [Stable argument text] in kdebug/_argtext.py)."""
from __future__ import annotations

import collections
import os
import re
import subprocess
import sys
import textwrap

import pytest
import torch

import kdebug
from kdebug import DebugMode

pytest_plugins = ["pytester"]

ADDRESS = re.compile(r"0x[0-9a-fA-F]{5,}")


def rng_work(x, seed=0):
    """randn / randint / randperm / multinomial / a dropout-like bernoulli, all
    from one explicitly seeded generator."""
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(4, generator=g)
    b = torch.randint(0, 10, (4,), generator=g)
    c = torch.randperm(6, generator=g)
    d = torch.multinomial(torch.ones(6), 3, generator=g)
    keep = torch.bernoulli(torch.full_like(x, 0.5), generator=g)
    return (x * keep * 2).sin() + a.sum() + b.sum() + c.sum() + d.sum()


@pytest.fixture(scope="module")
def compiled_rng():
    fn = torch.compile(rng_work)
    fn(torch.ones(8))  # compiled (and warm) before anything is recorded
    return fn


def _record(fn, *args, **flags):
    with DebugMode(**flags) as dm, DebugMode.log_tensor_hashes("bitwise", hash_inputs=True):
        fn(*args)
    dm.operators  # noqa: B018  (drain and resolve)
    return dm


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_two_runs_with_a_seeded_generator_compare_ok(compiled, request, tmp_path):
    fn = request.getfixturevalue("compiled_rng") if compiled else rng_work
    x = torch.ones(8)
    a, b = _record(fn, x), _record(fn, x)
    if compiled:
        assert a.kernels  # Inductor's kernels ran and were recorded
    text = a.debug_string()
    for op in ("randn.generator", "randint.low_generator", "randperm.generator", "multinomial", "bernoulli"):
        assert re.search(rf"aten::{re.escape(op)}\(.*generator=Generator\(device='cpu', seed=0, state=[0-9a-f]{{16}}\)",
                         text), op
    assert not ADDRESS.search(text), text
    rep = kdebug.compare(a, b)
    assert rep.ok, str(rep)
    assert not rep.structural and not len(rep.shape_changes) and rep.divergence is None
    assert rep.hashed > 0 and "SHAPES" not in str(rep) and "STRUCTURE" not in str(rep)
    # the saved trace holds the same text: no address reaches a file either
    a.save(tmp_path / "a.kdt")
    saved = kdebug.load(str(tmp_path / "a.kdt")).debug_string()
    assert "object at 0x" not in saved and not ADDRESS.search(saved)
    assert "generator=Generator(device='cpu', seed=0, state=" in saved
    assert kdebug.compare(str(tmp_path / "a.kdt"), b).ok


def test_another_seed_is_a_difference_by_value():
    x = torch.ones(8)
    a, b = _record(rng_work, x, 0), _record(rng_work, x, 1)
    rep = kdebug.compare(a, b)
    assert not rep.ok
    assert not rep.structural  # the same ops in the same order
    # the first op's record differs in its generator's value, and only there
    first = rep.shape_changes[0]
    assert first[0].name == first[1].name == "aten::randn.generator"
    la = a.debug_string().splitlines()[0]
    lb = b.debug_string().splitlines()[0]
    assert "seed=0," in la and "seed=1," in lb
    assert la.split("generator=")[0] == lb.split("generator=")[0]
    # every op that drew from the generator is a root fed another argument (not
    # non-deterministic itself), ranked by what it changed; randperm(6)'s only
    # reader, its sum, is the same for every permutation: benign
    assert {x.step_a.name for x in rep.roots} == {"aten::randn.generator", "aten::randint.low_generator",
                                                 "aten::multinomial", "aten::bernoulli"}
    assert all(x.kind == "outside" for x in rep.roots)
    assert [x.step_a.name for x in rep.benign] == ["aten::randperm.generator"]
    assert rep.divergence is not None and rep.divergence.step_a.name == "aten::bernoulli"


def test_a_used_generator_is_another_value():
    """The text is the state the op starts from: a generator that has drawn
    before is a different input, even with the same seed."""
    def draw(advance):
        g = torch.Generator().manual_seed(0)
        if advance:
            torch.rand(1, generator=g)  # not recorded: before the DebugMode
        with DebugMode() as dm:
            torch.randn(4, generator=g)
        return dm

    assert draw(False).debug_string() == draw(False).debug_string()
    assert draw(False).debug_string() != draw(True).debug_string()
    assert "seed=0" in draw(True).debug_string()


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_assert_deterministic_passes_with_a_generator(compiled, request):
    fn = request.getfixturevalue("compiled_rng") if compiled else rng_work
    reports = kdebug.assert_deterministic(fn, torch.ones(8), runs=3)
    assert len(reports) == 2 and all(r.ok and r.hashed > 0 for r in reports)


@pytest.mark.parametrize("flags", [{"record_ids": True}, {"store_original_args": True},
                                   {"record_torchfunction": True}, {"record_tensor_attributes": ["requires_grad"]}])
def test_upstreams_python_path_renders_generators_by_value(flags):
    """Flags that send ops through upstream's own __torch_dispatch__ (not the C
    fast path) give the same generator text, made before the op runs."""
    x = torch.ones(8)
    fast, slow = _record(rng_work, x), _record(rng_work, x, **flags)
    assert not slow._fast
    text = slow.debug_string()
    assert not ADDRESS.search(text), text
    gens = re.findall(r"generator=(Generator\([^)]*\))", text)
    assert gens and set(gens) <= set(re.findall(r"generator=(Generator\([^)]*\))", fast.debug_string()))
    assert kdebug.compare(slow, _record(rng_work, x, **flags)).ok
    if flags.get("store_original_args"):
        op = next(o for o in slow.operators if "randn" in str(getattr(o, "op", "")))
        assert isinstance(op.kwargs["generator"], torch.Generator)  # the object itself is kept


class MyTensor(torch.Tensor):
    pass


def test_ops_the_c_formatter_declines_get_the_same_text():
    """A tensor subclass argument sends the op to upstream's rendering; its
    generator still shows by value, as the C formatter shows it."""
    def work(p):
        return torch.bernoulli(p, generator=torch.Generator().manual_seed(0))

    with DebugMode() as plain:
        work(torch.full((4,), 0.5))
    with DebugMode() as sub:
        work(torch.full((4,), 0.5).as_subclass(MyTensor))
    a = plain.debug_string().splitlines()[-1]
    b = sub.debug_string().splitlines()[-1]
    assert "generator=Generator(device='cpu', seed=0, state=" in b and not ADDRESS.search(b)
    assert a.split("generator=")[1] == b.split("generator=")[1]


def test_output_fallback_renders_generators_by_value():
    """An output the C formatter does not know (here a namedtuple) goes through
    upstream's stringify_output (kd_dispatch.c's fallback): stable text too."""
    from kdebug import _upstream

    Pair = collections.namedtuple("Pair", "g t")
    g = torch.Generator().manual_seed(0)
    call = _upstream._OpCall(torch.ops.aten.randn.generator, (), {}, 0)
    with DebugMode() as dm:
        pass
    dm._stringify_output(call, Pair(g, torch.ones(2)))
    assert "Generator(device='cpu', seed=0, state=" in call.output_str
    assert "t: f32[2]" in call.output_str and not ADDRESS.search(call.output_str)


def test_torch_function_records_of_property_getters_have_stable_names():
    """record_torchfunction=True records x.shape as the getter's method-wrapper,
    whose upstream name is an address: kdebug names the property instead."""
    with DebugMode(record_torchfunction=True) as dm:
        x = torch.ones(2, 3)
        x.shape  # noqa: B018
        x.T  # noqa: B018
    text = dm.debug_string()
    assert not ADDRESS.search(text), text
    assert "'TensorBase.shape'>(t: f32[2, 3])" in text and "'TensorBase.T'>(t: f32[2, 3])" in text
    getter = next(o.op for o in dm.operators if "TensorBase.shape" in str(getattr(o, "op", "")))
    assert getter(torch.ones(5)) == torch.Size([5])  # still the callable it stands for


PLUGIN_TESTS = '''
import pytest
import torch


def sample(n):
    g = torch.Generator().manual_seed(0)
    idx = torch.randperm(n, generator=g)
    return torch.randn(n, generator=g)[idx] * torch.bernoulli(torch.full((n,), 0.5), generator=g)


@pytest.mark.kdebug_deterministic(runs=2)
def test_marked_eager_with_generator():
    sample(16)


def test_fixture_eager_with_generator(kdebug_determinism):
    reports = kdebug_determinism.check(sample, 16, runs=2)
    assert all(r.ok and r.hashed for r in reports)


@pytest.mark.kdebug_deterministic(runs=2)
def test_marked_other_seed_each_run():
    # a generator seeded from the OS each run: a real difference, by value
    import os
    g = torch.Generator().manual_seed(int.from_bytes(os.urandom(6), "little"))
    torch.randn(4, generator=g)
'''


def test_pytest_plugin_passes_a_deterministic_eager_test_with_a_generator(pytester):
    pytester.makepyfile(test_gen=PLUGIN_TESTS)
    r = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rA")
    r.assert_outcomes(passed=2, failed=1)
    out = r.stdout.str()
    assert "PASSED test_gen.py::test_marked_eager_with_generator" in out
    assert "PASSED test_gen.py::test_fixture_eager_with_generator" in out
    assert "FAILED test_gen.py::test_marked_other_seed_each_run" in out
    assert "object at 0x" not in out


HUNT_SCRIPT = """
import os
import torch

g = torch.Generator().manual_seed(0)
x = torch.randn(64, generator=g)
perm = torch.randperm(64, generator=g)
keep = torch.bernoulli(torch.full((64,), 0.5), generator=g)
if not torch.are_deterministic_algorithms_enabled():
    # stands for a kernel that torch.use_deterministic_algorithms(True) makes
    # deterministic: values that differ run to run (from no recorded op)
    x = x + torch.frombuffer(bytearray(os.urandom(64)), dtype=torch.uint8)
print(float((x[perm] * keep).sum()) != 0.5)
"""


def test_hunt_try_fixes_with_a_seeded_generator(tmp_path):
    script = tmp_path / "gen.py"
    script.write_text(textwrap.dedent(HUNT_SCRIPT))
    keep = tmp_path / "runs"
    p = subprocess.run([sys.executable, "-m", "kdebug", "hunt", "--runs", "2", "--in-process", "--try-fixes",
                        "--keep", str(keep), str(script)], capture_output=True, text=True, cwd=tmp_path, timeout=600)
    out = p.stdout
    assert p.returncode == 1, out + p.stderr
    assert "FIRST DIVERGENCE" in out
    assert "SHAPES" not in out and "STRUCTURE" not in out and "still at structure" not in out, out
    assert "torch.use_deterministic_algorithms(True): REMOVES the divergence" in out, out
    assert "torch._inductor.config.deterministic = True: does not remove it" in out
    traces = sorted(keep.glob("*.kdt"))
    assert len(traces) == 8
    for t in traces:
        text = kdebug.load(str(t), quiet=True).debug_string()
        assert "generator=Generator(device='cpu', seed=0, state=" in text
        assert "object at 0x" not in text and not ADDRESS.search(text), t


def test_diff_of_two_processes_with_a_generator(tmp_path):
    """Two separate processes (other addresses, same seed): `kdebug diff` finds
    no difference."""
    script = tmp_path / "prog.py"
    script.write_text(textwrap.dedent("""
        import torch
        g = torch.Generator().manual_seed(0)
        torch.multinomial(torch.ones(8), 4, generator=g).sum()
        torch.randn(3, generator=g).relu()
    """))
    paths = []
    for i in range(2):
        out = tmp_path / f"r{i}.kdt"
        p = subprocess.run([sys.executable, "-m", "kdebug", "record", "-o", str(out), "--", "python", str(script)],
                           capture_output=True, text=True, timeout=600, cwd=tmp_path,
                           env={**os.environ, "PYTHONHASHSEED": str(i)})
        assert p.returncode == 0, p.stderr
        paths.append(str(out))
    rep = kdebug.compare(*paths)
    assert rep.ok and rep.hashed > 0, str(rep)


@pytest.mark.parametrize("flags", [{}, {"record_ids": True}])
def test_storage_arguments_render_by_size_not_bytes(flags):
    """torch.load rebuilds a tensor with aten::set_ from a storage, whose str()
    lists every byte on a line of its own (a trace of an 8 MB checkpoint load
    ran out of memory): both the C formatter and upstream's path show it by
    type, size and device; its contents show in the output hash."""
    import io

    buf = io.BytesIO()
    torch.save(torch.arange(250_000, dtype=torch.float32), buf)
    with DebugMode(**flags) as dm, DebugMode.log_tensor_hashes(hash_fn="bitwise"):
        buf.seek(0)
        t = torch.load(buf)
    op = next(o for o in dm.operators if "aten::set_" in str(o))
    text = op.render([])
    assert "UntypedStorage(nbytes=1000000, device=cpu)" in text and len(text) < 400, text[:400]
    assert torch.equal(t, torch.arange(250_000, dtype=torch.float32))
