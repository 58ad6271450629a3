"""Validation of every user-facing flag of DebugMode, log_tensor_hashes and
record_outputs, in one place.

Note [Flag validation]
A flag is checked for its type and range before anything uses it, and a bad
one raises a TypeError / ValueError that names the flag, what it got and what
is allowed.  Nothing is coerced: bool("False") is True, int(1.9) is 1 and
2**64 wraps to 0 in C, so a string, a float or an out-of-range int would
silently become another setting.

Note [Checked DebugMode flags]
A training loop makes a DebugMode per step with the same flags, and checking
them took about 3 us of the 35 a construction, enter and exit cost.
debug_mode_flags remembers the answer for flags that are all of type bool,
int, str or None and come without upstream flags: debug_mode is a function of
those values and their types alone (os.fspath of a str is the str), and the
key holds both, so check_finite=1 is not taken for check_finite=True (equal,
with one hash) nor ring_capacity=16.0 for 16.  Any other type is checked
every time (its value could change, or not be hashable), as are upstream's
flags; failures are never remembered, so a bad flag raises every time.  The
answer is read-only, shared by the constructions that share the flags.
"""
from __future__ import annotations

import operator
import os
import types
from typing import Any, Mapping

# ring slots (128 bytes each): kd_ring_new's range
RING_MIN, RING_MAX = 16, 1 << 32
# record_outputs' budget is a C uint64 summed with tensor sizes: keep it clear of wrapping
MAX_BYTES_MAX = (1 << 63) - 1
OVERFLOW_POLICIES = ("overwrite", "drop_new")


def _what(value: Any) -> str:
    return f"{type(value).__name__} {value!r}"


def boolean(where: str, name: str, value: Any) -> bool:
    """value, which must be a bool (0 and 1 are accepted as ints often are)."""
    if isinstance(value, bool):
        return value
    if type(value) is int and value in (0, 1):
        return bool(value)
    raise TypeError(f"{where}: {name} must be True or False, not the {_what(value)}")


def integer(where: str, name: str, value: Any, lo: int, hi: int, unit: str = "") -> int:
    """value as an int in [lo, hi]; a float, a bool or a str is an error."""
    if isinstance(value, bool) or not hasattr(type(value), "__index__"):
        raise TypeError(f"{where}: {name} must be an int between {lo} and {hi}{unit}, "
                        f"not the {_what(value)}" + (" (pass int(...) to round it)" if isinstance(value, float) else ""))
    v = operator.index(value)
    if not lo <= v <= hi:
        raise ValueError(f"{where}: {name} must be between {lo} and {hi}{unit}, got {v}")
    return v


def choice(where: str, name: str, value: Any, allowed: tuple[str, ...], meaning: str = "") -> str:
    if not isinstance(value, str) or value not in allowed:
        raise ValueError(f"{where}: {name} must be one of {', '.join(map(repr, allowed))}"
                         f"{meaning}, not {value!r}")
    return value


def debug_mode(kdebug_flags: dict[str, Any], upstream_flags: dict[str, Any],
               upstream_defaults: dict[str, Any]) -> dict[str, Any]:
    """DebugMode's flags checked: kdebug's own (by name) and upstream's (a flag
    whose default is a bool must be a bool; record_tensor_attributes a list
    of str or None).  Returns kdebug's flags normalized."""
    w = "DebugMode"
    out = dict(kdebug_flags)
    for name in ("record_triton_kernels", "kernels_only", "record_all_threads", "batch_gpu_work",
                 "record_final_state", "record_extern_ops"):
        out[name] = boolean(w, name, kdebug_flags[name])
    out["ring_capacity"] = integer(w, "ring_capacity", kdebug_flags["ring_capacity"], RING_MIN, RING_MAX,
                                   " slots (128 bytes each)")
    out["overflow"] = choice(w, "overflow", kdebug_flags["overflow"], OVERFLOW_POLICIES,
                             " ('overwrite' keeps the newest launches, 'drop_new' the oldest)")
    cf = kdebug_flags.get("check_finite", False)
    if cf not in (False, True, "inputs") or (type(cf) is not bool and cf != "inputs"):
        raise ValueError(f"DebugMode: check_finite must be False, True (the stats of what steps write) or "
                         f"'inputs' (also of what they read), not {cf!r}")
    out["check_finite"] = cf
    trace = kdebug_flags["trace"]
    if trace is not None and not isinstance(trace, (str, os.PathLike)):
        raise TypeError(f"DebugMode: trace must be a file path (str or os.PathLike) or None, not {type(trace).__name__}")
    out["trace"] = None if trace is None else os.fspath(trace)
    if isinstance(out["trace"], bytes):
        raise TypeError("DebugMode: trace must be a str path, not bytes")
    for name, value in upstream_flags.items():
        default = upstream_defaults.get(name)
        if isinstance(default, bool):
            boolean(w, name, value)
        elif name == "record_tensor_attributes" and value is not None:
            if isinstance(value, str) or not all(isinstance(a, str) for a in value):
                raise TypeError("DebugMode: record_tensor_attributes must be None or a list of "
                                f"tensor attribute names (str), not the {_what(value)}")
    out["op_path"] = choice(w, "op_path", kdebug_flags["op_path"], ("python", "c++"),
                            " ('python': upstream's dispatch mode, 'c++': the C++ op observer)")
    if out["record_extern_ops"] and not out["kernels_only"]:
        raise ValueError("record_extern_ops=True is for kernels_only=True (the dispatch mode already records "
                         "every aten op, extern calls included); pass kernels_only=True, or use "
                         "op_path='c++' to record all ops without a dispatch mode")
    if out["op_path"] == "c++" and out["record_extern_ops"]:
        raise ValueError("op_path='c++' records every aten op already: drop record_extern_ops=True")
    if (out["record_extern_ops"] or out["op_path"] == "c++") and not out["record_triton_kernels"]:
        raise ValueError("record_extern_ops / op_path='c++' record ops into the kernel recorder: they need "
                         "record_triton_kernels=True")
    if out["kernels_only"] and not out["record_triton_kernels"]:
        raise ValueError("kernels_only=True records nothing unless record_triton_kernels=True")
    return out


# DebugMode's own flags, in its signature's order (debug_mode_flags' tuple)
DEBUG_MODE_FLAGS = ("record_triton_kernels", "kernels_only", "record_all_threads", "ring_capacity", "overflow",
                    "batch_gpu_work", "trace", "record_final_state", "check_finite", "record_extern_ops", "op_path")
_PLAIN_TYPES = frozenset({bool, int, str, type(None)})
_checked: dict[tuple, Mapping[str, Any]] = {}  # Note [Checked DebugMode flags]
_CHECKED_MAX = 256


def debug_mode_flags(values: tuple, upstream_flags: dict[str, Any],
                     upstream_defaults: dict[str, Any]) -> Mapping[str, Any]:
    """debug_mode() of DebugMode's own flags given as a tuple in
    DEBUG_MODE_FLAGS order, remembered where that is sound (Note [Checked
    DebugMode flags]).  The answer is read-only."""
    kinds = tuple(map(type, values))
    plain = not upstream_flags and _PLAIN_TYPES.issuperset(kinds)
    if plain:
        out = _checked.get(values + kinds)
        if out is not None:
            return out
    out = types.MappingProxyType(debug_mode(dict(zip(DEBUG_MODE_FLAGS, values)), upstream_flags, upstream_defaults))
    if plain and len(_checked) < _CHECKED_MAX:
        _checked[values + kinds] = out
    return out


def hash_flags(hash_inputs: Any, check_inputs_unchanged: Any) -> tuple[bool, bool]:
    w = "log_tensor_hashes"
    return boolean(w, "hash_inputs", hash_inputs), boolean(w, "check_inputs_unchanged", check_inputs_unchanged)


def max_bytes(value: Any) -> int:
    return integer("record_outputs", "max_bytes", value, 0, MAX_BYTES_MAX, " bytes")
