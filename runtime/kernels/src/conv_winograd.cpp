// 3x3 convolutions with unit strides as Winograd F(2x2, 3x3)
// (docs/cpu-kernels.md, "Convolution"): every 2x2 output tile is
// A^T [(G g G^T) . (B^T d B)] A for its 4x4 input patch d, so the 9 * C
// multiply-adds per output of im2col + GEMM become 16 * C per four outputs,
// done as 16 GEMMs [F, C] x [C, tiles], one per position of the 4x4
// transformed tile. The weight gradient is the adjoint of the same
// factorization: dU = (A dY A^T) x V^T per position, then dW = G^T dU G.
#include "detail.h"
#include "kernel_plan.h"

#include <algorithm>
#include <cstring>

namespace pipec::kernels::detail {

namespace {

using plan::blockBufferFloats;
using plan::kConvWeightGradSlices;
using plan::kPositions;
using plan::positionStride;
using plan::TileGrid;
using plan::transformedWeightFloats;

/// A thread's buffers for one block: the transformed operand [16, channels,
/// tiles] and the few rows of image the transforms pad or crop.
struct BlockBuffers {
  int64_t channels;
  float *positions, *rows;
  BlockBuffers(Scratch::Thread &scratch, const TileGrid &grid, int64_t channels) : channels(channels) {
    positions = scratch.take<float>(blockBufferFloats(grid, channels));
    rows = positions + kPositions * positionStride(channels * grid.maxTiles());
  }
  /// The distance between two positions' [channels, tiles] matrices.
  int64_t stride(int64_t tiles) const { return positionStride(channels * tiles); }
  /// Position p's [channels, tiles] matrix.
  float *matrix(int64_t p, int64_t tiles) const { return positions + p * stride(tiles); }
};

/// Splits input row ih of one channel plane into its even and odd columns
/// of the padded image (column j - pb of the image at padded column j,
/// zeros outside it): even[j] = padded[2j], odd[j] = padded[2j + 1], for
/// j in [0, TW], so that a tile's four columns are even[t], odd[t],
/// even[t + 1], odd[t + 1] and the transform's loop over tiles reads
/// consecutive floats. `padded` holds 2 TW + 2 floats.
inline void splitInputRow(const ConvGeom &g, const float *plane, int64_t ih, int64_t TW, float *padded,
                          float *__restrict even, float *__restrict odd) {
  const int64_t width = 2 * TW + 2, W = g.in[1], pb = g.pb[1];
  if (ih < 0 || ih >= g.in[0]) {
    std::fill(even, even + TW + 1, 0.0f);
    std::fill(odd, odd + TW + 1, 0.0f);
    return;
  }
  const int64_t lo = std::clamp<int64_t>(pb, 0, width), hi = std::clamp<int64_t>(W + pb, lo, width);
  std::fill(padded, padded + lo, 0.0f);
  std::memcpy(padded + lo, plane + ih * W + (lo - pb), (size_t)(hi - lo) * sizeof(float));
  std::fill(padded + hi, padded + width, 0.0f);
  for (int64_t j = 0; j <= TW; ++j) {
    even[j] = padded[2 * j];
    odd[j] = padded[2 * j + 1];
  }
}

/// One row of tiles of transformInput, from the even and odd columns of its
/// four input rows (splitInputRow); out[pos * posStride + t].
inline void transformInputRow(const float *__restrict e0, const float *__restrict e1, const float *__restrict e2,
                              const float *__restrict e3, const float *__restrict o0, const float *__restrict o1,
                              const float *__restrict o2, const float *__restrict o3, float *__restrict out,
                              int64_t posStride, int64_t TW) {
  // The 16 streams are disjoint: without ivdep GCC gives up on the alias
  // checks between them and leaves the loop scalar (5 times slower).
#pragma GCC ivdep
  for (int64_t t = 0; t < TW; ++t) {
    // B^T along the rows of the patch, column by column
    const float a00 = e0[t] - e2[t], a01 = o0[t] - o2[t], a02 = e0[t + 1] - e2[t + 1], a03 = o0[t + 1] - o2[t + 1];
    const float a10 = e1[t] + e2[t], a11 = o1[t] + o2[t], a12 = e1[t + 1] + e2[t + 1], a13 = o1[t + 1] + o2[t + 1];
    const float a20 = e2[t] - e1[t], a21 = o2[t] - o1[t], a22 = e2[t + 1] - e1[t + 1], a23 = o2[t + 1] - o1[t + 1];
    const float a30 = e1[t] - e3[t], a31 = o1[t] - o3[t], a32 = e1[t + 1] - e3[t + 1], a33 = o1[t + 1] - o3[t + 1];
    // then B along each row
    out[0 * posStride + t] = a00 - a02;
    out[1 * posStride + t] = a01 + a02;
    out[2 * posStride + t] = a02 - a01;
    out[3 * posStride + t] = a01 - a03;
    out[4 * posStride + t] = a10 - a12;
    out[5 * posStride + t] = a11 + a12;
    out[6 * posStride + t] = a12 - a11;
    out[7 * posStride + t] = a11 - a13;
    out[8 * posStride + t] = a20 - a22;
    out[9 * posStride + t] = a21 + a22;
    out[10 * posStride + t] = a22 - a21;
    out[11 * posStride + t] = a21 - a23;
    out[12 * posStride + t] = a30 - a32;
    out[13 * posStride + t] = a31 + a32;
    out[14 * posStride + t] = a32 - a31;
    out[15 * posStride + t] = a31 - a33;
  }
}

/// V[pos, c, t] = (B^T d B)[pos] for the block's tiles t and the channels
/// [0, C) of x (a sample's planes are C consecutive in[0] x in[1] images).
/// B^T = [[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]].
void transformInput(const ConvGeom &g, const TileGrid &grid, int64_t block, const float *x, const BlockBuffers &buf) {
  const int64_t C = g.C, TW = grid.TW, tiles = grid.tiles(block), posStride = buf.stride(tiles);
  float *V = buf.positions;
  withWidestVectors(
      [&](int64_t cBegin, int64_t cEnd) {
        float *even[4], *odd[4];
        for (int i = 0; i < 4; ++i) {
          even[i] = buf.rows + (2 * i) * (TW + 1);
          odd[i] = buf.rows + (2 * i + 1) * (TW + 1);
        }
        float *padded = buf.rows + 8 * (TW + 1);
        for (int64_t c = cBegin; c < cEnd; ++c)
          for (int64_t row = grid.firstRow(block); row < grid.endRow(block); ++row) {
            const int64_t n = row / grid.TH, th = row % grid.TH;
            const float *plane = x + (n * C + c) * g.inSize;
            for (int i = 0; i < 4; ++i) splitInputRow(g, plane, 2 * th - g.pb[0] + i, TW, padded, even[i], odd[i]);
            transformInputRow(even[0], even[1], even[2], even[3], odd[0], odd[1], odd[2], odd[3],
                              V + c * tiles + (row - grid.firstRow(block)) * TW, posStride, TW);
          }
      },
      0, C);
}

/// U[pos, f, c] = (G w[f, c] G^T)[pos], G = [[1, 0, 0], [1/2, 1/2, 1/2],
/// [1/2, -1/2, 1/2], [0, 0, 1]].
void transformWeights(const float *w, int64_t F, int64_t C, float *U) {
  const int64_t posStride = positionStride(F * C);
  for (int64_t fc = 0; fc < F * C; ++fc) {
    const float *k = w + fc * 9;
    float a[4][3];
    for (int j = 0; j < 3; ++j) {
      a[0][j] = k[j];
      a[1][j] = 0.5f * (k[j] + k[3 + j] + k[6 + j]);
      a[2][j] = 0.5f * (k[j] - k[3 + j] + k[6 + j]);
      a[3][j] = k[6 + j];
    }
    for (int i = 0; i < 4; ++i) {
      U[(i * 4 + 0) * posStride + fc] = a[i][0];
      U[(i * 4 + 1) * posStride + fc] = 0.5f * (a[i][0] + a[i][1] + a[i][2]);
      U[(i * 4 + 2) * posStride + fc] = 0.5f * (a[i][0] - a[i][1] + a[i][2]);
      U[(i * 4 + 3) * posStride + fc] = a[i][2];
    }
  }
}

/// y tiles from M[pos, f, t]: A^T m A (+ bias), A^T = [[1, 1, 1, 0],
/// [0, 1, -1, -1]]; a tile's second row or column past the output's odd
/// edge is dropped.
void transformOutput(const ConvGeom &g, const TileGrid &grid, int64_t block, const BlockBuffers &buf,
                     const float *bias, float *y) {
  const int64_t TW = grid.TW, tiles = grid.tiles(block), F = g.F, posStride = buf.stride(tiles);
  const int64_t OH = g.out[0], OW = g.out[1];
  const float *M = buf.positions;
  withWidestVectors(
      [&](int64_t fBegin, int64_t fEnd) {
        float *out[2] = {buf.rows, buf.rows + 2 * TW};
        for (int64_t f = fBegin; f < fEnd; ++f) {
          const float b = bias ? bias[f] : 0.0f;
          for (int64_t row = grid.firstRow(block); row < grid.endRow(block); ++row) {
            const int64_t n = row / grid.TH, th = row % grid.TH;
            const float *in = M + f * tiles + (row - grid.firstRow(block)) * TW;
#pragma GCC ivdep // the streams are disjoint (transformInputRow)
            for (int64_t t = 0; t < TW; ++t) {
              float m[4][4];
              for (int i = 0; i < 4; ++i)
                for (int j = 0; j < 4; ++j) m[i][j] = in[(i * 4 + j) * posStride + t];
              float s[2][4];
              for (int j = 0; j < 4; ++j) {
                s[0][j] = m[0][j] + m[1][j] + m[2][j];
                s[1][j] = m[1][j] - m[2][j] - m[3][j];
              }
              for (int i = 0; i < 2; ++i) {
                out[i][2 * t] = s[i][0] + s[i][1] + s[i][2] + b;
                out[i][2 * t + 1] = s[i][1] - s[i][2] - s[i][3] + b;
              }
            }
            float *plane = y + (n * F + f) * g.outSize;
            for (int i = 0; i < 2 && 2 * th + i < OH; ++i)
              std::memcpy(plane + (2 * th + i) * OW, out[i], (size_t)OW * sizeof(float));
          }
        }
      },
      0, F);
}

/// dM[pos, f, t] = (A dy A^T)[pos] for the block's tiles (dy is zero past
/// the output's odd edge): the adjoint of transformOutput.
void transformOutputGrad(const ConvGeom &g, const TileGrid &grid, int64_t block, const float *dy,
                         const BlockBuffers &buf) {
  const int64_t TW = grid.TW, tiles = grid.tiles(block), F = g.F, posStride = buf.stride(tiles);
  const int64_t OH = g.out[0], OW = g.out[1];
  float *dM = buf.positions;
  withWidestVectors(
      [&](int64_t fBegin, int64_t fEnd) {
        float *r[2] = {buf.rows, buf.rows + 2 * TW};
        for (int64_t f = fBegin; f < fEnd; ++f)
          for (int64_t row = grid.firstRow(block); row < grid.endRow(block); ++row) {
            const int64_t n = row / grid.TH, th = row % grid.TH;
            const float *plane = dy + (n * F + f) * g.outSize;
            for (int i = 0; i < 2; ++i) {
              if (2 * th + i < OH)
                std::memcpy(r[i], plane + (2 * th + i) * OW, (size_t)OW * sizeof(float));
              else
                std::fill(r[i], r[i] + OW, 0.0f);
              std::fill(r[i] + OW, r[i] + 2 * TW, 0.0f);
            }
            float *out = dM + f * tiles + (row - grid.firstRow(block)) * TW;
#pragma GCC ivdep // the streams are disjoint (transformInputRow)
            for (int64_t t = 0; t < TW; ++t) {
              float e[2][4]; // A applied along the columns: (y0, y0 + y1, y0 - y1, -y1)
              for (int i = 0; i < 2; ++i) {
                const float y0 = r[i][2 * t], y1 = r[i][2 * t + 1];
                e[i][0] = y0;
                e[i][1] = y0 + y1;
                e[i][2] = y0 - y1;
                e[i][3] = -y1;
              }
              for (int j = 0; j < 4; ++j) {
                out[(0 * 4 + j) * posStride + t] = e[0][j];
                out[(1 * 4 + j) * posStride + t] = e[0][j] + e[1][j];
                out[(2 * 4 + j) * posStride + t] = e[0][j] - e[1][j];
                out[(3 * 4 + j) * posStride + t] = -e[1][j];
              }
            }
          }
      },
      0, F);
}

/// dw[f, c] = G^T dU[., f, c] G: the adjoint of transformWeights.
void transformWeightGrad(const float *dU, int64_t F, int64_t C, float *dw) {
  const int64_t posStride = positionStride(F * C);
  for (int64_t fc = 0; fc < F * C; ++fc) {
    float u[4][4];
    for (int p = 0; p < kPositions; ++p) u[p / 4][p % 4] = dU[p * posStride + fc];
    float a[3][4]; // G^T along the rows
    for (int j = 0; j < 4; ++j) {
      a[0][j] = u[0][j] + 0.5f * (u[1][j] + u[2][j]);
      a[1][j] = 0.5f * (u[1][j] - u[2][j]);
      a[2][j] = 0.5f * (u[1][j] + u[2][j]) + u[3][j];
    }
    float *k = dw + fc * 9;
    for (int i = 0; i < 3; ++i) {
      k[i * 3 + 0] = a[i][0] + 0.5f * (a[i][1] + a[i][2]);
      k[i * 3 + 1] = 0.5f * (a[i][1] - a[i][2]);
      k[i * 3 + 2] = 0.5f * (a[i][1] + a[i][2]) + a[i][3];
    }
  }
}

/// The work parallelRanges weighs for the 16 GEMMs over all tiles.
int64_t winogradWork(const ConvGeom &g, const TileGrid &grid) {
  return gemmWork(kPositions * g.F, grid.rows * grid.TW, g.C);
}

} // namespace

void winogradConv(const ConvGeom &g, const float *x, const float *w, const float *bias, float *y, Scratch &scratch) {
  const TileGrid grid(g);
  const int64_t uStride = positionStride(g.F * g.C);
  float *U = scratch.shared<float>(transformedWeightFloats(g)); // read by every thread
  transformWeights(w, g.F, g.C, U);
  parallelRanges(grid.blocks, winogradWork(g, grid), [&](int64_t bBegin, int64_t bEnd) {
    Scratch::Thread mine = scratch.thread();
    const BlockBuffers V(mine, grid, g.C), M(mine, grid, g.F);
    for (int64_t b = bBegin; b < bEnd; ++b) {
      const int64_t tiles = grid.tiles(b);
      transformInput(g, grid, b, x, V);
      for (int64_t p = 0; p < kPositions; ++p)
        sgemm(false, false, g.F, tiles, g.C, 1.0f, U + p * uStride, g.C, V.matrix(p, tiles), tiles, 0.0f,
              M.matrix(p, tiles), tiles);
      transformOutput(g, grid, b, M, bias, y);
    }
  });
}

void winogradWeightGrad(const ConvGeom &g, const float *dy, const float *x, float *dw, Scratch &scratch) {
  const TileGrid grid(g);
  const int64_t uStride = positionStride(g.F * g.C), uSize = kPositions * uStride;
  // dU sums over every tile, so, as in convWeightGrad, over a number of
  // slices of blocks fixed by the shape, each summed by one thread and added
  // in slice order: the bits do not depend on the thread count.
  const int64_t slices = std::min<int64_t>(grid.blocks, kConvWeightGradSlices);
  float *dU = scratch.shared<float>(slices * uSize); // one per slice
  parallelRanges(slices, winogradWork(g, grid), [&](int64_t sBegin, int64_t sEnd) {
    Scratch::Thread mine = scratch.thread();
    const BlockBuffers V(mine, grid, g.C), dM(mine, grid, g.F);
    for (int64_t s = sBegin; s < sEnd; ++s) {
      const int64_t bBegin = grid.blocks * s / slices, bEnd = grid.blocks * (s + 1) / slices;
      for (int64_t b = bBegin; b < bEnd; ++b) {
        const int64_t tiles = grid.tiles(b);
        transformInput(g, grid, b, x, V);
        transformOutputGrad(g, grid, b, dy, dM);
        for (int64_t p = 0; p < kPositions; ++p)
          sgemm(false, true, g.F, g.C, tiles, 1.0f, dM.matrix(p, tiles), tiles, V.matrix(p, tiles), tiles,
                b == bBegin ? 0.0f : 1.0f, dU + s * uSize + p * uStride, g.C);
      }
    }
  });
  addSlicesInOrder(dU, dU + uSize, slices, uSize);
  transformWeightGrad(dU, g.F, g.C, dw);
}

} // namespace pipec::kernels::detail
