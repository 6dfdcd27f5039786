#!/usr/bin/env python3
"""End-to-end: pipec compiles the example models into CPU stage libraries and
piperun trains them as pipelines on 2-3 MPI ranks. Checks, after N steps:

1. every synchronous schedule (GPipe, 1F1B, interleaved 1F1B and ZB-V with
   two chunks per rank, zero bubble over three interleaved chunks, ZB-H1,
   ZB-H2, DualPipeV with its F&B pairs) reaches the same weights as the
   1-rank run of the same generated code (dropout on: masks are keyed by
   (seed, step, micro-batch, op), so all runs drop the same elements), and
   PipeDream's 1F1B-RR on a plan whose first stage has two replicas (3 ranks)
   equals the single-process reference of its semantics (pipeseq);
2. the 1-rank run equals PyTorch (Debian's python3-torch) training the same
   model (dropout off, as PyTorch draws other masks) on the same micro-batches
   with the same AdamW, within fp32 tolerance;
   A ZB-V plan for links so slow that its streams post receives far ahead
   of their readers reaches the same weights too;
3. bad inputs (a plan run with the wrong number of ranks, a missing stage
   library) exit non-zero quickly on every rank, and the profile piperun
   measures is one pipec reads.

The examples (and the error checks) run in parallel worker processes, one per
core; the stage libraries of the jobs go through stage_compile_cache.py, so
that a generated stage identical to one already built (every 2-stage
schedule of a model shares its stage sources) is compiled once.
"""
import argparse
import concurrent.futures
import contextlib
import csv
import io
import json
import multiprocessing
import os
import re
import struct
import subprocess
import sys
import tempfile
import traceback

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "examples"))
sys.path.insert(0, os.path.join(ROOT, "runtime", "tools"))
import make_examples  # noqa: E402
import stage_compile_cache  # noqa: E402
from export_to_onnx import read_tensor_file  # noqa: E402

# Ranks on one machine: the ob1 PML over shared memory, as Open MPI picks
# here anyway (and as test/runtime/run_case.sh names it); naming it skips
# probing the cm/ucx PMLs and the TCP BTL, seconds of every mpirun. A rank
# waiting for another yields its core (ranks and tests share two cores).
MPI_ENV = dict({"OMPI_MCA_pml": "ob1", "OMPI_MCA_btl": "self,vader",
                "OMPI_MCA_btl_vader_single_copy_mechanism": "none", "OMPI_MCA_mpi_yield_when_idle": "1"},
                **os.environ)
MPI_ENV.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OPENBLAS_NUM_THREADS="1", OMPI_MCA_rmaps_base_oversubscribe="1")
ENV = MPI_ENV  # a worker's: MPI_ENV with the stage compile cache on PATH
STEPS, MICROBATCHES, LR = 3, 4, 0.01
OPT_LEVEL = "-O2"  # a worker's: pipec's -O0 or -O2 (--opt)
# pipec --build of the GPT's 1-rank stage is a minute of g++ on an idle core;
# the workers and the other tests share two.
BUILD_TIMEOUT = 900
DTYPE_CODES = {np.dtype(np.float32): 1, np.dtype(np.float64): 2, np.dtype(np.int64): 3,
               np.dtype(np.int32): 4}


def launcher_exit_race(command, result):
    """Open MPI 4.1's mpirun, on a loaded machine, now and then reports a rank
    that finished (printed its last line, called MPI_Finalize) as "rank N with
    PID 0 ... exiting improperly": PID 0 means the launcher lost track of the
    process, not that the process failed. Such a launch is run again once."""
    text = result.stdout + result.stderr
    return (command[0] == "mpirun" and result.returncode != 0 and "with PID 0 on" in text
            and "exiting improperly" in text)


def run(command, timeout=300, check=True):
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=ENV)
    if launcher_exit_race(command, result):
        print(f"  note: mpirun lost track of a finished rank (PID 0); running it again: "
              f"{' '.join(command)}", flush=True)
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=ENV)
    if check and result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed ({result.returncode}):\n"
                           f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return result


def losses_of(command, steps, timeout=900):
    """The per-iteration losses a piperun or pipeseq run prints, or None and
    its error lines: (losses, None) or (None, error)."""
    result = run(command, timeout=timeout, check=False)
    if result.returncode != 0:
        text = result.stdout + result.stderr
        return None, "\n".join(line for line in text.splitlines() if "error" in line) or text.strip()[-600:]
    found = [float(m) for m in re.findall(r"iter \d+/\d+\s+loss (\S+)", result.stdout)]
    return (found, None) if len(found) == steps else (None, "no losses in: " + result.stdout[-400:])


def one_and_two_rank_jobs(pipec, model, workdir, *flags):
    """`model` compiled (--build, 2 micro-batches, `flags`) for 1 rank and for
    2 pipeline stages: {"one": DIR, "two": DIR}; raises on a failed compile."""
    jobs = {}
    for name, topology in (("one", ["--gpus", "1x1"]), ("two", ["--gpus", "1x2", "--stages", "2"])):
        jobs[name] = os.path.join(workdir, name)
        run([pipec, model, "--microbatches", "2", "--out", jobs[name], "--build", *flags, *topology],
            timeout=BUILD_TIMEOUT)
    return jobs


def tool_arguments(description, *tools):
    """The command line of a test that takes the paths of pipec's tools:
    --pipec, --piperun, ... (each required); `args.pipec_reference` for
    --pipec-reference."""
    parser = argparse.ArgumentParser(description=description)
    for tool in tools:
        parser.add_argument("--" + tool, required=True)
    return parser.parse_args()


class Checks:
    """A test's checks: each printed as ok or FAIL with what it checked;
    status() prints the count of failures and is the exit status."""

    def __init__(self):
        self.failures = []

    def __call__(self, ok, what):
        print(("ok   " if ok else "FAIL ") + what, flush=True)
        if not ok:
            self.failures.append(what)

    def status(self):
        print(f"{len(self.failures)} failure(s)")
        return 1 if self.failures else 0


def write_dataset(path, fields):
    """docs/dataset-format.md: fields {name: array [N, per-sample...]}."""
    samples = len(next(iter(fields.values())))
    with open(path, "wb") as stream:
        stream.write(b"PIPECDS1")
        stream.write(struct.pack("<IQ", len(fields), samples))
        for name, array in fields.items():
            encoded = name.encode()
            stream.write(struct.pack("<I", len(encoded)) + encoded)
            stream.write(struct.pack("<II", DTYPE_CODES[array.dtype], array.ndim - 1))
            stream.write(struct.pack(f"<{array.ndim - 1}q", *array.shape[1:]))
        for array in fields.values():
            stream.write(np.ascontiguousarray(array).tobytes())


def export(example, workdir, dropout):
    model_class, make_input, input_names = make_examples.examples()[example]
    torch.manual_seed(0)
    model = model_class()
    if not dropout:
        for module in model.modules():
            if isinstance(module, torch.nn.Dropout):
                module.p = 0.0
    model.train()
    sample = make_input()
    path = os.path.join(workdir, f"{example}{'' if dropout else '-nodrop'}.onnx")
    make_examples.onnx_export(model, (sample,), path, opset_version=13,
                              training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False,
                              input_names=input_names, output_names=["logits"])
    return model, sample, input_names[0], path


def make_data(model, sample, input_name, workdir):
    """STEPS·MICROBATCHES micro-batches of inputs and labels."""
    torch.manual_seed(2)
    count = STEPS * MICROBATCHES
    batch = sample.shape[0]
    if sample.dtype == torch.int64:
        inputs = torch.randint(0, int(sample.max()) + 1 if False else 64, (count * batch,) + tuple(sample.shape[1:]))
    else:
        inputs = torch.randn((count * batch,) + tuple(sample.shape[1:]))
    with torch.no_grad():
        logits = model(inputs[:batch])
    classes = logits.shape[-1]
    labels = torch.randint(0, classes, (count * batch,) + tuple(logits.shape[1:-1]))
    path = os.path.join(workdir, "data.bin")
    write_dataset(path, {input_name: inputs.numpy(), "labels": labels.numpy()})
    return inputs, labels, path


def compile_and_train(pipec, piperun, model_path, data, job, ranks, flags, opt_level=None):
    """ranks=None: as many as the plan pipec chose uses; opt_level: the
    worker's (--opt) unless given."""
    run([pipec, model_path, "--microbatches", str(MICROBATCHES), "--lr", str(LR),
         "--out", job, "--build", opt_level or OPT_LEVEL] + flags, timeout=BUILD_TIMEOUT)
    if ranks is None:
        with open(os.path.join(job, "plan.json")) as stream:
            ranks = json.load(stream)["predictions"]["devices_used"]
    run(["mpirun", "-np", str(ranks), "--oversubscribe", piperun, job, "--iters", str(STEPS),
         "--data", data, "--export-weights", os.path.join(job, "trained")])
    weights = {}
    for name in sorted(os.listdir(os.path.join(job, "trained"))):
        weights.update(read_tensor_file(os.path.join(job, "trained", name)))
    return weights


def compare(label, weights, reference, failures, rtol=1e-4, atol=1e-5, only=None):
    worst = 0.0
    for name, expected in reference.items():
        if only is not None and name not in only:
            continue
        if name not in weights:
            failures.append(f"{label}: no weight {name}")
            continue
        error = float(np.abs(weights[name] - expected).max() / max(1.0, np.abs(expected).max()))
        worst = max(worst, error)
    ok = worst <= rtol + atol
    print(f"  {'ok  ' if ok else 'FAIL'} {label}: max relative weight error {worst:.3g}")
    if not ok:
        failures.append(label)


def torch_reference(model, inputs, labels):
    """SGD with momentum on the same micro-batches: the gradient of a
    mini-batch is the mean over its micro-batches of each micro-batch's mean
    loss. (SGD, not AdamW: AdamW turns gradients that are rounding noise —
    a convolution bias before BatchNorm has a zero gradient in exact
    arithmetic — into full-size steps, which no two implementations share.)"""
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    batch = inputs.shape[0] // (STEPS * MICROBATCHES)
    for step in range(STEPS):
        optimizer.zero_grad()
        for micro in range(MICROBATCHES):
            index = (step * MICROBATCHES + micro) * batch
            logits = model(inputs[index:index + batch])
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                   labels[index:index + batch].reshape(-1)) / MICROBATCHES
            loss.backward()
        optimizer.step()
    return {name: tensor.detach().numpy() for name, tensor in model.state_dict().items()
            if name in dict(model.named_parameters())}


def sequential_reference(args, job, data):
    """The weights pipeseq (the single-process reference of the plan's
    semantics) reaches on the job's plan."""
    run([args.pipeseq, job, "--iters", str(STEPS), "--data", data, "--export-weights",
         os.path.join(job, "sequential")])
    weights = {}
    for name in sorted(os.listdir(os.path.join(job, "sequential"))):
        weights.update(read_tensor_file(os.path.join(job, "sequential", name)))
    return weights


def plan_summary(job):
    """'<schedule>, stages x replicas' of the plan pipec wrote."""
    with open(os.path.join(job, "plan.json")) as stream:
        plan = json.load(stream)
    replicas = "+".join(str(stage["replicas"]) for stage in plan["stages"])
    return f"{plan['pipeline'].get('schedule', '?')}, replicas {replicas}"


def antichain_partition(pipec, model_path, workdir):
    """Two stages cut at an antichain that no prefix of the table's order is:
    the first half of the ops plus a later op all of whose producers are in
    that half (a parallel branch), listed in "op_order". None when the graph
    has no such op."""
    costs = os.path.join(workdir, "costs.csv")
    run([pipec, model_path, "--gpus", "1x1", "--dump-costs", costs])
    with open(costs) as stream:
        rows = list(csv.DictReader(stream))
    names = [row["name"] for row in rows]
    producers = [[p for p in row["producers"].split(";") if p] for row in rows]
    # the cut nearest the middle that has such an op
    for cut in sorted(range(1, len(rows) - 1), key=lambda k: abs(k - len(rows) // 2)):
        first = set(names[:cut])
        for index in range(cut + 1, len(rows)):
            if producers[index] and all(p in first for p in producers[index]):
                order = names[:cut] + [names[index]] + names[cut:index] + names[index + 1:]
                path = os.path.join(workdir, "antichain.json")
                with open(path, "w") as stream:
                    json.dump({"op_order": order,
                               "stages": [{"first_op_index": 0, "last_op_index": cut},
                                          {"first_op_index": cut + 1, "last_op_index": len(order) - 1}]},
                              stream)
                return path, names[index]
    return None, None


def replicated_partition(pipec, model_path, workdir):
    """A plan whose first stage (the first half of the ops) has two replicas."""
    costs = os.path.join(workdir, "costs.csv")
    run([pipec, model_path, "--gpus", "1x1", "--dump-costs", costs])
    ops = sum(1 for _ in open(costs)) - 1
    path = os.path.join(workdir, "replicated.json")
    with open(path, "w") as stream:
        stream.write('{"stages": [{"first_op_index": 0, "last_op_index": %d, "replicas": 2},'
                     ' {"first_op_index": %d, "last_op_index": %d, "replicas": 1}]}'
                     % (ops // 2 - 1, ops // 2, ops - 1))
    return path


def check(example, args, workdir, failures):
    print(f"{example}:")
    model, sample, input_name, path = export(example, workdir, dropout=True)
    inputs, labels, data = make_data(model, sample, input_name, workdir)
    # The GPT's tied embedding gets its two gradient contributions summed in
    # the graph on 1 rank and by an all-reduce across stages on 2: the same
    # sum in another order. AdamW would turn that rounding difference, in
    # entries whose gradient is nearly zero, into full-size steps; SGD keeps
    # it at rounding level, so the schedules are compared with SGD there.
    optimizer = ["--optimizer", "sgd-momentum", "--momentum", "0.9"] if example == "gpt" else []
    single_ir = os.path.join(workdir, f"{example}-1rank-ir")
    single = compile_and_train(args.pipec, args.piperun, path, data,
                               os.path.join(workdir, f"{example}-1rank"), 1,
                               ["--gpus", "1x1", "--dump-ir", single_ir] + optimizer)
    if example == "gpt" and OPT_LEVEL == "-O2":
        attention_dropout_check(args, workdir, path, data, single_ir, single, optimizer, failures)
    for schedule in args.schedules:
        # Interleaved 1F1B and ZB-V run two model chunks (virtual stages) per
        # rank; zero bubble over interleaved chunks runs three.
        extra = {"interleaved": ["--chunks", "2"], "zb-interleaved": ["--chunks", "3"]}.get(schedule, [])
        weights = compile_and_train(
            args.pipec, args.piperun, path, data, os.path.join(workdir, f"{example}-{schedule}"), 2,
            ["--gpus", "1x2", "--stages", "2", "--no-replication", "--schedule", schedule] + extra +
            optimizer)
        compare(f"{schedule} on 2 ranks vs 1 rank", weights, single, failures)
    # A schedule written by PyTorch's ZBV generator (2 ranks, 2 chunks each,
    # 4 micro-batches), run from its CSV file (docs/schedules.md, "CSV schedules").
    csv = os.path.join(ROOT, "test", "driver", "Inputs", "torch-schedules", "zbv-p2-m4.csv")
    weights = compile_and_train(args.pipec, args.piperun, path, data, os.path.join(workdir, f"{example}-csv"), 2,
                                ["--gpus", "1x2", "--schedule-file", csv] + optimizer)
    compare("PyTorch's ZBV order from its CSV file on 2 ranks vs 1 rank", weights, single, failures)
    # A communication-heavy stream order: links so slow (--intra-bw 0.001
    # GB/s) that the lowering posts receives far ahead of the computes that
    # read them (RECV_ACT of micro-batch 1 before the backward of micro-batch
    # 0 on rank 0); MPI ranks post them there and wait at the reader
    # (docs/runtime.md).
    weights = compile_and_train(
        args.pipec, args.piperun, path, data, os.path.join(workdir, f"{example}-zb-v-slow-links"), 2,
        ["--gpus", "1x2", "--stages", "2", "--no-replication", "--schedule", "zb-v", "--intra-bw", "0.001"] +
        optimizer)
    compare("zb-v with comm-heavy streams (--intra-bw 0.001) on 2 ranks vs 1 rank", weights, single, failures)
    # Four stages: gradients crossing several boundaries (the GPT's residual
    # stream and layer-norm pieces) and a weight-derived value moved to the
    # stage that uses it.
    weights = compile_and_train(
        args.pipec, args.piperun, path, data, os.path.join(workdir, f"{example}-4stages"), 4,
        ["--gpus", "1x4", "--stages", "4", "--no-replication"] + optimizer)
    compare("1f1b on 4 ranks (4 stages) vs 1 rank", weights, single, failures)
    # A cut at an antichain: stage 0 holds an op of a parallel branch that the
    # table lists after ops of stage 1 (plan.json's op_order).
    plan, moved = antichain_partition(args.pipec, path, workdir)
    if plan:
        weights = compile_and_train(args.pipec, args.piperun, path, data,
                                    os.path.join(workdir, f"{example}-antichain"), 2,
                                    ["--gpus", "1x2", "--partition", plan] + optimizer)
        compare(f"2 stages cut at an antichain ({moved} in stage 0) vs 1 rank", weights, single, failures)
    if example == "cnn":
        # The planner's own choice on 1x4 (partition, replicas, schedule): what
        # `pipec MODEL --gpus 1x4` gives a user. Replicas sum their gradients
        # in another order than one rank does; with AdamW that rounding would
        # become full-size steps on the conv biases before BatchNorm (zero
        # gradient in exact arithmetic), so both runs use SGD. Replicas keep
        # BatchNorm statistics of their own micro-batches: trained parameters only.
        sgd = ["--optimizer", "sgd-momentum", "--momentum", "0.9"]
        single_sgd = compile_and_train(args.pipec, args.piperun, path, data,
                                       os.path.join(workdir, f"{example}-1rank-sgd"), 1, ["--gpus", "1x1"] + sgd)
        job = os.path.join(workdir, f"{example}-default-1x4")
        weights = compile_and_train(args.pipec, args.piperun, path, data, job, None, ["--gpus", "1x4"] + sgd)
        compare(f"default plan on 1x4 ({plan_summary(job)}) vs 1 rank", weights, single_sgd, failures,
                only=dict(model.named_parameters()))
    if example == "gpt":
        # --async alone on 1x4: the planner keeps the tied embedding in one
        # stage, and piperun runs the plan it wrote (checked against pipeseq).
        job = os.path.join(workdir, f"{example}-async-1x4")
        weights = compile_and_train(args.pipec, args.piperun, path, data, job, None,
                                    ["--gpus", "1x4", "--async"] + optimizer)
        compare(f"--async plan on 1x4 ({plan_summary(job)}) vs its sequential reference", weights,
                sequential_reference(args, job, data), failures)

    # PipeDream's 1F1B-RR with a replicated first stage against the
    # single-process reference of its semantics (pipeseq, same plan). Tied
    # weights across stages (the GPT's embedding) cannot be asynchronous.
    if example == "gpt":
        print("  skip 1f1b-rr replicated: its tied embedding spans both stages")
        torch_check(example, args, workdir, inputs, labels, data, failures)
        return additive_mask_check(args, workdir, inputs, labels, data, failures)
    job = os.path.join(workdir, f"{example}-replicated")
    weights = compile_and_train(args.pipec, args.piperun, path, data, job, 3,
                                ["--gpus", "1x3", "--async", "--schedule", "1f1b-rr",
                                 "--partition", replicated_partition(args.pipec, path, workdir)])
    # Trained parameters only: each replica keeps BatchNorm statistics of the
    # micro-batches it saw (docs/runtime.md), which the sequential run merges.
    compare("1f1b-rr, first stage replicated twice (3 ranks) vs its sequential reference",
            weights, sequential_reference(args, job, data), failures, only=dict(model.named_parameters()))
    # PipeDream's vertical sync: every stage uses the version a micro-batch
    # entered stage 0 with.
    job = os.path.join(workdir, f"{example}-vsync")
    weights = compile_and_train(args.pipec, args.piperun, path, data, job, 2,
                                ["--gpus", "1x2", "--stages", "2", "--no-replication", "--async",
                                 "--vertical-sync"])
    compare("1f1b-rr with vertical sync (2 ranks) vs its sequential reference", weights,
            sequential_reference(args, job, data), failures, only=dict(model.named_parameters()))
    torch_check(example, args, workdir, inputs, labels, data, failures)


def attention_dropout_check(args, workdir, path, data, single_ir, single, optimizer, failures):
    """The GPT's attention dropout (softmax -> Dropout -> MatMul, attn_pdrop)
    is one nn.attention at -O2 (docs/optimization.md), whose kernels draw
    the dropout's mask again from its key instead of storing it: the 1-rank
    -O2 job trains to the weights of the -O0 job, which runs the Dropout as
    its own op."""
    with open(os.path.join(single_ir, "04-pipec-recognize-composites.mlir")) as stream:
        fused = len(re.findall(r"nn\.attention .*dropout_ratio", stream.read()))
    if fused != 2:
        failures.append(f"attention dropout: {fused} nn.attention with a dropout after recognize-composites, "
                        "expected 2")
    print(f"  {'ok  ' if fused == 2 else 'FAIL'} attention with dropout fused at -O2: {fused} of 2")
    weights = compile_and_train(args.pipec, args.piperun, path, data, os.path.join(workdir, "gpt-1rank-O0"), 1,
                                ["--gpus", "1x1"] + optimizer, opt_level="-O0")
    compare("1 rank at -O2 (fused attention dropout) vs -O0 (unfused)", weights, single, failures)


def torch_check(example, args, workdir, inputs, labels, data, failures):
    # PyTorch: the same model without dropout.
    model, sample, input_name, path = export(example, workdir, dropout=False)
    reference = torch_reference(model, inputs, labels)
    weights = compile_and_train(args.pipec, args.piperun, path, data,
                                os.path.join(workdir, f"{example}-nodrop"), 2,
                                ["--gpus", "1x2", "--stages", "2", "--no-replication",
                                 "--optimizer", "sgd-momentum", "--momentum", "0.9"])
    compare("1f1b on 2 ranks vs PyTorch (SGD, momentum 0.9)", weights, reference, failures)


def additive_mask_check(args, workdir, inputs, labels, data, failures):
    """The GPT with its causal mask as a 0 / -inf buffer added to the scores:
    the importer keeps the buffer constant (PyTorch does not train it), the
    add and softmax become one masked softmax (inside nn.attention), and 2
    ranks train as PyTorch."""
    torch.manual_seed(0)
    model = make_examples.GPT(additive_mask=True)
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    model.train()
    path = os.path.join(workdir, "gpt-additive-mask.onnx")
    make_examples.onnx_export(model, (inputs[:2],), path, opset_version=13,
                              training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False,
                              input_names=["tokens"], output_names=["logits"])
    reference = torch_reference(model, inputs, labels)
    ir = os.path.join(workdir, "gpt-additive-mask-ir")
    weights = compile_and_train(args.pipec, args.piperun, path, data,
                                os.path.join(workdir, "gpt-additive-mask"), 2,
                                ["--gpus", "1x2", "--stages", "2", "--no-replication", "--dump-ir", ir,
                                 "--optimizer", "sgd-momentum", "--momentum", "0.9"])
    # Each masked softmax is recognized, then (without attention dropout)
    # absorbed with its two products into the fused nn.attention.
    with open(os.path.join(ir, "04-pipec-recognize-composites.mlir")) as stream:
        text = stream.read()
        fused = text.count("nn.masked_softmax ") + text.count("nn.attention ")
    if fused != 2:
        failures.append(f"additive mask: {fused} nn.masked_softmax or nn.attention after recognize-composites, "
                        "expected 2")
    print(f"  {'ok  ' if fused == 2 else 'FAIL'} additive causal masks recognized: {fused} of 2")
    trained = [name for name in weights if "additive" in name]
    if trained:
        failures.append(f"additive mask: trained as parameters: {trained}")
    print(f"  {'FAIL' if trained else 'ok  '} the mask buffers are constants, not trained parameters")
    compare("additive causal mask, 1f1b on 2 ranks vs PyTorch (SGD, momentum 0.9)", weights, reference,
            failures)


def check_profile(args, path, job, ranks, label, failures):
    """piperun --profile measures the generated code op by op; pipec
    --profile plans with those times. Every op that runs a kernel is
    measured, those fused into one loop or into a GEMM's epilogue too (views
    and constants run none)."""
    profile = os.path.join(job, "profile.json")
    run(["mpirun", "-np", str(ranks), "--oversubscribe", args.piperun, job, "--iters", "2",
         "--profile", profile])
    costs = run([args.pipec, path, "--gpus", f"1x{ranks}", "--stages", str(ranks), "--profile", profile,
                 "--emit=costs"]).stdout
    measured = costs.count('source = "profile"')
    kernel_free = ("nn.reshape", "nn.flatten", "nn.squeeze", "nn.unsqueeze", "nn.constant")
    estimated = [line.split("=")[1].split()[0] for line in costs.splitlines()
                 if 'source = "estimate"' in line and not any(f"= {v} " in line for v in kernel_free)]
    ok = measured >= 5 and not estimated
    print(f"  {'ok  ' if ok else 'FAIL'} {label}: piperun --profile feeds pipec --profile: {measured} ops measured, "
          f"{len(estimated)} kernels not measured {estimated[:3]}")
    if not ok:
        failures.append(f"{label} profile round trip")


def check_errors(args, workdir, failures):
    print("errors:")
    _, _, _, path = export("mlp", workdir, dropout=True)
    job = os.path.join(workdir, "errors")
    run([args.pipec, path, "--gpus", "1x2", "--stages", "2", "--no-replication", "--out", job,
         "--build", args.opt], timeout=BUILD_TIMEOUT)
    wrong = run(["mpirun", "-np", "3", "--oversubscribe", args.piperun, job, "--iters", "1"],
                timeout=60, check=False)
    ok = wrong.returncode != 0 and "rank" in (wrong.stderr + wrong.stdout)
    print(f"  {'ok  ' if ok else 'FAIL'} plan for 2 ranks run on 3 exits {wrong.returncode}")
    if not ok:
        failures.append("wrong rank count")
    check_profile(args, path, job, 2, "mlp", failures)
    os.remove(os.path.join(job, "stages", "libstage_1.so"))
    missing = run(["mpirun", "-np", "2", "--oversubscribe", args.piperun, job, "--iters", "1"],
                  timeout=60, check=False)
    ok = missing.returncode != 0 and "libstage_1.so" in (missing.stderr + missing.stdout)
    print(f"  {'ok  ' if ok else 'FAIL'} missing stage library exits {missing.returncode}")
    if not ok:
        failures.append("missing library")


def task(name, args, workdir, env):
    """One worker's share: an example's checks, or the error checks. Returns
    (printed output, failures); an exception is a failure."""
    global ENV, OPT_LEVEL
    ENV = env
    OPT_LEVEL = args.opt
    torch.set_num_threads(1)  # the workers share the cores
    failures = []
    output = io.StringIO()
    with contextlib.redirect_stdout(output):
        try:
            if name == "errors":
                check_errors(args, os.path.join(workdir, name), failures)
            else:
                check(name, args, os.path.join(workdir, name), failures)
        except Exception:  # noqa: BLE001 (reported with its traceback)
            print(traceback.format_exc())
            failures.append(f"{name}: exception")
    return output.getvalue(), failures


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pipec", required=True)
    parser.add_argument("--piperun", required=True)
    parser.add_argument("--pipeseq", required=True)
    parser.add_argument("--only", action="append")
    parser.add_argument("--opt", default="-O2", choices=["-O0", "-O2"],
                        help="pipec's optimisation level for every job (default -O2)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 2,
                        help="worker processes (default: one per core)")
    parser.add_argument("--schedules", nargs="+",
                        default=["gpipe", "1f1b", "interleaved", "zb-h1", "zb-h2", "zb-v", "zb-interleaved", "dualpipev"])
    args = parser.parse_args()
    failures = []
    with tempfile.TemporaryDirectory() as workdir:
        env = stage_compile_cache.install(os.path.join(workdir, "cxx"), MPI_ENV)
        # The largest model first, so that the workers finish together.
        largest = ["gpt", "cnn"]
        names = sorted(args.only or ["mlp", "cnn", "gpt"],
                       key=lambda name: largest.index(name) if name in largest else len(largest))
        names.append("errors")
        for name in names:
            os.makedirs(os.path.join(workdir, name), exist_ok=True)
        context = multiprocessing.get_context("spawn")
        with concurrent.futures.ProcessPoolExecutor(max(1, args.jobs), mp_context=context) as pool:
            futures = [pool.submit(task, name, args, workdir, env) for name in names]
            for name, future in zip(names, futures):
                output, failed = future.result()
                sys.stdout.write(output)
                sys.stdout.flush()
                failures += failed
        print(stage_compile_cache.summary(os.path.join(workdir, "cxx")))
    print(f"{len(failures)} failed: {failures}" if failures else "all checks passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
