#!/usr/bin/env python3
"""The batch and the sequence length are the user's (docs/planner.md, "The
batch"): each model of test/models/dynamic-batch was exported at batch 2
(sequence length 16) with those dimensions free, and has float64 PyTorch
references at other shapes (batch 8 and 3; sequence length 32 and 8, twice
and half the traced one). At each, the reference evaluator's float64 loss and
gradients (pipec-reference --fp64, the model imported at the arrays' shapes)
must equal PyTorch's within model_matrix.py's tolerance; a job compiled at
the batch-8 shape (`--micro-batch-size 8`, `--input-shape input_ids=b,32`)
must train 3 steps on 2 pipeline ranks with the losses of 1 rank; then
`pipec M --gpus 2x8 --batch-size 512` must choose a micro-batch size that
divides 512, with the lowest time per sample of those it tried.

    microbatch_sizes.py --pipec build/bin/pipec --pipec-reference build/bin/pipec-reference \
        --piperun build/bin/piperun
"""
import argparse
import glob
import json
import os
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
MODELS = os.path.join(ROOT, "test", "models", "dynamic-batch")
sys.path.insert(0, HERE)
from model_matrix import check_gradients, check_two_stages, model_inputs, run  # noqa: E402


def check_training(args, name, npz_path, workdir):
    """3 steps at the reference's shape on 2 stages and on 1 rank: equal losses."""
    npz = np.load(npz_path)
    shape = npz[next(iter(model_inputs(npz)))].shape
    flags = ["--micro-batch-size", str(shape[0])]
    if name != "cnn":
        flags += ["--input-shape", f"input_ids=b,{shape[1]}"]
    ok, detail = check_two_stages(args, os.path.join(MODELS, name + ".onnx"), npz, workdir, flags)
    return ok, detail + (" (2 stages = 1 rank)" if ok else "")


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pipec", required=True)
    parser.add_argument("--pipec-reference", required=True)
    parser.add_argument("--piperun", required=True)
    args = parser.parse_args()
    failures = 0
    references = sorted(glob.glob(os.path.join(MODELS, "*.*.npz")))
    if len(references) < 6:
        print(f"FAIL: expected the 6 references of {MODELS}, found {len(references)}")
        return 1
    with tempfile.TemporaryDirectory() as work:
        for npz_path in references:
            name, shape = os.path.basename(npz_path).split(".")[:2]
            model = os.path.join(MODELS, name + ".onnx")
            workdir = os.path.join(work, name + "." + shape)
            os.makedirs(workdir)
            ok, detail = check_gradients(args, model, np.load(npz_path), workdir)
            print(f"{'ok  ' if ok else 'FAIL'} {name} at {shape}: gradients: {detail}")
            failures += not ok
            if shape.startswith("8x"):
                ok, detail = check_training(args, name, npz_path, workdir)
                print(f"{'ok  ' if ok else 'FAIL'} {name} at {shape}: training: {detail}")
                failures += not ok
        for model in sorted(glob.glob(os.path.join(MODELS, "*.onnx"))):
            name = os.path.basename(model)[:-5]
            job = os.path.join(work, name + "-job")
            command = [args.pipec, model, "--gpus", "2x8", "--batch-size", "512", "--out", job]
            if name != "cnn":  # the sequence length is the user's; the batch stays the planner's (b)
                command += ["--input-shape", "input_ids=b,16"]
            result = run(command)
            if result.returncode != 0:
                print(f"FAIL {name}: pipec {' '.join(command[1:])}: {result.stderr.strip()[-400:]}")
                failures += 1
                continue
            plan = json.load(open(os.path.join(job, "plan.json")))
            batch = plan["planner"]["batch"]
            tried = [t for t in batch.get("microbatch_sizes_tried", []) if "time_per_sample_s" in t]
            chosen = plan["runtime"]["microbatch_size"]
            best = min(tried, key=lambda t: (t["time_per_sample_s"], t["size"])) if tried else None
            good = (best is not None and best["size"] == chosen and 512 % chosen == 0
                    and batch["samples_per_step"] == 512
                    and all(512 % t["size"] == 0 for t in batch["microbatch_sizes_tried"]))
            print(f"{'ok  ' if good else 'FAIL'} {name}: the planner chose micro-batches of {chosen} "
                  f"({len(tried)} of {len(batch.get('microbatch_sizes_tried', []))} sizes planned)")
            failures += not good
    print(f"{failures} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
