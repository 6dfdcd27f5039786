// cudakernels::guardBundle (runtime/src/CudaKernels.cu) under the host
// emulation: a received bundle whose checked header bytes differ from the
// expectation has its payload turned into 0xff bytes (NaN, -1) before the
// compute reads it; a matching one, or one that differs only after the
// checked bytes, is left as it came.
#include "Bundle.h"
#include "CudaKernels.h"

#include <cstdio>
#include <cstring>
#include <vector>

namespace {
int failures = 0;
void expect(bool ok, const char *what) {
  std::printf("%s %s\n", ok ? "ok  " : "FAIL", what);
  failures += !ok;
}
} // namespace

int main() {
  using namespace pipec::rt;
  emu::expectedStream = reinterpret_cast<cudaStream_t>(0x10);
  const size_t bytes = 64 + 4 * 1000;
  Instr in{};
  in.mb = 3;
  const BundleHeader expected = bundleHeader(in, 7, false, 1, 0x1234, bytes);
  auto bundle = [&](const BundleHeader &h) {
    std::vector<unsigned char> b(bytes);
    std::memcpy(b.data(), &h, sizeof h);
    for (size_t i = 64; i < bytes; ++i) b[i] = (unsigned char)(i * 7);
    return b;
  };
  auto payloadIntact = [&](const std::vector<unsigned char> &b) {
    for (size_t i = 64; i < bytes; ++i)
      if (b[i] != (unsigned char)(i * 7)) return false;
    return true;
  };
  auto guard = [&](std::vector<unsigned char> &b) {
    return cudakernels::guardBundle(b.data(), bytes, &expected, kCheckedHeaderBytes, sizeof(BundleHeader),
                                    emu::expectedStream) == cudaSuccess;
  };
  std::vector<unsigned char> same = bundle(expected);
  expect(guard(same) && payloadIntact(same), "the expected header: the payload is left as it came");
  BundleHeader late = expected;
  late.bytes += 1; // after the checked bytes
  std::vector<unsigned char> unchecked = bundle(late);
  expect(guard(unchecked) && payloadIntact(unchecked), "a difference after the checked bytes is not the guard's");
  for (const char *field : {"iteration", "micro-batch", "layout", "version"}) {
    BundleHeader wrong = expected;
    if (!std::strcmp(field, "iteration")) wrong.iteration += 1;
    if (!std::strcmp(field, "micro-batch")) wrong.mb += 1;
    if (!std::strcmp(field, "layout")) wrong.layoutHash ^= 1;
    if (!std::strcmp(field, "version")) wrong.version += 1;
    std::vector<unsigned char> b = bundle(wrong);
    bool poisoned = guard(b);
    for (size_t i = 64; i < bytes; ++i) poisoned &= b[i] == 0xff;
    const bool headerKept = std::memcmp(b.data(), &wrong, sizeof wrong) == 0;
    char what[120];
    std::snprintf(what, sizeof what, "another %s: every payload byte 0xff, the header kept for the report", field);
    expect(poisoned && headerKept, what);
  }
  return failures ? 1 : 0;
}
