#include "passes/Pipeline.h"
#include "analysis/Settings/Declared.h"
#include "passes/OptionsBinder.h"

#include "mlir/Pass/PassOptions.h"
#include "mlir/Pass/PassRegistry.h"

namespace pipec::passes {

void buildPipecPipeline(mlir::OpPassManager &pm, const PipelineConfig &config) {
  if (config.last == Phase::NN)
    return;
  // The loss is part of the model that is costed and partitioned (it runs
  // on the last stage).
  pm.addPass(createAppendLoss(config.loss));
  const bool optimize = config.optLevel == OptLevel::O2;
  const bool bf16Storage = config.memory.target == Target::Cuda && config.costs.precision == Precision::BF16;
  EstimateCostsOptions costs = config.costs;
  costs.optimized = optimize;
  costs.bf16Storage = bf16Storage;
  pm.addPass(createEstimateCosts(costs));
  if (config.last == Phase::Costs)
    return;
  pm.addPass(createPlanning(config.planning, config.planningResult, config.ranking));
  if (config.last == Phase::Partition)
    return;
  // Before autodiff, so that the gradients of the canonical GEMMs are GEMMs
  // (batch in K, no transposed weights saved); the plan is already chosen.
  if (optimize) {
    pm.addPass(createRecognizeComposites());
    pm.addPass(createCanonicalizeGemm());
    if (bf16Storage) // cuBLAS's bf16 GEMMs want no odd dimension
      pm.addPass(createPadClasses());
    // cuDNN's fast convolution engines take channels-last tensors; in F32
    // the convolutions run on pipec's channels-first kernels.
    if (config.memory.target == Target::Cuda && config.costs.precision != Precision::F32)
      pm.addPass(createChannelsLast());
  }
  pm.addPass(createAutodiff());
  if (config.last == Phase::Autodiff)
    return;
  pm.addPass(createOptimizer(config.optimizer));
  pm.addPass(createOutlineStages());
  RecomputeOptions recompute;
  recompute.mode = choiceName(RecomputeMode::Auto);
  pm.addPass(createRecompute(recompute));
  WeightStashingOptions stashing;
  stashing.fromPlan = true;
  pm.addPass(createWeightStashing(stashing));
  pm.addPass(createVerifyPipeline());
  if (config.last == Phase::Stages)
    return;
  if (optimize) {
    pm.addPass(createCanonicalizeGemm()); // the gradients' own transposes
    // Before the epilogues: an activation it recomputes in a later phase
    // must still be an op; the forward's then fuses with its GEMM.
    pm.addPass(createRecomputeElementwise()); // before fusion, which may then fuse the recomputed op
    pm.addPass(createFuseGemmEpilogue(FuseGemmEpilogueOptions{config.memory.target}));
    pm.addPass(createFuseNormEpilogue());
    pm.addPass(createFuseElementwise());
  }
  // After fusion, whose loops load and store either storage; before the
  // memory plan, which sizes values by their element type.
  if (bf16Storage)
    pm.addPass(createBf16Storage());
  // After bf16 storage, whose conversions would stand between a loop and
  // its norm; before the memory plan, which places the joined pair as one
  // kernel.
  if (optimize && config.memory.target == Target::Cuda)
    pm.addPass(createFuseNormLoops());
  if (optimize)
    pm.addPass(createPlanMemory(config.memory));
}

namespace {
/// `--pipec-pipeline="..."`: pipec's settings of the same names, bound to the
/// same declarations (analysis/Settings/Declared.h), plus where to stop.
struct PipelineOptions : mlir::PassPipelineOptions<PipelineOptions> {
  Option<Phase> phase{
      *this, "phase", llvm::cl::desc("Stop after this phase"), llvm::cl::init(Phase::Stages),
      llvm::cl::values(clEnumValN(Phase::Costs, "costs", "costs annotated"),
                       clEnumValN(Phase::Partition, "partition", "the plan recorded"),
                       clEnumValN(Phase::Autodiff, "autodiff", "@train_step derived"),
                       clEnumValN(Phase::Stages, "stages", "one pipe.stage per stage"),
                       clEnumValN(Phase::Optimized, "optimized",
                                  "as code generation takes them (-O2: fused, memory planned)"))};
  Option<int> optLevel{*this, "opt-level",
                       llvm::cl::desc("0: one kernel per op; 2: GEMM canonicalisation, fusion, "
                                      "memory plan (pipec's -O2)"),
                       llvm::cl::init(2)};

  PipelineOptions() : binder(*this) {
    config.planning = defaultPlanningRequest();
    config.loss.bind(binder);
    config.costs.bind(binder);
    config.planning.bind(binder);
    config.optimizer.bind(binder);
    config.memory.bind(binder);
  }

  /// The configuration with the given options applied. Throws SettingError.
  PipelineConfig resolve() const {
    binder.apply();
    PipelineConfig resolved = config;
    resolved.last = phase;
    resolved.optLevel = optLevel >= 2 ? OptLevel::O2 : OptLevel::O0;
    return resolved;
  }

private:
  PipelineConfig config; // the binder's fields
  OptionsBinder binder;
};
} // namespace

void registerPipecPipeline() {
  // The registry keeps a reference to the description: it lives as long.
  static const std::string description =
      "The whole compilation after import, as `pipec MODEL " + settings::flag(settings::kGpus) +
      " ... --emit=optimized` runs it: append-loss, estimate-costs, partition (the planner), [-O2: "
      "recognize-composites, canonicalize-gemm, [target=cuda precision=bf16: pad-classes], [target=cuda precision=tf32 "
      "or bf16: channels-last]], autodiff, optimizer, outline-stages, recompute and weight-stashing "
      "as planned, verify-pipeline, [-O2: canonicalize-gemm, recompute-elementwise, fuse-gemm-epilogue, "
      "fuse-norm-epilogue, fuse-elementwise], [target=cuda precision=bf16: bf16-storage], [-O2 target=cuda: "
      "fuse-norm-loops], [-O2: plan-memory]";
  mlir::registerPassPipeline(
      "pipec-pipeline", description,
      [](mlir::OpPassManager &pm, llvm::StringRef text,
         llvm::function_ref<mlir::LogicalResult(const llvm::Twine &)> errorHandler) {
        PipelineOptions options;
        std::string parseErrors;
        llvm::raw_string_ostream parseStream(parseErrors);
        if (mlir::failed(options.parseFromString(text, parseStream)))
          return errorHandler(llvm::Twine("pipec-pipeline: ") + parseErrors);
        try {
          buildPipecPipeline(pm, options.resolve());
        } catch (const settings::SettingError &error) {
          return errorHandler(llvm::Twine("pipec-pipeline: ") + error.what());
        }
        return mlir::success();
      },
      [](llvm::function_ref<void(const mlir::detail::PassOptions &)> optionHandler) {
        optionHandler(PipelineOptions());
      });
}

} // namespace pipec::passes
