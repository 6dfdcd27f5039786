"""Security corpus, area "import" (issue 11, items 2 and 4): bounded, checked
reading of ONNX models, external data and .npy files; checked folding of
shape computations; linear-time import of large valid graphs.

Models are written with the `onnx` package of the Python running corpus.py
(the project's .venv), at setup time, into the scratch directory."""
import os
import sys

from corpus import Case

INT64_MAX = (1 << 63) - 1
INT64_MIN = -(1 << 63)


def _onnx():
    import onnx  # noqa: F401 (imported lazily: only setup needs it)
    from onnx import TensorProto, helper
    return onnx, TensorProto, helper


def _save(path, nodes, outputs, initializers=(), inputs=None, opset=13):
    onnx, TensorProto, helper = _onnx()
    if inputs is None:
        inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])]
    graph = helper.make_graph(nodes, "case", inputs, outputs, list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as out:
        out.write(model.SerializeToString())


def _int_constant(name, values, dims=None):
    onnx, TensorProto, helper = _onnx()
    tensor = helper.make_tensor(name + "_value", TensorProto.INT64,
                                [len(values)] if dims is None else dims, values)
    return helper.make_node("Constant", [], [name], name=name, value=tensor)


def _fold_model(path, op, a, b=None, attrs=None):
    """y = op(a, b) on int64 constants: folded at import."""
    onnx, TensorProto, helper = _onnx()
    nodes = [_int_constant("a", [a])]
    inputs = ["a"]
    if b is not None:
        nodes.append(_int_constant("b", [b]))
        inputs.append("b")
    nodes.append(helper.make_node(op, inputs, ["y"], name="fold_" + op.lower(), **(attrs or {})))
    _save(path, nodes, [helper.make_tensor_value_info("y", TensorProto.INT64, [1])])


def _external_model(path, location, offset=None, length="16", data=None):
    """y = x * w, w (4 floats) stored externally at `location`; `data` (bytes)
    written there unless None."""
    onnx, TensorProto, helper = _onnx()
    tensor = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[4])
    tensor.data_location = TensorProto.EXTERNAL
    fields = [("location", location)]
    if offset is not None:
        fields.append(("offset", offset))
    if length is not None:
        fields.append(("length", length))
    for key, value in fields:
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value
    _save(path, [helper.make_node("Mul", ["x", "w"], ["y"], name="scale")],
          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])], [tensor],
          inputs=[helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])])
    if data is not None:
        with open(os.path.join(os.path.dirname(path), location), "wb") as out:
            out.write(data)


def _mkfifo(path):
    if os.path.lexists(path):
        os.remove(path)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    os.mkfifo(path)


def cases(ctx):
    pipec = ctx.pipec
    reference = os.path.join(os.path.dirname(ctx.pipec), "pipec-reference")
    out = []

    def model_case(name, build, expect, argv_extra=(), **kw):
        path = ctx.path("import", name, "model.onnx")
        out.append(Case(name, [pipec, path, *argv_extra], expect=expect,
                        setup=lambda: build(path), **kw))

    # ---- 1. the model file: regular files only, size bounded before reading
    out.append(Case("model-dev-zero", [pipec, "/dev/zero"],
                    expect=[r"/dev/zero", r"character device, not a regular file"],
                    timeout=20, memory_gib=1.0))
    fifo = ctx.path("import", "fifo", "model.onnx")
    out.append(Case("model-fifo", [pipec, fifo], expect=[r"fifo/model\.onnx", r"FIFO"],
                    timeout=20, setup=lambda: _mkfifo(fifo)))
    fifo_text = ctx.path("import", "fifo-text", "model.onnxtext")
    out.append(Case("model-fifo-onnxtext", [pipec, fifo_text],
                    expect=[r"model\.onnxtext", r"FIFO"], timeout=20,
                    setup=lambda: _mkfifo(fifo_text)))
    big = ctx.path("import", "big", "model.onnx")

    def sparse_big():
        with open(big, "wb") as f:
            f.truncate((2 << 30) + 1)
    out.append(Case("model-over-size-limit", [pipec, big],
                    expect=[r"big/model\.onnx", r"over the limit"], timeout=20,
                    memory_gib=1.0, setup=sparse_big))
    directory = ctx.path("import", "directory.onnx", "x")
    out.append(Case("model-directory", [pipec, os.path.dirname(directory)],
                    expect=[r"directory\.onnx", r"directory"], timeout=20))

    # ---- 2. external data: overflow-safe offset/length, regular files only
    model_case("external-offset-int64-max",
               lambda p: _external_model(p, "w.bin", offset=str(INT64_MAX), data=bytes(16)),
               [r"model\.onnx", r"initializer 'w'", r"offset 9223372036854775807",
                r"past the end"])
    model_case("external-offset-near-int64-max",
               lambda p: _external_model(p, "w.bin", offset=str(INT64_MAX - 8), length="16",
                                         data=bytes(16)),
               [r"model\.onnx", r"initializer 'w'", r"past the end"])
    model_case("external-offset-negative",
               lambda p: _external_model(p, "w.bin", offset="-16", data=bytes(16)),
               [r"initializer 'w'", r"offset '-16'", r"not a non-negative"])
    model_case("external-offset-garbage",
               lambda p: _external_model(p, "w.bin", offset="12abc", data=bytes(16)),
               [r"initializer 'w'", r"offset '12abc'", r"not a non-negative"])
    model_case("external-length-2^64",
               lambda p: _external_model(p, "w.bin", length=str(1 << 64), data=bytes(16)),
               [r"initializer 'w'", r"length '18446744073709551616'", r"not a non-negative"])
    model_case("external-length-mismatch",
               lambda p: _external_model(p, "w.bin", length="8", data=bytes(16)),
               [r"initializer 'w'", r"expects 16 bytes", r"length is 8"])
    model_case("external-short-file",
               lambda p: _external_model(p, "w.bin", offset="8", data=bytes(16)),
               [r"initializer 'w'", r"8 bytes short"])
    model_case("external-no-length-extra-bytes",
               lambda p: _external_model(p, "w.bin", length=None, data=bytes(24)),
               [r"initializer 'w'", r"no length"])

    def external_fifo(p):
        _external_model(p, "w.bin")
        _mkfifo(os.path.join(os.path.dirname(p), "w.bin"))
    model_case("external-data-fifo", external_fifo,
               [r"model\.onnx", r"initializer 'w'", r"FIFO, not a regular file"], timeout=20)

    def external_directory(p):
        _external_model(p, "w.bin")
        os.makedirs(os.path.join(os.path.dirname(p), "w.bin"), exist_ok=True)
    model_case("external-data-directory", external_directory,
               [r"initializer 'w'", r"directory, not a regular file"])
    model_case("external-data-escapes",
               lambda p: _external_model(p, "../../../etc/passwd"),
               [r"initializer 'w'", r"outside the model's folder"])
    # The weights for training are read through the same checks.
    model_case("external-offset-int64-max-build",
               lambda p: _external_model(p, "w.bin", offset=str(INT64_MAX), data=bytes(16)),
               [r"initializer 'w'", r"past the end"],
               argv_extra=("--gpus", "1x1", "--out", ctx.path("import", "out-ext")))

    # ---- 3. initializers: dims against data, overflow, typed fields
    def initializer_model(p, dims, raw=None, field=None, op_shape=True):
        onnx, TensorProto, helper = _onnx()
        t = TensorProto(name="shape", data_type=TensorProto.INT64, dims=dims)
        if raw is not None:
            t.raw_data = raw
        if field == "int32":
            t.int32_data.extend([1] * max(0, 1 if not dims else dims[0]))
        _save(p, [helper.make_node("Reshape", ["x", "shape"], ["y"], name="reshape")],
              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])], [t])
    model_case("initializer-dims-overflow",
               lambda p: initializer_model(p, [1 << 32, 1 << 32], raw=b""),
               [r"initializer 'shape'", r"overflows 64 bits|has more than"])
    model_case("initializer-negative-dim",
               lambda p: initializer_model(p, [-1], raw=b""),
               [r"initializer 'shape'", r"negative dimension"])
    model_case("initializer-dims-disagree-with-data",
               lambda p: initializer_model(p, [3], raw=bytes(8)),
               [r"initializer 'shape'", r"holds 8 bytes", r"24 expected"])
    model_case("initializer-wrong-typed-field",
               lambda p: initializer_model(p, [1], field="int32"),
               [r"initializer 'shape'", r"0 values in int64_data"])

    # ---- 4. folding: checked int64 arithmetic, bounded folded values
    model_case("fold-div-int64-min-by-minus-one",
               lambda p: _fold_model(p, "Div", INT64_MIN, -1),
               [r"node 'fold_div'", r"overflow in Div"])
    model_case("fold-mod-int64-min-by-minus-one-is-zero",
               lambda p: _fold_model(p, "Mod", INT64_MIN, -1), [], ok=True)
    model_case("fold-fmod-int64-min-by-minus-one-is-zero",
               lambda p: _fold_model(p, "Mod", INT64_MIN, -1, {"fmod": 1}), [], ok=True)
    model_case("fold-div-by-zero", lambda p: _fold_model(p, "Div", 7, 0),
               [r"node 'fold_div'", r"division by zero"])
    model_case("fold-mod-by-zero", lambda p: _fold_model(p, "Mod", 7, 0),
               [r"node 'fold_mod'", r"modulo by zero"])
    model_case("fold-add-overflow", lambda p: _fold_model(p, "Add", INT64_MAX, 1),
               [r"node 'fold_add'", r"overflow in Add"])
    model_case("fold-sub-overflow", lambda p: _fold_model(p, "Sub", INT64_MIN, 1),
               [r"node 'fold_sub'", r"overflow in Sub"])
    model_case("fold-mul-overflow", lambda p: _fold_model(p, "Mul", INT64_MAX, 2),
               [r"node 'fold_mul'", r"overflow in Mul"])
    model_case("fold-neg-int64-min", lambda p: _fold_model(p, "Neg", INT64_MIN),
               [r"node 'fold_neg'", r"overflow"])
    model_case("fold-abs-int64-min", lambda p: _fold_model(p, "Abs", INT64_MIN),
               [r"node 'fold_abs'", r"overflow"])
    model_case("fold-pow-overflow", lambda p: _fold_model(p, "Pow", 3, 100),
               [r"node 'fold_pow'", r"overflow in Pow"])
    model_case("fold-pow-huge-exponent", lambda p: _fold_model(p, "Pow", 3, INT64_MAX),
               [r"node 'fold_pow'", r"overflow in Pow"], timeout=10)

    def range_model(p, limit, kind="int"):
        onnx, TensorProto, helper = _onnx()
        if kind == "int":
            nodes = [_int_constant(n, [v], dims=[]) for n, v in
                     (("start", 0), ("limit", limit), ("delta", 1))]
            elem = TensorProto.INT64
        else:
            nodes = [helper.make_node("Constant", [], [n], name=n,
                                      value=helper.make_tensor(n + "_v", TensorProto.FLOAT, [], [v]))
                     for n, v in (("start", 0.0), ("limit", limit), ("delta", 1.0))]
            elem = TensorProto.FLOAT
        nodes.append(helper.make_node("Range", ["start", "limit", "delta"], ["y"], name="range"))
        _save(p, nodes, [helper.make_tensor_value_info("y", elem, ["N"])])
    model_case("fold-range-2^40", lambda p: range_model(p, 1 << 40),
               [r"node 'range'", r"1099511627776 elements", r"limit"],
               timeout=20, memory_gib=2.0)
    model_case("fold-range-float-inf", lambda p: range_model(p, float("inf"), "float"),
               [r"node 'range'", r"no finite size"])

    def fill_model(p, dims):
        onnx, TensorProto, helper = _onnx()
        nodes = [_int_constant("shape", dims),
                 helper.make_node("ConstantOfShape", ["shape"], ["y"], name="fill")]
        _save(p, nodes, [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", "M"])])
    model_case("fold-constant-of-shape-2^40", lambda p: fill_model(p, [1 << 20, 1 << 20]),
               [r"node 'fill'", r"\[1048576,1048576\]", r"67108864 elements"],
               timeout=20, memory_gib=2.0)
    model_case("fold-constant-of-shape-negative", lambda p: fill_model(p, [4, -2]),
               [r"node 'fill'", r"negative dimension"])
    model_case("fold-constant-of-shape-overflow",
               lambda p: fill_model(p, [1 << 40, 1 << 40]),
               [r"node 'fill'", r"67108864 elements"])

    # A shape of two million dimensions (computed by Range, so the file is
    # small): refused, and the message shows only the first dimensions
    # (fuzz_onnx once timed out building a 25 MB message).
    def many_dims_model(p):
        onnx, TensorProto, helper = _onnx()
        nodes = [_int_constant("start", [2], dims=[]), _int_constant("limit", [2000002], dims=[]),
                 _int_constant("delta", [1], dims=[]),
                 helper.make_node("Range", ["start", "limit", "delta"], ["shape"], name="range"),
                 helper.make_node("ConstantOfShape", ["shape"], ["y"], name="fill")]
        _save(p, nodes, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model_case("fold-constant-of-shape-2M-dims", many_dims_model,
               [r"node 'fill'", r"\[2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,\.\.\.\] \(2000000 dimensions\)"],
               timeout=20, memory_gib=2.0)

    def expand_model(p, dims):
        onnx, TensorProto, helper = _onnx()
        nodes = [_int_constant("one", [1]), _int_constant("shape", dims),
                 helper.make_node("Expand", ["one", "shape"], ["y"], name="expand")]
        _save(p, nodes, [helper.make_tensor_value_info("y", TensorProto.INT64, ["N", "M"])])
    model_case("fold-expand-2^40", lambda p: expand_model(p, [1 << 20, 1 << 20]),
               [r"node 'expand'", r"67108864 elements"], timeout=20, memory_gib=2.0)

    def concat_model(p):
        # 40 copies of a 2^21-element folded value: 2^21 * 40 > 2^26.
        onnx, TensorProto, helper = _onnx()
        nodes = [_int_constant("shape", [1 << 21]),
                 helper.make_node("ConstantOfShape", ["shape"], ["block"], name="block"),
                 helper.make_node("Concat", ["block"] * 40, ["y"], name="concat", axis=0)]
        _save(p, nodes, [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N"])])
    model_case("fold-concat-over-limit", concat_model,
               [r"node 'concat'", r"67108864 elements"], timeout=30, memory_gib=2.0)

    def transpose_model(p):
        onnx, TensorProto, helper = _onnx()
        nodes = [_int_constant("data", [1, 2, 3, 4, 5, 6], dims=[2, 3]),
                 helper.make_node("Transpose", ["data"], ["y"], name="transpose", perm=[0, 0])]
        _save(p, nodes, [helper.make_tensor_value_info("y", TensorProto.INT64, [2, 2])])
    model_case("fold-transpose-not-a-permutation", transpose_model,
               [r"node 'transpose'", r"not a permutation"])

    def slice_model(p):
        onnx, TensorProto, helper = _onnx()
        nodes = [_int_constant("data", [0, 1, 2, 3, 4]), _int_constant("starts", [4]),
                 _int_constant("ends", [-INT64_MAX]), _int_constant("axes", [0]),
                 _int_constant("steps", [INT64_MIN]),
                 helper.make_node("Slice", ["data", "starts", "ends", "axes", "steps"], ["y"],
                                  name="slice")]
        _save(p, nodes, [helper.make_tensor_value_info("y", TensorProto.INT64, [1])])
    model_case("fold-slice-step-int64-min", slice_model, [], ok=True)

    def split_model(p):
        onnx, TensorProto, helper = _onnx()
        _save(p, [helper.make_node("Split", ["x"], [], name="split", axis=0)],
              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
              inputs=[helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])])
    model_case("split-without-outputs", split_model, [r"node 'split'", r"takes 1 or more outputs, but the node has 0"])

    def conv_model(p):
        onnx, TensorProto, helper = _onnx()
        w = helper.make_tensor("w", TensorProto.FLOAT, [1, 1, 1, 1], [1.0])
        _save(p, [helper.make_node("Conv", ["x", "w"], ["y"], name="conv", strides=[0, 0],
                                   auto_pad="SAME_UPPER")],
              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, 4, 4])], [w],
              inputs=[helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 4, 4])])
    model_case("conv-stride-zero", conv_model, [r"node 'conv'", r"must be positive"])

    # ---- 5. .npy inputs of the reference evaluator
    npy_out = ctx.path("import", "npy-out", "x")

    def npy_case(name, content, expect, fifo=False):
        path = ctx.path("import", "npy", name + ".npy")

        def setup():
            if fifo:
                _mkfifo(path)
            else:
                with open(path, "wb") as f:
                    f.write(content)
        out.append(Case(name, [reference, os.path.join(ctx.examples, "mlp.onnx"),
                               "--input", f"x={path}", "--output-dir", os.path.dirname(npy_out)],
                        expect=expect, setup=setup, timeout=20))

    def npy(header, data=b"", version=1):
        if version == 1:
            return b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header + data
        return b"\x93NUMPY\x02\x00" + len(header).to_bytes(4, "little") + header + data
    npy_case("npy-fifo", b"", [r"\.npy", r"FIFO"], fifo=True)
    npy_case("npy-header-length-2^32", b"\x93NUMPY\x02\x00\xff\xff\xff\xff",
             [r"npy-header-length", r"header length 4294967295 runs past the end"])
    npy_case("npy-shape-garbage",
             npy(b"{'descr': '<f4', 'fortran_order': False, 'shape': (x, 3), }"),
             [r"npy-shape-garbage\.npy", r"not a dimension"])
    npy_case("npy-shape-overflow",
             npy(b"{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296), }"),
             [r"npy-shape-overflow\.npy", r"more than 2\^63"])
    npy_case("npy-shape-huge",
             npy(b"{'descr': '<f4', 'fortran_order': False, 'shape': (100000000000,), }"),
             [r"npy-shape-huge\.npy", r"file holds 0"])
    npy_case("npy-no-shape", npy(b"{'descr': '<f4', 'fortran_order': False, }"),
             [r"npy-no-shape\.npy", r"no shape"])

    # ---- 6. linear-time import: 20,000 Add nodes, each with a trained bias
    chain = ctx.path("import", "add-chain", "chain.onnx")

    def make_chain():
        if not os.path.exists(chain):
            sys.path.insert(0, os.path.join(ctx.root, "test", "import", "Inputs"))
            from make_add_chain import make_add_chain
            make_add_chain(chain, nodes=20000, width=16)
    out.append(Case("add-chain-20000-import", [pipec, chain], ok=True, timeout=60,
                    memory_gib=1.5, setup=make_chain))
    out.append(Case("add-chain-20000-emit-nn", [pipec, chain, "--emit=nn"], ok=True, timeout=60,
                    memory_gib=1.5, setup=make_chain))
    return out
