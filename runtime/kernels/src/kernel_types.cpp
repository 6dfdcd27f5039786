// The host-side shape rules and kind names of pipec/kernel_types.h, shared
// by the CPU and CUDA kernel libraries.
#include "pipec/kernel_types.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>

namespace pipec::kernels {
namespace {
[[noreturn]] void fail(const char *op, const std::string &message) {
  throw KernelError(std::string(op) + ": " + message);
}

/// The double a Python script most likely passed for a float attribute:
/// the shortest decimal that round-trips the float, read back as a double
/// (0.999f -> 0.999, not 0.99900001287...). PyTorch computes 1 - beta2 and
/// the bias corrections from those doubles.
double pythonValue(float f) {
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf - 1, f);
  if (res.ec != std::errc()) return (double)f;
  *res.ptr = '\0';
  return std::strtod(buf, nullptr);
}
} // namespace

DropoutDraws dropoutDraws(const char *op, float ratio, bool training, uint64_t streamKey) {
  const double r = ratio; // as nn.dropout's kernels, the ratio in double
  if (!(r >= 0.0 && r < 1.0)) fail(op, "dropout ratio must be in [0, 1), got " + std::to_string(r));
  DropoutDraws d;
  d.active = training && r > 0.0;
  d.streamKey = streamKey;
  d.threshold = dropoutKeepThreshold(r);
  d.scale = 1.0 / (1.0 - r);
  return d;
}

AdamWConstants adamwConstants(int64_t step, float lr, float beta1, float beta2, float epsilon, float weightDecay) {
  const double t = (double)step, dlr = pythonValue(lr), b1 = pythonValue(beta1), b2 = pythonValue(beta2);
  AdamWConstants c{};
  c.decay = (float)(1.0 - dlr * pythonValue(weightDecay));
  const double w1 = 1.0 - b1; // exp_avg.lerp_(grad, 1 - beta1)
  c.w1 = (float)w1;
  c.lerpFromSelf = w1 < 0.5;
  c.beta2 = (float)b2, c.w2 = (float)(1.0 - b2);
  c.stepSize = (float)(dlr / (1.0 - std::pow(b1, t)));
  c.bias2Sqrt = (float)std::sqrt(1.0 - std::pow(b2, t));
  c.epsilon = epsilon;
  return c;
}

std::string Dims::str() const {
  std::string s = "[";
  for (int i = 0; i < size; ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s + "]";
}

Shape broadcastShape(const Shape &a, const Shape &b) {
  Shape out;
  int rank = std::max(a.size, b.size);
  if (rank > kMaxRank) fail("broadcast", "rank above " + std::to_string(kMaxRank));
  for (int i = 0; i < rank; ++i) {
    int64_t l = i < rank - a.size ? 1 : a.v[i - (rank - a.size)];
    int64_t r = i < rank - b.size ? 1 : b.v[i - (rank - b.size)];
    if (l != r && l != 1 && r != 1) fail("broadcast", "shapes " + a.str() + " and " + b.str() + " do not broadcast");
    out.push(l == 1 ? r : l);
  }
  return out;
}

Shape matmulShape(const Shape &a, const Shape &b) {
  if (a.size < 1 || b.size < 1) fail("nn.matmul", "operands need rank >= 1");
  Shape ap = a, bp = b;
  if (a.size == 1) ap = Shape{1, a.v[0]};
  if (b.size == 1) bp = Shape{b.v[0], 1};
  const int64_t m = ap.v[ap.size - 2], k = ap.v[ap.size - 1], kb = bp.v[bp.size - 2], n = bp.v[bp.size - 1];
  if (k != kb) fail("nn.matmul", "inner dimensions differ for " + a.str() + " x " + b.str());
  Shape out = broadcastShape(Shape(ap.v, ap.size - 2), Shape(bp.v, bp.size - 2));
  if (a.size != 1) out.push(m);
  if (b.size != 1) out.push(n);
  return out;
}

Shape gemmOperandShape(const Shape &stored, bool trans) {
  if (!trans) return stored;
  if (stored.size < 2) fail("nn.batched_gemm", "a transposed operand needs rank >= 2, got " + stored.str());
  Shape t = stored;
  std::swap(t.v[t.size - 1], t.v[t.size - 2]);
  return t;
}

Unary unaryKind(const std::string &kind) {
  Unary unary;
  if (!parseUnary(kind, unary))
    fail("nn.unary_grad", "unknown kind '" + kind + "' (" + spellingList(kUnaryFunctions) + ")");
  return unary;
}

Reduction reductionKind(const std::string &name) {
  if (name == "none") return Reduction::None;
  if (name == "sum") return Reduction::Sum;
  if (name == "mean") return Reduction::Mean;
  fail("nn.softmax_cross_entropy_loss", "reduction must be mean, sum or none, got " + name);
}

BinaryGrad binaryGradKind(const std::string &kind) {
  BinaryGrad gradient;
  if (!parseBinaryGradient(kind, gradient))
    fail("nn.binary_grad", "unknown kind '" + kind + "' (" + spellingList(kBinaryGradients) + ")");
  return gradient;
}

Shape sliceShape(const Shape &xs, const Dims &starts, const Dims &ends, const Dims &steps) {
  const int r = xs.size;
  if (starts.size != r || ends.size != r || steps.size != r)
    fail("nn.slice", "starts, ends and steps need one entry per axis (" + std::to_string(r) + ")");
  Shape out;
  for (int a = 0; a < r; ++a) {
    const int64_t dim = xs.v[a], start = starts.v[a], end = ends.v[a], step = steps.v[a];
    if (step == 0) fail("nn.slice", "step 0 on axis " + std::to_string(a));
    const bool valid = step > 0 ? (start >= 0 && start <= dim && end >= 0 && end <= dim)
                                : (start >= -1 && start < dim && end >= -1 && end < dim);
    if (!valid) fail("nn.slice", "bounds of axis " + std::to_string(a) + " are not normalized for size " + std::to_string(dim));
    const int64_t size = step > 0 ? (end - start + step - 1) / step : (start - end - step - 1) / -step;
    out.push(std::max<int64_t>(size, 0));
  }
  return out;
}


void checkRank(const char *op, const Shape &s, int atLeast, const char *what) {
  if (s.size < atLeast || s.size > kMaxRank)
    fail(op, std::string(what) + " " + s.str() + " needs rank in [" + std::to_string(atLeast) + ", " +
                 std::to_string(kMaxRank) + "]");
  for (int i = 0; i < s.size; ++i)
    if (s.v[i] < 0) fail(op, std::string(what) + " " + s.str() + " has a negative dimension");
}

EpilogueActivation epilogueActivation(const char *op, std::optional<Unary> activation) {
  if (!activation) return EpilogueActivation::None;
  if (!epilogueActivationApplies(*activation))
    throw KernelError(std::string(op) + ": the only activations an epilogue applies are relu and relu6");
  return *activation == Unary::Relu ? EpilogueActivation::Relu : EpilogueActivation::Relu6;
}

int64_t lossLabelBound(const char *op, int64_t classAxis, int64_t classes) {
  if (classes < 0 || classes > classAxis)
    fail(op, std::to_string(classes) + " classes for a class axis of " + std::to_string(classAxis));
  return classes == 0 ? classAxis : classes;
}

int64_t normalizeAxis(const char *op, int64_t axis, int rank) {
  if (axis < -rank || axis >= rank)
    fail(op, "axis " + std::to_string(axis) + " out of range for rank " + std::to_string(rank));
  return axis < 0 ? axis + rank : axis;
}

ConvGeom convGeom(const char *op, const Shape &xs, const Shape &ws, const Dims &strides, const Dims &pads,
                  const Dims &dilations, int64_t group) {
  checkRank(op, xs, 3, "the input (N, C, spatial...)");
  if (ws.size != xs.size) fail(op, "weight " + ws.str() + " and input " + xs.str() + " differ in rank");
  ConvGeom g;
  g.sp = xs.size - 2;
  g.N = xs.v[0];
  g.C = xs.v[1];
  g.F = ws.v[0];
  g.G = group;
  g.Cg = ws.v[1];
  if (group <= 0 || g.C != g.Cg * group || g.F % group)
    fail(op, std::to_string(g.C) + " input channels, group " + std::to_string(group) + " and weight " + ws.str() +
                 " do not match");
  g.Fg = g.F / group;
  if (strides.size != g.sp || dilations.size != g.sp || pads.size != 2 * g.sp)
    fail(op, "strides and dilations need " + std::to_string(g.sp) + " entries and pads " + std::to_string(2 * g.sp));
  for (int a = 0; a < g.sp; ++a) {
    g.in[a] = xs.v[a + 2];
    g.k[a] = ws.v[a + 2];
    g.s[a] = strides.v[a];
    g.pb[a] = pads.v[a];
    g.pe[a] = pads.v[a + g.sp];
    g.d[a] = dilations.v[a];
    if (g.s[a] <= 0 || g.d[a] <= 0 || g.pb[a] < 0 || pads.v[a + g.sp] < 0)
      fail(op, "strides and dilations must be positive and pads non-negative");
    g.out[a] = windowOutputSize(g.in[a], g.k[a], g.s[a], g.pb[a], pads.v[a + g.sp], g.d[a], false);
    if (g.out[a] <= 0) fail(op, "kernel larger than the padded input " + xs.str());
    g.inSize *= g.in[a];
    g.outSize *= g.out[a];
    g.kSize *= g.k[a];
    if (g.k[a] != 1 || g.s[a] != 1 || g.pb[a] != 0 || pads.v[a + g.sp] != 0) g.pointwise = false;
  }
  return g;
}

Shape convOut(const ConvGeom &g) {
  Shape out{g.N, g.F};
  for (int a = 0; a < g.sp; ++a) out.push(g.out[a]);
  return out;
}

Shape reducedShape(const char *op, const Shape &xs, const Dims &axes, bool emptyMeansAll) {
  checkRank(op, xs, 0, "the input");
  bool reduced[kMaxRank] = {};
  for (int i = 0; i < axes.size; ++i) {
    if (axes.v[i] < 0 || axes.v[i] >= xs.size || (i && axes.v[i - 1] >= axes.v[i]))
      fail(op, "axes " + axes.str() + " must be sorted, unique and in [0, " + std::to_string(xs.size) + ")");
    reduced[axes.v[i]] = true;
  }
  Shape kept;
  for (int a = 0; a < xs.size; ++a) kept.push(reduced[a] || (axes.size == 0 && emptyMeansAll) ? 1 : xs.v[a]);
  return kept;
}

RowView rowView(const char *op, const Shape &xs, int64_t axis) {
  checkRank(op, xs, 1, "the input");
  const int a = (int)normalizeAxis(op, axis, xs.size);
  RowView v;
  v.rows = 1;
  v.inner = 1;
  for (int i = 0; i < xs.size; ++i) (i < a ? v.rows : v.inner) *= xs.v[i];
  v.normalized = Shape(xs.v + a, xs.size - a);
  return v;
}

AttentionView attentionView(const char *op, const Shape &qs, const Shape &ks, const Shape &vs, const Shape &ms,
                            bool booleanMask, bool additiveMask, AttentionLayout layout, int64_t jointHeads) {
  const bool sequenceMajor = layout == AttentionLayout::SequenceMajor;
  checkRank(op, qs, sequenceMajor ? 3 : 2, sequenceMajor ? "the sequence-major query" : "the query");
  if (booleanMask && additiveMask) fail(op, "takes a boolean or an additive mask, not both");
  const int r = qs.size;
  // The rows' axis (S or T) is the one axis q, k and v may differ on, but
  // the last (D, where v may differ) and the heads' (H, where k and v may
  // have a divisor of the query's); sequence-major, the heads follow S.
  const int rowAxis = sequenceMajor ? r - 3 : r - 2, headAxis = sequenceMajor ? r - 2 : r - 3;
  bool agree = ks.size == r && vs.size == r && qs.v[r - 1] == ks.v[r - 1] && ks.v[rowAxis] == vs.v[rowAxis];
  for (int a = 0; agree && a < r - 1; ++a)
    if (a == headAxis)
      agree = ks.v[a] == vs.v[a] && (ks.v[a] == qs.v[a] || (ks.v[a] > 0 && qs.v[a] > 0 && qs.v[a] % ks.v[a] == 0));
    else if (a != rowAxis)
      agree = qs.v[a] == ks.v[a] && ks.v[a] == vs.v[a];
  if (!agree)
    fail(op, "query " + qs.str() + ", key " + ks.str() + " and value " + vs.str() +
                 (sequenceMajor ? " are not [L..., S, H, D], [L..., T, H, D], [L..., T, H, Dv] (sequence-major)"
                                : " are not [L..., S, D], [L..., T, D], [L..., T, Dv]") +
                 " (key and value may have a divisor of the query's heads)");
  AttentionView v;
  v.S = qs.v[rowAxis], v.T = ks.v[rowAxis], v.D = qs.v[r - 1], v.Dv = vs.v[r - 1];
  if (headAxis >= 0 && ks.v[headAxis] > 0) v.group = qs.v[headAxis] / ks.v[headAxis];
  v.scores = Shape(qs.v, rowAxis); // L... (sequence-major: L'...)
  for (int a = 0; a < rowAxis; ++a) v.L *= qs.v[a];
  if (sequenceMajor) { // the logical slices l = l' * H + h: scores [L'..., H, S, T]
    const int64_t H = qs.v[r - 2];
    v.L *= H;
    v.scores.push(H);
    v.interleave = H > 0 ? H : 1; // no heads, no slices: nothing to interleave
    v.keyInterleave = ks.v[r - 2] > 0 ? ks.v[r - 2] : 1;
  }
  v.scores.push(v.S);
  v.scores.push(v.T);
  v.masked = booleanMask || additiveMask;
  if (v.masked && !broadcastsTo(ms, v.scores))
    fail(op, "mask of shape " + ms.str() + " does not broadcast to the scores " + v.scores.str());
  if (jointHeads != 0) { // windows of one joint value: q's heads, then k's, then v's
    if (!sequenceMajor || v.D != v.Dv || v.S != v.T || jointHeads < qs.v[r - 2] + 2 * ks.v[r - 2])
      fail(op, "a joint query " + qs.str() + ", key " + ks.str() + " and value " + vs.str() + " of " +
                   std::to_string(jointHeads) + " heads per row must be sequence-major windows of one width and " +
                   "length that the row holds");
    v.jointHeads = jointHeads;
  }
  return v;
}

RotaryView rotaryView(const Shape &xs, const Shape &cs, const Shape &ss) {
  const char *op = "nn.rotary";
  checkRank(op, xs, 1, "x");
  RotaryView v;
  v.width = xs.v[xs.size - 1];
  if (v.width % 2 != 0) fail(op, "the last axis of x " + xs.str() + " must have an even length");
  if (!broadcastsTo(cs, xs) || !broadcastsTo(ss, xs))
    fail(op, "cos " + cs.str() + " and sin " + ss.str() + " must broadcast to x " + xs.str());
  v.sinAlongLastAxis = ss.size > 0 && ss.v[ss.size - 1] == v.width;
  return v;
}

PoolGeom poolGeom(const char *op, const Shape &xs, const Dims &kernel, const Dims &strides, const Dims &pads,
                  const Dims &dilations, bool ceilMode) {
  checkRank(op, xs, 3, "the input (N, C, spatial...)");
  PoolGeom g;
  g.sp = xs.size - 2;
  g.planes = xs.v[0] * xs.v[1];
  if (kernel.size != g.sp || strides.size != g.sp || pads.size != 2 * g.sp ||
      (dilations.size != 0 && dilations.size != g.sp))
    fail(op, "window attributes do not match " + std::to_string(g.sp) + " spatial axes");
  for (int a = g.sp - 1; a >= 0; --a) {
    g.inStr[a] = g.inSize;
    g.inSize *= xs.v[a + 2];
  }
  for (int a = 0; a < g.sp; ++a) {
    g.in[a] = xs.v[a + 2];
    g.k[a] = kernel.v[a];
    g.s[a] = strides.v[a];
    g.d[a] = dilations.size ? dilations.v[a] : 1;
    g.pb[a] = pads.v[a];
    g.pe[a] = pads.v[a + g.sp];
    if (g.k[a] <= 0 || g.s[a] <= 0 || g.d[a] <= 0 || g.pb[a] < 0 || g.pe[a] < 0)
      fail(op, "kernel, strides and dilations must be positive and pads non-negative");
    g.out[a] = windowOutputSize(g.in[a], g.k[a], g.s[a], g.pb[a], g.pe[a], g.d[a], ceilMode);
    if (g.out[a] <= 0) fail(op, "window larger than the padded input " + xs.str());
  }
  for (int a = g.sp - 1; a >= 0; --a) {
    g.outStr[a] = g.outSize;
    g.outSize *= g.out[a];
  }
  return g;
}
} // namespace pipec::kernels
