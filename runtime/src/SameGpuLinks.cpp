#include "SameGpuLinks.h"

#include "MpiTransport.h" // checkMpi
#include "Plan.h"         // Error

#include <cstdlib>
#include <cstring>

namespace pipec::rt {

namespace {
// The links' message tags on their private communicator.
enum Tag : int { kOffer = 1, kEvents = 2, kSent = 3, kTook = 4, kData = 5, kOpened = 6 };

// Slots start on 256-byte boundaries, as cudaMalloc's allocations do.
size_t slotBytes(size_t bytes) { return (bytes + 255) / 256 * 256; }

// What the receiver of a pair offers the sender at start-up.
struct Offer {
  int32_t ipc = 0;
  uint64_t capacity = 0; // bytes per slot
  cudaIpcMemHandle_t memory{};
  cudaIpcEventHandle_t consumed[SameGpuLinks::kSlots]{};
  char why[200] = {}; // why not IPC
};
// What the sender gives the receiver.
struct SenderEvents {
  int32_t ok = 0;
  cudaIpcEventHandle_t filled[SameGpuLinks::kSlots]{};
  char why[200] = {};
};

void setWhy(char (&field)[200], const std::string &text) {
  std::strncpy(field, text.c_str(), sizeof field - 1);
  field[sizeof field - 1] = '\0';
}

// Events another process can wait on (CUDA requires them without timing).
cudaError_t newIpcEvents(cudaEvent_t (&events)[SameGpuLinks::kSlots], cudaIpcEventHandle_t (&handles)[SameGpuLinks::kSlots]) {
  for (int s = 0; s < SameGpuLinks::kSlots; ++s) {
    cudaError_t e = cudaEventCreateWithFlags(&events[s], cudaEventInterprocess | cudaEventDisableTiming);
    if (e == cudaSuccess) e = cudaIpcGetEventHandle(&handles[s], events[s]);
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}
void destroyEvents(cudaEvent_t (&events)[SameGpuLinks::kSlots]) noexcept {
  for (cudaEvent_t &e : events)
    if (e) (void)cudaEventDestroy(e), e = nullptr;
}
} // namespace

SameGpuLinks::Preference SameGpuLinks::preferenceFromEnvironment() {
  const char *v = std::getenv("PIPEC_SAME_GPU_TRANSPORT");
  Preference p = Preference::Auto;
  if (v && *v && !parseChoice(v, p))
    throw Error("PIPEC_SAME_GPU_TRANSPORT is \"" + std::string(v) + "\"; it takes " +
                choiceNames<SameGpuTransport>(" or "));
  return p;
}

SameGpuLinks::SameGpuLinks(CudaDevice &device) : device_(device) {
  checkMpi(MPI_Comm_dup(MPI_COMM_WORLD, &comm_), "MPI_Comm_dup");
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
}

SameGpuLinks::~SameGpuLinks() {
  for (auto &[key, l] : links_) drain(l);
  for (auto &[key, l] : links_) {
    if (l.stream) (void)cudaStreamSynchronize(l.stream);
    if (l.slots) (void)(l.send ? cudaIpcCloseMemHandle(l.slots) : cudaFree(l.slots));
    destroyEvents(l.filled);
    destroyEvents(l.consumed);
    destroyEvents(l.uploaded);
    if (l.pinned) (void)cudaFreeHost(l.pinned);
    if (l.stream) (void)cudaStreamDestroy(l.stream);
  }
  if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

// The messages a finished run leaves in flight: the receiver's last "took"
// notices, which the sender had no further message to wait for.
void SameGpuLinks::drain(Link &l) noexcept {
  if (l.send && l.mode == Mode::Ipc)
    while (l.credits < l.messages) {
      uint64_t took = 0;
      if (MPI_Recv(&took, sizeof took, MPI_BYTE, l.peer, kTook, comm_, MPI_STATUS_IGNORE) != MPI_SUCCESS) break;
      ++l.credits;
    }
  for (MPI_Request &r : l.requests)
    if (r != MPI_REQUEST_NULL) (void)MPI_Wait(&r, MPI_STATUS_IGNORE);
}

void SameGpuLinks::connect(const std::vector<std::pair<int, int>> &pairs, const std::map<int, size_t> &receiveBytes,
                           Preference preference, int highPriority) {
  int me = 0;
  checkMpi(MPI_Comm_rank(comm_, &me), "MPI_Comm_rank");
  std::vector<Offer> offers(pairs.size());
  std::vector<SenderEvents> events(pairs.size());
  std::vector<MPI_Request> requests;
  // Every end makes its offer or events, posts both messages whatever
  // happened, and reports a failure only after the exchange: a rank that
  // threw before sending would leave its peer waiting here.
  std::string error;
  auto failed = [&](const std::string &why) {
    if (error.empty()) error = why;
  };
  // Posts this end's message of a round to `peer` and the receive of the
  // peer's (waited for together, after the round).
  auto exchange = [&](const void *out, int outBytes, int outTag, void *in, int inBytes, int inTag, int peer,
                      const char *what) {
    requests.emplace_back();
    checkMpi(MPI_Isend(out, outBytes, MPI_BYTE, peer, outTag, comm_, &requests.back()), what);
    requests.emplace_back();
    checkMpi(MPI_Irecv(in, inBytes, MPI_BYTE, peer, inTag, comm_, &requests.back()), what);
  };
  for (size_t k = 0; k < pairs.size(); ++k) {
    const auto [from, to] = pairs[k];
    Link l;
    l.send = from == me;
    l.peer = l.send ? to : from;
    for (MPI_Request &r : l.requests) r = MPI_REQUEST_NULL;
    if (cudaStreamCreateWithPriority(&l.stream, cudaStreamNonBlocking, highPriority) != cudaSuccess)
      failed(std::string("cudaStreamCreateWithPriority failed: ") + cudaGetErrorString(cudaGetLastError()));
    if (!l.send) {
      Offer &o = offers[k];
      auto bytes = receiveBytes.find(from);
      if (bytes == receiveBytes.end()) failed("internal: no receive size for the transfers from rank " + std::to_string(from));
      l.capacity = slotBytes(bytes == receiveBytes.end() ? 0 : bytes->second);
      o.capacity = l.capacity;
      if (preference == Preference::Staged) {
        setWhy(o.why, "PIPEC_SAME_GPU_TRANSPORT=staged");
      } else {
        cudaError_t e = cudaMalloc((void **)&l.slots, kSlots * l.capacity);
        if (e == cudaSuccess) e = cudaIpcGetMemHandle(&o.memory, l.slots);
        if (e == cudaSuccess) e = newIpcEvents(l.consumed, o.consumed);
        o.ipc = e == cudaSuccess;
        if (!o.ipc) (void)cudaGetLastError(), setWhy(o.why, std::string("CUDA IPC refused: ") + cudaGetErrorString(e));
      }
      exchange(&o, sizeof o, kOffer, &events[k], sizeof events[k], kEvents, from, "posting the same-GPU offer");
    } else {
      SenderEvents &ev = events[k];
      if (preference != Preference::Staged) {
        const cudaError_t e = newIpcEvents(l.filled, ev.filled);
        ev.ok = e == cudaSuccess;
        if (!ev.ok) (void)cudaGetLastError(), setWhy(ev.why, std::string("CUDA IPC events refused: ") + cudaGetErrorString(e));
      }
      exchange(&ev, sizeof ev, kEvents, &offers[k], sizeof offers[k], kOffer, to, "posting the same-GPU events");
    }
    links_[{l.peer, l.send}] = l;
  }
  checkMpi(MPI_Waitall((int)requests.size(), requests.data(), MPI_STATUSES_IGNORE), "MPI_Waitall (same-GPU links)");
  // Round 2: each end opens what the other exported, and both learn whether
  // the other could (IPC is more often refused at the open, in another
  // process, than at the export).
  std::vector<int32_t> opened(pairs.size(), 0), peerOpened(pairs.size(), 0);
  requests.clear();
  for (size_t k = 0; k < pairs.size(); ++k) {
    const auto [from, to] = pairs[k];
    const bool send = from == me;
    Link &l = link(send ? to : from, send);
    const Offer &o = offers[k];
    const SenderEvents &ev = events[k];
    l.capacity = o.capacity;
    if (o.ipc && ev.ok) {
      cudaError_t e = cudaSuccess;
      if (send) {
        e = cudaIpcOpenMemHandle((void **)&l.slots, o.memory, cudaIpcMemLazyEnablePeerAccess);
        for (int slot = 0; slot < kSlots && e == cudaSuccess; ++slot)
          e = cudaIpcOpenEventHandle(&l.consumed[slot], o.consumed[slot]);
      } else {
        for (int slot = 0; slot < kSlots && e == cudaSuccess; ++slot)
          e = cudaIpcOpenEventHandle(&l.filled[slot], ev.filled[slot]);
      }
      opened[k] = e == cudaSuccess;
      if (!opened[k]) (void)cudaGetLastError(), l.why = std::string("CUDA IPC refused at the open: ") + cudaGetErrorString(e);
    } else {
      l.why = o.why[0] ? o.why : ev.why;
    }
    exchange(&opened[k], sizeof opened[k], kOpened, &peerOpened[k], sizeof peerOpened[k], kOpened, send ? to : from,
             "posting whether the same-GPU link opened");
  }
  checkMpi(MPI_Waitall((int)requests.size(), requests.data(), MPI_STATUSES_IGNORE), "MPI_Waitall (same-GPU links)");
  for (size_t k = 0; k < pairs.size(); ++k) {
    const auto [from, to] = pairs[k];
    const bool send = from == me;
    Link &l = link(send ? to : from, send);
    if (opened[k] && peerOpened[k]) {
      l.mode = Mode::Ipc;
      continue;
    }
    if (offers[k].ipc && events[k].ok && l.why.empty()) l.why = "CUDA IPC refused at the open by rank " +
                                                                std::to_string(send ? to : from);
    if (preference == Preference::Ipc)
      failed("PIPEC_SAME_GPU_TRANSPORT=ipc, but " + l.why + " (the link from rank " + std::to_string(from) +
             " to rank " + std::to_string(to) + ")");
    // Staged: what was made or opened for IPC goes, pinned slots come.
    l.mode = Mode::Staged;
    if (l.slots) (void)(send ? cudaIpcCloseMemHandle(l.slots) : cudaFree(l.slots));
    l.slots = nullptr;
    destroyEvents(l.filled);
    destroyEvents(l.consumed);
    if (!error.empty()) continue;
    l.pinned = (char *)device_.allocateHost(kSlots * l.capacity);
    if (!send)
      for (cudaEvent_t &e : l.uploaded)
        if (cudaEventCreateWithFlags(&e, cudaEventDisableTiming) != cudaSuccess) failed("cudaEventCreate failed");
  }
  if (!error.empty()) throw Error(error);
}

SameGpuLinks::Link &SameGpuLinks::link(int peer, bool send) {
  auto it = links_.find({peer, send});
  if (it == links_.end())
    throw Error("internal: no same-GPU link " + std::string(send ? "to" : "from") + " rank " + std::to_string(peer));
  return it->second;
}

cudaStream_t SameGpuLinks::stream(int peer, bool send) { return link(peer, send).stream; }

std::string SameGpuLinks::describe(int peer, bool send) const {
  const Link &l = links_.at({peer, send});
  return l.mode == Mode::Ipc ? "same GPU, CUDA IPC" : "same GPU, staged through host memory (" + l.why + ")";
}

// Sends a small message from the slot's outbox; the slot's previous message
// was received (the protocol only reuses a slot after the peer answered it).
void SameGpuLinks::post(Link &l, int slot, const void *data, int bytes, int tag) {
  if (l.requests[slot] != MPI_REQUEST_NULL) checkMpi(MPI_Wait(&l.requests[slot], MPI_STATUS_IGNORE), "MPI_Wait");
  std::memcpy(&l.outbox[slot], data, (size_t)bytes);
  checkMpi(MPI_Isend(&l.outbox[slot], bytes, MPI_BYTE, l.peer, tag, comm_, &l.requests[slot]), "MPI_Isend (same-GPU notice)");
}

// The sender may fill message n's slot once the receiver took message
// n - kSlots out of it.
void SameGpuLinks::awaitCredit(Link &l) {
  while (l.credits + kSlots <= l.messages) {
    uint64_t took = 0;
    checkMpi(MPI_Recv(&took, sizeof took, MPI_BYTE, l.peer, kTook, comm_, MPI_STATUS_IGNORE), "MPI_Recv (same-GPU notice)");
    ++l.credits;
  }
}

void SameGpuLinks::send(const void *buf, size_t bytes, int peer) {
  Link &l = link(peer, true);
  if (bytes > l.capacity)
    throw Error("a bundle of " + std::to_string(bytes) + " bytes for rank " + std::to_string(peer) +
                ", which takes at most " + std::to_string(l.capacity) +
                " from this rank (the neighbouring stages disagree on the tensor sizes)");
  const int slot = (int)(l.messages % kSlots);
  char *at = (l.mode == Mode::Ipc ? l.slots : l.pinned) + slot * l.capacity;
  if (l.mode == Mode::Ipc) {
    awaitCredit(l);
    checkCuda(cudaStreamWaitEvent(l.stream, l.consumed[slot], 0), "cudaStreamWaitEvent (same-GPU slot)");
    checkCuda(cudaMemcpyAsync(at, buf, bytes, cudaMemcpyDeviceToDevice, l.stream), "cudaMemcpyAsync (same-GPU send)");
    checkCuda(cudaEventRecord(l.filled[slot], l.stream), "cudaEventRecord (same-GPU send)");
    const uint64_t sent = bytes;
    post(l, slot, &sent, sizeof sent, kSent);
  } else {
    if (l.requests[slot] != MPI_REQUEST_NULL) checkMpi(MPI_Wait(&l.requests[slot], MPI_STATUS_IGNORE), "MPI_Wait");
    checkCuda(cudaMemcpyAsync(at, buf, bytes, cudaMemcpyDeviceToHost, l.stream), "cudaMemcpyAsync (same-GPU staging)");
    device_.awaitStream(l.stream, "cudaStreamSynchronize (same-GPU staging)");
    checkMpi(MPI_Isend(at, (int)bytes, MPI_BYTE, peer, kData, comm_, &l.requests[slot]), "MPI_Isend (same-GPU staged)");
  }
  ++l.messages;
}

void SameGpuLinks::receive(void *buf, size_t bytes, int peer) {
  Link &l = link(peer, false);
  const int slot = (int)(l.messages % kSlots);
  char *at = (l.mode == Mode::Ipc ? l.slots : l.pinned) + slot * l.capacity;
  MPI_Status status;
  uint64_t sent = 0;
  if (l.mode == Mode::Ipc) {
    checkMpi(MPI_Recv(&sent, sizeof sent, MPI_BYTE, peer, kSent, comm_, &status), "MPI_Recv (same-GPU notice)");
  } else {
    if (l.messages >= (uint64_t)kSlots) device_.await(l.uploaded[slot], "cudaEventSynchronize (staging)");
    checkMpi(MPI_Recv(at, (int)l.capacity, MPI_BYTE, peer, kData, comm_, &status), "MPI_Recv (same-GPU staged)");
    int got = 0;
    MPI_Get_count(&status, MPI_BYTE, &got);
    sent = (uint64_t)got;
  }
  // Checked before anything reads the bundle.
  if (sent != bytes)
    throw Error("received " + std::to_string(sent) + " bytes from rank " + std::to_string(peer) + ", expected " +
                std::to_string(bytes) + " (the neighbouring stages disagree on the tensor sizes)");
  if (l.mode == Mode::Ipc) {
    checkCuda(cudaStreamWaitEvent(l.stream, l.filled[slot], 0), "cudaStreamWaitEvent (same-GPU receive)");
    checkCuda(cudaMemcpyAsync(buf, at, bytes, cudaMemcpyDeviceToDevice, l.stream), "cudaMemcpyAsync (same-GPU receive)");
    checkCuda(cudaEventRecord(l.consumed[slot], l.stream), "cudaEventRecord (same-GPU receive)");
    const uint64_t took = l.messages;
    post(l, slot, &took, sizeof took, kTook);
  } else {
    checkCuda(cudaMemcpyAsync(buf, at, bytes, cudaMemcpyHostToDevice, l.stream), "cudaMemcpyAsync (same-GPU upload)");
    checkCuda(cudaEventRecord(l.uploaded[slot], l.stream), "cudaEventRecord (same-GPU upload)");
  }
  ++l.messages;
}

} // namespace pipec::rt
