// nn.conv, nn.conv_input_grad and nn.conv_weight_grad through cuDNN's
// convolution graphs (conv_cudnn.cu; docs/cuda-kernels.md, "Convolutions
// (cuDNN)"). conv.cu's entry points try these first and run pipec's
// im2col + GEMM kernels when they decline a call.
#ifndef PIPEC_CUDA_KERNELS_CONV_CUDNN_CUH
#define PIPEC_CUDA_KERNELS_CONV_CUDNN_CUH

#include "pipec/cuda_kernels.h"
#include "pipec/kernel_types.h"

namespace pipec::kernels::cuda::dnn {

/// What a forward applies after the convolution, in this order: y =
/// f(conv + bias + residual) in float, y rounded once. bias: float [F] or
/// null; residual: y's shape, layout and type, or null; f: activation.
template <class T> struct ConvEpilogue {
  const float *bias = nullptr;
  const T *residual = nullptr;
  EpilogueActivation activation = EpilogueActivation::None;
  /// Whether nothing is left to apply.
  bool empty() const { return !bias && !residual && activation == EpilogueActivation::None; }
};

/// y = conv(x, w) for the geometry `g` through cuDNN, and true; or false,
/// having done nothing, where cuDNN does not take the call: the library
/// was built without cuDNN, PIPEC_CUDNN_CONV=0 is set, the storage is
/// float and the stream's precision F32 (which must equal the CPU
/// kernels), an operand is not 16-byte aligned, or cuDNN has no
/// deterministic engine for the shape (reported once per shape on stderr).
/// T is float or bf16 (every tensor of the call in it). channelsLast: x,
/// y are [N, d..., C] and w [F, k..., C/G] in memory (g stays the logical
/// geometry), described to cuDNN by their strides. epilogue: its leading
/// parts (bias, residual, activation, the absent ones skipped) up to the
/// first that is not 16-byte aligned run in the same graph (conv_fprop,
/// then pointwise ADDs and RELU_FWD on FLOAT intermediates) where cuDNN has
/// a deterministic engine for that, and are then cleared (activation:
/// None); what is left is for the caller to apply after the call.
template <class T>
bool conv(const T *x, const T *w, ConvEpilogue<T> &epilogue, T *y, const ConvGeom &g, const Workspace &workspace,
          bool channelsLast);
/// dx from dy and w; the same contract.
template <class T>
bool convInputGrad(const T *dy, const T *w, T *dx, const ConvGeom &g, const Workspace &workspace,
                   bool channelsLast);
/// dw from dy and x, every sample in one call; the same contract.
template <class T>
bool convWeightGrad(const T *dy, const T *x, T *dw, const ConvGeom &g, const Workspace &workspace,
                    bool channelsLast);

} // namespace pipec::kernels::cuda::dnn

#endif // PIPEC_CUDA_KERNELS_CONV_CUDNN_CUH
