// Fake NCCL for the emulated piperun (test/runtime's piperun_emulated): the
// communicators GpuTransport makes, carried by MPI point-to-point messages on
// MPI_COMM_WORLD, so that its NCCL path runs in CI (docs/runtime.md, "The
// CUDA target, emulated"). Work runs when it is issued, as everywhere in the
// emulation: ncclSend and ncclRecv are blocking MPI_Send and MPI_Recv (the
// streams' start-up check proves them complete under those semantics), and
// a collective is a reduction to the communicator's rank 0 and a broadcast.
// ncclCommInitRank finds the world ranks of a communicator's members through
// a directory named by its id (one machine: the emulation's). Built into
// piperun_emulated only, which links MPI.
#pragma once
#include <cuda_runtime.h>
#include <mpi.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

typedef enum {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
} ncclResult_t;
typedef enum { ncclInt8 = 0, ncclUint8 = 1, ncclInt32 = 2, ncclInt64 = 4, ncclFloat32 = 7, ncclFloat64 = 8 } ncclDataType_t;
typedef enum { ncclSum = 0 } ncclRedOp_t;
typedef struct {
  char internal[128];
} ncclUniqueId;
struct ncclComm {
  std::string id;              // the unique id's text
  int rank = 0, size = 0;
  std::vector<int> worldRanks; // of every member
  int tag = 0;                 // the communicator's MPI tag
  std::string directory;       // the rendezvous, removed by the last member's destroy
};
typedef ncclComm *ncclComm_t;

namespace emu::nccl {
inline std::string lastError;
inline ncclResult_t fail(const std::string &why) {
  lastError = why;
  return ncclSystemError;
}
inline size_t bytesOf(ncclDataType_t t) {
  switch (t) {
  case ncclInt8:
  case ncclUint8: return 1;
  case ncclInt32:
  case ncclFloat32: return 4;
  default: return 8;
  }
}
// Tags in the upper half of MPI_TAG_UB (piperun's own traffic on
// MPI_COMM_WORLD is collectives), at most 2^20 of them: two communicators of
// one pair of ranks collide with a chance of about 1 in a million.
inline int tagOf(const std::string &id) {
  int *ub = nullptr, flag = 0;
  MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &flag);
  const int top = flag && ub ? *ub : 32767, base = top / 2, span = std::min(1 << 20, top - base);
  return base + (int)(std::hash<std::string>()(id) % (size_t)span);
}
template <class T> void add(void *into, const void *from, size_t n) {
  for (size_t k = 0; k < n; ++k) static_cast<T *>(into)[k] += static_cast<const T *>(from)[k];
}
inline void sum(void *into, const void *from, size_t count, ncclDataType_t t) {
  switch (t) {
  case ncclFloat32: add<float>(into, from, count); break;
  case ncclFloat64: add<double>(into, from, count); break;
  case ncclInt32: add<int32_t>(into, from, count); break;
  case ncclInt64: add<int64_t>(into, from, count); break;
  default: add<uint8_t>(into, from, count); break;
  }
}
inline ncclResult_t mpi(int rc, const char *what) { return rc == MPI_SUCCESS ? ncclSuccess : fail(what); }
} // namespace emu::nccl

// The version NCCL 2.28.9 would report: the emulation says what it stands in for.
inline ncclResult_t ncclGetVersion(int *v) { *v = 22809; return ncclSuccess; }
inline const char *ncclGetErrorString(ncclResult_t r) { return r == ncclSuccess ? "no error" : "emulated NCCL error"; }
inline const char *ncclGetLastError(ncclComm_t) { return emu::nccl::lastError.c_str(); }
inline ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
  std::memset(id, 0, sizeof *id);
  std::random_device random;
  std::snprintf(id->internal, sizeof id->internal, "pipec-emu-nccl-%d-%08x%08x", (int)getpid(), random(), random());
  return ncclSuccess;
}
// PIPEC_EMU_NCCL_INIT_FAILS=R: MPI rank R's communicators fail to form
// (as with an unreachable network), leaving the other members waiting.
inline ncclResult_t ncclCommInitRank(ncclComm_t *comm, int size, ncclUniqueId id, int rank) {
  {
    int world = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &world);
    const char *fails = std::getenv("PIPEC_EMU_NCCL_INIT_FAILS");
    if (fails && *fails && std::atoi(fails) == world) return emu::nccl::fail("no network reaches the other members");
  }
  auto *c = new ncclComm;
  c->id = id.internal, c->rank = rank, c->size = size, c->tag = emu::nccl::tagOf(c->id);
  c->directory = "/tmp/" + c->id;
  int world = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &world);
  mkdir(c->directory.c_str(), 0700);
  {
    std::ofstream(c->directory + "/" + std::to_string(rank) + ".tmp") << world;
    std::rename((c->directory + "/" + std::to_string(rank) + ".tmp").c_str(),
                (c->directory + "/" + std::to_string(rank)).c_str());
  }
  c->worldRanks.assign(size, -1);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  for (int r = 0; r < size; ++r)
    while (!(std::ifstream(c->directory + "/" + std::to_string(r)) >> c->worldRanks[r])) {
      if (std::chrono::steady_clock::now() > deadline) {
        delete c;
        return emu::nccl::fail("ncclCommInitRank: rank " + std::to_string(r) + " of the communicator never came");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  *comm = c;
  return ncclSuccess;
}
inline ncclResult_t ncclCommDestroy(ncclComm_t c) {
  if (!c) return ncclSuccess;
  std::remove((c->directory + "/" + std::to_string(c->rank)).c_str());
  rmdir(c->directory.c_str()); // fails until the last member is gone
  delete c;
  return ncclSuccess;
}
inline ncclResult_t ncclCommAbort(ncclComm_t c) { return ncclCommDestroy(c); }
inline ncclResult_t ncclCommGetAsyncError(ncclComm_t, ncclResult_t *r) { *r = ncclSuccess; return ncclSuccess; }
inline ncclResult_t ncclSend(const void *buf, size_t count, ncclDataType_t t, int peer, ncclComm_t c, cudaStream_t s) {
  emu::checkStream(s);
  emu::noteTransfer(s);
  return emu::nccl::mpi(MPI_Send(buf, (int)(count * emu::nccl::bytesOf(t)), MPI_BYTE, c->worldRanks[peer], c->tag,
                                 MPI_COMM_WORLD), "ncclSend (MPI_Send)");
}
inline ncclResult_t ncclRecv(void *buf, size_t count, ncclDataType_t t, int peer, ncclComm_t c, cudaStream_t s) {
  emu::checkStream(s);
  emu::noteTransfer(s);
  return emu::nccl::mpi(MPI_Recv(buf, (int)(count * emu::nccl::bytesOf(t)), MPI_BYTE, c->worldRanks[peer], c->tag,
                                 MPI_COMM_WORLD, MPI_STATUS_IGNORE), "ncclRecv (MPI_Recv)");
}
// Sums into `root`'s recvbuf, in member order.
inline ncclResult_t ncclReduce(const void *sendbuf, void *recvbuf, size_t count, ncclDataType_t t, ncclRedOp_t, int root,
                               ncclComm_t c, cudaStream_t s) {
  emu::checkStream(s);
  const size_t bytes = count * emu::nccl::bytesOf(t);
  if (c->rank != root)
    return emu::nccl::mpi(MPI_Send(sendbuf, (int)bytes, MPI_BYTE, c->worldRanks[root], c->tag, MPI_COMM_WORLD),
                          "ncclReduce (MPI_Send)");
  if (recvbuf != sendbuf) std::memcpy(recvbuf, sendbuf, bytes);
  std::vector<char> part(bytes);
  for (int r = 0; r < c->size; ++r) {
    if (r == root) continue;
    if (MPI_Recv(part.data(), (int)bytes, MPI_BYTE, c->worldRanks[r], c->tag, MPI_COMM_WORLD, MPI_STATUS_IGNORE) !=
        MPI_SUCCESS)
      return emu::nccl::fail("ncclReduce (MPI_Recv)");
    emu::nccl::sum(recvbuf, part.data(), count, t);
  }
  return ncclSuccess;
}
inline ncclResult_t ncclBroadcast(const void *sendbuf, void *recvbuf, size_t count, ncclDataType_t t, int root,
                                  ncclComm_t c, cudaStream_t s) {
  emu::checkStream(s);
  const size_t bytes = count * emu::nccl::bytesOf(t);
  if (c->rank != root)
    return emu::nccl::mpi(MPI_Recv(recvbuf, (int)bytes, MPI_BYTE, c->worldRanks[root], c->tag, MPI_COMM_WORLD,
                                   MPI_STATUS_IGNORE), "ncclBroadcast (MPI_Recv)");
  if (recvbuf != sendbuf) std::memcpy(recvbuf, sendbuf, bytes);
  for (int r = 0; r < c->size; ++r)
    if (r != root && MPI_Send(recvbuf, (int)bytes, MPI_BYTE, c->worldRanks[r], c->tag, MPI_COMM_WORLD) != MPI_SUCCESS)
      return emu::nccl::fail("ncclBroadcast (MPI_Send)");
  return ncclSuccess;
}
inline ncclResult_t ncclAllReduce(const void *sendbuf, void *recvbuf, size_t count, ncclDataType_t t, ncclRedOp_t op,
                                  ncclComm_t c, cudaStream_t s) {
  const ncclResult_t r = ncclReduce(sendbuf, recvbuf, count, t, op, 0, c, s);
  return r != ncclSuccess ? r : ncclBroadcast(recvbuf, recvbuf, count, t, 0, c, s);
}
