#!/usr/bin/env python3
"""fit_preset.py RESULTS_JSON MODELS_DIR [--pipec PIPEC] [--device NAME]
[--convolutional NAME=MS:PROFILE ... [--precision P]]: the
cost model's prediction of an iteration against a GPU run of the table
(docs/cost-model.md, "Against the card"), and the efficiencies that would fit.

For each pipec row of RESULTS_JSON (report.py's results.json: model, micro-batch
size, median ms per iteration of 2 micro-batches), the job is planned again as
prepare.sh compiles it (bf16, AdamW, one GPU, --device NAME) and its cost table
split into tensor-core time (matrix products and the attention the -O2 costing
charges to a MatMul), memory-bound time and launches (the table with
--launch-overhead 0 against the default). It prints the plan's predicted
iteration against the measured one, then the factors on the preset's
efficiencies (its fractions of the tensor-core peak and of the bandwidth,
analysis/Partition/Topology.cpp) that make the largest relative error smallest,
and the errors they leave. The issue's criterion is every GPT-2 cell within 15%.

--convolutional NAME=MS:PROFILE ... instead fits the presets' convolution and
batch-norm efficiencies (docs/cost-model.md): for each convolutional network
(MODELS_DIR/NAME.onnx, planned as prepare.sh's extra bundle compiles it: 2
micro-batches, --precision PRECISION) its measured ms per iteration and its
op profile (on_gpu.sh's profile-*.json) give, per class (convolutions, batch
norms), the profiled time (scaled to the iteration) against the cost table's,
the factors on the two efficiencies they imply, and the predicted iterations
after them; RESULTS_JSON is not read then.

Needs the models the run measured (export_models.py) and this checkout's pipec."""
import argparse
import csv
import json
import math
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MATRIX_TYPES = {"nn.gemm", "nn.matmul", "nn.batched_gemm", "nn.conv"}
LAUNCH_S = 4e-6  # pipec's default --launch-overhead (analysis/Settings/Declared.h)


def seconds(row):
    """An op's three times, summed (a cost-table row, docs/cost-table.md, or a profile's op)."""
    return float(row["fwd_s"]) + float(row["bwd_input_s"]) + float(row["bwd_weight_s"])


def cost_tables(pipec, model, options, work):
    """The job planned on one GPU with `options`: its cost table without launches (--launch-overhead 0) and
    with pipec's default, each {op name: row}, and the default plan's predicted iteration (s)."""
    tables = {}
    for overhead in (0.0, LAUNCH_S):
        path = os.path.join(work, f"{os.path.basename(model)}-{overhead}.csv")
        args = [pipec, model, "--gpus", "1x1", "--target", "cuda", *options, "--launch-overhead", repr(overhead),
                "--dump-costs", path, "--json"]
        result = subprocess.run(args, capture_output=True, text=True)
        if result.returncode != 0:
            sys.exit(f"FAILED: {' '.join(args)}\n{result.stderr[-2000:]}")
        with open(path) as f:
            tables[overhead] = {row["name"]: row for row in csv.DictReader(f)}
    return tables[0.0], tables[LAUNCH_S], json.loads(result.stdout)["time_per_minibatch_s"]


def split_costs(pipec, model, batch, microbatches, device, work):
    """(tensor-core s, memory-bound s, launches) of one micro-batch, and the plan's predicted iteration s."""
    bare, launched, predicted = cost_tables(
        pipec, model, ["--micro-batch-size", str(batch), "--batch-size", str(batch * microbatches), "--precision",
                       "bf16", "--optimizer", "adamw", "--device", device], work)
    matrix = sum(seconds(row) for row in bare.values() if row["type"] in MATRIX_TYPES)
    memory = sum(seconds(row) for row in bare.values() if row["type"] not in MATRIX_TYPES)
    launches = sum(seconds(launched[name]) - seconds(row) for name, row in bare.items()) / LAUNCH_S
    return matrix, memory, round(launches), predicted


CONVOLUTION_TYPES = {"nn.conv", "nn.conv_input_grad", "nn.conv_weight_grad"}
BATCH_NORM_TYPES = {"nn.batch_norm", "nn.batch_norm_grad", "nn.batch_norm_param_grad"}


def grouped_convolutions(path):
    """Names of the Conv and ConvTranspose nodes of the ONNX model at path with group > 1."""
    import onnx  # only this mode needs it
    model = onnx.load(path, load_external_data=False)
    return {node.name for node in model.graph.node if node.op_type in ("Conv", "ConvTranspose")
            and any(a.name == "group" and a.i > 1 for a in node.attribute)}


def fit_convolutional(pipec, models, device, precision, cells):
    """The convolution and batch-norm efficiency factors for cells of (name, measured ms, profile path).

    A class's profiled time, scaled by the measured iteration over the profile's sum (the profile times
    an op at a time, with gaps a CUDA graph does not have), less its planned launches, against its
    planned roofline time, both summed over the networks: the factor on its efficiency."""
    classes = ("convolutions", "grouped convolutions", "batch norms")
    rows, implied = [], {c: [] for c in classes}
    with tempfile.TemporaryDirectory() as work:
        for name, measured_ms, profile in cells:
            model = os.path.join(models, name + ".onnx")
            bare, launched, predicted = cost_tables(
                pipec, model, ["--microbatches", "2", "--precision", precision, "--device", device], work)
            with open(profile) as f:
                profiled = {op["name"]: seconds(op) for op in json.load(f)["ops"]}
            scale = measured_ms / 1e3 / 2 / sum(profiled.values())
            grouped = grouped_convolutions(model)
            def class_of(row):
                if row["type"] in CONVOLUTION_TYPES:
                    return "grouped convolutions" if row["name"].split("#")[0] in grouped else "convolutions"
                return "batch norms" if row["type"] in BATCH_NORM_TYPES else None
            parts = []
            for c in classes:
                ops = [r for r in bare.values() if class_of(r) == c]
                roofline = sum(seconds(r) for r in ops)
                if roofline == 0:
                    continue
                launches = sum(seconds(launched[r["name"]]) for r in ops) - roofline
                real = sum(profiled.get(r["name"], 0.0) for r in ops) * scale
                implied[c].append((roofline, real - launches))
                parts.append((c, roofline + launches, real, roofline))
            print(f"{name}: measured {measured_ms:.2f} ms/iter, plan predicts {predicted * 1e3:.2f} "
                  f"({predicted * 1e3 / measured_ms:.2f}x); per micro-batch, planned / profiled x {scale:.2f}: "
                  + ", ".join(f"{c} {p * 1e3:.2f} / {q * 1e3:.2f} ms" for c, p, q, _ in parts))
            rows.append((name, measured_ms / 1e3, predicted, {c: b for c, _, _, b in parts}))
    factors = {c: sum(b for b, _ in fs) / sum(r for _, r in fs) for c, fs in implied.items() if fs}
    ratios = [(p + 2 * sum(b * (1 / factors[c] - 1) for c, b in planned.items())) / m for _, m, p, planned in rows]
    print(f"fit on {device} ({precision}): "
          + ", ".join(f"{c} efficiency x {f:.3f} (per network " + ", ".join(f"{b / r:.2f}" for b, r in implied[c]) + ")"
                      for c, f in factors.items())
          + "; predicted/measured iterations after it: " + ", ".join(f"{r[0]} {q:.2f}" for r, q in zip(rows, ratios)))


def preset_memory_efficiency():
    """kMemoryEfficiency, read from the presets' source (pipec prints no efficiency)."""
    with open(os.path.join(ROOT, "analysis", "Partition", "Topology.cpp")) as f:
        match = re.search(r"kMemoryEfficiency = ([0-9.]+)", f.read())
    if not match:
        sys.exit("analysis/Partition/Topology.cpp: no kMemoryEfficiency; pass --memory-efficiency")
    return float(match.group(1))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results")
    parser.add_argument("models")
    parser.add_argument("--pipec", default=os.path.join(ROOT, "build", "bin", "pipec"))
    parser.add_argument("--device", default="H200")
    parser.add_argument("--memory-efficiency", type=float, default=preset_memory_efficiency(),
                        help="the preset's fraction of the bandwidth (default: kMemoryEfficiency in "
                             "analysis/Partition/Topology.cpp): a bounded fit keeps it at most 1")
    parser.add_argument("--convolutional", nargs="+", metavar="NAME=MS:PROFILE",
                        help="fit the convolution and batch-norm efficiencies instead (see above)")
    parser.add_argument("--precision", default="bf16", help="the convolutional networks' (default bf16)")
    args = parser.parse_args()
    if args.convolutional:
        cells = []
        for cell in args.convolutional:
            match = re.fullmatch(r"([\w.-]+)=([0-9.]+):(.+)", cell)
            if not match:
                sys.exit(f"--convolutional {cell}: expected NAME=MS:PROFILE")
            cells.append((match.group(1), float(match.group(2)), match.group(3)))
        fit_convolutional(args.pipec, args.models, args.device, args.precision, cells)
        return
    with open(args.results) as f:
        rows = [r for r in json.load(f)["rows"] if r.get("framework") == "pipec" and r.get("status") == "ok"]
    if not rows:
        sys.exit(f"{args.results}: no measured pipec row")
    cells = []
    with tempfile.TemporaryDirectory() as work:
        for row in rows:
            model = os.path.join(args.models, row["model"] + ".onnx")
            microbatches = row.get("microbatches", 2)
            matrix, memory, launches, predicted = split_costs(args.pipec, model, row["batch"], microbatches,
                                                              args.device, work)
            per_microbatch = row["ms"] / 1e3 / microbatches
            cells.append((row["model"], row["batch"], matrix, memory, launches, per_microbatch))
            print(f"{row['model']:6s} {row['batch']:3d} x seq: measured {row['ms']:8.2f} ms/iter, plan predicts "
                  f"{predicted * 1e3:8.2f} ({predicted * 1e3 / row['ms']:.2f}x); per micro-batch: tensor-core "
                  f"{matrix * 1e3:.2f} ms, memory-bound {memory * 1e3:.2f} ms, {launches} launches")

    def errors(matrix_factor, memory_factor):
        return [(m / matrix_factor + b / memory_factor + LAUNCH_S * k) / measured
                for _, _, m, b, k, measured in cells]

    grid = [math.exp(i / 50) for i in range(-100, 101)]  # factors from 1/7.4 to 7.4
    worst, fm, fb = min((max(abs(math.log(r)) for r in errors(fm, fb)), fm, fb) for fm in grid for fb in grid)
    print(f"as planned: predicted/measured per cell: "
          + ", ".join(f"{c[0]} {c[1]}: {r:.2f}" for c, r in zip(cells, errors(1, 1))))
    ratios = errors(fm, fb)
    print(f"best fit on {args.device}: the preset's tensor-core efficiency x {fm:.2f}, its memory efficiency "
          f"x {fb:.2f}; predicted/measured per cell: "
          + ", ".join(f"{c[0]} {c[1]}: {r:.2f}" for c, r in zip(cells, ratios)))
    # A memory factor past 1 / efficiency claims more than the card's bandwidth: the memory-bound
    # costs are then overstated (work fused away), not the bandwidth too low.
    bounded = [fb for fb in grid if fb * args.memory_efficiency <= 1.0]
    bworst, bm, bb = min((max(abs(math.log(r)) for r in errors(fm, fb)), fm, fb) for fm in grid for fb in bounded)
    print(f"best fit within the bandwidth: tensor-core efficiency x {bm:.2f}, memory efficiency x {bb:.2f}; "
          f"predicted/measured per cell: " + ", ".join(f"{c[0]} {c[1]}: {r:.2f}" for c, r in zip(cells, errors(bm, bb)))
          + f" (largest error {math.exp(bworst) - 1:.0%})")
    gpt2 = [r for c, r in zip(cells, errors(1, 1)) if c[0] == "gpt2"]
    verdict = gpt2 and all(abs(r - 1) <= 0.15 for r in gpt2)
    print(f"GPT-2 within 15% as planned: {'yes' if verdict else 'no'} (after the fit, the largest error over all "
          f"cells: {math.exp(worst) - 1:.0%})")


if __name__ == "__main__":
    main()
