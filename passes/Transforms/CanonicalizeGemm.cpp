// pipec-canonicalize-gemm: matrix products as GEMMs with the transposes,
// the batch rows and the bias folded in (docs/optimization.md).
#include "passes/Passes.h"
#include "passes/Transforms/PatternRewrites.h"

#include "dialects/nn/NNDialect.h"
#include "dialects/pipe/PipeDialect.h"

#include "mlir/IR/PatternMatch.h"

#include <type_traits>

namespace pipec::passes {
#define GEN_PASS_DEF_CANONICALIZEGEMM
#include "passes/Passes.h.inc"
} // namespace pipec::passes

using namespace mlir;

namespace pipec::passes {
namespace {

bool isMatrixTranspose(nn::TransposeOp transpose) {
  return transpose && transpose.getPerm().size() == 2 && transpose.getPerm()[0] == 1 &&
         transpose.getPerm()[1] == 0;
}

/// matmul(a[..., M, K], b[K, N]) -> reshape(gemm(reshape(a)[rows, K], b)).
struct MatMulAgainstMatrix : OpRewritePattern<nn::MatMulOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(nn::MatMulOp matmul, PatternRewriter &rewriter) const override {
    auto a = rankedF32(matmul.getA()), b = rankedF32(matmul.getB());
    auto result = rankedF32(matmul.getResult());
    if (!a || !b || !result || a.getRank() < 2 || b.getRank() != 2)
      return failure();
    int64_t k = a.getShape().back();
    int64_t rows = a.getNumElements() / std::max<int64_t>(1, k);
    if (k == 0 || b.getDimSize(0) != k)
      return failure();
    Value lhs = reshapeTo(rewriter, matmul, matmul.getA(), {rows, k});
    auto gemm = nn::GemmOp::create(rewriter, matmul.getLoc(), lhs, matmul.getB(), Value(),
                                   llvm::APFloat(1.0f), llvm::APFloat(1.0f), false, false,
                                   /*activation=*/nullptr);
    inheritPlacement(matmul, gemm, /*withCost=*/true);
    rewriter.replaceOp(matmul, reshapeTo(rewriter, matmul, gemm.getResult(), result.getShape()));
    return success();
  }
};

/// gemm(transpose(x), ...) -> gemm(x, ..., transA = !transA) (and for B).
struct TransposeIntoGemm : OpRewritePattern<nn::GemmOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(nn::GemmOp gemm, PatternRewriter &rewriter) const override {
    auto ta = gemm.getA().getDefiningOp<nn::TransposeOp>();
    auto tb = gemm.getB().getDefiningOp<nn::TransposeOp>();
    bool foldA = isMatrixTranspose(ta) && sameStage({gemm, ta});
    bool foldB = isMatrixTranspose(tb) && sameStage({gemm, tb});
    if (!foldA && !foldB)
      return failure();
    rewriter.modifyOpInPlace(gemm, [&] {
      // A transpose read by nothing else goes away: the GEMM is named after it too.
      SmallVector<Operation *> absorbed;
      for (nn::TransposeOp folded : {foldA ? ta : nn::TransposeOp(), foldB ? tb : nn::TransposeOp()})
        if (folded && folded->hasOneUse())
          absorbed.push_back(folded);
      gemm->setLoc(absorbedLocation(gemm.getLoc(), absorbed));
      if (foldA) {
        gemm.getAMutable().assign(ta.getInput());
        gemm.setTransA(!gemm.getTransA());
      }
      if (foldB) {
        gemm.getBMutable().assign(tb.getInput());
        gemm.setTransB(!gemm.getTransB());
      }
    });
    return success();
  }
};

/// A transpose of x's last two axes (the rest in place) in `user`'s stage,
/// of rank >= 3 (a matrix transpose feeds nn.gemm's flags instead).
nn::TransposeOp lastTwoAxesTranspose(Value x, Operation *user) {
  auto transpose = x.getDefiningOp<nn::TransposeOp>();
  if (!transpose || !sameStage({user, transpose}))
    return nn::TransposeOp();
  ArrayRef<int64_t> perm = transpose.getPerm();
  if (perm.size() < 3 || !swapsLastTwoAxes(perm))
    return nn::TransposeOp();
  return transpose;
}

/// matmul(transpose(x), y) with x's last two axes swapped ->
/// batched_gemm(x, y, transA) (likewise for B), and a batched_gemm's
/// operand transposed that way toggles its flag: each batch entry's GEMM
/// reads the stored matrix. Inside outlined stages only, that is after
/// autodiff (nn.batched_gemm has no gradient rule), where the gradients of
/// batched products create these transposes. A matmul against a matrix is
/// left to MatMulAgainstMatrix (one GEMM over the flattened rows), one with
/// a vector operand stays a matmul.
template <class Op> struct TransposeIntoBatchedGemm : OpRewritePattern<Op> {
  using OpRewritePattern<Op>::OpRewritePattern;
  LogicalResult matchAndRewrite(Op op, PatternRewriter &rewriter) const override {
    auto a = rankedF32(op.getA()), b = rankedF32(op.getB());
    if (!a || !b || !rankedF32(op.getResult()) || a.getRank() < 2 || b.getRank() < 2 ||
        !op->template getParentOfType<pipe::StageOp>())
      return failure();
    bool transA = false, transB = false;
    if constexpr (std::is_same_v<Op, nn::BatchedGemmOp>) {
      transA = op.getTransA();
      transB = op.getTransB();
    } else if (b.getRank() == 2) {
      return failure(); // MatMulAgainstMatrix's
    }
    nn::TransposeOp ta = lastTwoAxesTranspose(op.getA(), op), tb = lastTwoAxesTranspose(op.getB(), op);
    if (!ta && !tb)
      return failure();
    SmallVector<Operation *> absorbed;
    for (nn::TransposeOp transpose : {ta, tb})
      if (transpose && transpose->hasOneUse())
        absorbed.push_back(transpose);
    auto folded = nn::BatchedGemmOp::create(rewriter, absorbedLocation(op.getLoc(), absorbed),
                                            ta ? ta.getInput() : op.getA(),
                                            tb ? tb.getInput() : op.getB(), transA != bool(ta),
                                            transB != bool(tb));
    inheritPlacement(op, folded, /*withCost=*/true);
    rewriter.replaceOp(op, folded.getResult());
    return success();
  }
};

/// transpose(gemm(A, B)) without C -> gemm(B, A) with the operands' flags
/// swapped and flipped: (op(A) op(B))^T = op(B)^T op(A)^T.
struct TransposeOfGemm : OpRewritePattern<nn::TransposeOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(nn::TransposeOp transpose,
                                PatternRewriter &rewriter) const override {
    auto gemm = transpose.getInput().getDefiningOp<nn::GemmOp>();
    if (!isMatrixTranspose(transpose) || !gemm || gemm.getC() || gemm.getActivation() || !gemm->hasOneUse() ||
        !rankedF32(transpose.getResult()) || !sameStage({transpose, gemm}))
      return failure();
    auto swapped = nn::GemmOp::create(rewriter, absorbedLocation(gemm.getLoc(), {transpose}), gemm.getB(),
                                      gemm.getA(), Value(),
                                      gemm.getAlpha(), gemm.getBeta(), !gemm.getTransB(),
                                      !gemm.getTransA(), /*activation=*/nullptr);
    inheritPlacement(gemm, swapped, /*withCost=*/true);
    rewriter.replaceOp(transpose, swapped.getResult());
    rewriter.eraseOp(gemm);
    return success();
  }
};

/// The shape a bias of `bias` must have to be gemm's C for a result of
/// `rows` x `cols` reached through a view that keeps the last dimension:
/// [cols] or [1] after dropping leading ones, else none.
std::optional<SmallVector<int64_t>> rowBias(RankedTensorType bias, int64_t cols) {
  ArrayRef<int64_t> shape = bias.getShape();
  while (!shape.empty() && shape.front() == 1 && shape.size() > 1)
    shape = shape.drop_front();
  if (shape.empty())
    return SmallVector<int64_t>{1};
  if (shape.size() == 1 && (shape[0] == cols || shape[0] == 1))
    return SmallVector<int64_t>{shape[0]};
  return std::nullopt;
}

/// add(gemm(A, B), bias) -> gemm(A, B, bias) with beta = 1, also through a
/// reshape of the gemm result that keeps its last dimension.
struct BiasIntoGemm : OpRewritePattern<nn::AddOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(nn::AddOp add, PatternRewriter &rewriter) const override {
    auto result = rankedF32(add.getResult());
    if (!result)
      return failure();
    for (int side = 0; side < 2; ++side) {
      Value product = add->getOperand(side), bias = add->getOperand(1 - side);
      auto biasType = rankedF32(bias);
      if (!biasType || product.getType() != add.getResult().getType() || !product.hasOneUse())
        continue;
      auto view = product.getDefiningOp<nn::ReshapeOp>();
      auto gemm = (view ? view.getInput() : product).getDefiningOp<nn::GemmOp>();
      if (!gemm || gemm.getC() || gemm.getActivation() || !gemm->hasOneUse() ||
          !sameStage(view ? ArrayRef<Operation *>{add, view, gemm} : ArrayRef<Operation *>{add, gemm}))
        continue;
      auto gemmType = llvm::cast<RankedTensorType>(gemm.getResult().getType());
      int64_t cols = gemmType.getDimSize(1);
      Value c;
      if (!view && biasType.getRank() <= 2) {
        c = bias; // the add's result is the product's shape: the bias broadcasts to it
      } else if (result.getShape().back() == cols) {
        auto shape = rowBias(biasType, cols);
        if (!shape)
          continue;
        c = reshapeTo(rewriter, add, bias, *shape);
      } else {
        continue;
      }
      rewriter.setInsertionPoint(add);
      auto fused = nn::GemmOp::create(rewriter, absorbedLocation(gemm.getLoc(), {add}), gemm.getA(), gemm.getB(), c,
                                      gemm.getAlpha(), llvm::APFloat(1.0f), gemm.getTransA(),
                                      gemm.getTransB(), /*activation=*/nullptr);
      inheritPlacement(gemm, fused, /*withCost=*/true);
      rewriter.replaceOp(add, reshapeTo(rewriter, add, fused.getResult(), result.getShape()));
      if (view)
        rewriter.eraseOp(view);
      rewriter.eraseOp(gemm);
      return success();
    }
    return failure();
  }
};

struct CanonicalizeGemm : impl::CanonicalizeGemmBase<CanonicalizeGemm> {
  using Base::Base;
  void runOnOperation() override {
    int64_t applied = 0;
    if (failed(canonicalizeGemms(getOperation(), applied)))
      return signalPassFailure();
    numRewrites += applied;
  }
};

} // namespace

LogicalResult canonicalizeGemms(Operation *root, int64_t &applied) {
  RewritePatternSet patterns(root->getContext());
  patterns.add<MatMulAgainstMatrix, TransposeIntoGemm, TransposeOfGemm, BiasIntoGemm,
               TransposeIntoBatchedGemm<nn::MatMulOp>, TransposeIntoBatchedGemm<nn::BatchedGemmOp>>(
      root->getContext());
  return applyPatternsCounted(root, std::move(patterns), applied);
}
} // namespace pipec::passes
