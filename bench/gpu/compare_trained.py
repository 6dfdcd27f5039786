#!/usr/bin/env python3
"""compare_trained.py GPU_TRAINED CPU_REFS: the weights each train-* job exported
on the GPU (GPU_TRAINED/<job>/) against the same job's CPU-rank run
(CPU_REFS/<job>/trained/), with test/gpu/cuda_target.py's tolerances."""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "test", "gpu"))
from cuda_target import TOLERANCE, largest_difference, read_weights  # noqa: E402


def main():
    gpu_root, cpu_root = sys.argv[1], sys.argv[2]
    failures = 0
    # pipe-* runs sit beside them in the same tar: pipelines.py compare reads those.
    for job in sorted(j for j in os.listdir(gpu_root) if j.startswith("train-")):
        worst, which, missing = largest_difference(read_weights(os.path.join(cpu_root, job, "trained")),
                                                   read_weights(os.path.join(gpu_root, job)))
        tolerance = TOLERANCE[job.rsplit("-", 1)[1]]
        ok = worst <= tolerance and not missing
        failures += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {job}: max relative weight difference GPU vs CPU {worst:.3g} "
              f"(tolerance {tolerance}; {which})" + (f"; missing on the GPU: {missing}" if missing else ""))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
