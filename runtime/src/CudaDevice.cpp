#include "CudaDevice.h"

#include "CudaKernels.h"
#include "Plan.h" // Error
#include "pipec/cuda_kernels.h" // syntheticData
#include "pipec/vocabulary.h" // kMinimumCudnnVersion

#include <cublasLt.h>
#include <dlfcn.h>
#include <cctype>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <thread>

namespace pipec::rt {

void checkCuda(cudaError_t e, const char *what) {
  if (e != cudaSuccess)
    throw Error(std::string(what) + " failed: " + cudaGetErrorString(e) + " (" + cudaGetErrorName(e) + ")");
}

CudaDevice::CudaDevice(int localRank) : Device(false) {
  // The compute stream and one stream per communicating peer must not share
  // a hardware queue (CUDA's default is 8): an NCCL kernel waiting for its
  // peer would hold back unrelated work queued behind it. Read when CUDA
  // initializes, so piperun sets it before MPI_Init (a CUDA-aware MPI may
  // initialize CUDA there); here for other users of the device, too late if
  // CUDA is already initialized. A value the user set wins.
  setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 0);
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count <= 0)
    throw Error(std::string("runtime.target is \"cuda\" but this node has no usable CUDA device (") +
                (e != cudaSuccess ? std::string("cudaGetDeviceCount: ") + cudaGetErrorString(e) : std::string("no device")) +
                "); run on GPU nodes, or compile the model with --target cpu");
  count_ = count;
  ordinal_ = localRank % count;
  checkCuda(cudaSetDevice(ordinal_), "cudaSetDevice");
  cudaDeviceProp prop{};
  checkCuda(cudaGetDeviceProperties(&prop, ordinal_), "cudaGetDeviceProperties");
  gpuName_ = prop.name, major_ = prop.major, minor_ = prop.minor;
  uuid_.assign(prop.uuid.bytes, prop.uuid.bytes + sizeof prop.uuid.bytes);
  // A blocking stream (default flags): work a stage library might put on the
  // legacy default stream stays ordered with it.
  checkCuda(cudaStreamCreate(&compute_), "cudaStreamCreate");
  // Freed memory (stashed versions, snapshots) stays in the stream-ordered
  // pool for the next allocation instead of going back to the driver.
  cudaMemPool_t pool;
  checkCuda(cudaDeviceGetDefaultMemPool(&pool, ordinal_), "cudaDeviceGetDefaultMemPool");
  uint64_t keep = UINT64_MAX;
  checkCuda(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep), "cudaMemPoolSetAttribute");
  checkCuda(cudaMallocHost((void **)&result_, 2 * sizeof(double)), "cudaMallocHost");
}

void CudaDevice::releaseCachedMemory() {
  cudaMemPool_t pool;
  checkCuda(cudaDeviceGetDefaultMemPool(&pool, ordinal_), "cudaDeviceGetDefaultMemPool");
  checkCuda(cudaStreamSynchronize(compute_), "cudaStreamSynchronize");
  checkCuda(cudaMemPoolTrimTo(pool, 0), "cudaMemPoolTrimTo");
}

void CudaDevice::setWaitCheck(std::function<void()> check) {
  if (std::this_thread::get_id() != owner_) throw Error("internal: a wait check set from another thread");
  waitCheck_ = std::move(check);
}

void CudaDevice::await(cudaEvent_t e, const char *what) {
  if (!watching()) return checkCuda(cudaEventSynchronize(e), what);
  cudaError_t rc;
  while ((rc = cudaEventQuery(e)) == cudaErrorNotReady) {
    waitCheck_();
    std::this_thread::yield();
  }
  checkCuda(rc, what);
}

void CudaDevice::awaitStream(cudaStream_t s, const char *what) {
  if (!watching()) return checkCuda(cudaStreamSynchronize(s), what);
  if (!streamDone_) checkCuda(cudaEventCreateWithFlags(&streamDone_, cudaEventDisableTiming), "cudaEventCreate");
  checkCuda(cudaEventRecord(streamDone_, s), "cudaEventRecord");
  await(streamDone_, what);
}

CudaDevice::~CudaDevice() {
  if (streamDone_) cudaEventDestroy(streamDone_);
  if (partials_) cudaFreeAsync(partials_, compute_);
  if (stats_) cudaFreeAsync(stats_, compute_);
  if (compute_) cudaStreamSynchronize(compute_);
  if (result_) cudaFreeHost(result_);
  if (compute_) cudaStreamDestroy(compute_);
}

namespace {
/// cuBLASLt's and cuDNN 9's version numbers: major·10000 + minor·100 + patch.
std::string libraryVersion(int64_t v) {
  return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
}
} // namespace

std::string CudaDevice::describe() const {
  // The versions this rank runs with (the CUDA runtime piperun loaded, the driver's CUDA,
  // the cuBLASLt the stages' GEMMs load: which epilogues it takes differs by version,
  // docs/gpu-runs.md).
  int runtime = 0, driver = 0;
  auto version = [](int v) { return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10); };
  const std::string versions =
      (cudaRuntimeGetVersion(&runtime) == cudaSuccess && cudaDriverGetVersion(&driver) == cudaSuccess
           ? ", CUDA runtime " + version(runtime) + ", driver " + version(driver)
           : "") +
      ", cuBLASLt " + libraryVersion((int64_t)cublasLtGetVersion());
  return gpuName_ + " (sm_" + std::to_string(major_) + std::to_string(minor_) + ", device " + std::to_string(ordinal_) +
         " of " + std::to_string(count_) + versions + ", " + cudnnDescription() + ")";
}

std::string CudaDevice::cudnnDescription() {
  // The cuDNN the stages' flash attention will load (pipec::kernels::cuda::cudnnVersion
  // loads the same library by the same name; the stages link the kernels, piperun does not).
  void *library = dlopen("libcudnn.so.9", RTLD_NOW | RTLD_GLOBAL);
  if (!library) return "no cuDNN (libcudnn.so.9 not found: attention runs on pipec's kernels)";
  auto getVersion = reinterpret_cast<size_t (*)()>(dlsym(library, "cudnnGetVersion"));
  if (!getVersion) return "no cuDNN (libcudnn.so.9 has no cudnnGetVersion: attention runs on pipec's kernels)";
  // major·10000 + minor·100 + patch since cuDNN 9
  auto majorMinor = [](int64_t v) { return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100); };
  const int64_t v = (int64_t)getVersion();
  const std::string text = libraryVersion(v);
  return v < kMinimumCudnnVersion ? "cuDNN " + text + " (older than " + majorMinor(kMinimumCudnnVersion) +
                                        ": attention runs on pipec's kernels)"
                                  : "cuDNN " + text;
}

void CudaDevice::checkArchitectures(const std::vector<std::string> &archs) const {
  if (archs.empty()) return;
  std::string list;
  for (const std::string &a : archs) {
    list += (list.empty() ? "" : ", ") + a;
    // "sm_XY" (Plan checked the form): major X..., minor the last digit.
    std::string digits;
    for (size_t k = 3; k < a.size() && std::isdigit((unsigned char)a[k]); ++k) digits += a[k];
    if (digits.size() < 2) continue;
    const int major = std::atoi(digits.substr(0, digits.size() - 1).c_str()), minor = digits.back() - '0';
    if (major == major_ && minor <= minor_) return;
  }
  throw Error("the stage libraries contain code for " + list + " (runtime.cuda_arch), which does not run on device " +
              std::to_string(ordinal_) + ", " + gpuName_ + " (sm_" + std::to_string(major_) + std::to_string(minor_) +
              "); compile the model with --cuda-arch sm_" + std::to_string(major_) + std::to_string(minor_));
}

// ---------------------------------------------------------------- memory
void *CudaDevice::allocate(size_t bytes) {
  if (!bytes) return nullptr;
  const size_t alloc = (bytes + 63) / 64 * 64;
  void *p = nullptr;
  checkCuda(cudaMallocAsync(&p, alloc, compute_), ("cudaMallocAsync of " + std::to_string(bytes) + " bytes").c_str());
  if ((uintptr_t)p % 64) { // CUDA allocations are 256-byte aligned; the layouts rely on 64
    cudaFreeAsync(p, compute_);
    throw Error("cudaMallocAsync returned memory that is not 64-byte aligned");
  }
  checkCuda(cudaMemsetAsync(p, 0, alloc, compute_), "cudaMemsetAsync");
  return p;
}
void CudaDevice::release(void *p) noexcept {
  if (p) (void)cudaFreeAsync(p, compute_);
}
void *CudaDevice::allocateHost(size_t bytes) {
  if (!bytes) return nullptr;
  void *p = nullptr;
  checkCuda(cudaMallocHost(&p, bytes), "cudaMallocHost");
  std::memset(p, 0, bytes);
  return p;
}
void CudaDevice::releaseHost(void *p) noexcept {
  if (p) (void)cudaFreeHost(p);
}

void CudaDevice::zero(void *p, size_t bytes, Stream s) {
  if (bytes) checkCuda(cudaMemsetAsync(p, 0, bytes, streamOf(s)), "cudaMemsetAsync");
}
void CudaDevice::copy(void *dst, const void *src, size_t bytes, Stream s) {
  if (bytes) checkCuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, streamOf(s)), "cudaMemcpyAsync");
}
void CudaDevice::writeSmall(void *dst, const void *src, size_t bytes, Stream s) {
  checkCuda(cudakernels::writeBytes(dst, src, bytes, streamOf(s)), "writing a bundle header");
}
void CudaDevice::uploadAsync(void *dst, const void *src, size_t bytes, Stream s) {
  if (bytes) checkCuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, streamOf(s)), "cudaMemcpyAsync (upload)");
}
void CudaDevice::downloadAsync(void *dst, const void *src, size_t bytes, Stream s) {
  if (bytes) checkCuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, streamOf(s)), "cudaMemcpyAsync (download)");
}
void CudaDevice::upload(void *dst, const void *src, size_t bytes) {
  if (!bytes) return;
  checkCuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, compute_), "cudaMemcpyAsync (upload)");
  awaitStream(compute_, "cudaStreamSynchronize (upload)");
}
void CudaDevice::download(void *dst, const void *src, size_t bytes) {
  if (!bytes) return;
  checkCuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, compute_), "cudaMemcpyAsync (download)");
  awaitStream(compute_, "cudaStreamSynchronize (download)");
}

// ---------------------------------------------------------------- arithmetic
namespace {
void needFloat(pipec_dtype t, const char *what) {
  if (t != PIPEC_F32 && t != PIPEC_F64) throw Error(std::string(what) + " of a tensor that is neither f32 nor f64");
}
} // namespace

void CudaDevice::scale(void *p, size_t n, pipec_dtype t, double factor) {
  needFloat(t, "scale");
  checkCuda(cudakernels::scale(p, n, t, factor, compute_), "scaling gradients");
}
void CudaDevice::add(void *dst, const void *src, size_t n, pipec_dtype t) {
  needFloat(t, "add");
  checkCuda(cudakernels::add(dst, src, n, t, compute_), "adding gradients");
}
void CudaDevice::gradientStats(const std::vector<Span> &spans, double *stats) {
  size_t blocks = 0;
  for (const Span &s : spans) needFloat(s.dtype, "sum of squares"), blocks += cudakernels::sumSquaresBlocks(s.n);
  if (blocks == 0) {
    zero(stats, 2 * sizeof(double), nullptr);
    return;
  }
  if (blocks > partialsCap_) {
    if (partials_) checkCuda(cudaFreeAsync(partials_, compute_), "cudaFreeAsync");
    partials_ = nullptr, partialsCap_ = 0;
    checkCuda(cudaMallocAsync((void **)&partials_, 2 * sizeof(double) * blocks, compute_), "cudaMallocAsync");
    partialsCap_ = blocks;
  }
  size_t at = 0;
  for (const Span &s : spans) {
    checkCuda(cudakernels::sumSquares(s.p, s.n, s.dtype, partials_ + 2 * at, compute_), "gradient norm");
    at += cudakernels::sumSquaresBlocks(s.n);
  }
  checkCuda(cudakernels::sumPartials(partials_, blocks, stats, compute_), "gradient norm");
}

void CudaDevice::sumSquares(const std::vector<Span> &spans, double &sumSq, double &nonFinite) {
  if (!stats_) stats_ = (double *)allocate(2 * sizeof(double));
  gradientStats(spans, stats_);
  checkCuda(cudaMemcpyAsync(result_, stats_, 2 * sizeof(double), cudaMemcpyDeviceToHost, compute_), "cudaMemcpyAsync");
  awaitStream(compute_, "cudaStreamSynchronize (gradient norm)");
  sumSq += result_[0];
  nonFinite += result_[1];
}

void CudaDevice::stepControl(const double *stats, double maxNorm, pipec_step_control *control) {
  checkCuda(cudakernels::stepControl(stats, maxNorm, control, compute_), "the optimizer step's control");
}

void CudaDevice::zeroUnlessSkipped(void *p, size_t bytes, const pipec_step_control *control) {
  checkCuda(cudakernels::zeroUnlessSkipped(p, bytes, control, compute_), "zeroing the gradients");
}

void CudaDevice::generateSynthetic(const io::SyntheticField &field, uint64_t first, uint64_t count, void *dst) {
  namespace pk = pipec::kernels::cuda;
  pk::StreamScope scope(compute_, pk::Precision::F32);
  pk::syntheticData(field, first, count, dst);
}

void CudaDevice::guardBundle(void *bundle, size_t bytes, const void *expected, unsigned compared, unsigned header,
                             Stream s) {
  checkCuda(cudakernels::guardBundle(bundle, bytes, expected, compared, header, streamOf(s)), "guarding a received bundle");
}

// ---------------------------------------------------------------- events
Event CudaDevice::newEvent() {
  cudaEvent_t e = nullptr;
  checkCuda(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
  return e;
}
void CudaDevice::deleteEvent(Event e) noexcept {
  if (e) (void)cudaEventDestroy((cudaEvent_t)e);
}
void CudaDevice::record(Event e, Stream s) { checkCuda(cudaEventRecord((cudaEvent_t)e, streamOf(s)), "cudaEventRecord"); }
void CudaDevice::streamWait(Stream s, Event e) {
  if (e) checkCuda(cudaStreamWaitEvent(streamOf(s), (cudaEvent_t)e, 0), "cudaStreamWaitEvent");
}
void CudaDevice::bindThread() { checkCuda(cudaSetDevice(ordinal_), "cudaSetDevice"); }
void CudaDevice::hostWait(Event e) {
  if (e) await((cudaEvent_t)e, "cudaEventSynchronize");
}
bool CudaDevice::query(Event e) {
  if (!e) return true;
  const cudaError_t r = cudaEventQuery((cudaEvent_t)e);
  if (r == cudaErrorNotReady) return false;
  checkCuda(r, "cudaEventQuery");
  return true;
}
void CudaDevice::synchronize() { checkCuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); }

} // namespace pipec::rt
