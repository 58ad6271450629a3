"""The ``kdebug`` command (also ``python -m kdebug``)."""
from __future__ import annotations

import argparse
import sys
import time


def _demo(args: argparse.Namespace) -> int:
    import torch

    import kdebug
    from kdebug.workloads import TinyBlock, train_step_fn

    device = args.device
    if device == "cuda" and not torch.cuda.is_available():
        print("kdebug demo: --device cuda asked for, but torch sees no CUDA device", file=sys.stderr)
        return 2
    torch.manual_seed(0)
    model = TinyBlock(d=args.d, heads=4).to(device)
    x = torch.randn(2, 16, args.d, device=device)
    step = train_step_fn(model)
    t0 = time.perf_counter()
    step(x)  # compile and warm up outside the recording
    compile_s = time.perf_counter() - t0
    with kdebug.DebugMode(record_triton_kernels=True) as dm:
        step(x)
    print(dm.debug_string(verbose=args.verbose))
    kernels = dm.kernels
    stats = dm.kernel_stats
    kinds = sorted({k.kind for k in kernels})
    print(f"\nkdebug demo: compiled a transformer block (forward + backward) on {device} "
          f"in {compile_s:.1f}s; one step launched {len(kernels)} Inductor kernel(s) "
          f"({', '.join(kinds)}) and {len(dm.operators) - len(kernels)} recorded aten op(s).")
    print(f"recorder: {stats['launches']} launches, {stats['dropped']} dropped, "
          f"{stats['errors']} hook errors, complete={stats['complete']}")
    return 0 if stats["complete"] and kernels else 1


def _info(args: argparse.Namespace) -> int:
    import torch

    import kdebug
    from kdebug import inductor

    print(f"kdebug {kdebug.__version__}  torch {torch.__version__}  python {sys.version.split()[0]}")
    try:
        import triton

        print(f"triton {triton.__version__}")
    except ImportError:
        print("triton: not installed (C++ kernels only)")
    print(f"CUDA available: {torch.cuda.is_available()}")
    for w in inductor.config_bypass_warnings():
        print("warning:", w)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="kdebug", description="kernel-level debugger for torch.compile")
    sub = p.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("demo", help="compile a built-in model, record its kernels, print the debug string")
    d.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    d.add_argument("--d", type=int, default=64, help="model width")
    d.add_argument("--verbose", action="store_true", help="show roles, strides, pointers, configs")
    d.set_defaults(fn=_demo)
    i = sub.add_parser("info", help="versions and settings that affect recording")
    i.set_defaults(fn=_info)
    args = p.parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
