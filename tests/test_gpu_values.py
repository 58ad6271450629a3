"""record_outputs(filter=..., to=...) on the GPU (Note [Recorded values on
disk], kdebug/values.py): Triton kernels' outputs, cloned on their streams
(batched or not), copied to the host at the drain and written, must be the
bytes the kernels wrote: each equals the bitwise hash taken at launch time."""
from __future__ import annotations

import pytest
import torch

import kdebug
from kdebug import DebugMode, hashing
from kdebug import values as kv

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("batch", [True, False], ids=["batched", "unbatched"])
def test_gpu_values_equal_the_launch_time_hashes(tmp_path, block_step, batch):
    step, x = block_step
    trace = str(tmp_path / "run.kdt")
    with DebugMode(trace=trace, batch_gpu_work=batch) as dm, DebugMode.log_tensor_hashes("bitwise"), \
            DebugMode.record_outputs(filter="triton_", to=dm):
        step(x)
        dm.operators  # a drain in the middle of the run: what is pending is written there
        step(x)
    run = kdebug.load(trace)
    kernels = [k for k in dm.kernels if "triton_" in k.kernel_name]
    assert kernels and kv.open(trace + ".values").launches() == [k.launch_index for k in kernels]
    assert not dm._recorder.outputs  # released from device memory once written
    for k in kernels:
        got = run.values(k.launch_index)
        assert got and set(got) == set(k.post_hashes)
        for a, t in got.items():
            assert t.device.type == "cpu" and hashing.bitwise(t) == k.post_hashes[a], (k.kernel_name, a)


def test_gpu_values_launch_range(tmp_path, block_step):
    step, x = block_step
    with DebugMode() as dm, DebugMode.record_outputs(filter=range(3, 7), to=tmp_path):
        step(x)
    assert len(dm.kernels) > 7
    assert kv.open(tmp_path).launches() == [3, 4, 5, 6]
