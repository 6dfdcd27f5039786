// NCCL implementation of Transport (device buffers; issue 7). Communicators
// are bootstrapped over MPI: rank 0 of each communicator creates an
// ncclUniqueId and broadcasts it. Built only with PIPEC_ENABLE_CUDA
// (runtime/cmake/cuda.cmake); not yet used by piperun, whose executor
// allocates host buffers.
#pragma once

#include "MpiTransport.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <map>

namespace pipec::rt {

class NcclTransport : public Transport {
public:
  // Picks the device by the node-local rank, creates the world and stage
  // communicators and the communication stream.
  NcclTransport(const MpiControl &control, int stageColor);
  ~NcclTransport() override;
  const char *name() const override { return "nccl"; }
  int64_t maxTag() const override { return INT32_MAX; } // tags are implicit: NCCL orders by call
  Request isend(const void *buf, size_t bytes, int peer, int tag) override;
  Request irecv(void *buf, size_t bytes, int peer, int tag) override;
  void wait(Request r) override;
  void allreduceSumStage(void *buf, size_t count, pipec_dtype dtype) override;
  cudaStream_t stream() const { return stream_; }

private:
  Request record();
  ncclComm_t world_ = nullptr, stage_ = nullptr;
  cudaStream_t stream_ = nullptr;
  std::map<Request, cudaEvent_t> events_;
  Request next_ = 1;
};

} // namespace pipec::rt
