#!/usr/bin/env bash
# The README's test command: installs what is missing, builds, and runs every
# test (lit suite, GoogleTest units, ONNX conformance) through ctest.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${PIPEC_BUILD_DIR:-$ROOT/build}"
"$ROOT/tools/build.sh"
ctest --test-dir "$BUILD" --output-on-failure -j "${PIPEC_JOBS:-2}"

# The libFuzzer targets (fuzz/, docs/security.md) are not run here yet: their
# clang-22 ASan build was never completed on the development machine, so CI
# does not depend on it. Run them with tools/fuzz.sh SECONDS.
