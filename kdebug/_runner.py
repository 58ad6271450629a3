"""Runs a program under a recording DebugMode that streams to a trace file:
what ``kdebug record`` and ``kdebug hunt`` start in a fresh process.

    python -m kdebug._runner --out run.kdt [--fix NAME] [--hash bitwise,stats]
                             (--builtin | -m module | script.py) [args...]

Exit status: the program's own (its SystemExit code), 1 if it raised.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import runpy
import sys
import threading
import time
import traceback

# Fixes ``kdebug hunt --try-fixes`` tries, applied before the program runs.
FIXES = {
    "deterministic_algorithms": "torch.use_deterministic_algorithms(True)",
    "inductor_deterministic": "torch._inductor.config.deterministic = True",
    "force_reduction_configs": "torch._inductor.config.test_configs.force_filter_reduction_configs = True",
}


def apply_fix(name: str) -> None:
    import torch

    from . import _upstream

    ic = _upstream.inductor_config()

    if name == "deterministic_algorithms":
        torch.use_deterministic_algorithms(True, warn_only=True)
    elif name == "inductor_deterministic":
        if not hasattr(ic, "deterministic"):
            raise SystemExit("kdebug: this torch has no torch._inductor.config.deterministic")
        ic.deterministic = True
    elif name == "force_reduction_configs":
        ic.test_configs.force_filter_reduction_configs = True
    else:
        raise SystemExit(f"kdebug: unknown fix {name!r}; known: {', '.join(FIXES)}")


def run_program(target: list[str], builtin: bool, module: bool):
    """Runs the program; returns what it leaves behind (its module globals):
    the caller holds them until the recording ends (Note [Final state]).
    It writes to the real stdout and stderr (Note [Terminal-safe text]:
    its output is its own)."""
    from ._termtext import program_output

    with program_output():
        return _run_program(target, builtin, module)


def _run_program(target: list[str], builtin: bool, module: bool):
    if builtin:
        from .workloads import hunt_main

        sys.argv = ["kdebug-builtin"] + target
        return hunt_main()
    if module:
        sys.argv = list(target)
        return runpy.run_module(target[0], run_name="__main__", alter_sys=True)
    # as `python script.py` runs it: __file__ absolute (a relative one broke a
    # script that changes directory and then reads Path(__file__)), sys.path[0]
    # the directory of the script with symlinks resolved.  runpy sets
    # sys.argv[0] to the same absolute path (python leaves it as typed): the
    # same file, from any working directory
    sys.argv = list(target)
    sys.path.insert(0, os.path.dirname(os.path.realpath(target[0])))
    path = os.path.abspath(target[0])
    if os.path.exists(target[0]) and not (os.path.exists(path) and os.path.samefile(path, target[0])):
        # `link/../x.py` through a symlinked directory: abspath (runpy's too) collapses `..` as text and
        # names another file than the one the OS opens, which python runs
        path = os.path.realpath(target[0])
    return runpy.run_path(path, run_name="__main__")


def exit_status(e: SystemExit) -> int:
    """The status python gives a SystemExit: an int is the status, None is 0,
    anything else is printed to stderr, status 1."""
    if e.code is None or isinstance(e.code, int):
        return int(e.code or 0)
    print(e.code, file=sys.stderr)
    return 1


def run_for_status(target: list[str], module: bool) -> int:
    """Runs the program as python would and returns its exit status; an
    exception it raises is printed, status 1."""
    try:
        run_program(target, False, module)
    except SystemExit as e:
        return exit_status(e)
    except Exception:
        traceback.print_exc()
        return 1
    return 0


def record(out: str, target: list[str], *, builtin: bool = False, module: bool = False,
           hash_fn=("bitwise", "stats"), fix: str | None = None) -> int:
    """Records the program into ``out``; returns its exit status."""
    import kdebug

    from . import replay

    if fix:
        apply_fix(fix)
    replay.activate_from_env()  # kdebug hunt --confirm (Note [Proof by replay])
    status = 0
    pid = os.getpid()
    all_threads = os.environ.get("KDEBUG_RECORD_ALL_THREADS") == "1"  # kdebug hunt / record --all-threads
    stack = contextlib.ExitStack()
    dm = stack.enter_context(kdebug.DebugMode(trace=out, record_final_state=True, record_all_threads=all_threads))
    stack.enter_context(kdebug.DebugMode.log_tensor_hashes(list(hash_fn), hash_inputs=True))
    stack.enter_context(replay.op_mode())
    with stack, _finishing_on_os_exit(stack, dm, out):
        left = None
        try:
            left = run_program(target, builtin, module)  # noqa: F841  (held at exit)
        except SystemExit as e:  # as python does
            status = exit_status(e)
            left = e  # its traceback's frames hold the program's globals (and locals where it exited)
        except BaseException as e:
            traceback.print_exc()
            status = 1
            left = e
    if os.getpid() != pid:  # a child the program forked, ending through here: its records are in no trace
        return status  # (Note [Forked children] in kdebug/trace.py); the parent says what it recorded
    return _finish(dm, out, status)


def _finish(dm, out: str, status: int) -> int:
    from . import replay

    replay.write_hits()
    st = dm.kernel_stats
    stream = getattr(dm, "_stream", None)
    out = getattr(getattr(stream, "w", None), "rescued", None) or out  # Note [A trace another writer replaced]
    print(f"kdebug: recorded {st['launches']} kernel launch(es) and "
          f"{len(dm.operators) - len(dm.kernels)} aten op(s) into {out}", file=sys.stderr)
    hint = nothing_compiled_hint(st["launches"])
    if hint:
        print(hint, file=sys.stderr)
    return status


# Note [Programs that end by os._exit]
# os._exit ends the process at once: no finally block, no context manager's
# exit, no atexit.  A recorded program that ends that way (to skip a slow
# interpreter teardown, common in training scripts) left a trace without its
# last chunk and its END, so the runs compared only their first launches.
# While the runner records, os._exit(n) called on the thread that entered the
# recording first closes it (the trace written whole) and then exits as
# asked; the program's own cleanup still does not run, as os._exit promises.
# A forked child (a DataLoader worker) inherits the function and exits at
# once (it closed the recording at every worker's exit, with a false
# "recorded" line and a second of heap walking each; found by a review);
# another thread cannot close the recording (a DebugMode is left on the
# thread that entered it), so the trace stays unfinished and a hunt says the
# run is incomplete; a call os._exit refuses (no status, a str) raises as it
# would, with the recording still open.


@contextlib.contextmanager
def _finishing_on_os_exit(stack: contextlib.ExitStack, dm, out: str):
    real = os._exit
    pid, thread = os.getpid(), threading.get_ident()

    def _exit(*args, **kwargs):
        status = args[0] if len(args) == 1 and not kwargs else kwargs.get("status") if set(kwargs) == {"status"} \
            and not args else None
        # only the recording's own process and thread close it: a forked child (a DataLoader worker)
        # inherits this function and must exit at once, as asked; a call os._exit itself refuses
        # (no status, not an int) raises as it would, with the recording still open
        if os.getpid() == pid and threading.get_ident() == thread and isinstance(status, int):
            os._exit = real
            try:
                stack.close()  # the recording's exit: the trace written whole
                _finish(dm, out, status)
            except BaseException:  # the program asked to end now: never stop it
                pass
        real(*args, **kwargs)

    os._exit = _exit
    try:
        yield
    finally:
        os._exit = real


def nothing_compiled_hint(launches: int) -> str | None:
    """Why a recording has no kernel launch when torch.compile was called and
    dynamo captured no graph: the program ran eagerly (with or without
    kdebug).  The common case is torch.compile(DDP(model)) of a model made
    only of torch.nn layers: DDP's forward graph-breaks and dynamo does not
    start a frame in torch.nn's own code (tests/dist_scripts/ddp_step.py)."""
    from . import _upstream

    got = _upstream.dynamo_frame_counts()
    if launches or got is None or got[0] == 0 or got[1] != 0:
        return None
    return (f"kdebug: note: torch.compile saw {got[0]} frame(s) and captured no graph, so the program ran eagerly "
            "(no compiled kernel to record). torch.compile(DDP(model)) of a model made only of torch.nn layers "
            "does this: DDP's forward graph-breaks and dynamo does not compile torch.nn's own forward as a "
            "frame; compile a module class of your own, or DDP(torch.compile(model)). "
            "TORCH_LOGS=graph_breaks says where.")


# Note [Gloo exit race]
# Seen in CI (torch 2.13 CPU, gloo, two ranks, 1 run in ~30 on a loaded
# 2-core machine): a rank whose program had finished ends by SIGABRT,
# "terminate called without an active exception".  The core's backtrace: a
# ProcessGroupGloo worker thread (runLoop) drops its reference to a
# finished AsyncAllreduceWork; the work's tensors have Python objects, so
# the release asks for the GIL (TensorImpl::decref_pyobject); the main
# thread has begun interpreter finalization meanwhile, and CPython ends a
# thread that asks for the GIL then by unwinding it, through a noexcept
# destructor: std::terminate.  destroy_process_group() would join those
# threads, but it does not free the group once torch._dynamo is imported
# (as torch.compile does; the import and a compile add references to the
# group object, and without them the threads end), so every torch.compile +
# gloo program has this window at exit:
# a torch issue (its fix, destroying groups before finalization, was
# proposed upstream and withdrawn), not kdebug's.  The thread is late only
# when it was descheduled right after completing the work.
#
# What kdebug does: a rank's runner, after the program and the recording,
# says that it finished and with which status (FINISHED), then sleeps
# SETTLE_S without the GIL, so such a late thread finishes its release
# before finalization.  That narrows the window, it does not close it; when
# every rank said it finished with status 0 and one still aborts this way,
# ``kdebug hunt --nproc`` says so (hunt_ranks.exit_race) rather than blame
# the program.
SETTLE_S = 0.2
FINISHED = "kdebug: rank {rank} finished: status {status}"


def settle_ranks(status: int) -> None:
    """Note [Gloo exit race]: in a rank of a job, says the program finished
    (and its status), then gives torch.distributed's backend threads
    SETTLE_S seconds to finish releasing their last work."""
    if "torch.distributed" not in sys.modules:
        return
    from . import ranks

    info = ranks.current()
    if info is not None:
        print(FINISHED.format(rank=info.rank, status=status), file=sys.stderr, flush=True)
        time.sleep(SETTLE_S)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m kdebug._runner")
    p.add_argument("--out", required=True)
    p.add_argument("--fix", default=None)
    p.add_argument("--hash", default="bitwise,stats")
    p.add_argument("--builtin", action="store_true")
    p.add_argument("-m", dest="module", action="store_true")
    p.add_argument("target", nargs=argparse.REMAINDER)
    a = p.parse_args(argv)
    if a.target and a.target[0] == "--":
        a.target = a.target[1:]
    if not a.builtin and not a.target:
        p.error("a script (or -m module, or --builtin) to run")
    status = record(a.out, a.target, builtin=a.builtin, module=a.module,
                    hash_fn=a.hash.split(","), fix=a.fix)
    settle_ranks(status)
    return status


if __name__ == "__main__":
    sys.exit(main())
