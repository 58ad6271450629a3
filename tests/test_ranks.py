"""Per-rank traces, collective records and the cross-rank comparison, on gloo
(CPU) through torch's launcher (kdebug record --nproc 2)."""
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

import kdebug
from kdebug.ranks import rank_path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "tests", "dist_scripts", "ddp_step.py")


def test_rank_path():
    assert rank_path("run.kdt", 3) == "run.rank3.kdt"
    assert rank_path("/a.b/run", 0) == "/a.b/run.rank0"
    with pytest.raises(ValueError):
        rank_path("run.kdt", -1)


def _record(tmp_path, KD_NPROC="2", **env):
    out = str(tmp_path / "run.kdt")
    p = subprocess.run([sys.executable, "-m", "kdebug", "record", "--nproc", KD_NPROC, "-o", out, "--", SCRIPT],
                       env={**os.environ, "PYTHONPATH": ROOT, **env}, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:]
    return out


@pytest.mark.distributed
def test_planted_collective_output_names_collective_and_rank(tmp_path):
    out = _record(tmp_path, KD_FAULT="collective:1")
    run = kdebug.load(out)
    assert run.ranks == [0, 1] and run[1].meta["rank"] == 1 and run[1].meta["world_size"] == 2
    assert run[0].meta["groups"][0]["ranks"] == [0, 1]
    rep = kdebug.compare_ranks(run)
    assert not rep.ok
    first = rep.comparisons[0].findings[0]
    assert rep.comparisons[0].rank == 1
    assert first.step.name.startswith("c10d::allreduce_")
    assert "on rank 1" in first.text
    # the two sides are ranks of one run, named so (not "run 0" / "run 1")
    assert "rank 0 " in first.text and "rank 1 " in first.text and "run 0" not in first.text, first.text
    assert "run 0" not in str(rep) and "run 1" not in str(rep), str(rep)
    assert "non-deterministic" not in first.text  # one run's ranks: nothing about run to run
    # a collective cannot be reproduced alone: kdebug repro says so and points at the job's replay
    p = subprocess.run([sys.executable, "-m", "kdebug", "repro", rank_path(out, 1), "--op", str(first.step.index),
                        "-o", str(tmp_path / "r")], env={**os.environ, "PYTHONPATH": ROOT}, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 2 and "is a collective" in p.stderr and "--confirm" in p.stderr, p.stderr
    assert "Traceback" not in p.stderr and not (tmp_path / "r").exists()


@pytest.mark.distributed
def test_final_ddp_parameters_compared_without_marks(tmp_path):
    # Note [DDP final parameters]: rank 1's a.weight is changed after the optimizer
    # step (a planted rank-local parameter fault); the script marks nothing
    out = _record(tmp_path, KD_FAULT="param:1", KD_MARKS="0")
    rep = kdebug.compare_ranks(kdebug.load(out))
    assert not rep.ok
    finals = [f for f in rep.comparisons[0].findings if f.what == "replica"]
    assert [f.text.split("'")[1] for f in finals] == ["final DDP0 parameter a.weight"], [f.text for f in finals]
    assert "on rank 1" in finals[0].text


@pytest.mark.distributed
def test_planted_rank_local_kernel_fault_named_by_diff_ranks(tmp_path):
    # DDP(torch.compile(model)); torch.compile(DDP(model)) is the hunt test's (the script's default)
    out = _record(tmp_path, KD_FAULT="kernel:1", KD_FORM="inner")
    run = kdebug.load(out)
    assert all(len(r.kernels) > 0 for r in run), "the compiled DDP program's kernels were not recorded"
    p = subprocess.run([sys.executable, "-m", "kdebug", "diff", out, "--ranks"], env={**os.environ, "PYTHONPATH": ROOT},
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
    assert p.returncode == 1, p.stdout
    first = next(line for line in p.stdout.splitlines() if "REPLICAS DIVERGE" in line)
    assert "rank-local root" in first and "cpp_fused_relu" in first and "on rank 1" in first, p.stdout


def test_runner_says_when_torch_compile_captured_no_graph():
    import torch

    from kdebug import _runner, _upstream

    _upstream.dynamo_reset()
    # the hint reads dynamo's process-wide frame counters, as a fresh `kdebug
    # record` process has them: other tests in this process compiled frames
    torch._dynamo.utils.counters.clear()

    @torch.compile(backend="eager")
    def nothing(x):
        torch._dynamo.graph_break()
        return x

    nothing(torch.ones(2))
    got = _upstream.dynamo_frame_counts()
    assert got is not None and got[0] >= 1 and got[1] == 0
    hint = _runner.nothing_compiled_hint(0)
    assert hint is not None and "captured no graph" in hint and "DDP(torch.compile(model))" in hint
    assert _runner.nothing_compiled_hint(3) is None  # kernels were recorded: nothing to say

    @torch.compile(backend="eager")
    def something(x):
        return x * 2

    something(torch.ones(2))
    assert _runner.nothing_compiled_hint(0) is None  # a graph was captured (eager backend: no kernel)
    _upstream.dynamo_reset()


def _hunt(tmp_path, *opts, **env):
    return subprocess.run([sys.executable, "-m", "kdebug", "hunt", "--nproc", "2", *opts, SCRIPT],
                          env={**os.environ, "PYTHONPATH": ROOT, **env}, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=300)


def _page_meta(path) -> dict:
    import json
    import re

    page = path.read_text()
    return json.loads(re.search(r'<script id="kd-meta" type="application/json">(.*?)</script>', page, re.S)[1])


@dataclass(frozen=True)
class NprocHunt:
    proc: subprocess.CompletedProcess
    dir: Path  # the hunt's directory: the page per rank (r.rank{R}.html)
    keep: Path  # --keep: hunt.json and the traces, run{i}.rank{R}.kdt
    html: Path  # --html


@pytest.fixture(scope="module")
def nproc_hunt(tmp_path_factory) -> NprocHunt:
    """The hunt of test_hunt_nproc_names_the_rank_and_kernel_that_changed_between_runs,
    made once (seven two-rank jobs): rank 1's fused relu is perturbed in the
    second run only (the first run leaves the mark), by another value in
    every process: --confirm's re-runs see it recur and prove it by replay in
    rank 1.  The plant stands down under torch.use_deterministic_algorithms(True):
    --try-fixes must apply that fix in every rank to see it remove the
    divergence.  Its run 0, where nothing is planted, is also the job
    test_replicas_match reads."""
    d = tmp_path_factory.mktemp("nproc-hunt")
    keep, html = d / "hunt", d / "r.html"
    p = _hunt(d, "--keep", str(keep), "--confirm", "--confirm-tries", "1", "--try-fixes",
              "--fixes", "deterministic_algorithms", "--rerun-times", "3", "--html", str(html), KD_FAULT="kernel:1",
              KD_FAULT_FROM_SECOND_RUN=str(d / "mark"), KD_FAULT_VALUE="random",
              KD_FAULT_UNLESS_DETERMINISTIC="1")
    return NprocHunt(p, d, keep, html)


@pytest.mark.distributed
def test_hunt_nproc_names_the_rank_and_kernel_that_changed_between_runs(nproc_hunt):
    # (the hunt: the nproc_hunt fixture)
    p, tmp_path, keep, html = nproc_hunt.proc, nproc_hunt.dir, nproc_hunt.keep, nproc_hunt.html
    assert p.returncode == 1, p.stdout[-4000:]
    import json

    hunt = json.loads((keep / "hunt.json").read_text())
    assert hunt["nproc"] == 2 and set(hunt["ranks"]) == {"0", "1"}
    r1 = hunt["ranks"]["1"]
    assert not r1["match"] and r1["origin"] and "cpp_fused_relu" in r1["roots"][0]["root"]
    r0 = hunt["ranks"]["0"]  # rank 0 computed nothing differently: the all-reduce brought rank 1's change
    assert not r0["match"] and not r0["origin"]
    assert all(x["collective"] for x in r0["roots"] if x["kind"] == "root")
    assert [x["match"] for x in hunt["replicas"]] == [True, False]  # run 0: no fault; run 1: rank 1 differs
    assert "cpp_fused_relu" in hunt["replicas"][1]["first"] and "on rank 1" in hunt["replicas"][1]["first"]
    assert "the difference started on rank(s) [1]" in p.stdout
    assert hunt["confirm_rank"] == 1 and "cpp_fused_relu" in hunt["confirm"][0]["root"], hunt.get("confirm")
    assert hunt["confirm"][0]["confirmed"] is True, hunt["confirm"]
    # --try-fixes: the job ran again with the fix in every rank, and matched
    assert hunt["fixes"] == {"torch.use_deterministic_algorithms(True)": True}, p.stdout[-3000:]
    assert "torch.use_deterministic_algorithms(True): REMOVES the divergence" in p.stdout
    # the element-level re-run, for rank 1: the job ran once more, capturing in rank 1, and the
    # kernel re-launched alone was stable (the fault is planted around it, in the job)
    (mag,) = [m for m in hunt["magnitude"] if "cpp_fused_relu" in m["root"]]
    assert hunt["magnitude_rank"] == 1 and mag["rerun"]["verdict"] == "stable", hunt["magnitude"]
    # one page per rank; rank 1's carries the proof and the re-run, rank 0's neither; both the summary
    assert not html.exists()
    m0, m1 = _page_meta(tmp_path / "r.rank0.html"), _page_meta(tmp_path / "r.rank1.html")
    assert (m0["hunt"]["rank"], m1["hunt"]["rank"]) == (0, 1)
    assert m1["hunt"]["confirm"][0]["confirmed"] is True and m1["hunt"]["magnitude"]
    assert "confirm" not in m0["hunt"] and "magnitude" not in m0["hunt"]
    assert m0["hunt"]["summary"] == m1["hunt"]["summary"] == hunt["summary"]
    assert "the difference started on rank(s) [1]" in hunt["summary"]
    assert "cpp_fused_relu" in m1["comparisons"][0]["divergence"]["a"]["label"]
    assert "allreduce" in m0["comparisons"][0]["divergence"]["a"]["label"]
    # rank 0 received rank 1's difference through the all-reduce: its report and page say so, never
    # "non-deterministic"
    r0_text = p.stdout.split("=== rank 0: run to run ===")[1].split("=== rank 1")[0]
    assert "this collective returned another result" in r0_text and "op is non-deterministic" not in r0_text
    assert m0["comparisons"][0]["divergence"]["collective"] is True
    assert m1["comparisons"][0]["divergence"]["collective"] is False
    # kdebug report DIR draws the rank where the difference started
    from kdebug.report import build, resolve_inputs

    runs, found = resolve_inputs([str(keep)])
    assert found["rank"] == 1 and [os.path.basename(r) for r in runs] == ["run0.rank1.kdt", "run1.rank1.kdt"]


@pytest.mark.distributed
def test_replicas_match(nproc_hunt):
    # the job with no fault: run 0 of nproc_hunt's hunt (its fault is planted from the second run on)
    out = str(nproc_hunt.keep / "run0.kdt")
    assert os.path.exists(rank_path(out, 1)), nproc_hunt.proc.stdout[-4000:]
    rep = kdebug.compare_ranks(kdebug.load(out))
    assert rep.ok, str(rep)
    names = [op._name for op in kdebug.load(out)[1].operators if hasattr(op, "_name")]
    assert sum(n.startswith("c10d::allreduce_") for n in names) >= 2  # DDP's gradient all-reduces, both steps
    texts = [getattr(op, "_text", "") or "" for op in kdebug.load(out)[1].operators]
    finals = sorted(t.split("'")[1] for t in texts if "final DDP" in t)
    assert finals == ["final DDP0 parameter a.bias", "final DDP0 parameter a.weight",
                      "final DDP0 parameter b.bias", "final DDP0 parameter b.weight"], finals
    # a rank's trace says how to start its job again (kdebug repro / rerun of a rank's launch)
    from kdebug.repro import program_of

    prog = program_of(kdebug.load(rank_path(out, 1)))
    assert (prog.nproc, prog.rank, prog.target) == (2, 1, [SCRIPT])
    assert prog.runner_cmd("x.kdt")[1:3] == ["-m", "torch.distributed.run"] and prog.trace_of("x.kdt") == "x.rank1.kdt"


def test_hunt_nproc_refuses_options_it_does_not_support(tmp_path):
    p = _hunt(tmp_path, "--in-process")
    assert p.returncode == 2 and "--in-process cannot be used with --nproc" in p.stdout, p.stdout
    p = _hunt(tmp_path, "--try-fixes", "--fixes", "deterministic_algorithms,nonsense")
    assert p.returncode == 2 and "unknown fix(es) 'nonsense'" in p.stdout, p.stdout
    p = _hunt(tmp_path, "--fixes", "deterministic_algorithms")
    assert p.returncode == 2 and "add --try-fixes" in p.stdout, p.stdout
    p = subprocess.run([sys.executable, "-m", "kdebug", "hunt", "--nproc", "2"], env={**os.environ, "PYTHONPATH": ROOT},
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60)
    assert p.returncode == 2 and "give the script of the distributed job" in p.stdout


@pytest.mark.parametrize("program_fails", [False, True])
def test_hunt_nproc_says_when_a_rank_aborts_at_exit(tmp_path, program_fails):
    """Note [Gloo exit race]: a rank that std::terminate aborts as it exits
    (planted: an atexit hook prints what libstdc++ prints and aborts) makes
    the hunt stop; when every rank's program had finished with status 0 it
    says this is torch's exit race and to run again, and when a program
    failed (rank 1 raises) it does not blame torch."""
    # rank 1 aborts only once rank 0 has reached its interpreter's exit (a marker its own atexit hook
    # writes, after its runner said it finished): the launcher stops the other ranks as soon as one dies,
    # so without the wait whether rank 0 got to say it finished would be a race (CI at df599e6)
    script = tmp_path / "aborts_at_exit.py"
    marker = tmp_path / "rank0_at_exit"
    script.write_text(
        "import atexit, os, time\n"
        f"MARKER = {str(marker)!r}\n"
        "def die():\n"
        "    t = time.monotonic()\n"
        "    while not os.path.exists(MARKER) and time.monotonic() - t < 120:\n"
        "        time.sleep(0.05)\n"
        "    os.write(2, b'terminate called without an active exception\\n')\n"
        "    os.abort()\n"
        "def at_exit():\n"
        "    open(MARKER, 'w').close()\n"
        "if os.environ.get('RANK') == '0':\n"
        "    atexit.register(at_exit)\n"
        "if os.environ.get('RANK') == '1':\n"
        "    atexit.register(die)\n"
        + ("    raise RuntimeError('planted failure of the program')\n" if program_fails else ""))
    p = subprocess.run([sys.executable, "-m", "kdebug", "hunt", "--nproc", "2", str(script)],
                       env={**os.environ, "PYTHONPATH": ROOT}, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=300)
    assert p.returncode != 0, p.stdout
    assert "kdebug: rank 0 finished: status 0" in p.stdout, p.stdout
    if program_fails:
        assert "planted failure of the program" in p.stdout and "known torch race" not in p.stdout, p.stdout
        assert "fix the program first" in p.stdout, p.stdout
    else:
        assert "known torch race at exit" in p.stdout and "run the hunt again" in p.stdout, p.stdout
        assert "fix the program first" not in p.stdout, p.stdout  # it contradicted the line before


def test_runner_settles_only_in_a_rank(monkeypatch, capsys):
    """Note [Gloo exit race]: the runner gives the backend's threads time
    without the GIL before exit in a rank of a job, and only there."""
    from kdebug import _runner

    slept = []
    monkeypatch.setattr(_runner.time, "sleep", slept.append)
    for var in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    from kdebug import _upstream

    monkeypatch.setattr(_upstream, "dist_rank_world", lambda: None)  # no process group left by another test
    _runner.settle_ranks(0)
    assert slept == []
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    _runner.settle_ranks(3)
    assert slept == [_runner.SETTLE_S]
    assert "kdebug: rank 1 finished: status 3" in capsys.readouterr().err


@pytest.mark.distributed
def test_compiled_ddp_compiles_inside_the_recording(tmp_path):
    # a fresh Inductor cache: the compile (DDPOptimizer's, which dynamo runs with
    # the modes still active: Inductor traces on fake and meta tensors under
    # kdebug's mode) happens inside the recording; it is not recorded, and the
    # program's kernels are
    out = _record(tmp_path, TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"), KD_NPROC="1")
    run = kdebug.load(out)
    assert run.ranks == [0] and len(run[0].kernels) >= 2 and run[0].complete


# ---------------------------------------------------------------- the hunt's judgement, without a job


def _rank(how_roots=(), structural=(), match=False, config=()):
    from kdebug.hunt_ranks import rank_result

    class _Step:
        def __init__(self, name, kind):
            self.name, self.kind = name, kind

        def label(self):
            return f"{'op' if self.kind == 'aten' else 'kernel'} #1 {self.name}"

    class _Root:
        def __init__(self, name, kind, root_kind):
            self.step_a, self.kind, self.consequences = _Step(name, kind), root_kind, 3

    class _Rep:
        ok = match
        runs = (0, 1)

        def __init__(self):
            self.roots = [_Root(*r) for r in how_roots]
            self.structural = list(structural)
            self.config_changes = [(_Step(n, "kernel"), _Step(n, "kernel")) for n in config]
            self.shape_changes = []

    return _Rep()


def _verdict(per_rank: dict, grouped=True):
    from kdebug.hunt_ranks import JobVerdict, rank_result

    ranks = {r: rank_result(r, [rep]) for r, rep in per_rank.items()}
    return JobVerdict(ranks, {}, [{"run": 0, "match": True}], grouped)


def test_summary_names_how_each_rank_differs():
    coll = ("c10d::allreduce_", "aten", "root")
    # a kernel computed differently on rank 1; rank 0 only received it
    v = _verdict({0: _rank([coll]), 1: _rank([("cpp_fused_relu_0", "kernel", "root"), coll])})
    text = "\n".join(v.summary(2, 2))
    assert v.origins == [1] and v.focus() == 1
    assert "rank 0: first root op #1 c10d::allreduce_; only collectives differ here: it received another rank's" \
           in text and "the difference started on rank(s) [1]" in text
    # rank 1's input changed outside the recording: it is the origin, not a receiver
    v = _verdict({0: _rank([coll]), 1: _rank([("cpp_fused_mul_0", "kernel", "outside")])})
    text = "\n".join(v.summary(2, 2))
    assert v.origins == [1] and v.focus() == 1 and "an input changed outside the recording here" in text
    assert "rank 1: first difference at kernel #1 cpp_fused_mul_0" in text
    # only a collective differs, on rank 1 alone: no rank is said to have received anything
    v = _verdict({0: _rank(match=True), 1: _rank([coll])})
    text = "\n".join(v.summary(2, 2))
    assert v.origins == [] and v.focus() == 1 and "received" not in text
    assert "the collective returned another result here" in text
    assert "the difference first appears in collective outputs, on rank(s) [1]" in text
    # rank 1 launched other work (no root): the origin, labelled as a difference, not a root
    v = _verdict({0: _rank([coll]), 1: _rank(structural=["only run 1 launched [op #9 aten::add_]"])})
    text = "\n".join(v.summary(2, 2))
    assert v.origins == [1] and "rank 1: first difference: only run 1 launched" in text
    assert "first root only run" not in text
    # rank 1's runs differ only in a kernel's launch config (per-process autotuning): said so, never
    # 'different work' with an unnamed first difference (seen on 2 H200s)
    v = _verdict({0: _rank(match=True), 1: _rank(config=["triton_per_fused__softmax_6"])})
    text = "\n".join(v.summary(2, 2))
    assert v.origins == [1] and "rank 1: first difference at kernel #1 triton_per_fused__softmax_6" in text
    assert "autotuning chose another launch config" in text and "?" not in text and "different work" not in text
    # the way to pin it is one this torch has (torch 2.11 has no inductor config.deterministic)
    import torch._inductor.config as ic

    line = next(x for x in text.splitlines() if "autotuning chose" in x)
    assert line.endswith(")") and line.count("(") == line.count(")"), line
    assert ("config.deterministic = True pins the choice" in line) == hasattr(ic, "deterministic"), line
    # one rank, or no process group: nothing is claimed to agree
    v = _verdict({0: _rank(match=True)}, grouped=False)
    text = "\n".join(v.summary(1, 2))
    assert "one rank, nothing to compare across ranks" in text and "no rank initialized a process group" in text
    assert "replicas agree" not in text


def test_page_names_follow_the_trace_names():
    from kdebug.hunt_ranks import page_path

    assert page_path("r.html", 1) == "r.rank1.html"
    assert page_path("/a.b/out", 0) == "/a.b/out.rank0.html"


_GOOD = {"what": "job.py", "runs": 2, "nproc": 2, "paths": ["run0.rank1.kdt", "run1.rank1.kdt"],
         "rank_paths": {"0": ["run0.rank0.kdt", "run1.rank0.kdt"], "1": ["run0.rank1.kdt", "run1.rank1.kdt"]},
         "focus_rank": 1, "summary": ["x"], "fixes": {"f": True, "g": None}}


@pytest.mark.parametrize("change, field", [
    ([1, 2], "the file"),
    ({"paths": ["/etc/passwd"]}, "paths"),
    ({"paths": ["../run0.kdt"]}, "paths"),
    ({"rank_paths": {"1": ["run0.rank1.kdt", None]}}, "rank_paths"),
    ({"rank_paths": ["run0.rank1.kdt"]}, "rank_paths"),
    ({"fixes": {"deterministic_algorithms": "false"}}, "fixes"),
    ({"magnitude": [None], "magnitude_rank": 1}, "magnitude"),
    ({"confirm": [None, 3], "confirm_rank": 1}, "confirm"),
    ({"magnitude": [{"root": "k", "rerun": {"verdict": "junk"}}]}, "magnitude[].rerun"),
    ({"focus_rank": "1"}, "focus_rank"),
    ({"focus_rank": 7}, "focus_rank"),
    ({"focus_rank": True}, "focus_rank"),
    ({"nproc": 0}, "nproc"),
    ({"what": ["<b>"]}, "what"),
])
def test_a_hostile_hunt_json_is_refused_naming_its_field(tmp_path, change, field):
    import json

    from kdebug.report import resolve_inputs

    d = tmp_path / "keep"
    d.mkdir()
    doc = change if isinstance(change, list) else {**_GOOD, **change}
    (d / "hunt.json").write_text(json.dumps(doc))
    with pytest.raises(ValueError, match=re.escape(f"{field} must be")):
        resolve_inputs([str(d)])
    p = subprocess.run([sys.executable, "-m", "kdebug", "report", str(d), "-o", str(tmp_path / "r.html")],
                       env={**os.environ, "PYTHONPATH": ROOT}, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and f"{field} must be" in p.stderr and "Traceback" not in p.stderr, p.stderr
    assert not (tmp_path / "r.html").exists()


def test_a_deeply_nested_hunt_json_is_refused(tmp_path):
    from kdebug.report import resolve_inputs

    (tmp_path / "hunt.json").write_text("[" * 100000 + "]" * 100000)
    with pytest.raises(ValueError, match="not a readable kdebug hunt.json"):
        resolve_inputs([str(tmp_path)])


DDP_STEPS = os.path.join(ROOT, "tests", "dist_scripts", "ddp_gpu_step.py")


@pytest.mark.distributed
def test_hunt_nproc_follows_a_planted_fault_through_the_optimizer_into_the_next_step(tmp_path):
    """The GPU DDP job of tests/test_gpu_ranks.py on gloo (KD_DEVICE=cpu): a
    bf16 transformer, three steps, SGD's foreach step, rank 1's GELU kernel
    perturbed in step 1 of the second run.  Step 2 reads parameters the
    foreach step wrote (Note [Writes returned by no output]) and a layer-norm
    kernel's in_out buffer holds whatever its memory held (Note [Written
    before read]): the hunt names only the planted kernel on rank 1, nothing
    'from outside the recording', and rank 0's difference as received through
    the all-reduce."""
    import json

    keep = tmp_path / "hunt"
    p = subprocess.run([sys.executable, "-m", "kdebug", "hunt", "--nproc", "2", "--no-magnitude", "--keep", str(keep),
                        DDP_STEPS],
                       env={**os.environ, "PYTHONPATH": ROOT, "KD_DEVICE": "cpu", "KD_ATTN": "math",
                            "KD_FAULT": "kernel:1", "KD_FAULT_FROM_SECOND_RUN": str(tmp_path / "mark")},
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
    assert p.returncode == 1, p.stdout[-4000:]
    assert "the difference started on rank(s) [1]" in p.stdout, p.stdout[-4000:]
    hunt = json.loads((keep / "hunt.json").read_text())
    r0, r1 = hunt["ranks"]["0"], hunt["ranks"]["1"]
    assert r1["origin"] and [x["root"].split()[-1].startswith("cpp_fused_gelu") for x in r1["roots"]] == [True], r1
    assert not r0["origin"] and r0["roots"] and all(x["collective"] for x in r0["roots"]), r0
    assert all(x["kind"] == "root" for r in (r0, r1) for x in r["roots"]), hunt["ranks"]  # none "outside"
    assert [x["match"] for x in hunt["replicas"]] == [True, False]


def test_only_floating_point_arguments_are_taken_for_a_rank_s_setting():
    """Note [Settings one rank had]: an optimizer step size differs as a
    float; a rank's index into its data (select(x, 0, rank)) or a shape is
    not a setting (the select was named at first; found by a review)."""
    from kdebug.crossrank import _only_floats_differ

    assert _only_floats_differ("aten::addcdiv_(t: f32[16], value=-0.0073)", "aten::addcdiv_(t: f32[16], value=-0.011)")
    assert _only_floats_differ("aten::mul(t: f32[4], 1e-3)", "aten::mul(t: f32[4], 2e-3)")
    assert not _only_floats_differ("aten::select.int(t: f32[2, 8, 16], 0, 0)", "aten::select.int(t: f32[2, 8, 16], 0, 1)")
    assert not _only_floats_differ("aten::ones([7, 16])", "aten::ones([8, 16])")
    assert not _only_floats_differ("aten::mul(t: f32[4], 0.5)", "aten::mul(t: f32[4], 0.5)")
