#!/usr/bin/env python3
"""A kill during a checkpoint write leaves a usable checkpoint
(docs/checkpoint-format.md, "Atomicity"). A 2-stage job of a wide MLP
(4 x 4 MB of weights and AdamW state per checkpoint, written every
iteration, so that writing is most of a run's time) trains until every
process of the run is killed with SIGKILL (a node lost), 0 .. 1.6 s after
its first checkpoint appeared (counted from then, not from the start, so
that a slow start on a loaded machine cannot put the kill before any
checkpoint exists), five times. After each kill:

1. `latest` names a complete checkpoint iter_n (its manifest and every
   stage file), whatever was being written (a leftover iter_<k>.tmp/ or
   *.tmp file shows that the kill landed in a write; at least one of the
   five must have);
2. `--resume` from it reaches iteration n + 2 with the weights of an
   uninterrupted run of n + 2 iterations, bit for bit.

    checkpoint_kill.py --pipec build/bin/pipec --piperun build/bin/piperun
"""
import glob
import os
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "runtime", "tools"))
import pipeline_training  # noqa: E402
from export_to_onnx import read_stage_files as weights  # noqa: E402

WIDTH, LAYERS, BATCH, CLASSES = 512, 4, 8, 10
DELAYS = [0.0, 0.4, 0.8, 1.2, 1.6]  # after the first checkpoint
FIRST_CHECKPOINT_S = 120  # the most a start may take before that is a failure


def write_model(path):
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(0)
    nodes, inits, previous = [], [], "x"
    for k in range(LAYERS + 1):
        rows = CLASSES if k == LAYERS else WIDTH
        weight = (rng.standard_normal((rows, WIDTH)) / np.sqrt(WIDTH)).astype(np.float32)
        inits += [numpy_helper.from_array(weight, f"fc{k}.weight"),
                  numpy_helper.from_array(np.zeros(rows, np.float32), f"fc{k}.bias")]
        out = "logits" if k == LAYERS else f"h{k}"
        nodes.append(helper.make_node("Gemm", [previous, f"fc{k}.weight", f"fc{k}.bias"], [out], transB=1,
                                      name=f"fc{k}"))
        if k < LAYERS:
            nodes.append(helper.make_node("Relu", [out], [f"r{k}"], name=f"relu{k}"))
            out = f"r{k}"
        previous = out
    graph = helper.make_graph(nodes, "wide_mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [BATCH, WIDTH])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [BATCH, CLASSES])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)


def descendants(pid):
    """Every process below `pid` (Open MPI's mpirun puts its ranks in process
    groups of their own, so killing its group misses them)."""
    found, todo = [], [pid]
    while todo:
        parent = todo.pop()
        for task in glob.glob(f"/proc/{parent}/task/*/children"):
            try:
                children = [int(c) for c in open(task).read().split()]
            except OSError:
                continue
            found += children
            todo += children
    return found


def main():
    args = pipeline_training.tool_arguments(__doc__, "pipec", "piperun")
    check = pipeline_training.Checks()
    mid_write = 0
    with tempfile.TemporaryDirectory() as work:
        model, job = os.path.join(work, "wide.onnx"), os.path.join(work, "job")
        write_model(model)
        pipeline_training.run([args.pipec, model, "--gpus", "1x2", "--stages", "2", "--microbatches", "2",
                               "--optimizer", "adamw", "--out", job, "--build"], timeout=900)
        mpirun = ["mpirun", "-np", "2", "--oversubscribe", args.piperun, job, "--quiet"]
        for trial, delay in enumerate(DELAYS):
            checkpoints = os.path.join(work, f"ckpt{trial}")
            run = subprocess.Popen(mpirun + ["--iters", "1000000", "--checkpoint", checkpoints, "--save-every", "1"],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=pipeline_training.ENV,
                                   start_new_session=True)
            first = time.monotonic() + FIRST_CHECKPOINT_S
            while not os.path.exists(os.path.join(checkpoints, "latest")) and run.poll() is None \
                    and time.monotonic() < first:
                time.sleep(0.01)
            time.sleep(delay)
            # The ranks and mpirun at once, as a lost node.
            for pid in descendants(run.pid) + [run.pid]:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            run.wait()
            leftovers = glob.glob(os.path.join(checkpoints, "*.tmp")) + \
                glob.glob(os.path.join(checkpoints, "*", "*.tmp*")) + glob.glob(os.path.join(checkpoints, ".*tmp*"))
            mid_write += bool(leftovers)
            try:
                name = open(os.path.join(checkpoints, "latest")).read().strip()
            except OSError:
                check(False, f"kill {delay} s after the first checkpoint: no checkpoint named by latest "
                      f"(none within {FIRST_CHECKPOINT_S} s, or the run ended first: exit {run.returncode})")
                continue
            iteration = int(name.split("_")[1])
            complete = os.path.exists(os.path.join(checkpoints, name, "manifest.json")) and all(
                os.path.exists(os.path.join(checkpoints, name, f"stage_{k}.bin")) for k in range(2))
            resumed, straight = os.path.join(work, f"resumed{trial}"), os.path.join(work, f"straight{trial}")
            result = pipeline_training.run(mpirun + ["--iters", str(iteration + 2), "--resume", checkpoints,
                                                     "--export-weights", resumed], check=False)
            pipeline_training.run(mpirun + ["--iters", str(iteration + 2), "--export-weights", straight])
            if result.returncode != 0:
                print(result.stdout[-1500:] + result.stderr[-1500:])
            ours, theirs = weights(resumed), weights(straight) if result.returncode == 0 else ({}, {})
            same = result.returncode == 0 and set(ours) == set(theirs) and all(
                np.array_equal(ours[n], theirs[n]) for n in theirs)
            if result.returncode == 0 and not same:
                print("differ: " + ", ".join(n for n in theirs if not np.array_equal(ours.get(n), theirs[n])))
            check(complete and same, f"kill {delay} s after the first checkpoint, at iteration {iteration} "
                  f"({'during a write: ' + ', '.join(sorted(os.path.basename(p) for p in leftovers)) if leftovers else 'between writes'}): "
                  f"latest names a complete checkpoint, resumed to {iteration + 2} = uninterrupted")
    check(mid_write > 0, f"{mid_write} of {len(DELAYS)} kills landed during a write")
    return check.status()


if __name__ == "__main__":
    sys.exit(main())
