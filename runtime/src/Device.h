// Where a rank's tensors live and how the runtime touches them (issue 7).
// Every buffer the executor hands to a stage (parameters, gradients,
// optimizer state, per-micro-batch bundles, data, workspaces, stashed weight
// versions, snapshots) is allocated by a Device, and every host-side
// manipulation of those buffers (bundle headers, local copies, gradient
// scaling/sums/norms, data loading, checkpoints) goes through its operations:
//  * HostDevice (target cpu): host memory, every operation runs at once on
//    the calling thread (memset/memcpy/loops: the CPU path as it always was).
//  * CudaDevice (target cuda, CudaDevice.cpp, built with CUDA): device memory;
//    operations are enqueued on a stream (default: the rank's compute
//    stream, the one passed to the stage as pipec_call.stream) and only
//    upload/download/sumSquares/hostWait block the host.
// No MPI here (pipeseq links it too).
#pragma once

#include "pipec/stage_abi.h"
#include "pipec/synthetic_data.h"

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace pipec::rt {

// A device stream (cudaStream_t). nullptr names the device's compute stream;
// the host device has no streams and ignores them.
using Stream = void *;
// A device event (cudaEvent_t); nullptr on the host device, where every
// operation has completed when its call returns.
using Event = void *;

// A range of f32/f64 elements (gradient statistics).
struct Span {
  const void *p = nullptr;
  size_t n = 0;
  pipec_dtype dtype = PIPEC_F32;
};

class Device {
public:
  virtual ~Device() = default;
  virtual const char *name() const = 0; // "cpu" | "cuda" (the plan's runtime.target)
  bool host() const { return host_; }   // buffers are host memory
  virtual std::string describe() const = 0;
  // pipec_call.stream / pipec_optimizer_call.stream (nullptr on the host).
  virtual Stream computeStream() const { return nullptr; }

  // Zero-filled memory, 64-byte aligned; nullptr for 0 bytes. release() is
  // ordered after everything enqueued on the compute stream so far.
  virtual void *allocate(size_t bytes) = 0;
  virtual void release(void *p) noexcept = 0;
  // Host memory the device can transfer asynchronously (CUDA: pinned).
  virtual void *allocateHost(size_t bytes) = 0;
  virtual void releaseHost(void *p) noexcept = 0;

  // Stream-ordered (on `s`; the compute stream when nullptr).
  virtual void zero(void *p, size_t bytes, Stream s = nullptr) = 0;
  virtual void copy(void *dst, const void *src, size_t bytes, Stream s = nullptr) = 0; // device to device
  // At most 64 bytes from (any) host memory, which may be reused on return;
  // CUDA: a kernel argument, so no host sync and no staging buffer.
  virtual void writeSmall(void *dst, const void *hostSrc, size_t bytes, Stream s = nullptr) = 0;
  // Host <-> device with memory from allocateHost, complete when an event
  // recorded after them on `s` completes.
  virtual void uploadAsync(void *dst, const void *pinnedSrc, size_t bytes, Stream s = nullptr) = 0;
  virtual void downloadAsync(void *pinnedDst, const void *src, size_t bytes, Stream s = nullptr) = 0;
  // Blocking transfers with any host memory, ordered after the compute
  // stream's work (start-up, checkpoints, export).
  virtual void upload(void *dst, const void *hostSrc, size_t bytes) = 0;
  virtual void download(void *hostDst, const void *src, size_t bytes) = 0;

  // Element-wise on f32/f64 (other dtypes are an error), on the compute stream.
  virtual void scale(void *p, size_t n, pipec_dtype t, double factor) = 0; // x = (T)(x * factor)
  virtual void add(void *dst, const void *src, size_t n, pipec_dtype t) = 0; // dst += src
  // Adds the sum of squares (in double, of finite elements) and the number of
  // non-finite elements of the spans, in order, to sumSq and nonFinite.
  // Blocks the host until the compute stream got there (CUDA: one sync).
  virtual void sumSquares(const std::vector<Span> &spans, double &sumSq, double &nonFinite) = 0;
  // The same two sums written to stats[0], stats[1] (this device's memory),
  // on the compute stream: nothing waits (the optimizer step's check).
  virtual void gradientStats(const std::vector<Span> &spans, double *stats) = 0;
  // The optimizer step's verdict from the (reduced) stats, into `control`
  // (this device's memory), on the compute stream: skip when stats[1] > 0;
  // else grad_scale = maxNorm / sqrt(stats[0]) when maxNorm > 0 and the
  // norm exceeds it (clipping), 1 otherwise.
  virtual void stepControl(const double *stats, double maxNorm, pipec_step_control *control) = 0;
  // zero(p, bytes) unless control->skip: a skipped step's gradients stay
  // for the report that names them.
  virtual void zeroUnlessSkipped(void *p, size_t bytes, const pipec_step_control *control) = 0;
  // Writes samples [first, first + count) of a synthetic data field (the
  // bytes io::SyntheticData::read writes) into dst, this device's memory,
  // generating them there on the compute stream; nothing waits. CUDA only
  // (the kernels' syntheticData, docs/runtime.md "Data read ahead"): the
  // host device throws, its ranks read through io::SyntheticData.
  virtual void generateSynthetic(const io::SyntheticField &field, uint64_t first, uint64_t count, void *dst);

  // Unless bundle[0..compared) (this device's memory) equals expected[0..
  // compared) (host memory, at most 64 bytes), bundle[header..bytes) becomes
  // 0xff bytes, stream-ordered on `s`. The CUDA target checks a received
  // bundle's header on the host only once its copy arrived, after the
  // compute may have read it; this makes a wrong bundle unusable first (NaN,
  // -1). The host device does nothing: its receiver checks the header
  // before the compute (Executor::awaitBundle).
  virtual void guardBundle(void *bundle, size_t bytes, const void *expected, unsigned compared, unsigned header,
                           Stream s = nullptr) {
    (void)bundle, (void)bytes, (void)expected, (void)compared, (void)header, (void)s;
  }

  // Events (all no-ops on the host).
  virtual Event newEvent() { return nullptr; }
  virtual void deleteEvent(Event) noexcept {}
  virtual void record(Event, Stream = nullptr) {}
  virtual void streamWait(Stream, Event) {} // the stream waits (no host sync)
  virtual void hostWait(Event) {}
  virtual bool query(Event) { return true; } // completed?
  virtual void synchronize() {}              // every stream of this device
  // Makes this device current for the calling thread (a thread of the
  // runtime's own, before its first device call; CUDA: cudaSetDevice).
  virtual void bindThread() {}

protected:
  explicit Device(bool host) : host_(host) {}

private:
  bool host_;
};

// The process's host device (target cpu); pipeseq and tools use it.
Device &hostDevice();

// Host memory from Device::allocateHost, freed with it.
class HostBuffer {
public:
  HostBuffer() = default;
  HostBuffer(Device &d, size_t bytes) : dev_(&d), p_((char *)d.allocateHost(bytes)), n_(bytes) {}
  HostBuffer(HostBuffer &&o) noexcept : dev_(o.dev_), p_(o.p_), n_(o.n_) { o.p_ = nullptr, o.n_ = 0; }
  HostBuffer &operator=(HostBuffer &&o) noexcept {
    if (this != &o) {
      reset();
      dev_ = o.dev_, p_ = o.p_, n_ = o.n_;
      o.p_ = nullptr, o.n_ = 0;
    }
    return *this;
  }
  ~HostBuffer() { reset(); }
  char *data() { return p_; }
  size_t size() const { return n_; }

private:
  void reset() {
    if (p_) dev_->releaseHost(p_);
    p_ = nullptr, n_ = 0;
  }
  Device *dev_ = nullptr;
  char *p_ = nullptr;
  size_t n_ = 0;
};

} // namespace pipec::rt
