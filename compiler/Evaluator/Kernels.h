// The reference evaluator's kernels: one plain, obviously-correct loop nest
// per `nn` op, on host tensors, following the ONNX specification.
//
// Plain C++ (no MLIR): the kernels can be tested and reused without a
// context. Every kernel computes in double (int64 for integers) and rounds
// its results to their element type before returning (float32 results hold
// float32 values, int32 results wrap to 32 bits, ...). Attributes arrive
// normalized as the `nn` dialect holds them (axes non-negative where the
// dialect says so, explicit pads, per-axis slice bounds). A kernel that
// cannot compute its result (bad shapes, an index out of range) throws
// EvalError with the reason; the evaluator names the op.
//
// Gradients (dialects/nn/NNGradOps.td) sit beside their forward kernels.
// Each takes the gradient of the forward result first; result shapes that
// dy does not determine (a conv's input, a slice's source, ...) are passed
// explicitly, as the ops hold them in their result types, and checked
// against dy.
//
// The kernels are defined one file per op family, named in each section
// below; Kernels.cpp holds the tensor basics.
#ifndef PIPEC_COMPILER_EVALUATOR_KERNELS_H
#define PIPEC_COMPILER_EVALUATOR_KERNELS_H

#include "runtime/include/pipec/vocabulary.h"
#include "compiler/Import/HostTensor.h"

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace pipec::eval {

/// The evaluator shares the importer's host tensor: constants folded at
/// import time and evaluated values are the same type, with no conversion.
/// Floating-point data lives in `floats` (double), integers and bools in
/// `ints` (int64, bools as 0/1).
using ElementKind = import::ElementKind;
using Tensor = import::HostTensor;

struct EvalError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// A tensor of the given kind and shape, all zeros.
Tensor zeros(ElementKind kind, std::vector<int64_t> shape);

/// Rounds every element to what `tensor.kind` can hold: float32, float16 and
/// bfloat16 round to nearest even, integers wrap to their width (two's
/// complement, as C++ and numpy do), bools become 0/1. Floating values stay
/// in double when setFloatRounding(false).
void roundToElementType(Tensor &tensor);

/// Whether floating results are rounded to their element type (the default)
/// or kept in double throughout: the model's function in float64, for
/// comparisons with float64 references where float32 is ill-conditioned
/// (pipec-reference --fp64, docs/evaluator.md). Process-wide.
void setFloatRounding(bool round);

/// "[2,3]": shapes in error messages.
std::string shapeToString(const std::vector<int64_t> &shape);

namespace kernels {

//===----------------------------------------------------------------------===//
// Element-wise (ElementwiseKernels.cpp)
//===----------------------------------------------------------------------===//

/// The element-wise binary functions: pipec/vocabulary.h's binary table.
using BinaryOp = ::pipec::Binary;
/// The element-wise unary functions: pipec/vocabulary.h's table.
using UnaryOp = ::pipec::Unary;

/// Element-wise with numpy broadcasting. Integer Div truncates toward zero
/// (C++ and ONNX's reference implementation); integer division by zero and
/// integer Pow with a negative exponent throw. The table's comparisons and
/// logical functions return Bool.
Tensor binary(BinaryOp op, const Tensor &lhs, const Tensor &rhs);
Tensor unary(UnaryOp op, const Tensor &input);
Tensor where(const Tensor &condition, const Tensor &x, const Tensor &y);
/// The rotary embedding (nn.rotary): x * cos + R(x) * sin over the last axis,
/// or (transposed) x * cos + Rᵀ(x * sin); R(v) = concat(-v[D/2:], v[:D/2]),
/// or with `interleaved` (-v[1], v[0], -v[3], v[2], ...). cos and sin
/// broadcast to x.
Tensor rotary(const Tensor &input, const Tensor &cos, const Tensor &sin, bool interleaved, bool transposed);
/// ONNX Cast. Floating point to integer truncates toward zero, saturating at
/// the target's range (NaN becomes 0: ONNX leaves both undefined); anything
/// to Bool is "!= 0".
Tensor cast(const Tensor &input, ElementKind to);

/// dx = dy * f'(x); `forward` is x or y (the forward result), whichever
/// pipec/vocabulary.h's table says the kind's derivative reads.
Tensor unaryGrad(UnaryOp op, const Tensor &dy, const Tensor &forward);

/// nn.binary_grad's kinds: pipec/vocabulary.h's table.
using BinaryGradKind = ::pipec::BinaryGradient;
/// The gradient on the broadcast shape (dy's): -dy, -dy*lhs/rhs^2,
/// dy*rhs*lhs^(rhs-1), dy*lhs^rhs*ln(lhs).
Tensor binaryGrad(BinaryGradKind kind, const Tensor &dy, const Tensor &lhs, const Tensor &rhs);

struct DropoutResults {
  Tensor output, mask;
};
/// Identity with an all-true mask unless training with ratio > 0; then an
/// element is kept when dropoutUniform(streamKey, index) >= ratio, and kept
/// elements are scaled by 1 / (1 - ratio).
DropoutResults dropout(const Tensor &input, double ratio, bool training, uint64_t streamKey);
/// dy * mask / (1 - ratio) in training, dy otherwise.
Tensor dropoutGrad(const Tensor &dy, const Tensor &mask, double ratio, bool training);

/// The dropout generator (docs/evaluator.md): SplitMix64, stateless and
/// counter-based, so generated code reproduces it with a few integer ops.
/// mix64 is SplitMix64's finalizer; the stream key chains it over the key
/// parts; element i of a stream is mix64(key + (i + 1) * golden gamma),
/// i.e. the i-th output of SplitMix64 seeded with the key.
uint64_t mix64(uint64_t value);
uint64_t dropoutStreamKey(uint64_t seed, uint64_t step, uint64_t microBatch, uint64_t opId);
/// A uniform double in [0, 1) from the top 53 bits of element `index`.
double dropoutUniform(uint64_t streamKey, uint64_t index);

//===----------------------------------------------------------------------===//
// Linear algebra (LinalgKernels.cpp)
//===----------------------------------------------------------------------===//

/// alpha * op(A) * op(B) + beta * C, C broadcast to [M, N].
Tensor gemm(const Tensor &a, const Tensor &b, const Tensor *c, double alpha,
            double beta, bool transA, bool transB);
/// numpy.matmul: 1-D operands are promoted and the added axis removed; batch
/// dimensions broadcast.
Tensor matmul(const Tensor &a, const Tensor &b);

//===----------------------------------------------------------------------===//
// Convolution and pooling (ConvPoolKernels.cpp)
//===----------------------------------------------------------------------===//

using ::pipec::windowOutputSize; // runtime/include/pipec/vocabulary.h

/// N-d convolution; `pads` holds the begin pads of every spatial axis, then
/// the end pads.
Tensor conv(const Tensor &input, const Tensor &weight, const Tensor *bias,
            const std::vector<int64_t> &strides, const std::vector<int64_t> &pads,
            const std::vector<int64_t> &dilations, int64_t group);
/// Transposed convolution: the gradient of conv's input of shape inputShape.
Tensor convInputGrad(const Tensor &dy, const Tensor &weight, const std::vector<int64_t> &inputShape,
                     const std::vector<int64_t> &strides, const std::vector<int64_t> &pads,
                     const std::vector<int64_t> &dilations, int64_t group);
/// The gradient of conv's weight of shape weightShape.
Tensor convWeightGrad(const Tensor &dy, const Tensor &input,
                      const std::vector<int64_t> &weightShape,
                      const std::vector<int64_t> &strides, const std::vector<int64_t> &pads,
                      const std::vector<int64_t> &dilations, int64_t group);

/// Padding never wins the max (it is -infinity).
Tensor maxPool(const Tensor &input, const std::vector<int64_t> &kernel,
               const std::vector<int64_t> &strides, const std::vector<int64_t> &pads,
               const std::vector<int64_t> &dilations, bool ceilMode);
/// The divisor counts the window's positions inside the input, or with
/// count_include_pad inside the padded input (positions past the end padding,
/// which only ceil mode creates, never count).
Tensor averagePool(const Tensor &input, const std::vector<int64_t> &kernel,
                   const std::vector<int64_t> &strides, const std::vector<int64_t> &pads,
                   bool ceilMode, bool countIncludePad);
Tensor globalAveragePool(const Tensor &input);

/// dy of each window goes to the window's first maximum (row-major over the
/// kernel positions; padding never wins), as maxPool picks it.
Tensor maxPoolGrad(const Tensor &dy, const Tensor &input, const std::vector<int64_t> &kernel,
                   const std::vector<int64_t> &strides, const std::vector<int64_t> &pads,
                   const std::vector<int64_t> &dilations, bool ceilMode);
/// dy / divisor spread over each window's input positions (the divisor of
/// averagePool).
Tensor averagePoolGrad(const Tensor &dy, const std::vector<int64_t> &inputShape,
                       const std::vector<int64_t> &kernel, const std::vector<int64_t> &strides,
                       const std::vector<int64_t> &pads, bool ceilMode, bool countIncludePad);

//===----------------------------------------------------------------------===//
// Normalization (NormalizationKernels.cpp)
//===----------------------------------------------------------------------===//

struct BatchNormResults {
  Tensor output, runningMean, runningVar;
};
/// Training: normalizes with the batch mean and population variance (over N
/// and the spatial axes) and returns running = momentum * running +
/// (1 - momentum) * batch, the batch variance being the population variance
/// as in ONNX's reference (PyTorch uses the unbiased one). Inference: uses
/// and returns the running statistics.
BatchNormResults batchNorm(const Tensor &input, const Tensor &scale, const Tensor &bias,
                           const Tensor &runningMean, const Tensor &runningVar,
                           double epsilon, double momentum, bool training);

/// Training: through the batch statistics (recomputed from the input, the
/// population variance); inference: the running statistics are constants.
Tensor batchNormGrad(const Tensor &dy, const Tensor &input, const Tensor &scale,
                     const Tensor &runningMean, const Tensor &runningVar, double epsilon,
                     bool training);
struct ParamGrads {
  Tensor scale, bias;
};
/// dscale = sum(dy * xhat), dbias = sum(dy) over all axes but 1.
ParamGrads batchNormParamGrad(const Tensor &dy, const Tensor &input, const Tensor &runningMean,
                              const Tensor &runningVar, double epsilon, bool training);

struct LayerNormResults {
  Tensor output, mean, invStdDev;
};
/// Normalizes over the axes from `axis` on (negative counts from the end),
/// subtracting the mean when `centered` (LayerNormalization; else
/// RMSNormalization, whose mean is 0); scale and bias broadcast to those axes.
LayerNormResults layerNorm(const Tensor &input, const Tensor &scale, const Tensor *bias,
                           int64_t axis, double epsilon, bool centered);
Tensor layerNormGrad(const Tensor &dy, const Tensor &input, const Tensor &scale, int64_t axis,
                     double epsilon, bool centered);
/// dscale = sum(dy * xhat), dbias = sum(dy) over the leading axes, then
/// summed down to scaleShape and biasShape (which broadcast to the
/// normalized axes, as the forward's scale and bias do).
ParamGrads layerNormParamGrad(const Tensor &dy, const Tensor &input, int64_t axis,
                              double epsilon, bool centered, const std::vector<int64_t> &scaleShape,
                              const std::vector<int64_t> &biasShape);

//===----------------------------------------------------------------------===//
// Softmax, loss and reductions (ReductionKernels.cpp)
//===----------------------------------------------------------------------===//

Tensor softmax(const Tensor &input, int64_t axis);
/// From the forward result: y * (dy - sum(dy * y)) along the axis.
Tensor softmaxGrad(const Tensor &dy, const Tensor &y, int64_t axis);
/// nn.masked_softmax: softmax along the last axis of where(mask == maskedWhen,
/// fill, divide ? input / scale : input * scale), the composite it stands for.
Tensor maskedSoftmax(const Tensor &input, const Tensor &mask, double scale, bool divide, double fill,
                     bool maskedWhen);
/// Its gradient from the forward result: the softmax's, zero where masked,
/// times (divided by) scale.
Tensor maskedSoftmaxGrad(const Tensor &dy, const Tensor &y, const Tensor &mask, double scale, bool divide,
                         bool maskedWhen);

struct AttentionResults {
  Tensor output, logSumExp;
};
/// nn.attention, composed of the kernels above (matmul, the masked softmax,
/// or a scaled softmax after adding a floating-point mask or without one,
/// a training-mode dropout of the probabilities when dropoutRatio > 0 (the
/// mask keyed by dropoutStreamKey), matmul); mask may be null. Key and
/// value may have a divisor of the query's heads (axis -3, grouped-query
/// heads): each is repeated in place first (query head h reads head h / g).
AttentionResults attention(const Tensor &query, const Tensor &key, const Tensor &value, const Tensor *mask,
                           double scale, bool divide, double fill, bool maskedWhen, double dropoutRatio = 0,
                           uint64_t dropoutStreamKey = 0);
struct AttentionGrads {
  Tensor query, key, value;
};
/// nn.attention_grad: the gradients of the composition above (grouped
/// heads' key and value gradients summed over their group).
AttentionGrads attentionGrad(const Tensor &dy, const Tensor &query, const Tensor &key, const Tensor &value,
                             const Tensor *mask, double scale, bool divide, double fill, bool maskedWhen,
                             double dropoutRatio = 0, uint64_t dropoutStreamKey = 0);

struct SoftmaxCrossEntropyResults {
  Tensor loss, logProb;
};
/// scores [N, C, d...], labels [N, d...]. Elements whose label equals
/// ignoreIndex contribute 0 and weigh nothing; "mean" divides by the summed
/// weights of the other elements (their count without weights). Labels
/// must be below `classes` (0: C; a padded class axis, whose padding's
/// scores are -inf: nn.softmax_cross_entropy_loss's `classes`).
SoftmaxCrossEntropyResults softmaxCrossEntropyLoss(const Tensor &scores, const Tensor &labels,
                                                   const Tensor *weights,
                                                   const std::string &reduction,
                                                   std::optional<int64_t> ignoreIndex,
                                                   int64_t classes = 0);
/// The gradient of softmaxCrossEntropyLoss's loss (dloss: a scalar for mean
/// and sum, the labels' shape for none) with respect to the scores:
/// dloss * w * (softmax - onehot) / W, W the summed weights for mean, else
/// 1; ignored elements get 0 (and, for mean, all elements ignored give 0).
Tensor softmaxCrossEntropyLossGrad(const Tensor &dloss, const Tensor &scores,
                                   const Tensor &labels, const Tensor *weights,
                                   const std::string &reduction,
                                   std::optional<int64_t> ignoreIndex, int64_t classes = 0);

/// Mean over sorted, non-negative axes (all axes when empty).
Tensor reduceMean(const Tensor &input, const std::vector<int64_t> &axes, bool keepdims);
/// Sum over sorted, unique, non-negative axes; no axes is the identity
/// (nn.reduce_sum's shape rule; nn.reduce_mean reduces all axes instead).
Tensor reduceSum(const Tensor &input, const std::vector<int64_t> &axes, bool keepdims);

//===----------------------------------------------------------------------===//
// Data movement and indexing (DataMovementKernels.cpp)
//===----------------------------------------------------------------------===//

/// ONNX Gather; negative indices count from the end of the axis.
Tensor gather(const Tensor &data, const Tensor &indices, int64_t axis);
/// Scatter-add of dy into zeros of dataShape (repeated indices accumulate).
Tensor gatherGrad(const Tensor &dy, const Tensor &indices, int64_t axis,
                  const std::vector<int64_t> &dataShape);
/// Same data in row-major order under another shape of the same size
/// (Reshape, Flatten, Squeeze, Unsqueeze).
Tensor reshape(const Tensor &input, const std::vector<int64_t> &shape);
/// Numpy broadcast of the input to `shape`.
Tensor expand(const Tensor &input, const std::vector<int64_t> &shape);
Tensor transpose(const Tensor &input, const std::vector<int64_t> &perm);
Tensor concat(const std::vector<const Tensor *> &inputs, int64_t axis);
std::vector<Tensor> split(const Tensor &input, int64_t axis, const std::vector<int64_t> &sizes);
/// Per-axis normalized bounds as `nn.slice` holds them: for a negative step
/// an end of -1 means "past the first element".
Tensor slice(const Tensor &input, const std::vector<int64_t> &starts,
             const std::vector<int64_t> &ends, const std::vector<int64_t> &steps);
/// dy scattered into zeros of inputShape at the slice's positions.
Tensor sliceGrad(const Tensor &dy, const std::vector<int64_t> &starts,
                 const std::vector<int64_t> &ends, const std::vector<int64_t> &steps,
                 const std::vector<int64_t> &inputShape);
/// Constant padding; `pads` holds the begin pads of every axis, then the end pads.
Tensor pad(const Tensor &input, const std::vector<int64_t> &pads, double value);

//===----------------------------------------------------------------------===//
// Optimizers (OptimizerKernels.cpp): PyTorch's update rules. `step` counts
// updates from 1 (the first update is step 1).
//===----------------------------------------------------------------------===//

struct SgdResults {
  Tensor param, momentumBuffer;
};
/// torch.optim.SGD (no dampening, no Nesterov): g = grad + wd * param;
/// buf = g at step 1, else momentum * buf + g (with momentum 0, buf = g);
/// param -= lr * buf.
SgdResults sgdUpdate(const Tensor &param, const Tensor &grad, const Tensor &momentumBuffer,
                     int64_t step, double lr, double momentum, double weightDecay);
struct AdamWResults {
  Tensor param, m, v;
};
/// torch.optim.AdamW: param *= 1 - lr * wd; m = b1 m + (1 - b1) g;
/// v = b2 v + (1 - b2) g^2; param -= lr * (m / (1 - b1^t)) /
/// (sqrt(v / (1 - b2^t)) + eps), t = step.
AdamWResults adamwUpdate(const Tensor &param, const Tensor &grad, const Tensor &m,
                         const Tensor &v, int64_t step, double lr, double beta1, double beta2,
                         double epsilon, double weightDecay);

} // namespace kernels
} // namespace pipec::eval

#endif // PIPEC_COMPILER_EVALUATOR_KERNELS_H
