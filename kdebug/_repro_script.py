"""A standalone repro of one kernel launch or aten-op call, written by
``kdebug repro`` (Note [Standalone repro] in kdebug/repro.py).  This file does
not import kdebug: it is copied as it is beside the recorded arguments.

    python repro.py                 # launch it once, compare with the recorded outputs
    python repro.py --times 20      # launch it 20 times: do its outputs vary?
    python repro.py --json out.json # also write the verdict as JSON
    python repro.py --import mymod  # import a module first (one that registers a custom op)

A kernel is rebuilt from its generated source (kernel_source.cpp or
kernel_source.py beside it: edit it to try a fix) the way Inductor's generated
module does (torch._inductor.async_compile); an op is called as
torch.ops.NAMESPACE.OP.OVERLOAD.  The arguments are loaded as they were before
the recorded launch (inputs.pt: every storage the tensors view, as bytes, so
strides, offsets and aliases are as the kernel saw them; generators by their
state; for a random op the default generators' states too, restored before
every launch), fresh copies for each launch, and every tensor argument and
output is compared with what it held after the recorded launch, bitwise.
Exit status: 0 all identical, 1 a mismatch, 2 an error.  Needs the same torch
as the recording (inputs.pt says which), a GPU with Triton for a Triton kernel,
and for a custom op the module of the program that registers it.
"""
import argparse
import importlib
import json
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
_INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


class NeedsProgram(Exception):
    """The op is the program's own (a custom op): it cannot be called alone."""


def rebuild(saved):
    """The tensors (and values) a snapshot holds: fresh copies of its storages
    on their devices, the tensors viewing them as recorded."""
    storages = {}
    out = []
    for a in saved["args"]:
        if "value" in a:
            out.append(a["value"])
            continue
        dev = torch.device(a["device"])
        key = (a["storage"], str(dev))
        if key not in storages:
            storages[key] = saved["storages"][a["storage"]].to(dev, copy=True).untyped_storage()
        t = torch.empty(0, dtype=getattr(torch, a["dtype"]), device=dev)
        out.append(t.set_(storages[key], a["offset"], a["size"], a["stride"]))
    return out


def decode(enc, leaves):
    """An op's nested argument from its encoding (kdebug.replay._Saver.encode)."""
    (tag, v), = enc.items()
    if tag == "leaf":
        return leaves[v]
    if tag == "value":
        return v
    if tag in ("list", "tuple"):
        xs = [decode(x, leaves) for x in v]
        return xs if tag == "list" else tuple(xs)
    if tag == "dict":
        return {k: decode(x, leaves) for k, x in v.items()}
    if tag == "complex":
        return complex(*v)
    if tag in ("dtype", "layout", "memory_format"):
        return getattr(torch, v)
    if tag == "device":
        return torch.device(v)
    if tag == "generator":
        g = torch.Generator(device=v["device"])
        g.set_state(v["state"])
        return g
    raise ValueError(f"inputs.pt holds an argument of unknown kind {tag!r}")


def flat_tensors(x):
    """The tensors of a nested value, depth first (the order leaf names follow)."""
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for v in x for t in flat_tensors(v)]
    if isinstance(x, dict):
        return [t for v in x.values() for t in flat_tensors(v)]
    return []


def apply_settings(data):
    s = data.get("settings") or {}
    if "cudnn_benchmark" in s:
        torch.backends.cudnn.benchmark = s["cudnn_benchmark"]
        torch.backends.cudnn.deterministic = s["cudnn_deterministic"]
        torch.backends.cudnn.allow_tf32 = s["cudnn_allow_tf32"]
        torch.backends.cuda.matmul.allow_tf32 = s["cuda_matmul_allow_tf32"]
        torch.set_float32_matmul_precision(s["float32_matmul_precision"])
        torch.use_deterministic_algorithms(s["deterministic_algorithms"], warn_only=True)


def load_kernel(data):
    """The kernel, compiled from its source as the generated module does."""
    from torch._inductor.async_compile import AsyncCompile

    d = data["definition"]
    args = list(d["args"])
    for ext in ("cpp", "py"):
        path = os.path.join(HERE, "kernel_source." + ext)
        if os.path.exists(path):
            with open(path) as f:
                args[1] = f.read()  # cpp_pybinding(argtypes, source) / triton(name, source, ...)
    async_compile = AsyncCompile()
    scope = {"kernel": getattr(async_compile, d["method"])(*args, **d["kwargs"])}
    async_compile.wait(scope)
    return scope["kernel"]


def load_op(data, imports):
    """torch.ops.NAMESPACE.OP.OVERLOAD; for a custom op, after importing the
    module that registers it (recorded, or given with --import)."""
    ident = data["op"]
    qual = f"{ident['namespace']}::{ident['op']}.{ident['overload']}"
    tried = []
    for mod in [None] + list(imports) + ([ident["module"]] if ident.get("module") else []):
        if mod is not None:
            try:
                importlib.import_module(mod)
            except Exception as e:  # noqa: BLE001  (any import failure is reported below)
                tried.append(f"import {mod}: {type(e).__name__}: {e}")
                continue
        try:
            return getattr(getattr(getattr(torch.ops, ident["namespace"]), ident["op"]), ident["overload"])
        except (AttributeError, RuntimeError):
            if mod is not None:
                tried.append(f"import {mod}: it did not register {qual}")
    where = (f" (registered by module {ident['module']}"
             + (f", file {ident['file']}" if ident.get("file") else "") + ")") if ident.get("module") else ""
    raise NeedsProgram(
        f"{qual} is a custom op of the recorded program{where}, not part of torch: this repro needs the program's "
        "code that registers it. Make that module importable (PYTHONPATH) and run again, naming it with --import "
        "MODULE if the repro does not know it." + ("\n  tried: " + "; ".join(tried) if tried else ""))


def set_rng(rng):
    if "cpu" in rng:
        torch.random.set_rng_state(rng["cpu"])
    if "cuda" in rng:
        torch.cuda.set_rng_state_all(rng["cuda"])


def launcher(data, imports):
    """A function that launches the kernel or calls the op once on fresh
    copies of the recorded arguments and returns the tensors to compare, in
    the order of ``recorded(data)``."""
    if data.get("kind") == "op":
        op = load_op(data, imports)
        tree = data["before"]["tree"]

        def call():
            leaves = rebuild(data["before"])
            args, kwargs = decode(tree["args"], leaves), decode(tree["kwargs"], leaves)
            set_rng(data["before"].get("rng") or {})
            out = op(*args, **kwargs)
            sync(flat_tensors([args, kwargs, out]))
            return flat_tensors([args, kwargs, out])
        return call
    kernel = load_kernel(data)
    method = data["definition"]["method"]

    def launch():
        args = rebuild(data["before"])
        if method == "cpp_pybinding":
            kernel(*args)
        else:  # a Triton kernel (Inductor's CachingAutotuner): on the stream of its first tensor's device
            dev = next(a.device for a in args if isinstance(a, torch.Tensor))
            kernel.run(*args, stream=torch.cuda.current_stream(dev).cuda_stream, **data["kwargs"])
        sync(args)
        return args
    return launch


def sync(tensors):
    for dev in {t.device for t in tensors if isinstance(t, torch.Tensor) and t.device.type == "cuda"}:
        torch.cuda.synchronize(dev)


def recorded(data):
    """(arguments after the recorded launch, before it) in launch order; for
    an op its tensors only, None before it for its outputs."""
    after = rebuild(data["after"])
    before = rebuild(data["before"])
    if data.get("kind") == "op":
        leaves_a, leaves_b = after, before
        tree = data["after"]["tree"]
        want = flat_tensors([decode(tree["args"], leaves_a), decode(tree["kwargs"], leaves_a),
                             decode(tree["out"], leaves_a)])
        btree = data["before"]["tree"]
        was = flat_tensors([decode(btree["args"], leaves_b), decode(btree["kwargs"], leaves_b)])
        return want, was + [None] * (len(want) - len(was))
    return after, before


def as_bits(t):
    t = t.detach().contiguous()
    if t.is_complex():
        t = torch.view_as_real(t)
    if t.is_floating_point():
        t = t.view(_INT_OF_SIZE[t.element_size()])
    return t.cpu()


def compare(got, want):
    """Element-level comparison of one argument: (differing elements, max abs difference or None)."""
    if got.shape != want.shape or got.dtype != want.dtype:
        return max(got.numel(), want.numel(), 1), None
    a, b = as_bits(got), as_bits(want)
    ne = a != b
    differ = int(ne.sum())
    max_abs = None
    if differ and (got.is_floating_point() or got.is_complex()):
        x, y = got.detach().cpu().double(), want.detach().cpu().double()
        both = torch.isfinite(x) & torch.isfinite(y)
        if bool(both.any()):
            max_abs = float((x - y).abs()[both].max())
    return differ, max_abs


def count_new(seen, tensors):
    """Adds a launch's outputs (the tensors the recorded launch wrote) to
    ``seen`` (the different outputs so far) unless bitwise equal to one of
    them.  An argument the recorded launch left alone and a re-launch wrote
    shows as a mismatch with the recorded outputs instead."""
    bits = [as_bits(a) for a in tensors if isinstance(a, torch.Tensor)]
    if not any(len(s) == len(bits) and all(x.shape == y.shape and x.dtype == y.dtype and torch.equal(x, y)
                                           for x, y in zip(s, bits)) for s in seen):
        seen.append(bits)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--times", type=int, default=1, help="launch it this many times")
    p.add_argument("--json", metavar="PATH", help="also write the verdict as JSON")
    p.add_argument("--save", metavar="PATH", help="also save the recorded outputs and the first launch's that "
                                                  "differs from them (torch.save)")
    p.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                   help="import MODULE first (the program's module that registers a custom op)")
    a = p.parse_args()
    if a.times < 1:
        p.error("--times must be at least 1")
    with open(os.path.join(HERE, "launch.json")) as f:
        info = json.load(f)
    data = torch.load(os.path.join(HERE, "inputs.pt"), weights_only=True)
    if data["torch"] != str(torch.__version__):
        print(f"warning: recorded with torch {data['torch']}, this is torch {torch.__version__}", file=sys.stderr)
    apply_settings(data)
    launch = launcher(data, a.imports)
    want, before = recorded(data)
    names = info.get("arg_names") or []
    roles = {i: "output" if i >= len(before) or before[i] is None else
             "written" if compare(w, before[i])[0] else "unchanged by the recorded launch"
             for i, w in enumerate(want) if isinstance(w, torch.Tensor)}
    outs = [i for i, r in roles.items() if r != "unchanged by the recorded launch"]  # what the step writes
    results, seen, matches, other = [], [], 0, None
    for k in range(a.times):
        got = launch()
        count_new(seen, [got[i] for i in outs])
        this = []
        for i, (g, w) in enumerate(zip(got, want)):
            if not isinstance(g, torch.Tensor):
                continue
            differ, max_abs = compare(g, w)
            role = roles[i]
            this.append({"arg": names[i] if i < len(names) else f"tensor{i}", "index": i, "role": role,
                         "written": role != "unchanged by the recorded launch", "elements": g.numel(),
                         "differ": differ, "max_abs": max_abs})
        mismatch = any(r["differ"] for r in this)
        matches += not mismatch
        if mismatch and other is None:
            other = {r["index"]: got[r["index"]].detach().cpu().clone() for r in this}
        if k == 0 or (mismatch and not any(r["differ"] for r in results)):
            results = this  # the first launch, or the first that mismatched
    what = info.get("op") or info.get("kernel")
    print(f"{what}: {'call' if info.get('kind') == 'op' else 'launch'} {info['launch']} of {info['trace']}")
    if info.get("random"):
        print(f"  {what} draws random numbers: each launch restores the generator state captured right before "
              "the recorded call, so it draws the same numbers (the run-to-run difference of a random op comes "
              "from its generator's seed)")
    for r in results:
        if r["differ"]:
            more = f", max abs diff {r['max_abs']:.6g}" if r["max_abs"] is not None else ""
            print(f"  {r['arg']} ({r['role']}): MISMATCH, {r['differ']} of {r['elements']} elements differ{more}")
        else:
            print(f"  {r['arg']} ({r['role']}): identical ({r['elements']} elements)")
    distinct = len(seen)
    print(f"launched {a.times} time(s) on the recorded inputs: {distinct} different output(s); "
          f"{matches} of {a.times} match the recorded outputs bitwise")
    ok = matches == a.times
    print("REPRODUCED: identical to the recorded outputs" if ok else "MISMATCH with the recorded outputs")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"times": a.times, "distinct": distinct, "matches_recorded": matches, "args": results}, f,
                      indent=1)
    if a.save:
        keep = [r for r in results if r["written"]]
        torch.save({"names": [r["arg"] for r in keep],
                    "recorded": [want[r["index"]].detach().cpu().clone() for r in keep],
                    "other": [other[r["index"]] for r in keep] if other is not None else None}, a.save)
    return 0 if ok else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except NeedsProgram as e:
        print(f"repro: {e}", file=sys.stderr)
        sys.exit(2)
    except (OSError, KeyError, RuntimeError, ValueError) as e:
        print(f"repro: {type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(2)
