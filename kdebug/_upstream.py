"""The pieces of torch.utils._debug_mode that kdebug builds on, found by name.

torch 2.11 keeps DebugMode in one module; torch 2.13 splits it into a package
(_mode, _calls, _utils).  Everything version-dependent is looked up here.
"""
from __future__ import annotations

import sys

import torch

try:
    import torch.utils._debug_mode as _dm
    from torch.utils._debug_mode import DebugMode, _DebugCall, _OpCall, _TritonKernelCall
except ImportError as e:  # pragma: no cover - torch too old
    raise ImportError(
        "kdebug needs torch >= 2.11, whose torch.utils._debug_mode provides DebugMode "
        f"and _TritonKernelCall ({e}). Upgrade torch."
    ) from e

from torch.utils._dtype_abbrs import dtype_abbrs

mode_module = sys.modules[DebugMode.__module__]
"""Module holding _ACTIVE_DEBUG_MODE_COUNT (torch.utils._debug_mode[._mode])."""


def _find_utils_module():
    for name in ("torch.utils._debug_mode._utils", "torch.utils._debug_mode"):
        mod = sys.modules.get(name)
        if mod is not None and hasattr(mod, "_IN_INDUCTOR_BENCHMARK"):
            return mod
    raise ImportError("cannot find upstream DebugMode's _IN_INDUCTOR_BENCHMARK flag")


utils_module = _find_utils_module()
"""Module holding _IN_INDUCTOR_BENCHMARK and the hash / record-output globals."""

get_active_debug_mode = _dm.get_active_debug_mode
get_call_name = _dm._get_call_name


def compute_rel_diff(h1, h2):
    fn = getattr(mode_module, "_compute_rel_diff", None) or getattr(_dm, "_compute_rel_diff", None)
    if fn is not None:
        try:
            return fn(h1, h2)
        except (TypeError, ValueError):
            pass
    return None


def get_op_name(op) -> str:
    """Upstream's name for an op (what its rendering starts with)."""
    if isinstance(op, torch._ops.OpOverload):
        return op.__qualname__
    if hasattr(op, "__module__") and hasattr(op, "__name__"):
        return f"{op.__module__}.{op.__name__}"
    return str(op)

__all__ = ["DebugMode", "_DebugCall", "_OpCall", "_TritonKernelCall", "get_op_name", "dtype_abbrs", "mode_module",
           "utils_module", "get_active_debug_mode"]


def fake_tensor_type() -> type:
    """torch._subclasses.fake_tensor.FakeTensor (2.11-2.13): compile-time
    stand-ins with no real memory, which Note [Final state] leaves out."""
    from torch._subclasses.fake_tensor import FakeTensor

    return FakeTensor
