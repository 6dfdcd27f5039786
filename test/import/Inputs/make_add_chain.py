"""Writes a chain of N Add nodes, y_i = y_{i-1} + b_i, each b_i a trained
bias initializer (WIDTH floats): the large valid graph that import must handle
in linear time and memory (docs/security.md).

    make_add_chain.py OUT.onnx [--nodes N] [--width W]
"""
import argparse

import onnx
from onnx import TensorProto, helper


def make_add_chain(path, nodes=20000, width=16):
    bias = bytes(4 * width)  # zeros: the values do not matter here
    initializers, graph_nodes = [], []
    previous = "x"
    for i in range(nodes):
        name = f"b{i}"
        initializers.append(helper.make_tensor(name, TensorProto.FLOAT, [width], bias, raw=True))
        output = f"y{i}"
        graph_nodes.append(helper.make_node("Add", [previous, name], [output], name=f"add{i}"))
        previous = output
    graph = helper.make_graph(
        graph_nodes, "add_chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, width])],
        [helper.make_tensor_value_info(previous, TensorProto.FLOAT, [4, width])], initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, path)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--nodes", type=int, default=20000)
    parser.add_argument("--width", type=int, default=16)
    args = parser.parse_args()
    make_add_chain(args.out, args.nodes, args.width)
