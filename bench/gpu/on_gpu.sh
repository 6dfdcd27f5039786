#!/bin/bash
# bench/gpu/on_gpu.sh BUNDLE OUT (run as root on the GPU machine, from the
# repository root): unpacks prepare.sh's bundle, installs its OpenMPI where
# Debian's libmpi looks for its components (/usr/lib/x86_64-linux-gnu/openmpi,
# only files that are not there), finds cuBLAS and NCCL on the machine, and
# runs piperun as a singleton MPI rank (no mpirun): the training checks with
# their weights exported to OUT/trained, every speed job for 8 iterations, op
# profiles of three, then PyTorch on the same GPU (torch_baseline.py).
# Everything it prints is also in OUT/log.txt.
set -u
BUNDLE=$1; OUT=$(mkdir -p "$2" && cd "$2" && pwd); HERE=$(cd "$(dirname "$0")" && pwd)
exec > >(tee "$OUT/log.txt") 2>&1
T0=$(date +%s); el() { echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
G=$(mktemp -d); tar -C "$G" -xJf "$BUNDLE"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit --format=csv,noheader
cp -a --update=none "$G/sys/." / ; LIB=$G/lib; mkdir -p "$LIB"
for lib in "$G"/common/*; do ldconfig -p | grep -q "[[:space:]]$(basename "$lib") " || cp "$lib" "$LIB/"; done
cp "$G"/mpi/* "$G"/cudart/* "$LIB/"
dir_of() { dirname "$(find /usr/local /opt /usr/lib -name "$1" 2>/dev/null | head -1)"; }
export LD_LIBRARY_PATH=$LIB:$(dir_of libcublasLt.so.13):$(dir_of libnccl.so.2)
export OMPI_MCA_ess_singleton_isolated=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
  OMPI_MCA_mca_base_component_show_load_errors=0 OPENBLAS_NUM_THREADS=1 PYTHONUNBUFFERED=1
PIPERUN=$G/bin/piperun
ldd "$PIPERUN" | grep "not found"
for job in "$G"/jobs/*/; do ls "$job"/weights/*.json > /dev/null 2>&1 && python3 "$HERE/synthetic_weights.py" fill "$job"; done
el "set up"
STEPS=$(cat "$G/jobs/steps") # test/gpu/cuda_target.py's, as the CPU references were run
echo "=== training checks: $STEPS steps, weights to OUT/trained (compare_trained.py on the host)"
for job in "$G"/jobs/train-*/; do name=$(basename "$job")
  timeout 120 "$PIPERUN" "$job" --iters "$STEPS" --export-weights "$OUT/trained/$name" > "$G/$name.log" 2>&1; rc=$?
  el "$name rc=$rc: $(grep -o 'final loss.*' "$G/$name.log" | tail -1)"; [ $rc = 0 ] || tail -5 "$G/$name.log"
done
echo "=== speed: ms/iter of 8 iterations"
for job in "$G"/jobs/bench-*/ "$G"/jobs/gpt2-*/ "$G"/jobs/r50-*/ "$G"/jobs/mb-*/; do name=$(basename "$job")
  timeout 150 "$PIPERUN" "$job" --iters 8 --log-every 1 > "$G/$name.log" 2>&1; rc=$?
  el "$name rc=$rc: $(grep -o '[0-9.]* ms/iter' "$G/$name.log" | tr '\n' ' ')"; [ $rc = 0 ] || tail -8 "$G/$name.log"
done
echo "=== op profiles"
for name in gpt2-bf16 r50-bf16 bench-b4096-bf16; do
  timeout 120 "$PIPERUN" "$G/jobs/$name" --iters 3 --profile "$OUT/profile-$name.json" --quiet; el "$name profile rc=$?"
done
echo "=== PyTorch on the same GPU"
timeout 200 python3 "$HERE/torch_baseline.py" 2>&1 | grep -v Warning
# The trained weights also as one tar (a device tool may return only the
# files at the top of OUT).
tar -C "$OUT" -cf "$OUT/trained.tar" trained
el end
