#!/usr/bin/env python3
"""report.py: on_gpu.sh's table (docs/gpu-runs.md). Python's standard library only.

    report.py pipec MODEL BATCH JOB LOG RC WARMUP [PEAK_MIB]
        one JSON row from a piperun log (--log-every 1): the median ms/iter of
        the iterations after WARMUP; "out of memory" when the log says so,
        "timed out" for rc 124/137, "failed" otherwise; the plan's predicted
        device memory and iteration from JOB/plan.json; PEAK_MIB: nvidia-smi's peak
    report.py plan-memory JOB
        the plan's predicted bytes on its fullest device
    report.py table META ROWS.jsonl... --out DIR --device NAME
        DIR/results.md and DIR/results.json from export_models.py's
        table_models.json (META) and the rows; the table is printed too

Model FLOPs per iteration (the MFU's numerator, PaLM's appendix B and
nanoGPT's estimate_mfu, counting attention as if not causal):
    6 x N x tokens + 12 x layers x width x context^2 x samples
with tokens = samples x context per iteration (2 micro-batches) and N the
parameters that multiply (all but embedding tables read only by a gather:
GPT-2's position embeddings; Llama's token embeddings, its untied head
counts). MFU = FLOPs / time / PEAK_FLOPS, 989 TFLOP/s: dense bf16 of an
H100 SXM and of an H200 (the same tensor cores)."""
import json
import os
import re
import statistics
import sys

PEAK_FLOPS = 989e12
BATCHES = (4, 16)  # the table's micro-batch sizes (prepare.sh's, on_gpu.sh's, torch_baseline.py's SHAPES)
FORMULA = ("model FLOPs per iteration = 6 x N x tokens + 12 x layers x width x context^2 x samples "
           "(tokens = samples x context, 2 micro-batches; N = parameters that multiply: all but GPT-2's "
           "position and Llama's input embedding tables; attention counted as if not causal); "
           "MFU = FLOPs / time / 989 TFLOP/s (dense bf16, H100 SXM and H200)")


def read_plan(job):
    with open(os.path.join(job, "plan.json")) as f:
        return json.load(f)


def fullest_device_bytes(plan):
    return int(max(stage["memory_bytes"] for stage in plan["stages"]))


def plan_memory(job):
    return fullest_device_bytes(read_plan(job))


def pipec_row(model, batch, job, log, rc, warmup, peak_mib=None):
    row = dict(framework="pipec", mode="piperun", model=model, batch=int(batch), microbatches=2)
    try:
        plan = read_plan(job)
        row["plan_gib"] = round(fullest_device_bytes(plan) / 2**30, 1)
        # the iteration the plan predicts, on its device preset (docs/cost-model.md)
        row["plan_ms"] = round(plan["predictions"]["time_per_minibatch_s"] * 1e3, 1)
        row["plan_device"] = plan["topology"]["device"]
    except (OSError, ValueError, KeyError):
        pass
    text = open(log, errors="replace").read() if os.path.exists(log) else ""
    times = [float(t) for t in re.findall(r"piperun: iter \d+/\d+ .*?([0-9.]+) ms/iter", text)]
    rc = int(rc)
    if text.startswith("piperun: not run"):  # on_gpu.sh: the plan's memory is more than the card's
        row["status"] = "out of memory (the plan's prediction; not run)"
    elif re.search(r"out of memory", text, re.I):
        row["status"] = "out of memory"
    elif rc in (124, 137):
        row["status"] = "timed out"
    elif rc != 0 or len(times) <= int(warmup):
        row["status"] = f"failed (rc {rc})"
    else:
        row["status"] = "ok"
    if row["status"] != "ok":
        errors = [line for line in text.splitlines() if "error" in line.lower()]
        row["error"] = (errors[-1] if errors else text.strip().splitlines()[-1] if text.strip() else "")[:300]
    if times[int(warmup):]:
        row.update(ms=statistics.median(times[int(warmup):]), times_ms=times, warmup=int(warmup),
                   iters=len(times) - int(warmup))
    if peak_mib:
        row["peak_gib"] = round(float(peak_mib) / 1024, 2)
    return row


def flops(meta, samples):
    context = meta["context"]
    return (6 * meta["multiplying_parameters"] * samples * context
            + 12 * meta["layers"] * meta["dim"] * context ** 2 * samples)


def table(meta_path, row_paths, out, device):
    with open(meta_path) as f:
        meta = json.load(f)
    rows = []
    for path in row_paths:
        if os.path.exists(path):
            with open(path) as f:
                rows += [json.loads(line) for line in f if line.strip()]
    # Rows that never reported (a process killed at the budget's end) are named too.
    have = {(r["model"], r["batch"], r["mode"]) for r in rows}
    rows += [dict(framework="pipec" if mode == "piperun" else "torch", mode=mode, model=model, batch=batch,
                  microbatches=2, status="not run (no time left)")
             for model in meta for batch in BATCHES for mode in ("piperun", "eager", "compile")
             if (model, batch, mode) not in have]
    order = {"piperun": 0, "eager": 1, "compile": 2}
    rows.sort(key=lambda r: (list(meta).index(r["model"]) if r["model"] in meta else 9, r["batch"],
                             order.get(r["mode"], 9)))
    torch_version = next((r["torch"] for r in rows if r.get("torch")), "?")
    lines = [f"# bench/gpu table: {device}", "",
             f"One rank, one GPU; pipec `--precision bf16` (bf16 activations and gradients, fp32 master weights and optimizer state), PyTorch {torch_version} "
             "bf16 autocast (eager, and torch.compile mode default); 2 micro-batches per iteration, AdamW, synthetic "
             "tokens; median ms per iteration after warm-up (iterations: warm-up + measured).", "",
             FORMULA + ".", "",
             "| model | micro-batch | framework | ms/iter | tokens/s | TFLOP/s | MFU | GPU memory GiB | iterations | notes |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        m = meta.get(r["model"], {})
        samples = r["batch"] * r.get("microbatches", 2)
        framework = {"piperun": "pipec", "eager": "PyTorch eager", "compile": "torch.compile"}.get(r["mode"], r["mode"])
        notes = []
        if r.get("plan_gib") is not None:
            notes.append(f"plan predicts {r['plan_gib']} GiB")
        if r.get("plan_ms") is not None:
            notes.append(f"{r['plan_ms']} ms ({r.get('plan_device', '?')} preset)")
        if r.get("compile_s") is not None:
            notes.append(f"compile {r['compile_s']} s")
        context = r.get("context", m.get("context"))
        if "ms" in r and m and context == m["context"]:  # (not for --smoke's tiny rows)
            f = flops(m, samples)
            r.update(tokens_per_iter=samples * m["context"], flops_per_iter=f,
                     tokens_per_s=samples * m["context"] / (r["ms"] / 1e3),
                     tflops=f / (r["ms"] / 1e3) / 1e12, mfu=f / (r["ms"] / 1e3) / PEAK_FLOPS)
        ok = r["status"] == "ok" and "mfu" in r
        cells = [m.get("description", r["model"]), f"{r['batch']} x {context}", framework,
                 f"{r['ms']:.1f}" if "ms" in r and r["status"] == "ok" else (r["status"] if r["status"] != "ok" else "-"),
                 f"{r['tokens_per_s']:,.0f}" if ok else "-", f"{r['tflops']:.1f}" if ok else "-",
                 f"{100 * r['mfu']:.1f}%" if ok else "-",
                 f"{r['peak_gib']:.1f}" if r.get("peak_gib") is not None else "-",
                 f"{r['warmup']} + {r['iters']}" if "iters" in r else "-", "; ".join(notes)]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "GPU memory: pipec's is nvidia-smi's peak of the card while piperun ran (sampled every 250 ms, the "
              "CUDA context included); PyTorch's is torch.cuda.max_memory_reserved(). Parameters: "
              + "; ".join(f"{m['description']} {m['parameters']:,} ({m['multiplying_parameters']:,} multiply)"
                          for m in meta.values()) + "."]
    text = "\n".join(lines) + "\n"
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "results.md"), "w") as f:
        f.write(text)
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(dict(device=device, peak_flops=PEAK_FLOPS, formula=FORMULA, models=meta, rows=rows), f, indent=1)
    print(text)


def main():
    args = sys.argv[1:]
    if args and args[0] == "pipec":
        print(json.dumps(pipec_row(*args[1:])))
    elif args and args[0] == "plan-memory":
        print(plan_memory(args[1]))
    elif args and args[0] == "table":
        out = args[args.index("--out") + 1]
        device = args[args.index("--device") + 1] if "--device" in args else "?"
        paths = [a for i, a in enumerate(args[2:], 2) if a not in ("--out", "--device")
                 and args[i - 1] not in ("--out", "--device")]
        table(args[1], paths, out, device)
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
