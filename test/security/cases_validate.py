"""Strict model validation (issue 11, item 3): duplicate names, unknown or
mistyped attributes, NUL bytes in names, declared output types that disagree
with inference, absurd and negative dimensions. Each model is a small binary
ONNX file built with the onnx package (no checker) by
test/import/errors/Inputs/make_invalid_model.py, which the lit tests share."""
import importlib.util
import os

from corpus import Case

HERE = os.path.dirname(os.path.abspath(__file__))
GENERATOR = os.path.join(HERE, "..", "import", "errors", "Inputs", "make_invalid_model.py")


def _generator():
    spec = importlib.util.spec_from_file_location("make_invalid_model", GENERATOR)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# kind -> regular expressions the message must hold (besides the file name).
REFUSED = {
    "nul_node_name": [r"node name 'fc\\0evil' contains a NUL byte"],
    "nul_value_name": [r"node 'fc' \(Gemm\): output 0 'h\\0idden' contains a NUL byte"],
    "nul_initializer_name": [r"initializer 'w\\0eights' contains a NUL byte"],
    "nul_graph_name": [r"graph name 'lin\\0ear' contains a NUL byte"],
    "duplicate_output": [r"node 'again' \(Neg\): output 0 'h' is already defined by node 'fc' \(Gemm\)"],
    "duplicate_node_outputs": [r"node 'split' \(Split\): output 1 's' is already defined by node 'split'"],
    "duplicate_initializer": [r"initializer 'w' is defined twice"],
    "initializer_input_clash": [r"graph input 'w' shares its name with an initializer but declares "
                                r"float\[8,4\] but the initializer is float\[4,8\]"],
    "redefined_input": [r"node 'overwrite' \(Identity\): output 0 'x' is already defined by graph input"],
    "duplicate_graph_output": [r"graph output 'y' is listed twice"],
    "misspelt_attribute": [r"node 'probs' \(Softmax\): unknown attribute 'axsi'.*did you mean 'axis'\?"],
    "wrong_attribute_type": [r"node 'probs' \(Softmax\): attribute 'axis' is FLOAT but Softmax "
                             r"\(version 13\) expects INT"],
    "attribute_without_value": [r"node 'probs' \(Softmax\): attribute 'axis' is declared INT but holds no value"],
    "attribute_without_type": [r"node 'probs' \(Softmax\): attribute 'axis' has no type and no value"],
    "output_shape_mismatch": [r"graph output 'y' \(from node 'act' \(Relu\)\) is declared as float\[2,5\] "
                              r"but pipec infers float\[2,4\]"],
    "output_type_mismatch": [r"graph output 'y' .* is declared as int64\[2,4\] but pipec infers float\[2,4\]"],
    "value_info_mismatch": [r"value 'h' \(from node 'fc' \(Gemm\)\) is declared as float\[2,7\] "
                            r"but pipec infers float\[2,4\]"],
    "negative_input_dim": [r"graph input 'x' declares dimension 1 as -5"],
    "negative_initializer_dim": [r"initializer 'w' has a negative dimension in \[-4,8\]"],
    "huge_initializer": [r"initializer 'w' of shape \[2147483648,2147483648\] has more than 1099511627776 bytes"],
    "huge_constant": [r"node 'const' \(Constant\): tensor attribute 'value' of shape "
                      r"\[1048576,1048576,1048576\] has more than"],
}

ACCEPTED = ["ok_plain", "ok_control_names", "ok_initializer_as_input"]


def cases(ctx):
    generator = _generator()
    out = []

    def model_case(kind, argv_extra=(), expect=(), ok=False):
        path = ctx.path("validate", f"{kind}.onnx")
        out.append(Case(
            name=kind,
            argv=[ctx.pipec, path, *argv_extra],
            expect=[] if ok else [re_escape(os.path.basename(path)), *expect],
            ok=ok, timeout=60,
            setup=lambda kind=kind, path=path: generator.write(kind, path)))

    for kind, expect in REFUSED.items():
        model_case(kind, expect=expect)
    for kind in ACCEPTED:
        model_case(kind, ok=True)
    # The case: a batch of 2^62 planned with activations of "4 B".
    model_case("batch_2_62", argv_extra=["--gpus", "1x2", "--microbatches", "2",
                                         "--out", ctx.path("validate", "batch_2_62-job")],
               expect=[r"graph input 'x' of shape \[4611686018427387904,8\] \(float\) has more than "
                       r"1099511627776 bytes"])
    # A name with control characters compiles into a job that builds.
    model_case("ok_control_names_build", ok=True)
    out[-1].argv = [ctx.pipec, ctx.path("validate", "ok_control_names_build.onnx"), "--gpus", "1x2",
                    "--microbatches", "2", "--out", ctx.path("validate", "control-job"), "--build"]
    out[-1].setup = lambda: generator.write("ok_control_names",
                                            ctx.path("validate", "ok_control_names_build.onnx"))
    out[-1].timeout = 300
    return out


def re_escape(text):
    import re
    return re.escape(text)
