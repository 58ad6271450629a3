"""Where the accuracy check keeps the kernel outputs of one graph call: a
device tier, a host tier and a disk tier, each with its own budget.

Note [Output spill]
The accuracy check (Note [Accuracy check], kdebug/accuracy.py) compares what
every kernel of a graph call wrote, after the call.  So the clones of all of
them (record_outputs) are alive at once, and a large model's outputs do not
fit where they were made.  They are kept in tiers, per graph call:

- device tier: clones stay on the GPU where the kernel made them, up to
  ``max_device_bytes`` (default: an eighth of the device's free memory when
  the check starts);
- host tier: when the device tier is over its budget it is drained: the
  deferred clone copies are queued (Note [Deferred GPU work]), then all its
  clones are copied to pinned host memory without blocking, with the two
  device synchronizations of kdebug/values.py's ``_to_host`` per drain
  (clones finished on their kernels' streams; copies landed), never one per
  kernel.  A CPU clone is made in host memory, so on a CPU run it goes to
  the host tier at once.  The host tier holds up to ``max_host_bytes``
  (default: a quarter of the memory available when the check starts);
- disk tier: what the host tier has no room for is written to a temporary
  values file (kdebug/values.py's Writer, Note [Recorded values on disk]:
  one format), in a private directory (mkdtemp, mode 0700) under
  ``spill_dir`` (default: the temp directory; a symbolic link is refused:
  kdebug/_files.py), up to ``max_disk_bytes`` (default: half of the free
  space there).  It is read back (values.py's reader) one buffer at a time
  when that buffer is compared, and the file and its directory are removed
  when the graph call has been checked, or the check ends.
- only a buffer the disk tier has no room for either is dropped: counted,
  and its BufferCheck says which budget was exhausted and which flag raises
  it.  Once all three tiers are full, launches are refused before they are
  cloned (the output filter of record_outputs), so nothing is copied for
  nothing.

The store sees the clones through the output filter that the C launch hook
calls before each launch clones (kdebug/values.py OutputFilter): there it
takes the clones made since the previous launch out of the recorder's
``outputs`` and places them.  So the device tier can exceed its budget by
the outputs of one launch (the launch that crosses it), until the next
launch or the end of the graph call drains it (and a device budget smaller
than one launch's outputs means a drain per launch).  Aten ops (extern
calls: matmuls, attention) are placed the same way: their clones come to
``keep_op`` from record_outputs' aten hook, and call.record keeps a Ref to
their slot.  Launches of graph calls that
are not checked keep nothing (the store is armed only while a checked call
runs).
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import tempfile
import threading
import time

import torch

from . import _C, _files, _flags, _upstream
from . import values as _values

# record_outputs' own byte cap, off: the store's tiers decide what is kept
NO_CAP = _flags.MAX_BYTES_MAX

# the CLI flag and API argument that raise each budget, for the reasons given
_RAISE = {"device": ("--max-device-bytes", "max_device_bytes"),
          "host": ("--max-host-bytes", "max_host_bytes"),
          "disk": ("--max-disk-bytes", "max_disk_bytes")}


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _mem_available() -> int | None:
    """Bytes of memory available to new allocations (Linux MemAvailable)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, AttributeError):
        return None


@dataclasses.dataclass
class Budgets:
    """The three tiers' budgets in bytes, per graph call (Note [Output spill])."""

    device: int
    host: int
    disk: int
    spill_dir: str

    @classmethod
    def resolve(cls, max_device_bytes=None, max_host_bytes=None, max_disk_bytes=None,
                spill_dir=None) -> "Budgets":
        """Budgets from the arguments, the defaults filled in from the memory
        and disk space free now; a bad value raises TypeError/ValueError, a
        spill_dir that is a symbolic link raises _files.LinkRefused."""
        d = os.fspath(spill_dir) if spill_dir is not None else tempfile.gettempdir()
        _files.refuse_link(d)
        if not os.path.isdir(d):
            raise ValueError(f"spill_dir {d!r} is not a directory; create it first, or give another "
                             "(--spill-dir)")

        def given(name, v):
            return None if v is None else _flags.integer("accuracy", name, v, 0, _flags.MAX_BYTES_MAX, " bytes")

        dev, host, disk = (given("max_device_bytes", max_device_bytes), given("max_host_bytes", max_host_bytes),
                           given("max_disk_bytes", max_disk_bytes))
        if dev is None:
            dev = 0
            if torch.cuda.is_available():
                try:
                    dev = torch.cuda.mem_get_info()[0] // 8
                except RuntimeError:
                    dev = 0
        if host is None:
            avail = _mem_available()
            host = avail // 4 if avail is not None else 1 << 30
        if disk is None:
            try:
                disk = shutil.disk_usage(d).free // 2
            except OSError:
                disk = 0
        return cls(dev, host, disk, d)

    def full_reason(self) -> str:
        """Why a buffer was not kept: every tier was full (the disk tier last)."""
        flag, arg = _RAISE["disk"]
        if self.disk == 0:
            return (f"not recorded: over the device ({self.device} B) and host ({self.host} B) budgets, and "
                    f"spilling to disk is off ({flag} 0); raise {flag} ({arg}=)")
        return (f"not recorded: over the disk budget ({self.disk} B, after the device {self.device} B and host "
                f"{self.host} B budgets); raise {flag} ({arg}=)")


@dataclasses.dataclass
class SpillStats:
    """What the tiers held, over the whole check (the report's summary)."""

    device_budget: int = 0
    host_budget: int = 0
    disk_budget: int = 0
    spill_dir: str = ""
    kept_in_place: int = 0     # buffers kept where they were made (the device tier, or CPU clones on the host)
    to_host: int = 0           # buffers moved from the device tier to host memory
    host_bytes_peak: int = 0
    to_disk: int = 0           # buffers written to a spill file
    disk_bytes: int = 0        # bytes written, all graph calls
    disk_bytes_peak: int = 0
    dropped: int = 0           # buffers over every budget (not compared)
    launches_refused: int = 0  # launches that kept nothing: every tier was full
    drains: int = 0            # device -> host drains
    write_errors: int = 0
    seconds: float = 0.0       # spent placing, draining, writing and reading back (not in the tiers' absence)

    def spilled(self) -> bool:
        return bool(self.to_host or self.to_disk or self.dropped or self.launches_refused)

    def line(self) -> str:
        """One line for the report's summary."""
        def size(n):
            return f"{n / 2**20:.3g} MiB" if n >= 2**20 else f"{n} B"

        text = (f"kernel/extern outputs: {self.kept_in_place} buffer(s) kept where they were made, {self.to_host} "
                f"spilled to host memory ({self.drains} drain(s)), {self.to_disk} to disk "
                f"({size(self.disk_bytes)}, temporary files under {self.spill_dir}, removed)")
        if self.dropped or self.launches_refused:
            text += (f"; {self.dropped} buffer(s) and {self.launches_refused} launch(es) over every budget "
                     "were not recorded (see why below)")
        return text + (f" [budgets per graph call: device {size(self.device_budget)}, host "
                       f"{size(self.host_budget)}, disk {size(self.disk_budget)}]")


@dataclasses.dataclass
class Dropped:
    """A recorded output that was not kept: why."""

    reason: str


@dataclasses.dataclass(frozen=True)
class Ref:
    """What an aten op's call.record holds for each output clone the store
    took (SpillStore.keep_op): its slot, whichever tier it is in now."""

    key: tuple
    arg: str


@dataclasses.dataclass
class OnDisk:
    """A recorded output in the spill file: read back by SpillStore.load."""

    launch: object  # the slot key
    arg: str


class SpillStore:
    """The tiered store of one check (Note [Output spill]).  ``arm()`` when a
    checked graph call starts, ``finish()`` when it ends, then ``outputs(i)``
    / ``load(v)`` while comparing, ``release()`` when done with the call."""

    def __init__(self, budgets: Budgets, recorder_of) -> None:
        self.budgets = budgets
        self._recorder_of = recorder_of  # () -> the DebugMode's C recorder (its .outputs)
        self.stats = SpillStats(budgets.device, budgets.host, budgets.disk, budgets.spill_dir)
        self._lock = threading.RLock()
        self._armed = False
        self._reset()

    def _reset(self) -> None:
        # launch index (a kernel's) or ("op", n) (an aten op's) -> {arg: tensor | OnDisk | Dropped}
        self._slots: dict[object, dict[str, object]] = {}
        self._op_seq = 0
        self._disk_ids: dict[object, int] = {}  # slot key -> the launch number it has in the spill file
        self._device: list[tuple[int, str, torch.Tensor]] = []  # the device tier, oldest first
        self._device_bytes = 0
        self._host_bytes = 0
        self._disk_bytes = 0
        self._refused: set[int] = set()
        self._dir: str | None = None
        self._writer: _values.Writer | None = None
        self._reader: _values.Values | None = None
        self._write_error: str | None = None

    # -- the output filter (called by the C launch hook before a launch clones) --
    def wants(self, name: str, launch_index: int | None) -> bool:
        """record_outputs' filter: whether this launch (or aten op, with
        launch_index None) keeps its outputs.  Places what earlier launches
        cloned first."""
        if not self._armed:
            return False
        if launch_index is None:
            return True  # an aten op: its clones come to keep_op, which places them
        with self._lock:
            t0 = time.perf_counter()
            try:
                self._take()
                if self._all_full():
                    self._refused.add(launch_index)
                    self.stats.launches_refused += 1
                    return False
                return True
            finally:
                self.stats.seconds += time.perf_counter() - t0

    __call__ = wants  # record_outputs(filter=store): values.OutputFilter calls it, and finds keep_op

    def keep_op(self, tree):
        """record_outputs' place for an aten op's output clones (values.py
        record_hooks): each tensor goes into the tiers like a kernel's, and
        call.record keeps a Ref to it."""
        if not self._armed:
            return tree
        with self._lock, _upstream.disable_torch_dispatch(), torch.no_grad():
            t0 = time.perf_counter()
            self._op_seq += 1
            key = ("op", self._op_seq)
            n = [0]

            def one(t):
                if not isinstance(t, torch.Tensor):
                    return t
                arg = f"out{n[0]}"
                n[0] += 1
                self._put(key, arg, t)
                return Ref(key, arg)

            out = _upstream.tree_map(one, tree)
            if self._device_bytes > self.budgets.device:
                self._drain()
            self.stats.seconds += time.perf_counter() - t0
            return out

    def _put(self, key, arg: str, t: torch.Tensor) -> None:
        slots = self._slots.setdefault(key, {})
        if t.device.type == "cpu":
            slots[arg] = self._place_host([(key, arg, t)], moved=False)[0]
        else:
            slots[arg] = t
            self._device.append((key, arg, t))
            self._device_bytes += _nbytes(t)

    def _all_full(self) -> bool:
        b = self.budgets
        return (self._device_bytes >= b.device and self._host_bytes >= b.host and self._disk_bytes >= b.disk)

    def _take(self) -> None:
        """Moves the clones in the recorder's outputs into the tiers, in
        launch order; drains the device tier when it is over its budget."""
        rec = self._recorder_of()
        outs = rec.outputs if rec is not None else {}
        if not outs:
            return
        with _upstream.disable_torch_dispatch(), torch.no_grad():
            for i in sorted(outs):
                for arg, t in outs.pop(i).items():
                    self._put(i, arg, t)
            if self._device_bytes > self.budgets.device:
                self._drain()

    def _drain(self) -> None:
        """The device tier to the host (and disk) tier: one batch of pinned,
        non-blocking copies (values._to_host); what has no room anywhere is
        dropped, newest first kept off the device."""
        b = self.budgets
        if self._host_bytes >= b.host and self._disk_bytes >= b.disk:
            # nowhere to go: the newest clones that put the device tier over are dropped
            while self._device and self._device_bytes > b.device:
                i, arg, t = self._device.pop()
                self._device_bytes -= _nbytes(t)
                self._drop(i, arg)
            return
        batch, self._device, self._device_bytes = self._device, [], 0
        # a clone may still be a deferred copy (Note [Deferred GPU work], csrc/kd_defer.h): queue it first
        _C.defer_flush()
        try:
            hosts = _values._to_host([t for _, _, t in batch])
        except (RuntimeError, MemoryError) as e:  # no pinned memory left: counted and explained, not raised
            for i, arg, _ in batch:
                self.stats.dropped += 1
                self._slots[i][arg] = Dropped(f"not recorded: its copy to host memory failed ({e}); lower "
                                              "--max-host-bytes")
            return
        self.stats.drains += 1
        placed = self._place_host([(i, arg, h) for (i, arg, _), h in zip(batch, hosts)], moved=True)
        for (i, arg, _), v in zip(batch, placed):
            self._slots[i][arg] = v

    def _place_host(self, items: list, moved: bool) -> list:
        """Host tensors (moved from the device tier, or CPU clones) to the
        host tier while it has room, else to disk, else dropped; returns
        what each slot holds."""
        b = self.budgets
        out = []
        for i, arg, t in items:
            n = _nbytes(t)
            if self._host_bytes + n <= b.host:
                self._host_bytes += n
                if moved:
                    self.stats.to_host += 1
                else:
                    self.stats.kept_in_place += 1
                self.stats.host_bytes_peak = max(self.stats.host_bytes_peak, self._host_bytes)
                out.append(t)
            elif self._disk_bytes + n <= b.disk and self._write(i, arg, t):
                self._disk_bytes += n
                self.stats.to_disk += 1
                self.stats.disk_bytes += n
                self.stats.disk_bytes_peak = max(self.stats.disk_bytes_peak, self._disk_bytes)
                out.append(OnDisk(i, arg))
            else:
                out.append(self._dropped())
        return out

    def _drop(self, i: int, arg: str) -> None:
        self._slots.setdefault(i, {})[arg] = self._dropped()

    def _dropped(self) -> Dropped:
        self.stats.dropped += 1
        if self._write_error is not None:
            return Dropped(f"not recorded: the spill file could not be written ({self._write_error})")
        return Dropped(self.budgets.full_reason())

    def _write(self, i: int, arg: str, t: torch.Tensor) -> bool:
        if self._write_error is not None:
            return False
        try:
            if self._writer is None:
                self._dir = tempfile.mkdtemp(prefix="kdebug-spill-", dir=self.budgets.spill_dir)
                self._writer = _values.Writer(os.path.join(self._dir, _values.FILE_NAME))
            self._writer.tensor(self._disk_ids.setdefault(i, len(self._disk_ids)), "", arg, t)
            return True
        except (OSError, ValueError) as e:  # a full disk: what is left is dropped, with this reason
            self._write_error = str(e)
            self.stats.write_errors += 1
            return False

    # -- one checked graph call --
    def arm(self) -> None:
        """A checked graph call starts: its launches keep their outputs."""
        with self._lock:
            self.release()
            self._armed = True

    def finish(self) -> None:
        """The graph call ended: places the last clones and makes the spill
        file readable."""
        with self._lock:
            t0 = time.perf_counter()
            self._armed = False
            self._take()
            if self._device_bytes > self.budgets.device:
                self._drain()
            if self._writer is not None:
                try:
                    self._writer.close()
                    self._reader = _values.open(self._writer.path)
                except (OSError, ValueError) as e:
                    self._write_error = self._write_error or str(e)
                    self.stats.write_errors += 1
                    for slots in self._slots.values():
                        for arg, v in slots.items():
                            if isinstance(v, OnDisk):
                                slots[arg] = Dropped(f"not recorded: the spill file could not be read back ({e})")
                self._writer = None
            self.stats.kept_in_place += len(self._device)
            self.stats.seconds += time.perf_counter() - t0

    def has(self, launch_index: int) -> bool:
        return launch_index in self._slots or launch_index in self._refused

    def outputs(self, launch_index: int) -> dict:
        """{arg: tensor | OnDisk | Dropped} of a launch; a refused launch's
        outputs are unknown here ({}), see refused()."""
        return dict(self._slots.get(launch_index, {}))

    def refused(self, launch_index: int) -> str | None:
        return self.budgets.full_reason() if launch_index in self._refused else None

    def slot(self, v):
        """What a Ref's slot holds now (a tensor, OnDisk or Dropped); anything
        else as it is."""
        if isinstance(v, Ref):
            return self._slots.get(v.key, {}).get(v.arg, Dropped("not recorded: its slot is gone"))
        return v

    def load(self, v):
        """The tensor a slot holds (a spilled one read back from disk, one
        buffer at a time); a Dropped raises LookupError."""
        v = self.slot(v)
        if isinstance(v, torch.Tensor):
            return v
        if isinstance(v, OnDisk):
            t0 = time.perf_counter()
            try:
                return self._load_disk(v)
            finally:
                self.stats.seconds += time.perf_counter() - t0
        raise LookupError(v.reason if isinstance(v, Dropped) else f"no value ({v!r})")

    def _load_disk(self, v: OnDisk) -> torch.Tensor:
        if self._reader is None:
            raise LookupError("not recorded: the spill file is not readable")
        try:
            return self._reader.value(self._disk_ids[v.launch], v.arg)
        except Exception as e:  # a corrupt or vanished spill file: not compared, with this reason
            raise LookupError(f"not recorded: the spilled value could not be read back ({e})") from None

    def release(self) -> None:
        """Drops this graph call's values and removes its spill file."""
        with self._lock:
            self._armed = False
            if self._writer is not None:
                with contextlib.suppress(OSError):
                    self._writer.close()
            self._reader = None  # its mmap is closed when the last buffer read from it is gone
            if self._dir is not None:
                shutil.rmtree(self._dir, ignore_errors=True)
            self._reset()


class LazyValues:
    """A read-only {node: value} whose spilled values are read back when
    asked for (Note [Local reference] runs on what the kernels wrote, without
    holding all of it in memory at once)."""

    def __init__(self, store: SpillStore) -> None:
        self._store = store
        self._d: dict = {}

    def __setitem__(self, key, v) -> None:
        self._d[key] = v

    def __contains__(self, key) -> bool:
        return key in self._d

    def __len__(self) -> int:
        return len(self._d)

    def __bool__(self) -> bool:
        return bool(self._d)

    def get(self, key, default=None):
        v = self._d.get(key)
        if v is None:
            return default
        try:
            return self._store.load(v)
        except LookupError:
            return default


def host_placer(device_budget: int):
    """For the reference runs' kept values (Note [Reference runs]): a place(t)
    that keeps device tensors on the device up to ``device_budget`` bytes and
    copies the rest to pinned host memory without blocking; ``.done()``
    synchronizes once if any copy was queued.  CPU tensors are kept as they
    are.  Untested here: no GPU (the lead's GPU test covers it)."""
    state = {"used": 0, "queued": set()}

    def place(t: torch.Tensor) -> torch.Tensor:
        if t.device.type == "cpu":
            return t
        n = _nbytes(t)
        if state["used"] + n <= device_budget:
            state["used"] += n
            return t
        h = torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=True)
        h.copy_(t, non_blocking=True)
        state["queued"].add(t.device)
        return h

    def done() -> None:
        for d in state["queued"]:
            torch.cuda.synchronize(d)
        state["queued"].clear()

    place.done = done
    return place
