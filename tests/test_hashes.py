"""Tensor hashes (issue 3): definitions, sensitivity, dtypes and layouts,
upstream compatibility, and hashing around real Inductor kernels."""
from __future__ import annotations

import math
import random
import struct

import pytest

import torch
import torch.distributed.tensor  # noqa: F401 (upstream's hash_tensor_fn needs it loaded)

from kdebug import DebugMode, KdebugWarning, _C, _upstream, hashing
from kdebug.hashing import NormHash

M64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15
LSALT = 0x6A09E667F3BCC909


def fmix64(k: int) -> int:
    k ^= k >> 33
    k = (k * 0xFF51AFD7ED558CCD) & M64
    k ^= k >> 33
    k = (k * 0xC4CEB9FE1A85EC53) & M64
    k ^= k >> 33
    return k


def reference_bitwise(t: torch.Tensor) -> int:
    """Note [The bitwise hash], written independently of the C code: the bytes
    of the contiguous copy, in 8-byte little-endian words."""
    data = bytes(t.detach().contiguous().reshape(-1).view(torch.uint8).tolist())
    L = len(data)
    data += b"\0" * (-L % 8)
    S = 0
    for p in range(len(data) // 8):
        w = int.from_bytes(data[8 * p: 8 * p + 8], "little")
        S = (S + fmix64(w ^ (((p + 1) * GOLDEN) & M64))) & M64
    return fmix64(S ^ fmix64(L ^ LSALT))


DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8,
          torch.int16, torch.int32, torch.int64, torch.bool, torch.complex64, torch.complex128,
          torch.complex32, torch.uint16, torch.uint32, torch.uint64, torch.float8_e4m3fn,
          torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz]
if hasattr(torch, "float8_e8m0fnu"):
    DTYPES.append(torch.float8_e8m0fnu)


def make(dtype, shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * 7
    if dtype == torch.bool:
        return x > 0
    if dtype.is_complex:
        return torch.complex(x, -x.flip(-1) if x.dim() else x).to(dtype)
    if dtype in (torch.uint8, torch.uint16, torch.uint32, torch.uint64):
        return x.abs().to(torch.int64).to(dtype)
    return x.to(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_bitwise_known_answers_every_dtype(dtype):
    for shape in [(), (0,), (1,), (3,), (5, 7), (2, 3, 4)]:
        t = make(dtype, shape)
        assert hashing.bitwise(t) == reference_bitwise(t), (dtype, shape)


def test_bitwise_of_the_empty_tensor_and_one_double_from_the_definition():
    assert hashing.bitwise(torch.empty(0)) == fmix64(0 ^ fmix64(0 ^ LSALT))
    one = int.from_bytes(struct.pack("<d", 1.0), "little")
    assert hashing.bitwise(torch.tensor([1.0], dtype=torch.float64)) == \
        fmix64(fmix64(one ^ GOLDEN) ^ fmix64(8 ^ LSALT))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.complex64, torch.bool])
def test_bitwise_views_hash_like_their_contiguous_copies(dtype):
    base = make(dtype, (6, 8, 10), seed=3)
    views = [base.transpose(0, 2), base[1:, ::2, 3:], base.permute(2, 0, 1)[::3],
             base[2], base[:, 5], base.unsqueeze(1).expand(6, 4, 8, 10), base[0, 0, 0]]
    for v in views:
        assert hashing.bitwise(v) == hashing.bitwise(v.contiguous()) == reference_bitwise(v)
    # a 6-d non-contiguous view (more dims than a record holds inline)
    six = make(dtype, (2, 3, 2, 3, 2, 4), seed=4).permute(5, 4, 3, 2, 1, 0)
    assert hashing.bitwise(six) == reference_bitwise(six)


def test_bitwise_sensitive_to_every_bit_flip_and_to_swaps():
    t = make(torch.float32, (4, 8), seed=5)
    h0 = hashing.bitwise(t)
    raw = t.view(torch.int32)
    for i in range(t.numel()):
        for bit in range(32):
            r = raw.clone().reshape(-1)
            r[i] ^= (1 << bit) if bit < 31 else -(1 << 31)
            assert hashing.bitwise(r.view(torch.float32)) != h0, (i, bit)
    rng = random.Random(0)
    flat = t.reshape(-1)
    for _ in range(300):
        i, j = rng.sample(range(flat.numel()), 2)
        s = flat.clone()
        s[i], s[j] = flat[j], flat[i]
        assert hashing.bitwise(s) != h0
    # equal pairs do not cancel; values moved to other positions change the hash
    assert hashing.bitwise(torch.zeros(4)) != hashing.bitwise(torch.full((4,), 3.0))
    assert hashing.bitwise(torch.tensor([1.0, 2.0])) != hashing.bitwise(torch.tensor([2.0, 1.0]))


def test_bitwise_nan_payloads():
    a = torch.tensor([0x7FC00001, 5], dtype=torch.int32).view(torch.float32)
    b = a.clone()
    c = torch.tensor([0x7FC00002, 5], dtype=torch.int32).view(torch.float32)
    assert hashing.bitwise(a) == hashing.bitwise(b) != hashing.bitwise(c)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16,
                                   torch.int32, torch.int64, torch.int8, torch.bool, torch.complex64,
                                   torch.complex128, torch.float8_e4m3fn, torch.float8_e5m2])
def test_norm_matches_upstream(dtype):
    t = make(dtype, (9, 13), seed=7)
    ours = hashing.norm(t)
    theirs = _upstream.utils_module.norm_hash_fn(t, use_scalar=True)
    assert math.isclose(ours, theirs, rel_tol=1e-12, abs_tol=1e-12), (ours, theirs)
    assert hashing.norm(t[::2, 1:].t()) == pytest.approx(
        _upstream.utils_module.norm_hash_fn(t[::2, 1:].t(), use_scalar=True), rel=1e-12)


def test_norm_is_deterministic_with_nan_and_inf():
    t = torch.tensor([1.0, float("nan"), 2.0, float("inf"), -float("inf")])
    up = _upstream.utils_module.norm_hash_fn
    assert up(t, use_scalar=True) != up(t.clone(), use_scalar=True)  # upstream: nan != nan
    a, b = hashing.norm(t), hashing.norm(t.clone())
    assert isinstance(a, NormHash) and a == b and math.isnan(a)
    assert (a.l1_finite, a.nan, a.posinf, a.neginf) == (3.0, 1, 1, 1)
    assert a != hashing.norm(torch.tensor([1.0, float("nan"), 2.5, float("inf"), -float("inf")]))
    assert hashing.norm(torch.tensor([1.0, float("inf")])) == NormHash(1.0, 0, 1, 0)
    assert math.isinf(hashing.norm(torch.tensor([1.0, float("inf")])))
    assert hashing.norm(torch.tensor([1.0, -2.0])) == 3.0 and type(hashing.norm(torch.ones(2))) is float


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16,
                                   torch.int32, torch.int64, torch.uint8, torch.bool, torch.complex64])
def test_hash_tensor_matches_upstream(dtype):
    t = make(dtype, (5, 6), seed=9)
    assert hashing.hash_tensor(t) == _upstream.utils_module.hash_tensor_fn(t, use_scalar=True)
    assert hashing.hash_tensor(t[:0]) == 0


def test_bad_hash_fn_says_what_to_do():
    with pytest.raises(ValueError, match="'bitwise', 'norm', 'hash_tensor'|'norm'"):
        with DebugMode.log_tensor_hashes(hash_fn="sha256"):
            pass
    with pytest.raises(ValueError, match="unknown hash"):
        with DebugMode.log_tensor_hashes(hash_fn=["norm", "md5"]):
            pass
    with pytest.raises(TypeError, match="hash_fn must be"):
        with DebugMode.log_tensor_hashes(hash_fn=3):
            pass
    with pytest.raises(ValueError, match="max_bytes"):
        with DebugMode.record_outputs(max_bytes=-1):
            pass


# ---------------------------------------------------------------- around kernels


def test_pre_and_post_hashes_follow_roles(compiled_cpu, cpu_inputs):
    with DebugMode(store_original_args=True) as dm:
        with DebugMode.log_tensor_hashes(hash_fn=["bitwise", "norm"], hash_inputs=True):
            compiled_cpu(*cpu_inputs)
    for k in dm.kernels:
        roles = k.roles
        tensors = {n for n, a in zip(k.arg_names, k.args) if isinstance(a, torch.Tensor)}
        assert set(k.pre_hashes or {}) == {n for n in tensors if "R" in roles[n]}
        assert set(k.post_hashes) == {n for n in tensors if "W" in roles[n]}
        assert not any(n.startswith("out_ptr") for n in (k.pre_hashes or {}))
        for n, (bw, nm) in k.post_hashes.items():
            assert isinstance(bw, int) and isinstance(nm, float)
    # the input a kernel reads is what the aten op before it wrote
    mm = next(op for op in dm.operators if "aten::mm" in str(op))
    first = dm.kernels[0]
    assert mm.log["hash"] in first.pre_hashes.values()


def test_post_hashes_equal_hashes_of_recorded_outputs(compiled_cpu, cpu_inputs):
    with DebugMode() as dm:
        with DebugMode.log_tensor_hashes(hash_fn="bitwise"), DebugMode.record_outputs():
            compiled_cpu(*cpu_inputs)
    for k in dm.kernels:
        outs = k.record["output"]
        assert set(outs) == set(k.written) == set(k.post_hashes)
        for n, clone in outs.items():
            assert k.post_hashes[n] == hashing.bitwise(clone)


def test_identical_runs_hash_identically(compiled_cpu, cpu_inputs):
    runs = []
    for _ in range(2):
        with DebugMode() as dm:
            with DebugMode.log_tensor_hashes(hash_fn=["bitwise", "norm", "hash_tensor"], hash_inputs=True):
                compiled_cpu(*cpu_inputs)
        runs.append([(k.kernel_name, k.pre_hashes, k.post_hashes) for k in dm.kernels])
        logs = dm.logs
    assert runs[0] == runs[1]
    assert DebugMode.check_hash_mismatches(logs, logs) == []


def test_custom_hash_fn(compiled_cpu, cpu_inputs):
    def my_hash_fn(tensor):
        """Custom hash: sum of absolute values"""
        return tensor.abs().sum().item()

    with DebugMode() as dm:
        with DebugMode.log_tensor_hashes(hash_fn=my_hash_fn, hash_inputs=True):
            compiled_cpu(*cpu_inputs)
    k = dm.kernels[0]
    assert k.post_hashes and all(isinstance(v, float) for v in k.post_hashes.values())
    mm_hash = next(op for op in dm.operators if "aten::mm" in str(op)).log["hash"]
    assert any(v == pytest.approx(mm_hash) for v in k.pre_hashes.values())



def test_repeated_hash_contexts_make_no_new_spec_ids(compiled_cpu, cpu_inputs):
    # a training loop entering log_tensor_hashes() every step must not run out
    # of the 16-bit spec ids records carry; callables share one id and keep
    # their own values
    with DebugMode() as dm:
        for i in range(3):
            with DebugMode.log_tensor_hashes(hash_fn=lambda t, i=i: float(i)):
                compiled_cpu(*cpu_inputs)
    n = len(hashing._specs)
    for _ in range(200):
        with DebugMode.log_tensor_hashes(hash_fn=["bitwise", "norm"]):
            pass
        with DebugMode.log_tensor_hashes(hash_fn=lambda t: 0):
            pass
    assert len(hashing._specs) <= n + 1
    assert hashing.parse("norm") == hashing.parse("norm")
    assert hashing.parse("norm")[0] != hashing.parse(["norm"])[0]  # a list gives tuples
    per_run = [k.post_hashes for k in dm.kernels]
    assert len(per_run) % 3 == 0 and per_run
    third = len(per_run) // 3
    for i in range(3):
        vals = {v for h in per_run[i * third:(i + 1) * third] for v in h.values()}
        assert vals == {float(i)}

def test_check_inputs_unchanged_finds_a_kernel_that_writes_its_input():
    def kernel(inp, out):
        out.copy_(inp * 2)
        inp.add_(1)  # writes to memory declared read-only

    info = _C.KernelInfo(_C.KIND_CPP, "sneaky_kernel", ["in_ptr0", "out_ptr0"], [1, 2], 0, -1)
    wrapped = _C.CppKernel(kernel, info)
    a, b = torch.ones(8), torch.empty(8)
    with pytest.warns(KdebugWarning, match="changed during the launch"):
        with DebugMode(kernels_only=True) as dm:
            with DebugMode.log_tensor_hashes(hash_fn="bitwise", check_inputs_unchanged=True):
                wrapped(a, b)
    (k,) = dm.kernels
    assert k.readonly_violations == ["in_ptr0"]
    assert dm.kernel_stats["readonly_changed"] == 1


def test_real_kernels_respect_their_read_only_inputs(compiled_cpu, cpu_inputs):
    with DebugMode() as dm:
        with DebugMode.log_tensor_hashes(hash_fn="norm", check_inputs_unchanged=True):
            compiled_cpu(*cpu_inputs)
    assert dm.kernels and all(k.readonly_violations == [] for k in dm.kernels)
    assert dm.kernel_stats["readonly_changed"] == 0


def test_record_outputs_budget_is_reported_not_an_oom(compiled_cpu, cpu_inputs):
    with pytest.warns(KdebugWarning, match=r"record_outputs kept \d+ bytes.*not recorded"):
        with DebugMode() as dm:
            with DebugMode.record_outputs(max_bytes=4096):
                for _ in range(3):
                    compiled_cpu(*cpu_inputs)
    s = dm.kernel_stats
    assert 0 < s["output_bytes"] <= 4096 and s["outputs_skipped"] > 0


def test_odd_dtypes_are_hashed_around_kernels():
    def f(a, m, c):
        return (a.float() * 2).to(torch.bfloat16), m.logical_not(), (c.to(torch.int8) + 1)

    a = torch.randn(6, 5).to(torch.bfloat16)
    m = torch.rand(6, 5) > 0.5
    c = torch.randint(-4, 4, (6, 5), dtype=torch.int32)
    cf = torch.compile(f)
    cf(a, m, c)
    with DebugMode(store_original_args=True) as dm:
        with DebugMode.log_tensor_hashes(hash_fn=["bitwise", "hash_tensor"], hash_inputs=True):
            cf(a, m, c)
    seen = 0
    for k in dm.kernels:
        for n, obj in zip(k.arg_names, k.args):
            if isinstance(obj, torch.Tensor) and k.post_hashes and n in k.post_hashes:
                bw, x = k.post_hashes[n]
                assert bw == hashing.bitwise(obj) and x == hashing.hash_tensor(obj)
                seen += 1
    assert seen >= 3


# ---------------------------------------------------------------- seed 001


def test_seed001_examples(compiled_cpu, cpu_inputs):
    my_compiled_model = compiled_cpu
    input_tensor = cpu_inputs
    # 1. Record Triton (here: all kernel) outputs
    with DebugMode() as debug_mode:
        with DebugMode.record_outputs():
            result = my_compiled_model(*input_tensor)
    recorded = []
    for call in debug_mode.operators:
        if hasattr(call, "record") and call.record:
            outputs = call.record.get("output")
            recorded.append(outputs)
    assert any(isinstance(o, dict) for o in recorded)  # kernel records: {name: clone}
    # 2. Log tensor hashes
    with DebugMode() as debug_mode:
        with DebugMode.log_tensor_hashes():
            result = my_compiled_model(*input_tensor)
    s = debug_mode.debug_string()
    assert "# post-kernel hashes: {" in s and "'hash':" in s

    # 3. Custom hash function
    def my_hash_fn(tensor):
        """Custom hash: sum of absolute values"""
        return tensor.abs().sum().item()

    with DebugMode() as debug_mode:
        with DebugMode.log_tensor_hashes(hash_fn=my_hash_fn):
            result = my_compiled_model(*input_tensor)
    assert debug_mode.kernels[0].post_hashes
    # 4. Hash both inputs and outputs
    with DebugMode() as debug_mode:
        with DebugMode.log_tensor_hashes(hash_inputs=True):
            result1 = my_compiled_model(*input_tensor)
            result2 = my_compiled_model(*input_tensor)  # Should have same hashes
    s = debug_mode.debug_string()
    assert "'input_hash'" in s and "# pre-kernel hashes: {" in s
    k1, k2 = debug_mode.kernels
    assert k1.pre_hashes == k2.pre_hashes and k1.post_hashes == k2.post_hashes
    assert torch.equal(result1[0], result2[0]) and result is not None


def test_fresh_buffer_analysis_of_generated_code():
    from kdebug.inductor import fresh_args

    src = '''
class Runner:
    def call(self, args):
        arg0_1, = args
        buf0 = empty_strided_cpu((4, ), (1, ), torch.float32)
        buf1 = empty_strided_cpu((4, ), (1, ), torch.float32)
        extern_kernels.mm(arg0_1, arg0_1, out=buf1)
        buf2 = buf0; del buf0  # reuse
        buf3 = reinterpret_tensor(buf1, (2, 2), (2, 1), 0); del buf1  # reuse
        cpp_fused_a_0(buf2, buf3, arg0_1, 4)
        buf4 = empty_strided_cuda((4, ), (1, ), torch.float32)
        triton_poi_b_1.run(buf4, buf2, 4, stream=stream0)
        triton_poi_b_1.run(buf2, buf4, 4, stream=stream0)
        return (buf4, )
'''
    out = fresh_args(src)
    assert out["cpp_fused_a_0"] == {0}          # buf2 aliases the fresh buf0; buf3 was written by mm
    assert out["triton_poi_b_1"] == frozenset()  # fresh at its first call site only
    assert fresh_args("not python (") == {}


def test_empty_tensors_around_a_kernel_are_hashed_not_unsupported():
    def kernel(a, out):
        out.copy_(a)

    info = _C.KernelInfo(_C.KIND_CPP, "empty_kernel", ["in_ptr0", "out_ptr0"], [1, 2], 0, -1)
    wrapped = _C.CppKernel(kernel, info)
    a, out = torch.empty(0, 3), torch.empty(0, 3)
    with DebugMode(kernels_only=True) as dm:
        with DebugMode.log_tensor_hashes(hash_fn="bitwise", hash_inputs=True):
            wrapped(a, out)
    (k,) = dm.kernels
    assert k.pre_hashes == {"in_ptr0": fmix64(0 ^ fmix64(0 ^ LSALT))}
    assert k.post_hashes == {"out_ptr0": fmix64(0 ^ fmix64(0 ^ LSALT))}
    assert dm.kernel_stats["hash_unsupported"] == 0


def test_meta_tensor_ops_are_recorded_unhashed_not_crashed():
    # Inductor's pattern matcher traces on meta tensors under the active mode
    # at its first compile (seen in a 1-rank compiled DDP job): no data to hash
    import kdebug

    with kdebug.DebugMode() as dm, kdebug.DebugMode.log_tensor_hashes(["bitwise", "stats"], hash_inputs=True):
        torch.ones(2, device="meta") + 1
        torch.ones(2) + 1
    logs = [getattr(o, "log", None) or {} for o in dm.operators]
    assert len(logs) == 4
    assert "hash" not in logs[1] and "input_hash" not in logs[1]  # meta add: nothing invented
    assert logs[3]["hash"] is not None and logs[3]["input_hash"] is not None


def test_views_of_a_fresh_buffer_are_not_hashed_and_keep_it_fresh():
    # Note [Fresh buffers]: DDP's gradient bucket is empty, then as_strided views per
    # parameter; hashing those views hashed uninitialized memory, and two runs differed
    import kdebug

    with kdebug.DebugMode() as dm, kdebug.DebugMode.log_tensor_hashes(["bitwise"], hash_inputs=True):
        bucket = torch.empty(8)
        v = bucket.as_strided([4], [1], 0)
        v.copy_(torch.ones(4))
        w = bucket.as_strided([4], [1], 0)
        w.add(1)
    ops = [(str(o).split("(")[0], getattr(o, "log", None) or {}) for o in dm.operators]
    names = [n for n, _ in ops]
    assert names == ["aten::empty.memory_format", "aten::as_strided", "aten::ones", "aten::copy_",
                     "aten::as_strided", "aten::add.Tensor"], names
    assert "hash" not in ops[1][1] and "input_hash" not in ops[1][1]  # view of fresh memory
    assert ops[3][1]["input_hash"][0][0] is None  # copy_ writes the still-fresh bucket: no pre hash
    assert ops[4][1].get("hash") is not None  # after the write: a view of written memory is hashed
    assert ops[5][1].get("input_hash") is not None


@pytest.mark.parametrize("path", ["fast", "upstream"])
def test_hash_contexts_one_after_another_each_hash_as_asked(path):
    """Note [Hash hooks per spec]: the entry and hooks made for one
    (hash_fn, hash_inputs) are not what another gets, on the fast path and
    through upstream's hooks (record_ids sends every op there)."""
    a, b = torch.randn(5), torch.randn(5)
    asked = [("norm", False), ("norm", True), ("bitwise", False), ("bitwise", True), ("norm", False),
             ("bitwise", False)] * 2
    with DebugMode(**({"record_ids": True} if path == "upstream" else {})) as dm:
        for fn, inputs in asked:
            with DebugMode.log_tensor_hashes(fn, hash_inputs=inputs):
                torch.add(a, b)
    logs = [o.log for o in dm.operators]
    out = a + b
    assert len(logs) == len(asked)
    for (fn, inputs), log in zip(asked, logs):
        assert ("input_hash" in log) == inputs, (fn, inputs, log)
        if fn == "bitwise":
            assert log["hash"] == reference_bitwise(out)
            if inputs:
                assert log["input_hash"][0] == (reference_bitwise(a), reference_bitwise(b))
        else:  # upstream's norm: the float64 L1 norm
            assert log["hash"] == pytest.approx(out.double().abs().sum().item(), rel=1e-12)
            if inputs:
                assert log["input_hash"][0] == pytest.approx((a.double().abs().sum().item(),
                                                              b.double().abs().sum().item()), rel=1e-12)
