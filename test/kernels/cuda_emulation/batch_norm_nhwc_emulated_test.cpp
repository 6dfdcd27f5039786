// cuda-batch-norm-nhwc-emulated: pc::batchNorm, pc::batchNormGrad and
// pc::batchNormParamGrad with channelsLast (x [N, d..., C], issue 47;
// runtime/kernels/cuda/src/batch_norm_nhwc.cu) under the host emulation
// (emu.h), against the CPU kernels (pk::) on the NCHW transposes:
//   - ranks 2 to 5, channel counts 1, 3, 7, 33, 64, 132, 264 (several
//     tiles of channels, one at a time or in packs), a few rows and a few
//     thousand (several chunks of rows), one channel's mean far from 0 (the
//     shifted sums);
//   - float and bf16 storage: float within the NCHW checks' tolerances, bf16
//     against the CPU float kernels on the same bf16 inputs within a bf16
//     rounding (normwise for dx, as cuda-kernels-emulated's bf16 checks);
//     statistics and parameter gradients, float either way, at the float
//     tolerances;
//   - training and inference; the running statistics written apart and in
//     place; the epilogue (residual, ReLU, ReLU6); the gradient through the
//     activation with and without the masked gradient; the parameter
//     gradient written and accumulated; an empty batch;
//   - operands off their 16-byte packs (element-wise moves): the same bits
//     as aligned ones (the sums' order depends on the shape alone);
//   - without channelsLast the NCHW path, as before.
#include "pipec/cuda_kernels.h"
#include "pipec/cpu_kernels.h" // after cuda_kernels.h, as the other emulated tests
#include "emu.h"
#include "emulated_checks.h"
#include "channels_last_layout.h"
#include "kernel_plan.h" // plan::cudaBatchNormRowChunks

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <vector>

namespace pk = pipec::kernels;       // the CPU kernels: the reference
namespace pc = pipec::kernels::cuda; // the CUDA kernels, emulated
using bf = pc::bf16;
using emucheck::ctx;
using emucheck::expect;
using emucheck::expectNear;
using pk::Shape;

namespace {

constexpr float kEpsilon = 1e-5f, kMomentum = 0.9f;

std::mt19937_64 rng(4747);
std::vector<float> uniform(int64_t n, float lo, float hi) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v((size_t)n);
  for (float &x : v) x = d(rng);
  return v;
}

template <class T> std::vector<T> stored(const std::vector<float> &v) { return std::vector<T>(v.begin(), v.end()); }
template <class T> std::vector<float> widened(const std::vector<T> &v) {
  std::vector<float> r(v.size());
  for (size_t i = 0; i < v.size(); ++i) r[i] = (float)v[i];
  return r;
}
/// Values as T holds them (bf16: rounded).
template <class T> std::vector<float> representable(const std::vector<float> &v) { return widened(stored<T>(v)); }

/// [N, d..., C] -> [N, C, d...].
Shape channelsFirst(const Shape &s) { return pk::plan::channelsFirstShape(s); }
/// Data of channels-last shape s to NCHW, or NCHW data back to s.
std::vector<float> nchw(const std::vector<float> &v, const Shape &s) {
  return emulayout::moveChannels(v, channelsFirst(s), /*toLast=*/false);
}
std::vector<float> nhwc(const std::vector<float> &v, const Shape &s) {
  return emulayout::moveChannels(v, channelsFirst(s), /*toLast=*/true);
}

/// A normalized value (y) or a gradient (dx) against the CPU's.
enum class Kind { Value, Gradient, Exact };
void checkStored(const std::vector<float> &want, const std::vector<float> &got, Kind kind, const char *what) {
  expectNear(got, want, kind == Kind::Value ? 1e-5 : kind == Kind::Gradient ? 1e-4 : 0, what);
}
/// bf16: within one rounding of the CPU's float result (an ulp, 2^-8
/// relative; dx against its largest element, its terms cancel), Exact:
/// want rounded to bf16.
void checkStored(const std::vector<float> &want, const std::vector<bf> &gotBf, Kind kind, const char *what) {
  const std::vector<float> got = widened(gotBf);
  if (kind == Kind::Exact) return expectNear(got, representable<bf>(want), 0, what);
  const double tol = 1.0 / 256 + 1e-5;
  if (kind == Kind::Value) return expectNear(got, want, tol, what);
  double largest = 0;
  for (float a : want) largest = std::max(largest, (double)std::fabs(a));
  bool ok = got.size() == want.size();
  for (size_t i = 0; ok && i < got.size(); ++i) ok = std::fabs((double)got[i] - want[i]) <= tol * (1 + largest);
  expect(ok, std::string(what) + ": beyond a bf16 rounding of the largest element");
}

/// Bits of a stored result.
template <class T> bool sameBits(const std::vector<T> &a, const std::vector<T> &b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

/// One shape's inputs (channels-last), values T holds.
struct Data {
  Shape xs; // channels-last
  int64_t C = 0, n = 0;
  std::vector<float> x, r, dy, scale, bias, mean, var;
};
template <class T> Data inputs(const Shape &xs) {
  Data d;
  d.xs = xs;
  d.C = xs.v[xs.size - 1];
  d.n = xs.numel();
  d.x = uniform(d.n, -2, 2);
  for (int64_t i = 0; i < d.n; i += d.C) d.x[(size_t)i] += 100; // channel 0 centred at 100
  d.x = representable<T>(d.x);
  d.r = representable<T>(uniform(d.n, -4, 10)); // reaches both bounds of ReLU6
  d.dy = representable<T>(uniform(d.n, -2, 2));
  d.scale = uniform(d.C, 0.5f, 2);
  d.bias = uniform(d.C, -1, 1);
  d.mean = uniform(d.C, -1, 1);
  d.var = uniform(d.C, 0.5f, 2);
  return d;
}

/// A CUDA buffer of T, 16-byte aligned or one element off (offset 1).
template <class T> struct Buffer {
  std::vector<T> storage;
  int offset;
  Buffer(const std::vector<float> &v, int offset) : storage(v.size() + 1), offset(offset) {
    for (size_t i = 0; i < v.size(); ++i) storage[i + offset] = T(v[i]);
  }
  T *data() { return storage.data() + offset; }
  std::vector<T> values() const { return std::vector<T>(storage.begin() + offset, storage.end() - 1 + offset); }
};

/// What one CUDA call gave, to compare aligned against unaligned runs.
template <class T> struct Results {
  std::vector<T> y, dx, masked;
  std::vector<float> mean, var, dscale, dbias, dscaleAdded, dbiasAdded;
};

/// Forward: y and the statistics against the CPU's; returns the CPU's y
/// (channels-last), the activation's output the gradient reads.
template <class T>
std::vector<float> checkForward(const Data &d, bool training, bool residual, std::optional<pk::Unary> act, int offset,
                                Results<T> &out) {
  const Shape ns = channelsFirst(d.xs);
  std::vector<float> want(d.n), wantMean(d.C), wantVar(d.C);
  const std::vector<float> xf = nchw(d.x, d.xs), rf = nchw(d.r, d.xs);
  pk::batchNorm(xf.data(), ns, d.scale.data(), d.bias.data(), d.mean.data(), d.var.data(), want.data(),
                wantMean.data(), wantVar.data(), kEpsilon, kMomentum, training, residual ? rf.data() : nullptr, act);
  want = nhwc(want, d.xs);
  Buffer<T> x(d.x, offset), r(d.r, offset), y(std::vector<float>(d.n, NAN), offset);
  out.mean.assign(d.C, NAN);
  out.var.assign(d.C, NAN);
  pc::batchNorm(x.data(), d.xs, d.scale.data(), d.bias.data(), d.mean.data(), d.var.data(), y.data(),
                out.mean.data(), out.var.data(), kEpsilon, kMomentum, training, residual ? r.data() : nullptr, act,
                true);
  out.y = y.values();
  checkStored(want, out.y, Kind::Value, "y");
  expectNear(out.mean, wantMean, 1e-6, "new running mean");
  expectNear(out.var, wantVar, 1e-6, "new running var");
  return want;
}

/// The running statistics updated in place: the bits of writing them apart.
template <class T> void checkInPlace(const Data &d, bool training, const Results<T> &apart) {
  Buffer<T> x(d.x, 0), y(std::vector<float>(d.n, NAN), 0);
  std::vector<float> mean = d.mean, var = d.var;
  pc::batchNorm(x.data(), d.xs, d.scale.data(), d.bias.data(), mean.data(), var.data(), y.data(), mean.data(),
                var.data(), kEpsilon, kMomentum, training, nullptr, std::nullopt, true);
  expect(mean == apart.mean && var == apart.var, "running statistics in place differ from those written apart");
}

/// Input gradient (through the activation act, whose output is yAct) and
/// the masked gradient against the CPU's.
template <class T>
void checkGrad(const Data &d, bool training, std::optional<pk::Unary> act, const std::vector<float> &yAct,
               bool withMasked, int offset, Results<T> &out) {
  const Shape ns = channelsFirst(d.xs);
  const std::vector<float> xf = nchw(d.x, d.xs), dyf = nchw(d.dy, d.xs), yf = nchw(yAct, d.xs);
  std::vector<float> want(d.n), wantMasked(d.n);
  pk::batchNormGrad(dyf.data(), xf.data(), ns, d.scale.data(), d.mean.data(), d.var.data(), want.data(), kEpsilon,
                    training, act ? yf.data() : nullptr, act, withMasked ? wantMasked.data() : nullptr);
  Buffer<T> dy(d.dy, offset), x(d.x, offset), y(yAct, offset), dx(std::vector<float>(d.n, NAN), offset),
      masked(std::vector<float>(d.n, NAN), offset);
  pc::batchNormGrad(dy.data(), x.data(), d.xs, d.scale.data(), d.mean.data(), d.var.data(), dx.data(), kEpsilon,
                    training, act ? y.data() : nullptr, act, withMasked ? masked.data() : nullptr, true);
  out.dx = dx.values();
  checkStored(nhwc(want, d.xs), out.dx, Kind::Gradient, "dx");
  if (!withMasked) return;
  out.masked = masked.values();
  checkStored(nhwc(wantMasked, d.xs), out.masked, Kind::Exact, "masked dy");
}

/// dscale and dbias, written and added into buffers, against the CPU's.
template <class T> void checkParamGrad(const Data &d, bool training, int offset, Results<T> &out) {
  const Shape ns = channelsFirst(d.xs);
  const std::vector<float> xf = nchw(d.x, d.xs), dyf = nchw(d.dy, d.xs);
  std::vector<float> wantScale(d.C), wantBias(d.C);
  pk::batchNormParamGrad(dyf.data(), xf.data(), ns, d.mean.data(), d.var.data(), wantScale.data(), wantBias.data(),
                         kEpsilon, training);
  Buffer<T> dy(d.dy, offset), x(d.x, offset);
  out.dscale.assign(d.C, NAN);
  out.dbias.assign(d.C, NAN);
  pc::batchNormParamGrad(dy.data(), x.data(), d.xs, d.mean.data(), d.var.data(), out.dscale.data(),
                         out.dbias.data(), kEpsilon, training, false, true);
  expectNear(out.dscale, wantScale, 1e-4, "dscale");
  expectNear(out.dbias, wantBias, 1e-5, "dbias");
  out.dscaleAdded = d.scale;
  out.dbiasAdded = d.bias;
  pc::batchNormParamGrad(dy.data(), x.data(), d.xs, d.mean.data(), d.var.data(), out.dscaleAdded.data(),
                         out.dbiasAdded.data(), kEpsilon, training, true, true);
  std::vector<float> addedScale = d.scale, addedBias = d.bias;
  for (int64_t c = 0; c < d.C; ++c) addedScale[c] += out.dscale[c], addedBias[c] += out.dbias[c];
  expectNear(out.dscaleAdded, addedScale, 0, "dscale accumulated");
  expectNear(out.dbiasAdded, addedBias, 0, "dbias accumulated");
}

/// Every call on one shape, storage and mode; with operands one element off
/// their packs, the bits of the aligned run.
template <class T> void checkShape(const Shape &xs, bool training) {
  const Data d = inputs<T>(xs);
  const std::string name = std::string(sizeof(T) == 2 ? "bf16 " : "float ") + xs.str() +
                           (training ? " training" : " inference");
  struct Epilogue {
    bool residual;
    std::optional<pk::Unary> act;
    const char *what;
  };
  const Epilogue epilogues[] = {{false, std::nullopt, ""},
                                {true, std::nullopt, " residual"},
                                {true, pk::Unary::Relu, " relu(+ residual)"},
                                {false, pk::Unary::Relu6, " relu6"}};
  for (const Epilogue &e : epilogues) {
    Results<T> aligned, off;
    ctx = name + e.what;
    const std::vector<float> y = checkForward<T>(d, training, e.residual, e.act, 0, aligned);
    if (!e.act && !e.residual) checkInPlace<T>(d, training, aligned);
    // The gradient reads the activation's output as T holds it.
    const std::vector<float> yStored = representable<T>(y);
    for (bool withMasked : {false, true}) {
      if (withMasked && !e.act) continue;
      ctx = name + e.what + " gradient" + (withMasked ? " masked" : "");
      checkGrad<T>(d, training, e.act, yStored, withMasked, 0, aligned);
      ctx += ", unaligned";
      checkGrad<T>(d, training, e.act, yStored, withMasked, 1, off);
      expect(sameBits(aligned.dx, off.dx) && sameBits(aligned.masked, off.masked), "bits differ from aligned");
    }
    ctx = name + e.what + ", unaligned";
    checkForward<T>(d, training, e.residual, e.act, 1, off);
    expect(sameBits(aligned.y, off.y) && aligned.mean == off.mean && aligned.var == off.var,
           "bits differ from aligned");
  }
  Results<T> aligned, off;
  ctx = name + " parameter gradient";
  checkParamGrad<T>(d, training, 0, aligned);
  ctx += ", unaligned";
  checkParamGrad<T>(d, training, 1, off);
  expect(aligned.dscale == off.dscale && aligned.dbias == off.dbias && aligned.dscaleAdded == off.dscaleAdded,
         "bits differ from aligned");
}

/// An empty batch: the running statistics move toward 0, the parameter
/// gradient is 0 (or nothing added), no element is written.
template <class T> void checkEmpty() {
  const Shape xs{0, 4, 5, 3}, ns = channelsFirst(xs);
  ctx = std::string(sizeof(T) == 2 ? "bf16" : "float") + " empty batch";
  std::vector<float> scale(3, 1), bias(3, 0), mean(3, 0.5f), var(3, 2), wantMean(3), wantVar(3), got(3), gotVar(3);
  std::vector<float> xf(1), yf(1);
  std::vector<T> x(1), y(1);
  pk::batchNorm(xf.data(), ns, scale.data(), bias.data(), mean.data(), var.data(), yf.data(), wantMean.data(),
                wantVar.data(), kEpsilon, kMomentum, true);
  pc::batchNorm(x.data(), xs, scale.data(), bias.data(), mean.data(), var.data(), y.data(), got.data(),
                gotVar.data(), kEpsilon, kMomentum, true, nullptr, std::nullopt, true);
  expectNear(got, wantMean, 0, "mean");
  expectNear(gotVar, wantVar, 0, "var");
  std::vector<float> dscale(3, 7), dbias(3, 7), added(3, 7), addedBias(3, 7);
  pc::batchNormParamGrad(x.data(), x.data(), xs, mean.data(), var.data(), dscale.data(), dbias.data(), kEpsilon, true,
                         false, true);
  pc::batchNormParamGrad(x.data(), x.data(), xs, mean.data(), var.data(), added.data(), addedBias.data(), kEpsilon,
                         true, true, true);
  expect(dscale == std::vector<float>(3, 0) && dbias == std::vector<float>(3, 0), "dscale, dbias not 0");
  expect(added == std::vector<float>(3, 7) && addedBias == std::vector<float>(3, 7), "accumulate added something");
  pc::batchNormGrad(x.data(), x.data(), xs, scale.data(), mean.data(), var.data(), y.data(), kEpsilon, true, nullptr,
                    std::nullopt, nullptr, true);
  bool threw = false;
  try {
    pc::batchNorm(x.data(), Shape{5}, scale.data(), bias.data(), mean.data(), var.data(), y.data(), got.data(),
                  gotVar.data(), kEpsilon, kMomentum, true, nullptr, std::nullopt, true);
  } catch (const pk::KernelError &) {
    threw = true;
  }
  expect(threw, "a rank-1 input was taken");
}

/// Without channelsLast (and with it false) the NCHW path: the CPU's
/// results, and the same bits either way.
template <class T> void checkChannelsFirst() {
  const Shape xs{2, 3, 5, 4};
  ctx = std::string(sizeof(T) == 2 ? "bf16" : "float") + " NCHW " + xs.str();
  Data d = inputs<T>(xs);
  std::vector<float> want(d.n), wm(3), wv(3), m1(3), v1(3), m2(3), v2(3);
  pk::batchNorm(d.x.data(), xs, d.scale.data(), d.bias.data(), d.mean.data(), d.var.data(), want.data(), wm.data(),
                wv.data(), kEpsilon, kMomentum, true);
  std::vector<T> x = stored<T>(d.x), y1(d.n), y2(d.n), dy = stored<T>(d.dy), dx1(d.n), dx2(d.n);
  pc::batchNorm(x.data(), xs, d.scale.data(), d.bias.data(), d.mean.data(), d.var.data(), y1.data(), m1.data(),
                v1.data(), kEpsilon, kMomentum, true);
  pc::batchNorm(x.data(), xs, d.scale.data(), d.bias.data(), d.mean.data(), d.var.data(), y2.data(), m2.data(),
                v2.data(), kEpsilon, kMomentum, true, nullptr, std::nullopt, false);
  checkStored(want, y1, Kind::Value, "y");
  expect(sameBits(y1, y2) && m1 == m2 && v1 == v2, "channelsLast false differs from the default");
  pc::batchNormGrad(dy.data(), x.data(), xs, d.scale.data(), d.mean.data(), d.var.data(), dx1.data(), kEpsilon, true);
  pc::batchNormGrad(dy.data(), x.data(), xs, d.scale.data(), d.mean.data(), d.var.data(), dx2.data(), kEpsilon, true,
                    nullptr, std::nullopt, nullptr, false);
  pc::batchNormParamGrad(dy.data(), x.data(), xs, d.mean.data(), d.var.data(), m1.data(), v1.data(), kEpsilon, true);
  pc::batchNormParamGrad(dy.data(), x.data(), xs, d.mean.data(), d.var.data(), m2.data(), v2.data(), kEpsilon, true,
                         false, false);
  expect(sameBits(dx1, dx2) && m1 == m2 && v1 == v2, "gradients: channelsLast false differs from the default");
}

/// Launches of one call: the forward and the input gradient in training
/// take two, the rest one (the sums' pass finishes them in the last block
/// of each tile of channels).
template <class T> void checkLaunches(const Shape &xs) {
  ctx = std::string(sizeof(T) == 2 ? "bf16 " : "float ") + xs.str() + " launches";
  const Data d = inputs<T>(xs);
  std::vector<T> x = stored<T>(d.x), dy = stored<T>(d.dy), y(d.n), dx(d.n);
  std::vector<float> mean = d.mean, var = d.var, dscale(d.C), dbias(d.C);
  const auto launchesOf = [](const char *what, int want, auto &&call) {
    const int before = emu::launches;
    call();
    const int got = emu::launches - before;
    expect(got == want, std::string(what) + ": " + std::to_string(got) + " launches, not " + std::to_string(want));
  };
  for (bool training : {true, false}) {
    launchesOf(training ? "training forward" : "inference forward", training ? 2 : 1, [&] {
      pc::batchNorm(x.data(), xs, d.scale.data(), d.bias.data(), mean.data(), var.data(), y.data(), mean.data(),
                    var.data(), kEpsilon, kMomentum, training, nullptr, std::nullopt, true);
    });
    launchesOf(training ? "training input gradient" : "inference input gradient", training ? 2 : 1, [&] {
      pc::batchNormGrad(dy.data(), x.data(), xs, d.scale.data(), mean.data(), var.data(), dx.data(), kEpsilon,
                        training, nullptr, std::nullopt, nullptr, true);
    });
    launchesOf("parameter gradient", 1, [&] {
      pc::batchNormParamGrad(dy.data(), x.data(), xs, mean.data(), var.data(), dscale.data(), dbias.data(), kEpsilon,
                             training, false, true);
    });
  }
}

/// More chunks of rows than the 32 lanes their sums are added in (two
/// levels of last blocks; more than 256, the lanes' loads in batches of 8),
/// in one tile of channels and in several: training's calls and the
/// inference forward against the CPU's, operands off their packs giving the
/// same bits; the same calls again after a call of one launch (their blocks
/// then run in the other order, so that another block of each tile is the
/// last) giving the same bits. Channel 0 is centred at 10, not 100: over a
/// million elements, y's float rounding at 100 nears the tolerance.
template <class T> void checkManyChunks(const Shape &xs) {
  Data d = inputs<T>(xs);
  for (int64_t i = 0; i < d.n; i += d.C) d.x[(size_t)i] = representable<T>({d.x[(size_t)i] - 90})[0];
  const std::string name = std::string(sizeof(T) == 2 ? "bf16 " : "float ") + xs.str();
  Results<T> first, off, again;
  ctx = name + " inference relu(+ residual)";
  checkForward<T>(d, false, true, pk::Unary::Relu, 0, first);
  ctx = name + " training relu(+ residual)";
  checkForward<T>(d, true, true, pk::Unary::Relu, 0, first);
  const std::vector<float> yStored = representable<T>(widened(first.y));
  checkGrad<T>(d, true, pk::Unary::Relu, yStored, true, 0, first);
  checkParamGrad<T>(d, true, 0, first);
  ctx += ", unaligned";
  checkForward<T>(d, true, true, pk::Unary::Relu, 1, off);
  checkGrad<T>(d, true, pk::Unary::Relu, yStored, true, 1, off);
  checkParamGrad<T>(d, true, 1, off);
  expect(sameBits(first.y, off.y) && sameBits(first.dx, off.dx) && sameBits(first.masked, off.masked) &&
             first.mean == off.mean && first.var == off.var && first.dscale == off.dscale &&
             first.dbias == off.dbias,
         "bits differ from aligned");
  ctx = name + " again, blocks in the other order";
  pc::batchNormParamGrad(stored<T>(d.dy).data(), stored<T>(d.x).data(), xs, d.mean.data(), d.var.data(),
                         off.dscale.data(), off.dbias.data(), kEpsilon, true, false, true); // one launch
  checkForward<T>(d, true, true, pk::Unary::Relu, 0, again);
  checkGrad<T>(d, true, pk::Unary::Relu, yStored, true, 0, again);
  checkParamGrad<T>(d, true, 0, again);
  expect(sameBits(first.y, again.y) && sameBits(first.dx, again.dx) && sameBits(first.masked, again.masked) &&
             first.mean == again.mean && first.var == again.var && first.dscale == again.dscale &&
             first.dbias == again.dbias,
         "bits differ from the first calls'");
}

} // namespace

int main() {
  // Channel counts 1, 3, 7, 33, 64; rows from 1 to a few thousand (several
  // chunks, the last one short: plan::cudaBatchNormRowChunks); more packs of
  // channels than one tile holds (33 channels one at a time; 132 and 264:
  // packs of 4 floats, 132 bf16 one at a time, 264 in packs of 8 bf16).
  const std::vector<Shape> shapes = {
      Shape{5, 3},           Shape{3000, 7},      Shape{2, 9, 33},     Shape{4, 700, 3},   Shape{2, 5, 132},
      Shape{2, 3, 264},      Shape{2, 3, 5, 64},  Shape{2, 24, 32, 7}, Shape{5, 7, 11, 64}, Shape{1, 1, 1, 1},
      Shape{2, 3, 4, 5, 7},  Shape{2, 4, 6, 8, 33}, Shape{1, 2, 3, 4, 1}, Shape{3, 1500, 1}};
  ctx = "chunks of rows";
  namespace plan = pipec::kernels::plan;
  expect(plan::cudaBatchNormRowChunks(1, 64, 5 * 7 * 11) == 4 && plan::cudaBatchNormRowChunks(1, 3, 2800) == 3 &&
             plan::cudaBatchNormRowChunks(1, 7, 3000) == 6,
         "the shapes below no longer take several chunks");
  for (const Shape &xs : shapes)
    for (bool training : {true, false}) {
      checkShape<float>(xs, training);
      checkShape<bf>(xs, training);
    }
  checkEmpty<float>();
  checkEmpty<bf>();
  checkChannelsFirst<float>();
  checkChannelsFirst<bf>();
  // Two levels of last blocks: 40 chunks in one tile ([2, 40, 64, 32]); 258
  // chunks in one tile; 138 in each of two (33 floats one at a time).
  ctx = "chunks of rows, two levels";
  expect(plan::cudaBatchNormRowChunks(1, 32, 2 * 40 * 64) == 40 &&
             plan::cudaBatchNormRowChunks(1, 32, 2 * 129 * 128) == 258 &&
             plan::cudaBatchNormRowChunks(2, 17, 2 * 129 * 128) == 138,
         "the shapes below no longer take more chunks than lanes");
  for (const Shape &xs : {Shape{2, 40, 64, 32}, Shape{2, 129, 128, 32}, Shape{2, 129, 128, 33}}) {
    checkManyChunks<float>(xs);
    checkManyChunks<bf>(xs);
  }
  checkLaunches<float>(Shape{2, 129, 128, 32});
  checkLaunches<bf>(Shape{2, 7, 5, 3});
  return emucheck::finish();
}
