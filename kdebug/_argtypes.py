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

