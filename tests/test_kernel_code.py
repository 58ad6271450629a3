"""Each kernel's generated source in traces (Note [Kernel code]): real
torch.compile on the CPU (C++ kernels), two graphs with a kernel of the same
name, kdebug show --source, debug_string(verbose=True), the report and the
first-divergence text."""
from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys

import pytest
import torch

import kdebug
from kdebug import DebugMode, TraceFileError, inductor, report
from kdebug.testing import perturb_kernel_output

from test_report import browser  # noqa: F401  (the Chromium fixture)
from tracebytes import with_meta

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def double_relu(x):
    return torch.relu(x * 2.71828 + 1.0).sum(0)  # double_relu's line


def triple_relu(x):
    return torch.relu(x * 3.14159 + 1.0).sum(0)  # triple_relu's line


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """Two graphs whose one C++ kernel each has the same name and other code,
    recorded into one trace; with every source Inductor handed to
    async_compile.cpp_pybinding while compiling them (seen by a wrapper of
    this test, not by kdebug)."""
    inductor.install()  # kdebug's own wrapper first: ours goes on top, and comes off after
    AC = torch._inductor.async_compile.AsyncCompile
    seen: list[str] = []
    orig = AC.cpp_pybinding

    def spy(self, argtypes, source_code):
        seen.append(source_code)
        return orig(self, argtypes, source_code)

    AC.cpp_pybinding = spy
    try:
        f, g = torch.compile(double_relu), torch.compile(triple_relu)
        x = torch.randn(8, 8)
        path = tmp_path_factory.mktemp("code") / "run.kdt"
        with torch._inductor.config.patch(fx_graph_cache=False):
            with DebugMode(trace=str(path)) as dm, DebugMode.log_tensor_hashes("bitwise", hash_inputs=True):
                f(x)
                g(x)
    finally:
        AC.cpp_pybinding = orig
    return dm, kdebug.load(str(path)), path, seen


def test_source_round_trips_and_is_what_inductor_compiled(recorded):
    dm, run, _, seen = recorded
    assert len(dm.kernels) == 2 and seen
    for k in run.kernels:
        entries = run.provenance(k.kernel_name)
        assert entries and all(e.code_sha256 for e in entries)
        for e in entries:
            text = run.kernel_code(e.code_sha256)
            assert text is not None and hashlib.sha256(text.encode()).hexdigest() == e.code_sha256
            assert text in seen  # exactly a source Inductor passed to cpp_pybinding
            assert 'extern "C"' in text and "void kernel(" in text.replace("  ", " ")
            assert os.path.isfile(e.module)
            with open(e.module) as m:
                assert text in m.read()  # ...and the kernel text of the module it names
    # once per distinct kernel: the trace's META holds each text once, no other
    shas = {e.code_sha256 for k in run.kernels for e in run.provenance(k.kernel_name)}
    assert set(run.meta["kernel_code"]) == shas


def test_two_graphs_with_a_same_named_kernel_keep_both_sources(recorded):
    dm, run, _, _ = recorded
    names = [k.kernel_name for k in dm.kernels]
    assert names[0] == names[1], names  # Inductor names a kernel by its ops: same ops, same name
    entries = run.provenance(names[0])
    assert len({e.code_sha256 for e in entries}) == 2, entries
    texts = [run.kernel_code(e.code_sha256) for e in entries]
    assert any("2.71828" in t for t in texts) and any("3.14159" in t for t in texts)
    lines = {s for e in entries for s in e.source}
    assert any("double_relu's line" in s for s in lines) and any("triple_relu's line" in s for s in lines)
    assert len({e.module for e in entries}) == 2


def test_debug_string_verbose_names_module_nodes_and_user_lines(recorded):
    dm, run, _, _ = recorded
    for text in (dm.debug_string(verbose=True), run.debug_string(verbose=True)):
        tail = text.split("# kernels:", 1)[1]
        for e in run.provenance(dm.kernels[0].kernel_name):
            assert f"module: {e.module}" in tail and f"code: sha256 {e.code_sha256}" in tail
            assert "relu" in tail and "triple_relu's line" in tail and "double_relu's line" in tail
    assert "# kernels:" not in run.debug_string()


def _show(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kdebug", "show", *args], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": ROOT}, timeout=300)


def test_show_source_prints_the_launch_kernel(recorded):
    _, run, path, _ = recorded
    out = _show(str(path), "--source", "0")
    assert out.returncode == 0, out.stderr
    name = run.kernels[0].kernel_name
    assert out.stdout.startswith(f"# launch 0: {name}\n")
    for e in run.provenance(name):  # both kernels of the name, each with its code
        assert run.kernel_code(e.code_sha256).strip("\n") in out.stdout
        assert "# nodes: " + ", ".join(e.nodes) in out.stdout
    assert "double_relu's line" in out.stdout and "2 different kernels of this name" in out.stdout
    bad = _show(str(path), "--source", "99")
    assert bad.returncode == 2 and "no launch 99" in bad.stderr and "Traceback" not in bad.stderr


def test_divergence_text_names_the_root_kernel_nodes_and_lines():
    f = torch.compile(lambda x: torch.tanh(x * 1.61803) - 0.5)  # the planted kernel's line
    x = torch.randn(16, 4)
    f(x)

    def rec():
        with DebugMode() as dm, DebugMode.log_tensor_hashes("bitwise", hash_inputs=True):
            f(x)
        return dm

    a = rec()
    # this test's kernel by its full name: other tests' modules define other cpp_fused kernels
    with perturb_kernel_output(a.kernels[0].kernel_name, "out_ptr0"):
        b = rec()
    text = str(kdebug.compare(a, b))
    assert "FIRST DIVERGENCE" in text
    body = text.split("FIRST DIVERGENCE", 1)[1]
    assert "fuses: " in body and "tanh" in body.split("fuses: ", 1)[1].splitlines()[0]
    assert re.search(r"from( \([^)]*\))?: ", body) and "the planted kernel's line" in body
    saved = kdebug.trace.Run(kdebug.trace.save(a, None))  # from a trace: the same lines
    assert "the planted kernel's line" in str(kdebug.compare(saved, b))


def test_old_traces_and_hostile_code_fields(recorded, tmp_path):
    _, run, path, _ = recorded
    data = path.read_bytes()
    # a trace from before Note [Kernel code]: provenance entries without the new keys, no kernel_code
    old = {n: [{k: v for k, v in e.items() if k not in ("code_sha256", "module")} for e in es]
           for n, es in run.meta["kernel_provenance"].items()}
    p = tmp_path / "old.kdt"
    p.write_bytes(with_meta(data, {"kernel_provenance": old, "kernel_code": {}}))
    r = kdebug.load(str(p))
    name = r.kernels[0].kernel_name
    assert r.provenance(name) and all(e.code_sha256 == "" and e.module == "" for e in r.provenance(name))
    out = _show(str(p), "--source", "0")
    assert out.returncode == 0 and "generated source: unknown" in out.stdout, out.stdout + out.stderr
    # a source altered after the hash was taken is refused, never shown
    h = next(iter(run.meta["kernel_code"]))
    p.write_bytes(with_meta(data, {"kernel_code": {h: run.meta["kernel_code"][h] + "\n// planted"}}))
    with pytest.raises(TraceFileError, match="altered source"):
        kdebug.load(str(p))
    # the hash an entry names but the trace does not keep: said, not invented
    p.write_bytes(with_meta(data, {"kernel_code": {}, "kernel_code_dropped": 2}))
    r = kdebug.load(str(p), quiet=True)
    assert any("source of 2 kernel(s) was not kept" in x for x in r.problems())
    out = _show(str(p), "--source", "1")
    assert out.returncode == 0 and "generated source: not kept in this trace" in out.stdout


def test_report_shows_source_escaped_in_chromium(recorded, browser, tmp_path):  # noqa: F811
    """The launch detail holds the kernel's source, collapsed; a source whose
    comment holds markup is shown as text and runs no script."""
    from test_report import _open

    _, run, path, _ = recorded
    name = run.kernels[0].kernel_name
    payload = '// <img src=x onerror="window.__kdxss=1"><script>window.__kdxss=2</script>\n'
    evil = payload + run.kernel_code(run.provenance(name)[0].code_sha256)
    h = hashlib.sha256(evil.encode()).hexdigest()
    prov = dict(run.meta["kernel_provenance"])
    prov[name] = [{**prov[name][0], "code_sha256": h}]
    planted = tmp_path / "planted.kdt"
    planted.write_bytes(with_meta(path.read_bytes(), {"kernel_provenance": prov,
                                                      "kernel_code": {**run.meta["kernel_code"], h: evil}}))
    meta, _ = report.build([kdebug.load(str(planted))])
    assert meta["code"][h] == evil and meta["runs"][0]["provenance_code"][name] == [h]
    out = tmp_path / "r.html"
    report.write_html(str(out), [str(planted)])
    page, problems, _ = _open(browser, out)
    i = page.evaluate(f"""() => {{ const r = RUNS[0]; for (let i = 0; i < r.n; i++)
        if (r.isLaunch(i) && STR[r.name[i]] === {name!r}) return i; return -1; }}""")
    assert i >= 0
    page.evaluate(f"document.getElementById('detail').innerHTML = describe(RUNS[0], {i})")
    details = page.locator("#detail details.kcode")
    assert details.count() == 1 and not details.first.evaluate("d => d.open")  # collapsed by default
    details.first.locator("summary").click()
    text = page.inner_text("#detail")
    assert payload.strip() in text and 'extern "C"' in text
    assert page.locator("#detail img, #detail script").count() == 0
    assert page.evaluate("window.__kdxss === undefined") and not problems, problems
    page.close()


_CACHE_HIT_SCRIPT = '''
import sys, torch, kdebug
from kdebug import DebugMode
f = torch.compile(lambda x: torch.sigmoid(x * 1.41421) + 0.25)
x = torch.randn(8, 8)
if sys.argv[1] == "warm+provenance":
    kdebug.provenance.install()  # the lowering leaves its provenance file beside the cache
if sys.argv[1] == "record":
    with DebugMode(trace=sys.argv[2]):
        f(x)
else:
    f(x)
'''


@pytest.mark.parametrize("warm, origin", [("warm", "generated module comments"),
                                          ("warm+provenance", "provenance file")])
def test_a_cache_hit_in_a_new_process_still_stores_the_source(tmp_path, warm, origin):
    """The second process's compile is an FX graph cache hit (nothing is
    lowered there): the source comes from the generated module it loads,
    whether or not the warming process left a provenance file."""
    script = tmp_path / "prog.py"
    script.write_text(_CACHE_HIT_SCRIPT)
    env = {**os.environ, "PYTHONPATH": ROOT, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "cache")}
    for args in ([warm], ["record", str(tmp_path / "hit.kdt")]):
        p = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, env=env, timeout=600)
        assert p.returncode == 0, p.stderr
    run = kdebug.load(str(tmp_path / "hit.kdt"))
    (k,) = run.kernels
    (e,) = run.provenance(k.kernel_name)
    assert e.origin == origin, e  # not lowered in the recording process: a cache hit
    text = run.kernel_code(e.code_sha256)
    assert text is not None and "1.41421" in text and 'extern "C"' in text
    assert e.module.startswith(str(tmp_path / "cache")) and text in open(e.module).read()


def test_of_module_reads_triton_and_cpp_definitions():
    """The two forms a generated module defines kernels in (Inductor 2.13's
    wrapper text): the source is the long string, not the name or device."""
    from kdebug import kernel_code

    tri = "\nimport triton\n@triton.jit\ndef triton_poi_fused_0(in_ptr0, xnumel, XBLOCK: tl.constexpr):\n    pass\n"
    cpp = '#include <x.h>\nextern "C" void kernel(const float* in_ptr0) {}\n'
    module = (f"async_compile = AsyncCompile()\n"
              f"triton_poi_fused_0 = async_compile.triton('triton_poi_fused_0', {tri!r}, device_str='cuda')\n"
              f"cpp_fused_1 = async_compile.cpp_pybinding(['const float*'], {cpp!r})\n"
              f"async_compile.wait(globals())\n")
    got = kernel_code.of_module(module)
    assert got == {"triton_poi_fused_0": hashlib.sha256(tri.encode()).hexdigest(),
                   "cpp_fused_1": hashlib.sha256(cpp.encode()).hexdigest()}
    assert kernel_code.text(got["triton_poi_fused_0"]) == tri and kernel_code.text(got["cpp_fused_1"]) == cpp
    assert kernel_code.of_module("def broken(:") == {} and kernel_code.of_module(None) == {}


@pytest.mark.gpu
def test_triton_source_round_trips_on_cuda(tmp_path):
    """GPU machine: each launched Triton kernel's stored source is exactly a
    source Inductor passed to async_compile.triton, and names the kernel."""
    inductor.install()
    AC = torch._inductor.async_compile.AsyncCompile
    seen: list[str] = []
    orig = AC.triton

    def spy(self, kernel_name, source_code, *args, **kwargs):
        seen.append(source_code)
        return orig(self, kernel_name, source_code, *args, **kwargs)

    AC.triton = spy
    try:
        f = torch.compile(lambda x: torch.relu(x * 1.73205 + 1.0).sum(0))
        x = torch.randn(64, 64, device="cuda")
        path = tmp_path / "gpu.kdt"
        with torch._inductor.config.patch(fx_graph_cache=False):
            with DebugMode(trace=str(path)) as dm:
                f(x)
    finally:
        AC.triton = orig
    run = kdebug.load(str(path))
    assert dm.kernels and run.kernels
    for k in run.kernels:
        (e,) = run.provenance(k.kernel_name)
        text = run.kernel_code(e.code_sha256)
        assert text in seen and f"def {k.kernel_name}(" in text and "@triton" in text
        assert os.path.isfile(e.module)
    out = _show(str(path), "--source", str(run.kernels[0].launch_index))
    assert out.returncode == 0 and f"def {run.kernels[0].kernel_name}(" in out.stdout


def test_an_in_out_buffer_a_cpp_kernel_writes_before_reading_is_no_input():
    """Note [Written before read]: a C++ kernel's in_out_ptr that the source
    aliases to an output (`auto out_ptrN = in_out_ptrM;`) and to no input is
    written only, fresh or not at its call site.  Checked against the real
    kernel: NaN written into those buffers before the launch changes nothing
    it computes, while NaN in an input it reads does."""
    import ast

    from kdebug import _C, _upstream

    ln, lin = torch.nn.LayerNorm(48), torch.nn.Linear(48, 48)

    def g(x):
        return torch.relu(lin(ln(x * 3.0))).sum()

    cg = torch.compile(g)
    x = torch.randn(8, 48, requires_grad=True)
    with DebugMode():  # instruments the generated modules (their kernels become CppKernel)
        want = cg(x).detach()
    found = None
    for m in _upstream.generated_modules():
        for key, obj in m.__dict__.items():
            if isinstance(obj, _C.CppKernel) and "native_layer_norm" in key and "backward" not in key:
                found = (m, key, obj)
    assert found is not None
    m, key, obj = found
    tree = ast.parse(open(m.__file__).read())
    call = next(n.value for n in tree.body if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == key)
    argtypes, source = ast.literal_eval(call.args[0]), ast.literal_eval(call.args[1])
    first = inductor.written_first(source)
    assert first and all(re.search(rf"auto out_ptr\d+ = {n};", source) for n in first), source[:400]
    info = inductor.cpp_kernel_info(key, argtypes, source)  # no fresh positions: the rule alone
    names = list(info.arg_names)
    assert all(info.roles[names.index(n)] == _C.ROLE_WRITE for n in first)
    reads = [i for i, n in enumerate(names) if n.startswith("in_ptr")]
    assert reads and all(info.roles[i] & _C.ROLE_READ for i in reads)

    def run_with_nan_in(positions):
        inner, calls = obj.__wrapped__, []

        def poisoned(*args):
            kept = [(args[i], args[i].clone()) for i in positions]
            for t, _ in kept:
                t.fill_(float("nan"))
            r = inner(*args)
            for i, (t, old) in zip(positions, kept):
                if names[i].startswith("in_ptr"):
                    t.copy_(old)  # the control's input goes back as it was (a parameter, the input)
            calls.append(1)
            return r

        m.__dict__[key] = _C.CppKernel(poisoned, obj.info)
        try:
            out = cg(x).detach()  # with grad, as recorded: the same compiled graph
        finally:
            m.__dict__[key] = obj
        assert calls, "the compiled call did not launch the kernel under test"
        return out

    assert torch.equal(run_with_nan_in([names.index(n) for n in first]), want)
    assert torch.isnan(run_with_nan_in(reads[:1])).all()  # the control: a buffer it reads
    assert torch.equal(cg(x).detach(), want)
