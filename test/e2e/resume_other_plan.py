#!/usr/bin/env python3
"""Checkpoints that outlive the plan (docs/checkpoint-format.md, "Another
plan"): N = 2 steps under plan A with a checkpoint, then M = 2 more under
plan B resumed from it, give the weights of N + M = 4 uninterrupted steps
under plan B (relative 1e-5; the figures are printed), for

- 2 stages -> 1 stage (examples/mlp.onnx);
- 1F1B -> ZB-V with 2 chunks per rank (examples/gpt.onnx: dropout, whose
  masks are keyed by node name, and an output head tied to the embedding;
  SGD with momentum: under AdamW the attention's key bias, whose gradient
  is zero but for rounding, moves by the normalized rounding noise, so two
  plans' 2 steps differ by 1e-3 whether or not a checkpoint is between);
- 2 replicas of one stage -> 1 rank (examples/mlp.onnx);
- m = 4 micro-batches of 4 -> m = 8 of 2, the same mini-batch
  (test/models/dynamic-batch/gpt.onnx, whose batch and sequence dimensions
  are free; SGD with momentum, as above; a model with BatchNorm normalizes
  over the micro-batch, so another micro-batch size is other training);

and, so that the comparison can fail, 2 steps under plan B from the
initial weights differ from those 4 steps by more than the tolerance.
A checkpoint of another model (the GPT's, resumed by the MLP's job) is
refused naming the tensors that differ; one of another mini-batch is
refused too (test/security covers that message).

    resume_other_plan.py --pipec build/bin/pipec --piperun build/bin/piperun
"""
import os
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "runtime", "tools"))
import pipeline_training  # noqa: E402
from export_to_onnx import read_stage_files as weights  # noqa: E402

TOLERANCE = 1e-5
MLP, GPT = os.path.join(ROOT, "examples", "mlp.onnx"), os.path.join(ROOT, "examples", "gpt.onnx")
FREE_GPT = os.path.join(ROOT, "test", "models", "dynamic-batch", "gpt.onnx")
CASES = [
    ("2 stages -> 1 stage", MLP, ["--gpus", "1x2", "--stages", "2", "--microbatches", "4"], 2,
     ["--gpus", "1x1", "--microbatches", "4"], 1),
    ("1f1b -> zb-v, 2 chunks", GPT, ["--gpus", "1x2", "--stages", "2", "--schedule", "1f1b", "--microbatches", "4",
                                     "--optimizer", "sgd-momentum"], 2,
     ["--gpus", "1x2", "--stages", "2", "--schedule", "zb-v", "--chunks", "2", "--microbatches", "4",
      "--optimizer", "sgd-momentum"], 2),
    ("2 replicas -> 1", MLP, ["--gpus", "1x2", "--stages", "1", "--microbatches", "4"], 2,
     ["--gpus", "1x1", "--microbatches", "4"], 1),
    ("m = 4 of 4 -> m = 8 of 2", FREE_GPT, ["--gpus", "1x2", "--stages", "2", "--microbatches", "4",
                                            "--micro-batch-size", "4", "--input-shape", "input_ids=b,8",
                                            "--optimizer", "sgd-momentum"], 2,
     ["--gpus", "1x2", "--stages", "2", "--microbatches", "8", "--micro-batch-size", "2",
      "--input-shape", "input_ids=b,8", "--optimizer", "sgd-momentum"], 2),
]


def run(command):
    result = pipeline_training.run(command, timeout=900, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}")
    return result


def difference(a, b):
    """The largest max |a - b| / max |b| over the tensors (inf if the names differ)."""
    if set(a) != set(b):
        return float("inf")
    return max(float(np.abs(a[n].astype(np.float64) - b[n]).max()) / max(float(np.abs(b[n]).max()), 1e-12)
               for n in b)


def main():
    args = pipeline_training.tool_arguments(__doc__, "pipec", "piperun")
    check = pipeline_training.Checks()
    other_model = None
    for label, model, flags_a, ranks_a, flags_b, ranks_b in CASES:
        with tempfile.TemporaryDirectory() as work:
            job_a, job_b = os.path.join(work, "a"), os.path.join(work, "b")
            run([args.pipec, model, "--out", job_a, "--build", *flags_a])
            run([args.pipec, model, "--out", job_b, "--build", *flags_b])

            def piperun(job, ranks, *extra):
                return run(["mpirun", "-np", str(ranks), "--oversubscribe", args.piperun, job, "--quiet", *extra])
            checkpoints = os.path.join(work, "ckpt")
            piperun(job_a, ranks_a, "--iters", "2", "--checkpoint", checkpoints, "--save-every", "2")
            resumed, uninterrupted, short = (os.path.join(work, n) for n in ("resumed", "straight", "short"))
            piperun(job_b, ranks_b, "--iters", "4", "--resume", checkpoints, "--export-weights", resumed)
            piperun(job_b, ranks_b, "--iters", "4", "--export-weights", uninterrupted)
            piperun(job_b, ranks_b, "--iters", "2", "--export-weights", short)
            error = difference(weights(resumed), weights(uninterrupted))
            control = difference(weights(short), weights(uninterrupted))
            check(error <= TOLERANCE and control > TOLERANCE,
                  f"{label}: 2 steps + 2 resumed = 4 uninterrupted steps of the new plan (max relative {error:.1e}; "
                  f"2 steps without the checkpoint: {control:.1e})")
            if model == GPT:
                # The MLP's 1-rank job (8 samples per step, as the GPT's 4 x 2)
                # resumes from the GPT's checkpoint.
                mlp_job = os.path.join(work, "mlp")
                run([args.pipec, MLP, "--gpus", "1x1", "--microbatches", "1", "--out", mlp_job, "--build"])
                result = pipeline_training.run(["mpirun", "-np", "1", args.piperun, mlp_job, "--iters", "4", "--resume",
                                                checkpoints], timeout=900, check=False)
                other_model = result.stdout + result.stderr
    check(other_model is not None and "not a checkpoint of this model" in other_model and
          "tensor(s) missing: param/fc1.weight" in other_model,
          "a checkpoint of another model is refused naming the tensors: " +
          next((line for line in (other_model or "").splitlines() if "not a checkpoint" in line), "(no message)"))
    return check.status()


if __name__ == "__main__":
    sys.exit(main())
