"""The accuracy check (Note [Accuracy check]) on planted and clean cases, and
what it costs on a transformer training step.

    python benchmarks/bench_accuracy.py [--device cpu|cuda] [--spill [--repeat N]]

Planted cases: one aten op lowered wrongly by kdebug.testing.wrong_lowering
(the true culprit is the kernel computing that op; Inductor names kernels
after the aten ops they fuse, and kdebug lists the FX nodes).  Clean cases
must name no culprit.  Cost: wall time of accuracy.check() of one training
step of a transformer encoder layer against one eager step plus the first
compiled step (which includes compilation, with the FX graph and AOT
autograd caches off, as in the check); goal <= 5x.
Writes benchmarks/results/accuracy_<device>.json.

--spill instead measures what the output tiers cost (Note [Output spill]):
accuracy.check() of the transformer training step (erf planted, so the
verdict must name the same kernel) with no budget pressure and with every
kernel output forced out of memory to the spill file (host budget 0; on a
GPU also a 1 MiB device tier, so every few launches drain to the host, and
a host-only run), each repeated --repeat times, the median reported, with
the time spent inside the store (placing, draining, writing, reading back:
SpillStats.seconds), which compilation noise does not blur.
Writes benchmarks/results/accuracy_spill_<device>.json.
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


def _tag(device) -> str:
    return "cuda_" + torch.cuda.get_device_name().split()[-1].lower() if device.startswith("cuda") else "cpu"


def spill_cost(device: str, repeat: int) -> int:
    """accuracy.check of the planted transformer step, with and without the
    spill tiers forced (see the module docstring)."""
    import statistics

    from kdebug import accuracy
    from kdebug.testing import wrong_lowering

    gpu = device.startswith("cuda")
    modes = {"no budget pressure": {}, "all outputs spilled to disk": {"max_host_bytes": 0}}
    if gpu:
        modes["all outputs spilled to disk"]["max_device_bytes"] = 1 << 20
        modes["device 1 MiB, rest to host"] = {"max_device_bytes": 1 << 20}
    rows, times, work = {}, {name: [] for name in modes}, {name: [] for name in modes}
    for _ in range(repeat):
        for name, budgets in modes.items():  # interleaved, so drift hits every mode alike
            model, x = transformer(device)
            with wrong_lowering(aten.erf.default, scale=1.001):
                if gpu:
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                rep = accuracy.check(_program(torch.compile(model), x, True), **budgets)
                if gpu:
                    torch.cuda.synchronize()
                times[name].append(time.perf_counter() - t0)
            sp = rep.spill
            rows[name] = {"budgets": budgets, "culprit": None if rep.culprit is None else rep.culprit.kernel,
                          "compared": rep.compared(), "to_host": sp.to_host, "to_disk": sp.to_disk,
                          "disk_bytes": sp.disk_bytes, "drains": sp.drains, "dropped": sp.dropped}
            work[name].append(round(sp.seconds, 4))
    base = statistics.median(times["no budget pressure"])
    for name in modes:
        med = statistics.median(times[name])
        rows[name].update(seconds=[round(t, 3) for t in times[name]], median_s=round(med, 3),
                          vs_no_pressure=round(med / base, 3), spill_work_s=work[name])
        r = rows[name]
        print(f"{name:32s} median {med:.2f} s ({r['vs_no_pressure']:.2f}x)  culprit={r['culprit']}  "
              f"{r['compared']} compared, {r['to_host']} to host ({r['drains']} drains), {r['to_disk']} to disk "
              f"({r['disk_bytes'] / 2**20:.2f} MiB), {r['dropped']} dropped; in the store "
              f"{statistics.median(r['spill_work_s']):.3f} s")
    same = len({(r["culprit"], r["compared"]) for r in rows.values()}) == 1
    res = {"device": device, "torch": torch.__version__, "host": platform.node(), "repeat": repeat,
           "modes": rows, "same_verdict": same}
    path = os.path.join(HERE, "results", f"accuracy_spill_{_tag(device)}.json")
    with open(path, "w") as f:
        json.dump(res, f, indent=1)
    print(f"same verdict in every mode: {same}; wrote {path}")
    return 0 if same and rows["no budget pressure"]["culprit"] is not None else 1


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--spill", action="store_true", help="measure the output spill tiers' cost instead")
    ap.add_argument("--repeat", type=int, default=3, help="with --spill: runs per mode (median)")
    a = ap.parse_args()
    if a.spill:
        return spill_cost(a.device, a.repeat)
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
    path = os.path.join(HERE, "results", f"accuracy_{_tag(a.device)}.json")
    with open(path, "w") as f:
        json.dump(res, f, indent=1)
    print(f"{res['correct']}/{res['total']} correct; wrote {path}")
    return 0 if res["correct"] == res["total"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
