"""Repro benchmark (issue 18's goal): for every root the hunt names, does
`kdebug repro` write a repro that runs standalone and reproduces the
recorded outputs?

For the built-in workload and every zoo case available on the device:

    kdebug hunt --keep DIR [--device cuda]                  (built-in)
    kdebug hunt --keep DIR -- -m kdebug.zoo CASE [--device cuda]

then, for every root the hunt names (kdebug.repro.hunt_roots: kernels and
aten ops), `kdebug repro --from-hunt DIR --root N -o OUT --check`, and the
written repro run standalone in a fresh process whose PYTHONPATH is cleared
and in which `import kdebug` fails (it must need only torch), once
(`--json`: its verdict) and `--times K` (the rerun verdict).  A repro of a
custom op needs the program's module: it is also run with the repository on
PYTHONPATH, recorded separately.

Per root: repro written, standalone exit status, bitwise match (exit 0) and
the rerun verdict (distinct outputs in K launches).  A root reproduces when
the standalone run matches the recorded outputs bitwise (deterministic), or,
for one whose re-launches vary, when the rerun verdict says so
(intrinsically nondeterministic: its bitwise match is then a matter of luck).
A zoo fault planted with kdebug.testing is added outside the kernel, so the
kernel alone cannot write it: there the correct outcome is "stable on its
inputs" and a mismatch in exactly the planted element (column "planted").

    python benchmarks/bench_repro.py [--device cpu|cuda] [--cases a,b] [--times K] [--keep DIR]

Results: benchmarks/results/repro_<device>.json.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)

# runs a script with kdebug unimportable: `import kdebug` anywhere raises ImportError
WITHOUT_KDEBUG = ("import sys, runpy; sys.modules['kdebug'] = None; sys.argv = sys.argv[1:]; "
                  "runpy.run_path(sys.argv[0], run_name='__main__')")


def _env_with_repo() -> dict:
    path = [REPO] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])
    return {**os.environ, "PYTHONPATH": os.pathsep.join(path)}


def _env_without_kdebug() -> dict:
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def hunt(case: str | None, device: str, keep: str, timeout: int) -> dict:
    cmd = [sys.executable, "-m", "kdebug", "hunt", "--keep", keep]
    if case is None:
        cmd += ["--device", device]
    else:
        cmd += ["--", "-m", "kdebug.zoo", case] + (["--device", device] if device != "cpu" else [])
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=_env_with_repo(), cwd=keep)
    return {"status": p.returncode, "wall_s": round(time.perf_counter() - t0, 1), "stdout": p.stdout,
            "stderr": p.stderr[-2000:]}


def standalone(script: str, times: int, cwd: str, with_repo: bool, timeout: int) -> dict:
    """The repro run in a fresh process: without kdebug (and PYTHONPATH), or
    with the repository importable (a custom op's module)."""
    out = os.path.join(cwd, f"verdict-{times}-{int(with_repo)}.json")
    cmd = [sys.executable, "-c", WITHOUT_KDEBUG, script, "--times", str(times), "--json", out]
    env = _env_with_repo() if with_repo else _env_without_kdebug()
    if with_repo:
        cmd = [sys.executable, script, "--times", str(times), "--json", out]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd)
    verdict = None
    if os.path.exists(out):
        with open(out) as f:
            verdict = json.load(f)
    return {"status": p.returncode, "distinct": verdict and verdict["distinct"],
            "matches_recorded": verdict and verdict["matches_recorded"],
            "mismatched": verdict and [[a["arg"], a["differ"]] for a in verdict["args"] if a["differ"]],
            "tail": (p.stdout + p.stderr)[-800:]}


def one_case(case: str | None, device: str, keep_root: str, times: int, timeout: int) -> dict:
    from kdebug import repro
    from kdebug.zoo import CASES

    plants = CASES[case].plants if case else ()

    name = case or "builtin"
    d = os.path.join(keep_root, name)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    h = hunt(case, device, d, timeout)
    row = {"case": name, "hunt_status": h["status"], "hunt_wall_s": h["wall_s"], "roots": []}
    if h["status"] == 2:
        row["error"] = (h["stdout"] + h["stderr"])[-1500:]
        return row
    try:
        _, roots = repro.hunt_roots(d)
    except repro.ReproError as e:
        row["error"] = str(e)
        return row
    try:
        with open(os.path.join(d, "hunt.json")) as f:
            mag = {m["root"]: m.get("rerun") for m in json.load(f).get("magnitude") or []}
    except (OSError, ValueError):
        mag = {}
    for n, t in enumerate(roots, 1):
        out = os.path.join(d, f"bench-repro{n}")
        t0 = time.perf_counter()
        p = subprocess.run([sys.executable, "-m", "kdebug", "repro", "--from-hunt", d, "--root", str(n), "-o", out,
                            "--check"], capture_output=True, text=True, timeout=timeout, env=_env_with_repo(), cwd=d)
        r = {"root": t.label(), "kind": t.kind, "written": p.returncode == 0 and os.path.exists(
            os.path.join(out, "repro.py")), "repro_status": p.returncode, "repro_wall_s": round(time.perf_counter() - t0, 1),
             "check": "REPRODUCED" in p.stdout, "hunt_rerun": None}
        label = (f"kernel #{t.index} {t.name}" if t.kind == "kernel" else f"op #{t.index} {t.name}")
        r["hunt_rerun"] = mag.get(label)
        if not r["written"]:
            r["error"] = (p.stdout + p.stderr)[-800:]
            row["roots"].append(r)
            continue
        with open(os.path.join(out, "launch.json")) as f:
            info = json.load(f)
        r["custom_op"] = bool(info.get("custom"))
        script = os.path.join(out, "repro.py")
        once = standalone(script, 1, d, False, timeout)
        many = standalone(script, times, d, False, timeout)
        r.update(standalone_status=once["status"], bitwise=once["status"] == 0, mismatched=once["mismatched"],
                 rerun_distinct=many["distinct"], rerun_times=times, rerun_matches=many["matches_recorded"])
        if once["status"] == 2:
            r["standalone_tail"] = once["tail"]
        if r["custom_op"]:  # needs the program's module: run again with the repository importable
            w1 = standalone(script, 1, d, True, timeout)
            wk = standalone(script, times, d, True, timeout)
            r.update(with_module_status=w1["status"], rerun_distinct=wk["distinct"],
                     rerun_matches=wk["matches_recorded"])
        distinct = r["rerun_distinct"]
        r["verdict"] = None if distinct is None else "intrinsic" if distinct > 1 else "stable"
        status = r["with_module_status"] if r["custom_op"] else r["standalone_status"]
        plant = next((pl for pl in plants if pl.kernel in t.name), None)
        if plant is not None:
            # the fault was planted outside the kernel: the kernel alone cannot write it; correct is
            # "stable on its inputs" and a mismatch in exactly the planted element
            r["planted"] = plant.arg
            r["reproduces"] = bool(r["written"] and status == 1 and r["verdict"] == "stable"
                                   and r["mismatched"] == [[plant.arg, 1]])
        else:
            r["reproduces"] = bool(r["written"] and (status == 0 or (status == 1 and r["verdict"] == "intrinsic")))
        row["roots"].append(r)
    return row


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--cases", default=None, help="comma-separated: builtin and zoo case names (default: all)")
    ap.add_argument("--times", type=int, default=20)
    ap.add_argument("--timeout", type=int, default=1200)
    ap.add_argument("--keep", default=None, help="keep the hunts and repros here")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    import torch

    from kdebug.zoo import CASES

    if a.device == "cuda" and not torch.cuda.is_available():
        print("bench_repro: no CUDA device here", file=sys.stderr)
        return 2
    names = ["builtin"] + [c.name for c in CASES.values() if c.available(a.device)]
    if a.cases:
        want = a.cases.split(",")
        names = [n for n in names if n in want]
    keep = a.keep or tempfile.mkdtemp(prefix="kdebug-bench-repro-")
    os.makedirs(keep, exist_ok=True)
    rows = []
    for name in names:
        t0 = time.perf_counter()
        row = one_case(None if name == "builtin" else name, a.device, os.path.abspath(keep), a.times, a.timeout)
        row["wall_s"] = round(time.perf_counter() - t0, 1)
        rows.append(row)
        print(f"{name}: hunt exit {row['hunt_status']} ({row['hunt_wall_s']} s), {len(row['roots'])} root(s)"
              + (f"; error: {row['error'][-300:]}" if row.get("error") else ""), flush=True)
        for r in row["roots"]:
            print(f"  {r['root']}: written {r['written']}, standalone exit {r.get('standalone_status')}"
                  + (f" (with its module: {r.get('with_module_status')})" if r.get("custom_op") else "")
                  + f", rerun {r.get('rerun_distinct')}/{a.times} distinct -> {r.get('verdict')}, "
                    f"reproduces {r.get('reproduces')}" + (f" (planted in {r['planted']})" if r.get("planted") else ""),
                  flush=True)
    roots = [r for row in rows for r in row["roots"]]
    summary = {"roots": len(roots), "written": sum(r["written"] for r in roots),
               "reproduce": sum(bool(r.get("reproduces")) for r in roots),
               "standalone_ok": sum(r.get("standalone_status") == 0 for r in roots)}
    print(f"summary: {summary['written']}/{summary['roots']} repros written, {summary['reproduce']} reproduce "
          f"(bitwise or by the rerun verdict), {summary['standalone_ok']} exit 0 with torch only")
    out = a.out or os.path.join(HERE, "results", f"repro_{a.device}.json")
    with open(out, "w") as f:
        json.dump({"device": a.device, "rows": rows, "summary": summary, "times": a.times,
                   "torch": str(torch.__version__), "cpus": os.cpu_count(), "host": platform.node(),
                   "gpu": torch.cuda.get_device_name(0) if a.device == "cuda" else None}, f, indent=1)
    print(f"wrote {out}")
    if not a.keep:
        shutil.rmtree(keep, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
