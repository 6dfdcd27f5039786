#!/usr/bin/env python3
"""bench/codegen: launches, host syncs and activation bytes per micro-batch of
a 12-block GPT-2 CUDA stage (--precision bf16 -O2), counted without a GPU.

Prints the report of the ctest `cuda-launch-count`
(test/codegen/cuda_launch_count.py: the model, what is counted and how) from
a built tree, without holding the figures to test/codegen/launch_budget.json:
per entry point (forward, backward_input, backward_weight, the optimizer
step) the stream launches (kernels, cuBLAS / cuBLASLt GEMMs, copies and
memsets) and the calls that block the host, then the activation bytes kept
per micro-batch in flight at GPT-2 124M (micro-batch 4, context 1024).
Needs the build's pipec, stage_launch_count and the emulated CUDA kernel
library (built with the tests); no GPU, no nvcc, about 30 s.

    bench/codegen/launch_count.py [--build DIR] [--json FILE] [--keep DIR]
"""
import argparse
import glob
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--json", help="also write the figures and every call's counts here")
    ap.add_argument("--keep", help="keep the generated stages and the emulated library in this folder")
    a = ap.parse_args()
    build = os.path.abspath(a.build)
    counter = os.path.join(build, "test", "stage_launch_count")
    library = glob.glob(os.path.join(build, "**", "libpipec_cuda_kernels_emulated.a"), recursive=True)
    missing = [what for what, there in (("bin/pipec", os.path.exists(os.path.join(build, "bin", "pipec"))),
                                        ("test/stage_launch_count", os.path.exists(counter)),
                                        ("libpipec_cuda_kernels_emulated.a", bool(library))) if not there]
    if missing:
        sys.exit(f"launch_count: {build} lacks {', '.join(missing)}; build them first "
                 "(ninja -C BUILD pipec stage_launch_count pipec_cuda_kernels_emulated)")
    python = os.path.join(ROOT, ".venv", "bin", "python")
    cmd = [python if os.path.exists(python) else sys.executable,
           os.path.join(ROOT, "test", "codegen", "cuda_launch_count.py"),
           "--pipec", os.path.join(build, "bin", "pipec"), "--counter", counter,
           "--emulated-library", library[0],
           "--emulation-dir", os.path.join(ROOT, "test", "kernels", "cuda_emulation"),
           "--cxx", os.environ.get("CXX", "c++"), "--source-root", ROOT, "--no-budget"]
    if a.json:
        cmd += ["--json", a.json]
    if a.keep:
        cmd += ["--keep", a.keep]
    return subprocess.call(cmd)


if __name__ == "__main__":
    sys.exit(main())
