#!/usr/bin/env python3
"""Exact makespan of the V (zb-v's placement) for small grid cells, offline.

Not built or run by CI: it needs OR-Tools' CP-SAT (`pip install ortools`).
docs/schedules.md ("Benchmark grid") quotes what it proved.

The model is the simulator's (analysis/Schedule/Simulate.cpp) for the V with
uniform costs and no recompute: virtual stage k runs on rank k for k < p and
on rank 2p-1-k after (chunk 1); every virtual stage runs F, B (input
gradient) and W per micro-batch, each taking half the stage's cost; an F
waits for the previous virtual stage's F, a B for the next one's B (the last
virtual stage's B for its own F), a W for its B, plus the transfer time
between different ranks; a rank runs one operation at a time. Memory: an F
takes half a unit (one micro-batch on one stage is a unit), its W frees it
(w_mem_frac = 1, the default), at most the limit on every rank.

The micro-batches are interchangeable, so every virtual stage may run its
F's, B's and W's in micro-batch order: sorting each stage's start times and
relabelling keeps every dependency (if some matching of the k-th arrivals to
the k-th starts satisfies start >= arrival + delay, the sorted one does) and
the memory (a rank's count of held activations does not depend on labels).
The model fixes that order, which makes proofs fast.

A hint (a schedule to start from) helps CP-SAT a lot: give the timeline.json
of `pipec schedule --schedule zb-v --out DIR` for the same problem.

    bench/schedule/v_optimum_cpsat.py --stages 4 --microbatches 8 --memory-limit 4 \\
        --cost-b 1.2 --cost-w 0.8 --comm 0.5 --hint DIR/timeline.json
    OPTIMAL makespan 33.5 lower bound 33.5 (4.4 s)
"""
import argparse
import json
import sys

from ortools.sat.python import cp_model


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--stages", type=int, required=True)
    ap.add_argument("--microbatches", type=int, required=True)
    ap.add_argument("--memory-limit", type=float, required=True, help="units per rank")
    ap.add_argument("--cost-f", type=float, default=1.0, help="per stage (both chunks)")
    ap.add_argument("--cost-b", type=float, default=1.0)
    ap.add_argument("--cost-w", type=float, default=1.0)
    ap.add_argument("--comm", type=float, default=0.0)
    ap.add_argument("--seconds", type=float, default=120.0)
    ap.add_argument("--scale", type=int, default=10,
                    help="time steps per cost unit: half of every cost and the transfer must be a whole step")
    ap.add_argument("--hint", help="timeline.json of a zb-v schedule of the same problem")
    a = ap.parse_args()

    p, m = a.stages, a.microbatches
    steps = {}
    for name, value in (("F", a.cost_f / 2), ("B", a.cost_b / 2), ("W", a.cost_w / 2), ("C", a.comm)):
        steps[name] = round(value * a.scale)
        if abs(steps[name] - value * a.scale) > 1e-9:
            sys.exit(f"{name}: {value} is not a whole number of 1/{a.scale}; raise --scale")
    V = 2 * p

    def rank(vs):
        return vs if vs < p else 2 * p - 1 - vs

    model = cp_model.CpModel()
    horizon = 2 * m * V * (steps["F"] + steps["B"] + steps["W"] + 2 * steps["C"])
    start, end = {}, {}
    intervals = {r: [] for r in range(p)}
    memory = {r: ([], []) for r in range(p)}
    for vs in range(V):
        for mb in range(m):
            for kind in "FBW":
                s = model.NewIntVar(0, horizon, f"{kind}{vs}_{mb}")
                e = model.NewIntVar(0, horizon, f"{kind}{vs}_{mb}_end")
                intervals[rank(vs)].append(model.NewIntervalVar(s, steps[kind], e, f"{kind}{vs}_{mb}_i"))
                start[kind, vs, mb], end[kind, vs, mb] = s, e
    for vs in range(V):
        r = rank(vs)
        for mb in range(m):
            if vs > 0:
                model.Add(start["F", vs, mb] >= end["F", vs - 1, mb] + (steps["C"] if rank(vs - 1) != r else 0))
            if vs == V - 1:
                model.Add(start["B", vs, mb] >= end["F", vs, mb])
            else:
                model.Add(start["B", vs, mb] >= end["B", vs + 1, mb] + (steps["C"] if rank(vs + 1) != r else 0))
            model.Add(start["W", vs, mb] >= end["B", vs, mb])
            if mb + 1 < m:  # micro-batch order (module docstring)
                for kind in "FBW":
                    model.Add(start[kind, vs, mb + 1] >= end[kind, vs, mb])
            memory[r][0].extend([start["F", vs, mb], end["W", vs, mb]])
            memory[r][1].extend([1, -1])  # half units
    for r in range(p):
        model.AddNoOverlap(intervals[r])
        model.AddReservoirConstraint(memory[r][0], memory[r][1], 0, int(2 * a.memory_limit + 1e-9))
    makespan = model.NewIntVar(0, horizon, "makespan")
    for vs in range(V):
        for mb in range(m):
            model.Add(makespan >= end["W", vs, mb])
    model.Minimize(makespan)

    if a.hint:
        names = {"FWD": "F", "BWD_INPUT": "B", "BWD_WEIGHT": "W"}
        for ev in json.load(open(a.hint))["traceEvents"]:
            if ev.get("ph") != "X" or ev.get("cat") not in names:
                continue
            r, chunk, mb = ev["tid"], ev["args"]["chunk"], ev["args"]["mb"]
            vs = r if chunk == 0 else 2 * p - 1 - r
            model.AddHint(start[names[ev["cat"]], vs, mb], round(ev["ts"] / 1000.0 * a.scale))

    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = a.seconds
    solver.parameters.num_workers = 1
    status = solver.Solve(model)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        print(solver.StatusName(status), f"lower bound {solver.BestObjectiveBound() / a.scale:g}")
        return 1
    print(solver.StatusName(status), f"makespan {solver.ObjectiveValue() / a.scale:g}",
          f"lower bound {solver.BestObjectiveBound() / a.scale:g} ({solver.WallTime():.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
