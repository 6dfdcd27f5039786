#include "DataPrefetch.h"

#include <algorithm>

namespace pipec::rt {

DataPrefetch::DataPrefetch(StageData &source, Device &device, std::vector<Load> order, std::vector<size_t> bytes,
                           int64_t firstIteration, int64_t iterations)
    : source_(source), device_(device), order_(std::move(order)), bytes_(std::move(bytes)),
      firstIteration_(firstIteration),
      jobs_(order_.empty() ? 0 : std::max<int64_t>(0, iterations - firstIteration) * (int64_t)order_.size()),
      buffers_(kBuffers) {
  if (jobs_ == 0) return;
  const size_t largest = *std::max_element(bytes_.begin(), bytes_.end());
  for (Buffer &b : buffers_) {
    b.host = HostBuffer(device_, largest);
    b.copied = device_.newEvent();
  }
  thread_ = std::thread([this] { run(); });
}

DataPrefetch::~DataPrefetch() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  changed_.notify_all();
  if (thread_.joinable()) thread_.join();
  for (Buffer &b : buffers_) device_.deleteEvent(b.copied);
}

void DataPrefetch::run() {
  try {
    device_.bindThread(); // the events it waits for are the rank's device's
  } catch (...) {
    std::lock_guard<std::mutex> lock(mutex_);
    buffers_[0].error = std::current_exception(), read_ = 1;
    changed_.notify_all();
    return;
  }
  for (int64_t job = 0; job < jobs_; ++job) {
    Buffer &b = buffers_[(size_t)(job % kBuffers)];
    {
      std::unique_lock<std::mutex> lock(mutex_);
      changed_.wait(lock, [&] { return stop_ || job - consumed_ < kBuffers; }); // its previous job copied out
      if (stop_) return;
    }
    device_.hostWait(b.copied); // the copy out of it has run
    const Load load = loadOf(job);
    std::exception_ptr error;
    try {
      source_.read(load.chunk, iterationOf(job), load.mb, b.host.data());
    } catch (...) {
      error = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      b.error = error;
      read_ = job + 1;
    }
    changed_.notify_all();
    if (error) return; // copyNext rethrows it; nothing after it is read
  }
}

void DataPrefetch::copyNext(int64_t it, int chunk, int mb, void *dst) {
  std::unique_lock<std::mutex> lock(mutex_);
  const int64_t job = consumed_;
  const Load want = job < jobs_ ? loadOf(job) : Load{-1, -1};
  if (job >= jobs_ || iterationOf(job) != it || want.chunk != chunk || want.mb != mb)
    throw Error("data read-ahead: the stream loads micro-batch " + std::to_string(mb) + " of chunk " +
                std::to_string(chunk) + " in iteration " + std::to_string(it) + ", but the order read ahead " +
                (job >= jobs_ ? std::string("has ended")
                              : "expects micro-batch " + std::to_string(want.mb) + " of chunk " +
                                    std::to_string(want.chunk) + " in iteration " + std::to_string(iterationOf(job))));
  changed_.wait(lock, [&] { return read_ > job; });
  Buffer &b = buffers_[(size_t)(job % kBuffers)];
  if (b.error) std::rethrow_exception(b.error);
  lock.unlock();
  device_.uploadAsync(dst, b.host.data(), bytes_[(size_t)chunk]);
  device_.record(b.copied);
  lock.lock();
  consumed_ = job + 1;
  lock.unlock();
  changed_.notify_all();
}

} // namespace pipec::rt
