// Transfers between ranks that share one GPU, without NCCL (issue 48;
// docs/runtime.md, "Ranks sharing a GPU"). NCCL refuses two ranks of one
// communicator on one device, so GpuTransport sends the bundles of such a
// pair through one of two links, chosen by the receiver at start-up:
//  * CUDA IPC: the receiver owns kSlots staging slots in device memory
//    (cudaMalloc, exported with cudaIpcGetMemHandle), each as large as the
//    largest bundle it takes from that sender. Message n uses slot n % kSlots:
//    the sender's stream waits until the receiver has copied message
//    n - kSlots out of the slot (IPC event "consumed"), copies the bundle in
//    and records "filled"; the receiver's stream waits for "filled", copies
//    the slot into its bundle and records "consumed". A stream waiting on an
//    event waits for the record issued before the wait, so each end waits
//    only once a small MPI message says the other end issued its record: the
//    sender's "sent n" (with the byte count, checked before any data is
//    used) before the receiver waits on "filled", the receiver's "took n"
//    before the sender reuses the slot.
//  * Staged through pinned host memory over MPI, where the machine refuses
//    IPC (or PIPEC_SAME_GPU_TRANSPORT=staged): the sender copies the bundle
//    to pinned memory, waits for the copy, and sends it with MPI; the
//    receiver receives it into pinned memory and uploads it on its stream.
// Either way a receive blocks the host until the sender has issued the
// matching send, MPI's rendezvous semantics, which the schedules' start-up
// check (findTransferDeadlock) guarantees complete. Built only with CUDA.
#pragma once

#include "CudaDevice.h"
#include "pipec/vocabulary.h" // SameGpuTransport

#include <cuda_runtime.h>
#include <mpi.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace pipec::rt {

class SameGpuLinks {
public:
  static constexpr int kSlots = 2;
  enum class Mode { Ipc, Staged };
  // How the receivers choose: PIPEC_SAME_GPU_TRANSPORT (default auto).
  using Preference = SameGpuTransport;
  static Preference preferenceFromEnvironment(); // throws Error on a value it does not know

  explicit SameGpuLinks(CudaDevice &device);
  ~SameGpuLinks();
  SameGpuLinks(const SameGpuLinks &) = delete;
  SameGpuLinks &operator=(const SameGpuLinks &) = delete;

  // Collective between the two ends of every pair (sender, receiver): every
  // pair lists this rank, and both ends list it. receiveBytes[sender] is the
  // largest bundle this rank receives from that sender. highPriority: the
  // streams' priority.
  void connect(const std::vector<std::pair<int, int>> &pairs, const std::map<int, size_t> &receiveBytes,
               Preference preference, int highPriority);
  bool has(int peer, bool send) const { return links_.count({peer, send}) != 0; }
  cudaStream_t stream(int peer, bool send);
  // Enqueued on stream(peer, true) / stream(peer, false); the caller made
  // the stream wait for the bundle (send) or for the slot to be free
  // (receive). receive() blocks the host until the matching send() was
  // issued; send() blocks it only while all kSlots slots are in use.
  void send(const void *buf, size_t bytes, int peer);
  void receive(void *buf, size_t bytes, int peer);
  // "CUDA IPC" or "staged through host memory (why)", for the pair's line
  // in piperun's start-up report (the receiving end chose).
  std::string describe(int peer, bool send) const;

private:
  struct Link {
    int peer = 0;
    bool send = false;
    Mode mode = Mode::Staged;
    std::string why;         // why staged
    size_t capacity = 0;     // bytes per slot
    uint64_t messages = 0;   // sent or received so far
    uint64_t credits = 0;    // sender: "took" messages received so far
    cudaStream_t stream = nullptr;
    char *slots = nullptr;   // IPC: device slots (the receiver's own, opened by the sender)
    cudaEvent_t filled[kSlots] = {}, consumed[kSlots] = {};
    char *pinned = nullptr;  // staged: kSlots host slots
    cudaEvent_t uploaded[kSlots] = {}; // staged receiver: the slot's upload
    MPI_Request requests[kSlots];      // the slot's last MPI send (notice, credit or staged data)
    uint64_t outbox[kSlots] = {};      // payloads of those sends
  };
  Link &link(int peer, bool send);
  void awaitCredit(Link &l);
  void post(Link &l, int slot, const void *data, int bytes, int tag);
  void drain(Link &l) noexcept;

  CudaDevice &device_;
  MPI_Comm comm_ = MPI_COMM_NULL; // a duplicate of the world: the links' private tags
  std::map<std::pair<int, bool>, Link> links_; // (peer, this rank sends)
};

} // namespace pipec::rt
