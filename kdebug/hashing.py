"""Tensor hashes for kernel and aten-op records (definitions: Notes in csrc/core/kd_hash.h).

    "bitwise"      kdebug's 64-bit hash of the bytes in logical order
    "norm"         upstream's float64 L1 norm, NaN / inf handled deterministically
    "stats"        how big the values are, from the same pass: a Stats (l1, sum,
                   absmax, nan, posinf, neginf; Note [The stats hash])
    "hash_tensor"  upstream's XOR of 64-bit upcast values
    a list of these, or any callable (slow path)

CPU tensors are hashed by C code.  CUDA tensors are hashed by kdebug's CUDA
kernel (Note [Hashing on the GPU], csrc/core/kd_cuda_hash.h); tensors on other
devices, or on CUDA with a build without it, are copied to the host and hashed
by the C code (this synchronizes).
"""
from __future__ import annotations

import math
import os
import struct
import threading
import warnings
import zlib
from typing import Any, Callable

import torch

from . import _C, _upstream

KINDS = {"bitwise": _C.HASH_BITWISE, "norm": _C.HASH_NORM, "hash_tensor": _C.HASH_XOR, "stats": _C.HASH_STATS}
# kinds that decode the elements' values: a dtype they do not know gives Unhashed
_UNDECODABLE = _C.HASH_NORM | _C.HASH_XOR | _C.HASH_STATS


class NormHash(float):
    """The norm hash of a tensor with NaN or infinite elements.

    Its float value is upstream's (``nan`` when any element is NaN, else
    ``inf``); unlike upstream's, two NormHash compare equal when the finite
    part of the L1 norm and the NaN / +inf / -inf counts are equal, so
    identical tensors always compare equal."""

    __slots__ = ("l1_finite", "nan", "posinf", "neginf")

    def __new__(cls, l1_finite: float, nan: int, posinf: int, neginf: int):
        value = math.nan if nan else math.inf
        self = super().__new__(cls, value)
        self.l1_finite, self.nan, self.posinf, self.neginf = l1_finite, nan, posinf, neginf
        return self

    def _key(self):
        return (self.l1_finite, self.nan, self.posinf, self.neginf)

    def __eq__(self, other):
        if isinstance(other, NormHash):
            return self._key() == other._key()
        return False

    def __ne__(self, other):
        return not self == other

    def __hash__(self):
        return hash(self._key())

    def __repr__(self):
        parts = [f"l1_finite={self.l1_finite!r}"]
        parts += [f"{k}={getattr(self, k)}" for k in ("nan", "posinf", "neginf") if getattr(self, k)]
        return f"NormHash({', '.join(parts)})"


class Unhashed(float):
    """Stands where a hash was asked for that the tensor's dtype cannot give
    (the norm, hash_tensor or stats of a float4_e2m1fn_x2 or quantized tensor,
    whose values kdebug does not decode): no value was computed, so none is
    shown.

    Alone, it is never equal to anything, itself included (as a NaN), so two
    unhashed tensors never match by accident; its float value is NaN so that
    arithmetic on it (upstream's relative difference) stays defined, and the
    NaN's payload is random: a trace stores it as that f64, so digests of two
    unhashed values (kdebug diff, hunt) differ too.  Beside a bitwise hash of
    the same tensor (``of``: hash_fn=["bitwise", "stats"], the hunt's), it
    follows the bytes: equal to another of the same kind with the same bitwise
    hash, its payload derived from that hash, so that identical tensors match
    by their bytes (a random payload made every quantized op of a hunt a
    false root).  The C records do the same (Note [Unhashed values] in
    csrc/kd_launch_hash.c).  hash_fn='bitwise' hashes every dtype by its
    bytes."""

    __slots__ = ("kind", "of")

    def __new__(cls, kind: str, of: int | None = None):
        if of is None:
            x = int.from_bytes(os.urandom(8), "little")
        else:  # the same (kind, bytes) gives the same marker in every process
            x = ((int(of) ^ zlib.crc32(kind.encode())) * 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
            x ^= x >> 29
        payload = x & ((1 << 51) - 1) | 1
        nan = struct.unpack("<d", struct.pack("<Q", 0x7FF8000000000000 | payload))[0]
        self = super().__new__(cls, nan)
        self.kind = kind
        self.of = of
        return self

    def __eq__(self, other):
        return (self.of is not None and isinstance(other, Unhashed) and other.kind == self.kind
                and other.of == self.of)

    def __ne__(self, other):
        return not self.__eq__(other)

    def __hash__(self):
        return hash(("Unhashed", self.kind, self.of)) if self.of is not None else float.__hash__(self)

    def __reduce__(self):
        return (Unhashed, (self.kind, self.of))

    def __repr__(self):
        return f"Unhashed({self.kind!r})"

    __str__ = __repr__


def _same_float(a: float, b: float) -> bool:
    return a == b or (a != a and b != b)


class Stats:
    """The stats hash of a tensor (Note [The stats hash] in csrc/core/kd_hash.h):
    cheap statistics computed in the hash's pass, on the tensor's device.

    l1      L1 norm of the finite elements (the norm hash; complex: sum of |z|)
    sum     sum of the finite elements, float64 (integers: exact int64 sum,
            wrapping like torch's, as a float; complex: of re and im)
    absmax  largest |x| of the finite elements, 0.0 when none
    nan, posinf, neginf   counts of NaN, +inf and -inf elements (0 for integers)

    Frozen; equal when every field is equal (NaN fields equal NaN), so
    identical tensors always compare equal."""

    __slots__ = ("l1", "sum", "absmax", "nan", "posinf", "neginf")

    def __init__(self, l1: float, sum: float, absmax: float, nan: int, posinf: int, neginf: int):
        for k, v in (("l1", float(l1)), ("sum", float(sum)), ("absmax", float(absmax)),
                     ("nan", int(nan)), ("posinf", int(posinf)), ("neginf", int(neginf))):
            object.__setattr__(self, k, v)

    def __setattr__(self, name, value):
        raise AttributeError("kdebug.hashing.Stats is immutable")

    def __delattr__(self, name):
        raise AttributeError("kdebug.hashing.Stats is immutable")

    def _key(self):
        return (self.l1, self.sum, self.absmax, self.nan, self.posinf, self.neginf)

    def __eq__(self, other):
        if not isinstance(other, Stats):
            return NotImplemented
        return all(_same_float(a, b) for a, b in zip(self._key(), other._key()))

    def __ne__(self, other):
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    def __hash__(self):
        return hash(tuple("nan" if x != x else x for x in self._key()))

    def __reduce__(self):
        return (Stats, self._key())

    @property
    def nonfinite(self) -> int:
        return self.nan + self.posinf + self.neginf

    def __repr__(self):
        parts = [f"l1={self.l1!r}", f"sum={self.sum!r}", f"absmax={self.absmax!r}"]
        parts += [f"{k}={getattr(self, k)}" for k in ("nan", "posinf", "neginf") if getattr(self, k)]
        return f"Stats({', '.join(parts)})"


def stats_value(v) -> Stats:
    """The Stats of a HashValues (Note [HashValues] in csrc/kd_hash_py.c)."""
    return Stats(v.l1, v.sum, v.absmax, v.nan, v.posinf, v.neginf)


def norm_value(l1: float, nan: int, posinf: int, neginf: int) -> float:
    if nan or posinf or neginf:
        return NormHash(l1, nan, posinf, neginf)
    return l1


def _logical(t: torch.Tensor) -> torch.Tensor:
    """t with its lazy conjugate / negative bits applied: the values it
    stands for, which is what every hash is of (a conj() or neg view holds
    the un-negated bytes).  A copy only for such views."""
    if t.is_conj() or t.is_neg():
        t = t.resolve_conj().resolve_neg()
        if t.is_conj() or t.is_neg():  # resolve_* keeps the bits on some view kinds: materialize
            t = t.clone(memory_format=torch.contiguous_format).resolve_conj().resolve_neg()
    return t


# Note [Quantized tensors' parameters]
# A quantized tensor's values are its integers *and* its quantizer's
# parameters: two tensors with the same integers and another scale hold other
# values.  The bitwise hash of one is therefore the hash of its integer bytes
# mixed (kd_dg_mix, csrc/core/kd_trace_digest.h) with a digest of its
# parameters: the bitwise hashes of an int64 header [qscheme code, axis (-1
# per tensor)], of its scales and of its zero points (per tensor: a float64 and
# an int64 of one element; per channel: torch's own tensors, in their dtypes),
# each mixed in turn.  The C launch path computes the same value for a CPU
# tensor (qparams_digest in csrc/kd_launch_hash.c, from kd_shim_qparams in
# csrc/kd_torch.cpp); a quantized CUDA tensor is hashed here, on the host
# (during a CUDA graph capture: no value, as for any tensor there).  The
# norm, hash_tensor and stats of a quantized tensor are those of its integers
# (int_repr(); quint4x2 / quint2x4: its packed bytes), on every path.
_QSCHEME = {torch.per_tensor_affine: 0, torch.per_channel_affine: 1, torch.per_tensor_symmetric: 2,
            torch.per_channel_symmetric: 3, torch.per_channel_affine_float_qparams: 4}
_MASK64 = (1 << 64) - 1


def _mix(h: int, v: int) -> int:
    """kd_dg_mix of csrc/core/kd_trace_digest.h."""
    h = ((h ^ v) * 0x9E3779B97F4A7C15) & _MASK64
    return h ^ (h >> 29)


def _bits(t: torch.Tensor) -> int:
    return _C.hash(t.detach().cpu(), _C.HASH_BITWISE).bitwise


def qparams_digest(t: torch.Tensor) -> int:
    """The digest of a quantized tensor's quantizer parameters (Note
    [Quantized tensors' parameters])."""
    scheme = t.qscheme()
    if scheme in (torch.per_tensor_affine, torch.per_tensor_symmetric):
        axis = -1
        scales = torch.tensor([t.q_scale()], dtype=torch.float64, device="cpu")
        zeros = torch.tensor([t.q_zero_point()], dtype=torch.int64, device="cpu")
    else:
        axis = t.q_per_channel_axis()
        scales, zeros = t.q_per_channel_scales(), t.q_per_channel_zero_points()
    d = _bits(torch.tensor([_QSCHEME.get(scheme, 99), axis], dtype=torch.int64, device="cpu"))
    return _mix(_mix(d, _bits(scales)), _bits(zeros))


def _with_qparams(r: "_C.HashValues", qd: int) -> "_C.HashValues":
    return _C.HashValues((_mix(r.bitwise, qd),) + tuple(r)[1:])


def _raw(t: torch.Tensor, kinds: int) -> "_C.HashValues":
    """The HashValues of any tensor's logical values, computed on the host
    (copying it there first); a quantized tensor's bitwise hash covers its
    quantizer's parameters (Note [Quantized tensors' parameters])."""
    with _upstream.disable_torch_dispatch():
        t = _logical(t.detach())
        if t.device.type != "cpu":
            t = t.to("cpu")
        if t.is_quantized:
            qd = qparams_digest(t)
            r = _C.hash(t.int_repr(), kinds)
            return _with_qparams(r, qd) if kinds & _C.HASH_BITWISE else r
        return _C.hash(t, kinds)


# Note [Tensors of other layouts]
# A sparse (COO, CSR, CSC, BSR, BSC) or mkldnn tensor has no strides for the
# hash kernels to walk.  Its hashes are those of its dense values (to_dense(),
# run with dispatch disabled: not an op of the program), so it hashes as the
# dense tensor it stands for does, whatever order its entries are stored in.
# One whose dense form would take more than _DENSE_LIMIT bytes, or that
# cannot be made dense, gets no value (None), warned about once: before, the
# TypeError of the launch path's metadata reader ended the program's op.
_DENSE_LIMIT = 256 << 20
_layout_warned: set[str] = set()


def _dense(t: torch.Tensor):
    """t's dense values (Note [Tensors of other layouts]), or None."""
    try:
        nbytes = t.numel() * t.element_size()
        if nbytes <= _DENSE_LIMIT:
            return t.to_dense()
        why = f"its dense form would take {nbytes >> 20} MiB"
    except (RuntimeError, TypeError, NotImplementedError) as e:
        why = f"it cannot be made dense ({type(e).__name__}: {str(e)[:120]})"
    key = f"{t.layout}:{why[:20]}"
    if key not in _layout_warned:
        _layout_warned.add(key)
        from .inductor import KdebugWarning

        warnings.warn(f"kdebug: a {t.layout} tensor was not hashed: {why}; its hashes are None "
                      "(Note [Tensors of other layouts])", KdebugWarning, stacklevel=3)
    return None


def start(t: torch.Tensor, kinds: int):
    """Starts hashing t: a HashValues when done at once (CPU), a _C.PendingHash
    when queued on t's current CUDA stream (fetch with finish), else the host
    path (a quantized tensor too: Note [Quantized tensors' parameters]);
    None for a tensor of another layout with no value (Note [Tensors of other
    layouts])."""
    with _upstream.disable_torch_dispatch():
        if t.layout is not torch.strided:
            t = _dense(t.detach())
            if t is None:
                return None
        t = _logical(t.detach())
        if t.is_quantized and not (t.device.type == "cuda" and torch.cuda.is_current_stream_capturing()):
            return _raw(t, kinds)  # (capturing: hash_async gives no value, as for any tensor there)
        r = _C.hash_async(t, kinds, 0)  # 0: the current stream of t's device
        if r is NotImplemented:
            return _raw(t, kinds)
        return r


def finish(r) -> "_C.HashValues | None":
    """start's result as values; None when a GPU hash got none (asked during
    a CUDA graph capture of the tensor's stream, or its queuing failed)."""
    return _C.hash_fetch(r) if isinstance(r, _C.PendingHash) else r


def _hash7(t: torch.Tensor, kinds: int, on_host: bool) -> "_C.HashValues":
    r = _raw(t, kinds) if on_host else finish(start(t, kinds))
    if r is None:
        raise RuntimeError("kdebug could not hash this CUDA tensor on its device: its stream is capturing a "
                           "CUDA graph (hash it after the capture, or with on_host=True outside it), or "
                           "queuing the hash failed (kdebug._C.defer_stats() counts it)")
    return r


def bitwise(t: torch.Tensor, on_host: bool = False) -> int:
    """kdebug's bitwise hash (Note [The bitwise hash] in csrc/core/kd_hash.h).
    CUDA tensors are hashed on their device unless on_host=True."""
    return _hash7(t, _C.HASH_BITWISE, on_host).bitwise


def norm(t: torch.Tensor, on_host: bool = False) -> float:
    """Upstream's norm hash (float64 L1), deterministic for NaN and inf."""
    r = _hash7(t, _C.HASH_NORM, on_host)
    if r.unsupported:
        raise TypeError(f"kdebug cannot compute the norm hash of a {t.dtype} tensor; use hash_fn='bitwise'")
    return norm_value(r.l1, r.nan, r.posinf, r.neginf)


def stats(t: torch.Tensor, on_host: bool = False) -> Stats:
    """The stats hash of t (Note [The stats hash] in csrc/core/kd_hash.h), computed
    on t's device (CUDA: kdebug's hash kernel) unless on_host=True."""
    r = _hash7(t, _C.HASH_STATS, on_host)
    if r.unsupported:
        raise TypeError(f"kdebug cannot compute the stats of a {t.dtype} tensor; use hash_fn='bitwise'")
    return stats_value(r)


def hash_tensor(t: torch.Tensor, on_host: bool = False) -> int:
    """Upstream's hash_tensor value: XOR of the 64-bit upcast elements."""
    r = _hash7(t, _C.HASH_XOR, on_host)
    if r.unsupported:
        raise TypeError(f"kdebug cannot compute hash_tensor of a {t.dtype} tensor; use hash_fn='bitwise'")
    return r.xor64


_FNS = {"bitwise": bitwise, "norm": norm, "hash_tensor": hash_tensor, "stats": stats}


class HashSpec:
    """What one log_tensor_hashes() call asked for."""

    def __init__(self, names: list[str] | None, fn: Callable | None, single: bool):
        self.names = names or []
        self.fn = fn
        self.single = single
        self.kinds = 0
        for n in self.names:
            self.kinds |= KINDS[n]
        if fn is not None:
            self.kinds |= _C.HASH_CUSTOM

    def aten_fn(self) -> Callable:
        """The function upstream's aten-op hooks call for each tensor (a dtype
        a kind cannot decode gives Unhashed, as the fast path does)."""
        if self.fn is not None:
            return self.fn
        # no value (None) where the GPU gives none: a tensor an op makes during a CUDA graph
        # capture, as on the fast path (Note [CUDA graph replays]); never an error in the op
        return lambda t: self.value(finish(start(t, self.kinds)))

    def value(self, side, custom: Any = None, unhashed: int | None = None):
        """A tensor's hash value(s) from a _C.HashValues (a record side, pre or
        post), or None.  Kinds its dtype cannot decode (side.unsupported: norm,
        hash_tensor, stats of float4_e2m1fn_x2) are Unhashed, never the zeros
        the side holds (Note [Unhashed values] in csrc/kd_launch_hash.c), and
        warned about once per DebugMode; a caller that knows which kinds those
        are and has warned (kernel records) passes them as `unhashed`."""
        if self.fn is not None:
            return custom
        if side is None:
            return None
        if unhashed is None:
            unhashed = self.kinds & _UNDECODABLE if side.unsupported else 0
            if unhashed:
                _warn_unhashed([n for n in self.names if KINDS[n] & unhashed])
        vals = []
        bits = side.bitwise if "bitwise" in self.names else None  # Unhashed beside it follows the bytes
        for n in self.names:
            if KINDS[n] & unhashed:
                vals.append(Unhashed(n, bits))
            elif n == "bitwise":
                vals.append(side.bitwise)
            elif n == "hash_tensor":
                vals.append(side.xor64)
            elif n == "stats":
                vals.append(stats_value(side))
            else:
                vals.append(norm_value(side.l1, side.nan, side.posinf, side.neginf))
        return vals[0] if self.single else tuple(vals)



def _shared_custom(t: torch.Tensor):
    raise RuntimeError("kdebug: the shared spec of callable hash_fns is not called; "
                       "each log_tensor_hashes() keeps its own callable")


# Spec ids go into records (16 bits).  One id per distinct list of names, made
# once; every callable hash_fn shares one id, since a record of a custom hash
# holds its value (Recorder.custom) and only needs to say it is custom.  A loop
# entering log_tensor_hashes() every step so makes no new ids.
_specs: list[HashSpec] = [HashSpec([], None, True),  # id 0: none
                          HashSpec(None, _shared_custom, True)]  # id 1: any callable
CUSTOM_ID = 1
_spec_ids: dict[tuple, int] = {}
_specs_lock = threading.Lock()
_parsed_names: dict[str, tuple] = {}  # hash_fn name -> parse()'s answer (a str subclass is parsed in full)


def parse(hash_fn) -> tuple[int, HashSpec]:
    """(spec id, spec) for a hash_fn argument; a clear error for bad input."""
    if type(hash_fn) is str:
        known = _parsed_names.get(hash_fn)  # every log_tensor_hashes() enter: the usual case, one lookup
        if known is not None:
            return known
    if callable(hash_fn) and not isinstance(hash_fn, str):
        return CUSTOM_ID, HashSpec(None, hash_fn, True)
    if isinstance(hash_fn, str):
        if hash_fn not in KINDS:
            raise ValueError(f"hash_fn={hash_fn!r} is not a hash kdebug knows: use one of "
                             f"{', '.join(map(repr, KINDS))}, a list of them, or a callable")
        key = ((hash_fn,), True)
    elif isinstance(hash_fn, (list, tuple)) and hash_fn and all(isinstance(h, str) for h in hash_fn):
        bad = [h for h in hash_fn if h not in KINDS]
        if bad:
            raise ValueError(f"hash_fn has unknown hash(es) {bad}: use {', '.join(map(repr, KINDS))}")
        key = (tuple(hash_fn), False)
        if "stats" in hash_fn and "hash_tensor" in hash_fn:
            raise ValueError("hash_fn cannot hold both 'stats' and 'hash_tensor': a record has room for one of "
                             "them (Note [Room for the stats] in csrc/core/kd_record.h); drop one")
    else:
        raise TypeError(f"hash_fn must be a str, a non-empty list of str or a callable, not {type(hash_fn).__name__}")
    with _specs_lock:
        i = _spec_ids.get(key)
        if i is None:
            if len(_specs) >= 65535:
                raise RuntimeError("kdebug: more than 65534 distinct hash_fn lists in one process")
            _specs.append(HashSpec(list(key[0]), None, key[1]))
            i = _spec_ids[key] = len(_specs) - 1
        if type(hash_fn) is str:
            _parsed_names[hash_fn] = (i, _specs[i])
        return i, _specs[i]


class Pending:
    """A hash still on the GPU; replaced by its value when results are read."""

    __slots__ = ("handle", "spec")

    def __init__(self, handle, spec: "HashSpec"):  # handle: a _C.PendingHash
        self.handle, self.spec = handle, spec

    def value(self):
        r = _C.hash_fetch(self.handle)
        return None if r is None else self.spec.value(r)

    def __repr__(self):
        return repr(self.value())


def start_value(t: torch.Tensor, spec: "HashSpec"):
    """The spec's value for t now, or a Pending one queued on the GPU; None
    for a tensor with no data of its own (_upstream.has_no_data: meta, fake,
    a wrapper subclass; Inductor's pattern matcher and AOTInductor trace on
    such tensors under the active mode)."""
    if _upstream.has_no_data(t):
        return None
    r = start(t, spec.kinds)
    if isinstance(r, _C.PendingHash):
        return Pending(r, spec)
    return None if r is None else spec.value(r)


def spec(spec_id: int) -> HashSpec:
    return _specs[spec_id]


# hash kinds warned about as Unhashed where no kdebug DebugMode is active
_unhashed_warned: set[str] = set()


def _warn_unhashed(names: list[str]) -> None:
    """Warns once per DebugMode (or once per process outside one) and kind."""
    from . import _active, inductor

    mode = _active.recording()
    for n in names:
        msg = (f"a tensor's dtype has no values the {n} hash can decode (a packed or sub-byte dtype "
               "such as float4_e2m1fn_x2): its hash is recorded as Unhashed, which never compares "
               "equal to anything. hash_fn='bitwise' hashes every dtype by its bytes.")
        if mode is not None:
            mode._warn_once("unhashed:" + n, msg)
        elif n not in _unhashed_warned:
            _unhashed_warned.add(n)
            inductor.warn(msg, stacklevel=3)


# custom hash_fns of the active log_tensor_hashes() contexts, per thread,
# innermost last (Note [Hash settings per thread] in csrc/kd_recorder.h): a thread
# with none uses those of the thread that started the recorder, so kernels
# that autograd's or record_all_threads' threads launch are hashed too
_custom_fns: dict[int, list[Callable]] = {}


def _custom_hasher(recorder, launch_index: int, arg: int, when: int, t: torch.Tensor) -> None:
    fns = _custom_fns.get(threading.get_ident()) or _custom_fns.get(recorder.owner_thread)
    if fns:
        with _upstream.disable_torch_dispatch():
            recorder.custom[(launch_index, arg, when)] = fns[-1](t)


def push_custom(fn: Callable) -> None:
    _custom_fns.setdefault(threading.get_ident(), []).append(fn)


def remove_custom(fn: Callable) -> None:
    """Takes ``fn`` (pushed on this thread) off this thread's callable
    hash_fns; the last push of it, wherever it is (a context left out of
    order: Note [Aten-op hash settings per thread])."""
    me = threading.get_ident()
    fns = _custom_fns[me]
    at = max(i for i, f in enumerate(fns) if f is fn)
    del fns[at]
    if not fns:
        del _custom_fns[me]


_C._set_hashers(_raw, _custom_hasher, Stats)
