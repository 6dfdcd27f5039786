#!/usr/bin/env python3
"""Token files (docs/dataset-format.md, "Token files"): examples/gpt.onnx
trains from a flat file of uint16 (and uint32) token ids, `piperun --data
tokens.bin --data-dtype uint16`:

1. 3 steps on 2 pipeline ranks give the losses of 1 rank;
2. the windows are the documented ones: a PIPECDS1 data set written here
   from an independent implementation of the window starts
   (mix64(seed ^ mix64(i)) mod (N - T), labels shifted by one) trains to
   the same losses, bit for bit, and a uint32 file of the same ids too;
3. bad files are refused with the file and the reason: ids at or above the
   vocabulary, a size that is not whole ids, fewer tokens than a window,
   --data-dtype without --data, an unknown --data-dtype.

    token_data.py --pipec build/bin/pipec --piperun build/bin/piperun
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

M64 = (1 << 64) - 1
STEPS = 3


def mix64(x):
    """pipec/dataset.h's splitmix64 finalizer."""
    x = (x + 0x9E3779B97F4A7C15) & M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & M64
    return x ^ (x >> 31)


def run(command, timeout=900):
    """The command's result (mpirun's lost-rank race run again, as every
    end-to-end test does: pipeline_training.launcher_exit_race)."""
    return pipeline_training.run(command, timeout=timeout, check=False)


def losses(args, job, ranks, data, *flags):
    return pipeline_training.losses_of(["mpirun", "-np", str(ranks), "--oversubscribe", args.piperun, job, "--iters",
                                        str(STEPS), "--data", data, *flags], STEPS)


def main():
    args = pipeline_training.tool_arguments(__doc__, "pipec", "piperun")
    check = pipeline_training.Checks()

    with tempfile.TemporaryDirectory() as work:
        jobs = pipeline_training.one_and_two_rank_jobs(args.pipec, os.path.join(ROOT, "examples", "gpt.onnx"),
                                                       work, "--seed", "7")
        plan = json.load(open(os.path.join(jobs["one"], "plan.json")))
        fields = {f["name"]: f for f in plan["runtime"]["data"]["fields"]}
        inputs = [f for f in fields.values() if f.get("role") == "input"]
        labels = [f for f in fields.values() if f.get("role") == "label"]
        check(len(inputs) == 1 and len(labels) == 1, "plan.json's data fields have roles: " +
              ", ".join(f"{n} ({f.get('role')})" for n, f in fields.items()))
        window, vocab, seed = inputs[0]["shape"][0], int(inputs[0]["high"]), plan["runtime"]["seed"]

        ids = np.random.default_rng(5).integers(0, vocab, size=4001).astype(np.uint16)
        tokens16 = os.path.join(work, "tokens16.bin")
        ids.tofile(tokens16)
        one, error = losses(args, jobs["one"], 1, tokens16, "--data-dtype", "uint16")
        check(error is None, f"1 rank trains from a uint16 token file: {one or error}")
        two, error = losses(args, jobs["two"], 2, tokens16, "--data-dtype", "uint16")
        check(error is None and one is not None and
              max(abs(a - b) / abs(b) for a, b in zip(two, one)) <= 1e-4,
              f"2 pipeline ranks give 1 rank's losses: {two or error}")

        # The documented windows, written as an ordinary data set.
        samples = len(ids) - window
        starts = [mix64(seed ^ mix64(i)) % samples for i in range(samples)]
        data = {inputs[0]["name"]: np.stack([ids[s:s + window] for s in starts]).astype(np.int64),
                labels[0]["name"]: np.stack([ids[s + 1:s + 1 + window] for s in starts]).astype(np.int64)}
        windows = os.path.join(work, "windows.bin")
        write_dataset(windows, data)
        same, error = losses(args, jobs["one"], 1, windows)
        check(error is None and same == one, f"the documented windows as a data set give the same losses: {same or error}")
        tokens32 = os.path.join(work, "tokens32.bin")
        ids.astype(np.uint32).tofile(tokens32)
        wide, error = losses(args, jobs["one"], 1, tokens32, "--data-dtype", "uint32")
        check(error is None and wide == one, f"a uint32 file of the same ids gives the same losses: {wide or error}")

        bad = {
            "vocabulary": (np.full(100, vocab, np.uint16), "uint16", r"token \d+ is %d, not below the model's vocabulary size %d" % (vocab, vocab)),
            "odd-size": (np.zeros(101, np.uint8), "uint16", r"101 bytes is not a whole number of uint16 token ids"),
            "short": (np.zeros(window, np.uint16), "uint16", r"%d tokens, fewer than the %d" % (window, window + 1)),
        }
        for name, (content, dtype, pattern) in bad.items():
            path = os.path.join(work, name + ".bin")
            content.tofile(path)
            _, error = losses(args, jobs["one"], 1, path, "--data-dtype", dtype)
            check(error is not None and re.search(re.escape(path) + ".*" + pattern, error) is not None,
                  f"{name}: refused naming the file: {(error or '').splitlines()[-1:] }")
        result = run([args.piperun, jobs["one"], "--data-dtype", "uint16"])
        check(result.returncode != 0 and "--data-dtype names the ids of a token file" in result.stderr + result.stdout,
              "--data-dtype without --data is refused")
        result = run([args.piperun, jobs["one"], "--data", tokens16, "--data-dtype", "int8"])
        check(result.returncode != 0 and "expected uint16 or uint32" in result.stderr + result.stdout,
              "an unknown --data-dtype is refused")
    return check.status()


if __name__ == "__main__":
    sys.exit(main())
