#!/bin/bash
# bench/gpu/on_gpu.sh BUNDLE OUT [extra|pipelines|pipec] (run as root on the GPU
# machine, from the repository root): unpacks prepare.sh's bundle, installs its
# OpenMPI's help files and configuration where Debian's libmpi looks for them
# (only files that are not there; the components are read from the bundle),
# finds cuBLAS and NCCL on the machine, and runs piperun as a singleton MPI rank
# (no mpirun), the pipelines with the bundle's mpirun. `pipelines` runs only the
# training checks and the pipelines (about 2 minutes, no budget applied);
# `pipec` all but PyTorch's rows and the pipelines (pipec re-measured after a
# change; its table shows PyTorch's rows "not run").
#
# The default run fits one device call of 8 minutes (BENCH_GPU_BUDGET_S,
# default 470 s, counted from the start of this script). On 2026-11-27 on
# H200s it took 182-205 s in all (docs/gpu-runs.md: set-up 6 s, pipec's rows
# and profiles 30 s, PyTorch 130-150 s, checks and curves 20 s); the estimates
# below are the older ones the budget rules were written from. In this order:
#   set-up       untar, OpenMPI, the table jobs' synthetic weights (4 x 0.5 GB,
#                in parallel): ~15 s
#   pipec        the table's 4 jobs (GPT-2 124M and the Llama at 4 and 16 x
#                1,024 tokens, 2 micro-batches): 8 iterations at 4 x 1,024 (3
#                warm-up), 5 at 16 x 1,024 (2 warm-up); ~110 and ~450 ms per
#                GPT-2 iteration on an H200, so ~10-15 s a job with its start:
#                ~60 s. A job whose plan predicts more memory than the card
#                has is reported "out of memory" without running, and so is one
#                whose piperun says so
#   PyTorch      torch_baseline.py --table: eager rows (~20 s with the start),
#                then the torch.compile rows, ~40-90 s of compilation each on an
#                H100 (4 compiles: the largest part, ~160-360 s). A compile row
#                that would end less than 60 s before the budget's end (its
#                estimate: the last compile's time, x1.3 for 16 x 1,024; 120 s
#                for the first) is skipped and reported so; the process is
#                killed 40 s before the end, and rows it did not report are
#                "not run (no time left)" in the table
#   checks       the 9 training checks (test/gpu/cuda_target.py's examples x
#                precisions, 3 steps each of tiny models, weights to
#                OUT/trained.tar for compare_trained.py on the host): ~2-4 s
#                each, ~30 s; each runs only while 15 s of the budget are left
#   pipelines    pipelines.py's jobs on 2-4 ranks of the one GPU over each
#                route, 3 steps (~3-5 s each with mpirun's start, ~20 runs),
#                then a rank killed mid-run over two routes: ~100 s; each runs
#                only while 25 s of the budget are left
#   report       report.py: the table printed and written to OUT/results.md
#                and OUT/results.json
# Dropped from the default run (issue 46 item 9), as they would push the call
# over 8 minutes (about 3-4 minutes more by the same estimate: 17 speed jobs of
# 8 iterations ~100 s, 3 op profiles ~30 s, their PyTorch baselines up to 200 s):
# the earlier speed table of docs/gpu-runs.md (MLP,
# ResNet-50, MobileNet-V2, the micro-batch sizes) and the op profiles; issue
# 47's convolutional rows are these (PyTorch eager NCHW and channels-last,
# torch.compile channels-last, bf16 autocast). They still run, without
# the training checks and pipelines (the default call's), from a bundle of
# `BENCH_GPU_EXTRA=1 prepare.sh` and the third argument `extra`, in a call of
# their own (no budget applied).
# Everything printed is also in OUT/log.txt. OUT gets at most 6 files (the
# device tool returns 8): log.txt, results.md, results.json, trained.tar,
# logs.tar (every piperun log) and profiles.tar: profile-<model>-b<4|16>.json
# for both models at both shapes (op timers, each when the budget leaves
# 150 s); with extra, ResNet-50's, MobileNet-V2's and the batch-4,096 MLP's at
# bf16 instead.
set -u
BUNDLE=$1; OUT=$(mkdir -p "$2" && cd "$2" && pwd); HERE=$(cd "$(dirname "$0")" && pwd); MODE=${3:-table}
# `pipec`: the default run without PyTorch's rows and the pipelines (pipec re-measured after a
# change, against the PyTorch rows of an earlier call; about 2 minutes).
TORCH_ROWS=1 PIPELINES=1
if [ "$MODE" = pipec ]; then MODE=table TORCH_ROWS=0 PIPELINES=0; fi
exec > >(tee "$OUT/log.txt") 2>&1
T0=$(date +%s); DEADLINE=$((T0 + ${BENCH_GPU_BUDGET_S:-470}))
el() { echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
left() { echo $(( DEADLINE - $(date +%s) )); }
G=$(mktemp -d); tar -C "$G" -xJf "$BUNDLE" || { echo "cannot unpack $BUNDLE"; exit 1; }
if command -v nvidia-smi > /dev/null; then
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit --format=csv,noheader
  CARD=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
  CARD_BYTES=$(( $(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1) * 1048576 ))
else # a dry run without a GPU (BENCH_GPU_SMOKE=1 on_gpu.sh ...): piperun's rows fail, torch's are tiny CPU ones
  CARD="no GPU (dry run)"; CARD_BYTES=$((1 << 62))
fi
cp -a --update=none "$G/sys/." / ; LIB=$G/lib; mkdir -p "$LIB"
for lib in "$G"/common/*; do ldconfig -p | grep -q "[[:space:]]$(basename "$lib") " || cp "$lib" "$LIB/"; done
cp "$G"/mpi/* "$G"/cudart/* "$LIB/"
dir_of() { dirname "$(find /usr/local /opt /usr/lib -name "$1" 2>/dev/null | head -1)"; }
# cuDNN (flash attention) is loaded by the stages at run time, with NVRTC for its runtime-compiled
# engines: PyTorch's nvidia-cudnn-cu13 and nvidia-cuda-nvrtc here.
export LD_LIBRARY_PATH=$LIB:$(dir_of libcublasLt.so.13):$(dir_of libnccl.so.2):$(dir_of libcudnn.so.9):$(dir_of libnvrtc.so.13)
# Our OpenMPI's and PMIx's components, not the machine's: a GPU machine may have its own OpenMPI
# in the same folders (the 2026-11-28 H200 did, built against a newer PMIx, so that mpirun failed
# with "undefined symbol: PMIx_Info_create"), and `cp --update=none` above keeps its files.
export OMPI_MCA_mca_base_component_path=$G/sys/usr/lib/x86_64-linux-gnu/openmpi/lib/openmpi3 \
  PMIX_MCA_mca_base_component_path=$G/sys/usr/lib/x86_64-linux-gnu/pmix2/lib/pmix
export OMPI_MCA_ess_singleton_isolated=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
  OMPI_MCA_mca_base_component_show_load_errors=0 OPENBLAS_NUM_THREADS=1 PYTHONUNBUFFERED=1
PIPERUN=$G/bin/piperun
ldd "$PIPERUN" | grep "not found"
shopt -s nullglob
fills=() # in parallel; waited for by pid (a bare wait would wait for the tee above too)
for job in "$G"/jobs/*/; do
  [ "$MODE" = pipelines ] && [[ $(basename "$job") = table-* ]] && continue
  if ls "$job"/weights/*.json > /dev/null 2>&1; then python3 "$HERE/synthetic_weights.py" fill "$job" & fills+=($!); fi
done
[ ${#fills[@]} = 0 ] || wait "${fills[@]}"
el "set up"
[ -x "$G/bin/cublaslt_epilogues" ] && { echo "=== cuBLASLt's epilogues with bf16"; timeout 30 "$G/bin/cublaslt_epilogues"; }
[ -x "$G/bin/gemm_shapes" ] && [ "$MODE" != pipelines ] && { echo "=== GEMM shapes"; timeout 30 "$G/bin/gemm_shapes"; }

if [ "$MODE" = table ]; then
echo "=== table: pipec (piperun --log-every 1; the first iterations are warm-up)"
ROWS=$G/rows.jsonl; : > "$ROWS"
for model in gpt2 llama; do for b in 4 16; do
  job=$G/jobs/table-$model-b$b; log=$G/table-$model-b$b.log
  [ -d "$job" ] || { el "$model ${b}x1024: no job in the bundle"; continue; }
  if [ "$b" = 4 ]; then warm=3 iters=8; else warm=2 iters=5; fi # torch_baseline.py's SHAPES
  need=$(python3 "$HERE/report.py" plan-memory "$job")
  if [ "$need" -gt "$CARD_BYTES" ]; then
    echo "piperun: not run: the plan needs $need bytes, out of memory on this card ($CARD_BYTES bytes)" > "$log"
    python3 "$HERE/report.py" pipec "$model" "$b" "$job" "$log" 1 "$warm" >> "$ROWS"
    el "$model ${b}x1024: out of memory (plan $need bytes > $CARD_BYTES)"; continue
  fi
  limit=$(( $(left) < 150 ? $(left) : 150 )); [ "$limit" -gt 10 ] || limit=10
  smi=; if [ "$CARD_BYTES" != $((1 << 62)) ]; then
    nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 250 > "$G/mem-$model-$b.txt" 2>/dev/null &
    smi=$!
  fi
  timeout "$limit" "$PIPERUN" "$job" --iters "$iters" --log-every 1 > "$log" 2>&1; rc=$?
  [ -n "$smi" ] && { kill "$smi"; wait "$smi"; } 2>/dev/null
  peak=$(sort -n "$G/mem-$model-$b.txt" 2>/dev/null | tail -1)
  python3 "$HERE/report.py" pipec "$model" "$b" "$job" "$log" "$rc" "$warm" $peak >> "$ROWS"
  el "$model ${b}x1024 rc=$rc: $(grep -o '[0-9.]* ms/iter' "$log" | tr '\n' ' ') peak ${peak:-?} MiB"
  [ $rc = 0 ] || tail -5 "$log"
done; done
# The CUDA graphs' share (docs/cuda-codegen.md, "CUDA graphs"): GPT-2 at 4 x 1,024 again, launch by launch.
job=$G/jobs/table-gpt2-b4
if [ -d "$job" ] && [ "$(left)" -gt 120 ]; then
  timeout 60 "$PIPERUN" "$job" --iters 8 --log-every 1 --no-cuda-graphs > "$G/table-gpt2-b4-no-graphs.log" 2>&1
  el "gpt2 4x1024 --no-cuda-graphs rc=$?: $(grep -o '[0-9.]* ms/iter' "$G/table-gpt2-b4-no-graphs.log" | tr '\n' ' ')"
fi
# cuDNN's flash attention's share (docs/cuda-kernels.md, "Flash attention"): the same on pipec's attention kernels.
if [ -d "$job" ] && [ "$(left)" -gt 120 ]; then
  PIPEC_CUDNN_ATTENTION=0 timeout 60 "$PIPERUN" "$job" --iters 8 --log-every 1 > "$G/table-gpt2-b4-no-cudnn.log" 2>&1
  el "gpt2 4x1024 PIPEC_CUDNN_ATTENTION=0 rc=$?: $(grep -o '[0-9.]* ms/iter' "$G/table-gpt2-b4-no-cudnn.log" | tr '\n' ' ')"
fi
# Where the time goes, op by op (piperun --profile: the stages synchronize around each op, so
# these are per-op times, not the run's): both models at both shapes (16 x 1,024 is where pipec
# is furthest from torch.compile), 3 iterations.
mkdir -p "$G/profiles"
for run in gpt2-b4 llama-b4 gpt2-b16 llama-b16; do job=$G/jobs/table-$run
  if [ -d "$job" ] && [ "$(left)" -gt 150 ]; then
    timeout 60 "$PIPERUN" "$job" --iters 3 --profile "$G/profiles/profile-$run.json" --quiet > "$G/table-$run-profile.log" 2>&1
    el "$run --profile rc=$?"
  fi
done
tar -C "$G" -cf "$OUT/profiles.tar" profiles
if [ "$TORCH_ROWS" = 1 ]; then
echo "=== table: PyTorch on the same GPU (eager, then torch.compile)"
limit=$(( $(left) - 40 )); [ "$limit" -gt 30 ] || limit=30
timeout "$limit" python3 "$HERE/torch_baseline.py" --table "$G/torch.jsonl" --deadline $((DEADLINE - 60)) \
  ${BENCH_GPU_SMOKE:+--smoke} 2>&1 | grep --line-buffered -v Warning
el "PyTorch rc=${PIPESTATUS[0]}"
fi
fi

# An extra bundle has no checks or pipelines (the default call runs them): the loops below find no jobs.
STEPS=$(cat "$G/jobs/steps" 2>/dev/null || echo 0) # test/gpu/cuda_target.py's, as the CPU references were run
[ "$MODE" = extra ] || echo "=== training checks: $STEPS steps, weights to OUT/trained.tar (compare_trained.py on the host)"
for job in "$G"/jobs/train-*/; do name=$(basename "$job")
  limit=60; if [ "$MODE" = table ]; then
    [ "$(left)" -lt 15 ] && { el "$name: skipped (budget)"; continue; }
    [ "$(left)" -lt 60 ] && limit=$(left)
  fi
  timeout "$limit" "$PIPERUN" "$job" --iters "$STEPS" --export-weights "$G/trained/$name" > "$G/$name.log" 2>&1; rc=$?
  el "$name rc=$rc: $(grep -o 'final loss.*' "$G/$name.log" | tail -1)"; [ $rc = 0 ] || tail -5 "$G/$name.log"
done
CURVE=$(cat "$G/jobs/curve_steps" 2>/dev/null || echo 0)
[ "$MODE" = extra ] || echo "=== loss curves: each bf16 check $CURVE steps (compare_curves.py on the host, against fp32 on a CPU rank)"
for job in "$G"/jobs/train-*-bf16/ "$G"/jobs/curve-*-bf16/; do
  example=$(basename "$job"); example=${example#train-}; example=${example#curve-}; example=${example%-bf16}
  [ "$CURVE" -gt 0 ] && [ "$MODE" != pipelines ] || continue
  if [ "$MODE" = table ] && [ "$(left)" -lt 10 ]; then el "curve-$example: skipped (budget)"; continue; fi
  timeout 60 "$PIPERUN" "$job" --iters "$CURVE" --log-every 1 > "$G/curve-$example-bf16.log" 2>&1
  el "curve-$example-bf16 rc=$?: $(grep -o 'loss [0-9.e+-]*' "$G/curve-$example-bf16.log" | tail -1)"
done
# Pipelines on one GPU (issue 48; docs/gpu-runs.md, "Pipelines on one GPU"): each pipe-* job on
# 2-4 ranks of this GPU, 3 steps as the checks, by each route pipelines.py lists (same-GPU links,
# staged, NCCL's own transport); its weights to OUT/trained.tar for `pipelines.py compare` on
# the host (against the 1-rank train-* weights above). Then one rank killed mid-run, per route:
# every rank must be gone within 30 s.
[ "$MODE" = extra ] || [ "$PIPELINES" = 0 ] || echo "=== pipelines on one GPU: $STEPS steps each, weights to OUT/trained.tar (pipelines.py compare on the host)"
export PATH=$G/bin:$PATH # mpirun finds orted beside it
pipeline() { # ranks job log [piperun arguments...]: mpirun of piperun on this GPU
  local ranks=$1 job=$2 log=$3; shift 3
  "$G/bin/mpirun" --oversubscribe --bind-to none -np "$ranks" "$PIPERUN" "$job" "$@" > "$log" 2>&1 < /dev/null
}
[ "$PIPELINES" = 1 ] && while read -r name ranks route env; do
  job=$G/jobs/$name; [ -d "$job" ] || continue
  if [ "$MODE" = table ] && [ "$(left)" -lt 25 ]; then el "$name over $route: skipped (budget)"; continue; fi
  env $env timeout 60 bash -c "$(declare -f pipeline); G=$G PIPERUN=$PIPERUN pipeline $ranks $job $G/$name-$route.log \
    --iters $STEPS --export-weights $G/trained/$name-$route"; rc=$?
  el "$name over $route ($ranks ranks) rc=$rc: $(grep -o 'final loss.*' "$G/$name-$route.log" | tail -1)"
  [ $rc = 0 ] || tail -5 "$G/$name-$route.log"
  grep -h "^piperun:   " "$G/$name-$route.log" | sort -u | head -3
done < <(python3 "$HERE/pipelines.py" runs)
for route in $([ "$PIPELINES" = 1 ] && echo links nccl); do
  name=$(python3 "$HERE/pipelines.py" jobs | awk '$3 == "1f1b" && $4 == 4 {print $1; exit}'); job=$G/jobs/$name
  [ -d "$job" ] || continue
  if [ "$MODE" = table ] && [ "$(left)" -lt 45 ]; then el "kill over $route: skipped (budget)"; continue; fi
  env $( [ $route = nccl ] && echo PIPEC_NCCL_SAME_GPU=1 ) timeout -k 5 90 bash -c "$(declare -f pipeline); \
    G=$G PIPERUN=$PIPERUN pipeline 4 $job $G/kill-$route.log --iters 1000000 --log-every 1" &
  launcher=$!
  for _ in $(seq 200); do grep -q "iter 2/" "$G/kill-$route.log" 2>/dev/null && break; sleep 0.1; done
  victim=$(pgrep -f "^$PIPERUN $job" | sed -n 2p); t=$(date +%s)
  [ -n "$victim" ] && kill -9 "$victim"
  wait $launcher; rc=$?
  el "kill over $route: rank pid ${victim:-none} killed; every rank gone after $(( $(date +%s) - t )) s" \
     "(exit $rc, $(pgrep -f "^$PIPERUN $job" | wc -l) left)"
done

# One tar each (the device tool returns at most 8 files from OUT): the trained weights, and
# every piperun log whole (the table above shows their last lines only).
[ -d "$G/trained" ] && tar -C "$G" -cf "$OUT/trained.tar" trained
(cd "$G" && tar -cf "$OUT/logs.tar" ./*.log)

if [ "$MODE" = table ]; then
  echo "=== the table"
  python3 "$HERE/report.py" table "$G/models/table_models.json" "$G/rows.jsonl" "$G/torch.jsonl" \
    --out "$OUT" --device "$CARD"
fi

if [ "$MODE" = extra ]; then
echo "=== speed: ms/iter of 8 iterations"
for job in "$G"/jobs/r50-*/ "$G"/jobs/mnv2-*/ "$G"/jobs/bench-*/ "$G"/jobs/mb-*/; do name=$(basename "$job")
  timeout 150 "$PIPERUN" "$job" --iters 8 --log-every 1 > "$G/$name.log" 2>&1; rc=$?
  el "$name rc=$rc: $(grep -o '[0-9.]* ms/iter' "$G/$name.log" | tr '\n' ' ')"; [ $rc = 0 ] || tail -8 "$G/$name.log"
done
echo "=== op profiles"
mkdir -p "$G/profiles"
for name in r50-bf16 mnv2-bf16 bench-b4096-bf16; do
  [ -d "$G/jobs/$name" ] || continue
  timeout 120 "$PIPERUN" "$G/jobs/$name" --iters 3 --profile "$G/profiles/profile-$name.json" --quiet
  el "$name profile rc=$?"
done
tar -C "$G" -cf "$OUT/profiles.tar" profiles
echo "=== PyTorch on the same GPU"
timeout 400 python3 "$HERE/torch_baseline.py" --old 2>&1 | grep -v Warning
fi
el end
