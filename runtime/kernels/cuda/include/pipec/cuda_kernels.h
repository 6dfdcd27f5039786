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
// - Math: the float overloads read and write float32. With Precision::BF16
//   their GEMMs and convolutions run on tensor cores with bfloat16 inputs
//   and float32 accumulation (CUBLAS_COMPUTE_32F_FAST_16BF: what an op that
//   stays float32 in a bf16 stage gets), with Precision::TF32 with TF32
//   inputs (CUBLAS_COMPUTE_32F_FAST_TF32); with Precision::F32 the GEMMs are
//   plain float32 (no TF32). Master weights and optimizer state are float32.
// - Data-movement templates are instantiated for float, double, int64_t,
//   int32_t and uint8_t, like the CPU library's, and for bf16.
// - bf16 storage (`--precision bf16` stages, pass pipec-bf16-storage): the
//   overloads at the end of this header take `bf16` activations and
//   activation gradients; parameters, optimizer state, parameter gradients,
//   losses and saved statistics stay float. Math inside them is float32
//   (each bf16 is widened on load, each result rounded once to bf16 on
//   store); GEMMs read bf16 operands and accumulate in float32
//   (CUBLAS_COMPUTE_32F). docs/cuda-kernels.md lists them.
#ifndef PIPEC_CUDA_KERNELS_H
#define PIPEC_CUDA_KERNELS_H

#include "pipec/kernel_scratch.h" // Workspace: a call's scratch in the stage's arena
#include "pipec/kernel_types.h" // Dims, Shape, KernelError, kinds, shape rules, dropout keys
#include "pipec/synthetic_data.h" // io::SyntheticField: piperun's synthetic data set

#include <cuda_bf16.h> // __nv_bfloat16 (test/kernels/cuda_emulation/inc has a host stand-in)

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

namespace pipec::kernels::cuda {

/// bfloat16 storage: bf16(floatValue) rounds to nearest even, float(x) widens.
using bf16 = __nv_bfloat16;

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
using kernels::OptimizerTensor;
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

/// Copies device memory to the host on the scope's stream and waits for the
/// copy (and everything before it on the stream).
void copyToHost(void *host, const void *device, size_t bytes);
/// device[0] = value on the scope's stream, the value carried by the
/// kernel's argument: no host memory is read later, nothing waits, and a
/// CUDA graph can capture it (a copy from pageable memory can do neither).
void storeScalar(float *device, float value);
/// to[i] += from[i] (weight-gradient accumulation of the stage ABI).
void accumulate(float *to, const float *from, int64_t n);
/// Writes samples [first, first + count) of a field of piperun's synthetic
/// data set (indices modulo field.samples) to `out`, count x
/// field.sampleElements values of field.dtype (f32, f64, i64, i32, bool):
/// the bytes io::SyntheticData::read writes on the host (pipec/dataset.h),
/// bit for bit. piperun's CUDA ranks feed their stages with it
/// (docs/runtime.md, "Data read ahead"). Nothing waits and nothing is
/// allocated; every value is a kernel argument, so a CUDA graph that
/// captured the call would replay the same samples: piperun launches it per
/// micro-batch, before the stage's entry point (whose CallGraphs capture only
/// the stage's own work).
void syntheticData(const io::SyntheticField &field, uint64_t first, uint64_t count, void *out);
/// Seconds on a steady clock after the scope's stream has drained, so that
/// differences time the kernels between two calls (piperun --profile only).
double profileClock();
/// Declares that the device memory at `mask` (shape ms, of a boolean mask
/// nn.attention takes) masks exactly the scores above the diagonal: in
/// every [S, T] slice, key j of query i is masked ((mask != 0) ==
/// maskedWhen) exactly when j > i. Generated code declares the constant
/// masks the compiler found causal; an attention with that mask then runs
/// cuDNN's causal mode, which skips the masked blocks, instead of reading
/// the mask. The memory must hold that mask for the rest of the process.
void declareCausalMask(const uint8_t *mask, const Shape &ms, bool maskedWhen);
/// The cuDNN version flash attention runs with (cudnnGetVersion, 91900 for
/// 9.19.0), loading cuDNN on the first call; 0 when it cannot run, with the
/// reason in *why: the kernels were built without cuDNN, libcudnn.so.9 is
/// not found, or it is older than 9.0. Attention then runs on pipec's own
/// kernels (docs/cuda-kernels.md, "Flash attention").
int64_t cudnnVersion(std::string *why = nullptr);
/// Throws KernelError (naming the op) if a kernel recorded an error since
/// the last call; also reports failed launches (cudaGetLastError).
void raiseDeviceErrors();

/// The stream work of one entry point of a generated stage, replayed from
/// CUDA graphs (docs/cuda-codegen.md, "CUDA graphs"): one object per entry
/// point and thread. run() first writes the call's dropout key
/// (pipec::kernels::dropoutCallKey of its seed, step and micro-batch) to
/// device memory, where the call's StreamKeys read it, then:
/// - runs `work` launch by launch on the first call of each kind (training,
///   inference: lazy set-up such as constant tables and library handles
///   happens then), when the call asks for it (a timer, `no_graphs`), and
///   for good once a capture failed (said once on stderr);
/// - otherwise launches the graph of the call's buffers (every pointer of
///   the call, its stream, loss scale and inference flag), capturing `work`
///   into it first if it is new, or if the kernels' own scratch memory was
///   reallocated since (the graph would hold freed addresses). At most
///   kMaxCallGraphs graphs per object; the least recently used goes.
/// `work` receives the key's device address (nullptr without dropout).
class CallGraphs {
public:
  static constexpr int kMaxCallGraphs = 64;
  explicit CallGraphs(const char *entryPoint);
  ~CallGraphs();
  CallGraphs(const CallGraphs &) = delete;
  CallGraphs &operator=(const CallGraphs &) = delete;
  void run(const pipec_call *call, const pipec_stage_desc &stage, bool drawsDropout,
           const std::function<void(const uint64_t *callKey)> &work);

private:
  struct State;
  State *state_;
};

/// A dropout stream key as the kernels take it: `value` itself, or, with
/// `call` set, pipec::kernels::dropoutOpStreamKey(*call, value) with `*call`
/// read on the device when the kernel runs. Generated entry points pass the
/// second kind (CallGraphs writes the call's key before the call's work), so
/// that a CUDA graph of a call draws that call's masks on every replay.
struct StreamKey {
  uint64_t value = 0;             // the key (call == nullptr) or the op's id
  const uint64_t *call = nullptr; // device memory: the call's dropoutCallKey
  StreamKey(uint64_t key) : value(key) {} // NOLINT: a plain key converts
  StreamKey(const uint64_t *callKey, uint64_t opId) : value(opId), call(callKey) {}
#if defined(__CUDACC__) || defined(PIPEC_CUDA_EMULATION)
  /// The key, on the device.
  __device__ uint64_t resolve() const { return call ? kernels::dropoutOpStreamKey(*call, value) : value; }
#endif
};
using DropoutKey = StreamKey;

/// V consecutive elements that move in one aligned load or store (16 bytes
/// at most in a loop of its own; a loop joined to a bf16 norm's kernel moves
/// 8 floats, two 16-byte halves): generated element-wise kernels read and
/// write their non-broadcast operands this way (docs/cuda-codegen.md).
template <class T, int V> struct alignas(sizeof(T) * V) Packed {
  T v[V];
};
/// Whether every pointer is aligned for Packed<element, V> (host).
template <int V, class... T> bool packedAligned(const T *...pointers) {
  return ((reinterpret_cast<uintptr_t>(pointers) % (sizeof(T) * V) == 0) && ...);
}
#if defined(__CUDACC__) || defined(PIPEC_CUDA_EMULATION)
template <int V, class T> __device__ __forceinline__ Packed<T, V> loadPacked(const T *at) {
  return *reinterpret_cast<const Packed<T, V> *>(at);
}
template <int V, class T> __device__ __forceinline__ void storePacked(T *at, const Packed<T, V> &value) {
  *reinterpret_cast<Packed<T, V> *>(at) = value;
}
/// The same V elements one by one, at any alignment: a loop joined to a
/// row norm moves the norm's V elements a step even where its own operands
/// are not aligned for them (docs/cuda-codegen.md).
template <int V, class T> __device__ __forceinline__ Packed<T, V> loadElements(const T *at) {
  Packed<T, V> p;
  for (int e = 0; e < V; ++e) p.v[e] = at[e];
  return p;
}
template <int V, class T> __device__ __forceinline__ void storeElements(T *at, const Packed<T, V> &value) {
  for (int e = 0; e < V; ++e) at[e] = value.v[e];
}
#endif

#include "pipec/kernel_api.inc"

//===----------------------------------------------------------------------===//
// What only CUDA declares this way
//===----------------------------------------------------------------------===//

/// nn.equal.
template <class T> void equal(const T *a, const Shape &as, const T *b, const Shape &bs, uint8_t *out) {
  cuda::compare<T>(Binary::Equal, a, as, b, bs, out); // not kernels::compare, which ADL also finds
}
/// Channels-last (NHWC) layout (issue 47): with channelsLast the
/// convolution and pooling calls take the tensors' physical shapes,
/// activations x, y, dy, dx [N, d..., C] (channel axis last; the global
/// average pool's y [N, 1..., C]) and convolution weights w, dw
/// [F, k..., C/group] ("KRSC"); the bias and every attribute (strides,
/// pads, dilations, kernel: per spatial axis, in order) are unchanged, and
/// so are the results, transposed. Without it (the default) nothing
/// changes. The float convolutions, nn.max_pool_grad and
/// nn.global_average_pool are pipec/kernel_api.inc's, shared with the CPU
/// library (which has no channels-last kernels): the five overloads below
/// are their channelsLast versions (no default: a call without the flag is
/// kernel_api.inc's). The scratch queries take the same flag
/// (pipec/kernel_scratch.h).
/// The convolution's epilogue (issue 47; this overload and the bf16 one
/// only): y = f(conv(x, w) + bias + residual), in float; residual (or
/// null) has y's physical shape, layout and storage type and must not
/// overlap y (it may be x: conv(x) + x); f is the activation if any (Unary::Relu or
/// Unary::Relu6, KernelError for any other). cuDNN applies it in the
/// forward's graph where it can (y rounded once), else one pipec kernel
/// after the convolution (a bf16 y is then rounded twice after a cuDNN
/// graph that applied part of it or none, once after pipec's kernels).
void conv(const float *x, const Shape &xs, const float *w, const Shape &ws, const float *bias, float *y,
          const Dims &strides, const Dims &pads, const Dims &dilations, int64_t group, const Workspace &scratch,
          bool channelsLast, const float *residual = nullptr, std::optional<Unary> activation = std::nullopt);
void convInputGrad(const float *dy, const Shape &dys, const float *w, const Shape &ws, float *dx, const Shape &xs,
                   const Dims &strides, const Dims &pads, const Dims &dilations, int64_t group,
                   const Workspace &scratch, bool channelsLast);
void convWeightGrad(const float *dy, const Shape &dys, const float *x, const Shape &xs, float *dw, const Shape &ws,
                    const Dims &strides, const Dims &pads, const Dims &dilations, int64_t group,
                    const Workspace &scratch, bool accumulate, bool channelsLast);
void maxPoolGrad(const float *dy, const float *x, const Shape &xs, float *dx, const Dims &kernel,
                 const Dims &strides, const Dims &pads, const Dims &dilations, bool ceilMode,
                 const Workspace &scratch, bool channelsLast);
void globalAveragePool(const float *x, const Shape &xs, float *y, bool channelsLast);
/// nn.max_pool: padding never wins (it is -infinity). y has pipec::kernels::poolOutputShape (cpu_kernels.h).
void maxPool(const float *x, const Shape &xs, float *y, const Dims &kernel, const Dims &strides,
             const Dims &pads, const Dims &dilations, bool ceilMode, bool channelsLast = false);
/// nn.average_pool: the divisor counts the window's positions inside the
/// input, or with countIncludePad inside the padded input (positions past
/// the end padding, which only ceil mode creates, never count).
void averagePool(const float *x, const Shape &xs, float *y, const Dims &kernel, const Dims &strides,
                 const Dims &pads, bool ceilMode, bool countIncludePad, bool channelsLast = false);
/// nn.average_pool_grad: dx (shape xs) from dy.
void averagePoolGrad(const float *dy, float *dx, const Shape &xs, const Dims &kernel,
                     const Dims &strides, const Dims &pads, bool ceilMode, bool countIncludePad,
                     bool channelsLast = false);
/// nn.reduce_sum over sorted, unique, non-negative axes (keepdims does not
/// change the data). No axes: a copy. With accumulate each sum (rounded to
/// float) is added into y (a parameter's gradient buffer).
void reduceSum(const float *x, const Shape &xs, const Dims &axes, float *y, bool accumulate = false);
/// nn.reduce_mean over sorted, non-negative axes; no axes: all axes.
void reduceMean(const float *x, const Shape &xs, const Dims &axes, float *y);

//===----------------------------------------------------------------------===//
// bf16 storage overloads (docs/cuda-kernels.md, "bf16 storage"). The same
// semantics as the float functions above on bf16 values widened to float,
// each result rounded once to bf16; what stays float (parameters, losses,
// statistics, parameter gradients) keeps its float pointer. The templates
// above (cast, compare, where, gather, transpose, concat, split, slice, pad,
// expand) are also instantiated for bf16 (cast: float <-> bf16).
//===----------------------------------------------------------------------===//

/// One float32 -> bf16 conversion of toBf16All: to[i] = bf16(from[i]), i < n;
/// with `channels` (> 0) the copy is also moved channels-last: from is
/// [outer, channels, inner] and to [outer, inner, channels] (a convolution
/// weight or image that pipec-channels-last transposes, docs/cuda-codegen.md).
struct Bf16Conversion {
  const float *from;
  bf16 *to;
  int64_t n;
  int64_t channels = 0, inner = 1;
};
/// Every conversion of the table, one launch per 64 tensors (the table is
/// the kernel's argument, as adamwUpdateAll's): the bf16 copies of the
/// parameters an entry point's products read, made at its start
/// (docs/cuda-codegen.md, "bf16 storage").
void toBf16All(const Bf16Conversion *conversions, int count);

void unary(Unary op, const bf16 *x, int64_t n, bf16 *y);
void unaryGrad(Unary op, const bf16 *dy, const bf16 *x, const bf16 *y, int64_t n, bf16 *dx);
void binary(Binary op, const bf16 *a, const Shape &as, const bf16 *b, const Shape &bs, bf16 *out);
void binaryGrad(BinaryGrad op, const bf16 *dy, const bf16 *lhs, const Shape &ls, const bf16 *rhs,
                const Shape &rs, bf16 *dx);
void dropout(const bf16 *x, int64_t n, bf16 *y, uint8_t *mask, float ratio, bool training,
             StreamKey streamKey);
void dropoutGrad(const bf16 *dy, const uint8_t *mask, int64_t n, bf16 *dx, float ratio, bool training);
void dropoutGradRedrawn(const bf16 *dy, int64_t n, bf16 *dx, float ratio, bool training, StreamKey streamKey);
void rotary(const bf16 *x, const Shape &xs, const float *cos, const Shape &cs, const float *sin,
            const Shape &ss, bf16 *y, bool interleaved, bool transposed);

/// nn.gemm on bf16 A and B with float32 accumulation. Into bf16 Y
/// (activations), C (a bias row or a matrix) float or bf16, as
/// pipec-bf16-storage stores it (docs/cuda-codegen.md); or into float Y
/// (parameter gradients: C == Y with beta 1 accumulates in place, in float).
void gemm(const bf16 *A, const bf16 *B, const float *C, const Shape &cs, bf16 *Y, int64_t M, int64_t N,
          int64_t K, bool transA, bool transB, float alpha, float beta,
          std::optional<Unary> activation = std::nullopt, bf16 *preActivation = nullptr);
void gemmActivationGrad(const bf16 *A, const bf16 *B, const bf16 *x, bf16 *Y, int64_t M, int64_t N, int64_t K,
                        bool transA, bool transB, float alpha, Unary function);
void gemm(const bf16 *A, const bf16 *B, const float *C, const Shape &cs, float *Y, int64_t M, int64_t N,
          int64_t K, bool transA, bool transB, float alpha, float beta,
          std::optional<Unary> activation = std::nullopt);
void gemm(const bf16 *A, const bf16 *B, const bf16 *C, const Shape &cs, bf16 *Y, int64_t M, int64_t N,
          int64_t K, bool transA, bool transB, float alpha, float beta,
          std::optional<Unary> activation = std::nullopt, bf16 *preActivation = nullptr);
/// No C (a null pointer, as generated code writes it): either overload above would do.
inline void gemm(const bf16 *A, const bf16 *B, std::nullptr_t, const Shape &cs, bf16 *Y, int64_t M, int64_t N,
                 int64_t K, bool transA, bool transB, float alpha, float beta,
                 std::optional<Unary> activation = std::nullopt, bf16 *preActivation = nullptr) {
  gemm(A, B, static_cast<const float *>(nullptr), cs, Y, M, N, K, transA, transB, alpha, beta, activation,
       preActivation);
}
void matmul(const bf16 *A, const Shape &as, const bf16 *B, const Shape &bs, bf16 *Y, bool transA = false,
            bool transB = false);
void matmul(const bf16 *A, const Shape &as, const bf16 *B, const Shape &bs, float *Y, bool transA = false,
            bool transB = false);

/// Layer norm on bf16 x/y/dy/dx; scale, bias, mean, invStd, dscale, dbias float.
void layerNorm(const bf16 *x, const Shape &xs, const float *scale, const Shape &ss, const float *bias,
               const Shape &bs, bf16 *y, float *mean, float *invStd, int64_t axis, float epsilon,
               RowNorm norm = RowNorm::Layer, const Workspace &scratch = {});
void layerNormGrad(const bf16 *dy, const bf16 *x, const Shape &xs, const float *scale, const Shape &ss,
                   bf16 *dx, int64_t axis, float epsilon, RowNorm norm = RowNorm::Layer,
                   const Workspace &scratch = {});
void layerNormParamGrad(const bf16 *dy, const bf16 *x, const Shape &xs, const Shape &ps, float *dscale,
                        float *dbias, int64_t axis, float epsilon, RowNorm norm = RowNorm::Layer,
                        const Workspace &scratch = {}, bool accumulate = false);

void softmax(const bf16 *x, const Shape &xs, int64_t axis, bf16 *y);
void softmaxGrad(const bf16 *dy, const bf16 *y, const Shape &s, int64_t axis, bf16 *dx);
void maskedSoftmax(const bf16 *x, const Shape &xs, const uint8_t *mask, const Shape &ms, float scale,
                   bool divide, float fill, bool maskedWhen, bf16 *y);
void maskedSoftmaxGrad(const bf16 *dy, const bf16 *y, const Shape &s, const uint8_t *mask, const Shape &ms,
                       float scale, bool divide, bool maskedWhen, bf16 *dx);
/// Attention on bf16 q, k, v, y (dy, dq, dk, dv); the masks and lse stay
/// float. Scores, softmax and dz are float (in the float call's scratch);
/// P and dz are rounded to bf16 for their products with v, k and q (cuBLAS
/// multiplies operands of one type), every product accumulates in float32.
/// With more query rows than one block holds, dk and dv are rounded to bf16
/// once per block as they accumulate (docs/cuda-kernels.md, "bf16 storage").
void attention(const bf16 *q, const Shape &qs, const bf16 *k, const Shape &ks, const bf16 *v, const Shape &vs,
               const uint8_t *mask, const float *additive, const Shape &ms, float scale, bool divide, float fill,
               bool maskedWhen, float dropoutRatio, bool training, StreamKey dropoutStreamKey, bf16 *y, float *lse,
               const Workspace &scratch = {}, AttentionLayout layout = AttentionLayout::HeadMajor,
               int64_t jointHeads = 0);
void attentionGrad(const bf16 *dy, const bf16 *q, const Shape &qs, const bf16 *k, const Shape &ks, const bf16 *v,
                   const Shape &vs, const uint8_t *mask, const float *additive, const Shape &ms, const bf16 *y,
                   const float *lse, float scale, bool divide, float fill, bool maskedWhen, float dropoutRatio,
                   bool training, StreamKey dropoutStreamKey, bf16 *dq, bf16 *dk, bf16 *dv,
                   const Workspace &scratch = {}, AttentionLayout layout = AttentionLayout::HeadMajor,
                   int64_t jointHeads = 0);
/// Convolutions on bf16 x, w, y (dy, dx) through cuDNN's bf16 graphs, else
/// pipec's float kernels on float32 copies; the bias stays float, and the
/// weight gradient is written (or with accumulate added) into its float
/// buffer (cuDNN computes it in bf16, as its bf16 configuration does:
/// docs/cuda-kernels.md). The forward's epilogue (a bf16 residual, the
/// activation) is the float channels-last overload's, in either layout.
void conv(const bf16 *x, const Shape &xs, const bf16 *w, const Shape &ws, const float *bias, bf16 *y,
          const Dims &strides, const Dims &pads, const Dims &dilations, int64_t group, const Workspace &scratch = {},
          bool channelsLast = false, const bf16 *residual = nullptr,
          std::optional<Unary> activation = std::nullopt);
void convInputGrad(const bf16 *dy, const Shape &dys, const bf16 *w, const Shape &ws, bf16 *dx, const Shape &xs,
                   const Dims &strides, const Dims &pads, const Dims &dilations, int64_t group,
                   const Workspace &scratch = {}, bool channelsLast = false);
void convWeightGrad(const bf16 *dy, const Shape &dys, const bf16 *x, const Shape &xs, float *dw, const Shape &ws,
                    const Dims &strides, const Dims &pads, const Dims &dilations, int64_t group,
                    const Workspace &scratch = {}, bool accumulate = false, bool channelsLast = false);
/// Batch norm with channelsLast (issue 47): x, y, dy, dx, the residual, the
/// activation's output y and maskedDy are [N, d..., C] (channel axis last;
/// rank 2 [N, C] is the same either way), statistics per channel over every
/// other axis; the per-channel parameters, statistics and gradients [C] and
/// every other semantic as without it (the default, pipec/kernel_api.inc's
/// float functions, which the CPU library shares: these float overloads are
/// CUDA's only).
void batchNorm(const float *x, const Shape &xs, const float *scale, const float *bias, const float *runningMean,
               const float *runningVar, float *y, float *newMean, float *newVar, float epsilon, float momentum,
               bool training, const float *residual, std::optional<Unary> activation, bool channelsLast);
void batchNormGrad(const float *dy, const float *x, const Shape &xs, const float *scale, const float *runningMean,
                   const float *runningVar, float *dx, float epsilon, bool training, const float *y,
                   std::optional<Unary> activation, float *maskedDy, bool channelsLast);
void batchNormParamGrad(const float *dy, const float *x, const Shape &xs, const float *runningMean,
                        const float *runningVar, float *dscale, float *dbias, float epsilon, bool training,
                        bool accumulate, bool channelsLast);
/// Batch norm on bf16 x/y/dy/dx; scale, bias, running and new statistics,
/// dscale and dbias float.
void batchNorm(const bf16 *x, const Shape &xs, const float *scale, const float *bias, const float *runningMean,
               const float *runningVar, bf16 *y, float *newMean, float *newVar, float epsilon, float momentum,
               bool training, const bf16 *residual = nullptr, std::optional<Unary> activation = std::nullopt,
               bool channelsLast = false);
void batchNormGrad(const bf16 *dy, const bf16 *x, const Shape &xs, const float *scale, const float *runningMean,
                   const float *runningVar, bf16 *dx, float epsilon, bool training, const bf16 *y = nullptr,
                   std::optional<Unary> activation = std::nullopt, bf16 *maskedDy = nullptr,
                   bool channelsLast = false);
void batchNormParamGrad(const bf16 *dy, const bf16 *x, const Shape &xs, const float *runningMean,
                        const float *runningVar, float *dscale, float *dbias, float epsilon, bool training,
                        bool accumulate = false, bool channelsLast = false);
/// Pooling on bf16 tensors (window sums and means in float, rounded once).
void maxPool(const bf16 *x, const Shape &xs, bf16 *y, const Dims &kernel, const Dims &strides, const Dims &pads,
             const Dims &dilations, bool ceilMode, bool channelsLast = false);
void maxPoolGrad(const bf16 *dy, const bf16 *x, const Shape &xs, bf16 *dx, const Dims &kernel, const Dims &strides,
                 const Dims &pads, const Dims &dilations, bool ceilMode, const Workspace &scratch = {},
                 bool channelsLast = false);
void averagePool(const bf16 *x, const Shape &xs, bf16 *y, const Dims &kernel, const Dims &strides,
                 const Dims &pads, bool ceilMode, bool countIncludePad, bool channelsLast = false);
void averagePoolGrad(const bf16 *dy, bf16 *dx, const Shape &xs, const Dims &kernel, const Dims &strides,
                     const Dims &pads, bool ceilMode, bool countIncludePad, bool channelsLast = false);
void globalAveragePool(const bf16 *x, const Shape &xs, bf16 *y, bool channelsLast = false);

/// Cross-entropy on bf16 scores; the loss (and dloss) stay float.
template <class L>
void softmaxCrossEntropyLoss(const bf16 *scores, const Shape &ss, const L *labels, const float *weights,
                             Reduction reduction, std::optional<int64_t> ignoreIndex, float *loss, bf16 *logProb,
                             const Workspace &scratch = {}, int64_t classes = 0);
template <class L>
void softmaxCrossEntropyLossGrad(const float *dloss, const bf16 *scores, const Shape &ss, const L *labels,
                                 const float *weights, Reduction reduction, std::optional<int64_t> ignoreIndex,
                                 bf16 *dscores, const Workspace &scratch = {}, int64_t classes = 0);

/// Sums of bf16 values into float (bias gradients): as the float versions.
void reduceSum(const bf16 *x, const Shape &xs, const Dims &axes, float *y, bool accumulate = false);
void reduceMean(const bf16 *x, const Shape &xs, const Dims &axes, float *y);
/// Embedding gradient: bf16 dy scatter-added into float dx.
template <class I>
void gatherGrad(const bf16 *dy, const I *indices, const Shape &is, int64_t axis, float *dx, const Shape &xs);
void sliceGrad(const bf16 *dy, bf16 *dx, const Shape &xs, const Dims &starts, const Dims &ends,
               const Dims &steps);

} // namespace pipec::kernels::cuda

#endif // PIPEC_CUDA_KERNELS_H
