// Results do not depend on the thread count (docs/cpu-kernels.md,
// "Threads"): each kernel with a parallel loop runs on tensors large enough
// to be split (>= 32768 elements), once with 1 thread and once with 3, and
// every output must be equal bit for bit. GEMMs are included: the kernels
// keep OpenBLAS on one thread and split a product into panels fixed by its
// shape (OpenBLAS's own threading changed the bits on an AMD EPYC).
#include "TestUtil.h"

#include <cstring>

namespace {

using Outputs = std::vector<std::vector<float>>;

/// Runs f with 1 and with 3 threads and compares every output bitwise.
void expectSameBits(const char *what, const std::function<Outputs()> &f) {
  pk::setThreads(1);
  const Outputs one = f();
  pk::setThreads(3);
  const Outputs three = f();
  pk::setThreads(1);
  ASSERT_EQ(one.size(), three.size()) << what;
  for (size_t k = 0; k < one.size(); ++k) {
    ASSERT_EQ(one[k].size(), three[k].size()) << what << " output " << k;
    ASSERT_GE(one[k].size(), 1u) << what << " output " << k;
    for (size_t i = 0; i < one[k].size(); ++i) {
      uint32_t a, b;
      std::memcpy(&a, &one[k][i], 4);
      std::memcpy(&b, &three[k][i], 4);
      ASSERT_EQ(a, b) << what << " output " << k << " element " << i << ": " << one[k][i] << " with 1 thread, "
                      << three[k][i] << " with 3";
    }
  }
}

std::vector<float> asFloats(const std::vector<uint8_t> &v) { return std::vector<float>(v.begin(), v.end()); }

} // namespace

TEST(Threads, SetThreadsSetsTheTeamSize) {
  pk::setThreads(3);
#ifdef _OPENMP
  EXPECT_EQ(pk::threads(), 3);
#endif
  pk::setThreads(0); // clamped
  EXPECT_EQ(pk::threads(), 1);
}

TEST(Threads, ElementwiseIsBitwiseIndependentOfThreads) {
  const pk::Shape s{64, 1024};
  const int64_t n = s.numel();
  const auto x = kt::randomVec(n, 1), y = kt::randomVec(n, 2, 0.5f, 2.0f), dy = kt::randomVec(n, 3);
  const auto row = kt::randomVec(1024, 4), col = kt::randomVec(64, 5, 0.5f, 2.0f);
  expectSameBits("unary and unary_grad", [&] {
    Outputs o(4, std::vector<float>(n));
    pk::unary(pk::Unary::GeluTanh, x.data(), n, o[0].data());
    pk::unary(pk::Unary::Tanh, x.data(), n, o[1].data());
    pk::unaryGrad(pk::Unary::GeluTanh, dy.data(), x.data(), nullptr, n, o[2].data());
    pk::unaryGrad(pk::Unary::Sigmoid, dy.data(), x.data(), o[1].data(), n, o[3].data());
    return o;
  });
  expectSameBits("binary (flat and broadcast)", [&] {
    Outputs o(4, std::vector<float>(n));
    pk::binary(pk::Binary::Mul, x.data(), s, y.data(), s, o[0].data());
    pk::binary(pk::Binary::Add, x.data(), s, row.data(), pk::Shape{1024}, o[1].data());
    pk::binary(pk::Binary::Div, x.data(), s, col.data(), pk::Shape{64, 1}, o[2].data());
    pk::binary(pk::Binary::Pow, y.data(), s, row.data(), pk::Shape{1, 1024}, o[3].data());
    return o;
  });
  expectSameBits("binary_grad", [&] {
    Outputs o(3, std::vector<float>(n));
    pk::binaryGrad(pk::BinaryGrad::DivRhs, dy.data(), x.data(), s, y.data(), s, o[0].data());
    pk::binaryGrad(pk::BinaryGrad::PowLhs, dy.data(), y.data(), s, row.data(), pk::Shape{1024}, o[1].data());
    pk::binaryGrad(pk::BinaryGrad::PowRhs, dy.data(), y.data(), s, col.data(), pk::Shape{64, 1}, o[2].data());
    return o;
  });
  expectSameBits("dropout, where, cast, transpose, expand", [&] {
    Outputs o(6, std::vector<float>(n));
    std::vector<uint8_t> mask((size_t)n), cond((size_t)n);
    pk::dropout(x.data(), n, o[0].data(), mask.data(), 0.3f, true, pk::dropoutStreamKey(7, 1, 2, 3));
    o[1] = asFloats(mask);
    for (int64_t i = 0; i < n; ++i) cond[i] = x[i] > 0;
    pk::where(cond.data(), s, x.data(), s, row.data(), pk::Shape{1024}, o[2].data());
    std::vector<double> d((size_t)n);
    pk::cast(x.data(), n, d.data());
    pk::cast(d.data(), n, o[3].data());
    pk::transpose(x.data(), pk::Shape{64, 32, 32}, pk::Dims{2, 0, 1}, o[4].data());
    pk::expand(row.data(), pk::Shape{1, 1024}, o[5].data(), s);
    return o;
  });
}

TEST(Threads, NormalizationSoftmaxAndReductionsAreBitwiseIndependentOfThreads) {
  const pk::Shape s{16, 32, 256}; // 131072 elements
  const int64_t n = s.numel();
  const auto x = kt::randomVec(n, 11), dy = kt::randomVec(n, 12);
  const auto g = kt::randomVec(256, 13), b = kt::randomVec(256, 14);
  expectSameBits("layer_norm (+ grads, full and broadcast parameters)", [&] {
    Outputs o{std::vector<float>(n), std::vector<float>(16 * 32), std::vector<float>(16 * 32), std::vector<float>(n),
              std::vector<float>(256), std::vector<float>(256), std::vector<float>(1), std::vector<float>(1)};
    pk::layerNorm(x.data(), s, g.data(), pk::Shape{256}, b.data(), pk::Shape{256}, o[0].data(), o[1].data(),
                  o[2].data(), -1, 1e-5f);
    pk::layerNormGrad(dy.data(), x.data(), s, g.data(), pk::Shape{256}, o[3].data(), -1, 1e-5f);
    pk::layerNormParamGrad(dy.data(), x.data(), s, pk::Shape{256}, o[4].data(), o[5].data(), -1, 1e-5f);
    pk::layerNormParamGrad(dy.data(), x.data(), s, pk::Shape{1}, o[6].data(), o[7].data(), -1, 1e-5f);
    return o;
  });
  expectSameBits("softmax and softmax_grad (last and middle axis)", [&] {
    Outputs o(4, std::vector<float>(n));
    pk::softmax(x.data(), s, -1, o[0].data());
    pk::softmax(x.data(), s, 1, o[1].data());
    pk::softmaxGrad(dy.data(), o[0].data(), s, -1, o[2].data());
    pk::softmaxGrad(dy.data(), o[1].data(), s, 1, o[3].data());
    return o;
  });
  expectSameBits("reduce_sum / reduce_mean", [&] {
    Outputs o{std::vector<float>(32 * 256), std::vector<float>(16 * 256), std::vector<float>(16 * 32),
              std::vector<float>(32), std::vector<float>(1)};
    pk::reduceSum(x.data(), s, pk::Dims{0}, o[0].data());
    pk::reduceMean(x.data(), s, pk::Dims{1}, o[1].data());
    pk::reduceSum(x.data(), s, pk::Dims{2}, o[2].data());
    pk::reduceMean(x.data(), s, pk::Dims{0, 2}, o[3].data());
    pk::reduceSum(x.data(), s, pk::Dims{0, 1, 2}, o[4].data());
    return o;
  });
  expectSameBits("softmax_cross_entropy_loss (+ grad)", [&] {
    const pk::Shape ss{512, 100};
    std::vector<int64_t> labels(512);
    for (int i = 0; i < 512; ++i) labels[i] = (i * 37) % 100;
    Outputs o{std::vector<float>(1), std::vector<float>(ss.numel()), std::vector<float>(ss.numel())};
    const float dloss = 1.0f;
    pk::softmaxCrossEntropyLoss(x.data(), ss, labels.data(), nullptr, pk::Reduction::Mean, std::nullopt, o[0].data(),
                                o[1].data());
    pk::softmaxCrossEntropyLossGrad(&dloss, x.data(), ss, labels.data(), nullptr, pk::Reduction::Mean,
                                    std::optional<int64_t>(3), o[2].data());
    return o;
  });
  expectSameBits("batch_norm (+ grads)", [&] {
    const pk::Shape bs{8, 16, 32, 32};
    const auto sc = kt::randomVec(16, 15), bi = kt::randomVec(16, 16), rm = kt::randomVec(16, 17);
    const auto rv = kt::randomVec(16, 18, 0.5f, 2.0f);
    Outputs o{std::vector<float>(bs.numel()), std::vector<float>(16), std::vector<float>(16),
              std::vector<float>(bs.numel()), std::vector<float>(16), std::vector<float>(16)};
    pk::batchNorm(x.data(), bs, sc.data(), bi.data(), rm.data(), rv.data(), o[0].data(), o[1].data(), o[2].data(),
                  1e-5f, 0.9f, true);
    pk::batchNormGrad(dy.data(), x.data(), bs, sc.data(), rm.data(), rv.data(), o[3].data(), 1e-5f, true);
    pk::batchNormParamGrad(dy.data(), x.data(), bs, rm.data(), rv.data(), o[4].data(), o[5].data(), 1e-5f, true);
    return o;
  });
}

/// conv, convInputGrad and convWeightGrad of random x, w, bias and dy (seeds
/// from `seed`) at 1 and at 3 threads.
void expectConvSameBits(const char *what, const pk::Shape &xs, const pk::Shape &ws, const pk::Dims &strides,
                        int64_t group, int seed) {
  const pk::Dims pads{1, 1, 1, 1}, dil{1, 1};
  const auto x = kt::randomVec(xs.numel(), seed), w = kt::randomVec(ws.numel(), seed + 1),
             bias = kt::randomVec(ws[0], seed + 2);
  const pk::Shape ys = pk::convOutputShape(xs, ws, strides, pads, dil);
  const auto dy = kt::randomVec(ys.numel(), seed + 3);
  expectSameBits(what, [&] {
    Outputs o{std::vector<float>(ys.numel()), std::vector<float>(xs.numel()), std::vector<float>(ws.numel())};
    pk::conv(x.data(), xs, w.data(), ws, bias.data(), o[0].data(), strides, pads, dil, group);
    pk::convInputGrad(dy.data(), ys, w.data(), ws, o[1].data(), xs, strides, pads, dil, group);
    pk::convWeightGrad(dy.data(), ys, x.data(), xs, o[2].data(), ws, strides, pads, dil, group);
    return o;
  });
}

TEST(Threads, ConvPoolGemmAndOptimizersAreBitwiseIndependentOfThreads) {
  const pk::Shape xs{2, 8, 32, 32};
  const auto x = kt::randomVec(xs.numel(), 21);
  expectConvSameBits("conv (+ input and weight grads: im2col / col2im)", xs, {16, 8, 3, 3}, {1, 1}, 1, 21);
  // Samples go to threads whole (six over three threads), and the weight
  // gradient's four slices of samples split 1, 1, 2 over them; strided and
  // grouped, so the input gradient takes the col2im path.
  expectConvSameBits("conv of six samples, strided and grouped (+ grads)", {6, 16, 48, 48}, {24, 8, 3, 3}, {2, 2},
                     2, 41);
  // Winograd F(2x2, 3x3): five blocks of tiles over three threads, the
  // weight gradient's four slices of blocks split 1, 1, 2.
  expectConvSameBits("3x3 conv of sixteen channels, Winograd (+ grads)", {5, 16, 20, 22}, {16, 16, 3, 3}, {1, 1}, 1,
                     51);
  expectSameBits("max / average / global pooling (+ grads)", [&] {
    const pk::Dims k{3, 3}, s2{2, 2}, p1{1, 1, 1, 1};
    const pk::Shape ps = pk::poolOutputShape(xs, k, s2, p1, pk::Dims{}, false);
    const auto pdy = kt::randomVec(ps.numel(), 25);
    Outputs o{std::vector<float>(ps.numel()), std::vector<float>(xs.numel()), std::vector<float>(ps.numel()),
              std::vector<float>(xs.numel()), std::vector<float>(16)};
    pk::maxPool(x.data(), xs, o[0].data(), k, s2, p1, pk::Dims{}, false);
    pk::maxPoolGrad(pdy.data(), x.data(), xs, o[1].data(), k, s2, p1, pk::Dims{}, false);
    pk::averagePool(x.data(), xs, o[2].data(), k, s2, p1, false, true);
    pk::averagePoolGrad(pdy.data(), o[3].data(), xs, k, s2, p1, false, false);
    pk::globalAveragePool(x.data(), xs, o[4].data());
    return o;
  });
  expectSameBits("gemm (OpenBLAS threads)", [&] {
    const int64_t M = 256, N = 384, K = 512;
    const auto a = kt::randomVec(M * K, 26), bm = kt::randomVec(K * N, 27), c = kt::randomVec(N, 28);
    Outputs o{std::vector<float>(M * N), std::vector<float>(K * N)};
    pk::gemm(a.data(), bm.data(), c.data(), pk::Shape{N}, o[0].data(), M, N, K, false, false, 1.0f, 1.0f);
    pk::gemm(a.data(), o[0].data(), nullptr, pk::Shape{}, o[1].data(), K, N, M, true, false, 1.0f, 0.0f);
    return o;
  });
  expectSameBits("sgd_update / adamw_update", [&] {
    const int64_t n = 100000;
    auto p = kt::randomVec(n, 31), grad = kt::randomVec(n, 32), m = kt::randomVec(n, 33);
    auto v = kt::randomVec(n, 34, 0.0f, 1.0f), q = p, buf = m;
    pk::adamwUpdate(p.data(), grad.data(), m.data(), v.data(), n, 3, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f);
    pk::sgdUpdate(q.data(), grad.data(), buf.data(), n, 2, 0.1f, 0.9f, 1e-4f);
    return Outputs{p, m, v, q, buf};
  });
}
