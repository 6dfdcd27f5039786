#!/usr/bin/env python3
"""Validation (docs/runtime.md, "Validation"): `piperun --eval-data FILE
--eval-every K` runs the forward-only projection of every rank's stream on
held-out data in inference mode (no dropout, BatchNorm on its running
statistics) and prints the mean loss:

1. examples/gpt.onnx trains from a uint16 token file with a validation loss
   on held-out tokens every 2 of 6 steps: on 2 pipeline ranks, on 1 rank and
   in pipeseq the same 3 validation losses (relative 1e-5);
2. examples/cnn.onnx (BatchNorm, dropout) from .npz arrays: training with
   and without validation gives the same weights and BatchNorm statistics,
   bit for bit; the validation loss equals PyTorch's: the exported weights
   (safetensors) loaded into the CNN module in eval() mode, over the same
   held-out micro-batches (the last round wraps to the set's start), in
   float64 (relative 1e-5); pipeseq gives the same, and so does a 3-stage
   job from a compressed archive (its middle rank only counts the held-out
   samples); 2 replicas of the CNN (their BatchNorm statistics averaged at
   every step) give PyTorch's loss with the exported statistics; and for the GPT, 2
   replicas of one stage, a 1F1B-RR plan and ZB-V with 2 chunks per rank
   give pipeseq's validation loss;
3. --eval-every without --eval-data, and held-out arrays without the
   model's fields, are refused naming the reason and the file.

    validation.py --pipec build/bin/pipec --piperun build/bin/piperun --pipeseq build/bin/pipeseq
"""
import json
import os
import re
import sys
import tempfile

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.numpy import load_file

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "examples"))
import make_examples  # noqa: E402
import pipeline_training  # noqa: E402

PATTERN = r"validation after iter (\d+)/\d+\s+loss (\S+)"


def run(command, check=True):
    return pipeline_training.run(command, timeout=900, check=check)


def validations(output):
    return [(int(i), float(v)) for i, v in re.findall(PATTERN, output)]


def close(a, b, tolerance=1e-5):
    return len(a) == len(b) and len(a) > 0 and all(
        i == j and abs(x - y) <= tolerance * abs(y) for (i, x), (j, y) in zip(a, b))


def main():
    args = pipeline_training.tool_arguments(__doc__, "pipec", "piperun", "pipeseq")
    check = pipeline_training.Checks()

    def mpirun(ranks, job, *flags):
        return run(["mpirun", "-np", str(ranks), "--oversubscribe", args.piperun, job, *flags]).stdout

    with tempfile.TemporaryDirectory() as work:
        # 1. A language model, token files.
        jobs = pipeline_training.one_and_two_rank_jobs(args.pipec, os.path.join(ROOT, "examples", "gpt.onnx"),
                                                       os.path.join(work, "gpt"))
        rng = np.random.default_rng(6)
        train, held_out = os.path.join(work, "train.bin"), os.path.join(work, "val.bin")
        rng.integers(0, 64, size=3001).astype(np.uint16).tofile(train)
        rng.integers(0, 64, size=301).astype(np.uint16).tofile(held_out)
        flags = ["--iters", "6", "--data", train, "--data-dtype", "uint16", "--eval-data", held_out, "--eval-every", "2"]
        two = validations(mpirun(2, jobs["two"], *flags))
        one = validations(mpirun(1, jobs["one"], *flags))
        seq = validations(run([args.pipeseq, jobs["two"], *flags]).stdout)
        check([i for i, _ in two] == [2, 4, 6] and close(one, two) and close(seq, two),
              f"GPT from token files: validation every 2 steps on 2 ranks {two}, 1 rank {one}, pipeseq {seq}")

        # 2. A CNN with BatchNorm and dropout, .npz arrays.
        cnn = os.path.join(ROOT, "examples", "cnn.onnx")
        cnn_jobs = pipeline_training.one_and_two_rank_jobs(args.pipec, cnn, os.path.join(work, "cnn"))
        plan = json.load(open(os.path.join(cnn_jobs["two"], "plan.json")))
        batch, m = plan["runtime"]["microbatch_size"], plan["pipeline"]["microbatches"]
        images = rng.standard_normal((52, 3, 16, 16)).astype(np.float32)
        labels = rng.integers(0, 10, 52).astype(np.int64)
        train_npz, held_npz = os.path.join(work, "train.npz"), os.path.join(work, "val.npz")
        np.savez(train_npz, image=images[:40], labels=labels[:40])
        np.savez(held_npz, image=images[40:], labels=labels[40:])
        base = ["--iters", "4", "--data", train_npz]
        with_val, without = os.path.join(work, "with.safetensors"), os.path.join(work, "without.safetensors")
        out = mpirun(2, cnn_jobs["two"], *base, "--eval-data", held_npz, "--eval-every", "2", "--export-weights",
                     with_val)
        mpirun(2, cnn_jobs["two"], *base, "--export-weights", without)
        a, b = load_file(with_val), load_file(without)
        check(set(a) == set(b) and all(a[n].tobytes() == b[n].tobytes() for n in a),
              f"CNN: training with validation gives the weights and BatchNorm statistics of training without "
              f"({len(a)} tensors)")
        ours = validations(out)

        def torch_validation(weights, batch, m):
            """PyTorch's validation loss in eval() mode with these weights over the
            held-out micro-batches piperun takes (the last round wraps), float64."""
            module = make_examples.CNN().double()
            module.load_state_dict({n: torch.from_numpy(w.astype(np.float64) if w.dtype == np.float32 else w)
                                    for n, w in weights.items()}, strict=False)
            module.eval()
            held = 12
            rounds = -(-held // (m * batch))
            losses = []
            with torch.no_grad():
                for g in range(rounds * m):
                    index = [(g * batch + k) % held for k in range(batch)]
                    x = torch.from_numpy(images[40:][index]).double()
                    losses.append(float(F.cross_entropy(module(x), torch.from_numpy(labels[40:][index]))))
            return float(np.mean(losses)), rounds * m

        theirs, count = torch_validation(a, batch, m)
        check(len(ours) == 2 and abs(ours[-1][1] - theirs) <= 1e-5 * theirs,
              f"CNN: the last validation loss {ours[-1][1] if ours else None} is PyTorch's in eval() mode "
              f"{theirs:.6f} ({count} micro-batches of {batch})")
        # 2 replicas of the CNN: each evaluates its share of the held-out
        # micro-batches with its own BatchNorm statistics, which the replicas
        # average at every step (docs/runtime.md, "Replicas"); so the loss is
        # PyTorch's with the exported statistics (replica 0's). Replicas that
        # kept their own would give another loss.
        replicas, exported = os.path.join(work, "cnn-replicas"), os.path.join(work, "replicas.safetensors")
        run([args.pipec, cnn, "--gpus", "1x2", "--stages", "1", "--microbatches", "2", "--out", replicas, "--build"])
        rplan = json.load(open(os.path.join(replicas, "plan.json")))
        got = validations(mpirun(2, replicas, *base, "--eval-data", held_npz, "--export-weights", exported))
        theirs, count = torch_validation(load_file(exported), rplan["runtime"]["microbatch_size"],
                                         rplan["pipeline"]["microbatches"])
        check([s["replicas"] for s in rplan["stages"]] == [2] and len(got) == 1 and
              abs(got[-1][1] - theirs) <= 1e-5 * theirs,
              f"CNN, 2 replicas: the validation loss {got[-1][1] if got else None} is PyTorch's in eval() mode "
              f"{theirs:.6f} with the exported BatchNorm statistics ({count} micro-batches)")
        seq = validations(run([args.pipeseq, cnn_jobs["two"], *base, "--eval-data", held_npz,
                               "--eval-every", "2"]).stdout)
        check(close(seq, ours), f"CNN: pipeseq's validation losses {seq} are piperun's {ours}")
        # A middle stage reads no data: it opens the held-out set only to count
        # its samples, without inflating a compressed archive.
        three, compressed = os.path.join(work, "cnn-three"), os.path.join(work, "val-compressed.npz")
        np.savez_compressed(compressed, image=images[40:], labels=labels[40:])
        run([args.pipec, cnn, "--gpus", "1x3", "--stages", "3", "--microbatches", "2", "--out", three, "--build"])
        got = validations(mpirun(3, three, *base, "--eval-data", compressed, "--eval-every", "2"))
        check(close(got, ours), f"CNN, 3 stages, a compressed archive: validation losses {got} are the 2-stage job's")
        # Replicas and 1F1B-RR, on the GPT (whose replicas and weight versions
        # hold no BatchNorm statistics, which replicas update apart).
        for label, extra in (("2 replicas", ["--gpus", "1x2", "--stages", "1", "--microbatches", "2"]),
                             ("1F1B-RR", ["--gpus", "1x2", "--stages", "2", "--async", "--microbatches", "2"]),
                             ("ZB-V, 2 chunks (a chunk hands over to the next on its rank)",
                              ["--gpus", "1x2", "--stages", "2", "--schedule", "zb-v", "--chunks", "2",
                               "--microbatches", "4"])):
            job = os.path.join(work, label.split(" ")[0].replace(",", ""))
            run([args.pipec, os.path.join(ROOT, "examples", "gpt.onnx"), "--out", job, "--build", *extra])
            flags = ["--iters", "4", "--data", train, "--data-dtype", "uint16", "--eval-data", held_out,
                     "--eval-every", "2"]
            got = validations(mpirun(2, job, *flags))
            reference = validations(run([args.pipeseq, job, *flags]).stdout)
            check(close(got, reference), f"GPT, {label}: piperun's validation losses {got} are pipeseq's {reference}")

        # 3. Refusals.
        result = run(["mpirun", "-np", "1", args.piperun, cnn_jobs["one"], "--iters", "1", "--eval-every", "2"],
                     check=False)
        check(result.returncode != 0 and "--eval-every and --eval-iters validate on held-out data: give --eval-data"
              in result.stdout + result.stderr, "--eval-every without --eval-data is refused")
        wrong = os.path.join(work, "wrong.npz")
        np.savez(wrong, pixels=images[40:], labels=labels[40:])
        result = run(["mpirun", "-np", "1", args.piperun, cnn_jobs["one"], "--iters", "1", "--eval-data", wrong],
                     check=False)
        check(result.returncode != 0 and re.search(re.escape(wrong) + r": no field named image",
                                                   result.stdout + result.stderr) is not None,
              "held-out arrays without the model's fields are refused naming the file")
    return check.status()


if __name__ == "__main__":
    sys.exit(main())
