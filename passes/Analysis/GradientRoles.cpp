#include "passes/Analysis/GradientRoles.h"

#include "dialects/nn/NNDialect.h"

using namespace mlir;

namespace pipec::passes {

GradientRoles::GradientRoles(func::FuncOp function) {
  for (BlockArgument argument : function.getArguments()) {
    if (nn::argumentRole(function, argument.getArgNumber()) == nn::Role::Param &&
        llvm::isa<FloatType>(llvm::cast<ShapedType>(argument.getType()).getElementType())) {
      weightDerived.insert(argument);
      dependsOnParameter.insert(argument);
    }
  }
  function.walk([&](Operation *op) {
    bool anyParameter = false, allWeightOrConstant = true;
    for (Value operand : op->getOperands()) {
      anyParameter |= dependsOnParameter.contains(operand);
      bool constant = operand.getDefiningOp<nn::ConstantOp>() != nullptr;
      allWeightOrConstant &= weightDerived.contains(operand) || constant;
    }
    for (Value result : op->getResults()) {
      // Integer and boolean results (masks, comparisons) carry no gradient.
      auto type = llvm::dyn_cast<ShapedType>(result.getType());
      if (!type || !llvm::isa<FloatType>(type.getElementType()))
        continue;
      if (anyParameter)
        dependsOnParameter.insert(result);
      if (anyParameter && allWeightOrConstant)
        weightDerived.insert(result);
    }
  });
}

} // namespace pipec::passes
