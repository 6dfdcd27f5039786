// The host-side vocabulary shared by pipec's kernel libraries (CPU:
// pipec/cpu_kernels.h, CUDA: pipec/cuda_kernels.h) and the code generated
// for them: shapes and attribute lists, the error type, op kinds, the shape
// rules of the ops, and the dropout mask generator. Implemented in
// runtime/kernels/src/shapes.cpp (library pipec_kernel_types).
#ifndef PIPEC_KERNEL_TYPES_H
#define PIPEC_KERNEL_TYPES_H

#include "pipec/stage_abi.h" // pipec_step_control: the runtime's verdict on a step's gradients
#include "pipec/unary_math.h" // EpilogueActivation
#include "pipec/vocabulary.h"

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <stdexcept>
#include <string>

namespace pipec::kernels {

constexpr int kMaxRank = 8;
constexpr int kMaxDims = 2 * kMaxRank; // pads of a rank-8 pad op

struct KernelError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// A short list of int64: a shape or an attribute array. Fixed capacity, no
/// allocation; constructible from a brace list or a pointer and a count.
struct Dims {
  int32_t size = 0;
  int64_t v[kMaxDims] = {};

  Dims() = default;
  // constexpr: a generated stage's shape constants are constant-initialized.
  constexpr Dims(std::initializer_list<int64_t> values) {
    if (values.size() > (size_t)kMaxDims) throw KernelError("Dims: more than 16 entries");
    for (int64_t x : values) v[size++] = x;
  }
  Dims(const int64_t *values, int count) {
    if (count < 0 || count > kMaxDims) throw KernelError("Dims: bad entry count");
    for (int i = 0; i < count; ++i) v[size++] = values[i];
  }
  int64_t operator[](int i) const { return v[i]; }
  int64_t &operator[](int i) { return v[i]; }
  int rank() const { return size; }
  /// Product of the entries (1 for an empty list: a scalar has one element).
  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < size; ++i) n *= v[i];
    return n;
  }
  void push(int64_t x) {
    if (size >= kMaxDims) throw KernelError("Dims: more than 16 entries");
    v[size++] = x;
  }
  bool operator==(const Dims &o) const {
    if (size != o.size) return false;
    for (int i = 0; i < size; ++i)
      if (v[i] != o.v[i]) return false;
    return true;
  }
  bool operator!=(const Dims &o) const { return !(*this == o); }
  std::string str() const; // "[2,3]"
};
using Shape = Dims;

//===----------------------------------------------------------------------===//
// Shape helpers (the same rules as the ops' result-type inference)
//===----------------------------------------------------------------------===//

/// numpy broadcast of two shapes; throws when they do not broadcast.
Shape broadcastShape(const Shape &a, const Shape &b);
/// numpy.matmul result shape (1-D operands promoted, the added axis removed).
Shape matmulShape(const Shape &a, const Shape &b);
/// The shape of op(X) of nn.batched_gemm: the stored shape with its last two
/// axes swapped when `trans` (throws for rank < 2), else the shape itself.
Shape gemmOperandShape(const Shape &stored, bool trans);
using ::pipec::windowOutputSize; // pipec/vocabulary.h

/// Shape checks shared by the kernel libraries: throw KernelError("op: ...")
/// unless rank is in [atLeast, kMaxRank] and no dimension is negative /
/// unless axis is in [-rank, rank) (returned non-negative).
void checkRank(const char *op, const Shape &s, int atLeast, const char *what);
int64_t normalizeAxis(const char *op, int64_t axis, int rank);

/// An epilogue's activation as the norm and convolution kernels apply it
/// (pipec/unary_math.h): Unary::Relu or Unary::Relu6, or none; KernelError
/// naming `op` for any other.
EpilogueActivation epilogueActivation(const char *op, std::optional<Unary> activation);
/// The bound of a cross-entropy's labels: `classes` (a class axis of
/// `classAxis` padded past it, pipec-pad-classes), or the whole axis for 0;
/// KernelError naming `op` for a count outside [0, classAxis].
int64_t lossLabelBound(const char *op, int64_t classAxis, int64_t classes);

/// The geometry of one convolution (nn.conv and its gradients, both
/// libraries): per spatial axis input, output, kernel, stride, begin pad,
/// dilation. A plain struct, passed to CUDA kernels by value.
struct ConvGeom {
  int sp = 0;
  int64_t N = 0, C = 0, F = 0, G = 1, Cg = 0, Fg = 0;
  int64_t in[kMaxRank] = {}, out[kMaxRank] = {}, k[kMaxRank] = {}, s[kMaxRank] = {}, pb[kMaxRank] = {},
          pe[kMaxRank] = {}, d[kMaxRank] = {}; // pb, pe: begin and end pads
  int64_t inSize = 1, outSize = 1, kSize = 1;
  bool pointwise = true; // 1x1 kernel, stride 1, no pads: im2col is the identity
};
/// Checks x [N, C, d...] against w [F, C/group, k...] and the attributes
/// (errors name `op`) and computes the geometry.
ConvGeom convGeom(const char *op, const Shape &xs, const Shape &ws, const Dims &strides,
                  const Dims &pads, const Dims &dilations, int64_t group);
/// The output shape [N, F, out...] of a geometry.
Shape convOut(const ConvGeom &g);

/// The result shape of nn.reduce_sum / nn.reduce_mean with the reduced axes
/// kept as 1: axes sorted, unique and in [0, rank) (errors name `op`); no
/// axes reduce every axis when `emptyMeansAll`, else none.
Shape reducedShape(const char *op, const Shape &xs, const Dims &axes, bool emptyMeansAll);

/// Whether `in` reaches every element of `out` by numpy broadcasting
/// without enlarging it (both libraries).
inline bool broadcastsTo(const Shape &in, const Shape &out) {
  if (in.size > out.size) return false;
  const int lead = out.size - in.size;
  for (int i = 0; i < in.size; ++i)
    if (in.v[i] != 1 && in.v[i] != out.v[i + lead]) return false;
  return true;
}

/// x seen as rows over the normalized axes from `axis` on (nn.layer_norm and
/// its gradients, both libraries): rows x inner, and the normalized shape.
struct RowView {
  int64_t rows = 0, inner = 0;
  Shape normalized;
};
/// Checks the rank and axis (errors name `op`) and computes the view.
RowView rowView(const char *op, const Shape &xs, int64_t axis);

/// nn.rotary's operands checked (errors name nn.rotary: x's last axis even,
/// cos and sin broadcasting to x): the last axis' length, and whether sin
/// varies along it (then the partner's sin is at the partner's offset).
struct RotaryView {
  int64_t width = 0;
  bool sinAlongLastAxis = false;
};
RotaryView rotaryView(const Shape &xs, const Shape &cs, const Shape &ss);

/// How nn.attention's query, key, value and result hold their heads
/// (docs/dialects.md, nn.attention's sequence_major): HeadMajor
/// [L..., S, D] (heads, if any, among L...), or SequenceMajor
/// [L'..., S, H, D]: each sequence position holds every head's row, as the
/// q/k/v projections write them, so that no transpose is materialized.
enum class AttentionLayout : uint8_t { HeadMajor, SequenceMajor };

/// nn.attention's operands checked (errors name `op`): query [L..., S, D],
/// key [L..., T, D], value [L..., T, Dv] (SequenceMajor: [L'..., S, H, D],
/// [L'..., T, H, D], [L'..., T, H, Dv], L = L'·H), and a boolean or an
/// additive mask (not both) of shape ms broadcast to the scores
/// [L..., S, T], which `scores` is in either layout (as log-sum-exp
/// [L..., S], the dropout draws and the masks are indexed). Grouped-query
/// heads: key and value may have Hkv heads where the query has H = g·Hkv
/// (the heads axis: -3 head-major from rank 3, -2 sequence-major); query
/// head h reads key/value head h / g, as ONNX Attention repeats them.
struct AttentionView {
  int64_t L = 1, S = 0, T = 0, D = 0, Dv = 0;
  /// Slices whose rows interleave: 1 (HeadMajor), H (SequenceMajor); for
  /// key and value, 1 or Hkv.
  int64_t interleave = 1, keyInterleave = 1;
  /// Query slices per key/value slice: slice l reads key/value slice l / group.
  int64_t group = 1;
  Shape scores;
  bool masked = false; // by either mask
  /// Sequence-major q, k and v that are windows of one joint [L'..., S,
  /// jointHeads, D] value (nn.attention's joint_kv_heads): the heads a row
  /// of each holds; 0 when each is its own tensor. Their gradients are
  /// windows of the joint gradient alike; y and dy never are.
  int64_t jointHeads = 0;
  /// Where row `row` of slice l of a result-side operand (y and dy) with
  /// `rows` rows of `width` elements starts, and the distance between its
  /// consecutive rows.
  int64_t rowOffset(int64_t l, int64_t row, int64_t rows, int64_t width) const {
    return offsetIn(interleave, interleave, l, row, rows, width);
  }
  int64_t rowStride(int64_t width) const { return interleave * width; }
  /// The same for q and dq.
  int64_t queryRowOffset(int64_t l, int64_t row, int64_t rows, int64_t width) const {
    return offsetIn(interleave, jointHeads ? jointHeads : interleave, l, row, rows, width);
  }
  int64_t queryRowStride(int64_t width) const { return (jointHeads ? jointHeads : interleave) * width; }
  /// The same for a key-side operand (k, v and their gradients): the rows
  /// of the key/value slice that query slice l reads.
  int64_t keyRowOffset(int64_t l, int64_t row, int64_t rows, int64_t width) const {
    return offsetIn(keyInterleave, jointHeads ? jointHeads : keyInterleave, l / group, row, rows, width);
  }
  int64_t keyRowStride(int64_t width) const { return (jointHeads ? jointHeads : keyInterleave) * width; }

private:
  /// Slice `slice` of `interleave` slices per row of `rowHeads` widths.
  static int64_t offsetIn(int64_t interleave, int64_t rowHeads, int64_t slice, int64_t row, int64_t rows,
                          int64_t width) {
    return (slice / interleave) * rows * rowHeads * width + (slice % interleave) * width + row * rowHeads * width;
  }
};
/// `jointHeads`: AttentionView::jointHeads (at least the query's heads and
/// twice the key's, sequence-major, D = Dv).
AttentionView attentionView(const char *op, const Shape &qs, const Shape &ks, const Shape &vs, const Shape &ms,
                            bool booleanMask, bool additiveMask, AttentionLayout layout = AttentionLayout::HeadMajor,
                            int64_t jointHeads = 0);

/// The row normalization nn.layer_norm computes (docs/dialects.md): ONNX
/// LayerNormalization, (x - mean) / sqrt(var + eps),
/// or RMSNormalization, x / sqrt(mean(x²) + eps), whose mean is 0.
enum class RowNorm : uint8_t { Layer, Rms };

/// The geometry of one pooling (nn.max_pool, nn.average_pool and their
/// gradients, both libraries): per spatial axis input, output, kernel,
/// stride, dilation, begin/end pads, and row-major strides of a plane.
/// One trained parameter of a stage-wide optimizer update (sgdUpdateAll,
/// adamwUpdateAll): n elements of the parameter, its gradient and its state
/// (SGD: state[0] the momentum buffer, may be nullptr with momentum 0;
/// AdamW: state[0] the first moment, state[1] the second).
struct OptimizerTensor {
  float *param = nullptr;
  const float *grad = nullptr;
  float *state[2] = {nullptr, nullptr};
  int64_t n = 0;
};

struct PoolGeom {
  int sp = 0;
  int64_t planes = 0, inSize = 1, outSize = 1;
  int64_t in[kMaxRank] = {}, out[kMaxRank] = {}, k[kMaxRank] = {}, s[kMaxRank] = {}, d[kMaxRank] = {},
          pb[kMaxRank] = {}, pe[kMaxRank] = {}, inStr[kMaxRank] = {}, outStr[kMaxRank] = {};
};
/// Checks x [N, C, d...] and the window attributes (empty dilations mean 1;
/// errors name `op`) and computes the geometry.
PoolGeom poolGeom(const char *op, const Shape &xs, const Dims &kernel, const Dims &strides,
                  const Dims &pads, const Dims &dilations, bool ceilMode);

/// The element-wise binaries and their spellings: pipec/vocabulary.h's table.
using Binary = ::pipec::Binary;

/// The element-wise unaries and their spellings: pipec/vocabulary.h's table.
using Unary = ::pipec::Unary;

/// The Unary spelled `kind` ("relu", ..., "gelu", "gelu_tanh"); throws
/// KernelError naming the accepted spellings otherwise.
Unary unaryKind(const std::string &kind);

enum class Reduction { None, Sum, Mean };
/// "none" / "sum" / "mean".
Reduction reductionKind(const std::string &name);

/// nn.binary_grad's kinds (pipec/vocabulary.h).
using BinaryGrad = ::pipec::BinaryGradient;
/// The BinaryGrad spelled `kind` ("sub_rhs", ...); throws KernelError otherwise.
BinaryGrad binaryGradKind(const std::string &kind);

/// The shape nn.slice produces.
Shape sliceShape(const Shape &xs, const Dims &starts, const Dims &ends, const Dims &steps);

// Dropout masks: exactly the evaluator's generator (compiler/Evaluator/
// ElementwiseKernels.cpp, docs/evaluator.md), so generated code on every target and
// the reference drop the same elements. Header-only so that generated code
// (and device code) can inline it.

constexpr uint64_t kDropoutGamma = 0x9E3779B97F4A7C15ull;

/// SplitMix64's finalizer (without the gamma increment).
constexpr uint64_t dropoutMix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
/// The part of every dropout key that one call (a micro-batch of a step)
/// shares: what a CUDA stage writes to device memory before each call, so
/// that a replayed CUDA graph of the call draws that call's masks.
constexpr uint64_t dropoutCallKey(uint64_t seed, uint64_t step, uint64_t microBatch) {
  uint64_t key = dropoutMix64(seed + kDropoutGamma);
  key = dropoutMix64(key ^ (step + kDropoutGamma));
  return dropoutMix64(key ^ (microBatch + kDropoutGamma));
}
/// The key of one dropout op's mask from its call's key.
constexpr uint64_t dropoutOpStreamKey(uint64_t callKey, uint64_t opId) {
  return dropoutMix64(callKey ^ (opId + kDropoutGamma));
}
/// The key of one dropout op's mask in one micro-batch of one step.
constexpr uint64_t dropoutStreamKey(uint64_t seed, uint64_t step, uint64_t microBatch,
                                    uint64_t opId) {
  return dropoutOpStreamKey(dropoutCallKey(seed, step, microBatch), opId);
}
/// The top 53 bits of element `index` of the stream.
constexpr uint64_t dropoutDraw(uint64_t streamKey, uint64_t index) {
  return dropoutMix64(streamKey + (index + 1) * kDropoutGamma) >> 11;
}
/// A uniform double in [0, 1): dropoutDraw scaled by 2^-53.
constexpr double dropoutUniform(uint64_t streamKey, uint64_t index) {
  return static_cast<double>(dropoutDraw(streamKey, index)) * (1.0 / 9007199254740992.0);
}
/// dropoutUniform(key, i) >= ratio exactly when dropoutDraw(key, i) is at
/// least this: ratio·2^53 is exact, and the draw is an integer. Lets a loop
/// compare integers, which vectorizes.
inline uint64_t dropoutKeepThreshold(double ratio) {
  return static_cast<uint64_t>(std::ceil(ratio * 9007199254740992.0));
}
/// A dropout's draws over a tensor, as nn.dropout keeps and scales element
/// `index` (a flat index into the tensor): kept when its draw passes the
/// threshold, then x / (1 - ratio) in double, rounded once. What kernels use
/// to draw a mask again instead of storing it (attention's dropout of its
/// probabilities). Inactive outside training or at ratio 0.
struct DropoutDraws {
  bool active = false;
  uint64_t streamKey = 0, threshold = 0;
  double scale = 1.0;
  constexpr bool kept(uint64_t index) const { return dropoutDraw(streamKey, index) >= threshold; }
  constexpr float apply(float x, bool keep) const { return keep ? (float)((double)x * scale) : 0.0f; }
};
/// The draws of nn.dropout(ratio, training) under streamKey; throws
/// KernelError naming `op` unless 0 <= ratio < 1.
DropoutDraws dropoutDraws(const char *op, float ratio, bool training, uint64_t streamKey);

/// AdamW's scalars for one step, derived as torch.optim.AdamW derives them
/// (from Python doubles, converted to float where they meet a float32
/// tensor): the CPU and CUDA kernels' one derivation.
struct AdamWConstants {
  float decay;       // 1 - lr * wd
  float w1;          // 1 - beta1 (the lerp weight)
  bool lerpFromSelf; // w1 < 0.5 (in double): torch.lerp's branch
  float beta2, w2;   // beta2, 1 - beta2
  float stepSize;    // lr / (1 - beta1^t)
  float bias2Sqrt;   // sqrt(1 - beta2^t)
  float epsilon;
};
AdamWConstants adamwConstants(int64_t step, float lr, float beta1, float beta2, float epsilon, float weightDecay);

/// The op part of the key when the op has no `seed` attribute: 64-bit
/// FNV-1a of its name (the ONNX node name), as pipec::eval::dropoutOpId.
constexpr uint64_t dropoutOpId(const char *name) {
  uint64_t hash = 0xcbf29ce484222325ull;
  for (; *name; ++name) {
    hash ^= static_cast<unsigned char>(*name);
    hash *= 0x100000001b3ull;
  }
  return hash;
}

} // namespace pipec::kernels

#endif // PIPEC_KERNEL_TYPES_H
