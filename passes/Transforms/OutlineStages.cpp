// pipec-outline-stages: @train_step (+ @optimizer_step) → one pipe.stage per
// pipeline stage with @fwd, @bwd_input, @bwd_weight and @step, neighbours
// connected by pipe.send/pipe.recv (docs/stages.md).
#include "passes/Passes.h"
#include "passes/Transforms/OutlineStages.h"

#include "dialects/nn/NNDialect.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/IRMapping.h"
#include "mlir/IR/Matchers.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/SetVector.h"
#include "llvm/ADT/StringSet.h"

#include <map>
#include <optional>

namespace pipec::passes {
#define GEN_PASS_DEF_OUTLINESTAGES
#include "passes/Passes.h.inc"
} // namespace pipec::passes

using namespace mlir;

namespace pipec::passes::stages {

int64_t tensorBytes(Type type) {
  auto tensor = llvm::dyn_cast<RankedTensorType>(type);
  if (!tensor || !tensor.hasStaticShape())
    return 0;
  int64_t bits = tensor.getElementType().getIntOrFloatBitWidth();
  return tensor.getNumElements() * std::max<int64_t>(1, (bits + 7) / 8);
}

StringRef argName(func::FuncOp function, unsigned index) {
  auto name = function.getArgAttrOfType<StringAttr>(index, kName);
  return name ? name.getValue() : StringRef();
}

func::FuncOp stageFunction(pipe::StageOp stage, StringRef name) {
  return llvm::dyn_cast_or_null<func::FuncOp>(SymbolTable::lookupSymbolIn(stage, name));
}

static int64_t savedResultBytes(func::FuncOp function) {
  if (!function)
    return 0;
  int64_t bytes = 0;
  for (unsigned i = 0; i < function.getNumResults(); ++i)
    if (function.getResultAttr(i, kSaved))
      bytes += tensorBytes(function.getResultTypes()[i]);
  return bytes;
}

void updateMemoryAttributes(pipe::StageOp stage) {
  Builder builder(stage.getContext());
  int64_t total = 0;
  for (StringRef name : {kForward, kBackwardInput}) {
    func::FuncOp function = stageFunction(stage, name);
    if (!function)
      continue;
    int64_t bytes = savedResultBytes(function);
    function->setAttr(kSavedBytes, builder.getI64IntegerAttr(bytes));
    total += bytes;
  }
  stage->setAttr(kWorkspaceBytes, builder.getI64IntegerAttr(total));
}

} // namespace pipec::passes::stages

namespace pipec::passes {
namespace {

using namespace stages;

/// The op's pipe.phase also names its stage function (@fwd, @bwd_input,
/// @bwd_weight: stringifyPhase) and indexes the stage's functions.
using pipe::Phase;
constexpr int kNumPhases = 3;
int phaseIndex(Phase phase) { return static_cast<int>(phase); }

/// Where an argument or result goes in the final signature: by category,
/// then by order within it.
enum ArgCategory { ArgParam = 0, ArgData = 1, ArgSaved = 2, ArgLossScale = 3 };
enum ResultCategory { ResultLoss = 0, ResultBufferUpdate = 1, ResultGrad = 2, ResultSaved = 3 };

struct Slot {
  int category;
  int64_t order;
  DictionaryAttr attrs;
};

struct ResultSlot {
  int category;
  int64_t order;
  Value value;
  DictionaryAttr attrs;
};

struct PendingSend {
  int64_t tag;
  Value value;
  int64_t peer;
  StringAttr name;
};

/// One function of one stage while it is being built.
struct StageFunction {
  int64_t stage;
  Phase phase;
  func::FuncOp op;
  Block *block;
  SmallVector<Slot> args; // parallel to the block's arguments
  SmallVector<ResultSlot> results;
  llvm::DenseMap<Value, Value> local;          // @train_step value → value here
  llvm::DenseMap<Value, StringAttr> savedHere; // @train_step value → saved result name
  SmallVector<PendingSend> sends;
};

struct Outliner {
  ModuleOp module;
  func::FuncOp trainStep;
  func::FuncOp optimizerStep;
  MLIRContext *context;
  Builder builder;
  int64_t numStages = 0;
  SmallVector<DictionaryAttr> stageInfo;
  std::vector<std::array<StageFunction, kNumPhases>> functions;
  SmallVector<pipe::StageOp> stageOps;

  llvm::DenseSet<Operation *> skipped;         // tied-gradient sums, replaced by all-reduces
  llvm::DenseMap<Value, SmallVector<int64_t>> holders; // parameter → stages reading it
  Operation *lossSeed = nullptr;
  std::map<std::pair<void *, int>, int64_t> tags; // (value, direction) → tag
  int64_t nextTag = 0;
  std::vector<llvm::DenseMap<Value, StringAttr>> savedNames; // per stage
  std::vector<llvm::StringSet<>> usedSavedNames;             // per stage
  llvm::StringSet<> usedCommNames;
  llvm::DenseMap<int64_t, StringAttr> commNames; // tag → name
  int64_t savedCounter = 0;
  unsigned numSends = 0, numSaved = 0;

  Outliner(ModuleOp module, func::FuncOp trainStep, func::FuncOp optimizerStep)
      : module(module), trainStep(trainStep), optimizerStep(optimizerStep),
        context(module.getContext()), builder(module.getContext()) {}

  // ---------------------------------------------------------------- queries

  std::optional<int64_t> stageOf(Operation *op) {
    if (auto stage = op->getAttrOfType<IntegerAttr>(pipe::kStageAttrName))
      return stage.getInt();
    return std::nullopt;
  }

  /// A constant without a stage: every function that reads it gets a copy.
  bool isFloating(Operation *op) {
    return !op->hasAttr(pipe::kStageAttrName) && op->getNumOperands() == 0 &&
           op->hasTrait<OpTrait::ConstantLike>();
  }

  InFlightDiagnostic error(Operation *op) { return op->emitError("pipec-outline-stages: "); }

  /// A stable, readable name for a tensor: the parameter or data field's
  /// name, the ONNX node's name, or the op's name.
  std::string baseName(Value value) {
    if (auto argument = llvm::dyn_cast<BlockArgument>(value))
      return argName(trainStep, argument.getArgNumber()).str();
    Operation *op = value.getDefiningOp();
    std::string base;
    if (auto cost = op->getAttrOfType<pipe::CostAttr>(pipe::kCostAttrName))
      base = cost.getName().str();
    if (base.empty())
      base = nn::nodeName(op->getLoc()).value_or("").str();
    if (base.empty())
      base = op->getName().stripDialect().str();
    if (op->getNumResults() > 1)
      base += ":" + std::to_string(llvm::cast<OpResult>(value).getResultNumber());
    return base;
  }

  StringAttr uniqueName(std::string base, llvm::StringSet<> &used) {
    std::string name = base;
    for (int suffix = 1; !used.insert(name).second; ++suffix)
      name = base + "." + std::to_string(suffix);
    return builder.getStringAttr(name);
  }

  StringAttr savedName(int64_t stage, Value value) {
    auto [it, inserted] = savedNames[stage].try_emplace(value, nullptr);
    if (inserted)
      it->second = uniqueName(baseName(value), usedSavedNames[stage]);
    return it->second;
  }

  int64_t tagOf(Value value, int direction) {
    auto [it, inserted] = tags.try_emplace({value.getAsOpaquePointer(), direction}, nextTag);
    if (inserted) {
      std::string base = baseName(value);
      if (direction == 1)
        base = "grad:" + base;
      commNames[nextTag] = uniqueName(base, usedCommNames);
      ++nextTag;
    }
    return it->second;
  }

  DictionaryAttr dict(ArrayRef<std::pair<StringRef, Attribute>> entries) {
    SmallVector<NamedAttribute> list;
    for (auto &[key, value] : entries)
      list.push_back(builder.getNamedAttr(key, value));
    return builder.getDictionaryAttr(list);
  }

  StageFunction &fn(int64_t stage, Phase phase) { return functions[stage][phaseIndex(phase)]; }

  Value addArgument(StageFunction &function, Type type, Location loc, Slot slot) {
    function.args.push_back(slot);
    return function.block->addArgument(type, loc);
  }

  // ------------------------------------------------------------- the values

  /// The value of @train_step's `value` inside `function`, creating the
  /// argument, constant, pipe.recv or saved value that brings it there.
  FailureOr<Value> get(StageFunction &function, Value value, Operation *user) {
    if (Value found = function.local.lookup(value))
      return found;
    Value result;
    if (auto argument = llvm::dyn_cast<BlockArgument>(value)) {
      unsigned index = argument.getArgNumber();
      std::optional<nn::Role> role = nn::argumentRole(trainStep, index);
      int category;
      if (role == nn::Role::Param || role == nn::Role::Buffer)
        category = ArgParam;
      else if (role == nn::Role::Input || role == nn::Role::Label)
        category = ArgData;
      else
        return error(user) << "argument #" << index << " of @train_step has role '"
                           << (role ? nn::stringifyRole(*role) : StringRef())
                           << "' (expected param, buffer, input or label)",
               failure();
      result = addArgument(function, value.getType(), argument.getLoc(),
                           {category, index, trainStep.getArgAttrDict(index)});
    } else {
      Operation *producer = value.getDefiningOp();
      if (isFloating(producer)) {
        OpBuilder local = OpBuilder::atBlockBegin(function.block);
        result = local.clone(*producer)->getResult(llvm::cast<OpResult>(value).getResultNumber());
      } else {
        auto producerStage = stageOf(producer);
        auto producerPhase = pipe::phaseOf(producer);
        if (!producerStage || !producerPhase)
          return error(producer) << "op has no pipe.stage or pipe.phase", failure();
        FailureOr<Value> fetched =
            fetch(function, value, *producerStage, *producerPhase, producer, user);
        if (failed(fetched))
          return failure();
        result = *fetched;
      }
    }
    function.local[value] = result;
    return result;
  }

  /// A value produced by another function (of this stage or another).
  FailureOr<Value> fetch(StageFunction &function, Value value, int64_t producerStage,
                         Phase producerPhase, Operation *producer, Operation *user) {
    int64_t stage = function.stage;
    Phase phase = function.phase;
    if (producerStage == stage) {
      if (producerPhase == phase)
        return error(user) << "uses a value of stage " << stage << " (" << pipe::stringifyPhase(phase)
                           << ") before it is defined",
               failure();
      if (producerPhase > phase)
        return error(user) << "the " << pipe::stringifyPhase(phase) << " op of stage " << stage
                           << " uses a value of the later phase " << pipe::stringifyPhase(producerPhase),
               failure();
      return saved(function, value, fn(stage, producerPhase), user);
    }
    // Another stage: activations travel forward in @fwd, gradients
    // backward in @bwd_input, one neighbour at a time.
    bool forward = producerStage < stage;
    if (forward && producerPhase != Phase::Fwd)
      return error(user) << "stage " << stage << " uses a " << pipe::stringifyPhase(producerPhase)
                         << " value of the earlier stage " << producerStage
                         << " (gradients flow only towards earlier stages)",
             failure();
    if (!forward && producerPhase == Phase::Fwd)
      return error(user) << "stage " << stage << " uses a forward value of the later stage "
                         << producerStage,
             failure();
    if (!forward && producerPhase == Phase::BwdWeight)
      return error(user) << "stage " << stage << " uses a weight-gradient (bwd_weight) value of "
                         << "stage " << producerStage
                         << "; weight gradients cannot cross stages (a value computed from "
                         << "parameters only is used by a later stage: compute it there)",
             failure();
    Phase entry = forward ? Phase::Fwd : Phase::BwdInput;
    if (phase != entry) {
      if (phase < entry)
        return error(user) << "the " << pipe::stringifyPhase(phase) << " op of stage " << stage
                           << " uses a gradient from stage " << producerStage,
               failure();
      return saved(function, value, fn(stage, entry), user);
    }
    int64_t peer = forward ? stage - 1 : stage + 1;
    FailureOr<Value> source = get(fn(peer, entry), value, user);
    if (failed(source))
      return failure();
    int64_t tag = tagOf(value, forward ? 0 : 1);
    StringAttr name = commNames[tag];
    fn(peer, entry).sends.push_back({tag, *source, stage, name});
    OpBuilder local = OpBuilder::atBlockBegin(function.block);
    auto recv = pipe::RecvOp::create(local, value.getLoc(), value.getType(),
                                     static_cast<uint64_t>(peer), static_cast<uint64_t>(tag), name);
    return recv.getResult();
  }

  /// `value` computed by `producer` (an earlier function of the same stage)
  /// and needed by `function`: a saved result there, an argument here.
  FailureOr<Value> saved(StageFunction &function, Value value, StageFunction &producer,
                         Operation *user) {
    FailureOr<Value> source = get(producer, value, user);
    if (failed(source))
      return failure();
    StringAttr name = savedName(function.stage, value);
    if (!producer.savedHere.count(value)) {
      producer.savedHere[value] = name;
      producer.results.push_back(
          {ResultSaved, savedCounter++, *source, dict({{kSaved, name}})});
      ++numSaved;
    }
    return addArgument(function, value.getType(), value.getLoc(),
                       {ArgSaved, savedCounter++, dict({{kSaved, name}})});
  }

  // -------------------------------------------------------------- analysis

  LogicalResult readStages() {
    auto stagesAttr = module->getAttrOfType<ArrayAttr>(pipe::kStagesAttrName);
    if (!stagesAttr || stagesAttr.empty())
      return module.emitError("pipec-outline-stages: the module has no pipe.stages; run "
                              "pipec-partition first"),
             failure();
    numStages = stagesAttr.size();
    stageInfo.resize(numStages);
    for (Attribute entry : stagesAttr) {
      auto info = llvm::dyn_cast<DictionaryAttr>(entry);
      auto id = info ? info.getAs<IntegerAttr>("id") : IntegerAttr();
      if (!id || id.getInt() < 0 || id.getInt() >= numStages || stageInfo[id.getInt()])
        return module.emitError("pipec-outline-stages: pipe.stages must list stages 0..")
                   << numStages - 1 << " once each, got " << entry,
               failure();
      stageInfo[id.getInt()] = info;
    }
    return success();
  }

  LogicalResult classify() {
    Block &body = trainStep.getBody().front();
    for (Operation &op : body.without_terminator()) {
      if (op.getNumRegions() != 0)
        return error(&op) << "ops with regions are not supported", failure();
      if (isFloating(&op))
        continue;
      auto stage = stageOf(&op);
      if (!stage)
        return error(&op) << "op has no pipe.stage", failure();
      if (*stage < 0 || *stage >= numStages)
        return error(&op) << "pipe.stage " << *stage << " is not one of the " << numStages
                          << " stages in pipe.stages",
               failure();
      if (!pipe::phaseOf(&op))
        return error(&op) << "op needs pipe.phase = #pipe.phase<fwd>, <bwd_input> or "
                             "<bwd_weight>",
               failure();
      for (Value operand : op.getOperands())
        if (auto argument = llvm::dyn_cast<BlockArgument>(operand)) {
          std::optional<nn::Role> role = nn::argumentRole(trainStep, argument.getArgNumber());
          if (role == nn::Role::Param || role == nn::Role::Buffer) {
            auto &list = holders[operand];
            if (!llvm::is_contained(list, *stage))
              list.push_back(*stage);
          }
        }
    }
    for (auto &[value, list] : holders)
      llvm::sort(list);
    return findLossSeed();
  }

  /// The nn.constant 1.0 autodiff seeds the backward with (named
  /// "loss_seed"); it becomes the loss_scale argument of the last stage.
  LogicalResult findLossSeed() {
    auto returnOp = llvm::cast<func::ReturnOp>(trainStep.getBody().front().getTerminator());
    SmallVector<Operation *> named, candidates;
    for (Operation &op : trainStep.getBody().front().without_terminator()) {
      if (!llvm::isa<nn::ConstantOp>(op) || op.getNumResults() != 1)
        continue;
      auto type = llvm::dyn_cast<RankedTensorType>(op.getResult(0).getType());
      if (!type || type.getNumElements() != 1 || pipe::phaseOf(&op) != pipe::Phase::BwdInput)
        continue;
      auto nameLoc = llvm::dyn_cast<NameLoc>(op.getLoc());
      if (op.hasAttr("pipe.loss_seed") || (nameLoc && nameLoc.getName() == "loss_seed"))
        named.push_back(&op);
      else if (matchPattern(op.getResult(0), m_OneFloat()))
        candidates.push_back(&op);
    }
    if (named.size() == 1) {
      lossSeed = named.front();
    } else if (named.empty() && candidates.size() == 1) {
      lossSeed = candidates.front();
    } else if (!named.empty() || candidates.size() > 1) {
      return error(returnOp) << "cannot tell the loss seed (" << named.size() + candidates.size()
                             << " candidate constants); mark it with the location "
                             << "\"loss_seed\"",
             failure();
    }
    if (!lossSeed) {
      return error(returnOp) << "@train_step has no loss seed (a bwd_input nn.constant 1.0 "
                             << "located at \"loss_seed\")",
             failure();
    }
    return success();
  }

  /// The parts of a tied parameter's gradient sum that come from different
  /// stages (autodiff adds them up; here each holder keeps its part and an
  /// all-reduce among the holders sums them). An add is split when its
  /// operands come from different stages, anywhere in the sum: the
  /// contributions arrive in the order of the forward ops, not of the
  /// stages, so a same-stage add can sit above a cross-stage one.
  void collectContributions(Value gradient, SmallVectorImpl<Value> &leaves) {
    auto add = gradient.getDefiningOp<nn::AddOp>();
    bool onlyGradientUse = add && llvm::all_of(add->getUsers(), [&](Operation *user) {
                             return llvm::isa<func::ReturnOp>(user) || skipped.contains(user);
                           });
    if (onlyGradientUse && spansStages(gradient)) {
      skipped.insert(add);
      collectContributions(add->getOperand(0), leaves);
      collectContributions(add->getOperand(1), leaves);
      return;
    }
    leaves.push_back(gradient);
  }

  /// A sum of two same-typed terms (a gradient accumulation).
  static nn::AddOp accumulation(Value value) {
    auto add = value.getDefiningOp<nn::AddOp>();
    if (add && add->getOperand(0).getType() == add.getResult().getType() &&
        add->getOperand(1).getType() == add.getResult().getType())
      return add;
    return nullptr;
  }

  /// Whether the accumulation computing `value` adds terms from more than
  /// one stage, at any depth.
  bool spansStages(Value value) {
    auto add = accumulation(value);
    if (!add)
      return false;
    auto stageOfValue = [&](Value operand) -> std::optional<int64_t> {
      Operation *op = operand.getDefiningOp();
      return op ? stageOf(op) : std::nullopt;
    };
    auto s0 = stageOfValue(add->getOperand(0)), s1 = stageOfValue(add->getOperand(1));
    if (s0 != s1 || s0 != stageOf(add))
      return true;
    return spansStages(add->getOperand(0)) || spansStages(add->getOperand(1));
  }

  // -------------------------------------------------------------- building

  LogicalResult createStages() {
    OpBuilder moduleBuilder = OpBuilder::atBlockEnd(module.getBody());
    functions.resize(numStages);
    savedNames.resize(numStages);
    usedSavedNames.resize(numStages);
    Location loc = trainStep.getLoc();
    for (int64_t stage = 0; stage < numStages; ++stage) {
      DictionaryAttr info = stageInfo[stage];
      auto replicas = info.getAs<IntegerAttr>("replicas");
      auto ranks = info.getAs<DenseI64ArrayAttr>("ranks");
      auto stageOp = pipe::StageOp::create(
          moduleBuilder, loc, builder.getStringAttr("stage_" + std::to_string(stage)),
          builder.getI64IntegerAttr(stage), replicas ? replicas : builder.getI64IntegerAttr(1),
          ranks);
      stageOp.getBody().emplaceBlock();
      stageOps.push_back(stageOp);
      OpBuilder stageBuilder = OpBuilder::atBlockEnd(&stageOp.getBody().front());
      for (int index = 0; index < kNumPhases; ++index) {
        const Phase phase = static_cast<Phase>(index);
        auto function = func::FuncOp::create(stageBuilder, loc, pipe::stringifyPhase(phase),
                                             builder.getFunctionType({}, {}));
        StageFunction &entry = functions[stage][index];
        entry.stage = stage;
        entry.phase = phase;
        entry.op = function;
        entry.block = function.addEntryBlock();
      }
    }
    return success();
  }

  LogicalResult cloneOps() {
    for (Operation &op : trainStep.getBody().front().without_terminator()) {
      if (isFloating(&op) || skipped.contains(&op))
        continue;
      StageFunction &function = fn(*stageOf(&op), *pipe::phaseOf(&op));
      if (&op == lossSeed) {
        if (function.phase != Phase::BwdInput)
          return error(&op) << "the loss seed must be in phase bwd_input", failure();
        auto lossScale = nn::RoleAttr::get(builder.getContext(), nn::Role::LossScale);
        function.local[op.getResult(0)] =
            addArgument(function, op.getResult(0).getType(), op.getLoc(),
                        {ArgLossScale, 0, dict({{nn::kRoleAttrName, lossScale}})});
        continue;
      }
      IRMapping mapping;
      for (Value operand : op.getOperands()) {
        FailureOr<Value> local = get(function, operand, &op);
        if (failed(local))
          return failure();
        mapping.map(operand, *local);
      }
      OpBuilder local = OpBuilder::atBlockEnd(function.block);
      Operation *clone = local.clone(op, mapping);
      for (auto [original, copy] : llvm::zip(op.getResults(), clone->getResults()))
        function.local[original] = copy;
    }
    return success();
  }

  LogicalResult addResults() {
    auto returnOp = llvm::cast<func::ReturnOp>(trainStep.getBody().front().getTerminator());
    // Trained parameters: each holder stage returns its (partial) gradient.
    llvm::StringMap<Value> parameterByName;
    for (BlockArgument argument : trainStep.getArguments())
      if (nn::argumentRole(trainStep, argument.getArgNumber()) == nn::Role::Param)
        parameterByName[argName(trainStep, argument.getArgNumber())] = argument;

    for (auto [index, value] : llvm::enumerate(returnOp.getOperands())) {
      std::optional<nn::Role> role = nn::resultRole(trainStep, index);
      auto name = trainStep.getResultAttrOfType<StringAttr>(index, kName);
      if (!role)
        return error(returnOp) << "result #" << index << " of @train_step has no nn.role",
               failure();
      if (*role == nn::Role::Loss) {
        Operation *producer = value.getDefiningOp();
        auto stage = producer ? stageOf(producer) : std::nullopt;
        if (!stage)
          return error(returnOp) << "the loss is not computed by an op of a stage", failure();
        StageFunction &function = fn(*stage, Phase::Fwd);
        FailureOr<Value> local = get(function, value, returnOp);
        if (failed(local))
          return failure();
        function.results.push_back({ResultLoss, 0, *local, trainStep.getResultAttrDict(index)});
      } else if (*role == nn::Role::BufferUpdate) {
        int64_t stage = 0;
        if (Operation *producer = value.getDefiningOp(); producer && stageOf(producer))
          stage = *stageOf(producer);
        else if (auto argument = llvm::dyn_cast<BlockArgument>(value);
                 argument && holders.count(argument))
          stage = holders[argument].front();
        StageFunction &function = fn(stage, Phase::Fwd);
        FailureOr<Value> local = get(function, value, returnOp);
        if (failed(local))
          return failure();
        function.results.push_back(
            {ResultBufferUpdate, static_cast<int64_t>(index), *local,
             trainStep.getResultAttrDict(index)});
      } else if (*role == nn::Role::Grad) {
        Value parameter = name ? parameterByName.lookup(name.getValue()) : Value();
        if (!parameter)
          return error(returnOp) << "gradient result #" << index
                                 << " names no trained parameter of @train_step",
                 failure();
        if (failed(addGradient(llvm::cast<BlockArgument>(parameter), value, index, returnOp)))
          return failure();
      } else {
        return error(returnOp) << "result #" << index << " of @train_step has role '"
                               << nn::stringifyRole(*role)
                               << "' (expected loss, buffer_update or grad)",
               failure();
      }
    }
    return success();
  }

  LogicalResult addGradient(BlockArgument parameter, Value gradient, unsigned resultIndex,
                            Operation *returnOp) {
    SmallVector<int64_t> &stages = holders[parameter];
    if (stages.empty())
      stages.push_back(0); // read by no op: stage 0 keeps it (with a zero gradient)
    DictionaryAttr attrs = trainStep.getResultAttrDict(resultIndex);
    int64_t order = parameter.getArgNumber();
    if (stages.size() == 1) {
      StageFunction &function = fn(stages.front(), Phase::BwdWeight);
      FailureOr<Value> local = get(function, gradient, returnOp);
      if (failed(local))
        return failure();
      function.results.push_back({ResultGrad, order, *local, attrs});
      return success();
    }
    // Tied: per holder, the sum of the contributions computed there.
    SmallVector<Value> leaves;
    collectContributions(gradient, leaves);
    std::map<int64_t, SmallVector<Value>> byStage;
    for (Value leaf : leaves) {
      Operation *producer = leaf.getDefiningOp();
      std::optional<int64_t> stage =
          producer && !isFloating(producer) ? stageOf(producer) : std::nullopt;
      int64_t target = stage ? *stage : stages.front();
      if (!llvm::is_contained(stages, target))
        return error(producer ? producer : returnOp)
                   << "part of the gradient of the tied parameter '"
                   << argName(trainStep, parameter.getArgNumber()) << "' is computed in stage "
                   << target << ", which does not read it",
               failure();
      byStage[target].push_back(leaf);
    }
    for (int64_t stage : stages) {
      StageFunction &function = fn(stage, Phase::BwdWeight);
      OpBuilder local = OpBuilder::atBlockEnd(function.block);
      Value sum;
      for (Value leaf : byStage[stage]) {
        FailureOr<Value> value = get(function, leaf, returnOp);
        if (failed(value))
          return failure();
        if (!sum) {
          sum = *value;
          continue;
        }
        auto add = nn::AddOp::create(local, leaf.getLoc(), sum, *value);
        add->setAttr(pipe::kStageAttrName, builder.getI64IntegerAttr(stage));
        pipe::setPhase(add, pipe::Phase::BwdWeight);
        sum = add;
      }
      if (!sum) {
        auto type = llvm::cast<RankedTensorType>(parameter.getType());
        sum = nn::ConstantOp::create(local, parameter.getLoc(),
                                     DenseElementsAttr::get(type, builder.getZeroAttr(type.getElementType())));
      }
      function.results.push_back({ResultGrad, order, sum, attrs});
    }
    return success();
  }

  /// Orders arguments and results, adds the sends and the return, sets the
  /// signature.
  void finalize(StageFunction &function) {
    Block *old = function.block;
    // Receives first, by tag.
    SmallVector<pipe::RecvOp> recvs(old->getOps<pipe::RecvOp>());
    llvm::sort(recvs, [](pipe::RecvOp a, pipe::RecvOp b) { return a.getTag() < b.getTag(); });
    for (pipe::RecvOp recv : llvm::reverse(recvs))
      recv->moveBefore(old, old->begin());

    // Arguments: parameters and buffers, data fields, saved values, the loss scale.
    SmallVector<unsigned> order(function.args.size());
    for (unsigned i = 0; i < order.size(); ++i)
      order[i] = i;
    llvm::stable_sort(order, [&](unsigned a, unsigned b) {
      return std::make_pair(function.args[a].category, function.args[a].order) <
             std::make_pair(function.args[b].category, function.args[b].order);
    });
    auto *block = new Block();
    SmallVector<Type> argTypes;
    SmallVector<Attribute> argAttrs;
    // A result or send may be an argument itself (a parameter's gradient that
    // is an activation gradient received from @bwd_input): remapped below.
    DenseMap<Value, Value> movedArguments;
    for (unsigned index : order) {
      BlockArgument previous = old->getArgument(index);
      BlockArgument argument = block->addArgument(previous.getType(), previous.getLoc());
      previous.replaceAllUsesWith(argument);
      movedArguments[previous] = argument;
      argTypes.push_back(previous.getType());
      argAttrs.push_back(function.args[index].attrs);
    }
    for (ResultSlot &slot : function.results)
      slot.value = movedArguments.lookup_or(slot.value, slot.value);
    for (PendingSend &send : function.sends)
      send.value = movedArguments.lookup_or(send.value, send.value);
    block->getOperations().splice(block->end(), old->getOperations());
    function.op.getBody().push_front(block);
    old->erase();
    function.block = block;

    OpBuilder end = OpBuilder::atBlockEnd(block);
    llvm::stable_sort(function.sends, [](const PendingSend &a, const PendingSend &b) {
      return a.tag < b.tag;
    });
    for (PendingSend &send : function.sends) {
      pipe::SendOp::create(end, send.value.getLoc(), send.value,
                           static_cast<uint64_t>(send.peer), static_cast<uint64_t>(send.tag),
                           send.name);
      ++numSends;
    }
    llvm::stable_sort(function.results, [](const ResultSlot &a, const ResultSlot &b) {
      return std::make_pair(a.category, a.order) < std::make_pair(b.category, b.order);
    });
    SmallVector<Value> results;
    SmallVector<Type> resultTypes;
    SmallVector<Attribute> resultAttrs;
    for (ResultSlot &slot : function.results) {
      results.push_back(slot.value);
      resultTypes.push_back(slot.value.getType());
      resultAttrs.push_back(slot.attrs ? slot.attrs : builder.getDictionaryAttr({}));
    }
    func::ReturnOp::create(end, function.op.getLoc(), results);
    function.op.setFunctionType(builder.getFunctionType(argTypes, resultTypes));
    function.op.setAllArgAttrs(argAttrs);
    function.op.setAllResultAttrs(resultAttrs);
  }

  /// @step: the stage's part of @optimizer_step, after the all-reduces of
  /// replicated stages and tied parameters.
  LogicalResult buildStep(int64_t stage) {
    pipe::StageOp stageOp = stageOps[stage];
    OpBuilder stageBuilder = OpBuilder::atBlockEnd(&stageOp.getBody().front());
    Location loc = optimizerStep.getLoc();
    int64_t replicas = static_cast<int64_t>(stageOp.getReplicas());

    // The stage's trained parameters, in @train_step's order.
    SmallVector<BlockArgument> parameters;
    for (BlockArgument argument : trainStep.getArguments())
      if (nn::argumentRole(trainStep, argument.getArgNumber()) == nn::Role::Param &&
          llvm::is_contained(holders[argument], stage))
        parameters.push_back(argument);

    // Their arguments and results in @optimizer_step.
    auto optimizerArgs = [&](StringRef name, nn::Role role) {
      SmallVector<BlockArgument> found;
      for (BlockArgument argument : optimizerStep.getArguments())
        if (nn::argumentRole(optimizerStep, argument.getArgNumber()) == role &&
            (role == nn::Role::Step || argName(optimizerStep, argument.getArgNumber()) == name))
          found.push_back(argument);
      return found;
    };
    auto optimizerReturn =
        llvm::cast<func::ReturnOp>(optimizerStep.getBody().front().getTerminator());
    SmallVector<BlockArgument> paramArgs, gradArgs, stateArgs;
    SmallVector<unsigned> paramResults, stateResults;
    for (BlockArgument parameter : parameters) {
      StringRef name = argName(trainStep, parameter.getArgNumber());
      auto params = optimizerArgs(name, nn::Role::Param),
           grads = optimizerArgs(name, nn::Role::Grad);
      if (params.size() != 1 || grads.size() != 1)
        return error(optimizerStep) << "@optimizer_step has no parameter and gradient '" << name
                                    << "' (run pipec-optimizer after pipec-autodiff)",
               failure();
      paramArgs.push_back(params.front());
      gradArgs.push_back(grads.front());
      for (BlockArgument state : optimizerArgs(name, nn::Role::OptimizerState))
        stateArgs.push_back(state);
      for (unsigned i = 0; i < optimizerStep.getNumResults(); ++i) {
        auto resultName = optimizerStep.getResultAttrOfType<StringAttr>(i, kName);
        std::optional<nn::Role> resultRole = nn::resultRole(optimizerStep, i);
        if (!resultName || resultName.getValue() != name || !resultRole)
          continue;
        (*resultRole == nn::Role::Param ? paramResults : stateResults).push_back(i);
      }
    }
    SmallVector<BlockArgument> stepArgs = optimizerArgs("", nn::Role::Step);
    if (stepArgs.size() != 1)
      return error(optimizerStep) << "@optimizer_step needs one argument with role 'step'",
             failure();

    SmallVector<BlockArgument> allArgs(paramArgs);
    allArgs.append(gradArgs);
    allArgs.append(stateArgs);
    allArgs.push_back(stepArgs.front());
    SmallVector<Type> argTypes;
    SmallVector<Attribute> argAttrs;
    for (BlockArgument argument : allArgs) {
      argTypes.push_back(argument.getType());
      argAttrs.push_back(optimizerStep.getArgAttrDict(argument.getArgNumber()));
    }
    SmallVector<unsigned> resultIndices(paramResults);
    resultIndices.append(stateResults);
    SmallVector<Type> resultTypes;
    SmallVector<Attribute> resultAttrs;
    for (unsigned index : resultIndices) {
      resultTypes.push_back(optimizerStep.getResultTypes()[index]);
      resultAttrs.push_back(optimizerStep.getResultAttrDict(index));
    }
    auto step = func::FuncOp::create(stageBuilder, loc, kStep,
                                     builder.getFunctionType(argTypes, resultTypes));
    step.setAllArgAttrs(argAttrs);
    step.setAllResultAttrs(resultAttrs);
    if (auto hyper = optimizerStep->getAttrOfType<pipe::OptimizerAttr>(pipe::kOptimizerAttrName))
      step->setAttr(pipe::kOptimizerAttrName, hyper);
    Block *block = step.addEntryBlock();
    OpBuilder body = OpBuilder::atBlockEnd(block);
    IRMapping mapping;
    for (auto [argument, local] : llvm::zip(allArgs, block->getArguments()))
      mapping.map(argument, local);

    // Gradients: mean over the replicas, then the sum over tied copies.
    for (auto [index, gradArg] : llvm::enumerate(gradArgs)) {
      Value gradient = block->getArgument(paramArgs.size() + index);
      if (replicas > 1)
        gradient = pipe::AllReduceOp::create(body, loc, gradient.getType(), gradient,
                                             builder.getStringAttr("mean"), StringAttr(),
                                             DenseI64ArrayAttr());
      SmallVector<int64_t> &stages = holders[parameters[index]];
      if (stages.size() > 1)
        gradient = pipe::AllReduceOp::create(
            body, loc, gradient.getType(), gradient, builder.getStringAttr("sum"),
            builder.getStringAttr(argName(trainStep, parameters[index].getArgNumber())),
            builder.getDenseI64ArrayAttr(stages));
      mapping.map(gradArg, gradient);
    }

    // The ops computing the stage's results, in @optimizer_step's order.
    llvm::SetVector<Operation *> needed;
    SmallVector<Value> worklist;
    for (unsigned index : resultIndices)
      worklist.push_back(optimizerReturn.getOperand(index));
    while (!worklist.empty()) {
      Value value = worklist.pop_back_val();
      if (auto argument = llvm::dyn_cast<BlockArgument>(value)) {
        if (!mapping.contains(argument))
          return error(optimizerStep) << "the update of stage " << stage
                                      << " reads @optimizer_step's argument #"
                                      << argument.getArgNumber()
                                      << ", which belongs to no parameter of the stage",
                 failure();
        continue;
      }
      Operation *op = value.getDefiningOp();
      if (needed.insert(op))
        worklist.append(op->operand_begin(), op->operand_end());
    }
    for (Operation &op : optimizerStep.getBody().front().without_terminator())
      if (needed.contains(&op))
        body.clone(op, mapping);
    SmallVector<Value> results;
    for (unsigned index : resultIndices)
      results.push_back(mapping.lookup(optimizerReturn.getOperand(index)));
    func::ReturnOp::create(body, loc, results);
    return success();
  }

  LogicalResult run() {
    if (failed(readStages()) || failed(classify()))
      return failure();
    // Tied parameters: find the cross-stage sums before cloning, so that
    // they are skipped.
    auto returnOp = llvm::cast<func::ReturnOp>(trainStep.getBody().front().getTerminator());
    for (auto [index, value] : llvm::enumerate(returnOp.getOperands())) {
      auto name = trainStep.getResultAttrOfType<StringAttr>(index, kName);
      if (nn::resultRole(trainStep, index) != nn::Role::Grad || !name)
        continue;
      for (auto &[parameter, stages] : holders)
        if (stages.size() > 1 &&
            argName(trainStep, llvm::cast<BlockArgument>(parameter).getArgNumber()) ==
                name.getValue() &&
            nn::argumentRole(trainStep, llvm::cast<BlockArgument>(parameter).getArgNumber()) ==
                nn::Role::Param) {
          SmallVector<Value> leaves;
          collectContributions(value, leaves);
        }
    }
    if (failed(createStages()) || failed(cloneOps()) || failed(addResults()))
      return failure();
    for (auto &stage : functions)
      for (StageFunction &function : stage)
        finalize(function);
    for (int64_t stage = 0; stage < numStages; ++stage) {
      if (failed(buildStep(stage)))
        return failure();
      updateMemoryAttributes(stageOps[stage]);
    }
    return success();
  }
};

struct OutlineStages : impl::OutlineStagesBase<OutlineStages> {
  using Base::Base;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    auto trainStep = module.lookupSymbol<func::FuncOp>("train_step");
    if (!trainStep) {
      module.emitError("pipec-outline-stages: no @train_step; run pipec-autodiff first");
      return signalPassFailure();
    }
    auto optimizerStep = module.lookupSymbol<func::FuncOp>("optimizer_step");
    if (!optimizerStep) {
      module.emitError("pipec-outline-stages: no @optimizer_step; run pipec-optimizer first");
      return signalPassFailure();
    }
    if (!module.getOps<pipe::StageOp>().empty()) {
      module.emitError("pipec-outline-stages: the module already has pipe.stage ops");
      return signalPassFailure();
    }
    if (!llvm::hasSingleElement(trainStep.getBody())) {
      trainStep.emitError("pipec-outline-stages: @train_step must have a single block");
      return signalPassFailure();
    }
    Outliner outliner(module, trainStep, optimizerStep);
    if (failed(outliner.run())) {
      // Leave the module as it was: drop what was built.
      for (pipe::StageOp stage : outliner.stageOps)
        stage.erase();
      return signalPassFailure();
    }
    numSends += outliner.numSends;
    numSaved += outliner.numSaved;
    if (!keepTrainStep) {
      trainStep.erase();
      optimizerStep.erase();
    }
    if (failed(verifyPipeline(module)))
      return signalPassFailure();
  }
};

} // namespace
} // namespace pipec::passes
