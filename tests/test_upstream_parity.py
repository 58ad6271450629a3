"""kdebug records aten ops through a C formatter (Note [Fast aten-op
recording] in kdebug/mode.py); its text must be identical to upstream's."""
from __future__ import annotations

import collections

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
