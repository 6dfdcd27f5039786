// The `nn` dialect: tensor computation imported from ONNX.
#ifndef PIPEC_DIALECTS_NN_NNDIALECT_H
#define PIPEC_DIALECTS_NN_NNDIALECT_H

#include "mlir/Bytecode/BytecodeOpInterface.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/Dialect.h"
#include "mlir/IR/OpDefinition.h"
#include "mlir/Interfaces/InferTypeOpInterface.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"

#include "dialects/nn/NNWork.h"

#include "dialects/nn/NNOpsDialect.h.inc"
#include "dialects/nn/NNInterfaces.h.inc"

#define GET_OP_CLASSES
#include "dialects/nn/NNOps.h.inc"

namespace pipec::nn {

/// Numpy (multidirectional) broadcast of two static shapes; failure when a
/// pair of dimensions differs and neither is 1.
mlir::FailureOr<llvm::SmallVector<int64_t>>
broadcastShapes(llvm::ArrayRef<int64_t> lhs, llvm::ArrayRef<int64_t> rhs);

/// Maps an ONNX-style axis (negative counts from the end) into [0, rank);
/// failure when out of range.
mlir::FailureOr<int64_t> normalizeAxis(int64_t axis, int64_t rank);

} // namespace pipec::nn

#endif // PIPEC_DIALECTS_NN_NNDIALECT_H
