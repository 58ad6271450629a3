"""Sample where the host spends a recorded GPU step's time, with py-spy.

    python tools/spy_step.py MODE SECONDS OUT.txt     # MODE: untraced, dm, hash, hash_in, record

Builds and warms up the GPU transformer step, then attaches py-spy (native
frames included) to itself for SECONDS while it runs MODE steps in a loop, and
writes py-spy's raw collapsed stacks to OUT.txt.  Needs py-spy on PATH.
"""
import os
import subprocess
import sys
import time

from kdebug.workloads import transformer_step, recorded_step

mode, secs, out = sys.argv[1], float(sys.argv[2]), sys.argv[3]
step, x = transformer_step()


def one():
    recorded_step(step, x, mode)


for _ in range(5):
    one()
cmd = ["py-spy", "record", "--pid", str(os.getpid()), "--rate", "1000", "--format", "raw",
       "--duration", str(int(secs)), "--output", out]
# native frames need the process paused while sampled; without them it is not
cmd.append("--native" if os.environ.get("SPY_NATIVE", "1") == "1" else "--nonblocking")
spy = subprocess.Popen(cmd)
time.sleep(1.0)  # let py-spy attach
n = 0
t0 = time.perf_counter()
while spy.poll() is None:
    one()
    n += 1
dt = time.perf_counter() - t0
print(f"{mode}: {n} steps, {dt / max(n, 1) * 1e3:.2f} ms/step while sampled; py-spy exit {spy.returncode}")
