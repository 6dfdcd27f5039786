// Shared helpers of the CPU kernel tests: random data, a textbook
// multi-index walk for reference loops, and a finite-difference checker.
#pragma once

#include "pipec/cpu_kernels.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>
#include <vector>

namespace pk = pipec::kernels;

namespace kt {

inline std::vector<float> randomVec(int64_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v((size_t)n);
  for (float &x : v) x = dist(gen);
  return v;
}

inline std::vector<int64_t> vecOf(const pk::Shape &s) { return std::vector<int64_t>(s.v, s.v + s.size); }

/// Row-major multi-indices of a shape, one at a time (reference loops).
inline void forEachIndex(const std::vector<int64_t> &shape, const std::function<void(const std::vector<int64_t> &)> &f) {
  int64_t total = 1;
  for (int64_t d : shape) total *= d;
  if (total == 0) return;
  std::vector<int64_t> idx(shape.size(), 0);
  for (int64_t k = 0; k < total; ++k) {
    f(idx);
    for (int a = (int)shape.size() - 1; a >= 0; --a) {
      if (++idx[a] < shape[a]) break;
      idx[a] = 0;
    }
  }
}

/// Offset into `from` (right-aligned, numpy broadcast) of output index idx.
inline int64_t bcastOffset(const std::vector<int64_t> &idx, const std::vector<int64_t> &from) {
  size_t lead = idx.size() - from.size();
  int64_t off = 0;
  for (size_t a = 0; a < from.size(); ++a) off = off * from[a] + (from[a] == 1 ? 0 : idx[lead + a]);
  return off;
}

inline void expectAllNear(const std::vector<float> &got, const std::vector<float> &want, double tol,
                          const char *what = "") {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], tol * std::max(1.0, std::fabs((double)want[i]))) << what << " at " << i;
}

/// Central finite differences of L(x) = Σ w_i f(x)_i, with f computed by the
/// forward kernel, against the analytic gradient `grad` (dL/dx). `forward`
/// writes f(x) into out. Checks every element of x.
inline void checkGradient(std::vector<float> x, const std::vector<float> &w,
                          const std::function<void(const std::vector<float> &, std::vector<float> &)> &forward,
                          const std::vector<float> &grad, float eps = 1e-2f, double atol = 3e-3, double rtol = 1e-2,
                          const char *what = "") {
  ASSERT_EQ(x.size(), grad.size()) << what;
  std::vector<float> out(w.size());
  auto loss = [&](const std::vector<float> &in) {
    forward(in, out);
    double l = 0;
    for (size_t i = 0; i < w.size(); ++i) l += (double)w[i] * out[i];
    return l;
  };
  for (size_t i = 0; i < x.size(); ++i) {
    const float keep = x[i];
    x[i] = keep + eps;
    const double lp = loss(x);
    x[i] = keep - eps;
    const double lm = loss(x);
    x[i] = keep;
    const double numeric = (lp - lm) / (2.0 * eps);
    ASSERT_NEAR(grad[i], numeric, atol + rtol * std::fabs(numeric)) << what << " element " << i;
  }
}

} // namespace kt
