#!/usr/bin/env python3
"""Float64 PyTorch references for static exports re-specialized to another
batch and sequence length (docs/importer.md, "Another batch or sequence
length"; test/e2e/respecialize.py reads them).

Each file of test/models listed below was exported at batch 2 and sequence
length 16; this script builds the same model again (test/models/export.py's
families, same seed, so the same weights) and computes, at batch 8 with
sequence lengths 32 and 8 (twice and half the traced one), the inputs, random
labels, the float64 loss and the gradient of every initializer that stands for
a torch parameter, mapped onto the file's initializers exactly as
test/models/export.py maps them. Run with the current torch of
test/models/README.md; CI only reads the committed files:

    /work/torchenv/bin/python test/models/respecialized/export.py

Writes <stem>.<batch>x<length>.npz next to this script.
"""
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
MODELS = os.path.dirname(HERE)
sys.path.insert(0, MODELS)
import export as E  # noqa: E402  test/models/export.py

# (stem, shapes): the files whose traced-size gradients the model matrix checks,
# at the shapes pipec re-specializes them to (hf-clip-text has 16 positions:
# only the shorter sequence fits its table).
STEMS = {stem: [(8, 32), (8, 8)] for stem in [
    "hf-bert-legacy", "hf-gpt2-legacy", "hf-llama-legacy", "hf-llama-dynamo-noopt",
    "hf-llama-bf16-dynamo-noopt", "hf-gemma-legacy", "hf-mistral-legacy", "hf-phi-legacy",
    "hf-qwen2-legacy", "hf-roberta-legacy", "torch-lstm-legacy", "torch-lstm-dynamo",
    "torch-lstm-dynamo-noopt"]}
STEMS["hf-clip-text-legacy"] = [(8, 8)]
EXPORTERS = sorted({E.LEG, E.DYN, E.NOOPT, "dynamo-opset23"}, key=len, reverse=True)


def family_and_exporter(stem):
    for exporter in EXPORTERS:
        if stem.endswith("-" + exporter):
            return stem[:-len(exporter) - 1], exporter
    raise ValueError(stem)


def main():
    import onnx
    import torch
    for stem, shapes in STEMS.items():
        family, exporter = family_and_exporter(stem)
        onnx_model = onnx.load(os.path.join(MODELS, stem + ".onnx"))
        traced = np.load(os.path.join(MODELS, stem + ".npz"))
        for shape in shapes:
            inputs = {}
            for index, graph_input in enumerate(onnx_model.graph.input):
                original = traced[graph_input.name]
                g = torch.Generator().manual_seed(E.SEED + 7 + index + sum(shape))
                low = int(original.min())
                inputs[graph_input.name] = torch.randint(low, E.VOCAB, shape, generator=g)
            _, labels, _, loss, grads, *_ = E.reference(family, inputs, onnx_model)
            arrays = {name: t.numpy() for name, t in inputs.items()}
            arrays["labels"] = labels.astype(np.int64)
            arrays["loss"] = np.array(loss, dtype=np.float64)
            arrays.update({k: np.asarray(v, dtype=np.float64).astype(np.float32) for k, v in grads.items()})
            arrays["meta"] = np.array(json.dumps({"file": stem + ".onnx", "shape": list(shape),
                                                  "traced_shape": list(traced[onnx_model.graph.input[0].name].shape),
                                                  "torch": torch.__version__}))
            out = os.path.join(HERE, f"{stem}.{shape[0]}x{shape[1]}.npz")
            np.savez_compressed(out, **arrays)
            print("wrote", out, "loss", loss)


if __name__ == "__main__":
    main()
