"""kdebug records aten ops through a C formatter (Note [Fast aten-op
recording] in kdebug/mode.py); its text must be identical to upstream's."""
from __future__ import annotations

import collections
import re

import pytest
import torch
import torch.utils._debug_mode as upstream

import kdebug
from kdebug import DebugMode, _C, _KernelCall, _upstream
from kdebug.workloads import TinyBlock, train_step_fn

arg_to_str = _upstream.utils_module._arg_to_str if hasattr(_upstream.utils_module, "_arg_to_str") \
    else upstream._arg_to_str

Point = collections.namedtuple("Point", "x y")


class MyTensor(torch.Tensor):
    pass


CASES = [
    torch.randn(2, 3), torch.tensor(1.5), torch.zeros(0, 4, dtype=torch.int64),
    torch.ones(2, dtype=torch.bool), torch.randn(3).to(torch.bfloat16), torch.nn.Parameter(torch.randn(4)),
    torch.randn(4, 4).t(), [torch.randn(2), torch.randn(3, 1)], (torch.randn(2),), (), [], {},
    {"a": torch.randn(1), 2: [None, 3.5]}, None, 3, -7, True, 2.5, float("nan"), 1e-5, "s'q\"",
    torch.float16, torch.device("cpu"), torch.strided, torch.channels_last, [1, [2, (3, None)]],
    (torch.randn(1), [torch.randn(2), 1], {"k": (torch.randn(3),)}), 1 + 2j, ...,
]
FALLBACK = [torch.Size([2, 3]), Point(1, 2), torch.randn(2).as_subclass(MyTensor),
            collections.OrderedDict(a=1), [torch.Size([1])]]


def _fn():
    pass


# The intended difference from upstream (Note [Stable argument text] in
# kdebug/_argtext.py): upstream renders these with str() / repr(), which hold
# an address (`<object object at 0x7f...>`) or, for a Generator, nothing but
# one; kdebug renders them by value / type name, the same in every run.
UNSTABLE = [object(), _fn, torch.Generator().manual_seed(3), [1, (object(), None)], {"g": torch.Generator()},
            {object(): 1}]


@pytest.fixture(autouse=True, scope="module")
def configured():
    with DebugMode(kernels_only=True):
        pass  # configures the formatter


@pytest.mark.parametrize("arg", CASES, ids=lambda a: type(a).__name__)
def test_formatter_matches_upstream(arg):
    assert _C.format_args((arg,)) == arg_to_str(arg, [])
    assert _C.format_kwargs({"out": arg}) == f", out={arg_to_str(arg, [])}"
    out = _C.format_output(arg)
    if out is not None:
        assert out == f"  ->  {arg_to_str(arg, [])}"


@pytest.mark.parametrize("arg", FALLBACK, ids=lambda a: type(a).__name__)
def test_formatter_declines_what_it_does_not_know(arg):
    assert _C.format_args((arg,)) is NotImplemented


@pytest.mark.parametrize("arg", UNSTABLE, ids=lambda a: type(a).__name__)
def test_formatter_renders_address_bearing_leaves_without_the_address(arg):
    """Where upstream's text holds an address, kdebug's differs from it on
    purpose: no address, and the same text from the C formatter and from
    upstream's Python rendering of kdebug's stand-ins (_record_call)."""
    import re

    from kdebug import _argtext

    up = arg_to_str(arg, [])
    assert re.search(r"0x[0-9a-f]{5,}", up)  # what this replaces
    text = _C.format_args((arg,))
    assert isinstance(text, str) and not re.search(r"0x[0-9a-f]{5,}", text), text
    assert text == _C.format_args((arg,))  # stable while the value is
    stand_in, changed = _argtext.stable_tree(arg)
    assert changed and arg_to_str(stand_in, []) == text
    assert _C.format_kwargs({"k": arg}) == f", k={text}"
    assert _C.format_output(arg) == f"  ->  {text}"


def test_generator_text_is_its_value():
    from kdebug import _argtext

    g, h = torch.Generator().manual_seed(0), torch.Generator().manual_seed(0)
    text = _C.format_args((g,))
    assert text.startswith("Generator(device='cpu', seed=0, state=") and text == _C.format_args((h,))
    torch.randn(3, generator=g)  # draws: another state, another text
    assert _C.format_args((g,)) != text and _C.format_args((g,)).startswith("Generator(device='cpu', seed=0, ")
    torch.randn(3, generator=h)
    assert _C.format_args((g,)) == _C.format_args((h,))
    assert _C.format_args((torch.Generator().manual_seed(1),)) != text


def test_format_output_none_like_upstream():
    for r in (None, (None, None), [], [None, [None]]):
        assert _C.format_output(r) is None


def _aten_lines(s: str) -> list[str]:
    lines = []
    skip_blank = False
    for line in s.split("\n"):
        stripped = line.strip()
        if stripped.startswith(("[cpp]", "[triton]")):
            skip_blank = True
            continue
        if skip_blank and stripped == "":
            skip_blank = False
            continue
        skip_blank = False
        lines.append(line)
    return lines


@pytest.mark.parametrize("flags", [{}, {"record_output": False}, {"record_ids": True},
                                   {"record_tensor_attributes": ["requires_grad"]}])
def test_debug_string_of_a_training_step_matches_upstream(flags):
    torch.manual_seed(0)
    model = TinyBlock(d=32, heads=4)
    x = torch.randn(2, 8, 32)
    step = train_step_fn(model)
    step(x)
    with upstream.DebugMode(**flags) as up:
        step(x)
    with DebugMode(**flags) as kd:
        step(x)
    assert kd.kernels  # kdebug also has the C++ kernels
    up_lines, kd_lines = _aten_lines(up.debug_string()), _aten_lines(kd.debug_string())
    assert len(kd_lines) > 20
    assert kd_lines == up_lines
    n_up = len(up.operators)
    assert len(kd.operators) - len(kd.kernels) == n_up


def test_eager_ops_with_kwargs_and_lists_match_upstream():
    x = torch.randn(4, 5)

    def work():
        a, b = torch.split(x, [2, 3], dim=1)
        c = torch.cat([a, b * 2], dim=1)
        d = torch.nn.functional.layer_norm(c, (5,), eps=1e-5)
        e = torch.empty(3, dtype=torch.float16, device="cpu")
        return d.sum(dim=(0,), keepdim=True), torch.where(d > 0, d, 0.0), e.fill_(1)

    with upstream.DebugMode() as up:
        work()
    with DebugMode() as kd:
        work()
    assert kd.debug_string() == up.debug_string()
    assert [str(type(o).__name__) for o in kd.operators] == [str(type(o).__name__) for o in up.operators]


@pytest.mark.parametrize("hash_inputs", [False, True])
def test_hash_annotations_match_upstream(hash_inputs):
    """kdebug hashes aten ops in its fast path (queued on the GPU there); with
    hash_fn='hash_tensor' the values are exactly upstream's."""
    x = torch.randn(6, 5)
    w = torch.randn(5, 4)

    def work():
        y = torch.mm(x, w).relu()
        return y.sum(dim=0), torch.cat([y, y * 2])

    with upstream.DebugMode() as up, upstream.DebugMode.log_tensor_hashes("hash_tensor", hash_inputs=hash_inputs):
        work()
    with DebugMode() as kd, DebugMode.log_tensor_hashes("hash_tensor", hash_inputs=hash_inputs):
        work()
    assert "'hash':" in kd.debug_string()
    assert kd.debug_string() == up.debug_string()
    assert [op.log for op in kd.operators] == [op.log for op in up.operators]


def test_record_outputs_of_aten_ops_match_upstream():
    x = torch.randn(3, 4)
    with upstream.DebugMode() as up, upstream.DebugMode.record_outputs():
        (x * 2).sin()
    with DebugMode() as kd, DebugMode.record_outputs():
        (x * 2).sin()
    assert len(kd.operators) == len(up.operators)
    for a, b in zip(kd.operators, up.operators):
        assert torch.equal(a.record["output"], b.record["output"])
    assert kd.debug_string() == up.debug_string()


# -- parity leftovers (issue 16 part 5) --

UPSTREAM_HELPERS = ["DebugInterpreter", "TensorIdTracker", "hash_tensor_fn", "norm_hash_fn", "_get_call_name",
                    "_stringify_shape"]


def test_upstream_call_types_and_helpers_import_from_kdebug():
    """Every call type upstream's module has (and its public helpers) comes
    from kdebug too: upstream's own objects, so isinstance checks written
    against either agree; _TritonKernelCall is kdebug's subclass of upstream's."""
    from kdebug import _OpCall  # the statement the issue names

    assert _OpCall is upstream._OpCall
    names = [n for n in dir(upstream) if n.startswith("_") and n.endswith("Call")]
    names += [n for n in UPSTREAM_HELPERS if hasattr(upstream, n)]
    assert "_OpCall" in names and "_DebugCall" in names
    for n in names:
        ours = getattr(kdebug, n)
        if n == "_TritonKernelCall":
            assert issubclass(ours, upstream._TritonKernelCall)
        else:
            assert ours is getattr(upstream, n), n
        assert n in dir(kdebug)
    with DebugMode() as kd:
        torch.randn(3).sin()
    assert any(isinstance(op, kdebug._OpCall) for op in kd.operators)
    with pytest.raises(AttributeError, match="no 'NotAThing'|has no attribute"):
        kdebug.NotAThing  # noqa: B018


def _both():
    return kdebug.get_active_debug_mode(), upstream.get_active_debug_mode()


def test_get_active_debug_mode_agrees_with_upstreams():
    """Note [Active mode]: kdebug's get_active_debug_mode and upstream's give
    the same mode in every arrangement: upstream's answer (the outermost
    DebugMode on the dispatch stack), else a kdebug mode recording without a
    dispatch mode."""
    assert _both() == (None, None)
    with DebugMode() as kd:
        assert _both() == (kd, kd)
        with upstream.DebugMode():
            assert _both() == (kd, kd)
        with DebugMode() as inner:
            assert inner is not kd and _both() == (kd, kd)
    with DebugMode(kernels_only=True) as ko:
        assert _both() == (ko, ko)
    with DebugMode(record_triton_kernels=False) as nk:
        assert _both() == (nk, nk)
    with upstream.DebugMode() as up:
        assert _both() == (up, up)
        with DebugMode() as kd2:
            assert kd2 is not up and _both() == (up, up)
    assert _both() == (None, None)


def _kernel_lines(s: str) -> list[str]:
    return [ln.strip() for ln in s.splitlines() if ln.strip().startswith(("[cpp]", "[triton]"))]


@pytest.fixture(scope="module")
def sin_cos():
    cf = torch.compile(lambda x: (x.sin() + 1).cos())
    x = torch.randn(8, 2)
    cf(x)
    return cf, x


def test_deepcopy_of_logs_live_and_loaded(sin_cos, tmp_path):
    """copy.deepcopy(dm.logs) works and the copy holds its records itself:
    clearing the mode and recording other work into it, or dropping the
    loaded run, leaves the copy's kernels as they were."""
    import copy

    cf, x = sin_cos
    with DebugMode() as dm, DebugMode.log_tensor_hashes(hash_fn="bitwise", hash_inputs=True), \
            DebugMode.record_outputs():
        out = cf(x)
    logs = dm.logs
    k = [op for op in logs if isinstance(op, _KernelCall)]
    assert len(k) == 1
    before = (k[0].render([]), k[0].kernel_name, k[0].pre_hashes, k[0].post_hashes, k[0].args)
    copied = copy.deepcopy(logs)
    assert len(copied) == len(logs)
    ck = [op for op in copied if isinstance(op, _KernelCall)][0]
    assert ck is not k[0] and type(ck) is type(k[0])
    (name, rec), = ck.record["output"].items()
    assert torch.equal(rec, out) and rec is not k[0].record["output"][name]
    dm.save(tmp_path / "r.kdt")
    dm.reset()
    with dm:
        torch.randn(5).tan()  # other work into the same mode
    assert (ck.render([]), ck.kernel_name, ck.pre_hashes, ck.post_hashes, ck.args) == before
    assert "cos" in ck.render([]) and ck.post_hashes

    run = kdebug.load(tmp_path / "r.kdt")
    copied = copy.deepcopy(run.logs)
    lines = [op.render([]) for op in run.logs]
    del run
    assert [op.render([]) for op in copied] == lines
    assert [op.post_hashes for op in copied if isinstance(op, _KernelCall)] == [before[3]]


def test_record_tensor_attributes_reach_kernel_lines(sin_cos):
    """Note [Kernel tensor attributes]: kernel lines render the requested
    attributes as upstream renders them for an aten op on the same tensor;
    attributes a record does not keep are left out with a warning, unless
    store_original_args keeps the tensors."""
    cf, x = sin_cos
    attrs = ["requires_grad", "dtype", "shape"]
    with upstream.DebugMode(record_tensor_attributes=attrs) as up:
        x.sin()
    upstream_text = up.debug_string().split("aten::sin(")[1].split(")  ->")[0]
    assert upstream_text == "t: f32[8, 2]{requires_grad=False, dtype=torch.float32, shape=torch.Size([8, 2])}"

    with DebugMode(record_tensor_attributes=attrs, store_original_args=True) as kd:
        cf(x)
    (line,) = _kernel_lines(kd.debug_string())
    assert f"in_ptr0={upstream_text}" in line and f"out_ptr0={upstream_text}" in line

    with DebugMode(record_tensor_attributes=attrs) as kd:
        cf(x)
    with pytest.warns(kdebug.KdebugWarning, match="'requires_grad'.*store_original_args=True"):
        (line,) = _kernel_lines(kd.debug_string())
    kept = "t: f32[8, 2]{dtype=torch.float32, shape=torch.Size([8, 2])}"
    assert f"in_ptr0={kept}" in line and f"out_ptr0={kept}" in line
    with DebugMode() as plain:
        cf(x)
    assert "{" not in _kernel_lines(plain.debug_string())[0]


def test_a_quantized_tensor_does_not_stop_the_program():
    """Upstream's DebugMode raises KeyError on a quantized tensor (its dtype
    has no text); kdebug's names it and the program goes on, with every name
    torch's table had left as it was, in every recording option and from
    several threads at once (a version that added the names around each call
    and removed them after raced between threads, and missed upstream's
    output path)."""
    import warnings

    from torch.utils._dtype_abbrs import dtype_abbrs

    import threading

    before = dict(dtype_abbrs)
    x = torch.randn(4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # quantized creation functions are deprecated
        want = torch.quantize_per_tensor(x, 0.1, 0, torch.quint8).dequantize()
        for flags in ({}, {"record_ids": True}, {"store_original_args": True}, {"record_output": True},
                      {"record_stack_trace": True}):
            with kdebug.DebugMode(**flags) as dm:
                y = torch.quantize_per_tensor(x, 0.1, 0, torch.quint8).dequantize()
            assert torch.equal(y, want), flags
            assert re.search(r"aten::dequantize.self\(t(\$\d+)?: quint8\[4\]\)", dm.debug_string()), flags
        errors = []

        def work(dt):
            try:
                for _ in range(20):
                    with kdebug.DebugMode():
                        torch.quantize_per_tensor(x, 0.1, 0, dt).dequantize()
            except Exception as e:  # noqa: BLE001 (what the test looks for)
                errors.append(repr(e))

        threads = [threading.Thread(target=work, args=(dt,)) for dt in (torch.quint8, torch.qint8) * 2]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert errors == []
    assert {k: v for k, v in dtype_abbrs.items() if k in before} == before
