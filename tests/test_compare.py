"""The run-to-run comparison (issue 4) on real Inductor C++ kernels: planted
faults are found and classified, inherited launches counted."""
from __future__ import annotations

import contextlib
import os

import pytest
import torch

import kdebug
from kdebug import DebugMode, compare
from kdebug.testing import perturb_kernel_output


@pytest.fixture(scope="module")
def chain():
    """Four compiled functions with a known dataflow:
    a = K1(x); b = K2(a); c = K3(x) (independent of a); d = K4(b, c)."""
    k1 = torch.compile(lambda x: torch.sin(x) * 2)
    k2 = torch.compile(lambda a: torch.cos(a) + 1)
    k3 = torch.compile(lambda x: torch.exp(x) * 3)
    k4 = torch.compile(lambda b, c: b * c - 1)
    x = torch.randn(64, 32)

    def program(between=None):
        a = k1(x)
        if between is not None:
            between(a)
        b = k2(a)
        c = k3(x)
        return k4(b, c)

    program()
    return program


def record(program, **kw):
    with DebugMode() as dm:
        with DebugMode.log_tensor_hashes(hash_fn="bitwise", hash_inputs=True):
            program(**kw)
    return dm


def names(dm):
    return [k.kernel_name for k in dm.kernels]


def test_identical_runs_match(chain):
    r = compare(record(chain), record(chain))
    assert r.ok and r.divergence is None and r.hashed == 4
    assert "all 4 launches and ops have matching inputs and outputs" in str(r)


def test_a_match_of_partly_hashed_runs_says_what_was_not_hashed(chain):
    """Launches recorded without hashes (a flight recorder's forward and
    backward under hashes='compared') match by name and shape only: the
    verdict counts them apart and never calls their outputs matching, even
    where the unhashed launch's output differs."""
    def partly(perturb=False):
        with DebugMode(kernels_only=True) as dm:
            ctx = perturb_kernel_output(names_of_k2[0], "out_ptr0") if perturb else contextlib.nullcontext()
            with ctx as hit:
                chain()  # no hashes
            assert not perturb or hit["hits"] == 1
            with DebugMode.log_tensor_hashes(hash_fn="bitwise"):
                chain()
        return dm

    names_of_k2 = [n for n in names(record(chain)) if "cos" in n]
    r = compare(partly(), partly(perturb=True))
    assert r.ok and r.compared == 8 and r.hashed == 4, str(r)
    text = str(r)
    assert "all 4 hashed launches and ops have matching inputs and outputs; the other 4 were recorded " \
           "without hashes and matched by name and shape only" in text, text
    assert "all 8 launches" not in text


def test_planted_output_fault_is_the_first_divergence(chain):
    base = record(chain)
    k1, k2, k3, k4 = names(base)
    with perturb_kernel_output(k1, "out_ptr0") as hit:
        bad = record(chain)
    assert hit["hits"] == 1
    r = compare(base, bad)
    d = r.divergence
    assert not r.ok and d.kind == "output" and d.step_a.name == k1 and d.arg == "out_ptr0"
    assert d.hash_a != d.hash_b
    # K2 reads a, K4 reads b: both inherit it; K3 reads only x
    assert [x.name for x, _ in d.inherited] == [k2, k4]
    text = str(r)
    assert f"FIRST DIVERGENCE: kernel #0 {k1}" in text and "non-deterministic" in text
    assert "2 later launches/ops changed because of it" in text


def test_fault_in_a_later_kernel(chain):
    base = record(chain)
    k1, k2, k3, k4 = names(base)
    with perturb_kernel_output(k3, "out_ptr0"):
        bad = record(chain)
    d = compare(base, bad).divergence
    assert d.kind == "output" and d.step_a.name == k3
    assert [x.name for x, _ in d.inherited] == [k4]


def test_write_outside_the_recorded_launches_is_an_input_divergence(chain):
    base = record(chain)
    k1, k2, k3, k4 = names(base)

    def sneak(a):  # a write no DebugMode sees, between two kernels
        with torch._C._DisableTorchDispatch(), torch.no_grad():
            a.view(-1)[5] += 1

    bad = record(chain, between=sneak)
    r = compare(base, bad)
    d = r.divergence
    assert d.kind == "input" and d.step_a.name == k2 and d.arg == "in_ptr0"
    assert d.outside and d.writer is not None and d.writer.name == k1  # K1 wrote it, and matched
    assert [x.name for x, _ in d.inherited] == [k4]
    assert "outside the recorded launches" in str(r)
    assert "passed other tensors" not in str(r)  # the same tensor, changed unseen (Note [Other tensors passed])


def test_structural_differences_are_aligned_not_fatal(chain):
    base = record(chain)
    k1, k2, k3, k4 = names(base)
    extra = torch.compile(lambda x: torch.tanh(x) - 2)
    x = torch.randn(64, 32)
    extra(x)

    def more():
        chain()
        extra(x)

    with DebugMode() as dm:
        with DebugMode.log_tensor_hashes(hash_fn="bitwise", hash_inputs=True):
            more()
    r = compare(base, dm)
    assert not r.ok and r.divergence is None and r.compared == 4
    assert len(r.structural) == 1 and "only run 1 launched" in r.structural[0]


def test_allocation_only_differences_do_not_make_runs_differ(chain):
    """A run that allocates where another does not (a helper's lru_cache that
    probes a dtype's size with torch.empty, filled while compiling in one run
    and at run time in the other: seen under reduce-overhead with a warm FX
    graph cache) computed the same: no structural difference, reported apart."""
    base = record(chain)

    def probe(a):
        torch.empty((), dtype=torch.float16)  # what torch._inductor.utils.get_dtype_size does
        torch.empty_strided((4, 4), (1, 4))

    r = compare(base, record(chain, between=probe))
    assert r.ok, str(r)
    assert r.structural == [] and r.compared == 4
    assert len(r.allocations) == 1
    assert r.allocations[0].startswith("only run 1 allocated [op #1 aten::empty.memory_format, "
                                       "op #2 aten::empty_strided]"), r.allocations
    assert "ALLOCATION ONLY" in str(r) and "STRUCTURE" not in str(r)

    # an extra step that computes something stays structural, allocations beside it too
    def fill(a):
        torch.empty(3).fill_(1.0)

    r = compare(base, record(chain, between=fill))
    assert not r.ok and r.allocations == []
    assert len(r.structural) == 1 and "aten::fill_" in r.structural[0], r.structural


def test_an_extra_allocation_before_one_both_runs_make_is_allocation_only(chain, tmp_path):
    """Runs are aligned on each step's key, and an aten op's key is its name:
    an extra probe allocation just before an allocation both runs make used to
    pair with that one (a SHAPES change: the runs 'differed') and the probe's
    partner was reported as the extra one.  An allocation's key takes its
    shape: the probe alone is the extra step, live and through trace files."""
    def program(with_probe):
        def between(a):
            if with_probe:
                torch.empty((), dtype=torch.float16)
            buf = torch.empty(64, 32)  # both runs allocate this, then compute with it
            buf.copy_(a)
        return lambda: chain(between=between)

    a, b = record(program(False)), record(program(True))
    for left, right in ((a, b), (_saved(a, tmp_path / "a.kdt"), _saved(b, tmp_path / "b.kdt"))):
        r = compare(left, right)
        assert r.ok, str(r)
        assert len(r.shape_changes) == 0 and r.structural == []
        assert len(r.allocations) == 1 and r.allocations[0].startswith(
            "only run 1 allocated [op #1 aten::empty.memory_format] (1 step(s))"), r.allocations
        # the extra step is run 1's step 1, the probe (step 2 is the allocation both runs make)
        inserted = [(j1, j2) for tag, i1, i2, j1, j2 in r.alignment["opcodes"] if tag != "equal"]
        assert inserted == [(1, 2)], r.alignment["opcodes"]
    assert "f16[]" in str(b.operators[1]) and "f32[64, 32]" in str(b.operators[2])


def test_allocations_of_another_size_in_the_same_place_are_allocation_only(chain):
    """Both runs allocate at the same place, with other sizes, and compute the
    same: a replaced allocation, reported apart, not a SHAPES difference."""
    def program(n):
        return lambda: chain(between=lambda a: torch.empty(n, 3))

    r = compare(record(program(5)), record(program(7)))
    assert r.ok and len(r.shape_changes) == 0, str(r)
    assert len(r.allocations) == 1 and r.allocations[0].startswith("run 0 allocated [op #1 aten::empty"), \
        r.allocations


def test_allocation_only_differences_on_the_cpp_op_path(chain):
    """op_path="c++" records aten ops as kernel-kind records
    (_AtenOpCall): the allocation rule goes by the op's name there too."""
    def rec(probe):
        with DebugMode(op_path="c++") as dm:
            with DebugMode.log_tensor_hashes(hash_fn="bitwise", hash_inputs=True):
                chain(between=(lambda a: torch.empty((), dtype=torch.float16)) if probe else None)
        return dm

    r = compare(rec(False), rec(True))
    assert r.ok and r.structural == [], str(r)
    assert len(r.allocations) == 1 and "aten::empty.memory_format" in r.allocations[0], r.allocations


def _saved(dm, path):
    dm.save(str(path))
    return str(path)


def _sin_kernel(x):
    """(f, the name of its one C++ kernel): f = torch.compile((x.sin() * 2).contiguous()), compiled for
    x and warm.  Static shapes: the tests call it with other sizes, and one compiled lambda seeing a
    second size would recompile with dynamic shapes."""
    f = torch.compile(lambda x: (x.sin() * 2).contiguous(), dynamic=False)
    f(x)
    with DebugMode() as probe:
        f(x)
    return f, probe.kernels[0].kernel_name


@contextlib.contextmanager
def _recording():
    """A recording that keeps the final state, with bitwise hashes of inputs and outputs."""
    with DebugMode(record_final_state=True) as dm, \
            DebugMode.log_tensor_hashes(hash_fn="bitwise", hash_inputs=True):
        yield dm


def test_assert_deterministic(chain):
    reports = kdebug.assert_deterministic(chain, runs=3)
    assert len(reports) == 2 and all(r.ok for r in reports)
    k1 = names(record(chain))[0]
    calls = {"n": 0}

    def flaky():
        calls["n"] += 1
        if calls["n"] == 2:  # the second run only
            with perturb_kernel_output(k1, "out_ptr0"):
                return chain()
        return chain()

    with pytest.raises(AssertionError, match="FIRST DIVERGENCE"):
        kdebug.assert_deterministic(flaky, runs=2)


def test_training_step_with_a_concatenation_buffer_matches_itself():
    """The backward of attention writes q/k/v gradients into slices of one
    buffer, and a later kernel reads the whole buffer while writing its
    slices: before that launch part of it is memory nobody wrote yet. Two
    recordings in one process (where that memory holds different leftovers)
    must still compare equal; the aliased input is left out of the comparison."""
    from kdebug.compare import _aliased_inputs
    from kdebug.workloads import TinyBlock, train_step_fn

    torch.manual_seed(0)
    step = train_step_fn(TinyBlock(d=64, heads=4))
    x = torch.randn(2, 16, 64)
    step(x)
    runs = []
    for _ in range(2):
        with DebugMode() as dm, DebugMode.log_tensor_hashes("bitwise", hash_inputs=True):
            step(x)
            step(x)
        runs.append(dm)
    aliased = [k.kernel_name for k in runs[0].kernels if _aliased_inputs(k.tensor_info)]
    assert any("cat" in n for n in aliased), aliased
    r = compare(runs[0], runs[1])
    assert r.ok, str(r)


def test_a_difference_read_only_by_item_reaches_the_program(tmp_path):
    """Note [Returned values]: a kernel's differing output whose only reader
    is .item() (aten::_local_scalar_dense, which returns no tensor) handed the
    program another number: the runs differ, the kernel is the root, and the
    values the program got are named.  Before, the op's value was not
    compared, so the tensor counted as read into an identical output
    (absorbed) and then freed: BENIGN, 'the runs match'."""
    f = torch.compile(lambda x: (x.sin() * 2).sum())
    x = torch.randn(64, 32)
    f(x)
    with DebugMode() as probe:
        f(x)
    kernel = probe.kernels[0].kernel_name

    def run(delta):
        with DebugMode() as dm, DebugMode.log_tensor_hashes(hash_fn="bitwise", hash_inputs=True):
            if delta:
                with perturb_kernel_output(kernel, "out_ptr0", 0, delta) as hit:
                    v = f(x).item()  # the result tensor is a temporary: freed right after
                assert hit["hits"] == 1
            else:
                v = f(x).item()
        return dm, v

    (a, va), (b, vb) = run(0), run(0.5)
    assert va != vb  # what the program printed differs (Python's own floats)
    for left, right in ((a, b), (_saved(a, tmp_path / "a.kdt"), _saved(b, tmp_path / "b.kdt"))):
        r = compare(left, right)
        assert not r.ok and r.benign == [], str(r)
        top = r.roots[0]
        assert top.step_a.name == kernel and top.consequences == 1, str(r)
        assert len(top.values) == 1 and "aten::_local_scalar_dense" in top.values[0][0], top.values
        assert top.values[0][1:] == (repr(va), repr(vb)), top.values
        assert f"returned {va!r} in run 0, {vb!r} in run 1" in str(r)
    # the same value in both runs is no difference
    assert compare(run(0)[0], run(0)[0]).ok


def test_an_op_returning_a_value_is_compared_by_it():
    """Note [Returned values]: an op that returns no tensor and reads
    identical inputs, but hands the program another value, is a root by that
    value (planted: bool() of a tensor changed outside any recording)."""
    x = torch.zeros(())

    def run(v):
        with DebugMode() as dm, DebugMode.log_tensor_hashes(hash_fn="bitwise", hash_inputs=True):
            y = x + 1
        y.fill_(v)  # no DebugMode sees this write
        with dm, DebugMode.log_tensor_hashes(hash_fn="bitwise", hash_inputs=True):
            bool(y)
        return dm

    r = compare(run(1.0), run(0.0))
    assert not r.ok, str(r)
    assert any("aten::is_nonzero" in x.step_a.name or "_local_scalar_dense" in x.step_a.name for x in r.roots), str(r)


def test_a_kernel_compiled_from_other_code_is_not_called_non_deterministic(tmp_path):
    """Two runs whose compiled kernel embeds a Python float that differs
    between them (a constant in the generated code): the kernel's output
    differs with identical inputs, but the runs compiled different code for
    it, which the verdict says instead of 'non-deterministic' and the
    atomic-add hint (Note [Kernel code]; found by a trust pass: a value from
    time.time())."""
    import subprocess
    import sys

    script = tmp_path / "scaled.py"
    script.write_text("import os, torch\n"
                      "SCALE = float(os.environ['KD_TEST_SCALE'])\n"
                      "f = torch.compile(lambda x: (x.sin() * SCALE).sum(0))\n"
                      "x = torch.linspace(-1, 1, 256).reshape(16, 16)\n"
                      "out = f(x)\n")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for name, scale in (("a", "1.25"), ("b", "1.5")):
        p = subprocess.run([sys.executable, "-m", "kdebug", "record", "-o", str(tmp_path / f"{name}.kdt"), "--",
                            str(script)], env={**os.environ, "KD_TEST_SCALE": scale, "PYTHONPATH": root},
                           capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stdout + p.stderr
    r = compare(str(tmp_path / "a.kdt"), str(tmp_path / "b.kdt"))
    assert not r.ok and r.roots[0].code is not None, str(r)
    text = str(r)
    assert "the two runs compiled different code for this kernel" in text, text
    assert "is non-deterministic" not in text and "atomic" not in text, text
    # the same code in both runs: a real non-determinism keeps its wording (planted in test_fault_in_a_later_kernel)


def test_batches_rebuilt_at_other_times_align_by_content():
    """Note [Aligning by content]: a DataLoader with workers rebuilds each
    batch it receives (aten::empty + aten::set_ from the worker's storage)
    when it arrives, one or two per next() as timing has it.  Here run 0
    rebuilds each batch right before its training step and run 1 rebuilds
    them two at a time (torch.load: the same empty + set_); the steps are
    the same computations.  Aligned by names alone, the runs' iterations
    paired off by one (different weights: invented roots); by content they
    match, and the shifted rebuilds are listed as ALLOCATION ONLY."""
    import io

    torch.manual_seed(0)
    w = torch.randn(8, 8)
    step = torch.compile(lambda w, x: (w - 0.1 * (x @ w).tanh().sum(0)).contiguous())
    batches = []
    for k in range(6):
        buf = io.BytesIO()
        torch.save(torch.randn(4, 8, generator=torch.Generator().manual_seed(k)), buf)
        batches.append(buf.getvalue())
    step(w, torch.randn(4, 8))

    def run(ahead: int):
        v = w.clone()
        got: dict = {}
        with _recording() as dm:
            for k in range(6):
                for j in range(k, min(k + ahead, 6)):  # what has arrived by now
                    if j not in got:
                        got[j] = torch.load(io.BytesIO(batches[j]))
                v = step(v, got.pop(k))
        return dm, v

    (a, va), (b, vb) = run(1), run(3)
    assert torch.equal(va, vb)  # the same training, bitwise (torch's own comparison)
    r = compare(a, b)
    assert r.ok and r.structural == [] and len(r.shape_changes) == 0 and r.roots == [], str(r)
    # a rebuilt batch paired with another one is data from outside that nothing kept: benign, never
    # 'non-deterministic'
    assert all(x.kind == "outside" for x in r.benign), str(r)
    assert r.allocations and all("aten::set_" in s or "aten::empty" in s for s in r.allocations), r.allocations


def _heads_run(order, combine):
    """Two task heads evaluated in ``order`` (as a loop over a Python set
    runs them: its order follows PYTHONHASHSEED), their results stored by
    name, or summed in that order (``combine``)."""
    torch.manual_seed(0)
    heads = {n: torch.nn.Linear(16, 16) for n in ("a", "b")}
    x = torch.randn(4, 16)
    with DebugMode() as dm, DebugMode.log_tensor_hashes(hash_fn="bitwise", hash_inputs=True):
        out = {n: heads[n](x).tanh() for n in order}
        total = None
        if combine:
            for n in order:
                total = out[n] if total is None else total + out[n] * 0.5
    return dm, out, total


def test_independent_work_in_another_order_is_reordered_not_a_difference():
    """Note [Reordered steps]: the heads ran in another order, their results
    are the same: re-paired by content, the runs match, REORDERED is said."""
    (a, oa, _), (b, ob, _) = _heads_run("ab", False), _heads_run("ba", False)
    assert all(torch.equal(oa[n], ob[n]) for n in "ab")
    r = compare(a, b)
    assert r.ok and r.roots == [] and r.benign == [], str(r)
    assert len(r.reordered) == 1 and "ran in another order in run 1" in r.reordered[0], r.reordered
    assert "REORDERED" in str(r)


def test_results_combined_in_another_order_name_the_other_tensors():
    """Note [Other tensors passed]: the heads' results combined in another
    order differ (torch.equal says so); the first step that combined them read
    other tensors in the two runs, and the verdict says so rather than 'the
    memory changed after its last write'."""
    (a, _, ta), (b, _, tb) = _heads_run("ab", True), _heads_run("ba", True)
    assert not torch.equal(ta, tb)
    r = compare(a, b)
    assert not r.ok and r.roots, str(r)
    text = str(r)
    assert "the runs passed other tensors here" in text and "it changed after that write" not in text, text


def test_a_difference_that_dies_two_steps_later_is_benign():
    """Note [Differences that die out]: a kernel's planted difference changes
    a matmul's product, whose argmax picks the same classes: nothing the
    program keeps differs (torch.equal), the runs match and the kernel is
    benign, having changed one step.  Keeping the product instead makes the
    same difference count."""
    x = torch.randn(32, 16, generator=torch.Generator().manual_seed(0))
    w = torch.randn(16, 8, generator=torch.Generator().manual_seed(1))
    f, name = _sin_kernel(x)

    def run(delta, keep_product):
        with _recording() as dm:
            with perturb_kernel_output(name, "out_ptr0", 0, delta):
                y = f(x)
            prod = y @ w
            kept = prod if keep_product else prod.argmax(1)
            del y, prod
        return dm, kept

    (a, ka), (b, kb) = run(0.0, False), run(1e-6, False)
    assert torch.equal(ka, kb)  # the same classes
    r = compare(a, b)
    assert r.ok and r.roots == [], str(r)
    assert len(r.benign) == 1 and r.benign[0].step_a.name == name and r.benign[0].consequences == 1, str(r)
    assert "whose differences died out too" in str(r)
    (a, ka), (b, kb) = run(0.0, True), run(1e-6, True)
    assert not torch.equal(ka, kb)
    r = compare(a, b)
    assert not r.ok and r.roots[0].step_a.name == name and r.roots[0].reaches_end >= 1, str(r)


def test_a_random_op_drawing_other_numbers_says_to_seed():
    """An aten op that draws from the default generator, whose state is not
    recorded, with identical inputs and other outputs: the verdict says it
    drew other random numbers and how to seed, not 'non-deterministic'."""
    def run(seed):
        torch.manual_seed(seed)
        with DebugMode() as dm, DebugMode.log_tensor_hashes(hash_fn="bitwise", hash_inputs=True):
            kept = torch.rand(8) * 2
        return dm, kept

    (a, ka), (b, kb) = run(0), run(1)
    assert not torch.equal(ka, kb)
    r = compare(a, b)
    text = str(r)
    assert not r.ok and "aten::rand" in r.roots[0].step_a.name, text
    assert "drew other random numbers" in text and "torch.manual_seed" in text and "is non-deterministic" not in text


def test_an_op_called_with_other_arguments_shows_where_its_text_differs():
    """SHAPES for an aten op covers every argument of its text (a generator's
    state too): the line shows the part of the two texts that differs."""
    def run(seed):
        g = torch.Generator().manual_seed(seed)
        with DebugMode() as dm, DebugMode.log_tensor_hashes(hash_fn="bitwise", hash_inputs=True):
            kept = torch.randn(4, generator=g) + 1
        return dm, kept

    r = compare(run(0)[0], run(1)[0])
    line = next(x for x in str(r).splitlines() if "SHAPES:" in x)
    assert "aten::randn.generator was called with other arguments in run 1" in line, line
    assert "seed=0" in line and "seed=1" in line, line


def test_a_kept_result_read_once_still_counts_as_kept():
    """A differing tensor the program keeps counts as reaching the end even
    when a step read it into an identical output (a finiteness check, a count
    of positives): before, any read took it off the kept list and the root
    was benign (found by a trust pass: assert_deterministic passed while the
    two results differed)."""
    x = torch.randn(32, 16, generator=torch.Generator().manual_seed(0))
    f, name = _sin_kernel(x)

    def run(delta):
        with _recording() as dm:
            with perturb_kernel_output(name, "out_ptr0", 0, delta):
                kept = f(x)
            torch.isfinite(kept).all()  # read, into the same answer
        return dm, kept

    (a, ka), (b, kb) = run(0.0), run(1e-6)
    assert not torch.equal(ka, kb)
    r = compare(a, b)
    assert not r.ok and r.roots[0].step_a.name == name and r.roots[0].reaches_end >= 1, str(r)


def test_a_tensor_set_on_another_tensors_storage_inherits_its_difference():
    """aten::set_ shows a storage's bytes: set on the storage of a kernel's
    differing output, it inherits the kernel's difference (the kernel is the
    root, not set_, and the kernel's write is not taken as overwritten)."""
    x = torch.randn(32, generator=torch.Generator().manual_seed(0))
    f, name = _sin_kernel(x)

    def run(delta):
        with _recording() as dm:
            with perturb_kernel_output(name, "out_ptr0", 0, delta):
                y = f(x)
            alias = torch.empty(0).set_(y.untyped_storage(), 0, (32,), (1,))
            kept = alias.tolist()
        return dm, kept

    (a, ka), (b, kb) = run(0.0), run(0.5)
    assert ka != kb
    r = compare(a, b)
    assert not r.ok and r.roots[0].step_a.name == name and r.roots[0].consequences >= 1, str(r)


def test_reordered_work_whose_results_went_under_other_names_differs():
    """Note [Reordered steps]: the heads ran in another order and their results
    were then named by position, so the program printed each head's result
    under the other's name: the reads that hand values to the program keep
    their place, and the runs differ (before, they were re-paired too: match)."""
    def run(order):
        torch.manual_seed(0)
        heads = {n: torch.nn.Linear(16, 16) for n in ("a", "b")}
        x = torch.randn(4, 16)
        with _recording() as dm:
            outs = [heads[n](x).tanh() for n in order]
            named = dict(zip(["cls", "reg"], outs))
            text = [repr(named[k]) for k in ("cls", "reg")]
            del outs, named
        return dm, text

    (a, ta), (b, tb) = run("ab"), run("ba")
    assert ta != tb  # what the program printed under each name differs
    r = compare(a, b)
    assert not r.ok, str(r)
    assert "kdebug::print" in str(r), str(r)


def test_item_of_a_complex_tensor_is_compared_by_its_value():
    """Note [Returned values]: a complex .item() renders as (a+bj)."""
    def run(v):
        with DebugMode() as dm, DebugMode.log_tensor_hashes(hash_fn="bitwise", hash_inputs=True):
            y = torch.full((1,), complex(1.0, 2.0)) * 2
        y.add_(v)  # no DebugMode sees this write
        with dm, DebugMode.log_tensor_hashes(hash_fn="bitwise", hash_inputs=True):
            got = y.item()
        return dm, got

    (a, ga), (b, gb) = run(0), run(1e-3)
    assert ga != gb
    r = compare(a, b)
    assert not r.ok and any(x.values for x in r.roots), str(r)


def test_a_storage_rebound_in_one_run_only_still_makes_its_readers_differ():
    """An ALLOCATION ONLY stretch (empty + set_) that only run 0 ran rebinds
    the buffer a later op reads: that op's differing input came from a step
    only run 0 ran, so it is a root and the runs differ (before: no root to
    charge, and with another harmless difference before it the runs matched;
    found by a trust pass)."""
    stale = torch.arange(8, dtype=torch.float32)
    fresh = torch.arange(8, dtype=torch.float32) * 2

    def run(reload):
        with _recording() as dm:
            buf = fresh.clone()
            if reload:  # as a stale torch.load of a cache would
                buf = torch.empty(0).set_(stale.untyped_storage(), 0, (8,), (1,))
            text = repr(buf.sum() * 3)
        return dm, text

    (a, ta), (b, tb) = run(True), run(False)
    assert ta != tb
    r = compare(a, b)
    assert not r.ok and r.roots, str(r)


@pytest.mark.parametrize("through_traces", [False, True])
def test_a_write_through_a_view_with_gaps_does_not_hide_the_rest(tmp_path, through_traces):
    """Note [Partial writes] (kdebug/dataflow.py): after a kernel's planted
    difference in a kept grid (off its diagonal), the program zeroes the diagonal
    (fill_diagonal_: a view with gaps whose extent is all of u).  Taken
    as writing all of it, the kernel's difference looked overwritten: benign,
    the runs matched while the kept grid differed."""
    x = torch.randn(16, 16, generator=torch.Generator().manual_seed(0))
    f, name = _sin_kernel(x)

    def run(delta):
        with _recording() as dm:
            with perturb_kernel_output(name, "out_ptr0", 0, delta) as hit:  # its first element
                u = f(x).flip(1)  # ... now in the last column
            assert hit["hits"] == 1
            u.fill_diagonal_(0)  # a view with gaps whose extent is all of u
        return dm, u

    (a, ua), (b, ub) = run(0.0), run(0.5)
    assert not torch.equal(ua, ub)  # the kept grid differs
    left, right = (a, b) if not through_traces else (_saved(a, tmp_path / "a.kdt"), _saved(b, tmp_path / "b.kdt"))
    r = compare(left, right)
    assert not r.ok and r.roots and r.roots[0].step_a.name == name and r.roots[0].reaches_end >= 1, str(r)


def test_kernel_sources_that_differ_only_in_their_gpu_index_are_one_code():
    """Note [Code of another device]: ranks with one GPU each compile a
    Triton kernel into sources that differ only in triton_meta's device
    index; those are one code (seen on 2 H200s: a planted fault on rank 1 was
    blamed on 'different code').  A constant that differs still counts."""
    from torch._inductor.runtime.hints import DeviceProperties

    from kdebug.compare import _device_free

    def source(index, scale):
        props = DeviceProperties(type="cuda", index=index, multi_processor_count=132, cc=90, major=9)
        return ("@triton_heuristics.pointwise(size_hints={'x': 256}, filename=__file__, "
                f"triton_meta={{'signature': {{'in_ptr0': '*fp32'}}, 'device': {props!r}, 'constants': {{}}}})\n"
                "@triton.jit\ndef triton_poi_fused_mul_0(in_ptr0, out_ptr0, xnumel, XBLOCK: tl.constexpr):\n"
                f"    tmp1 = tmp0 * {scale}\n")

    assert "index=1" in source(1, 0.5) and source(0, 0.5) != source(1, 0.5)
    assert _device_free(source(0, 0.5)) == _device_free(source(1, 0.5))
    assert _device_free(source(0, 0.5)) != _device_free(source(1, 0.25))
    assert "multi_processor_count=132" in _device_free(source(3, 0.5))


def test_a_root_kernel_launched_with_another_config_is_put_down_to_autotuning():
    """Seen on 2 H200s: each rank autotuned a softmax reduction on its own and
    picked another block size; the replicas then differed there from identical
    inputs.  The verdict names the two configs instead of 'computed another
    result from the same inputs' (a config alone: the same wording stays)."""
    from kdebug.compare import Root, Step, _root_lines

    def step(config, grid):
        return Step(6, "kernel", "triton_per_fused__softmax_5", grid, config, kernel_number=3)

    a = step("XBLOCK=1, R0_BLOCK=128", (1024, 1, 1))
    b = step("XBLOCK=8, R0_BLOCK=128", (128, 1, 1))
    text = "\n".join(_root_lines(Root("root", a, b, [("output in_out_ptr0", 1, 2)]), "rank 0", "rank 1"))
    assert "another launch config in rank 1 (config XBLOCK=8, R0_BLOCK=128, grid (128, 1, 1))" in text, text
    assert "rank 0 (config XBLOCK=1, R0_BLOCK=128, grid (1024, 1, 1))" in text and "autotuning" in text, text
    same = "\n".join(_root_lines(Root("root", a, step(a.config, a.grid), [("output in_out_ptr0", 1, 2)]),
                                 "rank 0", "rank 1"))
    assert "launch config" not in same and "computed another result on rank 1" in same, same


class _TwoLayers(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(16, 32)
        self.b = torch.nn.Linear(32, 8)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


@pytest.mark.parametrize("make_opt", [
    lambda ps: torch.optim.SGD(ps, lr=0.1, foreach=True),
    lambda ps: torch.optim.AdamW(ps, lr=1e-2, fused=True),
], ids=["sgd_foreach", "adamw_fused"])
def test_a_difference_through_an_optimizer_step_that_returns_nothing_is_followed(tmp_path, make_opt):
    """Note [Writes returned by no output]: a foreach / fused optimizer step
    writes the parameters in place and returns nothing.  Its record now holds
    the hashes of what it wrote, so a kernel fault in step 1 of 3 is the root
    of the later steps' differences, not a 'benign' difference that died out
    at the optimizer with the next step's reads changed 'outside the
    recording' (found on a compiled DDP step on 2 H200s, where CUDA's
    optimizers take the foreach path by default)."""
    from kdebug import hashing

    def run(path, fault):
        torch.manual_seed(0)
        m = _TwoLayers()
        f = torch.compile(m)
        opt = make_opt(list(m.parameters()))
        x = torch.randn(4, 16)
        f(x).sum().backward()  # compiles forward and backward outside the recording
        m.zero_grad()
        with DebugMode(trace=path) as dm, DebugMode.log_tensor_hashes(["bitwise"], hash_inputs=True):
            for step in range(3):
                ctx = perturb_kernel_output("cpp_fused_relu", None, value=0.5) if fault and step == 1 \
                    else contextlib.nullcontext()
                with ctx:
                    f(x).square().mean().backward()
                opt.step()
                opt.zero_grad()
        return m, dm

    m, dm = run(tmp_path / "a.kdt", False)
    # the last optimizer op that wrote the parameters holds their hashes as they are now
    spec = hashing.parse("bitwise")[1]
    def value(h):  # a CPU hash is an int; a device hash a Pending, read once the device is done
        return h.value() if isinstance(h, hashing.Pending) else h

    want = {str(value(hashing.start_value(p.detach(), spec))) for p in m.parameters()}
    writers = [c for c in dm.operators if str(getattr(c, "op", "")).startswith(("aten._foreach_add_", "aten._fused_"))]
    assert writers, [str(getattr(c, "op", "")) for c in dm.operators]
    flat = [str(value(v)) for v in torch.utils._pytree.tree_leaves(writers[-1].log["hash"])]
    assert want <= set(flat), (want, flat)
    run(tmp_path / "b.kdt", True)
    r = compare(str(tmp_path / "a.kdt"), str(tmp_path / "b.kdt"))
    assert not r.ok, str(r)
    assert r.divergence.kind == "output" and "cpp_fused_relu" in r.divergence.step_a.name, str(r)
    root = r.roots[0]
    assert "cpp_fused_relu" in root.step_a.name and not root.benign and root.consequences > 10, str(r)
    assert "outside" not in [x.kind for x in r.roots], str(r)


def test_a_kernel_given_another_dynamic_size_value_says_which_scalar():
    """Two launches of one Inductor kernel whose tensors are alike and whose
    runtime scalar (a dynamic int) differs: the SHAPES line names the scalar
    and both values instead of 'other argument shapes'."""
    f = torch.compile(lambda x, n: x.sin() + n, dynamic=True)
    x = torch.randn(64)
    f(x, 3), f(x, 4)
    recs = []
    for n in (605, 86):
        with kdebug.DebugMode(kernels_only=True) as dm, kdebug.DebugMode.log_tensor_hashes("bitwise", hash_inputs=True):
            f(x, n)
        recs.append(dm)
    text = str(kdebug.compare(*recs))
    line = next(s for s in text.splitlines() if "SHAPES:" in s)
    assert "other scalar arguments" in line and "605 in run 0, 86 in run 1" in line, text


def _interleaved(order, bump=None):
    """Note [Steps left unaligned by another order]: the same compiled calls and
    eager ops on four inputs, in the order given (as threads interleave them);
    ``bump`` changes one input by one ulp-sized step."""
    f = _interleaved.f
    xs = [torch.randn(8, 32, generator=torch.Generator().manual_seed(i)) for i in range(4)]
    if bump is not None:
        xs[bump] = xs[bump] + 1e-3
    with DebugMode() as dm, DebugMode.log_tensor_hashes("bitwise", hash_inputs=True):
        ys = {}
        for kind, i in order:
            ys[i] = f(xs[i]) if kind == "f" else ys[i].add(1)
    return dm


_interleaved.f = torch.compile(lambda x: torch.softmax(x * 2, -1).cumsum(-1))
_ORDER_A = [("f", 0), ("g", 0), ("f", 1), ("g", 1), ("f", 2), ("g", 2), ("f", 3), ("g", 3)]
_ORDER_B = [("f", 0), ("f", 1), ("g", 0), ("g", 1), ("f", 2), ("f", 3), ("g", 3), ("g", 2)]


def test_interleaved_work_in_another_order_matches_and_is_reordered():
    """A deterministic program whose threads interleave the same work in
    another order: name alignment left steps unpaired on both sides, and the
    runs were called structurally different with a differing kernel (a trust
    pass, kdebug hunt --all-threads).  Unpaired steps now find their identical
    partner."""
    for x in range(4):  # compiled before either recording
        _interleaved.f(torch.randn(8, 32))
    r = compare(_interleaved(_ORDER_A), _interleaved(_ORDER_B))
    assert r.ok and r.structural == [] and r.roots == [] and r.benign == [], str(r)
    assert len(r.reordered) == 1 and "REORDERED" in str(r), str(r)


def test_interleaved_work_with_one_input_changed_names_its_kernel():
    """The same orders with input 2 changed in the second run: not a match, and
    the first difference is that input's compiled kernel (read from outside),
    not a step of the other inputs' work.  (The reordered steps are listed as
    STRUCTURE here: re-pairing is all or nothing, Note [Steps left unaligned
    by another order].)"""
    r = compare(_interleaved(_ORDER_A), _interleaved(_ORDER_B, bump=2))
    assert not r.ok and r.roots, str(r)
    from kdebug import hashing

    top = r.roots[0]
    assert top.step_a.kind == "kernel" and top.kind == "outside", str(r)
    xs2 = torch.randn(8, 32, generator=torch.Generator().manual_seed(2))
    (arg, in_a, in_b), = top.outside_inputs
    assert in_a == hashing.bitwise(xs2) and in_b == hashing.bitwise(xs2 + 1e-3), str(r)  # input 2's call


def test_shapes_lines_show_whole_arguments():
    """A SHAPES line showed the differing stretch of two op texts cut mid-token
    ('aten::randn([9, 16], dev in run 0', a trust pass): it shows whole
    arguments now."""
    from kdebug.compare import _text_delta

    assert _text_delta("aten::randn([8, 16], device=cpu, pin_memory=False)  ->  t: f32[8, 16]",
                       "aten::randn([9, 16], device=cpu, pin_memory=False)  ->  t: f32[9, 16]", 0, 1) == \
        "aten::randn([8, 16], ...) in run 0, aten::randn([9, 16], ...) in run 1"
    assert _text_delta("aten::add.Tensor(t: f32[4], 1.9e-08)", "aten::add.Tensor(t: f32[4], 2.6e-07)", 0, 1) == \
        "aten::add.Tensor(..., 1.9e-08) in run 0, aten::add.Tensor(..., 2.6e-07) in run 1"
    assert _text_delta("aten::sum.dim_IntList(t: f32[4, 8], [1], True)",
                       "aten::sum.dim_IntList(t: f32[4, 8], [0], True)", 0, 1) == \
        "aten::sum.dim_IntList(..., [1], ...) in run 0, aten::sum.dim_IntList(..., [0], ...) in run 1"


def test_runs_that_launched_no_compiled_kernel_say_so():
    """A hunt of code torch.compile left eager (nn.GRU) said '0 kernels ... all
    runs match' and nothing more (a trust pass): the match covers aten ops
    only, and the report says so; a run with compiled kernels has no such note."""
    x = torch.randn(4, 8)

    def eager():
        with DebugMode() as dm, DebugMode.log_tensor_hashes("bitwise", hash_inputs=True):
            (x * 2).sin()
        return dm

    r = compare(eager(), eager())
    assert r.ok and any("no compiled kernel was launched" in n for n in r.notes), str(r)
    assert "note: no compiled kernel was launched" in str(r)
    f = torch.compile(lambda t: (t * 2).sin())
    f(x)

    def compiled():
        with DebugMode() as dm, DebugMode.log_tensor_hashes("bitwise", hash_inputs=True):
            f(x)
        return dm

    r = compare(compiled(), compiled())
    assert r.ok and r.kernels_b >= 1 and not any("no compiled kernel" in n for n in r.notes), str(r)


def _order_case(case, v):
    xs = [torch.randn(4, 8, generator=torch.Generator().manual_seed(i)) for i in range(3)]
    s0, s1 = xs[0].sum(), xs[0].mul(3).sum()
    with DebugMode() as dm, DebugMode.log_tensor_hashes("bitwise", hash_inputs=True):
        if case == "extra op":  # run 1 does one more op, the rest in another order
            if v:
                xs[1].sin()
            else:
                xs[0].sin(), xs[0].sin()
            xs[0].cos()
            if v:
                xs[0].sin(), xs[0].sin()
        elif case == "values handed over in another order":
            if v:
                xs[0].sin()
            _ = [s1.item(), s0.item()] if v else [s0.item(), s1.item()]
            if not v:
                xs[0].sin()
        else:  # "other work": (x + 1) * 2 against (x * 2) + 1, around reordered work
            if v:
                xs[2].sin(), (xs[0] * 2) + 1, xs[1].sin()
            else:
                (xs[0] + 1) * 2, xs[1].sin(), xs[2].sin()
    return dm


@pytest.mark.parametrize("case", ["extra op", "values handed over in another order", "other work"])
def test_reordering_unaligned_steps_never_hides_other_work(case):
    """Note [Steps left unaligned by another order], after an adversarial
    review: re-pairing is taken only when it explains every unaligned step by
    an identical one; an extra op, values handed to the program in another
    order and work with other values stay differences (the first version
    called the first two a match)."""
    r = compare(_order_case(case, 0), _order_case(case, 1))
    assert not r.ok and r.structural, str(r)


def test_a_python_number_that_differs_is_named_as_such():
    """An eager op given another Python float (computed from time) was said to
    read a difference 'from outside the recorded launches (a graph input,
    RNG, ...)' (a trust pass): it says the program passed another number."""
    x = torch.randn(6, 24, generator=torch.Generator().manual_seed(0))

    def run(v):
        with DebugMode() as dm, DebugMode.log_tensor_hashes("bitwise", hash_inputs=True):
            (x * 1.0 + v).sum().item()
        return dm

    r = compare(run(1.9e-08), run(2.6e-07))
    text = str(r)
    assert not r.ok and r.roots[0].step_a.name == "aten::add.Tensor", text
    assert "another Python number or shape" in text and "from outside the recorded launches" not in text, text
