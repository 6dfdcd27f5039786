// The evaluator on `nn` IR: whole functions, errors that name the op, the
// dropout key, and constants in and out of attributes.
#include "compiler/Evaluator/Evaluator.h"
#include "dialects/nn/NNDialect.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Parser/Parser.h"

#include <gtest/gtest.h>

#include <cmath>
#include <set>

using namespace pipec::eval;

namespace {

class EvaluatorTest : public ::testing::Test {
protected:
  EvaluatorTest()
      : handler(&context, [this](mlir::Diagnostic &diagnostic) {
          diagnostics += diagnostic.str() + "\n";
          return mlir::success();
        }) {
    context.loadDialect<pipec::nn::NNDialect, mlir::func::FuncDialect>();
    context.allowUnregisteredDialects();
  }

  mlir::func::FuncOp parse(const std::string &text) {
    module = mlir::parseSourceString<mlir::ModuleOp>(text, &context);
    EXPECT_TRUE(module) << diagnostics;
    return module ? module->lookupSymbol<mlir::func::FuncOp>("forward") : nullptr;
  }

  /// The first op of @forward's body.
  mlir::Operation *firstOp(mlir::func::FuncOp function) {
    return &function.getBody().front().front();
  }

  mlir::MLIRContext context;
  std::string diagnostics;
  mlir::ScopedDiagnosticHandler handler;
  mlir::OwningOpRef<mlir::ModuleOp> module;
};

Tensor f32(std::vector<int64_t> shape, std::vector<double> values) {
  return Tensor::ofFloats(ElementKind::Float32, std::move(shape), std::move(values));
}

TEST_F(EvaluatorTest, EvaluatesAFunction) {
  auto forward = parse(R"mlir(
    func.func @forward(%x: tensor<2x3xf32>, %w: tensor<3x2xf32>) -> tensor<2x2xf32> {
      %b = nn.constant dense<[1.0, -100.0]> : tensor<2xf32>
      %0 = nn.matmul %x, %w : (tensor<2x3xf32>, tensor<3x2xf32>) -> tensor<2x2xf32>
      %1 = nn.add %0, %b : (tensor<2x2xf32>, tensor<2xf32>) -> tensor<2x2xf32>
      %2 = nn.relu %1 : tensor<2x2xf32>
      return %2 : tensor<2x2xf32>
    })mlir");
  ASSERT_TRUE(forward);
  // x * w = [[1*1+2*0+3*1, 1*0+2*1+3*1], [4+6, 5+6]] = [[4, 5], [10, 11]].
  auto results = evaluateFunction(forward, {f32({2, 3}, {1, 2, 3, 4, 5, 6}),
                                            f32({3, 2}, {1, 0, 0, 1, 1, 1})});
  ASSERT_TRUE(mlir::succeeded(results)) << diagnostics;
  ASSERT_EQ(results->size(), 1u);
  EXPECT_EQ((*results)[0].shape, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ((*results)[0].floats, (std::vector<double>{5, 0, 11, 0}));
}

TEST_F(EvaluatorTest, UnknownOpIsAnErrorNamingIt) {
  auto forward = parse(R"mlir(
    func.func @forward(%x: tensor<2xf32>) -> tensor<2xf32> {
      %0 = "mystery.op"(%x) : (tensor<2xf32>) -> tensor<2xf32>
      return %0 : tensor<2xf32>
    })mlir");
  ASSERT_TRUE(forward);
  auto results = evaluateFunction(forward, {f32({2}, {1, 2})});
  EXPECT_TRUE(mlir::failed(results));
  EXPECT_NE(diagnostics.find("has no rule for 'mystery.op'"), std::string::npos) << diagnostics;
}

TEST_F(EvaluatorTest, ArgumentsMustMatchTheSignature) {
  auto forward = parse(R"mlir(
    func.func @forward(%x: tensor<2xf32>) -> tensor<2xf32> {
      %0 = nn.sqrt %x : tensor<2xf32>
      return %0 : tensor<2xf32>
    })mlir");
  ASSERT_TRUE(forward);
  EXPECT_TRUE(mlir::failed(evaluateFunction(forward, {f32({3}, {1, 2, 3})})));
  EXPECT_NE(diagnostics.find("argument 0: value float32[3] does not match type tensor<2xf32>"),
            std::string::npos)
      << diagnostics;
  diagnostics.clear();
  EXPECT_TRUE(mlir::failed(evaluateFunction(forward, {})));
  EXPECT_NE(diagnostics.find("0 argument values for 1 arguments"), std::string::npos)
      << diagnostics;
}

TEST_F(EvaluatorTest, KernelErrorsNameTheOp) {
  auto forward = parse(R"mlir(
    func.func @forward(%x: tensor<3x2xf32>, %i: tensor<1xi64>) -> tensor<1x2xf32> {
      %0 = nn.gather %x, %i : (tensor<3x2xf32>, tensor<1xi64>) -> tensor<1x2xf32>
      return %0 : tensor<1x2xf32>
    })mlir");
  ASSERT_TRUE(forward);
  auto results = evaluateFunction(
      forward, {f32({3, 2}, {0, 1, 2, 3, 4, 5}), Tensor::ofInts(ElementKind::Int64, {1}, {7})});
  EXPECT_TRUE(mlir::failed(results));
  EXPECT_NE(diagnostics.find("'nn.gather' op evaluator: index 7 out of range for axis size 3"),
            std::string::npos)
      << diagnostics;
}

TEST_F(EvaluatorTest, EveryResultOfMultiResultOps) {
  auto forward = parse(R"mlir(
    func.func @forward(%x: tensor<4x3xf32>) -> (tensor<1x3xf32>, tensor<3x3xf32>, tensor<4x1xf32>) {
      %a, %b = nn.split %x {axis = 0 : i64, sizes = array<i64: 1, 3>} : (tensor<4x3xf32>) -> (tensor<1x3xf32>, tensor<3x3xf32>)
      %s = nn.constant dense<1.0> : tensor<3xf32>
      %y, %mean, %inv = nn.layer_norm %x, %s {epsilon = 0.0 : f32} : (tensor<4x3xf32>, tensor<3xf32>) -> (tensor<4x3xf32>, tensor<4x1xf32>, tensor<4x1xf32>)
      return %a, %b, %mean : tensor<1x3xf32>, tensor<3x3xf32>, tensor<4x1xf32>
    })mlir");
  ASSERT_TRUE(forward);
  auto results = evaluateFunction(forward, {f32({4, 3}, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11})});
  ASSERT_TRUE(mlir::succeeded(results)) << diagnostics;
  EXPECT_EQ((*results)[0].floats, (std::vector<double>{0, 1, 2}));
  EXPECT_EQ((*results)[1].shape, (std::vector<int64_t>{3, 3}));
  EXPECT_EQ((*results)[2].floats, (std::vector<double>{1, 4, 7, 10}));
}

TEST_F(EvaluatorTest, DropoutMaskIsKeyedByOptionsAndOp) {
  auto forward = parse(R"mlir(
    func.func @forward(%x: tensor<256xf32>) -> (tensor<256xi1>, tensor<256xi1>, tensor<256xi1>) {
      %y1, %m1 = nn.dropout %x {ratio = 0.5 : f32, training = true} : (tensor<256xf32>) -> (tensor<256xf32>, tensor<256xi1>) loc("dropout_1")
      %y2, %m2 = nn.dropout %x {ratio = 0.5 : f32, training = true} : (tensor<256xf32>) -> (tensor<256xf32>, tensor<256xi1>) loc("dropout_2")
      %y3, %m3 = nn.dropout %x {ratio = 0.5 : f32, training = true, seed = 7 : i64} : (tensor<256xf32>) -> (tensor<256xf32>, tensor<256xi1>) loc("dropout_2")
      return %m1, %m2, %m3 : tensor<256xi1>, tensor<256xi1>, tensor<256xi1>
    })mlir");
  ASSERT_TRUE(forward);
  Tensor x = f32({256}, std::vector<double>(256, 1.0));
  EvalOptions options;
  options.seed = 42;
  auto first = evaluateFunction(forward, {x}, options);
  auto again = evaluateFunction(forward, {x}, options);
  ASSERT_TRUE(mlir::succeeded(first) && mlir::succeeded(again)) << diagnostics;
  EXPECT_EQ((*first)[0].ints, (*again)[0].ints);
  EXPECT_NE((*first)[0].ints, (*first)[1].ints); // two ops, two streams
  EXPECT_NE((*first)[1].ints, (*first)[2].ints); // the seed attribute wins over the name
  options.microBatch = 1;
  auto otherMicroBatch = evaluateFunction(forward, {x}, options);
  ASSERT_TRUE(mlir::succeeded(otherMicroBatch));
  EXPECT_NE((*first)[0].ints, (*otherMicroBatch)[0].ints);
  // The documented key: seed, step, micro-batch, FNV-1a of the node name.
  auto opId = dropoutOpId(firstOp(forward));
  ASSERT_TRUE(mlir::succeeded(opId));
  uint64_t key = kernels::dropoutStreamKey(42, 0, 0, *opId);
  for (int64_t i = 0; i < 256; ++i)
    EXPECT_EQ((*first)[0].ints[i], kernels::dropoutUniform(key, i) >= 0.5);
}

// nn.attention with a dropout of P (what pipec-recognize-composites makes
// of softmax -> dropout -> matmul) against those ops and their gradients:
// the dropout keyed by its `seed` 9, the fused op by dropout_op_id 9, so
// both drop the same elements; in f64 they agree to the last bits.
TEST_F(EvaluatorTest, AttentionDropsWhatItsDropoutDrops) {
  auto forward = parse(R"mlir(
    func.func @forward(%q: tensor<2x4x3xf64>, %k: tensor<2x5x3xf64>, %v: tensor<2x5x2xf64>, %mask: tensor<4x5xi1>,
                       %dy: tensor<2x4x2xf64>)
        -> (tensor<2x4x2xf64>, tensor<2x4x2xf64>, tensor<2x4x3xf64>, tensor<2x5x3xf64>, tensor<2x5x2xf64>,
            tensor<2x4x3xf64>, tensor<2x5x3xf64>, tensor<2x5x2xf64>) {
      %kt = nn.transpose %k {perm = array<i64: 0, 2, 1>} : (tensor<2x5x3xf64>) -> tensor<2x3x5xf64>
      %s = nn.matmul %q, %kt : (tensor<2x4x3xf64>, tensor<2x3x5xf64>) -> tensor<2x4x5xf64>
      %p = nn.masked_softmax %s, %mask {fill = -1.0e9 : f32, scale = 0.5 : f32} : (tensor<2x4x5xf64>, tensor<4x5xi1>) -> tensor<2x4x5xf64>
      %pd, %keep = nn.dropout %p {ratio = 0.4 : f32, training = true, seed = 9 : i64} : (tensor<2x4x5xf64>) -> (tensor<2x4x5xf64>, tensor<2x4x5xi1>)
      %y = nn.matmul %pd, %v : (tensor<2x4x5xf64>, tensor<2x5x2xf64>) -> tensor<2x4x2xf64>
      %vt = nn.transpose %v {perm = array<i64: 0, 2, 1>} : (tensor<2x5x2xf64>) -> tensor<2x2x5xf64>
      %dpd = nn.matmul %dy, %vt : (tensor<2x4x2xf64>, tensor<2x2x5xf64>) -> tensor<2x4x5xf64>
      %dp = nn.dropout_grad %dpd, %keep {ratio = 0.4 : f32, training = true} : (tensor<2x4x5xf64>, tensor<2x4x5xi1>) -> tensor<2x4x5xf64>
      %dz = nn.masked_softmax_grad %dp, %p, %mask {scale = 0.5 : f32} : (tensor<2x4x5xf64>, tensor<2x4x5xf64>, tensor<4x5xi1>) -> tensor<2x4x5xf64>
      %dq = nn.matmul %dz, %k : (tensor<2x4x5xf64>, tensor<2x5x3xf64>) -> tensor<2x4x3xf64>
      %dzt = nn.transpose %dz {perm = array<i64: 0, 2, 1>} : (tensor<2x4x5xf64>) -> tensor<2x5x4xf64>
      %dk = nn.matmul %dzt, %q : (tensor<2x5x4xf64>, tensor<2x4x3xf64>) -> tensor<2x5x3xf64>
      %pdt = nn.transpose %pd {perm = array<i64: 0, 2, 1>} : (tensor<2x4x5xf64>) -> tensor<2x5x4xf64>
      %dv = nn.matmul %pdt, %dy : (tensor<2x5x4xf64>, tensor<2x4x2xf64>) -> tensor<2x5x2xf64>
      %a:2 = nn.attention %q, %k, %v, %mask {fill = -1.0e9 : f32, scale = 0.5 : f32, dropout_ratio = 0.4 : f32, dropout_op_id = 9 : i64} : (tensor<2x4x3xf64>, tensor<2x5x3xf64>, tensor<2x5x2xf64>, tensor<4x5xi1>) -> (tensor<2x4x2xf64>, tensor<2x4x1xf64>)
      %g:3 = nn.attention_grad %dy, %q, %k, %v, %mask, %a#0, %a#1 {fill = -1.0e9 : f32, scale = 0.5 : f32, dropout_ratio = 0.4 : f32, dropout_op_id = 9 : i64} : (tensor<2x4x2xf64>, tensor<2x4x3xf64>, tensor<2x5x3xf64>, tensor<2x5x2xf64>, tensor<4x5xi1>, tensor<2x4x2xf64>, tensor<2x4x1xf64>) -> (tensor<2x4x3xf64>, tensor<2x5x3xf64>, tensor<2x5x2xf64>)
      return %y, %a#0, %dq, %dk, %dv, %g#0, %g#1, %g#2 : tensor<2x4x2xf64>, tensor<2x4x2xf64>, tensor<2x4x3xf64>, tensor<2x5x3xf64>, tensor<2x5x2xf64>, tensor<2x4x3xf64>, tensor<2x5x3xf64>, tensor<2x5x2xf64>
    })mlir");
  ASSERT_TRUE(forward);
  auto values = [](int64_t n, double step) {
    std::vector<double> v;
    for (int64_t i = 0; i < n; ++i) v.push_back(std::sin(step * (double)(i + 1)));
    return v;
  };
  auto f64 = [](std::vector<int64_t> shape, std::vector<double> v) {
    return Tensor::ofFloats(ElementKind::Float64, std::move(shape), std::move(v));
  };
  Tensor causal = Tensor::ofInts(ElementKind::Bool, {4, 5}, {0, 1, 1, 1, 1, 0, 0, 1, 1, 1, 0, 0, 0, 1, 1, 0, 0, 0, 0, 1});
  EvalOptions options;
  options.seed = 5, options.step = 2, options.microBatch = 1;
  auto results = evaluateFunction(forward,
                                  {f64({2, 4, 3}, values(24, 0.7)), f64({2, 5, 3}, values(30, 1.3)),
                                   f64({2, 5, 2}, values(20, 2.1)), causal, f64({2, 4, 2}, values(16, 0.9))},
                                  options);
  ASSERT_TRUE(mlir::succeeded(results)) << diagnostics;
  for (int pair = 0; pair < 4; ++pair) { // y, dq, dk, dv: the unfused one, then the fused op's
    const Tensor &unfused = (*results)[pair == 0 ? 0 : 1 + pair], &fused = (*results)[pair == 0 ? 1 : 4 + pair];
    ASSERT_EQ(unfused.shape, fused.shape);
    for (size_t i = 0; i < unfused.floats.size(); ++i)
      EXPECT_NEAR(fused.floats[i], unfused.floats[i], 1e-12) << "result pair " << pair << " element " << i;
  }
}

TEST_F(EvaluatorTest, DropoutWithoutIdentityIsAnError) {
  auto forward = parse(R"mlir(
    func.func @forward(%x: tensor<4xf32>) -> tensor<4xf32> {
      %y, %m = nn.dropout %x {ratio = 0.5 : f32, training = true} : (tensor<4xf32>) -> (tensor<4xf32>, tensor<4xi1>)
      return %y : tensor<4xf32>
    })mlir");
  ASSERT_TRUE(forward);
  EXPECT_TRUE(mlir::failed(evaluateFunction(forward, {f32({4}, {1, 2, 3, 4})})));
  EXPECT_NE(diagnostics.find("needs a `seed` attribute or a name location"), std::string::npos)
      << diagnostics;
}

TEST_F(EvaluatorTest, ConstantsRoundTripThroughAttributes) {
  auto type = mlir::RankedTensorType::get({3}, mlir::Float16Type::get(&context));
  Tensor half = Tensor::ofFloats(ElementKind::Float16, {3}, {0.5, -2, 65504});
  auto attr = tensorToAttr(half, type);
  auto back = tensorFromAttr(llvm::cast<mlir::ElementsAttr>(attr));
  ASSERT_TRUE(mlir::succeeded(back));
  EXPECT_EQ(back->kind, ElementKind::Float16);
  EXPECT_EQ(back->floats, half.floats);

  auto u8 = mlir::RankedTensorType::get(
      {2}, mlir::IntegerType::get(&context, 8, mlir::IntegerType::Unsigned));
  Tensor bytes = Tensor::ofInts(ElementKind::UInt8, {2}, {200, 7});
  auto bytesBack = tensorFromAttr(llvm::cast<mlir::ElementsAttr>(tensorToAttr(bytes, u8)));
  ASSERT_TRUE(mlir::succeeded(bytesBack));
  EXPECT_EQ(bytesBack->ints, bytes.ints); // 200 stays 200, not -56
}

/// One use of every `nn` op, so that a new op without an evaluator rule (or
/// without a test here) fails this test rather than a later user.
TEST_F(EvaluatorTest, EveryNNOpHasARule) {
  auto forward = parse(R"mlir(
    func.func @forward(%x: tensor<1x2x2x2xf32>, %labels: tensor<1x2x2xi64>, %step: i64) -> (tensor<1x2x4x4xf32>, tensor<1x2x2x2xf32>, tensor<f32>, tensor<2xf32>) {
      %c = nn.constant dense<[[1.0, -1.0]]> : tensor<1x2xf32>
      %i = nn.constant dense<[1, 0]> : tensor<2xi64>
      %v = nn.constant dense<[1.0, 2.0]> : tensor<2xf32>
      %add = nn.add %x, %x : (tensor<1x2x2x2xf32>, tensor<1x2x2x2xf32>) -> tensor<1x2x2x2xf32>
      %sub = nn.sub %add, %x : (tensor<1x2x2x2xf32>, tensor<1x2x2x2xf32>) -> tensor<1x2x2x2xf32>
      %mul = nn.mul %sub, %x : (tensor<1x2x2x2xf32>, tensor<1x2x2x2xf32>) -> tensor<1x2x2x2xf32>
      %div = nn.div %mul, %add : (tensor<1x2x2x2xf32>, tensor<1x2x2x2xf32>) -> tensor<1x2x2x2xf32>
      %pow = nn.pow %div, %x : (tensor<1x2x2x2xf32>, tensor<1x2x2x2xf32>) -> tensor<1x2x2x2xf32>
      %eq = nn.equal %pow, %x : (tensor<1x2x2x2xf32>, tensor<1x2x2x2xf32>) -> tensor<1x2x2x2xi1>
      %where = nn.where %eq, %x, %pow : (tensor<1x2x2x2xi1>, tensor<1x2x2x2xf32>, tensor<1x2x2x2xf32>) -> tensor<1x2x2x2xf32>
      %relu = nn.relu %where : tensor<1x2x2x2xf32>
      %relu6 = nn.relu6 %where : tensor<1x2x2x2xf32>
      %tanh = nn.tanh %relu : tensor<1x2x2x2xf32>
      %sigmoid = nn.sigmoid %tanh : tensor<1x2x2x2xf32>
      %erf = nn.erf %sigmoid : tensor<1x2x2x2xf32>
      %sqrt = nn.sqrt %erf : tensor<1x2x2x2xf32>
      %gelu = nn.gelu %sqrt {approximate = "tanh"} : tensor<1x2x2x2xf32>
      %neg = nn.neg %gelu : tensor<1x2x2x2xf32>
      %recip = nn.reciprocal %neg : tensor<1x2x2x2xf32>
      %abs = nn.abs %recip : tensor<1x2x2x2xf32>
      %exp = nn.exp %abs : tensor<1x2x2x2xf32>
      %log = nn.log %exp : tensor<1x2x2x2xf32>
      %sin = nn.sin %log : tensor<1x2x2x2xf32>
      %cos = nn.cos %sin : tensor<1x2x2x2xf32>
      %softplus = nn.softplus %cos : tensor<1x2x2x2xf32>
      %softsign = nn.softsign %softplus : tensor<1x2x2x2xf32>
      %floor = nn.floor %softsign : tensor<1x2x2x2xf32>
      %ceil = nn.ceil %floor : tensor<1x2x2x2xf32>
      %rounded = nn.round %ceil : tensor<1x2x2x2xf32>
      %sign = nn.sign %rounded : tensor<1x2x2x2xf32>
      %tan = nn.tan %sign : tensor<1x2x2x2xf32>
      %atan = nn.atan %tan : tensor<1x2x2x2xf32>
      %sinh = nn.sinh %atan : tensor<1x2x2x2xf32>
      %cosh = nn.cosh %sinh : tensor<1x2x2x2xf32>
      %asinh = nn.asinh %cosh : tensor<1x2x2x2xf32>
      %acosh = nn.acosh %cosh : tensor<1x2x2x2xf32>
      %atanh = nn.atanh %sign : tensor<1x2x2x2xf32>
      %asin = nn.asin %sign : tensor<1x2x2x2xf32>
      %acos = nn.acos %asin : tensor<1x2x2x2xf32>
      %round = nn.add %rounded, %acosh : (tensor<1x2x2x2xf32>, tensor<1x2x2x2xf32>) -> tensor<1x2x2x2xf32>
      %maximum = nn.max %round, %x : (tensor<1x2x2x2xf32>, tensor<1x2x2x2xf32>) -> tensor<1x2x2x2xf32>
      %minimum = nn.min %maximum, %x : (tensor<1x2x2x2xf32>, tensor<1x2x2x2xf32>) -> tensor<1x2x2x2xf32>
      %lt = nn.less %minimum, %x : (tensor<1x2x2x2xf32>, tensor<1x2x2x2xf32>) -> tensor<1x2x2x2xi1>
      %le = nn.less_or_equal %minimum, %x : (tensor<1x2x2x2xf32>, tensor<1x2x2x2xf32>) -> tensor<1x2x2x2xi1>
      %gt = nn.greater %minimum, %x : (tensor<1x2x2x2xf32>, tensor<1x2x2x2xf32>) -> tensor<1x2x2x2xi1>
      %ge = nn.greater_or_equal %minimum, %x : (tensor<1x2x2x2xf32>, tensor<1x2x2x2xf32>) -> tensor<1x2x2x2xi1>
      %both = nn.and %lt, %le : (tensor<1x2x2x2xi1>, tensor<1x2x2x2xi1>) -> tensor<1x2x2x2xi1>
      %either = nn.or %gt, %ge : (tensor<1x2x2x2xi1>, tensor<1x2x2x2xi1>) -> tensor<1x2x2x2xi1>
      %one = nn.xor %both, %either : (tensor<1x2x2x2xi1>, tensor<1x2x2x2xi1>) -> tensor<1x2x2x2xi1>
      %divisor = nn.constant dense<[3, -2]> : tensor<2xi64>
      %mod = nn.mod %i, %divisor : (tensor<2xi64>, tensor<2xi64>) -> tensor<2xi64>
      %fmod = nn.fmod %minimum, %x : (tensor<1x2x2x2xf32>, tensor<1x2x2x2xf32>) -> tensor<1x2x2x2xf32>
      %cast = nn.cast %gelu : tensor<1x2x2x2xf32> -> tensor<1x2x2x2xf64>
      %flat = nn.flatten %x {axis = 1 : i64} : (tensor<1x2x2x2xf32>) -> tensor<1x8xf32>
      %gemm = nn.gemm %c, %c, %v {transA = true} : (tensor<1x2xf32>, tensor<1x2xf32>, tensor<2xf32>) -> tensor<2x2xf32>
      %mm = nn.matmul %gemm, %gemm : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
      %bgemm = nn.batched_gemm %x, %x {transA = true} : (tensor<1x2x2x2xf32>, tensor<1x2x2x2xf32>) -> tensor<1x2x2x2xf32>
      %gemmact:2 = nn.gemm %c, %c, %v {transA = true, activation = #nn.unary<gelu_tanh>, keeps_pre_activation = true} : (tensor<1x2xf32>, tensor<1x2xf32>, tensor<2xf32>) -> (tensor<2x2xf32>, tensor<2x2xf32>)
      %gemmgrad = nn.gemm_activation_grad %c, %c, %gemmact#1 {transA = true, function = #nn.unary<gelu_tanh>} : (tensor<1x2xf32>, tensor<1x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
      %w = nn.constant dense<1.0> : tensor<2x1x1x1xf32>
      %conv = nn.conv %x, %w, %v {strides = array<i64: 1, 1>, pads = array<i64: 0, 0, 0, 0>, dilations = array<i64: 1, 1>, group = 2 : i64} : (tensor<1x2x2x2xf32>, tensor<2x1x1x1xf32>, tensor<2xf32>) -> tensor<1x2x2x2xf32>
      %bn:3 = nn.batch_norm %conv, %v, %v, %v, %v {training = true} : (tensor<1x2x2x2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>) -> (tensor<1x2x2x2xf32>, tensor<2xf32>, tensor<2xf32>)
      %ln:3 = nn.layer_norm %bn#0, %v, %v : (tensor<1x2x2x2xf32>, tensor<2xf32>, tensor<2xf32>) -> (tensor<1x2x2x2xf32>, tensor<1x2x2x1xf32>, tensor<1x2x2x1xf32>)
      %max = nn.max_pool %ln#0 {kernel_shape = array<i64: 2, 2>, strides = array<i64: 1, 1>, pads = array<i64: 0, 0, 1, 1>, dilations = array<i64: 1, 1>} : (tensor<1x2x2x2xf32>) -> tensor<1x2x2x2xf32>
      %avg = nn.average_pool %max {kernel_shape = array<i64: 2, 2>, strides = array<i64: 1, 1>, pads = array<i64: 1, 1, 0, 0>, count_include_pad = true} : (tensor<1x2x2x2xf32>) -> tensor<1x2x2x2xf32>
      %gap = nn.global_average_pool %avg : (tensor<1x2x2x2xf32>) -> tensor<1x2x1x1xf32>
      %drop:2 = nn.dropout %x {ratio = 0.5 : f32, training = true, seed = 3 : i64} : (tensor<1x2x2x2xf32>) -> (tensor<1x2x2x2xf32>, tensor<1x2x2x2xi1>)
      %soft = nn.softmax %drop#0 {axis = 1 : i64} : (tensor<1x2x2x2xf32>) -> tensor<1x2x2x2xf32>
      %msoft = nn.masked_softmax %x, %eq {scale = 0.5 : f32, fill = -1.0e4 : f32} : (tensor<1x2x2x2xf32>, tensor<1x2x2x2xi1>) -> tensor<1x2x2x2xf32>
      %msgrad = nn.masked_softmax_grad %x, %msoft, %eq {scale = 0.5 : f32, divide = true, masked_when = false} : (tensor<1x2x2x2xf32>, tensor<1x2x2x2xf32>, tensor<1x2x2x2xi1>) -> tensor<1x2x2x2xf32>
      %loss:2 = nn.softmax_cross_entropy_loss %soft, %labels, %v {ignore_index = 1 : i64} : (tensor<1x2x2x2xf32>, tensor<1x2x2xi64>, tensor<2xf32>) -> (tensor<f32>, tensor<1x2x2x2xf32>)
      %mean = nn.reduce_mean %loss#1 {axes = array<i64: 1, 3>, keepdims = false} : (tensor<1x2x2x2xf32>) -> tensor<1x2xf32>
      %gather = nn.gather %mean, %i {axis = 1 : i64} : (tensor<1x2xf32>, tensor<2xi64>) -> tensor<1x2xf32>
      %reshape = nn.reshape %gather : tensor<1x2xf32> -> tensor<2x1xf32>
      %unsq = nn.unsqueeze %reshape {axes = array<i64: 0>} : (tensor<2x1xf32>) -> tensor<1x2x1xf32>
      %sq = nn.squeeze %unsq {axes = array<i64: 0>} : (tensor<1x2x1xf32>) -> tensor<2x1xf32>
      %expand = nn.expand %sq : tensor<2x1xf32> -> tensor<2x2x2xf32>
      %tr = nn.transpose %expand {perm = array<i64: 2, 0, 1>} : (tensor<2x2x2xf32>) -> tensor<2x2x2xf32>
      %cat = nn.concat %tr, %tr {axis = 0 : i64} : (tensor<2x2x2xf32>, tensor<2x2x2xf32>) -> tensor<4x2x2xf32>
      %parts:2 = nn.split %cat {axis = 0 : i64, sizes = array<i64: 1, 3>} : (tensor<4x2x2xf32>) -> (tensor<1x2x2xf32>, tensor<3x2x2xf32>)
      %slice = nn.slice %parts#1 {starts = array<i64: 2, 0, 1>, ends = array<i64: -1, 2, -1>, steps = array<i64: -2, 1, -1>} : (tensor<3x2x2xf32>) -> tensor<2x2x2xf32>
      %padded = nn.pad %x {pads = array<i64: 0, 0, 1, 1, 0, 0, 1, 1>, value = 7.5 : f64} : (tensor<1x2x2x2xf32>) -> tensor<1x2x4x4xf32>
      %rsum = nn.reduce_sum %x {axes = array<i64: 0, 2>} : (tensor<1x2x2x2xf32>) -> tensor<1x2x1x2xf32>
      %ugrad = nn.unary_grad <gelu> %x, x = %x : tensor<1x2x2x2xf32>
      %bgrad = nn.binary_grad <pow_lhs> %x, %x, %v : (tensor<1x2x2x2xf32>, tensor<1x2x2x2xf32>, tensor<2xf32>) -> tensor<1x2x2x2xf32>
      %cigrad = nn.conv_input_grad %x, %w {strides = array<i64: 1, 1>, pads = array<i64: 0, 0, 0, 0>, dilations = array<i64: 1, 1>, group = 2 : i64} : (tensor<1x2x2x2xf32>, tensor<2x1x1x1xf32>) -> tensor<1x2x2x2xf32>
      %cwgrad = nn.conv_weight_grad %x, %x {strides = array<i64: 1, 1>, pads = array<i64: 0, 0, 0, 0>, dilations = array<i64: 1, 1>, group = 2 : i64} : (tensor<1x2x2x2xf32>, tensor<1x2x2x2xf32>) -> tensor<2x1x1x1xf32>
      %bngrad = nn.batch_norm_grad %x, %conv, %v, %v, %v {training = true} : (tensor<1x2x2x2xf32>, tensor<1x2x2x2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>) -> tensor<1x2x2x2xf32>
      %bnpgrad:2 = nn.batch_norm_param_grad %x, %conv, %v, %v {training = true} : (tensor<1x2x2x2xf32>, tensor<1x2x2x2xf32>, tensor<2xf32>, tensor<2xf32>) -> (tensor<2xf32>, tensor<2xf32>)
      %lngrad = nn.layer_norm_grad %x, %bn#0, %v : (tensor<1x2x2x2xf32>, tensor<1x2x2x2xf32>, tensor<2xf32>) -> tensor<1x2x2x2xf32>
      %lnpgrad:2 = nn.layer_norm_param_grad %x, %bn#0 : (tensor<1x2x2x2xf32>, tensor<1x2x2x2xf32>) -> (tensor<2xf32>, tensor<2xf32>)
      %mpgrad = nn.max_pool_grad %x, %ln#0 {kernel_shape = array<i64: 2, 2>, strides = array<i64: 1, 1>, pads = array<i64: 0, 0, 1, 1>, dilations = array<i64: 1, 1>} : (tensor<1x2x2x2xf32>, tensor<1x2x2x2xf32>) -> tensor<1x2x2x2xf32>
      %apgrad = nn.average_pool_grad %x {kernel_shape = array<i64: 2, 2>, strides = array<i64: 1, 1>, pads = array<i64: 1, 1, 0, 0>, count_include_pad = true} : (tensor<1x2x2x2xf32>) -> tensor<1x2x2x2xf32>
      %dgrad = nn.dropout_grad %x, %drop#1 {ratio = 0.5 : f32, training = true} : (tensor<1x2x2x2xf32>, tensor<1x2x2x2xi1>) -> tensor<1x2x2x2xf32>
      %sgrad = nn.softmax_grad %x, %soft {axis = 1 : i64} : tensor<1x2x2x2xf32>
      %lgrad = nn.softmax_cross_entropy_loss_grad %loss#0, %soft, %labels, %v {ignore_index = 1 : i64} : (tensor<f32>, tensor<1x2x2x2xf32>, tensor<1x2x2xi64>, tensor<2xf32>) -> tensor<1x2x2x2xf32>
      %ggrad = nn.gather_grad %gather, %i {axis = 1 : i64} : (tensor<1x2xf32>, tensor<2xi64>) -> tensor<1x2xf32>
      %slgrad = nn.slice_grad %slice {starts = array<i64: 2, 0, 1>, ends = array<i64: -1, 2, -1>, steps = array<i64: -2, 1, -1>} : (tensor<2x2x2xf32>) -> tensor<3x2x2xf32>
      %rot = nn.rotary %x, %x, %x {interleaved = true} : (tensor<1x2x2x2xf32>, tensor<1x2x2x2xf32>, tensor<1x2x2x2xf32>) -> tensor<1x2x2x2xf32>
      %att:2 = nn.attention %x, %x, %x {scale = 0.5 : f32} : (tensor<1x2x2x2xf32>, tensor<1x2x2x2xf32>, tensor<1x2x2x2xf32>) -> (tensor<1x2x2x2xf32>, tensor<1x2x2x1xf32>)
      %attg:3 = nn.attention_grad %x, %x, %x, %x, %att#0, %att#1 {scale = 0.5 : f32} : (tensor<1x2x2x2xf32>, tensor<1x2x2x2xf32>, tensor<1x2x2x2xf32>, tensor<1x2x2x2xf32>, tensor<1x2x2x2xf32>, tensor<1x2x2x1xf32>) -> (tensor<1x2x2x2xf32>, tensor<1x2x2x2xf32>, tensor<1x2x2x2xf32>)
      %sgd:2 = nn.sgd_update %v, %v, %v, %step {lr = 0.5 : f32, momentum = 0.25 : f32} : tensor<2xf32>
      %adamw:3 = nn.adamw_update %v, %v, %v, %v, %step {lr = 0.125 : f32} : tensor<2xf32>
      return %padded, %where, %loss#0, %sgd#0 : tensor<1x2x4x4xf32>, tensor<1x2x2x2xf32>, tensor<f32>, tensor<2xf32>
    })mlir");
  ASSERT_TRUE(forward);
  std::set<std::string> used, registered;
  forward.walk([&](mlir::Operation *op) {
    if (op->getDialect() && op->getDialect()->getNamespace() == "nn")
      used.insert(op->getName().getStringRef().str());
  });
  for (mlir::RegisteredOperationName name : context.getRegisteredOperations())
    if (name.getDialectNamespace() == "nn")
      registered.insert(name.getStringRef().str());
  EXPECT_EQ(used, registered) << "add the new op to this test and to the evaluator";

  Tensor x = f32({1, 2, 2, 2}, {1, 2, 3, 4, 5, 6, 7, 8});
  auto results = evaluateFunction(
      forward, {x, Tensor::ofInts(ElementKind::Int64, {1, 2, 2}, {0, 1, 1, 0}),
                Tensor::ofInts(ElementKind::Int64, {}, {1})});
  ASSERT_TRUE(mlir::succeeded(results)) << diagnostics;
  // Pad's value attribute fills the border; the centre keeps x.
  const Tensor &padded = (*results)[0];
  EXPECT_EQ(padded.floats[0], 7.5);
  EXPECT_EQ(padded.floats[5], 1.0);  // [0,0,1,1]
  EXPECT_EQ(padded.floats[10], 4.0); // [0,0,2,2]
  // SGD's first step: buf = grad = [1, 2]; param = [1, 2] - 0.5 * buf.
  EXPECT_EQ((*results)[3].floats, (std::vector<double>{0.5, 1.0}));
}

// nn.batched_gemm is numpy matmul of op(A) and op(B), op swapping the last
// two axes where flagged (here with a broadcast batch).
TEST_F(EvaluatorTest, BatchedGemmTransposesItsFlaggedOperands) {
  auto forward = parse(R"mlir(
    func.func @forward(%a: tensor<2x3x2xf32>, %b: tensor<1x4x3xf32>) -> (tensor<2x2x4xf32>, tensor<2x2x4xf32>) {
      %0 = nn.batched_gemm %a, %b {transA = true, transB = true} : (tensor<2x3x2xf32>, tensor<1x4x3xf32>) -> tensor<2x2x4xf32>
      %at = nn.transpose %a {perm = array<i64: 0, 2, 1>} : (tensor<2x3x2xf32>) -> tensor<2x2x3xf32>
      %bt = nn.transpose %b {perm = array<i64: 0, 2, 1>} : (tensor<1x4x3xf32>) -> tensor<1x3x4xf32>
      %1 = nn.matmul %at, %bt : (tensor<2x2x3xf32>, tensor<1x3x4xf32>) -> tensor<2x2x4xf32>
      return %0, %1 : tensor<2x2x4xf32>, tensor<2x2x4xf32>
    })mlir");
  ASSERT_TRUE(forward);
  Tensor a = f32({2, 3, 2}, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12});
  Tensor b = f32({1, 4, 3}, {1, 0, 2, -1, 3, 0, 0, 1, 1, 2, -2, 1});
  auto results = evaluateFunction(forward, {a, b});
  ASSERT_TRUE(mlir::succeeded(results)) << diagnostics;
  EXPECT_EQ((*results)[0].shape, (std::vector<int64_t>{2, 2, 4}));
  EXPECT_EQ((*results)[0].floats, (*results)[1].floats);
  // [0, 0, 0] = a[0, :, 0] . b[0, 0, :] = 1 * 1 + 3 * 0 + 5 * 2
  EXPECT_EQ((*results)[0].floats[0], 11.0);
}

TEST_F(EvaluatorTest, ScalarOperandsAreRankZeroTensors) {
  auto forward = parse(R"mlir(
    func.func @forward(%p: tensor<2xf64>, %g: tensor<2xf64>, %buf: tensor<2xf64>, %step: i64) -> (tensor<2xf64>, tensor<2xf64>) {
      %new:2 = nn.sgd_update %p, %g, %buf, %step {lr = 0.5 : f32, momentum = 0.5 : f32} : tensor<2xf64>
      return %new#0, %new#1 : tensor<2xf64>, tensor<2xf64>
    })mlir");
  ASSERT_TRUE(forward);
  Tensor p = Tensor::ofFloats(ElementKind::Float64, {2}, {1, 2});
  Tensor g = Tensor::ofFloats(ElementKind::Float64, {2}, {4, 8});
  Tensor buf = Tensor::ofFloats(ElementKind::Float64, {2}, {2, 2});
  // Step 2: buf = 0.5 * [2, 2] + [4, 8] = [5, 9]; p = [1, 2] - 0.5 * buf.
  auto results = evaluateFunction(forward, {p, g, buf, Tensor::ofInts(ElementKind::Int64, {}, {2})});
  ASSERT_TRUE(mlir::succeeded(results)) << diagnostics;
  EXPECT_EQ((*results)[0].floats, (std::vector<double>{-1.5, -2.5}));
  EXPECT_EQ((*results)[1].floats, (std::vector<double>{5, 9}));
  // The step must be a rank-0 tensor of the scalar's kind.
  EXPECT_TRUE(mlir::failed(
      evaluateFunction(forward, {p, g, buf, Tensor::ofInts(ElementKind::Int64, {1}, {2})})));
  EXPECT_NE(diagnostics.find("argument 3: value int64[1] does not match type i64"),
            std::string::npos)
      << diagnostics;
  diagnostics.clear();
  EXPECT_TRUE(mlir::failed(
      evaluateFunction(forward, {p, g, buf, Tensor::ofInts(ElementKind::Int64, {}, {0})})));
  EXPECT_NE(diagnostics.find("step counts updates from 1, got 0"), std::string::npos)
      << diagnostics;
}

TEST_F(EvaluatorTest, GradientOpsTakeUndeterminedShapesFromTheirResultTypes) {
  // With a 3-wide kernel and stride 2, inputs 5 and 6 wide both give 2
  // outputs: only the result type tells which input the gradient is for.
  auto forward = parse(R"mlir(
    func.func @forward(%dy: tensor<1x1x2x2xf64>, %w: tensor<1x1x3x3xf64>) -> (tensor<1x1x5x5xf64>, tensor<1x1x6x6xf64>) {
      %a = nn.conv_input_grad %dy, %w {strides = array<i64: 2, 2>, pads = array<i64: 0, 0, 0, 0>, dilations = array<i64: 1, 1>} : (tensor<1x1x2x2xf64>, tensor<1x1x3x3xf64>) -> tensor<1x1x5x5xf64>
      %b = nn.conv_input_grad %dy, %w {strides = array<i64: 2, 2>, pads = array<i64: 0, 0, 0, 0>, dilations = array<i64: 1, 1>} : (tensor<1x1x2x2xf64>, tensor<1x1x3x3xf64>) -> tensor<1x1x6x6xf64>
      return %a, %b : tensor<1x1x5x5xf64>, tensor<1x1x6x6xf64>
    })mlir");
  ASSERT_TRUE(forward);
  Tensor dy = Tensor::ofFloats(ElementKind::Float64, {1, 1, 2, 2}, {1, 1, 1, 1});
  Tensor w = Tensor::ofFloats(ElementKind::Float64, {1, 1, 3, 3}, std::vector<double>(9, 1.0));
  auto results = evaluateFunction(forward, {dy, w});
  ASSERT_TRUE(mlir::succeeded(results)) << diagnostics;
  // The centre (2, 2) is under all four windows; the last row and column of
  // the 6-wide input under none.
  EXPECT_EQ((*results)[0].floats[2 * 5 + 2], 4.0);
  EXPECT_EQ((*results)[1].floats[2 * 6 + 2], 4.0);
  EXPECT_EQ((*results)[1].floats[5 * 6 + 5], 0.0);
  // A result type that is not the conv's input is an error naming the op
  // (the verifier's: ConvTranspose's attributes come from the model).
  auto bad = mlir::parseSourceString<mlir::ModuleOp>(R"mlir(
    func.func @forward(%dy: tensor<1x1x2x2xf64>, %w: tensor<1x1x3x3xf64>) -> tensor<1x1x7x7xf64> {
      %a = nn.conv_input_grad %dy, %w {strides = array<i64: 2, 2>, pads = array<i64: 0, 0, 0, 0>, dilations = array<i64: 1, 1>} : (tensor<1x1x2x2xf64>, tensor<1x1x3x3xf64>) -> tensor<1x1x7x7xf64>
      return %a : tensor<1x1x7x7xf64>
    })mlir", &context);
  EXPECT_FALSE(bad);
  EXPECT_NE(diagnostics.find("'nn.conv_input_grad' op convolving the result [1, 1, 7, 7] gives 3 "
                             "on spatial axis 0, not dy's 2"),
            std::string::npos)
      << diagnostics;
}

} // namespace
