"""Runtime consistency across ranks (issue 11, item 6; docs/runtime.md):
job identity (ranks started with different options or files), the default
watchdog (stopped ranks, deadlocking stream orders), NaN/inf loss and
gradients, hyper-parameter validation (command line and plan.json, piperun
and pipeseq), and kill -9 of a rank still ending the job in about a second.

Jobs are the mlp example as a 2-stage pipeline (1x2 --stages 2, 2 micro-batches); each case that
changes one copies it first (setup)."""
import json
import os
import shutil
import struct
import sys

from corpus import Case

HERE = os.path.dirname(os.path.abspath(__file__))


def cases(ctx):
    out = []
    piperun, pipeseq = ctx.piperun, ctx.pipeseq
    job_dir = ctx.path("cases", "runtime_job-base")

    def base():
        # The shared job, copied once under a fixed path (argv is built now,
        # the job when the first case runs).
        if not os.path.exists(os.path.join(job_dir, "plan.json")):
            shutil.rmtree(job_dir, ignore_errors=True)
            shutil.copytree(ctx.job(extra=("--stages", "2")), job_dir, symlinks=True)

    def copy(name, edit=None):
        dst = ctx.path("cases", "runtime_job-" + name)

        def setup():
            base()
            shutil.rmtree(dst, ignore_errors=True)
            shutil.copytree(job_dir, dst, symlinks=True)
            if edit:
                edit(dst)
        return dst, setup

    def mpmd(first, second):
        """Rank 0 runs `first`, rank 1 `second` (each a list after piperun)."""
        return ["mpirun", "--oversubscribe", "-np", "1", piperun, *first, ":", "-np", "1", piperun, *second]

    def run2(*args):
        return ctx.mpirun(2, piperun, *args)

    # ---------------------------------------------------------------- 1. job identity
    out.append(Case("identity-iters", mpmd([job_dir, "--iters", "3"], [job_dir, "--iters", "5"]),
                    expect=[r"ranks disagree on --iters", r"rank 1 was started with --iters 5",
                            r"rank 0 was started with --iters 3"], setup=base, timeout=90))
    out.append(Case("identity-seed", mpmd([job_dir, "--seed", "1"], [job_dir, "--seed", "2"]),
                    expect=[r"ranks disagree on the seed", r"rank 1 runs with seed 2 \(--seed\)"], setup=base))
    out.append(Case("identity-lr", mpmd([job_dir, "--lr", "0.01"], [job_dir, "--lr", "0.02"]),
                    expect=[r"ranks disagree on the lr", r"rank 1 runs with lr 0\.02 \(--lr\)", r"rank 0 runs with lr 0\.01 \(--lr\)"], setup=base))
    out.append(Case("identity-momentum", mpmd([job_dir], [job_dir, "--momentum", "0.5"]),
                    expect=[r"ranks disagree on the momentum", r"rank 1 runs with momentum 0.5 \(--momentum\)"],
                    setup=base))
    out.append(Case("identity-max-grad-norm", mpmd([job_dir], [job_dir, "--max-grad-norm", "1"]),
                    expect=[r"ranks disagree on the max grad norm"], setup=base))
    out.append(Case("identity-checkpoint", mpmd([job_dir, "--checkpoint", ctx.path("ckpt-a"), "--save-every", "1"],
                                                [job_dir]),
                    expect=[r"ranks disagree on --checkpoint", r"rank 1 was started without --checkpoint"],
                    setup=base))
    out.append(Case("identity-allow-nonfinite", mpmd([job_dir], [job_dir, "--allow-nonfinite"]),
                    expect=[r"ranks disagree on --allow-nonfinite"], setup=base))

    data_a, data_b = ctx.path("data", "a.bin"), ctx.path("data", "b.bin")

    def write_datasets():
        base()
        # Two valid data sets of the mlp job's fields (from plan.json's
        # runtime.data), different samples.
        with open(os.path.join(job_dir, "plan.json")) as f:
            fields = json.load(f)["runtime"]["data"]["fields"]
        codes = {"f32": (1, "f", 4), "f64": (2, "d", 8), "i64": (3, "q", 8), "i32": (4, "i", 4), "bool": (5, "B", 1)}
        for path, offset in ((data_a, 0), (data_b, 1)):
            n = 64
            header = b"PIPECDS1" + struct.pack("<IQ", len(fields), n)
            body = b""
            for f in fields:
                code, fmt, size = codes[f["dtype"]]
                name = f["name"].encode()
                header += struct.pack("<I", len(name)) + name + struct.pack("<II", code, len(f["shape"]))
                header += b"".join(struct.pack("<q", d) for d in f["shape"])
                count = n
                for d in f["shape"]:
                    count *= d
                high = int(f.get("high", 2))
                values = [((k + offset) % max(1, high)) for k in range(count)]
                body += struct.pack("<%d%s" % (count, fmt), *values)
            with open(path, "wb") as fh:
                fh.write(header + body)
    out.append(Case("identity-data", mpmd([job_dir, "--data", data_a], [job_dir, "--data", data_b]),
                    expect=[r"ranks disagree on --data", r"rank 1 was started with --data .*b\.bin"],
                    setup=write_datasets))
    out.append(Case("identity-data-vs-synthetic", mpmd([job_dir, "--data", data_a], [job_dir]),
                    expect=[r"ranks disagree on --data", r"without --data"], setup=write_datasets))

    # A node with a stale copy of the job directory: rank 1 runs the copy.
    def stale(name, edit, expect):
        dst, setup = copy(name, edit)
        out.append(Case(name, mpmd([job_dir, "--iters", "2"], [dst, "--iters", "2"]), expect=expect, setup=setup))

    def flip_last_weight(path):
        with open(path, "r+b") as f:
            f.seek(-4, os.SEEK_END)
            v = struct.unpack("<f", f.read(4))[0]
            f.seek(-4, os.SEEK_END)
            f.write(struct.pack("<f", v + 0.5))

    def edit_plan_lr(d):
        p = os.path.join(d, "plan.json")
        plan = json.load(open(p))
        plan["runtime"]["optimizer"]["lr"] = plan["runtime"]["optimizer"]["lr"] * 2
        json.dump(plan, open(p, "w"), indent=1)
    stale("stale-plan", edit_plan_lr, [r"ranks disagree on plan\.json", r"rank 1 has .*stale-plan/plan\.json",
                                       r"ranks disagree on the lr"])
    stale("stale-weights", lambda d: flip_last_weight(os.path.join(d, "weights", "stage_1.bin")),
          [r"ranks disagree on stage 1 weights", r"rank 1 has .*stale-weights/weights/stage_1\.bin"])
    stale("stale-weights-unused-stage", lambda d: flip_last_weight(os.path.join(d, "weights", "stage_0.bin")),
          [r"ranks disagree on stage 0 weights"])

    def grow_library(d):
        with open(os.path.join(d, "stages", "libstage_1.so"), "ab") as f:
            f.write(b"\0" * 64)
    stale("stale-library", grow_library, [r"ranks disagree on stage 1 library", r"libstage_1\.so"])

    def touch_schedule(d):
        p = os.path.join(d, "schedule", "rank_0.json")
        with open(p, "a") as f:
            f.write("\n")
    stale("stale-schedule", touch_schedule, [r"ranks disagree on schedule files"])

    # ---------------------------------------------------------------- 2. watchdog, deadlocks, faults
    signal_rank = [ctx.python, os.path.join(HERE, "signal_rank.py")]
    out.append(Case("stopped-rank-watchdog-5",
                    [*signal_rank, "--signal", "STOP", "--rank", "1", "--max-seconds", "30", "--",
                     piperun, job_dir, "--iters", "1000000", "--watchdog", "5"],
                    # A receive is posted and does not wait: the compute reading its
                    # data does (docs/runtime.md).
                    expect=[r"rank 0 \(stage 0, replica 0\): error: no progress for [0-9.]+ s in .*rank_0\.json #\d+ "
                            r"(FWD|BWD|BWD_INPUT) .*waiting for its data from rank 1", r"--watchdog 5", r"\(in time\)"],
                    setup=base, timeout=90))
    # The default watchdog (no --watchdog): after the first iteration, 60 s.
    out.append(Case("stopped-rank-default-watchdog",
                    [*signal_rank, "--signal", "STOP", "--rank", "1", "--max-seconds", "100", "--",
                     piperun, job_dir, "--iters", "1000000"],
                    expect=[r"rank 0 \(stage 0, replica 0\): error: no progress for 6\d\.\d s in .*waiting for its data "
                            r"from rank 1",
                            r"default watchdog", r"\(in time\)"],
                    setup=base, timeout=150))
    # kill -9 of a rank ends the job in about a second (must keep holding).
    out.append(Case("killed-rank",
                    [*signal_rank, "--signal", "KILL", "--rank", "1", "--max-seconds", "10", "--",
                     piperun, job_dir, "--iters", "1000000"],
                    expect=[r"the job ended [0-9.]+ s after SIGKILL to rank 1 \(mpirun exit [1-9]\d*\) \(in time\)"],
                    setup=base, timeout=90))

    # A stream order that deadlocks: rank 0 waits for the gradient of
    # micro-batch 0 before sending its activation (pairwise orders agree), so
    # the deadlock check itself is what refuses the job.
    def deadlock(d):
        def swap(ins):
            send = next(i for i, x in enumerate(ins) if x["op"] == "SEND_ACT" and x.get("mb") == 0)
            recv = next(i for i, x in enumerate(ins) if x["op"] == "RECV_GRAD" and x.get("mb") == 0)
            ins.insert(send, ins.pop(recv))
        p = os.path.join(d, "schedule", "rank_0.json")
        s = json.load(open(p))
        swap(s["instructions"])
        json.dump(s, open(p, "w"), indent=1)
    dl_dir, dl_setup = copy("deadlock", deadlock)
    out.append(Case("deadlocking-schedule", run2(dl_dir, "--iters", "2"),
                    expect=[r"schedule deadlocks", r"rank 0 \(stage 0, replica 0\) waits in .*rank_0\.json #\d+ RECV_GRAD",
                            r"rank 1 \(stage 1, replica 0\) waits in .*rank_1\.json #\d+ RECV_ACT"],
                    setup=dl_setup, timeout=60))

    # ---------------------------------------------------------------- 3. NaN / inf
    def nan_weight(d):
        with open(os.path.join(d, "weights", "stage_1.bin"), "r+b") as f:
            f.seek(-4, os.SEEK_END)
            f.write(struct.pack("<f", float("nan")))
    nan_dir, nan_setup = copy("nan-weights", nan_weight)
    out.append(Case("nan-loss", run2(nan_dir, "--iters", "3"),
                    expect=[r"rank 1 \(stage 1, replica 0\): error: .*rank_1\.json #\d+ FWD mb=0 .*\(iteration 0\): "
                            r"the loss of micro-batch 0 .* is NaN on stage 1 in iteration 0; training stopped",
                            r"--allow-nonfinite"],
                    setup=nan_setup))
    out.append(Case("nan-loss-allowed", run2(nan_dir, "--iters", "3", "--allow-nonfinite"), ok=True,
                    setup=nan_setup))
    out.append(Case("diverging-lr", run2(job_dir, "--iters", "20", "--lr", "1e30"),
                    expect=[r"error: .*(the loss of micro-batch \d+ .* is (NaN|\+inf)|non-finite gradients)",
                            r"training stopped"],
                    setup=base))
    out.append(Case("nan-loss-pipeseq", [pipeseq, nan_dir, "--iters", "2"],
                    expect=[r"loss of micro-batch 0 is not finite in iteration 0"], setup=nan_setup))

    # ---------------------------------------------------------------- 4. hyper-parameters
    bad_options = [
        ("lr-nan", ["--lr", "nan"], [r"--lr is nan; it must be a finite learning rate >= 0"]),
        ("lr-inf", ["--lr", "inf"], [r"--lr is inf"]),
        ("lr-negative", ["--lr", "-0.1"], [r"--lr is -0.1"]),
        ("lr-overflows-float", ["--lr", "1e39"], [r"--lr is 1e\+39, beyond the range of a float"]),
        ("weight-decay-negative", ["--weight-decay", "-1"], [r"--weight-decay is -1"]),
        ("momentum-one", ["--momentum", "1"], [r"--momentum is 1; it must be a momentum in \[0, 1\)"]),
        ("momentum-negative", ["--momentum", "-0.5"], [r"--momentum is -0.5"]),
        ("max-grad-norm-negative", ["--max-grad-norm", "-1"], [r"--max-grad-norm is -1"]),
        ("max-grad-norm-nan", ["--max-grad-norm", "nan"], [r"--max-grad-norm is nan"]),
        ("iters-zero", ["--iters", "0"], [r"--iters: \"0\" is out of range"]),
        ("iters-absurd", ["--iters", "1e12"], [r"--iters: \"1e12\" is out of range"]),
        ("iters-fraction", ["--iters", "2.5"], [r"--iters: \"2.5\" is out of range"]),
        ("iters-not-a-number", ["--iters", "many"], [r"--iters: \"many\" is not a number"]),
        ("log-every-zero", ["--log-every", "0"], [r"--log-every: \"0\" is out of range"]),
        ("save-every-zero", ["--checkpoint", "CKPT", "--save-every", "0"], [r"--save-every: \"0\" is out of range"]),
        ("seed-negative", ["--seed", "-1"], [r"--seed: \"-1\" is not a seed"]),
        ("seed-float", ["--seed", "1e30"], [r"--seed: \"1e30\" is not a seed"]),
        ("seed-overflow", ["--seed", "18446744073709551616"], [r"--seed: \"18446744073709551616\" is not a seed"]),
        ("watchdog-negative", ["--watchdog", "-1"], [r"--watchdog"]),
        ("watchdog-nan", ["--watchdog", "nan"], [r"--watchdog"]),
    ]
    for name, args, expect in bad_options:
        args = [ctx.path("ckpt-" + name) if a == "CKPT" else a for a in args]
        out.append(Case("option-" + name, run2(job_dir, *args), expect=expect, setup=base, timeout=90))

    def plan_edit(member, value):
        def edit(d):
            p = os.path.join(d, "plan.json")
            text = open(p).read()
            plan = json.loads(text)
            if member == "seed":
                plan["runtime"]["seed"] = "@@"
            else:
                plan["runtime"]["optimizer"][member] = "@@"
            # Raw text, so that values JSON writers refuse (1e39) stay as written.
            open(p, "w").write(json.dumps(plan, indent=1).replace('"@@"', value))
        return edit
    bad_plans = [
        ("lr", "-1", r"plan\.json: runtime\.optimizer\.lr is -1; it must be a finite learning rate"),
        ("lr", "1e39", r"plan\.json: runtime\.optimizer\.lr is 1e\+39, beyond the range of a float"),
        ("momentum", "1.5", r"plan\.json: runtime\.optimizer\.momentum is 1\.5"),
        ("weight_decay", "-0.01", r"plan\.json: runtime\.optimizer\.weight_decay is -0\.01"),
        ("beta2", "1", r"plan\.json: runtime\.optimizer\.beta2 is 1"),
        ("epsilon", "0", r"plan\.json: runtime\.optimizer\.epsilon is 0"),
        ("max_grad_norm", "-2", r"plan\.json: runtime\.optimizer\.max_grad_norm is -2"),
        ("seed", "-3", r"plan\.json: member runtime\.seed is out of range \(-3\)"),
        ("seed", "1.5", r"plan\.json: member runtime\.seed has the wrong type \(1\.5\)"),
    ]
    for member, value, pattern in bad_plans:
        name = "plan-%s-%s" % (member.replace("_", "-"), value.replace(".", "p").replace("+", ""))
        d, setup = copy(name, plan_edit(member, value))
        out.append(Case(name, run2(d, "--iters", "1"), expect=[pattern], setup=setup, timeout=90))
        out.append(Case(name + "-pipeseq", [pipeseq, d, "--iters", "1"], expect=[pattern], setup=setup, timeout=90))
    for name, args, pattern in [("lr-nan", ["--lr", "nan"], r"--lr is nan"),
                                ("momentum-one", ["--momentum", "1"], r"--momentum is 1"),
                                ("iters-zero", ["--iters", "0"], r"--iters: \"0\" is out of range"),
                                ("seed-negative", ["--seed", "-5"], r"--seed: \"-5\" is not a seed")]:
        full = args if "--iters" in args else ["--iters", "1", *args]
        out.append(Case("pipeseq-option-" + name, [pipeseq, job_dir, *full], expect=[pattern], setup=base, timeout=90))
    # mpirun alone takes 10-15 s to start on a loaded 2-core machine.
    for case in out:
        case.timeout = max(case.timeout, 90)
    return out
