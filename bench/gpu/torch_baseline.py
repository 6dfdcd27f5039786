#!/usr/bin/env python3
"""PyTorch on the GPU, for the models of bench/gpu's speed jobs (docs/gpu-runs.md):
per iteration the job's micro-batches forward + backward (gradients accumulated)
and one AdamW step, as one piperun iteration; median ms/iter after warm-up.
fp32 with TF32 off, tf32 with it on, bf16 under autocast."""
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "examples"))
sys.path.insert(0, os.path.join(ROOT, "bench", "runtime"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_runtime  # noqa: E402
from make_examples import GPT  # noqa: E402
from export_models import GPT_FREE_BATCH  # noqa: E402


def median_ms(step, iters, warmup):
    times = []
    for _ in range(iters + warmup):
        torch.cuda.synchronize()
        start = time.perf_counter()
        step()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times[warmup:])


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


def main():
    import torchvision
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


if __name__ == "__main__":
    main()
