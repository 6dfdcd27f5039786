// nn.conv, nn.conv_input_grad and nn.conv_weight_grad through cuDNN's
// convolution graphs (conv_cudnn.cu; docs/cuda-kernels.md, "Convolutions
// (cuDNN)"). conv.cu's entry points try these first and run pipec's
// im2col + GEMM kernels when they decline a call.
#ifndef PIPEC_CUDA_KERNELS_CONV_CUDNN_CUH
#define PIPEC_CUDA_KERNELS_CONV_CUDNN_CUH

#include "pipec/cuda_kernels.h"
#include "pipec/kernel_types.h"

namespace pipec::kernels::cuda::dnn {

/// y = conv(x, w) (no bias) for the geometry `g` through cuDNN, and true;
/// or false, having done nothing, where cuDNN does not take the call: the
/// library was built without cuDNN, PIPEC_CUDNN_CONV=0 is set, the stream's
/// precision is F32 (which must equal the CPU kernels), an operand is not
/// 16-byte aligned, or cuDNN has no deterministic engine for the shape
/// (reported once per shape on stderr).
bool conv(const float *x, const float *w, float *y, const ConvGeom &g, const Workspace &workspace);
/// dx from dy and w; the same contract.
bool convInputGrad(const float *dy, const float *w, float *dx, const ConvGeom &g, const Workspace &workspace);
/// dw from dy and x, every sample in one call; the same contract.
bool convWeightGrad(const float *dy, const float *x, float *dw, const ConvGeom &g, const Workspace &workspace);

} // namespace pipec::kernels::cuda::dnn

#endif // PIPEC_CUDA_KERNELS_CONV_CUDNN_CUH
