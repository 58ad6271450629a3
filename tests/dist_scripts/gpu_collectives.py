"""A 1-rank NCCL group under kdebug's DebugMode with hashes (tests/test_gpu_ranks.py
runs it in a subprocess, with a timeout): an eager all_reduce with
async_op=True and wait, and a compiled function with a functional all_reduce
+ wait_tensor, recorded under torch.cuda.set_sync_debug_mode("error").
Under torch's launcher (WORLD_SIZE set) each rank runs it on its own GPU.
Prints one JSON line: the collective records' output hashes, the hashes of
the results taken after a synchronize, their input hashes, the output hash
of the mul.out that wrote the all-reduced tensor just before, kdebug's stats."""
import json
import os

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

import kdebug
from kdebug import collectives, hashing

if "WORLD_SIZE" in os.environ:  # started by torch's launcher: one rank a GPU
    dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", device_id=dev)
else:
    dev = torch.device("cuda", 0)
    dist.init_process_group("nccl", rank=0, world_size=1, store=dist.HashStore(), device_id=dev)
x = torch.arange(1 << 20, device=dev, dtype=torch.float32) / 7
y = torch.randn(1 << 16, device=dev, generator=torch.Generator(dev).manual_seed(0))
# premul_sum scales by 2 on a 1-rank group: the output differs from the input,
# so a hash taken before the collective completed would not match
make = getattr(dist, "_make_nccl_premul_sum", None) or getattr(torch._C._distributed_c10d,
                                                               "_make_nccl_premul_sum", None)
op = make(2.0) if make is not None else dist.ReduceOp.SUM


@torch.compile
def f(t):
    w = funcol.wait_tensor(funcol.all_reduce(t * 3, "sum", dist.group.WORLD))
    return w, w + 1


f(y)  # compile outside the recording
torch.cuda.synchronize()
spec = hashing.parse("bitwise")[1]
syncs_error = None
with kdebug.DebugMode() as dm, kdebug.DebugMode.log_tensor_hashes(["bitwise"], hash_inputs=True):
    torch.cuda.set_sync_debug_mode("error")
    try:
        # an op's output hash waits in kdebug's queue (Note [Deferred GPU work]) when the
        # collective writes the same memory in place (as DDP's reducer fills a bucket view
        # with mul.out, then all-reduces the bucket): the queue must go first
        a = torch.empty_like(x)
        torch.mul(x, 1.0, out=a)
        work = dist.all_reduce(a, op=op, async_op=True)
        work.wait()
        out, _ = f(y)
    except RuntimeError as e:  # a synchronizing call raised under set_sync_debug_mode("error")
        syncs_error = str(e)
    finally:
        torch.cuda.set_sync_debug_mode(0)
torch.cuda.synchronize()  # kdebug's explicit reads come after this


def value(h):
    if isinstance(h, hashing.Pending):
        return h.value()
    if isinstance(h, (list, tuple)):
        return [value(v) for v in h]
    return h


def flat(h):
    while isinstance(h, (list, tuple)) and len(h) == 1:
        h = h[0]
    return h


recs = {}
queued = [str(flat(value(c.log.get("hash")))) for c in dm.operators if str(getattr(c, "op", "")) == "aten.mul.out"]
for c in dm.operators:
    if isinstance(c, collectives.CollectiveCall):
        recs.setdefault(c.op._schema.name, []).append(
            {"post": str(flat(value(c.log.get("hash")))), "pre": str(flat(value(c.log.get("input_hash", ((None,),))[0][0]))),
             "error": c.error, "done": c.done.is_set()})
print("KDJSON " + json.dumps({
    "syncs_error": syncs_error, "premul": make is not None,
    "eager_result": str(value(hashing.start_value(a, spec))) if syncs_error is None else None,
    "eager_input": str(value(hashing.start_value(x, spec))),
    "functional_result": str(value(hashing.start_value(out, spec))) if syncs_error is None else None,
    "records": recs, "queued": queued, "stats": collectives.stats(dm), "rank": dist.get_rank(), "world": dist.get_world_size()}))
dist.destroy_process_group()
