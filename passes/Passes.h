// pipec's passes: declarations, registration, and the helpers the driver
// shares with them.
#ifndef PIPEC_PASSES_PASSES_H
#define PIPEC_PASSES_PASSES_H

#include "analysis/Planner/Planner.h"
#include "runtime/include/pipec/vocabulary.h" // OptimizerDefaults in the options

#include "mlir/IR/BuiltinOps.h"
#include "mlir/Pass/Pass.h"

#include <memory>

namespace pipec::passes {

#define GEN_PASS_DECL
#include "passes/Passes.h.inc"

#define GEN_PASS_REGISTRATION
#include "passes/Passes.h.inc"

/// What pipec-partition decided, in full, for the driver: it prints the plan,
/// writes the schedule streams and plan.json. The module records the part
/// the later passes follow (pipe.stage, pipe.stages, pipe.plan).
struct PlanningResult {
  partition::CostTable table;
  partition::Topology topology;
  planner::Plan plan;
};

/// pipec-partition on a request built by the driver from every planner flag
/// (the textual options cover the common ones); fills `result` if given.
std::unique_ptr<mlir::Pass> createPlanning(const planner::Request &request,
                                           PlanningResult *result);

/// The cost table of a module annotated by pipec-estimate-costs: one row per
/// costed op in program order, with its producers. Fails (with an error on
/// the module) when an nn op has no cost.
mlir::FailureOr<partition::CostTable> costTableFromModule(mlir::ModuleOp module);

/// Rows of that table that read the same parameter, as [first, last] row
/// ranges (a parameter read by one op has none): cutting inside one puts a
/// parameter in two stages (tied weights).
std::vector<std::pair<int, int>> tiedParameterRanges(mlir::ModuleOp module);

/// Records a partition on the module: `pipe.stage` on every costed op and
/// `pipe.stages` on the module (op ranges by name, replicas, ranks).
void annotateStages(mlir::ModuleOp module, const partition::CostTable &table,
                    const partition::PartitionResult &result);

} // namespace pipec::passes

#endif // PIPEC_PASSES_PASSES_H
