#!/usr/bin/env bash
# The benchmarks in the loop (docs/build.md, "Benchmarks"): bench/schedule's
# grid, bench/codegen and bench/runtime on the built tree, each figure
# appended with its commit to bench/history.jsonl and printed beside the
# previous run on this machine. Wants an otherwise idle machine (minutes).
#   tools/bench.sh [--only schedule,codegen,runtime] [--no-append]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${PIPEC_BUILD_DIR:-$ROOT/build}"
[[ -x "$BUILD/bin/pipec" ]] || PIPEC_SETUP=debian "$ROOT/tools/build.sh"
exec python3 "$ROOT/bench/record.py" --build "$BUILD" "$@"
