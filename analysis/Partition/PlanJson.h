#ifndef PIPEC_PARTITION_PLANJSON_H
#define PIPEC_PARTITION_PLANJSON_H

#include "analysis/Partition/Partitioner.h"
#include "runtime/include/pipec/job_plan.h"

#include <nlohmann/json_fwd.hpp>

#include <iosfwd>
#include <string>
#include <vector>

namespace pipec::partition {

/// plan.json's typed content for a partition (docs/plan-json.md): pipeline
/// (micro-batches, asynchronous), topology, partition, stages, op_order and
/// predictions; the planner and the driver fill the rest
/// (planner::planFile, compiler/Driver/WriteJob.cpp).
plan::PlanFile planFile(const CostTable &table, const Topology &topology,
                        const PartitionResult &result);
/// plan::toJson(planFile(...)): the partition-only plan.json of `pipec partition --out`.
nlohmann::json planToJson(const CostTable &table, const Topology &topology,
                          const PartitionResult &result);
/// The summary `--json` prints: predictions, partition (with micro-batches and
/// asynchronous) and stages, without the topology. Not plan.json.
nlohmann::json summaryToJson(const CostTable &table, const PartitionResult &result);
/// Writes `plan` to DIR/plan.json (creating DIR). Throws Error on I/O failure.
void writePlanFile(const nlohmann::json &plan, const std::string &directory);

/// Stages read from a plan file, with the op order their op indices count in
/// (empty: the table's own order).
struct StageSpecs {
  std::vector<StageSpec> stages;
  std::vector<int> opOrder;
};
/// Reads the "stages" of a plan.json (or a file holding only {"stages": [...]}):
/// each stage names its ops by "first_op"/"last_op" (names) or
/// "first_op_index"/"last_op_index", its "replicas", and optionally "ranks".
/// An "op_order" (every op name once, a topological order) makes the ranges
/// count in that order, as a plan cut at antichains writes it.
StageSpecs readStageSpecs(std::istream &in, const std::string &fileName, const CostTable &table);
StageSpecs readStageSpecsFile(const std::string &path, const CostTable &table);

/// The human-readable table: one row per stage, then the predictions.
/// A time as the plan prints it: 3 significant digits in us, ms or s ("0" for zero).
std::string formatSeconds(double seconds);

void printPlanTable(std::ostream &os, const CostTable &table, const Topology &topology,
                    const PartitionResult &result);

} // namespace pipec::partition

#endif
