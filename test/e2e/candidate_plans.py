#!/usr/bin/env python3
"""Every printed plan compiles (docs/planner.md): for each model and each of
the topologies 1x2 and 1x4, every plan of the ranking that `--candidates N`
prints is compiled as it was evaluated, from one search per model, topology
and forced stage count (`--each-candidate --out DIR --build`: plan K in
DIR/plan-K, the job `--plan-rank K` writes), and its plan.json must name the
schedule, micro-batches and stages the ranking printed. A plan the planner
prints but the compiler rejects (a cut the outliner cannot handle) fails
this test.

    candidate_plans.py --pipec build/bin/pipec [--candidates 6] [--no-build]
                       [--stages 2,4] [--all-test-models] [MODEL...]

Without models: the shipped examples, test/passes/shared-weight-view.onnxtext
and the committed test models whose cuts once failed to compile (ResNet-18:
an antichain cut; BERT: a value read across a cut by ops in both stages;
GPT-2's optimized export: normalization weights merged across stages).
`--all-test-models` takes every model of test/models that pipec imports.
`--stages 2,4` ranks and compiles the plans of each forced stage count as
well (small models often get one replicated stage on their own, which cuts
nothing); `--no-build` stops at `--out` (the outliner, stage code and
weights), which the sweep over every test model uses to stay fast.
"""
import argparse
import concurrent.futures
import glob
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOPOLOGIES = ["1x2", "1x4"]


REGRESSION_MODELS = ["tv-resnet18-legacy", "hf-bert-legacy", "hf-gpt2-dynamo"]


def default_models(pipec, every_test_model):
    models = sorted(glob.glob(os.path.join(ROOT, "examples", "*.onnx")))
    models.append(os.path.join(ROOT, "test", "passes", "shared-weight-view.onnxtext"))
    for path in sorted(glob.glob(os.path.join(ROOT, "test", "models", "*.onnx"))):
        name = os.path.splitext(os.path.basename(path))[0]
        if (every_test_model or name in REGRESSION_MODELS) and \
                subprocess.run([pipec, path], capture_output=True).returncode == 0:
            models.append(path)
    return models


def label_of(model, topology, extra, rank, expected):
    return (f"{os.path.basename(model)} {topology}{' ' + ' '.join(extra) if extra else ''} plan {rank} "
            f"({expected['schedule']}, "
            f"{expected['chunks']} chunks, m={expected['microbatches']}, "
            f"{len(expected['stages'])} stages)")


def plan_error(stderr, rank):
    """The first error pipec printed for plan `rank` (its lines say "(plan K)"),
    or the line before its closing "does not compile"; None if none."""
    lines = stderr.splitlines()
    for i, line in enumerate(lines):
        if f"(plan {rank}): " in line:
            return lines[i - 1] if line.endswith("is not a job") and i > 0 and "(plan " not in lines[i - 1] \
                else line
    return None


def compile_each(pipec, model, topology, candidates, workdir, extra, build):
    """One pipec: the ranking (--json) and the job of every printed plan.
    Returns [(label, problem or None)], or a "no plan" failure."""
    out = os.path.join(workdir, f"{os.path.basename(model)}-{topology}-{'-'.join(extra)}")
    command = [pipec, model, "--gpus", topology, "--candidates", str(candidates), "--json",
               "--each-candidate", "--out", out] + (["--build"] if build else []) + extra
    result = subprocess.run(command, capture_output=True, text=True)
    try:
        plans = json.loads(result.stdout)["planner"]["candidates"]
    except ValueError:
        return None, f"{os.path.basename(model)} {topology} {' '.join(extra)}: no plan: {result.stderr.strip()}"
    outcomes = []
    for rank, expected in enumerate(plans, start=1):
        label = label_of(model, topology, extra, rank, expected)
        error = plan_error(result.stderr, rank)
        path = os.path.join(out, f"plan-{rank}", "plan.json")
        if error or not os.path.exists(path):
            outcomes.append((label, "does not compile: " + (error or "no plan.json (exit %d)" % result.returncode)))
            continue
        with open(path) as f:
            plan = json.load(f)
        pipeline = plan["pipeline"]
        got = (pipeline["schedule"], pipeline["microbatches"], len(plan["stages"]))
        want = (expected["schedule"], expected["microbatches"], len(expected["stages"]))
        outcomes.append((label, f"plan.json has schedule, micro-batches, stages {got}, the ranking {want}"
                         if got != want else None))
    if result.returncode != 0 and all(problem is None for _, problem in outcomes):
        outcomes.append((f"{os.path.basename(model)} {topology} {' '.join(extra)}",
                         f"exit {result.returncode}: " + (result.stderr.strip().splitlines() or ["?"])[-1]))
    return outcomes, None


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pipec", required=True)
    parser.add_argument("--candidates", type=int, default=6)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--all-test-models", action="store_true")
    parser.add_argument("--stages", default="", help="also force these stage counts, e.g. 2,4")
    parser.add_argument("--no-build", action="store_true", help="compile to --out only")
    parser.add_argument("models", nargs="*")
    args = parser.parse_args()
    models = args.models or default_models(args.pipec, args.all_test_models)
    failures, compiled = [], 0
    with tempfile.TemporaryDirectory() as workdir, \
            concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        jobs = []
        forced = [[]] + [["--stages", count] for count in args.stages.split(",") if count]
        for model in models:
            for topology in TOPOLOGIES:
                for extra in forced:
                    if extra and int(extra[1]) > int(topology.split("x")[1]):
                        continue  # more stages than devices
                    jobs.append(pool.submit(compile_each, args.pipec, model, topology, args.candidates,
                                            workdir, extra, not args.no_build))
        for job in jobs:
            outcomes, no_plan = job.result()
            if no_plan:
                failures.append(no_plan)
                continue
            for label, problem in outcomes:
                compiled += 1
                print(f"  {'FAIL' if problem else 'ok  '} {label}" + (f": {problem}" if problem else ""))
                if problem:
                    failures.append(f"{label}: {problem}")
    print(f"{compiled - len([f for f in failures if ' plan ' in f])} of {compiled} printed plans "
          f"compile, over {len(models)} models on {', '.join(TOPOLOGIES)}")
    if failures:
        sys.exit("FAILED:\n  " + "\n  ".join(failures))


if __name__ == "__main__":
    main()
