#!/usr/bin/env python3
"""Weights out as safetensors (docs/weights-format.md, "safetensors"): for
the MLP, the CNN (BatchNorm buffers) and the GPT (an output head tied to the
embedding, held by both stages), exported without dropout:

1. `piperun JOB --export-weights W.safetensors` after 3 steps on 2 pipeline
   ranks writes one file that safetensors' own loader reads, holding each
   ONNX initializer the stages train or update once, bit for bit the tensors
   of `--export-weights DIR` (the per-stage files) of the same run, and
   pipeseq's file holds the same weights (relative 1e-5);
2. the file loads into the PyTorch module the ONNX was exported from
   (load_state_dict: no unexpected key, every parameter present; only
   buffers the ONNX holds as constants missing), and that module's loss on a
   batch equals the loss pipec-reference computes on the ONNX model with the
   trained initializers written back (runtime/tools/export_to_onnx.py), both
   in float64 (relative 1e-6: pipec-reference writes the loss in the model's
   float32), while the untrained model's loss is another (relative > 1e-4);
   export_to_onnx.py writes the same ONNX model from the file as from the
   stage files, and onnxruntime's logits on that model are PyTorch's
   (relative 1e-5).

    safetensors_export.py --pipec build/bin/pipec --piperun build/bin/piperun \
        --pipeseq build/bin/pipeseq --pipec-reference build/bin/pipec-reference
"""
import json
import os
import sys
import tempfile

import numpy as np
import onnxruntime
import torch
import torch.nn.functional as F
from safetensors.numpy import load_file

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "runtime", "tools"))
import pipeline_training  # noqa: E402
from pipeline_training import write_dataset  # noqa: E402
from export_to_onnx import read_stage_files  # noqa: E402

STEPS = 3


def run(command):
    result = pipeline_training.run(command, timeout=900, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}")
    return result


def main():
    args = pipeline_training.tool_arguments(__doc__, "pipec", "piperun", "pipeseq", "pipec-reference")
    check = pipeline_training.Checks()

    for example in ("mlp", "cnn", "gpt"):
        with tempfile.TemporaryDirectory() as work:
            model, sample, input_name, path = pipeline_training.export(example, work, dropout=False)
            job = os.path.join(work, "job")
            run([args.pipec, path, "--gpus", "1x2", "--stages", "2", "--microbatches", "2", "--out", job, "--build"])
            plan = json.load(open(os.path.join(job, "plan.json")))
            label = next(f for f in plan["runtime"]["data"]["fields"] if f.get("role") == "label")
            rng = np.random.default_rng(4)
            count = 2 * STEPS * sample.shape[0]
            if sample.dtype == torch.int64:
                inputs = rng.integers(0, 64, size=(count,) + tuple(sample.shape[1:])).astype(np.int64)
            else:
                inputs = rng.standard_normal((count,) + tuple(sample.shape[1:])).astype(np.float32)
            labels = rng.integers(0, int(label["high"]), size=(count,) + tuple(label["shape"])).astype(np.int64)
            data = os.path.join(work, "data.bin")
            write_dataset(data, {input_name: inputs, label["name"]: labels})

            mpirun = ["mpirun", "-np", "2", "--oversubscribe", args.piperun, job, "--iters", str(STEPS), "--data", data,
                      "--quiet", "--export-weights"]
            single = os.path.join(work, "out", "trained.safetensors")
            run(mpirun + [single])
            folder = os.path.join(work, "stages")
            run(mpirun + [folder])
            sequential = os.path.join(work, "pipeseq.safetensors")
            run([args.pipeseq, job, "--iters", str(STEPS), "--data", data, "--export-weights", sequential])

            weights = load_file(single)
            staged = read_stage_files(folder)
            same = set(weights) == set(staged) and all(
                weights[n].dtype == staged[n].dtype and weights[n].shape == staged[n].shape and
                weights[n].tobytes() == staged[n].tobytes() for n in staged)
            check(same and not os.path.exists(single + ".parts"),
                  f"{example}: one file of {len(weights)} tensors, the stage files' bit for bit")
            theirs = load_file(sequential)
            worst = max(float(np.abs(theirs[n].astype(np.float64) - w).max() / max(np.abs(w).max(), 1e-12))
                        for n, w in weights.items()) if set(theirs) == set(weights) else float("inf")
            check(worst <= 1e-5, f"{example}: pipeseq's file holds the same weights (max relative {worst:.1e})")

            module = model.double()
            result = module.load_state_dict({n: torch.from_numpy(w.astype(np.float64) if w.dtype == np.float32
                                                                  else w) for n, w in weights.items()},
                                            strict=False)
            parameters = {n for n, _ in module.named_parameters()}
            missing = set(result.missing_keys)
            check(not result.unexpected_keys and not (missing & parameters),
                  f"{example}: loads into the PyTorch module (unexpected {result.unexpected_keys}, "
                  f"missing {sorted(missing)}: buffers only)")

            trained = os.path.join(work, "trained.onnx")
            exporter = os.path.join(ROOT, "runtime", "tools", "export_to_onnx.py")
            run([sys.executable, exporter, path, folder, trained])
            from_file = os.path.join(work, "from-safetensors.onnx")
            run([sys.executable, exporter, path, single, from_file])
            check(open(from_file, "rb").read() == open(trained, "rb").read(),
                  f"{example}: export_to_onnx.py writes the same model from the file as from the stage files")
            batch = sample.shape[0]
            np.save(os.path.join(work, "x.npy"), inputs[:batch])
            np.save(os.path.join(work, "y.npy"), labels[:batch])

            def reference_loss(onnx_path, out):
                run([args.pipec_reference, onnx_path, "--fp64", "--loss", "softmax-cross-entropy", "--output-dir",
                     out, "--input", f"{input_name}={os.path.join(work, 'x.npy')}",
                     "--input", f"{label['name']}={os.path.join(work, 'y.npy')}"])
                return float(np.load(os.path.join(out, "loss.npy")))
            ours = reference_loss(trained, os.path.join(work, "reference"))
            untrained = reference_loss(path, os.path.join(work, "untrained"))
            module.train()
            with torch.no_grad():
                x = torch.from_numpy(inputs[:batch])
                logits = module(x.double() if x.dtype == torch.float32 else x)
                theirs_loss = float(F.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                    torch.from_numpy(labels[:batch]).reshape(-1)))
            error = abs(ours - theirs_loss) / abs(theirs_loss)
            moved = abs(untrained - theirs_loss) / abs(theirs_loss)
            check(error <= 1e-6 and moved > 1e-4,
                  f"{example}: PyTorch's loss with the file's weights {theirs_loss:.9f} equals pipec-reference's "
                  f"on the trained ONNX {ours:.9f} (relative {error:.1e}; untrained {untrained:.9f})")
            # The ONNX model with the trained initializers, run by onnxruntime:
            # PyTorch's logits with the file's weights.
            session = onnxruntime.InferenceSession(from_file, providers=["CPUExecutionProvider"])
            feed_name = session.get_inputs()[0].name
            runtime_logits = session.run(None, {feed_name: inputs[:batch]})[0]
            difference = float(np.abs(runtime_logits - logits.numpy()).max() / np.abs(logits.numpy()).max())
            check(difference <= 1e-5, f"{example}: onnxruntime's logits on the exported ONNX model are PyTorch's "
                                      f"with the file's weights (max relative {difference:.1e})")
    return check.status()


if __name__ == "__main__":
    sys.exit(main())
