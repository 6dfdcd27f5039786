// pipec's CUDA kernel library: the functions that generated CUDA stage code
// (`--target cuda`, one call per `nn` op) runs. The API mirrors the CPU
// kernel library (pipec/cpu_kernels.h) function for function, with the same
// names, signatures and semantics, so that one code generator serves both
// targets; docs/cuda-kernels.md describes what differs.
//
// Conventions, beyond those of cpu_kernels.h:
// - Every tensor pointer is device memory; shapes and attributes are host
//   values (they are static: checks run on the host before any launch and
//   throw pipec::kernels::KernelError naming the op).
// - Kernels run asynchronously on the stream bound by the innermost
//   StreamScope of the calling thread (the stage ABI's `stream`); nothing
//   synchronizes except copyToHost and profileClock.
// - Errors only the data can reveal (an index or a label out of range, an
//   integer division by zero) are recorded by the kernel in a flag and
//   thrown by raiseDeviceErrors(), which generated code calls at the end of
//   every entry point; the bad element is skipped (written as 0).
// - Math: float32 storage everywhere. With Precision::BF16, GEMMs and
//   convolutions run on tensor cores with bfloat16 inputs and float32
//   accumulation (CUBLAS_COMPUTE_32F_FAST_16BF), with Precision::TF32 with
//   TF32 inputs (CUBLAS_COMPUTE_32F_FAST_TF32); element-wise, reduction,
//   normalization, softmax, loss and optimizer kernels stay float32, so the
//   master weights and optimizer state are float32. With Precision::F32 the
//   GEMMs are plain float32 (no TF32).
// - Data-movement templates are instantiated for float, double, int64_t,
//   int32_t and uint8_t, like the CPU library's.
#ifndef PIPEC_CUDA_KERNELS_H
#define PIPEC_CUDA_KERNELS_H

#include "pipec/kernel_scratch.h" // Workspace: a call's scratch in the stage's arena
#include "pipec/kernel_types.h" // Dims, Shape, KernelError, kinds, shape rules, dropout keys

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

namespace pipec::kernels::cuda {

// The host-side vocabulary is the CPU library's.
using kernels::Binary;
using kernels::BinaryGrad;
using kernels::binaryGradKind;
using kernels::broadcastShape;
using kernels::Dims;
using kernels::dropoutOpId;
using kernels::dropoutStreamKey;
using kernels::dropoutUniform;
using kernels::gemmOperandShape;
using kernels::KernelError;
using kernels::kMaxDims;
using kernels::kMaxRank;
using kernels::matmulShape;
using kernels::Reduction;
using kernels::reductionKind;
using kernels::Shape;
using kernels::sliceShape;
using kernels::Unary;
using kernels::unaryKind;
using kernels::windowOutputSize;
using kernels::Workspace;

//===----------------------------------------------------------------------===//
// Execution context
//===----------------------------------------------------------------------===//

using Precision = ::pipec::Precision; // pipec/vocabulary.h: fp32, tf32, bf16

/// Binds `stream` (a cudaStream_t; nullptr is the legacy default stream) and
/// the GEMM precision for the kernels this thread launches until the scope
/// ends; scopes nest. Generated entry points open one per call. A thread's
/// kernel scratch and cuBLASLt workspace are shared by its streams: when a
/// thread moves to another stream, the kernels first wait for the previous
/// stream (synchronizing it), so a stream a thread used must not be
/// destroyed while the thread may still launch kernels.
class StreamScope {
public:
  StreamScope(void *stream, Precision precision);
  ~StreamScope();
  StreamScope(const StreamScope &) = delete;
  StreamScope &operator=(const StreamScope &) = delete;

private:
  void *previousStream_;
  Precision previousPrecision_;
};

/// Stream-ordered device memory (cudaMallocAsync / cudaFreeAsync on the
/// scope's stream): a value's storage inside one generated function.
void *deviceAllocate(size_t bytes);
void deviceFree(void *pointer);
template <class T> class DeviceBuffer {
public:
  explicit DeviceBuffer(int64_t count)
      : data_(static_cast<T *>(deviceAllocate(static_cast<size_t>(count > 0 ? count : 1) * sizeof(T)))) {}
  ~DeviceBuffer() { deviceFree(data_); }
  DeviceBuffer(const DeviceBuffer &) = delete;
  DeviceBuffer &operator=(const DeviceBuffer &) = delete;
  T *data() { return data_; }

private:
  T *data_;
};

/// A constant table of generated code, uploaded to the current device on
/// first use and kept for the life of the process.
class DeviceConstant {
public:
  DeviceConstant(const void *host, size_t bytes);
  ~DeviceConstant();
  DeviceConstant(const DeviceConstant &) = delete;
  DeviceConstant &operator=(const DeviceConstant &) = delete;
  void *get() const { return device_; }

private:
  void *device_ = nullptr;
};

/// Copies between host and device memory on the scope's stream; copyToHost
/// waits for the copy (and everything before it on the stream).
void copyToHost(void *host, const void *device, size_t bytes);
void copyFromHost(void *device, const void *host, size_t bytes);
/// to[i] += from[i] (weight-gradient accumulation of the stage ABI).
void accumulate(float *to, const float *from, int64_t n);
/// Seconds on a steady clock after the scope's stream has drained, so that
/// differences time the kernels between two calls (piperun --profile only).
double profileClock();
/// Throws KernelError (naming the op) if a kernel recorded an error since
/// the last call; also reports failed launches (cudaGetLastError).
void raiseDeviceErrors();

//===----------------------------------------------------------------------===//
// Element-wise
//===----------------------------------------------------------------------===//

/// The arithmetic functions of vocabulary.h's binary table (those giving
/// the operands' type: nn.add, nn.sub, ...): out = a op b with numpy
/// broadcasting; `out` has broadcastShape(as, bs). The formulas are
/// pipec/binary_math.h's.
void binary(Binary op, const float *a, const Shape &as, const float *b, const Shape &bs, float *out);
/// The same on int64: wrapping, Div truncating toward zero; division by zero
/// and negative exponents is a device error.
void binary(Binary op, const int64_t *a, const Shape &as, const int64_t *b, const Shape &bs,
            int64_t *out);
inline void add(const float *a, const Shape &as, const float *b, const Shape &bs, float *out) {
  binary(Binary::Add, a, as, b, bs, out);
}
inline void sub(const float *a, const Shape &as, const float *b, const Shape &bs, float *out) {
  binary(Binary::Sub, a, as, b, bs, out);
}
inline void mul(const float *a, const Shape &as, const float *b, const Shape &bs, float *out) {
  binary(Binary::Mul, a, as, b, bs, out);
}
inline void div(const float *a, const Shape &as, const float *b, const Shape &bs, float *out) {
  binary(Binary::Div, a, as, b, bs, out);
}
inline void pow(const float *a, const Shape &as, const float *b, const Shape &bs, float *out) {
  binary(Binary::Pow, a, as, b, bs, out);
}

/// The functions of vocabulary.h's binary table that give a bool
/// (comparisons, and the logical ones on bool operands): out = a op b as
/// 0/1, numpy broadcasting. Instantiated for float, double, int64_t,
/// int32_t and uint8_t (bool).
template <class T>
void compare(Binary op, const T *a, const Shape &as, const T *b, const Shape &bs, uint8_t *out);
/// nn.equal.
template <class T> void equal(const T *a, const Shape &as, const T *b, const Shape &bs, uint8_t *out) {
  cuda::compare<T>(Binary::Equal, a, as, b, bs, out); // not kernels::compare, which ADL also finds
}
/// nn.rotary: y = x·cos + R(x)·sin over the last axis of x (shape xs, even
/// length), or with `transposed` x·cos + Rᵀ(x·sin); R rotates halves or
/// (`interleaved`) pairs (pipec/rotary_math.h). cos (shape cs) and sin
/// (shape ss) broadcast to xs; y has shape xs.
void rotary(const float *x, const Shape &xs, const float *cos, const Shape &cs, const float *sin,
            const Shape &ss, float *y, bool interleaved, bool transposed);
/// nn.where: out = cond ? x : y, the three broadcast together.
template <class T>
void where(const uint8_t *cond, const Shape &cs, const T *x, const Shape &xs, const T *y,
           const Shape &ys, T *out);

/// nn.relu / nn.tanh / nn.sigmoid / nn.erf / nn.sqrt / nn.gelu (Gelu is
/// approximate="none", GeluTanh approximate="tanh"). y may alias x.
void unary(Unary op, const float *x, int64_t n, float *y);

/// nn.cast (ONNX Cast): float to integer truncates toward zero, saturating
/// at the target's range (NaN becomes 0); anything to bool is "!= 0"; bool
/// is uint8_t. Instantiated for every pair of float, double, int64_t,
/// int32_t, uint8_t.
template <class From, class To> void cast(const From *x, int64_t n, To *y);

//===----------------------------------------------------------------------===//
// Linear algebra (cuBLAS)
//===----------------------------------------------------------------------===//

/// nn.gemm: Y[M,N] = alpha * op(A) * op(B) + beta * C, where op(A) is
/// [M,K] (A stored [K,M] when transA), op(B) is [K,N] (B stored [N,K] when
/// transB), and C (nullptr for none) of shape `cs` broadcasts to [M,N].
/// With `activation`, Y = f(alpha op(A) op(B) + beta C) (nn.gemm's
/// epilogue): relu and gelu_tanh are cuBLASLt epilogues, fused with a bias C
/// of shape [N] or [1, N] and beta 1; other functions run in place after the
/// product.
void gemm(const float *A, const float *B, const float *C, const Shape &cs, float *Y, int64_t M,
          int64_t N, int64_t K, bool transA, bool transB, float alpha, float beta,
          std::optional<Unary> activation = std::nullopt);
/// nn.matmul: numpy matmul with batch broadcasting and the 1-D cases; Y has
/// matmulShape(as, bs). nn.batched_gemm: with transA (transB) the last two
/// axes of A (B), of rank >= 2, are swapped (cuBLAS's trans flags).
void matmul(const float *A, const Shape &as, const float *B, const Shape &bs, float *Y, bool transA = false,
            bool transB = false);

//===----------------------------------------------------------------------===//
// Convolution (im2col + cuBLAS; N-d, groups, dilations, pads)
//===----------------------------------------------------------------------===//

/// nn.conv: x [N, C, d...], w [F, C/group, k...], bias [F] or nullptr;
/// y has pipec::kernels::convOutputShape(...) (cpu_kernels.h). pads: begin pads of every spatial axis, then
/// end pads.
void conv(const float *x, const Shape &xs, const float *w, const Shape &ws, const float *bias,
          float *y, const Dims &strides, const Dims &pads, const Dims &dilations, int64_t group,
          const Workspace &scratch = {});
/// nn.conv_input_grad: dx (shape xs, the forward input's) from dy and w.
void convInputGrad(const float *dy, const Shape &dys, const float *w, const Shape &ws, float *dx,
                   const Shape &xs, const Dims &strides, const Dims &pads, const Dims &dilations,
                   int64_t group, const Workspace &scratch = {});
/// nn.conv_weight_grad: dw (shape ws, the forward weight's) from dy and x.
void convWeightGrad(const float *dy, const Shape &dys, const float *x, const Shape &xs, float *dw,
                    const Shape &ws, const Dims &strides, const Dims &pads, const Dims &dilations,
                    int64_t group, const Workspace &scratch = {});

//===----------------------------------------------------------------------===//
// Normalization
//===----------------------------------------------------------------------===//

/// nn.batch_norm on x [N, C, ...] with per-channel scale, bias, running
/// statistics. Training: batch mean and population variance over N and the
/// spatial axes; newMean = momentum * mean + (1 - momentum) * batchMean
/// (same for the variance, population variance as ONNX's reference).
/// Inference: the running statistics, copied to newMean/newVar. newMean and
/// newVar may alias runningMean and runningVar (in-place update).
void batchNorm(const float *x, const Shape &xs, const float *scale, const float *bias,
               const float *runningMean, const float *runningVar, float *y, float *newMean,
               float *newVar, float epsilon, float momentum, bool training);
/// nn.batch_norm_grad: dx. Training: statistics recomputed from x and
/// differentiated through; inference: dy * scale / sqrt(runningVar + eps).
void batchNormGrad(const float *dy, const float *x, const Shape &xs, const float *scale,
                   const float *runningMean, const float *runningVar, float *dx, float epsilon,
                   bool training);
/// nn.batch_norm_param_grad: dscale = Σ dy·x̂, dbias = Σ dy over all axes
/// but 1 (x̂ from the batch statistics in training, the running ones otherwise).
void batchNormParamGrad(const float *dy, const float *x, const Shape &xs, const float *runningMean,
                        const float *runningVar, float *dscale, float *dbias, float epsilon,
                        bool training);

/// nn.layer_norm over the axes from `axis` on (negative counts from the
/// end), centred (RowNorm::Layer) or not (RowNorm::Rms, whose mean is 0).
/// scale (shape ss) and bias (shape bs, or nullptr) broadcast to the
/// normalized shape. mean and invStd (x's shape with the normalized axes set
/// to 1) may each be nullptr when unused.
void layerNorm(const float *x, const Shape &xs, const float *scale, const Shape &ss,
               const float *bias, const Shape &bs, float *y, float *mean, float *invStd,
               int64_t axis, float epsilon, RowNorm norm = RowNorm::Layer,
               const Workspace &scratch = {});
/// nn.layer_norm_grad: dx = invStd * (g - mean(g) - x̂ * mean(g * x̂)), g = dy * scale
/// (without the mean(g) term under RowNorm::Rms).
void layerNormGrad(const float *dy, const float *x, const Shape &xs, const float *scale,
                   const Shape &ss, float *dx, int64_t axis, float epsilon,
                   RowNorm norm = RowNorm::Layer, const Workspace &scratch = {});
/// nn.layer_norm_param_grad: dscale = Σ dy·x̂ and dbias = Σ dy over the
/// leading axes, summed down to the parameter shape ps (the forward scale's;
/// the bias has the same shape). dbias may be nullptr.
void layerNormParamGrad(const float *dy, const float *x, const Shape &xs, const Shape &ps,
                        float *dscale, float *dbias, int64_t axis, float epsilon,
                        RowNorm norm = RowNorm::Layer, const Workspace &scratch = {});

//===----------------------------------------------------------------------===//
// Pooling
//===----------------------------------------------------------------------===//

/// nn.max_pool: padding never wins (it is -infinity). y has pipec::kernels::poolOutputShape (cpu_kernels.h).
void maxPool(const float *x, const Shape &xs, float *y, const Dims &kernel, const Dims &strides,
             const Dims &pads, const Dims &dilations, bool ceilMode);
/// nn.max_pool_grad: dy routed to the first maximum of each window (window
/// positions in row-major order), accumulated where windows overlap.
void maxPoolGrad(const float *dy, const float *x, const Shape &xs, float *dx, const Dims &kernel,
                 const Dims &strides, const Dims &pads, const Dims &dilations, bool ceilMode,
                 const Workspace &scratch = {});
/// nn.average_pool: the divisor counts the window's positions inside the
/// input, or with countIncludePad inside the padded input (positions past
/// the end padding, which only ceil mode creates, never count).
void averagePool(const float *x, const Shape &xs, float *y, const Dims &kernel, const Dims &strides,
                 const Dims &pads, bool ceilMode, bool countIncludePad);
/// nn.average_pool_grad: dx (shape xs) from dy.
void averagePoolGrad(const float *dy, float *dx, const Shape &xs, const Dims &kernel,
                     const Dims &strides, const Dims &pads, bool ceilMode, bool countIncludePad);
/// nn.global_average_pool: y [N, C, 1...] = mean over the spatial axes.
void globalAveragePool(const float *x, const Shape &xs, float *y);

//===----------------------------------------------------------------------===//
// Dropout (same mask as the CPU kernels and the evaluator: pipec::kernels::dropoutUniform)
//===----------------------------------------------------------------------===//

/// nn.dropout: identity with an all-ones mask unless training with ratio >
/// 0; then element i is kept when dropoutUniform(streamKey, i) >= ratio and
/// kept elements are scaled by 1 / (1 - ratio) (in double, rounded once, as
/// the evaluator does). mask may be nullptr when unused.
void dropout(const float *x, int64_t n, float *y, uint8_t *mask, float ratio, bool training,
             uint64_t streamKey);
/// nn.dropout_grad: dy * mask / (1 - ratio) in training, dy otherwise.
void dropoutGrad(const float *dy, const uint8_t *mask, int64_t n, float *dx, float ratio,
                 bool training);

//===----------------------------------------------------------------------===//
// Softmax, loss, reductions
//===----------------------------------------------------------------------===//

/// nn.softmax along `axis` (negative counts from the end), max subtracted first.
void softmax(const float *x, const Shape &xs, int64_t axis, float *y);
/// nn.softmax_grad: dx = y * (dy - Σ dy·y) along `axis`.
void softmaxGrad(const float *dy, const float *y, const Shape &s, int64_t axis, float *dx);
/// nn.masked_softmax: softmax along the last axis of z, where
/// z = (mask != 0) == maskedWhen ? fill : (divide ? x / scale : x * scale) and
/// the mask (shape ms) broadcasts to x. The same bits as the scale, the where
/// and the softmax one after the other.
void maskedSoftmax(const float *x, const Shape &xs, const uint8_t *mask, const Shape &ms, float scale, bool divide,
                   float fill, bool maskedWhen, float *y);
/// nn.masked_softmax_grad: dx = 0 where masked, else y * (dy - Σ dy·y) times
/// (divide: divided by) scale; the same bits as the three gradients in turn.
void maskedSoftmaxGrad(const float *dy, const float *y, const Shape &s, const uint8_t *mask, const Shape &ms,
                       float scale, bool divide, bool maskedWhen, float *dx);
/// nn.attention: y [L..., S, Dv] = softmax(z) · v along the last axis of
/// z = where(mask == maskedWhen, fill, divide ? s / scale : s * scale),
/// s = q · kᵀ (q [L..., S, D], k [L..., T, D], v [L..., T, Dv]; mask of
/// shape ms broadcast to [L..., S, T], or nullptr for none), or with an
/// additive mask instead (shape ms too) z = (s * scale) + additive; in
/// blocks of score rows; lse [L..., S] gets each row's log Σ exp z.
void attention(const float *q, const Shape &qs, const float *k, const Shape &ks, const float *v, const Shape &vs,
               const uint8_t *mask, const float *additive, const Shape &ms, float scale, bool divide, float fill,
               bool maskedWhen, float *y, float *lse, const Workspace &scratch = {});
/// nn.attention_grad: dq, dk, dv from dy, the forward operands, y and lse
/// (P recomputed as exp(z - lse); dz = P ⊙ (dy·vᵀ - rowsum(dy ⊙ y)), 0 where
/// masked, times or divided by scale).
void attentionGrad(const float *dy, const float *q, const Shape &qs, const float *k, const Shape &ks, const float *v,
                   const Shape &vs, const uint8_t *mask, const float *additive, const Shape &ms, const float *y,
                   const float *lse, float scale, bool divide, float fill, bool maskedWhen, float *dq, float *dk,
                   float *dv, const Workspace &scratch = {});


/// nn.softmax_cross_entropy_loss: scores [N, C, d...], labels [N, d...],
/// weights [C] or nullptr. Elements whose label equals ignoreIndex
/// contribute 0 and weigh nothing; Mean divides by the summed weights of the
/// others. loss is a scalar, or [N, d...] for Reduction::None; logProb
/// (scores' shape) may be nullptr. A label out of [0, C) is a device error.
template <class L>
void softmaxCrossEntropyLoss(const float *scores, const Shape &ss, const L *labels,
                             const float *weights, Reduction reduction,
                             std::optional<int64_t> ignoreIndex, float *loss, float *logProb,
                             const Workspace &scratch = {});
/// nn.softmax_cross_entropy_loss_grad: dscores from dloss (a scalar, or
/// [N, d...] for Reduction::None): (softmax - onehot) * w[label] * dloss / (Σw for Mean).
template <class L>
void softmaxCrossEntropyLossGrad(const float *dloss, const float *scores, const Shape &ss,
                                 const L *labels, const float *weights, Reduction reduction,
                                 std::optional<int64_t> ignoreIndex, float *dscores,
                                 const Workspace &scratch = {});

/// nn.reduce_sum over sorted, unique, non-negative axes (keepdims does not
/// change the data). No axes: a copy.
void reduceSum(const float *x, const Shape &xs, const Dims &axes, float *y);
/// nn.reduce_mean over sorted, non-negative axes; no axes: all axes.
void reduceMean(const float *x, const Shape &xs, const Dims &axes, float *y);

//===----------------------------------------------------------------------===//
// Data movement (T in float, double, int64_t, int32_t, uint8_t)
//===----------------------------------------------------------------------===//

/// nn.gather (ONNX Gather): indices (I = int64_t or int32_t) of shape is
/// index axis `axis` of data; negative indices count from the end.
template <class T, class I>
void gather(const T *data, const Shape &ds, const I *indices, const Shape &is, int64_t axis,
            T *out);
/// nn.gather_grad: dx (shape xs, the forward data's) = zeros, then dy
/// scatter-added at the indices (repeated indices accumulate).
template <class I>
void gatherGrad(const float *dy, const I *indices, const Shape &is, int64_t axis, float *dx,
                const Shape &xs);

/// nn.reshape / flatten / squeeze / unsqueeze: the same bytes; a no-op
/// when dst == src.
void copy(const void *src, size_t bytes, void *dst);
/// nn.transpose: output axis i walks input axis perm[i].
template <class T> void transpose(const T *x, const Shape &xs, const Dims &perm, T *y);
/// nn.concat of `count` inputs along `axis`.
template <class T>
void concat(const T *const *inputs, const Shape *shapes, int count, int64_t axis, T *out);
/// nn.split into pieces of `sizes` along `axis`.
template <class T>
void split(const T *x, const Shape &xs, int64_t axis, const Dims &sizes, T *const *outs);
/// nn.slice with normalized per-axis starts/ends/steps (NNOps.td): for a
/// negative step an end of -1 means "past the first element".
template <class T>
void slice(const T *x, const Shape &xs, const Dims &starts, const Dims &ends, const Dims &steps,
           T *y);
/// nn.slice_grad: dx (shape xs) = zeros with dy scattered at the slice.
void sliceGrad(const float *dy, float *dx, const Shape &xs, const Dims &starts, const Dims &ends,
               const Dims &steps);
/// nn.pad, constant mode, non-negative pads (begin pads of every axis, then end pads).
template <class T> void pad(const T *x, const Shape &xs, const Dims &pads, T value, T *y);
/// nn.expand: numpy broadcast of x (shape xs) to ys.
template <class T> void expand(const T *x, const Shape &xs, T *y, const Shape &ys);

//===----------------------------------------------------------------------===//
// Gradient helpers and optimizers
//===----------------------------------------------------------------------===//

/// nn.unary_grad: dx = dy * f'(x) for `op` (Relu: 1 where y > 0; Tanh:
/// 1 - y²; Sigmoid: y(1 - y); Erf: 2/√π·exp(-x²); Sqrt: 1/(2y); Gelu:
/// Φ(x) + x·φ(x); GeluTanh: the tanh approximation's derivative). x is the
/// forward input, y the forward result; each kind reads the one it needs
/// (the other may be nullptr).
void unaryGrad(Unary op, const float *dy, const float *x, const float *y, int64_t n, float *dx);

/// nn.binary_grad: on the broadcast shape (dy's): SubRhs -dy, DivRhs
/// -dy·lhs/rhs², PowLhs dy·rhs·lhs^(rhs-1), PowRhs dy·lhs^rhs·ln lhs.
void binaryGrad(BinaryGrad op, const float *dy, const float *lhs, const Shape &ls,
                const float *rhs, const Shape &rs, float *dx);

/// nn.sgd_update in place (torch.optim.SGD, dampening 0, no Nesterov):
/// g = grad + wd·param; buf = momentum·buf + g (buf = g at step 1 or with
/// momentum 0); param -= lr·buf.
void sgdUpdate(float *param, const float *grad, float *momentumBuffer, int64_t n, int64_t step,
               float lr, float momentum, float weightDecay);
/// nn.adamw_update in place (torch.optim.AdamW, float32 operation order):
/// param *= 1 - lr·wd; m = β1·m + (1-β1)·g; v = β2·v + (1-β2)·g²;
/// param -= lr/(1-β1^t) · m / (√v/√(1-β2^t) + ε), t = step >= 1.
void adamwUpdate(float *param, const float *grad, float *m, float *v, int64_t n, int64_t step,
                 float lr, float beta1, float beta2, float epsilon, float weightDecay);

} // namespace pipec::kernels::cuda

#endif // PIPEC_CUDA_KERNELS_H
