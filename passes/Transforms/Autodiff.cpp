// pipec-append-loss and pipec-autodiff: from @forward (ending in logits or a
// loss) to @train_step returning the loss, every parameter's gradient and
// the updated buffers, with input-gradient (B) and weight-gradient (W) ops
// kept apart for zero-bubble schedules.
#include "passes/Passes.h"
#include "passes/Analysis/GradientRoles.h"

#include "dialects/nn/NNDialect.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/IRMapping.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/TypeSwitch.h"

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

//===----------------------------------------------------------------------===//
// pipec-append-loss
//===----------------------------------------------------------------------===//

struct AppendLoss : impl::AppendLossBase<AppendLoss> {
  using Base::Base;

  void runOnOperation() override {
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
        function.setArgAttr(labels.getArgNumber(), "nn.role",
                            StringAttr::get(&getContext(), "label"));
      keepOnlyLoss(function, returnOp, output);
      return;
    }
    auto outputType = tensorType(output);
    if (!llvm::isa<FloatType>(outputType.getElementType()) || outputType.getRank() < 1) {
      function.emitError("the first result of @forward must be floating-point logits to "
                         "append a loss to, got ")
          << outputType;
      return signalPassFailure();
    }
    OpBuilder builder(returnOp);
    Location loc = NameLoc::get(builder.getStringAttr("loss"), function.getLoc());
    Value lossValue;
    if (loss == "softmax-cross-entropy") {
      // [..., C] logits, integer labels shaped like the leading axes.
      ArrayRef<int64_t> shape = outputType.getShape();
      int64_t classes = shape.back();
      SmallVector<int64_t> labelShape(shape.drop_back());
      if (labelShape.empty())
        labelShape.push_back(1);
      int64_t rows = productOf(labelShape);
      Value labels = addArgument(function, RankedTensorType::get(labelShape, builder.getI64Type()),
                                 "labels", "label");
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
                                                          /*ignore_index=*/nullptr);
      lossValue = lossOp.getLoss();
    } else if (loss == "mse") {
      Value labels = addArgument(function, outputType, "labels", "label");
      Value difference = nn::SubOp::create(builder, loc, output, labels);
      Value squared = nn::MulOp::create(builder, loc, difference, difference);
      SmallVector<int64_t> axes(outputType.getRank());
      std::iota(axes.begin(), axes.end(), 0);
      lossValue = nn::ReduceMeanOp::create(builder, loc, squared, axes, /*keepdims=*/false);
    } else {
      function.emitError("unknown --loss '") << loss << "' (softmax-cross-entropy or mse)";
      return signalPassFailure();
    }
    // A partitioned model computes its loss on the stage of its logits.
    if (Operation *producer = output.getDefiningOp())
      if (Attribute stage = producer->getAttr("pipe.stage"))
        for (Operation *op = producer->getNextNode(); op && op != returnOp; op = op->getNextNode())
          op->setAttr("pipe.stage", stage);
    keepOnlyLoss(function, returnOp, lossValue);
  }

  static Value addArgument(func::FuncOp function, Type type, StringRef name, StringRef role) {
    unsigned index = function.getNumArguments();
    (void)function.insertArgument(index, type, {}, function.getLoc());
    MLIRContext *context = function.getContext();
    function.setArgAttr(index, "nn.name", StringAttr::get(context, name));
    function.setArgAttr(index, "nn.role", StringAttr::get(context, role));
    return function.getArgument(index);
  }

  static void keepOnlyLoss(func::FuncOp function, func::ReturnOp returnOp, Value lossValue) {
    OpBuilder builder(returnOp);
    func::ReturnOp::create(builder, returnOp.getLoc(), lossValue);
    returnOp.erase();
    function.setFunctionType(
        FunctionType::get(function.getContext(), function.getArgumentTypes(), {lossValue.getType()}));
    function.setResultAttrs(0, ArrayRef<NamedAttribute>{});
    function.setResultAttr(0, "nn.name", StringAttr::get(function.getContext(), "loss"));
    function.setResultAttr(0, "nn.role", StringAttr::get(function.getContext(), "loss"));
  }
};

//===----------------------------------------------------------------------===//
// pipec-autodiff
//===----------------------------------------------------------------------===//

/// Builds gradient ops at the end of @train_step's body.
class GradientBuilder {
public:
  GradientBuilder(OpBuilder &builder, Location loc) : b(builder), loc(loc) {}

  Value scalar(Type element, double value) {
    auto type = RankedTensorType::get({}, element);
    return nn::ConstantOp::create(b, loc, DenseElementsAttr::get(type, b.getFloatAttr(element, value)));
  }

  Value reshape(Value value, RankedTensorType type) {
    if (value.getType() == type)
      return value;
    return nn::ReshapeOp::create(b, loc, type, value);
  }

  /// Sums a gradient over the axes its operand was broadcast along.
  Value sumTo(Value gradient, RankedTensorType target) {
    auto type = tensorType(gradient);
    if (type == target)
      return gradient;
    int64_t offset = type.getRank() - target.getRank();
    SmallVector<int64_t> axes;
    for (int64_t axis = 0; axis < type.getRank(); ++axis)
      if (axis < offset || (target.getDimSize(axis - offset) == 1 && type.getDimSize(axis) != 1))
        axes.push_back(axis);
    Value reduced = axes.empty() ? gradient
                                 : Value(nn::ReduceSumOp::create(b, loc, gradient, axes, true));
    return reshape(reduced, target);
  }

  Value gemm(Value lhs, Value rhs, float alpha, bool transA, bool transB) {
    return nn::GemmOp::create(b, loc, lhs, rhs, /*c=*/Value(), llvm::APFloat(alpha),
                              llvm::APFloat(1.0f), transA, transB);
  }

  Value transposeLastTwo(Value value) {
    int64_t rank = tensorType(value).getRank();
    SmallVector<int64_t> perm(rank);
    std::iota(perm.begin(), perm.end(), 0);
    std::swap(perm[rank - 1], perm[rank - 2]);
    return nn::TransposeOp::create(b, loc, value, perm);
  }

  /// The gradient of `op`'s operand `index`, given the gradients of its
  /// results (null where a result has none).
  Value gradient(Operation *op, ArrayRef<Value> dys, unsigned index);

  OpBuilder &b;
  Location loc;
};

Value GradientBuilder::gradient(Operation *op, ArrayRef<Value> dys, unsigned index) {
  Value dy = dys.empty() ? Value() : dys[0];
  Value operand = op->getOperand(index);
  auto operandType = tensorType(operand);
  return llvm::TypeSwitch<Operation *, Value>(op)
      .Case([&](nn::AddOp) { return sumTo(dy, operandType); })
      .Case([&](nn::SubOp add) {
        if (index == 0)
          return sumTo(dy, operandType);
        return sumTo(nn::BinaryGradOp::create(b, loc, dy, add.getLhs(), add.getRhs(), "sub_rhs"),
                     operandType);
      })
      .Case([&](nn::MulOp mul) {
        Value other = index == 0 ? mul.getRhs() : mul.getLhs();
        return sumTo(nn::MulOp::create(b, loc, dy, other), operandType);
      })
      .Case([&](nn::DivOp div) {
        if (index == 0)
          return sumTo(nn::DivOp::create(b, loc, dy, div.getRhs()), operandType);
        return sumTo(nn::BinaryGradOp::create(b, loc, dy, div.getLhs(), div.getRhs(), "div_rhs"),
                     operandType);
      })
      .Case([&](nn::PowOp pow) {
        return sumTo(nn::BinaryGradOp::create(b, loc, dy, pow.getLhs(), pow.getRhs(),
                                              index == 0 ? "pow_lhs" : "pow_rhs"),
                     operandType);
      })
      .Case([&](nn::WhereOp where) -> Value {
        if (index == 0)
          return Value();
        Value zero = scalar(tensorType(dy).getElementType(), 0.0);
        Value picked = index == 1 ? nn::WhereOp::create(b, loc, where.getCondition(), dy, zero)
                                  : nn::WhereOp::create(b, loc, where.getCondition(), zero, dy);
        return sumTo(picked, operandType);
      })
      .Case([&](nn::ReluOp relu) {
        return nn::UnaryGradOp::create(b, loc, dy.getType(), dy, relu.getInput(), relu.getResult(),
                                       "relu");
      })
      .Case([&](nn::TanhOp unary) {
        return nn::UnaryGradOp::create(b, loc, dy.getType(), dy, unary.getInput(),
                                       unary.getResult(), "tanh");
      })
      .Case([&](nn::SigmoidOp unary) {
        return nn::UnaryGradOp::create(b, loc, dy.getType(), dy, unary.getInput(),
                                       unary.getResult(), "sigmoid");
      })
      .Case([&](nn::ErfOp unary) {
        return nn::UnaryGradOp::create(b, loc, dy.getType(), dy, unary.getInput(),
                                       unary.getResult(), "erf");
      })
      .Case([&](nn::SqrtOp unary) {
        return nn::UnaryGradOp::create(b, loc, dy.getType(), dy, unary.getInput(),
                                       unary.getResult(), "sqrt");
      })
      .Case([&](nn::GeluOp gelu) {
        return nn::UnaryGradOp::create(b, loc, dy.getType(), dy, gelu.getInput(),
                                       gelu.getResult(),
                                       gelu.getApproximate() == "tanh" ? "gelu_tanh" : "gelu");
      })
      .Case([&](nn::CastOp) -> Value {
        if (!llvm::isa<FloatType>(operandType.getElementType()))
          return Value();
        return nn::CastOp::create(b, loc, operandType, dy);
      })
      .Case([&](nn::GemmOp op) -> Value {
        float alpha = op.getAlpha().convertToFloat();
        bool transA = op.getTransA(), transB = op.getTransB();
        if (index == 0)
          return transA ? gemm(op.getB(), dy, alpha, transB, true)
                        : gemm(dy, op.getB(), alpha, false, !transB);
        if (index == 1)
          return transB ? gemm(dy, op.getA(), alpha, true, transA)
                        : gemm(op.getA(), dy, alpha, !transA, false);
        Value scaled = dy;
        float beta = op.getBeta().convertToFloat();
        if (beta != 1.0f)
          scaled = nn::MulOp::create(b, loc, dy, scalar(tensorType(dy).getElementType(), beta));
        return sumTo(scaled, operandType);
      })
      .Case([&](nn::MatMulOp matmul) {
        // Work on matrices: 1-D operands become [1, K] and [K, 1].
        Value a = matmul.getA(), bValue = matmul.getB();
        auto aType = tensorType(a), bType = tensorType(bValue);
        Type element = aType.getElementType();
        if (aType.getRank() == 1)
          a = reshape(a, RankedTensorType::get({1, aType.getDimSize(0)}, element));
        if (bType.getRank() == 1)
          bValue = reshape(bValue, RankedTensorType::get({bType.getDimSize(0), 1}, element));
        Value full = nn::MatMulOp::create(b, loc, a, bValue);
        Value dyFull = reshape(dy, tensorType(full));
        full.getDefiningOp()->erase();
        Value grad = index == 0 ? Value(nn::MatMulOp::create(b, loc, dyFull, transposeLastTwo(bValue)))
                                : Value(nn::MatMulOp::create(b, loc, transposeLastTwo(a), dyFull));
        Value shaped = index == 0 ? a : bValue;
        return reshape(sumTo(grad, tensorType(shaped)), operandType);
      })
      .Case([&](nn::ConvOp conv) -> Value {
        if (index == 0)
          return nn::ConvInputGradOp::create(b, loc, operandType, dy, conv.getWeight(),
                                             conv.getStrides(), conv.getPads(),
                                             conv.getDilations(), conv.getGroup());
        if (index == 1)
          return nn::ConvWeightGradOp::create(b, loc, operandType, dy, conv.getInput(),
                                              conv.getStrides(), conv.getPads(),
                                              conv.getDilations(), conv.getGroup());
        SmallVector<int64_t> axes{0};
        for (int64_t axis = 2; axis < tensorType(dy).getRank(); ++axis)
          axes.push_back(axis);
        return Value(nn::ReduceSumOp::create(b, loc, dy, axes, false));
      })
      .Case([&](nn::BatchNormOp norm) -> Value {
        if (index == 0)
          return nn::BatchNormGradOp::create(b, loc, dy, norm.getInput(), norm.getScale(),
                                             norm.getRunningMean(), norm.getRunningVar(),
                                             norm.getEpsilon(), norm.getTraining());
        if (index > 2)
          return Value();
        auto params = nn::BatchNormParamGradOp::create(b, loc, dy, norm.getInput(),
                                                       norm.getRunningMean(),
                                                       norm.getRunningVar(), norm.getEpsilon(),
                                                       norm.getTraining());
        return index == 1 ? params.getScaleGrad() : params.getBiasGrad();
      })
      .Case([&](nn::LayerNormOp norm) -> Value {
        if (index == 0)
          return nn::LayerNormGradOp::create(b, loc, dy, norm.getInput(), norm.getScale(),
                                             norm.getAxis(), norm.getEpsilon());
        auto inputType = tensorType(norm.getInput());
        int64_t axis = *nn::normalizeAxis(norm.getAxis(), inputType.getRank());
        auto normalized = RankedTensorType::get(inputType.getShape().drop_front(axis),
                                                inputType.getElementType());
        auto params = nn::LayerNormParamGradOp::create(
            b, loc, TypeRange{normalized, normalized}, dy, norm.getInput(), norm.getAxis(),
            norm.getEpsilon());
        Value grad = index == 1 ? params.getScaleGrad() : params.getBiasGrad();
        return sumTo(grad, operandType);
      })
      .Case([&](nn::MaxPoolOp pool) {
        return nn::MaxPoolGradOp::create(b, loc, operandType, dy, pool.getInput(),
                                         pool.getKernelShape(), pool.getStrides(),
                                         pool.getPads(), pool.getDilations(), pool.getCeilMode());
      })
      .Case([&](nn::AveragePoolOp pool) {
        return nn::AveragePoolGradOp::create(b, loc, operandType, dy, pool.getKernelShape(),
                                             pool.getStrides(), pool.getPads(),
                                             pool.getCeilMode(), pool.getCountIncludePad());
      })
      .Case([&](nn::GlobalAveragePoolOp) {
        int64_t window = productOf(operandType.getShape().drop_front(2));
        Value spread = nn::ExpandOp::create(b, loc, operandType, dy);
        return nn::MulOp::create(b, loc, spread,
                                 scalar(operandType.getElementType(), 1.0 / window));
      })
      .Case([&](nn::DropoutOp dropout) {
        return nn::DropoutGradOp::create(b, loc, operandType, dy, dropout.getMask(),
                                         dropout.getRatio(), dropout.getTraining());
      })
      .Case([&](nn::SoftmaxOp softmax) {
        return nn::SoftmaxGradOp::create(b, loc, dy, softmax.getResult(), softmax.getAxis());
      })
      .Case([&](nn::SoftmaxCrossEntropyLossOp loss) -> Value {
        if (index != 0)
          return Value();
        return nn::SoftmaxCrossEntropyLossGradOp::create(
            b, loc, operandType, dy, loss.getScores(), loss.getLabels(), loss.getWeights(),
            loss.getReduction(), loss.getIgnoreIndexAttr());
      })
      .Case([&](nn::ReduceMeanOp mean) {
        ArrayRef<int64_t> axes = mean.getAxes();
        SmallVector<int64_t> kept(operandType.getShape());
        int64_t count = 1;
        for (int64_t axis = 0; axis < operandType.getRank(); ++axis)
          if (axes.empty() || llvm::is_contained(axes, axis)) {
            count *= kept[axis];
            kept[axis] = 1;
          }
        Value shaped = reshape(dy, RankedTensorType::get(kept, operandType.getElementType()));
        Value spread = nn::ExpandOp::create(b, loc, operandType, shaped);
        return nn::MulOp::create(b, loc, spread, scalar(operandType.getElementType(), 1.0 / count));
      })
      .Case([&](nn::GatherOp gather) -> Value {
        if (index != 0)
          return Value();
        return nn::GatherGradOp::create(b, loc, operandType, dy, gather.getIndices(),
                                        gather.getAxis());
      })
      .Case<nn::ReshapeOp, nn::FlattenOp, nn::SqueezeOp, nn::UnsqueezeOp>(
          [&](Operation *) { return reshape(dy, operandType); })
      .Case([&](nn::ExpandOp) { return sumTo(dy, operandType); })
      .Case([&](nn::TransposeOp transpose) {
        ArrayRef<int64_t> perm = transpose.getPerm();
        SmallVector<int64_t> inverse(perm.size());
        for (auto [position, axis] : llvm::enumerate(perm))
          inverse[axis] = position;
        return nn::TransposeOp::create(b, loc, dy, inverse);
      })
      .Case([&](nn::ConcatOp concat) {
        int64_t rank = operandType.getRank();
        int64_t axis = *nn::normalizeAxis(concat.getAxis(), rank);
        int64_t start = 0;
        for (unsigned i = 0; i < index; ++i)
          start += tensorType(concat.getInputs()[i]).getDimSize(axis);
        SmallVector<int64_t> starts(rank, 0), ends(tensorType(dy).getShape()), steps(rank, 1);
        starts[axis] = start;
        ends[axis] = start + operandType.getDimSize(axis);
        return nn::SliceOp::create(b, loc, dy, starts, ends, steps);
      })
      .Case([&](nn::SplitOp split) {
        SmallVector<Value> pieces;
        for (auto [piece, result] : llvm::zip(dys, split.getResults())) {
          if (piece) {
            pieces.push_back(piece);
            continue;
          }
          auto type = tensorType(result);
          pieces.push_back(nn::ConstantOp::create(
              b, loc, DenseElementsAttr::get(type, b.getFloatAttr(type.getElementType(), 0.0))));
        }
        return nn::ConcatOp::create(b, loc, pieces, split.getAxis());
      })
      .Case([&](nn::SliceOp slice) {
        return nn::SliceGradOp::create(b, loc, operandType, dy, slice.getStarts(), slice.getEnds(),
                                       slice.getSteps());
      })
      .Case([&](nn::PadOp pad) {
        int64_t rank = operandType.getRank();
        ArrayRef<int64_t> pads = pad.getPads();
        SmallVector<int64_t> starts(pads.take_front(rank)), ends, steps(rank, 1);
        for (int64_t axis = 0; axis < rank; ++axis)
          ends.push_back(pads[axis] + operandType.getDimSize(axis));
        return nn::SliceOp::create(b, loc, dy, starts, ends, steps);
      })
      .Default([&](Operation *) { return Value(); });
}

/// Ops whose gradients the rules above leave out on purpose.
bool hasNoGradient(Operation *op) { return llvm::isa<nn::EqualOp, nn::ConstantOp>(op); }

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
      op.setAttr("pipe.phase", StringAttr::get(context, "fwd"));

    GradientRoles roles(function);
    OpBuilder builder(returnOp);
    llvm::DenseMap<Value, Value> gradients;
    auto stageOf = [](Operation *op) { return op ? op->getAttr("pipe.stage") : Attribute(); };

    /// Runs `emit` and marks every op it created with the phase and stage.
    auto tagged = [&](StringRef phase, Attribute stage, llvm::function_ref<Value()> emit) {
      Operation *before = returnOp->getPrevNode();
      Value value = emit();
      for (Operation *op = before ? before->getNextNode() : &body.front(); op != returnOp;
           op = op->getNextNode()) {
        op->setAttr("pipe.phase", StringAttr::get(context, phase));
        if (stage)
          op->setAttr("pipe.stage", stage);
      }
      return value;
    };
    auto phaseOf = [&](Value value) {
      return roles.isWeightGradient(value) ? "bwd_weight" : "bwd_input";
    };
    auto accumulate = [&](Value target, Value contribution, Attribute stage) {
      auto [it, inserted] = gradients.try_emplace(target, contribution);
      if (!inserted)
        it->second = tagged(phaseOf(target), stage, [&] {
          return Value(nn::AddOp::create(builder, contribution.getLoc(), it->second, contribution));
        });
    };

    Operation *lossProducer = loss.getDefiningOp();
    Value seed = tagged("bwd_input", stageOf(lossProducer), [&] {
      return Value(nn::ConstantOp::create(
          builder, NameLoc::get(builder.getStringAttr("loss_seed"), function.getLoc()),
          DenseElementsAttr::get(lossType, builder.getFloatAttr(lossType.getElementType(), 1.0))));
    });
    gradients[loss] = seed;

    SmallVector<Operation *> forwardOps;
    for (Operation &op : body.without_terminator())
      if (op.getAttrOfType<StringAttr>("pipe.phase").getValue() == "fwd")
        forwardOps.push_back(&op);
    for (Operation *op : llvm::reverse(forwardOps)) {
      SmallVector<Value> dys;
      bool any = false;
      for (Value result : op->getResults()) {
        Value dy = gradients.lookup(result);
        dys.push_back(dy);
        any |= static_cast<bool>(dy);
      }
      if (!any || hasNoGradient(op))
        continue;
      GradientBuilder gradient(builder, op->getLoc());
      for (auto [index, operand] : llvm::enumerate(op->getOperands())) {
        if (!roles.needsGradient(operand))
          continue;
        Value contribution = tagged(phaseOf(operand), stageOf(op), [&] {
          return gradient.gradient(op, dys, static_cast<unsigned>(index));
        });
        if (!contribution)
          return op->emitOpError("pipec-autodiff has no gradient for operand #")
                 << index << " of this op";
        accumulate(operand, contribution, stageOf(op));
      }
    }

    // Results: the loss, each trained parameter's gradient, updated buffers.
    SmallVector<Value> results{loss};
    SmallVector<std::pair<StringRef, StringAttr>> resultNames{{"loss", nullptr}};
    for (BlockArgument argument : function.getArguments()) {
      auto role = function.getArgAttrOfType<StringAttr>(argument.getArgNumber(), "nn.role");
      auto name = function.getArgAttrOfType<StringAttr>(argument.getArgNumber(), "nn.name");
      if (!role || role.getValue() != "param")
        continue;
      Value grad = gradients.lookup(argument);
      if (!grad) {
        // Unused by the loss: a zero gradient keeps the optimizer uniform.
        auto type = tensorType(argument);
        grad = tagged("bwd_weight", Attribute(), [&] {
          return Value(nn::ConstantOp::create(
              builder, function.getLoc(),
              DenseElementsAttr::get(type, builder.getFloatAttr(type.getElementType(), 0.0))));
        });
      }
      results.push_back(grad);
      resultNames.push_back({"grad", name});
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
            {"buffer_update",
             function.getArgAttrOfType<StringAttr>(argument.getArgNumber(), "nn.name")});
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
      function.setResultAttr(index, "nn.role", StringAttr::get(context, entry.first));
      function.setResultAttr(index, "nn.name",
                             entry.second ? entry.second : StringAttr::get(context, "loss"));
    }
    return success();
  }
};

} // namespace
} // namespace pipec::passes
