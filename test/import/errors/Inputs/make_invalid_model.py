"""Writes a small ONNX model that is well formed except for one flaw strict
validation must refuse (or, for kinds starting with `ok_`, must accept).
Used by the lit tests beside this folder and by test/security/cases_validate.py.

    make_invalid_model.py KIND OUT.onnx        (--list prints the kinds)

The ONNX checker is never run: most of these models are exactly what it would
refuse, and pipec must refuse them itself."""
import sys

import numpy as np
from onnx import TensorProto, helper, numpy_helper

F = TensorProto.FLOAT


def _linear(x_shape=(2, 8), out_shape=(2, 4), node_name="fc", x="x", h="h", w="w",
            extra_nodes=(), attributes=None, graph_name="linear", y_type=F, extra_inits=(),
            extra_inputs=()):
    """y = Relu(Gemm(x, w^T)): a trainable linear layer."""
    weights = numpy_helper.from_array(np.ones((out_shape[1], x_shape[1]), np.float32), w)
    nodes = [helper.make_node("Gemm", [x, w], [h], name=node_name, transB=1, **(attributes or {})),
             helper.make_node("Relu", [h], ["y"], name="act"), *extra_nodes]
    graph = helper.make_graph(
        nodes, graph_name,
        [helper.make_tensor_value_info(x, F, list(x_shape)), *extra_inputs],
        [helper.make_tensor_value_info("y", y_type, list(out_shape))],
        [weights, *extra_inits])
    return graph


def _model(graph, opset=13):
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _softmax(**attributes):
    node = helper.make_node("Softmax", ["x"], ["y"], name="probs")
    for name, (kind, value) in attributes.items():
        attribute = node.attribute.add()
        attribute.name = name
        attribute.type = kind
        if value is not None and kind == 2:
            attribute.i = value
        elif value is not None and kind == 1:
            attribute.f = value
    return _model(helper.make_graph(
        [node], "softmax", [helper.make_tensor_value_info("x", F, [2, 4])],
        [helper.make_tensor_value_info("y", F, [2, 4])]))


def _empty(name, dims, kind=F):
    """An initializer or attribute tensor with dims but no data (a hostile
    model does not need to carry the bytes)."""
    return TensorProto(name=name, data_type=kind, dims=list(dims))


def build(kind):
    INT, FLOAT_ATTR, UNDEFINED = 2, 1, 0
    if kind == "ok_plain":
        return _model(_linear())
    if kind == "ok_control_names":
        # Quotes, backslashes, newlines, comment and preprocessor text: legal
        # names that generated code must escape.
        return _model(_linear(node_name='fc"\n\\*/ #include <x>\t', h='h"\n\\ \x01\x7f',
                              graph_name="line\nbreak"))
    if kind == "ok_initializer_as_input":
        # Older exporters list initializers as graph inputs of the same type.
        graph = _linear(extra_inputs=[helper.make_tensor_value_info("w", F, [4, 8])])
        return _model(graph)
    if kind == "nul_node_name":
        return _model(_linear(node_name="fc\0evil"))
    if kind == "nul_value_name":
        return _model(_linear(h="h\0idden"))
    if kind == "nul_initializer_name":
        return _model(_linear(w="w\0eights"))
    if kind == "nul_graph_name":
        return _model(_linear(graph_name="lin\0ear"))
    if kind == "duplicate_output":
        graph = _linear(extra_nodes=[helper.make_node("Neg", ["x"], ["h"], name="again")])
        return _model(graph)
    if kind == "duplicate_node_outputs":
        graph = _linear(extra_nodes=[helper.make_node("Split", ["x"], ["s", "s"], name="split", axis=0)])
        return _model(graph)
    if kind == "duplicate_initializer":
        graph = _linear(extra_inits=[numpy_helper.from_array(np.zeros((4, 8), np.float32), "w")])
        return _model(graph)
    if kind == "initializer_input_clash":
        graph = _linear(extra_inputs=[helper.make_tensor_value_info("w", F, [8, 4])])
        return _model(graph)
    if kind == "redefined_input":
        graph = _linear(extra_nodes=[helper.make_node("Identity", ["h"], ["x"], name="overwrite")])
        return _model(graph)
    if kind == "duplicate_graph_output":
        graph = _linear()
        graph.output.append(graph.output[0])
        return _model(graph)
    if kind == "misspelt_attribute":
        return _softmax(axsi=(INT, 0))
    if kind == "wrong_attribute_type":
        return _softmax(axis=(FLOAT_ATTR, 0.0))
    if kind == "attribute_without_value":
        return _softmax(axis=(INT, None))
    if kind == "attribute_without_type":
        return _softmax(axis=(UNDEFINED, None))
    if kind == "output_shape_mismatch":
        # Only the declaration changes: the weights still give [2, 4].
        graph = _linear()
        graph.output[0].type.tensor_type.shape.dim[1].dim_value = 5
        return _model(graph)
    if kind == "output_type_mismatch":
        return _model(_linear(y_type=TensorProto.INT64))
    if kind == "value_info_mismatch":
        model = _model(_linear())
        model.graph.value_info.append(helper.make_tensor_value_info("h", F, [2, 7]))
        return model
    if kind == "negative_input_dim":
        graph = _linear()
        graph.input[0].type.tensor_type.shape.dim[1].dim_value = -5
        return _model(graph)
    if kind == "negative_initializer_dim":
        graph = _linear()
        graph.initializer[0].CopyFrom(_empty("w", (-4, 8)))
        return _model(graph)
    if kind == "huge_initializer":
        graph = _linear()
        graph.initializer[0].CopyFrom(_empty("w", (1 << 31, 1 << 31)))
        return _model(graph)
    if kind == "huge_constant":
        constant = helper.make_node("Constant", [], ["c"], name="const",
                                    value=_empty("value", (1 << 20, 1 << 20, 1 << 20)))
        return _model(_linear(extra_nodes=[constant]))
    if kind == "batch_2_62":
        return _model(_linear(x_shape=(1 << 62, 8), out_shape=(1 << 62, 4)))
    raise SystemExit(f"unknown kind {kind!r}; kinds: {' '.join(KINDS)}")


KINDS = ["ok_plain", "ok_control_names", "ok_initializer_as_input", "nul_node_name",
         "nul_value_name", "nul_initializer_name", "nul_graph_name", "duplicate_output",
         "duplicate_node_outputs", "duplicate_initializer", "initializer_input_clash",
         "redefined_input", "duplicate_graph_output", "misspelt_attribute",
         "wrong_attribute_type", "attribute_without_value", "attribute_without_type",
         "output_shape_mismatch", "output_type_mismatch", "value_info_mismatch",
         "negative_input_dim", "negative_initializer_dim", "huge_initializer", "huge_constant",
         "batch_2_62"]


def write(kind, path):
    with open(path, "wb") as out:
        out.write(build(kind).SerializeToString())


if __name__ == "__main__":
    if sys.argv[1:] == ["--list"]:
        print("\n".join(KINDS))
    elif len(sys.argv) == 3:
        write(sys.argv[1], sys.argv[2])
    else:
        raise SystemExit(__doc__)
