#!/usr/bin/env bash
# The README's test command: installs what is missing, builds, and runs every
# test (lit suite, GoogleTest units, ONNX conformance, end-to-end training,
# security corpus) through ctest, then a short run of the fuzz targets.
#   tools/test.sh --quick   the quick tier only (ctest -L quick: lit, the unit
#                           tests, a smoke training; docs/build.md, "Test tiers")
# Either way the ten slowest tests are printed at the end.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${PIPEC_BUILD_DIR:-$ROOT/build}"
quick=0
case "${1:-}" in
  --quick) quick=1 ;;
  "") ;;
  *) echo "usage: tools/test.sh [--quick]" >&2; exit 2 ;;
esac

# ctest, its output kept to print the ten slowest tests after it.
run_ctest() {
  local log status=0
  log="$(mktemp "${TMPDIR:-/tmp}/pipec-ctest.XXXXXX")"
  ctest --test-dir "$BUILD" --output-on-failure -j "${PIPEC_JOBS:-2}" "$@" | tee "$log" || status=$?
  echo "The ten slowest tests (seconds):"
  # awk reads all of sort's output (head would close the pipe early: SIGPIPE
  # under pipefail).
  sed -nE 's/^ *[0-9]+\/[0-9]+ Test +#[0-9]+: ([^ ]+) [.* ]+[A-Za-z* ]+ +([0-9.]+) sec$/\2 \1/p' "$log" |
    sort -rn | awk 'NR <= 10 {printf "  %8.1f  %s\n", $1, $2}'
  rm -f "$log"
  return "$status"
}
# The Debian packages first (the build needs them); the Python test oracles
# (tools/setup.sh python: a pip download into .venv, which only ctest uses)
# install while pipec builds.
"$ROOT/tools/setup.sh" debian
venv_log="$(mktemp "${TMPDIR:-/tmp}/pipec-venv-setup.XXXXXX")"
"$ROOT/tools/setup.sh" python >"$venv_log" 2>&1 &
venv_setup=$!
PIPEC_SETUP=debian "$ROOT/tools/build.sh"
venv_status=0
wait "$venv_setup" || venv_status=$?
cat "$venv_log"
rm -f "$venv_log"
if ((venv_status != 0)); then
  echo "test.sh: installing the Python test oracles (tools/setup.sh python) failed ($venv_status)" >&2
  exit "$venv_status"
fi

if ((quick)); then
  run_ctest -L quick
  exit 0
fi

# A short fuzz run (docs/security.md): the libFuzzer targets, built by
# tools/fuzz.sh with clang-22, ASan and UBSan in build-fuzz/, replay every saved
# regression input and then fuzz PIPEC_FUZZ_SECONDS (default 15) each.
# Longer campaigns: tools/fuzz.sh SECONDS.
# The fuzz targets build while the tests run, at the lowest priority: it gets
# the cores the tests leave idle (mpirun start-up, watchdog waits) and little
# else. PIPEC_FUZZ_BUILD_NICE=0 builds them at normal priority.
# Its plain C++ code at -O0 (PIPEC_FUZZ_PLAIN_OPT, docs/build.md): about half
# the CPU time of -O1, and a 15-second run needs no more speed; the regression
# inputs replay the same. Campaigns (tools/fuzz.sh SECONDS) build it at -O1.
fuzz_log="$(mktemp "${TMPDIR:-/tmp}/pipec-fuzz-build.XXXXXX")"
PIPEC_FUZZ_PLAIN_OPT="${PIPEC_FUZZ_PLAIN_OPT--O0}" nice -n "${PIPEC_FUZZ_BUILD_NICE:-19}" "$ROOT/tools/fuzz.sh" 0 >"$fuzz_log" 2>&1 &
fuzz_build=$!

status=0
run_ctest || status=$?

fuzz_status=0
wait "$fuzz_build" || fuzz_status=$?
cat "$fuzz_log"
rm -f "$fuzz_log"
((fuzz_status == 0)) || echo "test.sh: building the fuzz targets (tools/fuzz.sh 0) failed ($fuzz_status)" >&2
((status == 0)) || exit "$status"
((fuzz_status == 0)) || exit "$fuzz_status"
ctest --test-dir "$ROOT/build-fuzz" -L fuzz --output-on-failure -j "${PIPEC_JOBS:-2}"
