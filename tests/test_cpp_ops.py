"""Aten ops recorded by the C++ op observer (Note [C++ op observer] in
csrc/kd_op_observer.c), with real torch.compile'd Inductor code on the CPU:
its extern calls (addmm / mm / convolution) under kernels_only, and every
outermost op with op_path='c++'."""
from __future__ import annotations

import threading

import pytest
import torch

import kdebug
from kdebug import DebugMode, testing
import importlib
_cmp = importlib.import_module("kdebug.compare")
from kdebug.calls import _AtenOpCall


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3)
        self.fc1 = torch.nn.Linear(8 * 6 * 6, 32)
        self.fc2 = torch.nn.Linear(32, 16)

    def forward(self, x):
        h = torch.relu(self.conv(x))
        h = torch.relu(self.fc1(h.flatten(1)))
        return self.fc2(h) @ self.fc2.weight


@pytest.fixture(scope="module")
def compiled():
    torch.manual_seed(0)
    net = Net().eval()
    fn = torch.compile(net)
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        fn(x)  # compile outside the recordings
    return fn, x


def _run(fn, x, **flags):
    with torch.no_grad(), DebugMode(**flags) as dm, DebugMode.log_tensor_hashes():
        fn(x)
    return dm


def test_extern_ops_recorded_with_the_python_modes_hashes(compiled):
    fn, x = compiled
    dm = _run(fn, x, kernels_only=True, record_extern_ops=True)
    ext = [op for op in dm.operators if isinstance(op, _AtenOpCall)]
    names = [op.kernel_name for op in ext]
    assert any("convolution" in n for n in names), names
    assert sum(n.startswith(("aten::addmm", "aten::mm")) for n in names) >= 3, names
    # the Python dispatch mode's records of the same ops (upstream parity path)
    py = _run(fn, x)
    py_ops = [op for op in py.operators if isinstance(op, kdebug._upstream._OpCall)]
    by_name = {}
    for op in py_ops:
        by_name.setdefault(kdebug._upstream.get_op_name(op.op), []).append(op)
    for op in ext:
        (written,) = op.written
        mine = op.post_hashes[written]
        theirs = by_name[op.kernel_name].pop(0).log["hash"]
        assert isinstance(mine, float) and mine == theirs, (op.kernel_name, mine, theirs)
    # without record_extern_ops, kernels_only sees none of them
    plain = _run(fn, x, kernels_only=True)
    assert not [op for op in plain.operators if isinstance(op, _AtenOpCall)]
    assert len(plain.kernels) == len(dm.kernels) - len(ext)


def test_kernels_only_extern_needs_kernels_only():
    with pytest.raises(ValueError, match="kernels_only=True"):
        DebugMode(record_extern_ops=True)
    with pytest.raises(ValueError, match="op_path"):
        DebugMode(op_path="C")


def test_compare_names_a_planted_extern_difference(compiled):
    fn, x = compiled
    a = _run(fn, x, kernels_only=True, record_extern_ops=True)
    with testing.perturb_extern_output("addmm", occurrence=1, value=0.5) as st:
        b = _run(fn, x, kernels_only=True, record_extern_ops=True)
    assert st["hits"] == 1
    assert [op.kernel_name for op in a.kernels] == [op.kernel_name for op in b.kernels]
    rep = _cmp.compare(a, b)
    assert rep.divergence is not None
    first = rep.divergence.step_a
    assert first.name.startswith("aten::addmm"), _cmp.format_report(rep)
    # the first addmm (occurrence 0) is the same in both runs: the second is named
    addmms = [i for i, op in enumerate(a.kernels) if op.kernel_name.startswith("aten::addmm")]
    assert first.index == addmms[1], _cmp.format_report(rep)


def test_trace_round_trip(compiled, tmp_path):
    fn, x = compiled
    dm = _run(fn, x, kernels_only=True, record_extern_ops=True)
    dm.save(tmp_path / "run.kdt")
    run = kdebug.load(tmp_path / "run.kdt")
    got = [op for op in run.operators if getattr(op, "kind", None) == "aten"]
    want = [op for op in dm.operators if isinstance(op, _AtenOpCall)]
    assert [o.kernel_name for o in got] == [o.kernel_name for o in want]
    assert [o.post_hashes for o in got] == [o.post_hashes for o in want]
    assert "[aten] aten::addmm" in run.debug_string()


def test_no_recursion_into_kdebugs_own_ops(compiled):
    fn, x = compiled
    with torch.no_grad(), DebugMode(op_path="c++") as dm, DebugMode.log_tensor_hashes(), \
            DebugMode.record_outputs():
        fn(x)
    names = [op.kernel_name for op in dm.operators]
    # record_outputs clones every output through aten::clone: none of them is recorded
    assert not any(n.startswith("aten::clone") for n in names), names
    assert any(op.record for op in dm.kernels if op.kind == "cpp")
    assert any(n.startswith("aten::addmm") for n in names), names


def test_full_cpp_path_records_outermost_ops_only():
    lin = torch.nn.Linear(4, 3)
    x = torch.randn(2, 4)
    with DebugMode(op_path="c++") as dm, DebugMode.log_tensor_hashes():
        y = lin(x)
        z = y.relu_()
    names = [op.kernel_name for op in dm.operators]
    # linear is composite: its decomposition (t, addmm) is nested, not recorded
    assert names == ["aten::linear", "aten::relu_"], names
    relu = dm.operators[1]
    assert relu.roles["self"] == "W"
    assert relu.post_hashes["self"] == pytest.approx(z.abs().sum().item())
    # upstream's mode sees the decomposition instead
    with DebugMode() as up:
        lin(x)
    assert [kdebug._upstream.get_op_name(o.op) for o in up.operators] == ["aten::t", "aten::addmm"]


def _ops_from_thread(fn, x, **flags):
    with torch.no_grad(), DebugMode(**flags) as dm:
        t = threading.Thread(target=fn, args=(x,))
        t.start()
        t.join()
    return dm


def test_threads_follow_the_kernel_rules(compiled):
    fn, x = compiled
    own = _ops_from_thread(fn, x, kernels_only=True, record_extern_ops=True)
    assert own.operators == []  # another Python thread: neither its kernels nor its ops
    every = _ops_from_thread(fn, x, kernels_only=True, record_extern_ops=True, record_all_threads=True)
    kinds = {op.kind for op in every.operators}
    assert kinds == {"cpp", "aten"}, kinds
    assert len({op.thread_id for op in every.operators}) == 1
    assert every.operators[0].thread_id != threading.get_ident()


@pytest.mark.parametrize("outer_all_threads", [False, True])
def test_nested_modes_record_each_op_once(outer_all_threads):
    # one callback of each kind is registered, however many modes are entered:
    # the inner mode takes the op (as it takes kernel launches), once
    x = torch.randn(3, 3)
    with DebugMode(op_path="c++", record_all_threads=outer_all_threads) as outer:
        with DebugMode(op_path="c++") as inner:
            torch.sin(x)
        torch.cos(x)
    assert [op.kernel_name for op in inner.operators] == ["aten::sin"]
    assert [op.kernel_name for op in outer.operators] == ["aten::cos"]
    # every registration was undone: nothing is recorded after the modes
    with DebugMode(kernels_only=True) as after:
        torch.tan(x)
    assert after.operators == []


def test_backward_ops_are_recorded():
    w = torch.randn(4, 4, requires_grad=True)
    x = torch.randn(2, 4)
    with DebugMode(op_path="c++") as dm, DebugMode.log_tensor_hashes():
        (x @ w).sum().backward()
    names = [op.kernel_name for op in dm.operators]
    assert names[:2] == ["aten::matmul", "aten::sum"], names
    # the derivative formulas the engine runs: outermost ops of the backward
    assert any(n.startswith("aten::mm") for n in names[2:]), names
    (g,) = [op for op in dm.operators if op.kernel_name.startswith("aten::mm")][-1:]
    assert g.post_hashes[g.written[0]] == pytest.approx(w.grad.abs().sum().item())


def test_report_of_a_planted_extern_difference(compiled, tmp_path):
    from kdebug import report

    fn, x = compiled
    a = _run(fn, x, kernels_only=True, record_extern_ops=True)
    with testing.perturb_extern_output("mm", occurrence=0, value=0.25):
        b = _run(fn, x, kernels_only=True, record_extern_ops=True)
    a.save(tmp_path / "a.kdt")
    b.save(tmp_path / "b.kdt")
    runs = [kdebug.load(tmp_path / "a.kdt"), kdebug.load(tmp_path / "b.kdt")]
    meta, _ = report.build(runs)
    div = meta["comparisons"][0]["divergence"]
    assert div["a"]["name"] == "aten::mm.out", div
    out = report.write_html(str(tmp_path / "r.html"), runs)
    assert out["records"] == 2 * len(a.operators)
    assert "aten::mm.out" in (tmp_path / "r.html").read_text()


@pytest.mark.gpu
def test_extern_ops_on_the_gpu_hash_as_the_python_mode():
    torch.manual_seed(0)
    lin = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.GELU(), torch.nn.Linear(256, 64)).cuda()
    fn = torch.compile(lin)
    x = torch.randn(32, 256, device="cuda")
    with torch.no_grad():
        fn(x)
    ext = _run(fn, x, kernels_only=True, record_extern_ops=True)
    py = _run(fn, x)
    mine = [(op.kernel_name, op.post_hashes[op.written[0]]) for op in ext.operators if isinstance(op, _AtenOpCall)]
    theirs = [(kdebug._upstream.get_op_name(op.op), op.log["hash"]) for op in py.operators
              if isinstance(op, kdebug._upstream._OpCall) and "mm" in kdebug._upstream.get_op_name(op.op)]
    assert len(mine) >= 2 and [n for n, _ in mine] == [n for n, _ in theirs]
    assert [h for _, h in mine] == [h for _, h in theirs]
    # the stream the op ran on: the current one (the default stream's handle is 0)
    assert all(op.stream == torch.cuda.current_stream().cuda_stream for op in ext.operators
               if isinstance(op, _AtenOpCall))


@pytest.mark.gpu
def test_the_backwards_extern_ops_are_recorded_on_autograds_thread():
    """On CUDA autograd runs the compiled backward on its device thread,
    where the Python-side recording state is empty: the backward's extern
    calls (the weight and input gradients' mm) are recorded all the same,
    with the same names and hashes as the Python mode's records of them."""
    torch.manual_seed(0)
    lin = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.GELU(), torch.nn.Linear(256, 64)).cuda()
    fn = torch.compile(lin)
    x = torch.randn(32, 256, device="cuda")

    def step():
        lin.zero_grad(set_to_none=True)
        fn(x).pow(2).sum().backward()

    step()
    runs = {}
    for flags in ({"kernels_only": True, "record_extern_ops": True}, {}):
        with DebugMode(**flags) as dm, DebugMode.log_tensor_hashes():
            step()
        runs[bool(flags)] = dm
    main = threading.get_ident()
    ext = [op for op in runs[True].operators if isinstance(op, _AtenOpCall)]
    mine = [(op.kernel_name, op.post_hashes[op.written[0]]) for op in ext]
    theirs = [(kdebug._upstream.get_op_name(op.op), op.log["hash"]) for op in runs[False].operators
              if isinstance(op, kdebug._upstream._OpCall) and "mm" in kdebug._upstream.get_op_name(op.op)]
    assert len(mine) >= 5 and sorted(mine) == sorted(theirs), (mine, theirs)  # forward 2, backward 3 or more
    assert sum(op.thread_id != main for op in ext) >= 3  # the backward's, from autograd's thread


def test_check_hash_mismatches_sees_aten_records(compiled):
    fn, x = compiled
    a = _run(fn, x, kernels_only=True, record_extern_ops=True)
    same = _run(fn, x, kernels_only=True, record_extern_ops=True)
    assert DebugMode.check_hash_mismatches(a.operators, same.operators) == []
    with testing.perturb_extern_output("mm", value=0.5):
        b = _run(fn, x, kernels_only=True, record_extern_ops=True)
    (m,) = [d for d in DebugMode.check_hash_mismatches(a.operators, b.operators) if d["call_type"] == "aten op"]
    assert m["call"] == "aten::mm.out" and m["arg_name"] == "out" and m["hash1"] != m["hash2"]


def _names_roles(op):
    return list(op.roles.items())


def test_op_names_interned_once_match_the_schema_on_every_record():
    """Note [Op names interned once] (csrc/kd_torch.cpp): an op's names are
    interned at its first record on a thread and reused; the records of the
    first call, of later calls, and of ops that take the per-call path
    (tensor lists, several results) carry the schema's names and roles."""
    a, b, out = torch.randn(3), torch.randn(3), torch.empty(3)
    with DebugMode(op_path="c++") as dm:
        for _ in range(3):
            torch.add(a, b)
        torch.add(a, b, out=out)
        torch.cat([a, b])
        torch.max(torch.stack([a, b]), dim=0)
        c = a.clone()
        c.relu_()
        c.relu_()
    by = {}
    for op in dm.operators:
        by.setdefault(op.kernel_name, []).append(op)
    adds = by["aten::add.Tensor"]
    assert len(adds) == 3
    # aten::add.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor
    assert all(_names_roles(op) == [("self", "R"), ("other", "R"), ("alpha", "R"), ("result", "W")] for op in adds)
    # out=: the written argument is the result (no separate result argument)
    assert _names_roles(by["aten::add.out"][0]) == [("self", "R"), ("other", "R"), ("alpha", "R"), ("out", "W")]
    # a tensor list: one argument per tensor, named by its index (the per-call path)
    assert [n for n, _ in _names_roles(by["aten::cat"][0])] == ["tensors[0]", "tensors[1]", "dim", "result"]
    # several results, named by the schema: max.dim(...) -> (Tensor values, Tensor indices)
    assert _names_roles(by["aten::max.dim"][0])[-2:] == [("values", "W"), ("indices", "W")]
    # in place: relu_(Tensor(a!) self) -> Tensor(a!), the first record and the reused names alike
    assert [_names_roles(op) for op in by["aten::relu_"]] == [[("self", "W")]] * 2


def test_op_names_follow_a_reregistered_op():
    """A custom op dropped and defined again with other argument names: the
    records name the arguments of the schema in force (the op info slot is
    refilled at a registration, Note [Op info cache]; its interned names with
    it)."""
    def define(arg):
        lib = torch.library.Library("kdtest_names", "DEF")
        lib.define(f"f(Tensor {arg}) -> Tensor")
        lib.impl("f", lambda t: t + 1, "CompositeExplicitAutograd")
        return lib

    x = torch.randn(2)
    lib = define("first")
    with DebugMode(op_path="c++") as dm:
        torch.ops.kdtest_names.f(x)
        torch.ops.kdtest_names.f(x)
    lib._destroy()
    del lib
    lib = define("second")
    try:
        with DebugMode(op_path="c++") as dm2:
            torch.ops.kdtest_names.f(x)
    finally:
        lib._destroy()
    firsts = [op for op in dm.operators if op.kernel_name == "kdtest_names::f"]
    assert len(firsts) == 2 and all(list(op.roles)[0] == "first" for op in firsts)
    second = [op for op in dm2.operators if op.kernel_name == "kdtest_names::f"]
    assert len(second) == 1 and list(second[0].roles)[0] == "second", [list(op.roles) for op in dm2.operators]


def test_a_tensor_list_result_is_named_on_a_threads_first_record():
    """A tensor-list result (unbind.int(Tensor self, int dim) -> Tensor[]) is
    named per element from its result name: "result[0]", "result[1]", also
    as the first op recorded on a fresh thread, where the reused-name path
    once read an empty name buffer ("[0]", "[1]")."""
    x = torch.randn(2, 3)

    def work():
        torch.unbind(x)
        torch.unbind(x)

    with DebugMode(op_path="c++", record_all_threads=True) as dm:
        t = threading.Thread(target=work)
        t.start()
        t.join()
    unbinds = [list(op.roles) for op in dm.operators if op.kernel_name == "aten::unbind.int"]
    assert unbinds == [["self", "dim", "result[0]", "result[1]"]] * 2, unbinds


def test_the_extern_observer_sees_no_op_outside_a_compiled_graphs_call():
    """Note [Op observer gated by graph calls]: under record_extern_ops the
    observer's callback is disabled on the thread outside compiled graph
    calls, so the step's eager ops (the loss, autograd's, the optimizer's)
    are not even boxed for it; inside the forward's and the backward's calls
    it runs and records their extern calls as the Python mode sees them."""
    from kdebug import _C

    torch.manual_seed(0)
    lin = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 8))
    fn = torch.compile(lin)
    x = torch.randn(4, 16)
    opt = torch.optim.SGD(lin.parameters(), lr=0.1)

    def step():
        lin.zero_grad(set_to_none=True)
        fn(x).pow(2).sum().backward()

    step()
    # the Python mode's records of the graphs' matmuls, before the optimizer moves the weights
    with DebugMode() as py, DebugMode.log_tensor_hashes():
        step()
    eager = [torch.randn(3, 3) for _ in range(4)]
    with DebugMode(kernels_only=True, record_extern_ops=True) as dm, DebugMode.log_tensor_hashes():
        s0 = _C._op_observer_starts()
        for _ in range(20):  # eager ops, out of any graph call
            torch.mm(eager[0], eager[1], out=eager[2])
            eager[3].add_(1)
        torch._foreach_mul_(eager, 1.0)
        s1 = _C._op_observer_starts()
        step()
        s2 = _C._op_observer_starts()
        opt.step()
        eager[3].sin()
        s3 = _C._op_observer_starts()
    assert s1 == s0, "the observer ran for eager ops outside any compiled graph's call"
    assert s2 > s1, "the observer never ran inside the compiled graphs' calls"
    assert s3 == s2, "the observer ran for the optimizer's eager ops"
    # what it records inside the calls is what the Python mode recorded of the graphs' matmuls
    mine = sorted((op.kernel_name, op.post_hashes[op.written[0]]) for op in dm.operators
                  if isinstance(op, _AtenOpCall) and "mm" in op.kernel_name)
    theirs = sorted((kdebug._upstream.get_op_name(op.op), op.log["hash"]) for op in py.operators
                    if isinstance(op, kdebug._upstream._OpCall) and "mm" in kdebug._upstream.get_op_name(op.op))
    assert len(mine) >= 4 and mine == theirs, (mine, theirs)  # forward 2, backward 2 or more


@pytest.mark.parametrize("order", ["all_outside", "all_inside"])
def test_a_recorder_of_every_op_keeps_the_observer_open(order):
    """While a DebugMode(op_path='c++') is started, the shared thread-local
    callback stays on outside graph calls (it records every op there), in
    either nesting with a record_extern_ops mode; once it ends, the extern
    mode's gate closes again."""
    from kdebug import _C

    x = torch.randn(3, 3)
    ext = DebugMode(kernels_only=True, record_extern_ops=True)
    every = DebugMode(op_path="c++")
    outer, inner = (every, ext) if order == "all_outside" else (ext, every)
    with outer:
        with inner:
            torch.sin(x)
        s0 = _C._op_observer_starts()
        torch.cos(x)
        seen_between = _C._op_observer_starts() - s0
    assert seen_between == (1 if order == "all_outside" else 0)
    if order == "all_outside":
        assert [op.kernel_name for op in every.operators] == ["aten::cos"]
    else:
        assert [op.kernel_name for op in every.operators] == ["aten::sin"]
    with ext.__class__(kernels_only=True, record_extern_ops=True):
        s0 = _C._op_observer_starts()
        torch.tan(x)
        assert _C._op_observer_starts() == s0


@pytest.mark.parametrize("all_threads", [False, True])
def test_a_graph_called_inside_an_eager_op_stays_nested_in_it(all_threads):
    """Only outermost ops are recorded: a compiled graph that a custom op's
    Python kernel calls runs nested in that op, so its extern calls are not
    recorded (upstream's mode does not see them either), whether the
    thread-local observer was switched off when the outer op started (its
    depth-only twin counts it: Note [Op observer gated by graph calls]) or the
    global one (record_all_threads) never is; the same graph called directly
    is recorded."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(16, 8)
    fn = torch.compile(lambda t: torch.relu(lin(t)) * 2)
    x = torch.randn(4, 16)

    @torch.library.custom_op("kdtest_gate::outer", mutates_args=())
    def outer(t: torch.Tensor) -> torch.Tensor:
        return fn(t).clone()

    with torch.no_grad():
        outer(x)
        with DebugMode(kernels_only=True, record_extern_ops=True, record_all_threads=all_threads) as dm:
            outer(x)
            direct_from = len(dm.operators)
            fn(x)
    ext = [(i, op.kernel_name) for i, op in enumerate(dm.operators) if isinstance(op, _AtenOpCall)]
    assert [n for _, n in ext] == ["aten::addmm.out"], ext
    assert ext[0][0] >= direct_from, ext  # the direct call's, not the nested one's
    # the nested graph's kernels are still recorded (kernel launches are recorded at any depth)
    assert any(getattr(op, "kind", None) == "cpp" for op in dm.operators[:direct_from]), dm.operators


def _record_fields(dm) -> list:
    """Every recorded launch and extern op of dm as plain data, without what
    differs between two runs of the same code (addresses, times, threads)."""
    out = []
    for op in dm.kernels:
        tensors = {n: (t.role, t.dtype, tuple(t.shape), tuple(t.stride), t.storage_offset, str(t.device))
                   for n, t in op.tensor_info.items()}
        out.append((op.kernel_name, op.roles, tensors, repr(op.pre_hashes), repr(op.post_hashes), op.grid,
                    op.raised, str(op.device)))
    return out


@pytest.mark.parametrize("hash_fn", ["norm", ["bitwise", "hash_tensor"], ["bitwise", "stats"]])
def test_extern_records_made_in_one_pass_equal_the_two_call_records(compiled, hash_fn):
    """Note [Records made in one pass]: an extern op recorded after it ran is
    described and hashed in one pass; its record (arguments, roles, hashes
    of what it read before and wrote after) is the one the launch path's two
    calls made."""
    fn, x = compiled

    def run():
        with torch.no_grad(), DebugMode(kernels_only=True, record_extern_ops=True) as dm, \
                DebugMode.log_tensor_hashes(hash_fn=hash_fn, hash_inputs=True):
            fn(x)
        return dm

    one = run()
    with testing.two_call_records():
        two = run()
    ext = [op for op in one.kernels if isinstance(op, _AtenOpCall)]
    assert len(ext) >= 4 and all(op.pre_hashes and op.post_hashes for op in ext)
    assert _record_fields(one) == _record_fields(two)
