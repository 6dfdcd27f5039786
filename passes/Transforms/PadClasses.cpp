// pipec-pad-classes: a cross-entropy's odd class dimension rounded up in its
// GEMM, the padding's scores -inf (docs/optimization.md, "Padded classes").
#include "passes/Passes.h"
#include "passes/Transforms/PatternRewrites.h"

#include "dialects/nn/NNDialect.h"
#include "runtime/include/pipec/gemm_rounding.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinAttributes.h"

#include <limits>

namespace pipec::passes {
#define GEN_PASS_DEF_PADCLASSES
#include "passes/Passes.h.inc"
} // namespace pipec::passes

using namespace mlir;

namespace pipec::passes {
namespace {

/// A loss whose scores are a GEMM's result seen through views that keep the
/// class dimension last, each read by the next alone.
struct ClassGemm {
  nn::GemmOp gemm;
  SmallVector<nn::ReshapeOp> views; ///< from the GEMM's result to the scores
  int64_t rows = 0, classes = 0, depth = 0;
};

/// C as a bias of one value per class (shape [N] or [1, N]), read with beta 1.
bool isClassBias(nn::GemmOp gemm, int64_t classes) {
  if (!gemm.getC())
    return true;
  RankedTensorType c = rankedF32(gemm.getC());
  if (!c || !gemm.getBeta().isExactlyValue(1.0) || c.getNumElements() != classes || c.getShape().back() != classes)
    return false;
  return c.getRank() == 1 || (c.getRank() == 2 && c.getDimSize(0) == 1);
}

std::optional<ClassGemm> matchClassGemm(nn::SoftmaxCrossEntropyLossOp loss) {
  RankedTensorType scores = rankedF32(loss.getScores());
  if (loss.getClasses() || !loss.getLogProb().use_empty() || !scores || scores.getRank() != 2)
    return std::nullopt;
  ClassGemm match;
  match.classes = scores.getDimSize(1);
  Value value = loss.getScores();
  SmallVector<Operation *> chain{loss};
  while (auto view = value.getDefiningOp<nn::ReshapeOp>()) {
    RankedTensorType input = rankedF32(view.getInput());
    if (!view->hasOneUse() || !input || input.getRank() == 0 || input.getShape().back() != match.classes)
      return std::nullopt;
    match.views.insert(match.views.begin(), view);
    chain.push_back(view);
    value = view.getInput();
  }
  match.gemm = value.getDefiningOp<nn::GemmOp>();
  if (!match.gemm || !match.gemm->hasOneUse() || match.gemm.getActivation() || match.gemm.getKeepsPreActivation())
    return std::nullopt;
  chain.push_back(match.gemm);
  RankedTensorType result = rankedF32(match.gemm.getResult()), b = rankedF32(match.gemm.getB());
  if (!result || !b || !rankedF32(match.gemm.getA()) || result.getDimSize(1) != match.classes ||
      !isClassBias(match.gemm, match.classes) || !sameStage(chain))
    return std::nullopt;
  match.rows = result.getDimSize(0);
  match.depth = b.getDimSize(match.gemm.getTransB() ? 1 : 0);
  return match;
}

/// pipec/gemm_rounding.h's rule: an odd class count, at most 1/8 more work,
/// and enough FLOPs per byte of the weight's padded bf16 copy.
bool paddingPays(const ClassGemm &match) {
  using namespace pipec::gemm_rounding;
  const int64_t padded = rounded(match.classes);
  if (!isOdd(match.classes) || match.rows <= 0 || match.depth <= 0 ||
      double(padded) > kMaxGrowth * double(match.classes))
    return false;
  const double flops = 2.0 * double(match.rows) * double(match.classes) * double(match.depth);
  const double copiedBytes = 2.0 * double(match.depth) * double(match.classes + padded);
  return flops >= kMinFlopsPerByte * copiedBytes;
}

/// `value` padded at the end of `axis` to `size` with `fill`.
Value padAxis(OpBuilder &b, Operation *anchor, Value value, int64_t axis, int64_t size, double fill) {
  auto type = llvm::cast<RankedTensorType>(value.getType());
  SmallVector<int64_t> pads(2 * type.getRank(), 0);
  pads[type.getRank() + axis] = size - type.getDimSize(axis);
  auto pad = nn::PadOp::create(b, anchor->getLoc(), value, pads, llvm::APFloat(fill));
  inheritPlacement(anchor, pad, /*withCost=*/false);
  return pad;
}

void padClassesOf(nn::SoftmaxCrossEntropyLossOp loss, const ClassGemm &match) {
  const int64_t padded = gemm_rounding::rounded(match.classes);
  const double minusInfinity = -std::numeric_limits<double>::infinity();
  nn::GemmOp gemm = match.gemm;
  OpBuilder b(gemm);
  Value weight = padAxis(b, gemm, gemm.getB(), gemm.getTransB() ? 0 : 1, padded, 0.0);
  Value bias;
  if (Value c = gemm.getC()) {
    bias = padAxis(b, gemm, c, llvm::cast<RankedTensorType>(c.getType()).getRank() - 1, padded, minusInfinity);
  } else {
    SmallVector<float> values(padded, 0.0f);
    std::fill(values.begin() + match.classes, values.end(), -std::numeric_limits<float>::infinity());
    auto type = RankedTensorType::get({padded}, b.getF32Type());
    auto constant = nn::ConstantOp::create(b, gemm.getLoc(), DenseElementsAttr::get(type, llvm::ArrayRef(values)));
    inheritPlacement(gemm, constant, /*withCost=*/false);
    bias = constant;
  }
  auto paddedType = [&](Value value) {
    auto type = llvm::cast<RankedTensorType>(value.getType());
    SmallVector<int64_t> shape(type.getShape());
    shape.back() = padded;
    return RankedTensorType::get(shape, type.getElementType());
  };
  OperationState roundedState(gemm.getLoc(), gemm->getName());
  roundedState.addOperands({gemm.getA(), weight, bias});
  roundedState.addAttributes(gemm->getAttrs());
  roundedState.addTypes(paddedType(gemm.getResult()));
  auto rounded = llvm::cast<nn::GemmOp>(b.create(roundedState));
  rounded.setBetaAttr(b.getF32FloatAttr(1.0f));
  Value scores = rounded.getResult();
  for (nn::ReshapeOp view : match.views) {
    b.setInsertionPoint(view);
    auto copy = nn::ReshapeOp::create(b, view.getLoc(), paddedType(view.getResult()), scores);
    copy->setAttrs(view->getAttrs());
    scores = copy;
  }
  b.setInsertionPoint(loss);
  Value weights = loss.getWeights() ? padAxis(b, loss, loss.getWeights(), 0, padded, 0.0) : Value();
  OperationState lossState(loss.getLoc(), loss->getName());
  lossState.addOperands({scores, loss.getLabels()});
  if (weights)
    lossState.addOperands(weights);
  lossState.addAttributes(loss->getAttrs());
  lossState.addTypes({loss.getLoss().getType(), scores.getType()});
  auto rewritten = llvm::cast<nn::SoftmaxCrossEntropyLossOp>(b.create(lossState));
  rewritten.setClassesAttr(b.getI64IntegerAttr(match.classes));
  loss.getLoss().replaceAllUsesWith(rewritten.getLoss());
  loss->erase();
  for (auto view = match.views.rbegin(); view != match.views.rend(); ++view)
    (*view)->erase();
  gemm->erase();
}

struct PadClasses : impl::PadClassesBase<PadClasses> {
  using Base::Base;
  void runOnOperation() override {
    int64_t applied = 0;
    padClasses(getOperation(), applied);
    numPadded += applied;
  }
};

} // namespace

void padClasses(Operation *root, int64_t &applied) {
  SmallVector<std::pair<nn::SoftmaxCrossEntropyLossOp, ClassGemm>> found;
  root->walk([&](nn::SoftmaxCrossEntropyLossOp loss) {
    if (std::optional<ClassGemm> match = matchClassGemm(loss); match && paddingPays(*match))
      found.emplace_back(loss, std::move(*match));
  });
  for (auto &[loss, match] : found)
    padClassesOf(loss, match);
  applied += int64_t(found.size());
}

} // namespace pipec::passes
