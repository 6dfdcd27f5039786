#!/usr/bin/env python3
"""export_models.py OUT_DIR [--extra]: the models of the GPU runs
(docs/gpu-runs.md), exported with the TorchScript exporter (dynamo=False,
opset 13, training mode, no constant folding: the exporter pipec's recognition
of LayerNorm, RMSNorm, rotary embeddings and attention is tested on, as
bench/codegen does) into OUT_DIR. Needs a current PyPI torch, outside the
repository (and torchvision for --extra).

The table models (TABLE, also torch_baseline.py's), each with a free batch
dimension (pipec picks the micro-batch with --micro-batch-size):
  gpt2   GPT-2 124M: examples/make_examples.py's GPT (pre-LN blocks, biases,
         erf GELU, dropout 0.1 on the attention probabilities and before each
         residual add, tied output head) with GPT-2's embedding dropout too;
         vocabulary 50,257, context 1,024, width 768, 12 heads, 12 layers
  llama  a Llama of the same size: bench/codegen's Llama (modeling_llama.py's
         RMSNorm, rotary embeddings, grouped-query causal attention, SwiGLU,
         no biases, no dropout, untied head); vocabulary 32,000, context
         1,024, width 768, 12 query / 4 key-value heads, SwiGLU 2,048, 12 layers
OUT_DIR/table_models.json: per model its sizes, parameter count and the
parameters that multiply (the MFU's N, docs/gpu-runs.md).

The convolutional loss curves' models (compare_curves.CURVE_CNNS, issue 47's "train
tracking the CPU target"): torchvision's ResNet-50 and MobileNet-V2 at a batch
of 8 images of 64 x 64 (the networks whole, the images small enough for 50
steps on a CPU rank), as curve_<name>.onnx; torchvision needed.

--extra also writes the models of the earlier speed runs (GPT-2 with a fixed
batch is the table's gpt2 now): torchvision's ResNet-50 and
MobileNet-V2 (issue 47's depthwise network; batch 32, 224 x 224),
bench/runtime's MLP of 8 Linear(1024, 1024) at batch 64 and
4,096, and for the micro-batch sizes a 4-layer GPT (vocabulary 8,192, context
512, width 768) whose batch dimension is free (GPT_FREE_BATCH)."""
import json
import os
import sys

import torch
import torch.nn as nn

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "examples"))
sys.path.insert(0, os.path.join(ROOT, "bench", "runtime"))
sys.path.insert(0, os.path.join(ROOT, "bench", "codegen"))
from make_examples import GPT, onnx_export  # noqa: E402
from compare_curves import CURVE_CNN_INPUT, CURVE_CNNS  # noqa: E402


# The micro-batch-size model: GPT(**GPT_FREE_BATCH), exported with a free batch.
GPT_FREE_BATCH = dict(vocab=8192, context=512, dim=768, heads=12, layers=4)

# The table's models: name -> (description, constructor keyword arguments).
TABLE = {
    "gpt2": ("GPT-2 124M", dict(vocab=50257, context=1024, dim=768, heads=12, layers=12)),
    "llama": ("Llama-style 125M (12 q / 4 kv heads)",
              dict(vocab=32000, context=1024, dim=768, heads=12, kv_heads=4, hidden=2048, layers=12)),
}


class GPT2(GPT):
    """make_examples.GPT plus GPT-2's dropout on the embeddings' sum (embd_pdrop
    0.1); the position ids on the tokens' device (no default device needed)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.drop = nn.Dropout(0.1)

    def forward(self, idx):
        pos = torch.arange(0, idx.size(1), dtype=torch.long, device=idx.device).unsqueeze(0)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for block in self.blocks:
            x = block(x)
        return self.ln_f(x) @ self.wte.weight.t()


def table_model(name, kwargs=None):
    """A fresh model of TABLE (seed 0, train mode), on the CPU; kwargs: other sizes."""
    torch.manual_seed(0)
    kwargs = kwargs or TABLE[name][1]
    if name == "gpt2":
        return GPT2(**kwargs).train()
    from bench_codegen import torch_models
    return torch_models()["llama"](**kwargs).train()


def multiplying_parameters(name, model):
    """N of the MFU: every parameter except embedding tables read only by a
    gather (GPT-2's position embeddings, Llama's token embeddings); GPT-2's
    token embeddings count, as the tied output head."""
    total = sum(p.numel() for p in model.parameters())
    lookup = model.wpe.weight.numel() if name == "gpt2" else model.embed.weight.numel()
    return total, total - lookup


def buffers_with_gradient(model, vocab):
    """The floating buffers a gradient reaches (the Llama's rotary tables): PyTorch does
    not train them, but the TorchScript exporter writes them as initializers without
    saying so, and pipec trains every initializer a gradient reaches (docs/importer.md),
    so prepare.sh passes them to --freeze. A gradient that reaches no buffer (GPT's
    boolean mask) needs nothing: pipec freezes those itself."""
    buffers = dict((n, b) for n, b in model.named_buffers() if b.is_floating_point())
    for b in buffers.values():
        b.requires_grad_(True)
    model(torch.randint(0, vocab, (1, 16))).float().sum().backward()
    reached = [n for n, b in buffers.items() if b.grad is not None]
    for b in buffers.values():
        b.requires_grad_(False)
        b.grad = None
    return reached


def export(model, sample, path, input_name, free_batch=False):
    model.train()
    axes = {input_name: {0: "batch"}, "logits": {0: "batch"}} if free_batch else None
    onnx_export(model, (sample,), path, opset_version=13, training=torch.onnx.TrainingMode.TRAINING,
                do_constant_folding=False, input_names=[input_name], output_names=["logits"], dynamic_axes=axes)


def main():
    out = sys.argv[1]
    extra = "--extra" in sys.argv[2:]
    os.makedirs(out, exist_ok=True)
    meta = {}
    for name, (description, kwargs) in TABLE.items():
        model = table_model(name)
        total, multiplying = multiplying_parameters(name, model)
        meta[name] = dict(description=description, parameters=total, multiplying_parameters=multiplying,
                          buffers=buffers_with_gradient(model, kwargs["vocab"]), **kwargs)
        path = os.path.join(out, f"{name}.onnx")
        if not os.path.exists(path):
            export(model, torch.randint(0, kwargs["vocab"], (2, kwargs["context"])), path, "tokens", free_batch=True)
        print(f"{path}: {total:,} parameters, {multiplying:,} multiplying", flush=True)
        del model
    with open(os.path.join(out, "table_models.json"), "w") as f:
        json.dump(meta, f, indent=1)
    import torchvision
    torch.manual_seed(0)
    for name in CURVE_CNNS:
        path = os.path.join(out, f"curve_{name}.onnx")
        if not os.path.exists(path):
            export(getattr(torchvision.models, name)(), torch.randn(*CURVE_CNN_INPUT), path, "image")
    if not extra:
        return
    import bench_runtime
    torch.manual_seed(0)
    for name, model in (("resnet50", torchvision.models.resnet50()),
                        ("mobilenet_v2", torchvision.models.mobilenet_v2())):
        export(model, torch.randn(32, 3, 224, 224), os.path.join(out, f"{name}.onnx"), "image")
    for batch in (64, 4096):
        bench_runtime.export_model(os.path.join(out, f"mlp8x1024_b{batch}.onnx"), 1024, 8, batch)
    export(GPT(**GPT_FREE_BATCH), torch.randint(0, GPT_FREE_BATCH["vocab"], (2, GPT_FREE_BATCH["context"])),
           os.path.join(out, "gpt_free_batch.onnx"), "tokens", free_batch=True)


if __name__ == "__main__":
    main()
