#!/usr/bin/env python3
"""The models of the GPU runs (docs/gpu-runs.md), exported with the TorchScript
exporter in training mode into OUT_DIR: a GPT-2-124M-sized GPT (examples/
make_examples.py's class: vocabulary 50,257, context 1,024, width 768, 12 heads,
12 layers; batch 4), torchvision's ResNet-50 (batch 32, 224 x 224),
bench/runtime's MLP of 8 Linear(1024, 1024) at batch 64 and 4,096, and for the
micro-batch sizes a 4-layer GPT (vocabulary 8,192, context 512, width 768)
whose batch dimension is free (GPT_FREE_BATCH, also torch_baseline.py's). Needs torch
and torchvision (a current PyPI torch, outside the repository)."""
import os
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "examples"))
sys.path.insert(0, os.path.join(ROOT, "bench", "runtime"))
from make_examples import GPT, onnx_export  # noqa: E402
import bench_runtime  # noqa: E402


# The micro-batch-size model: GPT(**GPT_FREE_BATCH), exported with a free batch.
GPT_FREE_BATCH = dict(vocab=8192, context=512, dim=768, heads=12, layers=4)


def export(model, sample, path, input_name, free_batch=False):
    model.train()
    axes = {input_name: {0: "batch"}, "logits": {0: "batch"}} if free_batch else None
    onnx_export(model, (sample,), path, opset_version=13, training=torch.onnx.TrainingMode.TRAINING,
                do_constant_folding=False, input_names=[input_name], output_names=["logits"], dynamic_axes=axes)


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(0)
    export(GPT(vocab=50257, context=1024, dim=768, heads=12, layers=12), torch.randint(0, 50257, (4, 1024)),
           os.path.join(out, "gpt2_124m.onnx"), "tokens")
    import torchvision
    export(torchvision.models.resnet50(), torch.randn(32, 3, 224, 224), os.path.join(out, "resnet50.onnx"), "image")
    for batch in (64, 4096):
        bench_runtime.export_model(os.path.join(out, f"mlp8x1024_b{batch}.onnx"), 1024, 8, batch)
    export(GPT(**GPT_FREE_BATCH), torch.randint(0, GPT_FREE_BATCH["vocab"], (2, GPT_FREE_BATCH["context"])),
           os.path.join(out, "gpt_free_batch.onnx"), "tokens", free_batch=True)


if __name__ == "__main__":
    main()
