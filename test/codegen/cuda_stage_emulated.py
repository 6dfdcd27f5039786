#!/usr/bin/env python3
"""A generated CUDA stage, run without a GPU, against the CPU stage of the
same model (docs/optimization.md, "CUDA"). What the kernel library's own
emulated test (cuda-kernels-emulated) cannot see: the stage's generated
fused kernels, its GEMM epilogues, its memory plan (arena offsets, saved
activations written in place, weight gradients accumulated by GEMMs with
beta = 1) and the order of its library calls.

The model, written here with onnx.helper so that it has what -O2 fuses:
residual adds, a trained per-feature scale broadcast along the rows, a
constant scale, ReLU/tanh chains and their gradients, a training-mode
dropout, an exported erf-GELU
(recognised as nn.gelu) and three Linear layers (transposed weights, bias in
C). pipec compiles it for both targets at -O2; the CUDA stage's .cu goes
through the emulated kernels' translation (prep.py) and is compiled as a host
library against pipec_cuda_kernels_emulated; stage_targets_agree then calls
both stages with the same tensors for two micro-batches and an AdamW step and
compares every tensor they write; then the same for the CPU stage at -O0
(one library kernel per op, dropout's mask from pk::dropout) against -O2.
Then bf16 storage (--precision bf16, pipec-bf16-storage): this model, a
12-block GPT-2 (cuda_launch_count.py's tiny one), a 2-block one with a
vocabulary of 1,001 words (pipec-pad-classes) and the zoo's Llama
(test/models/hf-llama-legacy.onnx: RMSNorm, rotary, an additive mask,
grouped-query heads that nn.attention reads in place) as
CUDA stages storing activations in bf16, against their CPU stages in float32
within BF16_TOLERANCE; examples/cnn.onnx at tf32, its convolutions through
the fake cuDNN's graphs and its convolutional region channels-last
(pipec-channels-last), within CUDNN_CONV_TOLERANCE, and with bf16 storage
(convolutions, batch norms and pools on bf16) within CNN_BF16_TOLERANCE; a
convolutional network without norms (write_convnet: its ReLUs, ReLU6 and
residual add become the convolutions' epilogues, applied by the fake cuDNN's
fused graphs) at tf32 and bf16 the same way; and every zoo model compiles
for CUDA with bf16 storage.

    cuda_stage_emulated.py --pipec PIPEC --compare STAGE_TARGETS_AGREE
        --emulated-library LIB --emulation-dir DIR --cxx CXX --source-root ROOT
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

ROWS, FEATURES, HIDDEN, CLASSES = 6, 12, 16, 5
ODD_VOCABULARY = 1001  # not a multiple of 8: pipec-pad-classes pads it to 1,024


def write_model(path):
    rng = np.random.default_rng(3)

    def weight(name, *shape):
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.3).astype(np.float32), name)

    inits = [weight("w1", HIDDEN, FEATURES), weight("b1", HIDDEN), weight("w2", HIDDEN, HIDDEN),
             weight("b2", HIDDEN), weight("gain", HIDDEN), weight("w3", CLASSES, HIDDEN), weight("b3", CLASSES),
             numpy_helper.from_array(np.array(0.5, np.float32), "half"),
             numpy_helper.from_array(np.array(1.0, np.float32), "one"),
             numpy_helper.from_array(np.array(np.sqrt(2.0), np.float32), "root2"),
             numpy_helper.from_array(np.array(0.25, np.float32), "ratio"),
             numpy_helper.from_array(np.array(True), "training")]
    nodes = [
        helper.make_node("Gemm", ["x", "w1", "b1"], ["h1"], transB=1, name="fc1"),
        helper.make_node("Relu", ["h1"], ["r1"], name="relu1"),
        helper.make_node("Gemm", ["r1", "w2", "b2"], ["h2"], transB=1, name="fc2"),
        # residual, per-feature gain (broadcast along rows), constant scale, tanh
        helper.make_node("Add", ["h2", "r1"], ["res"], name="residual"),
        helper.make_node("Mul", ["res", "gain"], ["gained"], name="gain"),
        helper.make_node("Relu", ["gained"], ["r2"], name="relu2"),
        # training-mode dropout, as the legacy exporter writes it: fused
        # with its neighbours at -O2, its mask drawn inside the loop
        helper.make_node("Dropout", ["r2", "ratio", "training"], ["dropped", "dropped_mask"], name="drop"),
        helper.make_node("Mul", ["dropped", "half"], ["scaled"], name="scale"),
        helper.make_node("Tanh", ["scaled"], ["t"], name="tanh"),
        helper.make_node("Add", ["t", "r1"], ["res2"], name="residual2"),
        # the exact GELU as exporters write it
        helper.make_node("Div", ["res2", "root2"], ["g_div"], name="gelu_div"),
        helper.make_node("Erf", ["g_div"], ["g_erf"], name="gelu_erf"),
        helper.make_node("Add", ["g_erf", "one"], ["g_add"], name="gelu_add"),
        helper.make_node("Mul", ["res2", "g_add"], ["g_mul"], name="gelu_mul"),
        helper.make_node("Mul", ["g_mul", "half"], ["g"], name="gelu_half"),
        helper.make_node("Gemm", ["g", "w3", "b3"], ["logits"], transB=1, name="head"),
    ]
    graph = helper.make_graph(nodes, "fusable", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                               [ROWS, FEATURES])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [ROWS, CLASSES])],
                              initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    onnx.checker.check_model(model)
    onnx.save(model, path)


def write_convnet(path):
    """A network without norms, whose activations and residual add follow
    convolutions directly (VGG's and pre-activation ResNets' shape):
    conv+bias -> ReLU; conv+bias + that ReLU's output -> ReLU; a depthwise
    conv without bias -> ReLU6 (Clip); a 1-D-free global pool and a Linear
    head. At tf32 and bf16 pipec-fuse-norm-epilogue folds each activation
    and the add into its convolution (pk::conv's epilogue)."""
    rng = np.random.default_rng(5)

    def weight(name, *shape, scale=0.3):
        return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)

    inits = [weight("c1w", 8, 3, 3, 3), weight("c1b", 8, scale=0.1), weight("c2w", 8, 8, 3, 3, scale=0.15),
             weight("c2b", 8, scale=0.1), weight("c3w", 8, 1, 3, 3), weight("hw", CLASSES, 8), weight("hb", CLASSES),
             numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
             numpy_helper.from_array(np.array(6.0, np.float32), "six")]
    nodes = [
        helper.make_node("Conv", ["x", "c1w", "c1b"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "c2w", "c2b"], ["c2"], pads=[1, 1, 1, 1], name="conv2"),
        helper.make_node("Add", ["c2", "r1"], ["res"], name="residual"),
        helper.make_node("Relu", ["res"], ["r2"], name="relu2"),
        helper.make_node("Conv", ["r2", "c3w"], ["c3"], pads=[1, 1, 1, 1], strides=[2, 2], group=8, name="dw"),
        helper.make_node("Clip", ["c3", "zero", "six"], ["r3"], name="relu6"),
        helper.make_node("GlobalAveragePool", ["r3"], ["pooled"], name="pool"),
        helper.make_node("Flatten", ["pooled"], ["flat"], name="flatten"),
        helper.make_node("Gemm", ["flat", "hw", "hb"], ["logits"], transB=1, name="head"),
    ]
    graph = helper.make_graph(nodes, "convnet", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                               [4, 3, 10, 10])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [4, CLASSES])],
                              initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    onnx.checker.check_model(model)
    onnx.save(model, path)


def run(cmd, **kwargs):
    result = subprocess.run(cmd, capture_output=True, text=True, **kwargs)
    if result.returncode != 0:
        sys.exit(f"FAIL: {' '.join(cmd)} exited {result.returncode}\n{result.stdout}{result.stderr}")
    return result


def build_emulated_stage(stages, translated, emulation, library, cxx, root):
    """Translates the CUDA stage_0.cu of STAGES for host emulation (prep.py)
    into TRANSLATED and compiles it with the emulated kernel LIBRARY into
    TRANSLATED/libstage_0.so, which it returns."""
    run([sys.executable, os.path.join(emulation, "prep.py"), stages, translated])
    stage = os.path.join(translated, "libstage_0.so")
    run([cxx, "-std=c++17", "-O1", "-ffp-contract=off", "-fPIC", "-shared", "-w",
         "-include", os.path.join(emulation, "emu.h"),
         "-I", os.path.join(emulation, "inc"),
         "-I", os.path.join(root, "runtime", "kernels", "cuda", "include"),
         "-I", os.path.join(root, "runtime", "kernels", "include"),
         "-I", os.path.join(root, "runtime", "include"),
         f'-DPIPEC_STAGE_DIR="{stages}"',
         os.path.join(translated, "stage_0.cpp"), library, "-o", stage])
    return stage


def add_emulation_arguments(parser):
    """What building an emulated stage needs: pipec, the emulated kernel
    library and its folder, the compiler, the source tree."""
    parser.add_argument("--pipec", required=True)
    parser.add_argument("--emulated-library", required=True, help="libpipec_cuda_kernels_emulated.a")
    parser.add_argument("--emulation-dir", required=True, help="test/kernels/cuda_emulation")
    parser.add_argument("--cxx", required=True)
    parser.add_argument("--source-root", required=True)


def main():
    parser = argparse.ArgumentParser()
    add_emulation_arguments(parser)
    parser.add_argument("--compare", required=True, help="the stage_targets_agree executable")
    args = parser.parse_args()
    root, emulation = args.source_root, args.emulation_dir
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    with tempfile.TemporaryDirectory(prefix="pipec-cuda-emu-") as work:
        model = os.path.join(work, "fusable.onnx")
        write_model(model)
        cpu, cuda, translated = (os.path.join(work, d) for d in ("cpu", "cuda", "translated"))
        common = [args.pipec, model, "--gpus", "1x1", "--microbatches", "2", "-O2", "--optimizer", "adamw"]
        run(common + ["--out", cpu, "--build"], env=env)
        run(common + ["--target", "cuda", "--out", cuda], env=env)
        stages = os.path.join(cuda, "stages")
        source = open(os.path.join(stages, "stage_0.cu")).read()
        fused = source.count("__global__ void fused")
        # The test exists for these kernels: a model that stops fusing must
        # fail here, not pass on library calls alone.
        if fused < 2:
            sys.exit(f"FAIL: the CUDA stage has {fused} generated fused kernels; expected at least 2 "
                     "(forward and backward)")
        # fc1's ReLU is its GEMM's epilogue (with the bias: cuBLASLt's RELU_BIAS).
        epilogues = sum(1 for line in source.splitlines() if "pk::gemm(" in line and "pk::Unary::" in line)
        if epilogues < 1:
            sys.exit("FAIL: no GEMM of the CUDA stage has an activation epilogue; expected fc1's ReLU")
        library = build_emulated_stage(stages, translated, emulation, args.emulated_library, args.cxx, root)
        if "pipec::kernels::dropoutDraw" not in source:
            sys.exit("FAIL: the dropout was not fused: no generated kernel draws its mask")
        compared = subprocess.run([args.compare, os.path.join(cpu, "stages", "libstage_0.so"), library],
                                  capture_output=True, text=True, env=env)
        print(f"{fused} generated fused kernels and {epilogues} GEMM epilogues in the CUDA stage")
        print(compared.stdout + compared.stderr, end="")
        # The fused loops (dropout's mask drawn inside them) against the
        # library's kernels one op at a time: the CPU stage at -O0.
        direct = os.path.join(work, "cpu-O0")
        run([args.pipec, model, "--gpus", "1x1", "--microbatches", "2", "-O0", "--optimizer", "adamw", "--out", direct,
             "--build"], env=env)
        unfused = subprocess.run([args.compare, os.path.join(direct, "stages", "libstage_0.so"),
                                  os.path.join(cpu, "stages", "libstage_0.so")], capture_output=True, text=True,
                                 env=env)
        print("CPU stage at -O0 (one kernel per op) against -O2 (fused):")
        print(unfused.stdout + unfused.stderr, end="")
        failures = int(compared.returncode != 0) + int(unfused.returncode != 0)
        failures += compare_bf16_storage(args, work, env, "fusable", model, cpu)
        # A 12-block GPT-2 (cuda-launch-count's tiny one): layer norms, the
        # attention, the loss, embeddings and their gradients.
        from cuda_launch_count import TINY, write_gpt2  # noqa: E402 (imports this module)
        gpt = os.path.join(work, "gpt.onnx")
        write_gpt2(gpt, **TINY)
        gpt_cpu = os.path.join(work, "gpt-cpu")
        run([args.pipec, gpt, "--gpus", "1x1", "--microbatches", "2", "-O2", "--optimizer", "adamw", "--out", gpt_cpu,
             "--build"], env=env)
        failures += compare_bf16_storage(args, work, env, "gpt", gpt, gpt_cpu)
        # Two blocks with a vocabulary of 1,001 words and 160 tokens per
        # micro-batch: pipec-pad-classes rounds the vocabulary GEMMs to 1,024
        # classes (the loss told 1,001), which must not change a value.
        odd = os.path.join(work, "gpt-odd-vocabulary.onnx")
        write_gpt2(odd, **dict(TINY, layers=2, vocab=ODD_VOCABULARY, batch=20))
        odd_cpu = os.path.join(work, "gpt-odd-vocabulary-cpu")
        run([args.pipec, odd, "--gpus", "1x1", "--microbatches", "2", "-O2", "--optimizer", "adamw", "--out", odd_cpu,
             "--build"], env=env)
        failures += compare_bf16_storage(args, work, env, "gpt-odd-vocabulary", odd, odd_cpu,
                                         expect=f"int64_t({ODD_VOCABULARY})")
        # A Llama of the model zoo: RMSNorm, rotary tables and an additive
        # attention mask, which bf16 storage keeps float32.
        llama = os.path.join(root, "test", "models", "hf-llama-legacy.onnx")
        llama_cpu = os.path.join(work, "llama-cpu")
        run([args.pipec, llama, "--gpus", "1x1", "--microbatches", "2", "-O2", "--optimizer", "adamw", "--out",
             llama_cpu, "--build"], env=env)
        failures += compare_bf16_storage(args, work, env, "llama", llama, llama_cpu)
        # The CNN example at --precision tf32: its convolutions run cuDNN's
        # graphs (the fake cudnn_frontend, in double), every sample's weight
        # gradient in one call.
        # SGD: a convolution's bias before a batch norm has a gradient of
        # rounding noise only, which AdamW's step would scale up to the
        # learning rate.
        cnn = os.path.join(root, "examples", "cnn.onnx")
        cnn_cpu = os.path.join(work, "cnn-cpu")
        run([args.pipec, cnn, "--gpus", "1x1", "--microbatches", "2", "-O2", "--optimizer", "sgd", "--out", cnn_cpu,
             "--build"], env=env)
        failures += compare_cudnn_convolutions(args, work, env, cnn, cnn_cpu)
        # And with bf16 storage: convolutions, batch norms and pools on bf16
        # activations (cuDNN's bf16 graphs), statistics and gradients float.
        failures += compare_bf16_storage(args, work, env, "cnn", cnn, cnn_cpu, optimizer="sgd",
                                         tolerance=CNN_BF16_TOLERANCE)
        # Convolutions with their activations and residual add as epilogues.
        convnet = os.path.join(work, "convnet.onnx")
        write_convnet(convnet)
        convnet_cpu = os.path.join(work, "convnet-cpu")
        run([args.pipec, convnet, "--gpus", "1x1", "--microbatches", "2", "-O2", "--optimizer", "sgd", "--out",
             convnet_cpu, "--build"], env=env)
        failures += compare_cudnn_convolutions(args, work, env, convnet, convnet_cpu, name="convnet", epilogues=3)
        failures += compare_bf16_storage(args, work, env, "convnet", convnet, convnet_cpu, optimizer="sgd",
                                         tolerance=CONVNET_BF16_TOLERANCE, expect="pk::Unary::Relu6")
        failures += compile_zoo_bf16(args, work, env)
        return 1 if failures else 0


def compile_zoo_bf16(args, work, env):
    """Every model of test/models compiles for CUDA with bf16 storage (two
    stages, sources only): what the float32-only comparisons above cannot
    show for other families (masks, tables and statistics kept float32).
    Returns the number of failures."""
    zoo = os.path.join(args.source_root, "test", "models")
    failures = 0
    models = sorted(name for name in os.listdir(zoo) if name.endswith(".onnx"))
    for name in models:
        out = os.path.join(work, "zoo-bf16")
        result = subprocess.run([args.pipec, os.path.join(zoo, name), "--gpus", "1x2", "--stages", "2", "--target",
                                 "cuda", "--precision", "bf16", "-O2", "--out", out], capture_output=True, text=True,
                                env=env)
        if result.returncode != 0:
            failures += 1
            print(f"FAIL: {name} does not compile for CUDA with bf16 storage:\n{result.stderr[-1500:]}")
        shutil.rmtree(out, ignore_errors=True)
    print(f"{len(models) - failures} of {len(models)} zoo models compile for CUDA with bf16 storage")
    return failures


# bf16 storage against the CPU's float32, relative to each tensor's largest
# value: bf16 keeps 8 significant bits (a rounding of at most 2^-9 per stored
# value), and a value reaching the weight gradients of a 12-block GPT-2 is
# stored a few dozen times on its way (activations, their gradients, the
# operands of every product); the worst seen is about 1.3e-2, on layer-norm
# scale gradients, and test/gpu/cuda_target.py allows bf16 training the same.
BF16_TOLERANCE = 3e-2


# The CNN's bf16 stage: a batch norm makes the loss invariant to the scale
# of the convolution weight before it, so that weight's gradient is a small
# difference of large terms, and every bf16 rounding of the activations and
# gradients summed into it counts against that small result. PyTorch-style
# bf16 rounding of every stored activation and gradient in an otherwise
# float64 model of this network (2026-11-28) moved conv1's and conv2's
# weight gradients by 14% and 12% of their largest element, the batch
# norms' by 5%, the classifier's by 0.3%; pipec's bf16 stage moves them by
# up to 21% (it also rounds the pools' and the padding's results, and
# bf16 ties move max pooling's gradient). Forward values (loss, running
# statistics) agree to 1e-3.
CNN_BF16_TOLERANCE = 0.3


# The norm-free convnet's bf16 stage: its first convolution's weight
# gradient sums, per element, 400 products of the image and the gradient of
# both signs, which cancel to about a twentieth of the sum of their
# magnitudes, so bf16's rounding of each stored operand shows as 3-5% of the
# largest element (2026-11-29: 2.7e-2 and 5.3e-2 with the activations as
# ops of their own, 3.2e-2 and 5.0e-2 as the convolutions' epilogues); every
# other tensor agrees within 1e-2, and at tf32 within 1e-6.
CONVNET_BF16_TOLERANCE = 0.1


# The CNN's CUDA stage at tf32 against its CPU stage (SGD): the fake cuDNN
# sums its convolutions in double, the CPU kernels in float.
CUDNN_CONV_TOLERANCE = 1e-4


def compare_cudnn_convolutions(args, work, env, model, cpu, name="cnn", epilogues=0):
    """The CUDA stage of MODEL at --precision tf32, whose convolutions run
    cuDNN's graphs, against the CPU stage CPU within CUDNN_CONV_TOLERANCE;
    EPILOGUES of its forward convolutions apply an activation
    (pipec-fuse-norm-epilogue). Returns the number of failures."""
    cuda = os.path.join(work, name + "-cuda-tf32")
    run([args.pipec, model, "--gpus", "1x1", "--microbatches", "2", "-O2", "--optimizer", "sgd", "--target", "cuda",
         "--precision", "tf32", "--out", cuda], env=env)
    stages = os.path.join(cuda, "stages")
    source = open(os.path.join(stages, "stage_0.cu")).read()
    calls = [call for call in ("pk::conv(", "pk::convInputGrad(", "pk::convWeightGrad(") if call in source]
    if len(calls) != 3:
        print(f"FAIL: {name}: the CUDA stage makes {len(calls)} of the 3 convolution calls")
        return 1
    lines = source.splitlines()
    region = [line for line in lines
              if any(call in line for call in ("pk::conv(", "pk::batchNorm(", "pk::maxPool(", "pk::globalAveragePool("))]
    # A channels-last call ends with the flag, or with the epilogue after it.
    if not region or not all(line.rstrip().endswith(", true);") or ", true, " in line for line in region):
        print(f"FAIL: {name}: the tf32 CUDA stage's convolutional region is not channels-last (pipec-channels-last)")
        return 1
    fused = sum(1 for line in lines if "pk::conv(" in line and "pk::Unary::" in line)
    if fused != epilogues:
        print(f"FAIL: {name}: {fused} convolutions apply an activation epilogue; expected {epilogues}")
        return 1
    library = build_emulated_stage(stages, os.path.join(work, name + "-translated-tf32"), args.emulation_dir,
                                   args.emulated_library, args.cxx, args.source_root)
    compared = subprocess.run([args.compare, os.path.join(cpu, "stages", "libstage_0.so"), library, "--tolerance",
                               str(CUDNN_CONV_TOLERANCE)], capture_output=True, text=True, env=env)
    print(f"{name}: CUDA stage at tf32 (convolutions on the emulated cuDNN) against the CPU stage:")
    print(compared.stdout + compared.stderr, end="")
    return int(compared.returncode != 0)


def compare_bf16_storage(args, work, env, name, model, cpu, optimizer="adamw", tolerance=BF16_TOLERANCE, expect=None):
    """The CUDA stage of MODEL at --precision bf16 (pipec-bf16-storage)
    against the CPU stage CPU: within TOLERANCE, and differing from it
    by more than float32 rounding somewhere (else nothing was stored in
    bf16); its source contains EXPECT if given. Returns the number of
    failures."""
    cuda = os.path.join(work, name + "-cuda-bf16")
    run([args.pipec, model, "--gpus", "1x1", "--microbatches", "2", "-O2", "--optimizer", optimizer, "--target",
         "cuda", "--precision", "bf16", "--out", cuda], env=env)
    stages = os.path.join(cuda, "stages")
    source = open(os.path.join(stages, "stage_0.cu")).read()
    if "pk::bf16 *" not in source:
        print(f"FAIL: {name}: the bf16 CUDA stage stores nothing in bf16")
        return 1
    if expect and expect not in source:
        print(f"FAIL: {name}: the bf16 CUDA stage has no {expect}")
        return 1
    library = build_emulated_stage(stages, os.path.join(work, name + "-translated-bf16"), args.emulation_dir,
                                   args.emulated_library, args.cxx, args.source_root)
    compared = subprocess.run([args.compare, os.path.join(cpu, "stages", "libstage_0.so"), library, "--tolerance",
                               str(tolerance)], capture_output=True, text=True, env=env)
    print(f"{name}: CUDA stage with bf16 storage (emulated) against the CPU stage in float32:")
    print(compared.stdout + compared.stderr, end="")
    worst = max((float(line.split("worst ")[1].split()[0]) for line in compared.stdout.splitlines()
                 if " worst " in line), default=0.0)
    if worst <= 1e-4:
        print(f"FAIL: {name}: the bf16 stage agrees with float32 to {worst:.1e}: nothing was rounded to bf16")
        return 1
    return int(compared.returncode != 0)


if __name__ == "__main__":
    sys.exit(main())
