"""`kdebug list [DIR]` and `kdebug clean [DIR]`: the artifact runs written
by kdebug.capture_artifacts / constrained(artifacts=...) (Note [Compile
artifacts]).

Note [Cleaning artifacts]
~~~~~~~~~~~~~~~~~~~~~~~~~
`clean` deletes directories, so it deletes only what kdebug provably made:
DIR must be a real directory (not a link) holding at least one run; a run is
a real subdirectory whose manifest.json (a regular file) has kdebug's format
tag and its own run id, and whose every entry is the manifest or a compile
directory the manifest names (kdebug names a compile directory before
writing into it).  A run with anything else inside, a link in place of a run,
or a directory without a manifest is left alone and said so.  Deleting uses
shutil.rmtree, which on Linux removes a link found inside instead of
following it (shutil.rmtree.avoids_symlink_attacks).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import stat
import sys
import time

from ._argtypes import count, number

FORMAT = "kdebug-artifacts"  # kdebug/artifacts.py FORMAT (not imported: that module imports torch lazily only)
DEFAULT_DIR = "kdebug_artifacts"


@dataclasses.dataclass
class RunInfo:
    run_id: str
    path: str
    created: float | None
    complete: bool | None
    compiles: list[dict]  # {name, compile_id, files: [{path, bytes}], bytes}
    bytes: int
    problem: str | None  # why clean leaves it alone (None: it is kdebug's)

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def _size_walk(path: str) -> tuple[list[dict], int]:
    files, total = [], 0
    for top, dirs, names in os.walk(path, followlinks=False):
        for n in sorted(names) + [d for d in dirs if os.path.islink(os.path.join(top, d))]:
            p = os.path.join(top, n)
            st = os.lstat(p)
            size = st.st_size if stat.S_ISREG(st.st_mode) else 0
            files.append({"path": os.path.relpath(p, path), "bytes": size,
                          **({"link": True} if stat.S_ISLNK(st.st_mode) else {})})
            total += size
        dirs[:] = sorted(d for d in dirs if not os.path.islink(os.path.join(top, d)))
    return files, total


def read_run(path: str) -> RunInfo:
    """What kdebug knows of one entry of an artifact directory."""
    name = os.path.basename(path)
    if os.path.islink(path):
        return RunInfo(name, path, None, None, [], 0, "a symbolic link (not followed)")
    if not os.path.isdir(path):
        return RunInfo(name, path, None, None, [], 0, "not a directory")
    mpath = os.path.join(path, "manifest.json")
    try:
        st = os.lstat(mpath)
    except FileNotFoundError:
        return RunInfo(name, path, None, None, [], _size_walk(path)[1], "no manifest.json: not a kdebug run")
    if not stat.S_ISREG(st.st_mode):
        return RunInfo(name, path, None, None, [], 0, "manifest.json is not a regular file")
    try:
        with open(mpath, encoding="utf-8") as f:
            m = json.load(f)
    except (OSError, ValueError, RecursionError) as e:  # (nested past the parser's depth: RecursionError)
        return RunInfo(name, path, None, None, [], 0, f"manifest.json unreadable ({type(e).__name__}: {str(e)[:200]})")
    if not isinstance(m, dict) or m.get("format") != FORMAT or m.get("run_id") != name:
        return RunInfo(name, path, None, None, [], 0, "manifest.json is not a kdebug artifact manifest of this run")
    named = m.get("compiles") if isinstance(m.get("compiles"), dict) else {}
    created = m.get("created") if isinstance(m.get("created"), (int, float)) else None
    compiles, total, problem = [], os.lstat(mpath).st_size, None
    for entry in sorted(os.listdir(path)):
        p = os.path.join(path, entry)
        if entry == "manifest.json":
            continue
        if entry not in named or os.path.islink(p) or not os.path.isdir(p):
            problem = problem or f"holds {entry!r}, which its manifest does not name as a compile directory"
            continue
        files, size = _size_walk(p)
        total += size
        info = named[entry] if isinstance(named[entry], dict) else {}
        compiles.append({"name": entry, "compile_id": info.get("compile_id"), "files": files, "bytes": size})
    return RunInfo(name, path, created, m.get("complete") if isinstance(m.get("complete"), bool) else None,
                   compiles, total, problem)


def dir_problem(root: str) -> str | None:
    if os.path.islink(root):
        return f"{root} is a symbolic link; kdebug does not follow it: give the real directory"
    if not os.path.isdir(root):
        return f"{root} is not a directory (kdebug writes artifacts to kdebug_artifacts/ by default)"
    return None


def scan(root: str) -> list[RunInfo]:
    return [read_run(os.path.join(root, e)) for e in sorted(os.listdir(root))]


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _when(t: float | None) -> str:
    return "—" if t is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def add_parsers(sub) -> None:
    li = sub.add_parser("list", help="the artifact runs in DIR (default kdebug_artifacts): compiles and files "
                                     "with sizes")
    li.add_argument("dir", nargs="?", default=DEFAULT_DIR)
    li.add_argument("--json", action="store_true", help="JSON on stdout instead of text")
    li.add_argument("--files", action="store_true", help="list every file of every compile")
    li.set_defaults(fn=run_list)
    cl = sub.add_parser("clean", help="delete artifact runs in DIR (default kdebug_artifacts); only directories "
                                      "whose manifest says kdebug wrote them")
    cl.add_argument("dir", nargs="?", default=DEFAULT_DIR)
    cl.add_argument("--older-than", type=number("a finite number of days >= 0", lambda v: v >= 0), metavar="DAYS",
                    help="only runs created more than DAYS ago")  # Note [Option values]: nan deleted nothing, silently
    cl.add_argument("--keep", type=count(0, "runs kept"), metavar="N", help="keep the N newest runs")
    cl.add_argument("--dry-run", action="store_true", help="say what would be deleted, delete nothing")
    cl.set_defaults(fn=run_clean)


def run_list(args: argparse.Namespace) -> int:
    problem = dir_problem(args.dir)
    if problem:
        print(f"kdebug list: {problem}", file=sys.stderr)
        return 2
    runs = scan(args.dir)
    if args.json:
        json.dump({"dir": args.dir, "runs": [r.to_json() for r in runs]}, sys.stdout, indent=1)
        print()
        return 0
    ours = [r for r in runs if r.problem is None]
    print(f"{args.dir}: {len(ours)} kdebug run(s), {_size(sum(r.bytes for r in ours))}")
    for r in runs:
        if r.problem is not None and not r.compiles:
            print(f"  {r.run_id}: not a kdebug run ({r.problem})")
            continue
        state = "" if r.complete else " (incomplete: still running, or the process ended early)"
        print(f"  {r.run_id}  {_when(r.created)}  {len(r.compiles)} compile(s)  {_size(r.bytes)}{state}"
              + (f"  [clean leaves it: {r.problem}]" if r.problem else ""))
        for c in r.compiles:
            print(f"    {c['name']} (compile {c['compile_id'] or '?'}): {len(c['files'])} file(s), {_size(c['bytes'])}")
            if args.files:
                for f in c["files"]:
                    print(f"      {f['path']}  {_size(f['bytes'])}" + ("  (link)" if f.get("link") else ""))
    return 0


def run_clean(args: argparse.Namespace) -> int:
    problem = dir_problem(args.dir)
    if problem:
        print(f"kdebug clean: {problem}", file=sys.stderr)
        return 2
    if args.keep is not None and args.keep < 0 or args.older_than is not None and args.older_than < 0:
        print("kdebug clean: --keep and --older-than take a number >= 0", file=sys.stderr)
        return 2
    runs = scan(args.dir)
    ours = [r for r in runs if r.problem is None]
    others = [r for r in runs if r.problem is not None]
    if not ours:
        print(f"kdebug clean: {args.dir} holds no kdebug artifact run (no subdirectory with a kdebug manifest.json); "
              "nothing deleted", file=sys.stderr)
        for r in others:
            print(f"  {r.run_id}: {r.problem}", file=sys.stderr)
        return 2
    ours.sort(key=lambda r: (r.created is None, -(r.created or 0)))  # newest first
    doomed = ours[args.keep:] if args.keep is not None else list(ours)
    if args.older_than is not None:
        cutoff = time.time() - args.older_than * 86400
        doomed = [r for r in doomed if r.created is not None and r.created < cutoff]
    verb = "would delete" if args.dry_run else "deleted"
    freed = 0
    for r in doomed:
        if not args.dry_run:
            if os.path.islink(r.path) or read_run(r.path).problem is not None:  # changed since the scan
                print(f"  skipped {r.run_id}: it changed while cleaning", file=sys.stderr)
                continue
            shutil.rmtree(r.path)
        freed += r.bytes
        print(f"  {verb} {r.run_id} ({_size(r.bytes)})")
    for r in others:
        print(f"  left {r.run_id}: {r.problem}")
    print(f"kdebug clean: {verb} {len(doomed)} run(s), {_size(freed)}; kept {len(ours) - len(doomed)}")
    return 0
