// Convolutions through cuDNN's graph API (conv_cudnn.cuh; docs/cuda-kernels.md,
// "Convolutions (cuDNN)"): the forward (conv_fprop), the input gradient
// (conv_dgrad) and the weight gradient (conv_wgrad, every sample in one
// call) with FLOAT compute: on float32 storage for the TF32 and BF16
// precisions (cuDNN's default lets its TF32 tensor-core engines run it), and
// on bf16 storage (x, w, y all BFLOAT16, as cuDNN's bf16 configuration
// wants; a weight gradient in bf16 is widened by the caller). x [N, C, d...],
// w [F, C/G, k...] and y [N, F, o...] are
// cuDNN's tensors as they lie (row-major NCHW strides, nothing copied), or
// for a channels-last call x [N, d..., C], w [F, k..., C/G], y [N, o..., F]
// (the same logical dims, NHWC / KRSC strides: what cuDNN's fast NHWC
// engines want); a 1-D convolution is a 2-D one of height 1. A forward's
// epilogue, y = f(conv + bias + residual), is part of its graph (pointwise
// ADDs of the bias and of the residual, then RELU_FWD, ReLU6 with an upper
// clip of 6, on the convolution's FLOAT result, y rounded once) where cuDNN
// has an engine for that, else the caller's epilogue kernel applies it after
// the plain graph. One plan per shape, layout, kind and fused epilogue,
// built on the first call (outside any CUDA graph capture) from cuDNN's
// deterministic engines only, so equal runs give equal bits. Host code only.
#include "conv_cudnn.cuh"
#include "cudnn_graphs.cuh"
#include "pipec/conv_engines.h"

#if !defined(__CUDA_ARCH__)
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <tuple>
#include <type_traits>
#include <vector>

namespace pipec::kernels::cuda::dnn {

#ifndef PIPEC_CUDNN_GRAPHS

template <class T> bool conv(const T *, const T *, ConvEpilogue<T> &, T *, const ConvGeom &, const Workspace &, bool) {
  return false;
}
template <class T> bool convInputGrad(const T *, const T *, T *, const ConvGeom &, const Workspace &, bool) {
  return false;
}
template <class T> bool convWeightGrad(const T *, const T *, T *, const ConvGeom &, const Workspace &, bool) {
  return false;
}

#else

namespace {

enum class ConvKind { Forward, InputGrad, WeightGrad };
enum Uid : int64_t { kX = 1, kW, kY, kBias, kResidual };

/// What one convolution graph is built for: its kind, storage type,
/// layout and geometry in cuDNN's terms (at least two spatial axes), and
/// which parts of a forward's epilogue it applies.
struct ConvKey {
  ConvKind kind;
  fe::DataType_t type;
  bool channelsLast;
  std::vector<int64_t> x, w, y, pre, post, stride, dilation;
  bool bias = false, residual = false;
  EpilogueActivation activation = EpilogueActivation::None;
  bool fused() const { return bias || residual || activation != EpilogueActivation::None; }
  auto tied() const {
    return std::tie(kind, type, channelsLast, x, w, y, pre, post, stride, dilation, bias, residual, activation);
  }
  bool operator<(const ConvKey &o) const { return tied() < o.tied(); }
};

/// The key of `g`: x [N, C, d...], w [F, C/G, k...], y [N, F, o...] (the
/// logical dims of either layout), a leading spatial axis of 1 added to a
/// 1-D convolution.
ConvKey keyOf(ConvKind kind, fe::DataType_t type, bool channelsLast, const ConvGeom &g) {
  ConvKey key{kind, type, channelsLast, {g.N, g.C}, {g.F, g.Cg}, {g.N, g.F}, {}, {}, {}, {}};
  if (g.sp == 1) {
    key.x.push_back(1), key.w.push_back(1), key.y.push_back(1);
    key.pre.push_back(0), key.post.push_back(0), key.stride.push_back(1), key.dilation.push_back(1);
  }
  for (int a = 0; a < g.sp; ++a) {
    key.x.push_back(g.in[a]), key.w.push_back(g.k[a]), key.y.push_back(g.out[a]);
    key.pre.push_back(g.pb[a]), key.post.push_back(g.pe[a]);
    key.stride.push_back(g.s[a]), key.dilation.push_back(g.d[a]);
  }
  return key;
}

/// The fused parts of `key`, as "bias + residual + relu".
std::string epilogueString(const ConvKey &key) {
  std::string s;
  auto part = [&](bool present, const char *name) {
    if (present) s += (s.empty() ? "" : " + ") + std::string(name);
  };
  part(key.bias, "bias");
  part(key.residual, "residual");
  part(key.activation == EpilogueActivation::Relu, "relu");
  part(key.activation == EpilogueActivation::Relu6, "relu6");
  return s;
}

std::string dimsString(const std::vector<int64_t> &dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? "," : "") + std::to_string(dims[i]);
  return s + "]";
}

/// A forward's nodes: conv_fprop, then the epilogue's parts that `key`
/// fuses, each a pointwise node of FLOAT compute on the previous node's
/// result (virtual, FLOAT, y's dims and strides): ADD of the bias (float
/// [F] seen as [1, F, 1...], contiguous in either layout), ADD of the
/// residual (y's dims, strides and type), RELU_FWD (ReLU6: an upper clip
/// of 6). The last node's result is the graph's y, rounded to the io type
/// once.
template <class Attributes, class Strides>
std::shared_ptr<fe::graph::Tensor_attributes> forwardGraph(fe::graph::Graph &graph, const ConvKey &key,
                                                           std::shared_ptr<fe::graph::Tensor_attributes> x,
                                                           std::shared_ptr<fe::graph::Tensor_attributes> w,
                                                           Attributes attributes, Strides strides) {
  auto y = graph.conv_fprop(x, w, attributes(fe::graph::Conv_fprop_attributes().set_name("conv")));
  auto intermediate = [&] {
    y->set_dim(key.y).set_stride(strides(key.y)).set_data_type(fe::DataType_t::FLOAT);
  };
  auto given = [&](const char *name, Uid uid, const std::vector<int64_t> &dims, fe::DataType_t type) {
    return graph.tensor(fe::graph::Tensor_attributes()
                            .set_name(name)
                            .set_uid(uid)
                            .set_dim(dims)
                            .set_stride(strides(dims))
                            .set_data_type(type));
  };
  auto add = [&](const char *name, std::shared_ptr<fe::graph::Tensor_attributes> operand) {
    intermediate();
    y = graph.pointwise(y, operand,
                        fe::graph::Pointwise_attributes()
                            .set_name(name)
                            .set_mode(fe::PointwiseMode_t::ADD)
                            .set_compute_data_type(fe::DataType_t::FLOAT));
  };
  if (key.bias) {
    std::vector<int64_t> biasDims(key.y.size(), 1);
    biasDims[1] = key.y[1];
    add("bias_add", given("bias", kBias, biasDims, fe::DataType_t::FLOAT));
  }
  if (key.residual) add("residual_add", given("residual", kResidual, key.y, key.type));
  if (key.activation != EpilogueActivation::None) {
    intermediate();
    auto relu = fe::graph::Pointwise_attributes()
                    .set_name("relu")
                    .set_mode(fe::PointwiseMode_t::RELU_FWD)
                    .set_compute_data_type(fe::DataType_t::FLOAT);
    if (key.activation == EpilogueActivation::Relu6) relu.set_relu_lower_clip(0.0f).set_relu_upper_clip(6.0f);
    y = graph.pointwise(y, relu);
  }
  return y;
}

/// The graph of `key` built into `plan`, or false with cuDNN's reason.
bool buildGraph(const ConvKey &key, cudnnHandle_t handle, Plan &plan, std::string &why) {
  auto graph = std::make_shared<fe::graph::Graph>();
  graph->set_io_data_type(key.type)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  auto strides = [&](const std::vector<int64_t> &dims) {
    return key.channelsLast ? channelsLastStrides(dims) : rowMajorStrides(dims);
  };
  auto input = [&](const char *name, Uid uid, const std::vector<int64_t> &dims) {
    return graph->tensor(fe::graph::Tensor_attributes()
                             .set_name(name)
                             .set_uid(uid)
                             .set_dim(dims)
                             .set_stride(strides(dims))
                             .set_data_type(key.type));
  };
  auto output = [&](const std::shared_ptr<fe::graph::Tensor_attributes> &t, Uid uid, const std::vector<int64_t> &dims) {
    t->set_output(true).set_uid(uid).set_dim(dims).set_stride(strides(dims)).set_data_type(key.type);
  };
  auto attributes = [&](auto options) {
    options.set_pre_padding(key.pre).set_post_padding(key.post).set_stride(key.stride).set_dilation(key.dilation);
    options.set_compute_data_type(fe::DataType_t::FLOAT);
    return options;
  };
  switch (key.kind) {
  case ConvKind::Forward:
    output(forwardGraph(*graph, key, input("x", kX, key.x), input("w", kW, key.w), attributes, strides), kY, key.y);
    break;
  case ConvKind::InputGrad:
    output(graph->conv_dgrad(input("dy", kY, key.y), input("w", kW, key.w),
                             attributes(fe::graph::Conv_dgrad_attributes().set_name("conv_input_grad"))),
           kX, key.x);
    break;
  case ConvKind::WeightGrad:
    output(graph->conv_wgrad(input("dy", kY, key.y), input("x", kX, key.x),
                             attributes(fe::graph::Conv_wgrad_attributes().set_name("conv_weight_grad"))),
           kW, key.w);
    break;
  }
  // Heuristics A, then cuDNN's fallback list: a convolution has engines for
  // every shape there, where A may rank none that is deterministic.
  return build(graph, handle, {fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK}, /*deterministic=*/true, plan, why);
}

/// This thread's convolution plans per device.
thread_local std::map<int, std::map<ConvKey, Plan>> plansByDevice;

bool disabledByEnvironment() {
  const char *value = std::getenv("PIPEC_CUDNN_CONV");
  return value && std::strcmp(value, "0") == 0;
}

/// The plan of `key`, built on its first call; null where cuDNN refuses
/// it, said on stderr once per shape with `instead` (what runs then).
const Plan *planFor(const char *op, const ConvKey &key, cudnnHandle_t handle, const char *instead) {
  auto &plans = plansByDevice[detail::deviceIndex(op)];
  auto found = plans.find(key);
  if (found == plans.end()) {
    Plan plan;
    std::string why;
    if (!buildGraph(key, handle, plan, why)) {
      const std::string epilogue = key.fused() ? " with its epilogue (" + epilogueString(key) + ")" : "";
      std::fprintf(stderr, "pipec: cuDNN has no deterministic %s%s for %s%s x %s, w %s (%s); %s\n", op,
                   epilogue.c_str(), key.type == fe::DataType_t::BFLOAT16 ? "bf16" : "float",
                   key.channelsLast ? " channels-last" : "", dimsString(key.x).c_str(), dimsString(key.w).c_str(),
                   why.c_str(), instead);
    }
    found = plans.emplace(key, std::move(plan)).first;
  }
  return found->second.graph ? &found->second : nullptr;
}

/// Marks in `key` the leading parts of `epilogue` that cuDNN's graph may
/// apply: each present part in order (bias, residual, activation), up to
/// the first whose tensor is not 16-byte aligned.
template <class T> void markFusable(ConvKey &key, const ConvEpilogue<T> &epilogue) {
  if (epilogue.bias) {
    if (!aligned16({epilogue.bias})) return;
    key.bias = true;
  }
  if (epilogue.residual) {
    if (!aligned16({epilogue.residual})) return;
    key.residual = true;
  }
  key.activation = epilogue.activation;
}

/// Runs one convolution of `kind` through cuDNN, or declines (false).
/// Float storage in the F32 precision stays on pipec's kernels (equal to
/// the CPU's); bf16 storage exists only in the BF16 precision. A forward's
/// `epilogue` (else null) runs in the graph as far as cuDNN takes it (those
/// parts then cleared), else the plain graph runs and leaves it all to the
/// caller.
template <class T>
bool run(const char *op, ConvKind kind, const ConvGeom &g, const T *x, const T *w, const T *y,
         ConvEpilogue<T> *epilogue, const Workspace &workspace, bool channelsLast) {
  constexpr bool bf16Storage = std::is_same_v<T, bf16>;
  // The rule the plan printout shares (pipec/conv_engines.h).
  const bool empty = g.N == 0 || g.C == 0 || g.F == 0 || g.inSize == 0 || g.outSize == 0;
  if (disabledByEnvironment() ||
      conv_engines::staticFallback(g.sp, bf16Storage, detail::precision() == Precision::F32, empty) ||
      !aligned16({x, w, y}))
    return false;
  cudnnHandle_t handle = dnn::handle(op, "convolutions run on pipec's kernels");
  if (!handle) return false;
  ConvKey key = keyOf(kind, bf16Storage ? fe::DataType_t::BFLOAT16 : fe::DataType_t::FLOAT, channelsLast, g);
  const Plan *plan = nullptr;
  if (epilogue) markFusable(key, *epilogue);
  if (key.fused()) plan = planFor(op, key, handle, "cuDNN's plain convolution runs it, then pipec's epilogue kernel");
  if (!plan) {
    key.bias = key.residual = false;
    key.activation = EpilogueActivation::None;
    plan = planFor(op, key, handle, "pipec's convolution kernels run it");
  }
  if (!plan) return false;
  std::unordered_map<int64_t, void *> pack = {
      {kX, const_cast<T *>(x)}, {kW, const_cast<T *>(w)}, {kY, const_cast<T *>(y)}};
  if (key.bias) pack[kBias] = const_cast<float *>(epilogue->bias);
  if (key.residual) pack[kResidual] = const_cast<T *>(epilogue->residual);
  execute(op, handle, *plan, pack, callMemory(workspace, plan->workspaceBytes));
  if (key.bias) epilogue->bias = nullptr;
  if (key.residual) epilogue->residual = nullptr;
  if (key.activation != EpilogueActivation::None) epilogue->activation = EpilogueActivation::None;
  return true;
}

} // namespace

template <class T>
bool conv(const T *x, const T *w, ConvEpilogue<T> &epilogue, T *y, const ConvGeom &g, const Workspace &workspace,
          bool channelsLast) {
  return run<T>("nn.conv", ConvKind::Forward, g, x, w, y, &epilogue, workspace, channelsLast);
}
template <class T>
bool convInputGrad(const T *dy, const T *w, T *dx, const ConvGeom &g, const Workspace &workspace, bool channelsLast) {
  return run<T>("nn.conv_input_grad", ConvKind::InputGrad, g, dx, w, dy, nullptr, workspace, channelsLast);
}
template <class T>
bool convWeightGrad(const T *dy, const T *x, T *dw, const ConvGeom &g, const Workspace &workspace, bool channelsLast) {
  return run<T>("nn.conv_weight_grad", ConvKind::WeightGrad, g, x, dw, dy, nullptr, workspace, channelsLast);
}

#endif // PIPEC_CUDNN_GRAPHS

#define PIPEC_CUDNN_CONVOLUTIONS_FOR(T)                                                                               \
  template bool conv<T>(const T *, const T *, ConvEpilogue<T> &, T *, const ConvGeom &, const Workspace &, bool);     \
  template bool convInputGrad<T>(const T *, const T *, T *, const ConvGeom &, const Workspace &, bool);                \
  template bool convWeightGrad<T>(const T *, const T *, T *, const ConvGeom &, const Workspace &, bool);
PIPEC_CUDNN_CONVOLUTIONS_FOR(float)
PIPEC_CUDNN_CONVOLUTIONS_FOR(bf16)
#undef PIPEC_CUDNN_CONVOLUTIONS_FOR

} // namespace pipec::kernels::cuda::dnn

#endif // !__CUDA_ARCH__
