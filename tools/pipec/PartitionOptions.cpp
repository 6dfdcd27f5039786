#include "PartitionOptions.h"

#include "analysis/Settings/Declared.h"
#include "passes/OptionsBinder.h"

#include <iostream>

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

/// `pipec partition`'s own options, and the binder of every pipec setting.
struct Settings {
  partition::PartitionCliOptions subcommand;
  passes::OptionsBinder binder{{&partitionSubcommand(), &cl::SubCommand::getTopLevel()}, partitionCategory()};
};

Settings &settingsOnce() {
  static Settings s;
  return s;
}
} // namespace

void registerPipecSettings(CompileOptions &topLevel, cl::OptionCategory &compileCategory) {
  Settings &s = settingsOnce();
  // The shared settings first, so that they exist in both subcommands when
  // the top level's planner binds its partition settings to the same options.
  s.subcommand.bind(s.binder);
  s.binder.setSubcommands({&partitionSubcommand()});
  s.binder.setCategory(partitionCommandCategory());
  s.binder.text(settings::kCosts, s.subcommand.costsFile);
  s.binder.setSubcommands({&cl::SubCommand::getTopLevel()});
  s.binder.setCategory(compileCategory);
  topLevel.bind(s.binder);
}

void applyPipecSettings() { settingsOnce().binder.apply(); }

int runPartitionSubcommand() {
  Settings &s = settingsOnce();
  try {
    s.binder.apply();
  } catch (const settings::SettingError &error) {
    std::cerr << "pipec partition: error: " << error.what() << "\n";
    return 2;
  }
  return partition::runPartitionCommand(s.subcommand, std::cout, std::cerr);
}

} // namespace pipec::tools
