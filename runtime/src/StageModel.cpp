#include "StageModel.h"

#include "pipec/input_file.h"

#include <dlfcn.h>
#include <elf.h>

#include <cassert>
#include <cmath>
#include <cstring>

namespace pipec::rt {

Buffer &Buffer::operator=(Buffer &&o) noexcept {
  if (this != &o) {
    free();
    dev_ = o.dev_, p_ = o.p_, n_ = o.n_;
    o.p_ = nullptr, o.n_ = 0;
  }
  return *this;
}
void Buffer::free() noexcept {
  if (p_) dev_->release(p_);
  p_ = nullptr, n_ = 0;
}
void Buffer::resize(size_t bytes) {
  free();
  p_ = (char *)dev_->allocate(bytes);
  n_ = bytes;
}
void Buffer::zero() {
  if (n_) dev_->zero(p_, n_);
}
void Buffer::copyFrom(const Buffer &o) {
  assert(dev_ == o.dev_ && "a rank's buffers all live on its one device");
  if (n_ != o.n_) resize(o.n_);
  if (n_) dev_->copy(p_, o.p_, n_);
}

std::vector<int64_t> shapeOf(const pipec_tensor_desc &d) { return std::vector<int64_t>(d.shape, d.shape + d.rank); }
std::string describeTensor(const pipec_tensor_desc &d) {
  return std::string(d.name ? d.name : "?") + " " + io::dtypeName(d.dtype) + io::shapeString(shapeOf(d));
}

Layout Layout::of(const pipec_tensor_desc *descs, int n, size_t header) {
  Layout l;
  size_t off = header;
  uint64_t h = 1469598103934665603ULL; // FNV-1a over dtypes and shapes (names may differ across stages)
  auto mixIn = [&](const void *p, size_t k) {
    for (size_t i = 0; i < k; ++i) h = (h ^ ((const unsigned char *)p)[i]) * 1099511628211ULL;
  };
  for (int i = 0; i < n; ++i) {
    const size_t bytes = (size_t)io::numElements(shapeOf(descs[i])) * io::dtypeSize(descs[i].dtype);
    off = (off + 63) / 64 * 64;
    l.offsets.push_back(off);
    l.bytes.push_back(bytes);
    off += bytes;
    mixIn(&descs[i].dtype, sizeof descs[i].dtype);
    mixIn(descs[i].shape, sizeof(int64_t) * descs[i].rank);
  }
  l.total = (off + 63) / 64 * 64;
  l.hash = h;
  return l;
}

std::vector<void *> Layout::pointers(char *base) const {
  std::vector<void *> p;
  for (size_t o : offsets) p.push_back(base + o);
  return p;
}

// ---------------------------------------------------------------- library
namespace {
#if UINTPTR_MAX == 0xffffffffffffffffu
using Ehdr = Elf64_Ehdr;
using Phdr = Elf64_Phdr;
using Shdr = Elf64_Shdr;
constexpr unsigned char kElfClass = ELFCLASS64;
#else
using Ehdr = Elf32_Ehdr;
using Phdr = Elf32_Phdr;
using Shdr = Elf32_Shdr;
constexpr unsigned char kElfClass = ELFCLASS32;
#endif
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
constexpr unsigned char kElfData = ELFDATA2LSB;
#else
constexpr unsigned char kElfData = ELFDATA2MSB;
#endif
#if defined(__x86_64__)
constexpr int kElfMachine = EM_X86_64;
#elif defined(__aarch64__)
constexpr int kElfMachine = EM_AARCH64;
#elif defined(__powerpc64__)
constexpr int kElfMachine = EM_PPC64;
#elif defined(__riscv)
constexpr int kElfMachine = EM_RISCV;
#else
constexpr int kElfMachine = -1; // not checked
#endif
constexpr uint64_t kMaxLibraryBytes = 16ull << 30;

// [offset, offset + count * entry) inside the file, without overflow.
bool tableWithin(uint64_t offset, uint64_t count, uint64_t entry, uint64_t size) {
  const auto bytes = io::checkedMul<uint64_t>(count, entry);
  return bytes && io::rangeWithin(offset, *bytes, size);
}
} // namespace

std::string checkStageLibraryFile(const std::string &path) {
  try {
    const io::InputFile f(path, "stage library", kMaxLibraryBytes);
    const uint64_t size = f.size();
    if (size < sizeof(Ehdr)) return "not an ELF shared object (" + std::to_string(size) + " bytes, shorter than an ELF header)";
    Ehdr eh;
    f.readAt(0, &eh, sizeof eh, "the ELF header");
    if (std::memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0) return "not an ELF file (bad magic)";
    if (eh.e_ident[EI_CLASS] != kElfClass)
      return std::string("ELF class ") + std::to_string(eh.e_ident[EI_CLASS]) + ", this machine loads " +
             (kElfClass == ELFCLASS64 ? "64-bit (ELFCLASS64)" : "32-bit (ELFCLASS32)") + " objects";
    if (eh.e_ident[EI_DATA] != kElfData) return "ELF byte order " + std::to_string(eh.e_ident[EI_DATA]) + " is not this machine's";
    if (eh.e_ident[EI_VERSION] != EV_CURRENT || eh.e_version != EV_CURRENT) return "unknown ELF version";
    if (eh.e_type != ET_DYN) return "ELF type " + std::to_string(eh.e_type) + " is not a shared object (ET_DYN)";
    if (kElfMachine >= 0 && eh.e_machine != kElfMachine)
      return "ELF machine " + std::to_string(eh.e_machine) + " is not this machine's (" + std::to_string(kElfMachine) + ")";
    if (eh.e_ehsize < sizeof(Ehdr)) return "ELF header size " + std::to_string(eh.e_ehsize) + " is too small";
    // Program headers: every segment's bytes inside the file (a truncated
    // library would otherwise be mapped past its end: SIGBUS in dlopen).
    if (eh.e_phnum == 0 || eh.e_phnum == PN_XNUM) return "no program headers (or an extended count)";
    if (eh.e_phentsize != sizeof(Phdr)) return "program header entry size " + std::to_string(eh.e_phentsize) + " is wrong";
    if (!tableWithin(eh.e_phoff, eh.e_phnum, sizeof(Phdr), size))
      return "the program header table (offset " + std::to_string(eh.e_phoff) + ", " + std::to_string(eh.e_phnum) +
             " entries) lies outside the file (" + std::to_string(size) + " bytes; truncated?)";
    bool haveLoad = false;
    for (unsigned i = 0; i < eh.e_phnum; ++i) {
      Phdr ph;
      f.readAt(eh.e_phoff + (uint64_t)i * sizeof(Phdr), &ph, sizeof ph, "a program header");
      if (ph.p_type == PT_LOAD) {
        haveLoad = true;
        if (ph.p_filesz > ph.p_memsz)
          return "segment " + std::to_string(i) + " has more file bytes than memory bytes";
      }
      if (ph.p_filesz > 0 && !io::rangeWithin(ph.p_offset, ph.p_filesz, size))
        return "segment " + std::to_string(i) + " (offset " + std::to_string(ph.p_offset) + ", " +
               std::to_string(ph.p_filesz) + " bytes) lies outside the file (" + std::to_string(size) +
               " bytes; truncated?)";
    }
    if (!haveLoad) return "no loadable segment";
    // Section headers (not used by the loader, but a table past the end is
    // the surest sign of a truncated file).
    if (eh.e_shoff != 0 || eh.e_shnum != 0) {
      if (eh.e_shentsize != sizeof(Shdr)) return "section header entry size " + std::to_string(eh.e_shentsize) + " is wrong";
      uint64_t shnum = eh.e_shnum;
      if (shnum == 0) { // extended numbering: the count is section 0's sh_size
        if (!tableWithin(eh.e_shoff, 1, sizeof(Shdr), size))
          return "the section header table lies outside the file (truncated?)";
        Shdr s0;
        f.readAt(eh.e_shoff, &s0, sizeof s0, "section header 0");
        shnum = s0.sh_size;
      }
      if (!tableWithin(eh.e_shoff, shnum, sizeof(Shdr), size))
        return "the section header table (offset " + std::to_string(eh.e_shoff) + ", " + std::to_string(shnum) +
               " entries) lies outside the file (" + std::to_string(size) + " bytes; truncated?)";
      for (uint64_t i = 0; i < shnum; ++i) {
        Shdr sh;
        f.readAt(eh.e_shoff + i * sizeof(Shdr), &sh, sizeof sh, "a section header");
        if (sh.sh_type != SHT_NOBITS && sh.sh_type != SHT_NULL && !io::rangeWithin(sh.sh_offset, sh.sh_size, size))
          return "section " + std::to_string(i) + " (offset " + std::to_string(sh.sh_offset) + ", " +
                 std::to_string(sh.sh_size) + " bytes) lies outside the file (" + std::to_string(size) +
                 " bytes; truncated?)";
      }
    }
  } catch (const io::InputError &e) {
    std::string m = e.what();
    if (m.compare(0, path.size() + 2, path + ": ") == 0) m.erase(0, path.size() + 2);
    return m;
  }
  return "";
}

StageLibrary::StageLibrary(const std::string &path, int expectStage, int expectStages, const std::string &expectTarget)
    : path_(path) {
  // Checked before dlopen: the loader maps the file as it finds it, and a
  // truncated or malformed library crashes inside dlopen (SIGBUS).
  const std::string bad = checkStageLibraryFile(path);
  if (!bad.empty()) throw Error(path + ": cannot load stage library: " + bad);
  handle_ = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle_) throw Error(path + ": cannot load stage library: " + dlerror());
  auto sym = [&](const char *name) {
    void *s = dlsym(handle_, name);
    if (!s) throw Error(path + ": stage library does not export " + name);
    return s;
  };
  auto describe = (const pipec_stage_desc *(*)())sym("pipec_stage_describe");
  fwd_ = (int (*)(const pipec_call *))sym("pipec_stage_forward");
  bwdI_ = (int (*)(const pipec_call *))sym("pipec_stage_backward_input");
  bwdW_ = (int (*)(const pipec_call *))sym("pipec_stage_backward_weight");
  step_ = (int (*)(const pipec_optimizer_call *))sym("pipec_stage_step");
  lastError_ = (const char *(*)())sym("pipec_stage_last_error");
  desc_ = describe();
  if (!desc_) throw Error(path + ": pipec_stage_describe() returned NULL");
  if (desc_->abi_version != PIPEC_STAGE_ABI_VERSION)
    throw Error(path + ": stage ABI version " + std::to_string(desc_->abi_version) + ", piperun speaks version " +
                std::to_string(PIPEC_STAGE_ABI_VERSION) + " (rebuild the stage with this pipec)");
  if (desc_->stage != expectStage || desc_->num_stages != expectStages)
    throw Error(path + ": library is stage " + std::to_string(desc_->stage) + " of " +
                std::to_string(desc_->num_stages) + ", the plan expects stage " + std::to_string(expectStage) +
                " of " + std::to_string(expectStages));
  // Optional: `const char *pipec_stage_target(void)` ("cpu" | "cuda") lets a
  // library generated for the other target fail here instead of crashing on
  // pointers of the wrong memory.
  if (auto target = (const char *(*)())dlsym(handle_, "pipec_stage_target")) {
    const char *t = target();
    if (t && expectTarget != t)
      throw Error(path + ": library was generated for target " + t + ", the plan's runtime.target is " + expectTarget);
  }
}

StageLibrary::~StageLibrary() {
  if (handle_) dlclose(handle_);
}

void StageLibrary::check(int rc, const char *fn) const {
  if (rc == 0) return;
  const char *msg = lastError_ ? lastError_() : nullptr;
  throw Error(path_ + ": " + fn + " failed (code " + std::to_string(rc) + "): " + (msg && *msg ? msg : "no message"));
}

// ---------------------------------------------------------------- model
namespace {
constexpr size_t kBundleHeader = 64; // see Bundle.h: BundleHeader
}

StageModel::StageModel(const Plan &plan, const VirtualStage &vs, Device &device) : vs_(vs), dev_(device) {
  lib_ = std::make_unique<StageLibrary>(vs.library, vs.id, plan.stages * plan.chunks, choiceName(plan.target));
  const pipec_stage_desc &d = lib_->desc();
  std::vector<pipec_tensor_desc> pd, sd;
  for (int i = 0; i < d.num_params; ++i) {
    pd.push_back(d.params[i].tensor);
    if (d.params[i].role == PIPEC_TRAINED) {
      ++numTrained_;
      for (int k = 0; k < d.optimizer_state_per_param; ++k) sd.push_back(d.params[i].tensor);
    }
  }
  const Optimizer built = d.optimizer == PIPEC_SGD ? Optimizer::Sgd : Optimizer::AdamW;
  if (usesAdam(plan.optimizer.rule) != usesAdam(built))
    throw Error(vs.library + ": library was generated for optimizer " + choiceName(built) + ", the plan says " +
                choiceName(plan.optimizer.rule));
  paramLayout_ = Layout::of(pd.data(), (int)pd.size());
  stateLayout_ = Layout::of(sd.data(), (int)sd.size());
  inputLayout_ = Layout::of(d.inputs, d.num_inputs, kBundleHeader);
  outputLayout_ = Layout::of(d.outputs, d.num_outputs, kBundleHeader);
  dataLayout_ = Layout::of(d.data, d.num_data);
  params_ = Buffer(dev_, paramLayout_.total);
  grads_ = Buffer(dev_, paramLayout_.total);
  state_ = Buffer(dev_, stateLayout_.total);
}

std::vector<void *> StageModel::gradPtrs() {
  auto p = paramLayout_.pointers(grads_.data());
  for (int i = 0; i < desc().num_params; ++i)
    if (desc().params[i].role != PIPEC_TRAINED) p[i] = nullptr;
  return p;
}
std::vector<void *> StageModel::statePtrs() { return stateLayout_.pointers(state_.data()); }

void StageModel::fill(char *dst, uint64_t bytes, const std::function<void(uint64_t, void *, uint64_t)> &read) {
  if (dev_.host()) return read(0, dst, bytes);
  constexpr uint64_t kStagingBytes = uint64_t(64) << 20;
  std::vector<char> staging(static_cast<size_t>(std::min(bytes, kStagingBytes)));
  for (uint64_t done = 0; done < bytes; done += staging.size()) {
    const uint64_t n = std::min<uint64_t>(staging.size(), bytes - done);
    read(done, staging.data(), n);
    dev_.upload(dst + done, staging.data(), n);
  }
}

void StageModel::loadWeights(const std::string &path) {
  // Tensor by tensor (fill): a stage's weights are never held twice.
  const pipec_stage_desc &d = desc();
  std::vector<bool> loaded(d.num_params, false);
  io::forEachTensor(path, "weights file", [&](const io::TensorHeader &t, io::TensorDataReader &reader) {
    int i = 0;
    while (i < d.num_params && t.name != d.params[i].tensor.name) ++i;
    if (i == d.num_params) throw Error(path + ": tensor " + t.name + " is not a parameter of stage " + std::to_string(vs_.id));
    const pipec_tensor_desc &td = d.params[i].tensor;
    if (t.dtype != td.dtype || t.shape != shapeOf(td))
      throw Error(path + ": tensor " + t.name + " is " + io::dtypeName(t.dtype) + io::shapeString(t.shape) +
                  ", the stage expects " + describeTensor(td));
    fill(params_.data() + paramLayout_.offsets[i], t.bytes,
         [&](uint64_t, void *buffer, uint64_t n) { reader.read(buffer, n); }); // in order
    loaded[i] = true;
  });
  for (int i = 0; i < d.num_params; ++i)
    if (!loaded[i])
      throw Error(path + ": no tensor named " + d.params[i].tensor.name + " (stage parameter " +
                  describeTensor(d.params[i].tensor) + ")");
}

std::vector<io::Tensor> StageModel::weightTensors() const {
  std::vector<io::Tensor> out;
  const pipec_stage_desc &d = desc();
  for (int i = 0; i < d.num_params; ++i) {
    io::Tensor t;
    t.name = d.params[i].tensor.name;
    t.dtype = d.params[i].tensor.dtype;
    t.shape = shapeOf(d.params[i].tensor);
    t.data.resize(paramLayout_.bytes[i]);
    dev_.download(t.data.data(), params_.data() + paramLayout_.offsets[i], paramLayout_.bytes[i]);
    out.push_back(std::move(t));
  }
  return out;
}

void StageModel::writeTensorFile(const std::string &path, bool checkpoint) const {
  constexpr size_t kStagingBytes = size_t(64) << 20;
  const pipec_stage_desc &d = desc();
  std::vector<char> staging;
  // One tensor from device memory: straight from host buffers, through the
  // staging buffer from a GPU's.
  auto put = [&](io::TensorFileWriter &w, const std::string &name, const pipec_tensor_desc &td, const char *src,
                 size_t bytes) {
    w.begin(name, td.dtype, shapeOf(td));
    if (dev_.host()) {
      w.data(src, bytes);
    } else {
      staging.resize(std::min(bytes, kStagingBytes));
      for (size_t done = 0; done < bytes; done += staging.size()) {
        const size_t n = std::min(staging.size(), bytes - done);
        dev_.download(staging.data(), src + done, n);
        w.data(staging.data(), n);
      }
    }
    w.end();
  };
  uint64_t count = (uint64_t)d.num_params;
  if (checkpoint) count += (uint64_t)numTrained_ * (uint64_t)d.optimizer_state_per_param + 1;
  io::TensorFileWriter w(path, count);
  for (int i = 0; i < d.num_params; ++i)
    put(w, (checkpoint ? "param/" : "") + std::string(d.params[i].tensor.name), d.params[i].tensor,
        params_.data() + paramLayout_.offsets[i], paramLayout_.bytes[i]);
  if (checkpoint) {
    size_t s = 0;
    for (int i = 0; i < d.num_params; ++i) {
      if (d.params[i].role != PIPEC_TRAINED) continue;
      for (int k = 0; k < d.optimizer_state_per_param; ++k, ++s)
        put(w, "state/" + std::string(d.params[i].tensor.name) + "/" + std::to_string(k), d.params[i].tensor,
            state_.data() + stateLayout_.offsets[s], stateLayout_.bytes[s]);
    }
    w.begin("meta/steps", PIPEC_I64, {});
    w.data(reinterpret_cast<const char *>(&steps), 8);
    w.end();
  }
  w.finish();
}

void StageModel::loadCheckpoint(const CheckpointTensors &checkpoint) {
  const pipec_stage_desc &d = desc();
  // Every tensor the stage needs, checked before anything is loaded: a
  // checkpoint of another model is refused with the names that differ.
  std::vector<std::string> missing, different;
  auto expect = [&](const std::string &name, const pipec_tensor_desc &td) {
    const io::TensorHeader *t = checkpoint.lookup(name);
    if (!t)
      missing.push_back(name);
    else if (t->dtype != td.dtype || t->shape != shapeOf(td))
      different.push_back(name + " is " + io::dtypeName(t->dtype) + io::shapeString(t->shape) + " there, " +
                          io::dtypeName(td.dtype) + io::shapeString(shapeOf(td)) + " here");
  };
  for (int i = 0; i < d.num_params; ++i) {
    expect("param/" + std::string(d.params[i].tensor.name), d.params[i].tensor);
    if (d.params[i].role == PIPEC_TRAINED)
      for (int k = 0; k < d.optimizer_state_per_param; ++k)
        expect("state/" + std::string(d.params[i].tensor.name) + "/" + std::to_string(k), d.params[i].tensor);
  }
  if (!missing.empty() || !different.empty()) {
    auto list = [](const std::vector<std::string> &names) {
      std::string out;
      for (size_t i = 0; i < names.size() && i < 8; ++i) out += (i ? ", " : "") + names[i];
      if (names.size() > 8) out += " and " + std::to_string(names.size() - 8) + " more";
      return out;
    };
    throw Error(checkpoint.describe() + ": not a checkpoint of this model for " + vstage().library + ": " +
                (missing.empty() ? std::string() : std::to_string(missing.size()) + " tensor(s) missing: " + list(missing)) +
                (!missing.empty() && !different.empty() ? "; " : "") +
                (different.empty() ? std::string() : std::to_string(different.size()) + " of another shape: " + list(different)) +
                " (an AdamW checkpoint has state/<name>/0 and /1, SGD /0 only)");
  }
  // Each tensor from its file (fill).
  auto load = [&](const std::string &name, char *dst, uint64_t bytes) {
    fill(dst, bytes, [&](uint64_t offset, void *buffer, uint64_t n) { checkpoint.read(name, offset, buffer, n); });
  };
  size_t s = 0;
  std::optional<int64_t> stageSteps;
  for (int i = 0; i < d.num_params; ++i) {
    const pipec_tensor_desc &td = d.params[i].tensor;
    const std::string param = "param/" + std::string(td.name);
    load(param, params_.data() + paramLayout_.offsets[i], paramLayout_.bytes[i]);
    // The step counter continues from the stage file that held the
    // parameter; parameters of one stage of this plan from stage files at
    // different steps (possible only across plans) cannot continue together.
    const int64_t steps = checkpoint.stepsOf(param);
    if (stageSteps && *stageSteps != steps)
      throw Error(vstage().library + ": its parameters come from checkpoint stage files at " +
                  std::to_string(*stageSteps) + " and " + std::to_string(steps) + " optimizer steps");
    stageSteps = steps;
    if (d.params[i].role != PIPEC_TRAINED) continue;
    for (int k = 0; k < d.optimizer_state_per_param; ++k, ++s)
      load("state/" + std::string(td.name) + "/" + std::to_string(k), state_.data() + stateLayout_.offsets[s],
           stateLayout_.bytes[s]);
  }
  steps = stageSteps ? *stageSteps : checkpoint.commonSteps();
  grads_.zero();
}

bool StageModel::holdsCheckpointTensor(const std::string &name) const {
  const pipec_stage_desc &d = desc();
  for (int i = 0; i < d.num_params; ++i) {
    const std::string param = d.params[i].tensor.name;
    if (name == "param/" + param) return true;
    if (d.params[i].role == PIPEC_TRAINED && name.rfind("state/" + param + "/", 0) == 0) return true;
  }
  return false;
}

WeightSnapshot StageModel::snapshot() const {
  WeightSnapshot s;
  s.params = Buffer(dev_);
  s.state = Buffer(dev_);
  s.params.copyFrom(params_);
  s.state.copyFrom(state_);
  s.steps = steps;
  return s;
}
void StageModel::restore(const WeightSnapshot &s) {
  params_.copyFrom(s.params);
  state_.copyFrom(s.state);
  steps = s.steps;
}

// The gradients of trained f32/f64 parameters, minus those with skip[i] set.
std::vector<Span> StageModel::gradSpans(const std::vector<bool> *skip) {
  const pipec_stage_desc &d = desc();
  bool whole = true; // every parameter f32 and counted: one span over the buffer, whose padding and buffer slots are 0
  for (int i = 0; i < d.num_params; ++i)
    whole &= d.params[i].tensor.dtype == PIPEC_F32 && !(skip && i < (int)skip->size() && (*skip)[i]);
  if (whole) return {Span{grads_.data(), grads_.size() / sizeof(float), PIPEC_F32}};
  std::vector<Span> spans;
  for (int i = 0; i < d.num_params; ++i) {
    if (d.params[i].role != PIPEC_TRAINED) continue;
    if (skip && i < (int)skip->size() && (*skip)[i]) continue;
    const pipec_dtype t = d.params[i].tensor.dtype;
    if (t != PIPEC_F32 && t != PIPEC_F64) continue;
    spans.push_back({grads_.data() + paramLayout_.offsets[i], paramLayout_.bytes[i] / io::dtypeSize(t), t});
  }
  return spans;
}

int StageModel::paramIndex(const std::string &name) const {
  const pipec_stage_desc &d = desc();
  for (int i = 0; i < d.num_params; ++i)
    if (name == d.params[i].tensor.name) return i;
  return -1;
}

void StageModel::gradStats(double &sumSq, double &nonFinite, const std::vector<bool> *skip) {
  dev_.sumSquares(gradSpans(skip), sumSq, nonFinite);
}

void StageModel::scaleGrads(double factor) {
  for (const Span &s : gradSpans()) dev_.scale((void *)s.p, s.n, s.dtype, factor);
}

void StageModel::applyStep(const OptimizerConfig &opt, const pipec_step_control *control) {
  auto p = paramPtrs(params_);
  auto g = gradPtrs();
  auto s = statePtrs();
  pipec_optimizer_call c{};
  c.step = steps + 1;
  c.learning_rate = opt.lr;
  c.weight_decay = opt.weightDecay;
  c.momentum = opt.momentum;
  c.beta1 = opt.beta1;
  c.beta2 = opt.beta2;
  c.epsilon = opt.epsilon;
  c.params = p.data();
  c.grads = g.data();
  c.state = s.data();
  c.stream = dev_.computeStream();
  c.control = control;
  lib_->step(c);
  ++steps;
}

} // namespace pipec::rt
