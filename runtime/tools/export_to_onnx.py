#!/usr/bin/env python3
"""Write trained weights back into an ONNX model's initializers.

    piperun OUT --iters N --export-weights trained/      # one stage_<k>.bin per stage
    python3 runtime/tools/export_to_onnx.py model.onnx trained/ model-trained.onnx
    piperun OUT --iters N --export-weights trained.safetensors
    python3 runtime/tools/export_to_onnx.py model.onnx trained.safetensors model-trained.onnx

A model whose initializers pass 1.5 GiB is written with external data
(model-trained.onnx.data beside it): protobuf refuses messages over 2 GiB.

Every tensor in the stage files (docs/weights-format.md) is named after the
ONNX initializer it came from; its shape and dtype must match. Initializers
that no stage file names (e.g. constants folded at import) are kept as they
are. Exit status 1, with the tensor and the reason, on any mismatch.
"""
import glob
import json
import os
import struct
import sys

import numpy as np

MAGIC = b"PIPECTS1"
DTYPES = {1: np.float32, 2: np.float64, 3: np.int64, 4: np.int32, 5: np.bool_}


def read_tensor_file(path):
    """Parses a pipec.tensors/1 file into {name: ndarray}."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:8] != MAGIC:
        raise ValueError(f"{path}: not a pipec tensor file (bad magic)")
    (count,) = struct.unpack_from("<Q", data, 8)
    off, out = 16, {}
    for _ in range(count):
        (n,) = struct.unpack_from("<I", data, off)
        off += 4
        name = data[off:off + n].decode()
        off += n
        dtype, rank = struct.unpack_from("<II", data, off)
        off += 8
        shape = struct.unpack_from(f"<{rank}q", data, off)
        off += 8 * rank
        (nbytes,) = struct.unpack_from("<Q", data, off)
        off += 8
        if dtype not in DTYPES:
            raise ValueError(f"{path}: tensor {name}: unknown dtype {dtype}")
        arr = np.frombuffer(data, DTYPES[dtype], count=int(np.prod(shape, dtype=np.int64)), offset=off)
        out[name] = arr.reshape(shape).copy()
        off += nbytes
    if off != len(data):
        raise ValueError(f"{path}: {len(data) - off} trailing bytes")
    return out


def read_stage_files(folder):
    """Every DIR/stage_<k>.bin of `piperun --export-weights DIR` as one
    {name: ndarray} (a tied parameter's copies are equal; the last is kept)."""
    out = {}
    for path in sorted(glob.glob(os.path.join(folder, "stage_*.bin"))):
        out.update(read_tensor_file(path))
    return out


SAFETENSORS_DTYPES = {"F32": np.float32, "F64": np.float64, "I64": np.int64, "I32": np.int32, "BOOL": np.bool_}
EXTERNAL_DATA_BYTES = 3 << 29  # 1.5 GiB


def read_safetensors(path):
    """Parses a safetensors file (docs/weights-format.md) into {name: ndarray}."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        raise ValueError(f"{path}: not a safetensors file (shorter than its header length)")
    (length,) = struct.unpack_from("<Q", data, 0)
    if length > len(data) - 8:
        raise ValueError(f"{path}: header length {length} runs past the end of the file")
    header = json.loads(data[8:8 + length])
    start, out = 8 + length, {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        if entry["dtype"] not in SAFETENSORS_DTYPES:
            raise ValueError(f"{path}: tensor {name}: dtype {entry['dtype']} is not one pipec writes")
        begin, end = entry["data_offsets"]
        dtype = np.dtype(SAFETENSORS_DTYPES[entry["dtype"]])
        shape = entry["shape"]
        if not 0 <= begin <= end <= len(data) - start or end - begin != int(np.prod(shape)) * dtype.itemsize:
            raise ValueError(f"{path}: tensor {name}: offsets {begin}..{end} do not hold {entry['dtype']}{shape}")
        out[name] = np.frombuffer(data, dtype, count=int(np.prod(shape)), offset=start + begin).reshape(shape).copy()
    return out


def main(argv):
    if len(argv) != 4:
        print(__doc__, file=sys.stderr)
        return 2
    import onnx
    from onnx import numpy_helper

    model_path, weights_dir, out_path = argv[1:]
    weights = {}
    files = [] if weights_dir.endswith(".safetensors") else sorted(glob.glob(os.path.join(weights_dir, "stage_*.bin")))
    if weights_dir.endswith(".safetensors"):
        weights = read_safetensors(weights_dir)
    elif not files:
        print(f"export_to_onnx: {weights_dir}: no stage_*.bin files", file=sys.stderr)
        return 1
    for path in files:
        for name, arr in read_tensor_file(path).items():
            if name in weights:
                # Tied weights appear in several stages; all copies must agree.
                if not np.array_equal(weights[name], arr):
                    print(f"export_to_onnx: {name} differs between stages ({path})", file=sys.stderr)
                    return 1
            weights[name] = arr
    model = onnx.load(model_path)
    found = set()
    for init in model.graph.initializer:
        if init.name not in weights:
            continue
        old = numpy_helper.to_array(init)
        new = weights[init.name]
        if old.shape != new.shape or old.dtype != new.dtype:
            print(f"export_to_onnx: {init.name}: model has {old.dtype}{list(old.shape)}, "
                  f"weights have {new.dtype}{list(new.shape)}", file=sys.stderr)
            return 1
        init.CopyFrom(numpy_helper.from_array(new, init.name))
        found.add(init.name)
    missing = sorted(set(weights) - found)
    if missing:
        print(f"export_to_onnx: not initializers of {model_path}: {', '.join(missing)}", file=sys.stderr)
        return 1
    external = sum(init.ByteSize() for init in model.graph.initializer) > EXTERNAL_DATA_BYTES
    if external:
        onnx.save(model, out_path, save_as_external_data=True, all_tensors_to_one_file=True,
                  location=os.path.basename(out_path) + ".data", size_threshold=1024)
    else:
        onnx.save(model, out_path)
    print(f"export_to_onnx: wrote {out_path} ({len(found)} initializers updated"
          + (f"; their data in {out_path}.data" if external else "") + ")")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
