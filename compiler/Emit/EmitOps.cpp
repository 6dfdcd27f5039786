// One kernel call per op: the lowering of every nn and pipe op a stage
// holds to the CPU / CUDA kernel API (docs/codegen.md, docs/cuda-codegen.md).
#include "compiler/Emit/StageEmitter.h"

#include "llvm/ADT/TypeSwitch.h"
#include "llvm/Support/Format.h"

#include <cmath>
#include <cstdio>
#include <set>

#include <type_traits>

namespace pipec::emit::detail {

/// Whether `mask` is a constant boolean mask that masks ((value != 0) ==
/// maskedWhen) key j of query i exactly when j > i in every [S, T] slice
/// (its last two axes, at least 2 × 2): a causal mask, which the CUDA
/// kernels can hand to a library as such (pk::declareCausalMask).
static bool isCausalMaskConstant(Value mask, bool maskedWhen) {
  auto constant = mask ? mask.getDefiningOp<nn::ConstantOp>() : nullptr;
  auto dense = constant ? llvm::dyn_cast<DenseElementsAttr>(constant.getValue()) : nullptr;
  if (!dense || !dense.getElementType().isInteger(1) || dense.isSplat())
    return false;
  ArrayRef<int64_t> shape = dense.getType().getShape();
  if (shape.size() < 2 || shape[shape.size() - 2] < 2 || shape.back() < 2)
    return false;
  const int64_t S = shape[shape.size() - 2], T = shape.back();
  int64_t e = 0;
  for (bool value : dense.getValues<bool>()) {
    const int64_t j = e % T, i = e / T % S;
    if ((value == maskedWhen) != (j > i))
      return false;
    ++e;
  }
  return true;
}

static int64_t elementCount(Value value) { return tensorType(value).getNumElements(); }

static std::string elementCType(Value value) { return cType(tensorType(value).getElementType()); }

/// Kinds are enumerators of pipec/vocabulary.h's tables, which the kernels share.
static std::string unaryKindName(Unary unary) {
  return std::string("pk::Unary::") + unaryFunction(unary).enumerator;
}

std::string StageEmitter::attentionDropout(APFloat ratio, uint64_t dropoutOpId) {
  if (ratio.isZero())
    return "0.0f, false, 0ull";
  return f32Literal(ratio.convertToFloat()) + ", !call->inference, " + dropoutStreamKey(dropoutOpId);
}

std::string StageEmitter::scratchThen(Operation *op, const std::string &trailing) const {
  std::string scratch = scratchArgument(op);
  return (scratch.empty() ? std::string(", pipec::kernels::Workspace{}") : scratch) + trailing;
}

std::string StageEmitter::attentionTail(Operation *op, bool sequenceMajor, const nn::AttentionOperandShapes &shapes,
                                        int64_t jointKvHeads) {
  if (!sequenceMajor)
    return scratchArgument(op);
  // A joint row holds the query's heads and the key's and value's.
  const int64_t jointHeads = jointKvHeads ? shapes.query[shapes.query.size() - 2] + 2 * jointKvHeads : 0;
  return scratchThen(op, ", pipec::kernels::AttentionLayout::SequenceMajor" +
                             (jointHeads ? ", " + std::to_string(jointHeads) : std::string()));
}

std::array<std::string, 3> StageEmitter::jointWindows(const std::string &joint,
                                                      const nn::AttentionOperandShapes &shapes) {
  // [L'..., S, H + 2·Hkv, D]: the query's heads, the key's, the value's.
  const size_t rank = shapes.query.size();
  const int64_t width = shapes.query.back(), heads = shapes.query[rank - 2], kvHeads = shapes.key[rank - 2];
  return {joint, joint + " + " + std::to_string(heads * width),
          joint + " + " + std::to_string((heads + kvHeads) * width)};
}

std::string StageEmitter::attentionOperands(std::array<std::string, 3> pointers,
                                            const nn::AttentionOperandShapes &shapes, int64_t jointKvHeads) {
  if (jointKvHeads)
    pointers = jointWindows(pointers[0], shapes);
  return pointers[0] + ", " + dimsConstant("shape_", "x", shapes.query) + ", " + pointers[1] + ", " +
         dimsConstant("shape_", "x", shapes.key) + ", " + pointers[2] + ", " +
         dimsConstant("shape_", "x", shapes.value);
}

void StageEmitter::declareIfCausal(Value mask, bool maskedWhen) {
  if (cuda() && isCausalMaskConstant(mask, maskedWhen))
    out << "  pk::declareCausalMask(" << ptr(mask) << ", " << shapeOf(mask) << ", "
        << (maskedWhen ? "true" : "false") << ");\n";
}

/// Element-wise ops, their gradients and dropout. Whether `op` is one of them.
bool StageEmitter::emitElementwiseOp(Operation *op) {
  bool handled = true;
  llvm::TypeSwitch<Operation *>(op)
      .Case([&](nn::BinaryElementwiseOpInterface binary) {
        Value lhs = op->getOperand(0), rhs = op->getOperand(1);
        Binary function = binary.getBinaryFunction();
        std::string y = allocate(op->getResult(0));
        std::string kind = std::string("pk::Binary::") + binaryFunction(function).enumerator;
        // A bool result: pk::compare over the operands' C type; else pk::binary.
        if (givesBool(function))
          out << "  pk::compare<" << elementCType(lhs) << ">(" << kind;
        else
          out << "  pk::binary(" << kind;
        out << ", " << ptr(lhs) << ", " << shapeOf(lhs) << ", " << ptr(rhs) << ", " << shapeOf(rhs) << ", " << y
            << ");\n";
      })
      .Case([&](nn::WhereOp where) {
        std::string y = allocate(where.getResult());
        out << "  pk::where<" << elementCType(where.getX()) << ">(" << ptr(where.getCondition()) << ", "
            << shapeOf(where.getCondition()) << ", " << ptr(where.getX()) << ", "
            << shapeOf(where.getX()) << ", " << ptr(where.getY()) << ", " << shapeOf(where.getY())
            << ", " << y << ");\n";
      })
      .Case([&](nn::RotaryOp rotary) {
        std::string y = allocate(rotary.getResult());
        out << "  pk::rotary(" << ptr(rotary.getInput()) << ", " << shapeOf(rotary.getInput()) << ", "
            << ptr(rotary.getCos()) << ", " << shapeOf(rotary.getCos()) << ", " << ptr(rotary.getSin()) << ", "
            << shapeOf(rotary.getSin()) << ", " << y << ", " << (rotary.getInterleaved() ? "true" : "false")
            << ", " << (rotary.getTransposed() ? "true" : "false") << ");\n";
      })
      .Case([&](nn::UnaryElementwiseOpInterface unary) {
        std::string y = allocate(op->getResult(0));
        out << "  pk::unary(" << unaryKindName(unary.getUnaryFunction()) << ", "
            << ptr(op->getOperand(0)) << ", " << elementCount(op->getResult(0)) << ", " << y << ");\n";
      })
      .Case([&](nn::CastOp cast) {
        std::string y = allocate(cast.getResult());
        if (cuda() && isBf16Conversion(cast)) {
          PendingConversion conversion{ptr(cast.getInput()), y, tensorType(cast.getResult()).getNumElements()};
          conversion.outsideArena =
              llvm::isa<BlockArgument>(cast.getInput()) || cast.getInput().getDefiningOp<nn::ConstantOp>();
          pendingConversions.push_back(conversion);
          return;
        }
        out << "  pk::cast<" << elementCType(cast.getInput()) << ", " << elementCType(cast.getResult()) << ">("
            << ptr(cast.getInput()) << ", " << elementCount(cast.getResult()) << ", " << y << ");\n";
      })
      .Case([&](nn::DropoutOp dropout) {
        std::string y = allocate(dropout.getResult());
        std::string mask = allocate(dropout.getMask());
        out << "  pk::dropout(" << ptr(dropout.getInput()) << ", " << elementCount(dropout.getResult()) << ", "
            << y << ", " << mask << ", " << f32Literal(dropout.getRatio().convertToFloat())
            << ", " << (dropout.getTraining() ? "!call->inference" : "false") << ", "
            << dropoutStreamKey(dropout) << ");\n";
      })
      .Case([&](nn::DropoutGradOp grad) {
        std::string y = allocate(grad.getResult());
        if (!grad.getMask()) { // the forward's mask drawn again from its key
          out << "  pk::dropoutGradRedrawn(" << ptr(grad.getDy()) << ", " << elementCount(grad.getResult()) << ", " << y
              << ", " << f32Literal(grad.getRatio().convertToFloat()) << ", "
              << (grad.getTraining() ? "true" : "false") << ", "
              << dropoutStreamKey(static_cast<uint64_t>(grad.getDropoutOpId().value_or(0))) << ");\n";
          return;
        }
        out << "  pk::dropoutGrad(" << ptr(grad.getDy()) << ", " << ptr(grad.getMask()) << ", "
            << elementCount(grad.getResult()) << ", " << y << ", "
            << f32Literal(grad.getRatio().convertToFloat()) << ", "
            << (grad.getTraining() ? "true" : "false") << ");\n";
      })
      .Case([&](nn::UnaryGradOp grad) {
        std::string y = allocate(grad.getResult());
        out << "  pk::unaryGrad(" << unaryKindName(grad.getKind()) << ", " << ptr(grad.getDy()) << ", "
            << (grad.getX() ? ptr(grad.getX()) : "nullptr") << ", "
            << (grad.getY() ? ptr(grad.getY()) : "nullptr") << ", " << elementCount(grad.getResult()) << ", "
            << y << ");\n";
      })
      .Case([&](nn::BinaryGradOp grad) {
        std::string y = allocate(grad.getResult());
        out << "  pk::binaryGrad(pk::BinaryGrad::" << binaryGradientKind(grad.getKind()).enumerator
            << ", " << ptr(grad.getDy()) << ", " << ptr(grad.getLhs()) << ", " << shapeOf(grad.getLhs())
            << ", " << ptr(grad.getRhs()) << ", " << shapeOf(grad.getRhs()) << ", " << y << ");\n";
      })
      .Default([&](Operation *) { handled = false; });
  return handled;
}

/// Matrix products and convolutions, with their gradients. Whether `op` is one of them.
bool StageEmitter::emitLinalgOp(Operation *op) {
  bool handled = true;
  llvm::TypeSwitch<Operation *>(op)
      .Case([&](nn::GemmOp gemm) {
        const auto [m, k, kB, cols] =
            nn::gemmDims(tensorType(gemm.getA()), tensorType(gemm.getB()), gemm.getTransA(), gemm.getTransB());
        std::string y = allocate(gemm.getResult());
        std::string preActivation = gemm.getPreActivation() ? allocate(gemm.getPreActivation()) : "";
        // Accumulating into a gradient buffer: C is the result itself, beta 1
        // (pk::gemm's in-place form).
        bool accumulate = accumulatesIntoGradient(gemm.getResult());
        std::string c = accumulate ? y : gemm.getC() ? ptr(gemm.getC()) : "nullptr";
        std::string cShape = accumulate    ? shapeOf(gemm.getResult())
                             : gemm.getC() ? shapeOf(gemm.getC())
                                           : "pk::Shape{}";
        float beta = accumulate ? 1.0f : gemm.getBeta().convertToFloat();
        out << "  pk::gemm(" << ptr(gemm.getA()) << ", " << ptr(gemm.getB()) << ", " << c << ", "
            << cShape << ", " << y << ", " << m << ", " << cols << ", " << k << ", "
            << (gemm.getTransA() ? "true" : "false") << ", "
            << (gemm.getTransB() ? "true" : "false") << ", "
            << f32Literal(gemm.getAlpha().convertToFloat()) << ", " << f32Literal(beta);
        if (auto activation = gemm.getActivation()) { // the epilogue (and where f's input goes)
          out << ", " << unaryKindName(*activation);
          if (!preActivation.empty())
            out << ", " << preActivation;
        }
        out << ");\n";
      })
      .Case([&](nn::GemmActivationGradOp grad) {
        const auto [m, k, kB, cols] =
            nn::gemmDims(tensorType(grad.getA()), tensorType(grad.getB()), grad.getTransA(), grad.getTransB());
        std::string y = allocate(grad.getResult());
        out << "  pk::gemmActivationGrad(" << ptr(grad.getA()) << ", " << ptr(grad.getB()) << ", "
            << ptr(grad.getX()) << ", " << y << ", " << m << ", " << cols << ", " << k << ", "
            << (grad.getTransA() ? "true" : "false") << ", " << (grad.getTransB() ? "true" : "false") << ", "
            << f32Literal(grad.getAlpha().convertToFloat()) << ", " << unaryKindName(grad.getFunction()) << ");\n";
      })
      .Case<nn::MatMulOp, nn::BatchedGemmOp>([&](auto product) {
        // nn.batched_gemm is pk::matmul with its trans flags.
        std::string flags;
        if constexpr (std::is_same_v<decltype(product), nn::BatchedGemmOp>)
          flags = std::string(", ") + (product.getTransA() ? "true" : "false") + ", " +
                  (product.getTransB() ? "true" : "false");
        std::string y = allocate(product.getResult());
        out << "  pk::matmul(" << ptr(product.getA()) << ", " << shapeOf(product.getA()) << ", "
            << ptr(product.getB()) << ", " << shapeOf(product.getB()) << ", " << y << flags << ");\n";
      })
      .Case([&](nn::ConvOp conv) {
        std::string y = allocate(conv.getResult());
        out << "  pk::conv(" << ptr(conv.getInput()) << ", " << shapeOf(conv.getInput()) << ", "
            << ptr(conv.getWeight()) << ", " << shapeOf(conv.getWeight()) << ", "
            << (conv.getBias() ? ptr(conv.getBias()) : "nullptr") << ", " << y << ", "
            << dims(conv.getStrides()) << ", " << dims(conv.getPads()) << ", "
            << dims(conv.getDilations()) << ", " << conv.getGroup()
            << (nn::storesChannelsLast(conv) ? scratchOrDefault(conv) + channelsLastArgument(conv)
                                             : scratchArgument(conv));
        if (conv.getResidual() || conv.getActivation()) // the epilogue (CUDA's channels-last convolutions)
          out << epilogueArguments(conv.getResidual(), conv.getActivation());
        out << ");\n";
      })
      .Case([&](nn::ConvInputGradOp grad) {
        std::string y = allocate(grad.getResult());
        out << "  pk::convInputGrad(" << ptr(grad.getDy()) << ", " << shapeOf(grad.getDy()) << ", "
            << ptr(grad.getWeight()) << ", " << shapeOf(grad.getWeight()) << ", " << y << ", "
            << shapeOf(grad.getResult()) << ", " << dims(grad.getStrides()) << ", "
            << dims(grad.getPads()) << ", " << dims(grad.getDilations()) << ", "
            << grad.getGroup()
            << (nn::storesChannelsLast(grad) ? scratchOrDefault(grad) + channelsLastArgument(grad)
                                             : scratchArgument(grad))
            << ");\n";
      })
      .Case([&](nn::ConvWeightGradOp grad) {
        std::string y = allocate(grad.getResult());
        out << "  pk::convWeightGrad(" << ptr(grad.getDy()) << ", " << shapeOf(grad.getDy())
            << ", " << ptr(grad.getInput()) << ", " << shapeOf(grad.getInput()) << ", " << y
            << ", " << shapeOf(grad.getResult()) << ", " << dims(grad.getStrides()) << ", "
            << dims(grad.getPads()) << ", " << dims(grad.getDilations()) << ", " << grad.getGroup()
            // Into the parameter's gradient buffer (pipec-plan-memory's `gradient` storage).
            << (accumulatesIntoGradient(grad.getResult()) ? scratchAndAccumulate(grad) + channelsLastArgument(grad)
                : nn::storesChannelsLast(grad)            ? scratchOrDefault(grad) + channelsLastArgument(grad, ", false")
                                                          : scratchArgument(grad))
            << ");\n";
      })
      .Default([&](Operation *) { handled = false; });
  return handled;
}

std::string StageEmitter::epilogueArguments(Value residual, std::optional<Unary> activation) {
  return ", " + (residual ? ptr(residual) : std::string("nullptr")) + ", " +
         (activation ? unaryKindName(*activation) : std::string("std::nullopt"));
}

/// Batch and layer normalization, pooling, with their gradients. Whether `op` is one of them.
bool StageEmitter::emitNormPoolOp(Operation *op) {
  bool handled = true;
  llvm::TypeSwitch<Operation *>(op)
      .Case([&](nn::BatchNormOp norm) {
        std::string y = allocate(norm.getResult());
        std::string mean = allocate(norm.getNewRunningMean());
        std::string var = allocate(norm.getNewRunningVar());
        out << "  pk::batchNorm(" << ptr(norm.getInput()) << ", " << shapeOf(norm.getInput())
            << ", " << ptr(norm.getScale()) << ", " << ptr(norm.getBias()) << ", "
            << ptr(norm.getRunningMean()) << ", " << ptr(norm.getRunningVar()) << ", " << y
            << ", " << mean << ", " << var << ", "
            << f32Literal(norm.getEpsilon().convertToFloat()) << ", "
            << f32Literal(norm.getMomentum().convertToFloat()) << ", "
            << (norm.getTraining() ? "!call->inference" : "false");
        if (norm.getResidual() || norm.getActivation() || nn::storesChannelsLast(norm)) // the epilogue
          out << epilogueArguments(norm.getResidual(), norm.getActivation());
        out << channelsLastArgument(norm) << ");\n";
      })
      .Case([&](nn::BatchNormGradOp grad) {
        std::string y = allocate(grad.getResult());
        std::string masked = grad.getMaskedDy() ? allocate(grad.getMaskedDy()) : "nullptr";
        out << "  pk::batchNormGrad(" << ptr(grad.getDy()) << ", " << ptr(grad.getInput()) << ", "
            << shapeOf(grad.getInput()) << ", " << ptr(grad.getScale()) << ", "
            << ptr(grad.getRunningMean()) << ", " << ptr(grad.getRunningVar()) << ", " << y
            << ", " << f32Literal(grad.getEpsilon().convertToFloat()) << ", "
            << (grad.getTraining() ? "true" : "false");
        if (auto activation = grad.getActivation()) // the activation's gradient, folded in
          out << ", " << ptr(grad.getY()) << ", " << unaryKindName(*activation) << ", " << masked
              << channelsLastArgument(grad);
        else
          out << channelsLastArgument(grad, ", nullptr, std::nullopt, nullptr");
        out << ");\n";
      })
      .Case([&](nn::BatchNormParamGradOp grad) {
        std::string scale = allocate(grad.getScaleGrad());
        std::string bias = allocate(grad.getBiasGrad());
        out << "  pk::batchNormParamGrad(" << ptr(grad.getDy()) << ", " << ptr(grad.getInput())
            << ", " << shapeOf(grad.getInput()) << ", " << ptr(grad.getRunningMean()) << ", "
            << ptr(grad.getRunningVar()) << ", " << scale << ", " << bias << ", "
            << f32Literal(grad.getEpsilon().convertToFloat()) << ", "
            << (grad.getTraining() ? "true" : "false")
            // Into the parameters' gradient buffers (pipec-plan-memory's
            // `gradient` storage, both results or neither).
            << (accumulatesIntoGradient(grad.getScaleGrad()) ? ", true" + channelsLastArgument(grad)
                                                              : channelsLastArgument(grad, ", false"))
            << ");\n";
      })
      .Case([&](nn::LayerNormOp norm) {
        std::string y = allocate(norm.getResult());
        std::string mean = allocate(norm.getMean());
        std::string inv = allocate(norm.getInvStdDev());
        out << "  pk::layerNorm(" << ptr(norm.getInput()) << ", " << shapeOf(norm.getInput())
            << ", " << ptr(norm.getScale()) << ", " << shapeOf(norm.getScale()) << ", "
            << (norm.getBias() ? ptr(norm.getBias()) : "nullptr") << ", "
            << (norm.getBias() ? shapeOf(norm.getBias()) : "pk::Shape{}") << ", " << y << ", "
            << mean << ", " << inv << ", " << static_cast<int64_t>(norm.getAxis()) << ", "
            << f32Literal(norm.getEpsilon().convertToFloat()) << ", " << rowNorm(norm.getCentered())
            << scratchArgument(norm) << ");\n";
      })
      .Case([&](nn::LayerNormGradOp grad) {
        std::string y = allocate(grad.getResult());
        out << "  pk::layerNormGrad(" << ptr(grad.getDy()) << ", " << ptr(grad.getInput()) << ", "
            << shapeOf(grad.getInput()) << ", " << ptr(grad.getScale()) << ", "
            << shapeOf(grad.getScale()) << ", " << y << ", "
            << static_cast<int64_t>(grad.getAxis()) << ", "
            << f32Literal(grad.getEpsilon().convertToFloat()) << ", " << rowNorm(grad.getCentered())
            << scratchArgument(grad) << ");\n";
      })
      .Case([&](nn::LayerNormParamGradOp grad) {
        std::string scale = allocate(grad.getScaleGrad());
        std::string bias = allocate(grad.getBiasGrad());
        out << "  pk::layerNormParamGrad(" << ptr(grad.getDy()) << ", " << ptr(grad.getInput())
            << ", " << shapeOf(grad.getInput()) << ", " << shapeOf(grad.getScaleGrad()) << ", "
            << scale << ", " << bias << ", " << static_cast<int64_t>(grad.getAxis()) << ", "
            << f32Literal(grad.getEpsilon().convertToFloat()) << ", " << rowNorm(grad.getCentered());
        // Into the parameters' gradient buffers (pipec-plan-memory's
        // `gradient` storage, both results or neither).
        out << (accumulatesIntoGradient(grad.getScaleGrad()) ? scratchAndAccumulate(grad) : scratchArgument(grad))
            << ");\n";
      })
      .Case([&](nn::MaxPoolOp pool) {
        std::string y = allocate(pool.getResult());
        out << "  pk::maxPool(" << ptr(pool.getInput()) << ", " << shapeOf(pool.getInput()) << ", "
            << y << ", " << dims(pool.getKernelShape()) << ", " << dims(pool.getStrides()) << ", "
            << dims(pool.getPads()) << ", " << dims(pool.getDilations()) << ", "
            << (pool.getCeilMode() ? "true" : "false") << scratchArgument(pool) << channelsLastArgument(pool)
            << ");\n";
      })
      .Case([&](nn::MaxPoolGradOp grad) {
        std::string y = allocate(grad.getResult());
        out << "  pk::maxPoolGrad(" << ptr(grad.getDy()) << ", " << ptr(grad.getInput()) << ", "
            << shapeOf(grad.getInput()) << ", " << y << ", " << dims(grad.getKernelShape())
            << ", " << dims(grad.getStrides()) << ", " << dims(grad.getPads()) << ", "
            << dims(grad.getDilations()) << ", " << (grad.getCeilMode() ? "true" : "false")
            << (nn::storesChannelsLast(grad) ? scratchOrDefault(grad) + channelsLastArgument(grad)
                                             : scratchArgument(grad))
            << ");\n";
      })
      .Case([&](nn::AveragePoolOp pool) {
        std::string y = allocate(pool.getResult());
        out << "  pk::averagePool(" << ptr(pool.getInput()) << ", " << shapeOf(pool.getInput())
            << ", " << y << ", " << dims(pool.getKernelShape()) << ", " << dims(pool.getStrides())
            << ", " << dims(pool.getPads()) << ", " << (pool.getCeilMode() ? "true" : "false")
            << ", " << (pool.getCountIncludePad() ? "true" : "false") << scratchArgument(pool)
            << channelsLastArgument(pool) << ");\n";
      })
      .Case([&](nn::AveragePoolGradOp grad) {
        std::string y = allocate(grad.getResult());
        out << "  pk::averagePoolGrad(" << ptr(grad.getDy()) << ", " << y << ", "
            << shapeOf(grad.getResult()) << ", " << dims(grad.getKernelShape()) << ", "
            << dims(grad.getStrides()) << ", " << dims(grad.getPads()) << ", "
            << (grad.getCeilMode() ? "true" : "false") << ", "
            << (grad.getCountIncludePad() ? "true" : "false") << scratchArgument(grad)
            << channelsLastArgument(grad) << ");\n";
      })
      .Case([&](nn::GlobalAveragePoolOp pool) {
        std::string y = allocate(pool.getResult());
        out << "  pk::globalAveragePool(" << ptr(pool.getInput()) << ", "
            << shapeOf(pool.getInput()) << ", " << y << channelsLastArgument(pool) << ");\n";
      })
      .Default([&](Operation *) { handled = false; });
  return handled;
}

/// Softmax, attention and the loss, with their gradients. Whether `op` is one of them.
bool StageEmitter::emitSoftmaxAttentionLossOp(Operation *op) {
  bool handled = true;
  llvm::TypeSwitch<Operation *>(op)
      .Case([&](nn::SoftmaxOp softmax) {
        std::string y = allocate(softmax.getResult());
        out << "  pk::softmax(" << ptr(softmax.getInput()) << ", " << shapeOf(softmax.getInput())
            << ", " << *nn::normalizeAxis(softmax.getAxis(), tensorType(softmax.getInput()).getRank())
            << ", " << y << ");\n";
      })
      .Case([&](nn::SoftmaxGradOp grad) {
        std::string y = allocate(grad.getResult());
        out << "  pk::softmaxGrad(" << ptr(grad.getDy()) << ", " << ptr(grad.getY()) << ", "
            << shapeOf(grad.getY()) << ", "
            << *nn::normalizeAxis(grad.getAxis(), tensorType(grad.getY()).getRank()) << ", " << y
            << ");\n";
      })
      .Case([&](nn::MaskedSoftmaxOp softmax) {
        std::string y = allocate(softmax.getResult());
        out << "  pk::maskedSoftmax(" << ptr(softmax.getInput()) << ", " << shapeOf(softmax.getInput()) << ", "
            << ptr(softmax.getMask()) << ", " << shapeOf(softmax.getMask()) << ", "
            << f32Literal(softmax.getScale().convertToFloat()) << ", " << (softmax.getDivide() ? "true" : "false")
            << ", " << f32Literal(softmax.getFill().convertToFloat()) << ", "
            << (softmax.getMaskedWhen() ? "true" : "false") << ", " << y << ");\n";
      })
      .Case([&](nn::AttentionOp attention) {
        std::string y = allocate(attention.getResult());
        std::string lse = allocate(attention.getLogSumExp());
        Value mask = attention.getMask();
        declareIfCausal(mask, attention.getMaskedWhen());
        const int64_t joint = attention.getJointKvHeads();
        const nn::AttentionOperandShapes shapes = attention.operandShapes();
        out << "  pk::attention("
            << attentionOperands({ptr(attention.getQuery()), ptr(attention.getKey()), ptr(attention.getValue())},
                                 shapes, joint)
            << ", " << attentionMask(mask) << ", "
            << f32Literal(attention.getScale().convertToFloat())
            << ", " << (attention.getDivide() ? "true" : "false") << ", "
            << f32Literal(attention.getFill().convertToFloat()) << ", "
            << (attention.getMaskedWhen() ? "true" : "false") << ", "
            << attentionDropout(attention.getDropoutRatio(), attention.getDropoutOpId()) << ", " << y << ", " << lse
            << attentionTail(attention, attention.getSequenceMajor(), shapes, joint) << ");\n";
      })
      .Case([&](nn::AttentionGradOp grad) {
        const int64_t joint = grad.getJointKvHeads();
        const nn::AttentionOperandShapes shapes = grad.operandShapes();
        // The gradients, or the joint gradient's windows.
        std::array<std::string, 3> grads;
        for (auto [index, result] : llvm::enumerate(grad.getGrads()))
          grads[index] = allocate(result);
        if (joint)
          grads = jointWindows(grads[0], shapes);
        auto [dq, dk, dv] = grads;
        Value mask = grad.getMask();
        declareIfCausal(mask, grad.getMaskedWhen());
        out << "  pk::attentionGrad(" << ptr(grad.getDy()) << ", "
            << attentionOperands({ptr(grad.getQuery()), ptr(grad.getKey()), ptr(grad.getValue())}, shapes, joint)
            << ", " << attentionMask(mask) << ", "
            << ptr(grad.getResult()) << ", "
            << ptr(grad.getLogSumExp()) << ", " << f32Literal(grad.getScale().convertToFloat()) << ", "
            << (grad.getDivide() ? "true" : "false") << ", " << f32Literal(grad.getFill().convertToFloat()) << ", "
            << (grad.getMaskedWhen() ? "true" : "false") << ", "
            << attentionDropout(grad.getDropoutRatio(), grad.getDropoutOpId()) << ", " << dq << ", " << dk << ", "
            << dv << attentionTail(grad, grad.getSequenceMajor(), shapes, joint) << ");\n";
      })
      .Case([&](nn::MaskedSoftmaxGradOp grad) {
        std::string y = allocate(grad.getResult());
        out << "  pk::maskedSoftmaxGrad(" << ptr(grad.getDy()) << ", " << ptr(grad.getY()) << ", "
            << shapeOf(grad.getY()) << ", " << ptr(grad.getMask()) << ", " << shapeOf(grad.getMask()) << ", "
            << f32Literal(grad.getScale().convertToFloat()) << ", " << (grad.getDivide() ? "true" : "false")
            << ", " << (grad.getMaskedWhen() ? "true" : "false") << ", " << y << ");\n";
      })
      .Case([&](nn::SoftmaxCrossEntropyLossOp loss) {
        std::string value = allocate(loss.getLoss());
        // Exporters emit log_prob beside the loss; unused, it is not written
        // (a pass over the [N, C] scores less: docs/codegen.md).
        std::string logProb = loss.getLogProb().use_empty() ? "nullptr" : allocate(loss.getLogProb());
        out << "  pk::softmaxCrossEntropyLoss<" << elementCType(loss.getLabels()) << ">("
            << ptr(loss.getScores()) << ", " << shapeOf(loss.getScores()) << ", "
            << ptr(loss.getLabels()) << ", "
            << (loss.getWeights() ? ptr(loss.getWeights()) : "nullptr") << ", pk::reductionKind("
            << literal(loss.getReduction(), "the reduction", loss) << "), "
            << (loss.getIgnoreIndex() ? "std::optional<int64_t>(" +
                                            std::to_string(*loss.getIgnoreIndex()) + ")"
                                      : "std::nullopt")
            << ", " << value << ", " << logProb << lossClasses(loss, loss.getClasses()) << ");\n";
      })
      .Case([&](nn::SoftmaxCrossEntropyLossGradOp grad) {
        std::string y = allocate(grad.getResult());
        out << "  pk::softmaxCrossEntropyLossGrad<" << elementCType(grad.getLabels()) << ">("
            << ptr(grad.getDloss()) << ", " << ptr(grad.getScores()) << ", "
            << shapeOf(grad.getScores()) << ", " << ptr(grad.getLabels()) << ", "
            << (grad.getWeights() ? ptr(grad.getWeights()) : "nullptr") << ", pk::reductionKind("
            << literal(grad.getReduction(), "the reduction", grad) << "), "
            << (grad.getIgnoreIndex() ? "std::optional<int64_t>(" +
                                            std::to_string(*grad.getIgnoreIndex()) + ")"
                                      : "std::nullopt")
            << ", " << y << lossClasses(grad, grad.getClasses()) << ");\n";
      })
      .Default([&](Operation *) { handled = false; });
  return handled;
}

/// Reductions, gathers and data movement (views bind names only). Whether `op` is one of them.
bool StageEmitter::emitReductionMovementOp(Operation *op) {
  bool handled = true;
  llvm::TypeSwitch<Operation *>(op)
      .Case([&](nn::ReduceMeanOp mean) {
        std::string y = allocate(mean.getResult());
        out << "  pk::reduceMean(" << ptr(mean.getInput()) << ", " << shapeOf(mean.getInput())
            << ", " << dims(mean.getAxes()) << ", " << y << scratchArgument(mean) << ");\n";
      })
      .Case([&](nn::ReduceSumOp sum) {
        std::string y = allocate(sum.getResult());
        out << "  pk::reduceSum(" << ptr(sum.getInput()) << ", " << shapeOf(sum.getInput())
            << ", " << dims(sum.getAxes()) << ", " << y;
        // A bias's gradient summed into its buffer (the CPU's reduceSum takes
        // its scratch first, the CUDA one has none).
        if (!accumulatesIntoGradient(sum.getResult()))
          out << scratchArgument(sum);
        else
          out << (cuda() ? ", true" : scratchAndAccumulate(sum));
        out << ");\n";
      })
      .Case([&](nn::GatherOp gather) {
        std::string y = allocate(gather.getResult());
        int64_t axis = *nn::normalizeAxis(gather.getAxis(), tensorType(gather.getData()).getRank());
        out << "  pk::gather<" << elementCType(gather.getData()) << ", " << elementCType(gather.getIndices())
            << ">(" << ptr(gather.getData()) << ", " << shapeOf(gather.getData()) << ", "
            << ptr(gather.getIndices()) << ", " << shapeOf(gather.getIndices()) << ", " << axis
            << ", " << y << ");\n";
      })
      .Case([&](nn::GatherGradOp grad) {
        std::string y = allocate(grad.getResult());
        int64_t axis = *nn::normalizeAxis(grad.getAxis(), tensorType(grad.getResult()).getRank());
        out << "  pk::gatherGrad<" << elementCType(grad.getIndices()) << ">(" << ptr(grad.getDy()) << ", "
            << ptr(grad.getIndices()) << ", " << shapeOf(grad.getIndices()) << ", " << axis
            << ", " << y << ", " << shapeOf(grad.getResult()) << ");\n";
      })
      .Case<nn::ReshapeOp, nn::FlattenOp, nn::SqueezeOp, nn::UnsqueezeOp>([&](Operation *op) {
        // Row-major views: the same bytes under another shape.
        bind(op->getResult(0), ptr(op->getOperand(0)));
      })
      .Case([&](nn::ExpandOp expand) {
        std::string y = allocate(expand.getResult());
        out << "  pk::expand<" << elementCType(expand.getInput()) << ">(" << ptr(expand.getInput()) << ", "
            << shapeOf(expand.getInput()) << ", " << y << ", " << shapeOf(expand.getResult())
            << ");\n";
      })
      .Case([&](nn::TransposeOp transpose) {
        std::string y = allocate(transpose.getResult());
        if (PendingConversion *conversion = conversionMovedBy(transpose)) {
          // Written by the conversion table: the bf16 copy made channels-last.
          RankedTensorType input = tensorType(transpose.getInput());
          conversion->to = y;
          conversion->channels = input.getDimSize(1);
          conversion->inner = input.getNumElements() / (input.getDimSize(0) * input.getDimSize(1));
          return;
        }
        out << "  pk::transpose<" << elementCType(transpose.getInput()) << ">(" << ptr(transpose.getInput())
            << ", " << shapeOf(transpose.getInput()) << ", " << dims(transpose.getPerm()) << ", "
            << y << ");\n";
      })
      .Case([&](nn::ConcatOp concat) {
        std::string y = allocate(concat.getResult());
        std::string t = elementCType(concat.getResult());
        int64_t axis = *nn::normalizeAxis(concat.getAxis(), tensorType(concat.getResult()).getRank());
        out << "  { const " << t << " *pieces[] = {";
        for (auto [i, input] : llvm::enumerate(concat.getInputs()))
          out << (i ? ", " : "") << ptr(input);
        out << "};\n    const pk::Shape shapes[] = {";
        for (auto [i, input] : llvm::enumerate(concat.getInputs()))
          out << (i ? ", " : "") << shapeOf(input);
        out << "};\n    pk::concat<" << t << ">(pieces, shapes, " << concat.getInputs().size()
            << ", " << axis << ", " << y << "); }\n";
      })
      .Case([&](nn::SplitOp split) {
        std::string t = elementCType(split.getInput());
        SmallVector<std::string> pieces;
        for (Value piece : split.getResults())
          pieces.push_back(allocate(piece));
        int64_t axis = *nn::normalizeAxis(split.getAxis(), tensorType(split.getInput()).getRank());
        out << "  { " << t << " *pieces[] = {";
        for (auto [i, piece] : llvm::enumerate(pieces))
          out << (i ? ", " : "") << piece;
        out << "};\n    pk::split<" << t << ">(" << ptr(split.getInput()) << ", "
            << shapeOf(split.getInput()) << ", " << axis << ", " << dims(split.getSizes())
            << ", pieces); }\n";
      })
      .Case([&](nn::SliceOp slice) {
        std::string y = allocate(slice.getResult());
        out << "  pk::slice<" << elementCType(slice.getInput()) << ">(" << ptr(slice.getInput()) << ", "
            << shapeOf(slice.getInput()) << ", " << dims(slice.getStarts()) << ", "
            << dims(slice.getEnds()) << ", " << dims(slice.getSteps()) << ", " << y << ");\n";
      })
      .Case([&](nn::SliceGradOp grad) {
        std::string y = allocate(grad.getResult());
        out << "  pk::sliceGrad(" << ptr(grad.getDy()) << ", " << y << ", "
            << shapeOf(grad.getResult()) << ", " << dims(grad.getStarts()) << ", "
            << dims(grad.getEnds()) << ", " << dims(grad.getSteps()) << ");\n";
      })
      .Case([&](nn::PadOp pad) {
        std::string y = allocate(pad.getResult());
        std::string t = elementCType(pad.getInput());
        out << "  pk::pad<" << t << ">(" << ptr(pad.getInput()) << ", " << shapeOf(pad.getInput())
            << ", " << dims(pad.getPads()) << ", static_cast<" << t << ">("
            << floatLiteral(pad.getValue().convertToDouble()) << "), " << y << ");\n";
      })
      .Default([&](Operation *) { handled = false; });
  return handled;
}

/// Constants: a table of the stage or its constants file. Whether `op` is one of them.
bool StageEmitter::emitConstantOp(Operation *op, LogicalResult &result) {
  bool handled = true;
  llvm::TypeSwitch<Operation *>(op)
      .Case([&](nn::ConstantOp constant) {
        auto type = tensorType(constant.getResult());
        auto dense = llvm::dyn_cast<DenseElementsAttr>(constant.getValue());
        if (!dense) {
          result = constant.emitOpError(targetName()) << " code generation needs a dense constant";
          return;
        }
        std::string name = "c" + std::to_string(counter);
        std::string t = cType(type.getElementType());
        int64_t count = std::max<int64_t>(1, type.getNumElements());
        if (constantBytes && count > kInlineConstantElements) {
          // Into the constants file, at a 64-byte aligned offset.
          constantBytes->resize((constantBytes->size() + 63) / 64 * 64, '\0');
          size_t offset = constantBytes->size();
          auto append = [&](auto value) {
            constantBytes->append(reinterpret_cast<const char *>(&value), sizeof value);
          };
          Type element = type.getElementType();
          for (int64_t i = 0; i < count; ++i) {
            int64_t at = dense.isSplat() ? 0 : i;
            if (element.isF32())
              append(dense.getValues<APFloat>()[at].convertToFloat());
            else if (element.isF64())
              append(dense.getValues<APFloat>()[at].convertToDouble());
            else if (element.isInteger(64))
              append(static_cast<int64_t>(dense.getValues<APInt>()[at].getSExtValue()));
            else if (element.isInteger(32))
              append(static_cast<int32_t>(dense.getValues<APInt>()[at].getSExtValue()));
            else if (element.isInteger(1) || element.isUnsignedInteger(8))
              append(static_cast<uint8_t>(dense.getValues<APInt>()[at].getZExtValue()));
            else if (element.isInteger(8))
              append(static_cast<int8_t>(dense.getValues<APInt>()[at].getSExtValue()));
            else {
              result = constant.emitOpError(targetName())
                       << " code generation has no storage for constants of " << element;
              return;
            }
          }
          std::string pointer = "reinterpret_cast<const " + t + " *>(pipecStageConstants + " +
                                std::to_string(offset) + ")";
          if (!cuda()) {
            bind(constant.getResult(), "const_cast<" + t + " *>(" + pointer + ")");
            return;
          }
          out << "  static const pk::DeviceConstant " << name << "Device(" << pointer << ", "
              << count * elementBytes(element) << ");\n";
          bind(constant.getResult(), "static_cast<" + t + " *>(" + name + "Device.get())");
          return;
        }
        llvm::raw_string_ostream decl(constants);
        decl << t << " " << name << "[] = {";
        for (int64_t i = 0; i < count; ++i) {
          if (i)
            decl << ", ";
          if (llvm::isa<FloatType>(type.getElementType()))
            decl << floatLiteral(dense.getValues<APFloat>()[dense.isSplat() ? 0 : i]
                                     .convertToDouble());
          else if (type.getElementType().isInteger(1) || type.getElementType().isUnsignedInteger())
            decl << dense.getValues<APInt>()[dense.isSplat() ? 0 : i].getZExtValue();
          else
            decl << dense.getValues<APInt>()[dense.isSplat() ? 0 : i].getSExtValue();
        }
        decl << "};\n";
        if (!cuda()) {
          bind(constant.getResult(), name);
          return;
        }
        // Uploaded once, on the first call (the device is the rank's for the whole run).
        out << "  static const pk::DeviceConstant " << name << "Device(" << name << ", sizeof "
            << name << ");\n";
        bind(constant.getResult(), "static_cast<" + t + " *>(" + name + "Device.get())");
      })
      .Default([&](Operation *) { handled = false; });
  return handled;
}

/// The optimizer updates, transfers, stashing, fused loops and recomputation. Whether `op` is one of them.
bool StageEmitter::emitPipelineOp(Operation *op, bool isStep, LogicalResult &result) {
  bool handled = true;
  llvm::TypeSwitch<Operation *>(op)
      .Case([&](nn::SgdUpdateOp update) {
        queueOptimizerUpdate(false, {ptr(update.getParam()), ptr(update.getGrad()),
                                     ptr(update.getMomentumBuffer()), "nullptr",
                                     tensorType(update.getParam()).getNumElements()});
        names[update.getNewParam()] = ptr(update.getParam());
        names[update.getNewMomentumBuffer()] = ptr(update.getMomentumBuffer());
      })
      .Case([&](nn::AdamWUpdateOp update) {
        queueOptimizerUpdate(true, {ptr(update.getParam()), ptr(update.getGrad()), ptr(update.getM()),
                                    ptr(update.getV()), tensorType(update.getParam()).getNumElements()});
        names[update.getNewParam()] = ptr(update.getParam());
        names[update.getNewM()] = ptr(update.getM());
        names[update.getNewV()] = ptr(update.getV());
      })
      .Case([&](pipe::RecvOp recv) {
        bool forward = llvm::cast<func::FuncOp>(recv->getParentOp()).getSymName() == "fwd";
        int index = forward ? inputIndex[recv.getTag()] : gradOutputIndex[recv.getTag()];
        bind(recv.getResult(), "static_cast<" + cType(recv.getType().getElementType()) + " *>(" +
                                   std::string(forward ? "const_cast<void *>(call->inputs["
                                                       : "const_cast<void *>(call->grad_outputs[") +
                                   std::to_string(index) + "]))");
      })
      .Case([&](pipe::SendOp send) {
        bool forward = llvm::cast<func::FuncOp>(send->getParentOp()).getSymName() == "fwd";
        int index = forward ? outputIndex[send.getTag()] : gradInputIndex[send.getTag()];
        auto type = tensorType(send.getValue());
        out << "  copyIfDistinct(call->" << (forward ? "outputs[" : "grad_inputs[") << index
            << "], " << ptr(send.getValue()) << ", "
            << type.getNumElements() * elementBytes(type.getElementType()) << ");\n";
      })
      .Case([&](pipe::AllReduceOp reduce) {
        // The runtime reduces gradients before calling step (stage ABI).
        names[reduce.getResult()] = ptr(reduce.getValue());
      })
      .Case([&](pipe::StashOp) {}) // weight versions are the runtime's
      .Case([&](pipe::RestoreOp restore) {
        bind(restore.getResult(), "static_cast<float *>(call->params[" +
                                      std::to_string(paramIndex(restore.getName())) + "])");
      })
      .Case([&](pipe::FusedOp fused) { result = emitFused(fused); })
      .Case([&](pipe::RecomputeOp recompute) {
        Block &block = recompute.getBody().front();
        for (auto [argument, input] : llvm::zip(block.getArguments(), recompute.getInputs()))
          names[argument] = ptr(input);
        if (failed(emitOps(block, isStep))) {
          result = failure();
          return;
        }
        auto yield = llvm::cast<pipe::YieldOp>(block.getTerminator());
        for (auto [value, yielded] : llvm::zip(recompute.getResults(), yield.getValues()))
          names[value] = ptr(yielded);
      })
      .Default([&](Operation *) { handled = false; });
  return handled;
}

LogicalResult StageEmitter::emitOp(Operation *op, bool isStep) {
  // The families of ops, each in its function: the one that knows `op`
  // writes its call (or fails, with a diagnostic).
  LogicalResult result = success();
  if (!cuda() && nn::storesChannelsLast(op)) // pipec-channels-last runs on CUDA stages alone
    return op->emitOpError("stores its tensors channels-last, which only the CUDA target writes");
  if (auto conv = llvm::dyn_cast<nn::ConvOp>(op);
      conv && (conv.getResidual() || conv.getActivation()) && !nn::storesChannelsLast(conv))
    return op->emitOpError("has an epilogue, which only CUDA's channels-last convolutions apply");
  if (emitElementwiseOp(op) || emitLinalgOp(op) || emitNormPoolOp(op) || emitSoftmaxAttentionLossOp(op) ||
      emitReductionMovementOp(op) || emitConstantOp(op, result) || emitPipelineOp(op, isStep, result))
    return result;
  return op->emitOpError("has no ") << targetName() << " lowering";
}


void StageEmitter::queueOptimizerUpdate(bool adamw, PendingUpdate update) {
  if (!pendingUpdates.empty() && pendingAdamW != adamw)
    flushOptimizerUpdates();
  pendingAdamW = adamw;
  pendingUpdates.push_back(std::move(update));
}

void StageEmitter::flushOptimizerUpdates() {
  if (pendingUpdates.empty())
    return;
  // The table lives on the host for the call only: the CUDA library passes
  // it to its kernel by value.
  std::string table = "updates" + std::to_string(counter++);
  out << "  const pk::OptimizerTensor " << table << "[] = {\n";
  for (const PendingUpdate &u : pendingUpdates)
    out << "      {" << u.param << ", " << u.grad << ", {" << u.state0 << ", " << u.state1 << "}, "
        << u.elements << "},\n";
  out << "  };\n";
  if (pendingAdamW)
    out << "  pk::adamwUpdateAll(" << table << ", " << pendingUpdates.size()
        << ", opt->step, opt->learning_rate, opt->beta1, opt->beta2, opt->epsilon, opt->weight_decay, "
           "opt->control);\n";
  else
    out << "  pk::sgdUpdateAll(" << table << ", " << pendingUpdates.size()
        << ", opt->step, opt->learning_rate, opt->momentum, opt->weight_decay, opt->control);\n";
  pendingUpdates.clear();
}

void StageEmitter::flushConversions() {
  if (pendingConversions.empty())
    return;
  std::string table = "conversions" + std::to_string(counter++);
  out << "  const pk::Bf16Conversion " << table << "[] = {\n";
  for (const PendingConversion &c : pendingConversions) {
    out << "      {" << c.from << ", " << c.to << ", " << c.elements;
    if (c.channels > 0)
      out << ", " << c.channels << ", " << c.inner;
    out << "},\n";
  }
  out << "  };\n  pk::toBf16All(" << table << ", " << pendingConversions.size() << ");\n";
  pendingConversions.clear();
}

} // namespace pipec::emit::detail
