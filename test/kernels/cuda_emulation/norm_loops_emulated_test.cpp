// cuda-norm-loops-emulated: the row norms' device code that a generated
// kernel joins to an element-wise loop (pipec/cuda_row_norm.cuh; the
// joins are pipec-fuse-norm-loops', docs/optimization.md "Norms with their
// loops"), under the host emulation (emu.h), in float and bf16 storage:
//   - a loop before a norm (a residual add with dropout, as GPT-2's), the
//     kernel storing the row's sums then normalizing the row it stored,
//     must give the bits of the loop's stores followed by the library's
//     pc::layerNorm on them: the sums, y, the means and 1/std;
//   - a loop after a norm's input gradient (the residual stream's gradient
//     sum), fed each pack of the gradient rounded to its storage, must give
//     the bits of pc::layerNormGrad's stored dx followed by the loop;
// for rows a warp walks and rows a block walks (pk::rowLaunch), centered
// and RMS, with every buffer aligned, with the loop's operands off the
// 16-byte packs (the norm still in packs, as the library runs it), with a
// norm parameter off them and with a row length that does not divide (one
// element at a time). The kernels here have the structure the emitter
// writes (compiler/Emit/EmitFused.cpp: the loop over a row's packs, the
// barrier, the row functions, the width the norm's pointers allow), with
// the loop's elements read one by one; the stages' emulated tests
// (cuda-stage-emulated) run the generated ones.
#include "emu.h"
#include "pipec/cuda_kernels.h"
#include "pipec/cuda_row_norm.cuh"
#include "emulated_checks.h"
#include "pipec/binary_math.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

namespace pk = pipec::kernels;
namespace pc = pipec::kernels::cuda;
using bf = pc::bf16;
using emucheck::ctx;
using emucheck::expect;
using emucheck::failures;

static std::mt19937_64 rng(4242);

template <class E> static std::vector<E> randomStored(int64_t n, float lo, float hi) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<E> v((size_t)n);
  for (E &x : v) x = E(d(rng));
  return v;
}
static std::vector<float> randomFloats(int64_t n) {
  std::uniform_real_distribution<float> d(0.5f, 1.5f);
  std::vector<float> v((size_t)n);
  for (float &x : v) x = d(rng);
  return v;
}
template <class E> static bool sameBits(const std::vector<E> &a, const std::vector<E> &b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(E)) == 0;
}

constexpr uint64_t kKey = 0x5eed;
constexpr float kRatio = 0.1f;

/// The loop before the norm, per element: s = b + dropout(a), as a
/// generated loop computes and rounds it.
template <class E> __device__ E residualElement(const E *a, const E *b, int64_t i, uint64_t threshold, double scale) {
  const bool keep = pk::dropoutDraw(kKey, (uint64_t)i) >= threshold;
  const float dropped = keep ? (float)((double)float(a[i]) * scale) : 0.0f;
  return E(pk::binaryValue<pk::Binary::Add>(float(b[i]), dropped));
}

template <class E> __global__ void residualLoop(int64_t n, const E *a, const E *b, uint64_t threshold, double scale,
                                                 E *s) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    s[i] = residualElement(a, b, i, threshold, scale);
}

template <class P, int V, class E>
__global__ void joinedNorm(int64_t rows, int64_t inner, const E *a, const E *b, uint64_t threshold, double scale,
                           E *s, const float *g, const float *beta, E *y, float *mean, float *invStd,
                           float epsilon, pk::RowNorm norm) {
  for (int64_t r = P::first(); r < rows; r += P::step()) {
    for (int64_t c = P::lane(); c < inner / V; c += P::lanes())
      for (int v = 0; v < V; ++v) {
        const int64_t i = r * inner + c * V + v;
        s[i] = residualElement(a, b, i, threshold, scale);
      }
    P::sync();
    pc::layerNormRow<P, V>(s + r * inner, inner, g, beta, y + r * inner, r, mean, invStd, epsilon, norm);
  }
}

template <class E> __global__ void gradientSumLoop(int64_t n, const E *dr, const E *dx, E *out) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    out[i] = E(pk::binaryValue<pk::Binary::Add>(float(dr[i]), float(dx[i])));
}

template <class P, int V, class E>
__global__ void joinedNormGrad(int64_t rows, int64_t inner, const E *dy, const E *x, const float *g, float epsilon,
                               pk::RowNorm norm, const E *dr, E *out) {
  for (int64_t r = P::first(); r < rows; r += P::step())
    pc::layerNormGradRow<P, V>(dy + r * inner, x + r * inner, inner, g, epsilon, norm,
                               [&](int64_t c, const float (&dx)[V]) {
                                 for (int v = 0; v < V; ++v) {
                                   const int64_t i = r * inner + c * V + v;
                                   out[i] = E(pk::binaryValue<pk::Binary::Add>(float(dr[i]), float(E(dx[v]))));
                                 }
                               });
}

/// n elements of E at a 64-byte boundary, or one element past it.
template <class E> struct Buffer {
  std::vector<E> storage;
  E *p;
  Buffer(int64_t n, bool offset) : storage((size_t)n + 64) {
    uintptr_t at = reinterpret_cast<uintptr_t>(storage.data());
    at = (at + 63) / 64 * 64;
    p = reinterpret_cast<E *>(at) + (offset ? 1 : 0);
  }
  Buffer(const std::vector<E> &values, bool offset) : Buffer((int64_t)values.size(), offset) {
    std::copy(values.begin(), values.end(), p);
  }
  std::vector<E> values(int64_t n) const { return std::vector<E>(p, p + n); }
};

enum class Misaligned { None, Loop, Norm };

template <class E> static void runCase(int64_t rows, int64_t inner, pk::RowNorm norm, Misaligned off) {
  const int64_t n = rows * inner;
  constexpr int kPack = pc::kPackOf<E>;
  ctx = std::string(std::is_same_v<E, bf> ? "bf16" : "float") + " rows " + std::to_string(rows) + " x " +
        std::to_string(inner) + (norm == pk::RowNorm::Layer ? " layer" : " rms") +
        (off == Misaligned::Loop ? " loop off its packs" : off == Misaligned::Norm ? " scale off its packs" : "");
  const Buffer<E> a(randomStored<E>(n, -2.0f, 2.0f), off == Misaligned::Loop),
      b(randomStored<E>(n, -2.0f, 2.0f), false);
  const Buffer<float> g(randomFloats(inner), off == Misaligned::Norm), beta(randomFloats(inner), false);
  const uint64_t threshold = pk::dropoutKeepThreshold((double)kRatio);
  const double scale = 1.0 / (1.0 - (double)kRatio);
  const float epsilon = 1e-5f;
  const pc::RowLaunch walk = pc::rowLaunch(rows, inner);
  const cudaStream_t stream = emu::expectedStream;

  // Forward: the loop and the library's norm, then the joined kernel.
  Buffer<E> s1(n, false), y1(n, false), s2(n, false), y2(n, false);
  Buffer<float> m1(rows, false), i1(rows, false), m2(rows, false), i2(rows, false);
  emu::launch(emu::Cfg(64, 256, 0, stream), residualLoop<E>)(n, a.p, b.p, threshold, scale, s1.p);
  pc::layerNorm(s1.p, pk::Shape{rows, inner}, g.p, pk::Shape{inner}, beta.p, pk::Shape{inner}, y1.p, m1.p, i1.p,
                -1, epsilon, norm);
  // As generated code launches it: the lane group of pc::rowLaunch; V the
  // storage's 16-byte width when the norm's pointers allow it, as the
  // library's norm chooses, else 1 (the loop's operands, here read one by
  // one, need not be aligned for it).
  const bool normPacked = inner % kPack == 0 && pc::packedAligned<kPack>(s2.p, y2.p, g.p, beta.p);
  auto forward = [&](auto lanes, auto width) {
    using P = decltype(lanes);
    constexpr int V = decltype(width)::value;
    emu::launch(emu::Cfg(walk.grid, walk.threads, 0, stream), joinedNorm<P, V, E>)(
        rows, inner, a.p, b.p, threshold, scale, s2.p, g.p, beta.p, y2.p, m2.p, i2.p, epsilon, norm);
  };
  // Backward: the library's gradient and the loop, then the joined kernel.
  const Buffer<E> dy(randomStored<E>(n, -1.0f, 1.0f), false),
      dr(randomStored<E>(n, -1.0f, 1.0f), off == Misaligned::Loop);
  Buffer<E> dx(n, false), out1(n, false), out2(n, false);
  pc::layerNormGrad(dy.p, s1.p, pk::Shape{rows, inner}, g.p, pk::Shape{inner}, dx.p, -1, epsilon, norm);
  emu::launch(emu::Cfg(64, 256, 0, stream), gradientSumLoop<E>)(n, dr.p, dx.p, out1.p);
  const bool gradPacked = inner % kPack == 0 && pc::packedAligned<kPack>(dy.p, s1.p, g.p);
  auto backward = [&](auto lanes, auto width) {
    using P = decltype(lanes);
    constexpr int V = decltype(width)::value;
    emu::launch(emu::Cfg(walk.grid, walk.threads, 0, stream), joinedNormGrad<P, V, E>)(
        rows, inner, dy.p, s1.p, g.p, epsilon, norm, dr.p, out2.p);
  };
  auto withLanes = [&](auto run, bool packed) {
    auto withWidth = [&](auto lanes) {
      if (packed)
        run(lanes, std::integral_constant<int, kPack>{});
      else
        run(lanes, std::integral_constant<int, 1>{});
    };
    if (walk.warpPerRow)
      withWidth(pc::WarpLanes{});
    else
      withWidth(pc::BlockLanes{});
  };
  withLanes(forward, normPacked);
  withLanes(backward, gradPacked);
  expect(sameBits(s1.values(n), s2.values(n)), "the joined loop's stored sums differ from the loop's");
  expect(sameBits(y1.values(n), y2.values(n)), "the joined norm's y differs from pc::layerNorm's");
  expect(sameBits(m1.values(rows), m2.values(rows)) && sameBits(i1.values(rows), i2.values(rows)),
         "the joined norm's statistics differ from pc::layerNorm's");
  expect(sameBits(out1.values(n), out2.values(n)),
         "the loop on the joined gradient differs from the loop on pc::layerNormGrad's dx");
  expect(walk.warpPerRow == (inner <= pc::kWarpRowMaxElements), "rowLaunch's lane group");
  expect(normPacked == (inner % kPack == 0 && off != Misaligned::Norm), "the norm's width");
}

int main() {
  void *fakeStream = (void *)0x6160;
  emu::expectedStream = (cudaStream_t)fakeStream;
  pc::StreamScope scope(fakeStream, pc::Precision::F32);
  try {
    // A warp per row (GPT-2's width; an odd one), a block per row.
    const std::vector<std::pair<int64_t, int64_t>> shapes = {{37, 768}, {9, 100}, {3, 4104}, {2, 4099}};
    for (auto [rows, inner] : shapes)
      for (pk::RowNorm norm : {pk::RowNorm::Layer, pk::RowNorm::Rms})
        for (Misaligned off : {Misaligned::None, Misaligned::Loop, Misaligned::Norm}) {
          runCase<float>(rows, inner, norm, off);
          runCase<bf>(rows, inner, norm, off);
        }
  } catch (const std::exception &e) {
    std::printf("EXCEPTION (%s): %s\n", ctx.c_str(), e.what());
    ++failures;
  }
  return emucheck::finish();
}
