// Flash attention through cuDNN's graph API (cudnn_frontend, header-only;
// docs/cuda-kernels.md, "Flash attention"): nn.attention and
// nn.attention_grad on bf16 storage, forward and backward, as cuDNN's
// scaled dot-product attention. q, k, v [L..., S|T, D] are seen as
// [b, h, S|T, D] (h the last of L..., b the rest); sequence-major q, k, v
// [L'..., S|T, H, D] as [b, h, S|T, D] too, h = H and b = L'..., with the
// strides of their memory (cuDNN's "bshd"), so nothing is transposed;
// grouped-query k and v as [b, hk, T, D] (cuDNN's GQA, query head i reading
// key/value head i / (h / hk), as nn.attention's kernels do); a
// boolean or additive mask becomes a bf16 bias [1|b, 1|h, S, T], written for
// each call (the mask may change between calls); P's dropout is cuDNN's own
// (its Philox generator, seeded with the call's key and the op's id, both
// read on the device, so a CUDA graph of the call draws that call's masks).
// One cuDNN plan per shape and layout, built on the first call, forward and
// backward together: a training forward runs on cuDNN only when cuDNN also
// has the backward, so both halves of one attention always see the same
// dropout.
#include "cudnn_graphs.cuh"
#include "detail.cuh"
#include "flash_attention.cuh"
#include "index_map.cuh"

#if defined(PIPEC_CUDNN_GRAPHS)
#define PIPEC_FLASH_ATTENTION 1
#endif
// All but the bias kernel is host code: nvcc's device passes (one per
// architecture) skip it and the frontend's headers (cudnn_graphs.cuh),
// which would otherwise be compiled once per architecture.

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <map>
#include <string>
#include <utility>
#include <memory>
#include <mutex>
#include <tuple>
#include <unordered_map>
#include <vector>

namespace pipec::kernels::cuda {

#ifdef PIPEC_FLASH_ATTENTION
// External linkage: the launch is host code, which the device passes do not
// see, so a kernel of internal linkage would look unused there.
namespace flash {
/// bias[bb, hh, i, j] of the mask at scores element ((bb·h + hh)·S + i, j):
/// fill where a boolean mask masks, else 0; or the additive mask's value.
__global__ void attentionBiasKernel(bf16 *bias, int64_t n, int64_t biasH, int64_t h, int64_t S, int64_t T,
                                    const uint8_t *mask, const float *additive, detail::IndexMap<1> map, float fill,
                                    bool maskedWhen) {
  for (int64_t i = detail::firstIndex(); i < n; i += detail::gridStride()) {
    const int64_t j = i % T, row = i / T, si = row % S, slice = row / S;
    const int64_t hh = slice % biasH, bb = slice / biasH;
    int64_t off[1];
    map.offsets(((bb * h + hh) * S + si) * T + j, off);
    const float value = mask ? ((mask[off[0]] != 0) == maskedWhen ? fill : 0.0f) : additive[off[0]];
    bias[i] = detail::fromF<bf16>(value);
  }
}
} // namespace flash
#endif

} // namespace pipec::kernels::cuda

#if !defined(__CUDA_ARCH__)

namespace pipec::kernels::cuda {

namespace {
/// The masks declareCausalMask was told about: their shape and polarity.
struct CausalMask {
  Shape ms;
  bool maskedWhen;
};
std::mutex causalMasksMutex;
std::map<const uint8_t *, CausalMask> causalMasks;
} // namespace

void declareCausalMask(const uint8_t *mask, const Shape &ms, bool maskedWhen) {
  std::lock_guard<std::mutex> lock(causalMasksMutex);
  causalMasks[mask] = {ms, maskedWhen};
}

namespace flash {

#ifndef PIPEC_FLASH_ATTENTION

bool attention(const AttentionOperands &, bf16 *, float *) { return false; }
bool attentionGrad(const AttentionOperands &, const bf16 *, const bf16 *, const float *, bf16 *, bf16 *, bf16 *) {
  return false;
}

#else

namespace fe = cudnn_frontend;

namespace {

/// Tensor ids of the variant packs.
enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kBias, kSeed, kOffset, kDO, kDQ, kDK, kDV };

/// What one cuDNN graph is built for. Scale and dropout are baked into the
/// graph, and so are the operands' strides (the layout); biasB = 0 means no
/// bias.
struct PlanKey {
  bool backward, causal;
  AttentionLayout layout;
  int64_t jointHeads; // AttentionView::jointHeads
  int64_t b, h, hk, S, T, D, Dv, biasB, biasH;
  uint32_t scaleBits, dropoutBits;
  auto tied() const {
    return std::tie(backward, causal, layout, jointHeads, b, h, hk, S, T, D, Dv, biasB, biasH, scaleBits,
                    dropoutBits);
  }
  bool operator<(const PlanKey &o) const { return tied() < o.tied(); }
};

using dnn::Plan;
using dnn::rowMajorStrides;

/// This thread's cuDNN handle (cudnn_graphs.cuh) and attention plans on one
/// device, and device copies of the dropout seeds and offsets that are not
/// already in device memory.
struct DeviceContext {
  cudnnHandle_t handle = nullptr;
  std::map<PlanKey, Plan> plans;
  std::map<uint64_t, uint64_t *> values;
  ~DeviceContext() { // may fail when the driver is already gone at exit: ignored
    plans.clear();
    for (auto &entry : values) cudaFree(entry.second);
  }
};
thread_local std::map<int, DeviceContext> contexts;

/// This thread's context on the current device, its handle bound to the
/// stream; null when cuDNN cannot be used (said once on stderr).
DeviceContext *context(const char *op) {
  cudnnHandle_t handle = dnn::handle(op, "attention runs on pipec's kernels");
  if (!handle) return nullptr;
  DeviceContext &c = contexts[detail::deviceIndex(op)];
  c.handle = handle;
  return &c;
}

bool disabledByEnvironment() {
  const char *value = std::getenv("PIPEC_CUDNN_ATTENTION");
  return value && std::strcmp(value, "0") == 0;
}

uint32_t bitsOf(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

/// The strides of an operand [b, heads, rows, width] of `key` (Q, K, V, O
/// and their gradients): row-major head-major; sequence-major, the memory
/// is [b, rows, heads, width], or for a window of a joint value (Q, K, V and
/// their gradients, `windowOfJoint`) [b, rows, key.jointHeads, width].
/// Stats and the bias stay row-major in either.
std::vector<int64_t> operandStrides(const PlanKey &key, int64_t heads, int64_t rows, int64_t width,
                                    bool windowOfJoint = false) {
  if (key.layout == AttentionLayout::HeadMajor) return rowMajorStrides({key.b, heads, rows, width});
  const int64_t rowHeads = windowOfJoint && key.jointHeads ? key.jointHeads : heads;
  return {rows * rowHeads * width, width, rowHeads * width, 1};
}

/// The graph of `key`, built into `plan`, or false with cuDNN's reason in `why`.
bool buildGraph(const PlanKey &key, bool deterministic, cudnnHandle_t handle, Plan &plan, std::string &why) {
  auto graph = std::make_shared<fe::graph::Graph>();
  graph->set_io_data_type(fe::DataType_t::BFLOAT16)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  auto tensor = [&](const char *name, Uid uid, std::vector<int64_t> dims, std::vector<int64_t> strides,
                    fe::DataType_t type = fe::DataType_t::BFLOAT16) {
    return graph->tensor(fe::graph::Tensor_attributes()
                             .set_name(name)
                             .set_uid(uid)
                             .set_dim(dims)
                             .set_stride(strides)
                             .set_data_type(type));
  };
  auto output = [](const std::shared_ptr<fe::graph::Tensor_attributes> &t, Uid uid, std::vector<int64_t> dims,
                   std::vector<int64_t> strides, fe::DataType_t type = fe::DataType_t::BFLOAT16) {
    t->set_output(true).set_uid(uid).set_dim(dims).set_stride(strides).set_data_type(type);
  };
  const int64_t b = key.b, h = key.h, S = key.S, T = key.T, D = key.D, Dv = key.Dv;
  // An operand [b, heads, rows, width] where the layout puts it (heads: h,
  // or hk for K, V and their gradients); stats [b, h, S, 1] and the bias row-major.
  // Q, K, V and their gradients may be windows of a joint value; O and dO never.
  auto operand = [&](const char *name, Uid uid, int64_t heads, int64_t rows, int64_t width) {
    const bool window = uid == kQ || uid == kK || uid == kV;
    return tensor(name, uid, {b, heads, rows, width}, operandStrides(key, heads, rows, width, window));
  };
  auto operandOutput = [&](const std::shared_ptr<fe::graph::Tensor_attributes> &t, Uid uid, int64_t heads,
                           int64_t rows, int64_t width) {
    const bool window = uid == kDQ || uid == kDK || uid == kDV;
    output(t, uid, {b, heads, rows, width}, operandStrides(key, heads, rows, width, window));
  };
  const int64_t hk = key.hk;
  const std::vector<int64_t> statsDims{b, h, S, 1};
  auto q = operand("Q", kQ, h, S, D), k = operand("K", kK, hk, T, D), v = operand("V", kV, hk, T, Dv);
  const std::vector<int64_t> biasDims{key.biasB, key.biasH, S, T};
  auto bias = key.biasB ? tensor("bias", kBias, biasDims, rowMajorStrides(biasDims)) : nullptr;
  float scale, dropout;
  std::memcpy(&scale, &key.scaleBits, sizeof scale);
  std::memcpy(&dropout, &key.dropoutBits, sizeof dropout);
  const std::vector<int64_t> scalar{1, 1, 1, 1};
  auto seed = dropout > 0 ? tensor("seed", kSeed, scalar, scalar, fe::DataType_t::INT64) : nullptr;
  auto offset = dropout > 0 ? tensor("offset", kOffset, scalar, scalar, fe::DataType_t::INT64) : nullptr;
  if (!key.backward) {
    auto options = fe::graph::SDPA_attributes().set_name("attention").set_generate_stats(true).set_attn_scale(scale);
    if (key.causal) options.set_causal_mask(true);
    if (bias) options.set_bias(bias);
    if (dropout > 0) options.set_dropout(dropout, seed, offset);
    auto [o, stats] = graph->sdpa(q, k, v, options);
    operandOutput(o, kO, h, S, Dv);
    output(stats, kStats, statsDims, rowMajorStrides(statsDims), fe::DataType_t::FLOAT);
  } else {
    auto o = operand("O", kO, h, S, Dv), dO = operand("dO", kDO, h, S, Dv);
    auto stats = tensor("stats", kStats, statsDims, rowMajorStrides(statsDims), fe::DataType_t::FLOAT);
    auto options = fe::graph::SDPA_backward_attributes().set_name("attention_grad").set_attn_scale(scale);
    if (deterministic) options.set_deterministic_algorithm(true);
    if (key.causal) options.set_causal_mask(true);
    if (bias) options.set_bias(bias);
    if (dropout > 0) options.set_dropout(dropout, seed, offset);
    auto [dQ, dK, dV] = graph->sdpa_backward(q, k, v, o, dO, stats, options);
    operandOutput(dQ, kDQ, h, S, D);
    operandOutput(dK, kDK, hk, T, D);
    operandOutput(dV, kDV, hk, T, Dv);
  }
  // Determinism is SDPA's own option above, not an engine filter.
  return dnn::build(graph, handle, {fe::HeurMode_t::A}, /*deterministic=*/false, plan, why);
}

/// The plan of `key`, built on first use. A backward is built deterministic
/// (equal runs give equal bits) where cuDNN can; else as it can, said once.
const Plan &planFor(DeviceContext &c, const PlanKey &key) {
  auto found = c.plans.find(key);
  if (found != c.plans.end()) return found->second;
  Plan plan;
  std::string why;
  // The frontend throws where it cannot load a part of cuDNN or CUDA it
  // needs: no plan then, as for a refusal.
  auto build = [&](bool deterministic, std::string &reason) {
    try {
      return buildGraph(key, deterministic, c.handle, plan, reason);
    } catch (const std::exception &e) {
      reason = e.what();
      return false;
    }
  };
  build(true, why);
  if (!plan.graph && key.backward) {
    std::string whyNot;
    build(false, whyNot);
    if (plan.graph)
      std::fprintf(stderr, "pipec: cuDNN has no deterministic attention backward for this shape (%s); using its "
                           "non-deterministic one\n", why.c_str());
    else
      why = whyNot;
  }
  if (!plan.graph) {
    std::fprintf(stderr,
                 "pipec: cuDNN flash attention %s not available for [%lld, %lld (%lld key/value), %lld|%lld, "
                 "%lld|%lld]%s%s (%s); pipec's attention kernels run it\n",
                 key.backward ? "backward" : "forward", (long long)key.b, (long long)key.h, (long long)key.hk,
                 (long long)key.S, (long long)key.T, (long long)key.D, (long long)key.Dv,
                 key.layout == AttentionLayout::SequenceMajor ? " sequence-major" : "",
                 key.causal ? " causal" : key.biasB ? " with a bias" : "", why.c_str());
  }
  return c.plans.emplace(key, std::move(plan)).first->second;
}

/// `value` in device memory (cuDNN reads its dropout seed and offset there),
/// kept for the life of the thread; created outside any CUDA graph capture
/// (a stage's first call).
const uint64_t *valueOnDevice(DeviceContext &c, uint64_t value, const char *op) {
  auto found = c.values.find(value);
  if (found != c.values.end()) return found->second;
  detail::failIfCapturing(op, "would allocate");
  uint64_t *device = nullptr;
  detail::check(cudaMalloc(reinterpret_cast<void **>(&device), sizeof(uint64_t)), op);
  c.values[value] = device;
  detail::check(cudaMemcpy(device, &value, sizeof value, cudaMemcpyHostToDevice), op);
  return device;
}

/// One call's view of the operands for cuDNN, or nullopt-like `ok = false`.
struct Geometry {
  bool ok = false, causal = false;
  int64_t b = 1, h = 1, hk = 1, biasB = 0, biasH = 0;
  AttentionView view;
};

/// A boolean mask's fill at or below this makes exp(fill + s·scale - max)
/// zero in float for any score a model produces (|s·scale| far below 10⁴):
/// exporters write -inf, the float's lowest, -1e9 or -1e4.
constexpr float kVanishingFill = -1e4f;

/// Whether the call's boolean mask was declared causal for its shape and
/// polarity and spans the whole [S, T] slice (cuDNN's causal mode leaves the
/// masked scores out, as a vanishing fill does).
bool declaredCausal(const AttentionOperands &a, const AttentionView &v) {
  if (!a.mask || a.ms.size < 2 || a.ms.v[a.ms.size - 2] != v.S || a.ms.v[a.ms.size - 1] != v.T ||
      !(a.fill <= kVanishingFill))
    return false;
  std::lock_guard<std::mutex> lock(causalMasksMutex);
  auto found = causalMasks.find(a.mask);
  return found != causalMasks.end() && found->second.ms == a.ms && found->second.maskedWhen == a.maskedWhen;
}

Geometry geometryOf(const char *op, const AttentionOperands &a) {
  Geometry g;
  g.view = attentionView(op, a.qs, a.ks, a.vs, a.ms, a.mask != nullptr, a.additive != nullptr, a.layout,
                         a.jointHeads);
  const AttentionView &v = g.view;
  if (a.qs.size < 3 || v.S == 0 || v.T == 0 || v.D == 0 || v.Dv == 0 || v.L == 0) return g;
  // A boolean mask sets masked scores to `fill`; cuDNN adds a bias to them
  // instead (or leaves them out): the same softmax only when the fill's
  // exponential vanishes next to any kept score.
  if (a.mask && !(a.fill <= kVanishingFill)) return g;
  // h: the scores' axis before S (H sequence-major, the last of L...
  // head-major from rank 4; head-major rank 3 has none: h = 1, b = L).
  const int rank = v.scores.size; // [L..., S, T]
  const bool hasHeads = a.layout == AttentionLayout::SequenceMajor || rank >= 4;
  g.h = hasHeads ? v.scores.v[rank - 3] : 1;
  g.b = v.L / g.h;
  // Grouped key/value heads: cuDNN groups h, never b (head-major [H, S, D]
  // of rank 3 groups its only leading axis, which cuDNN sees as b).
  if (v.group > 1 && !hasHeads) return g;
  g.hk = g.h / v.group;
  g.causal = declaredCausal(a, v);
  if (v.masked && !g.causal) {
    const detail::Strides strides = detail::broadcastStrides(a.ms, v.scores);
    const int bAxes = hasHeads ? rank - 3 : 1; // the scores' axes before h (or L itself)
    auto varies = [&](int axis) { return strides[axis] != 0 && v.scores.v[axis] != 1; };
    bool variesOverB = false;
    for (int axis = 0; axis < bAxes; ++axis) variesOverB |= varies(axis);
    const bool variesOverH = hasHeads && varies(rank - 3);
    g.biasB = variesOverB ? g.b : 1;
    g.biasH = variesOverH ? g.h : 1;
  }
  g.ok = true;
  return g;
}

PlanKey keyOf(const Geometry &g, const AttentionOperands &a, bool backward) {
  const float scale = a.divide ? 1.0f / a.scale : a.scale;
  const float dropout = a.training ? a.dropoutRatio : 0.0f;
  return {backward, g.causal, a.layout, a.jointHeads, g.b, g.h, g.hk, g.view.S, g.view.T, g.view.D, g.view.Dv, g.biasB, g.biasH,
          bitsOf(scale), bitsOf(dropout)};
}

/// The plans the call needs, or null when cuDNN declines: the call's own,
/// and the forward's for a backward; with dropout both, so that the two
/// halves of one attention draw from one generator. `training` says only
/// whether dropout is active: generated code passes false for an attention
/// without dropout, in the backward too (docs/gpu-runs.md: once read as "no
/// backward", it sent every such backward to pipec's kernels, 12x slower).
const Plan *plansFor(DeviceContext &c, const Geometry &g, const AttentionOperands &a, bool backward) {
  const Plan &forward = planFor(c, keyOf(g, a, false));
  if (!forward.graph) return nullptr;
  const bool dropout = a.training && a.dropoutRatio > 0;
  if (!backward && !dropout) return &forward;
  const Plan &grad = planFor(c, keyOf(g, a, true));
  if (!grad.graph) return nullptr;
  return backward ? &grad : &forward;
}

/// Runs `plan` with `pack`, after writing the bias (when there is one) into
/// the call's workspace or kernel scratch, ahead of cuDNN's own workspace.
void execute(const char *op, DeviceContext &c, const Plan &plan, const Geometry &g, const AttentionOperands &a,
             std::unordered_map<int64_t, void *> &pack) {
  const int64_t biasElements = g.biasB ? g.biasB * g.biasH * g.view.S * g.view.T : 0;
  const int64_t biasBytes = ScratchNeed::alignedScratchBytes(biasElements * (int64_t)sizeof(bf16));
  const int64_t need = biasBytes + ScratchNeed::alignedScratchBytes(plan.workspaceBytes);
  char *memory = dnn::callMemory(a.workspace, need);
  if (biasElements > 0) {
    bf16 *bias = reinterpret_cast<bf16 *>(memory);
    const detail::IndexMap<1> map =
        detail::makeIndexMap<1>(g.view.scores, {detail::broadcastStrides(a.ms, g.view.scores)});
    attentionBiasKernel<<<detail::blocksFor(biasElements), detail::kThreads, 0, detail::stream()>>>(
        bias, biasElements, g.biasH, g.h, g.view.S, g.view.T, a.mask, a.additive, map, a.fill, a.maskedWhen);
    detail::checkLaunch(op);
    pack[kBias] = bias;
  }
  if (a.training && a.dropoutRatio > 0) {
    const StreamKey &key = a.dropoutStreamKey;
    // The seed: the call's key (generated code), or the plain key itself.
    pack[kSeed] = const_cast<uint64_t *>(key.call ? key.call : valueOnDevice(c, key.value, op));
    pack[kOffset] = const_cast<uint64_t *>(valueOnDevice(c, key.call ? key.value : 0, op));
  }
  dnn::execute(op, c.handle, plan, pack, memory ? memory + biasBytes : nullptr);
}

/// cuDNN reads and writes its tensors 16 bytes at a time. Generated code's
/// tensors are 64-byte aligned (the arena's slots). A call whose operands
/// are not is declined without dropout (either path computes the same
/// attention); with dropout it is an error, since the backward must draw
/// the forward's masks and so take the path the forward took.
bool alignedOperands(const char *op, const AttentionOperands &a, std::initializer_list<const void *> pointers) {
  if (dnn::aligned16(pointers)) return true;
  if (a.training && a.dropoutRatio > 0)
    detail::fail(op, "an operand is not 16-byte aligned, which cuDNN's flash attention needs with dropout "
                     "(set PIPEC_CUDNN_ATTENTION=0 to run pipec's attention kernels)");
  return false;
}

} // namespace

bool attention(const AttentionOperands &a, bf16 *y, float *lse) {
  const char *op = "nn.attention";
  if (disabledByEnvironment()) return false;
  const Geometry g = geometryOf(op, a);
  if (!g.ok || !alignedOperands(op, a, {a.q, a.k, a.v, y, lse})) return false;
  DeviceContext *c = context(op);
  const Plan *plan = c ? plansFor(*c, g, a, false) : nullptr;
  if (!plan) return false;
  std::unordered_map<int64_t, void *> pack = {{kQ, const_cast<bf16 *>(a.q)}, {kK, const_cast<bf16 *>(a.k)},
                                              {kV, const_cast<bf16 *>(a.v)}, {kO, y}, {kStats, lse}};
  execute(op, *c, *plan, g, a, pack);
  return true;
}

bool attentionGrad(const AttentionOperands &a, const bf16 *dy, const bf16 *y, const float *lse, bf16 *dq, bf16 *dk,
                   bf16 *dv) {
  const char *op = "nn.attention_grad";
  if (disabledByEnvironment()) return false;
  const Geometry g = geometryOf(op, a);
  if (!g.ok || !alignedOperands(op, a, {a.q, a.k, a.v, dy, y, lse, dq, dk, dv})) return false;
  DeviceContext *c = context(op);
  const Plan *plan = c ? plansFor(*c, g, a, true) : nullptr;
  if (!plan) return false;
  std::unordered_map<int64_t, void *> pack = {
      {kQ, const_cast<bf16 *>(a.q)}, {kK, const_cast<bf16 *>(a.k)},   {kV, const_cast<bf16 *>(a.v)},
      {kO, const_cast<bf16 *>(y)},   {kDO, const_cast<bf16 *>(dy)},   {kStats, const_cast<float *>(lse)},
      {kDQ, dq},                     {kDK, dk},                       {kDV, dv}};
  execute(op, *c, *plan, g, a, pack);
  return true;
}

#endif // PIPEC_FLASH_ATTENTION

} // namespace flash
} // namespace pipec::kernels::cuda

#endif // !__CUDA_ARCH__
