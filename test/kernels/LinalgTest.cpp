#include "TestUtil.h"

#include <cstring>

using namespace kt;

namespace {

std::vector<float> naiveGemm(const std::vector<float> &A, const std::vector<float> &B, const float *C,
                             const pk::Shape &cs, int64_t M, int64_t N, int64_t K, bool ta, bool tb, float alpha,
                             float beta) {
  std::vector<float> Y((size_t)(M * N));
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double s = 0;
      for (int64_t p = 0; p < K; ++p) s += (double)A[ta ? p * M + i : i * K + p] * B[tb ? j * K + p : p * N + j];
      double v = alpha * s;
      if (C) v += beta * C[bcastOffset({i, j}, vecOf(cs))];
      Y[i * N + j] = (float)v;
    }
  return Y;
}

TEST(Linalg, GemmAllTransposesAndCBroadcasts) {
  const int64_t M = 7, N = 5, K = 9;
  int seed = 10;
  const pk::Shape cshapes[] = {{M, N}, {N}, {M, 1}, {}, {1, N}};
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (const pk::Shape &cs : cshapes) {
        auto A = randomVec(M * K, seed++), B = randomVec(K * N, seed++), C = randomVec(cs.numel(), seed++);
        std::vector<float> Y(M * N);
        pk::gemm(A.data(), B.data(), C.data(), cs, Y.data(), M, N, K, ta, tb, 0.75f, -1.5f);
        expectAllNear(Y, naiveGemm(A, B, C.data(), cs, M, N, K, ta, tb, 0.75f, -1.5f), 1e-5, cs.str().c_str());
      }
  // No C; Y's previous contents are ignored.
  auto A = randomVec(M * K, 1), B = randomVec(K * N, 2);
  std::vector<float> Y(M * N, 1e30f);
  pk::gemm(A.data(), B.data(), nullptr, {}, Y.data(), M, N, K, false, true, 1.0f, 1.0f);
  expectAllNear(Y, naiveGemm(A, B, nullptr, {}, M, N, K, false, true, 1.0f, 1.0f), 1e-5);
  float C[3] = {};
  EXPECT_THROW(pk::gemm(A.data(), B.data(), C, {3}, Y.data(), M, N, K, false, false, 1, 1), pk::KernelError);
}

// nn.gemm's epilogue: f applied to each panel as it is computed gives the
// bits of the GEMM followed by pk::unary, on products split into several
// panels by rows and by columns, with 1 and 3 threads.
TEST(Linalg, GemmEpilogueHasTheBitsOfGemmThenUnary) {
  struct Case {
    int64_t M, N, K;
  };
  const Case cases[] = {{7, 5, 9}, {640, 96, 512}, {96, 640, 512}};
  const int before = pk::threads();
  int seed = 40;
  for (const Case &c : cases)
    for (pk::Unary f : {pk::Unary::Relu, pk::Unary::GeluTanh, pk::Unary::Sigmoid})
      for (int threads : {1, 3}) {
        pk::setThreads(threads);
        auto A = randomVec(c.M * c.K, seed++), B = randomVec(c.N * c.K, seed++), bias = randomVec(c.N, seed++);
        std::vector<float> fused(c.M * c.N), separate(c.M * c.N);
        pk::gemm(A.data(), B.data(), bias.data(), {c.N}, fused.data(), c.M, c.N, c.K, false, true, 1.0f, 1.0f, f);
        pk::gemm(A.data(), B.data(), bias.data(), {c.N}, separate.data(), c.M, c.N, c.K, false, true, 1.0f, 1.0f);
        pk::unary(f, separate.data(), c.M * c.N, separate.data());
        EXPECT_EQ(0, std::memcmp(fused.data(), separate.data(), fused.size() * sizeof(float)))
            << c.M << "x" << c.N << "x" << c.K << " " << pipec::unaryName(f) << " threads " << threads;
      }
  pk::setThreads(before);
}

// The aux epilogues (nn.gemm's keeps_pre_activation, nn.gemm_activation_grad):
// the pre-activation is the plain GEMM's bits, the gradient is nn.unary_grad
// on the plain GEMM's bits, for any thread count and panel split.
TEST(Linalg, GemmAuxEpiloguesHaveTheBitsOfTheSeparateOps) {
  struct Case {
    int64_t M, N, K;
  };
  const Case cases[] = {{7, 5, 9}, {640, 96, 512}, {96, 640, 512}};
  const int before = pk::threads();
  int seed = 80;
  for (const Case &c : cases)
    for (pk::Unary f : {pk::Unary::GeluTanh, pk::Unary::Gelu, pk::Unary::Erf})
      for (int threads : {1, 3}) {
        pk::setThreads(threads);
        const std::string what = std::to_string(c.M) + "x" + std::to_string(c.N) + "x" + std::to_string(c.K) + " " +
                                 pipec::unaryName(f) + " threads " + std::to_string(threads);
        auto A = randomVec(c.M * c.K, seed++), B = randomVec(c.N * c.K, seed++), bias = randomVec(c.N, seed++);
        std::vector<float> y(c.M * c.N), pre(c.M * c.N), plain(c.M * c.N), activated(c.M * c.N);
        pk::gemm(A.data(), B.data(), bias.data(), {c.N}, y.data(), c.M, c.N, c.K, false, true, 1.0f, 1.0f, f,
                 pre.data());
        pk::gemm(A.data(), B.data(), bias.data(), {c.N}, plain.data(), c.M, c.N, c.K, false, true, 1.0f, 1.0f);
        pk::unary(f, plain.data(), c.M * c.N, activated.data());
        EXPECT_EQ(0, std::memcmp(pre.data(), plain.data(), pre.size() * sizeof(float))) << what << " (input)";
        EXPECT_EQ(0, std::memcmp(y.data(), activated.data(), y.size() * sizeof(float))) << what << " (result)";
        // The gradient: dy = 0.5 · A·Bᵀ, at x = the forward's input.
        auto dyA = randomVec(c.M * c.K, seed++);
        std::vector<float> fusedGrad(c.M * c.N), product(c.M * c.N), separateGrad(c.M * c.N);
        pk::gemmActivationGrad(dyA.data(), B.data(), pre.data(), fusedGrad.data(), c.M, c.N, c.K, false, true, 0.5f,
                               f);
        pk::gemm(dyA.data(), B.data(), nullptr, {}, product.data(), c.M, c.N, c.K, false, true, 0.5f, 0.0f);
        pk::unaryGrad(f, product.data(), pre.data(), nullptr, c.M * c.N, separateGrad.data());
        EXPECT_EQ(0, std::memcmp(fusedGrad.data(), separateGrad.data(), fusedGrad.size() * sizeof(float)))
            << what << " (gradient)";
      }
  pk::setThreads(before);
  // A derivative that reads the result cannot take x.
  std::vector<float> one(1, 1.0f), out(1);
  EXPECT_THROW(pk::gemmActivationGrad(one.data(), one.data(), one.data(), out.data(), 1, 1, 1, false, false, 1.0f,
                                      pk::Unary::Relu),
               pk::KernelError);
}

std::vector<float> naiveMatmul(const std::vector<float> &A, pk::Shape as, const std::vector<float> &B, pk::Shape bs) {
  const pk::Shape os = pk::matmulShape(as, bs);
  const bool va = as.size == 1, vb = bs.size == 1;
  if (va) as = pk::Shape{1, as[0]};
  if (vb) bs = pk::Shape{bs[0], 1};
  const int64_t M = as[as.size - 2], K = as[as.size - 1], N = bs[bs.size - 1];
  auto aB = vecOf(pk::Shape(as.v, as.size - 2)), bB = vecOf(pk::Shape(bs.v, bs.size - 2));
  auto batch = vecOf(pk::broadcastShape(pk::Shape(as.v, as.size - 2), pk::Shape(bs.v, bs.size - 2)));
  std::vector<float> Y;
  auto one = [&](const std::vector<int64_t> &idx) {
    const int64_t ao = bcastOffset(idx, aB) * M * K, bo = bcastOffset(idx, bB) * K * N;
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) {
        double s = 0;
        for (int64_t p = 0; p < K; ++p) s += (double)A[ao + i * K + p] * B[bo + p * N + j];
        Y.push_back((float)s);
      }
  };
  if (batch.empty())
    one({});
  else
    forEachIndex(batch, one);
  EXPECT_EQ((int64_t)Y.size(), os.numel());
  return Y;
}

TEST(Linalg, MatmulBatchBroadcastAndVectors) {
  struct Case { pk::Shape a, b, out; };
  const Case cases[] = {
      {{3, 4}, {4, 5}, {3, 5}},          {{2, 3, 4}, {4, 5}, {2, 3, 5}},       {{4, 5}, {2, 5, 3}, {2, 4, 3}},
      {{2, 1, 3, 4}, {5, 4, 6}, {2, 5, 3, 6}}, {{4}, {4, 5}, {5}},               {{3, 4}, {4}, {3}},
      {{4}, {4}, {}},                    {{2, 3, 4}, {4}, {2, 3}},             {{4}, {2, 4, 3}, {2, 3}},
      {{2, 3, 4}, {2, 4, 5}, {2, 3, 5}}, {{1, 3, 4}, {2, 4, 5}, {2, 3, 5}}};
  int seed = 100;
  for (const Case &c : cases) {
    EXPECT_EQ(pk::matmulShape(c.a, c.b), c.out) << c.a.str() << " x " << c.b.str();
    auto A = randomVec(c.a.numel(), seed++), B = randomVec(c.b.numel(), seed++);
    std::vector<float> Y(c.out.numel());
    pk::matmul(A.data(), c.a, B.data(), c.b, Y.data());
    expectAllNear(Y, naiveMatmul(A, c.a, B, c.b), 1e-5, (c.a.str() + " x " + c.b.str()).c_str());
  }
  EXPECT_THROW(pk::matmulShape({3, 4}, {5, 6}), pk::KernelError);
  EXPECT_THROW(pk::matmulShape({2, 3, 4}, {3, 4, 5}), pk::KernelError);
}

/// x with its last two axes swapped (the materialized transpose the trans
/// flags replace).
std::vector<float> swapLastTwo(const std::vector<float> &x, const pk::Shape &xs) {
  const int64_t rows = xs[xs.size - 2], cols = xs[xs.size - 1], count = xs.numel() / std::max<int64_t>(1, rows * cols);
  std::vector<float> t(x.size());
  for (int64_t b = 0; b < count; ++b)
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j) t[b * rows * cols + j * rows + i] = x[b * rows * cols + i * cols + j];
  return t;
}

// nn.batched_gemm: op(A) op(B) with the stored operands read through the
// trans flags matches matmul of the materialized transposes, for broadcast
// batches, a shared matrix and batches large enough to run on several
// threads, with the same bits for any thread count.
TEST(Linalg, BatchedGemmReadsTransposedOperands) {
  struct Case { pk::Shape a, b; bool ta, tb; };
  const Case cases[] = {{{2, 4, 5, 3}, {2, 4, 5, 6}, true, false}, {{2, 4, 3, 5}, {2, 4, 6, 5}, false, true},
                        {{2, 4, 5, 3}, {2, 4, 6, 5}, true, true},  {{2, 1, 5, 3}, {4, 6, 5}, true, true},
                        {{3, 7, 4}, {4, 5}, false, false},         {{3, 4, 7}, {5, 4}, true, true},
                        {{2, 3, 4}, {5, 4}, false, true},          {{16, 8, 64, 48}, {16, 8, 64, 32}, true, false}};
  int seed = 300;
  for (const Case &c : cases) {
    const pk::Shape al = pk::gemmOperandShape(c.a, c.ta), bl = pk::gemmOperandShape(c.b, c.tb);
    const pk::Shape ys = pk::matmulShape(al, bl);
    auto A = randomVec(c.a.numel(), seed++), B = randomVec(c.b.numel(), seed++);
    const auto At = c.ta ? swapLastTwo(A, c.a) : A, Bt = c.tb ? swapLastTwo(B, c.b) : B;
    std::vector<float> want(ys.numel()), got(ys.numel()), oneThread(ys.numel());
    pk::matmul(At.data(), al, Bt.data(), bl, want.data());
    const int before = pk::threads();
    pk::setThreads(3); // more than one thread even on a one-core machine
    pk::matmul(A.data(), c.a, B.data(), c.b, got.data(), c.ta, c.tb);
    pk::setThreads(1);
    pk::matmul(A.data(), c.a, B.data(), c.b, oneThread.data(), c.ta, c.tb);
    pk::setThreads(before);
    const std::string what = c.a.str() + (c.ta ? "^T" : "") + " x " + c.b.str() + (c.tb ? "^T" : "");
    expectAllNear(got, naiveMatmul(At, al, Bt, bl), 1e-5, what.c_str());
    expectAllNear(got, want, 1e-5, what.c_str());
    EXPECT_EQ(got, oneThread) << what;
  }
  std::vector<float> y(8);
  EXPECT_THROW(pk::matmul(y.data(), {4}, y.data(), {4, 2}, y.data(), true, false), pk::KernelError);
}

/// The textbook loop nest of an N-d convolution: visit(o, terms) for every
/// output index o (row-major), where terms(f) calls f(xo, wo) for each
/// (channel, tap) of o that reads an input element (flat offsets of that
/// input and weight element).
template <class Visit>
void forEachConvOutput(const pk::Shape &xs, const pk::Shape &ws, const pk::Dims &strides, const pk::Dims &pads,
                       const pk::Dims &dil, int64_t group, Visit visit) {
  const pk::Shape os = pk::convOutputShape(xs, ws, strides, pads, dil);
  const int sp = xs.size - 2;
  const int64_t Cg = ws[1], Fg = ws[0] / group;
  std::vector<int64_t> kshape(ws.v + 2, ws.v + ws.size);
  forEachIndex(vecOf(os), [&](const std::vector<int64_t> &o) {
    const int64_t n = o[0], f = o[1], g = f / Fg;
    visit(o, [&](auto term) {
      for (int64_t c = 0; c < Cg; ++c)
        forEachIndex(kshape, [&](const std::vector<int64_t> &k) {
          int64_t xo = n * xs[1] + g * Cg + c;
          for (int a = 0; a < sp; ++a) {
            const int64_t p = o[a + 2] * strides[a] - pads[a] + k[a] * dil[a];
            if (p < 0 || p >= xs[a + 2]) return;
            xo = xo * xs[a + 2] + p;
          }
          int64_t wo = f * Cg + c;
          for (int a = 0; a < sp; ++a) wo = wo * ws[a + 2] + k[a];
          term(xo, wo);
        });
    });
  });
}

/// Direct N-d convolution.
std::vector<float> naiveConv(const std::vector<float> &x, const pk::Shape &xs, const std::vector<float> &w,
                             const pk::Shape &ws, const float *bias, const pk::Dims &strides, const pk::Dims &pads,
                             const pk::Dims &dil, int64_t group) {
  std::vector<float> y;
  forEachConvOutput(xs, ws, strides, pads, dil, group, [&](const std::vector<int64_t> &o, auto terms) {
    double s = bias ? bias[o[1]] : 0.0;
    terms([&](int64_t xo, int64_t wo) { s += (double)x[xo] * w[wo]; });
    y.push_back((float)s);
  });
  return y;
}

/// The adjoints of naiveConv, by scattering its loop nest: dx[x index] +=
/// w * dy and dw[w index] += x * dy over every (output, channel, tap) that
/// reads the input.
void naiveConvGrads(const std::vector<float> &x, const pk::Shape &xs, const std::vector<float> &w, const pk::Shape &ws,
                    const std::vector<float> &dy, const pk::Dims &strides, const pk::Dims &pads, const pk::Dims &dil,
                    int64_t group, std::vector<float> &dx, std::vector<float> &dw) {
  std::vector<double> dxd(x.size()), dwd(w.size());
  int64_t yo = 0;
  forEachConvOutput(xs, ws, strides, pads, dil, group, [&](const std::vector<int64_t> &, auto terms) {
    const double d = dy[yo++];
    terms([&](int64_t xo, int64_t wo) {
      dxd[xo] += (double)w[wo] * d;
      dwd[wo] += (double)x[xo] * d;
    });
  });
  dx.assign(dxd.begin(), dxd.end());
  dw.assign(dwd.begin(), dwd.end());
}

struct ConvCase {
  pk::Shape xs, ws;
  pk::Dims strides, pads, dil;
  int64_t group;
};

const ConvCase kConvCases[] = {
    {{2, 3, 11}, {4, 3, 3}, {1}, {1, 1}, {1}, 1},                          // 1-D
    {{1, 4, 13}, {6, 2, 4}, {2}, {0, 3}, {2}, 2},                          // 1-D, groups, dilation, asymmetric pads
    {{2, 3, 7, 8}, {5, 3, 3, 3}, {1, 1}, {1, 1, 1, 1}, {1, 1}, 1},         // 2-D "same"
    {{1, 4, 9, 7}, {4, 1, 3, 2}, {2, 1}, {1, 0, 2, 1}, {1, 2}, 4},         // depthwise, strides, dilations
    {{2, 6, 5, 5}, {4, 3, 1, 1}, {1, 1}, {0, 0, 0, 0}, {1, 1}, 2},         // pointwise, grouped
    {{2, 3, 6, 6}, {8, 3, 1, 1}, {2, 2}, {0, 0, 0, 0}, {1, 1}, 1},         // 1x1 stride 2 (not pointwise)
    {{1, 2, 5, 4, 6}, {3, 2, 2, 3, 2}, {1, 2, 1}, {1, 0, 1, 0, 1, 1}, {1, 1, 2}, 1}, // 3-D
    {{3, 2, 8, 8}, {4, 2, 7, 7}, {3, 3}, {3, 3, 3, 3}, {1, 1}, 1},         // 7x7 stride 3 (ResNet stem-like)
    // Unit strides, whose input gradient is a convolution of dy with the
    // flipped kernel: dilations, groups, pads past the kernel's reach (the
    // flipped convolution crops) and channels enough for parallel im2col.
    {{2, 2, 9}, {3, 2, 2}, {1}, {3, 2}, {1}, 1},                           // 1-D, pads beyond K - 1
    {{1, 4, 8, 9}, {6, 2, 3, 3}, {1, 1}, {2, 0, 1, 3}, {2, 1}, 2},         // dilation, groups, asymmetric pads
    {{3, 16, 10, 12}, {24, 16, 3, 3}, {1, 1}, {1, 1, 1, 1}, {1, 1}, 1},    // ResNet 3x3, many channels
    {{2, 3, 6, 7}, {4, 3, 3, 3}, {1, 1}, {3, 1, 0, 3}, {1, 2}, 1},         // rows as long as x's, dilated, uneven pads
    {{1, 2, 2, 5}, {3, 2, 5, 3}, {1, 1}, {4, 1, 0, 1}, {1, 1}, 1},         // a tap that reads no input row
    {{1, 3, 4, 5, 6}, {2, 3, 3, 2, 3}, {1, 1, 1}, {1, 0, 2, 1, 1, 0}, {1, 2, 1}, 1}, // 3-D
    // More samples than the weight gradient's slices (kConvWeightGradSlices),
    // split unevenly, on both input-gradient paths.
    {{5, 4, 9, 8}, {6, 2, 3, 3}, {2, 2}, {1, 1, 1, 1}, {1, 1}, 2},         // strided, grouped (col2im)
    {{6, 8, 8, 8}, {8, 8, 3, 3}, {1, 1}, {1, 1, 1, 1}, {1, 1}, 1},         // flipped input gradient
    // Winograd F(2x2, 3x3) (3x3, unit strides, 16+ channels): odd outputs
    // (half tiles), no pads (the input gradient pads 2), pads past the
    // kernel (it crops), several blocks of tiles split over the weight
    // gradient's slices, and rows wider than a block.
    {{2, 16, 7, 9}, {16, 16, 3, 3}, {1, 1}, {0, 0, 0, 0}, {1, 1}, 1},
    {{1, 16, 6, 5}, {20, 16, 3, 3}, {1, 1}, {3, 1, 0, 2}, {1, 1}, 1},
    {{6, 16, 20, 20}, {16, 16, 3, 3}, {1, 1}, {1, 1, 1, 1}, {1, 1}, 1},
    {{1, 16, 3, 300}, {16, 16, 3, 3}, {1, 1}, {1, 1, 1, 1}, {1, 1}, 1},
};

TEST(Conv, MatchesDirectConvolution) {
  int seed = 200;
  for (const ConvCase &c : kConvCases) {
    auto x = randomVec(c.xs.numel(), seed++), w = randomVec(c.ws.numel(), seed++), b = randomVec(c.ws[0], seed++);
    const pk::Shape os = pk::convOutputShape(c.xs, c.ws, c.strides, c.pads, c.dil);
    std::vector<float> y(os.numel(), 1e30f);
    pk::conv(x.data(), c.xs, w.data(), c.ws, b.data(), y.data(), c.strides, c.pads, c.dil, c.group);
    expectAllNear(y, naiveConv(x, c.xs, w, c.ws, b.data(), c.strides, c.pads, c.dil, c.group), 1e-5,
                  c.xs.str().c_str());
    pk::conv(x.data(), c.xs, w.data(), c.ws, nullptr, y.data(), c.strides, c.pads, c.dil, c.group);
    expectAllNear(y, naiveConv(x, c.xs, w, c.ws, nullptr, c.strides, c.pads, c.dil, c.group), 1e-5);
  }
}

TEST(Conv, ShapesAndErrors) {
  EXPECT_EQ(pk::convOutputShape({1, 3, 224, 224}, {64, 3, 7, 7}, {2, 2}, {3, 3, 3, 3}, {1, 1}),
            (pk::Shape{1, 64, 112, 112}));
  float x[1] = {}, y[1] = {};
  // 4 channels do not split into groups of 3
  EXPECT_THROW(pk::conv(x, {1, 4, 5}, x, {2, 3, 1}, nullptr, y, {1}, {0, 0}, {1}, 1), pk::KernelError);
  // kernel larger than the padded input
  EXPECT_THROW(pk::conv(x, {1, 1, 2}, x, {1, 1, 5}, nullptr, y, {1}, {0, 0}, {1}, 1), pk::KernelError);
  // pads of the wrong length
  EXPECT_THROW(pk::conv(x, {1, 1, 5, 5}, x, {1, 1, 1, 1}, nullptr, y, {1, 1}, {0, 0}, {1, 1}, 1), pk::KernelError);
}

// conv_input_grad and conv_weight_grad against the scattered loop nest, for
// every geometry above (whichever of the kernels' strategies it takes).
TEST(Conv, GradientsMatchTheScatteredLoopNest) {
  int seed = 400;
  for (const ConvCase &c : kConvCases) {
    auto x = randomVec(c.xs.numel(), seed++), w = randomVec(c.ws.numel(), seed++);
    const pk::Shape os = pk::convOutputShape(c.xs, c.ws, c.strides, c.pads, c.dil);
    auto dy = randomVec(os.numel(), seed++);
    std::vector<float> dx(x.size(), 1e30f), dw(w.size(), 1e30f), dxRef, dwRef;
    pk::convInputGrad(dy.data(), os, w.data(), c.ws, dx.data(), c.xs, c.strides, c.pads, c.dil, c.group);
    pk::convWeightGrad(dy.data(), os, x.data(), c.xs, dw.data(), c.ws, c.strides, c.pads, c.dil, c.group);
    naiveConvGrads(x, c.xs, w, c.ws, dy, c.strides, c.pads, c.dil, c.group, dxRef, dwRef);
    expectAllNear(dx, dxRef, 1e-4, ("dx " + c.xs.str()).c_str());
    expectAllNear(dw, dwRef, 1e-4, ("dw " + c.ws.str()).c_str());
  }
}

// conv_weight_grad added into a buffer that holds something (a gradient
// buffer, pipec-plan-memory's `gradient` storage): the bits of writing it
// elsewhere and adding, for every geometry above (planned scratch:
// ScratchTest).
TEST(Conv, WeightGradAccumulatesTheBitsOfAnAddition) {
  int seed = 700;
  for (const ConvCase &c : kConvCases) {
    auto x = randomVec(c.xs.numel(), seed++);
    const pk::Shape os = pk::convOutputShape(c.xs, c.ws, c.strides, c.pads, c.dil);
    auto dy = randomVec(os.numel(), seed++), held = randomVec(c.ws.numel(), seed++);
    std::vector<float> dw(held.size()), added = held;
    pk::convWeightGrad(dy.data(), os, x.data(), c.xs, dw.data(), c.ws, c.strides, c.pads, c.dil, c.group);
    pk::convWeightGrad(dy.data(), os, x.data(), c.xs, added.data(), c.ws, c.strides, c.pads, c.dil, c.group, {},
                       true);
    for (size_t i = 0; i < dw.size(); ++i)
      ASSERT_EQ(added[i], held[i] + dw[i]) << "dw " << c.ws.str() << " [" << i << "]";
  }
}

// conv_input_grad and conv_weight_grad are the adjoints of conv: checked by
// finite differences of the forward kernel, for every geometry above.
TEST(Conv, GradientsMatchFiniteDifferences) {
  int seed = 300;
  for (const ConvCase &c : kConvCases) {
    if (c.xs.numel() > 400) continue; // keep the FD loop fast; geometry is covered by the smaller cases
    auto x = randomVec(c.xs.numel(), seed++), w = randomVec(c.ws.numel(), seed++);
    const pk::Shape os = pk::convOutputShape(c.xs, c.ws, c.strides, c.pads, c.dil);
    auto dy = randomVec(os.numel(), seed++);
    std::vector<float> dx(x.size(), 1e30f), dw(w.size(), 1e30f);
    pk::convInputGrad(dy.data(), os, w.data(), c.ws, dx.data(), c.xs, c.strides, c.pads, c.dil, c.group);
    pk::convWeightGrad(dy.data(), os, x.data(), c.xs, dw.data(), c.ws, c.strides, c.pads, c.dil, c.group);
    checkGradient(x, dy, [&](const std::vector<float> &in, std::vector<float> &out) {
      pk::conv(in.data(), c.xs, w.data(), c.ws, nullptr, out.data(), c.strides, c.pads, c.dil, c.group);
    }, dx, 1e-2f, 1e-3, 1e-3, ("dx " + c.xs.str()).c_str());
    checkGradient(w, dy, [&](const std::vector<float> &in, std::vector<float> &out) {
      pk::conv(x.data(), c.xs, in.data(), c.ws, nullptr, out.data(), c.strides, c.pads, c.dil, c.group);
    }, dw, 1e-2f, 1e-3, 1e-3, ("dw " + c.ws.str()).c_str());
  }
  float dy[4] = {};
  float dx[8];
  EXPECT_THROW(pk::convInputGrad(dy, {1, 1, 3}, dy, {1, 1, 2}, dx, {1, 1, 8}, {1}, {0, 0}, {1}, 1), pk::KernelError);
}

} // namespace
