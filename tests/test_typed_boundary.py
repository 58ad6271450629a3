"""kdebug/_C.pyi names exactly what the C extension has (Note [Typed
boundaries] in csrc/kd_types.c): every module-level name both ways, every
member of every class both ways, and the fields of every struct sequence in
their order."""
from __future__ import annotations

import ast
import pathlib

import pytest

import kdebug
from kdebug import _C

STUB = pathlib.Path(kdebug.__file__).with_name("_C.pyi")


def _stub():
    """{top-level name: ast node} of the stub."""
    out = {}
    for node in ast.parse(STUB.read_text()).body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
            out[node.name] = node
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            out[node.target.id] = node
        elif isinstance(node, ast.Assign):
            for t in node.targets:
                out[t.id] = node
    return out


def _members(cls: ast.ClassDef) -> list[str]:
    """Names a stub class declares, in order (annotated attributes and methods)."""
    out = []
    for node in cls.body:
        if isinstance(node, ast.FunctionDef):
            out.append(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            out.append(node.target.id)
    return out


def _public(names) -> set[str]:
    return {n for n in names if not (n.startswith("__") and n.endswith("__"))}


def _is_struct_sequence(t: type) -> bool:
    return issubclass(t, tuple) and hasattr(t, "n_sequence_fields")


def test_stub_names_exactly_the_module():
    stub = _stub()
    module = _public(dir(_C))
    assert sorted(module - set(stub)) == [], "in kdebug._C but not in _C.pyi"
    assert sorted(set(stub) - module) == [], "in _C.pyi but not in kdebug._C"


def test_stub_kinds_match():
    for name, node in _stub().items():
        obj = getattr(_C, name)
        if isinstance(node, ast.ClassDef):
            assert isinstance(obj, type), name
        elif isinstance(node, ast.FunctionDef):
            assert callable(obj) and not isinstance(obj, type), name
        else:
            assert not callable(obj), name


def test_stub_classes_name_exactly_their_members():
    for name, node in _stub().items():
        if not isinstance(node, ast.ClassDef):
            continue
        t = getattr(_C, name)
        declared = _members(node)
        if _is_struct_sequence(t):
            # fields in order; n_fields and friends are CPython's, not ours
            assert tuple(declared) == t.__match_args__, name
            continue
        own = _public(vars(t)) | ({"__call__", "__len__", "__wrapped__"} & set(vars(t)))
        if issubclass(t, BaseException):  # its fields are set on each instance raised
            with pytest.raises(t) as e:
                _C.TraceReader(b"not a trace")
            own = _public(vars(e.value))
        stubbed = set(declared) - {"__init__"}
        assert sorted(own - stubbed) == [], f"{name}: in the type, not in _C.pyi"
        assert sorted(stubbed - own) == [], f"{name}: in _C.pyi, not in the type"


def test_struct_sequences_are_all_stubbed_as_records():
    """Every struct sequence the module exposes is a class in the stub with
    its fields (no record left as a bare tuple type)."""
    stub = _stub()
    seqs = [n for n in dir(_C) if isinstance(getattr(_C, n), type) and _is_struct_sequence(getattr(_C, n))]
    assert len(seqs) >= 12, seqs
    for n in seqs:
        assert isinstance(stub[n], ast.ClassDef) and _members(stub[n]), n


def test_registration_refuses_fields_the_c_side_does_not_read():
    """The NamedTuples Python hands to C are checked field by field against
    the indices C reads them by; a refused registration keeps the old ones."""
    from typing import NamedTuple

    from kdebug import _boundary

    class Swapped(NamedTuple):  # OpInfo with two fields swapped
        hash_skipped: bool
        special: bool
        makes_empty: bool
        writes: bool
        written_pos: tuple
        written_names: tuple
        out_names: tuple
        callable: object

    good = dict(op_info=_boundary.OpInfo, hash_hook=_boundary.HashHook, record_hook=_boundary.HookKind.RECORD,
                triton_launch=_boundary.TritonLaunch)
    with pytest.raises(TypeError, match="op_info's field 0 must be 'special'"):
        _C._register_types(**{**good, "op_info": Swapped})
    with pytest.raises(TypeError, match="triton_launch's field 7 must be absent"):
        _C._register_types(**{**good, "triton_launch": NamedTuple("T", [(f, int) for f in
                                                                       (*_boundary.TritonLaunch._fields, "extra")])})
    with pytest.raises(TypeError, match="hash_hook must be a NamedTuple class"):
        _C._register_types(**{**good, "hash_hook": dict})
    # the good ones are still in place: the fast path records as before
    import torch

    from kdebug import DebugMode

    with DebugMode() as dm:
        torch.ones(2) + 1
    assert "aten::add" in dm.debug_string()


def test_op_info_must_be_an_op_info():
    """A positional tuple from _op_info is refused with a clear error, not read by index."""
    import torch

    from kdebug import DebugMode, _upstream, mode

    x = torch.randn(2)
    mode._configure()
    try:
        _C._configure_dispatch(lambda f: tuple(mode._op_info(f)), mode._aten_hooks.through_upstream,
                               mode._stream_tick, mode._tree_hash_py, mode._tree_clone_py, mode._aten_hooks._local,
                               _upstream.utils_module, _upstream._OpCall, None, torch._C._len_torch_dispatch_stack)
        with pytest.raises(TypeError, match="_op_info must return a kdebug._boundary.OpInfo"):
            with DebugMode():
                torch.add(x, 1)  # (x + 1 would turn the TypeError into NotImplemented)
    finally:
        mode._configure()
    with DebugMode() as dm:
        x + 1
    assert "aten::add" in dm.debug_string()


def test_triton_finisher_hands_a_triton_launch():
    """The run hook reads the grid and config the finisher returns only from
    a TritonLaunch; a positional tuple is not read but counted as an error
    and named in the warning.  (A hand-made run hook on CPU: the real one
    wraps CachingAutotuner.run, tests/test_gpu.py.)"""
    import torch

    from kdebug import DebugMode, KdebugWarning
    from kdebug._boundary import TritonLaunch

    class Autotuner:
        pass

    def run(self, *args, **kwargs):
        args[1].add_(1)

    def builder(autotuner):
        return _C.KernelInfo(_C.KIND_TRITON, "triton_poi_fake_0", ["in_ptr0", "out_ptr0"],
                             [_C.ROLE_READ, _C.ROLE_WRITE], 0, -1)

    launch = TritonLaunch(grid_x=4, grid_y=2, grid_z=1, config_id=_C.intern("XBLOCK=8"), num_warps=4,
                          num_stages=1, shared_mem=96)
    hook = _C.RunHook(run, builder, lambda autotuner, args: launch)
    x, y = torch.ones(3), torch.zeros(3)
    with DebugMode() as dm:
        hook(Autotuner(), x, y)
    (k,) = dm.kernels
    assert (k.grid, k.config, k.num_warps, k.num_stages, k.shared_mem) == ((4, 2, 1), "XBLOCK=8", 4, 1, 96)
    assert torch.equal(y, torch.ones(3))

    hook = _C.RunHook(run, builder, lambda autotuner, args: tuple(launch))
    with pytest.warns(KdebugWarning, match="not a kdebug._boundary.TritonLaunch"):
        with DebugMode() as dm:
            hook(Autotuner(), x, y)
    (k,) = dm.kernels
    assert k.grid is None and k.config is None
    assert torch.equal(y, torch.full((3,), 2.0))  # the launch itself ran
