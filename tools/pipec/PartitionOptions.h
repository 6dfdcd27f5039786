// pipec's settings on its command line: the topology and partition settings
// shared by the top level (`pipec MODEL`) and `pipec partition`, and the
// top level's cost, planner, training and target settings, all bound once
// from their declarations (analysis/Settings/Declared.h) by one binder.
#ifndef PIPEC_TOOLS_PIPEC_PARTITIONOPTIONS_H
#define PIPEC_TOOLS_PIPEC_PARTITIONOPTIONS_H

#include "compiler/Driver/Compiler.h"

#include "llvm/Support/CommandLine.h"

namespace pipec::tools {

/// `pipec partition`: partitions a cost table, no model.
llvm::cl::SubCommand &partitionSubcommand();
/// The category of the shared flags, shown by both subcommands' --help.
llvm::cl::OptionCategory &partitionCategory();

/// Declares the options (once) before cl::ParseCommandLineOptions: the shared
/// ones for both commands, `topLevel`'s others (listed under `compileCategory`)
/// for the top level only.
void registerPipecSettings(CompileOptions &topLevel, llvm::cl::OptionCategory &compileCategory);

/// After parsing: copies every given setting into its fields. Throws
/// settings::SettingError naming the flag (a usage error).
void applyPipecSettings();

/// After parsing, when partitionSubcommand() ran: the exit status.
int runPartitionSubcommand();

} // namespace pipec::tools

#endif
