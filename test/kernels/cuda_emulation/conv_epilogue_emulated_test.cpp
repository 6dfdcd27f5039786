// cuda-conv-epilogue-emulated: nn.conv's epilogue, y = f(conv(x, w) + bias +
// residual) with f none, ReLU or ReLU6, inside cuDNN's forward graph
// (runtime/kernels/cuda/src/conv_cudnn.cu: conv_fprop, then pointwise ADDs
// of the float bias seen as [1, F, 1...] and of the residual, then
// RELU_FWD, ReLU6 with an upper clip of 6; docs/cuda-kernels.md,
// "Convolutions (cuDNN)") under the host emulation (emu.h, the fake
// cudnn_frontend in inc/, which checks the pointwise nodes and their
// tensors), against the CPU kernels (conv, then + residual, then f),
// channels-first and channels-last, float storage in the TF32 and BF16
// precisions and bf16 storage, 1-D to 3-D, groups and depthwise:
//   - every subset of the epilogue fused: one cuDNN execution that applies
//     all of it and no kernel launch, the graph's tensors (the residual's
//     too) in the layout's strides, y within the tolerance (bf16 storage:
//     rounded once);
//   - a bias that is not 16-byte aligned: the plain graph, then the
//     epilogue kernel (one launch); an unaligned residual after an aligned
//     bias: the bias in the graph, the rest in the kernel;
//   - the fused graph refused (emu::refuseConvPointwise, as cuDNN with no
//     engine for a shape): the plain graph and exactly one epilogue kernel,
//     the same results, said once on stderr naming the epilogue, and the
//     refusal kept for the shape (a later call does not build it again);
//   - PIPEC_CUDNN_CONV=0: pipec's own kernels (on float copies for bf16
//     storage and channels-last), the epilogue applied in float, y rounded
//     once;
//   - an activation the epilogue does not apply (Tanh): KernelError;
//   - the fake frontend itself: it takes conv_cudnn.cu's chains (any subset,
//     in order) and refuses what cuDNN refuses or it does not emulate.
#include "pipec/cuda_kernels.h"
#include "pipec/cpu_kernels.h"
#include "cuda_runtime.h"
#include "emu.h"
#include "cudnn_frontend.h" // emu::lastConvTensors, emu::refuseConvPointwise (after emu.h, which it uses)
#include "emulated_checks.h"
#include "channels_last_layout.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <type_traits>
#include <unistd.h>
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
using pk::Unary;
using P = pipec::Precision;

static std::mt19937_64 rng(4711);
/// Random values in [-1, 1].
static std::vector<float> randomValues(int64_t n) { return emucheck::uniformValues(rng, n); }
/// The fake cuDNN sums in double, the CPU kernels in float.
constexpr double kTolerance = 2e-5;
/// One rounding to bf16 (half an ulp, at most 2^-8 relative): the graph's
/// output, or pipec's kernels on float copies.
constexpr double kBf16Once = 1.0 / 256 + kTolerance;
/// Two: the plain graph's y, then the epilogue kernel's. The first rounding
/// is of conv + bias, before the residual: its error is relative to that
/// value (expectTwice), which a residual may cancel.
constexpr double kBf16Twice = 2.0 / 256;

/// What `call` wrote on stderr.
template <class F> static std::string capturedStderr(F &&call) {
  std::fflush(stderr);
  FILE *file = std::tmpfile();
  const int saved = dup(2);
  dup2(fileno(file), 2);
  call();
  std::fflush(stderr);
  dup2(saved, 2);
  close(saved);
  std::rewind(file);
  std::string text;
  for (int ch; (ch = std::fgetc(file)) != EOF;) text += (char)ch;
  std::fclose(file);
  return text;
}
static int occurrences(const std::string &text, const std::string &what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

struct Case {
  Shape xs, ws; // channels-first
  Dims s, p, d;
  int64_t g;
  std::string str() const { return "x " + xs.str() + " w " + ws.str() + " group " + std::to_string(g); }
  /// The same with `more` samples more: a shape no plan was built for yet
  /// (the float storage's two precisions share their plans).
  Case another(int more) const {
    Case c = *this;
    c.xs.v[0] += more;
    return c;
  }
  Shape ys() const { return pk::convOutputShape(xs, ws, s, p, d); }
};

const Case kCases[] = {
    {{2, 3, 7, 6}, {4, 3, 3, 3}, {1, 1}, {1, 1, 1, 1}, {1, 1}, 1},                 // 2-D, same padding
    {{2, 4, 9, 8}, {6, 2, 3, 2}, {2, 1}, {0, 1, 2, 0}, {1, 1}, 2},                 // groups, stride, asymmetric pads
    {{1, 6, 10, 9}, {6, 1, 3, 3}, {1, 2}, {2, 2, 2, 2}, {2, 2}, 6},                // depthwise, dilated
    {{3, 4, 11}, {5, 4, 3}, {2}, {1, 0}, {1}, 1},                                  // 1-D
    {{2, 2, 5, 6, 4}, {3, 2, 2, 3, 2}, {1, 2, 1}, {0, 1, 1, 0, 1, 0}, {1, 1, 2}, 1}, // 3-D
    {{2, 7, 6, 5}, {33, 7, 3, 3}, {1, 1}, {1, 1, 1, 1}, {1, 1}, 1},                // 7 -> 33 channels
    {{1, 40, 9, 8}, {36, 40, 1, 1}, {1, 1}, {0, 0, 0, 0}, {1, 1}, 1},              // pointwise, 36 channels
    {{2, 3, 5, 5}, {1, 3, 3, 3}, {1, 1}, {0, 0, 0, 0}, {1, 1}, 1},                 // one output channel
};

/// Which parts an epilogue has (or a graph applied).
struct Parts {
  bool bias = false, residual = false;
  std::optional<Unary> activation;
  bool empty() const { return !bias && !residual && !activation; }
  /// As conv_cudnn.cu names them: "bias + residual + relu".
  std::string str() const {
    std::string s;
    auto part = [&](bool present, const char *name) {
      if (present) s += (s.empty() ? "" : " + ") + std::string(name);
    };
    part(bias, "bias");
    part(residual, "residual");
    part(activation == Unary::Relu, "relu");
    part(activation == Unary::Relu6, "relu6");
    return s.empty() ? "no epilogue" : s;
  }
};
/// Every subset of the epilogue.
static std::vector<Parts> everyEpilogue() {
  std::vector<Parts> all;
  for (bool bias : {false, true})
    for (bool residual : {false, true})
      for (std::optional<Unary> f : {std::optional<Unary>(), std::optional<Unary>(Unary::Relu),
                                     std::optional<Unary>(Unary::Relu6)})
        all.push_back({bias, residual, f});
  return all;
}

/// One call's operands, channels-first, in float (bf16 values for bf16
/// storage); `bias` holds F + 1 values: [0] is 16-byte aligned, [1] not.
/// The bias in [-4, 4] and the residual in [-6, 6], so that ReLU6 clips at
/// both ends.
struct Operands {
  std::vector<float> x, w, bias, residual;
};
template <class T> static Operands operandsOf(const Case &c) {
  constexpr bool bf16 = std::is_same_v<T, pc::bf16>;
  auto values = [&](int64_t n, float scale) {
    std::vector<float> v = randomValues(n);
    for (float &e : v) e *= scale;
    return bf16 ? bf16Rounded(v) : v;
  };
  std::vector<float> bias = randomValues(c.ws.v[0] + 1);
  for (float &b : bias) b *= 4;
  return {values(c.xs.numel(), 1), values(c.ws.numel(), 1), bias, values(c.ys().numel(), 6)};
}

/// What one call did, and its y channels-first in float.
struct Outcome {
  std::vector<float> y;
  long executes = 0;
  int launches = 0;
  emu::ConvTensors graph; // what the last graph executed applied
  std::string stderrText;
};

/// How one call is made: the epilogue's parts, and where its bias and
/// residual start in their buffers (an offset of one element: not 16-byte
/// aligned).
struct Call {
  Parts parts;
  int biasOffset = 0, residualOffset = 0;
};

/// One forward on T storage in `precision`, layout `channelsLast`.
template <class T>
static Outcome runForward(const Case &c, bool channelsLast, P precision, const Operands &o, const Call &call) {
  pc::StreamScope scope((void *)0x5150, precision);
  const Shape ys = c.ys();
  auto stored = [&](const std::vector<float> &v, const Shape &first, size_t pad) {
    const std::vector<float> laid = channelsLast ? moveChannels(v, first, true) : v;
    std::vector<T> out(laid.size() + pad, T(NAN));
    std::copy(laid.begin(), laid.end(), out.begin() + (std::ptrdiff_t)pad);
    return out;
  };
  const std::vector<T> xt = stored(o.x, c.xs, 0), wt = stored(o.w, c.ws, 0);
  const std::vector<T> rt = stored(o.residual, ys, (size_t)call.residualOffset);
  std::vector<T> y((size_t)ys.numel(), T(NAN));
  const Shape xp = channelsLast ? channelsLastShape(c.xs) : c.xs, wp = channelsLast ? channelsLastShape(c.ws) : c.ws;
  const float *bias = call.parts.bias ? o.bias.data() + call.biasOffset : nullptr;
  const T *residual = call.parts.residual ? rt.data() + call.residualOffset : nullptr;
  Outcome out;
  emu::lastConvTensors = {};
  const long executes = emu::cudnnExecutes;
  const int launches = emu::launches;
  out.stderrText = capturedStderr([&] {
    pc::conv(xt.data(), xp, wt.data(), wp, bias, y.data(), c.s, c.p, c.d, c.g, pk::Workspace{}, channelsLast,
             residual, call.parts.activation);
    pc::raiseDeviceErrors();
  });
  out.executes = emu::cudnnExecutes - executes;
  out.launches = emu::launches - launches;
  out.graph = emu::lastConvTensors;
  for (int t = 0; t < 3 && out.executes == 1; ++t) {
    const auto &dims = out.graph.dims[t];
    expect(!dims.empty() && out.graph.strides[t] == stridesOf(dims, channelsLast),
           "tensor " + std::to_string(t) + " has not the " + (channelsLast ? "channels-last" : "channels-first") +
               " strides");
  }
  if (out.graph.residual)
    expect(out.graph.residualStrides == stridesOf(out.graph.dims[2], channelsLast),
           "the residual has not the layout's strides");
  const std::vector<float> widened(y.begin(), y.end());
  out.y = channelsLast ? moveChannels(widened, ys, false) : widened;
  return out;
}

/// The reference values ReLU6 clipped at 6 (the test must reach the clip).
static long clippedAtSix = 0;

/// The CPU kernels' y: conv (with the bias), then + residual, then f;
/// `before` (if not null): conv + bias.
static std::vector<float> reference(const Case &c, const Operands &o, const Call &call,
                                    std::vector<float> *before = nullptr) {
  std::vector<float> y(c.ys().numel());
  pk::conv(o.x.data(), c.xs, o.w.data(), c.ws, call.parts.bias ? o.bias.data() + call.biasOffset : nullptr,
           y.data(), c.s, c.p, c.d, c.g);
  if (before) *before = y;
  for (size_t i = 0; i < y.size(); ++i) {
    float v = y[i];
    if (call.parts.residual) v += o.residual[i];
    if (call.parts.activation == Unary::Relu) v = v <= 0.0f ? 0.0f : v;
    if (call.parts.activation == Unary::Relu6) v = v <= 0.0f ? 0.0f : v >= 6.0f ? 6.0f : v;
    if (call.parts.activation == Unary::Relu6 && v == 6.0f) ++clippedAtSix;
    y[i] = v;
  }
  return y;
}

/// got against want within tol · (1 + |want| + |before|): a y rounded
/// twice, the first time as `before` (conv + bias).
static void expectTwice(const std::vector<float> &got, const std::vector<float> &want,
                        const std::vector<float> &before, double tol) {
  ++emucheck::checks;
  for (size_t i = 0; i < got.size(); ++i)
    if (!(std::fabs((double)got[i] - want[i]) <= tol * (1 + std::fabs((double)want[i]) + std::fabs((double)before[i])))) {
      char buf[200];
      std::snprintf(buf, sizeof buf, "y: [%zu] CUDA %.9g, CPU %.9g (before the residual %.9g)", i, (double)got[i],
                    (double)want[i], (double)before[i]);
      return emucheck::fail(buf);
    }
  if (got.size() != want.size()) emucheck::fail("y: sizes differ");
}

/// A call ran `executes` cuDNN graphs (0 or 1) and `launches` kernels, the
/// graph applying the epilogue's `fused` parts.
static void expectRun(const Outcome &o, long executes, int launches, const Parts &fused) {
  expect(o.executes == executes,
         "cuDNN ran " + std::to_string(o.executes) + " graphs, expected " + std::to_string(executes));
  if (launches >= 0)
    expect(o.launches == launches,
           std::to_string(o.launches) + " kernel launches, expected " + std::to_string(launches));
  if (executes == 0) return;
  const emu::ConvTensors &g = o.graph;
  const Parts applied{g.bias, g.residual, g.relu ? std::optional<Unary>(g.reluUpper == 6.0f ? Unary::Relu6 : Unary::Relu)
                                                 : std::nullopt};
  expect(applied.str() == fused.str(), "the graph applied " + applied.str() + ", expected " + fused.str());
  if (g.relu)
    expect(g.reluLower == 0.0f && (g.reluUpper == 6.0f || g.reluUpper == std::numeric_limits<float>::max()),
           "the RELU_FWD's clips are not ReLU's or ReLU6's");
}

/// The parts of `p` a graph applies when the first unaligned one stops it.
static Parts leadingParts(const Parts &p, bool biasAligned, bool residualAligned) {
  Parts fused;
  if (p.bias && !biasAligned) return fused;
  fused.bias = p.bias;
  if (p.residual && !residualAligned) return fused;
  fused.residual = p.residual;
  fused.activation = p.activation;
  return fused;
}

/// Every way of one case in one layout and storage. `more`: the samples
/// added to the shape whose fused graphs are refused.
template <class T> static void runCase(const Case &c, bool channelsLast, P precision, int more) {
  constexpr bool bf16 = std::is_same_v<T, pc::bf16>;
  const std::string what = c.str() + (channelsLast ? " channels-last" : " channels-first") +
                           (bf16 ? " bf16 storage" : precision == P::TF32 ? " tf32" : " bf16 precision");
  const double fusedTolerance = bf16 ? kBf16Once : kTolerance, plainTolerance = bf16 ? kBf16Twice : kTolerance;
  const std::vector<Parts> epilogues = everyEpilogue();
  {
    const Operands o = operandsOf<T>(c);
    for (const Parts &parts : epilogues) {
      ctx = what + ", " + parts.str() + " fused";
      const Call call{parts};
      const Outcome fused = runForward<T>(c, channelsLast, precision, o, call);
      expectRun(fused, 1, 0, parts);
      expectNear(fused.y, reference(c, o, call), fusedTolerance, "y");
      expect(fused.stderrText.empty(), "said on stderr: " + fused.stderrText);
    }
    // Unaligned: the graph stops at the first unaligned part, the kernel does the rest.
    const Parts all{true, true, Unary::Relu6}, residualRelu{false, true, Unary::Relu};
    for (const Call &call : {Call{all, 1, 0}, Call{all, 0, 1}, Call{residualRelu, 0, 1}}) {
      ctx = what + ", " + call.parts.str() + (call.biasOffset ? ", unaligned bias" : ", unaligned residual");
      const Outcome unaligned = runForward<T>(c, channelsLast, precision, o, call);
      expectRun(unaligned, 1, 1, leadingParts(call.parts, call.biasOffset == 0, call.residualOffset == 0));
      std::vector<float> before;
      const std::vector<float> want = reference(c, o, call, &before);
      expectTwice(unaligned.y, want, before, plainTolerance);
    }
  }
  // The fused graphs refused for a shape not seen yet: said once each, kept.
  const Case other = c.another(more);
  const Operands o = operandsOf<T>(other);
  for (const Parts &parts : epilogues) {
    if (parts.empty()) continue;
    const Call call{parts};
    std::vector<float> before;
    const std::vector<float> want = reference(other, o, call, &before);
    ctx = what + ", " + parts.str() + ", fused graph refused";
    emu::refuseConvPointwise = true;
    const Outcome refused = runForward<T>(other, channelsLast, precision, o, call);
    emu::refuseConvPointwise = false;
    expectRun(refused, 1, 1, Parts{});
    expectTwice(refused.y, want, before, plainTolerance);
    const std::string said = "pipec: cuDNN has no deterministic nn.conv with its epilogue (" + parts.str() + ")";
    expect(occurrences(refused.stderrText, said) == 1 && occurrences(refused.stderrText, "pipec: ") == 1 &&
               occurrences(refused.stderrText, "cuDNN's plain convolution runs it, then pipec's epilogue kernel") == 1,
           "the refusal was not said once on stderr: " + refused.stderrText);
    ctx = what + ", " + parts.str() + ", fused graph refused before";
    const Outcome again = runForward<T>(other, channelsLast, precision, o, call);
    expectRun(again, 1, 1, Parts{});
    expect(again.y == refused.y, "y differs from the first call's");
    expect(again.stderrText.empty(), "said again on stderr: " + again.stderrText);
  }
}

/// PIPEC_CUDNN_CONV=0: pipec's own kernels (on float copies for bf16 storage
/// and channels-last), the epilogue applied in float, y rounded once.
template <class T> static void runOwnKernels(const Case &c, bool channelsLast, P precision) {
  constexpr bool bf16 = std::is_same_v<T, pc::bf16>;
  const std::string what = c.str() + (channelsLast ? " channels-last" : " channels-first") +
                           (bf16 ? " bf16 storage" : precision == P::TF32 ? " tf32" : " bf16 precision");
  const Operands o = operandsOf<T>(c);
  setenv("PIPEC_CUDNN_CONV", "0", 1);
  for (const Parts &parts : everyEpilogue()) {
    ctx = what + ", " + parts.str() + ", pipec's kernels";
    const Call call{parts};
    const Outcome own = runForward<T>(c, channelsLast, precision, o, call);
    expectRun(own, 0, -1, Parts{});
    expectNear(own.y, reference(c, o, call), bf16 ? kBf16Once : kTolerance, "y");
  }
  unsetenv("PIPEC_CUDNN_CONV");
}

/// An activation the epilogue does not apply: KernelError, nothing run.
static void testUnsupportedActivation() {
  const Case &c = kCases[0];
  const Shape ys = c.ys();
  for (bool channelsLast : {false, true})
    for (bool bf16 : {false, true}) {
      ctx = std::string("tanh epilogue, ") + (bf16 ? "bf16" : "float") + (channelsLast ? " channels-last" : "");
      pc::StreamScope scope((void *)0x5150, P::BF16);
      const Shape xp = channelsLast ? channelsLastShape(c.xs) : c.xs, wp = channelsLast ? channelsLastShape(c.ws) : c.ws;
      const long executes = emu::cudnnExecutes;
      const int launches = emu::launches;
      bool threw = false;
      try {
        if (bf16) {
          std::vector<pc::bf16> x(c.xs.numel(), pc::bf16(0.5f)), w(c.ws.numel(), pc::bf16(0.5f)), y(ys.numel());
          pc::conv(x.data(), xp, w.data(), wp, nullptr, y.data(), c.s, c.p, c.d, c.g, pk::Workspace{}, channelsLast,
                   nullptr, Unary::Tanh);
        } else {
          std::vector<float> x(c.xs.numel(), 0.5f), w(c.ws.numel(), 0.5f), y(ys.numel());
          pc::conv(x.data(), xp, w.data(), wp, nullptr, y.data(), c.s, c.p, c.d, c.g, pk::Workspace{}, channelsLast,
                   nullptr, Unary::Tanh);
        }
      } catch (const pk::KernelError &e) {
        threw = std::string(e.what()).find("nn.conv") != std::string::npos;
      }
      expect(threw, "no KernelError naming nn.conv for a tanh epilogue");
      expect(emu::cudnnExecutes == executes && emu::launches == launches, "a tanh epilogue ran something");
    }
}

/// The fake frontend refuses at validate what cuDNN's frontend and backend
/// refuse of a conv + epilogue graph (or what the fake does not emulate),
/// and takes the chains conv_cudnn.cu builds.
namespace fe = cudnn_frontend;
constexpr fe::DataType_t F32 = fe::DataType_t::FLOAT, BF = fe::DataType_t::BFLOAT16;
/// A chain after conv_fprop of a bf16 [1, 2, 4, 4] x and [3, 2, 3, 3] w:
/// `nodes` in order, 'b' an ADD of the bias, 'r' an ADD of the residual,
/// 'm' a MUL of the bias, 'u' a RELU_FWD, 'x' a RELU_FWD given the residual
/// as a second input; each given tensor's uid is 4 + its node's index.
struct Chain {
  std::string what;
  bool taken = false;
  std::string nodes = "bru";
  std::vector<int64_t> biasDims = {1, 3, 1, 1}, residualDims = {1, 3, 4, 4};
  fe::DataType_t biasType = F32, residualType = BF, yType = F32, midType = F32;
  bool yOutput = false, operandFirst = false, clips = true, skipLink = false, sharedUid = false, biasUid = true;
  int64_t outUid = 3;
  float lower = 0, upper = 6;
};
static Chain chain(std::string what, bool taken, const std::function<void(Chain &)> &change = {}) {
  Chain c;
  c.what = std::move(what);
  c.taken = taken;
  if (change) change(c);
  return c;
}

static bool validates(const Chain &spec) {
  using T = fe::graph::Tensor_attributes;
  fe::graph::Graph graph;
  graph.set_io_data_type(BF).set_intermediate_data_type(F32).set_compute_data_type(F32);
  const std::vector<int64_t> yDims = {1, 3, 4, 4};
  auto given = [&](const char *name, int64_t uid, std::vector<int64_t> dims, fe::DataType_t type) {
    T t;
    t.set_name(name).set_dim(dims).set_stride(stridesOf(dims, false)).set_data_type(type);
    if (uid) t.set_uid(uid);
    return graph.tensor(t);
  };
  auto y = graph.conv_fprop(given("x", 1, {1, 2, 4, 4}, BF), given("w", 2, {3, 2, 3, 3}, BF),
                            fe::graph::Conv_fprop_attributes()
                                .set_pre_padding({1, 1})
                                .set_post_padding({1, 1})
                                .set_stride({1, 1})
                                .set_dilation({1, 1})
                                .set_compute_data_type(F32));
  y->set_dim(yDims).set_stride(stridesOf(yDims, false)).set_data_type(spec.yType);
  if (spec.yOutput) y->set_output(true).set_uid(9);
  auto previous = y;
  for (size_t i = 0; i < spec.nodes.size(); ++i) {
    const char node = spec.nodes[i];
    const int64_t uid = spec.sharedUid && i == 1 ? 4 : 4 + (int64_t)i;
    auto in = spec.skipLink && i == 1 ? y : previous;
    auto relu = fe::graph::Pointwise_attributes().set_mode(fe::PointwiseMode_t::RELU_FWD).set_compute_data_type(F32);
    if (spec.clips) relu.set_relu_lower_clip(spec.lower).set_relu_upper_clip(spec.upper);
    std::shared_ptr<T> out;
    if (node == 'u') {
      out = graph.pointwise(in, relu);
    } else if (node == 'x') {
      out = graph.pointwise(in, given("residual", uid, spec.residualDims, spec.residualType), relu);
    } else {
      auto operand = node == 'r' ? given("residual", uid, spec.residualDims, spec.residualType)
                                 : given("bias", spec.biasUid ? uid : 0, spec.biasDims, spec.biasType);
      auto attributes = fe::graph::Pointwise_attributes()
                            .set_mode(node == 'm' ? fe::PointwiseMode_t::MUL : fe::PointwiseMode_t::ADD)
                            .set_compute_data_type(F32);
      out = spec.operandFirst ? graph.pointwise(operand, in, attributes) : graph.pointwise(in, operand, attributes);
    }
    if (i + 1 < spec.nodes.size()) out->set_dim(yDims).set_stride(stridesOf(yDims, false)).set_data_type(spec.midType);
    previous = out;
  }
  previous->set_output(true).set_uid(spec.outUid).set_dim(yDims).set_stride(stridesOf(yDims, false));
  previous->set_data_type(BF);
  return graph.validate().is_good();
}

static void testFakeRefusals() {
  const Chain chains[] = {
      chain("bias, residual and relu6", true),
      chain("the bias alone", true, [](Chain &c) { c.nodes = "b"; }),
      chain("the residual alone", true, [](Chain &c) { c.nodes = "r"; }),
      chain("relu alone", true, [](Chain &c) { c.nodes = "u"; }),
      chain("bias and relu", true, [](Chain &c) { c.nodes = "bu"; }),
      chain("residual and relu", true, [](Chain &c) { c.nodes = "ru"; }),
      chain("bias and residual", true, [](Chain &c) { c.nodes = "br"; }),
      chain("relu without clips", true, [](Chain &c) { c.clips = false; }),
      chain("a float residual", true, [](Chain &c) { c.residualType = F32; }),
      chain("a bias that does not broadcast", false, [](Chain &c) { c.biasDims = {1, 3, 2, 1}; }),
      chain("a bias of another rank", false, [](Chain &c) { c.biasDims = {1, 3, 1}; }),
      chain("a HALF bias", false, [](Chain &c) { c.biasType = fe::DataType_t::HALF; }),
      chain("a HALF residual", false, [](Chain &c) { c.residualType = fe::DataType_t::HALF; }),
      chain("a residual of other dims", false, [](Chain &c) { c.residualDims = {1, 3, 4, 2}; }),
      chain("a bf16 intermediate y", false, [](Chain &c) { c.yType = BF; }),
      chain("a bf16 result between nodes", false, [](Chain &c) { c.midType = BF; }),
      chain("MUL", false, [](Chain &c) { c.nodes = "mru"; }),
      chain("y an output too", false, [](Chain &c) { c.yOutput = true; }),
      chain("the bias first", false, [](Chain &c) { c.operandFirst = true; }),
      chain("a bias without uid", false, [](Chain &c) { c.biasUid = false; }),
      chain("the output with x's uid", false, [](Chain &c) { c.outUid = 1; }),
      chain("the residual with the bias's uid", false, [](Chain &c) { c.sharedUid = true; }),
      chain("relu before the residual", false, [](Chain &c) { c.nodes = "bur"; }),
      chain("two relus", false, [](Chain &c) { c.nodes = "bruu"; }),
      chain("three adds", false, [](Chain &c) { c.nodes = "brru"; }),
      chain("a relu given two inputs", false, [](Chain &c) { c.nodes = "bx"; }),
      chain("a node that skips the chain", false, [](Chain &c) { c.skipLink = true; }),
      chain("a lower clip above the upper", false, [](Chain &c) { c.lower = 7; }),
  };
  for (const Chain &c : chains) {
    ctx = "fake frontend, conv + epilogue with " + c.what;
    const bool taken = validates(c);
    expect(taken == c.taken, taken ? "validate took it" : "validate refused it");
  }
}

int main() {
  emu::expectedStream = (cudaStream_t)(void *)0x5150;
  try {
    testFakeRefusals();
    testUnsupportedActivation();
    for (const Case &c : kCases)
      for (bool channelsLast : {false, true}) {
        runCase<float>(c, channelsLast, P::TF32, 1);
        runCase<float>(c, channelsLast, P::BF16, 2);
        runCase<pc::bf16>(c, channelsLast, P::BF16, 1);
        runOwnKernels<float>(c, channelsLast, P::TF32);
        runOwnKernels<pc::bf16>(c, channelsLast, P::BF16);
      }
  } catch (const std::exception &e) {
    std::printf("EXCEPTION (%s): %s\n", ctx.c_str(), e.what());
    ++emucheck::failures;
  }
  ctx = "the operands";
  expect(clippedAtSix > 1000, "ReLU6 clipped only " + std::to_string(clippedAtSix) + " values at 6");
  return emucheck::finish();
}
