#!/usr/bin/env python3
"""A kill during a checkpoint write leaves a usable checkpoint
(docs/checkpoint-format.md, "Atomicity"). A 2-stage job of a wide MLP
(4 x 4 MB of weights and AdamW state per checkpoint, written every
iteration) trains until every process of the run is killed with SIGKILL
(a node lost):

- five times 0 .. 1.6 s after its first checkpoint appeared (counted from
  then, not from the start, so that a slow start on a loaded machine cannot
  put the kill before any checkpoint exists), wherever that lands;
- then aimed at a write: the test watches the checkpoint folder and kills
  as soon as a stage file's temporary (iter_<k>.tmp/stage_*.bin.tmp) exists,
  retried up to AIMED_TRIES times when the write finishes before the kill
  (a fast disk can write a file between the test's look and its signal:
  timed kills alone missed every write once on a loaded CI machine).

After each kill:

1. `latest` names a complete checkpoint iter_n (its manifest and every
   stage file), whatever was being written (a leftover iter_<k>.tmp/ or
   *.tmp file shows that the kill landed in a write; at least one kill
   must have);
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
AIMED_TRIES, AIMED_WATCH_S = 8, 30  # kills aimed at a write; how long each watches for one


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


def start_and_wait(mpirun, checkpoints):
    """Starts a run that checkpoints every iteration; returns it and its
    processes (mpirun and the ranks) once `latest` exists, or with an empty
    list when none appeared within FIRST_CHECKPOINT_S."""
    run = subprocess.Popen(mpirun + ["--iters", "1000000", "--checkpoint", checkpoints, "--save-every", "1"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=pipeline_training.ENV,
                           start_new_session=True)
    first = time.monotonic() + FIRST_CHECKPOINT_S
    while not os.path.exists(os.path.join(checkpoints, "latest")) and run.poll() is None \
            and time.monotonic() < first:
        time.sleep(0.01)
    # Listed before the kill, so that the kill itself is a few system calls.
    return run, descendants(run.pid) + [run.pid] if os.path.exists(os.path.join(checkpoints, "latest")) else []


def kill_all(run, processes):
    """The ranks and mpirun at once, as a lost node."""
    for pid in processes or descendants(run.pid) + [run.pid]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    run.wait()


def stage_file_being_written(checkpoints):
    """True while a stage file of the next checkpoint is half written."""
    try:
        with os.scandir(checkpoints) as entries:
            folders = [e.path for e in entries if e.name.endswith(".tmp") and e.is_dir()]
        return any(name.endswith(".bin.tmp") for folder in folders for name in os.listdir(folder))
    except OSError:  # renamed between the two looks
        return False


def leftovers(checkpoints):
    return glob.glob(os.path.join(checkpoints, "*.tmp")) + \
        glob.glob(os.path.join(checkpoints, "*", "*.tmp*")) + glob.glob(os.path.join(checkpoints, ".*tmp*"))


def check_resume(check, mpirun, work, trial, checkpoints, when, left):
    """After a kill: `latest` names a complete checkpoint, and resuming from
    it gives the uninterrupted run's weights."""
    try:
        name = open(os.path.join(checkpoints, "latest")).read().strip()
    except OSError:
        check(False, f"kill {when}: no checkpoint named by latest")
        return
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
    where = ("during a write: " + ", ".join(sorted(os.path.basename(p) for p in left))) if left else "between writes"
    check(complete and same, f"kill {when}, at iteration {iteration} ({where}): "
          f"latest names a complete checkpoint, resumed to {iteration + 2} = uninterrupted")


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
        trial = 0
        for delay in DELAYS:
            checkpoints = os.path.join(work, f"ckpt{trial}")
            run, processes = start_and_wait(mpirun, checkpoints)
            if not processes:
                kill_all(run, processes)
                check(False, f"kill {delay} s after the first checkpoint: none within {FIRST_CHECKPOINT_S} s, "
                      f"or the run ended first (exit {run.returncode})")
                continue
            time.sleep(delay)
            kill_all(run, processes)
            left = leftovers(checkpoints)
            mid_write += bool(left)
            check_resume(check, mpirun, work, trial, checkpoints, f"{delay} s after the first checkpoint", left)
            trial += 1
        for attempt in range(AIMED_TRIES):
            checkpoints = os.path.join(work, f"ckpt{trial}")
            run, processes = start_and_wait(mpirun, checkpoints)
            watch_until = time.monotonic() + AIMED_WATCH_S
            while processes and run.poll() is None and time.monotonic() < watch_until \
                    and not stage_file_being_written(checkpoints):
                pass
            kill_all(run, processes)
            left = leftovers(checkpoints)
            if not processes or not left:
                continue  # the write finished first (or no checkpoint came): aim again
            mid_write += 1
            check_resume(check, mpirun, work, trial, checkpoints, f"aimed at a write (try {attempt + 1})", left)
            trial += 1
            break
    check(mid_write > 0, f"{mid_write} kills landed during a write ({len(DELAYS)} timed, then up to "
          f"{AIMED_TRIES} aimed)")
    return check.status()


if __name__ == "__main__":
    sys.exit(main())
