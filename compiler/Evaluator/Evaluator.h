// The reference evaluator: an interpreter for `nn` ops (the role XLA's
// HloEvaluator plays). It folds constants, checks gradients by finite
// differences, and is the oracle that generated code is compared with.
// See docs/evaluator.md.
//
// Errors (an op it cannot evaluate, operands that do not match the op's
// types, a kernel refusing its input) are reported as MLIR diagnostics on
// the op, naming it; the functions then return failure, never crash.
#ifndef PIPEC_COMPILER_EVALUATOR_EVALUATOR_H
#define PIPEC_COMPILER_EVALUATOR_EVALUATOR_H

#include "compiler/Evaluator/Kernels.h"

#include "llvm/ADT/ArrayRef.h"
#include "llvm/Support/LogicalResult.h"

#include <cstdint>
#include <vector>

namespace mlir {
class DenseElementsAttr;
class ElementsAttr;
class Operation;
class RankedTensorType;
class Type;
namespace func {
class FuncOp;
}
} // namespace mlir

namespace pipec::eval {

struct EvalOptions {
  /// The key parts of training-mode dropout masks (design.md §3): a pipelined
  /// run and the single-device reference pass the same values and drop the
  /// same elements. The op part of the key is the op's `seed` attribute, or
  /// else a hash of its name location (the ONNX node name the importer
  /// gives every op), which survives stage outlining.
  uint64_t seed = 0;
  uint64_t step = 0;
  uint64_t microBatch = 0;
};

/// Every op computes in double and rounds its results to their element
/// type, so a float32 model behaves like float32 code that computes each op
/// in double. Finite-difference gradient checks evaluate f64 ops, where the
/// rounding is the identity.
///
/// Evaluates one op on operand values (in operand order; absent optional
/// operands are simply not there, as in the op's operand list). Checks the
/// operands against the op's operand types and the results against its
/// result types. An operand (or function argument) of a scalar integer or
/// float type, such as the `step: i64` of nn.sgd_update and
/// nn.adamw_update, takes a rank-0 tensor of that element kind
/// (Tensor::ofInts(ElementKind::Int64, {}, {step})).
llvm::FailureOr<std::vector<Tensor>> evaluateOp(mlir::Operation *op,
                                                llvm::ArrayRef<Tensor> operands,
                                                const EvalOptions &options = {});

/// Evaluates a function of one block (`func.func @forward` as the importer
/// writes it) on its arguments; returns the values of `func.return`.
llvm::FailureOr<std::vector<Tensor>> evaluateFunction(mlir::func::FuncOp function,
                                                      llvm::ArrayRef<Tensor> arguments,
                                                      const EvalOptions &options = {});

/// The element kind of an MLIR element type (f32, f64, f16, bf16, i64, i32,
/// i8, ui8, i1); failure for others.
llvm::FailureOr<ElementKind> elementKindOf(mlir::Type type);

/// Constants in and out of MLIR attributes (for folding). tensorFromAttr
/// fails on element types without an ElementKind and on attributes whose
/// values cannot be read (e.g. resource blobs).
llvm::FailureOr<Tensor> tensorFromAttr(mlir::ElementsAttr attr);
mlir::DenseElementsAttr tensorToAttr(const Tensor &tensor, mlir::RankedTensorType type);

/// The op part of a dropout's mask key (see EvalOptions): the `seed`
/// attribute, or else a hash (FNV-1a, 64 bits) of its name location; failure
/// when it has neither.
llvm::FailureOr<uint64_t> dropoutOpId(mlir::Operation *op);

} // namespace pipec::eval

#endif // PIPEC_COMPILER_EVALUATOR_EVALUATOR_H
