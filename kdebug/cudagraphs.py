"""Recording CUDA-graph captures and replays (mode="reduce-overhead",
torch.cuda.graph, torch.cuda.make_graphed_callables).

Note [CUDA graph replays] (csrc/kd_graph.c) holds the design: launches seen
while a graph is captured are recorded as captured (they did not run) and
become the graph's template; their hash kernels are captured into the graph,
writing to result slots that a one-thread kernel sets per replay; every
replay copies the template into the active recording, marked with the graph
and the replay index, each hash waiting for its value like any GPU hash.
This module wraps torch.cuda.graphs.CUDAGraph (kdebug._upstream.cuda_graph_class)
and turns the C counters into GraphInfo records.
"""
from __future__ import annotations

import dataclasses
import weakref
from typing import NamedTuple

import torch

from . import _C, _upstream

_installed = False
_HANDLE = "_kdebug_graph"


@dataclasses.dataclass(frozen=True)
class GraphInfo:
    """One CUDA graph kdebug saw captured (``DebugMode.cuda_graphs``).

    launches: Inductor launches recorded at capture (each replay repeats
    them); replays: all of them (``graphs()``), or those during the recording
    that reports the graph (``DebugMode.cuda_graphs``); hashes: tensor hashes
    per replay; kernel_nodes / other_nodes: what
    the graph holds (-1: could not be counted); undescribed_kernels: kernel
    nodes that are neither recorded launches nor kdebug's hash kernels
    (cuBLAS / cuDNN / aten kernels: replayed, not recorded); unrecorded,
    hash_errors, replay_errors, outputs_skipped: what went wrong (counted)."""

    graph_id: int
    device: int
    launches: int
    hashes: int
    hash_kernels: int
    kernel_nodes: int
    other_nodes: int
    replays: int
    unrecorded: int
    hash_errors: int
    replay_errors: int
    outputs_skipped: int
    error: str
    live: bool

    @property
    def undescribed_kernels(self) -> int:
        if self.kernel_nodes < 0:
            return -1
        return max(0, self.kernel_nodes - self.launches - self.hash_kernels)

    @property
    def complete(self) -> bool:
        """Every launch of the capture recorded and every hash captured and
        reserved (aten kernels in the graph are another matter: undescribed_kernels)."""
        return not (self.unrecorded or self.hash_errors or self.replay_errors)

    def text(self) -> str:
        parts = [f"CUDA graph {self.graph_id} (cuda:{self.device}): {self.launches} recorded launch(es), "
                 f"{self.replays} replay(s)"]
        if self.undescribed_kernels > 0:
            parts.append(f"{self.undescribed_kernels} other kernel node(s) (cuBLAS / cuDNN / aten kernels) "
                         "replayed but not recorded")
        if self.other_nodes > 0:
            parts.append(f"{self.other_nodes} copy / memset node(s) not recorded")
        if self.kernel_nodes < 0:
            parts.append("its nodes could not be counted")
        for n, what in ((self.unrecorded, "launch(es) of the capture could not be recorded"),
                        (self.hash_errors, "hash(es) could not be captured"),
                        (self.replay_errors, "replay(s) without hashes (no room reserved)"),
                        (self.outputs_skipped, "output(s) not copied (record_outputs skips captured launches)")):
            if n:
                parts.append(f"{n} {what}")
        if self.error:
            parts.append(f"first error: {self.error}")
        return "; ".join(parts)


def graphs() -> list[GraphInfo]:
    """Every graph captured while kdebug recorded, in capture order."""
    return [GraphInfo(**g) for g in _C.graph_stats()["graphs"]]


def unknown_replays() -> int:
    """Replays of graphs captured while kdebug was not recording (their
    launches are not recorded)."""
    return _C.graph_stats()["unknown_replays"]


def supported() -> bool:
    return _installed


def _current_stream() -> int:
    return torch.cuda.current_stream().cuda_stream


def _bookkeeping(orig, self, *args, **kwargs):
    """torch's own work in capture_begin / capture_end / replay (the RNG
    generators' graph seed and offset: empty / fill_ on tensors of their own,
    filled with the default generator's seed, which differs from process to
    process) is not the program: recorded neither as launches nor as aten ops
    (the compile region of Note [Autotuning is not the program])."""
    _C._set_compiling(True)
    try:
        return orig(self, *args, **kwargs)
    finally:
        _C._set_compiling(False)


def _wrap_capture_begin(orig):
    def capture_begin(self, *args, **kwargs):
        handle = _C.graph_capture_begin(torch.cuda.current_device(), 0)
        if not handle:
            return orig(self, *args, **kwargs)
        try:
            _bookkeeping(orig, self, *args, **kwargs)
        except BaseException:
            _C.graph_release(handle)
            raise
        self.__dict__[_HANDLE] = handle
        weakref.finalize(self, _C.graph_release, handle)
        _C.graph_capture_started(handle, _current_stream())

    capture_begin.__wrapped__ = orig
    return capture_begin


def _wrap_capture_end(orig):
    def capture_end(self, *args, **kwargs):
        handle = self.__dict__.get(_HANDLE)
        if handle:
            _C.graph_capture_end(handle)
            return _bookkeeping(orig, self, *args, **kwargs)
        return orig(self, *args, **kwargs)

    capture_end.__wrapped__ = orig
    return capture_end


# kdebug.testing.collect_before_replay: a collect planted between a replay's
# reservation of its hash results and the replay (Note [Results in flight])
_collect_in_gap = False


def _wrap_replay(orig):
    def replay(self, *args, **kwargs):
        handle = self.__dict__.get(_HANDLE)
        if handle:
            queued = False
            try:
                _C.graph_replay(handle, _current_stream())
                if _collect_in_gap:  # kdebug.testing.collect_before_replay
                    _C.hash_collect()
                out = _bookkeeping(orig, self, *args, **kwargs)
                queued = True
                return out
            finally:  # Note [Results in flight]: its hash results may now be read back
                _C.graph_replay_queued(queued)
        else:
            from . import _active

            if _active.records_here():  # autograd's device thread too: carried
                _C.graph_unknown_replay()
        return orig(self, *args, **kwargs)

    replay.__wrapped__ = orig
    return replay


def install() -> None:
    """Wraps CUDAGraph's capture_begin / capture_end / replay once per
    process (when CUDA is available and kdebug was built with it)."""
    global _installed
    if _installed:
        return
    cls = _upstream.cuda_graph_class()
    if cls is None or not torch.cuda.is_available() or not _C.gpu_info()["available"]:
        return
    cls.capture_begin = _wrap_capture_begin(cls.capture_begin)
    cls.capture_end = _wrap_capture_end(cls.capture_end)
    cls.replay = _wrap_replay(cls.replay)
    _installed = True


class Snapshot(NamedTuple):
    """What kdebug had seen of CUDA graphs at some moment (a recording's start
    and end: two per DebugMode; a NamedTuple is made in half the time of a
    frozen dataclass)."""

    replays: dict  # graph_id -> replays then
    unknown_replays: int
    activity: int = 0  # _C.graph_activity() then: graphs registered + replays + unknown replays


_NONE_YET = Snapshot({}, 0, 0)


def snapshot() -> Snapshot:
    activity = _C.graph_activity()
    if activity == 0:  # no graph and no replay in this process yet (the common case): nothing to list
        return _NONE_YET
    st = _C.graph_stats()
    return Snapshot({g["graph_id"]: g["replays"] for g in st["graphs"]}, st["unknown_replays"], activity)


def since(snap: Snapshot, until: Snapshot | None = None) -> tuple[list[GraphInfo], int]:
    """(graphs captured or replayed after ``snap`` and up to ``until`` (None:
    now), each with ``replays`` counting only the replays in that window;
    replays of graphs captured without kdebug in it).  A recording reports
    its own window: replays before it began or after it ended are not its."""
    if (until.activity if until is not None else _C.graph_activity()) == snap.activity:
        return [], 0  # no graph made and no replay in the window
    st = _C.graph_stats()
    out = []
    for g in st["graphs"]:
        gid = g["graph_id"]
        if until is not None and gid not in until.replays:
            continue  # captured after the window
        end = g["replays"] if until is None else until.replays[gid]
        n = end - snap.replays.get(gid, 0)
        if gid in snap.replays and n <= 0:
            continue
        out.append(GraphInfo(**{**g, "replays": n}))
    end_unknown = st["unknown_replays"] if until is None else until.unknown_replays
    return out, end_unknown - snap.unknown_replays
