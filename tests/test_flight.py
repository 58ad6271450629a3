"""kdebug.FlightRecorder (Note [Flight recorder] in kdebug/flight.py) on real
Inductor C++ kernels: per-step digests, bounded memory, dumps on an exception
and on SIGTERM, and two gloo ranks (torch.distributed.run) that match or where
rank 1's kernel output is perturbed at one step."""
from __future__ import annotations

import contextlib
import json
import re
import os
import signal
import subprocess
import sys

import pytest
import torch
from typing import NamedTuple

import kdebug
from kdebug import DebugMode, _C
import kdebug.testing
from kdebug.flight import Divergence, RowsCompared, compare_rows

from flight_worker import make_step

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
WORKER = os.path.join(HERE, "flight_worker.py")


def _env():
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), OMP_NUM_THREADS="1")
    return env


def _markers(run) -> list[str]:
    return [op._text for op in run.operators if not isinstance(op, kdebug._KernelCall)]


def test_step_digests_name_the_perturbed_step(tmp_path):
    """Two recordings of the same steps give the same digests; perturbing one
    kernel output at step 3 changes the digest from step 3 on, not before."""
    runs = []
    for perturb in (False, True):
        step = make_step()
        step(0)
        fr = kdebug.FlightRecorder(every=6, keep_steps=2, trace=str(tmp_path / f"{perturb}.kdt"), compare="all")
        with fr:
            for i in range(6):
                if perturb and i == 3:
                    with kdebug.testing.perturb_kernel_output("cpp_fused_relu", "in_out_ptr0") as hit:
                        step(i)
                    assert hit["hits"] == 1
                else:
                    step(i)
                fr.step()
        fr.close()
        assert fr.divergence is None and fr.stats["compares"] == 0  # no process group: nothing to compare
        assert fr.dumped is None
        runs.append(list(fr.digests))
    a, b = runs
    assert [d.step for d in a] == list(range(6)) == [d.step for d in b]
    assert all(d.complete and d.launches == 3 for d in a + b)
    assert [x.digest for x in a[:3]] == [x.digest for x in b[:3]]
    assert all(x.digest != y.digest for x, y in zip(a[3:], b[3:]))


def test_memory_stays_bounded(tmp_path):
    """Over 40 steps only the last keep_steps steps' launches stay held
    after each compare, and at most every - 1 more steps' in between (they
    stay in the ring: Note [Steps held in the ring]); older steps keep one
    digest each (keep_digests of them)."""
    step = make_step()
    step(0)
    fr = kdebug.FlightRecorder(every=5, keep_steps=3, keep_digests=10, trace=str(tmp_path / "b.kdt"))
    sizes = []
    with fr:
        for i in range(40):
            step(i)
            fr.step()
            sizes.append(fr.kept_launches)
    fr.close()
    per_step = 3
    assert max(sizes) == (3 + 5 - 1) * per_step  # the 3 kept, and the steps since the last compare
    assert [sizes[i] for i in range(4, 40, 5)] == [3 * per_step] * 8
    assert fr.stats["forgotten_launches"] == 40 * per_step - 3 * per_step
    assert [d.step for d in fr.digests] == list(range(30, 40))
    assert fr.stats["digests_dropped"] == 30
    run = kdebug.load(fr.dump())
    assert _markers(run) == [f"kdebug flight recorder: step {s}" for s in (37, 38, 39)]
    assert len(run.kernels) == 3 * per_step
    assert [s["step"] for s in run.meta["flight"]["steps"]] == [37, 38, 39]
    assert [int(s["digest"], 16) for s in run.meta["flight"]["steps"]] == [d.digest for d in list(fr.digests)[-3:]]


def test_the_ring_is_resident_before_the_first_launch(tmp_path):
    """Note [Ring prefault]: the flight recorder touches its ring's pages when
    it is made, so no launch pays a page fault on the first lap (touching
    them again faults in almost none: without the prefault, every one of the
    32768 pages of the default ring would fault here); a recorder that is recording
    refuses, and the launches it recorded are unchanged by a prefault."""
    import resource

    fr = kdebug.FlightRecorder(every=5, keep_steps=3, trace=str(tmp_path / "p.kdt"))
    who = getattr(resource, "RUSAGE_THREAD", resource.RUSAGE_SELF)
    f0 = resource.getrusage(who).ru_minflt
    touched = fr._rec.prefault()
    faults = resource.getrusage(who).ru_minflt - f0
    assert touched == fr._rec.capacity * 128 and faults < touched // 4096 // 100, (touched, faults)
    step = make_step()
    step(0)
    with fr:
        step(1)
        with pytest.raises(RuntimeError, match="before start"):
            fr._rec.prefault()
        fr.step()
    fr.close()
    run = kdebug.load(fr.dump())
    assert fr.stats["steps"] == 1 and len(run.kernels) == 3  # make_step: 3 launches per step


def test_a_dropped_recorder_frees_its_ring_without_a_collection(tmp_path, monkeypatch):
    """A recorder no longer referenced is freed by reference counting (no
    cycle through its DebugMode), so its resident ring goes back at once
    (kept for reuse with at most its first 16 MB resident: Note [Spare
    rings]); a ring above kdebug.flight._PREFAULT_MAX_BYTES is not touched up
    front (it stays lazily mapped until prefault() or launches touch it)."""
    import gc
    import weakref

    # the first DebugMode of a process: upstream's DebugMode.__init__ imports a module
    # lazily (_ensure_annotate_decorated -> torch.__getattr__, torch 2.13), whose frames
    # stay referenced and keep that first caller alive; made here, not by the recorder
    kdebug.DebugMode(kernels_only=True, ring_capacity=16)
    gc.disable()
    try:
        fr = kdebug.FlightRecorder(every=5, keep_steps=3, trace=str(tmp_path / "w.kdt"))
        with fr:
            fr.step()
        fr.close()
        ref = weakref.ref(fr)
        assert fr._rec.resident() == fr._rec.capacity * 128  # prefaulted whole
        del fr
        assert ref() is None
        # the next DebugMode of that size takes a kept ring: none holds more than 16 MB resident
        again = kdebug.DebugMode(kernels_only=True)
        assert again._recorder.capacity == 1 << 20 and 0 < again._recorder.resident() <= 16 << 20
        del again
    finally:
        gc.enable()
    monkeypatch.setattr(kdebug.flight, "_PREFAULT_MAX_BYTES", 1 << 20)
    # rings of this size released by earlier tests of this process are kept for reuse, resident
    # (Note [Spare rings]: at most 4): these DebugModes take them, so the recorder's ring is a new mapping
    holders = [kdebug.DebugMode(kernels_only=True, ring_capacity=1 << 16) for _ in range(4)]
    lazy = kdebug.FlightRecorder(every=5, keep_steps=3, trace=str(tmp_path / "l.kdt"), ring_capacity=1 << 16)
    assert lazy._rec.resident() == 0
    touched = lazy._rec.prefault()
    assert touched == (1 << 16) * 128 and lazy._rec.resident() == touched
    lazy.close()
    del holders


def test_step_counters_and_early_drain(tmp_path):
    """step() reads the recorder's O(1) counters (seen, slots_used, capacity),
    which agree with stats() (whose lost-launch count walks the unread ring);
    a ring more than half full is drained early, and no launch is lost."""
    step = make_step()
    step(0)
    fr = kdebug.FlightRecorder(every=10**6, keep_steps=2, ring_capacity=64, trace=str(tmp_path / "c.kdt"))
    rec = fr._rec
    with fr:
        for i in range(12):
            step(i)
            s = rec.stats()
            assert (rec.seen, rec.slots_used, rec.capacity) == (s["seen"], s["slots_used"], s["capacity"])
            fr.step()
    fr.close()
    assert rec.capacity == 64
    assert fr.stats["early_drains"] > 0 and fr.stats["compares"] == 0
    assert rec.stats()["dropped"] == 0 and rec.seen == 12 * 3
    run = kdebug.load(fr.dump())
    assert [s["step"] for s in run.meta["flight"]["steps"]] == [10, 11]
    assert all(s["recorded"] == s["launches"] == 3 for s in run.meta["flight"]["steps"])


def test_per_step_context_and_optimizer_hook(tmp_path):
    """`with fr:` once per step ends a step on leaving it; attach(optimizer)
    ends one per optimizer.step()."""
    step = make_step()
    step(0)
    fr = kdebug.FlightRecorder(every=100, keep_steps=2, trace=str(tmp_path / "c.kdt"))
    for i in range(3):
        with fr:
            step(i)
    assert fr.stats["steps"] == 3
    torch.manual_seed(0)
    m = torch.nn.Linear(4, 4)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    cm = torch.compile(m)
    cm(torch.randn(2, 4)).sum().backward()
    fr2 = kdebug.FlightRecorder(every=100, keep_steps=2, trace=str(tmp_path / "d.kdt"))
    handle = fr2.attach(opt)
    with fr2:
        for _ in range(4):
            cm(torch.randn(2, 4)).sum().backward()
            opt.step()
    handle.remove()
    fr.close()
    fr2.close()
    assert fr2.stats["steps"] == 4


def test_dump_on_exception(tmp_path):
    """An exception leaving the block dumps the kept steps and the open one."""
    step = make_step()
    step(0)
    fr = kdebug.FlightRecorder(every=2, keep_steps=2, trace=str(tmp_path / "e.kdt"))
    with pytest.raises(RuntimeError, match="planted"):
        with fr:
            for i in range(10):
                step(i)
                if i == 3:
                    raise RuntimeError("planted failure at step 3")
                fr.step()
    fr.close()
    assert fr.dumped == str(tmp_path / "e.kdt")
    run = kdebug.load(fr.dumped)
    assert _markers(run) == [f"kdebug flight recorder: step {s}" for s in (1, 2, 3)]
    assert len(run.kernels) == 9
    assert "RuntimeError" in run.meta["flight"]["reason"]
    assert "planted failure" in (tmp_path / "e.kdt.txt").read_text()


@pytest.mark.parametrize("previous", ["default", "handler"])
def test_dump_on_sigterm(tmp_path, previous):
    """SIGTERM to a process recording a loop: it dumps, then the signal does
    what it did before (the default: the process ends by SIGTERM; a handler of
    the program's own: it runs)."""
    p = subprocess.Popen([sys.executable, WORKER, str(tmp_path), "signal", previous], env=_env(),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "ready", p.stderr.read()
        p.send_signal(signal.SIGTERM)
        rc = p.wait(timeout=60)
    finally:
        p.kill()
    err = p.stderr.read()
    if previous == "default":
        assert rc == -signal.SIGTERM, err
    else:
        assert rc == 3, err
        assert (tmp_path / "own_handler_ran").read_text() == str(int(signal.SIGTERM))
    run = kdebug.load(str(tmp_path / "sig.kdt"))
    assert run.meta["flight"]["reason"] == "signal SIGTERM"
    steps = [s["step"] for s in run.meta["flight"]["steps"]]
    assert len(steps) >= 2 and steps[0] >= 3 and len(run.kernels) >= 6
    assert all(k.kernel_name.startswith("cpp_fused_") and k.post_hashes for k in run.kernels)


def test_compare_rows():
    """The verdict from gathered rows (step, launches, lost, digest)."""
    same = [(0, 3, 0, 11), (1, 3, 0, 12), (2, 3, 0, 13)]
    assert compare_rows([same, same, same]) == RowsCompared(None, 0, (0, 1, 2))
    bad = [(0, 3, 0, 11), (1, 3, 0, 99), (2, 3, 0, 98)]
    res = compare_rows([same, same, bad])
    assert res.divergence == Divergence(step=1, detected_at=-1, ranks=(2,), groups={12: (0, 1), 99: (2,)},
                                        reference=(0, 1))
    assert res.compared == (0, 1)  # up to the divergence
    # a step where some rank lost launches is not compared
    lossy = [(0, 3, 0, 11), (1, 3, 1, 77), (2, 3, 0, 98)]
    res = compare_rows([same, lossy])
    assert (res.divergence.step, res.divergence.ranks, res.skipped) == (2, (1,), 1)
    # two ranks, no majority: rank 0's side is the reference
    res = compare_rows([bad, same])
    assert res.divergence.ranks == (1,) and res.divergence.reference == (0,)
    # Note [Reading results without waiting]: a rank whose GPU hashes for step 2 are not
    # read back yet sends steps 0-1 only: steps 0-1 are compared, step 2 waits (even where it
    # differs on the other rank)
    late = same[:2]
    assert compare_rows([bad[:1] + same[1:2] + bad[2:], late]) == RowsCompared(None, 0, (0, 1))
    # rows of a step the other rank sent at the last compare are compared now
    res = compare_rows([[(2, 3, 0, 98), (3, 3, 0, 14)], [(2, 3, 0, 13), (3, 3, 0, 14)]])
    assert res.divergence.step == 2 and res.compared == (2,)


def test_two_ranks_gloo(tmp_path):
    """Two gloo ranks under torch.distributed.run.  Replicas that match: no
    dump.  Rank 1's ReLU output perturbed at step 4, compares every 3 steps:
    the compare after step 5 sees step 4 first differ, names rank 1, and both
    ranks dump traces that kdebug diff reads down to the ReLU kernel.  The
    worker keeps 1 step (keep_steps=1): steps 3-5, not compared until then,
    are held for the dump all the same."""
    out = tmp_path
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           WORKER, str(out), "ranks", "4", "8", "3"]
    r = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    res = [json.loads((out / f"rank{k}.json").read_text()) for k in range(2)]
    for k in range(2):
        m, f = res[k]["match"], res[k]["fault"]
        assert m["divergence"] is None and m["dumped"] is None and m["stats"]["compares"] == 2
        assert f["divergence"] == {"step": 4, "detected_at": 5, "ranks": [1]}
        assert f["dumped"] == str(out / f"fault.rank{k}.kdt")
    assert res[0]["match"]["digests"] == res[1]["match"]["digests"]
    assert not any(n.startswith("match") for n in os.listdir(out))
    d0, d1 = res[0]["fault"]["digests"], res[1]["fault"]["digests"]
    assert d0[:4] == d1[:4] and d0[4][3] != d1[4][3]
    for k in range(2):
        run = kdebug.load(str(out / f"fault.rank{k}.kdt"))
        fm = run.meta["flight"]
        assert (fm["rank"], fm["world_size"], fm["divergence"]["step"], fm["divergence"]["ranks"]) == (k, 2, 4, [1])
        assert [s["step"] for s in fm["steps"]] == [3, 4, 5]
        text = (out / f"fault.rank{k}.kdt.txt").read_text()
        assert "first at step 4" in text and "differing rank(s): 1" in text
    diff = subprocess.run([sys.executable, "-m", "kdebug", "diff", str(out / "fault.rank0.kdt"),
                           str(out / "fault.rank1.kdt")], env=_env(), capture_output=True, text=True, timeout=60)
    assert "FIRST DIVERGENCE: kernel #12 cpp_fused_relu_0" in diff.stdout, diff.stdout + diff.stderr


def test_closure_steps_compare_from_the_closures_gradients_and_leaving_never_closes_a_tail(tmp_path):
    """LBFGS runs the forward and backward inside step(closure), each rank
    on its own data: the compared range starts after the closure's last
    call, with the gradients it left, so only the two replica records are in
    a step's digest.  Launches after the last optimizer step (an evaluation
    on one rank) stay in the open step when the block is left: closing them
    as a step of this rank only would make its compare a collective the
    other ranks never join."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    cm = torch.compile(model)
    x = torch.randn(16, 8)
    opt = torch.optim.LBFGS(model.parameters(), max_iter=3)

    def closure():
        opt.zero_grad()
        loss = cm(x).square().mean()
        loss.backward()
        return loss

    opt.step(closure)  # compiled, and LBFGS's state created
    fr = kdebug.FlightRecorder(every=2, keep_steps=2, trace=str(tmp_path / "l.kdt"))
    fr.attach(opt, model)
    with fr:
        for _ in range(4):
            opt.step(closure)
        seen = fr._rec.seen
        cm(x)  # after the last step: stays in the open step
    assert fr._rec.seen > seen and fr._step == 4 and fr.stats["steps"] == 4
    assert [d.launches for d in fr.digests] == [2, 2, 2, 2], list(fr.digests)
    recs = [k for k in kdebug.load(fr.dump()).kernels if k.kernel_name.startswith("kdebug::flight")]
    assert [k.kernel_name for k in recs[-2:]] == ["kdebug::flight_grads", "kdebug::flight_state"]


def test_replicas_hash_only_inside_the_optimizer_window(tmp_path):
    """compare="replicas" with hashes="compared" (the default) hashes the
    launches inside attach()'s optimizer window (here the compiled model run
    once more by a step pre-hook, inside the window) and the replica
    records; the forward and backward launches are recorded without hashes
    (Note [What the flight recorder hashes]).  hashes="all" hashes them
    too, and the compared digests are the same either way.  An optimizer
    step that raises inside the window leaves no hashing switched on."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    init = {k: v.clone() for k, v in model.state_dict().items()}
    cm = torch.compile(model)
    x = torch.randn(16, 8)
    cm(x)
    digests, kernels = {}, {}
    for hashes in ("compared", "all"):
        model.load_state_dict(init)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        fr = kdebug.FlightRecorder(every=100, keep_steps=3, trace=str(tmp_path / f"{hashes}.kdt"), hashes=hashes)
        handle = fr.attach(opt, model)
        def launch_inside(*_):  # registered after attach's pre-hook: runs inside the window
            cm(x)

        inside = opt.register_step_pre_hook(launch_inside)
        with fr:
            for _ in range(3):
                opt.zero_grad()
                cm(x).square().mean().backward()
                opt.step()
        inside.remove()
        handle.remove()
        fr.close()
        kernels[hashes] = kdebug.load(fr.dump()).kernels
        digests[hashes] = [(d.step, d.launches, d.digest) for d in fr.digests]
    for hashes, ks in kernels.items():
        names = [k.kernel_name for k in ks]
        window, outside = [], []
        for i, k in enumerate(ks):
            opened = names[:i].count("kdebug::flight_grads") > names[:i].count("kdebug::flight_state")
            (window if opened or k.kernel_name.startswith("kdebug::flight") else outside).append(k)
        assert len(window) == 3 * 3 and len(outside) > 3 * 2, names  # grads, the pre-hook's launch, state
        assert all(k.post_hashes for k in window), hashes
        if hashes == "compared":
            assert not any(k.post_hashes for k in outside), [(k.kernel_name, k.post_hashes) for k in outside]
        else:
            assert all(k.post_hashes for k in outside if k.kind == "cpp")
    assert digests["compared"] == digests["all"] and len(digests["all"]) == 3
    # the window's hashing is the optimizer step's: one that raises inside it leaves none switched on
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    fr = kdebug.FlightRecorder(every=100, keep_steps=2, trace=str(tmp_path / "raise.kdt"))
    fr.attach(opt, model)

    def boom(*_):
        raise RuntimeError("planted")

    opt.register_step_pre_hook(boom)
    with pytest.raises(RuntimeError, match="planted"), fr:
        cm(x).square().mean().backward()
        opt.step()
    fr.close()
    assert not fr._window_open and fr._rec.hash_window(0, 0) == 0 and fr.dumped
    with DebugMode(kernels_only=True) as dm:
        cm(x)
    assert dm.operators and not any(k.post_hashes for k in dm.operators)


def test_optimizer_windows_need_no_order_among_step_hooks(tmp_path):
    """The window's hashing is a count on the recorder (Note [Hash windows]
    in csrc/kd_launch.c), not a context on the thread's stack: torch runs
    step pre- and post-hooks in registration order, so two recorders
    attached to one optimizer, and a user's own log_tensor_hashes("stats")
    opened in a pre-hook and closed in a post-hook, close in the order they
    opened.  Every step runs, each recorder digests its windows, the user's
    stats stay on the window's launches (the bitwise hash is added, not put
    in their place), and nothing is left hashing afterwards."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    cm = torch.compile(model)
    x = torch.randn(16, 8)
    cm(x)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    outer = kdebug.FlightRecorder(every=100, keep_steps=3, trace=str(tmp_path / "outer.kdt"))
    inner = kdebug.FlightRecorder(every=100, keep_steps=3, trace=str(tmp_path / "inner.kdt"))
    outer.attach(opt, model)
    inner.attach(opt, model)
    user = {}

    def user_open(*_):
        user["ctx"] = DebugMode.log_tensor_hashes("stats")
        user["ctx"].__enter__()
        cm(x)  # inside every window, and inside the user's context

    def user_close(*_):
        user.pop("ctx").__exit__(None, None, None)

    opt.register_step_pre_hook(user_open)
    opt.register_step_post_hook(user_close)
    with outer:
        with inner:
            for _ in range(3):
                opt.zero_grad()
                cm(x).square().mean().backward()
                opt.step()
    for fr in (outer, inner):
        fr.close()
        assert not fr._window_open and fr._rec.hash_window(0, 0) == 0
    kernels = kdebug.load(inner.dump()).kernels
    # the inner recorder is the thread's active one: the outer's records land in it too, and its
    # window (its grads record .. its state record) holds its grads, the user's launch, the outer's
    # state record and its own
    assert [d.launches for d in inner.digests] == [4, 4, 4], list(inner.digests)
    window = [k for k in kernels if k.kernel_name == "cpp_fused_relu_0" and k.post_hashes]
    assert len(window) == 3 and all(isinstance(v, kdebug.hashing.Stats) for k in window for v in k.post_hashes.values())
    with DebugMode(kernels_only=True) as dm:
        cm(x)
    assert dm.operators and not any(k.post_hashes for k in dm.operators)


def test_replica_records_read_a_replicate_dtensor_s_local_tensor_at_every_step(tmp_path):
    """A Replicate DTensor parameter is recorded by its local tensor, which
    module.double().float() replaces under the same Parameter object: the
    state record after it hashes the new local tensor, not the planned one."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, distribute_module, distribute_tensor
    from kdebug import hashing

    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        torch.manual_seed(0)
        model = distribute_module(torch.nn.Linear(4, 4), mesh)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        x = distribute_tensor(torch.randn(2, 4), mesh, [Replicate()])
        fr = kdebug.FlightRecorder(every=1000, trace=str(tmp_path / "dt.kdt"))
        fr.attach(opt, model)

        def step():
            opt.zero_grad()
            model(x).sum().backward()
            opt.step()

        with fr:
            step()
            weight, local = model.weight, model.weight.to_local()
            model.double().float()
            assert model.weight is weight and model.weight.to_local() is not local
            step()
        fr.close()
        states = [k for k in kdebug.load(fr.dump()).kernels if k.kernel_name == "kdebug::flight_state"]
        assert states[-1].post_hashes["weight"] == hashing.bitwise(model.weight.to_local(), on_host=True)
        assert states[0].post_hashes["weight"] != states[-1].post_hashes["weight"]
    finally:
        dist.destroy_process_group()


def test_replicated_marks_are_records_compared_with_their_step(tmp_path):
    """kdebug.replicated(t, name) under a FlightRecorder is a record
    (kdebug::flight_replicated) hashed bitwise outside the optimizer window
    too, part of its step's compared digest with the window, held and
    forgotten with its step (the recorder's op list does not grow).  A
    marked value changed at step 2 changes the digests from step 2 on, not
    before."""
    from kdebug import hashing

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    init = {k: v.clone() for k, v in model.state_dict().items()}
    cm = torch.compile(model)
    x = torch.randn(16, 8)
    cm(x)
    runs = {}
    for planted in (False, True):
        model.load_state_dict(init)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        fr = kdebug.FlightRecorder(every=100, keep_steps=2, trace=str(tmp_path / f"{planted}.kdt"))
        fr.attach(opt, model)
        with fr:
            for i in range(6):
                opt.zero_grad()
                loss = cm(x).square().mean()
                loss.backward()
                marked = loss.detach() + (1.0 if planted and i == 2 else 0.0)
                kdebug.replicated(marked, "loss")  # outside the window: before opt.step()
                opt.step()
        fr.close()
        # nothing piles up in the recorder's op list: it holds the kept launches' views only
        assert not [o for o in fr._dm._ops if "replicated" in str(o) and "flight_replicated" not in str(o)]
        assert len(fr._dm._ops) <= fr.kept_launches
        run = kdebug.load(fr.dump())
        marks = [k for k in run.kernels if k.kernel_name == "kdebug::flight_replicated"]
        assert len(marks) == 2 and marks[-1].post_hashes["loss"] == hashing.bitwise(marked, on_host=True)
        assert set(fr._marks) <= {4, 5}  # forgotten with their steps
        runs[planted] = [(d.step, d.launches, d.digest) for d in fr.digests]
    plain, planted = runs[False], runs[True]
    assert [n for _, n, _ in plain] == [3] * 6  # grads, state, the mark
    assert plain[:2] == planted[:2] and plain[2] != planted[2]


def test_replica_state_list_follows_the_optimizer(tmp_path):
    """The parameter and state list a replica record hashes is reused between
    steps only while it is still right: state created lazily (a parameter
    that got its first gradient later), state replaced by load_state_dict,
    and a new param group all show up in the next record."""
    a, b = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)
    opt = torch.optim.AdamW(a.parameters())
    fr = kdebug.FlightRecorder(every=1000, keep_steps=2, trace=str(tmp_path / "s.kdt"))

    def names():
        return [n for n, _ in fr._state_of(opt)]

    def same_objects():
        want = [p for g in opt.param_groups for p in g["params"]]
        want += [v for g in opt.param_groups for p in g["params"] for v in opt.state.get(p, {}).values()]
        got = [t for _, t in fr._state_of(opt)]
        records, skipped = fr._state_plan(opt)  # what is recorded: the same tensors, under the same names
        planned = [(n, t) for names, tensors, _ in records for n, t in zip(names, tensors)]
        return (sorted(map(id, want)) == sorted(map(id, got)) and not skipped
                and sorted((n, id(t)) for n, t in planned) == sorted((n, id(t)) for n, t in fr._state_of(opt)))

    assert names() == ["group0.param0", "group0.param1"]  # no state yet
    assert [n for n, _ in fr._grad_names(opt)] == ["group0.param0.grad", "group0.param1.grad"]
    a.weight.grad = torch.ones(4, 4)  # only the weight steps: only its state is created
    opt.step()
    assert names() == ["group0.param0", "group0.param0.exp_avg", "group0.param0.exp_avg_sq",
                       "group0.param0.step", "group0.param1"] and same_objects()
    a.bias.grad = torch.ones(4)
    opt.step()
    assert "group0.param1.exp_avg" in names() and same_objects()
    opt.load_state_dict(opt.state_dict())  # new state tensors
    assert same_objects()
    opt.state[a.weight]["exp_avg"] = torch.zeros(4, 4)  # one state tensor replaced in its dict
    assert same_objects()
    opt.state[a.bias] = dict(opt.state[a.bias])  # a parameter's state dict replaced (same tensors)
    assert same_objects()
    opt.add_param_group({"params": list(b.parameters())})
    assert names()[-2:] == ["group1.param0", "group1.param1"] and same_objects()
    # the gradient names follow the param groups too (their cache is checked against the parameters)
    assert [n for n, _ in fr._grad_names(opt)][-2:] == ["group1.param0.grad", "group1.param1.grad"]


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_replica_records_hash_every_gradient_parameter_and_optimizer_state(device, tmp_path):
    """attach(optimizer, model): 100 Linear layers under AdamW, 200 gradients
    and 800 parameters and state tensors (exp_avg, exp_avg_sq, step: CPU
    scalars next to CUDA tensors on the GPU), in records of at most
    _C.STATE_RECORD_MAX (that many are hashed on the GPU), named by the
    model, each hash equal to the host's bitwise hash of the tensor.  On the
    GPU the records' hashes are launched at once, not queued: the C++ write
    guard (whose per-op cost would stay for the whole recording) is never
    installed (Note [Replica state records])."""
    from kdebug import hashing

    model = torch.nn.Sequential(*[torch.nn.Linear(8, 8) for _ in range(100)]).to(device)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 8, device=device)).sum().backward()
    opt.step()
    fr = kdebug.FlightRecorder(every=1000, keep_steps=2, trace=str(tmp_path / "m.kdt"))
    handle = fr.attach(opt, model)
    with fr:
        model(torch.randn(2, 8, device=device)).sum().backward()
        want_grads = {f"{n}.grad": hashing.bitwise(p.grad, on_host=True) for n, p in model.named_parameters()}
        opt.step()
        guard = kdebug._C.write_guard_stats()["installed"]
    handle.remove()
    assert guard == 0
    assert fr._step == 1  # the optimizer's step ended the recorder's step
    run = kdebug.load(fr.dump())
    recs = [k for k in run.kernels if k.kernel_name.startswith("kdebug::flight")]
    assert all(len(k.post_hashes) <= kdebug._C.STATE_RECORD_MAX for k in recs)
    got = {n: h for k in recs if k.kernel_name == "kdebug::flight_grads" for n, h in k.post_hashes.items()}
    assert got == want_grads
    want = {}
    for n, p in model.named_parameters():
        want[n] = hashing.bitwise(p, on_host=True)
        for key, v in opt.state[p].items():
            want[f"{n}.{key}"] = hashing.bitwise(v, on_host=True)
    got = {n: h for k in recs if k.kernel_name == "kdebug::flight_state" for n, h in k.post_hashes.items()}
    assert len(want) == 800 and got == want


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_data_parallel_ranks_on_their_own_data_compare_what_must_agree(device, tmp_path):
    """Two gloo ranks, each on its own batches (as a DistributedSampler
    gives), gradients averaged, the recorder attached to the optimizer
    (compare="replicas", the default): every kernel of the forward and
    backward differs between the ranks, yet the replicas match, since what
    is compared is the reduced gradients, the optimizer's launches and the
    parameters it leaves; rank 0 also evaluates after each step (its own
    launches), and kdebug diff --ranks of its dumps says the replicas match.  Then rank 1 gets another gradient after the
    reduction at step 4: the compare after step 5 names step 4 and rank 1,
    and kdebug diff --ranks of the dumps names the gradient that differs
    (a replica record: Note [Replica state records])."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           WORKER, str(tmp_path), "replicas", "4", "9", "3", device]
    r = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    res = [json.loads((tmp_path / f"rank{k}.json").read_text()) for k in range(2)]
    for k in range(2):
        local, grad = res[k]["local"], res[k]["grad"]
        assert local["divergence"] is None and local["dumped"] == str(tmp_path / f"local.rank{k}.kdt"), res
        assert local["stats"]["compares"] == 3 and local["stats"]["replica_records"] == 2 * 9, local["stats"]
        # each step compared: the grads record, the SGD step (eager: no launches), the state record
        n = len(local["digests"])  # steps of the last window may wait for the next compare
        assert n >= 3 and [d[:3] for d in local["digests"]] == [[s, 2, 0] for s in range(n)], local["digests"]
        # the GPU's hashes are read back without waiting: seen one window late there
        assert grad["divergence"]["step"] == 4 and grad["divergence"]["ranks"] == [1], grad
        assert grad["divergence"]["detected_at"] in ((5,) if device == "cpu" else (5, 8)), grad
    a, b = res[0]["local"]["digests"], res[1]["local"]["digests"]
    assert a[:min(len(a), len(b))] == b[:min(len(a), len(b))]
    # rank 0's evaluations are its own launches: the replica records agree, so the replicas match
    same = subprocess.run([sys.executable, "-m", "kdebug", "diff", "--ranks", str(tmp_path / "local.kdt")],
                          env=_env(), capture_output=True, text=True, timeout=120)
    assert same.returncode == 0 and "STRUCTURE (rank-local" in same.stdout, same.stdout + same.stderr
    diff = subprocess.run([sys.executable, "-m", "kdebug", "diff", "--ranks", str(tmp_path / "grad.kdt")],
                          env=_env(), capture_output=True, text=True, timeout=120)
    text = diff.stdout + diff.stderr
    assert diff.returncode == 1, text
    first = re.search(r"REPLICAS DIVERGE: first at replica kernel #\d+ kdebug::flight_grads .*", text)
    assert first and "0.weight.grad (index 0) differs" in first.group(0) and "reduction" in first.group(0), text


@pytest.mark.gpu
def test_gpu_flight_recorder_adds_no_synchronization(block_step, tmp_path):
    """Steps of a compiled transformer block recorded by the flight recorder
    run under torch.cuda.set_sync_debug_mode("error"), kdebug's own sync
    counter unchanged; the dump holds every Triton launch with its hashes."""
    step, x = block_step
    fr = kdebug.FlightRecorder(every=1000, keep_steps=3, trace=str(tmp_path / "g.kdt"), compare="all")
    with fr:
        step(x)
        fr.step()
        torch.cuda.synchronize()
        syncs = fr._rec.stats()["gpu_syncs"]
        torch.cuda.set_sync_debug_mode("error")
        try:
            for _ in range(5):
                step(x)
                fr.step()
        finally:
            torch.cuda.set_sync_debug_mode(0)
        assert fr._rec.stats()["gpu_syncs"] == syncs
    fr.close()
    run = kdebug.load(fr.dump())
    steps = run.meta["flight"]["steps"]
    assert [s["step"] for s in steps] == [3, 4, 5]
    assert all(s["recorded"] == s["launches"] > 0 and s["digest"] for s in steps)
    assert len(run.kernels) == sum(s["launches"] for s in steps)
    assert all(k.kind == "triton" and k.post_hashes for k in run.kernels)
    assert [d.launches for d in fr.digests] == [steps[0]["launches"]] * 6


@contextlib.contextmanager
def _one_rank_group(backend: str):
    """A process group of one rank on this process, destroyed on leaving."""
    import socket

    import torch.distributed as dist

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        yield dist
    finally:
        dist.destroy_process_group()


def _blocking_hashes(step, x) -> list:
    """(kernel name, post hashes) of each launch of one step, recorded by a
    DebugMode that reads its GPU hashes back by synchronizing."""
    with DebugMode(kernels_only=True) as dm, DebugMode.log_tensor_hashes("bitwise"):
        step(x)
    return [(k.kernel_name, k.post_hashes) for k in dm.kernels]


def _eight_steps(fr, step, x, between) -> int:
    """Inside ``with fr``: a first step on an idle device, then seven with
    ``between()`` after each, each closed by fr.step(); returns kdebug's
    device synchronizations counted after the first."""
    step(x)
    torch.cuda.synchronize()
    fr.step()
    syncs = fr._rec.stats()["gpu_syncs"]
    for _ in range(7):
        step(x)
        between()
        fr.step()
    return syncs


@pytest.mark.gpu
def test_gpu_flight_compare_reads_hashes_back_without_waiting(block_step, tmp_path):
    """Note [Reading results without waiting]: with the device idle before
    each fr.step() (the test synchronizes; kdebug does not), each compare
    takes the steps whose GPU hashes the compare before it began reading back
    (one window late) and begins reading back the rest, without one device
    synchronization of kdebug's; the hashes it delivered are those a blocking
    recording of the same step computes."""
    step, x = block_step
    ref = _blocking_hashes(step, x)
    assert ref and all(h for _, h in ref)
    with _one_rank_group("gloo"):
        fr = kdebug.FlightRecorder(every=2, keep_steps=2, trace=str(tmp_path / "w.kdt"), compare="all")
        with fr:
            syncs = _eight_steps(fr, step, x, torch.cuda.synchronize)
            assert fr._rec.stats()["gpu_syncs"] == syncs
            # compares after steps 1, 3, 5, 7: each digests the window the one before began
            # reading back (none, 0-1, 2-3, 4-5); steps 6-7 are on their way
            assert [d.step for d in fr.digests] == list(range(6))
            assert fr.stats["compares"] == 4 and fr.stats["waiting_compares"] == 0
            assert fr._pending == [] and all(d.complete and d.launches == len(ref) for d in fr.digests)
        fr.close()
        run = kdebug.load(fr.dump())  # a blocking drain: step 7 too
        assert [s["step"] for s in run.meta["flight"]["steps"]] == [6, 7]
        assert [d.step for d in fr.digests] == list(range(8))
        kernels = [(k.kernel_name, k.post_hashes) for k in run.kernels]
        assert kernels == ref + ref


@pytest.mark.gpu
def test_gpu_flight_read_back_is_ordered_after_a_busy_device(block_step, tmp_path):
    """The device kept busy (a sleep kernel queued after each step, before the
    step's deferred hashes) while compares begin read-backs: each read-back is
    ordered after the hash kernels by events, so every hash delivered is the
    one a blocking recording computes; kdebug synchronizes only for compares
    that found a step of an earlier window still waiting."""
    step, x = block_step
    ref = _blocking_hashes(step, x)
    with _one_rank_group("gloo"):
        fr = kdebug.FlightRecorder(every=2, keep_steps=8, trace=str(tmp_path / "busy.kdt"), compare="all")
        with fr:
            # tens of ms of device time before each step's hashes
            syncs = _eight_steps(fr, step, x, lambda: torch.cuda._sleep(20_000_000))
            assert fr._rec.stats()["gpu_syncs"] - syncs == fr.stats["waiting_compares"]
        fr.close()
        run = kdebug.load(fr.dump())
        assert [s["step"] for s in run.meta["flight"]["steps"]] == list(range(8))
        assert [(k.kernel_name, k.post_hashes) for k in run.kernels] == ref * 8
        assert len({d.digest for d in fr.digests}) == 1 and len(fr.digests) == 8


@pytest.mark.gpu
def test_gpu_read_back_without_waiting_leaves_graph_replay_hashes_to_a_synchronization():
    """Hashes captured into a CUDA graph run on the replay's stream, which the
    read-back without waiting does not track: after a replay reserved results
    it begins none (until the device is synchronized), so a replay queued
    behind a busy device still has its own hashes, not a copy of the slots
    taken before it ran."""
    from kdebug import hashing

    torch._dynamo.reset()
    f = torch.compile(lambda t: (t.sin() * 2).cos() + 1, mode="reduce-overhead")
    xs = [torch.randn(1 << 16, device="cuda") for _ in range(7)]
    outs = []
    with DebugMode(kernels_only=True) as dm, DebugMode.log_tensor_hashes("bitwise"):
        for i in range(3):
            f(xs[i])
        torch.cuda.synchronize()
        for i in range(3, 7):
            torch.cuda._sleep(50_000_000)  # the replay waits behind this
            outs.append(f(xs[i]).clone())
            _C.collect_ready()
            _C.collect_ready()
    replayed = {}
    for k in dm.kernels:
        g = k.cuda_graph
        if g is not None and g["replay"] is not None:
            replayed.setdefault(g["replay"], []).append(k)
    got = [next(iter(v[-1].post_hashes.values())) for _, v in sorted(replayed.items())][-4:]
    assert got == [hashing.bitwise(o, on_host=True) for o in outs]


@pytest.mark.gpu
def test_gpu_flight_two_ranks_on_one_device_name_the_planted_rank(tmp_path):
    """Two gloo ranks, both on the one GPU, compiled Triton kernels, hashes
    read back without waiting: replicas that match compare every step once,
    kdebug synchronizing only for a compare that found a step of an earlier
    window still unread; rank 1's input perturbed at step 4 is named by the
    compare after step 8 (each compare takes the window the one before began
    reading back), or the one after step 5 where the hashes were read back
    by step() already."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           WORKER, str(tmp_path), "ranks", "4", "9", "3", "cuda"]
    r = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    res = [json.loads((tmp_path / f"rank{k}.json").read_text()) for k in range(2)]

    def ranks_diff(stem):  # what a user runs on the dumps: the evidence when an assertion fails
        d = subprocess.run([sys.executable, "-m", "kdebug", "diff", "--ranks", str(tmp_path / stem)],
                           env=_env(), capture_output=True, text=True, timeout=120)
        return d.stdout + d.stderr

    for k in range(2):
        m, f = res[k]["match"], res[k]["fault"]
        if m["divergence"] is not None:
            raise AssertionError(f"replicas that match diverged: {res}\n{ranks_diff('match.kdt')}")
        assert m["dumped"] is None and m["stats"]["compares"] == 3, res
        assert m["gpu_syncs"] == m["stats"]["waiting_compares"], m
        assert f["divergence"]["step"] == 4 and f["divergence"]["ranks"] == [1]
        assert f["divergence"]["detected_at"] in (5, 8), f["divergence"]
        assert all(d[2] == 0 for d in m["digests"])  # every step complete
        # keep_steps=1, but the steps not yet compared are held: step 4 is in the dump
        run = kdebug.load(str(tmp_path / f"fault.rank{k}.kdt"))
        assert 4 in [s["step"] for s in run.meta["flight"]["steps"]], run.meta["flight"]["steps"]
    a, b = res[0]["match"]["digests"], res[1]["match"]["digests"]
    n = min(len(a), len(b))  # steps 0-5 at least (steps 6-8 may be on their way)
    assert n >= 6 and a[:n] == b[:n] and [d[0] for d in a[:n]] == list(range(n))
    # compare="all" (the same batches on both ranks): the pairwise diff the summary suggests shows
    # the kernels of step 4 that wrote something else (the perturbed input came from outside the
    # recording: the diff calls what follows from it benign, not a root)
    d = subprocess.run([sys.executable, "-m", "kdebug", "diff", str(tmp_path / "fault.rank0.kdt"),
                        str(tmp_path / "fault.rank1.kdt")], env=_env(), capture_output=True, text=True, timeout=120)
    assert re.search(r"kernel #\d+ triton_\w+: \w+ \(index \d+\) differs", d.stdout), d.stdout + d.stderr


@pytest.mark.gpu
def test_gpu_flight_compare_on_a_one_rank_nccl_group(block_step, tmp_path):
    """The compare's all_gather on an NCCL group (one rank: it runs, and
    matches itself); the dump path is rank_path(trace, 0)."""
    with _one_rank_group("nccl"):
        step, x = block_step
        fr = kdebug.FlightRecorder(every=2, keep_steps=2, trace=str(tmp_path / "n.kdt"), compare="all")
        with fr:
            for _ in range(4):
                step(x)
                fr.step()
        fr.close()
        assert fr.stats["compares"] == 2 and fr.divergence is None and fr.dumped is None
        assert fr.path() == str(tmp_path / "n.rank0.kdt")
        run = kdebug.load(fr.dump())
        assert run.meta["flight"]["world_size"] == 1 and len(run.kernels) > 0


def test_flight_meta_is_checked(tmp_path):
    """META flight of another shape makes the trace unreadable, naming it."""
    from kdebug import trace

    good = {"rank": 1, "world_size": 2, "every": 3, "keep_steps": 2, "last_step": 6, "reason": "x",
            "steps": [{"step": 5, "launches": 3, "recorded": 3, "digest": "00000000000000ff"}], "divergence": None}
    for bad, what in (({**good, "rank": "1"}, "flight.rank"),
                      ({**good, "steps": [{**good["steps"][0], "digest": "xyz"}]}, "flight.steps[0].digest"),
                      ({**good, "divergence": {"step": 4, "detected_at": 5, "ranks": [-1]}}, "flight.divergence.ranks")):
        path = str(tmp_path / "m.kdt")
        w = trace.Writer(path)
        w.meta({"flight": bad})
        w.close()
        with pytest.raises(kdebug.TraceFileError, match=what.replace("[", r"\[").replace("]", r"\]")):
            kdebug.load(path)
    w = trace.Writer(path)
    w.meta({"flight": good})
    w.close()
    assert kdebug.load(path).meta["flight"]["steps"][0]["digest"] == "00000000000000ff"


class _HeldRecorder:
    """Stands in for the C Recorder in the FlightRecorder's compare protocol
    (Note [Reading results without waiting]), where this machine has no GPU
    to leave hashes in flight: launches from ``pending_from`` on wait for
    their GPU hashes, so digest() of a range holding one answers None until
    settle(wait=True) takes everything (and counts a synchronization).
    Launches stay held until discard() (Note [Steps held in the ring])."""

    capacity = 1 << 20
    ticket = 0  # the ring's head: a digest's hint, which this stand-in does not need

    class Digest(NamedTuple):
        digest: int
        recorded: int

    def __init__(self):
        self.seen, self.pending_from, self.syncs = 0, None, 0
        self.gone = 0  # launches below this index were discarded

    @property
    def slots_used(self):
        return self.seen - self.gone

    def settle(self, *, wait=True):
        if wait and self.pending_from is not None and self.pending_from < self.seen:
            self.syncs += 1  # the blocking collect: every hash read back
            self.pending_from = None

    def digest(self, a, b, ticket=None):
        if self.pending_from is not None and b > max(a, self.pending_from):
            return None
        held = range(max(a, self.gone), b)
        return self.Digest(hash(tuple(held)) & ((1 << 64) - 1), len(held))

    def discard(self, upto):
        n = max(0, upto - self.gone)
        self.gone = max(self.gone, upto)
        return n


class _TwoRanks:
    """A process group of two for _compare: this rank's vector, and the other
    rank's made by ``other(vec)`` from it (what that rank would send)."""

    def __init__(self, other):
        self.other, self.sent = other, []

    def get_backend(self, group=None):
        return "gloo"

    def all_gather(self, out, vec, group=None):
        self.sent.append(vec.clone())
        out[0].copy_(vec)
        out[1].copy_(self.other(vec.clone()))


def test_compare_protocol_when_gpu_hashes_are_still_in_flight(monkeypatch, tmp_path):
    """Note [Reading results without waiting], the Python side: a step whose
    launches still wait for GPU hashes is neither digested nor compared nor
    forgotten; it goes out at the next compare; a rank that has not digested a
    step yet makes the others hold it back too; only a step of an earlier
    window still waiting makes the compare wait for the device."""
    from kdebug import flight

    monkeypatch.setattr(flight._C, "collect_ready", lambda at_least=0: 0)
    fr = kdebug.FlightRecorder(every=2, keep_steps=1, trace=str(tmp_path / "p.kdt"), compare="all")
    rec = fr._rec = _HeldRecorder()
    # the other rank: one step behind in digesting (its last row missing) and, at step 3, another digest
    def other(vec):
        n = int(vec[0, 1])
        if n:
            vec[n, :] = -1
            vec[0, 1] = n - 1
        for row in vec[1:]:
            if int(row[0]) == 3:
                row[3] += 1
        return vec
    group = _TwoRanks(other)
    monkeypatch.setattr(fr, "_world", lambda: (group, 0, 2))
    dumps = []  # the dump itself writes a trace from the real Recorder: tested elsewhere
    monkeypatch.setattr(fr, "dump", lambda path=None, reason="": dumps.append(
        (reason, [s for s, _, _ in fr._closed])) or "dumped")  # and the steps it would write

    def run_step(pending_from):
        rec.seen += 3  # the step's three launches (step s: launches 3s .. 3s + 2)
        rec.pending_from = pending_from
        fr.step()

    run_step(None)
    run_step(0)  # compare 1 (after step 1): every launch still waits for its hashes
    assert list(fr.digests) == [] and fr._pending == [] and rec.syncs == 0
    assert [int(r[0]) for r in group.sent[-1][1:] if int(r[0]) >= 0] == []
    assert [s for s, _, _ in fr._closed] == [0, 1]  # keep_steps=1, but undigested steps are not forgotten
    run_step(9)
    run_step(9)  # compare 2: steps 0-2 digested, step 3 waits; the other rank has 0-1: those are compared
    assert [d.step for d in fr.digests] == [0, 1, 2]
    assert [int(r[0]) for r in group.sent[-1][1:] if int(r[0]) >= 0] == [0, 1, 2]
    assert [d.step for d in fr._pending] == [2] and fr.divergence is None  # step 2 goes out again
    # held: 0-1, compared by this compare (forgotten at the next drain), 2 (not compared on every
    # rank yet) and 3 (undigested); keep_steps=1 alone would keep only step 3
    assert [s for s, _, _ in fr._closed] == [0, 1, 2, 3]
    assert fr.stats["compares"] == 2 and fr.stats["waiting_compares"] == 0 and rec.syncs == 0
    run_step(9)
    run_step(9)  # compare 3: step 3, of the window before, still waits: this compare waits for the device
    assert fr.stats["waiting_compares"] == 1 and rec.syncs == 1
    assert [d.step for d in fr.digests] == [0, 1, 2, 3, 4, 5]
    assert [int(r[0]) for r in group.sent[-1][1:] if int(r[0]) >= 0] == [2, 3, 4, 5]
    # the other rank sent 2, 3, 4 (its last row missing), its step 3 another digest: rank 1 named
    assert fr.divergence is not None and fr.divergence.step == 3 and fr.divergence.ranks == (1,)
    assert fr.divergence.detected_at == 5
    # the dump holds the divergent step 3: steps not yet compared are not forgotten (keep_steps=1)
    assert dumps == [("replicas diverged", [2, 3, 4, 5])]


def test_a_compare_bounds_the_lag_of_undigested_steps_to_one_window(monkeypatch, tmp_path):
    """With keep_steps > every and a device three steps behind, a compare
    waits for every step older than its window (the oldest undigested step
    decides, not the oldest kept one): no rank lags more than ``every``
    steps, so against another rank as far behind as that allows, the
    2 * every rows a compare sends hold every step not yet compared, and
    none is dropped."""
    from kdebug import flight

    monkeypatch.setattr(flight._C, "collect_ready", lambda at_least=0: 0)
    fr = kdebug.FlightRecorder(every=1, keep_steps=4, trace=str(tmp_path / "lag.kdt"), compare="all")
    rec = fr._rec = _HeldRecorder()
    def behind(vec):  # the other rank: as far behind as the protocol lets it be (none of this window's steps)
        rows = [r for r in vec[1:1 + int(vec[0, 1])] if int(r[0]) < fr._step - fr.every]
        out = torch.full_like(vec, -1)
        out[0, 0], out[0, 1] = 1, len(rows)
        for i, r in enumerate(rows):
            out[i + 1] = r
        return out

    group = _TwoRanks(behind)
    monkeypatch.setattr(fr, "_world", lambda: (group, 0, 2))
    for s in range(12):
        rec.seen += 3
        rec.pending_from = max(0, rec.seen - 9)  # the last three steps' hashes still in flight
        fr.step()
        late = [st for st, _, _ in fr._closed if st not in fr._digested]
        assert not late or min(late) >= fr._step - fr.every, (s, late)
        assert len(fr._pending) <= 2 * fr.every
    assert fr.stats["waiting_compares"] > 0 and fr.stats["uncompared_steps"] == 0
    assert fr.divergence is None and [d.step for d in fr.digests] == list(range(12))


def test_replica_devices_answers_only_for_plain_tensors_of_their_own_data():
    """Note [Plain replica tensors]: the gradients' check in C gives a device
    code (type * 256 + index + 1: 0 for the CPU) for a plain tensor or
    Parameter and None for None, and no answer at all when any one is a meta
    tensor, a functional or functorch-wrapped tensor, a subclass or a sparse
    tensor (the flight recorder then asks Python about each)."""
    from kdebug import _upstream

    plain = _upstream.PLAIN_TENSORS
    t, p = torch.zeros(2), torch.nn.Parameter(torch.zeros(1))
    assert _C.replica_devices([t, None, p], plain) == [0, None, 0]
    assert _C.replica_devices([], plain) == []

    class Sub(torch.Tensor):
        pass

    for odd in (torch.zeros(2, device="meta"), torch._to_functional_tensor(torch.zeros(2)),
                torch.zeros(2).as_subclass(Sub), torch.zeros(3).to_sparse()):
        assert _C.replica_devices([t, odd], plain) is None, odd
    inside = []

    def f(x):
        inside.append(_C.replica_devices([t, x], plain))
        return x.sum()

    torch.func.grad(f)(torch.zeros(3))  # a grad wrapper
    torch.vmap(lambda x: inside.append(_C.replica_devices([x], plain)) or x)(torch.zeros(2, 3))  # batched
    assert inside == [None, None]


class _GradSub(torch.Tensor):
    pass


@pytest.mark.parametrize("prefetch", [True, False])
def test_gradient_records_follow_the_gradients_each_step(prefetch, tmp_path):
    """The gradients' record layout is reused from step to step
    (FlightRecorder._grads_plan): each step's kdebug::flight_grads record
    still holds that step's gradients (new tensors after zero_grad), leaves
    out one that is None, and takes it back when it returns; every hash is the
    host's bitwise hash of that step's gradient.  The same with the
    gradients' prefetch (Note [Prefetching the gradients]) on and off, with a
    frozen parameter (no gradient, no autograd metadata) among them."""
    from kdebug import hashing

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2), torch.nn.Linear(2, 2))
    model[2].weight.requires_grad_(False)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    fr = kdebug.FlightRecorder(every=1000, keep_steps=8, trace=str(tmp_path / "g.kdt"))
    handle = fr.attach(opt, model)
    want = []
    was = kdebug._C._prefetch_grads(prefetch)
    with fr:
        for step in range(4):
            opt.zero_grad()
            model(torch.randn(3, 4)).sum().backward()
            if step == 2:
                model[1].bias.grad = None
            if step == 3:  # not a plain tensor type: planned by the Python checks, still recorded
                model[0].weight.grad = model[0].weight.grad.as_subclass(_GradSub)
            want.append({f"{n}.grad": hashing.bitwise(p.grad, on_host=True)
                         for n, p in model.named_parameters() if p.grad is not None})
            opt.step()
    assert kdebug._C._prefetch_grads(was) is prefetch
    handle.remove()
    run = kdebug.load(fr.dump())
    got = [dict(k.post_hashes) for k in run.kernels if k.kernel_name == "kdebug::flight_grads"]
    assert got == want and "2.weight.grad" not in str(got)
    assert "1.bias.grad" not in got[2] and "1.bias.grad" in got[3] and len(set(map(str, got))) == 4


def test_replica_record_names_given_as_interned_ids_or_as_str(tmp_path):
    """record_state takes its argument names as a list of str or as
    intern_names' ids (Note [Replica names interned once]): both give the
    same named, hashed record; ids it did not hand out, a length that does
    not match the tensors, and names that are not str are refused with an
    error that says so, and nothing is recorded for them."""
    from kdebug import _C, hashing

    a, b = torch.arange(6.0), torch.ones(2, 3)
    ids = _C.intern_names(["w", "w.exp_avg"])
    assert len(ids) == 8
    with kdebug.DebugMode(kernels_only=True) as dm, DebugMode.log_tensor_hashes("bitwise"):
        assert _C.record_state("kdebug::by_id", ids, [a, b])
        assert _C.record_state("kdebug::by_str", ["w", "w.exp_avg"], [a, b])
        with pytest.raises(ValueError, match="intern_names did not give"):
            _C.record_state("kdebug::bad", (1 << 31).to_bytes(4, "little") * 2, [a, b])
        with pytest.raises(ValueError, match="each with a name"):
            _C.record_state("kdebug::bad", ids[:4], [a, b])
        with pytest.raises(TypeError, match="list of str or intern_names"):
            _C.record_state("kdebug::bad", ("w", "w.exp_avg"), [a, b])
    with pytest.raises(TypeError, match="must be a str"):
        _C.intern_names(["w", 3])
    recs = [k for k in dm.operators if str(getattr(k, "kernel_name", "")).startswith("kdebug::")]
    assert [k.kernel_name for k in recs] == ["kdebug::by_id", "kdebug::by_str"]
    want = {"w": hashing.bitwise(a, on_host=True), "w.exp_avg": hashing.bitwise(b, on_host=True)}
    for k in recs:
        assert k.post_hashes == want


@pytest.mark.parametrize("make", [
    lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),  # its state appears at the first step
    lambda p: torch.optim.Adam(p, foreach=False),
    lambda p: torch.optim.AdamW(p, amsgrad=True),
    lambda p: torch.optim.RMSprop(p, momentum=0.5, centered=True),
    lambda p: torch.optim.ASGD(p),
], ids=["sgd_momentum", "adam_single_tensor", "adamw_amsgrad", "rmsprop_centered", "asgd"])
def test_every_step_state_record_is_the_optimizers_state_after_that_step(make, tmp_path):
    """Whatever an optimizer keeps and however it updates it (in place,
    created at its first step, several buffers per parameter), each step's
    state record holds the hashes of exactly the parameters and state
    tensors the optimizer holds after that step: the cached state list
    (FlightRecorder._state_entry) never records stale or missing tensors.
    Expected values: the host's bitwise hash of opt.state, read after each step."""
    from kdebug import hashing

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    opt = make(model.parameters())
    fr = kdebug.FlightRecorder(every=1000, keep_steps=8, trace=str(tmp_path / "o.kdt"), ring_capacity=1 << 14)
    handle = fr.attach(opt, model)
    wants = []
    with fr:
        for _ in range(4):
            opt.zero_grad()
            model(torch.randn(4, 8)).sum().backward()
            opt.step()
            want = {}
            for n, p in model.named_parameters():
                want[n] = hashing.bitwise(p, on_host=True)
                want.update({f"{n}.{k}": hashing.bitwise(v, on_host=True)
                             for k, v in opt.state[p].items() if isinstance(v, torch.Tensor)})
            wants.append(want)
    handle.remove()
    recs = [k for k in kdebug.load(fr.dump()).kernels if k.kernel_name == "kdebug::flight_state"]
    assert len(recs) == 4  # one record a step: fewer than _C.STATE_RECORD_MAX tensors
    assert [dict(k.post_hashes) for k in recs] == wants
    assert len(wants[-1]) > 4  # the state itself is in it, not only the parameters


class _WarmupEma(torch.optim.Optimizer):
    """SGD with an EMA of the parameters that begins after a warm-up step:
    its state slot holds None first and a tensor later (the dict's length
    does not change), next to an int count and a str tag."""

    def __init__(self, params):
        super().__init__(params, {"lr": 0.1})

    @torch.no_grad()
    def step(self, closure=None):
        for g in self.param_groups:
            for p in g["params"]:
                st = self.state[p]
                if not st:
                    st["n"], st["ema"], st["tag"] = 0, None, "warm"
                st["n"] += 1
                p.add_(p.grad, alpha=-g["lr"])
                if st["ema"] is not None:
                    st["ema"].lerp_(p, 0.1)
                elif st["n"] >= 2:
                    st["ema"] = p.clone()


def test_state_that_becomes_a_tensor_later_is_recorded_from_then_on(tmp_path):
    """A state value that is not a tensor at first (None until a warm-up
    ends) and a tensor later, in a dict of unchanged length, is in the state
    records from the step it appears in (the cached state list was kept
    before: found by an adversarial review); so is a state key that replaces
    a non-tensor one."""
    from kdebug import hashing

    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    opt = _WarmupEma(model.parameters())
    fr = kdebug.FlightRecorder(every=1000, keep_steps=8, trace=str(tmp_path / "e.kdt"), ring_capacity=1 << 14)
    handle = fr.attach(opt, model)
    with fr:
        for i in range(4):
            opt.zero_grad()
            model(torch.randn(4, 3)).sum().backward()
            if i == 3:  # a non-tensor entry swapped for a tensor one: same length, another key
                for p in model.parameters():
                    del opt.state[p]["tag"]
                    opt.state[p]["extra"] = torch.zeros(1)
            opt.step()
    handle.remove()
    recs = [k for k in kdebug.load(fr.dump()).kernels if k.kernel_name == "kdebug::flight_state"]
    assert [sorted(k.post_hashes) for k in recs] == [
        ["bias", "weight"],
        ["bias", "bias.ema", "weight", "weight.ema"],
        ["bias", "bias.ema", "weight", "weight.ema"],
        ["bias", "bias.ema", "bias.extra", "weight", "weight.ema", "weight.extra"]]
    assert recs[-1].post_hashes["weight.ema"] == hashing.bitwise(opt.state[model.weight]["ema"], on_host=True)


def test_odd_optimizer_state_and_names_neither_raise_nor_drop_records(tmp_path):
    """A parameter's state that is not a mapping (a tensor here) holds no
    state for the recorder instead of raising out of opt.step(); a parameter
    whose name holds a NUL (torch allows it) is recorded under the name with
    the NUL written as \\0, not dropped with its whole record as if kdebug's
    string table were full."""
    m = torch.nn.Module()
    m.register_parameter("w\x00x", torch.nn.Parameter(torch.randn(3)))
    m.register_parameter("ok", torch.nn.Parameter(torch.randn(3)))
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    fr = kdebug.FlightRecorder(every=1000, keep_steps=8, trace=str(tmp_path / "n.kdt"), ring_capacity=1 << 14)
    handle = fr.attach(opt, m)
    with fr:
        for _ in range(2):
            for p in m.parameters():
                p.grad = torch.ones(3)
            opt.state[m.ok] = torch.zeros(2)  # not a dict
            opt.step()
    handle.remove()
    assert fr.stats["replica_records"] == 4
    assert not fr._dm.kernel_stats["errors"]
    recs = [k for k in kdebug.load(fr.dump()).kernels if k.kernel_name == "kdebug::flight_state"]
    assert [sorted(k.post_hashes) for k in recs] == [["ok", "w\\0x"]] * 2


def test_gradient_records_follow_param_group_changes_between_steps(tmp_path, monkeypatch):
    """The gradient records come from the cached plan by C (Note [Replica
    checks in C]) only while it fits: planned once while nothing changes,
    and planned again, with the right gradients recorded, after a param
    group is added, a parameter in a group is swapped for another, and a
    gradient comes back after being None."""
    from kdebug import flight, hashing

    torch.manual_seed(0)
    a, b = torch.nn.Linear(3, 2), torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(a.parameters(), lr=0.1)
    fr = kdebug.FlightRecorder(every=1000, keep_steps=16, trace=str(tmp_path / "p.kdt"), ring_capacity=1 << 14)
    plans = []
    real = flight.FlightRecorder._grads_plan
    monkeypatch.setattr(flight.FlightRecorder, "_grads_plan", lambda self, o: plans.append(1) or real(self, o))
    handle = fr.attach(opt)
    want, planned = [], []
    with fr:
        for step in range(7):
            opt.zero_grad()
            b(a(torch.randn(4, 3))).sum().backward()
            if step == 3:
                opt.add_param_group({"params": list(b.parameters())})
            if step == 4:  # same group size, another parameter object in it
                swapped = torch.nn.Parameter(torch.randn(1))
                swapped.grad = torch.full((1,), 3.0)
                opt.param_groups[1]["params"][1] = swapped
            if step == 5:
                a.bias.grad = None
            params = [p for g in opt.param_groups for p in g["params"]]
            want.append(sorted(hashing.bitwise(p.grad, on_host=True) for p in params if p.grad is not None))
            opt.step()
            planned.append(len(plans))
    handle.remove()
    recs = [k for k in kdebug.load(fr.dump()).kernels if k.kernel_name == "kdebug::flight_grads"]
    assert [sorted(k.post_hashes.values()) for k in recs] == want
    # the swapped-in parameter is not in the graph: its gradient is gone after zero_grad (step 5)
    assert [len(k.post_hashes) for k in recs] == [2, 2, 2, 4, 4, 2, 3]
    # planned at the first step and at each change (steps 3, 4, 5, 6); steps 1, 2 reuse the plan in C
    assert planned == [1, 1, 1, 2, 3, 4, 5]


def test_record_grads_refuses_a_bad_plan_and_records_nothing_when_it_no_longer_fits(tmp_path):
    """_C.record_grads checks the layout it is given (an index past the
    parameters, names and indices of different lengths: ValueError) and
    answers None, recording nothing, when the parameters or gradients are
    not the ones planned."""
    import array

    p, q = torch.nn.Parameter(torch.ones(2)), torch.nn.Parameter(torch.ones(3))
    p.grad, q.grad = torch.ones(2), torch.ones(3)
    ids = _C.intern_names(["p.grad", "q.grad"])
    plain = (torch.Tensor, torch.nn.Parameter)
    dev = _C.replica_devices([p.grad, q.grad], plain)
    groups = [{"params": [p, q]}]

    def call(**kw):
        args = dict(what="kdebug::flight_grads", groups=groups, sizes=[2], params=[p, q], devices=dev,
                    ids=[ids], indices=[array.array("i", [0, 1]).tobytes()], plain_types=plain)
        args.update(kw)
        return _C.record_grads(**args)

    with pytest.raises(ValueError, match="index past"):
        call(indices=[array.array("i", [0, 2]).tobytes()])
    with pytest.raises(ValueError, match="as many int32 indices"):
        call(indices=[array.array("i", [0]).tobytes()])
    with pytest.raises(TypeError):
        _C.record_grads(what="x")
    from kdebug import hashing

    dm = DebugMode(kernels_only=True)
    with dm, DebugMode.log_tensor_hashes("bitwise"):
        assert call(groups=[{"params": [q, p]}]) is None  # another order
        assert call(sizes=[1]) is None
        q.grad = None
        assert call() is None  # a gradient gone
        q.grad = torch.ones(3).as_subclass(_GradSub)
        assert call() is None  # not a plain tensor
        q.grad = torch.full((3,), 2.0)
        assert call() == 1
    recs = [k for k in dm.kernels if k.kernel_name == "kdebug::flight_grads"]
    assert len(recs) == 1
    assert recs[0].post_hashes == {"p.grad": hashing.bitwise(p.grad, on_host=True),
                                   "q.grad": hashing.bitwise(q.grad, on_host=True)}


def test_a_step_digested_in_the_ring_has_the_digest_it_has_once_drained(tmp_path):
    """Note [Steps held in the ring]: Recorder.digest over launches still in
    the ring gives the digest _C.range_digest gives over the same launches
    once drained into the table (and over a range split between the two);
    discard drops the launches before an index from both without a drain,
    and held_launches counts what is left."""
    step = make_step()
    step(0)
    with DebugMode(kernels_only=True) as dm, DebugMode.log_tensor_hashes("bitwise"):
        rec = dm._recorder
        for i in range(6):
            step(i)
        seen = rec.seen
        per = seen // 6
        assert per * 6 == seen and per >= 3
        in_ring = [rec.digest(s * per, (s + 1) * per) for s in range(6)]
        split = rec.digest(per, 4 * per)
        assert all(d is not None and d.recorded == per for d in in_ring) and split.recorded == 3 * per
        assert rec.held_launches == seen and len(rec) == 0
        assert len({d.digest for d in in_ring}) == 6  # other inputs each step: other hashes
        rec.drain()
        assert len(rec) == seen and rec.held_launches == seen
        stored = [_C.range_digest(rec, rec.position(s * per), rec.position((s + 1) * per)) for s in range(6)]
        assert [d.digest for d in in_ring] == stored
        assert rec.digest(per, 4 * per) == split
        assert rec.discard(2 * per) == 2 * per and rec.held_launches == seen - 2 * per
        assert rec.digest(0, 2 * per).recorded == 0  # forgotten: no longer recorded
        for i in range(6, 8):
            step(i)
        # the range from step 3 to step 7 lies partly in the table, partly in the ring
        both = rec.digest(3 * per, 8 * per)
        assert both.recorded == 5 * per and rec.held_launches == 6 * per
        rec.drain()
        assert rec.digest(3 * per, 8 * per) == both
        assert _C.range_digest(rec, rec.position(3 * per), rec.position(8 * per)) == both.digest
        assert rec.discard(7 * per) == 5 * per and len(rec) == per and rec.held_launches == per
    with pytest.raises(ValueError):
        rec.digest(5, 4)


@pytest.mark.parametrize("every", [1, 3])
def test_kept_steps_held_in_a_small_ring_are_not_overwritten_before_a_dump(every, tmp_path):
    """Note [Steps held in the ring]: the kept steps stay in the ring after a
    compare; when they fill half of it they go into the table then too (an
    early drain after the compare), so a ring too small to hold them loses
    none of them (found by an adversarial review: with every=1 no early drain
    ever ran, and the dump's kept steps had been overwritten)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    cm = torch.compile(model)
    x = torch.randn(8, 16)

    def step():
        cm(x).square().mean().backward()
        opt.step()
        opt.zero_grad()

    step()
    fr = kdebug.FlightRecorder(every=every, keep_steps=4, ring_capacity=64, trace=str(tmp_path / "t.kdt"))
    handle = fr.attach(opt, model)
    with fr:
        for _ in range(12):
            step()
    handle.remove()
    run = kdebug.load(fr.dump())
    kept = run.meta["flight"]["steps"]
    assert [s["step"] for s in kept][-4:] == [8, 9, 10, 11]
    assert all(s["recorded"] == s["launches"] > 0 for s in kept)
    assert run.meta["stats"]["complete"] and fr._rec.stats()["dropped"] == 0
    assert fr.stats["early_drains"] > 0
    fr.close()


def _replica_views(device: str) -> dict:
    """Tensors of the layouts, dtypes and ranks a record meets, by name."""
    g = torch.Generator().manual_seed(3)
    b = torch.randn(6, 8, generator=g).to(device)
    return {"w": b, "w.t": b.t(), "w.slice": b[1:, 2:], "w.step": b[:, ::2],
            "empty": torch.empty(0, 3, device=device), "int": torch.arange(12, device=device).view(3, 4),
            "bool": b > 0, "bf16": b.to(torch.bfloat16), "rank7": torch.randn(1, 2, 1, 2, 1, 2, 3, generator=g).to(device),
            "rank9": torch.randn(2, 1, 1, 1, 1, 1, 1, 1, 2, generator=g).to(device),
            "conj": torch.randn(3, dtype=torch.cfloat, generator=g).to(device).conj()}


def _fields(dm) -> list:
    out = []
    for k in dm.kernels:
        tensors = {n: (t.role, t.dtype, tuple(t.shape), tuple(t.stride), t.storage_offset, t.data_ptr, str(t.device))
                   for n, t in k.tensor_info.items()}
        out.append((k.kernel_name, k.roles, tensors, repr(k.pre_hashes), repr(k.post_hashes), k.grid, k.raised))
    return out


@pytest.mark.parametrize("hash_fn", ["bitwise", "norm", ["bitwise", "stats"], ["bitwise", "hash_tensor"]])
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_records_made_in_one_pass_equal_the_two_call_records(device, hash_fn):
    """Note [Records made in one pass] (csrc/kd_launch.c): a replica state
    record and a launch given to Recorder.record (reads, writes and
    read-writes, hashed before and after) are described and hashed in one
    pass; their records, and the digest a compare takes of them, are the
    ones kd_launch_begin + kd_launch_end made, for every layout, dtype and
    rank here (on the GPU: views the hash kernel takes, and ones it leaves to
    the host); the bitwise hashes are the host's own hash of each tensor."""
    from kdebug import hashing

    views = _replica_views(device)
    names, ts = list(views), list(views.values())
    dev = torch.device(device)
    ki = _C.KernelInfo(1, "kdebug_test::rw", ["x", "y", "z", "n"], [1, 2, 3, 1],
                       1 if dev.type == "cuda" else 0, 0 if dev.type == "cuda" else -1)

    def run():
        with DebugMode(kernels_only=True) as dm, DebugMode.log_tensor_hashes(hash_fn, hash_inputs=True):
            rec = dm._recorder
            assert _C.record_state("kdebug::flight_state", names, ts)
            assert rec.record(ki, (views["w"], views["int"], views["w.slice"], 7))
            rec.settle(wait=True)
            d = rec.digest(0, rec.seen)
        return dm, d

    one, d1 = run()
    with kdebug.testing.two_call_records():
        two, d2 = run()
    assert d1 is not None and d1.recorded == 2 and d1 == d2
    assert _fields(one) == _fields(two)
    state, rw = one.kernels
    assert rw.pre_hashes.keys() == {"x", "z"} and rw.post_hashes.keys() == {"y", "z"}
    if "bitwise" in hash_fn:
        for n, t in views.items():
            got = state.post_hashes[n]
            got = got[0] if isinstance(got, tuple) else got  # (bitwise, the other kind)
            assert got == hashing.bitwise(t, on_host=True), n


def test_sparse_gradients_are_skipped_and_counted_not_raised_into_the_step(tmp_path):
    """nn.Embedding(sparse=True) gives sparse gradients: the recorder skips
    them (counted, warned about) instead of raising out of optimizer.step()
    (found by a trust pass: a TypeError from the step's pre-hook killed the
    job); the dense parameters and the state are still recorded and the
    training result is the one without the recorder."""
    def train(recorder):
        torch.manual_seed(0)
        emb, lin = torch.nn.Embedding(10, 4, sparse=True), torch.nn.Linear(4, 1)
        opts = [torch.optim.SGD(emb.parameters(), lr=0.1), torch.optim.SGD(lin.parameters(), lr=0.1)]
        fr = kdebug.FlightRecorder(every=2, trace=str(tmp_path / "sparse.kdt")) if recorder else None
        if fr is not None:
            for o in opts:
                fr.attach(o, torch.nn.ModuleList([emb, lin]))
        with fr if fr is not None else contextlib.nullcontext():
            for i in range(3):
                lin(emb(torch.tensor([1, 2, 3 + i]))).sum().backward()
                for o in opts:
                    o.step()
                    o.zero_grad()
        return fr, torch.cat([emb.weight.detach().flatten(), lin.weight.detach().flatten()])

    with pytest.warns(UserWarning, match="sparse tensors"):
        fr, got = train(True)
    _, want = train(False)
    assert torch.equal(got, want)
    assert fr.stats["replica_tensors_skipped"] == 3, fr.stats  # one sparse gradient per step
    assert fr.stats["replica_records"] > 0, fr.stats
    with pytest.raises(TypeError, match="sparse_coo tensor is not hashed as a replica"):
        with kdebug.FlightRecorder(every=2, trace=str(tmp_path / "mark.kdt")):
            kdebug.replicated(torch.eye(3).to_sparse(), "sp")
