"""The examples of seed 000 ("Enhanced DebugMode with Triton Kernel Tracking"),
with torch.utils._debug_mode replaced by kdebug.

On a CPU Inductor launches C++ kernels, so the CPU variants select
kdebug._KernelCall (Triton and C++) where the seed selects _TritonKernelCall;
tests/test_gpu.py runs the seed verbatim on the GPU machine."""
from __future__ import annotations

import pytest
import torch

from kdebug import DebugMode, _KernelCall, _TritonKernelCall


def compiled_function_src(x, y):
    return torch.softmax(x @ y, dim=-1).sum(dim=0) + (x * 2).sum()


def run_basic_usage(compiled_function, x, y, call_cls):
    # --- seed 000, "Basic Usage" ---
    with DebugMode(record_triton_kernels=True) as debug_mode:
        output = compiled_function(x, y)
    triton_calls = [op for op in debug_mode.operators if isinstance(op, call_cls)]
    lines = []
    for call in triton_calls:
        lines.append(f"Kernel: {call.kernel_name}")
        lines.append(f"Grid: {call.grid}")
        lines.append(f"Args: {call.args}")
    return output, triton_calls, lines


def run_nondeterminism_hunt(compiled_fn, inputs, call_cls):
    # --- seed 000, "Debugging Non-Determinism" (forward only: inputs need no grad) ---
    with DebugMode(record_triton_kernels=True, store_original_args=True) as debug_mode1:
        out1 = compiled_fn(*inputs)
    triton_calls1 = [op for op in debug_mode1.operators if isinstance(op, call_cls)]
    torch._dynamo.reset()
    with torch._inductor.utils.fresh_inductor_cache():
        with DebugMode(record_triton_kernels=True, store_original_args=True) as debug_mode2:
            out2 = torch.compile(compiled_function_src)(*inputs)
    triton_calls2 = [op for op in debug_mode2.operators if isinstance(op, call_cls)]
    findings = []
    for i, (call1, call2) in enumerate(zip(triton_calls1, triton_calls2)):
        if call1.kernel_name != call2.kernel_name:
            findings.append(f"Kernel {i}: Different kernels!")
        for j, (t1, t2) in enumerate(zip(call1.args, call2.args)):
            if isinstance(t1, torch.Tensor) and not torch.equal(t1, t2):
                findings.append(f"Kernel {i} ({call1.kernel_name}), arg {j}: Input differs! "
                                f"Max diff: {(t1 - t2).abs().max()}")
                break
    return out1, out2, triton_calls1, triton_calls2, findings


@pytest.fixture(scope="module")
def xy():
    g = torch.Generator().manual_seed(1)
    return torch.randn(32, 16, generator=g), torch.randn(16, 8, generator=g)


def test_basic_usage_cpu(xy):
    cf = torch.compile(compiled_function_src)
    out, calls, lines = run_basic_usage(cf, *xy, _KernelCall)
    torch.testing.assert_close(out, compiled_function_src(*xy))
    assert calls and len(lines) == 3 * len(calls)
    assert all(line.startswith(("Kernel: cpp_fused", "Grid: None", "Args: (t: f32[")) for line in lines)
    # the seed's own filter selects no C++ kernel
    _, triton_only, _ = run_basic_usage(cf, *xy, _TritonKernelCall)
    assert triton_only == []


def test_nondeterminism_hunt_cpu_finds_nothing_on_deterministic_code(xy):
    cf = torch.compile(compiled_function_src)
    out1, out2, c1, c2, findings = run_nondeterminism_hunt(cf, xy, _KernelCall)
    assert c1 and len(c1) == len(c2)
    assert all(isinstance(a, torch.Tensor) for a in c1[0].args)  # store_original_args keeps tensors
    assert torch.equal(out1, out2)
    assert findings == []


def test_nondeterminism_hunt_cpu_names_a_perturbed_input(xy):
    """The seed's comparison loop works on kdebug records: perturb a kernel's
    kept input in run 2 and the loop points at that kernel and argument."""
    cf = torch.compile(compiled_function_src)
    with DebugMode(store_original_args=True) as d1:
        cf(*xy)
    with DebugMode(store_original_args=True) as d2:
        cf(*xy)
    k1, k2 = d1.kernels, d2.kernels
    victim = next(a for a in k2[0].args if isinstance(a, torch.Tensor))
    victim.add_(1.0)  # the kept tensor is the real buffer
    hits = [(i, j) for i, (a, b) in enumerate(zip(k1, k2))
            for j, (t1, t2) in enumerate(zip(a.args, b.args))
            if isinstance(t1, torch.Tensor) and not torch.equal(t1, t2)]
    assert hits and hits[0][0] == 0
