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


def test_checked_flags_are_not_taken_for_equal_flags_of_another_type():
    """Note [Checked DebugMode flags]: flags accepted once are remembered, but
    an equal value of another type (1 == True, 16.0 == 16, 0 == False, with
    the same hash) is still checked, and a bad flag raises every time."""
    for _ in range(2):  # the second round finds the good flags remembered
        assert DebugMode(check_finite=True, kernels_only=True).check_finite is True
        with pytest.raises(ValueError, match=r"check_finite must be False, True .*not 1"):
            DebugMode(check_finite=1, kernels_only=True)
        assert DebugMode(check_finite=False, kernels_only=True).check_finite is False
        with pytest.raises(ValueError, match=r"check_finite must be False, True .*not 0"):
            DebugMode(check_finite=0, kernels_only=True)
        assert DebugMode(ring_capacity=16).kernel_stats["capacity"] == 16
        with pytest.raises(TypeError, match=r"ring_capacity must be an int .*float 16\.0"):
            DebugMode(ring_capacity=16.0)
        dm = DebugMode(kernels_only=1, record_extern_ops=True)  # accepted, normalized to a bool
        assert dm.kernels_only is True and dm.record_extern_ops is True
        with pytest.raises(ValueError, match=r"record_extern_ops=True is for kernels_only=True"):
            DebugMode(kernels_only=0, record_extern_ops=True)
        with pytest.raises(TypeError, match=r"kernels_only must be True or False, not the int 2"):
            DebugMode(kernels_only=2)
        # the same kdebug flags with an upstream flag: checked again (store_original_args=2 is bad)
        with pytest.raises(TypeError, match=r"store_original_args must be True or False"):
            DebugMode(kernels_only=True, record_extern_ops=True, store_original_args=2)


def test_checked_flags_follow_a_path_like_trace(tmp_path):
    """A trace given as an os.PathLike is not remembered: the object may
    name another path the next time."""
    class Moving:
        def __init__(self):
            self.path = str(tmp_path / "a.kdt")

        def __fspath__(self):
            return self.path

    p = Moving()
    assert DebugMode(trace=p)._trace_path == str(tmp_path / "a.kdt")
    p.path = str(tmp_path / "b.kdt")
    assert DebugMode(trace=p)._trace_path == str(tmp_path / "b.kdt")


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
