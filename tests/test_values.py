"""Values that are what they say: counts are exact, hashes are of the logical
values, and a value that was not computed is never shown."""
from __future__ import annotations

import re
import warnings

import pytest
import torch

from kdebug import DebugMode, KdebugWarning


def _two_graphs(x):
    y = torch.sin(x) + 1
    torch._dynamo.graph_break()
    return torch.cos(y) * 2


@pytest.fixture(scope="module")
def two_graphs():
    x = torch.randn(32)
    fn = torch.compile(_two_graphs)
    fn(x)
    return fn, x


@pytest.mark.parametrize("overflow", ["overwrite", "drop_new"])
def test_overflow_warning_counts_exactly_what_was_dropped(two_graphs, overflow):
    fn, x = two_graphs
    with DebugMode(kernels_only=True) as dm:  # a ring large enough: how many launches one call makes
        fn(x)
    per_call = len(dm.kernels)
    assert per_call == 2 and dm.complete
    calls = 10
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # no trace, nothing read before exit: the warning at exit counts an undrained ring
        with DebugMode(kernels_only=True, ring_capacity=16, overflow=overflow) as small:
            for _ in range(calls):
                fn(x)
        msgs = [str(w.message) for w in caught if issubclass(w.category, KdebugWarning)]
    kept = len(small.kernels)
    assert kept == 5  # 3 slots per launch, 16 slots
    dropped = [int(m) for w in msgs for m in re.findall(r"(\d+) kernel launch record\(s\) were dropped", w)]
    assert dropped == [calls * per_call - kept]  # 15, once
    assert small.kernel_stats["dropped"] == 15


# ---- check_inputs_unchanged: only computed values are shown ----

def _l1(t):  # upstream's norm hash, by plain torch
    return t.double().abs().sum().item()


@pytest.mark.parametrize("hash_fn", ["norm", "hash_tensor", ["norm", "bitwise"]])
def test_readonly_check_shows_no_post_hash_it_did_not_compute(hash_fn):
    g = torch.compile(lambda a: a * 2)
    a = torch.randn(64)
    g(a)
    with DebugMode() as dm:
        with DebugMode.log_tensor_hashes(hash_fn, hash_inputs=True, check_inputs_unchanged=True):
            out = g(a)
    (k,) = dm.kernels
    # the read-only input's post side holds only the bitwise hash the check compares
    assert set(k.post_hashes) == {"out_ptr0"}
    assert set(k.pre_hashes) == {"in_ptr0"}
    assert k.readonly_violations == []
    if hash_fn == "norm":
        assert k.pre_hashes["in_ptr0"] == pytest.approx(_l1(a), rel=1e-12)
        assert k.post_hashes["out_ptr0"] == pytest.approx(_l1(out), rel=1e-12)
    assert "in_ptr0" not in dm.debug_string().split("post-kernel hashes")[1]


def test_readonly_check_with_bitwise_shows_the_computed_post_hash():
    g = torch.compile(lambda a: a * 3)
    a = torch.randn(64)
    g(a)
    with DebugMode() as dm:
        with DebugMode.log_tensor_hashes("bitwise", hash_inputs=True, check_inputs_unchanged=True):
            g(a)
    (k,) = dm.kernels
    assert k.post_hashes["in_ptr0"] == k.pre_hashes["in_ptr0"]  # computed, and unchanged


# ---- dtypes a hash cannot decode ----

def _fp4(values):
    return torch.tensor(values, dtype=torch.uint8).view(torch.float4_e2m1fn_x2)


@pytest.mark.parametrize("hash_fn", ["norm", "hash_tensor", "stats"])
def test_unhashable_dtype_is_marked_warned_once_and_never_equal(hash_fn):
    from kdebug.hashing import Unhashed

    a, b = torch.tensor([1, 2, 3, 4], dtype=torch.uint8), torch.tensor([9, 8, 7, 6], dtype=torch.uint8)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with DebugMode() as dm, DebugMode.log_tensor_hashes(hash_fn):
            x = a.view(torch.float4_e2m1fn_x2).clone()
            y = b.view(torch.float4_e2m1fn_x2).clone()
    msgs = [str(w.message) for w in caught if issubclass(w.category, KdebugWarning) and "Unhashed" in str(w.message)]
    assert len(msgs) == 1 and "float4_e2m1fn_x2" in msgs[0] and "bitwise" in msgs[0]
    hashes = [op.log["hash"] for op in dm.operators if op.log and "hash" in op.log]
    assert len(hashes) == 4  # view and clone of each
    assert all(isinstance(h, Unhashed) and h.kind == hash_fn for h in hashes)
    assert hashes[1] != hashes[3] and not (hashes[1] == hashes[1])  # never equal, not even to itself
    assert x.view(torch.uint8).tolist() != y.view(torch.uint8).tolist()
    assert len(DebugMode.check_hash_mismatches(dm.operators[:2], dm.operators[2:])) == 2


def test_unhashable_dtype_hashes_bitwise_by_its_bytes():
    from kdebug import hashing

    with DebugMode() as dm, DebugMode.log_tensor_hashes(["bitwise", "norm"]):
        srcs = [_fp4([1, 2, 3]), _fp4([1, 2, 3]), _fp4([1, 2, 4])]
        for t in srcs:
            t.clone()
    h = [op.log["hash"] for op in dm.operators if str(op.op) == "aten.clone.default"]
    assert len(h) == 3
    bw = [x[0] for x in h]
    assert bw[0] == bw[1] != bw[2]  # same bytes, same hash; other bytes, other hash
    assert bw[0] == hashing.bitwise(srcs[0])
    assert all(isinstance(x[1], hashing.Unhashed) for x in h)


@pytest.mark.parametrize("kind", ["norm", "stats"])
def test_unhashable_kernel_argument_is_unhashed_not_zero(kind):
    from kdebug import _C, hashing

    def kernel(inp, out):
        out.copy_(inp)

    info = _C.KernelInfo(_C.KIND_CPP, "fp4_copy", ["in_ptr0", "out_ptr0"], [1, 2], 0, -1)
    wrapped = _C.CppKernel(kernel, info)
    src = _fp4([1, 2, 3, 4])
    with pytest.warns(KdebugWarning, match="dtype the requested hash cannot decode"):
        with DebugMode(kernels_only=True) as dm:
            with DebugMode.log_tensor_hashes([kind, "bitwise"], hash_inputs=True):
                wrapped(src, torch.empty_like(src))
    (k,) = dm.kernels
    for side in (k.pre_hashes["in_ptr0"], k.post_hashes["out_ptr0"]):
        assert isinstance(side[0], hashing.Unhashed) and side[0] != 0.0
        assert side[1] == hashing.bitwise(src)


# ---- conjugate / negative views hash their logical values ----

def _views():
    a = torch.randn(5, generator=torch.Generator().manual_seed(0))
    z = torch.complex(a, a.flip(0))
    return {
        "conj().imag": z.conj().imag,
        "conj()": z.conj(),
        "_neg_view": torch._neg_view(a),
        "conj() strided": torch.complex(a, a).conj()[::2],
    }


@pytest.mark.parametrize("name", list(_views()))
@pytest.mark.parametrize("kind", ["bitwise", "norm", "hash_tensor"])
def test_conj_and_neg_views_hash_their_values(name, kind):
    from kdebug import hashing

    t = _views()[name]
    assert t.is_conj() or t.is_neg()
    ref = t.resolve_conj().resolve_neg().clone()  # plain torch: the logical values, bits resolved
    assert not ref.is_conj() and not ref.is_neg()
    fn = getattr(hashing, kind)
    assert fn(t) == fn(ref)
    if kind == "bitwise":  # and not the hash of the bytes as stored (what it was before)
        stored = ref.conj().resolve_conj() if t.is_conj() else -ref
        assert fn(t) != fn(stored)


def test_conj_view_aten_output_hash_is_of_its_values():
    from kdebug import hashing

    a = torch.randn(5, generator=torch.Generator().manual_seed(1))
    z = torch.complex(a, a + 1)
    with DebugMode() as dm, DebugMode.log_tensor_hashes(["bitwise", "hash_tensor"]):
        c = z.conj()
        i = c.imag
    ops = list(dm.operators)
    # aten::_conj gives c; .imag runs _conj, view_as_real, _neg_view, select: the last gives i
    assert str(ops[0].op) == "aten._conj.default" and str(ops[-1].op) == "aten.select.int"
    assert i.is_neg()
    ref_c, ref_i = c.resolve_conj().clone(), i.resolve_neg().clone()
    assert ops[0].log["hash"] == (hashing.bitwise(ref_c), hashing.hash_tensor(ref_c))
    assert ops[-1].log["hash"] == (hashing.bitwise(ref_i), hashing.hash_tensor(ref_i))
    assert ops[0].log["hash"][0] != hashing.bitwise(z)  # not the un-conjugated bytes
    assert ops[-1].log["hash"][0] != hashing.bitwise(z.imag.clone())


def test_neg_view_kernel_argument_hash_is_of_its_values():
    from kdebug import _C, hashing

    def kernel(inp, out):
        out.copy_(inp)

    info = _C.KernelInfo(_C.KIND_CPP, "neg_copy", ["in_ptr0", "out_ptr0"], [1, 2], 0, -1)
    wrapped = _C.CppKernel(kernel, info)
    a = torch.randn(7, generator=torch.Generator().manual_seed(2))
    v = torch._neg_view(a)
    with DebugMode(kernels_only=True) as dm:
        with DebugMode.log_tensor_hashes(["bitwise", "hash_tensor", "norm"], hash_inputs=True):
            wrapped(v, torch.empty(7))
    (k,) = dm.kernels
    ref = v.resolve_neg().clone()
    assert k.pre_hashes["in_ptr0"][:2] == (hashing.bitwise(ref), hashing.hash_tensor(ref))
    assert k.pre_hashes["in_ptr0"][0] != hashing.bitwise(a)


def test_unhashed_kernel_hash_reads_back_from_a_trace_as_unhashed(tmp_path):
    import kdebug
    from kdebug import _C, hashing

    def kernel(inp, out):
        out.copy_(inp)

    info = _C.KernelInfo(_C.KIND_CPP, "fp4_copy2", ["in_ptr0", "out_ptr0"], [1, 2], 0, -1)
    wrapped = _C.CppKernel(kernel, info)
    src = _fp4([5, 6, 7])
    with pytest.warns(KdebugWarning):
        with DebugMode(kernels_only=True) as dm:
            with DebugMode.log_tensor_hashes("norm", hash_inputs=True, check_inputs_unchanged=True):
                wrapped(src, torch.empty_like(src))
    dm.save(tmp_path / "fp4.kdt")
    (k,) = kdebug.load(str(tmp_path / "fp4.kdt")).kernels
    assert isinstance(k.post_hashes["out_ptr0"], hashing.Unhashed)
    assert set(k.post_hashes) == {"out_ptr0"}  # the checked input's post side: bitwise only, not shown


def _post_digests(path):
    import kdebug

    run = kdebug.load(str(path))
    d = torch.frombuffer(bytearray(run.digests()), dtype=torch.int64).view(len(run), 5)
    return [int(x) for x in d[:, 4]]


@pytest.mark.parametrize("hash_fn", ["norm", "stats", "bitwise"])
def test_trace_digests_of_unhashed_values_never_match(tmp_path, hash_fn):
    """kdebug diff / hunt compare digests of the trace bytes: two Unhashed
    values must differ there too; bitwise hashes of the same bytes match."""
    from kdebug import _C

    def kernel(inp, out):
        out.copy_(inp)

    info = _C.KernelInfo(_C.KIND_CPP, "fp4_copy3", ["in_ptr0", "out_ptr0"], [1, 2], 0, -1)
    wrapped = _C.CppKernel(kernel, info)
    digests = []
    for run in range(2):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with DebugMode() as dm, DebugMode.log_tensor_hashes(hash_fn):
                src = _fp4([1, 2, 3, 4]).clone()
                wrapped(src, torch.empty_like(src))
        dm.save(tmp_path / f"{run}.kdt")
        digests.append(_post_digests(tmp_path / f"{run}.kdt"))
    assert len(digests[0]) == len(digests[1]) >= 5  # aten ops and the kernel
    # records after the first (lift_fresh of the uint8 source, hashable by any kind) hold fp4
    # tensors; empty_like's output is not hashed (digest 0)
    same = [a == b for a, b in zip(digests[0][1:], digests[1][1:]) if a and b]
    assert len(same) >= 3
    assert same and (all(same) if hash_fn == "bitwise" else not any(same))


def test_unhashed_warning_comes_once_per_mode():
    def count(fn):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fn()
        return sum("Unhashed" in str(w.message) for w in caught)

    def one_mode():
        with DebugMode() as dm:
            for _ in range(3):  # a training loop entering log_tensor_hashes every step
                with DebugMode.log_tensor_hashes("norm"):
                    _fp4([1, 2]).clone()
        return dm

    assert count(one_mode) == 1
    assert count(one_mode) == 1  # a new mode warns again


def test_the_copy_destination_is_an_ordinary_tensor_made_through_no_dispatch_mode():
    """_C._empty_like is what record_outputs copies a deferred GPU output into
    (kd_defer_clone).  It must be a tensor every op works on (it once had only
    a backend bit in its key set: copy_ raised 'no tensor arguments'), with
    the source's strides when dense, contiguous otherwise, and be made
    without any dispatch mode seeing an op."""
    from kdebug import _C

    dense = torch.randn(6, 4).t()
    sparse_view = torch.randn(8, 6)[::2, 1:]
    with DebugMode() as dm:
        e = _C._empty_like(dense)
        g = _C._empty_like(sparse_view)
    assert not list(dm.operators)
    assert e.stride() == dense.stride() and e.dtype == dense.dtype and e.device == dense.device
    assert g.is_contiguous() and g.shape == sparse_view.shape
    e.copy_(dense)
    g.copy_(sparse_view)
    assert torch.equal(e, dense) and torch.equal(g, sparse_view)
    assert torch.equal((e * 2).cpu(), dense * 2)
    assert torch.equal(e.reshape(-1), dense.reshape(-1)) and torch.equal(g.view(-1), sparse_view.reshape(-1))
    assert "tensor(" in repr(e) and torch.equal(torch.empty_like(e).copy_(e), dense)


@pytest.mark.parametrize("same", [True, False])
def test_unhashed_kinds_beside_a_bitwise_hash_follow_the_bytes(tmp_path, same):
    """hash_fn=["bitwise", "stats"] (the hunt's) on tensors the stats cannot
    decode (fp4 through an aten op and a C++ kernel; a quantized tensor): the
    same bytes in two runs match, in the traces' digests and in
    kdebug.compare, and other bytes differ (the stats' random markers made
    every quantized op of a hunt a false root, found by a review)."""
    import kdebug
    from kdebug import _C, hashing

    def kernel(inp, out):
        out.copy_(inp)

    info = _C.KernelInfo(_C.KIND_CPP, "fp4_copy4", ["in_ptr0", "out_ptr0"], [1, 2], 0, -1)
    wrapped = _C.CppKernel(kernel, info)
    runs = []
    for run in range(2):
        vals = [1, 2, 3, 4] if same or run == 0 else [1, 2, 3, 5]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with DebugMode() as dm, DebugMode.log_tensor_hashes(["bitwise", "stats"], hash_inputs=True):
                src = _fp4(vals).clone()
                wrapped(src, torch.empty_like(src))
                q = torch.quantize_per_tensor(torch.tensor(vals, dtype=torch.float32), 0.5, 0, torch.quint8)
                q.dequantize()
        dm.save(tmp_path / f"{run}.kdt")
        runs.append(dm)
    assert any(isinstance(h, hashing.Unhashed) for k in runs[0].kernels for h in k.post_hashes["out_ptr0"])
    d0, d1 = _post_digests(tmp_path / "0.kdt"), _post_digests(tmp_path / "1.kdt")
    assert len(d0) == len(d1)
    for rep in (kdebug.compare(*runs), kdebug.compare(str(tmp_path / "0.kdt"), str(tmp_path / "1.kdt"))):
        assert rep.verdict == ("match" if same else "differ"), str(rep)
    if same:
        assert d0 == d1
    else:
        assert d0 != d1


@pytest.mark.parametrize("per", ["tensor", "channel"])
def test_a_quantized_tensors_bitwise_hash_covers_its_scales(per):
    """Note [Quantized tensors' parameters]: two quantized tensors with the
    same integers and another scale hold other values, so their bitwise
    hashes differ -- through the C launch path (a C++ kernel's output) and the
    Python path (an aten op's output) alike, which agree with each other and
    with hashing.bitwise -- and kdebug.compare of two such runs says they
    differ (it said they matched: only the integers were hashed).  Reading the
    scales records no op of its own."""
    import kdebug
    from kdebug import _C, hashing

    def kernel(inp, out):
        out.copy_(inp)

    info = _C.KernelInfo(_C.KIND_CPP, "qcopy", ["in_ptr0", "out_ptr0"], [1, 2], 0, -1)
    wrapped = _C.CppKernel(kernel, info)
    w = torch.tensor([[0.5, -1.0], [2.0, 0.25], [-3.0, 1.5]])
    if per == "tensor":
        base = torch.quantize_per_tensor(w, 0.5, 3, torch.quint8)
        other = torch._make_per_tensor_quantized_tensor(base.int_repr(), 0.25, 3)
    else:
        scales, zeros = torch.tensor([0.1, 0.2, 0.3], dtype=torch.float64), torch.tensor([0, 1, 2])
        base = torch.quantize_per_channel(w, scales, zeros, 0, torch.qint8)
        other = torch._make_per_channel_quantized_tensor(base.int_repr(), scales * 1.5, zeros, 0)
    assert torch.equal(base.int_repr(), other.int_repr()) and not torch.equal(base.dequantize(), other.dequantize())
    runs, values = [], []
    for t in (base, other, base.clone()):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with DebugMode() as dm, DebugMode.log_tensor_hashes(["bitwise"]):
                out = torch.empty_like(t)
                wrapped(t, out)
                t.clone()
        (kernel_hash,) = dm.kernels[0].post_hashes["out_ptr0"]
        clones = [op for op in dm.operators if "clone" in str(op)]
        assert len(clones) == 1, dm.debug_string()
        assert not any("q_scale" in str(op) or "q_per_channel" in str(op) for op in dm.operators), dm.debug_string()
        values.append((kernel_hash, hashing.bitwise(t), hashing.bitwise(out)))
        runs.append(dm)
    for kernel_hash, of_input, of_output in values:
        assert kernel_hash == of_input == of_output
    assert values[0] == values[2] and values[0][0] != values[1][0]
    assert kdebug.compare(runs[0], runs[2]).verdict == "match"
    assert kdebug.compare(runs[0], runs[1]).verdict == "differ"


def test_quantized_values_are_hashed_alike_on_every_path():
    """Found by a review of Note [Quantized tensors' parameters]: the C launch
    path gave Unhashed for the norm / stats / hash_tensor of a quantized
    tensor where the Python paths gave its integers' values, and did not hash
    a quint4x2 tensor at all ("storage smaller than its view"); qparams_digest
    made its small tensors on the default device (a meta default raised).
    Now every path gives the integers' values and the packed bytes' hash, and
    the scales count for quint4x2 too."""
    from kdebug import _C, hashing

    def kernel(inp, out):
        out.copy_(inp)

    info = _C.KernelInfo(_C.KIND_CPP, "qcopy2", ["in_ptr0", "out_ptr0"], [1, 2], 0, -1)
    wrapped = _C.CppKernel(kernel, info)
    g = torch.Generator().manual_seed(0)
    w = torch.randn(4, 6, generator=g)
    q8 = torch.quantize_per_channel(w, torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64),
                                    torch.tensor([0, 1, -1, 2]), 0, torch.qint8)
    for kind, want in (("norm", hashing.norm(q8.int_repr())), ("stats", hashing.stats(q8.int_repr())),
                       ("hash_tensor", hashing.hash_tensor(q8.int_repr()))):
        assert {"norm": hashing.norm, "stats": hashing.stats, "hash_tensor": hashing.hash_tensor}[kind](q8) == want
        for path in ("python", "c++"):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                with DebugMode(op_path=path) as dm, DebugMode.log_tensor_hashes(kind):
                    out = torch.empty_like(q8)
                    wrapped(q8, out)
            got = next(k for k in dm.kernels if k.kernel_name == "qcopy2").post_hashes["out_ptr0"]  # (one kind: its value)
            assert got == want, (kind, path, got, want)
    q4 = torch.quantize_per_tensor(w, 0.5, 1, torch.quint4x2)
    other = torch.quantize_per_tensor(w * 2, 1.0, 1, torch.quint4x2)  # the same integers, another scale
    assert torch.equal(q4.int_repr(), other.int_repr())
    reader = _C.CppKernel(lambda inp, out: None, _C.KernelInfo(_C.KIND_CPP, "qread", ["in_ptr0", "out_ptr0"],
                                                                  [1, 2], 0, -1))
    got = []
    for t in (q4, other):  # (torch has no copy_ for quint4x2: a kernel that reads it, hashed before it)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with DebugMode(op_path="c++") as dm, DebugMode.log_tensor_hashes(["bitwise"], hash_inputs=True):
                reader(t, torch.empty(1))
        (h,) = next(k for k in dm.kernels if k.kernel_name == "qread").pre_hashes["in_ptr0"]
        assert h == hashing.bitwise(t)
        got.append(h)
    assert got[0] != got[1]
    with torch.device("meta"):
        assert hashing.bitwise(q8) == hashing.bitwise(q8.clone())


@pytest.mark.parametrize("layout", ["coo", "csr"])
@pytest.mark.parametrize("flags", [{}, {"record_stack_trace": True}], ids=["fast", "upstream"])
def test_a_sparse_result_is_hashed_by_its_dense_values(layout, flags):
    """Note [Tensors of other layouts] (kdebug/hashing.py): an op returning a
    sparse tensor raised 'tensor layout is not strided' into the program under
    log_tensor_hashes (and so under kdebug record / hunt).  It is hashed as
    its dense values are; another value differs."""
    from kdebug import hashing

    dense = torch.tensor([[0.0, 1.5, 0.0], [2.0, 0.0, -3.0]])
    got = []
    for d in (dense, dense * 2):
        with DebugMode(**flags) as dm, DebugMode.log_tensor_hashes(["bitwise", "norm"]):
            sp = d.to_sparse() if layout == "coo" else d.to_sparse_csr()
        (call,) = [c for c in dm.operators if "to_sparse" in str(getattr(c, "op", ""))]
        bitwise, norm = call.log["hash"]
        assert bitwise == hashing.bitwise(d)  # the dense path, tested on its own
        assert float(norm) == pytest.approx(float(d.double().abs().sum()))
        assert torch.equal(sp.to_dense(), d)  # the program's value is untouched
        got.append(bitwise)
    assert got[0] != got[1]


def test_record_of_a_program_with_a_sparse_tensor_runs_it_whole(tmp_path):
    """kdebug record ran the program's sparse op into the hash path's TypeError
    and the program failed; now it runs to its end, its output unchanged."""
    import subprocess
    import sys

    script = tmp_path / "sparse.py"
    script.write_text("import torch\n"
                      "f = torch.compile(lambda x: torch.relu(x) * 2)\n"
                      "y = f(torch.arange(-4.0, 12.0).reshape(4, 4))\n"
                      "sp = (y > 1).float().to_sparse()\n"
                      "print(sp._nnz(), torch.sparse.mm(sp, y).sum().item())\n")
    plain = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    rec = subprocess.run([sys.executable, "-m", "kdebug", "record", "-o", str(tmp_path / "r.kdt"), "--",
                          str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert plain.returncode == 0 and rec.returncode == 0, rec.stderr
    assert rec.stdout.splitlines()[0] == plain.stdout.splitlines()[0]
