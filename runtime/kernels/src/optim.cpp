// Optimizer updates, in place, following PyTorch's single-tensor float32
// implementations operation by operation so that results match
// torch.optim.SGD / torch.optim.AdamW to the last bit where possible.
#include "detail.h"

#include <cmath>

namespace pipec::kernels {

using namespace detail;

namespace {
/// SGD on one tensor, reading gradient i as grad(i) (the stored value, or
/// scaled by the step's clipping factor).
template <class Grad>
void sgdTensor(float *param, Grad grad, float *buf, int64_t n, int64_t step, float lr, float momentum,
               float weightDecay) {
  parallelVectorElements(n, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      float g = grad(i);
      if (weightDecay != 0.0f) g = g + weightDecay * param[i]; // d_p.add(param, alpha=wd)
      float b;
      if (momentum == 0.0f || step == 1)
        b = g; // buf = clone(d_p)
      else
        b = buf[i] * momentum + g; // buf.mul_(momentum).add_(d_p)
      if (buf) buf[i] = b;
      param[i] = param[i] + (-lr) * b; // param.add_(buf, alpha=-lr)
    }
  });
}

void checkStep(const char *op, int64_t step) {
  if (step < 1) fail(op, "step must be >= 1, got " + std::to_string(step));
}
} // namespace

void sgdUpdate(float *param, const float *grad, float *buf, int64_t n, int64_t step, float lr, float momentum,
               float weightDecay) {
  checkStep("nn.sgd_update", step);
  sgdTensor(param, [grad](int64_t i) { return grad[i]; }, buf, n, step, lr, momentum, weightDecay);
}

namespace {
template <class Grad>
void adamwTensor(float *param, Grad grad, float *m, float *v, int64_t n, const AdamWConstants c) {
  parallelVectorElements(n, [=](int64_t lo, int64_t hi) {
    // Everything by value: captured by reference, each pointer and constant
    // would be reloaded after every store (they might alias), and the loop
    // would not vectorize.
    for (int64_t i = lo; i < hi; ++i) {
      const float g = grad(i);
      const float p = param[i] * c.decay;
      // torch.lerp: weight < 0.5 ? self + w * (end - self) : end - (end - self) * (1 - w)
      const float mi = c.lerpFromSelf ? m[i] + c.w1 * (g - m[i]) : g - (g - m[i]) * (1.0f - c.w1);
      const float vi = v[i] * c.beta2 + c.w2 * g * g;
      const float denom = std::sqrt(vi) / c.bias2Sqrt + c.epsilon;
      m[i] = mi;
      v[i] = vi;
      param[i] = p + (-c.stepSize) * mi / denom;
    }
  });
}

/// Calls update(tensor, grad) per tensor unless the control says skip; grad
/// reads the stored gradient, scaled when grad_scale is not 1.
template <class Update>
void updateAll(const OptimizerTensor *tensors, int count, const pipec_step_control *control, Update update) {
  if (control && control->skip != 0) return;
  const double scale = control ? control->grad_scale : 1.0;
  for (int k = 0; k < count; ++k) {
    const float *g = tensors[k].grad;
    if (scale == 1.0)
      update(tensors[k], [g](int64_t i) { return g[i]; });
    else
      update(tensors[k], [g, scale](int64_t i) { return (float)((double)g[i] * scale); });
  }
}
} // namespace

void adamwUpdate(float *param, const float *grad, float *m, float *v, int64_t n, int64_t step, float lr, float beta1,
                 float beta2, float epsilon, float weightDecay) {
  checkStep("nn.adamw_update", step);
  adamwTensor(param, [grad](int64_t i) { return grad[i]; }, m, v, n,
              adamwConstants(step, lr, beta1, beta2, epsilon, weightDecay));
}

void sgdUpdateAll(const OptimizerTensor *tensors, int count, int64_t step, float lr, float momentum,
                  float weightDecay, const pipec_step_control *control) {
  checkStep("nn.sgd_update", step);
  if (momentum != 0.0f && step != 1)
    for (int k = 0; k < count; ++k)
      if (tensors[k].n > 0 && !tensors[k].state[0]) fail("nn.sgd_update", "momentum needs the momentum buffer");
  updateAll(tensors, count, control, [&](const OptimizerTensor &t, auto grad) {
    sgdTensor(t.param, grad, t.state[0], t.n, step, lr, momentum, weightDecay);
  });
}

void adamwUpdateAll(const OptimizerTensor *tensors, int count, int64_t step, float lr, float beta1, float beta2,
                    float epsilon, float weightDecay, const pipec_step_control *control) {
  checkStep("nn.adamw_update", step);
  const AdamWConstants c = adamwConstants(step, lr, beta1, beta2, epsilon, weightDecay);
  updateAll(tensors, count, control,
            [&](const OptimizerTensor &t, auto grad) { adamwTensor(t.param, grad, t.state[0], t.state[1], t.n, c); });
}

} // namespace pipec::kernels
