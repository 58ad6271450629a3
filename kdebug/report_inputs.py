"""What ``kdebug report`` reads before any trace: the runs named by its
RUN_OR_HUNT arguments, and a ``kdebug hunt --keep`` directory's hunt.json,
checked.  Imports no torch (Note [Lazy package], kdebug/__init__.py): the
command refuses a hunt.json that is not one kdebug wrote, or a path that is
not there, before torch is imported (about 3 s of a 3.3 s refusal); the
names stay kdebug.report's."""
from __future__ import annotations

import glob
import json
import os
import re
from typing import Sequence


def resolve_inputs(items: Sequence) -> tuple[list, dict]:
    """The runs named by RUN_OR_HUNT arguments: trace files, kdebug.Run /
    DebugMode objects, or a ``kdebug hunt --keep`` directory (its hunt.json,
    else its run*.kdt files in order).  Returns (runs, what the hunt said)."""
    runs: list = []
    hunt: dict = {}
    for it in items:
        if isinstance(it, (str, os.PathLike)) and os.path.isdir(it):
            d = os.fspath(it)
            info_path = os.path.join(d, "hunt.json")
            if os.path.exists(info_path):
                hunt = kept_hunt(info_path)
                runs += [os.path.join(d, p) for p in hunt.get("paths", [])]
            else:
                found = sorted(glob.glob(os.path.join(d, "run*.kdt")),
                               key=lambda p: int(re.sub(r"\D", "", os.path.basename(p)) or 0))
                if not found:
                    raise FileNotFoundError(f"{d}: no hunt.json and no run*.kdt traces in this directory "
                                            "(make one with kdebug hunt --keep DIR)")
                runs += found
        elif isinstance(it, (str, os.PathLike)) and not os.path.exists(it):
            raise FileNotFoundError(f"{os.fspath(it)}: no such trace file or hunt directory")
        else:
            runs.append(it)
    if not runs:
        raise ValueError("no runs to report on")
    return runs, hunt


def _plain_name(x) -> bool:
    return (isinstance(x, str) and x not in ("", ".", "..") and "/" not in x and "\\" not in x
            and "\0" not in x)


def read_hunt_json(path: str) -> dict:
    """A ``kdebug hunt --keep`` directory's hunt.json, checked: what the
    report reads from it has the types kdebug writes, and its traces are
    file names inside that directory (never a path elsewhere).  ValueError
    saying which field is wrong."""
    try:
        with open(path, encoding="utf-8") as f:
            hunt = json.load(f)
    except (ValueError, RecursionError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: not a readable kdebug hunt.json ({type(e).__name__}: {str(e)[:200]})") from None

    def bad(field: str, want: str):
        return ValueError(f"{path}: {field} must be {want}; this is not a hunt.json kdebug wrote "
                          "(run kdebug hunt --keep DIR again)")

    if not isinstance(hunt, dict):
        raise bad("the file", "a JSON object")
    if "what" in hunt and not isinstance(hunt["what"], str):
        raise bad("what", "a string")
    names = hunt.get("paths", [])
    if not isinstance(names, list) or not all(_plain_name(p) for p in names):
        raise bad("paths", "a list of trace file names in its directory")
    fixes = hunt.get("fixes", {})
    if not isinstance(fixes, dict) or not all(v is None or isinstance(v, bool) for v in fixes.values()):
        raise bad("fixes", "an object of true / false / null")
    gaps = hunt.get("incomplete", [])
    if not isinstance(gaps, list) or not all(isinstance(x, str) for x in gaps):
        raise bad("incomplete", "a list of strings")
    for key in ("confirm", "magnitude"):
        v = hunt.get(key, [])
        if not isinstance(v, list) or not all(isinstance(x, dict) and isinstance(x.get("root"), str) for x in v):
            raise bad(key, "a list of objects, each with its root")
    for x in hunt.get("magnitude", []):
        if "rerun" in x and not (isinstance(x["rerun"], dict) and x["rerun"].get("verdict") in ("intrinsic", "stable")):
            raise bad("magnitude[].rerun", "an object whose verdict is intrinsic or stable")
    if hunt.get("nproc") is not None:
        nproc = hunt["nproc"]
        if type(nproc) is not int or nproc < 1:
            raise bad("nproc", "a whole number of at least 1")
        per = hunt.get("rank_paths")
        if not isinstance(per, dict) or not all(
                isinstance(v, list) and all(_plain_name(p) for p in v) for v in per.values()):
            raise bad("rank_paths", "an object of rank -> list of trace file names in its directory")
        for key in ("focus_rank", "confirm_rank", "magnitude_rank"):
            r = hunt.get(key)
            if r is not None and (type(r) is not int or not 0 <= r < nproc):
                raise bad(key, f"a rank from 0 to {nproc - 1}")
        summary = hunt.get("summary", [])
        if not isinstance(summary, list) or not all(isinstance(x, str) for x in summary):
            raise bad("summary", "a list of strings")
    return hunt


def kept_hunt(path: str) -> dict:
    """What a kept hunt's hunt.json says (read_hunt_json), as one set of
    runs: for a --nproc hunt, the page of the rank where the difference
    started (hunt_ranks.page_hunt).  ValueError saying what is wrong."""
    hunt = read_hunt_json(path)
    if hunt.get("nproc") is None:
        return hunt
    from .hunt_ranks import page_hunt

    focus = hunt.get("focus_rank")
    hunt = page_hunt(hunt, 0 if focus is None else focus)
    if not hunt["paths"]:
        raise ValueError(f"{path}: no traces of rank {hunt['rank']} (rank_paths)")
    return hunt
