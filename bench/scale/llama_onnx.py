#!/usr/bin/env python3
"""Writes a Llama-shaped ONNX model with external data (bench/scale/README.md).

The graph is the decoder of Llama (token embedding; per layer RMSNorm,
grouped-query causal attention with q/k/v/o projections, RMSNorm, SwiGLU MLP;
final RMSNorm; the vocabulary projection) in ONNX opset 23 operators
(RMSNormalization, Attention), without rotary embeddings, which hold no
weights. Its weights are random (normal, std 0.02; norms 1) and written
tensor by tensor, chunk by chunk, into MODEL.onnx.data, so that writing an 8B
or 70B model needs little memory. --no-data writes the graph only (the
external data file is then absent: a model to plan, not to train).

usage: llama_onnx.py OUT.onnx --size {tinyllama-1.1b,llama-3b,llama3-8b,llama3-70b}
       [--dtype bf16|fp32] [--seq N] [--layers N] [--no-data]
"""
import argparse
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper

# layers, hidden, MLP width, attention heads, key/value heads, vocabulary
SIZES = {
    "tinyllama-1.1b": (22, 2048, 5632, 32, 4, 32000),
    "llama-3b": (26, 3200, 8640, 32, 32, 32000),
    "llama3-8b": (32, 4096, 14336, 32, 8, 128256),
    "llama3-70b": (80, 8192, 28672, 64, 8, 128256),
}
CHUNK = 1 << 24  # elements per write: 32-64 MiB of memory whatever the model


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--size", choices=sorted(SIZES), required=True)
    parser.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16")
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--no-data", action="store_true")
    parser.add_argument("--layers", type=int, help="decoder layers (default: the size's)")
    args = parser.parse_args()
    layers, hidden, mlp, heads, kv_heads, vocab = SIZES[args.size]
    if args.layers is not None:
        layers = args.layers
    kv = hidden // heads * kv_heads
    onnx_type = TensorProto.BFLOAT16 if args.dtype == "bf16" else TensorProto.FLOAT
    element_bytes = 2 if args.dtype == "bf16" else 4
    data_name = os.path.basename(args.out) + ".data"
    data_path = os.path.join(os.path.dirname(os.path.abspath(args.out)), data_name)
    data = None if args.no_data else open(data_path, "wb")
    rng = np.random.default_rng(0)
    initializers, nodes = [], []
    offset = 0

    def weight(name, shape, ones=False):
        nonlocal offset
        count = int(np.prod(shape))
        tensor = TensorProto(name=name, data_type=onnx_type, dims=shape)
        tensor.data_location = TensorProto.EXTERNAL
        for key, value in (("location", data_name), ("offset", str(offset)),
                           ("length", str(count * element_bytes))):
            entry = tensor.external_data.add()
            entry.key, entry.value = key, value
        if data is not None:
            for start in range(0, count, CHUNK):
                n = min(CHUNK, count - start)
                values = (np.ones(n, np.float32) if ones
                          else rng.standard_normal(n, np.float32) * np.float32(0.02))
                if args.dtype == "bf16":  # the upper half of float32 (truncation)
                    values = (values.view(np.uint32) >> 16).astype(np.uint16)
                data.write(values.tobytes())
        offset += count * element_bytes
        initializers.append(tensor)
        return name

    def node(op, inputs, output, **attributes):
        nodes.append(helper.make_node(op, inputs, [output], name=output, **attributes))
        return output

    def rms_norm(x, name):
        return node("RMSNormalization", [x, weight(name + ".weight", [hidden], ones=True)], name,
                    axis=-1, epsilon=1e-5)

    def linear(x, name, fan_in, fan_out):
        return node("MatMul", [x, weight(name + ".weight", [fan_in, fan_out])], name)

    x = node("Gather", [weight("embed_tokens.weight", [vocab, hidden]), "input_ids"], "embed")
    for i in range(layers):
        p = f"layers.{i}"
        h = rms_norm(x, p + ".input_layernorm")
        q = linear(h, p + ".self_attn.q_proj", hidden, hidden)
        k = linear(h, p + ".self_attn.k_proj", hidden, kv)
        v = linear(h, p + ".self_attn.v_proj", hidden, kv)
        a = node("Attention", [q, k, v], p + ".self_attn", q_num_heads=heads, kv_num_heads=kv_heads,
                 is_causal=1)
        x = node("Add", [x, linear(a, p + ".self_attn.o_proj", hidden, hidden)], p + ".attn_residual")
        h = rms_norm(x, p + ".post_attention_layernorm")
        gate = linear(h, p + ".mlp.gate_proj", hidden, mlp)
        silu = node("Mul", [gate, node("Sigmoid", [gate], p + ".mlp.sigmoid")], p + ".mlp.silu")
        up = linear(h, p + ".mlp.up_proj", hidden, mlp)
        down = linear(node("Mul", [silu, up], p + ".mlp.product"), p + ".mlp.down_proj", mlp, hidden)
        x = node("Add", [x, down], p + ".mlp_residual")
    logits = linear(rms_norm(x, "norm"), "lm_head", hidden, vocab)
    graph = helper.make_graph(
        nodes, "llama",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", args.seq])],
        [helper.make_tensor_value_info(logits, TensorProto.FLOAT, ["batch", args.seq, vocab])],
        initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)],
                              producer_name="pipec bench/scale")
    model.ir_version = 10
    with open(args.out, "wb") as out:
        out.write(model.SerializeToString())
    if data is not None:
        data.close()
    print(f"{args.out}: {args.size}, {layers} layers, {offset / element_bytes / 1e9:.2f}B parameters, "
          f"{offset / 2**30:.1f} GiB of {args.dtype} weights" + (" (no data file)" if data is None else ""))


if __name__ == "__main__":
    sys.exit(main())
