"""Per-rank traces: which rank this process is, where its trace goes, and
every rank's trace read back as one multi-rank run.

Note [Ranks]
Under torch.distributed every process of a job runs the same program, and a
``DebugMode(trace="run.kdt")`` in each would write one path.  So a process
that is a rank of a job writes ``run.rank{R}.kdt`` instead (rank_path), and
its META says which rank it is, the world size and the layout of its process
groups (``rank``, ``world_size``, ``groups``: META_SCHEMA in trace.py).

A process is a rank when torch.distributed is initialized (its rank and
world size are the default group's), or, before that, when torch's launcher
started it (``torch.distributed.run`` / ``torchrun`` set RANK and WORLD_SIZE
in its environment): ``kdebug record --nproc N`` enters the DebugMode before
the script calls init_process_group, and the trace path is chosen when the
mode is entered.  A world of one is a rank too (rank 0 of 1), so a job's
traces are named the same whatever its size.  The group layout can only be
known once the groups exist; it is written with the last META, at exit.

``kdebug.load("run.kdt")`` when run.kdt does not exist and run.rank0.kdt
does gives a ``RankedRun``: every rank's Run, by rank (``.ranks``,
``run[r]``).  Ranks are read from the files' names and checked against their
META: a file whose META names another rank, a missing rank or a world size
that disagrees is an error saying which file.
"""
from __future__ import annotations

import glob
import os
import re
from dataclasses import dataclass


def rank_path(stem: str, rank: int) -> str:
    """``run.rank{R}.kdt`` for stem ``run.kdt`` (a stem without an extension:
    ``run.rank{R}``); the path of rank R's trace."""
    if type(rank) is not int or rank < 0:
        raise ValueError(f"rank_path: rank must be an integer >= 0, not {rank!r}")
    base, ext = _split(os.fspath(stem))
    return f"{base}.rank{rank}{ext}"


@dataclass(frozen=True)
class RankInfo:
    """This process's place in a job."""

    rank: int
    world_size: int
    source: str   # "torch.distributed" (initialized) or "environment" (set by torch's launcher)


def _env_int(name: str) -> int | None:
    v = os.environ.get(name)
    if v is None or not v.strip().isdigit():
        return None
    return int(v)


def current() -> RankInfo | None:
    """This process's rank and world size: from the initialized default
    process group, else from RANK / WORLD_SIZE set by torch's launcher;
    None when neither says (an ordinary single process)."""
    from . import _upstream

    got = _upstream.dist_rank_world()
    if got is not None:
        return RankInfo(got[0], got[1], "torch.distributed")
    r, w = _env_int("RANK"), _env_int("WORLD_SIZE")
    if r is not None and w is not None and 0 <= r < w:
        return RankInfo(r, w, "environment")
    return None


def meta() -> dict:
    """The META keys of Note [Ranks] for this process (empty when it is no rank)."""
    from . import _upstream

    info = current()
    if info is None:
        return {}
    out = {"rank": info.rank, "world_size": info.world_size}
    groups = _upstream.dist_groups()
    if groups:
        out["groups"] = groups
    return out


def _split(stem: str) -> tuple[str, str]:
    base, ext = os.path.splitext(stem)
    if os.sep in ext or (os.altsep and os.altsep in ext):
        return stem, ""
    return base, ext


def rank_files(stem: str) -> dict[int, str]:
    """{rank: path} of the per-rank traces of ``stem`` that exist."""
    base, ext = _split(os.fspath(stem))
    name = re.compile(re.escape(base) + r"\.rank(0|[1-9][0-9]{0,6})" + re.escape(ext) + "$")
    out = {}
    for p in glob.glob(glob.escape(base) + ".rank*" + glob.escape(ext)):
        m = name.match(p)
        if m:
            out[int(m.group(1))] = p
    return dict(sorted(out.items()))


class RankedRun:
    """Every rank's trace of one job: ``ranks`` (sorted rank numbers),
    ``run[r]`` (rank r's kdebug.Run), ``paths``, ``world_size``, iteration
    in rank order.  Made by ``kdebug.load(stem)`` (Note [Ranks])."""

    def __init__(self, stem: str, runs: dict, paths: dict[int, str]):
        self.stem = stem
        self._runs = dict(sorted(runs.items()))
        self.paths = dict(sorted(paths.items()))

    @property
    def ranks(self) -> list[int]:
        return list(self._runs)

    @property
    def world_size(self) -> int:
        return max((r.meta.get("world_size", 0) for r in self._runs.values()), default=0)

    def __getitem__(self, rank: int):
        try:
            return self._runs[rank]
        except KeyError:
            raise KeyError(f"{self.stem}: no trace of rank {rank} (ranks {self.ranks})") from None

    def __len__(self) -> int:
        return len(self._runs)

    def __iter__(self):
        return iter(self._runs.values())

    def items(self):
        return self._runs.items()

    def problems(self) -> list[str]:
        return [p for r in self._runs.values() for p in r.problems()]

    def gaps(self) -> list[str]:
        """What the job's recordings missed (Note [A match needs whole
        recordings] in kdebug/cli.py): each incomplete rank's problems, and
        the ranks whose traces are missing where the job's world size is
        known ([] when nothing was missed)."""
        out = []
        for rank, r in self._runs.items():
            if not r.complete:
                out += r.problems() or [f"rank {rank}: the recording is incomplete"]
        ws = max((r.meta.get("world_size") or 0 for r in self._runs.values()
                  if isinstance(r.meta.get("world_size"), int)), default=0)
        if ws and len(self._runs) < ws:
            out.append(f"{ws - len(self._runs)} of the job's {ws} ranks' traces are missing")
        return out

    @property
    def complete(self) -> bool:
        return all(r.complete for r in self._runs.values()) and len(self._runs) == self.world_size

    def __repr__(self) -> str:
        return f"<kdebug.RankedRun {self.stem}: ranks {self.ranks} of {self.world_size}>"


def load_ranks(stem: str, *, quiet: bool = False) -> RankedRun:
    """Every per-rank trace of ``stem`` (Note [Ranks]); TraceFileError when
    there is none, one is unreadable, or their META disagree with their names."""
    from .trace import TraceFileError, load

    files = rank_files(stem)
    if not files:
        raise TraceFileError(os.fspath(stem), 0, "cannot read: no such file, and no per-rank traces "
                             f"({os.path.basename(rank_path(stem, 0))}, ...) next to it")
    runs = {}
    for r, p in files.items():
        run = load(p, quiet=quiet)
        got = run.meta.get("rank")
        if got is not None and got != r:
            raise TraceFileError(p, 0, f"its META says rank {got}, its name rank {r}: the files were renamed")
        runs[r] = run
    worlds = {run.meta["world_size"] for run in runs.values() if "world_size" in run.meta}
    if len(worlds) > 1:
        raise TraceFileError(os.fspath(stem), 0, f"the rank traces disagree on the world size ({sorted(worlds)}):"
                             " they come from different jobs")
    out = RankedRun(os.fspath(stem), runs, files)
    missing = [r for r in range(out.world_size) if r not in runs]
    if missing and not quiet:
        import warnings

        from .inductor import KdebugWarning

        warnings.warn(f"{stem}: the traces of rank(s) {missing} of {out.world_size} are missing; "
                      "the others are read", KdebugWarning, stacklevel=3)
    return out
