"""argparse types of kdebug's command-line options (imports no torch).

Note [Option values]
A numeric option is checked by argparse itself, through its `type=`, for
what the number means: a tolerance is a finite number >= 0, a factor one
> 1, a count an int of at least its minimum, a byte budget an int >= 0.
float() takes "nan", "inf" and "-1" alike, and what it gave went on: a
tolerance of -1 or nan puts every element outside it (a report saying "100%
outside rtol=-1", whose exit status still said success).  So a bad value is
refused before anything runs, by argparse's usage line naming the option,
what it got and what is allowed (exit 2), like any other malformed option.
An output path ('-o', '--json', '--html', hunt's --keep) must not be empty:
'' names no file.  It reached the writer, whose error named a temporary file
it had made beside the working directory (".../.name.<hex>.tmp -> ''"), or,
for an optional output that the code tests for truth, nothing was written
and nothing said.
"""
from __future__ import annotations

import argparse
import math
from typing import Callable


def number(allowed: str, ok: Callable[[float], bool]) -> Callable[[str], float]:
    """A float option whose value is finite and ok(value); `allowed` says what is."""
    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {allowed}, not {text!r}") from None
        if not (math.isfinite(v) and ok(v)):
            raise argparse.ArgumentTypeError(f"must be {allowed}, not {text}")
        return v
    parse.__name__ = "number"
    return parse


def count(lo: int, meaning: str = "") -> Callable[[str], int]:
    """An int option of at least lo; `meaning` (optional) says what it counts."""
    allowed = f"an int >= {lo}" + (f" ({meaning})" if meaning else "")

    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {allowed}, not {text!r}") from None
        if v < lo:
            raise argparse.ArgumentTypeError(f"must be {allowed}, not {v}")
        return v
    parse.__name__ = "count"
    return parse


TOLERANCE = number("a finite number >= 0", lambda v: v >= 0)
FACTOR = number("a finite number > 1 (how many times eager's error a kernel's must exceed)", lambda v: v > 1)
BYTES = count(0, "bytes")


def _nonempty(what: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if not text:
            raise argparse.ArgumentTypeError(f"the path is empty; give the {what}")
        return text
    parse.__name__ = "path"
    return parse


# Note [Option values]: a path to write, anything but the empty string
output_path = _nonempty("file to write")
output_dir = _nonempty("directory to write into")
