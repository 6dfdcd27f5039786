"""Checks the initial weights a job holds against the model's initializers
(test/import/half_precision.test): every parameter's tensor is float32 and
bit-equal to the initializer rounded to float32, whatever the file's dtype.
Prints one line per parameter: NAME f32 SHAPE exact | differs.

    check_job_weights.py MODEL.onnx JOB_DIR
"""
import glob
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "runtime", "tools"))
from export_to_onnx import read_tensor_file  # noqa: E402


def as_float32(tensor):
    if tensor.data_type == TensorProto.BFLOAT16:
        raw = tensor.raw_data if tensor.raw_data else np.array(tensor.int32_data, dtype=np.uint16).tobytes()
        bits = np.frombuffer(raw, dtype=np.uint16).astype(np.uint32) << 16
        return bits.view(np.float32).reshape(tuple(tensor.dims))
    return numpy_helper.to_array(tensor).astype(np.float32)


def main(model_path, job):
    model = onnx.load(model_path)
    expected = {t.name: as_float32(t) for t in model.graph.initializer}
    stored = {}
    for path in sorted(glob.glob(os.path.join(job, "weights", "*.bin"))):
        stored.update(read_tensor_file(path))
    for name in sorted(expected):
        if name not in stored:
            print(f"{name} missing")
            continue
        value = stored[name]
        same = value.dtype == np.float32 and value.shape == expected[name].shape and \
            np.array_equal(value.view(np.uint32), expected[name].view(np.uint32))
        print(f"{name} {'f32' if value.dtype == np.float32 else value.dtype} {list(value.shape)} "
              f"{'exact' if same else 'differs'}")


if __name__ == "__main__":
    main(*sys.argv[1:])
