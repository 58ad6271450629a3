"""The records Python hands to the C extension (Note [Typed boundaries] in
csrc/kd_types.c).

Each is a NamedTuple built by field name; importing this module registers them
with ``_C._register_types``, which checks every field name against the index
the C code reads it by, so the two sides cannot drift apart.  The records C
hands back are struct sequences defined in csrc/kd_types.c (``_C.TensorArg``,
``_C.TraceOp``, ...).
"""
from __future__ import annotations

import enum
from typing import Any, Callable, NamedTuple

from . import _C


class OpInfo(NamedTuple):
    """What the aten-op fast path (kd_dispatch.c) needs to know of an op, once
    per op (mode._op_info makes it; kd_op_writes.h: KD_OPI_*)."""

    special: bool                     # profiler contexts and annotations: always upstream's own code
    hash_skipped: bool                # upstream's hash hooks skip it
    makes_empty: bool                 # its output holds whatever memory it got (Note [Fresh buffers])
    writes: bool                      # it may write an argument
    written_pos: tuple[int, ...] | None   # positions of written arguments; None: unknown (no schema)
    written_names: tuple[str, ...] | None  # names of written arguments; None: unknown
    out_names: tuple[str, ...]        # out= argument names
    callable: Callable[..., Any]      # what runs the op
    view: bool                        # its output is a view of an argument: it reads no value (Note [Fresh buffers])


class HashHook(NamedTuple):
    """The dispatch hook entry of log_tensor_hashes() with a built-in hash
    (kd_types.h: KD_HH_*): the fast path hashes aten ops itself."""

    spec: Any                         # kdebug.hashing's spec
    hash_inputs: bool
    spec_id: int
    kinds: int                        # _C.HASH_* bits
    value_fn: Callable[..., Any]      # HashValues -> the value a hash dict holds


class HookKind(enum.Enum):
    """The other dispatch hook entries kdebug installs through upstream."""

    RECORD = "record"                 # record_outputs(): the fast path clones outputs itself
    CUSTOM = "custom"                 # a callable hash_fn: upstream's hooks must run


class TritonLaunch(NamedTuple):
    """What the Triton launch finisher (inductor.triton_finish) tells the run
    hook of a launcher's first recorded launch (kd_types.h: KD_TL_*)."""

    grid_x: int
    grid_y: int
    grid_z: int
    config_id: int                    # interned text of the chosen config
    num_warps: int
    num_stages: int
    shared_mem: int


_C._register_types(op_info=OpInfo, hash_hook=HashHook, record_hook=HookKind.RECORD, triton_launch=TritonLaunch)
