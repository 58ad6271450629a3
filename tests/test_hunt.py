"""`kdebug hunt / record / show`, the pytest plugin, and real non-determinism on
the CPU: Inductor's C++ kernel for index_add accumulates with atomic adds
across OpenMP threads, so its output changes run to run (issue 4)."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch

import kdebug

pytest_plugins = ["pytester"]

needs_two_cores = pytest.mark.skipif(
    (os.cpu_count() or 1) < 2 or torch.get_num_threads() < 2,
    reason="the CPU non-determinism (atomic adds across OpenMP threads) needs two or more threads")


def kdebug_cli(*args: str, cwd=None, timeout=600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kdebug", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=timeout)


INDEX_ADD = """
import torch
torch.manual_seed(0)
x = torch.zeros(16)
idx = torch.randint(0, 16, (1_000_000,))
src = torch.randn(1_000_000)
f = torch.compile(lambda x, idx, src: x.index_add(0, idx, src).sin() * 2)
"""


@needs_two_cores
@pytest.mark.race
def test_compiled_index_add_is_named_in_process():
    """The atomic adds' order is the OpenMP threads' race: on a loaded
    machine one thread can finish before the other starts, in every run.
    The outputs themselves say whether the runs differed (torch.equal, not
    kdebug): runs that differed must be named; runs that did not skip."""
    ns: dict = {}
    exec(INDEX_ADD, ns)
    f, args = ns["f"], (ns["x"], ns["idx"], ns["src"])
    f(*args)
    outs = []

    def g(*a):
        outs.append(f(*a))
        return outs[-1]

    try:
        kdebug.assert_deterministic(g, *args, runs=3)
    except AssertionError as e:
        text = str(e)
    else:
        if all(torch.equal(outs[0], o) for o in outs[1:]):
            pytest.skip("the OpenMP threads added in the same order in every run (no race happened)")
        raise AssertionError(f"the runs' outputs differ but kdebug found them deterministic: {outs}")
    assert "FIRST DIVERGENCE: kernel #0 cpp_fused_index_add" in text
    assert "inputs identical, output out_ptr0" in text and "non-deterministic" in text
    assert "torch.use_deterministic_algorithms(True)" in text


@needs_two_cores
def test_hunt_builtin_workload_names_the_atomic_kernel(builtin_hunt):
    p, html = builtin_hunt.proc, builtin_hunt.html
    assert p.returncode == 1, p.stdout + p.stderr
    out = p.stdout
    assert "Run 1: comparing with run 0 ... 14 kernels" in out
    assert "FIRST DIVERGENCE: kernel #0 cpp_fused_div_index_add_zeros_0" in out
    assert "inputs identical, output out_ptr0" in out and "bitwise 0x" in out
    # the hunt records the stats hash: how big the difference is (issue 15 part 5)
    assert re.search(r"absmax \S+ (both|vs \S+); sum differs by [-+]\d", out), out
    assert "later launches/ops changed because of it" in out
    assert "runs DIVERGE" in out
    assert "2/2" in p.stderr  # the progress bar
    # --html: the report of the same comparison; hunt.json lets `kdebug report DIR` redraw it
    from kdebug import report

    assert f"wrote {html}" in out and html.stat().st_size > 0
    runs, hunt = report.resolve_inputs([str(builtin_hunt.keep)])
    assert hunt["runs"] == 2 and "BucketedBlock" in hunt["what"] and len(runs) == 2
    meta, _ = report.build(runs, hunt=hunt)
    d = meta["comparisons"][0]["divergence"]
    assert d["kind"] == "output" and d["a"]["name"] == "cpp_fused_div_index_add_zeros_0"


@needs_two_cores
def test_hunt_try_fixes_says_which_fix_works(builtin_hunt):
    p = builtin_hunt.proc
    assert p.returncode == 1, p.stdout + p.stderr
    assert "torch.use_deterministic_algorithms(True): REMOVES the divergence" in p.stdout
    assert "torch._inductor.config.deterministic = True: does not remove it" in p.stdout


def test_a_fix_the_program_fails_with_is_kept_as_not_judged(tmp_path):
    # the program diverges (a planted random perturbation) and refuses to run
    # under torch.use_deterministic_algorithms(True): that fix is tried, and
    # kept in hunt.json as null (the page says the program failed with it)
    import json

    script = tmp_path / "picky.py"
    script.write_text(textwrap.dedent("""
        import random
        import torch
        from kdebug.testing import perturb_kernel_output
        if torch.are_deterministic_algorithms_enabled():
            raise SystemExit("picky.py: refuses deterministic algorithms")
        f = torch.compile(lambda x: (x.sin() * 2).cos() + 1)
        x = torch.linspace(-1, 1, 64)
        f(x)
        with perturb_kernel_output("cpp_fused_", "out_ptr0", 0, random.SystemRandom().uniform(0.25, 0.75)):
            f(x)
    """))
    keep = tmp_path / "keep"
    p = kdebug_cli("hunt", "--in-process", "--no-magnitude", "--try-fixes", "--fixes", "deterministic_algorithms",
                   "--keep", str(keep), "--html", str(tmp_path / "r.html"), str(script), cwd=tmp_path)
    assert p.returncode == 1, p.stdout + p.stderr
    assert "torch.use_deterministic_algorithms(True): the program failed with it" in p.stdout
    assert json.loads((keep / "hunt.json").read_text())["fixes"] == {"torch.use_deterministic_algorithms(True)": None}
    page = (tmp_path / "r.html").read_text()
    meta = json.loads(re.search(r'<script id="kd-meta" type="application/json">(.*?)</script>', page, re.S)[1])
    assert meta["hunt"]["fixes"] == {"torch.use_deterministic_algorithms(True)": None}


def test_hunt_in_process_deterministic_script_exits_0(tmp_path):
    script = tmp_path / "det.py"
    script.write_text(textwrap.dedent("""
        import torch
        f = torch.compile(lambda x: (x.sin() @ x.T).softmax(-1).sum(0))
        f(torch.arange(64.0).reshape(8, 8) / 64)
    """))
    p = kdebug_cli("hunt", "--runs", "2", "--in-process", str(script), cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "all runs match" in p.stdout and "have matching inputs and outputs" in p.stdout


def test_hunt_errors_exit_2(tmp_path):
    script = tmp_path / "boom.py"
    script.write_text("raise RuntimeError('boom')\n")
    p = kdebug_cli("hunt", str(script), cwd=tmp_path)
    assert p.returncode == 2 and "exited with status 1" in p.stderr and "boom" in p.stderr
    p = kdebug_cli("hunt", str(tmp_path / "missing.py"))
    assert p.returncode == 2 and "no such script" in p.stderr
    p = kdebug_cli("hunt", "--runs", "1")
    assert p.returncode == 2 and "--runs must be at least 2" in p.stderr


def test_record_then_show(tmp_path):
    script = tmp_path / "prog.py"
    script.write_text(textwrap.dedent("""
        import sys, torch
        f = torch.compile(lambda x: torch.relu(x) * 3 + 1)
        print("result", float(f(torch.randn(32)).sum() > -1e9), sys.argv[1:])
    """))
    out = tmp_path / "run.kdt"
    p = subprocess.run([sys.executable, "-m", "kdebug", "record", "-o", str(out), "--", "python", str(script), "a1"],
                       capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert "result 1.0 ['a1']" in p.stdout and "recorded 1 kernel launch" in p.stderr
    s = kdebug_cli("show", str(out))
    assert s.returncode == 0 and "[cpp] cpp_fused_" in s.stdout and "post-kernel hashes" in s.stdout
    assert "aten::randn" in s.stdout


PLUGIN_TESTS = """
import random
import pytest
import torch
from kdebug.testing import perturb_kernel_output

g = torch.compile(lambda a: a.cos() * 2 + 1)
h = torch.compile(lambda a: a.sin() * 3)
a = torch.randn(64)
h(a)  # compiled before the planted fault looks for its kernel


def noisy(a):
    # planted: the kernel's output gets another value in every call (the
    # plugin's mechanism is under test here, not whether a thread race fires)
    with perturb_kernel_output("cpp_fused_mul_sin", "out_ptr0", 0, random.SystemRandom().uniform(0.25, 0.75)):
        return h(a)

@pytest.mark.kdebug_deterministic(runs=2)
def test_marked_deterministic():
    g(a)

@pytest.mark.kdebug_deterministic(runs=3)
def test_marked_non_deterministic():
    noisy(a)

def test_fixture_deterministic(kdebug_determinism):
    reports = kdebug_determinism.check(g, a, runs=3)
    assert len(reports) == 2 and all(r.ok for r in reports)

def test_fixture_non_deterministic(kdebug_determinism):
    kdebug_determinism.check(noisy, a)
"""


def test_pytest_plugin_marker_fixture_and_report_section(pytester):
    pytester.makepyfile(test_det=PLUGIN_TESTS)
    r = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rA")
    r.assert_outcomes(passed=2, failed=2)
    out = r.stdout.str()
    assert out.count("kdebug first divergence") >= 2  # the report section of each failure
    assert "FIRST DIVERGENCE: kernel #0 cpp_fused_mul_sin" in out
    assert "PASSED test_det.py::test_marked_deterministic" in out
    assert "FAILED test_det.py::test_marked_non_deterministic" in out


# ---------------------------------------------------------------- the built-in hunt's runs, re-launched
# (these read the builtin_hunt session fixture, like the tests above: in one file, so that
# pytest -n 2 --dist loadfile makes the hunt once)

def _repro_cli(*args, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kdebug", *args], capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(os.path.abspath(__file__)))},
                          timeout=600)


@needs_two_cores
def test_rerun_of_the_builtin_index_add_kernel_varies(builtin_hunt, tmp_path):
    # a run the hunt recorded (conftest): python -m kdebug._runner --out run0.kdt --builtin, in a fresh process
    p = builtin_hunt.proc
    assert p.returncode == 1, p.stdout + p.stderr
    run0 = __import__("json").loads((builtin_hunt.keep / "hunt.json").read_text())["paths"][0]
    shutil.copyfile(builtin_hunt.keep / run0, tmp_path / "run.kdt")
    p = _repro_cli("rerun", "run.kdt", "--launch", "0", "--times", "5", cwd=tmp_path)
    assert p.returncode == 1, p.stdout + p.stderr
    assert "cpp_fused_div_index_add_zeros_0 (launch 0) re-launched 5x on the recorded inputs" in p.stdout
    assert "INTRINSICALLY NONDETERMINISTIC" in p.stdout


@needs_two_cores
def test_repro_from_a_kept_hunt_reproduces_its_first_root(builtin_hunt, tmp_path):
    # kdebug repro --from-hunt DIR: the hunt's hunt.json names the runs; root 1 is the index_add kernel
    p = builtin_hunt.proc
    assert p.returncode == 1, p.stdout + p.stderr
    p = _repro_cli("repro", "--from-hunt", str(builtin_hunt.keep), "-o", str(tmp_path / "r"), cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "cpp_fused_div_index_add_zeros_0" in p.stdout and (tmp_path / "r" / "repro.py").exists()
    # a hunt.json that points outside its directory is refused, never followed
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "hunt.json").write_text('{"paths": ["/etc/passwd", "run1.kdt"]}')
    p = _repro_cli("repro", "--from-hunt", str(bad), "-o", str(tmp_path / "r2"), cwd=tmp_path)
    assert p.returncode == 2 and "is not a kept hunt" in p.stderr and "paths must be" in p.stderr, p.stderr
    assert "Traceback" not in p.stderr and not (tmp_path / "r2").exists()


@needs_two_cores
def test_hunt_of_the_builtin_workload_states_the_relaunch_verdict(builtin_hunt):
    p = builtin_hunt.proc  # kdebug hunt --rerun-times 5 of the built-in workload (conftest)
    assert p.returncode == 1, p.stdout + p.stderr
    hunt = __import__("json").loads((builtin_hunt.keep / "hunt.json").read_text())
    m = hunt["magnitude"][0]
    r = m["rerun"]
    assert m["root"] == "kernel #0 cpp_fused_div_index_add_zeros_0" and r["times"] == 5
    assert f"re-launched 5x on the recorded inputs: {r['distinct']} different output" in p.stdout
    assert r["verdict"] == ("intrinsic" if r["distinct"] > 1 else "stable")
    # the same repro, launched again by kdebug rerun's script: the same kind of verdict on the same inputs
    again = subprocess.run([sys.executable, str(builtin_hunt.keep / m["repro"] / "repro.py"), "--times", "5"],
                           capture_output=True, text=True, timeout=600)
    assert "launched 5 time(s) on the recorded inputs" in again.stdout



BOTH_MARKERS = """
import time, torch, pytest

f = torch.compile(lambda t: (t * 2).sin() + 1)

@pytest.mark.kdebug_matches_eager()
@pytest.mark.kdebug_deterministic(runs=2)
def test_both_markers():
    torch.manual_seed(time.time_ns() % 1000003)  # another draw each run: not deterministic
    f(torch.randn(16))
"""


def test_pytest_plugin_runs_both_checks_of_a_test_with_both_markers(pytester):
    """kdebug_matches_eager returned before kdebug_deterministic was looked
    at, so a test carrying both passed whatever its determinism (found by a
    trust pass); both checks run now."""
    pytester.makepyfile(test_both=BOTH_MARKERS)
    r = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rA")
    r.assert_outcomes(failed=1)
    assert "the test body is not deterministic" in r.stdout.str()


BAD_MARKERS = """
import pytest

RAN = []

@pytest.mark.kdebug_deterministic(run=5)
def test_misspelt():
    RAN.append("misspelt")

@pytest.mark.kdebug_deterministic(runs="three")
def test_runs_str():
    RAN.append("runs_str")

@pytest.mark.kdebug_deterministic(runs=1)
def test_runs_one():
    RAN.append("runs_one")

@pytest.mark.kdebug_deterministic(runs=2, all_threads="False")
def test_bool_str():
    RAN.append("bool_str")

@pytest.mark.kdebug_deterministic(3, runs=2)
def test_positional():
    RAN.append("positional")

@pytest.mark.kdebug_deterministic(runs=2, hash_fn="nonsense")
def test_hash_fn():
    RAN.append("hash_fn")

@pytest.mark.kdebug_deterministic
async def test_async():
    RAN.append("async")

@pytest.mark.kdebug_matches_eager(rtl=1e-4)
def test_eager_misspelt():
    RAN.append("eager_misspelt")

@pytest.mark.kdebug_matches_eager(rtol=-1)
def test_eager_negative_rtol():
    RAN.append("eager_negative_rtol")

@pytest.mark.kdebug_matches_eager(atol=float("nan"))
def test_eager_nan_atol():
    RAN.append("eager_nan_atol")

@pytest.mark.kdebug_matches_eager(calls_per_graph=True)
def test_eager_bool_count():
    RAN.append("eager_bool_count")

@pytest.mark.kdebug_matches_eager(1e-4)
def test_eager_positional():
    RAN.append("eager_positional")

def test_fixture_arguments(kdebug_determinism, kdebug_accuracy):
    with pytest.raises(TypeError, match="kdebug_determinism.check: all_threads must be True or False"):
        kdebug_determinism.check(lambda: None, runs=2, all_threads="False")
    with pytest.raises(TypeError, match="kdebug_determinism.check: runs must be an int >= 2"):
        kdebug_determinism.check(lambda: None, runs=2.0)
    with pytest.raises(ValueError, match="kdebug_accuracy.check: rtol must be None or a finite number >= 0"):
        kdebug_accuracy.check(lambda: None, rtol=float("inf"))

def test_no_body_ran():  # runs last: no marked body above ran
    assert RAN == []
"""


def test_pytest_plugin_markers_refuse_bad_arguments_before_the_body_runs(pytester):
    """Note [Marker arguments]: kdebug_deterministic took runs="three" to a raw
    int() ValueError, ignored a misspelt run=5 (the body ran twice), made
    all_threads="False" True through bool(), dropped a positional argument
    next to runs=, and called an async def test's body, whose coroutine
    nothing awaited ("nothing was hashed").  Every marker's arguments are now
    checked alike, each bad one an error of its test, in one line that names
    the marker, the argument and what is allowed, with no traceback."""
    pytester.makepyfile(test_bad=BAD_MARKERS)
    r = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rA")
    r.assert_outcomes(passed=2, errors=12)
    out = r.stdout.str()
    det, eager = "@pytest.mark.kdebug_deterministic", "@pytest.mark.kdebug_matches_eager"
    for line in (
            f"{det} has no argument 'run' (did you mean 'runs'?); its arguments: "
            "kdebug_deterministic(runs=2, hash_fn='bitwise', all_threads=False)",
            f"{det}: runs must be an int >= 2 (how many times the body runs, recorded), not the str 'three'",
            f"{det}: runs must be an int >= 2 (how many times the body runs, recorded), not 1",
            f"{det}: all_threads must be True or False, not the str 'False'",
            f"{det} takes keyword arguments only, not the positional 3 (write kdebug_deterministic(runs=3))",
            f"{det}: hash_fn='nonsense' is not a hash kdebug knows",
            f"{det} does not support async def tests",
            f"{eager} has no argument 'rtl' (did you mean 'rtol'?)",
            f"{eager}: rtol must be None or a finite number >= 0, not -1",
            f"{eager}: atol must be None or a finite number >= 0, not nan",
            f"{eager}: calls_per_graph must be an int >= 1 (the calls of each compiled graph that are checked), "
            "not the bool True",
            f"{eager} takes keyword arguments only, not the positional 0.0001 (write kdebug_matches_eager(rtol=0.0001))"):
        assert line in out, line
    assert out.count("ERROR at setup of") == 12
    assert "Traceback" not in out and "pytest_plugin.py" not in out and "During handling" not in out, out
