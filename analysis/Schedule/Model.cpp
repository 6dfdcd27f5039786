// Instruction model, problem description, text/JSON serialization.
#include "analysis/Schedule/Schedule.h"
#include "runtime/include/pipec/json_reader.h"
#include "runtime/include/pipec/json_schema.h"
#include "runtime/include/pipec/rank_stream.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cassert>
#include <cmath>
#include <sstream>

// schedule.json (docs/schedule-files.md): its header and problem as one
// schema for toJson and fromJson (pipec/json_schema.h); the streams are
// rank_stream.h's instruction lists.
template <> struct pipec::schema::Schema<pipec::schedule::Problem> {
  template <class V, class P> static void members(V &v, P &p) {
    v.required("stages", p.stages);
    v.required("microbatches", p.microbatches);
    v.required("chunks", p.chunks);
    v.required("replicas", p.replicas);
    v.required("cost_f", p.costF);
    v.required("cost_b", p.costB);
    v.required("cost_w", p.costW);
    v.required("comm", p.comm);
    v.required("allreduce_cost", p.allreduceCost);
    v.required("step_cost", p.stepCost);
    v.required("activation", p.activation);
    v.required("memory_limit", p.memoryLimit);
    v.required("w_mem_frac", p.wMemFrac);
    v.required("in_flight", p.inFlight);
    v.optional("recompute", p.recompute);
    v.optional("boundary_activation", p.boundaryActivation);
    v.optional("vertical_sync", p.verticalSync);
    v.optional("fb_overlap", p.fbOverlap);
  }
};
template <> struct pipec::schema::Schema<pipec::schedule::Schedule> {
  template <class V, class S> static void members(V &v, S &s) {
    v.required("schedule", s.name);
    v.required("placement", s.placement);
    v.required("asynchronous", s.asynchronous);
    v.required("split_backward", s.splitBackward);
    v.required("problem", s.problem);
  }
};

namespace pipec::schedule {

namespace {
double pick(const std::vector<double> &v, int stage, int chunk, int p, int chunks,
            const char *what) {
  // One entry: uniform stage value; p entries: per stage; p*v: per (stage, chunk).
  if (v.size() == 1)
    return v[0] / chunks;
  if ((int)v.size() == p)
    return v[stage] / chunks;
  if ((int)v.size() == p * chunks)
    return v[stage * chunks + chunk];
  throw ScheduleError(std::string("cost vector ") + what + " has " + std::to_string(v.size()) +
                      " entries; expected 1, stages or stages*chunks");
}
std::string formatValue(double x) {
  std::ostringstream os;
  os << x;
  return os.str();
}
} // namespace

// ---------------------------------------------------------------- Problem
// Problems come from `pipec schedule`'s flags, the planner and
// schedule.json alike: errors name the problem's members as schedule.json
// spells them (docs/schedule-files.md), not any one command line's flags.
void Problem::check() const {
  auto fail = [](const std::string &m) { throw ScheduleError("invalid problem: " + m); };
  auto within = [&](const char *option, long value, long lo, long hi) {
    if (value < lo || value > hi)
      fail(std::string(option) + " " + std::to_string(value) + ": must be between " + std::to_string(lo) +
           " and " + std::to_string(hi));
  };
  within("stages", stages, 1, kMaxStages);
  within("microbatches", microbatches, 1, kMaxMicrobatches);
  within("chunks", chunks, 1, kMaxChunks);
  if ((long)stages * chunks * microbatches > kMaxComputeSlots)
    fail("stages " + std::to_string(stages) + " x chunks " + std::to_string(chunks) + " x microbatches " +
         std::to_string(microbatches) + " = " + std::to_string((long)stages * chunks * microbatches) +
         " compute slots, over the limit of " + std::to_string(kMaxComputeSlots));
  if (!replicas.empty() && (int)replicas.size() != stages)
    fail("replicas must have one entry per stage");
  long ranks = 0;
  for (int r : replicas) {
    if (r < 1 || r > kMaxRanks)
      fail("replicas " + std::to_string(r) + ": must be between 1 and " + std::to_string(kMaxRanks));
    ranks += r;
  }
  if (ranks > kMaxRanks)
    fail("replicas: " + std::to_string(ranks) + " ranks in all, over the limit of " + std::to_string(kMaxRanks));
  within("in_flight", inFlight, 0, kMaxMicrobatches);
  // The per-stage vectors first, so that costOf() below cannot throw on them.
  for (auto [option, values] : {std::pair<const char *, const std::vector<double> *>{"cost_f", &costF},
                                {"cost_b", &costB},
                                {"cost_w", &costW},
                                {"activation", &activation}}) {
    const size_t n = values->size();
    if (n != 1 && n != (size_t)stages && n != (size_t)stages * chunks)
      fail(std::string(option) + " has " + std::to_string(n) + " entries; expected 1, stages (" +
           std::to_string(stages) + ") or stages x chunks (" + std::to_string(stages) + " x " +
           std::to_string(chunks) + " = " + std::to_string((long)stages * chunks) + ")");
    // W = 0 is a fused backward (B computes the weight gradients too, as
    // GPipe and 1F1B assume); a forward or input gradient always takes time.
    const bool zeroAllowed = values == &activation || values == &costW;
    for (double x : *values)
      if (!std::isfinite(x) || x < 0 || x > kMaxCost || (!zeroAllowed && !(x > 0)))
        fail(std::string(option) + " " + formatValue(x) + ": must be " + (zeroAllowed ? ">= 0" : "positive") +
             ", finite and at most " + formatValue(kMaxCost));
  }
  for (int s = 0; s < stages; ++s)
    for (int c = 0; c < chunks; ++c) {
      for (Op op : {Op::Fwd, Op::BwdInput, Op::BwdWeight})
        if (!(op == Op::BwdWeight ? costOf(op, s, c) >= 0 : costOf(op, s, c) > 0) ||
            !std::isfinite(costOf(op, s, c)))
          fail(std::string("costs must be finite, and positive but for W (") + choiceName(op) + ")");
      if (!(activationOf(s, c) >= 0))
        fail("activation memory must be >= 0");
    }
  if (!(fbOverlap >= 0 && fbOverlap <= 1))
    fail("fb_overlap " + formatValue(fbOverlap) + ": must be between 0 and 1");
  for (auto [option, value] : {std::pair<const char *, double>{"comm", comm},
                               {"allreduce_cost", allreduceCost},
                               {"step_cost", stepCost}})
    if (!(value >= 0 && value <= kMaxCost))
      fail(std::string(option) + " " + formatValue(value) + ": must be >= 0, finite and at most " +
           formatValue(kMaxCost));
  if (std::isnan(memoryLimit))
    fail("memory_limit must be a number");
  if (!(wMemFrac >= 0 && wMemFrac <= 1))
    fail("w_mem_frac must be in [0, 1]");
  if (inFlight < 0)
    fail("in_flight must be >= 0");
  if (!recompute.empty() && recompute.size() != 1 && (int)recompute.size() != stages)
    fail("recompute must have one entry or one per stage");
  for (int r : recompute)
    if (r != 0 && r != 1)
      fail("recompute entries must be 0 or 1");
  if (boundaryActivation.size() != 1 && (int)boundaryActivation.size() != stages)
    fail("boundary_activation must have one entry or one per stage");
  for (double b : boundaryActivation)
    if (!(b >= 0 && b <= 1))
      fail("boundary_activation must be in [0, 1]");
}

bool Problem::recomputes(int stage) const {
  if (recompute.empty())
    return false;
  return (recompute.size() == 1 ? recompute[0] : recompute[stage]) != 0;
}

double Problem::boundaryOf(int stage) const {
  return boundaryActivation.size() == 1 ? boundaryActivation[0] : boundaryActivation[stage];
}

double Problem::restingActivationOf(int stage, int chunk) const {
  const double a = activationOf(stage, chunk);
  return recomputes(stage) ? a * boundaryOf(stage) : a;
}

int Problem::replicasOf(int stage) const { return replicas.empty() ? 1 : replicas[stage]; }

int Problem::numRanks() const {
  int n = 0;
  for (int s = 0; s < stages; ++s)
    n += replicasOf(s);
  return n;
}

int Problem::rankOf(int stage, int replica) const {
  int r = 0;
  for (int s = 0; s < stage; ++s)
    r += replicasOf(s);
  return r + replica;
}

int Problem::stageOfRank(int rank) const {
  for (int s = 0; s < stages; ++s) {
    if (rank < replicasOf(s))
      return s;
    rank -= replicasOf(s);
  }
  return -1;
}

int Problem::replicaOfRank(int rank) const { return rank - rankOf(stageOfRank(rank), 0); }

double Problem::costOf(Op op, int stage, int chunk) const {
  switch (op) {
  case Op::Fwd:
  case Op::Recompute:
    return pick(costF, stage, chunk, stages, chunks, "F");
  case Op::BwdInput:
    return pick(costB, stage, chunk, stages, chunks, "B");
  case Op::BwdWeight:
    return pick(costW, stage, chunk, stages, chunks, "W");
  case Op::Bwd:
    return pick(costB, stage, chunk, stages, chunks, "B") +
           pick(costW, stage, chunk, stages, chunks, "W");
  default:
    assert(false && "costOf() is asked of compute ops only (isCompute)");
    return 0;
  }
}

double Problem::pairCostOf(int stage, int chunkF, Op backward, int chunkB) const {
  const double f = costOf(Op::Fwd, stage, chunkF), b = costOf(backward, stage, chunkB);
  return f + b - fbOverlap * std::min(f, b);
}

double Problem::activationOf(int stage, int chunk) const {
  return pick(activation, stage, chunk, stages, chunks, "activation");
}

int Problem::defaultInFlight() const {
  // PipeDream's NOAM: ceil(#workers / #replicas of the input stage).
  return (numRanks() + replicasOf(0) - 1) / replicasOf(0);
}

// ---------------------------------------------------------------- Schedule
int Schedule::virtualStage(int stage, int chunk) const {
  return ::pipec::virtualStage(placement, problem.stages, stage, chunk);
}

void Schedule::locate(int vs, int &stage, int &chunk) const {
  locateVirtualStage(placement, problem.stages, vs, stage, chunk);
}

int Schedule::rankFor(int vs, int mb) const {
  int stage, chunk;
  locate(vs, stage, chunk);
  return problem.rankOf(stage, problem.replicaFor(stage, mb));
}

// ---------------------------------------------------------------- text / JSON
std::string toText(const Schedule &s) {
  std::ostringstream os;
  os << "# pipec schedule " << s.name << ": stages=" << s.problem.stages
     << " microbatches=" << s.problem.microbatches << " chunks=" << s.problem.chunks
     << " placement=" << choiceName(s.placement)
     << (s.asynchronous ? " asynchronous" : "") << (s.problem.verticalSync ? " vertical-sync" : "") << "\n";
  for (size_t r = 0; r < s.ranks.size(); ++r) {
    os << "rank " << r << " stage=" << s.problem.stageOfRank((int)r)
       << " replica=" << s.problem.replicaOfRank((int)r) << "\n";
    for (size_t i = 0; i < s.ranks[r].size(); ++i)
      os << "  " << i << ": " << toString(s.ranks[r][i]) << "\n";
  }
  return os.str();
}

using nlohmann::json;
inline constexpr const char *kScheduleFormat = "pipec.schedule/1";

std::string rankToJson(const Schedule &s, int rank) {
  return stream::toJson(stream::RankFile{rank, s.problem.stageOfRank(rank), s.problem.replicaOfRank(rank),
                                         s.ranks[rank]})
             .dump(1) +
         "\n";
}

std::string toJson(const Schedule &s) {
  json j = schema::encode(s);
  j["format"] = kScheduleFormat;
  json ranks = json::array();
  for (const std::vector<Instr> &list : s.ranks)
    ranks.push_back(stream::toJson(list));
  j["ranks"] = std::move(ranks);
  return j.dump(1) + "\n";
}

Schedule fromJson(const std::string &text) {
  const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded())
    throw ScheduleError("bad schedule JSON: not a JSON document");
  if (!j.is_object() || j.value("format", json()) != kScheduleFormat)
    throw ScheduleError(std::string("not a ") + kScheduleFormat + " document");
  const json_io::Reader<ScheduleError> reader{"schedule JSON"};
  Schedule s = schema::fromJson<Schedule>(reader, j);
  if (!j.contains("ranks") || !j.at("ranks").is_array())
    throw ScheduleError("schedule JSON: missing member ranks (an array of instruction lists)");
  const json &ranks = j.at("ranks");
  for (size_t r = 0; r < ranks.size(); ++r)
    s.ranks.push_back(stream::instructionsFromJson(reader, ranks[r], "ranks[" + std::to_string(r) + "]"));
  return s;
}

std::string ValidationReport::summary(size_t maxErrors) const {
  std::string s;
  for (size_t i = 0; i < errors.size() && i < maxErrors; ++i)
    s += (i ? "\n" : "") + errors[i];
  if (errors.size() > maxErrors)
    s += "\n... and " + std::to_string(errors.size() - maxErrors) + " more";
  return s;
}

} // namespace pipec::schedule
