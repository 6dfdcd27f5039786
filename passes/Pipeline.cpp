#include "passes/Pipeline.h"

#include "mlir/Pass/PassOptions.h"
#include "mlir/Pass/PassRegistry.h"

namespace pipec::passes {

namespace {
constexpr Phase kPhases[] = {Phase::NN,       Phase::Costs,  Phase::Partition,
                             Phase::Autodiff, Phase::Stages, Phase::Optimized};
} // namespace

std::optional<Phase> parsePhase(llvm::StringRef name) {
  for (Phase phase : kPhases)
    if (name == phaseName(phase))
      return phase;
  return std::nullopt;
}

const char *phaseName(Phase phase) {
  switch (phase) {
  case Phase::NN: return "nn";
  case Phase::Costs: return "costs";
  case Phase::Partition: return "partition";
  case Phase::Autodiff: return "autodiff";
  case Phase::Stages: return "stages";
  case Phase::Optimized: return "optimized";
  }
  llvm_unreachable("every phase has a name");
}

const char *phaseNames() { return "nn, costs, partition, autodiff, stages, optimized"; }

OptimizerOptions optimizerOptions(llvm::StringRef optimizer, double learningRate,
                                  double momentum, double weightDecay) {
  OptimizerOptions options;
  options.optimizer = optimizer == "adamw" ? "adamw" : "sgd";
  options.lr = learningRate;
  options.momentum =
      optimizer == "sgd-momentum" && momentum == 0.0 ? OptimizerDefaults::sgdMomentum : momentum;
  options.weightDecay = weightDecay;
  return options;
}

void buildPipecPipeline(mlir::OpPassManager &pm, const PipelineConfig &config) {
  if (config.last == Phase::NN)
    return;
  // The loss is part of the model that is costed and partitioned (it runs
  // on the last stage).
  pm.addPass(createAppendLoss(config.loss));
  pm.addPass(createEstimateCosts(config.costs));
  if (config.last == Phase::Costs)
    return;
  pm.addPass(config.planning ? createPlanning(*config.planning, config.planningResult)
                             : createAssignStages(config.partitionOptions));
  if (config.last == Phase::Partition)
    return;
  const bool optimize = config.optLevel == OptLevel::O2;
  // Before autodiff, so that the gradients of the canonical GEMMs are GEMMs
  // (batch in K, no transposed weights saved); the plan is already chosen.
  if (optimize) {
    pm.addPass(createRecognizeComposites());
    pm.addPass(createCanonicalizeGemm());
  }
  pm.addPass(createAutodiff());
  if (config.last == Phase::Autodiff)
    return;
  pm.addPass(createOptimizer(config.optimizer));
  pm.addPass(createOutlineStages());
  RecomputeOptions recompute;
  recompute.mode = "plan";
  pm.addPass(createRecompute(recompute));
  WeightStashingOptions stashing;
  stashing.fromPlan = true;
  pm.addPass(createWeightStashing(stashing));
  pm.addPass(createVerifyPipeline());
  if (config.last == Phase::Stages || !optimize)
    return;
  pm.addPass(createCanonicalizeGemm()); // the gradients' own transposes
  pm.addPass(createFuseGemmEpilogue());
  pm.addPass(createFuseElementwise());
  pm.addPass(createPlanMemory(config.memory));
}

namespace {
/// `--pipec-pipeline="..."`: pipec's flags of the same names.
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
  Option<std::string> loss{*this, "loss",
                           llvm::cl::desc("Loss for a model ending in logits: "
                                          "softmax-cross-entropy, mse"),
                           llvm::cl::init("softmax-cross-entropy")};
  Option<std::string> device{*this, "device", llvm::cl::desc("Device preset"),
                             llvm::cl::init("H100")};
  Option<std::string> precision{*this, "precision",
                                llvm::cl::desc("Matrix products: fp32, tf32 or bf16"),
                                llvm::cl::init("fp32")};
  Option<std::string> optimizer{*this, "optimizer",
                                llvm::cl::desc("adamw, sgd-momentum or sgd"),
                                llvm::cl::init("adamw")};
  Option<double> lr{*this, "lr", llvm::cl::desc("Learning rate"), llvm::cl::init(1e-3)};
  Option<double> momentum{*this, "momentum", llvm::cl::desc("SGD momentum"),
                          llvm::cl::init(0.0)};
  Option<double> weightDecay{*this, "weight-decay",
                             llvm::cl::desc("Weight decay (-1: the optimizer's default)"),
                             llvm::cl::init(-1.0)};
  Option<std::string> gpus{*this, "gpus", llvm::cl::desc("Topology: N servers x G devices"),
                           llvm::cl::init("1x1")};
  Option<int> stages{*this, "stages", llvm::cl::desc("Pipeline stages (0: the planner's)"),
                     llvm::cl::init(0)};
  Option<int> microbatches{*this, "microbatches",
                           llvm::cl::desc("Micro-batches (0: the planner's)"),
                           llvm::cl::init(0)};
  Option<bool> noReplication{*this, "no-replication",
                             llvm::cl::desc("No data-parallel stage"), llvm::cl::init(false)};
  Option<std::string> memoryLimit{*this, "memory-limit",
                                  llvm::cl::desc("Memory per device, e.g. 16GiB")};
  Option<std::string> schedule{*this, "schedule",
                               llvm::cl::desc("Schedule family (empty: the planner's)")};
  Option<int> chunks{*this, "chunks", llvm::cl::desc("Model chunks per rank (0: default)"),
                     llvm::cl::init(0)};
  Option<bool> asynchronous{*this, "async", llvm::cl::desc("PipeDream's 1F1B-RR"),
                            llvm::cl::init(false)};
  Option<bool> verticalSync{*this, "vertical-sync",
                            llvm::cl::desc("With async: vertical sync"), llvm::cl::init(false)};
  Option<std::string> recompute{*this, "recompute",
                                llvm::cl::desc("none, all or auto (empty: the planner's)")};
  Option<std::string> target{*this, "target",
                             llvm::cl::desc("Stage code target (cpu or cuda): whose kernels' scratch "
                                            "the memory plan holds"),
                             llvm::cl::init("cpu")};
};
} // namespace

void registerPipecPipeline() {
  mlir::PassPipelineRegistration<PipelineOptions>(
      "pipec-pipeline",
      "The whole compilation after import, as `pipec MODEL --gpus ... --emit=optimized` runs it: "
      "append-loss, estimate-costs, partition (the planner), [-O2: recognize-composites, "
      "canonicalize-gemm], autodiff, "
      "optimizer, outline-stages, recompute and weight-stashing as planned, verify-pipeline, "
      "[-O2: canonicalize-gemm, fuse-gemm-epilogue, fuse-elementwise, plan-memory]",
      [](mlir::OpPassManager &pm, const PipelineOptions &options) {
        PipelineConfig config;
        config.last = options.phase;
        config.optLevel = options.optLevel >= 2 ? OptLevel::O2 : OptLevel::O0;
        config.loss.loss = options.loss;
        config.costs.device = options.device;
        config.costs.precision = options.precision;
        config.costs.optimizer = options.optimizer;
        AssignStagesOptions &partition = config.partitionOptions;
        partition.gpus = options.gpus;
        partition.device = options.device;
        partition.stages = options.stages;
        partition.microbatches = options.microbatches;
        partition.noReplication = options.noReplication;
        partition.memoryLimit = options.memoryLimit;
        partition.schedule = options.schedule;
        partition.chunks = options.chunks;
        partition.asynchronous = options.asynchronous;
        partition.verticalSync = options.verticalSync;
        partition.recompute = options.recompute;
        config.optimizer =
            optimizerOptions(options.optimizer, options.lr, options.momentum, options.weightDecay);
        config.memory.target = options.target;
        buildPipecPipeline(pm, config);
      });
}

} // namespace pipec::passes
