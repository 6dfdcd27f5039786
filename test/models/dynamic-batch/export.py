#!/usr/bin/env python3
"""Models whose ONNX export leaves the batch dimension (and, for the sequence
models, the sequence length) free, with float64 PyTorch references at other
sizes than the example the exporter traced: what `--micro-batch-size` and the
planner's choice of the micro-batch size work on (docs/planner.md, "The
batch"; test/e2e/microbatch_sizes.py reads them).

Run with a current torch (the venv of test/models/README.md); CI only reads
the committed files:

    /work/torchenv/bin/python test/models/dynamic-batch/export.py

Writes, for each model M: M.onnx, exported from a batch of 2 (sequence length
16) with torch.onnx.export(dynamo=True, optimize=False, dynamic_shapes=...),
and M.<shape>.npz for each reference shape: the inputs, random labels, the
float64 loss (cross-entropy, mean over every label) and grad/<initializer>
for every trained parameter, computed by model.double() in train mode.
"""
import argparse
import json
import os

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
SEED = 1234
VOCAB, WIDTH, HEADS, MAX_POSITIONS = 64, 32, 2, 32
TRACED_BATCH, TRACED_SEQ = 2, 16


class Cnn(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(16)
        self.fc = nn.Linear(16, 10)

    def forward(self, image):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(image))), 2)
        x = F.relu(self.bn2(self.conv2(x)))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


class Attention(nn.Module):
    def __init__(self, causal):
        super().__init__()
        self.qkv = nn.Linear(WIDTH, 3 * WIDTH)
        self.proj = nn.Linear(WIDTH, WIDTH)
        self.causal = causal

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, HEADS, c // HEADS).transpose(1, 2) for z in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) / (c // HEADS) ** 0.5
        if self.causal:
            mask = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
            scores = scores.masked_fill(~mask, float("-inf"))
        y = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, t, c)
        return self.proj(y)


class Block(nn.Module):
    def __init__(self, causal):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(WIDTH), nn.LayerNorm(WIDTH)
        self.attn = Attention(causal)
        self.fc, self.out = nn.Linear(WIDTH, 4 * WIDTH), nn.Linear(4 * WIDTH, WIDTH)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class Gpt(nn.Module):
    """GPT-style: token and position embeddings (positions 0..T-1 of a table
    of MAX_POSITIONS), a causal block, a language-model head."""

    def __init__(self):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(VOCAB, WIDTH), nn.Embedding(MAX_POSITIONS, WIDTH)
        self.block, self.ln = Block(causal=True), nn.LayerNorm(WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB, bias=False)

    def forward(self, input_ids):
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = self.wte(input_ids) + self.wpe(positions)[None]
        return self.head(self.ln(self.block(x)))


class Bert(nn.Module):
    """BERT-style encoder: token, token-type (all zeros) and position
    embeddings, LayerNorm, a bidirectional block, a per-token classifier."""

    def __init__(self):
        super().__init__()
        self.words, self.types = nn.Embedding(VOCAB, WIDTH), nn.Embedding(2, WIDTH)
        self.positions = nn.Embedding(MAX_POSITIONS, WIDTH)
        self.ln, self.block = nn.LayerNorm(WIDTH), Block(causal=False)
        self.classifier = nn.Linear(WIDTH, VOCAB)

    def forward(self, input_ids):
        types = torch.zeros_like(input_ids)
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)[None].expand_as(input_ids)
        x = self.ln(self.words(input_ids) + self.types(types) + self.positions(positions))
        return self.classifier(self.block(x))


MODELS = {
    # name: (module, input name, example shape, reference shapes)
    "cnn": (Cnn, "image", (TRACED_BATCH, 3, 16, 16), [(8, 3, 16, 16), (3, 3, 16, 16)]),
    "gpt": (Gpt, "input_ids", (TRACED_BATCH, TRACED_SEQ), [(8, 2 * TRACED_SEQ), (8, TRACED_SEQ // 2)]),
    "bert": (Bert, "input_ids", (TRACED_BATCH, TRACED_SEQ), [(8, 2 * TRACED_SEQ), (8, TRACED_SEQ // 2)]),
}


def build(name):
    torch.manual_seed(SEED)
    model = MODELS[name][0]()
    model.train()
    return model


def example(name, shape, seed):
    g = torch.Generator().manual_seed(seed)
    if name == "cnn":
        return torch.randn(*shape, generator=g)
    return torch.randint(0, VOCAB, shape, generator=g)


def export(name, path):
    model = build(name)
    input_name, shape = MODELS[name][1], MODELS[name][2]
    x = example(name, shape, SEED + 1)
    batch = torch.export.Dim("batch", min=1, max=1024)
    dims = {0: batch}
    if name != "cnn":
        dims[1] = torch.export.Dim("seq", min=2, max=MAX_POSITIONS)
    torch.onnx.export(model, (x,), path, dynamo=True, optimize=False, external_data=False,
                      input_names=[input_name], output_names=["logits"],
                      dynamic_shapes={input_name: dims})


def reference(name, shape):
    model = build(name).double()
    input_name = MODELS[name][1]
    x = example(name, shape, SEED + 3 + sum(shape))
    logits = model(x.double() if x.is_floating_point() else x)
    C = logits.shape[-1]
    labels = torch.randint(0, C, logits.shape[:-1], generator=torch.Generator().manual_seed(SEED + 2))
    loss = F.cross_entropy(logits.reshape(-1, C), labels.reshape(-1))
    params = dict(model.named_parameters())
    grads = torch.autograd.grad(loss, list(params.values()))
    arrays = {input_name: x.numpy(), "labels": labels.numpy(), "logits": logits.detach().numpy(),
              "loss": np.array(loss.item()),
              "meta": np.array(json.dumps({"shape": list(shape), "torch": torch.__version__}))}
    for (pname, _), grad in zip(params.items(), grads):
        arrays["grad/" + pname] = grad.numpy()
    return arrays


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=HERE)
    args = parser.parse_args()
    for name, (_, _, _, shapes) in MODELS.items():
        path = os.path.join(args.out, name + ".onnx")
        export(name, path)
        for shape in shapes:
            stem = name + "." + "x".join(map(str, shape))
            np.savez_compressed(os.path.join(args.out, stem + ".npz"), **reference(name, shape))
        print("wrote", path, "and", len(shapes), "references")


if __name__ == "__main__":
    main()
