#!/usr/bin/env python3
"""Static exports of the models of test/models/dynamic-batch: the same modules
(same seed, so the same weights), exported at batch 2 and sequence length 16
with no dimension left free, as torch.onnx.export writes by default. pipec
re-specializes them (docs/importer.md, "Another batch or sequence length"),
and test/e2e/respecialize.py compares them at batch 8 and sequence lengths 32
and 8 with dynamic-batch's float64 PyTorch references at those shapes.

Run with a current torch (test/models/README.md); CI only reads the files:

    /work/torchenv/bin/python test/models/static-batch/export.py

Writes, for each model M (cnn, gpt, bert):
  M-dynamo.onnx        torch.onnx.export(dynamo=True) with its defaults (the
                       optimizer folds the position embeddings of gpt and bert
                       into constants: those two are refused at another length)
  M-dynamo-noopt.onnx  the same with optimize=False
  M-legacy.onnx        dynamo=False, opset 17, training=TRAINING,
                       do_constant_folding=False
"""
import importlib.util
import os
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location("dynamic_batch", os.path.join(HERE, "..", "dynamic-batch", "export.py"))
dynamic = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(dynamic)


def strip_stack_traces(path):
    """The dynamo exporter records the exporting machine's source paths per node."""
    import onnx
    model = onnx.load(path)
    for node in model.graph.node:
        kept = [p for p in node.metadata_props if p.key != "pkg.torch.onnx.stack_trace"]
        del node.metadata_props[:]
        node.metadata_props.extend(kept)
    onnx.save(model, path)


def main():
    import torch
    warnings.simplefilter("ignore")
    for name, (_, input_name, shape, _) in dynamic.MODELS.items():
        model = dynamic.build(name)
        x = dynamic.example(name, shape, dynamic.SEED + 1)
        common = dict(input_names=[input_name], output_names=["logits"])
        for suffix, kwargs in [("dynamo", dict(dynamo=True, external_data=False)),
                               ("dynamo-noopt", dict(dynamo=True, optimize=False, external_data=False)),
                               ("legacy", dict(dynamo=False, opset_version=17, do_constant_folding=False,
                                               training=torch.onnx.TrainingMode.TRAINING))]:
            path = os.path.join(HERE, f"{name}-{suffix}.onnx")
            torch.onnx.export(model, (x,), path, **common, **kwargs)
            if suffix != "legacy":
                strip_stack_traces(path)
            print("wrote", path)


if __name__ == "__main__":
    main()
