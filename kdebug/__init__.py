"""kdebug: a kernel-level debugger for torch.compile.

``kdebug.DebugMode`` is a drop-in for ``torch.utils._debug_mode.DebugMode``
whose C launch hook records every kernel Inductor's generated code launches
(Triton on GPUs, C++ on CPUs) into a ring buffer::

    from kdebug import DebugMode, _TritonKernelCall
    with DebugMode(record_triton_kernels=True) as debug_mode:
        out = compiled_fn(x, y)
    print(debug_mode.debug_string())
"""
import torch  # noqa: F401  (loads libtorch before the extension that links to it)

from . import _C  # noqa: F401
from .calls import TensorInfo, _CppKernelCall, _KernelCall, _TritonKernelCall
from .compare import Report, assert_deterministic, compare
from .inductor import KdebugWarning
from .mode import DebugMode, get_active_debug_mode
from .trace import Run, TraceFileError, load

__version__ = "0.1.0"

__all__ = [
    "DebugMode",
    "KdebugWarning",
    "Report",
    "Run",
    "TraceFileError",
    "TensorInfo",
    "_CppKernelCall",
    "_KernelCall",
    "_TritonKernelCall",
    "assert_deterministic",
    "compare",
    "get_active_debug_mode",
    "load",
]
