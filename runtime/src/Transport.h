// How ranks talk. Two interfaces, so that tensor traffic can move to NCCL
// (GPU memory) while the small control traffic stays on MPI:
//  * Control: host-side coordination among all ranks (barriers, agreement on
//    errors, loss/norm reductions, gathering traces). Always MPI.
//  * Transport: the tensors of the instruction stream: point-to-point
//    activations/gradients (SEND_*/RECV_*) and the gradient all-reduce among
//    the replicas of a stage (ALLREDUCE). MpiTransport moves host buffers and
//    completes requests on wait(); GpuTransport (built with CUDA) moves
//    device buffers and is stream-ordered: transfers are enqueued on CUDA
//    streams and the executor orders them with Device events.
#pragma once

#include "Device.h"
#include "Plan.h" // Error
#include "pipec/stage_abi.h"

#include <cstddef>
#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace pipec::rt {

class Control {
public:
  virtual ~Control() = default;
  virtual int rank() const = 0; // world rank
  virtual int size() const = 0;
  virtual void barrier() = 0;
  virtual void allreduceSumWorld(double *v, int n) = 0;
  virtual void allreduceSumStage(double *v, int n) = 0; // among the replicas of this rank's stage
  virtual void allreduceMaxWorld(int64_t *v, int n) = 0;
  virtual std::vector<int64_t> allgather(const std::vector<int64_t> &mine) = 0; // same length everywhere
  // Rank 0 receives every rank's string (in rank order); others get {}.
  virtual std::vector<std::string> gatherToRoot(const std::string &mine) = 0;
  // Every rank gets every rank's string (used to agree on start-up errors).
  virtual std::vector<std::string> allgatherStrings(const std::string &mine) = 0;
  // Form the stage sub-communicator (same `color` = same stage).
  virtual void splitStage(int color) = 0;
  // Form a sub-communicator of the ranks passing member = true. Collective
  // over all ranks, called in the same order everywhere (a rank may belong
  // to several groups). Returns the group's handle on members, -1 elsewhere.
  virtual int splitGroup(bool member) = 0;
  [[noreturn]] virtual void abort(int code) = 0;
};

// A failure after which other ranks may wait for this one inside a
// collective they cannot leave (a communicator's creation): piperun ends
// the job at once (MPI_Abort) instead of meeting the others' start-up
// agreement, which they would never reach.
class StrandedPeers : public Error {
public:
  using Error::Error;
};

// Who talks to whom, known once every rank's stream was read (Executor::
// checkNeighbours): the same on every rank.
struct Connections {
  std::vector<std::pair<int, int>> pairs; // (sender, receiver) world ranks with point-to-point traffic, sorted
  std::vector<int> groups;                // this rank's Control::splitGroup handles, in creation order
  std::map<int, size_t> receiveBytes;     // sender -> the largest bundle this rank receives from it
  size_t largestSum = 0;                  // bytes: the largest all-reduce this rank makes (a chunk's gradients)
};

class Transport {
public:
  using Request = int64_t;
  virtual ~Transport() = default;
  virtual const char *name() const = 0;
  // Collective over all ranks, after Control::splitStage/splitGroup and the
  // start-up checks: create what the transport needs (NCCL communicators).
  virtual void connect(const Connections &) {}
  // After connect(), on rank 0: how each pair of ranks and each group talks,
  // a line each, for piperun's start-up report ("" when one way fits all).
  virtual std::string routes() const { return ""; }

  // Stream-ordered transports (NCCL): isend/irecv to/from `peer` are enqueued
  // on stream(peer, send) and run when that stream gets there; the caller
  // makes the stream wait for the buffer (Device::streamWait) before the call,
  // and event(request) completes with the transfer. Host transports (MPI)
  // return false / nullptr: the transfer runs from the call and completes by
  // wait().
  virtual bool streamOrdered() const { return false; }
  virtual Stream stream(int peer, bool send) {
    (void)peer, (void)send;
    return nullptr;
  }
  virtual Event event(Request) { return nullptr; }
  // Forget a request without waiting on the host (stream-ordered transports
  // only: the caller ordered its users after event(r) first).
  virtual void release(Request r) { wait(r); }
  // Largest tag the transport accepts (MPI_TAG_UB).
  virtual int64_t maxTag() const = 0;
  // Non-blocking send/receive of `bytes` bytes to/from world rank `peer`.
  // The buffer must stay untouched until wait() returns.
  virtual Request isend(const void *buf, size_t bytes, int peer, int tag) = 0;
  virtual Request irecv(void *buf, size_t bytes, int peer, int tag) = 0;
  virtual void wait(Request r) = 0;
  // In-place sum over the replicas of this rank's stage (Control::splitStage
  // first). Stream-ordered transports enqueue it on `stream`, the device's
  // compute stream when nullptr (no host sync).
  virtual void allreduceSumStage(void *buf, size_t count, pipec_dtype dtype, Stream stream = nullptr) = 0;
  // A stream of the transport's own on which allreduceSumStage runs apart
  // from the compute stream, overlapping it (GradientSync: a chunk's
  // gradients summed as soon as they are final); nullptr when there is none
  // (host transports, and sums through host memory).
  virtual Stream reductionStream() { return nullptr; }
  // In-place sum over a group of Control::splitGroup (tied parameters); every
  // member gets the bitwise same result, so tied copies stay equal.
  virtual void allreduceSumGroup(int group, void *buf, size_t count, pipec_dtype dtype) {
    (void)group, (void)buf, (void)count, (void)dtype;
    throw std::runtime_error(std::string("the ") + name() + " transport does not support tied parameters yet");
  }
};

} // namespace pipec::rt
