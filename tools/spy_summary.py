"""Summarize py-spy raw (collapsed) stacks: inclusive and self share per function.

    python tools/spy_summary.py OUT.txt [--within FUNC] [--top 40] [--lines]

Only samples whose stack passes through a frame named FUNC count (default
``one``, the step function of tools/spy_step.py; several names separated by
commas, each matching a frame's name or its last dotted part: the first one
found in a stack counts, e.g. ``one,CompiledFunction.backward`` for the
autograd worker thread too).  Frames are grouped by
function and file (``--lines`` keeps line numbers apart).
"""
import argparse
import re
from collections import Counter

p = argparse.ArgumentParser()
p.add_argument("path")
p.add_argument("--within", default="one")
p.add_argument("--top", type=int, default=40)
p.add_argument("--lines", action="store_true")
a = p.parse_args()

LINE = re.compile(r":\d+\)$")
incl, self_, total = Counter(), Counter(), 0
for raw in open(a.path):
    stack, _, n = raw.rstrip("\n").rpartition(" ")
    if not stack:
        continue
    frames = stack.split(";")
    names = [f.split(" (")[0] for f in frames]
    at = next((i for w in a.within.split(",") for i, nm in enumerate(names) if nm == w or nm.endswith("." + w)),
              None)
    if at is None:
        continue
    frames = frames[at:]
    if not a.lines:
        frames = [LINE.sub(")", f) for f in frames]
    n = int(n)
    total += n
    for f in set(frames):
        incl[f] += n
    self_[frames[-1]] += n
print(f"{total} samples within {a.within}")
print("-- inclusive --")
for f, n in incl.most_common(a.top):
    print(f"{100 * n / total:6.1f}%  {f}")
print("-- self --")
for f, n in self_.most_common(a.top):
    print(f"{100 * n / total:6.1f}%  {f}")
