#!/usr/bin/env python3
"""Compiler time and peak memory against model size (bench/scale/README.md).

For each size asked, writes a Llama-shaped model with external data
(llama_onnx.py, in a scratch folder), then runs and measures, each in a
process of its own:
  import   pipec M --micro-batch-size 1             (the import summary)
  plan     pipec M --gpus G --stages S --micro-batch-size 1
  job      pipec M --gpus G --stages S --micro-batch-size 1 --out D [--build]
and prints per size: wall time and peak resident memory (the process and
its children, e.g. the stage compilers of --build), and the ratio of the
peak to the bytes of the weights. The job folder and the model are removed
after each size (an 8B model's job holds 32 GB of float32 weights).

usage: run.py [--sizes tinyllama-1.1b,llama3-8b] [--gpus 1x8] [--stages 8]
              [--build] [--host-memory 1TiB] [--scratch DIR] [--pipec build/bin/pipec]
"""
import argparse
import os
import resource
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def measure(command):
    """(exit code, seconds, peak RSS in bytes, last output line) of one run,
    through a child python that waits for it alone."""
    probe = ("import resource,subprocess,sys,time;t=time.time();"
             "r=subprocess.run(sys.argv[1:],stdout=subprocess.PIPE,stderr=subprocess.STDOUT,text=True);"
             "print(r.returncode,time.time()-t,resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss*1024);"
             "print(r.stdout)")
    out = subprocess.run([sys.executable, "-c", probe] + command, stdout=subprocess.PIPE, text=True).stdout
    head, _, rest = out.partition("\n")
    code, seconds, peak = head.split()
    lines = [line for line in rest.splitlines() if line.strip()]
    return int(code), float(seconds), int(peak), lines


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="tinyllama-1.1b,llama3-8b")
    parser.add_argument("--gpus", default="1x8")
    parser.add_argument("--stages", default="8")
    parser.add_argument("--build", action="store_true")
    # The job is a CPU job (the default target), planned against the memory
    # of the host its ranks share: the models here need a large one.
    parser.add_argument("--host-memory", default="1TiB")
    parser.add_argument("--scratch", default="/tmp/pipec-bench-scale")
    parser.add_argument("--pipec", default=os.path.join(ROOT, "build", "bin", "pipec"))
    args = parser.parse_args()
    print(f"{'model':16} {'weights':>9} {'step':6} {'wall':>8} {'peak RSS':>10} {'peak/weights':>13}")
    for size in args.sizes.split(","):
        shutil.rmtree(args.scratch, ignore_errors=True)
        os.makedirs(args.scratch)
        model = os.path.join(args.scratch, size + ".onnx")
        subprocess.run([sys.executable, os.path.join(HERE, "llama_onnx.py"), model, "--size", size],
                       check=True, stdout=subprocess.DEVNULL)
        weights = os.path.getsize(model + ".data")
        plan = ["--gpus", args.gpus, "--stages", args.stages, "--micro-batch-size", "1"]
        steps = [("import", [model, "--micro-batch-size", "1"]), ("plan", [model] + plan),
                 ("job", [model] + plan + ["--host-memory", args.host_memory, "--out", os.path.join(args.scratch, "job")] +
                  (["--build"] if args.build else []))]
        for step, command in steps:
            code, seconds, peak, lines = measure([args.pipec] + command)
            status = "" if code == 0 else f"  exit {code}: {lines[-1] if lines else ''}"
            print(f"{size:16} {weights / 2**30:7.2f}Gi {step:6} {seconds:7.1f}s {peak / 2**20:8.0f}Mi "
                  f"{peak / weights:12.3f}{status}", flush=True)
        shutil.rmtree(args.scratch, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
