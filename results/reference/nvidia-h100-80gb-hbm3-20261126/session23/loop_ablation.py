"""What each part of the harness's loop costs inside the loop (not alone): loop_cost with
one part switched off at a time (git-ignored experiment, session #23)."""
import sys, time, contextlib
sys.path.insert(0, ".")
sys.path.insert(0, "benchmarks")
import overhead
import strategies.base as base
from bench.harness import probes

dev = sys.argv[1] if len(sys.argv) > 1 else "cpu"
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 9
orig = dict(held=base.held_mib, now=probes.PhaseClock._now, steps=probes.PhaseClock.steps,
            lap=probes.PhaseClock.lap, begin=probes.PhaseClock.begin)

def zeros(self):
    return [dict.fromkeys(probes.PHASES, 0.0) for _ in self._steps]

def no_events():
    probes.PhaseClock._now = lambda self: None
    probes.PhaseClock.steps = zeros

def no_laps():
    no_events()
    probes.PhaseClock.lap = lambda self, phase: None
    probes.PhaseClock.begin = lambda self: self._steps.append(None)

def no_held():
    base.held_mib = lambda d: 0.0

def restore():
    base.held_mib = orig["held"]
    for k in ("now", "steps", "lap", "begin"):
        setattr(probes.PhaseClock, "_" + k if k == "now" else k, orig[k])

configs = {"as is": lambda: None, "laps without events": no_events, "no laps": no_laps,
           "no held read": no_held, "no laps, no held read": lambda: (no_laps(), no_held())}
for timing in ("sync", "events"):
    for name, setup in configs.items():
        restore(); setup()
        t0 = time.time()
        mine, bare, added, low, high = overhead.loop_cost(dev, timing, rounds=rounds)
        print(f"{timing:6s} {name:24s} harness {mine:6.0f} us  bare {bare:6.0f} us  adds {added:5.0f} us [{low:.0f}, {high:.0f}]  ({time.time()-t0:.0f}s)", flush=True)
restore()
