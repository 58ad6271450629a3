"""CUDA graphs (Note [CUDA graph replays]): under mode="reduce-overhead" the
launches Inductor captures are recorded at capture (marked captured, no
values), and every replay produces one record per captured launch, with
hashes computed by hash kernels inside the graph: no host hashing, no
synchronization per replay.  The values are checked against kdebug's host
hash of what the compiled function returned; the hunt names a
non-deterministic kernel that only ever runs as a replay."""
from __future__ import annotations

import re
import subprocess
import sys

import pytest
import torch

import kdebug
from kdebug import DebugMode, hashing

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)


def _graph_kernels(dm):
    ks = dm.kernels
    captured = [k for k in ks if k.cuda_graph is not None and k.cuda_graph["replay"] is None]
    replayed = [k for k in ks if k.cuda_graph is not None and k.cuda_graph["replay"] is not None]
    return ks, captured, replayed


def test_replays_are_recorded_with_the_hashes_of_what_they_wrote():
    torch._dynamo.reset()
    f = torch.compile(lambda x: (x.sin() * 2).cos() + x.exp().sum(), mode="reduce-overhead")
    x = torch.randn(4096, device="cuda")
    outs = []
    with DebugMode(kernels_only=True) as dm, DebugMode.log_tensor_hashes("bitwise"):
        for i in range(6):
            outs.append(f(x + i).clone())  # cudagraph trees reuse their output memory
    torch.cuda.synchronize()
    assert dm.complete, dm.kernel_stats
    ks, captured, replayed = _graph_kernels(dm)
    assert captured, [k.kernel_name for k in ks]
    (g,) = [g for g in dm.cuda_graphs if g.launches]  # cudagraph trees also capture an empty graph
    assert g.launches == len(captured) and g.replays >= 3 and g.complete, g
    # captured launches did not run: no values
    assert all(v is None for k in captured for v in (k.post_hashes or {}).values()), captured[0].post_hashes
    per_replay = {}
    for k in replayed:
        per_replay.setdefault(k.cuda_graph["replay"], []).append(k)
    assert sorted(per_replay) == list(range(g.replays))
    assert all([k.kernel_name for k in v] == [k.kernel_name for k in captured] for v in per_replay.values())
    # the last kernel of each replay writes the returned tensor: its hash is the
    # host hash of one of the outputs, and the last replay's is the last call's
    expected = [hashing.bitwise(o, on_host=True) for o in outs]
    last_writes = [v[-1] for _, v in sorted(per_replay.items())]
    got = [next(iter(k.post_hashes.values())) for k in last_writes]
    assert got[-1] == expected[-1], (got, expected)
    assert all(h in expected for h in got), (got, expected)
    assert len(set(got)) == len(got)  # each replay's own values, not one slot read again
    text = dm.debug_string()
    assert re.search(r"# CUDA graph \d+ replay 0", text) and "(not run)" in text, text


def test_a_collect_between_reservation_and_replay_reads_no_unwritten_result():
    """Note [Results in flight]: a read-back of the GPU hash results planted
    between a replay's reservation of its results and the replay (where
    another thread's collect can land) stops before them; every replay's
    records still get the hashes of what the replay wrote, none a zero slot."""
    from kdebug import testing

    torch._dynamo.reset()
    f = torch.compile(lambda x: (x.sin() * 2).cos() + x.exp().sum(), mode="reduce-overhead")
    x = torch.randn(4096, device="cuda")
    outs = []
    with DebugMode(kernels_only=True) as dm, DebugMode.log_tensor_hashes("bitwise"):
        for i in range(3):  # warm-up, capture (recorded: the graph needs kdebug's capture) and a replay
            f(x + i)
        with testing.collect_before_replay():
            for i in range(6):
                outs.append(f(x + 10 + i).clone())
    torch.cuda.synchronize()
    assert dm.complete, dm.kernel_stats
    _, _, replayed = _graph_kernels(dm)
    per_replay = {}
    for k in replayed:
        per_replay.setdefault(k.cuda_graph["replay"], []).append(k)
    last6 = [v for _, v in sorted(per_replay.items())][-6:]
    assert len(per_replay) >= 6, sorted(per_replay)
    expected = [hashing.bitwise(o, on_host=True) for o in outs]
    got = [next(iter(v[-1].post_hashes.values())) for v in last6]
    assert got == expected, (got, expected)
    empty = hashing.bitwise(torch.empty(0, device="cuda"), on_host=True)  # what a zero slot reads as
    assert all(h is not None and h != empty for v in per_replay.values() for k in v
               for h in k.post_hashes.values()), [k.post_hashes for v in per_replay.values() for k in v]


def test_a_graph_captured_before_recording_is_reported_incomplete():
    torch._dynamo.reset()
    f = torch.compile(lambda x: x.sin() + 1, mode="reduce-overhead")
    x = torch.randn(1024, device="cuda")
    for _ in range(4):
        f(x)  # warm-up and capture without kdebug
    with pytest.warns(kdebug.KdebugWarning, match="captured while kdebug was not recording"):
        with DebugMode(kernels_only=True) as dm:
            f(x)
            f(x)
        dm.operators  # noqa: B018
    st = dm.kernel_stats
    assert not st["complete"] and st["unrecorded_graph_replays"] >= 1, st


def test_extern_kernels_inside_a_graph_are_counted_per_graph():
    torch._dynamo.reset()
    w = torch.randn(256, 256, device="cuda")
    f = torch.compile(lambda x: (x @ w).relu() + 1, mode="reduce-overhead")
    x = torch.randn(64, 256, device="cuda")
    with DebugMode(kernels_only=True) as dm, DebugMode.log_tensor_hashes("bitwise"):
        for _ in range(4):
            f(x)
    (g,) = [g for g in dm.cuda_graphs if g.launches]
    if g.kernel_nodes < 0:  # the runtime would not list the nodes of a graph being captured
        assert "could not be counted" in g.text() and g.error, g
    else:
        assert g.kernel_nodes >= g.launches + g.hash_kernels + 1, g  # the mm's cuBLAS kernel(s)
        assert g.undescribed_kernels >= 1 and "cuBLAS" in g.text(), g.text()


_SCRIPT = '''
import torch
def f(x, ind):
    return (torch.zeros(100, device=x.device).index_add(0, ind, x) * 2).sin()
g = torch.Generator(device="cuda").manual_seed(0)
x = torch.randn(400_000, device="cuda", generator=g)
ind = torch.randint(0, 100, (400_000,), device="cuda", generator=g)
cf = torch.compile(f, mode="reduce-overhead")
for _ in range(4):
    cf(x, ind)
'''


def test_hunt_names_the_atomic_kernel_replayed_from_a_cuda_graph(tmp_path):
    script = tmp_path / "graphs.py"
    script.write_text(_SCRIPT)
    p = subprocess.run([sys.executable, "-m", "kdebug", "hunt", "--runs", "2", "--no-magnitude", str(script)],
                       capture_output=True, text=True, timeout=600)
    out = p.stdout + p.stderr
    assert p.returncode == 1, out
    assert re.search(r"(ROOT CAUSE|FIRST DIVERGENCE).*triton_\w*index_add", out), out
    assert "INCOMPLETE" not in out, out


def test_op_hashes_inside_a_user_capture_have_no_value():
    """Aten ops hashed by the dispatch mode while their stream captures a CUDA
    graph did not run: no value (counted), and no hash kernel is captured
    into the program's graph (it would write a fixed result slot at every
    replay, into later hashes).  The capture and the replays work."""
    x = torch.randn(4096, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        y = x * 2  # warm-up off the default stream, as torch asks
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    before = kdebug._C.gpu_info()["unhashed_in_capture"]
    with DebugMode() as dm, DebugMode.log_tensor_hashes("bitwise"):
        with torch.cuda.graph(g):
            y = x * 2
        for _ in range(3):
            g.replay()
        z = x + 1
        torch.cuda.synchronize()
    assert torch.equal(y, x * 2)
    assert kdebug._C.gpu_info()["unhashed_in_capture"] > before
    muls = [op for op in dm.operators if "aten::mul" in str(op)]
    assert muls and muls[-1].log.get("hash") is None, muls[-1].log
    add = next(op for op in dm.operators if "aten::add" in str(op))
    assert add.log["hash"] == hashing.bitwise(z, on_host=True), add.log


def test_a_drain_on_another_thread_takes_no_replay_record_before_its_result():
    """Note [Results in flight]: a thread replays a graph in a loop while the
    main thread reads ``operators`` (each read drains, and collects the GPU
    results taken before it).  A replay queued after a read's marks still
    holds its results when that read's ring walk reaches its records: the
    walk stops there instead of moving them into the store, where their
    results could not be delivered and the result index stood as a hash.
    Every replay's records end with the hash of what the graph wrote."""
    import threading

    torch._dynamo.reset()
    f = torch.compile(lambda x: (x.sin() * 2).cos() + 1)
    x = torch.randn(1 << 16, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        f(x)  # compiled and warm, off the default stream, as torch asks before a capture
    torch.cuda.current_stream().wait_stream(s)
    replays = 300
    with DebugMode(kernels_only=True, record_all_threads=True) as dm, DebugMode.log_tensor_hashes("bitwise"):
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out = f(x)
        done = threading.Event()

        def loop():
            for _ in range(replays):
                g.replay()
            done.set()

        t = threading.Thread(target=loop)
        t.start()
        reads = 0
        while not done.is_set():
            len(dm.operators)
            reads += 1
        t.join()
        torch.cuda.synchronize()
    assert reads > 0 and dm.complete, dm.kernel_stats
    expected = hashing.bitwise(out, on_host=True)
    _, captured, replayed = _graph_kernels(dm)
    per_replay = {}
    for k in replayed:
        per_replay.setdefault(k.cuda_graph["replay"], []).append(k)
    assert len(per_replay) == replays and all(len(v) == len(captured) for v in per_replay.values())
    got = [next(iter(v[-1].post_hashes.values())) for _, v in sorted(per_replay.items())]
    assert got == [expected] * replays, [h for h in got if h != expected][:5]
