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

#endif // PIPEC_NN_INTERFACES_TD
