"""The accuracy check (Note [Accuracy check]) on planted and clean cases, and
what it costs on a transformer training step.

    python benchmarks/bench_accuracy.py [--device cpu|cuda]

Planted cases: one aten op lowered wrongly by kdebug.testing.wrong_lowering
(the true culprit is the kernel computing that op; Inductor names kernels
after the aten ops they fuse, and kdebug lists the FX nodes).  Clean cases
must name no culprit.  Cost: wall time of accuracy.check() of one training
step of a transformer encoder layer against one eager step plus the first
compiled step (which includes compilation, with the FX graph and AOT
autograd caches off, as in the check); goal <= 5x.
Writes benchmarks/results/accuracy_<device>.json.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
aten = torch.ops.aten


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(64, 128), torch.nn.Linear(128, 16)

    def forward(self, x):
        return self.b(torch.tanh(self.a(x)).relu() * 2)


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin, self.ln = torch.nn.Linear(64, 128), torch.nn.LayerNorm(128)

    def forward(self, x):
        return torch.softmax(torch.nn.functional.gelu(self.ln(self.lin(x))), dim=-1)


class Broken(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(64, 64)

    def forward(self, x):
        h = torch.tanh(self.lin(x))
        torch._dynamo.graph_break()
        return {"h": h, "s": (torch.sigmoid(h) * 3,)}


def transformer(device, dtype=torch.float32):
    torch.manual_seed(0)
    m = torch.nn.TransformerEncoderLayer(128, 4, 256, dropout=0.0, activation="gelu", batch_first=True)
    return m.to(device, dtype), torch.randn(8, 32, 128, device=device, dtype=dtype)


def case_list(device):
    def mk(cls, dtype=torch.float32, shape=(32, 64)):
        torch.manual_seed(0)
        return cls().to(device, dtype), torch.randn(*shape, device=device, dtype=dtype)

    bf = torch.bfloat16
    return [
        # name, build, planted (op, kwargs) or None, expected op in the culprit (None: no culprit), training
        ("tanh x1.001, fwd+bwd", lambda: mk(MLP), (aten.tanh.default, {"scale": 1.001}), ("tanh",), True),
        ("exp x1.001 inside softmax", lambda: mk(Block), (aten.exp.default, {"scale": 1.001}), ("exp", "softmax"),
         False),
        ("tanh NaN above 0.5", lambda: mk(MLP), (aten.tanh.default, {"nan_above": 0.5}), ("tanh",), False),
        ("sigmoid x1.01 after a graph break", lambda: mk(Broken), (aten.sigmoid.default, {"scale": 1.01}),
         ("sigmoid",), False),
        ("bf16 layer_norm rsqrt x1.05", lambda: mk(Block, bf), (aten.rsqrt.default, {"scale": 1.05}),
         ("rsqrt", "layer_norm"), False),
        ("transformer erf x1.001 (gelu), fwd+bwd", lambda: transformer(device), (aten.erf.default, {"scale": 1.001}),
         ("erf", "gelu"), True),
        ("clean fp32 block", lambda: mk(Block), None, None, True),
        ("clean bf16 block", lambda: mk(Block, bf), None, None, True),
        ("clean transformer, fwd+bwd", lambda: transformer(device), None, None, True),
    ]


def _leaves(out):
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, dict):
        return [t for v in out.values() for t in _leaves(v)]
    if isinstance(out, (list, tuple)):
        return [t for v in out for t in _leaves(v)]
    return []


def _program(model, x, training):
    def run():
        out = model(x)
        if training:
            sum(t.float().sum() for t in _leaves(out)).backward()
    return run


def _named(kernel, names) -> bool:
    bases = {n.rstrip("0123456789").rstrip("_") for n in kernel.nodes}
    return any(n in kernel.kernel or n in bases for n in names)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    a = ap.parse_args()
    from kdebug import accuracy
    from kdebug.testing import wrong_lowering

    rows = []
    for name, build, planted, expect, training in case_list(a.device):
        model, x = build()
        t0 = time.perf_counter()
        if planted is None:
            rep = accuracy.check(_program(torch.compile(model), x, training))
        else:
            with wrong_lowering(planted[0], **planted[1]):
                rep = accuracy.check(_program(torch.compile(model), x, training))
        dt = time.perf_counter() - t0
        c = rep.culprit
        ok = (c is None) if expect is None else (c is not None and _named(c, expect))
        rows.append({"case": name, "culprit": None if c is None else c.kernel, "expected": expect,
                     "correct": ok, "compared": rep.compared(), "seconds": round(dt, 2)})
        print(f"{'OK ' if ok else 'BAD'} {name:42s} culprit={rows[-1]['culprit']}  "
              f"({rep.compared()} buffers compared, {dt:.1f} s)", flush=True)

    # cost on a transformer training step
    from kdebug import _upstream

    def sync():
        if a.device.startswith("cuda"):
            torch.cuda.synchronize()

    model, x = transformer(a.device)
    step = _program(model, x, True)
    step(); sync()  # warm eager kernels
    t0 = time.perf_counter(); step(); sync(); t_eager = time.perf_counter() - t0
    _upstream.dynamo_reset()
    cm = torch.compile(model)
    # a real compilation, as the check does (no FX graph / AOT autograd cache hit)
    import torch._functorch.config as fconfig
    import torch._inductor.config as iconfig

    with iconfig.patch(fx_graph_cache=False), fconfig.patch(enable_autograd_cache=False):
        t0 = time.perf_counter(); _program(cm, x, True)(); sync(); t_compiled = time.perf_counter() - t0
    t0 = time.perf_counter()
    rep = accuracy.check(_program(torch.compile(model), x, True)); sync()
    t_acc = time.perf_counter() - t0
    ratio = t_acc / (t_eager + t_compiled)
    print(f"transformer step: eager {t_eager:.3f} s, first compiled step (with compilation) {t_compiled:.2f} s, "
          f"accuracy check {t_acc:.2f} s: {ratio:.2f}x (goal <= 5x)")
    if a.device.startswith("cuda"):
        print(f"peak CUDA memory {torch.cuda.max_memory_allocated() / 2**20:.0f} MiB")
    res = {"device": a.device, "torch": torch.__version__, "host": platform.node(), "cases": rows,
           "correct": sum(r["correct"] for r in rows), "total": len(rows),
           "transformer_step": {"eager_s": t_eager, "compiled_first_s": t_compiled, "accuracy_s": t_acc,
                                "ratio": ratio}}
    tag = "cuda_" + torch.cuda.get_device_name().split()[-1].lower() if a.device.startswith("cuda") else "cpu"
    path = os.path.join(HERE, "results", f"accuracy_{tag}.json")
    with open(path, "w") as f:
        json.dump(res, f, indent=1)
    print(f"{res['correct']}/{res['total']} correct; wrote {path}")
    return 0 if res["correct"] == res["total"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
