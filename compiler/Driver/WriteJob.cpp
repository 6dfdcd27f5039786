#include "compiler/Driver/WriteJob.h"
#include "compiler/Driver/JobProgress.h"
#include "compiler/Driver/JobWeights.h"
#include "compiler/Driver/StageBuild.h"

#include "analysis/Partition/Error.h"
#include "analysis/Partition/PlanJson.h"
#include "analysis/Schedule/Schedule.h"
#include "analysis/Settings/Declared.h"
#include "compiler/Emit/EmitStage.h"
#include "compiler/Import/OnnxImporter.h"
#include "dialects/nn/NNDialect.h"
#include "dialects/pipe/PipeDialect.h"
#include "passes/JsonResource.h"
#include "passes/OptionsBinder.h"
#include "runtime/include/pipec/job_plan.h"
#include "runtime/include/pipec/vocabulary.h" // isCudaArchitecture

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Pass/Pass.h"
#include "mlir/Pass/PassRegistry.h"
#include "llvm/Support/raw_ostream.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <limits>

using namespace mlir;
namespace fs = std::filesystem;

namespace pipec {

void WriteJobOptions::bind(settings::Binder &b) {
  b.text(settings::kOut, outDir);
  job.bind(b);
}

void JobOptions::bind(settings::Binder &b) {
  b.flag(settings::kBuild, build);
  b.choice(settings::kTarget, target);
  b.choice(settings::kPrecision, precision);
  b.onText(settings::kCudaArch, [this](const std::string &list) {
    std::vector<std::string> archs;
    for (llvm::StringRef rest = list; !rest.empty();) {
      auto [arch, tail] = rest.split(',');
      rest = tail;
      if (arch.trim().empty())
        continue;
      if (!isCudaArchitecture(arch.trim()))
        throw settings::SettingError("'" + arch.trim().str() + "' is not an architecture like " +
                                     kCudaArchitectureExamples);
      archs.push_back(arch.trim().str());
    }
    if (archs.empty())
      throw settings::SettingError("names no architecture (e.g. sm_80,sm_90)");
    cudaArchs = std::move(archs);
  });
  b.unsigned64(settings::kSeed, seed);
}

namespace {

/// The values of a data field for the synthetic data set: indices into an
/// embedding take its rows, labels the loss's classes.
std::pair<double, double> valueRange(func::FuncOp forward, BlockArgument field) {
  for (Operation *user : field.getUsers()) {
    if (auto gather = llvm::dyn_cast<nn::GatherOp>(user); gather && gather.getIndices() == field)
      return {0, static_cast<double>(gather.getData().getType().getDimSize(
                     *nn::normalizeAxis(gather.getAxis(), gather.getData().getType().getRank())))};
    if (auto reshape = llvm::dyn_cast<nn::ReshapeOp>(user))
      for (Operation *next : reshape.getResult().getUsers())
        if (auto loss = llvm::dyn_cast<nn::SoftmaxCrossEntropyLossOp>(next))
          return {0, static_cast<double>(loss.getScores().getType().getDimSize(1))};
    if (auto loss = llvm::dyn_cast<nn::SoftmaxCrossEntropyLossOp>(user))
      return {0, static_cast<double>(loss.getScores().getType().getDimSize(1))};
  }
  if (llvm::isa<FloatType>(llvm::cast<ShapedType>(field.getType()).getElementType()))
    return {-1, 1};
  return {0, 2};
}

/// A document pipec-partition left on the module, or an error naming it.
FailureOr<nlohmann::json> documentOnModule(ModuleOp module, StringRef name, raw_ostream &errs) {
  Attribute attribute = module->getAttr(name);
  if (!attribute) {
    errs << "error: the module has no " << name
         << ": a job is written from a module planned by pipec-partition and outlined into stages\n";
    return failure();
  }
  std::string problem;
  FailureOr<nlohmann::json> document = passes::jsonFromResource(attribute, problem);
  if (failed(document))
    errs << "error: " << name << ": " << problem << "\n";
  return document;
}

/// plan.json's pipeline section from the planner's choices on the module
/// (#pipe.plan, which the passes after the partition follow): its one source,
/// so that the job's file and the IR cannot disagree (pipe.plan_file leaves
/// the section out).
FailureOr<plan::Pipeline> pipelineOnModule(ModuleOp module, raw_ostream &errs) {
  auto chosen = module->getAttrOfType<pipe::PlanAttr>(pipe::kPlanAttrName);
  if (!chosen) {
    errs << "error: the module has no " << pipe::kPlanAttrName
         << ": a job is written from a module planned by pipec-partition and outlined into stages\n";
    return failure();
  }
  if (chosen.getMicrobatches() > std::numeric_limits<int>::max() || chosen.getChunks() > std::numeric_limits<int>::max()) {
    errs << "error: " << pipe::kPlanAttrName << ": microbatches and chunks must be below 2^31\n";
    return failure();
  }
  plan::Pipeline pipeline;
  pipeline.schedule = chosen.getSchedule();
  pipeline.microbatches = static_cast<int>(chosen.getMicrobatches());
  pipeline.asynchronous = chosen.getAsynchronous();
  pipeline.chunks = static_cast<int>(chosen.getChunks());
  pipeline.placement = chosen.getPlacement();
  return pipeline;
}

/// The optimizer pipec-optimizer recorded on the stages' step functions.
FailureOr<pipe::OptimizerAttr> optimizerOnModule(ModuleOp module, raw_ostream &errs) {
  pipe::OptimizerAttr found;
  module.walk([&](func::FuncOp function) {
    if (!found)
      found = function->getAttrOfType<pipe::OptimizerAttr>(pipe::kOptimizerAttrName);
  });
  if (!found) {
    errs << "error: no function of the module has a pipe.optimizer: a job is written after pipec-optimizer\n";
    return failure();
  }
  return found;
}

/// The stage code, its build files and libraries, the initial weights, and
/// plan.json's runtime section that names them (how piperun runs the
/// stages: files, data, optimizer, target). `gpu` is the planner's device.
FailureOr<plan::Runtime> writeStagesAndWeights(ModuleOp module, const fs::path &directory, const JobOptions &options,
                                               const std::string &gpu,
                                               import::InitializerReader &initial, raw_ostream &errs) {
  FailureOr<pipe::OptimizerAttr> optimizer = optimizerOnModule(module, errs);
  if (failed(optimizer))
    return failure();
  plan::Runtime runtime;
  std::error_code error;
  fs::create_directories(directory / "stages", error);
  fs::create_directories(directory / "weights", error);
  if (error) {
    errs << "error: cannot create " << directory.string() << ": " << error.message() << "\n";
    return failure();
  }

  SmallVector<pipe::StageOp> stages(module.getOps<pipe::StageOp>());
  if (stages.empty()) {
    errs << "error: the module has no pipe.stage: a job is written after pipec-outline-stages\n";
    return failure();
  }
  std::string cmake = stagesCMakePrologue(options);
  emit::StageTarget stageTarget;
  stageTarget.target = options.target;
  stageTarget.precision = options.precision;
  const std::string extension = options.cudaTarget() ? ".cu" : ".cpp";
  std::vector<uint64_t> weightBytes;
  for (pipe::StageOp stage : stages)
    weightBytes.push_back(stageWeightBytes(stage));
  JobProgress progress(llvm::errs(), llvm::errs().is_displayed(), static_cast<int>(stages.size()),
                       std::accumulate(weightBytes.begin(), weightBytes.end(), uint64_t(0)));
  for (auto [index, stage] : llvm::enumerate(stages)) {
    int64_t id = stage.getId();
    std::string stem = "stage_" + std::to_string(id);
    progress.beginStage(stem, weightBytes[index]);
    fs::path source = directory / "stages" / (stem + extension);
    stageTarget.constantsFile = stem + ".constants.bin";
    {
      std::string code, constantBytes;
      llvm::raw_string_ostream stream(code);
      if (failed(emit::emitStage(stage, static_cast<int>(stages.size()), stageTarget, stream,
                                 &constantBytes)))
        return failure();
      std::ofstream(source) << code;
      progress.emitted(code.size());
      // Always written (maybe empty), so the build's dependency on it holds.
      std::ofstream(directory / "stages" / stageTarget.constantsFile, std::ios::binary)
          << constantBytes;
    }
    cmake += stageCMakeTarget(options, stem, extension, stageTarget.constantsFile);

    // Initial weights: every parameter and buffer the stage's functions read.
    if (failed(writeStageWeights(stage, initial, directory / "weights" / (stem + ".bin"), errs,
                                 [&](uint64_t bytes) { progress.wrote(bytes); })))
      return failure();
    plan::StageFiles files;
    files.id = id;
    files.library = "stages/lib" + stem + ".so";
    files.weights = "weights/" + stem + ".bin";
    // The static memory plan, as pipec-plan-memory recorded it (-O2 only).
    stage.walk([&](func::FuncOp function) {
      if (auto size = function->getAttrOfType<IntegerAttr>(pipe::kArenaSizeAttrName)) {
        files.entryArenaBytes[function.getSymName().str()] = size.getInt();
        files.arenaBytes = std::max<int64_t>(files.arenaBytes.value_or(0), size.getInt());
        files.scratchBytes = files.scratchBytes.value_or(0);
      }
      if (auto size = function->getAttrOfType<IntegerAttr>(pipe::kThreadScratchSizeAttrName))
        files.threadScratchBytes = std::max<int64_t>(files.threadScratchBytes.value_or(0), size.getInt());
    });
    stage.walk([&](Operation *op) {
      if (auto place = op->getAttrOfType<DenseI64ArrayAttr>(pipe::kScratchAttrName); place && place.size() == 2)
        files.scratchBytes = std::max<int64_t>(files.scratchBytes.value_or(0), place[1]);
    });
    runtime.stages.push_back(std::move(files));
    if (options.build) {
      progress.building();
      if (failed(buildStage(options, directory, source, directory / "stages" / ("lib" + stem + ".so"), errs)))
        return failure();
    }
    progress.endStage();
  }
  std::ofstream(directory / "stages" / "CMakeLists.txt") << cmake;

  // The data set: the model's inputs and labels, one sample each.
  auto train = module.lookupSymbol<func::FuncOp>("forward");
  if (!train) {
    errs << "error: the module has no @forward function (the imported model)\n";
    return failure();
  }
  for (BlockArgument argument : train.getArguments()) {
    std::optional<nn::Role> role = nn::argumentRole(train, argument.getArgNumber());
    if (role != nn::Role::Input && role != nn::Role::Label)
      continue;
    auto type = llvm::cast<RankedTensorType>(argument.getType());
    auto [low, high] = valueRange(train, argument);
    std::vector<int64_t> sample(type.getShape().begin() + (type.getRank() ? 1 : 0),
                                type.getShape().end());
    runtime.dataFields.push_back(
        {train.getArgAttrOfType<StringAttr>(argument.getArgNumber(), nn::kNameAttrName).str(),
         abiDtype(type.getElementType()).name, sample, low, high,
         role == nn::Role::Label ? DataRole::Label : DataRole::Input});
  }
  // Parameters held by several stages (tied weights): the runtime sums their
  // partial gradients over the holders before the step (docs/stages.md).
  std::map<std::string, std::vector<int64_t>> tied;
  module.walk([&](pipe::AllReduceOp reduce) {
    auto stagesAttr = reduce->getAttrOfType<DenseI64ArrayAttr>("stages");
    auto nameAttr = reduce->getAttrOfType<StringAttr>("name");
    if (stagesAttr && nameAttr)
      tied[nameAttr.str()] = std::vector<int64_t>(stagesAttr.asArrayRef().begin(),
                                                  stagesAttr.asArrayRef().end());
  });
  for (const auto &[name, holders] : tied)
    runtime.tied.push_back({name, holders});
  runtime.microbatchSize = nn::microbatchSize(train).value_or(0);
  runtime.seed = options.seed;
  // The stage libraries run AdamW's or SGD's update with the values
  // pipec-optimizer recorded; SGD's momentum is a number.
  runtime.optimizer.rule = optimizer->getKind() == pipe::OptimizerKind::AdamW ? Optimizer::AdamW : Optimizer::Sgd;
  runtime.optimizer.lr = optimizer->getLr().convertToDouble();
  runtime.optimizer.weightDecay = optimizer->getWeightDecay().convertToDouble();
  runtime.optimizer.momentum = optimizer->getMomentum().convertToDouble();
  runtime.target = options.target;
  runtime.precision = options.cudaTarget() ? options.precision : Precision::F32;
  if (options.cudaTarget()) {
    runtime.cudaArch = options.cudaArchs;
    runtime.gpu = gpu;
  }
  return runtime;
}

} // namespace

LogicalResult writeJob(ModuleOp module, const std::string &directoryName, const JobOptions &options,
                       import::InitializerReader &initialValues, raw_ostream &outs, raw_ostream &errs) {
  if (directoryName.empty()) {
    errs << "error: the job writer needs a directory (out=DIR)\n";
    return failure();
  }
  FailureOr<nlohmann::json> planDocument = documentOnModule(module, pipe::kPlanFileAttrName, errs);
  if (failed(planDocument))
    return failure();
  FailureOr<nlohmann::json> scheduleDocument = documentOnModule(module, pipe::kScheduleAttrName, errs);
  if (failed(scheduleDocument))
    return failure();
  FailureOr<plan::Pipeline> pipeline = pipelineOnModule(module, errs);
  if (failed(pipeline))
    return failure();
  // The memory plan reserved the scratch of one target's kernels: the code
  // must be written for that target (-O0 has no memory plan).
  if (auto planned = module->getAttrOfType<StringAttr>(pipe::kMemoryTargetAttrName)) {
    Target plannedTarget;
    if (!parseChoice(planned.getValue(), plannedTarget) || plannedTarget != options.target) {
      errs << "error: the memory plan was made for target " << planned.getValue() << ", the job is for "
           << choiceName(options.target) << ": give pipec-plan-memory and the job writer the same target\n";
      return failure();
    }
  }
  plan::PlanFile planFile;
  schedule::Schedule chosen;
  try {
    const json_io::Reader<partition::Error> reader{"the module's " + pipe::kPlanFileAttrName.str()};
    nlohmann::json document = *planDocument;
    document["pipeline"] = plan::toJson(*pipeline);
    planFile = plan::fromJson<plan::PlanFile>(reader, document);
    chosen = schedule::fromJson(scheduleDocument->dump());
  } catch (const std::exception &error) {
    errs << "error: " << error.what() << "\n";
    return failure();
  }

  fs::path directory = directoryName;
  try {
    // Streams are numbered by schedule rank (stage-major); piperun maps
    // them to MPI ranks through the plan's stages (docs/runtime.md).
    schedule::writeScheduleDir(chosen, schedule::simulate(chosen), (directory / "schedule").string());
  } catch (const std::exception &error) {
    errs << "error: " << directory.string() << ": " << error.what() << "\n";
    return failure();
  }
  FailureOr<plan::Runtime> runtime =
      writeStagesAndWeights(module, directory, options, planFile.topology.device, initialValues, errs);
  if (failed(runtime))
    return failure();
  planFile.runtime = std::move(*runtime);
  try {
    // plan.json: the planner's document with the runtime section, through
    // the one schema (pipec/job_plan.h, docs/plan-json.md).
    partition::writePlanFile(plan::toJson(planFile), directory.string());
  } catch (const partition::Error &error) {
    errs << "error: " << error.what() << "\n";
    return failure();
  }
  const size_t stageCount = planFile.runtime->stages.size();
  outs << "wrote " << directory.string() << ": plan.json, schedule/, " << stageCount << " stage"
       << (stageCount == 1 ? "" : "s") << " in stages/" << (options.build ? " (built)" : "") << ", weights/\n";
  return success();
}

namespace {

/// pipec-write-job (WriteJob.h): the job from the module, the initial
/// weights from its model file.
struct WriteJobPass
    : passes::PassWithOptions<PassWrapper<WriteJobPass, OperationPass<ModuleOp>>, WriteJobOptions> {
  MLIR_DEFINE_EXPLICIT_INTERNAL_INLINE_TYPE_ID(WriteJobPass)
  using PassWithOptions::PassWithOptions;

  StringRef getArgument() const override { return "pipec-write-job"; }
  StringRef getDescription() const override {
    return "Write the job directory piperun runs (plan.json, schedule/, stages/, weights/) from a module the "
           "pipeline planned and outlined; the initial weights come from the model file named by nn.source";
  }

  void runOnOperation() override {
    ModuleOp module = getOperation();
    FailureOr<WriteJobOptions> given = options();
    if (failed(given))
      return signalPassFailure();
    auto source = module->getAttrOfType<StringAttr>(nn::kSourceAttrName);
    if (!source) {
      module.emitError() << "the module names no model file (" << nn::kSourceAttrName
                         << "), where the initial weights are: import it with pipec";
      return signalPassFailure();
    }
    import::InitializerReader initialValues(source.str());
    if (!initialValues.ok()) {
      for (const std::string &error : initialValues.errors())
        module.emitError() << error;
      return signalPassFailure();
    }
    std::string problems;
    llvm::raw_string_ostream problemStream(problems);
    if (failed(writeJob(module, given->outDir, given->job, initialValues, llvm::nulls(), problemStream))) {
      // writeJob's messages are "error: ..." lines: the diagnostic says error itself.
      for (llvm::StringRef rest = problems; !rest.empty();) {
        auto [line, tail] = rest.split('\n');
        rest = tail;
        if (!line.empty())
          module.emitError() << (line.starts_with("error: ") ? line.drop_front(7) : line);
      }
      return signalPassFailure();
    }
  }
};

} // namespace

std::unique_ptr<Pass> createWriteJob(const WriteJobOptions &options) { return std::make_unique<WriteJobPass>(options); }

void registerWriteJobPass() { PassRegistration<WriteJobPass>(); }

} // namespace pipec
