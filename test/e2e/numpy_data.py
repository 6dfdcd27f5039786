#!/usr/bin/env python3
"""NumPy arrays as data (docs/dataset-format.md, "Arrays"): examples/cnn.onnx
trains from arrays named after its inputs and labels, `piperun --data
data.npz` (np.savez and np.savez_compressed) or `--data FOLDER` of .npy
files, and pipec-data converts them to PIPECDS1:

1. 3 steps on 2 pipeline ranks from an .npz give the losses of the same
   samples written as a PIPECDS1 data set by this test (bit for bit), and
   1 rank's (relative 1e-4); a compressed archive, a folder of .npy files,
   an archive with an extra array and pipeseq give the same losses;
2. `pipec-data data.npz OUT --fields ...` writes the bytes this test's
   independent writer writes;
3. bad arrays are refused naming the file and the reason: a dtype the model
   does not take, arrays of different sample counts, Fortran order, a
   missing field, a truncated array, a file that is not an archive.

    numpy_data.py --pipec build/bin/pipec --piperun build/bin/piperun \
        --pipeseq build/bin/pipeseq --pipec-data build/bin/pipec-data
"""
import json
import os
import re
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
import pipeline_training  # noqa: E402
from pipeline_training import write_dataset  # noqa: E402

STEPS = 3
NUMPY_DTYPES = {"f32": np.float32, "f64": np.float64, "i64": np.int64, "i32": np.int32, "bool": np.bool_}


def run(command, timeout=900):
    return pipeline_training.run(command, timeout=timeout, check=False)


def losses(command):
    return pipeline_training.losses_of(command, STEPS)


def main():
    args = pipeline_training.tool_arguments(__doc__, "pipec", "piperun", "pipeseq", "pipec-data")
    check = pipeline_training.Checks()

    with tempfile.TemporaryDirectory() as work:
        jobs = pipeline_training.one_and_two_rank_jobs(args.pipec, os.path.join(ROOT, "examples", "cnn.onnx"),
                                                       work)
        plan = json.load(open(os.path.join(jobs["one"], "plan.json")))
        specs = plan["runtime"]["data"]["fields"]
        rng = np.random.default_rng(3)
        arrays = {}
        samples = 20  # not a multiple of the 2 x micro-batch samples of a step: the reads wrap
        for f in specs:
            dtype = NUMPY_DTYPES[f["dtype"]]
            shape = [samples] + f["shape"]
            if np.issubdtype(dtype, np.integer):
                arrays[f["name"]] = rng.integers(int(f.get("low", 0)), int(f.get("high", 2)), size=shape).astype(dtype)
            else:
                arrays[f["name"]] = rng.standard_normal(shape).astype(dtype)
        print("fields: " + ", ".join(f"{n} {a.dtype}{list(a.shape)}" for n, a in arrays.items()))

        reference = os.path.join(work, "reference.pipecds")
        write_dataset(reference, arrays)
        base, error = losses(["mpirun", "-np", "2", "--oversubscribe", args.piperun, jobs["two"],
                              "--iters", str(STEPS), "--data", reference])
        check(error is None, f"2 ranks train from the arrays as PIPECDS1: {base or error}")

        npz = os.path.join(work, "data.npz")
        np.savez(npz, **arrays)
        compressed = os.path.join(work, "compressed.npz")
        np.savez_compressed(compressed, **arrays)
        folder = os.path.join(work, "arrays")
        os.makedirs(folder)
        for name, array in arrays.items():
            np.save(os.path.join(folder, name + ".npy"), array)
        extra = os.path.join(work, "extra.npz")
        np.savez(extra, **arrays, meta=np.zeros(3))
        for what, path in (("an .npz archive", npz), ("a compressed .npz", compressed),
                           ("a folder of .npy files", folder), ("an archive with an extra array", extra)):
            got, error = losses(["mpirun", "-np", "2", "--oversubscribe", args.piperun, jobs["two"],
                                 "--iters", str(STEPS), "--data", path])
            check(error is None and got == base, f"{what} gives the same losses: {got or error}")
        one, error = losses(["mpirun", "-np", "1", args.piperun, jobs["one"], "--iters", str(STEPS), "--data", npz])
        check(error is None and base is not None and
              max(abs(a - b) / abs(b) for a, b in zip(one, base)) <= 1e-4, f"1 rank gives 2 ranks' losses: {one or error}")
        seq, error = losses([args.pipeseq, jobs["two"], "--iters", str(STEPS), "--data", npz])
        check(error is None and base is not None and
              max(abs(a - b) / abs(b) for a, b in zip(seq, base)) <= 1e-4, f"pipeseq reads the archive: {seq or error}")

        converted = os.path.join(work, "converted.pipecds")
        result = run([args.pipec_data, npz, converted, "--fields", ",".join(arrays)])
        check(result.returncode == 0 and open(converted, "rb").read() == open(reference, "rb").read(),
              f"pipec-data writes the reference's bytes: {result.stdout.strip() or result.stderr.strip()}")
        result = run([args.pipec_data, compressed, converted])
        check(result.returncode == 0 and f"{samples} samples" in result.stdout,
              f"pipec-data converts a compressed archive: {result.stdout.strip() or result.stderr.strip()}")

        first = specs[0]["name"]
        other = [f["name"] for f in specs if f["name"] != first]
        bad = {
            "dtype": (dict(arrays, **{first: arrays[first].astype(np.float64 if arrays[first].dtype != np.float64
                                                                  else np.float32)}),
                      r"field %s is f\d+.* per sample, stage \d+ needs" % re.escape(first)),
            "samples": (dict(arrays, **{first: arrays[first][:samples - 1]}), r"has \d+ samples, array .* \d+"),
            "fortran": (dict(arrays, **{first: np.asfortranarray(arrays[first])}), r"Fortran \(column-major\) order"),
            "missing": ({n: arrays[n] for n in other}, r"no field named %s" % re.escape(first)),
        }
        for name, (content, pattern) in bad.items():
            path = os.path.join(work, name + ".npz")
            np.savez(path, **content)
            _, error = losses(["mpirun", "-np", "1", args.piperun, jobs["one"], "--iters", "1", "--data", path])
            check(error is not None and re.search(re.escape(path) + ".*" + pattern, error) is not None,
                  f"{name}: refused naming the file: {(error or '').splitlines()[-1:]}")
        truncated = os.path.join(work, "truncated")
        os.makedirs(truncated)
        for name, array in arrays.items():
            np.save(os.path.join(truncated, name + ".npy"), array)
        victim = os.path.join(truncated, first + ".npy")
        with open(victim, "r+b") as stream:
            stream.truncate(os.path.getsize(victim) - 4)
        _, error = losses([args.piperun, jobs["one"], "--iters", "1", "--data", truncated])
        check(error is not None and re.search(re.escape(victim) + r".*need \d+ bytes of data but the file holds", error)
              is not None, f"truncated .npy: refused naming the file: {(error or '').splitlines()[-1:]}")
        fake = os.path.join(work, "fake.npz")
        with open(fake, "wb") as stream:
            stream.write(b"not a zip archive at all")
        _, error = losses([args.piperun, jobs["one"], "--iters", "1", "--data", fake])
        check(error is not None and re.search(re.escape(fake) + r": not a readable \.npz", error) is not None,
              f"not an archive: refused naming the file: {(error or '').splitlines()[-1:]}")
    return check.status()


if __name__ == "__main__":
    sys.exit(main())
