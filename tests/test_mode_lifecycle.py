"""Kept records stay what they were, nested modes say what they missed, and
entering / exiting a DebugMode is all or nothing."""
from __future__ import annotations

import warnings

import pytest
import torch

import kdebug
from kdebug import DebugMode, KdebugWarning, _C


@pytest.fixture(scope="module")
def fns():
    f = torch.compile(lambda x: x.sin() * 2)
    g = torch.compile(lambda x: x.cos() + 1)
    x = torch.randn(16)
    f(x), g(x)
    return f, g, x


def _snapshot(k):
    return (k.kernel_name, k.launch_index, k.kwargs_str, repr(k), k.post_hashes, k.record)


@pytest.mark.parametrize("how", ["operators", "reset"])
def test_a_kept_kernel_record_keeps_its_launch_after_the_list_is_cleared(fns, how):
    f, g, x = fns
    with DebugMode() as dm, DebugMode.log_tensor_hashes("bitwise"), DebugMode.record_outputs():
        f(x)
        kept = dm.kernels[0]
        before = _snapshot(kept)
        if how == "reset":
            dm.reset()
        else:
            dm.operators = []
        g(x)  # a new launch at store index 0, launch index 0
        new = dm.kernels[0]
    assert new.kernel_name != before[0] and new.launch_index == before[1]
    assert _snapshot(kept) == before[:5] + (kept.record,)
    assert kept.kernel_name == before[0] and kept.post_hashes == before[4]
    torch.testing.assert_close(kept.record["output"]["out_ptr0"], before[5]["output"]["out_ptr0"])
    torch.testing.assert_close(kept.record["output"]["out_ptr0"], x.sin() * 2)
    assert kept._launch.detached and not new._launch.detached


def test_a_kept_launch_view_keeps_its_argument_objects(fns):
    f, g, x = fns
    with DebugMode(store_original_args=True) as dm:
        f(x)
        k = dm.kernels[0]
        objs = k.args
        dm.operators = []
        g(torch.randn(16))
    assert all(a is b for a, b in zip(k.args, objs)) and k.args[0] is x


def test_custom_hashes_of_a_kept_record_are_its_own(fns):
    f, g, x = fns
    with DebugMode() as dm, DebugMode.log_tensor_hashes(lambda t: float(t.sum())):
        f(x)
        k = dm.kernels[0]
        v = k.post_hashes
        dm.operators = []
        g(x)
    assert k.post_hashes == v == {"out_ptr0": pytest.approx(float((x.sin() * 2).sum()))}
    assert dm.kernels[0].post_hashes == {"out_ptr0": pytest.approx(float((x.cos() + 1).sum()))}


def test_operators_replaced_while_recording_gets_the_new_launches_in_order(fns):
    f, g, x = fns
    with DebugMode() as dm:
        f(x)
        old = dm.operators
        assert len(old) == 1  # read: the launch is merged in
        dm.operators = []
        g(x)
        torch.add(x, 1)
        g(x)
    names = [getattr(o, "kernel_name", None) or str(o.op) for o in dm.operators]
    assert names[0].startswith("cpp_fused_add_cos") and names[1] == "aten.add.Tensor"
    assert names[2].startswith("cpp_fused_add_cos") and len(names) == 3
    assert [getattr(o, "kernel_name", "") for o in old][0].startswith("cpp_fused_mul_sin")  # left alone


def test_nested_mode_marks_the_outer_incomplete(fns):
    f, g, x = fns
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with DebugMode() as outer:
            f(x)
            with DebugMode() as inner:
                g(x)
                torch.add(x, 1)
                g(x)
            f(x)
    inner_n = len(inner.kernels)
    assert inner_n == 2 and inner.complete
    assert len(outer.kernels) == 2
    assert not outer.complete and outer.kernel_stats["nested_unrecorded"] == inner_n
    assert outer.debug_string().startswith(
        f"# kdebug: INCOMPLETE: {inner_n} launch(es) recorded only by a nested DebugMode")
    assert any("nested kdebug DebugMode" in str(w.message) for w in caught
               if issubclass(w.category, KdebugWarning))
    # aten ops are recorded by both, as upstream does
    assert sum(str(getattr(o, "op", "")) == "aten.add.Tensor" for o in outer.operators) == 1


def test_sequential_modes_stay_complete(fns):
    f, g, x = fns
    with DebugMode() as a:
        f(x)
    with DebugMode() as b:
        g(x)
    assert a.complete and b.complete


def test_failed_enter_leaves_nothing_behind(fns, tmp_path):
    f, g, x = fns
    depth = torch._C._len_torch_dispatch_stack()
    dm = DebugMode(trace=str(tmp_path / "missing" / "run.kdt"))
    with pytest.raises(FileNotFoundError):
        dm.__enter__()
    assert torch._C._len_torch_dispatch_stack() == depth
    assert kdebug.get_active_debug_mode() is None
    assert _C._inductor_get_active_debug_mode() is None
    assert not dm._recorder.is_recording()
    f(x)
    torch.add(x, 1)
    assert dm.kernel_stats["seen"] == 0 and len(dm.operators) == 0
    with pytest.raises(RuntimeError, match="without a matching __enter__"):
        dm.__exit__(None, None, None)
    with DebugMode() as ok:  # the next one works
        f(x)
    assert len(ok.kernels) == 1 and ok.complete


def test_failed_kernels_only_enter_undoes_every_step(fns, tmp_path):
    """Note [Transactional enter] with the op observer and the deferral mode:
    each is undone, last first, and an undo that fails is chained to the
    failure, as an ExitStack chains it."""
    f, g, x = fns
    prev_defer = _C._set_defer(0)
    _C._set_defer(prev_defer)
    dm = DebugMode(kernels_only=True, record_extern_ops=True, trace=str(tmp_path / "missing" / "run.kdt"))
    with pytest.raises(FileNotFoundError):
        dm.__enter__()
    assert dm._op_handle is None and not dm._recorder.is_recording()
    assert kdebug.get_active_debug_mode() is None
    assert _C._set_defer(prev_defer) == prev_defer  # put back as it was before the enter
    order = []
    dm = DebugMode(kernels_only=True, trace=str(tmp_path / "missing" / "run.kdt"))
    stop = dm._recorder.stop

    class Boom(Exception):
        pass

    def failing_stop():
        order.append("stop")
        stop()
        raise Boom("undo failed")

    dm._recorder = _RecorderProxy(dm._recorder, failing_stop)
    with pytest.raises(Boom) as info:
        dm.__enter__()
    assert order == ["stop"]
    assert isinstance(info.value.__context__, FileNotFoundError)
    assert not dm._recorder.is_recording() and kdebug.get_active_debug_mode() is None
    with DebugMode(kernels_only=True) as ok:  # the next one works
        f(x)
    assert len(ok.kernels) == 1 and ok.complete


class _RecorderProxy:
    """A Recorder whose stop is replaced (a C type's method cannot be set)."""

    def __init__(self, rec, stop):
        self._rec, self.stop = rec, stop

    def __getattr__(self, name):
        return getattr(self._rec, name)


def test_exit_without_enter_is_a_clear_error():
    with pytest.raises(RuntimeError, match=r"__exit__ was called without a matching __enter__"):
        DebugMode().__exit__(None, None, None)
    dm = DebugMode()
    with dm:
        pass
    with pytest.raises(RuntimeError, match="without a matching __enter__ \\(or twice\\)"):
        dm.__exit__(None, None, None)


def test_a_record_that_could_not_be_kept_raises_instead_of_showing_another(fns):
    f, g, x = fns
    with DebugMode() as dm:
        f(x)
        kept = dm.kernels[0]
        _C._inject_detach_faults(1)  # its copy fails, as out of memory would
        try:
            dm.operators = []
        finally:
            _C._inject_detach_faults(0)
        g(x)
    assert dm.kernels[0].kernel_name.startswith("cpp_fused_add_cos")  # store index 0 is another launch now
    with pytest.raises(RuntimeError, match="was cleared .* could not be kept"):
        kept.kernel_name
    with pytest.raises(RuntimeError, match="was cleared"):
        repr(kept)


def test_exit_out_of_order_is_refused_and_leaves_both_modes_whole(fns):
    f, g, x = fns
    outer, inner = DebugMode(), DebugMode()
    outer.__enter__()
    inner.__enter__()
    with pytest.raises(RuntimeError, match="innermost first"):
        outer.__exit__(None, None, None)
    f(x)  # still recorded by the inner mode
    inner.__exit__(None, None, None)
    outer.__exit__(None, None, None)
    assert len(inner.kernels) == 1 and kdebug.get_active_debug_mode() is None
    assert outer.kernel_stats["nested_unrecorded"] == 1


def test_exit_on_another_thread_is_refused(fns):
    import threading

    dm = DebugMode()
    dm.__enter__()
    errors = []
    t = threading.Thread(target=lambda: errors.append(pytest.raises(RuntimeError, dm.__exit__, None, None, None)))
    t.start()
    t.join()
    assert "thread that entered it" in str(errors[0].value)
    dm.__exit__(None, None, None)  # the entering thread still can
    assert kdebug.get_active_debug_mode() is None


def test_a_saved_nested_recording_says_it_is_incomplete(fns, tmp_path):
    f, g, x = fns
    with DebugMode() as outer:
        with DebugMode():
            g(x)
        f(x)
    path = tmp_path / "outer.kdt"
    outer.save(path)
    run = kdebug.load(str(path))
    assert not run.complete
    assert any("1 launch(es) were recorded only by a nested DebugMode" in p for p in run.problems())


def test_the_compile_window_outlives_dynamo_reset(monkeypatch):
    """torch._dynamo.reset() clears dynamo's compile callbacks; kdebug's
    compile window (nothing run while compiling is recorded, Note [Autotuning
    is not the program]) must still hold in a compile after it.  Probed where
    Inductor generates code: kdebug's compiling depth seen there."""
    import torch._inductor.graph as inductor_graph

    seen = []
    orig = inductor_graph.GraphLowering.codegen

    def codegen(self, *a, **k):
        seen.append(_C._set_compiling(True) - 1)  # the depth before this probe
        _C._set_compiling(False)
        return orig(self, *a, **k)

    monkeypatch.setattr(inductor_graph.GraphLowering, "codegen", codegen)
    # (torch's config.patch: monkeypatch.setattr on a torch config module breaks its later patch() calls)
    with torch._inductor.config.patch(fx_graph_cache=False):  # generate code each time
        for reset in (torch._dynamo.reset, torch.compiler.reset):
            reset()
            f = torch.compile(lambda x: x.sin() + 1)
            with DebugMode() as dm:
                f(torch.randn(8))
            assert dm.complete
    assert seen == [1, 1]


@pytest.mark.parametrize("all_threads", [False, True])
def test_recording_here_is_the_threads_recorder_without_side_effects(fns, all_threads):
    """_C._recording_here() and _C._mode_here() (what a compiled graph's call
    asks on a thread whose Python-side state knows no recording, as
    autograd's device thread running the backward on CUDA, to record it and
    to note a bypass on the right mode): the mode on the entering thread and
    on every thread with record_all_threads, nothing on an unrelated thread
    otherwise and after the exit."""
    import threading

    seen = {}

    def other():
        seen["other"] = (_C._recording_here(), _C._mode_here())

    assert not _C._recording_here() and _C._mode_here() is None
    with DebugMode(kernels_only=True, record_all_threads=all_threads) as dm:
        assert _C._recording_here() and _C._mode_here() is dm
        t = threading.Thread(target=other)
        t.start()
        t.join()
        assert seen["other"] == ((True, dm) if all_threads else (False, None))
    assert not _C._recording_here() and _C._mode_here() is None


def test_kept_rings_give_their_address_space_back_when_a_new_ring_needs_it():
    """Note [Spare rings]: released rings are kept with their address space;
    under a limit on it (ulimit -v) a ring that fits once the earlier ones
    are gone is made all the same (the kept rings are unmapped and the
    mapping is tried again), not refused with "pass a smaller ring_capacity"."""
    import subprocess
    import sys

    script = r"""
import resource
import kdebug
def vm():
    with open("/proc/self/status") as fh:
        return next(int(l.split()[1]) * 1024 for l in fh if l.startswith("VmSize"))
GB = 1 << 30
half = (512 << 20) // 128  # slots of a 512 MB ring
kdebug.DebugMode(kernels_only=True, ring_capacity=16)  # the first one's one-time tables, before measuring
resource.setrlimit(resource.RLIMIT_AS, (vm() + int(2.5 * GB), resource.RLIM_INFINITY))
modes = [kdebug.DebugMode(kernels_only=True, ring_capacity=half) for _ in range(4)]
del modes  # 2 GB of rings released: kept
dm = kdebug.DebugMode(kernels_only=True, ring_capacity=2 * half)  # 1 GB: fits only without them
print("made", dm._recorder.capacity)
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and f"made {1 << 23}" in out.stdout, out.stderr[-2000:]
