#!/usr/bin/env python3
"""Checks pipec's reference evaluator and autodiff on the example models
against independent oracles: onnxruntime for the forward results, PyTorch
(Debian's python3-torch) for the loss and every parameter's gradient.

The examples are re-exported from examples/make_examples.py with dropout
disabled (its masks come from different generators), in training mode, so
BatchNormalization uses batch statistics in all three implementations.
"""
import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np
import onnx
import onnxruntime
from onnx import numpy_helper
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "examples"))
import make_examples  # noqa: E402


def sanitize(name):
    return "".join(c if c.isalnum() or c in ".-" else "_" for c in name)


def close(name, ours, reference, rtol, atol, failures):
    scale = max(1.0, float(np.abs(reference).max()))
    error = float(np.abs(ours - reference).max()) if reference.size else 0.0
    ok = ours.shape == reference.shape and error <= atol * scale + rtol * scale
    print(f"  {'ok  ' if ok else 'FAIL'} {name}: max abs error {error:.3g} (scale {scale:.3g})")
    if not ok:
        failures.append(name)


def check(example, pipec_reference, workdir, failures):
    model_class, make_input, input_names = make_examples.examples()[example]
    torch.manual_seed(0)
    model = model_class()
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    model.train()
    sample = make_input()
    path = os.path.join(workdir, f"{example}.onnx")
    make_examples.onnx_export(model, (sample,), path, opset_version=13,
                              training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False,
                              input_names=input_names, output_names=["logits"])
    inputs = sample.numpy()
    np.save(os.path.join(workdir, "input.npy"), inputs)
    print(f"{example}:")

    # Forward: onnxruntime on the exported model.
    session = onnxruntime.InferenceSession(path)
    expected = session.run(None, {input_names[0]: inputs})[0]
    out = os.path.join(workdir, f"{example}-forward")
    subprocess.run([pipec_reference, path, "--input", f"{input_names[0]}=" +
                    os.path.join(workdir, "input.npy"), "--output-dir", out], check=True)
    close("forward vs onnxruntime", np.load(os.path.join(out, "output_logits.npy")), expected,
          1e-5, 1e-5, failures)

    # Loss and gradients: PyTorch.
    torch.manual_seed(1)
    logits = model(sample)
    classes = logits.shape[-1]
    labels = torch.randint(0, classes, logits.shape[:-1])
    np.save(os.path.join(workdir, "labels.npy"), labels.numpy())
    loss = F.cross_entropy(logits.reshape(-1, classes), labels.reshape(-1))
    model.zero_grad()
    loss.backward()
    out = os.path.join(workdir, f"{example}-train")
    subprocess.run([pipec_reference, path, "--loss", "softmax-cross-entropy",
                    "--input", f"{input_names[0]}=" + os.path.join(workdir, "input.npy"),
                    "--input", "labels=" + os.path.join(workdir, "labels.npy"),
                    "--output-dir", out], check=True)
    close("loss vs pytorch", np.load(os.path.join(out, "loss.npy")),
          loss.detach().numpy(), 1e-5, 1e-5, failures)
    finite_differences(path, inputs, input_names[0], workdir, out, failures)
    for name, parameter in model.named_parameters():
        grad_file = os.path.join(out, f"grad_{sanitize(name)}.npy")
        if not os.path.exists(grad_file):
            print(f"  FAIL {name}: pipec wrote no gradient")
            failures.append(f"{example}:{name}")
            continue
        close(f"grad {name}", np.load(grad_file), parameter.grad.numpy(), 1e-4, 1e-5, failures)


def finite_differences(path, inputs, input_name, workdir, out, failures, entries=2):
    """Central differences of the loss pipec's evaluator computes, for a few
    entries of every parameter, against pipec's own gradients."""
    model = onnx.load(path)
    rng = np.random.default_rng(0)
    data = ["--input", f"{input_name}=" + os.path.join(workdir, "input.npy"),
            "--input", "labels=" + os.path.join(workdir, "labels.npy")]
    worst = 0.0
    for initializer in model.graph.initializer:
        grad_file = os.path.join(out, f"grad_{sanitize(initializer.name)}.npy")
        if not os.path.exists(grad_file):
            continue
        gradient = np.load(grad_file)
        values = numpy_helper.to_array(initializer).copy()
        for flat in rng.choice(values.size, size=min(entries, values.size), replace=False):
            losses = []
            for sign in (1, -1):
                perturbed = values.copy()
                eps = 1e-2 * max(1.0, abs(float(perturbed.flat[flat])))
                perturbed.flat[flat] += sign * eps
                initializer.CopyFrom(numpy_helper.from_array(perturbed, initializer.name))
                probe = os.path.join(workdir, "probe.onnx")
                onnx.save(model, probe)
                result = os.path.join(workdir, "probe-out")
                subprocess.run([PIPEC_REFERENCE, probe, "--loss", "softmax-cross-entropy",
                                "--output-dir", result] + data, check=True)
                losses.append(float(np.load(os.path.join(result, "loss.npy"))))
            initializer.CopyFrom(numpy_helper.from_array(values, initializer.name))
            numeric = (losses[0] - losses[1]) / (2 * eps)
            worst = max(worst, abs(numeric - float(gradient.flat[flat])))
    ok = worst <= 2e-3
    print(f"  {'ok  ' if ok else 'FAIL'} finite differences of the loss vs pipec's gradients: "
          f"max abs error {worst:.3g}")
    if not ok:
        failures.append("finite differences")


PIPEC_REFERENCE = None


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pipec-reference", required=True)
    parser.add_argument("--only", action="append")
    args = parser.parse_args()
    global PIPEC_REFERENCE
    PIPEC_REFERENCE = args.pipec_reference
    failures = []
    with tempfile.TemporaryDirectory() as workdir:
        for example in args.only or ["mlp", "cnn", "gpt"]:
            check(example, args.pipec_reference, workdir, failures)
    print(f"{len(failures)} failed" if failures else "all checks passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
