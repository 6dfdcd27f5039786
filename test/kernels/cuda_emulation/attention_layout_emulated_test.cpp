// cuda-attention-layout-emulated: nn.attention and nn.attention_grad of
// pipec's CUDA library in the sequence-major layout
// (pk::AttentionLayout::SequenceMajor: q [L'..., S, H, D], k [L'..., T, H, D],
// v [L'..., T, H, Dv], y and the gradients likewise) under the host emulation
// of cuda_kernels_emulated_test.cpp (emu.h, the fake cuBLAS and
// cudnn_frontend in inc/). Each path runs the sequence-major call on the
// operands as they are and the head-major call on the same data transposed
// to [L'..., H, S|T, D]:
//   float      pipec's kernels on float storage (also against the CPU kernels
//              in the same layout);
//   bf16       pipec's kernels on bf16 storage (PIPEC_CUDNN_ATTENTION=0);
//   flash      cuDNN's flash attention on bf16 storage (the fake frontend),
//              including a mask declared causal;
// each with the default block of score rows and with blocks of 64 rows (the
// pipec paths), without and with a dropout of P, over masks none, boolean,
// causal and additive, S != T, D != Dv, H >= 2, leading axes of 0 to 2.
// y, lse, dq, dk and dv must equal bit for bit once transposed back: the
// fake cuBLAS sums every product in one fixed order whatever its batch and
// leading dimensions, and the fake cuDNN reads every tensor through its
// strides in one fixed loop order, so only a wrong address can change a bit
// (on a GPU, cuBLAS may pick other kernels for other batch counts and
// strides: the layouts would agree to rounding there, not bitwise). Masks,
// lse and the dropout draws are logical in both layouts. Outputs carry guard
// values on both sides; the sequence-major call must launch no kernel the
// head-major call does not (no transposing copies). Then malformed
// sequence-major shapes must be refused with the layout named.
//
// Grouped-query heads (key and value with fewer heads) run every path
// against the same path on repeated heads (testGrouped); q, k and v read in
// place from one joint projection against the same path on them as
// tensors of their own (testJoint).
//
// usage: cuda_attention_layout_emulated_test [group]   (float, bf16, flash, grouped, joint, errors)
#include "AttentionLayoutCase.h"
#include "pipec/cuda_kernels.h"
#include "pipec/cpu_kernels.h"
#include "kernel_plan.h" // plan::cudaAttentionBlockBytes
#include "cuda_runtime.h"
#include "emu.h"
#include "emulated_checks.h"
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

namespace pk = pipec::kernels;
namespace pc = pipec::kernels::cuda;
using pk::Shape;
using bf = pc::bf16;
using pk::testing::Layout;
using pk::testing::LayoutCase;
using pk::testing::swapMiddleAxes;
using pk::testing::repeatHeads;
using pk::testing::sumHeadGroups;

static std::mt19937_64 rng(4242);
using emucheck::checks;
using emucheck::ctx;
using emucheck::expect;
using emucheck::expectNear;
using emucheck::fail;
using emucheck::failures;

/// Random values representable in bf16 (so that float and bf16 runs read the same numbers).
static std::vector<float> randomValues(int64_t n) {
  std::uniform_real_distribution<float> d(-2, 2);
  std::vector<float> v((size_t)n);
  for (float &x : v) x = (float)bf(d(rng));
  return v;
}
template <class E, class F> static std::vector<E> as(const std::vector<F> &v) {
  std::vector<E> out;
  for (F x : v) out.push_back(E((float)x));
  return out;
}

template <class T> static void expectSameBits(const std::vector<T> &got, const std::vector<T> &want, const char *what) {
  ++checks;
  if (got.size() != want.size()) return fail(std::string(what) + ": sizes differ");
  for (size_t i = 0; i < got.size(); ++i)
    if (std::memcmp(&got[i], &want[i], sizeof(T)) != 0) {
      char buf[160];
      std::snprintf(buf, sizeof buf, "%s: [%zu] sequence-major %.9g, head-major %.9g (n=%zu)", what, i,
                    (double)(float)got[i], (double)(float)want[i], got.size());
      return fail(buf);
    }
}


// Head sizes multiples of 8, which the (fake) cuDNN takes.
static const LayoutCase kCases[] = {
    {{2}, 3, 5, 7, 8, 16, 1, {2, 1, 5, 7}, false},      // a mask per batch entry, broadcast over heads
    {{2}, 2, 70, 9, 16, 8, 2, {70, 9}, true},           // two blocks of 64 rows (the lowered budget)
    {{2}, 3, 6, 5, 8, 24, 3, {1, 3, 6, 5}, false},      // an additive mask per head
    {{}, 4, 5, 6, 8, 16, 0, {}, false},                 // no leading axes: q [S, H, D]
    {{2, 1}, 2, 4, 6, 16, 8, 1, {2, 1, 2, 4, 6}, true}, // two leading axes, a mask per slice
    {{2}, 3, 12, 16, 16, 8, 4, {1, 1, 12, 16}, false}}; // cuDNN's causal mode

struct Masks {
  std::vector<uint8_t> boolean;
  std::vector<float> additive;
  const uint8_t *booleanData() const { return boolean.empty() ? nullptr : boolean.data(); }
  const float *additiveData() const { return additive.empty() ? nullptr : additive.data(); }
};
static Masks masksOf(const LayoutCase &c) {
  Masks m;
  const int64_t n = c.ms.numel(), T = c.ms.size ? c.ms.v[c.ms.size - 1] : 1;
  if (c.maskKind == 1) { // key 0 of every row kept
    m.boolean.resize(n);
    for (int64_t e = 0; e < n; ++e) m.boolean[e] = ((uint32_t)e * 2654435761u >> 9) % 3 == 0 && e % T != 0;
  } else if (c.maskKind == 2 || c.maskKind == 4) { // masked (maskedWhen true) where j > i
    m.boolean.resize(n);
    const int64_t S = c.ms.v[c.ms.size - 2];
    for (int64_t e = 0; e < n; ++e) m.boolean[e] = e % T > (e / T) % S;
    if (c.maskKind == 4) pc::declareCausalMask(m.boolean.data(), c.ms, true);
  } else if (c.maskKind == 3) {
    std::uniform_real_distribution<float> d(-1, 1);
    for (int64_t e = 0; e < n; ++e) m.additive.push_back(d(rng));
  }
  return m;
}

/// An output with guard values on both sides (64 elements: 16-byte alignment kept for cuDNN).
template <class T> struct Guarded {
  static constexpr int64_t kGuard = 64;
  explicit Guarded(int64_t n) : sentinel(T(12345.0f)), all((size_t)(n + 2 * kGuard), sentinel) {}
  T *data() { return all.data() + kGuard; }
  std::vector<T> values() const { return std::vector<T>(all.begin() + kGuard, all.end() - kGuard); }
  bool guardsIntact() const {
    for (int64_t i = 0; i < kGuard; ++i)
      if (std::memcmp(&all[i], &sentinel, sizeof(T)) != 0 ||
          std::memcmp(&all[all.size() - 1 - i], &sentinel, sizeof(T)) != 0)
        return false;
    return true;
  }
  T sentinel;
  std::vector<T> all;
};

template <class E> struct Operands {
  std::vector<E> q, k, v, dy;
};
template <class E> struct Results {
  std::vector<E> y, dq, dk, dv;
  std::vector<float> lse;
  int launches = 0, gemms = 0;
  long cudnnExecutes = 0;
};

/// Forward, then backward from its own y and lse, of one case in one layout
/// (the operands given in that layout). With `planned`, pipec's kernels get
/// a workspace of exactly the planned scratch, NaN-filled and guarded.
template <class E>
static Results<E> run(const LayoutCase &c, Layout layout, const Operands<E> &in, const Masks &m, float ratio,
                      bool planned) {
  const Shape qs = c.shape(layout, c.S, c.D), ks = c.shape(layout, c.T, c.D, c.kvHeads()),
              vs = c.shape(layout, c.T, c.Dv, c.kvHeads());
  static uint64_t callKey = pk::dropoutCallKey(11, 5, 3); // "device memory": the emulation's device is the host
  const pc::StreamKey key(&callKey, pk::dropoutOpId("attn_dropout"));
  const int64_t rows = c.outer() * c.H * c.S;
  Guarded<E> y(rows * c.Dv), dq(in.q.size()), dk(in.k.size()), dv(in.v.size());
  Guarded<float> lse(rows);
  const int64_t fwdBytes = pk::attentionScratch(pipec::Target::Cuda, qs, ks, vs, layout).shared,
                gradBytes = pk::attentionGradScratch(pipec::Target::Cuda, qs, ks, vs, layout).shared;
  Guarded<float> fwdScratch(fwdBytes / 4), gradScratch(gradBytes / 4);
  std::fill(fwdScratch.data(), fwdScratch.data() + fwdBytes / 4, NAN);
  std::fill(gradScratch.data(), gradScratch.data() + gradBytes / 4, NAN);
  const pk::Workspace fwdWs = planned ? pk::Workspace{fwdScratch.data(), fwdBytes} : pk::Workspace{},
                      gradWs = planned ? pk::Workspace{gradScratch.data(), gradBytes} : pk::Workspace{};
  Results<E> r;
  const int launches = emu::launches, gemms = emu::gemmCalls;
  const long executes = emu::cudnnExecutes;
  pc::attention(in.q.data(), qs, in.k.data(), ks, in.v.data(), vs, m.booleanData(), m.additiveData(), c.ms, 0.7f,
                c.divide, -1e9f, true, ratio, true, key, y.data(), lse.data(), fwdWs, layout);
  pc::attentionGrad(in.dy.data(), in.q.data(), qs, in.k.data(), ks, in.v.data(), vs, m.booleanData(),
                    m.additiveData(), c.ms, y.data(), lse.data(), 0.7f, c.divide, -1e9f, true, ratio, true, key,
                    dq.data(), dk.data(), dv.data(), gradWs, layout);
  r.launches = emu::launches - launches, r.gemms = emu::gemmCalls - gemms;
  r.cudnnExecutes = emu::cudnnExecutes - executes;
  const bool intact = y.guardsIntact() && lse.guardsIntact() && dq.guardsIntact() && dk.guardsIntact() &&
                      dv.guardsIntact() && fwdScratch.guardsIntact() && gradScratch.guardsIntact();
  expect(intact, std::string(layout == Layout::SequenceMajor ? "sequence-major" : "head-major") +
                     " call wrote outside its outputs or scratch");
  r.y = y.values(), r.lse = lse.values(), r.dq = dq.values(), r.dk = dk.values(), r.dv = dv.values();
  return r;
}

/// Both layouts of every case on storage E, without and with dropout;
/// `cudnn`: whether cuDNN must run them (else it must not).
template <class E> static void compareLayouts(const char *path, bool cudnn, bool planned) {
  for (const LayoutCase &c : kCases)
    for (float ratio : {0.0f, 0.3f}) {
      ctx = std::string(path) + " " + c.str() + (ratio > 0 ? " dropout" : "");
      const int64_t L = c.outer();
      const auto q = randomValues(L * c.S * c.H * c.D), k = randomValues(L * c.T * c.H * c.D),
                 v = randomValues(L * c.T * c.H * c.Dv), dy = randomValues(L * c.S * c.H * c.Dv);
      const Masks m = masksOf(c);
      const Operands<E> seqIn{as<E>(q), as<E>(k), as<E>(v), as<E>(dy)};
      const Operands<E> headIn{as<E>(swapMiddleAxes(q, L, c.S, c.H, c.D)), as<E>(swapMiddleAxes(k, L, c.T, c.H, c.D)),
                               as<E>(swapMiddleAxes(v, L, c.T, c.H, c.Dv)),
                               as<E>(swapMiddleAxes(dy, L, c.S, c.H, c.Dv))};
      const Results<E> seq = run(c, Layout::SequenceMajor, seqIn, m, ratio, planned);
      const Results<E> head = run(c, Layout::HeadMajor, headIn, m, ratio, planned);
      expectSameBits(swapMiddleAxes(seq.y, L, c.S, c.H, c.Dv), head.y, "y");
      expectSameBits(seq.lse, head.lse, "lse");
      expectSameBits(swapMiddleAxes(seq.dq, L, c.S, c.H, c.D), head.dq, "dq");
      expectSameBits(swapMiddleAxes(seq.dk, L, c.T, c.H, c.D), head.dk, "dk");
      expectSameBits(swapMiddleAxes(seq.dv, L, c.T, c.H, c.Dv), head.dv, "dv");
      expect(seq.launches == head.launches, "sequence-major launched " + std::to_string(seq.launches) +
                                                " kernels, head-major " + std::to_string(head.launches));
      // pipec's kernels: one GEMM per outer index where head-major has one (cuDNN: none).
      const int perHeadMajorGemm = c.H > 1 ? (int)L : 1;
      expect(seq.gemms == head.gemms * perHeadMajorGemm,
             std::to_string(seq.gemms) + " GEMMs, head-major " + std::to_string(head.gemms));
      const long executes = cudnn ? 2 : 0; // forward and backward
      expect(seq.cudnnExecutes == executes && head.cudnnExecutes == executes,
             "cuDNN ran " + std::to_string(seq.cudnnExecutes) + " (sequence-major) and " +
                 std::to_string(head.cudnnExecutes) + " (head-major) times, expected " + std::to_string(executes));
      if constexpr (std::is_same_v<E, float>) { // the CPU kernels in the same layout
        const Shape qs = c.shape(Layout::SequenceMajor, c.S, c.D), ks = c.shape(Layout::SequenceMajor, c.T, c.D),
                    vs = c.shape(Layout::SequenceMajor, c.T, c.Dv);
        const uint64_t cpuKey = pk::dropoutOpStreamKey(pk::dropoutCallKey(11, 5, 3), pk::dropoutOpId("attn_dropout"));
        std::vector<float> y(seq.y.size()), lse(seq.lse.size()), dq(q.size()), dk(k.size()), dv(v.size());
        pk::attention(q.data(), qs, k.data(), ks, v.data(), vs, m.booleanData(), m.additiveData(), c.ms, 0.7f,
                      c.divide, -1e9f, true, ratio, true, cpuKey, y.data(), lse.data(), {}, Layout::SequenceMajor);
        pk::attentionGrad(dy.data(), q.data(), qs, k.data(), ks, v.data(), vs, m.booleanData(), m.additiveData(),
                          c.ms, y.data(), lse.data(), 0.7f, c.divide, -1e9f, true, ratio, true, cpuKey, dq.data(),
                          dk.data(), dv.data(), {}, Layout::SequenceMajor);
        // cuda-kernels-emulated's float attention tolerances.
        expectNear(seq.y, y, 1e-5, "y against the CPU");
        expectNear(seq.lse, lse, 1e-5, "lse against the CPU");
        expectNear(seq.dq, dq, 1e-4, "dq against the CPU");
        expectNear(seq.dk, dk, 1e-4, "dk against the CPU");
        expectNear(seq.dv, dv, 1e-4, "dv against the CPU");
      }
    }
}

/// pipec's kernels at the default block of score rows and at blocks of 64.
template <class E> static void testPipecKernels(const char *path) {
  int64_t &budget = pk::plan::cudaAttentionBlockBytes();
  const int64_t before = budget;
  for (int64_t bytes : {before, int64_t(4096)}) {
    budget = bytes;
    compareLayouts<E>(path, false, true);
  }
  budget = before;
}

static void testFloat() { testPipecKernels<float>("float"); }

static void testBf16() {
  setenv("PIPEC_CUDNN_ATTENTION", "0", 1); // pipec's own kernels
  testPipecKernels<bf>("bf16");
  unsetenv("PIPEC_CUDNN_ATTENTION");
}

static void testFlash() {
  unsetenv("PIPEC_CUDNN_ATTENTION");
  compareLayouts<bf>("flash", true, false);
}

/// Grouped-query heads (key and value with Hkv heads, the query with
/// H = g·Hkv) on every path, in both layouts, without and with dropout,
/// against the same path on key and value with each head repeated g times:
/// y, lse and dq bit for bit, dk and dv the repeated call's summed over each
/// group (float 1e-5; bf16 storage rounds the partial sums, 1e-2). cuDNN
/// must run the grouped call itself (its GQA), not decline it; float also
/// against the CPU kernels' grouped call.
static const LayoutCase kGroupedCases[] = {
    {{2}, 6, 5, 7, 8, 16, 1, {2, 1, 5, 7}, false, 2},  // 3 query heads per key/value head
    {{2}, 4, 70, 9, 16, 8, 2, {70, 9}, true, 1},       // one key/value head, two blocks of 64 rows
    {{2}, 6, 6, 5, 8, 24, 3, {1, 6, 6, 5}, false, 3},  // an additive mask per query head
    {{2}, 4, 12, 16, 16, 8, 4, {1, 1, 12, 16}, false, 2}, // cuDNN's causal mode
    {{2}, 6, 70, 9, 8, 16, 2, {70, 9}, false, 3},         // 2 query heads per key/value head, two blocks
    {{2}, 4, 0, 5, 8, 8, 0, {}, false, 2}};               // no query rows (cuDNN declines: pipec's kernels)

template <class E> static void compareGrouped(const char *path, bool cudnn, bool planned) {
  for (const LayoutCase &c : kGroupedCases)
    for (Layout layout : {Layout::HeadMajor, Layout::SequenceMajor})
      for (float ratio : {0.0f, 0.3f}) {
        ctx = std::string(path) + " grouped " + c.str() + (layout == Layout::SequenceMajor ? " sequence-major" : "") +
              (ratio > 0 ? " dropout" : "");
        const int64_t L = c.outer(), Hkv = c.kvHeads(), g = c.H / Hkv;
        const auto q = randomValues(L * c.S * c.H * c.D), k = randomValues(L * c.T * Hkv * c.D),
                   v = randomValues(L * c.T * Hkv * c.Dv), dy = randomValues(L * c.S * c.H * c.Dv);
        const Masks m = masksOf(c);
        const Results<E> got = run(c, layout, Operands<E>{as<E>(q), as<E>(k), as<E>(v), as<E>(dy)}, m, ratio, planned);
        const Results<E> want =
            run(c.repeated(), layout,
                Operands<E>{as<E>(q), as<E>(repeatHeads(k, layout, L, Hkv, c.T, c.D, g)),
                            as<E>(repeatHeads(v, layout, L, Hkv, c.T, c.Dv, g)), as<E>(dy)},
                m, ratio, planned);
        expectSameBits(got.y, want.y, "y");
        expectSameBits(got.lse, want.lse, "lse");
        expectSameBits(got.dq, want.dq, "dq");
        // Each head's term is rounded on its own in the repeated call: the
        // tolerance scales with the terms' magnitudes, not their sum's. bf16
        // storage: pipec's kernels round the running sum once per block of
        // 64 rows and query head (docs/cuda-kernels.md), half an ulp (2^-9)
        // each.
        const double roundings = (double)g * (double)((c.S + 63) / 64);
        const double tol = std::is_same_v<E, float> ? 1e-5 : 1e-2 + roundings / 256;
        auto expectGroupSums = [&](const std::vector<E> &grouped, const std::vector<E> &repeated, int64_t width,
                                   const char *what) {
          std::vector<float> terms = as<float>(repeated), magnitudes(terms.size());
          for (size_t i = 0; i < terms.size(); ++i) magnitudes[i] = std::fabs(terms[i]);
          const std::vector<float> sums = sumHeadGroups(terms, layout, L, Hkv, c.T, width, g),
                                   scale = sumHeadGroups(magnitudes, layout, L, Hkv, c.T, width, g),
                                   got = as<float>(grouped);
          ++checks;
          if (got.size() != sums.size()) return fail(std::string(what) + ": sizes differ");
          for (size_t i = 0; i < sums.size(); ++i)
            if (!(std::fabs((double)got[i] - sums[i]) <= tol * (1 + scale[i]))) {
              char buf[200];
              std::snprintf(buf, sizeof buf, "%s: [%zu] grouped %.9g, repeated heads' sum %.9g (of magnitude %.9g)",
                            what, i, (double)got[i], (double)sums[i], (double)scale[i]);
              return fail(buf);
            }
        };
        expectGroupSums(got.dk, want.dk, c.D, "dk against the repeated heads' sums");
        expectGroupSums(got.dv, want.dv, c.Dv, "dv against the repeated heads' sums");
        const long executes = cudnn && c.S > 0 ? 2 : 0;
        expect(got.cudnnExecutes == executes,
               "cuDNN ran the grouped call " + std::to_string(got.cudnnExecutes) + " times, expected " +
                   std::to_string(executes));
        if constexpr (std::is_same_v<E, float>) {
          const Shape qs = c.shape(layout, c.S, c.D), ks = c.shape(layout, c.T, c.D, Hkv),
                      vs = c.shape(layout, c.T, c.Dv, Hkv);
          const uint64_t cpuKey = pk::dropoutOpStreamKey(pk::dropoutCallKey(11, 5, 3), pk::dropoutOpId("attn_dropout"));
          std::vector<float> y(got.y.size()), lse(got.lse.size()), dq(q.size()), dk(k.size()), dv(v.size());
          pk::attention(q.data(), qs, k.data(), ks, v.data(), vs, m.booleanData(), m.additiveData(), c.ms, 0.7f,
                        c.divide, -1e9f, true, ratio, true, cpuKey, y.data(), lse.data(), {}, layout);
          pk::attentionGrad(dy.data(), q.data(), qs, k.data(), ks, v.data(), vs, m.booleanData(), m.additiveData(),
                            c.ms, y.data(), lse.data(), 0.7f, c.divide, -1e9f, true, ratio, true, cpuKey, dq.data(),
                            dk.data(), dv.data(), {}, layout);
          expectNear(got.y, y, 1e-5, "y against the CPU");
          expectNear(got.lse, lse, 1e-5, "lse against the CPU");
          expectNear(got.dq, dq, 1e-4, "dq against the CPU");
          expectNear(got.dk, dk, 1e-4, "dk against the CPU");
          expectNear(got.dv, dv, 1e-4, "dv against the CPU");
        }
      }
}

static void testGrouped() {
  int64_t &budget = pk::plan::cudaAttentionBlockBytes();
  const int64_t before = budget;
  budget = 4096; // blocks of 64 rows: dk and dv also sum over blocks
  compareGrouped<float>("float", false, true);
  setenv("PIPEC_CUDNN_ATTENTION", "0", 1);
  compareGrouped<bf>("bf16", false, true);
  unsetenv("PIPEC_CUDNN_ATTENTION");
  budget = before;
  compareGrouped<float>("float", false, true);
  compareGrouped<bf>("flash", true, false);
}

/// Joint q/k/v (nn.attention's joint_kv_heads): q, k and v windows of one
/// [L'..., S, H + 2·Hkv, D] value and the gradients windows of one joint
/// gradient, against the same path on the windows as tensors of their own
/// (the sequence-major call): y, lse and every window of the joint gradient
/// bit for bit, nothing written outside it, the same launches, and cuDNN
/// running both calls on the flash path (the joint rows' strides in its
/// graphs) and neither on pipec's.
template <class E> static void compareJoint(const char *path, bool cudnn) {
  const Layout sm = Layout::SequenceMajor;
  for (const LayoutCase &c : pk::testing::kJointCases)
    for (float ratio : {0.0f, 0.3f}) {
      ctx = std::string(path) + " joint " + c.str() + (ratio > 0 ? " dropout" : "");
      const int64_t L = c.outer(), Hkv = c.kvHeads(), N = c.H + 2 * Hkv, rows = L * c.S;
      const auto q = randomValues(rows * c.H * c.D), k = randomValues(rows * Hkv * c.D),
                 v = randomValues(rows * Hkv * c.D), dy = randomValues(rows * c.H * c.D);
      const Masks m = masksOf(c);
      const Results<E> want = run(c, sm, Operands<E>{as<E>(q), as<E>(k), as<E>(v), as<E>(dy)}, m, ratio, false);
      const std::vector<E> joint = as<E>(pk::testing::jointOf(q, k, v, L, c.S, c.H, Hkv, c.D)), dyE = as<E>(dy);
      const Shape qs = c.shape(sm, c.S, c.D), ks = c.shape(sm, c.T, c.D, Hkv);
      static uint64_t callKey = pk::dropoutCallKey(11, 5, 3);
      const pc::StreamKey key(&callKey, pk::dropoutOpId("attn_dropout"));
      const E *J = joint.data();
      const int64_t kOffset = c.H * c.D, vOffset = (c.H + Hkv) * c.D;
      Guarded<E> y(rows * c.H * c.D), dJoint((int64_t)joint.size());
      Guarded<float> lse(rows * c.H);
      const int launches = emu::launches;
      const long executes = emu::cudnnExecutes;
      pc::attention(J, qs, J + kOffset, ks, J + vOffset, ks, m.booleanData(), m.additiveData(), c.ms, 0.7f, c.divide,
                    -1e9f, true, ratio, true, key, y.data(), lse.data(), {}, sm, N);
      E *dJ = dJoint.data();
      pc::attentionGrad(dyE.data(), J, qs, J + kOffset, ks, J + vOffset, ks, m.booleanData(), m.additiveData(), c.ms,
                        y.data(), lse.data(), 0.7f, c.divide, -1e9f, true, ratio, true, key, dJ, dJ + kOffset,
                        dJ + vOffset, {}, sm, N);
      expect(y.guardsIntact() && lse.guardsIntact() && dJoint.guardsIntact(),
             "the joint call wrote outside its outputs");
      expectSameBits(y.values(), want.y, "y");
      expectSameBits(lse.values(), want.lse, "lse");
      const std::vector<E> grad = dJoint.values();
      expectSameBits(pk::testing::jointWindow(grad, rows, N, c.D, 0, c.H), want.dq, "dq");
      expectSameBits(pk::testing::jointWindow(grad, rows, N, c.D, c.H, Hkv), want.dk, "dk");
      expectSameBits(pk::testing::jointWindow(grad, rows, N, c.D, c.H + Hkv, Hkv), want.dv, "dv");
      expect(emu::launches - launches == want.launches,
             "the joint call launched " + std::to_string(emu::launches - launches) + " kernels, the separate one " +
                 std::to_string(want.launches));
      const long ran = emu::cudnnExecutes - executes, expected = cudnn ? 2 : 0;
      expect(ran == expected && want.cudnnExecutes == expected,
             "cuDNN ran the joint call " + std::to_string(ran) + " times, expected " + std::to_string(expected));
    }
}

static void testJoint() {
  compareJoint<float>("float", false);
  setenv("PIPEC_CUDNN_ATTENTION", "0", 1);
  compareJoint<bf>("bf16", false);
  unsetenv("PIPEC_CUDNN_ATTENTION");
  compareJoint<bf>("flash", true);
}

/// Malformed sequence-major shapes: refused by every path, naming the op
/// and the layout.
static void testErrors() {
  const std::string disagree = "are not [L..., S, H, D], [L..., T, H, D], [L..., T, H, Dv] (sequence-major)";
  struct Bad {
    Shape qs, ks, vs;
    const char *why;
  };
  const Bad bad[] = {{{2, 5, 3, 8}, {2, 6, 2, 8}, {2, 6, 2, 8}, "H of q and k"},
                     {{2, 5, 3, 8}, {2, 6, 3, 8}, {2, 6, 4, 8}, "H of k and v"},
                     {{2, 5, 3, 8}, {3, 6, 3, 8}, {3, 6, 3, 8}, "leading axes"}};
  std::vector<float> f(4096);
  std::vector<bf> b(4096);
  for (const Bad &s : bad)
    for (int path = 0; path < 4; ++path) {
      ctx = std::string("errors ") + s.why + (path % 2 ? " bf16" : " float") + (path / 2 ? " grad" : "");
      std::string message = "no error";
      try {
        if (path == 0)
          pc::attention(f.data(), s.qs, f.data(), s.ks, f.data(), s.vs, nullptr, nullptr, Shape{}, 1.0f, false, 0.0f,
                        true, 0.0f, false, 0, f.data(), f.data(), {}, Layout::SequenceMajor);
        else if (path == 1)
          pc::attention(b.data(), s.qs, b.data(), s.ks, b.data(), s.vs, nullptr, nullptr, Shape{}, 1.0f, false, 0.0f,
                        true, 0.0f, false, 0, b.data(), f.data(), {}, Layout::SequenceMajor);
        else if (path == 2)
          pc::attentionGrad(f.data(), f.data(), s.qs, f.data(), s.ks, f.data(), s.vs, nullptr, nullptr, Shape{},
                            f.data(), f.data(), 1.0f, false, 0.0f, true, 0.0f, false, 0, f.data(), f.data(), f.data(),
                            {}, Layout::SequenceMajor);
        else
          pc::attentionGrad(b.data(), b.data(), s.qs, b.data(), s.ks, b.data(), s.vs, nullptr, nullptr, Shape{},
                            b.data(), f.data(), 1.0f, false, 0.0f, true, 0.0f, false, 0, b.data(), b.data(), b.data(),
                            {}, Layout::SequenceMajor);
      } catch (const pk::KernelError &e) {
        message = e.what();
      }
      const std::string op = path / 2 ? "nn.attention_grad: " : "nn.attention: ";
      expect(message.rfind(op, 0) == 0 && message.find(disagree) != std::string::npos, "got: " + message);
    }
}

int main(int argc, char **argv) {
  void *fakeStream = (void *)0x5150;
  emu::expectedStream = (cudaStream_t)fakeStream;
  pc::StreamScope scope(fakeStream, pc::Precision::F32);
  const std::string only = argc > 1 ? argv[1] : "";
  auto group = [&](const char *name, void (*f)()) {
    if (!only.empty() && only != name) return;
    try {
      f();
    } catch (const std::exception &e) {
      std::printf("EXCEPTION in %s (%s): %s\n", name, ctx.c_str(), e.what());
      ++failures;
    }
    std::printf("%s done (failures so far %d)\n", name, failures);
    std::fflush(stdout);
  };
  group("float", testFloat);
  group("bf16", testBf16);
  group("flash", testFlash);
  group("grouped", testGrouped);
  group("joint", testJoint);
  group("errors", testErrors);
  return emucheck::finish();
}
