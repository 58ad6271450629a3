"""Verdict benchmark: does the engine name the true root on the zoo's cases?

For every case of ``kdebug.zoo`` available on the device, runs

    kdebug hunt --runs 2 --keep DIR -- -m kdebug.zoo CASE [--device cuda]

(each run a fresh process), loads the hunt's two traces, compares them with
``kdebug.compare`` in this process, and prints a table: case, expected roots,
the roots the engine named, whether its verdict is correct, and the hunt's
wall time.  Results go to benchmarks/results/verdict_<device>.json.

    python benchmarks/bench_verdict.py [--device cpu|cuda] [--cases a,b] [--keep DIR]

The engine's answer is read through the API being built (``rep.roots``: roots
in rank order, each with ``.step_a.name``, ``.benign``, ``.consequences``;
``rep.ok`` true when the runs match, benign-only differences included), or,
while it does not exist, through the current one (``rep.divergence``: its
``step_a.name``, or its writer's name for an input divergence whose writer is
known and not outside).

A verdict is correct when:
- the case must match (no expected roots): ``rep.ok``;
- otherwise: not ``rep.ok``, and the consequential roots named are as many as
  expected, each containing the expected substring, in the expected order;
  for a case whose root is only possible (``may_match``) a match is correct too;
  and where the traces show which launch with that substring really differed
  with identical inputs (below), the named root is that launch;
- a case whose expected root is one kind of op that may race in several
  places at once (``repeats``: cuDNN convolutions under benchmark mode): one
  or more roots, each of that kind;
- the first root named is a kernel that autotuning ran with another launch
  config in the other run (the traces show it): every root named is a step
  the traces show with identical inputs and differing outputs;
- a natural race that fired but whose difference the traces show absorbed
  (no step after the roots wrote a differing output): a match is correct when
  the engine lists each observed root among its benign differences.

Independently of the engine, the table also says what the traces show: the
launches and aten ops whose recorded inputs are identical and whose outputs
differ ("observed"), so that a natural race that did not fire in this hunt is
not blamed on the engine.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time

import torch

import kdebug
from kdebug.zoo import CASES

HERE = os.path.dirname(os.path.abspath(__file__))


def hunt(case: str, device: str, keep: str, runs: int = 2, timeout: int = 900, confirm: bool = False) -> dict:
    """One `kdebug hunt` of a zoo case in fresh processes: exit status, wall
    time, output, trace paths."""
    cmd = [sys.executable, "-m", "kdebug", "hunt", "--runs", str(runs), "--keep", keep,
           *(["--confirm"] if confirm else []), "--", "-m", "kdebug.zoo", case]
    if device != "cpu":
        cmd += ["--device", device]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    wall = time.perf_counter() - t0
    paths = sorted(glob.glob(os.path.join(keep, "run*.kdt")), key=lambda s: int(os.path.basename(s)[3:-4]))
    confirmed = None
    try:
        with open(os.path.join(keep, "hunt.json")) as f:
            confirmed = json.load(f).get("confirm")
    except (OSError, ValueError):
        pass
    return {"status": p.returncode, "wall_s": round(wall, 2), "stdout": p.stdout, "stderr": p.stderr[-3000:],
            "paths": paths, "confirm": confirmed}


def _name(op) -> str:
    return getattr(op, "kernel_name", None) or getattr(op, "_name", None) or type(op).__name__


def _io(op) -> tuple:
    """(inputs, outputs) hashes of a recorded launch or aten op."""
    if hasattr(op, "kernel_name"):
        return op.pre_hashes or {}, op.post_hashes or {}
    log = getattr(op, "log", None) or {}
    return log.get("input_hash"), log.get("hash")


def observed(path_a: str, path_b: str) -> dict:
    """What the traces themselves show, without the engine: whether the two
    runs recorded the same sequence of names, and the steps whose inputs are
    identical and whose outputs differ (position, name), plus how many steps
    read or wrote differing data at all."""
    a, b = list(kdebug.load(path_a).operators), list(kdebug.load(path_b).operators)
    same = len(a) == len(b) and all(_name(x) == _name(y) for x, y in zip(a, b))
    roots, differing, changed, retuned = [], 0, 0, []
    if same:
        for i, (x, y) in enumerate(zip(a, b)):
            if hasattr(x, "kernel_name") and (x.grid != y.grid or x.config != y.config):
                retuned.append(_name(x))  # autotuning chose another config in the other run
            (ia, oa), (ib, ob) = _io(x), _io(y)
            if ia != ib or oa != ob:
                differing += 1
            if ia == ib and oa != ob:
                roots.append((i, _name(x)))
            elif oa != ob:
                changed += 1
    # absorbed: steps differ at their roots only; every step that read a
    # differing value wrote the same outputs in both runs (a bf16 cast that
    # rounds an fp32 wobble away, a loss whose rounding hides one ULP)
    return {"same_sequence": same, "steps": len(a), "roots": roots, "differing_steps": differing,
            "changed_outputs": changed, "absorbed": bool(same and roots and changed == 0),
            "retuned": retuned}


def engine_answer(rep) -> dict:
    """The engine's verdict: ok, consequential roots named in rank order,
    benign steps named, and which API gave them."""
    roots = getattr(rep, "roots", None)
    if roots is not None:
        named = [{"name": r.step_a.name, "benign": bool(getattr(r, "benign", False)),
                  "consequences": getattr(r, "consequences", None)} for r in roots]
        return {"api": "roots", "ok": bool(rep.ok),
                "roots": [r["name"] for r in named if not r["benign"]],
                "benign": [r["name"] for r in named if r["benign"]]
                + [b.step_a.name for b in getattr(rep, "benign", None) or []], "detail": named}
    d = rep.divergence
    name = None
    if d is not None:
        name = d.writer.name if (d.kind == "input" and d.writer is not None and not d.outside) else d.step_a.name
    return {"api": "divergence", "ok": bool(rep.ok), "roots": [name] if name else [], "benign": [],
            "structural": len(rep.structural), "config_changes": len(rep.config_changes),
            "shape_changes": len(rep.shape_changes),
            "kind": None if d is None else d.kind, "outside": None if d is None else bool(d.outside)}


def judge(case, ans: dict, obs: dict | None) -> bool:
    """Whether the engine's verdict is correct (see the module's docstring).
    Where the traces show a launch with identical inputs and differing outputs
    whose name has the expected substring, a named root must be such a launch
    (several kernels can share the substring: the one that zeroes the
    index_add's destination is not the one that races)."""
    if not case.roots:
        return ans["ok"]
    if ans["ok"]:
        if case.may_match:
            return True
        # A natural race whose difference the traces show absorbed (no step
        # after the roots wrote a differing output): "match, with benign
        # differences" is the right answer, provided the engine listed each
        # observed root among its benign differences.
        return bool(not case.planted and obs and obs.get("absorbed")
                    and any(exp in n for _, n in obs["roots"] for exp in case.roots)
                    and {n for _, n in obs["roots"]} <= set(ans["benign"]))
    named = ans["roots"]
    seen = {n for _, n in obs["roots"]} if obs and obs["same_sequence"] else set()
    retuned = set(obs.get("retuned") or ()) if obs else set()
    if retuned and named and named[0] in retuned:
        # Autotuning picked other configs in the two runs (parallel load on the
        # GPU makes its timings noisy): a kernel run with another config that
        # wrote other outputs from identical inputs is a true root, whatever
        # the case's race.  Every consequential root named must be a step the
        # traces show with identical inputs and differing outputs.
        return all(n in seen for n in named)
    if case.repeats:  # any number of independent roots, each one of the expected kinds
        if not named or not all(any(exp in got for exp in case.roots) for got in named):
            return False
    elif len(named) != len(case.roots) or not all(exp in got for exp, got in zip(case.roots, named)):
        return False
    for exp, got in zip(case.roots, named):
        if any(exp in n for n in seen) and got not in seen:
            return False
    return True


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cpu", "cuda"])
    p.add_argument("--cases", default=None, help="comma-separated case names (default: all available)")
    p.add_argument("--keep", default=None, help="keep each case's hunt directory under this directory")
    p.add_argument("--out", default=None, help="results JSON (default: benchmarks/results/verdict_<device>.json)")
    p.add_argument("--confirm", action="store_true", help="hunt with --confirm: prove each named root by replay")
    a = p.parse_args()
    names = a.cases.split(",") if a.cases else [n for n, c in CASES.items() if c.available(a.device)]
    root_dir = a.keep or tempfile.mkdtemp(prefix="kdebug-verdict-")
    rows = []
    for n in names:
        case = CASES[n]
        if not case.available(a.device):
            print(f"{n}: not available on {a.device}, skipped", file=sys.stderr)
            continue
        d = os.path.join(root_dir, n)
        print(f"hunting {n} ...", file=sys.stderr, flush=True)
        h = hunt(n, a.device, d, confirm=a.confirm)
        row = {"case": n, "expected": list(case.roots), "benign_expected": list(case.benign),
               "planted": case.planted, "may_match": case.may_match, "hunt_status": h["status"],
               "hunt_wall_s": h["wall_s"], "dir": d, "confirm": h["confirm"]}
        if len(h["paths"]) < 2 or h["status"] == 2:
            row.update(error=(h["stdout"][-2000:] + h["stderr"]), correct=False, engine=None, observed=None)
            rows.append(row)
            continue
        t0 = time.perf_counter()
        rep = kdebug.compare(h["paths"][0], h["paths"][1])
        row["compare_s"] = round(time.perf_counter() - t0, 3)
        ans = engine_answer(rep)
        obs = observed(h["paths"][0], h["paths"][1])
        row.update(engine=ans, observed=obs, correct=judge(case, ans, obs), report=str(rep))
        # a natural race that did not fire: the traces show no root at all
        row["race_fired"] = bool(obs["roots"]) if (case.roots and not case.planted) else None
        if a.device == "cpu" and torch.get_num_threads() < case.min_threads:
            row["note"] = f"needs {case.min_threads} CPU threads to race; this host has {torch.get_num_threads()}"
        rows.append(row)

    def cell(xs):
        return ", ".join(xs) if xs else "(match)"

    w = max([len(r["case"]) for r in rows] + [4])
    print(f"\n{'case':{w}}  {'expected roots':34}  {'named roots (engine)':44}  {'correct':7}  {'hunt s':>6}  observed")
    for r in rows:
        if r.get("engine") is None:
            print(f"{r['case']:{w}}  {cell(r['expected']):34}  {'(hunt failed, status ' + str(r['hunt_status']) + ')':44}"
                  f"  {'no':7}  {r['hunt_wall_s']:6.1f}")
            continue
        e = r["engine"]
        named = cell([x[:40] for x in e["roots"]]) if not e["ok"] else "(match)"
        if not e["ok"] and not e["roots"]:
            named = "(differ: structure only)"
        if e["benign"]:
            named += f" +benign {', '.join(x[:20] for x in e['benign'])}"
        obs = r["observed"]
        o = (f"{len(obs['roots'])} root(s): " + ", ".join(x[1][:30] for x in obs["roots"][:3])
             if obs["same_sequence"] else "sequences differ")
        if r.get("race_fired") is False:
            o += " (race did not fire)"
        print(f"{r['case']:{w}}  {cell(r['expected'])[:34]:34}  {named[:44]:44}  {'yes' if r['correct'] else 'NO':7}"
              f"  {r['hunt_wall_s']:6.1f}  {o}")
    ok = sum(r["correct"] for r in rows)
    print(f"\n{ok}/{len(rows)} verdicts correct ({'new roots API' if rows and rows[0].get('engine') and rows[0]['engine']['api'] == 'roots' else 'current first-divergence API'})")
    out = a.out or os.path.join(HERE, "results", f"verdict_{a.device}.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    host = {"torch": torch.__version__, "kdebug": kdebug.__version__, "python": platform.python_version(),
            "threads": torch.get_num_threads(), "cpus": os.cpu_count(), "machine": platform.machine(),
            "time": time.strftime("%Y-%m-%d %H:%M:%S")}
    if a.device == "cuda":
        host["gpu"] = torch.cuda.get_device_name()
    if not a.keep:
        shutil.rmtree(root_dir, ignore_errors=True)
        for r in rows:
            del r["dir"]
    with open(out, "w") as f:
        json.dump({"device": a.device, "host": host, "correct": ok, "cases": len(rows), "rows": rows}, f, indent=1)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
