"""free_batch.py IN OUT: IN with the batch dimension (dimension 0) of its
graph inputs and outputs declared free ('batch'), its other dimensions and
every node unchanged: a model that says its batch is free while constants
inside still hold the traced one (test/driver/micro-batch-size.test)."""
import sys

import onnx

model = onnx.load(sys.argv[1])
initializers = {t.name for t in model.graph.initializer}
for value in list(model.graph.input) + list(model.graph.output):
    if value.name in initializers:
        continue
    dim = value.type.tensor_type.shape.dim[0]
    dim.ClearField("dim_value")
    dim.dim_param = "batch"
del model.graph.value_info[:]
onnx.save(model, sys.argv[2])
