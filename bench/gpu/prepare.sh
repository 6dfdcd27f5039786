#!/bin/bash
# bench/gpu/prepare.sh WORK [TORCH_PYTHON]: everything the GPU runs of
# docs/gpu-runs.md need, made on a host that has pipec's build (LLVM/MLIR,
# OpenMPI, CUDA) for a GPU machine that has only CUDA, NCCL and Python:
#   WORK/models     the exported models (TORCH_PYTHON: a current torch and
#                   torchvision; skipped when the models are there) and
#                   table_models.json
#   WORK/jobs       CUDA jobs (--build): table-<model>-b<4|16> for the table
#                   (GPT-2 124M and the Llama, 4 and 16 x 1,024 tokens per
#                   micro-batch, 2 micro-batches, bf16, AdamW),
#                   train-<example>-<precision> for the GPU-vs-CPU check,
#                   curve-<resnet50|mobilenet_v2>-bf16 for the convolutional
#                   loss curves (their fp32 CPU twins run here: WORK/cpu),
#                   pipe-* for the pipelines on one GPU (pipelines.py); with
#                   BENCH_GPU_EXTRA=1 instead of all these, the earlier speed runs' bench-*/
#                   r50-*/mnv2-* and mb-<b> for the micro-batch sizes (their
#                   predictions: mb-choice.txt; torchvision needed to export)
#   WORK/cpu        the same train-* jobs for CPU ranks, run here 3 steps with
#                   their weights exported (the reference)
#   WORK/bundle.tar.xz  piperun, Debian's OpenMPI 4.1 it links (libraries,
#                   components, help files), our libcudart, the jobs and
#                   table_models.json; the large jobs' initial weights travel as
#                   skeletons (synthetic_weights.py)
# Then on the GPU machine: bench/gpu/on_gpu.sh WORK/bundle.tar.xz OUT [extra],
# and here: tar -C X -xf OUT/trained.tar && bench/gpu/compare_trained.py X/trained WORK/cpu.
set -eu
HERE=$(cd "$(dirname "$0")" && pwd); ROOT=$(cd "$HERE/../.." && pwd)
WORK=$(mkdir -p "$1" && cd "$1" && pwd); TORCH_PYTHON=${2:-python3}; EXTRA=${BENCH_GPU_EXTRA:-0}
PIPEC=$ROOT/build/bin/pipec PIPERUN=$ROOT/build/bin/piperun PY=$ROOT/.venv/bin/python
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1
if ! grep -q '"buffers"' "$WORK/models/table_models.json" 2>/dev/null || [ ! -f "$WORK/models/curve_resnet50.onnx" ] || { [ "$EXTRA" = 1 ] && [ ! -f "$WORK/models/gpt_free_batch.onnx" ]; }; then
  "$TORCH_PYTHON" "$HERE/export_models.py" "$WORK/models" $([ "$EXTRA" = 1 ] && echo --extra)
fi
rm -rf "$WORK/jobs" "$WORK/cpu"; mkdir -p "$WORK/jobs" "$WORK/cpu"
compile() { # model out options...: pipec with --build, its output in out.log
  local model=$1 out=$2; shift 2
  "$PIPEC" "$model" --gpus 1x1 --out "$out" --build "$@" > "$out.log" 2>&1 || { echo "FAILED: pipec $model $* (see $out.log)"; exit 1; }
}
# test/gpu/cuda_target.py's training jobs (its compile_job, examples and
# precisions), on one GPU: each for CUDA and for a CPU rank, which runs here.
# (Not for an extra bundle: the default call runs the checks and the pipelines.)
[ "$EXTRA" = 1 ] || "$PY" - "$ROOT" "$PIPEC" "$PIPERUN" "$WORK" <<'PY'
import os, sys
root, pipec, piperun, work = sys.argv[1:5]
sys.path.insert(0, os.path.join(root, "test", "gpu"))
sys.path.insert(0, os.path.join(root, "bench", "gpu"))
import compare_curves
import cuda_target
for example in cuda_target.EXAMPLES:
    for precision in cuda_target.TOLERANCE:
        for target, folder in (("cuda", "jobs"), ("cpu", "cpu")):
            job = os.path.join(work, folder, f"train-{example}-{precision}")
            result = cuda_target.compile_job(pipec, example, job, target, precision, stages=1)
            if result.returncode != 0:
                sys.exit(f"FAILED: pipec {example} --target {target} --precision {precision}:\n{result.stderr[-3000:]}")
        cpu = os.path.join(work, "cpu", f"train-{example}-{precision}")
        cuda_target.run(["mpirun", "-np", "1", piperun, cpu, "--iters", str(cuda_target.STEPS),
                         "--export-weights", os.path.join(cpu, "trained"), "--quiet"])
        # The loss curves (docs/gpu-runs.md, "bf16 tracks fp32"): the fp32 job on a CPU rank here,
        # against which compare_curves.py reads the bf16 CUDA job's curve from on_gpu.sh.
        if precision == "fp32":
            curve = cuda_target.run(["mpirun", "-np", "1", piperun, cpu, "--iters",
                                     str(compare_curves.CURVE_STEPS), "--log-every", "1"])
            with open(os.path.join(work, "cpu", f"curve-{example}-fp32.log"), "w") as f:
                f.write(curve.stdout + curve.stderr)
# Pipelines on one GPU (bench/gpu/pipelines.py): the checks' jobs on 2-4 stages, CUDA only (on
# the GPU their weights are compared with the 1-rank train-* job's).
import pipelines
for example, schedule, stages, ranks, precision, extra in pipelines.JOBS:
    job = os.path.join(work, "jobs", pipelines.job_name(example, schedule, stages, ranks, precision))
    result = cuda_target.compile_job(pipec, example, job, "cuda", precision, stages=stages, ranks=ranks,
                                     extra=["--schedule", schedule, *extra])
    if result.returncode != 0:
        sys.exit(f"FAILED: pipec {example} --schedule {schedule} --stages {stages} on {ranks} ranks:\n"
                 f"{result.stderr[-3000:]}")
    if schedule in pipelines.ASYNCHRONOUS: # its reference: pipeseq on its CPU job
        cpu = os.path.join(work, "cpu", os.path.basename(job))
        result = cuda_target.compile_job(pipec, example, cpu, "cpu", precision, stages=stages, ranks=ranks,
                                         extra=["--schedule", schedule, *extra])
        if result.returncode != 0:
            sys.exit(f"FAILED: pipec {example} --schedule {schedule} --target cpu:\n{result.stderr[-3000:]}")
        cuda_target.run([os.path.join(os.path.dirname(piperun), "pipeseq"), cpu, "--iters", str(cuda_target.STEPS),
                         "--export-weights", os.path.join(cpu, "trained")])
# The convolutional networks' loss curves (issue 47): compare_curves.CURVE_CNNS (ResNet-50,
# MobileNet-V2, 8 images of 64 x 64), the bf16 CUDA job and its fp32 CPU twin trained as the
# checks are, on 2 micro-batches, memorizing one mini-batch (the synthetic set cut to its 16
# samples, runtime.data.synthetic_samples: compare_curves.py says why). Their weights travel as
# skeletons (synthetic_weights.py; ResNet-50's are 100 MB), so the CPU twin runs here on the same
# seeded values that on_gpu.sh fills in.
import json
import synthetic_weights
for cnn in compare_curves.CURVE_CNNS:
    for target, precision, folder in (("cuda", "bf16", "jobs"), ("cpu", "fp32", "cpu")):
        job = os.path.join(work, folder, f"curve-{cnn}-{precision}")
        result = cuda_target.compile_job(pipec, cnn, job, target, precision, stages=1, microbatches=2,
                                         model=os.path.join(work, "models", f"curve_{cnn}.onnx"))
        if result.returncode != 0:
            sys.exit(f"FAILED: pipec curve_{cnn}.onnx --target {target}:\n{result.stderr[-3000:]}")
        with open(os.path.join(job, "plan.json")) as f:
            plan = json.load(f)
        plan["runtime"]["data"]["synthetic_samples"] = (plan["runtime"]["microbatch_size"]
                                                        * plan["pipeline"]["microbatches"])
        with open(os.path.join(job, "plan.json"), "w") as f:
            json.dump(plan, f, indent=1)
    cpu = os.path.join(work, "cpu", f"curve-{cnn}-fp32")
    synthetic_weights.strip(cpu)
    synthetic_weights.fill(cpu)
    curve = cuda_target.run(["mpirun", "-np", "1", piperun, cpu, "--iters", str(compare_curves.CURVE_STEPS),
                             "--log-every", "1"])
    with open(os.path.join(work, "cpu", f"curve-{cnn}-fp32.log"), "w") as f:
        f.write(curve.stdout + curve.stderr)
# on_gpu.sh trains the CUDA jobs as many steps (the bf16 ones again for their curves).
with open(os.path.join(work, "jobs", "steps"), "w") as f:
    f.write(f"{cuda_target.STEPS}\n")
with open(os.path.join(work, "jobs", "curve_steps"), "w") as f:
    f.write(f"{compare_curves.CURVE_STEPS}\n")
PY
# The table: --micro-batch-size b, 2 micro-batches (on_gpu.sh reads the plan's
# memory against the card's before running). BENCH_GPU_EXTRA=1 builds the
# earlier speed runs' jobs instead (the bundle was 15 MB on 2026-11-28 with the pipelines' jobs; the
# device tool carries 64 MiB with the repository's ~37 MiB).
if [ "$EXTRA" != 1 ]; then
for model in gpt2 llama; do
  # PyTorch's buffers stay constant, as in PyTorch (export_models.py).
  freeze=$("$PY" -c 'import json, sys; print(" ".join("--freeze=" + n for n in json.load(open(sys.argv[1]))[sys.argv[2]]["buffers"]))' \
    "$WORK/models/table_models.json" "$model")
  for b in 4 16; do
    compile "$WORK/models/$model.onnx" "$WORK/jobs/table-$model-b$b" --micro-batch-size $b --batch-size $((2 * b)) \
      --target cuda --precision bf16 --optimizer adamw $freeze
  done
done
else
for p in fp32 tf32 bf16; do
  compile "$WORK/models/mlp8x1024_b64.onnx" "$WORK/jobs/bench-b64-$p" --microbatches 16 --target cuda --precision $p
  compile "$WORK/models/mlp8x1024_b4096.onnx" "$WORK/jobs/bench-b4096-$p" --microbatches 8 --target cuda --precision $p
done
for p in tf32 bf16; do
  compile "$WORK/models/resnet50.onnx" "$WORK/jobs/r50-$p" --microbatches 2 --target cuda --precision $p
  compile "$WORK/models/mobilenet_v2.onnx" "$WORK/jobs/mnv2-$p" --microbatches 2 --target cuda --precision $p
done
# The micro-batch sizes (docs/planner.md, "The batch"): the planner's
# predictions for every size (WORK/mb-choice.txt), and a job per size, 64
# samples per step.
"$PIPEC" "$WORK/models/gpt_free_batch.onnx" --gpus 1x1 --target cuda --precision bf16 --batch-size 64 \
  > "$WORK/mb-choice.txt" 2>&1 || { echo "FAILED: pipec gpt_free_batch.onnx (see $WORK/mb-choice.txt)"; exit 1; }
for b in 1 2 4 8 16 32 64; do
  compile "$WORK/models/gpt_free_batch.onnx" "$WORK/jobs/mb-$b" --micro-batch-size $b --batch-size 64 \
    --target cuda --precision bf16
done
fi
# The bundle.
S=$WORK/stage; rm -rf "$S"; mkdir -p "$S"/{bin,mpi,common,cudart,jobs,models,sys/usr/share,sys/etc} "$S/sys/usr/lib/x86_64-linux-gnu"/{openmpi,pmix2}
cp "$PIPERUN" "$S/bin/"
# What cuBLASLt runs with bf16 (on_gpu.sh prints it): built against CUDA's cuBLAS(Lt) and runtime.
nvcc_root=$(dirname "$(dirname "$(readlink -f "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)")")")
clang++-22 -O1 -std=c++17 -I"$nvcc_root/include" "$HERE/cublaslt_epilogues.cpp" -o "$S/bin/cublaslt_epilogues" \
  -L"$nvcc_root/lib64" -lcublasLt -lcublas -lcudart
# What cuBLAS makes of a transformer's GEMM shapes on the card (on_gpu.sh prints it; docs/gpu-runs.md).
"$nvcc_root/bin/nvcc" -O2 -std=c++17 -gencode arch=compute_90,code=sm_90 -gencode arch=compute_80,code=sm_80 \
  "$HERE/gemm_shapes.cu" -o "$S/bin/gemm_shapes" -lcublas
cp /usr/bin/orterun "$S/bin/mpirun"; cp /usr/bin/orted "$S/bin/"
cp -a /usr/lib/x86_64-linux-gnu/openmpi/lib "$S/sys/usr/lib/x86_64-linux-gnu/openmpi/"
cp -a /usr/lib/x86_64-linux-gnu/pmix2/lib /usr/lib/x86_64-linux-gnu/pmix2/share "$S/sys/usr/lib/x86_64-linux-gnu/pmix2/"
find "$S/sys" -name '*.a' -delete
cp -a /usr/share/openmpi "$S/sys/usr/share/"; cp -a /etc/openmpi "$S/sys/etc/"
# The libraries piperun and OpenMPI's components need, glibc's, CUDA's and
# NCCL's aside (on_gpu.sh takes NCCL from PyTorch's environment; a copy that
# LD_LIBRARY_PATH finds here, outside CUDA's folder, would be 200 MB of the
# bundle): MPI's own always travel, the common ones only fill what the GPU
# machine lacks (on_gpu.sh decides).
for f in "$PIPERUN" /usr/bin/orterun /usr/bin/orted "$S"/sys/usr/lib/x86_64-linux-gnu/openmpi/lib/openmpi3/*.so \
         "$S"/sys/usr/lib/x86_64-linux-gnu/pmix2/lib/pmix/*.so; do ldd "$f" 2>/dev/null || true; done |
  awk '/=>/ {print $3}' | sort -u | grep -v 'cuda\|libnccl\|libc\.so\|libm\.so\|libdl\|libpthread\|librt\|libstdc\|libgcc_s\|ld-linux\|^not$' |
  while read -r lib; do
    case $(basename "$lib") in libmpi*|libopen-*|libmca_common*|liboshmem*|libpmix*|libhwloc*|libevent*) cp -L "$lib" "$S/mpi/";;
                               *) cp -L "$lib" "$S/common/";; esac
  done
cp -L "$(ldd "$PIPERUN" | awk '/libcudart/ {print $3}')" "$S/cudart/"
[ "$EXTRA" = 1 ] || cp "$WORK/jobs/steps" "$WORK/jobs/curve_steps" "$S/jobs/"; cp "$WORK/models/table_models.json" "$S/models/"
for job in "$WORK"/jobs/*/; do name=$(basename "$job"); mkdir -p "$S/jobs/$name/stages"
  cp -a "$job/plan.json" "$job/schedule" "$job/weights" "$S/jobs/$name/"
  cp -a "$job"/stages/*.so "$job"/stages/*.constants.bin "$S/jobs/$name/stages/"
  case $name in train-*|pipe-*) ;; *) "$PY" "$HERE/synthetic_weights.py" strip "$S/jobs/$name";; esac # small: real weights
done
tar -C "$S" -cf - . | xz -T1 --lzma2=preset=6,dict=256MiB > "$WORK/bundle.tar.xz"; rm -rf "$S"
ls -la "$WORK/bundle.tar.xz"
