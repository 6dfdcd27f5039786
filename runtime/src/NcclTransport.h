// NCCL implementation of Transport for the CUDA target (issue 7,
// docs/runtime.md "The CUDA target"): device buffers, stream-ordered.
//  * Point-to-point: one 2-rank communicator and one CUDA stream per ordered
//    pair (sender, receiver) of ranks that exchange bundles. NCCL matches
//    sends and receives between two ranks by issue order, and a blocking
//    ncclSend holds its stream until the peer posts the receive: with one
//    communicator and stream per direction, rank A's send to B never queues
//    behind A's receive from B (the cross-direction deadlock of a shared
//    stream), and the start-up check (checkTransferOrder) guarantees that the
//    order on each direction is the same on both ends.
//  * ALLREDUCE: ncclAllReduce on the stage's communicator (its replicas);
//    tied parameters: ncclReduce to the group's first rank + ncclBroadcast
//    (bitwise-equal copies, as with MPI). Both on the compute stream, ordered
//    between the backward that produced the gradients and the step.
// Communicators are bootstrapped over MPI (ncclGetUniqueId on one rank,
// MPI_Bcast or MPI_Send of the id) in connect(), created in one global order
// (stage, tied groups, pairs sorted) so the blocking ncclCommInitRank calls
// cannot wait on each other in a cycle. Built only with CUDA.
#pragma once

#include "CudaDevice.h"
#include "MpiTransport.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <map>
#include <string>
#include <unordered_map>
#include <vector>

namespace pipec::rt {

class NcclTransport final : public Transport {
public:
  // No communication yet (connect() is collective).
  NcclTransport(const MpiControl &control, CudaDevice &device);
  ~NcclTransport() override;
  const char *name() const override { return name_.c_str(); } // "nccl X.Y.Z": the library loaded
  int64_t maxTag() const override { return INT32_MAX; } // no tags: NCCL orders by call
  void connect(const Connections &c) override;
  bool streamOrdered() const override { return true; }
  Stream stream(int peer, bool send) override;
  Event event(Request r) override;
  void release(Request r) override;
  // Enqueued on stream(peer, true/false); the returned request's event
  // completes with the transfer.
  Request isend(const void *buf, size_t bytes, int peer, int tag) override;
  Request irecv(void *buf, size_t bytes, int peer, int tag) override;
  void wait(Request r) override; // host sync
  void allreduceSumStage(void *buf, size_t count, pipec_dtype dtype) override;
  void allreduceSumGroup(int group, void *buf, size_t count, pipec_dtype dtype) override;

private:
  struct Link {
    ncclComm_t comm = nullptr;
    cudaStream_t stream = nullptr;
    int peerInComm = 0; // the other end's rank in the 2-rank communicator
  };
  Link &link(int peer, bool send);
  Request enqueued(cudaStream_t s);
  cudaEvent_t take(Request r);

  const MpiControl &control_;
  CudaDevice &device_;
  ncclComm_t stage_ = nullptr;          // null when the stage has one replica
  std::map<int, ncclComm_t> groups_;    // by Control::splitGroup handle; null value: a group of one
  std::vector<ncclComm_t> order_;       // every communicator, in creation order (destroyed in it)
  std::map<std::pair<int, bool>, Link> links_; // (peer world rank, this rank sends)
  std::unordered_map<Request, cudaEvent_t> pending_;
  std::vector<cudaEvent_t> freeEvents_;
  Request next_ = 1;
  std::string name_;
};

} // namespace pipec::rt
