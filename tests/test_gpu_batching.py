"""Deferred, batched GPU hashes and output copies (Note [Deferred GPU work] in
csrc/kd_defer.h), on the GPU machine: batching must never change a value."""
from __future__ import annotations

import pytest
import torch

import kdebug
from kdebug import DebugMode, _C, hashing

pytestmark = pytest.mark.gpu


def _hashes(dm):
    out = []
    for op in dm.operators:
        if isinstance(op, kdebug._KernelCall):
            out.append((op.kernel_name, op.pre_hashes, op.post_hashes))
        else:
            out.append((str(op.op), op.log))
    return out


def _run(step, x, batch, **hash_kw):
    # the model's parameters and optimizer-free step: identical inputs each run
    torch.manual_seed(0)
    with DebugMode(batch_gpu_work=batch) as dm:
        with DebugMode.log_tensor_hashes(**hash_kw):
            step(x)
    return dm


@pytest.mark.parametrize("kw", [dict(hash_fn=["bitwise", "norm"], hash_inputs=True),
                                dict(hash_fn="bitwise", hash_inputs=True, check_inputs_unchanged=True),
                                dict()], ids=["bitwise+norm,inputs", "readonly-check", "default"])
def test_batched_hashes_equal_unbatched(block_step, kw):
    step, x = block_step
    _run(step, x, False, **kw)  # first hashed run: one-time work out of the way
    s0 = _C.defer_stats()
    batched = _hashes(_run(step, x, True, **kw))
    s1 = _C.defer_stats()
    plain = _hashes(_run(step, x, False, **kw))
    assert _C.defer_stats()["queued_hashes"] == s1["queued_hashes"]  # the unbatched run queued nothing
    if len(batched) != len(plain):
        import difflib
        names = lambda r: [t[0] for t in r]
        pytest.fail("\n".join(difflib.unified_diff(names(plain), names(batched), lineterm="", n=1)))
    diff = [(i, a, b) for i, (a, b) in enumerate(zip(batched, plain)) if a != b]
    assert not diff, f"{len(diff)} records differ; first: {diff[0]}"
    queued = s1["queued_hashes"] - s0["queued_hashes"]
    launches = s1["hash_launches"] - s0["hash_launches"]
    assert queued > 50 and launches * 3 < queued, (queued, launches)  # really batched
    assert s1["shared_hashes"] > s0["shared_hashes"]  # detach() outputs: the same view, one hash
    assert s1["hash_failures"] == s0["hash_failures"]


def test_batched_record_outputs_equal_clones(block_step):
    step, x = block_step
    recs = []
    for batch in (True, False):
        with DebugMode(batch_gpu_work=batch) as dm:
            with DebugMode.record_outputs():
                step(x)
        recs.append(([k.record["output"] for k in dm.kernels],
                     [op.record["output"] for op in dm.operators
                      if not isinstance(op, kdebug._KernelCall) and op.record]))
    (kb, ab), (kp, ap) = recs
    assert len(kb) == len(kp) and len(ab) == len(ap) and kb
    for a, b in zip(kb, kp):
        assert a.keys() == b.keys()
        for n in a:
            assert a[n].stride() == b[n].stride() and torch.equal(a[n], b[n]), n
    flat = lambda t: [v for v in (t if isinstance(t, (list, tuple)) else [t]) if isinstance(v, torch.Tensor)]
    for a, b in zip(ab, ap):
        for u, v in zip(flat(a), flat(b)):
            assert u.stride() == v.stride() and torch.equal(u, v)


def test_a_later_writer_flushes_first():
    """A kernel's output overwritten right after (in place, by an aten op and
    by another compiled kernel): the recorded hash is of the kernel's output."""
    def f(x):
        return torch.sin(x) * 2

    def g(buf):
        buf.mul_(3)  # Inductor writes the graph input in place
        return buf

    cf, cg = torch.compile(f), torch.compile(g)
    x = torch.randn(1 << 16, device="cuda")
    want_f = hashing.bitwise(cf(x))
    buf = cf(x)
    want_g = hashing.bitwise(cg(buf))
    s0 = _C.defer_stats()
    with DebugMode() as dm:
        with DebugMode.log_tensor_hashes(hash_fn="bitwise", hash_inputs=True):
            out = cf(x)
            out.add_(1)      # aten in-place op on the kernel's output
            out2 = cf(x)
            cg(out2)         # compiled in-place kernel on the kernel's output
    assert _C.defer_stats()["hazard_flushes"] >= s0["hazard_flushes"] + 2
    ks = dm.kernels
    assert len(ks) == 3
    assert ks[0].post_hashes["out_ptr0"] == want_f
    assert ks[1].post_hashes["out_ptr0"] == want_f
    assert want_f in ks[2].pre_hashes.values()   # read before the in-place kernel ran
    assert want_g in ks[2].post_hashes.values()
    (add,) = [op for op in dm.operators if "add_" in str(getattr(op, "op", ""))]
    assert add.log["input_hash"][0][0] == want_f  # the aten op's input: before it ran
    assert add.log["hash"] != want_f


def test_record_outputs_allocates_through_no_dispatch_mode():
    t = torch.randn(64, 48, device="cuda").t()
    with DebugMode() as dm:
        e = _C._empty_like(t)
    assert e.stride() == t.stride() and e.device == t.device and e.dtype == t.dtype
    assert not [op for op in dm.operators]
    e.copy_(t)  # an ordinary CUDA tensor: ops dispatch on it
    assert torch.equal(e, t)


def test_other_streams_are_ordered_and_equal(block_step):
    step, x = block_step
    side = torch.cuda.Stream()

    def two_streams(batch):
        with DebugMode(batch_gpu_work=batch) as dm:
            with DebugMode.log_tensor_hashes(hash_fn="bitwise", hash_inputs=True):
                step(x)
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    step(x)
                torch.cuda.current_stream().wait_stream(side)
        return _hashes(dm)

    s0 = _C.defer_stats()
    a = two_streams(True)
    assert _C.defer_stats()["stream_flushes"] > s0["stream_flushes"]
    assert a == two_streams(False)
