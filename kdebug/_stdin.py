"""The program's standard input, the same for every run of a hunt.

Note [One standard input for every run]
``kdebug hunt`` starts the program several times (its runs, the fixes' runs,
--confirm's pairs, the capture re-run).  Each used to inherit kdebug's own
standard input, so the first run read it all and every later run read an
empty stream: a script that read its configuration or data from stdin
diverged between runs by kdebug's doing (seen in an adversarial review:
``echo hello | kdebug hunt script.py`` named an ``aten::mul`` of ``len(stdin)``,
12.0 in run 0 and 0.0 in run 1).

Now the first run to start reads kdebug's standard input through a pipe that
kdebug feeds, keeping every byte it forwards; every later run is given those
bytes and then the end of the stream.  A program that reads to the end gets
the whole input in every run; one that reads a line gets at least that line
(the feeder may have forwarded more, up to the pipe's buffer; never less).
Nothing is read before the first run asks: a hunt started with an open pipe
that never ends, whose program never reads it, does not wait for it.  A
terminal is left to each run as it is (interactive input is asked of each
run, and a different answer is the user's); so is a closed standard input.
In-process runs (--in-process) read a Python stream over the same bytes.
"""
from __future__ import annotations

import io
import os
import subprocess
import sys
import threading

_CHUNK = 1 << 16


class ProgramInput:
    """kdebug's standard input as the hunt's runs see it (module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._kept = bytearray()  # every byte forwarded to the first run
        self._state = "unread"  # "unread" -> "feeding" (the first run has it) -> "kept"
        try:
            fd = sys.stdin.fileno() if sys.stdin is not None else -1
            self._fd = fd if fd >= 0 and not os.isatty(fd) else -1
        except (OSError, ValueError, AttributeError):
            self._fd = -1  # closed, or replaced by something without a descriptor

    @property
    def shared(self) -> bool:
        """Whether runs get kdebug's standard input through this object (not a
        terminal, not closed)."""
        return self._fd >= 0

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
        if not self.shared:
            return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        with self._lock:
            first = self._state == "unread"
            if first:
                self._state = "feeding"
            data = bytes(self._kept)
        if not first:
            p = subprocess.run(cmd, input=data, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
            return subprocess.CompletedProcess(p.args, p.returncode, p.stdout.decode(errors="replace"))
        proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                env=env)
        # a daemon: when kdebug's input never ends and the run stopped reading, it stays blocked in read
        threading.Thread(target=self._feed, args=(proc.stdin,), daemon=True, name="kdebug-stdin").start()
        out = proc.stdout.read()
        proc.wait()
        with self._lock:
            self._state = "kept"
        return subprocess.CompletedProcess(cmd, proc.returncode, out.decode(errors="replace"))

    def stream(self):
        """A text stream for an in-process run's sys.stdin, or None (leave it)."""
        if not self.shared:
            return None
        with self._lock:
            first = self._state == "unread"
            if first:
                self._state = "kept"  # in-process: this run reads it through _Tee, which keeps it
        if first:
            return io.TextIOWrapper(io.BufferedReader(_Tee(self)), encoding=sys.stdin.encoding or "utf-8",
                                    errors=sys.stdin.errors or "strict")
        with self._lock:
            data = bytes(self._kept)
        return io.TextIOWrapper(io.BytesIO(data), encoding=sys.stdin.encoding or "utf-8",
                                errors=sys.stdin.errors or "strict")


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
    return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
