// What follows the pass pipeline: the job directory piperun runs
// (plan.json's "runtime" section, stage code and libraries, initial weights).
#ifndef PIPEC_COMPILER_DRIVER_TRAININGJOB_H
#define PIPEC_COMPILER_DRIVER_TRAININGJOB_H

#include "compiler/Driver/Compiler.h"
#include "analysis/Planner/Planner.h"

#include "mlir/IR/BuiltinOps.h"

#include <nlohmann/json_fwd.hpp>

namespace pipec {

/// Checks --target, --cuda-arch and, with --build, that this pipec can
/// build for them (errors name the flag). Runs before anything else.
mlir::LogicalResult checkTargetOptions(const CompileOptions &options, llvm::raw_ostream &errs);

/// Writes DIR/stages/stage_<k>.cpp (.cu for --target cuda) (+ CMakeLists.txt, and the libraries with
/// --build), DIR/weights/stage_<k>.bin, and adds "runtime" to `plan`.
/// `chosen` is the planner's plan; its typed fields (schedule, chunks,
/// placement, micro-batches) are what the "runtime" section repeats.
mlir::LogicalResult writeTrainingJob(mlir::ModuleOp module, const CompileOptions &options,
                                     const planner::Candidate &chosen, nlohmann::json &plan,
                                     llvm::raw_ostream &outs, llvm::raw_ostream &errs);

} // namespace pipec

#endif // PIPEC_COMPILER_DRIVER_TRAININGJOB_H
