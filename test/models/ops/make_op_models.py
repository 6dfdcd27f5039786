#!/usr/bin/env python3
"""Writes small ONNX models of the operators that the importer lowers
(opset 23's RMSNormalization, RotaryEmbedding and Attention; the sequence
operators; indexing folded at import or lowered at run time) with the
expected forward output from ONNX's own reference implementation.

Run with a current onnx (1.23 or newer; the committed files were written by
onnx 1.23.2), outside CI:

    /path/to/venv/bin/python test/models/ops/make_op_models.py

Each model reads `x`, multiplies it by a trained initializer `w` (so that
pipec has a parameter whose gradient test/e2e/op_models.py checks by
finite differences), applies the operator(s) and returns `logits`;
`<name>.npz` holds `x`, `logits` (from onnx.reference) and `labels`.
"""
import os
import zlib

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

HERE = os.path.dirname(os.path.abspath(__file__))
F = TensorProto.FLOAT


def model(name, nodes, x_shape, out_shape, initializers, opset, check=True, oracle=None,
          onnxruntime=False, fd_step=1e-2):
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    x = rng.standard_normal(x_shape).astype(np.float32)
    w = (1.0 + 0.1 * rng.standard_normal(x_shape)).astype(np.float32)
    inits = [numpy_helper.from_array(w, "w")] + [
        numpy_helper.from_array(np.asarray(value), key) for key, value in initializers.items()]
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "w"], ["xw"])] + nodes, name,
        [helper.make_tensor_value_info("x", F, x_shape)],
        [helper.make_tensor_value_info("logits", F, out_shape)], inits)
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                              producer_name="make_op_models.py")
    proto.ir_version = 10
    if check:  # the checker refuses deprecated versions (GroupNormalization-18)
        onnx.checker.check_model(proto, full_check=True)
    if oracle:  # where onnx.reference is wrong: fn(x * w, initializers) in float64
        logits = oracle(x.astype(np.float64) * w, initializers).astype(np.float32)
    elif onnxruntime:  # where onnx.reference ignores an attribute (LSTM's clip)
        import onnxruntime as ort
        session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
        logits = session.run(None, {"x": x})[0]
    else:
        logits = ReferenceEvaluator(proto).run(None, {"x": x})[0]
    assert logits.shape == tuple(out_shape), (name, logits.shape)
    # A scalar output is the model's own loss: no labels (an empty array).
    labels = (rng.integers(0, out_shape[-1], size=out_shape[:-1]).astype(np.int64) if out_shape
              else np.zeros(0, dtype=np.int64))
    onnx.save(proto, os.path.join(HERE, f"{name}.onnx"))
    # fd_step: the finite-difference step of test/e2e/op_models.py (smaller
    # where a clip's kinks lie within 1e-2 of the sampled values).
    extra = {} if fd_step == 1e-2 else {"fd_step": np.float64(fd_step)}
    np.savez(os.path.join(HERE, f"{name}.npz"), x=x, logits=logits, labels=labels, **extra)
    print(f"{name}: {[n.op_type for n in nodes]}")


def rotary_caches(positions, half):
    inv = 1.0 / (10000 ** (np.arange(half) / half))
    angles = np.arange(positions)[:, None] * inv[None, :]
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def main():
    B, S, H, D = 2, 6, 4, 8
    # RMSNormalization over the last axis with a trained scale.
    model("rms_norm", [
        helper.make_node("RMSNormalization", ["xw", "scale"], ["logits"], axis=-1, epsilon=1e-5),
    ], [B, S, H * D], [B, S, H * D],
        {"scale": np.linspace(0.5, 1.5, H * D).astype(np.float32)}, 23)

    cos, sin = rotary_caches(16, D // 2)
    positions = np.array([[3, 1, 4, 1, 5, 9], [2, 6, 5, 3, 5, 8]], dtype=np.int64)
    # Rotary embedding, 4-D (batch, heads, sequence, head), halves rotated.
    model("rotary_4d", [
        helper.make_node("RotaryEmbedding", ["xw", "cos", "sin", "positions"], ["logits"]),
    ], [B, H, S, D], [B, H, S, D], {"cos": cos, "sin": sin, "positions": positions}, 23)
    # 3-D (batch, sequence, hidden), interleaved pairs, half of each head rotated.
    cos4, sin4 = rotary_caches(16, D // 4)
    model("rotary_3d_interleaved", [
        helper.make_node("RotaryEmbedding", ["xw", "cos", "sin", "positions"], ["logits"],
                         interleaved=1, num_heads=H, rotary_embedding_dim=D // 2),
    ], [B, S, H * D], [B, S, H * D], {"cos": cos4, "sin": sin4, "positions": positions}, 23)

    # Attention: 3-D grouped-query (4 query heads, 2 key/value heads), causal.
    model("attention_gqa_causal", [
        helper.make_node("Slice", ["xw", "q_start", "q_end", "axis2"], ["q"]),
        helper.make_node("Slice", ["xw", "k_start", "k_end", "axis2"], ["k"]),
        helper.make_node("Slice", ["xw", "v_start", "v_end", "axis2"], ["v"]),
        helper.make_node("Attention", ["q", "k", "v"], ["logits"], is_causal=1,
                         q_num_heads=4, kv_num_heads=2),
    ], [B, S, 64], [B, S, 32], {
        "q_start": np.array([0]), "q_end": np.array([32]), "k_start": np.array([32]),
        "k_end": np.array([48]), "v_start": np.array([48]), "v_end": np.array([64]),
        "axis2": np.array([2])}, 23)
    # 4-D, a boolean mask (padding of the last two keys), softcap and scale.
    mask = np.ones((B, 1, S, S), dtype=bool)
    mask[1, :, :, -2:] = False
    model("attention_bool_mask_softcap", [
        helper.make_node("Split", ["xw"], ["q", "k", "v"], axis=3, num_outputs=3),
        helper.make_node("Attention", ["q", "k", "v", "mask"], ["logits"], softcap=2.0,
                         scale=0.3),
    ], [B, H, S, 3 * D], [B, H, S, D], {"mask": mask}, 23)
    # 4-D with an additive float mask.
    bias = np.where(np.tril(np.ones((S, S))) > 0, 0.0, -1e4).astype(np.float32)[None, None]
    model("attention_additive_mask", [
        helper.make_node("Split", ["xw"], ["q", "k", "v"], axis=3, num_outputs=3),
        helper.make_node("Attention", ["q", "k", "v", "bias"], ["logits"]),
    ], [B, H, S, 3 * D], [B, H, S, D], {"bias": bias}, 23)

    # torch.split / chunk under the dynamo exporter: a sequence of pieces.
    model("split_to_sequence", [
        helper.make_node("SplitToSequence", ["xw", "chunk"], ["pieces"], axis=2),
        helper.make_node("SequenceAt", ["pieces", "zero"], ["a"]),
        helper.make_node("SequenceAt", ["pieces", "minus_one"], ["b"]),
        helper.make_node("Mul", ["a", "b"], ["ab"]),
        helper.make_node("SequenceConstruct", ["ab", "a"], ["pair"]),
        helper.make_node("ConcatFromSequence", ["pair"], ["logits"], axis=1, new_axis=1),
    ], [B, S, 12], [B, 2, S, 4], {"chunk": np.array(4, dtype=np.int64),
                                   "zero": np.array(0, dtype=np.int64),
                                   "minus_one": np.array(-1, dtype=np.int64)}, 20)
    model("split_to_sequence_unbind", [
        helper.make_node("SplitToSequence", ["xw"], ["rows"], axis=1, keepdims=0),
        helper.make_node("SequenceAt", ["rows", "two"], ["logits"]),
    ], [B, S, 5], [B, 5], {"two": np.array(2, dtype=np.int64)}, 18)

    # Indexing on run-time values (Trilu, Tile), and on integer constants
    # folded at import (CumSum, GatherElements, ScatterND, GatherND,
    # ScatterElements: position ids and masks) that then weight them.
    positions_mask = np.array([[1, 1, 0, 1, 1, 0, 1, 1, 1, 0, 0, 1]], dtype=np.int64)
    model("indexing", [
        helper.make_node("Trilu", ["xw", "one"], ["upper"], upper=1),
        helper.make_node("Tile", ["upper", "repeats"], ["tiled"]),
        helper.make_node("CumSum", ["positions_mask", "axis1"], ["cumulative"]),
        helper.make_node("Mul", ["cumulative", "positions_mask"], ["position_ids"]),
        helper.make_node("GatherElements", ["table", "gather_index"], ["picked"], axis=1),
        helper.make_node("ScatterND", ["zeros", "scatter_index", "updates"], ["scattered"]),
        helper.make_node("GatherND", ["scattered", "nd_index"], ["nd"]),
        helper.make_node("ScatterElements", ["nd", "elements_index", "elements_updates"],
                         ["integer_weights"], axis=1, reduction="add"),
        helper.make_node("Cast", ["integer_weights"], ["weights"], to=F),
        helper.make_node("Add", ["picked", "position_ids"], ["integer_offset"]),
        helper.make_node("Cast", ["integer_offset"], ["offset"], to=F),
        helper.make_node("Mul", ["tiled", "weights"], ["weighted"]),
        helper.make_node("Add", ["weighted", "offset"], ["logits"]),
    ], [B, S, S], [B, 2 * S, 2 * S], {
        "one": np.array(1, dtype=np.int64), "repeats": np.array([1, 2, 2], dtype=np.int64),
        "positions_mask": positions_mask, "axis1": np.array(1, dtype=np.int64),
        "table": np.arange(12, dtype=np.int64).reshape(1, 12),
        "gather_index": np.array([[11, 0, 3, 3, 7, 2, 1, 1, 0, 5, 6, 9]], dtype=np.int64),
        "zeros": np.zeros((4, 12), dtype=np.int64),
        "scatter_index": np.array([[1], [3]], dtype=np.int64),
        "updates": np.arange(1, 25, dtype=np.int64).reshape(2, 12),
        "nd_index": np.array([[3]], dtype=np.int64),
        "elements_index": np.array([[1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 11, 11]], dtype=np.int64),
        "elements_updates": np.full((1, 12), 3, dtype=np.int64)}, 18)


def runtime_indexing():
    """CumSum, GatherElements and GatherND on run-time values (lowered at
    import): position-like indices computed from the input, as RoBERTa's
    position ids are, select entries of the trained `xw`."""
    B, S, L = 2, 6, 8
    I64 = TensorProto.INT64
    model("cumsum_runtime", [
        helper.make_node("CumSum", ["xw", "axis1"], ["forward"]),
        helper.make_node("CumSum", ["xw", "axis2"], ["backward"], exclusive=1, reverse=1),
        helper.make_node("Add", ["forward", "backward"], ["logits"]),
    ], [B, S, L], [B, S, L], {"axis1": np.array(1, dtype=np.int64),
                              "axis2": np.array(-1, dtype=np.int32)}, 14)
    model("gather_runtime", [
        helper.make_node("Greater", ["x", "zero"], ["positive"]),
        helper.make_node("Cast", ["positive"], ["flags"], to=I64),
        helper.make_node("CumSum", ["flags", "axis2"], ["counts"]),
        helper.make_node("Sub", ["counts", "one"], ["index"]),  # -1 .. 7: negative from the end
        helper.make_node("GatherElements", ["xw", "index"], ["picked"], axis=2),
        helper.make_node("Transpose", ["xw"], ["columns"], perm=[0, 2, 1]),
        helper.make_node("Slice", ["index", "s_start", "s_end", "s_axes"], ["tuple_index"]),
        helper.make_node("GatherND", ["columns", "tuple_index"], ["rows"], batch_dims=1),
        helper.make_node("Slice", ["flags", "f_start", "f_end", "s_axes"], ["first"]),
        helper.make_node("Slice", ["index", "g_start", "g_end", "s_axes"], ["second"]),
        helper.make_node("Concat", ["first", "second"], ["pairs"], axis=2),
        helper.make_node("GatherND", ["columns", "pairs"], ["cells"]),
        helper.make_node("ReduceMean", ["rows"], ["row_mean"], axes=[1, 2], keepdims=1),
        helper.make_node("Add", ["picked", "row_mean"], ["partial"]),
        helper.make_node("ReduceMean", ["cells"], ["cell_mean"], axes=[0, 1, 2], keepdims=1),
        helper.make_node("Add", ["partial", "cell_mean"], ["logits"]),
    ], [B, S, L], [B, S, L], {
        "zero": np.array(0, dtype=np.float32), "one": np.array(1, dtype=np.int64),
        "axis2": np.array(2, dtype=np.int64),
        "s_start": np.array([0, 0, 0]), "s_end": np.array([2, 3, 1]), "s_axes": np.array([0, 1, 2]),
        "f_start": np.array([0, 0, 0]), "f_end": np.array([2, 3, 1]),
        "g_start": np.array([0, 0, 1]), "g_end": np.array([2, 3, 2])}, 13)

    # Slice assignment on run-time values: constant indices, data and
    # updates computed from `xw` (the last of duplicate indices wins).
    model("scatter_runtime", [
        helper.make_node("Slice", ["xw", "u_start", "u_end", "u_axes"], ["rows"]),
        helper.make_node("Mul", ["rows", "rows"], ["updates"]),
        helper.make_node("ScatterND", ["xw", "nd_index", "updates"], ["scattered"]),
        helper.make_node("Slice", ["xw", "e_start", "e_end", "u_axes"], ["column"]),
        helper.make_node("ScatterElements", ["scattered", "e_index", "column"], ["logits"], axis=2),
    ], [B, S, L], [B, S, L], {
        "u_start": np.array([0, 0, 0]), "u_end": np.array([2, 3, 8]), "u_axes": np.array([0, 1, 2]),
        "nd_index": np.array([[[0, 5], [1, 1], [0, 5]], [[1, 0], [0, 2], [1, 4]]], dtype=np.int64),
        "e_start": np.array([0, 0, 0]), "e_end": np.array([2, 6, 1]),
        "e_index": np.array([[[7], [0], [-1], [3], [3], [6]]] * 2, dtype=np.int64)}, 13)


def normalization_and_reduction():
    """GroupNormalization (per-channel affine at opset 21, per-group at 18),
    InstanceNormalization and ReduceSum, lowered at import."""
    N, C, H, W = 2, 6, 3, 4
    rng = np.random.default_rng(7)
    channel = lambda: (1.0 + 0.2 * rng.standard_normal(C)).astype(np.float32)
    model("group_norm_21", [
        helper.make_node("GroupNormalization", ["xw", "scale", "bias"], ["logits"], num_groups=3,
                         epsilon=1e-4),
    ], [N, C, H, W], [N, C, H, W], {"scale": channel(), "bias": channel()}, 21)
    model("group_norm_18", [
        helper.make_node("GroupNormalization", ["xw", "scale", "bias"], ["logits"], num_groups=2),
    ], [N, C, H, W], [N, C, H, W], {"scale": np.array([0.5, 1.5], dtype=np.float32),
                                    "bias": np.array([0.1, -0.2], dtype=np.float32)}, 18,
          check=False)
    model("instance_norm", [
        helper.make_node("InstanceNormalization", ["xw", "scale", "bias"], ["normalized"]),
        helper.make_node("ReduceSum", ["normalized", "axes"], ["summed"], keepdims=1),
        helper.make_node("Add", ["normalized", "summed"], ["logits"]),
    ], [N, C, H, W], [N, C, H, W], {"scale": channel(), "bias": channel(),
                                    "axes": np.array([2], dtype=np.int64)}, 13)
    # Weight standardization (timm's ScaledStdConv, NFNet): BatchNormalization
    # in inference form whose statistics are computed from the trained value.
    model("batch_norm_computed_statistics", [
        helper.make_node("ReduceMean", ["xw"], ["mean4"], axes=[0, 2, 3], keepdims=1),
        helper.make_node("Sub", ["xw", "mean4"], ["centred"]),
        helper.make_node("Mul", ["centred", "centred"], ["squares"]),
        helper.make_node("ReduceMean", ["squares"], ["var4"], axes=[0, 2, 3], keepdims=0),
        helper.make_node("Reshape", ["mean4", "channels"], ["mean"]),
        helper.make_node("BatchNormalization", ["xw", "scale", "bias", "mean", "var4"], ["logits"],
                         epsilon=1e-3),
    ], [N, C, H, W], [N, C, H, W], {"scale": channel(), "bias": channel(),
                                    "channels": np.array([C], dtype=np.int64)}, 15)


def resize():
    """Resize on run-time values: nearest (FPN, UNet upsampling), linear with
    align_corners, cubic, from scales and from sizes."""
    N, C, H, W = 2, 3, 4, 5
    empty = np.array([], dtype=np.float32)
    model("resize_nearest", [
        helper.make_node("Resize", ["xw", "", "scales"], ["logits"], mode="nearest"),
    ], [N, C, H, W], [N, C, 2 * H, 2 * W], {"scales": np.array([1, 1, 2, 2], dtype=np.float32)}, 13)
    model("resize_nearest_floor", [
        helper.make_node("Resize", ["xw", "", "", "sizes"], ["logits"], mode="nearest",
                         coordinate_transformation_mode="asymmetric", nearest_mode="floor"),
    ], [N, C, H, W], [N, C, 7, 3], {"sizes": np.array([N, C, 7, 3], dtype=np.int64)}, 13)
    model("resize_linear", [
        helper.make_node("Resize", ["xw", "", "", "sizes"], ["logits"], mode="linear",
                         coordinate_transformation_mode="align_corners"),
    ], [N, C, H, W], [N, C, 7, 9], {"sizes": np.array([N, C, 7, 9], dtype=np.int64)}, 13)
    model("resize_cubic", [
        helper.make_node("Resize", ["xw", "roi", "scales"], ["logits"], mode="cubic",
                         exclude_outside=1),
    ], [N, C, H, W], [N, C, 6, 7], {"roi": empty,
                                    "scales": np.array([1, 1, 1.5, 1.5], dtype=np.float32)}, 13)


def conv_transpose():
    """ConvTranspose (decoders, UNet and GAN upsampling): grouped with
    output_padding, asymmetric pads and dilation; 1-D with auto_pad; an
    output_shape that needs rows past every window (a negative end pad)."""
    rng = np.random.default_rng(11)
    weight = lambda *shape: (0.3 * rng.standard_normal(shape)).astype(np.float32)
    def torch_conv_transpose(**attributes):
        import torch  # only this oracle needs it: onnx.reference slices grouped weights wrongly
        def run(xw, inits):
            tensor = lambda name: torch.from_numpy(np.asarray(inits[name], np.float64))
            return torch.nn.functional.conv_transpose2d(
                torch.from_numpy(xw), tensor("kernel"), tensor("bias"),
                **attributes).numpy()
        return run

    model("conv_transpose_2d_group", [
        helper.make_node("ConvTranspose", ["xw", "kernel", "bias"], ["logits"], group=2,
                         strides=[2, 2], pads=[1, 0, 1, 0], output_padding=[1, 0]),
    ], [2, 4, 3, 3], [2, 6, 6, 7], {"kernel": weight(4, 3, 3, 3), "bias": weight(6)}, 11,
        oracle=torch_conv_transpose(stride=2, padding=(1, 0), output_padding=(1, 0), groups=2))
    model("conv_transpose_2d_dilated", [
        helper.make_node("ConvTranspose", ["xw", "kernel", "bias"], ["logits"],
                         strides=[2, 1], pads=[0, 1, 1, 0], output_padding=[1, 0],
                         dilations=[1, 2]),
    ], [2, 4, 3, 3], [2, 3, 7, 6], {"kernel": weight(4, 3, 3, 3), "bias": weight(3)}, 11)
    model("conv_transpose_1d_same", [
        helper.make_node("ConvTranspose", ["xw", "kernel"], ["logits"], strides=[3],
                         auto_pad="SAME_UPPER"),
    ], [2, 3, 5], [2, 2, 15], {"kernel": weight(3, 2, 4)}, 11)
    model("conv_transpose_output_shape", [
        helper.make_node("ConvTranspose", ["xw", "kernel"], ["logits"], strides=[3, 2],
                         output_shape=[10, 8]),
    ], [1, 2, 3, 3], [1, 3, 10, 8], {"kernel": weight(2, 3, 3, 3)}, 11)


def reductions_and_contractions():
    """The Reduce* family (axes as attribute and as input), LogSoftmax (both
    semantics), ArgMax/ArgMin (ties, select_last_index) and Einsum (batched,
    ellipsis, implicit output, three operands), lowered at import."""
    rng = np.random.default_rng(12)
    tensor = lambda *shape: (0.5 * rng.standard_normal(shape)).astype(np.float32)
    axes = lambda *values: np.array(values, dtype=np.int64)
    model("reduce_max_min", [
        helper.make_node("ReduceMax", ["xw", "axes13"], ["a"], keepdims=1),
        helper.make_node("ReduceMin", ["xw", "axes2"], ["b"], keepdims=1),
        helper.make_node("Add", ["xw", "a"], ["xa"]),
        helper.make_node("Add", ["xa", "b"], ["logits"]),
    ], [2, 3, 4, 5], [2, 3, 4, 5], {"axes13": axes(1, 3), "axes2": axes(-2)}, 18)
    model("reduce_norms", [
        helper.make_node("ReduceL1", ["xw"], ["l1"], axes=[3], keepdims=1),
        helper.make_node("ReduceL2", ["xw"], ["l2"], axes=[1, 2], keepdims=1),
        helper.make_node("ReduceSumSquare", ["xw"], ["ss"], axes=[3], keepdims=1),
        helper.make_node("ReduceLogSumExp", ["xw"], ["lse"], axes=[1], keepdims=1),
        helper.make_node("Exp", ["xw"], ["e"]),
        helper.make_node("ReduceLogSum", ["e"], ["ls"], axes=[3], keepdims=0),
        helper.make_node("Unsqueeze", ["ls", "last"], ["lsu"]),
        helper.make_node("Mul", ["xw", "l2"], ["y1"]),
        helper.make_node("Sum", ["y1", "l1", "ss", "lse", "lsu"], ["logits"]),
    ], [2, 3, 4, 5], [2, 3, 4, 5], {"last": axes(3)}, 13)
    model("log_softmax", [
        helper.make_node("LogSoftmax", ["xw"], ["logits"], axis=-1),
    ], [2, 3, 7], [2, 3, 7], {}, 13)
    def log_softmax_from_axis_1(xw, _):  # onnx.reference applies opset 13's axis instead
        flat = xw.reshape(xw.shape[0], -1)
        flat = flat - flat.max(axis=1, keepdims=True)
        return (flat - np.log(np.exp(flat).sum(axis=1, keepdims=True))).reshape(xw.shape)

    model("log_softmax_11", [  # opset 11: over every axis from `axis` on
        helper.make_node("LogSoftmax", ["xw"], ["logits"], axis=1),
    ], [2, 3, 4], [2, 3, 4], {}, 11, oracle=log_softmax_from_axis_1)
    model("arg_max_min", [
        helper.make_node("ArgMax", ["xw"], ["i"], axis=2, keepdims=0),
        helper.make_node("Unsqueeze", ["i", "two"], ["iu"]),
        helper.make_node("Cast", ["iu"], ["fi"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["xw", "three"], ["x3"]),
        helper.make_node("Round", ["x3"], ["r"]),  # ties, and a last index to select
        helper.make_node("ArgMin", ["r"], ["j"], axis=3, keepdims=1, select_last_index=1),
        helper.make_node("Cast", ["j"], ["fj"], to=TensorProto.FLOAT),
        helper.make_node("Sum", ["xw", "fi", "fj"], ["logits"]),
    ], [2, 3, 4, 5], [2, 3, 4, 5], {"two": axes(2), "three": np.float32(3.0)}, 13)
    model("top_k", [  # values (differentiable) and indices, largest and smallest
        helper.make_node("TopK", ["xw", "k"], ["top", "top_i"], axis=1),
        helper.make_node("TopK", ["xw", "k"], ["low", "low_i"], axis=1, largest=0),
        helper.make_node("Cast", ["top_i"], ["ti"], to=TensorProto.FLOAT),
        helper.make_node("Cast", ["low_i"], ["li"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["top", "low"], ["both"]),
        helper.make_node("Sum", ["both", "ti", "li", "low"], ["logits"]),
    ], [2, 5, 4], [2, 3, 4], {"k": axes(3)}, 13)
    model("einsum_attention", [
        helper.make_node("Einsum", ["xw", "k"], ["s"], equation="bhqd,bhkd->bhqk"),
        helper.make_node("Einsum", ["s", "v"], ["logits"], equation="bhqk,bhkd->bhqd"),
    ], [2, 2, 3, 4], [2, 2, 3, 4], {"k": tensor(2, 2, 3, 4), "v": tensor(2, 2, 3, 4)}, 12)
    model("einsum_mixed", [
        helper.make_node("Einsum", ["xw", "m1"], ["a"], equation="...ij,jk->...ik"),
        helper.make_node("Einsum", ["a", "v"], ["c"], equation="bik,k"),  # implicit: bi
        helper.make_node("Unsqueeze", ["c", "last"], ["cu"]),
        helper.make_node("Einsum", ["xw", "m1", "m2"], ["e"], equation="bij, jk, kl -> bil"),
        helper.make_node("Mul", ["a", "cu"], ["ac"]),  # (adding a per-row constant would not
        helper.make_node("Sum", ["a", "ac", "e"], ["logits"]),  # change the loss)
    ], [2, 3, 4], [2, 3, 5], {"m1": tensor(4, 5), "v": tensor(5), "m2": tensor(5, 5),
                              "last": axes(2)}, 13)
    model("einsum_diagonal", [
        helper.make_node("Einsum", ["xw"], ["d"], equation="bii->bi"),
        helper.make_node("Einsum", ["xw"], ["t"], equation="bii"),  # implicit: b, the traces
        helper.make_node("Unsqueeze", ["d", "last"], ["du"]),
        helper.make_node("Unsqueeze", ["t", "rows_cols"], ["tu"]),
        helper.make_node("Mul", ["xw", "du"], ["xd"]),
        helper.make_node("Mul", ["xw", "tu"], ["xt"]),
        helper.make_node("Add", ["xd", "xt"], ["logits"]),
    ], [2, 3, 3], [2, 3, 3], {"last": axes(2), "rows_cols": axes(1, 2)}, 13)


def padding_and_pixel_shuffles():
    """Pad in reflect, edge and wrap modes (style-transfer and GAN nets,
    TResNet), DepthToSpace in both modes (PixelShuffle) and SpaceToDepth."""
    pads = lambda *values: np.array(values, dtype=np.int64)
    model("pad_modes", [
        helper.make_node("Pad", ["xw", "p1"], ["r"], mode="reflect"),
        helper.make_node("Pad", ["xw", "p2"], ["e"], mode="edge"),
        helper.make_node("Pad", ["xw", "p3", "", "axes"], ["wr"], mode="wrap"),
        helper.make_node("Add", ["r", "e"], ["re"]),
        helper.make_node("Add", ["re", "wr"], ["logits"]),
    ], [2, 3, 4, 5], [2, 3, 7, 8], {"p1": pads(0, 0, 2, 1, 0, 0, 1, 2),
                                    "p2": pads(0, 0, 0, 3, 0, 0, 3, 0),
                                    "p3": pads(1, 2, 2, 1), "axes": pads(2, 3)}, 19)
    model("depth_to_space", [
        helper.make_node("DepthToSpace", ["xw"], ["dcr"], blocksize=2),
        helper.make_node("DepthToSpace", ["xw"], ["crd"], blocksize=2, mode="CRD"),
        helper.make_node("Mul", ["dcr", "crd"], ["both"]),
        helper.make_node("SpaceToDepth", ["both"], ["back"], blocksize=2),
        helper.make_node("Add", ["xw", "back"], ["logits"]),
    ], [2, 8, 3, 4], [2, 8, 3, 4], {}, 13)


def losses_inside():
    """NegativeLogLikelihoodLoss after LogSoftmax (PyTorch's nll_loss and the
    dynamo export of cross_entropy) with class weights and ignore_index, as the
    model's own scalar loss (mean) and per element (none)."""
    target = np.array([[0, 4, -100, 2], [3, 3, 1, -100], [2, 0, 4, 1]], dtype=np.int64)
    weight = np.array([0.5, 1.0, 2.0, 1.5, 0.25], dtype=np.float32)
    model("nll_loss_mean", [
        helper.make_node("LogSoftmax", ["xw"], ["logp"], axis=1),
        helper.make_node("NegativeLogLikelihoodLoss", ["logp", "target", "weight"], ["logits"],
                         ignore_index=-100),
    ], [3, 5, 4], [], {"target": target, "weight": weight}, 13)
    model("nll_loss_none", [
        helper.make_node("LogSoftmax", ["xw"], ["logp"], axis=1),
        helper.make_node("NegativeLogLikelihoodLoss", ["logp", "target"], ["logits"],
                         reduction="none", ignore_index=-100),
    ], [3, 5, 4], [3, 4], {"target": target}, 13)


def recurrent():
    """RNN, GRU and LSTM unrolled at import: bidirectional with peepholes,
    reverse, batch-first layout, linear_before_reset both ways, clip, given
    initial states."""
    rng = np.random.default_rng(13)
    tensor = lambda *shape: (0.4 * rng.standard_normal(shape)).astype(np.float32)
    S, B, I, H = 4, 2, 3, 5
    model("lstm_bidirectional", [
        helper.make_node("LSTM", ["xw", "W", "R", "B", "", "", "", "P"], ["logits"],
                         hidden_size=H, direction="bidirectional"),
    ], [S, B, I], [S, 2, B, H], {"W": tensor(2, 4 * H, I), "R": tensor(2, 4 * H, H),
                                 "B": tensor(2, 8 * H), "P": tensor(2, 3 * H)}, 14)
    model("lstm_clip_states", [
        helper.make_node("LSTM", ["xw", "W", "R", "B", "", "h0", "c0"], ["", "h", "c"],
                         hidden_size=H, clip=1.0, direction="reverse"),
        helper.make_node("Add", ["h", "c"], ["logits"]),
    ], [S, B, I], [1, B, H], {"W": tensor(1, 4 * H, I), "R": tensor(1, 4 * H, H),
                              "B": tensor(1, 8 * H), "h0": tensor(1, B, H), "c0": tensor(1, B, H)}, 14,
          onnxruntime=True, fd_step=1e-3)
    model("gru_batch_first", [
        helper.make_node("GRU", ["xw", "W", "R", "B", "", "h0"], ["logits"], hidden_size=H,
                         linear_before_reset=1, layout=1),
    ], [B, S, I], [B, S, 1, H], {"W": tensor(1, 3 * H, I), "R": tensor(1, 3 * H, H),
                                 "B": tensor(1, 6 * H), "h0": tensor(B, 1, H)}, 14)
    model("gru_reverse", [
        helper.make_node("GRU", ["xw", "W", "R", "B"], ["logits"], hidden_size=H,
                         direction="bidirectional"),
    ], [S, B, I], [S, 2, B, H], {"W": tensor(2, 3 * H, I), "R": tensor(2, 3 * H, H),
                                 "B": tensor(2, 6 * H)}, 14)
    model("rnn", [
        helper.make_node("RNN", ["xw", "W", "R", "B"], ["logits"], hidden_size=H),
    ], [S, B, I], [S, 1, B, H], {"W": tensor(1, H, I), "R": tensor(1, H, H),
                                 "B": tensor(1, 2 * H)}, 14)


if __name__ == "__main__":
    main()
    runtime_indexing()
    normalization_and_reduction()
    resize()
    conv_transpose()
    reductions_and_contractions()
    padding_and_pixel_shuffles()
    losses_inside()
    recurrent()
