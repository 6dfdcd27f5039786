#!/usr/bin/env python3
"""Imports every ONNX node conformance model (Debian's libonnx-testdata) whose
operators are all in pipec's tier-1 set, and prints how many imported.

Fails when a model listed in expected_imports.txt no longer imports, so the
count can only go up; --update rewrites that list from the current results.
Models outside tier 1 are not attempted. With --verbose each failure's
first error line is printed.

Node tests feed operands such as Reshape's shape or Slice's bounds as graph
inputs; real models compute them from constants, and pipec needs them at
import time. Such inputs are bound to their values from the test's
test_data_set_0 (as initializers) before importing.
"""
import argparse
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import tempfile

import onnx
from onnx import numpy_helper

HERE = os.path.dirname(os.path.abspath(__file__))
EXPECTED = os.path.join(HERE, "expected_imports.txt")


def read_tier1(path=os.path.join(HERE, "tier1_operators.txt")):
    """The tier-1 operators and the (op type, input position) pairs pipec
    needs at import time, from the list the evaluator's test reads too."""
    operators, constant_slots = set(), set()
    with open(path) as lines:
        for line in lines:
            fields = line.split("#")[0].split()
            if fields:
                operators.add(fields[0])
                constant_slots.update((fields[0], int(i)) for i in fields[1:])
    return operators, constant_slots


TIER1, CONSTANT_SLOTS = read_tier1()


def tier1_models(root):
    for name in sorted(os.listdir(root)):
        path = os.path.join(root, name, "model.onnx")
        if not os.path.exists(path):
            continue
        model = onnx.load(path, load_external_data=False)
        ops = {node.op_type for node in model.graph.node if node.domain in ("", "ai.onnx")}
        foreign = any(node.domain not in ("", "ai.onnx") for node in model.graph.node)
        if ops and ops <= TIER1 and not foreign:
            yield name, path


def bind_constant_inputs(path, workdir):
    """Returns the model path to import: the original, or a copy whose
    import-time operands are initializers holding the test data."""
    model = onnx.load(path)
    initialized = {tensor.name for tensor in model.graph.initializer}
    inputs = [value.name for value in model.graph.input if value.name not in initialized]
    wanted = {node.input[i] for node in model.graph.node for i in range(len(node.input))
              if (node.op_type, i) in CONSTANT_SLOTS and node.input[i] in inputs}
    if not wanted:
        return path
    data_dir = os.path.join(os.path.dirname(path), "test_data_set_0")
    for position, name in enumerate(inputs):
        if name not in wanted:
            continue
        tensor = onnx.TensorProto()
        with open(os.path.join(data_dir, f"input_{position}.pb"), "rb") as stream:
            tensor.ParseFromString(stream.read())
        tensor.name = name
        model.graph.initializer.append(tensor)
    kept = [value for value in model.graph.input if value.name not in wanted]
    del model.graph.input[:]
    model.graph.input.extend(kept)
    bound = os.path.join(workdir, os.path.basename(os.path.dirname(path)) + ".onnx")
    onnx.save(model, bound)
    return bound


def try_import(pipec, path, workdir):
    path = bind_constant_inputs(path, workdir)
    result = subprocess.run([pipec, path, "--emit=nn", "-o", os.devnull],
                            capture_output=True, text=True, timeout=120)
    first = result.stderr.strip().splitlines()[:1]
    return result.returncode == 0, first[0] if first else ""


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pipec", required=True)
    parser.add_argument("--data", default="/usr/share/libonnx-testdata/data/node")
    parser.add_argument("--update", action="store_true")
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args()

    models = list(tier1_models(args.data))
    with tempfile.TemporaryDirectory() as workdir, \
            ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        outcomes = list(pool.map(lambda item: try_import(args.pipec, item[1], workdir), models))
    imported = sorted(name for (name, _), (ok, _) in zip(models, outcomes) if ok)
    failed = [(name, why) for (name, _), (ok, why) in zip(models, outcomes) if not ok]

    print(f"onnx node tests: imported {len(imported)} of {len(models)} tier-1 models")
    if args.verbose:
        for name, why in failed:
            print(f"  not imported: {name}: {why}")
    if args.update:
        with open(EXPECTED, "w") as stream:
            stream.write("\n".join(imported) + "\n")
        print(f"wrote {EXPECTED}")
        return 0
    expected = set(open(EXPECTED).read().split())
    regressions = sorted(expected - set(imported))
    for name in regressions:
        why = dict(failed).get(name, "not found in the test data")
        print(f"REGRESSION: {name} imported before and does not now: {why}")
    return 1 if regressions else 0


if __name__ == "__main__":
    sys.exit(main())
