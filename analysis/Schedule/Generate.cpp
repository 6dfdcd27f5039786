// Schedule generators: generate() picks a family's compute order
// (Patterns.cpp, ListScheduler.cpp), replicates it over the data-parallel
// pipelines, adds the optimizer tail and lowers it to instruction streams
// (Lower.cpp), then validates the result. generateFastest() picks the best
// family for `pipec schedule --schedule auto`.
#include "analysis/Schedule/Orders.h"
#include "analysis/Settings/Declared.h"

#include <algorithm>
#include <cassert>
#include <functional>
#include <string>
#include <vector>

namespace pipec::schedule {

using detail::appendOptimizerTail;
using detail::dualPipeVOrder;
using detail::applyVerticalSync;
using detail::autoOrder;
using detail::gpipeStage;
using detail::interleavedOrder;
using detail::limitOr1F1BPeak;
using detail::lower;
using detail::microbatchesOfReplica;
using detail::mk;
using detail::oneF1BStage;
using detail::Orders;
using detail::pipedreamOrder;
using detail::warmupOf;
using detail::withRecompute;
using detail::zbH1Stage;
using detail::zbH2Order;
using detail::zbInterleavedOrder;
using detail::zbVOrder;

namespace {

// ------------------------------------------------------------ shapes
Schedule shell(const ScheduleFamily &family, const Problem &problem) {
  Schedule s;
  s.name = family.name;
  s.problem = problem;
  s.placement = family.placement;
  s.splitBackward = family.splitBackward;
  s.asynchronous = family.asynchronous;
  return s;
}

bool uniformReplicas(const Problem &P) {
  for (int st = 1; st < P.stages; ++st)
    if (P.replicasOf(st) != P.replicasOf(0))
      return false;
  return true;
}

void requireUniformReplicas(const Problem &P, const std::string &name) {
  if (!uniformReplicas(P))
    throw ScheduleError(name + " needs the same replica count on every stage (its chunks "
                               "place every virtual stage on every pipeline); " +
                        scheduleFamilyNames([](const ScheduleFamily &f) { return f.perStageReplicas; }, " and ") +
                        " take per-stage replicas");
}

} // namespace

void detail::appendOptimizerTail(const Problem &P, Orders &orders, bool speculativeStep) {
  for (int r = 0; r < P.numRanks(); ++r) {
    const int st = P.stageOfRank(r);
    if (P.replicasOf(st) > 1)
      orders[r].push_back(mk(Op::AllReduce, -1, -1, st));
    if (speculativeStep) {
      // ZB-H2: step as soon as this stage's gradients are ready; a global
      // post-validation decides afterwards whether to roll the step back.
      orders[r].push_back(mk(Op::SpecStep));
      orders[r].push_back(mk(Op::Validate));
      orders[r].push_back(mk(Op::Rollback));
    } else {
      orders[r].push_back(mk(Op::Step));
    }
  }
}

namespace {

// A synchronous schedule is one pipeline order per replica (data-parallel
// pipelines over the micro-batches mb % R == r), then the optimizer tail.
// Needs the same replica count on every stage.
using PipelineGen = std::function<Orders(int n)>; // per stage position, local micro-batches

Orders assemble(const Schedule &s, const PipelineGen &gen, bool speculativeStep) {
  const Problem &P = s.problem;
  const int R = P.replicasOf(0);
  Orders orders(P.numRanks());
  for (int rep = 0; rep < R; ++rep) {
    const int n = (P.microbatches - rep + R - 1) / R;
    if (n == 0)
      continue;
    Orders local = gen(n);
    for (int st = 0; st < P.stages; ++st)
      for (Instr in : local[st]) {
        in.mb = in.mb * R + rep;
        orders[P.rankOf(st, rep)].push_back(in);
      }
  }
  appendOptimizerTail(P, orders, speculativeStep);
  return orders;
}

// Per-stage replica counts that differ: every replica runs the stage's
// pattern over its own micro-batches (`pattern(stage, n)` in local indices),
// with the stage's warm-up from warmupOf. Replicas with fewer micro-batches
// idle; the all-reduce sums all of them.
using StagePattern = std::function<std::vector<Instr>(int stage, int n)>;
Orders assemblePerReplica(const Schedule &s, const StagePattern &pattern, bool speculativeStep) {
  const Problem &P = s.problem;
  Orders orders(P.numRanks());
  for (int st = 0; st < P.stages; ++st)
    for (int rep = 0; rep < P.replicasOf(st); ++rep) {
      const std::vector<int> mine = microbatchesOfReplica(P, st, rep);
      if (mine.empty())
        continue;
      for (Instr in : pattern(st, (int)mine.size())) {
        in.mb = mine[in.mb];
        orders[P.rankOf(st, rep)].push_back(in);
      }
    }
  appendOptimizerTail(P, orders, speculativeStep);
  return orders;
}

// ZB-H1's pattern on every replica, with `scale` times the stage's warm-up
// (warmupOf) and its W's as late as stage 0's warm-up allows.
Orders zbH1PerReplica(const Schedule &s, int scale, bool speculativeStep) {
  const Problem &P = s.problem;
  const int warm0 = scale * warmupOf(P, 0);
  return assemblePerReplica(
      s,
      [&](int st, int n) {
        const int warm = scale * warmupOf(P, st);
        return zbH1Stage(warm, std::max(0, warm0 - warm), n);
      },
      speculativeStep);
}

} // namespace

namespace detail {
Schedule scheduleFromStageOrders(const std::string &name, const Problem &problem, const Orders &perStage) {
  // ZB-H1's shape: one chunk per rank, BWD_INPUT / BWD_WEIGHT, synchronous.
  Schedule s = shell(requireScheduleFamily("zb-h1"), problem);
  s.name = name;
  Orders orders = perStage;
  appendOptimizerTail(problem, orders, false);
  lower(s, orders);
  ValidationReport rep = validate(s);
  if (!rep.ok())
    throw ScheduleError(name + ": schedule is invalid:\n" + rep.summary());
  return s;
}
} // namespace detail

std::vector<std::string> scheduleNames() {
  std::vector<std::string> names;
  for (const ScheduleFamily &f : scheduleFamilies())
    if (generatedFromProblem(f))
      names.emplace_back(f.name);
  return names;
}

Schedule generate(const std::string &name, const Problem &problem) {
  return generate(requireScheduleFamily(name).kind, problem);
}

Schedule generate(ScheduleKind kind, const Problem &problemIn) {
  // The family's row (Families.cpp) fixes chunks, placement, split backward
  // and replicas; the branches below only pick the compute order.
  const ScheduleFamily &family = scheduleFamily(kind);
  const std::string name(family.name);
  Problem problem = problemIn;
  if (!family.anyChunks && problem.chunks == 1)
    problem.chunks = family.chunks; // Problem's default stands for the family's count
  checkChunks(family, problem.chunks);
  if (family.asynchronous && problem.inFlight == 0)
    problem.inFlight = problem.defaultInFlight();
  problem.check();
  if (!family.perStageReplicas)
    requireUniformReplicas(problem, name);
  const int p = problem.stages;
  if (const int k = family.microbatchesPerRank; k > 0) {
    const int pipelines = problem.replicasOf(0), perPipeline = problem.microbatches / pipelines;
    if (perPipeline < k * p)
      throw ScheduleError(name + " needs at least " + std::to_string(k) + " x " + std::to_string(p) + " ranks = " +
                          std::to_string(k * p) + " micro-batches per pipeline; " +
                          std::to_string(problem.microbatches) + " micro-batches over " + std::to_string(pipelines) +
                          " pipeline(s) give " + std::to_string(perPipeline));
  }
  Schedule s = shell(family, problem);
  Orders orders;
  switch (family.kind) {
  case ScheduleKind::GPipe:
  case ScheduleKind::OneFOneB:
    // One pattern per stage for every replica: with the same replica count
    // on every stage this is the textbook schedule on each replica pipeline.
    orders = assemblePerReplica(
        s,
        [&](int st, int n) {
          return family.kind == ScheduleKind::GPipe ? gpipeStage(n) : oneF1BStage(warmupOf(problem, st), n);
        },
        false);
    break;
  case ScheduleKind::ZbH1:
    orders = zbH1PerReplica(s, 1, false);
    break;
  case ScheduleKind::Interleaved:
    orders = assemble(s, [&](int n) { return interleavedOrder(p, problem.chunks, n); }, false);
    break;
  case ScheduleKind::OneFOneBRR:
    orders = pipedreamOrder(s);
    break;
  case ScheduleKind::ZbH2:
    if (uniformReplicas(problem)) {
      orders = assemble(s, [&](int n) { return zbH2Order(s, n); }, true);
    } else {
      // Per-stage replicas: ZB-H1's pattern with twice its warm-up on every
      // replica (H2's 2(p-s)-1 in flight for one replica per stage).
      orders = zbH1PerReplica(s, 2, true);
    }
    break;
  case ScheduleKind::ZbV: {
    const double limit = limitOr1F1BPeak(problem);
    orders = assemble(s, [&](int n) { return zbVOrder(s, n, limit); }, false);
    break;
  }
  case ScheduleKind::ZbInterleaved: {
    const double limit = limitOr1F1BPeak(problem);
    orders = assemble(s, [&](int n) { return zbInterleavedOrder(s, n, limit); }, false);
    break;
  }
  case ScheduleKind::DualPipeV:
    orders = assemble(s, [&](int n) { return dualPipeVOrder(p, n); }, false);
    break;
  case ScheduleKind::Csv:
    throw ScheduleError(name + " is the order of a schedule file: " + settings::flag(settings::kScheduleFile) +
                        " FILE (pipec MODEL) or " + settings::flag(settings::kFromCsv) + " FILE (pipec schedule)");
  case ScheduleKind::Auto: {
    const double limit = limitOr1F1BPeak(problem);
    if (uniformReplicas(problem)) {
      orders = assemble(s, [&](int n) { return autoOrder(s, n, limit); }, false);
    } else {
      // Per-stage replicas: the list scheduler models one pipeline; ZB-H1's
      // pattern on every replica (auto's fallback candidate) instead.
      orders = zbH1PerReplica(s, 1, false);
    }
    break;
  }
  }
  if (problem.verticalSync && !family.asynchronous)
    throw ScheduleError((settings::flag(settings::kVerticalSync) + " applies to ") +
                        scheduleFamilyNames([](const ScheduleFamily &f) { return f.asynchronous; }, " or ") +
                        " only (" + name + " is synchronous)");
  lower(s, withRecompute(s, orders));
  if (problem.verticalSync)
    applyVerticalSync(s);
  ValidationReport rep = validate(s);
  if (!rep.ok())
    throw ScheduleError(name + ": generated schedule is invalid:\n" + rep.summary());
  return s;
}

std::vector<int> searchedChunkCounts() { return {2, 4, 8}; }

int comparedChunks(const ScheduleFamily &family, std::optional<int> chunks) {
  return family.anyChunks && chunks ? *chunks : family.chunks;
}

FastestSchedule generateFastest(const Problem &problem, std::optional<int> chunks) {
  Problem limited = problem;
  limited.memoryLimit = limitOr1F1BPeak(problem); // every candidate under auto's limit
  FastestSchedule best;
  bool found = false;
  std::string firstError;
  // The planner's candidates in its order, so that a tie goes to the family
  // the planner prefers.
  for (const ScheduleFamily *family : searchedScheduleFamilies()) {
    // A family of any chunk count is tried at each of searchedChunkCounts
    // unless --chunks gives one: chunks per rank are a dimension of the search.
    std::vector<int> chunkCounts{comparedChunks(*family, chunks)};
    if (family->anyChunks && !chunks)
      chunkCounts = searchedChunkCounts();
    for (int chunks : chunkCounts) {
      Problem candidate = limited;
      candidate.chunks = chunks;
      try {
        Schedule s = generate(family->kind, candidate);
        SimResult sim = simulate(s);
        // Strictly faster beyond rounding, or the earlier family keeps it.
        if (found && sim.makespan >= best.sim.makespan - 1e-9 * std::max(1.0, best.sim.makespan))
          continue;
        best = FastestSchedule{std::string(family->name), std::move(s), std::move(sim)};
        found = true;
      } catch (const ScheduleError &e) {
        if (firstError.empty())
          firstError = e.what();
      }
    }
  }
  if (!found)
    throw ScheduleError("no synchronous family fits this problem under the memory limit (" + firstError + ")");
  return best;
}

} // namespace pipec::schedule
