// pipec-weight-stashing and pipec-recompute: rewrites of the stage
// functions that pipec-outline-stages produced (docs/stages.md).
#include "passes/Passes.h"
#include "passes/OptionsBinder.h"
#include "analysis/Settings/Declared.h"
#include "passes/Transforms/OutlineStages.h"

#include "dialects/nn/NNDialect.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/IRMapping.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"
#include "llvm/ADT/BitVector.h"
#include "llvm/ADT/SetVector.h"
#include "llvm/ADT/StringSet.h"

namespace pipec::passes {
#define GEN_PASS_DEF_WEIGHTSTASHING
#define GEN_PASS_DEF_RECOMPUTE
#define GEN_PASS_DEF_RECOMPUTEELEMENTWISE
#include "passes/Passes.h.inc"
} // namespace pipec::passes

using namespace mlir;

namespace pipec::passes {
namespace {

using namespace stages;

/// Arguments are kept in the order pipec-outline-stages gives them:
/// parameters and buffers, data fields, saved values, the loss scale, the
/// micro-batch index.
int argumentCategory(DictionaryAttr attrs) {
  if (!attrs)
    return 2;
  if (attrs.get(kSaved))
    return 2;
  auto role = attrs.getAs<nn::RoleAttr>(nn::kRoleAttrName);
  if (!role)
    return 2;
  switch (role.getValue()) {
  case nn::Role::Param:
  case nn::Role::Buffer:
    return 0;
  case nn::Role::Input:
  case nn::Role::Label:
    return 1;
  case nn::Role::LossScale:
    return 3;
  case nn::Role::Microbatch:
    return 4;
  default:
    return 2;
  }
}

/// Inserts an argument after the last one of its category; returns it.
BlockArgument insertArgument(func::FuncOp function, Type type, DictionaryAttr attrs,
                             Location loc) {
  int category = argumentCategory(attrs);
  unsigned position = 0;
  for (unsigned i = 0; i < function.getNumArguments(); ++i)
    if (argumentCategory(function.getArgAttrDict(i)) <= category)
      position = i + 1;
  (void)function.insertArgument(position, type, attrs, loc);
  return function.getArgument(position);
}

/// Appends a result (with its value in the return op).
void appendResult(func::FuncOp function, Value value, DictionaryAttr attrs) {
  auto returnOp = llvm::cast<func::ReturnOp>(function.getBody().front().getTerminator());
  unsigned position = function.getNumResults();
  (void)function.insertResult(position, value.getType(), attrs);
  returnOp->insertOperands(position, value);
}

/// Removes results (and their return operands).
void eraseResults(func::FuncOp function, const llvm::BitVector &erase) {
  auto returnOp = llvm::cast<func::ReturnOp>(function.getBody().front().getTerminator());
  (void)function.eraseResults(erase);
  returnOp->eraseOperands(erase);
}

//===----------------------------------------------------------------------===//
// pipec-weight-stashing
//===----------------------------------------------------------------------===//

struct WeightStashing : PassWithOptions<impl::WeightStashingBase<WeightStashing>, WeightStashingOptions> {
  using PassWithOptions::PassWithOptions;


  void runOnOperation() override {
    ModuleOp module = getOperation();
    FailureOr<WeightStashingOptions> given = options();
    if (failed(given))
      return signalPassFailure();
    int versions = given->versions;
    bool verticalSync = given->verticalSync;
    if (given->fromPlan) {
      auto plan = module->getAttrOfType<pipe::PlanAttr>(pipe::kPlanAttrName);
      if (!plan) {
        module.emitError() << "pipec-weight-stashing: from-plan needs the module's pipe.plan "
                              "(run pipec-partition first)";
        return signalPassFailure();
      }
      versions = plan.getAsynchronous() ? plan.getInflight() : 0;
      verticalSync = plan.getVerticalSync();
    }
    if (versions < 0) {
      module.emitError() << "pipec-weight-stashing: versions must be non-negative, got "
                         << versions;
      return signalPassFailure();
    }
    if (versions <= 1) // synchronous schedule: one version, nothing to keep
      return markAllAnalysesPreserved();
    for (pipe::StageOp stage : module.getOps<pipe::StageOp>())
      if (failed(stash(stage, versions, verticalSync)))
        return signalPassFailure();
    if (failed(verifyPipeline(module)))
      return signalPassFailure();
  }

  LogicalResult stash(pipe::StageOp stage, int versions, bool verticalSync) {
    Builder builder(stage.getContext());
    int64_t id = static_cast<int64_t>(stage.getId());
    bool stashed = false;
    stage.walk([&](Operation *op) { stashed |= llvm::isa<pipe::StashOp, pipe::RestoreOp>(op); });
    if (stashed)
      return stage.emitError() << "pipec-weight-stashing: stage " << id
                               << " already stashes weights",
             failure();
    func::FuncOp forward = stageFunction(stage, kForward);
    if (!forward)
      return stage.emitError() << "pipec-weight-stashing: stage " << id << " has no @fwd",
             failure();
    auto microbatchAttrs =
        builder.getDictionaryAttr({nn::roleAttribute(builder.getContext(), nn::Role::Microbatch)});
    IntegerAttr slots = builder.getI64IntegerAttr(versions);
    int64_t stashBytes = 0;

    // @fwd: stash every trained parameter for this micro-batch.
    Value microbatch =
        insertArgument(forward, builder.getIndexType(), microbatchAttrs, forward.getLoc());
    OpBuilder body = OpBuilder::atBlockBegin(&forward.getBody().front());
    for (BlockArgument argument : forward.getArguments()) {
      if (nn::argumentRole(forward, argument.getArgNumber()) != nn::Role::Param)
        continue;
      StringAttr name = builder.getStringAttr(argName(forward, argument.getArgNumber()));
      auto stashOp = pipe::StashOp::create(body, argument.getLoc(), argument, microbatch, name,
                                           slots, verticalSync ? builder.getUnitAttr() : UnitAttr());
      stashBytes += versions * tensorBytes(argument.getType());
      ++numStashed;
      // Vertical sync: later stages compute with the version of the
      // micro-batch's entry into stage 0, not the newest.
      if (verticalSync && id > 0) {
        auto restore = pipe::RestoreOp::create(body, argument.getLoc(), argument.getType(),
                                               microbatch, name, slots, builder.getUnitAttr());
        argument.replaceAllUsesExcept(restore.getResult(), stashOp);
      }
    }
    // @bwd_input, @bwd_weight: read the stashed version instead.
    for (StringRef functionName : {kBackwardInput, kBackwardWeight}) {
      func::FuncOp function = stageFunction(stage, functionName);
      if (!function)
        continue;
      Value index =
          insertArgument(function, builder.getIndexType(), microbatchAttrs, function.getLoc());
      OpBuilder start = OpBuilder::atBlockBegin(&function.getBody().front());
      llvm::BitVector unused(function.getNumArguments());
      for (BlockArgument argument : function.getArguments()) {
        if (nn::argumentRole(function, argument.getArgNumber()) != nn::Role::Param)
          continue;
        auto restore = pipe::RestoreOp::create(
            start, argument.getLoc(), argument.getType(), index,
            builder.getStringAttr(argName(function, argument.getArgNumber())), slots,
            verticalSync ? builder.getUnitAttr() : UnitAttr());
        argument.replaceAllUsesWith(restore.getResult());
        unused.set(argument.getArgNumber());
      }
      // The backward reads trained parameters only through pipe.restore.
      (void)function.eraseArguments(unused);
    }
    stage->setAttr(kStashBytes, builder.getI64IntegerAttr(stashBytes));
    stage->setAttr("pipe.weight_versions", slots);
    return success();
  }
};

//===----------------------------------------------------------------------===//
// pipec-recompute
//===----------------------------------------------------------------------===//

struct Recompute : impl::RecomputeBase<Recompute> {
  using Base::Base;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    // --recompute's vocabulary (pipec/vocabulary.h): auto takes the stages
    // the planner chose, which pipe.plan lists.
    RecomputeMode chosenMode;
    if (!parseChoice(mode, chosenMode)) {
      module.emitError() << "pipec-recompute: mode must be " << choiceNames<RecomputeMode>(" or ") << ", got '"
                         << mode << "'";
      return signalPassFailure();
    }
    SmallVector<int64_t> listed(stages.begin(), stages.end());
    if (listed.empty() && chosenMode == RecomputeMode::Auto) {
      auto plan = module->getAttrOfType<pipe::PlanAttr>(pipe::kPlanAttrName);
      if (!plan) {
        module.emitError() << "pipec-recompute: mode=auto needs the module's pipe.plan (run "
                              "pipec-partition first)";
        return signalPassFailure();
      }
      llvm::append_range(listed, plan.getRecompute().asArrayRef());
    }
    std::map<int64_t, pipe::StageOp> byId;
    for (pipe::StageOp stage : module.getOps<pipe::StageOp>())
      byId[static_cast<int64_t>(stage.getId())] = stage;
    SmallVector<pipe::StageOp> chosen;
    if (!listed.empty()) {
      for (int64_t id : listed) {
        auto it = byId.find(id);
        if (it == byId.end()) {
          module.emitError() << "pipec-recompute: there is no stage " << id << " (the module has "
                             << byId.size() << ")";
          return signalPassFailure();
        }
        if (!llvm::is_contained(chosen, it->second))
          chosen.push_back(it->second);
      }
    } else if (chosenMode == RecomputeMode::All) {
      for (auto &[id, stage] : byId)
        chosen.push_back(stage);
    }
    if (chosen.empty())
      return markAllAnalysesPreserved();
    for (pipe::StageOp stage : chosen)
      if (failed(recompute(stage)))
        return signalPassFailure();
    if (failed(verifyPipeline(module)))
      return signalPassFailure();
  }

  LogicalResult recompute(pipe::StageOp stage) {
    Builder builder(stage.getContext());
    int64_t id = static_cast<int64_t>(stage.getId());
    func::FuncOp forward = stageFunction(stage, kForward);
    func::FuncOp backwardInput = stageFunction(stage, kBackwardInput);
    func::FuncOp backwardWeight = stageFunction(stage, kBackwardWeight);
    if (!forward || !backwardInput || !backwardWeight)
      return stage.emitError() << "pipec-recompute: stage " << id
                               << " lacks @fwd, @bwd_input or @bwd_weight",
             failure();
    if (stage->hasAttr(kRecomputeAttr))
      return stage.emitError() << "pipec-recompute: stage " << id << " already recomputes",
             failure();
    bool stashed = false;
    stage.walk([&](Operation *op) { stashed |= llvm::isa<pipe::StashOp, pipe::RestoreOp>(op); });
    if (stashed)
      return stage.emitError() << "pipec-recompute: stage " << id
                               << " already stashes weights; run pipec-recompute before "
                                  "pipec-weight-stashing",
             failure();

    Block &forwardBody = forward.getBody().front();
    auto forwardReturn = llvm::cast<func::ReturnOp>(forwardBody.getTerminator());
    int64_t bytesBefore = 0;
    for (unsigned i = 0; i < forward.getNumResults(); ++i)
      if (forward.getResultAttr(i, kSaved))
        bytesBefore += tensorBytes(forward.getResultTypes()[i]);

    // Saved values that are not boundary inputs are recomputed.
    llvm::StringSet<> usedNames;
    llvm::DenseMap<Value, StringAttr> boundaryNames; // received value → its saved name
    SmallVector<std::pair<StringAttr, Value>> recomputed;
    llvm::BitVector dropped(forward.getNumResults());
    for (unsigned i = 0; i < forward.getNumResults(); ++i) {
      auto name = forward.getResultAttrOfType<StringAttr>(i, kSaved);
      if (!name)
        continue;
      usedNames.insert(name.getValue());
      Value value = forwardReturn.getOperand(i);
      if (value.getDefiningOp<pipe::RecvOp>() || llvm::isa<BlockArgument>(value)) {
        boundaryNames.try_emplace(value, name);
        continue;
      }
      recomputed.push_back({name, value});
      dropped.set(i);
    }
    if (recomputed.empty()) {
      forward->setAttr(kSavedBytesNoRecompute, builder.getI64IntegerAttr(bytesBefore));
      stage->setAttr(kRecomputeAttr, builder.getUnitAttr());
      updateMemoryAttributes(stage);
      return success();
    }

    // The forward ops to re-run, and what they read from outside.
    llvm::SetVector<Operation *> slice;
    llvm::SetVector<Value> inputs;
    SmallVector<Value> worklist;
    for (auto &[name, value] : recomputed)
      worklist.push_back(value);
    while (!worklist.empty()) {
      Value value = worklist.pop_back_val();
      if (llvm::isa<BlockArgument>(value) || value.getDefiningOp<pipe::RecvOp>()) {
        inputs.insert(value);
        continue;
      }
      Operation *op = value.getDefiningOp();
      if (op->getNumRegions() != 0)
        return op->emitError() << "pipec-recompute: stage " << id
                               << ": cannot re-run an op with regions",
               failure();
      if (slice.insert(op))
        worklist.append(op->operand_begin(), op->operand_end());
    }
    // Keep the forward order.
    SmallVector<Operation *> ordered;
    for (Operation &op : forwardBody.without_terminator())
      if (slice.contains(&op))
        ordered.push_back(&op);

    // Bring each input into @bwd_input: parameters and data fields as
    // arguments, received activations as saved values.
    Block &backwardBody = backwardInput.getBody().front();
    SmallVector<Value> regionInputs;
    for (Value input : inputs) {
      if (auto argument = llvm::dyn_cast<BlockArgument>(input)) {
        DictionaryAttr attrs = forward.getArgAttrDict(argument.getArgNumber());
        std::optional<nn::Role> role = nn::argumentRole(forward, argument.getArgNumber());
        StringRef name = argName(forward, argument.getArgNumber());
        Value found;
        for (BlockArgument candidate : backwardInput.getArguments())
          if (role && nn::argumentRole(backwardInput, candidate.getArgNumber()) == role &&
              argName(backwardInput, candidate.getArgNumber()) == name)
            found = candidate;
        if (!found)
          found = insertArgument(backwardInput, input.getType(), attrs, argument.getLoc());
        regionInputs.push_back(found);
        continue;
      }
      // A received activation: saved by @fwd (under a new name if need be).
      StringAttr name = boundaryNames.lookup(input);
      if (!name) {
        std::string base = "input";
        if (auto recv = input.getDefiningOp<pipe::RecvOp>(); recv && recv.getName())
          base = recv.getName()->str();
        std::string unique = base;
        for (int suffix = 1; !usedNames.insert(unique).second; ++suffix)
          unique = base + "." + std::to_string(suffix);
        name = builder.getStringAttr(unique);
        appendResult(forward, input, builder.getDictionaryAttr({builder.getNamedAttr(kSaved, name)}));
        dropped.resize(forward.getNumResults());
        boundaryNames[input] = name;
      }
      Value found;
      for (BlockArgument candidate : backwardInput.getArguments())
        if (backwardInput.getArgAttr(candidate.getArgNumber(), kSaved) == name)
          found = candidate;
      if (!found)
        found = insertArgument(backwardInput, input.getType(),
                               builder.getDictionaryAttr({builder.getNamedAttr(kSaved, name)}),
                               input.getLoc());
      regionInputs.push_back(found);
    }

    // The pipe.recompute region at the start of @bwd_input.
    SmallVector<Type> resultTypes;
    for (auto &[name, value] : recomputed)
      resultTypes.push_back(value.getType());
    // After the receives (and restores) that open the function.
    OpBuilder start = OpBuilder::atBlockBegin(&backwardBody);
    for (Operation &op : backwardBody)
      if (llvm::isa<pipe::RecvOp, pipe::RestoreOp>(op))
        start.setInsertionPointAfter(&op);
      else
        break;
    auto region = pipe::RecomputeOp::create(start, forward.getLoc(), resultTypes, regionInputs);
    Block *regionBody = new Block();
    region.getBody().push_back(regionBody);
    IRMapping mapping;
    for (Value input : inputs)
      mapping.map(input, regionBody->addArgument(input.getType(), input.getLoc()));
    OpBuilder inside = OpBuilder::atBlockEnd(regionBody);
    for (Operation *op : ordered) {
      inside.clone(*op, mapping);
      ++numRecomputed;
    }
    SmallVector<Value> yielded;
    for (auto &[name, value] : recomputed)
      yielded.push_back(mapping.lookup(value));
    pipe::YieldOp::create(inside, forward.getLoc(), yielded);

    // Uses: @bwd_input's saved arguments become the region's results; what
    // @bwd_weight reads is handed on by @bwd_input under the same name.
    llvm::BitVector unusedArgs(backwardInput.getNumArguments());
    for (auto [index, entry] : llvm::enumerate(recomputed)) {
      StringAttr name = entry.first;
      Value value = region.getResult(index);
      for (BlockArgument argument : backwardInput.getArguments())
        if (backwardInput.getArgAttr(argument.getArgNumber(), kSaved) == name) {
          argument.replaceAllUsesWith(value);
          unusedArgs.set(argument.getArgNumber());
        }
      bool weightReads = llvm::any_of(backwardWeight.getArguments(), [&](BlockArgument argument) {
        return backwardWeight.getArgAttr(argument.getArgNumber(), kSaved) == name;
      });
      if (weightReads)
        appendResult(backwardInput, value,
                     builder.getDictionaryAttr({builder.getNamedAttr(kSaved, name)}));
    }
    (void)backwardInput.eraseArguments(unusedArgs);
    eraseResults(forward, dropped);
    // Forward ops whose results were only saved are no longer needed there.
    for (Operation &op : llvm::make_early_inc_range(llvm::reverse(forwardBody.without_terminator())))
      if (isOpTriviallyDead(&op))
        op.erase();

    forward->setAttr(kSavedBytesNoRecompute, builder.getI64IntegerAttr(bytesBefore));
    stage->setAttr(kRecomputeAttr, builder.getUnitAttr());
    updateMemoryAttributes(stage);
    return success();
  }
};

//===----------------------------------------------------------------------===//
// pipec-recompute-elementwise
//===----------------------------------------------------------------------===//

struct RecomputeElementwise : impl::RecomputeElementwiseBase<RecomputeElementwise> {
  using Base::Base;

  void runOnOperation() override {
    getOperation().walk([&](pipe::StageOp stage) {
      bool changed = false;
      for (StringRef producer : {kForward, kBackwardInput})
        if (func::FuncOp function = stageFunction(stage, producer))
          changed |= recomputeResults(stage, function);
      if (changed)
        updateMemoryAttributes(stage);
    });
  }

  /// The saved results of `function` that one element-wise function
  /// computes from another of its saved results (views of them allowed):
  /// each function reading one computes it again from the other, and
  /// `function` no longer saves it.
  bool recomputeResults(pipe::StageOp stage, func::FuncOp function) {
    auto returnOp = llvm::cast<func::ReturnOp>(function.getBody().front().getTerminator());
    llvm::BitVector erase(function.getNumResults());
    auto savedAs = [&](Value value) -> StringAttr {
      for (unsigned j = 0; j < function.getNumResults(); ++j)
        if (!erase[j] && returnOp.getOperand(j) == value)
          if (auto name = function.getResultAttrOfType<StringAttr>(j, kSaved))
            return name;
      return {};
    };
    // Until nothing changes: a value no longer saved may leave another with
    // one saved source (SwiGLU's silu, once the sigmoid of the gate is not
    // saved, is recomputed from the gate alone).
    for (bool progress = true; progress;) {
      progress = false;
      for (unsigned i = 0; i < function.getNumResults(); ++i) {
        auto name = function.getResultAttrOfType<StringAttr>(i, kSaved);
        if (!name || erase[i])
          continue;
        if (redrawMask(stage, returnOp.getOperand(i), name)) {
          erase.set(i);
          ++numRecomputed;
          progress = true;
          continue;
        }
        Value value;
        SmallVector<Operation *> ops = recomputableFrom(
            returnOp.getOperand(i),
            [&](Value v) { return savedAs(v) || parameterName(function, v) || dataName(function, v); }, value);
        if (ops.empty())
          continue;
        // The source as the readers take it: a saved value, or a parameter
        // (pipec-pad-classes' padded weight), which every entry point reads:
        // as an argument by its name, or where weights are stashed, through
        // pipe.restore (docs/stages.md).
        Source source{savedAs(value), parameterName(function, value), dataName(function, value), {}};
        if (!source.saved && !source.parameter && !source.data)
          continue;
        // Of the data, only its layout moves (the image a channels-last
        // region transposes): the data's element-wise functions stay kept.
        if (source.data && !llvm::all_of(ops, [](Operation *op) {
              return llvm::isa<nn::TransposeOp>(op) || nn::isView(op);
            }))
          continue;
        if (source.saved == name || (source.parameter && !readersRestore(stage, function, name)))
          continue;
        if (auto argument = llvm::dyn_cast<BlockArgument>(value); argument && (source.parameter || source.data))
          source.argumentAttrs = function.getArgAttrDict(argument.getArgNumber());
        for (StringRef reader : {kBackwardInput, kBackwardWeight})
          if (func::FuncOp consumer = stageFunction(stage, reader); consumer && consumer != function)
            recomputeIn(consumer, ops, value, name, source);
        erase.set(i);
        ++numRecomputed;
        progress = true;
      }
    }
    if (erase.none())
      return false;
    eraseResults(function, erase);
    return true;
  }

  /// A saved training dropout's mask that its readers use only as the mask
  /// of nn.dropout_grad: they draw it again from the dropout's key instead
  /// (dropout_op_id), and it is no longer saved. False if it is not one.
  bool redrawMask(pipe::StageOp stage, Value value, StringAttr name) {
    auto dropout = value.getDefiningOp<nn::DropoutOp>();
    std::optional<uint64_t> id = dropout ? nn::dropoutOpId(dropout) : std::nullopt;
    if (!dropout || value != dropout.getMask() || !id)
      return false;
    SmallVector<std::pair<func::FuncOp, unsigned>> readers;
    for (StringRef reader : {kBackwardInput, kBackwardWeight}) {
      func::FuncOp consumer = stageFunction(stage, reader);
      if (!consumer || consumer.getBody().empty())
        continue;
      std::optional<unsigned> a = savedArgument(consumer, name);
      if (!a)
        continue;
      for (OpOperand &use : consumer.getArgument(*a).getUses()) {
        auto grad = llvm::dyn_cast<nn::DropoutGradOp>(use.getOwner());
        if (!grad || grad.getMask() != use.get() || grad.getDy() == use.get() ||
            grad.getRatio() != dropout.getRatio() || grad.getTraining() != dropout.getTraining())
          return false;
      }
      readers.push_back({consumer, *a});
    }
    Builder builder(dropout.getContext());
    for (auto [consumer, a] : readers) {
      for (Operation *user : llvm::make_early_inc_range(consumer.getArgument(a).getUsers())) {
        auto grad = llvm::cast<nn::DropoutGradOp>(user);
        grad.getMaskMutable().clear();
        grad.setDropoutOpIdAttr(builder.getI64IntegerAttr(static_cast<int64_t>(*id)));
      }
      (void)consumer.eraseArgument(a);
    }
    return true;
  }

  /// The index of `function`'s argument saved as `name`, if it has one.
  static std::optional<unsigned> savedArgument(func::FuncOp function, StringAttr name) {
    for (unsigned a = 0; a < function.getNumArguments(); ++a)
      if (function.getArgAttrOfType<StringAttr>(a, kSaved) == name)
        return a;
    return std::nullopt;
  }

  /// Where a recomputed value's readers find its source: the saved value of
  /// that name, or the parameter or data of that name (`argumentAttrs`: its
  /// argument's attributes where the producer takes it as one).
  struct Source {
    StringAttr saved, parameter, data;
    DictionaryAttr argumentAttrs;
  };

  /// The name of the model input or label `value` is in `function` (every
  /// entry point may read the micro-batch's data by name: the image a
  /// channels-last region transposes, docs/optimization.md).
  static StringAttr dataName(func::FuncOp function, Value value) {
    auto argument = llvm::dyn_cast<BlockArgument>(value);
    if (!argument || argument.getOwner() != &function.getBody().front())
      return {};
    std::optional<nn::Role> role = nn::argumentRole(function, argument.getArgNumber());
    if (role != nn::Role::Input && role != nn::Role::Label)
      return {};
    return function.getArgAttrOfType<StringAttr>(argument.getArgNumber(), nn::kNameAttrName);
  }

  /// The name of the parameter `value` is in `function`: a parameter
  /// argument (role param: the runtime passes each entry point the
  /// parameters by name) or the weight version pipe.restore fetches.
  static StringAttr parameterName(func::FuncOp function, Value value) {
    if (auto restore = value.getDefiningOp<pipe::RestoreOp>())
      return restore.getNameAttr();
    auto argument = llvm::dyn_cast<BlockArgument>(value);
    if (!argument || argument.getOwner() != &function.getBody().front() ||
        nn::argumentRole(function, argument.getArgNumber()) != nn::Role::Param)
      return {};
    return function.getArgAttrOfType<StringAttr>(argument.getArgNumber(), nn::kNameAttrName);
  }

  /// Whether the readers of `function`'s result saved as `name` can read a
  /// parameter as the producer did: where weights are stashed, only through
  /// pipe.restore, which a reader can fetch again when it fetches one already.
  static bool readersRestore(pipe::StageOp stage, func::FuncOp function, StringAttr name) {
    bool stashed = false;
    stage.walk([&](pipe::RestoreOp) { stashed = true; });
    if (!stashed)
      return true;
    for (StringRef reader : {kBackwardInput, kBackwardWeight}) {
      func::FuncOp consumer = stageFunction(stage, reader);
      if (!consumer || consumer == function || consumer.getBody().empty())
        continue;
      bool restores = false;
      consumer.walk([&](pipe::RestoreOp) { restores = true; });
      if (savedArgument(consumer, name) && !restores)
        return false;
    }
    return true;
  }

  /// `consumer`'s value of `source`: its argument saved as that name, or the
  /// parameter's argument, or its pipe.restore of the parameter (a new one
  /// beside its others when it fetches other weights); added if it has none.
  Value sourceIn(func::FuncOp consumer, Type type, const Source &source, Location loc) {
    Block &body = consumer.getBody().front();
    if (source.parameter) {
      SmallVector<pipe::RestoreOp> restores;
      consumer.walk([&](pipe::RestoreOp restore) { restores.push_back(restore); });
      for (pipe::RestoreOp restore : restores)
        if (restore.getNameAttr() == source.parameter)
          return restore.getResult();
      if (!restores.empty()) {
        OpBuilder start = OpBuilder::atBlockBegin(&body);
        pipe::RestoreOp like = restores.front();
        return pipe::RestoreOp::create(start, loc, type, like.getMicrobatch(), source.parameter,
                                       like.getSlotsAttr(), like.getVerticalSyncAttr())
            .getResult();
      }
    }
    if (source.saved) {
      if (std::optional<unsigned> saved = savedArgument(consumer, source.saved))
        return consumer.getArgument(*saved);
    } else {
      for (unsigned a = 0; a < consumer.getNumArguments(); ++a) {
        std::optional<nn::Role> role = nn::argumentRole(consumer, a);
        Attribute name = consumer.getArgAttr(a, nn::kNameAttrName);
        if ((role == nn::Role::Param && name == source.parameter) ||
            ((role == nn::Role::Input || role == nn::Role::Label) && source.data && name == source.data))
          return consumer.getArgument(a);
      }
    }
    Builder builder(consumer.getContext());
    DictionaryAttr attrs = source.saved ? builder.getDictionaryAttr(builder.getNamedAttr(kSaved, source.saved))
                                        : source.argumentAttrs;
    return insertArgument(consumer, type, attrs, loc);
  }

  /// Replaces `consumer`'s argument saved as `name` by `ops` (in program
  /// order, the last computing the value) applied to its value of `source`,
  /// just before its first reader.
  void recomputeIn(func::FuncOp consumer, ArrayRef<Operation *> ops, Value sourceValue, StringAttr name,
                   const Source &source) {
    if (!savedArgument(consumer, name))
      return;
    Value input = sourceIn(consumer, sourceValue.getType(), source, ops.front()->getLoc());
    const unsigned read = *savedArgument(consumer, name);
    // Just before its first reader, so that the value lives no longer than it did.
    Value replaced = consumer.getArgument(read);
    Block &body = consumer.getBody().front();
    Operation *first = nullptr;
    for (Operation *user : replaced.getUsers()) {
      Operation *atTop = body.findAncestorOpInBlock(*user);
      if (!first || atTop->isBeforeInBlock(first))
        first = atTop;
    }
    OpBuilder builder = first ? OpBuilder(first) : OpBuilder::atBlockBegin(&body);
    IRMapping mapping;
    mapping.map(sourceValue, input);
    Operation *clone = nullptr;
    for (Operation *op : ops) {
      clone = builder.clone(*op, mapping);
      clone->removeAttr("pipe.storage");
      if (first)
        if (Attribute phase = first->getAttr("pipe.phase"))
          clone->setAttr("pipe.phase", phase);
    }
    replaced.replaceAllUsesWith(clone->getResult(0));
    (void)consumer.eraseArgument(read);
  }
};

} // namespace

SmallVector<Operation *> recomputableFrom(Value result, llvm::function_ref<bool(Value)> isSaved, Value &source) {
  constexpr size_t kMaxRecomputedOps = 8;
  SmallVector<Operation *> ops;
  llvm::SmallPtrSet<Operation *, 8> seen;
  SmallVector<Value> todo{result};
  source = {};
  while (!todo.empty()) {
    Value value = todo.pop_back_val();
    if (value != result && isSaved(value)) {
      if (source && source != value)
        return {};
      source = value;
      continue;
    }
    Operation *op = value.getDefiningOp();
    if (!op)
      return {};
    if (!seen.insert(op).second)
      continue;
    const bool constant = llvm::isa<nn::ConstantOp>(op);
    // A pad is a copy with new elements, as cheap to redo as the others; so
    // is a transpose of a parameter (pipec-channels-last's weights), which
    // CUDA stages write in their bf16 conversions' launch.
    Value moved = op->getNumOperands() ? op->getOperand(0) : Value();
    const bool movesParameter = llvm::isa<nn::TransposeOp>(op) &&
                                (llvm::isa<BlockArgument>(moved) || moved.getDefiningOp<pipe::RestoreOp>());
    const bool elementwise =
        (llvm::isa<nn::UnaryElementwiseOpInterface, nn::BinaryElementwiseOpInterface>(op) && isPure(op)) ||
        llvm::isa<nn::PadOp>(op) || movesParameter;
    if ((!constant && !elementwise && !nn::isView(op)) || op->getNumResults() != 1 ||
        (!constant && ops.size() + 1 > kMaxRecomputedOps))
      return {};
    if (op->getBlock() != result.getParentBlock()) // only the function's own ops are cloned
      return {};
    ops.push_back(op);
    for (Value operand : op->getOperands())
      todo.push_back(operand);
  }
  // A lone view of a saved source, or constants only, is not a
  // recomputation; a view of a parameter is (pipec-channels-last's 1x1
  // weights): each reader views its own parameter instead of a saved copy.
  const bool computes =
      llvm::any_of(ops, [](Operation *op) { return !nn::isView(op) && !llvm::isa<nn::ConstantOp>(op); });
  const bool ofParameter =
      source && (llvm::isa<BlockArgument>(source) || source.getDefiningOp<pipe::RestoreOp>()) &&
      llvm::any_of(ops, [](Operation *op) { return nn::isView(op); });
  if (!source || (!computes && !ofParameter))
    return {};
  llvm::sort(ops, [](Operation *a, Operation *b) { return a->isBeforeInBlock(b); });
  return ops;
}

void WeightStashingOptions::bind(settings::Binder &b) {
  b.integer(settings::kWeightVersions, versions);
  b.flag(settings::kVerticalSync, verticalSync);
  b.flag(settings::kFromPlan, fromPlan);
}

std::unique_ptr<Pass> createWeightStashing(const WeightStashingOptions &options) {
  return std::make_unique<WeightStashing>(options);
}

} // namespace pipec::passes
