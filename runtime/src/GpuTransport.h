// The Transport of the CUDA target (issue 7, docs/runtime.md "The CUDA
// target"): device buffers, stream-ordered. Ranks on different GPUs talk over
// NCCL; ranks that share a GPU, which NCCL refuses, over SameGpuLinks
// (point-to-point) and MPI through pinned host memory (all-reduces). The
// choice is per pair and per group, from every rank's GPU UUID, and the same
// on every rank; PIPEC_NCCL_SAME_GPU=1 sends everything over NCCL instead
// (each rank a host of its own to NCCL, so that its network transport
// carries the traffic between ranks of one GPU: the cluster's code path on a
// one-GPU machine, for testing).
//  * NCCL point-to-point: one 2-rank communicator and one CUDA stream per ordered
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
#include "SameGpuLinks.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace pipec::rt {

class GpuTransport final : public Transport {
public:
  // No communication yet (connect() is collective).
  GpuTransport(MpiControl &control, CudaDevice &device);
  ~GpuTransport() override;
  const char *name() const override { return name_.c_str(); } // what carries the pairs (after connect)
  std::string routes() const override { return routes_; }
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
  void allreduceSumStage(void *buf, size_t count, pipec_dtype dtype, Stream stream = nullptr) override;
  Stream reductionStream() override { return reduction_; } // when the replicas sum over NCCL
  void allreduceSumGroup(int group, void *buf, size_t count, pipec_dtype dtype) override;

private:
  // How a group of ranks (the stage's replicas, a tied group) sums.
  enum class Sum { None, Nccl, Host };
  struct Group {
    Sum sum = Sum::None;
    ncclComm_t comm = nullptr;
  };
  // Sums through pinned host memory with MPI (ranks sharing a GPU).
  void sumOnHost(int group, void *buf, size_t count, pipec_dtype dtype);
  Group makeGroup(MPI_Comm comm, const char *what);
  void needNccl() const; // throws when the NCCL loaded is too old
  void checkAsyncErrors();  // throws, after abortAll(), when a communicator is in error
  void abortAll() noexcept;
  struct Link {
    ncclComm_t comm = nullptr;
    cudaStream_t stream = nullptr;
    int peerInComm = 0; // the other end's rank in the 2-rank communicator
  };
  Link &link(int peer, bool send);
  Request enqueued(cudaStream_t s);
  cudaEvent_t take(Request r);

  MpiControl &control_;
  CudaDevice &device_;
  Group stage_;
  std::map<int, Group> groups_;         // by Control::splitGroup handle
  std::vector<std::string> gpus_;       // every world rank's GPU UUID
  bool ncclEverywhere_ = false;         // PIPEC_NCCL_SAME_GPU
  SameGpuLinks::Preference sameGpuPreference_; // PIPEC_SAME_GPU_TRANSPORT
  size_t hostSumBytes_ = 0;
  MpiTransport host_;                   // the sums of ranks sharing a GPU, on pinned memory
  HostBuffer hostSums_;
  std::unique_ptr<SameGpuLinks> sameGpu_;
  std::string routes_;                  // rank 0: every pair's and group's route
  cudaStream_t reduction_ = nullptr;    // the replicas' NCCL sums apart from the compute stream
  std::vector<ncclComm_t> order_;       // every communicator, in creation order (destroyed in it)
  std::map<std::pair<int, bool>, Link> links_; // (peer world rank, this rank sends)
  std::unordered_map<Request, cudaEvent_t> pending_;
  std::vector<cudaEvent_t> freeEvents_;
  Request next_ = 1;
  int ncclVersion_ = 0;
  std::string ncclName_; // "nccl X.Y.Z": the library loaded
  std::string name_;
};

} // namespace pipec::rt
