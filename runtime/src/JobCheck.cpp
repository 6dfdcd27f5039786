#include "JobCheck.h"

#include "pipec/decimal.h"
#include "pipec/input_file.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <charconv>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>

namespace pipec::rt {
using nlohmann::json;

// ---------------------------------------------------------------- hashing
namespace {
constexpr uint64_t kFnvOffset = 1469598103934665603ULL, kFnvPrime = 1099511628211ULL;

uint64_t mix(uint64_t h) { // splitmix64's finalizer
  h ^= h >> 30, h *= 0xbf58476d1ce4e5b9ULL;
  h ^= h >> 27, h *= 0x94d049bb133111ebULL;
  return h ^ (h >> 31);
}

std::string hex(uint64_t v) {
  char b[17];
  std::snprintf(b, sizeof b, "%016llx", (unsigned long long)v);
  return b;
}
} // namespace

uint64_t hashBytes(const void *data, size_t n, uint64_t seed) {
  const unsigned char *p = static_cast<const unsigned char *>(data);
  uint64_t h[4];
  for (int k = 0; k < 4; ++k) h[k] = (kFnvOffset ^ mix(seed + (uint64_t)k)) * kFnvPrime;
  size_t i = 0;
  for (; i + 32 <= n; i += 32)
    for (int k = 0; k < 4; ++k) {
      uint64_t w;
      std::memcpy(&w, p + i + 8 * k, 8);
      h[k] = (h[k] ^ w) * kFnvPrime;
      h[k] ^= h[k] >> 29; // carry the high bits down (FNV over words alone mixes upwards only)
    }
  uint64_t r = kFnvOffset ^ seed;
  for (int k = 0; k < 4; ++k) r = (r ^ mix(h[k])) * kFnvPrime;
  for (; i < n; ++i) r = (r ^ p[i]) * kFnvPrime;
  return mix(r ^ (uint64_t)n);
}

std::string FileDigest::text() const {
  return std::to_string(bytes) + " bytes, digest " + hex(hash) + (sampled ? " (sampled)" : "");
}

FileDigest digestFile(const std::string &path, const char *what) {
  io::InputFile f(path, what, io::kMaxTensorFileBytes);
  FileDigest d;
  d.bytes = f.size();
  std::string buf;
  auto part = [&](uint64_t offset, uint64_t n) {
    buf.resize((size_t)n);
    f.readAt(offset, buf.data(), n, what);
    d.hash = hashBytes(buf.data(), buf.size(), d.hash ^ offset);
  };
  constexpr uint64_t kChunk = 16ull << 20;
  if (d.bytes <= kDigestWholeBytes) {
    for (uint64_t o = 0; o < d.bytes; o += kChunk) part(o, std::min(kChunk, d.bytes - o));
  } else {
    d.sampled = true;
    constexpr uint64_t kEnd = 4ull << 20, kBlock = 64ull << 10, kBlocks = 64;
    part(0, kEnd);
    const uint64_t span = d.bytes - 2 * kEnd - kBlock; // > 0: bytes > 64 MiB
    for (uint64_t b = 0; b < kBlocks; ++b) part(kEnd + span / (kBlocks - 1) * b, kBlock);
    part(d.bytes - kEnd, kEnd);
  }
  d.hash = mix(d.hash ^ d.bytes);
  return d;
}

// ---------------------------------------------------------------- hyper-parameters
namespace {
template <typename T> std::string shortest(T v) {
  char b[64];
  auto [end, ec] = std::to_chars(b, b + sizeof b, v);
  return ec == std::errc() ? std::string(b, end) : std::string("?");
}
} // namespace

std::string shortestText(float v) { return shortest(v); }
std::string shortestText(double v) { return shortest(v); }

namespace {

// Range of one optimizer value: [lo, hi) or [lo, hi], lo excluded when `openLo`.
struct Range {
  const char *member, *option;
  double lo, hi;
  bool openLo, openHi;
  const char *meaning;
};
constexpr Range kRanges[] = {
    {"lr", "--lr", 0, INFINITY, false, true, "a finite learning rate >= 0"},
    {"weight_decay", "--weight-decay", 0, INFINITY, false, true, "a finite weight decay >= 0"},
    {"momentum", "--momentum", 0, 1, false, true, "a momentum in [0, 1)"},
    {"beta1", nullptr, 0, 1, false, true, "a value in [0, 1)"},
    {"beta2", nullptr, 0, 1, false, true, "a value in [0, 1)"},
    {"epsilon", nullptr, 0, INFINITY, true, true, "a finite value > 0"},
    {"max_grad_norm", "--max-grad-norm", 0, INFINITY, false, true,
     "a finite gradient norm > 0 (or 0: no clipping)"},
};

bool inRange(const Range &r, double v) {
  if (!std::isfinite(v)) return false;
  if (r.openLo ? v <= r.lo : v < r.lo) return false;
  return r.openHi ? v < r.hi : v <= r.hi;
}
} // namespace

OptimizerConfig resolveOptimizer(const Plan &plan, const OptimizerOverrides &o) {
  // plan.json's values as written (a float would have turned 1e39 into inf).
  const plan::Optimizer &written = plan.optimizerAsWritten;
  OptimizerConfig c = plan.optimizer;
  float *fields[] = {&c.lr, &c.weightDecay, &c.momentum, &c.beta1, &c.beta2, &c.epsilon, &c.maxGradNorm};
  const double values[] = {written.lr,   written.weightDecay, written.momentum,
                           written.beta1, written.beta2,      written.epsilon, written.maxGradNorm.value_or(0.0)};
  const std::optional<double> overrides[] = {o.lr, o.weightDecay, o.momentum, std::nullopt, std::nullopt,
                                             std::nullopt, o.maxGradNorm};
  for (size_t k = 0; k < std::size(kRanges); ++k) {
    const Range &r = kRanges[k];
    double v = values[k];
    std::string source = plan.planPath + ": runtime.optimizer." + r.member;
    if (overrides[k]) v = *overrides[k], source = r.option;
    if (!inRange(r, v)) throw Error(source + " is " + shortestText(v) + "; it must be " + r.meaning);
    if (std::fabs(v) > (double)std::numeric_limits<float>::max())
      throw Error(source + " is " + shortestText(v) + ", beyond the range of a float");
    *fields[k] = (float)v;
  }
  return c;
}

int64_t parseCount(const std::string &option, const std::string &text, int64_t lo, int64_t hi) {
  // Integers, also written as 1e3; the whole text must be the number.
  char *end = nullptr;
  errno = 0;
  const double d = std::strtod(text.c_str(), &end);
  if (text.empty() || *end || std::isspace((unsigned char)text[0]))
    throw Error(option + ": \"" + text + "\" is not a number");
  if (!std::isfinite(d) || d != std::floor(d) || d < (double)lo || d > (double)hi)
    throw Error(option + ": \"" + text + "\" is out of range: needs an integer in " + std::to_string(lo) + " .. " +
                std::to_string(hi));
  return (int64_t)d;
}

uint64_t parseSeed(const std::string &option, const std::string &text) {
  const std::optional<uint64_t> seed = parseDecimalUint64(text);
  if (!seed)
    throw Error(option + ": \"" + text + "\" is not a seed: needs a decimal integer in [0, 2^64)");
  return *seed;
}

double parseReal(const std::string &option, const std::string &text) {
  char *end = nullptr;
  const double d = std::strtod(text.c_str(), &end);
  if (text.empty() || *end || std::isspace((unsigned char)text[0]))
    throw Error(option + ": \"" + text + "\" is not a number");
  return d;
}

// ---------------------------------------------------------------- deadlock
std::string findTransferDeadlock(const Plan &plan, const std::vector<std::vector<Transfer>> &transfers,
                                 const std::vector<std::string> &paths) {
  const int R = (int)transfers.size();
  std::vector<size_t> pc(R, 0);
  std::map<std::pair<int, int>, int64_t> posted, received; // (sender, receiver) schedule ranks
  auto isSend = [](Op op) { return op == Op::SendAct || op == Op::SendGrad; };
  for (bool progress = true; progress;) {
    progress = false;
    for (int r = 0; r < R; ++r)
      for (; pc[r] < transfers[r].size(); ++pc[r], progress = true) {
        const Transfer &t = transfers[r][pc[r]];
        if (t.peer < 0 || t.peer >= R) return ""; // out of range: reported elsewhere
        if (isSend(t.op)) {
          ++posted[{r, t.peer}];
        } else {
          int64_t &got = received[{t.peer, r}];
          if (posted[{t.peer, r}] <= got) break; // blocked
          ++got;
        }
      }
  }
  int start = -1;
  for (int r = 0; r < R && start < 0; ++r)
    if (pc[r] < transfers[r].size()) start = r;
  if (start < 0) return "";
  // Follow who waits for whom from the first blocked rank until a rank repeats.
  auto name = [&](int r) {
    return "rank " + std::to_string(plan.mpiRankOf(r)) + " (stage " + std::to_string(plan.stageOfScheduleRank(r)) +
           ", replica " + std::to_string(plan.replicaOfScheduleRank(r)) + ")";
  };
  std::vector<bool> seen(R, false);
  std::string chain;
  for (int r = start; r >= 0 && r < R && !seen[r];) {
    seen[r] = true;
    if (pc[r] >= transfers[r].size()) break;
    const Transfer &t = transfers[r][pc[r]];
    Instr in;
    in.op = t.op, in.mb = t.mb, in.chunk = t.chunk, in.peer = t.peer;
    chain += std::string(chain.empty() ? "" : "; ") + name(r) + " waits in " + (r < (int)paths.size() ? paths[r] : "") +
             " #" + std::to_string(t.index) + " " + toString(in) + " for " + name(t.peer);
    r = t.peer;
  }
  return "the schedule deadlocks (every receive blocks until its message was sent): " + chain +
         "; each message is sent only after the receive that waits for it";
}

// ---------------------------------------------------------------- job identity
void addFile(JobIdentity &id, const std::string &name, const std::string &option, const std::string &path,
             const char *what) {
  std::string value, shown;
  try {
    const FileDigest d = digestFile(path, what);
    value = hex(d.hash) + "/" + std::to_string(d.bytes);
    shown = path + " (" + d.text() + ")";
  } catch (const io::InputError &e) {
    value = "unreadable";
    shown = path + " (" + e.what() + ")";
  }
  id[name] = {value, (option.empty() ? "has " : "was started with " + option + " ") + shown};
}

void addPlanFiles(JobIdentity &id, const Plan &plan) {
  auto file = [&](const std::string &name, const std::string &path, const char *what) {
    try {
      const FileDigest d = digestFile(path, what);
      id[name] = {hex(d.hash) + "/" + std::to_string(d.bytes), "has " + path + " (" + d.text() + ")"};
    } catch (const io::InputError &) {
      // A file this rank cannot read: left out here; if the rank needs it,
      // loading it reports the error.
    }
  };
  file("plan.json", plan.planPath, "plan");
  // The schedule files as one set (a rank reads only its own, but all of
  // them must come from the same plan).
  uint64_t h = 0;
  std::string missing;
  for (int r = 0; r < plan.numRanks(); ++r) {
    const std::string path = plan.scheduleFile(r);
    try {
      const FileDigest d = digestFile(path, "schedule file");
      h = hashBytes(&d.hash, sizeof d.hash, h ^ (uint64_t)r);
    } catch (const io::InputError &) {
      missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      h = hashBytes("missing", 7, h ^ (uint64_t)r);
    }
  }
  const std::string dir = plan.scheduleFile(0).substr(0, plan.scheduleFile(0).rfind('/') + 1);
  id["schedule files"] = {hex(h), "has schedule files " + dir + "rank_0.." + std::to_string(plan.numRanks() - 1) +
                                      ".json with digest " + hex(h) +
                                      (missing.empty() ? "" : " (rank_" + missing + " unreadable)")};
  for (const VirtualStage &vs : plan.vstages) {
    file("stage " + std::to_string(vs.id) + " library", vs.library, "stage library");
    file("stage " + std::to_string(vs.id) + " weights", vs.weights, "weights file");
  }
}

std::string encodeIdentity(const JobIdentity &id) {
  json j = json::object();
  for (const auto &[name, item] : id) j[name] = {item.value, item.shown};
  return j.dump();
}

std::string compareIdentities(const std::vector<std::string> &encoded, size_t maxItems) {
  const size_t R = encoded.size();
  std::vector<JobIdentity> ids(R);
  for (size_t r = 0; r < R; ++r) {
    try {
      const json j = json::parse(encoded[r]);
      for (const auto &[name, v] : j.items()) ids[r][name] = {v.at(0).get<std::string>(), v.at(1).get<std::string>()};
    } catch (const json::exception &) {
      return "rank " + std::to_string(r) + " sent an unreadable job identity (a different piperun build?)";
    }
  }
  std::map<std::string, bool> names;
  for (const JobIdentity &id : ids)
    for (const auto &entry : id) names[entry.first] = true;
  std::string out;
  size_t differing = 0;
  for (const auto &entry : names) {
    const std::string &name = entry.first;
    // Ranks grouped by value (ranks without the item, or with an empty value, left out).
    std::map<std::string, std::vector<size_t>> groups;
    for (size_t r = 0; r < R; ++r) {
      auto it = ids[r].find(name);
      if (it != ids[r].end() && !it->second.value.empty()) groups[it->second.value].push_back(r);
    }
    if (groups.size() < 2) continue;
    if (++differing > maxItems) continue;
    // The smaller groups first (the odd ones out), the largest last.
    std::vector<const std::vector<size_t> *> order;
    for (const auto &g : groups) order.push_back(&g.second);
    std::stable_sort(order.begin(), order.end(), [](auto *a, auto *b) {
      return a->size() != b->size() ? a->size() < b->size() : a->front() > b->front();
    });
    std::string line = "ranks disagree on " + name + ":";
    for (size_t g = 0; g < order.size(); ++g) {
      const std::vector<size_t> &ranks = *order[g];
      std::string who = ranks.size() == 1 ? "rank " : "ranks ";
      for (size_t k = 0; k < ranks.size() && k < 8; ++k) who += (k ? "," : "") + std::to_string(ranks[k]);
      if (ranks.size() > 8) who += ",... (" + std::to_string(ranks.size()) + " ranks)";
      line += (g ? ", " : " ") + who + " " + ids[ranks.front()].at(name).shown;
    }
    out += (out.empty() ? "" : "\n") + line;
  }
  if (differing > maxItems) out += "\n(and " + std::to_string(differing - maxItems) + " more items)";
  return out;
}

} // namespace pipec::rt
