"""How big a difference is, element by element.

Note [Element-level differences]
Hashes say *that* a tensor differs; a user has to know whether it is a
last-bit wobble or a blow-up, and whether the root varies by itself.  After
a divergence ``kdebug hunt`` re-runs the program once, capturing the inputs
and outputs of each of its first roots (kernel launches and aten ops alike),
and writes a standalone repro of each (Note [Standalone repro]: the
mechanism of ``kdebug rerun``, not a copy of it).  Each repro is launched
``--rerun-times`` times (default 20) on the recorded pre-launch inputs in a
fresh process; the distinct outputs (by their bits) give the verdict:
more than one is *intrinsically nondeterministic* (identical inputs, other
outputs), one is *stable on its inputs* (the run-to-run difference came from
elsewhere: a config, the inputs, autotuning, a seed, or a fault outside the
kernel).  The outputs recorded in the re-run and the first launch that wrote
something else are compared element by element: how many elements differ,
the largest absolute and relative difference, the largest distance in units
in the last place, and where the first differing element is.  ``hunt
--confirm`` adds the outputs its two re-runs wrote naturally (two
processes).  Where every launch wrote the recorded values, nothing is
invented: the report says so.

Relative differences are |a - b| / max(|a|, |b|) over elements where either
is non-zero.  ULP distances are taken in the tensor's own floating type (the
distance between the two values' positions in the ordered list of that type's
values); NaN against a number counts as a differing element with no distance.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

_INT_OF = {torch.float64: torch.int64, torch.float32: torch.int32, torch.float16: torch.int16,
           torch.bfloat16: torch.int16}


@dataclass
class ElementDiff:
    """Two tensors compared element by element."""

    numel: int
    differ: int                      # elements whose bits differ (NaN == NaN with the same bits)
    max_abs: float | None            # over elements where both are finite
    max_rel: float | None
    max_ulp: int | None              # floating types only
    first_index: list | None         # index of the first differing element (row-major)
    nan_mismatch: int = 0            # NaN in one, not in the other
    shape_mismatch: bool = False

    def to_json(self) -> dict:
        return asdict(self)

    def text(self) -> str:
        if self.shape_mismatch:
            return "shapes or dtypes differ"
        if not self.differ:
            return f"all {self.numel} elements identical"
        pct = 100.0 * self.differ / self.numel if self.numel else 0.0
        parts = [f"{self.differ} of {self.numel} elements differ ({pct:.3g}%)"]
        if self.max_abs is not None:
            parts.append(f"max abs {self.max_abs:.3g}")
        if self.max_rel is not None:
            parts.append(f"max rel {self.max_rel:.3g}")
        if self.max_ulp is not None:
            parts.append(f"max {self.max_ulp} ULP")
        if self.nan_mismatch:
            parts.append(f"{self.nan_mismatch} NaN in one only")
        if self.first_index is not None:
            parts.append(f"first at [{', '.join(map(str, self.first_index))}]")
        return ", ".join(parts)


def _ordered(bits: torch.Tensor) -> torch.Tensor:
    """Signed-magnitude float bits as int64 in value order (+0 and -0 both 0)."""
    x = bits.to(torch.int64)
    nbits = bits.element_size() * 8
    sign = x < 0
    mag = x & ((1 << (nbits - 1)) - 1)
    return torch.where(sign, -mag, mag)


def element_diff(a: torch.Tensor, b: torch.Tensor) -> ElementDiff:
    """``a`` against ``b``: same shape and dtype expected (else shape_mismatch)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return ElementDiff(a.numel(), a.numel(), None, None, None, None, shape_mismatch=True)
    n = a.numel()
    if n == 0:
        return ElementDiff(0, 0, None, None, None, None)
    shape = tuple(a.shape)
    a, b = a.detach().cpu().contiguous().reshape(-1), b.detach().cpu().contiguous().reshape(-1)
    if a.dtype == torch.bool:
        ne = a != b
    elif a.is_complex():
        ra, rb = torch.view_as_real(a).reshape(n, 2), torch.view_as_real(b).reshape(n, 2)
        ia = ra.view(_INT_OF.get(ra.dtype, torch.int64)) if ra.dtype in _INT_OF else ra
        ib = rb.view(_INT_OF.get(rb.dtype, torch.int64)) if rb.dtype in _INT_OF else rb
        ne = (ia != ib).any(1)
    elif a.dtype in _INT_OF:
        ne = a.view(_INT_OF[a.dtype]) != b.view(_INT_OF[a.dtype])  # bitwise: NaN payloads alike are equal
    elif a.is_floating_point():  # float8 kinds: compare their bytes
        ne = a.view(torch.uint8) != b.view(torch.uint8)
    else:
        ne = a != b
    differ = int(ne.sum())
    if not differ:
        return ElementDiff(n, 0, None, None, None, None)
    first = int(ne.nonzero()[0, 0])
    first_index = _unravel(first, shape)
    max_abs = max_rel = None
    max_ulp = None
    nan_mismatch = 0
    if a.dtype == torch.bool:
        pass
    elif a.is_complex() or a.is_floating_point():
        fa, fb = (torch.view_as_real(a), torch.view_as_real(b)) if a.is_complex() else (a, b)
        da, db = fa.double(), fb.double()
        na, nb = da.isnan(), db.isnan()
        nan_mismatch = int((na != nb).sum())
        both = da.isfinite() & db.isfinite()
        if bool(both.any()):
            d = (da - db).abs()[both]
            m = torch.maximum(da.abs(), db.abs())[both]
            max_abs = float(d.max())
            nz = m > 0
            max_rel = float((d[nz] / m[nz]).max()) if bool(nz.any()) else 0.0
        if fa.dtype in _INT_OF:
            ua, ub = _ordered(fa.view(_INT_OF[fa.dtype])), _ordered(fb.view(_INT_OF[fb.dtype]))
            ok = ~(na | nb)
            if bool(ok.any()):
                max_ulp = int((ua - ub).abs()[ok].max())
    else:
        d = (a.to(torch.float64) - b.to(torch.float64)).abs()
        max_abs = float(d.max())
        m = torch.maximum(a.to(torch.float64).abs(), b.to(torch.float64).abs())
        nz = m > 0
        max_rel = float((d[nz] / m[nz]).max()) if bool(nz.any()) else 0.0
    return ElementDiff(n, differ, max_abs, max_rel, max_ulp, first_index, nan_mismatch)


def _unravel(flat: int, shape: tuple) -> list[int]:
    """Row-major index of element ``flat`` of a tensor of ``shape``."""
    out = []
    for s in reversed(shape):
        out.append(flat % s)
        flat //= s
    return out[::-1]
