"""Shared fixtures: real Inductor-compiled functions (C++ kernels on the CPU,
Triton kernels on a GPU), compiled once per session."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def pytest_collection_modifyitems(config, items):
    # pytest -n 2 --dist loadfile (pytest-xdist): a test file's tests run in one worker, so its
    # module fixtures, and the built-in hunt (a session fixture of a minute, read only by
    # test_hunt.py), are made once.  (--dist loadgroup with xdist_group marks no longer groups
    # under pytest 9: xdist 3.8 renames item._nodeid, which pytest 9's nodeid does not read.)
    has_cuda = torch.cuda.is_available()
    try:
        import triton  # noqa: F401

        has_triton = True
    except ImportError:
        has_triton = False
    skip = pytest.mark.skip(reason="needs a CUDA device and Triton (run these on the GPU machine)")
    for item in items:
        if "gpu" in item.keywords and not (has_cuda and has_triton):
            item.add_marker(skip)
    # the heaviest files first: --dist loadfile hands files to the workers in this order as they
    # free up, so a four-minute file given out last kept one worker busy long after the other
    # had finished (the files come alphabetically otherwise: test_verdict.py was among the last)
    first = {name: i for i, name in enumerate(HEAVY_FILES)}
    items.sort(key=lambda it: first.get(os.path.basename(str(it.path)), len(first)))


# Test files by their time on the 2-core CPU machine, heaviest first (pytest --durations, summed per
# file: test_ranks.py about 260 s, test_verdict.py 195, test_hunt.py 160, test_repro.py 150, the
# next ones 50-65 s each); the rest keep their order after these
HEAVY_FILES = ("test_ranks.py", "test_verdict.py", "test_hunt.py", "test_repro.py", "test_verdict_hunts.py",
               "test_cli_errors.py", "test_accuracy_zoo.py", "test_recording_gaps.py", "test_kernel_code.py",
               "test_flight.py", "test_cpp_wrapper.py")


def pointwise_and_reductions(x, w, b):
    """Matmul (an extern aten op), a softmax and a layer norm (reductions), pointwise ops."""
    h = x @ w
    s = torch.softmax(h, dim=-1)
    y = torch.nn.functional.layer_norm(s * 2.0 + b, (h.shape[-1],))
    return y.relu().sum(dim=0), torch.tanh(y)


@pytest.fixture(scope="session")
def cpu_inputs():
    g = torch.Generator().manual_seed(0)
    return (torch.randn(64, 32, generator=g), torch.randn(32, 16, generator=g),
            torch.randn(16, generator=g))


@pytest.fixture(scope="session")
def compiled_cpu(cpu_inputs):
    """A compiled function with C++ kernels, already warm (compiled)."""
    fn = torch.compile(pointwise_and_reductions)
    fn(*cpu_inputs)
    return fn


@pytest.fixture(scope="session")
def block_step():
    """A compiled transformer block's forward + backward on the GPU, already
    compiled, autotuned and with its fast launchers built: (step, x)."""
    from kdebug.workloads import TinyBlock, train_step_fn

    torch.manual_seed(0)
    model = TinyBlock(d=256, heads=8).cuda()
    x = torch.randn(4, 128, 256, device="cuda")
    step = train_step_fn(model)
    step(x)
    step(x)
    torch.cuda.synchronize()
    return step, x


@dataclass(frozen=True)
class BuiltinHunt:
    """The built-in workload's kept hunt: the finished process and its files."""
    proc: subprocess.CompletedProcess
    keep: Path  # --keep: the traces, hunt.json, the roots' repro directories
    html: Path  # --html


@pytest.fixture(scope="session")
def builtin_hunt(tmp_path_factory) -> BuiltinHunt:
    """`kdebug hunt --runs 2 --try-fixes --fixes deterministic_algorithms,inductor_deterministic
    --rerun-times 5 --keep DIR --html PATH` of the built-in workload, in fresh
    processes (about a minute: two runs, two per fix, one capture re-run):
    run once and read by the tests
    of what a hunt prints, keeps and re-launches (test_hunt.py),
    which only read it.  The traces and the report are those of the two
    plain runs (the fixes' runs are compared apart), so --try-fixes takes
    nothing away from what the other tests check.

    The workload's divergence is its OpenMP threads' race, and under two
    test workers on two cores the threads can run one after the other in
    every run of a pair (then the plain runs, or the inductor_deterministic
    fix's runs, match); such a hunt is made once more, never judged in the
    tests' place: a hunt that still finds them matching fails the tests."""
    for _ in range(2):
        d = tmp_path_factory.mktemp("builtin-hunt")
        keep, html = d / "runs", d / "hunt.html"
        proc = subprocess.run([sys.executable, "-m", "kdebug", "hunt", "--runs", "2", "--try-fixes",
                               "--fixes", "deterministic_algorithms,inductor_deterministic", "--rerun-times", "5",
                               "--keep", str(keep), "--html", str(html)], capture_output=True, text=True, cwd=d,
                              env={**os.environ, "PYTHONPATH": ROOT}, timeout=600)
        raced = proc.returncode == 1 and "torch._inductor.config.deterministic = True: REMOVES" not in proc.stdout
        if raced or proc.returncode not in (0, 1):
            break
    return BuiltinHunt(proc, keep, html)


@pytest.fixture
def index_add_case():
    """torch.compile of index_add with many duplicate indices: its atomic adds
    make it bitwise non-deterministic on the GPU (INDUCTOR-NOTES).  (compiled
    fn, x, indices), compiled and run once."""
    def f(x, ind):
        return torch.zeros(100, device=x.device).index_add(0, ind, x)

    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(200_000, device="cuda", generator=g)
    ind = torch.randint(0, 100, (200_000,), device="cuda", generator=g)
    cf = torch.compile(f)
    cf(x, ind)
    return cf, x, ind


def generated_modules_with(name: str) -> list[str]:
    """Sources of the Inductor-generated modules that define kernel `name`."""
    from torch._inductor.codecache import PyCodeCache

    out = []
    for mod in list(PyCodeCache.modules):
        if name in vars(mod):
            with open(mod.__file__) as f:
                out.append(f.read())
    return out


def generated_module_running(kernels) -> str:
    """The source of the generated module whose call() launched `kernels`
    (recorded C++ kernel calls, in order): other tests' modules may define
    kernels of the same names, so the one whose kernel calls are these, in
    this order and with these argument counts."""
    names = [k.kernel_name for k in kernels]
    found = []
    for src in generated_modules_with(names[0]):
        calls = [c for c in kernel_calls_in(src) if c[0].startswith("cpp_fused")]
        if [n for n, _ in calls] == names and all(len(a) == len(k.args) for (_, a), k in zip(calls, kernels)):
            found.append(src)
    assert found, f"no generated module launches {names}"
    return found[-1]


CALL_RE = re.compile(r"^\s+((?:cpp_fused|triton_)\w*)(?:\.run)?\((.*)\)\s*$", re.M)


def kernel_calls_in(source: str) -> list[tuple[str, list[str]]]:
    """(kernel, [argument expressions]) for each kernel call in a generated module's call()."""
    body = source[source.index("def call("):]
    calls = []
    for m in CALL_RE.finditer(body):
        args = [a.strip() for a in m.group(2).split(",") if a.strip() and "=" not in a]
        calls.append((m.group(1), args))
    return calls
