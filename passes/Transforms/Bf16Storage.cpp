// pipec-bf16-storage: activations, their gradients and the tensors sent
// between stages stored in bfloat16; master weights, optimizer state,
// parameter gradients, losses and normalization statistics in float32
// (docs/cuda-codegen.md, "bf16 storage").
#include "passes/Passes.h"
#include "passes/Transforms/OutlineStages.h"

#include "dialects/nn/NNDialect.h"
#include "dialects/pipe/PipeDialect.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/StringMap.h"

namespace pipec::passes {
#define GEN_PASS_DEF_BF16STORAGE
#include "passes/Passes.h.inc"
} // namespace pipec::passes

using namespace mlir;

namespace pipec::passes {
namespace {

using stages::kSaved;

/// The largest bf16 copy of a constant that is made with the arguments' at
/// a function's start (1 MiB: tables and padded biases, not frozen weights).
constexpr int64_t kHoistedConstantBytes = int64_t(1) << 20;

RankedTensorType floatTensor(Type type) {
  auto tensor = llvm::dyn_cast<RankedTensorType>(type);
  return tensor && (tensor.getElementType().isF32() || tensor.getElementType().isBF16()) ? tensor : nullptr;
}

RankedTensorType withElement(Type type, Type element) {
  return llvm::cast<RankedTensorType>(type).clone(element);
}

/// How an op's float operands and results are stored.
enum class Kind {
  /// The CUDA kernels have a bfloat16 version (pipec/cuda_kernels.h): its
  /// activation operands and results are bfloat16, the rest float32
  /// (float32Operand, float32Result).
  Bf16Kernel,
  /// Moves or views data: results in the type of the first float operand,
  /// the other float operands converted to it.
  Preserving,
  /// A pipe.fused loop: loads any float storage, stores bfloat16 unless every
  /// use wants float32.
  Fused,
  /// Everything else (constants, ONNX casts, recurrent cells): float32 in
  /// and out.
  Float32Only,
};

Kind kindOf(Operation *op) {
  if (llvm::isa<pipe::FusedOp>(op))
    return Kind::Fused;
  if (llvm::isa<nn::ReshapeOp, nn::FlattenOp, nn::SqueezeOp, nn::UnsqueezeOp, nn::TransposeOp, nn::SplitOp,
                nn::SliceOp, nn::ConcatOp, nn::PadOp, nn::ExpandOp, nn::GatherOp, nn::WhereOp, pipe::AllReduceOp>(op))
    return Kind::Preserving;
  if (auto binary = llvm::dyn_cast<nn::BinaryElementwiseOpInterface>(op))
    return binaryFunction(binary.getBinaryFunction()).result == BinaryResult::Same ? Kind::Bf16Kernel
                                                                                    : Kind::Float32Only;
  if (llvm::isa<nn::UnaryElementwiseOpInterface, nn::UnaryGradOp, nn::BinaryGradOp, nn::RotaryOp, nn::GemmOp,
                nn::GemmActivationGradOp,
                nn::MatMulOp, nn::BatchedGemmOp, nn::LayerNormOp, nn::LayerNormGradOp, nn::LayerNormParamGradOp,
                nn::DropoutOp, nn::DropoutGradOp, nn::SoftmaxOp, nn::SoftmaxGradOp, nn::MaskedSoftmaxOp,
                nn::MaskedSoftmaxGradOp, nn::AttentionOp, nn::AttentionGradOp, nn::SoftmaxCrossEntropyLossOp,
                nn::SoftmaxCrossEntropyLossGradOp, nn::ReduceSumOp, nn::ReduceMeanOp, nn::GatherGradOp,
                nn::SliceGradOp, nn::ConvOp, nn::ConvInputGradOp, nn::ConvWeightGradOp, nn::BatchNormOp,
                nn::BatchNormGradOp, nn::BatchNormParamGradOp, nn::MaxPoolOp, nn::MaxPoolGradOp, nn::AveragePoolOp,
                nn::AveragePoolGradOp, nn::GlobalAveragePoolOp>(op))
    return Kind::Bf16Kernel;
  return Kind::Float32Only;
}

/// The float32 operands of a bfloat16 kernel: parameters it reads as they
/// are (scales, norm and convolution biases, running statistics, rotary
/// tables, class weights), additive masks, the loss's incoming gradient and
/// attention's log-sum-exp. (A GEMM's C is stored as its result is:
/// Bf16Storage::readsFloat32.)
bool float32Operand(Operation *op, Value operand) {
  if (auto conv = llvm::dyn_cast<nn::ConvOp>(op))
    return operand == conv.getBias();
  if (auto norm = llvm::dyn_cast<nn::BatchNormOp>(op))
    return operand != norm.getInput() && operand != norm.getResidual();
  if (auto grad = llvm::dyn_cast<nn::BatchNormGradOp>(op))
    return operand != grad.getDy() && operand != grad.getInput() && operand != grad.getY();
  if (auto grad = llvm::dyn_cast<nn::BatchNormParamGradOp>(op))
    return operand != grad.getDy() && operand != grad.getInput();
  if (auto norm = llvm::dyn_cast<nn::LayerNormOp>(op))
    return operand == norm.getScale() || operand == norm.getBias();
  if (auto grad = llvm::dyn_cast<nn::LayerNormGradOp>(op))
    return operand == grad.getScale();
  if (auto rotary = llvm::dyn_cast<nn::RotaryOp>(op))
    return operand == rotary.getCos() || operand == rotary.getSin();
  if (auto attention = llvm::dyn_cast<nn::AttentionOp>(op))
    return operand == attention.getMask();
  if (auto grad = llvm::dyn_cast<nn::AttentionGradOp>(op))
    return operand == grad.getMask() || operand == grad.getLogSumExp();
  if (auto loss = llvm::dyn_cast<nn::SoftmaxCrossEntropyLossOp>(op))
    return operand == loss.getWeights();
  if (auto grad = llvm::dyn_cast<nn::SoftmaxCrossEntropyLossGradOp>(op))
    return operand == grad.getDloss() || operand == grad.getWeights();
  return false;
}

/// The float32 results of a bfloat16 kernel: statistics, the loss, and the
/// sums that become parameter gradients (reductions, gather, norm and
/// convolution weight gradients).
bool float32Result(Operation *op, unsigned index) {
  if (llvm::isa<nn::LayerNormOp, nn::AttentionOp, nn::BatchNormOp>(op))
    return index > 0; // mean and 1/std; log-sum-exp; running statistics
  if (llvm::isa<nn::SoftmaxCrossEntropyLossOp>(op))
    return index == 0; // the loss (log-probabilities are stored like the scores)
  return llvm::isa<nn::LayerNormParamGradOp, nn::BatchNormParamGradOp, nn::ConvWeightGradOp, nn::ReduceSumOp,
                   nn::ReduceMeanOp, nn::GatherGradOp>(op);
}

/// Ops with float32 results whose kernels read either storage: a gradient
/// summed in float32 (a reduction, an embedding's scatter-add) is never
/// rounded to bfloat16 on its way into a parameter's gradient.
bool readsEitherStorage(Operation *op) {
  return llvm::isa<nn::ReduceSumOp, nn::ReduceMeanOp, nn::GatherGradOp>(op);
}

/// Results that may be written in either storage from bfloat16 operands:
/// matrix products (cuBLAS writes float32 or bfloat16) and fused loops.
bool flexibleResult(Operation *op) {
  return llvm::isa<nn::GemmOp, nn::MatMulOp, nn::BatchedGemmOp, pipe::FusedOp>(op);
}

/// Element-wise ops, whose kernels take float32 storage as well as
/// bfloat16 (pipec/cuda_kernels.h).
bool elementwise(Operation *op) {
  if (auto binary = llvm::dyn_cast<nn::BinaryElementwiseOpInterface>(op))
    return binaryFunction(binary.getBinaryFunction()).result == BinaryResult::Same;
  return llvm::isa<nn::UnaryElementwiseOpInterface, nn::UnaryGradOp, nn::BinaryGradOp>(op);
}

/// Ops whose one result is their operand's value: a view, an all-reduce.
bool passesThrough(Operation *op) { return nn::isView(op) || llvm::isa<pipe::AllReduceOp>(op); }

struct Bf16Storage : impl::Bf16StorageBase<Bf16Storage> {
  using Base::Base;

  void runOnOperation() override {
    getOperation().walk([&](pipe::StageOp stage) {
      llvm::StringMap<Type> saved; // a pipe.saved result's type, by name
      for (StringRef name : {stages::kForward, stages::kBackwardInput, stages::kBackwardWeight})
        if (func::FuncOp function = stages::stageFunction(stage, name))
          if (!function.getBody().empty() && failed(runOnFunction(function, saved)))
            return signalPassFailure();
      stages::updateMemoryAttributes(stage); // the saved bytes, now in their storage
    });
  }

  LogicalResult runOnFunction(func::FuncOp function, llvm::StringMap<Type> &saved) {
    current = function;
    casts.clear();
    readByFloat32.clear();
    lastArgumentCast = nullptr;
    Block &entry = function.getBody().front();
    // A saved value arrives in the storage its producer gave it.
    for (unsigned i = 0; i < function.getNumArguments(); ++i)
      if (auto name = function.getArgAttrOfType<StringAttr>(i, kSaved))
        if (Type type = saved.lookup(name.getValue()))
          entry.getArgument(i).setType(type);
    if (failed(runOnBlock(entry)))
      return failure();
    // Saved results keep their storage; every other result (losses,
    // parameter gradients, outputs) is float32, as the runtime reads it.
    auto ret = llvm::cast<func::ReturnOp>(entry.getTerminator());
    for (OpOperand &operand : ret->getOpOperands()) {
      unsigned i = operand.getOperandNumber();
      auto name = function.getResultAttrOfType<StringAttr>(i, kSaved);
      if (name)
        saved[name.getValue()] = operand.get().getType();
      else
        convert(operand, Float32());
    }
    function.setType(FunctionType::get(function.getContext(), entry.getArgumentTypes(), ret.getOperandTypes()));
    return success();
  }

  LogicalResult runOnBlock(Block &block) {
    SmallVector<Operation *> ops;
    for (Operation &op : block.without_terminator())
      ops.push_back(&op);
    for (Operation *op : ops)
      if (failed(runOnOp(op)))
        return failure();
    return success();
  }

  LogicalResult runOnOp(Operation *op) {
    if (auto recompute = llvm::dyn_cast<pipe::RecomputeOp>(op)) {
      Block &body = recompute.getBody().front();
      for (auto [argument, input] : llvm::zip(body.getArguments(), recompute.getInputs()))
        argument.setType(input.getType());
      if (failed(runOnBlock(body)))
        return failure();
      auto yield = llvm::cast<pipe::YieldOp>(body.getTerminator());
      for (auto [result, value] : llvm::zip(recompute.getResults(), yield.getValues()))
        result.setType(value.getType());
      return success();
    }
    if (auto send = llvm::dyn_cast<pipe::SendOp>(op)) {
      // Between stages activations and their gradients travel in bfloat16:
      // half the bytes, and both ends agree without looking at each other.
      if (floatTensor(send.getValue().getType()))
        convert(send->getOpOperand(0), Bf16());
      return success();
    }
    if (auto recv = llvm::dyn_cast<pipe::RecvOp>(op)) {
      if (floatTensor(recv.getType()))
        Value(recv.getResult()).setType(withElement(recv.getType(), Bf16()));
      return success();
    }
    if (llvm::isa<pipe::StashOp, pipe::RestoreOp>(op))
      return success(); // weights: float32
    const Kind kind = kindOf(op);
    switch (kind) {
    case Kind::Float32Only:
      for (OpOperand &operand : op->getOpOperands())
        if (floatTensor(operand.get().getType()))
          convert(operand, Float32());
      return success();
    case Kind::Preserving: {
      Type storage;
      // A padded, transposed or viewed argument that only bfloat16 kernels
      // read in bfloat16 (pipec-pad-classes' weight, read by its products;
      // pipec-channels-last's weights and input, read by convolutions) is
      // moved in its bfloat16 copy, converted with the other arguments:
      // half the bytes, no float32 copy.
      if ((llvm::isa<nn::PadOp, nn::TransposeOp>(op) || nn::isView(op)) && readsArgument(op) &&
          onlyBf16Readers(op->getResult(0), true))
        storage = Bf16();
      for (OpOperand &operand : op->getOpOperands()) {
        if (auto gather = llvm::dyn_cast<nn::GatherOp>(op); gather && operand.get() != gather.getData())
          continue;
        if (auto where = llvm::dyn_cast<nn::WhereOp>(op); where && operand.get() == where.getCondition())
          continue;
        if (!floatTensor(operand.get().getType()))
          continue;
        if (!storage)
          storage = llvm::cast<RankedTensorType>(operand.get().getType()).getElementType();
        convert(operand, storage);
      }
      if (storage)
        for (Value result : op->getResults())
          if (floatTensor(result.getType()))
            result.setType(withElement(result.getType(), storage));
      hoistArgumentMove(op);
      return success();
    }
    case Kind::Fused:
    case Kind::Bf16Kernel:
      break;
    }
    // Between float32-only ops (recurrent cells, ONNX casts), element-wise
    // work stays float32: bfloat16 would only add a conversion on each side.
    if (kind == Kind::Bf16Kernel && elementwise(op) &&
        llvm::all_of(op->getResults(), [&](Value result) { return readByFloat32Only(result); })) {
      for (OpOperand &operand : op->getOpOperands())
        if (floatTensor(operand.get().getType()))
          convert(operand, Float32());
      return success();
    }
    if (kind != Kind::Fused && !readsEitherStorage(op))
      for (OpOperand &operand : op->getOpOperands())
        if (floatTensor(operand.get().getType()))
          convert(operand, readsFloat32(op, operand.get()) ? Float32() : Bf16());
    for (OpResult result : op->getResults()) {
      if (!floatTensor(result.getType()))
        continue;
      bool keepFloat32 = flexibleResult(op) ? wantsFloat32(result) || (kind == Kind::Fused && readByFloat32Only(result))
                                            : float32Result(op, result.getResultNumber());
      result.setType(withElement(result.getType(), keepFloat32 ? Float32() : Bf16()));
    }
    return success();
  }

  /// Whether the bfloat16 kernel `op` reads `operand` in float32
  /// (float32Operand). A GEMM's C (a bias row, or a matrix it adds) is read
  /// in its result's storage: a bf16 product takes its bias in bf16 (the
  /// type cuBLASLt's bias epilogue wants, docs/gpu-runs.md), converted with
  /// the function's other parameters at its start, instead of a conversion
  /// inside every call; a float32 product (a weight gradient accumulating
  /// into its buffer) keeps C in float32.
  bool readsFloat32(Operation *op, Value operand) {
    if (auto gemm = llvm::dyn_cast<nn::GemmOp>(op))
      return operand == gemm.getC() && wantsFloat32(gemm.getResult());
    return float32Operand(op, operand);
  }

  /// A transpose or view of an argument's bfloat16 copy moves next to the
  /// copy, among the arguments' conversions: code generation then writes
  /// a transpose to channels-last in the conversion table's launch
  /// (docs/cuda-codegen.md, "bf16 storage").
  void hoistArgumentMove(Operation *op) {
    if (!llvm::isa<nn::TransposeOp>(op) && !nn::isView(op))
      return;
    auto cast = op->getOperand(0).getDefiningOp<nn::CastOp>();
    if (!cast || cast.getOperation() != lastArgumentCast || !llvm::isa<BlockArgument>(cast.getInput()))
      return;
    op->moveAfter(cast);
    lastArgumentCast = op;
  }

  /// Whether `op` moves a float32 argument of the function: a parameter
  /// or input, or the weight version pipe.restore fetches.
  bool readsArgument(Operation *op) {
    Value input = op->getOperand(0);
    auto type = floatTensor(input.getType());
    if (!type || !type.getElementType().isF32())
      return false;
    if (input.getDefiningOp<pipe::RestoreOp>())
      return true;
    auto argument = llvm::dyn_cast<BlockArgument>(input);
    if (!argument || argument.getOwner() != &current.getBody().front())
      return false;
    std::optional<nn::Role> role = nn::argumentRole(current, argument.getArgNumber());
    return role == nn::Role::Param || role == nn::Role::Input;
  }

  /// Whether `value` is read, and only by bfloat16 kernels that read it in
  /// bfloat16 (or, `orSaved`, saved for a later function, as activations
  /// are: in bfloat16).
  bool onlyBf16Readers(Value value, bool orSaved = false) {
    return !value.use_empty() && llvm::all_of(value.getUses(), [&](OpOperand &use) {
      if (orSaved && llvm::isa<func::ReturnOp>(use.getOwner()))
        return static_cast<bool>(current.getResultAttr(use.getOperandNumber(), kSaved));
      return kindOf(use.getOwner()) == Kind::Bf16Kernel && !readsFloat32(use.getOwner(), value);
    });
  }

  /// Whether every use of `value` reads float32: it is returned as a loss,
  /// gradient or output, or read by a float32-only op or a float32 operand
  /// (through views). A value without uses is stored in bfloat16.
  bool wantsFloat32(Value value) {
    if (value.use_empty())
      return false;
    for (OpOperand &use : value.getUses()) {
      Operation *user = use.getOwner();
      if (llvm::isa<func::ReturnOp>(user)) {
        if (current.getResultAttr(use.getOperandNumber(), kSaved))
          return false;
        continue;
      }
      if (passesThrough(user)) {
        if (!wantsFloat32(user->getResult(0)))
          return false;
        continue;
      }
      if (llvm::isa<pipe::SendOp, pipe::YieldOp, pipe::RecomputeOp, pipe::FusedOp>(user))
        return false;
      Kind kind = kindOf(user);
      if (kind == Kind::Float32Only || (kind == Kind::Bf16Kernel && readsFloat32(user, value)))
        continue;
      // A slice keeps its operand's storage (a padded weight's gradient,
      // pipec-pad-classes, on its way into the parameter's float32 gradient),
      // and element-wise work between float32 values stays float32.
      if (llvm::isa<nn::SliceOp>(user) && wantsFloat32(user->getResult(0)))
        continue;
      if (kind == Kind::Bf16Kernel && elementwise(user) &&
          llvm::all_of(user->getResults(), [&](Value result) { return readByFloat32Only(result); }))
        continue;
      return false;
    }
    return true;
  }

  /// Whether the readers of an element-wise result in this function all
  /// read float32 and at least one of them is no view or save: float32-only
  /// ops, float32 operands, and element-wise ops that stay float32 by this
  /// rule. Being saved for the backward counts neither way (the float32-only
  /// ops' gradients read their activations in float32 too), unlike
  /// wantsFloat32, and neither does a fused loop, which loads either storage
  /// (a residual read by the next block's add).
  bool readByFloat32Only(Value value) {
    auto known = readByFloat32.find(value);
    if (known != readByFloat32.end())
      return known->second;
    bool some = false, all = true;
    for (OpOperand &use : value.getUses()) {
      Operation *user = use.getOwner();
      if (llvm::isa<func::ReturnOp>(user)) {
        some |= !current.getResultAttr(use.getOperandNumber(), kSaved);
        continue;
      }
      if (passesThrough(user) || llvm::isa<nn::SliceOp>(user)) { // a slice keeps its operand's storage
        all = readByFloat32Only(user->getResult(0));
        some |= all;
      } else if (llvm::isa<pipe::FusedOp>(user)) {
        continue; // a fused loop loads either storage
      } else if (llvm::isa<pipe::SendOp, pipe::YieldOp, pipe::RecomputeOp>(user)) {
        all = false;
      } else {
        const Kind kind = kindOf(user);
        all = kind == Kind::Float32Only || (kind == Kind::Bf16Kernel && readsFloat32(user, value)) ||
              (kind == Kind::Bf16Kernel && elementwise(user) &&
               llvm::all_of(user->getResults(), [&](Value result) { return readByFloat32Only(result); }));
        some |= all;
      }
      if (!all)
        break;
    }
    return readByFloat32[value] = all && some;
  }

  /// Makes `operand` read its value in `element` storage: through one nn.cast
  /// per value and storage in the function, placed before the first reader;
  /// the function's own arguments (parameters a product reads, data) and
  /// constants are converted together at its start, which code generation
  /// makes one launch (docs/cuda-codegen.md, "bf16 storage"). A constant
  /// reads nothing, so it moves to the start for that, up to
  /// kHoistedConstantBytes of bf16 copy.
  void convert(OpOperand &operand, Type element) {
    Value value = operand.get();
    if (llvm::cast<RankedTensorType>(value.getType()).getElementType() == element)
      return;
    Type type = withElement(value.getType(), element);
    Value &cast = casts[{value, type}];
    if (!cast) {
      Block *home = value.getParentBlock();
      OpBuilder builder(home->findAncestorOpInBlock(*operand.getOwner()));
      // A small constant only: a large one (a frozen weight) keeps its copy's
      // life short, made before its first reader.
      auto constant = value.getDefiningOp<nn::ConstantOp>();
      if (constant && llvm::cast<RankedTensorType>(value.getType()).getNumElements() * 2 > kHoistedConstantBytes)
        constant = nullptr;
      const bool argument =
          (llvm::isa<BlockArgument>(value) || constant) && home == &current.getBody().front();
      if (constant && argument && &home->front() != constant.getOperation())
        constant->moveBefore(&home->front());
      if (argument) {
        if (lastArgumentCast)
          builder.setInsertionPointAfter(lastArgumentCast);
        else if (constant)
          builder.setInsertionPointAfter(constant);
        else
          builder.setInsertionPointToStart(home);
      }
      cast = nn::CastOp::create(builder, value.getLoc(), type, value);
      if (argument)
        lastArgumentCast = cast.getDefiningOp();
      if (auto stage = operand.getOwner()->getAttr("pipe.stage"))
        cast.getDefiningOp()->setAttr("pipe.stage", stage);
      if (auto phase = operand.getOwner()->getAttr("pipe.phase"))
        cast.getDefiningOp()->setAttr("pipe.phase", phase);
      ++numCasts;
    }
    operand.set(cast);
  }

  Type Bf16() { return BFloat16Type::get(&getContext()); }
  Type Float32() { return Float32Type::get(&getContext()); }

  func::FuncOp current;
  llvm::DenseMap<std::pair<Value, Type>, Value> casts;
  llvm::DenseMap<Value, bool> readByFloat32; // readByFloat32Only's answers in this function
  Operation *lastArgumentCast = nullptr; // the function's argument conversions end here
};

} // namespace

bool keepsFloat32Storage(Value value) {
  Operation *op = value.getDefiningOp();
  if (!op || !floatTensor(value.getType()))
    return true; // arguments (parameters, the model's inputs) and non-float values
  switch (kindOf(op)) {
  case Kind::Fused: return false;
  case Kind::Preserving:
    for (Value operand : op->getOperands())
      if (floatTensor(operand.getType()))
        return keepsFloat32Storage(operand);
    return true;
  case Kind::Bf16Kernel: return float32Result(op, llvm::cast<OpResult>(value).getResultNumber());
  case Kind::Float32Only: return true;
  }
  return true;
}

} // namespace pipec::passes
