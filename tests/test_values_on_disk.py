"""record_outputs(filter=..., to=...): chosen launches' outputs streamed to a
values file and read back (Note [Recorded values on disk], kdebug/values.py),
on real Inductor C++ kernels."""
from __future__ import annotations

import json
import os
import re
import struct
import warnings

import pytest
import torch

import kdebug
from kdebug import DebugMode, KdebugWarning, TraceFileError
from kdebug import hashing
from kdebug import values as kv
from kdebug._files import LinkRefused


def _two_graphs(x):
    y = torch.sin(x) + 1
    torch._dynamo.graph_break()
    return torch.cos(y) * 2


@pytest.fixture(scope="module")
def two_graphs():
    x = torch.randn(32)
    x[3] = float("nan")  # so that bitwise comparisons see NaN payloads too
    x[5] = float("inf")
    fn = torch.compile(_two_graphs)
    fn(x)
    return fn, x


CALLS = 3  # two kernels per call: launches 0..5


def _record(tmp_path, fn, x, **kw):
    trace = str(tmp_path / "run.kdt")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with DebugMode(trace=trace) as dm, DebugMode.record_outputs(to=dm, **kw):
            for _ in range(CALLS):
                fn(x)
    msgs = [str(w.message) for w in caught if issubclass(w.category, KdebugWarning)]
    return trace, dm, msgs


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().reshape(-1).view({1: torch.uint8, 2: torch.int16, 4: torch.int32,
                                            8: torch.int64}[t.element_size()])


def _same_bits(a: dict, b: dict) -> bool:
    return set(a) == set(b) and all(a[k].shape == b[k].shape and a[k].dtype == b[k].dtype
                                    and torch.equal(_bits(a[k]), _bits(b[k])) for k in a)


def test_filter_by_pattern_records_exactly_the_matching_launches(tmp_path, two_graphs):
    fn, x = two_graphs
    trace, dm, msgs = _record(tmp_path, fn, x, filter="cos")
    names = {k.launch_index: k.kernel_name for k in dm.kernels}
    assert sorted(names) == list(range(2 * CALLS))
    want = [i for i, n in names.items() if "cos" in n]
    assert len(want) == CALLS  # one of the two kernels, each call
    run = kdebug.load(trace)
    assert kv.open(trace + ".values").launches() == want
    for i, name in names.items():
        v = run.values(i)
        if i in want:
            assert set(v) and all(isinstance(t, torch.Tensor) and t.shape == x.shape for t in v.values())
        else:
            assert v is None
    assert not msgs
    # streamed outputs were released from memory
    assert not dm._recorder.outputs
    # and writing them added nothing to the recording: the same records as without record_outputs
    with DebugMode() as plain:
        for _ in range(CALLS):
            fn(x)
    assert [type(op).__name__ for op in dm.operators] == [type(op).__name__ for op in plain.operators]
    assert dm.debug_string() == plain.debug_string()


def test_outputs_are_written_while_the_run_goes_on(tmp_path, two_graphs):
    fn, x = two_graphs
    path = str(tmp_path / "run.kdt.values")
    on_disk = {}

    def every_launch(name, i):  # asked as launch i ends: what the file holds by then
        on_disk[i] = kv.open(path, partial=True).launches()
        return True

    _record(tmp_path, fn, x, filter=every_launch)
    assert on_disk == {i: list(range(i)) for i in range(2 * CALLS)}


def test_filter_by_launch_range_and_by_callable(tmp_path, two_graphs):
    fn, x = two_graphs
    trace, dm, _ = _record(tmp_path, fn, x, filter=range(2, 5))
    assert kv.open(trace + ".values").launches() == [2, 3, 4]
    names = {k.launch_index: k.kernel_name for k in dm.kernels}
    os.unlink(trace + ".values")
    trace, dm, _ = _record(tmp_path, fn, x, filter=lambda name, i: i % 2 == 1 and "sin" not in name)
    names = {k.launch_index: k.kernel_name for k in dm.kernels}
    want = [i for i, n in names.items() if i % 2 == 1 and "sin" not in n]
    assert want and kv.open(trace + ".values").launches() == want


def test_values_round_trip_bitwise_against_in_memory_clones(tmp_path, two_graphs):
    fn, x = two_graphs
    with DebugMode() as mem, DebugMode.record_outputs():  # upstream-style: every clone in memory
        for _ in range(CALLS):
            fn(x)
    clones = {k.launch_index: k.record["output"] for k in mem.kernels}
    assert len(clones) == 2 * CALLS
    assert any(torch.isnan(t).any() for c in clones.values() for t in c.values())
    trace, dm, _ = _record(tmp_path, fn, x, filter=".")  # every kernel, to disk
    run = kdebug.load(trace)
    v = kv.open(trace + ".values")
    for i, c in clones.items():
        got = run.values(i)
        assert _same_bits(got, c), i
        # one tensor read alone (the accuracy check's spill reads buffer by buffer) is the same
        assert all(_same_bits({a: v.value(i, a)}, {a: t}) for a, t in c.items()), i
    with pytest.raises(KeyError, match="no recorded value"):
        v.value(0, "no_such_arg")
    # a filter without a destination keeps matching clones in memory only
    with DebugMode() as dm2, DebugMode.record_outputs(filter=range(1, 3)):
        for _ in range(CALLS):
            fn(x)
    kept = {k.launch_index: k.record for k in dm2.kernels}
    assert [i for i, r in kept.items() if r is not None] == [1, 2]
    assert all(_same_bits(kept[i]["output"], clones[i]) for i in (1, 2))


def test_budget_exceeded_is_counted_reported_and_refused_on_read(tmp_path, two_graphs):
    fn, x = two_graphs
    per_launch = x.numel() * x.element_size()  # each kernel writes one tensor like x
    trace, dm, msgs = _record(tmp_path, fn, x, filter=".", max_bytes=2 * per_launch + per_launch // 2)
    v = kv.open(trace + ".values")
    assert v.launches() == [0, 1]
    assert sorted(v.skipped) == [2, 3, 4, 5]
    assert v.summary["outputs_over_budget"] == 4 and v.summary["launches_skipped"] == 4
    assert v.summary["bytes"] == 2 * per_launch
    assert dm.kernel_stats["outputs_skipped"] == 4
    assert any(re.search(r"4 output\(s\) of 4 matching launch\(es\) were over the byte budget", m) for m in msgs)
    with pytest.raises(kv.ValuesNotRecorded, match="launch 3 .*max_bytes"):
        kdebug.load(trace).values(3)
    assert any("lost their outputs" in p for p in v.problems())


def _good_file(tmp_path, two_graphs) -> str:
    fn, x = two_graphs
    trace, _, _ = _record(tmp_path, fn, x, filter=range(0, 2))
    return trace + ".values"


def _rewrite(path: str, data: bytes) -> None:
    os.unlink(path)
    with open(path, "wb") as f:
        f.write(data)


def test_hostile_and_truncated_values_files_raise_trace_file_error(tmp_path, two_graphs):
    path = _good_file(tmp_path, two_graphs)
    good = open(path, "rb").read()
    assert kv.open(path).launches() == [0, 1]
    first_entry = 16
    (jlen,) = struct.unpack_from("<I", good, first_entry + 4)
    payload_at = first_entry + 8 + jlen
    cases = {
        "bad magic": b"NOTKDVAL" + good[8:],
        "newer version": good[:8] + struct.pack("<I", 99) + good[12:],
        "too short": good[:10],
        "truncated payload": good[:payload_at + 5],
        "truncated description": good[:first_entry + 8 + jlen // 2],
        "huge description": good[:first_entry + 4] + struct.pack("<I", 1 << 30) + good[first_entry + 8:],
        "not json": good[:first_entry + 8] + b"{" * jlen + good[payload_at:],
        "bad tag": good[:first_entry] + b"XXXX" + good[first_entry + 4:],
    }
    head = good[first_entry + 8:payload_at].decode()
    for name, repl in {"negative size": ('"shape":[32]', '"shape":[-32]'),
                       "size mismatch": ('"shape":[32]', '"shape":[33]'),
                       "unknown dtype": ('"float32"', '"floatXX"'),
                       "unknown kind": ('"k":"tensor"', '"k":"tensoX"')}.items():
        new = head.replace(*repl)
        assert new != head
        cases[name] = (good[:first_entry + 4] + struct.pack("<I", len(new)) + new.encode() + good[payload_at:])
    for name, data in cases.items():
        _rewrite(path, data)
        with pytest.raises(TraceFileError, match="byte"):
            kv.open(path)
    # a flipped payload byte: found by the crc32 when the launch is read
    _rewrite(path, good[:payload_at] + bytes([good[payload_at] ^ 0xFF]) + good[payload_at + 1:])
    with pytest.raises(TraceFileError, match="crc32"):
        kv.open(path).values(0)
    # truncated inside launch 1's bytes: partial=True reads the complete entries before the cut
    starts, at = [], 16
    while at < len(good):
        (n,) = struct.unpack_from("<I", good, at + 4)
        starts.append(at)
        at += 8 + n + json.loads(good[at + 8:at + 8 + n]).get("nbytes", 0)
    assert at == len(good) and len(starts) == 3  # launch 0, launch 1, the summary
    _rewrite(path, good[:starts[2] - 7])
    with pytest.raises(TraceFileError, match="partial=True"):
        kv.open(path)
    part = kv.open(path, partial=True)
    assert part.launches() == [0] and part.truncated_at is not None and part.problems()


def test_symlinked_destination_is_refused(tmp_path, two_graphs):
    fn, x = two_graphs
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep me")
    trace = str(tmp_path / "run.kdt")
    os.symlink(victim, trace + ".values")
    with pytest.raises(LinkRefused):
        with DebugMode(trace=trace) as dm, DebugMode.record_outputs(filter=".", to=dm):
            fn(x)
    assert victim.read_bytes() == b"keep me"
    real = tmp_path / "real"
    real.mkdir()
    os.symlink(real, tmp_path / "linkdir")
    with pytest.raises(LinkRefused):
        with DebugMode() as dm, DebugMode.record_outputs(filter=".", to=tmp_path / "linkdir"):
            fn(x)
    assert not os.listdir(real)
    # a plain directory works, and the values file is read from it
    with DebugMode() as dm, DebugMode.record_outputs(filter=range(0, 1), to=real):
        fn(x)
    assert kv.open(real).launches() == [0]


def test_bad_filters_fail_early_and_a_raising_filter_is_counted(tmp_path, two_graphs):
    fn, x = two_graphs
    with pytest.raises(ValueError, match="not a regular expression"):
        DebugMode.record_outputs(filter="(")
    with pytest.raises(TypeError, match="range of launch indices"):
        DebugMode.record_outputs(filter=3)

    def boom(name, i):
        raise RuntimeError("filter bug")

    plain = fn(x)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with DebugMode() as dm, DebugMode.record_outputs(filter=boom):
            out = fn(x)
        assert torch.equal(_bits(out), _bits(plain))  # the program ran unchanged
        stats = dm.kernel_stats
    assert stats["errors"] == 2 and "filter bug" in stats["error_messages"][0]
    assert all(k.record is None for k in dm.kernels)
    assert any("filter bug" in str(w.message) for w in caught)


def test_aten_ops_only_when_the_filter_says_so():
    x = torch.randn(8)
    with DebugMode() as dm, DebugMode.record_outputs(filter="mul", aten=True):
        a = x * 2
        b = x + 1
    recs = {c.op.__name__ if hasattr(c.op, "__name__") else str(c.op): c.record
            for c in dm.operators if hasattr(c, "record")}
    mul = [r for n, r in recs.items() if "mul" in n]
    add = [r for n, r in recs.items() if "add" in n]
    assert mul and all(r is not None and torch.equal(r["output"], a) for r in mul)
    assert add and all(r is None for r in add)
    with DebugMode() as dm, DebugMode.record_outputs(filter="mul"):  # aten=False by default with a filter
        x * 2
    assert all(getattr(c, "record", None) is None for c in dm.operators)
    del b


def _other(x):
    return torch.tanh(x) - 3


def test_values_read_against_the_wrong_trace_or_without_a_file(tmp_path, two_graphs):
    fn, x = two_graphs
    trace, _, _ = _record(tmp_path, fn, x, filter=range(0, 1))
    assert kdebug.load(trace).values(0)
    other = str(tmp_path / "other.kdt")
    g = torch.compile(_other)
    g(x)
    with DebugMode(trace=other):
        g(x)
    with pytest.raises(FileNotFoundError, match="record_outputs"):
        kdebug.load(other).values(0)
    with pytest.raises(TraceFileError, match="different runs"):
        kdebug.load(other).values(0, path=trace + ".values")


def test_values_match_the_bitwise_hashes_taken_at_launch_time(tmp_path, two_graphs):
    fn, x = two_graphs
    trace = str(tmp_path / "run.kdt")
    with DebugMode(trace=trace) as dm, DebugMode.log_tensor_hashes("bitwise"), \
            DebugMode.record_outputs(filter=".", to=dm):
        for _ in range(CALLS):
            fn(x)
    run = kdebug.load(trace)
    for k in dm.kernels:
        got = run.values(k.launch_index)
        assert got and set(got) == set(k.post_hashes)
        assert all(hashing.bitwise(t) == k.post_hashes[a] for a, t in got.items())


def test_a_debug_mode_entered_again_appends_to_its_values_file(tmp_path, two_graphs):
    fn, x = two_graphs
    trace = str(tmp_path / "run.kdt")
    dm = DebugMode(trace=trace)
    for _ in range(2):
        with dm, DebugMode.record_outputs(filter="cos", to=dm):
            fn(x)
    want = [k.launch_index for k in dm.kernels if "cos" in k.kernel_name]
    assert len(want) == 2
    v = kv.open(trace + ".values")
    assert v.launches() == want and v.summary["launches"] == 2
    run = kdebug.load(trace)
    assert [k.launch_index for k in run.kernels if "cos" in k.kernel_name] == want
    assert all(run.values(i) for i in want)


def test_mutated_values_files_give_trace_file_error_or_values_never_a_traceback(tmp_path, two_graphs):
    import random

    path = _good_file(tmp_path, two_graphs)
    good = open(path, "rb").read()
    rng = random.Random(18)
    outcomes = {"read": 0, "refused": 0}
    for _ in range(400):
        data = bytearray(good)
        for _ in range(rng.randint(1, 4)):
            at = rng.randrange(len(data))
            op = rng.random()
            if op < 0.6:
                data[at] = rng.randrange(256)
            elif op < 0.8:
                del data[at:at + rng.randint(1, 16)]
            else:
                data[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
        _rewrite(path, bytes(data))
        try:
            v = kv.open(path)
            for i in range(4):
                got = v.values(i)
                assert got is None or all(isinstance(t, torch.Tensor) for t in got.values())
            outcomes["read"] += 1
        except (TraceFileError, kv.ValuesNotRecorded):
            outcomes["refused"] += 1
    assert outcomes["refused"] > 0 and sum(outcomes.values()) == 400


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64, torch.int64, torch.bool,
                                   torch.complex64, torch.uint8, torch.float8_e4m3fn])
def test_every_dtype_and_layout_round_trips(tmp_path, dtype):
    g = torch.Generator().manual_seed(0)
    high = 2 if dtype is torch.bool else 256  # a bool's byte is 0 or 1
    src = torch.randint(0, high, (6, 5 * dtype.itemsize), dtype=torch.uint8, generator=g)
    t = src.view(dtype).t()  # non-contiguous: written in logical order
    w = kv.Writer(str(tmp_path / "v.values"))
    w.tensor(7, "k", "out_ptr0", t)
    w.tensor(7, "k", "empty", torch.empty(0, 3, dtype=dtype))
    w.tensor(7, "k", "scalar", t[0, 0].clone())
    w.close()
    got = kv.open(tmp_path / "v.values").values(7)
    assert got["out_ptr0"].shape == t.shape and got["out_ptr0"].dtype == dtype
    assert torch.equal(got["out_ptr0"].contiguous().view(torch.uint8), t.contiguous().view(torch.uint8))
    assert got["empty"].shape == (0, 3) and got["scalar"].shape == ()
    assert torch.equal(got["scalar"].reshape(1).view(torch.uint8), t[0, 0].reshape(1).view(torch.uint8))
