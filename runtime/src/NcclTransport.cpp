#include "NcclTransport.h"

#include "Plan.h" // Error

#include <mpi.h>

#include <cassert>

#include <thread>

namespace pipec::rt {

namespace {
void cuda(cudaError_t e, const char *what) {
  if (e != cudaSuccess) throw Error(std::string(what) + " failed: " + cudaGetErrorString(e));
}
void nccl(ncclResult_t r, const std::string &what) {
  if (r == ncclSuccess) return;
  const char *detail = ncclGetLastError(nullptr);
  throw Error(what + " failed: " + ncclGetErrorString(r) + (detail && *detail ? std::string(" (") + detail + ")" : ""));
}
void mpi(int rc, const char *what) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  throw Error(std::string(what) + " failed: " + std::string(msg, len));
}
ncclDataType_t ncclType(pipec_dtype t) {
  switch (t) {
  case PIPEC_F32: return ncclFloat32;
  case PIPEC_F64: return ncclFloat64;
  case PIPEC_I64: return ncclInt64;
  case PIPEC_I32: return ncclInt32;
  default: throw Error("NCCL all-reduce of an unsupported dtype");
  }
}

// The id a communicator's first rank made, broadcast with whether it could.
struct IdMessage {
  int ok = 0;
  ncclUniqueId id{};
};

// A communicator of the members of `comm` (collective over them), or null
// when `comm` has one member (nothing to reduce).
ncclComm_t makeComm(MPI_Comm comm, const char *what) {
  int rank = 0, size = 1;
  mpi(MPI_Comm_rank(comm, &rank), "MPI_Comm_rank");
  mpi(MPI_Comm_size(comm, &size), "MPI_Comm_size");
  if (size == 1) return nullptr;
  IdMessage m;
  std::string error;
  if (rank == 0) {
    const ncclResult_t r = ncclGetUniqueId(&m.id);
    m.ok = r == ncclSuccess;
    if (!m.ok) error = std::string("ncclGetUniqueId failed: ") + ncclGetErrorString(r);
  }
  mpi(MPI_Bcast(&m, sizeof m, MPI_BYTE, 0, comm), "MPI_Bcast (NCCL id)");
  if (!m.ok) throw Error(std::string("NCCL communicator for the ") + what + ": " +
                         (error.empty() ? "its first rank could not create an id" : error));
  ncclComm_t c = nullptr;
  nccl(ncclCommInitRank(&c, size, m.id, rank), std::string("ncclCommInitRank (") + what + ")");
  return c;
}
} // namespace

/// The oldest NCCL whose API the transport uses (ncclGetLastError: 2.13;
/// the ncclInProgress result: 2.14).
constexpr int kMinimumNcclVersion = 21400;

NcclTransport::NcclTransport(const MpiControl &control, CudaDevice &device) : control_(control), device_(device) {
  int version = 0;
  nccl(ncclGetVersion(&version), "ncclGetVersion");
  // NCCL_VERSION(X, Y, Z) is X * 10000 + Y * 100 + Z since 2.9.
  const std::string loaded = std::to_string(version / 10000) + "." + std::to_string(version / 100 % 100) + "." +
                             std::to_string(version % 100);
  if (version < kMinimumNcclVersion)
    throw Error("the NCCL library loaded is " + loaded + ", older than 2.14.0, the oldest pipec's NCCL transport "
                "uses (set LD_LIBRARY_PATH to a newer libnccl.so.2)");
  name_ = "nccl " + loaded;
}

NcclTransport::~NcclTransport() {
  // The executor drained its transfers; make sure, then free everything.
  for (auto &[key, l] : links_)
    if (l.stream) cudaStreamSynchronize(l.stream);
  cudaStreamSynchronize((cudaStream_t)device_.computeStream());
  for (ncclComm_t c : order_) ncclCommDestroy(c); // in creation order, the same on every rank
  for (auto &[key, l] : links_)
    if (l.stream) cudaStreamDestroy(l.stream);
  for (auto &[r, e] : pending_) cudaEventDestroy(e);
  for (cudaEvent_t e : freeEvents_) cudaEventDestroy(e);
}

void NcclTransport::connect(const Connections &c) {
  const int me = control_.rank();
  // NCCL refuses two ranks of one communicator on the same GPU ("duplicate
  // GPU"), and a refused rank would leave others waiting in ncclCommInitRank:
  // every rank checks every rank's GPU first and all fail alike.
  {
    const int R = control_.size();
    std::string all(16 * (size_t)R, '\0'), mine = device_.uuid();
    mine.resize(16, '\0');
    mpi(MPI_Allgather(mine.data(), 16, MPI_BYTE, all.data(), 16, MPI_BYTE, MPI_COMM_WORLD), "MPI_Allgather (GPU ids)");
    for (int a = 0; a < R; ++a)
      for (int b = a + 1; b < R; ++b)
        if (all.compare(16 * (size_t)a, 16, all, 16 * (size_t)b, 16) == 0)
          throw Error("ranks " + std::to_string(a) + " and " + std::to_string(b) +
                      " use the same GPU; NCCL needs one GPU per rank: start at most as many ranks per node as it has "
                      "GPUs (ranks take GPU node-local rank mod the visible GPUs)");
  }
  // 1. The replicas of this stage (every rank is in exactly one such group).
  stage_ = makeComm(control_.stageComm(), "replicas of the stage");
  if (stage_) order_.push_back(stage_);
  // 2. Tied-parameter groups, in the order Control::splitGroup made them.
  for (int g : c.groups) {
    ncclComm_t x = makeComm(control_.groupComm(g), "tied parameter group");
    groups_[g] = x;
    if (x) order_.push_back(x);
  }
  // 3. One 2-rank communicator per ordered pair with traffic: the sender
  // makes the id and sends it to the receiver (all ids at once; one message
  // per ordered pair, so tag 0 on a private communicator), then the pairs
  // are initialized in the global sorted order.
  std::vector<IdMessage> ids(c.pairs.size());
  std::vector<MPI_Request> requests;
  MPI_Comm world = MPI_COMM_NULL; // private tags
  mpi(MPI_Comm_dup(MPI_COMM_WORLD, &world), "MPI_Comm_dup");
  std::string error;
  for (size_t k = 0; k < c.pairs.size(); ++k) {
    const auto [from, to] = c.pairs[k];
    if (from == me) {
      const ncclResult_t r = ncclGetUniqueId(&ids[k].id);
      ids[k].ok = r == ncclSuccess;
      if (!ids[k].ok && error.empty()) error = std::string("ncclGetUniqueId failed: ") + ncclGetErrorString(r);
      requests.emplace_back();
      mpi(MPI_Isend(&ids[k], sizeof(IdMessage), MPI_BYTE, to, 0, world, &requests.back()), "MPI_Isend (NCCL id)");
    } else if (to == me) {
      requests.emplace_back();
      mpi(MPI_Irecv(&ids[k], sizeof(IdMessage), MPI_BYTE, from, 0, world, &requests.back()), "MPI_Irecv (NCCL id)");
    }
  }
  const int rc = MPI_Waitall((int)requests.size(), requests.data(), MPI_STATUSES_IGNORE);
  MPI_Comm_free(&world);
  mpi(rc, "MPI_Waitall (NCCL ids)");
  if (!error.empty()) throw Error(error);
  // Transfers on high-priority streams: a send or receive starts as soon as
  // its bundle is ready instead of queueing behind compute kernels.
  int least = 0, greatest = 0;
  cuda(cudaDeviceGetStreamPriorityRange(&least, &greatest), "cudaDeviceGetStreamPriorityRange");
  for (size_t k = 0; k < c.pairs.size(); ++k) {
    const auto [from, to] = c.pairs[k];
    if (from != me && to != me) continue;
    const bool send = from == me;
    const int peer = send ? to : from;
    if (!ids[k].ok)
      throw Error("rank " + std::to_string(from) + " could not create the NCCL id of its link to rank " + std::to_string(to));
    Link l;
    nccl(ncclCommInitRank(&l.comm, 2, ids[k].id, send ? 0 : 1),
         "ncclCommInitRank (rank " + std::to_string(from) + " -> rank " + std::to_string(to) + ")");
    order_.push_back(l.comm);
    l.peerInComm = send ? 1 : 0;
    cuda(cudaStreamCreateWithPriority(&l.stream, cudaStreamNonBlocking, greatest), "cudaStreamCreateWithPriority");
    links_[{peer, send}] = l;
  }
  // NCCL connects point-to-point peers at their first transfer, on the host,
  // together with the peer: do it now, one 64-byte transfer per link in the
  // same global order (so a failure is a start-up error and the first SEND of
  // the run does not wait on the host for its receiver).
  void *scratch = nullptr;
  cuda(cudaMalloc(&scratch, 64), "cudaMalloc");
  try {
    for (const auto &[from, to] : c.pairs) {
      if (from != me && to != me) continue;
      Link &l = link(from == me ? to : from, from == me);
      if (from == me)
        nccl(ncclSend(scratch, 64, ncclUint8, l.peerInComm, l.comm, l.stream), "ncclSend (connecting)");
      else
        nccl(ncclRecv(scratch, 64, ncclUint8, l.peerInComm, l.comm, l.stream), "ncclRecv (connecting)");
      cuda(cudaStreamSynchronize(l.stream), "connecting NCCL links");
    }
  } catch (...) {
    cudaFree(scratch);
    throw;
  }
  cudaFree(scratch);
}

NcclTransport::Link &NcclTransport::link(int peer, bool send) {
  auto it = links_.find({peer, send});
  if (it == links_.end())
    throw Error("internal: no NCCL link " + std::string(send ? "to" : "from") + " rank " + std::to_string(peer) +
                " (a transfer the start-up check did not see)");
  return it->second;
}

Stream NcclTransport::stream(int peer, bool send) { return link(peer, send).stream; }

NcclTransport::Request NcclTransport::enqueued(cudaStream_t s) {
  cudaEvent_t e = nullptr;
  if (!freeEvents_.empty()) {
    e = freeEvents_.back();
    freeEvents_.pop_back();
  } else {
    cuda(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
  }
  const cudaError_t rc = cudaEventRecord(e, s);
  if (rc != cudaSuccess) {
    freeEvents_.push_back(e);
    cuda(rc, "cudaEventRecord");
  }
  pending_[next_] = e;
  return next_++;
}

cudaEvent_t NcclTransport::take(Request r) {
  auto it = pending_.find(r);
  assert(it != pending_.end() && "a request is taken once, after isend or irecv returned it");
  cudaEvent_t e = it->second;
  pending_.erase(it);
  return e;
}

Event NcclTransport::event(Request r) {
  auto it = pending_.find(r);
  assert(it != pending_.end() && "an event is asked of a request isend or irecv returned and nobody took yet");
  return it->second;
}

// Streams that waited on the event keep waiting for the recorded work; the
// event may be recorded again (CUDA: a wait binds to the record before it).
void NcclTransport::release(Request r) { freeEvents_.push_back(take(r)); }

NcclTransport::Request NcclTransport::isend(const void *buf, size_t bytes, int peer, int) {
  Link &l = link(peer, true);
  nccl(ncclSend(buf, bytes, ncclUint8, l.peerInComm, l.comm, l.stream), "ncclSend to rank " + std::to_string(peer));
  return enqueued(l.stream);
}

NcclTransport::Request NcclTransport::irecv(void *buf, size_t bytes, int peer, int) {
  Link &l = link(peer, false);
  nccl(ncclRecv(buf, bytes, ncclUint8, l.peerInComm, l.comm, l.stream), "ncclRecv from rank " + std::to_string(peer));
  return enqueued(l.stream);
}

void NcclTransport::wait(Request r) {
  cudaEvent_t e = take(r);
  // Poll rather than block, so that an asynchronous NCCL error (a peer gone)
  // surfaces instead of waiting forever.
  cudaError_t rc;
  while ((rc = cudaEventQuery(e)) == cudaErrorNotReady) {
    for (auto &[key, l] : links_) {
      ncclResult_t async = ncclSuccess;
      if (ncclCommGetAsyncError(l.comm, &async) == ncclSuccess && async != ncclSuccess && async != ncclInProgress) {
        freeEvents_.push_back(e);
        nccl(async, "NCCL transfer with rank " + std::to_string(key.first));
      }
    }
    std::this_thread::yield();
  }
  freeEvents_.push_back(e);
  cuda(rc, "waiting for an NCCL transfer");
}

void NcclTransport::allreduceSumStage(void *buf, size_t count, pipec_dtype dtype) {
  if (!stage_ || count == 0) return; // one replica: nothing to sum
  nccl(ncclAllReduce(buf, buf, count, ncclType(dtype), ncclSum, stage_, (cudaStream_t)device_.computeStream()),
       "ncclAllReduce (gradients)");
}

void NcclTransport::allreduceSumGroup(int group, void *buf, size_t count, pipec_dtype dtype) {
  auto it = groups_.find(group);
  assert(it != groups_.end() && "connect() made a communicator for every group of splitGroup");
  if (!it->second || count == 0) return;
  // Reduce to the group's first rank, broadcast: every copy gets the same bits.
  const cudaStream_t s = (cudaStream_t)device_.computeStream();
  nccl(ncclReduce(buf, buf, count, ncclType(dtype), ncclSum, 0, it->second, s), "ncclReduce (tied gradients)");
  nccl(ncclBroadcast(buf, buf, count, ncclType(dtype), 0, it->second, s), "ncclBroadcast (tied gradients)");
}

} // namespace pipec::rt
