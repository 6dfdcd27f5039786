// nn.attention and nn.attention_grad on bf16 storage through cuDNN's flash
// attention (attention_cudnn.cu; docs/cuda-kernels.md, "Flash attention").
// softmax.cu's bf16 entry points try this first and run pipec's own
// attention kernels when it declines a call.
#ifndef PIPEC_CUDA_KERNELS_FLASH_ATTENTION_CUH
#define PIPEC_CUDA_KERNELS_FLASH_ATTENTION_CUH

#include "pipec/cuda_kernels.h"

namespace pipec::kernels::cuda::flash {

/// One attention's operands, as the kernel API takes them (kernel_api.inc);
/// `layout` says where q, k, v, y and the gradients hold their heads (cuDNN
/// is given their strides, so neither layout is copied).
struct AttentionOperands {
  const bf16 *q, *k, *v;
  const Shape &qs, &ks, &vs;
  const uint8_t *mask;
  const float *additive;
  const Shape &ms;
  float scale;
  bool divide;
  float fill;
  bool maskedWhen;
  float dropoutRatio;
  bool training;
  StreamKey dropoutStreamKey;
  const Workspace &workspace;
  AttentionLayout layout;
  int64_t jointHeads; // AttentionView::jointHeads
};

/// Runs the forward (y, lse) through cuDNN and returns true; or returns
/// false, having done nothing, when cuDNN does not take the call: the
/// library was built without cuDNN, PIPEC_CUDNN_ATTENTION=0 is set, or
/// cuDNN has no engine for this shape (reported once per shape on stderr).
bool attention(const AttentionOperands &a, bf16 *y, float *lse);
/// The backward (dq, dk, dv) from dy, the forward's y and lse; the same
/// contract. The forward's y and lse must come from attention() above.
bool attentionGrad(const AttentionOperands &a, const bf16 *dy, const bf16 *y, const float *lse, bf16 *dq, bf16 *dk,
                   bf16 *dv);

} // namespace pipec::kernels::cuda::flash

#endif // PIPEC_CUDA_KERNELS_FLASH_ATTENTION_CUH
