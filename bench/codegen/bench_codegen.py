#!/usr/bin/env python3
"""bench/codegen: generated CPU code vs PyTorch per model (time and memory), and GPT-2-124M compile time.

For each model (an MLP, a GPT-style transformer, a Llama-style transformer
whose RMSNorm, rotary embedding and causal attention are written as Hugging
Face's modeling_llama.py writes them, and a ResNet-style CNN, built here with
PyTorch and exported at run time with its ONNX exporter in training mode,
opset 13, no constant folding, as examples/make_examples.py does) it
compiles one 1-rank job with the real compiler

    pipec MODEL --gpus 1x1 --microbatches M --out DIR --build [-O..]

and trains it with `mpirun -np 1 piperun DIR --iters N` (plus `--threads T`
when piperun offers it; OPENBLAS_NUM_THREADS=OMP_NUM_THREADS=T in any case).
PyTorch trains the same model (same seed, sizes, micro-batches and batch,
torch.set_num_threads(T); with T > 1 both with OpenMP's default and its
passive waiting, the faster counts: `torch_wait_policy`) in a separate child
process: per iteration M
micro-batches forward + backward (gradients accumulated), then one AdamW step,
which is exactly one piperun iteration. Per model and thread count it reports
`pipec_ms` and `torch_ms` (medians of the measured iterations; the first
WARMUP are dropped), `ratio` = pipec_ms / torch_ms (goal <= 1.0; `ratio_min`
is the same for the fastest iterations, `pipec_min_ms` / `torch_min_ms`,
less disturbed on a shared machine), and the
peak resident set (VmHWM, from wait4's ru_maxrss) of the piperun process and
of the PyTorch child (`pipec_rss_mb`, `torch_rss_mb`; goal pipec <= torch).
The PyTorch child only builds the model and trains it (the export happens in
this parent process), but its peak includes torch's own library footprint:
that is what a PyTorch training job costs, so it is counted.

`--compile-gpt2` instead exports a GPT-2-124M-sized model (12 blocks, width
768, 12 heads, vocabulary 50257, context 1024 by default, tied head) and
measures `pipec MODEL --gpus 1x1 --microbatches 1 --out DIR` (compile to
sources and weights: wall time and peak RSS), then the same with `--build`,
timing each C++ compiler invocation pipec makes (a `c++` wrapper first on
PATH records wall time and peak RSS of every stage compilation).

Needs torch (Debian's python3-torch: run with /usr/bin/python3), mpirun and a
built tree (BUILD/bin/pipec, BUILD/bin/piperun). Never run by ctest: it takes
a few minutes and wants an otherwise idle machine; the load average is
printed with the results.

    /usr/bin/python3 bench/codegen/bench_codegen.py [--build DIR] [--json]
        [--threads 1,2] [--models mlp,gpt,llama,cnn] [--iters 3] [--warmup 1]
        [--keep DIR] [--opt -O2] [--compile-gpt2 [--gpt2-context 1024]]
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
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SELF = os.path.abspath(__file__)
PYTHON = sys.executable or "/usr/bin/python3"

# Model sizes: each pipec iteration takes about 1-3 s on one core of a 2-core
# machine, so the default run (3 models, 1 thread) finishes in a few minutes.
MODELS = {
    # name: (description, constructor kwargs, micro-batch size, micro-batches)
    "mlp": ("MLP 8 x Linear(1024, 1024), ReLU", dict(width=1024, layers=8), 64, 8),
    "gpt": ("GPT 4 blocks, width 256, 4 heads, context 128, vocab 2048, tied head, dropout 0.1",
            dict(vocab=2048, context=128, dim=256, heads=4, layers=4), 2, 2),
    # pipec fuses its RMSNorm (nn.layer_norm, centered = false), rotary
    # embedding (nn.rotary) and masked softmax (docs/optimization.md).
    "llama": ("Llama 4 blocks, width 256, 8 query / 2 key-value heads, context 128, vocab 2048, RMSNorm, "
              "rotary, SwiGLU 688",
              dict(vocab=2048, context=128, dim=256, heads=8, kv_heads=2, hidden=688, layers=4), 2, 2),
    "cnn": ("ResNet 3x32x32, stem 32 ch, 4 basic blocks (32, 64/2, 64, 128/2), 10 classes",
            dict(channels=32, classes=10), 16, 4),
}


# ---------------------------------------------------------------------------
# Models (PyTorch)

def torch_models():
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    sys.path.insert(0, os.path.join(ROOT, "examples"))
    from make_examples import GPT  # the example GPT (pre-norm blocks, masked softmax, erf GELU, dropout 0.1)

    class MLP(nn.Module):
        def __init__(self, width, layers):
            super().__init__()
            mods = []
            for i in range(layers):
                mods.append(nn.Linear(width, width))
                if i + 1 < layers:
                    mods.append(nn.ReLU())
            self.net = nn.Sequential(*mods)

        def forward(self, x):
            return self.net(x)

    class BasicBlock(nn.Module):
        """ResNet's basic block: conv/BN/ReLU/conv/BN plus the (projected) input, ReLU."""

        def __init__(self, cin, cout, stride):
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
            self.bn1 = nn.BatchNorm2d(cout)
            self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout)
            self.short = None
            if stride != 1 or cin != cout:
                self.short = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout))

        def forward(self, x):
            y = F.relu(self.bn1(self.conv1(x)))
            y = self.bn2(self.conv2(y))
            return F.relu(y + (x if self.short is None else self.short(x)))

    class ResNet(nn.Module):
        def __init__(self, channels, classes):
            super().__init__()
            c = channels
            self.stem = nn.Conv2d(3, c, 3, padding=1, bias=False)
            self.bn = nn.BatchNorm2d(c)
            self.blocks = nn.Sequential(BasicBlock(c, c, 1), BasicBlock(c, 2 * c, 2), BasicBlock(2 * c, 2 * c, 1),
                                        BasicBlock(2 * c, 4 * c, 2))
            self.fc = nn.Linear(4 * c, classes)

        def forward(self, x):
            x = self.blocks(F.relu(self.bn(self.stem(x))))
            x = torch.flatten(F.adaptive_avg_pool2d(x, 1), 1)
            return self.fc(x)

    class RMSNorm(nn.Module):
        """modeling_llama.py's LlamaRMSNorm."""

        def __init__(self, dim, eps=1e-6):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(dim))
            self.eps = eps

        def forward(self, x):
            variance = x.pow(2).mean(-1, keepdim=True)
            return self.weight * (x * torch.rsqrt(variance + self.eps))

    def rotate_half(x):
        x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
        return torch.cat((-x2, x1), dim=-1)

    class LlamaBlock(nn.Module):
        """A Llama decoder layer: grouped-query causal attention with rotary
        positions and a SwiGLU MLP, each after an RMSNorm, as modeling_llama.py
        (eager attention) computes them."""

        def __init__(self, dim, heads, kv_heads, hidden, context):
            super().__init__()
            self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
            self.q = nn.Linear(dim, dim, bias=False)
            self.k = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
            self.v = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
            self.o = nn.Linear(dim, dim, bias=False)
            self.gate = nn.Linear(dim, hidden, bias=False)
            self.up = nn.Linear(dim, hidden, bias=False)
            self.down = nn.Linear(hidden, dim, bias=False)
            self.norm1, self.norm2 = RMSNorm(dim), RMSNorm(dim)
            self.register_buffer("mask", torch.triu(torch.ones(context, context, dtype=torch.bool), 1))

        def forward(self, x, cos, sin):
            b, t, _ = x.shape
            h = self.norm1(x)
            q = self.q(h).view(b, t, self.heads, self.head_dim).transpose(1, 2)
            k = self.k(h).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
            v = self.v(h).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
            # modeling_llama.py's repeat_kv (torch 1.13 exports
            # repeat_interleave as a Loop).
            groups = self.heads // self.kv_heads
            k = k[:, :, None].expand(b, self.kv_heads, groups, t, self.head_dim).reshape(b, self.heads, t, -1)
            v = v[:, :, None].expand(b, self.kv_heads, groups, t, self.head_dim).reshape(b, self.heads, t, -1)
            scores = (q @ k.transpose(-2, -1)) / (self.head_dim ** 0.5)
            scores = scores.masked_fill(self.mask[:t, :t], float("-inf"))
            attn = torch.softmax(scores, dim=-1) @ v
            x = x + self.o(attn.transpose(1, 2).reshape(b, t, -1))
            h = self.norm2(x)
            return x + self.down(F.silu(self.gate(h)) * self.up(h))

    class Llama(nn.Module):
        def __init__(self, vocab, context, dim, heads, kv_heads, hidden, layers):
            super().__init__()
            self.embed = nn.Embedding(vocab, dim)
            self.blocks = nn.ModuleList([LlamaBlock(dim, heads, kv_heads, hidden, context) for _ in range(layers)])
            self.norm = RMSNorm(dim)
            self.head = nn.Linear(dim, vocab, bias=False)
            half = dim // heads // 2
            inv = 1.0 / (10000 ** (torch.arange(half, dtype=torch.float32) / half))
            angles = torch.arange(context, dtype=torch.float32)[:, None] * inv[None, :]
            emb = torch.cat((angles, angles), dim=-1)
            self.register_buffer("cos", emb.cos())
            self.register_buffer("sin", emb.sin())

        def forward(self, idx):
            t = idx.size(1)
            cos, sin = self.cos[:t], self.sin[:t]
            x = self.embed(idx)
            for block in self.blocks:
                x = block(x, cos, sin)
            return self.head(self.norm(x))

    return {"mlp": MLP, "gpt": GPT, "llama": Llama, "cnn": ResNet}


def make_model(name, kwargs):
    import torch

    torch.manual_seed(0)
    model = torch_models()[name](**kwargs)
    model.train()
    return model


def make_batch(name, kwargs, batch, seed):
    """One micro-batch (input, labels) for the model."""
    import torch

    g = torch.Generator().manual_seed(seed)
    if name == "mlp":
        w = kwargs["width"]
        return torch.rand(batch, w, generator=g) * 2 - 1, torch.randint(0, w, (batch,), generator=g)
    if name in ("gpt", "llama"):
        v, t = kwargs["vocab"], kwargs["context"]
        return torch.randint(0, v, (batch, t), generator=g), torch.randint(0, v, (batch, t), generator=g)
    return torch.rand(batch, 3, 32, 32, generator=g) * 2 - 1, torch.randint(0, kwargs["classes"], (batch,), generator=g)


def export(name, kwargs, batch, path):
    import torch

    sys.path.insert(0, os.path.join(ROOT, "examples"))
    from make_examples import onnx_export  # dynamo=False where torch has the keyword

    model = make_model(name, kwargs)
    x, _ = make_batch(name, kwargs, batch, 0)
    inputs = {"mlp": "x", "gpt": "tokens", "llama": "tokens", "cnn": "image"}[name]
    onnx_export(model, (x,), path, opset_version=13, training=torch.onnx.TrainingMode.TRAINING,
                do_constant_folding=False, input_names=[inputs], output_names=["logits"])


def torch_child(spec):
    """The PyTorch training loop (in its own process, whose peak RSS the parent reads)."""
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(spec["threads"])
    name, kwargs, batch, m = spec["model"], spec["kwargs"], spec["batch"], spec["microbatches"]
    model = make_model(name, kwargs)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    data = [make_batch(name, kwargs, batch, 1 + i) for i in range(m)]
    times, losses = [], []
    for _ in range(spec["iters"] + spec["warmup"]):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=False)
        total = 0.0
        for x, y in data:
            logits = model(x)
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1)) / m
            loss.backward()
            total += loss.item()
        opt.step()
        times.append((time.perf_counter() - t0) * 1e3)
        losses.append(total)
    print(json.dumps({"ms": statistics.median(times[spec["warmup"]:]), "times": times, "loss": losses[-1]}))


# ---------------------------------------------------------------------------
# Processes and their peak memory

def measured(cmd, env=None, cwd=None, timeout=None):
    """Runs cmd; returns (exit status, output, wall s, peak RSS in MiB of it and its waited-for descendants).
    After `timeout` seconds its process group is killed and the output ends with a line saying so."""
    # The peak comes from a small wrapper process (this script without torch,
    # --measure): a child forked from this parent would report the parent's
    # resident set (torch, the exported model) as its own peak, since Linux
    # keeps the pre-exec high-water mark in ru_maxrss.
    fd, log = tempfile.mkstemp(prefix="pipec-bench-rss-")
    os.close(fd)
    os.remove(log)
    cmd = [PYTHON, SELF, "--measure", log, "--"] + list(cmd)
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         start_new_session=timeout is not None)
    timer = None
    expired = []
    if timeout is not None:
        def kill():
            expired.append(True)
            try:
                os.killpg(p.pid, 9)
            except OSError:
                pass
        timer = threading.Timer(timeout, kill)
        timer.start()
    out = p.stdout.read().decode(errors="replace")
    p.stdout.close()
    p.wait()
    wall = time.perf_counter() - t0
    if timer:
        timer.cancel()
    rec = read_log(log)
    if os.path.exists(log):
        os.remove(log)
    if expired:
        out += f"\nerror: timed out after {timeout} s (killed)\n"
    return p.returncode, out, wall, (rec[-1]["rss_mb"] if rec else float("nan"))


def measure_wrapper(log, cmd):
    """`SELF --measure LOG -- CMD...`: runs CMD, appends its wall time and peak RSS to LOG, exits with its status."""
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd)
    _, status, usage = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    with open(log, "a") as f:
        f.write(json.dumps({"cmd": os.path.basename(cmd[0]), "wall_s": time.perf_counter() - t0,
                            "rss_mb": usage.ru_maxrss / 1024.0, "status": p.returncode}) + "\n")
    sys.exit(p.returncode if p.returncode >= 0 else 128 - p.returncode)


def read_log(log):
    if not os.path.exists(log):
        return []
    with open(log) as f:
        return [json.loads(line) for line in f if line.strip()]


def loadavg():
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def helps(binary):
    try:
        return subprocess.run([binary, "--help"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""


class Tools:
    def __init__(self, build, opt):
        self.pipec = os.path.join(build, "bin", "pipec")
        self.piperun = os.path.join(build, "bin", "piperun")
        for b in (self.pipec, self.piperun):
            if not os.access(b, os.X_OK):
                sys.exit(f"bench_codegen: {b} not found (build pipec first, or pass --build DIR)")
        self.piperun_threads = "--threads" in helps(self.piperun)
        self.opt = []
        if opt:
            # Passed through only when pipec lists an optimization-level option.
            if re.search(r"^\s+-{1,2}O[0-9=<]", helps(self.pipec), re.M):
                self.opt = [opt]
            else:
                sys.stderr.write(f"bench_codegen: pipec has no -O option; {opt} ignored\n")


def env_for(threads):
    return dict(os.environ, OPENBLAS_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads),
                OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")


def torch_envs_for(threads):
    """PyTorch's settings to try (its faster one counts): with several threads
    its OpenMP workers spin while OpenBLAS's own threads run a GEMM, and on
    as many cores as threads that made the MLP slower than on one thread
    (1018 ms at 2 threads against 490 at 1; with passive waiting 294), while
    its oneDNN convolutions do better spinning. pipec's OpenBLAS runs on one
    thread inside its OpenMP team, so piperun keeps the default."""
    if threads == 1:
        return {"default": env_for(threads)}
    return {"default": env_for(threads), "passive": dict(env_for(threads), OMP_WAIT_POLICY="PASSIVE")}


def retried(what, fn, tries=2):
    """The build tree may be rebuilt under a running benchmark: one retry (none after a time-out)."""
    for attempt in range(tries):
        status, out, *rest = fn()
        if status == 0 or "error: timed out after" in out:
            return (status, out, *rest)
        sys.stderr.write(f"bench_codegen: {what} failed (exit {status}){', retrying' if attempt + 1 < tries else ''}:\n"
                         f"{out[-4000:]}\n")
    return (status, out, *rest)


def first_error(out):
    lines = [l.strip() for l in out.splitlines() if "error" in l.lower()]
    return (lines[0] if lines else out.strip().splitlines()[-1] if out.strip() else "no output")[:400]


# ---------------------------------------------------------------------------
# The per-model comparison

def bench_model(tools, name, work, threads_list, iters, warmup):
    desc, kwargs, batch, m = MODELS[name]
    # OpenBLAS's kernels serve both sides' GEMMs (Debian's torch links it too);
    # an OPENBLAS_CORETYPE in the environment chooses them (AVX2 Haswell vs
    # AVX-512 SkylakeX changes both sides' times by 1.3-1.6x).
    base = {"model": name, "description": desc, "microbatch_size": batch, "microbatches": m,
            "openblas_coretype": os.environ.get("OPENBLAS_CORETYPE") or "detected"}
    onnx_path = os.path.join(work, f"{name}.onnx")
    export(name, kwargs, batch, onnx_path)
    job = os.path.join(work, f"{name}-job")
    shutil.rmtree(job, ignore_errors=True)
    cmd = [tools.pipec, onnx_path, "--gpus", "1x1", "--microbatches", str(m), "--out", job, "--build"] + tools.opt
    status, out, build_s, _ = retried(f"pipec {name}", lambda: measured(cmd, env=env_for(1)))
    rows = []
    if status != 0:
        for t in threads_list:
            rows.append(dict(base, threads=t, error="pipec: " + first_error(out), pipec_ms=None, torch_ms=None,
                             ratio=None, pipec_rss_mb=None, torch_rss_mb=None))
        return rows
    for t in threads_list:
        row = dict(base, threads=t, pipec_build_s=round(build_s, 1), loadavg_before=loadavg())
        env = env_for(t)
        log = os.path.join(work, f"{name}-t{t}-rss.log")
        run_cmd = ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", "1", PYTHON, SELF, "--measure", log, "--",
                   tools.piperun, job, "--iters", str(iters + warmup), "--log-every", "1"]
        if tools.piperun_threads:
            run_cmd += ["--threads", str(t)]

        def piperun():
            if os.path.exists(log):
                os.remove(log)
            return measured(run_cmd, env=env)

        status, out, _, _ = retried(f"piperun {name} ({t} thread{'s' if t > 1 else ''})", piperun)
        ms = [float(x) for x in re.findall(r"iter \d+/\d+\s+loss \S+\s+([0-9.]+) ms/iter", out)]
        rec = [r for r in read_log(log) if r["cmd"] == "piperun"]
        if status != 0 or len(ms) != iters + warmup or not rec:
            row.update(error="piperun: " + first_error(out), pipec_ms=None, pipec_rss_mb=None)
        else:
            row.update(pipec_ms=round(statistics.median(ms[warmup:]), 1), pipec_min_ms=round(min(ms[warmup:]), 1),
                       pipec_rss_mb=round(rec[-1]["rss_mb"], 1))
            loss = re.findall(r"final loss ([0-9.eE+-]+|nan)", out)
            row["pipec_loss"] = float(loss[-1]) if loss and loss[-1] != "nan" else None

        spec = dict(model=name, kwargs=kwargs, batch=batch, microbatches=m, threads=t, iters=iters, warmup=warmup)
        best, failure = None, None
        for policy, torch_env in torch_envs_for(t).items():
            status, out, _, rss = retried(f"torch {name}", lambda: measured([PYTHON, SELF, "--torch-child",
                                                                             json.dumps(spec)], env=torch_env))
            try:
                res = json.loads(out.strip().splitlines()[-1])
                run = dict(torch_ms=round(res["ms"], 1), torch_min_ms=round(min(res["times"][warmup:]), 1),
                           torch_rss_mb=round(rss, 1), torch_loss=res["loss"], torch_wait_policy=policy)
                if best is None or run["torch_ms"] < best["torch_ms"]:
                    best = run
            except (ValueError, IndexError, KeyError):
                failure = first_error(out)
        if best:
            row.update(best)
        else:
            row.update(torch_ms=None, torch_rss_mb=None)
            row["error"] = (row.get("error", "") + "; torch: " + failure).lstrip("; ")
        row["ratio"] = (round(row["pipec_ms"] / row["torch_ms"], 2)
                        if row.get("pipec_ms") and row.get("torch_ms") else None)
        # On a shared machine (steal time, other jobs) the fastest iterations
        # are the least disturbed ones: their ratio is printed beside.
        row["ratio_min"] = (round(row["pipec_min_ms"] / row["torch_min_ms"], 2)
                            if row.get("pipec_min_ms") and row.get("torch_min_ms") else None)
        row["loadavg_after"] = loadavg()
        rows.append(row)
    return rows


# ---------------------------------------------------------------------------
# GPT-2-124M compile and build time

def bench_gpt2(tools, work, context, timeout):
    import torch

    sys.path.insert(0, os.path.join(ROOT, "examples"))
    from make_examples import GPT, onnx_export

    torch.manual_seed(0)
    model = GPT(vocab=50257, context=context, dim=768, heads=12, layers=12)
    model.train()
    params = sum(p.numel() for p in model.parameters())
    path = os.path.join(work, "gpt2.onnx")
    t0 = time.perf_counter()
    onnx_export(model, (torch.randint(0, 50257, (1, context)),), path, opset_version=13,
                training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False,
                input_names=["tokens"], output_names=["logits"])
    export_s = time.perf_counter() - t0
    del model
    row = {"model": "gpt2-124m", "description": f"GPT 12 blocks, width 768, 12 heads, vocab 50257, context {context}, "
                                                "tied head; micro-batch 1 x context tokens, 1 stage (--gpus 1x1)",
           "params": params, "onnx_mb": round(os.path.getsize(path) / 2**20, 1), "export_s": round(export_s, 1),
           "loadavg_before": loadavg()}
    base = [tools.pipec, path, "--gpus", "1x1", "--microbatches", "1"] + tools.opt

    src = os.path.join(work, "gpt2-sources")
    shutil.rmtree(src, ignore_errors=True)
    status, out, wall, rss = retried("pipec gpt2 (sources)", lambda: measured(base + ["--out", src], env=env_for(1),
                                                                             timeout=timeout))
    if status != 0:
        row.update(error="pipec: " + first_error(out), sources_s=round(wall, 2), sources_peak_rss_mb=round(rss, 1))
        return row
    row.update(sources_s=round(wall, 2), sources_peak_rss_mb=round(rss, 1),
               source_kb=round(sum(os.path.getsize(os.path.join(src, "stages", f))
                                   for f in os.listdir(os.path.join(src, "stages")) if f.endswith(".cpp")) / 1024, 1))

    # The build: pipec runs `c++ ...` through the shell, once per stage; a
    # wrapper named c++ first on PATH times each and records its peak RSS.
    real = shutil.which("c++")
    wrap_dir = os.path.join(work, "wrap")
    os.makedirs(wrap_dir, exist_ok=True)
    log = os.path.join(work, "gpt2-build.log")
    wrapper = os.path.join(wrap_dir, "c++")
    with open(wrapper, "w") as f:
        f.write(f"#!/bin/sh\nexec '{PYTHON}' '{SELF}' --measure '{log}' -- '{real}' \"$@\"\n")
    os.chmod(wrapper, 0o755)
    env = env_for(1)
    env["PATH"] = wrap_dir + os.pathsep + env.get("PATH", "")
    built = os.path.join(work, "gpt2-built")

    def build():
        shutil.rmtree(built, ignore_errors=True)
        if os.path.exists(log):
            os.remove(log)
        return measured(base + ["--out", built, "--build"], env=env, timeout=timeout)

    status, out, wall, rss = retried("pipec gpt2 --build", build)
    compiles = read_log(log)
    if status != 0:
        # What is known: pipec --build's wall time and the peak RSS of what had finished.
        row.update(error="pipec --build: " + first_error(out), pipec_build_total_s=round(wall, 2),
                   pipec_build_total_peak_rss_mb=round(rss, 1), loadavg_after=loadavg())
        return row
    row.update(build_s=round(sum(c["wall_s"] for c in compiles), 2),
               build_peak_rss_mb=round(max((c["rss_mb"] for c in compiles), default=0.0), 1),
               stages_compiled=len(compiles), pipec_build_total_s=round(wall, 2),
               pipec_build_total_peak_rss_mb=round(rss, 1), loadavg_after=loadavg())
    return row


# ---------------------------------------------------------------------------

def fmt(v, spec):
    return format(v, spec) if isinstance(v, (int, float)) else format("-", spec.rstrip("f").lstrip(".0123456789") or ">")


def print_table(rows, tools):
    print(f"pipec vs PyTorch, 1 rank, forward + backward + AdamW per iteration (piperun --threads: "
          f"{'yes' if tools.piperun_threads else 'not offered, OPENBLAS_NUM_THREADS only'}; pipec flags: "
          f"{' '.join(tools.opt) or 'default'}; OPENBLAS_CORETYPE: {os.environ.get('OPENBLAS_CORETYPE') or 'unset'})")
    print(f"{'model':6} {'thr':>3} {'pipec ms':>9} {'torch ms':>9} {'ratio':>6} {'min ratio':>9} {'pipec MB':>9} {'torch MB':>9}  load")
    for r in rows:
        print(f"{r['model']:6} {r['threads']:3d} {fmt(r.get('pipec_ms'), '9.1f')} {fmt(r.get('torch_ms'), '9.1f')} "
              f"{fmt(r.get('ratio'), '6.2f')} {fmt(r.get('ratio_min'), '9.2f')} {fmt(r.get('pipec_rss_mb'), '9.1f')} {fmt(r.get('torch_rss_mb'), '9.1f')}"
              f"  {r.get('loadavg_before', ['?'])[0] if r.get('loadavg_before') else '?'}"
              + (f"  ERROR {r['error']}" if r.get("error") else ""))
    print()
    for name in dict.fromkeys(r["model"] for r in rows):
        d = MODELS[name]
        print(f"{name}: {d[0]}; {d[3]} micro-batches of {d[2]}")
    ok = [r for r in rows if r.get("ratio") is not None]
    if ok:
        good = all(r["ratio"] <= 1.0 and r["pipec_rss_mb"] <= r["torch_rss_mb"] for r in ok)
        print(f"goal (ratio <= 1.0 and pipec RSS <= torch RSS for every model): {'met' if good and len(ok) == len(rows) else 'NOT met'}")


def print_gpt2(row):
    print(f"GPT-2-124M compile: {row['description']}")
    print(f"  parameters {row['params']:,}, ONNX {row['onnx_mb']} MiB (export {row['export_s']} s)")
    if row.get("error"):
        print(f"  ERROR {row['error']}")
    if "source_kb" not in row:
        return
    print(f"  pipec --out (sources + weights): {row['sources_s']:.2f} s, peak RSS {row['sources_peak_rss_mb']:.0f} MiB, "
          f"{row['source_kb']} KiB of C++ (goal < 10 s)")
    if "build_s" in row:
        print(f"  build ({row['stages_compiled']} c++ run): {row['build_s']:.2f} s, peak RSS {row['build_peak_rss_mb']:.0f} MiB "
              f"(goal < 60 s); pipec --out --build in all: {row['pipec_build_total_s']:.2f} s")
    elif "pipec_build_total_s" in row:
        print(f"  pipec --out --build stopped after {row['pipec_build_total_s']:.2f} s")
    print(f"  load average before/after: {row['loadavg_before']} / {row.get('loadavg_after')}")


def main():
    if len(sys.argv) > 2 and sys.argv[1] == "--torch-child":
        return torch_child(json.loads(sys.argv[2]))
    if len(sys.argv) > 4 and sys.argv[1] == "--measure" and sys.argv[3] == "--":
        return measure_wrapper(sys.argv[2], sys.argv[4:])

    default_build = os.path.join(ROOT, "build")
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default=default_build, help=f"build tree with bin/pipec and bin/piperun ({default_build})")
    ap.add_argument("--json", action="store_true", help="print one JSON list instead of the table")
    ap.add_argument("--threads", default="1", help="comma-separated thread counts (default 1)")
    ap.add_argument("--models", default="mlp,gpt,llama,cnn", help="comma-separated subset of " + ",".join(MODELS))
    ap.add_argument("--iters", type=int, default=3, help="measured iterations")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--keep", help="work here and keep the models and jobs (default: a temporary directory)")
    ap.add_argument("--opt", help="pipec optimization level (-O0, -O2), passed on when pipec offers it")
    ap.add_argument("--compile-gpt2", action="store_true", help="measure GPT-2-124M compile/build time instead")
    ap.add_argument("--gpt2-context", type=int, default=1024, help="context of the GPT-2-124M model (default 1024)")
    ap.add_argument("--gpt2-timeout", type=int, default=900, help="stop each GPT-2 pipec run after this many s (900)")
    a = ap.parse_args()
    threads = [int(t) for t in a.threads.split(",") if t]
    models = [m for m in a.models.split(",") if m]
    for m in models:
        if m not in MODELS:
            ap.error(f"unknown model {m} (choose from {', '.join(MODELS)})")
    tools = Tools(os.path.abspath(a.build), a.opt)

    work = os.path.abspath(a.keep) if a.keep else tempfile.mkdtemp(prefix="pipec-bench-codegen-")
    os.makedirs(work, exist_ok=True)
    try:
        if a.compile_gpt2:
            row = bench_gpt2(tools, work, a.gpt2_context, a.gpt2_timeout)
            if a.json:
                print(json.dumps([row], indent=1))
            else:
                print_gpt2(row)
            return 1 if row.get("error") else 0
        rows = []
        for m in models:
            rows += bench_model(tools, m, work, threads, a.iters, a.warmup)
    finally:
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)
    if a.json:
        print(json.dumps(rows, indent=1))
    else:
        print_table(rows, tools)
    return 1 if any(r.get("error") for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
