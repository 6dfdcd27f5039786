#!/usr/bin/env python3
"""bench/runtime: pipeline speed-up of piperun and generated-code speed vs PyTorch.

Builds an MLP of LAYERS Linear(WIDTH, WIDTH) layers (ReLU between, the last
one's output = WIDTH logits; pipec appends softmax cross-entropy), exports it
with PyTorch's ONNX exporter into a temporary directory, compiles it with the
real compiler twice

    pipec MODEL --gpus 1x2 --stages 2 --no-replication --microbatches M --out DIR2 --build
    pipec MODEL --gpus 1x1 --microbatches M --out DIR1 --build

and runs `mpirun -np 2 piperun DIR2` and `mpirun -np 1 piperun DIR1` with
OPENBLAS_NUM_THREADS=1 (one core per rank). Then it times the same model in
PyTorch on one thread (torch.set_num_threads(1) and OpenBLAS on one
thread: OPENBLAS_NUM_THREADS=1, set before torch loads): per iteration M
micro-batches of B samples forward + backward (gradients accumulated), then
one AdamW step, which is exactly one piperun iteration. It prints

  * 2-stage pipeline on 2 ranks vs 1 rank: ms/iter, samples/s, speed-up
    (goal >= 1.7x on a 2-core machine; 1F1B's ideal is 2M/(M+1));
  * generated CPU code on 1 rank vs PyTorch on 1 thread: ms/iter and ratio.

Times are medians over the measured iterations (the first WARMUP are
dropped). A control row runs two independent 1-rank jobs at once: if each is
much slower than one alone, the cores are not free (a shared machine) and the
pipeline speed-up is bounded by that capacity, not by piperun. The default
model has 8 layers so that the two stages are nearly balanced (stage 0's
first layer computes no input gradient: 11 vs 12 GEMMs per micro-batch). Needs torch (Debian's python3-torch: run with /usr/bin/python3),
mpirun, and a built tree (build/bin/pipec, build/bin/piperun). Never run by
ctest: it takes about a minute and wants an otherwise idle machine.

With --target cuda (a machine with 2 GPUs, pipec built with nvcc) the same
runs use CUDA stages, one GPU per rank and NCCL; the control row is skipped
(GPUs are not shared) and PyTorch runs on one GPU when its CUDA build is
installed (else that row is skipped).

    /usr/bin/python3 bench/runtime/bench_runtime.py [--build DIR] [--width 1024]
        [--layers 8] [--batch 64] [--microbatches 16] [--iters 3] [--warmup 1] [--keep DIR]
        [--target cpu|cuda] [--precision fp32|tf32|bf16]
"""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# PyTorch's "1 thread" row: torch.set_num_threads(1) sets OpenMP's team but
# not OpenBLAS's, whose pthread build (Debian's torch links it) otherwise runs
# its sgemm on every core; OpenBLAS reads this when torch first loads it, so
# it is set before this script first imports torch (in its functions).
os.environ["OPENBLAS_NUM_THREADS"] = "1"


def export_model(path, width, layers, batch):
    import torch
    import torch.nn as nn

    sys.path.insert(0, os.path.join(ROOT, "examples"))
    from make_examples import onnx_export  # dynamo=False where torch has the keyword

    torch.manual_seed(0)
    model = make_model(width, layers)
    model.train()
    onnx_export(model, (torch.randn(batch, width),), path, opset_version=13,
                training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False,
                input_names=["x"], output_names=["logits"])
    return model


def make_model(width, layers):
    import torch.nn as nn

    mods = []
    for i in range(layers):
        mods.append(nn.Linear(width, width))
        if i + 1 < layers:
            mods.append(nn.ReLU())
    return nn.Sequential(*mods)


def run(cmd, env=None, what=""):
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        sys.stderr.write(f"bench_runtime: {what or cmd[0]} failed (exit {r.returncode}):\n{r.stdout}{r.stderr}")
        sys.exit(1)
    return r.stdout


def compile_plan(build, model, out, gpus, microbatches, stages, target="cpu", precision="fp32"):
    cmd = [os.path.join(build, "bin", "pipec"), model, "--gpus", gpus, "--microbatches", str(microbatches),
           "--out", out, "--build", "--target", target, "--precision", precision]
    if stages > 1:
        cmd += ["--stages", str(stages), "--no-replication"]
    text = run(cmd, what=f"pipec ({gpus})")
    # The partition table: "0     /fc1/Gemm .. /fc2/Gemm (3) ..."
    rows = [l for l in text.splitlines() if re.match(r"^\d+\s+\S", l)]
    return rows


ENV = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", OMPI_ALLOW_RUN_AS_ROOT="1",
           OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")


def piperun_cmd(build, plan, np_, iters):
    return ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", str(np_), os.path.join(build, "bin", "piperun"),
            plan, "--iters", str(iters), "--log-every", "1"]


def parse(out, iters, warmup):
    ms = [float(m.group(1)) for m in re.finditer(r"iter \d+/\d+\s+loss \S+\s+([0-9.]+) ms/iter", out)]
    if len(ms) != iters + warmup:
        sys.stderr.write(f"bench_runtime: unexpected piperun output:\n{out}")
        sys.exit(1)
    loss = re.findall(r"final loss ([0-9.eE+-]+|nan)", out)
    return statistics.median(ms[warmup:]), (loss[-1] if loss else "?")


def piperun(build, plan, np_, iters, warmup):
    return parse(run(piperun_cmd(build, plan, np_, iters + warmup), env=ENV, what=f"piperun -np {np_}"), iters, warmup)


def piperun_twice_at_once(build, plan, iters, warmup):
    """Two independent 1-rank runs at the same time: the parallel capacity the
    machine gives right now (both cores free: about the 1-rank time)."""
    procs = [subprocess.Popen(piperun_cmd(build, plan, 1, iters + warmup), env=ENV, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for _ in range(2)]
    outs = [p.communicate()[0] for p in procs]
    return max(parse(o, iters, warmup)[0] for o in outs)


def torch_time(width, layers, batch, microbatches, iters, warmup, device="cpu"):
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = make_model(width, layers).to(device)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    xs = [(torch.rand(batch, width) * 2 - 1).to(device) for _ in range(microbatches)]
    ys = [torch.randint(0, width, (batch,)).to(device) for _ in range(microbatches)]
    times = []
    for _ in range(iters + warmup):
        if device != "cpu":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=False)
        for x, y in zip(xs, ys):
            loss = F.cross_entropy(model(x), y) / microbatches
            loss.backward()
        opt.step()
        if device != "cpu":
            torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times[warmup:])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--batch", type=int, default=64, help="micro-batch size (the exported batch dimension)")
    ap.add_argument("--microbatches", type=int, default=16)
    ap.add_argument("--iters", type=int, default=3, help="measured iterations")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--target", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--precision", choices=["fp32", "tf32", "bf16"], default="fp32")
    ap.add_argument("--keep", help="build the plans here and keep them (default: a temporary directory)")
    ap.add_argument("--json", action="store_true", help="print one JSON object of the figures instead of the table")
    a = ap.parse_args()

    work = a.keep or tempfile.mkdtemp(prefix="pipec-bench-runtime-")
    os.makedirs(work, exist_ok=True)
    try:
        model = os.path.join(work, "mlp.onnx")
        export_model(model, a.width, a.layers, a.batch)
        M = a.microbatches
        rows2 = compile_plan(a.build, model, os.path.join(work, "p2"), "1x2", M, 2, a.target, a.precision)
        compile_plan(a.build, model, os.path.join(work, "p1"), "1x1", M, 1, a.target, a.precision)
        t1, loss1 = piperun(a.build, os.path.join(work, "p1"), 1, a.iters, a.warmup)
        t2, loss2 = piperun(a.build, os.path.join(work, "p2"), 2, a.iters, a.warmup)
        gpu = a.target == "cuda"
        tc = None if gpu else piperun_twice_at_once(a.build, os.path.join(work, "p1"), a.iters, a.warmup)
        tt = None
        try:
            import torch
            if not gpu or torch.cuda.is_available():
                tt = torch_time(a.width, a.layers, a.batch, M, a.iters, a.warmup, "cuda" if gpu else "cpu")
        except ImportError:
            pass
    finally:
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)

    samples = a.batch * M
    flops = 6.0 * a.layers * a.width * a.width * samples  # fwd + bwd of the linear layers
    if a.json:
        print(json.dumps({"one_rank_ms": round(t1, 2), "two_ranks_ms": round(t2, 2), "speedup": round(t1 / t2, 3),
                          "control_ms": None if tc is None else round(tc, 2),
                          "torch_ms": None if tt is None else round(tt, 2),
                          "ratio": None if tt is None else round(t1 / tt, 3),
                          "losses": [loss1, loss2]}))
        return
    print(f"model: MLP {a.layers} x Linear({a.width}, {a.width}), softmax cross-entropy; "
          f"{M} micro-batches of {a.batch} per iteration; median of {a.iters} iterations after {a.warmup} warm-up")
    print("2-stage partition:")
    for r in rows2:
        print("  " + r)
    print()
    print(f"{'run':44} {'ms/iter':>9} {'samples/s':>10} {'GFLOP/s':>8} {'ratio':>7}")
    print(f"{'piperun 1 rank (1 stage)':44} {t1:9.1f} {samples / t1 * 1e3:10.1f} {flops / t1 / 1e6:8.1f} {'1.00x':>7}")
    sp = t1 / t2
    print(f"{'piperun 2 ranks (2-stage 1F1B pipeline)':44} {t2:9.1f} {samples / t2 * 1e3:10.1f} {flops / t2 / 1e6:8.1f} "
          f"{sp:6.2f}x")
    if tc is not None:
        print(f"{'control: two 1-rank runs at once (each)':44} {tc:9.1f} {samples / tc * 1e3:10.1f} "
              f"{flops / tc / 1e6:8.1f} {2 * t1 / tc:6.2f}x")
    if tt is not None:
        label = "PyTorch 1 GPU (fwd+bwd+AdamW)" if gpu else "PyTorch 1 thread (fwd+bwd+AdamW)"
        print(f"{label:44} {tt:9.1f} {samples / tt * 1e3:10.1f} {flops / tt / 1e6:8.1f} {tt / t1:6.2f}x")
    print()
    ideal = 2.0 * M / (M + 1)
    print(f"pipeline speed-up 2 ranks / 1 rank: {sp:.2f}x (goal >= 1.70x; 1F1B ideal {ideal:.2f}x) "
          f"{'OK' if sp >= 1.7 else 'BELOW GOAL'}")
    if tc is not None:
        print(f"machine's parallel capacity now (control): {2 * t1 / tc:.2f}x; pipeline efficiency vs it: "
              f"{sp / (2 * t1 / tc) * 100:.0f}%")
    if tt is not None:
        print(f"generated code / PyTorch time per iteration ({'1 GPU' if gpu else '1 core'}): {t1 / tt:.2f} "
              f"(< 1: pipec faster)")
    print(f"final losses: 1 rank {loss1}, 2 ranks {loss2}")


if __name__ == "__main__":
    main()
