// The attention layout rewrites of pipec-recognize-composites
// (docs/optimization.md, "Fused attention"): grouped-query heads read in
// place, the heads' transposes folded into a sequence-major nn.attention,
// and rotary moved before the heads' split so that its transpose folds too;
// q, k and v read in place from their joint projection.
#include "passes/Transforms/PatternRewrites.h"

#include "dialects/nn/NNDialect.h"
#include "dialects/pipe/PipeDialect.h"

#include "mlir/IR/PatternMatch.h"
#include "llvm/ADT/SmallPtrSet.h"

#include <array>
#include <optional>
#include <utility>

using namespace mlir;

namespace pipec::passes {
namespace {

/// The permutation of `rank` axes that swaps axes -3 and -2 (heads and
/// sequence of an attention operand) and keeps the others.
SmallVector<int64_t> headAxesSwap(int64_t rank) {
  SmallVector<int64_t> perm;
  for (int64_t axis = 0; axis < rank; ++axis)
    perm.push_back(axis);
  std::swap(perm[rank - 3], perm[rank - 2]);
  return perm;
}

/// nn.attention of q, k and v that are each a transpose of [B..., S, H, D]
/// projections to [B..., H, S, D] (as every exporter splits heads): the
/// sequence-major nn.attention of the projections themselves, whose
/// kernels read the heads through strides (docs/optimization.md). The
/// result's transposes back to [B..., S, H, Dv] (the head merge) go too;
/// any other reader of the result gets one transpose. Each operand's
/// transpose must have no other reader, so that the rewrite never adds
/// work: three transposes go, at most one comes.
struct AttentionHeadTransposes : OpRewritePattern<nn::AttentionOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(nn::AttentionOp attention, PatternRewriter &rewriter) const override {
    if (attention.getSequenceMajor())
      return failure();
    const int64_t rank = attention.getQuery().getType().getRank();
    if (rank < 3)
      return failure();
    const SmallVector<int64_t> swap = headAxesSwap(rank);
    auto isHeadSwap = [&](Operation *op) {
      auto transpose = llvm::dyn_cast_or_null<nn::TransposeOp>(op);
      return transpose && transpose.getPerm() == ArrayRef<int64_t>(swap);
    };
    SmallVector<Operation *> chain{attention};
    SmallVector<Value> projections;
    for (Value operand : {attention.getQuery(), attention.getKey(), attention.getValue()}) {
      if (!isHeadSwap(operand.getDefiningOp()) || !operand.hasOneUse())
        return failure();
      chain.push_back(operand.getDefiningOp());
      projections.push_back(operand.getDefiningOp()->getOperand(0));
    }
    SmallVector<Operation *> merges;
    for (Operation *user : attention.getResult().getUsers())
      if (isHeadSwap(user))
        merges.push_back(user);
    chain.append(merges.begin(), merges.end());
    if (!sameStage(chain))
      return failure();
    SmallVector<int64_t> resultShape(attention.getResult().getType().getShape());
    std::swap(resultShape[rank - 3], resultShape[rank - 2]);
    auto resultType = RankedTensorType::get(resultShape, attention.getResult().getType().getElementType());
    auto sequenceMajor = nn::AttentionOp::create(
        rewriter, absorbedLocation(attention.getLoc(), ArrayRef(chain).drop_front()),
        TypeRange{resultType, attention.getLogSumExp().getType()}, projections[0], projections[1], projections[2],
        attention.getMask(), attention.getScaleAttr(), attention.getDivideAttr(), attention.getFillAttr(),
        attention.getMaskedWhenAttr(), attention.getDropoutRatioAttr(), attention.getDropoutOpIdAttr(),
        rewriter.getBoolAttr(true));
    inheritPlacement(attention, sequenceMajor, /*withCost=*/true);
    for (Operation *merge : merges)
      rewriter.replaceOp(merge, sequenceMajor.getResult());
    if (!attention.getResult().use_empty()) {
      auto transpose = nn::TransposeOp::create(rewriter, attention.getLoc(), sequenceMajor.getResult(),
                                               rewriter.getDenseI64ArrayAttr(swap));
      inheritPlacement(attention, transpose, /*withCost=*/false);
      rewriter.replaceAllUsesWith(attention.getResult(), transpose.getResult());
    }
    rewriter.replaceAllUsesWith(attention.getLogSumExp(), sequenceMajor.getLogSumExp());
    rewriter.eraseOp(attention);
    for (Operation *split : ArrayRef(chain).slice(1, 3))
      rewriter.eraseOp(split);
    return success();
  }
};

/// nn.attention whose key and value are grouped-query heads repeated in
/// place, [L..., Hkv, T, D] lifted to [L..., Hkv, 1, T, D], expanded to
/// [L..., Hkv, g, T, D] and reshaped to [L..., Hkv·g, T, D] (Llama-family
/// exporters' repeat_kv, the importer's ONNX Attention with kv_num_heads):
/// the attention of the heads themselves, which nn.attention reads grouped
/// (query head h reads key/value head h / g), so the repetitions and their
/// gradients' sums never run. Key and value must repeat alike; the
/// repetitions stay for any other reader.
struct AttentionGroupedHeads : OpRewritePattern<nn::AttentionOp> {
  using OpRewritePattern::OpRewritePattern;

  /// The heads [L..., Hkv, T, D] `operand` repeats, and g; or none.
  static std::optional<std::pair<Value, int64_t>> repeatedHeads(Value operand, SmallVector<Operation *> &chain) {
    auto merge = operand.getDefiningOp<nn::ReshapeOp>();
    auto expand = merge ? merge.getInput().getDefiningOp<nn::ExpandOp>() : nn::ExpandOp();
    if (!expand)
      return std::nullopt;
    auto shapeOf = [](Value v) { return llvm::cast<RankedTensorType>(v.getType()).getShape(); };
    ArrayRef<int64_t> repeated = shapeOf(operand), lifted = shapeOf(expand.getInput()),
                      expanded = shapeOf(expand.getResult());
    const size_t rank = repeated.size();
    if (rank < 3 || lifted.size() != rank + 1 || expanded.size() != rank + 1 || lifted[rank - 2] != 1)
      return std::nullopt;
    const int64_t heads = lifted[rank - 3], group = expanded[rank - 2];
    // Only the new axis grows, and the merge folds it into the heads.
    for (size_t axis = 0; axis <= rank; ++axis)
      if (axis != rank - 2 && lifted[axis] != expanded[axis])
        return std::nullopt;
    if (heads <= 0 || group <= 1 || repeated[rank - 3] != heads * group ||
        repeated.take_front(rank - 3) != lifted.take_front(rank - 3) ||
        repeated.take_back(2) != lifted.take_back(2))
      return std::nullopt;
    chain.push_back(merge);
    chain.push_back(expand);
    SmallVector<int64_t> headsShape(repeated);
    headsShape[rank - 3] = heads;
    // The lift is an unsqueeze or a reshape of the heads themselves, or
    // else the heads are a reshape (a view) of the lifted value.
    Value source = expand.getInput();
    if (Operation *lift = source.getDefiningOp();
        lift && llvm::isa<nn::UnsqueezeOp, nn::ReshapeOp>(lift) && shapeOf(lift->getOperand(0)) == ArrayRef(headsShape)) {
      chain.push_back(lift);
      return std::make_pair(lift->getOperand(0), group);
    }
    return std::make_pair(source, group);
  }

  LogicalResult matchAndRewrite(nn::AttentionOp attention, PatternRewriter &rewriter) const override {
    if (attention.getSequenceMajor())
      return failure();
    SmallVector<Operation *> chain{attention};
    auto key = repeatedHeads(attention.getKey(), chain), value = repeatedHeads(attention.getValue(), chain);
    if (!key || !value || key->second != value->second || !sameStage(chain))
      return failure();
    auto heads = [&](Value source) {
      SmallVector<int64_t> shape(attention.getKey().getType().getShape());
      shape[shape.size() - 3] /= key->second;
      shape.back() = llvm::cast<RankedTensorType>(source.getType()).getShape().back();
      return reshapeTo(rewriter, attention, source, shape);
    };
    Value groupedKey = heads(key->first), groupedValue = heads(value->first);
    auto grouped = nn::AttentionOp::create(
        rewriter, absorbedLocation(attention.getLoc(), ArrayRef(chain).drop_front()),
        TypeRange{attention.getResult().getType(), attention.getLogSumExp().getType()}, attention.getQuery(),
        groupedKey, groupedValue, attention.getMask(), attention.getScaleAttr(), attention.getDivideAttr(),
        attention.getFillAttr(), attention.getMaskedWhenAttr(), attention.getDropoutRatioAttr(),
        attention.getDropoutOpIdAttr(), rewriter.getBoolAttr(false));
    inheritPlacement(attention, grouped, /*withCost=*/true);
    rewriter.replaceOp(attention, grouped.getResults());
    // The repetitions no one else reads go now (readers first), so that the
    // heads' transposes have the attention as their one reader when
    // AttentionHeadTransposes looks at it.
    llvm::SmallPtrSet<Operation *, 8> erased;
    for (Operation *op : ArrayRef(chain).drop_front())
      if (!erased.contains(op) && op->use_empty()) {
        erased.insert(op);
        rewriter.eraseOp(op);
      }
    return success();
  }
};

/// nn.rotary of a heads' split transpose ([B..., S, H, D] to [B..., H, S,
/// D]) as Llama-family exports apply it: the rotary of the projection
/// itself, transposed after, with cos and sin (broadcast to x) laid out as
/// the projection is. The rotation runs along the last axis, which the swap
/// keeps, so the two commute; the transpose then meets the attention, where
/// AttentionHeadTransposes folds it (grouped heads too, once
/// AttentionGroupedHeads has taken their repetition away). The
/// tables move by a reshape when one of the swapped axes is 1 (as [S, D]
/// or [1, 1, S, D] tables are), else by a transpose of the table.
struct RotaryBeforeHeadTranspose : OpRewritePattern<nn::RotaryOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(nn::RotaryOp rotary, PatternRewriter &rewriter) const override {
    auto split = rotary.getInput().getDefiningOp<nn::TransposeOp>();
    const int64_t rank = rotary.getInput().getType().getRank();
    if (!split || rank < 3 || !rotary.getInput().hasOneUse())
      return failure();
    const SmallVector<int64_t> swap = headAxesSwap(rank);
    if (split.getPerm() != ArrayRef<int64_t>(swap) || !sameStage({rotary, split}))
      return failure();
    auto relaid = [&](Value table) -> Value {
      auto type = llvm::cast<RankedTensorType>(table.getType());
      if (type.getRank() < 2)
        return table; // no head or sequence axis: it broadcasts the same way
      SmallVector<int64_t> aligned(rank - type.getRank(), 1);
      aligned.append(type.getShape().begin(), type.getShape().end());
      SmallVector<int64_t> swapped(aligned);
      std::swap(swapped[rank - 3], swapped[rank - 2]);
      if (aligned[rank - 3] == 1 || aligned[rank - 2] == 1)
        return reshapeTo(rewriter, rotary, table, swapped);
      auto transpose = nn::TransposeOp::create(rewriter, rotary.getLoc(),
                                               RankedTensorType::get(swapped, type.getElementType()),
                                               reshapeTo(rewriter, rotary, table, aligned),
                                               rewriter.getDenseI64ArrayAttr(swap));
      inheritPlacement(rotary, transpose, /*withCost=*/false);
      return transpose;
    };
    Value cos = relaid(rotary.getCos()), sin = relaid(rotary.getSin());
    Value projection = split.getInput();
    auto moved = nn::RotaryOp::create(rewriter, rotary.getLoc(), projection.getType(), projection, cos, sin,
                                      rotary.getInterleavedAttr(), rotary.getTransposedAttr());
    inheritPlacement(rotary, moved, /*withCost=*/true);
    auto transpose = nn::TransposeOp::create(rewriter, split.getLoc(), rotary.getType(), moved.getResult(),
                                             rewriter.getDenseI64ArrayAttr(swap));
    inheritPlacement(split, transpose, /*withCost=*/true);
    rewriter.replaceOp(rotary, transpose.getResult());
    rewriter.eraseOp(split);
    return success();
  }
};

/// Sequence-major nn.attention whose query, key and value are views
/// ([L'..., S, W] to [L'..., S, H, D]) of the three pieces of a split of
/// one joint projection [L'..., S, Wq + Wk + Wv] along its last axis, in
/// that order (GPT-2's c_attn and every fused q/k/v projection): the
/// attention of the joint projection viewed as [L'..., S, H + 2·Hkv, D],
/// which reads its three windows in place (joint_kv_heads), so that the
/// split and, in the backward, the concatenation of the three gradients
/// never run (docs/optimization.md, "Joint q/k/v"). D must be a multiple of
/// 8, so that each window starts 16 bytes apart in bfloat16 as cuDNN
/// reads them; every piece and view must have no other reader.
struct AttentionJointProjection : OpRewritePattern<nn::AttentionOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(nn::AttentionOp attention, PatternRewriter &rewriter) const override {
    if (!attention.getSequenceMajor() || attention.getJointKvHeads() != 0)
      return failure();
    SmallVector<Operation *> chain{attention};
    nn::SplitOp split;
    for (auto [index, operand] : llvm::enumerate(
             std::array<Value, 3>{attention.getQuery(), attention.getKey(), attention.getValue()})) {
      auto view = operand.getDefiningOp<nn::ReshapeOp>();
      Value piece = view ? view.getInput() : Value();
      auto pieceOf = piece ? piece.getDefiningOp<nn::SplitOp>() : nn::SplitOp();
      if (!pieceOf || !operand.hasOneUse() || !piece.hasOneUse() ||
          llvm::cast<OpResult>(piece).getResultNumber() != index || (split && pieceOf != split))
        return failure();
      split = pieceOf;
      chain.push_back(view);
    }
    auto jointType = llvm::cast<RankedTensorType>(split.getInput().getType());
    const int64_t rank = jointType.getRank();
    if (split->getNumResults() != 3 || rank < 2 || (split.getAxis() != rank - 1 && split.getAxis() != -1))
      return failure();
    // Each view: the piece's [L'..., S] then its heads and D.
    ArrayRef<int64_t> lead = jointType.getShape().drop_back();
    SmallVector<int64_t> heads;
    const int64_t width = attention.getQuery().getType().getShape().back();
    for (Value operand : {attention.getQuery(), attention.getKey(), attention.getValue()}) {
      ArrayRef<int64_t> shape = llvm::cast<RankedTensorType>(operand.getType()).getShape();
      if (static_cast<int64_t>(shape.size()) != rank + 1 || shape.take_front(rank - 1) != lead || shape.back() != width)
        return failure();
      heads.push_back(shape[rank - 1]);
    }
    if (width <= 0 || width % 8 != 0 || heads[1] != heads[2] || heads[1] <= 0 || heads[0] % heads[1] != 0)
      return failure();
    chain.push_back(split);
    if (!sameStage(chain))
      return failure();
    SmallVector<int64_t> jointShape(lead);
    jointShape.append({heads[0] + 2 * heads[1], width});
    Value joint = reshapeTo(rewriter, attention, split.getInput(), jointShape);
    auto jointAttention = nn::AttentionOp::create(
        rewriter, absorbedLocation(attention.getLoc(), ArrayRef(chain).drop_front()),
        TypeRange{attention.getResult().getType(), attention.getLogSumExp().getType()}, joint, joint, joint,
        attention.getMask(), attention.getScaleAttr(), attention.getDivideAttr(), attention.getFillAttr(),
        attention.getMaskedWhenAttr(), attention.getDropoutRatioAttr(), attention.getDropoutOpIdAttr(),
        attention.getSequenceMajorAttr(), rewriter.getI64IntegerAttr(heads[1]));
    inheritPlacement(attention, jointAttention, /*withCost=*/true);
    rewriter.replaceOp(attention, jointAttention.getResults());
    for (Operation *op : ArrayRef(chain).drop_front()) // the views, then the split
      rewriter.eraseOp(op);
    return success();
  }
};

} // namespace

void addAttentionLayoutPatterns(RewritePatternSet &patterns) {
  patterns.add<AttentionGroupedHeads, AttentionHeadTransposes, RotaryBeforeHeadTranspose, AttentionJointProjection>(
      patterns.getContext());
}
} // namespace pipec::passes
