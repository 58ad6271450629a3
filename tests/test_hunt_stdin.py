"""kdebug hunt gives every run of the program the same standard input
(Note [One standard input for every run] in kdebug/_stdin.py)."""
from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

READS_STDIN = """
import sys, torch
s = sys.stdin.read()
with open(sys.argv[1], "a") as f:
    f.write(f"{len(s)}\\n")
f = torch.compile(lambda x: torch.sin(x) * 2 + 1)
print(f(torch.ones(32) * float(len(s))).sum())
"""


@pytest.mark.parametrize("in_process", [False, True])
def test_every_run_reads_the_same_standard_input(tmp_path, in_process):
    """The first run read kdebug's standard input to its end and the second
    got an empty stream: a script that read its input diverged by kdebug's
    doing ('aten::mul ... 12.0 in run 0, 0.0 in run 1', an adversarial
    review)."""
    script, seen = tmp_path / "reads.py", tmp_path / "seen.txt"
    script.write_text(READS_STDIN)
    p = subprocess.run([sys.executable, "-m", "kdebug", "hunt", "--no-magnitude", *(["--in-process"] * in_process),
                        str(script), str(seen)], input="hello world\n", stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, env={**os.environ, "PYTHONPATH": ROOT}, timeout=300)
    assert p.returncode == 0 and "all runs match" in p.stdout, p.stdout[-3000:]
    assert seen.read_text().split() == ["12", "12"]


def test_a_program_that_never_reads_an_endless_input_is_not_kept_waiting(tmp_path):
    """Nothing is read before a run asks: a hunt given a pipe that stays open
    finishes when its program never reads it (a property of the shared
    input's design, which must not wait for an end of input that never
    comes; the code before it inherited the input and did not wait either)."""
    script = tmp_path / "quiet.py"
    script.write_text("import torch\nprint(torch.compile(lambda x: x.cos() + 1)(torch.ones(8)).sum())\n")
    p = subprocess.Popen([sys.executable, "-m", "kdebug", "hunt", "--no-magnitude", str(script)],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         env={**os.environ, "PYTHONPATH": ROOT})
    hung = threading.Timer(300, p.kill)  # a hunt waiting for the input's end would be killed here
    hung.start()
    try:
        out = p.stdout.read()  # its standard input stays open meanwhile
        p.wait()
    finally:
        hung.cancel()
        p.stdin.close()
    assert p.returncode == 0 and "all runs match" in out, out[-3000:]


def test_a_file_given_as_input_stays_seekable_and_a_loop_keeps_its_lines(tmp_path):
    """Input redirected from a file is inherited by every run at the position
    it had (a program that torch.load()s sys.stdin.buffer, which seeks,
    failed with 'Illegal seek' through a pipe), and nothing of it is read by
    kdebug: `while read f; do kdebug hunt $f; done < list` runs every line
    (a review of the shared input)."""
    seen = tmp_path / "seen.txt"
    script = tmp_path / "seeks.py"
    script.write_text(f"""
import sys, torch
w = torch.load(sys.stdin.buffer)["w"]
with open({str(seen)!r}, "a") as f:
    f.write(f"{{float(w.sum())}}\\n")
print(torch.compile(lambda x: x * 2)(w).sum())
""")
    data = tmp_path / "w.pt"
    torch.save({"w": torch.arange(4.0)}, str(data))
    with open(data, "rb") as f:
        p = subprocess.run([sys.executable, "-m", "kdebug", "hunt", "--no-magnitude", str(script)], stdin=f,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           env={**os.environ, "PYTHONPATH": ROOT}, timeout=300)
    assert p.returncode == 0 and "all runs match" in p.stdout, p.stdout[-3000:]
    assert seen.read_text().split() == ["6.0", "6.0"]
    quiet = tmp_path / "quiet.py"
    quiet.write_text("import torch\nprint(torch.compile(lambda x: x + 1)(torch.ones(4)).sum())\n")
    lst = tmp_path / "list.txt"
    lst.write_text(f"{quiet}\n{quiet}\n")
    loop = f'while read f; do {sys.executable} -m kdebug hunt --no-magnitude "$f" | tail -1; done < {lst}'
    p = subprocess.run(["sh", "-c", loop], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       env={**os.environ, "PYTHONPATH": ROOT}, timeout=600)
    assert p.stdout.count("all runs match") == 2, p.stdout[-3000:]
