"""Times the parts of a FlightRecorder compare on the AdamW benchmark step.

    python tools/flight_compare_parts.py [cpu|cuda]

kdebug.workloads.adamw_step with FlightRecorder(every=10, keep_steps=4,
hashes="compared"): 20 warm-up steps, then 200 timed steps (20 compares).
Around FlightRecorder._drain it times the Recorder's calls (since
Note [Steps held in the ring]: settle, the GPU hashes into the ring;
digest, the step digests read from the ring; discard, forgetting without
a drain; drain only for early drains and dumps) and prints each per
compare.  The timing wrappers add their own overhead to the totals.
"""
import sys, time, collections, torch, kdebug
from kdebug import flight, _C
from kdebug.workloads import adamw_step
DEV = sys.argv[1] if len(sys.argv) > 1 else "cpu"
step, x, model, opt = adamw_step(DEV)
fr = kdebug.FlightRecorder(every=10, keep_steps=4, trace="/tmp/flp.kdt", hashes="compared"); fr.attach(opt, model)
T = collections.defaultdict(float); N = collections.Counter()
class Timed:
    def __init__(self, rec): self._r = rec
    def __getattr__(self, k):
        v = getattr(self._r, k)
        if k in ("drain", "settle", "digest", "discard"):
            def f(*a, **kw):
                t0 = time.perf_counter(); out = v(*a, **kw); T[k] += time.perf_counter() - t0; N[k] += 1; return out
            return f
        return v
    def __len__(self): return len(self._r)
orig_drain = flight.FlightRecorder._drain
def drain(self, wait=True):
    real = self._rec
    self._rec = Timed(real)
    t0 = time.perf_counter()
    try:
        orig_drain(self, wait)
    finally:
        self._rec = real
    T["_drain total"] += time.perf_counter() - t0; N["_drain total"] += 1
flight.FlightRecorder._drain = drain
with fr:
    for _ in range(20): step(x)
    if DEV == "cuda": torch.cuda.synchronize()
    T.clear(); N.clear()
    for _ in range(200): step(x)
for k in T: print(f"{k:16s} calls {N[k]:5d}  per compare {T[k] / 20 * 1e6:8.1f} us")
print("kept launches", fr.kept_launches, "stats", {k: v for k, v in fr.stats.items() if v})
