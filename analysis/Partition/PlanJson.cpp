#include "analysis/Partition/PlanJson.h"

#include "analysis/Partition/Error.h"
#include "analysis/Partition/InputFiles.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <ostream>
#include <sstream>
#include <unordered_map>

namespace pipec::partition {

using nlohmann::json;

plan::PlanFile planFile(const CostTable &table, const Topology &topology, const PartitionResult &r) {
  plan::PlanFile file;
  file.pipeline.microbatches = r.microbatches;
  file.pipeline.asynchronous = r.asynchronous;
  file.topology.device = topology.device;
  file.topology.deviceMemory = topology.deviceMemoryBytes;
  file.topology.devices = topology.totalDevices();
  for (const Level &l : topology.levels)
    file.topology.levels.push_back({l.name, l.fanout, l.bandwidthBytesPerSecond / 1e9});
  file.partition.source = r.fromSearch ? "search" : "given";
  file.partition.layers = r.layers;
  file.partition.recompute = r.recompute;
  if (r.memoryLimitBytes >= 0)
    file.partition.memoryLimitBytes = r.memoryLimitBytes;
  for (size_t k = 0; k < r.stages.size(); ++k) {
    const StagePlan &s = r.stages[k];
    plan::Stage st;
    st.id = static_cast<int64_t>(k);
    st.firstOp = table.ops[r.op(s.firstOp)].name;
    st.lastOp = table.ops[r.op(s.lastOp)].name;
    st.firstOpIndex = s.firstOp;
    st.lastOpIndex = s.lastOp;
    st.replicas = s.replicas;
    st.replicasPerLevel = s.replicasPerLevel;
    st.ranks = s.ranks;
    st.computeSeconds = s.computeSeconds;
    st.sendSeconds = s.sendSeconds;
    st.sendBytes = s.sendBytes;
    st.sendLevel = s.sendLevel;
    st.allreduceSeconds = s.allreduceSeconds;
    st.inflight = s.inflight;
    st.parameterBytes = s.parameterBytes;
    st.optimizerBytes = s.optimizerStateBytes;
    st.gradientBytes = s.gradientBytes;
    st.stashBytes = s.stashBytes;
    st.activationBytes = s.activationBytes;
    st.memoryBytes = s.memoryBytes;
    file.stages.push_back(std::move(st));
  }
  for (int index : r.opOrder)
    file.opOrder.push_back(table.ops[index].name);
  plan::Predictions &p = file.predictions;
  p.timePerMicrobatch = r.timePerMicrobatch;
  p.timePerMinibatch = r.timePerMinibatch;
  p.source = r.simulated ? plan::TimeSource::Simulated : plan::TimeSource::Analytic;
  if (r.simulated)
    p.analyticTimePerMinibatch = r.analyticTimePerMinibatch;
  p.throughput = r.throughput;
  p.bubbleSeconds = r.bubbleSeconds;
  p.bubbleFraction = r.bubbleFraction;
  p.inflightMicrobatches = r.inflightMicrobatches;
  p.devicesUsed = r.devicesUsed;
  p.dataParallelFits = r.dataParallelFits;
  if (r.dataParallelFits) {
    p.dataParallelTimePerMicrobatch = r.dataParallelTimePerMicrobatch;
    p.speedupOverDataParallel = r.speedupOverDataParallel;
  }
  return file;
}

json planToJson(const CostTable &table, const Topology &topology, const PartitionResult &result) {
  return plan::toJson(planFile(table, topology, result));
}

json summaryToJson(const CostTable &table, const PartitionResult &result) {
  // Not plan.json: one document on standard output, whose "partition" also
  // says how many micro-batches and whether asynchronous.
  const plan::PlanFile file = planFile(table, Topology{}, result);
  json s = plan::toJson(file.predictions);
  s["partition"] = plan::toJson(file.partition);
  s["partition"]["microbatches"] = file.pipeline.microbatches;
  s["partition"]["asynchronous"] = file.pipeline.asynchronous;
  json stages = json::array();
  for (const plan::Stage &st : file.stages)
    stages.push_back(plan::toJson(st));
  s["stages"] = stages;
  if (!file.opOrder.empty())
    s["op_order"] = file.opOrder;
  return s;
}

void writePlanFile(const json &plan, const std::string &directory) {
  std::error_code ec;
  std::filesystem::create_directories(directory, ec);
  if (ec)
    throw Error(directory + ": cannot create the output directory: " + ec.message());
  std::string path = (std::filesystem::path(directory) / "plan.json").string();
  std::ofstream out(path);
  out << plan.dump(2) << "\n";
  if (!out)
    throw Error(path + ": cannot write");
}

static StageSpecs stageSpecsFromJson(const json &j, const std::string &file, const CostTable &table);

StageSpecs readStageSpecs(std::istream &in, const std::string &file, const CostTable &table) {
  std::ostringstream text;
  text << in.rdbuf();
  return stageSpecsFromJson(parseUserJson(text.str(), file), file, table);
}

static StageSpecs stageSpecsFromJson(const json &j, const std::string &file, const CostTable &table) {
  if (!j.is_object() || !j.contains("stages") || !j["stages"].is_array() || j["stages"].empty())
    throw Error(file + ": expected an object with a non-empty \"stages\" array");
  if (j["stages"].size() > static_cast<size_t>(kMaxDevices))
    throw Error(file + ": " + std::to_string(j["stages"].size()) + " stages, over the limit of " +
                std::to_string(kMaxDevices) + " (one device each at least)");
  std::unordered_map<std::string, int> index;
  for (size_t i = 0; i < table.ops.size(); ++i)
    index.emplace(table.ops[i].name, static_cast<int>(i));
  StageSpecs specs;
  if (j.contains("op_order")) {
    // Stage op names and indices then count in this order (a partition cut at antichains).
    const json &order = j["op_order"];
    if (!order.is_array() || order.size() != table.ops.size())
      throw Error(file + ": \"op_order\" must list each of the " + std::to_string(table.ops.size()) +
                  " ops once");
    for (const json &name : order) {
      auto it = name.is_string() ? index.find(name.get<std::string>()) : index.end();
      if (it == index.end())
        throw Error(file + ": \"op_order\" names " +
                    (name.is_string() ? "an unknown op '" + name.get<std::string>() + "'" : std::string("a non-string")));
      specs.opOrder.push_back(it->second);
    }
    CostTable ordered = reorderedCostTable(table, specs.opOrder, file + ": \"op_order\"");
    index.clear();
    for (size_t i = 0; i < ordered.ops.size(); ++i)
      index.emplace(ordered.ops[i].name, static_cast<int>(i));
  }
  for (size_t k = 0; k < j["stages"].size(); ++k) {
    const json &st = j["stages"][k];
    std::string where = file + ": stages[" + std::to_string(k) + "]";
    if (!st.is_object())
      throw Error(where + " must be an object");
    auto op = [&](const char *nameKey, const char *indexKey) -> int {
      if (st.contains(nameKey)) {
        if (!st[nameKey].is_string())
          throw Error(where + ": \"" + nameKey + "\" must be an op name");
        auto it = index.find(st[nameKey].get<std::string>());
        if (it == index.end())
          throw Error(where + ": unknown op '" + st[nameKey].get<std::string>() + "'");
        if (st.contains(indexKey) && st[indexKey] != it->second)
          throw Error(where + ": \"" + nameKey + "\" and \"" + indexKey + "\" disagree");
        return it->second;
      }
      if (st.contains(indexKey)) {
        if (!st[indexKey].is_number_unsigned() ||
            st[indexKey].get<uint64_t>() >= static_cast<uint64_t>(table.ops.size()))
          throw Error(where + ": \"" + indexKey + "\" must be an op index below " + std::to_string(table.ops.size()));
        return st[indexKey].get<int>();
      }
      throw Error(where + ": missing \"" + nameKey + "\" (or \"" + indexKey + "\")");
    };
    StageSpec spec;
    spec.firstOp = op("first_op", "first_op_index");
    spec.lastOp = op("last_op", "last_op_index");
    if (st.contains("replicas")) {
      if (!st["replicas"].is_number_unsigned() || st["replicas"].get<uint64_t>() < 1 ||
          st["replicas"].get<uint64_t>() > static_cast<uint64_t>(kMaxDevices))
        throw Error(where + ": \"replicas\" must be a positive integer at most " + std::to_string(kMaxDevices));
      spec.replicas = st["replicas"].get<int>();
    }
    if (st.contains("ranks")) {
      if (!st["ranks"].is_array())
        throw Error(where + ": \"ranks\" must be an array of integers");
      if (st["ranks"].size() > static_cast<size_t>(kMaxDevices))
        throw Error(where + ": \"ranks\" has " + std::to_string(st["ranks"].size()) +
                    " entries, over the limit of " + std::to_string(kMaxDevices));
      for (const json &r : st["ranks"]) {
        if (!r.is_number_unsigned() || r.get<uint64_t>() >= static_cast<uint64_t>(kMaxDevices))
          throw Error(where + ": \"ranks\" must be an array of non-negative integers below " +
                    std::to_string(kMaxDevices));
        spec.ranks.push_back(r.get<int>());
      }
      if (!st.contains("replicas"))
        spec.replicas = static_cast<int>(spec.ranks.size());
    }
    specs.stages.push_back(std::move(spec));
  }
  return specs;
}

StageSpecs readStageSpecsFile(const std::string &path, const CostTable &table) {
  return stageSpecsFromJson(readUserJsonFile(path, "partition file"), path, table);
}

std::string formatSeconds(double s) {
  std::ostringstream os;
  os << std::setprecision(3);
  if (s == 0)
    os << "0";
  else if (s < 1e-3)
    os << s * 1e6 << " us";
  else if (s < 1)
    os << s * 1e3 << " ms";
  else
    os << s << " s";
  return os.str();
}

static std::string ranksText(const std::vector<int> &ranks) {
  // Compress runs: 0-7,16-23
  std::string out;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1)
      ++j;
    out += (out.empty() ? "" : ",") + std::to_string(ranks[i]);
    if (j > i)
      out += "-" + std::to_string(ranks[j]);
    i = j + 1;
  }
  return out;
}

static std::string ellipsize(const std::string &s, size_t width) {
  return s.size() <= width ? s : s.substr(0, width - 3) + "...";
}

void printPlanTable(std::ostream &os, const CostTable &table, const Topology &topology, const PartitionResult &r) {
  os << (r.fromSearch ? "Partition" : "Given partition") << " of " << table.ops.size() << " ops";
  if (r.fromSearch && r.layers != static_cast<int>(table.ops.size()))
    os << " (searched as " << r.layers << " layers)";
  os << " on " << topology.describe() << "\n";
  os << (r.asynchronous ? "asynchronous (weight stashing)" : "synchronous (flush)") << ", "
     << r.microbatches << (r.microbatches == 1 ? " micro-batch" : " micro-batches") << " per mini-batch"
     << (r.recompute ? ", recompute" : "")
     << ", memory limit "
     << (r.memoryLimitBytes < 0 ? std::string("none") : formatBytes(static_cast<double>(r.memoryLimitBytes)));
  if (topology.gpuDevices() && r.memoryLimitBytes == topology.stageMemoryBytes())
    os << " (" << formatBytes(static_cast<double>(topology.deviceMemoryBytes)) << " per device less "
       << formatBytes(static_cast<double>(kGpuRuntimeBytes)) << " for the CUDA runtime)";
  os << "\n\n";
  os << std::left << std::setw(6) << "stage" << std::setw(42) << "ops (first .. last)" << std::setw(9)
     << "replicas" << std::setw(14) << "ranks" << std::right << std::setw(11) << "compute" << std::setw(11)
     << "send" << std::setw(11) << "allreduce" << std::setw(11) << "weights" << std::setw(11) << "activ."
     << std::setw(11) << "memory" << std::setw(9) << "inflight" << "\n";
  for (size_t k = 0; k < r.stages.size(); ++k) {
    const StagePlan &s = r.stages[k];
    std::string range = table.ops[r.op(s.firstOp)].name + " .. " + table.ops[r.op(s.lastOp)].name + " (" +
                        std::to_string(s.lastOp - s.firstOp + 1) + ")";
    os << std::left << std::setw(6) << k << std::setw(42) << ellipsize(range, 41) << std::setw(9) << s.replicas
       << std::setw(14) << ellipsize(ranksText(s.ranks), 13) << std::right << std::setw(11)
       << formatSeconds(s.computeSeconds) << std::setw(11) << formatSeconds(s.sendSeconds) << std::setw(11)
       << formatSeconds(s.allreduceSeconds) << std::setw(11)
       << formatBytes(static_cast<double>(s.parameterBytes + s.gradientBytes + s.optimizerStateBytes + s.stashBytes))
       << std::setw(11) << formatBytes(static_cast<double>(s.activationBytes)) << std::setw(11)
       << formatBytes(static_cast<double>(s.memoryBytes)) << std::setw(9) << s.inflight << "\n";
  }
  os << "\n";
  os << "time per micro-batch    " << formatSeconds(r.timePerMicrobatch) << " (slowest stage or link)\n";
  if (r.simulated) {
    // The planner's prediction: the emitted schedule, simulated.
    os << "time per mini-batch     " << formatSeconds(r.timePerMinibatch) << " (" << r.microbatches
       << " micro-batches, the simulated schedule below)\n";
    os << "DP estimate             " << formatSeconds(r.analyticTimePerMinibatch)
       << " per mini-batch (PipeDream's analytic model, not the prediction)\n";
    os << "throughput              " << std::setprecision(4) << r.throughput << " micro-batches/s\n";
    os << "pipeline bubble         " << std::fixed << std::setprecision(1) << 100 * r.bubbleFraction
       << "% of a mini-batch from an empty pipeline (simulated)\n" << std::defaultfloat;
  } else {
    os << "time per mini-batch     " << formatSeconds(r.timePerMinibatch);
    if (!r.asynchronous)
      os << " (" << r.microbatches << " x " << formatSeconds(r.timePerMicrobatch) << " + bubble)";
    os << "\n";
    os << "throughput              " << std::setprecision(4) << r.throughput << " micro-batches/s\n";
    if (r.asynchronous)
      os << "pipeline bubble         none in steady state (no flush)\n";
    else
      os << "pipeline bubble         " << formatSeconds(r.bubbleSeconds) << " per mini-batch (" << std::fixed
         << std::setprecision(1) << 100 * r.bubbleFraction << "%)\n" << std::defaultfloat;
  }
  os << "in-flight micro-batches " << r.inflightMicrobatches << " (input stage)\n";
  if (r.dataParallelFits)
    os << "speedup over pure data parallelism on " << topology.totalDevices() << " devices: "
       << std::setprecision(3) << r.speedupOverDataParallel << "x (data parallel: "
       << formatSeconds(r.dataParallelTimePerMicrobatch) << " per micro-batch)\n";
  else
    os << "speedup over pure data parallelism: n/a (the whole model does not fit on one device)\n";
}

} // namespace pipec::partition
