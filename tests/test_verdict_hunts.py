"""Verdicts of kdebug hunt on whole scripts in fresh processes (a file of
their own so that the test run's workers share the slow hunts): a shuffle's
seed read into Python, a printed random tag, another thread count, traces of
different commands."""
from __future__ import annotations

import re

import pytest

from test_verdict import _hunt_script


_SHUFFLE_SCRIPT = """
import os, sys, torch
from torch.utils.data import DataLoader, TensorDataset
counter = sys.argv[1]
run = int(open(counter).read()) if os.path.exists(counter) else 0
open(counter, "w").write(str(run + 1))
torch.set_num_threads(1)
torch.manual_seed(0)
ds = TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
step = torch.compile(lambda x, y: torch.nn.functional.mse_loss(model(x), y))
torch.manual_seed(100 + run)  # the bug: the shuffle's seed differs between runs (a clock, a pid)
for x, y in DataLoader(ds, batch_size=16, shuffle=True):
    opt.zero_grad()
    loss = step(x, y)
    loss.backward()
    opt.step()
print(loss.item())
"""


def test_batches_a_shuffle_from_another_seed_picked_name_the_draw_the_program_read(tmp_path):
    """A DataLoader shuffled from a generator seeded differently per run draws
    its seed (aten::random_), reads it into Python and stacks other samples:
    the stacks say the program had read the draw's other values before them
    (Note [Differences the program carried]), instead of only blaming set /
    dict order, and the draw is listed as a root that drew other numbers."""
    rc, out = _hunt_script(tmp_path, _SHUFFLE_SCRIPT)
    assert rc == 1, out
    first = out.split("FIRST DIVERGENCE")[1].split("OTHER ROOTS")[0]
    assert "after it read other values from op #" in first and "aten::random_ (see its root)" in first, out
    assert "a root after one whose other values the program read may follow from it" in out, out
    draw = next(line for line in out.splitlines() if re.search(r"root \d+: op #\d+ aten::random_", line))
    rest = out.split(draw)[1].split("root ")[0]
    assert "drew other random numbers" in rest, out


_THREADS_SCRIPT = """
import os, sys, torch
counter = sys.argv[1]
run = int(open(counter).read()) if os.path.exists(counter) else 0
open(counter, "w").write(str(run + 1))
torch.set_num_threads(1 + run)  # another thread count in run 1
torch.manual_seed(0)
x = torch.randn(1 << 20)
f = torch.compile(lambda t: t * 2 + 1)
print(f(x.sum()).item())
"""


def test_runs_with_another_thread_count_say_so(tmp_path):
    """An eager sum over 1M elements splits by threads: with another thread
    count in run 1 its bits differ, and the report names the setting
    (Note [Settings that change the numbers]) instead of calling the op
    plainly non-deterministic."""
    rc, out = _hunt_script(tmp_path, _THREADS_SCRIPT)
    if "FIRST DIVERGENCE" not in out:
        pytest.skip("this machine's sum gave the same bits with 1 and 2 threads")
    assert "SETTINGS: num_threads was 2 in run 1, 1 in run 0" in out, out
    assert "or it computed differently under the other setting" in out, out


def test_the_settings_are_checked_when_a_trace_is_read():
    from kdebug.trace import check_meta

    assert check_meta('{"settings": {"num_threads": 4, "cudnn_benchmark": false, "future": [1]}}') == \
        {"settings": {"num_threads": 4, "cudnn_benchmark": False}}
    for bad in ('{"settings": [1]}', '{"settings": {"num_threads": -1}}',
                '{"settings_end": {"float32_matmul_precision": {"a": 1}}}'):
        with pytest.raises(ValueError, match="settings"):
            check_meta(bad)


def test_a_diff_of_traces_of_different_commands_says_so(tmp_path):
    """kdebug diff of any two traces compares them; when they were recorded
    from different command lines (another script, other flags) it says so,
    kdebug's own runner arguments left out."""
    import subprocess
    import sys

    body = "import sys, torch\nf = torch.compile(lambda t: t.sin() + 1)\nprint(f(torch.ones(8)).sum().item())\n"
    for name in ("a.py", "b.py"):
        (tmp_path / name).write_text(body)
    for name, extra in (("a", []), ("a2", []), ("b", ["--flag"])):
        script = "b.py" if name == "b" else "a.py"
        p = subprocess.run([sys.executable, "-m", "kdebug", "record", "-o", f"{name}.kdt", "--", script, *extra],
                           cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stdout + p.stderr
    same = subprocess.run([sys.executable, "-m", "kdebug", "diff", "a.kdt", "a2.kdt"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert "different commands" not in same.stdout, same.stdout
    other = subprocess.run([sys.executable, "-m", "kdebug", "diff", "a.kdt", "b.kdt"], cwd=tmp_path,
                           capture_output=True, text=True, timeout=300)
    assert "note: the traces are of different commands" in other.stdout and "'b.py --flag'" in other.stdout, \
        other.stdout


_RUN_TAG_SCRIPT = """
import os, sys, torch
counter = sys.argv[1]
run = int(open(counter).read()) if os.path.exists(counter) else 0
open(counter, "w").write(str(run + 1))
torch.set_num_threads(1)
torch.manual_seed(run)
print("run tag", torch.randint(0, 1000, (1,)).item())  # printed, harmless
f = torch.compile(lambda t: (t * 2).sin().cumsum(0))
x = torch.ones(64) * (1.0 + run * 1e-3)  # the real difference
print(f(x).sum().item())
"""


def test_a_printed_random_tag_does_not_hide_the_root_that_mattered(tmp_path):
    """An early random value the program only prints is a root whose value
    the program read; it must not be ranked above the root whose difference
    reached the results (a first version of Note [Differences the program
    carried] moved it to the top; found by a review)."""
    rc, out = _hunt_script(tmp_path, _RUN_TAG_SCRIPT)
    assert rc == 1, out
    head = out.split("FIRST DIVERGENCE")[1].splitlines()[0]
    assert "randint" not in head, out
