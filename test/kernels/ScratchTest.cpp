// Kernel scratch planned at compile time (pipec/kernel_scratch.h,
// docs/optimization.md "Kernel scratch"): every kernel that takes scratch,
// given a Workspace of exactly the bytes its query says (filled with NaN,
// with guard bytes after the shared part and after each thread's part),
// gives the bits it gives with its own growable buffers, at 1 and 3 threads,
// and writes nothing outside what it was given. A Workspace one byte short
// is refused.
#include "TestUtil.h"

#include <cstring>
#include <new>

using namespace kt;

namespace {

constexpr int64_t kGuard = 256;
constexpr unsigned char kPattern = 0xff; // NaN as float and double

/// 64-byte aligned bytes filled with kPattern.
struct Bytes {
  explicit Bytes(int64_t n)
      : size(n),
        data(static_cast<unsigned char *>(::operator new((size_t)std::max<int64_t>(n, 1), std::align_val_t(64)))) {
    std::memset(data, kPattern, (size_t)size);
  }
  ~Bytes() { ::operator delete(data, std::align_val_t(64)); }
  Bytes(const Bytes &) = delete;
  Bytes &operator=(const Bytes &) = delete;
  bool untouched(int64_t from, int64_t count) const {
    for (int64_t i = from; i < from + count; ++i)
      if (data[i] != kPattern) return false;
    return true;
  }
  int64_t size;
  unsigned char *data;
};

/// run(workspace) calls the kernel and returns its outputs' bits.
using Run = std::function<std::vector<float>(const pk::Workspace &)>;

void expectPlannedScratchSuffices(const char *what, const pk::ScratchNeed &need, const Run &run) {
  const int before = pk::threads();
  for (int threads : {1, 3}) {
    pk::setThreads(threads);
    SCOPED_TRACE(std::string(what) + " at " + std::to_string(threads) + " threads");
    const std::vector<float> reference = run(pk::Workspace{});
    // The threads' parts lie need.perThread apart, as in a stage's arena;
    // the guard follows the last one.
    Bytes shared(need.shared + kGuard), perThread(threads * need.perThread + kGuard);
    const pk::Workspace ws{shared.data, need.shared, perThread.data, need.perThread, threads};
    const std::vector<float> got = run(ws);
    ASSERT_EQ(got.size(), reference.size());
    EXPECT_EQ(0, std::memcmp(got.data(), reference.data(), got.size() * sizeof(float)))
        << "the bits differ from the kernel's own buffers";
    EXPECT_TRUE(shared.untouched(need.shared, kGuard)) << "wrote past the shared scratch";
    EXPECT_TRUE(perThread.untouched(threads * need.perThread, kGuard)) << "wrote past the per-thread scratch";
    if (need.shared > 0) {
      pk::Workspace shortShared = ws;
      shortShared.sharedBytes = need.shared - 1;
      EXPECT_THROW(run(shortShared), pk::KernelError);
    }
    if (need.perThread > 0) {
      pk::Workspace fewThreads = ws;
      fewThreads.threads = threads - 1;
      EXPECT_THROW(run(fewThreads), pk::KernelError);
    }
  }
  pk::setThreads(before);
}

struct ConvCase {
  const char *name;
  pk::Shape xs, ws;
  pk::Dims strides, pads, dilations;
  int64_t group;
};

} // namespace

// Winograd (3x3, 16+ channels), im2col with groups and strides (col2im input
// gradient, weight-gradient slices), a flipped-convolution input gradient,
// dilation, and a pointwise convolution (no scratch).
TEST(Scratch, ConvolutionsFitTheirPlannedScratch) {
  const ConvCase cases[] = {
      {"winograd", {2, 16, 8, 8}, {16, 16, 3, 3}, {1, 1}, {1, 1, 1, 1}, {1, 1}, 1},
      {"wide winograd", {3, 32, 10, 12}, {24, 32, 3, 3}, {1, 1}, {0, 1, 0, 1}, {1, 1}, 1},
      {"grouped strided", {3, 4, 9, 9}, {6, 2, 3, 3}, {2, 2}, {1, 1, 1, 1}, {1, 1}, 2},
      {"flipped input gradient", {6, 4, 7, 7}, {6, 4, 3, 3}, {1, 1}, {1, 1, 1, 1}, {1, 1}, 1},
      {"dilated 1-d", {5, 3, 20}, {4, 3, 3}, {1}, {2, 2}, {2}, 1},
      {"pointwise", {2, 8, 5, 5}, {4, 8, 1, 1}, {1, 1}, {0, 0, 0, 0}, {1, 1}, 1},
  };
  int seed = 1;
  for (const ConvCase &c : cases) {
    const pk::Shape ys = pk::convOutputShape(c.xs, c.ws, c.strides, c.pads, c.dilations);
    const auto x = randomVec(c.xs.numel(), seed++), w = randomVec(c.ws.numel(), seed++),
               dy = randomVec(ys.numel(), seed++);
    const auto bias = randomVec(c.ws.v[0], seed++);
    const auto cpu = pk::ScratchTarget::Cpu;
    expectPlannedScratchSuffices(c.name, pk::convScratch(cpu, c.xs, c.ws, c.strides, c.pads, c.dilations, c.group),
                                 [&](const pk::Workspace &s) {
                                   std::vector<float> y(ys.numel());
                                   pk::conv(x.data(), c.xs, w.data(), c.ws, bias.data(), y.data(), c.strides,
                                            c.pads, c.dilations, c.group, s);
                                   return y;
                                 });
    expectPlannedScratchSuffices(
        c.name, pk::convInputGradScratch(cpu, c.xs, c.ws, c.strides, c.pads, c.dilations, c.group),
        [&](const pk::Workspace &s) {
          std::vector<float> dx(c.xs.numel());
          pk::convInputGrad(dy.data(), ys, w.data(), c.ws, dx.data(), c.xs, c.strides, c.pads, c.dilations,
                            c.group, s);
          return dx;
        });
    expectPlannedScratchSuffices(
        c.name, pk::convWeightGradScratch(cpu, c.xs, c.ws, c.strides, c.pads, c.dilations, c.group),
        [&](const pk::Workspace &s) {
          std::vector<float> dw(c.ws.numel());
          pk::convWeightGrad(dy.data(), ys, x.data(), c.xs, dw.data(), c.ws, c.strides, c.pads, c.dilations,
                             c.group, s);
          return dw;
        });
    const auto held = randomVec(c.ws.numel(), seed++); // what a gradient buffer holds
    expectPlannedScratchSuffices(
        (std::string(c.name) + ", accumulated").c_str(),
        pk::convWeightGradScratch(cpu, c.xs, c.ws, c.strides, c.pads, c.dilations, c.group, /*accumulate=*/true),
        [&](const pk::Workspace &s) {
          std::vector<float> dw = held;
          pk::convWeightGrad(dy.data(), ys, x.data(), c.xs, dw.data(), c.ws, c.strides, c.pads, c.dilations,
                             c.group, s, true);
          return dw;
        });
  }
  EXPECT_TRUE(pk::convScratch(pk::ScratchTarget::Cpu, {2, 8, 5, 5}, {4, 8, 1, 1}, {1, 1}, {0, 0, 0, 0}, {1, 1}, 1)
                  .empty());
}

// Attention with one block of score rows and with two, a mask or none.
TEST(Scratch, AttentionFitsItsPlannedScratch) {
  const auto cpu = pk::ScratchTarget::Cpu;
  for (const pk::Shape &qs : {pk::Shape{2, 3, 5, 4}, pk::Shape{2, 70, 4}}) {
    const int r = qs.size;
    pk::Shape ks = qs, vs = qs, scores = qs;
    ks.v[r - 2] = vs.v[r - 2] = scores.v[r - 1] = 9;
    vs.v[r - 1] = 3;
    const std::string what = qs.str();
    const auto q = randomVec(qs.numel(), 1), k = randomVec(ks.numel(), 2), v = randomVec(vs.numel(), 3);
    const int64_t rows = qs.numel() / qs.v[r - 1];
    const auto dy = randomVec(rows * 3, 4);
    std::vector<uint8_t> mask(scores.numel());
    for (size_t e = 0; e < mask.size(); ++e) mask[e] = e % 9 > 6;
    std::vector<float> y(rows * 3), lse(rows);
    pk::attention(q.data(), qs, k.data(), ks, v.data(), vs, mask.data(), nullptr, scores, 0.5f, false, -1e9f, true, 0.0f, false, 0, y.data(),
                  lse.data());
    expectPlannedScratchSuffices(what.c_str(), pk::attentionScratch(cpu, qs, ks, vs), [&](const pk::Workspace &s) {
      std::vector<float> out(rows * 4);
      pk::attention(q.data(), qs, k.data(), ks, v.data(), vs, mask.data(), nullptr, scores, 0.5f, false, -1e9f, true, 0.0f, false, 0,
                    out.data(), out.data() + rows * 3, s);
      return out;
    });
    expectPlannedScratchSuffices(what.c_str(), pk::attentionGradScratch(cpu, qs, ks, vs), [&](const pk::Workspace &s) {
      std::vector<float> d(q.size() + k.size() + v.size());
      pk::attentionGrad(dy.data(), q.data(), qs, k.data(), ks, v.data(), vs, nullptr, nullptr, pk::Shape{}, y.data(),
                        lse.data(), 0.5f, false, -1e9f, true, 0.0f, false, 0, d.data(), d.data() + q.size(),
                        d.data() + q.size() + k.size(), s);
      return d;
    });
  }
}

// Sequence-major attention ([L', S, H, D]: its rows interleave across the
// heads) in two blocks of score rows, with a mask: the same guarantees.
TEST(Scratch, SequenceMajorAttentionFitsItsPlannedScratch) {
  const auto cpu = pk::ScratchTarget::Cpu;
  const auto layout = pk::AttentionLayout::SequenceMajor;
  const pk::Shape qs{2, 70, 3, 4}, ks{2, 9, 3, 4}, vs{2, 9, 3, 5}, scores{2, 3, 70, 9};
  const auto q = randomVec(qs.numel(), 1), k = randomVec(ks.numel(), 2), v = randomVec(vs.numel(), 3);
  const int64_t rows = 2 * 70 * 3;
  const auto dy = randomVec(rows * 5, 4);
  std::vector<uint8_t> mask(scores.numel());
  for (size_t e = 0; e < mask.size(); ++e) mask[e] = e % 9 > 6;
  std::vector<float> y(rows * 5), lse(rows);
  pk::attention(q.data(), qs, k.data(), ks, v.data(), vs, mask.data(), nullptr, scores, 0.5f, false, -1e9f, true, 0.0f,
                false, 0, y.data(), lse.data(), {}, layout);
  expectPlannedScratchSuffices("sequence-major", pk::attentionScratch(cpu, qs, ks, vs, layout),
                               [&](const pk::Workspace &s) {
                                 std::vector<float> out(rows * 6);
                                 pk::attention(q.data(), qs, k.data(), ks, v.data(), vs, mask.data(), nullptr, scores,
                                               0.5f, false, -1e9f, true, 0.0f, false, 0, out.data(),
                                               out.data() + rows * 5, s, layout);
                                 return out;
                               });
  expectPlannedScratchSuffices("sequence-major", pk::attentionGradScratch(cpu, qs, ks, vs, layout),
                               [&](const pk::Workspace &s) {
                                 std::vector<float> d(q.size() + k.size() + v.size());
                                 pk::attentionGrad(dy.data(), q.data(), qs, k.data(), ks, v.data(), vs, mask.data(),
                                                   nullptr, scores, y.data(), lse.data(), 0.5f, false, -1e9f, true,
                                                   0.0f, false, 0, d.data(), d.data() + q.size(),
                                                   d.data() + q.size() + k.size(), s, layout);
                                 return d;
                               });
}

// Broadcast and full parameters; rows x inner large enough that the
// parameter gradient splits its sums over threads (the rows' statistics).
TEST(Scratch, LayerNormsFitTheirPlannedScratch) {
  const auto cpu = pk::ScratchTarget::Cpu;
  for (const pk::RowNorm norm : {pk::RowNorm::Layer, pk::RowNorm::Rms})
  for (const pk::Shape &xs : {pk::Shape{3, 4, 8}, pk::Shape{64, 4, 128}})
    for (const pk::Shape &ps : {pk::Shape{xs.v[1], xs.v[2]}, pk::Shape{1, xs.v[2]}}) {
      const std::string what =
          xs.str() + " params " + ps.str() + (norm == pk::RowNorm::Rms ? " (RMS)" : "");
      const auto x = randomVec(xs.numel(), 1), dy = randomVec(xs.numel(), 2), g = randomVec(ps.numel(), 3),
                 b = randomVec(ps.numel(), 4);
      const int64_t rows = xs.v[0];
      expectPlannedScratchSuffices(what.c_str(), pk::layerNormScratch(cpu, xs, ps, &ps, 1),
                                   [&](const pk::Workspace &s) {
                                     std::vector<float> y(xs.numel() + 2 * rows);
                                     pk::layerNorm(x.data(), xs, g.data(), ps, b.data(), ps, y.data(),
                                                   y.data() + xs.numel(), y.data() + xs.numel() + rows, 1, 1e-5f, norm, s);
                                     return y;
                                   });
      expectPlannedScratchSuffices(what.c_str(), pk::layerNormGradScratch(cpu, xs, ps, 1),
                                   [&](const pk::Workspace &s) {
                                     std::vector<float> dx(xs.numel());
                                     pk::layerNormGrad(dy.data(), x.data(), xs, g.data(), ps, dx.data(), 1, 1e-5f, norm, s);
                                     return dx;
                                   });
      expectPlannedScratchSuffices(what.c_str(), pk::layerNormParamGradScratch(cpu, xs, ps, 1, true),
                                   [&](const pk::Workspace &s) {
                                     std::vector<float> d(2 * ps.numel());
                                     pk::layerNormParamGrad(dy.data(), x.data(), xs, ps, d.data(),
                                                            d.data() + ps.numel(), 1, 1e-5f, norm, s);
                                     return d;
                                   });
      // Added into gradient buffers: the sums in scratch, then added.
      expectPlannedScratchSuffices((what + ", accumulated").c_str(),
                                   pk::layerNormParamGradScratch(cpu, xs, ps, 1, true, /*accumulate=*/true),
                                   [&](const pk::Workspace &s) {
                                     std::vector<float> d(2 * ps.numel(), 0.25f);
                                     pk::layerNormParamGrad(dy.data(), x.data(), xs, ps, d.data(),
                                                            d.data() + ps.numel(), 1, 1e-5f, norm, s, true);
                                     return d;
                                   });
    }
}

TEST(Scratch, PoolsFitTheirPlannedScratch) {
  const auto cpu = pk::ScratchTarget::Cpu;
  const pk::Shape xs{2, 3, 9, 7};
  const pk::Dims kernel{3, 2}, strides{2, 2}, pads{1, 0, 1, 1}, dilations{1, 1};
  const pk::Shape ys = pk::poolOutputShape(xs, kernel, strides, pads, dilations, true);
  const auto x = randomVec(xs.numel(), 5), dy = randomVec(ys.numel(), 6);
  expectPlannedScratchSuffices("max", pk::poolScratch(cpu, xs, kernel, strides, pads, dilations, true, false),
                               [&](const pk::Workspace &s) {
                                 std::vector<float> y(ys.numel());
                                 pk::maxPool(x.data(), xs, y.data(), kernel, strides, pads, dilations, true, s);
                                 return y;
                               });
  expectPlannedScratchSuffices("max grad", pk::poolScratch(cpu, xs, kernel, strides, pads, dilations, true, true),
                               [&](const pk::Workspace &s) {
                                 std::vector<float> dx(xs.numel());
                                 pk::maxPoolGrad(dy.data(), x.data(), xs, dx.data(), kernel, strides, pads, dilations,
                                                 true, s);
                                 return dx;
                               });
  expectPlannedScratchSuffices("average", pk::poolScratch(cpu, xs, kernel, strides, pads, {}, true, false),
                               [&](const pk::Workspace &s) {
                                 std::vector<float> y(ys.numel());
                                 pk::averagePool(x.data(), xs, y.data(), kernel, strides, pads, true, true, s);
                                 return y;
                               });
  expectPlannedScratchSuffices("average grad", pk::poolScratch(cpu, xs, kernel, strides, pads, {}, true, false),
                               [&](const pk::Workspace &s) {
                                 std::vector<float> dx(xs.numel());
                                 pk::averagePoolGrad(dy.data(), dx.data(), xs, kernel, strides, pads, true, false, s);
                                 return dx;
                               });
}

TEST(Scratch, LossAndReductionsFitTheirPlannedScratch) {
  const auto cpu = pk::ScratchTarget::Cpu;
  const pk::Shape ss{16, 10, 3};
  const auto scores = randomVec(ss.numel(), 7);
  std::vector<int64_t> labels(16 * 3);
  for (size_t i = 0; i < labels.size(); ++i) labels[i] = (int64_t)(i * 7 % 10);
  for (pk::Reduction reduction : {pk::Reduction::Mean, pk::Reduction::None}) {
    const int64_t lossSize = reduction == pk::Reduction::None ? 48 : 1;
    expectPlannedScratchSuffices("loss", pk::softmaxCrossEntropyScratch(cpu, ss, reduction, false),
                                 [&](const pk::Workspace &s) {
                                   std::vector<float> out(lossSize + ss.numel());
                                   pk::softmaxCrossEntropyLoss<int64_t>(scores.data(), ss, labels.data(), nullptr,
                                                                        reduction, 3, out.data(),
                                                                        out.data() + lossSize, s);
                                   return out;
                                 });
    const auto dloss = randomVec(lossSize, 8);
    expectPlannedScratchSuffices("loss grad", pk::softmaxCrossEntropyScratch(cpu, ss, reduction, true),
                                 [&](const pk::Workspace &s) {
                                   std::vector<float> d(ss.numel());
                                   pk::softmaxCrossEntropyLossGrad<int64_t>(dloss.data(), scores.data(), ss,
                                                                            labels.data(), nullptr, reduction, 3,
                                                                            d.data(), s);
                                   return d;
                                 });
  }
  const pk::Shape xs{40, 30, 50};
  const auto x = randomVec(xs.numel(), 9);
  for (const pk::Dims &axes : {pk::Dims{1}, pk::Dims{0, 2}, pk::Dims{}})
    for (bool mean : {true, false}) { // no axes: reduce_mean reduces all, reduce_sum none
      const pk::Shape kept = pk::reducedShape("test", xs, axes, mean);
      expectPlannedScratchSuffices(mean ? "mean" : "sum", pk::reduceScratch(cpu, xs, axes, mean),
                                   [&](const pk::Workspace &s) {
                                     std::vector<float> y(kept.numel());
                                     if (mean)
                                       pk::reduceMean(x.data(), xs, axes, y.data(), s);
                                     else
                                       pk::reduceSum(x.data(), xs, axes, y.data(), s);
                                     return y;
                                   });
    }
}
