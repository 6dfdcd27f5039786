#!/usr/bin/env python3
"""Launches and host synchronizations per micro-batch of a ResNet-50 stage
for the CUDA target (issue 47; docs/cuda-codegen.md, "Launches, syncs and
bytes per micro-batch"), counted without a GPU as cuda_launch_count.py counts
GPT-2's.

The model is ResNet-50's structure (torchvision's v1.5: a 7x7 stride-2
convolution, batch norm, ReLU and a 3x3 max pool; bottleneck blocks of
1x1, 3x3 (stride 2 in the first block of layers 2-4) and 1x1 convolutions,
each followed by batch norm, [3, 4, 6, 3] of them, with a 1x1 convolution
and batch norm on the first block's shortcut; global average pooling and a
Linear classifier), written here with onnx.helper as PyTorch's TorchScript
exporter writes it (opset 13, training-mode BatchNormalization with its
running statistics), at a width of WIDTH channels where ResNet-50 has 64 and
images of IMAGE² pixels. What the stage asks of the GPU per call does not
depend on those: every convolution is one cuDNN call (the tf32 and bf16
precisions, the fake cudnn_frontend under the emulation), every batch norm
two kernels, whatever the sizes. It is compiled as one stage,

    pipec MODEL --gpus 1x1 --target cuda --precision bf16 -O2 --optimizer adamw --out DIR

translated for the host emulation and counted by stage_launch_count
(PIPEC_EMU_COUNT_ONLY: counted, not computed). Fails when a count is
unstable, an entry point launches nothing, a micro-batch call does not replay
its CUDA graph, or a figure exceeds its bound in
test/codegen/launch_budget_resnet50.json (--write-budget records today's).

    cuda_launch_count_resnet.py --pipec PIPEC --counter STAGE_LAUNCH_COUNT
        --emulated-library LIB --emulation-dir DIR --cxx CXX --source-root ROOT
        [--budget FILE | --no-budget] [--write-budget]
"""
import argparse
import os
import shutil
import sys
import tempfile

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cuda_launch_count import (PIPEC_FLAGS, add_counting_arguments, count_failures,  # noqa: E402
                               count_launches, per_microbatch, print_counts, settle_budget)
from cuda_stage_emulated import run  # noqa: E402

SHAPE = dict(width=4, image=32, batch=2, classes=10)
LAYERS = (3, 4, 6, 3)  # ResNet-50's bottleneck blocks per layer
DEFAULT_BUDGET = os.path.join(os.path.dirname(os.path.abspath(__file__)), "launch_budget_resnet50.json")
BUDGET_ABOUT = ("Upper bounds for test/codegen/cuda_launch_count_resnet.py (ctest cuda-launch-count-resnet50): per "
                "micro-batch of a ResNet-50 stage, --target cuda --precision bf16 -O2, per entry point the stream's "
                "work (launches: kernels + GEMMs + cuDNN calls + copies, inside CUDA graphs or not), what the host "
                "issues for it and host syncs. Lower a bound when the test reports an improvement.")


def write_resnet50(path, width, image, batch, classes):
    """ResNet-50's structure (the module's docstring) as PATH: convolutions
    without biases, each followed by a BatchNormalization."""
    rng = np.random.default_rng(0)
    initializers, nodes = [], []

    def weight(name, *shape, value=None):
        array = rng.standard_normal(shape).astype(np.float32) * 0.1 if value is None else value
        initializers.append(numpy_helper.from_array(array, name))
        return name

    def node(op, inputs, name, outputs=1, **attributes):
        names = [name] + [f"{name}.{i}" for i in range(1, outputs)]
        nodes.append(helper.make_node(op, inputs, names, name=name, **attributes))
        return name

    def conv_bn(x, prefix, inputs, outputs, kernel, stride, relu=True):
        pad = kernel // 2
        y = node("Conv", [x, weight(prefix + ".weight", outputs, inputs, kernel, kernel)], prefix,
                 kernel_shape=[kernel, kernel], strides=[stride, stride], pads=[pad] * 4)
        bn = prefix + ".bn"
        y = node("BatchNormalization",
                 [y, weight(bn + ".weight", outputs, value=np.ones(outputs, np.float32)),
                  weight(bn + ".bias", outputs, value=np.zeros(outputs, np.float32)),
                  weight(bn + ".running_mean", outputs, value=np.zeros(outputs, np.float32)),
                  weight(bn + ".running_var", outputs, value=np.ones(outputs, np.float32))],
                 bn, outputs=5, epsilon=1e-5, momentum=0.9)
        return node("Relu", [y], prefix + ".relu") if relu else y

    x = conv_bn("image", "conv1", 3, width, 7, 2)
    x = node("MaxPool", [x], "maxpool", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    inputs = width
    for layer, blocks in enumerate(LAYERS):
        planes = width * 2**layer
        for block in range(blocks):
            p = f"layer{layer + 1}.{block}"
            stride = 2 if block == 0 and layer > 0 else 1
            y = conv_bn(x, p + ".conv1", inputs, planes, 1, 1)
            y = conv_bn(y, p + ".conv2", planes, planes, 3, stride)
            y = conv_bn(y, p + ".conv3", planes, 4 * planes, 1, 1, relu=False)
            shortcut = conv_bn(x, p + ".downsample", inputs, 4 * planes, 1, stride, relu=False) if block == 0 else x
            x = node("Relu", [node("Add", [y, shortcut], p + ".add")], p + ".relu")
            inputs = 4 * planes
    pooled = node("Flatten", [node("GlobalAveragePool", [x], "avgpool")], "flatten", axis=1)
    node("Gemm", [pooled, weight("fc.weight", classes, inputs), weight("fc.bias", classes)], "logits", transB=1)
    graph = helper.make_graph(
        nodes, "resnet50", [helper.make_tensor_value_info("image", TensorProto.FLOAT, [batch, 3, image, image])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [batch, classes])], initializer=initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    onnx.checker.check_model(model)
    onnx.save(model, path)


def main():
    parser = argparse.ArgumentParser()
    add_counting_arguments(parser, DEFAULT_BUDGET)
    args = parser.parse_args()
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    work = tempfile.mkdtemp(prefix="pipec-launch-count-resnet-")
    try:
        model = os.path.join(work, "resnet50.onnx")
        write_resnet50(model, **SHAPE)
        job = os.path.join(work, "job")
        run([args.pipec, model] + PIPEC_FLAGS + ["--out", job], env=env)
        source = open(os.path.join(job, "stages", "stage_0.cu")).read()
        convolutions = source.count("pk::conv(")
        rows = count_launches(args, os.path.join(job, "stages"), work, dict(env, PIPEC_EMU_COUNT_ONLY="1"))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    figures, unstable = per_microbatch(rows)
    print_counts(f"ResNet-50 stage ({convolutions} convolutions), --target cuda --precision bf16 -O2", figures)
    failures = count_failures(figures, unstable)
    if convolutions != 53:
        failures.append(f"the stage makes {convolutions} forward convolution calls; ResNet-50 has 53")
    return settle_budget(args, figures, failures, BUDGET_ABOUT,
                         "the counts are stable, every entry point launches and replays its graph")

if __name__ == "__main__":
    sys.exit(main())
