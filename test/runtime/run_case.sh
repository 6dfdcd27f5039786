#!/bin/bash
# One runtime test case: run_case.sh NAME MODE NP CONFIG [make_test_plan args...]
# Environment (set by CMake): BIN (piperun, pipeseq), TOOLS (make_test_plan,
# compare_weights), LIBS (tiny stage libraries), WORK (scratch directory);
# optional: PIPERUN (another piperun: the emulated CUDA one) and TARGET=cuda
# (the plan's runtime.target, for stage libraries built for it).
set -uo pipefail
name=$1 mode=$2 np=$3 cfg=$4
shift 4
dir=$WORK/$name
rm -rf "$dir" && mkdir -p "$dir"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
MPIRUN=(timeout -k 5 30 mpirun --oversubscribe --mca btl self,vader --mca btl_vader_single_copy_mechanism none -np)
ITERS=3
# Layer widths of each tiny stage-library configuration (CMakeLists.txt).
case $cfg in
mlp2 | badabi) dims=6,8,4 ;;
mlp3) dims=6,8,8,4 ;;
mlp4) dims=6,8,8,8,4 ;;
tied2) dims=6,8,6 ;;
tied3) dims=6,8,8,6 ;;
tied4) dims=6,8,8,8,6 ;;
esac
die() { echo "run_case $name: FAIL: $*" >&2; exit 1; }

# TARGET=cuda: piperun runs the plan for target cuda with the stage
# libraries built for it (libtiny_cuda_<cfg>), pipeseq (the reference, on
# the host) the same plan for cpu (refplan).
libs=$LIBS/libtiny_${cfg}_stage_ refplan=$dir/plan
[ "${TARGET:-cpu}" = cuda ] && libs=$LIBS/libtiny_cuda_${cfg}_stage_ refplan=$dir/refplan
"$TOOLS/make_test_plan" --out "$dir/plan" --libs "$libs" --dims $dims "$@" || die "make_test_plan"
PIPERUN=${PIPERUN:-$BIN/piperun}
if [ "${TARGET:-cpu}" = cuda ]; then
  "$TOOLS/make_test_plan" --out "$refplan" --libs "$LIBS/libtiny_${cfg}_stage_" --dims $dims "$@" || die "make_test_plan"
  python3 - "$dir/plan/plan.json" <<'PY' || die "editing the plan"
import json, sys
p = json.load(open(sys.argv[1]))
p["runtime"].update(target="cuda", precision="fp32")
json.dump(p, open(sys.argv[1], "w"))
PY
fi

piperun() { "${MPIRUN[@]}" "$np" "$PIPERUN" "$dir/plan" --watchdog 20 "$@"; }

expect_error() { # expect_error PATTERN piperun-args...
  local pattern=$1
  shift
  local start=$SECONDS
  piperun "$@" >"$dir/out.txt" 2>"$dir/err.txt"
  local rc=$?
  cat "$dir/out.txt" "$dir/err.txt"
  [ $rc -ne 0 ] || die "piperun succeeded, expected an error"
  [ $rc -ne 124 ] && [ $rc -ne 137 ] || die "piperun hung (timeout)"
  grep -q -- "$pattern" "$dir/err.txt" || die "stderr lacks \"$pattern\""
  grep -q "piperun: rank [0-9]" "$dir/err.txt" || die "the message does not name the rank"
  [ $((SECONDS - start)) -le 15 ] || die "took $((SECONDS - start)) s"
  echo "run_case $name: OK (exit $rc)"
  exit 0
}

case $mode in
eq | eq-data | eq-staged)
  data=()
  if [ "$mode" = eq-data ]; then
    "$TOOLS/make_test_plan" --out "$refplan" --libs "$LIBS/libtiny_${cfg}_stage_" --dims $dims "$@" --write-dataset "$dir/data.bin" 40 ||
      die "dataset"
    data=(--data "$dir/data.bin")
  fi
  piperun --iters $ITERS "${data[@]}" --export-weights "$dir/pipe" >"$dir/out.txt" || die "piperun failed"
  cat "$dir/out.txt"
  # eq-staged: every route printed at start-up fell back to host memory.
  [ "$mode" != eq-staged ] || { grep -q "staged through host memory (CUDA IPC refused at the open" "$dir/out.txt" &&
    ! grep -q "same GPU, CUDA IPC" "$dir/out.txt"; } || die "the links did not fall back to staging"
  "$BIN/pipeseq" "$refplan" --iters $ITERS "${data[@]}" --export-weights "$dir/ref" || die "pipeseq failed"
  "$TOOLS/compare_weights" "$dir/pipe" "$dir/ref" --rtol 1e-4 --atol 1e-6 --differs-from "$dir/plan/weights" ||
    die "weights differ from the reference"
  ;;
resume)
  piperun --iters 4 --export-weights "$dir/straight" --quiet || die "uninterrupted run"
  piperun --iters 2 --checkpoint "$dir/ckpt" --save-every 2 --quiet || die "first half"
  [ -f "$dir/ckpt/latest" ] && [ -f "$dir/ckpt/iter_2/manifest.json" ] || die "no checkpoint written"
  ls "$dir/ckpt" | grep -q tmp && die "temporary checkpoint left behind"
  piperun --iters 4 --resume "$dir/ckpt" --export-weights "$dir/resumed" || die "resumed run"
  "$TOOLS/compare_weights" "$dir/resumed" "$dir/straight" --rtol 0 --atol 0 --differs-from "$dir/plan/weights" ||
    die "resume differs from the uninterrupted run"
  "$BIN/pipeseq" "$refplan" --iters 4 --export-weights "$dir/ref" >/dev/null || die "pipeseq"
  "$TOOLS/compare_weights" "$dir/resumed" "$dir/ref" --rtol 1e-4 --atol 1e-6 || die "resume differs from the reference"
  # A tied tensor is in the file of every stage that holds it: resuming from
  # copies that differ is refused, naming the tensor (the copies are
  # compared piece by piece from the files).
  if python3 - "$dir/ckpt/iter_2" <<'PY'
import os, struct, sys
d = sys.argv[1]
def tensors(path):
    b = open(path, "rb").read()
    n = struct.unpack_from("<Q", b, 8)[0]; o = 16; out = {}
    for _ in range(n):
        (l,) = struct.unpack_from("<I", b, o); name = b[o + 4:o + 4 + l].decode(); o += 4 + l
        dtype, rank = struct.unpack_from("<II", b, o); o += 8 + 8 * rank
        (nbytes,) = struct.unpack_from("<Q", b, o); o += 8
        out[name] = (o, nbytes); o += nbytes
    return out
files = sorted(f for f in os.listdir(d) if f.startswith("stage_"))
seen = {}
for f in files:
    for name, (off, nbytes) in tensors(os.path.join(d, f)).items():
        if name.startswith("param/") and nbytes >= 4 and name in seen:
            with open(os.path.join(d, f), "r+b") as h:
                h.seek(off + nbytes - 4); h.write(b"\x7f\x7f\x7f\x7f")
            print(name); sys.exit(0)
        seen[name] = f
sys.exit(1)
PY
  then
    piperun --iters 4 --resume "$dir/ckpt" --quiet >"$dir/tied.txt" 2>&1 && die "resumed from tied copies that differ"
    grep -q "differs from its copy in .* (a tied parameter)" "$dir/tied.txt" || { cat "$dir/tied.txt"; die "no message naming the tied copy"; }
  fi
  ;;
trace)
  piperun --iters 3 --trace "$dir/trace.json" --profile "$dir/profile.json" >"$dir/out.txt" || die "piperun"
  cat "$dir/out.txt"
  grep -q "iter 3/3  loss" "$dir/out.txt" || die "no loss line"
  grep -q "piperun: .*: schedule zb-h1, 2 stages x 1 chunk, 4 micro-batches of 4, 2 ranks, target cpu (fp32), transport mpi" \
    "$dir/out.txt" || die "no start-up banner"
  python3 - "$dir/trace.json" "$dir/profile.json" "$np" <<'PY' || die "trace/profile check"
import json, sys
trace, prof, np = json.load(open(sys.argv[1])), json.load(open(sys.argv[2])), int(sys.argv[3])
ev = trace["traceEvents"]
tids = {e["tid"] for e in ev if e.get("ph") == "X"}
assert tids == set(range(np)), tids
for r in range(np):
    f = [e for e in ev if e.get("ph") == "X" and e["tid"] == r and e["cat"] == "FWD"]
    assert len(f) == 3 * 4, (r, len(f))  # 3 iterations x 4 micro-batches
    assert all(e["dur"] >= 0 for e in f)
flows = [e for e in ev if e.get("ph") in ("s", "f")]
assert len(flows) == 2 * 2 * 3 * 4, len(flows)  # act + grad per micro-batch, s+f each
assert prof["format"] == "pipec.profile/1"
names = sorted(o["name"] for o in prof["ops"])
assert names == ["fc0", "fc1"], names
for o in prof["ops"]:
    assert o["fwd_s"] > 0 and o["bwd_input_s"] > 0 and o["bwd_weight_s"] > 0, o
print("trace and profile OK")
PY
  ;;
export)
  { [ -x "$PYTHON" ] && "$PYTHON" -c "import onnx" 2>/dev/null; } || { echo "SKIP: no python with onnx at $PYTHON"; exit 77; }
  piperun --iters 2 --export-weights "$dir/trained" --quiet || die "piperun"
  "$PYTHON" - "$dir" "$EXPORT_TO_ONNX" <<'PY' || die "export_to_onnx check"
import subprocess, sys
import numpy as np, onnx
from onnx import helper, numpy_helper, TensorProto
d, script = sys.argv[1], sys.argv[2]
sys.path.insert(0, script.rsplit("/", 1)[0])
from export_to_onnx import read_tensor_file
init = read_tensor_file(f"{d}/plan/weights/stage_0.bin") | read_tensor_file(f"{d}/plan/weights/stage_1.bin")
# The tiny MLP as ONNX: Gemm(transB=1) + Tanh, Gemm; initializers = the plan's initial weights.
nodes = [helper.make_node("Gemm", ["x", "fc0.weight", "fc0.bias"], ["z0"], transB=1), helper.make_node("Tanh", ["z0"], ["h1"]),
         helper.make_node("Gemm", ["h1", "fc1.weight", "fc1.bias"], ["out"], transB=1)]
g = helper.make_graph(nodes, "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 6])],
                      [helper.make_tensor_value_info("out", TensorProto.FLOAT, [4, 4])],
                      [numpy_helper.from_array(v, k) for k, v in init.items()])
onnx.save(helper.make_model(g), f"{d}/model.onnx")
subprocess.run([sys.executable, script, f"{d}/model.onnx", f"{d}/trained", f"{d}/trained.onnx"], check=True)
trained = read_tensor_file(f"{d}/trained/stage_0.bin") | read_tensor_file(f"{d}/trained/stage_1.bin")
m = onnx.load(f"{d}/trained.onnx")
got = {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}
assert got.keys() == trained.keys()
for k in got:
    assert np.array_equal(got[k], trained[k]), k
    assert not np.array_equal(got[k], init[k]), k + " did not train"
# A mismatching model is refused.
bad = helper.make_graph(nodes, "tiny", g.input, g.output, [numpy_helper.from_array(np.zeros((3, 3), np.float32), "fc0.weight")])
onnx.save(helper.make_model(bad), f"{d}/bad.onnx")
r = subprocess.run([sys.executable, script, f"{d}/bad.onnx", f"{d}/trained", f"{d}/x.onnx"], capture_output=True, text=True)
assert r.returncode == 1 and "fc0.weight" in r.stderr, r.stderr
print("export_to_onnx OK")
PY
  ;;
err-ranks) expect_error "the plan needs 2 ranks" --iters 1 ;;
err-lib)
  sed -i 's#libtiny_[a-z0-9]*_stage_1.so#does-not-exist/libstage_1.so#' "$dir/plan/plan.json"
  expect_error "cannot load stage library" --iters 1
  ;;
err-abi) expect_error "stage ABI version 99" --iters 1 ;;
err-data)
  head -c 100 /dev/urandom >"$dir/garbage.bin"
  expect_error "not a pipec data set" --iters 1 --data "$dir/garbage.bin"
  ;;
err-weights)
  truncate -s 60 "$dir/plan/weights/stage_1.bin"
  expect_error "truncated file" --iters 1
  ;;
err-tied-async) expect_error "not supported with an asynchronous schedule" --iters 1 ;;
err-order)
  # Rank 1 receives micro-batch 1's activation before micro-batch 0's.
  python3 - "$dir/plan/schedule/rank_1.json" <<'PY' || die "editing the stream"
import json, sys
s = json.load(open(sys.argv[1]))
recv = [i for i, x in enumerate(s["instructions"]) if x["op"] == "RECV_ACT"]
a, b = recv[0], recv[1]
s["instructions"][a]["mb"], s["instructions"][b]["mb"] = s["instructions"][b]["mb"], s["instructions"][a]["mb"]
json.dump(s, open(sys.argv[1], "w"))
PY
  expect_error "transfers from rank 0 to rank 1 .* are out of order: transfer 1 is the activation of micro-batch 0 .* but the activation of micro-batch 1" --iters 1
  ;;
err-cuda | err-cuda-trace)
  python3 - "$dir/plan/plan.json" <<'PY' || die "editing the plan"
import json, sys
p = json.load(open(sys.argv[1]))
p["runtime"].update(target="cuda", precision="bf16", cuda_arch=["sm_80", "sm_90"], gpu="H100")
json.dump(p, open(sys.argv[1], "w"))
PY
  if [ "$mode" = err-cuda ]; then
    expect_error "built without CUDA\|no usable CUDA device\|generated for target cpu" --iters 1
  else
    expect_error "built without CUDA\|--trace .* not supported with runtime.target \"cuda\"" --iters 1 --trace "$dir/t.json"
  fi
  ;;
err-tied-missing) expect_error "has no parameter of that name" --iters 1 ;;
# Ranks sharing a GPU (the emulated CUDA target): a value of
# PIPEC_SAME_GPU_TRANSPORT piperun does not know, and IPC demanded where the
# machine refuses it; every rank exits with the reason, none waits.
err-same-gpu-env) PIPEC_SAME_GPU_TRANSPORT=bogus expect_error 'PIPEC_SAME_GPU_TRANSPORT is "bogus"; it takes auto, ipc or staged' --iters 1 ;;
err-ipc-refused) PIPEC_SAME_GPU_TRANSPORT=ipc expect_error "PIPEC_SAME_GPU_TRANSPORT=ipc, but CUDA IPC refused" --iters 1 ;;
# A bundle whose header arrives wrong (the emulation flips a byte of rank
# 1's second bundle copy): the run fails naming the receive, in the same
# iteration (the device made the bundle unusable before the compute).
err-corrupt) PIPEC_EMU_CORRUPT_TRANSFER=1:2 expect_error "received a bundle for iteration 1 micro-batch" --iters 3 ;;
# One rank's NCCL communicator fails to form while the others wait inside
# theirs: that rank ends the job at once (the others would never reach the
# start-up agreement); every rank is gone within expect_error's 15 s.
err-nccl-init) PIPEC_EMU_NCCL_INIT_FAILS=1 expect_error "ncclCommInitRank .* failed: .*no network reaches the other members); ending the job" --iters 1 ;;
kill)
  # A rank killed mid-run (SIGKILL: a node lost): every rank is gone, and
  # mpirun exits non-zero, within 30 s.
  timeout -k 5 90 mpirun --oversubscribe --mca btl self,vader --mca btl_vader_single_copy_mechanism none -np "$np" \
    "$PIPERUN" "$dir/plan" --iters 1000000 --watchdog 20 >"$dir/out.txt" 2>"$dir/err.txt" &
  launcher=$!
  for _ in $(seq 300); do # training started: the first step's line
    grep -q "^step\|iteration\|loss" "$dir/out.txt" 2>/dev/null && break
    sleep 0.1
  done
  sleep 0.5
  victim=$(pgrep -f "^$PIPERUN $dir/plan" | sed -n 2p)
  [ -n "$victim" ] || { kill $launcher; die "no rank to kill (did piperun start?): $(cat "$dir/err.txt")"; }
  kill -9 "$victim"
  start=$SECONDS
  wait $launcher
  rc=$?
  took=$((SECONDS - start))
  left=$(pgrep -f "^$PIPERUN $dir/plan" | wc -l)
  cat "$dir/err.txt" | tail -5
  [ $rc -ne 0 ] || die "mpirun exited 0 after a rank was killed"
  # (mpirun passes the killed rank's status on: 137 is not a timeout here)
  [ $rc -ne 124 ] || die "the job hung after a rank was killed"
  [ "$left" -eq 0 ] || die "$left ranks still running"
  [ $took -le 30 ] || die "took $took s to stop"
  echo "run_case $name: OK (every rank gone $took s after the kill, exit $rc)"
  ;;
*) die "unknown mode $mode" ;;
esac
echo "run_case $name: OK"
