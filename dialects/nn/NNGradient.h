// Builds the ops of a gradient at an insertion point: what every op's
// GradientOpInterface::buildGradient uses (dialects/nn/NNGradient.cpp).
#ifndef PIPEC_DIALECTS_NN_NNGRADIENT_H
#define PIPEC_DIALECTS_NN_NNGRADIENT_H

#include "dialects/nn/NNDialect.h"

#include "mlir/IR/Builders.h"

namespace pipec::nn {

class GradientBuilder {
public:
  GradientBuilder(mlir::OpBuilder &builder, mlir::Location loc) : b(builder), loc(loc) {}

  /// A 0-d constant.
  mlir::Value scalar(mlir::Type element, double value);
  /// `value` reshaped to `type` (itself when it has that type).
  mlir::Value reshape(mlir::Value value, mlir::RankedTensorType type);
  /// Sums a gradient over the axes its operand was broadcast along.
  mlir::Value sumTo(mlir::Value gradient, mlir::RankedTensorType target);
  mlir::Value gemm(mlir::Value lhs, mlir::Value rhs, float alpha, bool transA, bool transB);
  mlir::Value transposeLastTwo(mlir::Value value);
  /// nn.unary_grad of an element-wise unary op (UnaryElementwiseOpInterface).
  mlir::Value unaryGradient(mlir::Operation *op, mlir::Value dy);

  mlir::OpBuilder &b;
  mlir::Location loc;
};

} // namespace pipec::nn

#endif // PIPEC_DIALECTS_NN_NNGRADIENT_H
