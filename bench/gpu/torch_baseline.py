#!/usr/bin/env python3
"""PyTorch on the GPU for bench/gpu (docs/gpu-runs.md). An iteration is the
job's micro-batches forward + backward (gradients accumulated) and one AdamW
step, as one piperun iteration; each row is the median ms/iter after warm-up.

    torch_baseline.py --table OUT.jsonl [--deadline UNIX_TIME] [--smoke]

The table (on_gpu.sh's): export_models.TABLE's GPT-2 124M and Llama, the same
modules pipec's ONNX files were exported from, their attention computed as a
PyTorch user writes it today, F.scaled_dot_product_attention (causal, the
same dropout of the probabilities, grouped-query heads for the Llama: the
flash or memory-efficient kernel), or with --attention written as exported
(products, a masked softmax, dropout, product), at 4 and
16 x 1,024 tokens per micro-batch, 2 micro-batches, synthetic tokens, bf16
autocast (the loss inside it), AdamW (fused, lr 1e-4). Each shape runs
`eager` and `compile` (torch.compile, mode default, of the model and its loss
together, compiled once per model and shape: the first warm-up iteration
compiles, and its time is reported as compile_s). Eager rows run first, then the
compile rows; a compile row that would end after --deadline (estimated from the
last compile) is skipped and reported so, as is an out-of-memory. One JSON
object per row goes to OUT.jsonl. --smoke: tiny models on the CPU, one
measured iteration, to check the script without a GPU.

    torch_baseline.py --old [--smoke]

The earlier speed runs' baselines (MLP, GPT-2 fixed batch, ResNet-50, the
micro-batch sizes; fp32 with TF32 off, tf32 with it on, bf16 under autocast),
and issue 47's convolutional rows (cnn_rows): ResNet-50 and MobileNet-V2 at
32 x 224², 2 micro-batches, bf16 autocast, eager NCHW, eager channels-last and
torch.compile channels-last, and the batch-4,096 MLP eager and compiled.
--smoke runs only the convolutional rows, tiny, on the CPU."""
import argparse
import gc
import json
import os
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "examples"))
sys.path.insert(0, os.path.join(ROOT, "bench", "runtime"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from export_models import GPT_FREE_BATCH, TABLE, table_model  # noqa: E402

# Micro-batch sizes of the table and (warm-up, measured) iterations per row;
# the 16 x 1,024 rows run fewer (an iteration is ~4x longer).
SHAPES = {4: (3, 5), 16: (2, 3)}
SMOKE = {"gpt2": dict(vocab=64, context=16, dim=32, heads=2, layers=2),
         "llama": dict(vocab=64, context=16, dim=32, heads=4, kv_heads=2, hidden=64, layers=2)}


def gpt_block_sdpa(self, x):
    """make_examples.Block.forward with its attention as one
    scaled_dot_product_attention (the same causal mask and dropout)."""
    b, t, c = x.size()
    q, k, v = (part.view(b, t, self.heads, c // self.heads).transpose(1, 2)
               for part in self.qkv(self.ln1(x)).split(c, dim=2))
    y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.drop.p if self.training else 0.0, is_causal=True)
    x = x + self.drop(self.proj(y.transpose(1, 2).contiguous().view(b, t, c)))
    return x + self.drop(self.out(F.gelu(self.fc(self.ln2(x)))))


def llama_block_sdpa(self, x, cos, sin):
    """bench_codegen's LlamaBlock.forward with grouped-query
    scaled_dot_product_attention (no repeated key-value heads in memory)."""
    b, t, _ = x.shape
    h = self.norm1(x)
    q = self.q(h).view(b, t, self.heads, self.head_dim).transpose(1, 2)
    k = self.k(h).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
    v = self.v(h).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
    half = self.head_dim // 2
    rotate = lambda u: torch.cat((-u[..., half:], u[..., :half]), dim=-1)  # noqa: E731
    q, k = q * cos + rotate(q) * sin, k * cos + rotate(k) * sin
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    x = x + self.o(y.transpose(1, 2).reshape(b, t, -1))
    h = self.norm2(x)
    return x + self.down(F.silu(self.gate(h)) * self.up(h))


def with_sdpa(model):
    """The model with every block's attention as scaled_dot_product_attention."""
    import types
    for module in model.modules():
        kind = type(module).__name__
        if kind == "Block":
            module.forward = types.MethodType(gpt_block_sdpa, module)
        elif kind == "LlamaBlock":
            module.forward = types.MethodType(llama_block_sdpa, module)
    return model


def sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def timed(step, iters, warmup, device):
    """Runs step warmup + iters times; (the times in ms, each synchronized)."""
    times = []
    for _ in range(iters + warmup):
        sync(device)
        start = time.perf_counter()
        step()
        sync(device)
        times.append((time.perf_counter() - start) * 1e3)
    return times


class WithLoss(nn.Module):
    """The model and its mean cross-entropy, under bf16 autocast: what
    torch.compile sees whole (pipec's stage computes the loss too)."""

    def __init__(self, model, device):
        super().__init__()
        self.model, self.device = model, device

    def forward(self, x, y):
        with torch.autocast(self.device, torch.bfloat16):
            logits = self.model(x)
            return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


def training_step(model, batches, mode, device):
    """One iteration as a piperun iteration: every micro-batch of `batches`
    forward + backward under bf16 autocast (WithLoss; torch.compile'd with
    mode "compile"), gradients accumulated, then one fused AdamW step."""
    loss_fn = WithLoss(model, device)
    if mode == "compile":
        loss_fn = torch.compile(loss_fn)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device == "cuda")

    def step():
        optimizer.zero_grad(set_to_none=True)
        for x, y in batches:
            (loss_fn(x, y) / len(batches)).backward()
        optimizer.step()
    return step


def table_row(name, kwargs, batch, mode, device, warmup, iters, attention):
    """One row: the model built on the device, 2 micro-batches of batch x context tokens."""
    model = table_model(name, kwargs).to(device)
    if attention == "sdpa":
        model = with_sdpa(model)
    vocab, context = kwargs["vocab"], kwargs["context"]
    g = torch.Generator(device=device).manual_seed(1)
    batches = [(torch.randint(0, vocab, (batch, context), device=device, generator=g),
                torch.randint(0, vocab, (batch, context), device=device, generator=g)) for _ in range(2)]
    step = training_step(model, batches, mode, device)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times = timed(step, iters, warmup, device)
    row = dict(ms=statistics.median(times[warmup:]), times_ms=[round(t, 3) for t in times],
               warmup=warmup, iters=iters)
    if mode == "compile":
        row["compile_s"] = round((times[0] - statistics.median(times[warmup:])) / 1e3, 1)
    if device == "cuda":
        row["peak_gib"] = round(torch.cuda.max_memory_reserved() / 2**30, 2)
    return row


def release():
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def table(args):
    device = "cpu" if args.smoke else "cuda"
    if device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    info = dict(torch=torch.__version__, device=torch.cuda.get_device_name() if device == "cuda" else "cpu")
    print("torch", info["torch"], info["device"], flush=True)
    shapes = {2: (1, 1), 4: (1, 1)} if args.smoke else SHAPES
    plan = [(mode, name, batch) for mode in ("eager", "compile") for batch in shapes for name in TABLE]
    compile_estimate = {}  # model -> seconds of its last compile row (compile and iterations)
    with open(args.table, "w") as out:
        for mode, name, batch in plan:
            kwargs = SMOKE[name] if args.smoke else TABLE[name][1]
            warmup, iters = shapes[batch]
            row = dict(framework="torch", mode=mode, model=name, batch=batch, context=kwargs["context"],
                       microbatches=2, attention=args.attention, **info)
            guess = compile_estimate.get(name, max(compile_estimate.values(), default=120.0))
            guess *= 1.3 if batch == 16 else 1.0
            if mode == "compile" and args.deadline and time.time() + guess > args.deadline:
                row["status"] = f"skipped: ~{guess:.0f} s to compile and run, {args.deadline - time.time():.0f} s left"
            else:
                start = time.time()
                try:
                    row.update(table_row(name, kwargs, batch, mode, device, warmup, iters, args.attention),
                               status="ok")
                except torch.OutOfMemoryError as e:
                    row["status"] = "out of memory"
                    row["error"] = str(e).splitlines()[0][:300]
                except Exception as e:  # a failed row must not lose the others
                    row["status"] = f"failed: {type(e).__name__}"
                    row["error"] = str(e)[:500]
                if mode == "compile":
                    if row["status"] == "ok":
                        compile_estimate[name] = time.time() - start
                    torch._dynamo.reset()
                row["wall_s"] = round(time.time() - start, 1)
                release()
            print(f"torch {mode} {name} {batch}x{kwargs['context']}: "
                  + (f"{row['ms']:.2f} ms/iter" if row["status"] == "ok" else row["status"])
                  + (f" (compile {row['compile_s']} s)" if "compile_s" in row else "")
                  + (f", peak {row['peak_gib']} GiB" if "peak_gib" in row else "")
                  + (f", {row['wall_s']} s" if "wall_s" in row else ""), flush=True)
            if row["status"].startswith("failed"):
                print("  " + row["error"][:300], flush=True)
            out.write(json.dumps(row) + "\n")
            out.flush()


# ---------------------------------------------------------------------------
# The earlier speed runs (--old)

def median_ms(step, iters, warmup):
    return statistics.median(timed(step, iters, warmup, "cuda")[warmup:])


def train_step(model, batches, precision):
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step():
        optimizer.zero_grad()
        for x, y in batches:
            with torch.autocast("cuda", torch.bfloat16, enabled=precision == "bf16"):
                out = model(x)
                loss = F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1)) / len(batches)
            loss.backward()
        optimizer.step()
    return step


def cnn_rows(device="cuda", smoke=False):
    """Issue 47's rows (docs/gpu-runs.md): each model's iteration (2
    micro-batches; the MLP 8, as pipec's jobs) forward + backward under bf16
    autocast and one fused AdamW step, as eager NCHW, eager channels-last and
    torch.compile of the model and its loss in channels-last (the MLP has no
    layout: eager and compile). The first compiled iteration compiles."""
    import torchvision
    import bench_runtime
    size, batch, mlp_batch, width = (32, 2, 8, 64) if smoke else (224, 32, 4096, 1024)
    models = (("r50", torchvision.models.resnet50, (3, size, size), 1000, batch, 2),
              ("mnv2", torchvision.models.mobilenet_v2, (3, size, size), 1000, batch, 2),
              ("mlp8x1024 b4096", lambda: bench_runtime.make_model(width, 8), (width,), width, mlp_batch, 8))
    for name, make, shape, classes, b, micro in models:
        layouts = ("nchw", "channels_last") if len(shape) == 3 else ("none",)
        for layout, mode in [(layout, "eager") for layout in layouts] + [(layouts[-1], "compile")]:
            memory = torch.channels_last if layout == "channels_last" else torch.contiguous_format
            model = make().to(device).train().to(memory_format=memory)
            g = torch.Generator(device=device).manual_seed(1)
            batches = [(torch.randn((b,) + shape, device=device, generator=g).contiguous(memory_format=memory),
                        torch.randint(0, classes, (b,), device=device, generator=g)) for _ in range(micro)]
            step = training_step(model, batches, mode, device)
            warmup, iters = (2, 1) if smoke else (3, 8)
            try:
                times = timed(step, iters, warmup, device)
                ms = statistics.median(times[warmup:])
                extra = f" (compile {round((times[0] - ms) / 1e3, 1)} s)" if mode == "compile" else ""
                print(f"torch {name} m{micro} bf16 {mode} {layout}: {ms:.2f} ms/iter, "
                      f"{b * micro / ms * 1e3:.0f} samples/s{extra}", flush=True)
            except Exception as e:  # a failed row must not lose the others
                print(f"torch {name} m{micro} bf16 {mode} {layout}: failed: {type(e).__name__}: {str(e)[:200]}",
                      flush=True)
            if mode == "compile":
                torch._dynamo.reset()
            del model, batches, step
            release()


def old():
    import torchvision
    import bench_runtime
    from make_examples import GPT
    print("torch", torch.__version__, torch.cuda.get_device_name())
    torch.set_default_device("cuda")  # the GPT class makes its position ids with torch.arange
    for precision in ("fp32", "tf32", "bf16"):
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = precision != "fp32"
        for batch, m in ((64, 16), (4096, 8)):
            model = bench_runtime.make_model(1024, 8).train()
            batches = [(torch.randn(batch, 1024), torch.randint(0, 1024, (batch,))) for _ in range(m)]
            print(f"torch mlp8x1024 b{batch} m{m} {precision}: "
                  f"{median_ms(train_step(model, batches, precision), 6, 2):.2f} ms/iter")
        if precision == "fp32":
            continue
        for name, model, make in (
                ("gpt2", GPT(vocab=50257, context=1024, dim=768, heads=12, layers=12),
                 lambda: (torch.randint(0, 50257, (4, 1024)), torch.randint(0, 50257, (4, 1024)))),
                ("r50", torchvision.models.resnet50(),
                 lambda: (torch.randn(32, 3, 224, 224), torch.randint(0, 1000, (32,))))):
            step = train_step(model.train(), [make() for _ in range(2)], precision)
            print(f"torch {name} m2 {precision}: {median_ms(step, 4, 1):.2f} ms/iter")
    # The micro-batch sizes: 64 samples per step as b x 64/b, bf16.
    model, vocab, context = GPT(**GPT_FREE_BATCH).train(), GPT_FREE_BATCH["vocab"], GPT_FREE_BATCH["context"]
    for b in (1, 2, 4, 8, 16, 32, 64):
        batches = [(torch.randint(0, vocab, (b, context)), torch.randint(0, vocab, (b, context)))
                   for _ in range(64 // b)]
        print(f"torch mb-{b} bf16: {median_ms(train_step(model, batches, 'bf16'), 4, 1):.2f} ms/iter")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--table", metavar="OUT.jsonl")
    parser.add_argument("--deadline", type=float, default=0.0, help="unix time by which the compile rows must end")
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--attention", choices=["sdpa", "written"], default="sdpa",
                        help="the table's attention: scaled_dot_product_attention, or as exported")
    parser.add_argument("--old", action="store_true")
    args = parser.parse_args()
    if args.old and args.smoke:
        cnn_rows("cpu", smoke=True)
    elif args.old:  # issue 47's rows first: on_gpu.sh's call may end before the others
        cnn_rows()
        old()
    if args.table:
        table(args)
    if not (args.old or args.table):
        parser.error("--table or --old")


if __name__ == "__main__":
    main()
