"""The program's standard input, the same for every run of a hunt.

Note [One standard input for every run]
``kdebug hunt`` starts the program several times (its runs, the fixes' runs,
--confirm's pairs, the capture re-run).  Each used to inherit kdebug's own
standard input, so the first run read it all and every later run read an
empty stream: a script that read its configuration or data from stdin
diverged between runs by kdebug's doing (seen in an adversarial review:
``echo hello | kdebug hunt script.py`` named an ``aten::mul`` of ``len(stdin)``,
12.0 in run 0 and 0.0 in run 1).  What each run gets now, by what kdebug's
standard input is:

- a regular file (``< input.txt``): every run inherits it, positioned where it
  was when the hunt began (seekable, as the program would see it; nothing is
  read by kdebug);
- a pipe, FIFO or socket (``producer | kdebug hunt``): the first run reads it
  through a pipe kdebug feeds, keeping every byte it forwards; every later run
  is given those bytes and then the end of the stream.  A program that reads
  to the end gets the whole input in every run; one that reads a line gets at
  least that line.  The feeder takes what arrives even if the program never
  reads it: a shell loop that reads the same pipe (``... | while read f; do
  kdebug hunt $f; done``) loses those lines (redirect such a loop from a
  file instead: ``done < list.txt``);
- a terminal, or none: each run inherits it, as before (interactive input is
  asked of each run).

Only the kdebug command itself does this (``kdebug hunt`` / ``python -m
kdebug hunt``); kdebug.cli.main called with an argument list by another
program (a test suite: pytest-xdist's workers talk to their controller over
their standard input) leaves it alone.  In-process runs (--in-process) read
a Python stream over the same input.
"""
from __future__ import annotations

import io
import os
import stat
import subprocess
import sys
import threading

_CHUNK = 1 << 16


class ProgramInput:
    """kdebug's standard input as the hunt's runs see it (module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._kept = bytearray()  # every byte forwarded to the first run (a pipe)
        self._state = "unread"  # a pipe: "unread" -> "feeding" (the first run has it) -> "kept"
        self._fd, self._kind, self._pos = -1, "inherit", 0
        try:
            fd = sys.stdin.fileno() if sys.stdin is not None else -1
            if fd < 0 or os.isatty(fd):
                return
            mode = os.fstat(fd).st_mode
        except (OSError, ValueError, AttributeError):
            return  # closed, or replaced by something without a descriptor
        self._fd = fd
        if stat.S_ISREG(mode):
            try:
                self._pos = os.lseek(fd, 0, os.SEEK_CUR)
                self._kind = "file"
            except OSError:
                pass
        elif stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode):
            self._kind = "pipe"

    def _feed(self, dst) -> None:
        """Forwards kdebug's standard input into the first run's pipe until its
        end, or until the run stops reading (then what was read so far is kept)."""
        try:
            while True:
                try:
                    b = os.read(self._fd, _CHUNK)
                except OSError:
                    b = b""
                if not b:
                    break
                with self._lock:
                    self._kept += b
                try:
                    dst.write(b)
                    dst.flush()
                except (BrokenPipeError, OSError, ValueError):
                    break
        finally:
            try:
                dst.close()
            except OSError:
                pass

    def run(self, cmd: list[str], env: dict) -> subprocess.CompletedProcess:
        """subprocess.run(cmd) with stdout and stderr captured together as text,
        and the standard input every run shares."""
        if self._kind == "file":
            os.lseek(self._fd, self._pos, os.SEEK_SET)
            return _run(cmd, env, None)
        if self._kind != "pipe":
            return _run(cmd, env, None)
        with self._lock:
            first = self._state == "unread"
            if first:
                self._state = "feeding"
            data = bytes(self._kept)
        if not first:
            return _run(cmd, env, data)
        proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                env=env)
        try:
            # a daemon: when kdebug's input never ends and the run stopped reading, it stays blocked in read
            threading.Thread(target=self._feed, args=(proc.stdin,), daemon=True, name="kdebug-stdin").start()
            out = proc.stdout.read()
            proc.wait()
        except BaseException:  # interrupted: the run goes with kdebug, never left orphaned
            proc.kill()
            proc.wait()
            raise
        with self._lock:
            self._state = "kept"
        return subprocess.CompletedProcess(cmd, proc.returncode, out.decode(errors="replace"))

    def stream(self):
        """A text stream for an in-process run's sys.stdin, or None (leave it)."""
        enc, errors = (getattr(sys.stdin, "encoding", None) or "utf-8"), (getattr(sys.stdin, "errors", None)
                                                                          or "strict")
        if self._kind == "file":
            os.lseek(self._fd, self._pos, os.SEEK_SET)
            return io.TextIOWrapper(io.FileIO(self._fd, "rb", closefd=False), encoding=enc, errors=errors)
        if self._kind != "pipe":
            return None
        with self._lock:
            first = self._state == "unread"
            if first:
                self._state = "kept"  # in-process: this run reads it through _Tee, which keeps it
        if first:
            return io.TextIOWrapper(io.BufferedReader(_Tee(self)), encoding=enc, errors=errors)
        with self._lock:
            data = bytes(self._kept)
        return io.TextIOWrapper(io.BytesIO(data), encoding=enc, errors=errors)


def _run(cmd: list[str], env: dict, data: bytes | None) -> subprocess.CompletedProcess:
    """A run: its output captured as text (a program's bytes that are not UTF-8
    replaced, never an error of kdebug's); ``data``: its whole standard input,
    or None to inherit kdebug's."""
    p = subprocess.run(cmd, input=data, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    return subprocess.CompletedProcess(p.args, p.returncode, p.stdout.decode(errors="replace"))


class _Tee(io.RawIOBase):
    """kdebug's standard input, read by the first in-process run, keeping what it read."""

    def __init__(self, owner: ProgramInput) -> None:
        self._owner = owner

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        try:
            got = os.read(self._owner._fd, len(b))
        except OSError:
            got = b""
        with self._owner._lock:
            self._owner._kept += got
        b[:len(got)] = got
        return len(got)


_current: ProgramInput | None = None


def begin() -> ProgramInput:
    """The hunt's shared standard input, from here on (one per hunt)."""
    global _current
    _current = ProgramInput()
    return _current


def current_stream():
    """An in-process run's sys.stdin when a hunt began a shared input, else None."""
    return _current.stream() if _current is not None else None


def run(cmd: list[str], env: dict) -> subprocess.CompletedProcess:
    """A run of the program: through the hunt's shared standard input when a
    hunt began one, else inheriting kdebug's (stdout and stderr captured)."""
    if _current is not None:
        return _current.run(cmd, env)
    return _run(cmd, env, None)
