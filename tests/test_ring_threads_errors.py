"""Ring overflow, threads, failures inside the hook, and the disabled path."""
from __future__ import annotations

import threading
import warnings

import pytest
import torch

import kdebug
from kdebug import DebugMode, KdebugWarning, _KernelCall


def _many_kernels(x):
    # two graphs (a graph break between them): at least two C++ kernels per call
    y = torch.sin(x) + 1
    torch._dynamo.graph_break()
    return torch.cos(y) * 2


@pytest.fixture(scope="module")
def many():
    x = torch.randn(32)
    fn = torch.compile(_many_kernels)
    fn(x)
    with DebugMode() as dm:
        fn(x)
    per_call = len(dm.kernels)
    assert per_call >= 2
    return fn, x, per_call


@pytest.mark.parametrize("overflow", ["overwrite", "drop_new"])
def test_ring_wraps_and_counts_dropped(many, overflow):
    fn, x, per_call = many
    calls = 10
    # each launch here takes 3 slots (header, in_ptr0, out_ptr0): 16 slots hold 5
    with pytest.warns(KdebugWarning, match=r"dropped because the ring \(16 slots"):
        with DebugMode(kernels_only=True, ring_capacity=16, overflow=overflow) as dm:
            for _ in range(calls):
                fn(x)
        kept = dm.kernels
    total = calls * per_call
    stats = dm.kernel_stats
    assert stats["launches"] + stats["refused"] >= total
    assert len(kept) + stats["dropped"] == total  # exact accounting
    assert 0 < len(kept) <= 16 // 3
    idx = [k.launch_index for k in kept]
    if overflow == "overwrite":  # the newest survive
        assert idx == list(range(total - len(kept), total))
    else:  # the oldest survive
        assert idx == list(range(len(kept)))
    assert not dm.complete
    assert dm.debug_string().startswith(f"# kdebug: INCOMPLETE: {stats['dropped']} launch(es) dropped")


def _drop_warnings(w) -> list[int]:
    """The counts of the 'dropped because the ring' warnings caught in w."""
    return [int(str(m.message).split("kdebug: ")[1].split()[0]) for m in w
            if "dropped because the ring" in str(m.message)]


def test_problem_counts_are_the_stats_counters_and_warn_once_per_growth(many):
    """Note [Problems at exit]: the exit reads Recorder.problem_counts, the
    counters of stats() it warns about, and warns once each time one grows."""
    fn, x, per_call = many
    dm = DebugMode(kernels_only=True, ring_capacity=16)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        with dm:
            for _ in range(10):
                fn(x)
        first = _drop_warnings(w)
        p, s = dm._recorder.problem_counts(), dm._recorder.stats()
        assert first == [s["dropped"]] and p.dropped == s["dropped"] > 0
        assert (p.errors, p.outputs_skipped, p.readonly_changed, p.hash_unsupported) == \
            (s["errors"], s["outputs_skipped"], s["readonly_changed"], s["hash_unsupported"]) == (0, 0, 0, 0)
        dm.kernels  # a read reports problems too: nothing grew, no second warning
        assert _drop_warnings(w) == first
        with dm:  # entered again: more launches dropped, warned again with the new count
            for _ in range(10):
                fn(x)
        counts = _drop_warnings(w)
        assert len(counts) == 2 and counts[1] > counts[0]
        assert counts[1] == dm._recorder.problem_counts().dropped == dm._recorder.stats()["dropped"]
    kdebug._C._inject_hook_faults(1)
    with pytest.warns(KdebugWarning, match=r"1 error\(s\) inside the launch hook"):
        with DebugMode(kernels_only=True) as bad:
            fn(x)
    assert bad._recorder.problem_counts().errors == bad._recorder.stats()["errors"] == 1


def test_problems_counted_again_after_the_records_are_replaced_warn_again(many):
    """The exit looks at the counters only when Recorder.problem_state (all
    of them, packed) changed.  Replacing the records (dm.operators = [])
    clears the counters; the same number of drops again is new and warned
    about again (before 2026-11-29 it was not: the count warned about was kept)."""
    fn, x, _ = many
    dm = DebugMode(kernels_only=True, ring_capacity=16)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        with dm:
            for _ in range(10):
                fn(x)
        first = _drop_warnings(w)
        state = dm._recorder.problem_state()
        assert len(first) == 1 and first[0] == dm._recorder.problem_counts().dropped > 0
        dm.operators = []
        assert dm._recorder.problem_state() != state
        with dm:
            for _ in range(10):
                fn(x)
        assert dm._recorder.problem_state() == state  # the same counts as before the replacement
        assert _drop_warnings(w) == first + first  # and warned about again


def test_a_warning_raised_as_an_error_leaves_the_other_problems_for_the_next_look(many):
    """Under a filter that turns warnings into errors (pytest -W error), the
    exit's first warning raises; a problem of another kind found by the same
    look is still warned about at the next read (the counters are marked as
    looked at only once every warning went out)."""
    fn, x, _ = many
    dm = DebugMode(kernels_only=True, ring_capacity=16)
    with warnings.catch_warnings():
        warnings.simplefilter("error", KdebugWarning)
        with pytest.raises(KdebugWarning, match="dropped because the ring"):
            with dm:
                kdebug._C._inject_hook_faults(1)
                for _ in range(10):
                    fn(x)
        assert dm._recorder.problem_counts().errors == 1
        with pytest.raises(KdebugWarning, match=r"1 error\(s\) inside the launch hook"):
            dm.kernels
        dm.kernels  # everything was said: no third warning


def test_reading_mid_run_keeps_everything(many):
    fn, x, per_call = many
    with DebugMode(kernels_only=True, ring_capacity=64) as dm:
        for _ in range(10):
            fn(x)
            assert len(dm.kernels) > 0  # reading drains the ring into the store
    assert len(dm.kernels) == 10 * per_call and dm.complete


def test_threads_each_with_their_own_mode(many):
    fn, x, per_call = many
    n_threads, iters = 4, 15
    results, errors = {}, []
    barrier = threading.Barrier(n_threads)

    def work(t):
        try:
            barrier.wait()
            with DebugMode(kernels_only=True) as dm:
                for _ in range(iters):
                    fn(x + t)
            results[t] = (threading.get_ident(), dm)
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(n_threads)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors
    names = None
    for t, (ident, dm) in results.items():
        ks = dm.kernels
        assert len(ks) == iters * per_call, (t, len(ks))
        assert {k.thread_id for k in ks} == {ident}
        seq = [k.kernel_name for k in ks]
        names = names or seq
        assert seq == names  # records are intact: same kernels, same order
        assert all(k.args[0].shape == torch.Size([32]) for k in ks)
        assert dm.complete


def test_record_all_threads(many):
    fn, x, per_call = many
    done = []

    def worker():
        for _ in range(5):
            fn(x)
        done.append(threading.get_ident())

    with DebugMode(kernels_only=True, record_all_threads=True) as dm:
        th = [threading.Thread(target=worker) for _ in range(3)]
        for t in th:
            t.start()
        for t in th:
            t.join()
    ks = dm.kernels
    assert len(ks) == 15 * per_call
    assert {k.thread_id for k in ks} == set(done)


def test_failures_inside_the_hook_are_counted_not_raised(many):
    fn, x, per_call = many
    ref = _many_kernels(x)
    kdebug._C._inject_hook_faults(2)
    with pytest.warns(KdebugWarning, match=r"2 error\(s\) inside the launch hook; 2 launch\(es\) were not recorded"):
        with DebugMode(kernels_only=True) as dm:
            out = fn(x)
        dm.kernels
    torch.testing.assert_close(out, ref)  # the program ran unchanged
    s = dm.kernel_stats
    assert s["errors"] == 2 and s["unrecorded"] == 2
    assert len(dm.kernels) == per_call - 2
    assert "injected fault" in s["error_messages"][0]
    assert not dm.complete and "2 launch(es) not recorded (hook errors)" in dm.debug_string()


def test_undescribable_argument_is_an_error_not_a_crash():
    calls = []

    def kernel(*args):
        calls.append(args)
        return "ran"

    info = kdebug._C.KernelInfo(kdebug._C.KIND_CPP, "my_kernel", ["in_ptr0", "out_ptr0"], [1, 2], 0, -1)
    wrapped = kdebug._C.CppKernel(kernel, info)
    sparse = torch.randn(4, 4).to_sparse()
    with pytest.warns(KdebugWarning, match="could not describe an argument of my_kernel: tensor layout is not strided"):
        with DebugMode(kernels_only=True) as dm:
            assert wrapped(sparse, torch.zeros(4)) == "ran"
            assert wrapped(torch.ones(2), torch.zeros(2)) == "ran"
    ks = dm.kernels
    assert len(calls) == 2 and len(ks) == 1
    s = dm.kernel_stats
    assert s["errors"] == 1 and s["unrecorded"] == 1 and "not strided" in s["error_messages"][0]


def test_a_raising_kernel_is_recorded_and_still_raises():
    def kernel(*args):
        raise RuntimeError("boom from the kernel")

    info = kdebug._C.KernelInfo(kdebug._C.KIND_CPP, "bad_kernel", ["in_ptr0"], [1], 0, -1)
    wrapped = kdebug._C.CppKernel(kernel, info)
    with DebugMode(kernels_only=True) as dm:
        with pytest.raises(RuntimeError, match="boom from the kernel"):
            wrapped(torch.ones(3))
    (k,) = dm.kernels
    assert k.raised and k.kernel_name == "bad_kernel"


def test_disabled_path_records_nothing_and_changes_nothing(many):
    fn, x, per_call = many
    with DebugMode(kernels_only=True) as dm:
        fn(x)
    assert dm.kernel_stats["launches"] == per_call
    # the generated module's kernels really are wrapped: the calls below go through the hook
    from torch._inductor.codecache import PyCodeCache

    wrapped = [v for m in PyCodeCache.modules for k, v in vars(m).items()
               if k.startswith("cpp_fused") and isinstance(v, kdebug._C.CppKernel)]
    assert wrapped
    for _ in range(5):
        out = fn(x)
    torch.testing.assert_close(out, _many_kernels(x))
    assert dm.kernel_stats["launches"] == per_call  # nothing more recorded after exit
    assert kdebug._C._inductor_get_active_debug_mode() is None


def test_bad_flags_say_what_to_do():
    with pytest.raises(TypeError, match="unknown flag.*record_kernelz.*record_triton_kernels"):
        DebugMode(record_kernelz=True)
    with pytest.raises(ValueError, match="'overwrite'.*'drop_new'"):
        DebugMode(overflow="ring")
    with pytest.raises(ValueError, match="capacity must be between 16"):
        DebugMode(ring_capacity=3)
    with pytest.raises(ValueError, match="records nothing"):
        DebugMode(kernels_only=True, record_triton_kernels=False)
    dm = DebugMode(kernels_only=True)
    with dm:
        with pytest.raises(RuntimeError, match="already recording"):
            dm.__enter__()


def test_cpp_wrapper_is_reported_as_incomplete():
    def f(x):
        return (x.exp() + 1).sum()

    x = torch.randn(16)
    cf = torch.compile(f, options={"cpp_wrapper": True})
    cf(x)
    with pytest.warns(KdebugWarning, match="cpp_wrapper.*NOT recorded"):
        with DebugMode(kernels_only=True) as dm:
            out = cf(x)
    torch.testing.assert_close(out, f(x))
    s = dm.kernel_stats
    assert s["bypassed_graph_calls"] == {"cpp_wrapper": 1}
    assert not dm.complete
    assert "through cpp_wrapper not recorded" in dm.debug_string()


def test_global_cpp_wrapper_config_warns_at_entry():
    with torch._inductor.config.patch(cpp_wrapper=True):
        with pytest.warns(KdebugWarning, match="cpp_wrapper=True"):
            with DebugMode(kernels_only=True):
                pass


@pytest.mark.parametrize("cuda, recorded, setting, warned", [
    (True, False, True, True),     # a GPU host, kdebug without CUDA graph support, graphs on: warned
    (True, True, True, False),     # replays are recorded (a CUDA build): nothing to warn about
    (True, False, False, False),   # graphs off
    (False, False, True, False),   # no GPU
])
def test_cuda_graph_config_warns_at_entry_only_where_replays_go_unrecorded(monkeypatch, cuda, recorded, setting,
                                                                           warned):
    from kdebug import cudagraphs, inductor

    monkeypatch.setattr(inductor, "_cuda_available", lambda: cuda)
    monkeypatch.setattr(cudagraphs, "_installed", recorded)
    with torch._inductor.config.patch({"triton.cudagraphs": setting}):
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            with DebugMode(kernels_only=True):
                pass
    said = [str(m.message) for m in w if "triton.cudagraphs=True" in str(m.message)]
    assert len(said) == (1 if warned else 0), said
