#!/usr/bin/env bash
# One fuzz test (ctest label fuzz): replays every saved regression input of
# the target once, then fuzzes for SECONDS from the seed corpus. Fails on any
# crash, sanitizer report, leak, timeout (10 s per input) or out-of-memory
# (2 GiB). New corpus entries go to WORK (in the build tree), never into
# the source tree. PIPEC_FUZZ_SECONDS in the environment overrides SECONDS.
#   run_fuzzer.sh FUZZER SECONDS CORPUS_DIR REGRESSION_DIR DICT WORK_DIR
set -euo pipefail
fuzzer=$1 seconds=${PIPEC_FUZZ_SECONDS:-$2} corpus=$3 regressions=$4 dict=$5 work=$6
common=(-timeout=10 -rss_limit_mb=2048 -close_fd_mask=3)
mkdir -p "$work/corpus" "$work/artifacts"
shopt -s nullglob
saved=("$regressions"/*)
if ((${#saved[@]})); then
  echo "replaying ${#saved[@]} regression input(s) from $regressions"
  "$fuzzer" "${common[@]}" -artifact_prefix="$work/artifacts/" "${saved[@]}"
fi
dictarg=()
[[ -f $dict ]] && dictarg=(-dict="$dict")
seeds=()
[[ -d $corpus ]] && seeds+=("$corpus")
[[ -d $regressions ]] && seeds+=("$regressions")
exec "$fuzzer" "${common[@]}" "${dictarg[@]}" -max_total_time="$seconds" -print_final_stats=1 \
  -artifact_prefix="$work/artifacts/" "$work/corpus" "${seeds[@]}"
