"""Option values and the compiler's non-model inputs (issue 11, item 5): every
option that sizes a search or a schedule is bounded, integers are parsed
strictly, costs are finite and bounded, and cost tables, cluster files,
partition files and profiles are read as bounded regular files whose values are
checked. Each case must end quickly with a message naming the option or file
and the reason."""
import json
import os

from corpus import Case

H = "name,type,fwd_s,bwd_input_s,bwd_weight_s,activation_bytes,parameter_bytes,optimizer_bytes,producers\n"
GOOD_ROWS = "a,Gemm,0.001,0.001,0.001,1000,1000,2000,\nb,Relu,0.001,0.001,0,1000,0,0,a\n"


def cases(ctx):
    mlp = os.path.join(ctx.examples, "mlp.onnx")
    pipec_opt = os.path.join(os.path.dirname(ctx.pipec), "pipec-opt")
    out = []

    def write(name, text):
        path = ctx.path("options", name)

        def setup():
            with open(path, "w" if isinstance(text, str) else "wb") as f:
                f.write(text)
        return path, setup

    def directory(name):
        path = ctx.path("options", name)
        os.makedirs(path, exist_ok=True)
        return path

    def fifo(name):
        path = ctx.path("options", name)

        def setup():
            if not os.path.exists(path):
                os.mkfifo(path)
        return path, setup

    # ---- pipec schedule: costs ------------------------------------------------
    sched = [ctx.pipec, "schedule"]
    out.append(Case("schedule-cost-1e308-auto",
                    sched + ["--schedule", "auto", "--cost-f", "1e308", "--cost-b", "1e308", "--cost-w", "1e308"],
                    expect=[r"cost_f", r"at most 1e\+12"], timeout=20))
    for schedule in ("1f1b", "zb-h1", "gpipe", "zb-v"):
        out.append(Case(f"schedule-cost-1e308-{schedule}",
                        sched + ["--schedule", schedule, "--cost-b", "1e308", "--cost-w", "1e308"],
                        expect=[r"cost_b", r"at most"], timeout=20))
    for value in ("inf", "nan", "-1", "0", "1e999"):
        out.append(Case(f"schedule-cost-f-{value}", sched + ["--schedule", "1f1b", "--cost-f", value],
                        expect=[r"--cost-f|cost_f", r"finite|positive"], timeout=20))
    out.append(Case("schedule-comm-inf", sched + ["--schedule", "auto", "--comm", "inf"],
                    expect=[r"--comm", r"finite"], timeout=20))
    out.append(Case("schedule-comm-huge", sched + ["--schedule", "auto", "--comm", "1e300"],
                    expect=[r"--comm", r"1e\+12"], timeout=20))
    out.append(Case("schedule-allreduce-nan", sched + ["--schedule", "1f1b", "--allreduce-cost", "nan"],
                    expect=[r"--allreduce-cost", r"finite"], timeout=20))
    out.append(Case("schedule-activation-limit-inf", sched + ["--schedule", "auto", "--activation-limit", "infp"],
                    expect=[r"--activation-limit", r"finite"], timeout=20))

    # ---- pipec schedule: sizes -----------------------------------------------
    out.append(Case("schedule-microbatches-1e9", sched + ["--schedule", "1f1b", "--microbatches", "1000000000"],
                    expect=[r"--microbatches", r"65536"], timeout=20, memory_gib=1))
    out.append(Case("schedule-stages-1e9", sched + ["--schedule", "1f1b", "--stages", "1000000000"],
                    expect=[r"--stages", r"4096"], timeout=20, memory_gib=1))
    out.append(Case("schedule-stages-1e9-recompute",
                    sched + ["--schedule", "1f1b", "--stages", "1000000000", "--recompute-stages", "0"],
                    expect=[r"--stages", r"4096"], timeout=20, memory_gib=1))
    out.append(Case("schedule-chunks-huge", sched + ["--schedule", "interleaved", "--chunks", "100000"],
                    expect=[r"--chunks", r"64"], timeout=20, memory_gib=1))
    out.append(Case("schedule-slots", sched + ["--schedule", "auto", "--stages", "4096", "--microbatches", "65536"],
                    expect=[r"compute slots", r"limit"], timeout=20, memory_gib=1))
    out.append(Case("schedule-replicas-huge", sched + ["--schedule", "1f1b-rr", "--replicas", "1000000000"],
                    expect=[r"--replicas", r"65536"], timeout=20, memory_gib=1))
    out.append(Case("schedule-replicas-sum", sched + ["--schedule", "1f1b-rr", "--stages", "4",
                                                      "--replicas", "60000"],
                    expect=[r"replicas", r"ranks in all"], timeout=20, memory_gib=1))
    out.append(Case("schedule-in-flight-huge", sched + ["--schedule", "1f1b-rr", "--in-flight", "2000000000"],
                    expect=[r"--in-flight", r"65536"], timeout=20, memory_gib=1))
    for name, value in (("exponent", "1e9"), ("negative", "-3"), ("overflow", "99999999999999999999"),
                        ("fraction", "2.5"), ("garbage", "4x")):
        out.append(Case(f"schedule-stages-{name}", sched + ["--schedule", "1f1b", "--stages", value],
                        expect=[r"--stages", r"integer|between"], timeout=20))
        out.append(Case(f"schedule-microbatches-{name}", sched + ["--schedule", "1f1b", "--microbatches", value],
                        expect=[r"--microbatches", r"integer|between"], timeout=20))

    # ---- pipec MODEL / pipec partition: sizes ---------------------------------
    out.append(Case("gpus-1x65536", [ctx.pipec, mlp, "--gpus", "1x65536"],
                    expect=[r"--gpus", r"4096"], timeout=30, memory_gib=2))
    out.append(Case("gpus-65536x1", [ctx.pipec, mlp, "--gpus", "65536x1"],
                    expect=[r"--gpus", r"4096"], timeout=30, memory_gib=2))
    out.append(Case("gpus-4096x4096", [ctx.pipec, mlp, "--gpus", "4096x4096"],
                    expect=[r"--gpus", r"65536"], timeout=30, memory_gib=2))
    # The largest server the limits allow: the planner's search ends in
    # bounded time and memory with a plan (docs/planner.md).
    out.append(Case("gpus-1x4096", [ctx.pipec, mlp, "--gpus", "1x4096"],
                    ok=True, timeout=120, memory_gib=3))
    for name, value in (("exponent", "1x1e9"), ("negative", "-2x8"), ("overflow", "99999999999999999999x1"),
                        ("zero", "1x0"), ("empty", "x")):
        out.append(Case(f"gpus-{name}", [ctx.pipec, mlp, "--gpus", value], expect=[r"--gpus"], timeout=30))
    for name, value in (("1e9", "1000000000"), ("exponent", "1e9"), ("negative", "-3"),
                        ("overflow", "99999999999999999999")):
        out.append(Case(f"stages-{name}", [ctx.pipec, mlp, "--gpus", "1x2", "--stages", value],
                        expect=[r"--stages", r"integer|between"], timeout=30))
        out.append(Case(f"microbatches-{name}", [ctx.pipec, mlp, "--gpus", "1x2", "--microbatches", value],
                        expect=[r"--microbatches", r"integer|between"], timeout=30))
    out.append(Case("stages-over-devices", [ctx.pipec, mlp, "--gpus", "1x2", "--stages", "3"],
                    expect=[r"--stages 3", r"only 2 devices"], timeout=30))
    out.append(Case("chunks-huge", [ctx.pipec, mlp, "--gpus", "1x2", "--schedule", "interleaved",
                                    "--chunks", "1000000"],
                    expect=[r"--chunks", r"64"], timeout=30))
    out.append(Case("chunks-negative", [ctx.pipec, mlp, "--gpus", "1x2", "--chunks", "-3"],
                    expect=[r"--chunks", r"between"], timeout=30))
    out.append(Case("chunks-virtual-stages", [ctx.pipec, mlp, "--gpus", "64x1024", "--schedule", "interleaved",
                                              "--chunks", "2"],
                    expect=[r"--chunks", r"virtual stages"], timeout=30))
    for value in ("nan", "inf", "-1", "0"):
        out.append(Case(f"lr-{value}", [ctx.pipec, mlp, "--gpus", "1x2", f"--lr={value}"],
                        expect=[r"--lr", r"positive"], timeout=30))
    out.append(Case("momentum-2", [ctx.pipec, mlp, "--gpus", "1x2", "--momentum", "2"],
                    expect=[r"--momentum", r"\[0, 1\)"], timeout=30))
    out.append(Case("weight-decay-nan", [ctx.pipec, mlp, "--gpus", "1x2", "--weight-decay", "nan"],
                    expect=[r"--weight-decay", r"finite"], timeout=30))
    out.append(Case("intra-bw-huge", [ctx.pipec, mlp, "--gpus", "1x2", "--intra-bw", "1e300"],
                    expect=[r"--intra-bw", r"between"], timeout=30))
    out.append(Case("memory-limit-huge", [ctx.pipec, mlp, "--gpus", "1x2", "--memory-limit", "1e30TB"],
                    expect=[r"--memory-limit", r"limit"], timeout=30))

    # ---- files that are not regular files ------------------------------------
    d = directory("a-directory")
    out.append(Case("cluster-directory", [ctx.pipec, mlp, "--cluster", d],
                    expect=[r"a-directory", r"cluster file is a directory"], timeout=30))
    out.append(Case("partition-directory", [ctx.pipec, mlp, "--gpus", "1x2", "--partition", d],
                    expect=[r"a-directory", r"partition file is a directory"], timeout=30))
    out.append(Case("profile-directory", [ctx.pipec, mlp, "--gpus", "1x2", "--profile", d],
                    expect=[r"a-directory", r"profile is a directory"], timeout=30))
    out.append(Case("costs-directory", [ctx.pipec, "partition", "--costs", d, "--gpus", "1x2"],
                    expect=[r"a-directory", r"cost table is a directory"], timeout=30))
    for flag, what in (("--cluster", "cluster file"), ("--profile", "profile")):
        path, setup = fifo(f"fifo{flag}")
        argv = [ctx.pipec, mlp, flag, path] + (["--gpus", "1x2"] if flag != "--cluster" else [])
        out.append(Case(f"fifo{flag}", argv, expect=[r"fifo", what + r" is a FIFO"], setup=setup, timeout=30))
    path, setup = fifo("fifo-costs")
    out.append(Case("fifo-costs", [ctx.pipec, "partition", "--costs", path, "--gpus", "1x2"],
                    expect=[r"fifo-costs", r"FIFO"], setup=setup, timeout=30))
    out.append(Case("cluster-missing", [ctx.pipec, mlp, "--cluster", ctx.path("options", "no-such.json")],
                    expect=[r"no-such\.json", r"cannot open"], timeout=30))

    # ---- cluster files ----------------------------------------------------------
    def cluster(name, document, expect):
        text = document if isinstance(document, str) else json.dumps(document)
        path, setup = write(name + ".json", text)
        out.append(Case("cluster-" + name, [ctx.pipec, mlp, "--cluster", path],
                        expect=[re_name(name)] + expect, setup=setup, timeout=30, memory_gib=2))

    def re_name(name):
        return name.replace(".", r"\.")

    level = {"fanout": 2, "bandwidth_GBps": 100}
    cluster("fanout-huge", {"device": "H100", "levels": [{"fanout": 2 ** 40, "bandwidth_GBps": 100}]},
            [r"fanout", r"limit of 4096"])
    cluster("fanout-65536", {"device": "H100", "levels": [{"fanout": 65536, "bandwidth_GBps": 100}]},
            [r"fanout", r"limit of 4096"])
    cluster("fanout-negative", {"device": "H100", "levels": [{"fanout": -1, "bandwidth_GBps": 100}]},
            [r"fanout", r"positive integer"])
    cluster("fanout-float", {"device": "H100", "levels": [{"fanout": 2.5, "bandwidth_GBps": 100}]},
            [r"fanout", r"positive integer"])
    cluster("devices-product", {"device": "H100", "levels": [{"fanout": 4096, "bandwidth_GBps": 100}] * 3},
            [r"devices", r"limit of 65536"])
    cluster("levels-many", {"device": "H100", "levels": [{"fanout": 1, "bandwidth_GBps": 100}] * 100000},
            [r"levels", r"limit of 8"])
    cluster("bandwidth-huge", {"device": "H100", "levels": [{"fanout": 2, "bandwidth_GBps": 1e308}]},
            [r"bandwidth_GBps", r"between"])
    cluster("bandwidth-tiny", {"device": "H100", "levels": [{"fanout": 2, "bandwidth_GBps": 1e-300}]},
            [r"bandwidth_GBps", r"between"])
    cluster("bandwidth-nan", '{"device": "H100", "levels": [{"fanout": 2, "bandwidth_GBps": NaN}]}',
            [r"malformed JSON"])
    cluster("memory-huge", {"device_memory": 2 ** 63, "levels": [level]}, [r"device_memory", r"limit"])
    cluster("memory-string-huge", {"device_memory": "1e30TB", "levels": [level]}, [r"device_memory", r"limit"])
    cluster("deep", "[" * 100000 + "]" * 100000, [r"nested deeper than 32"])
    cluster("name-object", {"device": "H100", "levels": [{"fanout": 2, "bandwidth_GBps": 1, "name": {}}]},
            [r"name", r"string"])
    big, setup = write("huge-cluster.json", '{"levels": [' + " " * (17 << 20) + "]}")
    out.append(Case("cluster-file-too-large", [ctx.pipec, mlp, "--cluster", big],
                    expect=[r"huge-cluster\.json", r"over the limit"], setup=setup, timeout=30))

    # ---- cost tables (pipec partition --costs) ---------------------------------
    def costs(name, text, expect):
        path, setup = write(name + ".csv", text)
        out.append(Case("costs-" + name, [ctx.pipec, "partition", "--costs", path, "--gpus", "1x2"],
                        expect=[re_name(name) + r"\.csv"] + expect, setup=setup, timeout=30, memory_gib=2))

    out.append(Case("costs-good", [ctx.pipec, "partition", "--costs", write("good.csv", H + GOOD_ROWS)[0],
                                   "--gpus", "1x2"], ok=True, setup=write("good.csv", H + GOOD_ROWS)[1],
                    timeout=30))
    costs("fwd-nan", H + "a,Gemm,nan,0,0,1,0,0,\n", [r"fwd_s", r"not a number"])
    costs("fwd-inf", H + "a,Gemm,inf,0,0,1,0,0,\n", [r"fwd_s", r"not a number"])
    costs("fwd-negative", H + "a,Gemm,-1,0,0,1,0,0,\n", [r"fwd_s", r"negative"])
    costs("fwd-1e308", H + "a,Gemm,1e308,1e308,1e308,1,0,0,\n", [r"fwd_s", r"limit"])
    costs("activation-1e30", H + "a,Gemm,1,0,0,1e30,0,0,\n", [r"activation_bytes", r"limit"])
    costs("parameters-2e63", H + "a,Gemm,1,0,0,1,9223372036854775807,0,\n", [r"parameter_bytes", r"limit"])
    costs("bytes-sum", H + "".join(f"o{i},Gemm,1,0,0,{1 << 44},0,0,\n" for i in range(100)),
          [r"add up", r"limit"])
    costs("columns-many", ",".join(f"c{i}" for i in range(100000)) + "\n", [r"columns", r"limit of 64"])
    costs("rows-many", H + "".join(f"o{i},Relu,0,0,0,0,0,0,\n" for i in range((1 << 18) + 1)),
          [r"more than 262144 ops"])
    costs("unterminated-quote", H + 'a,"Gemm,1,0,0,1,0,0,\n', [r"unterminated"])

    # ---- partition files and profiles ------------------------------------------
    def partition_file(name, document, expect):
        text = document if isinstance(document, str) else json.dumps(document)
        path, setup = write(name + ".json", text)
        out.append(Case("partition-" + name, [ctx.pipec, mlp, "--gpus", "1x2", "--partition", path],
                        expect=[re_name(name)] + expect, setup=setup, timeout=30, memory_gib=2))

    partition_file("replicas-huge", {"stages": [{"first_op_index": 0, "last_op_index": 0, "replicas": 2 ** 40}]},
                   [r"replicas", r"positive integer at most 65536"])
    partition_file("ranks-huge", {"stages": [{"first_op_index": 0, "last_op_index": 0, "ranks": [2 ** 40]}]},
                   [r"ranks", r"below 65536"])
    partition_file("index-negative", {"stages": [{"first_op_index": -1, "last_op_index": 0}]},
                   [r"first_op_index", r"op index"])
    partition_file("deep", "{" + '"a":{' * 50000 + "}" * 50001, [r"nested deeper"])

    def profile(name, document, expect):
        text = document if isinstance(document, str) else json.dumps(document)
        path, setup = write(name + ".json", text)
        out.append(Case("profile-" + name, [ctx.pipec, mlp, "--gpus", "1x2", "--profile", path],
                        expect=[re_name(name)] + expect, setup=setup, timeout=30, memory_gib=2))

    profile("time-huge", {"format": "pipec.profile/1", "ops": [
        {"name": "fc1", "fwd_s": 1e308, "bwd_input_s": 0, "bwd_weight_s": 0}]}, [r"fwd_s", r"limit"])
    profile("time-string", {"format": "pipec.profile/1", "ops": [
        {"name": "fc1", "fwd_s": "1", "bwd_input_s": 0, "bwd_weight_s": 0}]}, [r"fwd_s", r"number"])
    profile("name-number", {"format": "pipec.profile/1", "ops": [
        {"name": 3, "fwd_s": 1, "bwd_input_s": 0, "bwd_weight_s": 0}]}, [r"name"])
    profile("ops-object", {"format": "pipec.profile/1", "ops": {"a": 1}}, [r"ops", r"array"])
    profile("deep", "[" * 100000, [r"nested deeper"])

    # ---- byte arithmetic of the cost estimate ----------------------------------
    huge_batch, setup = write("huge-batch.onnxtext", """<ir_version: 8, opset_import: ["" : 13]>
huge (float[4611686018427387904,4] x) => (float[4611686018427387904,4] y)
<float[4,4] w = {1,0,0,0,0,1,0,0,0,0,1,0,0,0,0,1}>
{
  y = MatMul(x, w)
}
""")
    out.append(Case("batch-2^62", [ctx.pipec, huge_batch, "--gpus", "1x2"],
                    expect=[r"huge-batch", r"4611686018427387904"], setup=setup, timeout=30, memory_gib=2))
    ir, setup = write("huge-batch.mlir", """module {
  func.func @forward(%w: tensor<4x4xf32> {nn.name = "w", nn.role = #nn.role<param>},
                     %x: tensor<4611686018427387904x4xf32> {nn.name = "x", nn.role = #nn.role<input>})
      -> tensor<4611686018427387904x4xf32> {
    %0 = nn.matmul %x, %w : (tensor<4611686018427387904x4xf32>, tensor<4x4xf32>) -> tensor<4611686018427387904x4xf32> loc("big_matmul")
    return %0 : tensor<4611686018427387904x4xf32>
  }
}
""")
    out.append(Case("cost-pass-batch-2^62", [pipec_opt, ir, "--pipec-estimate-costs"],
                    expect=[r"big_matmul", r"over the limit"], setup=setup, timeout=30, memory_gib=2))
    return out
