#!/usr/bin/env python3
"""Checks the operators the importer lowers (test/models/ops: opset 23's
RMSNormalization, RotaryEmbedding and Attention, the sequence operators,
indexing) with pipec's reference evaluator: the forward output against ONNX's
own reference implementation (committed by make_op_models.py, written with a
newer onnx than CI has), and the gradient of every trained initializer (`w`
and the operators' own weights) against central finite differences of
pipec's loss.
"""
import argparse
import glob
import os
import subprocess
import sys
import tempfile

import numpy as np
import onnx
from onnx import numpy_helper

HERE = os.path.dirname(os.path.abspath(__file__))
MODELS = os.path.join(HERE, "..", "models", "ops")


def run(reference, model, data, out, loss=True):
    # ONNX's semantics of every node (BatchNormalization in the form the file has).
    command = [reference, model, "--output-dir", out, "--batchnorm", "as-exported"] + data
    if loss:
        command[2:2] = ["--loss", "auto"]  # a scalar output is the model's own loss
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)


def check(reference, path, workdir):
    name = os.path.splitext(os.path.basename(path))[0]
    expected = np.load(path[:-5] + ".npz")
    x, labels = os.path.join(workdir, "x.npy"), os.path.join(workdir, "labels.npy")
    np.save(x, expected["x"])
    np.save(labels, expected["labels"])
    failures = []

    out = os.path.join(workdir, name + "-forward")
    run(reference, path, ["--input", "x=" + x], out, loss=False)
    ours = np.load(os.path.join(out, "output_logits.npy"))
    error = float(np.abs(ours - expected["logits"]).max())
    scale = max(1.0, float(np.abs(expected["logits"]).max()))
    ok = ours.shape == expected["logits"].shape and error <= 1e-5 * scale
    print(f"  {'ok  ' if ok else 'FAIL'} {name}: forward vs onnx.reference, max error {error:.3g}")
    if not ok:
        failures.append(name + " forward")

    # A scalar output is the model's own loss (no labels to give).
    data = ["--input", "x=" + x] + ([] if expected["logits"].ndim == 0 else ["--input", "labels=" + labels])
    out = os.path.join(workdir, name + "-train")
    run(reference, path, data, out)
    model = onnx.load(path)
    rng = np.random.default_rng(0)
    step = float(expected["fd_step"]) if "fd_step" in expected.files else 1e-2
    for initializer in model.graph.initializer:
        gradient_path = os.path.join(out, f"grad_{initializer.name}.npy")
        if not os.path.exists(gradient_path):
            continue  # not trained (pipec says why on import)
        gradient = np.load(gradient_path)
        original = onnx.TensorProto()
        original.CopyFrom(initializer)
        values = numpy_helper.to_array(initializer).astype(np.float32)
        worst = 0.0
        for flat in rng.choice(values.size, size=min(6, values.size), replace=False):
            losses = []
            for sign in (1, -1):
                perturbed = values.copy()
                perturbed.flat[flat] += sign * step
                initializer.CopyFrom(numpy_helper.from_array(perturbed, original.name))
                probe = os.path.join(workdir, "probe.onnx")
                onnx.save(model, probe)
                result = os.path.join(workdir, "probe-out")
                run(reference, probe, data, result)
                losses.append(float(np.load(os.path.join(result, "loss.npy"))))
            numeric = (losses[0] - losses[1]) / (2 * step)
            worst = max(worst, abs(numeric - float(gradient.flat[flat])))
        initializer.CopyFrom(original)
        scale = max(1e-3, float(np.abs(gradient).max()))
        ok = worst <= 2e-3 * max(1.0, scale) and np.isfinite(gradient).all()
        print(f"  {'ok  ' if ok else 'FAIL'} {name}: gradient of {initializer.name} vs finite "
              f"differences, max error {worst:.3g} (largest gradient {scale:.3g})")
        if not ok:
            failures.append(f"{name} gradient of {initializer.name}")
    if not os.path.exists(os.path.join(out, "grad_w.npy")):
        failures.append(name + ": w is not trained")
    return failures


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pipec-reference", required=True)
    args = parser.parse_args()
    models = sorted(glob.glob(os.path.join(MODELS, "*.onnx")))
    if not models:
        sys.exit(f"no models in {MODELS}")
    failures = []
    with tempfile.TemporaryDirectory() as workdir:
        for path in models:
            failures += check(args.pipec_reference, path, workdir)
    if failures:
        sys.exit("FAILED: " + ", ".join(failures))
    print(f"all {len(models)} operator models agree")


if __name__ == "__main__":
    main()
