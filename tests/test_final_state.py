"""Note [Final state]: a differing tensor that nothing recorded read is a kept
result when the program still holds it at the end of the recording, and
memory freed unread otherwise.  Real Inductor C++ kernels, planted faults."""
from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import kdebug
from kdebug import DebugMode
from kdebug.final_state import FinalState, snapshot
from kdebug.testing import perturb_kernel_output


@pytest.fixture(scope="module")
def two_out():
    """A compiled function with two outputs, each written by its own kernel
    (a reduction and a pointwise op cannot fuse into one)."""
    fn = torch.compile(lambda x: ((x * 2).sin(), x.cos().sum(0)))
    x = torch.randn(64, 32)
    fn(x)
    return fn, x


def _kernel_writing(fn, x, which: int) -> tuple[str, str]:
    """(kernel name, argument) that writes output ``which`` of fn(x), found by
    its address (independent of the verdict engine)."""
    with DebugMode() as dm:
        out = fn(x)
    ptr = out[which].untyped_storage().data_ptr()
    for k in dm.kernels:
        for name, t in k.tensor_info.items():
            if t.writes and t.data_ptr == ptr:
                return k.kernel_name, name
    raise AssertionError("no kernel wrote that output")


def _record(step, fault=None):
    with DebugMode(record_final_state=True) as dm, \
            DebugMode.log_tensor_hashes(["bitwise", "norm"], hash_inputs=True):
        if fault:
            with perturb_kernel_output(*fault) as st:
                held = step()  # noqa: F841  (what the program keeps)
            assert st["hits"] == 1
        else:
            held = step()  # noqa: F841
    dm.operators  # noqa: B018
    return dm


def test_snapshot_holds_live_tensors_and_grads_not_freed_ones():
    a = torch.randn(1000)
    w = torch.nn.Parameter(torch.randn(50))
    (w * 2).sum().backward()
    dead = torch.randn(3000)
    dead_ptr, dead_n = dead.untyped_storage().data_ptr(), dead.untyped_storage().nbytes()
    del dead
    gc.collect()
    fs = FinalState.from_meta({"final_state": snapshot()})
    assert fs is not None
    for t in (a, a[10:20], w, w.grad):
        lo = t.data_ptr()
        assert fs.holds(("cpu", -1), lo, lo + t.element_size())
    # the freed storage's bytes are held only where the allocator gave them to a live tensor
    spans = [_span(o) for o in gc.get_objects() if issubclass(type(o), torch.Tensor)]
    reused = any(lo < dead_ptr + dead_n and dead_ptr < hi for lo, hi in filter(None, spans))
    assert fs.holds(("cpu", -1), dead_ptr, dead_ptr + dead_n) == reused


def _span(t):
    """The CPU byte range of a tensor's storage, None where it has none (other tests leave fake
    and meta tensors behind)."""
    try:
        if t.device.type != "cpu" or t.layout != torch.strided or type(t).__name__ == "FakeTensor":
            return None
        st = t.untyped_storage()
        return st.data_ptr(), st.data_ptr() + st.nbytes()
    except Exception:
        return None


@pytest.mark.parametrize("meta", [
    {"final_state": None}, {"final_state": []}, {"final_state": {"ranges": "x"}},
    {"final_state": {"ranges": [["cpu", -1, 10, 5]]}}, {"final_state": {"ranges": [["cpu", -1, 0, 10], ["cpu", -1, 5, 20]]}},
    {"final_state": {"ranges": [[0, -1, 0, 10]]}}, {"final_state": {"ranges": [["cpu", True, 0, 10]]}}, [], None])
def test_a_malformed_final_state_is_no_final_state(meta):
    assert FinalState.from_meta(meta) is None


def test_an_output_dropped_unread_is_benign_a_kept_one_is_not(two_out):
    fn, x = two_out
    sum_kernel, arg = _kernel_writing(fn, x, 1)

    def drops():
        y, _ = fn(x)  # the column sums are freed unread
        return y

    def keeps():
        return fn(x)

    r = kdebug.compare(_record(drops), _record(drops, (sum_kernel, arg)))
    assert r.ok and not r.roots
    assert [b.step_a.name for b in r.benign] == [sum_kernel]
    assert r.benign[0].freed == 1 and r.benign[0].reaches_end == 0
    assert "freed without being read" in str(r)

    r = kdebug.compare(_record(keeps), _record(keeps, (sum_kernel, arg)))
    assert not r.ok
    assert [x.step_a.name for x in r.roots] == [sum_kernel]
    assert r.roots[0].reaches_end == 1 and r.roots[0].freed == 0 and r.roots[0].kept_known


def test_without_a_final_state_an_unread_difference_counts_as_possibly_kept(two_out):
    fn, x = two_out
    sum_kernel, arg = _kernel_writing(fn, x, 1)

    def drops():
        y, _ = fn(x)
        return y

    def rec(fault=None):
        with DebugMode() as dm, DebugMode.log_tensor_hashes(["bitwise", "norm"], hash_inputs=True):
            if fault:
                with perturb_kernel_output(*fault):
                    drops()
            else:
                drops()
        return dm

    r = kdebug.compare(rec(), rec((sum_kernel, arg)))
    assert not r.ok and r.roots[0].reaches_end == 1 and not r.roots[0].kept_known
    assert "possibly kept: the final state is not known" in str(r)


def test_the_final_state_survives_a_trace_round_trip(tmp_path, two_out):
    fn, x = two_out
    dm = _record(lambda: fn(x))
    dm.save(str(tmp_path / "a.kdt"))
    run = kdebug.load(str(tmp_path / "a.kdt"))
    assert run.meta["final_state"] == dm.final_state
    assert FinalState.from_meta(run.meta) is not None


_SCRIPT = textwrap.dedent("""
    import sys, torch
    torch.manual_seed(0)
    from kdebug.testing import perturb_kernel_output
    fn = torch.compile(lambda x: ((x * 2).sin(), x.cos().sum(0)))
    x = torch.randn(64, 32)
    fn(x)

    def main():
        with perturb_kernel_output(sys.argv[1], sys.argv[2], value=float(sys.argv[3])):
            y, s = fn(x)
        KEEP.append(y)
        {keep_s}

    KEEP = []
    main()
""")


@pytest.mark.parametrize("keep", [False, True])
def test_kdebug_record_takes_the_final_state_of_a_script(tmp_path, two_out, keep):
    """Through the runner (kdebug hunt / record): what the script's globals
    hold at its end is kept; what died with main()'s locals is freed."""
    fn, x = two_out
    sum_kernel, arg = _kernel_writing(fn, x, 1)
    script = tmp_path / "s.py"
    script.write_text(_SCRIPT.replace("{keep_s}", "KEEP.append(s)" if keep else "pass"))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")])}
    paths = []
    for i, value in enumerate((1.0, 2.0)):
        out = str(tmp_path / f"r{i}.kdt")
        p = subprocess.run([sys.executable, "-m", "kdebug", "record", "-o", out, "--", "python", str(script),
                            sum_kernel, arg, str(value)], capture_output=True, text=True, env=env, timeout=600)
        assert p.returncode == 0, p.stderr[-3000:]
        paths.append(out)
    r = kdebug.compare(*paths)
    assert kdebug.load(paths[0]).meta["final_state"]["tensors"] > 0
    if keep:
        assert not r.ok and r.roots[0].step_a.name == sum_kernel and r.roots[0].reaches_end == 1
    else:
        assert r.ok and [b.step_a.name for b in r.benign] == [sum_kernel] and r.benign[0].freed == 1
