#include "compiler/Driver/TrainingJob.h"
#include "compiler/Driver/JobWeights.h"
#include "compiler/Driver/StageBuild.h"

#include "compiler/Emit/EmitStage.h"
#include "compiler/Import/OnnxImporter.h"
#include "analysis/Partition/Partitioner.h"
#include "dialects/nn/NNDialect.h"
#include "runtime/include/pipec/vocabulary.h"
#include "dialects/pipe/PipeDialect.h"
#include "passes/Pipeline.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Pass/PassManager.h"
#include "llvm/Support/raw_ostream.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

using namespace mlir;
namespace fs = std::filesystem;

namespace pipec {

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

} // namespace

FailureOr<plan::Runtime> writeTrainingJob(ModuleOp module, const CompileOptions &options,
                                          const std::map<std::string, import::HostTensor> &initialValues,
                                          raw_ostream &outs, raw_ostream &errs) {
  plan::Runtime runtime;
  fs::path directory = options.partition().outDir;
  std::error_code error;
  fs::create_directories(directory / "stages", error);
  fs::create_directories(directory / "weights", error);
  if (error) {
    errs << "error: cannot create " << directory.string() << ": " << error.message() << "\n";
    return failure();
  }
  const std::map<std::string, import::HostTensor> &initial = initialValues;

  SmallVector<pipe::StageOp> stages(module.getOps<pipe::StageOp>());
  std::string cmake = stagesCMakePrologue(options);
  emit::StageTarget stageTarget;
  stageTarget.target = options.target;
  stageTarget.precision = options.costs.precision;
  const std::string extension = options.cudaTarget() ? ".cu" : ".cpp";
  for (pipe::StageOp stage : stages) {
    int64_t id = stage.getId();
    std::string stem = "stage_" + std::to_string(id);
    fs::path source = directory / "stages" / (stem + extension);
    stageTarget.constantsFile = stem + ".constants.bin";
    {
      std::string code, constantBytes;
      llvm::raw_string_ostream stream(code);
      if (failed(emit::emitStage(stage, static_cast<int>(stages.size()), stageTarget, stream,
                                 &constantBytes)))
        return failure();
      std::ofstream(source) << code;
      // Always written (maybe empty), so the build's dependency on it holds.
      std::ofstream(directory / "stages" / stageTarget.constantsFile, std::ios::binary)
          << constantBytes;
    }
    cmake += stageCMakeTarget(options, stem, extension, stageTarget.constantsFile);

    // Initial weights: every parameter and buffer the stage's functions read.
    if (failed(writeStageWeights(stage, initial, directory / "weights" / (stem + ".bin"), errs)))
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
    if (options.build &&
        failed(buildStage(options, directory, source, directory / "stages" / ("lib" + stem + ".so"), errs)))
      return failure();
  }
  std::ofstream(directory / "stages" / "CMakeLists.txt") << cmake;

  // The data set: the model's inputs and labels, one sample each.
  auto train = module.lookupSymbol<func::FuncOp>("forward");
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
         abiDtype(type.getElementType()).name, sample, low, high});
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
  // The values pipec-optimizer was given (passes/Pipeline.h).
  const passes::OptimizerOptions &optimizer = options.optimizer;
  runtime.microbatchSize = nn::microbatchSize(train).value_or(0);
  runtime.seed = options.seed;
  // The stage libraries run AdamW's or SGD's update; SGD's momentum is a number.
  runtime.optimizer.rule = usesAdam(optimizer.optimizer) ? Optimizer::AdamW : Optimizer::Sgd;
  runtime.optimizer.lr = optimizer.lr;
  runtime.optimizer.weightDecay = optimizer.effectiveWeightDecay();
  runtime.optimizer.momentum = optimizer.effectiveMomentum();
  runtime.target = options.target;
  runtime.precision = options.cudaTarget() ? options.costs.precision : Precision::F32;
  if (options.cudaTarget()) {
    runtime.cudaArch = options.cudaArchs;
    runtime.gpu = options.partition().device;
  }
  outs << "wrote " << directory.string() << ": plan.json, schedule/, " << stages.size()
       << " stage" << (stages.size() == 1 ? "" : "s") << " in stages/"
       << (options.build ? " (built)" : "") << ", weights/\n";
  return runtime;
}

} // namespace pipec
