// PyTorch's CSV schedules (docs/schedules.md, "CSV schedules"): every family
// written by toCsv reads back to the same streams; hand-written files with a
// missing send, a deadlock or too much memory are refused naming the rank,
// the step and the action.
#include "analysis/Schedule/Schedule.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

using namespace pipec::schedule;

namespace {

/// The streams without the optimizer tail (ZB-H2's speculative step has no
/// CSV action: it reads back as a plain step).
std::vector<std::vector<pipec::Instr>> withoutTail(const Schedule &s) {
  std::vector<std::vector<pipec::Instr>> out;
  for (const auto &rank : s.ranks) {
    out.emplace_back();
    for (const auto &in : rank)
      if (!pipec::isCollective(in.op) && in.op != Op::Step && in.op != Op::SpecStep && in.op != Op::Validate &&
          in.op != Op::Rollback)
        out.back().push_back(in);
  }
  return out;
}

std::string errorOf(const std::string &csv, const Problem &costs = Problem()) {
  try {
    scheduleFromCsv(csv, "t.csv", costs);
  } catch (const ScheduleError &e) {
    return e.what();
  }
  return "";
}

} // namespace

TEST(Csv, EveryFamilyReadsBackToTheSameStreams) {
  struct Shape {
    int p, m, chunks;
    double f, b, w, comm;
  };
  const std::vector<Shape> shapes = {{4, 8, 2, 1, 1, 1, 0}, {4, 12, 3, 1, 2, 1, 0.1}, {2, 4, 4, 1.5, 1, 0.5, 0.2},
                                     {8, 16, 2, 1, 1.2, 0.8, 0.05}};
  int checked = 0;
  for (const ScheduleFamily &family : scheduleFamilies()) {
    if (family.asynchronous || !generatedFromProblem(family))
      continue; // 1F1B-RR: per-micro-batch updates, which the format cannot say; csv: a file's
    for (const Shape &shape : shapes) {
      Problem P;
      P.stages = shape.p;
      P.microbatches = shape.m;
      P.chunks = family.anyChunks ? shape.chunks : family.chunks;
      P.costF = {shape.f};
      P.costB = {shape.b};
      P.costW = {shape.w};
      P.comm = shape.comm;
      Schedule s = generate(std::string(family.name), P);
      for (CsvFormat format : {CsvFormat::ComputeOnly, CsvFormat::ComputeComms}) {
        SCOPED_TRACE(std::string(family.name) + " p=" + std::to_string(shape.p) + " m=" + std::to_string(shape.m) +
                     " v=" + std::to_string(P.chunks) + " " + pipec::choiceName(format));
        Schedule back = scheduleFromCsv(toCsv(s, format), "t.csv", P);
        EXPECT_EQ(back.problem.stages, s.problem.stages);
        EXPECT_EQ(back.problem.chunks, s.problem.chunks);
        EXPECT_EQ(back.problem.microbatches, s.problem.microbatches);
        EXPECT_EQ(back.placement, s.placement);
        if (family.kind == pipec::ScheduleKind::ZbH2)
          EXPECT_EQ(withoutTail(back), withoutTail(s));
        else
          EXPECT_EQ(back.ranks, s.ranks);
        EXPECT_NEAR(simulate(back).makespan, simulate(s).makespan, 1e-9);
        ++checked;
      }
    }
  }
  EXPECT_GE(checked, 50);
}

TEST(Csv, WritesPyTorchsActions) {
  Problem P;
  P.stages = 2;
  P.microbatches = 2;
  Schedule s = generate("1f1b", P);
  EXPECT_EQ(toCsv(s, CsvFormat::ComputeOnly), "0F0,0F1,0B0,0B1\n1F0,1B0,1F1,1B1\n");
  EXPECT_EQ(toCsv(s, CsvFormat::ComputeComms),
            "0F0,0SEND_F0,0F1,0SEND_F1,0RECV_B0,0B0,0RECV_B1,0B1\n"
            "1RECV_F0,1F0,1RECV_F1,1B0,1SEND_B0,1F1,1B1,1SEND_B1\n");
}

TEST(Csv, ReadsAHandWrittenSchedule) {
  // 1F1B on 2 ranks written by hand, idle grid cells and spaces included,
  // with FSDP's and gradient-reduction actions pipec does its own way.
  Schedule s = scheduleFromCsv("0F0, 0F1,0B0,,0B1,0REDUCE_GRAD\r\n,1F0,1B0,1F1,1B1,1UNSHARD\n\n", "t.csv", Problem());
  EXPECT_EQ(s.problem.stages, 2);
  EXPECT_EQ(s.problem.microbatches, 2);
  EXPECT_FALSE(s.splitBackward);
  EXPECT_DOUBLE_EQ(simulate(s).makespan, 9.0); // B is the whole backward: B + W = 2
  // A forward and another micro-batch's backward in one OVERLAP_F_B are an
  // F&B pair, the forward first whatever the cell's order: one compute of
  // F + B + W = 3 that starts once 1F0 is done (1B0's forward) and 0F1 sent.
  Schedule paired = scheduleFromCsv("0F0,0F1,0B0,0B1\n1F0,(1B0;1F1)OVERLAP_F_B,1B1\n", "t.csv", Problem());
  std::vector<pipec::Instr> computes;
  for (const pipec::Instr &in : paired.ranks[1])
    if (pipec::isCompute(in.op))
      computes.push_back(in);
  ASSERT_EQ(computes.size(), 4u);
  EXPECT_EQ(pipec::toString(computes[1]), "FWD mb=1 chunk=0 paired");
  EXPECT_EQ(pipec::toString(computes[2]), "BWD mb=0 chunk=0");
  // 0F0 [0,1], 0F1 [1,2], 1F0 [1,2], the pair [2,5], 1B1 [5,7], 0B0 [5,7], 0B1 [7,9].
  EXPECT_DOUBLE_EQ(simulate(paired).makespan, 9.0);
  Problem overlapped;
  overlapped.fbOverlap = 1; // the pair takes max(F, B + W) = 2
  EXPECT_DOUBLE_EQ(simulate(scheduleFromCsv("0F0,0F1,0B0,0B1\n1F0,(1B0;1F1)OVERLAP_F_B,1B1\n", "t.csv", overlapped)).makespan,
                   8.0);
  EXPECT_EQ(toCsv(paired, CsvFormat::ComputeOnly), "0F0,0F1,0B0,0B1\n1F0,(1F1;1B0)OVERLAP_F_B,1B1\n");
  // An overlap of a micro-batch's own forward and backward cannot be one
  // compute (the backward needs the forward): it runs in order.
  Schedule own = scheduleFromCsv("0F0,0F1,0B0,0B1\n1F0,1B0,(1F1;1B1)OVERLAP_F_B\n", "t.csv", Problem());
  EXPECT_EQ(own.ranks, s.ranks);
}

TEST(Csv, RefusesNamingRankStepAndAction) {
  // A forward that never happens.
  {
    std::string e = errorOf("0F0,0B0\n1F0,1B0,1F1,1B1\n");
    EXPECT_NE(e.find("stage 0, micro-batch 1 has no forward ('0F1')"), std::string::npos) << e;
  }
  // A missing send in the compute-and-comms variant.
  {
    std::string e = errorOf("0F0,0SEND_F0,0F1,0RECV_B0,0B0,0RECV_B1,0B1\n"
                            "1RECV_F0,1F0,1B0,1SEND_B0,1RECV_F1,1F1,1B1,1SEND_B1\n");
    EXPECT_NE(e.find("rank 1, step 5, '1RECV_F1': rank 0 has no matching '0SEND_F1'"), std::string::npos) << e;
  }
  // A deadlock: rank 1 runs micro-batch 1 first, rank 0 micro-batch 0's backward first.
  {
    std::string e = errorOf("0F0,0B0,0F1,0B1\n1F1,1B1,1F0,1B0\n");
    EXPECT_NE(e.find("deadlock: rank 0, step 2, '0B0' waits for '1B0'; rank 1, step 1, '1F1' waits for '0F1'"),
              std::string::npos)
        << e;
  }
  // A deadlock only the pair makes: its backward waits for rank 1's 1B0,
  // which comes after 1F1, which needs the pair's forward.
  {
    std::string e = errorOf("0F0,(0F1;0B0)OVERLAP_F_B,0B1\n1F0,1F1,1B0,1B1\n");
    EXPECT_NE(e.find("deadlock: rank 0, step 2, '(0F1;0B0)OVERLAP_F_B' waits for '1B0'; rank 1, step 2, '1F1' "
                     "waits for '0F1'"),
              std::string::npos)
        << e;
  }
  // A receive placed after the forward that needs it.
  {
    std::string e = errorOf("0F0,0SEND_F0,0RECV_B0,0B0\n1F0,1RECV_F0,1B0,1SEND_B0\n");
    EXPECT_NE(e.find("rank 1, step 1, '1F0' waits for '1RECV_F0'"), std::string::npos) << e;
  }
  // Memory over the limit: GPipe's order holds all 4 micro-batches on rank 0.
  {
    Problem limited;
    limited.memoryLimit = 2;
    std::string e = errorOf("0F0,0F1,0F2,0F3,0B0,0B1,0B2,0B3\n1F0,1F1,1F2,1F3,1B0,1B1,1B2,1B3\n", limited);
    EXPECT_NE(e.find("t.csv: the schedule is invalid"), std::string::npos) << e;
    EXPECT_NE(e.find("rank 0"), std::string::npos) << e;
    EXPECT_NE(e.find("memory"), std::string::npos) << e;
  }
  // Text that is no action, a stage on two ranks, a placement pipec does not run.
  EXPECT_NE(errorOf("0F0,0X1\n").find("rank 0, step 2, '0X1': unknown action"), std::string::npos);
  EXPECT_NE(errorOf("0F0,0B0,1F0\n1B0\n").find("rank 1, step 1, '1B0': stage 1 also runs on rank 0"),
            std::string::npos);
  EXPECT_NE(errorOf("1F0,1B0\n0F0,0B0\n").find("placed neither interleaved"), std::string::npos);
  EXPECT_NE(errorOf("0F0,0I0\n").find("has an I but no W"), std::string::npos);
  EXPECT_NE(errorOf("").find("no rows"), std::string::npos);
}
