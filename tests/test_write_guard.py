"""The C++ write guard (Note [C++ write guard] in csrc/kd_write_guard.c): what
it reads from a dispatcher op's schema as the bytes the op will write, before
it runs.  On CPU through kdebug.testing.write_guard_probe (the same callback,
logging every device's writes); the GPU side is tests/test_gpu_write_guard.py."""
from __future__ import annotations

import threading

import torch

import kdebug
from kdebug import DebugMode, _C
from kdebug.testing import write_guard_probe

CPU = 0  # c10::DeviceType::CPU


def _extent(t: torch.Tensor) -> tuple[int, int]:
    """The bytes a strided view covers, from its Python-visible layout."""
    lo = hi = 0
    for size, stride in zip(t.shape, t.stride()):
        span = (size - 1) * stride
        if span < 0:
            lo += span
        else:
            hi += span
    p, e = t.data_ptr(), t.element_size()
    return p + lo * e, p + (hi + 1) * e


def _writes(seen, op):
    return [w for w in seen if w.op == op]


def test_out_and_in_place_writes_are_seen():
    a, b = torch.randn(8, 16), torch.randn(8, 16)
    out = torch.empty(8, 16)
    base = torch.zeros(6, 10)
    view = base[1:5, 1::3]  # strided, offset view
    with write_guard_probe() as seen:
        torch.add(a, b, out=out)
        view.mul_(2)
        torch.add(a, b)  # writes nothing it was given
    (w,) = _writes(seen, "aten::add.out")
    assert (w.lo, w.hi) == (out.data_ptr(), out.data_ptr() + out.numel() * 4)
    assert w.device_type == CPU and not w.unbounded
    (m,) = _writes(seen, "aten::mul_.Tensor")
    assert (m.lo, m.hi) == _extent(view) and m.hi - m.lo < base.numel() * 4
    assert not _writes(seen, "aten::add.Tensor")
    assert write_guard_probe.last["lost"] == 0


def test_mutated_tensor_lists_and_empty_views():
    xs = [torch.randn(5), torch.randn(3, 2)]
    e = torch.empty(0, 4)
    with write_guard_probe() as seen:
        torch._foreach_add_(xs, 1.0)
        e.zero_()
    ws = _writes(seen, "aten::_foreach_add_.Scalar")
    assert [(w.lo, w.hi) for w in ws] == [_extent(x) for x in xs]
    (z,) = _writes(seen, "aten::zero_")
    assert z.lo == z.hi  # nothing to write: an empty range, not unbounded
    assert not z.unbounded


def test_writes_it_cannot_bound_flush_everything():
    """A written tensor without strided storage (sparse): the guard cannot
    say which bytes change, so it asks for a flush of everything queued."""
    s = torch.sparse_coo_tensor(torch.tensor([[0, 2]]), torch.tensor([1.0, 2.0]), (4,))
    with write_guard_probe() as seen:
        s.mul_(2)
    ws = _writes(seen, "aten::mul_.Tensor")
    assert ws and all(w.unbounded for w in ws)


def test_other_threads_are_guarded():
    """A global callback: ops on a thread kdebug never entered (it takes the
    GIL there, which torch released around the op)."""
    t = torch.zeros(32)
    with write_guard_probe() as seen:
        th = threading.Thread(target=lambda: t.add_(1))
        th.start()
        th.join()
    (w,) = _writes(seen, "aten::add_.Tensor")
    assert (w.lo, w.hi) == _extent(t)


def test_extern_out_call_of_compiled_code_is_seen():
    """Inductor's CPU code calls aten::mm with out= for a matmul it does not
    lower: the guard sees that write into the buffer it allocated."""
    @torch.compile(backend="inductor")
    def f(x, w):
        return torch.relu(x @ w) + 1

    x, w = torch.randn(32, 64), torch.randn(64, 48)
    f(x, w)
    with write_guard_probe() as seen:
        f(x, w)
    mm = [w_ for w_ in seen if w_.op in ("aten::mm.out", "aten::addmm.out")]
    assert mm, sorted({w_.op for w_ in seen})
    assert all(w_.hi - w_.lo == 32 * 48 * 4 for w_ in mm)


def test_kernels_only_defers_with_the_guard_installed_lazily():
    """kernels_only turns deferral on with the C++ guard (mode 2); on CPU no
    GPU hash is ever queued, so the guard is never installed and costs
    nothing.  Leaving the mode restores the previous setting."""
    assert _C.write_guard_stats()["installed"] == 0
    before = _C._set_defer(0)
    _C._set_defer(before)
    with DebugMode(kernels_only=True):
        with DebugMode.log_tensor_hashes("bitwise"):
            assert _C._set_defer(2) == 2  # what the mode set
            torch.randn(4).add_(1)
        assert _C.write_guard_stats()["installed"] == 0
    assert _C._set_defer(before) == before
    with DebugMode(kernels_only=True, batch_gpu_work=False):
        assert _C._set_defer(0) == 0
        _C._set_defer(0)
    with DebugMode():
        assert _C._set_defer(1) == 1  # the dispatch-mode path: unchanged


def test_unannotated_ops_outside_aten_flush_everything():
    """An op outside aten whose schema declares no write but takes tensors
    (as the eager c10d collectives, which write theirs): any doubt, flush."""
    lib = torch.library.Library("kdebug_wg_test", "DEF")
    try:
        lib.define("bump(Tensor x) -> ()")  # mutates x without saying so
        def bump(x):
            x.add_(1)

        lib.impl("bump", bump, "CPU")
        lib.define("bump_declared(Tensor(a!) x) -> ()")
        lib.impl("bump_declared", bump, "CPU")
        t = torch.zeros(8)
        with write_guard_probe() as seen:
            torch.ops.kdebug_wg_test.bump(t)
            torch.ops.kdebug_wg_test.bump_declared(t)
        (u,) = _writes(seen, "kdebug_wg_test::bump")
        assert u.unbounded
        (d,) = _writes(seen, "kdebug_wg_test::bump_declared")
        assert not d.unbounded and (d.lo, d.hi) == _extent(t)
        assert torch.equal(t, torch.full((8,), 2.0))  # the ops ran: the guard only looked
    finally:
        lib._destroy()


def test_an_op_defined_again_with_another_schema_is_read_again():
    """Note [Op info cache]: the guard keeps what each op writes per thread,
    keyed by the addresses of the schema's name strings.  An op dropped and
    defined again under the same name (the new strings may land where the old
    ones were) must be read from its new schema: here the written argument
    moves from the first to the second."""
    x, y = torch.zeros(8), torch.zeros(4, 3)
    with write_guard_probe():
        pass  # the guard's first install starts the epoch
    epochs = []
    for round in range(3):
        lib = torch.library.Library("kdebug_wg_epoch", "DEF")
        try:
            def first(a):
                a.add_(1)

            epochs.append(_C.write_guard_stats()["op_epoch"])
            lib.define("f(Tensor(a!) a) -> ()")
            lib.impl("f", first, "CPU")
            epochs.append(_C.write_guard_stats()["op_epoch"])
            with write_guard_probe() as seen:
                torch.ops.kdebug_wg_epoch.f(x)
            (w,) = _writes(seen, "kdebug_wg_epoch::f")
            assert not w.unbounded and (w.lo, w.hi) == _extent(x)
        finally:
            lib._destroy()
        lib = torch.library.Library("kdebug_wg_epoch", "DEF")
        try:
            def second(a, b):
                b.add_(1)

            lib.define("f(Tensor a, Tensor(a!) b) -> ()")
            lib.impl("f", second, "CPU")
            with write_guard_probe() as seen:
                torch.ops.kdebug_wg_epoch.f(x, y)
            (w,) = _writes(seen, "kdebug_wg_epoch::f")
            assert not w.unbounded and (w.lo, w.hi) == _extent(y), round
        finally:
            lib._destroy()
    assert torch.equal(x, torch.full((8,), 3.0)) and torch.equal(y, torch.full((4, 3), 3.0))
    # the tables' epoch moves at every definition and at every drop
    assert all(b > a > 0 for a, b in zip(epochs, epochs[1:])), epochs


def test_eager_collectives_flush_everything(tmp_path):
    """c10d::allreduce_ (gloo, one rank) declares no write in its schema but
    writes its tensors: the guard asks for a flush before it runs."""
    import torch.distributed as dist

    if dist.is_initialized():
        import pytest
        pytest.skip("a process group is already initialized in this process")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        t = torch.ones(16)
        with write_guard_probe() as seen:
            dist.all_reduce(t)
        ws = [w for w in seen if w.op.startswith("c10d::allreduce_")]
        assert ws and all(w.unbounded for w in ws)
    finally:
        dist.destroy_process_group()
