#include "analysis/Partition/PartitionCommand.h"

#include "analysis/Partition/Error.h"
#include "analysis/Partition/PlanJson.h"

#include <nlohmann/json.hpp>

#include <iostream>

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

void parsePartitionFlags(std::vector<std::string> &args, PartitionCliOptions &o) {
  std::vector<std::string> rest;
  for (size_t i = 0; i < args.size(); ++i) {
    std::string arg = args[i], value;
    bool inlineValue = false;
    if (arg.rfind("--", 0) == 0 && arg.find('=') != std::string::npos) {
      value = arg.substr(arg.find('=') + 1);
      arg = arg.substr(0, arg.find('='));
      inlineValue = true;
    }
    auto takeValue = [&]() -> std::string {
      if (inlineValue)
        return value;
      if (i + 1 >= args.size())
        throw Error(arg + ": missing value");
      return args[++i];
    };
    auto noValue = [&]() {
      if (inlineValue)
        throw Error(arg + " takes no value");
    };
    if (arg == "--gpus")
      o.gpus = takeValue();
    else if (arg == "--cluster")
      o.clusterFile = takeValue();
    else if (arg == "--device") {
      o.device = takeValue();
      o.deviceGiven = true;
      requireDevicePreset(o.device, "--device");
    } else if (arg == "--intra-bw")
      o.intraBytesPerSecond = parseGigabytesPerSecond(takeValue(), "--intra-bw");
    else if (arg == "--inter-bw")
      o.interBytesPerSecond = parseGigabytesPerSecond(takeValue(), "--inter-bw");
    else if (arg == "--memory-limit")
      o.options.memoryLimitBytes = parseByteSize(takeValue(), "--memory-limit");
    else if (arg == "--stages")
      o.options.forcedStages = parsePositive(arg, takeValue(), static_cast<int>(kMaxDevices));
    else if (arg == "--microbatches") {
      o.options.microbatches = parsePositive(arg, takeValue(), kMaxMicrobatches);
      o.microbatchesGiven = true;
    } else if (arg == "--no-replication") {
      noValue();
      o.options.allowReplication = false;
    } else if (arg == "--async") {
      noValue();
      o.options.asynchronous = true;
    } else if (arg == "--recompute") {
      // Bare: every stage. With a value: none, all, or auto (only the stages
      // that do not fit otherwise; decided in runPartition).
      std::string mode = inlineValue ? value : "all";
      if (mode != "none" && mode != "all" && mode != "auto")
        throw Error("--recompute: expected none, all or auto, got '" + mode + "'");
      o.recomputeMode = mode;
      o.recomputeGiven = true;
      o.options.recompute = mode == "all";
    } else if (arg == "--partition")
      o.partitionFile = takeValue();
    else if (arg == "--json") {
      noValue();
      o.json = true;
    } else if (arg == "--out")
      o.outDir = takeValue();
    else
      rest.push_back(args[i]);
  }
  args = std::move(rest);
}

const char *partitionFlagsHelp() {
  // The device presets and the default come from their one place (Topology.cpp,
  // PartitionCliOptions); built once, as callers keep the pointer.
  static const std::string help =
      "  --gpus NxG            N servers of G devices (NVLink inside, network between);\n"
      "                        at most 4096 per level and 65536 in all\n"
      "  --cluster FILE        up to 8 levels (docs/cluster-json.md)\n"
      "  --device NAME         device preset: " +
      devicePresetNames() + " (default " + PartitionCliOptions().device +
      ")\n"
      "  --intra-bw GB/s       override the preset's NVLink bandwidth (with --gpus)\n"
      "  --inter-bw GB/s       override the preset's network bandwidth (with --gpus)\n"
      "  --memory-limit SIZE   per-device memory, e.g. 16GiB, 80GB (default: the device's)\n"
      "  --stages N            exactly N pipeline stages (at most the devices)\n"
      "  --no-replication      a straight pipeline: no stage is replicated\n"
      "  --microbatches M      micro-batches per mini-batch (at most 65536; pipec MODEL: default\n"
      "                        chosen by the planner, pipec partition: default 1)\n"
      "  --async               PipeDream 1F1B-RR: weight stashing, no flush\n"
      "  --recompute[=MODE]    keep only stage inputs and recompute activations in the\n"
      "                        backward: all (bare flag), none, or auto (only the stages\n"
      "                        that need it to fit the memory limit)\n"
      "  --partition FILE      evaluate the stages of FILE (plan.json schema) instead of searching\n"
      "  --json                print the summary as JSON\n"
      "  --out DIR             write DIR/plan.json\n";
  return help.c_str();
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

int runPartitionCommand(int argc, char **argv) {
  std::vector<std::string> args(argv + (argc > 0 ? 1 : 0), argv + argc);
  const std::string usage = "usage: pipec partition --costs costs.csv (--gpus NxG | --cluster FILE) [options]\n";
  for (const std::string &a : args)
    if (a == "--help" || a == "-h") {
      std::cout << usage << "\nPartitions a cost table (docs/cost-table.md) with PipeDream's hierarchical DP\n"
                << "and prints the plan (docs/partition.md).\n\n"
                << "  --costs FILE          the cost table (CSV)\n"
                << partitionFlagsHelp();
      return 0;
    }
  try {
    PartitionCliOptions o;
    parsePartitionFlags(args, o);
    std::string costs;
    for (size_t i = 0; i < args.size(); ++i) {
      if (args[i] == "--costs" && i + 1 < args.size())
        costs = args[++i];
      else if (args[i].rfind("--costs=", 0) == 0)
        costs = args[i].substr(8);
      else {
        std::cerr << "pipec partition: unknown argument '" << args[i] << "'\n" << usage;
        return 2;
      }
    }
    if (costs.empty()) {
      std::cerr << "pipec partition: missing --costs FILE\n" << usage;
      return 2;
    }
    CostTable table = readCostTableCsvFile(costs);
    runPartition(table, o, std::cout);
    return 0;
  } catch (const Error &e) {
    std::cerr << "pipec partition: error: " << e.what() << "\n";
    return 1;
  } catch (const std::bad_alloc &) {
    std::cerr << "pipec partition: error: out of memory\n";
    return 1;
  } catch (const std::exception &e) {
    std::cerr << "pipec partition: error: " << e.what() << "\n";
    return 1;
  }
}

} // namespace pipec::partition
