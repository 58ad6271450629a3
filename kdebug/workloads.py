"""Built-in workloads: what ``kdebug demo`` and the benchmarks run."""
from __future__ import annotations

import torch
from torch import nn

from ._upstream import TorchDispatchMode


class TinyBlock(nn.Module):
    """A pre-norm transformer block: layer norms, attention (softmax), GELU MLP.
    Small enough to compile in seconds on a CPU; every kind of Inductor kernel
    (pointwise, reduction, persistent reduction) shows up."""

    def __init__(self, d: int = 64, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).chunk(3, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-1, -2)) * (d // self.heads) ** -0.5
        att = att.masked_fill(torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1), float("-inf"))
        y = (att.softmax(-1) @ v).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(y)
        return x + self.fc2(nn.functional.gelu(self.fc1(self.ln2(x))))


class Transformer(nn.Module):
    """``n`` pre-norm blocks (the GPU benchmark workload: d=512, 8 heads, 4 blocks)."""

    def __init__(self, n: int = 4, d: int = 512, heads: int = 8) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(TinyBlock(d, heads) for _ in range(n))
        self.ln = nn.LayerNorm(d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x)
        return self.ln(x)


def train_step_fn(model: nn.Module):
    """A compiled forward + backward step returning the loss.  Static shapes
    (dynamic=False): Dynamo's cache is per code object, shared by every
    instance of the model's class, so a second instance of another size in the
    same process would otherwise recompile both with dynamic shapes, and which
    kernels a step launches would depend on what ran before it."""
    compiled = torch.compile(model, dynamic=False)

    def step(x: torch.Tensor) -> torch.Tensor:
        model.zero_grad(set_to_none=True)
        loss = compiled(x).float().pow(2).mean()
        loss.backward()
        return loss

    return step


# The benchmark step's size per device: (blocks, d, heads, (batch, tokens)).
STEP_SIZES = {"cuda": (4, 512, 8, (8, 256)), "cpu": (2, 128, 4, (4, 64))}


def _benchmark_model(device: str):
    """(model, x): the benchmark step's Transformer of STEP_SIZES[device] and
    its input, from seed 0."""
    blocks, d, heads, shape = STEP_SIZES[device]
    torch.manual_seed(0)
    return Transformer(blocks, d, heads).to(device), torch.randn(*shape, d, device=device)


def _warm(step, x: torch.Tensor, warmup: int) -> None:
    for _ in range(warmup):
        step(x)
    if x.device.type == "cuda":
        torch.cuda.synchronize()


def transformer_step(device: str = "cuda", warmup: int = 5):
    """(step, x): the step the benchmarks and profiling tools measure, a
    compiled Transformer forward + backward of STEP_SIZES[device] (on CUDA
    Transformer(4, 512, 8) on an (8, 256, 512) input), run ``warmup`` times
    and synchronized."""
    model, x = _benchmark_model(device)
    step = train_step_fn(model)
    _warm(step, x, warmup)
    return step, x


def adamw_step(device: str = "cuda", warmup: int = 5):
    """(step, x, model, opt): transformer_step's forward + backward followed
    by an eager AdamW step (lr 1e-4), the flight recorder's benchmark step
    (a FlightRecorder attaches to ``opt``), run ``warmup`` times and
    synchronized."""
    model, x = _benchmark_model(device)
    fwd_bwd = train_step_fn(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step(x: torch.Tensor) -> torch.Tensor:
        loss = fwd_bwd(x)
        opt.step()
        return loss

    _warm(step, x, warmup)
    return step, x, model, opt


class NullDispatchMode(TorchDispatchMode):
    """A dispatch mode that only runs each op: the price of any Python
    TorchDispatchMode, which the profiling tools compare against.  Like
    DebugMode it sets ignore_compile_internals: without it dynamo skips
    compiled frames while the mode is on the stack, and they run eagerly."""

    @classmethod
    def ignore_compile_internals(cls):
        return True

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


RECORDING_MODES = ("untraced", "dm", "hash", "hash_in", "record")


def recorded_step(step, x: torch.Tensor, mode: str):
    """One GPU step under a recording mode named as in RECORDING_MODES
    (no DebugMode, DebugMode(), + log_tensor_hashes(), + hash_inputs=True,
    + record_outputs()), synchronized; returns the DebugMode (None untraced).
    What the profiling tools run."""
    import contextlib

    from .mode import DebugMode as K

    inner = {"dm": contextlib.nullcontext, "hash": K.log_tensor_hashes,
             "hash_in": lambda: K.log_tensor_hashes(hash_inputs=True), "record": K.record_outputs}
    dm = None
    if mode == "untraced":
        step(x)
    else:
        with K() as dm, inner[mode]():
            step(x)
    torch.cuda.synchronize()
    return dm


class BucketedBlock(nn.Module):
    """The built-in hunt workload: many token features summed into a few
    buckets (``index_add``), then a TinyBlock.  Inductor's C++ kernel for the
    ``index_add`` accumulates with atomic adds across OpenMP threads, so the
    bucket sums, and everything computed from them, change from run to run in
    their last bits on any machine with two or more cores; the Triton kernel on
    a GPU does the same with ``tl.atomic_add``."""

    def __init__(self, d: int = 64, buckets: int = 16) -> None:
        super().__init__()
        self.buckets = buckets
        self.inp = nn.Linear(d, d)
        self.block = TinyBlock(d, heads=4)

    def forward(self, feats: torch.Tensor, bucket: torch.Tensor) -> torch.Tensor:
        pooled = torch.zeros(self.buckets, feats.shape[1], device=feats.device, dtype=feats.dtype)
        pooled = pooled.index_add(0, bucket, feats)          # non-deterministic accumulation order
        x = self.inp(pooled / feats.shape[0]).unsqueeze(0)    # (1, buckets, d)
        return self.block(x)


def hunt_main():
    """What ``kdebug hunt`` runs when given no script: one compiled forward +
    backward step of BucketedBlock on the CPU (or CUDA with --device cuda)."""
    import argparse

    p = argparse.ArgumentParser(prog="kdebug built-in workload")
    p.add_argument("--device", default="cpu")
    p.add_argument("--tokens", type=int, default=1 << 18)
    a = p.parse_args(__import__("sys").argv[1:])
    torch.manual_seed(0)
    model = BucketedBlock().to(a.device)
    feats = torch.randn(a.tokens, 64, device=a.device)
    bucket = torch.randint(0, model.buckets, (a.tokens,), device=a.device)
    compiled = torch.compile(model)
    model.zero_grad(set_to_none=True)
    loss = compiled(feats, bucket).pow(2).mean()
    loss.backward()
    print(f"built-in workload: loss {loss.item():.6f}")
    return model, loss.detach()  # its final tensors: the gradients (Note [Final state])
