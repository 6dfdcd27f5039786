#!/usr/bin/env bash
# The README's test command: installs what is missing, builds, and runs every
# test (lit suite, GoogleTest units, ONNX conformance, end-to-end training,
# security corpus) through ctest, then a short run of the fuzz targets.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${PIPEC_BUILD_DIR:-$ROOT/build}"
"$ROOT/tools/build.sh"
ctest --test-dir "$BUILD" --output-on-failure -j "${PIPEC_JOBS:-2}"

# A short fuzz run (docs/security.md): the libFuzzer targets, built by
# tools/fuzz.sh with clang-22, ASan and UBSan in build-fuzz/, replay every saved
# regression input and then fuzz PIPEC_FUZZ_SECONDS (default 15) each.
# Longer campaigns: tools/fuzz.sh SECONDS.
"$ROOT/tools/fuzz.sh" 0
ctest --test-dir "$ROOT/build-fuzz" -L fuzz --output-on-failure -j "${PIPEC_JOBS:-2}"
