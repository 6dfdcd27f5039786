#ifndef PIPEC_NN_GRAD_OPS_TD
#define PIPEC_NN_GRAD_OPS_TD

// Gradient and optimizer ops that autodiff emits. Gradients that are plain
// tensor algebra reuse the forward ops (nn.gemm, nn.matmul, nn.mul,
// nn.transpose, nn.reshape, nn.where, ...); the ops here are the ones that
// need a kernel of their own. Each takes the gradient of the forward result
// ("dy") first and produces the gradient of one forward operand (or, for
// the *_param_grad ops, of the op's parameters), so input gradients (B) and
// weight gradients (W) are separate ops a schedule can run at different
// times.

def NN_ReduceSumOp : NN_InferredOp<"reduce_sum"> {
  let summary = "Sum over normalized (sorted, unique) axes";
  let description = [{
    Used to reduce a gradient over the axes an operand was broadcast along
    and for bias gradients. With `keepdims` the reduced axes stay as size 1.
  }];
  let arguments = (ins NN_FloatTensor:$input, DenseI64ArrayAttr:$axes,
                       DefaultValuedAttr<BoolAttr, "true">:$keepdims);
  let results = (outs NN_FloatTensor:$result);
}

def NN_UnaryGradOp : NN_Op<"unary_grad", [
    Pure, AttrSizedOperandSegments, AllTypesMatch<["dy", "result"]>,
    OptionalTypesMatchWith<"x has dy's type", "dy", "x", "$_self">,
    OptionalTypesMatchWith<"y has dy's type", "dy", "y", "$_self">]> {
  let summary = "Gradient of an element-wise unary op";
  let description = [{
    dx = dy * f'(x), where `kind` names f, a function of
    pipec/vocabulary.h's table: relu (1 where y > 0, else 0), tanh (1 - y²),
    sigmoid (y(1 - y)), erf (2/√π · exp(-x²)), sqrt (1/(2y)), gelu (exact:
    Φ(x) + x·φ(x)), gelu_tanh (derivative of the tanh approximation). The
    op takes only the forward value its kind reads, `x` (the forward input)
    or `y` (the forward result), so that the other one is not kept alive
    for the backward (docs/autodiff.md).
  }];
  let arguments = (ins NN_FloatTensor:$dy, Optional<NN_FloatTensor>:$x,
                       Optional<NN_FloatTensor>:$y, NN_UnaryFunctionAttr:$kind);
  let results = (outs NN_FloatTensor:$result);
  let assemblyFormat =
      "$kind $dy `,` (`x` `=` $x^)? (`y` `=` $y^)? attr-dict `:` type($dy)";
  let hasVerifier = 1;
}

def NN_BinaryGradOp : NN_InferredOp<"binary_grad"> {
  let summary = "Gradient of an element-wise binary op for one operand, before broadcast reduction";
  let description = [{
    The gradient, on the broadcast result shape, with respect to one operand
    of `lhs op rhs`; autodiff then sums it down to the operand's shape with
    nn.reduce_sum and nn.reshape. Kinds (pipec/vocabulary.h): sub_rhs (-dy), div_rhs
    (-dy·lhs/rhs²), pow_lhs (dy·rhs·lhs^(rhs-1)), pow_rhs (dy·lhs^rhs·ln lhs).
  }];
  let arguments = (ins NN_FloatTensor:$dy, NN_FloatTensor:$lhs, NN_FloatTensor:$rhs,
                       NN_BinaryGradientAttr:$kind);
  let results = (outs NN_FloatTensor:$result);
  let assemblyFormat = "$kind operands attr-dict `:` functional-type(operands, results)";
}

def NN_ConvInputGradOp : NN_Op<"conv_input_grad", [Pure, NN_Differentiable]> {
  let summary = "Gradient of nn.conv with respect to its input (transposed convolution)";
  let description = [{
    Same window attributes as the forward conv; the result type is the
    input's. It is also ONNX ConvTranspose's forward (the importer lowers
    ConvTranspose to it, docs/importer.md), so it is differentiable: the
    gradient of `dy` is nn.conv of the result's gradient, and the weight's
    is nn.conv_weight_grad with the roles of dy and input exchanged.
  }];
  let arguments = (ins NN_FloatTensor:$dy, NN_FloatTensor:$weight,
                       DenseI64ArrayAttr:$strides, DenseI64ArrayAttr:$pads,
                       DenseI64ArrayAttr:$dilations, DefaultValuedAttr<I64Attr, "1">:$group,
                       DefaultValuedAttr<BoolAttr, "false">:$channels_last);
  let results = (outs NN_FloatTensor:$result);
  let assemblyFormat = "operands attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def NN_ConvWeightGradOp : NN_Op<"conv_weight_grad", [Pure]> {
  let summary = "Gradient of nn.conv with respect to its weight";
  let description = [{ Same window attributes as the forward conv; the result type is the weight's. }];
  let arguments = (ins NN_FloatTensor:$dy, NN_FloatTensor:$input,
                       DenseI64ArrayAttr:$strides, DenseI64ArrayAttr:$pads,
                       DenseI64ArrayAttr:$dilations, DefaultValuedAttr<I64Attr, "1">:$group,
                       DefaultValuedAttr<BoolAttr, "false">:$channels_last);
  let results = (outs NN_FloatTensor:$result);
  let assemblyFormat = "operands attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def NN_BatchNormGradOp : NN_InferredOp<"batch_norm_grad"> {
  let summary = "Gradient of nn.batch_norm with respect to its input";
  let description = [{
    In training mode the statistics are the batch's (recomputed from x), and
    the gradient flows through them; otherwise the running statistics are
    constants.

    With `activation` (ReLU or ReLU6) and `y`, its output, the incoming
    gradient is first taken through its gradient (ReLU: y > 0 ? dy : 0):
    pipec-fuse-norm-epilogue folds that nn.unary_grad in after autodiff
    (docs/optimization.md). With `keeps_masked_dy` the op also returns that
    masked gradient (`masked_dy`), for its other readers (the norm's
    parameter gradient, in a later entry point).
  }];
  let arguments = (ins NN_FloatTensor:$dy, NN_FloatTensor:$input, NN_FloatTensor:$scale,
                       NN_FloatTensor:$running_mean, NN_FloatTensor:$running_var,
                       Optional<NN_FloatTensor>:$y,
                       DefaultValuedAttr<F32Attr, "1.0e-5">:$epsilon,
                       DefaultValuedAttr<BoolAttr, "false">:$training,
                       OptionalAttr<NN_UnaryFunctionAttr>:$activation,
                       DefaultValuedAttr<BoolAttr, "false">:$keeps_masked_dy,
                       DefaultValuedAttr<BoolAttr, "false">:$channels_last);
  let results = (outs NN_FloatTensor:$result, Optional<NN_FloatTensor>:$masked_dy);
}

def NN_BatchNormParamGradOp : NN_InferredOp<"batch_norm_param_grad"> {
  let summary = "Gradients of nn.batch_norm with respect to scale and bias";
  let description = [{ dscale = Σ dy·x̂ and dbias = Σ dy over all axes but the channel axis 1. }];
  let arguments = (ins NN_FloatTensor:$dy, NN_FloatTensor:$input,
                       NN_FloatTensor:$running_mean, NN_FloatTensor:$running_var,
                       DefaultValuedAttr<F32Attr, "1.0e-5">:$epsilon,
                       DefaultValuedAttr<BoolAttr, "false">:$training,
                       DefaultValuedAttr<BoolAttr, "false">:$channels_last);
  let results = (outs NN_FloatTensor:$scale_grad, NN_FloatTensor:$bias_grad);
}

def NN_LayerNormGradOp : NN_InferredOp<"layer_norm_grad"> {
  let summary = "Gradient of nn.layer_norm with respect to its input";
  let arguments = (ins NN_FloatTensor:$dy, NN_FloatTensor:$input, NN_FloatTensor:$scale,
                       DefaultValuedAttr<I64Attr, "-1">:$axis,
                       DefaultValuedAttr<F32Attr, "1.0e-5">:$epsilon,
                       DefaultValuedAttr<BoolAttr, "true">:$centered);
  let results = (outs NN_FloatTensor:$result);
}

def NN_LayerNormParamGradOp : NN_Op<"layer_norm_param_grad", [Pure]> {
  let summary = "Gradients of nn.layer_norm with respect to scale and bias";
  let description = [{
    dscale = Σ dy·x̂ and dbias = Σ dy over the leading (not normalized) axes,
    each shaped like the normalized axes; the result types are those of the
    forward op's scale (and bias).
  }];
  let arguments = (ins NN_FloatTensor:$dy, NN_FloatTensor:$input,
                       DefaultValuedAttr<I64Attr, "-1">:$axis,
                       DefaultValuedAttr<F32Attr, "1.0e-5">:$epsilon,
                       DefaultValuedAttr<BoolAttr, "true">:$centered);
  let results = (outs NN_FloatTensor:$scale_grad, NN_FloatTensor:$bias_grad);
  let assemblyFormat = "operands attr-dict `:` functional-type(operands, results)";
}

def NN_MaxPoolGradOp : NN_Op<"max_pool_grad", [Pure]> {
  let summary = "Gradient of nn.max_pool: dy routed to the first maximum of each window";
  let arguments = (ins NN_FloatTensor:$dy, NN_FloatTensor:$input,
                       DenseI64ArrayAttr:$kernel_shape, DenseI64ArrayAttr:$strides,
                       DenseI64ArrayAttr:$pads, DenseI64ArrayAttr:$dilations,
                       DefaultValuedAttr<BoolAttr, "false">:$ceil_mode,
                       DefaultValuedAttr<BoolAttr, "false">:$channels_last);
  let results = (outs NN_FloatTensor:$result);
  let assemblyFormat = "operands attr-dict `:` functional-type(operands, results)";
}

def NN_AveragePoolGradOp : NN_Op<"average_pool_grad", [Pure]> {
  let summary = "Gradient of nn.average_pool; the result type is the forward input's";
  let arguments = (ins NN_FloatTensor:$dy,
                       DenseI64ArrayAttr:$kernel_shape, DenseI64ArrayAttr:$strides,
                       DenseI64ArrayAttr:$pads,
                       DefaultValuedAttr<BoolAttr, "false">:$ceil_mode,
                       DefaultValuedAttr<BoolAttr, "false">:$count_include_pad,
                       DefaultValuedAttr<BoolAttr, "false">:$channels_last);
  let results = (outs NN_FloatTensor:$result);
  let assemblyFormat = "operands attr-dict `:` functional-type(operands, results)";
}

def NN_DropoutGradOp : NN_Op<"dropout_grad", [Pure]> {
  let summary = "Gradient of nn.dropout: dy·mask/(1-ratio) in training, dy otherwise";
  let description = [{
    Without `mask`, the mask is drawn again, as the forward nn.dropout drew
    it: `dropout_op_id` is the op part of its key (nn::dropoutOpId of that
    dropout), the run's seed, step and micro-batch the rest
    (pipec-recompute-elementwise), so no mask is kept between the passes.
  }];
  let arguments = (ins NN_FloatTensor:$dy, Optional<NN_BoolTensor>:$mask,
                       DefaultValuedAttr<F32Attr, "0.5">:$ratio,
                       DefaultValuedAttr<BoolAttr, "false">:$training,
                       OptionalAttr<I64Attr>:$dropout_op_id);
  let results = (outs NN_FloatTensor:$result);
  let assemblyFormat = "operands attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def NN_SoftmaxGradOp : NN_Op<"softmax_grad", [Pure, AllTypesMatch<["dy", "y", "result"]>]> {
  let summary = "Gradient of nn.softmax from its result: y·(dy - Σ dy·y)";
  let arguments = (ins NN_FloatTensor:$dy, NN_FloatTensor:$y,
                       DefaultValuedAttr<I64Attr, "-1">:$axis);
  let results = (outs NN_FloatTensor:$result);
  let assemblyFormat = "operands attr-dict `:` type($dy)";
}

def NN_MaskedSoftmaxGradOp : NN_Op<"masked_softmax_grad", [Pure, AllTypesMatch<["dy", "y", "result"]>]> {
  let summary = "Gradient of nn.masked_softmax from its result: 0 where masked, else "
                "y·(dy - Σ dy·y) times (or divided by) scale";
  let arguments = (ins NN_FloatTensor:$dy, NN_FloatTensor:$y, NN_BoolTensor:$mask, F32Attr:$scale,
                       DefaultValuedAttr<BoolAttr, "false">:$divide,
                       DefaultValuedAttr<BoolAttr, "true">:$masked_when);
  let results = (outs NN_FloatTensor:$result);
  let assemblyFormat = "operands attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def NN_AttentionGradOp : NN_Op<"attention_grad", [Pure]> {
  let summary = "Gradients of nn.attention with respect to query, key and value";
  let description = [{
    From dy (the result's gradient), the forward operands, its result and
    log_sum_exp: P recomputed block by block, dvalue = Pᵀ·dy,
    dz = P ⊙ (dy·valueᵀ − rowsum(dy ⊙ result)) (0 where a boolean mask
    masks), times (or divided by) scale: dquery = dz·key, dkey = dzᵀ·query.
    With the forward's dropout (same ratio and op id, the mask regenerated):
    dvalue = (P ⊙ M/(1-p))ᵀ·dy and dz = P ⊙ (dP' − rowsum(dy ⊙ result)),
    dP' = (dy·valueᵀ) ⊙ M/(1-p); the row sum Σ_j P_j dP'_j is still
    dy · result, since result = Σ_j P_j M_j/(1-p) value_j.
    `sequence_major` is the forward's layout; each gradient has its
    operand's. With grouped-query heads, dkey and dvalue sum over the query
    heads that share each key/value head. With `joint_kv_heads` (query,
    key and value one joint value, as the forward's), the one result is the
    joint gradient, each window's gradient in its heads.
  }];
  let arguments = (ins NN_FloatTensor:$dy, NN_FloatTensor:$query, NN_FloatTensor:$key, NN_FloatTensor:$value,
                       Optional<AnyTypeOf<[NN_BoolTensor, NN_FloatTensor]>>:$mask, NN_FloatTensor:$result,
                       NN_FloatTensor:$log_sum_exp,
                       DefaultValuedAttr<F32Attr, "1.0">:$scale,
                       DefaultValuedAttr<BoolAttr, "false">:$divide,
                       DefaultValuedAttr<F32Attr, "0.0">:$fill,
                       DefaultValuedAttr<BoolAttr, "true">:$masked_when,
                       DefaultValuedAttr<F32Attr, "0.0">:$dropout_ratio,
                       DefaultValuedAttr<I64Attr, "0">:$dropout_op_id,
                       DefaultValuedAttr<BoolAttr, "false">:$sequence_major,
                       DefaultValuedAttr<I64Attr, "0">:$joint_kv_heads);
  // query_grad, key_grad, value_grad; or the joint gradient alone.
  let results = (outs Variadic<NN_FloatTensor>:$grads);
  let assemblyFormat = "operands attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
  let extraClassDeclaration = [{
    /// As nn.attention's.
    ::pipec::nn::AttentionOperandShapes operandShapes();
  }];
}

def NN_SoftmaxCrossEntropyLossGradOp : NN_Op<"softmax_cross_entropy_loss_grad", [Pure]> {
  let summary = "Gradient of nn.softmax_cross_entropy_loss with respect to the scores";
  let arguments = (ins NN_FloatTensor:$dloss, NN_FloatTensor:$scores,
                       NN_IntegerTensor:$labels, Optional<NN_FloatTensor>:$weights,
                       DefaultValuedStrAttr<StrAttr, "mean">:$reduction,
                       OptionalAttr<I64Attr>:$ignore_index,
                       OptionalAttr<I64Attr>:$classes);
  let results = (outs NN_FloatTensor:$result);
  let assemblyFormat = "operands attr-dict `:` functional-type(operands, results)";
}

def NN_GatherGradOp : NN_Op<"gather_grad", [Pure]> {
  let summary = "Gradient of nn.gather with respect to its data: scatter-add of dy";
  let arguments = (ins NN_FloatTensor:$dy, NN_IntegerTensor:$indices,
                       DefaultValuedAttr<I64Attr, "0">:$axis);
  let results = (outs NN_FloatTensor:$result);
  let assemblyFormat = "operands attr-dict `:` functional-type(operands, results)";
}

def NN_SliceGradOp : NN_Op<"slice_grad", [Pure]> {
  let summary = "Gradient of nn.slice: dy scattered into zeros of the input's shape";
  let arguments = (ins NN_FloatTensor:$dy, DenseI64ArrayAttr:$starts,
                       DenseI64ArrayAttr:$ends, DenseI64ArrayAttr:$steps);
  let results = (outs NN_FloatTensor:$result);
  let assemblyFormat = "operands attr-dict `:` functional-type(operands, results)";
}

def NN_SgdUpdateOp : NN_Op<"sgd_update", [Pure, AllTypesMatch<["param", "grad", "momentum_buffer", "new_param", "new_momentum_buffer"]>]> {
  let summary = "SGD with momentum and weight decay (PyTorch's torch.optim.SGD)";
  let description = [{
    g = grad + weight_decay·param; buf = momentum·buf + g (buf = g at step 1);
    param = param - lr·buf. With momentum 0, buf is g.
  }];
  let arguments = (ins NN_FloatTensor:$param, NN_FloatTensor:$grad,
                       NN_FloatTensor:$momentum_buffer, I64:$step,
                       F32Attr:$lr, DefaultValuedAttr<F32Attr, "0.0">:$momentum,
                       DefaultValuedAttr<F32Attr, "0.0">:$weight_decay);
  let results = (outs NN_FloatTensor:$new_param, NN_FloatTensor:$new_momentum_buffer);
  let assemblyFormat = "operands attr-dict `:` type($param)";
}

def NN_AdamWUpdateOp : NN_Op<"adamw_update", [Pure, AllTypesMatch<["param", "grad", "m", "v", "new_param", "new_m", "new_v"]>]> {
  let summary = "AdamW (PyTorch's torch.optim.AdamW)";
  let description = [{
    param = param·(1 - lr·weight_decay); m = β1·m + (1-β1)·g;
    v = β2·v + (1-β2)·g²; param = param - lr·(m/(1-β1^t)) / (√(v/(1-β2^t)) + ε),
    with t = step (1 for the first update).
  }];
  let arguments = (ins NN_FloatTensor:$param, NN_FloatTensor:$grad, NN_FloatTensor:$m,
                       NN_FloatTensor:$v, I64:$step, F32Attr:$lr,
                       DefaultValuedAttr<F32Attr, "0.9">:$beta1,
                       DefaultValuedAttr<F32Attr, "0.999">:$beta2,
                       DefaultValuedAttr<F32Attr, "1.0e-8">:$epsilon,
                       DefaultValuedAttr<F32Attr, "0.01">:$weight_decay);
  let results = (outs NN_FloatTensor:$new_param, NN_FloatTensor:$new_m, NN_FloatTensor:$new_v);
  let assemblyFormat = "operands attr-dict `:` type($param)";
}

#endif // PIPEC_NN_GRAD_OPS_TD
