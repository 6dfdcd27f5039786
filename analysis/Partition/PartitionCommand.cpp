#include "analysis/Partition/PartitionCommand.h"

#include "analysis/Partition/Error.h"
#include "analysis/Partition/PlanJson.h"

#include <nlohmann/json.hpp>

#include <new>
#include <ostream>

namespace pipec::partition {

Topology PartitionCliOptions::topology() const {
  if (!gpus.empty() && !clusterFile.empty())
    throw Error("give --gpus or --cluster, not both");
  if (gpus.empty() && clusterFile.empty())
    throw Error("missing --gpus NxG or --cluster FILE");
  if (!clusterFile.empty()) {
    if (intraBytesPerSecond > 0 || interBytesPerSecond > 0)
      throw Error("--intra-bw/--inter-bw apply to --gpus; set bandwidths in the cluster file");
    Topology t = readClusterJsonFile(clusterFile);
    if (deviceGiven) {
      const DevicePreset &p = requireDevicePreset(device, "--device");
      if (!t.device.empty() && t.device != p.name)
        throw Error("--device " + device + " disagrees with \"device\": \"" + t.device + "\" in " + clusterFile);
      t.device = std::string(p.name);
    }
    return t;
  }
  return makeGpusTopology(parseGpusSpec(gpus), requireDevicePreset(device, "--device"),
                          intraBytesPerSecond, interBytesPerSecond);
}

/// A decimal integer in [1, max]: digits only (no sign, exponent or spaces).
static int parsePositive(const std::string &flag, const std::string &value, int max) {
  bool digits = !value.empty() && value.size() <= 18;
  for (char c : value)
    digits = digits && c >= '0' && c <= '9';
  if (!digits)
    throw Error(flag + " '" + value + "': expected a positive integer (at most " + std::to_string(max) + ")");
  long long v = std::stoll(value);
  if (v < 1 || v > max)
    throw Error(flag + " " + value + ": must be between 1 and " + std::to_string(max));
  return static_cast<int>(v);
}

const char *const kPartitionFlags[] = {
    "--gpus", "--cluster", "--device", "--intra-bw", "--inter-bw", "--memory-limit", "--stages",
    "--microbatches", "--no-replication", "--async", "--recompute", "--partition", "--json", "--out",
    nullptr};
const char *const kPartitionBareFlags[] = {"--no-replication", "--async", "--json", nullptr};


void applyPartitionFlag(PartitionCliOptions &o, const std::string &flag, const std::string &value) {
  if (flag == "--gpus") {
    if (!value.empty())
      parseGpusSpec(value); // its syntax and bounds now; topology() builds it
    o.gpus = value;
  } else if (flag == "--cluster")
    o.clusterFile = value;
  else if (flag == "--device") {
    requireDevicePreset(value, "--device");
    o.device = value;
    o.deviceGiven = true;
  } else if (flag == "--intra-bw")
    o.intraBytesPerSecond = parseGigabytesPerSecond(value, "--intra-bw");
  else if (flag == "--inter-bw")
    o.interBytesPerSecond = parseGigabytesPerSecond(value, "--inter-bw");
  else if (flag == "--memory-limit")
    o.options.memoryLimitBytes = parseByteSize(value, "--memory-limit");
  else if (flag == "--stages")
    o.options.forcedStages = parsePositive(flag, value, static_cast<int>(kMaxDevices));
  else if (flag == "--microbatches") {
    o.options.microbatches = parsePositive(flag, value, kMaxMicrobatches);
    o.microbatchesGiven = true;
  } else if (flag == "--no-replication")
    o.options.allowReplication = false;
  else if (flag == "--async")
    o.options.asynchronous = true;
  else if (flag == "--recompute") {
    // Bare: every stage. With a value: none, all, or auto (only the stages
    // that do not fit otherwise; decided in runPartition).
    std::string mode = value.empty() ? "all" : value;
    if (mode != "none" && mode != "all" && mode != "auto")
      throw Error("--recompute: expected none, all or auto, got '" + mode + "'");
    o.recomputeMode = mode;
    o.recomputeGiven = true;
    o.options.recompute = mode == "all";
  } else if (flag == "--partition")
    o.partitionFile = value;
  else if (flag == "--json")
    o.json = true;
  else if (flag == "--out")
    o.outDir = value;
  else
    throw Error("unknown option '" + flag + "'");
}

static PartitionResult evaluatePartitionFile(const CostTable &table, const Topology &topo,
                                             const PartitionOptions &options, const std::string &path) {
  StageSpecs specs = readStageSpecsFile(path, table);
  return evaluatePartition(table, topo, options, specs.stages, specs.opOrder);
}

PartitionResult partitionWithRecompute(const CostTable &table, const Topology &topo,
                                       const PartitionCliOptions &o) {
  auto run = [&](const PartitionOptions &options) {
    return o.partitionFile.empty()
               ? partition(table, topo, options)
               : evaluatePartitionFile(table, topo, options, o.partitionFile);
  };
  PartitionResult result;
  if (o.recomputeMode == "auto") {
    // Recompute only when nothing fits without it, and then only in the
    // stages whose activations would not fit (the others keep theirs).
    try {
      result = run(o.options);
    } catch (const Error &) {
      PartitionOptions withRecompute = o.options;
      withRecompute.recompute = true;
      result = run(withRecompute);
      PartitionOptions plain = o.options;
      plain.recompute = false;
      // the stages' op indices count in the result's op order
      CostTable ordered = result.opOrder.empty() ? table : reorderedCostTable(table, result.opOrder, "partition");
      CostModel model(ordered, topo, plain);
      for (size_t s = 0; s < result.stages.size(); ++s) {
        const StagePlan &stage = result.stages[s];
        if (model.memory(stage.firstOp, stage.lastOp, stage.inflight) > model.memoryLimit())
          result.recomputedStages.push_back(static_cast<int>(s));
      }
    }
  } else {
    result = run(o.options);
    if (result.recompute)
      for (size_t s = 0; s < result.stages.size(); ++s)
        result.recomputedStages.push_back(static_cast<int>(s));
  }
  result.verify(table, topo);
  return result;
}

PartitionResult runPartition(const CostTable &table, const PartitionCliOptions &o,
                             std::ostream &out) {
  Topology topo = o.topology();
  PartitionResult result = partitionWithRecompute(table, topo, o);
  if (!o.outDir.empty())
    writePlanFile(planToJson(table, topo, result), o.outDir);
  if (o.json)
    out << summaryToJson(table, result).dump(2) << "\n";
  else
    printPlanTable(out, table, topo, result);
  if (o.recomputeMode == "auto" && !o.json) {
    out << "recompute (auto): ";
    if (result.recomputedStages.empty())
      out << "no stage needs it\n";
    for (size_t i = 0; i < result.recomputedStages.size(); ++i)
      out << (i ? ", " : "stages ") << result.recomputedStages[i]
          << (i + 1 == result.recomputedStages.size()
                  ? " (the table's memory assumes recompute in every stage)\n"
                  : "");
  }
  return result;
}

int runPartitionCommand(const PartitionCliOptions &o, std::ostream &out, std::ostream &err) {
  if (o.costsFile.empty()) {
    err << "pipec partition: missing --costs FILE (see pipec partition --help)\n";
    return 2;
  }
  try {
    CostTable table = readCostTableCsvFile(o.costsFile);
    runPartition(table, o, out);
    return 0;
  } catch (const std::bad_alloc &) {
    err << "pipec partition: error: out of memory\n";
  } catch (const std::exception &e) {
    err << "pipec partition: error: " << e.what() << "\n";
  }
  return 1;
}

} // namespace pipec::partition
