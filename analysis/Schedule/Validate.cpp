// Validator: ownership, dependencies, send/receive matching, deadlock
// freedom under blocking rendezvous semantics, memory limit, stash bound,
// F&B pairs (a paired FWD followed by its backward: the backward's checks at
// its own position are the pair's, as nothing comes between the two).
#include "analysis/Schedule/Schedule.h"

#include <algorithm>
#include <cassert>
#include <map>
#include <tuple>

namespace pipec::schedule {

namespace {
constexpr size_t kMaxErrors = 64;

struct Checker {
  const Schedule &s;
  const Problem &P;
  ValidationReport rep;
  int V, m, R;

  explicit Checker(const Schedule &sch)
      : s(sch), P(sch.problem), V(sch.virtualStages()), m(sch.problem.microbatches),
        R(sch.problem.numRanks()) {}

  void error(int r, long i, const std::string &msg) {
    if (rep.errors.size() >= kMaxErrors)
      return;
    std::string where = "rank " + std::to_string(r);
    if (i >= 0)
      where += " #" + std::to_string(i) + " " + toString(s.ranks[r][i]);
    rep.errors.push_back(where + ": " + msg);
  }

  // Virtual stage an instruction's message is received at (p2p only).
  int recvVs(int r, const Instr &in) const {
    const int vs = s.virtualStage(P.stageOfRank(r), in.chunk);
    switch (in.op) {
    case Op::SendAct:
      return vs + 1;
    case Op::SendGrad:
      return vs - 1;
    default:
      return vs;
    }
  }

  bool structure(int r, long i, const Instr &in) {
    auto bad = [&](const std::string &msg) {
      error(r, i, msg);
      return false;
    };
    const bool needsMb = isCompute(in.op) || isP2P(in.op) || in.op == Op::Load ||
                         in.op == Op::Stash || in.op == Op::Restore;
    if (needsMb && (in.mb < 0 || in.mb >= m))
      return bad("micro-batch out of range [0, " + std::to_string(m) + ")");
    if ((isCompute(in.op) || isP2P(in.op)) && (in.chunk < 0 || in.chunk >= P.chunks))
      return bad("chunk out of range [0, " + std::to_string(P.chunks) + ")");
    if (isP2P(in.op) && (in.peer < 0 || in.peer >= R || in.peer == r))
      return bad("invalid peer rank");
    if (in.op == Op::AllReduce && in.peer != P.stageOfRank(r))
      return bad("ALLREDUCE of another stage");
    if (in.paired) {
      // An F&B: the backward right after the forward, of another
      // (micro-batch, chunk), so that it needs nothing the forward makes.
      if (in.op != Op::Fwd)
        return bad("only a FWD pairs with a backward");
      const Instr *partner = pairedBackward(s.ranks[r], (size_t)i);
      if (!partner)
        return bad("paired, but the next instruction is no BWD or BWD_INPUT");
      if (partner->mb == in.mb && partner->chunk == in.chunk)
        return bad("paired with the backward of its own micro-batch and chunk, which needs its result");
    }
    return true;
  }

  // Per-rank, order-only checks: the dependency order and memory (RankPass).
  void rankPass(int r);

  // Every send has exactly one receive with the same message and vice versa.
  bool matching() {
    using Key = std::tuple<bool, int, int, int, int, int>; // grad, mb, vsRecv, src, dst, version
    std::map<Key, std::vector<std::pair<int, long>>> sends, recvs;
    for (int r = 0; r < R; ++r)
      for (long i = 0; i < (long)s.ranks[r].size(); ++i) {
        const Instr &in = s.ranks[r][i];
        if (!isP2P(in.op) || in.chunk < 0 || in.chunk >= P.chunks || in.peer < 0 || in.peer >= R)
          continue;
        const bool grad = in.op == Op::SendGrad || in.op == Op::RecvGrad;
        const bool send = in.op == Op::SendAct || in.op == Op::SendGrad;
        Key k{grad, in.mb, recvVs(r, in), send ? r : in.peer, send ? in.peer : r, in.version};
        (send ? sends : recvs)[k].push_back({r, i});
      }
    bool ok = true;
    auto cross = [&](auto &from, auto &to, const char *missing) {
      for (auto &[k, list] : from) {
        auto it = to.find(k);
        const size_t have = it == to.end() ? 0 : it->second.size();
        for (size_t j = have; j < list.size(); ++j) {
          error(list[j].first, list[j].second, missing);
          ok = false;
        }
      }
    };
    cross(sends, recvs, "send without a matching receive on the peer");
    cross(recvs, sends, "receive without a matching send on the peer");
    return ok;
  }

  // Blocking rendezvous: a send and its receive complete together; a
  // collective completes when all its members are at it.
  void deadlock() {
    std::vector<size_t> pc(R, 0);
    auto head = [&](int r) -> const Instr * { return pc[r] < s.ranks[r].size() ? &s.ranks[r][pc[r]] : nullptr; };
    auto complement = [](Op op) {
      switch (op) {
      case Op::SendAct: return Op::RecvAct;
      case Op::RecvAct: return Op::SendAct;
      case Op::SendGrad: return Op::RecvGrad;
      default:
        assert(op == Op::RecvGrad && "complement() is asked of point-to-point ops only");
        return Op::SendGrad;
      }
    };
    for (bool progress = true; progress;) {
      progress = false;
      for (int r = 0; r < R; ++r) {
        while (const Instr *in = head(r)) {
          if (isP2P(in->op)) {
            const Instr *o = head(in->peer);
            if (!o || o->op != complement(in->op) || o->peer != r || o->mb != in->mb || o->version != in->version ||
                recvVs(in->peer, *o) != recvVs(r, *in))
              break;
            pc[r]++, pc[in->peer]++;
          } else if (isCollective(in->op)) {
            std::vector<int> group;
            for (int q = 0; q < R; ++q)
              if (in->op == Op::Validate || P.stageOfRank(q) == in->peer)
                group.push_back(q);
            bool all = true;
            for (int q : group) {
              const Instr *o = head(q);
              all = all && o && o->op == in->op && o->peer == in->peer;
            }
            if (!all)
              break;
            for (int q : group)
              pc[q]++;
          } else {
            pc[r]++;
          }
          progress = true;
        }
      }
    }
    for (int r = 0; r < R; ++r)
      if (const Instr *in = head(r)) {
        std::string why = "deadlock under blocking send/receive";
        if (isP2P(in->op)) {
          const Instr *o = head(in->peer);
          why += o ? " (peer rank " + std::to_string(in->peer) + " waits at #" +
                         std::to_string(pc[in->peer]) + " " + toString(*o) + ")"
                   : " (peer rank " + std::to_string(in->peer) + " has finished)";
        }
        error(r, (long)pc[r], why);
      }
  }
};

// Checker::rankPass's state over one rank's instructions in order, one
// member per kind of instruction.
struct RankPass {
  Checker &checker;
  const Schedule &s;
  const Problem &P;
  const int V, m, r, stage;
  // Per (mb, vs): bit flags of what happened on this rank.
  enum : unsigned { F = 1, B = 2, W = 4, ActIn = 8, GradIn = 16, Restored = 32, Recomputed = 64 };
  const bool recomputes, vsync;
  // Vertical sync: the version this rank is at (micro-batches applied),
  // the version loaded for compute, the versions kept per micro-batch, and
  // each micro-batch's entry version (stage 0: at its FWD; else the tag
  // its RECV_ACT carried).
  const int R; // the stage's replicas
  int current = 0, loadedVersion = 0, peakVersions = 0;
  std::map<int, int> pinned; // mb -> version
  std::vector<int> entryVersion;
  std::vector<unsigned> st;
  std::vector<char> loaded;
  std::vector<int> stashed;
  double mem = 0;
  bool peakReported = false;
  int outstandingStash = 0, peakStash = 0;
  bool stepped = false, specStepped = false, validated = false;

  RankPass(Checker &owner, int rank)
      : checker(owner), s(owner.s), P(owner.P), V(owner.V), m(owner.m), r(rank), stage(P.stageOfRank(rank)),
        recomputes(P.recomputes(stage)), vsync(s.asynchronous && P.verticalSync), R(P.replicasOf(stage)),
        entryVersion(m, -1), st((size_t)m * V, 0), loaded(m, 0), stashed(m, 0) {}

  void error(int rank, long i, const std::string &msg) { checker.error(rank, i, msg); }
  unsigned &at(int mb, int vs) { return st[(size_t)mb * V + vs]; }
  void needLoaded(long i, const Instr &in, const char *what) {
    auto it = pinned.find(in.mb);
    if (it == pinned.end())
      error(r, i, std::string("vertical sync: ") + what + " of a micro-batch with no kept weight version");
    else if (loadedVersion != it->second)
      error(r, i, std::string("vertical sync: ") + what + " runs on version " + std::to_string(loadedVersion) +
                      ", the micro-batch's version is " + std::to_string(it->second));
  }

  void run() {
    const auto &instrs = s.ranks[r];
    for (long i = 0; i < (long)instrs.size(); ++i) {
      const Instr &in = instrs[i];
      if (!checker.structure(r, i, in))
        continue;
      const int vs = in.chunk >= 0 ? s.virtualStage(stage, in.chunk) : -1;
      const bool owned = vs < 0 || in.mb < 0 || s.rankFor(vs, in.mb) == r;
      if ((isCompute(in.op) || isP2P(in.op)) && !owned) {
        error(r, i, "micro-batch " + std::to_string(in.mb) + " of virtual stage " +
                        std::to_string(vs) + " belongs to rank " + std::to_string(s.rankFor(vs, in.mb)));
        continue;
      }
      if (!s.asynchronous && (stepped || specStepped) && (isCompute(in.op) || isP2P(in.op)))
        error(r, i, "work after the optimizer step of a synchronous schedule");
      const double a = in.chunk >= 0 ? P.activationOf(stage, in.chunk) : 0;
      switch (in.op) {
      case Op::Load: load(i, in); break;
      case Op::Fwd: forward(i, in, vs, a); break;
      case Op::Bwd:
      case Op::BwdInput: backward(i, in, vs, a); break;
      case Op::BwdWeight: weightGradient(i, in, vs, a); break;
      case Op::Recompute: recompute(i, in, vs, a); break;
      case Op::RecvAct:
      case Op::SendAct:
      case Op::RecvGrad:
      case Op::SendGrad: transfer(i, in, vs); break;
      case Op::Stash: stash(i, in); break;
      case Op::Restore: restore(i, in); break;
      case Op::AllReduce:
      case Op::Step:
      case Op::SpecStep: update(i, in); break;
      case Op::Validate:
        if (!specStepped)
          error(r, i, "VALIDATE without a preceding SPEC_STEP");
        validated = true;
        break;
      case Op::Rollback:
        if (!validated)
          error(r, i, "ROLLBACK without a preceding VALIDATE");
        break;
      }
      if (P.memoryLimit > 0 && mem > P.memoryLimit + 1e-9 && !peakReported) {
        peakReported = true;
        error(r, i, "activation memory " + std::to_string(mem) + " exceeds the limit " +
                        std::to_string(P.memoryLimit));
      }
    }
    completeness();
  }

  void load(long i, const Instr &in) {
    if (s.rankFor(0, in.mb) != r)
      error(r, i, "this rank does not run the first virtual stage of the micro-batch");
    else if (loaded[in.mb]++)
      error(r, i, "micro-batch loaded twice");
  }

  void forward(long i, const Instr &in, int vs, double a) {
    unsigned &x = at(in.mb, vs);
    if (x & F)
      error(r, i, "forward runs twice");
    const bool haveInput = vs == 0 ? loaded[in.mb] != 0
                           : s.rankFor(vs - 1, in.mb) == r ? (at(in.mb, vs - 1) & F) != 0
                                                           : (x & ActIn) != 0;
    if (!haveInput)
      error(r, i, vs == 0 ? "forward before LOAD" : "forward before its input activation arrived");
    if (vsync) {
      needLoaded(i, in, "FWD");
      if (vs == 0)
        entryVersion[in.mb] = loadedVersion;
      if (vs == 0 && loadedVersion != current)
        error(r, i, "vertical sync: the first stage must forward with its current version " +
                        std::to_string(current));
      if (vs > 0 && entryVersion[in.mb] >= 0 && loadedVersion != R * (entryVersion[in.mb] / R))
        error(r, i, "vertical sync: forward on version " + std::to_string(loadedVersion) + ", the entry version " +
                        std::to_string(entryVersion[in.mb]) + " requires " +
                        std::to_string(R * (entryVersion[in.mb] / R)));
    }
    x |= F;
    mem += recomputes ? P.restingActivationOf(stage, in.chunk) : a;
  }

  void backward(long i, const Instr &in, int vs, double a) {
    unsigned &x = at(in.mb, vs);
    if (!(x & F))
      error(r, i, "backward before the forward of the same micro-batch and chunk");
    if (x & B)
      error(r, i, "backward runs twice");
    if (vs + 1 < V) {
      const bool haveGrad = s.rankFor(vs + 1, in.mb) == r ? (at(in.mb, vs + 1) & B) != 0
                                                          : (x & GradIn) != 0;
      if (!haveGrad)
        error(r, i, "backward before its output gradient arrived");
    }
    if (recomputes && !(x & Recomputed))
      error(r, i, "backward without RECOMPUTE on a stage that recomputes");
    if (vsync)
      needLoaded(i, in, "backward");
    else if (s.asynchronous && !(x & Restored))
      error(r, i, "asynchronous backward without RESTORE of the stashed weights");
    if (vsync)
      pinned.erase(in.mb); // the backward releases the kept version
    x |= B;
    if (in.op == Op::Bwd) {
      if (x & W)
        error(r, i, "weight gradient computed twice");
      x |= W;
      mem -= a;
    } else {
      mem -= a * (1 - P.wMemFrac);
    }
  }

  void weightGradient(long i, const Instr &in, int vs, double a) {
    unsigned &x = at(in.mb, vs);
    if (!(x & B))
      error(r, i, "BWD_WEIGHT before BWD_INPUT of the same micro-batch and chunk");
    if (x & W)
      error(r, i, "weight gradient computed twice");
    x |= W;
    mem -= a * P.wMemFrac;
  }

  void recompute(long i, const Instr &in, int vs, double a) {
    unsigned &x = at(in.mb, vs);
    if (!recomputes)
      error(r, i, "RECOMPUTE on a stage that does not recompute");
    else if (!(x & F) || (x & B))
      error(r, i, "RECOMPUTE must lie between the forward and the backward");
    else if (x & Recomputed)
      error(r, i, "RECOMPUTE runs twice");
    else {
      x |= Recomputed;
      mem += a - P.restingActivationOf(stage, in.chunk);
    }
    if (vsync)
      needLoaded(i, in, "RECOMPUTE");
    else if (s.asynchronous && !(x & Restored))
      error(r, i, "asynchronous RECOMPUTE without RESTORE of the stashed weights");
  }

  // RECV_ACT, SEND_ACT, RECV_GRAD, SEND_GRAD.
  void transfer(long i, const Instr &in, int vs) {
    const bool act = in.op == Op::RecvAct || in.op == Op::SendAct;
    const bool send = in.op == Op::SendAct || in.op == Op::SendGrad;
    const int other = act ? (send ? vs + 1 : vs - 1) : (send ? vs - 1 : vs + 1);
    if (other < 0 || other >= V) {
      error(r, i, "no virtual stage on the other side");
      return;
    }
    if (s.rankFor(other, in.mb) != in.peer) {
      error(r, i, "peer should be rank " + std::to_string(s.rankFor(other, in.mb)));
      return;
    }
    unsigned &x = at(in.mb, vs);
    if (send && !(x & (act ? F : B)))
      error(r, i, act ? "activation sent before the forward produced it"
                      : "gradient sent before the backward produced it");
    if (vsync && act) {
      if (in.version < 0)
        error(r, i, "vertical sync: activation without its entry version");
      else if (send && entryVersion[in.mb] >= 0 && in.version != entryVersion[in.mb])
        error(r, i, "vertical sync: sends entry version " + std::to_string(in.version) + ", the micro-batch entered at " +
                        std::to_string(entryVersion[in.mb]));
      else if (!send)
        entryVersion[in.mb] = in.version;
    }
    if (!send) {
      const unsigned flag = act ? ActIn : GradIn;
      if (x & flag)
        error(r, i, "received twice");
      x |= flag;
    }
  }

  void stash(long i, const Instr &in) {
    if (vsync) {
      if (in.version != current)
        error(r, i, "vertical sync: STASH of version " + std::to_string(in.version) +
                        " while the rank is at version " + std::to_string(current));
      else if (pinned.count(in.mb))
        error(r, i, "vertical sync: micro-batch already keeps a version");
      else
        pinned[in.mb] = in.version;
      std::vector<int> versions;
      for (auto &kv : pinned)
        versions.push_back(kv.second);
      std::sort(versions.begin(), versions.end());
      peakVersions = std::max(peakVersions, (int)(std::unique(versions.begin(), versions.end()) - versions.begin()));
      return;
    }
    stashed[in.mb]++;
    peakStash = std::max(peakStash, ++outstandingStash);
  }

  void restore(long i, const Instr &in) {
    if (vsync) {
      auto it = pinned.find(in.mb);
      if (it == pinned.end() || it->second != in.version)
        error(r, i, "vertical sync: RESTORE of a version not kept for the micro-batch");
      else
        loadedVersion = in.version;
      return;
    }
    if (stashed[in.mb] <= 0) {
      error(r, i, "RESTORE without a STASH of the micro-batch");
      return;
    }
    stashed[in.mb]--;
    outstandingStash--;
    for (int c = 0; c < P.chunks; ++c)
      at(in.mb, s.virtualStage(stage, c)) |= Restored;
  }

  // ALLREDUCE, STEP, SPEC_STEP.
  void update(long i, const Instr &in) {
    if (!s.asynchronous)
      for (int mb = 0; mb < m; ++mb)
        for (int c = 0; c < P.chunks; ++c) {
          const int v2 = s.virtualStage(stage, c);
          if (s.rankFor(v2, mb) == r && (at(mb, v2) & W) != W)
            error(r, i, "synchronous update before the backward of micro-batch " +
                            std::to_string(mb) + " chunk " + std::to_string(c));
        }
    if (in.op == Op::Step) {
      stepped = true;
      current += R;
      loadedVersion = current;
    }
    if (in.op == Op::SpecStep)
      specStepped = true;
  }

  // Completeness: everything this rank owns ran; and the steps and stashes at the end.
  void completeness() {
    for (int mb = 0; mb < m; ++mb)
      for (int c = 0; c < P.chunks; ++c) {
        const int vs = s.virtualStage(stage, c);
        if (s.rankFor(vs, mb) != r)
          continue;
        const unsigned x = at(mb, vs);
        const std::string what = "micro-batch " + std::to_string(mb) + " chunk " + std::to_string(c);
        if (!(x & F))
          error(r, -1, "missing forward of " + what);
        else if (!(x & B))
          error(r, -1, "missing backward of " + what);
        else if (!(x & W))
          error(r, -1, "missing weight gradient of " + what);
        if (vs == 0 && !loaded[mb])
          error(r, -1, "missing LOAD of micro-batch " + std::to_string(mb));
      }
    if (!s.asynchronous && !stepped && !specStepped)
      error(r, -1, "synchronous schedule without an optimizer step");
    if (specStepped && !validated)
      error(r, -1, "speculative step never validated");
    if (vsync && !pinned.empty())
      error(r, -1, std::to_string(pinned.size()) + " kept weight versions never released");
    if (vsync)
      peakStash = peakVersions;
    if (s.asynchronous && outstandingStash != 0)
      error(r, -1, std::to_string(outstandingStash) + " stashed weight versions never restored");
    if (s.asynchronous && P.inFlight > 0 && peakStash > P.inFlight)
      error(r, -1, "holds " + std::to_string(peakStash) + " stashed weight versions, more than the in-flight count " +
                       std::to_string(P.inFlight));
  }
};

void Checker::rankPass(int r) { RankPass(*this, r).run(); }
} // namespace

ValidationReport validate(const Schedule &schedule) {
  Checker c(schedule);
  try {
    schedule.problem.check();
  } catch (const ScheduleError &e) {
    c.rep.errors.push_back(e.what());
    return c.rep;
  }
  if ((int)schedule.ranks.size() != c.R) {
    c.rep.errors.push_back("schedule has " + std::to_string(schedule.ranks.size()) +
                           " ranks; the problem needs " + std::to_string(c.R));
    return c.rep;
  }
  if (schedule.placement == Placement::VShape && schedule.problem.chunks != 2) {
    c.rep.errors.push_back("V placement needs exactly two chunks");
    return c.rep;
  }
  for (int r = 0; r < c.R; ++r)
    c.rankPass(r);
  if (c.matching())
    c.deadlock();
  return c.rep;
}

} // namespace pipec::schedule
