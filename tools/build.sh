#!/usr/bin/env bash
# Configures and builds pipec in build/ (Ninja, Release), after installing
# what is missing. Used by tools/test.sh and tools/demo.sh.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${PIPEC_BUILD_DIR:-$ROOT/build}"
# PIPEC_SETUP=debian: tools/test.sh installs the Python test oracles itself,
# while this builds.
"$ROOT/tools/setup.sh" "${PIPEC_SETUP:-all}"
if [[ ! -f "$BUILD/build.ninja" ]]; then
  cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release
fi
# Two jobs: MLIR translation units need about 1.5 GiB each.
ninja -C "$BUILD" -j "${PIPEC_JOBS:-2}"
