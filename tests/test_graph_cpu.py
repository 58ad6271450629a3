"""The CUDA-graph recording's C bookkeeping (Note [CUDA graph replays] in
csrc/kd_graph.c) on real Inductor C++ kernels: kdebug's capture / replay entry
points are called directly (a CPU build has no CUDA graph; the kernels run, the
bookkeeping is the same).  The GPU side is tests/test_gpu_cudagraphs.py."""
from __future__ import annotations

import torch

from kdebug import DebugMode, _C


def _capture(fn, inputs) -> int:
    h = _C.graph_capture_begin(0, 0)
    assert h, "a recording is active: the capture gets a handle"
    _C.graph_capture_started(h, 0)
    try:
        fn(*inputs)
    finally:
        _C.graph_capture_end(h)
    return h


def test_replays_copy_the_template(compiled_cpu, cpu_inputs):
    with DebugMode(record_triton_kernels=True) as dm:
        h = _capture(compiled_cpu, cpu_inputs)
        assert [_C.graph_replay(h, 0) for _ in range(2)] == [0, 1]
    ks = dm.kernels
    captured = [k for k in ks if k.cuda_graph and k.cuda_graph["replay"] is None]
    assert captured, "the capture's launches are recorded as captured"
    gid = captured[0].cuda_graph["graph"]
    for n in (0, 1):
        rep = [k for k in ks if k.cuda_graph == {"graph": gid, "replay": n}]
        assert [k.kernel_name for k in rep] == [k.kernel_name for k in captured]
        assert [k.arg_names for k in rep] == [k.arg_names for k in captured]
    _C.graph_release(h)


def test_replay_records_hold_no_lapped_objects(compiled_cpu, cpu_inputs):
    """store_original_args keeps launch argument objects by ring slot; a
    replay's records have none, and must not show those of an older launch
    its records overwrote in the ring (overflow='overwrite')."""
    with DebugMode(record_triton_kernels=True, store_original_args=True, ring_capacity=64,
                   overflow="overwrite") as dm:
        for _ in range(4):  # fills the ring with launches holding their tensors
            compiled_cpu(*cpu_inputs)
        h = _capture(compiled_cpu, cpu_inputs)
        for _ in range(8):  # laps everything before it
            _C.graph_replay(h, 0)
    ks = dm.kernels
    replayed = [k for k in ks if k.cuda_graph and k.cuda_graph["replay"] is not None]
    assert replayed, "replays recorded"
    held = [k for k in replayed if k._launch.objects is not None and
            any(isinstance(o, torch.Tensor) for o in k._launch.objects)]
    assert not held, f"{len(held)} of {len(replayed)} replay record(s) show another launch's tensors"
    _C.graph_release(h)


def test_nested_capture_is_counted_not_raised(compiled_cpu, cpu_inputs):
    """A second capture begun on a thread already capturing: no exception
    reaches the program; the outer graph says its template is unreliable and
    the inner one is left unknown (its replays counted as such)."""
    with DebugMode(record_triton_kernels=True):
        outer = _C.graph_capture_begin(0, 0)
        _C.graph_capture_started(outer, 0)
        try:
            inner = _C.graph_capture_begin(0, 0)
        finally:
            _C.graph_capture_end(outer)
    assert inner == 0
    g = next(g for g in _C.graph_stats()["graphs"] if g["graph_id"] == outer)
    assert g["unrecorded"] == 1, g  # complete=False (a CPU build's first error is its missing CUDA)
    _C.graph_release(outer)


def test_since_counts_the_window_only(compiled_cpu, cpu_inputs):
    """A recording's graphs (cudagraphs.since) count the replays in its own
    window: not those before it began, nor those after it ended."""
    from kdebug import cudagraphs

    with DebugMode(record_triton_kernels=True):
        h = _capture(compiled_cpu, cpu_inputs)
        for _ in range(3):
            _C.graph_replay(h, 0)
    gid = int(h)
    start = cudagraphs.snapshot()
    with DebugMode(record_triton_kernels=True):
        for _ in range(2):
            _C.graph_replay(h, 0)
    end = cudagraphs.snapshot()
    _C.graph_replay(h, 0)
    graphs, unknown = cudagraphs.since(start, end)
    assert [(g.graph_id, g.replays) for g in graphs] == [(gid, 2)]
    assert unknown == 0
    now, _ = cudagraphs.since(start)
    assert [(g.graph_id, g.replays) for g in now] == [(gid, 3)]
    assert next(g for g in cudagraphs.graphs() if g.graph_id == gid).replays == 6
    assert cudagraphs.since(end, end)[0] == []
    _C.graph_release(h)


def test_custom_hash_fn_does_not_run_during_capture(compiled_cpu, cpu_inputs):
    """A hash_fn reads values on the host: during a capture the launches did
    not run (and the host reads would break it).  Not called; counted on the
    graph as hash errors, and as hook errors of the recording."""
    calls = []

    def fn(t):
        calls.append(1)
        return float(t.abs().sum())

    with DebugMode(kernels_only=True) as dm:
        with DebugMode.log_tensor_hashes(hash_fn=fn, hash_inputs=True):
            compiled_cpu(*cpu_inputs)
            outside = len(calls)
            assert outside > 0
            h = _capture(compiled_cpu, cpu_inputs)
    assert len(calls) == outside
    g = next(g for g in _C.graph_stats()["graphs"] if g["graph_id"] == h)
    assert g["hash_errors"] >= outside, g
    assert any("CUDA graph capture" in m for m in dm.kernel_stats["error_messages"])
    _C.graph_release(h)


def test_graph_marks_survive_a_trace_file(compiled_cpu, cpu_inputs, tmp_path):
    """Trace format 1.3: a captured launch's graph id and a replay's graph id
    and replay index are written and read back (before, a loaded trace showed
    graph 0, replay 0 for every record: values never recorded)."""
    import kdebug

    path = tmp_path / "graphs.kdt"
    with DebugMode(trace=path) as dm:
        compiled_cpu(*cpu_inputs)
        h = _capture(compiled_cpu, cpu_inputs)
        for _ in range(3):
            _C.graph_replay(h, 0)
    live = [k.cuda_graph for k in dm.kernels]
    gid = next(g["graph"] for g in live if g is not None)
    assert gid > 0 and {g["replay"] for g in live if g is not None} == {None, 0, 1, 2}
    loaded = [k.cuda_graph for k in kdebug.load(path).kernels]
    assert loaded == live
    _C.graph_release(h)


def test_the_replay_wrapper_says_whether_the_replay_was_queued(compiled_cpu, cpu_inputs, monkeypatch):
    """Note [Results in flight]: the CUDAGraph.replay wrapper ends the
    replay's reservation after the replay, saying whether it was queued (a
    replay that raised will never write its hash results); the planted
    collect (kdebug.testing.collect_before_replay) runs in between."""
    from kdebug import cudagraphs, testing

    calls = []
    monkeypatch.setattr(_C, "graph_replay_queued", lambda ok: calls.append(("queued", ok)))
    monkeypatch.setattr(_C, "hash_collect", lambda: calls.append(("collect",)) or 0)
    monkeypatch.setattr(cudagraphs, "_current_stream", lambda: 0)  # a CPU build: no CUDA stream

    class Graph:  # a CUDAGraph's Python face: kdebug's handle in its __dict__
        def replay(self, fail=False):
            calls.append(("replay",))
            if fail:
                raise RuntimeError("planted replay failure")

    with DebugMode(record_triton_kernels=True):
        g = Graph()
        g.__dict__[cudagraphs._HANDLE] = _capture(compiled_cpu, cpu_inputs)
        replay = cudagraphs._wrap_replay(Graph.replay)
        replay(g)
        with testing.collect_before_replay():
            replay(g)
            try:
                replay(g, fail=True)
            except RuntimeError:
                pass
            else:
                raise AssertionError("the replay's own error must reach the caller")
    assert calls == [("replay",), ("queued", True),
                     ("collect",), ("replay",), ("queued", True),
                     ("collect",), ("replay",), ("queued", False)], calls


def test_a_window_without_graph_activity_lists_nothing_and_one_with_it_does():
    """cudagraphs.since() answers from _C.graph_activity() alone when nothing
    happened in the window (no graph registered, no replay, no unknown
    replay); an unknown replay in the window still counts, and one after the
    window's end does not."""
    from kdebug import cudagraphs

    a0 = _C.graph_activity()
    start = cudagraphs.snapshot()
    quiet = cudagraphs.snapshot()
    assert cudagraphs.since(start, quiet) == ([], 0)
    _C.graph_unknown_replay()
    assert _C.graph_activity() == a0 + 1
    end = cudagraphs.snapshot()
    assert end.activity == a0 + 1 and end.unknown_replays == start.unknown_replays + 1
    assert cudagraphs.since(start, end) == ([], 1)
    _C.graph_unknown_replay()  # after the window
    assert cudagraphs.since(start, end) == ([], 1)
    assert cudagraphs.since(start) == ([], 2)
    assert cudagraphs.since(end, end) == ([], 0)
