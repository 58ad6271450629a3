"""Values that are what they say: counts are exact, hashes are of the logical
values, and a value that was not computed is never shown."""
from __future__ import annotations

import re
import warnings

import pytest
import torch

from kdebug import DebugMode, KdebugWarning


def _two_graphs(x):
    y = torch.sin(x) + 1
    torch._dynamo.graph_break()
    return torch.cos(y) * 2


@pytest.fixture(scope="module")
def two_graphs():
    x = torch.randn(32)
    fn = torch.compile(_two_graphs)
    fn(x)
    return fn, x


@pytest.mark.parametrize("overflow", ["overwrite", "drop_new"])
def test_overflow_warning_counts_exactly_what_was_dropped(two_graphs, overflow):
    fn, x = two_graphs
    with DebugMode(kernels_only=True) as dm:  # a ring large enough: how many launches one call makes
        fn(x)
    per_call = len(dm.kernels)
    assert per_call == 2 and dm.complete
    calls = 10
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # no trace, nothing read before exit: the warning at exit counts an undrained ring
        with DebugMode(kernels_only=True, ring_capacity=16, overflow=overflow) as small:
            for _ in range(calls):
                fn(x)
        msgs = [str(w.message) for w in caught if issubclass(w.category, KdebugWarning)]
    kept = len(small.kernels)
    assert kept == 5  # 3 slots per launch, 16 slots
    dropped = [int(m) for w in msgs for m in re.findall(r"(\d+) kernel launch record\(s\) were dropped", w)]
    assert dropped == [calls * per_call - kept]  # 15, once
    assert small.kernel_stats["dropped"] == 15
