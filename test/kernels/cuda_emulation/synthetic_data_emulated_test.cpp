// cuda-synthetic-data-emulated: pc::syntheticData, the kernel that generates
// piperun's synthetic data set on a CUDA rank's device (docs/runtime.md,
// "Data read ahead"), under the host emulation of
// cuda_kernels_emulated_test.cpp, against io::SyntheticData::read, the host
// generator it replaces: the same bytes, bit for bit, for every dtype, value
// range, field index and seed, from an offset first sample, across the wrap
// of the sample indices (modulo the set's size) and at a first index near
// 2^64. Each call is one launch on the scope's stream that nothing waits
// for, writes nothing past its samples, and replays from a CUDA graph.
#include "pipec/cuda_kernels.h"
#include "pipec/dataset.h"
#include "cuda_runtime.h"
#include "emu.h"

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace pc = pipec::kernels::cuda;
namespace io = pipec::io;

static int failures = 0, checks = 0;

static void expect(bool ok, const std::string &what) {
  ++checks;
  if (!ok) {
    std::printf("FAIL %s\n", what.c_str());
    ++failures;
  }
}

// Device memory is host memory under the emulation: a buffer with guard
// bytes after the samples, so that a write past them shows.
static constexpr size_t kGuard = 64;
static constexpr unsigned char kGuardByte = 0xa5;

static std::vector<unsigned char> guarded(size_t bytes) { return std::vector<unsigned char>(bytes + kGuard, kGuardByte); }

static bool guardIntact(const std::vector<unsigned char> &buffer, size_t bytes) {
  for (size_t i = bytes; i < buffer.size(); ++i)
    if (buffer[i] != kGuardByte) return false;
  return true;
}

// Samples [first, first + count) of every field of `data`, on the device and
// on the host.
static void compareFields(io::SyntheticData &data, uint64_t first, uint64_t count, const std::string &name) {
  for (size_t f = 0; f < data.fields().size(); ++f) {
    const io::FieldSpec &spec = data.fields()[f];
    const std::string what = name + ": field " + spec.name + " (" + io::dtypeName(spec.dtype) + "), samples " +
                             std::to_string(first) + " + " + std::to_string(count);
    const size_t bytes = spec.sampleBytes() * count;
    std::vector<unsigned char> host(bytes), device = guarded(bytes);
    data.read(f, first, count, host.data());
    const int launches = emu::launches;
    const long syncs = emu::hostSyncs, allocations = emu::deviceAllocations;
    pc::syntheticData(data.valuesOf(f), first, count, device.data());
    expect(std::memcmp(host.data(), device.data(), bytes) == 0, what + ": the device's bytes differ from the host's");
    expect(guardIntact(device, bytes), what + ": wrote past its samples");
    expect(emu::launches == launches + (bytes ? 1 : 0), what + ": " + std::to_string(emu::launches - launches) +
                                                            " launches, expected one");
    expect(emu::hostSyncs == syncs && emu::deviceAllocations == allocations, what + ": waited or allocated");
  }
}

static std::vector<io::FieldSpec> fieldsOfEveryDtype() {
  auto field = [](std::string name, int dtype, std::vector<int64_t> shape, double low, double high) {
    io::FieldSpec f;
    f.name = std::move(name), f.dtype = dtype, f.shape = std::move(shape), f.low = low, f.high = high;
    return f;
  };
  return {field("x", PIPEC_F32, {3, 5}, -2.5, 7.0),    field("y", PIPEC_F64, {4}, -1.0, 1.0),
          field("labels", PIPEC_I64, {2}, 0, 10),      field("ids", PIPEC_I32, {3, 3}, -5, 5),
          field("mask", PIPEC_BOOL, {7}, 0, 2),        field("wide", PIPEC_F32, {33}, -1e6, 3e-3),
          field("classes", PIPEC_I64, {1}, 0, 50257),  field("scalar", PIPEC_F32, {}, 0, 1)};
}

int main() {
  void *fakeStream = (void *)0x5d47;
  emu::expectedStream = (cudaStream_t)fakeStream;
  pc::StreamScope scope(fakeStream, pc::Precision::F32);

  // Every dtype, several fields and ranges; offsets inside the set, across
  // its wrap (11 samples: 5 + 17 wraps once, 3 + 40 several times), and
  // first indices beyond 2^32 and near 2^64.
  io::SyntheticData data(fieldsOfEveryDtype(), 11, 1234);
  compareFields(data, 0, 4, "seed 1234");
  compareFields(data, 5, 17, "seed 1234");
  compareFields(data, 3, 40, "seed 1234");
  compareFields(data, (uint64_t(1) << 33) + 7, 6, "seed 1234");
  compareFields(data, ~uint64_t(0) - 2, 5, "seed 1234");
  compareFields(data, 9, 0, "seed 1234");
  io::SyntheticData otherSeed(fieldsOfEveryDtype(), 64, 0);
  compareFields(otherSeed, 60, 9, "seed 0");
  io::SyntheticData single(fieldsOfEveryDtype(), 1, 99);
  compareFields(single, 2, 3, "one sample");

  // A field's key depends on its index and the seed: the kernel reads them
  // from SyntheticField, so two fields of one spec still differ.
  {
    std::vector<io::FieldSpec> twins(2, fieldsOfEveryDtype()[0]);
    twins[1].name = "twin";
    io::SyntheticData set(twins, 8, 7);
    const size_t bytes = twins[0].sampleBytes() * 4;
    std::vector<unsigned char> a(bytes), b(bytes);
    pc::syntheticData(set.valuesOf(0), 0, 4, a.data());
    pc::syntheticData(set.valuesOf(1), 0, 4, b.data());
    expect(a != b, "two fields of one spec generate different values");
  }

  // Captured into a CUDA graph, the call replays what it captured (its
  // arguments are its values: piperun launches it outside the graphs).
  {
    const io::SyntheticField field = data.valuesOf(0);
    const size_t bytes = data.fields()[0].sampleBytes() * 6;
    std::vector<unsigned char> host(bytes), device = guarded(bytes);
    data.read(0, 8, 6, host.data());
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    expect(cudaStreamBeginCapture((cudaStream_t)fakeStream, cudaStreamCaptureModeThreadLocal) == cudaSuccess,
           "capture begins");
    pc::syntheticData(field, 8, 6, device.data());
    expect(cudaStreamEndCapture((cudaStream_t)fakeStream, &graph) == cudaSuccess && graph,
           "the call is captured (no host wait, no allocation)");
    expect(guardIntact(device, bytes) && device[0] == kGuardByte, "a captured call runs nothing");
    if (graph) {
      cudaGraphInstantiate(&exec, graph, 0);
      cudaGraphLaunch(exec, (cudaStream_t)fakeStream);
      expect(std::memcmp(host.data(), device.data(), bytes) == 0 && guardIntact(device, bytes),
             "the replayed graph writes the host's bytes");
      cudaGraphExecDestroy(exec);
      cudaGraphDestroy(graph);
    }
  }

  // A dtype the data sets do not have is refused, naming the kernel.
  {
    io::SyntheticField field = data.valuesOf(0);
    field.dtype = 99;
    std::string error;
    try {
      float out[16];
      pc::syntheticData(field, 0, 1, out);
    } catch (const pc::KernelError &e) {
      error = e.what();
    }
    expect(error.find("syntheticData") != std::string::npos, "dtype 99 refused (got \"" + error + "\")");
  }

  std::printf("%d checks, %d failures\n", checks, failures);
  return failures ? 1 : 0;
}
