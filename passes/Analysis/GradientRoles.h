// Which values of a function carry gradients, and of which kind. Shared by
// the cost model (which gradient is B or W work) and autodiff (which
// gradients to build and where they belong).
#ifndef PIPEC_PASSES_ANALYSIS_GRADIENTROLES_H
#define PIPEC_PASSES_ANALYSIS_GRADIENTROLES_H

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "llvm/ADT/DenseSet.h"

namespace pipec::passes {

/// Values computed from trained parameters and constants only are
/// "weight-derived": their gradients are weight gradients (W). Other values
/// that depend on a parameter need input gradients (B) so that gradients
/// reach the parameters. Values depending on no parameter (the model's
/// inputs and what is computed from them alone) need no gradient.
struct GradientRoles {
  llvm::DenseSet<mlir::Value> weightDerived, dependsOnParameter;

  explicit GradientRoles(mlir::func::FuncOp function);

  bool needsGradient(mlir::Value value) const { return dependsOnParameter.contains(value); }
  bool isWeightGradient(mlir::Value value) const { return weightDerived.contains(value); }
};

} // namespace pipec::passes

#endif // PIPEC_PASSES_ANALYSIS_GRADIENTROLES_H
