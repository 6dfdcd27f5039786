#!/usr/bin/env python3
"""Faults injected into a running piperun job (security corpus, runtime_job):
starts `mpirun -np N piperun ARGS`, waits until its output contains TRIGGER,
sends SIGNAL to one rank's process, then relays the output until the job
ends and reports how long that took.

    signal_rank.py --ranks 2 --rank 1 --signal STOP --trigger "iter 3/" \
        [--max-seconds S] -- PIPERUN PLAN_DIR [piperun options]

Exit status: 0 when the job succeeded (the fault went unnoticed), 1 when it
ended with an error, 2 when the trigger never appeared. The last line says
"the job ended T s after SIGNAL to rank R" and, when T <= --max-seconds,
"(in time)".
"""
import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--rank", type=int, default=1)
    parser.add_argument("--signal", default="STOP")
    parser.add_argument("--trigger", default="iter 3/")
    parser.add_argument("--max-seconds", type=float, default=1e9)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    sig = getattr(signal, "SIG" + args.signal)
    piddir = tempfile.mkdtemp(prefix="signal-rank-")
    # Each rank's shell writes its pid, then becomes piperun (same pid).
    wrapper = 'echo $$ > "%s/pid.$OMPI_COMM_WORLD_RANK"; exec "$@"' % piddir
    argv = ["mpirun", "--oversubscribe", "-np", str(args.ranks), "sh", "-c", wrapper, "sh", *command]
    job = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    sent = None
    for raw in job.stdout:
        line = raw.decode(errors="replace")
        sys.stdout.write(line)
        sys.stdout.flush()
        if sent is None and args.trigger in line:
            with open(os.path.join(piddir, "pid.%d" % args.rank)) as f:
                os.kill(int(f.read().strip()), sig)
            sent = time.monotonic()
            print("signal_rank: sent SIG%s to rank %d" % (args.signal, args.rank), flush=True)
    rc = job.wait()
    if sent is None:
        print("signal_rank: the trigger %r never appeared (exit %d)" % (args.trigger, rc), flush=True)
        return 2
    elapsed = time.monotonic() - sent
    print("signal_rank: the job ended %.1f s after SIG%s to rank %d (mpirun exit %d)%s"
          % (elapsed, args.signal, args.rank, rc, " (in time)" if elapsed <= args.max_seconds else " (too slow)"),
          flush=True)
    return 0 if rc == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
