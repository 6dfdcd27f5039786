#!/usr/bin/env python3
"""synthetic_weights.py strip|fill JOB: the speed jobs' initial weights
(100-550 MB) do not travel to the GPU machine. `strip` replaces each
JOB/weights/*.bin (docs/weights-format.md) by a JSON list of its tensors'
names, dtypes and shapes; `fill` writes the files back with seeded values:
rank >= 2 tensors N(0, 1/fan-in), rank-1 ones (zeros where the name says
bias, mean or beta), integers 0. Only for timing: the values are not the
model's."""
import json
import os
import struct
import sys

import numpy as np

DTYPES = {1: "<f4", 2: "<f8", 3: "<i8", 4: "<i4", 5: "u1"}  # pipec_dtype


def read_header(path):
    tensors = []
    with open(path, "rb") as f:
        if f.read(8) != b"PIPECTS1":
            raise SystemExit(f"{path}: not a pipec.tensors/1 file")
        (count,) = struct.unpack("<Q", f.read(8))
        for _ in range(count):
            (length,) = struct.unpack("<I", f.read(4))
            name = f.read(length).decode()
            dtype, rank = struct.unpack("<II", f.read(8))
            dims = list(struct.unpack(f"<{rank}q", f.read(8 * rank)))
            (nbytes,) = struct.unpack("<Q", f.read(8))
            f.seek(nbytes, 1)
            tensors.append((name, dtype, dims))
    return tensors


def strip(job):
    for name in os.listdir(os.path.join(job, "weights")):
        path = os.path.join(job, "weights", name)
        if name.endswith(".bin"):
            with open(path + ".json", "w") as f:
                json.dump(read_header(path), f)
            os.remove(path)


def values(rng, name, dtype, dims):
    n = int(np.prod(dims)) if dims else 1
    if dtype not in (1, 2):
        return np.zeros(n)
    if len(dims) >= 2:
        return rng.standard_normal(n, dtype=np.float32) / np.sqrt(int(np.prod(dims[1:])))
    lower = name.lower()
    return np.zeros(n) if any(k in lower for k in ("bias", "mean", "beta")) else np.ones(n)


def fill(job):
    rng = np.random.default_rng(0)
    for name in sorted(os.listdir(os.path.join(job, "weights"))):
        if not name.endswith(".bin.json"):
            continue
        with open(os.path.join(job, "weights", name)) as f:
            tensors = json.load(f)
        with open(os.path.join(job, "weights", name[:-len(".json")]), "wb") as out:
            out.write(b"PIPECTS1" + struct.pack("<Q", len(tensors)))
            for tensor, dtype, dims in tensors:
                data = values(rng, tensor, dtype, dims).astype(DTYPES[dtype]).tobytes()
                encoded = tensor.encode()
                out.write(struct.pack("<I", len(encoded)) + encoded + struct.pack("<II", dtype, len(dims)))
                out.write(struct.pack(f"<{len(dims)}q", *dims) + struct.pack("<Q", len(data)) + data)


if __name__ == "__main__":
    {"strip": strip, "fill": fill}[sys.argv[1]](sys.argv[2])
