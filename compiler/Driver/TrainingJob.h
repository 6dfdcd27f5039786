// The phases after the partition: the training program and the job
// directory piperun runs (plan.json's "runtime" section, stage code and
// libraries, initial weights).
#ifndef PIPEC_COMPILER_DRIVER_TRAININGJOB_H
#define PIPEC_COMPILER_DRIVER_TRAININGJOB_H

#include "compiler/Driver/Compiler.h"

#include "mlir/IR/BuiltinOps.h"

#include <nlohmann/json_fwd.hpp>

namespace pipec {

/// pipec-append-loss: the loss is part of the model that is costed and
/// partitioned (it runs on the last stage).
mlir::LogicalResult appendLoss(mlir::ModuleOp module, const CompileOptions &options);

/// pipec-autodiff: @train_step with B and W split.
mlir::LogicalResult deriveTrainStep(mlir::ModuleOp module, const CompileOptions &options);

/// pipec-optimizer, pipec-outline-stages, and pipec-recompute /
/// pipec-weight-stashing as the partition asks.
mlir::LogicalResult outlineStages(mlir::ModuleOp module, const CompileOptions &options,
                                  const partition::PartitionResult &result);

/// Checks --target, --cuda-arch and, with --build, that this pipec can
/// build for them (errors name the flag). Runs before anything else.
mlir::LogicalResult checkTargetOptions(const CompileOptions &options, llvm::raw_ostream &errs);

/// Writes DIR/stages/stage_<k>.cpp (.cu for --target cuda) (+ CMakeLists.txt, and the libraries with
/// --build), DIR/weights/stage_<k>.bin, and adds "runtime" to `plan`.
mlir::LogicalResult writeTrainingJob(mlir::ModuleOp module, const CompileOptions &options,
                                     const partition::PartitionResult &result,
                                     nlohmann::json &plan, llvm::raw_ostream &outs,
                                     llvm::raw_ostream &errs);

} // namespace pipec

#endif // PIPEC_COMPILER_DRIVER_TRAININGJOB_H
