#!/usr/bin/env python3
"""Static exports re-specialized to another batch and sequence length
(docs/importer.md, "Another batch or sequence length"):

1. test/models/static-batch: the models of test/models/dynamic-batch exported
   with every dimension fixed (batch 2, sequence 16) give, at batch 8 and
   sequence lengths 32 and 8 (3 for the CNN's batch), the evaluator's float64
   loss and gradients of dynamic-batch's PyTorch references at those shapes;
   the optimized dynamo exports of gpt and bert, which fold the position
   embeddings into constants, are refused naming that constant.
2. test/models/respecialized: files of the model matrix at batch 8 and
   sequence lengths 32 and 8 against PyTorch's float64 references there.
3. Every file of the model matrix whose gradients the matrix checks
   (test/models/expected.txt), at 4x its traced batch, fed its reference
   batch 4 times (labels too): the loss and gradients of the traced
   reference, exactly what the mean over 4 copies of the batch gives
   (BatchNorm's batch statistics included). The files whose graphs compute
   from the traced batch in ways pipec cannot follow are refused, naming the
   node (REFUSED below).
4. A static export trained at another batch and sequence length on 2
   pipeline ranks gives the losses of 1 rank.

    respecialize.py --pipec build/bin/pipec --pipec-reference build/bin/pipec-reference \
        --piperun build/bin/piperun
"""
import argparse
import glob
import os
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
MODELS = os.path.join(ROOT, "test", "models")
sys.path.insert(0, HERE)
from model_matrix import check_gradients, check_two_stages, model_inputs, run  # noqa: E402

# Files refused at another batch, and the words the refusal must hold.
REFUSED = {
    "tv-convnext-dynamo": "node 'node_as_strided' (Gather): reads position 127",
    "tv-swin-dynamo": "node 'node_as_strided' (Gather)",
    "tv-swin-legacy": "(Reshape): target element 0 (8) must follow 4*batch, and it is computed",
}
# Static exports that cannot follow the sequence length, and the constant named.
REFUSED_STATIC = {
    "gpt-dynamo": "constant 'unsqueeze' [1,16,32], read by node 'node_add' (Add)",
    "bert-dynamo": "constant 'embedding_2' [2,16,32], read by node 'node_add_1' (Add)",
}


class Tiled:
    """An .npz's inputs and labels repeated `times` along the batch; the
    references unchanged (np.load's interface, as check_gradients reads it)."""

    def __init__(self, npz, times):
        inputs = set(model_inputs(npz)) | {"labels"}
        self.arrays = {k: np.concatenate([npz[k]] * times) if k in inputs else npz[k] for k in npz.files}
        self.files = list(self.arrays)

    def __getitem__(self, key):
        return self.arrays[key]


def gradient_files():
    """The stems whose gradients the model matrix checks."""
    stems = []
    for line in open(os.path.join(MODELS, "expected.txt")):
        words = line.split()
        if words and not line.startswith("#") and "gradients" in words[1:]:
            stems.append(words[0])
    return stems


def refusal(args, model, flags, expected):
    result = run([args.pipec, model, *flags])
    text = result.stderr
    if result.returncode == 0:
        return False, "imported; expected a refusal naming " + expected
    if "cannot re-specialize the export" not in text or expected not in text:
        return False, "refused otherwise: " + text.strip()[-300:]
    return True, "refused: " + expected


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pipec", required=True)
    parser.add_argument("--pipec-reference", required=True)
    parser.add_argument("--piperun", required=True)
    parser.add_argument("--only", nargs="*", default=[], help="check only the files whose name holds one of these")
    args = parser.parse_args()
    failures = 0

    def report(ok, what, detail):
        nonlocal failures
        print(f"{'ok  ' if ok else 'FAIL'} {what}: {detail}", flush=True)
        failures += not ok

    def wanted(name):
        return not args.only or any(o in name for o in args.only)

    with tempfile.TemporaryDirectory() as work:
        # 1. Static exports of dynamic-batch's models.
        for model in sorted(glob.glob(os.path.join(MODELS, "static-batch", "*.onnx"))):
            stem = os.path.basename(model)[:-5]
            if not wanted(stem):
                continue
            name = stem.split("-")[0]
            for npz_path in sorted(glob.glob(os.path.join(MODELS, "dynamic-batch", name + ".*.npz"))):
                shape = os.path.basename(npz_path).split(".")[1]
                npz = np.load(npz_path)
                if stem in REFUSED_STATIC:
                    dims = ",".join(map(str, npz["input_ids"].shape))
                    ok, detail = refusal(args, model, ["--input-shape", "input_ids=" + dims], REFUSED_STATIC[stem])
                    report(ok, f"static-batch/{stem} at {shape}", detail)
                    continue
                if stem == "cnn-dynamo":
                    # The optimizer folded BatchNorm into the convolutions: another
                    # model than the reference's; it imports at the new batch.
                    result = run([args.pipec, model, "--micro-batch-size", shape.split("x")[0]])
                    report(result.returncode == 0, f"static-batch/{stem} at {shape}",
                           "imports" if result.returncode == 0 else result.stderr.strip()[-300:])
                    continue
                workdir = os.path.join(work, f"static-{stem}.{shape}")
                os.makedirs(workdir)
                ok, detail = check_gradients(args, model, npz, workdir)
                report(ok, f"static-batch/{stem} at {shape}", detail)

        # 2. Model-matrix files at other sequence lengths, against PyTorch.
        for npz_path in sorted(glob.glob(os.path.join(MODELS, "respecialized", "*.npz"))):
            stem, shape = os.path.basename(npz_path).split(".")[:2]
            if not wanted(stem):
                continue
            workdir = os.path.join(work, f"seq-{stem}.{shape}")
            os.makedirs(workdir)
            ok, detail = check_gradients(args, os.path.join(MODELS, stem + ".onnx"), np.load(npz_path), workdir)
            report(ok, f"{stem} at {shape}", detail)

        # 3. Every gradient-checked file at 4x its traced batch.
        stems = gradient_files()
        stems += [stem for stem in sorted(REFUSED) if stem not in stems]
        for stem in stems:
            if not wanted(stem):
                continue
            model = os.path.join(MODELS, stem + ".onnx")
            npz = np.load(os.path.join(MODELS, stem + ".npz"))
            if stem in REFUSED:
                first = next(iter(model_inputs(npz)))
                dims = ",".join(map(str, (4 * npz[first].shape[0],) + npz[first].shape[1:]))
                ok, detail = refusal(args, model, ["--input-shape", f"{first}={dims}"], REFUSED[stem])
                report(ok, f"{stem} at 4x its batch", detail)
                continue
            workdir = os.path.join(work, f"batch-{stem}")
            os.makedirs(workdir)
            ok, detail = check_gradients(args, model, Tiled(npz, 4), workdir)
            report(ok, f"{stem} at 4x its batch", detail)

        # 4. Training at a re-specialized shape: 2 ranks = 1 rank.
        for stem, shape in [("gpt-legacy", "8x32"), ("cnn-dynamo-noopt", "8x3x16x16")]:
            if not wanted(stem):
                continue
            name = stem.split("-")[0]
            npz = np.load(os.path.join(MODELS, "dynamic-batch", f"{name}.{shape}.npz"))
            dims = shape.split("x")
            flags = ["--micro-batch-size", dims[0]]
            if name != "cnn":
                flags += ["--input-shape", f"input_ids=b,{dims[1]}"]
            workdir = os.path.join(work, f"train-{stem}")
            os.makedirs(workdir)
            ok, detail = check_two_stages(args, os.path.join(MODELS, "static-batch", stem + ".onnx"), npz,
                                          workdir, flags)
            report(ok, f"static-batch/{stem} trained at {shape}", detail + (" (2 stages = 1 rank)" if ok else ""))
    print(f"{failures} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
