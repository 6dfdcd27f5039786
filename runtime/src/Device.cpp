// The host device: what the CPU target always did, behind the Device interface.
#include "Device.h"

#include "Plan.h" // Error
#include "StepVerdict.h"

#include <cmath>
#include <cstdlib>
#include <cstring>

namespace pipec::rt {

namespace {
template <class F> void forType(pipec_dtype t, const char *what, F f) {
  if (t == PIPEC_F32) f(float{});
  else if (t == PIPEC_F64) f(double{});
  else throw Error(std::string(what) + " of a tensor that is neither f32 nor f64");
}

class HostDevice final : public Device {
public:
  HostDevice() : Device(true) {}
  const char *name() const override { return "cpu"; }
  std::string describe() const override { return "host memory"; }

  void *allocate(size_t bytes) override {
    const size_t alloc = (bytes + 63) / 64 * 64;
    if (!alloc) return nullptr;
    void *p = std::aligned_alloc(64, alloc);
    if (!p) throw Error("out of memory allocating " + std::to_string(bytes) + " bytes");
    std::memset(p, 0, alloc);
    return p;
  }
  void release(void *p) noexcept override { std::free(p); }
  void *allocateHost(size_t bytes) override { return allocate(bytes); }
  void releaseHost(void *p) noexcept override { std::free(p); }

  void zero(void *p, size_t bytes, Stream) override {
    if (bytes) std::memset(p, 0, bytes);
  }
  void copy(void *dst, const void *src, size_t bytes, Stream) override {
    if (bytes) std::memcpy(dst, src, bytes);
  }
  void writeSmall(void *dst, const void *src, size_t bytes, Stream) override {
    if (bytes) std::memcpy(dst, src, bytes);
  }
  void uploadAsync(void *dst, const void *src, size_t bytes, Stream) override { copy(dst, src, bytes, nullptr); }
  void downloadAsync(void *dst, const void *src, size_t bytes, Stream) override { copy(dst, src, bytes, nullptr); }
  void upload(void *dst, const void *src, size_t bytes) override { copy(dst, src, bytes, nullptr); }
  void download(void *dst, const void *src, size_t bytes) override { copy(dst, src, bytes, nullptr); }

  void scale(void *p, size_t n, pipec_dtype t, double factor) override {
    forType(t, "scale", [&](auto zero) {
      using T = decltype(zero);
      T *x = (T *)p;
      // Blocks of eight (the -O2 build vectorizes a fixed-width block, not
      // a loop of unknown length); the same operation on every element.
      size_t k = 0;
      for (; k + 8 <= n; k += 8)
        for (size_t l = 0; l < 8; ++l) x[k + l] = (T)(x[k + l] * factor);
      for (; k < n; ++k) x[k] = (T)(x[k] * factor);
    });
  }
  void add(void *dst, const void *src, size_t n, pipec_dtype t) override {
    forType(t, "add", [&](auto zero) {
      using T = decltype(zero);
      T *x = (T *)dst;
      const T *y = (const T *)src;
      for (size_t k = 0; k < n; ++k) x[k] += y[k];
    });
  }
  void sumSquares(const std::vector<Span> &spans, double &sumSq, double &nonFinite) override {
    for (const Span &s : spans)
      forType(s.dtype, "sum of squares", [&](auto zero) {
        using T = decltype(zero);
        const T *x = (const T *)s.p;
        // Eight independent sums (one running sum waits on every add),
        // combined in a fixed order: the same bits on every run. The
        // branch-free pass is the answer when it is finite (then every
        // element was finite and each lane added exactly what the
        // counting pass adds); otherwise the counting pass runs.
        const double fast = laneSumOfSquares(x, s.n, [](double v) { return v; });
        if (std::isfinite(fast)) {
          sumSq += fast;
          return;
        }
        sumSq += laneSumOfSquares(x, s.n, [](double v) { return std::isfinite(v) ? v : 0.0; });
        nonFinite += laneSumOfSquares(x, s.n, [](double v) { return std::isfinite(v) ? 0.0 : 1.0; },
                                      /*square=*/false);
      });
  }
  void gradientStats(const std::vector<Span> &spans, double *stats) override {
    stats[0] = stats[1] = 0;
    sumSquares(spans, stats[0], stats[1]);
  }
  void stepControl(const double *stats, double maxNorm, pipec_step_control *control) override {
    *control = stepVerdict(stats, maxNorm);
  }
  void zeroUnlessSkipped(void *p, size_t bytes, const pipec_step_control *control) override {
    if (control->skip == 0) zero(p, bytes, nullptr);
  }

private:
  /// Σ term(x)², or Σ term(x) when !square, over eight lanes added in order.
  template <class T, class Term>
  static double laneSumOfSquares(const T *x, size_t n, Term term, bool square = true) {
    constexpr size_t kLanes = 8;
    double lane[kLanes] = {};
    size_t k = 0;
    for (; k + kLanes <= n; k += kLanes)
      for (size_t l = 0; l < kLanes; ++l) {
        const double v = term((double)x[k + l]);
        lane[l] += square ? v * v : v;
      }
    double sum = 0;
    for (; k < n; ++k) {
      const double v = term((double)x[k]);
      sum += square ? v * v : v;
    }
    for (size_t l = 0; l < kLanes; ++l) sum += lane[l];
    return sum;
  }
};
} // namespace

void Device::generateSynthetic(const io::SyntheticField &, uint64_t, uint64_t, void *) {
  throw Error(std::string("generating synthetic data on the ") + name() + " device (only CUDA devices do)");
}

Device &hostDevice() {
  static HostDevice d;
  return d;
}

} // namespace pipec::rt
