#include "PartitionOptions.h"
#include "GivenFlags.h"

#include "analysis/Partition/Error.h"
#include "analysis/Partition/Topology.h"

#include "llvm/Support/raw_ostream.h"

#include <cassert>
#include <iostream>
#include <string>
#include <vector>

namespace cl = llvm::cl;

namespace pipec::tools {

cl::SubCommand &partitionSubcommand() {
  static cl::SubCommand sub("partition",
                            "partition a cost table (docs/cost-table.md) with PipeDream's hierarchical DP "
                            "and print the plan (docs/partition.md)");
  return sub;
}

cl::OptionCategory &partitionCategory() {
  static cl::OptionCategory category("Topology and partition options",
                                     "  Shared by `pipec MODEL` and `pipec partition`.");
  return category;
}

namespace {
cl::OptionCategory &partitionCommandCategory() {
  static cl::OptionCategory category(
      "Partition command options",
      "  pipec partition --costs costs.csv (--gpus NxG | --cluster FILE) [options]");
  return category;
}

// Both subcommands: cl::sub(...) twice.
#define PIPEC_BOTH cl::sub(partitionSubcommand()), cl::sub(cl::SubCommand::getTopLevel()), cl::cat(partitionCategory())

struct PartitionFlags {
  // cl::desc keeps a pointer: the generated text lives as long as the options.
  // The device presets and the default come from their one place (Topology.cpp,
  // PartitionCliOptions).
  const std::string deviceHelp = "Device preset: " + partition::devicePresetNames() + " (default " +
                                 partition::PartitionCliOptions().device + ")";

  cl::opt<std::string> costs{"costs", cl::desc("The cost table (CSV, docs/cost-table.md)"),
                             cl::value_desc("file"), cl::sub(partitionSubcommand()),
                             cl::cat(partitionCommandCategory())};

  cl::opt<std::string> gpus{"gpus",
                            cl::desc("N servers of G devices (NVLink inside, network between); at most "
                                     "4096 per level and 65536 in all"),
                            cl::value_desc("NxG"), PIPEC_BOTH};
  cl::opt<std::string> cluster{"cluster", cl::desc("Up to 8 levels (docs/cluster-json.md)"),
                               cl::value_desc("file"), PIPEC_BOTH};
  cl::opt<std::string> device{"device", cl::desc(deviceHelp), cl::value_desc("name"), PIPEC_BOTH};
  cl::opt<std::string> intraBw{"intra-bw", cl::desc("Override the preset's NVLink bandwidth (with --gpus)"),
                               cl::value_desc("GB/s"), PIPEC_BOTH};
  cl::opt<std::string> interBw{"inter-bw", cl::desc("Override the preset's network bandwidth (with --gpus)"),
                               cl::value_desc("GB/s"), PIPEC_BOTH};
  cl::opt<std::string> memoryLimit{"memory-limit",
                                   cl::desc("Per-device memory, e.g. 16GiB, 80GB (default: the device's)"),
                                   cl::value_desc("size"), PIPEC_BOTH};
  cl::opt<std::string> stages{"stages", cl::desc("Exactly N pipeline stages (at most the devices)"),
                              cl::value_desc("N"), PIPEC_BOTH};
  cl::opt<bool> noReplication{"no-replication", cl::desc("A straight pipeline: no stage is replicated"),
                              cl::ValueDisallowed, PIPEC_BOTH};
  cl::opt<std::string> microbatches{
      "microbatches",
      cl::desc("Micro-batches per mini-batch (at most 65536; pipec MODEL: default chosen by the "
               "planner, pipec partition: default 1)"),
      cl::value_desc("M"), PIPEC_BOTH};
  cl::opt<bool> async{"async", cl::desc("PipeDream 1F1B-RR: weight stashing, no flush"), cl::ValueDisallowed,
                      PIPEC_BOTH};
  cl::opt<std::string> recompute{
      "recompute",
      cl::desc("Keep only stage inputs and recompute activations in the backward: all (bare flag), "
               "none, or auto (only the stages that need it to fit the memory limit)"),
      cl::value_desc("mode"), cl::ValueOptional, PIPEC_BOTH};
  cl::opt<std::string> partitionFile{"partition",
                                     cl::desc("Evaluate the stages of this file (plan.json schema) instead "
                                              "of searching"),
                                     cl::value_desc("file"), PIPEC_BOTH};
  cl::opt<bool> json{"json", cl::desc("Print the summary as JSON"), cl::ValueDisallowed, PIPEC_BOTH};
  cl::opt<std::string> out{"out", cl::desc("Write DIR/plan.json (pipec MODEL: the whole job)"),
                           cl::value_desc("dir"), PIPEC_BOTH};

  /// The shared flags with a value, and the bare ones.
  std::vector<cl::opt<std::string> *> valued() {
    return {&gpus, &cluster, &device, &intraBw, &interBw, &memoryLimit, &stages, &microbatches,
            &recompute, &partitionFile, &out};
  }
  std::vector<cl::opt<bool> *> bare() { return {&noReplication, &async, &json}; }
};
#undef PIPEC_BOTH

PartitionFlags &flags() {
  static PartitionFlags f;
  return f;
}
} // namespace

void registerPartitionOptions() {
  flags();
  // Every flag applyPartitionFlag knows is declared above, for both subcommands.
  for (const char *const *flag = partition::kPartitionFlags; *flag; ++flag)
    assert(cl::getRegisteredOptions(partitionSubcommand()).count(*flag + 2) &&
           cl::getRegisteredOptions(cl::SubCommand::getTopLevel()).count(*flag + 2) &&
           "a partition flag without its cl option");
}

void readPartitionOptions(partition::PartitionCliOptions &options) {
  PartitionFlags &f = flags();
  applyGivenFlags(f.valued(), f.bare(), [&](const std::string &flag, const std::string &value) {
    partition::applyPartitionFlag(options, flag, value);
  });
}

int runPartitionSubcommand() {
  partition::PartitionCliOptions options;
  try {
    readPartitionOptions(options);
  } catch (const partition::Error &error) {
    std::cerr << "pipec partition: error: " << error.what() << "\n";
    return 2;
  }
  options.costsFile = flags().costs;
  return partition::runPartitionCommand(options, std::cout, std::cerr);
}

} // namespace pipec::tools
