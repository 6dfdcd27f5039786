#ifndef PIPEC_NN_ATTRS_TD
#define PIPEC_NN_ATTRS_TD

include "dialects/nn/NNBase.td"
include "mlir/IR/AttrTypeBase.td"
include "mlir/IR/EnumAttr.td"

class NN_Attr<string name, string attrMnemonic, list<Trait> traits = []>
    : AttrDef<NN_Dialect, name, traits> {
  let mnemonic = attrMnemonic;
}

// A kind from one of pipec/vocabulary.h's tables, held as the C++ enum the
// compiler and the runtime share and spelled as the table spells it
// (`nn.unary_grad <relu> ...`, `#nn.unary<relu>`). Parsing refuses a
// spelling the table does not have, naming the ones it has.
class NN_VocabularyKindAttr<string name, string attrMnemonic, string enumType>
    : NN_Attr<name, attrMnemonic> {
  let parameters = (ins enumType:$value);
  let assemblyFormat = "`<` $value `>`";
  let returnType = enumType;
  let convertFromStorage = "$_self.getValue()";
  let constBuilderCall = "::pipec::nn::" # name # "Attr::get($_builder.getContext(), $0)";
}

def NN_UnaryFunctionAttr : NN_VocabularyKindAttr<"UnaryFunction", "unary", "::pipec::Unary"> {
  let summary = "An element-wise unary function of pipec/vocabulary.h's table";
}

def NN_BinaryGradientAttr
    : NN_VocabularyKindAttr<"BinaryGradient", "binary_gradient", "::pipec::BinaryGradient"> {
  let summary = "A gradient rule of nn.binary_grad (pipec/vocabulary.h's table)";
}

// What a function argument or result is (`nn.role` in its attributes), set
// by the importer, pipec-append-loss, pipec-autodiff, pipec-optimizer and
// pipec-outline-stages, and read by every later pass and the emitters.
def NN_Role : I32EnumAttr<"Role", "what a function argument or result is", [
    I32EnumAttrCase<"Param", 0, "param">,                    // a trained parameter
    I32EnumAttrCase<"Buffer", 1, "buffer">,                  // state that is not trained (BatchNorm statistics)
    I32EnumAttrCase<"Input", 2, "input">,                    // a model input of the micro-batch
    I32EnumAttrCase<"Label", 3, "label">,                    // the loss's labels
    I32EnumAttrCase<"Loss", 4, "loss">,                      // the loss result
    I32EnumAttrCase<"Grad", 5, "grad">,                      // a parameter's gradient
    I32EnumAttrCase<"BufferUpdate", 6, "buffer_update">,     // a buffer's new value
    I32EnumAttrCase<"OptimizerState", 7, "optimizer_state">, // momentum, Adam's moments
    I32EnumAttrCase<"Step", 8, "step">,                      // the optimizer step counter
    I32EnumAttrCase<"LossScale", 9, "loss_scale">,           // the gradient scale of the loss
    I32EnumAttrCase<"Microbatch", 10, "microbatch">,         // the micro-batch index (dropout seeds)
  ]> {
  let cppNamespace = "::pipec::nn";
  let genSpecializedAttr = 0;
}

def NN_RoleAttr : EnumAttr<NN_Dialect, NN_Role, "role"> {
  let assemblyFormat = "`<` $value `>`";
}

#endif // PIPEC_NN_ATTRS_TD
