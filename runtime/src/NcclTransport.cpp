#include "NcclTransport.h"

#include "Plan.h" // Error

#include <mpi.h>

namespace pipec::rt {

namespace {
void cuda(cudaError_t e, const char *what) {
  if (e != cudaSuccess) throw Error(std::string(what) + ": " + cudaGetErrorString(e));
}
void nccl(ncclResult_t r, const char *what) {
  if (r != ncclSuccess) throw Error(std::string(what) + ": " + ncclGetErrorString(r));
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
// Unique id from the communicator's rank 0, broadcast over MPI.
ncclComm_t makeComm(MPI_Comm comm) {
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  ncclUniqueId id;
  if (rank == 0) nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
  MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, comm);
  ncclComm_t c;
  nccl(ncclCommInitRank(&c, size, id, rank), "ncclCommInitRank");
  return c;
}
} // namespace

NcclTransport::NcclTransport(const MpiControl &control, int stageColor) {
  // Device = node-local rank modulo the visible devices.
  MPI_Comm local;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, control.rank(), MPI_INFO_NULL, &local);
  int localRank = 0, devices = 0;
  MPI_Comm_rank(local, &localRank);
  MPI_Comm_free(&local);
  cuda(cudaGetDeviceCount(&devices), "cudaGetDeviceCount");
  if (devices == 0) throw Error("no CUDA device");
  cuda(cudaSetDevice(localRank % devices), "cudaSetDevice");
  cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  world_ = makeComm(MPI_COMM_WORLD);
  MPI_Comm stage;
  MPI_Comm_split(MPI_COMM_WORLD, stageColor, control.rank(), &stage);
  stage_ = makeComm(stage);
  MPI_Comm_free(&stage);
}

NcclTransport::~NcclTransport() {
  for (auto &[id, e] : events_) cudaEventDestroy(e);
  if (stage_) ncclCommDestroy(stage_);
  if (world_) ncclCommDestroy(world_);
  if (stream_) cudaStreamDestroy(stream_);
}

NcclTransport::Request NcclTransport::record() {
  cudaEvent_t e;
  cuda(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
  cuda(cudaEventRecord(e, stream_), "cudaEventRecord");
  events_[next_] = e;
  return next_++;
}

// NCCL matches point-to-point operations by issue order per peer pair, not
// by tag; the executor issues them in stream order on both sides, which the
// schedule validator guarantees consistent.
NcclTransport::Request NcclTransport::isend(const void *buf, size_t bytes, int peer, int) {
  nccl(ncclSend(buf, bytes, ncclUint8, peer, world_, stream_), "ncclSend");
  return record();
}
NcclTransport::Request NcclTransport::irecv(void *buf, size_t bytes, int peer, int) {
  nccl(ncclRecv(buf, bytes, ncclUint8, peer, world_, stream_), "ncclRecv");
  return record();
}
void NcclTransport::wait(Request r) {
  auto it = events_.find(r);
  if (it == events_.end()) throw Error("internal: wait on an unknown request");
  const cudaError_t e = cudaEventSynchronize(it->second);
  cudaEventDestroy(it->second);
  events_.erase(it);
  cuda(e, "cudaEventSynchronize");
}
void NcclTransport::allreduceSumStage(void *buf, size_t count, pipec_dtype dtype) {
  nccl(ncclAllReduce(buf, buf, count, ncclType(dtype), ncclSum, stage_, stream_), "ncclAllReduce");
  cuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
}

} // namespace pipec::rt
