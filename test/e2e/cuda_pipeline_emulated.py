#!/usr/bin/env python3
"""Pipelines of generated CUDA stages on one (emulated) GPU, against the same
pipelines on CPU ranks (issue 48; docs/runtime.md, "Ranks sharing a GPU").

Each case compiles an example model twice with the same schedule and stage
count: for --target cuda (fp32) and for --target cpu. The CUDA stages go
through the host emulation's translation (prep.py) and are compiled against
the emulated kernel library; piperun_emulated (piperun's CUDA target built
against the emulation: one emulated GPU that every rank shares) trains them
on 2 to 4 MPI ranks, so every bundle crosses the same-GPU links (CUDA IPC,
or staged through host memory where the emulated machine refuses IPC) and
tied or replicated parameters sum through host memory, or, in the test mode
of the NCCL path, everything goes over the emulation's NCCL; and the emulation
checks that no stage initializes lazily (cudaMalloc, a device wait) after
its rank's first transfer. The CPU job trains on
as many CPU ranks. The trained weights must agree within the fp32
tolerance of the CUDA kernels against the CPU kernels
(cuda-stage-emulated's), and both must have moved from the initial weights.

    cuda_pipeline_emulated.py --pipec PIPEC --piperun PIPERUN
        --piperun-emulated PIPERUN_EMULATED --compare-weights COMPARE
        --emulated-library LIB --emulation-dir DIR --cxx CXX --source-root ROOT
        --work DIR
"""
import argparse
import concurrent.futures
import os
import shutil
import subprocess
import sys

# (name, example, ranks, same-GPU link, pipec arguments)
CASES = [
    ("gpt-1f1b-2", "gpt", 2, "ipc", ["--schedule", "1f1b", "--stages", "2"]),
    ("gpt-zb-h2-3", "gpt", 3, "staged", ["--schedule", "zb-h2", "--stages", "3"]),
    ("cnn-interleaved-2", "cnn", 2, "ipc", ["--schedule", "interleaved", "--stages", "2", "--chunks", "2"]),
    ("mlp-dualpipev-2", "mlp", 2, "ipc", ["--schedule", "dualpipev", "--stages", "2"]),
    # 2 x 2 replicas over the fake NCCL: sends, the replicas' all-reduce and
    # the tied embedding's reduce + broadcast on GpuTransport's NCCL path.
    ("gpt-1f1b-2x2-nccl", "gpt", 4, "nccl", ["--schedule", "1f1b", "--stages", "2"]),
]
ITERATIONS = 3
# The fp32 CUDA kernels against the CPU kernels, after a few steps (their
# sums run in another order; the H200's fp32 runs differed by 6e-8).
RTOL, ATOL = 1e-4, 1e-6


def run(cmd, env=None, timeout=600):
    result = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {result.returncode}\n{result.stdout[-3000:]}{result.stderr[-3000:]}")
    return result


def build_emulated_stages(job, args):
    """Every stage_<k>.cu of JOB/stages, translated and compiled into the
    libstage_<k>.so the plan names."""
    stages = os.path.join(job, "stages")
    translated = os.path.join(job, "translated")
    run([sys.executable, os.path.join(args.emulation_dir, "prep.py"), stages, translated])
    sources = sorted(f for f in os.listdir(translated) if f.startswith("stage_") and f.endswith(".cpp"))
    if not sources:
        raise RuntimeError(f"{stages}: no CUDA stage sources")

    def compile_one(source):
        run([args.cxx, "-std=c++17", "-O1", "-ffp-contract=off", "-fPIC", "-shared", "-w",
             "-include", os.path.join(args.emulation_dir, "emu.h"),
             "-I", os.path.join(args.emulation_dir, "inc"),
             "-I", os.path.join(args.source_root, "runtime", "kernels", "cuda", "include"),
             "-I", os.path.join(args.source_root, "runtime", "kernels", "include"),
             "-I", os.path.join(args.source_root, "runtime", "include"),
             f'-DPIPEC_STAGE_DIR="{stages}"',
             os.path.join(translated, source), args.emulated_library,
             "-o", os.path.join(stages, "lib" + source[:-len(".cpp")] + ".so")])

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        list(pool.map(compile_one, sources))


def mpirun(ranks, program, job, out, env):
    return run(["timeout", "-k", "5", "300", "mpirun", "--oversubscribe", "--mca", "btl", "self,vader",
                "--mca", "btl_vader_single_copy_mechanism", "none", "-np", str(ranks), program, job,
                "--iters", str(ITERATIONS), "--watchdog", "120", "--export-weights", out], env=env)


def check_case(case, args, env):
    name, example, ranks, link, options = case
    work = os.path.join(args.work, name)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    model = os.path.join(args.source_root, "examples", example + ".onnx")
    # SGD with momentum, as the GPU training checks (test/gpu/cuda_target.py):
    # AdamW turns gradients that vanish analytically (a key bias under
    # softmax) into lr-sized steps whose sign is rounding noise.
    common = [model, "--gpus", f"1x{ranks}", "--optimizer", "sgd-momentum", "--lr", "0.01"] + options
    cuda, cpu = os.path.join(work, "cuda"), os.path.join(work, "cpu")
    run([args.pipec] + common + ["--target", "cuda", "--precision", "fp32", "--out", cuda])
    run([args.pipec] + common + ["--target", "cpu", "--out", cpu, "--build"])
    build_emulated_stages(cuda, args)
    # PIPEC_EMU_LAZY_INIT_CHECK: no stage initializes lazily after its
    # rank's first transfer (piperun's warm-up; the emulation aborts).
    emulated_env = dict(env, PIPEC_EMU_IPC="1" if link == "ipc" else "0", PIPEC_EMU_LAZY_INIT_CHECK="1")
    if link == "nccl":
        emulated_env["PIPEC_NCCL_SAME_GPU"] = "1"
    result = mpirun(ranks, args.piperun_emulated, cuda, os.path.join(work, "cuda-trained"), emulated_env)
    routes = [line for line in result.stdout.splitlines() if "->" in line]
    want = {"ipc": "same GPU, CUDA IPC", "staged": "same GPU, staged through host memory",
            "nccl": "same GPU, NCCL"}[link]
    if not routes or any(want not in line for line in routes):
        raise RuntimeError(f"the start-up report does not route every pair by {want}:\n{result.stdout[-2000:]}")
    mpirun(ranks, args.piperun, cpu, os.path.join(work, "cpu-trained"), env)
    compared = run([args.compare_weights, os.path.join(work, "cuda-trained"), os.path.join(work, "cpu-trained"),
                    "--rtol", str(RTOL), "--atol", str(ATOL), "--differs-from", os.path.join(cuda, "weights")])
    summary = [line for line in compared.stdout.splitlines() if "max |diff|" in line]
    return f"{name}: {ranks} ranks on one emulated GPU ({link}) = {ranks} CPU ranks; {' '.join(summary)}"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for flag in ("--pipec", "--piperun", "--piperun-emulated", "--compare-weights", "--emulated-library",
                 "--emulation-dir", "--cxx", "--source-root", "--work"):
        parser.add_argument(flag, required=True)
    args = parser.parse_args()
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1")
    failures = 0
    for case in CASES:
        try:
            print(check_case(case, args, env), flush=True)
        except (RuntimeError, subprocess.TimeoutExpired) as e:
            failures += 1
            print(f"FAIL: {case[0]}: {e}", flush=True)
    print(f"{len(CASES) - failures} of {len(CASES)} emulated CUDA pipelines agree with their CPU runs")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
