"""Which memory the program still held when the recording ended.

Note [Final state]
A root is benign only if its difference changed no later step *and no final
tensor* (Note [Data flow]).  A differing write that no recorded step read and
that nothing overwrote still holds its value when the recording ends: it is a
kept result (a gradient, an updated weight, a returned output) or memory the
program freed without reading it (an op's workspace, a scratch buffer).  The
recording cannot tell the two apart, so at the end of a recording that asks
for it (``DebugMode(record_final_state=True)``: kdebug hunt's runs,
``assert_deterministic``, the pytest plugin) kdebug takes the *final state*:
the storages of every tensor the Python heap still reaches (gc-tracked tensor
objects and the ``.grad`` of leaf tensors), as merged byte ranges per device,
saved in the trace's META under ``final_state``.

The comparison then counts a differing unread write as kept only where the
memory it still owns overlaps the final state, and as *freed unread* otherwise.
Two guards keep this from hiding a real result:

- a storage counts whole (a kept view keeps its base's bytes);
- a final state that overlaps no memory any compared step still owns says
  nothing (a script whose state lived in ``main()``'s locals, gone before the
  recording ended): the comparison then treats every unread differing tensor
  as possibly kept, as without a final state.

Tensors held only by C++ (autograd's saved tensors of a live graph) are not
seen; tensors with no storage (meta, sparse, wrapper subclasses) are counted
in ``skipped``.
"""
from __future__ import annotations

import bisect
import gc
from dataclasses import dataclass

import torch

from . import _upstream


def _device_key(dev: torch.device) -> tuple[str, int]:
    # CPU memory is one address space whatever index a tensor names
    return (dev.type, -1 if dev.type == "cpu" or dev.index is None else dev.index)


def snapshot() -> dict:
    """The final state of this process: {"ranges": [[device type, index, lo,
    hi], ...] merged and sorted, "tensors": storages seen, "skipped": tensors
    without a storage kdebug can place}."""
    spans: dict[tuple[str, int], list[tuple[int, int]]] = {}
    seen: set[tuple] = set()
    skipped = 0

    def add(t: torch.Tensor) -> None:
        nonlocal skipped
        try:
            if t.layout != torch.strided or t.device.type == "meta":
                skipped += 1
                return
            st = t.untyped_storage()
            lo, n = st.data_ptr(), st.nbytes()
        except Exception:  # a wrapper subclass, a functional tensor, ...: no storage to place
            skipped += 1
            return
        key = _device_key(t.device) + (lo, n)
        if n and key not in seen:
            seen.add(key)
            spans.setdefault(key[:2], []).append((lo, lo + n))

    tensor, fake = torch.Tensor, _upstream.fake_tensor_type()
    for o in gc.get_objects():
        kind = type(o)  # type(), not isinstance(): a dead weakproxy raises
        if not issubclass(kind, tensor) or issubclass(kind, fake):  # fakes: the compiler's, no memory
            continue
        add(o)
        try:
            g = o.grad if o.is_leaf else None
        except Exception:
            g = None
        if isinstance(g, torch.Tensor):
            add(g)
    ranges = []
    for (dt, di), xs in sorted(spans.items()):
        xs.sort()
        lo, hi = xs[0]
        for a, b in xs[1:]:
            if a <= hi:
                hi = max(hi, b)
            else:
                ranges.append([dt, di, lo, hi])
                lo, hi = a, b
        ranges.append([dt, di, lo, hi])
    return {"ranges": ranges, "tensors": len(seen), "skipped": skipped}


@dataclass
class FinalState:
    """Merged byte ranges per device, for overlap queries."""

    starts: dict
    ends: dict
    tensors: int = 0

    @classmethod
    def from_meta(cls, meta) -> "FinalState | None":
        """The final state a trace's META holds; None where it holds none or a
        malformed one (then nothing is known, and nothing is called freed)."""
        fs = meta.get("final_state") if isinstance(meta, dict) else None
        if not isinstance(fs, dict) or not isinstance(fs.get("ranges"), list):
            return None
        spans: dict[tuple, list] = {}
        for r in fs["ranges"]:
            if not (isinstance(r, list) and len(r) == 4 and isinstance(r[0], str)
                    and all(isinstance(v, int) and not isinstance(v, bool) for v in r[1:]) and r[2] <= r[3]):
                return None
            dev = (r[0], -1 if r[0] == "cpu" else r[1])
            spans.setdefault(dev, []).append((r[2], r[3]))
        starts, ends = {}, {}
        for dev, xs in spans.items():
            xs.sort()
            if any(xs[i][1] > xs[i + 1][0] for i in range(len(xs) - 1)):
                return None  # not merged: not what kdebug writes
            starts[dev] = [a for a, _ in xs]
            ends[dev] = [b for _, b in xs]
        tensors = fs.get("tensors")
        return cls(starts, ends, tensors if isinstance(tensors, int) else 0)

    def holds(self, device: tuple, lo: int, hi: int) -> bool:
        """Whether any byte of [lo, hi) on ``device`` lies in a kept storage."""
        dev = (device[0], -1 if device[0] == "cpu" else device[1])
        ends = self.ends.get(dev)
        if not ends or hi <= lo:
            return False
        i = bisect.bisect_right(ends, lo)
        return i < len(ends) and self.starts[dev][i] < hi
