"""Writes a model whose initializers are bfloat16, float16 and float64 and
whose arithmetic casts between them (test/import/half_precision.test; the
ONNX text parser of Debian's onnx cannot spell those literals).

    make_half_precision_model.py OUT.onnx
"""
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def bfloat16_tensor(name, values):
    bits = (np.asarray(values, dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16)
    return helper.make_tensor(name, TensorProto.BFLOAT16, list(np.shape(values)), bits.tobytes(),
                              raw=True)


def main(path):
    initializers = [
        bfloat16_tensor("w", np.arange(1, 13, dtype=np.float32).reshape(4, 3) / 8),
        numpy_helper.from_array(np.array([0.5, 0.25, 0.125], dtype=np.float16), "b"),
        numpy_helper.from_array(np.array([1.0, 2.0, 3.0], dtype=np.float64), "s"),
    ]
    nodes = [
        helper.make_node("Cast", ["w"], ["w16"], to=TensorProto.FLOAT16),
        helper.make_node("MatMul", ["x", "w16"], ["xw"]),
        helper.make_node("Add", ["xw", "b"], ["sum"]),
        helper.make_node("Cast", ["sum"], ["widened"], to=TensorProto.DOUBLE),
        helper.make_node("Mul", ["widened", "s"], ["scaled"]),
        helper.make_node("Cast", ["scaled"], ["y"], to=TensorProto.FLOAT16),
    ]
    graph = helper.make_graph(nodes, "half", [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [2, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [2, 3])], initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, path)


if __name__ == "__main__":
    main(sys.argv[1])
