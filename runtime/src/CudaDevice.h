// The CUDA target's Device (issue 7): the rank's GPU, its compute stream
// (pipec_call.stream), stream-ordered memory and a few small kernels
// (CudaKernels.cu). Built only with CUDA (runtime/cmake/cuda.cmake).
#pragma once

#include "Device.h"

#include <cuda_runtime.h>

#include <functional>
#include <string>
#include <thread>
#include <vector>

namespace pipec::rt {

// Throws Error("WHAT failed: <CUDA's message> (<its name>)") unless e is cudaSuccess.
void checkCuda(cudaError_t e, const char *what);

class CudaDevice final : public Device {
public:
  // Must be the process's first CUDA call: uses device localRank modulo the
  // visible devices (node-local rank: one GPU per rank when the ranks of a
  // node are as many as its GPUs) and creates the compute stream. Throws
  // Error naming the reason when no device is usable.
  explicit CudaDevice(int localRank);
  ~CudaDevice() override;
  CudaDevice(const CudaDevice &) = delete;
  CudaDevice &operator=(const CudaDevice &) = delete;

  const char *name() const override { return "cuda"; }
  std::string describe() const override; // "NVIDIA H100 80GB HBM3 (sm_90, device 0 of 8, CUDA runtime ..., cuDNN ...)"
  /// The cuDNN the stages' flash attention runs with, or why none.
  static std::string cudnnDescription();
  int ordinal() const { return ordinal_; }
  // The GPU's UUID (cudaDeviceProp::uuid): the same physical GPU seen by two
  // ranks has the same one, whatever CUDA_VISIBLE_DEVICES says.
  const std::string &uuid() const { return uuid_; }
  Stream computeStream() const override { return compute_; }
  cudaStream_t streamOf(Stream s) const { return s ? (cudaStream_t)s : compute_; }
  // runtime.cuda_arch lists what the stage libraries contain (machine code
  // only, no PTX: pipec compiles with -gencode arch=compute_XY,code=sm_XY),
  // which runs on a GPU of the same major version and an equal or higher
  // minor one. Throws when nothing fits this GPU; no-op for an empty list.
  void checkArchitectures(const std::vector<std::string> &archs) const;

  // Between polls while the host waits for the device (hostWait, upload,
  // download, sumSquares, await, awaitStream), `check` runs: the
  // transport's, which throws on NCCL's asynchronous errors, so that a failed
  // or lost peer ends the wait with an error instead of never. None: the
  // waits block in CUDA. Set, run and cleared only on the thread that made
  // this device (the rank's); other threads' waits (the data read-ahead's)
  // block in CUDA and never touch it.
  void setWaitCheck(std::function<void()> check);
  // The host waits for an event, or for the work enqueued on a stream so
  // far, watching the check above.
  void await(cudaEvent_t e, const char *what);
  void awaitStream(cudaStream_t s, const char *what);
  // Gives the memory the stream-ordered pool keeps for reuse back to the
  // driver (before NCCL allocates its own buffers, outside the pool).
  void releaseCachedMemory();

  void *allocate(size_t bytes) override;
  void release(void *p) noexcept override;
  void *allocateHost(size_t bytes) override;
  void releaseHost(void *p) noexcept override;
  void zero(void *p, size_t bytes, Stream s) override;
  void copy(void *dst, const void *src, size_t bytes, Stream s) override;
  void writeSmall(void *dst, const void *src, size_t bytes, Stream s) override;
  void uploadAsync(void *dst, const void *src, size_t bytes, Stream s) override;
  void downloadAsync(void *dst, const void *src, size_t bytes, Stream s) override;
  void upload(void *dst, const void *src, size_t bytes) override;
  void download(void *dst, const void *src, size_t bytes) override;
  void scale(void *p, size_t n, pipec_dtype t, double factor) override;
  void add(void *dst, const void *src, size_t n, pipec_dtype t) override;
  void sumSquares(const std::vector<Span> &spans, double &sumSq, double &nonFinite) override;
  void gradientStats(const std::vector<Span> &spans, double *stats) override;
  void stepControl(const double *stats, double maxNorm, pipec_step_control *control) override;
  void zeroUnlessSkipped(void *p, size_t bytes, const pipec_step_control *control) override;
  void generateSynthetic(const io::SyntheticField &field, uint64_t first, uint64_t count, void *dst) override;
  void guardBundle(void *bundle, size_t bytes, const void *expected, unsigned compared, unsigned header,
                   Stream s) override;
  Event newEvent() override;
  void deleteEvent(Event e) noexcept override;
  void record(Event e, Stream s) override;
  void streamWait(Stream s, Event e) override;
  void hostWait(Event e) override;
  bool query(Event e) override;
  void synchronize() override;
  void bindThread() override;

private:
  bool watching() const { return waitCheck_ && std::this_thread::get_id() == owner_; }
  std::function<void()> waitCheck_;
  const std::thread::id owner_ = std::this_thread::get_id();
  cudaEvent_t streamDone_ = nullptr; // awaitStream's
  int ordinal_ = 0, count_ = 0, major_ = 0, minor_ = 0;
  std::string gpuName_, uuid_;
  cudaStream_t compute_ = nullptr;
  double *partials_ = nullptr; // gradientStats: per-block partial sums
  size_t partialsCap_ = 0;     // pairs
  double *stats_ = nullptr;    // sumSquares: the two results on the device
  double *result_ = nullptr;   // pinned host copy of the two results
};

} // namespace pipec::rt
