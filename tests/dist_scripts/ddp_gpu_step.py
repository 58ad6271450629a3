"""A compiled DDP training step of a small bf16 transformer on NCCL, one GPU a
rank, started by torch's launcher (kdebug hunt / record --nproc N on a machine
with N GPUs; tests/test_gpu_ranks.py).  Every rank trains on the same batch, so
every step is a replica.

Knobs (environment), as in ddp_step.py, its gloo / CPU sibling:
  KD_FAULT=kernel:R   rank R perturbs, in step 1, the first launch of the Triton
                      kernel whose name contains KD_FAULT_KERNEL (default
                      "gelu": the forward MLP's activation): its first written
                      argument's first element (kdebug.testing.perturb_kernel_output)
  KD_FAULT_FROM_SECOND_RUN=PATH   plant it only when PATH exists (the faulty
                      rank's first run creates it): a run-to-run difference
  KD_FAULT_VALUE=random           another amount in every process
  KD_ATTN=sdpa|math   attention through F.scaled_dot_product_attention (flash
                      attention on the H200, whose backward accumulates with
                      atomic adds unless deterministic algorithms are on) or
                      written out (matmul, softmax: every kernel deterministic);
                      default sdpa
  KD_INPUT=tokens|features   token ids (16 distinct ones) through an nn.Embedding (whose backward
                      Inductor fuses into a kernel that accumulates with atomic
                      adds: intrinsically non-deterministic) or float features
                      through a Linear (default features)
  KD_STEPS            training steps (default 3)
  KD_PIN_CONFIGS=1    no autotuning by timing: torch._inductor.config.deterministic
                      where this torch has it (2.12+), else (torch 2.11) one config
                      per reduction (test_configs.force_filter_reduction_configs)
                      and per pointwise kernel (triton.autotune_pointwise = False).
                      Without it each rank, and each run (kdebug hunt compiles
                      every run from scratch), times its own candidates and may
                      pick another block size: a real difference of numerics
                      for a reduction (seen on 2 H200s, torch 2.11: a softmax
                      backward at XBLOCK=1 on one rank, 8 on the other)
  KD_DEVICE=cpu       the same job on CPU over gloo (default cuda: NCCL)

The model is a module class of this script (torch.compile(DDP(model)) does not
compile a frame whose code is in torch.nn; see ddp_step.py)."""
import contextlib
import os
import random

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import kdebug
from kdebug import testing

local = int(os.environ.get("LOCAL_RANK", "0"))
if os.environ.get("KD_DEVICE", "cuda") == "cuda":
    dev = torch.device("cuda", local)
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", device_id=dev)
else:  # KD_DEVICE=cpu: the same job on gloo (a dry run of the GPU tests' logic on a CPU machine)
    dev = torch.device("cpu")
    dist.init_process_group("gloo")
rank = dist.get_rank()
if os.environ.get("KD_PIN_CONFIGS") == "1":
    from kdebug import _upstream

    _upstream.pin_autotuning()
torch.manual_seed(0)
ATTN = os.environ.get("KD_ATTN", "sdpa")
TOKENS = os.environ.get("KD_INPUT", "features") == "tokens"


class Block(torch.nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.qkv, self.proj = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
        self.fc1, self.fc2 = torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).chunk(3, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        if ATTN == "sdpa":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-1, -2)) * (d // self.heads) ** -0.5
            att = att.masked_fill(torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1), float("-inf"))
            y = att.softmax(-1) @ v
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class Net(torch.nn.Module):
    def __init__(self, d: int = 256, heads: int = 4, n: int = 2, vocab: int = 512):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, d) if TOKENS else torch.nn.Linear(d, d)
        self.blocks = torch.nn.ModuleList(Block(d, heads) for _ in range(n))
        self.ln = torch.nn.LayerNorm(d)
        self.head = torch.nn.Linear(d, vocab)

    def forward(self, idx, target):
        x = self.emb(idx)
        for b in self.blocks:
            x = b(x)
        logits = self.head(self.ln(x))
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), target.view(-1))


model = Net().to(dev, torch.bfloat16)
fwd = torch.compile(DDP(model, device_ids=[local] if dev.type == "cuda" else None))
opt = torch.optim.SGD(model.parameters(), lr=0.1, foreach=True)  # CUDA's default path, on CPU too
g = torch.Generator(dev).manual_seed(1)
# 512 token ids of 16 distinct values: each embedding row's gradient sums 32 rows, whose atomic adds
# land in an order that varies (with ids spread over the 512-word vocabulary, most rows got one
# contribution and the runs on one H200 summed alike; 2 H200s still differed from each other)
idx = torch.randint(0, 16, (4, 128), device=dev, generator=g) if TOKENS else \
    torch.randn(4, 128, 256, device=dev, generator=g, dtype=torch.bfloat16)
target = torch.randint(0, 512, (4, 128), device=dev, generator=g)
fault = os.environ.get("KD_FAULT", "")
kind, _, who = fault.partition(":")
mark = os.environ.get("KD_FAULT_FROM_SECOND_RUN")
if kind and mark and int(who) == rank and not os.path.exists(mark):
    open(mark, "w").close()  # the first run of this job leaves the mark and plants nothing
    kind = ""
for step in range(int(os.environ.get("KD_STEPS", "3"))):
    ctx = contextlib.nullcontext()
    if kind == "kernel" and int(who) == rank and step == 1:
        value = random.SystemRandom().uniform(0.25, 0.75) if os.environ.get("KD_FAULT_VALUE") == "random" else 0.5
        ctx = testing.perturb_kernel_output(os.environ.get("KD_FAULT_KERNEL", "gelu"), None, value=value)
    with ctx as hit:
        loss = fwd(idx, target)
        loss.backward()
    if hit is not None and hit["hits"] != 1:
        raise SystemExit(f"ddp_gpu_step: the planted fault hit {hit['hits']} launches, not 1")
    opt.step()
    opt.zero_grad()
    for name, p in model.named_parameters():
        kdebug.replicated(p, f"step {step} {name}")
dist.destroy_process_group()
