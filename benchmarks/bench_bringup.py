"""The bring-up benchmark suite: BERT encoder, ResNet-18 and a Mamba-style
SSM (kdebug/bringup_models.py, random weights) per backend.

    python benchmarks/bench_bringup.py --size small --device cpu
    python benchmarks/bench_bringup.py --size full --device cuda --runs 20

Backends: eager; inductor (torch.compile's default); constrained: kdebug's
constraint backend in warn mode over Inductor, with SAMPLE_CAPS (a
plausible accelerator: float32/float16/bfloat16 compute plus integer
indices, last dimension a multiple of 16, dense layouts, tensors up to
256 MiB).

Per row: compile_s (the wall time of the first call, which compiles: it
includes that call's run; null for eager; Inductor's FX graph and
AOTAutograd caches are off for the whole suite, so no backend reuses
another's kernels, and one untimed tiny compile first takes torch's
one-time import and warm-up cost out of the first row),
latency_ms_mean/std (and _median: robust to a busy machine) over --runs
timed calls after --warmup, graphs and graph_breaks (the compile
inspector, kdebug.inspect_compile, over the first call), violations (the
constrained backend's count; null for the others), and accuracy: the
model's outputs compiled vs eager, leaf by leaf (kdebug.numerics.difference
at the accuracy check's default tolerances per dtype) -- the lighter
model-output comparison, not kdebug.compare_eager's kernel-by-kernel check.
Results: benchmarks/results/bringup_<device>.json.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from kdebug import _upstream, bringup_models, numerics  # noqa: E402
from kdebug.capabilities import AcceleratorCapabilities  # noqa: E402

BACKENDS = ("eager", "inductor", "constrained")
SAMPLE_CAPS = AcceleratorCapabilities(
    name="sample-npu", dtypes={torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.bool},
    dim_alignment={-1: 16}, layout="dense", max_tensor_bytes=256 << 20)


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _leaves(out, path="output"):
    if isinstance(out, torch.Tensor):
        yield path, out
    elif isinstance(out, (list, tuple)):
        for i, o in enumerate(out):
            yield from _leaves(o, f"{path}[{i}]")


def accuracy(compiled_out, eager_out) -> dict:
    """compiled vs eager over every output leaf: status pass / fail, the
    worst max_abs and max_rel, the leaves outside tolerance."""
    c, e = dict(_leaves(compiled_out)), dict(_leaves(eager_out))
    if c.keys() != e.keys():
        return {"status": "error", "max_abs": None, "max_rel": None,
                "detail": f"output leaves differ: {sorted(c)} vs {sorted(e)}"}
    diffs = {k: numerics.difference(c[k].float().cpu() if c[k].dtype == torch.bfloat16 else c[k].cpu(),
                                     e[k].cpu().to(c[k].dtype)) for k in c}
    bad = [k for k, d in diffs.items() if not d.within_tolerance]
    return {"status": "fail" if bad else "pass", "max_abs": max(d.max_abs for d in diffs.values()),
            "max_rel": max(d.max_rel for d in diffs.values()), "leaves": len(diffs), "outside_tolerance": bad,
            "method": "model outputs, compiled vs eager (kdebug.numerics.difference, default tolerances)"}


def bench_one(name: str, backend: str, size: str, device: str, warmup: int, runs: int) -> dict:
    import kdebug
    from kdebug.backends import constrained

    model, inputs = bringup_models.build(name, size, device)
    _upstream.dynamo_reset()
    with torch.no_grad():
        eager_out = model(*inputs)
    row = {"model": name, "backend": backend, "size": size, "device": device,
           "params": bringup_models.parameter_count(model), "compile_s": None, "latency_ms_mean": None,
           "latency_ms_std": None, "graphs": None, "graph_breaks": None, "violations": None, "accuracy": None}
    cb = None
    if backend == "eager":
        fn = model
    elif backend == "inductor":
        fn = torch.compile(model)
    else:
        cb = constrained(SAMPLE_CAPS, mode="warn", then="inductor", use_env=False)
        fn = torch.compile(model, backend=cb)
    try:
        with torch.no_grad():
            if backend != "eager":
                import warnings

                with kdebug.inspect_compile() as insp, warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # the constrained backend's one warning per graph: counted below
                    _sync(device)
                    t0 = time.perf_counter()
                    out = fn(*inputs)
                    _sync(device)
                    row["compile_s"] = time.perf_counter() - t0
                rep = insp.report()
                row["graphs"], row["graph_breaks"] = rep.graph_count, rep.break_count
                row["accuracy"] = accuracy(out, eager_out)
            else:
                row["accuracy"] = {"status": "reference", "max_abs": 0.0, "max_rel": 0.0,
                                   "method": "eager is the reference"}
            for _ in range(warmup):
                fn(*inputs)
            times = []
            for _ in range(runs):
                _sync(device)
                t0 = time.perf_counter()
                fn(*inputs)
                _sync(device)
                times.append((time.perf_counter() - t0) * 1e3)
    except Exception as e:  # one failing backend must not lose the other rows
        row["error"] = f"{type(e).__name__}: {e}".splitlines()[0][:300]
        return row
    row["latency_ms_mean"] = statistics.fmean(times)
    row["latency_ms_std"] = statistics.stdev(times) if len(times) > 1 else 0.0
    row["latency_ms_median"] = statistics.median(times)
    if cb is not None:
        vs = cb.violations
        row["violations"] = len(vs)
        kinds: dict = {}
        for v in vs:
            kinds[v.constraint] = kinds.get(v.constraint, 0) + 1
        row["violations_by_constraint"] = kinds
        row["violation_examples"] = [v.message() for v in vs[:3]]
    return row


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", choices=bringup_models.SIZES, default="small")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--models", nargs="+", choices=bringup_models.MODELS, default=list(bringup_models.MODELS))
    p.add_argument("--backends", nargs="+", choices=BACKENDS, default=list(BACKENDS))
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--runs", type=int, default=10)
    p.add_argument("--out", default=None, help="default: benchmarks/results/bringup_<device>.json")
    a = p.parse_args(argv)
    if a.device == "cuda" and not torch.cuda.is_available():
        print("bench_bringup: --device cuda but torch sees no CUDA device", file=sys.stderr)
        return 2
    if a.runs < 1 or a.warmup < 0:
        print("bench_bringup: --runs must be >= 1 and --warmup >= 0", file=sys.stderr)
        return 2
    out = a.out or os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", f"bringup_{a.device}.json")
    t_all = time.perf_counter()
    rows = []
    caches = contextlib.ExitStack()
    for mod, key in _upstream.compile_cache_switches():
        caches.enter_context(mod.patch(key, False))
    with caches:
        torch.compile(lambda t: t * 2 + 1)(torch.ones(4, device=a.device))  # untimed: torch's one-time warm-up
        for m, b in [(m, b) for m in a.models for b in a.backends]:
            r = bench_one(m, b, a.size, a.device, a.warmup, a.runs)
            rows.append(r)
            acc = r["accuracy"] or {}
            print(f"{m:9s} {b:12s} compile {r['compile_s'] if r['compile_s'] is None else round(r['compile_s'], 2)!s:>6} s"
                  f"  latency {r['latency_ms_mean'] or float('nan'):8.2f} ± {r['latency_ms_std'] or 0:6.2f} ms"
                  f"  graphs {r['graphs']!s:>4}  breaks {r['graph_breaks']!s:>4}  violations {r['violations']!s:>5}"
                  f"  accuracy {acc.get('status')}" + (f"  ERROR {r['error']}" if "error" in r else ""), flush=True)
    total = time.perf_counter() - t_all
    result = {"suite": "bringup", "size": a.size, "device": a.device, "torch": torch.__version__,
              "warmup": a.warmup, "runs": a.runs, "total_s": total, "capabilities": SAMPLE_CAPS.to_json(),
              "rows": rows}
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"suite: {len(rows)} rows in {total:.1f} s -> {out}")
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
