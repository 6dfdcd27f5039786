#!/usr/bin/env python3
"""A `c++` for the PATH of the tests' `pipec --build` runs: each stage
library pipec asks for is compiled by the real compiler once per distinct
command, and later identical requests get a copy of that library.

pipec --build compiles every generated stage with
`c++ -O2 ... SOURCE KERNELS.a ... -o LIBRARY` through the shell. Many jobs of
a test generate byte-identical stages (the schedules of one 2-stage plan
differ only in plan.json and schedule/), and compiling a stage takes seconds.
The cache key is the real compiler, every argument, and the content and base
name of every argument that is an existing file (the source, the kernel
library); the output path is left out. Include directories are taken as
unchanged during one test run: the cache lives in the test's scratch
directory and goes with it. Failed compiles are never cached: pipec sees the
compiler's own output and exit status.

    env = stage_compile_cache.install(SCRATCH_DIR, env)   # PATH with the wrapper first
    stage_compile_cache.summary(SCRATCH_DIR)              # "N stage compiles, M run by c++"
"""
import fcntl
import hashlib
import os
import shlex
import shutil
import subprocess
import sys

CACHE_VARIABLE = "PIPEC_TEST_CXX_CACHE"
REAL_VARIABLE = "PIPEC_TEST_CXX_REAL"


def install(directory, env):
    """Writes DIRECTORY/bin/c++ and returns a copy of ENV whose PATH starts there."""
    real = shutil.which("c++", path=env.get("PATH"))
    if real is None:
        return dict(env)
    bindir = os.path.join(directory, "bin")
    cache = os.path.join(directory, "objects")
    os.makedirs(bindir, exist_ok=True)
    os.makedirs(cache, exist_ok=True)
    wrapper = os.path.join(bindir, "c++")
    with open(wrapper, "w") as stream:
        stream.write("#!/bin/sh\nexec %s %s \"$@\"\n"
                     % (shlex.quote(sys.executable), shlex.quote(os.path.abspath(__file__))))
    os.chmod(wrapper, 0o755)
    result = dict(env)
    result["PATH"] = bindir + os.pathsep + env.get("PATH", "")
    result[CACHE_VARIABLE] = cache
    result[REAL_VARIABLE] = real
    return result


def summary(directory):
    try:
        with open(os.path.join(directory, "objects", "log")) as stream:
            entries = stream.read().split()
    except OSError:
        return "no stage compiles"
    return (f"{len(entries)} stage compiles, {entries.count('miss')} run by c++, "
            f"{entries.count('hit')} identical to an earlier one")


def file_digest(path):
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def main(argv):
    real, cache = os.environ.get(REAL_VARIABLE), os.environ.get(CACHE_VARIABLE)
    if not real or not cache:
        print("stage_compile_cache: PIPEC_TEST_CXX_REAL / PIPEC_TEST_CXX_CACHE not set", file=sys.stderr)
        return 2
    outputs = [i + 1 for i, arg in enumerate(argv) if arg == "-o" and i + 1 < len(argv)]
    if len(outputs) != 1 or "-shared" not in argv or {"-c", "-E", "-S", "-"} & set(argv):
        os.execv(real, [real] + argv)  # not a stage library: compile as asked
    output = argv[outputs[0]]
    key = hashlib.sha256(real.encode())
    for i, arg in enumerate(argv):
        if i == outputs[0]:
            key.update(b"\0<output>" + os.path.basename(arg).encode(errors="surrogateescape"))
        elif os.path.isfile(arg):
            key.update(b"\0<file>" + os.path.basename(arg).encode(errors="surrogateescape") +
                       b"\0" + file_digest(arg).encode())
        else:
            key.update(b"\0" + arg.encode(errors="surrogateescape"))
    stored = os.path.join(cache, key.hexdigest())
    # One compile per key: a second request for it waits for the first.
    with open(stored + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        hit = os.path.exists(stored)
        with open(os.path.join(cache, "log"), "a") as log:
            log.write("hit\n" if hit else "miss\n")
        if hit:
            shutil.copy2(stored, output)
            return 0
        status = subprocess.call([real] + argv)
        if status == 0 and os.path.isfile(output):
            partial = f"{stored}.{os.getpid()}"
            shutil.copy2(output, partial)
            os.replace(partial, stored)
        return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
