// One virtual stage on a rank: its dlopen'ed library, its descriptors, the
// buffers it owns for the whole run (parameters, gradients, optimizer state)
// and the layouts of its per-micro-batch bundles. No MPI.
#pragma once

#include "Device.h"
#include "Plan.h"
#include "pipec/stage_abi.h"
#include "pipec/tensor_file.h"

#include <cstdlib>
#include <functional>
#include <memory>

namespace pipec::rt {

// 64-byte aligned, zero-initialized memory of a Device (host memory unless
// given another device): the buffers the stage functions see.
class Buffer {
public:
  Buffer() = default; // empty, host
  explicit Buffer(size_t bytes) { resize(bytes); }
  explicit Buffer(Device &d, size_t bytes = 0) : dev_(&d) { resize(bytes); }
  Buffer(Buffer &&o) noexcept : dev_(o.dev_), p_(o.p_), n_(o.n_) { o.p_ = nullptr, o.n_ = 0; }
  Buffer &operator=(Buffer &&o) noexcept;
  Buffer(const Buffer &) = delete;
  Buffer &operator=(const Buffer &) = delete;
  ~Buffer() { free(); }
  void resize(size_t bytes); // new zeroed memory (the old contents are dropped)
  char *data() { return p_; }
  const char *data() const { return p_; }
  size_t size() const { return n_; }
  Device &device() const { return *dev_; }
  void zero();
  void copyFrom(const Buffer &o); // same device

private:
  void free() noexcept;
  Device *dev_ = &hostDevice();
  char *p_ = nullptr;
  size_t n_ = 0;
};

// Tensors packed at 64-byte aligned offsets, optionally after a header.
struct Layout {
  std::vector<size_t> offsets, bytes;
  size_t total = 0;
  uint64_t hash = 0; // of dtypes and shapes: sender and receiver must agree
  static Layout of(const pipec_tensor_desc *descs, int n, size_t header = 0);
  std::vector<void *> pointers(char *base) const;
};

std::vector<int64_t> shapeOf(const pipec_tensor_desc &d);
std::string describeTensor(const pipec_tensor_desc &d); // "name f32[4x8]"

// Checks, before dlopen, that `path` is a regular file of bounded size and a
// well-formed ELF shared object for this machine (magic, class, byte order,
// machine, type; program and section header tables, every segment and
// section inside the file). Returns "" or the reason it is not.
std::string checkStageLibraryFile(const std::string &path);

class StageLibrary {
public:
  // dlopen + dlsym + describe + checks against the plan (ABI version,
  // stage id, number of virtual stages). Throws Error naming the file.
  StageLibrary(const std::string &path, int expectStage, int expectStages, const std::string &expectTarget = "cpu");
  ~StageLibrary();
  StageLibrary(const StageLibrary &) = delete;
  StageLibrary &operator=(const StageLibrary &) = delete;

  const pipec_stage_desc &desc() const { return *desc_; }
  const std::string &path() const { return path_; }
  // Call wrappers: throw Error with the library's last error on failure.
  void forward(const pipec_call &c) const { check(fwd_(&c), "pipec_stage_forward"); }
  void backwardInput(const pipec_call &c) const { check(bwdI_(&c), "pipec_stage_backward_input"); }
  void backwardWeight(const pipec_call &c) const { check(bwdW_(&c), "pipec_stage_backward_weight"); }
  void step(const pipec_optimizer_call &c) const { check(step_(&c), "pipec_stage_step"); }

private:
  void check(int rc, const char *fn) const;
  std::string path_;
  void *handle_ = nullptr;
  const pipec_stage_desc *desc_ = nullptr;
  int (*fwd_)(const pipec_call *) = nullptr;
  int (*bwdI_)(const pipec_call *) = nullptr;
  int (*bwdW_)(const pipec_call *) = nullptr;
  int (*step_)(const pipec_optimizer_call *) = nullptr;
  const char *(*lastError_)() = nullptr;
};

// A full copy of what an optimizer step changes (for stashed versions and
// speculative-step rollback).
struct WeightSnapshot {
  Buffer params, state;
  int64_t steps = 0;
};

class StageModel {
public:
  // Buffers on `device` (the plan's target).
  StageModel(const Plan &plan, const VirtualStage &vs, Device &device = hostDevice());
  Device &device() const { return dev_; }

  const VirtualStage &vstage() const { return vs_; }
  StageLibrary &lib() { return *lib_; }
  const pipec_stage_desc &desc() const { return lib_->desc(); }
  const Layout &paramLayout() const { return paramLayout_; }
  const Layout &inputLayout() const { return inputLayout_; }
  const Layout &outputLayout() const { return outputLayout_; }
  const Layout &dataLayout() const { return dataLayout_; }
  int numTrained() const { return numTrained_; }

  Buffer &params() { return params_; }
  Buffer &grads() { return grads_; }
  Buffer &state() { return state_; }
  std::vector<void *> paramPtrs(Buffer &b) const { return paramLayout_.pointers(b.data()); }
  std::vector<void *> gradPtrs(); // NULL for PIPEC_BUFFER parameters
  std::vector<void *> statePtrs();

  int64_t steps = 0; // optimizer steps taken (pipec_call.step)

  void loadWeights(const std::string &path);          // initial weights file
  std::vector<io::Tensor> weightTensors() const;      // current weights, named as the ABI does
  // Writes the current weights (a weights file) or, with `checkpoint`, the
  // weights, optimizer state and step ("param/X", "state/X/k", "meta/steps":
  // docs/checkpoint-format.md) to `path`, one tensor at a time through a
  // bounded staging buffer: the stage's memory is never copied whole.
  void writeTensorFile(const std::string &path, bool checkpoint) const;
  // The stage's parameters, optimizer state and step counter from a
  // checkpoint of any plan (docs/checkpoint-format.md).
  void loadCheckpoint(const CheckpointTensors &checkpoint);
  // Whether the checkpoint tensor `name` ("param/X", "state/X/k") is this stage's.
  bool holdsCheckpointTensor(const std::string &name) const;
  WeightSnapshot snapshot() const;
  void restore(const WeightSnapshot &s);

  // Index of the parameter named `name` in desc().params, -1 if none.
  int paramIndex(const std::string &name) const;
  // Sum of squares and non-finite count of the gradients of trained params
  // (f32/f64); params with skip[i] set are left out (tied copies counted by
  // another stage).
  void gradStats(double &sumSq, double &nonFinite, const std::vector<bool> *skip = nullptr);
  // The gradients those statistics read, for Device::gradientStats.
  std::vector<Span> gradSpans(const std::vector<bool> *skip = nullptr);
  void scaleGrads(double factor);
  // pipec_stage_step with the plan's hyper-parameters on the current
  // gradients, under the runtime's verdict `control` (this device's memory;
  // nullptr: apply as they are); increments `steps` (a skipped step counts:
  // the step number is the schedule's, as on every other rank).
  void applyStep(const OptimizerConfig &opt, const pipec_step_control *control = nullptr);

private:
  VirtualStage vs_;
  Device &dev_;
  std::unique_ptr<StageLibrary> lib_;
  Layout paramLayout_, inputLayout_, outputLayout_, dataLayout_, stateLayout_;
  int numTrained_ = 0;
  // Fills `bytes` of this stage's memory at `dst` from read(offset, buffer,
  // n), called in order: into host memory directly, into a GPU's through a
  // bounded staging buffer (a stage's memory is never held twice).
  void fill(char *dst, uint64_t bytes, const std::function<void(uint64_t, void *, uint64_t)> &read);
  Buffer params_, grads_, state_;
};

} // namespace pipec::rt
