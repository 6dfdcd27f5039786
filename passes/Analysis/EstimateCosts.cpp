// pipec-estimate-costs: forward, input-gradient (B) and weight-gradient (W)
// times, activation, parameter and optimizer-state bytes of every nn op, and
// the cost table the partitioner reads back from those annotations.
#include "passes/Passes.h"
#include "passes/Analysis/GradientRoles.h"

#include "compiler/Partition/CostTable.h"
#include "compiler/Partition/Error.h"
#include "compiler/Partition/Topology.h"
#include "dialects/nn/NNDialect.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/ADT/StringSet.h"

#include <nlohmann/json.hpp>

#include <fstream>

namespace pipec::passes {
#define GEN_PASS_DEF_ESTIMATECOSTS
#include "passes/Passes.h.inc"
} // namespace pipec::passes

using namespace mlir;

namespace pipec::passes {
namespace {

constexpr llvm::StringLiteral kCostAttr = "pipe.cost";

struct MeasuredTimes {
  double forward, backwardInput, backwardWeight;
};

/// docs/profile-json.md: {"format": "pipec.profile/1", "device": ..., "ops":
/// [{"name", "fwd_s", "bwd_input_s", "bwd_weight_s"}]}.
FailureOr<llvm::StringMap<MeasuredTimes>> readProfile(const std::string &path, Location loc) {
  std::ifstream stream(path);
  if (!stream)
    return emitError(loc) << "cannot read profile '" << path << "'", failure();
  llvm::StringMap<MeasuredTimes> times;
  try {
    nlohmann::json profile = nlohmann::json::parse(stream);
    if (profile.value("format", "") != "pipec.profile/1")
      return emitError(loc) << "profile '" << path
                            << "': \"format\" must be \"pipec.profile/1\"",
             failure();
    for (const auto &op : profile.at("ops")) {
      MeasuredTimes measured{op.at("fwd_s").get<double>(), op.at("bwd_input_s").get<double>(),
                             op.at("bwd_weight_s").get<double>()};
      if (measured.forward < 0 || measured.backwardInput < 0 || measured.backwardWeight < 0)
        return emitError(loc) << "profile '" << path << "': op '"
                              << op.at("name").get<std::string>() << "' has a negative time",
               failure();
      times[op.at("name").get<std::string>()] = measured;
    }
  } catch (const nlohmann::json::exception &error) {
    return emitError(loc) << "profile '" << path << "' is malformed: " << error.what(),
           failure();
  }
  return times;
}

/// The op's name in tables and profiles: its ONNX node name, made unique with
/// "#k" when one node became several ops.
std::string baseName(Operation *op) {
  if (auto name = llvm::dyn_cast<NameLoc>(op->getLoc()))
    return name.getName().str();
  return op->getName().getStringRef().str();
}

struct EstimateCosts : impl::EstimateCostsBase<EstimateCosts> {
  using Base::Base;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    const partition::DevicePreset *preset = partition::findDevicePreset(device);
    if (!preset) {
      std::string known;
      for (const auto &candidate : partition::devicePresets())
        known += (known.empty() ? "" : ", ") + std::string(candidate.name);
      module.emitError() << "unknown device preset '" << device << "' (known: " << known << ")";
      return signalPassFailure();
    }
    double matrixPeak;
    double activationScale = 1.0; // bf16 halves activation traffic and storage
    if (precision == "fp32") {
      matrixPeak = preset->fp32FlopsPerSecond;
    } else if (precision == "tf32") {
      matrixPeak = preset->tf32FlopsPerSecond;
    } else if (precision == "bf16") {
      matrixPeak = preset->bf16FlopsPerSecond;
      activationScale = 0.5;
    } else {
      module.emitError() << "unknown precision '" << precision << "' (fp32, tf32 or bf16)";
      return signalPassFailure();
    }
    double optimizerFactor;
    if (optimizer == "adamw")
      optimizerFactor = 2;
    else if (optimizer == "sgd-momentum")
      optimizerFactor = 1;
    else if (optimizer == "sgd")
      optimizerFactor = 0;
    else {
      module.emitError() << "unknown optimizer '" << optimizer
                         << "' (adamw, sgd-momentum or sgd)";
      return signalPassFailure();
    }
    llvm::StringMap<MeasuredTimes> measured;
    if (!profile.empty()) {
      auto read = readProfile(profile, module.getLoc());
      if (failed(read))
        return signalPassFailure();
      measured = std::move(*read);
    }

    auto roofline = [&](double flops, double bytes, bool matrix) {
      double peak = matrix ? matrixPeak : preset->fp32FlopsPerSecond;
      return std::max(flops / peak, bytes * activationScale / preset->memoryBytesPerSecond);
    };

    llvm::StringSet<> usedProfileNames;
    llvm::StringMap<int> nameCounts;
    for (auto function : module.getOps<func::FuncOp>()) {
      GradientRoles roles(function);
      llvm::DenseSet<Value> parametersSeen;
      Builder builder(&getContext());
      function.walk([&](nn::CostOpInterface op) {
        Operation *operation = op.getOperation();
        nn::OpWork work = op.estimateWork();
        bool matrix = llvm::isa<nn::GemmOp, nn::MatMulOp, nn::ConvOp>(operation);
        double overhead = work.launchesKernel ? static_cast<double>(launchOverhead) : 0.0;
        double forward = roofline(work.forwardFlops, work.forwardBytes, matrix) + overhead;
        double backwardInput = 0, backwardWeight = 0;
        int64_t parameterBytes = 0;
        for (auto [index, operand] : llvm::enumerate(operation->getOperands())) {
          double time = index < work.gradientFlops.size()
                            ? roofline(work.gradientFlops[index], work.gradientBytes[index], matrix)
                            : 0.0;
          if (roles.weightDerived.contains(operand))
            backwardWeight += time;
          else if (roles.dependsOnParameter.contains(operand))
            backwardInput += time;
          auto argument = llvm::dyn_cast<BlockArgument>(operand);
          if (argument && argument.getOwner()->getParentOp() == function &&
              parametersSeen.insert(operand).second) {
            auto role = function.getArgAttrOfType<StringAttr>(argument.getArgNumber(), "nn.role");
            if (role && role.getValue() != "input") {
              auto type = llvm::cast<ShapedType>(operand.getType());
              parameterBytes += type.getNumElements() *
                                std::max(1u, type.getElementType().getIntOrFloatBitWidth() / 8);
            }
          }
        }
        if (backwardInput > 0)
          backwardInput += overhead;
        if (backwardWeight > 0)
          backwardWeight += overhead;
        // Optimizer state exists for trained parameters only, not buffers.
        int64_t trainedBytes = 0;
        for (Value operand : operation->getOperands())
          if (roles.weightDerived.contains(operand) && llvm::isa<BlockArgument>(operand))
            trainedBytes = parameterBytes;
        int64_t activationBytes = 0;
        for (Value result : operation->getResults()) {
          auto type = llvm::cast<ShapedType>(result.getType());
          activationBytes += static_cast<int64_t>(
              type.getNumElements() * std::max(1u, type.getElementType().getIntOrFloatBitWidth() / 8) *
              (llvm::isa<FloatType>(type.getElementType()) ? activationScale : 1.0));
        }
        if (llvm::isa<nn::ConstantOp>(operation))
          activationBytes = 0; // rematerialized wherever it is used

        // Constants never reach the cost table, so they take no number.
        std::string name = baseName(operation);
        if (!llvm::isa<nn::ConstantOp>(operation)) {
          int count = nameCounts[name]++;
          if (count)
            name += "#" + std::to_string(count);
        }
        StringRef source = "estimate";
        if (auto it = measured.find(name); it != measured.end()) {
          forward = it->second.forward;
          backwardInput = it->second.backwardInput;
          backwardWeight = it->second.backwardWeight;
          usedProfileNames.insert(name);
          source = "profile";
          ++numOpsProfiled;
        }
        ++numOpsCosted;
        operation->setAttr(
            kCostAttr,
            builder.getDictionaryAttr({
                builder.getNamedAttr("name", builder.getStringAttr(name)),
                builder.getNamedAttr("fwd", builder.getF64FloatAttr(forward)),
                builder.getNamedAttr("bwd_input", builder.getF64FloatAttr(backwardInput)),
                builder.getNamedAttr("bwd_weight", builder.getF64FloatAttr(backwardWeight)),
                builder.getNamedAttr("fwd_flops", builder.getF64FloatAttr(work.forwardFlops)),
                builder.getNamedAttr("activation_bytes", builder.getI64IntegerAttr(activationBytes)),
                builder.getNamedAttr("param_bytes", builder.getI64IntegerAttr(parameterBytes)),
                builder.getNamedAttr(
                    "optimizer_bytes",
                    builder.getI64IntegerAttr(static_cast<int64_t>(trainedBytes * optimizerFactor))),
                builder.getNamedAttr("source", builder.getStringAttr(source)),
            }));
      });
    }
    std::string unknown;
    for (const auto &entry : measured)
      if (!usedProfileNames.contains(entry.getKey()))
        unknown += (unknown.empty() ? "'" : ", '") + entry.getKey().str() + "'";
    if (!unknown.empty()) {
      module.emitError() << "profile '" << profile << "' names ops this model does not have: "
                         << unknown << " (a profile of another model?)";
      return signalPassFailure();
    }
    markAllAnalysesPreserved();
  }
};

} // namespace

FailureOr<partition::CostTable> costTableFromModule(ModuleOp module) {
  partition::CostTable table;
  llvm::DenseMap<Operation *, std::string> names;
  bool missing = false;
  module.walk([&](Operation *op) {
    if (!llvm::isa<nn::CostOpInterface>(op))
      return;
    auto cost = op->getAttrOfType<DictionaryAttr>(kCostAttr);
    if (!cost) {
      op->emitOpError("has no pipe.cost; run pipec-estimate-costs first");
      missing = true;
      return;
    }
    if (llvm::isa<nn::ConstantOp>(op))
      return; // constants are rematerialized in every stage that reads them
    partition::OpCost row;
    row.name = cost.getAs<StringAttr>("name").str();
    row.type = op->getName().getStringRef().str();
    row.forwardSeconds = cost.getAs<FloatAttr>("fwd").getValueAsDouble();
    row.backwardInputSeconds = cost.getAs<FloatAttr>("bwd_input").getValueAsDouble();
    row.backwardWeightSeconds = cost.getAs<FloatAttr>("bwd_weight").getValueAsDouble();
    row.activationBytes = cost.getAs<IntegerAttr>("activation_bytes").getInt();
    row.parameterBytes = cost.getAs<IntegerAttr>("param_bytes").getInt();
    row.optimizerStateBytes = cost.getAs<IntegerAttr>("optimizer_bytes").getInt();
    for (Value operand : op->getOperands()) {
      Operation *producer = operand.getDefiningOp();
      auto it = producer ? names.find(producer) : names.end();
      if (it != names.end() && !llvm::is_contained(row.producers, it->second))
        row.producers.push_back(it->second);
    }
    names[op] = row.name;
    table.ops.push_back(std::move(row));
  });
  if (missing)
    return failure();
  return table;
}

} // namespace pipec::passes
