#!/usr/bin/env python3
"""The benchmarks in the loop (tools/bench.sh): runs bench/schedule's grid,
bench/codegen and bench/runtime on a built tree, appends one line per
benchmark to bench/history.jsonl (date, commit, machine, load, figures), and
prints each figure beside the previous entry of the same benchmark on the
same machine, marking a change for the worse over --tolerance.

A figure named *_ms, *ratio* or *_rss_mb is better lower, `speedup` higher;
the others, and PyTorch's own (torch_*), are reported, not judged. The history is committed, so that a
regression shows in the next session's run (docs/build.md, "Benchmarks").

    bench/record.py [--build build] [--only schedule,codegen,runtime] [--no-append] [--note TEXT]
"""
import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HISTORY = os.path.join(ROOT, "bench", "history.jsonl")
TORCH_PYTHON = "/usr/bin/python3"  # Debian's python3-torch, as the benchmarks need


def machine():
    model = platform.processor() or "?"
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{model} x{os.cpu_count()}"


def run_json(command):
    started = time.time()
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed ({result.returncode}):\n{result.stderr[-2000:]}")
    # The JSON document is the last thing printed (bench_codegen prints progress before it).
    text = result.stdout
    start = min((i for i in (text.find("["), text.find("{")) if i >= 0), default=-1)
    return json.loads(text[start:]), time.time() - started


def schedule_figures(build):
    rows, seconds = run_json([os.path.join(build, "bench", "schedule", "bench_schedule"), "--grid", "--json"])
    ratios = [r["tight_ratio"] for r in rows]
    return {"cells": len(rows), "mean_tight_ratio": round(statistics.mean(ratios), 4),
            "worst_tight_ratio": round(max(ratios), 4), "grid_s": round(seconds, 1)}


def codegen_figures(build):
    rows, _ = run_json([TORCH_PYTHON, os.path.join(ROOT, "bench", "codegen", "bench_codegen.py"),
                        "--build", build, "--json"])
    figures = {}
    for row in rows:
        for key in ("pipec_ms", "torch_ms", "ratio", "pipec_rss_mb"):
            if row.get(key) is not None:
                figures[f"{row['model']}_t{row['threads']}_{key}"] = row[key]
    return figures


def runtime_figures(build):
    row, _ = run_json([TORCH_PYTHON, os.path.join(ROOT, "bench", "runtime", "bench_runtime.py"),
                       "--build", build, "--json"])
    return {k: v for k, v in row.items() if isinstance(v, (int, float)) and v is not None}


BENCHES = {"schedule": schedule_figures, "codegen": codegen_figures, "runtime": runtime_figures}


def better_lower(name):
    if "torch_" in name:
        return None  # the reference's own figure: a change there is not pipec's
    if name.endswith("speedup"):
        return False
    if name.endswith("_ms") or "ratio" in name or name.endswith("_rss_mb"):
        return True
    return None


def previous_entry(bench, where):
    if not os.path.exists(HISTORY):
        return None
    found = None
    with open(HISTORY) as stream:
        for line in stream:
            if line.strip():
                entry = json.loads(line)
                if entry["bench"] == bench and entry["machine"] == where:
                    found = entry
    return found


def git(*args):
    return subprocess.run(["git", "-C", ROOT, *args], capture_output=True, text=True).stdout.strip()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", default=os.path.join(ROOT, "build"))
    parser.add_argument("--only", default=",".join(BENCHES), help="comma-separated subset of " + ",".join(BENCHES))
    parser.add_argument("--tolerance", type=float, default=0.10, help="a change for the worse over this is marked")
    parser.add_argument("--no-append", action="store_true", help="compare only; leave bench/history.jsonl alone")
    parser.add_argument("--note", help="why these figures differ from the last (a benchmark fixed, a machine changed)")
    args = parser.parse_args()
    where = machine()
    worse = []
    for bench in args.only.split(","):
        if bench not in BENCHES:
            sys.exit(f"record.py: unknown benchmark '{bench}' (one of {', '.join(BENCHES)})")
        load = os.getloadavg()[0]
        figures = BENCHES[bench](args.build)
        entry = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "commit": git("rev-parse", "--short", "HEAD"),
                 "dirty": bool(git("status", "--porcelain", "--untracked-files=no")), "machine": where,
                 "load_before": round(load, 2), "bench": bench, "figures": figures}
        if args.note:
            entry["note"] = args.note
        before = previous_entry(bench, where)
        print(f"{bench} at {entry['commit']}{' (with changes)' if entry['dirty'] else ''} on {where}, "
              f"load {load:.2f}; before: {before['commit'] + ' ' + before['date'] if before else 'none on this machine'}")
        for name, value in figures.items():
            old = before["figures"].get(name) if before else None
            mark = ""
            if isinstance(old, (int, float)) and old and better_lower(name) is not None:
                change = (value - old) / abs(old)
                if (change > args.tolerance) if better_lower(name) else (change < -args.tolerance):
                    mark = "  WORSE"
                    worse.append(f"{bench} {name}: {old} -> {value}")
                mark = f"  {change * 100:+.1f}%" + mark
            print(f"  {name:28} {value!s:>10}  {'' if old is None else old!s:>10}{mark}")
        if not args.no_append:
            with open(HISTORY, "a") as stream:
                stream.write(json.dumps(entry) + "\n")
    if worse:
        print(f"{len(worse)} figure(s) worse than the previous run by over {args.tolerance:.0%} "
              "(a loaded machine can do that: rerun before believing it):\n  " + "\n  ".join(worse))


if __name__ == "__main__":
    main()
