// What follows the pass pipeline: the job directory piperun runs
// (stage code and libraries, initial weights, and plan.json's "runtime" section).
#ifndef PIPEC_COMPILER_DRIVER_TRAININGJOB_H
#define PIPEC_COMPILER_DRIVER_TRAININGJOB_H

#include "compiler/Driver/Compiler.h"
#include "runtime/include/pipec/job_plan.h"

#include "mlir/IR/BuiltinOps.h"
#include "mlir/Support/LLVM.h"

namespace pipec {

/// Writes DIR/stages/stage_<k>.cpp (.cu for --target cuda) (+ CMakeLists.txt, and the libraries with
/// --build) and DIR/weights/stage_<k>.bin, and returns plan.json's "runtime"
/// section: how piperun runs them (stage files, data, optimizer, target). The
/// pipeline it runs (schedule, micro-batches, chunks, ...) is the planner's
/// section of the same file, not repeated here (docs/plan-json.md).
/// `initialValues` are the model's initializers (importOnnxModel's).
mlir::FailureOr<plan::Runtime>
writeTrainingJob(mlir::ModuleOp module, const CompileOptions &options,
                 const std::map<std::string, import::HostTensor> &initialValues,
                 llvm::raw_ostream &outs, llvm::raw_ostream &errs);

} // namespace pipec

#endif // PIPEC_COMPILER_DRIVER_TRAININGJOB_H
