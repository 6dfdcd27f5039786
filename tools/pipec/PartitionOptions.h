// The topology and partition flags of pipec's command line, declared once as
// llvm::cl options of both `pipec partition` and the top level (`pipec MODEL`).
#ifndef PIPEC_TOOLS_PIPEC_PARTITIONOPTIONS_H
#define PIPEC_TOOLS_PIPEC_PARTITIONOPTIONS_H

#include "analysis/Partition/PartitionCommand.h"

#include "llvm/Support/CommandLine.h"

namespace pipec::tools {

/// `pipec partition`: partitions a cost table, no model.
llvm::cl::SubCommand &partitionSubcommand();
/// The category of the shared flags, shown by both subcommands' --help.
llvm::cl::OptionCategory &partitionCategory();

/// Registers the options (once); call before cl::ParseCommandLineOptions.
void registerPartitionOptions();

/// After parsing: fills `options` from the flags given, each value checked by
/// partition::applyPartitionFlag. Throws partition::Error naming the flag.
void readPartitionOptions(partition::PartitionCliOptions &options);

/// After parsing, when partitionSubcommand() ran: the exit status.
int runPartitionSubcommand();

} // namespace pipec::tools

#endif
