#!/usr/bin/env python3
"""The support matrix of today's exporters (docs/models.md): for every model
committed in test/models (written by test/models/export.py with a current
torch, torchvision and transformers), with its PyTorch fp64 reference loss
and gradients (<model>.npz):

1. `pipec M` imports it;
2. `pipec M --gpus 2x8` plans it;
3. the reference evaluator's loss and every gradient, computed in float64
   (pipec-reference --fp64), match PyTorch's fp64 ones: max |ours - ref| /
   max(max |ref|, 1e-3 x the largest gradient) <= 1e-4 per tensor, every
   trained torch parameter has its gradient, and every ONNX initializer pipec
   trains is one torch trains (the float32 evaluation's error is reported);
   a model with convolutions passes the same check with its convolutional
   regions stored channels-last (pipec-reference --channels-last, the
   CUDA target's pipec-channels-last);
4. `pipec M --gpus 1x2 --stages 2 --out D --build` compiles and
   `mpirun -np 2 piperun D` trains 3 steps with the same losses as the
   1-rank job of the same model (relative 1e-4).

Prints one row per model and, with --write-doc, rewrites docs/models.md from
the results (the float32 evaluation's error beside, which --fp32-error also
reports). Exits non-zero when a model of test/models/expected.txt (the rows
that passed when it was written) fails a column it passed. ctest runs one
entry per family (`--family hf-llama`: the model's name without its exporter
suffix, `family()`), so that `ctest -j` balances them (docs/build.md).

    model_matrix.py --pipec build/bin/pipec --pipec-reference build/bin/pipec-reference \
        --piperun build/bin/piperun [--write-doc] [--fp32-error] [--only NAME] [--family F]
"""
import argparse
import concurrent.futures
import datetime
import glob
import json
import os
import re
import sys
import tempfile

import numpy as np
import onnx

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
MODELS = os.path.join(ROOT, "test", "models")
sys.path.insert(0, HERE)
import pipeline_training  # noqa: E402
from pipeline_training import write_dataset  # noqa: E402

COLUMNS = ["import", "plan", "gradients", "2-stage"]
EXPLANATION = """Every failure of the gradients column is a dynamo export with the exporter's
default `optimize=True`, whose file is not the PyTorch model: the optimizer
folds BatchNorm into convolutions, merges equal-valued initializers, and
turns computations on parameters and buffers into new initializers
(`val_N`, `unsqueeze_14`: pre-transposed weights, RoPE tables, expanded
class tokens). pipec trains the file as it is and says so on import (docs/importer.md,
"Exporter artefacts"); the models exported with `optimize=False` pass. So does
every TorchScript export but two, whose files differ from the model too:
hf-bart-legacy stores BART's `final_logits_bias` buffer as an initializer like
any parameter (no file can tell them apart; `--freeze final_logits_bias` keeps it
fixed), and hf-llama-bf16-legacy stores the attention scale 1/sqrt(8) rounded to
bfloat16 (1.07e-4 relative; with that scale the reference agrees to 2.1e-7)."""
TOLERANCE = 1e-4
STEPS, MICROBATCHES = 3, 2


def family(name):
    """A model's family: its name without the exporter suffix
    (hf-llama-sdpa-dynamo-opset23 -> hf-llama-sdpa). test/CMakeLists.txt
    derives the ctest entries with the same expression."""
    return re.sub(r"-(dynamo|legacy)(-.*)?$", "", name)


def sanitize(name):
    return "".join(c if c.isalnum() or c in ".-" else "_" for c in name)


def first_error(text):
    for line in text.splitlines():
        if "error" in line:
            return line.strip()[:300]
    return (text.strip().splitlines() or ["?"])[-1][:300]


def run(command, timeout=900):
    """The command's result (mpirun's lost-rank race run again, as every
    end-to-end test does: pipeline_training.launcher_exit_race)."""
    return pipeline_training.run(command, timeout=timeout, check=False)


def reference_meta(npz):
    return json.loads(str(npz["meta"])) if "meta" in npz.files else {}


def model_inputs(npz):
    """The graph inputs stored in the .npz (every array but the references)."""
    return {k: npz[k] for k in npz.files
            if k not in ("labels", "logits", "loss", "meta") and not k.startswith("grad/")}


def has_convolutions(path):
    graph = onnx.load(path, load_external_data=False).graph
    return any(node.op_type in ("Conv", "ConvTranspose") for node in graph.node)


def check_gradients(args, path, npz, workdir, fp64=True, channels_last=False):
    out = os.path.join(workdir, "reference" + ("64" if fp64 else "32") + ("cl" if channels_last else ""))
    command = [args.pipec_reference, path, "--loss", "softmax-cross-entropy", "--output-dir", out]
    if fp64:
        command.append("--fp64")
    if channels_last:
        command.append("--channels-last")
    for name, value in dict(model_inputs(npz), labels=npz["labels"]).items():
        file = os.path.join(workdir, sanitize(name) + ".npy")
        np.save(file, value)
        command += ["--input", f"{name}={file}"]
    result = run(command)
    if result.returncode != 0:
        return False, "evaluator: " + first_error(result.stderr)
    loss = float(np.load(os.path.join(out, "loss.npy")))
    reference = {k[len("grad/"):]: npz[k] for k in npz.files if k.startswith("grad/")}
    largest = max([float(np.abs(g).max()) for g in reference.values()] + [0.0])
    worst, where = abs(loss - float(npz["loss"])) / max(abs(float(npz["loss"])), 1e-3), "loss"
    for name, expected in reference.items():
        file = os.path.join(out, f"grad_{sanitize(name)}.npy")
        if not os.path.exists(file):
            return False, f"'{name}' is trained by torch but not by pipec"
        ours = np.load(file)
        if ours.shape != expected.shape:
            return False, f"'{name}': gradient shape {ours.shape}, torch {expected.shape}"
        error = float(np.abs(ours - expected).max()) / max(float(np.abs(expected).max()),
                                                          1e-3 * largest, 1e-30)
        if not error <= worst:
            worst, where = error, name
    extra = [f[len("grad_"):-4] for f in os.listdir(out) if f.startswith("grad_")
             and f[len("grad_"):-4] not in {sanitize(n) for n in reference}]
    if extra:
        return False, f"pipec trains {len(extra)} tensor(s) torch does not: {', '.join(sorted(extra)[:3])}"
    if not worst <= TOLERANCE:
        return False, f"max error {worst:.2e} at {where}"
    return True, f"max error {worst:.1e} ({len(reference)} tensors)"


def train(args, path, data, job, ranks, flags):
    result = run([args.pipec, path, "--microbatches", str(MICROBATCHES), "--out", job,
                  "--build"] + flags)
    if result.returncode != 0:
        return None, "compile: " + first_error(result.stderr)
    result = run(["mpirun", "-np", str(ranks), "--oversubscribe", args.piperun, job,
                  "--iters", str(STEPS), "--data", data])
    if result.returncode != 0:
        return None, "piperun: " + first_error(result.stdout + result.stderr)
    losses = [float(m) for m in re.findall(r"iter \d+/\d+\s+loss (\S+)", result.stdout)]
    if len(losses) != STEPS:
        return None, "piperun printed no losses"
    return losses, None


def check_two_stages(args, path, npz, workdir, flags=()):
    """3 steps of the npz's batch on 2 stages and on 1 rank (both compiled
    with `flags` too): equal losses."""
    inputs = model_inputs(npz)
    repeat = STEPS * MICROBATCHES
    fields = {name: np.concatenate([value] * repeat) for name, value in inputs.items()}
    fields["labels"] = np.concatenate([npz["labels"]] * repeat)
    data = os.path.join(workdir, "data.bin")
    write_dataset(data, fields)
    pipelined, error = train(args, path, data, os.path.join(workdir, "two"), 2,
                             ["--gpus", "1x2", "--stages", "2", *flags])
    if error:
        return False, error
    single, error = train(args, path, data, os.path.join(workdir, "one"), 1, ["--gpus", "1x1", *flags])
    if error:
        return False, "1 rank: " + error
    worst = max(abs(a - b) / max(abs(b), 1e-6) for a, b in zip(pipelined, single))
    if not np.isfinite(pipelined).all() or worst > 1e-4:
        return False, f"2-rank losses {pipelined} differ from 1 rank's {single}"
    return True, f"losses {', '.join(f'{x:.4f}' for x in pipelined)}"


def check_model(args, path):
    name = os.path.splitext(os.path.basename(path))[0]
    npz = np.load(path[:-5] + ".npz", allow_pickle=False)
    meta = reference_meta(npz)
    row = {"model": name, "exporter": meta.get("exporter", "?"), "opset": meta.get("opset", "?")}
    with tempfile.TemporaryDirectory() as workdir:
        result = run([args.pipec, path])
        row["import"] = (result.returncode == 0, first_error(result.stderr) if result.returncode
                         else re.search(r"parameters: .*", result.stdout).group(0))
        if not row["import"][0]:
            return row
        result = run([args.pipec, path, "--gpus", "2x8"])
        row["plan"] = (result.returncode == 0, first_error(result.stderr) if result.returncode
                       else "ok")
        # In float64 (--fp64), as the reference: deep BatchNorm nets at batch 2
        # are ill-conditioned in float32; the float32 error is reported beside.
        row["gradients"] = check_gradients(args, path, npz, workdir)
        if row["gradients"][0] and has_convolutions(path):
            # The CUDA target's layout pass must not change what is computed.
            passed, detail = check_gradients(args, path, npz, workdir, channels_last=True)
            row["gradients"] = (passed, row["gradients"][1] + "; channels-last: " + detail if passed
                                else "channels-last: " + detail)
        if row["gradients"][0] and args.fp32_error:
            fp32 = check_gradients(args, path, npz, workdir, fp64=False)[1]
            row["gradients"] = (True, row["gradients"][1] + "; in float32: " +
                                fp32.replace("max error ", ""))
        row["2-stage"] = check_two_stages(args, path, npz, workdir)
    return row


def cell(row, column):
    if column not in row:
        return "-"
    return "yes" if row[column][0] else "no"


def write_doc(rows):
    lines = [
        "# Models from today's exporters",
        "",
        "Written by `test/e2e/model_matrix.py --write-doc` "
        f"({datetime.date.today().isoformat()}) from the models in test/models",
        "(test/models/README.md: how they were exported, with which versions).",
        "Columns: `pipec M` imports; `pipec M --gpus 2x8` plans; the evaluator's",
        "loss and every gradient against PyTorch's fp64 ones (max |diff| /",
        "max(|ref|, 1e-3 x the largest gradient) <= 1e-4, the same tensors trained;",
        "a model with convolutions also with its regions channels-last, as CUDA stages store them);",
        "a 2-stage job (`--gpus 1x2 --stages 2 --out --build`) trains 3 steps on",
        "2 MPI ranks with the 1-rank job's losses. A `-`: not reached.",
        "",
        "| model | exporter | opset | import | plan | gradients | 2-stage | first problem or figure |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in rows:
        note = ""
        for column in COLUMNS:
            if column in row and not row[column][0]:
                note = f"{column}: {row[column][1]}"
                break
        else:
            note = row.get("gradients", (True, ""))[1]
        note = note.replace("|", "\\|")
        lines.append(f"| {row['model']} | {row['exporter']} | {row['opset']} | " +
                     " | ".join(cell(row, c) for c in COLUMNS) + f" | {note} |")
    passed = sum(all(cell(r, c) == "yes" for c in COLUMNS) for r in rows)
    lines += ["", f"{passed} of {len(rows)} models pass every column.", "", EXPLANATION, ""]
    with open(os.path.join(ROOT, "docs", "models.md"), "w") as stream:
        stream.write("\n".join(lines))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pipec", required=True)
    parser.add_argument("--pipec-reference", required=True)
    parser.add_argument("--piperun", required=True)
    parser.add_argument("--only", action="append", help="the models whose name contains this")
    parser.add_argument("--family", action="append", help="the models of this family (family())")
    parser.add_argument("--fp32-error", action="store_true",
                        help="report the float32 evaluation's gradient error too (--write-doc does)")
    parser.add_argument("--models", default=MODELS, help="folder of .onnx and .npz files")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--write-doc", action="store_true")
    args = parser.parse_args()
    paths = sorted(p for p in glob.glob(os.path.join(args.models, "*.onnx"))
                   if os.path.exists(p[:-5] + ".npz"))
    args.fp32_error = args.fp32_error or args.write_doc
    if args.only:
        paths = [p for p in paths if any(o in os.path.basename(p) for o in args.only)]
    if args.family:
        paths = [p for p in paths if family(os.path.splitext(os.path.basename(p))[0]) in args.family]
        if not paths:
            sys.exit(f"no model of family {', '.join(args.family)} in {args.models}")
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        rows = list(pool.map(lambda p: check_model(args, p), paths))
    regressions = []
    expected_path = os.path.join(MODELS, "expected.txt")
    if os.path.exists(expected_path):
        with open(expected_path) as stream:
            for line in stream:
                if not line.strip() or line.startswith("#"):
                    continue
                model, *columns = line.split()
                row = next((r for r in rows if r["model"] == model), None)
                if row is None and (args.only or args.family):
                    continue  # not among the models asked for
                for column in columns:
                    if row is None or cell(row, column) != "yes":
                        reason = row[column][1] if row is not None and column in row else "not reached"
                        regressions.append(f"{model}: {column} ({reason})")
    # The regressions first: a log cut to its first lines still shows them.
    failed = "FAILED (passed before, per test/models/expected.txt):\n  " + "\n  ".join(regressions)
    if regressions:
        print(failed + "\n", flush=True)
    for row in rows:
        print(f"{row['model']:40} " + " ".join(f"{c}={cell(row, c):3}" for c in COLUMNS))
        for column in COLUMNS:
            if column in row:
                print(f"    {column}: {row[column][1]}")
    if args.write_doc:
        write_doc(rows)
    if regressions:
        sys.exit(failed)


if __name__ == "__main__":
    main()
