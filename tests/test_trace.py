"""Trace files (issue 4): save / load across processes, streaming that survives
a killed process, corrupt / truncated / foreign files, a fuzzed reader, and
upstream's check_hash_mismatches on loaded logs.  Real Inductor C++ kernels."""
from __future__ import annotations

import importlib
import os
import random
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch

import kdebug
from kdebug import DebugMode, TraceFileError
from kdebug.testing import perturb_kernel_output
from tracebytes import mutate_bytes


@pytest.fixture(scope="module")
def program():
    k1 = torch.compile(lambda x: torch.sin(x) * 2)
    k2 = torch.compile(lambda a: torch.cos(a).sum(0) + 1)
    x = torch.randn(64, 32)

    def run():
        return k2(k1(x) + 1)

    run()
    return run


def record(program, hash_fn=("bitwise",)):
    with DebugMode() as dm, DebugMode.log_tensor_hashes(hash_fn=list(hash_fn), hash_inputs=True):
        program()
    dm.operators  # noqa: B018
    return dm


def _py(code: str, *args: str, check=True) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], capture_output=True, text=True,
                          check=check, timeout=300)


def test_save_load_in_another_process(program, tmp_path):
    dm = record(program, ("bitwise", "norm"))
    path = tmp_path / "run.kdt"
    stats = dm.save(path)
    assert stats["records"] == len(dm.operators) and stats["tensor_args"] > 0
    out = _py("""
        import sys, kdebug
        run = kdebug.load(sys.argv[1])
        print(run.debug_string(), end="")
    """, str(path)).stdout
    assert out == dm.debug_string()
    assert "[cpp] cpp_fused_" in out and "post-kernel hashes" in out
    run = kdebug.load(path)
    assert run.complete and len(run) == len(dm.operators)
    k_live, k_loaded = dm.kernels, run.kernels
    assert [k.kernel_name for k in k_live] == [k.kernel_name for k in k_loaded]
    for a, b in zip(k_live, k_loaded):
        assert a.post_hashes == b.post_hashes and a.pre_hashes == b.pre_hashes and a.roles == b.roles
        assert a.tensor_info == b.tensor_info
    assert kdebug.compare(dm, str(path)).ok


def test_rewriting_a_loaded_trace_keeps_the_run_readable(tmp_path):
    """load() maps the file: kdebug's writers must replace it, not truncate it
    under the mapping (SIGBUS).  In a subprocess, so a crash fails the test."""
    p = _py("""
        import sys, torch, kdebug
        from kdebug import DebugMode
        f = torch.compile(lambda x: torch.sin(x) * 2)
        path = sys.argv[1]
        with DebugMode() as dm, DebugMode.log_tensor_hashes("bitwise"):
            f(torch.randn(4096))
        dm.save(path)
        old = kdebug.load(path)
        with DebugMode(trace=path):          # a new recording streamed to the same path
            torch.compile(lambda x: x + 1)(torch.randn(3))
        dm.save(path)                        # and a save over it
        print(len(old.operators), old.kernels[0].kernel_name, len(kdebug.load(path)))
    """, str(tmp_path / "run.kdt"), check=False)
    assert p.returncode == 0, p.stderr[-3000:]
    n_old, name, n_new = p.stdout.split()
    assert name.startswith("cpp_fused_") and int(n_old) == int(n_new) > 0


def test_trace_bytes_per_tensor_argument(program, tmp_path):
    dm = record(program)
    s = dm.save(tmp_path / "run.kdt")
    # the budget: < 64 bytes per tensor argument (bitwise pre + post hashes here)
    assert s["launch_bytes"] / s["tensor_args"] < 64, s


def test_diff_of_two_processes_names_the_planted_kernel(program, tmp_path):
    base = record(program)
    k1 = base.kernels[0].kernel_name
    with perturb_kernel_output(k1, "out_ptr0"):
        bad = record(program)
    base.save(tmp_path / "a.kdt")
    bad.save(tmp_path / "b.kdt")
    p = subprocess.run([sys.executable, "-m", "kdebug", "diff", str(tmp_path / "a.kdt"), str(tmp_path / "b.kdt")],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 1, p.stderr
    assert f"FIRST DIVERGENCE: kernel #0 {k1}" in p.stdout and "non-deterministic" in p.stdout
    same = subprocess.run([sys.executable, "-m", "kdebug", "diff", str(tmp_path / "a.kdt"), str(tmp_path / "a.kdt")],
                          capture_output=True, text=True, timeout=300)
    assert same.returncode == 0 and "have matching inputs and outputs" in same.stdout


def test_stream_survives_a_killed_process(tmp_path):
    path = tmp_path / "killed.kdt"
    p = _py("""
        import os, signal, sys, torch, kdebug
        f = torch.compile(lambda x: (x.sin() * 3).sum(0))
        x = torch.randn(16, 8)
        f(x)
        with kdebug.DebugMode(trace=sys.argv[1]) as dm, kdebug.DebugMode.log_tensor_hashes("bitwise"):
            dm._stream.interval = 0.0  # write after every op
            for i in range(5):
                f(x + i)
            os.kill(os.getpid(), signal.SIGKILL)
    """, str(path), check=False)
    assert p.returncode == -9
    with pytest.warns(kdebug.KdebugWarning, match="did not finish"):
        run = kdebug.load(path)
    assert not run.complete
    # the launches of every call before the kill whose op came after them
    assert len(run.kernels) >= 4
    assert all(k.post_hashes for k in run.kernels)
    assert run.debug_string().startswith("# kdebug: INCOMPLETE:")


def test_truncated_file_reads_its_complete_chunks(program, tmp_path):
    dm = record(program)
    dm.save(tmp_path / "full.kdt")
    data = (tmp_path / "full.kdt").read_bytes()
    full = kdebug.load(tmp_path / "full.kdt")
    seen = 0
    for cut in range(33, len(data), 7):
        (tmp_path / "cut.kdt").write_bytes(data[:cut])
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            run = kdebug.load(tmp_path / "cut.kdt")
        assert len(run) <= len(full) and not run.complete
        assert any("did not finish" in str(x.message) or "incomplete chunk" in str(x.message) for x in w)
        assert run.debug_string() is not None
        seen = max(seen, len(run))
    assert seen == len(full)


def test_corrupt_foreign_and_newer_files_name_the_offset(program, tmp_path):
    dm = record(program)
    path = tmp_path / "run.kdt"
    dm.save(path)
    data = bytearray(path.read_bytes())
    bad = bytearray(data)
    bad[len(bad) // 2] ^= 0x10
    (tmp_path / "bad.kdt").write_bytes(bad)
    with pytest.raises(TraceFileError, match=r"byte \d+: corrupt") as e:
        kdebug.load(tmp_path / "bad.kdt")
    assert 32 <= e.value.offset < len(data)
    (tmp_path / "foreign.kdt").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 64)
    with pytest.raises(TraceFileError, match="byte 0: not a kdebug trace"):
        kdebug.load(tmp_path / "foreign.kdt")
    newer = bytearray(data)
    newer[8] = 99
    (tmp_path / "newer.kdt").write_bytes(newer)
    with pytest.raises(TraceFileError, match="byte 8: .*newer"):
        kdebug.load(tmp_path / "newer.kdt")
    (tmp_path / "empty.kdt").write_bytes(b"")
    with pytest.raises(TraceFileError, match="byte 0"):
        kdebug.load(tmp_path / "empty.kdt")
    with pytest.raises(TraceFileError, match="cannot read"):
        kdebug.load(tmp_path / "missing.kdt")
    p = subprocess.run([sys.executable, "-m", "kdebug", "show", str(tmp_path / "bad.kdt")], capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 2 and "corrupt" in p.stderr


def test_fuzzed_files_never_crash_the_reader(program, tmp_path):
    dm = record(program, ("bitwise", "norm"))
    data = kdebug.trace.save(dm, None)
    rng = random.Random(4)
    errors = ok = 0
    for _ in range(1500):
        b = mutate_bytes(rng, data)  # some cut short, as by a process that died: read up to the cut
        try:
            run = kdebug.trace.Run(b)
        except TraceFileError as e:
            assert e.offset <= len(b)
            errors += 1
            continue
        ok += 1
        run.debug_string()
        kdebug.compare(run, kdebug.trace.Run(data))
    assert errors > 1000 and ok > 0


def test_check_hash_mismatches_on_loaded_logs(program, tmp_path):
    base = record(program)
    base.save(tmp_path / "a.kdt")
    loaded = kdebug.load(tmp_path / "a.kdt")
    upstream = torch.utils._debug_mode.DebugMode
    assert upstream.check_hash_mismatches(base.logs, loaded.logs, compare_inputs=True) == []
    k1 = base.kernels[0].kernel_name
    with perturb_kernel_output(k1, "out_ptr0"):
        bad = record(program)
    bad.save(tmp_path / "b.kdt")
    other = kdebug.load(tmp_path / "b.kdt")
    # upstream's own check sees the aten ops downstream of the fault...
    ops = upstream.check_hash_mismatches(loaded.logs, other.logs, compare_inputs=True)
    assert ops and all(m["call_type"] == "torch op" for m in ops)
    # ...and kdebug's extension names the C++ kernels too, first the faulty one
    allm = DebugMode.check_hash_mismatches(loaded.logs, other.logs, compare_inputs=True)
    kern = [m for m in allm if m["call_type"] == "cpp kernel"]
    assert kern[0]["call"] == k1 and kern[0]["arg_name"] == "out_ptr0" and not kern[0]["is_input_hash"]
    assert len(allm) == len(ops) + len(kern)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_never_writes_the_parents_trace(tmp_path):
    """Note [Forked children] (kdebug/trace.py): a process forked while a
    recording streams its trace (a DataLoader worker) inherits the stream and
    its file; its own ops, streamed, went into the parent's file and the
    trace could no longer be read.  The child's stream writes nothing."""
    import kdebug

    path = tmp_path / "run.kdt"
    x = torch.ones(8)
    with DebugMode(trace=str(path)) as dm, DebugMode.log_tensor_hashes(hash_fn="bitwise"):
        y = x + 1
        pid = os.fork()
        if pid == 0:  # the child: ops of its own, and a stream write as its interval would make
            try:
                for _ in range(50):
                    y = y * 2
                dm._stream.write_new()
                dm._stream.close()
            finally:
                os._exit(0)
        os.waitpid(pid, 0)
        z = y - 3
    run = kdebug.load(str(path))
    names = [c._name for c in (run.call(i) for i in range(len(run)))]
    assert names == ["aten::add.Tensor", "aten::sub.Tensor"], names
    assert torch.equal(z, x - 2)


@pytest.fixture(scope="module")
def str_op():
    """A custom op taking a str, which upstream's mode renders with str()."""
    lib = torch.library.Library("kdtest_nul", "DEF")
    lib.define("f(Tensor x, str s) -> Tensor")
    lib.impl("f", lambda x, s: x + len(s), "CompositeExplicitAutograd")
    yield torch.ops.kdtest_nul.f
    lib._destroy()


def test_an_op_text_holding_a_nul_is_kept_and_compares_as_recorded(str_op, tmp_path):
    """The trace's string table takes no NUL: such an op's text was written
    as '' (the line vanished from the loaded run, and the op compared as
    another). It is stored with the NUL as the two characters \\0, and a live
    run and its trace digest the same text."""
    x = torch.randn(3)

    def record(s):
        with DebugMode() as dm, DebugMode.log_tensor_hashes():
            str_op(x, s)
            str_op(x, "a<b>")
        return dm

    dm = record("a\x00b")
    path = tmp_path / "nul.kdt"
    dm.save(path)
    run = kdebug.load(path)
    lines = run.debug_string().splitlines()
    assert len(lines) == 2 and "a\\0b" in lines[0] and "a<b>" in lines[1], lines
    assert kdebug.compare(dm, run).ok
    assert kdebug.compare(dm, str(path)).ok
    # another string at that place is another op: named, live against the trace
    other = record("a\x00c")
    rep = kdebug.compare(other, run)
    assert not rep.ok
    text = importlib.import_module("kdebug.compare").format_report(rep)
    assert "a\\0c" in text and "a\\0b" in text and "\x00" not in text, text


def test_the_trace_writer_refuses_a_nul_rather_than_losing_the_text():
    w = kdebug._C.TraceWriter()
    with pytest.raises(ValueError, match="NUL"):
        w.op(depth=0, flags=0, name="kdtest::f", text="f(a\x00b)", input_hashes=None, output_hashes=None)
    with pytest.raises(ValueError, match="NUL"):
        w.op(depth=0, flags=0, name="kd\x00f", text="f()", input_hashes=None, output_hashes=None)
    w.op(depth=0, flags=0, name="", text="", input_hashes=None, output_hashes=None)  # empty is a string


def test_a_stream_that_cannot_write_stops_with_a_warning_and_keeps_the_records(tmp_path, monkeypatch):
    """A full disk (or any writer error) while streaming DebugMode(trace=...)
    used to raise out of whichever aten op made the stream tick, and at the
    mode's exit: the program died. Streaming now stops with one warning; the
    recording keeps every record, which save() writes elsewhere."""
    from kdebug import trace as trace_mod
    from kdebug.inductor import KdebugWarning

    x = torch.randn(8)
    real = trace_mod.Writer._flush_out
    calls = {"n": 0}

    def full_disk(self):
        calls["n"] += 1
        if calls["n"] > 2:  # the header and the first chunk went out
            raise OSError(28, "No space left on device")
        return real(self)

    monkeypatch.setattr(trace_mod.Writer, "_flush_out", full_disk)
    with pytest.warns(KdebugWarning, match="streaming the trace to .* failed") as caught:
        with DebugMode(trace=str(tmp_path / "stream.kdt")) as dm:
            dm._stream.interval = 0.0  # a tick at every op
            for _ in range(20):
                x = torch.sin(x) + 1
    assert sum("streaming the trace" in str(w.message) for w in caught) == 1
    assert dm._stream.failed is not None and dm._stream.closed
    monkeypatch.setattr(trace_mod.Writer, "_flush_out", real)
    dm.save(tmp_path / "saved.kdt")
    run = kdebug.load(tmp_path / "saved.kdt")
    assert len(run.operators) == len(dm.operators) == 40
    # what reached the broken file before it failed is still readable
    assert len(kdebug.load(tmp_path / "stream.kdt").operators) < 40


def test_a_lone_surrogate_in_op_text_is_saved_escaped_and_compares_as_recorded(tmp_path):
    """A str tensor attribute holding a lone surrogate (not UTF-8) made
    save(), streaming and even a live compare raise UnicodeEncodeError; it is
    stored as its \\udXXX escape, live and in the trace alike."""
    x = torch.randn(3)
    x.foo = "a\ud800b"

    def record():
        with DebugMode(record_tensor_attributes=["foo"], trace=str(tmp_path / "s.kdt")) as dm:
            torch.sin(x)
        return dm

    dm = record()
    run = kdebug.load(tmp_path / "s.kdt")
    assert "a\\ud800b" in run.debug_string()
    assert kdebug.compare(dm, run).ok and kdebug.compare(dm, record()).ok


def test_a_live_entry_name_with_a_nul_is_shown_as_its_trace_shows_it(tmp_path):
    x = torch.randn(3)

    def record(tag):
        with DebugMode() as dm:
            DebugMode._annotate(tag)
            torch.sin(x)
        return dm

    a, b = record("a\x00b"), record("a\x00c")
    a.save(tmp_path / "a.kdt")
    b.save(tmp_path / "b.kdt")
    fmt = importlib.import_module("kdebug.compare").format_report
    live = fmt(kdebug.compare(a, b))
    saved = fmt(kdebug.compare(str(tmp_path / "a.kdt"), str(tmp_path / "b.kdt")))
    assert "\x00" not in live and "a\\0b" in live and "a\\0c" in live, live
    assert live.splitlines()[1:] == saved.splitlines()[1:], (live, saved)
