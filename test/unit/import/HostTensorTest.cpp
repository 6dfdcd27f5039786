// The host fold kernels against hand-computed ONNX semantics.
#include "compiler/Import/HostTensor.h"

#include <gtest/gtest.h>

#include <limits>

using namespace pipec::import;

namespace {
HostTensor ints(std::vector<int64_t> shape, std::vector<int64_t> values) {
  return HostTensor::ofInts(ElementKind::Int64, std::move(shape), std::move(values));
}
HostTensor floats(std::vector<int64_t> shape, std::vector<double> values) {
  return HostTensor::ofFloats(ElementKind::Float32, std::move(shape), std::move(values));
}
} // namespace

TEST(HostTensor, BinaryBroadcastsLikeNumpy) {
  HostTensor a = ints({2, 1}, {10, 20});
  HostTensor b = ints({3}, {1, 2, 3});
  HostTensor sum = fold::binary("Add", a, b);
  EXPECT_EQ(sum.shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(sum.ints, (std::vector<int64_t>{11, 12, 13, 21, 22, 23}));
  EXPECT_THROW(fold::binary("Add", ints({2}, {1, 2}), ints({3}, {1, 2, 3})), FoldError);
}

TEST(HostTensor, IntegerDivisionTruncatesAndComparisonsGiveBool) {
  HostTensor q = fold::binary("Div", ints({2}, {-7, 7}), ints({}, {2}));
  EXPECT_EQ(q.ints, (std::vector<int64_t>{-3, 3}));
  HostTensor eq = fold::binary("Equal", ints({3}, {1, -1, 3}), ints({}, {-1}));
  EXPECT_EQ(eq.kind, ElementKind::Bool);
  EXPECT_EQ(eq.ints, (std::vector<int64_t>{0, 1, 0}));
  EXPECT_THROW(fold::binary("Div", ints({1}, {1}), ints({1}, {0})), FoldError);
}

TEST(HostTensor, GatherAlongAnAxisWithNegativeIndices) {
  HostTensor data = ints({2, 3}, {0, 1, 2, 3, 4, 5});
  HostTensor picked = fold::gather(data, ints({2}, {-1, 0}), 1);
  EXPECT_EQ(picked.shape, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(picked.ints, (std::vector<int64_t>{2, 0, 5, 3}));
  HostTensor scalar = fold::gather(ints({4}, {2, 16, 32, 8}), ints({}, {1}), 0);
  EXPECT_TRUE(scalar.shape.empty());
  EXPECT_EQ(scalar.ints, (std::vector<int64_t>{16}));
  EXPECT_THROW(fold::gather(data, ints({1}, {3}), 1), FoldError);
}

TEST(HostTensor, ConcatAndTranspose) {
  HostTensor a = ints({2, 1}, {1, 2}), b = ints({2, 2}, {3, 4, 5, 6});
  HostTensor c = fold::concat({&a, &b}, 1);
  EXPECT_EQ(c.shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(c.ints, (std::vector<int64_t>{1, 3, 4, 2, 5, 6}));
  HostTensor t = fold::transpose(c, {1, 0});
  EXPECT_EQ(t.shape, (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(t.ints, (std::vector<int64_t>{1, 2, 3, 5, 4, 6}));
}

TEST(HostTensor, SliceBoundsAreClampedAsOnnxSays) {
  auto [start, end] = normalizeSliceBounds(1, std::numeric_limits<int64_t>::max(), 1, 5);
  EXPECT_EQ(start, 1);
  EXPECT_EQ(end, 5);
  std::tie(start, end) = normalizeSliceBounds(-1, std::numeric_limits<int64_t>::min(), -1, 5);
  EXPECT_EQ(start, 4);
  EXPECT_EQ(end, -1);
  HostTensor reversed = fold::slice(ints({5}, {0, 1, 2, 3, 4}), {4}, {-1}, {-2});
  EXPECT_EQ(reversed.ints, (std::vector<int64_t>{4, 2, 0}));
}

TEST(HostTensor, ReshapeResolvesZeroAndMinusOne) {
  EXPECT_EQ(resolveReshape({2, 16, 32}, {0, 0, 2, -1}, false),
            (std::vector<int64_t>{2, 16, 2, 16}));
  EXPECT_EQ(resolveReshape({2, 0, 4}, {0, 4}, true), (std::vector<int64_t>{0, 4}));
  EXPECT_THROW(resolveReshape({2, 3}, {-1, -1}, false), FoldError);
  EXPECT_THROW(resolveReshape({2, 3}, {4, -1}, false), FoldError);
  EXPECT_THROW(resolveReshape({2, 3}, {5}, false), FoldError);
}

TEST(HostTensor, ExpandCastAndRange) {
  HostTensor e = fold::expand(floats({1, 2}, {1.5, 2.5}), {3, 1});
  EXPECT_EQ(e.shape, (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(e.floats, (std::vector<double>{1.5, 2.5, 1.5, 2.5, 1.5, 2.5}));
  HostTensor c = fold::cast(floats({2}, {2.7, -2.7}), ElementKind::Int64);
  EXPECT_EQ(c.ints, (std::vector<int64_t>{2, -2}));
  HostTensor b = fold::cast(floats({2}, {0.0, 0.3}), ElementKind::Bool);
  EXPECT_EQ(b.ints, (std::vector<int64_t>{0, 1}));
  HostTensor r = fold::range(ints({}, {0}), ints({}, {7}), ints({}, {3}));
  EXPECT_EQ(r.ints, (std::vector<int64_t>{0, 3, 6}));
}

TEST(HostTensor, WhereSelectsWithBroadcasting) {
  HostTensor condition = HostTensor::ofInts(ElementKind::Bool, {3}, {1, 0, 1});
  HostTensor w = fold::where(condition, ints({3}, {1, 2, 3}), ints({}, {-1}));
  EXPECT_EQ(w.ints, (std::vector<int64_t>{1, -1, 3}));
}
