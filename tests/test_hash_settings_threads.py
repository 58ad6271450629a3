"""log_tensor_hashes() settings belong to the thread that entered them
(Note [Hash settings per thread] in csrc/kd_recorder.h): threads with different
settings keep theirs, and exits in any order leave nothing on."""
from __future__ import annotations

import threading

import pytest
import torch

from kdebug import DebugMode


def _pointwise(x):
    return torch.sin(x) * 2 + 1


@pytest.fixture(scope="module")
def compiled():
    fn = torch.compile(_pointwise, dynamic=False)
    x = torch.randn(8, 3)
    fn(x)
    return fn, x


def _post(dm) -> list:
    """The post-launch hash of each recorded kernel's written argument (None: not hashed)."""
    out = []
    for k in dm.kernels:
        (w,) = k.written
        out.append(None if k.post_hashes is None else k.post_hashes.get(w))
    return out


def test_two_threads_with_different_settings_and_out_of_order_exits(compiled):
    # A enters "bitwise", then B enters "norm"; A exits first (out of order),
    # then B.  Each step waits for the one before: no race decides anything.
    fn, x = compiled
    step = {name: threading.Event() for name in ("a_in", "b_in", "a_ran", "a_out")}
    dms, errors = {}, []

    def thread_a():
        try:
            with DebugMode(kernels_only=True) as dm:
                with DebugMode.log_tensor_hashes("bitwise"):
                    step["a_in"].set()
                    step["b_in"].wait()
                    fn(x)  # B's "norm" is on now, on B
                    step["a_ran"].set()
                fn(x)  # A's hashes are off again; B's still on
                step["a_out"].set()
            dms["a"] = dm
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)
            for e_ in step.values():
                e_.set()

    def thread_b():
        try:
            step["a_in"].wait()
            with DebugMode(kernels_only=True) as dm:
                with DebugMode.log_tensor_hashes("norm"):
                    step["b_in"].set()
                    step["a_ran"].wait()
                    fn(x)
                    step["a_out"].wait()  # A has left its context
                    fn(x)  # B's settings are still B's
                fn(x)
            dms["b"] = dm
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    th = [threading.Thread(target=thread_a), threading.Thread(target=thread_b)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    assert not errors, errors
    a, b = _post(dms["a"]), _post(dms["b"])
    assert len(a) == 2 and len(b) == 3
    assert isinstance(a[0], int)  # bitwise: A's own kind, not B's
    assert a[1] is None  # A's exit switched A's hashing off
    assert isinstance(b[0], float) and isinstance(b[1], float)  # norm, also after A's exit
    assert b[0] == b[1]
    assert b[2] is None
    # after both exits, in that order, a plain DebugMode hashes nothing
    with DebugMode(kernels_only=True) as dm:
        fn(x)
    assert _post(dm) == [None]
    assert dm.kernels[0].pre_hashes is None


def test_a_worker_thread_uses_the_settings_of_its_debugmodes_thread(compiled):
    # record_all_threads: a thread with no settings of its own hashes as the
    # thread that entered the DebugMode asked; one with its own keeps them.
    fn, x = compiled
    seen = {}

    def plain():
        fn(x)
        seen["plain"] = threading.get_ident()

    def own():
        with DebugMode.log_tensor_hashes("bitwise"):
            fn(x)
        seen["own"] = threading.get_ident()

    with DebugMode(kernels_only=True, record_all_threads=True) as dm, DebugMode.log_tensor_hashes("norm"):
        for target in (plain, own):
            t = threading.Thread(target=target)
            t.start()
            t.join()
    # the threads ran one after the other, so the kernels are in that order (a
    # thread id may be reused by the next thread: seen on the GPU machine)
    assert len(dm.kernels) == 2
    k_plain, k_own = dm.kernels
    assert (k_plain.thread_id, k_own.thread_id) == (seen["plain"], seen["own"])
    (w,) = k_plain.written
    assert isinstance(k_plain.post_hashes[w], float)
    assert isinstance(k_own.post_hashes[w], int)
