#ifndef PIPEC_NN_INTERFACES_TD
#define PIPEC_NN_INTERFACES_TD

include "mlir/IR/OpBase.td"

def NN_CostOpInterface : OpInterface<"CostOpInterface"> {
  let cppNamespace = "::pipec::nn";
  let description = [{
    Reports the work of an op for one micro-batch: forward FLOPs and bytes,
    and per operand the FLOPs and bytes of its gradient. The cost pass turns
    this into forward, input-gradient (B) and weight-gradient (W) times with
    a roofline device model; which operand gradients count as W depends on
    the graph (operands computed from parameters only), not on the op.
  }];
  let methods = [
    InterfaceMethod<"The op's work for one micro-batch.",
                    "::pipec::nn::OpWork", "estimateWork">,
  ];
}

def NN_GradientOpInterface : OpInterface<"GradientOpInterface"> {
  let cppNamespace = "::pipec::nn";
  let description = [{
    The gradient rule of a forward op (dialects/nn/NNGradient.cpp):
    pipec-autodiff walks @train_step backwards and asks each op for the
    gradient of each operand that needs one, given the gradients of its
    results. An op without this interface has no gradient; autodiff refuses
    it when a gradient reaches it.
  }];
  let methods = [
    InterfaceMethod<[{
      The gradient of operand `index`, built with `builder` at its insertion
      point, given the gradients `dys` of the op's results (null where a
      result has none; the first is never null for single-result ops). Null
      when the operand has no gradient (an integer or a boolean operand, or
      one the op does not differentiate, like Where's condition).
    }], "::mlir::Value", "buildGradient",
      (ins "::pipec::nn::GradientBuilder &":$builder, "::llvm::ArrayRef<::mlir::Value>":$dys,
           "unsigned":$index)>,
    InterfaceMethod<[{
      Whether operand `index` is the same value as an earlier operand whose
      gradient already holds this one's share (a joint attention's query,
      key and value): autodiff then asks none of it.
    }], "bool", "gradientInEarlierOperand", (ins "unsigned":$index), [{}], [{ return false; }]>,
  ];
}

def NN_UnaryElementwiseOpInterface : OpInterface<"UnaryElementwiseOpInterface"> {
  let cppNamespace = "::pipec::nn";
  let description = [{
    An element-wise unary op: the function of pipec/vocabulary.h's table it
    computes. The cost, the gradient (nn.unary_grad), the reference
    evaluator and the emitters read the function, not the op
    (docs/adding-an-op.md).
  }];
  let methods = [
    InterfaceMethod<"The function this op computes.", "::pipec::Unary", "getUnaryFunction">,
  ];
}

def NN_BinaryElementwiseOpInterface : OpInterface<"BinaryElementwiseOpInterface"> {
  let cppNamespace = "::pipec::nn";
  let description = [{
    An element-wise binary op with numpy broadcasting: the function of
    pipec/vocabulary.h's binary table it computes. The result type, the
    cost, the reference evaluator, the emitters and the fusion pass read the
    function, not the op (docs/adding-an-op.md).
  }];
  let methods = [
    InterfaceMethod<"The function this op computes.", "::pipec::Binary", "getBinaryFunction">,
  ];
}

#endif // PIPEC_NN_INTERFACES_TD
