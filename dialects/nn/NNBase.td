#ifndef PIPEC_NN_BASE_TD
#define PIPEC_NN_BASE_TD

include "mlir/IR/OpBase.td"
include "dialects/nn/NNInterfaces.td"

def NN_Dialect : Dialect {
  let name = "nn";
  let cppNamespace = "::pipec::nn";
  let summary = "Tensor computation of a model: one op per supported ONNX operator.";
  let description = [{
    The `nn` dialect holds the forward computation imported from ONNX (and,
    later, its gradient and optimizer ops) on static-shaped builtin tensors.
    Every op follows the semantics of the ONNX operator of the same name, with
    the operands that exporters compute at run time (shapes, axes, slice
    bounds) already folded into attributes by the importer. Result types are
    inferred from operands and attributes, so the verifier rejects wrong
    ranks, shapes and element types with a message naming the op.
  }];
  let hasConstantMaterializer = 1;
  let useDefaultAttributePrinterParser = 1;
  // `nn.role` on function arguments and results must be a #nn.role.
  let hasRegionArgAttrVerify = 1;
  let hasRegionResultAttrVerify = 1;
  let extraClassDeclaration = [{
    /// Registers the attributes of NNAttrs.td (NNAttrs.cpp).
    void registerAttributes();
  }];
}

// Static shapes everywhere: the partitioner and code generators need sizes.
def NN_Tensor : StaticShapeTensorOf<[AnyType]>;
def NN_FloatTensor : StaticShapeTensorOf<[AnyFloat]>;
def NN_IntegerTensor : StaticShapeTensorOf<[I32, I64]>;
def NN_BoolTensor : StaticShapeTensorOf<[I1]>;

// Every op answers the cost model itself (dialects/nn/NNCost.cpp).
class NN_Op<string mnemonic, list<Trait> traits = []>
    : Op<NN_Dialect, mnemonic,
         !listconcat(traits, [DeclareOpInterfaceMethods<NN_CostOpInterface>])>;

// A forward op with a gradient rule (dialects/nn/NNGradient.cpp).
defvar NN_Differentiable = DeclareOpInterfaceMethods<NN_GradientOpInterface>;

#endif // PIPEC_NN_BASE_TD
