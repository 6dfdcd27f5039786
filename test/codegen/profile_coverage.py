#!/usr/bin/env python3
"""piperun --profile at -O2 measures every ONNX node that runs a kernel,
including those -O2 merged into other ops (docs/optimization.md): an
activation that became a GEMM's epilogue (reported with no time of its own)
and the ops of a pipe.fused loop (its time split evenly among them). The
model, written here with onnx.helper, has both: a Gemm whose ReLU becomes its
epilogue, and a residual Add, a ReLU, a constant scale and a Tanh that fuse
into loops (forward and backward). pipec --profile then plans with measured
times for every op but the views.

    profile_coverage.py --pipec PIPEC --piperun PIPERUN
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

ROWS, FEATURES, HIDDEN, CLASSES = 8, 12, 16, 4
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMPI_MCA_rmaps_base_oversubscribe="1", OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")


def write_model(path):
    rng = np.random.default_rng(5)

    def tensor(name, *shape):
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.3).astype(np.float32), name)

    inits = [tensor("w1", HIDDEN, FEATURES), tensor("b1", HIDDEN), tensor("w2", HIDDEN, HIDDEN),
             tensor("w3", CLASSES, HIDDEN), tensor("b3", CLASSES),
             numpy_helper.from_array(np.array(0.5, np.float32), "half")]
    nodes = [
        helper.make_node("Gemm", ["x", "w1", "b1"], ["h1"], transB=1, name="fc1"),
        helper.make_node("Relu", ["h1"], ["r1"], name="relu1"),  # fc1's epilogue
        helper.make_node("Gemm", ["r1", "w2"], ["h2"], transB=1, name="fc2"),
        helper.make_node("Add", ["h2", "r1"], ["res"], name="residual"),  # one loop from here
        helper.make_node("Relu", ["res"], ["r2"], name="relu2"),
        helper.make_node("Mul", ["r2", "half"], ["scaled"], name="scale"),
        helper.make_node("Tanh", ["scaled"], ["t"], name="tanh"),
        helper.make_node("Gemm", ["t", "w3", "b3"], ["logits"], transB=1, name="head"),
    ]
    graph = helper.make_graph(nodes, "profiled",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [ROWS, FEATURES])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [ROWS, CLASSES])],
                              initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    onnx.checker.check_model(model)
    onnx.save(model, path)
    return [node.name for node in nodes]


def run(cmd):
    result = subprocess.run(cmd, capture_output=True, text=True, env=ENV)
    if result.returncode != 0:
        sys.exit(f"FAIL: {' '.join(cmd)} exited {result.returncode}\n{result.stdout}{result.stderr}")
    return result.stdout


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--pipec", required=True)
    parser.add_argument("--piperun", required=True)
    args = parser.parse_args()
    failures = 0
    with tempfile.TemporaryDirectory(prefix="pipec-profile-") as work:
        model = os.path.join(work, "profiled.onnx")
        nodes = write_model(model)
        job, profile = os.path.join(work, "job"), os.path.join(work, "profile.json")
        run([args.pipec, model, "--gpus", "1x1", "--microbatches", "2", "-O2", "--out", job, "--build"])
        optimized = run([args.pipec, model, "--gpus", "1x1", "--microbatches", "2", "-O2", "--emit=optimized"])
        # The model must still have what the test is about.
        merged = {"epilogue": "activation = #nn.unary<relu>" in optimized, "fused loop": "pipe.fused" in optimized}
        for what, present in merged.items():
            print(f"{'ok  ' if present else 'FAIL'} -O2 makes a {what}")
            failures += not present
        run(["mpirun", "-np", "1", args.piperun, job, "--iters", "2", "--profile", profile])
        with open(profile) as stream:
            ops = {op["name"]: op for op in json.load(stream)["ops"]}
        for node in nodes:
            op = ops.get(node)
            ok = op is not None
            print(f"{'ok  ' if ok else 'FAIL'} {node}: in the profile"
                  + (f" (forward {op['fwd_s'] * 1e6:.1f} us, backward {op['bwd_input_s'] * 1e6:.1f} us)" if ok else ""))
            failures += not ok
        fused_time = sum(ops[n]["fwd_s"] for n in ("residual", "relu2", "scale", "tanh") if n in ops)
        ok = fused_time > 0
        print(f"{'ok  ' if ok else 'FAIL'} the fused loop's forward time is split among its nodes ({fused_time * 1e6:.1f} us)")
        failures += not ok
        costs = run([args.pipec, model, "--gpus", "1x1", "--profile", profile, "--emit=costs"])
        views = ("nn.reshape", "nn.flatten", "nn.squeeze", "nn.unsqueeze", "nn.constant")
        estimated = [line.strip()[:80] for line in costs.splitlines()
                     if 'source = "estimate"' in line and not any(f"= {v} " in line for v in views)]
        ok = not estimated
        print(f"{'ok  ' if ok else 'FAIL'} pipec --profile measures every op that runs a kernel"
              + ("" if ok else f": estimated {estimated[:3]}"))
        failures += not ok
    print(f"{failures} failed" if failures else "all checks passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
