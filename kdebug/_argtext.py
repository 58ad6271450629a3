"""Stable text for op arguments whose str() / repr() is not a value.

Upstream DebugMode renders every non-tensor argument with str() / repr().
For most of them (ints, floats, dtypes, devices, ...) that text is the value.
For some it is not: a torch.Generator has no repr of its own, so it renders as
``<torch._C.Generator object at 0x7f...>``, and so does any object with the
default repr (functions: ``<function f at 0x...>``).  Such a text differs in
every run, and kdebug compares op records by their text (the SHAPE digest of
an aten op is its text up to the output, csrc/core/kd_trace_digest.c): every op
taking a Generator would be reported as a structural difference.

Note [Stable argument text]
Arguments are rendered as upstream renders them, except:

- a torch.Generator by its value: ``Generator(device='cpu', seed=0,
  state=<16 hex digits>)`` (a CPU generator: kdebug's bitwise hash of its
  get_state()), or ``..., offset=N)`` where the generator has an offset (the
  Philox generators of CUDA and other devices).  The text is made before the
  op runs: the state the op starts from.  Two runs whose generators are in
  different states are told apart, as they should be;
- any other leaf whose str() / repr() holds an address (0x followed by five
  or more hex digits: no user-space pointer is shorter): `` at 0x...`` is cut
  out (``<torch._C.Foo object>``, ``<function f>``); if an address is still
  left, the leaf shows as its type name only (``<module.Type>``);
- a called object whose upstream name holds an address (record_torchfunction
  records of property getters) gets a stable name (``stable_op``);
- a storage (``aten::set_.source_Storage``: how torch.load, DataLoader
  workers and pickled tensors rebuild a tensor) by its type, size and device,
  ``UntypedStorage(nbytes=8192, device=cpu)``: its str() lists every byte on a
  line of its own, which made a trace of a script loading an 8 MB checkpoint
  run out of memory, and kept two runs that rebuilt the same batches in
  another order from aligning (its contents show in the hash of the tensor
  the op returns).

Both the C formatter (csrc/kd_fmt.c calls ``leaf_text`` for leaves it does
not know) and records made through upstream's Python code
(``DebugMode._record_call`` / ``_record_call_output`` in mode.py call
``stable_tree``) use these two functions, so both give the same text.
"""
from __future__ import annotations

import re
from typing import Any

import torch

from . import _C
from ._upstream import tree_is_leaf, tree_map

_ADDRESS = re.compile(r"0x[0-9a-fA-F]{5,}")
_AT_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]{5,}")


def _type_name(x: Any) -> str:
    t = type(x)
    mod = getattr(t, "__module__", None)
    return t.__qualname__ if mod in (None, "builtins") else f"{mod}.{t.__qualname__}"


def generator_text(g: torch.Generator) -> str:
    """``Generator(device='cpu', seed=0, state=...)``: the generator's value now."""
    parts = [f"device='{g.device}'"]
    try:
        parts.append(f"seed={g.initial_seed()}")
    except RuntimeError:
        pass
    try:
        parts.append(f"offset={g.get_offset()}")
    except RuntimeError:  # the CPU's Mersenne Twister has no offset: its whole state
        try:
            state = g.get_state()
            parts.append(f"state={_C.hash(state, _C.HASH_BITWISE).bitwise & 0xFFFFFFFFFFFFFFFF:016x}")
        except RuntimeError:
            pass
    return "Generator(" + ", ".join(parts) + ")"


def storage_text(x: Any) -> str:
    """``UntypedStorage(nbytes=N, device=cpu)`` (a TypedStorage also says its
    dtype): a storage by its size, never its bytes."""
    if isinstance(x, torch.TypedStorage):
        return f"TypedStorage(dtype={x.dtype}, size={x.size()}, device={x.device})"
    return f"{type(x).__name__}(nbytes={x.nbytes()}, device={x.device})"


def _is_storage(x: Any) -> bool:
    return isinstance(x, (torch.UntypedStorage, torch.TypedStorage))


def _scrub(s: str, x: Any) -> str:
    """s with its addresses cut out, or the type name when that is not enough."""
    s = _AT_ADDRESS.sub("", s)
    return f"<{_type_name(x)}>" if _ADDRESS.search(s) else s


def _is_special(x: Any) -> bool:
    """Leaves upstream renders itself (tensors, DTensorSpec) and pytree nodes."""
    return isinstance(x, torch.Tensor) or type(x).__name__ == "DTensorSpec" or not tree_is_leaf(x)


def leaf_text(x: Any, top: bool) -> Any:
    """The text of a leaf the C formatter does not know (str() at the top
    level, repr() inside a container, as upstream), when it differs from
    upstream's (Note [Stable argument text]); NotImplemented when upstream's
    own rendering is to be used."""
    if isinstance(x, torch.Generator):
        return generator_text(x)
    if _is_storage(x):
        return storage_text(x)
    if _is_special(x):
        return NotImplemented
    s = str(x) if top else repr(x)
    return _scrub(s, x) if _ADDRESS.search(s) else NotImplemented


class _Shown:
    """A leaf standing in for an argument in upstream's rendering: its str()
    and repr() are the stable texts."""

    __slots__ = ("_str", "_repr")

    def __init__(self, s: str, r: str):
        self._str, self._repr = s, r

    def __str__(self) -> str:
        return self._str

    def __repr__(self) -> str:
        return self._repr


# leaves whose str() / repr() is their value (the C formatter's own leaf types)
PLAIN = {int, float, bool, complex, str, type(None), type(...), torch.dtype, torch.device, torch.layout,
          torch.memory_format, torch.SymInt, torch.SymFloat, torch.SymBool}


def _stable_leaf(x: Any) -> Any:
    if type(x) in PLAIN:
        return x
    if isinstance(x, torch.Generator):
        t = generator_text(x)
        return _Shown(t, t)
    if _is_storage(x):
        t = storage_text(x)
        return _Shown(t, t)
    if _is_special(x):
        return x
    s, r = str(x), repr(x)
    if _ADDRESS.search(s) or _ADDRESS.search(r):
        return _Shown(_scrub(s, x), _scrub(r, x))
    return x


class _StableOp:
    """Stands for a called object in a record (``call.op``) whose name holds an
    address: str() is the stable name; the object is ``__wrapped__``."""

    __slots__ = ("__wrapped__", "_text")

    def __init__(self, fn: Any, text: str):
        self.__wrapped__, self._text = fn, text

    def __call__(self, *args, **kwargs):
        return self.__wrapped__(*args, **kwargs)

    def __str__(self) -> str:
        return self._text

    __repr__ = __str__


def stable_op(op: Any, name: str) -> Any:
    """op itself when upstream's name for it holds no address, else a
    _StableOp: a property getter recorded by record_torchfunction=True is
    ``<method-wrapper '__get__' of getset_descriptor object at 0x...>``, shown
    as ``<method-wrapper '__get__' of getset_descriptor 'TensorBase.shape'>``."""
    if not _ADDRESS.search(name):
        return op
    owner = getattr(op, "__self__", None)
    cls, attr = getattr(owner, "__objclass__", None), getattr(owner, "__name__", None)
    if isinstance(cls, type) and isinstance(attr, str):
        text = (f"<{type(op).__name__} '{getattr(op, '__name__', '?')}' of {type(owner).__name__} "
                f"'{cls.__qualname__}.{attr}'>")
    else:
        text = _scrub(name, op)
    return _StableOp(op, text)


def _stable_keys(tree: Any, depth: int = 0) -> Any:
    """tree with the keys of its exact dicts made stable (as kd_fmt.c's
    key_text does); tree itself when none needed it."""
    if depth > 32:
        return tree
    if type(tree) in (list, tuple):
        items = [_stable_keys(x, depth + 1) for x in tree]
        return tree if all(a is b for a, b in zip(items, tree)) else type(tree)(items)
    if type(tree) is dict:
        out, same = {}, True
        for k, v in tree.items():
            k2 = _stable_leaf(k)
            v2 = _stable_keys(v, depth + 1)
            same = same and k2 is k and v2 is v
            out[k2] = v2
        return tree if same else out
    return tree


def _maybe_unstable(x: Any, depth: int = 0) -> bool:
    """False when every leaf of x is a tensor or a PLAIN value (nearly every
    op): a quick look before stable_tree's pytree walk."""
    t = type(x)
    if t in PLAIN or isinstance(x, torch.Tensor):
        return False
    if depth > 32:
        return True
    if t is list or t is tuple:
        for y in x:
            if type(y) not in PLAIN and _maybe_unstable(y, depth + 1):
                return True
        return False
    if t is dict:
        for k, v in x.items():
            if type(k) not in PLAIN or (type(v) not in PLAIN and _maybe_unstable(v, depth + 1)):
                return True
        return False
    return True


def stable_tree(tree: Any) -> tuple[Any, bool]:
    """(tree with every leaf, and every exact dict's key, whose text is not
    stable replaced by a _Shown; whether any was)."""
    if not _maybe_unstable(tree):
        return tree, False
    changed = False

    def leaf(x):
        nonlocal changed
        y = _stable_leaf(x)
        if y is not x:
            changed = True
        return y

    keyed = _stable_keys(tree)
    out = tree_map(leaf, keyed)
    changed = changed or keyed is not tree
    return (out if changed else tree), changed
