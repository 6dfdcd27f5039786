// What the emulated kernel tests share (test/kernels/cuda_emulation): the
// context of the check that runs, counted checks and failures, the
// comparison with the CPU kernels' results within a tolerance, the summary
// that ends main, and random operands.
#pragma once
#include "pipec/cuda_kernels.h"

#include <cmath>
#include <cstdio>
#include <exception>
#include <random>
#include <string>
#include <vector>

namespace emucheck {

inline int failures = 0, checks = 0;
inline std::string ctx; // what runs, printed with each failure

inline void fail(const std::string &message) {
  std::printf("FAIL %s: %s\n", ctx.c_str(), message.c_str());
  ++failures;
}
inline void expect(bool ok, const std::string &message) {
  ++checks;
  if (!ok) fail(message);
}
/// got against the CPU kernels' want, element by element within
/// tol · (1 + |want|); the first miss is reported, named `what`.
inline void expectNear(const std::vector<float> &got, const std::vector<float> &want, double tol, const char *what) {
  ++checks;
  if (got.size() != want.size()) return fail(std::string(what) + ": sizes differ");
  for (size_t i = 0; i < got.size(); ++i)
    if (!(std::fabs((double)got[i] - want[i]) <= tol * (1 + std::fabs((double)want[i])))) {
      char buf[160];
      std::snprintf(buf, sizeof buf, "%s: [%zu] CUDA %.9g, CPU %.9g", what, i, (double)got[i], (double)want[i]);
      return fail(buf);
    }
}
/// The device errors the kernels left, then the summary: main's exit status.
inline int finish() {
  try {
    pipec::kernels::cuda::raiseDeviceErrors();
  } catch (const std::exception &e) {
    std::printf("device error: %s\n", e.what());
    ++failures;
  }
  std::printf("%d checks, %d failures\n", checks, failures);
  return failures != 0;
}

/// n values drawn uniformly from [low, high] by `rng` (each test seeds its own).
inline std::vector<float> uniformValues(std::mt19937_64 &rng, int64_t n, float low = -1, float high = 1) {
  std::uniform_real_distribution<float> d(low, high);
  std::vector<float> v((size_t)n);
  for (float &x : v) x = d(rng);
  return v;
}
/// v with every element rounded to bf16: what bf16 storage holds.
inline std::vector<float> bf16Rounded(std::vector<float> v) {
  for (float &e : v) e = (float)pipec::kernels::cuda::bf16(e);
  return v;
}

} // namespace emucheck
