// cuda-conv-pool-nhwc-emulated: the channels-last (NHWC) convolutions and
// pools of pipec's CUDA library (channelsLast = true: x, y, dy, dx
// [N, d..., C], w and dw [F, k..., C/group]) under the host emulation
// (emu.h, the fake cudnn_frontend in inc/), against the CPU kernels on the
// channels-first transposes:
//   - nn.conv, nn.conv_input_grad, nn.conv_weight_grad (with and without
//     accumulate) in every variant of cuda-conv-cudnn-emulated (1-D, 2-D,
//     3-D, groups, depthwise, dilations, strides, asymmetric pads, pointwise,
//     bias or none) plus odd channel counts (3, 7, 33), tiles of more than 32
//     positions and channels, and 4 spatial axes (which cuDNN never takes):
//     in the TF32 and BF16 precisions each call is one cuDNN graph given the
//     tensors as they lie (channels-last strides, checked on the graph the
//     fake received) and no GEMM; where that graph must not run (F32,
//     PIPEC_CUDNN_CONV=0, unaligned operands) the channels-first call runs
//     on channels-first copies (cuDNN's channels-first graph where the copies
//     allow it, else pipec's im2col kernels); bf16 storage through cuDNN's
//     bf16 graphs and on widened copies; the planned scratch is the
//     channels-first call's;
//   - nn.max_pool (dilations, ceil mode), nn.average_pool (count_include_pad),
//     their gradients and nn.global_average_pool on ranks 3 to 6, float and
//     bf16, channel counts that do and do not fill 16-byte packs, aligned
//     and not: the window kernels equal the channels-first kernels bit for
//     bit (and so the CPU's for float);
//   - the channels-first calls with an explicit channelsLast = false, and
//     the scratch queries refusing channels-last on the CPU target.
#include "pipec/cuda_kernels.h"
#include "pipec/cpu_kernels.h"
#include "pipec/kernel_scratch.h"
#include "cuda_runtime.h"
#include "emu.h"
#include "cudnn_frontend.h" // emu::lastConvTensors (after emu.h, which it uses)
#include "emulated_checks.h"
#include "channels_last_layout.h"

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
using emucheck::bf16Rounded;
using emucheck::ctx;
using emucheck::expect;
using emucheck::expectNear;
using emulayout::channelsLastShape;
using emulayout::moveChannels;
using emulayout::stridesOf;
using pk::Dims;
using pk::Shape;
using P = pipec::Precision;

static std::mt19937_64 rng(4747);
/// Random values in [-1, 1].
static std::vector<float> randomValues(int64_t n) { return emucheck::uniformValues(rng, n); }
/// The fake cuDNN sums in double, the CPU kernels in float.
constexpr double kTolerance = 2e-5;
/// Up to two roundings to bf16 (the result, then the bias added to it).
constexpr double kBf16Tolerance = 2.0 / 256;


/// `got` equals `want` bit for bit.
template <class V> static void expectSame(const std::vector<V> &got, const std::vector<V> &want, const char *what) {
  bool same = got.size() == want.size() && std::memcmp(got.data(), want.data(), got.size() * sizeof(V)) == 0;
  size_t at = 0;
  while (!same && at < got.size() && at < want.size() && std::memcmp(&got[at], &want[at], sizeof(V)) == 0) ++at;
  expect(same, std::string(what) + " differs from the channels-first result (first at " + std::to_string(at) + ")");
}
static std::vector<float> widened(const std::vector<pc::bf16> &v) {
  std::vector<float> out;
  for (const pc::bf16 &e : v) out.push_back((float)e);
  return out;
}

/// A buffer with guards of 64 elements around it.
template <class V> struct Guarded {
  static constexpr size_t kGuard = 64;
  explicit Guarded(size_t n, size_t offset = 0) : offset(offset), all(n + offset + 2 * kGuard, V(NAN)) {
    for (size_t i = 0; i < kGuard; ++i) all[i] = all[all.size() - 1 - i] = V(12345.0f);
  }
  Guarded(const std::vector<V> &v, size_t offset) : Guarded(v.size(), offset) {
    std::copy(v.begin(), v.end(), data());
  }
  V *data() { return all.data() + kGuard + offset; }
  std::vector<V> values() const { return std::vector<V>(all.begin() + kGuard + offset, all.end() - kGuard); }
  bool intact() const {
    const float guard = (float)V(12345.0f);
    for (size_t i = 0; i < kGuard; ++i)
      if ((float)all[i] != guard || (float)all[all.size() - 1 - i] != guard) return false;
    return true;
  }
  size_t offset;
  std::vector<V> all;
};

//===----------------------------------------------------------------------===//
// Convolutions
//===----------------------------------------------------------------------===//

struct ConvCase {
  Shape xs, ws; // channels-first
  Dims s, p, d;
  int64_t g;
  bool bias;
  std::string str() const {
    return "x " + xs.str() + " w " + ws.str() + " group " + std::to_string(g) + (bias ? " bias" : "");
  }
  bool cudnnTakes() const { return xs.size <= 5; } // 1 to 3 spatial axes
};

const ConvCase kConvCases[] = {
    {{2, 3, 7, 6}, {4, 3, 3, 3}, {1, 1}, {1, 1, 1, 1}, {1, 1}, 1, true},   // 2-D, same padding, 3 channels
    {{2, 4, 9, 8}, {6, 2, 3, 2}, {2, 1}, {0, 1, 2, 0}, {1, 1}, 2, false},  // groups, stride, asymmetric pads
    {{1, 6, 10, 9}, {6, 1, 3, 3}, {1, 2}, {2, 2, 2, 2}, {2, 2}, 6, true},  // depthwise, dilated
    {{3, 4, 11}, {5, 4, 3}, {2}, {1, 0}, {1}, 1, true},                    // 1-D
    {{5, 6, 4}, {6, 2, 2}, {3}, {2, 2}, {3}, 3, false},                    // 1-D grouped, dilated, strided
    {{2, 2, 5, 6, 4}, {3, 2, 2, 3, 2}, {1, 2, 1}, {0, 1, 1, 0, 1, 0}, {1, 1, 2}, 1, true}, // 3-D
    {{2, 8, 5, 5}, {4, 8, 1, 1}, {1, 1}, {0, 0, 0, 0}, {1, 1}, 1, false},  // pointwise
    {{1, 2, 6, 6}, {2, 2, 3, 3}, {2, 2}, {0, 0, 0, 0}, {1, 1}, 1, true},   // a trailing row and column unread
    {{2, 7, 6, 5}, {33, 7, 3, 3}, {1, 1}, {1, 1, 1, 1}, {1, 1}, 1, true},  // 7 -> 33 channels
    {{1, 33, 5, 4}, {9, 11, 3, 1}, {2, 1}, {1, 0, 1, 0}, {1, 1}, 3, true}, // 33 channels in 3 groups
    {{1, 40, 9, 8}, {36, 40, 1, 1}, {1, 1}, {0, 0, 0, 0}, {1, 1}, 1, true}, // tiles past 32 both ways
    {{2, 16, 12, 10}, {24, 16, 3, 3}, {1, 1}, {1, 1, 1, 1}, {1, 1}, 1, false}, // larger
    {{1, 3, 3, 4, 3, 4}, {2, 3, 2, 2, 1, 2}, {1, 1, 1, 1}, {0, 1, 0, 0, 0, 0, 0, 1}, {1, 1, 1, 1}, 1, true}, // 4-D
};

/// Who must run a call: cuDNN's graph on the channels-last tensors; cuDNN's
/// channels-first graph on channels-first copies; nobody (pipec's kernels).
enum class Graphs { ChannelsLast, ChannelsFirst, None };


/// Runs `call` and checks the cuDNN graphs it executed (one, or none) and
/// their layout.
template <class F> static void expectGraphs(Graphs graphs, const char *what, F &&call) {
  emu::lastConvTensors = {};
  const long before = emu::cudnnExecutes;
  call();
  pc::raiseDeviceErrors();
  const long ran = emu::cudnnExecutes - before;
  expect(ran == (graphs == Graphs::None ? 0 : 1),
         std::string(what) + ": cuDNN ran " + std::to_string(ran) + " graphs");
  if (graphs == Graphs::None || ran != 1) return;
  for (int t = 0; t < 3; ++t) {
    const auto &dims = emu::lastConvTensors.dims[t];
    expect(!dims.empty() && emu::lastConvTensors.strides[t] == stridesOf(dims, graphs == Graphs::ChannelsLast),
           std::string(what) + ": tensor " + std::to_string(t) + " has not the " +
               (graphs == Graphs::ChannelsLast ? "channels-last" : "channels-first") + " strides");
  }
}

/// The scratch queries: the channels-first call's need (the copies live in
/// kernel scratch slot 1), and no channels-last call on the CPU target.
static void checkConvScratch(const ConvCase &c) {
  const Shape xl = channelsLastShape(c.xs), wl = channelsLastShape(c.ws);
  const pk::ScratchTarget cuda = pk::ScratchTarget::Cuda, cpu = pk::ScratchTarget::Cpu;
  expect(pk::convScratch(cuda, xl, wl, c.s, c.p, c.d, c.g, true).shared ==
                 pk::convScratch(cuda, c.xs, c.ws, c.s, c.p, c.d, c.g).shared &&
             pk::convInputGradScratch(cuda, xl, wl, c.s, c.p, c.d, c.g, true).shared ==
                 pk::convInputGradScratch(cuda, c.xs, c.ws, c.s, c.p, c.d, c.g).shared &&
             pk::convWeightGradScratch(cuda, xl, wl, c.s, c.p, c.d, c.g, true, true).shared ==
                 pk::convWeightGradScratch(cuda, c.xs, c.ws, c.s, c.p, c.d, c.g, true).shared,
         "the channels-last scratch is not the channels-first call's");
  int refused = 0;
  auto refuses = [&](auto query) {
    try {
      query();
    } catch (const pk::KernelError &) {
      ++refused;
    }
  };
  refuses([&] { pk::convScratch(cpu, xl, wl, c.s, c.p, c.d, c.g, true); });
  refuses([&] { pk::convInputGradScratch(cpu, xl, wl, c.s, c.p, c.d, c.g, true); });
  refuses([&] { pk::convWeightGradScratch(cpu, xl, wl, c.s, c.p, c.d, c.g, false, true); });
  expect(refused == 3, "a CPU scratch query took channels-last shapes");
}

/// The CPU kernels' y, dx, dw on channels-first data.
struct ConvReference {
  std::vector<float> y, dx, dw;
  ConvReference(const ConvCase &c, const Shape &ys, const std::vector<float> &x, const std::vector<float> &w,
                const std::vector<float> &b, const std::vector<float> &dy)
      : y(ys.numel()), dx(c.xs.numel()), dw(c.ws.numel()) {
    pk::conv(x.data(), c.xs, w.data(), c.ws, c.bias ? b.data() : nullptr, y.data(), c.s, c.p, c.d, c.g);
    pk::convInputGrad(dy.data(), ys, w.data(), c.ws, dx.data(), c.xs, c.s, c.p, c.d, c.g);
    pk::convWeightGrad(dy.data(), ys, x.data(), c.xs, dw.data(), c.ws, c.s, c.p, c.d, c.g);
  }
};

/// One case's calls on float storage in `precision`; `offset`: operands
/// that many floats past a 16-byte boundary; `planned`: each call given a
/// workspace of its planned scratch.
static void runConv(const ConvCase &c, P precision, Graphs graphs, int offset, bool planned) {
  pc::StreamScope scope((void *)0x5150, precision);
  const Shape ys = pk::convOutputShape(c.xs, c.ws, c.s, c.p, c.d);
  const Shape xl = channelsLastShape(c.xs), wl = channelsLastShape(c.ws), yl = channelsLastShape(ys);
  const auto x = randomValues(c.xs.numel()), w = randomValues(c.ws.numel()), b = randomValues(c.ws.v[0]),
             dy = randomValues(ys.numel());
  Guarded<float> xg(moveChannels(x, c.xs, true), offset), wg(moveChannels(w, c.ws, true), offset),
      dyg(moveChannels(dy, ys, true), offset), y(ys.numel(), offset), dx(c.xs.numel(), offset),
      dw(c.ws.numel(), offset);
  auto scratchFor = [&](const pk::ScratchNeed &need) { return Guarded<float>((size_t)(need.shared / 4 + 1)); };
  const pk::ScratchTarget cuda = pk::ScratchTarget::Cuda;
  Guarded<float> fwdScratch = scratchFor(pk::convScratch(cuda, xl, wl, c.s, c.p, c.d, c.g, true)),
                 inScratch = scratchFor(pk::convInputGradScratch(cuda, xl, wl, c.s, c.p, c.d, c.g, true)),
                 wScratch = scratchFor(pk::convWeightGradScratch(cuda, xl, wl, c.s, c.p, c.d, c.g, true, true));
  auto workspace = [&](Guarded<float> &s) {
    return planned ? pk::Workspace{s.data(), (int64_t)(s.all.size() - 2 * Guarded<float>::kGuard) * 4}
                   : pk::Workspace{};
  };
  const int gemms = emu::gemmCalls;
  expectGraphs(graphs, "conv", [&] {
    pc::conv(xg.data(), xl, wg.data(), wl, c.bias ? b.data() : nullptr, y.data(), c.s, c.p, c.d, c.g,
             workspace(fwdScratch), true);
  });
  expectGraphs(graphs, "conv_input_grad", [&] {
    pc::convInputGrad(dyg.data(), yl, wg.data(), wl, dx.data(), xl, c.s, c.p, c.d, c.g, workspace(inScratch), true);
  });
  expectGraphs(graphs, "conv_weight_grad", [&] {
    pc::convWeightGrad(dyg.data(), yl, xg.data(), xl, dw.data(), wl, c.s, c.p, c.d, c.g, workspace(wScratch), false,
                       true);
  });
  if (graphs != Graphs::None)
    expect(emu::gemmCalls == gemms, "cuDNN's calls ran " + std::to_string(emu::gemmCalls - gemms) + " GEMMs");
  else
    expect(emu::gemmCalls > gemms, "pipec's kernels ran no GEMM");
  // Accumulated: the buffer plus dw, bit for bit.
  const std::vector<float> held = randomValues(c.ws.numel());
  Guarded<float> added(held, offset);
  pc::convWeightGrad(dyg.data(), yl, xg.data(), xl, added.data(), wl, c.s, c.p, c.d, c.g, workspace(wScratch), true,
                     true);
  pc::raiseDeviceErrors();
  {
    std::vector<float> want = held;
    const std::vector<float> got = dw.values();
    for (size_t i = 0; i < want.size(); ++i) want[i] += got[i];
    expectSame(added.values(), want, "dw accumulated (the buffer plus dw)");
  }
  expect(xg.intact() && y.intact() && dx.intact() && dw.intact() && added.intact() && fwdScratch.intact() &&
             inScratch.intact() && wScratch.intact(),
         "a call wrote outside its output or workspace");
  const ConvReference want(c, ys, x, w, b, dy);
  expectNear(moveChannels(y.values(), ys, false), want.y, kTolerance, "y");
  expectNear(moveChannels(dx.values(), c.xs, false), want.dx, kTolerance, "dx");
  expectNear(moveChannels(dw.values(), c.ws, false), want.dw, kTolerance, "dw");
}

/// bf16 storage: x, w, dy bf16 (the CPU kernels get the same values in
/// float), y and dx bf16, dw float; `offset` in bf16 elements.
static void runConvBf16(const ConvCase &c, Graphs graphs, int offset) {
  pc::StreamScope scope((void *)0x5150, P::BF16);
  const Shape ys = pk::convOutputShape(c.xs, c.ws, c.s, c.p, c.d);
  const Shape xl = channelsLastShape(c.xs), wl = channelsLastShape(c.ws), yl = channelsLastShape(ys);
  const auto x = bf16Rounded(randomValues(c.xs.numel())), w = bf16Rounded(randomValues(c.ws.numel())),
             b = randomValues(c.ws.v[0]), dy = bf16Rounded(randomValues(ys.numel()));
  auto stored = [](const std::vector<float> &v) { return std::vector<pc::bf16>(v.begin(), v.end()); };
  Guarded<pc::bf16> xg(stored(moveChannels(x, c.xs, true)), offset), wg(stored(moveChannels(w, c.ws, true)), offset),
      dyg(stored(moveChannels(dy, ys, true)), offset), y(ys.numel(), offset), dx(c.xs.numel(), offset);
  Guarded<float> dw(c.ws.numel());
  expectGraphs(graphs, "bf16 conv", [&] {
    pc::conv(xg.data(), xl, wg.data(), wl, c.bias ? b.data() : nullptr, y.data(), c.s, c.p, c.d, c.g, {}, true);
  });
  expectGraphs(graphs, "bf16 conv_input_grad", [&] {
    pc::convInputGrad(dyg.data(), yl, wg.data(), wl, dx.data(), xl, c.s, c.p, c.d, c.g, {}, true);
  });
  expectGraphs(graphs, "bf16 conv_weight_grad", [&] {
    pc::convWeightGrad(dyg.data(), yl, xg.data(), xl, dw.data(), wl, c.s, c.p, c.d, c.g, {}, false, true);
  });
  const std::vector<float> held = randomValues(c.ws.numel());
  Guarded<float> added(held, 0);
  pc::convWeightGrad(dyg.data(), yl, xg.data(), xl, added.data(), wl, c.s, c.p, c.d, c.g, {}, true, true);
  pc::raiseDeviceErrors();
  {
    std::vector<float> want = held;
    const std::vector<float> got = dw.values();
    for (size_t i = 0; i < want.size(); ++i) want[i] += got[i];
    expectSame(added.values(), want, "bf16 dw accumulated (the buffer plus dw)");
  }
  expect(y.intact() && dx.intact() && dw.intact() && added.intact(), "a call wrote outside its output");
  const ConvReference want(c, ys, x, w, b, dy);
  expectNear(moveChannels(widened(y.values()), ys, false), want.y, kBf16Tolerance, "bf16 y");
  expectNear(moveChannels(widened(dx.values()), c.xs, false), want.dx, kBf16Tolerance, "bf16 dx");
  // dw in bf16 where cuDNN's bf16 graph computed it, else float32's.
  expectNear(moveChannels(dw.values(), c.ws, false), want.dw,
             graphs == Graphs::ChannelsLast ? kBf16Tolerance : kTolerance, "bf16 dw");
}

static void testConvolutions() {
  for (const ConvCase &c : kConvCases) {
    ctx = c.str() + " scratch";
    checkConvScratch(c);
    const Graphs last = c.cudnnTakes() ? Graphs::ChannelsLast : Graphs::None;
    const Graphs onCopies = c.cudnnTakes() ? Graphs::ChannelsFirst : Graphs::None;
    for (P precision : {P::TF32, P::BF16})
      for (bool planned : {true, false}) {
        ctx = c.str() + (precision == P::TF32 ? " tf32" : " bf16") + (planned ? " planned workspace" : "");
        runConv(c, precision, last, 0, planned);
      }
    ctx = c.str() + " f32";
    runConv(c, P::F32, Graphs::None, 0, true);
    ctx = c.str() + " unaligned";
    runConv(c, P::TF32, onCopies, 1, true);
    ctx = c.str() + " PIPEC_CUDNN_CONV=0";
    setenv("PIPEC_CUDNN_CONV", "0", 1);
    runConv(c, P::TF32, Graphs::None, 0, false);
    ctx = c.str() + " bf16 storage, PIPEC_CUDNN_CONV=0";
    runConvBf16(c, Graphs::None, 0);
    unsetenv("PIPEC_CUDNN_CONV");
    ctx = c.str() + " bf16 storage";
    runConvBf16(c, last, 0);
    ctx = c.str() + " bf16 storage, unaligned";
    runConvBf16(c, onCopies, 1);
  }
}

/// channelsLast = false spelled out: the channels-first calls, bit for bit.
static void testChannelsFirstSpelledOut() {
  ctx = "channelsLast = false";
  pc::StreamScope scope((void *)0x5150, P::TF32);
  const ConvCase &c = kConvCases[1];
  const Shape ys = pk::convOutputShape(c.xs, c.ws, c.s, c.p, c.d);
  const auto x = randomValues(c.xs.numel()), w = randomValues(c.ws.numel()), dy = randomValues(ys.numel());
  std::vector<float> y1(ys.numel()), y2(ys.numel()), dx1(c.xs.numel()), dx2(c.xs.numel()), dw1(c.ws.numel()),
      dw2(c.ws.numel());
  pc::conv(x.data(), c.xs, w.data(), c.ws, nullptr, y1.data(), c.s, c.p, c.d, c.g);
  pc::conv(x.data(), c.xs, w.data(), c.ws, nullptr, y2.data(), c.s, c.p, c.d, c.g, {}, false);
  pc::convInputGrad(dy.data(), ys, w.data(), c.ws, dx1.data(), c.xs, c.s, c.p, c.d, c.g);
  pc::convInputGrad(dy.data(), ys, w.data(), c.ws, dx2.data(), c.xs, c.s, c.p, c.d, c.g, {}, false);
  pc::convWeightGrad(dy.data(), ys, x.data(), c.xs, dw1.data(), c.ws, c.s, c.p, c.d, c.g);
  pc::convWeightGrad(dy.data(), ys, x.data(), c.xs, dw2.data(), c.ws, c.s, c.p, c.d, c.g, {}, false, false);
  expectSame(y2, y1, "y");
  expectSame(dx2, dx1, "dx");
  expectSame(dw2, dw1, "dw");
  const Shape gs{2, 5, 4, 3};
  const auto gx = randomValues(gs.numel());
  std::vector<float> g1(10), g2(10);
  pc::globalAveragePool(gx.data(), gs, g1.data());
  pc::globalAveragePool(gx.data(), gs, g2.data(), false);
  expectSame(g2, g1, "global average pool");
}

//===----------------------------------------------------------------------===//
// Pooling
//===----------------------------------------------------------------------===//

struct PoolCase {
  Shape xs; // channels-first
  Dims k, s, p, d;
  std::string str() const { return "x " + xs.str() + " kernel " + k.str() + " dilations " + d.str(); }
};

const PoolCase kPoolCases[] = {
    {{2, 7, 9}, {3}, {2}, {1, 1}, {}},
    {{3, 33, 8}, {3}, {2}, {1, 0}, {2}},
    {{2, 3, 7, 6}, {3, 3}, {2, 2}, {1, 1, 1, 1}, {1, 1}},
    {{1, 8, 9, 7}, {3, 2}, {2, 2}, {1, 0, 1, 1}, {2, 1}},
    {{2, 16, 6, 6}, {2, 2}, {2, 2}, {0, 0, 0, 0}, {}},
    {{1, 33, 5, 7}, {2, 3}, {1, 2}, {0, 1, 1, 1}, {1, 1}},
    {{1, 8, 5, 4, 6}, {2, 2, 3}, {2, 1, 2}, {1, 0, 1, 0, 1, 1}, {1, 2, 1}},
    {{2, 3, 4, 5, 3}, {2, 3, 2}, {1, 2, 1}, {0, 1, 0, 1, 1, 0}, {1, 1, 1}},
    // 4 spatial axes: the kernels with a run-time axis count.
    {{1, 4, 3, 4, 3, 4}, {2, 2, 2, 2}, {1, 2, 1, 2}, {0, 1, 0, 0, 1, 0, 0, 1}, {1, 1, 2, 1}},
};

/// Values with ties (a quarter are 0.5), so that the first maximum matters.
static std::vector<float> withTies(std::vector<float> v) {
  for (size_t i = 0; i < v.size(); i += 4) v[i] = 0.5f;
  return v;
}

/// One pooling case on storage T (float or bf16), `offset` elements past an
/// aligned boundary: each channels-last call against the channels-first
/// call on the same values (bit for bit) and the CPU kernel.
template <class T> static void runPool(const PoolCase &c, bool ceil, int offset, bool planned) {
  constexpr bool bf16 = std::is_same_v<T, pc::bf16>;
  const double tol = bf16 ? 1.0 / 256 : 0.0; // one rounding of the CPU's float result
  auto stored = [](const std::vector<float> &v) { return std::vector<T>(v.begin(), v.end()); };
  auto values = [&](const std::vector<T> &v) {
    std::vector<float> f;
    for (const T &e : v) f.push_back((float)e);
    return f;
  };
  auto near = [&](const std::vector<float> &got, const std::vector<float> &want, const char *what) {
    if (tol == 0) return expectSame(got, want, what);
    expectNear(got, want, tol, what);
  };
  const Shape xl = channelsLastShape(c.xs);
  const Shape ys = pk::poolOutputShape(c.xs, c.k, c.s, c.p, c.d, ceil), as = pk::poolOutputShape(c.xs, c.k, c.s, c.p,
                                                                                                 Dims{}, ceil);
  const auto x = bf16 ? bf16Rounded(withTies(randomValues(c.xs.numel()))) : withTies(randomValues(c.xs.numel()));
  const auto dy = bf16 ? bf16Rounded(randomValues(ys.numel())) : randomValues(ys.numel());
  const auto ady = bf16 ? bf16Rounded(randomValues(as.numel())) : randomValues(as.numel());
  const std::vector<T> xf = stored(x), dyf = stored(dy), adyf = stored(ady);
  Guarded<T> xg(stored(moveChannels(x, c.xs, true)), offset), dyg(stored(moveChannels(dy, ys, true)), offset),
      adyg(stored(moveChannels(ady, as, true)), offset);
  // max pool and its gradient
  Guarded<T> y(ys.numel(), offset), dx(c.xs.numel(), offset);
  Guarded<float> scratch((size_t)(pk::poolScratch(pk::ScratchTarget::Cuda, xl, c.k, c.s, c.p, c.d, ceil, true, true)
                                      .shared / 4 + 1));
  const pk::Workspace ws =
      planned ? pk::Workspace{scratch.data(), (int64_t)(scratch.all.size() - 2 * Guarded<float>::kGuard) * 4}
              : pk::Workspace{};
  pc::maxPool(xg.data(), xl, y.data(), c.k, c.s, c.p, c.d, ceil, true);
  pc::maxPoolGrad(dyg.data(), xg.data(), xl, dx.data(), c.k, c.s, c.p, c.d, ceil, ws, true);
  std::vector<T> yFirst(ys.numel()), dxFirst(c.xs.numel());
  pc::maxPool(xf.data(), c.xs, yFirst.data(), c.k, c.s, c.p, c.d, ceil);
  pc::maxPoolGrad(dyf.data(), xf.data(), c.xs, dxFirst.data(), c.k, c.s, c.p, c.d, ceil);
  // average pool (count_include_pad both ways) and its gradient
  for (bool cip : {false, true}) {
    Guarded<T> ay(as.numel(), offset), adx(c.xs.numel(), offset);
    pc::averagePool(xg.data(), xl, ay.data(), c.k, c.s, c.p, ceil, cip, true);
    pc::averagePoolGrad(adyg.data(), adx.data(), xl, c.k, c.s, c.p, ceil, cip, true);
    std::vector<T> ayFirst(as.numel()), adxFirst(c.xs.numel());
    pc::averagePool(xf.data(), c.xs, ayFirst.data(), c.k, c.s, c.p, ceil, cip);
    pc::averagePoolGrad(adyf.data(), adxFirst.data(), c.xs, c.k, c.s, c.p, ceil, cip);
    pc::raiseDeviceErrors();
    expectSame(moveChannels(ay.values(), as, false), ayFirst, cip ? "average y (count_include_pad)" : "average y");
    expectSame(moveChannels(adx.values(), c.xs, false), adxFirst, "average dx");
    expect(ay.intact() && adx.intact(), "an average pool wrote outside its output");
    std::vector<float> ayc(as.numel()), adxc(c.xs.numel());
    pk::averagePool(x.data(), c.xs, ayc.data(), c.k, c.s, c.p, ceil, cip);
    pk::averagePoolGrad(ady.data(), adxc.data(), c.xs, c.k, c.s, c.p, ceil, cip);
    near(values(moveChannels(ay.values(), as, false)), ayc, "average y against the CPU");
    near(values(moveChannels(adx.values(), c.xs, false)), adxc, "average dx against the CPU");
  }
  pc::raiseDeviceErrors();
  expectSame(moveChannels(y.values(), ys, false), yFirst, "max y");
  expectSame(moveChannels(dx.values(), c.xs, false), dxFirst, "max dx");
  expect(y.intact() && dx.intact() && scratch.intact(), "a max pool wrote outside its output or workspace");
  std::vector<float> yc(ys.numel()), dxc(c.xs.numel());
  pk::maxPool(x.data(), c.xs, yc.data(), c.k, c.s, c.p, c.d, ceil);
  pk::maxPoolGrad(dy.data(), x.data(), c.xs, dxc.data(), c.k, c.s, c.p, c.d, ceil);
  near(values(moveChannels(y.values(), ys, false)), yc, "max y against the CPU");
  near(values(moveChannels(dx.values(), c.xs, false)), dxc, "max dx against the CPU");
}

template <class T> static void runGlobalPool(const Shape &xs, int offset) {
  constexpr bool bf16 = std::is_same_v<T, pc::bf16>;
  const auto x = bf16 ? bf16Rounded(randomValues(xs.numel())) : randomValues(xs.numel());
  const int64_t planes = xs.v[0] * xs.v[1];
  const std::vector<float> xl = moveChannels(x, xs, true);
  Guarded<T> xg(std::vector<T>(xl.begin(), xl.end()), offset), y(planes, offset);
  pc::globalAveragePool(xg.data(), channelsLastShape(xs), y.data(), true);
  pc::raiseDeviceErrors();
  std::vector<float> yc(planes), got;
  pk::globalAveragePool(x.data(), xs, yc.data());
  for (const T &e : y.values()) got.push_back((float)e); // [N, 1..., C] and [N, C, 1...] agree
  expectNear(got, yc, bf16 ? 1.0 / 256 : 1e-6, "global average y");
  expect(y.intact(), "the global average pool wrote outside its output");
}

static void testPools() {
  for (const PoolCase &c : kPoolCases) {
    ctx = c.str() + " scratch";
    expect(pk::poolScratch(pk::ScratchTarget::Cuda, channelsLastShape(c.xs), c.k, c.s, c.p, c.d, false, true, true).shared ==
               pk::poolScratch(pk::ScratchTarget::Cuda, c.xs, c.k, c.s, c.p, c.d, false, true).shared,
           "the channels-last arg max is not the channels-first one's size");
    bool refused = false;
    try {
      pk::poolScratch(pk::ScratchTarget::Cpu, channelsLastShape(c.xs), c.k, c.s, c.p, c.d, false, true, true);
    } catch (const pk::KernelError &) {
      refused = true;
    }
    expect(refused, "the CPU scratch query took channels-last shapes");
    for (bool ceil : {false, true})
      for (int offset : {0, 1}) {
        const std::string what = c.str() + (ceil ? " ceil" : "") + (offset ? " unaligned" : "");
        ctx = what + " float";
        runPool<float>(c, ceil, offset, offset == 0);
        ctx = what + " bf16";
        runPool<pc::bf16>(c, ceil, offset, offset != 0);
      }
  }
  for (const Shape &xs : {Shape{2, 3, 5}, Shape{2, 7, 30, 30}, Shape{1, 33, 4, 3, 2}, Shape{3, 40, 7, 7},
                          Shape{2, 8, 2, 3, 2, 2}})
    for (int offset : {0, 1}) {
      ctx = "global average pool " + xs.str() + (offset ? " unaligned" : "");
      runGlobalPool<float>(xs, offset);
      runGlobalPool<pc::bf16>(xs, offset);
    }
}

int main() {
  emu::expectedStream = (cudaStream_t)(void *)0x5150;
  try {
    testConvolutions();
    testChannelsFirstSpelledOut();
    pc::StreamScope scope((void *)0x5150, P::F32);
    testPools();
  } catch (const std::exception &e) {
    std::printf("EXCEPTION (%s): %s\n", ctx.c_str(), e.what());
    ++emucheck::failures;
  }
  return emucheck::finish();
}
