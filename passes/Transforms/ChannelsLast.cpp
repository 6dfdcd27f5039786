// pipec-channels-last: convolutional regions of CUDA stages stored
// channels-last ([N, spatial..., C]), the layout conversions at the regions'
// edges (docs/optimization.md, "Channels last").
#include "passes/Passes.h"
#include "passes/Transforms/PatternRewrites.h"

#include "dialects/nn/NNDialect.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/SmallPtrSet.h"

namespace pipec::passes {
#define GEN_PASS_DEF_CHANNELSLAST
#include "passes/Passes.h.inc"
} // namespace pipec::passes

using namespace mlir;

namespace pipec::passes {
namespace {

RankedTensorType rankedOf(Value value) { return llvm::dyn_cast<RankedTensorType>(value.getType()); }

/// Whether `value` is a tensor the layout applies to: rank 3 or more.
bool spatialTensor(Value value) {
  RankedTensorType type = rankedOf(value);
  return type && type.hasStaticShape() && type.getRank() >= 3;
}

/// The ops that take `channels_last` (their kernels read and write either
/// layout, docs/cuda-kernels.md): the convolutions start a region, the others
/// join one whose tensor they read.
bool startsRegion(Operation *op) {
  return llvm::isa<nn::ConvOp, nn::ConvInputGradOp>(op) && spatialTensor(op->getResult(0));
}
bool takesLayoutAttr(Operation *op) {
  return llvm::isa<nn::ConvOp, nn::ConvInputGradOp, nn::BatchNormOp, nn::MaxPoolOp, nn::AveragePoolOp,
                   nn::GlobalAveragePoolOp>(op);
}

/// Element-wise functions and selections, whose meaning does not depend on
/// the layout when each operand is moved as the result is: one of the
/// result's shape, or one that broadcasts to it (a squeeze-excitation's
/// [N, C, 1, 1] scale, a [C, 1, 1] bias), first given the result's rank.
/// (A dropout does depend: its mask is drawn per element index.)
bool elementwiseBroadcast(Operation *op) {
  if (!llvm::isa<nn::UnaryElementwiseOpInterface, nn::BinaryElementwiseOpInterface, nn::WhereOp>(op) ||
      op->getNumResults() != 1 || !spatialTensor(op->getResult(0)))
    return false;
  auto shape = rankedOf(op->getResult(0)).getShape();
  return llvm::all_of(op->getOperands(), [&](Value operand) {
    RankedTensorType type = rankedOf(operand);
    return type && type.hasStaticShape() && nn::broadcastsTo(type.getShape(), shape);
  });
}

/// Whether every element of `value` stands for the whole tensor it
/// broadcasts to along each axis (a scalar, [1], [1, 1, 1]): any layout.
bool layoutFree(Value value) {
  RankedTensorType type = rankedOf(value);
  return type && llvm::all_of(type.getShape(), [](int64_t d) { return d == 1; });
}

/// Data movement along axes that the layout renumbers: its axis attributes
/// are rewritten (axesRenumbered).
bool movesAlongAxes(Operation *op) {
  if (!llvm::isa<nn::ConcatOp, nn::SplitOp, nn::PadOp, nn::SliceOp>(op) || !spatialTensor(op->getOperand(0)))
    return false;
  const int64_t rank = rankedOf(op->getOperand(0)).getRank();
  return llvm::all_of(op->getOperands(), [&](Value operand) {
    RankedTensorType type = rankedOf(operand);
    return type && type.hasStaticShape() && type.getRank() == rank;
  });
}

/// The channels-last position of channels-first axis `axis`.
int64_t storedAxis(int64_t axis, int64_t rank) {
  const SmallVector<int64_t> perm = nn::toChannelsLast(rank);
  return std::find(perm.begin(), perm.end(), axis) - perm.begin();
}

/// Per-axis values (one per channels-first axis) in channels-last order.
SmallVector<int64_t> storedPerAxis(ArrayRef<int64_t> values) {
  SmallVector<int64_t> stored;
  for (int64_t axis : nn::toChannelsLast(values.size()))
    stored.push_back(values[axis]);
  return stored;
}

/// `op`'s attributes for its channels-last form.
void rewriteAttributes(Operation *op, OperationState &state, Builder &builder) {
  if (takesLayoutAttr(op))
    state.attributes.set("channels_last", builder.getBoolAttr(true));
  const int64_t rank = rankedOf(op->getOperand(0)).getRank();
  if (auto concat = llvm::dyn_cast<nn::ConcatOp>(op)) {
    const int64_t axis = *nn::normalizeAxis(concat.getAxis(), rank);
    state.attributes.set(concat.getAxisAttrName(), builder.getI64IntegerAttr(storedAxis(axis, rank)));
  } else if (auto split = llvm::dyn_cast<nn::SplitOp>(op)) {
    const int64_t axis = *nn::normalizeAxis(split.getAxis(), rank);
    state.attributes.set(split.getAxisAttrName(), builder.getI64IntegerAttr(storedAxis(axis, rank)));
  } else if (auto pad = llvm::dyn_cast<nn::PadOp>(op)) {
    ArrayRef<int64_t> pads = pad.getPads();
    SmallVector<int64_t> stored = storedPerAxis(pads.take_front(rank));
    stored.append(storedPerAxis(pads.drop_front(rank)));
    state.attributes.set(pad.getPadsAttrName(), builder.getDenseI64ArrayAttr(stored));
  } else if (auto slice = llvm::dyn_cast<nn::SliceOp>(op)) {
    state.attributes.set(slice.getStartsAttrName(), builder.getDenseI64ArrayAttr(storedPerAxis(slice.getStarts())));
    state.attributes.set(slice.getEndsAttrName(), builder.getDenseI64ArrayAttr(storedPerAxis(slice.getEnds())));
    state.attributes.set(slice.getStepsAttrName(), builder.getDenseI64ArrayAttr(storedPerAxis(slice.getSteps())));
  }
}

/// A channel shuffle of a region tensor (ShuffleNet's): reshape [N, C, d...]
/// to [N, a, b, d...] (a · b = C), swap axes 1 and 2, reshape back to
/// [N, C, d...], each read by the next alone. Channels-last it is the same
/// three moves on the last axis: [N, d..., a, b], swap the last two, merge.
struct ChannelShuffle {
  nn::ReshapeOp split;
  nn::TransposeOp swap;
  nn::ReshapeOp merge;
};

std::optional<ChannelShuffle> channelShuffleAt(Operation *op) {
  auto split = llvm::dyn_cast<nn::ReshapeOp>(op);
  if (!split || !spatialTensor(split.getInput()) || !split.getResult().hasOneUse())
    return std::nullopt;
  auto swap = llvm::dyn_cast<nn::TransposeOp>(*split.getResult().getUsers().begin());
  if (!swap || !swap.getResult().hasOneUse())
    return std::nullopt;
  auto merge = llvm::dyn_cast<nn::ReshapeOp>(*swap.getResult().getUsers().begin());
  if (!merge || merge.getResult().getType() != split.getInput().getType())
    return std::nullopt;
  ArrayRef<int64_t> in = rankedOf(split.getInput()).getShape(), parts = rankedOf(split.getResult()).getShape();
  const int64_t rank = in.size();
  if (static_cast<int64_t>(parts.size()) != rank + 1 || parts[0] != in[0] || parts[1] * parts[2] != in[1] ||
      !llvm::equal(parts.drop_front(3), in.drop_front(2)))
    return std::nullopt;
  SmallVector<int64_t> swapped = llvm::to_vector(llvm::seq<int64_t>(0, rank + 1));
  std::swap(swapped[1], swapped[2]);
  if (!llvm::equal(swap.getPerm(), swapped))
    return std::nullopt;
  return ChannelShuffle{split, swap, merge};
}

/// Rewrites one block's ops into channels-last regions.
class RegionBuilder {
public:
  explicit RegionBuilder(Block &block) : block(block) {}

  void run() {
    SmallVector<Operation *> shuffled; // a shuffle's old ops, erased after the walk passed them
    for (Operation &op : llvm::make_early_inc_range(block.without_terminator())) {
      if (std::optional<ChannelShuffle> shuffle = channelShuffleAt(&op);
          shuffle && isStored(shuffle->split.getInput())) {
        rewriteShuffle(*shuffle);
        shuffled.append({shuffle->merge, shuffle->swap, shuffle->split});
      } else if (joinsRegion(&op)) {
        rewrite(&op);
      }
    }
    for (Operation *op : shuffled)
      op->erase();
    // A model's own transpose of a region tensor (ConvNeXt's permute to
    // [N, H, W, C]) moves the stored tensor once, or not at all.
    for (Operation *conversion : backConversions)
      if (auto back = llvm::dyn_cast<nn::TransposeOp>(conversion))
        for (Operation *user : llvm::make_early_inc_range(back->getUsers()))
          if (auto transpose = llvm::dyn_cast<nn::TransposeOp>(user)) {
            OpBuilder builder(transpose);
            transpose.getResult().replaceAllUsesWith(composed(builder, back, transpose.getPerm(), transpose));
            transpose->erase();
            ++transposesFolded;
          }
    // The conversions back that only region ops read were replaced by the
    // stored values themselves.
    for (Operation *conversion : backConversions)
      if (conversion->use_empty())
        conversion->erase();
      else
        ++conversionsKept;
  }

  int64_t regionOps = 0, conversionsKept = 0, conversionsIn = 0, transposesFolded = 0, shufflesMoved = 0;

private:
  bool isStored(Value value) const { return stored.count(value); }

  /// Whether `op` runs channels-last: a convolution, or an op the layout
  /// does not change that reads a channels-last tensor.
  bool joinsRegion(Operation *op) const {
    if (op->getNumRegions())
      return false;
    if (startsRegion(op))
      return true;
    const bool readsStored = llvm::any_of(op->getOperands(), [&](Value v) { return isStored(v); });
    if (!readsStored)
      return false;
    if (llvm::isa<nn::BatchNormOp, nn::MaxPoolOp, nn::AveragePoolOp, nn::GlobalAveragePoolOp>(op))
      return isStored(op->getOperand(0));
    return elementwiseBroadcast(op) || movesAlongAxes(op);
  }

  /// `value` in the other layout, next to `anchor`: a view when only axes
  /// of size 1 move (the bytes are in the same order), else a transpose.
  Value converted(OpBuilder &builder, Value value, bool toChannelsLast, Operation *anchor) {
    RankedTensorType type = rankedOf(value);
    const int64_t rank = type.getRank();
    SmallVector<int64_t> perm = toChannelsLast ? nn::toChannelsLast(rank) : nn::toChannelsFirst(rank);
    SmallVector<int64_t> shape;
    for (int64_t axis : perm)
      shape.push_back(type.getDimSize(axis));
    SmallVector<int64_t> moved; // the axes of more than one element, in their new order
    for (int64_t axis : perm)
      if (type.getDimSize(axis) != 1)
        moved.push_back(axis);
    Operation *conversion;
    if (llvm::is_sorted(moved))
      conversion = nn::ReshapeOp::create(builder, anchor->getLoc(), type.clone(shape), value);
    else
      conversion = nn::TransposeOp::create(builder, anchor->getLoc(), value, perm);
    inheritPlacement(anchor, conversion, /*withCost=*/false);
    return conversion->getResult(0);
  }

  /// The channels-last form of `value` for a region op: the stored value
  /// behind a conversion back, else a conversion in before `user`, made once
  /// (of the model's own transpose, one transpose: ConvNeXt's permutes).
  Value storedFormOf(Value value, Operation *user) {
    if (auto it = stored.find(value); it != stored.end())
      return it->second;
    if (auto it = convertedIn.find(value); it != convertedIn.end())
      return it->second;
    OpBuilder builder(user);
    Value form;
    const int64_t rank = rankedOf(value).getRank();
    if (auto transpose = value.getDefiningOp<nn::TransposeOp>())
      form = composed(builder, transpose, nn::toChannelsLast(rank), user);
    else
      form = converted(builder, value, /*toChannelsLast=*/true, user);
    ++conversionsIn;
    convertedIn[value] = form;
    return form;
  }

  /// transpose(transpose(x, inner), outer) as one move of x: x itself when
  /// the two cancel.
  Value composed(OpBuilder &builder, nn::TransposeOp inner, ArrayRef<int64_t> outer, Operation *anchor) {
    SmallVector<int64_t> perm;
    for (int64_t axis : outer)
      perm.push_back(inner.getPerm()[axis]);
    Value x = inner.getInput();
    if (llvm::equal(perm, llvm::seq<int64_t>(0, perm.size())))
      return x;
    auto move = nn::TransposeOp::create(builder, anchor->getLoc(), x, perm);
    inheritPlacement(anchor, move, /*withCost=*/false);
    return move;
  }

  /// An operand of a region op in its channels-last form: a broadcast one
  /// first given the result's rank (leading 1s, as broadcasting reads it).
  Value regionOperand(Value operand, Operation *op) {
    const int64_t rank = rankedOf(op->getResult(0)).getRank();
    if (!takesLayoutAttr(op) && !movesAlongAxes(op) && !layoutFree(operand) && rankedOf(operand).getRank() < rank) {
      RankedTensorType type = rankedOf(operand);
      SmallVector<int64_t> shape(rank - type.getRank(), 1);
      shape.append(type.getShape().begin(), type.getShape().end());
      OpBuilder builder(op);
      auto full = nn::ReshapeOp::create(builder, op->getLoc(), type.clone(shape), operand);
      inheritPlacement(op, full, /*withCost=*/false);
      return storedFormOf(full, op);
    }
    return spatialTensor(operand) && !layoutFree(operand) ? storedFormOf(operand, op) : operand;
  }

  /// The shuffle's three moves on the stored tensor's channel axis; the old
  /// ops are left unread.
  void rewriteShuffle(ChannelShuffle shuffle) {
    OpBuilder builder(shuffle.merge);
    Value x = stored.lookup(shuffle.split.getInput());
    RankedTensorType type = rankedOf(x);
    ArrayRef<int64_t> parts = rankedOf(shuffle.split.getResult()).getShape();
    SmallVector<int64_t> split = llvm::to_vector(type.getShape().drop_back());
    split.append({parts[1], parts[2]});
    SmallVector<int64_t> perm = llvm::to_vector(llvm::seq<int64_t>(0, split.size()));
    std::swap(perm[perm.size() - 1], perm[perm.size() - 2]);
    auto viewed = nn::ReshapeOp::create(builder, shuffle.split.getLoc(), type.clone(split), x);
    auto swapped = nn::TransposeOp::create(builder, shuffle.swap.getLoc(), viewed, perm);
    auto merged = nn::ReshapeOp::create(builder, shuffle.merge.getLoc(), type, swapped);
    inheritPlacement(shuffle.split, viewed, /*withCost=*/true);
    inheritPlacement(shuffle.swap, swapped, /*withCost=*/true);
    inheritPlacement(shuffle.merge, merged, /*withCost=*/true);
    regionOps += 3;
    ++shufflesMoved;
    builder.setInsertionPointAfter(merged);
    publish(builder, shuffle.merge.getResult(), merged.getResult(), merged);
  }

  /// Readers outside the region read `now`, which replaces `old`, converted
  /// back to channels-first; region ops that come later read `now`
  /// (storedFormOf).
  void publish(OpBuilder &builder, Value old, Value now, Operation *anchor) {
    Value back = converted(builder, now, /*toChannelsLast=*/false, anchor);
    backConversions.push_back(back.getDefiningOp());
    stored[back] = now;
    old.replaceAllUsesWith(back);
  }

  void rewrite(Operation *op) {
    OpBuilder builder(op);
    OperationState state(op->getLoc(), op->getName());
    for (Value operand : op->getOperands())
      state.addOperands(regionOperand(operand, op));
    state.addAttributes(op->getAttrs());
    rewriteAttributes(op, state, builder);
    for (Value result : op->getResults()) {
      RankedTensorType type = rankedOf(result);
      state.addTypes(spatialTensor(result) ? type.clone(nn::storedShape(type.getShape(), true)) : result.getType());
    }
    Operation *channelsLast = builder.create(state);
    inheritPlacement(op, channelsLast, /*withCost=*/true);
    ++regionOps;
    builder.setInsertionPointAfter(channelsLast);
    for (auto [old, now] : llvm::zip(op->getResults(), channelsLast->getResults())) {
      if (spatialTensor(old))
        publish(builder, old, now, channelsLast);
      else
        old.replaceAllUsesWith(now);
    }
    op->erase();
  }

  Block &block;
  /// A conversion back of a region op's result -> that result.
  llvm::DenseMap<Value, Value> stored;
  /// A tensor from outside a region -> its conversion in.
  llvm::DenseMap<Value, Value> convertedIn;
  SmallVector<Operation *> backConversions;
};

struct ChannelsLast : impl::ChannelsLastBase<ChannelsLast> {
  using Base::Base;
  void runOnOperation() override {
    getOperation()->walk([&](func::FuncOp function) {
      if (function.isExternal())
        return;
      RegionBuilder builder(function.getBody().front());
      builder.run();
      numRegionOps += builder.regionOps;
      numConversions += builder.conversionsKept + builder.conversionsIn;
      numFolded += builder.transposesFolded;
      numShuffles += builder.shufflesMoved;
    });
  }
};

} // namespace

} // namespace pipec::passes
