#include "Plan.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace pipec::rt {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {
json readJson(const std::string &path) {
  std::ifstream in(path);
  if (!in) throw Error(path + ": cannot open");
  try {
    return json::parse(in);
  } catch (const json::exception &e) {
    throw Error(path + ": not valid JSON: " + e.what());
  }
}

// Typed member access with errors that name the file and the JSON path.
struct Reader {
  std::string file;
  template <class T> T get(const json &j, const char *key, const std::string &where) const {
    if (!j.is_object() || !j.contains(key)) throw Error(file + ": missing member " + where + "." + key);
    try {
      return j.at(key).get<T>();
    } catch (const json::exception &) {
      throw Error(file + ": member " + where + "." + key + " has the wrong type (" + j.at(key).dump() + ")");
    }
  }
  template <class T> T opt(const json &j, const char *key, const std::string &where, T dflt) const {
    if (!j.is_object() || !j.contains(key) || j.at(key).is_null()) return dflt;
    return get<T>(j, key, where);
  }
};

std::string resolve(const std::string &dir, const std::string &p) {
  return fs::path(p).is_absolute() ? p : (fs::path(dir) / p).lexically_normal().string();
}
} // namespace

int Plan::numRanks() const {
  int n = 0;
  for (const auto &r : ranks) n += (int)r.size();
  return n;
}
int Plan::scheduleRank(int stage, int replica) const {
  int r = 0;
  for (int s = 0; s < stage; ++s) r += replicasOf(s);
  return r + replica;
}
int Plan::stageOfScheduleRank(int r) const {
  for (int s = 0; s < stages; ++s) {
    if (r < replicasOf(s)) return s;
    r -= replicasOf(s);
  }
  return -1;
}
int Plan::replicaOfScheduleRank(int r) const { return r - scheduleRank(stageOfScheduleRank(r), 0); }
int Plan::mpiRankOf(int r) const {
  const int s = stageOfScheduleRank(r);
  return s < 0 ? -1 : ranks[s][replicaOfScheduleRank(r)];
}
int Plan::virtualStage(int stage, int chunk) const {
  if (vPlacement) return chunk == 0 ? stage : 2 * stages - 1 - stage;
  return chunk * stages + stage;
}
std::string Plan::scheduleFile(int r) const {
  return (fs::path(dir) / "schedule" / ("rank_" + std::to_string(r) + ".json")).string();
}

Plan loadPlan(const std::string &dirIn) {
  Plan p;
  p.dir = dirIn;
  p.planPath = (fs::path(dirIn) / "plan.json").string();
  if (!fs::is_directory(dirIn)) throw Error(dirIn + ": plan directory does not exist");
  const json j = readJson(p.planPath);
  const Reader R{p.planPath};
  if (!j.contains("runtime"))
    throw Error(p.planPath + ": no \"runtime\" member (the plan was not compiled for piperun; see docs/runtime.md)");
  const json &rt = j.at("runtime");
  if (R.get<std::string>(rt, "format", "runtime") != "pipec.runtime/1")
    throw Error(p.planPath + ": runtime.format must be \"pipec.runtime/1\"");
  p.schedule = R.get<std::string>(rt, "schedule", "runtime");
  p.microbatchSize = R.get<int>(rt, "microbatch_size", "runtime");
  p.microbatches = R.get<int>(rt, "microbatches", "runtime");
  p.chunks = R.opt<int>(rt, "chunks", "runtime", 1);
  const std::string placement = R.opt<std::string>(rt, "placement", "runtime", "interleaved");
  if (placement != "interleaved" && placement != "v")
    throw Error(p.planPath + ": runtime.placement must be \"interleaved\" or \"v\"");
  p.vPlacement = placement == "v";
  p.asynchronous = R.opt<bool>(rt, "asynchronous", "runtime", false);
  p.seed = R.opt<uint64_t>(rt, "seed", "runtime", 0);
  if (p.microbatchSize < 1 || p.microbatches < 1 || p.chunks < 1)
    throw Error(p.planPath + ": runtime.microbatch_size, microbatches and chunks must be >= 1");
  if (p.vPlacement && p.chunks != 2) throw Error(p.planPath + ": runtime.placement \"v\" needs chunks = 2");
  p.target = R.opt<std::string>(rt, "target", "runtime", "cpu");
  if (p.target != "cpu" && p.target != "cuda")
    throw Error(p.planPath + ": runtime.target must be \"cpu\" or \"cuda\", is \"" + p.target + "\"");
  p.precision = R.opt<std::string>(rt, "precision", "runtime", "fp32");
  if (p.precision.empty()) throw Error(p.planPath + ": runtime.precision is empty");
  p.cudaArch = R.opt<std::vector<std::string>>(rt, "cuda_arch", "runtime", {});
  for (const std::string &a : p.cudaArch) {
    size_t k = 3;
    while (k < a.size() && std::isdigit((unsigned char)a[k])) ++k;
    if (a.compare(0, 3, "sm_") != 0 || k < 5 || (k < a.size() && !(k + 1 == a.size() && std::isalpha((unsigned char)a[k]))))
      throw Error(p.planPath + ": runtime.cuda_arch: \"" + a + "\" is not an architecture like sm_80 or sm_90");
  }
  p.gpu = R.opt<std::string>(rt, "gpu", "runtime", "");

  // Pipeline stages and their ranks come from the partition part of the plan.
  const json &stages = j.contains("stages") ? j.at("stages") : json();
  if (!stages.is_array() || stages.empty()) throw Error(p.planPath + ": missing or empty member stages");
  p.stages = (int)stages.size();
  std::vector<int> seen;
  for (int s = 0; s < p.stages; ++s) {
    const std::string where = "stages[" + std::to_string(s) + "]";
    auto ranks = R.get<std::vector<int>>(stages[s], "ranks", where);
    if (ranks.empty()) throw Error(p.planPath + ": " + where + ".ranks is empty");
    for (int r : ranks) {
      if (r < 0) throw Error(p.planPath + ": " + where + ".ranks has a negative rank");
      for (int q : seen)
        if (q == r) throw Error(p.planPath + ": rank " + std::to_string(r) + " appears in two stages' ranks");
      seen.push_back(r);
    }
    p.ranks.push_back(ranks);
  }
  std::sort(seen.begin(), seen.end());
  for (int i = 0; i < (int)seen.size(); ++i)
    if (seen[i] != i)
      throw Error(p.planPath + ": stages[].ranks must cover ranks 0.." + std::to_string(seen.size() - 1) +
                  " exactly (rank " + std::to_string(i) + " is missing)");

  const json &vs = rt.contains("stages") ? rt.at("stages") : json();
  const int V = p.stages * p.chunks;
  if (!vs.is_array() || (int)vs.size() != V)
    throw Error(p.planPath + ": runtime.stages must list " + std::to_string(V) +
                " virtual stages (stages x chunks), found " + std::to_string(vs.is_array() ? vs.size() : 0));
  p.vstages.resize(V);
  std::vector<bool> have(V, false);
  for (size_t i = 0; i < vs.size(); ++i) {
    const std::string where = "runtime.stages[" + std::to_string(i) + "]";
    VirtualStage v;
    v.id = R.get<int>(vs[i], "id", where);
    if (v.id < 0 || v.id >= V || have[v.id])
      throw Error(p.planPath + ": " + where + ".id " + std::to_string(v.id) + " is out of range or repeated");
    have[v.id] = true;
    v.library = resolve(p.dir, R.get<std::string>(vs[i], "library", where));
    v.weights = resolve(p.dir, R.get<std::string>(vs[i], "weights", where));
    for (int s = 0; s < p.stages; ++s)
      for (int c = 0; c < p.chunks; ++c)
        if (p.virtualStage(s, c) == v.id) v.stage = s, v.chunk = c;
    p.vstages[v.id] = v;
  }

  const json opt = rt.contains("optimizer") ? rt.at("optimizer") : json();
  const std::string ow = "runtime.optimizer";
  p.optimizer.name = R.get<std::string>(opt, "name", ow);
  if (p.optimizer.name != "sgd" && p.optimizer.name != "adamw")
    throw Error(p.planPath + ": runtime.optimizer.name must be \"sgd\" or \"adamw\"");
  p.optimizer.lr = R.get<float>(opt, "lr", ow);
  p.optimizer.weightDecay = R.opt<float>(opt, "weight_decay", ow, 0.0f);
  p.optimizer.momentum = R.opt<float>(opt, "momentum", ow, 0.0f);
  p.optimizer.beta1 = R.opt<float>(opt, "beta1", ow, 0.9f);
  p.optimizer.beta2 = R.opt<float>(opt, "beta2", ow, 0.999f);
  p.optimizer.epsilon = R.opt<float>(opt, "epsilon", ow, 1e-8f);
  p.optimizer.maxGradNorm = R.opt<float>(opt, "max_grad_norm", ow, 0.0f);

  // Tied parameters: [{"name": "wte.weight", "stages": [0, 3]}, ...]
  const json tied = rt.contains("tied") && !rt.at("tied").is_null() ? rt.at("tied") : json::array();
  if (!tied.is_array()) throw Error(p.planPath + ": runtime.tied must be an array");
  for (size_t i = 0; i < tied.size(); ++i) {
    const std::string where = "runtime.tied[" + std::to_string(i) + "]";
    TiedParam t;
    t.name = R.get<std::string>(tied[i], "name", where);
    t.stages = R.get<std::vector<int>>(tied[i], "stages", where);
    if (t.name.empty()) throw Error(p.planPath + ": " + where + ".name is empty");
    std::sort(t.stages.begin(), t.stages.end());
    if (t.stages.size() < 2 || std::adjacent_find(t.stages.begin(), t.stages.end()) != t.stages.end())
      throw Error(p.planPath + ": " + where + ".stages must list at least two different stages");
    for (int s : t.stages)
      if (s < 0 || s >= V)
        throw Error(p.planPath + ": " + where + ".stages: stage " + std::to_string(s) + " is not a virtual stage (0.." +
                    std::to_string(V - 1) + ")");
    for (const TiedParam &o : p.tied)
      if (o.name == t.name) throw Error(p.planPath + ": " + where + ": parameter " + t.name + " is listed twice");
    p.tied.push_back(t);
  }

  const json data = rt.contains("data") ? rt.at("data") : json();
  p.syntheticSamples = R.opt<uint64_t>(data, "synthetic_samples", "runtime.data",
                                       (uint64_t)p.microbatchSize * p.microbatches * 16);
  const json fields = data.contains("fields") ? data.at("fields") : json::array();
  for (size_t i = 0; i < fields.size(); ++i) {
    const std::string where = "runtime.data.fields[" + std::to_string(i) + "]";
    io::FieldSpec f;
    f.name = R.get<std::string>(fields[i], "name", where);
    const std::string dt = R.get<std::string>(fields[i], "dtype", where);
    f.dtype = io::dtypeFromName(dt);
    if (!f.dtype) throw Error(p.planPath + ": " + where + ".dtype \"" + dt + "\" is not f32, f64, i64, i32 or bool");
    f.shape = R.get<std::vector<int64_t>>(fields[i], "shape", where);
    const bool isFloat = f.dtype == PIPEC_F32 || f.dtype == PIPEC_F64;
    f.low = R.opt<double>(fields[i], "low", where, isFloat ? -1.0 : 0.0);
    f.high = R.opt<double>(fields[i], "high", where, isFloat ? 1.0 : 2.0);
    if (!(f.high > f.low)) throw Error(p.planPath + ": " + where + ": high must be > low");
    p.dataFields.push_back(f);
  }
  return p;
}

// ---------------------------------------------------------------- streams
namespace {
struct OpName {
  Op op;
  const char *name;
};
constexpr OpName kOps[] = {
    {Op::Load, "LOAD"},         {Op::Fwd, "FWD"},           {Op::Bwd, "BWD"},
    {Op::BwdInput, "BWD_INPUT"}, {Op::BwdWeight, "BWD_WEIGHT"}, {Op::Recompute, "RECOMPUTE"},
    {Op::SendAct, "SEND_ACT"},  {Op::RecvAct, "RECV_ACT"},  {Op::SendGrad, "SEND_GRAD"},
    {Op::RecvGrad, "RECV_GRAD"}, {Op::Stash, "STASH"},       {Op::Restore, "RESTORE"},
    {Op::AllReduce, "ALLREDUCE"}, {Op::Step, "STEP"},        {Op::SpecStep, "SPEC_STEP"},
    {Op::Validate, "VALIDATE"}, {Op::Rollback, "ROLLBACK"},
};
} // namespace

const char *opName(Op op) { return kOps[(int)op].name; }

std::string toString(const Instr &in) {
  std::string s = opName(in.op);
  if (in.mb >= 0) s += " mb=" + std::to_string(in.mb);
  if (in.chunk >= 0) s += " chunk=" + std::to_string(in.chunk);
  if (in.peer >= 0) s += (in.op == Op::AllReduce ? " stage=" : " peer=") + std::to_string(in.peer);
  if (in.version >= 0) s += " version=" + std::to_string(in.version);
  return s;
}

RankStream loadRankStream(const std::string &path) {
  const json j = readJson(path);
  const Reader R{path};
  RankStream rs;
  rs.path = path;
  if (R.get<std::string>(j, "format", "") != "pipec.schedule.rank/1")
    throw Error(path + ": format must be \"pipec.schedule.rank/1\"");
  rs.schedule = R.get<std::string>(j, "schedule", "");
  rs.rank = R.get<int>(j, "rank", "");
  rs.stage = R.get<int>(j, "stage", "");
  rs.replica = R.get<int>(j, "replica", "");
  rs.chunks = R.opt<int>(j, "chunks", "", 1);
  rs.placement = R.opt<std::string>(j, "placement", "", "interleaved");
  rs.asynchronous = R.opt<bool>(j, "asynchronous", "", false);
  const json &list = j.contains("instructions") ? j.at("instructions") : json();
  if (!list.is_array()) throw Error(path + ": missing member instructions");
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string where = "instructions[" + std::to_string(i) + "]";
    const std::string name = R.get<std::string>(list[i], "op", where);
    Instr in;
    bool known = false;
    for (const auto &o : kOps)
      if (name == o.name) in.op = o.op, known = true;
    if (!known) throw Error(path + ": " + where + ": unknown instruction \"" + name + "\"");
    in.mb = R.opt<int>(list[i], "mb", where, -1);
    in.chunk = R.opt<int>(list[i], "chunk", where, -1);
    in.peer = R.opt<int>(list[i], in.op == Op::AllReduce ? "stage" : "peer", where, -1);
    in.version = R.opt<int>(list[i], "version", where, -1);
    rs.instrs.push_back(in);
  }
  return rs;
}

// ---------------------------------------------------------------- transfer order
std::vector<Transfer> transfersOf(const RankStream &s) {
  std::vector<Transfer> t;
  for (size_t i = 0; i < s.instrs.size(); ++i) {
    const Instr &in = s.instrs[i];
    if (in.op == Op::SendAct || in.op == Op::SendGrad || in.op == Op::RecvAct || in.op == Op::RecvGrad)
      t.push_back({in.op, in.mb, in.chunk, in.peer, (int)i});
  }
  return t;
}

std::string checkTransferOrder(const Plan &plan, const std::vector<std::vector<Transfer>> &transfers,
                               const std::vector<std::string> &paths, int receiver) {
  const int R = (int)transfers.size();
  auto isSend = [](Op op) { return op == Op::SendAct || op == Op::SendGrad; };
  auto isGrad = [](Op op) { return op == Op::SendGrad || op == Op::RecvGrad; };
  // The bundle a transfer moves: (gradient?, micro-batch, receiving virtual stage).
  auto key = [&](int rank, const Transfer &t) {
    const int vs = plan.virtualStage(plan.stageOfScheduleRank(rank), t.chunk);
    const int dest = isSend(t.op) ? (isGrad(t.op) ? vs - 1 : vs + 1) : vs;
    return std::make_tuple(isGrad(t.op), t.mb, dest);
  };
  auto describe = [&](int rank, const Transfer &t) {
    const auto [grad, mb, dest] = key(rank, t);
    Instr in;
    in.op = t.op, in.mb = t.mb, in.chunk = t.chunk, in.peer = t.peer;
    return std::string(grad ? "the gradient" : "the activation") + " of micro-batch " + std::to_string(mb) +
           " for virtual stage " + std::to_string(dest) + " (#" + std::to_string(t.index) + " " + toString(in) + ")";
  };
  auto name = [&](int r) {
    const int mpi = plan.mpiRankOf(r);
    return "rank " + std::to_string(r) + (mpi != r ? " (MPI rank " + std::to_string(mpi) + ")" : "");
  };
  auto fileOf = [&](int r) { return r < (int)paths.size() ? paths[r] : "schedule rank " + std::to_string(r); };
  for (int to = 0; to < R; ++to) {
    if (receiver >= 0 && to != receiver) continue;
    for (int from = 0; from < R; ++from) {
      if (from == to) continue;
      std::vector<const Transfer *> sends, recvs;
      for (const Transfer &t : transfers[from])
        if (isSend(t.op) && t.peer == to) sends.push_back(&t);
      for (const Transfer &t : transfers[to])
        if (!isSend(t.op) && t.peer == from) recvs.push_back(&t);
      const std::string pair = "transfers from " + name(from) + " to " + name(to) + " (" + fileOf(from) + " -> " +
                               fileOf(to) + ")";
      const std::string why = "; NCCL matches the transfers between two ranks by order, so the ranks would deadlock "
                              "or exchange the wrong bundles";
      const size_t n = std::min(sends.size(), recvs.size());
      for (size_t k = 0; k < n; ++k)
        if (key(from, *sends[k]) != key(to, *recvs[k]))
          return pair + " are out of order: transfer " + std::to_string(k + 1) + " is " + describe(from, *sends[k]) +
                 " on the sender but " + describe(to, *recvs[k]) + " on the receiver" + why;
      if (sends.size() != recvs.size())
        return pair + " do not match: the sender sends " + std::to_string(sends.size()) + " bundles per iteration, the receiver receives " +
               std::to_string(recvs.size()) + "; the first unmatched is " +
               (sends.size() > n ? describe(from, *sends[n]) + " on the sender" : describe(to, *recvs[n]) + " on the receiver") + why;
    }
  }
  return "";
}

} // namespace pipec::rt
