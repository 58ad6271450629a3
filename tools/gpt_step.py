"""A tiny GPT training step (compiled, bf16, SDPA, embedding, cross-entropy):
what a new user hunts first.  `kdebug hunt --runs 2 tools/gpt_step.py`."""
import torch
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.h = h
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, -1)
        q, k, v = (z.view(b, t, self.h, d // self.h).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(y)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, vocab=4096, d=256, h=4, n=2, t=256):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(t, d)
        self.blocks = nn.ModuleList(Block(d, h) for _ in range(n))
        self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for b in self.blocks:
            x = b(x)
        return self.head(self.ln(x))


def main():
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    dt = torch.bfloat16 if dev == "cuda" else torch.float32
    torch.manual_seed(0)
    model = GPT().to(dev, dt)
    idx = torch.randint(0, 4096, (8, 256), device=dev)
    tgt = torch.randint(0, 4096, (8, 256), device=dev)
    step = torch.compile(lambda: F.cross_entropy(model(idx).float().view(-1, 4096), tgt.view(-1)))
    loss = step()
    loss.backward()
    print("loss", loss.item())


if __name__ == "__main__":
    main()
