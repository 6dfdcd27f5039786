// Times the CPU kernels on typical sizes and prints GFLOP/s (or GB/s for
// memory-bound kernels). Built with the kernels' tests, never run by ctest:
//   ninja -C build-kernels bench_cpu_kernels && build-kernels/bench-kernels/bench_cpu_kernels
// OpenBLAS runs single-threaded (one pipeline rank per core) unless
// --threads N is given.
#include "pipec/cpu_kernels.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

namespace pk = pipec::kernels;

namespace {
std::vector<float> rnd(int64_t n, unsigned seed) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> d(-1, 1);
  std::vector<float> v((size_t)n);
  for (float &x : v) x = d(g);
  return v;
}

/// Median-free simple timing: warm up once, then repeat until ~0.3 s.
double seconds(const std::function<void()> &f) {
  f();
  int reps = 0;
  auto start = std::chrono::steady_clock::now();
  double elapsed = 0;
  do {
    f();
    ++reps;
    elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  } while (elapsed < 0.3);
  return elapsed / reps;
}

void row(const std::string &kernel, const std::string &shape, double flops, double bytes, double s) {
  std::printf("%-22s %-40s %10.3f ms %9.2f GFLOP/s %8.2f GB/s\n", kernel.c_str(), shape.c_str(), s * 1e3,
              flops / s / 1e9, bytes / s / 1e9);
}

void benchGemm(int64_t M, int64_t N, int64_t K, bool tb) {
  auto A = rnd(M * K, 1), B = rnd(K * N, 2), C = rnd(N, 3);
  std::vector<float> Y(M * N);
  const double s = seconds([&] {
    pk::gemm(A.data(), B.data(), C.data(), {N}, Y.data(), M, N, K, false, tb, 1.0f, 1.0f);
  });
  row(tb ? "gemm (transB)" : "gemm", std::to_string(M) + "x" + std::to_string(K) + " * " + std::to_string(K) + "x" +
                                        std::to_string(N),
      2.0 * M * N * K, 4.0 * (M * K + K * N + M * N), s);
}

void benchConv(pk::Shape xs, pk::Shape ws, pk::Dims strides, pk::Dims pads, int64_t group) {
  pk::Dims dil;
  for (int a = 2; a < xs.size; ++a) dil.push(1);
  const pk::Shape ys = pk::convOutputShape(xs, ws, strides, pads, dil);
  auto x = rnd(xs.numel(), 4), w = rnd(ws.numel(), 5), b = rnd(ws[0], 6), dy = rnd(ys.numel(), 7);
  std::vector<float> y(ys.numel()), dx(xs.numel()), dw(ws.numel());
  const double flops = 2.0 * ys.numel() * (double)(ws.numel() / ws[0]);
  const std::string shape = "x" + xs.str() + " w" + ws.str() + (group > 1 ? " g" + std::to_string(group) : "");
  row("conv", shape, flops, 4.0 * (xs.numel() + ws.numel() + ys.numel()),
      seconds([&] { pk::conv(x.data(), xs, w.data(), ws, b.data(), y.data(), strides, pads, dil, group); }));
  row("conv_input_grad", shape, flops, 4.0 * (xs.numel() + ws.numel() + ys.numel()), seconds([&] {
        pk::convInputGrad(dy.data(), ys, w.data(), ws, dx.data(), xs, strides, pads, dil, group);
      }));
  row("conv_weight_grad", shape, flops, 4.0 * (xs.numel() + ws.numel() + ys.numel()), seconds([&] {
        pk::convWeightGrad(dy.data(), ys, x.data(), xs, dw.data(), ws, strides, pads, dil, group);
      }));
}

void benchLayerNorm(int64_t rows, int64_t d) {
  const pk::Shape xs{rows, d};
  auto x = rnd(rows * d, 8), g = rnd(d, 9), b = rnd(d, 10), dy = rnd(rows * d, 11);
  std::vector<float> y(rows * d), mean(rows), inv(rows), dx(rows * d), dg(d), db(d);
  const std::string shape = xs.str();
  // ~8 flops per element forward, ~12 backward (the ops' cost estimates use similar counts)
  row("layer_norm", shape, 8.0 * rows * d, 4.0 * 2 * rows * d, seconds([&] {
        pk::layerNorm(x.data(), xs, g.data(), {d}, b.data(), {d}, y.data(), mean.data(), inv.data(), -1, 1e-5f);
      }));
  row("layer_norm_grad", shape, 12.0 * rows * d, 4.0 * 3 * rows * d,
      seconds([&] { pk::layerNormGrad(dy.data(), x.data(), xs, g.data(), {d}, dx.data(), -1, 1e-5f); }));
  row("layer_norm_param_grad", shape, 6.0 * rows * d, 4.0 * 2 * rows * d, seconds([&] {
        pk::layerNormParamGrad(dy.data(), x.data(), xs, {d}, dg.data(), db.data(), -1, 1e-5f);
      }));
}

void benchBatchNorm(pk::Shape xs) {
  const int64_t c = xs[1], n = xs.numel();
  auto x = rnd(n, 12), dy = rnd(n, 13), sc = rnd(c, 14), bi = rnd(c, 15);
  std::vector<float> rm(c, 0.0f), rv(c, 1.0f), nm(c), nv(c), y(n), dx(n), ds(c), db(c);
  const std::string shape = xs.str();
  // forward: two statistics passes and the normalization (~5 flops per
  // element); input gradient: statistics, two sums and dx (~12); parameter
  // gradient: statistics and two sums (~7)
  row("batch_norm", shape, 5.0 * n, 4.0 * 2 * n, seconds([&] {
        pk::batchNorm(x.data(), xs, sc.data(), bi.data(), rm.data(), rv.data(), y.data(), nm.data(), nv.data(),
                      1e-5f, 0.9f, true);
      }));
  row("batch_norm_grad", shape, 12.0 * n, 4.0 * 3 * n, seconds([&] {
        pk::batchNormGrad(dy.data(), x.data(), xs, sc.data(), rm.data(), rv.data(), dx.data(), 1e-5f, true);
      }));
  row("batch_norm_param_grad", shape, 7.0 * n, 4.0 * 2 * n, seconds([&] {
        pk::batchNormParamGrad(dy.data(), x.data(), xs, rm.data(), rv.data(), ds.data(), db.data(), 1e-5f, true);
      }));
}
} // namespace

int main(int argc, char **argv) {
  int threads = 1;
  for (int i = 1; i + 1 < argc; ++i)
    if (!std::strcmp(argv[i], "--threads")) threads = std::atoi(argv[i + 1]);
  pk::setBlasThreads(threads);
  std::printf("pipec CPU kernels, %d BLAS thread(s)\n", threads);
  std::printf("%-22s %-40s %13s %17s %13s\n", "kernel", "shape", "time", "compute", "traffic");
  benchGemm(64, 512, 784, true);   // MLP layer, micro-batch 64
  benchGemm(256, 1024, 1024, true);
  benchGemm(512, 768, 768, false); // GPT-small projection, 4 x 128 tokens
  benchGemm(512, 3072, 768, false);
  benchConv({8, 64, 32, 32}, {64, 64, 3, 3}, {1, 1}, {1, 1, 1, 1}, 1); // ResNet block, CIFAR
  benchConv({8, 3, 32, 32}, {64, 3, 3, 3}, {1, 1}, {1, 1, 1, 1}, 1);   // first layer
  // bench/codegen's ResNet (micro-batch 16): its 3x3 layers at each width.
  benchConv({16, 32, 32, 32}, {32, 32, 3, 3}, {1, 1}, {1, 1, 1, 1}, 1);
  benchConv({16, 32, 32, 32}, {64, 32, 3, 3}, {2, 2}, {1, 1, 1, 1}, 1);
  benchConv({16, 64, 16, 16}, {64, 64, 3, 3}, {1, 1}, {1, 1, 1, 1}, 1);
  benchConv({16, 128, 8, 8}, {128, 128, 3, 3}, {1, 1}, {1, 1, 1, 1}, 1);
  benchConv({8, 128, 16, 16}, {256, 128, 1, 1}, {1, 1}, {0, 0, 0, 0}, 1); // pointwise
  benchConv({8, 64, 32, 32}, {64, 1, 3, 3}, {1, 1}, {1, 1, 1, 1}, 64); // depthwise
  benchBatchNorm({16, 32, 32, 32}); // bench/codegen's ResNet, micro-batch 16
  benchBatchNorm({16, 64, 16, 16});
  benchBatchNorm({16, 128, 8, 8});
  benchLayerNorm(512, 768);
  benchLayerNorm(4096, 256);
  return 0;
}
