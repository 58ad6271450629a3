"""Deferred GPU hashes under kernels_only, guarded by the C++ write guard
(Note [C++ write guard] in csrc/kd_write_guard.c): on the GPU machine.  No
dispatch mode runs; aten ops that overwrite a tensor whose hash is still
queued must flush it first, so batching never changes a recorded hash."""
from __future__ import annotations

import re

import pytest
import torch

import kdebug
from kdebug import DebugMode, _C, hashing
from conftest import generated_modules_with

pytestmark = pytest.mark.gpu


def _kernel_hashes(dm):
    return [(k.kernel_name, k.pre_hashes, k.post_hashes) for k in dm.kernels]


def _launched(s0, s1):
    """Hash kernels launched between two defer_stats() (batched + one at a time)."""
    return (s1["hash_launches"] - s0["hash_launches"]) + (s1["direct_hash_launches"] - s0["direct_hash_launches"])


def _chain(x, w):
    a = torch.relu(x) * 2
    b = a @ w
    c = torch.sin(b) + a
    d = c @ w  # Inductor: out= the relu kernel's buffer, reused ("buf3 = buf0; del buf0  # reuse")
    e = torch.cos(d) * 3
    return e @ w


REUSE_THEN_MM = re.compile(r"(buf\d+) = (buf\d+); del \2  # reuse\n(?:\s*#.*\n)*\s*extern_kernels\.mm\([^\n]*out=\1\)")


def test_extern_mm_into_a_reused_buffer_flushes_first():
    """A compiled graph whose extern mm writes into the buffer a Triton kernel
    wrote just before (Inductor's buffer reuse): kernels_only with deferral
    records the same hashes as without, and the first kernel's output hash
    is the hash of relu(x) * 2 computed outside kdebug."""
    torch.manual_seed(0)
    x, w = torch.randn(256, 256, device="cuda"), torch.randn(256, 256, device="cuda")
    cf = torch.compile(_chain)
    cf(x, w)
    want = hashing.bitwise(torch.relu(x) * 2)
    runs, stats = [], []
    for batch in (True, False):
        s0, g0 = _C.defer_stats(), _C.write_guard_stats()
        with DebugMode(kernels_only=True, batch_gpu_work=batch) as dm:
            with DebugMode.log_tensor_hashes("bitwise"):
                cf(x, w)
        stats.append((s0, _C.defer_stats(), g0, _C.write_guard_stats()))
        runs.append(_kernel_hashes(dm))
    batched, plain = runs
    assert batched == plain and len(batched) == 3
    assert batched[0][2]["out_ptr0"] == want
    (s0, s1, g0, g1), (p0, p1, _, _) = stats
    assert s1["queued_hashes"] > s0["queued_hashes"]            # deferred, in kernels_only
    assert p1["queued_hashes"] == p0["queued_hashes"]           # batch_gpu_work=False: nothing queued
    assert s1["hazard_flushes"] > s0["hazard_flushes"]          # the mm into the reused buffer flushed
    assert g1["ranges"] > g0["ranges"] and g1["installed"] == 0  # the guard saw it; removed at exit
    srcs = [s for s in generated_modules_with(batched[0][0]) if REUSE_THEN_MM.search(s)]
    assert srcs, "Inductor did not reuse a kernel's buffer as an mm out=: the hazard was not exercised"


def test_eager_writers_after_a_kernel_flush_first():
    """Eager ops overwrite a compiled kernel's output (mm out=, an in-place
    add) while its hash is still queued -- here inside a compiled graph's
    call, as its extern calls run (after the call, its end has flushed
    already: test_the_guard_pauses_after_a_graph_call): the recorded hash is
    of the kernel's output."""
    cf = torch.compile(lambda x: torch.sin(x) * 2)
    x = torch.randn(128, 128, device="cuda")
    a = torch.randn(128, 128, device="cuda")
    want = hashing.bitwise(cf(x))
    s0 = _C.defer_stats()
    with DebugMode(kernels_only=True) as dm:
        with DebugMode.log_tensor_hashes("bitwise"):
            _C._graph_call(True)  # an outer graph's call still running: its end flushes nothing yet
            try:
                out = cf(x)
                assert _C.defer_stats()["pending"] == 1
                torch.mm(a, a, out=out)
                out2 = cf(x)
                out2.add_(1)
            finally:
                _C._graph_call(False)
    s1 = _C.defer_stats()
    assert s1["hazard_flushes"] >= s0["hazard_flushes"] + 2
    ks = dm.kernels
    assert len(ks) == 2
    assert ks[0].post_hashes["out_ptr0"] == want and ks[1].post_hashes["out_ptr0"] == want


def test_kernels_only_batches_the_training_step(block_step):
    """A compiled transformer block's forward + backward (extern mm calls,
    reused buffers): deferred hashes equal hashes taken one kernel at a time,
    with far fewer hash kernel launches (counted, not timed)."""
    step, x = block_step
    runs, launched = [], []
    for batch in (True, False):
        torch.manual_seed(0)
        s0 = _C.defer_stats()
        with DebugMode(kernels_only=True, batch_gpu_work=batch) as dm:
            with DebugMode.log_tensor_hashes("bitwise"):
                step(x)
        launched.append(_launched(s0, _C.defer_stats()))
        runs.append(_kernel_hashes(dm))
    batched, plain = runs
    assert len(batched) == len(plain) > 20
    diff = [(i, a, b) for i, (a, b) in enumerate(zip(batched, plain)) if a != b]
    assert not diff, f"{len(diff)} records differ; first: {diff[0]}"
    assert launched[0] * 2 < launched[1], launched
    assert _C.defer_stats()["hash_failures"] == 0


def test_flight_recorder_defers(block_step, tmp_path):
    """FlightRecorder's kernels_only recording queues its GPU hashes (fewer
    hash kernel launches than launches hashed) and its step digests equal
    those of a recorder that hashes one kernel at a time."""
    step, x = block_step
    digests, launched = [], []
    for batch in (True, False):
        fr = kdebug.FlightRecorder(every=3, keep_steps=2, trace=str(tmp_path / f"{batch}.kdt"),
                                   batch_gpu_work=batch, compare="all")
        s0 = _C.defer_stats()
        with fr:
            for _ in range(3):
                step(x)
                fr.step()
        fr.close()
        fr.dump()  # waits for the last steps' hashes (a compare takes those already read back)
        launched.append(_launched(s0, _C.defer_stats()))
        digests.append([(d.launches, d.lost, d.digest) for d in fr.digests])
    assert len(digests[0]) == 3 and all(lost == 0 for _, lost, _ in digests[0])
    assert digests[0] == digests[1]
    assert launched[0] * 2 < launched[1], launched


def test_the_guard_pauses_after_a_graph_call():
    """Paused between windows (Note [C++ write guard]): a compiled graph's
    call ends with its last hashes launched and the guard's callback
    disabled in torch, so the eager ops after it pay nothing for it; the
    next call's first queued hash enables it again before it exists, and an
    extern write inside that call into a queued kernel output still flushes
    first.  Every recorded hash is of the
    kernel's output."""
    cf = torch.compile(lambda x: torch.sin(x) * 2)
    x = torch.randn(128, 128, device="cuda")
    a = torch.randn(128, 128, device="cuda")
    want = hashing.bitwise(cf(x))
    with DebugMode(kernels_only=True) as dm:
        with DebugMode.log_tensor_hashes("bitwise"):
            cf(x)
            g0, d0 = _C.write_guard_stats(), _C.defer_stats()
            assert g0["installed"] == 1 and g0["paused"] and d0["pending"] == 0  # the call's end flushed
            torch.sin(x).add_(1)  # nothing queued, nothing guarded: still paused
            assert _C.write_guard_stats()["paused"]
            _C._graph_call(True)
            try:
                out = cf(x)
                g1 = _C.write_guard_stats()
                assert not g1["paused"] and g1["resumes"] == g0["resumes"] + 1  # before its hash was queued
                torch.mm(a, a, out=out)  # overwrites a queued hash's tensor: flushed first
                assert _C.defer_stats()["hazard_flushes"] == d0["hazard_flushes"] + 1
                cf(x)
            finally:
                _C._graph_call(False)
            assert _C.defer_stats()["pending"] == 0 and _C.write_guard_stats()["paused"]
            out = cf(x)
            assert _C.write_guard_stats()["paused"]
    ks = dm.kernels
    assert len(ks) == 4 and all(k.post_hashes["out_ptr0"] == want for k in ks)
    assert _C.write_guard_stats()["installed"] == 0
