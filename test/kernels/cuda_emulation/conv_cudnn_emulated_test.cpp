// cuda-conv-cudnn-emulated: nn.conv, nn.conv_input_grad and
// nn.conv_weight_grad of pipec's CUDA library through cuDNN's convolution
// graphs (runtime/kernels/cuda/src/conv_cudnn.cu) under the host emulation
// (emu.h, the fake cudnn_frontend in inc/, which checks every tensor's dims,
// strides and type, the pads, strides and dilations against the output size,
// and runs a host reference through the strides), against the CPU kernels:
//   - every variant the importer accepts: 1-D (seen by cuDNN as 2-D of
//     height 1), 2-D and 3-D, groups and depthwise, dilations, strides,
//     asymmetric pads, pointwise, trailing input a stride skips, with and
//     without a bias; in the TF32 and BF16 precisions each call is one cuDNN
//     graph execution and no GEMM (the weight gradient of every sample in
//     that one call), in a workspace of the planned scratch (NaN-filled and
//     guarded) or none;
//   - where cuDNN must not run, pipec's im2col kernels run and still match:
//     the F32 precision (which must equal the CPU kernels as before),
//     PIPEC_CUDNN_CONV=0, and operands that are not 16-byte aligned;
//   - bf16 storage: cuDNN's bf16 graphs (y, dx and dw rounded to bf16, dw
//     widened into its float buffer), and on widened float32 copies where
//     the bf16 graphs must not run (unaligned: cuDNN's float graphs;
//     PIPEC_CUDNN_CONV=0: pipec's kernels);
//   - the weight gradient added into a buffer (accumulate), bit for bit the
//     buffer plus the gradient, in every one of those cases.
#include "pipec/cuda_kernels.h"
#include "pipec/cpu_kernels.h"
#include "pipec/kernel_scratch.h"
#include "cuda_runtime.h"
#include "emu.h"
#include "emulated_checks.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

namespace pk = pipec::kernels;
namespace pc = pipec::kernels::cuda;
using pk::Dims;
using pk::Shape;
using emucheck::ctx;
using emucheck::expect;
using emucheck::expectNear;

static std::mt19937_64 rng(777);
/// Random values in [-1, 1].
static std::vector<float> randomValues(int64_t n) { return emucheck::uniformValues(rng, n); }
/// The fake cuDNN sums in double, the CPU kernels in float.
constexpr double kTolerance = 2e-5;
/// Two roundings to bf16 on top of that (half an ulp, 2^-9 relative, each):
/// the convolution's result, then the bias added to it by a kernel of its own.
constexpr double kBf16Tolerance = 2.0 / 256;

/// Who must run a bf16-storage call: cuDNN's bf16 graphs; cuDNN's float
/// graphs on aligned float32 copies (the operands are not aligned); or
/// pipec's float kernels on the copies (PIPEC_CUDNN_CONV=0).
enum class Bf16Path { Bf16Graphs, FloatGraphsOnCopies, FloatKernelsOnCopies };

struct Case {
  Shape xs, ws;
  Dims s, p, d;
  int64_t g;
  bool bias;
  std::string str() const {
    return "x " + xs.str() + " w " + ws.str() + " group " + std::to_string(g) + (bias ? " bias" : "");
  }
};

const Case kCases[] = {
    {{2, 3, 7, 6}, {4, 3, 3, 3}, {1, 1}, {1, 1, 1, 1}, {1, 1}, 1, true},   // 2-D, same padding
    {{2, 4, 9, 8}, {6, 2, 3, 2}, {2, 1}, {0, 1, 2, 0}, {1, 1}, 2, false},  // groups, stride, asymmetric pads
    {{1, 6, 10, 9}, {6, 1, 3, 3}, {1, 2}, {2, 2, 2, 2}, {2, 2}, 6, true},  // depthwise, dilated
    {{3, 4, 11}, {5, 4, 3}, {2}, {1, 0}, {1}, 1, true},                    // 1-D
    {{5, 6, 4}, {6, 2, 2}, {3}, {2, 2}, {3}, 3, false},                    // 1-D grouped, dilated, strided
    {{2, 2, 5, 6, 4}, {3, 2, 2, 3, 2}, {1, 2, 1}, {0, 1, 1, 0, 1, 0}, {1, 1, 2}, 1, true}, // 3-D
    {{2, 8, 5, 5}, {4, 8, 1, 1}, {1, 1}, {0, 0, 0, 0}, {1, 1}, 1, false},  // pointwise
    {{1, 2, 6, 6}, {2, 2, 3, 3}, {2, 2}, {0, 0, 0, 0}, {1, 1}, 1, true}};  // a trailing row and column unread

/// A buffer with NaN-filled guards of 64 floats around it.
struct Guarded {
  static constexpr size_t kGuard = 64;
  explicit Guarded(size_t n, float fill = NAN) : all(n + 2 * kGuard, fill) {
    for (size_t i = 0; i < kGuard; ++i) all[i] = all[all.size() - 1 - i] = 12345.0f;
  }
  float *data() { return all.data() + kGuard; }
  std::vector<float> values() const { return std::vector<float>(all.begin() + kGuard, all.end() - kGuard); }
  bool intact() const {
    for (size_t i = 0; i < kGuard; ++i)
      if (all[i] != 12345.0f || all[all.size() - 1 - i] != 12345.0f) return false;
    return true;
  }
  std::vector<float> all;
};

/// `got` is `held` plus `dw` element by element, bit for bit: the weight
/// gradient added into a gradient buffer (accumulate) as if written
/// elsewhere and added.
static void expectAddedInto(const std::vector<float> &got, const std::vector<float> &held,
                            const std::vector<float> &dw) {
  bool same = got.size() == dw.size();
  for (size_t i = 0; same && i < got.size(); ++i) same = got[i] == held[i] + dw[i];
  expect(same, "dw accumulated is not the buffer plus dw");
}

/// One case's three calls on the CUDA kernels in `precision`, against the
/// CPU kernels; `cudnn`: whether cuDNN must run them (else it must not);
/// `offset`: operands placed that many floats past a 16-byte boundary;
/// `planned`: each call given a workspace of its planned scratch.
static void runCase(const Case &c, pipec::Precision precision, bool cudnn, int offset, bool planned) {
  void *fakeStream = (void *)0x5150;
  pc::StreamScope scope(fakeStream, precision);
  const Shape ys = pk::convOutputShape(c.xs, c.ws, c.s, c.p, c.d);
  const auto x = randomValues(c.xs.numel()), w = randomValues(c.ws.numel()), b = randomValues(c.ws.v[0]),
             dy = randomValues(ys.numel());
  // Operands at `offset` floats into a 16-byte aligned buffer (vector data is).
  auto placed = [&](const std::vector<float> &v) {
    std::vector<float> out((size_t)offset, 0.0f);
    out.insert(out.end(), v.begin(), v.end());
    return out;
  };
  std::vector<float> xp = placed(x), wp = placed(w), dyp = placed(dy);
  Guarded y(ys.numel() + offset), dx(c.xs.numel() + offset), dw(c.ws.numel() + offset);
  auto scratchFor = [&](const pk::ScratchNeed &need) { return Guarded((size_t)(need.shared / 4 + 1)); };
  const pk::ScratchTarget cuda = pk::ScratchTarget::Cuda;
  Guarded fwdScratch = scratchFor(pk::convScratch(cuda, c.xs, c.ws, c.s, c.p, c.d, c.g)),
          inScratch = scratchFor(pk::convInputGradScratch(cuda, c.xs, c.ws, c.s, c.p, c.d, c.g)),
          wScratch = scratchFor(pk::convWeightGradScratch(cuda, c.xs, c.ws, c.s, c.p, c.d, c.g));
  auto workspace = [&](Guarded &s) {
    return planned ? pk::Workspace{s.data(), (int64_t)(s.all.size() - 2 * Guarded::kGuard) * 4} : pk::Workspace{};
  };
  const long executes = emu::cudnnExecutes;
  const int gemms = emu::gemmCalls;
  pc::conv(xp.data() + offset, c.xs, wp.data() + offset, c.ws, c.bias ? b.data() : nullptr, y.data() + offset, c.s,
           c.p, c.d, c.g, workspace(fwdScratch));
  pc::convInputGrad(dyp.data() + offset, ys, wp.data() + offset, c.ws, dx.data() + offset, c.xs, c.s, c.p, c.d, c.g,
                    workspace(inScratch));
  pc::convWeightGrad(dyp.data() + offset, ys, xp.data() + offset, c.xs, dw.data() + offset, c.ws, c.s, c.p, c.d,
                     c.g, workspace(wScratch));
  pc::raiseDeviceErrors();
  const long ran = emu::cudnnExecutes - executes;
  expect(ran == (cudnn ? 3 : 0), "cuDNN ran " + std::to_string(ran) + " graphs, expected " + (cudnn ? "3" : "none"));
  const std::vector<float> held = randomValues(c.ws.numel());
  std::vector<float> added = placed(held);
  pc::convWeightGrad(dyp.data() + offset, ys, xp.data() + offset, c.xs, added.data() + offset, c.ws, c.s, c.p, c.d,
                     c.g, workspace(wScratch), /*accumulate=*/true);
  pc::raiseDeviceErrors();
  {
    const std::vector<float> dwv = dw.values();
    expectAddedInto(std::vector<float>(added.begin() + offset, added.end()), held,
                    std::vector<float>(dwv.begin() + offset, dwv.end()));
  }
  if (cudnn) expect(emu::gemmCalls == gemms, "cuDNN's calls ran " + std::to_string(emu::gemmCalls - gemms) + " GEMMs");
  expect(y.intact() && dx.intact() && dw.intact() && fwdScratch.intact() && inScratch.intact() && wScratch.intact(),
         "a call wrote outside its output or workspace");
  std::vector<float> yc(ys.numel()), dxc(c.xs.numel()), dwc(c.ws.numel());
  pk::conv(x.data(), c.xs, w.data(), c.ws, c.bias ? b.data() : nullptr, yc.data(), c.s, c.p, c.d, c.g);
  pk::convInputGrad(dy.data(), ys, w.data(), c.ws, dxc.data(), c.xs, c.s, c.p, c.d, c.g);
  pk::convWeightGrad(dy.data(), ys, x.data(), c.xs, dwc.data(), c.ws, c.s, c.p, c.d, c.g);
  auto tail = [&](const Guarded &g) {
    std::vector<float> v = g.values();
    return std::vector<float>(v.begin() + offset, v.end());
  };
  expectNear(tail(y), yc, kTolerance, "y");
  expectNear(tail(dx), dxc, kTolerance, "dx");
  expectNear(tail(dw), dwc, kTolerance, "dw");
}

/// bf16 storage: x, w, dy rounded to bf16 (the CPU kernels get the same
/// values in float), y and dx in bf16, dw in float, run by `path`;
/// `offset`: operands that many bf16 past a 16-byte boundary.
static void runBf16Case(const Case &c, Bf16Path path, int offset) {
  const bool cudnn = path != Bf16Path::FloatKernelsOnCopies;
  void *fakeStream = (void *)0x5150;
  pc::StreamScope scope(fakeStream, pipec::Precision::BF16);
  const Shape ys = pk::convOutputShape(c.xs, c.ws, c.s, c.p, c.d);
  auto rounded = [](std::vector<float> v) {
    for (float &e : v) e = (float)pc::bf16(e);
    return v;
  };
  const auto x = rounded(randomValues(c.xs.numel())), w = rounded(randomValues(c.ws.numel())),
             b = randomValues(c.ws.v[0]), dy = rounded(randomValues(ys.numel()));
  auto placed = [&](const std::vector<float> &v, size_t room) {
    std::vector<pc::bf16> out((size_t)offset + room, pc::bf16(NAN));
    for (size_t i = 0; i < v.size(); ++i) out[(size_t)offset + i] = pc::bf16(v[i]);
    return out;
  };
  std::vector<pc::bf16> xb = placed(x, x.size()), wb = placed(w, w.size()), dyb = placed(dy, dy.size()),
                        y = placed({}, (size_t)ys.numel()), dx = placed({}, (size_t)c.xs.numel());
  Guarded dw(c.ws.numel());
  const long executes = emu::cudnnExecutes;
  const int gemms = emu::gemmCalls;
  pc::conv(xb.data() + offset, c.xs, wb.data() + offset, c.ws, c.bias ? b.data() : nullptr, y.data() + offset, c.s,
           c.p, c.d, c.g);
  pc::convInputGrad(dyb.data() + offset, ys, wb.data() + offset, c.ws, dx.data() + offset, c.xs, c.s, c.p, c.d, c.g);
  pc::convWeightGrad(dyb.data() + offset, ys, xb.data() + offset, c.xs, dw.data(), c.ws, c.s, c.p, c.d, c.g);
  pc::raiseDeviceErrors();
  const long ran = emu::cudnnExecutes - executes;
  expect(ran == (cudnn ? 3 : 0), "cuDNN ran " + std::to_string(ran) + " graphs, expected " + (cudnn ? "3" : "none"));
  const std::vector<float> held = randomValues(c.ws.numel());
  std::vector<float> added = held;
  pc::convWeightGrad(dyb.data() + offset, ys, xb.data() + offset, c.xs, added.data(), c.ws, c.s, c.p, c.d, c.g, {},
                     /*accumulate=*/true);
  pc::raiseDeviceErrors();
  expectAddedInto(added, held, dw.values());
  if (cudnn) expect(emu::gemmCalls == gemms, "cuDNN's calls ran " + std::to_string(emu::gemmCalls - gemms) + " GEMMs");
  else expect(emu::gemmCalls > gemms, "the float kernels ran no GEMM");
  expect(dw.intact(), "the weight gradient was written outside its buffer");
  std::vector<float> yc(ys.numel()), dxc(c.xs.numel()), dwc(c.ws.numel());
  pk::conv(x.data(), c.xs, w.data(), c.ws, c.bias ? b.data() : nullptr, yc.data(), c.s, c.p, c.d, c.g);
  pk::convInputGrad(dy.data(), ys, w.data(), c.ws, dxc.data(), c.xs, c.s, c.p, c.d, c.g);
  pk::convWeightGrad(dy.data(), ys, x.data(), c.xs, dwc.data(), c.ws, c.s, c.p, c.d, c.g);
  auto widened = [&](const std::vector<pc::bf16> &v) {
    std::vector<float> out;
    for (size_t i = (size_t)offset; i < v.size(); ++i) out.push_back((float)v[i]);
    return out;
  };
  // y and dx are rounded to bf16; dw too where cuDNN's bf16 graph computed
  // it, as its bf16 configuration does, else it is float32's.
  expectNear(widened(y), yc, kBf16Tolerance, "bf16 y");
  expectNear(widened(dx), dxc, kBf16Tolerance, "bf16 dx");
  expectNear(dw.values(), dwc, path == Bf16Path::Bf16Graphs ? kBf16Tolerance : kTolerance, "bf16 dw");
}

int main() {
  emu::expectedStream = (cudaStream_t)(void *)0x5150;
  using P = pipec::Precision;
  for (const Case &c : kCases) {
    for (P precision : {P::TF32, P::BF16})
      for (bool planned : {true, false}) {
        ctx = c.str() + (precision == P::TF32 ? " tf32" : " bf16") + (planned ? " planned workspace" : "");
        runCase(c, precision, true, 0, planned);
      }
    ctx = c.str() + " f32";
    runCase(c, P::F32, false, 0, true);
    ctx = c.str() + " unaligned";
    runCase(c, P::TF32, false, 1, true);
    ctx = c.str() + " PIPEC_CUDNN_CONV=0";
    setenv("PIPEC_CUDNN_CONV", "0", 1);
    runCase(c, P::TF32, false, 0, true);
    ctx = c.str() + " bf16 storage, PIPEC_CUDNN_CONV=0";
    runBf16Case(c, Bf16Path::FloatKernelsOnCopies, 0);
    unsetenv("PIPEC_CUDNN_CONV");
    ctx = c.str() + " bf16 storage";
    runBf16Case(c, Bf16Path::Bf16Graphs, 0);
    ctx = c.str() + " bf16 storage, unaligned";
    runBf16Case(c, Bf16Path::FloatGraphsOnCopies, 1);
  }
  return emucheck::finish();
}
