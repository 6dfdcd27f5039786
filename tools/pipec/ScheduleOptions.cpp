#include "ScheduleOptions.h"

#include "analysis/Schedule/Schedule.h"
#include "passes/OptionsBinder.h"

#include <iostream>
#include <string>

namespace cl = llvm::cl;

namespace pipec::tools {

cl::SubCommand &scheduleSubcommand() {
  static cl::SubCommand sub("schedule",
                            "generate, validate and simulate a pipeline schedule without a model "
                            "(docs/schedules.md)");
  return sub;
}

namespace {
using schedule::ScheduleFamily;

// The usage lines, then one line per family from its row (Families.cpp): the
// category's description, printed above the options by --help.
std::string scheduleHelp() {
  std::string text = "  pipec schedule --stages P --microbatches M --schedule NAME [options]\n"
                     "  pipec schedule --stages P --microbatches M --compare [options]\n\n"
                     "Schedules:\n";
  for (const ScheduleFamily &f : schedule::scheduleFamilies()) {
    const std::string name(f.name);
    text += "  " + name + std::string(name.size() < 20 ? 22 - name.size() : 2, ' ') + std::string(f.summary) + "\n";
  }
  text.pop_back();
  return text;
}

/// The subcommand's options, bound from the settings' declarations
/// (ScheduleCliOptions::bind).
struct ScheduleCommandLine {
  const std::string help = scheduleHelp(); // the category keeps a pointer
  cl::OptionCategory category{"Schedule options", help};
  schedule::ScheduleCliOptions options;
  passes::OptionsBinder binder{{&scheduleSubcommand()}, category};
  ScheduleCommandLine() { options.bind(binder); }
};

ScheduleCommandLine &commandLine() {
  static ScheduleCommandLine c;
  return c;
}
} // namespace

void registerScheduleOptions() { commandLine(); }

int runScheduleSubcommand() {
  ScheduleCommandLine &c = commandLine();
  try {
    c.binder.apply();
  } catch (const settings::SettingError &error) {
    std::cerr << "pipec schedule: " << error.what() << "\n";
    return 2;
  }
  return schedule::runScheduleCommand(c.options, std::cout, std::cerr);
}

} // namespace pipec::tools
