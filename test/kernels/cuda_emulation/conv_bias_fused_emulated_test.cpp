// cuda-conv-bias-fused-emulated: nn.conv's bias inside cuDNN's forward
// graph (runtime/kernels/cuda/src/conv_cudnn.cu: conv_fprop, then a pointwise
// ADD of the float bias seen as [1, F, 1...]; docs/cuda-kernels.md,
// "Convolutions (cuDNN)") under the host emulation (emu.h, the fake
// cudnn_frontend in inc/, which checks the pointwise node and its tensors),
// against the CPU kernels, channels-first and channels-last, float storage in
// the TF32 and BF16 precisions and bf16 storage:
//   - with a bias: one cuDNN execution that adds it and no kernel launch
//     (pipec's bias kernel does not run), the graph's tensors in the layout's
//     strides, y within the tolerance (bf16 storage: rounded once);
//   - without a bias: the plain graph, no launch, as before;
//   - a bias that is not 16-byte aligned: the plain graph, then the bias
//     kernel (one launch);
//   - the fused graph refused (emu::refuseConvPointwise, as cuDNN with no
//     engine for a shape): the plain graph and the bias kernel, the same
//     results, said once on stderr, and the refusal kept for the shape (a
//     later call does not build it again);
//   - the fake frontend itself: it takes conv_cudnn.cu's graph and refuses
//     a bias that does not broadcast, of another rank or type, a bf16
//     intermediate, another mode, y an output too, the operands swapped, a
//     missing or shared uid.
#include "pipec/cuda_kernels.h"
#include "pipec/cpu_kernels.h"
#include "cuda_runtime.h"
#include "emu.h"
#include "cudnn_frontend.h" // emu::lastConvTensors, emu::refuseConvPointwise (after emu.h, which it uses)
#include "emulated_checks.h"
#include "channels_last_layout.h"

#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <type_traits>
#include <unistd.h>
#include <vector>

namespace pk = pipec::kernels;
namespace pc = pipec::kernels::cuda;
using emucheck::ctx;
using emucheck::expect;
using emucheck::expectNear;
using emulayout::channelsLastShape;
using emulayout::moveChannels;
using emulayout::stridesOf;
using pk::Dims;
using pk::Shape;
using P = pipec::Precision;

static std::mt19937_64 rng(4711);
/// Random values in [-1, 1].
static std::vector<float> randomValues(int64_t n) {
  std::uniform_real_distribution<float> d(-1, 1);
  std::vector<float> v((size_t)n);
  for (float &x : v) x = d(rng);
  return v;
}
static std::vector<float> bf16Rounded(std::vector<float> v) {
  for (float &e : v) e = (float)pc::bf16(e);
  return v;
}
/// The fake cuDNN sums in double, the CPU kernels in float.
constexpr double kTolerance = 2e-5;
/// One rounding to bf16 (half an ulp, at most 2^-8 relative): the graph's
/// output.
constexpr double kBf16Once = 1.0 / 256 + kTolerance;
/// Two: the plain graph's y, then the bias kernel's sum.
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

/// What one call did, and its y channels-first in float.
struct Outcome {
  std::vector<float> y;
  long executes = 0;
  int launches = 0;
  bool graphAddedBias = false;
  std::string stderrText;
};

/// One forward on T storage in `precision`, layout `channelsLast`; x and w
/// channels-first (bf16 values for bf16 storage); `bias` null or float [F].
template <class T>
static Outcome runForward(const Case &c, bool channelsLast, P precision, const std::vector<float> &x,
                          const std::vector<float> &w, const float *bias) {
  pc::StreamScope scope((void *)0x5150, precision);
  const Shape ys = pk::convOutputShape(c.xs, c.ws, c.s, c.p, c.d);
  auto stored = [&](const std::vector<float> &v, const Shape &first) {
    const std::vector<float> laid = channelsLast ? moveChannels(v, first, true) : v;
    return std::vector<T>(laid.begin(), laid.end());
  };
  const std::vector<T> xt = stored(x, c.xs), wt = stored(w, c.ws);
  std::vector<T> y((size_t)ys.numel(), T(NAN));
  const Shape xp = channelsLast ? channelsLastShape(c.xs) : c.xs, wp = channelsLast ? channelsLastShape(c.ws) : c.ws;
  Outcome out;
  emu::lastConvTensors = {};
  const long executes = emu::cudnnExecutes;
  const int launches = emu::launches;
  out.stderrText = capturedStderr([&] {
    pc::conv(xt.data(), xp, wt.data(), wp, bias, y.data(), c.s, c.p, c.d, c.g, pk::Workspace{}, channelsLast);
    pc::raiseDeviceErrors();
  });
  out.executes = emu::cudnnExecutes - executes;
  out.launches = emu::launches - launches;
  out.graphAddedBias = emu::lastConvTensors.bias;
  for (int t = 0; t < 3 && out.executes == 1; ++t) {
    const auto &dims = emu::lastConvTensors.dims[t];
    expect(!dims.empty() && emu::lastConvTensors.strides[t] == stridesOf(dims, channelsLast),
           "tensor " + std::to_string(t) + " has not the " + (channelsLast ? "channels-last" : "channels-first") +
               " strides");
  }
  const std::vector<float> widened(y.begin(), y.end());
  out.y = channelsLast ? moveChannels(widened, ys, false) : widened;
  return out;
}

/// The CPU kernels' y.
static std::vector<float> reference(const Case &c, const std::vector<float> &x, const std::vector<float> &w,
                                    const float *bias) {
  std::vector<float> y(pk::convOutputShape(c.xs, c.ws, c.s, c.p, c.d).numel());
  pk::conv(x.data(), c.xs, w.data(), c.ws, bias, y.data(), c.s, c.p, c.d, c.g);
  return y;
}

/// How a call must run: the graph adds the bias; the plain graph, then the
/// bias kernel; the plain graph alone (no bias).
enum class Way { Fused, PlainThenKernel, Plain };

static void expectWay(const Outcome &o, Way way) {
  expect(o.executes == 1, "cuDNN ran " + std::to_string(o.executes) + " graphs, expected one");
  const int launches = way == Way::PlainThenKernel ? 1 : 0;
  expect(o.launches == launches,
         std::to_string(o.launches) + " kernel launches, expected " + std::to_string(launches));
  expect(o.graphAddedBias == (way == Way::Fused),
         way == Way::Fused ? "the graph did not add the bias" : "the graph added a bias");
}

/// Every way of one case in one layout and storage.
/// `more`: the samples added to the shape whose fused graph is refused.
template <class T> static void runCase(const Case &c, bool channelsLast, P precision, int more) {
  constexpr bool bf16 = std::is_same_v<T, pc::bf16>;
  const std::string what = c.str() + (channelsLast ? " channels-last" : " channels-first") +
                           (bf16 ? " bf16 storage" : precision == P::TF32 ? " tf32" : " bf16 precision");
  auto values = [&](int64_t n) { return bf16 ? bf16Rounded(randomValues(n)) : randomValues(n); };
  const double fusedTolerance = bf16 ? kBf16Once : kTolerance, plainTolerance = bf16 ? kBf16Twice : kTolerance;
  {
    const auto x = values(c.xs.numel()), w = values(c.ws.numel());
    std::vector<float> bias = randomValues(c.ws.v[0] + 1); // [0] 16-byte aligned, [1] not
    ctx = what + " bias";
    const Outcome fused = runForward<T>(c, channelsLast, precision, x, w, bias.data());
    expectWay(fused, Way::Fused);
    expectNear(fused.y, reference(c, x, w, bias.data()), fusedTolerance, "y");
    expect(fused.stderrText.empty(), "said on stderr: " + fused.stderrText);
    ctx = what + " no bias";
    const Outcome plain = runForward<T>(c, channelsLast, precision, x, w, nullptr);
    expectWay(plain, Way::Plain);
    expectNear(plain.y, reference(c, x, w, nullptr), fusedTolerance, "y");
    ctx = what + " unaligned bias";
    const Outcome unaligned = runForward<T>(c, channelsLast, precision, x, w, bias.data() + 1);
    expectWay(unaligned, Way::PlainThenKernel);
    expectNear(unaligned.y, reference(c, x, w, bias.data() + 1), plainTolerance, "y");
  }
  // The fused graph refused for a shape not seen yet: said once, kept.
  const Case other = c.another(more);
  const auto x = values(other.xs.numel()), w = values(other.ws.numel()), bias = randomValues(other.ws.v[0]);
  const std::vector<float> want = reference(other, x, w, bias.data());
  ctx = what + " fused graph refused";
  emu::refuseConvPointwise = true;
  const Outcome refused = runForward<T>(other, channelsLast, precision, x, w, bias.data());
  emu::refuseConvPointwise = false;
  expectWay(refused, Way::PlainThenKernel);
  expectNear(refused.y, want, plainTolerance, "y");
  expect(occurrences(refused.stderrText, "pipec: cuDNN has no deterministic nn.conv with its bias") == 1 &&
             occurrences(refused.stderrText, "pipec: ") == 1,
         "the refusal was not said once on stderr: " + refused.stderrText);
  ctx = what + " fused graph refused before";
  const Outcome again = runForward<T>(other, channelsLast, precision, x, w, bias.data());
  expectWay(again, Way::PlainThenKernel);
  expect(again.y == refused.y, "y differs from the first call's");
  expect(again.stderrText.empty(), "said again on stderr: " + again.stderrText);
}

/// The fake frontend refuses at validate what cuDNN's frontend and backend
/// refuse of a conv + bias graph (or what the fake does not emulate), and
/// takes the graph conv_cudnn.cu builds; `spoil` changes one thing.
static void testFakeRefusals() {
  namespace fe = cudnn_frontend;
  using T = fe::graph::Tensor_attributes;
  const fe::DataType_t F = fe::DataType_t::FLOAT, B = fe::DataType_t::BFLOAT16;
  struct Spoil {
    const char *what;
    std::vector<int64_t> biasDims = {1, 3, 1, 1};
    fe::DataType_t biasType = fe::DataType_t::FLOAT, yType = fe::DataType_t::FLOAT;
    fe::PointwiseMode_t mode = fe::PointwiseMode_t::ADD;
    bool yOutput = false, biasFirst = false, biasUid = true;
    int64_t outUid = 3;
  };
  const Spoil spoils[] = {
      {"nothing"},
      {"a bias that does not broadcast", {1, 3, 2, 1}},
      {"a bias of another rank", {1, 3, 1}},
      {"a HALF bias", {1, 3, 1, 1}, fe::DataType_t::HALF},
      {"a bf16 intermediate y", {1, 3, 1, 1}, F, B},
      {"MUL", {1, 3, 1, 1}, F, F, fe::PointwiseMode_t::MUL},
      {"y an output too", {1, 3, 1, 1}, F, F, fe::PointwiseMode_t::ADD, true},
      {"the bias first", {1, 3, 1, 1}, F, F, fe::PointwiseMode_t::ADD, false, true},
      {"a bias without uid", {1, 3, 1, 1}, F, F, fe::PointwiseMode_t::ADD, false, false, false},
      {"the output with x's uid", {1, 3, 1, 1}, F, F, fe::PointwiseMode_t::ADD, false, false, true, 1},
  };
  for (const Spoil &spoil : spoils) {
    ctx = std::string("fake frontend, conv + bias with ") + spoil.what;
    fe::graph::Graph graph;
    graph.set_io_data_type(B).set_intermediate_data_type(F).set_compute_data_type(F);
    auto given = [&](const char *name, int64_t uid, std::vector<int64_t> dims, fe::DataType_t type) {
      T t;
      t.set_name(name).set_dim(dims).set_stride(stridesOf(dims, false)).set_data_type(type);
      if (uid) t.set_uid(uid);
      return graph.tensor(t);
    };
    auto y = graph.conv_fprop(given("x", 1, {1, 2, 4, 4}, B), given("w", 2, {3, 2, 3, 3}, B),
                              fe::graph::Conv_fprop_attributes()
                                  .set_pre_padding({1, 1})
                                  .set_post_padding({1, 1})
                                  .set_stride({1, 1})
                                  .set_dilation({1, 1})
                                  .set_compute_data_type(F));
    y->set_dim({1, 3, 4, 4}).set_stride(stridesOf({1, 3, 4, 4}, false)).set_data_type(spoil.yType);
    if (spoil.yOutput) y->set_output(true).set_uid(5);
    auto bias = given("bias", spoil.biasUid ? 4 : 0, spoil.biasDims, spoil.biasType);
    auto out = graph.pointwise(spoil.biasFirst ? bias : y, spoil.biasFirst ? y : bias,
                               fe::graph::Pointwise_attributes().set_mode(spoil.mode).set_compute_data_type(F));
    out->set_output(true).set_uid(spoil.outUid).set_dim({1, 3, 4, 4}).set_stride(stridesOf({1, 3, 4, 4}, false));
    out->set_data_type(B);
    const bool taken = graph.validate().is_good();
    expect(taken == (std::string(spoil.what) == "nothing"), taken ? "validate took it" : "validate refused it");
  }
}

int main() {
  emu::expectedStream = (cudaStream_t)(void *)0x5150;
  try {
    testFakeRefusals();
    for (const Case &c : kCases)
      for (bool channelsLast : {false, true}) {
        runCase<float>(c, channelsLast, P::TF32, 1);
        runCase<float>(c, channelsLast, P::BF16, 2);
        runCase<pc::bf16>(c, channelsLast, P::BF16, 1);
      }
  } catch (const std::exception &e) {
    std::printf("EXCEPTION (%s): %s\n", ctx.c_str(), e.what());
    ++emucheck::failures;
  }
  return emucheck::finish();
}
