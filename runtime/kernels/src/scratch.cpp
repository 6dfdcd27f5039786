// Where a CPU kernel call's scratch comes from (detail::Scratch,
// pipec/kernel_scratch.h): the caller's workspace, or growable buffers.
#include "detail.h"

#include <new>

namespace pipec::kernels::detail {

namespace {
/// A 64-byte aligned buffer that only grows: once it fits a call, later
/// calls allocate nothing.
class GrowableBuffer {
public:
  GrowableBuffer() = default;
  GrowableBuffer(const GrowableBuffer &) = delete;
  GrowableBuffer &operator=(const GrowableBuffer &) = delete;
  ~GrowableBuffer() { release(); }
  char *reserve(int64_t bytes) {
    if (bytes > bytes_) {
      release();
      data_ = static_cast<char *>(::operator new((size_t)bytes, std::align_val_t(kScratchAlignment)));
      bytes_ = bytes;
    }
    return data_;
  }

private:
  void release() {
    if (data_) ::operator delete(data_, std::align_val_t(kScratchAlignment));
    data_ = nullptr;
    bytes_ = 0;
  }
  char *data_ = nullptr;
  int64_t bytes_ = 0;
};

/// The calling thread's growable buffers, one pair per nesting depth (a
/// kernel that takes scratch while an outer call holds its own).
constexpr int kDepths = 4;
thread_local GrowableBuffer sharedBuffers[kDepths], perThreadBuffers[kDepths];
thread_local int depth = 0;
} // namespace

Scratch::Scratch(const char *op, const Workspace &ws, const ScratchNeed &need) {
  const int team = kernels::threads();
  if (ws.bound()) {
    if (ws.sharedBytes < need.shared ||
        (need.perThread > 0 && (ws.perThreadBytes < need.perThread || ws.threads < team)))
      fail(op, "the workspace holds " + std::to_string(ws.sharedBytes) + " shared bytes and " +
                   std::to_string(ws.threads) + " x " + std::to_string(ws.perThreadBytes) +
                   " per thread, the call needs " + std::to_string(need.shared) + " and " +
                   std::to_string(team) + " x " + std::to_string(need.perThread));
    next_ = static_cast<char *>(ws.shared);
    perThread_ = static_cast<char *>(ws.perThread);
    perThreadBytes_ = ws.perThreadBytes;
    return;
  }
  if (depth >= kDepths) fail(op, "kernel scratch nested more than " + std::to_string(kDepths) + " deep");
  next_ = sharedBuffers[depth].reserve(need.shared);
  perThread_ = perThreadBuffers[depth].reserve(need.perThread * team);
  perThreadBytes_ = need.perThread;
  growable_ = true;
  ++depth;
}

Scratch::~Scratch() {
  if (growable_) --depth;
}

} // namespace pipec::kernels::detail
