"""An output path is never a file the command reads, nor a device or a pipe
(Note [An output is never an input], Note [Safe writes] in kdebug/_files.py)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from kdebug import DebugMode

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = "import torch\nprint(torch.compile(lambda x: x.cos() + 1)(torch.ones(8)).sum())\n"


def _cli(*args, cwd):
    return subprocess.run([sys.executable, "-m", "kdebug", *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, env={**os.environ, "PYTHONPATH": ROOT}, cwd=cwd, timeout=300)


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    d = tmp_path_factory.mktemp("outs")
    f = torch.compile(lambda x: x.sin() * 2)
    for name in ("a.kdt", "b.kdt"):
        with DebugMode(trace=str(d / name)), DebugMode.log_tensor_hashes():
            f(torch.ones(16))
    (d / "s.py").write_text(SCRIPT)
    return d


@pytest.mark.parametrize("cmd", [
    ["report", "a.kdt", "-o", "a.kdt"],
    ["export", "--perfetto", "a.kdt", "-o", "a.kdt"],
    ["diff", "a.kdt", "b.kdt", "--html", "b.kdt"],
    ["report", "a.kdt", "-o", "./x/../a.kdt"],  # another spelling of the same file
    ["record", "-o", "s.py", "--", "python", "s.py"],
    ["hunt", "--html", "s.py", "s.py"],
    ["accuracy", "--html", "s.py", "s.py"],
    ["record", "-o", "s.py", "--", "python", "-m", "s"],  # the module's own file
    ["hunt", "--html", "s.py", "-m", "s"],
    ["nan", "--json", "s.py", "s.py"],
    ["analyze", "--html", "s.py", "s.py"],
    ["minify", "--json", "s.py", "s.py"],
])
def test_an_output_that_is_an_input_is_refused_and_the_input_kept(traces, cmd):
    """Each of these replaced what it was about to read (record deleted the
    script before running it; an adversarial review)."""
    os.makedirs(traces / "x", exist_ok=True)
    before = {n: (traces / n).read_bytes() for n in ("a.kdt", "b.kdt", "s.py")}
    p = _cli(*cmd, cwd=traces)
    assert p.returncode == 2 and "this command reads that file" in p.stdout, p.stdout[-2000:]
    assert {n: (traces / n).read_bytes() for n in before} == before


def test_a_hard_link_to_an_input_is_the_input(traces):
    link = traces / "hard.kdt"
    if not link.exists():
        os.link(traces / "a.kdt", link)
    p = _cli("report", "a.kdt", "-o", "hard.kdt", cwd=traces)
    assert p.returncode == 2 and "this command reads that file (a.kdt)" in p.stdout, p.stdout[-2000:]


@pytest.mark.parametrize("cmd", [["report", "a.kdt", "-o", "fifo"], ["export", "--perfetto", "a.kdt", "-o", "fifo"],
                                 ["diff", "a.kdt", "b.kdt", "--html", "fifo"]])
def test_a_pipe_is_never_replaced_by_an_output(traces, cmd):
    """report and export renamed their new file over any node but a
    directory: a FIFO, or as root /dev/null itself."""
    fifo = traces / "fifo"
    if not fifo.exists():
        os.mkfifo(fifo)
    p = _cli(*cmd, cwd=traces)
    assert p.returncode == 2 and "is not a regular file" in p.stdout, p.stdout[-2000:]
    import stat

    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_the_writer_itself_refuses_a_device(tmp_path):
    """The last line of defence, for any caller that did not check first."""
    from kdebug import _files

    fifo = tmp_path / "p"
    os.mkfifo(fifo)
    with pytest.raises(FileExistsError, match="not a regular file"):
        with _files.replaced_atomically(str(fifo)) as f:
            f.write("x")
    import stat

    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_a_report_of_a_kept_hunt_never_writes_over_its_hunt_json(traces):
    keep = traces / "kept"
    keep.mkdir(exist_ok=True)
    (keep / "run0.kdt").write_bytes((traces / "a.kdt").read_bytes())
    (keep / "run1.kdt").write_bytes((traces / "b.kdt").read_bytes())
    p = _cli("report", "kept", "-o", "kept/run1.kdt", cwd=traces)
    assert p.returncode == 2 and "this command reads that file" in p.stdout, p.stdout[-2000:]
