#!/usr/bin/env python3
"""The security corpus (docs/security.md): hostile and malformed inputs run
through pipec, piperun and pipeseq. Every case must end within its time limit,
without a signal, and either fail with a non-zero exit whose message names the
file (or option) and the reason, or, for cases marked `ok`, succeed.

Cases live in `cases_<area>.py` beside this file; each module defines
`cases(ctx)` returning a list of `Case`. `ctx` builds shared fixtures once
(a compiled job, a model file) in a scratch directory.

Each area (cases_<area>.py) runs its cases in order, in its own lane; the
lanes run side by side (--jobs, default 3): most cases wait on mpirun rather
than compute, and the areas share nothing but the fixtures of `ctx`, which
are built once under a lock.

    corpus.py --pipec P --piperun R --pipeseq S [--only SUBSTRING] [--jobs N] [-v]
"""
import argparse
import concurrent.futures
import glob
import importlib.util
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))

# Ranks on one machine: the ob1 PML over shared memory, as Open MPI picks
# here anyway (and as test/runtime/run_case.sh names it); naming it skips
# probing the cm/ucx PMLs and the TCP BTL, seconds of every mpirun. A rank
# waiting for another yields its core (ranks and tests share two cores).
MPI_ENV = dict({"OMPI_MCA_pml": "ob1", "OMPI_MCA_btl": "self,vader",
                "OMPI_MCA_btl_vader_single_copy_mechanism": "none", "OMPI_MCA_mpi_yield_when_idle": "1"},
                **os.environ)
MPI_ENV.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OPENBLAS_NUM_THREADS="1", OMPI_MCA_rmaps_base_oversubscribe="1")


@dataclass
class Case:
    name: str
    argv: List[str]
    # Regular expressions (re.search, case-insensitive) that the combined
    # output must match: the file or option named, and the reason.
    expect: List[str] = field(default_factory=list)
    ok: bool = False            # the command must succeed instead
    timeout: float = 60.0       # seconds
    memory_gib: float = 4.0     # address-space limit of the command
    setup: Optional[Callable[[], None]] = None
    stdin: Optional[bytes] = None
    env: Optional[dict] = None


class Context:
    """Paths of the tools and a scratch directory; fixtures built on demand."""

    def __init__(self, args, scratch):
        self.pipec, self.piperun, self.pipeseq = args.pipec, args.piperun, args.pipeseq
        self.python = sys.executable
        self.scratch = scratch
        self.root = ROOT
        self.examples = os.path.join(ROOT, "examples")
        self.env = MPI_ENV
        self._cache = {}
        self._lock = threading.RLock()  # lanes build fixtures one at a time

    def path(self, *parts):
        p = os.path.join(self.scratch, *parts)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        return p

    def once(self, key, build):
        with self._lock:
            if key not in self._cache:
                self._cache[key] = build()
            return self._cache[key]

    def run(self, argv, timeout=600, check=True):
        r = subprocess.run(argv, capture_output=True, timeout=timeout, env=self.env)
        if check and r.returncode != 0:
            raise RuntimeError(f"fixture command failed: {' '.join(argv)}\n"
                               f"{r.stdout.decode(errors='replace')[-2000:]}\n"
                               f"{r.stderr.decode(errors='replace')[-2000:]}")
        return r

    def job(self, model="mlp.onnx", gpus="1x2", extra=()):
        """A built training job (plan directory) of an example, shared by cases.
        Cases that modify it copy it first with `copy_job`."""
        key = ("job", model, gpus, tuple(extra))

        def build():
            out = self.path("jobs", f"{model}-{gpus}-{len(self._cache)}")
            self.run([self.pipec, os.path.join(self.examples, model), "--gpus", gpus,
                      "--microbatches", "2", "--out", out, "--build", *extra])
            return out
        return self.once(key, build)

    def copy_job(self, name, **job_args):
        dst = self.path("cases", name)
        if os.path.exists(dst):
            shutil.rmtree(dst)
        shutil.copytree(self.job(**job_args), dst, symlinks=True)
        return dst

    def mpirun(self, ranks, *args):
        return ["mpirun", "--oversubscribe", "-np", str(ranks), *args]


def load_cases(ctx, only):
    cases = []
    for path in sorted(glob.glob(os.path.join(HERE, "cases_*.py"))):
        spec = importlib.util.spec_from_file_location(os.path.basename(path)[:-3], path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        area = os.path.basename(path)[len("cases_"):-3]
        for case in module.cases(ctx):
            case.name = f"{area}/{case.name}"
            case.area = area
            if not only or only in case.name:
                cases.append(case)
    names = [c.name for c in cases]
    duplicates = {n for n in names if names.count(n) > 1}
    if duplicates:
        raise SystemExit(f"duplicate case names: {sorted(duplicates)}")
    return cases


PRLIMIT = shutil.which("prlimit")


def limited(argv, gib):
    """ARGV run with an address-space limit of GIB, in its own process group
    (so that a timeout kills every rank): through util-linux's prlimit, which
    sets the limit and execs the command (same pid), as a preexec_fn is not
    safe with the lanes' threads; without prlimit, a preexec_fn."""
    limit = int(gib * (1 << 30))
    if PRLIMIT:
        return [PRLIMIT, f"--as={limit}:{limit}", "--", *argv], {"start_new_session": True}

    def apply():
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        os.setsid()
    return list(argv), {"preexec_fn": apply}


def run_case(ctx, case):
    """Returns None when the case holds, else what went wrong."""
    import re
    if case.setup:
        case.setup()
    start = time.monotonic()
    argv, session = limited(case.argv, case.memory_gib)
    process = subprocess.Popen(argv, stdin=subprocess.PIPE if case.stdin is not None else subprocess.DEVNULL,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               env=case.env or ctx.env, **session)
    try:
        output, _ = process.communicate(case.stdin, timeout=case.timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        return f"did not finish within {case.timeout:.0f} s (hang)", b""
    elapsed = time.monotonic() - start
    text = output.decode(errors="replace")
    rc = process.returncode
    if rc < 0:
        return f"killed by signal {signal.Signals(-rc).name} after {elapsed:.1f} s", text
    if rc >= 128 and rc - 128 in (signal.SIGSEGV, signal.SIGABRT, signal.SIGBUS, signal.SIGFPE, signal.SIGILL,
                                  signal.SIGKILL):
        return f"exit {rc}: a rank died of signal {signal.Signals(rc - 128).name}", text
    if re.search(r"Stack dump|terminate called|Segmentation fault|AddressSanitizer|runtime error:", text):
        return f"exit {rc} with a crash report in the output", text
    if case.ok:
        return (None if rc == 0 else f"expected success, got exit {rc}"), text
    if rc == 0:
        return "expected a non-zero exit, got 0 (silently accepted)", text
    missing = [pattern for pattern in case.expect if not re.search(pattern, text, re.IGNORECASE | re.DOTALL)]
    if missing:
        return f"exit {rc}, but the message lacks {missing}", text
    return None, text


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pipec", required=True)
    parser.add_argument("--piperun", required=True)
    parser.add_argument("--pipeseq", required=True)
    parser.add_argument("--only", default="")
    parser.add_argument("--keep", action="store_true", help="keep the scratch directory")
    parser.add_argument("--jobs", type=int, default=3, help="areas run side by side (default 3)")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args()
    scratch = tempfile.mkdtemp(prefix="pipec-security-")
    ctx = Context(args, scratch)
    failures = 0
    printing = threading.Lock()

    def lane(cases):
        failed = 0
        for case in cases:
            try:
                problem, text = run_case(ctx, case)
            except Exception as error:  # a fixture that could not be built
                problem, text = f"setup failed: {error}", ""
            status = "ok  " if problem is None else "FAIL"
            with printing:
                print(f"{status} {case.name}" + ("" if problem is None else f": {problem}"), flush=True)
                if problem is not None or args.verbose:
                    tail = text.strip().splitlines()[-8:]
                    for line in tail:
                        print(f"       | {line[:300]}")
                sys.stdout.flush()
            failed += problem is not None
        return failed

    try:
        cases = load_cases(ctx, args.only)
        lanes = {}
        for case in cases:
            lanes.setdefault(case.area, []).append(case)
        # The longest lanes (mpirun cases) start first.
        order = sorted(lanes, key=lambda area: (not area.startswith("runtime"), -len(lanes[area])))
        with concurrent.futures.ThreadPoolExecutor(max(1, args.jobs)) as pool:
            failures = sum(pool.map(lambda area: lane(lanes[area]), order))
        print(f"{len(cases) - failures}/{len(cases)} cases hold")
    finally:
        if not args.keep:
            shutil.rmtree(scratch, ignore_errors=True)
        else:
            print(f"scratch kept in {scratch}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
