// Shared helpers of the libFuzzer targets (fuzz/README in docs/security.md):
// every target writes its input to a file and calls the same path-taking
// entry point the tools call, so what is fuzzed is what pipec and piperun run.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <streambuf>
#include <string>

#include <unistd.h>

// ASan's defaults for every target. allow_user_poisoning=0: MLIR's uniquer
// allocates attributes from one BumpPtrAllocator both in our instrumented
// code (whose inlined llvm/Support/Allocator.h poisons each new slab) and in
// Debian's uninstrumented libMLIR (which never unpoisons what it takes), so
// libMLIR writing a StringAttr into such a slab was reported as
// use-after-poison (fuzz/regressions/fuzz_onnx/mixed-asan-mlir-slab.onnx).
// Heap, stack and leak checks are unaffected; ASAN_OPTIONS still overrides.
extern "C" const char *__asan_default_options() { return "allow_user_poisoning=0"; }

namespace pipec::fuzz {

/// A per-process scratch directory in /dev/shm (RAM), removed at exit.
/// Several fuzzers (and -jobs/-workers) run at once: the pid keeps them apart.
inline const std::filesystem::path &scratchDir() {
  static const std::filesystem::path dir = [] {
    const char *base = std::getenv("PIPEC_FUZZ_TMPDIR");
    std::filesystem::path root = base && *base ? base : (std::filesystem::exists("/dev/shm") ? "/dev/shm" : "/tmp");
    std::filesystem::path d = root / ("pipec-fuzz-" + std::to_string(::getpid()));
    std::filesystem::create_directories(d);
    static struct Cleanup {
      std::filesystem::path p;
      ~Cleanup() {
        std::error_code ec;
        std::filesystem::remove_all(p, ec);
      }
    } cleanup{d};
    return d;
  }();
  return dir;
}

/// Writes `size` bytes to `name` inside the scratch directory; returns the path.
inline std::string writeInput(const std::string &name, const uint8_t *data, size_t size) {
  const std::filesystem::path p = scratchDir() / name;
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char *>(data), static_cast<std::streamsize>(size));
  out.close();
  if (!out) {
    std::fprintf(stderr, "fuzz: cannot write %s\n", p.c_str());
    std::abort();
  }
  return p.string();
}

inline std::string writeInput(const std::string &name, const std::string &text) {
  return writeInput(name, reinterpret_cast<const uint8_t *>(text.data()), text.size());
}

/// Sends std::cout and std::cerr to nowhere while alive: the tools print
/// tables and error messages, which would only slow the fuzzer down.
class QuietStreams {
public:
  QuietStreams() : out_(std::cout.rdbuf(&null_)), err_(std::cerr.rdbuf(&null_)) {}
  ~QuietStreams() {
    std::cout.rdbuf(out_);
    std::cerr.rdbuf(err_);
  }

private:
  struct NullBuffer : std::streambuf {
    int overflow(int c) override { return c == EOF ? 0 : c; }
    std::streamsize xsputn(const char *, std::streamsize n) override { return n; }
  } null_;
  std::streambuf *out_, *err_;
};

/// A property the reader promised but did not hold: a finding, reported
/// like a crash so that libFuzzer saves and minimizes the input.
[[noreturn]] inline void violated(const char *what) {
  std::fprintf(stderr, "fuzz: invariant violated: %s\n", what);
  std::fflush(stderr);
  std::abort();
}

} // namespace pipec::fuzz
