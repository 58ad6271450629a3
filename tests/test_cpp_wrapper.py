"""Kernel launches of Inductor's C++ wrapper and of AOTInductor packages,
recorded through kdebug's C++ launch hook (Note [C++ wrapper launches] in
csrc/kd_cpp_launch.c), checked against the default (Python) wrapper's
recording of the same function."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import kdebug
from kdebug import DebugMode, KdebugWarning
from kdebug.compare import compare
from kdebug.testing import perturb_kernel_output


def _f(x, y):
    a = torch.sin(x) + y
    b = a @ y  # an extern call between two fused kernels
    return (b * 2).relu() - a.sum(), b.cos()


def _inputs(device="cpu"):
    g = torch.Generator().manual_seed(0)
    return torch.randn(16, 16, generator=g).to(device), torch.randn(16, 16, generator=g).to(device)


def _record(fn, *args):
    with DebugMode() as dm:
        with DebugMode.log_tensor_hashes(hash_fn="bitwise", hash_inputs=True):
            out = fn(*args)
    return dm, out


def _launches(dm):
    """The kernel launches (not the extern calls recorded from C++, whose
    Python-wrapper counterparts are aten ops in dm.operators)."""
    return [(k.kernel_name, list(k.arg_names), dict(k.roles), k.post_hashes) for k in dm.kernels
            if not k.kernel_name.startswith("aten::")]


def _compile(cpp_wrapper: bool):
    torch._dynamo.reset()
    return torch.compile(_f, options={"cpp_wrapper": cpp_wrapper})


def test_cpp_wrapper_launches_equal_the_python_wrappers():
    x, y = _inputs()
    py_dm, py_out = _record(_compile(False), x, y)
    cw = _compile(True)
    cw_dm, cw_out = _record(cw, x, y)  # compiled inside the recording: hooked
    torch.testing.assert_close(cw_out, py_out)
    assert cw_dm.complete and py_dm.complete
    assert kdebug._C._cpp_launch_stats()["before"] > 0
    assert _launches(cw_dm) == _launches(py_dm) and len(_launches(cw_dm)) == 2
    cpp = [k for k in cw_dm.kernels if not k.kernel_name.startswith("aten::")]
    assert all(isinstance(k, kdebug._CppKernelCall) for k in cpp)
    # pre-launch hashes too: what each kernel read
    assert [k.pre_hashes for k in cpp] == [k.pre_hashes for k in py_dm.kernels]
    # a second recorded run of the same hooked module: the same records
    again, _ = _record(cw, x, y)
    assert again.complete and _launches(again) == _launches(cw_dm)
    # outside a recording the hooked module runs and records nothing
    before = kdebug._C._cpp_launch_stats()
    torch.testing.assert_close(cw(x, y), py_out)
    assert kdebug._C._cpp_launch_stats() == before


def _scalar_args(dm):
    return [[(n, a) for n, a in zip(k.arg_names, k.args) if isinstance(a, (int, float))] for k in dm.kernels]


def test_cpp_wrapper_records_the_scalar_arguments_of_a_dynamic_shape_graph():
    # dynamic=True: the C++ kernels take the sizes as `const int64_t ks0, ...`;
    # the hook passes them by value, in call order among the tensors, as the
    # Python wrapper's pybinding call does
    def f(x, y):
        return (x.sin() * y).sum(0), (x.cos() + y).amax(1)

    g = torch.Generator().manual_seed(1)
    small = (torch.randn(37, 5, generator=g), torch.randn(37, 5, generator=g))
    big = (torch.randn(41, 6, generator=g), torch.randn(41, 6, generator=g))
    torch._dynamo.reset()
    py = torch.compile(f, dynamic=True, options={"cpp_wrapper": False})
    py_small, _ = _record(py, *small)
    torch._dynamo.reset()
    cw = torch.compile(f, dynamic=True, options={"cpp_wrapper": True})
    cw_small, _ = _record(cw, *small)
    cw_big, _ = _record(cw, *big)  # the same hooked module, other sizes: the values are the call's
    assert cw_small.complete and cw_big.complete
    small_scalars = _scalar_args(cw_small)
    assert small_scalars == _scalar_args(py_small), (small_scalars, _scalar_args(py_small))
    assert {v for k in small_scalars for _, v in k} == {37, 5}
    assert {v for k in _scalar_args(cw_big) for _, v in k} == {41, 6}
    assert all(n.startswith("ks") for k in small_scalars for n, _ in k) and any(small_scalars)
    # the tensors keep their places and roles between the scalars
    assert _launches(cw_small) == _launches(py_small)


def test_fresh_buffers_reused_in_place_are_written_not_read():
    # Note [Fresh buffers in C++ wrappers]: the reductions' results land in
    # freshly allocated buffers that Inductor passes as in_out_ptr (reused in
    # place); their bytes before the launch are uninitialized memory.  As in
    # the Python wrapper, they are written only: no pre-launch hash of garbage
    # (it differed from run to run and made a false input difference).
    ln, lin = torch.nn.LayerNorm(16), torch.nn.Linear(16, 16)

    def step(x):
        y = torch.nn.functional.gelu(ln(lin(x))).sum()
        y.backward()
        return (x.sum() + 1).sin(), x.var(0), y

    x = torch.randn(4, 16)

    def kernels(cpp_wrapper):
        torch._dynamo.reset()
        f = torch.compile(step, options={"cpp_wrapper": cpp_wrapper})
        dm, _ = _record(f, x)
        return [(k.kernel_name, dict(k.roles), sorted(k.pre_hashes)) for k in dm.kernels
                if not k.kernel_name.startswith("aten::")]

    py, cw = kernels(False), kernels(True)
    assert cw == py
    fresh = [(name, a) for name, roles, pre in cw for a, r in roles.items() if a.startswith("in_out_ptr") and r == "W"]
    assert fresh, cw  # the case is there: in_out_ptr buffers written only
    assert all(a not in pre for name, roles, pre in cw for a, r in roles.items() if r == "W")


def test_a_launch_with_hundreds_of_arguments_is_recorded_whole():
    # a foreach kernel over 90 dynamic-size tensors: 180 pointers and 90 sizes
    def f(*xs):
        return torch._foreach_add(torch._foreach_mul(list(xs), 2.0), 1.0)

    xs = [torch.randn(3 + i) for i in range(90)]
    torch._dynamo.reset()
    cw = torch.compile(f, dynamic=True, options={"cpp_wrapper": True})
    dm, out = _record(cw, *xs)
    assert dm.complete, dm.kernel_stats
    torch.testing.assert_close(list(out), [x * 2 + 1 for x in xs])
    n_args = [len(k.args) for k in dm.kernels]
    assert sum(n_args) >= 270 and max(n_args) > 256, n_args
    sizes = sorted(a for k in dm.kernels for a in k.args if isinstance(a, int))
    assert sizes == sorted(x.numel() for x in xs), sizes


def test_extern_out_calls_are_recorded_with_the_python_paths_hashes():
    x, y = _inputs()
    py_dm, _ = _record(_compile(False), x, y)
    cw_dm, _ = _record(_compile(True), x, y)
    mm = [k for k in cw_dm.kernels if k.kernel_name == "aten::mm.out"]
    assert len(mm) == 1 and dict(mm[0].roles) == {"out": "W", "self": "R", "mat2": "R"}
    py_mm = next(op for op in py_dm.operators if "aten::mm.out" in str(op))
    assert mm[0].post_hashes["out"] == py_mm.log["hash"]
    # the C++ kernels around it: the same records as with the Python wrapper
    assert [k.kernel_name for k in cw_dm.kernels][1] == "aten::mm.out"  # in program order


def test_extern_calls_kdebug_cannot_describe_make_the_recording_incomplete():
    def h(x):
        v, i = torch.sort(x.sin(), dim=-1)  # a C-shim fallback whose outputs it allocates
        return v * 2, i

    torch._dynamo.reset()
    c = torch.compile(h, options={"cpp_wrapper": True})
    with pytest.warns(KdebugWarning, match="not recorded"):
        dm, _ = _record(c, torch.randn(8, 8))
    s = dm.kernel_stats
    assert not dm.complete and s["unrecorded"] == 1
    assert any("sort" in m and "does not describe" in m for m in s["error_messages"])


def _planted_in_first_kernel(device: str):
    """(base, bad, kernel name, its first written argument): two recordings of
    the cpp_wrapper function, the second with that argument perturbed after
    the first kernel ran (from kdebug's C++ launch hook)."""
    x, y = _inputs(device)
    cw = _compile(True)
    base, _ = _record(cw, x, y)
    k0 = base.kernels[0].kernel_name
    written = [n for n, r in base.kernels[0].roles.items() if "W" in r]
    with perturb_kernel_output(k0, written[0], cpp_wrapper=True) as hit:
        bad, _ = _record(cw, x, y)
    assert hit["hits"] == 1
    return base, bad, k0, written[0]


def test_planted_fault_under_cpp_wrapper_is_named_by_compare():
    base, bad, k0, arg = _planted_in_first_kernel("cpu")
    r = compare(base, bad)
    d = r.divergence
    assert not r.ok and d.kind == "output" and d.step_a.name == k0 and d.arg == arg
    assert f"FIRST DIVERGENCE: kernel #0 {k0}" in str(r)
    # the extern mm and the kernel after it read what it wrote
    assert {x.name for x, _ in d.inherited} == {"aten::mm.out", base.kernels[2].kernel_name}


def test_warm_cache_never_reuses_an_unhooked_module(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    x, y = _inputs()
    with torch._inductor.config.patch(fx_graph_cache=True):
        cw = _compile(True)
        cw(x, y)  # outside a recording: un-hooked, and cached
        cw = _compile(True)  # the same graph again, compiled inside a recording
        dm, _ = _record(cw, x, y)
    assert dm.complete and dm.kernel_stats["bypassed_graph_calls"] == {}
    assert len(dm.kernels) >= 2


def test_unhooked_cpp_wrapper_module_is_refused():
    x, y = _inputs()
    cw = _compile(True)
    cw(x, y)  # compiled outside any recording
    with pytest.warns(KdebugWarning, match="cpp_wrapper.*NOT recorded.*recompiled with the hook"):
        dm, _ = _record(cw, x, y)
    assert not dm.complete and dm.kernel_stats["bypassed_graph_calls"] == {"cpp_wrapper": 1}


def test_hunt_records_cpp_wrapper_launches_and_views_passed_to_extern_calls(tmp_path):
    script = tmp_path / "det.py"
    script.write_text(textwrap.dedent("""
        import torch
        f = torch.compile(lambda x: (x.sin() @ x.T).softmax(-1).sum(0), options={"cpp_wrapper": True})
        f(torch.arange(64.0).reshape(8, 8) / 64)
    """))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(kdebug.__file__).parents[1]),
                                                         os.environ.get("PYTHONPATH", "")])}
    p = subprocess.run([sys.executable, "-m", "kdebug", "hunt", "--runs", "2", "--in-process", str(script)],
                       capture_output=True, text=True, cwd=tmp_path, env=env, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    # two C++ kernels and the mm between them, whose second argument is a view (x.T)
    assert "3 kernels" in p.stdout and "all runs match" in p.stdout
    assert "not recorded" not in p.stderr and "INCOMPLETE" not in p.stdout


class _M(torch.nn.Module):
    def forward(self, x, y):
        return _f(x, y)


def _aoti(tmp_path, name, device="cpu"):
    x, y = _inputs(device)
    ep = torch.export.export(_M(), (x, y))
    path = torch._inductor.aoti_compile_and_package(ep, package_path=str(tmp_path / f"{name}.pt2"))
    return path, (x, y)


def test_aoti_package_compiled_under_kdebug_records_its_kernels(tmp_path):
    x, y = _inputs()
    py_dm, py_out = _record(_compile(False), x, y)
    # recording while compiling: the package gets the hook; with hashes on, the fake tensors
    # AOTInductor traces on go through the mode too (hashing one crashed the process)
    with DebugMode(), DebugMode.log_tensor_hashes("bitwise", hash_inputs=True):
        path, args = _aoti(tmp_path, "hooked")
    model = torch._inductor.aoti_load_package(path)
    dm, out = _record(model, *args)
    torch.testing.assert_close(out, py_out)
    assert dm.complete, dm.kernel_stats
    names = [k.kernel_name for k in dm.kernels]
    assert names.count("aten::mm.out") == 1 and len(names) == 3
    assert all(n.startswith("cpp_fused") for n in names if n != "aten::mm.out")
    # the same output hashes as the Python wrapper's kernels
    aoti = [k.post_hashes for k in dm.kernels if k.kernel_name != "aten::mm.out"]
    assert sorted(map(str, aoti)) == sorted(map(str, (k.post_hashes for k in py_dm.kernels)))


_THREADED_AOTI = """
import sys, threading, time, torch
from kdebug import DebugMode

def f(x):
    return (x.sin() @ x.t()).cos()     # an intermediate buffer, freed inside the model

class M(torch.nn.Module):
    def forward(self, x):
        return f(x)

ep = torch.export.export(M(), (torch.randn(8, 5),))
with DebugMode():
    path = torch._inductor.aoti_compile_and_package(ep, package_path=sys.argv[1])
model = torch._inductor.aoti_load_package(path)
calls = []

def slow_hash(t):
    # planted: every hash gives the GIL away for a while, inside the model's run,
    # so the other thread certainly calls the model meanwhile
    time.sleep(0.002)
    calls.append(1)
    return float(t.double().sum())

def work(n):
    for _ in range(n):
        model(torch.randn(8, 5))

with DebugMode(record_all_threads=True) as dm, DebugMode.log_tensor_hashes(slow_hash):
    ts = [threading.Thread(target=work, args=(10,)) for _ in range(3)]
    for t in ts:
        t.start()
    work(10)
    for t in ts:
        t.join()
print("DONE", len(dm.kernels), dm.complete, len(calls) > 0, flush=True)
"""


def test_threads_calling_one_hooked_aoti_model_while_recording_do_not_deadlock(tmp_path):
    # Note [One caller per hooked AOTI model]: without the loader's lock this hung
    script = tmp_path / "threads.py"
    script.write_text(_THREADED_AOTI)
    p = subprocess.run([sys.executable, str(script), str(tmp_path / "m.pt2")], capture_output=True, text=True,
                       timeout=300, env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    assert p.returncode == 0, p.stdout + p.stderr[-3000:]
    done = [ln for ln in p.stdout.splitlines() if ln.startswith("DONE")]
    assert done, p.stdout + p.stderr[-3000:]
    _, kernels, complete, hashed = done[0].split()
    # 4 threads x 10 calls, each an mm (extern, recorded from C++) and two C++ kernels
    assert (int(kernels), complete, hashed) == (4 * 10 * 3, "True", "True"), done


def test_unhooked_aoti_package_is_refused_loudly(tmp_path):
    path, args = _aoti(tmp_path, "plain")  # compiled outside any recording
    model = torch._inductor.aoti_load_package(path)
    with pytest.warns(KdebugWarning, match="AOTInductor.*NOT recorded.*inside a kdebug DebugMode"):
        dm, _ = _record(model, *args)
    assert not dm.complete and dm.kernel_stats["bypassed_graph_calls"] == {"AOTInductor": 1}
    assert dm.kernels == [] or len(dm.kernels) == 0


# ---------------------------------------------------------------- GPU (Triton kernels from C++)

_AOTI_PROBE = """
import os, sys, tempfile, torch
class M(torch.nn.Module):
    def forward(self, x):
        return x.sin() + 1
x = torch.randn(8, device="cuda")
ep = torch.export.export(M(), (x,))
p = torch._inductor.aoti_compile_and_package(ep, package_path=os.path.join(tempfile.mkdtemp(), "p.pt2"))
torch._inductor.aoti_load_package(p)(x)
"""


@pytest.fixture(scope="module")
def cuda_aoti_loads():
    """A CUDA AOTI package compiled and loaded in a fresh process, no kdebug:
    on the lent GPU machine torch's loader crashes in the package's own
    std::regex when Inductor builds it with CXX=/opt/gcc/bin/g++ (a GCC
    whose libstdc++ is not the one the process loaded); with the system g++
    it works.  Skips, naming the compiler, where that is so."""
    r = subprocess.run([sys.executable, "-c", _AOTI_PROBE], capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        pytest.skip(f"a CUDA AOTI package built by this machine's compiler (CXX={os.environ.get('CXX')!r}) "
                    f"cannot be loaded here, kdebug not imported (exit {r.returncode}: {r.stderr[-300:]!r}); "
                    "run with CXX=g++ (the compiler of the loaded libstdc++)")


@pytest.mark.gpu
def test_gpu_aoti_package_compiled_outside_a_recording_is_refused_loudly(cuda_aoti_loads, tmp_path):
    """A CUDA AOTInductor package compiled outside any recording has no hook:
    running it under kdebug says the recording is incomplete and leaves the
    results alone."""
    path, args = _aoti(tmp_path, "gpu_unhooked", "cuda")
    model = torch._inductor.aoti_load_package(path)
    expected = model(*args)
    with pytest.warns(kdebug.KdebugWarning, match="AOTInductor.*NOT recorded"):
        dm, out = _record(model, *args)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    assert not dm.complete and dm.kernel_stats["bypassed_graph_calls"] == {"AOTInductor": 1}


def _triton_launches(dm):
    """Every field of the Triton launch records: name, arguments (tensors and
    scalars) with roles, grid, config, warps, stages, shared memory, hashes."""
    return [(k.kernel_name, list(k.arg_names), dict(k.roles), [a for a in k.args if isinstance(a, (int, float))],
             k.grid, k.config, k.num_warps, k.num_stages, k.shared_mem, k.pre_hashes, k.post_hashes)
            for k in dm.kernels if not k.kernel_name.startswith("aten::")]


def test_triton_call_params_keep_a_constant_passed_and_drop_meta_parameters():
    # the triton_meta torch 2.11 gave a one-row persistent reduction on the H100:
    # run() and the C++ call pass xnumel = 1 (specialized, then compiled in),
    # not XBLOCK; naming by the non-constexpr parameters alone named 1 "r0_numel"
    meta = {"signature": {"in_ptr0": "*fp32", "in_ptr1": "*fp32", "out_ptr0": "*fp32", "out_ptr1": "*fp32",
                          "xnumel": "constexpr", "r0_numel": "i32", "XBLOCK": "constexpr"},
            "constants": {"xnumel": 1}}
    assert kdebug.inductor.triton_call_params(meta) == [
        ("in_ptr0", "*fp32"), ("in_ptr1", "*fp32"), ("out_ptr0", "*fp32"), ("out_ptr1", "*fp32"),
        ("xnumel", "constexpr"), ("r0_numel", "i32")]
    from kdebug.cpp_launch import SCALAR_FLOAT, SCALAR_INT, _triton_scalar_role
    assert _triton_scalar_role("constexpr", 1) == SCALAR_INT | 1
    assert _triton_scalar_role("fp32") == SCALAR_FLOAT | 1 and _triton_scalar_role("i64") == SCALAR_INT | 1
    assert _triton_scalar_role("constexpr", None) is None and _triton_scalar_role("nvTmaDesc") is None


class _Param:  # the face of triton.runtime.jit.KernelParam that kdebug reads
    def __init__(self, name: str, constexpr: bool):
        self.name, self.is_constexpr = name, constexpr


class _Jit:  # a JITFunction's face: kernel(x_ptr, ACT: tl.constexpr, out_ptr, n, BLOCK: tl.constexpr)
    params = [_Param("x_ptr", False), _Param("ACT", True), _Param("out_ptr", False), _Param("n", False),
              _Param("BLOCK", True)]


def test_triton_call_params_drop_a_user_kernels_constexpr_arguments():
    """A user-defined Triton kernel's tl.constexpr argument is in triton_meta's
    constants, as a specialized xnumel = 1 is, but Inductor does not pass it
    (torch 2.13 ir.UserDefinedTritonKernel.codegen): naming run()'s arguments
    by the signature gave out_ptr the name ACT (and the role of a read) and
    the scalar n the name out_ptr.  The kernel's own constexpr parameters
    decide; a parameter specialized to a constant (1 or None) stays."""
    from kdebug.inductor import jit_constexprs, triton_call_params, triton_roles

    meta = {"signature": {"x_ptr": "*fp32", "ACT": "constexpr", "out_ptr": "*fp32", "n": "i32",
                          "BLOCK": "constexpr"},
            "constants": {"ACT": 1}}
    assert jit_constexprs(_Jit) == {"ACT", "BLOCK"}
    assert jit_constexprs(type("Autotuner", (), {"fn": _Jit})) == {"ACT", "BLOCK"}  # Autotuner / Heuristics
    assert jit_constexprs(object()) == frozenset() and jit_constexprs(None) == frozenset()
    names = [n for n, _ in triton_call_params(meta, jit_constexprs(_Jit))]
    assert names == ["x_ptr", "out_ptr", "n"]
    assert triton_roles(names, frozenset({"out_ptr"}))[:2] == [1, 2]  # x_ptr read, out_ptr written


def test_cpp_wrapper_triton_call_of_a_user_kernel_is_named_by_its_raw_keys():
    """The C++ wrapper's call of a user kernel names what it passes (raw_keys):
    a tl.constexpr argument is not among them; an argument given as None is
    passed as -1 and compiled out (not recorded); a scalar of a type kdebug
    does not record is refused with a ValueError (counted as an unrecorded
    launch), never another exception out of Inductor's codegen."""
    from kdebug import _C
    from kdebug.cpp_launch import SCALAR_INT, _launch_site

    class Wrapper:  # prepare_triton_wrapper_args as CppWrapperGpu's: the C++ expressions
        @staticmethod
        def prepare_triton_wrapper_args(args, types):
            return [str(a) for a in args], list(types)

    meta = {"signature": {"x_ptr": "*fp32", "maybe": "constexpr", "out_ptr": "*fp32", "n": "i32",
                          "ACT": "constexpr"},
            "constants": {"maybe": None, "ACT": 2}}
    call = {"kernel_name": "user_kernel_0", "triton": True, "wrapper": Wrapper(),
            "call_args": ["buf0", -1, "buf1", "s0"], "arg_types": [torch.float32, int, torch.float32, int],
            "triton_meta": meta, "inductor_meta": {"mutated_arg_names": ["out_ptr"]},
            "raw_keys": ["x_ptr", "maybe", "out_ptr", "n"]}
    kind, exprs, names, roles = _launch_site(call)
    assert (kind, exprs, names) == (_C.KIND_TRITON, ["buf0", "buf1", "s0"], ["x_ptr", "out_ptr", "n"])
    assert roles[:2] == [1, 2] and roles[2] == SCALAR_INT | 1
    bad = dict(call, triton_meta={"signature": dict(meta["signature"], n="nvTmaDesc"), "constants": meta["constants"]})
    with pytest.raises(ValueError, match="argument n = 's0' is a scalar of a type kdebug does not record"):
        _launch_site(bad)


@pytest.mark.gpu
def test_gpu_user_triton_kernel_with_a_constexpr_argument_is_named_in_both_wrappers():
    """A user-defined Triton kernel whose tl.constexpr parameter comes before
    others, compiled through both wrappers: the records name out_ptr as the
    written output (its hash taken after the launch) and n as a scalar."""
    import triton
    import triton.language as tl

    @triton.jit
    def scale_kernel(x_ptr, FACTOR: tl.constexpr, out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * FACTOR, mask=mask)

    def f(x):
        out = torch.empty_like(x)
        scale_kernel[(triton.cdiv(x.numel(), 128),)](x, 3, out, x.numel(), BLOCK=128)
        return out.sin()

    x = torch.randn(1000, device="cuda")
    for cpp_wrapper in (False, True):
        torch._dynamo.reset()
        dm, out = _record(torch.compile(f, options={"cpp_wrapper": cpp_wrapper}), x)
        torch.testing.assert_close(out, (x * 3).sin())
        assert dm.complete, (cpp_wrapper, dm.kernel_stats)
        k = next(k for k in dm.kernels if "scale_kernel" in k.kernel_name)
        assert list(k.arg_names) == ["x_ptr", "out_ptr", "n"], (cpp_wrapper, k.arg_names)
        assert "out_ptr" in k.post_hashes and k.kwargs.get("n") == 1000, (cpp_wrapper, k.post_hashes, k.kwargs)


@pytest.mark.gpu
def test_gpu_cpp_wrapper_triton_launches_equal_the_python_wrappers():
    x, y = _inputs("cuda")
    py_dm, py_out = _record(_compile(False), x, y)
    cw_dm, cw_out = _record(_compile(True), x, y)
    torch.testing.assert_close(cw_out, py_out)
    assert cw_dm.complete, cw_dm.kernel_stats
    # the same records as the Python wrapper's: names, roles, the numel
    # scalars; the grid and config the generated C++ launched with
    # (HOOK_VERSION 3) and the hashes equal where both compiles' autotuning
    # chose the same config (on the H100 one pointwise kernel got XBLOCK=128
    # in one compile and 256 in the other)
    cw, py = _triton_launches(cw_dm), _triton_launches(py_dm)
    assert len(cw) == len(py) == 2, (cw, py)
    for a, b in zip(cw, py):
        assert a[:4] == b[:4], (a, b)
        assert a[4] is not None and a[5] and a[3], a  # grid, config, numels
        if a[5:9] == b[5:9]:
            assert a == b, (a, b)
    pointwise = 0
    for k in cw_dm.kernels:
        cfg = dict(kv.split("=") for kv in (k.config or "").split(", ") if "=" in kv)
        if set(cfg) == {"XBLOCK"} and "xnumel" in k.kwargs:  # one program per XBLOCK elements
            pointwise += 1  # the pointwise kernel; on the H200 the persistent reduction's config too
            assert k.grid == (-(-k.kwargs["xnumel"] // int(cfg["XBLOCK"])), 1, 1), (k.grid, cfg, k.kwargs)
    assert pointwise >= 1
    assert all(isinstance(k, kdebug._TritonKernelCall) for k in cw_dm.kernels
               if not k.kernel_name.startswith("aten::"))
    mm = [k for k in cw_dm.kernels if k.kernel_name == "aten::mm.out"]
    py_mm = next(op for op in py_dm.operators if "aten::mm.out" in str(op))
    assert len(mm) == 1 and mm[0].post_hashes["out"] == py_mm.log["hash"]


@pytest.mark.gpu
def test_gpu_cpp_wrapper_records_triton_scalars_and_grids_of_a_dynamic_graph():
    # dynamic=True: the Triton kernels take ks0 / xnumel / r0_numel as
    # C++ expressions of the graph's sizes; one hooked module run at two sizes
    # records each call's values and grid, as the Python wrapper does
    def f(x, y):
        return (x.sin() * y).sum(0), (x.cos() + y).amax(1)

    g = torch.Generator().manual_seed(1)
    small = tuple(torch.randn(37, 5, generator=g).cuda() for _ in range(2))
    big = tuple(torch.randn(41, 6, generator=g).cuda() for _ in range(2))
    torch._dynamo.reset()
    py = torch.compile(f, dynamic=True, options={"cpp_wrapper": False})
    py_small, _ = _record(py, *small)
    py_big, _ = _record(py, *big)
    torch._dynamo.reset()
    cw = torch.compile(f, dynamic=True, options={"cpp_wrapper": True})
    cw_small, _ = _record(cw, *small)
    cw_big, _ = _record(cw, *big)
    assert cw_small.complete and cw_big.complete, (cw_small.kernel_stats, cw_big.kernel_stats)
    for c, p_, sizes in ((cw_small, py_small, {37, 5}), (cw_big, py_big, {41, 6})):
        cl, pl = _triton_launches(c), _triton_launches(p_)
        assert len(cl) == len(pl) and cl
        for a, b in zip(cl, pl):
            assert a[:4] == b[:4], (a, b)  # names, arguments, roles, scalar values
            assert a[4] is not None and a[5]  # a grid and a config
            if a[5:9] == b[5:9]:  # the same config chosen: the same grid and hashes
                assert a == b, (a, b)
        assert sizes <= {v for t in cl for v in t[3]}, cl


@pytest.mark.gpu
def test_gpu_cpp_wrapper_planted_fault_is_named(tmp_path):
    base, bad, k0, _ = _planted_in_first_kernel("cuda")
    d = compare(base, bad).divergence
    assert d.kind == "output" and d.step_a.name == k0


@pytest.mark.gpu
def test_gpu_aoti_package_records_triton_kernels(cuda_aoti_loads, tmp_path):
    """A CUDA AOTI package compiled inside a recording: its Triton launches
    (and the extern mm) recorded from the C++ hook, complete, with the same
    kernel sequence and output hashes as the Python wrapper's recording of
    the same function."""
    x, y = _inputs("cuda")
    py_dm, py_out = _record(_compile(False), x, y)
    with DebugMode():
        path, args = _aoti(tmp_path, "hooked_gpu", "cuda")
    model = torch._inductor.aoti_load_package(path)
    dm, out = _record(model, *args)
    torch.testing.assert_close(out, py_out)
    assert dm.complete, dm.kernel_stats
    names = [k.kernel_name for k in dm.kernels]
    assert names.count("aten::mm.out") == 1 and len(names) == 3, names
    assert all(n.startswith("triton_") for n in names if n != "aten::mm.out"), names
    assert all(k.post_hashes for k in dm.kernels)
    aoti = [k.post_hashes for k in dm.kernels if k.kernel_name != "aten::mm.out"]
    assert sorted(map(str, aoti)) == sorted(map(str, (k.post_hashes for k in py_dm.kernels))), (aoti, py_dm.kernels)


@pytest.mark.gpu
def test_gpu_aoti_planted_fault_is_named(cuda_aoti_loads, tmp_path):
    """One output of the package's first Triton kernel perturbed after it ran
    (from kdebug's C++ launch hook): compare names that kernel and argument."""
    with DebugMode():
        path, args = _aoti(tmp_path, "planted_gpu", "cuda")
    model = torch._inductor.aoti_load_package(path)
    base, _ = _record(model, *args)
    k0 = base.kernels[0].kernel_name
    written = [n for n, r in base.kernels[0].roles.items() if "W" in r]
    with perturb_kernel_output(k0, written[0], cpp_wrapper=True) as hit:
        bad, _ = _record(model, *args)
    assert hit["hits"] == 1
    r = compare(base, bad)
    d = r.divergence
    assert not r.ok and d.kind == "output" and d.step_a.name == k0 and d.arg == written[0], str(r)


_ATOMIC = '''
import os, sys, tempfile, torch
class M(torch.nn.Module):
    def forward(self, x, ind):  # tl.atomic_add on 400k colliding indices: not bitwise reproducible
        return (torch.zeros(100, device=x.device).index_add(0, ind, x) * 2).sin()
g = torch.Generator(device="cuda").manual_seed(0)
x = torch.randn(400_000, device="cuda", generator=g)
ind = torch.randint(0, 100, (400_000,), device="cuda", generator=g)
if sys.argv[1] == "aoti":  # packaged and loaded inside the recorded run: the package gets the hook
    ep = torch.export.export(M(), (x, ind))
    f = torch._inductor.aoti_load_package(torch._inductor.aoti_compile_and_package(
        ep, package_path=os.path.join(tempfile.mkdtemp(), "m.pt2")))
else:
    f = torch.compile(M(), options={"cpp_wrapper": True})
for _ in range(2):
    f(x, ind)
'''


@pytest.mark.gpu
@pytest.mark.parametrize("path", ["cpp_wrapper", "aoti"])
def test_gpu_hunt_names_the_atomic_kernel_launched_from_cpp(path, tmp_path, request):
    """kdebug hunt on a script whose only non-reproducible kernel is a
    compiled index_add (atomic adds), launched from the C++ wrapper or from
    an AOTInductor package: the hunt is complete and names that kernel."""
    if path == "aoti":
        request.getfixturevalue("cuda_aoti_loads")

    script = tmp_path / "atomic.py"
    script.write_text(_ATOMIC)
    p = subprocess.run([sys.executable, "-m", "kdebug", "hunt", "--runs", "2", "--no-magnitude", str(script), path],
                       capture_output=True, text=True, timeout=900, cwd=tmp_path)
    out = p.stdout + p.stderr
    assert p.returncode == 1, out
    assert re.search(r"(ROOT CAUSE|FIRST DIVERGENCE).*triton_\w*index_add", out), out
    assert "INCOMPLETE" not in out and "NOT recorded" not in out, out
