// The host fold kernels against hand-computed ONNX semantics.
#include "compiler/Import/HostTensor.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>
#include <random>

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

// ---- checked integer arithmetic and the folded-size limit (docs/security.md)

namespace {
constexpr int64_t kInt64Min = std::numeric_limits<int64_t>::min();
constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();
} // namespace

TEST(HostTensorChecked, DivisionAndModuloNeverTrap) {
  EXPECT_THROW(fold::binary("Div", ints({1}, {kInt64Min}), ints({1}, {-1})), FoldError);
  EXPECT_THROW(fold::binary("Mod", ints({1}, {5}), ints({1}, {0})), FoldError);
  EXPECT_EQ(fold::binary("Mod", ints({1}, {kInt64Min}), ints({1}, {-1})).ints,
            (std::vector<int64_t>{0}));
  EXPECT_EQ(fold::binary("Mod", ints({4}, {-7, 7, -7, 7}), ints({4}, {2, -2, -2, 2})).ints,
            (std::vector<int64_t>{1, -1, -1, 1}));
  EXPECT_EQ(fold::binary("FMod", ints({4}, {-7, 7, -7, 7}), ints({4}, {2, -2, -2, 2})).ints,
            (std::vector<int64_t>{-1, 1, -1, 1}));
  // No overflow in the sign fix-up of a divisor near INT64_MIN.
  EXPECT_EQ(fold::binary("Mod", ints({1}, {-1}), ints({1}, {kInt64Min})).ints,
            (std::vector<int64_t>{-1}));
  EXPECT_EQ(fold::binary("Mod", ints({1}, {1}), ints({1}, {kInt64Min})).ints,
            (std::vector<int64_t>{kInt64Min + 1}));
}

TEST(HostTensorChecked, OverflowIsAnErrorNotAWrappedValue) {
  EXPECT_THROW(fold::binary("Add", ints({1}, {kInt64Max}), ints({1}, {1})), FoldError);
  EXPECT_THROW(fold::binary("Sub", ints({1}, {kInt64Min}), ints({1}, {1})), FoldError);
  EXPECT_THROW(fold::binary("Mul", ints({1}, {kInt64Max}), ints({1}, {2})), FoldError);
  EXPECT_THROW(fold::unary("Neg", ints({1}, {kInt64Min})), FoldError);
  EXPECT_THROW(fold::unary("Abs", ints({1}, {kInt64Min})), FoldError);
  EXPECT_EQ(fold::unary("Abs", ints({2}, {-3, kInt64Max})).ints,
            (std::vector<int64_t>{3, kInt64Max}));
  HostTensor int32Max = HostTensor::ofInts(ElementKind::Int32, {1}, {2147483647});
  HostTensor int32One = HostTensor::ofInts(ElementKind::Int32, {1}, {1});
  EXPECT_THROW(fold::binary("Add", int32Max, int32One), FoldError);
  EXPECT_EQ(fold::binary("Pow", ints({2}, {2, -3}), ints({2}, {62, 3})).ints,
            (std::vector<int64_t>{int64_t(1) << 62, -27}));
  EXPECT_THROW(fold::binary("Pow", ints({1}, {2}), ints({1}, {63})), FoldError);
  EXPECT_THROW(fold::binary("Pow", ints({1}, {3}), ints({1}, {kInt64Max})), FoldError);
  EXPECT_THROW(fold::binary("Pow", ints({1}, {2}), ints({1}, {-1})), FoldError);
  EXPECT_EQ(fold::binary("Pow", ints({2}, {1, -1}), ints({2}, {-5, -5})).ints,
            (std::vector<int64_t>{1, -1}));
}

TEST(HostTensorChecked, FloatToIntegerCastsSaturate) {
  HostTensor c = fold::cast(floats({4}, {std::nan(""), 1e30, -1e30, 3.9}), ElementKind::Int64);
  EXPECT_EQ(c.ints, (std::vector<int64_t>{0, kInt64Max, kInt64Min, 3}));
  HostTensor narrow = fold::cast(floats({2}, {1e10, -1e10}), ElementKind::Int32);
  EXPECT_EQ(narrow.ints, (std::vector<int64_t>{2147483647, -2147483648LL}));
}

TEST(HostTensorChecked, FoldedValuesAreBounded) {
  // Refused from the shape alone, before anything is allocated.
  EXPECT_THROW(fold::range(ints({}, {0}), ints({}, {int64_t(1) << 40}), ints({}, {1})), FoldError);
  EXPECT_THROW(fold::range(ints({}, {kInt64Min}), ints({}, {kInt64Max}), ints({}, {1})), FoldError);
  EXPECT_THROW(fold::range(floats({}, {0}), floats({}, {INFINITY}), floats({}, {1})), FoldError);
  EXPECT_THROW(fold::range(floats({}, {0}), floats({}, {NAN}), floats({}, {1})), FoldError);
  EXPECT_THROW(fold::range(ints({}, {0}), floats({}, {3}), ints({}, {1})), FoldError);
  EXPECT_EQ(fold::range(ints({}, {kInt64Max - 2}), ints({}, {kInt64Max}), ints({}, {1})).ints,
            (std::vector<int64_t>{kInt64Max - 2, kInt64Max - 1}));
  EXPECT_EQ(fold::range(ints({}, {5}), ints({}, {0}), ints({}, {-2})).ints,
            (std::vector<int64_t>{5, 3, 1}));
  EXPECT_THROW(fold::expand(floats({1}, {1}), {1 << 20, 1 << 20}), FoldError);
  EXPECT_THROW(fold::expand(floats({1}, {1}), {2, -3}), FoldError);
  EXPECT_THROW(fold::expand(floats({1}, {1}), {kInt64Max, kInt64Max}), FoldError);
  EXPECT_THROW(fold::binary("Add", floats({1 << 14, 1}, std::vector<double>(1 << 14)),
                            floats({1, 1 << 14}, std::vector<double>(1 << 14))),
               FoldError);
  HostTensor big = floats({1 << 22}, std::vector<double>(1 << 22));
  std::vector<const HostTensor *> copies(20, &big);
  EXPECT_THROW(fold::concat(copies, 0), FoldError);
  EXPECT_THROW(fold::gather(floats({2, 1 << 21}, std::vector<double>(1 << 22)),
                            ints({64}, std::vector<int64_t>(64)), 0),
               FoldError);
  EXPECT_THROW(foldedElementCount({kMaxFoldedElements + 1}, "test"), FoldError);
  EXPECT_EQ(foldedElementCount({kMaxFoldedElements}, "test"), kMaxFoldedElements);
}

TEST(HostTensorChecked, ShapesAndBoundsAreChecked) {
  EXPECT_THROW(fold::transpose(ints({2, 3}, {1, 2, 3, 4, 5, 6}), {0, 0}), FoldError);
  EXPECT_THROW(resolveReshape({2, 3}, {kInt64Max, 2, -1}, false), FoldError);
  EXPECT_THROW(resolveReshape({int64_t(1) << 32, int64_t(1) << 32}, {-1}, false), FoldError);
  EXPECT_THROW(fold::reshape(ints({2}, {1, 2}), {int64_t(1) << 32, int64_t(1) << 32, 0}),
               FoldError);
  // A step of INT64_MIN takes one element, without overflow.
  auto [start, end] = normalizeSliceBounds(4, -kInt64Max, kInt64Min, 5);
  HostTensor one = fold::slice(ints({5}, {0, 1, 2, 3, 4}), {start}, {end}, {kInt64Min});
  EXPECT_EQ(one.ints, (std::vector<int64_t>{4}));
  HostTensor first = fold::slice(ints({5}, {0, 1, 2, 3, 4}), {0}, {5}, {kInt64Max});
  EXPECT_EQ(first.ints, (std::vector<int64_t>{0}));
  EXPECT_THROW(fold::slice(ints({5}, {0, 1, 2, 3, 4}), {7}, {9}, {1}), FoldError);
  auto empty = normalizeSliceBounds(0, -1, -1, 0);
  EXPECT_EQ(empty, (std::pair<int64_t, int64_t>{0, 0}));
}

// fold::reduce against a brute-force reference: for every output position,
// the reduced elements visited by nested loops over the reduced axes.
TEST(HostTensorProperty, ReduceMatchesBruteForce) {
  std::mt19937 random(31);
  const char *ops[] = {"ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd",
                       "ReduceSumSquare", "ReduceL1", "ReduceL2", "ReduceLogSumExp"};
  for (int trial = 0; trial < 300; ++trial) {
    const int rank = 1 + random() % 3;
    std::vector<int64_t> shape;
    for (int axis = 0; axis < rank; ++axis)
      shape.push_back(1 + random() % 4);
    std::vector<int64_t> axes;
    for (int axis = 0; axis < rank; ++axis)
      if (random() % 2)
        axes.push_back(axis);
    const bool keepdims = random() % 2;
    const std::string op = ops[trial % 9];
    const int64_t count = std::accumulate(shape.begin(), shape.end(), int64_t{1},
                                          std::multiplies<int64_t>());
    std::vector<double> values(count);
    for (double &value : values)
      value = static_cast<double>(static_cast<int>(random() % 7) - 3); // small integers: exact
    HostTensor input = floats(shape, values);
    HostTensor got = fold::reduce(op, input, axes, keepdims);

    // Brute force: enumerate output positions over the kept axes.
    std::vector<int64_t> strides(rank, 1);
    for (int axis = rank - 2; axis >= 0; --axis)
      strides[axis] = strides[axis + 1] * shape[axis + 1];
    std::vector<double> expected;
    std::vector<int64_t> at(rank, 0);
    std::function<void(int)> outer = [&](int axis) {
      if (axis == rank) {
        std::vector<double> members;
        std::vector<int64_t> inner = at;
        std::function<void(int)> collect = [&](int a) {
          if (a == rank) {
            int64_t flat = 0;
            for (int k = 0; k < rank; ++k)
              flat += inner[k] * strides[k];
            members.push_back(values[flat]);
            return;
          }
          if (std::find(axes.begin(), axes.end(), a) == axes.end())
            return collect(a + 1);
          for (inner[a] = 0; inner[a] < shape[a]; ++inner[a])
            collect(a + 1);
        };
        collect(0);
        double r = op == "ReduceProd" ? 1 : 0;
        if (op == "ReduceMax") r = *std::max_element(members.begin(), members.end());
        if (op == "ReduceMin") r = *std::min_element(members.begin(), members.end());
        for (double m : members) {
          if (op == "ReduceSum" || op == "ReduceMean") r += m;
          if (op == "ReduceProd") r *= m;
          if (op == "ReduceSumSquare" || op == "ReduceL2") r += m * m;
          if (op == "ReduceL1") r += std::fabs(m);
          if (op == "ReduceLogSumExp") r += std::exp(m);
        }
        if (op == "ReduceMean") r /= members.size();
        if (op == "ReduceL2") r = std::sqrt(r);
        if (op == "ReduceLogSumExp") r = std::log(r);
        expected.push_back(r);
        return;
      }
      if (std::find(axes.begin(), axes.end(), axis) != axes.end())
        return outer(axis + 1);
      for (at[axis] = 0; at[axis] < shape[axis]; ++at[axis])
        outer(axis + 1);
    };
    outer(0);
    std::vector<int64_t> expectedShape;
    for (int axis = 0; axis < rank; ++axis) {
      bool reduced = std::find(axes.begin(), axes.end(), axis) != axes.end();
      if (!reduced || keepdims)
        expectedShape.push_back(reduced ? 1 : shape[axis]);
    }
    ASSERT_EQ(got.shape, expectedShape) << op;
    ASSERT_EQ(got.floats.size(), expected.size()) << op;
    for (size_t i = 0; i < expected.size(); ++i)
      EXPECT_NEAR(got.floats[i], expected[i], 1e-5 * std::max(1.0, std::fabs(expected[i])))
          << op << " trial " << trial << " output " << i;
  }
}

TEST(HostTensorChecked, IntegerReductionsAreChecked) {
  HostTensor big = ints({2}, {std::numeric_limits<int64_t>::max(), 1});
  EXPECT_THROW(fold::reduce("ReduceSum", big, {0}, false), FoldError);
  EXPECT_THROW(fold::reduce("ReduceProd", ints({2}, {int64_t(1) << 40, int64_t(1) << 40}), {0},
                            false),
               FoldError);
  HostTensor shape = ints({3}, {2, 3, 4});
  EXPECT_EQ(fold::reduce("ReduceProd", shape, {0}, false).ints, (std::vector<int64_t>{24}));
  EXPECT_EQ(fold::reduce("ReduceMax", shape, {0}, true).shape, (std::vector<int64_t>{1}));
  EXPECT_THROW(fold::reduce("ReduceMean", shape, {0}, false), FoldError); // not folded on ints
  EXPECT_THROW(fold::reduce("ReduceSum", shape, {1}, false), FoldError);  // no axis 1
}
