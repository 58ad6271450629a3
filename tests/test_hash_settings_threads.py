"""log_tensor_hashes() / record_outputs() settings belong to the thread that
entered them, for kernels (Note [Hash settings per thread] in
csrc/kd_recorder.h) and aten ops (Note [Aten-op hash settings per thread] in
kdebug/_aten_hooks.py): threads with different settings keep theirs, and
exits in any order across threads leave nothing on.  Threads take turns
through Events and Barriers: no race decides anything."""
from __future__ import annotations

import threading

import pytest
import torch
import torch.utils._debug_mode as upstream

from kdebug import DebugMode, _aten_hooks, _upstream


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


# ---------------------------------------------------------------- aten ops
# Note [Aten-op hash settings per thread] (kdebug/_aten_hooks.py): the hooks
# log_tensor_hashes() / record_outputs() run for aten ops are per thread too.

def _aten_hashes(dm) -> list:
    """call.log["hash"] of each recorded aten op (None: no hash logged)."""
    return [(c.log or {}).get("hash") for c in dm.operators if isinstance(c, _upstream._OpCall)]


def _no_hooks_left():
    """Nothing of kdebug's is left in upstream's globals or on this thread."""
    assert all(not lst for lst in _upstream.dispatch_hook_lists())
    u = _upstream.utils_module
    assert getattr(u, "_TRITON_OUTPUT_HASH_FN", None) is None
    assert getattr(u, "_TRITON_INPUT_HASH_FN", None) is None
    th = _aten_hooks._local.hooks
    assert th is None or not th.frames


def _run_threads(*targets):
    errors = []

    def wrap(fn):
        def run():
            try:
                fn()
            except BaseException as e:  # pragma: no cover - reported below
                errors.append(e)
        return run

    th = [threading.Thread(target=wrap(t)) for t in targets]
    for t in th:
        t.start()
    for t in th:
        t.join()
    assert not errors, errors


@pytest.mark.parametrize("b_fn", ["norm", "callable"])
def test_two_threads_hash_their_aten_ops_and_kernels_with_their_own_hash_fn(compiled, b_fn):
    # A hashes with a callable giving 100.0, B with "norm" (the C fast path)
    # or a callable giving 200.0 (upstream's code runs the hooks).  Both
    # contexts are open while each thread runs, one thread at a time.
    fn, x = compiled
    x = x.abs() + 1  # no zeros: a norm hash is never 0.0
    a_fn = lambda t: 100.0  # noqa: E731
    b_hash = "norm" if b_fn == "norm" else (lambda t: 200.0)
    barrier = threading.Barrier(2)
    dms = {}

    def thread(name, hash_fn, turn):
        with DebugMode() as dm, DebugMode.log_tensor_hashes(hash_fn):
            barrier.wait()  # both contexts are open
            for t in (0, 1):
                if t == turn:
                    torch.cos(x)
                    fn(x)
                barrier.wait()
        dms[name] = dm

    _run_threads(lambda: thread("a", a_fn, 0), lambda: thread("b", b_hash, 1))
    a, b = dms["a"], dms["b"]
    assert _aten_hashes(a) == [100.0]
    assert _post(a) == [100.0]
    (b_cos,) = _aten_hashes(b)
    (b_kernel,) = _post(b)
    if b_fn == "norm":
        # upstream's own norm hash of the same values (not kdebug's code)
        assert b_cos == pytest.approx(upstream.norm_hash_fn(torch.cos(x), use_scalar=True))
        assert b_kernel == pytest.approx(upstream.norm_hash_fn(_pointwise(x), use_scalar=True))
    else:
        assert (b_cos, b_kernel) == (200.0, 200.0)
    _no_hooks_left()


def test_out_of_order_exits_across_threads_keep_the_other_threads_hooks(compiled):
    # A enters, B enters, A exits (B's still open, its hooks untouched), B
    # runs ops, B exits.  Afterwards no thread hashes anything: a kdebug and
    # an upstream DebugMode log no hashes.
    fn, x = compiled
    step = {k: threading.Event() for k in ("a_in", "b_in", "a_out")}
    dms = {}

    def thread_a():
        with DebugMode() as dm:
            with DebugMode.log_tensor_hashes(lambda t: 1.0, hash_inputs=True):
                step["a_in"].set()
                step["b_in"].wait()
                torch.sin(x)
            torch.sin(x)  # A's context is closed: not hashed
        step["a_out"].set()
        dms["a"] = dm

    def thread_b():
        step["a_in"].wait()
        with DebugMode() as dm:
            with DebugMode.log_tensor_hashes(lambda t: 2.0, hash_inputs=True), DebugMode.record_outputs():
                step["b_in"].set()
                step["a_out"].wait()  # A has left: B's hooks are still B's
                torch.sin(x)
                fn(x)
            torch.sin(x)
        dms["b"] = dm

    _run_threads(thread_a, thread_b)
    a_ops = [c for c in dms["a"].operators if isinstance(c, _upstream._OpCall)]
    assert [c.log for c in a_ops] == [{"input_hash": ((1.0,), {}), "hash": 1.0}, None]
    b_ops = [c for c in dms["b"].operators if isinstance(c, _upstream._OpCall)]
    assert [c.log for c in b_ops] == [{"input_hash": ((2.0,), {}), "hash": 2.0}, None]
    assert torch.equal(b_ops[0].record["output"], torch.sin(x)) and b_ops[1].record is None
    assert _post(dms["b"]) == [2.0]
    _no_hooks_left()
    with DebugMode() as kd:
        torch.sin(x)
        fn(x)
    with upstream.DebugMode() as up:
        torch.sin(x)
    assert _aten_hashes(kd) == [None] and _post(kd) == [None]
    assert [c.log for c in up.operators] == [None]


def test_upstream_debugmode_alone_is_not_hashed_by_another_threads_kdebug_context():
    x = torch.randn(4)
    inside, done = threading.Event(), threading.Event()
    seen = {}

    def kdebug_thread():
        with DebugMode.log_tensor_hashes("norm"):
            inside.set()
            done.wait()

    def upstream_thread():
        inside.wait()
        try:
            with upstream.DebugMode() as up:
                torch.sin(x)
            with upstream.DebugMode() as up2, upstream.DebugMode.log_tensor_hashes("norm"):
                torch.sin(x)
        finally:
            done.set()
        seen["plain"], seen["hashed"] = up, up2

    _run_threads(kdebug_thread, upstream_thread)
    assert [c.log for c in seen["plain"].operators] == [None]
    # upstream's own context still works, on its thread, as upstream wrote it
    (call,) = seen["hashed"].operators
    assert call.log["hash"] == upstream.norm_hash_fn(torch.sin(x), use_scalar=True)
    _no_hooks_left()


def test_exiting_out_of_order_on_one_thread_raises_and_keeps_the_open_context(compiled):
    fn, x = compiled
    outer = DebugMode.log_tensor_hashes("bitwise")
    inner = DebugMode.log_tensor_hashes(lambda t: 5.0)
    with DebugMode() as dm:
        outer.__enter__()
        inner.__enter__()
        with pytest.raises(RuntimeError, match="innermost first"):
            outer.__exit__(None, None, None)
        torch.cos(x)
        fn(x)  # the inner context's settings, for aten ops and kernels
        inner.__exit__(None, None, None)
        torch.cos(x)
        fn(x)  # nothing left on: the outer context's settings went with it
    assert _aten_hashes(dm) == [5.0, None]
    assert _post(dm) == [5.0, None]
    with pytest.raises(RuntimeError, match="without being entered"):
        outer.__exit__(None, None, None)
    _no_hooks_left()


def test_exiting_on_another_thread_raises_and_changes_nothing():
    x = torch.randn(4)
    ctx = DebugMode.log_tensor_hashes(lambda t: 7.0)
    errors = []
    with DebugMode() as dm:
        ctx.__enter__()
        t = threading.Thread(target=lambda: errors.append(pytest.raises(RuntimeError, ctx.__exit__, None, None, None)))
        t.start()
        t.join()
        torch.cos(x)  # still hashed: the failed exit changed nothing
        ctx.__exit__(None, None, None)  # the right thread can still leave it
        torch.cos(x)
    (info,) = errors
    assert "exit it on the thread that entered it" in str(info.value)
    assert _aten_hashes(dm) == [7.0, None]
    _no_hooks_left()


def test_a_raising_hash_fn_leaves_its_thread_clean_and_the_other_thread_hashing():
    x = torch.randn(4)
    a_in, a_done = threading.Event(), threading.Event()
    dms = {}

    def bad(t):
        raise ValueError("planted: this hash_fn fails")

    def thread_a():
        a_in.wait()
        with DebugMode() as dm:
            with pytest.raises(ValueError, match="planted"):
                with DebugMode.log_tensor_hashes(bad):
                    torch.cos(x)
            torch.cos(x)  # A's context left through the error: nothing on
        dms["a"] = dm
        a_done.set()

    def thread_b():
        with DebugMode() as dm, DebugMode.log_tensor_hashes(lambda t: 3.0):
            a_in.set()
            a_done.wait()
            torch.cos(x)
        dms["b"] = dm

    _run_threads(thread_a, thread_b)
    assert _aten_hashes(dms["a"])[-1] is None
    assert _aten_hashes(dms["b"]) == [3.0]
    _no_hooks_left()


def test_aten_ops_on_a_thread_with_no_settings_use_the_modes_threads():
    # autograd's device threads run aten ops under the mode of the thread that
    # called backward (the dispatch-mode stack travels with the work); a
    # thread that entered no context of its own hashes as that thread asked.
    from torch.utils._python_dispatch import _pop_mode, _push_mode  # what autograd's engine does in C

    x = torch.randn(4)

    def worker(dm):
        _push_mode(dm)
        try:
            torch.cos(x)
        finally:
            _pop_mode()

    def own(dm):
        with DebugMode.log_tensor_hashes(lambda t: 9.0):
            worker(dm)

    with DebugMode() as dm, DebugMode.log_tensor_hashes(lambda t: 4.0), DebugMode.record_outputs():
        for target in (worker, own):
            t = threading.Thread(target=target, args=(dm,))
            t.start()
            t.join()
    calls = [c for c in dm.operators if isinstance(c, _upstream._OpCall)]
    assert [c.log["hash"] for c in calls] == [4.0, 9.0]
    assert all(torch.equal(c.record["output"], torch.cos(x)) for c in calls)
    _no_hooks_left()


def test_kdebug_and_upstream_hooks_on_one_thread_run_in_the_order_they_were_entered():
    # upstream's global hooks and this thread's kdebug hooks are run as one
    # list: the innermost context's "hash" wins, as when both were in
    # upstream's lists
    x = torch.randn(4)

    def up_hook(func, types, args, kwargs, result):
        return {"hash": "upstream's"}

    with DebugMode() as dm:
        with upstream.DebugMode.dispatch_hooks(log_hook=up_hook), DebugMode.log_tensor_hashes(lambda t: 1.0):
            torch.cos(x)
        with DebugMode.log_tensor_hashes(lambda t: 1.0), upstream.DebugMode.dispatch_hooks(log_hook=up_hook):
            torch.cos(x)
    assert _aten_hashes(dm) == [1.0, "upstream's"]
    _no_hooks_left()
