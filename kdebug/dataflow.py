"""What each recorded step read and wrote, and which earlier step wrote what it read.

Note [Data flow]
A run-to-run difference is only explained by the memory it travelled through,
never by equal hash values.  Every step of a run (a kernel launch or an aten
op) is described by its *slots*: one per tensor it reads and one per tensor it
writes, each with the byte range it covers on its device and the hashes taken
of it (``pre`` before the step for reads, ``post`` after it for writes).

- Kernels: every tensor argument, read when its role has R, written when it
  has W (``in_out_ptr`` both), from the launch record's TensorInfo.
- Aten ops: every tensor leaf of the input hash tree is read, every tensor
  leaf of the output tree written.  The byte ranges come from the op's
  ``_kd_extents`` (taken by the C dispatch path with the hashes, kept in the
  trace: KD_OPF_EXTENTS); an op recorded without them has no slots and
  links nothing (``Step.flow_known`` is False).

A read is linked to the *last earlier step that wrote overlapping memory* on
the same device (``MemoryMap``).  compare.py walks the aligned steps of two
runs in order, painting every write into the map as it goes, and classifies
each step whose written hashes differ between the runs:

- **root**: every input it read is identical in both runs (its pre-hash is
  equal, or, without one, the write it was linked to is identical);
- **inherited**: an input differs and traces to an earlier differing write;
- **outside**: an input differs but traces to no differing recorded write (no
  recorded step wrote it after the runs first differed, or its last writer
  wrote identical bytes): the difference entered from outside the recording.

Only steps from the first differing one onward are painted: a read whose
last writer came before it was written identically in both runs.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Any

from . import _C
from .calls import TensorInfo
from .hashing import Stats


@dataclass(frozen=True)
class Slot:
    """One tensor a step read (``pre`` hash) or wrote (``post`` hash)."""

    key: str                 # the hash dictionary key: argument name, "in/0/1" style path for ops
    label: str               # what to call it: "in_ptr0 (index 1)", "output[7] philox_offset"
    device: tuple            # (device type, index)
    lo: int
    hi: int
    dense: bool = True       # its elements cover every byte of [lo, hi) (Note [Partial writes])


def tensor_dense(t: TensorInfo) -> bool:
    """Whether a tensor's elements cover every byte of its extent (not a view with gaps)."""
    lo, hi = tensor_extent(t)
    return t.numel() * getattr(t.dtype, "itemsize", 1) >= hi - lo


def tensor_extent(t: TensorInfo) -> tuple[int, int]:
    if t.numel() == 0:
        return (t.data_ptr, t.data_ptr)
    itemsize = getattr(t.dtype, "itemsize", 1)
    span = sum((s - 1) * abs(st) for s, st in zip(t.shape, t.stride))
    return (t.data_ptr, t.data_ptr + (span + 1) * itemsize)


def _device(t: TensorInfo) -> tuple:
    return (t.device.type, -1 if t.device.index is None else t.device.index)


def kernel_slots(tensors: dict, arg_names: tuple) -> tuple[list, list]:
    """(reads, writes) of a kernel launch from its TensorInfo per argument."""
    reads, writes = [], []
    for name, t in tensors.items():
        if not isinstance(t, TensorInfo):
            continue
        idx = arg_names.index(name) if name in arg_names else None
        label = f"{name} (index {idx})" if idx is not None else name
        lo, hi = tensor_extent(t)
        s = Slot(name, label, _device(t), lo, hi, tensor_dense(t))
        if t.reads:
            reads.append(s)
        if t.writes:
            writes.append(s)
    return reads, writes


_DEV_NAMES = {0: "cpu", 1: "cuda"}

# ops whose schemas declare a write that writes no element: set_ and resize_
# rebind or reshape self, record_stream only marks it; torch.Tag.inplace_view
# ops (t_, unsqueeze_, as_strided_, detach_) are told by their tag
_NO_ELEMENT_WRITES = frozenset({"set_", "resize_", "resize_as_", "record_stream"})


def writes_elements(func) -> bool:
    """Whether an op (an OpOverload) writes the elements of one of its
    arguments: an alias annotation with a write (in-place and out= ops), not
    a change of metadata only.  Without a schema: taken as a writer.  What
    collectives.py's overwrite check (Note [Outputs written before their
    hash]) and compare.py's search for writes only one run made (Note
    [Writes only one run made]) count as a write."""
    import torch

    schema = getattr(func, "_schema", None)
    if schema is None:
        return True
    if torch.Tag.inplace_view in getattr(func, "tags", ()) or schema.name.split("::")[-1] in _NO_ELEMENT_WRITES:
        return False
    return any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments)


def _is_extent(x) -> bool:
    return isinstance(x, _C.Extent)


def _walk(tree, path=()):
    """(path, leaf) of every leaf of an extents tree, in the order the hash
    trees list theirs (dict values in insertion order)."""
    if _is_extent(tree) or tree is None:
        yield path, tree
    elif isinstance(tree, dict):
        for k, v in tree.items():
            yield from _walk(v, path + (k,))
    elif isinstance(tree, (list, tuple)):
        for i, v in enumerate(tree):
            yield from _walk(v, path + (i,))
    else:
        yield path, None


def _schema(op):
    return getattr(op, "_schema", None)


def _input_label(path: tuple, schema) -> str:
    """'self', 'indices[2]', 'weight' for a path into ((args...), {kwargs})."""
    if len(path) >= 2 and path[0] == 0 and isinstance(path[1], int):
        j, rest = path[1], path[2:]
        name = f"arg {j}"
        if schema is not None and j < len(schema.arguments):
            name = schema.arguments[j].name
    elif len(path) >= 2 and path[0] == 1:
        name, rest = str(path[1]), path[2:]
    else:
        name, rest = "input", path
    return name + "".join(f"[{r}]" for r in rest)


def _output_label(path: tuple, schema) -> str:
    """'output', 'output[7] philox_offset' for a path into the op's result."""
    if not path:
        return "output"
    text = "output" + "".join(f"[{r}]" for r in path)
    if schema is not None and isinstance(path[0], int) and path[0] < len(schema.returns):
        rname = schema.returns[path[0]].name
        if rname:
            text += f" {rname}"
    return text


def path_key(side: str, path: tuple) -> str:
    return side + "/" + "/".join(str(p) for p in path)


def op_slots(extents, op) -> tuple[list, list] | None:
    """(reads, writes) of an aten op from its extents trees (a _C.OpExtents),
    None without them."""
    if extents is None:
        return None
    schema = _schema(op)
    reads, writes = [], []
    # an out= argument is written, not read: taken as read, a difference an earlier step left in the
    # buffer made the op (an extern mm into a reused buffer) look like that step's consequence
    outs = {a.name for a in schema.arguments if getattr(a, "is_out", False)} if schema is not None else set()
    for tree, side, out in ((extents.inputs, "in", reads), (extents.outputs, "out", writes)):
        if tree is None:
            continue
        for path, leaf in _walk(tree):
            if leaf is None:
                continue
            if side == "in" and outs and _input_label(path[:2], schema) in outs:
                continue
            label = _input_label(path, schema) if side == "in" else _output_label(path, schema)
            out.append(Slot(path_key(side, path), label,
                            (_DEV_NAMES.get(leaf.device_type, leaf.device_type), leaf.device_index), leaf.lo, leaf.hi,
                            getattr(leaf, "nbytes", leaf.hi - leaf.lo) >= leaf.hi - leaf.lo))
    return reads, writes


def tree_values(tree, side: str, shape=None) -> dict:
    """{path key: hash} of every leaf of a hash tree (the same paths op_slots
    uses).  ``shape``, the matching extents tree, says where the leaves are: a
    tuple of two bitwise hashes and a tuple of one value per hash kind look
    alike."""
    out: dict[str, Any] = {}

    def walk(t, path, e):
        if e is not None and (_is_extent(e) or not isinstance(e, (tuple, list, dict))):
            if t is not None:
                out[path_key(side, path)] = t
        elif isinstance(t, dict):
            for k, v in t.items():
                walk(v, path + (k,), e.get(k) if isinstance(e, dict) else None)
        elif isinstance(t, list) or (isinstance(t, tuple) and (e is not None or not _is_hash_tuple(t))):
            for i, v in enumerate(t):
                walk(v, path + (i,), e[i] if isinstance(e, (list, tuple)) and i < len(e) else None)
        elif t is not None:
            out[path_key(side, path)] = t

    walk(tree, (), shape)
    return out


def _is_hash_tuple(t) -> bool:
    # a list of hash_fn kinds gives a tuple of plain values per tensor
    return isinstance(t, tuple) and bool(t) and all(isinstance(x, (int, float, Stats)) for x in t)


@dataclass
class Write:
    """A painted write: the slot that wrote it, and whether its post-hash
    differs between the runs."""

    slot: Slot
    differs: bool
    causes: int = 0          # bit set of root numbers its difference came from
    read: bool = False       # a later step read it

# Note [Partial writes]
# A write is painted over its extent, first to one past the last byte of the
# tensor it wrote, and takes those bytes from earlier writes.  A view with
# gaps (a column x[:, 0], a diagonal, every other element) covers only some
# of them: painted whole, ``x[:, 0] = 0`` after a kernel that wrote x took
# all of x from that kernel, whose difference then looked overwritten (a
# root called benign while the kept x differed; a stencil reading x blamed
# as reading from outside; found by a trust pass).  So a write whose
# elements do not cover its extent (Extent.nbytes, trace format 1.4) is laid
# over it without taking bytes from anyone: the earlier writers keep them,
# and a later read of the range links to both.  A later write that covers it
# whole takes its range as usual.


class MemoryMap:
    """Byte ranges per device, each owned by the last Write painted over it,
    and partial writes laid over them (Note [Partial writes])."""

    def __init__(self):
        self._maps: dict[tuple, tuple[list, list, list]] = {}
        self._over: dict[tuple, list[Write]] = {}  # partial writes per device, oldest first

    def paint(self, w: Write) -> None:
        lo, hi = w.slot.lo, w.slot.hi
        if hi <= lo:
            return
        over = self._over.get(w.slot.device)
        if not w.slot.dense:
            self._over.setdefault(w.slot.device, []).append(w)
            return
        if over:  # a whole write takes the partial writes it covers
            over[:] = [o for o in over if not (lo <= o.slot.lo and o.slot.hi <= hi)]
        starts, ends, owners = self._maps.setdefault(w.slot.device, ([], [], []))
        i = bisect.bisect_right(ends, lo)         # first interval ending after lo
        j = bisect.bisect_left(starts, hi)        # first interval starting at or after hi
        new_s, new_e, new_o = [], [], []
        if i < j and starts[i] < lo:              # keep the left part of the first
            new_s.append(starts[i]); new_e.append(lo); new_o.append(owners[i])
        new_s.append(lo); new_e.append(hi); new_o.append(w)
        if i < j and ends[j - 1] > hi:            # keep the right part of the last
            new_s.append(hi); new_e.append(ends[j - 1]); new_o.append(owners[j - 1])
        starts[i:j], ends[i:j], owners[i:j] = new_s, new_e, new_o

    def owners(self) -> set[int]:
        """ids of the Writes that still own some byte (were not wholly overwritten)."""
        return ({id(w) for _, _, owners in self._maps.values() for w in owners}
                | {id(w) for ws in self._over.values() for w in ws})

    def spans(self):
        """(device, lo, hi, Write) of every byte range, in address order per
        device, then the partial writes laid over them."""
        for dev, (starts, ends, owners) in self._maps.items():
            yield from ((dev, lo, hi, w) for lo, hi, w in zip(starts, ends, owners))
        for dev, ws in self._over.items():
            yield from ((dev, w.slot.lo, w.slot.hi, w) for w in ws)

    def pieces(self, slot: Slot) -> list[tuple[int, int, "Write | None"]]:
        """[slot.lo, slot.hi) cut at the edges of the whole Writes owning its
        bytes: (lo, hi, the Write, or None for bytes no painted write owns),
        in address order."""
        starts, ends, owners = self._maps.get(slot.device, ([], [], []))
        i = bisect.bisect_right(ends, slot.lo)
        j = bisect.bisect_left(starts, slot.hi)
        out: list = []
        at = slot.lo
        for lo, hi, w in zip(starts[i:j], ends[i:j], owners[i:j]):
            lo, hi = max(lo, slot.lo), min(hi, slot.hi)
            if lo > at:
                out.append((at, lo, None))
            out.append((lo, hi, w))
            at = hi
        if at < slot.hi:
            out.append((at, slot.hi, None))
        return out

    def partial_over(self, device: tuple, lo: int, hi: int) -> list[Write]:
        """The partial writes laid over any byte of [lo, hi) (Note [Partial writes])."""
        return [o for o in self._over.get(device, ()) if o.slot.lo < hi and lo < o.slot.hi]

    def writers(self, slot: Slot) -> list[Write]:
        """The Writes owning any byte of the slot's range, in address order."""
        if slot.hi <= slot.lo:
            return []
        starts, ends, owners = self._maps.get(slot.device, ([], [], []))
        i = bisect.bisect_right(ends, slot.lo)
        j = bisect.bisect_left(starts, slot.hi)
        seen, out = set(), []
        over = [o for o in self._over.get(slot.device, ()) if o.slot.lo < slot.hi and slot.lo < o.slot.hi]
        for w in owners[i:j] + over:
            if id(w) not in seen:
                seen.add(id(w))
                out.append(w)
        return out

