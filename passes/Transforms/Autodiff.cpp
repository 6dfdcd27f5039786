// pipec-append-loss and pipec-autodiff: from @forward (ending in logits or a
// loss) to @train_step returning the loss, every parameter's gradient and
// the updated buffers, with input-gradient (B) and weight-gradient (W) ops
// kept apart for zero-bubble schedules.
#include "passes/Passes.h"
#include "passes/OptionsBinder.h"
#include "analysis/Settings/Declared.h"
#include "passes/Analysis/GradientRoles.h"

#include "dialects/nn/NNGradient.h"
#include "dialects/pipe/PipeDialect.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/IRMapping.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"
#include "llvm/ADT/DenseMap.h"

#include <limits>
#include <map>
#include <numeric>

namespace pipec::passes {
#define GEN_PASS_DEF_APPENDLOSS
#define GEN_PASS_DEF_AUTODIFF
#include "passes/Passes.h.inc"
} // namespace pipec::passes

using namespace mlir;

namespace pipec::passes {
namespace {

RankedTensorType tensorType(Value value) { return llvm::cast<RankedTensorType>(value.getType()); }

int64_t productOf(ArrayRef<int64_t> dims) {
  return std::accumulate(dims.begin(), dims.end(), int64_t{1}, std::multiplies<int64_t>());
}

/// Merges identical multi-result gradient ops: a rule that returns one
/// result of an op computing several (batch and layer normalization's scale
/// and bias gradients) builds that op once per operand, and the second copy
/// would redo the whole pass over dy and x. Only pure gradient ops with the
/// same operands and attributes (phase and stage included) merge.
void mergeTwinGradientOps(Block &body) {
  SmallVector<Operation *> kept;
  for (Operation &op : llvm::make_early_inc_range(body.without_terminator())) {
    if (op.getNumResults() < 2 || pipe::phaseOf(&op) == pipe::Phase::Fwd || !isPure(&op))
      continue;
    auto twin = llvm::find_if(kept, [&](Operation *other) {
      return OperationEquivalence::isEquivalentTo(&op, other, OperationEquivalence::IgnoreLocations);
    });
    if (twin == kept.end()) {
      kept.push_back(&op);
      continue;
    }
    op.replaceAllUsesWith(*twin);
    op.erase();
  }
}

//===----------------------------------------------------------------------===//
// pipec-append-loss
//===----------------------------------------------------------------------===//

struct AppendLoss : PassWithOptions<impl::AppendLossBase<AppendLoss>, AppendLossOptions> {
  using PassWithOptions::PassWithOptions;


  void runOnOperation() override {
    FailureOr<AppendLossOptions> given = options();
    if (failed(given))
      return signalPassFailure();
    const Loss loss = given->loss;
    auto function = getOperation().lookupSymbol<func::FuncOp>("forward");
    if (!function) {
      getOperation().emitError("has no func.func @forward to append a loss to");
      return signalPassFailure();
    }
    auto returnOp = llvm::cast<func::ReturnOp>(function.getBody().front().getTerminator());
    if (returnOp.getNumOperands() == 0) {
      function.emitError("@forward returns nothing to compute a loss from");
      return signalPassFailure();
    }
    Value output = returnOp.getOperand(0);
    if (auto existing = output.getDefiningOp<nn::SoftmaxCrossEntropyLossOp>()) {
      // The model computes its own loss: its labels are the labels.
      if (auto labels = llvm::dyn_cast<BlockArgument>(existing.getLabels()))
        nn::setArgumentRole(function, labels.getArgNumber(), nn::Role::Label);
      keepOnlyLoss(function, returnOp, output);
      return;
    }
    auto outputType = tensorType(output);
    if (llvm::isa<FloatType>(outputType.getElementType()) && outputType.getRank() == 0) {
      // A scalar first output is the model's own loss (MSE, BCE, NLL, a sum
      // of losses: PyTorch's reduced losses are scalars); its targets stay
      // inputs. Asked for a loss of its own, the user meant logits.
      if (loss != Loss::Auto) {
        function.emitError(("the first result of @forward is a scalar, the model's own loss; " + settings::flag(settings::kLoss) + " "))
            << choiceName(loss) << (" needs logits (leave " + settings::flag(settings::kLoss) + " out, or give " + settings::flag(settings::kLoss) + " auto, to train on it)");
        return signalPassFailure();
      }
      keepOnlyLoss(function, returnOp, output);
      return;
    }
    if (!llvm::isa<FloatType>(outputType.getElementType()) || outputType.getRank() < 1) {
      function.emitError("the first result of @forward must be floating-point logits to "
                         "append a loss to, got ")
          << outputType;
      return signalPassFailure();
    }
    OpBuilder builder(returnOp);
    Location loc = NameLoc::get(builder.getStringAttr("loss"), function.getLoc());
    Value lossValue;
    if (loss == Loss::SoftmaxCrossEntropy || loss == Loss::Auto) {
      // [..., C] logits, integer labels shaped like the leading axes.
      ArrayRef<int64_t> shape = outputType.getShape();
      int64_t classes = shape.back();
      SmallVector<int64_t> labelShape(shape.drop_back());
      if (labelShape.empty())
        labelShape.push_back(1);
      int64_t rows = productOf(labelShape);
      Value labels = addArgument(function, RankedTensorType::get(labelShape, builder.getI64Type()),
                                 "labels", nn::Role::Label);
      Value scores = output;
      if (outputType.getRank() != 2)
        scores = nn::ReshapeOp::create(builder, loc,
                                       RankedTensorType::get({rows, classes},
                                                             outputType.getElementType()),
                                       output);
      Value flatLabels = labels;
      if (tensorType(labels).getRank() != 1)
        flatLabels = nn::ReshapeOp::create(builder, loc,
                                           RankedTensorType::get({rows}, builder.getI64Type()),
                                           labels);
      auto lossOp = nn::SoftmaxCrossEntropyLossOp::create(builder, loc, scores, flatLabels,
                                                          /*weights=*/Value(), "mean",
                                                          /*ignore_index=*/nullptr, /*classes=*/nullptr);
      lossValue = lossOp.getLoss();
    } else { // Loss::Mse
      Value labels = addArgument(function, outputType, "labels", nn::Role::Label);
      Value difference = nn::SubOp::create(builder, loc, output, labels);
      Value squared = nn::MulOp::create(builder, loc, difference, difference);
      SmallVector<int64_t> axes(outputType.getRank());
      std::iota(axes.begin(), axes.end(), 0);
      lossValue = nn::ReduceMeanOp::create(builder, loc, squared, axes, /*keepdims=*/false);
    }
    // A partitioned model computes its loss on the stage of its logits.
    if (Operation *producer = output.getDefiningOp())
      if (Attribute stage = producer->getAttr(pipe::kStageAttrName))
        for (Operation *op = producer->getNextNode(); op && op != returnOp; op = op->getNextNode())
          op->setAttr(pipe::kStageAttrName, stage);
    keepOnlyLoss(function, returnOp, lossValue);
  }

  static Value addArgument(func::FuncOp function, Type type, StringRef name, nn::Role role) {
    unsigned index = function.getNumArguments();
    (void)function.insertArgument(index, type, {}, function.getLoc());
    MLIRContext *context = function.getContext();
    function.setArgAttr(index, nn::kNameAttrName, StringAttr::get(context, name));
    nn::setArgumentRole(function, index, role);
    return function.getArgument(index);
  }

  static void keepOnlyLoss(func::FuncOp function, func::ReturnOp returnOp, Value lossValue) {
    OpBuilder builder(returnOp);
    func::ReturnOp::create(builder, returnOp.getLoc(), lossValue);
    returnOp.erase();
    function.removeResAttrsAttr(); // one per former result
    function.setFunctionType(
        FunctionType::get(function.getContext(), function.getArgumentTypes(), {lossValue.getType()}));
    function.setResultAttrs(0, ArrayRef<NamedAttribute>{});
    function.setResultAttr(0, nn::kNameAttrName, StringAttr::get(function.getContext(), "loss"));
    nn::setResultRole(function, 0, nn::Role::Loss);
  }
};

//===----------------------------------------------------------------------===//
// pipec-autodiff
//===----------------------------------------------------------------------===//

struct Autodiff : impl::AutodiffBase<Autodiff> {
  using Base::Base;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    auto forward = module.lookupSymbol<func::FuncOp>("forward");
    if (!forward) {
      module.emitError("has no func.func @forward to differentiate");
      return signalPassFailure();
    }
    if (module.lookupSymbol("train_step")) {
      module.emitError("already has a @train_step");
      return signalPassFailure();
    }
    auto trainStep = llvm::cast<func::FuncOp>(forward->clone());
    trainStep.setSymName("train_step");
    module.push_back(trainStep);
    if (failed(differentiate(trainStep)))
      return signalPassFailure();
  }

  LogicalResult differentiate(func::FuncOp function) {
    Block &body = function.getBody().front();
    auto returnOp = llvm::cast<func::ReturnOp>(body.getTerminator());
    if (returnOp.getNumOperands() < 1)
      return function.emitError("@forward returns no loss");
    Value loss = returnOp.getOperand(0);
    auto lossType = tensorType(loss);
    if (lossType.getNumElements() != 1 || !llvm::isa<FloatType>(lossType.getElementType()))
      return function.emitError("the first result of @forward must be a scalar loss (run "
                                "pipec-append-loss), got ")
             << lossType;

    MLIRContext *context = &getContext();
    for (Operation &op : body.without_terminator())
      pipe::setPhase(&op, pipe::Phase::Fwd);

    GradientRoles roles(function);
    OpBuilder builder(returnOp);
    llvm::DenseMap<Value, Value> gradients;
    auto stageOf = [](Operation *op) { return op ? op->getAttr(pipe::kStageAttrName) : Attribute(); };

    /// Runs `emit` and marks every op it created with the phase and stage.
    auto tagged = [&](pipe::Phase phase, Attribute stage, llvm::function_ref<Value()> emit) {
      Operation *before = returnOp->getPrevNode();
      Value value = emit();
      for (Operation *op = before ? before->getNextNode() : &body.front(); op != returnOp;
           op = op->getNextNode()) {
        pipe::setPhase(op, phase);
        if (stage)
          op->setAttr(pipe::kStageAttrName, stage);
      }
      return value;
    };
    auto phaseOf = [&](Value value) {
      return roles.isWeightGradient(value) ? pipe::Phase::BwdWeight : pipe::Phase::BwdInput;
    };
    // A value's gradient contributions are summed per stage first, on the
    // stage that computed them; the partial sums are then added from the
    // last stage to the first, each on the earlier of the two. So one
    // gradient per value crosses each stage boundary, and only towards
    // earlier stages, even when a cut falls at an antichain of the graph
    // and the forward order of ops does not follow the stages
    // (docs/stages.md).
    auto stageNumber = [](Attribute stage) -> int64_t {
      auto number = llvm::dyn_cast_or_null<IntegerAttr>(stage);
      return number ? number.getInt() : std::numeric_limits<int64_t>::max();
    };
    llvm::DenseMap<Value, std::map<int64_t, std::pair<Attribute, Value>>> partials;
    auto accumulate = [&](Value target, Value contribution, Attribute stage) {
      auto [it, inserted] =
          partials[target].try_emplace(stageNumber(stage), stage, contribution);
      if (!inserted)
        it->second.second = tagged(phaseOf(target), stage, [&] {
          return Value(nn::AddOp::create(builder, contribution.getLoc(), it->second.second,
                                         contribution));
        });
    };
    auto gradientOf = [&](Value target) -> Value {
      if (Value done = gradients.lookup(target))
        return done;
      auto found = partials.find(target);
      if (found == partials.end())
        return Value();
      Value sum;
      for (auto &entry : llvm::reverse(found->second)) {
        Attribute stage = entry.second.first;
        Value partial = entry.second.second;
        sum = !sum ? partial : tagged(phaseOf(target), stage, [&] {
          return Value(nn::AddOp::create(builder, partial.getLoc(), sum, partial));
        });
      }
      gradients[target] = sum;
      return sum;
    };

    Operation *lossProducer = loss.getDefiningOp();
    Value seed = tagged(pipe::Phase::BwdInput, stageOf(lossProducer), [&] {
      return Value(nn::ConstantOp::create(
          builder, NameLoc::get(builder.getStringAttr("loss_seed"), function.getLoc()),
          DenseElementsAttr::get(lossType, builder.getFloatAttr(lossType.getElementType(), 1.0))));
    });
    gradients[loss] = seed;

    SmallVector<Operation *> forwardOps;
    for (Operation &op : body.without_terminator())
      if (pipe::phaseOf(&op) == pipe::Phase::Fwd)
        forwardOps.push_back(&op);
    for (Operation *op : llvm::reverse(forwardOps)) {
      SmallVector<Value> dys;
      bool any = false;
      for (Value result : op->getResults()) {
        Value dy = gradientOf(result);
        dys.push_back(dy);
        any |= static_cast<bool>(dy);
      }
      if (!any)
        continue;
      auto differentiable = llvm::dyn_cast<nn::GradientOpInterface>(op);
      nn::GradientBuilder gradient(builder, op->getLoc());
      for (auto [index, operand] : llvm::enumerate(op->getOperands())) {
        if (!roles.needsGradient(operand) ||
            (differentiable && differentiable.gradientInEarlierOperand(static_cast<unsigned>(index))))
          continue;
        if (!differentiable)
          return op->emitOpError("has no gradient rule (nn's GradientOpInterface), but the loss "
                                 "depends on operand #")
                 << index << " through it";
        Value contribution = tagged(phaseOf(operand), stageOf(op), [&] {
          return differentiable.buildGradient(gradient, dys, static_cast<unsigned>(index));
        });
        if (!contribution)
          return op->emitOpError("pipec-autodiff has no gradient for operand #")
                 << index << " of this op";
        accumulate(operand, contribution, stageOf(op));
      }
    }

    // Results: the loss, each trained parameter's gradient, updated buffers.
    SmallVector<Value> results{loss};
    SmallVector<std::pair<nn::Role, StringAttr>> resultNames{{nn::Role::Loss, nullptr}};
    for (BlockArgument argument : function.getArguments()) {
      auto name = function.getArgAttrOfType<StringAttr>(argument.getArgNumber(), nn::kNameAttrName);
      if (nn::argumentRole(function, argument.getArgNumber()) != nn::Role::Param)
        continue;
      Value grad = gradientOf(argument);
      if (!grad) {
        // Unused by the loss: a zero gradient keeps the optimizer uniform.
        auto type = tensorType(argument);
        grad = tagged(pipe::Phase::BwdWeight, Attribute(), [&] {
          return Value(nn::ConstantOp::create(
              builder, function.getLoc(),
              DenseElementsAttr::get(type, builder.getFloatAttr(type.getElementType(), 0.0))));
        });
      }
      results.push_back(grad);
      resultNames.push_back({nn::Role::Grad, name});
    }
    for (Operation *op : forwardOps) {
      auto norm = llvm::dyn_cast<nn::BatchNormOp>(op);
      if (!norm || !norm.getTraining())
        continue;
      for (auto [buffer, updated] : {std::pair<Value, Value>{norm.getRunningMean(), norm.getNewRunningMean()},
                                     std::pair<Value, Value>{norm.getRunningVar(), norm.getNewRunningVar()}}) {
        auto argument = llvm::dyn_cast<BlockArgument>(buffer);
        if (!argument)
          continue;
        results.push_back(updated);
        resultNames.push_back(
            {nn::Role::BufferUpdate,
             function.getArgAttrOfType<StringAttr>(argument.getArgNumber(), nn::kNameAttrName)});
      }
    }
    func::ReturnOp::create(builder, returnOp.getLoc(), results);
    returnOp.erase();
    SmallVector<Type> resultTypes;
    for (Value result : results)
      resultTypes.push_back(result.getType());
    function.setFunctionType(FunctionType::get(context, function.getArgumentTypes(), resultTypes));
    function.setAllResultAttrs(ArrayRef<DictionaryAttr>{});
    for (auto [index, entry] : llvm::enumerate(resultNames)) {
      nn::setResultRole(function, index, entry.first);
      function.setResultAttr(index, nn::kNameAttrName,
                             entry.second ? entry.second : StringAttr::get(context, "loss"));
    }
    // Last, once the return uses the results: merging replaces those uses
    // (`results` may name a merged op's values).
    mergeTwinGradientOps(body);
    return success();
  }
};

} // namespace

void AppendLossOptions::bind(settings::Binder &b) { b.choice(settings::kLoss, loss); }

std::unique_ptr<Pass> createAppendLoss(const AppendLossOptions &options) {
  return std::make_unique<AppendLoss>(options);
}

} // namespace pipec::passes
