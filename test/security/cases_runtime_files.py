"""piperun's and pipeseq's file readers (issue 11, items 2 and 6; docs/runtime.md,
docs/weights-format.md, docs/checkpoint-format.md, docs/dataset-format.md):
plan.json, the schedule files, weights, checkpoints (manifest, `latest`, stage
files), data sets and stage libraries.

* Every reader opens regular files only, with a size limit (a FIFO as weights,
  data, plan, stream, checkpoint or library hung before).
* Header lengths and counts are checked against the bytes left before
  allocating (a name length of 2^32-1 allocated 4.2 GB per rank before the
  refusal); element and byte counts never overflow.
* plan.json is cross-checked against every schedule file (a micro-batch count
  that disagrees trained different weights with exit 0).
* Impossible checkpoint values (negative iteration, beyond --iters, another
  seed, negative step counter, `latest` leaving its directory) are refused.
* A stage library is checked as an ELF shared object of this machine before
  dlopen (a library truncated to half its size died of SIGBUS inside dlopen).

Jobs are the mlp example as a 2-stage pipeline on 2 ranks (1x2 --stages 2,
2 micro-batches); each case that changes one copies it first (setup)."""
import json
import os
import shutil
import struct

from corpus import Case

DTYPES = {1: ("f", 4), 2: ("d", 8), 3: ("q", 8), 4: ("i", 4), 5: ("B", 1)}
NAMES = {"f32": 1, "f64": 2, "i64": 3, "i32": 4, "bool": 5}


# ---------------------------------------------------------------- file formats
def read_tensors(path):
    """pipec.tensors/1 -> [(name, dtype, dims, data bytes)]."""
    with open(path, "rb") as f:
        b = f.read()
    assert b[:8] == b"PIPECTS1", path
    (count,), off, out = struct.unpack_from("<Q", b, 8), 16, []
    for _ in range(count):
        (n,) = struct.unpack_from("<I", b, off)
        name = b[off + 4:off + 4 + n].decode()
        off += 4 + n
        dtype, rank = struct.unpack_from("<II", b, off)
        off += 8
        dims = list(struct.unpack_from(f"<{rank}q", b, off))
        off += 8 * rank
        (nbytes,) = struct.unpack_from("<Q", b, off)
        off += 8
        out.append((name, dtype, dims, b[off:off + nbytes]))
        off += nbytes
    return out


def encode_tensors(tensors, count=None, name_len=None):
    out = b"PIPECTS1" + struct.pack("<Q", len(tensors) if count is None else count)
    for i, (name, dtype, dims, data) in enumerate(tensors):
        raw = name.encode()
        out += struct.pack("<I", len(raw) if (name_len is None or i) else name_len) + raw
        out += struct.pack("<II", dtype, len(dims)) + struct.pack(f"<{len(dims)}q", *dims)
        out += struct.pack("<Q", len(data)) + data
    return out


def encode_dataset(fields, samples, data, name_len=None):
    """fields: [(name, dtype code, dims)]; data: bytes after the header."""
    out = b"PIPECDS1" + struct.pack("<IQ", len(fields), samples)
    for i, (name, dtype, dims) in enumerate(fields):
        raw = name.encode()
        out += struct.pack("<I", len(raw) if (name_len is None or i) else name_len) + raw
        out += struct.pack("<II", dtype, len(dims)) + struct.pack(f"<{len(dims)}q", *dims)
    return out + data


def write(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if os.path.lexists(path):
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.remove(path)
    with open(path, "wb") as f:
        f.write(data)


def fifo(path):
    if os.path.lexists(path):
        os.remove(path)
    os.mkfifo(path)


def edit_json(path, change):
    with open(path) as f:
        j = json.load(f)
    change(j)
    with open(path, "w") as f:
        json.dump(j, f)


def cases(ctx):
    out = []
    piperun, pipeseq = ctx.piperun, ctx.pipeseq
    job_dir = ctx.path("cases", "runtime_files-base")
    ckpt_dir = ctx.path("cases", "runtime_files-ckpt")  # a checkpoint of job_dir after 1 iteration

    def base():
        if not os.path.exists(os.path.join(job_dir, "plan.json")):
            shutil.rmtree(job_dir, ignore_errors=True)
            shutil.copytree(ctx.job(extra=("--stages", "2")), job_dir, symlinks=True)

    def checkpoint():
        base()
        if not os.path.exists(os.path.join(ckpt_dir, "latest")):
            shutil.rmtree(ckpt_dir, ignore_errors=True)
            ctx.run(ctx.mpirun(2, piperun, job_dir, "--iters", "1", "--quiet", "--checkpoint", ckpt_dir,
                               "--save-every", "1"), timeout=120)

    def copy(name, edit=None):
        """A private copy of the job, changed by edit(dir)."""
        dst = ctx.path("cases", "runtime_files-" + name)

        def setup():
            base()
            shutil.rmtree(dst, ignore_errors=True)
            shutil.copytree(job_dir, dst, symlinks=True)
            if edit:
                edit(dst)
        return dst, setup

    def copy_ckpt(name, edit):
        """A private copy of the checkpoint, changed by edit(dir); edit gets
        the iter_1 directory."""
        dst = ctx.path("cases", "runtime_files-ckpt-" + name)

        def setup():
            checkpoint()
            shutil.rmtree(dst, ignore_errors=True)
            shutil.copytree(ckpt_dir, dst, symlinks=True)
            edit(dst, os.path.join(dst, "iter_1"))
        return dst, setup

    def run2(*args):
        return ctx.mpirun(2, piperun, *args)

    def weights(d, k):
        return os.path.join(d, "weights", f"stage_{k}.bin")

    def library(d, k):
        return os.path.join(d, "stages", f"libstage_{k}.so")

    def fields_of(d):
        with open(os.path.join(d, "plan.json")) as f:
            return [(x["name"], NAMES[x["dtype"]], x["shape"]) for x in json.load(f)["runtime"]["data"]["fields"]]

    def sample_bytes(dtype, dims):
        n = DTYPES[dtype][1]
        for v in dims:
            n *= v
        return n

    def dataset(name, make):
        """A --data file written by make(fields) in the setup."""
        path = ctx.path("data", "runtime_files-" + name + ".bin")

        def setup():
            base()
            make(path, fields_of(job_dir))
        return path, setup

    # ---------------------------------------------------------------- sanity: what must keep working
    d, s = copy("ok")
    out.append(Case("ok-piperun", run2(d, "--iters", "2", "--quiet"), ok=True, setup=s, timeout=120))
    out.append(Case("ok-pipeseq", [pipeseq, job_dir, "--iters", "2"], ok=True, setup=base, timeout=120))

    def ok_data(path, fields):
        n = 8
        write(path, encode_dataset(fields, n, b"".join(bytes(sample_bytes(t, dims) * n) for _, t, dims in fields)))
    p, s = dataset("ok", ok_data)
    out.append(Case("ok-data", run2(job_dir, "--iters", "1", "--quiet", "--data", p), ok=True, setup=s, timeout=120))
    out.append(Case("ok-resume", run2(job_dir, "--iters", "2", "--quiet", "--resume", ckpt_dir), ok=True,
                    setup=checkpoint, timeout=120))
    out.append(Case("ok-resume-pipeseq", [pipeseq, job_dir, "--iters", "2", "--resume", ckpt_dir], ok=True,
                    setup=checkpoint, timeout=120))

    # ---------------------------------------------------------------- 1. regular files only
    d, s = copy("weights-fifo", lambda d: fifo(weights(d, 1)))
    out.append(Case("weights-fifo", run2(d, "--iters", "1"),
                    expect=[r"rank 1", r"weights/stage_1\.bin: .*is a FIFO, not a regular file"],
                    setup=s, timeout=30))
    d, s = copy("weights-dir", lambda d: (os.remove(weights(d, 0)), os.mkdir(weights(d, 0))))
    out.append(Case("weights-directory", run2(d, "--iters", "1"),
                    expect=[r"rank 0", r"stage_0\.bin: .*is a directory"], setup=s, timeout=30))
    d, s = copy("weights-dev", lambda d: (os.remove(weights(d, 0)), os.symlink("/dev/zero", weights(d, 0))))
    out.append(Case("weights-device", run2(d, "--iters", "1"),
                    expect=[r"rank 0", r"stage_0\.bin: .*is a character device"], setup=s, timeout=30))
    d, s = copy("plan-fifo", lambda d: fifo(os.path.join(d, "plan.json")))
    out.append(Case("plan-fifo", run2(d, "--iters", "1"), expect=[r"plan\.json: plan is a FIFO"], setup=s,
                    timeout=30))
    out.append(Case("plan-fifo-pipeseq", [pipeseq, d, "--iters", "1"], expect=[r"plan\.json: plan is a FIFO"],
                    setup=s, timeout=30))
    d, s = copy("stream-fifo", lambda d: fifo(os.path.join(d, "schedule", "rank_1.json")))
    out.append(Case("stream-fifo", run2(d, "--iters", "1"),
                    expect=[r"rank 1", r"rank_1\.json: .*is a FIFO"], setup=s, timeout=30))
    # schedule.json is a report piperun never reads (docs/schedule-files.md):
    # a FIFO there cannot stall a job, so no case opens it.
    data_fifo = ctx.path("data", "runtime_files-fifo")
    out.append(Case("data-fifo", run2(job_dir, "--iters", "1", "--data", data_fifo),
                    expect=[r"rank 0", r"runtime_files-fifo: .*is a FIFO"],
                    setup=lambda: (base(), fifo(data_fifo)), timeout=30))
    out.append(Case("data-fifo-pipeseq", [pipeseq, job_dir, "--iters", "1", "--data", data_fifo],
                    expect=[r"runtime_files-fifo: .*is a FIFO"], setup=lambda: (base(), fifo(data_fifo)),
                    timeout=30))
    data_dir = ctx.path("data", "runtime_files-dir", "x")
    # A folder is a data set of .npy arrays (docs/dataset-format.md,
    # "Arrays"); one without them is refused naming the fields it lacks.
    out.append(Case("data-directory", run2(job_dir, "--iters", "1", "--data", os.path.dirname(data_dir)),
                    expect=[r"runtime_files-dir: no \.npy arrays named after the model's data fields \(.+\)"],
                    setup=lambda: (base(), os.makedirs(os.path.dirname(data_dir), exist_ok=True)), timeout=30))
    d, s = copy_ckpt("latest-fifo", lambda c, it: fifo(os.path.join(c, "latest")))
    out.append(Case("checkpoint-latest-fifo", run2(job_dir, "--iters", "2", "--resume", d),
                    expect=[r"latest: .*is a FIFO"], setup=s, timeout=30))
    d, s = copy_ckpt("manifest-fifo", lambda c, it: fifo(os.path.join(it, "manifest.json")))
    out.append(Case("checkpoint-manifest-fifo", run2(job_dir, "--iters", "2", "--resume", d),
                    expect=[r"manifest\.json: .*is a FIFO"], setup=s, timeout=30))
    out.append(Case("checkpoint-manifest-fifo-pipeseq", [pipeseq, job_dir, "--iters", "2", "--resume", d],
                    expect=[r"manifest\.json: .*is a FIFO"], setup=s, timeout=30))
    d, s = copy_ckpt("stage-fifo", lambda c, it: fifo(os.path.join(it, "stage_1.bin")))
    out.append(Case("checkpoint-stage-fifo", run2(job_dir, "--iters", "2", "--resume", d),
                    expect=[r"rank 1", r"stage_1\.bin: .*is a FIFO"], setup=s, timeout=30))
    d, s = copy("library-fifo", lambda d: fifo(library(d, 1)))
    out.append(Case("library-fifo", run2(d, "--iters", "1"),
                    expect=[r"rank 1", r"libstage_1\.so: .*is a FIFO"],
                    setup=s, timeout=30))

    # ---------------------------------------------------------------- 2. lengths and counts before allocating
    def huge_name(d):
        t = read_tensors(weights(d, 1))
        write(weights(d, 1), encode_tensors(t, name_len=0xFFFFFFFF))
    d, s = copy("weights-name-length", huge_name)
    out.append(Case("weights-name-length-4g", run2(d, "--iters", "1"),
                    expect=[r"rank 1", r"stage_1\.bin: truncated file: the name of tensor #0 is 4294967295 bytes long"],
                    setup=s, timeout=30, memory_gib=3))

    def huge_count(d):
        t = read_tensors(weights(d, 0))
        write(weights(d, 0), encode_tensors(t, count=(1 << 64) - 1))
    d, s = copy("weights-count", huge_count)
    out.append(Case("weights-tensor-count", run2(d, "--iters", "1"),
                    expect=[r"rank 0", r"stage_0\.bin: truncated file: the tensor count 18446744073709551615"],
                    setup=s, timeout=30))

    def overflow_dims(d):
        t = read_tensors(weights(d, 0))
        name, dtype, dims, data = t[0]
        t[0] = (name, dtype, [1 << 32, 1 << 32], b"")  # 2^64 elements: wraps to 0 bytes unchecked
        write(weights(d, 0), encode_tensors(t))
    d, s = copy("weights-dims-overflow", overflow_dims)
    out.append(Case("weights-element-overflow", run2(d, "--iters", "1"),
                    expect=[r"rank 0", r"stage_0\.bin: tensor .*: shape \[4294967296x4294967296\] f32 has more than 2\^63"],
                    setup=s, timeout=30))

    def duplicate(d):
        t = read_tensors(weights(d, 0))
        write(weights(d, 0), encode_tensors(t + [t[0]]))
    d, s = copy("weights-duplicate", duplicate)
    out.append(Case("weights-duplicate-name", run2(d, "--iters", "1"),
                    expect=[r"rank 0", r"stage_0\.bin: tensor .* appears twice"], setup=s, timeout=30))

    def data_name_len(path, fields):
        write(path, encode_dataset(fields, 1, b"\0" * 64, name_len=0xFFFFFFFF))
    p, s = dataset("name-length", data_name_len)
    out.append(Case("data-name-length-4g", run2(job_dir, "--iters", "1", "--data", p),
                    expect=[r"rank 0", r"runtime_files-name-length\.bin: truncated file: the name of field #0 is "
                                       r"4294967295 bytes long"], setup=s, timeout=30, memory_gib=3))
    out.append(Case("data-name-length-4g-pipeseq", [pipeseq, job_dir, "--iters", "1", "--data", p],
                    expect=[r"truncated file: the name of field #0 is 4294967295 bytes long"], setup=s, timeout=30,
                    memory_gib=3))

    def data_wrap(path, fields):
        # One f32[4] field (16 bytes a sample) and 2^60 + 1 samples: 16 x (2^60 + 1)
        # = 2^64 + 16 wraps to the 16 data bytes present.
        write(path, encode_dataset([("x", 1, [4])], (1 << 60) + 1, b"\0" * 16))
    p, s = dataset("sample-wrap", data_wrap)
    out.append(Case("data-sample-count-overflow", run2(job_dir, "--iters", "1", "--data", p),
                    expect=[r"rank 0", r"runtime_files-sample-wrap\.bin: field x: 1152921504606846977 samples of "
                                       r"f32\[4\] need over 2\^64 bytes"], setup=s, timeout=30))

    def data_field_count(path, fields):
        write(path, b"PIPECDS1" + struct.pack("<IQ", 4096, 1) + b"\0" * 20)
    p, s = dataset("field-count", data_field_count)
    out.append(Case("data-field-count", run2(job_dir, "--iters", "1", "--data", p),
                    expect=[r"runtime_files-field-count\.bin: truncated file: 4096 field headers need"], setup=s,
                    timeout=30))

    def data_negative_dim(path, fields):
        write(path, encode_dataset([("x", 1, [-4])], 1, b""))
    p, s = dataset("negative-dim", data_negative_dim)
    out.append(Case("data-negative-dimension", run2(job_dir, "--iters", "1", "--data", p),
                    expect=[r"runtime_files-negative-dim\.bin: field x: negative dimension -4"], setup=s,
                    timeout=30))

    # ---------------------------------------------------------------- 3. plan.json against the schedule files
    def plan_microbatches(value):
        return lambda d: edit_json(os.path.join(d, "plan.json"),
                                   lambda j: j["pipeline"].__setitem__("microbatches", value))
    d, s = copy("plan-microbatches-4", plan_microbatches(4))
    out.append(Case("plan-microbatches-disagree", run2(d, "--iters", "1"),
                    expect=[r"rank_[01]\.json: chunk 0 runs the forward of micro-batches 0, 1, but .*plan\.json says "
                            r"pipeline\.microbatches = 4"], setup=s, timeout=30))
    out.append(Case("plan-microbatches-disagree-pipeseq", [pipeseq, d, "--iters", "1"],
                    expect=[r"rank_0\.json: chunk 0 runs the forward of micro-batches 0, 1, but .*plan\.json says "
                            r"pipeline\.microbatches = 4"], setup=s, timeout=30))
    d, s = copy("plan-microbatches-1", plan_microbatches(1))
    out.append(Case("plan-microbatches-fewer", run2(d, "--iters", "1"),
                    expect=[r"rank_[01]\.json: #\d+ .*mb=1.*: micro-batch 1 is out of range: .*plan\.json says "
                            r"pipeline\.microbatches = 1"], setup=s, timeout=30))
    d, s = copy("plan-microbatches-wrap", plan_microbatches((1 << 32) + 2))
    out.append(Case("plan-microbatches-int-wrap", run2(d, "--iters", "1"),
                    expect=[r"plan\.json: member pipeline\.microbatches is out of range \(4294967298\)"], setup=s,
                    timeout=30))
    d, s = copy("plan-microbatches-float", plan_microbatches(2.5))
    out.append(Case("plan-microbatches-fraction", run2(d, "--iters", "1"),
                    expect=[r"plan\.json: member pipeline\.microbatches has the wrong type \(2\.5\)"], setup=s,
                    timeout=30))
    d, s = copy("plan-chunks", lambda d: edit_json(os.path.join(d, "plan.json"),
                                                   lambda j: j["pipeline"].__setitem__("chunks", 1 << 30)))
    out.append(Case("plan-chunks-huge", run2(d, "--iters", "1"),
                    expect=[r"plan\.json: pipeline\.microbatches \(2\) or chunks \(1073741824\) over the limit"],
                    setup=s, timeout=30))
    def deep(d):
        with open(os.path.join(d, "plan.json")) as f:
            j = json.load(f)
        text = json.dumps(j).replace('"pipec-plan"', "[" * 1000000 + "]" * 1000000, 1)
        write(os.path.join(d, "plan.json"), text.encode())
    d, s = copy("plan-deep", deep)
    out.append(Case("plan-deeply-nested-member", run2(d, "--iters", "1"),
                    expect=[r"plan\.json: member format has the wrong type \(an array of 1 elements\)"],
                    setup=s, timeout=60))
    d, s = copy("plan-version-1", lambda d: edit_json(os.path.join(d, "plan.json"),
                                                      lambda j: j.__setitem__("version", 1)))
    out.append(Case("plan-older-version", run2(d, "--iters", "1"),
                    expect=[r"plan\.json: plan\.json version 1, this piperun reads version 2; re-run pipec"],
                    setup=s, timeout=30))
    d, s = copy("plan-schedule-name", lambda d: edit_json(os.path.join(d, "plan.json"),
                                                          lambda j: j["pipeline"].__setitem__("schedule", "gpipe-x")))
    out.append(Case("plan-schedule-name-unknown", run2(d, "--iters", "1"),
                    expect=[r"plan\.json: pipeline\.schedule \"gpipe-x\" is not a schedule family \(gpipe, 1f1b, "],
                    setup=s, timeout=30))

    # The pipeline's facts are plan.json's alone (docs/schedule-files.md): a
    # stream file of the first format, which repeated them, is refused.
    def old_stream_format(d):
        edit_json(os.path.join(d, "schedule", "rank_1.json"), lambda j: j.__setitem__("format", "pipec.schedule.rank/1"))
    d, s = copy("stream-old-format", old_stream_format)
    out.append(Case("stream-older-format", run2(d, "--iters", "1"),
                    expect=[r"rank_1\.json: format \"pipec\.schedule\.rank/1\", this program reads "
                            r"\"pipec\.schedule\.rank/2\"; re-run pipec"], setup=s, timeout=30))

    def stream_edited(d):
        # Rank 1's stream loses its STEP: it would never update its weights.
        path = os.path.join(d, "schedule", "rank_1.json")
        edit_json(path, lambda j: j.__setitem__("instructions",
                                                [x for x in j["instructions"] if x["op"] != "STEP"]))
    d, s = copy("stream-edited", stream_edited)
    out.append(Case("stream-without-step", run2(d, "--iters", "1"),
                    expect=[r"rank_1\.json: the stream has 0 optimizer steps \(STEP or SPEC_STEP\) per iteration, "
                            r"but .*plan\.json says pipeline\.asynchronous = false"], setup=s, timeout=30))

    # ---------------------------------------------------------------- 4. checkpoints
    def manifest(change):
        return lambda c, it: edit_json(os.path.join(it, "manifest.json"), change)
    d, s = copy_ckpt("negative", manifest(lambda m: m.__setitem__("iteration", -5)))
    out.append(Case("checkpoint-negative-iteration", run2(job_dir, "--iters", "2", "--resume", d),
                    expect=[r"iter_1/manifest\.json: iteration -5 is negative"], setup=s, timeout=60))
    out.append(Case("checkpoint-negative-iteration-pipeseq", [pipeseq, job_dir, "--iters", "2", "--resume", d],
                    expect=[r"iter_1/manifest\.json: iteration -5 is negative"], setup=s, timeout=60))
    d, s = copy_ckpt("beyond", manifest(lambda m: m.__setitem__("iteration", 100)))
    out.append(Case("checkpoint-iteration-beyond-iters", run2(job_dir, "--iters", "2", "--resume", d),
                    expect=[r"iter_1/manifest\.json: the checkpoint is at iteration 100, beyond --iters 2"],
                    setup=s, timeout=60))
    d, s = copy_ckpt("string", manifest(lambda m: m.__setitem__("iteration", "1")))
    out.append(Case("checkpoint-iteration-string", run2(job_dir, "--iters", "2", "--resume", d),
                    expect=[r"iter_1/manifest\.json: member iteration has the wrong type"], setup=s, timeout=60))
    d, s = copy_ckpt("other-mini-batch", manifest(lambda m: m.__setitem__("microbatches", 8 * m["microbatches"])))
    out.append(Case("checkpoint-other-mini-batch", run2(job_dir, "--iters", "2", "--resume", d),
                    expect=[r"iter_1/manifest\.json: the checkpoint was trained with \d+ samples per optimizer step "
                            r"\(\d+ micro-batches of \d+\); .* takes \d+"],
                    setup=s, timeout=60))
    d, s = copy_ckpt("stage-files", manifest(lambda m: m.__setitem__("virtual_stages", 3)))
    out.append(Case("checkpoint-missing-stage-file", run2(job_dir, "--iters", "2", "--resume", d),
                    expect=[r"iter_1/stage_2\.bin: cannot open checkpoint file"], setup=s, timeout=60))
    d, s = copy_ckpt("stage-files-count", manifest(lambda m: m.__setitem__("virtual_stages", 1 << 40)))
    out.append(Case("checkpoint-huge-stage-count", run2(job_dir, "--iters", "2", "--resume", d),
                    expect=[r"iter_1/manifest\.json: virtual_stages 1099511627776 is not between 1 and 1048576"],
                    setup=s, timeout=60))
    d, s = copy_ckpt("seed", lambda c, it: None)
    out.append(Case("checkpoint-other-seed", run2(job_dir, "--iters", "2", "--seed", "5", "--resume", d),
                    expect=[r"manifest\.json: the checkpoint was trained with seed \d+, this run uses seed 5"],
                    setup=s, timeout=60))
    d, s = copy_ckpt("latest-escape", lambda c, it: write(os.path.join(c, "latest"), b"../runtime_files-ckpt/iter_1\n"))
    out.append(Case("checkpoint-latest-outside", run2(job_dir, "--iters", "2", "--resume", d),
                    expect=[r"latest: does not name a checkpoint directory beside it"], setup=s, timeout=60))

    def negative_steps(c, it):
        path = os.path.join(it, "stage_0.bin")
        t = [(n, dt, dims, struct.pack("<q", -3) if n == "meta/steps" else data)
             for n, dt, dims, data in read_tensors(path)]
        write(path, encode_tensors(t))
    d, s = copy_ckpt("steps", negative_steps)
    out.append(Case("checkpoint-negative-steps", run2(job_dir, "--iters", "2", "--resume", d),
                    expect=[r"rank 0", r"iter_1/stage_0\.bin: checkpoint tensor meta/steps is -3, negative"],
                    setup=s, timeout=60))

    def ckpt_name_len(c, it):
        path = os.path.join(it, "stage_1.bin")
        write(path, encode_tensors(read_tensors(path), name_len=0xFFFFFFFF))
    d, s = copy_ckpt("name-length", ckpt_name_len)
    out.append(Case("checkpoint-name-length-4g", run2(job_dir, "--iters", "2", "--resume", d),
                    expect=[r"rank 1", r"iter_1/stage_1\.bin: truncated file: the name of tensor #0 is 4294967295"],
                    setup=s, timeout=60, memory_gib=3))

    # ---------------------------------------------------------------- 5. stage libraries before dlopen
    def truncate_half(d):
        path = library(d, 1)
        size = os.path.getsize(path)
        with open(path, "r+b") as f:
            f.truncate(size // 2)
    d, s = copy("library-half", truncate_half)
    out.append(Case("library-truncated-half", run2(d, "--iters", "1"),
                    expect=[r"rank 1", r"libstage_1\.so: cannot load stage library: .*lies outside the file"],
                    setup=s, timeout=30))

    def patch(offset, fmt, value, k=0):
        def edit(d):
            path = library(d, k)
            with open(path, "r+b") as f:
                f.seek(offset)
                f.write(struct.pack(fmt, value))
        return edit
    d, s = copy("library-machine", patch(18, "<H", 183))  # e_machine = EM_AARCH64 (or x86-64 on aarch64)
    out.append(Case("library-other-machine", run2(d, "--iters", "1"),
                    expect=[r"rank 0", r"libstage_0\.so: cannot load stage library: ELF machine \d+ is not this "
                                       r"machine's"], setup=s, timeout=30))
    d, s = copy("library-phoff", patch(32, "<Q", 1 << 62))  # e_phoff far past the end
    out.append(Case("library-program-headers-outside", run2(d, "--iters", "1"),
                    expect=[r"rank 0", r"libstage_0\.so: cannot load stage library: the program header table .*"
                                       r"lies outside the file"], setup=s, timeout=30))
    d, s = copy("library-shoff", patch(40, "<Q", (1 << 64) - 16))  # e_shoff: offset + size overflows
    out.append(Case("library-section-headers-overflow", run2(d, "--iters", "1"),
                    expect=[r"rank 0", r"libstage_0\.so: cannot load stage library: the section header table .*"
                                       r"lies outside the file"], setup=s, timeout=30))
    d, s = copy("library-text", lambda d: write(library(d, 0), b"#!/bin/sh\necho not a library\n"))
    out.append(Case("library-not-elf", run2(d, "--iters", "1"),
                    expect=[r"rank 0", r"libstage_0\.so: cannot load stage library: not an ELF"], setup=s,
                    timeout=30))
    out.append(Case("library-truncated-half-pipeseq", [pipeseq, ctx.path("cases", "runtime_files-library-half"),
                                                       "--iters", "1"],
                    expect=[r"libstage_1\.so: cannot load stage library: .*lies outside the file"],
                    setup=copy("library-half", truncate_half)[1], timeout=30))
    return out
