#!/usr/bin/env python3
"""pipec's schedules against PyTorch's on bench_schedule's grid (docs/schedules.md,
"Compared with PyTorch's schedules"): p in {4, 8, 16}, m in {p, 2p, 3p, 4p, 8p},
the five cost sets, memory limits p, 2p and unlimited. Per cell, pipec's best
is the fastest of its synchronous families (those of any chunk count at 2, 4
and 8 chunks) under the limit; PyTorch's best is the fastest of the orders its
own generators write (ScheduleInterleavedZeroBubble at 2 and 4 chunks per
rank, ScheduleZBVZeroBubble, ScheduleDualPipeV), read with `pipec schedule
--from-csv` and timed by the same simulator under the same limit, DualPipeV's
OVERLAP_F_B pairs as pipec's own F&B pairs (each F + B - X min(F, B) with
--fb-overlap X, default 0, for both tools). PyTorch's generators are pure
Python and run on mock stages (no GPU, no process group).

Run with a current torch (test/models/README.md), about 4 minutes on 2 cores:

    /work/torchenv/bin/python bench/schedule/torch_compare.py --pipec build/bin/pipec [--p 4 8 16]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import warnings
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "test", "driver", "Inputs", "torch-schedules"))

COSTS = {"F=B=W=1": (1, 1, 1, 0), "F1 B1.2 W0.8 c0.05": (1, 1.2, .8, .05),
         "6.2B profile": (29.718, 29.444, 19.927, .527), "B=2F W=F": (1, 2, 1, 0),
         "F1 B1.2 W0.8 c0.5": (1, 1.2, .8, .5)}
LIMITS = {"p": lambda p: p, "2p": lambda p: 2 * p, "unlimited": lambda p: 1e9}
PIPEC_FAMILIES = [(f, 1) for f in ("gpipe", "1f1b", "zb-h1", "zb-h2", "auto")] + [("zb-v", 2), ("dualpipev", 2)] + \
                 [(f, v) for f in ("interleaved", "zb-interleaved") for v in (2, 4, 8)]


def torch_orders(directory, ps):
    """Writes <family>-p<p>-m<m>.csv of PyTorch's generators; returns the names."""
    import torch.distributed.pipelining.schedules as S
    from export import MockStage  # test/driver/Inputs/torch-schedules/export.py
    families = {"interleaved-zb/2": (S.ScheduleInterleavedZeroBubble, 2),
                "interleaved-zb/4": (S.ScheduleInterleavedZeroBubble, 4),
                "zbv": (S.ScheduleZBVZeroBubble, 2), "dualpipev": (S.ScheduleDualPipeV, 2)}
    for p in ps:
        for k in (1, 2, 3, 4, 8):
            m = k * p
            for name, (cls, v) in families.items():
                n = p * v
                v_shape = cls in (S.ScheduleZBVZeroBubble, S.ScheduleDualPipeV)
                ranks0 = [0, 2 * p - 1] if v_shape else range(0, n, p)
                try:
                    schedule = cls([MockStage(s, n, p) for s in ranks0], m, loss_fn=lambda o, t: o.sum())
                except ValueError:
                    continue  # DualPipeV needs m >= 2p
                schedule._dump_csv(os.path.join(directory, f"{name.replace('/', '-')}-p{p}-m{m}.csv"),
                                   format="compute_only")
    return list(families)


def makespan(pipec, args):
    """The simulated makespan, or None when invalid or over the limit."""
    result = subprocess.run([pipec, "schedule", *args, "--json"], capture_output=True, text=True, timeout=900)
    for line in result.stdout.splitlines():
        if line.startswith("{"):
            j = json.loads(line)
            if j.get("valid") and j["peak_memory"] <= j["memory_limit"] + 1e-9:
                return j["makespan"]
    return None


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pipec", required=True)
    parser.add_argument("--p", type=int, nargs="+", default=[4, 8, 16])
    parser.add_argument("--fb-overlap", default="0", help="share of an F&B pair's shorter half hidden (default 0)")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    with tempfile.TemporaryDirectory() as directory:
        torch_families = torch_orders(directory, args.p)

        def cell(key):
            p, k, costs, limit = key
            m = k * p
            f, b, w, c = COSTS[costs]
            common = ["--cost-f", str(f), "--cost-b", str(b), "--cost-w", str(w), "--comm", str(c),
                      "--activation-limit", str(LIMITS[limit](p)), "--fb-overlap", args.fb_overlap]
            ours = {f"{name}/{v}": makespan(args.pipec, ["--schedule", name, "--chunks", str(v), "--stages", str(p),
                                                         "--microbatches", str(m)] + common)
                    for name, v in PIPEC_FAMILIES}
            theirs = {}
            for name in torch_families:
                path = os.path.join(directory, f"{name.replace('/', '-')}-p{p}-m{m}.csv")
                if os.path.exists(path):
                    theirs[name] = makespan(args.pipec, ["--from-csv", path] + common)
            return key, ours, theirs

        keys = [(p, k, costs, limit) for p in args.p for k in (1, 2, 3, 4, 8) for costs in COSTS for limit in LIMITS]
        with ThreadPoolExecutor(os.cpu_count() or 2) as pool:
            results = list(pool.map(cell, keys))
    slower, worst, ratios, winners, torch_winners = 0, 0.0, [], {}, {}
    print(f"{'p':>3} {'m':>4} {'costs':<20} {'limit':<9} {'pipec':<18} {'makespan':>10} {'torch':<18} {'makespan':>10} {'ratio':>7}")
    for (p, k, costs, limit), ours, theirs in results:
        best = min((v, name) for name, v in ours.items() if v is not None)
        other = min(((v, name) for name, v in theirs.items() if v is not None), default=(float("inf"), "-"))
        ratio = best[0] / other[0]
        ratios.append(ratio)
        winners[best[1]] = winners.get(best[1], 0) + 1
        torch_winners[other[1]] = torch_winners.get(other[1], 0) + 1
        slower += ratio > 1 + 1e-9
        worst = max(worst, ratio)
        print(f"{p:>3} {k * p:>4} {costs:<20} {limit:<9} {best[1]:<18} {best[0]:>10.3f} {other[1]:<18} "
              f"{other[0]:>10.3f} {ratio:>7.4f}")
    ratios.sort()
    print(f"\n{len(results)} cells: pipec slower than PyTorch's best in {slower}; ratio median "
          f"{ratios[len(ratios) // 2]:.4f}, worst {worst:.4f}")
    print("pipec's winners:", ", ".join(f"{k} {v}" for k, v in sorted(winners.items(), key=lambda x: -x[1])))
    print("PyTorch's best:", ", ".join(f"{k} {v}" for k, v in sorted(torch_winners.items(), key=lambda x: -x[1])))
    return 1 if slower else 0


if __name__ == "__main__":
    sys.exit(main())
