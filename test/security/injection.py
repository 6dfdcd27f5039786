#!/usr/bin/env python3
"""Code injection through names (issue 11, item 1; docs/security.md).

ONNX names (nodes, initializers, graph inputs and outputs, intermediate
values) reach the generated stage source as string literals: profile timer
names, dropout op ids, the stage descriptor's parameter, data-field and
bundle names. This test builds small models whose names hold

- the issue's exploit: `fc1\\` + newline + `", 0, 0.0); { ... } //`, which
  closed the literal and ran the block in piperun (here it would create a
  marker file);
- quotes, backslashes, newlines and carriage returns, control bytes, `*/`,
  `#include`, `??/` trigraphs, `R"(`, shell and CMake syntax, JSON and XML
  syntax;
- a 100 KB name, UTF-8 text and malformed UTF-8 (patched into the
  serialized file, as protobuf's Python API refuses it);

compiles each with `pipec --gpus 1x2 --build` (CPU target), trains 2
iterations on 2 MPI ranks, and checks that the marker file never appears, the
build and the training succeed, every string literal of the generated .cpp
is made of safe characters only, and the names come back byte for byte from
the stage libraries' descriptors and from the exported weights. The same
models written with `--target cuda` must give .cu files passing the same
literal check (compiled with nvcc -c when --nvcc is given). A name with a
NUL byte must be refused with a message naming it (non-zero exit, no signal).

    injection.py --pipec P --piperun R [--nvcc NVCC] [--keep]
    injection.py --write-model OUT.onnx      # the exploit-in-every-role model, for lit
"""
import argparse
import ctypes
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import time

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
# Ranks on one machine: the ob1 PML over shared memory, as Open MPI picks
# here anyway (and as test/runtime/run_case.sh names it); naming it skips
# probing the cm/ucx PMLs and the TCP BTL, seconds of every mpirun. A rank
# waiting for another yields its core (ranks and tests share two cores).
ENV = dict({"OMPI_MCA_pml": "ob1", "OMPI_MCA_btl": "self,vader",
            "OMPI_MCA_btl_vader_single_copy_mechanism": "none", "OMPI_MCA_mpi_yield_when_idle": "1"},
            **os.environ)
ENV.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OPENBLAS_NUM_THREADS="1", OMPI_MCA_rmaps_base_oversubscribe="1")
FEATURES, CLASSES, BATCH = 8, 4, 8


def exploit(marker):
    """The issue's payload: closes the timer name's literal through a line
    splice and runs a block that creates `marker` (no `"`, `\\` or `?`, which
    the old escaping caught)."""
    chars = ", ".join(f"'{c}'" for c in marker) + ", 0"
    return ('fc1\\\n", 0, 0.0); { const char p[] = {' + chars + '}; const char m[] = {\'w\', 0}; '
            'std::FILE *f = std::fopen(p, m); if (f) std::fclose(f); } //')


def hostile_ascii(marker):
    """Names that break out of a C/C++ literal, comment or line in some way."""
    payload = exploit(marker)
    return [
        payload,
        'q"); { std::FILE *f = std::fopen("' + marker + '", "w"); } //',
        "*/ } int injected = 1; /*",
        '#include "/etc/passwd"\n#include <cstdlib>\nint x = std::system("touch ' + marker + '");',
        "??/\n??= define X ??( ??) ??< ??> ??! ??' ??-",
        "back\\slash\\\\and\\",
        "cr\r\nlf\ntab\tnul-free \x01\x02\x1b[31m\x7f",
        "hex\\x41\\101\\u0041\\N{LATIN}",
        'R"(raw)" u8"x" L"y"',
        "$(touch " + marker + ") `touch " + marker + "`; '\"'",
        "${PIPEC_RUNTIME_INCLUDE_DIR})\nadd_custom_target(x ALL COMMAND touch " + marker + ")\n#",
        '"}, {"name": "x", "dtype": "f32"}], "evil": [{"',
        "</text><script>alert(1)</script><![CDATA[ & ]]>",
        "a,b\nc;\"d\"",
        "",  # a name that is only the tag below
    ]


def hostile_text():
    """A 100 KB name and UTF-8 text."""
    long_name = ("x" * 97 + '"\\\n') * (100_000 // 100)
    return [long_name, "héllo_мир_名前_🙂_\u202eevil\u2028line\u0085next"]


def hostile_bytes():
    """Malformed UTF-8, patched into the serialized model."""
    return ["@@@INVALID1@@@", "@@@INVALID2@@@"]


# Same-length byte patches applied to the serialized model: malformed UTF-8
# (a stray byte, an overlong '/', a surrogate, a truncated sequence, a code
# point above U+10FFFF).
INVALID_UTF8 = {
    b"@@@INVALID1@@@": b"\xff\xfe\xc0\xaf\xed\xa0\x80bad\xc3(\x80\x80",
    b"@@@INVALID2@@@": b'"\n\xe2\x82\\*/\xf4\x90\x80\x80?\x01x',
}


def build_model(names, exploit_only=None):
    """An MLP of one Gemm+Relu layer per name. Every name appears, tagged to
    stay unique, as a node name, an initializer name and a value name; the
    first also names the graph input and the last the output. With
    `exploit_only`, the names are plain and only one Gemm node is named it."""
    rng = np.random.default_rng(0)
    k = len(names)
    tag = (lambda role, i: f"{role}{i}") if exploit_only is not None else \
        (lambda role, i: f"{role}{i}_{names[i % k]}")
    nodes, inits = [], []
    value = tag("in", 0)
    graph_input = helper.make_tensor_value_info(value, TensorProto.FLOAT, [BATCH, FEATURES])
    for i in range(k):
        out_features = CLASSES if i == k - 1 else FEATURES
        w, b = tag("w", i), tag("b", i + 1)
        inits.append(numpy_helper.from_array(
            (rng.standard_normal((out_features, FEATURES)) * 0.3).astype(np.float32), w))
        inits.append(numpy_helper.from_array(np.zeros(out_features, np.float32), b))
        gemm_out = tag("e", i + 2) if i < k - 1 else tag("out", k - 1)
        gemm_name = exploit_only if exploit_only is not None and i == 0 else tag("g", i)
        nodes.append(helper.make_node("Gemm", [value, w, b], [gemm_out], name=gemm_name, transB=1))
        value = gemm_out
        if i < k - 1:
            relu_out = tag("r", i + 3)
            nodes.append(helper.make_node("Relu", [value], [relu_out], name=tag("n", i + 4)))
            value = relu_out
    graph_output = helper.make_tensor_value_info(value, TensorProto.FLOAT, [BATCH, CLASSES])
    graph = helper.make_graph(nodes, "hostile", [graph_input], [graph_output], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    data = model.SerializeToString()
    for placeholder, replacement in INVALID_UTF8.items():
        assert len(placeholder) == len(replacement)
        data = data.replace(placeholder, replacement)
    def patched(name):
        name = name.encode()
        for placeholder, replacement in INVALID_UTF8.items():
            name = name.replace(placeholder, replacement)
        return name
    return {"data": data, "params": {patched(t.name) for t in inits},
            "timed": {patched(node.name) for node in nodes},
            "input": patched(graph_input.name), "nodes": len(nodes), "initializers": len(inits),
            # node, initializer, value and graph input/output names
            "names": len(nodes) + len(inits) + len(nodes) + 1}


def run(argv, timeout=300):
    start = time.monotonic()
    result = subprocess.run(argv, capture_output=True, timeout=timeout, env=ENV)
    result.seconds = time.monotonic() - start
    result.text = (result.stdout + result.stderr).decode(errors="replace")
    return result


# ---------------------------------------------------------------------------
# Generated source: every string literal made of safe characters only.

SAFE_LITERAL = re.compile(rb'"(?:[\x20-\x21\x23-\x3e\x40-\x5b\x5d-\x7e]|\\[0-7]{3})*"')


def check_source(path, expected_names):
    """Lexes the generated file (comments, character and string literals) and
    returns the problems: unsafe bytes or escapes, line splices, trigraphs, and
    payload words outside literals. Checks that each expected name (bytes) is
    the value of some literal."""
    data = open(path, "rb").read()
    problems = []
    if re.search(rb"[^\x20-\x7e\n]", data):
        problems.append("a byte other than printable ASCII or newline")
    if re.search(rb"\\\n", data):
        problems.append("a line splice (backslash-newline)")
    if b"??" in data:
        problems.append("'??' (a trigraph could form)")
    literals, code = [], []
    i, n = 0, len(data)
    while i < n:
        c = data[i:i + 1]
        if data.startswith(b"//", i):
            end = data.find(b"\n", i)
            end = n if end < 0 else end
            comment = data[i:end]
            if re.search(rb"fopen|system|injected|include|touch", comment):
                problems.append(f"payload text in a comment: {comment[:80]!r}")
            i = end
        elif data.startswith(b"/*", i):
            end = data.find(b"*/", i + 2)
            if end < 0:
                problems.append("an unterminated /* comment")
                break
            i = end + 2
        elif c == b'"':
            match = SAFE_LITERAL.match(data, i)
            if not match:
                problems.append(f"an unsafe string literal at byte {i}: {data[i:i + 80]!r}")
                end = data.find(b"\n", i)
                i = n if end < 0 else end
                continue
            body = match.group(0)[1:-1]
            literals.append(re.sub(rb"\\([0-7]{3})", lambda m: bytes([int(m.group(1), 8)]), body))
            i = match.end()
        elif c == b"'":
            match = re.compile(rb"'(?:[^'\\\n]|\\.)'").match(data, i)
            if not match:
                problems.append(f"a bad character literal at byte {i}: {data[i:i + 40]!r}")
                break
            i = match.end()
        else:
            code.append(c)
            i += 1
    outside = b"".join(code)
    for word in (b"fopen", b"system", b"injected", b"passwd", b"touch", b"alert", b"raw"):
        if word in outside:
            problems.append(f"'{word.decode()}' outside string literals")
    includes = re.findall(rb"^#include.*$", outside, re.M)
    if len(includes) > 10:
        problems.append(f"{len(includes)} #include lines")
    found = set(literals)
    missing = [name for name in expected_names if name not in found]
    if missing:
        problems.append(f"{len(missing)} names are no literal's value, e.g. {missing[0][:60]!r}")
    return problems


# ---------------------------------------------------------------------------
# Stage descriptors and exported weights: names come back byte for byte.

class TensorDesc(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("dtype", ctypes.c_int), ("rank", ctypes.c_int32),
                ("shape", ctypes.POINTER(ctypes.c_int64))]


class ParamDesc(ctypes.Structure):
    _fields_ = [("tensor", TensorDesc), ("role", ctypes.c_int)]


class StageDesc(ctypes.Structure):
    _fields_ = [("abi_version", ctypes.c_int32), ("stage", ctypes.c_int32),
                ("num_stages", ctypes.c_int32), ("num_params", ctypes.c_int32),
                ("params", ctypes.POINTER(ParamDesc)), ("num_data", ctypes.c_int32),
                ("data", ctypes.POINTER(TensorDesc)), ("num_inputs", ctypes.c_int32),
                ("inputs", ctypes.POINTER(TensorDesc)), ("num_outputs", ctypes.c_int32),
                ("outputs", ctypes.POINTER(TensorDesc)), ("computes_loss", ctypes.c_int32),
                ("workspace_bytes", ctypes.c_int64)]


TIMER = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int32, ctypes.c_double)


class Call(ctypes.Structure):
    """pipec_call of runtime/include/pipec/stage_abi.h."""
    _fields_ = [("step", ctypes.c_int64), ("microbatch", ctypes.c_int64), ("seed", ctypes.c_uint64)] + \
        [(name, ctypes.c_void_p) for name in ("params", "data", "inputs", "outputs", "grad_outputs",
                                               "grad_inputs", "grad_params", "workspace", "loss")] + \
        [("loss_scale", ctypes.c_float), ("stream", ctypes.c_void_p), ("timer", TIMER),
         ("timer_user", ctypes.c_void_p), ("inference", ctypes.c_int32), ("no_graphs", ctypes.c_int32)]


def run_forward(library):
    """Calls the stage's forward once on zeroed tensors with a profile timer,
    outside piperun: what the generated code runs. Returns (status, the timer
    names it reported, as bytes)."""
    handle = ctypes.CDLL(os.path.abspath(library))
    handle.pipec_stage_describe.restype = ctypes.POINTER(StageDesc)
    d = handle.pipec_stage_describe().contents
    keep = []

    def table(descs):
        pointers = (ctypes.c_void_p * max(1, len(descs)))()
        for i, t in enumerate(descs):
            elements = int(np.prod([t.shape[k] for k in range(t.rank)], dtype=np.int64))
            storage = ctypes.create_string_buffer(8 * max(1, elements))
            keep.append(storage)
            pointers[i] = ctypes.addressof(storage)
        keep.append(pointers)
        return ctypes.cast(pointers, ctypes.c_void_p)

    names = []
    timer = TIMER(lambda user, name, phase, seconds: names.append(name))
    loss = ctypes.c_float(0)
    workspace = ctypes.create_string_buffer(max(1, d.workspace_bytes))
    call = Call(params=table([d.params[i].tensor for i in range(d.num_params)]),
                data=table([d.data[i] for i in range(d.num_data)]),
                inputs=table([d.inputs[i] for i in range(d.num_inputs)]),
                outputs=table([d.outputs[i] for i in range(d.num_outputs)]),
                workspace=ctypes.addressof(workspace), loss=ctypes.addressof(loss),
                loss_scale=1.0, timer=timer)
    handle.pipec_stage_forward.argtypes = [ctypes.POINTER(Call)]
    status = handle.pipec_stage_forward(ctypes.byref(call))
    return status, names


def descriptor_names(library):
    handle = ctypes.CDLL(os.path.abspath(library))
    handle.pipec_stage_describe.restype = ctypes.POINTER(StageDesc)
    d = handle.pipec_stage_describe().contents
    return ({d.params[i].tensor.name for i in range(d.num_params)},
            {d.data[i].name for i in range(d.num_data)})


def tensor_file_names(path):
    """Names of a pipec.tensors/1 file (docs/weights-format.md), as bytes."""
    data = open(path, "rb").read()
    (count,) = struct.unpack_from("<Q", data, 8)
    offset, names = 16, set()
    for _ in range(count):
        (length,) = struct.unpack_from("<I", data, offset)
        offset += 4
        names.add(data[offset:offset + length])
        offset += length
        _, rank = struct.unpack_from("<II", data, offset)
        offset += 8 + 8 * rank
        (nbytes,) = struct.unpack_from("<Q", data, offset)
        offset += 8 + nbytes
    return names


# ---------------------------------------------------------------------------

class Checker:
    def __init__(self, args, workdir):
        self.args, self.workdir = args, workdir
        self.marker = os.path.join(workdir, "INJECTED")
        self.failures = []
        self.builds, self.trainings = [], []

    def check(self, ok, label, detail=""):
        # Details quote hostile output: shown escaped, and not all of it.
        shown = detail[-1500:].encode("ascii", "backslashreplace").decode()
        shown = re.sub(r"[\x00-\x09\x0b-\x1f\x7f]", lambda m: f"\\x{ord(m.group(0)):02x}", shown)
        print(f"  {'ok  ' if ok else 'FAIL'} {label}" + (f": {shown}" if shown and not ok else ""),
              flush=True)
        if not ok:
            self.failures.append(label)
        return ok

    def marker_absent(self, label):
        self.check(not os.path.exists(self.marker), f"{label}: no injected code ran (marker absent)")

    def compile_and_train(self, label, model, initializer_names, names_in_code, node_names,
                          may_refuse=None):
        """Returns whether pipec built the job."""
        job = os.path.join(self.workdir, label + "-job")
        built = run([self.args.pipec, model, "--gpus", "1x2", "--stages", "2", "--microbatches", "2",
                     "--out", job, "--build"], timeout=600)
        self.builds.append(built.seconds)
        self.marker_absent(f"{label} pipec --build")
        if may_refuse and built.returncode != 0:
            # A clear refusal is also an answer (exit 1..127, the reason named).
            self.check(0 < built.returncode < 128 and re.search(may_refuse, built.text, re.I),
                       f"{label}: refused cleanly (exit {built.returncode}, message "
                       f"matching {may_refuse!r})", built.text[-1500:])
            print(f"  note {label}: {built.text.strip().splitlines()[-1][:200]!r}")
            return False
        if not self.check(built.returncode == 0, f"{label}: pipec --build succeeds "
                          f"({built.seconds:.1f} s)", built.text[-3000:]):
            return False
        sources = sorted(f for f in os.listdir(os.path.join(job, "stages")) if f.endswith(".cpp"))
        self.check(len(sources) == 2, f"{label}: two stages", str(sources))
        for source in sources:
            problems = check_source(os.path.join(job, "stages", source), [])
            self.check(not problems, f"{label} {source}: every string literal is escaped",
                       "; ".join(problems[:5]))
        params, data = set(), set()
        for library in sorted(f for f in os.listdir(os.path.join(job, "stages")) if f.endswith(".so")):
            p, d = descriptor_names(os.path.join(job, "stages", library))
            params |= p
            data |= d
        self.check(params == initializer_names,
                   f"{label}: the descriptors' {len(params)} parameter names equal the model's "
                   "initializer names byte for byte",
                   f"missing {sorted(initializer_names - params)[:2]}, extra {sorted(params - initializer_names)[:2]}")
        self.check(names_in_code <= data | params,
                   f"{label}: the input name reaches the descriptor's data fields byte for byte",
                   f"data fields {sorted(data)[:3]}")
        timed = []
        for library in sorted(f for f in os.listdir(os.path.join(job, "stages")) if f.endswith(".so")):
            status, names = run_forward(os.path.join(job, "stages", library))
            self.check(status == 0, f"{label} {library}: forward runs outside piperun (ctypes)")
            timed += names
        self.marker_absent(f"{label} forward")
        self.check(node_names <= set(timed),
                   f"{label}: the profile timer reports the {len(node_names)} forward node names "
                   "byte for byte", f"missing {sorted(node_names - set(timed))[:2]}")
        trained = os.path.join(job, "trained")
        training = run(["mpirun", "--oversubscribe", "-np", "2", self.args.piperun, job, "--iters", "2",
                        "--export-weights", trained], timeout=300)
        self.trainings.append(training.seconds)
        self.marker_absent(f"{label} piperun")
        loss = re.search(r"done: 2 iterations.*final loss ([-+0-9.eEnaif]+)", training.text)
        if not self.check(training.returncode == 0 and loss and np.isfinite(float(loss.group(1))),
                          f"{label}: mpirun -np 2 piperun trains 2 iterations "
                          f"({training.seconds:.1f} s)", training.text[-3000:]):
            return True
        exported = set()
        for name in os.listdir(trained):
            exported |= tensor_file_names(os.path.join(trained, name))
        self.check(exported == initializer_names,
                   f"{label}: the exported weights carry the initializer names byte for byte",
                   f"missing {sorted(initializer_names - exported)[:2]}")
        return True

    def cuda_source(self, label, model, expected):
        job = os.path.join(self.workdir, label + "-cuda")
        result = run([self.args.pipec, model, "--gpus", "1x2", "--stages", "2", "--microbatches", "2",
                      "--target", "cuda",
                      "--cuda-arch", "sm_80", "--out", job])
        if not self.check(result.returncode == 0, f"{label}: pipec --target cuda writes the .cu sources",
                          result.text[-3000:]):
            return
        sources = sorted(f for f in os.listdir(os.path.join(job, "stages")) if f.endswith(".cu"))
        for source in sources:
            problems = check_source(os.path.join(job, "stages", source), [])
            self.check(not problems, f"{label} {source}: every string literal is escaped",
                       "; ".join(problems[:5]))
        # Every hostile name is the value of some literal in the .cu files.
        texts = [open(os.path.join(job, "stages", s), "rb").read() for s in sources]
        values = set()
        for text in texts:
            for match in SAFE_LITERAL.finditer(text):
                values.add(re.sub(rb"\\([0-7]{3})", lambda m: bytes([int(m.group(1), 8)]),
                                  match.group(0)[1:-1]))
        missing = [n for n in expected if n not in values]
        self.check(not missing, f"{label}: the .cu literals decode to the {len(expected)} "
                   "parameter names byte for byte", f"missing {missing[:2]}")
        if self.args.nvcc and sources:
            start = time.monotonic()
            compiled = run([self.args.nvcc, "-std=c++17", "--expt-relaxed-constexpr", "-arch=sm_80",
                            "-I", os.path.join(ROOT, "runtime", "include"),
                            "-I", os.path.join(ROOT, "runtime", "kernels", "include"),
                            "-I", os.path.join(ROOT, "runtime", "kernels", "cuda", "include"),
                            "-c", os.path.join(job, "stages", sources[0]),
                            "-o", os.path.join(job, "stage.o")], timeout=600)
            self.check(compiled.returncode == 0,
                       f"{label} {sources[0]}: nvcc -c compiles it ({time.monotonic() - start:.1f} s)",
                       compiled.text[-3000:])
            self.marker_absent(f"{label} nvcc")

    def refused(self, label, model, pattern):
        job = os.path.join(self.workdir, label + "-job")
        result = run([self.args.pipec, model, "--gpus", "1x2", "--out", job, "--build"])
        self.marker_absent(label)
        self.check(result.returncode > 0 and result.returncode < 128,
                   f"{label}: refused with a non-zero exit, no signal (exit {result.returncode})",
                   result.text[-2000:])
        self.check(re.search(pattern, result.text, re.I | re.S) is not None,
                   f"{label}: the message names the NUL byte and the name",
                   result.text[-2000:])
        self.check(not os.path.exists(os.path.join(job, "stages", "libstage_0.so")),
                   f"{label}: no stage library written")


def nul_model(where):
    names = ["plain"]
    model = onnx.load_from_string(build_model(names)["data"])
    if where == "node":
        model.graph.node[0].name = "fc1\x00evil"
    else:
        old = model.graph.initializer[0].name
        model.graph.initializer[0].name = "w0\x00evil"
        for node in model.graph.node:
            for k, name in enumerate(node.input):
                if name == old:
                    node.input[k] = "w0\x00evil"
    return model.SerializeToString()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pipec")
    parser.add_argument("--piperun")
    parser.add_argument("--nvcc", help="compile one .cu per model with nvcc -c")
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--write-model", help="write the hostile-names model and exit")
    args = parser.parse_args()
    if args.write_model:
        open(args.write_model, "wb").write(build_model(hostile_ascii("/nonexistent/INJECTED"))["data"])
        return 0
    if not args.pipec or not args.piperun:
        parser.error("--pipec and --piperun are required")
    workdir = tempfile.mkdtemp(prefix="pipec-injection-")
    start = time.monotonic()
    checker = Checker(args, workdir)
    try:
        models = {
            # Only the exploit, in one node name: the rest of the old escaping
            # held, so this built and ran the block before the fix.
            "exploit": build_model(["a", "b"], exploit_only=exploit(checker.marker)),
            "ascii": build_model(hostile_ascii(checker.marker)),
            "text": build_model(hostile_text()),
            "bytes": build_model(hostile_bytes()),
        }
        total_names = 0
        for label, model in models.items():
            path = os.path.join(workdir, f"{label}.onnx")
            open(path, "wb").write(model["data"])
            total_names += model["names"]
            print(f"{label}: {model['nodes']} nodes, {model['initializers']} initializers, "
                  f"{len(model['data'])} bytes", flush=True)
            # Malformed UTF-8 may also be refused at import, with the reason.
            if checker.compile_and_train(label, path, model["params"], {model["input"]}, model["timed"],
                                         may_refuse=r"UTF-8" if label == "bytes" else None):
                checker.cuda_source(label, path, model["params"])
        for where in ("node", "initializer"):
            path = os.path.join(workdir, f"nul-{where}.onnx")
            open(path, "wb").write(nul_model(where))
            checker.refused(f"nul-{where}", path, r"NUL.*evil|evil.*NUL")
        elapsed = time.monotonic() - start
        strings = len(hostile_ascii("")) + len(hostile_text()) + len(hostile_bytes()) + 1
        print(f"{strings} hostile strings in {total_names} names of {len(models)} models "
              f"(+2 NUL models); builds {', '.join(f'{s:.1f}' for s in checker.builds)} s, "
              f"trainings {', '.join(f'{s:.1f}' for s in checker.trainings)} s; total {elapsed:.0f} s")
    finally:
        if os.path.exists(checker.marker):
            checker.failures.append("the marker file exists: injected code ran")
            print("FAIL the marker file exists: injected code ran")
        if args.keep:
            print(f"work directory kept: {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    if checker.failures:
        print(f"{len(checker.failures)} checks failed")
        return 1
    print("all checks hold")
    return 0


if __name__ == "__main__":
    sys.exit(main())
