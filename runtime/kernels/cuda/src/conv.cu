// N-d convolution with groups, strides, pads and dilations: cuDNN's
// convolution graphs where they take the call (conv_cudnn.cuh: the TF32 and
// BF16 precisions), else im2col + cuBLAS GEMMs (batched over samples or
// groups), col2im as a gather (each input element sums its own
// contributions: no atomics, deterministic), weight gradient accumulated
// over samples with beta = 1 GEMMs. Channels-last (NHWC) calls give cuDNN
// the tensors as they lie; where it declines, the channels-first kernels
// run on channels-first float32 copies (tiled transposes in and out). A
// forward's epilogue, y = f(conv + bias + residual), is cuDNN's graph's
// where it can; what is left, one kernel's (applyEpilogue).
#include "conv_cudnn.cuh"
#include "gemm.cuh"
#include "kernel_plan.h"
#include "nn_common.cuh"

#include <algorithm>
#include <type_traits>

namespace pipec::kernels::cuda {

namespace {

using namespace nn;

using kernels::ConvGeom;
using kernels::convGeom;
using kernels::convOut;

using plan::channelsFirstShape;
using plan::cudaChunkSamples;

/// col[s, c * kSize + kk, o] = x[s, c, o * stride - pad + kidx * dilation]
/// (0 in the padding) for `samples` samples of all C channels: each group's
/// rows [Cg * kSize, P] are contiguous, group after group.
__global__ void im2colKernel(ConvGeom g, const float *x, float *col, int64_t samples) {
  const int64_t P = g.outSize, rows = g.C * g.kSize, total = samples * rows * P;
  for (int64_t i = firstIndex(); i < total; i += gridStride()) {
    const int64_t o = i % P, t = i / P, kk = t % g.kSize, sc = t / g.kSize; // sc = s * C + c
    int64_t ro = o, rk = kk, off = 0, str = 1;
    bool valid = true;
    for (int a = g.sp - 1; a >= 0; --a) {
      const int64_t oa = ro % g.out[a], ka = rk % g.k[a];
      ro /= g.out[a];
      rk /= g.k[a];
      const int64_t p = oa * g.s[a] - g.pb[a] + ka * g.d[a];
      if (p < 0 || p >= g.in[a]) valid = false;
      off += p * str;
      str *= g.in[a];
    }
    col[i] = valid ? x[sc * g.inSize + off] : 0.0f;
  }
}

/// The adjoint of im2col as a gather: dx[s, c, q] = Σ over kernel positions
/// kk (row-major, the CPU kernel's order) of col[s, c * kSize + kk, o] for
/// the output position o, if any, whose window puts kk on q.
__global__ void col2imKernel(ConvGeom g, const float *col, float *dx, int64_t samples) {
  const int64_t P = g.outSize, total = samples * g.C * g.inSize;
  for (int64_t i = firstIndex(); i < total; i += gridStride()) {
    const int64_t q = i % g.inSize, sc = i / g.inSize;
    int64_t pos[kMaxRank];
    {
      int64_t rq = q;
      for (int a = g.sp - 1; a >= 0; --a) {
        pos[a] = rq % g.in[a];
        rq /= g.in[a];
      }
    }
    const float *colRows = col + sc * g.kSize * P;
    float sum = 0.0f;
    for (int64_t kk = 0; kk < g.kSize; ++kk) {
      int64_t rk = kk, o = 0, str = 1;
      bool valid = true;
      for (int a = g.sp - 1; a >= 0; --a) {
        const int64_t ka = rk % g.k[a];
        rk /= g.k[a];
        const int64_t t = pos[a] + g.pb[a] - ka * g.d[a]; // = oa * s
        const int64_t oa = t / g.s[a];
        if (t < 0 || oa * g.s[a] != t || oa >= g.out[a]) {
          valid = false;
          break;
        }
        o += oa * str;
        str *= g.out[a];
      }
      if (valid) sum += colRows[kk * P + o];
    }
    dx[i] = sum;
  }
}

using dnn::ConvEpilogue;

/// y[n, f, p] = act(y[n, f, p] + bias[f] + residual[n, f, p]) in float,
/// rounded once to T (channels-last y [n, p, f]: P = 1); bias and residual
/// may be null.
template <class T>
__global__ void epilogueKernel(T *y, const float *bias, const T *residual, EpilogueActivation act, int64_t total,
                               int64_t F, int64_t P) {
  for (int64_t i = firstIndex(); i < total; i += gridStride()) {
    float v = toF(y[i]);
    if (bias) v += bias[(i / P) % F];
    if (residual) v += toF(residual[i]);
    y[i] = fromF<T>(epilogueActivationValue(act, v));
  }
}

/// What is left of a forward's epilogue (cuDNN's graph clears what it
/// applied), in one pass over y; nothing to launch when nothing is left.
template <class T>
void applyEpilogue(const char *op, T *y, const ConvEpilogue<T> &e, const ConvGeom &g, bool channelsLast) {
  const int64_t total = g.N * g.F * g.outSize;
  if (e.empty() || total == 0) return;
  epilogueKernel<T><<<detail::blocksFor(total), detail::kThreads, 0, detail::stream()>>>(
      y, e.bias, e.residual, e.activation, total, g.F, channelsLast ? 1 : g.outSize);
  detail::checkLaunch(op);
}

/// A forward's epilogue from the public arguments (KernelError for an
/// activation it does not apply).
template <class T>
ConvEpilogue<T> epilogueOf(const char *op, const float *bias, const T *residual, std::optional<Unary> activation) {
  return ConvEpilogue<T>{bias, residual, epilogueActivation(op, activation)};
}

/// out[b, s, r] = in[b, r, s] for a batch of B matrices [R, S], widened or
/// rounded to To, or with accumulate (To float) added into out: through
/// shared-memory tiles of kTile x kTile, so that a warp reads kTile
/// consecutive elements of an input row and writes kTile of an output row
/// (moving a convolution's operands between channels-last and -first).
constexpr int kTile = 32, kTileRows = 8;
template <class From, class To>
__global__ void __launch_bounds__(kTile *kTileRows)
    transposeKernel(const From *in, To *out, int64_t R, int64_t S, int64_t tilesR, int64_t tilesS, int64_t tiles,
                    bool accumulate) {
  __shared__ float tile[kTile][kTile + 1]; // +1: a column's reads fall in distinct banks
  const int lane = (int)threadIdx.x % kTile, row = (int)threadIdx.x / kTile;
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const int64_t b = t / (tilesR * tilesS), rest = t - b * tilesR * tilesS;
    const int64_t r0 = rest / tilesS * kTile, s0 = rest % tilesS * kTile;
    const From *inb = in + b * R * S;
    To *outb = out + b * R * S;
    for (int i = row; i < kTile; i += kTileRows)
      if (r0 + i < R && s0 + lane < S) tile[i][lane] = toF(inb[(r0 + i) * S + s0 + lane]);
    __syncthreads();
    for (int i = row; i < kTile; i += kTileRows)
      if (s0 + i < S && r0 + lane < R) {
        To *at = outb + (s0 + i) * R + r0 + lane;
        const float v = tile[lane][i];
        if constexpr (std::is_same_v<To, float>)
          *at = accumulate ? *at + v : v;
        else
          *at = fromF<To>(v);
      }
    __syncthreads(); // the tile is read before the next one is written
  }
}

template <class From, class To>
void transposeBatch(const char *op, const From *in, To *out, int64_t B, int64_t R, int64_t S, bool accumulate) {
  const int64_t tilesR = (R + kTile - 1) / kTile, tilesS = (S + kTile - 1) / kTile, tiles = B * tilesR * tilesS;
  if (tiles == 0) return;
  transposeKernel<From, To><<<segmentBlocks(tiles), kTile * kTileRows, 0, detail::stream()>>>(
      in, out, R, S, tilesR, tilesS, tiles, accumulate);
  detail::checkLaunch(op);
}

/// dw = float(from), or dw += float(from) with accumulate: a weight
/// gradient cuDNN wrote in bf16, into its float32 buffer.
__global__ void widenKernel(const bf16 *from, int64_t n, float *dw, bool accumulate) {
  for (int64_t i = firstIndex(); i < n; i += gridStride())
    dw[i] = accumulate ? dw[i] + (float)from[i] : (float)from[i];
}

/// A bf16 call's tensors as float32, for the calls cuDNN declines: copies
/// in kernel scratch slot 1 (slot 0 is the float call's own), widened on
/// the way in and rounded once on the way out (docs/cuda-kernels.md,
/// "bf16 storage"). A channels-last call's (float or bf16) the same way,
/// moved to channels-first on the way in and back on the way out: the
/// channels-first call then plans its scratch as it always does.
class WidenedCopies {
public:
  explicit WidenedCopies(std::initializer_list<int64_t> counts) {
    int64_t bytes = 0;
    for (int64_t n : counts) bytes += ScratchNeed::alignedScratchBytes(n * (int64_t)sizeof(float));
    next_ = static_cast<char *>(detail::scratch(1, (size_t)bytes));
  }
  /// A float copy of the n values at `from`, or (from null) room for n.
  float *take(const bf16 *from, int64_t n) {
    float *copy = reinterpret_cast<float *>(next_);
    next_ += ScratchNeed::alignedScratchBytes(n * (int64_t)sizeof(float));
    if (from && n > 0) cast<bf16, float>(from, n, copy);
    return copy;
  }
  /// to = bf16(from) over n values.
  void round(const float *from, int64_t n, bf16 *to) {
    if (n > 0) cast<float, bf16>(from, n, to);
  }
  /// A float channels-first copy [batch, channels, positions] of the
  /// channels-last [batch, positions, channels] at `from`.
  template <class T>
  float *takeChannelsFirst(const char *op, const T *from, int64_t batch, int64_t positions, int64_t channels) {
    float *copy = take(static_cast<const bf16 *>(nullptr), batch * positions * channels);
    transposeBatch(op, from, copy, batch, positions, channels, false);
    return copy;
  }
  /// to [batch, positions, channels] = from [batch, channels, positions],
  /// rounded to T; with accumulate (T float) added into `to`.
  template <class T>
  void putChannelsLast(const char *op, const float *from, int64_t batch, int64_t channels, int64_t positions, T *to,
                       bool accumulate = false) {
    transposeBatch(op, from, to, batch, channels, positions, accumulate);
  }

private:
  char *next_ = nullptr;
};

/// The group GEMMs of `samples` samples: for every (s, g),
/// C(s,g) = op(A(g)) op(B(s,g)), where X(s,g) = X.base + s * X.sample + g * X.group
/// (A has no sample stride). Batched over groups (one call per sample) or
/// over samples (one call per group), whichever makes fewer calls.
struct Operand {
  const float *base;
  int64_t ld, sample, group;
};
void groupGemms(const char *op, bool transA, bool transB, int64_t M, int64_t N, int64_t K, Operand A,
                Operand B, float *Cbase, int64_t ldc, int64_t cSample, int64_t cGroup, int64_t samples,
                int64_t groups) {
  if (groups <= samples && groups > 1) {
    for (int64_t gi = 0; gi < groups; ++gi)
      sgemmStridedBatched(op, transA, transB, M, N, K, 1.0f, A.base + gi * A.group, A.ld, 0,
                          B.base + gi * B.group, B.ld, B.sample, 0.0f, Cbase + gi * cGroup, ldc, cSample,
                          samples);
    return;
  }
  if (groups == 1) {
    sgemmStridedBatched(op, transA, transB, M, N, K, 1.0f, A.base, A.ld, 0, B.base, B.ld, B.sample, 0.0f, Cbase,
                        ldc, cSample, samples);
    return;
  }
  for (int64_t s = 0; s < samples; ++s)
    sgemmStridedBatched(op, transA, transB, M, N, K, 1.0f, A.base, A.ld, A.group, B.base + s * B.sample, B.ld,
                        B.group, 0.0f, Cbase + s * cSample, ldc, cGroup, groups);
}

/// A call's im2col columns: chunks of `chunk` samples in the call's scratch,
/// `col` their buffer (null for a pointwise convolution, whose columns are x).
struct ColumnBuffer {
  ColumnBuffer(const char *op, const ConvGeom &g, const Workspace &workspace)
      : chunk(g.pointwise ? g.N : cudaChunkSamples(g)), scratch(op, workspace, need(g)),
        col(g.pointwise ? nullptr : scratch.shared<float>(chunk * g.G * g.Cg * g.kSize * g.outSize)) {}
  static ScratchNeed need(const ConvGeom &g) {
    ScratchNeed need;
    plan::addCudaConvScratch(g, need);
    return need;
  }
  int64_t chunk;
  Scratch scratch;
  float *col;
};

/// The geometry of a gradient call, dy's shape checked against it.
ConvGeom gradientGeom(const char *op, const Shape &xs, const Shape &ws, const Shape &dys, const Dims &strides,
                      const Dims &pads, const Dims &dilations, int64_t group) {
  const ConvGeom g = convGeom(op, xs, ws, strides, pads, dilations, group);
  if (convOut(g) != dys) fail(op, "dy " + dys.str() + " is not the conv result shape " + convOut(g).str());
  return g;
}

void im2col(const char *op, const ConvGeom &g, const float *x, float *col, int64_t samples) {
  const int64_t total = samples * g.C * g.kSize * g.outSize;
  if (total <= 0) return;
  im2colKernel<<<detail::blocksFor(total), detail::kThreads, 0, detail::stream()>>>(g, x, col, samples);
  detail::checkLaunch(op);
}

} // namespace

//===----------------------------------------------------------------------===//
// nn.conv, nn.conv_input_grad, nn.conv_weight_grad
//===----------------------------------------------------------------------===//

namespace {

/// The channels-first float forward with its epilogue: cuDNN's graph, else
/// im2col + GEMMs; then what is left of the epilogue.
void convFirst(const float *x, const Shape &xs, const float *w, const Shape &ws, ConvEpilogue<float> epilogue,
               float *y, const Dims &strides, const Dims &pads, const Dims &dilations, int64_t group,
               const Workspace &workspace) {
  const char *op = "nn.conv";
  const ConvGeom g = convGeom(op, xs, ws, strides, pads, dilations, group);
  const int64_t rows = g.Cg * g.kSize, P = g.outSize;
  if (g.N == 0 || g.F == 0) return;
  if (!dnn::conv(x, w, epilogue, y, g, workspace, false)) {
    ColumnBuffer columns(op, g, workspace);
    const int64_t chunk = columns.chunk;
    float *col = columns.col;
    for (int64_t n0 = 0; n0 < g.N; n0 += chunk) {
      const int64_t samples = std::min(chunk, g.N - n0);
      const float *cols = x + n0 * g.C * g.inSize; // pointwise: the columns are x
      if (!g.pointwise) {
        im2col(op, g, cols, col, samples);
        cols = col;
      }
      // y_(s,g) [Fg, P] = W_g [Fg, rows] col_(s,g) [rows, P]
      groupGemms(op, false, false, g.Fg, P, rows, Operand{w, rows, 0, g.Fg * rows},
                 Operand{cols, P, g.G * rows * P, rows * P}, y + n0 * g.F * P, P, g.F * P, g.Fg * P, samples, g.G);
    }
  }
  applyEpilogue(op, y, epilogue, g, /*channelsLast=*/false); // what cuDNN's graph did not apply
}

} // namespace

void conv(const float *x, const Shape &xs, const float *w, const Shape &ws, const float *bias, float *y,
          const Dims &strides, const Dims &pads, const Dims &dilations, int64_t group,
          const Workspace &workspace) {
  convFirst(x, xs, w, ws, ConvEpilogue<float>{bias}, y, strides, pads, dilations, group, workspace);
}

void convInputGrad(const float *dy, const Shape &dys, const float *w, const Shape &ws, float *dx, const Shape &xs,
                   const Dims &strides, const Dims &pads, const Dims &dilations, int64_t group,
          const Workspace &workspace) {
  const char *op = "nn.conv_input_grad";
  const ConvGeom g = gradientGeom(op, xs, ws, dys, strides, pads, dilations, group);
  const int64_t rows = g.Cg * g.kSize, P = g.outSize;
  if (g.N == 0 || g.C == 0 || g.inSize == 0 || dnn::convInputGrad(dy, w, dx, g, workspace, false)) return;
  ColumnBuffer columns(op, g, workspace);
  const int64_t chunk = columns.chunk;
  float *col = columns.col;
  for (int64_t n0 = 0; n0 < g.N; n0 += chunk) {
    const int64_t samples = std::min(chunk, g.N - n0);
    float *dxChunk = dx + n0 * g.C * g.inSize;
    // dcol_(s,g) [rows, P] = W_g^T [rows, Fg] dy_(s,g) [Fg, P]; pointwise: dx itself
    float *dcol = g.pointwise ? dxChunk : col;
    groupGemms(op, true, false, rows, P, g.Fg, Operand{w, rows, 0, g.Fg * rows},
               Operand{dy + n0 * g.F * P, P, g.F * P, g.Fg * P}, dcol, P, g.G * rows * P, rows * P, samples, g.G);
    if (!g.pointwise) {
      const int64_t total = samples * g.C * g.inSize;
      col2imKernel<<<detail::blocksFor(total), detail::kThreads, 0, detail::stream()>>>(g, dcol, dxChunk,
                                                                                        samples);
      detail::checkLaunch(op);
    }
  }
}

void convWeightGrad(const float *dy, const Shape &dys, const float *x, const Shape &xs, float *dw, const Shape &ws,
                    const Dims &strides, const Dims &pads, const Dims &dilations, int64_t group,
                    const Workspace &workspace, bool accumulate) {
  const char *op = "nn.conv_weight_grad";
  const ConvGeom g = gradientGeom(op, xs, ws, dys, strides, pads, dilations, group);
  const int64_t rows = g.Cg * g.kSize, P = g.outSize;
  if (ws.numel() == 0 || (g.N == 0 && accumulate)) return; // accumulate: adding a sum of nothing
  if (accumulate) { // the sum in kernel scratch slot 1, then added into dw (the CPU kernel's bits)
    float *sum = static_cast<float *>(detail::scratch(1, (size_t)ws.numel() * sizeof(float)));
    convWeightGrad(dy, dys, x, xs, sum, ws, strides, pads, dilations, group, workspace, false);
    cuda::accumulate(dw, sum, ws.numel());
    return;
  }
  if (g.N == 0) {
    detail::check(cudaMemsetAsync(dw, 0, (size_t)ws.numel() * sizeof(float), detail::stream()), op);
    return;
  }
  if (dnn::convWeightGrad(dy, x, dw, g, workspace, false)) return;
  ColumnBuffer columns(op, g, workspace);
  const int64_t chunk = columns.chunk;
  float *col = columns.col;
  for (int64_t n0 = 0; n0 < g.N; n0 += chunk) {
    const int64_t samples = std::min(chunk, g.N - n0);
    const float *cols = x + n0 * g.C * g.inSize;
    if (!g.pointwise) {
      im2col(op, g, cols, col, samples);
      cols = col;
    }
    // dW_g [Fg, rows] (+)= dy_(n,g) [Fg, P] col_(n,g)^T [P, rows]: batched over
    // groups (distinct outputs), samples in order with beta = 1 after the first.
    for (int64_t s = 0; s < samples; ++s) {
      const int64_t n = n0 + s;
      sgemmStridedBatched(op, false, true, g.Fg, rows, P, 1.0f, dy + n * g.F * P, P, g.Fg * P,
                          cols + s * g.G * rows * P, P, rows * P, n == 0 ? 0.0f : 1.0f, dw, rows, g.Fg * rows, g.G);
    }
  }
}

//===----------------------------------------------------------------------===//
// Channels-last: x, y [N, d..., C], w [F, k..., C/G] (either storage)
//===----------------------------------------------------------------------===//

namespace {

/// The channels-first shapes of a channels-last call: x, w and y (or dy).
struct ChannelsFirst {
  Shape x, w, y;
  ChannelsFirst(const Shape &xs, const Shape &ws, const Shape &ys)
      : x(channelsFirstShape(xs)), w(channelsFirstShape(ws)), y(channelsFirstShape(ys)) {}
};

/// cuDNN's graph on the tensors as they lie, then what is left of the
/// epilogue; else the channels-first call with the whole epilogue on float32
/// channels-first copies (WidenedCopies: the residual's too), y moved back
/// (rounded once).
template <class T>
void convChannelsLast(const T *x, const Shape &xs, const T *w, const Shape &ws, ConvEpilogue<T> epilogue, T *y,
                      const Dims &strides, const Dims &pads, const Dims &dilations, int64_t group,
                      const Workspace &workspace) {
  const char *op = "nn.conv";
  const ChannelsFirst cf(xs, ws, Shape{});
  const ConvGeom g = convGeom(op, cf.x, cf.w, strides, pads, dilations, group);
  if (g.N == 0 || g.F == 0) return;
  if (dnn::conv(x, w, epilogue, y, g, workspace, /*channelsLast=*/true)) {
    applyEpilogue(op, y, epilogue, g, /*channelsLast=*/true); // what cuDNN's graph did not apply
    return;
  }
  const int64_t yCount = g.N * g.F * g.outSize;
  WidenedCopies copies({xs.numel(), ws.numel(), yCount, epilogue.residual ? yCount : 0});
  const float *xc = copies.takeChannelsFirst(op, x, g.N, g.inSize, g.C);
  const float *wc = copies.takeChannelsFirst(op, w, g.F, g.kSize, g.Cg);
  float *yc = copies.take(nullptr, yCount);
  const float *rc = epilogue.residual ? copies.takeChannelsFirst(op, epilogue.residual, g.N, g.outSize, g.F) : nullptr;
  convFirst(xc, cf.x, wc, cf.w, ConvEpilogue<float>{epilogue.bias, rc, epilogue.activation}, yc, strides, pads,
            dilations, group, workspace);
  copies.putChannelsLast(op, yc, g.N, g.F, g.outSize, y);
}

template <class T>
void convInputGradChannelsLast(const T *dy, const Shape &dys, const T *w, const Shape &ws, T *dx, const Shape &xs,
                               const Dims &strides, const Dims &pads, const Dims &dilations, int64_t group,
                               const Workspace &workspace) {
  const char *op = "nn.conv_input_grad";
  const ChannelsFirst cf(xs, ws, dys);
  const ConvGeom g = gradientGeom(op, cf.x, cf.w, cf.y, strides, pads, dilations, group);
  if (g.N == 0 || g.C == 0 || g.inSize == 0 || dnn::convInputGrad(dy, w, dx, g, workspace, /*channelsLast=*/true))
    return;
  WidenedCopies copies({dys.numel(), ws.numel(), xs.numel()});
  const float *dyc = copies.takeChannelsFirst(op, dy, g.N, g.outSize, g.F);
  const float *wc = copies.takeChannelsFirst(op, w, g.F, g.kSize, g.Cg);
  float *dxc = copies.take(nullptr, xs.numel());
  convInputGrad(dyc, cf.y, wc, cf.w, dxc, cf.x, strides, pads, dilations, group, workspace);
  copies.putChannelsLast(op, dxc, g.N, g.C, g.inSize, dx);
}

/// cuDNN writes dW as dw lies (KRSC) in T: into dw itself (float storage,
/// no accumulate), else into kernel scratch slot 1, then widened or added
/// into dw; the channels-first fallback's dW goes back through a transpose
/// that adds it with accumulate (the bits of writing it elsewhere and adding).
template <class T>
void convWeightGradChannelsLast(const T *dy, const Shape &dys, const T *x, const Shape &xs, float *dw,
                                const Shape &ws, const Dims &strides, const Dims &pads, const Dims &dilations,
                                int64_t group, const Workspace &workspace, bool accumulate) {
  const char *op = "nn.conv_weight_grad";
  const ChannelsFirst cf(xs, ws, dys);
  const ConvGeom g = gradientGeom(op, cf.x, cf.w, cf.y, strides, pads, dilations, group);
  const int64_t n = ws.numel();
  if (n == 0 || (g.N == 0 && accumulate)) return;
  if (g.N == 0) {
    detail::check(cudaMemsetAsync(dw, 0, (size_t)n * sizeof(float), detail::stream()), op);
    return;
  }
  constexpr bool bf16Storage = std::is_same_v<T, bf16>;
  T *result = nullptr;
  if constexpr (bf16Storage)
    result = static_cast<bf16 *>(detail::scratch(1, (size_t)n * sizeof(bf16)));
  else
    result = accumulate ? static_cast<float *>(detail::scratch(1, (size_t)n * sizeof(float))) : dw;
  if (dnn::convWeightGrad(dy, x, result, g, workspace, /*channelsLast=*/true)) {
    if constexpr (bf16Storage) {
      widenKernel<<<detail::blocksFor(n), detail::kThreads, 0, detail::stream()>>>(result, n, dw, accumulate);
      detail::checkLaunch(op);
    } else if (accumulate) {
      cuda::accumulate(dw, result, n);
    }
    return;
  }
  WidenedCopies copies({dys.numel(), xs.numel(), n});
  const float *dyc = copies.takeChannelsFirst(op, dy, g.N, g.outSize, g.F);
  const float *xc = copies.takeChannelsFirst(op, x, g.N, g.inSize, g.C);
  float *dwc = copies.take(nullptr, n);
  convWeightGrad(dyc, cf.y, xc, cf.x, dwc, cf.w, strides, pads, dilations, group, workspace, false);
  copies.putChannelsLast(op, dwc, g.F, g.Cg, g.kSize, dw, accumulate);
}

} // namespace

void conv(const float *x, const Shape &xs, const float *w, const Shape &ws, const float *bias, float *y,
          const Dims &strides, const Dims &pads, const Dims &dilations, int64_t group, const Workspace &workspace,
          bool channelsLast, const float *residual, std::optional<Unary> activation) {
  const ConvEpilogue<float> epilogue = epilogueOf("nn.conv", bias, residual, activation);
  if (channelsLast)
    convChannelsLast(x, xs, w, ws, epilogue, y, strides, pads, dilations, group, workspace);
  else
    convFirst(x, xs, w, ws, epilogue, y, strides, pads, dilations, group, workspace);
}

void convInputGrad(const float *dy, const Shape &dys, const float *w, const Shape &ws, float *dx, const Shape &xs,
                   const Dims &strides, const Dims &pads, const Dims &dilations, int64_t group,
                   const Workspace &workspace, bool channelsLast) {
  if (channelsLast)
    convInputGradChannelsLast(dy, dys, w, ws, dx, xs, strides, pads, dilations, group, workspace);
  else
    convInputGrad(dy, dys, w, ws, dx, xs, strides, pads, dilations, group, workspace);
}

void convWeightGrad(const float *dy, const Shape &dys, const float *x, const Shape &xs, float *dw, const Shape &ws,
                    const Dims &strides, const Dims &pads, const Dims &dilations, int64_t group,
                    const Workspace &workspace, bool accumulate, bool channelsLast) {
  if (channelsLast)
    convWeightGradChannelsLast(dy, dys, x, xs, dw, ws, strides, pads, dilations, group, workspace, accumulate);
  else
    convWeightGrad(dy, dys, x, xs, dw, ws, strides, pads, dilations, group, workspace, accumulate);
}

//===----------------------------------------------------------------------===//
// bf16 storage: cuDNN's bf16 graphs, else the float kernels on widened copies
//===----------------------------------------------------------------------===//

void conv(const bf16 *x, const Shape &xs, const bf16 *w, const Shape &ws, const float *bias, bf16 *y,
          const Dims &strides, const Dims &pads, const Dims &dilations, int64_t group, const Workspace &workspace,
          bool channelsLast, const bf16 *residual, std::optional<Unary> activation) {
  const char *op = "nn.conv";
  ConvEpilogue<bf16> epilogue = epilogueOf(op, bias, residual, activation);
  if (channelsLast) return convChannelsLast(x, xs, w, ws, epilogue, y, strides, pads, dilations, group, workspace);
  const ConvGeom g = convGeom(op, xs, ws, strides, pads, dilations, group);
  if (g.N == 0 || g.F == 0) return;
  if (dnn::conv(x, w, epilogue, y, g, workspace, false)) {
    applyEpilogue(op, y, epilogue, g, /*channelsLast=*/false); // what cuDNN's graph did not apply
    return;
  }
  const int64_t yCount = g.N * g.F * g.outSize;
  WidenedCopies copies({xs.numel(), ws.numel(), yCount, residual ? yCount : 0});
  const float *xf = copies.take(x, xs.numel()), *wf = copies.take(w, ws.numel());
  float *yf = copies.take(nullptr, yCount);
  const float *rf = residual ? copies.take(residual, yCount) : nullptr;
  convFirst(xf, xs, wf, ws, ConvEpilogue<float>{bias, rf, epilogue.activation}, yf, strides, pads, dilations, group,
            workspace);
  copies.round(yf, yCount, y);
}

void convInputGrad(const bf16 *dy, const Shape &dys, const bf16 *w, const Shape &ws, bf16 *dx, const Shape &xs,
                   const Dims &strides, const Dims &pads, const Dims &dilations, int64_t group,
                   const Workspace &workspace, bool channelsLast) {
  if (channelsLast)
    return convInputGradChannelsLast(dy, dys, w, ws, dx, xs, strides, pads, dilations, group, workspace);
  const char *op = "nn.conv_input_grad";
  const ConvGeom g = gradientGeom(op, xs, ws, dys, strides, pads, dilations, group);
  if (g.N == 0 || g.C == 0 || g.inSize == 0 || dnn::convInputGrad(dy, w, dx, g, workspace, false)) return;
  WidenedCopies copies({dys.numel(), ws.numel(), xs.numel()});
  const float *dyf = copies.take(dy, dys.numel()), *wf = copies.take(w, ws.numel());
  float *dxf = copies.take(nullptr, xs.numel());
  convInputGrad(dyf, dys, wf, ws, dxf, xs, strides, pads, dilations, group, workspace);
  copies.round(dxf, xs.numel(), dx);
}

void convWeightGrad(const bf16 *dy, const Shape &dys, const bf16 *x, const Shape &xs, float *dw, const Shape &ws,
                    const Dims &strides, const Dims &pads, const Dims &dilations, int64_t group,
                    const Workspace &workspace, bool accumulate, bool channelsLast) {
  if (channelsLast)
    return convWeightGradChannelsLast(dy, dys, x, xs, dw, ws, strides, pads, dilations, group, workspace,
                                      accumulate);
  const char *op = "nn.conv_weight_grad";
  const ConvGeom g = gradientGeom(op, xs, ws, dys, strides, pads, dilations, group);
  const int64_t n = ws.numel();
  if (n == 0 || (g.N == 0 && accumulate)) return;
  if (g.N == 0) {
    detail::check(cudaMemsetAsync(dw, 0, (size_t)n * sizeof(float), detail::stream()), op);
    return;
  }
  // cuDNN's bf16 configuration writes dW in bf16, like the rest of the call
  // (the rounding PyTorch's autocast gives a bf16 weight's gradient too);
  // one kernel widens it into dw or adds it there.
  bf16 *rounded = static_cast<bf16 *>(detail::scratch(1, (size_t)n * sizeof(bf16)));
  if (dnn::convWeightGrad(dy, x, rounded, g, workspace, false)) {
    widenKernel<<<detail::blocksFor(n), detail::kThreads, 0, detail::stream()>>>(rounded, n, dw, accumulate);
    detail::checkLaunch(op);
    return;
  }
  WidenedCopies copies({dys.numel(), xs.numel(), accumulate ? n : 0});
  const float *dyf = copies.take(dy, dys.numel()), *xf = copies.take(x, xs.numel());
  float *sum = accumulate ? copies.take(nullptr, n) : dw;
  convWeightGrad(dyf, dys, xf, xs, sum, ws, strides, pads, dilations, group, workspace, false);
  if (accumulate) cuda::accumulate(dw, sum, n);
}

} // namespace pipec::kernels::cuda
