"""test/driver/zb-interleaved.test: a deep MLP: `layers` equal Linear+ReLU blocks of width `width`, batch `batch`
(compute-heavy, small activations between stages), and a head of `classes` (default 10) classes."""
import sys
import numpy as np
import onnx
from onnx import helper, numpy_helper, TensorProto
out, layers, width, batch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
classes = int(sys.argv[5]) if len(sys.argv) > 5 else 10
rng = np.random.default_rng(0)
nodes, inits = [], []
x = "x"
for i in range(layers):
    w = numpy_helper.from_array((rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32), f"w{i}")
    inits.append(w)
    nodes.append(helper.make_node("MatMul", [x, f"w{i}"], [f"m{i}"]))
    nodes.append(helper.make_node("Relu", [f"m{i}"], [f"h{i}"]))
    x = f"h{i}"
head = numpy_helper.from_array((rng.standard_normal((width, classes)) / np.sqrt(width)).astype(np.float32), "head")
inits.append(head)
nodes.append(helper.make_node("MatMul", [x, "head"], ["logits"]))
g = helper.make_graph(nodes, "deep_mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, width])],
                      [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [batch, classes])], inits)
onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), out)
