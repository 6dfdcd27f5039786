#!/usr/bin/env python3
"""The planner matrix (docs/planner.md): every example model and random DAG
models on topologies from 1x1 to 64x8, with the defaults, with --async and
with each --schedule. Every run must either give a plan or, for explicit
requests only, a clear error. A plan must be exactly one JSON document on
stdout (--json), its printed time per mini-batch must equal the simulated
schedule's, and it must honour what was asked. A sample of plans is also
written with --out and checked: plan.json, its rank streams and the
simulated figures agree.

    planner_matrix.py --pipec build/bin/pipec [--quick]
"""
import argparse
import concurrent.futures
import json
import os
import random
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCHEDULES = ["gpipe", "1f1b", "1f1b-rr", "interleaved", "zb-h1", "zb-h2", "zb-v", "auto"]
TOPOLOGIES = ["1x1", "1x2", "1x4", "1x8", "2x8", "4x4", "8x8", "64x8"]


def random_dag_model(path, seed):
    """A random DAG of dense layers: each layer reads one or two earlier
    tensors (skip connections), so cuts cross several live tensors."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    import numpy as np
    rng = random.Random(seed)
    width = rng.choice([8, 16, 32])
    batch = 4
    layers = rng.randint(4, 14)
    nodes, inits = [], []
    tensors = ["x"]
    for i in range(layers):
        w = numpy_helper.from_array(
            np.random.RandomState(seed * 100 + i).randn(width, width).astype(np.float32) * 0.1, f"w{i}")
        inits.append(w)
        src = tensors[-1]
        nodes.append(helper.make_node("MatMul", [src, f"w{i}"], [f"m{i}"], name=f"mm{i}"))
        out = f"m{i}"
        if len(tensors) > 1 and rng.random() < 0.5:
            skip = rng.choice(tensors[:-1])
            nodes.append(helper.make_node("Add", [out, skip], [f"s{i}"], name=f"add{i}"))
            out = f"s{i}"
        nodes.append(helper.make_node("Relu", [out], [f"r{i}"], name=f"relu{i}"))
        tensors.append(f"r{i}")
    classes = numpy_helper.from_array(
        np.random.RandomState(seed).randn(width, 10).astype(np.float32) * 0.1, "head")
    inits.append(classes)
    nodes.append(helper.make_node("MatMul", [tensors[-1], "head"], ["logits"], name="head"))
    graph = helper.make_graph(
        nodes, f"dag{seed}",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, width])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [batch, 10])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, path)


def run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    return p.returncode, p.stdout, p.stderr


def check_case(pipec, model, topology, extra, explicit):
    cmd = [pipec, model, "--gpus", topology, "--json"] + extra
    rc, out, err = run(cmd)
    where = " ".join(cmd[1:])
    if rc != 0:
        if not explicit:
            return f"{where}: exit {rc} without an explicit request:\n{err}"
        if not err.startswith("error: ") or "Stack dump" in err or rc != 1:
            return f"{where}: unclear failure (exit {rc}):\n{err}"
        if out.strip():
            return f"{where}: failed but wrote to stdout:\n{out[:300]}"
        return None
    try:
        summary = json.loads(out)  # exactly one document: trailing text fails here
    except json.JSONDecodeError as e:
        return f"{where}: stdout is not one JSON document ({e}):\n{out[-300:]}"
    sched = summary.get("schedule", {})
    if summary.get("time_per_minibatch_s") != sched.get("time_per_minibatch_s"):
        return f"{where}: printed time {summary.get('time_per_minibatch_s')} != simulated {sched.get('time_per_minibatch_s')}"
    if summary.get("time_per_minibatch_source") != "simulated schedule":
        return f"{where}: prediction is not the simulated one"
    name = sched.get("name")
    if "--schedule" in extra and name != extra[extra.index("--schedule") + 1]:
        return f"{where}: asked for {extra[extra.index('--schedule') + 1]}, got {name}"
    if "--async" in extra and name != "1f1b-rr":
        return f"{where}: --async gave {name}"
    if "--async" not in extra and "--schedule" not in extra and name == "1f1b-rr":
        return f"{where}: the default search chose the asynchronous 1f1b-rr"
    m = sched.get("microbatches")
    replicas = [s["replicas"] for s in summary["stages"]]
    if name != "1f1b-rr" and m < max(replicas):
        return f"{where}: {m} micro-batches leave replicas of {replicas} idle by default"
    if name == "1f1b-rr" and any(m % r for r in replicas):
        return f"{where}: 1f1b-rr with {m} micro-batches over replicas {replicas}"
    if not summary["planner"]["candidates"]:
        return f"{where}: no candidates reported"
    return None


def check_job(pipec, model, topology, extra):
    """Writes the job and checks plan.json against the rank streams."""
    with tempfile.TemporaryDirectory() as d:
        rc, out, err = run([pipec, model, "--gpus", topology, "--json", "--out", d] + extra)
        where = f"{model} --gpus {topology} {' '.join(extra)} --out"
        if rc != 0:
            return f"{where}: exit {rc}:\n{err}"
        try:
            json.loads(out)
        except json.JSONDecodeError:
            return f"{where}: stdout is not one JSON document with --out:\n{out[-300:]}"
        plan = json.load(open(os.path.join(d, "plan.json")))
        # stages[] are virtual stages when chunks > 1: a position's share its ranks.
        ranks = len({r for s in plan["stages"] for r in s["ranks"]})
        files = [f for f in os.listdir(os.path.join(d, "schedule")) if re.fullmatch(r"rank_\d+\.json", f)]
        if len(files) != ranks:
            return f"{where}: {len(files)} rank streams for {ranks} ranks"
        # Each fact once in plan.json (docs/plan-json.md): the pipeline's facts
        # nowhere else; schedule/schedule.json (its own file) agrees with them.
        for section in ("partition", "schedule", "runtime", "predictions"):
            for fact in ("microbatches", "asynchronous", "chunks", "placement", "name", "schedule"):
                if fact in plan.get(section, {}):
                    return f"{where}: plan.json repeats pipeline.{fact} in {section}"
        problem = json.load(open(os.path.join(d, "schedule", "schedule.json")))["problem"]
        if plan["pipeline"]["microbatches"] != problem["microbatches"]:
            return f"{where}: plan.json's and schedule.json's micro-batch counts differ"
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pipec", required=True)
    ap.add_argument("--quick", action="store_true", help="fewer topologies (development)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    args = ap.parse_args()

    tmp = tempfile.mkdtemp(prefix="planner-matrix-")
    models = [os.path.join(ROOT, "examples", f) for f in ("mlp.onnx", "cnn.onnx", "gpt.onnx")]
    for seed in (1, 2, 3):
        path = os.path.join(tmp, f"dag{seed}.onnx")
        random_dag_model(path, seed)
        models.append(path)
    topologies = ["1x1", "1x4", "2x8"] if args.quick else TOPOLOGIES

    cases = []
    for model in models:
        for topo in topologies:
            cases.append((model, topo, [], False))
            cases.append((model, topo, ["--async"], False))
            # Every explicit family on the smaller topologies; the largest
            # ones (hundreds of ranks) run the defaults, --async and 1f1b.
            for name in SCHEDULES if topo not in ("8x8", "64x8") else ["1f1b"]:
                cases.append((model, topo, ["--schedule", name], True))
    failures = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        futures = {pool.submit(check_case, args.pipec, *c): c for c in cases}
        for f in concurrent.futures.as_completed(futures):
            if (msg := f.result()):
                failures.append(msg)
        jobs = [(m, t, e) for m in models[:3] for t, e in (("1x4", []), ("2x8", ["--async"]), ("1x2", ["--schedule", "zb-v"]))]
        for f in concurrent.futures.as_completed([pool.submit(check_job, args.pipec, *j) for j in jobs]):
            if (msg := f.result()):
                failures.append(msg)
    print(f"planner matrix: {len(cases)} plans and {len(jobs)} written jobs checked, {len(failures)} failures")
    for msg in failures[:20]:
        print("FAIL:", msg)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
