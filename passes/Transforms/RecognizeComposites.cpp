// pipec-recognize-composites: the decomposed LayerNorm, RMSNorm, rotary
// embedding, erf-GELU, masked (attention) softmax and attention (with or
// without a dropout of its probabilities) that exporters emit become
// nn.layer_norm (for RMSNorm uncentred), nn.rotary, nn.gelu,
// nn.masked_softmax and nn.attention, whose kernels and gradient rules are
// one op each; the heads' transposes around an attention fold into it
// (docs/optimization.md).
#include "passes/Passes.h"
#include "passes/Analysis/GradientRoles.h"
#include "passes/Transforms/PatternRewrites.h"

#include "dialects/nn/NNDialect.h"
#include "dialects/pipe/PipeDialect.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Matchers.h"
#include "mlir/IR/PatternMatch.h"

#include <cmath>

namespace pipec::passes {
#define GEN_PASS_DEF_RECOGNIZECOMPOSITES
#include "passes/Passes.h.inc"
} // namespace pipec::passes

using namespace mlir;

namespace pipec::passes {
namespace {

/// The value of a splat fp32 constant, if `value` is one.
std::optional<float> splatValue(Value value) {
  auto constant = value.getDefiningOp<nn::ConstantOp>();
  if (!constant)
    return std::nullopt;
  auto dense = llvm::dyn_cast<DenseFPElementsAttr>(constant.getValue());
  if (!dense || !dense.isSplat() || !dense.getElementType().isF32())
    return std::nullopt;
  return dense.getSplatValue<APFloat>().convertToFloat();
}

bool near(std::optional<float> value, double expected) {
  return value && std::fabs(*value - expected) <= 1e-6 * std::max(1.0, std::fabs(expected));
}

/// `op`'s operands as (a, b) or (b, a) such that `isFirst(a)`.
template <class F> std::optional<std::pair<Value, Value>> orderedOperands(Operation *op, F isFirst) {
  if (isFirst(op->getOperand(0)))
    return std::make_pair(op->getOperand(0), op->getOperand(1));
  if (isFirst(op->getOperand(1)))
    return std::make_pair(op->getOperand(1), op->getOperand(0));
  return std::nullopt;
}

bool trailingAxes(ArrayRef<int64_t> axes, int64_t rank, int64_t &first) {
  if (axes.empty() || axes.back() != rank - 1)
    return false;
  for (size_t i = 1; i < axes.size(); ++i)
    if (axes[i] != axes[i - 1] + 1)
      return false;
  first = axes.front();
  return true;
}

/// Whether `value` is a tensor of `element`s whose shape broadcasts to
/// `space` without enlarging it.
bool broadcastsTo(Value value, ArrayRef<int64_t> space, Type element) {
  auto type = llvm::dyn_cast<RankedTensorType>(value.getType());
  return type && type.getElementType() == element && nn::broadcastsTo(type.getShape(), space);
}

/// y = ((x - mean(x)) / sqrt(mean((x - mean(x))^2) + eps)) * w (+ b), means
/// over the trailing axes, as PyTorch's exporter writes nn.LayerNorm at
/// opsets without LayerNormalization.
struct DecomposedLayerNorm : OpRewritePattern<nn::AddOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(nn::AddOp root, PatternRewriter &rewriter) const override {
    // The bias add (optional): root = mul + b.
    auto withMul = orderedOperands(root, [](Value v) { return v.getDefiningOp<nn::MulOp>(); });
    if (withMul)
      if (succeeded(rewrite(root, withMul->first.getDefiningOp<nn::MulOp>(), withMul->second,
                            rewriter)))
        return success();
    return failure();
  }

  LogicalResult rewrite(Operation *root, nn::MulOp scaleMul, Value bias,
                        PatternRewriter &rewriter) const {
    auto withDiv = orderedOperands(scaleMul, [](Value v) { return v.getDefiningOp<nn::DivOp>(); });
    if (!withDiv || !scaleMul->hasOneUse())
      return failure();
    auto div = withDiv->first.getDefiningOp<nn::DivOp>();
    Value scale = withDiv->second;
    auto sqrt = div.getRhs().getDefiningOp<nn::SqrtOp>();
    auto sub = div.getLhs().getDefiningOp<nn::SubOp>();
    if (!sqrt || !sub || !div->hasOneUse() || !sqrt->hasOneUse())
      return failure();
    auto addEps = sqrt.getInput().getDefiningOp<nn::AddOp>();
    if (!addEps || !addEps->hasOneUse())
      return failure();
    auto withVar = orderedOperands(addEps, [](Value v) { return v.getDefiningOp<nn::ReduceMeanOp>(); });
    if (!withVar)
      return failure();
    std::optional<float> eps = splatValue(withVar->second);
    auto variance = withVar->first.getDefiningOp<nn::ReduceMeanOp>();
    if (!eps || !(*eps >= 0.0f) || !variance->hasOneUse())
      return failure();
    Operation *square = variance.getInput().getDefiningOp();
    bool squares = square && square->hasOneUse() &&
                   ((llvm::isa<nn::PowOp>(square) && square->getOperand(0) == sub.getResult() &&
                     near(splatValue(square->getOperand(1)), 2.0)) ||
                    (llvm::isa<nn::MulOp>(square) && square->getOperand(0) == sub.getResult() &&
                     square->getOperand(1) == sub.getResult()));
    auto mean = sub.getRhs().getDefiningOp<nn::ReduceMeanOp>();
    Value x = sub.getLhs();
    if (!squares || !mean || mean.getInput() != x || !mean->hasOneUse() ||
        !llvm::all_of(sub->getUsers(), [&](Operation *user) { return user == square || user == div; }))
      return failure();
    auto inputType = llvm::dyn_cast<RankedTensorType>(x.getType());
    if (!inputType || !inputType.hasStaticShape() || !inputType.getElementType().isF32())
      return failure();
    int64_t rank = inputType.getRank(), axis = 0, varianceAxis = 0;
    if (!mean.getKeepdims() || !variance.getKeepdims() ||
        !trailingAxes(mean.getAxes(), rank, axis) ||
        !trailingAxes(variance.getAxes(), rank, varianceAxis) || axis != varianceAxis)
      return failure();
    // Scale and bias must be the normalized shape, as nn.layer_norm takes them.
    auto normalized = inputType.getShape().drop_front(axis);
    auto isNormalized = [&](Value v) {
      auto type = llvm::dyn_cast<RankedTensorType>(v.getType());
      return type && type.getShape() == normalized && type.getElementType().isF32();
    };
    if (!isNormalized(scale) || (bias && !isNormalized(bias)) ||
        root->getResult(0).getType() != x.getType())
      return failure();
    SmallVector<Operation *> chain{root, scaleMul, div, sqrt, addEps, variance, square, sub, mean};
    if (bias == Value())
      chain.erase(chain.begin());
    if (!sameStage(chain))
      return failure();
    auto statistics = llvm::cast<RankedTensorType>(mean.getResult().getType());
    SmallVector<Value> operands{x, scale};
    if (bias)
      operands.push_back(bias);
    auto norm = nn::LayerNormOp::create(
        rewriter, absorbedLocation(root->getLoc(), chain), TypeRange{x.getType(), statistics, statistics}, operands,
        ArrayRef<NamedAttribute>{
            rewriter.getNamedAttr("axis", rewriter.getI64IntegerAttr(axis)),
            rewriter.getNamedAttr("epsilon", rewriter.getF32FloatAttr(*eps))});
    inheritPlacement(root, norm, /*withCost=*/true);
    rewriter.replaceOp(root, norm.getResult());
    return success();
  }
};

/// The same without a bias: the scale multiply is the root.
struct DecomposedLayerNormNoBias : OpRewritePattern<nn::MulOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(nn::MulOp root, PatternRewriter &rewriter) const override {
    // With a bias add after it, the add is the root (the pattern above).
    if (root->hasOneUse() && llvm::isa<nn::AddOp>(*root->getUsers().begin()))
      return failure();
    return DecomposedLayerNorm(getContext()).rewrite(root, root, Value(), rewriter);
  }
};

/// The parts of a decomposed RMS normalization, y = x * r (* scale), where
/// r = 1 / sqrt(mean(x^2) + eps) over trailing axes: the exporters' forms of
/// r (1 / s, Reciprocal(s), s^-0.5 of the sum, x / s for x * r) and of x^2
/// (Pow(x, 2), x * x), as Hugging Face's RMSNorm modules (Llama, Gemma, T5)
/// and ONNX's RMSNormalization function body write them.
struct RmsChain {
  Value x;
  float epsilon = 0;
  int64_t axis = 0;
  SmallVector<Operation *> ops; // the normalization itself, from `normalized` up
};

/// `normalized` (x * r, r * x or x / sqrt(...)) as an RMS normalization, if it
/// is one whose inner ops have no other use.
std::optional<RmsChain> rmsChain(Operation *normalized) {
  if (!normalized || !llvm::isa<nn::MulOp, nn::DivOp>(normalized))
    return std::nullopt;
  // The sum mean(x^2) + eps, from the inverse root's operand.
  auto sumOf = [](Value inverseRoot, SmallVectorImpl<Operation *> &ops) -> Value {
    Operation *def = inverseRoot.getDefiningOp();
    if (!def || !def->hasOneUse())
      return {};
    Value root;
    if (auto reciprocal = llvm::dyn_cast<nn::ReciprocalOp>(def))
      root = reciprocal.getInput();
    else if (auto div = llvm::dyn_cast<nn::DivOp>(def); div && near(splatValue(div.getLhs()), 1.0))
      root = div.getRhs();
    else if (auto pow = llvm::dyn_cast<nn::PowOp>(def); pow && near(splatValue(pow.getRhs()), -0.5)) {
      ops.push_back(def);
      return pow.getLhs();
    }
    auto sqrt = root ? root.getDefiningOp<nn::SqrtOp>() : nullptr;
    if (!sqrt || !sqrt->hasOneUse())
      return {};
    ops.append({def, sqrt});
    return sqrt.getInput();
  };
  RmsChain chain;
  chain.ops.push_back(normalized);
  Value sum;
  if (llvm::isa<nn::DivOp>(normalized)) { // x / sqrt(...)
    auto sqrt = normalized->getOperand(1).getDefiningOp<nn::SqrtOp>();
    if (!sqrt || !sqrt->hasOneUse())
      return std::nullopt;
    chain.ops.push_back(sqrt);
    sum = sqrt.getInput();
    chain.x = normalized->getOperand(0);
  }
  for (int side = 0; side < 2 && !sum; ++side) { // x * r or r * x
    if (Value found = sumOf(normalized->getOperand(1 - side), chain.ops)) {
      sum = found;
      chain.x = normalized->getOperand(side);
    }
  }
  auto addEps = sum ? sum.getDefiningOp<nn::AddOp>() : nullptr;
  if (!addEps || !addEps->hasOneUse())
    return std::nullopt;
  auto withMean = orderedOperands(addEps, [](Value v) { return v.getDefiningOp<nn::ReduceMeanOp>(); });
  if (!withMean)
    return std::nullopt;
  std::optional<float> eps = splatValue(withMean->second);
  auto mean = withMean->first.getDefiningOp<nn::ReduceMeanOp>();
  if (!eps || !(*eps >= 0.0f) || !mean->hasOneUse() || !mean.getKeepdims())
    return std::nullopt;
  Operation *square = mean.getInput().getDefiningOp();
  Value x = chain.x;
  bool squares = square && square->hasOneUse() &&
                 ((llvm::isa<nn::PowOp>(square) && square->getOperand(0) == x &&
                   near(splatValue(square->getOperand(1)), 2.0)) ||
                  (llvm::isa<nn::MulOp>(square) && square->getOperand(0) == x && square->getOperand(1) == x));
  auto type = llvm::dyn_cast<RankedTensorType>(x.getType());
  if (!squares || !type || !type.hasStaticShape() || !type.getElementType().isF32() ||
      normalized->getResult(0).getType() != type ||
      !trailingAxes(mean.getAxes(), type.getRank(), chain.axis))
    return std::nullopt;
  chain.ops.append({addEps, mean, square});
  chain.epsilon = *eps;
  return chain;
}

/// Whether `scale` broadcasts to the normalized axes of `chain`, as
/// nn.layer_norm's verifier requires.
bool isRmsScale(Value scale, const RmsChain &chain) {
  auto type = llvm::cast<RankedTensorType>(chain.x.getType());
  return broadcastsTo(scale, type.getShape().drop_front(chain.axis), type.getElementType());
}

/// `root` (the scale multiply, or the normalizing product itself when
/// `scale` is null: then the scale is 1) replaced by nn.layer_norm with
/// centered = false.
LogicalResult replaceByRmsNorm(Operation *root, const RmsChain &chain, Value scale, PatternRewriter &rewriter) {
  SmallVector<Operation *> ops{root};
  for (Operation *op : chain.ops)
    if (op != root)
      ops.push_back(op);
  if (!sameStage(ops))
    return failure();
  auto type = llvm::cast<RankedTensorType>(chain.x.getType());
  if (!scale) {
    auto ones = RankedTensorType::get(type.getShape().drop_front(chain.axis), type.getElementType());
    auto constant = nn::ConstantOp::create(rewriter, root->getLoc(), DenseElementsAttr::get(ones, 1.0f));
    inheritPlacement(root, constant, /*withCost=*/false);
    scale = constant;
  }
  SmallVector<int64_t> statsShape(type.getShape());
  std::fill(statsShape.begin() + chain.axis, statsShape.end(), 1);
  auto statistics = RankedTensorType::get(statsShape, type.getElementType());
  auto norm = nn::LayerNormOp::create(
      rewriter, absorbedLocation(root->getLoc(), ArrayRef<Operation *>(ops).drop_front()),
      TypeRange{type, statistics, statistics}, ValueRange{chain.x, scale},
      ArrayRef<NamedAttribute>{rewriter.getNamedAttr("axis", rewriter.getI64IntegerAttr(chain.axis)),
                               rewriter.getNamedAttr("epsilon", rewriter.getF32FloatAttr(chain.epsilon)),
                               rewriter.getNamedAttr("centered", rewriter.getBoolAttr(false))});
  inheritPlacement(root, norm, /*withCost=*/true);
  rewriter.replaceOp(root, norm.getResult());
  return success();
}

/// An RMS normalization without a scale multiply after it: `root` is the
/// normalizing product (x * r or x / sqrt(...)).
LogicalResult unscaledRmsNorm(Operation *root, PatternRewriter &rewriter) {
  std::optional<RmsChain> chain = rmsChain(root);
  if (!chain)
    return failure();
  // A scale multiply after it is the scaled pattern's root.
  if (root->hasOneUse())
    if (auto next = llvm::dyn_cast<nn::MulOp>(*root->getUsers().begin()))
      for (Value operand : next->getOperands())
        if (operand != root->getResult(0) && isRmsScale(operand, *chain))
          return failure();
  return replaceByRmsNorm(root, *chain, Value(), rewriter);
}

/// An RMS normalization and its scale multiply (either side; Gemma's scale
/// is 1 + weight, any value that broadcasts to the normalized axes), or a
/// product x * r without a scale: nn.layer_norm with centered = false.
struct DecomposedRmsNorm : OpRewritePattern<nn::MulOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(nn::MulOp root, PatternRewriter &rewriter) const override {
    for (int side = 0; side < 2; ++side) {
      Operation *normalized = root->getOperand(side).getDefiningOp();
      if (!normalized || !normalized->hasOneUse())
        continue;
      if (std::optional<RmsChain> chain = rmsChain(normalized))
        if (isRmsScale(root->getOperand(1 - side), *chain) && root.getType() == chain->x.getType())
          return replaceByRmsNorm(root, *chain, root->getOperand(1 - side), rewriter);
    }
    return unscaledRmsNorm(root, rewriter);
  }
};

/// x / sqrt(mean(x^2) + eps) without a scale multiply after it.
struct DecomposedRmsNormByDivision : OpRewritePattern<nn::DivOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(nn::DivOp root, PatternRewriter &rewriter) const override {
    return unscaledRmsNorm(root, rewriter);
  }
};

/// Whether `half` is the first (`upper` false) or second half of x along
/// its last axis, as an nn.slice or as one of the two equal pieces of an
/// nn.split (PyTorch's slicing and torch.chunk).
bool isHalfOf(Value half, Value x, bool upper) {
  auto type = llvm::cast<RankedTensorType>(x.getType());
  const int64_t rank = type.getRank(), width = type.getShape().back();
  if (auto slice = half.getDefiningOp<nn::SliceOp>()) {
    if (slice.getInput() != x || !slice->hasOneUse())
      return false;
    for (int64_t axis = 0; axis < rank; ++axis) {
      const bool last = axis == rank - 1;
      const int64_t start = last && upper ? width / 2 : 0;
      const int64_t end = last && !upper ? width / 2 : type.getShape()[axis];
      if (slice.getStarts()[axis] != start || slice.getEnds()[axis] != end || slice.getSteps()[axis] != 1)
        return false;
    }
    return true;
  }
  auto split = half.getDefiningOp<nn::SplitOp>();
  return split && split.getInput() == x && split->getNumResults() == 2 &&
         succeeded(nn::normalizeAxis(split.getAxis(), rank)) &&
         *nn::normalizeAxis(split.getAxis(), rank) == rank - 1 && split.getSizes()[0] == width / 2 &&
         llvm::cast<OpResult>(half).getResultNumber() == (upper ? 1u : 0u) && half.hasOneUse();
}

/// x * cos + rotate_half(x) * sin, rotate_half(x) = concat(-x2, x1) over the
/// last axis (x1, x2 its halves), in any operand order: Hugging Face's
/// apply_rotary_pos_emb as every exporter writes it. Becomes nn.rotary.
struct DecomposedRotary : OpRewritePattern<nn::AddOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(nn::AddOp root, PatternRewriter &rewriter) const override {
    auto type = llvm::dyn_cast<RankedTensorType>(root.getType());
    if (!type || !type.hasStaticShape() || !type.getElementType().isF32() || type.getRank() < 1 ||
        type.getShape().back() % 2 != 0)
      return failure();
    for (int side = 0; side < 2; ++side) {
      auto direct = root->getOperand(side).getDefiningOp<nn::MulOp>();
      auto rotatedMul = root->getOperand(1 - side).getDefiningOp<nn::MulOp>();
      if (!direct || !rotatedMul || !direct->hasOneUse() || !rotatedMul->hasOneUse())
        continue;
      for (int r = 0; r < 2; ++r) {
        auto concat = rotatedMul->getOperand(r).getDefiningOp<nn::ConcatOp>();
        Value sin = rotatedMul->getOperand(1 - r);
        if (!concat || !concat->hasOneUse() || concat->getNumOperands() != 2 ||
            *nn::normalizeAxis(concat.getAxis(), type.getRank()) != type.getRank() - 1)
          continue;
        auto neg = concat->getOperand(0).getDefiningOp<nn::NegOp>();
        if (!neg || !neg->hasOneUse())
          continue;
        for (int d = 0; d < 2; ++d) {
          Value x = direct->getOperand(d), cos = direct->getOperand(1 - d);
          if (x.getType() != type || !isHalfOf(neg.getInput(), x, /*upper=*/true) ||
              !isHalfOf(concat->getOperand(1), x, /*upper=*/false) ||
              !broadcastsTo(cos, type.getShape(), type.getElementType()) ||
              !broadcastsTo(sin, type.getShape(), type.getElementType()))
            continue;
          SmallVector<Operation *> chain{root, direct, rotatedMul, concat, neg};
          for (Value half : {Value(neg.getInput()), concat->getOperand(1)})
            if (!llvm::is_contained(chain, half.getDefiningOp()))
              chain.push_back(half.getDefiningOp());
          if (!sameStage(chain))
            return failure();
          auto rotary = nn::RotaryOp::create(rewriter, absorbedLocation(root.getLoc(), ArrayRef(chain).drop_front()),
                                             TypeRange{type}, ValueRange{x, cos, sin});
          inheritPlacement(root, rotary, /*withCost=*/true);
          rewriter.replaceOp(root, rotary.getResult());
          return success();
        }
      }
    }
    return failure();
  }
};

/// x * 0.5 * (1 + erf(x / sqrt 2)), in any association of the two products,
/// as exporters write the exact GELU at opsets without Gelu.
struct DecomposedGelu : OpRewritePattern<nn::MulOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(nn::MulOp root, PatternRewriter &rewriter) const override {
    auto type = llvm::dyn_cast<RankedTensorType>(root.getType());
    if (!type || !type.getElementType().isF32())
      return failure();
    // The three factors of the two products: x, 0.5 and (1 + erf(x / sqrt 2)).
    for (int side = 0; side < 2; ++side) {
      auto inner = root->getOperand(side).getDefiningOp<nn::MulOp>();
      Value outer = root->getOperand(1 - side);
      if (!inner || !inner->hasOneUse())
        continue;
      Value factors[3] = {outer, inner.getLhs(), inner.getRhs()};
      for (int h = 0; h < 3; ++h) {
        if (!near(splatValue(factors[h]), 0.5))
          continue;
        for (int a = 0; a < 3; ++a) {
          if (a == h)
            continue;
          Value x = factors[3 - h - a];
          auto plus = factors[a].getDefiningOp<nn::AddOp>();
          if (!plus || !plus->hasOneUse() || x.getType() != root.getType())
            continue;
          auto withErf = orderedOperands(plus, [](Value v) { return v.getDefiningOp<nn::ErfOp>(); });
          if (!withErf || !near(splatValue(withErf->second), 1.0))
            continue;
          auto erf = withErf->first.getDefiningOp<nn::ErfOp>();
          auto div = erf.getInput().getDefiningOp<nn::DivOp>();
          if (!erf->hasOneUse() || !div || !div->hasOneUse() || div.getLhs() != x ||
              !near(splatValue(div.getRhs()), std::sqrt(2.0)))
            continue;
          if (!sameStage({root, inner, plus, erf, div}))
            return failure();
          auto gelu = nn::GeluOp::create(rewriter, absorbedLocation(root.getLoc(), {inner, plus, erf, div}),
                                         TypeRange{root.getType()}, ValueRange{x});
          inheritPlacement(root, gelu, /*withCost=*/true);
          rewriter.replaceOp(root, gelu.getResult());
          return success();
        }
      }
    }
    return failure();
  }
};

/// The input of an attention softmax before its scale: `scaled` is x * c,
/// c * x or x / c with c a splat constant and x of `type` (the product then
/// joins `chain`), else x itself with scale 1 (x * 1 is x, bit for bit).
struct ScaledInput {
  Value x;
  float scale = 1.0f;
  bool divide = false;
};
ScaledInput scaledInput(Value scaled, RankedTensorType type, SmallVectorImpl<Operation *> &chain) {
  ScaledInput in{scaled};
  Operation *product = scaled.getDefiningOp();
  if (!product || !product->hasOneUse() || !llvm::isa<nn::MulOp, nn::DivOp>(product))
    return in;
  const bool divide = llvm::isa<nn::DivOp>(product);
  for (int side = divide ? 1 : 0; side < 2; ++side) {
    std::optional<float> constant = splatValue(product->getOperand(side));
    Value other = product->getOperand(1 - side);
    if (constant && other.getType() == type) {
      chain.push_back(product);
      return {other, *constant, divide};
    }
  }
  return in;
}

/// softmax's replacement: nn.masked_softmax of `in` under `mask`, named
/// after every op of `chain`.
void replaceByMaskedSoftmax(nn::SoftmaxOp root, ArrayRef<Operation *> chain, const ScaledInput &in, Value mask,
                            float fill, bool maskedWhen, PatternRewriter &rewriter) {
  auto softmax = nn::MaskedSoftmaxOp::create(
      rewriter, absorbedLocation(root.getLoc(), chain), TypeRange{root.getType()}, ValueRange{in.x, mask},
      ArrayRef<NamedAttribute>{rewriter.getNamedAttr("scale", rewriter.getF32FloatAttr(in.scale)),
                               rewriter.getNamedAttr("divide", rewriter.getBoolAttr(in.divide)),
                               rewriter.getNamedAttr("fill", rewriter.getF32FloatAttr(fill)),
                               rewriter.getNamedAttr("masked_when", rewriter.getBoolAttr(maskedWhen))});
  inheritPlacement(root, softmax, /*withCost=*/true);
  rewriter.replaceOp(root, softmax.getResult());
}

/// The f32 softmax over the last axis of a static shape these patterns
/// rewrite, or null.
RankedTensorType lastAxisSoftmaxType(nn::SoftmaxOp root) {
  auto type = llvm::dyn_cast<RankedTensorType>(root.getType());
  if (!type || !type.hasStaticShape() || !type.getElementType().isF32() || type.getRank() < 1 ||
      nn::normalizeAxis(root.getAxis(), type.getRank()) != type.getRank() - 1)
    return nullptr;
  return type;
}

/// softmax(where(mask, fill, x * scale)) along the last axis, the attention
/// softmax as exporters write it: the scale a splat constant multiplying or
/// dividing x (optional), the fill a splat constant on either side of the
/// where (PyTorch's masked_fill puts it first, Hugging Face's GPT-2 second).
struct DecomposedMaskedSoftmax : OpRewritePattern<nn::SoftmaxOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(nn::SoftmaxOp root, PatternRewriter &rewriter) const override {
    RankedTensorType type = lastAxisSoftmaxType(root);
    if (!type)
      return failure();
    auto where = root.getInput().getDefiningOp<nn::WhereOp>();
    if (!where || !where->hasOneUse() || where.getType() != type)
      return failure();
    bool maskedWhen = true;
    std::optional<float> fill = splatValue(where.getX());
    Value scaled = where.getY();
    if (!fill) {
      maskedWhen = false;
      fill = splatValue(where.getY());
      scaled = where.getX();
    }
    if (!fill || scaled.getType() != type)
      return failure();
    SmallVector<Operation *> chain{root, where};
    ScaledInput in = scaledInput(scaled, type, chain);
    if (!sameStage(chain))
      return failure();
    replaceByMaskedSoftmax(root, chain, in, where.getCondition(), *fill, maskedWhen, rewriter);
    return success();
  }
};

/// The most an additive mask's masked entries may be (docs/optimization.md,
/// "Element-wise fusion"): x + M with M <= -1e9 is -1e9 + x, whose
/// exponential next to a row's unmasked maximum is 0 in float exactly as the
/// masked softmax's fill is, as long as the scores differ by less than
/// about 1e9 (with -inf or float's lowest, always).
constexpr float kAdditiveMaskCeiling = -1.0e9f;

/// softmax(x * scale + M) along the last axis with M a constant additive
/// mask: every entry 0 or one value `fill` <= kAdditiveMaskCeiling (-inf,
/// float's lowest, -1e9: causal and padding masks as some exporters write
/// them), M as long as x along the last axis and every row of M with an
/// unmasked entry. (A fully masked row would differ: the masked softmax
/// spreads it evenly, x + M keeps x's differences.) Becomes nn.masked_softmax
/// with the boolean mask M == fill.
struct AdditiveMaskedSoftmax : OpRewritePattern<nn::SoftmaxOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(nn::SoftmaxOp root, PatternRewriter &rewriter) const override {
    RankedTensorType type = lastAxisSoftmaxType(root);
    if (!type)
      return failure();
    auto add = root.getInput().getDefiningOp<nn::AddOp>();
    if (!add || !add->hasOneUse() || add.getType() != type)
      return failure();
    for (int side = 0; side < 2; ++side) {
      auto constant = add->getOperand(side).getDefiningOp<nn::ConstantOp>();
      Value scaled = add->getOperand(1 - side);
      if (!constant || scaled.getType() != type)
        continue;
      auto maskType = llvm::dyn_cast<RankedTensorType>(constant.getType());
      if (!maskType || !maskType.hasStaticShape() || !maskType.getElementType().isF32() ||
          maskType.getRank() < 1 || maskType.getShape().back() != type.getShape().back())
        continue;
      std::optional<AdditiveMask> masked = additiveMask(constant.getValue(), maskType.getShape().back());
      if (!masked)
        continue;
      SmallVector<Operation *> chain{root, add};
      ScaledInput in = scaledInput(scaled, type, chain);
      if (!sameStage(chain))
        return failure();
      auto boolType = RankedTensorType::get(maskType.getShape(), rewriter.getI1Type());
      auto mask =
          nn::ConstantOp::create(rewriter, constant.getLoc(), DenseElementsAttr::get(boolType, masked->entries));
      inheritPlacement(root, mask, /*withCost=*/false);
      replaceByMaskedSoftmax(root, chain, in, mask, masked->fill, /*maskedWhen=*/true, rewriter);
      return success();
    }
    return failure();
  }

private:
  struct AdditiveMask {
    SmallVector<bool> entries; // true where masked
    float fill;                // the masked entries' one value
  };
  /// Which entries of an additive mask are masked, if `values` (rows of
  /// `rowLength`) is one.
  static std::optional<AdditiveMask> additiveMask(ElementsAttr values, int64_t rowLength) {
    auto floats = values.tryGetValues<APFloat>();
    if (!floats)
      return std::nullopt;
    SmallVector<bool> masked;
    std::optional<float> fill;
    bool rowHasUnmasked = false, anyMasked = false;
    for (APFloat value : *floats) {
      const float v = value.convertToFloat();
      const bool isMasked = v != 0.0f;
      if (isMasked && (!(v <= kAdditiveMaskCeiling) || (fill && *fill != v)))
        return std::nullopt; // another value, NaN, or a second fill
      if (isMasked)
        fill = v;
      anyMasked |= isMasked;
      rowHasUnmasked |= !isMasked;
      masked.push_back(isMasked);
      if ((int64_t)masked.size() % rowLength == 0) {
        if (!rowHasUnmasked)
          return std::nullopt;
        rowHasUnmasked = false;
      }
    }
    if (!anyMasked)
      return std::nullopt;
    return AdditiveMask{std::move(masked), *fill};
  }
};

/// Whether `value` is a constant of +0.0 only.
bool isPositiveZeros(Value value) {
  auto constant = value.getDefiningOp<nn::ConstantOp>();
  auto values = constant ? llvm::dyn_cast<DenseFPElementsAttr>(constant.getValue()) : nullptr;
  return values && llvm::all_of(values.getValues<APFloat>(), [](const APFloat &v) { return v.isPosZero(); });
}

/// softmax(x + M) with M a constant of zeros that does not widen x:
/// softmax(x) (an exported additive attention mask of an unpadded batch,
/// all 0, which the dynamo exporter's optimizer folds into a constant;
/// docs/importer.md names it). Only under softmaxes, where x + 0 and x (-0
/// and +0) are the same. The softmax then becomes an attention like any other.
struct AddOfZeros : OpRewritePattern<nn::AddOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(nn::AddOp root, PatternRewriter &rewriter) const override {
    if (root->use_empty() || !llvm::all_of(root->getUsers(), [](Operation *user) { return llvm::isa<nn::SoftmaxOp>(user); }))
      return failure();
    for (int side = 0; side < 2; ++side) {
      Value x = root->getOperand(1 - side);
      if (x.getType() != root.getType() || !isPositiveZeros(root->getOperand(side)))
        continue;
      rewriter.replaceOp(root, x);
      return success();
    }
    return failure();
  }
};

/// where(isnan(P), 0, P) after a masked softmax whose fill is finite: the
/// guard PyTorch's scaled_dot_product_attention exports (for rows whose
/// keys are all masked with -inf). With a finite fill such a row is
/// uniform, not NaN, so P is NaN only where its scores already are (and a
/// NaN score reaches the loss through them anyway); the guard is P, and
/// the attention around it can be recognized.
struct NaNGuardOfMaskedSoftmax : OpRewritePattern<nn::WhereOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(nn::WhereOp root, PatternRewriter &rewriter) const override {
    auto softmax = root.getY().getDefiningOp<nn::MaskedSoftmaxOp>();
    auto isNaN = root.getCondition().getDefiningOp<nn::XorOp>();
    if (!softmax || !std::isfinite(softmax.getFill().convertToFloat()) || !isNaN || !isNaN->hasOneUse() ||
        root.getType() != softmax.getType() || !near(splatValue(root.getX()), 0.0))
      return failure();
    auto ordered = orderedOperands(isNaN, [](Value v) { return v.getDefiningOp<nn::EqualOp>(); });
    if (!ordered || !isTrue(ordered->second))
      return failure();
    auto equal = ordered->first.getDefiningOp<nn::EqualOp>();
    if (!equal->hasOneUse() || equal.getLhs() != softmax.getResult() || equal.getRhs() != softmax.getResult() ||
        !sameStage({root, isNaN, equal, softmax}))
      return failure();
    rewriter.replaceOp(root, softmax.getResult());
    return success();
  }

private:
  static bool isTrue(Value value) {
    auto constant = value.getDefiningOp<nn::ConstantOp>();
    auto dense = constant ? llvm::dyn_cast<DenseIntElementsAttr>(constant.getValue()) : nullptr;
    return dense && dense.isSplat() && dense.getElementType().isInteger(1) && dense.getSplatValue<bool>();
  }
};

/// The dropout of an attention's probabilities that nn.attention takes
/// over: its ratio (0 when it drops nothing: inference mode or ratio 0)
/// and the op part of its mask's key.
struct ProbabilityDropout {
  float ratio = 0.0f;
  uint64_t opId = 0;
};

/// softmax(q · kᵀ (scaled, masked)) · v over the last axes, as exporters
/// write attention (after the masked softmax above is recognized, or with a
/// plain scaled softmax): one nn.attention, whose kernels never store the
/// S x T scores (docs/optimization.md). kᵀ is a transpose of k's last two
/// axes (absorbed), or any value (then transposed back for the key). A
/// dropout between the softmax and the product (GPT-2's and BERT's
/// attention dropout) joins it when nothing reads the dropout's mask: the
/// fused kernels regenerate the same mask from the same key.
struct DecomposedAttention : OpRewritePattern<nn::MatMulOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(nn::MatMulOp root, PatternRewriter &rewriter) const override {
    Value probabilities = root.getOperand(0), value = root.getOperand(1);
    SmallVector<Operation *> chain{root};
    ProbabilityDropout dropout;
    if (auto dropoutOp = probabilities.getDefiningOp<nn::DropoutOp>()) {
      if (!probabilities.hasOneUse() || !dropoutOp.getMask().use_empty())
        return failure();
      if (dropoutOp.getTraining() && !dropoutOp.getRatio().isZero()) {
        std::optional<uint64_t> opId = nn::dropoutOpId(dropoutOp);
        if (!opId) // unkeyed: the unfused op's mask is not reproducible either
          return failure();
        dropout = {dropoutOp.getRatio().convertToFloat(), *opId};
      }
      chain.push_back(dropoutOp);
      probabilities = dropoutOp.getInput();
    }
    Operation *softmax = probabilities.getDefiningOp();
    if (!softmax || !probabilities.hasOneUse() || !llvm::isa<nn::MaskedSoftmaxOp, nn::SoftmaxOp>(softmax))
      return failure();
    auto type = llvm::dyn_cast<RankedTensorType>(probabilities.getType());
    if (!type || !type.hasStaticShape() || !type.getElementType().isF32() || type.getRank() < 2)
      return failure();
    chain.push_back(softmax);
    ScaledInput in{softmax->getOperand(0)};
    Value mask;
    float fill = 0.0f;
    bool maskedWhen = true;
    if (auto masked = llvm::dyn_cast<nn::MaskedSoftmaxOp>(softmax)) {
      in = {masked.getInput(), masked.getScale().convertToFloat(), masked.getDivide()};
      mask = masked.getMask();
      fill = masked.getFill().convertToFloat();
      maskedWhen = masked.getMaskedWhen();
    } else {
      if (!lastAxisSoftmaxType(llvm::cast<nn::SoftmaxOp>(softmax)))
        return failure();
      in = scaledInput(softmax->getOperand(0), type, chain);
      // softmax(scores * c + M), M a floating-point mask (an additive
      // bias) that needs no gradient (autodiff's GradientRoles, computed
      // on the function as it is now): nn.attention's additive mask, which
      // gets none.
      auto add = softmax->getOperand(0).getDefiningOp<nn::AddOp>();
      for (int side = 0; add && add->hasOneUse() && side < 2 && !mask; ++side) {
        Value bias = add->getOperand(1 - side);
        SmallVector<Operation *> tried{add};
        ScaledInput scaled = scaledInput(add->getOperand(side), type, tried);
        // (Zeros are no mask: AddOfZeros removes them first.)
        if (add->getOperand(side).getType() != type ||
            !broadcastsTo(bias, type.getShape(), type.getElementType()) ||
            !scaled.x.getDefiningOp<nn::MatMulOp>() || isPositiveZeros(bias) ||
            GradientRoles(root->getParentOfType<func::FuncOp>()).needsGradient(bias))
          continue;
        in = scaled;
        mask = bias;
        chain.append(tried.begin(), tried.end());
      }
    }
    auto scores = in.x.getDefiningOp<nn::MatMulOp>();
    if (!scores || !in.x.hasOneUse())
      return failure();
    chain.push_back(scores);
    Value query = scores.getOperand(0), keyT = scores.getOperand(1);
    // K^T written as a transpose (of the projection's [B..., T, H, D] as
    // GPT-2's exports do, or of K): absorbed, K is then one transpose of
    // its input (none when the two compose to the identity).
    auto keyTransposed = keyT.getDefiningOp<nn::TransposeOp>();
    const bool absorbTranspose = keyTransposed && keyT.hasOneUse() && sameStage({scores, keyTransposed});
    if (absorbTranspose)
      chain.push_back(keyTransposed);
    std::optional<ArrayRef<int64_t>> maskShape;
    if (mask)
      maskShape = llvm::cast<RankedTensorType>(mask.getType()).getShape();
    auto shapeOf = [](Value v) { return llvm::cast<RankedTensorType>(v.getType()).getShape(); };
    SmallVector<int64_t> keyShape(shapeOf(keyT));
    std::swap(keyShape[keyShape.size() - 1], keyShape[keyShape.size() - 2]);
    if (shapeOf(query).size() != keyShape.size() || shapeOf(value).size() != keyShape.size() ||
        !nn::attentionShapeError(shapeOf(query), keyShape, shapeOf(value), maskShape).empty() ||
        !llvm::all_of(ValueRange{query, keyT, value},
                      [](Value v) { return llvm::cast<RankedTensorType>(v.getType()).getElementType().isF32(); }))
      return failure();
    // The dropout's element index is the flat index into [L..., S, T], the
    // query's leading axes: the kernels' (and the scores' own) order.
    SmallVector<int64_t> scoresShape(shapeOf(query));
    scoresShape.back() = keyShape[keyShape.size() - 2];
    if (type.getShape() != ArrayRef<int64_t>(scoresShape) || !sameStage(chain))
      return failure();
    // K = swap(keyT) = swap(transpose(x, p)) = transpose(x, p[swap[i]]).
    const SmallVector<int64_t> swap = lastTwoAxesSwap(keyShape.size());
    Value key = absorbTranspose ? keyTransposed.getInput() : keyT;
    SmallVector<int64_t> perm(swap);
    if (absorbTranspose)
      for (size_t axis = 0; axis < swap.size(); ++axis)
        perm[axis] = keyTransposed.getPerm()[swap[axis]];
    if (!llvm::equal(perm, llvm::seq<int64_t>(0, perm.size()))) {
      auto transpose = nn::TransposeOp::create(rewriter, scores.getLoc(), key, rewriter.getDenseI64ArrayAttr(perm));
      inheritPlacement(scores, transpose, /*withCost=*/false);
      key = transpose;
    }
    SmallVector<int64_t> rowShape(shapeOf(root.getResult()));
    rowShape.back() = 1;
    auto rowType = RankedTensorType::get(rowShape, type.getElementType());
    auto attention = nn::AttentionOp::create(
        rewriter, absorbedLocation(root.getLoc(), ArrayRef(chain).drop_front()), root.getType(), rowType, query, key,
        value, mask, rewriter.getF32FloatAttr(in.scale), rewriter.getBoolAttr(in.divide),
        rewriter.getF32FloatAttr(fill), rewriter.getBoolAttr(maskedWhen), rewriter.getF32FloatAttr(dropout.ratio),
        rewriter.getI64IntegerAttr(static_cast<int64_t>(dropout.opId)), rewriter.getBoolAttr(false));
    inheritPlacement(root, attention, /*withCost=*/true);
    rewriter.replaceOp(root, attention.getResult());
    return success();
  }

};

struct RecognizeComposites : impl::RecognizeCompositesBase<RecognizeComposites> {
  using Base::Base;
  void runOnOperation() override {
    int64_t applied = 0;
    if (failed(recognizeComposites(getOperation(), applied)))
      return signalPassFailure();
    numRecognized += applied;
  }
};

} // namespace

LogicalResult recognizeComposites(Operation *root, int64_t &applied) {
  RewritePatternSet patterns(root->getContext());
  patterns.add<DecomposedLayerNorm, DecomposedLayerNormNoBias, DecomposedRmsNorm, DecomposedRmsNormByDivision,
               DecomposedRotary, AddOfZeros, NaNGuardOfMaskedSoftmax, DecomposedAttention, DecomposedGelu,
               DecomposedMaskedSoftmax, AdditiveMaskedSoftmax>(root->getContext());
  addAttentionLayoutPatterns(patterns);
  return applyPatternsCounted(root, std::move(patterns), applied);
}
} // namespace pipec::passes
