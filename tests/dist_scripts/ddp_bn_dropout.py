"""A clean data-parallel job as many are written: DDP(torch.compile(model))
with BatchNorm (DDP broadcasts its buffers, then each rank updates them from
its own batch) and dropout, each rank seeding its own generator after the
common initialisation (its own dropout masks and data), AdamW.  Its replicas
agree: kdebug diff --ranks must say so (it reported both the final BatchNorm
buffers and the ranks' dropout draws as divergences; found by a trust pass).
KD_FAULT=lr:R gives rank R's optimizer another learning rate for one step."""
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(16, 32)
        self.bn = torch.nn.BatchNorm1d(32)
        self.drop = torch.nn.Dropout(0.2)
        self.b = torch.nn.Linear(32, 4)

    def forward(self, x):
        return self.b(self.drop(torch.relu(self.bn(self.a(x)))))


model = Net()
ddp = DDP(torch.compile(model))
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
torch.manual_seed(1000 + rank)  # each rank its own data and dropout masks
fault = os.environ.get("KD_FAULT", "")
for step in range(4):
    if fault == f"lr:{rank}" and step == 2:
        opt.param_groups[0]["lr"] *= 1.5
    ddp(torch.randn(8, 16)).square().mean().backward()
    opt.step()
    opt.zero_grad()
    if fault == f"lr:{rank}" and step == 2:
        opt.param_groups[0]["lr"] /= 1.5
dist.destroy_process_group()
