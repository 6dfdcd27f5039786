// A rank's activation state (docs/runtime.md, "Memory a rank allocates"):
// per (chunk, micro-batch) the buffers of one micro-batch in flight, reused
// by a later micro-batch once its backward is done and its gradient left.
#pragma once

#include "StageModel.h"
#include "Transport.h"

#include <map>
#include <memory>
#include <optional>
#include <vector>

namespace pipec::rt {

// One micro-batch's buffers on one chunk and how far it got.
struct Slot {
  int mb = -1;
  Buffer data, inputs, outputs, gradOutputs, gradInputs;
  std::unique_ptr<Buffer> workspace;
  bool dataLoaded = false, haveInputs = false, haveGradOutputs = false, fwdDone = false, bDone = false,
       wDone = false, gradHandedOff = false;
  int64_t fwdStep = 0;
  // Sends from this slot's buffers. MPI: waited for before the slot is
  // returned. CUDA: kept when it is returned, and the next micro-batch's
  // writers wait for them on the device (no host sync).
  std::vector<Transport::Request> sends;
  // CUDA target. On the compute stream: `ready` (the slot's buffers may be
  // written: after their previous readers and the pending sends),
  // `outputsDone` / `gradInputsDone` (after the FWD / BWD_INPUT that filled
  // the bundle a SEND waits for), `dataStaged` (after the upload of the
  // data fields from `dataStage`). On a receiving stream: `inputsIn` /
  // `gradOutputsIn` (after the RECV that filled the bundle a compute waits for).
  Event ready = nullptr, outputsDone = nullptr, gradInputsDone = nullptr, dataStaged = nullptr, inputsIn = nullptr,
        gradOutputsIn = nullptr;
  bool inputsReceived = false, gradOutputsReceived = false;
  HostBuffer dataStage; // pinned
  // Host transports (MPI): a RECV posts its receive and goes on; the compute
  // that reads the bundle waits for it (Executor::awaitBundle). The RECV and
  // its iteration, for the header check then.
  struct Pending {
    Transport::Request request;
    Instr recv;
    int64_t iteration;
  };
  std::optional<Pending> inputsPending, gradOutputsPending;
};

class SlotPool {
public:
  SlotPool(Device &device, Transport &transport);
  ~SlotPool();
  SlotPool(const SlotPool &) = delete;
  SlotPool &operator=(const SlotPool &) = delete;

  // One per chunk, in chunk order; the buffers are sized from its layouts.
  // The first virtual stage hands no input gradient on.
  void addChunk(const StageModel &model, bool firstStage);
  // The micro-batch's slot: a free or new one when `create`, else Error.
  Slot &get(int chunk, int mb, bool create);
  // A workspace for a forward whose activations are kept until the backward.
  std::unique_ptr<Buffer> takeWorkspace(int chunk);
  // Frees the slot once its weight gradient is done and its input gradient
  // was handed on (sent, or copied to the previous chunk).
  void maybeRelease(int chunk, Slot &s);
  // The forward of a micro-batch that RECOMPUTE re-creates keeps its
  // workspace only until then: one scratch workspace per chunk.
  void *scratchWorkspace(int chunk);
  // RECOMPUTE's outputs (the sent outputs may still be in flight).
  Buffer &scratchOutputs(int chunk) { return chunks_[chunk].scratchOutputs; }
  // The lowest micro-batch of `chunk` that has a slot, or -1.
  int firstActive(int chunk) const;
  // CUDA: waits for every send from the slots, so that nothing is in
  // flight when the buffers and communicators go.
  void waitSends();

private:
  struct ChunkSlots {
    const StageModel *model = nullptr;
    bool firstStage = false;
    std::map<int, Slot *> active;              // by micro-batch
    std::vector<std::unique_ptr<Slot>> slots;  // all slots ever made (free ones reused)
    std::vector<Slot *> freeSlots;
    std::vector<std::unique_ptr<Buffer>> freeWorkspaces;
    Buffer scratchWorkspace, scratchOutputs;
  };
  Device &device_;
  Transport &transport_;
  const bool gpu_; // device buffers, stream-ordered transport
  std::vector<ChunkSlots> chunks_;
};

} // namespace pipec::rt
