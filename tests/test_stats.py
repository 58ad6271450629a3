"""The stats hash (issue 15 part 5): sum, absmax and NaN/+inf/-inf counts from
the hash's pass, checked against plain torch float64 references; recorded for
real Inductor C++ kernels, kept by traces, and shown by the text report as the
size of a planted difference."""
from __future__ import annotations

import math
import re

import pytest
import torch

from kdebug import DebugMode, compare, hashing, load
from kdebug.testing import perturb_kernel_output

INF, NAN = math.inf, math.nan


def reference(t: torch.Tensor) -> dict:
    """The stats with plain torch ops in float64 / int64 (no kdebug code)."""
    t = t.detach().cpu()
    if t.dtype == torch.bool or not (t.is_floating_point() or t.is_complex()):
        x = t.to(torch.int64)
        return {"l1": float(x.to(torch.float32).double().abs().sum()), "sum": float(x.sum()),
                "absmax": float(x.abs().max()) if x.numel() else 0.0, "nan": 0, "posinf": 0, "neginf": 0}
    if t.is_complex():
        z = torch.view_as_real(t).double()  # [..., 2]
        bad_nan = torch.isnan(z).any(-1)
        bad_inf = torch.isinf(z).any(-1) & ~bad_nan
        fin = ~(bad_nan | bad_inf)
        parts = z[fin]
        return {"l1": float(torch.linalg.vector_norm(parts, dim=-1).sum()), "sum": float(parts.sum()),
                "absmax": float(parts.abs().max()) if parts.numel() else 0.0,
                "nan": int(bad_nan.sum()), "posinf": int(bad_inf.sum()), "neginf": 0}
    x = t.double()
    fin = x[torch.isfinite(x)]
    return {"l1": float(fin.abs().sum()), "sum": float(fin.sum()),
            "absmax": float(fin.abs().max()) if fin.numel() else 0.0,
            "nan": int(torch.isnan(x).sum()), "posinf": int((x == INF).sum()), "neginf": int((x == -INF).sum())}


def check(s: hashing.Stats, t: torch.Tensor):
    ref = reference(t)
    assert isinstance(s, hashing.Stats)
    for k in ("nan", "posinf", "neginf"):
        assert getattr(s, k) == ref[k], (k, s, ref)
    assert s.absmax == ref["absmax"], (s, ref)  # a max is exact
    scale = max(ref["l1"], 1.0)
    assert abs(s.sum - ref["sum"]) <= 1e-12 * scale, (s, ref)  # order of float64 additions only
    assert abs(s.l1 - ref["l1"]) <= 1e-12 * scale, (s, ref)


def _values(dtype, shape=(37, 53), seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * 50
    if dtype == torch.bool:
        return x > 0
    if dtype.is_complex:
        return torch.complex(x, -x * 0.25).to(dtype)
    return x.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16,
                                   torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64,
                                   torch.bool, torch.complex64, torch.complex128])
def test_stats_match_a_float64_reference(dtype):
    t = _values(dtype)
    check(hashing.stats(t), t)
    check(hashing.stats(t.t()), t.t())           # transposed: the gathered walk
    check(hashing.stats(t[::3, 1::2]), t[::3, 1::2])  # strided slice
    check(hashing.stats(t[:, 5]), t[:, 5])       # one strided column


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_nan_and_inf_are_counted_and_left_out_of_sum_and_absmax(dtype):
    t = _values(dtype, (8, 9))
    t[0, 0], t[1, 3], t[2, 2], t[7, 8], t[5, 1] = NAN, INF, -INF, NAN, -INF
    s = hashing.stats(t)
    assert (s.nan, s.posinf, s.neginf) == (2, 1, 2)
    assert math.isfinite(s.sum) and math.isfinite(s.absmax)
    check(s, t)
    check(hashing.stats(t.t()), t.t())


def test_complex_nan_and_inf_count_per_element():
    z = torch.tensor([1 + 2j, complex(NAN, 1), complex(3, INF), -4 - 0.5j], dtype=torch.complex64)
    s = hashing.stats(z)
    assert (s.nan, s.posinf, s.neginf) == (1, 1, 0)
    assert s.sum == 1 + 2 - 4 - 0.5 and s.absmax == 4.0
    check(s, z)


def test_integer_extremes_are_exact():
    t = torch.tensor([-(2 ** 62), 5, -7, 2 ** 40], dtype=torch.int64)
    s = hashing.stats(t)
    assert s.absmax == float(2 ** 62) and s.sum == float(-(2 ** 62) + 5 - 7 + 2 ** 40)
    b = torch.tensor([True, False, True, True])
    assert (hashing.stats(b).sum, hashing.stats(b).absmax) == (3.0, 1.0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int32, torch.bfloat16])
def test_empty_tensors(dtype):
    for t in (torch.empty(0, dtype=dtype), torch.empty(3, 0, dtype=dtype).t()):
        s = hashing.stats(t)
        assert s == hashing.Stats(0.0, 0.0, 0.0, 0, 0, 0)
        check(s, t)


def test_stats_equality_is_nan_safe_and_immutable():
    a = hashing.Stats(1.0, NAN, 2.0, 1, 0, 0)
    assert a == hashing.Stats(1.0, NAN, 2.0, 1, 0, 0) and hash(a) == hash(hashing.Stats(1.0, NAN, 2.0, 1, 0, 0))
    assert a != hashing.Stats(1.0, NAN, 2.0, 2, 0, 0)
    assert a != hashing.Stats(1.0, 0.5, 2.0, 1, 0, 0)
    with pytest.raises(AttributeError):
        a.sum = 0.0
    t = _values(torch.float32)
    assert hashing.stats(t) == hashing.stats(t.clone())


def test_stats_and_hash_tensor_together_are_refused():
    with pytest.raises(ValueError, match="stats.*hash_tensor"):
        hashing.parse(["bitwise", "stats", "hash_tensor"])


# ---------------------------------------------------------------- recorded kernels


@pytest.fixture(scope="module")
def chain():
    """a = K1(x); b = K2(a); c = K3(x); d = K4(b, c), compiled by Inductor."""
    k1 = torch.compile(lambda x: torch.sin(x) * 2)
    k2 = torch.compile(lambda a: torch.cos(a) + 1)
    k3 = torch.compile(lambda x: torch.exp(x) * 3)
    k4 = torch.compile(lambda b, c: b * c - 1)
    x = torch.randn(64, 32, generator=torch.Generator().manual_seed(1))

    def program():
        a = k1(x)
        return a, k4(k2(a), k3(x))

    program()
    return program, x


def record(program, **kw):
    with DebugMode(**kw) as dm:
        with DebugMode.log_tensor_hashes(hash_fn=["bitwise", "stats"], hash_inputs=True):
            out = program()
    return dm, out


def test_recorded_kernel_stats_match_the_reference(chain):
    program, x = chain
    dm, (a, d) = record(program)
    k1 = dm.kernels[0]
    bw, s = k1.post_hashes["out_ptr0"]
    check(s, a)
    assert bw == hashing.bitwise(a)
    bw_in, s_in = k1.pre_hashes["in_ptr0"]
    check(s_in, x)
    check(dm.kernels[-1].post_hashes["out_ptr0"][1], d)


def test_trace_round_trip_keeps_the_stats(chain, tmp_path):
    program, _ = chain
    path = str(tmp_path / "run.kdt")
    dm, _ = record(program, trace=path)
    run = load(path)
    assert len(run.kernels) == len(dm.kernels) == 4
    for k_mem, k_file in zip(dm.kernels, run.kernels):
        assert k_file.post_hashes == k_mem.post_hashes
        assert k_file.pre_hashes == k_mem.pre_hashes
        assert all(isinstance(v[1], hashing.Stats) for v in k_file.post_hashes.values())


def test_trace_round_trip_of_aten_op_stats(tmp_path):
    path = str(tmp_path / "ops.kdt")
    x = torch.tensor([[1.0, -3.0, NAN], [INF, 2.5, -0.5]])
    with DebugMode(trace=path) as dm:
        with DebugMode.log_tensor_hashes(hash_fn="stats"):
            y = torch.mm(x.t(), x)
    run = load(path)
    mem = [op.log["hash"] for op in dm.operators if getattr(op, "log", None) and "hash" in op.log]
    disk = [op.log["hash"] for op in run.operators if getattr(op, "log", None) and "hash" in op.log]
    assert mem and disk == mem
    assert isinstance(mem[-1], hashing.Stats)
    check(mem[-1], y)


def test_text_report_shows_the_planted_amount(chain):
    program, _ = chain
    base, _ = record(program)
    k1 = base.kernels[0].kernel_name
    with perturb_kernel_output(k1, "out_ptr0", value=0.25) as hit:
        bad, _ = record(program)
    assert hit["hits"] == 1
    text = str(compare(base, bad))
    m = re.search(r"sum differs by ([-+0-9.e]+) \(", text)
    assert m, text
    assert abs(float(m.group(1)) - 0.25) <= 1e-6, text
    assert "absmax" in text


def test_html_report_shows_the_magnitude(chain, tmp_path):
    import json

    from kdebug import report

    program, _ = chain
    base, _ = record(program, trace=str(tmp_path / "a.kdt"))
    k1 = base.kernels[0].kernel_name
    with perturb_kernel_output(k1, "out_ptr0", value=0.25):
        record(program, trace=str(tmp_path / "b.kdt"))
    out = tmp_path / "r.html"
    report.write_html(str(out), [str(tmp_path / "a.kdt"), str(tmp_path / "b.kdt")])
    page = out.read_text()
    meta = json.loads(re.search(r'<script id="kd-meta" type="application/json">(.*?)</script>', page, re.S)[1])
    mag = meta["comparisons"][0]["divergence"]["magnitude"]
    m = re.search(r"sum differs by ([-+0-9.e]+) \(", mag)
    assert m and abs(float(m.group(1)) - 0.25) <= 1e-6, mag
    assert "bytes" in page and "arguments whose hashes differ" in page  # the spread keeps its label
