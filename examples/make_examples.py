#!/usr/bin/env python3
"""Builds the example models with PyTorch's ONNX exporter (Debian's python3-torch).

The models are exported in training mode at opset 13 by default, as PyTorch
1.13 does for real models: BatchNormalization in its 5-output form, Dropout
with training_mode, decomposed LayerNorm, exact GELU as Div/Erf/Add/Mul/Mul,
reshape targets as Constant/Unsqueeze/Concat chains, and tied embedding
weights. Run with /usr/bin/python3; the output is deterministic (fixed seeds).
With a current torch (2.9 and later export with dynamo=True by default), the
same TorchScript exporter is asked for by `dynamo=False` (onnx_export below).

    /usr/bin/python3 examples/make_examples.py [--out DIR] [--opset N] [--only NAME]
"""
import argparse
import inspect
import math
import os

import torch
import torch.nn as nn
import torch.nn.functional as F


class MLP(nn.Module):
    """A 3-layer perceptron on 32 features with 10 classes."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(32, 64)
        self.fc2 = nn.Linear(64, 64)
        self.fc3 = nn.Linear(64, 10)

    def forward(self, x):
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)


class CNN(nn.Module):
    """Two conv/bn/relu/pool blocks, a global average pool, dropout and a linear head."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(16)
        self.pool = nn.MaxPool2d(2)
        self.avg = nn.AvgPool2d(2)
        self.drop = nn.Dropout(0.1)
        self.fc = nn.Linear(16, 10)

    def forward(self, x):
        x = self.pool(F.relu(self.bn1(self.conv1(x))))
        x = self.avg(F.relu(self.bn2(self.conv2(x))))
        x = F.adaptive_avg_pool2d(x, 1)
        x = torch.flatten(x, 1)
        return self.fc(self.drop(x))


class Block(nn.Module):
    """A GPT-2 block: pre-norm causal self-attention and a GELU MLP."""

    def __init__(self, dim, heads, context, additive_mask=False):
        super().__init__()
        self.heads = heads
        # additive_mask: the causal mask as a buffer of 0 and -inf added to
        # the scores (as some models write it) instead of masked_fill.
        self.additive_mask = additive_mask
        self.ln1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.ln2 = nn.LayerNorm(dim)
        self.fc = nn.Linear(dim, 4 * dim)
        self.out = nn.Linear(4 * dim, dim)
        self.drop = nn.Dropout(0.1)
        causal = torch.tril(torch.ones(context, context)).view(1, 1, context, context)
        if additive_mask:
            self.register_buffer("additive", torch.zeros_like(causal).masked_fill(causal == 0, float("-inf")))
        else:
            self.register_buffer("mask", causal)

    def forward(self, x):
        b, t, c = x.size()
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q = q.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        k = k.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        v = v.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        if self.additive_mask:
            att = att + self.additive[:, :, :t, :t]
        else:
            att = att.masked_fill(self.mask[:, :, :t, :t] == 0, float("-inf"))
        att = self.drop(F.softmax(att, dim=-1))
        y = (att @ v).transpose(1, 2).contiguous().view(b, t, c)
        x = x + self.drop(self.proj(y))
        x = x + self.drop(self.out(F.gelu(self.fc(self.ln2(x)))))
        return x


class GPT(nn.Module):
    """A small GPT: token and position embeddings, 2 blocks, tied output head."""

    def __init__(self, vocab=64, context=16, dim=32, heads=2, layers=2, additive_mask=False):
        super().__init__()
        self.wte = nn.Embedding(vocab, dim)
        self.wpe = nn.Embedding(context, dim)
        self.blocks = nn.ModuleList([Block(dim, heads, context, additive_mask) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(dim)

    def forward(self, idx):
        t = idx.size(1)
        pos = torch.arange(0, t, dtype=torch.long).unsqueeze(0)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.blocks:
            x = block(x)
        # Tied weights: the embedding matrix is the output projection too.
        return self.ln_f(x) @ self.wte.weight.t()


def onnx_export(model, args, path, **kwargs):
    """torch.onnx.export with the TorchScript-based exporter, whose graphs pipec imports.

    torch 1.13 (Debian's python3-torch) has only that exporter and no `dynamo`
    keyword; torch 2.9 and later default to dynamo=True (torch.export, opset 18
    and later, an ONNX optimizer), which writes other graphs (test/models/README.md):
    there `dynamo=False` keeps the exporter these scripts were written for. The
    other scripts that export (test/e2e, bench/) call this one.
    """
    if "dynamo" in inspect.signature(torch.onnx.export).parameters:
        kwargs.setdefault("dynamo", False)
    torch.onnx.export(model, args, path, **kwargs)


def examples():
    return {
        "mlp": (MLP, lambda: torch.randn(8, 32), ["x"]),
        "cnn": (CNN, lambda: torch.randn(4, 3, 16, 16), ["image"]),
        "gpt": (GPT, lambda: torch.randint(0, 64, (2, 16)), ["tokens"]),
    }


def export(name, out_dir, opset):
    model_class, make_input, input_names = examples()[name]
    torch.manual_seed(0)
    model = model_class()
    model.train()
    sample = make_input()
    path = os.path.join(out_dir, f"{name}.onnx")
    onnx_export(
        model, (sample,), path, opset_version=opset,
        training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False,
        input_names=input_names, output_names=["logits"])
    return path


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.dirname(os.path.abspath(__file__)))
    parser.add_argument("--opset", type=int, default=13)
    parser.add_argument("--only", choices=sorted(examples()), action="append")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    for name in args.only or sorted(examples()):
        path = export(name, args.out, args.opset)
        print(f"wrote {path} ({os.path.getsize(path)} bytes)")


if __name__ == "__main__":
    main()
