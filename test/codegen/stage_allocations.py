#!/usr/bin/env python3
"""The static memory plan's promise (docs/optimization.md): a stage compiled
at -O2 makes no heap allocation on any call after the first. Compiles each
example model to one CPU stage at -O2, runs every entry point under the
allocation counter (stage_allocations.cpp) and requires zero; the same model
at -O0 (one buffer per value, allocated per call) must count some, so the
counter is seen to work.

    stage_allocations.py --pipec PIPEC --counter STAGE_ALLOCATIONS [--examples DIR]
"""
import argparse
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--pipec", required=True)
    parser.add_argument("--counter", required=True)
    parser.add_argument("--examples", default=os.path.join(ROOT, "examples"))
    parser.add_argument("--models", default="mlp,gpt,cnn")
    args = parser.parse_args()
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    failures = 0
    cases = [(model, "-O2", "--expect-none") for model in args.models.split(",")]
    cases.append((args.models.split(",")[0], "-O0", "--expect-some"))
    with tempfile.TemporaryDirectory(prefix="pipec-alloc-") as work:
        for model, level, expect in cases:
            out = os.path.join(work, f"{model}{level}")
            compiled = subprocess.run(
                [args.pipec, os.path.join(args.examples, f"{model}.onnx"), "--gpus", "1x1",
                 "--microbatches", "2", level, "--out", out, "--build"],
                capture_output=True, text=True, env=env)
            if compiled.returncode != 0:
                print(f"FAIL {model} {level}: pipec exited {compiled.returncode}\n"
                      f"{compiled.stdout}{compiled.stderr}")
                failures += 1
                continue
            library = os.path.join(out, "stages", "libstage_0.so")
            counted = subprocess.run([args.counter, library, expect], capture_output=True,
                                     text=True, env=env)
            ok = counted.returncode == 0
            failures += not ok
            print(f"{'ok  ' if ok else 'FAIL'} {model} {level} ({expect[2:]}): "
                  f"{(counted.stdout + counted.stderr).strip()}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
