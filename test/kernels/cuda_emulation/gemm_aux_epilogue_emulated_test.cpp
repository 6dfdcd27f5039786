// cuda-gemm-aux-epilogue-emulated: nn.gemm's keeps_pre_activation
// (pc::gemm with a pre-activation output) and nn.gemm_activation_grad
// (pc::gemmActivationGrad) of pipec's CUDA library under the host emulation
// of cuda_kernels_emulated_test.cpp (emu.h, the fake cuBLAS and cuBLASLt in
// inc/), in float and bf16 storage, against the CPU kernels:
//   - the tanh GELU with N divisible by 8 runs cuBLASLt's GELU_AUX (with the
//     bias: GELU_AUX_BIAS) and DGELU epilogues: one cuBLASLt call, no kernel;
//   - N not divisible by 8 (cuBLASLt's aux leading dimension), other
//     functions, a C that is no bias, or a library without the aux
//     epilogues (emu::ltAuxEpilogues off): the product, then one kernel;
// each at pointer offsets off cuBLASLt's default alignment. The results
// must match the CPU's f(product), product and f'(x)·product within the
// storage's rounding; the launches per call are counted.
// Also the bf16 GEMMs of an odd vocabulary (testRoundedDims): the forward,
// input-gradient and accumulated weight-gradient products on copies with
// the odd dimension rounded up to a multiple of 64, the added rows and
// columns zero (the scratch they use starts as NaN), a copy per rounded
// matrix; small or thin products as they are.
#include "pipec/cuda_kernels.h"
#include "pipec/cpu_kernels.h"
#include "cuda_runtime.h"
#include "emu.h"
#include "emulated_checks.h"
#include "cublasLt.h" // emu::ltAuxEpilogues
#include <array>
#include <cmath>
#include <cstdio>
#include <optional>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

namespace pk = pipec::kernels;
namespace pc = pipec::kernels::cuda;
using pk::Shape;
using bf = pc::bf16;

static std::mt19937_64 rng(2718);
using emucheck::checks;
using emucheck::ctx;
using emucheck::expect;
using emucheck::expectNear;
using emucheck::failures;

/// Values representable in bf16, so that both storages read the same numbers.
static std::vector<float> randomValues(int64_t n) {
  std::uniform_real_distribution<float> d(-1.5f, 1.5f);
  std::vector<float> v((size_t)n);
  for (float &x : v) x = (float)bf(d(rng));
  return v;
}

template <class E> static std::vector<E> stored(const std::vector<float> &v) {
  std::vector<E> out;
  for (float x : v) out.push_back(E(x));
  return out;
}
template <class E> static std::vector<float> widened(const E *v, int64_t n) {
  std::vector<float> out;
  for (int64_t i = 0; i < n; ++i) out.push_back((float)v[i]);
  return out;
}

struct Launches {
  int kernels, lt, gemms;
};
static Launches countNow() { return {emu::launches, emu::ltMatmulCalls, emu::gemmCalls}; }

struct Case {
  int64_t M, N, K;
  bool transA, transB, bias;
  pk::Unary f;
};

/// One case in storage E: the forward with its pre-activation, then the
/// gradient at that pre-activation. `auxEpilogues`: whether the fake
/// cuBLASLt offers GELU_AUX and DGELU.
template <class E> static void runCase(const Case &c, bool auxEpilogues) {
  emu::ltAuxEpilogues = auxEpilogues;
  const bool bf16 = std::is_same_v<E, bf>;
  ctx = std::string(bf16 ? "bf16" : "float") + " M" + std::to_string(c.M) + " N" + std::to_string(c.N) + " K" +
        std::to_string(c.K) + (c.transA ? " transA" : "") + (c.transB ? " transB" : "") + (c.bias ? " bias" : "") +
        " " + pipec::unaryName(c.f) + (auxEpilogues ? "" : " (no aux epilogues)");
  const double tol = bf16 ? 2e-2 : 1e-5;
  const int64_t offset = 8 + (int64_t)(rng() % 3) * 8; // 16-byte steps off the 256-byte default
  const auto A = randomValues(c.M * c.K), B = randomValues(c.K * c.N), bias = randomValues(c.N);
  const auto dyA = randomValues(c.M * c.K);
  std::vector<E> a(offset, E(0)), b(offset, E(0)), da(offset, E(0));
  for (E v : stored<E>(A)) a.push_back(v);
  for (E v : stored<E>(B)) b.push_back(v);
  for (E v : stored<E>(dyA)) da.push_back(v);
  std::vector<E> y(c.M * c.N + offset), pre(c.M * c.N + offset), grad(c.M * c.N + offset);

  // The CPU's product (of the same bf16-representable values), f of it, and the gradient.
  const int64_t n = c.M * c.N;
  std::vector<float> product(n), activated(n), dproduct(n), dx(n);
  pk::gemm(A.data(), B.data(), c.bias ? bias.data() : nullptr, Shape{c.N}, product.data(), c.M, c.N, c.K, c.transA,
           c.transB, 1.0f, 1.0f);
  pk::unary(c.f, product.data(), n, activated.data());

  Launches before = countNow();
  pc::gemm(a.data() + offset, b.data() + offset, c.bias ? bias.data() : nullptr, Shape{c.N}, y.data() + offset, c.M,
           c.N, c.K, c.transA, c.transB, 1.0f, 1.0f, c.f, pre.data() + offset);
  Launches after = countNow();
  const bool fused = auxEpilogues && c.f == pk::Unary::GeluTanh && c.N % 8 == 0;
  // A bias with a bf16 Y goes to cuBLASLt as a bf16 copy: one cast kernel more, wherever cuBLASLt runs.
  const int biasCopies = bf16 && c.bias && after.lt > before.lt ? 1 : 0;
  expect(fused ? after.lt - before.lt == 1 && after.kernels - before.kernels == biasCopies && after.gemms == before.gemms
               : after.kernels - before.kernels == 1 + biasCopies,
         std::string("forward launches: ") + (fused ? "one GELU_AUX call" : "a product and one kernel") +
             " expected, got " + std::to_string(after.lt - before.lt) + " cuBLASLt, " +
             std::to_string(after.gemms - before.gemms) + " cuBLAS, " + std::to_string(after.kernels - before.kernels) +
             " kernels");
  const std::vector<float> preGot = widened(pre.data() + offset, n), yGot = widened(y.data() + offset, n);
  expectNear(preGot, product, tol, "pre-activation");
  expectNear(yGot, activated, tol, "result");

  // The gradient at the CUDA forward's own pre-activation (what training reads).
  pk::gemm(dyA.data(), B.data(), nullptr, Shape{}, dproduct.data(), c.M, c.N, c.K, c.transA, c.transB, 0.5f, 0.0f);
  pk::unaryGrad(c.f, dproduct.data(), preGot.data(), nullptr, n, dx.data());
  before = countNow();
  pc::gemmActivationGrad(da.data() + offset, b.data() + offset, pre.data() + offset, grad.data() + offset, c.M, c.N,
                         c.K, c.transA, c.transB, 0.5f, c.f);
  after = countNow();
  expect(fused ? after.lt - before.lt == 1 && after.kernels == before.kernels && after.gemms == before.gemms
               : after.kernels - before.kernels == 1,
         std::string("gradient launches: ") + (fused ? "one DGELU call" : "a product and one kernel") + " expected");
  expectNear(widened(grad.data() + offset, n), dx, bf16 ? 3e-2 : 1e-5, "gradient");
}

static void testCases() {
  // K rows of A stored [M, K] (or [K, M] transposed), B [K, N] (or [N, K]).
  const Case cases[] = {
      {12, 16, 8, false, true, true, pk::Unary::GeluTanh},   // GELU_AUX_BIAS, DGELU
      {5, 24, 7, true, false, false, pk::Unary::GeluTanh},   // GELU_AUX without the bias
      {6, 10, 4, false, false, true, pk::Unary::GeluTanh},   // N % 8 != 0: the kernels
      {9, 16, 5, false, true, true, pk::Unary::Gelu},        // the exact GELU: no epilogue of cuBLASLt's
      {4, 8, 3, true, true, false, pk::Unary::Erf},
  };
  for (const Case &c : cases)
    for (bool aux : {true, false}) {
      runCase<float>(c, aux);
      runCase<bf>(c, aux);
    }
  emu::ltAuxEpilogues = true;
}

/// The GEMMs of a vocabulary projection with an odd vocabulary V (as
/// GPT-2's 50,257) in bf16, large enough for the rounded copies (2^30 FLOPs,
/// 64 FLOPs per byte copied; linalg.cu): logits [M, V] = x [M, D] W^T (N
/// odd), dx [M, D] = dlogits W (K odd), dW [V, D] += dlogits^T x (M odd,
/// into float), dW^T [D, V] = x^T dlogits.
static void testRoundedDims() {
  const int64_t M = 1024, V = 2049, D = 384, V2 = 2112; // V rounded up to a multiple of 64
  const auto x = randomValues(M * D), W = randomValues(V * D), dlogits = randomValues(M * V);
  const auto xb = stored<bf>(x), Wb = stored<bf>(W), dlb = stored<bf>(dlogits);
  // copies: the stream copies wanted; dims: cuBLAS's m, n, k wanted (column-major: m = our N, n = our M).
  auto run = [&](const char *what, int copiesWanted, std::array<int64_t, 3> dims, auto &&cpu, auto &&cuda) {
    ctx = std::string("rounded dimensions: ") + what;
    const long copiesBefore = emu::streamCopies;
    const Launches before = countNow();
    cuda();
    const Launches after = countNow();
    expect(after.gemms - before.gemms == 1 && emu::streamCopies - copiesBefore == copiesWanted,
           "one GEMM and " + std::to_string(copiesWanted) + " copies expected, got " +
               std::to_string(after.gemms - before.gemms) + " and " + std::to_string(emu::streamCopies - copiesBefore));
    for (int i = 0; i < 3; ++i)
      expect(emu::lastGemmDims[i] == dims[i], "cuBLAS got dimension " + std::to_string(i) + " = " +
                                                  std::to_string(emu::lastGemmDims[i]) + ", wanted " +
                                                  std::to_string(dims[i]));
    cpu();
  };
  std::vector<float> logits(M * V);
  std::vector<bf> logitsG(M * V, bf(NAN));
  run("logits = x W^T", 2, {V2, M, D}, // W and the logits
      [&] {
        pk::gemm(x.data(), W.data(), nullptr, Shape{}, logits.data(), M, V, D, false, true, 1.0f, 0.0f);
        expectNear(widened(logitsG.data(), M * V), logits, 1.0 / 128, "logits");
      },
      [&] { pc::gemm(xb.data(), Wb.data(), nullptr, Shape{}, logitsG.data(), M, V, D, false, true, 1.0f, 0.0f); });
  std::vector<float> dx(M * D);
  std::vector<bf> dxG(M * D, bf(NAN));
  run("dx = dlogits W", 2, {D, M, V2}, // dlogits and W
      [&] {
        pk::gemm(dlogits.data(), W.data(), nullptr, Shape{}, dx.data(), M, D, V, false, false, 1.0f, 0.0f);
        expectNear(widened(dxG.data(), M * D), dx, 1.0 / 64, "dx");
      },
      [&] { pc::gemm(dlb.data(), Wb.data(), nullptr, Shape{}, dxG.data(), M, D, V, false, false, 1.0f, 0.0f); });
  auto dW = randomValues(V * D), dWG = dW; // accumulated into, in float
  run("dW += dlogits^T x", 3, {D, V2, M}, // dlogits, dW in, dW out
      [&] {
        pk::gemm(dlogits.data(), x.data(), dW.data(), Shape{V, D}, dW.data(), V, D, M, true, false, 1.0f, 1.0f);
        expectNear(dWG, dW, 1e-4, "dW");
      },
      [&] { pc::gemm(dlb.data(), xb.data(), dWG.data(), Shape{V, D}, dWG.data(), V, D, M, true, false, 1.0f, 1.0f); });
  std::vector<float> dWt(D * V);
  std::vector<bf> dWtG(D * V, bf(NAN));
  run("dW^T = x^T dlogits", 2, {V2, D, M}, // dlogits and dW^T
      [&] {
        pk::gemm(x.data(), dlogits.data(), nullptr, Shape{}, dWt.data(), D, V, M, true, false, 1.0f, 0.0f);
        expectNear(widened(dWtG.data(), D * V), dWt, 1.0 / 64, "dW^T");
      },
      [&] { pc::gemm(xb.data(), dlb.data(), nullptr, Shape{}, dWtG.data(), D, V, M, true, false, 1.0f, 0.0f); });
  // A bf16 Y accumulated into (C = Y, beta 1): copied in, computed, copied back.
  auto acc = randomValues(M * V);
  auto accG = stored<bf>(acc);
  std::vector<float> accWant(acc);
  run("logits += x W^T", 3, {V2, M, D},
      [&] {
        pk::gemm(x.data(), W.data(), accWant.data(), Shape{M, V}, accWant.data(), M, V, D, false, true, 1.0f, 1.0f);
        expectNear(widened(accG.data(), M * V), accWant, 1.0 / 64, "accumulated logits");
      },
      [&] {
        pc::gemm(xb.data(), Wb.data(), reinterpret_cast<const float *>(accG.data()), Shape{M, V}, accG.data(), M, V, D,
                 false, true, 1.0f, 1.0f);
      });
  // As they are: a small product (under 2^30 FLOPs), a thin one (2^30 FLOPs, 32 per byte copied),
  // an odd dimension that rounding would grow by more than 1/8 (449 to 512), and float.
  std::vector<bf> smallG(64 * 9);
  run("a small product", 0, {9, 64, D}, [] {}, [&] {
    pc::gemm(xb.data(), Wb.data(), nullptr, Shape{}, smallG.data(), 64, 9, D, false, true, 1.0f, 0.0f);
  });
  std::vector<bf> thinG(4096 * V);
  run("a thin product", 0, {V, 4096, 64}, [] {}, [&] {
    pc::gemm(xb.data(), Wb.data(), nullptr, Shape{}, thinG.data(), 4096, V, 64, false, true, 1.0f, 0.0f);
  });
  std::vector<bf> narrowG(4096 * 449);
  run("a narrow odd dimension", 0, {449, 4096, D}, [] {}, [&] {
    pc::gemm(dlb.data(), Wb.data(), nullptr, Shape{}, narrowG.data(), 4096, 449, D, false, true, 1.0f, 0.0f);
  });
  std::vector<float> floatY(M * V);
  run("float operands", 0, {V, M, D}, [] {}, [&] {
    pc::gemm(x.data(), W.data(), nullptr, Shape{}, floatY.data(), M, V, D, false, true, 1.0f, 0.0f);
  });
}

static void testErrors() {
  ctx = "errors";
  std::vector<float> one(64, 1.0f), out(64);
  bool threw = false;
  try { // relu's derivative reads its result, which the GEMM does not have
    pc::gemmActivationGrad(one.data(), one.data(), one.data(), out.data(), 1, 1, 1, false, false, 1.0f,
                           pk::Unary::Relu);
  } catch (const std::exception &e) {
    threw = std::string(e.what()).find("nn.gemm_activation_grad") != std::string::npos;
  }
  expect(threw, "a derivative that reads the result must be refused, naming the op");
  threw = false;
  try {
    pc::gemm(one.data(), one.data(), nullptr, Shape{}, out.data(), 1, 1, 1, false, false, 1.0f, 0.0f, std::nullopt,
             out.data() + 8);
  } catch (const std::exception &e) {
    threw = std::string(e.what()).find("nn.gemm") != std::string::npos;
  }
  expect(threw, "a pre-activation output without an activation must be refused");
}

int main() {
  void *fakeStream = (void *)0x6160;
  emu::expectedStream = (cudaStream_t)fakeStream;
  pc::StreamScope scope(fakeStream, pc::Precision::F32);
  try {
    testCases();
    testRoundedDims();
    testErrors();
  } catch (const std::exception &e) {
    std::printf("EXCEPTION (%s): %s\n", ctx.c_str(), e.what());
    ++failures;
  }
  return emucheck::finish();
}
