"""What a recording did not see is said, and a comparison of incomplete
recordings gives no "match": compiled launches on threads a recording does
not follow (Note [Launches no recording follows]), programs that end by
os._exit (Note [Programs that end by os._exit]), and the hunt's verdict on
incomplete runs (Note [A match needs whole recordings])."""
from __future__ import annotations

import subprocess
import sys
import threading
import warnings

import pytest
import torch

import kdebug
from kdebug import DebugMode


@pytest.fixture(scope="module")
def compiled():
    f = torch.compile(lambda t: (t * 2).sin() + 1)
    f(torch.randn(32))
    return f


def _on_a_thread(fn, *args):
    out = []
    th = threading.Thread(target=lambda: out.append(fn(*args)))
    th.start()
    th.join()
    return out[0]


def test_launches_on_a_thread_the_recording_does_not_follow_make_it_incomplete(compiled):
    x = torch.randn(32)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        with DebugMode() as dm:
            compiled(x)  # this thread: recorded
            _on_a_thread(compiled, x)  # another thread: not recorded, counted
    st = dm.kernel_stats
    assert st["launches"] == 1 and st["other_thread_launches"] == 1 and not st["complete"], st
    assert not dm.complete
    assert any("ran on threads this recording does not follow" in str(m.message) for m in w), [str(m.message) for m in w]
    assert "1 launch(es) on threads this recording does not follow" in dm.debug_string()


def test_a_recording_of_every_thread_or_of_no_thread_misses_nothing(compiled):
    x = torch.randn(32)
    with DebugMode(record_all_threads=True) as dm:
        compiled(x)
        _on_a_thread(compiled, x)
    st = dm.kernel_stats
    assert st["launches"] == 2 and st["other_thread_launches"] == 0 and st["complete"], st
    _on_a_thread(compiled, x)  # no recording active: nothing is missed by anyone
    with DebugMode() as dm:
        compiled(x)
    assert dm.kernel_stats["other_thread_launches"] == 0 and dm.complete


def test_the_count_survives_the_trace(compiled, tmp_path):
    x = torch.randn(32)
    path = str(tmp_path / "t.kdt")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with DebugMode(trace=path) as dm:
            _on_a_thread(compiled, x)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        run = kdebug.load(path)
    assert run.meta["stats"]["other_thread_launches"] == 1 and not run.complete
    assert any("ran on threads the recording did not follow" in str(m.message) for m in w)


_THREAD_SCRIPT = """
import os, sys, threading, torch
counter = sys.argv[1]
run = int(open(counter).read()) if os.path.exists(counter) else 0
open(counter, "w").write(str(run + 1))
f = torch.compile(lambda t: (t * 2).sin() + 1)
def work():  # everything on a worker thread; the main thread's recording matches
    x = torch.full((64,), 1.0 + run * 1e-3)
    print(float(f(x).sum()))
th = threading.Thread(target=work)
th.start()
th.join()
"""

_OS_EXIT_SCRIPT = """
import os, sys, torch
counter = sys.argv[1]
run = int(open(counter).read()) if os.path.exists(counter) else 0
open(counter, "w").write(str(run + 1))
f = torch.compile(lambda t: (t * 2).sin().sum())
print(f(torch.ones(16)).item())
print(f(torch.full((16,), 1.0 + run * 1e-3)).item())  # differs in run 1
sys.stdout.flush()
os._exit(0)  # skips the interpreter's teardown
"""


def _hunt(tmp_path, text: str, *opts: str) -> tuple[int, str]:
    script = tmp_path / "script.py"
    script.write_text(text)
    p = subprocess.run([sys.executable, "-m", "kdebug", "hunt", "--no-magnitude", *opts, str(script),
                        str(tmp_path / "counter")], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    return p.returncode, p.stdout + p.stderr


def test_hunt_of_incomplete_runs_that_match_gives_no_verdict(tmp_path):
    """The compiled work runs on a worker thread: the recorded parts match
    (nothing compiled on the main thread), and the hunt says it cannot tell
    (exit 2) instead of "all runs match"; --all-threads records the worker
    and names the difference."""
    rc, out = _hunt(tmp_path, _THREAD_SCRIPT, "--keep", str(tmp_path / "kept"), "--html", str(tmp_path / "r.html"))
    assert rc == 2 and "INCOMPLETE" in out and "no verdict" in out and "all runs match" not in out, out
    assert "--all-threads" in out
    # each gap listed once (the comparison counts them; the hunt's summary lists them), and no advice
    # to record hashes, which the hunt does: nothing was recorded at all
    assert out.count("ran on threads the recording did not follow") == 2, out
    assert "INCOMPLETE: 2 gap(s)" in out and "no launch or op was recorded" in out and "log_tensor_hashes" not in out
    # the kept traces, hunt.json and the page are still written, saying so
    import json

    from kdebug import report
    hunt = json.loads((tmp_path / "kept" / "hunt.json").read_text())
    assert hunt["incomplete"] and all(x.startswith("run ") for x in hunt["incomplete"])
    assert (tmp_path / "r.html").exists()
    runs, found = report.resolve_inputs([str(tmp_path / "kept")])
    (c,) = report.build(runs, hunt=found)[0]["comparisons"]
    assert c["gaps"] and c["verdict"] != "match", c["verdict"]
    (tmp_path / "counter").unlink()
    rc, out = _hunt(tmp_path, _THREAD_SCRIPT, "--all-threads")
    assert rc == 1 and "DIVERGE" in out and "INCOMPLETE" not in out, out


def test_a_program_that_ends_by_os_exit_is_recorded_whole(tmp_path):
    """os._exit ends the process with no cleanup: the runner closes the
    recording first, so the second, differing result is in the trace."""
    rc, out = _hunt(tmp_path, _OS_EXIT_SCRIPT)
    assert rc == 1 and "FIRST DIVERGENCE" in out and "INCOMPLETE" not in out, out
    assert "did not finish" not in out, out


def test_a_script_option_that_prefixes_a_hunt_option_is_the_scripts(tmp_path):
    """Everything after the script is the script's: `--n 16` is not taken as
    an abbreviation of --nproc (argparse's prefix matching is off)."""
    script = tmp_path / "echo.py"
    script.write_text("import sys\nassert sys.argv[1:] == ['--n', '16', '--conf', 'x'], sys.argv\n")
    p = subprocess.run([sys.executable, "-m", "kdebug", "hunt", "--no-magnitude", str(script), "--n", "16",
                        "--conf", "x"], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    out = p.stdout + p.stderr
    assert "ambiguous option" not in out and "exited with status" not in out, out
    assert "2 runs of" in out, out


_FORK_SCRIPT = """
import os, sys, torch
f = torch.compile(lambda t: (t * 2).sin().sum())
print(f(torch.ones(16)).item())
pid = os.fork()
if pid == 0:
    os._exit(0)  # a worker's exit: at once, closing nothing of the parent's
os.waitpid(pid, 0)
try:
    os._exit("bye")  # refused by os._exit itself: raises, the recording stays open
except TypeError:
    pass
print(f(torch.full((16,), 2.0)).item())  # recorded
os._exit(3)
"""


def test_os_exit_closes_the_recording_only_where_it_was_entered(tmp_path):
    """Note [Programs that end by os._exit]: a forked child's os._exit exits
    at once (it finished the parent's recording at every DataLoader worker's
    exit, printing a false "recorded" line), a refused call raises as it
    would with the recording still open, and the parent's os._exit(3)
    closes the recording and exits 3."""
    (tmp_path / "fork.py").write_text(_FORK_SCRIPT)
    p = subprocess.run([sys.executable, "-m", "kdebug", "record", "-o", "f.kdt", "--", "fork.py"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 3, p.stdout + p.stderr
    assert p.stderr.count("kdebug: recorded") == 1, p.stderr
    run = kdebug.load(str(tmp_path / "f.kdt"))
    assert run.complete and len(run.kernels) == 2, (run.problems(), len(run.kernels))


def _two_recordings(compiled, tmp_path, worker_differs: bool):
    """Two recordings of the same main-thread work; the compiled work on a
    worker thread (not followed) gets other inputs in the second when
    ``worker_differs``."""
    paths = []
    for i in range(2):
        path = str(tmp_path / f"r{i}.kdt")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with DebugMode(trace=path) as dm, DebugMode.log_tensor_hashes("bitwise", hash_inputs=True):
                compiled(torch.ones(32))
                if worker_differs:  # its input made on the worker too: no op of it is recorded
                    _on_a_thread(lambda v: compiled(torch.full((32,), v)), 1.0 + i)
        paths.append((dm, path))
    return paths


def test_diff_report_and_compare_of_incomplete_recordings_that_match_give_no_verdict(compiled, tmp_path, capsys):
    """Note [A match needs whole recordings] beyond the hunt: what the worker
    thread computed differed and was not recorded; kdebug.compare, kdebug diff
    and the HTML report say the recorded parts match and give no verdict (a
    helper's adversarial pass found all three saying "all match", exit 0)."""
    from kdebug import report
    from kdebug.cli import main as cli

    (dm0, p0), (dm1, p1) = _two_recordings(compiled, tmp_path, worker_differs=True)
    for a, b in ((dm0, dm1), (p0, p1)):  # live recordings and their traces
        rep = kdebug.compare(a, b)
        assert rep.ok and rep.verdict == "no verdict" and not rep, str(rep)
        assert any(g.startswith("run 0:") for g in rep.gaps) and any(g.startswith("run 1:") for g in rep.gaps)
        text = str(rep)
        assert "NO VERDICT" in text and "INCOMPLETE: run 1:" in text and "matching inputs and outputs" not in text
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rc = cli(["diff", p0, p1])
    out = capsys.readouterr().out
    assert rc == 2 and "NO VERDICT" in out, out
    meta, _ = report.build([p0, p1])
    (c,) = meta["comparisons"]
    assert c["verdict"] == "no verdict: incomplete" and c["gaps"] and c["ok"], c["verdict"]
    # whole recordings of the same work: a match, exit 0
    (dm0, p0), (dm1, p1) = _two_recordings(compiled, tmp_path, worker_differs=False)
    rep = kdebug.compare(p0, p1)
    assert rep.verdict == "match" and rep and not rep.gaps, str(rep)
    assert cli(["diff", p0, p1]) == 0, capsys.readouterr().out
    assert report.build([p0, p1])[0]["comparisons"][0]["verdict"] == "match"


def test_assert_deterministic_gives_no_pass_to_incomplete_runs(compiled):
    """The runs' compiled work on a worker thread differs, unrecorded: the
    check says it has no verdict instead of passing."""
    calls = []

    def fn():
        calls.append(1)
        compiled(torch.ones(32))
        _on_a_thread(lambda v: compiled(torch.full((32,), v)), float(len(calls)))

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(AssertionError, match="no verdict") as e:
            kdebug.assert_deterministic(fn)
        assert "all_threads=True" in str(e.value)
        # every thread recorded: the worker's difference is found
        with pytest.raises(AssertionError, match="runs differ"):
            kdebug.assert_deterministic(fn, all_threads=True)
        # three runs, the third one differing on the main thread too: the difference, not "no verdict"
        main_calls = []

        def fn3():
            main_calls.append(1)
            compiled(torch.ones(32) * (1.0 if len(main_calls) < 3 else 2.0))
            _on_a_thread(lambda v: compiled(torch.full((32,), v)), 1.0)

        with pytest.raises(AssertionError, match="runs differ"):
            kdebug.assert_deterministic(fn3, runs=3)
