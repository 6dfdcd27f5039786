#!/usr/bin/env python3
"""Writes the seed corpus fuzz/corpus/<target>/ (docs/security.md, "Fuzzing").

    .venv/bin/python fuzz/make_seeds.py [JOB_DIR...]

Small ONNX models (one or a few ops each, built with the onnx package) for
fuzz_onnx and their text form for fuzz_onnxtext; hand-made tensor files, data
sets, cost tables, cluster and partition files; and, given JOB_DIR (a job
compiled by `pipec examples/mlp.onnx --gpus 1x2 --microbatches 2 --out JOB_DIR
--build`; more than one may be given), its plan.json, schedule/rank_<r>.json and weights/*.bin."""
import hashlib
import json
import pathlib
import shutil
import struct
import sys

root = pathlib.Path(__file__).resolve().parent
corpus = root / "corpus"


def put(target, name, data):
    d = corpus / target
    d.mkdir(parents=True, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    (d / name).write_bytes(data)


# ---------------------------------------------------------------- tensor files, data sets
DT = {"f32": (1, "f"), "f64": (2, "d"), "i64": (3, "q"), "i32": (4, "i"), "bool": (5, "B")}


def tensor_file(tensors):
    out = b"PIPECTS1" + struct.pack("<Q", len(tensors))
    for name, dt, shape, values in tensors:
        code, fmt = DT[dt]
        data = struct.pack("<%d%s" % (len(values), fmt), *values)
        out += struct.pack("<I", len(name)) + name.encode() + struct.pack("<II", code, len(shape))
        out += struct.pack("<%dq" % len(shape), *shape) + struct.pack("<Q", len(data)) + data
    return out


def dataset(fields, samples):
    out = b"PIPECDS1" + struct.pack("<IQ", len(fields), samples)
    body = b""
    for name, dt, shape in fields:
        code, fmt = DT[dt]
        out += struct.pack("<I", len(name)) + name.encode() + struct.pack("<II", code, len(shape))
        out += struct.pack("<%dq" % len(shape), *shape)
    for name, dt, shape in fields:
        code, fmt = DT[dt]
        n = samples
        for d in shape:
            n *= d
        body += struct.pack("<%d%s" % (n, fmt), *([1] * n))
    return out + body


def runtime_seeds():
    put("fuzz_tensor_file", "empty.bin", tensor_file([]))
    put("fuzz_tensor_file", "one.bin", tensor_file([("fc1.weight", "f32", [2, 3], [1.0] * 6)]))
    put("fuzz_tensor_file", "dtypes.bin", tensor_file([
        ("param/w", "f32", [2], [0.5, 1.5]), ("state/w/0", "f64", [2], [0.0, 1.0]),
        ("meta/steps", "i64", [], [7]), ("idx", "i32", [3], [1, 2, 3]), ("mask", "bool", [2, 2], [0, 1, 1, 0]),
        ("zero", "f32", [0, 4], [])]))
    put("fuzz_dataset", "mlp.bin", dataset([("x", "f32", [4]), ("labels", "i64", [])], 3))
    put("fuzz_dataset", "all.bin", dataset([("a", "f64", [2, 2]), ("b", "i32", [1]), ("c", "bool", [3])], 2))
    put("fuzz_dataset", "empty-field.bin", dataset([("e", "f32", [0])], 1))
    import io
    import numpy as np

    def saved(save, **arrays):
        stream = io.BytesIO()
        save(stream, **arrays)
        return stream.getvalue()
    cnn = dict(image=np.arange(24, dtype=np.float32).reshape(2, 3, 2, 2), labels=np.array([1, 0], np.int64))
    put("fuzz_arrays", "cnn.npz", saved(np.savez, **cnn))
    put("fuzz_arrays", "compressed.npz", saved(np.savez_compressed, **cnn))
    put("fuzz_arrays", "dtypes.npz", saved(np.savez, a=np.zeros((2, 2)), b=np.ones((2,), np.int32),
                                           c=np.array([True, False])))
    put("fuzz_arrays", "x.npy", saved(lambda s, x: np.save(s, x), x=np.ones((3, 4), np.float32)))


# ---------------------------------------------------------------- partition inputs
HEADER = "name,type,fwd_s,bwd_input_s,bwd_weight_s,activation_bytes,parameter_bytes,optimizer_bytes,producers\n"


def partition_seeds():
    put("fuzz_cost_table", "small.csv", HEADER +
        "fc1,Gemm,2e-05,2e-05,2e-05,32768,131584,263168,\n"
        "relu1,Relu,1e-06,1e-06,0,32768,0,0,fc1\n"
        "fc2,Gemm,2e-05,2e-05,2e-05,32768,65792,131584,relu1\n"
        "add,Add,1e-06,1e-06,0,32768,0,0,fc2;relu1\n"
        "loss,SoftmaxCrossEntropyLoss,1e-06,1e-06,0,4,0,0,add\n")
    put("fuzz_cost_table", "quoted.csv",
        "producers,name,type,fwd_s,bwd_input_s,bwd_weight_s,activation_bytes,parameter_bytes,optimizer_bytes,extra\r\n"
        ',"a,b",MatMul,1,1,1,10,10,20,x\r\n"a,b","q""uote",Relu,0.5,0.5,0,10,0,0,\r\n')
    rows = [HEADER]
    for i in range(40):
        rows.append(f"op{i},Gemm,{1e-5 * (1 + i % 7)},{2e-5},{1e-5},{4096 * (1 + i % 3)},{1 << (10 + i % 5)},"
                    f"{1 << (11 + i % 5)},{'op%d' % (i - 1) if i else ''}{';op%d' % (i - 3) if i >= 3 else ''}\n")
    put("fuzz_cost_table", "chain40.csv", "".join(rows))
    put("fuzz_cluster", "gpus.json", json.dumps({"device": "H100", "levels": [
        {"name": "nvlink", "fanout": 2, "bandwidth_GBps": 450}, {"name": "network", "fanout": 2, "bandwidth_GBps": 50}]}))
    put("fuzz_cluster", "three.json", json.dumps({"device": "A100", "device_memory": "40GiB", "levels": [
        {"name": "nvlink", "fanout": 4, "bandwidth_GBps": 300}, {"name": "rack", "fanout": 2, "bandwidth_GBps": 25},
        {"name": "spine", "fanout": 2, "bandwidth_GBps": 12.5}]}))
    put("fuzz_cluster", "nodevice.json", json.dumps({"device_memory": 1000000, "levels": [
        {"fanout": 3, "bandwidth_GBps": 1.5}]}))
    put("fuzz_stage_specs", "names.json", json.dumps({"stages": [
        {"first_op": "fc1", "last_op": "relu1", "replicas": 2}, {"first_op": "fc2", "last_op": "loss", "replicas": 2}]}))
    put("fuzz_stage_specs", "indices.json", json.dumps({"stages": [
        {"first_op_index": 0, "last_op_index": 2, "replicas": 1, "ranks": [0]},
        {"first_op_index": 3, "last_op": "loss", "replicas": 3, "ranks": [1, 2, 3]}]}))
    put("fuzz_stage_specs", "one.json", json.dumps({"stages": [{"first_op": "fc1", "last_op": "loss", "replicas": 4}]}))


# ---------------------------------------------------------------- ONNX models
def onnx_seeds():
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    F, I64 = TensorProto.FLOAT, TensorProto.INT64

    def model(name, nodes, inputs, outputs, inits=(), opset=17):
        g = helper.make_graph(nodes, name, inputs, outputs, list(inits))
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
        m.ir_version = 8
        put("fuzz_onnx", name + ".onnx", m.SerializeToString())
        try:
            put("fuzz_onnxtext", name + ".onnxtext", onnx.printer.to_text(m))
        except Exception as e:  # the printer does not cover everything
            print(f"no text form for {name}: {e}", file=sys.stderr)

    vi = helper.make_tensor_value_info
    w = lambda n, *shape: numpy_helper.from_array(np.full(shape, 0.5, np.float32), n)
    i64 = lambda n, vals: numpy_helper.from_array(np.array(vals, np.int64), n)

    model("gemm_relu", [helper.make_node("Gemm", ["x", "w", "b"], ["h"], name="fc1", transB=1),
                        helper.make_node("Relu", ["h"], ["y"], name="relu")],
          [vi("x", F, [2, 4])], [vi("y", F, [2, 3])], [w("w", 3, 4), w("b", 3)])
    model("matmul_add", [helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
                         helper.make_node("Add", ["h", "b"], ["y"], name="add")],
          [vi("x", F, ["batch", 4])], [vi("y", F, ["batch", 2])], [w("w", 4, 2), w("b", 2)])
    model("conv_pool", [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1], strides=[1, 1]),
                        helper.make_node("MaxPool", ["c"], ["p"], name="pool", kernel_shape=[2, 2], strides=[2, 2]),
                        helper.make_node("GlobalAveragePool", ["p"], ["g"], name="gap"),
                        helper.make_node("Flatten", ["g"], ["y"], name="flat")],
          [vi("x", F, [1, 1, 4, 4])], [vi("y", F, [1, 2])], [w("w", 2, 1, 3, 3)])
    model("shape_fold", [helper.make_node("Shape", ["x"], ["s"], name="shape"),
                         helper.make_node("Gather", ["s", "zero"], ["n"], name="g", axis=0),
                         helper.make_node("Unsqueeze", ["n", "zero1"], ["n1"], name="u"),
                         helper.make_node("Concat", ["n1", "minus1"], ["shp"], name="cat", axis=0),
                         helper.make_node("Reshape", ["x", "shp"], ["y"], name="reshape")],
          [vi("x", F, [2, 3, 4])], [vi("y", F, [2, 12])],
          [numpy_helper.from_array(np.array(0, np.int64), "zero"), i64("zero1", [0]), i64("minus1", [-1])])
    model("range_cos", [helper.make_node("Range", ["a", "b", "d"], ["r"], name="range"),
                        helper.make_node("ConstantOfShape", ["r"], ["c"], name="cos",
                                         value=numpy_helper.from_array(np.array([1.0], np.float32))),
                        helper.make_node("Cast", ["c"], ["c2"], name="cast", to=F),
                        helper.make_node("Add", ["x", "c2"], ["y"], name="add")],
          [vi("x", F, [2, 3])], [vi("y", F, [2, 3])],
          [numpy_helper.from_array(np.array(2, np.int64), "a"), numpy_helper.from_array(np.array(4, np.int64), "b"),
           numpy_helper.from_array(np.array(1, np.int64), "d")])
    model("int_div_mod", [helper.make_node("Div", ["p", "q"], ["d"], name="div"),
                          helper.make_node("Mod", ["d", "q"], ["m"], name="mod"),
                          helper.make_node("Reshape", ["x", "m"], ["y"], name="reshape")],
          [vi("x", F, [6])], [vi("y", F, [6])], [i64("p", [12]), i64("q", [2])])
    model("layernorm_softmax", [helper.make_node("LayerNormalization", ["x", "g", "b"], ["n"], name="ln", axis=-1, epsilon=1e-5),
                                helper.make_node("Softmax", ["n"], ["s"], name="sm", axis=-1),
                                helper.make_node("Gelu", ["s"], ["t"], name="gelu", domain=""),
                                helper.make_node("ReduceMean", ["t", "ax"], ["y"], name="rm", keepdims=1)],
          [vi("x", F, [2, 4])], [vi("y", F, [2, 1])], [w("g", 4), w("b", 4), i64("ax", [1])], opset=20)
    model("transpose_slice", [helper.make_node("Transpose", ["x"], ["t"], name="tr", perm=[1, 0]),
                              helper.make_node("Slice", ["t", "st", "en", "ax"], ["s"], name="slice"),
                              helper.make_node("Split", ["s"], ["a", "b"], name="split", axis=0, num_outputs=2),
                              helper.make_node("Pad", ["a", "pads"], ["y"], name="pad")],
          [vi("x", F, [3, 4])], [vi("y", F, [4, 3])],
          [i64("st", [0]), i64("en", [4]), i64("ax", [0]), i64("pads", [1, 0, 1, 0])], opset=18)
    model("gather_loss", [helper.make_node("Gather", ["emb", "ids"], ["e"], name="embed", axis=0),
                          helper.make_node("SoftmaxCrossEntropyLoss", ["e", "labels"], ["loss"], name="loss")],
          [vi("ids", I64, [2]), vi("labels", I64, [2])], [vi("loss", F, [])], [w("emb", 5, 3)])
    model("where_expand", [helper.make_node("Less", ["x", "z"], ["c"], name="less"),
                           helper.make_node("Where", ["c", "x", "z"], ["m"], name="where"),
                           helper.make_node("Expand", ["m", "shp"], ["y"], name="expand")],
          [vi("x", F, [1, 3])], [vi("y", F, [2, 3])], [w("z", 1, 3), i64("shp", [2, 3])])
    model("batchnorm_dropout", [helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["n"], name="bn"),
                                helper.make_node("Dropout", ["n"], ["y"], name="drop", seed=3)],
          [vi("x", F, [2, 3, 2, 2])], [vi("y", F, [2, 3, 2, 2])], [w("s", 3), w("b", 3), w("m", 3), w("v", 3)])
    # External data next to the model (the fuzzer cannot create the file, so
    # this seed exercises the missing/outside-file paths).
    t = numpy_helper.from_array(np.ones((2, 2), np.float32), "w")
    t.ClearField("raw_data")
    t.data_location = TensorProto.EXTERNAL
    for k, v in {"location": "weights.bin", "offset": "0", "length": "16"}.items():
        e = t.external_data.add()
        e.key, e.value = k, v
    model("external", [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
          [vi("x", F, [1, 2])], [vi("y", F, [1, 2])], [t])
    for ex in ["mlp", "cnn"]:
        p = root.parent / "examples" / (ex + ".onnx")
        if p.exists():
            put("fuzz_onnx", "example-" + ex + ".onnx", p.read_bytes())


def job_seeds(job, tag):
    job = pathlib.Path(job)
    put("fuzz_plan", tag + "-plan.json", (job / "plan.json").read_bytes())
    for f in sorted((job / "schedule").glob("rank_*.json")):
        put("fuzz_rank_stream", tag + "-" + f.name, f.read_bytes())
    for f in sorted((job / "weights").glob("*")):
        if f.is_file():
            put("fuzz_tensor_file", tag + "-" + f.name, f.read_bytes())
    # The plan without its optional members, and with tied parameters and data fields.
    plan = json.loads((job / "plan.json").read_text())
    rt = plan["runtime"]
    small = {"format": plan["format"], "version": plan["version"],
             "pipeline": {k: plan["pipeline"][k] for k in ["schedule", "microbatches"]},
             "stages": [{"ranks": s["ranks"]} for s in plan["stages"]],
             "runtime": {k: rt[k] for k in ["microbatch_size", "stages", "optimizer"]}}
    put("fuzz_plan", tag + "-minimal-plan.json", json.dumps(small))
    rich = json.loads(json.dumps(small))
    rich["runtime"].update({"tied": [{"name": "w", "stages": [0, 1]}], "target": "cuda", "precision": "bf16",
                            "cuda_arch": ["sm_80", "sm_90a"], "seed": 5,
                            "data": {"synthetic_samples": 8, "fields": [
                                {"name": "x", "dtype": "f32", "shape": [4], "low": -2, "high": 2},
                                {"name": "labels", "dtype": "i64", "shape": [], "low": 0, "high": 10}]},
                            "optimizer": {"name": "adamw", "lr": 0.001, "weight_decay": 0.01, "beta1": 0.9,
                                          "beta2": 0.99, "epsilon": 1e-8, "max_grad_norm": 1.0}})
    rich["pipeline"].update({"placement": "interleaved", "asynchronous": False, "chunks": 1})
    put("fuzz_plan", tag + "-rich-plan.json", json.dumps(rich))


if __name__ == "__main__":
    runtime_seeds()
    partition_seeds()
    onnx_seeds()
    for k, job in enumerate(sys.argv[1:]):
        job_seeds(job, "job%d" % k)
    for d in sorted(corpus.iterdir()):
        print(d.name, len(list(d.iterdir())))
