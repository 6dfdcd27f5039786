#!/usr/bin/env python3
"""Pipelines of several ranks on one GPU (issue 48; docs/gpu-runs.md,
"Pipelines on one GPU"): the jobs prepare.sh builds, the runs on_gpu.sh
makes of them, and the comparison here afterwards.

    pipelines.py jobs                 the jobs, one per line (prepare.sh)
    pipelines.py runs                 the runs: job, ranks, route, a line each (on_gpu.sh)
    pipelines.py compare TRAINED CPU  every run's weights (TRAINED/pipe-*) against
                                      the 1-rank job of its example and precision
                                      (TRAINED/train-<example>-<precision>), both
                                      trained on the GPU; a 1F1B-RR run against
                                      pipeseq's run of its CPU job (CPU/<job>/trained)

Every pipeline job is the training check's (test/gpu/cuda_target.py:
its micro-batches, optimizer, seed and steps) on 2 to 4 stages, so its
trained weights must equal the 1-rank job's: fp32 within FP32_TOLERANCE
(the same kernels on the same shapes; only the bundles move between
processes; on CPU ranks these jobs differ from 1 rank by 6e-8 at most),
bf16 within the training check's bf16 tolerance. PipeDream's 1F1B-RR
trains with stale weight versions, so it equals no 1-rank run: its
reference is pipeseq (the single-process run with the same versions) on a
CPU rank, within the training check's GPU-vs-CPU tolerance.
"""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "test", "gpu"))

# (example, schedule, stages, ranks, precision, extra pipec arguments)
JOBS = [
    ("gpt", "1f1b", 2, 2, "fp32", []),
    ("gpt", "1f1b", 4, 4, "fp32", []),
    ("gpt", "zb-h2", 2, 2, "fp32", []),
    ("gpt", "interleaved", 2, 2, "fp32", ["--chunks", "2"]),
    ("gpt", "zb-v", 2, 2, "fp32", []),
    ("gpt", "dualpipev", 2, 2, "fp32", []),
    ("gpt", "1f1b-rr", 2, 3, "fp32", []),      # 3 ranks for 2 stages: the planner replicates one
    ("gpt", "1f1b", 2, 4, "fp32", []),         # 2 x 2 replicas: all-reduce and the tied group of 4
    ("gpt", "1f1b", 2, 2, "bf16", []),
    ("cnn", "1f1b", 2, 2, "fp32", []),
    ("cnn", "1f1b", 4, 4, "fp32", []),
    ("cnn", "interleaved", 2, 2, "fp32", ["--chunks", "2"]),
]
# The routes each job runs by: same-GPU links (CUDA IPC where the machine
# allows it), the staged fallback, and NCCL's own transport between ranks
# of one GPU (PIPEC_NCCL_SAME_GPU=1: the cluster's code path).
ROUTES = {
    "links": {},
    "staged": {"PIPEC_SAME_GPU_TRANSPORT": "staged"},
    "nccl": {"PIPEC_NCCL_SAME_GPU": "1"},
}
FP32_TOLERANCE = 1e-6
# Schedules whose reference is pipeseq on a CPU rank (prepare.sh runs it).
ASYNCHRONOUS = {"1f1b-rr"}


def job_name(example, schedule, stages, ranks, precision):
    return f"pipe-{example}-{schedule}-{stages}s{ranks}r-{precision}"


def runs():
    """(job, ranks, route, its JOBS entry): every job over the links; the
    2-stage 1F1B jobs (GPT with and without replicas, the CNN) over the
    other two routes too."""
    out = []
    for job in JOBS:
        example, schedule, stages, ranks, precision, _ = job
        name = job_name(example, schedule, stages, ranks, precision)
        out.append((name, ranks, "links", job))
        if precision == "fp32" and schedule == "1f1b" and stages == 2:
            out += [(name, ranks, "staged", job), (name, ranks, "nccl", job)]
    return out


def compare(trained, cpu):
    from cuda_target import TOLERANCE, largest_difference, read_weights
    failures = 0
    for name, ranks, route, (example, schedule, _, _, precision, _) in runs():
        run = os.path.join(trained, f"{name}-{route}")
        asynchronous = schedule in ASYNCHRONOUS
        reference = (os.path.join(cpu, name, "trained") if asynchronous
                     else os.path.join(trained, f"train-{example}-{precision}"))
        if not os.path.isdir(run) or not os.path.isdir(reference):
            failures += 1
            print(f"FAIL {name} over {route}: not run ({run if not os.path.isdir(run) else reference} is missing)")
            continue
        worst, which, missing = largest_difference(read_weights(reference), read_weights(run))
        tolerance = TOLERANCE[precision] if asynchronous or precision != "fp32" else FP32_TOLERANCE
        ok = worst <= tolerance and not missing
        failures += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {name} ({ranks} ranks on one GPU, {route}): max relative weight "
              f"difference against {'pipeseq on a CPU rank' if asynchronous else '1 rank'} {worst:.3g} (tolerance {tolerance}; {which})" +
              (f"; missing: {missing}" if missing else ""))
    return 1 if failures else 0


def main():
    command = sys.argv[1] if len(sys.argv) > 1 else ""
    if command == "jobs":
        for example, schedule, stages, ranks, precision, extra in JOBS:
            print(job_name(example, schedule, stages, ranks, precision), example, schedule, stages, ranks, precision,
                  *extra)
        return 0
    if command == "runs":
        for name, ranks, route, _ in runs():
            env = " ".join(f"{k}={v}" for k, v in ROUTES[route].items())
            print(name, ranks, route, env)
        return 0
    if command == "compare" and len(sys.argv) == 4:
        return compare(sys.argv[2], sys.argv[3])
    sys.exit(__doc__)


if __name__ == "__main__":
    sys.exit(main())
