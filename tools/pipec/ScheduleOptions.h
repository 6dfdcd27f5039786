// The options of `pipec schedule`, declared as llvm::cl options of its subcommand.
#ifndef PIPEC_TOOLS_PIPEC_SCHEDULEOPTIONS_H
#define PIPEC_TOOLS_PIPEC_SCHEDULEOPTIONS_H

#include "llvm/Support/CommandLine.h"

namespace pipec::tools {

/// `pipec schedule`: generate, validate and simulate schedules, no model.
llvm::cl::SubCommand &scheduleSubcommand();

/// Registers the options (once); call before cl::ParseCommandLineOptions.
void registerScheduleOptions();

/// After parsing, when scheduleSubcommand() ran: the exit status.
int runScheduleSubcommand();

} // namespace pipec::tools

#endif
