#!/usr/bin/env python3
"""The CUDA target (issue 7), in two checks:

--check build   (ctest label "cuda"; needs nvcc, not a GPU)
    Every example model is compiled with `--target cuda --build` (nvcc, each
    architecture of --cuda-arch, linked with --no-undefined so that a kernel
    the stage calls but the CUDA kernel library lacks fails here) and with
    `--target cpu --build`. Both libraries are loaded and their stage
    descriptors (parameters, data fields, bundles, workspace, optimizer)
    must be identical: the runtime drives both targets the same way. At
    bf16 the CUDA stage's bundles are bf16 where the CPU's are f32 and its
    workspace is smaller (bf16 storage); everything else is identical.

--check train   (ctest label "gpu"; needs GPUs)
    Each example at each precision is trained for a few steps by piperun on
    GPUs (CUDA stages, NCCL between ranks) and on CPU ranks (CPU stages, MPI)
    from the same weights, data and seed; the trained weights must agree
    within the precision's tolerance (relative to the largest weight; fp32:
    1e-3, tf32: 1e-2, bf16: 3e-2).

`build` checks the examples side by side (one worker per core); the CPU
stages go through test/e2e/stage_compile_cache.py (the GPT's fp32 and bf16
CPU stages are the same source, compiled once).

Exit code 77 means "skipped" (ctest's SKIP_RETURN_CODE): no nvcc / no CUDA
kernel library for `build`, no GPU for `train`. A skip is never a pass.
"""
import argparse
import concurrent.futures
import ctypes
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "runtime", "tools"))
from export_to_onnx import read_tensor_file  # noqa: E402
sys.path.insert(0, os.path.join(ROOT, "test", "e2e"))
import stage_compile_cache  # noqa: E402

SKIP = 77
EXAMPLES = ["mlp", "cnn", "gpt"]
STEPS, MICROBATCHES = 3, 4
TOLERANCE = {"fp32": 1e-3, "tf32": 1e-2, "bf16": 3e-2}
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OPENBLAS_NUM_THREADS="1", OMPI_MCA_rmaps_base_oversubscribe="1")
NO_CUDA_LIBRARY = "built without the CUDA kernel library"


def run(command, timeout=900):
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=ENV)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed ({result.returncode}):\n"
                           f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return result


# The stage ABI's descriptor (runtime/include/pipec/stage_abi.h).
F32, BF16 = 1, 6  # pipec_dtype
class TensorDesc(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("dtype", ctypes.c_int), ("rank", ctypes.c_int32),
                ("shape", ctypes.POINTER(ctypes.c_int64))]


class ParamDesc(ctypes.Structure):
    _fields_ = [("tensor", TensorDesc), ("role", ctypes.c_int)]


class StageDesc(ctypes.Structure):
    _fields_ = [("abi_version", ctypes.c_int32), ("stage", ctypes.c_int32),
                ("num_stages", ctypes.c_int32), ("num_params", ctypes.c_int32),
                ("params", ctypes.POINTER(ParamDesc)), ("num_data", ctypes.c_int32),
                ("data", ctypes.POINTER(TensorDesc)), ("num_inputs", ctypes.c_int32),
                ("inputs", ctypes.POINTER(TensorDesc)), ("num_outputs", ctypes.c_int32),
                ("outputs", ctypes.POINTER(TensorDesc)), ("computes_loss", ctypes.c_int32),
                ("workspace_bytes", ctypes.c_int64), ("optimizer", ctypes.c_int),
                ("optimizer_state_per_param", ctypes.c_int32)]


def tensor(desc):
    return (desc.name.decode() if desc.name else None, desc.dtype,
            tuple(desc.shape[i] for i in range(desc.rank)))


def describe(library):
    """The descriptor of a stage library as plain Python values."""
    handle = ctypes.CDLL(library)
    handle.pipec_stage_describe.restype = ctypes.POINTER(StageDesc)
    d = handle.pipec_stage_describe().contents
    return {
        "abi": d.abi_version, "stage": d.stage, "stages": d.num_stages,
        "params": [(tensor(d.params[i].tensor), d.params[i].role) for i in range(d.num_params)],
        "data": [tensor(d.data[i]) for i in range(d.num_data)],
        "inputs": [tensor(d.inputs[i]) for i in range(d.num_inputs)],
        "outputs": [tensor(d.outputs[i]) for i in range(d.num_outputs)],
        "loss": d.computes_loss, "workspace": d.workspace_bytes, "optimizer": d.optimizer,
        "state": d.optimizer_state_per_param,
    }


def compile_job(pipec, example, job, target, precision, stages=2, env=ENV, ranks=None, extra=(),
                microbatches=MICROBATCHES, model=None):
    """The same plan for both targets: the partition sees the same precision
    (the CPU target computes fp32 whatever the cost model assumed). ranks:
    the devices planned for (default: one per stage; more let the planner
    replicate stages). model: another ONNX file than the example's, trained
    the same way (bench/gpu/prepare.sh's convolutional curves)."""
    command = [pipec, model or os.path.join(ROOT, "examples", f"{example}.onnx"), "--gpus", f"1x{ranks or stages}",
               "--stages", str(stages), "--microbatches", str(microbatches),
               "--optimizer", "sgd-momentum", "--lr", "0.01", "--seed", "3", "--target", target,
               "--precision", precision, "--out", job, "--build", *extra]
    return subprocess.run(command, capture_output=True, text=True, timeout=900, env=env)


def build_pair(args, workdir, env, example, precision):
    """One example and precision: (skip message or None, failures, lines)."""
    failures, lines = [], []
    label = f"{example} ({precision})"
    cuda_job = os.path.join(workdir, f"{example}-{precision}-cuda")
    result = compile_job(args.pipec, example, cuda_job, "cuda", precision, env=env)
    if result.returncode != 0 and NO_CUDA_LIBRARY in result.stderr:
        return result.stderr.strip(), failures, lines
    if result.returncode != 0:
        failures.append(f"{label}: --target cuda --build failed:\n{result.stderr[-4000:]}")
        return None, failures, lines
    cpu_job = os.path.join(workdir, f"{example}-{precision}-cpu")
    result = compile_job(args.pipec, example, cpu_job, "cpu", precision, env=env)
    if result.returncode != 0:
        failures.append(f"{label}: --target cpu --build failed:\n{result.stderr[-4000:]}")
        return None, failures, lines
    stages = sorted(f for f in os.listdir(os.path.join(cuda_job, "stages")) if f.endswith(".so"))
    if len(stages) != 2:
        failures.append(f"{label}: expected 2 CUDA stage libraries, found {stages}")
        return None, failures, lines
    for stage in stages:
        cuda_desc = describe(os.path.join(cuda_job, "stages", stage))
        cpu_desc = describe(os.path.join(cpu_job, "stages", stage))
        if precision == "bf16":
            # bf16 storage (docs/cuda-codegen.md): the bundles are bf16 where
            # the CPU's are f32, and a micro-batch keeps fewer bytes.
            if not 0 < cuda_desc["workspace"] < cpu_desc["workspace"]:
                failures.append(f"{label} {stage}: workspace {cuda_desc['workspace']} bytes with bf16 storage, "
                                f"not below the CPU stage's {cpu_desc['workspace']}")
            cpu_desc["workspace"] = cuda_desc["workspace"]
            for bundle in ("inputs", "outputs"):
                cpu_desc[bundle] = [(name, BF16 if dtype == F32 else dtype, shape)
                                    for name, dtype, shape in cpu_desc[bundle]]
        if cuda_desc != cpu_desc:
            differing = [k for k in cuda_desc if cuda_desc[k] != cpu_desc[k]]
            failures.append(f"{label} {stage}: descriptors differ in {differing}")
        else:
            lines.append(f"  ok   {label} {stage}: built with nvcc, {len(cuda_desc['params'])} "
                         f"parameters, descriptor equals the CPU stage's")
    return None, failures, lines


def check_build(args, workdir):
    # The largest model first, so that the workers finish together.
    pairs = [(example, precision) for example in reversed(EXAMPLES)
             for precision in (["fp32", "bf16"] if example == "gpt" else ["fp32"])]
    env = stage_compile_cache.install(os.path.join(workdir, "cxx"), ENV)
    failures = []
    with concurrent.futures.ThreadPoolExecutor(max(1, args.jobs)) as pool:
        outcomes = list(pool.map(lambda pair: build_pair(args, workdir, env, *pair), pairs))
    for skipped, failed, lines in outcomes:
        if skipped is not None:
            print(f"SKIPPED: {skipped}")
            return SKIP
    for skipped, failed, lines in outcomes:
        for line in lines:
            print(line)
        failures += failed
    print(stage_compile_cache.summary(os.path.join(workdir, "cxx")))
    for failure in failures:
        print(f"FAIL {failure}")
    return 1 if failures else 0


def gpu_count():
    if not shutil.which("nvidia-smi"):
        return 0
    result = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
    return sum(1 for line in result.stdout.splitlines() if line.startswith("GPU "))


def read_weights(directory):
    """Every tensor of the weights files in `directory` (piperun --export-weights)."""
    weights = {}
    for name in sorted(os.listdir(directory)):
        weights.update(read_tensor_file(os.path.join(directory, name)))
    return weights


def trained_weights(job):
    return read_weights(os.path.join(job, "trained"))


def largest_difference(expected, got):
    """(largest |got - expected| relative to max(1, the largest |expected|) over
    the tensors, its tensor, the tensors missing from got)."""
    worst, which, missing = 0.0, None, []
    for name, value in expected.items():
        if name not in got:
            missing.append(name)
            continue
        d = float(np.abs(got[name] - value).max() / max(1.0, np.abs(value).max()))
        if which is None or d > worst:
            worst, which = d, name
    return worst, which, missing


def check_train(args, workdir):
    gpus = gpu_count()
    if gpus == 0:
        print("SKIPPED: no GPU on this machine (nvidia-smi lists none)")
        return SKIP
    # Two ranks whatever the GPUs: on one GPU they share it (same-GPU links,
    # docs/runtime.md "Ranks sharing a GPU"), on more each has its own (NCCL).
    ranks = 2
    failures = []
    for example in EXAMPLES:
        for precision in TOLERANCE:  # every precision: all nine passed on an H200 (docs/gpu-runs.md)
            label = f"{example} ({precision}, {ranks} ranks on {min(ranks, gpus)} GPU{'s' if min(ranks, gpus) > 1 else ''})"
            jobs = {}
            for target in ("cpu", "cuda"):
                job = os.path.join(workdir, f"{example}-{precision}-{target}-train")
                result = compile_job(args.pipec, example, job, target, precision, ranks)
                if result.returncode != 0:
                    failures.append(f"{label}: --target {target} failed:\n{result.stderr[-3000:]}")
                    break
                run(["mpirun", "-np", str(ranks), args.piperun, job, "--iters", str(STEPS),
                     "--export-weights", os.path.join(job, "trained")])
                jobs[target] = trained_weights(job)
            if len(jobs) != 2:
                continue
            worst, _, missing = largest_difference(jobs["cpu"], jobs["cuda"])
            failures += [f"{label}: the GPU run exported no weight {name}" for name in missing]
            ok = worst <= TOLERANCE[precision]
            print(f"  {'ok  ' if ok else 'FAIL'} {label}: max relative weight difference GPU vs CPU "
                  f"{worst:.3g} (tolerance {TOLERANCE[precision]})")
            if not ok:
                failures.append(label)
    for failure in failures:
        print(f"FAIL {failure}")
    return 1 if failures else 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", choices=["build", "train"], required=True)
    parser.add_argument("--pipec", required=True)
    parser.add_argument("--piperun", required=True)
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 2,
                        help="builds side by side (--check build; default: one per core)")
    args = parser.parse_args()
    workdir = tempfile.mkdtemp(prefix=f"pipec-cuda-{args.check}-")
    try:
        return check_build(args, workdir) if args.check == "build" else check_train(args, workdir)
    finally:
        if args.keep:
            print(f"work directory: {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
