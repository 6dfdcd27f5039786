// pipec-estimate-costs: forward, input-gradient (B) and weight-gradient (W)
// times, activation, parameter and optimizer-state bytes of every nn op, and
// the cost table the partitioner reads back from those annotations.
#include "passes/Passes.h"
#include "passes/OptionsBinder.h"
#include "analysis/Settings/Declared.h"
#include "passes/Analysis/GradientRoles.h"

#include "analysis/Partition/CostTable.h"
#include "analysis/Partition/Error.h"
#include "analysis/Partition/InputFiles.h"
#include "analysis/Partition/Topology.h"
#include "dialects/nn/NNDialect.h"
#include "dialects/nn/NNGradient.h"
#include "dialects/pipe/PipeDialect.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/EquivalenceClasses.h"
#include "llvm/ADT/MapVector.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/ADT/StringSet.h"

#include <nlohmann/json.hpp>

#include "runtime/include/pipec/input_file.h"

#include <cmath>
#include <map>
#include <filesystem>
#include <fstream>
#include <optional>

namespace pipec::passes {
#define GEN_PASS_DEF_ESTIMATECOSTS
#include "passes/Passes.h.inc"
} // namespace pipec::passes

using namespace mlir;

namespace pipec::passes {
namespace {

using pipe::kCostAttrName;

struct MeasuredTimes {
  double forward, backwardInput, backwardWeight;
};

/// docs/profile-json.md: {"format": "pipec.profile/1", "device": ..., "ops":
/// [{"name", "fwd_s", "bwd_input_s", "bwd_weight_s"}]}.
FailureOr<llvm::StringMap<MeasuredTimes>> readProfile(const std::string &path, Location loc) {
  llvm::StringMap<MeasuredTimes> times;
  std::string text;
  try {
    text = partition::readUserFile(path, "profile", partition::kMaxJsonFileBytes);
  } catch (const partition::Error &error) {
    return emitError(loc) << "cannot read profile '" << path << "': " << error.what(), failure();
  }
  try {
    nlohmann::json profile = partition::parseUserJson(text, path);
    auto fail = [&](const std::string &why) { return emitError(loc) << "profile '" << path << "': " << why, failure(); };
    auto malformed = [&](const std::string &why) {
      return emitError(loc) << "profile '" << path << "' is malformed: " << why, failure();
    };
    if (!profile.is_object() || profile.value("format", "") != "pipec.profile/1")
      return fail("\"format\" must be \"pipec.profile/1\"");
    if (!profile.contains("ops") || !profile["ops"].is_array())
      return malformed("\"ops\" must be an array");
    for (const auto &op : profile["ops"]) {
      if (!op.is_object() || !op.contains("name") || !op["name"].is_string())
        return malformed("every entry of \"ops\" needs a \"name\" string");
      std::string name = op["name"].get<std::string>();
      double values[3];
      const char *keys[3] = {"fwd_s", "bwd_input_s", "bwd_weight_s"};
      for (int k = 0; k < 3; ++k) {
        if (!op.contains(keys[k]) || !op[keys[k]].is_number())
          return malformed("op '" + name + "': \"" + keys[k] + "\" must be a number");
        values[k] = op[keys[k]].get<double>();
        if (values[k] < 0)
          return fail("op '" + name + "' has a negative time");
        if (!std::isfinite(values[k]) || values[k] > partition::kMaxOpSeconds)
          return fail("op '" + name + "': \"" + keys[k] + "\" " + op[keys[k]].dump() + " is over the limit of " +
                      std::to_string(static_cast<int64_t>(partition::kMaxOpSeconds)) + " s");
      }
      times[name] = MeasuredTimes{values[0], values[1], values[2]};
    }
  } catch (const partition::Error &error) {
    return emitError(loc) << "profile '" << path << "' is malformed: " << error.what(), failure();
  } catch (const nlohmann::json::exception &error) {
    return emitError(loc) << "profile '" << path << "' is malformed: " << error.what(), failure();
  }
  return times;
}

/// The op's name in tables and profiles: its ONNX node name, made unique with
/// "#k" when one node became several ops.
std::string baseName(Operation *op) {
  if (std::optional<StringRef> name = nn::nodeName(op->getLoc()))
    return name->str();
  return op->getName().getStringRef().str();
}

/// Bytes of one tensor of `type` (elements × element bytes × `scale`), with
/// checked arithmetic: nullopt, and `why` set, when the type has no static
/// shape or a non-numeric element type, or when the size exceeds the cost
/// table's per-op limit (a batch dimension of 2^62 must not wrap around).
std::optional<int64_t> tensorBytes(Type type, double scale, std::string &why) {
  auto shaped = llvm::dyn_cast<ShapedType>(type);
  if (!shaped || !shaped.hasStaticShape()) {
    why = "has no static shape";
    return std::nullopt;
  }
  Type element = shaped.getElementType();
  if (!element.isIntOrFloat()) {
    why = "has a non-numeric element type";
    return std::nullopt;
  }
  const int64_t elementBytes = std::max(1u, element.getIntOrFloatBitWidth() / 8);
  auto count = io::checkedElementCount(shaped.getShape());
  std::optional<int64_t> bytes = count ? io::checkedMul<int64_t>(*count, elementBytes) : std::nullopt;
  if (!bytes || static_cast<double>(*bytes) * scale > static_cast<double>(partition::kMaxOpBytes)) {
    std::string dims;
    for (int64_t d : shaped.getShape())
      dims += (dims.empty() ? "" : "x") + std::to_string(d);
    why = "of shape " + dims + " needs " + (bytes ? std::to_string(*bytes) : std::string("more than 2^63")) +
          " bytes, over the limit of " + std::to_string(partition::kMaxOpBytes) + " (16 TiB)";
    return std::nullopt;
  }
  return static_cast<int64_t>(static_cast<double>(*bytes) * scale);
}

/// Bytes one micro-batch keeps from each op of `function` between its forward
/// and its backward (docs/cost-model.md, "Memory"), float values at
/// `floatScale` of their bytes (bf16: 0.5) unless pipec-bf16-storage keeps
/// them in float32:
/// - the op's results that pipec-autodiff's gradients will read. Each op's
///   own gradient rules (GradientOpInterface) are built once into a detached
///   block, with placeholders for the gradients of its results that lead to
///   the loss, and the function's values they read are collected; the block
///   is then dropped. A view read stands for its source (it aliases it);
///   constants and values computed from weights alone (transposed weights,
///   which the GEMMs read through their flags) are not kept;
/// - for an op with a weight gradient, the gradients of its results: the
///   input-gradient phase (B) computes them and the weight-gradient phase (W)
///   reads them later, so the stage keeps them in the micro-batch's workspace.
/// With `recomputesElementwise` (-O2), a value read that element-wise ops
/// compute from one other value read is not kept: pipec-recompute-elementwise
/// computes it again where it is read (recomputableFrom).
llvm::DenseMap<Operation *, int64_t> keptBytesByOp(func::FuncOp function, const GradientRoles &roles,
                                                   double floatScale, bool recomputesElementwise) {
  llvm::DenseSet<Value> reachesLoss;
  SmallVector<Value> pending;
  function.walk([&](func::ReturnOp returned) {
    if (returned->getNumOperands() > 0)
      pending.push_back(returned->getOperand(0)); // the loss (pipec-append-loss)
  });
  while (!pending.empty()) {
    Value value = pending.pop_back_val();
    if (!reachesLoss.insert(value).second)
      continue;
    if (Operation *producer = value.getDefiningOp())
      for (Value operand : producer->getOperands())
        pending.push_back(operand);
  }
  llvm::DenseMap<Operation *, int64_t> kept;
  auto keep = [&](Value value) {
    std::string why;
    auto type = llvm::dyn_cast<ShapedType>(value.getType());
    bool scaled = type && llvm::isa<FloatType>(type.getElementType()) && !keepsFloat32Storage(value);
    if (std::optional<int64_t> bytes = tensorBytes(value.getType(), scaled ? floatScale : 1.0, why))
      kept[value.getDefiningOp()] += *bytes;
  };
  Block scratch;
  OpBuilder builder(function.getContext());
  builder.setInsertionPointToEnd(&scratch);
  function.walk([&](nn::GradientOpInterface differentiable) {
    Operation *op = differentiable.getOperation();
    SmallVector<Value> dys;
    bool any = false;
    for (Value result : op->getResults()) {
      Value dy;
      if (reachesLoss.contains(result) && roles.needsGradient(result)) {
        dy = UnrealizedConversionCastOp::create(builder, op->getLoc(), result.getType(), ValueRange{}).getResult(0);
        any = true;
      }
      dys.push_back(dy);
    }
    if (!any)
      return;
    nn::GradientBuilder gradient(builder, op->getLoc());
    bool weightGradient = false;
    for (auto [index, operand] : llvm::enumerate(op->getOperands()))
      if (roles.needsGradient(operand) && !differentiable.gradientInEarlierOperand(static_cast<unsigned>(index))) {
        differentiable.buildGradient(gradient, dys, static_cast<unsigned>(index));
        weightGradient |= roles.isWeightGradient(operand);
      }
    if (weightGradient)
      for (auto [result, dy] : llvm::zip(op->getResults(), dys))
        if (dy && !roles.isWeightGradient(result)) // a weight's own transform is W work only
          keep(result); // its gradient, of the same type
  });
  // The values the gradients read as they read them (a view's result, not
  // its source): what the stages save, and what the recomputation's check
  // compares against, as pipec-recompute-elementwise does.
  llvm::MapVector<Value, Value> read; // each to the value its views read
  scratch.walk([&](Operation *op) {
    for (Value value : op->getOperands()) {
      Value source = value;
      while (nn::isView(source.getDefiningOp()))
        source = source.getDefiningOp()->getOperand(0);
      Operation *producer = source.getDefiningOp();
      if (producer && producer->getBlock() != &scratch && !llvm::isa<nn::ConstantOp>(producer) &&
          !roles.isWeightGradient(source))
        read.insert({value, source});
    }
  });
  scratch.dropAllReferences();
  llvm::DenseSet<Value> recomputed;
  for (bool progress = recomputesElementwise; progress;) { // as the pass: until nothing changes
    progress = false;
    for (auto [value, viewed] : read) {
      Value source;
      if (!recomputed.contains(value) &&
          !recomputableFrom(value, [&](Value v) { return read.count(v) && !recomputed.contains(v); }, source)
               .empty())
        progress |= recomputed.insert(value).second;
    }
  }
  llvm::DenseSet<Value> counted; // a view read stands for its source (it aliases it), once
  for (auto [value, viewed] : read)
    if (!recomputed.contains(value) && counted.insert(viewed).second)
      keep(viewed);
  return kept;
}

/// One op's estimated times and forward FLOPs for one micro-batch.
struct OpTimes {
  double forward = 0, backwardInput = 0, backwardWeight = 0, forwardFlops = 0;
};

/// The costs of the module's ops as -O2 rewrites them before autodiff
/// (docs/cost-model.md, "At -O2"): pipec-recognize-composites and
/// pipec-canonicalize-gemm, charged to the op each rewritten op takes over. A
/// recognized chain costs its composite's times and keeps what the
/// composite's gradient reads; its other ops cost nothing.
struct OptimizedCosts {
  llvm::DenseMap<Operation *, OpTimes> times;
  llvm::DenseMap<Operation *, int64_t> savedBytes;
  /// The original ops each rewritten op absorbed, when more than one.
  std::vector<llvm::SmallVector<Operation *>> chains;
};

constexpr llvm::StringLiteral kOpNumberPrefix = "pipec-estimate-op-";

/// The number costAsOptimized gave an op, from one part of a location.
std::optional<size_t> opNumber(Location part) {
  auto named = llvm::dyn_cast<NameLoc>(part);
  StringRef name = named ? named.getName().getValue() : StringRef();
  size_t number = 0;
  if (!name.consume_front(kOpNumberPrefix) || name.getAsInteger(10, number))
    return std::nullopt;
  return number;
}

/// The module is cloned, each op of the clone named by its number in the
/// walk (a NameLoc around its location, which the location of an op a
/// rewrite creates starts with: the op it takes over), and the clone is
/// rewritten; each op of the clone is then charged to the original op its
/// number names.
template <typename TimesOf>
std::optional<OptimizedCosts> costAsOptimized(ModuleOp module, double activationScale, bool bf16Storage,
                                              const TimesOf &timesOf) {
  std::vector<Operation *> original;
  module.walk([&](Operation *op) { original.push_back(op); });
  OwningOpRef<ModuleOp> clone(module.clone());
  MLIRContext *context = module.getContext();
  size_t number = 0;
  clone->walk([&](Operation *op) {
    op->setLoc(NameLoc::get(StringAttr::get(context, kOpNumberPrefix + std::to_string(number++)), op->getLoc()));
  });
  int64_t applied = 0;
  if (number != original.size() || failed(recognizeComposites(clone->getOperation(), applied)) ||
      failed(canonicalizeGemms(clone->getOperation(), applied)))
    return module.emitError("pipec-estimate-costs: cannot cost the ops as -O2 rewrites them"), std::nullopt;
  if (bf16Storage)
    padClasses(clone->getOperation(), applied);
  // The original ops an op's location names, the one it takes over first
  // (its location's first name, as nn::nodeName reads it).
  auto originalsOf = [&](Operation *op) {
    llvm::SmallVector<Operation *> named;
    op->getLoc()->walk([&](Location part) {
      if (std::optional<size_t> number = opNumber(part);
          number && *number < original.size() && !llvm::is_contained(named, original[*number]))
        named.push_back(original[*number]);
      return WalkResult::advance();
    });
    return named;
  };
  auto originalOf = [&](Operation *op) -> Operation * {
    llvm::SmallVector<Operation *> named = originalsOf(op);
    return named.empty() ? nullptr : named.front();
  };
  OptimizedCosts costs;
  clone->walk([&](Operation *op) {
    if (llvm::SmallVector<Operation *> absorbed = originalsOf(op); absorbed.size() > 1)
      costs.chains.push_back(std::move(absorbed));
  });
  for (auto function : clone->getOps<func::FuncOp>()) {
    GradientRoles roles(function);
    function.walk([&](nn::CostOpInterface op) {
      if (Operation *target = originalOf(op.getOperation())) {
        OpTimes times = timesOf(op, roles);
        OpTimes &sum = costs.times[target];
        sum.forward += times.forward;
        sum.backwardInput += times.backwardInput;
        sum.backwardWeight += times.backwardWeight;
        sum.forwardFlops += times.forwardFlops;
      }
    });
    for (auto [op, bytes] : keptBytesByOp(function, roles, activationScale, /*recomputesElementwise=*/true))
      if (Operation *target = originalOf(op))
        costs.savedBytes[target] += bytes;
  }
  return costs;
}

/// pipe.fused_chain on the ops of each chain, chains that share an op merged
/// (a composite rewritten again absorbs the first one's ops).
void markFusedChains(ModuleOp module, const std::vector<llvm::SmallVector<Operation *>> &chains) {
  llvm::EquivalenceClasses<Operation *> merged;
  for (const auto &chain : chains)
    for (Operation *op : chain)
      merged.unionSets(chain.front(), op);
  llvm::DenseMap<Operation *, int64_t> numbers;
  Builder builder(module.getContext());
  module.walk([&](Operation *op) {
    if (!merged.contains(op))
      return;
    auto [it, added] = numbers.try_emplace(merged.getLeaderValue(op), static_cast<int64_t>(numbers.size()));
    op->setAttr(pipe::kFusedChainAttrName, builder.getI64IntegerAttr(it->second));
  });
}

/// What an op reaches of the rates the preset gives its kind: convolutions
/// and batch norms less (the preset's convolution and batch-norm
/// efficiencies, fitted to bf16 runs: other precisions keep the common
/// ones, docs/cost-model.md), every other op 1.
static double kernelEfficiency(Operation *operation, const partition::DevicePreset &preset, Precision precision) {
  if (precision != Precision::BF16)
    return 1.0;
  auto convolution = [&](auto conv) {
    return conv.getGroup() > 1 ? preset.groupedConvolutionEfficiency : preset.convolutionEfficiency;
  };
  if (auto conv = llvm::dyn_cast<nn::ConvOp>(operation))
    return convolution(conv);
  if (auto conv = llvm::dyn_cast<nn::ConvInputGradOp>(operation))
    return convolution(conv);
  if (auto conv = llvm::dyn_cast<nn::ConvWeightGradOp>(operation))
    return convolution(conv);
  if (llvm::isa<nn::BatchNormOp, nn::BatchNormGradOp, nn::BatchNormParamGradOp>(operation))
    return preset.batchNormEfficiency;
  return 1.0;
}

struct EstimateCosts : PassWithOptions<impl::EstimateCostsBase<EstimateCosts>, EstimateCostsOptions> {
  using PassWithOptions::PassWithOptions;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    FailureOr<EstimateCostsOptions> given = options();
    if (failed(given))
      return signalPassFailure();
    const EstimateCostsOptions &o = *given;
    const std::string &device = o.device, &profile = o.profile, &dumpCosts = o.dumpCosts;
    const double launchOverhead = o.launchOverhead;
    const partition::DevicePreset *preset = partition::findDevicePreset(device);
    if (!preset) {
      module.emitError() << "unknown device preset '" << device
                         << "' (known: " << partition::devicePresetNames() << ")";
      return signalPassFailure();
    }
    // Tensor-core peaks as pipec's kernels reach them (the preset's fitted
    // efficiency); fp32 products run on the CUDA cores, never measured.
    double matrixPeak = preset->fp32FlopsPerSecond;
    const bool bf16Stored = o.precision == Precision::BF16 && o.bf16Storage;
    const double activationScale = bf16Stored ? 0.5 : 1.0; // bf16 storage halves activation traffic and storage
    switch (o.precision) {
    case Precision::F32: break;
    case Precision::TF32: matrixPeak = preset->tf32FlopsPerSecond * preset->matrixEfficiency; break;
    case Precision::BF16: matrixPeak = preset->bf16FlopsPerSecond * preset->matrixEfficiency; break;
    }
    const double optimizerFactor = optimizerStateCopies(o.optimizer);
    llvm::StringMap<MeasuredTimes> measured;
    if (!profile.empty()) {
      auto read = readProfile(profile, module.getLoc());
      if (failed(read))
        return signalPassFailure();
      measured = std::move(*read);
    }

    // The bandwidth as pipec's kernels reach it (the preset's efficiency).
    auto roofline = [&](double flops, double bytes, bool matrix) {
      double peak = matrix ? matrixPeak : preset->fp32FlopsPerSecond;
      return std::max(flops / peak,
                      bytes * activationScale / (preset->memoryBytesPerSecond * preset->memoryEfficiency));
    };
    // An op's times: the roofline of its work plus a launch per kernel; the
    // gradient of an operand is W work if the operand is weight-derived, B
    // work if it depends on a parameter otherwise (docs/cost-model.md).
    auto timesOf = [&](nn::CostOpInterface op, const GradientRoles &roles) {
      Operation *operation = op.getOperation();
      nn::OpWork work = op.estimateWork();
      // Tensor-core work: matrix products, and attention, whose two products
      // dominate it (a flash kernel on the CUDA target).
      bool matrix = llvm::isa<nn::GemmOp, nn::MatMulOp, nn::BatchedGemmOp, nn::ConvOp, nn::ConvInputGradOp,
                              nn::AttentionOp>(operation);
      double overhead = work.launchesKernel ? static_cast<double>(launchOverhead) : 0.0;
      const double efficiency = kernelEfficiency(operation, *preset, o.precision);
      OpTimes times;
      times.forward = roofline(work.forwardFlops, work.forwardBytes, matrix) / efficiency + overhead;
      times.forwardFlops = work.forwardFlops;
      for (auto [index, operand] : llvm::enumerate(operation->getOperands())) {
        double time = index < work.gradientFlops.size()
                          ? roofline(work.gradientFlops[index], work.gradientBytes[index], matrix) / efficiency
                          : 0.0;
        if (roles.weightDerived.contains(operand))
          times.backwardWeight += time;
        else if (roles.dependsOnParameter.contains(operand))
          times.backwardInput += time;
      }
      if (times.backwardInput > 0)
        times.backwardInput += overhead;
      if (times.backwardWeight > 0)
        times.backwardWeight += overhead;
      return times;
    };
    std::optional<OptimizedCosts> optimized;
    if (o.optimized) {
      optimized = costAsOptimized(module, activationScale, bf16Stored, timesOf);
      if (!optimized)
        return signalPassFailure();
      markFusedChains(module, optimized->chains);
    }

    llvm::StringSet<> usedProfileNames;
    llvm::StringMap<int> nameCounts;
    for (auto function : module.getOps<func::FuncOp>()) {
      GradientRoles roles(function);
      const llvm::DenseMap<Operation *, int64_t> kept =
          optimized ? llvm::DenseMap<Operation *, int64_t>()
                    : keptBytesByOp(function, roles, activationScale, /*recomputesElementwise=*/false);
      llvm::DenseSet<Value> parametersSeen;
      Builder builder(&getContext());
      bool tooLarge = false;
      function.walk([&](nn::CostOpInterface op) {
        Operation *operation = op.getOperation();
        if (tooLarge)
          return;
        auto refuse = [&](const std::string &what, const std::string &why) {
          operation->emitOpError() << "(node '" << baseName(operation) << "'): " << what << " " << why;
          tooLarge = true;
        };
        OpTimes times = optimized ? optimized->times.lookup(operation) : timesOf(op, roles);
        double forward = times.forward, backwardInput = times.backwardInput, backwardWeight = times.backwardWeight;
        int64_t parameterBytes = 0;
        for (auto [index, operand] : llvm::enumerate(operation->getOperands())) {
          auto argument = llvm::dyn_cast<BlockArgument>(operand);
          if (argument && argument.getOwner()->getParentOp() == function &&
              parametersSeen.insert(operand).second) {
            std::optional<nn::Role> role = nn::argumentRole(function, argument.getArgNumber());
            if (role && *role != nn::Role::Input) {
              std::string why;
              auto bytes = tensorBytes(operand.getType(), 1.0, why);
              auto sum = bytes ? io::checkedAdd<int64_t>(parameterBytes, *bytes) : std::nullopt;
              if (!sum || *sum > partition::kMaxOpBytes)
                return refuse("parameter operand " + std::to_string(index), why.empty() ? "is too large" : why);
              parameterBytes = *sum;
            }
          }
        }
        // Optimizer state exists for trained parameters only, not buffers.
        int64_t trainedBytes = 0;
        for (Value operand : operation->getOperands())
          if (roles.weightDerived.contains(operand) && llvm::isa<BlockArgument>(operand))
            trainedBytes = parameterBytes;
        int64_t activationBytes = 0;
        for (auto [index, result] : llvm::enumerate(operation->getResults())) {
          auto type = llvm::dyn_cast<ShapedType>(result.getType());
          std::string why;
          auto bytes = tensorBytes(result.getType(), type && llvm::isa<FloatType>(type.getElementType()) ? activationScale : 1.0,
                                   why);
          auto sum = bytes ? io::checkedAdd<int64_t>(activationBytes, *bytes) : std::nullopt;
          if (!sum || *sum > partition::kMaxOpBytes)
            return refuse("result " + std::to_string(index), why.empty() ? "is too large" : why);
          activationBytes = *sum;
        }
        int64_t savedBytes = optimized ? optimized->savedBytes.lookup(operation) : kept.lookup(operation);
        for (auto [what, seconds] : {std::pair<const char *, double>{"forward", forward},
                                     {"input-gradient", backwardInput},
                                     {"weight-gradient", backwardWeight}})
          if (!std::isfinite(seconds) || seconds < 0 || seconds > partition::kMaxOpSeconds)
            return refuse(std::string("estimated ") + what + " time", std::to_string(seconds) +
                                                                       " s is over the limit of " +
                                                                       std::to_string(static_cast<int64_t>(partition::kMaxOpSeconds)) +
                                                                       " s (absurd dimensions?)");
        if (llvm::isa<nn::ConstantOp>(operation))
          activationBytes = savedBytes = 0; // rematerialized wherever it is used

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
        operation->setAttr(kCostAttrName,
                           pipe::CostAttr::get(&getContext(), name, APFloat(forward),
                                               APFloat(backwardInput), APFloat(backwardWeight),
                                               APFloat(times.forwardFlops), activationBytes,
                                               savedBytes, parameterBytes,
                                               static_cast<int64_t>(trainedBytes * optimizerFactor),
                                               source));
      });
      if (tooLarge)
        return signalPassFailure();
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
    if (!dumpCosts.empty() && failed(writeCostTable(module, dumpCosts)))
      return signalPassFailure();
    markAllAnalysesPreserved();
  }

  /// The table as the partition will read it, kept even when planning fails.
  LogicalResult writeCostTable(ModuleOp module, const std::string &dumpCosts) {
    auto table = costTableFromModule(module);
    if (failed(table))
      return failure();
    // The file may live in a folder not created yet (e.g. inside --out DIR).
    std::error_code folderError;
    auto folder = std::filesystem::path(dumpCosts).parent_path();
    if (!folder.empty())
      std::filesystem::create_directories(folder, folderError);
    std::ofstream csv(dumpCosts);
    if (!csv)
      return module.emitError() << ("cannot write " + settings::flag(settings::kDumpCosts) + " file '") << dumpCosts << "'";
    partition::writeCostTableCsv(csv, *table);
    return success();
  }

};

} // namespace

void EstimateCostsOptions::bind(settings::Binder &b) {
  b.text(settings::kDevice, device);
  b.choice(settings::kPrecision, precision);
  b.choice(settings::kOptimizer, optimizer);
  b.text(settings::kProfile, profile);
  b.real(settings::kLaunchOverhead, launchOverhead);
  b.text(settings::kDumpCosts, dumpCosts);
}

std::unique_ptr<Pass> createEstimateCosts(const EstimateCostsOptions &options) {
  return std::make_unique<EstimateCosts>(options);
}

FailureOr<partition::CostTable> costTableFromModule(ModuleOp module) {
  partition::CostTable table;
  llvm::DenseMap<Operation *, std::string> names;
  bool missing = false;
  module.walk([&](Operation *op) {
    if (!llvm::isa<nn::CostOpInterface>(op))
      return;
    auto cost = op->getAttrOfType<pipe::CostAttr>(kCostAttrName);
    if (!cost) {
      op->emitOpError("has no pipe.cost; run pipec-estimate-costs first");
      missing = true;
      return;
    }
    if (llvm::isa<nn::ConstantOp>(op))
      return; // constants are rematerialized in every stage that reads them
    // pipe.cost may come from hand-written IR (pipec-opt): its verifier
    // checked the fields, the row is checked against the cost table's bounds.
    partition::OpCost row;
    row.name = cost.getName().str();
    row.type = op->getName().getStringRef().str();
    row.forwardSeconds = cost.getFwd().convertToDouble();
    row.backwardInputSeconds = cost.getBwdInput().convertToDouble();
    row.backwardWeightSeconds = cost.getBwdWeight().convertToDouble();
    row.activationBytes = cost.getActivationBytes();
    row.savedBytes = cost.getSavedBytes();
    row.parameterBytes = cost.getParamBytes();
    row.optimizerStateBytes = cost.getOptimizerBytes();
    try {
      partition::validateOpCost(row, "pipe.cost: ");
    } catch (const partition::Error &error) {
      op->emitOpError() << error.what();
      missing = true;
      return;
    }
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
  if (auto train = module.lookupSymbol<func::FuncOp>("forward"))
    table.microbatchSize = nn::microbatchSize(train).value_or(0);
  return table;
}

/// Whether `op` is a row of costTableFromModule's table: costed ops other
/// than constants, which are rematerialized in every stage that reads them.
static bool isCostTableRow(Operation *op) { return llvm::isa<nn::CostOpInterface>(op) && !llvm::isa<nn::ConstantOp>(op); }

std::vector<std::pair<int, int>> fusedChainRanges(ModuleOp module) {
  // Rows in costTableFromModule's order.
  std::map<int64_t, std::pair<int, int>> ranges;
  int row = 0;
  module.walk([&](Operation *op) {
    if (!isCostTableRow(op))
      return;
    if (auto chain = op->getAttrOfType<IntegerAttr>(pipe::kFusedChainAttrName)) {
      auto [it, added] = ranges.try_emplace(chain.getInt(), row, row);
      it->second.second = row;
    }
    ++row;
  });
  std::vector<std::pair<int, int>> result;
  for (const auto &[chain, range] : ranges)
    if (range.first < range.second)
      result.push_back(range);
  return result;
}

std::vector<std::pair<int, int>> tiedParameterRanges(ModuleOp module) {
  // Rows in costTableFromModule's order: costed ops other than constants.
  // A value computed from parameters alone (a transposed weight) stands for
  // them: the stages rematerialize it where it is read, so its readers hold
  // the parameter too.
  llvm::DenseMap<Value, llvm::SmallVector<Value, 2>> parametersOf;
  llvm::DenseMap<Value, std::pair<int, int>> users;
  int row = 0;
  module.walk([&](Operation *op) {
    bool costed = isCostTableRow(op);
    llvm::SmallVector<Value, 2> held;
    bool onlyParameters = op->getNumOperands() > 0;
    for (Value operand : op->getOperands()) {
      if (auto it = parametersOf.find(operand); it != parametersOf.end()) {
        held.append(it->second.begin(), it->second.end());
        continue;
      }
      auto argument = llvm::dyn_cast<BlockArgument>(operand);
      auto function = argument ? llvm::dyn_cast<func::FuncOp>(argument.getOwner()->getParentOp()) : nullptr;
      if (function && nn::argumentRole(function, argument.getArgNumber()) == nn::Role::Param)
        held.push_back(operand);
      else if (!(operand.getDefiningOp() && llvm::isa<nn::ConstantOp>(operand.getDefiningOp())))
        onlyParameters = false;
    }
    if (costed) {
      for (Value parameter : held) {
        auto [it, inserted] = users.try_emplace(parameter, row, row);
        if (!inserted)
          it->second = {std::min(it->second.first, row), std::max(it->second.second, row)};
      }
      ++row;
    }
    if (onlyParameters && !held.empty())
      for (Value result : op->getResults())
        parametersOf[result] = held;
  });
  std::vector<std::pair<int, int>> ranges;
  for (const auto &entry : users)
    if (entry.second.first != entry.second.second)
      ranges.push_back(entry.second);
  std::sort(ranges.begin(), ranges.end());
  return ranges;
}

} // namespace pipec::passes
