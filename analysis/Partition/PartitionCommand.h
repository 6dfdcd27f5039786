#ifndef PIPEC_PARTITION_PARTITIONCOMMAND_H
#define PIPEC_PARTITION_PARTITIONCOMMAND_H

#include "analysis/Partition/Partitioner.h"
#include "analysis/Partition/Topology.h"
#include "analysis/Settings/Settings.h"

#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

namespace pipec::partition {

/// The topology and partition settings shared by `pipec partition`, `pipec
/// MODEL` and the pipec-partition pass, bound once (bind) to the declarations
/// of analysis/Settings/Declared.h.
struct PartitionCliOptions {
  std::string costsFile;   ///< --costs FILE (`pipec partition` only)
  std::string gpus;        ///< --gpus NxG
  std::string clusterFile; ///< --cluster FILE
  /// --device; absent: a cluster file's own device, else kDefaultDevice
  std::optional<std::string> device;
  double intraBytesPerSecond = 0, interBytesPerSecond = 0; ///< --intra-bw/--inter-bw (0: preset)
  std::string partitionFile; ///< --partition FILE
  bool json = false;         ///< --json
  std::string outDir;        ///< --out DIR
  PartitionOptions options;  ///< --stages --no-replication --memory-limit --microbatches --async --recompute
  /// --recompute[=none|all|auto]; absent: none for `pipec partition`, the
  /// planner tries auto
  std::optional<RecomputeMode> recomputeMode;
  /// --microbatches; absent: options.microbatches for `pipec partition`, the
  /// planner chooses. Given, it replaces options.microbatches in the DP.
  std::optional<int> microbatches;
  /// --host-memory: the memory of one host of CPU ranks, which the ranks of
  /// a server share (withRanksSharingHost) instead of each having the device
  /// preset's memory. The driver sets it to this machine's for a CPU job
  /// (--out with --target cpu) that does not give it.
  std::optional<int64_t> hostMemoryBytes;
  /// Where hostMemoryBytes came from, for the plan (empty: --host-memory).
  std::string hostMemoryOrigin;
  /// When nothing fits: say how much memory the least partition would need
  /// (memoryShortfall's dozen more searches). The planner, which tries many
  /// shapes, explains only the failure it reports.
  bool explainShortfall = true;

  /// The topology the flags describe (exactly one of --gpus and --cluster),
  /// with the host's memory shared by CPU ranks when hostMemoryBytes is set.
  Topology topology() const;
  /// The same without the CPU ranks' memory: the devices as declared.
  Topology declaredTopology() const;

  /// Binds every member but costsFile (`pipec partition`'s own) to its setting.
  void bind(settings::Binder &binder);
};

/// Sets the member of `options` behind `flag` ("--stages") from its text value
/// as a command line would (settings::applyArguments): "" for a bare flag, and
/// --recompute's "" means all. Throws Error naming the flag on a bad value or
/// an unknown flag. For tests and fuzzers, which speak in arguments.
void applyPartitionFlag(PartitionCliOptions &options, const std::string &flag,
                        const std::string &value);
/// The same for command-line tokens: "--stages", "2", "--async", "--recompute=auto".
void applyPartitionTokens(PartitionCliOptions &options, const std::vector<std::string> &tokens);


/// Partitions (or evaluates --partition) under the flags, recompute=auto
/// included; checks the result's invariants. Throws Error.
PartitionResult partitionWithRecompute(const CostTable &table, const Topology &topology,
                                       const PartitionCliOptions &options);

/// Partitions (or evaluates --partition) and prints the table or --json summary
/// to `out`, writing DIR/plan.json for --out. Returns the partition. Throws Error.
PartitionResult runPartition(const CostTable &table, const PartitionCliOptions &options,
                             std::ostream &out);

/// `pipec partition --costs costs.csv ...` on its filled options: reads the cost
/// table and runs runPartition, printing to `out`. Errors go to `err` as
/// "pipec partition: error: ..."; returns 0 on success, 1 on errors (a file, the
/// topology, no feasible partition), 2 when --costs is missing.
int runPartitionCommand(const PartitionCliOptions &options, std::ostream &out, std::ostream &err);

} // namespace pipec::partition

#endif
