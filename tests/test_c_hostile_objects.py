"""kdebug's C entry points given hostile Python objects: a repr or __index__
that changes the container being read, attributes of the wrong type, typed
tuples of the wrong length, Python code run mid-record that drops what the
record holds, tensors whose storage shrank under them.  Each case crashed the
process (use after free, stale lengths, reads outside a storage) before the
fixes an adversarial review led to; now each gives an exception, a counted
recorder error, or a correct result."""
from __future__ import annotations

import pytest
import torch

import kdebug
import kdebug.mode
from kdebug import _C
from kdebug._boundary import HashHook, TritonLaunch


@pytest.fixture(autouse=True)
def _configured():
    kdebug.mode._configure()  # the formatter's leaf types and leaf_text, as DebugMode sets them


# ---------------------------------------------------------------- formatting and hash trees

def test_a_kwargs_key_whose_str_raises_gives_its_exception():
    class Key:
        def __hash__(self):
            return 1

        def __str__(self):
            raise RuntimeError("no str")

    with pytest.raises(RuntimeError, match="no str"):
        _C.format_kwargs({Key(): 1})


def test_reprs_that_empty_the_list_or_dict_being_formatted():
    class ClearsList:  # a repr with an address: leaf_text's stable text ("<X>"), formatted in C
        def __repr__(self):
            items.clear()
            return "<X at 0x12345678>"

    items = [ClearsList() for _ in range(50)]
    text = _C.format_args((items,))
    assert text == "[" + ", ".join(["<X>"] * 50) + "]"  # the list as it was when formatting began

    class ClearsDict:
        def __hash__(self):
            return 1

        def __repr__(self):
            d.clear()
            return "<K at 0x12345678>"

    d = {ClearsDict(): 1, **{str(i): i for i in range(30)}}
    text = _C.format_args((d,))
    assert text.startswith("{<K>: 1, '0': 0") and text.endswith("'29': 29}")


def test_reprs_that_empty_a_hash_tree_being_encoded():
    class ClearsList:
        def __repr__(self):
            items.clear()
            return "x"

    items = [ClearsList() for _ in range(100)]
    snapshot = list(items)
    got = _C.tree_leaf_digest(items)
    assert got == _C.tree_leaf_digest(snapshot)  # encoded from the list as it was

    class ClearsDict:
        def __hash__(self):
            return 1

        def __eq__(self, o):
            return self is o

        def __repr__(self):
            d.clear()
            return "k"

    d = {ClearsDict(): "v", **{i: "v" for i in range(50)}}
    w = _C.TraceWriter()
    w.op(0, 1, "aten::foo", "text", d, None)  # flags 1: an input hash tree, encoded
    w.end()
    op = _C.TraceReader(w.take()).op(0, None)
    assert len(op.input_hashes) == 51


def test_a_trace_writer_refuses_flags_its_reader_would_call_corrupt():
    with pytest.raises(ValueError, match="unknown flags"):
        _C.TraceWriter().op(0, 16, "aten::foo", "text", None, None)


# ---------------------------------------------------------------- kernel info and tables

def test_kernel_info_reads_its_lists_once():
    names = ["a", "b", "c", "d"]

    class Role:
        def __index__(self):
            names.clear()
            roles.clear()
            return 1

    roles = [Role(), 1, 1, 1]
    ki = _C.KernelInfo(1, "k", names, roles, 0, -1)
    assert ki.arg_names == ("a", "b", "c", "d") and ki.roles == (1, 1, 1, 1)


def test_kernel_info_refuses_devices_its_record_cannot_hold():
    with pytest.raises(ValueError, match="device_type"):
        _C.KernelInfo(1, "k", [], [], 300, 0)  # was recorded as device type 44
    with pytest.raises(ValueError, match="device_index"):
        _C.KernelInfo(1, "k", [], [], 1, 1000)


def test_table_fill_reads_each_spec_id_once():
    ki = _C.KernelInfo(1, "k", ["a"], [1], 0, -1)
    r = _C.Recorder(16)
    r.record(ki, (3,))
    r.drain()
    w = _C.TraceWriter()
    w.launches(r, 0, 1)
    w.end()
    reader = _C.TraceReader(w.take())

    class Flips:  # 0 the first time, far out of range after
        n = 0

        def __hash__(self):
            return 7

        def __eq__(self, o):
            return self is o

        def __index__(self):
            Flips.n += 1
            return 0 if Flips.n == 1 else 1 << 40

    table = _C.LaunchTable()
    for _ in range(3):
        try:
            _C.table_fill(table, reader, {Flips(): 5}, 0, 10)
        except ValueError as e:
            assert "spec ids" in str(e)


# ---------------------------------------------------------------- the Triton launch hook

def _hook(finisher=lambda a, t: None):
    return _C.RunHook(lambda *a, **k: 1, lambda a: None, finisher)


def test_a_kdebug_info_attribute_that_is_no_kernel_info_is_not_read_as_one():
    class Autotuner:
        _kdebug_info = "not a KernelInfo at all" * 3

    r = _C.Recorder(64)
    r.start()
    try:
        assert _hook()(Autotuner(), 1, 2, 3) == 1  # the launch itself still runs
    finally:
        r.stop()
    r.drain()
    assert len(r) == 0 and any("KernelInfo" in m for m in r.messages())


def test_a_kdebug_info_property_making_a_new_info_per_read():
    class Autotuner:
        @property
        def _kdebug_info(self):
            return _C.KernelInfo(1, "kern", ["x"] * 40, [1] * 40, 0, -1)

    r = _C.Recorder(4096)
    r.start()
    try:
        for _ in range(20):
            _hook()(Autotuner(), *range(40))
    finally:
        r.stop()
    r.drain()
    assert len(r) == 20
    first = r.launch(0)
    assert first.kernel_name == "kern" and [(a.name, a.value) for a in first.args] == [("x", i) for i in range(40)]


def test_a_triton_launch_of_the_wrong_length_is_a_recorder_error():
    ki = _C.KernelInfo(1, "kern", ["x"], [1], 0, -1)

    class Autotuner:
        _kdebug_info = ki

    hook = _hook(lambda a, t: tuple.__new__(TritonLaunch, ()))
    r = _C.Recorder(64)
    r.start()
    try:
        for _ in range(3):
            hook(Autotuner(), 1)
    finally:
        r.stop()
    r.drain()
    assert len(r) == 3 and any("wrong length" in m for m in r.messages())


def test_a_hash_hook_of_the_wrong_length_is_not_read():
    kdebug.mode._configure()
    import kdebug._upstream as U

    _C._set_dtype_names(dict(U.dtype_abbrs))

    class Owner:
        hash_code = 1
        record_code = 0
        hash_entry = tuple.__new__(HashHook, ())

    class Mode:
        _stream = None
        _fast = True
        call_depth = 0
        fx_stack_trace = None
        record_output = False
        _ops: list = []
        _fresh: set = set()
        _pending_calls: list = []
        _hook_owner = Owner()

    a = torch.ones(3)
    try:
        _C.dispatch(Mode(), torch.ops.aten.add.Tensor, (), (a, a), None)
    except AttributeError:
        pass  # this stand-in mode lacks what a later step reads; the entry was refused before it


# ---------------------------------------------------------------- replica records

def test_record_state_holds_its_tensors_while_python_code_runs():
    class Mode:
        @property
        def call_depth(self):
            tensors.clear()  # the caller's list, emptied mid-record
            junk.append([torch.zeros(3) for _ in range(2000)])  # reuses freed memory, if any was freed
            return 0

    junk: list = []

    r = _C.Recorder(64, store_objects=True)
    tensors = [torch.ones(3)]
    r.start(mode=Mode())
    try:
        assert _C.record_state("s", ["x"], tensors)
    finally:
        r.stop()
    r.drain()
    (kept,) = r.launch(0).objects
    assert torch.equal(kept, torch.ones(3))


def test_record_state_holds_its_recorder_while_python_code_runs():
    class Mode:
        @property
        def call_depth(self):
            rec, self.rec = self.rec, None
            rec.stop()
            del rec  # the last reference
            junk.append([bytearray(200) for _ in range(20000)])  # reuses its memory, if it was freed
            return 0

    junk: list = []

    m = Mode()
    m.rec = _C.Recorder(64, store_objects=True)
    m.rec.start(mode=m)
    del m
    assert _C.record_state("s", ["x"], [torch.ones(4)]) in (True, False)


# ---------------------------------------------------------------- storage shrunk under a view

@pytest.mark.parametrize("nbytes", [0, 16])
def test_a_view_outside_its_storage_is_not_hashed(nbytes):
    t = torch.ones(1 << 20)
    t.untyped_storage().resize_(nbytes)
    with pytest.raises(ValueError, match="storage is smaller than its view"):
        _C.hash(t)
    with pytest.raises(ValueError, match="storage is smaller than its view"):
        _C.hash_async(t, 7, 0)
    ki = _C.KernelInfo(1, "k", ["a"], [1], 0, -1)
    r = _C.Recorder(64)
    prev = _C._set_hash_config(7, 1, 0, 0)
    r.start()
    try:
        r.record(ki, (t,))
    finally:
        r.stop()
        _C._set_hash_config(*prev)  # a HashConfig: the settings before
    r.drain()
    (h,) = r.launch(0).hashes
    assert h.pre is None and h.post is None  # nothing read, nothing shown
    assert any("storage is smaller than its view" in m for m in r.messages())


def test_a_view_inside_its_storage_is_still_hashed():
    t = torch.arange(12.0)
    v = t[2:8:2]
    assert _C.hash(v) == _C.hash(v.contiguous())


def test_a_recording_says_why_a_view_outside_its_storage_has_no_hash():
    t = torch.ones(1 << 20)
    t.untyped_storage().resize_(0)
    with pytest.warns(kdebug.KdebugWarning, match="storage is smaller than its view") as seen:
        with kdebug.DebugMode(kernels_only=True) as dm, kdebug.DebugMode.log_tensor_hashes(hash_fn="bitwise"):
            assert _C.record_state("kdebug::probe", ["t"], [t])
    assert not any("dtype" in str(w.message) for w in seen)  # not blamed on its dtype
    (k,) = dm.kernels
    assert not k.post_hashes


# Note [Records made in one pass]: cases an adversarial review of its first
# version found to differ from the launch path's two calls.  Each runs both
# paths (kdebug.testing.two_call_records turns the one pass off).

def _both(run):
    import kdebug.testing
    one = run()
    with kdebug.testing.two_call_records():
        two = run()
    return one, two


def test_one_pass_counts_nothing_for_a_record_not_described_or_refused():
    """A record whose later argument cannot be described, or that the ring
    refuses, counts no hash errors: its writes were never hashed (the first
    one-pass version hashed each argument's writes while describing it)."""
    base = torch.randn(10)
    view = base[2:8]
    base.untyped_storage().resize_(0)  # storage smaller than the view: a hash error if hashed
    sparse = torch.eye(3).to_sparse()  # cannot be described

    def not_described():
        r = _C.Recorder(1024)
        prev = _C._set_hash_config(_C.HASH_NORM, False, False, 0)
        try:
            ok = r.record(_C.KernelInfo(1, "k", ["a", "sp"], [2, 1], 0, -1), (view, sparse))
        finally:
            _C._set_hash_config(*prev)
        s = r.stats()
        return ok, {k: s[k] for k in ("launches", "errors", "unrecorded", "hash_unsupported")}

    def refused():
        r = _C.Recorder(16, "drop_new")
        filler = _C.KernelInfo(1, "fill", ["a"], [1], 0, -1)
        while r.record(filler, (torch.zeros(1),)):  # the ring is full
            pass
        prev = _C._set_hash_config(_C.HASH_NORM, False, False, 0)
        try:
            ok = r.record(_C.KernelInfo(1, "k", ["a"], [2], 0, -1), (view,))
        finally:
            _C._set_hash_config(*prev)
        s = r.stats()
        return ok, {k: s[k] for k in ("refused", "errors", "hash_unsupported")}

    one, two = _both(not_described)
    assert one == two == (False, {"launches": 0, "errors": 1, "unrecorded": 1, "hash_unsupported": 0})
    one, two = _both(refused)
    assert one == two and one[0] is False and one[1]["refused"] >= 1 and one[1]["errors"] == 0


def test_one_pass_leaves_no_python_error_set_when_a_hash_error_cannot_be_printed():
    """The slow hasher raising an exception whose str() raises too: the
    record is made and counted as a hash error, and no Python error is left
    set (Recorder.record used to raise SystemError); kd_recorder_error
    clears what str() raised."""
    import kdebug.hashing  # noqa: F401 (sets the slow hasher)

    class BadStr(Exception):
        def __str__(self):
            raise RuntimeError("str() of this exception fails")

    class Hostile:
        def is_conj(self):
            raise BadStr()

    class Sub(torch.Tensor):
        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            if func is torch.Tensor.detach:
                return Hostile()
            with torch._C.DisableTorchFunctionSubclass():
                return func(*args, **(kwargs or {}))

    t = torch.randn(3, dtype=torch.cfloat).conj().as_subclass(Sub)  # conj: hashed by Python

    class Mode:
        @property
        def call_depth(self):
            return 2

    def run():
        r = _C.Recorder(1024)
        r.start(Mode(), None)
        prev = _C._set_hash_config(_C.HASH_BITWISE, False, False, 0)
        try:
            ok = r.record(_C.KernelInfo(1, "k", ["out", "x"], [2, 1], 0, -1), (t, torch.zeros(4)))
        finally:
            _C._set_hash_config(*prev)
            r.stop()
        r.drain()
        return ok, r.launch(0).call_depth, r.messages()

    one, two = _both(run)
    assert one == two
    ok, depth, messages = one
    assert ok is True and depth == 3 and any("BadStr" in m for m in messages)


def test_one_pass_runs_python_in_the_two_calls_order():
    """A mode whose call_depth property writes a recorded output: the
    output's post-launch hash is taken after call_depth is read, as the two
    calls take it, so it is the hash of what call_depth wrote."""
    from kdebug import hashing

    w, rd = torch.zeros(4), torch.ones(4)

    class Mode:
        @property
        def call_depth(self):
            w.add_(1)
            return 0

    def run():
        w.zero_()
        r = _C.Recorder(1024)
        r.start(Mode(), None)
        prev = _C._set_hash_config(_C.HASH_BITWISE, True, False, 0)
        try:
            assert r.record(_C.KernelInfo(1, "k", ["w", "r"], [2, 1], 0, -1), (w, rd))
        finally:
            _C._set_hash_config(*prev)
            r.stop()
        r.drain()
        return r.launch(0).hashes[0].post.bitwise

    one, two = _both(run)
    assert one == two == hashing.bitwise(torch.ones(4), on_host=True)
