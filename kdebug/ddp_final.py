"""The parameters of a DDP job's replicas, compared across ranks with no
code change.

Note [DDP final parameters]
DistributedDataParallel keeps every rank's parameters equal: the same
initial values (broadcast from rank 0 at construction), the same averaged
gradients, the same optimizer step.  So when a recording of a rank ends, the
parameters of every DDP module the program still holds must be the same on
every rank; where one differs, a replica diverged somewhere in the job.  At
the end of a recording made as a rank of a job (Note [Ranks]) kdebug finds
the live DDP modules on the heap and records a replica mark (Note
[Cross-rank comparison]) for each parameter, named ``final DDP{k}
parameter NAME``.  ``kdebug diff --ranks`` then reports a differing one with
the first root (rank-local kernel, disagreeing collective) before it.
Buffers are not compared: DDP broadcasts rank 0's at the start of each
forward (``broadcast_buffers=True``), and a forward in training mode then
updates them from each rank's own batch (BatchNorm's running statistics),
so at the end they differ on a clean job (they were marked at first: every
DDP model with BatchNorm was reported as diverging; found by a trust pass).

The modules are numbered in a rank-independent order (by their parameter
names and shapes, then their order on the heap), so the marks of two ranks
align.  A module the program no longer held at the end (a ``main()`` that
returned) is not seen: kdebug record and kdebug hunt hold the script's
globals until the recording has ended, so a module in a global is.  Only the
end state is compared this way; a per-step comparison needs
``kdebug.replicated(p, name)`` after the optimizer step.  Parameters DDP
ignores (``_ddp_params_and_buffers_to_ignore``) are left out.
"""
from __future__ import annotations

import gc
import sys

import torch


def live_ddp_modules() -> list:
    """Every DistributedDataParallel the Python heap still reaches, in a
    rank-independent order; [] when torch.nn.parallel was never imported."""
    mod = sys.modules.get("torch.nn.parallel.distributed")
    ddp_type = getattr(mod, "DistributedDataParallel", None)
    if ddp_type is None:
        return []
    found = [o for o in gc.get_objects() if issubclass(type(o), ddp_type)]

    def key(m):
        return [(n, tuple(p.shape)) for n, p in m.module.named_parameters()]

    return [m for _, m in sorted(enumerate(found), key=lambda im: (key(im[1]), im[0]))]


def mark_final_parameters(dm) -> int:
    """Records a replica mark for each parameter of every live DDP module
    into kdebug DebugMode ``dm`` (Note [DDP final parameters]); returns how
    many."""
    from . import hashing
    from .crossrank import mark

    spec = hashing.parse("bitwise")[1]
    n = 0
    for k, m in enumerate(live_ddp_modules()):
        ignored = set(getattr(m, "parameters_to_ignore", ()) or ())
        items = [("parameter", name, p) for name, p in m.module.named_parameters() if name not in ignored]
        for what, name, t in items:
            if isinstance(t, torch.Tensor) and not t.is_meta:
                mark(dm, t, f"final DDP{k} {what} {name}", spec)
                n += 1
    return n
