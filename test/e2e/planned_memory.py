#!/usr/bin/env python3
"""The planner's activation memory against what the generated stage keeps
(docs/cost-model.md, "Memory").

For each model, one stage on one rank, CPU fp32 and bf16 and CUDA bf16 at -O2: the
plan's activation_bytes per micro-batch in flight (plan.json's stage,
activation_bytes / inflight_microbatches) against the stage descriptor's workspace_bytes
(what the generated stage keeps per micro-batch from its forward to its
backward, stage_abi.h). The ratio must lie in [LOW, HIGH]: the cost model
counts what autodiff's gradient rules read and what -O2 recognizes, while
fusion and elementwise recomputation, which it does not model, move the
workspace a little either way. Before the cost model counted kept values,
the plan counted every op's result: 2.3 to 5.5 times the workspace.
"""
import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile

LOW, HIGH = 0.7, 1.7

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "test", "codegen"))
from cuda_launch_count import descriptor_workspace_bytes  # noqa: E402
# The examples and every exported model of test/models (test/models/README.md).
MODELS = ["examples/gpt.onnx", "examples/cnn.onnx", "examples/mlp.onnx"] + sorted(
    os.path.relpath(path, ROOT) for path in glob.glob(os.path.join(ROOT, "test", "models", "*.onnx")))
# CPU stages keep float32 storage at any precision (docs/cuda-codegen.md, "bf16 storage").
TARGETS = {"cpu": [], "cpu-bf16": ["--precision", "bf16"], "cuda": ["--target", "cuda", "--precision", "bf16"]}


def workspace_bytes(job):
    """The workspace_bytes of the job's one stage source (.cpp or .cu)."""
    source = [path for suffix in (".cpp", ".cu") for path in glob.glob(os.path.join(job, "stages", "stage_0" + suffix))]
    if len(source) != 1:
        sys.exit(f"FAIL: expected one stages/stage_0.cpp or .cu in {job}, found {source}")
    return descriptor_workspace_bytes(source[0])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pipec", required=True)
    args = parser.parse_args()
    failures = []
    with tempfile.TemporaryDirectory() as work:
        for model in MODELS:
            for target, options in TARGETS.items():
                job = os.path.join(work, f"{target}-{os.path.basename(model)[:-5]}")
                result = subprocess.run([args.pipec, os.path.join(ROOT, model), "--gpus", "1x1", "--out", job,
                                         *options], capture_output=True, text=True)
                if result.returncode != 0:
                    failures.append(f"{model} ({target}): pipec failed: {result.stderr.strip()[-400:]}")
                    continue
                with open(os.path.join(job, "plan.json")) as f:
                    stage = json.load(f)["stages"][0]
                planned = stage["activation_bytes"] / max(1, stage["inflight_microbatches"])
                kept = workspace_bytes(job)
                ratio = planned / max(1, kept)
                verdict = "ok" if LOW <= ratio <= HIGH else "OUT OF RANGE"
                print(f"{target:8s} {model:40s} planned {planned:12.0f} B  workspace {kept:12d} B  "
                      f"ratio {ratio:5.2f}  {verdict}")
                if verdict != "ok":
                    failures.append(f"{model} ({target}): planned/workspace = {ratio:.2f}, outside [{LOW}, {HIGH}]")
    if failures:
        sys.exit("FAIL:\n  " + "\n  ".join(failures))
    print(f"OK: {len(MODELS) * len(TARGETS)} plans within [{LOW}, {HIGH}] of their stages' workspace")


if __name__ == "__main__":
    main()
