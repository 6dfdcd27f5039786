#include "GpuTransport.h"

#include "Plan.h" // Error
#include "pipec/tensor_file.h" // dtypeSize

#include <mpi.h>

#include <cassert>
#include <cstdlib>


namespace pipec::rt {

namespace {
std::string ncclFailure(ncclResult_t r, const std::string &what) {
  const char *detail = ncclGetLastError(nullptr);
  return what + " failed: " + ncclGetErrorString(r) + (detail && *detail ? std::string(" (") + detail + ")" : "");
}
void nccl(ncclResult_t r, const std::string &what) {
  if (r != ncclSuccess) throw Error(ncclFailure(r, what));
}
// A communicator's creation: when it fails here, the other members wait
// inside theirs.
void ncclInit(ncclResult_t r, const std::string &what) {
  if (r != ncclSuccess) throw StrandedPeers(ncclFailure(r, what));
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
  checkMpi(MPI_Comm_rank(comm, &rank), "MPI_Comm_rank");
  checkMpi(MPI_Comm_size(comm, &size), "MPI_Comm_size");
  if (size == 1) return nullptr;
  IdMessage m;
  std::string error;
  if (rank == 0) {
    const ncclResult_t r = ncclGetUniqueId(&m.id);
    m.ok = r == ncclSuccess;
    if (!m.ok) error = std::string("ncclGetUniqueId failed: ") + ncclGetErrorString(r);
  }
  checkMpi(MPI_Bcast(&m, sizeof m, MPI_BYTE, 0, comm), "MPI_Bcast (NCCL id)");
  if (!m.ok) throw Error(std::string("NCCL communicator for the ") + what + ": " +
                         (error.empty() ? "its first rank could not create an id" : error));
  ncclComm_t c = nullptr;
  ncclInit(ncclCommInitRank(&c, size, m.id, rank), std::string("ncclCommInitRank (") + what + ")");
  return c;
}
} // namespace

/// The oldest NCCL whose API the transport uses (ncclGetLastError: 2.13;
/// the ncclInProgress result: 2.14).
constexpr int kMinimumNcclVersion = 21400;

GpuTransport::GpuTransport(MpiControl &control, CudaDevice &device)
    : control_(control), device_(device), host_(control) {
  // The NCCL path on one GPU, for testing (docs/runtime.md, "Ranks sharing
  // a GPU"): NCCL tells hosts apart by NCCL_HOSTID, read at its first
  // communicator, and refuses two ranks of one host on one GPU.
  const char *everywhere = std::getenv("PIPEC_NCCL_SAME_GPU");
  ncclEverywhere_ = everywhere && *everywhere && std::string(everywhere) != "0";
  sameGpuPreference_ = SameGpuLinks::preferenceFromEnvironment(); // a start-up error of this rank, agreed on
  if (ncclEverywhere_) {
    setenv("NCCL_HOSTID", ("pipec-rank-" + std::to_string(control.rank())).c_str(), 1);
    setenv("NCCL_SOCKET_IFNAME", "lo", 0); // the network transport over loopback
  }
  int version = 0;
  nccl(ncclGetVersion(&version), "ncclGetVersion");
  // NCCL_VERSION(X, Y, Z) is X * 10000 + Y * 100 + Z since 2.9.
  ncclVersion_ = version;
  ncclName_ = "nccl " + std::to_string(version / 10000) + "." + std::to_string(version / 100 % 100) + "." +
              std::to_string(version % 100);
  name_ = ncclName_;
}

// Checked where NCCL carries something: a job whose ranks share one GPU
// runs with any NCCL, or none that works.
void GpuTransport::needNccl() const {
  if (ncclVersion_ < kMinimumNcclVersion)
    throw Error("the NCCL library loaded is " + ncclName_.substr(5) + ", older than 2.14.0, the oldest pipec's NCCL "
                "transport uses (set LD_LIBRARY_PATH to a newer libnccl.so.2)");
}

GpuTransport::~GpuTransport() {
  device_.setWaitCheck(nullptr); // it calls into this transport
  // The executor drained its transfers; make sure, then free everything.
  for (auto &[key, l] : links_)
    if (l.stream) cudaStreamSynchronize(l.stream);
  cudaStreamSynchronize((cudaStream_t)device_.computeStream());
  if (reduction_) cudaStreamSynchronize(reduction_);
  sameGpu_.reset(); // drains its last notices
  for (ncclComm_t c : order_) ncclCommDestroy(c); // in creation order, the same on every rank
  for (auto &[key, l] : links_)
    if (l.stream) cudaStreamDestroy(l.stream);
  if (reduction_) cudaStreamDestroy(reduction_);
  for (auto &[r, e] : pending_) cudaEventDestroy(e);
  for (cudaEvent_t e : freeEvents_) cudaEventDestroy(e);
}

GpuTransport::Group GpuTransport::makeGroup(MPI_Comm comm, const char *what) {
  int size = 1;
  checkMpi(MPI_Comm_size(comm, &size), "MPI_Comm_size");
  if (size == 1) return {};
  // The members' GPUs (every member computes the same answer).
  std::string all(16 * (size_t)size, '\0'), mine = device_.uuid();
  mine.resize(16, '\0');
  checkMpi(MPI_Allgather(mine.data(), 16, MPI_BYTE, all.data(), 16, MPI_BYTE, comm), "MPI_Allgather (GPU ids)");
  bool shared = false;
  for (int a = 0; a < size; ++a)
    for (int b = a + 1; b < size; ++b) shared |= all.compare(16 * (size_t)a, 16, all, 16 * (size_t)b, 16) == 0;
  if (shared && !ncclEverywhere_) return {Sum::Host, nullptr};
  needNccl();
  Group g{Sum::Nccl, makeComm(comm, what)};
  order_.push_back(g.comm);
  return g;
}

void GpuTransport::connect(const Connections &c) {
  const int me = control_.rank(), R = control_.size();
  {
    // Every rank's GPU, and whether it runs the NCCL test mode: ranks that
    // disagreed on PIPEC_NCCL_SAME_GPU would route a pair two ways and wait
    // for each other forever.
    std::string all(17 * (size_t)R, '\0'), mine = device_.uuid();
    mine.resize(16, '\0');
    mine += ncclEverywhere_ ? '1' : '0';
    checkMpi(MPI_Allgather(mine.data(), 17, MPI_BYTE, all.data(), 17, MPI_BYTE, MPI_COMM_WORLD),
             "MPI_Allgather (GPU ids)");
    for (int r = 0; r < R; ++r) {
      gpus_.push_back(all.substr(17 * (size_t)r, 16));
      if (all[17 * (size_t)r + 16] != mine[16])
        throw Error("PIPEC_NCCL_SAME_GPU differs between rank " + std::to_string(me) + " and rank " +
                    std::to_string(r) + "; set it the same for every rank");
    }
  }
  auto sameGpu = [&](int a, int b) { return !ncclEverywhere_ && gpus_[a] == gpus_[b]; };
  // The transport's name in the start-up line: what carries the job's pairs.
  bool anyLocal = false, anyNccl = false;
  for (const auto &[from, to] : c.pairs) (sameGpu(from, to) ? anyLocal : anyNccl) = true;
  name_ = anyNccl && anyLocal ? ncclName_ + " between GPUs, same-GPU links within one"
          : anyLocal          ? std::string("same-GPU links (no NCCL between the pairs)")
                              : ncclName_;
  if (anyNccl) needNccl();
  int least = 0, greatest = 0;
  checkCuda(cudaDeviceGetStreamPriorityRange(&least, &greatest), "cudaDeviceGetStreamPriorityRange");
  // 0. The pairs on one GPU: their links exchange handles over MPI, with
  // nothing blocking in between, before any NCCL communicator (whose
  // creation blocks until all its members are there).
  std::vector<std::pair<int, int>> local;
  for (const auto &[from, to] : c.pairs)
    if ((from == me || to == me) && sameGpu(from, to)) local.push_back({from, to});
  // Every rank learns whether every rank connected them before any NCCL
  // communicator: a rank that failed here and went on to piperun's
  // agreement would leave the others waiting in ncclCommInitRank.
  std::string failed;
  try {
    sameGpu_ = std::make_unique<SameGpuLinks>(device_);
    sameGpu_->connect(local, c.receiveBytes, sameGpuPreference_, greatest);
  } catch (const std::exception &e) {
    failed = e.what();
  }
  int mine = !failed.empty(), any = 0;
  checkMpi(MPI_Allreduce(&mine, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD), "MPI_Allreduce (same-GPU links)");
  if (!failed.empty()) throw Error(failed);
  if (any) throw Error("another rank could not connect its same-GPU links (its message says why)");
  // NCCL allocates its buffers outside the stream-ordered pool: give it
  // what the pool kept from start-up.
  device_.releaseCachedMemory();
  // The host sums' pinned buffer, made now: cudaMallocHost and
  // cudaFreeHost wait for the whole device, which mid-run could wait for a
  // receive that waits for this rank.
  hostSumBytes_ = c.largestSum;
  // 1. The replicas of this stage (every rank is in exactly one such group).
  stage_ = makeGroup(control_.stageComm(), "replicas of the stage");
  if (stage_.sum == Sum::Nccl) checkCuda(cudaStreamCreateWithFlags(&reduction_, cudaStreamNonBlocking), "cudaStreamCreate");
  // 2. Tied-parameter groups, in the order Control::splitGroup made them.
  for (int g : c.groups) groups_[g] = makeGroup(control_.groupComm(g), "tied parameter group");
  // 3. One 2-rank communicator per ordered pair with traffic: the sender
  // makes the id and sends it to the receiver (all ids at once; one message
  // per ordered pair, so tag 0 on a private communicator), then the pairs
  // are initialized in the global sorted order.
  std::vector<IdMessage> ids(c.pairs.size());
  std::vector<MPI_Request> requests;
  MPI_Comm world = MPI_COMM_NULL; // private tags
  checkMpi(MPI_Comm_dup(MPI_COMM_WORLD, &world), "MPI_Comm_dup");
  std::string error;
  for (size_t k = 0; k < c.pairs.size(); ++k) {
    const auto [from, to] = c.pairs[k];
    if (sameGpu(from, to)) continue;
    if (from == me) {
      const ncclResult_t r = ncclGetUniqueId(&ids[k].id);
      ids[k].ok = r == ncclSuccess;
      if (!ids[k].ok && error.empty()) error = std::string("ncclGetUniqueId failed: ") + ncclGetErrorString(r);
      requests.emplace_back();
      checkMpi(MPI_Isend(&ids[k], sizeof(IdMessage), MPI_BYTE, to, 0, world, &requests.back()), "MPI_Isend (NCCL id)");
    } else if (to == me) {
      requests.emplace_back();
      checkMpi(MPI_Irecv(&ids[k], sizeof(IdMessage), MPI_BYTE, from, 0, world, &requests.back()), "MPI_Irecv (NCCL id)");
    }
  }
  const int rc = MPI_Waitall((int)requests.size(), requests.data(), MPI_STATUSES_IGNORE);
  MPI_Comm_free(&world);
  checkMpi(rc, "MPI_Waitall (NCCL ids)");
  if (!error.empty()) throw Error(error);
  // Transfers on high-priority streams: a send or receive starts as soon as
  // its bundle is ready instead of queueing behind compute kernels.
  for (size_t k = 0; k < c.pairs.size(); ++k) {
    const auto [from, to] = c.pairs[k];
    if ((from != me && to != me) || sameGpu(from, to)) continue;
    const bool send = from == me;
    const int peer = send ? to : from;
    if (!ids[k].ok)
      throw Error("rank " + std::to_string(from) + " could not create the NCCL id of its link to rank " + std::to_string(to));
    Link l;
    ncclInit(ncclCommInitRank(&l.comm, 2, ids[k].id, send ? 0 : 1),
             "ncclCommInitRank (rank " + std::to_string(from) + " -> rank " + std::to_string(to) + ")");
    order_.push_back(l.comm);
    l.peerInComm = send ? 1 : 0;
    checkCuda(cudaStreamCreateWithPriority(&l.stream, cudaStreamNonBlocking, greatest), "cudaStreamCreateWithPriority");
    links_[{peer, send}] = l;
  }
  // NCCL connects point-to-point peers at their first transfer, on the host,
  // together with the peer: do it now, one 64-byte transfer per link in the
  // same global order (so a failure is a start-up error and the first SEND of
  // the run does not wait on the host for its receiver).
  void *scratch = nullptr;
  checkCuda(cudaMalloc(&scratch, 64), "cudaMalloc");
  try {
    for (const auto &[from, to] : c.pairs) {
      if ((from != me && to != me) || sameGpu(from, to)) continue;
      Link &l = link(from == me ? to : from, from == me);
      if (from == me)
        nccl(ncclSend(scratch, 64, ncclUint8, l.peerInComm, l.comm, l.stream), "ncclSend (connecting)");
      else
        nccl(ncclRecv(scratch, 64, ncclUint8, l.peerInComm, l.comm, l.stream), "ncclRecv (connecting)");
      checkCuda(cudaStreamSynchronize(l.stream), "connecting NCCL links");
    }
  } catch (...) {
    cudaFree(scratch);
    throw;
  }
  cudaFree(scratch);
  // The routes, for piperun's start-up report: each rank says how it
  // receives and how its groups sum; rank 0 keeps the lines.
  std::string routes;
  for (const auto &[from, to] : c.pairs)
    if (to == me)
      routes += "rank " + std::to_string(from) + " -> rank " + std::to_string(to) + ": " +
              (sameGpu(from, to) ? sameGpu_->describe(from, false)
                                 : ncclEverywhere_ && gpus_[from] == gpus_[to] ? "same GPU, NCCL (PIPEC_NCCL_SAME_GPU)"
                                                                               : std::string("NCCL")) +
              "\n";
  int stageRank = 0;
  checkMpi(MPI_Comm_rank(control_.stageComm(), &stageRank), "MPI_Comm_rank");
  auto sumRoute = [](const Group &g) {
    return g.sum == Sum::Nccl ? "over NCCL" : "through host memory over MPI (some of its ranks share a GPU)";
  };
  if (stage_.sum != Sum::None && stageRank == 0)
    routes += "the replicas of rank " + std::to_string(me) + "'s stage sum gradients " + sumRoute(stage_) + "\n";
  for (const auto &[handle, g] : groups_) {
    int groupRank = 0;
    checkMpi(MPI_Comm_rank(control_.groupComm(handle), &groupRank), "MPI_Comm_rank");
    if (g.sum != Sum::None && groupRank == 0)
      routes += "the tied group led by rank " + std::to_string(me) + " sums " + sumRoute(g) + "\n";
  }
  routes_.clear();
  for (const std::string &lines : control_.gatherToRoot(routes)) routes_ += lines;
  bool hostSums = stage_.sum == Sum::Host;
  for (const auto &[handle, g] : groups_) hostSums |= g.sum == Sum::Host;
  if (hostSums) hostSums_ = HostBuffer(device_, hostSumBytes_);
  // From here every host wait on the device also watches NCCL's errors.
  if (!order_.empty()) device_.setWaitCheck([this] { checkAsyncErrors(); });
}

// A communicator in error (a peer failed, left or was killed): every
// communicator of this rank is aborted, so that the NCCL work of its
// other peers fails too instead of waiting for it, and the wait throws.
void GpuTransport::checkAsyncErrors() {
  for (ncclComm_t comm : order_) {
    ncclResult_t async = ncclSuccess;
    if (ncclCommGetAsyncError(comm, &async) != ncclSuccess || async == ncclSuccess || async == ncclInProgress) continue;
    const char *detail = ncclGetLastError(comm);
    const std::string what = std::string("NCCL reported ") + ncclGetErrorString(async) +
                             (detail && *detail ? std::string(" (") + detail + ")" : "") +
                             " while this rank waited: a peer failed or left; the communicators are aborted";
    abortAll();
    throw Error(what);
  }
}

void GpuTransport::abortAll() noexcept {
  device_.setWaitCheck(nullptr);
  for (ncclComm_t comm : order_) (void)ncclCommAbort(comm);
  order_.clear(); // not destroyed again
  for (auto &[key, l] : links_) l.comm = nullptr;
  stage_.comm = nullptr;
  for (auto &[handle, g] : groups_) g.comm = nullptr;
}

GpuTransport::Link &GpuTransport::link(int peer, bool send) {
  auto it = links_.find({peer, send});
  if (it == links_.end())
    throw Error("internal: no NCCL link " + std::string(send ? "to" : "from") + " rank " + std::to_string(peer) +
                " (a transfer the start-up check did not see)");
  return it->second;
}

Stream GpuTransport::stream(int peer, bool send) {
  return sameGpu_ && sameGpu_->has(peer, send) ? sameGpu_->stream(peer, send) : link(peer, send).stream;
}

GpuTransport::Request GpuTransport::enqueued(cudaStream_t s) {
  cudaEvent_t e = nullptr;
  if (!freeEvents_.empty()) {
    e = freeEvents_.back();
    freeEvents_.pop_back();
  } else {
    checkCuda(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
  }
  const cudaError_t rc = cudaEventRecord(e, s);
  if (rc != cudaSuccess) {
    freeEvents_.push_back(e);
    checkCuda(rc, "cudaEventRecord");
  }
  pending_[next_] = e;
  return next_++;
}

cudaEvent_t GpuTransport::take(Request r) {
  auto it = pending_.find(r);
  assert(it != pending_.end() && "a request is taken once, after isend or irecv returned it");
  cudaEvent_t e = it->second;
  pending_.erase(it);
  return e;
}

Event GpuTransport::event(Request r) {
  auto it = pending_.find(r);
  assert(it != pending_.end() && "an event is asked of a request isend or irecv returned and nobody took yet");
  return it->second;
}

// Streams that waited on the event keep waiting for the recorded work; the
// event may be recorded again (CUDA: a wait binds to the record before it).
void GpuTransport::release(Request r) { freeEvents_.push_back(take(r)); }

GpuTransport::Request GpuTransport::isend(const void *buf, size_t bytes, int peer, int) {
  if (sameGpu_ && sameGpu_->has(peer, true)) {
    sameGpu_->send(buf, bytes, peer);
    return enqueued(sameGpu_->stream(peer, true));
  }
  Link &l = link(peer, true);
  nccl(ncclSend(buf, bytes, ncclUint8, l.peerInComm, l.comm, l.stream), "ncclSend to rank " + std::to_string(peer));
  return enqueued(l.stream);
}

GpuTransport::Request GpuTransport::irecv(void *buf, size_t bytes, int peer, int) {
  if (sameGpu_ && sameGpu_->has(peer, false)) {
    sameGpu_->receive(buf, bytes, peer);
    return enqueued(sameGpu_->stream(peer, false));
  }
  Link &l = link(peer, false);
  nccl(ncclRecv(buf, bytes, ncclUint8, l.peerInComm, l.comm, l.stream), "ncclRecv from rank " + std::to_string(peer));
  return enqueued(l.stream);
}

void GpuTransport::wait(Request r) {
  cudaEvent_t e = take(r);
  freeEvents_.push_back(e); // reusable once waited for (or once an error ends the run)
  // The device's wait polls NCCL's asynchronous errors (checkAsyncErrors),
  // so that a peer gone surfaces instead of waiting forever.
  device_.await(e, "waiting for a transfer");
}

// Ranks that share a GPU sum through pinned host memory: the gradients come
// down once the compute stream has produced them, MPI sums them (the tied
// groups' rule: reduce to the first rank and broadcast, so copies stay
// bitwise equal), and they go back up.
void GpuTransport::sumOnHost(int group, void *buf, size_t count, pipec_dtype dtype) {
  const size_t bytes = count * io::dtypeSize(dtype);
  if (hostSums_.size() < bytes)
    throw Error("internal: a host sum of " + std::to_string(bytes) + " bytes, more than the " +
                std::to_string(hostSums_.size()) + " made at start-up (Connections::largestSum)");
  device_.download(hostSums_.data(), buf, bytes);
  if (group < 0) host_.allreduceSumStage(hostSums_.data(), count, dtype);
  else host_.allreduceSumGroup(group, hostSums_.data(), count, dtype);
  device_.upload(buf, hostSums_.data(), bytes);
}

void GpuTransport::allreduceSumStage(void *buf, size_t count, pipec_dtype dtype, Stream stream) {
  if (stage_.sum == Sum::None || count == 0) return; // one replica: nothing to sum
  if (stage_.sum == Sum::Host) return sumOnHost(-1, buf, count, dtype);
  nccl(ncclAllReduce(buf, buf, count, ncclType(dtype), ncclSum, stage_.comm,
                     (cudaStream_t)(stream ? stream : device_.computeStream())),
       "ncclAllReduce (gradients)");
}

void GpuTransport::allreduceSumGroup(int group, void *buf, size_t count, pipec_dtype dtype) {
  auto it = groups_.find(group);
  assert(it != groups_.end() && "connect() made a communicator for every group of splitGroup");
  const Group &g = it->second;
  if (g.sum == Sum::None || count == 0) return;
  if (g.sum == Sum::Host) return sumOnHost(group, buf, count, dtype);
  // Reduce to the group's first rank, broadcast: every copy gets the same bits.
  const cudaStream_t s = (cudaStream_t)device_.computeStream();
  nccl(ncclReduce(buf, buf, count, ncclType(dtype), ncclSum, 0, g.comm, s), "ncclReduce (tied gradients)");
  nccl(ncclBroadcast(buf, buf, count, ncclType(dtype), 0, g.comm, s), "ncclBroadcast (tied gradients)");
}

} // namespace pipec::rt
