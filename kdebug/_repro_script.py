"""A standalone repro of one kernel launch, written by ``kdebug repro``
(Note [Standalone repro] in kdebug/repro.py).  This file does not import
kdebug: it is copied as it is beside the launch's recorded arguments.

    python repro.py                 # launch the kernel once, compare with the recorded outputs
    python repro.py --times 20      # launch it 20 times: do its outputs vary?
    python repro.py --json out.json # also write the verdict as JSON

It rebuilds the kernel from its generated source (kernel_source.cpp or
kernel_source.py beside it: edit it to try a fix) the way Inductor's generated
module does (torch._inductor.async_compile), loads the arguments as they were
before the recorded launch (inputs.pt: every storage the arguments view, as
bytes, so strides, offsets and aliases are as the kernel saw them), launches
it, and compares every tensor argument with what it held after the recorded
launch, bitwise.  Exit status: 0 all identical, 1 a mismatch, 2 an error.
Needs the same torch as the recording (inputs.pt says which), and a GPU with
Triton for a Triton kernel.
"""
import argparse
import json
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
_INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def rebuild(saved):
    """The arguments a snapshot holds: fresh copies of its storages on
    their devices, the tensors viewing them as recorded."""
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


def launch(kernel, data, method):
    args = rebuild(data["before"])
    if method == "cpp_pybinding":
        kernel(*args)
    else:  # a Triton kernel (Inductor's CachingAutotuner): on the stream of its first tensor's device
        dev = next(a.device for a in args if isinstance(a, torch.Tensor))
        kernel.run(*args, stream=torch.cuda.current_stream(dev).cuda_stream, **data["kwargs"])
        torch.cuda.synchronize(dev)
    return args


def as_bits(t):
    t = t.detach().contiguous()
    if t.is_complex():
        t = torch.view_as_real(t)
    if t.is_floating_point():
        t = t.view(_INT_OF_SIZE[t.element_size()])
    return t.cpu()


def compare(got, want):
    """Element-level comparison of one argument: (differing elements, max abs difference or None)."""
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


def count_new(seen, args):
    """Adds the launch's tensor arguments to ``seen`` (the different outputs
    so far) unless bitwise equal to one of them."""
    bits = [as_bits(a) for a in args if isinstance(a, torch.Tensor)]
    if not any(len(s) == len(bits) and all(x.shape == y.shape and torch.equal(x, y) for x, y in zip(s, bits))
               for s in seen):
        seen.append(bits)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--times", type=int, default=1, help="launch the kernel this many times")
    p.add_argument("--json", metavar="PATH", help="also write the verdict as JSON")
    a = p.parse_args()
    if a.times < 1:
        p.error("--times must be at least 1")
    with open(os.path.join(HERE, "launch.json")) as f:
        info = json.load(f)
    data = torch.load(os.path.join(HERE, "inputs.pt"), weights_only=True)
    if data["torch"] != str(torch.__version__):
        print(f"warning: recorded with torch {data['torch']}, this is torch {torch.__version__}", file=sys.stderr)
    method = data["definition"]["method"]
    kernel = load_kernel(data)
    want = rebuild(data["after"])
    before = rebuild(data["before"])
    names = info.get("arg_names") or []
    results, seen, matches = [], [], 0
    for k in range(a.times):
        got = launch(kernel, data, method)
        count_new(seen, got)
        this = []
        for i, (g, w, b) in enumerate(zip(got, want, before)):
            if not isinstance(g, torch.Tensor):
                continue
            differ, max_abs = compare(g, w)
            this.append({"arg": names[i] if i < len(names) else f"arg{i}", "index": i,
                         "written": bool(compare(w, b)[0]), "elements": g.numel(), "differ": differ,
                         "max_abs": max_abs})
        matches += all(r["differ"] == 0 for r in this)
        if k == 0 or (not results and any(r["differ"] for r in this)):
            results = this  # the first launch, or the first that mismatched
    print(f"{info['kernel']}: launch {info['launch']} of {info['trace']}")
    for r in results:
        role = "written" if r["written"] else "unchanged by the recorded launch"
        if r["differ"]:
            more = f", max abs diff {r['max_abs']:.6g}" if r["max_abs"] is not None else ""
            print(f"  {r['arg']} ({role}): MISMATCH, {r['differ']} of {r['elements']} elements differ{more}")
        else:
            print(f"  {r['arg']} ({role}): identical ({r['elements']} elements)")
    distinct = len(seen)
    print(f"launched {a.times} time(s) on the recorded inputs: {distinct} different output(s); "
          f"{matches} of {a.times} match the recorded outputs bitwise")
    ok = matches == a.times
    print("REPRODUCED: identical to the recorded outputs" if ok else "MISMATCH with the recorded outputs")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"times": a.times, "distinct": distinct, "matches_recorded": matches, "args": results}, f,
                      indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (OSError, KeyError, RuntimeError, ValueError) as e:
        print(f"repro: {type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(2)
