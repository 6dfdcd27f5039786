// DualPipeV (docs/schedules.md, "DualPipeV"): the family validates and
// simulates on every shape it is defined for, keeps the reference's memory
// (2p + 1 chunk activations per rank), meets the reference's bubble formula
// in the regime it is stated for, and its F&B pairs are checked, timed and
// written like any instruction.
#include "analysis/Schedule/Schedule.h"
#include "test/unit/schedule/Problems.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

using namespace pipec::schedule;
using pipec::Instr;

namespace {

struct Costs {
  const char *name;
  double f, b, w, c;
};
// bench/schedule's five cost sets (F, input-gradient B, W, one transfer).
const std::vector<Costs> kGridCosts = {{"F=B=W=1", 1, 1, 1, 0},
                                       {"F1 B1.2 W0.8 c0.05", 1, 1.2, 0.8, 0.05},
                                       {"6.2B profile", 29.718, 29.444, 19.927, 0.527},
                                       {"B=2F W=F", 1, 2, 1, 0},
                                       {"F1 B1.2 W0.8 c0.5", 1, 1.2, 0.8, 0.5}};

Problem problem(int p, int m, double f, double b, double w, double c = 0, double overlap = 0) {
  Problem P = pipec::schedule::test::uniform(p, m, f, b, w, c);
  P.fbOverlap = overlap;
  return P;
}

int pairsOn(const Schedule &s, int rank) {
  int pairs = 0;
  for (const Instr &in : s.ranks[rank])
    pairs += in.paired;
  return pairs;
}

// The reference's bubble for p ranks: (p - 1)(F&B + B - 3W), with B a full
// backward (input and weight gradients) and F&B the time of one pair.
double referenceBubble(const Problem &P) {
  const double f = P.costF[0] / 2, b = P.costB[0] / 2, w = P.costW[0] / 2; // per chunk
  const double pair = f + b + w - P.fbOverlap * std::min(f, b + w);
  return (P.stages - 1) * (pair + (b + w) - 3 * w);
}

// The most any rank idles between the start and the end of the step.
double largestIdle(const SimResult &r) {
  double idle = 0;
  for (double compute : r.rankCompute)
    idle = std::max(idle, r.makespan - compute);
  return idle;
}

std::string errorOf(const Problem &P, const std::string &family = "dualpipev") {
  try {
    generate(family, P);
  } catch (const ScheduleError &e) {
    return e.what();
  }
  return "";
}

} // namespace

TEST(DualPipeV, ValidAndSimulatedOnEveryShape) {
  int checked = 0;
  for (int p : {1, 2, 3, 4, 5, 8, 16})
    for (int m : {2 * p, 2 * p + 1, 3 * p, 4 * p})
      for (const Costs &k : kGridCosts)
        for (double overlap : {0.0, 0.5, 1.0}) {
          SCOPED_TRACE(std::string(k.name) + " p=" + std::to_string(p) + " m=" + std::to_string(m) +
                       " overlap=" + std::to_string(overlap));
          Schedule s = generate("dualpipev", problem(p, m, k.f, k.b, k.w, k.c, overlap));
          EXPECT_TRUE(validate(s).ok());
          EXPECT_EQ(s.placement, pipec::Placement::VShape);
          EXPECT_EQ(s.problem.chunks, 2);
          const SimResult r = simulate(s);
          // Steps 4 and 5 of the reference: 2(m - 2p + r + 1) + (p - r - 1)
          // pairs on rank r, less the last rank's first, which runs apart.
          for (int rank = 0; rank < p; ++rank)
            EXPECT_EQ(pairsOn(s, rank), 2 * (m - 2 * p + rank + 1) + (p - rank - 1) - (rank == p - 1));
          // The reference's activation memory: PP + 1 = 2p + 1 chunk
          // activations (half a stage's micro-batch each) on every rank.
          if (p > 1)
            for (int rank = 0; rank < p; ++rank)
              EXPECT_DOUBLE_EQ(r.peakMemory[rank], (2 * p + 1) * 0.5);
          ++checked;
        }
  EXPECT_EQ(checked, 7 * 4 * 5 * 3);
}

TEST(DualPipeV, TheReferencesBubbleWhereTransfersAreFree) {
  // Stated for a backward no lighter than the forward and W no heavier than
  // F: equal where F = B, below it where B > F.
  for (int p : {4, 8, 16})
    for (int m : {2 * p, 3 * p, 4 * p})
      for (double overlap : {0.0, 0.5, 1.0}) {
        SCOPED_TRACE("p=" + std::to_string(p) + " m=" + std::to_string(m) + " overlap=" + std::to_string(overlap));
        for (const Problem &P : {problem(p, m, 1, 1, 1, 0, overlap), problem(p, m, 2, 2, 1, 0, overlap),
                                 problem(p, m, 1, 1, 0.5, 0, overlap)})
          EXPECT_NEAR(largestIdle(simulate(generate("dualpipev", P))), referenceBubble(P), 1e-9);
        for (const Problem &P : {problem(p, m, 1, 2, 1, 0, overlap), problem(p, m, 1, 1.2, 0.8, 0, overlap)}) {
          const double idle = largestIdle(simulate(generate("dualpipev", P)));
          EXPECT_LE(idle, referenceBubble(P) + 1e-9);
          EXPECT_GE(idle, referenceBubble(P) - 2.0 * P.costF[0]);
        }
      }
}

TEST(DualPipeV, OverlapShortensThePairs) {
  const Problem P = problem(4, 16, 1, 1.2, 0.8);
  Problem overlapped = P;
  overlapped.fbOverlap = 1;
  const double plain = simulate(generate("dualpipev", P)).makespan;
  const double hidden = simulate(generate("dualpipev", overlapped)).makespan;
  EXPECT_LT(hidden, plain);
  // Without overlap a pair is its two computes: each rank computes
  // m (F + B + W) in all, as any schedule does.
  const SimResult r = simulate(generate("dualpipev", P));
  for (double compute : r.rankCompute)
    EXPECT_NEAR(compute, 16 * 3.0, 1e-9);
}

TEST(DualPipeV, RefusesWhatTheReferenceCannotRun) {
  std::string e = errorOf(problem(4, 7, 1, 1, 1));
  EXPECT_NE(e.find("dualpipev needs at least 2 x 4 ranks = 8 micro-batches per pipeline"), std::string::npos) << e;
  Problem replicated = problem(2, 6, 1, 1, 1);
  replicated.replicas = {2, 2}; // 3 micro-batches per pipeline
  e = errorOf(replicated);
  EXPECT_NE(e.find("6 micro-batches over 2 pipeline(s) give 3"), std::string::npos) << e;
  replicated.microbatches = 8;
  EXPECT_TRUE(validate(generate("dualpipev", replicated)).ok());
  replicated.replicas = {1, 2};
  EXPECT_NE(errorOf(replicated).find("same replica count on every stage"), std::string::npos);
  Problem three = problem(2, 4, 1, 1, 1);
  three.chunks = 3;
  EXPECT_NE(errorOf(three).find("places exactly 2 chunks per rank"), std::string::npos);
  // The reference's memory is over 1F1B's peak (p + 1/2 against p units).
  Problem limited = problem(4, 8, 1, 1, 1);
  limited.memoryLimit = 4;
  EXPECT_NE(errorOf(limited).find("exceeds the limit"), std::string::npos);
  limited.memoryLimit = 4.5;
  EXPECT_EQ(errorOf(limited), "");
}

TEST(DualPipeV, ValidatorChecksThePairs) {
  Schedule s = generate("dualpipev", problem(2, 4, 1, 1, 1));
  auto firstPaired = [&](Schedule &x) -> size_t {
    for (size_t i = 0; i < x.ranks[0].size(); ++i)
      if (x.ranks[0][i].paired)
        return i;
    return x.ranks[0].size();
  };
  auto errors = [](const Schedule &x) { return validate(x).summary(); };
  {
    Schedule x = s; // the backward moved away from its forward
    const size_t i = firstPaired(x);
    ASSERT_LT(i + 2, x.ranks[0].size());
    std::swap(x.ranks[0][i + 1], x.ranks[0][i + 2]);
    EXPECT_NE(errors(x).find("paired, but the next instruction is no BWD or BWD_INPUT"), std::string::npos)
        << errors(x);
  }
  {
    Schedule x = s; // a backward marked as the pair's first half
    const size_t i = firstPaired(x);
    x.ranks[0][i].paired = false;
    x.ranks[0][i + 1].paired = true;
    EXPECT_NE(errors(x).find("only a FWD pairs with a backward"), std::string::npos) << errors(x);
  }
  {
    Schedule x = s; // paired with its own backward
    const size_t i = firstPaired(x);
    x.ranks[0][i + 1].mb = x.ranks[0][i].mb;
    x.ranks[0][i + 1].chunk = x.ranks[0][i].chunk;
    EXPECT_NE(errors(x).find("own micro-batch and chunk"), std::string::npos) << errors(x);
  }
}

TEST(DualPipeV, PairsSurviveJsonAndCsv) {
  Schedule s = generate("dualpipev", problem(4, 8, 1, 1.2, 0.8, 0.05));
  EXPECT_EQ(fromJson(toJson(s)).ranks, s.ranks);
  const std::string csv = toCsv(s, CsvFormat::ComputeComms);
  EXPECT_NE(csv.find(")OVERLAP_F_B"), std::string::npos);
  Schedule back = scheduleFromCsv(csv, "t.csv", s.problem);
  EXPECT_EQ(back.ranks, s.ranks);
  EXPECT_NEAR(simulate(back).makespan, simulate(s).makespan, 1e-9);
}

TEST(DualPipeV, RecomputeComesBeforeThePair) {
  Problem P = problem(3, 6, 1, 1, 1);
  P.recompute = {1};
  Schedule s = generate("dualpipev", P);
  ASSERT_TRUE(validate(s).ok());
  for (const auto &rank : s.ranks)
    for (size_t i = 0; i < rank.size(); ++i)
      if (rank[i].paired) {
        // The compute before the pair re-runs the pair's backward's forward
        // (receives may come between, nothing between the pair's two).
        size_t k = i;
        while (k > 0 && !pipec::isCompute(rank[k - 1].op))
          --k;
        ASSERT_GT(k, 0u);
        EXPECT_EQ(rank[k - 1].op, Op::Recompute);
        EXPECT_EQ(rank[k - 1].mb, rank[i + 1].mb);
        EXPECT_EQ(rank[k - 1].chunk, rank[i + 1].chunk);
      }
}
