#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/) in build-fuzz/ with clang-22, ASan and
# UBSan, then fuzzes every target for SECONDS (default 60) from its seed
# corpus, one after the other (PIPEC_FUZZ_PARALLEL=N runs N at a time;
# PIPEC_FUZZ_NICE=N lowers their priority). SECONDS=0 only builds.
#   tools/fuzz.sh [SECONDS] [TARGET...]      (default: every target)
# New corpus entries go to build-fuzz/fuzz/campaign/<target>/corpus, findings
# (crash-*, leak-*, timeout-*, oom-*) and logs next to them; the script exits
# non-zero when any target found something. Minimize a finding with
#   build-fuzz/fuzz/bin/<target> -minimize_crash=1 -runs=100000 FILE
# and save it as fuzz/regressions/<target>/<name> so that ctest replays it.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${PIPEC_FUZZ_BUILD_DIR:-$ROOT/build-fuzz}"
SECONDS_EACH="${1:-60}"
shift || true
CLANG="${PIPEC_FUZZ_CC:-clang-22}"
CLANGXX="${PIPEC_FUZZ_CXX:-clang++-22}"
if ! command -v "$CLANGXX" >/dev/null; then
  echo "fuzz: $CLANGXX not found; tools/setup.sh installs clang-22, libclang-rt-22-dev and libfuzzer-22-dev" >&2
  exit 2
fi
# PIPEC_FUZZ_PLAIN_OPT=-O0 builds the non-MLIR code at -O0: about half the
# CPU time, slower fuzzing (tools/test.sh's short CI run; fuzz/CMakeLists.txt,
# docs/build.md). A build tree made with another value is reconfigured (and
# what it changes rebuilt).
PLAIN_OPT="${PIPEC_FUZZ_PLAIN_OPT:-}"
if [[ ! -f "$BUILD/build.ninja" ]] ||
   ! grep -qxF "PIPEC_FUZZ_PLAIN_OPT:STRING=$PLAIN_OPT" "$BUILD/CMakeCache.txt"; then
  # -O1 with line tables: fast enough to fuzz, readable stack traces. No PCH
  # (docs/build.md): few MLIR sources here, and clang refuses a mismatched one.
  # The system linker: Debian's lld is older than clang-22's sanitizer runtimes.
  cmake -S "$ROOT" -B "$BUILD" -G Ninja \
    -DCMAKE_C_COMPILER="$CLANG" -DCMAKE_CXX_COMPILER="$CLANGXX" \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -gline-tables-only -DNDEBUG" \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -gline-tables-only -DNDEBUG" \
    -DPIPEC_FUZZ_PLAIN_OPT="$PLAIN_OPT" \
    -DPIPEC_BUILD_FUZZERS=ON -DPIPEC_KERNELS_OPENMP=OFF -DPIPEC_BUILD_TESTS=OFF -DPIPEC_ENABLE_CUDA=OFF -DPIPEC_PCH=OFF -DPIPEC_USE_LLD=OFF \
    -DPIPEC_PYTHON="${PIPEC_PYTHON:-$ROOT/.venv/bin/python}"
fi
targets=("$@")
if ((${#targets[@]})); then
  ninja -C "$BUILD" -j "${PIPEC_JOBS:-2}" "${targets[@]}"
else
  ninja -C "$BUILD" -j "${PIPEC_JOBS:-2}" fuzz_targets
  for bin in "$BUILD"/fuzz/bin/fuzz_*; do targets+=("$(basename "$bin")"); done
fi
[[ "$SECONDS_EACH" == 0 ]] && exit 0
export ASAN_OPTIONS="${ASAN_OPTIONS:-abort_on_error=0:detect_leaks=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
status=0
run_one() {
  local t=$1 dir="$BUILD/fuzz/campaign/$1"
  mkdir -p "$dir/corpus"
  local seeds=("$ROOT/fuzz/corpus/$t")
  [[ -d "$ROOT/fuzz/regressions/$t" ]] && seeds+=("$ROOT/fuzz/regressions/$t")
  local dict=()
  local d
  d=$(sed -n "s/^ *pipec_add_fuzzer($t [^ ]* \\([^ )]*\\)).*/\\1/p" "$ROOT/fuzz/CMakeLists.txt")
  [[ -n "$d" && -f "$ROOT/fuzz/dicts/$d" ]] && dict=(-dict="$ROOT/fuzz/dicts/$d")
  echo "fuzz: $t for ${SECONDS_EACH}s (log $dir/fuzz.log)"
  if nice -n "${PIPEC_FUZZ_NICE:-0}" "$BUILD/fuzz/bin/$t" -max_total_time="$SECONDS_EACH" -timeout=10 -rss_limit_mb=2048 \
      -print_final_stats=1 -close_fd_mask=3 "${dict[@]}" -artifact_prefix="$dir/" \
      "$dir/corpus" "${seeds[@]}" >"$dir/fuzz.log" 2>&1; then
    echo "fuzz: $t: $(grep -Eo 'stat::number_of_executed_units: [0-9]+' "$dir/fuzz.log" | tail -1), no finding"
  else
    echo "fuzz: $t: FINDING, see $dir/fuzz.log and $dir/" >&2
    return 1
  fi
}
parallel="${PIPEC_FUZZ_PARALLEL:-1}"
pids=()
for t in "${targets[@]}"; do
  run_one "$t" &
  pids+=($!)
  if ((${#pids[@]} >= parallel)); then
    wait "${pids[0]}" || status=1
    pids=("${pids[@]:1}")
  fi
done
for p in "${pids[@]}"; do wait "$p" || status=1; done
exit $status
