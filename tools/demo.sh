#!/usr/bin/env bash
# The README's main command: builds pipec if needed, compiles an example model
# (default: the GPT-style examples/gpt.onnx) into a 2-stage pipeline with CPU
# stage libraries, and trains it with piperun on 2 MPI ranks (1F1B), printing
# the plan and the loss going down.
#   tools/demo.sh [model.onnx [ITERATIONS]]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${PIPEC_BUILD_DIR:-$ROOT/build}"
mkdir -p "$BUILD"
echo "== building pipec (first time: about 15 minutes on 2 cores; log in $BUILD/build.log)"
"$ROOT/tools/build.sh" > "$BUILD/build.log" 2>&1 || { tail -50 "$BUILD/build.log"; exit 1; }
MODEL="${1:-$ROOT/examples/gpt.onnx}"
ITERS="${2:-60}"
JOB="${PIPEC_OUT:-$ROOT/out}/job"
rm -rf "$JOB"
echo "== pipec $MODEL --gpus 1x2 --stages 2 --microbatches 4 --lr 0.005 --out $JOB --build"
"$BUILD/bin/pipec" "$MODEL" --gpus 1x2 --stages 2 --microbatches 4 --lr 0.005 \
  --dump-ir "$JOB/ir" --out "$JOB" --build
echo "== mpirun -np 2 piperun $JOB --iters $ITERS --log-every 10"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1
mpirun -np 2 --oversubscribe "$BUILD/bin/piperun" "$JOB" --iters "$ITERS" --log-every 10
