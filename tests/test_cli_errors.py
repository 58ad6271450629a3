"""The CLI on bad input (issue 16, part 4): one-line errors with exit status 2
before any work, the recorded script's own exit message kept, hunt's options
after the script, hunt's temp directory removed, --help without torch."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import kdebug

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(kdebug.__file__)))


def _cli(*args: str, cwd=None, env=None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": ROOT, **(env or {})}
    return subprocess.run([sys.executable, "-m", "kdebug", *args], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=600)


def _script(tmp_path, body: str, name="prog.py"):
    p = tmp_path / name
    p.write_text(textwrap.dedent(body))
    return str(p)


def test_record_into_a_missing_directory_fails_before_running(tmp_path):
    ran = tmp_path / "ran"
    prog = _script(tmp_path, f"open({str(ran)!r}, 'w').write('yes')\n")
    p = _cli("record", "-o", str(tmp_path / "missing" / "r.kdt"), "--", "python", prog)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert p.stderr.strip().count("\n") == 0 and "does not exist" in p.stderr
    assert not ran.exists()
    link = tmp_path / "link.kdt"
    link.symlink_to(tmp_path / "elsewhere.kdt")
    p = _cli("record", "-o", str(link), "--", "python", prog)
    assert p.returncode == 2 and "symbolic link" in p.stderr and not ran.exists()
    assert not (tmp_path / "elsewhere.kdt").exists()


def test_sys_exit_message_of_a_recorded_script_is_printed(tmp_path):
    prog = _script(tmp_path, "import sys\nsys.exit('the data set is missing')\n")
    p = _cli("record", "-o", str(tmp_path / "r.kdt"), "--", "python", prog)
    direct = subprocess.run([sys.executable, prog], capture_output=True, text=True)
    assert p.returncode == direct.returncode == 1
    assert "the data set is missing" in p.stderr and "the data set is missing" in direct.stderr
    prog = _script(tmp_path, "import sys\nsys.exit(3)\n", "three.py")
    assert _cli("record", "-o", str(tmp_path / "r3.kdt"), "--", prog).returncode == 3


_ARGV_PROG = """
    import json, sys, torch
    open(sys.argv[0] + ".argv", "a").write(json.dumps(sys.argv[1:]) + "\\n")
    (torch.arange(8.0) * 2).sum()
"""


def test_hunt_options_after_the_script_belong_to_it_with_a_warning(tmp_path):
    prog = _script(tmp_path, _ARGV_PROG)
    p = _cli("hunt", "--runs", "2", prog, "--html", "x.html", cwd=tmp_path, env={"TMPDIR": str(tmp_path)})
    assert p.returncode == 0, p.stderr
    assert "WARNING: '--html' comes after the script, so it is passed to" in p.stderr
    assert (tmp_path / "prog.py.argv").read_text().splitlines() == ['["--html", "x.html"]'] * 2
    assert not (tmp_path / "x.html").exists()
    # after --, meant for the script: no warning
    p = _cli("hunt", "--", prog, "--html", "y.html", cwd=tmp_path, env={"TMPDIR": str(tmp_path)})
    assert p.returncode == 0 and "WARNING" not in p.stderr


def _hunt_dirs(d) -> list[str]:
    return [f.name for f in d.iterdir() if f.name.startswith("kdebug-hunt-")]  # (Inductor puts its cache here too)


def test_hunt_removes_its_temp_directory_unless_kept(tmp_path):
    prog = _script(tmp_path, _ARGV_PROG)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    p = _cli("hunt", prog, env={"TMPDIR": str(tmp)})
    assert p.returncode == 0, p.stderr
    assert _hunt_dirs(tmp) == [] and "traces removed; kdebug hunt --keep DIR keeps them" in p.stdout
    keep = tmp_path / "kept"
    p = _cli("hunt", "--keep", str(keep), prog, env={"TMPDIR": str(tmp)})
    assert p.returncode == 0 and f"traces in {keep}" in p.stdout
    assert sorted(f.name for f in keep.iterdir() if f.suffix == ".kdt") == ["run0.kdt", "run1.kdt"]
    assert _hunt_dirs(tmp) == []
    p = _cli("hunt", "--html", str(tmp_path / "nowhere" / "r.html"), prog, env={"TMPDIR": str(tmp)})
    assert p.returncode == 2 and "does not exist" in p.stderr and "recording" not in p.stderr


def test_help_and_argument_errors_do_not_import_torch():
    code = ("import sys\nfrom kdebug.cli import main\n"
            "for argv in (['--help'], ['hunt', '--help'], ['show'], ['nope']):\n"
            "    try:\n        main(argv)\n    except SystemExit as e:\n        assert e.code in (0, 2), e.code\n"
            "print('torch' in sys.modules)\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, "PYTHONPATH": ROOT},
                       cwd=ROOT, timeout=120)
    assert p.returncode == 0 and p.stdout.strip().splitlines()[-1] == "False", p.stdout + p.stderr


def test_refusals_before_running_do_not_import_torch(tmp_path):
    """What the CLI refuses before any work (a hunt.json kdebug did not write,
    a path that is not there, an output that cannot be written, an option
    hunt --nproc refuses, a missing script) is said without importing torch."""
    (tmp_path / "hunt.json").write_text('{"nproc": 0}')
    prog = _script(tmp_path, "print('ran')\n")
    nowhere = str(tmp_path / "nowhere" / "out")
    argvs = [["report", str(tmp_path), "-o", str(tmp_path / "r.html")],
             ["report", str(tmp_path / "missing.kdt"), "-o", str(tmp_path / "r.html")],
             ["record", "-o", nowhere, "--", "python", prog],
             ["hunt", "--html", nowhere, prog],
             ["hunt", "--nproc", "2", "--in-process", prog],
             ["hunt", "--nproc", "2"]]
    argvs += [[cmd, str(tmp_path / "missing.py")] for cmd in ("accuracy", "nan", "minify", "analyze")]
    code = ("import sys\nfrom kdebug.cli import main\n"
            f"for argv in {argvs!r}:\n"
            "    assert main(argv) == 2, argv\n"
            "print('torch' in sys.modules)\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, "PYTHONPATH": ROOT},
                       cwd=ROOT, timeout=120)
    assert p.returncode == 0 and p.stdout.strip().splitlines()[-1] == "False", p.stdout + p.stderr
    assert "nproc must be a whole number of at least 1" in p.stderr and "no such trace file" in p.stderr, p.stderr
    assert "--in-process cannot be used with --nproc" in p.stderr and "give the script" in p.stderr, p.stderr
    assert p.stderr.count("does not exist") == 2 and p.stderr.count("no such script") == 4, p.stderr
    assert "ran" not in p.stdout and not (tmp_path / "r.html").exists()


def test_a_recorded_script_sees_the_file_and_path_python_gives_it(tmp_path):
    """kdebug record runs the script as `python script.py` would: an absolute
    __file__ (it was the path as typed, so a script that changes directory
    and then reads Path(__file__).parent / 'config.json' failed under kdebug
    only, and a hunt told the user to fix the program) and sys.path[0] the
    directory of the script with symlinks resolved; a `..` after a symlinked
    directory names the file the OS opens, not the one abspath's text names."""
    real = tmp_path / "proj"
    real.mkdir()
    (real / "config.json").write_text("{}")
    (real / "helper_mod.py").write_text("VALUE = 7\n")
    _script(real, """
        import os, pathlib, sys
        os.chdir(sys.argv[1])
        import helper_mod
        cfg = pathlib.Path(__file__).resolve().parent / "config.json"
        print("FILE", __file__, os.path.isabs(__file__), cfg.exists(), helper_mod.VALUE)
    """, name="train.py")
    (tmp_path / "link.py").symlink_to(real / "train.py")
    (real / "sub").mkdir()
    (tmp_path / "w").mkdir()
    (tmp_path / "w" / "lnk").symlink_to(real / "sub")  # w/lnk/.. is proj for the OS, w as text
    out = tmp_path / "out"
    out.mkdir()
    for typed in ("proj/train.py", "link.py", "w/lnk/../train.py"):
        plain = subprocess.run([sys.executable, typed, str(out)], capture_output=True, text=True, cwd=tmp_path,
                               timeout=300)
        p = _cli("record", "-o", str(tmp_path / "t.kdt"), "--", "python", typed, str(out), cwd=tmp_path)
        assert p.returncode == 0, p.stdout + p.stderr
        line = next(x for x in p.stdout.splitlines() if x.startswith("FILE"))
        (_, got, *rest), (_, want, *rest_plain) = line.split(" "), plain.stdout.strip().split(" ")
        # the same file as python's __file__ (python keeps `..` in its text, kdebug gives the resolved path)
        assert os.path.samefile(got, want) and rest == rest_plain == ["True", "True", "7"], (line, plain.stdout)
        assert got == want or typed.startswith("w/")


def test_a_script_named_python_something_is_the_script_not_the_interpreter(tmp_path):
    """_split_command took any first word starting with "python" for the
    interpreter: `kdebug record -- python_step.py other.py` recorded
    other.py, and `kdebug record python_step.py --epochs 1` said 'no such
    script: --epochs' (an adversarial review)."""
    from kdebug.cli import _split_command

    assert _split_command(["--", "python_step.py", "other.py"]) == (["python_step.py", "other.py"], False)
    assert _split_command(["python3.11", "x.py", "-v"]) == (["x.py", "-v"], False)
    assert _split_command(["/usr/bin/env", "python3", "-m", "pkg.mod"]) == (["pkg.mod"], True)
    ran = tmp_path / "ran"
    step = _script(tmp_path, f"import sys; open({str(ran)!r}, 'w').write(sys.argv[0].rsplit('/', 1)[-1])\n",
                   name="python_step.py")
    _script(tmp_path, "raise SystemExit('other.py must not run')\n", name="other.py")
    p = _cli("record", "-o", str(tmp_path / "r.kdt"), "--", step, "other.py", cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-2000:]
    assert ran.read_text() == "python_step.py"


def test_python_options_and_compiled_programs_are_refused_with_what_to_do(tmp_path):
    prog = _script(tmp_path, "print('hi')\n")
    p = _cli("record", "-o", str(tmp_path / "r.kdt"), "--", "python", "-u", prog)
    assert p.returncode == 2 and "python option -u" in p.stderr and "PYTHONUNBUFFERED=1" in p.stderr, p.stderr
    p = _cli("record", "-o", str(tmp_path / "r.kdt"), "--", sys.executable)  # nothing after it
    assert p.returncode == 2, p.stderr
    p = _cli("record", "-o", str(tmp_path / "r.kdt"), "--", "/bin/ls")
    assert p.returncode == 2 and "is a compiled program, not a Python script" in p.stderr, p.stderr
    assert not (tmp_path / "r.kdt").exists()


def test_numeric_options_out_of_their_range_are_usage_errors(tmp_path, capsys):
    """Note [Option values]: kdebug accuracy took --rtol -1 and --rtol nan
    (float() accepts them), printed "100% outside rtol=-1" and exited 0.
    Every numeric option of accuracy refuses a value outside what it means, in
    argparse's usage line naming the option, before the script runs."""
    import pytest

    from kdebug.cli import main

    ran = tmp_path / "ran"
    prog = _script(tmp_path, f"open({str(ran)!r}, 'w').write('yes')\n")
    cases = [("--rtol", "-1", "must be a finite number >= 0, not -1"),
             ("--rtol", "nan", "must be a finite number >= 0, not nan"),
             ("--rtol", "inf", "must be a finite number >= 0, not inf"),
             ("--atol", "-1e-5", "must be a finite number >= 0, not -1e-5"),
             ("--atol", "NaN", "must be a finite number >= 0, not NaN"),
             ("--atol", "tiny", "must be a finite number >= 0, not 'tiny'"),
             ("--factor", "1", "must be a finite number > 1"),
             ("--factor", "inf", "must be a finite number > 1"),
             ("--factor", "nan", "must be a finite number > 1"),
             ("--calls-per-graph", "0", "must be an int >= 1 (graph calls checked), not 0"),
             ("--calls-per-graph", "1.5", "must be an int >= 1 (graph calls checked), not '1.5'"),
             ("--max-device-bytes", "-1", "must be an int >= 0 (bytes), not -1"),
             ("--max-host-bytes", "-8", "must be an int >= 0 (bytes), not -8"),
             ("--max-disk-bytes", "-1", "must be an int >= 0 (bytes), not -1"),
             ("--max-bytes", "-1", "must be an int >= 0 (bytes), not -1")]
    for opt, value, said in cases:
        with pytest.raises(SystemExit) as e:
            main(["accuracy", f"{opt}={value}", prog])
        err = capsys.readouterr().err
        assert e.value.code == 2 and f"kdebug accuracy: error: argument {opt}: {said}" in err, (opt, value, err)
    assert not ran.exists()
    with pytest.raises(SystemExit) as e:  # a width of 0 was a ZeroDivisionError traceback
        main(["demo", "--d", "0"])
    assert e.value.code == 2 and "argument --d: must be an int >= 1 (model width), not 0" in capsys.readouterr().err
    # values that mean something are still taken: a tolerance of 0 (exact), 0 bytes (no disk spill)
    import argparse

    from kdebug import accuracy_cli

    p = argparse.ArgumentParser()
    accuracy_cli.add_parser(p.add_subparsers())
    args = p.parse_args(["accuracy", "--rtol", "0", "--atol", "0", "--factor", "1.5", "--max-disk-bytes", "0", prog])
    assert (args.rtol, args.atol, args.factor, args.max_disk_bytes) == (0.0, 0.0, 1.5, 0)


def test_an_empty_output_path_is_a_usage_error(tmp_path, capsys, monkeypatch):
    """Note [Option values]: kdebug report -o '' and export -o '' failed with
    an error naming a temporary file beside the working directory
    (.../.name.<hex>.tmp -> ''), and an empty --json / --html was taken as
    no output at all.  Every output option refuses '' in argparse's usage line."""
    import pytest

    from kdebug import _files
    from kdebug.cli import main

    prog = _script(tmp_path, "print('ran')\n")
    trace = str(tmp_path / "run.kdt")
    cases = [(["report", trace, "-o", ""], "-o/--output"),
             (["export", "--perfetto", trace, "-o", ""], "-o/--output"),
             (["record", "-o", "", "--", "python", prog], "-o/--output"),
             (["diff", trace, trace, "--html", ""], "--html"),
             (["hunt", "--html", "", prog], "--html"),
             (["hunt", "--keep", "", prog], "--keep"),
             (["accuracy", "--json", "", prog], "--json"),
             (["accuracy", "--html", "", prog], "--html"),
             (["nan", "--json", "", prog], "--json"),
             (["analyze", "--json", "", prog], "--json"),
             (["analyze", "--html", "", prog], "--html"),
             (["minify", "--json", "", prog], "--json"),
             (["repro", trace, "--launch", "0", "-o", ""], "-o/--output")]
    for argv, opt in cases:
        with pytest.raises(SystemExit) as e:
            main(argv)
        err = capsys.readouterr().err
        what = "directory to write into" if argv[0] == "repro" or opt == "--keep" else "file to write"
        assert e.value.code == 2 and f"error: argument {opt}: the path is empty; give the {what}" in err, (argv, err)
    # the writer itself (kdebug.Run.write_html, an HTML report): no temp file beside the working directory
    sub = tmp_path / "sub"
    sub.mkdir()
    monkeypatch.chdir(sub)
    with pytest.raises(FileNotFoundError, match="the output path is empty"):
        with _files.replaced_atomically("") as f:
            f.write("x")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["prog.py", "sub"]


def test_a_keep_directory_holding_an_earlier_hunt_is_refused(tmp_path):
    """kdebug report DIR drew an earlier hunt's hunt.json over a later,
    failed hunt's traces (an adversarial review); the later hunt is refused
    before it runs, and the earlier files are left as they are."""
    prog = _script(tmp_path, "print('hi')\n")
    keep = tmp_path / "kept"
    keep.mkdir()
    (keep / "run0.kdt").write_bytes(b"earlier")
    p = _cli("hunt", "--keep", str(keep), prog)
    assert p.returncode == 2 and "holds an earlier hunt (run0.kdt)" in p.stderr, p.stderr
    assert (keep / "run0.kdt").read_bytes() == b"earlier" and sorted(os.listdir(keep)) == ["run0.kdt"]
    # a file of the user's that no hunt writes is no earlier hunt (the first version's *run*.kdt took
    # myrun.kdt and truncated.kdt for one: a review)
    other = tmp_path / "other"
    other.mkdir()
    (other / "myrun.kdt").write_bytes(b"mine")
    p = _cli("hunt", "--no-magnitude", "--keep", str(other), prog)
    assert p.returncode == 0 and (other / "myrun.kdt").read_bytes() == b"mine", p.stderr[-2000:]


def test_a_directory_with_a_main_is_a_script(tmp_path):
    """python runs a directory's __main__.py; kdebug record refused it
    ('cannot read pkgdir: Is a directory', a review of 476685c)."""
    d = tmp_path / "pkgdir"
    d.mkdir()
    (d / "__main__.py").write_text("import torch\nprint(torch.ones(2).sum())\n")
    p = _cli("record", "-o", str(tmp_path / "r.kdt"), "--", "python", str(d))
    assert p.returncode == 0 and "kdebug: recorded" in p.stderr, p.stderr[-2000:]
    (tmp_path / "empty").mkdir()
    p = _cli("record", "-o", str(tmp_path / "r2.kdt"), "--", str(tmp_path / "empty"))
    assert p.returncode == 2 and "without a __main__.py" in p.stderr, p.stderr


def test_a_forked_child_that_exits_says_nothing_of_the_recording(tmp_path):
    """A child the program forked, ending by sys.exit, went back through the
    runner and printed 'kdebug: recorded 4 kernel launch(es) ... into
    run.kdt' although its records are in no trace (Note [Forked children];
    an adversarial review): only the parent says what it recorded."""
    prog = _script(tmp_path, """
        import os, sys, torch
        f = torch.compile(lambda x: x.cos() + 1)
        x = torch.ones(8)
        f(x)
        pid = os.fork()
        if pid == 0:
            f(x); f(x); f(x)
            sys.exit(0)
        os.waitpid(pid, 0)
        f(x)
        """)
    p = _cli("record", "-o", str(tmp_path / "r.kdt"), "--", prog)
    said = [line for line in p.stderr.splitlines() if line.startswith("kdebug: recorded")]
    assert p.returncode == 0 and said == [f"kdebug: recorded 2 kernel launch(es) and 1 aten op(s) into "
                                          f"{tmp_path / 'r.kdt'}"], p.stderr[-2000:]


def test_output_cut_short_by_its_reader_ends_quietly(tmp_path):
    """`kdebug show run.kdt | head` ended in a BrokenPipeError traceback (noticed
    by a review): the command stops with the status of a process SIGPIPE
    ended, and says nothing."""
    import torch

    path = tmp_path / "big.kdt"
    f = torch.compile(lambda x: x.sin() * 2)
    with kdebug.DebugMode(trace=str(path)):
        for _ in range(3000):  # far more text than a pipe holds
            f(torch.ones(8))
    p = subprocess.Popen([sys.executable, "-m", "kdebug", "show", str(path)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, env={**os.environ, "PYTHONPATH": ROOT})
    p.stdout.readline()
    p.stdout.close()  # the reader goes away, as head does
    err = p.stderr.read().decode()
    assert p.wait(timeout=120) == 141 and "Traceback" not in err and "BrokenPipe" not in err, err[-2000:]
