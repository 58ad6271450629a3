"""Hostile files and paths (issue 16, part 4): planted symlinks, CRC-valid but
malformed META, a flipped chunk length, and payloads in every META field
opened in Chromium.  Real Inductor C++ kernels."""
from __future__ import annotations

import hashlib
import json
import os
import random
import re
import subprocess
import sys

import pytest
import torch

import kdebug
from kdebug import DebugMode, TraceFileError, report
from kdebug._files import LinkRefused
from kdebug.cli import main as cli
from kdebug.export import export_perfetto, perfetto_events

from test_report import _open, browser  # noqa: F401  (the Chromium fixture)
from tracebytes import chunks, extents_tree_bytes, hostile_meta, with_body_bytes, with_meta


@pytest.fixture(scope="module")
def trace_bytes():
    f = torch.compile(lambda x: torch.sin(x) * 2 + 1)
    x = torch.randn(16, 8)
    f(x)
    with DebugMode() as dm, DebugMode.log_tensor_hashes(["bitwise", "norm"], hash_inputs=True):
        f(x)
        (x + 1).sum()
    return kdebug.trace.save(dm, None)


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(os.path.abspath(kdebug.__file__)))}
    return subprocess.run([sys.executable, "-m", "kdebug", *args], capture_output=True, text=True, env=env,
                          timeout=300)


# ---------------------------------------------------------------- symlinks


def test_a_symlinked_trace_path_is_refused_and_its_target_kept(trace_bytes, tmp_path):
    """Writing a trace through a link would truncate the file it points to in
    place: a Run mapping it (in this process) would die of SIGBUS.  Refused."""
    target = tmp_path / "old.kdt"
    target.write_bytes(trace_bytes)
    run = kdebug.load(target)
    link = tmp_path / "run.kdt"
    link.symlink_to(target)
    with DebugMode() as dm:
        torch.ones(3).sum()
    with pytest.raises(LinkRefused, match="symbolic link .*does not write through links"):
        dm.save(link)
    # streamed: in another process (a failed __enter__ leaves the mode pushed there: issue 16 part 2)
    code = ("import sys, kdebug\nfrom kdebug._files import LinkRefused\ntry:\n"
            "    with kdebug.DebugMode(trace=sys.argv[1]):\n        pass\nexcept LinkRefused as e:\n    print(e)\n")
    p = subprocess.run([sys.executable, "-c", code, str(link)], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(kdebug.__file__))})
    assert p.returncode == 0 and "is a symbolic link" in p.stdout, p.stderr
    assert target.read_bytes() == trace_bytes and link.is_symlink()
    assert "cpp_fused" in run.debug_string()


def test_reports_and_exports_never_write_through_planted_links(trace_bytes, tmp_path, capsys):
    trace = tmp_path / "run.kdt"
    trace.write_bytes(trace_bytes)
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    for name in ("r.html", "p.json"):  # the temp names the old writers used, planted
        (tmp_path / f"{name}.tmp{os.getpid()}").symlink_to(victim)
    report.write_html(str(tmp_path / "r.html"), [str(trace)])
    export_perfetto(str(trace), str(tmp_path / "p.json"))
    assert victim.read_text() == "precious"
    assert not (tmp_path / "r.html").is_symlink() and "kd-meta" in (tmp_path / "r.html").read_text()
    assert json.loads((tmp_path / "p.json").read_text())["traceEvents"]
    # the outputs themselves planted as links: refused, nothing written
    for name in ("r2.html", "p2.json"):
        (tmp_path / name).symlink_to(victim)
    assert cli(["report", str(trace), "-o", str(tmp_path / "r2.html")]) == 2
    assert cli(["export", "--perfetto", str(trace), "-o", str(tmp_path / "p2.json")]) == 2
    err = capsys.readouterr().err
    assert err.count("is a symbolic link") == 2 and "Traceback" not in err
    assert victim.read_text() == "precious"
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # no temp file left


# ---------------------------------------------------------------- malformed META


_SHA = hashlib.sha256(b"// a kernel\n").hexdigest()  # a kernel_code key whose text is "// a kernel\n"

BAD_META = {
    "a list": "[1, 2]",
    "null": "null",
    "a string": '"hello"',
    "stats a list": '{"stats": [1]}',
    "stats null": '{"stats": null}',
    "dropped a string": '{"stats": {"dropped": "<b>x</b>"}}',
    "dropped negative": '{"stats": {"dropped": -3}}',
    "dropped a bool": '{"stats": {"dropped": true}}',
    "complete a number": '{"stats": {"complete": 1}}',
    "bypassed a list": '{"stats": {"bypassed_graph_calls": ["cudagraphs"]}}',
    "hash_specs a list": '{"hash_specs": [1]}',
    "hash_specs entry null": '{"hash_specs": {"1": null}}',
    "hash names unknown": '{"hash_specs": {"2": {"names": ["evil"], "single": true, "custom": false}}}',
    "hash spec id": '{"hash_specs": {"x": {"names": ["bitwise"]}}}',
    "argv a string": '{"argv": "python x.py"}',
    "time NaN": '{"time": NaN}',
    "time a string": '{"time": "now"}',
    "custom count a dict": '{"custom_hashes_not_saved": {}}',
    "deep nesting": '{"argv": ' + "[" * 100000 + "]" * 100000 + "}",
    "not JSON": "{'stats': 1}",
    "provenance a list": '{"kernel_provenance": [1]}',
    "provenance entries null": '{"kernel_provenance": {"k": null}}',
    "provenance no entries": '{"kernel_provenance": {"k": []}}',
    "provenance entry a number": '{"kernel_provenance": {"k": [3]}}',
    "provenance nodes a string": '{"kernel_provenance": {"k": [{"nodes": "relu"}]}}',
    "provenance node a number": '{"kernel_provenance": {"k": [{"nodes": [1]}]}}',
    "provenance writes a list": '{"kernel_provenance": {"k": [{"writes": ["buf0"]}]}}',
    "provenance write a number": '{"kernel_provenance": {"k": [{"writes": {"buf0": 7}}]}}',
    "provenance source null": '{"kernel_provenance": {"k": [{"source": null}]}}',
    "provenance too many": '{"kernel_provenance": {"k": [' + ", ".join(["{}"] * 9) + "]}}",
    # Note [Kernel code]
    "provenance code hash short": '{"kernel_provenance": {"k": [{"code_sha256": "abc"}]}}',
    "provenance code hash upper": '{"kernel_provenance": {"k": [{"code_sha256": "%s"}]}}' % _SHA.upper(),
    "provenance code hash a number": '{"kernel_provenance": {"k": [{"code_sha256": 7}]}}',
    "provenance module a list": '{"kernel_provenance": {"k": [{"module": ["/x.py"]}]}}',
    "kernel code a list": '{"kernel_code": ["int x;"]}',
    "kernel code key not a hash": '{"kernel_code": {"cpp_fused_0": "int x;"}}',
    "kernel code text a number": '{"kernel_code": {"%s": 1}}' % _SHA,
    "kernel code text altered": '{"kernel_code": {"%s": "// a kernel\\n<script>x</script>"}}' % _SHA,
    "kernel code dropped negative": '{"kernel_code_dropped": -1}',
}


@pytest.mark.parametrize("what", list(BAD_META))
def test_malformed_meta_is_a_trace_file_error_naming_its_offset(trace_bytes, tmp_path, what):
    data = with_meta(trace_bytes, BAD_META[what])
    meta_at = [off + 16 for off, typ, _ in chunks(data) if typ == 3][-1]
    path = tmp_path / "bad.kdt"
    path.write_bytes(data)
    with pytest.raises(TraceFileError, match=rf"byte {meta_at}: corrupt META chunk") as e:
        kdebug.load(path)
    assert e.value.offset == meta_at


def test_malformed_meta_exits_2_in_every_command(trace_bytes, tmp_path):
    good, bad = tmp_path / "good.kdt", tmp_path / "bad.kdt"
    good.write_bytes(trace_bytes)
    bad.write_bytes(with_meta(trace_bytes, BAD_META["deep nesting"]))
    out = tmp_path / "o"
    for args in (["show", str(bad)], ["diff", str(good), str(bad)], ["export", "--perfetto", str(bad), "-o", str(out)],
                 ["report", str(good), str(bad), "-o", str(out)]):
        p = _cli(*args)
        assert p.returncode == 2 and "corrupt META chunk" in p.stderr and "Traceback" not in p.stderr, (args, p.stderr)
    assert not out.exists()


def test_one_flipped_chunk_length_is_corruption_not_a_dead_process(trace_bytes, tmp_path):
    """A finished trace (it ends with its END chunk) whose first RECORDS chunk
    claims to run past the end: corrupt, exit 2, not 'the process died'."""
    data = bytearray(trace_bytes)
    rec = next(off for off, typ, _ in chunks(data) if typ == 2)
    data[rec + 10] ^= 0x40
    path = tmp_path / "flip.kdt"
    path.write_bytes(data)
    with pytest.raises(TraceFileError, match=rf"byte {rec + 8}: corrupt: this chunk's length runs past the end"):
        kdebug.load(path)
    p = _cli("show", str(path))
    assert p.returncode == 2 and "corrupt" in p.stderr and "died" not in p.stderr + p.stdout


# ---------------------------------------------------------------- malformed extents trees (Note [Extents trees on reading])


def _op_with_extents(data: bytes) -> tuple[int, tuple]:
    """(byte offset, tree) of the extents tree of the first op record that has
    one: the tree as kdebug wrote it, found in the file by its encoding."""
    run = kdebug.trace.Run(data)
    for i, t in enumerate(run.types):
        if t == kdebug.trace.REC_OP:
            ext = run._reader.op(i, kdebug.hashing.norm_value).extents
            if ext is not None:
                tree = _plain(tuple(ext))
                enc = extents_tree_bytes(tree)
                assert data.count(enc) >= 1
                return data.index(enc), tree
    raise AssertionError("no op record with extents")


def _plain(x):
    """An extents tree with its Extent leaves as the tuples a trace holds."""
    if isinstance(x, kdebug._C.Extent):
        return tuple(x)
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(_plain(v) for v in x)
    return x


def _first_extent(tree):
    if isinstance(tree, kdebug._C.Extent) or (isinstance(tree, tuple) and len(tree) in (4, 5)
                                              and all(type(v) is int for v in tree)):
        return tree
    for v in (tree.values() if isinstance(tree, dict) else tree if isinstance(tree, (list, tuple)) else ()):
        e = _first_extent(v)
        if e is not None:
            return e
    return None


def _swap_range(tree):
    """The tree with its first extent's first and last byte swapped."""
    e = _first_extent(tree)

    def walk(x):
        if x is e:
            return (x[0], x[1], x[3], x[2]) + tuple(x[4:])
        if isinstance(x, dict):
            return {k: walk(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return type(x)(walk(v) for v in x)
        return x
    return walk(tree)


MALFORMED_EXTENTS = {  # what is done to the tree, and what the error says
    "root a list": (lambda t: list(t), "its root is not the pair (inputs, outputs)"),
    "an extent ending before it starts": (_swap_range, "an extent ends before it starts"),
}


def _malformed_extents(data: bytes, what: str) -> tuple[bytes, int]:
    """A CRC-valid trace whose first op with extents has a tree kdebug does
    not write (same length: the record's lengths stay right); and the byte
    offset of the node the reader must name."""
    at, tree = _op_with_extents(data)
    change, _ = MALFORMED_EXTENTS[what]
    old, new = extents_tree_bytes(tree), extents_tree_bytes(change(tree))
    assert len(old) == len(new) and old != new
    node = 0 if what == "root a list" else old.index(extents_tree_bytes(_first_extent(tree)))
    return with_body_bytes(data, at, new), at + node


@pytest.mark.parametrize("what", list(MALFORMED_EXTENTS))
def test_a_malformed_extents_tree_is_refused_when_the_trace_is_loaded(trace_bytes, tmp_path, what):
    """A CRC-valid file whose op record's extents tree is not what kdebug
    writes loaded as complete, `kdebug show` died with a traceback ("malformed
    extents tree") and `kdebug diff` called the runs a match.  Now the file is
    refused when it is opened, naming the file, the byte and what is wrong."""
    data, node = _malformed_extents(trace_bytes, what)
    path = tmp_path / "bad.kdt"
    path.write_bytes(data)
    want = f"bad.kdt: byte {node}: malformed extents tree: {MALFORMED_EXTENTS[what][1]}"
    with pytest.raises(TraceFileError, match=re.escape(want)) as e:
        kdebug.load(path)
    assert e.value.path == str(path) and e.value.offset == node


def test_a_malformed_extents_tree_exits_2_in_every_command(trace_bytes, tmp_path):
    good, bad = tmp_path / "good.kdt", tmp_path / "bad.kdt"
    good.write_bytes(trace_bytes)
    bad.write_bytes(_malformed_extents(trace_bytes, "root a list")[0])
    out = tmp_path / "o"
    for args in (["show", str(bad)], ["show", "--verbose", str(bad)], ["diff", str(good), str(bad)],
                 ["diff", str(bad), str(good)], ["export", "--perfetto", str(bad), "-o", str(out)],
                 ["report", str(good), str(bad), "-o", str(out)]):
        p = _cli(*args)
        assert p.returncode == 2, (args, p.returncode, p.stdout[-2000:], p.stderr[-2000:])
        assert f"{bad}: byte " in p.stderr and "malformed extents tree" in p.stderr, (args, p.stderr)
        assert "Traceback" not in p.stderr, (args, p.stderr)
    assert not out.exists()


# ---------------------------------------------------------------- fuzzing META and the report


def _read_everything(data: bytes, good, tmp_path) -> str:
    """Everything kdebug does with a trace; 'error' when it is refused with a
    TraceFileError (any other exception fails the test)."""
    try:
        run = kdebug.trace.Run(data, "fuzzed.kdt")
    except TraceFileError as e:
        assert 0 <= e.offset <= len(data)
        return "error"
    run.problems()
    run.debug_string()
    run.debug_string(verbose=True)  # Note [Kernel code]: each kernel's module, nodes, lines
    kdebug.compare(good, run)
    perfetto_events(run)
    meta, blob = report.build([good, run])
    page = report.render(meta, blob)
    assert "<script>alert" not in page and "onerror=alert" not in page.split('id="kd-meta"')[0]
    return "read"


def test_fuzzed_meta_is_read_or_refused_never_a_traceback(trace_bytes, tmp_path):
    """Structure-aware: CRC-valid META chunks with hostile JSON values.  Each
    mutant is refused with a TraceFileError or read through show, diff,
    export and the report page.  (tools/fuzz_traces.py runs the long campaign.)"""
    good = kdebug.trace.Run(trace_bytes)
    base = dict(good.meta)
    rng = random.Random(16)
    seen = {"error": 0, "read": 0}
    for _ in range(300):
        seen[_read_everything(with_meta(trace_bytes, hostile_meta(rng, base)), good, tmp_path)] += 1
    assert seen["error"] > 100 and seen["read"] > 10, seen


# ---------------------------------------------------------------- payloads in Chromium

PAYLOAD = '<!-- <img src=x onerror="window.__kdxss=(window.__kdxss||0)+1"><script>window.__kdxss=99</script>"\'&'


def _payload_metas() -> dict[str, dict]:
    """Every META field kdebug reads, and an unknown one, holding the payload
    (as the value, or inside it where the value is a container)."""
    p = PAYLOAD
    out = {k: {k: p} for k in ("kdebug", "torch", "python", "argv", "pid", "time", "hash_specs", "stats",
                               "custom_hashes_not_saved", "unknown")}
    out["argv[]"] = {"argv": ["python", p]}
    out["hash_specs names"] = {"hash_specs": {"2": {"names": [p], "single": True, "custom": False}}}
    out["hash_specs id"] = {"hash_specs": {p: {"names": ["bitwise"], "single": True, "custom": False}}}
    for k in ("launches", "dropped", "errors", "unrecorded", "suppressed", "outputs_skipped", "readonly_changed",
              "hash_unsupported", "complete", "bypassed_graph_calls", p):
        out[f"stats.{k}"] = {"stats": {k: p}}
    out["kernel_provenance"] = {"kernel_provenance": {p: [{"kernel": p, "kind": p, "nodes": [p], "source": [p],
                                                          "writes": {p: p}, "graph": p, "origin": p,
                                                          "unknown": [p]}]}}
    code_key = hashlib.sha256(p.encode()).hexdigest()  # Note [Kernel code]: a source that is the payload
    out["kernel_code"] = {"kernel_provenance": {p: [{"kernel": p, "nodes": [p], "code_sha256": code_key,
                                                     "module": p}]}, "kernel_code": {code_key: p}}
    out["stats.bypassed_graph_calls key"] = {"stats": {"bypassed_graph_calls": {p: 2}, "complete": False}}
    return out


def test_every_meta_field_with_a_payload_in_chromium(trace_bytes, browser, tmp_path):  # noqa: F811
    """Each field's trace is either refused (TraceFileError) or drawn in the
    report -- all of those in one page -- with the payload shown as text and
    no script run."""
    shown, refused = [], []
    for what, meta in _payload_metas().items():
        path = tmp_path / f"{len(shown) + len(refused)}.kdt"
        path.write_bytes(with_meta(trace_bytes, meta))
        try:
            kdebug.load(path, quiet=True)
        except TraceFileError as e:
            assert "corrupt META chunk" in str(e)
            refused.append(what)
            continue
        shown.append(str(path))
    out = tmp_path / "xss.html"
    report.write_html(str(out), shown, title=PAYLOAD)
    page, problems, requests = _open(browser, out)
    page.hover("#timeline")
    page.click("#zoom-root")
    page.locator(".trow").first.click()
    assert page.evaluate("window.__kdxss") is None
    assert page.locator("#summary img, #summary script, #detail img, #structure img").count() == 0
    assert PAYLOAD in page.inner_text("#summary")  # argv / the bypass reason: drawn as text
    assert page.title() == PAYLOAD
    assert not [u for u in requests if u.endswith("/x")], requests
    assert problems == [], problems
    # every field whose value is a count, flag, time or hash name was refused, every text field shown
    assert {"stats.dropped", "stats.launches", "pid", "time", "hash_specs names", "stats"} <= set(refused)
    assert {"argv[]", "torch", "kdebug", "unknown", "stats.bypassed_graph_calls key"} & set(refused) == set()
    page.close()


def test_the_page_escapes_every_value_it_inserts(trace_bytes, browser, tmp_path):  # noqa: F811
    """Defence in depth, past the META schema: every string and number the
    report's data carries replaced by the payload in the page's JSON; the page
    still runs no script."""
    path = tmp_path / "a.kdt"
    path.write_bytes(trace_bytes)
    meta, blob = report.build([str(path), str(path)])

    for r in meta["runs"]:
        for k in ("label", "path", "torch", "time", "dropped", "kernels", "ops"):
            r[k] = PAYLOAD
        r["argv"], r["problems"], r["complete"] = [PAYLOAD], [PAYLOAD], False
    for c in meta["comparisons"]:
        for k in ("verdict", "text", "segments_total", "config_total", "shape_total"):
            c[k] = PAYLOAD
    meta["workload"] = meta["generated"] = meta["kdebug"] = PAYLOAD
    meta["hunt"] = {"what": PAYLOAD, "fixes": {PAYLOAD: True}}
    meta["strings"] = [s if not s else s + PAYLOAD for s in meta["strings"]]
    out = tmp_path / "poisoned.html"
    out.write_text(report.render(meta, blob))
    page, problems, _ = _open(browser, out)
    page.locator(".trow").first.click()
    assert page.evaluate("window.__kdxss") is None
    assert PAYLOAD in page.inner_text("#summary")
    page.close()


class _ClaimsToBeATensor:
    """An object whose __class__ says torch.Tensor: isinstance() believes it."""

    @property
    def __class__(self):
        return torch.Tensor


def _impostors():
    import weakref
    from unittest import mock

    t = torch.arange(6.0).reshape(2, 3)
    return t, [weakref.proxy(t), mock.Mock(spec=torch.Tensor), _ClaimsToBeATensor()]


def test_objects_that_only_claim_to_be_tensors_are_not_read_as_tensors():
    """isinstance(x, torch.Tensor) is true for a weakref.proxy of a tensor, a
    Mock(spec=torch.Tensor) and any object whose __class__ says so, yet none
    is laid out as one: kdebug's C side recognises tensors by their real type
    (is_tensor in csrc/kd_torch.cpp), so reading their metadata as a tensor's
    (which crashed the process) does not happen."""
    t, impostors = _impostors()
    assert kdebug._C.tensor_meta(t) is not None
    for o in impostors:
        assert isinstance(o, torch.Tensor)  # what the old check went by
        assert kdebug._C.tensor_meta(o) is None
        assert kdebug._C.replica_devices([o], (type(o),)) is None
    assert kdebug._C.replica_devices([t], (torch.Tensor,)) is not None


def test_record_state_refuses_objects_that_only_claim_to_be_tensors():
    """The record path (its device lookup and the launch path's description
    of each argument) refuses them with a TypeError instead of reading them
    as tensors."""
    _, impostors = _impostors()
    names = kdebug._C.intern_names(["x"])
    for o in impostors:
        with DebugMode(kernels_only=True):
            with pytest.raises(TypeError, match="takes tensors"):
                kdebug._C.record_state("kdebug::probe", names, [o])


def test_a_device_is_refused_and_a_pipe_still_reads(tmp_path):
    """/dev/zero was read until memory ran out and /dev/urandom for ever (an
    adversarial review); a device is refused at once.  A trace through a
    pipe (`kdebug show <(zcat run.kdt.gz)`) still loads."""
    import threading

    import kdebug

    with pytest.raises(kdebug.TraceFileError, match="not a regular file"):
        kdebug.load("/dev/zero")
    with pytest.raises(kdebug.TraceFileError, match="not a regular file"):
        kdebug.load("/dev/urandom")
    path = tmp_path / "r.kdt"
    with kdebug.DebugMode(trace=str(path)):
        torch.ones(3).add(1)
    r, w = os.pipe()
    feeder = threading.Thread(target=lambda: (os.write(w, path.read_bytes()), os.close(w)))
    feeder.start()
    try:
        got = kdebug.load(f"/dev/fd/{r}")
    finally:
        feeder.join()
        os.close(r)
    assert len(got) == len(kdebug.load(str(path))) > 0


def test_a_trace_another_writer_replaced_is_saved_beside_it(tmp_path):
    """Two processes recording to one path: the later one's file replaced the
    earlier's, which went on writing into a file no name reached, its whole
    recording lost without a word (an adversarial review: three writers, the
    last one's records only).  Note [A trace another writer replaced]."""
    from kdebug import trace as tr
    from kdebug.inductor import KdebugWarning

    path = tmp_path / "same.kdt"
    with pytest.warns(KdebugWarning, match="was replaced .another writer. or removed") as got:
        with kdebug.DebugMode(trace=str(path)):
            torch.ones(3).add(1)
            other = tr.Writer(str(path))  # the other writer: creates the path anew, as its process would
            other.close()
            torch.ones(2).mul(2)
    alt = tmp_path / f"same.pid{os.getpid()}.kdt"
    assert str(alt) in str(got[0].message)
    mine = kdebug.load(str(alt))
    assert [str(op).split("(")[0] for op in mine.operators][-2:] == ["aten::ones", "aten::mul.Tensor"], mine.operators
    assert len(kdebug.load(str(path))) == 0  # the other writer's (empty) trace keeps the path


def test_a_program_that_changes_directory_or_renames_its_trace_loses_nothing(tmp_path, monkeypatch):
    """The first check compared the path, relative to a working directory the
    program had changed (Hydra does): it warned 'another writer replaced',
    wrote a stray copy elsewhere and named a path that did not exist (a
    review).  A file that still has a name is never copied."""
    import warnings

    from kdebug.inductor import KdebugWarning

    monkeypatch.chdir(tmp_path)
    (tmp_path / "elsewhere").mkdir()
    with warnings.catch_warnings():
        warnings.simplefilter("error", KdebugWarning)
        with kdebug.DebugMode(trace="run.kdt"):
            torch.ones(3).add(1)
            os.chdir("elsewhere")
            torch.ones(2).mul(2)
    assert os.listdir(tmp_path / "elsewhere") == [] and len(kdebug.load(str(tmp_path / "run.kdt"))) == 4
    os.chdir(tmp_path)
    (tmp_path / "d1").mkdir()
    with warnings.catch_warnings():
        warnings.simplefilter("error", KdebugWarning)
        with kdebug.DebugMode(trace="d1/run.kdt"):
            torch.ones(3).add(1)
            os.rename("d1", "d2")
    assert len(kdebug.load(str(tmp_path / "d2" / "run.kdt"))) == 2 and not (tmp_path / "d1").exists()
