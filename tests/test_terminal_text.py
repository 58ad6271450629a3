"""Note [Terminal-safe text]: what the command line prints from a trace --
kernel, op and argument names, an op's text (a custom op's string argument),
provenance source lines and paths -- reaches the terminal escaped: no control
or bidi character of a trace's strings drives the terminal, and none forges a
line of kdebug's report.  A real program recorded by kdebug record, and a
crafted trace; the CLI run in a subprocess."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap

import pytest
import torch

import kdebug
from kdebug import DebugMode

from tracebytes import with_meta, with_strings

# a title, an erased line, a carriage return and a forged report line, a right-to-left override, a C1 CSI, DEL
PAYLOAD = "\x1b]0;pwned\x07\x1b[2K\r  [cpp] fake_kernel()\n\u202eevil\x9b\x7f"
SHOWN = r"\x1b]0;pwned\x07\x1b[2K\r  [cpp] fake_kernel()\n\u202eevil\x9b\x7f"
# what must never reach the terminal raw: C0 but newline and tab, DEL, C1, the bidi and format controls
RAW = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def _cli(*args: str, cwd=None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(os.path.abspath(kdebug.__file__)))}
    return subprocess.run([sys.executable, "-m", "kdebug", *args], capture_output=True, text=True, env=env,
                          timeout=600, cwd=cwd)


def _assert_shown_as_text(p: subprocess.CompletedProcess, what) -> None:
    """No raw control reaches stdout or stderr, the payload is there escaped,
    and no line of the output is one the payload forged."""
    assert "Traceback" not in p.stderr, (what, p.stderr)
    for name, text in (("stdout", p.stdout), ("stderr", p.stderr)):
        raw = sorted({hex(ord(c)) for c in RAW.findall(text)})
        assert not raw, (what, name, raw)
    assert SHOWN in p.stdout, (what, p.stdout[-3000:])
    forged = [ln for ln in p.stdout.splitlines() if ln.lstrip().startswith(("[cpp] fake_kernel", "evil"))]
    assert not forged, (what, forged)


def test_escape_leaves_ordinary_text_and_escapes_controls():
    from kdebug import _termtext

    text = "aten::mm(t: f32[4, 4]) -> C:\\path é 漢字 " + PAYLOAD
    assert _termtext.escape(text) == "aten::mm(t: f32[4, 4]) -> C:\\path é 漢字 " + SHOWN
    assert _termtext.escape_output("a\tb\nc" + PAYLOAD) == "a\tb\nc" + SHOWN.replace(r"\n", "\n")
    assert _termtext.escape("\t\u2066\u2069\u200e\u200f\u061c\u2028\x00") == \
        r"\t\u2066\u2069\u200e\u200f\u061c\u2028\x00"
    assert _termtext.line(PAYLOAD) == PAYLOAD  # outside the command line: the exact strings


# ---------------------------------------------------------------- a real program

PROGRAM = textwrap.dedent("""
    import sys
    import torch

    PAYLOAD = {payload!r}

    @torch.library.custom_op("kdhostile::op", mutates_args=())
    def op(x: torch.Tensor, s: str) -> torch.Tensor:
        return x * 2

    @op.register_fake
    def _(x, s):
        return torch.empty_like(x)

    def fn(x):
        y = torch.sin(x) + 1
        return op(y, PAYLOAD + sys.argv[1]).cos()

    f = torch.compile(fn)
    print(f(torch.ones(8)).sum().item())
""")


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """Two recordings of a program whose custom op takes the payload as a
    string argument (ending in 'a' and in 'b')."""
    d = tmp_path_factory.mktemp("hostile_program")
    (d / "hostile.py").write_text(PROGRAM.format(payload=PAYLOAD))
    out = []
    for tail in ("a", "b"):
        p = _cli("record", "-o", f"run_{tail}.kdt", "--", "python", "hostile.py", tail, cwd=d)
        assert p.returncode == 0, p.stderr[-3000:]
        out.append(d / f"run_{tail}.kdt")
    return out


def test_show_of_a_real_recording_escapes_a_custom_ops_string_argument(recorded):
    a, _ = recorded
    run = kdebug.load(a, quiet=True)
    texts = [op._text for op in run.operators if not isinstance(op, kdebug._KernelCall)]
    assert any(PAYLOAD + "a" in t for t in texts)  # the API keeps the exact string
    for args in (["show", str(a)], ["show", "--verbose", str(a)]):
        _assert_shown_as_text(_cli(*args), args)


def test_diff_of_real_recordings_escapes_a_custom_ops_string_argument(recorded):
    a, b = recorded
    p = _cli("diff", str(a), str(b))
    assert p.returncode == 1, p.stdout + p.stderr  # the op was called with another string
    _assert_shown_as_text(p, "diff")


# ---------------------------------------------------------------- a crafted trace


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    """A recorded trace, and the same trace with the payload appended to every
    string (kernel, op and argument names, op texts) and to every string of
    its kernels' provenance (source lines, module path, FX nodes)."""
    f = torch.compile(lambda x: torch.sin(x) * 2 + 1)
    x = torch.randn(16, 8)
    f(x)
    with DebugMode() as dm, DebugMode.log_tensor_hashes(["bitwise", "norm"], hash_inputs=True):
        f(x)
        (x + 1).sum()
    data = kdebug.trace.save(dm, None)
    kernel = kdebug.trace.Run(data).kernels[0].kernel_name
    bad = with_strings(data, lambda i, s: s + PAYLOAD if s else s)
    k = kernel + PAYLOAD
    bad = with_meta(bad, {"kernel_provenance": {k: [{
        "kernel": k, "kind": "cpp", "nodes": ["sin" + PAYLOAD], "writes": {"buf0" + PAYLOAD: "sin" + PAYLOAD},
        "source": ["model.py:3 in f: y = x.sin()  # " + PAYLOAD], "graph": "0/0" + PAYLOAD, "origin": "lowering",
        "unknown": [], "code_sha256": "", "module": "/tmp/m" + PAYLOAD + ".py"}]}})
    d = tmp_path_factory.mktemp("crafted")
    (d / "good.kdt").write_bytes(data)
    (d / "bad.kdt").write_bytes(bad)
    return d / "good.kdt", d / "bad.kdt"


def test_show_of_a_crafted_trace_escapes_every_name(traces):
    _, bad = traces
    run = kdebug.load(bad, quiet=True)
    assert run.kernels[0].kernel_name.endswith(PAYLOAD)  # the API keeps the exact strings
    n = run.kernels[0].launch_index
    for args in (["show", str(bad)], ["show", "--verbose", str(bad)], ["show", "--source", str(n), str(bad)]):
        p = _cli(*args)
        assert p.returncode == 0, (args, p.stderr)
        _assert_shown_as_text(p, args)
        assert "model.py:3 in f: y = x.sin()  # " + SHOWN in p.stdout, args  # the provenance lines too


def test_diff_of_a_crafted_trace_escapes_every_name(traces):
    good, bad = traces
    for args in (["diff", str(good), str(bad)], ["diff", str(bad), str(good)]):
        p = _cli(*args)
        assert p.returncode == 1, (args, p.stdout, p.stderr)
        _assert_shown_as_text(p, args)
        assert "kernel #0 " in p.stdout and "STRUCTURE" in p.stdout
    # the HTML report escapes for HTML itself: its copy of the report's text keeps the exact strings
    from kdebug import report

    meta, _ = report.build([str(good), str(bad)])
    assert PAYLOAD in meta["comparisons"][0]["text"] and SHOWN not in meta["comparisons"][0]["text"]
