// Optimizer updates, in place, with the CPU kernels' float32 operation
// order (runtime/kernels/src/optim.cpp, which follows PyTorch's
// single-tensor implementations). Every float operation is an explicit
// round-to-nearest intrinsic so that nvcc cannot contract a multiply and
// an add into an FMA: the results are bit for bit the CPU kernels'.
#include "detail.cuh"
#include "index_map.cuh"

#include <charconv>
#include <cmath>
#include <cstdlib>

namespace pipec::kernels::cuda {

using namespace detail;

namespace {

__global__ void sgdKernel(float *param, const float *grad, float *buf, int64_t n, bool fresh, float lr,
                          float momentum, float weightDecay) {
  for (int64_t i = firstIndex(); i < n; i += gridStride()) {
    float g = grad[i];
    if (weightDecay != 0.0f) g = __fadd_rn(g, __fmul_rn(weightDecay, param[i])); // d_p.add(param, alpha=wd)
    float b;
    if (fresh)
      b = g; // buf = clone(d_p)
    else
      b = __fadd_rn(__fmul_rn(buf[i], momentum), g); // buf.mul_(momentum).add_(d_p)
    if (buf) buf[i] = b;
    param[i] = __fadd_rn(param[i], __fmul_rn(-lr, b)); // param.add_(buf, alpha=-lr)
  }
}

struct AdamWConstants {
  float decay;     // 1 - lr * wd
  float w1;        // 1 - beta1 (the lerp weight)
  bool lerpLow;    // w1 < 0.5 (in double)
  float beta2;     // beta2
  float w2;        // 1 - beta2
  float stepSize;  // lr / (1 - beta1^t)
  float bias2Sqrt; // sqrt(1 - beta2^t)
  float epsilon;
};

__global__ void adamwKernel(float *param, const float *grad, float *m, float *v, int64_t n, AdamWConstants c) {
  for (int64_t i = firstIndex(); i < n; i += gridStride()) {
    const float g = grad[i];
    const float p = __fmul_rn(param[i], c.decay);
    const float mo = m[i];
    // torch.lerp: weight < 0.5 ? self + w * (end - self) : end - (end - self) * (1 - w)
    const float mi = c.lerpLow ? __fadd_rn(mo, __fmul_rn(c.w1, __fsub_rn(g, mo)))
                               : __fsub_rn(g, __fmul_rn(__fsub_rn(g, mo), __fsub_rn(1.0f, c.w1)));
    const float vi = __fadd_rn(__fmul_rn(v[i], c.beta2), __fmul_rn(__fmul_rn(c.w2, g), g));
    const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), c.bias2Sqrt), c.epsilon);
    m[i] = mi;
    v[i] = vi;
    param[i] = __fadd_rn(p, __fdiv_rn(__fmul_rn(-c.stepSize, mi), denom));
  }
}

/// The double a Python script most likely passed for a float attribute:
/// the shortest decimal that round-trips the float, read back as a double
/// (0.999f -> 0.999), as the CPU kernel.
double pythonValue(float f) {
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf - 1, f);
  if (res.ec != std::errc()) return (double)f;
  *res.ptr = '\0';
  return std::strtod(buf, nullptr);
}

} // namespace

void sgdUpdate(float *param, const float *grad, float *momentumBuffer, int64_t n, int64_t step, float lr,
               float momentum, float weightDecay) {
  if (step < 1) fail("nn.sgd_update", "step must be >= 1, got " + std::to_string(step));
  const bool fresh = momentum == 0.0f || step == 1;
  if (!momentumBuffer && !fresh) fail("nn.sgd_update", "momentum needs the momentum buffer");
  if (n <= 0) return;
  sgdKernel<<<blocksFor(n), kThreads, 0, stream()>>>(param, grad, momentumBuffer, n, fresh, lr, momentum,
                                                     weightDecay);
  checkLaunch("nn.sgd_update");
}

void adamwUpdate(float *param, const float *grad, float *m, float *v, int64_t n, int64_t step, float lr, float beta1,
                 float beta2, float epsilon, float weightDecay) {
  if (step < 1) fail("nn.adamw_update", "step must be >= 1, got " + std::to_string(step));
  // Python-side scalars are doubles, converted to float where they meet a
  // float32 tensor (the CPU kernel's derivation, line by line).
  const double t = (double)step, dlr = pythonValue(lr), b1 = pythonValue(beta1), b2 = pythonValue(beta2);
  AdamWConstants c{};
  c.decay = (float)(1.0 - dlr * pythonValue(weightDecay));
  const double w1 = 1.0 - b1; // exp_avg.lerp_(grad, 1 - beta1)
  c.w1 = (float)w1;
  c.lerpLow = w1 < 0.5;
  c.beta2 = (float)b2;
  c.w2 = (float)(1.0 - b2);
  const double bias1 = 1.0 - std::pow(b1, t);
  c.stepSize = (float)(dlr / bias1);
  c.bias2Sqrt = (float)std::sqrt(1.0 - std::pow(b2, t));
  c.epsilon = epsilon;
  if (n <= 0) return;
  adamwKernel<<<blocksFor(n), kThreads, 0, stream()>>>(param, grad, m, v, n, c);
  checkLaunch("nn.adamw_update");
}

} // namespace pipec::kernels::cuda
