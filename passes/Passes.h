// pipec's passes: declarations, registration, and the helpers the driver
// shares with them.
#ifndef PIPEC_PASSES_PASSES_H
#define PIPEC_PASSES_PASSES_H

#include "mlir/IR/BuiltinOps.h"
#include "mlir/Pass/Pass.h"

#include <memory>

namespace pipec::partition {
struct CostTable;
struct PartitionResult;
} // namespace pipec::partition

namespace pipec::passes {

#define GEN_PASS_DECL
#include "passes/Passes.h.inc"

#define GEN_PASS_REGISTRATION
#include "passes/Passes.h.inc"

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
