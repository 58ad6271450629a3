"""kdebug.FlightRecorder: an always-on recorder for long (data-parallel)
training jobs.  Kernel output digests per step, compared across replicas every
K steps with one small collective; the last N steps kept in full and dumped
to per-rank traces when replicas diverge or the job dies.

    fr = kdebug.FlightRecorder(every=100, keep_steps=4, trace="flight.kdt")
    fr.attach(optimizer, model)    # what replicas must agree on; a step per optimizer.step()
    with fr:
        for batch in data:
            train_step(batch)      # (without attach: fr.step() after each step)

Note [Flight recorder]
What one step costs.  The recorder is a kdebug DebugMode(kernels_only=True)
(no dispatch mode: aten ops are not intercepted) with the bitwise hash of
what the kernels it compares write (log_tensor_hashes("bitwise"); which
kernels: Note [What the flight recorder hashes]).  Per hashed kernel that is
the launch hook and nothing else: the launch is described into the ring
(Note [Ring protocol]), its CPU outputs are hashed by C code in the hook, its
CUDA outputs by kdebug's hash kernel on the kernel's stream, whose results
go to the device result ring and are not read back (Note [Hashing on the
GPU]).  The hashes are deferred and launched in batches (Note [Deferred GPU
work]); with no dispatch mode, the C++ write guard flushes them before any
aten op that would overwrite a queued tensor (Note [C++ write guard] in
csrc/kd_write_guard.c); ``batch_gpu_work=False`` launches one per kernel.
``step()`` reads one counter (the recorder's launch index: launches [a, b)
are step s; ``Recorder.seen`` and ``slots_used``, O(1), never ``stats()``,
whose count of lost launches walks the undrained ring: Note [Counting lost
launches] in csrc/core/kd_ring.c) and, every ``every`` steps, compares.
Nothing is drained, digested or synchronized in between, unless the ring is
more than half full (then it is drained early: one device synchronization,
never per kernel).

Note [What the flight recorder hashes]
A hash pass reads every byte a kernel wrote once more: on a GPU-bound step
that is its cost (on the H200 the GPU-bound benchmark step writes about
10 GB per step; at the 2.4-2.7 TB/s the hash kernel reaches, and even at the
~4 TB/s of a plain read, those passes alone are 2.3-3.8% of the step; measured: 3.8%).  So the
recorder hashes what its compare uses and no more.  Under compare="replicas"
that is the optimizer window attach() marks: hashing is switched on (a
count on the recorder, Note [Hash windows] in csrc/kd_launch.c: bitwise
added to whatever the thread's own settings ask) when the gradients are
recorded and off after the state record, so the optimizer's own launches
are hashed and the forward and backward are not.  They are
still recorded (name, grid, arguments: the structure a dump shows and
``kdebug diff --ranks`` checks), but their outputs are each rank's own:
no other rank computes them, a compare could not use their hashes, and a
rank-local difference in them reaches the replicas only through the
reduced gradients, which are hashed.  ``hashes="all"`` hashes every launch
for the whole block (dumps meant for a run-to-run ``kdebug diff`` of one
rank); compare="all" always does.  A ``kdebug.replicated(t, name)`` mark
under the recorder is a record of its own (``kdebug::flight_replicated``,
_mark), hashed bitwise in or out of a window; under compare="replicas" a
step's digest mixes in each mark made outside its window, in order, so
marked values are compared across ranks with the step they were made in,
and are held and forgotten with it.

Digests.  At a compare the steps are digested where their launches lie,
in the ring (Note [Steps held in the ring] in csrc/core/kd_ring.h): nothing
is drained into the recorder's table, and only the launches a digest covers
are read.  First, without a device synchronization (Note [Reading results
without waiting] in csrc/kd_cuda_hash.cu), the GPU hashes that the previous
compare began reading back (an asynchronous copy on a stream of kdebug's,
ordered after the hash kernels by events, polled with cudaEventQuery) are
handed to their records in the ring and the rest begin reading back
(``Recorder.settle``); a step whose compared launches still wait for their
hashes has no digest yet (``Recorder.digest`` answers None): the steps
before it are digested now, the others at the next compare, one window
late.  Only when a
step of an earlier window is still waiting (the device a whole window
behind, or hashes of CUDA graph replays, which this path does not read)
does the compare wait for the device (``stats["waiting_compares"]``): the
oldest step not yet digested decides, so no rank lags more than a window.
(Until 2026-11-29 every compare drained the ring into the table, copying
every launch of the window: 0.6-0.7 ms of a 10-step compare on the H200.)
``step()`` begins a read-back itself once 2048 GPU hashes are queued, so a
long window never fills the device's result ring (8192; full, it is read
back with a synchronization).  A dump drains the ring into the table with a
synchronization: every step.  Each closed step gets one 64-bit digest from C
(``Recorder.digest``: kd_ltab_range_digest's, whether its launches are still
in the ring or in the table): over its launches, each launch's kernel name and kind,
argument shapes and scalar values, and the bitwise hashes of what it wrote,
summed, so two threads' launches interleaved differently (autograd's device
threads) give the same digest; with the launch count.  Launch configs and
data pointers are not part of it: replicas may autotune or allocate
differently and still compute the same values.  A step that lost launches
(ring overwritten, hook errors: ``kernel_stats``' counters) is incomplete:
its digest is not compared, and it is counted and warned about.

What is compared.  ``compare="replicas"`` (the default): per step, only the
records ``attach(optimizer)`` makes around each optimizer step (the reduced
gradients, the optimizer's launches, the parameters and optimizer state it
leaves: Note [Replica state records] in csrc/kd_state_record.c), the values
that must agree across data-parallel ranks, which compute the forward and
backward on their own data.  ``compare="all"``: every launch of the step,
for ranks that compute on identical inputs.

Comparing.  Every ``every`` steps each rank puts its step digests not yet
compared (at most ``2 * every``: a compare waits for any step older than
its window, so no rank lags more) into a fixed-size int64 vector (row 0:
rank, rows sent; rows: step, launches, lost, digest) and the ranks exchange
them with one ``all_gather`` on the default process group (gloo: CPU
tensors; NCCL: the current CUDA device).  The steps every rank sent are
compared; a step some rank has not digested yet (its hashes still being read
back) is sent again at the next compare.  The first compared step whose
digests differ among ranks where it is complete is the first divergence;
ranks are grouped by digest, the largest group is taken as
the reference (a tie goes to the group with the lowest rank) and the others
are named.  With two ranks that disagree no majority exists: rank 0's side
is the reference, so rank 1 is named; the summary says so.  Every rank sees
the same gathered vector, so every rank reaches the same verdict and dumps.
Without an initialized process group (or with one rank) nothing is compared;
steps are still recorded and ``dump()`` works.

Memory.  After every compare the recorder holds the launches of the last
``keep_steps`` closed steps, of every step not yet compared across ranks
(at most ``2 * every``), and of the open one; older ones are dropped
(``Recorder.discard``: from the ring without copying, and from the table);
the steps closed since wait for the next compare (at most ``every``).  They
are held in the ring (fixed, touched as it fills); when they fill more than
half of it at the end of a step, they are drained into the table (an early
drain: one device synchronization, none at a compare's step), which then
holds them until they are dropped.  So memory
is the ring plus, after an early drain, at most
``max(keep_steps, 2 * every) + every + 1`` steps; older steps keep only
their digest, in a deque of ``keep_digests``.  Holding
the uncompared steps is what puts the first divergent step in the dump: a
compare sees a step up to two windows after it ran, long after the last
``keep_steps`` moved on.

Dumping.  When replicas diverge, an exception leaves the ``with`` block, a
SIGTERM / SIGINT arrives (kdebug's handler dumps, then calls the handler that
was there before, or does what the default would: the process still ends), or
the interpreter exits after an uncaught exception, each rank writes its kept
steps to ``rank_path(trace, rank)`` (the plain path without a process group):
a normal trace (``kdebug.load`` / ``kdebug show`` / ``kdebug diff``) whose
steps are separated by a ``kdebug::flight_step`` record, with META ``flight``
(rank, steps kept and their digests, the divergence), and a text summary next
to it (``<trace>.txt``).  The first automatic dump wins (a later death does
not overwrite the divergence's evidence); ``dump()`` always writes.
"""
from __future__ import annotations

import array
import atexit
import collections
import collections.abc
import dataclasses
import os
import signal
import sys
import threading
import weakref
from operator import is_
from typing import Any, Callable, NamedTuple

import torch

from . import _C, _upstream, inductor
from .ranks import rank_path

_ROW = 4  # step, launches, lost, digest
# GPU hash results waiting that no read-back has begun on, at which step()
# begins one (without waiting): a quarter of the device's result ring
# (KD_CUDA_CAPACITY 8192), so that a long window does not fill it (a full ring
# is read back with a device synchronization).  Below that the compare does.
_READ_BACK_AT = 2048
_PREFAULT_MAX_BYTES = 256 << 20  # rings up to this size are touched when a recorder is made (Note [Ring prefault])


_DIST: list = []  # [torch.distributed or None], imported once


def _dist():
    """torch.distributed, or None where this torch build has none."""
    if not _DIST:
        try:
            import torch.distributed as dist
            _DIST.append(dist if dist.is_available() else None)
        except ImportError:
            _DIST.append(None)
    return _DIST[0]


def _dist_on() -> bool:
    """Whether a default process group is initialized (read at every drain)."""
    dist = _dist()
    return dist is not None and dist.is_initialized()


def _mix(a: int, b: int) -> int:
    """Two 64-bit digests into one, order-dependent (splitmix64's finalizer
    over a multiply-xor), the same on every rank."""
    x = ((a * 0x9E3779B97F4A7C15) ^ b) & 0xFFFFFFFFFFFFFFFF
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return x ^ (x >> 31)


class _StateCheck(NamedTuple):
    """What _C.state_unchanged compares (FlightRecorder._state_entry builds
    it): whether ``opt``'s parameters, state dicts and state tensors are the
    objects seen when it was built: the same parameters in the same groups,
    ``opt.state`` with the same keys in the same order mapping to the same
    dicts, each with as many entries and the same tensor at each key that
    held one; a dict that also held other values (an int step, a slot still
    None) has the same keys in the same order and no tensor where one was
    not, so a value that became a tensor is recorded.  Identity checks,
    with no lookup by tensor (a tensor's __hash__ is Python code: looking up
    50 parameters' state took 14 us of a step on the H200 host); about 250
    objects a step (Note [Replica checks in C] in csrc/kd_state_record.c)."""
    sizes: list        # parameters per param group
    params: list       # every group's parameters, in order
    keys: list         # opt.state's keys, in its order
    dicts: list        # opt.state's values (one dict per parameter with state), in its order
    lens: list         # their lengths
    held_dicts: list   # per state tensor: its dict, its key, the tensor
    held_keys: list
    held: list
    mixed: list        # the dicts that also hold other values
    mixed_keys: list   # their keys, in order
    others: list       # (dict, key) of each value in them that is not a tensor


class _Names(list):
    """A replica record's argument names, with their string ids interned
    once (``ids``, what record_state takes: Note [Replica names interned
    once] in csrc/kd_state_record.c); the plans holding them are cached
    across steps."""

    __slots__ = ("ids",)

    def __init__(self, names: list) -> None:
        super().__init__(names)
        self.ids = _C.intern_names(names)


class _Handles:
    """The two optimizer hooks of FlightRecorder.attach; remove() detaches both."""

    def __init__(self, *handles) -> None:
        self._handles = handles

    def remove(self) -> None:
        for h in self._handles:
            h.remove()


@dataclasses.dataclass(frozen=True)
class StepDigest:
    """One closed step: its number (from 0), its kernel launches, how many of
    them were lost (not recorded), and the digest of the recorded ones
    (Note [Flight recorder]); ``complete`` when none was lost."""
    step: int
    launches: int
    lost: int
    digest: int

    @property
    def complete(self) -> bool:
        return self.lost == 0


@dataclasses.dataclass(frozen=True)
class Divergence:
    """Replicas that disagree: the first step whose digests differ, the step
    after which the compare that saw it ran, the ranks named as differing and
    every group of ranks with one digest ({digest: ranks})."""
    step: int
    detected_at: int
    ranks: tuple[int, ...]
    groups: dict[int, tuple[int, ...]]
    reference: tuple[int, ...]

    def text(self) -> str:
        groups = "; ".join(f"rank(s) {', '.join(map(str, r))}: digest 0x{d:016x}" for d, r in self.groups.items())
        tie = ""
        if len(self.groups) == 2 and len(set(map(len, self.groups.values()))) == 1:
            tie = " (no majority: the side of the lowest rank is the reference)"
        return (f"replicas diverge first at step {self.step} (seen by the compare after step "
                f"{self.detected_at}); {groups}; differing rank(s): {', '.join(map(str, self.ranks))}{tie}")


def _signed(d: int) -> int:
    return d - (1 << 64) if d >= 1 << 63 else d


def _unsigned(d: int) -> int:
    return d + (1 << 64) if d < 0 else d


@dataclasses.dataclass(frozen=True)
class RowsCompared:
    """What one compare of gathered step rows found: the first divergence
    (or None), how many steps were not compared because some rank lost
    launches in them, and the steps compared (those every rank had digested:
    the others wait for the next compare)."""
    divergence: Divergence | None
    skipped: int
    compared: tuple[int, ...]


def compare_rows(gathered: list[list[tuple[int, int, int, int]]]) -> RowsCompared:
    """Compares ranks' step rows (rank r's rows: (step, launches, lost,
    digest), in step order) over the steps every rank has."""
    by_rank = [{r[0]: r for r in g} for g in gathered]
    common = sorted(set.intersection(*(set(b) for b in by_rank))) if by_rank else []
    skipped = 0
    for i, step in enumerate(common):
        rows = [b[step] for b in by_rank]
        if any(r[2] for r in rows):
            skipped += 1
            continue
        keyed: dict[tuple[int, int], list[int]] = {}
        for rank, r in enumerate(rows):  # launch count and digest together
            keyed.setdefault((r[1], r[3]), []).append(rank)
        if len(keyed) == 1:
            continue
        ordered = sorted(keyed.items(), key=lambda kv: (-len(kv[1]), kv[1][0]))
        reference = tuple(ordered[0][1])
        differing = tuple(sorted(r for k, rs in ordered[1:] for r in rs))
        by_digest = {k[1]: tuple(rs) for k, rs in ordered}
        return RowsCompared(Divergence(step=step, detected_at=-1, ranks=differing, groups=by_digest,
                                       reference=reference), skipped, tuple(common[:i + 1]))
    return RowsCompared(None, skipped, tuple(common))


class FlightRecorder:
    """An always-on recorder for long training jobs (Note [Flight recorder]).

    every: compare step digests across replicas every this many steps (one
        all_gather of a (every + 1) x 4 int64 vector on the process group).
    keep_steps: the last this many closed steps are kept in full (every
        launch record with its output hashes) for a dump, and so is every
        step not yet compared across ranks; older steps keep only their
        digest.
    trace: where dumps go: ``rank_path(trace, rank)`` under an initialized
        process group (``run.kdt`` -> ``run.rank1.kdt``), else ``trace``;
        the text summary goes to that path + ``.txt``.
    keep_digests: how many older steps' digests are kept (``digests``).
    ring_capacity: the recorder's ring, in 128-byte slots (Note [Ring
        protocol]); it is drained early when more than half full.  Its
        memory (128 MB by default: host memory per rank) is touched when the
        recorder is made, so no launch pays for a page fault (Note [Ring
        prefault] in csrc/core/kd_ring.c); a ring above 256 MB is not (it
        stays lazily mapped, faulted in as it fills).
    group: the process group to compare on (default: the default group).
    signals: the signals whose arrival dumps (then the previous handler runs).
    compare: "replicas" (default): compare what must agree across
        data-parallel ranks, recorded around each optimizer step by
        attach(optimizer); "all": every kernel's outputs (ranks that compute
        on identical inputs only).
    hashes: "compared" (default): hash what the compare uses and nothing
        else: under compare="replicas" the optimizer windows attach() marks
        (the reduced gradients, the optimizer's launches, the parameters and
        state it leaves); the forward and backward launches are recorded
        (name, grid, arguments) without hashes, since each rank computes them
        on its own data and no other rank could confirm them (Note [What the
        flight recorder hashes]).  "all": every kernel's outputs as well, for
        dumps compared run to run (``kdebug diff`` of rank R's dumps of two
        runs); it costs the hash passes over every output byte.
    batch_gpu_work: queue GPU hashes and launch them in batches, guarded
        against aten ops that would overwrite them (Note [C++ write guard] in
        csrc/kd_write_guard.c); False where GPU memory is written outside
        the dispatcher (raw CUDA from C extensions, Triton kernels launched
        directly): one hash kernel per launch, as before.

    Use ``with fr:`` around the training loop and call ``fr.step()`` at the
    end of each step (or ``fr.attach(optimizer)``), or enter ``with fr:``
    once per step: leaving it ends the step.  Every rank must make the same
    number of steps (a compare is a collective).
    """

    def __init__(self, every: int = 100, keep_steps: int = 4, *, trace: str = "flight.kdt",
                 keep_digests: int = 1 << 16, ring_capacity: int = 1 << 20, group: Any = None,
                 signals: tuple = (signal.SIGTERM, signal.SIGINT), batch_gpu_work: bool = True,
                 compare: str = "replicas", hashes: str = "compared") -> None:
        for name, v, lo in (("every", every, 1), ("keep_steps", keep_steps, 1), ("keep_digests", keep_digests, 0)):
            if type(v) is not int or v < lo:
                raise ValueError(f"FlightRecorder({name}={v!r}): give an int >= {lo}")
        if not isinstance(trace, (str, os.PathLike)):
            raise TypeError(f"FlightRecorder(trace={trace!r}): give a file path")
        if compare not in ("replicas", "all"):
            raise ValueError(f"FlightRecorder(compare={compare!r}): give 'replicas' (what must agree across "
                             "data-parallel ranks: attach(optimizer)) or 'all' (every kernel: only for ranks "
                             "that compute on identical inputs)")
        if hashes not in ("compared", "all"):
            raise ValueError(f"FlightRecorder(hashes={hashes!r}): give 'compared' (hash what the compare uses) "
                             "or 'all' (every kernel's outputs too, for dumps compared run to run)")
        self.compare = compare
        self.hashes = hashes
        # every launch hashed for the whole block, or only inside attach()'s optimizer windows
        self._hash_all = compare == "all" or hashes == "all"
        self._window_open = False  # the optimizer window's hashing is on (Note [Hash windows] in csrc/kd_launch.c)
        from . import hashing

        self._bitwise_spec = hashing.parse("bitwise")[0]  # the spec id the window's hashes get
        from .mode import DebugMode

        self.every = every
        self.keep_steps = keep_steps
        self.trace = os.fspath(trace)
        self.group = group
        self._signals = tuple(signals)
        self._dm = DebugMode(kernels_only=True, ring_capacity=ring_capacity, overflow="overwrite",
                             batch_gpu_work=batch_gpu_work)
        self._rec = self._dm._recorder
        if self._rec.capacity * _C.SLOT_BYTES <= _PREFAULT_MAX_BYTES:  # resident now, not faulted in launch by launch
            self._rec.prefault()  # (Note [Ring prefault]); a larger ring stays lazily mapped
        # kdebug.replicated marks under it become this recorder's records (_mark); weak: no cycle keeps a
        # dropped recorder's ring (resident: Note [Ring prefault]) alive until a garbage collection
        self._dm._flight = weakref.ref(self)
        self._marks: dict[int, list[int]] = {}  # step -> launch indices of its kdebug.replicated records
        self._hash_ctx = None
        self._depth = 0
        self._thread = 0
        self._step = 0               # the open step's number
        self._open_from = 0          # the open step's first launch index
        self._open_ticket = 0        # about where it begins in the ring (the head when it opened): a digest's hint
        self._tickets: dict[int, int] = {}  # closed step -> its _open_ticket
        self._explicit = False       # step() was called in this `with` block
        self._closed: collections.deque = collections.deque()  # (step, first, end) of closed steps in the table or ring
        # step -> its replica launches [first, end) and the ring ticket its first began at (compare="replicas")
        self._replica: dict[int, tuple[int, int, int]] = {}
        self._replica_from: int | None = None  # the open step's optimizer step began at this launch index
        self._replica_ticket = 0  # and at about this ring ticket
        self._replica_names: dict[int, str] = {}  # id(parameter) -> its name (attach(optimizer, model))
        self._state_cache: dict[int, tuple] = {}  # id(optimizer) -> _state_of's list and where each came from
        self._grad_cache: dict[int, tuple] = {}  # id(optimizer) -> its parameters, (grad name, parameter)
        self._grad_plan_cache: dict[int, tuple] = {}  # id(optimizer) -> _grads_plan's layout
        self._pending: list[StepDigest] = []  # digested, not compared yet
        self._digested: dict[int, StepDigest] = {}  # digests of the closed steps still held in full
        self.digests: collections.deque = collections.deque(maxlen=keep_digests or None)
        self.divergence: Divergence | None = None
        self.dumped: str | None = None  # path of the last dump
        self._auto_dumped: str | None = None  # the automatic one's: the first wins, a requested one does not count
        self.stats = {"steps": 0, "compares": 0, "early_drains": 0, "uncompared_steps": 0,
                      "incomplete_steps": 0, "forgotten_launches": 0, "digests_dropped": 0,
                      "compare_errors": 0, "waiting_compares": 0, "replica_records": 0,
                      "replica_tensors_skipped": 0}
        self._installed = False
        self._dumping = False
        self._prev_handlers: dict[int, Any] = {}
        self._warned: set[str] = set()

    # ---------------------------------------------------------- entering, steps
    def __enter__(self) -> "FlightRecorder":
        from .mode import DebugMode

        if self._depth:
            raise RuntimeError("this FlightRecorder is already entered; enter it once (around the loop, "
                               "with fr.step() per step) or once per step")
        self._dm.__enter__()
        try:
            if self._hash_all:
                self._hash_ctx = DebugMode.log_tensor_hashes("bitwise")
                self._hash_ctx.__enter__()
        except BaseException:
            self._dm.__exit__(None, None, None)
            raise
        self._depth = 1
        if self._rec.seen == self._open_from:  # nothing of the open step recorded yet: it begins at the head
            self._open_ticket = self._rec.ticket
        self._thread = threading.get_ident()
        self._explicit = False
        self._install()
        return self

    def __exit__(self, et, ev, tb) -> None:
        if not self._depth:
            raise RuntimeError("FlightRecorder.__exit__ without a matching __enter__")
        self._depth = 0
        ctx, self._hash_ctx = self._hash_ctx, None
        try:
            self._close_window()  # an optimizer step that raised leaves its window open
            if ctx is not None:
                ctx.__exit__(None, None, None)
        finally:
            self._dm.__exit__(et, ev, tb)
        if et is not None:
            if not (et is SystemExit and getattr(ev, "code", None) in (0, None)):
                self._dump_once(f"{et.__name__} escaped the FlightRecorder block: {ev}")
            return
        if not self._explicit:
            self.step()  # leaving a per-step block ends its step
        # else: launches after the last step() (or optimizer step) stay in the open step, which a
        # dump holds; closing it here would give this rank a step the others may not have (rank 0's
        # evaluation after training), whose compare would run a collective on this rank alone
        # and hang the job's next one

    def attach(self, optimizer, model: Any = None) -> Any:
        """Ends a step after every ``optimizer.step()`` and records what must
        agree across data-parallel ranks (Note [Replica state records] in
        csrc/kd_state_record.c): the gradients the step starts from (already
        reduced across ranks) and the parameters and optimizer state it
        leaves, with the optimizer's own launches between them; with
        ``compare="replicas"`` that is what a compare compares.  ``model``
        (optional) names the parameters (``model.named_parameters()``).
        Returns a handle; ``handle.remove()`` detaches both hooks."""
        if model is not None:
            self._replica_names.update({id(p): n for n, p in model.named_parameters()})
            self._grad_cache.clear()  # names planned before these were known
            self._grad_plan_cache.clear()
            self._state_cache.clear()
        # never traced: a compiled optimizer step would otherwise compile kdebug's bookkeeping
        begin = torch._dynamo.disable(self._replica_begin)
        end = torch._dynamo.disable(self._replica_end)
        pre = optimizer.register_step_pre_hook(begin)
        post = optimizer.register_step_post_hook(lambda opt, *_: end(opt))
        return _Handles(pre, post)

    def _tensor_name(self, p, gi: int, pi: int) -> str:
        return self._replica_names.get(id(p)) or f"group{gi}.param{pi}"

    @staticmethod
    def _plan(named: list) -> tuple[list, int]:
        """The records of the (name, tensor) pairs: ([(names, tensors)], skipped),
        one record per device with at most _C.STATE_RECORD_MAX tensors (that
        many CUDA tensors of a record are hashed on the GPU, Note [Replica
        state records]).  Tensors with no data of their own (a sharded
        DTensor, a fake tensor) are not replicas here, nor are sparse ones
        (nn.Embedding(sparse=True)'s gradients: a rank's indices need not be
        laid out as another's, and the launch path hashes strided memory):
        skipped."""
        by_dev: dict = {}
        skipped = 0
        for name, src in named:
            # a Replicate DTensor: its local tensor must agree; a sharded one is no replica
            t = _upstream.replica_value(src) if isinstance(src, torch.Tensor) else None
            if t is None or t.layout != torch.strided:
                skipped += 1
                continue
            names, tensors, sources = by_dev.setdefault(t.device, ([], [], []))
            names.append(name)
            tensors.append(t)
            sources.append(None if t is src else src)  # unwrapped: read again at every record
        m = _C.STATE_RECORD_MAX
        records = []
        for names, tensors, sources in by_dev.values():
            for k in range(0, len(tensors), m):
                unwrapped = sources[k:k + m]
                records.append((_Names(names[k:k + m]), tensors[k:k + m],
                                unwrapped if any(x is not None for x in unwrapped) else None))
        return records, skipped

    def _record_replicas(self, what: str, plan: tuple[list, int]) -> None:
        """Records a _plan's records; skipped tensors are counted and warned about."""
        records, skipped = plan
        resolved = []
        for names, tensors, sources in records:
            if sources is None:
                resolved.append((names, tensors))
                continue
            # a DTensor's local tensor can be replaced under the same DTensor (module.to() swaps
            # parameters in place): planned again from the DTensors, never taken from the cache
            again, lost = self._plan([(n, t if src is None else src) for n, t, src in zip(names, tensors, sources)])
            skipped += lost
            resolved += [(n, t) for n, t, _ in again]
        if skipped:
            self.stats["replica_tensors_skipped"] += skipped
            self._warn_once("skipped", f"kdebug FlightRecorder: {skipped} optimizer tensor(s) are sharded "
                            "DTensors (FSDP), other wrapper subclasses whose ranks hold different parts, or sparse "
                            "tensors (sparse gradients): not compared across ranks")
        for names, tensors in resolved:
            if _C.record_state(what, names.ids, tensors):
                self.stats["replica_records"] += 1

    def _mark(self, value, name: str) -> None:
        """kdebug.replicated(t, name) under this recorder (``value``: what
        crossrank.marked_value gave for t): a record
        ``kdebug::flight_replicated`` of it, hashed bitwise in or out of an
        optimizer window, compared with the step it was made in (under
        compare="replicas" together with the step's optimizer window), held
        and forgotten with that step."""
        was_open = self._window_open
        self._open_window()
        try:
            seen = self._rec.seen
            recorded = _C.record_state("kdebug::flight_replicated", [name], [value])
        finally:
            if not was_open:
                self._close_window()
        if recorded and self._rec.seen == seen + 1:  # (into another, inner recording: not ours to compare)
            self.stats["replica_records"] += 1
            self._marks.setdefault(self._step, []).append(seen)

    def _open_window(self) -> None:
        """Hashing on for the optimizer window (Note [What the flight recorder
        hashes]): a count on this recorder (Note [Hash windows] in
        csrc/kd_launch.c), not a log_tensor_hashes() context, so it needs no
        order among step hooks and adds to a user's own hash settings; a
        closure's later calls find it open already."""
        if self._hash_all or self._window_open:
            return
        self._rec.hash_window(1, self._bitwise_spec)
        self._window_open = True

    def _close_window(self) -> None:
        if self._window_open:
            self._window_open = False
            self._rec.hash_window(0, 0)
            _C.defer_flush()  # the window's queued GPU hashes go now, not at the next guard or window

    def _grads_record(self, opt) -> None:
        """The step's compared range begins here, with its gradients: from
        the cached plan by C (Note [Replica checks in C] in
        csrc/kd_state_record.c) while it fits, else planned here."""
        self._open_window()
        self._replica_from = self._rec.seen
        self._replica_ticket = self._rec.ticket  # where it begins in the ring: a hint for the digest
        cached = self._grad_plan_cache.get(id(opt))
        if cached is not None:
            made = _C.record_grads(what="kdebug::flight_grads", groups=opt.param_groups, **cached[3])
            if made is not None:
                self.stats["replica_records"] += made
                return
        self._record_replicas("kdebug::flight_grads", self._grads_plan(opt))

    def _grads_plan(self, opt) -> tuple[list, int]:
        """_plan of the gradients (name + '.grad', p.grad).  Gradients are new
        tensors after zero_grad(set_to_none=True), so they cannot be cached as
        the state is; what is reused is the plan's layout (which gradients go
        to which record) while every gradient has data of its own
        (_upstream.has_no_data: _plan then records each as itself) on the same
        device as when it was planned, and the same ones are None.  That keeps
        a step's host work to one attribute read per gradient and one C call
        for the checks of all of them (was a full _plan: 0.07 of 0.17 ms per
        AdamW step of the 50-parameter transformer, on the 2-core CPU
        machine; the checks asked of Python one by one took 69 us of it on
        the H200 host)."""
        named = self._grad_names(opt)
        grads = [p.grad for _, p in named]
        # all at once in C (Note [Plain replica tensors] in csrc/kd_state_record.c): a device code
        # per gradient that plainly has data of its own, or None for any other
        devices = _C.replica_devices(grads, _upstream.PLAIN_TENSORS)
        own = devices is not None
        if not own:  # a gradient of another type: asked one by one
            devices = [None if g is None else g.device for g in grads]
            own = all(g is None or not _upstream.has_no_data(g) for g in grads)
        cached = self._grad_plan_cache.get(id(opt))
        if own and cached is not None and cached[0] is named and cached[1] == devices:
            return [(names, [grads[i] for i in idx], None) for names, idx in cached[2]], 0
        plan = self._plan([(n, g) for (n, _), g in zip(named, grads) if g is not None])
        if own and plan[1]:
            own = False  # some skipped (sparse): planned again each step, so each step counts them
        if own:
            # every gradient planned as itself: where each went, by its index in grads
            where = {id(g): i for i, g in enumerate(grads) if g is not None}
            layout = [(names, [where[id(t)] for t in tensors]) for names, tensors, _ in plan[0]]
            if len(self._grad_plan_cache) >= 8:
                self._grad_plan_cache.clear()
            params, _, sizes = self._grad_cache[id(opt)]
            # what _C.record_grads checks and records (Note [Replica checks in C])
            fast = {"sizes": list(sizes), "params": list(params), "devices": list(devices),
                    "ids": [names.ids for names, _ in layout],
                    "indices": [array.array("i", idx).tobytes() for _, idx in layout],
                    "plain_types": _upstream.PLAIN_TENSORS}
            self._grad_plan_cache[id(opt)] = (named, devices, layout, fast)
        else:
            self._grad_plan_cache.pop(id(opt), None)
        return plan

    def _grad_names(self, opt) -> list:
        """(name + '.grad', parameter) of ``opt``'s parameters in order,
        reused while the param groups hold the same parameters (the
        gradients themselves are new tensors after zero_grad(set_to_none=True):
        read each step)."""
        params = [p for g in opt.param_groups for p in g["params"]]
        sizes = [len(g["params"]) for g in opt.param_groups]  # a parameter moved to another group: another name
        cached = self._grad_cache.get(id(opt))
        if (cached is not None and cached[2] == sizes and len(cached[0]) == len(params)
                and all(map(is_, cached[0], params))):
            return cached[1]
        names = [(self._tensor_name(p, gi, pi) + ".grad", p) for gi, g in enumerate(opt.param_groups)
                 for pi, p in enumerate(g["params"])]
        if len(self._grad_cache) >= 8:
            self._grad_cache.clear()
        self._grad_cache[id(opt)] = (params, names, sizes)
        return names

    def _replica_begin(self, opt, args=(), kwargs=None):
        """The optimizer step's pre-hook.  A step given a closure (LBFGS,
        ``opt.step(closure)``) runs the forward and backward inside it, each
        rank on its own data: the closure is wrapped so that the compared
        range begins after its last call, with the gradients it left."""
        if not self._depth:
            return None
        kwargs = dict(kwargs or {})
        # torch.optim's hook gets the step's own args: (optimizer, [closure])
        closure = kwargs.get("closure", args[1] if len(args) > 1 else None)
        if closure is None:
            self._grads_record(opt)
            return None
        self._replica_from = None  # set by the closure's last call

        def closure_then_grads():
            loss = closure()
            self._grads_record(opt)
            return loss

        wrapped = torch._dynamo.disable(closure_then_grads)
        if "closure" in kwargs:
            kwargs["closure"] = wrapped
            return tuple(args), kwargs
        return (args[0], wrapped) + tuple(args[2:]), kwargs

    def _state_of(self, opt) -> list:
        """(name, tensor) of every parameter and optimizer state tensor (_state_entry)."""
        return self._state_entry(opt)[1]

    def _state_plan(self, opt) -> tuple[list, int]:
        """The records of _state_of's tensors (_plan), cached with them."""
        return self._state_entry(opt)[2]

    def _state_entry(self, opt) -> tuple:
        """(name, tensor) of every parameter and optimizer state tensor of
        ``opt``, in a fixed order; built once and reused while every
        parameter, state dict and state tensor is still the same object with
        the same keys (AdamW and SGD update their state in place; a first
        step, load_state_dict or a new param group rebuild it), which keeps a
        step's host work to identity checks in C (_C.state_unchanged: Note
        [Replica checks in C])."""
        cached = self._state_cache.get(id(opt))
        if (cached is not None and cached[3] is not None
                and _C.state_unchanged(opt.param_groups, opt.state, cached[3], torch.Tensor)):
            return cached
        named = []
        for gi, g in enumerate(opt.param_groups):
            for pi, p in enumerate(g["params"]):
                name = self._tensor_name(p, gi, pi)
                named.append((name, p))
                st = opt.state.get(p)
                # a parameter's state is a mapping (torch.optim's always is); anything else holds no state
                items = st.items() if isinstance(st, collections.abc.Mapping) else ()
                for key, v in sorted(items, key=lambda kv: str(kv[0])):
                    if isinstance(v, torch.Tensor):
                        named.append((f"{name}.{key}", v))
        if len(self._state_cache) >= 8:  # optimizers replaced over a job: their tensors are not kept alive
            self._state_cache.clear()
        state = opt.state
        # what _C.state_unchanged compares; None (built again at every step) for an
        # optimizer whose state is not a dict of dicts
        check = None
        if isinstance(state, dict) and all(type(st) is dict for st in state.values()):
            sts = list(state.values())
            held = [(st, k, v) for st in sts for k, v in st.items() if isinstance(v, torch.Tensor)]
            mixed = [st for st in sts if not all(isinstance(v, torch.Tensor) for v in st.values())]
            check = _StateCheck(
                sizes=[len(g["params"]) for g in opt.param_groups],
                params=[p for g in opt.param_groups for p in g["params"]],
                keys=list(state), dicts=sts, lens=list(map(len, sts)),
                held_dicts=[st for st, _, _ in held], held_keys=[k for _, k, _ in held], held=[v for _, _, v in held],
                mixed=mixed, mixed_keys=[list(st) for st in mixed],
                others=[(st, k) for st in mixed for k, v in st.items() if not isinstance(v, torch.Tensor)])
        # the same objects, so the same records, until the list is rebuilt
        entry = ([len(g["params"]) for g in opt.param_groups], named, self._plan(named), check)
        self._state_cache[id(opt)] = entry
        return entry

    def _replica_end(self, opt) -> None:
        if not self._depth:
            return
        try:
            self._record_replicas("kdebug::flight_state", self._state_plan(opt))
        finally:
            self._close_window()
        if self._replica_from is not None:
            self._replica[self._step] = (self._replica_from, self._rec.seen, self._replica_ticket)
        self._replica_from = None
        self.step()

    def _seen(self) -> int:
        return self._rec.seen

    def step(self) -> None:
        """Ends the current step; compares across replicas every ``every`` steps."""
        # counters read in O(1): stats() counts lost launches by walking every
        # undrained record in the ring, which grew with the steps since the
        # last drain
        rec = self._rec
        seen = rec.seen
        self._closed.append((self._step, self._open_from, seen))
        self._tickets[self._step] = self._open_ticket
        self._step += 1
        self._open_from = seen
        self._open_ticket = rec.ticket
        self._explicit = True
        self.stats["steps"] += 1
        compared = self._step % self.every == 0
        if compared:
            self._compare()
        # the steps held in the ring (Note [Steps held in the ring]: after a compare too, the kept
        # ones) fill half of it: into the table with them, before launches to come overwrite them;
        # after a compare without waiting for the device, as the compare itself did not
        if rec.slots_used * 2 > rec.capacity:
            self.stats["early_drains"] += 1
            self._drain(wait=not compared, copy=True)
        elif not compared and _C.collect_ready(_READ_BACK_AT) != 0:  # many GPU hashes queued: read back
            self._warn_once("collect", "kdebug FlightRecorder: reading GPU hashes back without waiting "
                            "failed; a later compare waits for them")

    # ---------------------------------------------------------- drain, digests, memory
    def _drain(self, wait: bool = True, copy: bool = False) -> None:
        """Digests every closed step not yet digested, and forgets the
        launches of steps older than the last keep_steps closed steps once
        they are compared across ranks (so the first divergent step, found
        one window late, is still held for the dump).  The steps' launches
        stay where they are, in the ring (Note [Steps held in the ring] in
        csrc/core/kd_ring.h): a compare reads only the launches it digests;
        ``copy`` moves every launch into the table first (a dump, or a ring
        more than half full).  ``wait=False`` never synchronizes the device:
        a step whose compared launches still wait for their GPU hashes is
        digested by a later drain."""
        rec = self._rec
        if copy:
            rec.drain(wait=wait)
        else:
            rec.settle(wait=wait)
        for step, a, b in self._closed:
            if step in self._digested:
                continue
            marks, ticket = (), self._tickets.get(step)
            if self.compare == "replicas":  # what must agree across ranks: the optimizer step's records
                a, b, ticket = self._replica.get(step, (a, a, None))
                marks = [i for i in self._marks.get(step, ()) if not a <= i < b]  # kdebug.replicated outside it
            whole = rec.digest(a, b, ticket)
            parts = [rec.digest(i, i + 1) for i in marks]  # each mark's own digest
            if whole is None or None in parts:
                break  # its launches' GPU hashes are not all read back: a later drain digests it
            digest, launches, lost = whole.digest, b - a, (b - a) - whole.recorded
            for part in parts:  # mixed in in the order the marks were made
                launches += 1
                if part.recorded:
                    digest = _mix(digest, part.digest)
                else:
                    lost += 1
            d = StepDigest(step=step, launches=launches, lost=lost, digest=digest)
            if not d.complete:
                self.stats["incomplete_steps"] += 1
                self._warn_once("incomplete", f"kdebug FlightRecorder: step {step} lost {d.lost} of its "
                                f"{d.launches} launch record(s) (ring overwritten or hook errors): its digest "
                                "is not compared. Pass a larger ring_capacity or a smaller every.")
            self._digested[step] = d
            self._pending.append(d)
            if self.digests.maxlen is not None and len(self.digests) == self.digests.maxlen:
                self.stats["digests_dropped"] += 1
            self.digests.append(d)
        # without a process group nothing is ever compared: nothing is held for it
        uncompared = {d.step for d in self._pending} if self._pending and self._world()[0] is not None else ()
        while (len(self._closed) > self.keep_steps and self._closed[0][0] in self._digested
               and self._closed[0][0] not in uncompared):
            step, _, _ = self._closed.popleft()
            self._digested.pop(step, None)
            self._replica.pop(step, None)
            self._marks.pop(step, None)
            self._tickets.pop(step, None)
        keep_from = self._closed[0][1] if self._closed else self._open_from
        self.stats["forgotten_launches"] += rec.discard(keep_from)

    @property
    def kept_launches(self) -> int:
        """Launch records held (in the ring or the table, not forgotten)."""
        return self._rec.held_launches

    # ---------------------------------------------------------- comparing
    def _world(self):
        if not _dist_on():
            return None, 0, 1
        dist = _dist()
        return dist, dist.get_rank(self.group), dist.get_world_size(self.group)

    def rank(self) -> int:
        return self._world()[1]

    def _compare(self) -> None:
        # Note [Reading results without waiting]: steps whose GPU hashes are read back are
        # compared now, the rest at the next compare; only a step of an earlier window still
        # waiting (the device a whole window behind) makes it wait for the device
        self._drain(wait=False)
        late = next((st for st, _, _ in self._closed if st not in self._digested), None)
        if late is not None and late < self._step - self.every:  # bounds every rank's lag by `every` steps
            self.stats["waiting_compares"] += 1
            self._drain()
        dist, rank, world = self._world()
        if dist is None or self.divergence is not None:  # one rank: the collective still runs (NCCL's path tested alone)
            self._pending = []
            return
        if self.compare == "replicas" and world > 1 and not self.stats["replica_records"]:
            self._warn_once("nothing", "kdebug FlightRecorder: nothing to compare across ranks: no optimizer "
                            "step was recorded (compare='replicas' compares what must agree across data-parallel "
                            "ranks: call fr.attach(optimizer)); compare='all' compares every kernel, only right "
                            "when every rank computes on identical inputs")
        cap = 2 * self.every
        if len(self._pending) > cap:  # older rows left by failed compares
            self.stats["uncompared_steps"] += len(self._pending) - cap
            self._warn_once("dropped", f"kdebug FlightRecorder: {len(self._pending) - cap} step digest(s) "
                            "left by failed compares are not compared")
            del self._pending[:-cap]
        rows = self._pending
        try:
            vec = torch.full((cap + 1, _ROW), -1, dtype=torch.int64)
            vec[0, 0], vec[0, 1] = rank, len(rows)
            for i, d in enumerate(rows):
                vec[i + 1] = torch.tensor([d.step, d.launches, d.lost, _signed(d.digest)], dtype=torch.int64)
            if dist.get_backend(self.group) == "nccl":
                vec = vec.to(torch.device("cuda", torch.cuda.current_device()))
            out = [torch.empty_like(vec) for _ in range(world)]
            dist.all_gather(out, vec, group=self.group)
            gathered = []
            for t in out:
                t = t.cpu().tolist()
                gathered.append([(r[0], r[1], r[2], _unsigned(r[3])) for r in t[1:1 + t[0][1]]])
        except Exception as e:  # never the training job's problem: say so, keep the evidence
            self.stats["compare_errors"] += 1
            self._warn_once("compare", f"kdebug FlightRecorder: the compare across ranks failed ({e!r}); "
                            "steps are still recorded")
            return
        self.stats["compares"] += 1
        res = compare_rows(gathered)
        self.stats["uncompared_steps"] += res.skipped
        if res.divergence is not None:
            self.divergence = dataclasses.replace(res.divergence, detected_at=self._step - 1)
            inductor.warn("kdebug FlightRecorder: " + self.divergence.text(), stacklevel=4)
            # before the compared steps leave _pending: the dump's drain still holds them,
            # the divergent one among them
            self._dump_once("replicas diverged")
        done = set(res.compared)
        # the steps not yet digested on every rank go out again next time (the dump's drain
        # may have added newly digested ones to the same list)
        self._pending = [d for d in self._pending if d.step not in done]

    # ---------------------------------------------------------- dumping
    def path(self) -> str:
        """This rank's dump path: rank_path(trace, rank) under a process group, else trace."""
        dist, rank, _ = self._world()
        return rank_path(self.trace, rank) if dist is not None else self.trace

    def _dump_once(self, reason: str) -> None:
        # the first automatic dump wins; fr.dump() by hand (a snapshot) does not stand in for it: a
        # requested dump before a divergence kept the divergent step out of every dump (a trust pass)
        if self._auto_dumped is None and not self._dumping:  # a second signal during the dump: not again
            self._dumping = True
            try:
                self._auto_dumped = self.dump(reason=reason)
            except Exception as e:  # a failing dump never replaces the program's own error
                self._warn_once("dump", f"kdebug FlightRecorder could not write its dump: {e!r}")
            finally:
                self._dumping = False

    def dump(self, path: str | None = None, reason: str = "requested") -> str:
        """Writes the held steps (the last keep_steps closed steps, those not
        yet compared across ranks, and the open one) in full
        to ``path`` (default: ``self.path()``) and a text summary to path +
        '.txt'; returns the trace's path."""
        from . import trace as tr

        path = os.fspath(path) if path is not None else self.path()
        self._drain(copy=True)
        rec = self._rec
        dist, rank, world = self._world()
        steps = list(self._closed)
        if self._seen() > self._open_from:  # the open step, as far as it got
            steps.append((self._step, self._open_from, self._seen()))
        w = tr.Writer(path)
        kept, names = [], set()
        for step, a, b in steps:
            lo, hi = rec.position(a), rec.position(b)
            w.marker("kdebug::flight_step", f"kdebug flight recorder: step {step}")
            if hi > lo:
                w.launches(rec, lo, hi)
                names.update(rec.launch(i).kernel_name for i in range(lo, hi))
            d = self._digested.get(step)
            kept.append({"step": step, "launches": b - a, "recorded": hi - lo,
                         "digest": f"{d.digest:016x}" if d is not None else None})
        w.seal()
        flight = {"rank": rank, "world_size": world, "reason": reason, "every": self.every, "compare": self.compare,
                  "keep_steps": self.keep_steps, "steps": kept, "last_step": self._step,
                  "divergence": None if self.divergence is None else {
                      "step": self.divergence.step, "detected_at": self.divergence.detected_at,
                      "ranks": list(self.divergence.ranks), "reference": list(self.divergence.reference),
                      "groups": [[f"{d:016x}", list(r)] for d, r in self.divergence.groups.items()]},
                  "stats": dict(self.stats)}
        s = rec.stats()
        lost = sum(k["launches"] - k["recorded"] for k in kept)
        meta = {"stats": {"launches": sum(k["recorded"] for k in kept), "dropped": lost,
                          "complete": lost == 0}, "flight": flight}
        meta.update(tr.provenance_meta(sorted(names)))
        w.meta(meta)
        w.close()
        with open(path + ".txt", "w") as f:
            f.write(self.summary(reason, path, kept, s))
        self.dumped = path
        return path

    def summary(self, reason: str, path: str, kept: list, rstats: dict) -> str:
        dist, rank, world = self._world()
        lines = [f"kdebug flight recorder: rank {rank} of {world} (pid {os.getpid()}), {self._step} step(s) "
                 f"closed; dumped because: {reason}"]
        if self.divergence is not None:
            lines.append(self.divergence.text())
            lines.append(f"compared every {self.every} step(s): the first compare at or after step "
                         f"{self.divergence.step} saw it")
        elif dist is None or world == 1:
            lines.append("no process group (or one rank): nothing was compared")
        else:
            lines.append(f"no divergence seen in {self.stats['compares']} compare(s) (every {self.every} steps; "
                         "steps after the last compare are not compared)")
        if kept:
            still = " (the last one still open)" if kept[-1]["step"] == self._step else ""
            lines.append(f"{path} holds steps {kept[0]['step']}..{kept[-1]['step']} in full{still}; "
                         f"kdebug show {path}")
        if world > 1:
            d = self.divergence
            if d is None:
                a, b = 0, rank if rank != 0 else 1
            else:
                a, b = (d.reference[0], rank) if rank in d.ranks else (rank, d.ranks[0])
            if self.compare == "replicas":
                lines.append(f"kdebug diff --ranks {self.trace}: the first gradient, parameter or optimizer "
                             "launch where the replicas differ")
            else:
                lines.append(f"kdebug diff {rank_path(self.trace, a)} {rank_path(self.trace, b)}: "
                             "the first kernel where these ranks differ")
        lines.append(f"steps not compared (launches lost): {self.stats['uncompared_steps']}; "
                     f"launch records lost: {rstats['dropped'] + rstats['unrecorded']}")
        return "\n".join(lines) + "\n"

    # ---------------------------------------------------------- dying
    def _install(self) -> None:
        if self._installed:
            return
        self._installed = True
        atexit.register(self._at_exit)
        if threading.current_thread() is not threading.main_thread():
            if self._signals:
                self._warn_once("signals", "kdebug FlightRecorder entered off the main thread: signals "
                                "cannot be handled there, so a SIGTERM / SIGINT does not dump")
            return
        for sig in self._signals:
            try:
                self._prev_handlers[sig] = signal.signal(sig, self._on_signal)
            except (ValueError, OSError) as e:
                self._warn_once(f"signal{sig}", f"kdebug FlightRecorder cannot handle signal {sig}: {e}")

    def close(self) -> None:
        """Removes the signal handlers (restoring the previous ones) and the
        atexit hook.  Recording state stays readable."""
        if self._depth:
            raise RuntimeError("leave the FlightRecorder's `with` block before close()")
        for sig, prev in self._prev_handlers.items():
            if signal.getsignal(sig) == self._on_signal:
                signal.signal(sig, prev if prev is not None else signal.SIG_DFL)
        self._prev_handlers.clear()
        if self._installed:
            atexit.unregister(self._at_exit)
            self._installed = False

    def _on_signal(self, signum, frame) -> None:
        self._dump_once(f"signal {signal.Signals(signum).name}")
        prev = self._prev_handlers.get(signum)
        if callable(prev):
            prev(signum, frame)
        elif prev == signal.SIG_IGN:
            return
        else:  # the default action (or a handler not set from Python): do it
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    def _at_exit(self) -> None:
        ev = getattr(sys, "last_value", None)
        if ev is not None and not (isinstance(ev, SystemExit) and ev.code in (0, None)):
            self._dump_once(f"the program ended with an uncaught {type(ev).__name__}: {ev}")

    def _warn_once(self, key: str, msg: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            inductor.warn(msg, stacklevel=4)


_COUNT = 1 << 63


def check_meta(v, key: str, bad: Callable[[str], Exception]) -> dict:
    """META ``flight`` checked (Note [META schema] in kdebug/trace.py)."""
    def count(x, where, lo=0):
        if type(x) is not int or not lo <= x < _COUNT:
            raise bad(f"META key {where!r} must be an integer from {lo} to 2**63-1, not {x!r:.40}")
        return x

    def hexdigest(x, where):
        if x is None:
            return None
        if not (isinstance(x, str) and len(x) == 16 and all(c in "0123456789abcdef" for c in x)):
            raise bad(f"META key {where!r} must be 16 hex digits, not {x!r:.40}")
        return x

    if not isinstance(v, dict):
        raise bad(f"META key {key!r} must be an object")
    out = {"rank": count(v.get("rank", 0), key + ".rank"), "world_size": count(v.get("world_size", 1), key + ".world_size", 1),
           "every": count(v.get("every", 1), key + ".every", 1), "keep_steps": count(v.get("keep_steps", 1), key + ".keep_steps", 1),
           "last_step": count(v.get("last_step", 0), key + ".last_step")}
    reason = v.get("reason", "")
    if not isinstance(reason, str):
        raise bad(f"META key {key + '.reason'!r} must be a string")
    out["reason"] = reason
    mode = v.get("compare", "all")  # dumps written before compare= existed compared every launch
    if mode not in ("replicas", "all"):
        raise bad(f"META key {key + '.compare'!r} must be 'replicas' or 'all', not {mode!r:.40}")
    out["compare"] = mode
    steps = v.get("steps", [])
    if not isinstance(steps, list) or len(steps) > 1 << 20:
        raise bad(f"META key {key + '.steps'!r} must be a list of at most 2**20 steps")
    out["steps"] = []
    for i, s in enumerate(steps):
        w = f"{key}.steps[{i}]"
        if not isinstance(s, dict):
            raise bad(f"META key {w!r} must be an object")
        out["steps"].append({"step": count(s.get("step"), w + ".step"), "launches": count(s.get("launches"), w + ".launches"),
                             "recorded": count(s.get("recorded"), w + ".recorded"),
                             "digest": hexdigest(s.get("digest"), w + ".digest")})
    d = v.get("divergence")
    if d is not None:
        w = key + ".divergence"
        if not isinstance(d, dict):
            raise bad(f"META key {w!r} must be an object or null")
        ranks = d.get("ranks", [])
        ref = d.get("reference", [])
        groups = d.get("groups", [])
        if not (isinstance(ranks, list) and isinstance(ref, list) and isinstance(groups, list)):
            raise bad(f"META key {w!r}: ranks, reference and groups must be lists")
        out["divergence"] = {
            "step": count(d.get("step"), w + ".step"), "detected_at": count(d.get("detected_at"), w + ".detected_at"),
            "ranks": [count(r, w + ".ranks") for r in ranks], "reference": [count(r, w + ".reference") for r in ref],
            "groups": [[hexdigest(g[0], w + ".groups"), [count(r, w + ".groups") for r in g[1]]]
                       for g in groups if isinstance(g, list) and len(g) == 2 and isinstance(g[1], list)]}
        if len(out["divergence"]["groups"]) != len(groups):
            raise bad(f"META key {w + '.groups'!r}: each group is [digest, [ranks]]")
    else:
        out["divergence"] = None
    return out
