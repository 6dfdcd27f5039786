#ifndef PIPEC_NN_OPS_TD
#define PIPEC_NN_OPS_TD

include "dialects/nn/NNBase.td"
include "dialects/nn/NNAttrs.td"
include "mlir/Interfaces/InferTypeOpInterface.td"
include "mlir/Interfaces/SideEffectInterfaces.td"
include "mlir/IR/BuiltinAttributeInterfaces.td"

//===----------------------------------------------------------------------===//
// Op classes
//===----------------------------------------------------------------------===//

// Result types inferred from the operands, where a float result may be
// stored in bfloat16 or float32 whatever the inference says
// (nn::sameUpToFloatStorage, pipec-bf16-storage).
def NN_InferredTypes : InferTypeOpAdaptorBase<[{
  static bool isCompatibleReturnTypes(::mlir::TypeRange inferred, ::mlir::TypeRange actual) {
    return ::pipec::nn::sameUpToFloatStorage(inferred, actual);
  }
}]>;

// An element-wise binary function of pipec/vocabulary.h's binary table with
// numpy (multidirectional) broadcasting (`function` names its enumerator):
// its result type and cost come from the table (docs/adding-an-op.md). A
// differentiable one adds NN_Differentiable to `traits` and defines
// buildGradient in NNGradient.cpp.
class NN_BinaryElementwiseOp<string mnemonic, string onnxName, string function,
                             list<Trait> traits = []>
    : NN_Op<mnemonic, !listconcat([Pure, NN_InferredTypes, NN_BinaryElementwiseOpInterface],
                                  traits)> {
  let summary = "ONNX " # onnxName # " with numpy broadcasting";
  let arguments = (ins NN_Tensor:$lhs, NN_Tensor:$rhs);
  let results = (outs NN_Tensor:$result);
  let assemblyFormat =
      "$lhs `,` $rhs attr-dict `:` functional-type(operands, results)";
  let extraClassDeclaration =
      "::pipec::Binary getBinaryFunction() { return ::pipec::Binary::" # function # "; }";
  let extraClassDefinition = [{
    ::pipec::nn::OpWork $cppClass::estimateWork() { return binaryWork(*this); }
    ::llvm::LogicalResult $cppClass::inferReturnTypes(
        ::mlir::MLIRContext *context, std::optional<::mlir::Location> loc, Adaptor adaptor,
        ::llvm::SmallVectorImpl<::mlir::Type> &types) {
      return inferBinaryElementwise(context, loc, ::pipec::Binary::}] # function # [{,
                                    adaptor.getLhs(), adaptor.getRhs(), types);
    }
  }];
}

// An element-wise unary function of pipec/vocabulary.h's table (`function`
// names its enumerator): its cost and gradient come from the table
// (docs/adding-an-op.md). An op whose function depends on its attributes
// leaves `function` empty and defines getUnaryFunction itself.
class NN_UnaryFloatOp<string mnemonic, string onnxName, string function = "">
    : NN_Op<mnemonic, [Pure, SameOperandsAndResultType, NN_UnaryElementwiseOpInterface,
                       NN_Differentiable]> {
  let summary = "ONNX " # onnxName # ", element-wise";
  let arguments = (ins NN_FloatTensor:$input);
  let results = (outs NN_FloatTensor:$result);
  let assemblyFormat = "$input attr-dict `:` type($input)";
  let extraClassDeclaration = !if(!empty(function), "",
      "::pipec::Unary getUnaryFunction() { return ::pipec::Unary::" # function # "; }");
  let extraClassDefinition = [{
    ::pipec::nn::OpWork $cppClass::estimateWork() { return unaryWork(*this); }
    ::mlir::Value $cppClass::buildGradient(::pipec::nn::GradientBuilder &builder,
                                           ::llvm::ArrayRef<::mlir::Value> dys, unsigned) {
      return builder.unaryGradient(*this, dys[0]);
    }
  }];
}

class NN_InferredOp<string mnemonic, list<Trait> traits = []>
    : NN_Op<mnemonic, !listconcat([Pure, NN_InferredTypes], traits)> {
  let assemblyFormat = "operands attr-dict `:` functional-type(operands, results)";
}

//===----------------------------------------------------------------------===//
// Element-wise
//===----------------------------------------------------------------------===//

def NN_AddOp : NN_BinaryElementwiseOp<"add", "Add", "Add", [NN_Differentiable]>;
def NN_SubOp : NN_BinaryElementwiseOp<"sub", "Sub", "Sub", [NN_Differentiable]>;
def NN_MulOp : NN_BinaryElementwiseOp<"mul", "Mul", "Mul", [NN_Differentiable]>;
def NN_DivOp : NN_BinaryElementwiseOp<"div", "Div", "Div", [NN_Differentiable]>;
def NN_PowOp : NN_BinaryElementwiseOp<"pow", "Pow", "Pow", [NN_Differentiable]>;
def NN_MaxOp : NN_BinaryElementwiseOp<"max", "Max", "Max", [NN_Differentiable]>;
def NN_MinOp : NN_BinaryElementwiseOp<"min", "Min", "Min", [NN_Differentiable]>;
def NN_ModOp : NN_BinaryElementwiseOp<"mod", "Mod (fmod = 0)", "Mod">;
def NN_FModOp : NN_BinaryElementwiseOp<"fmod", "Mod (fmod = 1)", "FMod">;
def NN_EqualOp : NN_BinaryElementwiseOp<"equal", "Equal", "Equal">;
def NN_LessOp : NN_BinaryElementwiseOp<"less", "Less", "Less">;
def NN_LessOrEqualOp : NN_BinaryElementwiseOp<"less_or_equal", "LessOrEqual", "LessOrEqual">;
def NN_GreaterOp : NN_BinaryElementwiseOp<"greater", "Greater", "Greater">;
def NN_GreaterOrEqualOp : NN_BinaryElementwiseOp<"greater_or_equal", "GreaterOrEqual", "GreaterOrEqual">;
def NN_AndOp : NN_BinaryElementwiseOp<"and", "And", "And">;
def NN_OrOp : NN_BinaryElementwiseOp<"or", "Or", "Or">;
def NN_XorOp : NN_BinaryElementwiseOp<"xor", "Xor", "Xor">;

def NN_WhereOp : NN_InferredOp<"where", [NN_Differentiable]> {
  let summary = "ONNX Where: select x where condition else y, with broadcasting";
  let arguments = (ins NN_BoolTensor:$condition, NN_Tensor:$x, NN_Tensor:$y);
  let results = (outs NN_Tensor:$result);
}

def NN_RotaryOp : NN_InferredOp<"rotary", [NN_Differentiable]> {
  let summary = "Rotary position embedding: x * cos + rotate_half(x) * sin";
  let description = [{
    The rotation of ONNX RotaryEmbedding and Hugging Face's
    apply_rotary_pos_emb, fused: y = x * cos + R(x) * sin over the last axis
    (even length D), where R(x) = concat(-x[D/2:], x[:D/2]), or with
    `interleaved` R(x)[2k] = -x[2k+1], R(x)[2k+1] = x[2k]. cos and sin
    broadcast to x (numpy rules; their last axis is D or 1). With
    `transposed` it computes the adjoint in x, y = x * cos + Rᵀ(x * sin),
    which is its own gradient's form.
  }];
  let arguments = (ins NN_FloatTensor:$input, NN_FloatTensor:$cos, NN_FloatTensor:$sin,
                       DefaultValuedAttr<BoolAttr, "false">:$interleaved,
                       DefaultValuedAttr<BoolAttr, "false">:$transposed);
  let results = (outs NN_FloatTensor:$result);
}

def NN_ReluOp : NN_UnaryFloatOp<"relu", "Relu", "Relu">;
// ONNX Clip with bounds 0 and 6 (PyTorch's relu6), which the importer
// writes for it; its gradient is Clip's, 0 on the bounds.
def NN_Relu6Op : NN_UnaryFloatOp<"relu6", "Clip(0, 6)", "Relu6">;
def NN_TanhOp : NN_UnaryFloatOp<"tanh", "Tanh", "Tanh">;
def NN_SigmoidOp : NN_UnaryFloatOp<"sigmoid", "Sigmoid", "Sigmoid">;
def NN_ErfOp : NN_UnaryFloatOp<"erf", "Erf", "Erf">;
def NN_SqrtOp : NN_UnaryFloatOp<"sqrt", "Sqrt", "Sqrt">;
def NN_NegOp : NN_UnaryFloatOp<"neg", "Neg", "Neg">;
def NN_ReciprocalOp : NN_UnaryFloatOp<"reciprocal", "Reciprocal", "Reciprocal">;
def NN_AbsOp : NN_UnaryFloatOp<"abs", "Abs", "Abs">;
def NN_ExpOp : NN_UnaryFloatOp<"exp", "Exp", "Exp">;
def NN_LogOp : NN_UnaryFloatOp<"log", "Log", "Log">;
def NN_SinOp : NN_UnaryFloatOp<"sin", "Sin", "Sin">;
def NN_CosOp : NN_UnaryFloatOp<"cos", "Cos", "Cos">;
def NN_SoftplusOp : NN_UnaryFloatOp<"softplus", "Softplus", "Softplus">;
def NN_SoftsignOp : NN_UnaryFloatOp<"softsign", "Softsign", "Softsign">;
def NN_SignOp : NN_UnaryFloatOp<"sign", "Sign", "Sign">;
def NN_TanOp : NN_UnaryFloatOp<"tan", "Tan", "Tan">;
def NN_AtanOp : NN_UnaryFloatOp<"atan", "Atan", "Atan">;
def NN_AsinOp : NN_UnaryFloatOp<"asin", "Asin", "Asin">;
def NN_AcosOp : NN_UnaryFloatOp<"acos", "Acos", "Acos">;
def NN_SinhOp : NN_UnaryFloatOp<"sinh", "Sinh", "Sinh">;
def NN_CoshOp : NN_UnaryFloatOp<"cosh", "Cosh", "Cosh">;
def NN_AsinhOp : NN_UnaryFloatOp<"asinh", "Asinh", "Asinh">;
def NN_AcoshOp : NN_UnaryFloatOp<"acosh", "Acosh", "Acosh">;
def NN_AtanhOp : NN_UnaryFloatOp<"atanh", "Atanh", "Atanh">;
def NN_FloorOp : NN_UnaryFloatOp<"floor", "Floor", "Floor">;
def NN_CeilOp : NN_UnaryFloatOp<"ceil", "Ceil", "Ceil">;
def NN_RoundOp : NN_UnaryFloatOp<"round", "Round", "Round">;
def NN_GeluOp : NN_UnaryFloatOp<"gelu", "Gelu"> {
  let arguments = (ins NN_FloatTensor:$input,
                       DefaultValuedStrAttr<StrAttr, "none">:$approximate);
  let hasVerifier = 1;
  let extraClassDeclaration = [{
    ::pipec::Unary getUnaryFunction() {
      return getApproximate() == "tanh" ? ::pipec::Unary::GeluTanh : ::pipec::Unary::Gelu;
    }
  }];
}

def NN_CastOp : NN_Op<"cast", [Pure, NN_Differentiable]> {
  let summary = "ONNX Cast: convert the element type, shape unchanged";
  let arguments = (ins NN_Tensor:$input);
  let results = (outs NN_Tensor:$result);
  let assemblyFormat = "$input attr-dict `:` type($input) `->` type($result)";
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Linear algebra
//===----------------------------------------------------------------------===//

def NN_GemmOp : NN_InferredOp<"gemm", [NN_Differentiable]> {
  let summary = "ONNX Gemm: alpha * op(A) * op(B) + beta * C";
  let description = [{
    With `activation`, the result is f(alpha * op(A) * op(B) + beta * C) for
    that element-wise function of pipec/vocabulary.h's table: its epilogue.
    pipec-fuse-gemm-epilogue sets it after autodiff (docs/optimization.md);
    such a GEMM has no gradient rule. With `keeps_pre_activation` as well,
    the op also returns f's input alpha * op(A) * op(B) + beta * C as
    `pre_activation`, which f's gradient reads (cuBLASLt's GELU_AUX).
  }];
  let arguments = (ins NN_FloatTensor:$a, NN_FloatTensor:$b,
                       Optional<NN_FloatTensor>:$c,
                       DefaultValuedAttr<F32Attr, "1.0">:$alpha,
                       DefaultValuedAttr<F32Attr, "1.0">:$beta,
                       DefaultValuedAttr<BoolAttr, "false">:$transA,
                       DefaultValuedAttr<BoolAttr, "false">:$transB,
                       OptionalAttr<NN_UnaryFunctionAttr>:$activation,
                       DefaultValuedAttr<BoolAttr, "false">:$keeps_pre_activation);
  let results = (outs NN_FloatTensor:$result, Optional<NN_FloatTensor>:$pre_activation);
}

// Not an ONNX op: pipec-fuse-gemm-epilogue writes it after autodiff for an
// activation's gradient whose incoming gradient is a GEMM's product read by
// nothing else (docs/optimization.md).
def NN_GemmActivationGradOp : NN_InferredOp<"gemm_activation_grad"> {
  let summary = "nn.unary_grad of `function` at x with dy = alpha * op(A) * op(B): f'(x) · dy";
  let description = [{
    The 2-D GEMM of nn.gemm without C, whose product is the incoming
    gradient of the element-wise `function` (one whose derivative reads its
    input x, nn.unary_grad's `x = ...` form) at x, of the product's shape:
    the backward of a GEMM with that activation as its epilogue, in one
    pass (cuBLASLt's DGELU epilogue for gelu_tanh).
  }];
  let arguments = (ins NN_FloatTensor:$a, NN_FloatTensor:$b, NN_FloatTensor:$x,
                       DefaultValuedAttr<F32Attr, "1.0">:$alpha,
                       DefaultValuedAttr<BoolAttr, "false">:$transA,
                       DefaultValuedAttr<BoolAttr, "false">:$transB,
                       NN_UnaryFunctionAttr:$function);
  let results = (outs NN_FloatTensor:$result);
}

def NN_MatMulOp : NN_InferredOp<"matmul", [NN_Differentiable]> {
  let summary = "ONNX MatMul: numpy matmul with batch broadcasting";
  let arguments = (ins NN_FloatTensor:$a, NN_FloatTensor:$b);
  let results = (outs NN_FloatTensor:$result);
}

def NN_BatchedGemmOp : NN_InferredOp<"batched_gemm"> {
  let summary = "nn.matmul of op(A) and op(B), op swapping the last two axes when transposed";
  let description = [{
    Numpy matmul with batch broadcasting of op(A) and op(B), where op(X) is X
    with its last two axes swapped when `transA` (`transB`) is set and X
    itself otherwise; a transposed operand has rank >= 2. Made by
    pipec-canonicalize-gemm from an nn.matmul whose operand is such a
    transpose, so that each GEMM reads the stored matrix with a trans flag
    instead of a materialized copy (docs/optimization.md). Not
    differentiable: it appears after autodiff only.
  }];
  let arguments = (ins NN_FloatTensor:$a, NN_FloatTensor:$b,
                       DefaultValuedAttr<BoolAttr, "false">:$transA,
                       DefaultValuedAttr<BoolAttr, "false">:$transB);
  let results = (outs NN_FloatTensor:$result);
}

//===----------------------------------------------------------------------===//
// Convolution, normalization, pooling
//===----------------------------------------------------------------------===//

def NN_ConvOp : NN_InferredOp<"conv", [NN_Differentiable, AttrSizedOperandSegments]> {
  let summary = "ONNX Conv (N, C, spatial...) with explicit pads";
  let description = [{
    `pads` holds the begin pads of every spatial axis followed by the end pads,
    as in ONNX; `auto_pad` is resolved into explicit pads by the importer.
    With `channels_last` (here, on the batch norm, the pools and their
    gradients) the input and result are stored [N, spatial..., C] and the
    weight [M, kernel..., C/group]: pipec-channels-last sets it for CUDA
    stages (docs/dialects.md).

    With `residual` (of the result's shape) the result is the convolution
    (plus bias) plus it, and with `activation` (ReLU or ReLU6) f of that:
    the epilogue pipec-fuse-norm-epilogue folds into a channels-last
    convolution after autodiff, which cuDNN's graph applies
    (docs/optimization.md, "Convolution epilogues"); such a convolution has
    no gradient rule.
  }];
  let arguments = (ins NN_FloatTensor:$input, NN_FloatTensor:$weight,
                       Optional<NN_FloatTensor>:$bias,
                       Optional<NN_FloatTensor>:$residual,
                       DenseI64ArrayAttr:$strides, DenseI64ArrayAttr:$pads,
                       DenseI64ArrayAttr:$dilations,
                       DefaultValuedAttr<I64Attr, "1">:$group,
                       DefaultValuedAttr<BoolAttr, "false">:$channels_last,
                       OptionalAttr<NN_UnaryFunctionAttr>:$activation);
  let results = (outs NN_FloatTensor:$result);
  // As `operands` prints them, with the residual named.
  let assemblyFormat = "$input `,` $weight (`,` $bias^)? (`residual` `=` $residual^)? attr-dict `:` "
                       "functional-type(operands, results)";
}

def NN_BatchNormOp : NN_InferredOp<"batch_norm", [NN_Differentiable]> {
  let summary = "ONNX BatchNormalization";
  let description = [{
    In training mode the output is normalized with the statistics of the
    batch and the running statistics are updated with `momentum`
    (running = momentum * running + (1 - momentum) * batch); in inference
    mode the running statistics are used and returned unchanged.

    With `residual` (of the input's shape) the output is the normalized
    value plus it, and with `activation` (ReLU or ReLU6) f of that: the epilogue
    pipec-fuse-norm-epilogue folds into the op after autodiff
    (docs/optimization.md); such a batch norm has no gradient rule.
  }];
  let arguments = (ins NN_FloatTensor:$input, NN_FloatTensor:$scale,
                       NN_FloatTensor:$bias, NN_FloatTensor:$running_mean,
                       NN_FloatTensor:$running_var,
                       Optional<NN_FloatTensor>:$residual,
                       DefaultValuedAttr<F32Attr, "1.0e-5">:$epsilon,
                       DefaultValuedAttr<F32Attr, "0.9">:$momentum,
                       DefaultValuedAttr<BoolAttr, "false">:$training,
                       OptionalAttr<NN_UnaryFunctionAttr>:$activation,
                       DefaultValuedAttr<BoolAttr, "false">:$channels_last);
  let results = (outs NN_FloatTensor:$result, NN_FloatTensor:$new_running_mean,
                      NN_FloatTensor:$new_running_var);
}

def NN_LayerNormOp : NN_InferredOp<"layer_norm", [NN_Differentiable]> {
  let summary = "ONNX LayerNormalization or RMSNormalization over the axes from `axis` on";
  let description = [{
    Besides the normalized result it returns, as ONNX does, the mean and the
    inverse standard deviation, shaped like the input with the normalized
    axes set to 1. With `centered = false` it is RMSNormalization:
    x / sqrt(mean(x²) + epsilon) · scale (+ bias), and the mean is 0.
  }];
  let arguments = (ins NN_FloatTensor:$input, NN_FloatTensor:$scale,
                       Optional<NN_FloatTensor>:$bias,
                       DefaultValuedAttr<I64Attr, "-1">:$axis,
                       DefaultValuedAttr<F32Attr, "1.0e-5">:$epsilon,
                       DefaultValuedAttr<BoolAttr, "true">:$centered);
  let results = (outs NN_FloatTensor:$result, NN_FloatTensor:$mean,
                      NN_FloatTensor:$inv_std_dev);
}

def NN_MaxPoolOp : NN_InferredOp<"max_pool", [NN_Differentiable]> {
  let summary = "ONNX MaxPool with explicit pads (begin pads, then end pads)";
  let arguments = (ins NN_FloatTensor:$input,
                       DenseI64ArrayAttr:$kernel_shape, DenseI64ArrayAttr:$strides,
                       DenseI64ArrayAttr:$pads, DenseI64ArrayAttr:$dilations,
                       DefaultValuedAttr<BoolAttr, "false">:$ceil_mode,
                       DefaultValuedAttr<BoolAttr, "false">:$channels_last);
  let results = (outs NN_FloatTensor:$result);
}

def NN_AveragePoolOp : NN_InferredOp<"average_pool", [NN_Differentiable]> {
  let summary = "ONNX AveragePool with explicit pads (begin pads, then end pads)";
  let arguments = (ins NN_FloatTensor:$input,
                       DenseI64ArrayAttr:$kernel_shape, DenseI64ArrayAttr:$strides,
                       DenseI64ArrayAttr:$pads,
                       DefaultValuedAttr<BoolAttr, "false">:$ceil_mode,
                       DefaultValuedAttr<BoolAttr, "false">:$count_include_pad,
                       DefaultValuedAttr<BoolAttr, "false">:$channels_last);
  let results = (outs NN_FloatTensor:$result);
}

def NN_GlobalAveragePoolOp : NN_InferredOp<"global_average_pool", [NN_Differentiable]> {
  let summary = "ONNX GlobalAveragePool: mean over all spatial axes";
  let arguments = (ins NN_FloatTensor:$input, DefaultValuedAttr<BoolAttr, "false">:$channels_last);
  let results = (outs NN_FloatTensor:$result);
}

def NN_DropoutOp : NN_InferredOp<"dropout", [NN_Differentiable]> {
  let summary = "ONNX Dropout; the mask is drawn from a counter-based generator";
  let description = [{
    In training mode elements are zeroed with probability `ratio` and the rest
    scaled by 1/(1-ratio). The mask comes from a counter-based generator keyed
    by (seed, step, micro-batch, op) so that pipelined and single-device runs
    drop the same elements. Outside training mode it is the identity.
  }];
  let arguments = (ins NN_FloatTensor:$input,
                       DefaultValuedAttr<F32Attr, "0.5">:$ratio,
                       DefaultValuedAttr<BoolAttr, "false">:$training,
                       OptionalAttr<I64Attr>:$seed);
  let results = (outs NN_FloatTensor:$result, NN_BoolTensor:$mask);
}

def NN_SoftmaxOp : NN_InferredOp<"softmax", [NN_Differentiable]> {
  let summary = "ONNX Softmax (opset 13 semantics: along one axis)";
  let arguments = (ins NN_FloatTensor:$input, DefaultValuedAttr<I64Attr, "-1">:$axis);
  let results = (outs NN_FloatTensor:$result);
}

// Not an ONNX op: pipec-recognize-composites writes it for the attention
// softmax exporters decompose (docs/optimization.md). One pass over each row
// instead of a scale, a where and a softmax, and their three gradients.
def NN_MaskedSoftmaxOp : NN_InferredOp<"masked_softmax", [NN_Differentiable]> {
  let summary = "softmax along the last axis of where(mask == masked_when, fill, "
                "divide ? input / scale : input * scale), mask broadcast to the input";
  let arguments = (ins NN_FloatTensor:$input, NN_BoolTensor:$mask, F32Attr:$scale,
                       DefaultValuedAttr<BoolAttr, "false">:$divide, F32Attr:$fill,
                       DefaultValuedAttr<BoolAttr, "true">:$masked_when);
  let results = (outs NN_FloatTensor:$result);
}

def NN_AttentionOp : NN_InferredOp<"attention", [DeclareOpInterfaceMethods<NN_GradientOpInterface,
                                                        ["gradientInEarlierOperand"]>]> {
  let summary = "fused scaled dot-product attention: softmax(scores) · value, without the scores in memory";
  let description = [{
    result = P · value with P the softmax along the last axis of
    z = where(mask == masked_when, fill, divide ? s / scale : s * scale),
    s = query · keyᵀ: query [L..., S, D], key [L..., T, D], value
    [L..., T, Dv] with the same leading axes, the optional mask broadcast to
    [L..., S, T] (without it z = s * scale). A floating-point mask is added
    instead, z = (s * scale) + mask, as ONNX Attention's attn_mask is; it
    gets no gradient. The same values as nn.matmul, nn.masked_softmax (or
    nn.add and nn.softmax) and nn.matmul, computed in blocks of
    rows so that the S x T scores are never stored; `log_sum_exp`
    ([L..., S, 1], log Σ exp z of each row) is what the gradient needs to
    recompute P.

    With `dropout_ratio` > 0, P is dropped out before the product as a
    training-mode nn.dropout of P would drop it: result = (P ⊙ M / (1 -
    dropout_ratio)) · value, M drawn from the same generator with the key
    (seed, step, micro-batch, `dropout_op_id`) and the element index into
    the [L..., S, T] probabilities, so the fused op drops exactly what the
    unfused dropout did; M is regenerated, never stored. `dropout_op_id` is
    the op part of that key (the dropout's `seed` attribute, or the FNV-1a
    hash of its node name). Outside training (an inference call) nothing
    is dropped.

    With `sequence_major`, query, key, value and result hold their heads
    after the sequence axis, as the projections that produce them write
    them: [L'..., S, H, D], [L'..., T, H, D], [L'..., T, H, Dv] and
    [L'..., S, H, Dv]. The values are those of the op on the operands with
    axes -3 and -2 swapped, its result swapped back; the mask, the dropout
    draws and `log_sum_exp` keep the head-major order ([L'..., H, S, T],
    [L'..., H, S, 1]). pipec-recognize-composites writes it for the head
    transposes exporters put around attention, which then never run.

    Grouped-query heads: key and value may have Hkv heads where the query
    has H = g·Hkv (axis -3, or -2 sequence-major; rank 3 at least). Query
    head h then reads key/value head h / g: the values of the op on key and
    value with each head repeated g times in place, as ONNX Attention's
    kv_num_heads and Llama-family exporters' repeat_kv repeat them.
    pipec-recognize-composites writes it for those repetitions, which then
    never run.

    With `joint_kv_heads` = Hkv > 0 (sequence-major only), query, key and
    value are one value [L'..., S, H + 2·Hkv, D], the joint projection's
    heads as the split of its last axis would give them: the query's H
    heads first, then the key's Hkv, then the value's Hkv (Dv = D). The op
    reads its three windows in place, so that the split never runs, and its
    gradient writes them into one joint gradient (docs/optimization.md,
    "Joint q/k/v"). pipec-recognize-composites writes it.
  }];
  let arguments = (ins NN_FloatTensor:$query, NN_FloatTensor:$key, NN_FloatTensor:$value,
                       Optional<AnyTypeOf<[NN_BoolTensor, NN_FloatTensor]>>:$mask,
                       DefaultValuedAttr<F32Attr, "1.0">:$scale,
                       DefaultValuedAttr<BoolAttr, "false">:$divide,
                       DefaultValuedAttr<F32Attr, "0.0">:$fill,
                       DefaultValuedAttr<BoolAttr, "true">:$masked_when,
                       DefaultValuedAttr<F32Attr, "0.0">:$dropout_ratio,
                       DefaultValuedAttr<I64Attr, "0">:$dropout_op_id,
                       DefaultValuedAttr<BoolAttr, "false">:$sequence_major,
                       DefaultValuedAttr<I64Attr, "0">:$joint_kv_heads);
  let results = (outs NN_FloatTensor:$result, NN_FloatTensor:$log_sum_exp);
  let extraClassDeclaration = [{
    /// The query's, key's and value's shapes as the op reads them: the
    /// operands', or their windows of the joint operand.
    ::pipec::nn::AttentionOperandShapes operandShapes();
  }];
}

def NN_SoftmaxCrossEntropyLossOp : NN_InferredOp<"softmax_cross_entropy_loss", [NN_Differentiable]> {
  let summary = "ONNX SoftmaxCrossEntropyLoss";
  let description = [{
    With `classes`, the class axis (scores' axis 1) holds that many classes
    followed by padding whose scores are -inf, which the softmax gives
    nothing: labels must be below `classes`. pipec-pad-classes writes it
    (docs/optimization.md, "Padded classes").
  }];
  let arguments = (ins NN_FloatTensor:$scores, NN_IntegerTensor:$labels,
                       Optional<NN_FloatTensor>:$weights,
                       DefaultValuedStrAttr<StrAttr, "mean">:$reduction,
                       OptionalAttr<I64Attr>:$ignore_index,
                       OptionalAttr<I64Attr>:$classes);
  let results = (outs NN_FloatTensor:$loss, NN_FloatTensor:$log_prob);
}

def NN_ReduceMeanOp : NN_InferredOp<"reduce_mean", [NN_Differentiable]> {
  let summary = "ONNX ReduceMean over normalized (non-negative, sorted) axes";
  let arguments = (ins NN_FloatTensor:$input, DenseI64ArrayAttr:$axes,
                       DefaultValuedAttr<BoolAttr, "true">:$keepdims);
  let results = (outs NN_FloatTensor:$result);
}

//===----------------------------------------------------------------------===//
// Data movement
//===----------------------------------------------------------------------===//

def NN_GatherOp : NN_InferredOp<"gather", [NN_Differentiable]> {
  let summary = "ONNX Gather (embedding lookup when axis = 0)";
  let arguments = (ins NN_Tensor:$data, NN_IntegerTensor:$indices,
                       DefaultValuedAttr<I64Attr, "0">:$axis);
  let results = (outs NN_Tensor:$result);
}

def NN_ReshapeOp : NN_Op<"reshape", [Pure, NN_Differentiable]> {
  let summary = "ONNX Reshape with the target shape folded into the result type";
  let arguments = (ins NN_Tensor:$input);
  let results = (outs NN_Tensor:$result);
  let assemblyFormat = "$input attr-dict `:` type($input) `->` type($result)";
  let hasVerifier = 1;
}

def NN_FlattenOp : NN_InferredOp<"flatten", [NN_Differentiable]> {
  let summary = "ONNX Flatten: 2-D view [prod(dims[:axis]), prod(dims[axis:])]";
  let arguments = (ins NN_Tensor:$input, DefaultValuedAttr<I64Attr, "1">:$axis);
  let results = (outs NN_Tensor:$result);
}

def NN_UnsqueezeOp : NN_InferredOp<"unsqueeze", [NN_Differentiable]> {
  let summary = "ONNX Unsqueeze; axes refer to the output rank";
  let arguments = (ins NN_Tensor:$input, DenseI64ArrayAttr:$axes);
  let results = (outs NN_Tensor:$result);
}

def NN_SqueezeOp : NN_InferredOp<"squeeze", [NN_Differentiable]> {
  let summary = "ONNX Squeeze of the given size-1 axes";
  let arguments = (ins NN_Tensor:$input, DenseI64ArrayAttr:$axes);
  let results = (outs NN_Tensor:$result);
}

def NN_ExpandOp : NN_Op<"expand", [Pure, NN_Differentiable]> {
  let summary = "ONNX Expand with the target shape folded into the result type";
  let arguments = (ins NN_Tensor:$input);
  let results = (outs NN_Tensor:$result);
  let assemblyFormat = "$input attr-dict `:` type($input) `->` type($result)";
  let hasVerifier = 1;
}

def NN_TransposeOp : NN_InferredOp<"transpose", [NN_Differentiable]> {
  let summary = "ONNX Transpose";
  let arguments = (ins NN_Tensor:$input, DenseI64ArrayAttr:$perm);
  let results = (outs NN_Tensor:$result);
}

def NN_PadOp : NN_InferredOp<"pad", [NN_Differentiable]> {
  let summary = "ONNX Pad in constant mode with non-negative pads";
  let description = [{
    `pads` holds the begin pads of every axis followed by the end pads, as in
    ONNX; new elements take `value`. PyTorch exports padded average pooling as
    Pad followed by AveragePool.
  }];
  let arguments = (ins NN_Tensor:$input, DenseI64ArrayAttr:$pads,
                       DefaultValuedAttr<F64Attr, "0.0">:$value);
  let results = (outs NN_Tensor:$result);
}

def NN_ConcatOp : NN_InferredOp<"concat", [NN_Differentiable]> {
  let summary = "ONNX Concat";
  let arguments = (ins Variadic<NN_Tensor>:$inputs, I64Attr:$axis);
  let results = (outs NN_Tensor:$result);
}

def NN_SplitOp : NN_InferredOp<"split", [NN_Differentiable]> {
  let summary = "ONNX Split into pieces of the given sizes along one axis";
  let arguments = (ins NN_Tensor:$input, I64Attr:$axis, DenseI64ArrayAttr:$sizes);
  let results = (outs Variadic<NN_Tensor>:$results);
}

def NN_SliceOp : NN_InferredOp<"slice", [NN_Differentiable]> {
  let summary = "ONNX Slice with bounds folded into attributes, one entry per axis";
  let description = [{
    `starts`, `ends` and `steps` have one entry per input axis and are
    normalized by the importer: starts are in [0, dim) (or equal dim for an
    empty slice), ends are in [0, dim] for positive steps and in [-1, dim)
    for negative steps, where -1 means "past the first element".
  }];
  let arguments = (ins NN_Tensor:$input, DenseI64ArrayAttr:$starts,
                       DenseI64ArrayAttr:$ends, DenseI64ArrayAttr:$steps);
  let results = (outs NN_Tensor:$result);
}

def NN_ConstantOp : NN_Op<"constant", [Pure, ConstantLike, InferTypeOpAdaptor]> {
  let summary = "A constant tensor (ONNX Constant, and folded shape computations)";
  let arguments = (ins ElementsAttr:$value);
  let results = (outs NN_Tensor:$result);
  let assemblyFormat = "attr-dict $value";
  let hasFolder = 1;
}

include "dialects/nn/NNGradOps.td"

#endif // PIPEC_NN_OPS_TD
