"""A compiled DDP training step on gloo, started by torch's launcher (kdebug
record --nproc N).  Every rank trains on the same batch, so every step is a
replica.  KD_FAULT=kernel:R plants a rank-local fault in rank R's first
compiled C++ kernel; KD_FAULT=collective:R perturbs rank R's all-reduce
output; KD_DATA=per-rank gives each rank its own batch."""
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import kdebug
from kdebug import testing

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8))
ddp = DDP(model)
opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
fwd = torch.compile(ddp)
g = torch.Generator().manual_seed(1 + (rank if os.environ.get("KD_DATA") == "per-rank" else 0))
x = torch.randn(4, 16, generator=g)
fault = os.environ.get("KD_FAULT", "")
kind, _, who = fault.partition(":")
for step in range(2):
    if kind == "kernel" and int(who) == rank and step == 1:
        ctx = testing.perturb_kernel_output("cpp_fused", "out_ptr0", value=0.5)
    elif kind == "collective" and int(who) == rank and step == 1:
        ctx = testing.perturb_collective_output("c10d::allreduce_", value=0.5)
    else:
        import contextlib

        ctx = contextlib.nullcontext()
    with ctx:
        loss = fwd(x).square().mean()
        loss.backward()
    opt.step()
    opt.zero_grad()
    for name, p in model.named_parameters():
        kdebug.replicated(p, f"step {step} {name}")
dist.destroy_process_group()
