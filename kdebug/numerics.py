"""How far apart two tensors are: the numbers an accuracy verdict rests on.

Note [Worse, not just different]
A compiled kernel almost never matches eager bit for bit: Inductor fuses,
reorders reductions and keeps bf16/fp16 intermediates in float32.  So
"differs from eager" says little.  Each tensor kdebug compares therefore has
three values: compiled (C), eager (E) and a float64 reference (R) computed
from the same inputs.  The error of a side is the root mean square of
(X - R) in float64.  Compiled is *worse* when its error exceeds `factor`
times eager's, where eager's error is first raised to the rounding floor
of the dtype (half an epsilon times the RMS of R): an eager value that is
exact (error 0) must not make any compiled rounding look infinitely worse.
A value computed through a reduction of K terms has its floor raised by
sqrt(K) (`terms`, Note [Accumulation floor] in kdebug/reference.py): two
correct summation orders differ by that much; for a sum that cancels, the
scale is the size of its terms (`term_scale`), not of the result.
NaN or Inf where the reference and eager are finite is always worse.
NaN where eager has NaN too, and the same Inf on both sides, match (a NaN
already in the graph's inputs is not a kernel's doing): such elements are
neither mismatches nor errors, and are never the "worst element".

Integer and bool tensors (argmax, topk's indices, masks) are discrete: a
compiled value that differs by one rounding from eager's may flip an index
at a near-tie, and the size of an index difference means nothing.  They are
compared exactly (a mismatch makes them "differ" and passes a difference on),
but their RMS distance to float64 is not an error: they are never *worse*.

Tolerances (for "mismatch %" and for "inputs still within tolerance")
default per dtype to the values torch.testing.assert_close documents and
can be overridden by atol / rtol.
"""
from __future__ import annotations

import dataclasses
import math

import torch

# (rtol, atol) per dtype: torch.testing.assert_close's documented defaults
DEFAULT_TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float16: (1e-3, 1e-5),
    torch.bfloat16: (1.6e-2, 1e-5),
    torch.float32: (1.3e-6, 1e-5),
    torch.float64: (1e-7, 1e-7),
    torch.complex32: (1e-3, 1e-5),
    torch.complex64: (1.3e-6, 1e-5),
    torch.complex128: (1e-7, 1e-7),
}

_INT_VIEW = {2: torch.int16, 4: torch.int32, 8: torch.int64}


def tolerances(dtype: torch.dtype, rtol: float | None = None, atol: float | None = None) -> tuple[float, float]:
    """(rtol, atol) for dtype: the given ones where set, else the defaults
    (exact, 0 and 0, for integer and bool dtypes)."""
    d_rtol, d_atol = DEFAULT_TOLERANCES.get(dtype, (0.0, 0.0))
    return (d_rtol if rtol is None else float(rtol), d_atol if atol is None else float(atol))


def _eps(dtype: torch.dtype) -> float:
    if dtype.is_floating_point:
        return torch.finfo(dtype).eps
    if dtype.is_complex:
        return torch.finfo(dtype.to_real()).eps
    return 0.0


@dataclasses.dataclass(frozen=True)
class Difference:
    """How a compiled tensor compares with eager and with the float64
    reference (Note [Worse, not just different]).  Every number here was
    computed; fields that could not be (no reference) are None."""

    dtype: str
    shape: tuple
    numel: int
    max_abs: float           # max |C - E|
    max_rel: float           # max |C - E| / |E| over elements with E != 0
    rmse: float              # sqrt(mean (C - E)^2)
    mismatch_pct: float      # % of elements outside atol + rtol * |E|
    max_ulp: int | None      # largest distance in units in the last place (same float dtype)
    rtol: float
    atol: float
    err_compiled: float | None  # RMS(C - R)
    err_eager: float | None     # RMS(E - R)
    floor: float | None         # the dtype's rounding floor for R
    nonfinite_introduced: int   # elements NaN/Inf in C but finite in E (and R)
    worst_index: tuple | None   # index of the largest |C - R| (|C - E| without R)
    worst_values: tuple | None  # (C, E, R) there; R None without a reference
    per_dim: tuple | None       # for each dimension, max |C - R| along it (as lists)
    heatmap: tuple | None = None  # |C - R| on the 2-D slice through the worst element, max-pooled to <= 48x48

    @property
    def within_tolerance(self) -> bool:
        return self.mismatch_pct == 0.0 and self.nonfinite_introduced == 0

    def ratio(self) -> float | None:
        """err_compiled / max(err_eager, floor), or None without a reference."""
        if self.err_compiled is None or self.err_eager is None:
            return None
        base = max(self.err_eager, self.floor or 0.0)
        if base == 0.0:
            return 0.0 if self.err_compiled == 0.0 else math.inf
        return self.err_compiled / base

    @property
    def discrete(self) -> bool:
        """Integer or bool values: compared exactly, never judged worse."""
        return not (self.dtype.startswith("float") or self.dtype.startswith("complex")
                    or self.dtype.startswith("bfloat"))

    def worse(self, factor: float) -> bool:
        if self.discrete:
            return False
        if self.nonfinite_introduced:
            return True
        r = self.ratio()
        return r is not None and r > factor


def _ordered_bits(x: torch.Tensor) -> torch.Tensor | None:
    """x's bit patterns as integers ordered like the floats (so that adjacent
    floats differ by 1), in int64; None for dtypes without one."""
    view = _INT_VIEW.get(x.element_size())
    if view is None or not x.dtype.is_floating_point or x.element_size() == 1:
        return None
    bits = x.contiguous().view(view).to(torch.int64)
    sign_bit = 1 << (8 * x.element_size() - 1)
    mag = bits & (sign_bit - 1)
    return torch.where(bits < 0, -mag, mag)


def _max_ulp(c: torch.Tensor, e: torch.Tensor) -> int | None:
    if c.dtype != e.dtype or c.dtype == torch.float64:
        return None  # float64's ordered bits would not fit the subtraction in int64
    a, b = _ordered_bits(c), _ordered_bits(e)
    if a is None or b is None:
        return None
    finite = torch.isfinite(c) & torch.isfinite(e)
    if not bool(finite.any()):
        return 0
    return int((a - b).abs()[finite].max())


def _per_dim(err: torch.Tensor, limit: int = 4096) -> tuple | None:
    """For each dimension, the largest error at each of its indices (dims
    longer than `limit` are left out as None)."""
    if err.dim() == 0:
        return None
    out = []
    for d in range(err.dim()):
        if err.shape[d] > limit:
            out.append(None)
            continue
        other = [i for i in range(err.dim()) if i != d]
        m = err.amax(dim=other) if other else err
        out.append([float(v) for v in m.tolist()])
    return tuple(out)


def _heatmap(err: torch.Tensor, worst: tuple, cells: int = 48) -> tuple | None:
    """The last two dimensions of err through the worst element (leading
    indices fixed there), max-pooled to at most cells x cells."""
    if err.dim() < 2:
        return None
    sl = err[tuple(worst[:-2])] if err.dim() > 2 else err
    rows, cols = sl.shape
    fr, fc = -(-rows // cells), -(-cols // cells)
    pad = torch.full((fr * -(-rows // fr), fc * -(-cols // fc)), 0.0, dtype=sl.dtype, device=sl.device)
    pad[:rows, :cols] = sl
    pooled = pad.reshape(pad.shape[0] // fr, fr, pad.shape[1] // fc, fc).amax(dim=(1, 3))
    return tuple(tuple(float(v) for v in row) for row in pooled.tolist())


def _rms(x: torch.Tensor) -> float:
    if x.numel() == 0:
        return 0.0
    return float(torch.sqrt(torch.mean(x * x)))


def difference(compiled: torch.Tensor, eager: torch.Tensor, reference: torch.Tensor | None = None,
               rtol: float | None = None, atol: float | None = None, heatmap: bool = False,
               terms: int = 1, term_scale: float | None = None) -> Difference:
    """Compares a compiled tensor with eager's and the float64 reference's
    value of the same computation (same logical shape; strides may differ);
    with heatmap=True also keeps the error map of the worst element's 2-D
    slice."""
    if tuple(compiled.shape) != tuple(eager.shape):
        raise ValueError(f"shapes differ: compiled {tuple(compiled.shape)}, eager {tuple(eager.shape)}")
    dtype = compiled.dtype
    r_tol, a_tol = tolerances(dtype, rtol, atol)
    c = compiled.detach()
    e = eager.detach().to(c.device)
    if c.dtype.is_complex or e.dtype.is_complex:
        c64, e64 = torch.view_as_real(c.to(torch.complex128)), torch.view_as_real(e.to(torch.complex128))
    else:
        c64, e64 = c.to(torch.float64), e.to(torch.float64)
    diff = (c64 - e64).abs()
    both_nan = torch.isnan(c64) & torch.isnan(e64)
    same_inf = torch.isinf(c64) & (c64 == e64)
    matched = both_nan | same_inf
    diff = torch.where(matched, torch.zeros_like(diff), diff)
    n = c.numel()
    finite = torch.isfinite(diff)
    max_abs = float(diff.max()) if n else 0.0
    nz = (e64 != 0) & finite & torch.isfinite(e64)
    max_rel = float((diff[nz] / e64[nz].abs()).max()) if bool(nz.any()) else 0.0
    rmse = _rms(torch.where(finite, diff, torch.zeros_like(diff))) if n else 0.0
    if not bool(finite.all()):
        rmse = math.inf
    bad = ~(diff <= a_tol + r_tol * e64.abs()) & ~matched
    mismatch = 100.0 * float(bad.sum()) / max(1, bad.numel())
    introduced = ~torch.isfinite(c64) & torch.isfinite(e64)
    r64 = None
    if reference is not None:
        r = reference.detach().to(c.device)
        r64 = torch.view_as_real(r.to(torch.complex128)) if r.dtype.is_complex else r.to(torch.float64)
        if tuple(r64.shape) != tuple(c64.shape):
            raise ValueError(f"shapes differ: compiled {tuple(c.shape)}, reference {tuple(r.shape)}")
        introduced &= torch.isfinite(r64)
    nonfinite = int(introduced.sum())
    err_c = err_e = floor = None
    worst_index = worst_values = per_dim = heat = None
    target = r64 if r64 is not None else e64
    err = (c64 - target).abs()
    err = torch.where((torch.isnan(c64) & torch.isnan(target)) | (torch.isinf(c64) & (c64 == target)),
                      torch.zeros_like(err), err)  # agreeing NaN / Inf: no error
    if r64 is not None:
        ok = torch.isfinite(r64)
        err_c = _rms(torch.where(ok, c64 - r64, torch.zeros_like(r64)))
        err_e = _rms(torch.where(ok, e64 - r64, torch.zeros_like(r64)))
        if not bool(torch.isfinite(c64[ok]).all()):
            err_c = math.inf
        if not bool(torch.isfinite(e64[ok]).all()):
            err_e = math.inf
        scale = max(_rms(torch.where(ok, r64, torch.zeros_like(r64))), term_scale or 0.0)
        floor = 0.5 * _eps(dtype) * math.sqrt(max(1, terms)) * scale
    if n:
        err_f = torch.where(torch.isnan(err), torch.full_like(err, math.inf), err)
        flat = int(torch.argmax(err_f.reshape(-1)))
        idx = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), tuple(err.shape))) if err.dim() else ()
        worst_index = idx
        worst_values = (float(c64[idx]) if err.dim() else float(c64),
                        float(e64[idx]) if err.dim() else float(e64),
                        None if r64 is None else (float(r64[idx]) if err.dim() else float(r64)))
        err_inf = torch.where(torch.isnan(err), torch.full_like(err, math.inf), err)
        per_dim = _per_dim(err_inf)
        heat = _heatmap(err_inf, idx) if heatmap else None
    return Difference(
        dtype=str(dtype).replace("torch.", ""), shape=tuple(c.shape), numel=n,
        max_abs=max_abs, max_rel=max_rel, rmse=rmse, mismatch_pct=mismatch,
        max_ulp=_max_ulp(c, e.to(c.dtype)) if e.dtype == c.dtype else None,
        rtol=r_tol, atol=a_tol, err_compiled=err_c, err_eager=err_e, floor=floor,
        nonfinite_introduced=nonfinite, worst_index=worst_index, worst_values=worst_values,
        per_dim=per_dim, heatmap=heat,
    )
