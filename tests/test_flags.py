"""Note [Flag validation]: every DebugMode / log_tensor_hashes / record_outputs
flag is checked for type and range, with an error naming what is allowed."""
from __future__ import annotations

import pytest

from kdebug import DebugMode


@pytest.mark.parametrize("kw, exc, match", [
    (dict(ring_capacity=-1), ValueError, r"ring_capacity must be between 16 and 4294967296 slots.*got -1"),
    (dict(ring_capacity=1.9), TypeError, r"ring_capacity must be an int .*float 1\.9"),
    (dict(ring_capacity=2**40), ValueError, r"ring_capacity must be between 16 and 4294967296"),
    (dict(ring_capacity=True), TypeError, r"ring_capacity must be an int .*bool True"),
    (dict(ring_capacity="64"), TypeError, r"ring_capacity must be an int .*str '64'"),
    (dict(kernels_only="False"), TypeError, r"kernels_only must be True or False, not the str 'False'"),
    (dict(record_all_threads="False"), TypeError, r"record_all_threads must be True or False"),
    (dict(batch_gpu_work=None), TypeError, r"batch_gpu_work must be True or False"),
    (dict(record_triton_kernels="no"), TypeError, r"record_triton_kernels must be True or False"),
    (dict(record_final_state="False"), TypeError, r"record_final_state must be True or False"),
    (dict(record_output="False"), TypeError, r"record_output must be True or False"),  # upstream's flag
    (dict(store_original_args=2), TypeError, r"store_original_args must be True or False"),
    (dict(overflow="ring"), ValueError, r"overflow must be one of 'overwrite', 'drop_new'"),
    (dict(trace=3), TypeError, r"trace must be a file path"),
    (dict(record_tensor_attributes="dtype"), TypeError, r"record_tensor_attributes must be None or a list"),
])
def test_debug_mode_flags(kw, exc, match):
    with pytest.raises(exc, match=match):
        DebugMode(**kw)


def test_good_flags_are_kept():
    dm = DebugMode(ring_capacity=64, kernels_only=1, record_all_threads=False, overflow="drop_new")
    assert dm.kernels_only is True and dm.kernel_stats["capacity"] == 64
    assert dm.kernel_stats["overflow"] == "drop_new"


def test_ring_too_large_for_memory_says_what_to_do(monkeypatch):
    from kdebug import _C, mode

    def no_memory(*a, **k):
        raise MemoryError()

    monkeypatch.setattr(_C, "Recorder", no_memory)
    with pytest.raises(MemoryError, match=r"ring_capacity=4294967296\) could not reserve .*smaller ring_capacity"):
        mode.DebugMode(ring_capacity=2**32)


@pytest.mark.parametrize("kw, exc, match", [
    (dict(max_bytes=2**64), ValueError, r"max_bytes must be between 0 and 9223372036854775807 bytes, got 18446744073709551616"),
    (dict(max_bytes=-1), ValueError, r"max_bytes must be between 0"),
    (dict(max_bytes=1e9), TypeError, r"max_bytes must be an int .*float"),
])
def test_record_outputs_flags(kw, exc, match):
    with pytest.raises(exc, match=match):
        with DebugMode.record_outputs(**kw):
            pass


@pytest.mark.parametrize("kw, match", [
    (dict(hash_inputs="False"), r"hash_inputs must be True or False, not the str 'False'"),
    (dict(check_inputs_unchanged="False"), r"check_inputs_unchanged must be True or False"),
])
def test_log_tensor_hashes_flags(kw, match):
    with pytest.raises(TypeError, match=match):
        with DebugMode.log_tensor_hashes(**kw):
            pass
