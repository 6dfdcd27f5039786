// The job directory piperun runs, written from the module alone: what the
// pass pipeline left on it (pipec-partition's pipe.plan_file and
// pipe.schedule, the stages with their memory plans, the optimizer's
// pipe.optimizer) and the model's initial weights (docs/layers.md, "The job
// as a product of the pipeline"). `pipec MODEL --out DIR` and the
// `pipec-write-job` pass both call it.
#ifndef PIPEC_COMPILER_DRIVER_WRITEJOB_H
#define PIPEC_COMPILER_DRIVER_WRITEJOB_H

#include "compiler/Driver/JobOptions.h"
#include "compiler/Import/OnnxImporter.h"

#include "mlir/IR/BuiltinOps.h"
#include "mlir/Support/LLVM.h"

#include <memory>
#include <string>

namespace mlir {
class Pass;
}

namespace pipec {

/// Writes DIR/plan.json, DIR/schedule/, DIR/stages/stage_<k>.cpp (.cu for
/// the cuda target; + CMakeLists.txt, and the libraries with `build`) and
/// DIR/weights/stage_<k>.bin. `initialValues` reads the model's
/// initializers one at a time (import::InitializerReader). Errors (a module the pipeline did not
/// plan, a memory plan for another target, a file that cannot be written)
/// go to `errs`; the one-line summary of what was written to `outs`.
mlir::LogicalResult writeJob(mlir::ModuleOp module, const std::string &directory, const JobOptions &options,
                             import::InitializerReader &initialValues, llvm::raw_ostream &outs, llvm::raw_ostream &errs);

/// `pipec-write-job`'s options: out=DIR and the settings of JobOptions
/// (build, target=..., precision=..., cuda-arch=..., seed=...).
struct WriteJobOptions {
  std::string outDir;
  JobOptions job;
  void bind(settings::Binder &binder);
};
/// `pipec-write-job`: writeJob on the module, the initial weights read from
/// the model file the importer recorded (nn.source).
std::unique_ptr<mlir::Pass> createWriteJob(const WriteJobOptions &options = {});
/// Registers `pipec-write-job` (pipec-opt).
void registerWriteJobPass();

} // namespace pipec

#endif // PIPEC_COMPILER_DRIVER_WRITEJOB_H
