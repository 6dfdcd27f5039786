// Optimizer reference kernels: PyTorch's SGD and AdamW update rules.
#include "compiler/Evaluator/KernelsInternal.h"

#include <cmath>

namespace pipec::eval::kernels {

using namespace detail;

namespace {
void requireStep(int64_t step) {
  if (step < 1)
    throw EvalError("step counts updates from 1, got " + std::to_string(step));
}
} // namespace

SgdResults sgdUpdate(const Tensor &param, const Tensor &grad, const Tensor &momentumBuffer,
                     int64_t step, double lr, double momentum, double weightDecay) {
  requireFloating(param, "the parameter");
  requireSameShape(param, grad, "param and grad differ");
  requireSameShape(param, momentumBuffer, "param and momentum buffer differ");
  requireStep(step);
  SgdResults results{zeros(param.kind, param.shape), zeros(param.kind, param.shape)};
  for (size_t i = 0; i < param.floats.size(); ++i) {
    double g = grad.floats[i] + weightDecay * param.floats[i];
    double buffer =
        momentum == 0.0 || step == 1 ? g : momentum * momentumBuffer.floats[i] + g;
    results.momentumBuffer.floats[i] = buffer;
    results.param.floats[i] = param.floats[i] - lr * buffer;
  }
  roundToElementType(results.param);
  roundToElementType(results.momentumBuffer);
  return results;
}

AdamWResults adamwUpdate(const Tensor &param, const Tensor &grad, const Tensor &m,
                         const Tensor &v, int64_t step, double lr, double beta1, double beta2,
                         double epsilon, double weightDecay) {
  requireFloating(param, "the parameter");
  requireSameShape(param, grad, "param and grad differ");
  requireSameShape(param, m, "param and m differ");
  requireSameShape(param, v, "param and v differ");
  requireStep(step);
  double t = static_cast<double>(step);
  double correction1 = 1.0 - std::pow(beta1, t), correction2 = 1.0 - std::pow(beta2, t);
  AdamWResults results{zeros(param.kind, param.shape), zeros(param.kind, param.shape),
                       zeros(param.kind, param.shape)};
  for (size_t i = 0; i < param.floats.size(); ++i) {
    double g = grad.floats[i];
    double decayed = param.floats[i] * (1.0 - lr * weightDecay);
    double mi = beta1 * m.floats[i] + (1.0 - beta1) * g;
    double vi = beta2 * v.floats[i] + (1.0 - beta2) * g * g;
    results.m.floats[i] = mi;
    results.v.floats[i] = vi;
    results.param.floats[i] =
        decayed - lr * (mi / correction1) / (std::sqrt(vi / correction2) + epsilon);
  }
  roundToElementType(results.param);
  roundToElementType(results.m);
  roundToElementType(results.v);
  return results;
}

} // namespace pipec::eval::kernels
