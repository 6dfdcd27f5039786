// nn.attention and nn.attention_grad in the sequence-major layout
// (pk::AttentionLayout::SequenceMajor: q [L'..., S, H, D], k [L'..., T, H, D],
// v [L'..., T, H, Dv], y and the gradients likewise) against the head-major
// call on the same data transposed to [L'..., H, S|T, D]. The CPU kernels
// read the sequence-major rows in place (sgemm's leading dimensions), so each
// product sums the same terms in the same order: y, lse, dq, dk and dv must
// equal the head-major results bit for bit once transposed back. Masks, lse
// and dropout draws are logical ([L'..., H, S, T]) in both, so the same
// elements are masked and dropped.
#include "AttentionLayoutCase.h"
#include "TestUtil.h"

#include <cmath>
#include <cstring>
#include <string>

using namespace kt;

namespace {

using pk::testing::Layout;
using pk::testing::LayoutCase;
using pk::testing::swapMiddleAxes;
using pk::testing::repeatHeads;
using pk::testing::sumHeadGroups;

const LayoutCase kCases[] = {
    {{2}, 3, 5, 7, 4, 3, 1, {2, 1, 5, 7}, false},      // a mask per batch entry, broadcast over heads
    {{2}, 2, 70, 9, 4, 6, 2, {70, 9}, true},           // two blocks of query rows
    {{2}, 3, 6, 5, 3, 5, 3, {1, 3, 6, 5}, false},      // an additive mask per head
    {{}, 4, 5, 6, 2, 3, 0, {}, false},                 // no leading axes: q [S, H, D]
    {{2, 1}, 2, 4, 6, 5, 2, 1, {2, 1, 2, 4, 6}, true}, // two leading axes, a mask per slice
    {{3}, 1, 4, 5, 3, 2, 3, {3, 1, 4, 5}, false}};     // one head: nothing interleaves

/// A case's boolean mask (irregular, or causal shifted so that every row
/// keeps a key) or additive mask; null pointers where it has none.
struct Masks {
  std::vector<uint8_t> boolean;
  std::vector<float> additive;
  const uint8_t *booleanData() const { return boolean.empty() ? nullptr : boolean.data(); }
  const float *additiveData() const { return additive.empty() ? nullptr : additive.data(); }
};
Masks masksOf(const LayoutCase &c, uint32_t seed) {
  Masks m;
  const int64_t n = c.ms.numel(), T = c.ms.size ? c.ms.v[c.ms.size - 1] : 1;
  if (c.maskKind == 1) {
    m.boolean.resize(n);
    for (int64_t e = 0; e < n; ++e) m.boolean[e] = ((uint32_t)e * 2654435761u >> 9) % 3 == 0 && e % T != 0;
  } else if (c.maskKind == 2 || c.maskKind == 4) { // declared causal: CUDA's distinction, a boolean mask here
    m.boolean.resize(n);
    const int64_t S = c.ms.v[c.ms.size - 2];
    for (int64_t e = 0; e < n; ++e) m.boolean[e] = e % T > (e / T) % S;
  } else if (c.maskKind == 3) {
    m.additive = randomVec(n, seed, -3.0f, 1.0f);
  }
  return m;
}

/// Outputs with guard values on both sides, to show writes outside them.
struct Guarded {
  static constexpr int64_t kGuard = 64;
  static constexpr float kSentinel = 12345.0f;
  explicit Guarded(int64_t n) : all((size_t)(n + 2 * kGuard), kSentinel), size(n) {}
  float *data() { return all.data() + kGuard; }
  std::vector<float> values() const { return std::vector<float>(all.begin() + kGuard, all.end() - kGuard); }
  bool guardsIntact() const {
    for (int64_t i = 0; i < kGuard; ++i)
      if (all[i] != kSentinel || all[all.size() - 1 - i] != kSentinel) return false;
    return true;
  }
  std::vector<float> all;
  int64_t size;
};

/// Forward and backward of one case in one layout; the operands are given
/// in that layout.
struct Results {
  std::vector<float> y, lse, dq, dk, dv;
};
Results run(const LayoutCase &c, Layout layout, const std::vector<float> &q, const std::vector<float> &k,
            const std::vector<float> &v, const std::vector<float> &dy, const Masks &m, float ratio) {
  const pk::Shape qs = c.shape(layout, c.S, c.D), ks = c.shape(layout, c.T, c.D, c.kvHeads()),
                  vs = c.shape(layout, c.T, c.Dv, c.kvHeads());
  const uint64_t key = pk::dropoutStreamKey(7, 3, 2, pk::dropoutOpId("/attn/attn_dropout/Dropout"));
  const int64_t rows = c.outer() * c.H * c.S;
  Guarded y(rows * c.Dv), lse(rows), dq(q.size()), dk(k.size()), dv(v.size());
  pk::attention(q.data(), qs, k.data(), ks, v.data(), vs, m.booleanData(), m.additiveData(), c.ms, 0.7f, c.divide,
                -1e9f, true, ratio, true, key, y.data(), lse.data(), {}, layout);
  pk::attentionGrad(dy.data(), q.data(), qs, k.data(), ks, v.data(), vs, m.booleanData(), m.additiveData(), c.ms,
                    y.data(), lse.data(), 0.7f, c.divide, -1e9f, true, ratio, true, key, dq.data(), dk.data(),
                    dv.data(), {}, layout);
  for (const Guarded *g : {&y, &lse, &dq, &dk, &dv}) EXPECT_TRUE(g->guardsIntact()) << "wrote outside an output";
  return {y.values(), lse.values(), dq.values(), dk.values(), dv.values()};
}

void expectSameBits(const std::vector<float> &got, const std::vector<float> &want, const std::string &what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_EQ(0, std::memcmp(&got[i], &want[i], sizeof(float)))
        << what << " at " << i << ": " << got[i] << " vs " << want[i];
}

} // namespace

// Every case, without and with a dropout of P, at 1 and 3 threads.
TEST(AttentionLayout, SequenceMajorEqualsHeadMajorOnTransposedOperands) {
  uint32_t seed = 500;
  const int threadsBefore = pk::threads();
  for (const LayoutCase &c : kCases)
    for (float ratio : {0.0f, 0.3f})
      for (int threads : {1, 3}) {
        pk::setThreads(threads);
        const std::string what = c.str() + (ratio > 0 ? ", dropout" : "") + ", " + std::to_string(threads) + " threads";
        const int64_t L = c.outer();
        // Sequence-major operands and dy, and the same data head-major.
        const auto q = randomVec(L * c.S * c.H * c.D, seed++), k = randomVec(L * c.T * c.H * c.D, seed++),
                   v = randomVec(L * c.T * c.H * c.Dv, seed++), dy = randomVec(L * c.S * c.H * c.Dv, seed++);
        const Masks m = masksOf(c, seed++);
        const Results seq = run(c, Layout::SequenceMajor, q, k, v, dy, m, ratio);
        const Results head = run(c, Layout::HeadMajor, swapMiddleAxes(q, L, c.S, c.H, c.D),
                                 swapMiddleAxes(k, L, c.T, c.H, c.D), swapMiddleAxes(v, L, c.T, c.H, c.Dv),
                                 swapMiddleAxes(dy, L, c.S, c.H, c.Dv), m, ratio);
        expectSameBits(swapMiddleAxes(seq.y, L, c.S, c.H, c.Dv), head.y, "y " + what);
        expectSameBits(seq.lse, head.lse, "lse " + what); // logical [L'..., H, S] in both
        expectSameBits(swapMiddleAxes(seq.dq, L, c.S, c.H, c.D), head.dq, "dq " + what);
        expectSameBits(swapMiddleAxes(seq.dk, L, c.T, c.H, c.D), head.dk, "dk " + what);
        expectSameBits(swapMiddleAxes(seq.dv, L, c.T, c.H, c.Dv), head.dv, "dv " + what);
      }
  pk::setThreads(threadsBefore);
}

// Empty query rows (dk, dv are sums of nothing: zeros, written only inside
// their interleaved rows) and empty key rows (y zero).
TEST(AttentionLayout, SequenceMajorEmptyRows) {
  const LayoutCase noQueries{{2}, 3, 0, 4, 2, 3, 0, {}, false}, noKeys{{2}, 3, 4, 0, 2, 3, 0, {}, false};
  for (const LayoutCase &c : {noQueries, noKeys}) {
    const int64_t L = c.outer();
    const auto q = randomVec(L * c.S * c.H * c.D, 1), k = randomVec(L * c.T * c.H * c.D, 2),
               v = randomVec(L * c.T * c.H * c.Dv, 3), dy = randomVec(L * c.S * c.H * c.Dv, 4);
    const Results seq = run(c, Layout::SequenceMajor, q, k, v, dy, {}, 0.0f);
    for (const auto *out : {&seq.y, &seq.dk, &seq.dv})
      for (float x : *out) ASSERT_EQ(x, 0.0f) << c.str();
  }
}

// Shapes that are not sequence-major attention operands are refused, naming
// the op and the layout; the mask broadcasts to the logical scores
// [L'..., H, S, T], not to the operands' [L'..., S, H, T].
TEST(AttentionLayout, SequenceMajorShapeErrors) {
  auto message = [](const pk::Shape &qs, const pk::Shape &ks, const pk::Shape &vs, const pk::Shape &ms,
                    bool grad) -> std::string {
    std::vector<float> buf(4096), out(4096);
    std::vector<uint8_t> mask(ms.numel(), 0);
    const uint8_t *m = ms.size ? mask.data() : nullptr;
    try {
      if (grad)
        pk::attentionGrad(buf.data(), buf.data(), qs, buf.data(), ks, buf.data(), vs, m, nullptr, ms, buf.data(),
                          buf.data(), 1.0f, false, -1e9f, true, 0.0f, false, 0, out.data(), out.data(), out.data(), {},
                          Layout::SequenceMajor);
      else
        pk::attention(buf.data(), qs, buf.data(), ks, buf.data(), vs, m, nullptr, ms, 1.0f, false, -1e9f, true, 0.0f,
                      false, 0, out.data(), out.data(), {}, Layout::SequenceMajor);
    } catch (const pk::KernelError &e) {
      return e.what();
    }
    return "no error";
  };
  const std::string disagree = "are not [L..., S, H, D], [L..., T, H, D], [L..., T, H, Dv] (sequence-major)";
  // H disagrees between q and k, then between k and v.
  const std::string heads = message({2, 5, 3, 4}, {2, 6, 2, 4}, {2, 6, 2, 3}, {}, false);
  EXPECT_NE(heads.find("nn.attention: query [2,5,3,4], key [2,6,2,4] and value [2,6,2,3] " + disagree),
            std::string::npos)
      << heads;
  const std::string valueHeads = message({2, 5, 3, 4}, {2, 6, 3, 4}, {2, 6, 2, 3}, {}, true);
  EXPECT_NE(valueHeads.find("nn.attention_grad: query"), std::string::npos) << valueHeads;
  EXPECT_NE(valueHeads.find(disagree), std::string::npos) << valueHeads;
  // Leading axes disagree; k and v disagree on T.
  EXPECT_NE(message({2, 5, 3, 4}, {3, 6, 3, 4}, {3, 6, 3, 3}, {}, false).find(disagree), std::string::npos);
  EXPECT_NE(message({2, 5, 3, 4}, {2, 6, 3, 4}, {2, 7, 3, 3}, {}, false).find(disagree), std::string::npos);
  // Rank 2 has no heads axis.
  EXPECT_NE(message({5, 4}, {6, 4}, {6, 3}, {}, false).find("the sequence-major query [5,4] needs rank in [3,"),
            std::string::npos);
  // A mask over the operands' axes [S, H, T] (S = 5, H = 3) is not one over the scores.
  EXPECT_NE(message({2, 5, 3, 4}, {2, 6, 3, 4}, {2, 6, 3, 3}, {5, 3, 6}, false)
                .find("mask of shape [5,3,6] does not broadcast to the scores [2,3,5,6]"),
            std::string::npos);
}

// The scratch is the head-major call's: the kernels copy nothing.
TEST(AttentionLayout, SequenceMajorScratchIsTheHeadMajorScratch) {
  for (const LayoutCase &c : kCases)
    for (pk::ScratchTarget target : {pk::ScratchTarget::Cpu, pk::ScratchTarget::Cuda}) {
      const auto sm = Layout::SequenceMajor, hm = Layout::HeadMajor;
      const pk::ScratchNeed seq = pk::attentionScratch(target, c.shape(sm, c.S, c.D), c.shape(sm, c.T, c.D),
                                                       c.shape(sm, c.T, c.Dv), sm),
                            head = pk::attentionScratch(target, c.shape(hm, c.S, c.D), c.shape(hm, c.T, c.D),
                                                        c.shape(hm, c.T, c.Dv));
      const pk::ScratchNeed seqGrad = pk::attentionGradScratch(target, c.shape(sm, c.S, c.D), c.shape(sm, c.T, c.D),
                                                               c.shape(sm, c.T, c.Dv), sm),
                            headGrad = pk::attentionGradScratch(target, c.shape(hm, c.S, c.D),
                                                                c.shape(hm, c.T, c.D), c.shape(hm, c.T, c.Dv));
      EXPECT_EQ(seq.shared, head.shared) << c.str();
      EXPECT_EQ(seq.perThread, head.perThread) << c.str();
      EXPECT_EQ(seqGrad.shared, headGrad.shared) << c.str();
      EXPECT_EQ(seqGrad.perThread, headGrad.perThread) << c.str();
    }
}

// Grouped-query heads (key and value with Hkv heads, the query with H = g·Hkv)
// against the same call on key and value with each head repeated g times:
// y, lse and dq bit for bit (each query head's products read the same
// rows), dk and dv the repeated call's summed over each group (to rounding:
// the grouped call sums the group's heads into one accumulator). Both
// layouts, without and with dropout, at 1 and 3 threads.
TEST(AttentionLayout, GroupedHeadsEqualRepeatedHeads) {
  const LayoutCase grouped[] = {
      {{2}, 6, 5, 7, 4, 3, 1, {2, 1, 5, 7}, false, 2},   // 3 query heads per key/value head
      {{2}, 4, 70, 9, 4, 6, 2, {70, 9}, true, 1},         // one key/value head, two blocks of rows
      {{2}, 6, 6, 5, 3, 5, 3, {1, 6, 6, 5}, false, 3},    // an additive mask per query head
      {{}, 4, 5, 6, 2, 3, 0, {}, false, 2},               // no leading axes
      {{2, 1}, 4, 4, 6, 5, 2, 1, {2, 1, 4, 4, 6}, true, 2}, // two leading axes, a mask per slice
      {{2}, 6, 70, 9, 4, 3, 2, {70, 9}, false, 3},          // 2 query heads per key/value head, two blocks
      {{2}, 4, 0, 5, 3, 2, 0, {}, false, 2}};                // no query rows: dk and dv sums of nothing
  uint32_t seed = 900;
  const int threadsBefore = pk::threads();
  for (const LayoutCase &c : grouped)
    for (Layout layout : {Layout::HeadMajor, Layout::SequenceMajor})
      for (float ratio : {0.0f, 0.3f})
        for (int threads : {1, 3}) {
          pk::setThreads(threads);
          const std::string what = c.str() + (layout == Layout::SequenceMajor ? ", sequence-major" : "") +
                                   (ratio > 0 ? ", dropout" : "") + ", " + std::to_string(threads) + " threads";
          const int64_t L = c.outer(), Hkv = c.kvHeads(), g = c.H / Hkv;
          const auto q = randomVec(L * c.S * c.H * c.D, seed++), k = randomVec(L * c.T * Hkv * c.D, seed++),
                     v = randomVec(L * c.T * Hkv * c.Dv, seed++), dy = randomVec(L * c.S * c.H * c.Dv, seed++);
          const Masks m = masksOf(c, seed++);
          const Results got = run(c, layout, q, k, v, dy, m, ratio);
          const Results want = run(c.repeated(), layout, q, repeatHeads(k, layout, L, Hkv, c.T, c.D, g),
                                   repeatHeads(v, layout, L, Hkv, c.T, c.Dv, g), dy, m, ratio);
          expectSameBits(got.y, want.y, "y " + what);
          expectSameBits(got.lse, want.lse, "lse " + what);
          expectSameBits(got.dq, want.dq, "dq " + what);
          const auto dk = sumHeadGroups(want.dk, layout, L, Hkv, c.T, c.D, g),
                     dv = sumHeadGroups(want.dv, layout, L, Hkv, c.T, c.Dv, g);
          ASSERT_EQ(got.dk.size(), dk.size()) << what;
          for (size_t i = 0; i < dk.size(); ++i)
            ASSERT_NEAR(got.dk[i], dk[i], 1e-5 * (1 + std::fabs(dk[i]))) << "dk " << what << " at " << i;
          ASSERT_EQ(got.dv.size(), dv.size()) << what;
          for (size_t i = 0; i < dv.size(); ++i)
            ASSERT_NEAR(got.dv[i], dv[i], 1e-5 * (1 + std::fabs(dv[i]))) << "dv " << what << " at " << i;
        }
  pk::setThreads(threadsBefore);
}

// Key and value heads that do not divide the query's, or differ from each
// other, are refused in either layout.
TEST(AttentionLayout, GroupedHeadsShapeErrors) {
  std::vector<float> buf(4096), out(4096);
  auto refused = [&](const pk::Shape &qs, const pk::Shape &ks, const pk::Shape &vs, Layout layout) {
    try {
      pk::attention(buf.data(), qs, buf.data(), ks, buf.data(), vs, nullptr, nullptr, {}, 1.0f, false, -1e9f, true,
                    0.0f, false, 0, out.data(), out.data(), {}, layout);
    } catch (const pk::KernelError &e) {
      return std::string(e.what()).find("may have a divisor of the query's heads") != std::string::npos;
    }
    return false;
  };
  EXPECT_TRUE(refused({2, 6, 5, 4}, {2, 4, 7, 4}, {2, 4, 7, 3}, Layout::HeadMajor));      // 4 does not divide 6
  EXPECT_TRUE(refused({2, 6, 5, 4}, {2, 3, 7, 4}, {2, 2, 7, 3}, Layout::HeadMajor));      // k and v differ
  EXPECT_TRUE(refused({2, 5, 6, 4}, {2, 7, 4, 4}, {2, 7, 4, 3}, Layout::SequenceMajor));  // 4 does not divide 6
  EXPECT_TRUE(refused({6, 5, 4}, {6, 7, 4}, {3, 7, 3}, Layout::HeadMajor));               // rank 3: v's heads
  EXPECT_TRUE(refused({2, 6, 5, 4}, {2, 0, 7, 4}, {2, 0, 7, 3}, Layout::HeadMajor));      // no key heads
}

// Joint q/k/v: windows of one [L'..., S, H + 2·Hkv, D] value, their rows
// (H + 2·Hkv)·D apart (jointHeads, nn.attention's joint_kv_heads), against
// the same call on the windows as tensors of their own: y, lse and the
// joint gradient's windows bit for bit (the same products at other leading
// dimensions), nothing written outside the joint gradient. A joint row too
// narrow for the windows is refused.
TEST(AttentionLayout, JointWindowsEqualSeparateOperands) {
  uint32_t seed = 1300;
  const auto sm = Layout::SequenceMajor;
  for (const LayoutCase &c : pk::testing::kJointCases)
    for (float ratio : {0.0f, 0.3f}) {
      const std::string what = c.str() + (ratio > 0 ? ", dropout" : "");
      const int64_t L = c.outer(), Hkv = c.kvHeads(), N = c.H + 2 * Hkv, rows = L * c.S;
      const auto q = randomVec(rows * c.H * c.D, seed++), k = randomVec(rows * Hkv * c.D, seed++),
                 v = randomVec(rows * Hkv * c.D, seed++), dy = randomVec(rows * c.H * c.D, seed++);
      const Masks m = masksOf(c, seed++);
      const Results want = run(c, sm, q, k, v, dy, m, ratio);
      const std::vector<float> joint = pk::testing::jointOf(q, k, v, L, c.S, c.H, Hkv, c.D);
      const pk::Shape qs = c.shape(sm, c.S, c.D), ks = c.shape(sm, c.T, c.D, Hkv);
      const uint64_t key = pk::dropoutStreamKey(7, 3, 2, pk::dropoutOpId("/attn/attn_dropout/Dropout"));
      const float *J = joint.data();
      const int64_t kOffset = c.H * c.D, vOffset = (c.H + Hkv) * c.D;
      Guarded y(rows * c.H * c.D), lse(rows * c.H), dJoint((int64_t)joint.size());
      pk::attention(J, qs, J + kOffset, ks, J + vOffset, ks, m.booleanData(), m.additiveData(), c.ms, 0.7f, c.divide,
                    -1e9f, true, ratio, true, key, y.data(), lse.data(), {}, sm, N);
      float *dJ = dJoint.data();
      pk::attentionGrad(dy.data(), J, qs, J + kOffset, ks, J + vOffset, ks, m.booleanData(), m.additiveData(), c.ms,
                        y.data(), lse.data(), 0.7f, c.divide, -1e9f, true, ratio, true, key, dJ, dJ + kOffset,
                        dJ + vOffset, {}, sm, N);
      for (const Guarded *g : {&y, &lse, &dJoint}) EXPECT_TRUE(g->guardsIntact()) << "wrote outside an output " << what;
      expectSameBits(y.values(), want.y, "y " + what);
      expectSameBits(lse.values(), want.lse, "lse " + what);
      const std::vector<float> grad = dJoint.values();
      expectSameBits(pk::testing::jointWindow(grad, rows, N, c.D, 0, c.H), want.dq, "dq " + what);
      expectSameBits(pk::testing::jointWindow(grad, rows, N, c.D, c.H, Hkv), want.dk, "dk " + what);
      expectSameBits(pk::testing::jointWindow(grad, rows, N, c.D, c.H + Hkv, Hkv), want.dv, "dv " + what);
      try {
        pk::attention(J, qs, J + kOffset, ks, J + vOffset, ks, nullptr, nullptr, {}, 0.7f, false, -1e9f, true, 0.0f,
                      false, key, y.data(), lse.data(), {}, sm, N - 1);
        ADD_FAILURE() << "a joint row of " << N - 1 << " heads was taken for " << what;
      } catch (const pk::KernelError &e) {
        EXPECT_NE(std::string(e.what()).find("nn.attention: a joint query"), std::string::npos) << e.what();
      }
    }
}
