"""The zoo: real compiled steps with a known true root of run-to-run divergence.

Each ``Case`` is a small ``torch.compile``'d step (a model, seeded inputs,
forward, backward, sometimes an update) whose true cause of divergence between
two runs is known: a kernel that really races (natural: atomic adds across
OpenMP threads on the CPU, across thread blocks on a GPU), a fault planted in
one C++ kernel's output with ``kdebug.testing.perturb_kernel_output`` (by an
amount drawn from ``os.urandom``, so every process differs), a difference that
changes nothing later (benign), or none at all (the runs must match).  It is
the ground truth a verdict engine is checked against on steps it was not
tuned to (``benchmarks/bench_verdict.py``)::

    python -m kdebug.zoo CASE [--device cpu|cuda]     # one run of one case
    kdebug hunt -- -m kdebug.zoo CASE [--device cuda]  # hunt it in fresh processes
    kdebug hunt --in-process -- -m kdebug.zoo CASE     # or in this process
    python -m kdebug.zoo --list                        # the cases and their devices

(The ``--`` is needed: without it ``kdebug hunt``'s argument parser takes
``-m`` for one of its own options and stops.)

``Case.roots`` are the expected consequential roots in rank order (most later
consequences first), as substrings of kernel or aten-op names; ``()`` when the
runs must match.  ``Case.benign`` names steps whose outputs may differ without
changing any later output or final tensor: a correct verdict is "match", with
a note naming them.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn


def noise(scale: float = 1.0) -> float:
    """A per-process random amount in [scale, 2 * scale), from os.urandom: a
    planted fault adds it, so two processes (and two calls) differ, but for a
    chance of about 2**-50."""
    return scale * (1.0 + int.from_bytes(os.urandom(7), "little") / 2.0 ** 56)


@dataclass(frozen=True)
class Plant:
    """A fault planted in the step: ``perturb_kernel_output(kernel, arg,
    occurrence, value=noise(scale))`` around it."""

    kernel: str
    arg: str = "out_ptr0"
    occurrence: int = 0
    scale: float = 1.0


@dataclass(frozen=True)
class Case:
    name: str                 # "embedding_backward", ...
    devices: tuple            # ("cpu",), ("cuda",), ("cpu", "cuda")
    doc: str                  # what the step is and why it diverges
    roots: tuple              # expected consequential roots in rank order (name substrings); () = must match
    benign: tuple = ()        # substrings of steps whose differences are benign
    planted: bool = False     # planted with kdebug.testing (True) or natural (False)
    may_match: bool = False   # the root is only a possibility: runs that match are a correct outcome too
    repeats: bool = False     # the root kind may race in several places at once: one or more roots of it
    min_threads: int = 1      # CPU threads the natural race needs (torch.get_num_threads())
    plants: tuple = ()        # the Plant(s) of a planted case
    build: Callable | None = field(default=None, repr=False, compare=False)  # device -> step()

    def available(self, device: str) -> bool:
        """Whether the case runs here on ``device``."""
        return device in self.devices and (device != "cuda" or torch.cuda.is_available())

    def prepare(self, device: str = "cpu", warmup: bool | None = None) -> Callable[[], None]:
        """The compiled step, built from a seeded model and inputs.  Calling it
        runs one step; it can be repeated, and every call starts from the same
        state (parameters are never updated in place, gradients are dropped
        first, a seeded case reseeds).  ``warmup`` (default: planted cases only,
        whose faults need the kernels loaded) runs it once, compiling it: under
        ``kdebug hunt`` that warm-up is recorded too, identical in every run."""
        if device not in self.devices:
            raise ValueError(f"zoo case {self.name} runs on {', '.join(self.devices)}, not {device}")
        from .inductor import install

        install()  # kdebug's kernel wrappers, which planted faults swap, are made as kernels load
        step = self.build(device)
        if self.planted if warmup is None else warmup:
            step()
            _sync(device)
        return step

    @contextlib.contextmanager
    def faults(self):
        """Plants this case's faults (none for natural cases) for the block;
        yields their states (``state["hits"]``: launches perturbed)."""
        from .testing import perturb_kernel_output

        with contextlib.ExitStack() as stack:
            yield [stack.enter_context(perturb_kernel_output(p.kernel, p.arg, p.occurrence, value=noise(p.scale)))
                   for p in self.plants]

    def run(self, device: str = "cpu") -> "_Step":
        """Builds, compiles, warms up where needed, and runs the step once,
        with the planted faults; raises if a planted fault did not hit.
        Returns the step, which holds its final tensors (parameters, outputs)."""
        step = self.prepare(device)
        with self.faults() as states:
            step()
            _sync(device)
        for p, st in zip(self.plants, states):
            if st["hits"] != 1:
                raise RuntimeError(f"zoo case {self.name}: the fault planted in {p.kernel} ({p.arg}) "
                                   f"hit {st['hits']} launches, not 1")
        return step


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


class _Step:
    """A step that starts from the same state every time it is called: it
    drops the parameters' gradients first (no op runs for that), and keeps
    what the step returns (its final tensors: updated weights, outputs) in
    ``self.out``.  The steps never update parameters in place."""

    def __init__(self, params, fn):
        self.params = list(params)
        self.fn = fn
        self.out = None

    def __call__(self) -> None:
        for p in self.params:
            p.grad = None
        self.out = self.fn()


def _loss_step(params, loss_fn, x: torch.Tensor) -> _Step:
    """The compiled forward + backward of loss_fn(x); final tensors: the loss
    and every parameter's gradient."""
    compiled = torch.compile(loss_fn)
    params = list(params)

    def step():
        loss = compiled(x)
        loss.backward()
        return loss.detach(), [p.grad for p in params]

    return _Step(params, step)


# ---------------------------------------------------------------- natural races (atomic adds)


class _Block(nn.Module):
    """A pre-norm transformer block with F.scaled_dot_product_attention (causal)."""

    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=0.0, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class TinyGPT(nn.Module):
    """Token embedding + a learned position table (a plain parameter: its
    gradient is a sum over the batch, not an atomic scatter), SDPA blocks, a
    language-model head."""

    def __init__(self, vocab: int = 64, d: int = 64, heads: int = 4, layers: int = 2, ctx: int = 64) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.randn(ctx, d) * 0.02)
        self.blocks = nn.ModuleList(_Block(d, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos[: idx.shape[1]]
        for b in self.blocks:
            x = b(x)
        return self.head(self.ln(x))


def _tiny_gpt(device: str):
    torch.manual_seed(0)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    vocab, batch, ctx = 32, 512, 64
    model = TinyGPT(vocab=vocab, layers=1, ctx=ctx).to(device, dtype)
    idx = torch.randint(0, vocab, (batch, ctx + 1), device=device)
    x, y = idx[:, :-1].contiguous(), idx[:, 1:].contiguous()

    def loss_fn(x, y):
        return F.cross_entropy(model(x).float().flatten(0, 1), y.flatten())

    compiled = torch.compile(loss_fn)
    params = list(model.parameters())

    def step():
        ctxm = contextlib.nullcontext()
        if device == "cuda":  # cuDNN attention first, as on a recent GPU
            from torch.nn.attention import SDPBackend, sdpa_kernel

            ctxm = sdpa_kernel([SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION,
                                SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH], set_priority=True)
        with ctxm:
            loss = compiled(x, y)
            loss.backward()
        with torch.no_grad():  # one SGD step, out of place: the updated weights are final tensors
            return torch._foreach_add(params, [p.grad for p in params], alpha=-0.1)

    return _Step(params, step)


def _embedding_backward(device: str):
    torch.manual_seed(0)
    vocab, d, n = 32, 32, 65536
    emb = nn.Embedding(vocab, d).to(device)
    proj = nn.Linear(d, 8).to(device)
    idx = torch.randint(0, vocab, (n,), device=device)
    target = torch.randn(n, 8, device=device)
    return _loss_step(list(emb.parameters()) + list(proj.parameters()),
                      lambda idx: (proj(emb(idx)) - target).pow(2).mean(), idx)


def _embedding_bag_backward(device: str):
    torch.manual_seed(0)
    vocab, d, bags, per_bag = 64, 32, 2048, 8
    bag = nn.EmbeddingBag(vocab, d, mode="max").to(device)
    head = nn.Linear(d, 4).to(device)
    idx = torch.randint(0, vocab, (bags, per_bag), device=device)
    target = torch.randn(bags, 4, device=device)
    return _loss_step(list(bag.parameters()) + list(head.parameters()),
                      lambda idx: (head(bag(idx)) - target).pow(2).mean(), idx)


class MoE(nn.Module):
    """Top-k routed mixture of experts: a router, softmax, the top-k experts of
    each token, the chosen experts' outputs (computed densely for every
    expert, then picked: a (token, expert) pair is picked once, so the pick's
    backward adds into distinct elements), and the gate-weighted outputs summed
    back into the residual stream with ``index_add``.  The
    assignments are laid out choice-major (every token's first choice, then
    every token's second choice, as a loop over the k choices makes them), so
    with two threads one adds the first choices while the other adds the
    second choices of the same tokens at the same moment."""

    def __init__(self, d: int = 32, experts: int = 8, k: int = 2) -> None:
        super().__init__()
        self.k = k
        self.router = nn.Linear(d, experts, bias=False)
        self.w = nn.Parameter(torch.randn(experts, d, d) / d ** 0.5)
        self.out = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, d = x.shape
        gate, expert = self.router(x).softmax(-1).topk(self.k, dim=-1)        # (n, k)
        token = torch.arange(n, device=x.device).repeat(self.k)               # choice-major assignments
        every = torch.einsum("nd,edf->nef", x, self.w)                       # every expert on every token
        y = every[token, expert.t().flatten()] * gate.t().flatten().unsqueeze(1)   # the chosen ones
        h = x.index_add(0, token, y)                                         # residual + combine: atomic adds
        return self.out(F.gelu(h))


def _moe_routing(device: str):
    torch.manual_seed(0)
    n, d = 16384, 32
    model = MoE(d).to(device)
    x = torch.randn(n, d, device=device)
    return _loss_step(model.parameters(), lambda x: model(x).pow(2).mean(), x)


class _ConvNet(nn.Module):
    def __init__(self, c: int = 32) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(3, c, 3, padding=1), nn.BatchNorm2d(c), nn.ReLU(),
            nn.Conv2d(c, c, 3, padding=1), nn.BatchNorm2d(c), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(c, 2 * c, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.head = nn.Linear(2 * c, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


def _conv_cudnn_benchmark(device: str):
    torch.manual_seed(0)
    model = _ConvNet().to(device).train()
    x = torch.randn(32, 3, 32, 32, device=device)
    y = torch.randint(0, 10, (32,), device=device)
    compiled = torch.compile(lambda x, y: F.cross_entropy(model(x), y))
    params = list(model.parameters())

    def step():
        with torch.backends.cudnn.flags(enabled=True, benchmark=True, deterministic=False):
            loss = compiled(x, y)
            loss.backward()
        return loss.detach(), [q.grad for q in params]

    return _Step(params, step)


# ---------------------------------------------------------------- steps that must match


class _MLP(nn.Module):
    def __init__(self, d: int = 64, p: float = 0.0) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.drop = nn.Dropout(p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.drop(self.fc2(self.drop(F.gelu(self.fc1(self.ln(x))))))


def _mlp_step(device: str, p: float, seed: int | None):
    torch.manual_seed(0)
    model = _MLP(64, p).to(device).train()
    x = torch.randn(256, 64, device=device)
    compiled = torch.compile(lambda x: model(x).pow(2).mean())
    params = list(model.parameters())

    def step():
        if seed is not None:
            torch.manual_seed(seed)  # the dropout masks: Inductor's RNG seeds come from the default generator
        loss = compiled(x)
        loss.backward()
        return loss.detach(), [q.grad for q in params]

    return _Step(params, step)


def _mlp_baseline(device: str):
    return _mlp_step(device, 0.0, None)


def _dropout_seeded(device: str):
    return _mlp_step(device, 0.1, 1234)


def _generator_ops(device: str):
    torch.manual_seed(0)
    d, n = 32, 128
    w = torch.randn(d, d, device=device, requires_grad=True)
    mix = torch.compile(lambda x, w, idx, perm: ((x[perm] @ w).tanh() * (idx.float() + 1).unsqueeze(1)).softmax(-1))
    # the picks enter as counts (one_hot), not through gather, whose backward is an atomic scatter_add
    score = torch.compile(lambda probs, picks, w: -(probs.log() * F.one_hot(picks, d).sum(1)).mean()
                          + w.pow(2).mean())

    def step():
        # a fresh seeded Generator per step, passed to every random op explicitly
        g = torch.Generator(device=device).manual_seed(7)
        x = torch.randn(n, d, generator=g, device=device)
        idx = torch.randint(0, 10, (n,), generator=g, device=device)
        perm = torch.randperm(n, generator=g, device=device)
        probs = mix(x, w, idx, perm)
        picks = torch.multinomial(probs.detach(), 4, replacement=True, generator=g)
        loss = score(probs, picks, w)
        loss.backward()
        return loss.detach(), w.grad

    return _Step([w], step)


# ---------------------------------------------------------------- a benign difference


_WORKSPACE_OP = "kdebug_zoo::workspace_matmul"


def _workspace_matmul():
    """``kdebug_zoo::workspace_matmul(x, w) -> (x @ w, workspace)``: a custom op
    that also returns its scratch buffer, as cuDNN-style ops do, filled with
    per-call junk from os.urandom.  Registered once per process (the zoo's
    module may be run again by runpy, under ``kdebug hunt --in-process``)."""
    try:
        return torch.ops.kdebug_zoo.workspace_matmul.default
    except (AttributeError, RuntimeError):
        pass

    @torch.library.custom_op(_WORKSPACE_OP, mutates_args=(), schema="(Tensor x, Tensor w) -> (Tensor, Tensor)")
    def workspace_matmul(x, w):
        junk = torch.frombuffer(bytearray(os.urandom(4096)), dtype=torch.uint8)
        return x @ w, junk.to(x.device)

    @workspace_matmul.register_fake
    def _(x, w):
        return x.new_empty(x.shape[0], w.shape[1]), torch.empty(4096, dtype=torch.uint8, device=x.device)

    return torch.ops.kdebug_zoo.workspace_matmul.default


def _benign_workspace(device: str):
    torch.manual_seed(0)
    op = _workspace_matmul()
    x = torch.randn(128, 64, device=device)
    w = torch.randn(64, 64, device=device) / 8
    ln = nn.LayerNorm(64).to(device)

    def f(x, w):
        y, _workspace = op(x, w)          # nothing reads or keeps the workspace
        return ln(F.gelu(y)).sum(-1)

    compiled = torch.compile(f)

    def step():
        with torch.no_grad():
            return compiled(x, w)

    return _Step([], step)


_JITTER_OP = "kdebug_zoo::jitter_matmul"
JITTER_ULPS: int | None = None  # tests fix the jitter (None: os.urandom, 1 to 8 ULP)


def _jitter_matmul():
    """``kdebug_zoo::jitter_matmul(x, w) -> x @ w`` whose element [0, 0] moves
    by 1 to 8 ULP from call to call (os.urandom), as a GEMM that splits its
    reduction differently per call would; Inductor calls it as an extern op."""
    try:
        return torch.ops.kdebug_zoo.jitter_matmul.default
    except (AttributeError, RuntimeError):
        pass

    @torch.library.custom_op(_JITTER_OP, mutates_args=(), schema="(Tensor x, Tensor w) -> Tensor")
    def jitter_matmul(x, w):
        y = x @ w
        ulps = JITTER_ULPS if JITTER_ULPS is not None else 1 + os.urandom(1)[0] % 8
        v = y[0, 0]
        for _ in range(ulps):
            v = torch.nextafter(v, v + 1)
        y[0, 0] = v
        return y

    @jitter_matmul.register_fake
    def _(x, w):
        return x.new_empty(x.shape[0], w.shape[1])

    return torch.ops.kdebug_zoo.jitter_matmul.default


def _extern_jitter(device: str):
    torch.manual_seed(0)
    op = _jitter_matmul()
    x = torch.randn(64, 32, device=device)
    w = torch.randn(32, 32, device=device) / 4
    head = nn.Linear(32, 8).to(device)

    def f(x, w):
        return head(F.gelu(op(x, w))).pow(2).mean()

    compiled = torch.compile(f)

    def step():
        with torch.no_grad():
            return compiled(x, w)

    return _Step([], step)


def _unseeded_input(device: str):
    torch.manual_seed(0)
    model = _MLP(64).to(device)
    compiled = torch.compile(lambda x: model(x).pow(2).mean())
    params = list(model.parameters())

    def step():
        torch.seed()                       # the bug: a non-deterministic seed for the data
        x = torch.randn(256, 64, device=device)
        loss = compiled(x)
        loss.backward()
        return loss.detach(), [q.grad for q in params]

    return _Step(params, step)


# ---------------------------------------------------------------- planted faults (C++ kernels: CPU)


def _two_roots(device: str):
    """Two branches with no data in common: a deep one (a pointwise kernel,
    then three matmuls and more kernels) and a shallow one (one kernel writing
    an output).  The shallow kernel launches first."""
    torch.manual_seed(0)
    x = torch.randn(64, 48, device=device)
    y = torch.randn(40, 24, device=device)
    w1, w2 = torch.randn(48, 48, device=device) / 7, torch.randn(48, 32, device=device) / 7

    def f(x, y):
        shallow = torch.cos(y) * 3 + 1                       # -> an output, nothing else
        torch._dynamo.graph_break()                         # (else Inductor fuses it into a later kernel)
        h = torch.sigmoid(x) @ w1                           # deep: sigmoid feeds a chain
        h = torch.tanh(h) @ w1
        h = F.layer_norm(torch.relu(h), (48,)) @ w2
        return shallow, h.softmax(-1)

    compiled = torch.compile(f)
    return _Step([], lambda: compiled(x, y))


def _backward_planted(device: str):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.LayerNorm(64), nn.GELU(), nn.Linear(64, 64), nn.LayerNorm(64),
                          nn.GELU(), nn.Linear(64, 8)).to(device)
    x = torch.randn(128, 32, device=device)
    return _loss_step(model.parameters(), lambda x: model(x).pow(2).mean(), x)


def _absorbed_planted(device: str):
    torch.manual_seed(0)
    x = torch.randn(64, 32, device=device)
    x[0] -= 20.0                                            # row 0's score is far below the maximum
    w = torch.randn(32, device=device, requires_grad=True)

    def f(x, w):
        score = (x * w.abs()).sum(-1)                       # a reduction kernel writes score (64,)
        return score.topk(4).values.sum() * 2               # aten::topk keeps the 4 largest only

    compiled = torch.compile(f)

    def step():
        out = compiled(x, w)
        out.backward()
        return out.detach(), w.grad

    return _Step([w], step)


# ---------------------------------------------------------------- the cases


def _case(name: str, devices: tuple, doc: str, roots: tuple, **kw) -> Case:
    return Case(name, devices, " ".join(doc.split()), roots, build=globals()["_" + name], **kw)


CASES: dict[str, Case] = {c.name: c for c in (
    _case("tiny_gpt", ("cpu", "cuda"), """
        A tiny GPT (token embedding, a learned position table, one pre-norm block
        with F.scaled_dot_product_attention, causal, dropout_p=0, a language-model
        head) trained one step: cross-entropy, backward, an SGD update computed out
        of place (bf16 on CUDA with cuDNN attention preferred, fp32 on the CPU).
        The embedding's backward accumulates 32768 token gradients into 32 rows with
        atomic adds (Inductor's C++ atomic_add across OpenMP threads; tl.atomic_add
        on a GPU), so the embedding gradient, and the updated embedding, change in
        their last bits from run to run.  On the CPU Inductor fuses it into the last
        backward kernel.  The race is timing-dependent: on a 2-core machine 2 of
        28 pairs of fresh processes gave identical results (bench_verdict.py
        shows whether it fired).  On a GPU cuDNN attention also returns philox seed and
        offset tensors, which its backward reads; with dropout_p=0 they change
        nothing, so differences there are benign.  In bf16 the fp32 gradient's
        wobble can round away in its bf16 cast (seen on the H100): then no
        later output differs and the runs match, with the embedding backward
        among the benign differences.""",
          ("embedding_dense_backward",), benign=("_scaled_dot_product_cudnn_attention",), min_threads=2),
    _case("embedding_backward", ("cpu", "cuda"), """
        An embedding (32 rows) looked up by 65536 tokens, a linear layer, an MSE
        loss, backward.  Inductor decomposes the embedding's backward into an
        index_put with accumulate=True: atomic adds whose order across OpenMP
        threads (CPU) or thread blocks (GPU) changes from run to run.  (With
        16384 tokens it often did not change between fresh processes on a
        2-core machine: the second thread can start after the first has done
        its share.)""",
          ("embedding_dense_backward",), min_threads=2),
    _case("embedding_bag_backward", ("cuda",), """
        nn.EmbeddingBag(mode="max") over 2048 bags of 8 indices, a linear head, an
        MSE loss, backward.  Inductor keeps embedding_bag as an aten fallback; on
        CUDA the max-mode backward adds each bag's gradient into the weight rows
        with atomicAdd (torch.use_deterministic_algorithms refuses it for that
        reason).  CUDA only: on the CPU aten's embedding_bag backward is serial and
        deterministic, and no C++ kernel of Inductor's computes it (a fault cannot
        be planted in it); the CPU's atomic scatter is covered by
        embedding_backward.""",
          ("_embedding_bag_backward",)),
    _case("moe_routing", ("cpu", "cuda"), """
        A mixture-of-experts layer on 16384 tokens: a router, softmax, top-2 of 8
        experts, the chosen experts' outputs (all computed with one einsum, then
        picked), and the gate-weighted outputs summed back into the residual
        stream with index_add, then GELU, a linear layer, a loss, backward.  The assignments
        are laid out choice-major (all first choices, then all second choices),
        so with two threads the two adds into a token's row happen at about the
        same moment, and the residual already in the row makes their order
        matter: Inductor's atomic adds make the combined rows, and everything
        after them, differ from run to run.  (Laid out by expert, as grouped MoE
        kernels sort them, a token's adds happen at different times and the CPU
        result rarely changed between fresh processes.)""",
          ("index_add",), min_threads=2),
    _case("conv_cudnn_benchmark", ("cuda",), """
        A small conv net (three 3x3 convolutions, batch norm, ReLU, pooling, a
        linear head) forward and backward with torch.backends.cudnn.benchmark=True
        and cudnn.deterministic=False.  Each process benchmarks cuDNN's algorithms
        afresh and may pick another one, or a non-deterministic one, for the
        convolution's backward (weight gradients with split-K style atomics) or
        its forward (another algorithm, other rounding): when the runs differ,
        the roots are cuDNN convolution ops, aten::convolution_backward or
        aten::convolution (both seen on the H100, in different hunts), one or
        several (each convolution whose algorithm races is a root of its own:
        two independent convolution_backward roots were seen in one hunt);
        runs that match are a correct outcome too.""",
          ("convolution",), may_match=True, repeats=True),
    _case("dropout_seeded", ("cpu", "cuda"), """
        An MLP block with dropout (p=0.1) in training mode, forward and backward,
        under torch.manual_seed(1234) at the start of every step.  Inductor draws
        its dropout masks from seeds it takes from the default generator, so a
        fixed seed gives the same masks in every run: the runs must match.""",
          ()),
    _case("generator_ops", ("cpu", "cuda"), """
        Random ops with an explicit torch.Generator seeded per step: randn and
        randint with generator=, randperm, and multinomial sampling from a
        compiled softmax, feeding a compiled loss and its backward.  The values
        are the same in every run, but each recorded op's arguments show the
        Generator object's address, which differs between processes (and between
        calls): a correct comparison ignores it, and the runs must match.""",
          ()),
    _case("mlp_baseline", ("cpu", "cuda"), """
        A control: a compiled MLP block (layer norm, GELU, two linear layers, a
        residual) forward and backward, with no atomics, no randomness and no
        planted fault.  The runs must match.""",
          ()),
    _case("unseeded_input", ("cpu", "cuda"), """
        The same MLP block, fed a batch drawn with torch.randn after torch.seed()
        (a non-deterministic seed: the classic forgotten or clock-based seed).
        The root is the aten::randn op itself: no input, a different output in
        every run; every kernel after it reads different data.""",
          ("randn",)),
    _case("benign_workspace", ("cpu", "cuda"), """
        An inference step through a custom op, kdebug_zoo::workspace_matmul(x, w)
        -> (x @ w, workspace), that also returns a 4 KiB scratch buffer filled with
        per-call junk from os.urandom (as ops that hand back their workspace do);
        the product goes through GELU and a layer norm, and nothing reads or keeps
        the workspace.  The op's outputs differ in every run, but no later input
        and no final tensor does: the runs match, with a note naming the op.""",
          (), benign=("workspace_matmul",)),
    _case("extern_jitter", ("cpu", "cuda"), """
        A compiled inference step whose matmul is an extern op,
        kdebug_zoo::jitter_matmul, that moves one element of its product by a
        few ULP from call to call (as a GEMM that splits its reduction per
        call would); GELU, a linear head and a mean follow as Inductor
        kernels.  The root is the aten op itself (its inputs identical, its
        output different), and replaying its output proves it.  A few ULP of
        one element can round away in the kernels after it (seen on the H100):
        then the runs match, with the op among the benign differences.""",
          ("jitter_matmul",)),
    _case("two_roots", ("cpu",), """
        Two planted faults with no data in common, in one compiled step split in
        two graphs by a graph break.  The first kernel launched (cos * 3 + 1 on
        one input) writes a returned tensor and nothing else reads it; the second
        (sigmoid on another input) feeds a chain of three matmuls, tanh, relu, a
        layer norm and a softmax.  Both kernels' outputs differ with identical
        inputs; ranked by later consequences, the sigmoid kernel comes first
        although it launched second.""",
          ("sigmoid", "add_cos_mul"), planted=True,
          plants=(Plant("sigmoid"), Plant("add_cos_mul"))),
    _case("backward_planted", ("cpu",), """
        An MLP (linear, layer norm, GELU, twice, then a linear head) forward and
        backward, with a fault planted deep in the compiled backward: the fused
        GELU + layer-norm backward kernel of the second block gets its gradient
        output (out_ptr3) perturbed.  That gradient flows through the first
        block's backward into the gradients of its weights: every later
        gradient kernel and matmul differs.""",
          ("native_layer_norm_backward_sum_1",), planted=True,
          plants=(Plant("native_layer_norm_backward_sum_1", "out_ptr3"),)),
    _case("absorbed_planted", ("cpu",), """
        Scores (x * |w|).sum(-1) for 64 rows, then aten::topk keeps the 4 largest;
        forward and backward.  A fault is planted in the score kernel's first
        element, row 0, whose score is hundreds below the top 4, by less than 1:
        the kernel's output differs with identical inputs (it is a root in the
        causal sense, a kernel that really is non-deterministic), but topk's
        outputs, and everything after, are bitwise identical.  What is correct:
        since no later output and no final tensor changes, the difference is
        benign here and the verdict is "match", with a note naming the score
        kernel and saying topk absorbed it.  It must not be called harmless in
        general: with other data the perturbed element could enter the top 4.""",
          (), benign=("abs_mul_sum",), planted=True, plants=(Plant("abs_mul_sum", scale=0.25),)),
)}


# The zoo's custom ops are registered on import, so that a standalone repro of
# one (kdebug repro, Note [Standalone repro]) registers it by importing kdebug.zoo.
_workspace_matmul()
_jitter_matmul()

KEPT = None  # the last case run by main(), with its final tensors


def main(argv: list[str] | None = None) -> int:
    """``python -m kdebug.zoo CASE [--device cpu|cuda]``: runs one case once."""
    p = argparse.ArgumentParser(prog="python -m kdebug.zoo",
                                description="run one zoo case once (kdebug hunt -m kdebug.zoo CASE hunts it)")
    p.add_argument("case", nargs="?", choices=sorted(CASES))
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--list", action="store_true", help="list the cases")
    a = p.parse_args(sys.argv[1:] if argv is None else argv)
    if a.list or a.case is None:
        for c in CASES.values():
            roots = ", ".join(c.roots) or "(must match)"
            print(f"{c.name:24} {'/'.join(c.devices):9} {'planted' if c.planted else 'natural':8} roots: {roots}"
                  + (f"; benign: {', '.join(c.benign)}" if c.benign else ""))
        return 0 if a.list else 2
    case = CASES[a.case]
    if not case.available(a.device):
        print(f"zoo: case {case.name} runs on {', '.join(case.devices)}; not available on {a.device} here",
              file=sys.stderr)
        return 2
    global KEPT
    KEPT = case.run(a.device)  # the step's final tensors stay held: Note [Final state]
    print(f"zoo: ran {case.name} on {a.device}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
