#!/usr/bin/env bash
# Installs what pipec needs to build and test on Debian 12, only when missing.
# Safe to run repeatedly; used by tools/test.sh, tools/demo.sh and .ci/run.
#   tools/setup.sh [all|debian|python]
# debian: the Debian packages (compilers, LLVM/MLIR, libraries: what the build
# needs); python: the venv with the test oracles (only ctest needs it, so
# tools/test.sh installs it while pipec builds); all (default): both.
set -euo pipefail
PART="${1:-all}"
case "$PART" in
  all|debian|python) ;;
  *) echo "usage: tools/setup.sh [all|debian|python]" >&2; exit 2 ;;
esac

DEBIAN_PACKAGES=(
  cmake ninja-build g++ lld pkg-config python3 python3-venv
  llvm-22-dev libmlir-22-dev mlir-22-tools llvm-22-tools
  libonnx-dev libprotobuf-dev protobuf-compiler
  libopenmpi-dev openmpi-bin libopenblas-dev
  libgtest-dev googletest nlohmann-json3-dev libcli11-dev libzip-dev
  libonnx-testdata python3-torch python3-numpy librsvg2-bin
  clang-22 libclang-rt-22-dev libfuzzer-22-dev
  coinor-libcbc-dev
)

if [[ "$PART" != python ]]; then
  missing=()
  for package in "${DEBIAN_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
  done
  if ((${#missing[@]})); then
    echo "setup: installing Debian packages: ${missing[*]}"
    SUDO=""
    if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
  fi
fi
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

# cuDNN's graph API (cudnn_frontend: header-only, MIT; PyPI's
# nvidia-cudnn-frontend, whose include/ is all the build uses) for the CUDA
# kernels' flash attention (docs/cuda-kernels.md), only where cuDNN itself is
# installed with the CUDA toolkit. Unpacked into .deps/, which CMake searches.
CUDNN_FRONTEND_VERSION=1.32.0
CUDNN_FRONTEND_DIR="$ROOT/.deps/cudnn-frontend-$CUDNN_FRONTEND_VERSION"
if [[ "$PART" != python && -f "${CUDA_HOME:-/usr/local/cuda}/include/cudnn.h" &&
      ! -f "$CUDNN_FRONTEND_DIR/include/cudnn_frontend.h" ]]; then
  echo "setup: fetching cudnn_frontend $CUDNN_FRONTEND_VERSION (headers) into $CUDNN_FRONTEND_DIR"
  fetch="$(mktemp -d "${TMPDIR:-/tmp}/pipec-cudnn-frontend.XXXXXX")"
  # Not fatal: without the headers the CUDA kernels build without flash attention (CMake says so).
  if /usr/bin/python3 -m venv "$fetch/venv" &&
     "$fetch/venv/bin/python" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
       "nvidia-cudnn-frontend==$CUDNN_FRONTEND_VERSION" -d "$fetch/wheel" &&
     /usr/bin/python3 - "$fetch/wheel" "$fetch/unpacked" <<'PY'
import pathlib, sys, zipfile
wheel = next(pathlib.Path(sys.argv[1]).glob("*.whl"))
with zipfile.ZipFile(wheel) as z:
    z.extractall(sys.argv[2], [n for n in z.namelist() if n.startswith("include/") or "/licenses/" in n])
PY
  then
    mkdir -p "$CUDNN_FRONTEND_DIR"
    rm -rf "$CUDNN_FRONTEND_DIR/include" "$CUDNN_FRONTEND_DIR/licenses"
    mv "$fetch/unpacked/include" "$CUDNN_FRONTEND_DIR/include"
    mv "$fetch/unpacked/"*.dist-info/licenses "$CUDNN_FRONTEND_DIR/licenses" 2>/dev/null || true
  else
    echo "setup: could not fetch cudnn_frontend from PyPI: the CUDA kernels build without flash attention" >&2
  fi
  rm -rf "$fetch"
fi
if [[ "$PART" == debian ]]; then
  exit 0
fi

# Test oracles from PyPI (onnx, onnxruntime) live in a venv that also sees Debian's torch.
VENV="${PIPEC_VENV:-$ROOT/.venv}"
if [[ ! -x "$VENV/bin/python" ]] || ! "$VENV/bin/python" -c "import onnx, onnxruntime, safetensors, torch" 2>/dev/null; then
  echo "setup: preparing Python test oracles in $VENV"
  /usr/bin/python3 -m venv --system-site-packages "$VENV"
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check "onnx==1.16.2" "onnxruntime==1.19.2" "safetensors==0.4.5" "numpy<2"
fi
