// Optimizer updates, in place, with the CPU kernels' float32 operation
// order (runtime/kernels/src/optim.cpp, which follows PyTorch's
// single-tensor implementations). Every float operation is an explicit
// round-to-nearest intrinsic so that nvcc cannot contract a multiply and
// an add into an FMA: the results are bit for bit the CPU kernels'.
#include "detail.cuh"
#include "index_map.cuh"


namespace pipec::kernels::cuda {

using namespace detail;

namespace {

__device__ inline void sgdElement(float &param, float g, float *buf, bool fresh, float lr, float momentum,
                                  float weightDecay) {
  if (weightDecay != 0.0f) g = __fadd_rn(g, __fmul_rn(weightDecay, param)); // d_p.add(param, alpha=wd)
  float b;
  if (fresh)
    b = g; // buf = clone(d_p)
  else
    b = __fadd_rn(__fmul_rn(*buf, momentum), g); // buf.mul_(momentum).add_(d_p)
  if (buf) *buf = b;
  param = __fadd_rn(param, __fmul_rn(-lr, b)); // param.add_(buf, alpha=-lr)
}

__global__ void sgdKernel(float *param, const float *grad, float *buf, int64_t n, bool fresh, float lr,
                          float momentum, float weightDecay) {
  for (int64_t i = firstIndex(); i < n; i += gridStride())
    sgdElement(param[i], grad[i], buf ? buf + i : nullptr, fresh, lr, momentum, weightDecay);
}

__device__ inline void adamwElement(float &param, float g, float &m, float &v, const AdamWConstants &c) {
  const float p = __fmul_rn(param, c.decay);
  const float mo = m;
  // torch.lerp: weight < 0.5 ? self + w * (end - self) : end - (end - self) * (1 - w)
  const float mi = c.lerpFromSelf ? __fadd_rn(mo, __fmul_rn(c.w1, __fsub_rn(g, mo)))
                             : __fsub_rn(g, __fmul_rn(__fsub_rn(g, mo), __fsub_rn(1.0f, c.w1)));
  const float vi = __fadd_rn(__fmul_rn(v, c.beta2), __fmul_rn(__fmul_rn(c.w2, g), g));
  const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), c.bias2Sqrt), c.epsilon);
  m = mi;
  v = vi;
  param = __fadd_rn(p, __fdiv_rn(__fmul_rn(-c.stepSize, mi), denom));
}

__global__ void adamwKernel(float *param, const float *grad, float *m, float *v, int64_t n, AdamWConstants c) {
  for (int64_t i = firstIndex(); i < n; i += gridStride()) adamwElement(param[i], grad[i], m[i], v[i], c);
}

// ------------------------------------------------ the stage-wide updates
// One launch updates up to kMaxTableTensors tensors: the table travels as
// the kernel's argument (under the 4 KiB every CUDA version accepts), so the
// update needs no device copy of it and no host synchronization. Each block
// updates kTableChunk consecutive elements of one tensor. toBf16All (the
// bf16 copies of a stage's parameters) uses the same tables.
constexpr int kMaxTableTensors = 64;
constexpr int64_t kTableChunk = int64_t(kThreads) * 16;

template <class Tensor> struct TensorTable {
  Tensor tensors[kMaxTableTensors];
  int64_t firstBlock[kMaxTableTensors + 1]; // tensor k's blocks: [firstBlock[k], firstBlock[k+1])
  int count;
};
using OptimizerTable = TensorTable<OptimizerTensor>;
using ConversionTable = TensorTable<Bf16Conversion>;
static_assert(sizeof(OptimizerTable) < 4096 && sizeof(ConversionTable) < 4096, "a kernel argument");

/// The tensor of this block (binary search over the table) and the
/// element range [lo, hi) it updates.
template <class Tensor>
__device__ inline const Tensor &blockTensor(const TensorTable<Tensor> &table, int64_t &lo, int64_t &hi) {
  const int64_t b = blockIdx.x;
  int first = 0, last = table.count - 1;
  while (first < last) {
    const int mid = (first + last + 1) / 2;
    if (table.firstBlock[mid] <= b)
      first = mid;
    else
      last = mid - 1;
  }
  const Tensor &t = table.tensors[first];
  lo = (b - table.firstBlock[first]) * kTableChunk;
  hi = lo + kTableChunk < t.n ? lo + kTableChunk : t.n;
  return t;
}

/// Gradient i of t as the step uses it: times the clipping factor (the
/// product in double, as the runtime's gradient scaling).
__device__ inline float scaledGrad(const OptimizerTensor &t, int64_t i, double scale) {
  return scale == 1.0 ? t.grad[i] : (float)((double)t.grad[i] * scale);
}

__global__ void sgdAllKernel(const OptimizerTable table, const pipec_step_control *control, bool fresh, float lr,
                             float momentum, float weightDecay) {
  if (control && control->skip != 0) return;
  const double scale = control ? control->grad_scale : 1.0;
  int64_t lo, hi;
  const OptimizerTensor &t = blockTensor(table, lo, hi);
  for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x)
    sgdElement(t.param[i], scaledGrad(t, i, scale), t.state[0] ? t.state[0] + i : nullptr, fresh, lr, momentum,
               weightDecay);
}

__global__ void adamwAllKernel(const OptimizerTable table, const pipec_step_control *control, AdamWConstants c) {
  if (control && control->skip != 0) return;
  const double scale = control ? control->grad_scale : 1.0;
  int64_t lo, hi;
  const OptimizerTensor &t = blockTensor(table, lo, hi);
  for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x)
    adamwElement(t.param[i], scaledGrad(t, i, scale), t.state[0][i], t.state[1][i], c);
}

__global__ void toBf16AllKernel(const ConversionTable table) {
  int64_t lo, hi;
  const Bf16Conversion &t = blockTensor(table, lo, hi);
  if (t.channels > 0) { // [outer, channels, inner] -> [outer, inner, channels]
    const int64_t block = t.channels * t.inner;
    for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) {
      const int64_t outer = i / block, c = (i / t.inner) % t.channels, s = i % t.inner;
      t.to[(outer * t.inner + s) * t.channels + c] = bf16(t.from[i]);
    }
    return;
  }
  for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) t.to[i] = bf16(t.from[i]);
}

/// Launches launch(table, blocks) per kMaxTableTensors tensors with
/// elements (empty tensors take no block).
template <class Tensor, class Launch>
void forEachTable(const Tensor *tensors, int count, Launch launch) {
  TensorTable<Tensor> table{};
  int64_t blocks = 0;
  auto flush = [&] {
    if (table.count == 0) return;
    table.firstBlock[table.count] = blocks;
    launch(table, blocks);
    table = TensorTable<Tensor>{};
    blocks = 0;
  };
  for (int k = 0; k < count; ++k) {
    if (tensors[k].n <= 0) continue;
    table.tensors[table.count] = tensors[k];
    table.firstBlock[table.count] = blocks;
    blocks += (tensors[k].n + kTableChunk - 1) / kTableChunk;
    if (++table.count == kMaxTableTensors) flush();
  }
  flush();
}

void checkStep(const char *op, int64_t step) {
  if (step < 1) fail(op, "step must be >= 1, got " + std::to_string(step));
}

} // namespace

void sgdUpdate(float *param, const float *grad, float *momentumBuffer, int64_t n, int64_t step, float lr,
               float momentum, float weightDecay) {
  checkStep("nn.sgd_update", step);
  const bool fresh = momentum == 0.0f || step == 1;
  if (!momentumBuffer && !fresh) fail("nn.sgd_update", "momentum needs the momentum buffer");
  if (n <= 0) return;
  sgdKernel<<<blocksFor(n), kThreads, 0, stream()>>>(param, grad, momentumBuffer, n, fresh, lr, momentum,
                                                     weightDecay);
  checkLaunch("nn.sgd_update");
}

void adamwUpdate(float *param, const float *grad, float *m, float *v, int64_t n, int64_t step, float lr, float beta1,
                 float beta2, float epsilon, float weightDecay) {
  checkStep("nn.adamw_update", step);
  const AdamWConstants c = adamwConstants(step, lr, beta1, beta2, epsilon, weightDecay);
  if (n <= 0) return;
  adamwKernel<<<blocksFor(n), kThreads, 0, stream()>>>(param, grad, m, v, n, c);
  checkLaunch("nn.adamw_update");
}

void sgdUpdateAll(const OptimizerTensor *tensors, int count, int64_t step, float lr, float momentum,
                  float weightDecay, const pipec_step_control *control) {
  checkStep("nn.sgd_update", step);
  const bool fresh = momentum == 0.0f || step == 1;
  for (int k = 0; k < count; ++k)
    if (!fresh && tensors[k].n > 0 && !tensors[k].state[0]) fail("nn.sgd_update", "momentum needs the momentum buffer");
  forEachTable(tensors, count, [&](const OptimizerTable &table, int64_t blocks) {
    sgdAllKernel<<<(unsigned)blocks, kThreads, 0, stream()>>>(table, control, fresh, lr, momentum, weightDecay);
    checkLaunch("nn.sgd_update");
  });
}

void adamwUpdateAll(const OptimizerTensor *tensors, int count, int64_t step, float lr, float beta1, float beta2,
                    float epsilon, float weightDecay, const pipec_step_control *control) {
  checkStep("nn.adamw_update", step);
  const AdamWConstants c = adamwConstants(step, lr, beta1, beta2, epsilon, weightDecay);
  for (int k = 0; k < count; ++k)
    if (tensors[k].n > 0 && (!tensors[k].state[0] || !tensors[k].state[1]))
      fail("nn.adamw_update", "AdamW needs both moment buffers");
  forEachTable(tensors, count, [&](const OptimizerTable &table, int64_t blocks) {
    adamwAllKernel<<<(unsigned)blocks, kThreads, 0, stream()>>>(table, control, c);
    checkLaunch("nn.adamw_update");
  });
}

void toBf16All(const Bf16Conversion *conversions, int count) {
  forEachTable(conversions, count, [&](const ConversionTable &table, int64_t blocks) {
    toBf16AllKernel<<<(unsigned)blocks, kThreads, 0, stream()>>>(table);
    checkLaunch("nn.cast");
  });
}

} // namespace pipec::kernels::cuda
