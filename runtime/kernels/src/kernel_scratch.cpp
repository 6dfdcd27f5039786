// The scratch of kernel calls (pipec/kernel_scratch.h), buffer by buffer in
// the order the kernels take it. Compiled into each kernel library and into
// the compiler (pipec-plan-memory).
#include "pipec/kernel_scratch.h"

#include "kernel_plan.h"

namespace pipec::kernels {

using namespace plan;

namespace {
/// A convolution kernel's scratch: CUDA's im2col chunk, or what `addCpu`
/// (one of kernel_plan.h's CPU layouts) lists. A channels-last CUDA call
/// needs the channels-first call's: when cuDNN declines it, its
/// channels-first copies live in the kernels' scratch slot 1, as a bf16
/// call's widened copies do (cuda/src/conv.cu), and the channels-first
/// call it makes on them takes this.
template <class AddCpu>
ScratchNeed convNeed(const char *op, ScratchTarget target, const Shape &xs, const Shape &ws, const Dims &strides,
                     const Dims &pads, const Dims &dilations, int64_t group, bool channelsLast, AddCpu addCpu) {
  const ConvGeom g = convGeom(op, channelsFirstFor(op, target, xs, channelsLast),
                              channelsFirstFor(op, target, ws, channelsLast), strides, pads, dilations, group);
  ScratchNeed need;
  if (target == ScratchTarget::Cuda)
    addCudaConvScratch(g, need);
  else
    addCpu(g, need);
  return need;
}
} // namespace

ScratchNeed convScratch(ScratchTarget target, const Shape &xs, const Shape &ws, const Dims &strides,
                        const Dims &pads, const Dims &dilations, int64_t group, bool channelsLast) {
  return convNeed("nn.conv", target, xs, ws, strides, pads, dilations, group, channelsLast,
                  addCpuConvForwardScratch);
}

ScratchNeed convInputGradScratch(ScratchTarget target, const Shape &xs, const Shape &ws, const Dims &strides,
                                 const Dims &pads, const Dims &dilations, int64_t group, bool channelsLast) {
  return convNeed("nn.conv_input_grad", target, xs, ws, strides, pads, dilations, group, channelsLast,
                  addCpuConvInputGradScratch);
}

ScratchNeed convWeightGradScratch(ScratchTarget target, const Shape &xs, const Shape &ws, const Dims &strides,
                                  const Dims &pads, const Dims &dilations, int64_t group, bool accumulate,
                                  bool channelsLast) {
  return convNeed("nn.conv_weight_grad", target, xs, ws, strides, pads, dilations, group, channelsLast,
                  [&](const ConvGeom &g, ScratchNeed &need) {
                    addCpuConvWeightGradScratch(g, ws.numel(), need, accumulate);
                  });
}

// Either layout: the kernels read and write the operands where they lie
// (sequence-major through leading dimensions and strides, never copied), so
// the scratch holds only score rows and row sums, which are logical.
ScratchNeed attentionScratch(ScratchTarget target, const Shape &qs, const Shape &ks, const Shape &vs,
                             AttentionLayout layout) {
  const AttentionView v = attentionView("nn.attention", qs, ks, vs, Shape{}, false, false, layout);
  ScratchNeed need;
  if (target == ScratchTarget::Cpu)
    need.addPerThread<float>(plan::attentionRowsPerBlock(v.S) * v.T);
  else // every slice's block of rows at once
    need.addShared<float>(v.L * plan::cudaAttentionRowsPerBlock(v.L, v.S, v.T) * v.T);
  return need;
}

ScratchNeed attentionGradScratch(ScratchTarget target, const Shape &qs, const Shape &ks, const Shape &vs,
                                 AttentionLayout layout) {
  const AttentionView v = attentionView("nn.attention_grad", qs, ks, vs, Shape{}, false, false, layout);
  ScratchNeed need;
  if (target == ScratchTarget::Cpu) { // P and dz of one block
    const int64_t block = plan::attentionRowsPerBlock(v.S) * v.T;
    need.addPerThread<float>(block);
    need.addPerThread<float>(block);
  } else { // P and dz of every slice's block, then each row's rowsum(dy ⊙ result)
    const int64_t block = plan::cudaAttentionRowsPerBlock(v.L, v.S, v.T) * v.T;
    need.addShared<float>(v.L * block);
    need.addShared<float>(v.L * block);
    need.addShared<float>(v.L * v.S);
  }
  return need;
}

// Both libraries expand a broadcast scale (then bias) to the normalized
// shape first.
ScratchNeed layerNormScratch(ScratchTarget, const Shape &xs, const Shape &ss, const Shape *bs, int64_t axis) {
  const RowView v = rowView("nn.layer_norm", xs, axis);
  ScratchNeed need;
  if (ss.numel() != v.inner) need.addShared<float>(v.inner);
  if (bs && bs->numel() != v.inner) need.addShared<float>(v.inner);
  return need;
}

ScratchNeed layerNormGradScratch(ScratchTarget, const Shape &xs, const Shape &ss, int64_t axis) {
  const RowView v = rowView("nn.layer_norm_grad", xs, axis);
  ScratchNeed need;
  if (ss.numel() != v.inner) need.addShared<float>(v.inner);
  return need;
}

ScratchNeed layerNormParamGradScratch(ScratchTarget target, const Shape &xs, const Shape &ps, int64_t axis,
                                      bool withBias, bool accumulate) {
  const RowView v = rowView("nn.layer_norm_param_grad", xs, axis);
  ScratchNeed need;
  if (target == ScratchTarget::Cuda) {
    // The partial column sums of about sqrt(rows) chunks of rows (norm.cu;
    // the chunk's row statistics are in shared memory).
    if (ps.numel() == 0) return need;
    const int64_t partials = cudaLayerNormChunks(v.rows) * v.inner;
    need.addShared<double>(partials);
    if (withBias) need.addShared<double>(partials);
    return need;
  }
  // Sums at the normalized shape when the parameters broadcast or the sums
  // are added into the outputs, the parameter-shaped sums when both, then
  // the rows' statistics (used when the sums split over threads).
  const bool full = ps.numel() == v.inner;
  if (!full || accumulate) {
    need.addShared<float>(v.inner);
    if (withBias) need.addShared<float>(v.inner);
  }
  if (!full && accumulate) {
    need.addShared<float>(ps.numel());
    if (withBias) need.addShared<float>(ps.numel());
  }
  need.addShared<float>(2 * v.rows);
  return need;
}

ScratchNeed softmaxCrossEntropyScratch(ScratchTarget target, const Shape &ss, Reduction reduction, bool gradient) {
  checkRank("nn.softmax_cross_entropy_loss", ss, 2, "the scores (N, C, ...)");
  const int64_t elements = ss.v[1] ? ss.numel() / ss.v[1] : 0; // (n, d...)
  ScratchNeed need;
  if (target == ScratchTarget::Cpu) {
    need.addShared<double>(elements); // the log-sum-exp of every element
  } else if (!gradient) {
    // Every element's loss and weight before the reduction (softmax.cu).
    if (reduction != Reduction::None) need.addShared<double>(2 * elements);
  } else if (reduction == Reduction::Mean) {
    need.addShared<double>(1); // the weights' sum
  }
  return need;
}

// The sums of the kept elements, in double (CPU only).
ScratchNeed reduceScratch(ScratchTarget target, const Shape &xs, const Dims &axes, bool emptyMeansAll) {
  ScratchNeed need;
  if (target == ScratchTarget::Cuda) return need;
  need.addShared<double>(reducedShape("nn.reduce_sum", xs, axes, emptyMeansAll).numel());
  return need;
}

ScratchNeed poolScratch(ScratchTarget target, const Shape &xs, const Dims &kernel, const Dims &strides,
                        const Dims &pads, const Dims &dilations, bool ceilMode, bool maxPoolGrad,
                        bool channelsLast) {
  const PoolGeom g = poolGeom("pooling", channelsFirstFor("pooling", target, xs, channelsLast), kernel, strides,
                              pads, dilations, ceilMode);
  ScratchNeed need;
  if (target == ScratchTarget::Cuda) {
    // The arg max of every window (pool.cu; channels-last: in x's layout).
    if (maxPoolGrad && g.planes * g.inSize > 0) need.addShared<int64_t>(g.planes * g.outSize);
    return need;
  }
  // Per spatial axis and output index: the window's start and the kernel
  // range inside the input and inside the padded input (pool.cpp).
  for (int a = 0; a < g.sp; ++a)
    for (int table = 0; table < 4; ++table) need.addShared<int64_t>(g.out[a]);
  return need;
}

} // namespace pipec::kernels
