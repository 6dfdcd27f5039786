// cuDNN, loaded at run time, and what its graph calls share
// (cudnn_graphs.cuh; docs/cuda-kernels.md). Host code only.
#include "cudnn_graphs.cuh"
#include "pipec/vocabulary.h" // kMinimumCudnnVersion

#if !defined(__CUDA_ARCH__)
#if defined(NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING)
#include <dlfcn.h>
#endif

#include <cstdio>
#include <map>
#include <mutex>
#include <utility>

#if defined(NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING)
// The cuDNN library the frontend calls into (cudnn_frontend_shim.h).
namespace cudnn_frontend {
void *cudnn_dlhandle = nullptr;
}
#endif

namespace pipec::kernels::cuda {

#ifndef PIPEC_CUDNN_GRAPHS
int64_t cudnnVersion(std::string *why) {
  if (why) *why = "pipec's CUDA kernels were built without cuDNN";
  return 0;
}
#else
int64_t cudnnVersion(std::string *why) {
  // Loaded once per process; the answer is kept.
  static const std::pair<int64_t, std::string> loaded = []() -> std::pair<int64_t, std::string> {
#if defined(NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING)
    for (const char *name : {"libcudnn.so.9", "libcudnn.so"}) {
      cudnn_frontend::cudnn_dlhandle = dlopen(name, RTLD_NOW | RTLD_GLOBAL);
      if (cudnn_frontend::cudnn_dlhandle) break;
    }
    if (!cudnn_frontend::cudnn_dlhandle) return {0, std::string("cannot load libcudnn.so.9: ") + dlerror()};
#endif
    int64_t version = 0;
    try {
      version = (int64_t)cudnn_frontend::detail::get_backend_version();
    } catch (const std::exception &e) {
      return {0, e.what()};
    }
    if (version < pipec::kMinimumCudnnVersion)
      return {0, "cuDNN " + std::to_string(version) + " is older than the " + std::to_string(pipec::kMinimumCudnnVersion) +
                     " pipec needs"};
    return {version, ""};
  }();
  if (why) *why = loaded.second;
  return loaded.first;
}

namespace dnn {

namespace {
/// A handle, destroyed with its thread (may fail when the driver is already
/// gone at exit: ignored).
struct OwnedHandle {
  cudnnHandle_t handle = nullptr;
  bool failed = false;
  ~OwnedHandle() {
    if (handle) cudnn_frontend::detail::destroy_handle(handle);
  }
};
thread_local std::map<int, OwnedHandle> handles;

/// Says `message` on stderr once per distinct message.
void sayOnce(const std::string &message) {
  static std::mutex mutex;
  static std::map<std::string, bool> said;
  std::lock_guard<std::mutex> lock(mutex);
  if (said[message]) return;
  said[message] = true;
  std::fprintf(stderr, "pipec: %s\n", message.c_str());
}
} // namespace

cudnnHandle_t handle(const char *op, const char *fallback) {
  std::string why;
  if (cudnnVersion(&why) == 0) {
    sayOnce(why + "; " + fallback);
    return nullptr;
  }
  OwnedHandle &owned = handles[detail::deviceIndex(op)];
  if (!owned.handle && !owned.failed &&
      cudnn_frontend::detail::create_handle(&owned.handle) != CUDNN_STATUS_SUCCESS) {
    owned.handle = nullptr;
    owned.failed = true;
  }
  if (!owned.handle) {
    sayOnce(std::string("cudnnCreate failed; ") + fallback);
    return nullptr;
  }
  if (cudnn_frontend::detail::set_stream(owned.handle, detail::stream()) != CUDNN_STATUS_SUCCESS)
    detail::fail(op, "cudnnSetStream failed");
  return owned.handle;
}

bool build(std::shared_ptr<fe::graph::Graph> graph, cudnnHandle_t handle, const std::vector<fe::HeurMode_t> &modes,
           bool deterministic, Plan &plan, std::string &why) {
  auto failed = [&](fe::error_t status) {
    if (status.is_good()) return false;
    why = status.get_message();
    return true;
  };
  try {
    if (failed(graph->validate()) || failed(graph->build_operation_graph(handle)) ||
        failed(graph->create_execution_plans(modes)))
      return false;
    if (deterministic) graph->deselect_numeric_notes({fe::NumericalNote_t::NONDETERMINISTIC});
    if (failed(graph->check_support(handle)) || failed(graph->build_plans(handle))) return false;
  } catch (const std::exception &e) {
    why = e.what();
    return false;
  }
  plan.graph = std::move(graph);
  plan.workspaceBytes = plan.graph->get_workspace_size();
  return true;
}

char *callMemory(const Workspace &workspace, int64_t bytes) {
  if (bytes <= 0) return nullptr;
  if (workspace.bound() && workspace.sharedBytes >= bytes) return static_cast<char *>(workspace.shared);
  return static_cast<char *>(detail::scratch(0, (size_t)bytes));
}

void execute(const char *op, cudnnHandle_t handle, const Plan &plan, std::unordered_map<int64_t, void *> &pack,
             void *workspace) {
  auto run = [&]() -> fe::error_t { // the frontend may also throw (a symbol it cannot load)
    try {
      return plan.graph->execute(handle, pack, plan.workspaceBytes > 0 ? workspace : nullptr);
    } catch (const std::exception &e) {
      return {fe::error_code_t::GRAPH_EXECUTION_FAILED, e.what()};
    }
  };
  fe::error_t status = run();
  if (status.is_bad()) detail::fail(op, "cuDNN: " + status.get_message());
}

std::vector<int64_t> rowMajorStrides(const std::vector<int64_t> &dims) {
  std::vector<int64_t> strides(dims.size(), 1);
  for (int i = (int)dims.size() - 2; i >= 0; --i) strides[i] = strides[i + 1] * dims[i + 1];
  return strides;
}

std::vector<int64_t> channelsLastStrides(const std::vector<int64_t> &dims) {
  std::vector<int64_t> strides(dims.size(), 1);
  if (dims.size() < 3) return rowMajorStrides(dims);
  int64_t step = dims[1]; // the channels, innermost
  for (int i = (int)dims.size() - 1; i >= 2; --i) {
    strides[i] = step;
    step *= dims[i];
  }
  strides[0] = step;
  return strides;
}

bool aligned16(std::initializer_list<const void *> pointers) {
  for (const void *p : pointers)
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  return true;
}

} // namespace dnn
#endif // PIPEC_CUDNN_GRAPHS

} // namespace pipec::kernels::cuda

#endif // !__CUDA_ARCH__
