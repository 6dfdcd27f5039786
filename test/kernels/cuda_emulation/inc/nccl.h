// Fake NCCL for the emulated piperun (test/runtime: piperun_emulated): it compiles
// GpuTransport, whose NCCL half the emulation cannot run (one emulated GPU:
// every pair of ranks shares it and takes SameGpuLinks). Every call that
// would communicate fails, naming the emulation.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>

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
struct ncclComm;
typedef ncclComm *ncclComm_t;
typedef struct {
  char internal[128];
} ncclUniqueId;

namespace emu {
inline ncclResult_t noNccl() { return ncclInternalError; }
} // namespace emu
// The version NCCL 2.28.9 would report: the emulation says what it stands in for.
inline ncclResult_t ncclGetVersion(int *v) { *v = 22809; return ncclSuccess; }
inline const char *ncclGetErrorString(ncclResult_t r) { return r == ncclSuccess ? "no error" : "emulated NCCL error"; }
inline const char *ncclGetLastError(ncclComm_t) { return "the host emulation has no NCCL (one emulated GPU)"; }
inline ncclResult_t ncclGetUniqueId(ncclUniqueId *) { return emu::noNccl(); }
inline ncclResult_t ncclCommInitRank(ncclComm_t *, int, ncclUniqueId, int) { return emu::noNccl(); }
inline ncclResult_t ncclCommDestroy(ncclComm_t) { return ncclSuccess; }
inline ncclResult_t ncclCommAbort(ncclComm_t) { return ncclSuccess; }
inline ncclResult_t ncclCommGetAsyncError(ncclComm_t, ncclResult_t *r) { *r = ncclSuccess; return ncclSuccess; }
inline ncclResult_t ncclSend(const void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) { return emu::noNccl(); }
inline ncclResult_t ncclRecv(void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) { return emu::noNccl(); }
inline ncclResult_t ncclAllReduce(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t) {
  return emu::noNccl();
}
inline ncclResult_t ncclReduce(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, int, ncclComm_t, cudaStream_t) {
  return emu::noNccl();
}
inline ncclResult_t ncclBroadcast(const void *, void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) {
  return emu::noNccl();
}
