// GEMM, batched matmul and convolution (im2col / col2im + cblas_sgemm).
#include "detail.h"
#include "kernel_plan.h"
#include "pipec/unary_math.h"

#include <algorithm>
#include <cstring>

#include <cblas.h>
#ifdef PIPEC_KERNELS_OPENBLAS
extern "C" void openblas_set_num_threads(int);
#endif

namespace pipec::kernels {

using namespace detail;
using plan::columnFloats;
using plan::inputGradAsConv;
using plan::inputGradByFlippedConv;
using plan::winogradApplies;

void setThreads(int threads) {
  threads = threads < 1 ? 1 : threads;
#ifdef PIPEC_KERNELS_OPENBLAS
  // OpenBLAS itself stays on one thread: sgemm below splits a product into
  // panels fixed by its shape and runs them on OpenMP threads, so that the
  // result does not depend on the thread count (OpenBLAS's own split does:
  // docs/cpu-kernels.md, "Threads").
  openblas_set_num_threads(1);
#endif
#ifdef _OPENMP
  omp_set_num_threads(threads);
#endif
}

void setBlasThreads(int threads) { setThreads(threads); }

int threads() {
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}

namespace {
/// How sgemm splits C[M, N] into independent panels (a function of the
/// shape only). A product under kGemmPanelWork multiply-adds is one panel;
/// larger ones get up to kGemmMaxPanels panels along C's longer side, each
/// at least kGemmMinPanel wide and a multiple of 16 (whole OpenBLAS
/// micro-tiles), so that every panel is a GEMM big enough to run at full
/// speed. Each panel packs the whole of the operand it shares with the
/// others (B[K, N] for panels of rows, A[M, K] for panels of columns), so
/// splitting the longer side repacks the smaller operand: panels of 64 rows
/// of a 512 x 3072 x 768 product ran at 172 GFLOP/s against 241 for panels
/// of 384 columns on one AVX-512 core (docs/cpu-kernels.md, "Threads").
constexpr int64_t kGemmPanelWork = int64_t(1) << 24, kGemmMaxPanels = 16, kGemmMinPanel = 64;
struct GemmPanels {
  bool byRows = true;
  int64_t extent = 1, size = 1; // the split axis's length and a panel's width along it (the last: less)
  int64_t count() const { return (extent + size - 1) / size; }
};
GemmPanels gemmPanels(int64_t M, int64_t N, int64_t K) {
  const GemmPanels whole{true, M, M};
  const double work = double(M) * double(N) * double(K);
  const bool byRows = M >= N;
  const int64_t extent = byRows ? M : N;
  if (work < double(kGemmPanelWork) || extent < 2 * kGemmMinPanel) return whole;
  const int64_t wanted = std::clamp<int64_t>((int64_t)(work / double(kGemmPanelWork)), 2, kGemmMaxPanels);
  const int64_t size = std::max(kGemmMinPanel, ((extent + wanted - 1) / wanted + 15) / 16 * 16);
  return size >= extent ? whole : GemmPanels{byRows, extent, size};
}

} // namespace

void detail::addSlicesInOrder(float *first, const float *rest, int64_t slices, int64_t size) {
  if (slices > 1)
    parallelVectorElements(size, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) {
        float v = first[i];
        for (int64_t s = 1; s < slices; ++s) v += rest[(s - 1) * size + i];
        first[i] = v;
      }
    });
}

namespace {
/// The epilogue on C[rows, cols] (leading dimension ldc), at element
/// `offset` of the [M, N] matrices it reads or writes besides C. Each row
/// runs on the widest vectors (withWidestVectors), as the element-wise
/// kernels do: compiled for the library's SSE2 baseline, GELU's erf and exp
/// took 1.0 ms per 256 x 1024 forward and 2.0 ms per gradient on the 2-core
/// AMD EPYC box, as long as the 256 x 1024 x 256 GEMM they follow (1.4 ms).
/// Same bits either way (independent lanes, no contracted multiply-add).
void applyEpilogue(const GemmEpilogue &e, float *C, int64_t offset, int64_t rows, int64_t cols, int64_t ldc) {
  if (!e.activation) return;
  dispatchUnary(*e.activation, [&](auto kind) {
    constexpr Unary U = decltype(kind)::value;
    for (int64_t i = 0; i < rows; ++i) {
      float *row = C + offset + i * ldc;
      if (e.derivativeAt) {
        if constexpr (derivativeReadsInput<U>()) {
          const float *x = e.derivativeAt + offset + i * ldc;
          withWidestVectors(
              [&](int64_t lo, int64_t hi) {
                for (int64_t j = lo; j < hi; ++j) row[j] = unaryGradient<U>(row[j], x[j], 0.0f);
              },
              0, cols);
        }
        continue;
      }
      if (e.preActivation) std::memcpy(e.preActivation + offset + i * ldc, row, cols * sizeof(float));
      withWidestVectors(
          [&](int64_t lo, int64_t hi) {
            for (int64_t j = lo; j < hi; ++j) row[j] = unaryValue<U>(row[j]);
          },
          0, cols);
    }
  });
}
} // namespace

void detail::sgemm(bool transA, bool transB, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
           const float *B, int64_t ldb, float beta, float *C, int64_t ldc, const GemmEpilogue &epilogue) {
  if (M == 0 || N == 0) return;
  if (K == 0) { // BLAS may not touch C then; do what the maths says
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) C[i * ldc + j] = beta == 0.0f ? 0.0f : beta * C[i * ldc + j];
    applyEpilogue(epilogue, C, 0, M, N, ldc);
    return;
  }
  const int64_t limit = 0x7fffffff;
  if (M > limit || N > limit || K > limit || lda > limit || ldb > limit || ldc > limit)
    fail("sgemm", "dimensions above 2^31 - 1");
  // Panels of C fixed by the shape alone (never by the thread count): rows
  // when M is tall enough, else columns. Each panel is one single-threaded
  // cblas_sgemm whose every output element is summed over all of K, so the
  // same calls run whatever the thread count and give the same bits.
#ifdef PIPEC_KERNELS_OPENBLAS
  static const bool blasOnOneThread = (openblas_set_num_threads(1), true); // whoever set it before
  (void)blasOnOneThread;
#endif
  const GemmPanels panels = gemmPanels(M, N, K);
  const int64_t count = panels.count();
  auto panel = [&](int64_t p) {
    const int64_t r0 = panels.byRows ? p * panels.size : 0, c0 = panels.byRows ? 0 : p * panels.size;
    const int64_t rows = panels.byRows ? std::min(panels.size, M - r0) : M;
    const int64_t cols = panels.byRows ? N : std::min(panels.size, N - c0);
    const float *a = A + (transA ? r0 : r0 * lda); // op(A)'s rows r0..: A's columns when transposed
    const float *b = B + (transB ? c0 * ldb : c0); // op(B)'s columns c0..: B's rows when transposed
    cblas_sgemm(CblasRowMajor, transA ? CblasTrans : CblasNoTrans, transB ? CblasTrans : CblasNoTrans, (int)rows,
                (int)cols, (int)K, alpha, a, (int)lda, b, (int)ldb, beta, C + r0 * ldc + c0, (int)ldc);
    applyEpilogue(epilogue, C, r0 * ldc + c0, rows, cols, ldc);
  };
  if (count == 1) {
    panel(0);
    return;
  }
  // Only the elements' work decides the threads (each panel writes its own
  // part of C; cblas_sgemm checks nothing that could throw here).
  parallelRanges(count, gemmWork(M, N, K), [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) panel(p);
  });
}

void gemm(const float *A, const float *B, const float *C, const Shape &cs, float *Y, int64_t M, int64_t N, int64_t K,
          bool transA, bool transB, float alpha, float beta, std::optional<Unary> activation, float *preActivation) {
  if (M < 0 || N < 0 || K < 0) fail("nn.gemm", "negative dimension");
  if (preActivation && !activation) fail("nn.gemm", "a pre-activation output without an activation");
  const Shape ys{M, N};
  if (C && !broadcastsTo(cs, ys)) fail("nn.gemm", "C of shape " + cs.str() + " does not broadcast to " + ys.str());
  float b = 0.0f;
  if (C == Y) {
    b = beta; // in place: Y = alpha op(A) op(B) + beta Y (a gradient accumulating)
  } else if (C && beta != 0.0f) {
    expand(C, cs, Y, ys);
    b = beta;
  }
  sgemm(transA, transB, M, N, K, alpha, A, transA ? M : K, B, transB ? K : N, b, Y, N,
        GemmEpilogue(activation, preActivation));
}

void gemmActivationGrad(const float *A, const float *B, const float *x, float *Y, int64_t M, int64_t N, int64_t K,
                        bool transA, bool transB, float alpha, Unary function) {
  const char *op = "nn.gemm_activation_grad";
  if (M < 0 || N < 0 || K < 0) fail(op, "negative dimension");
  if (!derivativeReadsInput(function))
    fail(op, std::string("the derivative of '") + unaryName(function) + "' reads its result, not x");
  sgemm(transA, transB, M, N, K, alpha, A, transA ? M : K, B, transB ? K : N, 0.0f, Y, N,
        GemmEpilogue(function, nullptr, x));
}


void matmul(const float *A, const Shape &as, const float *B, const Shape &bs, float *Y, bool transA, bool transB) {
  // op(A) and op(B): the GEMMs read the stored matrices with the trans flags.
  const Shape al = gemmOperandShape(as, transA), bl = gemmOperandShape(bs, transB);
  (void)matmulShape(al, bl); // checks
  Shape ap = al.size == 1 ? Shape{1, al.v[0]} : al;
  Shape bp = bl.size == 1 ? Shape{bl.v[0], 1} : bl;
  const int64_t M = ap.v[ap.size - 2], K = ap.v[ap.size - 1], N = bp.v[bp.size - 1];
  const int64_t lda = transA ? M : K, ldb = transB ? K : N;
  const Shape aBatch(ap.v, ap.size - 2), bBatch(bp.v, bp.size - 2);
  const Shape batch = broadcastShape(aBatch, bBatch);
  const int64_t count = batch.numel();
  if (count == 0) return;
  if (bBatch.numel() == 1 && aBatch == batch && !transA) {
    // One weight matrix for every batch entry (Linear on 3-D input): one GEMM.
    sgemm(false, transB, count * M, N, K, 1.0f, A, lda, B, ldb, 0.0f, Y, N);
    return;
  }
  if (count == 1) {
    sgemm(transA, transB, M, N, K, 1.0f, A, lda, B, ldb, 0.0f, Y, N);
    return;
  }
  // Batch entries are independent GEMMs (each sgemm's panels depend on the
  // shape only): one thread per range of entries, each GEMM then on the
  // thread that runs it, the same bits for any thread count. The broadcast
  // walker gives each entry's operand offsets, in matrices: the batch shape
  // with a unit axis appended has one entry per row.
  Shape entries = batch, aEntries = aBatch, bEntries = bBatch;
  entries.push(1), aEntries.push(1), bEntries.push(1);
  const std::array<std::array<int64_t, kMaxRank>, 2> st{broadcastStrides(aEntries, entries),
                                                        broadcastStrides(bEntries, entries)};
  auto product = [&](int64_t i, const std::array<int64_t, 2> &o) {
    sgemm(transA, transB, M, N, K, 1.0f, A + o[0] * M * K, lda, B + o[1] * K * N, ldb, 0.0f, Y + i * M * N, N);
  };
  if (std::max({M, N, K}) > 0x7fffffff) fail("nn.matmul", "dimensions above 2^31 - 1"); // no throw in the team
  parallelRanges(count, gemmWork(count * M, N, K),
                 [&](int64_t begin, int64_t end) { broadcastRows<2>(entries, st, begin, end, product); });
}

//===----------------------------------------------------------------------===//
// Convolution
//===----------------------------------------------------------------------===//


namespace {

/// Valid output positions j in [lo, hi) of the innermost axis, for which
/// p = j * s + base lies in [0, in).
inline void innerRange(int64_t base, int64_t s, int64_t in, int64_t L, int64_t &lo, int64_t &hi) {
  lo = base >= 0 ? 0 : (-base + s - 1) / s;
  hi = in - base <= 0 ? 0 : (in - base + s - 1) / s;
  lo = std::min(lo, L);
  hi = std::max(lo, std::min(hi, L));
}

/// Visits every (row, outer output position) of the column matrix
/// [Cg * kSize, outSize] for the input channels [cBegin, cEnd): calls
/// f(rowPointerOffset, xOffset or -1, base of the inner axis) for runs of
/// the innermost output axis. A channel's rows read (im2col) or write
/// (col2im) only that channel of x.
template <class F> void forEachColumnRun(const ConvGeom &g, int64_t cBegin, int64_t cEnd, F &&f) {
  const int sp = g.sp, last = sp - 1;
  const int64_t L = g.out[last];
  const int64_t outer = g.outSize / L;
  int64_t inStr[kMaxRank];
  {
    int64_t acc = 1;
    for (int a = sp - 1; a >= 0; --a) {
      inStr[a] = acc;
      acc *= g.in[a];
    }
  }
  int64_t kidx[kMaxRank] = {};
  for (int64_t c = cBegin; c < cEnd; ++c) { // kidx is all zeros at each channel's start
    for (int64_t kk = 0; kk < g.kSize; ++kk) {
      const int64_t row = c * g.kSize + kk;
      const int64_t base = kidx[last] * g.d[last] - g.pb[last];
      int64_t oidx[kMaxRank] = {};
      for (int64_t o = 0; o < outer; ++o) {
        bool valid = true;
        int64_t off = c * g.inSize;
        for (int a = 0; a < last; ++a) {
          const int64_t p = oidx[a] * g.s[a] - g.pb[a] + kidx[a] * g.d[a];
          if (p < 0 || p >= g.in[a]) {
            valid = false;
            break;
          }
          off += p * inStr[a];
        }
        f(row * g.outSize + o * L, valid ? off : -1, base);
        for (int a = last - 1; a >= 0; --a) {
          if (++oidx[a] < g.out[a]) break;
          oidx[a] = 0;
        }
      }
      for (int a = last; a >= 0; --a) { // next kernel position
        if (++kidx[a] < g.k[a]) break;
        kidx[a] = 0;
      }
    }
  }
}

/// The 2-D case of forEachColumnRun, with the body inlined: per (channel,
/// kernel row, kernel column) and output row, f(column row offset, whether
/// the input row exists (else it is padding), the offset in x of output
/// column 0's tap (may be negative; only [lo, hi) are read), [lo, hi) the
/// valid output columns). The same rows in the same order as the general
/// walk.
template <class F> void forEachColumnRun2d(const ConvGeom &g, int64_t cBegin, int64_t cEnd, F &&f) {
  const int64_t H = g.in[0], W = g.in[1], OH = g.out[0], OW = g.out[1];
  for (int64_t c = cBegin; c < cEnd; ++c)
    for (int64_t kh = 0; kh < g.k[0]; ++kh)
      for (int64_t kw = 0; kw < g.k[1]; ++kw) {
        const int64_t row = (c * g.k[0] + kh) * g.k[1] + kw;
        const int64_t base = kw * g.d[1] - g.pb[1];
        int64_t lo, hi;
        innerRange(base, g.s[1], W, OW, lo, hi);
        for (int64_t oh = 0; oh < OH; ++oh) {
          const int64_t ih = oh * g.s[0] - g.pb[0] + kh * g.d[0];
          f(row * g.outSize + oh * OW, ih >= 0 && ih < H, c * g.inSize + ih * W + base, lo, hi);
        }
      }
}

/// im2col of a 2-D convolution with unit strides whose output rows are as
/// long as the input's ("same" padding): a kernel tap's output rows read
/// consecutive input rows at one shift, so the tap's whole column row is one
/// copy of the image shifted by the tap, after which the at most pad-wide
/// edge columns, which the shift filled from neighbouring rows, are zeroed.
void im2colSameRows(const ConvGeom &g, const float *x, float *col) {
  const int64_t H = g.in[0], W = g.in[1], OH = g.out[0], P = g.outSize;
  parallelRanges(g.Cg, g.Cg * g.kSize * P, [&](int64_t cBegin, int64_t cEnd) {
    for (int64_t c = cBegin; c < cEnd; ++c)
      for (int64_t kh = 0; kh < g.k[0]; ++kh) {
        // Output rows oh in [oh0, oh1) read input row oh + shift.
        const int64_t shift = kh * g.d[0] - g.pb[0];
        const int64_t oh0 = std::clamp<int64_t>(-shift, 0, OH), oh1 = std::clamp<int64_t>(H - shift, oh0, OH);
        for (int64_t kw = 0; kw < g.k[1]; ++kw) {
          float *dst = col + ((c * g.k[0] + kh) * g.k[1] + kw) * P;
          const int64_t base = kw * g.d[1] - g.pb[1];
          int64_t lo, hi;
          innerRange(base, 1, W, W, lo, hi);
          std::fill(dst, dst + oh0 * W, 0.0f);
          std::fill(dst + oh1 * W, dst + P, 0.0f);
          if (oh0 == oh1) continue;
          // Elements t of the block [oh0 * W, oh1 * W) read x at
          // start + t; those outside the channel are edge columns.
          const int64_t start = (oh0 + shift) * W + base, n = (oh1 - oh0) * W;
          const int64_t tLo = std::max<int64_t>(0, -start), tHi = std::min(n, g.inSize - start);
          float *block = dst + oh0 * W;
          if (tLo < tHi)
            std::memcpy(block + tLo, x + c * g.inSize + start + tLo, (size_t)(tHi - tLo) * sizeof(float));
          if (lo == 0 && hi == W) continue;
          for (int64_t r = 0; r < oh1 - oh0; ++r) {
            float *row = block + r * W;
            for (int64_t j = 0; j < lo; ++j) row[j] = 0.0f;
            for (int64_t j = hi; j < W; ++j) row[j] = 0.0f;
          }
        }
      }
  });
}

/// col[Cg*kSize, outSize] from x (the group's channels of one sample);
/// parallel over channels.
void im2col(const ConvGeom &g, const float *x, float *col) {
  if (g.sp == 2 && g.s[0] == 1 && g.s[1] == 1 && g.in[1] == g.out[1]) {
    im2colSameRows(g, x, col);
    return;
  }
  if (g.sp == 2) { // images: short rows, so plain loops instead of memcpy/fill calls
    const int64_t OW = g.out[1], sw = g.s[1];
    parallelRanges(g.Cg, g.Cg * g.kSize * g.outSize, [&](int64_t cBegin, int64_t cEnd) {
      forEachColumnRun2d(g, cBegin, cEnd, [&](int64_t dstOff, bool inside, int64_t xOff, int64_t lo, int64_t hi) {
        float *dst = col + dstOff;
        if (!inside) {
          for (int64_t j = 0; j < OW; ++j) dst[j] = 0.0f;
          return;
        }
        const float *src = x + xOff;
        for (int64_t j = 0; j < lo; ++j) dst[j] = 0.0f;
        if (sw == 1)
          for (int64_t j = lo; j < hi; ++j) dst[j] = src[j];
        else
          for (int64_t j = lo; j < hi; ++j) dst[j] = src[j * sw];
        for (int64_t j = hi; j < OW; ++j) dst[j] = 0.0f;
      });
    });
    return;
  }
  const int last = g.sp - 1;
  const int64_t L = g.out[last], s = g.s[last], in = g.in[last];
  parallelRanges(g.Cg, g.Cg * g.kSize * g.outSize, [&](int64_t cBegin, int64_t cEnd) {
    forEachColumnRun(g, cBegin, cEnd, [&](int64_t dstOff, int64_t xOff, int64_t base) {
      float *dst = col + dstOff;
      if (xOff < 0) {
        std::fill(dst, dst + L, 0.0f);
        return;
      }
      int64_t lo, hi;
      innerRange(base, s, in, L, lo, hi);
      std::fill(dst, dst + lo, 0.0f);
      const float *src = x + xOff + base;
      if (s == 1)
        std::memcpy(dst + lo, src + lo, (size_t)(hi - lo) * sizeof(float));
      else
        for (int64_t j = lo; j < hi; ++j) dst[j] = src[j * s];
      std::fill(dst + hi, dst + L, 0.0f);
  });
  });
}

/// x += col2im(col): the adjoint of im2col. Parallel over channels: each
/// element of x gets its terms in the same order as with one thread.
void col2imAdd(const ConvGeom &g, const float *col, float *x) {
  if (g.sp == 2) {
    const int64_t sw = g.s[1];
    parallelRanges(g.Cg, g.Cg * g.kSize * g.outSize, [&](int64_t cBegin, int64_t cEnd) {
      forEachColumnRun2d(g, cBegin, cEnd, [&](int64_t srcOff, bool inside, int64_t xOff, int64_t lo, int64_t hi) {
        if (!inside) return;
        const float *src = col + srcOff;
        float *dst = x + xOff;
        if (sw == 1)
          for (int64_t j = lo; j < hi; ++j) dst[j] += src[j];
        else
          for (int64_t j = lo; j < hi; ++j) dst[j * sw] += src[j];
      });
    });
    return;
  }
  const int last = g.sp - 1;
  const int64_t L = g.out[last], s = g.s[last], in = g.in[last];
  parallelRanges(g.Cg, g.Cg * g.kSize * g.outSize, [&](int64_t cBegin, int64_t cEnd) {
    forEachColumnRun(g, cBegin, cEnd, [&](int64_t srcOff, int64_t xOff, int64_t base) {
      if (xOff < 0) return;
      int64_t lo, hi;
      innerRange(base, s, in, L, lo, hi);
      const float *src = col + srcOff;
      float *dst = x + xOff + base;
      for (int64_t j = lo; j < hi; ++j) dst[j * s] += src[j];
  });
  });
}

/// The work of a convolution's GEMMs over all samples and groups.
int64_t convGemmWork(const ConvGeom &g) { return gemmWork(g.N * g.G * g.Fg, g.outSize, g.Cg * g.kSize); }

/// The column matrix [Cg * kSize, outSize] of sample n's group gi: x itself
/// for a pointwise convolution, else its im2col in `col`.
const float *sampleColumns(const ConvGeom &g, const float *x, int64_t n, int64_t gi, float *col) {
  const float *xg = x + (n * g.C + gi * g.Cg) * g.inSize;
  if (g.pointwise) return xg;
  im2col(g, xg, col);
  return col;
}

/// Calls body(nBegin, nEnd) over the samples [0, N) of a convolution whose
/// samples are independent (each writes only its own part of the output).
/// When they split evenly enough over the threads, each thread gets whole
/// samples and runs their im2col and GEMM panels alone: the nested loops see
/// the parallel region and stay on their thread, making the same calls in the
/// same order as one thread, so the bits do not change; a sample's work is
/// then one team start instead of one per im2col and per GEMM, and each thread
/// packs a whole GEMM's operands (docs/cpu-kernels.md, "Convolution"). Else
/// (one sample, or too few to balance) one call covers every sample and each
/// im2col and GEMM splits inside.
template <class F> void forSampleRanges(const ConvGeom &g, F &&body) {
  const int64_t work = convGemmWork(g);
  const int t = threadsFor(work, g.N);
  const int64_t perThread = (g.N + t - 1) / t; // threadsFor gives at least 1
  if (t > 1 && 4 * g.N >= 3 * int64_t(t) * perThread) // at least 3/4 of the threads' time busy
    parallelRanges(g.N, work, body);
  else if (g.N > 0)
    body(int64_t(0), g.N);
}

/// y [N, F, out...] = conv(x, w) + bias (if any), w [F, Cg * kSize]: per
/// sample and group one im2col, one GEMM and the bias while y is in cache. (Several samples' columns in
/// one GEMM, to widen the products of small late feature maps, measured no
/// faster: docs/cpu-kernels.md, "Convolution".)
void convByColumns(const ConvGeom &g, const float *x, const float *w, const float *bias, float *y,
                   const Scratch &scratch) {
  const int64_t rows = g.Cg * g.kSize, P = g.outSize;
  forSampleRanges(g, [&](int64_t nBegin, int64_t nEnd) {
    float *col = g.pointwise ? nullptr : scratch.thread().take<float>(columnFloats(g));
    for (int64_t n = nBegin; n < nEnd; ++n)
      for (int64_t gi = 0; gi < g.G; ++gi) {
        const float *cols = sampleColumns(g, x, n, gi, col);
        float *yg = y + (n * g.F + gi * g.Fg) * P;
        sgemm(false, false, g.Fg, P, rows, 1.0f, w + gi * g.Fg * rows, rows, cols, P, 0.0f, yg, P);
        if (bias)
          parallelRanges(g.Fg, g.Fg * P, [&](int64_t fBegin, int64_t fEnd) {
            for (int64_t f = fBegin; f < fEnd; ++f) {
              const float b = bias[gi * g.Fg + f];
              float *row = yg + f * P;
              for (int64_t p = 0; p < P; ++p) row[p] += b;
            }
          });
      }
  });
}

/// y = conv(x, w) + bias (if any): Winograd F(2x2, 3x3) where it applies,
/// else per sample im2col and GEMM (scratch: plan::addCpuConvForwardScratch).
void convForward(const ConvGeom &g, const float *x, const float *w, const float *bias, float *y,
                 Scratch &scratch) {
  if (winogradApplies(g))
    winogradConv(g, x, w, bias, y, scratch);
  else
    convByColumns(g, x, w, bias, y, scratch);
}

} // namespace

Shape convOutputShape(const Shape &x, const Shape &w, const Dims &strides, const Dims &pads, const Dims &dilations) {
  if (x.size < 3) fail("nn.conv", "the input needs rank >= 3");
  const int64_t group = w.size >= 2 && w.v[1] > 0 ? x.v[1] / w.v[1] : 1;
  return convOut(convGeom("nn.conv", x, w, strides, pads, dilations, group));
}

void conv(const float *x, const Shape &xs, const float *w, const Shape &ws, const float *bias, float *y,
          const Dims &strides, const Dims &pads, const Dims &dilations, int64_t group, const Workspace &workspace) {
  const ConvGeom g = convGeom("nn.conv", xs, ws, strides, pads, dilations, group);
  ScratchNeed need;
  plan::addCpuConvForwardScratch(g, need);
  Scratch scratch("nn.conv", workspace, need);
  convForward(g, x, w, bias, y, scratch);
}

void convInputGrad(const float *dy, const Shape &dys, const float *w, const Shape &ws, float *dx, const Shape &xs,
                   const Dims &strides, const Dims &pads, const Dims &dilations, int64_t group,
                   const Workspace &workspace) {
  const ConvGeom g = convGeom("nn.conv_input_grad", xs, ws, strides, pads, dilations, group);
  if (convOut(g) != dys)
    fail("nn.conv_input_grad", "dy " + dys.str() + " is not the conv result shape " + convOut(g).str());
  const int64_t rows = g.Cg * g.kSize, P = g.outSize;
  ScratchNeed need;
  plan::addCpuConvInputGradScratch(g, need);
  Scratch scratch("nn.conv_input_grad", workspace, need);
  if (inputGradByFlippedConv(g)) {
    // docs/cpu-kernels.md, "Convolution": a GEMM with K = Fg * kSize
    // instead of one with K = Fg into a column matrix that BLAS zeroes first
    // and col2im folds back.
    const int64_t flippedRows = g.Fg * g.kSize;
    float *flipped = scratch.shared<float>(plan::flippedWeightFloats(g)); // [C, Fg * kSize]
    for (int64_t gi = 0; gi < g.G; ++gi)
      for (int64_t f = 0; f < g.Fg; ++f)
        for (int64_t c = 0; c < g.Cg; ++c) {
          const float *src = w + ((gi * g.Fg + f) * g.Cg + c) * g.kSize;
          float *dst = flipped + (gi * g.Cg + c) * flippedRows + f * g.kSize;
          for (int64_t k = 0; k < g.kSize; ++k) dst[k] = src[g.kSize - 1 - k];
        }
    convForward(inputGradAsConv(g), dy, flipped, nullptr, dx, scratch);
    return;
  }
  forSampleRanges(g, [&](int64_t nBegin, int64_t nEnd) {
    if (!g.pointwise) std::fill(dx + nBegin * g.C * g.inSize, dx + nEnd * g.C * g.inSize, 0.0f);
    float *col = g.pointwise ? nullptr : scratch.thread().take<float>(columnFloats(g));
    for (int64_t n = nBegin; n < nEnd; ++n)
      for (int64_t gi = 0; gi < g.G; ++gi) {
        float *dxg = dx + (n * g.C + gi * g.Cg) * g.inSize;
        const float *dyg = dy + (n * g.F + gi * g.Fg) * P;
        // dcol = W_g^T dy_g
        sgemm(true, false, rows, P, g.Fg, 1.0f, w + gi * g.Fg * rows, rows, dyg, P, 0.0f, g.pointwise ? dxg : col,
              P);
        if (!g.pointwise) col2imAdd(g, col, dxg);
      }
  });
}

void convWeightGrad(const float *dy, const Shape &dys, const float *x, const Shape &xs, float *dw, const Shape &ws,
                    const Dims &strides, const Dims &pads, const Dims &dilations, int64_t group,
                    const Workspace &workspace, bool accumulate) {
  const ConvGeom g = convGeom("nn.conv_weight_grad", xs, ws, strides, pads, dilations, group);
  if (convOut(g) != dys)
    fail("nn.conv_weight_grad", "dy " + dys.str() + " is not the conv result shape " + convOut(g).str());
  const int64_t rows = g.Cg * g.kSize, P = g.outSize, wSize = ws.numel();
  if (g.N == 0) {
    if (!accumulate) std::fill(dw, dw + wSize, 0.0f); // accumulate: adding a sum of nothing
    return;
  }
  ScratchNeed need;
  plan::addCpuConvWeightGradScratch(g, wSize, need, accumulate);
  Scratch scratch("nn.conv_weight_grad", workspace, need);
  float *gradient = dw; // the buffer the sum is written to
  if (accumulate) gradient = scratch.shared<float>(wSize);
  // With accumulate: the sum, then added into dw element by element.
  auto finish = [&] {
    if (accumulate)
      parallelVectorElements(wSize, [&](int64_t lo, int64_t hi) {
        for (int64_t i = lo; i < hi; ++i) dw[i] += gradient[i];
      });
  };
  if (winogradApplies(g)) {
    winogradWeightGrad(g, dy, x, gradient, scratch);
    finish();
    return;
  }
  // dW is a sum over the samples, which must not split by the thread count:
  // the samples form a number of slices fixed by N alone, each slice's sum is
  // accumulated by one thread (slice 0 into dw, the others into partial
  // buffers), and the partials are added in slice order (docs/cpu-kernels.md,
  // "Convolution").
  const int64_t slices = std::min<int64_t>(g.N, plan::kConvWeightGradSlices);
  float *partials = slices > 1 ? scratch.shared<float>((slices - 1) * wSize) : nullptr; // shared by the threads
  parallelRanges(slices, convGemmWork(g), [&](int64_t sBegin, int64_t sEnd) {
    float *col = g.pointwise ? nullptr : scratch.thread().take<float>(columnFloats(g));
    for (int64_t s = sBegin; s < sEnd; ++s) {
      float *sum = s == 0 ? gradient : partials + (s - 1) * wSize;
      const int64_t nBegin = g.N * s / slices, nEnd = g.N * (s + 1) / slices;
      for (int64_t n = nBegin; n < nEnd; ++n)
        for (int64_t gi = 0; gi < g.G; ++gi) {
          const float *cols = sampleColumns(g, x, n, gi, col);
          // dW_g (+)= dy_g col^T
          sgemm(false, true, g.Fg, rows, P, 1.0f, dy + (n * g.F + gi * g.Fg) * P, P, cols, P,
                n == nBegin ? 0.0f : 1.0f, sum + gi * g.Fg * rows, rows);
        }
    }
  });
  addSlicesInOrder(gradient, partials, slices, wSize);
  finish();
}

} // namespace pipec::kernels
