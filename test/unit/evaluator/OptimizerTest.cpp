// nn.sgd_update and nn.adamw_update against PyTorch's update rules
// (torch.optim.SGD and torch.optim.AdamW), three steps each. The expected
// values are written out by formula here, following the order of PyTorch's
// single-tensor implementations, not by calling the kernels.
#include "compiler/Evaluator/Evaluator.h"
#include "dialects/nn/NNDialect.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Parser/Parser.h"

#include <gtest/gtest.h>

#include <cmath>

using namespace pipec::eval;

namespace {

Tensor f64(std::vector<double> values) {
  int64_t size = static_cast<int64_t>(values.size());
  return Tensor::ofFloats(ElementKind::Float64, {size}, std::move(values));
}

const std::vector<std::vector<double>> kGrads = {
    {0.5, -1.0, 2.0, 0.0}, {-0.25, 0.75, 1.5, -3.0}, {1.0, 0.125, -2.0, 0.5}};
const std::vector<double> kParam = {1.0, -2.0, 0.5, 3.0};

TEST(Optimizer, SgdHandComputed) {
  // lr 0.5, momentum 0.5, weight decay 0.25 on one element, p0 = 1, grads
  // 0.5, -0.25, 1 (all dyadic, so exact):
  //   step 1: g = 0.5 + 0.25 * 1 = 0.75;            buf = 0.75;    p = 0.625
  //   step 2: g = -0.25 + 0.25 * 0.625 = -0.09375;  buf = 0.28125; p = 0.484375
  //   step 3: g = 1 + 0.25 * 0.484375 = 1.12109375; buf = 1.26171875; p = -0.146484375
  Tensor p = f64({1.0}), buf = f64({0.0});
  std::vector<double> grads{0.5, -0.25, 1.0}, params{0.625, 0.484375, -0.146484375},
      buffers{0.75, 0.28125, 1.26171875};
  for (int step = 1; step <= 3; ++step) {
    auto next = kernels::sgdUpdate(p, f64({grads[step - 1]}), buf, step, 0.5, 0.5, 0.25);
    p = next.param;
    buf = next.momentumBuffer;
    EXPECT_EQ(p.floats[0], params[step - 1]) << "step " << step;
    EXPECT_EQ(buf.floats[0], buffers[step - 1]) << "step " << step;
  }
}

/// torch.optim.SGD, _single_tensor_sgd (dampening 0, nesterov false).
void expectSgd(double lr, double momentum, double weightDecay) {
  std::vector<double> param = kParam, buffer(param.size(), 0.0);
  Tensor p = f64(kParam), buf = f64(std::vector<double>(kParam.size(), 0.0));
  for (int step = 1; step <= 3; ++step) {
    for (size_t i = 0; i < param.size(); ++i) {
      double d_p = kGrads[step - 1][i];
      if (weightDecay != 0)
        d_p = d_p + weightDecay * param[i]; // d_p.add(param, alpha=weight_decay)
      if (momentum != 0) {
        if (step == 1)
          buffer[i] = d_p; // buf = torch.clone(d_p)
        else
          buffer[i] = buffer[i] * momentum + d_p; // buf.mul_(momentum).add_(d_p)
        d_p = buffer[i];
      } else {
        buffer[i] = d_p;
      }
      param[i] = param[i] - lr * d_p; // param.add_(d_p, alpha=-lr)
    }
    auto next = kernels::sgdUpdate(p, f64(kGrads[step - 1]), buf, step, lr, momentum, weightDecay);
    p = next.param;
    buf = next.momentumBuffer;
    for (size_t i = 0; i < param.size(); ++i) {
      EXPECT_NEAR(p.floats[i], param[i], 1e-15) << "step " << step << " element " << i;
      EXPECT_NEAR(buf.floats[i], buffer[i], 1e-15) << "step " << step << " element " << i;
    }
  }
}

TEST(Optimizer, SgdMatchesTorch) {
  expectSgd(0.1, 0.9, 0.01);
  expectSgd(0.1, 0.0, 0.0);
  expectSgd(0.05, 0.0, 0.1);
  expectSgd(0.05, 0.9, 0.0);
}

/// torch.optim.AdamW, _single_tensor_adam with decoupled weight decay
/// (amsgrad false, maximize false).
void expectAdamW(double lr, double beta1, double beta2, double eps, double weightDecay) {
  std::vector<double> param = kParam, m(param.size(), 0.0), v(param.size(), 0.0);
  Tensor p = f64(kParam), mt = f64(m), vt = f64(v);
  for (int step = 1; step <= 3; ++step) {
    for (size_t i = 0; i < param.size(); ++i) {
      double grad = kGrads[step - 1][i];
      param[i] *= 1 - lr * weightDecay;                  // param.mul_(1 - lr * weight_decay)
      m[i] += (grad - m[i]) * (1 - beta1);               // exp_avg.lerp_(grad, 1 - beta1)
      v[i] = v[i] * beta2 + (1 - beta2) * grad * grad;   // exp_avg_sq.mul_(beta2).addcmul_(...)
      double biasCorrection1 = 1 - std::pow(beta1, step);
      double biasCorrection2 = 1 - std::pow(beta2, step);
      double stepSize = lr / biasCorrection1;
      double denom = std::sqrt(v[i]) / std::sqrt(biasCorrection2) + eps;
      param[i] -= stepSize * m[i] / denom;               // param.addcdiv_(exp_avg, denom, -step_size)
    }
    auto next = kernels::adamwUpdate(p, f64(kGrads[step - 1]), mt, vt, step, lr, beta1, beta2,
                                     eps, weightDecay);
    p = next.param;
    mt = next.m;
    vt = next.v;
    for (size_t i = 0; i < param.size(); ++i) {
      EXPECT_NEAR(p.floats[i], param[i], 1e-14) << "step " << step << " element " << i;
      EXPECT_NEAR(mt.floats[i], m[i], 1e-15) << "step " << step << " element " << i;
      EXPECT_NEAR(vt.floats[i], v[i], 1e-15) << "step " << step << " element " << i;
    }
  }
}

TEST(Optimizer, AdamWMatchesTorch) {
  expectAdamW(1e-3, 0.9, 0.999, 1e-8, 1e-2); // PyTorch's defaults
  expectAdamW(0.1, 0.8, 0.99, 1e-6, 0.0);
  expectAdamW(0.5, 0.5, 0.75, 0.125, 0.25);
}

/// The ops, through the evaluator: attributes are f32, so the test uses
/// hyper-parameters exact in float32, and `step` is an i64 operand.
TEST(Optimizer, OpsThroughTheEvaluator) {
  mlir::MLIRContext context;
  context.loadDialect<pipec::nn::NNDialect, mlir::func::FuncDialect>();
  auto module = mlir::parseSourceString<mlir::ModuleOp>(R"mlir(
    func.func @sgd(%p: tensor<4xf64>, %g: tensor<4xf64>, %buf: tensor<4xf64>, %step: i64) -> (tensor<4xf64>, tensor<4xf64>) {
      %new:2 = nn.sgd_update %p, %g, %buf, %step {lr = 0.125 : f32, momentum = 0.75 : f32, weight_decay = 0.0625 : f32} : tensor<4xf64>
      return %new#0, %new#1 : tensor<4xf64>, tensor<4xf64>
    }
    func.func @adamw(%p: tensor<4xf64>, %g: tensor<4xf64>, %m: tensor<4xf64>, %v: tensor<4xf64>, %step: i64) -> (tensor<4xf64>, tensor<4xf64>, tensor<4xf64>) {
      %new:3 = nn.adamw_update %p, %g, %m, %v, %step {lr = 0.25 : f32, beta1 = 0.875 : f32, beta2 = 0.96875 : f32, epsilon = 0.0078125 : f32, weight_decay = 0.125 : f32} : tensor<4xf64>
      return %new#0, %new#1, %new#2 : tensor<4xf64>, tensor<4xf64>, tensor<4xf64>
    })mlir",
                                                        &context);
  ASSERT_TRUE(module);
  auto sgd = module->lookupSymbol<mlir::func::FuncOp>("sgd");
  auto adamw = module->lookupSymbol<mlir::func::FuncOp>("adamw");

  Tensor p = f64(kParam), buf = f64({0, 0, 0, 0});
  Tensor q = f64(kParam), m = f64({0, 0, 0, 0}), v = f64({0, 0, 0, 0});
  for (int step = 1; step <= 3; ++step) {
    Tensor stepValue = Tensor::ofInts(ElementKind::Int64, {}, {step});
    Tensor grad = f64(kGrads[step - 1]);
    auto sgdResults = evaluateFunction(sgd, {p, grad, buf, stepValue});
    ASSERT_TRUE(mlir::succeeded(sgdResults));
    auto expectedSgd = kernels::sgdUpdate(p, grad, buf, step, 0.125, 0.75, 0.0625);
    EXPECT_EQ((*sgdResults)[0].floats, expectedSgd.param.floats) << "step " << step;
    EXPECT_EQ((*sgdResults)[1].floats, expectedSgd.momentumBuffer.floats) << "step " << step;
    p = (*sgdResults)[0];
    buf = (*sgdResults)[1];

    auto adamResults = evaluateFunction(adamw, {q, grad, m, v, stepValue});
    ASSERT_TRUE(mlir::succeeded(adamResults));
    auto expectedAdam =
        kernels::adamwUpdate(q, grad, m, v, step, 0.25, 0.875, 0.96875, 0.0078125, 0.125);
    EXPECT_EQ((*adamResults)[0].floats, expectedAdam.param.floats) << "step " << step;
    q = (*adamResults)[0];
    m = (*adamResults)[1];
    v = (*adamResults)[2];
  }
  // Step 1 of SGD by hand for element 0: g = 0.5 + 0.0625 = 0.5625, buf = g,
  // p = 1 - 0.125 * 0.5625 = 0.9296875; this is p after three steps, so
  // check the torch formula once more through expectSgd's arithmetic.
  std::vector<double> param = kParam, buffer(4, 0.0);
  for (int step = 1; step <= 3; ++step)
    for (size_t i = 0; i < 4; ++i) {
      double d_p = kGrads[step - 1][i] + 0.0625 * param[i];
      buffer[i] = step == 1 ? d_p : buffer[i] * 0.75 + d_p;
      param[i] -= 0.125 * buffer[i];
    }
  for (size_t i = 0; i < 4; ++i)
    EXPECT_NEAR(p.floats[i], param[i], 1e-15);
}

} // namespace
