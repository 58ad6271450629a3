"""The first-NaN check (Note [First non-finite value]): planted cases and its
cost on a compiled CPU (or CUDA) training step.

    python benchmarks/bench_nan.py [--device cpu|cuda] [--cycles 12]

Cost: one step of kdebug.workloads.transformer_step each, in cycles of a
shuffled order: untraced, DebugMode() + log_tensor_hashes() (norm, outputs:
the baseline the goal names), DebugMode(check_finite=True) and
check_finite='inputs'; every traced step reads its records (the stats are
collected then: the one synchronization).  Ratios are of medians; goal:
check_finite <= 1.3x log_tensor_hashes().  The verdict's own time (walking
the records after the step) is reported apart.
Planted cases: the kernel named must compute the planted op.
Writes benchmarks/results/nan_<device>.json.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
aten = torch.ops.aten


def planted(device: str) -> list[dict]:
    import kdebug
    from kdebug import DebugMode
    from kdebug.testing import wrong_lowering

    def case(name, want, fn, args, backward=False, check="inputs", ctx=None):
        torch._dynamo.reset()
        import contextlib

        with ctx or contextlib.nullcontext():
            f = torch.compile(fn)
            r = f(*args)
            if backward:
                r.backward()
            with DebugMode(check_finite=check) as dm:
                r = f(*args)
                if backward:
                    r.backward()
        rep = dm.first_nonfinite()
        got = rep.first.name if rep.first else None
        return {"case": name, "expected_op": want, "named": got, "hint": rep.first.hint if rep.first else None,
                "ok": got is not None and want in got and rep.first.kind == "kernel"}

    torch.manual_seed(0)
    d = device
    lin = torch.nn.Linear(16, 16).to(d)
    x16 = torch.randn(8, 16, device=d) * 3
    xg = torch.randn(32, device=d, requires_grad=True)
    z = torch.rand(6, 5, device=d) + 0.1
    z[2] = 0
    kdebug.provenance.install()
    with torch._inductor.config.patch(fx_graph_cache=False):
        return [
            case("wrong lowering: tanh NaN above 0.5 (forward)", "tanh", lambda x: torch.tanh(lin(x)).relu() * 2,
                 (x16,), ctx=wrong_lowering(aten.tanh.default, nan_above=0.5)),
            case("log of a negative value (forward)", "log", lambda x, w: torch.log(x @ w - 1.0).sum(-1),
                 (torch.randn(8, 8, device=d), torch.randn(8, 8, device=d)), check=True),
            case("0/0 division (forward)", "div", lambda x: (x * 2) / (x * 2).sum(-1, keepdim=True), (z,)),
            case("fp16 overflow: exp of a large input (forward)", "exp", lambda x: torch.exp(x * 1.0) + 1,
                 (torch.linspace(-4, 14, 64, device=d).half().view(8, 8),)),
            case("sqrt of a negative value under where (backward)", "sqrt",
                 lambda x: torch.where(x > 0, torch.sqrt(x), torch.zeros_like(x)).sum(), (xg,), backward=True),
            case("wrong lowering: tanh NaN above 0.5 (forward + backward)", "tanh",
                 lambda x: (torch.tanh(lin(x)) * 2).sum(), (x16,), backward=True,
                 ctx=wrong_lowering(aten.tanh.default, nan_above=0.5)),
        ]


def cost(device: str, cycles: int) -> dict:
    from kdebug import DebugMode
    from kdebug.workloads import transformer_step

    torch._dynamo.reset()
    step, x = transformer_step(device, warmup=3)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    modes = {
        "untraced": None,
        "log_tensor_hashes": lambda: (DebugMode(), DebugMode.log_tensor_hashes()),
        "check_finite": lambda: (DebugMode(check_finite=True), None),
        "check_finite_inputs": lambda: (DebugMode(check_finite="inputs"), None),
    }
    times: dict = {k: [] for k in modes}
    verdict: list = []
    for _ in range(cycles):
        order = list(modes)
        random.shuffle(order)
        for k in order:
            sync()
            t0 = time.perf_counter()
            if modes[k] is None:
                step(x)
                sync()
            else:
                dm, inner = modes[k]()
                with dm:
                    if inner is not None:
                        with inner:
                            step(x)
                    else:
                        step(x)
                len(dm.operators)  # the records read: stats collected (synchronizes once)
            times[k].append(time.perf_counter() - t0)
            if k == "check_finite":
                t1 = time.perf_counter()
                rep = dm.first_nonfinite()
                verdict.append(time.perf_counter() - t1)
                assert rep.first is None, rep.summary()
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"median_ms": {k: v * 1e3 for k, v in med.items()},
            "check_finite_over_log_tensor_hashes": med["check_finite"] / med["log_tensor_hashes"],
            "check_finite_inputs_over_log_tensor_hashes": med["check_finite_inputs"] / med["log_tensor_hashes"],
            "log_tensor_hashes_over_untraced": med["log_tensor_hashes"] / med["untraced"],
            "check_finite_over_untraced": med["check_finite"] / med["untraced"],
            "verdict_median_ms": statistics.median(verdict) * 1e3, "cycles": cycles}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--cycles", type=int, default=12)
    a = ap.parse_args()
    cases = planted(a.device)
    for c in cases:
        print(f"{'OK  ' if c['ok'] else 'MISS'} {c['case']}: named {c['named']}  [{c['hint']}]")
    c = cost(a.device, a.cycles)
    print(json.dumps(c, indent=1))
    out = {"device": a.device, "torch": torch.__version__, "machine": platform.machine(),
           "cpus": os.cpu_count(), "planted": cases, "planted_named": sum(x["ok"] for x in cases), "cost": c,
           "gpu": torch.cuda.get_device_name() if a.device == "cuda" else None}
    path = os.path.join(HERE, "results", f"nan_{a.device}.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
