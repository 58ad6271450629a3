"""Note [Program reads] (kdebug/program_reads.py): a tensor's values leaving
for the program through print / tolist / numpy / pickle (torch.save), which
call no aten op, are recorded while a DebugMode records the final state,
and a difference that reached the program that way decides the verdict.
Real Inductor C++ kernels, with the difference planted in one run."""
from __future__ import annotations

import io

import pytest
import torch

from kdebug import DebugMode, program_reads
from kdebug.compare import compare
from kdebug.testing import perturb_kernel_output


@pytest.fixture(scope="module")
def kernel():
    f = torch.compile(lambda x, i: torch.zeros(4, 3).index_add(0, i, x) * 2)
    x = torch.randn(64, 3, generator=torch.Generator().manual_seed(0))
    i = torch.arange(64) % 4
    f(x, i)
    with DebugMode() as probe:
        f(x, i)
    return f, x, i, probe.kernels[0].kernel_name


def _run(kernel, how, delta):
    """One recorded run whose result leaves through ``how`` and is dropped;
    ``delta`` is added to the kernel's first output element."""
    f, x, i, name = kernel
    with DebugMode(record_final_state=True) as dm, DebugMode.log_tensor_hashes(hash_fn="bitwise", hash_inputs=True):
        with perturb_kernel_output(name, "out_ptr1", 0, delta) as hit:  # the returned product
            y = f(x, i)
        kept = x + 1  # written after the kernel and held at the end: the final state is known
        assert hit["hits"] == 1
        if how == "print":
            got = repr(y)
        elif how == "format":
            got = f"{y}"
        elif how == "tolist":
            got = y.tolist()
        elif how == "save":
            buf = io.BytesIO()
            torch.save(y, buf)
            got = buf.getvalue()
        elif how == "save_view":  # a row that does not hold the difference: torch.save writes the whole storage
            buf = io.BytesIO()
            torch.save({"row": y[1:2]}, buf)
            got = buf.getvalue()
        elif how == "save_storage":
            buf = io.BytesIO()
            torch.save(y.untyped_storage(), buf)
            got = buf.getvalue()
        elif how == "storage_tolist":
            got = y.untyped_storage().tolist()
        elif how == "thread_save":  # an asynchronous checkpoint: the read happens on a thread of its own
            import threading

            buf = io.BytesIO()
            t = threading.Thread(target=torch.save, args=(y, buf))
            t.start()
            t.join()
            got = buf.getvalue()
        else:
            got = None
        del y  # nothing the program holds at the end
    assert kept is not None
    return dm, got


@pytest.mark.parametrize("how", ["print", "format", "tolist", "save", "save_view", "save_storage", "storage_tolist",
                                 "thread_save"])
def test_a_difference_that_left_for_the_program_is_not_benign(kernel, how):
    (a, got_a), (b, got_b) = _run(kernel, how, 0.0), _run(kernel, how, 0.5)
    assert got_a != got_b  # what the program printed / listed / saved differs (Python's own objects)
    r = compare(a, b)
    assert not r.ok and r.benign == [], str(r)
    top = r.roots[0]
    name = {"print": "kdebug::print", "format": "kdebug::print", "tolist": "kdebug::tolist",
            "save": "kdebug::pickle", "save_view": "kdebug::pickle", "save_storage": "kdebug::pickle",
            "storage_tolist": "kdebug::tolist", "thread_save": "kdebug::pickle"}[how]
    assert top.step_a.name == kernel[3] and any(name in v[0] for v in top.values), str(r)
    assert "the program got other values because of it" in str(r)


def test_without_a_read_the_freed_difference_stays_benign(kernel):
    # the same planted difference, dropped unread: benign, the runs match
    (a, _), (b, _) = _run(kernel, None, 0.0), _run(kernel, None, 0.5)
    r = compare(a, b)
    assert r.ok and len(r.benign) == 1 and r.benign[0].step_a.name == kernel[3], str(r)


def test_a_difference_below_the_printed_precision_prints_the_same_text(kernel):
    (a, got_a), (b, got_b) = _run(kernel, "print", 0.0), _run(kernel, "print", 1e-7)
    assert got_a == got_b  # torch prints 4 decimals
    r = compare(a, b)
    assert r.ok and len(r.benign) == 1 and r.benign[0].absorbed == 1, str(r)


def test_reads_are_recorded_only_while_asked_and_the_tensor_methods_come_back(kernel):
    before = {k: torch.Tensor.__dict__.get(k) for k in ("__repr__", "tolist", "numpy", "__array__", "__reduce_ex__")}
    y = torch.ones(3)
    with DebugMode() as plain, DebugMode.log_tensor_hashes(hash_fn="bitwise"):
        repr(y)
        y.tolist()
    assert not any("kdebug::" in str(op) for op in plain.operators)  # not asked: upstream's op list
    with DebugMode(record_final_state=True) as dm, DebugMode.log_tensor_hashes(hash_fn="bitwise"):
        with DebugMode(record_final_state=True):  # nested: installed once, removed with the outer
            pass
        assert "tolist" in torch.Tensor.__dict__
        print(y)
        y.tolist()
        torch.save(y, io.BytesIO())
        str(torch.nn.Parameter(torch.ones(2)))  # one read, though its repr calls Tensor.__repr__
        # kdebug's own code saving a tensor (its replays do) is not the program's read
        exec(compile("torch.save(y, io.BytesIO())", "<kdebug internal>", "exec"),
             {"__name__": "kdebug.replay", "torch": torch, "io": io, "y": y})
    names = [op.op for op in dm.operators if isinstance(op, program_reads.ProgramRead)]
    assert names == ["kdebug::print", "kdebug::tolist", "kdebug::saved_structure", "kdebug::pickle",
                     "kdebug::print"], names
    assert {k: torch.Tensor.__dict__.get(k) for k in before} == before


def _two_draws(seed: int, read_between: bool):
    """Two draws from one generator; the program reads the first one's values
    between the draws, or both only at the end."""
    g = torch.Generator().manual_seed(seed)
    with DebugMode(record_final_state=True) as dm, DebugMode.log_tensor_hashes(hash_fn="bitwise", hash_inputs=True):
        a = torch.rand(8, generator=g)
        first = a.tolist() if read_between else None
        b = torch.rand(8, generator=g)
        c, d = a * 2, b + 1
        out = (c.tolist(), d.tolist(), first)
    return dm, out


@pytest.mark.parametrize("read_between", [False, True])
def test_a_root_is_after_a_read_only_when_the_read_came_before_it(read_between):
    """Note [Differences the program carried]: the second draw 'follows from'
    the first one's values through Python only when the program read those
    values before the second draw ran.  Read only at the end, the two draws
    are independent roots, and the second one's lines must not say the
    program had read the first one's values before it (they said so: the
    roots' positions were compared, not where the program read)."""
    (d0, _), (d1, _) = _two_draws(1, read_between), _two_draws(2, read_between)
    rep = compare(d0, d1)
    draws = [r for r in rep.roots if "rand" in r.step_a.name]
    assert len(draws) == 2, [r.step_a.label() for r in rep.roots]
    first, second = sorted(draws, key=lambda r: r.position)
    assert first.after_read is None
    if read_between:
        assert second.after_read == first.step_a.label(), str(rep)
        assert f"read other values from {first.step_a.label()}" in str(rep)
    else:
        assert second.after_read is None, str(rep)
        assert "before this step" not in str(rep) and "after it read other values" not in str(rep), str(rep)


def test_a_pickled_state_dict_under_kdebug_record_adds_no_warning_to_the_programs_output(tmp_path):
    """Pickling a state_dict hands the program-read hook TypedStorages;
    reading them with untyped() warned 'TypedStorage is deprecated' into the
    program's output, which its plain run does not print (a trust pass)."""
    import subprocess
    import sys

    script = tmp_path / "save.py"
    script.write_text("import pickle, torch\n"
                      "m = torch.nn.Linear(4, 4)\n"
                      "f = torch.compile(m)\n"
                      "f(torch.ones(2, 4))\n"
                      "print(len(pickle.dumps(m.state_dict())) > 0 and 'saved')\n")
    plain = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    rec = subprocess.run([sys.executable, "-m", "kdebug", "record", "-o", "r.kdt", "--", str(script)],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert plain.returncode == 0 and rec.returncode == 0, rec.stderr
    assert "TypedStorage" not in plain.stderr  # the check below means something only if so
    assert "TypedStorage" not in rec.stderr, rec.stderr
    assert rec.stdout.splitlines()[0] == "saved"


@pytest.mark.parametrize("how", ["print", "tolist"])
def test_a_read_inside_a_compiled_function_leaves_the_rest_of_it_compiled(how, capsys):
    """A print or tolist inside a torch.compile'd function is a graph break;
    Dynamo compiles what follows it as a function of its own.  With the
    readers wrapped in kdebug's Python, Dynamo compiled the wrappers' frames
    when the read ran after the break, and what followed the read ran
    uncompiled: an eager softmax (the program got another result under
    kdebug record, a trust pass) and no kernel to record, so a race after
    a debugging print was called a match (Note [Program reads under
    torch.compile])."""
    def g(x):
        y = x.cos()
        if how == "print":
            print("y[:3] =", y[:3])
        else:
            y[:2].tolist()
        return (torch.softmax(y, 0) * y).sum()

    x = torch.randn(100_003, generator=torch.Generator().manual_seed(0))
    torch._dynamo.reset()
    plain = torch.compile(g)(x).item()  # no recording: the program's own result
    torch._dynamo.reset()
    cg = torch.compile(g)
    with DebugMode(record_final_state=True) as dm, DebugMode.log_tensor_hashes():
        got = cg(x).item()
    torch._dynamo.reset()
    names = [k.kernel_name for k in dm.kernels]
    assert len(names) == 2 and "softmax" in names[1], names
    assert got == plain  # bitwise: the same compiled kernels
    reads = [op.op for op in dm.operators if isinstance(op, program_reads.ProgramRead)]
    assert reads == [program_reads.PRINT if how == "print" else program_reads.TOLIST]


def test_torch_save_given_keywords_saves_and_is_recorded(tmp_path):
    """torch.save(obj=..., f=...) is legal; kdebug's wrapper took the object
    as its first positional argument and raised TypeError into the program."""
    t = torch.arange(6.0)
    with DebugMode(record_final_state=True) as dm, DebugMode.log_tensor_hashes():
        torch.save(obj={"w": t}, f=str(tmp_path / "ck.pt"))
        torch.save({"w": t}, f=str(tmp_path / "ck2.pt"))
    assert torch.equal(torch.load(str(tmp_path / "ck.pt"))["w"], t)
    assert torch.equal(torch.load(str(tmp_path / "ck2.pt"))["w"], t)
    saved = [op.op for op in dm.operators if isinstance(op, program_reads.ProgramRead)]
    assert saved == [program_reads.SAVED, program_reads.PICKLE] * 2, saved


def _saved(obj_of_run):
    with DebugMode(record_final_state=True) as dm, DebugMode.log_tensor_hashes(hash_fn="bitwise"):
        buf = io.BytesIO()
        torch.save(obj_of_run, buf)
    return dm


def test_a_save_of_the_same_values_under_other_keys_differs():
    """A checkpoint whose keys came out in another order (heads built from a
    set) pickled the same values in the same order under other names: every
    kdebug::pickle read matched and the hunt said the runs match while the
    saved files differed (a trust pass).  Note [What a save wrote]."""
    a, b = torch.arange(4.0), torch.arange(4.0) * 2
    same = compare(_saved({"x": a, "y": b, "step": 3}), _saved({"x": a, "y": b, "step": 3}))
    assert same.ok, str(same)
    swapped = compare(_saved({"x": a, "y": b, "step": 3}), _saved({"y": a, "x": b, "step": 3}))
    text = str(swapped)
    assert not swapped.ok and swapped.roots[0].step_a.name == program_reads.SAVED, text
    assert "saved another structure with torch.save" in text and "non-deterministic" not in text, text
    # a value besides tensors counts by its type: a checkpoint's time or run id differs in every run of a
    # deterministic program (a review of the first version, which compared them by repr)
    import time

    stamped = compare(_saved({"x": a, "at": time.time(), "id": "r1"}), _saved({"x": a, "at": time.time() + 1,
                                                                             "id": "r2"}))
    assert stamped.ok, str(stamped)
    retyped = compare(_saved({"x": a, "step": 3}), _saved({"x": a, "step": None}))
    assert not retyped.ok and retyped.roots[0].step_a.name == program_reads.SAVED, str(retyped)


def test_a_read_through_the_class_compiles_in_a_fullgraph_function():
    """torch.Tensor.tolist(y) inside fullgraph=True compiled without kdebug
    and failed under it once the wrappers were disabled for Dynamo
    ('Skip calling torch.compiler.disable()'d function'; a review): traced,
    a wrapper does what it stands for (Note [Program reads under
    torch.compile])."""
    def b(x):
        y = x * 2
        return y + sum(torch.Tensor.tolist(y)[0])

    x = torch.arange(6).reshape(2, 3)
    with torch._dynamo.config.patch(capture_scalar_outputs=True):
        torch._dynamo.reset()
        plain = torch.compile(b, fullgraph=True)(x)
        torch._dynamo.reset()
        with DebugMode(record_final_state=True) as dm, DebugMode.log_tensor_hashes():
            got = torch.compile(b, fullgraph=True)(x)
        torch._dynamo.reset()
    assert torch.equal(got, plain) and len(dm.kernels) >= 1


def test_a_tensor_formatted_by_compile_time_code_is_no_endless_call():
    """Code that runs while a graph compiles (a backend, AOTAutograd's
    logging of its metadata) sees torch.compiler.is_compiling() True without
    Dynamo tracing it: the wrapper of __repr__ called the tensor's __repr__
    by name, itself, without end, and the compile failed (a RecursionError in
    CI, in a test that compiled a module under assert_deterministic)."""
    seen = []

    def backend(gm, example_inputs):
        seen.append(repr(torch.ones(2)))
        return gm.forward

    f = torch.compile(lambda x: x.sin() + 1, backend=backend)
    torch._dynamo.reset()
    with DebugMode(record_final_state=True), DebugMode.log_tensor_hashes():
        got = f(torch.ones(3))
    torch._dynamo.reset()
    assert seen == ["tensor([1., 1.])"] and torch.equal(got, torch.ones(3).sin() + 1)
