#include "Bundle.h"

#include <cstring>

namespace pipec::rt {

BundleHeader bundleHeader(const Instr &in, int64_t iteration, bool grad, int vs, uint64_t layoutHash,
                          uint64_t bytes) {
  BundleHeader h{};
  h.magic = kBundleMagic;
  h.iteration = iteration;
  h.mb = in.mb;
  h.vs = vs;
  h.kind = grad ? 1 : 0;
  h.version = in.version;
  h.layoutHash = layoutHash;
  h.bytes = bytes;
  return h;
}

std::string headerError(const BundleHeader &h, const Instr &in, int64_t it, bool grad, int vs, uint64_t layoutHash) {
  if (h.magic != kBundleMagic || h.iteration != it || h.mb != in.mb || h.vs != vs || h.kind != (grad ? 1 : 0) ||
      h.layoutHash != layoutHash)
    return toString(in) + ": received a bundle for iteration " + std::to_string(h.iteration) + " micro-batch " +
           std::to_string(h.mb) + " stage " + std::to_string(h.vs) + (h.layoutHash != layoutHash ? " with another tensor layout" : "") +
           "; the ranks' schedules disagree";
  if (h.version != in.version)
    return toString(in) + ": activation carries weight version " + std::to_string(h.version) + ", the stream expects " +
           std::to_string(in.version);
  return "";
}

HeaderChecks::~HeaderChecks() {
  // Normally drained by the end of every iteration; after an error nothing
  // is waited for.
  for (Event e : allEvents_) device_.deleteEvent(e);
}

void HeaderChecks::expect(Stream stream, const char *bundle, const Instr &in, int64_t iteration, bool grad, int vs,
                          uint64_t layoutHash, std::string context) {
  Pending p;
  p.host = takePinned();
  p.event = takeEvent();
  device_.downloadAsync(p.host, bundle, sizeof(BundleHeader), stream);
  device_.record(p.event, stream);
  p.in = in, p.iteration = iteration, p.grad = grad, p.vs = vs, p.layoutHash = layoutHash;
  p.context = std::move(context);
  pending_.push_back(std::move(p));
}

void HeaderChecks::poll(bool block) {
  for (size_t k = 0; k < pending_.size();) {
    Pending &p = pending_[k];
    if (!block && !device_.query(p.event)) {
      ++k;
      continue;
    }
    device_.hostWait(p.event);
    BundleHeader h;
    std::memcpy(&h, p.host, sizeof h);
    const std::string e = headerError(h, p.in, p.iteration, p.grad, p.vs, p.layoutHash);
    const std::string context = p.context;
    freeHeaders_.push_back(p.host);
    freeEvents_.push_back(p.event);
    pending_.erase(pending_.begin() + k);
    if (!e.empty()) throw Error(context + ": " + e);
  }
}

char *HeaderChecks::takePinned() {
  if (freeHeaders_.empty()) { // blocks of 256 headers: pinned memory is allocated in pages
    headerBlocks_.emplace_back(device_, 256 * sizeof(BundleHeader));
    for (int k = 255; k >= 0; --k) freeHeaders_.push_back(headerBlocks_.back().data() + k * sizeof(BundleHeader));
  }
  char *p = freeHeaders_.back();
  freeHeaders_.pop_back();
  return p;
}

Event HeaderChecks::takeEvent() {
  if (freeEvents_.empty()) {
    allEvents_.push_back(device_.newEvent());
    return allEvents_.back();
  }
  Event e = freeEvents_.back();
  freeEvents_.pop_back();
  return e;
}

} // namespace pipec::rt
