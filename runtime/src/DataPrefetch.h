// Training data read ahead (docs/runtime.md, "Data"): a host thread reads the
// micro-batches a rank's stream will load, in the order it loads them, into a
// ring of pinned buffers; the executor's LOAD/FWD only enqueues the copy to
// the device. The synthetic generator and the --data readers then run beside
// the device's work instead of between its launches.
#pragma once

#include "Device.h"
#include "StageData.h"

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace pipec::rt {

class DataPrefetch {
public:
  // One load: the data fields of chunk `chunk` for micro-batch `mb`.
  struct Load {
    int chunk = 0, mb = 0;
  };
  // `order`: the loads of one iteration, in stream order (the same every
  // iteration); iterations [firstIteration, iterations). `bytes[c]`: chunk
  // c's data layout size. Starts the thread.
  DataPrefetch(StageData &source, Device &device, std::vector<Load> order, std::vector<size_t> bytes,
               int64_t firstIteration, int64_t iterations);
  ~DataPrefetch();
  DataPrefetch(const DataPrefetch &) = delete;
  DataPrefetch &operator=(const DataPrefetch &) = delete;

  // The next load, which must be (it, chunk, mb): its fields copied to `dst`
  // (device memory, stream-ordered on the compute stream). Rethrows what
  // reading it threw; an Error when the stream asks in another order.
  void copyNext(int64_t it, int chunk, int mb, void *dst);

private:
  static constexpr int kBuffers = 4; // micro-batches read ahead
  struct Buffer {
    HostBuffer host;
    Event copied = nullptr; // the device copy out of `host` (recorded by copyNext)
    std::exception_ptr error;
  };
  void run(); // the thread
  Load loadOf(int64_t job) const { return order_[(size_t)(job % (int64_t)order_.size())]; }
  int64_t iterationOf(int64_t job) const { return firstIteration_ + job / (int64_t)order_.size(); }

  StageData &source_;
  Device &device_;
  const std::vector<Load> order_;
  const std::vector<size_t> bytes_;
  const int64_t firstIteration_, jobs_;
  std::vector<Buffer> buffers_;

  std::mutex mutex_;
  std::condition_variable changed_;
  int64_t read_ = 0;     // jobs read (the thread's next job)
  int64_t consumed_ = 0; // jobs copied out (copyNext's next job)
  bool stop_ = false;
  std::thread thread_;
};

} // namespace pipec::rt
