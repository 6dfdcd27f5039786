// The execution context of the CUDA kernels: the stream and precision a
// StreamScope binds, stream-ordered memory, host/device copies, the device
// error flag, cuBLAS handles, and the error helpers of detail.cuh.
#include "detail.cuh"
#include "index_map.cuh"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <vector>

namespace pipec::kernels::cuda {

namespace {
thread_local cudaStream_t currentStream = nullptr;
thread_local Precision currentPrecision = Precision::F32;

/// The per-device error flag: mapped pinned host memory, so the host reads
/// it without synchronizing and kernels write it through `device`.
struct ErrorFlag {
  std::atomic<int *> host{nullptr};
  int *device = nullptr;
};
constexpr int kMaxDevices = 64;
ErrorFlag errorFlags[kMaxDevices];
std::mutex errorFlagMutex;

int currentDevice(const char *op) {
  int device = 0;
  detail::check(cudaGetDevice(&device), op);
  if (device < 0 || device >= kMaxDevices)
    detail::fail(op, "device " + std::to_string(device) + " beyond the " + std::to_string(kMaxDevices) +
                         " supported");
  return device;
}

ErrorFlag &flagOf(int device, const char *op) {
  ErrorFlag &flag = errorFlags[device];
  if (flag.host.load(std::memory_order_acquire)) return flag;
  std::lock_guard<std::mutex> lock(errorFlagMutex);
  if (flag.host.load(std::memory_order_relaxed)) return flag;
  void *host = nullptr;
  detail::check(cudaHostAlloc(&host, sizeof(int), cudaHostAllocMapped | cudaHostAllocPortable), op);
  *static_cast<volatile int *>(host) = 0;
  void *mapped = nullptr;
  const cudaError_t status = cudaHostGetDevicePointer(&mapped, host, 0);
  if (status != cudaSuccess) {
    cudaFreeHost(host);
    detail::check(status, op);
  }
  flag.device = static_cast<int *>(mapped);
  flag.host.store(static_cast<int *>(host), std::memory_order_release);
  return flag;
}

const char *deviceErrorMessage(int code) {
  switch (code) {
  case detail::kGatherIndexOutOfRange: return "nn.gather: an index is out of range for the gathered axis";
  case detail::kGatherGradIndexOutOfRange:
    return "nn.gather_grad: an index is out of range for the gathered axis";
  case detail::kLossLabelOutOfRange:
    return "nn.softmax_cross_entropy_loss: a label is out of range [0, classes)";
  case detail::kIntegerDivisionByZero: return "nn.div, nn.mod or nn.fmod: integer division by zero";
  case detail::kIntegerNegativeExponent: return "nn.pow: integer power with a negative exponent";
  default: return "a CUDA kernel reported an unknown device error";
  }
}

/// This thread's cuBLAS handles, one per device, destroyed when the thread ends.
struct BlasHandles {
  cublasHandle_t handles[kMaxDevices] = {};
  ~BlasHandles() {
    for (cublasHandle_t h : handles)
      if (h) cublasDestroy(h); // may fail when the driver is already gone at exit: ignored
  }
};
thread_local BlasHandles blasHandles;

/// This thread's cuBLASLt handles and matmul workspaces, one per device:
/// the workspace is allocated once, on the first epilogue GEMM, and kept.
struct BlasLtContexts {
  cublasLtHandle_t handles[kMaxDevices] = {};
  void *workspaces[kMaxDevices] = {};
  cudaStream_t streams[kMaxDevices] = {}; // of the workspace's last use
  ~BlasLtContexts() {
    for (int d = 0; d < kMaxDevices; ++d) { // may fail when the driver is already gone at exit: ignored
      if (workspaces[d]) cudaFree(workspaces[d]);
      if (handles[d]) cublasLtDestroy(handles[d]);
    }
  }
};
thread_local BlasLtContexts blasLtContexts;

/// This thread's kernel scratch, per device: detail::kScratchSlots buffers
/// that grow to the largest size a kernel asks for and are then reused, so
/// that a stage allocates nothing on any call after the first.
struct ScratchSlots {
  void *pointers[kMaxDevices][detail::kScratchSlots] = {};
  size_t bytes[kMaxDevices][detail::kScratchSlots] = {};
  cudaStream_t streams[kMaxDevices][detail::kScratchSlots] = {}; // of the last use
  // detail::zeroedCounters: all zero whenever no kernel is using them.
  unsigned *counters[kMaxDevices] = {};
  size_t counterCount[kMaxDevices] = {};
  cudaStream_t counterStreams[kMaxDevices] = {};
  ~ScratchSlots() {
    for (auto &device : pointers)
      for (void *p : device)
        if (p) cudaFree(p); // may fail when the driver is already gone at exit: ignored
    for (unsigned *p : counters)
      if (p) cudaFree(p);
  }
};
thread_local ScratchSlots scratchSlots;

/// Bumped whenever the library's own device memory that kernels address
/// (scratch slots, the cuBLASLt workspace) is allocated or moved: a CUDA
/// graph captured before holds addresses that may be gone (CallGraphs).
std::atomic<uint64_t> libraryMemoryGeneration{0};

__global__ void storeScalarKernel(float *to, float value) { *to = value; }
__global__ void storeKeyKernel(uint64_t *to, uint64_t value) { *to = value; }

__global__ void accumulateKernel(float *to, const float *from, int64_t n) {
  for (int64_t i = detail::firstIndex(); i < n; i += detail::gridStride()) to[i] += from[i];
}
} // namespace

//===----------------------------------------------------------------------===//
// detail
//===----------------------------------------------------------------------===//

namespace detail {

void fail(const char *op, const std::string &message) { throw KernelError(std::string(op) + ": " + message); }

void check(cudaError_t status, const char *op) {
  if (status == cudaSuccess) return;
  (void)cudaGetLastError(); // reported here, not again by raiseDeviceErrors
  fail(op, cudaGetErrorString(status));
}

void checkBlas(cublasStatus_t status, const char *op) {
  if (status != CUBLAS_STATUS_SUCCESS) fail(op, std::string("cuBLAS: ") + cublasGetStatusString(status));
}

void checkLaunch(const char *op) {
  const cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess) fail(op, std::string("kernel launch failed: ") + cudaGetErrorString(status));
}

int deviceIndex(const char *op) { return currentDevice(op); }

void failIfCapturing(const char *op, const char *what) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  check(cudaStreamIsCapturing(currentStream, &capture), op);
  if (capture != cudaStreamCaptureStatusNone) fail(op, std::string(what) + " inside a CUDA graph capture");
}

cudaStream_t stream() { return currentStream; }
Precision precision() { return currentPrecision; }

cublasHandle_t blas() {
  const int device = currentDevice("cuBLAS");
  cublasHandle_t &handle = blasHandles.handles[device];
  if (!handle) checkBlas(cublasCreate(&handle), "cuBLAS"); // default math mode: no TF32
  checkBlas(cublasSetStream(handle, currentStream), "cuBLAS");
  return handle;
}

/// Before a thread's own device buffer (a scratch slot, the cuBLASLt
/// workspace) is used on the scope's stream: if the thread used it last on
/// another stream, that stream's kernels may still read it, so they finish
/// first. That stream must still exist (cuda_kernels.h, StreamScope).
static void waitForStreamThatUsed(cudaStream_t &lastStream, const char *what) {
  if (lastStream != currentStream) check(cudaStreamSynchronize(lastStream), what);
  lastStream = currentStream;
}

BlasLt blasLt() {
  const int device = currentDevice("cuBLASLt");
  cublasLtHandle_t &handle = blasLtContexts.handles[device];
  if (!handle) checkBlas(cublasLtCreate(&handle), "cuBLASLt");
  void *&workspace = blasLtContexts.workspaces[device];
  if (!workspace) {
    check(cudaMalloc(&workspace, kBlasLtWorkspaceBytes), "cuBLASLt workspace");
    ++libraryMemoryGeneration;
  }
  waitForStreamThatUsed(blasLtContexts.streams[device], "cuBLASLt workspace");
  return {handle, workspace};
}

void *scratch(int slot, size_t bytes) {
  if (slot < 0 || slot >= kScratchSlots) fail("kernel scratch", "no slot " + std::to_string(slot));
  const int device = currentDevice("kernel scratch");
  void *&pointer = scratchSlots.pointers[device][slot];
  size_t &size = scratchSlots.bytes[device][slot];
  cudaStream_t &lastStream = scratchSlots.streams[device][slot];
  if (pointer) waitForStreamThatUsed(lastStream, "kernel scratch"); // before reuse or freeing
  if (bytes > size) {
    failIfCapturing("kernel scratch", "would grow");
    if (pointer) {
      check(cudaFreeAsync(pointer, currentStream), "kernel scratch");
      pointer = nullptr;
      size = 0;
    }
    check(cudaMallocAsync(&pointer, bytes, currentStream), "kernel scratch");
    size = bytes;
    ++libraryMemoryGeneration;
  }
  lastStream = currentStream;
#ifdef PIPEC_CUDA_EMULATION
  // The emulation fills fresh device memory with NaN so that a kernel that
  // reads scratch it did not write shows; reused scratch gets the same.
  emu::fillUncounted(pointer, 0xff, bytes, currentStream);
#endif
  return pointer;
}

unsigned *zeroedCounters(size_t count) {
  constexpr size_t kMinCounters = 1024; // 4 KiB: every tile count of common shapes
  const int device = currentDevice("kernel counters");
  unsigned *&counters = scratchSlots.counters[device];
  size_t &size = scratchSlots.counterCount[device];
  cudaStream_t &lastStream = scratchSlots.counterStreams[device];
  if (counters) waitForStreamThatUsed(lastStream, "kernel counters");
  if (count > size) {
    failIfCapturing("kernel counters", "would grow");
    if (counters) {
      check(cudaFreeAsync(counters, currentStream), "kernel counters");
      counters = nullptr;
      size = 0;
    }
    const size_t grown = count > kMinCounters ? count : kMinCounters;
    void *pointer = nullptr;
    check(cudaMallocAsync(&pointer, grown * sizeof(unsigned), currentStream), "kernel counters");
    counters = static_cast<unsigned *>(pointer);
    check(cudaMemsetAsync(counters, 0, grown * sizeof(unsigned), currentStream), "kernel counters");
    size = grown;
    ++libraryMemoryGeneration;
  }
  lastStream = currentStream;
  return counters;
}

int *errorFlag() { return flagOf(currentDevice("device error flag"), "device error flag").device; }

unsigned blocksFor(int64_t n) {
  constexpr int64_t kMaxBlocks = 65536; // grid-stride loops cover the rest
  if (n <= 0) return 1;
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  return (unsigned)(blocks < kMaxBlocks ? blocks : kMaxBlocks);
}

} // namespace detail

//===----------------------------------------------------------------------===//
// Public context API
//===----------------------------------------------------------------------===//

StreamScope::StreamScope(void *stream, Precision precision)
    : previousStream_(currentStream), previousPrecision_(currentPrecision) {
  currentStream = static_cast<cudaStream_t>(stream);
  currentPrecision = precision;
#ifdef PIPEC_CUDA_EMULATION
  ++emu::scopes; // the emulation's lazy-initialization check (cuda_runtime.h)
#endif
}

StreamScope::~StreamScope() {
  currentStream = static_cast<cudaStream_t>(previousStream_);
  currentPrecision = previousPrecision_;
#ifdef PIPEC_CUDA_EMULATION
  --emu::scopes;
#endif
}

void *deviceAllocate(size_t bytes) {
  void *pointer = nullptr;
  detail::check(cudaMallocAsync(&pointer, bytes ? bytes : 1, currentStream), "deviceAllocate");
  return pointer;
}

void deviceFree(void *pointer) {
  // Called from destructors: never throws. A failure stays in the runtime's
  // last-error state and is reported by the next checkLaunch or raiseDeviceErrors.
  if (pointer) (void)cudaFreeAsync(pointer, currentStream);
}

DeviceConstant::DeviceConstant(const void *host, size_t bytes) {
  detail::check(cudaMalloc(&device_, bytes ? bytes : 1), "DeviceConstant");
  if (bytes) {
    // On the scope's stream and waited for, so that kernels on any stream
    // (blocking or not, per-thread default streams) see the whole table.
    cudaError_t status = cudaMemcpyAsync(device_, host, bytes, cudaMemcpyHostToDevice, detail::stream());
    if (status == cudaSuccess) status = cudaStreamSynchronize(detail::stream());
    if (status != cudaSuccess) {
      cudaFree(device_);
      device_ = nullptr;
      detail::check(status, "DeviceConstant");
    }
  }
}

DeviceConstant::~DeviceConstant() {
  // Static objects die after the CUDA runtime may have shut down
  // (cudaErrorCudartUnloading): tolerated, and not left as the last error.
  if (device_ && cudaFree(device_) != cudaSuccess) (void)cudaGetLastError();
}

void copyToHost(void *host, const void *device, size_t bytes) {
  if (!bytes) return;
  detail::check(cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost, currentStream), "copyToHost");
  detail::check(cudaStreamSynchronize(currentStream), "copyToHost");
}

void storeScalar(float *device, float value) {
  storeScalarKernel<<<1, 1, 0, currentStream>>>(device, value);
  detail::checkLaunch("storeScalar");
}

void accumulate(float *to, const float *from, int64_t n) {
  if (n <= 0) return;
  accumulateKernel<<<detail::blocksFor(n), detail::kThreads, 0, currentStream>>>(to, from, n);
  detail::checkLaunch("accumulate");
}

double profileClock() {
  detail::check(cudaStreamSynchronize(currentStream), "profileClock");
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void raiseDeviceErrors() {
  const cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess) detail::fail("CUDA", cudaGetErrorString(status));
  // No flag yet on this device: no kernel that can raise has run on it.
  volatile int *host = errorFlags[currentDevice("raiseDeviceErrors")].host.load(std::memory_order_acquire);
  if (!host) return;
  const int code = *host;
  if (code == detail::kNoError) return;
  *host = detail::kNoError;
  throw KernelError(deviceErrorMessage(code));
}


//===----------------------------------------------------------------------===//
// CUDA graphs of stage calls
//===----------------------------------------------------------------------===//

namespace {
/// What a captured graph depends on besides the stage's code: every pointer
/// the call passes (kernel arguments hold them), its stream, loss scale and
/// inference flag.
std::vector<uintptr_t> callSignature(const pipec_call &call, const pipec_stage_desc &stage) {
  std::vector<uintptr_t> key;
  auto add = [&](const void *const *pointers, int32_t count) {
    key.push_back(pointers != nullptr);
    if (pointers)
      for (int32_t i = 0; i < count; ++i) key.push_back(reinterpret_cast<uintptr_t>(pointers[i]));
  };
  add(call.params, stage.num_params);
  add(call.data, stage.num_data);
  add(call.inputs, stage.num_inputs);
  add(call.outputs, stage.num_outputs);
  add(call.grad_outputs, stage.num_outputs);
  add(call.grad_inputs, stage.num_inputs);
  add(call.grad_params, stage.num_params);
  uint32_t lossScaleBits = 0;
  std::memcpy(&lossScaleBits, &call.loss_scale, sizeof lossScaleBits);
  key.insert(key.end(), {reinterpret_cast<uintptr_t>(call.workspace), reinterpret_cast<uintptr_t>(call.loss),
                         reinterpret_cast<uintptr_t>(call.stream), lossScaleBits, (uintptr_t)(call.inference != 0)});
  return key;
}
} // namespace

struct CallGraphs::State {
  struct Graph {
    cudaGraphExec_t exec = nullptr;
    uint64_t memoryGeneration = 0, lastUse = 0;
  };
  const char *entryPoint;
  bool warm[2] = {false, false}; // per kind of call: training, inference
  bool disabled = false;
  uint64_t uses = 0;
  std::map<std::vector<uintptr_t>, Graph> graphs;
  std::vector<std::pair<cudaStream_t, uint64_t *>> keys; // the call key's device memory, per stream

  uint64_t *keyFor(cudaStream_t stream) {
    for (auto &[s, key] : keys)
      if (s == stream) return key;
    void *memory = nullptr;
    detail::check(cudaMalloc(&memory, sizeof(uint64_t)), "CUDA graph call key");
    keys.emplace_back(stream, static_cast<uint64_t *>(memory));
    return keys.back().second;
  }
  void drop(Graph &graph) {
    if (graph.exec && cudaGraphExecDestroy(graph.exec) != cudaSuccess) (void)cudaGetLastError();
    graph.exec = nullptr;
  }
  void giveUp(const std::string &why) {
    disabled = true;
    (void)cudaGetLastError();
    std::fprintf(stderr, "pipec stage: %s: capturing a CUDA graph failed (%s); this entry point issues its launches "
                 "one by one from now on\n", entryPoint, why.c_str());
  }
  /// Captures `work` on `stream` into an executable graph; nullptr (after
  /// giveUp) when anything in it cannot be captured.
  cudaGraphExec_t capture(cudaStream_t stream, const std::function<void(const uint64_t *)> &work, const uint64_t *key) {
    const cudaError_t began = cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal);
    if (began != cudaSuccess) {
      giveUp(cudaGetErrorString(began));
      return nullptr;
    }
    std::string failure;
    try {
      work(key);
    } catch (const std::exception &error) {
      failure = error.what();
    } catch (...) { // whatever it is, the capture must end before the stream is used again
      failure = "an exception";
    }
    cudaGraph_t graph = nullptr;
    const cudaError_t ended = cudaStreamEndCapture(stream, &graph);
    if (failure.empty() && ended != cudaSuccess) failure = cudaGetErrorString(ended);
    cudaGraphExec_t exec = nullptr;
    if (failure.empty()) {
      const cudaError_t made = cudaGraphInstantiate(&exec, graph, 0);
      if (made != cudaSuccess) failure = cudaGetErrorString(made), exec = nullptr;
    }
    if (graph) (void)cudaGraphDestroy(graph);
    if (!failure.empty()) giveUp(failure);
    return exec;
  }
};

CallGraphs::CallGraphs(const char *entryPoint) : state_(new State) { state_->entryPoint = entryPoint; }

CallGraphs::~CallGraphs() {
  // Thread-local objects die at thread exit, possibly after the driver:
  // failures are ignored.
  for (auto &entry : state_->graphs) state_->drop(entry.second);
  for (auto &key : state_->keys)
    if (cudaFree(key.second) != cudaSuccess) (void)cudaGetLastError();
  delete state_;
}

void CallGraphs::run(const pipec_call *call, const pipec_stage_desc &stage, bool drawsDropout,
                     const std::function<void(const uint64_t *callKey)> &work) {
  State &s = *state_;
  const cudaStream_t stream = currentStream;
  const uint64_t *key = nullptr;
  if (drawsDropout) {
    uint64_t *memory = s.keyFor(stream);
    storeKeyKernel<<<1, 1, 0, stream>>>(
        memory, kernels::dropoutCallKey(call->seed, (uint64_t)call->step, (uint64_t)call->microbatch));
    detail::checkLaunch("CUDA graph call key");
    key = memory;
  }
  bool &warm = s.warm[call->inference != 0];
  if (!warm || s.disabled || call->no_graphs || call->timer) {
    work(key);
    warm = true;
    return;
  }
  const std::vector<uintptr_t> signature = callSignature(*call, stage);
  const uint64_t generation = libraryMemoryGeneration.load();
  auto found = s.graphs.find(signature);
  if (found != s.graphs.end() && found->second.memoryGeneration != generation) {
    s.drop(found->second);
    s.graphs.erase(found);
    found = s.graphs.end();
  }
  if (found == s.graphs.end()) {
    if ((int)s.graphs.size() >= kMaxCallGraphs) {
      auto oldest = s.graphs.begin();
      for (auto it = s.graphs.begin(); it != s.graphs.end(); ++it)
        if (it->second.lastUse < oldest->second.lastUse) oldest = it;
      s.drop(oldest->second); // a graph still running is freed when it finishes
      s.graphs.erase(oldest);
    }
    cudaGraphExec_t exec = s.capture(stream, work, key);
    if (!exec) {
      work(key); // what the failed capture did not run
      return;
    }
    found = s.graphs.emplace(signature, State::Graph{exec, libraryMemoryGeneration.load(), 0}).first;
  }
  found->second.lastUse = ++s.uses;
  detail::check(cudaGraphLaunch(found->second.exec, stream), "CUDA graph launch");
}

} // namespace pipec::kernels::cuda
