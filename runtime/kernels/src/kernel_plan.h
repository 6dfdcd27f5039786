// How the kernels run a convolution (and CUDA a layer norm's parameter
// gradient), and the scratch that takes: the decisions shared by the CPU
// kernels (linalg.cpp, conv_winograd.cpp), the CUDA kernels (cuda/src/conv.cu,
// norm.cu) and the scratch queries the compiler asks (kernel_scratch.cpp,
// docs/optimization.md "Kernel scratch"). Plain C++, no BLAS: the compiler
// links it.
#ifndef PIPEC_KERNELS_KERNEL_PLAN_H
#define PIPEC_KERNELS_KERNEL_PLAN_H

#include "pipec/kernel_scratch.h"
#include "pipec/kernel_types.h"

#include <algorithm>
#include <string>

namespace pipec::kernels::plan {

//===----------------------------------------------------------------------===//
// CPU: Winograd F(2x2, 3x3) (docs/cpu-kernels.md, "Convolution")
//===----------------------------------------------------------------------===//

/// The fewest input and output channels for which a 3x3 convolution runs as
/// Winograd F(2x2, 3x3): fewer make the 16 GEMMs too thin to pay for the
/// transforms.
constexpr int64_t kWinogradMinChannels = 16;

/// Whether g is a 2-D, ungrouped, 3x3, unit-stride, undilated convolution
/// with channels enough for Winograd F(2x2, 3x3) (any pads, also crops).
inline bool winogradApplies(const ConvGeom &g) {
  if (g.sp != 2 || g.G != 1 || g.k[0] != 3 || g.k[1] != 3) return false;
  for (int a = 0; a < 2; ++a)
    if (g.s[a] != 1 || g.d[a] != 1 || g.out[a] < 2) return false;
  return g.C >= kWinogradMinChannels && g.F >= kWinogradMinChannels;
}

constexpr int64_t kPositions = 16; // the 4x4 transformed tile

/// The distance between two positions' matrices of `elements` floats: a
/// multiple of 4 KiB plus one cache line, so that the 16 streams a
/// transform writes or reads side by side fall in different cache sets
/// (at a multiple of 4 KiB they share one, and the transforms ran 5 times
/// slower).
inline int64_t positionStride(int64_t elements) { return (elements + 1023) / 1024 * 1024 + 16; }

/// Tiles per block: a block's transformed input [16, C, tiles] and GEMM
/// result [16, F, tiles] are built, multiplied and consumed by one thread
/// while they are in its cache. Blocks are whole rows of tiles, fixed by the
/// shape alone, so the same GEMMs run whatever the thread count.
constexpr int64_t kBlockTiles = 128;

/// Where blocks of tile rows lie: tile row r is (sample r / TH, tile row
/// r % TH of its output), TW tiles each.
struct TileGrid {
  int64_t TH = 0, TW = 0, rows = 0, rowsPerBlock = 0, blocks = 0;
  explicit TileGrid(const ConvGeom &g) {
    TH = (g.out[0] + 1) / 2;
    TW = (g.out[1] + 1) / 2;
    rows = g.N * TH;
    rowsPerBlock = std::max<int64_t>(1, kBlockTiles / TW);
    blocks = (rows + rowsPerBlock - 1) / rowsPerBlock;
  }
  int64_t firstRow(int64_t b) const { return b * rowsPerBlock; }
  int64_t endRow(int64_t b) const { return std::min(rows, (b + 1) * rowsPerBlock); }
  int64_t tiles(int64_t b) const { return (endRow(b) - firstRow(b)) * TW; }
  int64_t maxTiles() const { return rowsPerBlock * TW; }
};

/// The floats of one thread's block buffer of `channels` channels: the 16
/// position matrices, then the few image rows the transforms pad or crop
/// (5 rows of 2 TW + 2).
inline int64_t blockBufferFloats(const TileGrid &grid, int64_t channels) {
  return kPositions * positionStride(channels * grid.maxTiles()) + 5 * (2 * grid.TW + 2);
}

/// The floats of the transformed weights [16, F, C] (U, or its gradient dU).
inline int64_t transformedWeightFloats(const ConvGeom &g) { return kPositions * positionStride(g.F * g.C); }

//===----------------------------------------------------------------------===//
// CPU: im2col and the input gradient
//===----------------------------------------------------------------------===//

/// The slices of samples (or tiles) whose weight-gradient sums run on
/// threads of their own: a constant, so that the sum's order depends on the
/// batch alone. Four keep up to four threads busy, and at one thread cost
/// three extra passes over dW per call.
constexpr int64_t kConvWeightGradSlices = 4;

/// The floats of one sample's (and group's) column matrix [Cg * kSize, P].
inline int64_t columnFloats(const ConvGeom &g) { return g.Cg * g.kSize * g.outSize; }

/// The geometry of dx as a convolution of dy, for a forward convolution with
/// every stride 1: dx[c, i] = sum_{f, k} W[f, c, k] dy[f, i + pb - k d], so
/// with the kernel flipped (k' = K - 1 - k) it is a stride-1 convolution of
/// dy with begin pads (K - 1) d - pb (negative: a crop, which im2col
/// handles, since it tests every tap against the input's extent) whose
/// output has x's extent.
inline ConvGeom inputGradAsConv(const ConvGeom &g) {
  ConvGeom t = g;
  t.C = g.F;
  t.F = g.C;
  t.Cg = g.Fg;
  t.Fg = g.Cg;
  t.inSize = g.outSize;
  t.outSize = g.inSize;
  for (int a = 0; a < g.sp; ++a) {
    t.in[a] = g.out[a];
    t.out[a] = g.in[a];
    t.pb[a] = (g.k[a] - 1) * g.d[a] - g.pb[a];
  }
  t.pointwise = false;
  return t;
}

/// Whether dx is better computed as a convolution of dy (inputGradAsConv)
/// than by col2im of W^T dy: every stride must be 1, and dy's column matrix
/// [Fg * kSize, in] must not be much larger than the one col2im folds
/// [Cg * kSize, out] (the first layer of an image model, 3 channels in and
/// 64 out, is 8 times faster the col2im way).
inline bool inputGradByFlippedConv(const ConvGeom &g) {
  if (g.pointwise || g.Fg > 2 * g.Cg) return false;
  for (int a = 0; a < g.sp; ++a)
    if (g.s[a] != 1) return false;
  return true;
}

/// The flipped weights [C, Fg * kSize] of the input gradient by a flipped
/// convolution.
inline int64_t flippedWeightFloats(const ConvGeom &g) { return g.G * g.Cg * g.Fg * g.kSize; }

//===----------------------------------------------------------------------===//
// The CPU kernels' scratch, buffer by buffer in the order they take it
//===----------------------------------------------------------------------===//

/// y = conv(x, w): Winograd's U (shared) and each thread's transformed
/// input and product, else each thread's column matrix.
inline void addCpuConvForwardScratch(const ConvGeom &g, ScratchNeed &need) {
  if (winogradApplies(g)) {
    const TileGrid grid(g);
    need.addShared<float>(transformedWeightFloats(g));
    need.addPerThread<float>(blockBufferFloats(grid, g.C));
    need.addPerThread<float>(blockBufferFloats(grid, g.F));
  } else if (!g.pointwise) {
    need.addPerThread<float>(columnFloats(g));
  }
}

/// dx: the flipped weights (shared) and the flipped convolution's scratch,
/// else each thread's column matrix for col2im.
inline void addCpuConvInputGradScratch(const ConvGeom &g, ScratchNeed &need) {
  if (inputGradByFlippedConv(g)) {
    need.addShared<float>(flippedWeightFloats(g));
    addCpuConvForwardScratch(inputGradAsConv(g), need);
  } else if (!g.pointwise) {
    need.addPerThread<float>(columnFloats(g));
  }
}

/// dw: Winograd's dU per slice (shared) and each thread's transformed input
/// and output gradient, else the slices' partial sums after the first
/// (shared) and each thread's column matrix.
inline void addCpuConvWeightGradScratch(const ConvGeom &g, int64_t weightElements, ScratchNeed &need,
                                        bool accumulate = false) {
  if (g.N == 0) return;
  if (accumulate) need.addShared<float>(weightElements); // the sum, then added into dw
  if (winogradApplies(g)) {
    const TileGrid grid(g);
    need.addShared<float>(std::min<int64_t>(grid.blocks, kConvWeightGradSlices) * transformedWeightFloats(g));
    need.addPerThread<float>(blockBufferFloats(grid, g.C));
    need.addPerThread<float>(blockBufferFloats(grid, g.F));
    return;
  }
  const int64_t slices = std::min<int64_t>(g.N, kConvWeightGradSlices);
  if (slices > 1) need.addShared<float>((slices - 1) * weightElements);
  if (!g.pointwise) need.addPerThread<float>(columnFloats(g));
}

//===----------------------------------------------------------------------===//
// CUDA: im2col in chunks of samples
//===----------------------------------------------------------------------===//

/// Samples per im2col chunk: the column buffer [samples, C * kSize, P] stays
/// under 128 MiB (at least one sample).
inline int64_t cudaChunkSamples(const ConvGeom &g) {
  constexpr int64_t kBudget = int64_t(1) << 25; // floats
  const int64_t perSample = g.C * g.kSize * g.outSize;
  if (perSample <= 0) return std::max<int64_t>(g.N, 1);
  return std::max<int64_t>(1, std::min<int64_t>(g.N, kBudget / perSample));
}

/// The column buffer of one chunk (every CUDA convolution kernel's only
/// scratch; none for a pointwise convolution, whose columns are x).
inline void addCudaConvScratch(const ConvGeom &g, ScratchNeed &need) {
  if (!g.pointwise) need.addShared<float>(cudaChunkSamples(g) * g.G * columnFloats(g));
}

//===----------------------------------------------------------------------===//
// CUDA: channels-last (NHWC) tensors
//===----------------------------------------------------------------------===//

/// The channels-first shape of a channels-last one, the last axis moved to
/// position 1: an activation [N, d..., C] -> [N, C, d...], a convolution's
/// weight [F, k..., C/G] -> [F, C/G, k...]. Below rank 3 the two agree.
inline Shape channelsFirstShape(const Shape &s) {
  if (s.size < 3) return s;
  Shape t;
  t.push(s.v[0]);
  t.push(s.v[s.size - 1]);
  for (int i = 1; i + 1 < s.size; ++i) t.push(s.v[i]);
  return t;
}

/// A channels-last convolution or pooling call's shape seen channels-first,
/// after checking that the target has channels-last kernels (CUDA only).
inline Shape channelsFirstFor(const char *op, ScratchTarget target, const Shape &s, bool channelsLast) {
  if (!channelsLast) return s;
  if (target != ScratchTarget::Cuda)
    throw KernelError(std::string(op) + ": channels-last tensors exist on the CUDA target only");
  return channelsFirstShape(s);
}

//===----------------------------------------------------------------------===//
// CUDA: a layer norm's parameter gradient
//===----------------------------------------------------------------------===//

/// The most rows one chunk of a layer norm's parameter gradient holds (its
/// rows' statistics sit in the block's shared memory).
constexpr int64_t kCudaLayerNormMaxRowsPerChunk = 256;
// nn.batch_norm and its gradients on CUDA: each channel's N·inner elements
// in chunks of at least kCudaBatchNormMinChunk, a block per (channel,
// chunk), about kCudaBatchNormBlocks blocks in all (at most
// kCudaBatchNormMaxChunks per channel), so that a few wide channels (a
// ResNet's first layers: 64 channels of 32·112·112) still fill the GPU.
constexpr int64_t kCudaBatchNormBlocks = 1024, kCudaBatchNormMinChunk = 4096, kCudaBatchNormMaxChunks = 64;
inline int64_t cudaBatchNormChunks(int64_t channels, int64_t perChannel) {
  if (channels <= 0 || perChannel <= 0) return 1;
  int64_t chunks = (kCudaBatchNormBlocks + channels - 1) / channels;
  const int64_t bySize = (perChannel + kCudaBatchNormMinChunk - 1) / kCudaBatchNormMinChunk;
  if (chunks > bySize) chunks = bySize;
  if (chunks > kCudaBatchNormMaxChunks) chunks = kCudaBatchNormMaxChunks;
  return chunks < 1 ? 1 : chunks;
}
/// The same on channels-last x, `rows` rows of C channels in `tiles` tiles
/// of `tileChannels` channels: a block per (tile, chunk of rows), about
/// kCudaBatchNormBlocks blocks in all, each of at least
/// kCudaBatchNormMinChunk elements and kCudaBatchNormMinChunkRows rows (a
/// chunk writes 4 doubles per channel, which a shorter one would not repay).
/// The summing launch's last block per tile (and, past 32 chunks, per
/// group of chunks first) adds the chunks' partial sums, so many chunks
/// stay cheap: a ResNet's first batch norms (64 channels, one tile, of
/// 32·112·112 rows) take 1,024 blocks of 392 rows.
constexpr int64_t kCudaBatchNormMinChunkRows = 128;
inline int64_t cudaBatchNormRowChunks(int64_t tiles, int64_t tileChannels, int64_t rows) {
  if (tiles <= 0 || tileChannels <= 0 || rows <= 0) return 1;
  int64_t chunks = (kCudaBatchNormBlocks + tiles - 1) / tiles;
  const int64_t minRows = std::max((kCudaBatchNormMinChunk + tileChannels - 1) / tileChannels,
                                   kCudaBatchNormMinChunkRows);
  const int64_t bySize = (rows + minRows - 1) / minRows;
  if (chunks > bySize) chunks = bySize;
  return chunks < 1 ? 1 : chunks;
}

/// Rows per chunk of the parameter gradient's partial column sums: about
/// sqrt(rows), at most kCudaLayerNormMaxRowsPerChunk. A block per (chunk,
/// tile of columns) computes the chunk's row statistics a warp per row,
/// then its warps sum the tile's columns over the chunk's rows; the
/// finishing kernel combines about sqrt(rows) partials per output.
/// (Computing each row's statistics by a block reduction, one row after
/// another, took 0.09-0.2 ms for [4,096, 768] on an H200, docs/gpu-runs.md.)
inline int64_t cudaLayerNormRowsPerChunk(int64_t rows) {
  int64_t r = 1;
  while (r * r < rows) ++r; // ceil(sqrt(rows)), exactly
  return r < kCudaLayerNormMaxRowsPerChunk ? r : kCudaLayerNormMaxRowsPerChunk;
}
inline int64_t cudaLayerNormChunks(int64_t rows) {
  const int64_t perChunk = cudaLayerNormRowsPerChunk(rows);
  return (rows + perChunk - 1) / perChunk;
}

//===----------------------------------------------------------------------===//
// nn.attention: rows of scores per block
//===----------------------------------------------------------------------===//

/// Query rows whose scores one block holds on the CPU (per slice and
/// thread): the S x T scores are never stored whole, only this many rows of
/// them at a time.
inline int64_t attentionRowsPerBlock(int64_t S) { return S < 64 ? S : 64; }
/// The float32 scores one CUDA block may hold, over all L slices at once:
/// 256 MiB. The kernel tests lower it to reach several blocks at small
/// shapes; everything else keeps it (the compiler plans the scratch with it).
inline int64_t &cudaAttentionBlockBytes() {
  static int64_t bytes = int64_t(256) << 20;
  return bytes;
}
/// Query rows per block on CUDA, where every slice's block runs at once:
/// as many multiples of 64 rows as fit cudaAttentionBlockBytes() (at least
/// 64, at most S), so that a context is one block or a few, each a few
/// launches (GPT-2 124M, 12 heads: 4 sequences of 1,024 tokens in one
/// block, 16 in four), rather than one block per 64 rows.
inline int64_t cudaAttentionRowsPerBlock(int64_t L, int64_t S, int64_t T) {
  if (S <= 64) return S;
  const int64_t perRow = (L > 0 ? L : 1) * (T > 0 ? T : 1) * (int64_t)sizeof(float);
  int64_t rows = cudaAttentionBlockBytes() / perRow / 64 * 64;
  if (rows < 64) rows = 64;
  return rows < S ? rows : S;
}

} // namespace pipec::kernels::plan

#endif // PIPEC_KERNELS_KERNEL_PLAN_H
