#ifndef PIPEC_PARTITION_PARTITIONCOMMAND_H
#define PIPEC_PARTITION_PARTITIONCOMMAND_H

#include "analysis/Partition/Partitioner.h"
#include "analysis/Partition/Topology.h"

#include <iosfwd>
#include <string>
#include <vector>

namespace pipec::partition {

/// The topology and partition flags shared by `pipec partition` and `pipec MODEL`.
struct PartitionCliOptions {
  std::string gpus;        ///< --gpus NxG
  std::string clusterFile; ///< --cluster FILE
  std::string device = "H100"; ///< --device
  bool deviceGiven = false;
  double intraBytesPerSecond = 0, interBytesPerSecond = 0; ///< --intra-bw/--inter-bw (0: preset)
  std::string partitionFile; ///< --partition FILE
  bool json = false;         ///< --json
  std::string outDir;        ///< --out DIR
  PartitionOptions options;  ///< --stages --no-replication --memory-limit --microbatches --async --recompute
  std::string recomputeMode = "none"; ///< --recompute[=none|all|auto]
  bool recomputeGiven = false;        ///< --recompute was passed (else the planner tries auto)
  bool microbatchesGiven = false;     ///< --microbatches was passed (else the planner chooses)

  /// The topology the flags describe (exactly one of --gpus and --cluster).
  Topology topology() const;
};

/// Consumes the flags above from `args` (both "--flag value" and "--flag=value"),
/// leaving every other argument in place, in order. Throws Error on a bad value.
void parsePartitionFlags(std::vector<std::string> &args, PartitionCliOptions &options);

/// Help text for the flags parsePartitionFlags understands.
const char *partitionFlagsHelp();

/// Partitions (or evaluates --partition) under the flags, recompute=auto
/// included; checks the result's invariants. Throws Error.
PartitionResult partitionWithRecompute(const CostTable &table, const Topology &topology,
                                       const PartitionCliOptions &options);

/// Partitions (or evaluates --partition) and prints the table or --json summary
/// to `out`, writing DIR/plan.json for --out. Returns the partition. Throws Error.
PartitionResult runPartition(const CostTable &table, const PartitionCliOptions &options,
                             std::ostream &out);

/// `pipec partition --costs costs.csv ...`; argv[0] is "partition". Errors go to
/// stderr; returns 0 on success, 1 on errors, 2 on usage errors.
int runPartitionCommand(int argc, char **argv);

} // namespace pipec::partition

#endif
