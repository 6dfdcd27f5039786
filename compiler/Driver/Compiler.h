// The compiler's phases in order and the one function that runs them; the
// `pipec` tool is a thin command line around it.
#ifndef PIPEC_COMPILER_DRIVER_COMPILER_H
#define PIPEC_COMPILER_DRIVER_COMPILER_H

#include "compiler/Driver/JobOptions.h"
#include "compiler/Import/OnnxImporter.h"
#include "analysis/Partition/PartitionCommand.h"
#include "passes/Pipeline.h"

#include <optional>
#include <string>
#include <vector>

namespace llvm {
class raw_ostream;
}

namespace pipec {

/// The pipeline's phases (passes/Pipeline.h); `--emit=<phase>` stops after
/// one and prints its IR. The schedule is chosen with the partition (it
/// changes no IR but pipe.plan); its streams and timeline go to --out DIR/schedule.
using passes::Phase;
using passes::parsePhase;
using passes::phaseName;

struct CompileOptions {
  std::string inputPath;
  import::ImportOptions importOptions;
  /// Print the IR after this phase and stop; none prints the summary.
  std::optional<Phase> emit;
  /// Where to write the IR after every pass (NN-<pass>.mlir), if set.
  std::string dumpIrDirectory;
  /// Output file for --emit ("-" is standard output).
  std::string outputPath = "-";
  /// Elide constants with more elements than this when printing (0 = never).
  int64_t elideConstantsLargerThan = 0;
  /// Print each op's location (the ONNX node it came from) with the IR.
  bool printLocations = false;

  /// Cost model (pipec-estimate-costs: device, precision, optimizer, profile,
  /// --dump-costs).
  passes::EstimateCostsOptions costs;
  /// The planner's request: topology and partition flags (--gpus, --cluster,
  /// --stages, ... --out, --json), --schedule (empty: the planner searches
  /// every synchronous family, 1f1b-rr with --async), --chunks, --vertical-sync,
  /// --candidates and --plan-rank.
  planner::Request planning;
  const partition::PartitionCliOptions &partition() const { return planning.partition; }

  /// Training (the phases after the partition; code is written to --out DIR).
  passes::AppendLossOptions loss;
  /// pipec-optimizer: the optimizer (the same setting as costs.optimizer),
  /// learning rate, momentum, weight decay.
  passes::OptimizerOptions optimizer;
  /// -O0 or -O2 (passes/Pipeline.h).
  passes::OptLevel optLevel = passes::OptLevel::O2;
  /// How the job is written with --out DIR: --build, --target, --precision
  /// (the cost model's too), --cuda-arch, --seed.
  JobOptions job;
  bool cudaTarget() const { return job.cudaTarget(); }
  /// --each-candidate: one search, the job of every printed plan in
  /// DIR/plan-K (docs/planner.md); refused with --plan-rank (planning.rank).
  bool eachCandidate = false;
  /// True when a topology was given: the partition phase runs.
  bool partitionRequested() const {
    return !partition().gpus.empty() || !partition().clusterFile.empty();
  }

  /// Binds the settings of the cost model, the planner (its partition
  /// settings included), the optimizer and the job writer.
  void bind(settings::Binder &binder);
};

/// Runs the compiler; errors go to `errs` as one paragraph each. Returns the
/// process exit code.
int runCompiler(const CompileOptions &options, llvm::raw_ostream &outs, llvm::raw_ostream &errs);

} // namespace pipec

#endif // PIPEC_COMPILER_DRIVER_COMPILER_H
