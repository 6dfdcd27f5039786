// The bundles SEND_ACT/SEND_GRAD move between ranks (docs/runtime.md, "How a
// rank executes its stream"): their header, their message tag, and on the
// CUDA target the checks of received headers that arrive after the host
// moved on.
#pragma once

#include "Device.h"
#include "Plan.h"

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace pipec::rt {

// Every activation/gradient bundle starts with this header: the receiver
// checks that it got the micro-batch, iteration, direction, weight version
// and tensor layout it expected, so a schedule/plan mismatch is an error,
// never silently wrong numbers.
struct BundleHeader {
  uint64_t magic;
  int64_t iteration;
  int32_t mb, vs, kind, version; // vs: receiving virtual stage; kind 0 act, 1 grad
  uint64_t layoutHash;
  uint64_t bytes;
  uint64_t reserved[2];
};
static_assert(sizeof(BundleHeader) == 64, "the bundle header occupies the 64 bytes Layout reserves");

inline constexpr uint64_t kBundleMagic = 0x31454c444e554250ULL; // "PBUNDLE1"
// The header's bytes a receiver checks (magic .. layoutHash: what
// headerError compares).
inline constexpr unsigned kCheckedHeaderBytes = offsetof(BundleHeader, bytes);

// What a receiver of the bundle of `in` expects, as a SEND writes it:
// `vs` is the receiving virtual stage, `layoutHash`/`bytes` its layout's.
BundleHeader bundleHeader(const Instr &in, int64_t iteration, bool grad, int vs, uint64_t layoutHash,
                          uint64_t bytes);
// "" when `h` is the header the receive `in` expects, else why not.
std::string headerError(const BundleHeader &h, const Instr &in, int64_t iteration, bool grad, int vs,
                        uint64_t layoutHash);
// Distinct per (micro-batch, direction, receiving virtual stage) among V.
inline int bundleTag(int mb, bool grad, int vsDest, int V) { return (mb * 2 + (grad ? 1 : 0)) * V + vsDest; }

// CUDA target: received headers on their way to pinned host memory, checked
// once they arrived, without stalling the host at the RECV.
class HeaderChecks {
public:
  explicit HeaderChecks(Device &device) : device_(device) {}
  ~HeaderChecks();
  HeaderChecks(const HeaderChecks &) = delete;
  HeaderChecks &operator=(const HeaderChecks &) = delete;

  // Enqueues on `stream`, behind the receive into `bundle`, the copy of its
  // header; `context` prefixes an error ("schedule/rank_1.json #5 RECV_ACT
  // mb=2 chunk=0 peer=0 (iteration 0)").
  void expect(Stream stream, const char *bundle, const Instr &in, int64_t iteration, bool grad, int vs,
              uint64_t layoutHash, std::string context);
  // Checks the headers that arrived (all of them, waiting, when `block`);
  // throws Error for the first wrong one.
  void poll(bool block);

private:
  struct Pending {
    Event event = nullptr;
    char *host = nullptr; // 64 pinned bytes
    Instr in;
    int64_t iteration = 0;
    bool grad = false;
    int vs = 0;
    uint64_t layoutHash = 0;
    std::string context;
  };
  char *takePinned();
  Event takeEvent();

  Device &device_;
  std::vector<Pending> pending_;
  std::vector<char *> freeHeaders_;
  std::vector<HostBuffer> headerBlocks_;
  std::vector<Event> freeEvents_, allEvents_;
};

} // namespace pipec::rt
