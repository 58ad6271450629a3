"""What an accelerator can run: a typed capability declaration and the
adapter interface a real backend implements (Note [Constraint backend] in
kdebug/backends/constrained.py says how they are checked).

``AcceleratorCapabilities`` is a frozen dataclass; ``with_env()`` applies
the seed's environment variables (MOCK_ALIGNMENT, MOCK_MAX_MEMORY) as an
override, saying which values it replaced.
"""
from __future__ import annotations

import abc
import dataclasses
import os
from collections.abc import Mapping
from typing import Any

import torch

LAYOUTS = ("any", "dense", "contiguous")
"""any: every stride pattern; dense: non-overlapping and dense in some
dimension order (a permuted tensor passes, a slice or broadcast does not);
contiguous: row-major contiguous."""

ENV_STRICT = "MOCK_STRICT"
ENV_ALIGNMENT = "MOCK_ALIGNMENT"
ENV_MAX_MEMORY = "MOCK_MAX_MEMORY"


def _dtype(d: Any) -> torch.dtype:
    if isinstance(d, torch.dtype):
        return d
    if isinstance(d, str):
        got = getattr(torch, d.removeprefix("torch."), None)
        if isinstance(got, torch.dtype):
            return got
    raise ValueError(f"{d!r} is not a torch dtype (write torch.float16 or 'float16')")


@dataclasses.dataclass(frozen=True)
class AcceleratorCapabilities:
    """The constraints an accelerator puts on the graphs it is given.

    dtypes: the element types it computes in (None: all).
    alignment: every dimension's size must be a multiple of this.
    dim_alignment: per dimension index (negative counts from the last), a
        multiple that dimension's size must have, e.g. {-1: 16, -2: 8};
        it replaces ``alignment`` for that dimension.
    exempt_unit_dims: dimensions of size 1 (broadcast, keepdim) pass
        alignment checks.
    max_tensor_bytes: the largest tensor it holds, in bytes (None: no limit).
    layout: one of LAYOUTS, required of every tensor a compute op reads
        and of every graph input (view ops and copies to contiguous are
        exempt: they move no data or are the fix).
    denied_ops: op names or fnmatch patterns it cannot run
        ("aten.linalg_lu*", "torch.linalg.lu", "aten.convolution").
    allowed_ops: when given, the only aten-level ops it runs; every other
        op in the forward, backward and inference graphs is a violation
        (the pre-AOT dynamo graph holds torch-level calls, which an aten
        allowlist does not name, so it is not held to this list).
    """

    name: str = "accelerator"
    dtypes: frozenset | None = None
    alignment: int = 1
    dim_alignment: Mapping[int, int] = dataclasses.field(default_factory=dict)
    exempt_unit_dims: bool = True
    max_tensor_bytes: int | None = None
    layout: str = "any"
    denied_ops: tuple[str, ...] = ()
    allowed_ops: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if self.dtypes is not None:
            object.__setattr__(self, "dtypes", frozenset(_dtype(d) for d in self.dtypes))
        if not isinstance(self.alignment, int) or self.alignment < 1:
            raise ValueError(f"alignment must be a positive int, got {self.alignment!r}")
        dims = dict(self.dim_alignment)
        for k, v in dims.items():
            if not isinstance(k, int) or not isinstance(v, int) or v < 1:
                raise ValueError(f"dim_alignment maps a dimension index to a positive int, got {k!r}: {v!r}")
        object.__setattr__(self, "dim_alignment", dims)
        if self.max_tensor_bytes is not None and self.max_tensor_bytes < 1:
            raise ValueError(f"max_tensor_bytes must be positive or None, got {self.max_tensor_bytes!r}")
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {', '.join(LAYOUTS)}, got {self.layout!r}")
        for field in ("denied_ops", "allowed_ops"):
            v = getattr(self, field)
            if isinstance(v, str):
                raise ValueError(f"{field} is a list of op names, got the string {v!r}: write ({v!r},)")
            if v is not None:
                object.__setattr__(self, field, tuple(v))

    def alignment_of(self, dim: int, ndim: int) -> int:
        """The multiple dimension ``dim`` (0-based) of an ``ndim``-dimensional tensor must have."""
        for key in (dim, dim - ndim):
            if key in self.dim_alignment:
                return self.dim_alignment[key]
        return self.alignment

    def with_env(self, environ: Mapping[str, str] | None = None) -> tuple[AcceleratorCapabilities, dict[str, str]]:
        """These capabilities with the seed's variables applied
        (MOCK_ALIGNMENT: every dimension, replacing dim_alignment;
        MOCK_MAX_MEMORY: max_tensor_bytes), and {variable: what it
        replaced}.  A value that is not a positive integer is a ValueError
        naming the variable."""
        env = os.environ if environ is None else environ
        changes: dict[str, Any] = {}
        said: dict[str, str] = {}
        if env.get(ENV_ALIGNMENT, "") != "":
            changes["alignment"] = _positive(env, ENV_ALIGNMENT)
            changes["dim_alignment"] = {}
            said[ENV_ALIGNMENT] = f"alignment {self.alignment}" + (
                f", dim_alignment {self.dim_alignment}" if self.dim_alignment else "")
        if env.get(ENV_MAX_MEMORY, "") != "":
            changes["max_tensor_bytes"] = _positive(env, ENV_MAX_MEMORY)
            said[ENV_MAX_MEMORY] = f"max_tensor_bytes {self.max_tensor_bytes}"
        return (dataclasses.replace(self, **changes) if changes else self), said

    def to_json(self) -> dict:
        return {"name": self.name,
                "dtypes": None if self.dtypes is None else sorted(str(d).removeprefix("torch.") for d in self.dtypes),
                "alignment": self.alignment, "dim_alignment": {str(k): v for k, v in self.dim_alignment.items()},
                "exempt_unit_dims": self.exempt_unit_dims, "max_tensor_bytes": self.max_tensor_bytes,
                "layout": self.layout, "denied_ops": list(self.denied_ops),
                "allowed_ops": None if self.allowed_ops is None else list(self.allowed_ops)}


def _positive(env: Mapping[str, str], name: str) -> int:
    raw = env[name].strip()
    try:
        value = int(raw, 0)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"{name}={env[name]!r}: expected a positive integer (e.g. {name}=16); unset it to use the "
                         "capabilities given in code")
    return value


def mode_from_env(mode: str, environ: Mapping[str, str] | None = None) -> tuple[str, str | None]:
    """(mode, what MOCK_STRICT replaced or None): MOCK_STRICT=1 is strict,
    0 is warn; another value is a ValueError."""
    env = os.environ if environ is None else environ
    raw = env.get(ENV_STRICT, "").strip().lower()
    if raw == "":
        return mode, None
    if raw in ("1", "true", "yes", "on"):
        return "strict", f"mode {mode!r}"
    if raw in ("0", "false", "no", "off"):
        return "warn", f"mode {mode!r}"
    raise ValueError(f"{ENV_STRICT}={env[ENV_STRICT]!r}: expected 1 (strict) or 0 (warn)")


class AcceleratorAdapter(abc.ABC):
    """What a real backend implements to be checked by
    kdebug.backends.constrained: its capabilities, and optionally a per-node
    verdict for what a declaration cannot say (an op supported only for
    some arguments, a kernel library's holes)."""

    name: str = "accelerator"

    @abc.abstractmethod
    def capabilities(self) -> AcceleratorCapabilities:
        """The declared constraints (read once per constrained() backend)."""

    def supports(self, node: torch.fx.Node, stage: str) -> str | None:
        """None if the accelerator can run ``node`` (of a graph of ``stage``:
        dynamo, forward, backward or inference), else the reason it cannot.
        node.meta['val'] (aten graphs) or ['example_value'] (the dynamo
        graph) holds its fake output."""
        return None


class DeclaredAdapter(AcceleratorAdapter):
    """The adapter of a plain AcceleratorCapabilities (no per-node hook)."""

    def __init__(self, caps: AcceleratorCapabilities):
        self._caps = caps
        self.name = caps.name

    def capabilities(self) -> AcceleratorCapabilities:
        return self._caps
