"""Creating kdebug's output files (traces, reports, exports, hunt.json) so that
nothing is written through a symbolic link and no file is truncated in place.

Note [Safe writes]
An output path may be a link someone planted (a shared directory: the link
points at a file of the user's that the write would destroy), or a trace that
a ``kdebug.Run`` in some process still maps (truncating it there ends that
process with SIGBUS).  So:

- an output path that is a symbolic link is refused with an error saying so
  (``LinkRefused``).  Following it would write wherever it points; replacing
  it would silently undo a link the user may have made on purpose.  Either
  is worse than asking for the real path;
- a trace is streamed to its final path (a process that dies leaves every
  chunk written), so an existing regular file there is unlinked, not
  truncated, and the new one is created with O_CREAT|O_EXCL|O_NOFOLLOW: a
  link planted between the two steps makes the creation fail instead of
  being followed;
- reports and exports are written whole to a new file in the target
  directory, created the same exclusive way under an unguessable name, then
  renamed over the output (atomic: a reader sees the old file or the new
  one, never half of one); an existing output that is not a regular file (a
  device such as /dev/null, a FIFO) is refused, never replaced.

Note [An output is never an input]
``kdebug report a.kdt -o a.kdt``, ``export a.kdt -o a.kdt``, ``diff a b --html b``
and ``record -o s.py -- python s.py`` each replaced what the command was about
to read (the last deleted the user's script before running it; an
adversarial review).  Every command checks its outputs against the files it
reads, by device and inode (a hard link or another spelling of the same
path is the same file), before it starts (output_problem's ``inputs``).
"""
from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from typing import IO, Iterator

_EXCL = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


class LinkRefused(OSError):
    """An output path is a symbolic link: kdebug does not write through it."""

    def __init__(self, path: str):
        try:
            to = f" (to {os.readlink(path)})"
        except OSError:
            to = ""
        self.message = (f"{path} is a symbolic link{to}: kdebug does not write through links; "
                        "remove the link or give the real path")
        super().__init__(errno.ELOOP, self.message, path)

    def __str__(self) -> str:
        return self.message


def refuse_link(path: str) -> None:
    """Raises LinkRefused when ``path`` itself is a symbolic link."""
    if os.path.islink(path):
        raise LinkRefused(path)


def output_problem(path: str, inputs=()) -> str | None:
    """Why ``path`` cannot be written as a new output file, or None: checked
    before any work starts (a recording, a hunt) so a bad ``-o`` fails at
    once with one line.  ``inputs``: the files the command reads (traces,
    the script): an output that is one of them would destroy it (Note [An
    output is never an input]).  (Whether the directory is writable is left
    to the write itself: permissions checked here could change.)"""
    path = os.fspath(path)
    d = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(d):
        return f"{path}: the directory {d} does not exist; create it first"
    if os.path.islink(path):
        return str(LinkRefused(path))
    if os.path.isdir(path):
        return f"{path} is a directory; give a file name"
    if os.path.exists(path) and not os.path.isfile(path):
        return f"{path} exists and is not a regular file (a device, a pipe or a socket); give another path"
    for x in inputs:
        try:
            same = os.path.exists(path) and os.path.samefile(path, os.fspath(x))
        except (OSError, TypeError, ValueError):
            same = False
        if same:
            which = "" if os.path.abspath(path) == os.path.abspath(os.fspath(x)) else f" ({x})"
            return (f"{path}: this command reads that file{which}; writing its output there would destroy it: "
                    "give another output path")
    return None


def create_replacing(path: str) -> IO[bytes]:
    """A new, empty file at ``path`` opened for binary writing (Note [Safe
    writes]): an existing regular file is unlinked first, so a process that
    maps it keeps reading the old one; a link or anything else is refused."""
    path = os.fspath(path)
    refuse_link(path)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    if st is not None:
        if not stat.S_ISREG(st.st_mode):
            raise FileExistsError(errno.EEXIST, f"{path} exists and is not a regular file; give another path")
        os.unlink(path)
    try:
        fd = os.open(path, _EXCL, 0o666)
    except FileExistsError:
        raise FileExistsError(errno.EEXIST, f"{path} was created by someone else while kdebug replaced it; "
                                            "give a path in a directory only you write to") from None
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise LinkRefused(path) from None
        raise
    return os.fdopen(fd, "wb")


def open_append(path: str) -> IO[bytes]:
    """``path`` opened to append (a trace written again by a DebugMode entered
    a second time), never through a link and never created anew."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise LinkRefused(path) from None
        raise
    return os.fdopen(fd, "ab")


@contextlib.contextmanager
def replaced_atomically(path: str, mode: str = "w", encoding: str | None = "utf-8") -> Iterator[IO]:
    """``with replaced_atomically(out) as f: f.write(...)``: the text goes to a
    new file in out's directory (exclusive creation, unguessable name), which
    is renamed over ``out`` when the block ends without an exception, and
    removed when it raises (Note [Safe writes])."""
    path = os.fspath(path)
    if not path:  # abspath('') is the working directory: the temp file would go beside it
        raise FileNotFoundError(errno.ENOENT, "the output path is empty; give a file path to write", path)
    refuse_link(path)
    if os.path.isdir(path) or path.endswith(("/", os.sep)):  # before any work: os.replace's error would name
        raise IsADirectoryError(errno.EISDIR, "is a directory; give a file path to write", path)  # the temp file
    if os.path.exists(path) and not os.path.isfile(path):  # rename would replace the device or FIFO itself
        raise FileExistsError(errno.EEXIST, f"{path} exists and is not a regular file (a device, a pipe or a "
                                            "socket); give another path")
    d, base = os.path.split(os.path.abspath(path))
    for _ in range(64):
        tmp = os.path.join(d, f".{base}.{secrets.token_hex(8)}.tmp")
        try:
            fd = os.open(tmp, _EXCL, 0o666)
            break
        except FileExistsError:
            continue
    else:
        raise FileExistsError(errno.EEXIST, f"could not create a temporary file in {d}")
    try:
        with os.fdopen(fd, mode, encoding=None if "b" in mode else encoding) as f:
            yield f
        refuse_link(path)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
