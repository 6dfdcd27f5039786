// PyTorch's CSV pipeline schedules (docs/schedules.md, "CSV schedules"):
// torch.distributed.pipelining writes and reads a schedule as one row per
// rank of actions "<stage><type><micro-batch>" (`_dump_csv`, `_load_csv`),
// either compute only (F, I = backward input, W = backward weight,
// B = both) or with the transfers too (SEND_F, RECV_F, SEND_B, RECV_B).
// `stage` is the virtual stage (model order); the rank that runs it is the
// row it is on.
#include "analysis/Schedule/Orders.h"

#include <algorithm>
#include <cctype>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

namespace pipec::schedule {
namespace {

using detail::mk;
using detail::Orders;

enum class Kind { F, I, W, B, SendF, RecvF, SendB, RecvB, Other };

struct Action {
  Kind kind = Kind::Other;
  int stage = -1, mb = -1;
  int rank = 0, step = 0; // where it is in the file: row, 1-based cell
  std::string text;
  bool paired = false; // an OVERLAP_F_B's forward, its backward right after it
};

std::string where(const std::string &what, const Action &a) {
  return what + ": rank " + std::to_string(a.rank) + ", step " + std::to_string(a.step) + ", '" + a.text + "'";
}

/// The cells of one CSV line (RFC 4180 quoting, as Python's csv module writes it).
std::vector<std::string> cells(const std::string &line) {
  std::vector<std::string> out;
  std::string cell;
  bool quoted = false;
  for (size_t i = 0; i < line.size(); ++i) {
    char c = line[i];
    if (quoted) {
      if (c == '"' && i + 1 < line.size() && line[i + 1] == '"')
        cell += '"', ++i;
      else if (c == '"')
        quoted = false;
      else
        cell += c;
    } else if (c == '"') {
      quoted = true;
    } else if (c == ',') {
      out.push_back(cell);
      cell.clear();
    } else {
      cell += c;
    }
  }
  out.push_back(cell);
  return out;
}

std::string trim(const std::string &s) {
  size_t a = 0, b = s.size();
  while (a < b && std::isspace(static_cast<unsigned char>(s[a])))
    ++a;
  while (b > a && std::isspace(static_cast<unsigned char>(s[b - 1])))
    --b;
  return s.substr(a, b - a);
}

/// Reads a non-negative decimal at `pos` (at most 9 digits); -1 when none.
int number(const std::string &s, size_t &pos) {
  size_t start = pos;
  long value = 0;
  while (pos < s.size() && std::isdigit(static_cast<unsigned char>(s[pos])) && pos - start < 9)
    value = value * 10 + (s[pos++] - '0');
  return pos == start ? -1 : static_cast<int>(value);
}

/// One cell's actions (an OVERLAP_F_B holds several, run one after the other).
std::vector<Action> parseCell(const std::string &what, const std::string &cell, int rank, int step) {
  Action base;
  base.rank = rank;
  base.step = step;
  base.text = cell;
  if (!cell.empty() && cell[0] == '(') {
    // "(0F3;5B1)OVERLAP_F_B": torch overlaps the two; pipec runs them in order.
    size_t close = cell.find(')');
    if (close == std::string::npos || cell.substr(close + 1) != "OVERLAP_F_B")
      throw ScheduleError(where(what, base) + ": expected '(action;action)OVERLAP_F_B'");
    std::vector<Action> out;
    std::stringstream parts(cell.substr(1, close - 1));
    for (std::string part; std::getline(parts, part, ';');) {
      part = trim(part);
      if (part.empty())
        continue;
      for (Action a : parseCell(what, part, rank, step)) {
        a.text = cell;
        out.push_back(a);
      }
    }
    // One forward and one backward of another (stage, micro-batch) are an
    // F&B pair (Instr::paired): the forward first, the backward right after.
    // Anything else runs one action after the other.
    if (out.size() == 2) {
      if (out[1].kind == Kind::F)
        std::swap(out[0], out[1]);
      const bool backward = out[1].kind == Kind::B || out[1].kind == Kind::I;
      if (out[0].kind == Kind::F && backward && (out[0].stage != out[1].stage || out[0].mb != out[1].mb))
        out[0].paired = true;
    }
    return out;
  }
  static const std::vector<std::pair<std::string, Kind>> types = {
      {"WAIT_REDUCE_GRAD", Kind::Other}, {"WAIT_SEND_F", Kind::Other}, {"WAIT_SEND_B", Kind::Other},
      {"REDUCE_GRAD", Kind::Other},      {"UNSHARD", Kind::Other},     {"RESHARD", Kind::Other},
      {"SEND_F", Kind::SendF},           {"RECV_F", Kind::RecvF},      {"SEND_B", Kind::SendB},
      {"RECV_B", Kind::RecvB},           {"F", Kind::F},               {"I", Kind::I},
      {"B", Kind::B},                    {"W", Kind::W}};
  size_t pos = 0;
  base.stage = number(cell, pos);
  if (base.stage < 0)
    throw ScheduleError(where(what, base) + ": expected [stage][action][micro-batch], such as 2F0 or 1SEND_B3");
  for (const auto &[name, kind] : types) {
    if (cell.compare(pos, name.size(), name) != 0)
      continue;
    base.kind = kind;
    pos += name.size();
    base.mb = number(cell, pos);
    if (pos != cell.size())
      throw ScheduleError(where(what, base) + ": unexpected text after the action");
    if (kind != Kind::Other && base.mb < 0)
      throw ScheduleError(where(what, base) + ": the action names no micro-batch");
    if (kind == Kind::Other)
      return {}; // FSDP's unshard / reshard, gradient reduction, send waits: pipec's runtime does its own
    return {base};
  }
  throw ScheduleError(where(what, base) + ": unknown action (expected F, I, W, B, SEND_F, RECV_F, SEND_B, RECV_B, "
                                          "OVERLAP_F_B, or one pipec ignores: UNSHARD, RESHARD, REDUCE_GRAD, WAIT_*)");
}

bool isComputeKind(Kind k) { return k == Kind::F || k == Kind::I || k == Kind::W || k == Kind::B; }

const char *kindName(Kind k) {
  switch (k) {
  case Kind::F: return "F";
  case Kind::I: return "I";
  case Kind::W: return "W";
  case Kind::B: return "B";
  case Kind::SendF: return "SEND_F";
  case Kind::RecvF: return "RECV_F";
  case Kind::SendB: return "SEND_B";
  case Kind::RecvB: return "RECV_B";
  case Kind::Other: break;
  }
  return "?";
}

std::string actionText(int stage, Kind k, int mb) { return std::to_string(stage) + kindName(k) + std::to_string(mb); }

/// pipec's instruction for each of PyTorch's actions, read and written alike.
constexpr std::pair<Op, Kind> kActionOps[] = {
    {Op::Fwd, Kind::F},         {Op::Bwd, Kind::B},         {Op::BwdInput, Kind::I},    {Op::BwdWeight, Kind::W},
    {Op::SendAct, Kind::SendF}, {Op::RecvAct, Kind::RecvF}, {Op::SendGrad, Kind::SendB}, {Op::RecvGrad, Kind::RecvB}};

/// The action of an instruction; Kind::Other for LOAD, RECOMPUTE, collectives
/// and steps, which PyTorch's format has none of.
Kind kindOf(Op op) {
  for (const auto &[o, k] : kActionOps)
    if (o == op)
      return k;
  return Kind::Other;
}

Op opOf(Kind kind) {
  for (const auto &[o, k] : kActionOps)
    if (k == kind)
      return o;
  throw ScheduleError(std::string("no instruction for action ") + kindName(kind));
}

} // namespace

std::string toCsv(const Schedule &s, CsvFormat format) {
  const Problem &P = s.problem;
  if (s.asynchronous)
    throw ScheduleError(s.name + ": PyTorch's CSV format has no per-micro-batch updates (1F1B-RR)");
  if (P.numRanks() != P.stages)
    throw ScheduleError(s.name + ": PyTorch's CSV format has one rank per pipeline stage (no replicas)");
  std::ostringstream os;
  for (int r = 0; r < (int)s.ranks.size(); ++r) {
    const int stage = P.stageOfRank(r);
    bool first = true;
    auto text = [&](const Instr &in) { return actionText(s.virtualStage(stage, in.chunk), kindOf(in.op), in.mb); };
    for (size_t i = 0; i < s.ranks[r].size(); ++i) {
      const Instr &in = s.ranks[r][i];
      const Kind k = kindOf(in.op);
      if (k == Kind::Other || (!isComputeKind(k) && format != CsvFormat::ComputeComms))
        continue; // transfers only in compute_comms
      os << (first ? "" : ",");
      first = false;
      if (in.paired && i + 1 < s.ranks[r].size()) {
        // The validator keeps the pair's backward right after its forward.
        os << "(" << text(in) << ";" << text(s.ranks[r][++i]) << ")OVERLAP_F_B";
        continue;
      }
      os << text(in);
    }
    os << "\n";
  }
  return os.str();
}

namespace {

/// Rows: one per rank of its actions; empty lines only at the end.
std::vector<std::vector<Action>> readRows(const std::string &text, const std::string &what) {
  std::vector<std::vector<Action>> rows;
  std::stringstream lines(text);
  std::vector<std::string> all;
  for (std::string line; std::getline(lines, line);) {
    if (!line.empty() && line.back() == '\r')
      line.pop_back();
    all.push_back(line);
  }
  while (!all.empty() && trim(all.back()).empty())
    all.pop_back();
  if (all.empty())
    throw ScheduleError(what + ": no rows (one per rank expected)");
  if ((long)all.size() > kMaxStages)
    throw ScheduleError(what + ": " + std::to_string(all.size()) + " rows, more than the " +
                        std::to_string(kMaxStages) + " pipeline stages pipec runs");
  for (int r = 0; r < (int)all.size(); ++r) {
    std::vector<Action> row;
    std::vector<std::string> parts = cells(all[r]);
    for (int c = 0; c < (int)parts.size(); ++c) {
      std::string cell = trim(parts[c]);
      if (cell.empty())
        continue; // an idle slot of the grid
      for (Action &a : parseCell(what, cell, r, c + 1)) {
        if (a.mb >= kMaxMicrobatches || a.stage >= kMaxStages * kMaxChunks)
          throw ScheduleError(where(what, a) + ": stage or micro-batch beyond pipec's bounds (" +
                              std::to_string(kMaxStages * kMaxChunks) + " virtual stages, " +
                              std::to_string(kMaxMicrobatches) + " micro-batches)");
        row.push_back(a);
      }
    }
    rows.push_back(std::move(row));
  }
  return rows;
}

/// What the rows say of the pipeline: which rank runs each virtual stage
/// (the row its compute actions are on), its sizes, its placement.
struct Layout {
  std::map<int, const Action *> stageRank; // into the rows
  int ranks = 0, microbatches = 0, virtualStages = 0, chunks = 0;
  bool comms = false, split = false;
  Placement placement = Placement::Interleaved;
  int rankOfStage(int k) const { return stageRank.at(k)->rank; }
};

/// The stages' ranks and the sizes; every stage on one rank, none missing,
/// the same number on every rank.
Layout stageRanks(const std::vector<std::vector<Action>> &rows, const std::string &what) {
  Layout L;
  L.ranks = (int)rows.size();
  const int p = L.ranks;
  for (const auto &row : rows)
    for (const Action &a : row) {
      if (!isComputeKind(a.kind)) {
        L.comms = true;
        continue;
      }
      L.split = L.split || a.kind == Kind::I || a.kind == Kind::W;
      auto [it, added] = L.stageRank.emplace(a.stage, &a);
      if (!added && it->second->rank != a.rank)
        throw ScheduleError(where(what, a) + ": stage " + std::to_string(a.stage) + " also runs on rank " +
                            std::to_string(it->second->rank) + " (step " + std::to_string(it->second->step) +
                            "); a stage has one rank");
      L.microbatches = std::max(L.microbatches, a.mb + 1);
      L.virtualStages = std::max(L.virtualStages, a.stage + 1);
    }
  if (L.stageRank.empty())
    throw ScheduleError(what + ": no compute action (F, I, W or B)");
  for (int k = 0; k < L.virtualStages; ++k)
    if (!L.stageRank.count(k))
      throw ScheduleError(what + ": stage " + std::to_string(k) + " has no action, but stage " +
                          std::to_string(L.virtualStages - 1) + " has");
  if (L.virtualStages % p != 0)
    throw ScheduleError(what + ": " + std::to_string(L.virtualStages) + " stages over " + std::to_string(p) +
                        " ranks: every rank needs the same number of stages");
  L.chunks = L.virtualStages / p;
  return L;
}

/// The placements pipec runs: interleaved (stage k on rank k mod p) or the V.
Placement placementOf(const Layout &L, const std::string &what) {
  const int p = L.ranks, v = L.chunks;
  auto placedBy = [&](Placement placement) {
    if (placement == Placement::VShape && v != 2)
      return false;
    for (const auto &[k, a] : L.stageRank) {
      int stage, chunk;
      locateVirtualStage(placement, p, k, stage, chunk);
      if (stage != a->rank)
        return false;
    }
    return true;
  };
  if (placedBy(Placement::Interleaved))
    return Placement::Interleaved;
  if (placedBy(Placement::VShape))
    return Placement::VShape;
  throw ScheduleError(what + ": stages are placed neither interleaved (stage k on rank k mod " + std::to_string(p) +
                      ") nor as a V (stage k and " + std::to_string(2 * p - 1) + "-k on rank k), the placements "
                      "pipec runs");
}

/// Every action of the rows by (kind, stage, micro-batch), each at most once.
class ActionIndex {
public:
  ActionIndex(const std::vector<std::vector<Action>> &rows, const std::string &what) {
    for (const auto &row : rows)
      for (const Action &a : row) {
        auto [it, added] = seen.emplace(std::make_tuple((int)a.kind, a.stage, a.mb), &a);
        if (!added)
          throw ScheduleError(where(what, a) + ": appears twice (also step " + std::to_string(it->second->step) +
                              " of rank " + std::to_string(it->second->rank) + ")");
      }
  }
  bool has(Kind k, int stage, int mb) const { return seen.count(std::make_tuple((int)k, stage, mb)) > 0; }

private:
  std::map<std::tuple<int, int, int>, const Action *> seen; // (kind, stage, mb)
};

/// Every (stage, micro-batch): one F, and one B or one I and one W.
void checkComputeComplete(const Layout &L, const ActionIndex &actions, const std::string &what) {
  for (int k = 0; k < L.virtualStages; ++k)
    for (int mb = 0; mb < L.microbatches; ++mb) {
      const std::string name = "stage " + std::to_string(k) + ", micro-batch " + std::to_string(mb);
      if (!actions.has(Kind::F, k, mb))
        throw ScheduleError(what + ": " + name + " has no forward ('" + actionText(k, Kind::F, mb) + "')");
      const bool full = actions.has(Kind::B, k, mb), input = actions.has(Kind::I, k, mb),
                 weight = actions.has(Kind::W, k, mb);
      if (full && (input || weight))
        throw ScheduleError(what + ": " + name + " has both a full backward (B) and a split one (I, W)");
      if (!full && !input)
        throw ScheduleError(what + ": " + name + " has no backward ('" + actionText(k, Kind::B, mb) + "' or '" +
                            actionText(k, Kind::I, mb) + "')");
      if (input != weight)
        throw ScheduleError(what + ": " + name + " has " + (input ? "an I but no W" : "a W but no I"));
    }
}

/// The transfers of a compute-and-comms file: each crossing between ranks
/// sent once and received once, and nothing else.
void checkTransfers(const std::vector<std::vector<Action>> &rows, const Layout &L, const ActionIndex &actions,
                    const std::string &what) {
  const int virtualStages = L.virtualStages, microbatches = L.microbatches;
  for (const auto &row : rows)
    for (const Action &a : row) {
      if (isComputeKind(a.kind))
        continue;
      // SEND_F k: k's output to k+1; RECV_F k: k's input from k-1;
      // SEND_B k: k's input gradient to k-1; RECV_B k: k's output gradient from k+1.
      const bool forward = a.kind == Kind::SendF || a.kind == Kind::RecvF;
      const bool sends = a.kind == Kind::SendF || a.kind == Kind::SendB;
      const int peer = a.kind == Kind::SendF || a.kind == Kind::RecvB ? a.stage + 1 : a.stage - 1;
      if (a.stage >= virtualStages || peer < 0 || peer >= virtualStages || a.mb >= microbatches)
        throw ScheduleError(where(what, a) + ": no such transfer (stage " + std::to_string(peer) + " does not exist)");
      if (L.rankOfStage(a.stage) != a.rank)
        throw ScheduleError(where(what, a) + ": stage " + std::to_string(a.stage) + " runs on rank " +
                            std::to_string(L.rankOfStage(a.stage)));
      if (L.rankOfStage(peer) == a.rank)
        throw ScheduleError(where(what, a) + ": stages " + std::to_string(a.stage) + " and " +
                            std::to_string(peer) + " share a rank; nothing is transferred");
      const Kind partner = forward ? (sends ? Kind::RecvF : Kind::SendF) : (sends ? Kind::RecvB : Kind::SendB);
      if (!actions.has(partner, peer, a.mb))
        throw ScheduleError(where(what, a) + ": rank " + std::to_string(L.rankOfStage(peer)) + " has no matching '" +
                            actionText(peer, partner, a.mb) + "'");
    }
  for (int k = 0; k + 1 < virtualStages; ++k)
    for (int mb = 0; mb < microbatches; ++mb) {
      if (L.rankOfStage(k) == L.rankOfStage(k + 1))
        continue;
      if (!actions.has(Kind::SendF, k, mb))
        throw ScheduleError(what + ": rank " + std::to_string(L.rankOfStage(k)) + " has no '" +
                            actionText(k, Kind::SendF, mb) + "' (a missing send: stage " + std::to_string(k + 1) +
                            " on rank " + std::to_string(L.rankOfStage(k + 1)) + " needs it)");
      if (!actions.has(Kind::SendB, k + 1, mb))
        throw ScheduleError(what + ": rank " + std::to_string(L.rankOfStage(k + 1)) + " has no '" +
                            actionText(k + 1, Kind::SendB, mb) + "' (a missing send: stage " + std::to_string(k) +
                            " on rank " + std::to_string(L.rankOfStage(k)) + " needs it)");
    }
}

/// Deadlock: run the rows with each action waiting for what it needs (a
/// send never waits for its receive, as PyTorch's isend); the first action
/// of every rank that cannot go on is named.
void checkNoDeadlock(const std::vector<std::vector<Action>> &rows, const Layout &L, const ActionIndex &actions,
                     const std::string &what) {
  const int p = L.ranks, virtualStages = L.virtualStages;
  const bool comms = L.comms;
  std::set<std::tuple<int, int, int>> done;
  auto isDone = [&](Kind k, int stage, int mb) { return done.count(std::make_tuple((int)k, stage, mb)) > 0; };
  auto backwardDone = [&](int stage, int mb) { return isDone(Kind::B, stage, mb) || isDone(Kind::I, stage, mb); };
  // What `a` waits for, as an action text; empty when ready.
  auto waitsFor = [&](const Action &a) -> std::string {
    const int k = a.stage, mb = a.mb;
    switch (a.kind) {
    case Kind::F:
      if (k > 0 && !isDone(Kind::F, k - 1, mb))
        return actionText(k - 1, Kind::F, mb);
      if (comms && k > 0 && L.rankOfStage(k - 1) != a.rank && !isDone(Kind::RecvF, k, mb))
        return actionText(k, Kind::RecvF, mb);
      return "";
    case Kind::I:
    case Kind::B:
      if (!isDone(Kind::F, k, mb))
        return actionText(k, Kind::F, mb);
      if (k + 1 < virtualStages && !backwardDone(k + 1, mb))
        return actionText(k + 1, actions.has(Kind::B, k + 1, mb) ? Kind::B : Kind::I, mb);
      if (comms && k + 1 < virtualStages && L.rankOfStage(k + 1) != a.rank && !isDone(Kind::RecvB, k, mb))
        return actionText(k, Kind::RecvB, mb);
      return "";
    case Kind::W:
      return isDone(Kind::I, k, mb) ? "" : actionText(k, Kind::I, mb);
    case Kind::SendF:
      return isDone(Kind::F, k, mb) ? "" : actionText(k, Kind::F, mb);
    case Kind::SendB:
      return backwardDone(k, mb) ? "" : actionText(k, actions.has(Kind::B, k, mb) ? Kind::B : Kind::I, mb);
    case Kind::RecvF:
      return isDone(Kind::SendF, k - 1, mb) ? "" : actionText(k - 1, Kind::SendF, mb);
    case Kind::RecvB:
      return isDone(Kind::SendB, k + 1, mb) ? "" : actionText(k + 1, Kind::SendB, mb);
    case Kind::Other:
      break;
    }
    return "";
  };
  std::vector<size_t> pc(p, 0);
  // What the action at `i` of row `r` waits for; an F&B pair starts once
  // both its halves could (its backward follows its forward in the row).
  auto headWaitsFor = [&](int r, size_t i) {
    std::string first = waitsFor(rows[r][i]);
    if (first.empty() && rows[r][i].paired && i + 1 < rows[r].size())
      first = waitsFor(rows[r][i + 1]);
    return first;
  };
  for (bool progress = true; progress;) {
    progress = false;
    for (int r = 0; r < p; ++r)
      while (pc[r] < rows[r].size() && headWaitsFor(r, pc[r]).empty()) {
        const size_t halves = rows[r][pc[r]].paired && pc[r] + 1 < rows[r].size() ? 2 : 1;
        for (size_t k = 0; k < halves; ++k) {
          const Action &a = rows[r][pc[r]++];
          done.emplace((int)a.kind, a.stage, a.mb);
        }
        progress = true;
      }
  }
  std::string stuck;
  int count = 0;
  for (int r = 0; r < p; ++r)
    if (pc[r] < rows[r].size() && count++ < 4)
      stuck += std::string(stuck.empty() ? "" : "; ") + where("", rows[r][pc[r]]).substr(2) +
               " waits for '" + headWaitsFor(r, pc[r]) + "'";
  if (count > 0)
    throw ScheduleError(what + ": deadlock: " + stuck + (count > 4 ? "; and " + std::to_string(count - 4) + " more ranks" : ""));
}

/// The compute order of every rank, then pipec's own transfers (the same
/// compute order; the lowering places the transfers deadlock-free).
Schedule scheduleOfRows(const std::vector<std::vector<Action>> &rows, const Layout &L, const Problem &costs,
                        const std::string &what) {
  const int p = L.ranks;
  Problem problem = costs;
  problem.stages = p;
  problem.chunks = L.chunks;
  problem.microbatches = L.microbatches;
  problem.replicas.clear();
  problem.inFlight = 0;
  problem.verticalSync = false;
  problem.check();
  Schedule s;
  s.name = "csv";
  s.problem = problem;
  s.placement = L.placement;
  s.splitBackward = L.split;
  Orders orders(p);
  for (int r = 0; r < p; ++r)
    for (const Action &a : rows[r]) {
      if (!isComputeKind(a.kind))
        continue;
      int stage, chunk;
      locateVirtualStage(L.placement, p, a.stage, stage, chunk);
      Instr in = mk(opOf(a.kind), a.mb, chunk);
      in.paired = a.paired;
      orders[r].push_back(in);
    }
  detail::appendOptimizerTail(problem, orders, false);
  detail::lower(s, detail::withRecompute(s, orders));
  ValidationReport report = validate(s);
  if (!report.ok())
    throw ScheduleError(what + ": the schedule is invalid:\n" + report.summary());
  return s;
}

} // namespace

Schedule scheduleFromCsv(const std::string &text, const std::string &what, const Problem &costs) {
  const std::vector<std::vector<Action>> rows = readRows(text, what);
  Layout layout = stageRanks(rows, what);
  layout.placement = placementOf(layout, what);
  const ActionIndex actions(rows, what);
  checkComputeComplete(layout, actions, what);
  if (layout.comms)
    checkTransfers(rows, layout, actions, what);
  checkNoDeadlock(rows, layout, actions, what);
  return scheduleOfRows(rows, layout, costs, what);
}

} // namespace pipec::schedule
