"""Writes y = x * w with w stored as external data at LOCATION (relative to
the model's folder, or absolute). The data file is written where the location
points unless --no-data is given. --offset and --length write those fields
verbatim (any text, for hostile values); --pad puts that many bytes before
the data."""
import argparse
import os

import numpy as np
import onnx
from onnx import TensorProto, helper

parser = argparse.ArgumentParser()
parser.add_argument("model")
parser.add_argument("location")
parser.add_argument("--no-data", action="store_true")
parser.add_argument("--offset", default=None)
parser.add_argument("--length", default=None)
parser.add_argument("--pad", type=int, default=0)
args = parser.parse_args()

weights = np.arange(1, 5, dtype=np.float32)
tensor = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[4])
tensor.data_location = TensorProto.EXTERNAL
fields = [("location", args.location)]
if args.offset is not None:
    fields.append(("offset", args.offset))
fields.append(("length", str(weights.nbytes) if args.length is None else args.length))
for key, value in fields:
    entry = tensor.external_data.add()
    entry.key, entry.value = key, value
graph = helper.make_graph(
    [helper.make_node("Mul", ["x", "w"], ["y"], name="scale")], "external",
    [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
    [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])], [tensor])
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
onnx.save(model, args.model)
target = os.path.join(os.path.dirname(os.path.abspath(args.model)), args.location)
if not args.no_data:
    with open(target, "wb") as out:
        out.write(bytes(args.pad) + weights.tobytes())
