"""A compiled DDP training step on gloo, started by torch's launcher (kdebug
record --nproc N).  Every rank trains on the same batch, so every step is a
replica.  KD_FAULT=kernel:R plants a rank-local fault in rank R's first
compiled C++ kernel (the fused bias + relu); KD_FAULT=collective:R perturbs rank R's all-reduce
output; KD_FAULT=param:R changes rank R's a.weight after the last optimizer
step; KD_DATA=per-rank gives each rank its own batch;
KD_MARKS=0 leaves out the kdebug.replicated marks of the parameters after
each step (the final DDP parameters are compared without them);
KD_FAULT_FROM_SECOND_RUN=PATH plants the fault only when PATH exists (the
faulty rank's first run creates it): a run-to-run difference for kdebug hunt;
KD_FAULT_VALUE=random makes the planted kernel fault another value in every
process (a difference that recurs in every re-run: kdebug hunt --confirm);
KD_FAULT_UNLESS_DETERMINISTIC=1 plants it only while
torch.are_deterministic_algorithms_enabled() is False (a fault that kdebug hunt
--try-fixes's deterministic_algorithms fix removes, when it is applied in every
rank); KD_FORM=inner
compiles the module inside DDP (DDP(torch.compile(model))) instead of the
DDP module (torch.compile(DDP(model)), the default).

The model is a module class of this script, not an nn.Sequential of torch.nn
layers: torch.compile(DDP(model)) graph-breaks in DDP's forward (its logger,
and _inside_ddp_forward, which dynamo skips), and a frame whose code is in
torch.nn (Sequential.forward, Linear.forward) is on dynamo's skip list when
it starts a frame, so a model made only of torch.nn layers is not compiled
at all that way: it runs eagerly, with or without kdebug (dynamo's counters
show no graph).  kdebug's runner says so when it sees it."""
import os
import random

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import kdebug
from kdebug import testing

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(16, 32)
        self.b = torch.nn.Linear(32, 8)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


model = Net()
if os.environ.get("KD_FORM") == "inner":
    fwd = DDP(torch.compile(model))
else:
    fwd = torch.compile(DDP(model))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
g = torch.Generator().manual_seed(1 + (rank if os.environ.get("KD_DATA") == "per-rank" else 0))
x = torch.randn(4, 16, generator=g)
fault = os.environ.get("KD_FAULT", "")
kind, _, who = fault.partition(":")
mark = os.environ.get("KD_FAULT_FROM_SECOND_RUN")
if kind and mark and int(who) == rank and not os.path.exists(mark):
    open(mark, "w").close()  # the first run of this job leaves the mark and plants nothing
    kind = ""
if os.environ.get("KD_FAULT_UNLESS_DETERMINISTIC") == "1" and torch.are_deterministic_algorithms_enabled():
    kind = ""
for step in range(2):
    if kind == "kernel" and int(who) == rank and step == 1:
        value = random.SystemRandom().uniform(0.25, 0.75) if os.environ.get("KD_FAULT_VALUE") == "random" else 0.5
        ctx = testing.perturb_kernel_output("cpp_fused_relu", "in_out_ptr0", value=value)
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
    if kind == "param" and int(who) == rank and step == 1:
        with torch.no_grad():
            model.a.weight.view(-1)[0] += 0.5
    if os.environ.get("KD_MARKS") != "0":  # KD_MARKS=0: only what kdebug compares by itself
        for name, p in model.named_parameters():
            kdebug.replicated(p, f"step {step} {name}")
dist.destroy_process_group()
