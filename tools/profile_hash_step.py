"""Where a recorded step with hashes / outputs spends its time (GPU machine)."""
import cProfile
import pstats
import sys

import torch

import kdebug
from kdebug.workloads import Transformer, train_step_fn

torch.manual_seed(0)
model = Transformer(4, 512, 8).cuda()
x = torch.randn(8, 256, 512, device="cuda")
step = train_step_fn(model)
for _ in range(5):
    step(x)
torch.cuda.synchronize()
which = sys.argv[1] if len(sys.argv) > 1 else "hash"
ctx = {"hash": lambda: kdebug.DebugMode.log_tensor_hashes(),
       "record": lambda: kdebug.DebugMode.record_outputs(),
       "none": None}[which]


def one():
    with kdebug.DebugMode() as dm:
        if ctx is None:
            step(x)
        else:
            with ctx():
                step(x)
    torch.cuda.synchronize()
    return dm


one()
from torch.profiler import ProfilerActivity, profile

with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
    one()
ka = prof.key_averages()
print(ka.table(sort_by="self_cpu_time_total", row_limit=18, max_name_column_width=60))
print(ka.table(sort_by="self_device_time_total", row_limit=8, max_name_column_width=60))
pr = cProfile.Profile()
pr.enable()
for _ in range(5):
    one()
pr.disable()
pstats.Stats(pr).sort_stats("tottime").print_stats(22)
