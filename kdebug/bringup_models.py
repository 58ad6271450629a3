"""Three reference architectures for the bring-up benchmark suite
(benchmarks/bench_bringup.py), written from their papers with random
weights: nothing is downloaded.

- bert: a BERT encoder (Devlin et al. 2018): token + position + segment
  embeddings, post-LayerNorm transformer layers (multi-head self-attention,
  GELU feed-forward).  full: BERT-base (768 hidden, 12 layers, 12 heads,
  3072 intermediate, 30522 vocabulary; ~110M parameters), batch 8 x 128.
- resnet18: ResNet-18 (He et al. 2015): 7x7 stem, max-pool, four stages of
  two basic blocks (64/128/256/512 channels, batch norm), average pool,
  1000-way classifier; ~11.7M parameters at full width, batch 8 x 224^2.
- ssm: a Mamba-style selective state-space language model (Mamba-2's
  scalar-decay form, Dao & Gu 2024): per block RMSNorm, input projection
  to x and gate z, causal depthwise conv, SiLU, input-dependent dt/B/C,
  the selective scan as a masked decay matrix (exact for this form,
  vectorized: no Python loop over time), gated output projection.
  full: 768 wide, 12 blocks, state 64; ~40M parameters, batch 4 x 512.

small sizes keep each architecture (every layer kind, the block counts of
resnet18) and shrink widths and inputs so that a CPU compiles all three
in well under a minute.
"""
from __future__ import annotations

import dataclasses
import math

import torch
from torch import nn
from torch.nn import functional as F

SIZES = ("small", "full")


# ------------------------------------------------------------------- BERT


@dataclasses.dataclass(frozen=True)
class BertConfig:
    vocab: int
    hidden: int
    layers: int
    heads: int
    intermediate: int
    max_positions: int = 512
    segments: int = 2


class BertLayer(nn.Module):
    def __init__(self, c: BertConfig):
        super().__init__()
        self.heads = c.heads
        self.qkv = nn.Linear(c.hidden, 3 * c.hidden)
        self.attn_out = nn.Linear(c.hidden, c.hidden)
        self.ln1 = nn.LayerNorm(c.hidden, eps=1e-12)
        self.ff_in = nn.Linear(c.hidden, c.intermediate)
        self.ff_out = nn.Linear(c.intermediate, c.hidden)
        self.ln2 = nn.LayerNorm(c.hidden, eps=1e-12)

    def forward(self, x, mask_bias):
        b, s, h = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, h // self.heads).permute(2, 0, 3, 1, 4)
        scores = q @ k.transpose(-1, -2) / math.sqrt(h // self.heads) + mask_bias
        ctx = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, s, h)
        x = self.ln1(x + self.attn_out(ctx))
        return self.ln2(x + self.ff_out(F.gelu(self.ff_in(x))))


class BertEncoder(nn.Module):
    def __init__(self, c: BertConfig):
        super().__init__()
        self.word = nn.Embedding(c.vocab, c.hidden)
        self.position = nn.Embedding(c.max_positions, c.hidden)
        self.segment = nn.Embedding(c.segments, c.hidden)
        self.ln = nn.LayerNorm(c.hidden, eps=1e-12)
        self.layers = nn.ModuleList(BertLayer(c) for _ in range(c.layers))
        self.pool = nn.Linear(c.hidden, c.hidden)

    def forward(self, input_ids, attention_mask):
        s = input_ids.shape[1]
        pos = torch.arange(s, device=input_ids.device)
        x = self.ln(self.word(input_ids) + self.position(pos) + self.segment(torch.zeros_like(input_ids)))
        mask_bias = (1.0 - attention_mask[:, None, None, :].to(x.dtype)) * -1e4
        for layer in self.layers:
            x = layer(x, mask_bias)
        return x, torch.tanh(self.pool(x[:, 0]))


# --------------------------------------------------------------- ResNet-18


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + (x if self.down is None else self.down(x)))


class ResNet18(nn.Module):
    def __init__(self, width: int = 64, classes: int = 1000):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 7, 2, 3, bias=False), nn.BatchNorm2d(width), nn.ReLU(),
                                  nn.MaxPool2d(3, 2, 1))
        chans = [width, 2 * width, 4 * width, 8 * width]
        stages, cin = [], width
        for i, c in enumerate(chans):
            stages.append(nn.Sequential(BasicBlock(cin, c, 1 if i == 0 else 2), BasicBlock(c, c, 1)))
            cin = c
        self.stages = nn.Sequential(*stages)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x):
        x = self.stages(self.stem(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


# ---------------------------------------------------------- Mamba-style SSM


@dataclasses.dataclass(frozen=True)
class SSMConfig:
    vocab: int
    d_model: int
    layers: int
    d_state: int
    headdim: int
    expand: int = 2
    conv: int = 4


class RMSNorm(nn.Module):
    def __init__(self, d: int, eps: float = 1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class SSMBlock(nn.Module):
    def __init__(self, c: SSMConfig):
        super().__init__()
        inner = c.expand * c.d_model
        self.heads, self.headdim, self.d_state = inner // c.headdim, c.headdim, c.d_state
        self.norm = RMSNorm(c.d_model)
        self.in_proj = nn.Linear(c.d_model, 2 * inner, bias=False)
        self.conv = nn.Conv1d(inner, inner, c.conv, groups=inner, padding=c.conv - 1)
        self.bc_proj = nn.Linear(inner, 2 * c.d_state, bias=False)
        self.dt_proj = nn.Linear(inner, self.heads)
        self.A_log = nn.Parameter(torch.log(torch.linspace(1.0, 16.0, self.heads)))
        self.D = nn.Parameter(torch.ones(self.heads))
        self.out_proj = nn.Linear(inner, c.d_model, bias=False)

    def forward(self, u):
        b, L, _ = u.shape
        x, z = self.in_proj(self.norm(u)).chunk(2, dim=-1)
        x = F.silu(self.conv(x.transpose(1, 2))[..., :L].transpose(1, 2))
        B, C = self.bc_proj(x).chunk(2, dim=-1)                       # (b, L, N): shared by the heads
        dt = F.softplus(self.dt_proj(x))                               # (b, L, H)
        a = -torch.exp(self.A_log) * dt                                # log decay per step, (b, L, H)
        cum = torch.cumsum(a, dim=1).transpose(1, 2)                   # (b, H, L)
        seg = cum[..., :, None] - cum[..., None, :]                    # sum of a over (s, t], (b, H, L, L)
        causal = torch.ones(L, L, dtype=torch.bool, device=u.device).tril()
        decay = torch.exp(seg.masked_fill(~causal, float("-inf")))
        xh = x.view(b, L, self.heads, self.headdim)
        scores = (C @ B.transpose(1, 2))[:, None] * decay              # (b, H, L, L)
        y = scores @ (xh * dt[..., None]).transpose(1, 2)             # (b, H, L, P)
        y = y.transpose(1, 2) + xh * self.D[:, None]
        y = y.reshape(b, L, -1) * F.silu(z)
        return u + self.out_proj(y)


class SSMLanguageModel(nn.Module):
    def __init__(self, c: SSMConfig):
        super().__init__()
        self.embed = nn.Embedding(c.vocab, c.d_model)
        self.blocks = nn.ModuleList(SSMBlock(c) for _ in range(c.layers))
        self.norm = RMSNorm(c.d_model)

    def forward(self, input_ids):
        x = self.embed(input_ids)
        for blk in self.blocks:
            x = blk(x)
        return self.norm(x) @ self.embed.weight.t()


# ---------------------------------------------------------------- registry

MODELS = ("bert", "resnet18", "ssm")


def build(name: str, size: str = "small", device: str = "cpu", seed: int = 0) -> tuple[nn.Module, tuple]:
    """(model in eval mode on device, example inputs) of a MODELS entry at
    a SIZES size, with weights and inputs drawn from ``seed``."""
    if size not in SIZES:
        raise ValueError(f"size must be one of {', '.join(SIZES)}, got {size!r}")
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    small = size == "small"
    if name == "bert":
        c = (BertConfig(vocab=1000, hidden=128, layers=2, heads=2, intermediate=512) if small
             else BertConfig(vocab=30522, hidden=768, layers=12, heads=12, intermediate=3072))
        batch, seq = (2, 32) if small else (8, 128)
        model = BertEncoder(c)
        ids = torch.randint(0, c.vocab, (batch, seq), generator=g)
        mask = torch.ones(batch, seq, dtype=torch.int64)
        mask[0, seq - seq // 4:] = 0  # one padded sequence
        inputs = (ids, mask)
    elif name == "resnet18":
        model = ResNet18(width=16 if small else 64, classes=100 if small else 1000)
        inputs = (torch.randn(2 if small else 8, 3, 64 if small else 224, 64 if small else 224, generator=g),)
    elif name == "ssm":
        c = (SSMConfig(vocab=1000, d_model=64, layers=2, d_state=16, headdim=16) if small
             else SSMConfig(vocab=32000, d_model=768, layers=12, d_state=64, headdim=64))
        batch, seq = (2, 32) if small else (4, 512)
        model = SSMLanguageModel(c)
        inputs = (torch.randint(0, c.vocab, (batch, seq), generator=g),)
    else:
        raise ValueError(f"unknown model {name!r}: one of {', '.join(MODELS)}")
    model = model.to(device).eval()
    return model, tuple(x.to(device) for x in inputs)


def parameter_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
