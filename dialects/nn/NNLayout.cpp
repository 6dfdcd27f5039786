// The layouts an op may store its tensors in: channels-last convolutional
// regions (docs/optimization.md, "Channels last") and sequence-major
// attention (docs/optimization.md, "Fused attention").
#include "dialects/nn/NNDialect.h"

using namespace mlir;

int64_t pipec::nn::channelAxis(int64_t rank, bool channelsLast) {
  return channelsLast && rank >= 3 ? rank - 1 : 1;
}

bool pipec::nn::storesChannelsLast(Operation *op) {
  return isSet(op->getAttrOfType<BoolAttr>("channels_last"));
}

SmallVector<int64_t> pipec::nn::toChannelsLast(int64_t rank) {
  SmallVector<int64_t> perm{0};
  for (int64_t axis = 2; axis < rank; ++axis)
    perm.push_back(axis);
  if (rank >= 2)
    perm.push_back(1);
  return perm;
}

SmallVector<int64_t> pipec::nn::toChannelsFirst(int64_t rank) {
  SmallVector<int64_t> perm{0};
  if (rank >= 2)
    perm.push_back(rank - 1);
  for (int64_t axis = 1; axis + 1 < rank; ++axis)
    perm.push_back(axis);
  return perm;
}

SmallVector<int64_t> pipec::nn::channelsFirstShape(ArrayRef<int64_t> shape, bool channelsLast) {
  if (!channelsLast || shape.size() < 3)
    return SmallVector<int64_t>(shape);
  SmallVector<int64_t> first;
  for (int64_t axis : toChannelsFirst(shape.size()))
    first.push_back(shape[axis]);
  return first;
}

SmallVector<int64_t> pipec::nn::storedShape(ArrayRef<int64_t> channelsFirst, bool channelsLast) {
  if (!channelsLast || channelsFirst.size() < 3)
    return SmallVector<int64_t>(channelsFirst);
  SmallVector<int64_t> stored;
  for (int64_t axis : toChannelsLast(channelsFirst.size()))
    stored.push_back(channelsFirst[axis]);
  return stored;
}

SmallVector<int64_t> pipec::nn::headMajorShape(ArrayRef<int64_t> shape, bool sequenceMajor) {
  SmallVector<int64_t> logical(shape);
  if (sequenceMajor && logical.size() >= 3)
    std::swap(logical[logical.size() - 3], logical[logical.size() - 2]);
  return logical;
}
