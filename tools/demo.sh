#!/usr/bin/env bash
# The README's main command: builds pipec if needed, then compiles an example
# model (default: examples/gpt.onnx) and shows what pipec makes of it.
#   tools/demo.sh [model.onnx] [pipec options...]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${PIPEC_BUILD_DIR:-$ROOT/build}"
mkdir -p "$BUILD"
"$ROOT/tools/build.sh" > "$BUILD/build.log" 2>&1 || { cat "$BUILD/build.log"; exit 1; }
MODEL="${1:-$ROOT/examples/gpt.onnx}"
shift || true
OUT="${PIPEC_OUT:-$ROOT/out}"
echo "== pipec $MODEL --dump-ir $OUT/ir $*"
"$BUILD/bin/pipec" "$MODEL" --dump-ir "$OUT/ir" "$@"
echo "== IR after each phase written to $OUT/ir:"
ls "$OUT/ir"
