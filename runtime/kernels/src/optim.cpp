// Optimizer updates, in place, following PyTorch's single-tensor float32
// implementations operation by operation so that results match
// torch.optim.SGD / torch.optim.AdamW to the last bit where possible.
#include "detail.h"

#include <charconv>
#include <cmath>
#include <cstdlib>

namespace pipec::kernels {

using namespace detail;

void sgdUpdate(float *param, const float *grad, float *buf, int64_t n, int64_t step, float lr, float momentum,
               float weightDecay) {
  if (step < 1) fail("nn.sgd_update", "step must be >= 1, got " + std::to_string(step));
  parallelVectorElements(n, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      float g = grad[i];
      if (weightDecay != 0.0f) g = g + weightDecay * param[i]; // d_p.add(param, alpha=wd)
      float b;
      if (momentum == 0.0f || step == 1)
        b = g; // buf = clone(d_p)
      else
        b = buf[i] * momentum + g; // buf.mul_(momentum).add_(d_p)
      buf[i] = b;
      param[i] = param[i] + (-lr) * b; // param.add_(buf, alpha=-lr)
    }
  });
}

namespace {
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

void adamwUpdate(float *param, const float *grad, float *m, float *v, int64_t n, int64_t step, float lr, float beta1,
                 float beta2, float epsilon, float weightDecay) {
  if (step < 1) fail("nn.adamw_update", "step must be >= 1, got " + std::to_string(step));
  // Python-side scalars are doubles, converted to float where they meet a
  // float32 tensor.
  const double t = (double)step, dlr = pythonValue(lr), b1 = pythonValue(beta1), b2 = pythonValue(beta2);
  const float decay = (float)(1.0 - dlr * pythonValue(weightDecay));
  const double w1 = 1.0 - b1; // exp_avg.lerp_(grad, 1 - beta1)
  const float fw1 = (float)w1;
  const float fb2 = (float)b2, w2 = (float)(1.0 - b2);
  const double bias1 = 1.0 - std::pow(b1, t);
  const float stepSize = (float)(dlr / bias1);
  const float bias2Sqrt = (float)std::sqrt(1.0 - std::pow(b2, t));
  const bool lerpFromSelf = w1 < 0.5;
  parallelVectorElements(n, [=](int64_t lo, int64_t hi) {
    // Everything by value: captured by reference, each pointer and constant
    // would be reloaded after every store (they might alias), and the loop
    // would not vectorize.
    for (int64_t i = lo; i < hi; ++i) {
      const float g = grad[i];
      const float p = param[i] * decay;
      // torch.lerp: weight < 0.5 ? self + w * (end - self) : end - (end - self) * (1 - w)
      const float mi = lerpFromSelf ? m[i] + fw1 * (g - m[i]) : g - (g - m[i]) * (1.0f - fw1);
      const float vi = v[i] * fb2 + w2 * g * g;
      const float denom = std::sqrt(vi) / bias2Sqrt + epsilon;
      m[i] = mi;
      v[i] = vi;
      param[i] = p + (-stepSize) * mi / denom;
    }
  });
}

} // namespace pipec::kernels
