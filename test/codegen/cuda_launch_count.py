#!/usr/bin/env python3
"""Launches, host synchronizations and activation bytes per micro-batch of a
GPT-2 stage for the CUDA target (docs/cuda-codegen.md, "Launches, syncs and
bytes per micro-batch"), counted without a GPU.

The model is GPT-2's structure, written here with onnx.helper: token and
position embeddings (and their dropout), 12 pre-LN blocks (LayerNorm, QKV
Linear, causal masked softmax attention with dropout on the probabilities,
output projection, dropout, residual; LayerNorm, a 4x MLP with GELU's tanh
approximation, dropout, residual), a final LayerNorm and the output
projection tied to the token embedding; pipec appends the softmax
cross-entropy loss. It is compiled as one stage:

    pipec MODEL --gpus 1x1 --target cuda --precision bf16 -O2 --optimizer adamw --out DIR

Launches and host syncs: at GPT-2 124M's attention geometry (12 heads, 4
sequences of 1,024 tokens) but head width 8 and a vocabulary of 1,001, odd
like GPT-2's 50,257 (the launches inside the library depend on the
geometry: attention's row blocks, layer norms' row chunks; not on the
widths; an odd vocabulary is padded, pipec-pad-classes) the stage's .cu is translated
for the host emulation (test/kernels/cuda_emulation, as cuda-stage-emulated
does) and stage_launch_count calls forward, backward_input and
backward_weight for three micro-batches and the optimizer step twice,
counting kernel launches, cuBLAS / cuBLASLt GEMMs, stream copies and
memsets, CUDA graph launches and calls that block the host. The emulation
counts without computing (PIPEC_EMU_COUNT_ONLY), so this takes seconds. Activation bytes: the same model at GPT-2 124M's real shape is
compiled to sources only, and the stage descriptor's workspace_bytes (what
forward keeps for the backward, and backward_input for backward_weight, per
micro-batch in flight) is read from the generated .cu. Its weights are a
sparse external-data file of zeros, so writing the model costs nothing;
pipec's job folder holds their 0.5 GB of initial weights until the end.

Fails when a count is unstable (micro-batches 1 and 2, or steps 1 and 2,
differ), when an entry point launches nothing, when the stage compiled at
the real shape makes other library calls than the emulated one (the counts
would not hold there), or when a figure exceeds its bound in
test/codegen/launch_budget.json; a figure below its bound is reported with
the value to lower the bound to (--write-budget rewrites the file with
today's figures).

    cuda_launch_count.py --pipec PIPEC --counter STAGE_LAUNCH_COUNT
        --emulated-library LIB --emulation-dir DIR --cxx CXX --source-root ROOT
        [--budget FILE | --no-budget] [--write-budget] [--json FILE] [--keep DIR]
"""
import argparse
import json
import os
import re
import shutil
import sys
import tempfile

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cuda_stage_emulated import add_emulation_arguments, build_emulated_stage, run  # noqa: E402

# GPT-2 124M, at micro-batch 4 (what the activation bytes are reported for).
REAL = dict(layers=12, width=768, heads=12, context=1024, vocab=50257, batch=4)
# The same 12 blocks at a width that runs in seconds (cuda_stage_emulated.py
# trains it).
TINY = dict(layers=12, width=32, heads=2, context=16, vocab=64, batch=2)
# What is counted: GPT-2 124M's attention geometry (12 heads, 4 sequences of
# 1,024 tokens: the CUDA attention's row blocks, layer norms' row chunks and
# every grid depend on these) at head width 8 and a vocabulary of 1,001,
# odd like GPT-2's so that pipec-pad-classes pads both alike, run by the
# emulation without computing (PIPEC_EMU_COUNT_ONLY).
COUNTED = dict(layers=12, width=96, heads=12, context=1024, vocab=1001, batch=4)
ENTRY_POINTS = ("forward", "backward_input", "backward_weight", "step")
BOUNDED = ("launches", "host_launches", "host_syncs")  # per entry point; activation_bytes for the stage
DEFAULT_BUDGET = os.path.join(os.path.dirname(os.path.abspath(__file__)), "launch_budget.json")
PIPEC_FLAGS = ["--gpus", "1x1", "--target", "cuda", "--precision", "bf16", "-O2", "--optimizer", "adamw"]


def write_gpt2(path, layers, width, heads, context, vocab, batch):
    """GPT-2 (see the module's docstring) as PATH. The weights are zeros in
    one sparse external-data file beside it, so that the real shape's 124M
    parameters cost neither time nor disk here; the counts and the
    descriptor do not depend on their values."""
    weights_file = os.path.basename(path) + ".weights"
    weights_bytes = 0
    initializers = []

    def weight(name, *shape):
        nonlocal weights_bytes
        tensor = TensorProto(name=name, data_type=TensorProto.FLOAT, dims=shape,
                             data_location=TensorProto.EXTERNAL)
        length = int(np.prod(shape)) * 4
        for key, value in (("location", weights_file), ("offset", weights_bytes), ("length", length)):
            entry = tensor.external_data.add()
            entry.key, entry.value = key, str(value)
        weights_bytes += (length + 4095) // 4096 * 4096
        initializers.append(tensor)
        return name

    head = width // heads
    nodes = []

    def node(op, inputs, name, **attributes):
        nodes.append(helper.make_node(op, inputs, [name], name=name, **attributes))
        return name

    def constant(name, array):
        nodes.append(helper.make_node("Constant", [], [name], name=name, value=numpy_helper.from_array(array, name)))
        return name

    def layer_norm(x, prefix):
        return node("LayerNormalization", [x, weight(prefix + ".weight", width), weight(prefix + ".bias", width)],
                    prefix, axis=-1, epsilon=1e-5)

    def linear(x, prefix, inputs, outputs):  # GPT-2's Conv1D: weight [in, out]
        product = node("MatMul", [x, weight(prefix + ".weight", inputs, outputs)], prefix + ".matmul")
        return node("Add", [product, weight(prefix + ".bias", outputs)], prefix)

    def dropout(x, name):
        return node("Dropout", [x, "dropout_ratio", "training"], name)

    constant("dropout_ratio", np.array(0.1, np.float32))
    constant("training", np.array(True))
    constant("positions", np.arange(context, dtype=np.int64))
    constant("heads_shape", np.array([batch, context, heads, head], np.int64))
    constant("merged_shape", np.array([batch, context, width], np.int64))
    constant("qkv_split", np.array([width, width, width], np.int64))
    constant("attention_scale", np.array(np.sqrt(head), np.float32))
    constant("masked", np.array(-np.inf, np.float32))
    constant("causal", np.tril(np.ones((1, 1, context, context), bool)))

    wte = weight("wte.weight", vocab, width)
    embedded = node("Add", [node("Gather", [wte, "tokens"], "token_embedding"),
                            node("Gather", [weight("wpe.weight", context, width), "positions"],
                                 "position_embedding")], "embedding")
    x = dropout(embedded, "embedding_dropout")
    for block in range(layers):
        p = f"h.{block}"
        qkv = linear(layer_norm(x, p + ".ln_1"), p + ".attn.c_attn", width, 3 * width)
        nodes.append(helper.make_node("Split", [qkv, "qkv_split"], [p + ".q", p + ".k", p + ".v"], name=p + ".split",
                                      axis=2))

        def split_heads(name, perm):
            return node("Transpose", [node("Reshape", [name, "heads_shape"], name + ".heads")], name + ".t",
                        perm=perm)

        q, k, v = (split_heads(p + "." + n, [0, 2, 1, 3]) for n in "qkv")
        key_t = node("Transpose", [k], p + ".k.tt", perm=[0, 1, 3, 2])
        scores = node("Div", [node("MatMul", [q, key_t], p + ".scores"), "attention_scale"], p + ".scaled")
        probabilities = node("Softmax", [node("Where", ["causal", scores, "masked"], p + ".masked")], p + ".softmax",
                             axis=-1)
        attended = node("MatMul", [dropout(probabilities, p + ".attn_dropout"), v], p + ".attended")
        merged = node("Reshape", [node("Transpose", [attended], p + ".merge", perm=[0, 2, 1, 3]), "merged_shape"],
                      p + ".merged")
        projected = linear(merged, p + ".attn.c_proj", width, width)
        x = node("Add", [x, dropout(projected, p + ".resid_dropout")], p + ".residual_1")
        hidden = node("Gelu", [linear(layer_norm(x, p + ".ln_2"), p + ".mlp.c_fc", width, 4 * width)], p + ".gelu",
                      approximate="tanh")
        mlp = linear(hidden, p + ".mlp.c_proj", 4 * width, width)
        x = node("Add", [x, dropout(mlp, p + ".mlp_dropout")], p + ".residual_2")
    final = layer_norm(x, "ln_f")
    node("MatMul", [final, node("Transpose", [wte], "wte.t", perm=[1, 0])], "logits")

    graph = helper.make_graph(
        nodes, "gpt2", [helper.make_tensor_value_info("tokens", TensorProto.INT64, [batch, context])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [batch, context, vocab])],
        initializer=initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    onnx.save(model, path)
    with open(os.path.join(os.path.dirname(path), weights_file), "wb") as weights:
        weights.truncate(weights_bytes)  # a hole: reads as zeros, occupies nothing
    onnx.checker.check_model(path)
    return sum(int(np.prod(t.dims)) for t in initializers)


def compile_stage(pipec, shape, work, name, env):
    """The one-stage CUDA job of GPT-2 at SHAPE (sources only): its stages/
    folder and the model's parameter count."""
    model = os.path.join(work, name + ".onnx")
    parameters = write_gpt2(model, **shape)
    job = os.path.join(work, name)
    run([pipec, model] + PIPEC_FLAGS + ["--out", job], env=env)
    return os.path.join(job, "stages"), parameters


def descriptor_workspace_bytes(source):
    """The descriptor's workspace_bytes, from the `description` initializer of
    a generated stage source (.cu or .cpp), where it follows the outputs and
    computes_loss (pipec_stage_desc, stage_abi.h)."""
    with open(source) as f:
        found = re.search(r"const pipec_stage_desc description = \{[^}]*\boutputTensors, [01], (\d+),", f.read())
    if not found:
        sys.exit("FAIL: no `const pipec_stage_desc description = {..., outputTensors, computes_loss, "
                 f"workspace_bytes, ...}};` in the generated {source}")
    return int(found.group(1))


def workspace_bytes(stages):
    """The generated stage_0.cu's workspace_bytes."""
    return descriptor_workspace_bytes(os.path.join(stages, "stage_0.cu"))


ENTRY_FUNCTIONS = {"forward": "forward", "backwardInput": "backward_input", "backwardWeight": "backward_weight",
                   "step": "step"}


def generated_calls(stages):
    """Per entry point of the generated stage_0.cu, the kernel library calls,
    stage helpers and generated kernel launches in the order written: what
    must be the same at every width for the emulated counts to hold at the
    real shape."""
    calls, entry = {}, None
    with open(os.path.join(stages, "stage_0.cu")) as source:
        for line in source:
            opened = re.match(r"void (\w+)\(const pipec_(?:optimizer_)?call \*\w+\) \{", line)
            if opened and opened.group(1) in ENTRY_FUNCTIONS:
                entry = ENTRY_FUNCTIONS[opened.group(1)]
                calls[entry] = []
            elif line.startswith("}"):
                entry = None
            elif entry:
                calls[entry] += re.findall(r"\b(pk::\w+|copyIfDistinct|accumulate|\w+(?=<<<))(?=[<(])", line)
    missing = [entry for entry in ENTRY_POINTS if not calls.get(entry)]
    if missing:
        sys.exit(f"FAIL: found no calls in {', '.join(missing)} of {stages}/stage_0.cu (has the emitter renamed "
                 "its entry functions?)")
    return calls


def workspace_slots(stages, total):
    """The workspace's slots, grouped by the op whose timer follows the
    slot's first use (the op writing it; blocks summed as h.*): a list of
    (entry point, op, slots, bytes), largest first. A slot's bytes run to the
    next slot's offset, so its alignment padding is counted with it."""
    first_use, pending, entry = {}, [], None
    with open(os.path.join(stages, "stage_0.cu")) as source:
        for line in source:
            opened = re.match(r"void (\w+)\(const pipec_(?:optimizer_)?call \*\w+\) \{", line)
            if opened:
                entry, pending = ENTRY_FUNCTIONS.get(opened.group(1)), []
            for offset in map(int, re.findall(r"workspace \+ (\d+)\)", line)):
                if offset not in first_use:
                    first_use[offset] = [entry, "?"]
                    pending.append(offset)
            timed = re.search(r'(?:opTimed\(call, |nodes\[\] = \{)"([^"]+)"', line)
            if timed:
                for offset in pending:
                    first_use[offset][1] = re.sub(r"^h\.\d+\.", "h.*.", timed.group(1))
                pending = []
    offsets = sorted(first_use) + [total]
    groups = {}
    for offset, following in zip(offsets, offsets[1:]):
        key = tuple(first_use[offset])
        slots, size = groups.get(key, (0, 0))
        groups[key] = (slots + 1, size + following - offset)
    return sorted(((entry, op, slots, size) for (entry, op), (slots, size) in groups.items()),
                  key=lambda group: -group[3])


def count_launches(args, stages, work, env):
    """Compiles STAGES for the emulation and runs the counter (with `env`): its rows."""
    library = build_emulated_stage(stages, os.path.join(work, "translated"), args.emulation_dir,
                                   args.emulated_library, args.cxx, args.source_root)
    rows_file = os.path.join(work, "launches.json")
    counted = run([args.counter, library, "--json", rows_file], env=env)
    print(counted.stdout, end="")
    with open(rows_file) as rows:
        return json.load(rows)


def per_microbatch(rows):
    """The steady state per entry point (micro-batch 2, step 2) and the list
    of instabilities: a count that differs between micro-batches 1 and 2 (or
    steps 1 and 2)."""
    figures, unstable = {}, []
    for entry in ENTRY_POINTS:
        calls = {row["call"]: row for row in rows if row["entry"] == entry}
        first, second = calls[1], calls[2]
        differing = [key for key in first if key not in ("entry", "call") and first[key] != second[key]]
        if differing:
            unstable.append(f"{entry}: " + ", ".join(f"{key} {first[key]} then {second[key]}" for key in differing))
        figures[entry] = {key: second[key] for key in ("launches", "kernels", "gemms", "cudnn", "copies",
                                                       "graph_launches", "host_launches", "host_syncs")}
    return figures, unstable


def judge(figures, activation, budget_path):
    """Compares today's figures with the budget: (failures, notes)."""
    failures, notes = [], []
    try:
        with open(budget_path) as f:
            budget = json.load(f)
    except FileNotFoundError:
        return [], [f"no budget file {budget_path}: nothing bounded"]
    checked = [(f"{entry} {key}", figures[entry][key], budget.get("per_microbatch", {}).get(entry, {}).get(key))
               for entry in ENTRY_POINTS for key in BOUNDED]
    checked.append(("activation_bytes", activation, budget.get("activation_bytes")))
    for what, value, bound in checked:
        if bound is None:
            continue
        if value > bound:
            failures.append(f"{what}: {value} > {bound}, the bound in {budget_path}")
        elif value < bound:
            notes.append(f"{what}: {value} < {bound}: an improvement; lower its bound in {budget_path} to {value} "
                         "(or run with --write-budget)")
    return failures, notes


GPT2_BUDGET_ABOUT = (
    "Upper bounds for test/codegen/cuda_launch_count.py (ctest cuda-launch-count): per micro-batch "
    "of a 12-block GPT-2 stage, --target cuda --precision bf16 -O2, per entry point the stream's work "
    "(launches: kernels + GEMMs + cuDNN calls + copies, inside CUDA graphs or not), what the host issues for it "
    "(host_launches: graph launches and the work outside graphs) and host syncs, and activation_bytes (workspace_bytes at "
    "GPT-2 124M, micro-batch 4, context 1024). Lower a bound when the test reports an improvement.")


def write_budget(path, figures, about, activation=None):
    """Today's figures as the bounds in PATH (activation_bytes when given)."""
    budget = {"about": about,
              "per_microbatch": {entry: {key: figures[entry][key] for key in BOUNDED} for entry in ENTRY_POINTS}}
    if activation is not None:
        budget["activation_bytes"] = activation
    with open(path, "w") as f:
        json.dump(budget, f, indent=2)
        f.write("\n")


def print_counts(title, figures):
    """The per-call table of FIGURES under TITLE."""
    print(f"\nPer call after the first (steady state), {title}:")
    print("  (launches: what the GPU runs, kernels + GEMMs + cuDNN calls + copies, a cuDNN call counted as one\n"
          "   launch; issued: what the host issues for them, CUDA graph launches and the work outside graphs)")
    print(f"  {'entry point':<16} {'launches':>8} {'kernels':>8} {'GEMMs':>6} {'cuDNN':>6} {'copies':>7} "
          f"{'graphs':>7} {'issued':>7} {'host syncs':>10}")

    def line(label, rows, note=""):
        print(f"  {label:<16}" + "".join(f" {sum(row[key] for row in rows):>{width}}" for key, width in
                                         (("launches", 8), ("kernels", 8), ("gemms", 6), ("cudnn", 6), ("copies", 7),
                                          ("graph_launches", 7), ("host_launches", 7), ("host_syncs", 10))) + note)

    for entry in ENTRY_POINTS[:3]:
        line(entry, [figures[entry]])
    line("micro-batch", [figures[entry] for entry in ENTRY_POINTS[:3]], "   (the three above)")
    line("step", [figures["step"]], "   (once per iteration)")


def add_counting_arguments(parser, default_budget):
    """The arguments every launch count takes: pipec, the counter, the emulation, the budget."""
    add_emulation_arguments(parser)
    parser.add_argument("--counter", required=True, help="the stage_launch_count executable")
    parser.add_argument("--budget", default=default_budget, help="bounds to hold the figures to (JSON)")
    parser.add_argument("--no-budget", action="store_true", help="report only")
    parser.add_argument("--write-budget", action="store_true", help="record today's figures as the bounds")


def count_failures(figures, unstable):
    """What every count must hold: stable counts, every entry point
    launching, every micro-batch call after the first replaying its CUDA
    graph (the optimizer step, three launches, is not captured)."""
    failures = [f"unstable count, {line}" for line in unstable]
    failures += [f"{entry} launches nothing" for entry in ENTRY_POINTS if figures[entry]["launches"] == 0]
    failures += [f"{entry} ran without its CUDA graph" for entry in ENTRY_POINTS[:3]
                 if figures[entry]["graph_launches"] != 1]
    return failures


def settle_budget(args, figures, failures, about, held, activation=None):
    """Writes the budget (--write-budget) or holds the figures to it (unless
    --no-budget), prints the failures or `held` (what passed), and returns
    the exit status."""
    if args.write_budget:
        write_budget(args.budget, figures, about, activation)
        print(f"wrote today's figures as the bounds into {args.budget}")
    elif not args.no_budget:
        budget_failures, notes = judge(figures, activation, args.budget)
        failures = failures + budget_failures
        for note in notes:
            print("note:", note)
    for failure in failures:
        print("FAIL:", failure)
    if not failures:
        print("ok: " + held + ("" if args.no_budget or args.write_budget else ", and nothing exceeds its bound"))
    return 1 if failures else 0


def print_report(figures, activation, parameters, slots):
    print_counts("12-block GPT-2 stage, --target cuda --precision bf16 -O2", figures)
    print(f"Activation bytes kept per micro-batch in flight (workspace_bytes) at GPT-2 124M "
          f"({parameters / 1e6:.1f}M parameters, micro-batch {REAL['batch']}, context {REAL['context']}): "
          f"{activation} ({activation / 2**30:.2f} GiB); the largest parts, by the op that writes them:")
    kept_by = {"forward": "forward, for the backward", "backward_input": "backward_input, for backward_weight"}
    for entry, op, count, size in slots[:8]:
        print(f"  {size / 2**20:9.1f} MiB  {count:3d} slot{'s' if count > 1 else ' '}  {op:<24} "
              f"(kept by {kept_by.get(entry, entry)})")
    for entry in kept_by:
        print(f"  {sum(size for e, _, _, size in slots if e == entry) / 2**30:.2f} GiB in all kept by {entry}")


def main():
    parser = argparse.ArgumentParser()
    add_counting_arguments(parser, DEFAULT_BUDGET)
    parser.add_argument("--json", help="also write the figures here")
    parser.add_argument("--keep", help="work in this folder and keep it (default: a temporary one)")
    args = parser.parse_args()
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    if args.keep:
        shutil.rmtree(args.keep, ignore_errors=True)
        os.makedirs(args.keep)
    work = args.keep or tempfile.mkdtemp(prefix="pipec-launch-count-")
    try:
        counted, _ = compile_stage(args.pipec, COUNTED, work, "counted", env)
        rows = count_launches(args, counted, work, dict(env, PIPEC_EMU_COUNT_ONLY="1"))
        real, parameters = compile_stage(args.pipec, REAL, work, "gpt2-124m", env)
        activation = workspace_bytes(real)
        slots = workspace_slots(real, activation)
        counted_calls, real_calls = generated_calls(counted), generated_calls(real)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    figures, unstable = per_microbatch(rows)
    print_report(figures, activation, parameters, slots)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"per_microbatch": figures, "activation_bytes": activation, "calls": rows,
                       "emulated_shape": COUNTED, "real_shape": REAL}, f, indent=2)
    failures = count_failures(figures, unstable)
    # The counts come from the narrow model; they hold at the real shape only
    # if its stage makes the same calls.
    failures += [f"{entry}: the stage at the real shape makes other calls than the emulated one "
                 f"({len(real_calls.get(entry, []))} against {len(counted_calls.get(entry, []))}), so its counts "
                 "are not the emulated stage's" for entry in ENTRY_POINTS
                 if real_calls.get(entry) != counted_calls.get(entry)]
    return settle_budget(args, figures, failures, GPT2_BUDGET_ABOUT,
                         "the counts are stable, every entry point launches, the stage makes the same calls at the "
                         "real shape", activation)


if __name__ == "__main__":
    sys.exit(main())
