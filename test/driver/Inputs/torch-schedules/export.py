#!/usr/bin/env python3
"""Schedules written by PyTorch's own generators in its CSV format
(torch.distributed.pipelining, `_dump_csv`), for test/driver/csv-schedules.test:
pipec must read, validate and simulate what torch writes. The generators are
pure Python: they run on mock stages, without a GPU or a process group.

Run with a current torch (test/models/README.md); CI only reads the files:

    /work/torchenv/bin/python test/driver/Inputs/torch-schedules/export.py

Writes, for p = 4 ranks and m = 8 micro-batches:
  interleaved-zb-v4.csv         ScheduleInterleavedZeroBubble, 4 chunks per rank, compute_only
  interleaved-zb-v2-comms.csv   the same with 2 chunks, compute_comms
  interleaved-1f1b-comms.csv    ScheduleInterleaved1F1B, 2 chunks, compute_comms
  zbv.csv                       ScheduleZBVZeroBubble, compute_only
  dualpipev.csv                 ScheduleDualPipeV (OVERLAP_F_B pairs), compute_only
and zbv-p2-m4.csv, ScheduleZBVZeroBubble for 2 ranks and 4 micro-batches,
which test/e2e/pipeline_training.py trains (pipec MODEL --schedule-file).
DualPipeV at more shapes, which pipec's own dualpipev must order alike
(test/driver/dualpipev.test): dualpipev-p<P>-m<M>.csv for (P, M) = (2, 4),
(3, 7), (4, 12) and (8, 16).
"""
import os

import torch
import torch.distributed.pipelining.schedules as S

HERE = os.path.dirname(os.path.abspath(__file__))


class MockStage:
    """What the schedules' constructors read of a stage."""

    def __init__(self, stage_index, num_stages, group_size):
        self.stage_index, self.num_stages = stage_index, num_stages
        self.group_size, self.group_rank = group_size, 0
        self.is_first, self.is_last = stage_index == 0, stage_index == num_stages - 1
        self.submod = torch.nn.Linear(2, 2)
        self.dw_builder = None
        self.scale_grads = True


def dump(cls, p, m, chunks, name, fmt):
    n = p * chunks
    ranks0 = [0, 2 * p - 1] if cls in (S.ScheduleZBVZeroBubble, S.ScheduleDualPipeV) else range(0, n, p)
    schedule = cls([MockStage(k, n, p) for k in ranks0], m, loss_fn=lambda out, target: out.sum())
    path = os.path.join(HERE, name)
    schedule._dump_csv(path, format=fmt)
    print("wrote", path)


def main():
    p, m = 4, 8
    dump(S.ScheduleInterleavedZeroBubble, p, m, 4, "interleaved-zb-v4.csv", "compute_only")
    dump(S.ScheduleInterleavedZeroBubble, p, m, 2, "interleaved-zb-v2-comms.csv", "compute_comms")
    dump(S.ScheduleInterleaved1F1B, p, m, 2, "interleaved-1f1b-comms.csv", "compute_comms")
    dump(S.ScheduleZBVZeroBubble, p, m, 2, "zbv.csv", "compute_only")
    dump(S.ScheduleDualPipeV, p, m, 2, "dualpipev.csv", "compute_only")
    dump(S.ScheduleZBVZeroBubble, 2, 4, 2, "zbv-p2-m4.csv", "compute_only")
    for p, m in ((2, 4), (3, 7), (4, 12), (8, 16)):
        dump(S.ScheduleDualPipeV, p, m, 2, f"dualpipev-p{p}-m{m}.csv", "compute_only")


if __name__ == "__main__":
    main()
