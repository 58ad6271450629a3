"""Records of real Inductor C++ kernels, checked against the generated code."""
from __future__ import annotations

import re

import pytest
import torch
import torch.utils._debug_mode as upstream

import kdebug
from kdebug import DebugMode, TensorInfo, _CppKernelCall, _KernelCall, _TritonKernelCall

from conftest import generated_module_running, kernel_calls_in


def _stored_params(kernel_src: str) -> set[str]:
    """Parameters a C++ kernel body writes: `p[...] = `, `.store(p + ...)`, atomics."""
    body = kernel_src[kernel_src.index("{"):]
    stored = set(re.findall(r"\b(\w+)\[[^\]]*\]\s*=(?!=)", body))
    stored |= set(re.findall(r"\.store\(\s*(\w+)", body))
    stored |= set(re.findall(r"atomic_add\(\s*&?\s*(\w+)", body))
    aliases = dict(re.findall(r"auto\s+(\w+)\s*=\s*(\w+)\s*;", body))
    return {aliases.get(s, s) for s in stored}


def _kernel_sources(module_src: str) -> dict[str, tuple[list[str], str]]:
    out = {}
    for m in re.finditer(r"^(cpp_fused\w*) = async_compile\.cpp_pybinding\((\[.*?\]), r'''(.*?)'''\)",
                         module_src, re.S | re.M):
        out[m.group(1)] = (eval(m.group(2)), m.group(3))
    return out


def _write_first(call, i) -> bool:
    """Runs the raw kernel twice on copies of its arguments, argument i filled
    with zeros and with garbage: a kernel that never reads i's old bytes
    produces the same outputs both times."""
    from torch._inductor.codecache import PyCodeCache

    kernel = next(vars(m)[call.kernel_name] for m in PyCodeCache.modules if call.kernel_name in vars(m))
    raw = kernel.__wrapped__
    results = []
    for fill in (0.0, 1e30):
        args = [a.clone() if isinstance(a, torch.Tensor) else a for a in call._launch.objects]
        args[i].fill_(fill)
        raw(*args)
        results.append([a for a in args if isinstance(a, torch.Tensor)])
    return all(torch.equal(x, y) for x, y in zip(*results))


def test_kernels_match_generated_code(compiled_cpu, cpu_inputs):
    with DebugMode(record_triton_kernels=True, store_original_args=True) as dm:
        out = compiled_cpu(*cpu_inputs)
    kernels = dm.kernels
    assert kernels, "no kernel recorded"
    assert all(isinstance(k, _CppKernelCall) and not isinstance(k, _TritonKernelCall) for k in kernels)
    assert not any(isinstance(k, upstream._TritonKernelCall) for k in kernels)

    src = generated_module_running(kernels)
    expected = [c for c in kernel_calls_in(src) if c[0].startswith("cpp_fused")]
    assert [k.kernel_name for k in kernels] == [name for name, _ in expected]
    sources = _kernel_sources(src)
    for k, (name, call_args) in zip(kernels, expected):
        argtypes, ksrc = sources[name]
        assert len(k.args) == len(call_args) == len(argtypes)
        params = re.search(r"kernel\(([^)]*)\)", ksrc).group(1)
        names = [re.findall(r"\w+", p)[-1] for p in params.split(",")]
        assert list(k.arg_names) == names
        stored = _stored_params(ksrc)
        for i, (n, t, role) in enumerate(zip(names, argtypes, k.roles.values())):
            assert ("W" in role) == (n in stored), (name, n, role, sorted(stored))
            declared_read = t.startswith("const") or n.startswith(("in_out_ptr", "in_ptr"))
            if declared_read and "R" not in role:
                # kdebug says the buffer is fresh (Note [Fresh buffers]): the
                # kernel must not depend on its bytes before the launch
                assert _write_first(k, i), (name, n)
            else:
                assert ("R" in role) == declared_read, (name, n, role)
        # metadata read in C equals the tensors' own
        for arg, obj in zip(k._launch.args, k._launch.objects):
            if isinstance(obj, torch.Tensor):
                assert type(arg) is kdebug._C.TensorArg and arg.kind == "tensor"
                assert arg.shape == tuple(obj.shape) and arg.stride == obj.stride()
                assert arg.storage_offset == obj.storage_offset() and arg.data_ptr == obj.data_ptr()
                assert arg.scalar_type == kdebug._C.scalar_type(obj.dtype) and arg.device == "cpu"
            else:
                assert type(arg) is kdebug._C.ScalarArg
                assert arg.kind in ("int", "float") and arg.value == obj
    # results are untouched by the recorder
    from conftest import pointwise_and_reductions

    for a, b in zip(out, pointwise_and_reductions(*cpu_inputs)):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def test_interleaved_with_aten_ops_in_launch_order(compiled_cpu, cpu_inputs):
    with DebugMode() as dm:
        compiled_cpu(*cpu_inputs)
    names = [op.kernel_name if isinstance(op, _KernelCall) else str(op) for op in dm.operators]
    mm = next(i for i, n in enumerate(names) if "aten::mm" in n)
    first_kernel = next(i for i, op in enumerate(dm.operators) if isinstance(op, _KernelCall))
    assert mm < first_kernel  # the matmul feeds the fused kernel
    src = generated_module_running(dm.kernels)
    body = src[src.index("def call("):]
    assert body.index("extern_kernels.mm") < body.index(dm.kernels[0].kernel_name + "(")
    # the launch indices increase along operators
    idx = [op.launch_index for op in dm.operators if isinstance(op, _KernelCall)]
    assert idx == sorted(idx) and idx[0] == 0


def test_debug_string_renders_kernels_like_upstream(compiled_cpu, cpu_inputs):
    with DebugMode() as dm:
        compiled_cpu(*cpu_inputs)
    s = dm.debug_string()
    k = dm.kernels[0]
    line = f"[cpp] {k.kernel_name}("
    assert line in s
    # upstream's tensor style for every tensor argument
    for n, info in k.tensor_info.items():
        shape = ", ".join(str(x) for x in info.shape)
        assert f"{n}=t: f32[{shape}]" in s
    assert k.kwargs_str == ", ".join(f"{n}={v!r}" for n, v in k.kwargs.items())
    v = dm.debug_string(verbose=True)
    assert "{RW, stride=" in v or "{W, stride=" in v
    assert "# kdebug: INCOMPLETE" not in s


def test_kernels_only_pushes_no_dispatch_mode(compiled_cpu, cpu_inputs):
    with DebugMode(kernels_only=True) as dm:
        assert torch._C._len_torch_dispatch_stack() == 0
        compiled_cpu(*cpu_inputs)
    assert dm.operators and all(isinstance(op, _KernelCall) for op in dm.operators)


def test_upstream_check_hash_mismatches_accepts_kdebug_logs(compiled_cpu, cpu_inputs):
    logs = []
    for _ in range(2):
        with DebugMode() as dm:
            compiled_cpu(*cpu_inputs)
        logs.append(dm.logs)
    assert DebugMode.check_hash_mismatches(logs[0], logs[1]) == []
    assert len(logs[0]) == len(logs[1]) > len([l for l in logs[0] if isinstance(l, _KernelCall)])


def test_nested_modes_record_into_the_innermost(compiled_cpu, cpu_inputs):
    with DebugMode() as outer:
        compiled_cpu(*cpu_inputs)
        with DebugMode() as inner:
            compiled_cpu(*cpu_inputs)
        compiled_cpu(*cpu_inputs)
    n = len(inner.kernels)
    assert n > 0 and len(outer.kernels) == 2 * n


def test_nothing_recorded_outside_the_mode(compiled_cpu, cpu_inputs):
    with DebugMode() as dm:
        compiled_cpu(*cpu_inputs)
    n = dm.kernel_stats["launches"]
    for _ in range(3):
        compiled_cpu(*cpu_inputs)
    assert dm.kernel_stats["launches"] == n
    assert kdebug._C._inductor_get_active_debug_mode() is None


def test_upstream_debug_mode_still_records_its_own(compiled_cpu, cpu_inputs):
    """Installing kdebug's hooks must not take anything away from upstream's DebugMode."""
    with DebugMode():
        pass  # make sure the hooks are installed
    with upstream.DebugMode() as up:
        assert kdebug._C._inductor_get_active_debug_mode() is up
        compiled_cpu(*cpu_inputs)
    assert any("aten::mm" in str(op) for op in up.operators)


def test_compile_inside_the_mode_records_only_runtime_launches(cpu_inputs):
    def f(x):
        return (x.sin() * 2).sum(dim=-1) + x.cos().mean()

    x = cpu_inputs[0]
    with DebugMode() as first:
        torch.compile(f)(x)  # compiles inside the mode
    cf = torch.compile(f)
    with DebugMode() as second:
        cf(x)
    assert len(first.kernels) == len(second.kernels) > 0
    assert [k.kernel_name for k in first.kernels] == [k.kernel_name for k in second.kernels]


def test_odd_dtypes_and_layouts(cpu_inputs):
    def f(a, b, m, z, c):
        return (a.float() * b.t() + m.to(torch.float32)).sum() + z, (c * 2).to(torch.bfloat16)

    a = torch.randint(-5, 5, (8, 6), dtype=torch.int8)
    b = torch.randn(6, 8)  # transposed inside: a strided view
    m = torch.rand(8, 6) > 0.5
    z = torch.tensor(3.0)  # 0-dim
    c = torch.randn(2, 3, 4, 5, 6, 7)[:, :, :, 1:, ::2]  # 6-d, non-contiguous, offset
    cf = torch.compile(f)
    cf(a, b, m, z, c)
    with DebugMode(store_original_args=True) as dm:
        out = cf(a, b, m, z, c)
    ref = f(a, b, m, z, c)
    torch.testing.assert_close(out[0], ref[0])
    torch.testing.assert_close(out[1], ref[1])
    seen = {}
    for k in dm.kernels:
        for t, obj in zip(k._launch.args, k._launch.objects):
            if isinstance(obj, torch.Tensor):
                assert t.shape == tuple(obj.shape) and t.stride == obj.stride() and t.storage_offset == obj.storage_offset()
                seen[obj.dtype] = seen.get(obj.dtype, 0) + 1
    s = dm.debug_string()
    assert seen, s
    for dt, abbr in ((torch.int8, "i8"), (torch.bool, "b8"), (torch.bfloat16, "bf16")):
        if dt in seen:
            assert f"t: {abbr}[" in s


def test_tensor_info_and_args(compiled_cpu, cpu_inputs):
    with DebugMode() as dm:
        compiled_cpu(*cpu_inputs)
    k = dm.kernels[0]
    infos = [a for a in k.args if isinstance(a, TensorInfo)]
    assert infos and all(i.device == torch.device("cpu") for i in infos)
    assert set(k.written) | set(k.read) == set(k.arg_names)
    assert k.grid is None and k.config is None  # C++ kernels have no grid
    assert k.num_warps is None and k.num_stages is None and k.shared_mem is None
    assert k.device == torch.device("cpu") and k.stream == 0
    assert k.t_end_ns >= k.t_start_ns > 0



def test_launch_timestamps_are_the_monotonic_clock(compiled_cpu, cpu_inputs):
    """Note [Launch timestamps from the TSC]: each compiled launch's start and
    end lie within the CLOCK_MONOTONIC readings taken around the call (20 us of
    slack for the anchor's error), in both recordings: the first (the TSC's
    first pair only) and the later ones (calibrated where the TSC is usable);
    _C.now_ns reads the same clock."""
    import time

    from kdebug import _C

    for _ in range(3):
        time.sleep(0.03)  # calibrated by the next recording's start where the TSC is usable
        lo = time.monotonic_ns()
        with DebugMode(kernels_only=True) as dm:
            compiled_cpu(*cpu_inputs)
            mid = _C.now_ns()
        hi = time.monotonic_ns()
        assert dm.kernels
        for k in dm.kernels:
            assert lo - 20_000 <= k.t_start_ns <= k.t_end_ns <= hi + 20_000, (lo, k.t_start_ns, k.t_end_ns, hi)
        assert lo - 20_000 <= mid <= hi + 20_000


def test_a_launch_between_a_drain_and_its_merge_keeps_its_place():
    """Note [Launch order], with the interleaving planted: a kernel launched
    after the ring was drained and before the drained kernels are merged into
    operators (what a launch on autograd's device thread can hit while the
    main thread reads the recording) still lands after the aten ops recorded
    before it."""
    f = torch.compile(lambda t: t.sin() + 1)
    g = torch.compile(lambda t: t.cos() * 2)
    x = torch.randn(16)
    f(x), g(x)

    class Planted:
        """The recorder, with g launched right after its next drain."""

        def __init__(self, rec):
            self._rec, self.fired = rec, False

        def drain(self):
            n = self._rec.drain()
            if not self.fired:
                self.fired = True
                g(x)
            return n

        def __getattr__(self, name):
            return getattr(self._rec, name)

    with DebugMode() as dm:
        x.abs()               # op 0
        f(x)                  # kernel K1
        x.neg()               # op 1
        real = dm._recorder
        dm._recorder = Planted(real)
        try:
            list(dm.operators)  # drain (K1), then K2 launches, then K1 is merged
        finally:
            dm._recorder = real
        x.exp()               # op 2
    names = [k.kernel_name if isinstance(k, kdebug._KernelCall) else k.op.__name__ for k in dm.operators]
    k1 = next(n for n in names if "sin" in n)
    k2 = next(n for n in names if "cos" in n)
    assert names.index("abs.default") < names.index(k1) < names.index("neg.default") < names.index(k2)
    assert names.index(k2) < names.index("exp.default")
