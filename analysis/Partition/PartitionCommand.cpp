#include "analysis/Partition/PartitionCommand.h"

#include "analysis/Partition/Error.h"
#include "analysis/Partition/PlanJson.h"
#include "analysis/Settings/Declared.h"
#include "analysis/Settings/TextBinder.h"

#include <nlohmann/json.hpp>

#include <new>
#include <optional>
#include <ostream>

namespace pipec::partition {

Topology PartitionCliOptions::topology() const {
  Topology t = declaredTopology();
  if (!hostMemoryBytes)
    return t;
  return withRanksSharingHost(std::move(t), *hostMemoryBytes,
                              hostMemoryOrigin.empty() ? settings::flag(settings::kHostMemory) : hostMemoryOrigin);
}

Topology PartitionCliOptions::declaredTopology() const {
  if (!gpus.empty() && !clusterFile.empty())
    throw Error(("give " + settings::flag(settings::kGpus) + " or " + settings::flag(settings::kCluster) + ", not both"));
  if (gpus.empty() && clusterFile.empty())
    throw Error(("missing " + settings::flag(settings::kGpus) + " NxG or " + settings::flag(settings::kCluster) + " FILE"));
  if (!clusterFile.empty()) {
    if (intraBytesPerSecond > 0 || interBytesPerSecond > 0)
      throw Error((settings::flag(settings::kIntraBandwidth) + "/" + settings::flag(settings::kInterBandwidth) + " apply to " + settings::flag(settings::kGpus) + "; set bandwidths in the cluster file"));
    Topology t = readClusterJsonFile(clusterFile);
    if (device) {
      const DevicePreset &p = requireDevicePreset(*device, settings::flag(settings::kDevice));
      if (!t.device.empty() && t.device != p.name)
        throw Error((settings::flag(settings::kDevice) + " ") + *device + " disagrees with \"device\": \"" + t.device + "\" in " + clusterFile);
      t.device = std::string(p.name);
    }
    return t;
  }
  return makeGpusTopology(parseGpusSpec(gpus),
                          requireDevicePreset(device.value_or(kDefaultDevice), settings::flag(settings::kDevice)),
                          intraBytesPerSecond, interBytesPerSecond);
}

void PartitionCliOptions::bind(settings::Binder &b) {
  using namespace settings;
  b.onText(kGpus, [this](const std::string &value) {
    if (!value.empty())
      parseGpusSpec(value); // its syntax and bounds now; topology() builds it
    gpus = value;
  });
  b.text(kCluster, clusterFile);
  b.onText(kDevice, [this](const std::string &value) {
    requireDevicePreset(value, settings::flag(settings::kDevice));
    device = value;
  });
  b.onText(kIntraBandwidth,
           [this](const std::string &value) { intraBytesPerSecond = parseGigabytesPerSecond(value, settings::flag(settings::kIntraBandwidth)); });
  b.onText(kInterBandwidth,
           [this](const std::string &value) { interBytesPerSecond = parseGigabytesPerSecond(value, settings::flag(settings::kInterBandwidth)); });
  b.onText(kHostMemory, [this](const std::string &value) {
    hostMemoryBytes = parseByteSize(value, settings::flag(settings::kHostMemory));
  });
  b.onText(kMemoryLimit,
           [this](const std::string &value) { options.memoryLimitBytes = parseByteSize(value, settings::flag(settings::kMemoryLimit)); });
  b.integer(kStages, options.forcedStages);
  b.onFlag(kNoReplication, [this](bool value) { options.allowReplication = !value; });
  b.onInteger(kMicrobatches, [this](int64_t value) { microbatches = static_cast<int>(value); });
  b.flag(kAsync, options.asynchronous);
  // none, all, or auto (only the stages that do not fit otherwise; decided
  // in partitionWithRecompute).
  b.choiceThen(kRecompute, std::function<void(RecomputeMode)>([this](RecomputeMode mode) {
                 recomputeMode = mode;
                 options.recompute = mode == RecomputeMode::All;
               }));
  b.text(kPartitionFile, partitionFile);
  b.flag(kJson, json);
  b.text(kOut, outDir);
}

void applyPartitionFlag(PartitionCliOptions &o, const std::string &flag, const std::string &value) {
  settings::applyArguments<Error>(o, {{flag, value}});
}

void applyPartitionTokens(PartitionCliOptions &o, const std::vector<std::string> &tokens) {
  settings::applyTokens<Error>(o, tokens);
}

static PartitionResult evaluatePartitionFile(const CostTable &table, const Topology &topo,
                                             const PartitionOptions &options, const std::string &path) {
  StageSpecs specs = readStageSpecsFile(path, table);
  return evaluatePartition(table, topo, options, specs.stages, specs.opOrder);
}

PartitionResult partitionWithRecompute(const CostTable &table, const Topology &topo,
                                       const PartitionCliOptions &o) {
  auto run = [&](const PartitionOptions &options) {
    return o.partitionFile.empty() ? partition(table, topo, options, o.explainShortfall)
                                   : evaluatePartitionFile(table, topo, options, o.partitionFile);
  };
  // A search that finds nothing fitting without recompute is retried with it:
  // why the first did not fit is not needed (partitionIfFits).
  auto runIfFits = [&](const PartitionOptions &options) -> std::optional<PartitionResult> {
    if (!o.partitionFile.empty()) {
      try {
        return evaluatePartitionFile(table, topo, options, o.partitionFile);
      } catch (const Error &) {
        return std::nullopt;
      }
    }
    return partitionIfFits(table, topo, options);
  };
  PartitionOptions dp = o.options;
  if (o.microbatches)
    dp.microbatches = *o.microbatches;
  PartitionResult result;
  if (o.recomputeMode == RecomputeMode::Auto) {
    // Recompute only when nothing fits without it, and then only in the
    // stages whose activations would not fit (the others keep theirs).
    if (std::optional<PartitionResult> fits = runIfFits(dp)) {
      result = std::move(*fits);
    } else {
      PartitionOptions withRecompute = dp;
      withRecompute.recompute = true;
      result = run(withRecompute);
      PartitionOptions plain = dp;
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
    result = run(dp);
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
  if (o.recomputeMode == RecomputeMode::Auto && !o.json) {
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
    err << ("pipec partition: missing " + settings::flag(settings::kCosts) + " FILE (see pipec partition --help)\n");
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
