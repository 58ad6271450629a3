"""The aten-op fast path (csrc/kd_dispatch.c, Note [Fast aten-op recording]):
records identical to upstream's constructor, fresh buffers, and the ops and
hooks it hands to upstream's own __torch_dispatch__."""
import pytest
import torch
from torch.utils import _debug_mode as upstream

import kdebug
from kdebug import _aten_hooks, _upstream, mode
from kdebug import DebugMode


def _upstream_record(op, args, kwargs, depth):
    c = _upstream._OpCall(op, args, kwargs, depth)
    c.stringify_args([])
    return c


def test_records_equal_what_upstream_constructor_makes():
    x = torch.randn(3, 4)
    with DebugMode() as kd:
        torch.add(x, x, alpha=2)
        torch.ops.aten.sum.dim_IntList(x, [1], keepdim=True)
    calls = list(kd.operators)
    assert len(calls) == 2
    want = [_upstream_record(torch.ops.aten.add.Tensor, (x, x), {"alpha": 2}, 1),
            _upstream_record(torch.ops.aten.sum.dim_IntList, (x, [1], True), {}, 1)]  # as dispatched
    for got, ref in zip(calls, want):
        assert type(got) is type(ref)
        ref_vars = {k: v for k, v in vars(ref).items() if k != "output_str"}
        got_vars = {k: v for k, v in vars(got).items() if k != "output_str"}
        assert got_vars == ref_vars
        assert list(got_vars) == list(ref_vars)  # upstream's attribute order
    assert calls[0].output_str == "  ->  t: f32[3, 4]"


def test_records_without_a_template_call_upstreams_constructor():
    """Where a fresh _OpCall holds a mutable default, the fast path must run
    upstream's constructor instead of sharing the template's values."""
    x = torch.randn(2, 2)
    with DebugMode() as warm:
        x + 1
    mode._configure()
    template_args = None
    try:
        # the same configuration as mode._configure(), template None
        kdebug._C._configure_dispatch(mode._op_info, _upstream.DebugMode.__torch_dispatch__, mode._stream_tick,
                                      mode._tree_hash_py, mode._tree_clone_py, _aten_hooks._local, _upstream.utils_module,
                                      _upstream._OpCall, template_args, torch._C._len_torch_dispatch_stack)
        with DebugMode() as kd:
            x + 1
        assert kd.debug_string() == warm.debug_string()
        assert vars(list(kd.operators)[0]) == vars(list(warm.operators)[0])
    finally:
        mode._configure()


def test_in_place_write_into_a_fresh_buffer_has_no_input_hash():
    """Note [Fresh buffers] for aten ops: the memory of torch.empty is not
    hashed before an op writes it; once written it is."""
    src = torch.arange(6.0).reshape(2, 3)
    with DebugMode() as kd, DebugMode.log_tensor_hashes("bitwise", hash_inputs=True):
        buf = torch.empty(2, 3)
        buf.copy_(src)   # writes the fresh buffer: its input hash is None
        buf.add_(1)      # written before: hashed
    ops = [c for c in kd.operators if isinstance(c, _upstream._OpCall)]
    names = [str(c.op) for c in ops]
    assert names == ["aten.empty.memory_format", "aten.copy_.default", "aten.add_.Tensor"]
    empty, copy, add = ops
    assert "hash" not in (empty.log or {})  # upstream's hooks skip empty*
    dst_hash, src_hash = copy.log["input_hash"][0][:2]
    assert dst_hash is None and src_hash is not None
    assert add.log["input_hash"][0][0] == copy.log["hash"]
    assert torch.equal(buf, src + 1)  # the op itself saw its real arguments


@pytest.mark.parametrize("path", ["fast", "upstream"])
@pytest.mark.parametrize("hash_fn", ["builtin", "callable"])
def test_every_hash_path_hashes_only_computed_values(path, hash_fn):
    """Note [Hashes of one op on every path]: through upstream's hooks (a
    callable hash_fn, or a flag such as record_stack_trace) an out= buffer's
    and a fresh buffer's memory was hashed before the op (a value nobody
    computed, different run to run), a fresh buffer's views were hashed, and
    an in-place foreach op's hash was None.  Every path now hashes what the
    fast path hashes."""
    def total(t):
        return float(t.double().sum())

    fn = total if hash_fn == "callable" else "norm"
    y = torch.arange(4.0)
    params = [torch.ones(3), torch.full((2,), 2.0)]
    with DebugMode(**({"record_stack_trace": True} if path == "upstream" else {})) as dm, \
            DebugMode.log_tensor_hashes(fn, hash_inputs=True):
        x = torch.empty(4)
        x.copy_(y)                      # writes a fresh buffer
        z = torch.empty(4)
        torch.add(y, y, out=z)          # an out= buffer
        e = torch.empty(6)
        v = e[:3]                       # a view of a fresh buffer
        v.fill_(1.0)
        torch._foreach_add_(params, 1.0)  # returns nothing; writes params
        w = torch.ones(4)
        w.add_(y)                       # written memory: hashed before the op
    logs = {str(c.op): c.log or {} for c in dm.operators}
    assert list(logs) == ["aten.empty.memory_format", "aten.copy_.default", "aten.add.out", "aten.slice.Tensor",
                          "aten.fill_.Scalar", "aten._foreach_add_.Scalar", "aten.ones.default",
                          "aten.add_.Tensor"]
    value = total if hash_fn == "callable" else (lambda t: float(t.double().abs().sum()))  # upstream norm: p=1
    copy_in, add_out_in = logs["aten.copy_.default"]["input_hash"], logs["aten.add.out"]["input_hash"]
    assert copy_in[0][0] is None and copy_in[0][1] == pytest.approx(value(y))
    assert add_out_in[1]["out"] is None and add_out_in[0][0] == pytest.approx(value(y))
    assert logs["aten.slice.Tensor"] == {}
    assert "input_hash" not in logs["aten.fill_.Scalar"]
    assert logs["aten.fill_.Scalar"]["hash"] == pytest.approx(value(torch.ones(3)))
    foreach = logs["aten._foreach_add_.Scalar"]["hash"]
    assert foreach == ([pytest.approx(value(torch.full((3,), 2.0))), pytest.approx(value(torch.full((2,), 3.0)))],)
    add_in = logs["aten.add_.Tensor"]["input_hash"]
    assert add_in[0][0] == pytest.approx(value(torch.ones(4))) and add_in[0][1] == pytest.approx(value(y))


@pytest.mark.parametrize("path", ["fast", "upstream"])
def test_a_buffer_stops_being_fresh_when_any_op_writes_it(path):
    """Note [Fresh buffers] (csrc/kd_fresh.c): out= tuples, written lists and
    writes made outside hash_inputs end a buffer's freshness; before, these
    buffers stayed fresh and their computed values got no input hash (and a
    written list's uninitialized memory was hashed)."""
    flags = {"record_stack_trace": True} if path == "upstream" else {}
    x = torch.arange(12.0).reshape(3, 4)
    with DebugMode(**flags) as dm:
        with DebugMode.log_tensor_hashes("norm", hash_inputs=True):
            a, b = torch.empty(3), torch.empty(3, dtype=torch.long)
            torch.max(x, 1, out=(a, b))           # out= buffers returned as a tuple
            a.add_(1)
            e = [torch.empty(3), torch.empty(2)]
            torch._foreach_copy_(e, [torch.ones(3), torch.full((2,), 2.0)])  # a written list
            e[0].add_(1)
            f = torch.empty(4)
        with DebugMode.log_tensor_hashes("norm"):  # written without hash_inputs
            f.fill_(2.0)
            f.view(2, 2)
        with DebugMode.log_tensor_hashes("norm", hash_inputs=True):
            f.add_(1)
    adds = [c.log for c in dm.operators if str(getattr(c, "op", "")) == "aten.add_.Tensor"]
    assert [log["input_hash"][0][0] for log in adds] == [3 + 7 + 11, 3.0, 8.0]
    (copy,) = [c.log for c in dm.operators if "foreach_copy" in str(getattr(c, "op", ""))]
    assert copy["input_hash"][0][0] == [None, None]  # the list's memory before the copy: nobody's value
    (view,) = [c.log for c in dm.operators if str(getattr(c, "op", "")) == "aten.view.default"]
    assert view["hash"] == 8.0


@pytest.mark.parametrize("path", ["fast", "upstream"])
def test_memory_of_a_freed_fresh_buffer_reused_by_a_computed_tensor_is_not_fresh(path):
    """Note [Fresh buffers]: the table is keyed by storage, not by data
    pointer: layer_norm's output, allocated inside the op in the memory of a
    freed empty buffer, was taken for that buffer and lost its input hash."""
    import torch.nn.functional as F

    flags = {"record_stack_trace": True} if path == "upstream" else {}
    x = torch.randn(16, 64)
    want = float(F.layer_norm(x, (64,)).double().abs().sum())
    checked = 0
    for _ in range(30):  # where the allocator gives the freed memory back (it usually does)
        with DebugMode(**flags) as dm, DebugMode.log_tensor_hashes("norm", hash_inputs=True):
            e = torch.empty(16, 64)
            freed = e.data_ptr()
            del e
            y = F.layer_norm(x, (64,))
            reused = y.data_ptr() == freed
            y.relu_()
        if reused:
            (relu,) = [c.log for c in dm.operators if str(getattr(c, "op", "")) == "aten.relu_.default"]
            assert relu.get("input_hash", ((None,),))[0][0] == pytest.approx(want)
            checked += 1
    if not checked:
        pytest.skip("the allocator never gave layer_norm's output the freed memory: nothing to check")


def test_upstream_debug_mode_with_kdebug_hashes_in_a_fresh_process():
    """kdebug's hash hooks under upstream's own DebugMode read ops' facts
    through the dispatch path, which no kdebug DebugMode had configured yet:
    the op raised."""
    import subprocess
    import sys

    code = ("import torch\nfrom torch.utils._debug_mode import DebugMode as U\nimport kdebug\n"
            "with U() as dm, kdebug.DebugMode.log_tensor_hashes('norm'):\n    torch.ones(3) + 1\n"
            "print([c.log for c in dm.operators])\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip().splitlines()[-1] == "[{'hash': 3.0}, {'hash': 6.0}]"


def test_an_op_returning_no_tensor_is_compared_by_value_on_every_path():
    """Note [Hashes of one op on every path]: item() has no tensor to hash; the
    upstream path logged {'hash': None}, so the compare never looked at the
    returned value, and two runs returning different values matched."""
    def run(sign, flags):
        x = torch.tensor([sign * 1.0, 2.0])
        with DebugMode(**flags) as dm, DebugMode.log_tensor_hashes("norm"):
            x[0].item()
        return dm

    for flags in ({}, {"record_stack_trace": True}):
        assert kdebug.compare(run(1, flags), run(-1, flags)).verdict == "differ", flags
        assert kdebug.compare(run(1, flags), run(1, flags)).verdict == "match", flags


def test_ops_with_foreign_hooks_go_through_upstream():
    """A dispatch hook that is not kdebug's own runs, for every op."""
    seen = []

    def log_hook(func, types, args, kwargs, result):
        seen.append(str(func))
        return {"mine": 1}

    x = torch.randn(3)
    with DebugMode() as kd, upstream.DebugMode.dispatch_hooks(log_hook=log_hook):
        (x * 2).sin()
    assert seen == ["aten.mul.Tensor", "aten.sin.default"]
    assert [c.log for c in kd.operators] == [{"mine": 1}, {"mine": 1}]


def test_ops_under_another_mode_go_through_upstream():
    """With another dispatch mode below kdebug's, upstream's code records."""
    x = torch.randn(3)
    with upstream.DebugMode() as up_outer, DebugMode() as kd:
        x.cos()
    with upstream.DebugMode() as ref:
        x.cos()
    assert kd.debug_string() == ref.debug_string()
    assert len(up_outer.operators) == 1


def test_dispatch_method_runs_python_below_it_without_dynamos_callback():
    """__torch_dispatch__ is a C method (no dynamo-disable wrapper); it must
    still do what that wrapper does: Python code reached from an aten op (here
    an op's Python kernel) runs with no eval-frame callback, and the caller's
    callback is back after the op.  torch._dynamo.run sets the callback to
    False ("run only") for the duration of the call."""
    seen = []
    lib = torch.library.Library("kdebug_test_cb", "DEF")
    lib.define("probe(Tensor x) -> Tensor")

    def probe(x):
        seen.append(("kernel", torch._C._dynamo.eval_frame.get_eval_frame_callback()))
        return x.clone()

    lib.impl("probe", probe, "CPU")

    def body(x):
        y = torch.ops.kdebug_test_cb.probe(x)
        seen.append(("caller", torch._C._dynamo.eval_frame.get_eval_frame_callback()))
        return y

    x = torch.randn(3)
    torch._dynamo.run(body)(x)
    assert seen == [("kernel", False), ("caller", False)]  # without a mode: the callback is there
    seen.clear()
    with DebugMode() as dm:
        torch._dynamo.run(body)(x)
    assert isinstance(DebugMode.__dict__["__torch_dispatch__"], type(list.append))  # the C method
    assert seen == [("kernel", None), ("caller", False)]
    assert "kdebug_test_cb::probe(t: f32[3])" in dm.debug_string()


def test_entering_under_a_mode_that_makes_dynamo_skip_compiled_frames_warns():
    """Under a dispatch mode whose ignore_compile_internals() is False, dynamo
    does not run compiled frames, so no kernel would be recorded: say so."""
    import pytest
    from torch.utils._python_dispatch import TorchDispatchMode

    class PlainMode(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    class IgnoringMode(PlainMode):
        @classmethod
        def ignore_compile_internals(cls):
            return True

    with IgnoringMode():
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("error", kdebug.KdebugWarning)
            with DebugMode():
                torch.ones(2).add(1)
    with PlainMode():
        with pytest.warns(kdebug.KdebugWarning, match="PlainMode is active"):
            with DebugMode() as dm:
                torch.ones(2).add(1)
    assert "aten::add.Tensor" in dm.debug_string()


def test_ops_whose_schema_may_leave_writes_out_are_taken_as_writing_anything():
    """Note [C++ write guard], for the dispatch-mode path too: outside aten,
    prim(s) and _c10d_functional a schema need not declare what an op
    writes (c10d::allreduce_ takes Tensor[] tensors and NCCL writes them in
    place), so such an op flushes the deferred GPU work before it runs
    (written_pos None); ops whose schemas declare their writes keep them."""
    lib = torch.library.Library("kd_test_writes", "FRAGMENT")  # noqa: TOR901
    lib.define("undeclared(Tensor x) -> ()")
    lib.define("declared(Tensor(a!) x, Tensor y) -> ()")
    lib.define("no_tensors(int n) -> int")
    lib.define("to_host(Tensor x, bool non_blocking=False) -> Tensor")
    try:
        info = mode._op_info
        assert info(torch.ops.c10d.allreduce_.default).written_pos is None
        assert info(torch.ops.c10d.allreduce_.default).writes
        assert info(torch.ops.kd_test_writes.undeclared.default).written_pos is None
        assert info(torch.ops.kd_test_writes.declared.default).written_pos == (0,)
        assert info(torch.ops.kd_test_writes.no_tensors.default).written_pos == ()
        assert not info(torch.ops.kd_test_writes.no_tensors.default).writes
        assert info(torch.ops.aten.add_.Tensor).written_pos == (0,)
        assert (info(torch.ops.aten.mul.out).written_pos, info(torch.ops.aten.mul.out).written_names) == ((), ("out",))
        assert not info(torch.ops.aten.add.Tensor).writes
        # its unknown writes keep Note [Non-blocking copies to the host]: called through the settling wrapper
        to_host = info(torch.ops.kd_test_writes.to_host.default)
        assert to_host.written_pos is None and to_host.callable.__name__ == "call"
        assert info(torch.ops.aten.add.Tensor).callable.__name__ != "call"
        # the functional collectives' schemas are trusted: out of place, nothing written
        assert info(torch.ops._c10d_functional.all_reduce.default).written_pos == ()
    finally:
        lib._destroy()
