// Fake cuDNN graph API (cudnn_frontend) for host emulation: the parts
// pipec uses (runtime/kernels/cuda/src/attention_cudnn.cu, conv_cudnn.cu,
// cudnn_graphs.cu): a graph of one scaled dot-product attention, forward
// (sdpa) or backward (sdpa_backward), with a bias, a causal mask and
// dropout; or of one convolution (conv_fprop, conv_dgrad, conv_wgrad; below
// the attention), a forward optionally followed by a chain of pointwise
// nodes (an epilogue: ADDs of tensors that broadcast to y, a bias or a
// residual, then a RELU_FWD with its clips), every intermediate FLOAT. It
// checks what cuDNN checks of
// its caller: every tensor's uid, dims, strides and type agree with the
// operation (validate; strides: any order of the axes, as cuDNN's "bshd"
// layouts, but the last axis contiguous and no two elements at one
// address), head sizes cuDNN's flash kernels take (check_support),
// a variant pack with every tensor, 16-byte aligned (scalars 8), on the handle's stream,
// and a workspace of the size the graph asked for, which the backward really
// uses (its dQ accumulator). The arithmetic is a host reference of flash
// attention in float32 (products in double): the probabilities rounded to
// bf16 for their product with V, dS rounded to bf16 for dQ and dK. Every
// tensor is read and written through its own strides (Graph::at), never
// assumed contiguous.
//
// Dropout: real cuDNN draws its mask with its own Philox generator from the
// seed and offset tensors, which this cannot reproduce. The fake draws
// pipec's mask instead (pipec/kernel_types.h: element i of the [b, h, S, T]
// probabilities, key dropoutOpStreamKey(seed, offset)), so that an emulated
// stage still matches the CPU stage bit for bit in its masks; on a GPU the
// masks differ from the CPU's (docs/cuda-kernels.md, "Flash attention").
#pragma once
#include "cublas_v2.h"
#include "cuda_runtime.h"
#include "pipec/kernel_types.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

struct EmuCudnn {
  cudaStream_t stream = nullptr;
};
typedef EmuCudnn *cudnnHandle_t;
typedef int cudnnStatus_t;
constexpr cudnnStatus_t CUDNN_STATUS_SUCCESS = 0;

namespace cudnn_frontend::detail { // the frontend's wrappers of the library's C API (cudnn_frontend_shim.h)
inline size_t get_backend_version() { return 91900; }
inline cudnnStatus_t create_handle(cudnnHandle_t *h) {
  *h = new EmuCudnn;
  return CUDNN_STATUS_SUCCESS;
}
inline cudnnStatus_t destroy_handle(cudnnHandle_t h) {
  delete h;
  return CUDNN_STATUS_SUCCESS;
}
inline cudnnStatus_t set_stream(cudnnHandle_t h, cudaStream_t s) {
  h->stream = s;
  return CUDNN_STATUS_SUCCESS;
}
} // namespace cudnn_frontend::detail

namespace emu {
inline long cudnnPlans = 0; // graphs that reached build_plans
/// The dims and strides of x, w and y (in that order; dx, dw, dy for the
/// gradients; y the graph's output, after the epilogue where there is one)
/// of the last convolution graph executed, for the tests to see the layout
/// the graph was given, and the epilogue it applied: an ADD of a tensor
/// that broadcasts (bias), an ADD of a tensor of y's dims (residual, its
/// strides), a RELU_FWD (its clips).
struct ConvTensors {
  std::vector<int64_t> dims[3], strides[3];
  bool bias = false, residual = false, relu = false;
  std::vector<int64_t> residualStrides;
  float reluLower = 0, reluUpper = 0;
};
inline ConvTensors lastConvTensors;
/// Test hook: check_support refuses every convolution graph with a
/// pointwise node (as cuDNN does where it has no fused engine for a shape:
/// "no engine for conv_fprop + pointwise").
inline bool refuseConvPointwise = false;
}

namespace cudnn_frontend {
enum class DataType_t { NOT_SET, FLOAT, HALF, BFLOAT16, INT32, INT64 };
enum class HeurMode_t { A, B, FALLBACK };
enum class PointwiseMode_t { NOT_SET, ADD, MUL, SUB, RELU_FWD }; // the fake emulates ADD and RELU_FWD
enum class NumericalNote_t { NOT_SET, TENSOR_CORE, DOWN_CONVERT_INPUTS, REDUCED_PRECISION_REDUCTION, FFT,
                             NONDETERMINISTIC, WINOGRAD };
enum class error_code_t {
  OK,
  ATTRIBUTE_NOT_SET,
  INVALID_VARIANT_PACK,
  GRAPH_NOT_SUPPORTED,
  GRAPH_EXECUTION_FAILED,
  INVALID_VALUE
};
struct error_object {
  error_code_t code = error_code_t::OK;
  std::string err_msg;
  error_object() = default;
  error_object(error_code_t c, std::string m) : code(c), err_msg(std::move(m)) {}
  bool is_good() const { return code == error_code_t::OK; }
  bool is_bad() const { return !is_good(); }
  std::string get_message() { return err_msg; }
};
typedef error_object error_t;

namespace graph {
class Tensor_attributes {
public:
  Tensor_attributes &set_name(std::string n) { name = std::move(n); return *this; }
  Tensor_attributes &set_uid(int64_t u) { uid = u; uidSet = true; return *this; }
  Tensor_attributes &set_dim(std::vector<int64_t> d) { dims = std::move(d); return *this; }
  Tensor_attributes &set_stride(std::vector<int64_t> s) { strides = std::move(s); return *this; }
  Tensor_attributes &set_data_type(DataType_t t) { type = t; return *this; }
  Tensor_attributes &set_output(bool o) { output = o; return *this; }
  int64_t get_uid() const { return uid; }

  std::string name;
  int64_t uid = 0;
  bool uidSet = false, output = false;
  std::vector<int64_t> dims, strides;
  DataType_t type = DataType_t::NOT_SET;
};
using Tensor = std::shared_ptr<Tensor_attributes>;

/// What sdpa and sdpa_backward share.
struct AttentionFields {
  std::string name;
  float scale = 1.0f, dropout = 0.0f;
  bool scaleSet = false, causal = false;
  Tensor bias, seed, offset;
};
template <class Self> class AttentionOptions : public AttentionFields {
public:
  Self &set_name(std::string n) { name = std::move(n); return self(); }
  Self &set_attn_scale(float s) { scale = s; scaleSet = true; return self(); }
  Self &set_bias(Tensor b) { bias = std::move(b); return self(); }
  // Top-left aligned: key j of query i is left out when j > i.
  Self &set_causal_mask(bool c) { causal = c; return self(); }
  Self &set_dropout(float p, Tensor s, Tensor o) {
    dropout = p;
    seed = std::move(s);
    offset = std::move(o);
    return self();
  }

private:
  Self &self() { return static_cast<Self &>(*this); }
};
class SDPA_attributes : public AttentionOptions<SDPA_attributes> {
public:
  SDPA_attributes &set_generate_stats(bool g) { stats = g; return *this; }
  bool stats = false;
};
class SDPA_backward_attributes : public AttentionOptions<SDPA_backward_attributes> {
public:
  SDPA_backward_attributes &set_deterministic_algorithm(bool d) { deterministic = d; return *this; }
  bool deterministic = false;
};

/// What conv_fprop, conv_dgrad and conv_wgrad share: pads before and after
/// each spatial axis, strides, dilations (cross-correlation, as ONNX Conv).
struct ConvFields {
  std::string name;
  std::vector<int64_t> pre, post, stride, dilation;
  DataType_t compute = DataType_t::NOT_SET;
};
template <class Self> class ConvOptions : public ConvFields {
public:
  Self &set_name(std::string n) { name = std::move(n); return self(); }
  Self &set_compute_data_type(DataType_t t) { compute = t; return self(); }
  Self &set_padding(std::vector<int64_t> p) { pre = p; post = std::move(p); return self(); }
  Self &set_pre_padding(std::vector<int64_t> p) { pre = std::move(p); return self(); }
  Self &set_post_padding(std::vector<int64_t> p) { post = std::move(p); return self(); }
  Self &set_stride(std::vector<int64_t> s) { stride = std::move(s); return self(); }
  Self &set_dilation(std::vector<int64_t> d) { dilation = std::move(d); return self(); }

private:
  Self &self() { return static_cast<Self &>(*this); }
};
class Conv_fprop_attributes : public ConvOptions<Conv_fprop_attributes> {};
/// A pointwise node's mode and compute type (NOT_SET: the graph's), and a
/// RELU_FWD's clips (cuDNN's defaults: 0 and the largest value; the lower
/// clip's slope is not emulated).
class Pointwise_attributes {
public:
  Pointwise_attributes &set_name(std::string n) { name = std::move(n); return *this; }
  Pointwise_attributes &set_mode(PointwiseMode_t m) { mode = m; return *this; }
  Pointwise_attributes &set_compute_data_type(DataType_t t) { compute = t; return *this; }
  Pointwise_attributes &set_relu_lower_clip(float v) { reluLower = v; return *this; }
  Pointwise_attributes &set_relu_upper_clip(float v) { reluUpper = v; return *this; }
  PointwiseMode_t get_mode() const { return mode; }

  std::string name;
  PointwiseMode_t mode = PointwiseMode_t::NOT_SET;
  DataType_t compute = DataType_t::NOT_SET;
  std::optional<float> reluLower, reluUpper;
};
class Conv_dgrad_attributes : public ConvOptions<Conv_dgrad_attributes> {};
class Conv_wgrad_attributes : public ConvOptions<Conv_wgrad_attributes> {};

class Graph {
public:
  Graph &set_io_data_type(DataType_t t) { io = t; return *this; }
  Graph &set_intermediate_data_type(DataType_t t) { intermediate = t; return *this; }
  Graph &set_compute_data_type(DataType_t t) { compute = t; return *this; }
  Tensor tensor(const Tensor_attributes &a) {
    auto t = std::make_shared<Tensor_attributes>(a);
    if (t->type == DataType_t::NOT_SET) t->type = io;
    given.push_back(t);
    return t;
  }
  std::array<Tensor, 2> sdpa(Tensor q, Tensor k, Tensor v, SDPA_attributes a) {
    backward = false;
    fwd = std::move(a);
    Q = q, K = k, V = v;
    O = std::make_shared<Tensor_attributes>();
    Stats = std::make_shared<Tensor_attributes>();
    return {O, Stats};
  }
  std::array<Tensor, 3> sdpa_backward(Tensor q, Tensor k, Tensor v, Tensor o, Tensor dO_, Tensor stats,
                                      SDPA_backward_attributes a) {
    backward = true;
    bwd = std::move(a);
    Q = q, K = k, V = v, O = o, dO = dO_, Stats = stats;
    dQ = std::make_shared<Tensor_attributes>();
    dK = std::make_shared<Tensor_attributes>();
    dV = std::make_shared<Tensor_attributes>();
    return {dQ, dK, dV};
  }

  /// y = conv(x, w); dx from dy and w; dw from dy and x. The caller sets
  /// the result's uid, dims, strides and type.
  Tensor conv_fprop(Tensor x, Tensor w, Conv_fprop_attributes a) {
    conv = Conv::Forward, convOptions = std::move(a), X = x, W = w;
    return Y = std::make_shared<Tensor_attributes>();
  }
  Tensor conv_dgrad(Tensor dy, Tensor w, Conv_dgrad_attributes a) {
    conv = Conv::InputGrad, convOptions = std::move(a), Y = dy, W = w;
    return X = std::make_shared<Tensor_attributes>();
  }
  Tensor conv_wgrad(Tensor dy, Tensor x, Conv_wgrad_attributes a) {
    conv = Conv::WeightGrad, convOptions = std::move(a), Y = dy, X = x;
    return W = std::make_shared<Tensor_attributes>();
  }
  /// out = a (op) b, b broadcast along its axes of size 1; out = op(a)
  /// (RELU_FWD). The caller sets out's uid, dims, strides and type (or
  /// leaves them to be inferred).
  Tensor pointwise(Tensor a, Tensor b, Pointwise_attributes attributes) {
    nodes.push_back({std::move(attributes), a, b, std::make_shared<Tensor_attributes>()});
    return nodes.back().out;
  }
  Tensor pointwise(Tensor a, Pointwise_attributes attributes) { return pointwise(a, nullptr, std::move(attributes)); }
  /// Engines with these notes are left out (pipec: NONDETERMINISTIC, for
  /// equal bits on equal runs); the fake's one engine has none of them.
  Graph &deselect_numeric_notes(std::vector<NumericalNote_t> notes) {
    deselected = std::move(notes);
    return *this;
  }

  error_t validate() {
    auto bad = [](const std::string &m) { return error_t(error_code_t::INVALID_VALUE, "emulated cuDNN: " + m); };
    if (conv != Conv::None) return validateConv();
    if (!nodes.empty()) return bad("the fake emulates pointwise nodes only after conv_fprop");
    if (!Q || io != DataType_t::BFLOAT16 && io != DataType_t::HALF) return bad("no attention, or an io type cuDNN's flash attention does not take");
    if (intermediate != DataType_t::FLOAT || compute != DataType_t::FLOAT) return bad("intermediate and compute types must be FLOAT");
    for (const Tensor &t : all()) {
      if (!t) continue;
      if (!t->uidSet) return bad("tensor '" + t->name + "' has no uid");
      if (t->dims.size() != 4 || t->strides.size() != 4) return bad("tensor '" + t->name + "' is not 4-d");
      for (int i = 0; i < 4; ++i)
        if (t->dims[i] < 1 || t->strides[i] < 0) return bad("tensor '" + t->name + "' has a bad dim or stride");
      if (t->dims[3] > 1 && t->strides[3] != 1) return bad("tensor '" + t->name + "' has a non-contiguous last axis");
      if (overlaps(*t)) return bad("tensor '" + t->name + "' has strides that put two elements at one address");
    }
    b = Q->dims[0], h = Q->dims[1], S = Q->dims[2], D = Q->dims[3];
    hk = K->dims[1], T = K->dims[2], Dv = V->dims[3];
    if (K->dims[0] != b || K->dims[3] != D || V->dims[0] != b || V->dims[1] != hk || V->dims[2] != T || h % hk != 0)
      return bad("Q, K and V disagree");
    const Options &opt = options();
    if (!opt.scaleSet) return bad("attn_scale not set");
    if (opt.bias) {
      const auto &d = opt.bias->dims;
      if ((d[0] != 1 && d[0] != b) || (d[1] != 1 && d[1] != h) || d[2] != S || d[3] != T || opt.bias->type != io)
        return bad("the bias is not [1|b, 1|h, S, T] of the io type");
    }
    if (opt.dropout < 0 || opt.dropout >= 1) return bad("dropout probability out of [0, 1)");
    if (opt.dropout > 0)
      for (const Tensor &t : {opt.seed, opt.offset})
        if (!t || t->type != DataType_t::INT64 || t->dims != std::vector<int64_t>{1, 1, 1, 1})
          return bad("dropout seed and offset must be INT64 [1, 1, 1, 1]");
    auto expect = [&](const Tensor &t, std::vector<int64_t> dims, DataType_t type, bool output) {
      return t && t->dims == dims && t->type == type && t->output == output;
    };
    const DataType_t F = DataType_t::FLOAT;
    if (!expect(O, {b, h, S, Dv}, io, !backward) || !expect(Stats, {b, h, S, 1}, F, !backward))
      return bad("O or Stats is not [b, h, S, Dv] / FLOAT [b, h, S, 1]");
    if (!fwd.stats && !backward) return bad("training needs generate_stats");
    if (backward && (!expect(dO, {b, h, S, Dv}, io, false) || !expect(dQ, Q->dims, io, true) ||
                     !expect(dK, K->dims, io, true) || !expect(dV, V->dims, io, true)))
      return bad("dO, dQ, dK or dV does not match its operand");
    validated = true;
    return {};
  }
  error_t build_operation_graph(cudnnHandle_t) { return ready(validated, "validate"); }
  error_t create_execution_plans(std::vector<HeurMode_t>) { return ready(validated, "build_operation_graph"); }
  // cuDNN's flash attention: head sizes multiples of 8 up to 256.
  error_t check_support(cudnnHandle_t) {
    if (!validated) return ready(false, "create_execution_plans");
    if (conv == Conv::None && (D % 8 != 0 || Dv % 8 != 0 || D > 256 || Dv > 256))
      return error_t(error_code_t::GRAPH_NOT_SUPPORTED, "emulated cuDNN: no engine for head sizes " +
                                                            std::to_string(D) + "/" + std::to_string(Dv));
    if (conv != Conv::None && !nodes.empty() && emu::refuseConvPointwise)
      return error_t(error_code_t::GRAPH_NOT_SUPPORTED, "emulated cuDNN: no engine for conv_fprop + pointwise");
    supported = true;
    return {};
  }
  error_t build_plans(cudnnHandle_t) {
    if (!supported) return ready(false, "check_support");
    ++emu::cudnnPlans;
    return {};
  }
  /// The attention's backward accumulates dQ in float32 in the workspace,
  /// a convolution's weight gradient dW.
  int64_t get_workspace_size() const {
    if (conv != Conv::None) return conv == Conv::WeightGrad ? elements(*W) * (int64_t)sizeof(float) : 0;
    return backward ? b * h * S * D * (int64_t)sizeof(float) : 0;
  }

  error_t execute(cudnnHandle_t handle, std::unordered_map<int64_t, void *> &pack, void *workspace) const {
    emu::checkStream(handle->stream);
    if (!supported) emu::die("cuDNN: execute before build_plans");
    std::unordered_map<int64_t, void *> bound;
    for (const Tensor &t : all()) {
      if (!t) continue;
      auto found = pack.find(t->uid);
      if (found == pack.end() || !found->second)
        return error_t(error_code_t::INVALID_VARIANT_PACK, "emulated cuDNN: no pointer for '" + t->name + "'");
      const bool scalar = t->dims == std::vector<int64_t>{1, 1, 1, 1}; // the dropout seed and offset
      if (reinterpret_cast<uintptr_t>(found->second) % (scalar ? 8 : 16) != 0)
        emu::die("cuDNN: a tensor is not 16-byte aligned (a scalar not 8-byte)");
      bound[t->uid] = found->second;
    }
    if (get_workspace_size() > 0 && !workspace) emu::die("cuDNN: no workspace for a graph that needs one");
    if (conv != Conv::None) {
      const Tensor &y = result();
      emu::ConvTensors seen{{X->dims, W->dims, y->dims}, {X->strides, W->strides, y->strides}};
      for (const Node &node : nodes) {
        if (node.options.mode == PointwiseMode_t::RELU_FWD) {
          seen.relu = true;
          seen.reluLower = node.options.reluLower.value_or(0.0f);
          seen.reluUpper = node.options.reluUpper.value_or(std::numeric_limits<float>::max());
        } else if (node.in1->dims == Y->dims) {
          seen.residual = true;
          seen.residualStrides = node.in1->strides;
        } else {
          seen.bias = true;
        }
      }
      emu::lastConvTensors = seen;
    }
    const Graph copy = *this;
    if (emu::recorded(handle->stream, [copy, bound, workspace] {
          ++emu::graphWork; // run by a graph launch
          copy.run(bound, workspace);
        }))
      return {};
    run(bound, workspace);
    return {};
  }

private:
  using Options = AttentionFields;
  const Options &options() const { return backward ? static_cast<const Options &>(bwd) : fwd; }
  std::vector<Tensor> all() const {
    if (conv != Conv::None) {
      std::vector<Tensor> tensors{X, W, nodes.empty() ? Y : result()};
      for (const Node &node : nodes)
        if (node.in1) tensors.push_back(node.in1);
      return tensors;
    }
    const Options &o = options();
    return {Q, K, V, O, Stats, dO, dQ, dK, dV, o.bias, o.dropout > 0 ? o.seed : nullptr,
            o.dropout > 0 ? o.offset : nullptr};
  }
  /// Whether two elements of t share an address: its axes (those longer
  /// than 1) ordered by stride, each must step past the whole extent of
  /// the ones inside it.
  static bool overlaps(const Tensor_attributes &t) {
    std::vector<int> axes;
    for (int i = 0; i < (int)t.dims.size(); ++i)
      if (t.dims[i] > 1) axes.push_back(i);
    std::sort(axes.begin(), axes.end(), [&](int x, int y) { return t.strides[x] < t.strides[y]; });
    int64_t extent = 1; // elements spanned by the inner axes so far
    for (int axis : axes) {
      if (t.strides[axis] < extent) return true;
      extent = t.strides[axis] * t.dims[axis];
    }
    return false;
  }
  static error_t ready(bool ok, const char *step) {
    return ok ? error_t() : error_t(error_code_t::INVALID_VALUE, std::string("emulated cuDNN: call ") + step + " first");
  }
  static int64_t at(const Tensor &t, int64_t i0, int64_t i1, int64_t i2, int64_t i3) {
    return i0 * t->strides[0] + i1 * t->strides[1] + i2 * t->strides[2] + i3 * t->strides[3];
  }
  static cudaDataType cudaTypeOf(DataType_t t) { return t == DataType_t::FLOAT ? CUDA_R_32F : CUDA_R_16BF; }
  static float get(const std::unordered_map<int64_t, void *> &p, const Tensor &t, int64_t i0, int64_t i1, int64_t i2,
                   int64_t i3) {
    return emu::load(p.at(t->uid), cudaTypeOf(t->type), at(t, i0, i1, i2, i3));
  }
  static void put(const std::unordered_map<int64_t, void *> &p, const Tensor &t, int64_t i0, int64_t i1, int64_t i2,
                  int64_t i3, float v) {
    emu::store(p.at(t->uid), cudaTypeOf(t->type), at(t, i0, i1, i2, i3), v);
  }
  static float bf16Rounded(float v) { return (float)__nv_bfloat16(v); }

  void run(const std::unordered_map<int64_t, void *> &p, void *workspace) const {
    ++emu::cudnnExecutes;
    if (emu::countOnly) return;
    if (conv != Conv::None) return runConv(p, workspace);
    const Options &opt = options();
    const bool drop = opt.dropout > 0;
    uint64_t key = 0, threshold = 0;
    double keepScale = 1.0;
    if (drop) {
      key = pipec::kernels::dropoutOpStreamKey(*static_cast<const uint64_t *>(p.at(opt.seed->uid)),
                                               *static_cast<const uint64_t *>(p.at(opt.offset->uid)));
      threshold = pipec::kernels::dropoutKeepThreshold(opt.dropout);
      keepScale = 1.0 / (1.0 - (double)opt.dropout);
    }
    const int64_t group = h / hk;
    float *dqAccumulator = static_cast<float *>(workspace);
    if (backward) std::fill(dqAccumulator, dqAccumulator + b * h * S * D, 0.0f);
    // dK, dV: summed in double over every query row of the heads that share them.
    std::vector<double> dk(backward ? b * hk * T * D : 0), dv(backward ? b * hk * T * Dv : 0);
    std::vector<float> z(T);
    for (int64_t bb = 0; bb < b; ++bb)
      for (int64_t hh = 0; hh < h; ++hh)
        for (int64_t i = 0; i < S; ++i) {
          const int64_t kh = hh / group;
          float m = -INFINITY;
          for (int64_t j = 0; j < T; ++j) {
            double s = 0;
            for (int64_t d = 0; d < D; ++d) s += (double)get(p, Q, bb, hh, i, d) * get(p, K, bb, kh, j, d);
            z[j] = (float)s * opt.scale;
            if (opt.causal && j > i) {
              z[j] = -INFINITY;
              continue;
            }
            if (opt.bias)
              z[j] += get(p, opt.bias, opt.bias->dims[0] == 1 ? 0 : bb, opt.bias->dims[1] == 1 ? 0 : hh, i, j);
            m = std::max(m, z[j]);
          }
          // P_j = exp(z_j - lse): the forward computes lse, the backward reads it.
          float lse;
          if (!backward) {
            double sum = 0;
            for (int64_t j = 0; j < T; ++j) sum += std::exp(z[j] - m);
            lse = (float)(m + std::log(sum));
            put(p, Stats, bb, hh, i, 0, lse);
          } else {
            lse = get(p, Stats, bb, hh, i, 0);
          }
          auto kept = [&](int64_t j) {
            return !drop || pipec::kernels::dropoutDraw(key, ((bb * h + hh) * S + i) * T + j) >= threshold;
          };
          auto dropped = [&](float prob, int64_t j) { return kept(j) ? (float)(prob * keepScale) : 0.0f; };
          if (!backward) {
            std::vector<double> o(Dv, 0.0);
            for (int64_t j = 0; j < T; ++j) {
              const float pj = bf16Rounded(dropped(std::exp(z[j] - lse), j));
              for (int64_t d = 0; d < Dv; ++d) o[d] += (double)pj * get(p, V, bb, kh, j, d);
            }
            for (int64_t d = 0; d < Dv; ++d) put(p, O, bb, hh, i, d, (float)o[d]);
            continue;
          }
          double rowDot = 0; // Σ dO ⊙ O
          for (int64_t d = 0; d < Dv; ++d) rowDot += (double)get(p, dO, bb, hh, i, d) * get(p, O, bb, hh, i, d);
          for (int64_t j = 0; j < T; ++j) {
            const float pj = std::exp(z[j] - lse);
            double dpj = 0;
            for (int64_t d = 0; d < Dv; ++d) dpj += (double)get(p, dO, bb, hh, i, d) * get(p, V, bb, kh, j, d);
            const float ds = bf16Rounded(pj * (dropped((float)dpj, j) - (float)rowDot)) * opt.scale;
            const float pDropped = bf16Rounded(dropped(pj, j));
            for (int64_t d = 0; d < Dv; ++d)
              dv[((bb * hk + kh) * T + j) * Dv + d] += (double)pDropped * get(p, dO, bb, hh, i, d);
            for (int64_t d = 0; d < D; ++d) {
              dqAccumulator[((bb * h + hh) * S + i) * D + d] += ds * get(p, K, bb, kh, j, d);
              dk[((bb * hk + kh) * T + j) * D + d] += (double)ds * get(p, Q, bb, hh, i, d);
            }
          }
          for (int64_t d = 0; d < D; ++d) put(p, dQ, bb, hh, i, d, dqAccumulator[((bb * h + hh) * S + i) * D + d]);
        }
    if (!backward) return;
    for (int64_t bb = 0; bb < b; ++bb)
      for (int64_t kh = 0; kh < hk; ++kh)
        for (int64_t j = 0; j < T; ++j) {
          for (int64_t d = 0; d < D; ++d) put(p, dK, bb, kh, j, d, (float)dk[((bb * hk + kh) * T + j) * D + d]);
          for (int64_t d = 0; d < Dv; ++d) put(p, dV, bb, kh, j, d, (float)dv[((bb * hk + kh) * T + j) * Dv + d]);
        }
  }

  static int64_t elements(const Tensor_attributes &t) {
    int64_t n = 1;
    for (int64_t d : t.dims) n *= d;
    return n;
  }

  /// A convolution's checks: FLOAT or BFLOAT16 tensors (all of the io type, FLOAT
  /// compute: cuDNN's float and bf16 configurations) of rank 4 or 5 (2 or 3 spatial
  /// axes) with uids and strides that put no two elements at one address,
  /// x [N, C, d...], w [K, C/G, k...] with G dividing K, y [N, K, o...] with
  /// o = (d + pre + post - dilation·(k - 1) - 1) / stride + 1, the result
  /// alone an output, one pad, stride and dilation per spatial axis. With
  /// pointwise nodes (validateEpilogue), the graph's result is the last
  /// one's output and the convolution's y is virtual (dims inferred where
  /// not set).
  error_t validateConv() {
    auto bad = [](const std::string &m) {
      return error_t(error_code_t::INVALID_VALUE, "emulated cuDNN convolution: " + m);
    };
    if ((io != DataType_t::FLOAT && io != DataType_t::BFLOAT16) || compute != DataType_t::FLOAT ||
        convOptions.compute != DataType_t::FLOAT)
      return bad("the fake emulates FLOAT or BFLOAT16 tensors with FLOAT compute only");
    if (!nodes.empty() && conv != Conv::Forward) return bad("the fake emulates pointwise nodes after conv_fprop only");
    const Tensor out = result();
    if (!nodes.empty() && out && out->output && out->type == DataType_t::NOT_SET) out->type = io;
    for (const Tensor &t : {X, W, out}) {
      if (!t || !t->uidSet) return bad("a tensor has no uid");
      const size_t n = t->dims.size();
      if (n < 4 || n > 5 || t->strides.size() != n) return bad("tensor '" + t->name + "' is not 4-d or 5-d");
      for (size_t i = 0; i < n; ++i)
        if (t->dims[i] < 1 || t->strides[i] < 0) return bad("tensor '" + t->name + "' has a bad dim or stride");
      if (overlaps(*t)) return bad("tensor '" + t->name + "' has strides that put two elements at one address");
      // cuDNN's FLOAT and bf16 configurations: every tensor in the io type.
      if (t->type != io) return bad("tensor '" + t->name + "' is not of the graph's io type");
      if (t->output != (t == out)) return bad("the result, and only it, must be an output");
    }
    const size_t rank = X->dims.size(), sp = rank - 2;
    const ConvFields &o = convOptions;
    if (o.pre.size() != sp || o.post.size() != sp || o.stride.size() != sp || o.dilation.size() != sp)
      return bad("pads, strides and dilations need one entry per spatial axis");
    for (size_t a = 0; a < sp; ++a)
      if (o.stride[a] < 1 || o.dilation[a] < 1 || o.pre[a] < 0 || o.post[a] < 0)
        return bad("strides and dilations must be positive and pads non-negative");
    auto spanOf = [&](size_t a) {
      return X->dims[2 + a] + o.pre[a] + o.post[a] - o.dilation[a] * (W->dims[2 + a] - 1) - 1;
    };
    if (W->dims.size() != rank) return bad("x and w differ in rank");
    if (!nodes.empty() && Y->dims.empty()) { // conv_fprop's inference of a virtual y
      Y->dims = {X->dims[0], W->dims[0]};
      for (size_t a = 0; a < sp; ++a) Y->dims.push_back(spanOf(a) < 0 ? 0 : spanOf(a) / o.stride[a] + 1);
    }
    if (Y->dims.size() != rank) return bad("x, w and y differ in rank");
    const int64_t C = X->dims[1], K = W->dims[0], Cg = W->dims[1];
    if (C % Cg != 0 || K % (C / Cg) != 0) return bad("the channels of x and w give no group count");
    if (Y->dims[0] != X->dims[0] || Y->dims[1] != K) return bad("y is not [N, K, ...]");
    for (size_t a = 0; a < sp; ++a)
      if (spanOf(a) < 0 || spanOf(a) / o.stride[a] + 1 != Y->dims[2 + a]) return bad("y's spatial sizes do not follow");
    if (!nodes.empty()) {
      const error_t epilogue = validateEpilogue();
      if (epilogue.is_bad()) return epilogue;
    }
    validated = true;
    return {};
  }

  /// The epilogue after conv_fprop: a chain of pointwise nodes of FLOAT
  /// compute, each reading the previous one's result (the first: the
  /// convolution's y), ADDs first (at most two: a bias, a residual), each of
  /// the previous result and a tensor given to the graph (FLOAT or the io
  /// type, its dims y's or 1, broadcast along the 1s), then at most one
  /// RELU_FWD (its lower clip at most its upper one). Every result but the
  /// last is virtual and FLOAT (the intermediate type) with y's dims; the
  /// last is the graph's output, y's dims, of its own uid (validateConv
  /// checks its type and strides).
  error_t validateEpilogue() {
    auto bad = [](const std::string &m) {
      return error_t(error_code_t::INVALID_VALUE, "emulated cuDNN pointwise: " + m);
    };
    const size_t rank = Y->dims.size();
    if (Y->strides.empty()) Y->strides = rowMajor(Y->dims); // virtual: immaterial
    std::vector<int64_t> uids{X->uid, W->uid};
    Tensor previous = Y;
    int adds = 0;
    bool relu = false;
    for (const Node &node : nodes) {
      const Pointwise_attributes &pw = node.options;
      if ((pw.compute == DataType_t::NOT_SET ? compute : pw.compute) != DataType_t::FLOAT)
        return bad("the fake emulates FLOAT compute only");
      if (node.in0 != previous)
        return bad("the fake emulates a chain: each node reads the previous node's result (the first, y)");
      if (previous->output) return bad("the fake emulates virtual results between the convolution and the output");
      if (previous->type == DataType_t::NOT_SET) previous->type = intermediate;
      if (previous->type != DataType_t::FLOAT) return bad("a virtual result must be FLOAT (the intermediate type)");
      if (previous->dims.empty()) previous->dims = Y->dims;
      if (previous->strides.empty()) previous->strides = Y->strides;
      if (previous->dims != Y->dims || previous->strides.size() != rank) return bad("a virtual result is not y's shape");
      if (pw.mode == PointwiseMode_t::ADD) {
        if (relu) return bad("the fake emulates the ADDs before the RELU_FWD");
        if (++adds > 2) return bad("the fake emulates at most two ADDs (a bias, a residual)");
        if (!node.in1 || std::find(given.begin(), given.end(), node.in1) == given.end())
          return bad("the fake emulates an ADD of the previous result and a tensor given to the graph");
        const Tensor_attributes &b = *node.in1;
        if (!b.uidSet) return bad("tensor '" + b.name + "' has no uid");
        if (b.dims.size() != rank || b.strides.size() != rank) return bad("tensor '" + b.name + "' is not of y's rank");
        for (size_t i = 0; i < rank; ++i)
          if ((b.dims[i] != 1 && b.dims[i] != Y->dims[i]) || b.strides[i] < 0)
            return bad("tensor '" + b.name + "' has dims neither y's nor 1, or a negative stride");
        if (overlaps(b)) return bad("tensor '" + b.name + "' has strides that put two elements at one address");
        if (b.type != DataType_t::FLOAT && b.type != io)
          return bad("tensor '" + b.name + "' is neither FLOAT nor of the io type");
        uids.push_back(b.uid);
      } else if (pw.mode == PointwiseMode_t::RELU_FWD) {
        if (relu) return bad("the fake emulates one RELU_FWD");
        if (node.in1) return bad("RELU_FWD takes one input");
        relu = true;
        if (!(pw.reluLower.value_or(0.0f) <= pw.reluUpper.value_or(std::numeric_limits<float>::max())))
          return bad("the RELU_FWD's lower clip is above its upper clip");
      } else {
        return bad("the fake emulates ADD and RELU_FWD only");
      }
      previous = node.out;
    }
    if (previous->dims.empty()) previous->dims = Y->dims;
    if (previous->strides.empty()) previous->strides = Y->strides;
    if (previous->dims != Y->dims) return bad("the output's dims are not y's");
    uids.push_back(previous->uid);
    std::sort(uids.begin(), uids.end());
    if (std::adjacent_find(uids.begin(), uids.end()) != uids.end()) return bad("two tensors share a uid");
    return {};
  }
  static std::vector<int64_t> rowMajor(const std::vector<int64_t> &dims) {
    std::vector<int64_t> strides(dims.size(), 1);
    for (int i = (int)dims.size() - 2; i >= 0; --i) strides[i] = strides[i + 1] * dims[i + 1];
    return strides;
  }

  /// The element of t at index idx, through its strides.
  static int64_t offsetOf(const Tensor &t, const std::vector<int64_t> &idx) {
    int64_t off = 0;
    for (size_t i = 0; i < idx.size(); ++i) off += idx[i] * t->strides[i];
    return off;
  }
  /// Every index of dims (row-major order), f(index).
  template <class F> static void forEachIndex(const std::vector<int64_t> &dims, F f) {
    std::vector<int64_t> idx(dims.size(), 0);
    int64_t n = 1;
    for (int64_t d : dims) n *= d;
    for (int64_t e = 0; e < n; ++e) {
      f(idx);
      for (int i = (int)dims.size() - 1; i >= 0 && ++idx[i] == dims[i]; --i) idx[i] = 0;
    }
  }

  /// The host reference, products summed in double: y[n, k, o] =
  /// Σ_{c of k's group, r} x[n, c, o·s − pre + r·dilation] w[k, c mod Cg, r],
  /// and its adjoints for dx and dw (dw accumulated in the workspace).
  void runConv(const std::unordered_map<int64_t, void *> &p, void *workspace) const {
    const size_t sp = X->dims.size() - 2;
    const int64_t N = X->dims[0], C = X->dims[1], K = W->dims[0], Cg = W->dims[1], Kg = K / (C / Cg);
    const std::vector<int64_t> spatialOut(Y->dims.begin() + 2, Y->dims.end()),
        spatialIn(X->dims.begin() + 2, X->dims.end()), spatialK(W->dims.begin() + 2, W->dims.end());
    const ConvFields &o = convOptions;
    auto value = [&](const Tensor &t, const std::vector<int64_t> &idx) {
      return (double)emu::load(p.at(t->uid), cudaTypeOf(t->type), offsetOf(t, idx));
    };
    auto write = [&](const Tensor &t, const std::vector<int64_t> &idx, double v) { // bf16: rounded once
      emu::store(p.at(t->uid), cudaTypeOf(t->type), offsetOf(t, idx), (float)v);
    };
    // The input position of output position out and kernel position r, or false outside x.
    auto inputAt = [&](const std::vector<int64_t> &out, const std::vector<int64_t> &r, std::vector<int64_t> &in) {
      for (size_t a = 0; a < sp; ++a) {
        in[a] = out[a] * o.stride[a] - o.pre[a] + r[a] * o.dilation[a];
        if (in[a] < 0 || in[a] >= spatialIn[a]) return false;
      }
      return true;
    };
    std::vector<int64_t> in(sp);
    auto full = [](int64_t a, int64_t b, const std::vector<int64_t> &rest) {
      std::vector<int64_t> idx{a, b};
      idx.insert(idx.end(), rest.begin(), rest.end());
      return idx;
    };
    if (conv == Conv::Forward) {
      // With an epilogue: y held in float (the FLOAT intermediates and
      // compute), each node applied in turn, the output rounded once.
      auto operandAt = [&](const Tensor &t, std::vector<int64_t> idx) {
        for (size_t i = 0; i < idx.size(); ++i)
          if (t->dims[i] == 1) idx[i] = 0;
        return (float)value(t, idx);
      };
      auto epilogue = [&](float v, const std::vector<int64_t> &idx) {
        for (const Node &node : nodes) {
          if (node.options.mode == PointwiseMode_t::ADD) {
            v = v + operandAt(node.in1, idx);
            continue;
          }
          const float lower = node.options.reluLower.value_or(0.0f),
                      upper = node.options.reluUpper.value_or(std::numeric_limits<float>::max());
          if (!std::isnan(v)) v = v < lower ? lower : v > upper ? upper : v; // NaN propagated
        }
        return v;
      };
      for (int64_t n = 0; n < N; ++n)
        for (int64_t k = 0; k < K; ++k)
          forEachIndex(spatialOut, [&](const std::vector<int64_t> &out) {
            double sum = 0;
            for (int64_t cc = 0; cc < Cg; ++cc)
              forEachIndex(spatialK, [&](const std::vector<int64_t> &r) {
                if (inputAt(out, r, in)) sum += value(X, full(n, k / Kg * Cg + cc, in)) * value(W, full(k, cc, r));
              });
            if (nodes.empty())
              write(Y, full(n, k, out), sum);
            else
              write(nodes.back().out, full(n, k, out), epilogue((float)sum, full(n, k, out)));
          });
      return;
    }
    if (conv == Conv::InputGrad) {
      std::vector<double> dx((size_t)(elements(*X) / (N * C)), 0.0); // one (n, c) plane
      for (int64_t n = 0; n < N; ++n)
        for (int64_t c = 0; c < C; ++c) {
          std::fill(dx.begin(), dx.end(), 0.0);
          const int64_t g = c / Cg, cc = c % Cg;
          for (int64_t k = g * Kg; k < (g + 1) * Kg; ++k)
            forEachIndex(spatialOut, [&](const std::vector<int64_t> &out) {
              const double dy = value(Y, full(n, k, out));
              forEachIndex(spatialK, [&](const std::vector<int64_t> &r) {
                if (!inputAt(out, r, in)) return;
                int64_t flat = 0;
                for (size_t a = 0; a < sp; ++a) flat = flat * spatialIn[a] + in[a];
                dx[(size_t)flat] += dy * value(W, full(k, cc, r));
              });
            });
          int64_t flat = 0;
          forEachIndex(spatialIn, [&](const std::vector<int64_t> &i) { write(X, full(n, c, i), dx[(size_t)flat++]); });
        }
      return;
    }
    float *accumulator = static_cast<float *>(workspace); // dW, then copied through W's strides
    int64_t flat = 0;
    for (int64_t k = 0; k < K; ++k)
      for (int64_t cc = 0; cc < Cg; ++cc)
        forEachIndex(spatialK, [&](const std::vector<int64_t> &r) {
          double sum = 0;
          for (int64_t n = 0; n < N; ++n)
            forEachIndex(spatialOut, [&](const std::vector<int64_t> &out) {
              if (inputAt(out, r, in)) sum += value(Y, full(n, k, out)) * value(X, full(n, k / Kg * Cg + cc, in));
            });
          accumulator[flat++] = (float)sum;
        });
    flat = 0;
    for (int64_t k = 0; k < K; ++k)
      for (int64_t cc = 0; cc < Cg; ++cc)
        forEachIndex(spatialK, [&](const std::vector<int64_t> &r) { write(W, full(k, cc, r), accumulator[flat++]); });
  }

  enum class Conv { None, Forward, InputGrad, WeightGrad };
  Conv conv = Conv::None;
  ConvFields convOptions;
  Tensor X, W, Y;
  // The pointwise nodes after conv_fprop, in order: out = in0 (op) in1
  // (RELU_FWD: in1 null).
  struct Node {
    Pointwise_attributes options;
    Tensor in0, in1, out;
  };
  std::vector<Node> nodes;
  /// The graph's result: the forward's y (the last pointwise node's
  /// output where there is one), dx or dw.
  Tensor result() const {
    if (conv == Conv::Forward) return nodes.empty() ? Y : nodes.back().out;
    return conv == Conv::InputGrad ? X : W;
  }
  std::vector<Tensor> given; // the tensors given to the graph (tensor())
  std::vector<NumericalNote_t> deselected;

  DataType_t io = DataType_t::NOT_SET, intermediate = DataType_t::NOT_SET, compute = DataType_t::NOT_SET;
  bool backward = false, validated = false, supported = false;
  SDPA_attributes fwd;
  SDPA_backward_attributes bwd;
  Tensor Q, K, V, O, Stats, dO, dQ, dK, dV;
  int64_t b = 0, h = 0, hk = 0, S = 0, T = 0, D = 0, Dv = 0;
};
} // namespace graph
} // namespace cudnn_frontend
