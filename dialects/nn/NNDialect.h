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
#include "runtime/include/pipec/vocabulary.h"

#include <optional>
#include <string>

namespace mlir {
class FunctionOpInterface;
} // namespace mlir

namespace pipec::nn {
/// Builds gradient ops (dialects/nn/NNGradient.h); the gradient interface's
/// methods take it.
class GradientBuilder;

/// Whether result types an op has are those its type inference gives, up to
/// the storage of float values: pipec-bf16-storage stores a float result in
/// bfloat16 where inference says float32, or in float32 where its bfloat16
/// operands would give bfloat16 (docs/cuda-codegen.md, "bf16 storage").
bool sameUpToFloatStorage(mlir::TypeRange inferred, mlir::TypeRange actual);

/// nn.attention's (or nn.attention_grad's) query, key and value shapes as
/// the op reads them, in its layout: its operands' shapes, or with
/// joint_kv_heads the windows of its joint operand (docs/dialects.md).
struct AttentionOperandShapes {
  llvm::SmallVector<int64_t> query, key, value;
};
} // namespace pipec::nn

#include "dialects/nn/NNOpsDialect.h.inc"
#include "dialects/nn/NNEnums.h.inc"
#define GET_ATTRDEF_CLASSES
#include "dialects/nn/NNAttrs.h.inc"
#include "dialects/nn/NNInterfaces.h.inc"

#define GET_OP_CLASSES
#include "dialects/nn/NNOps.h.inc"

namespace pipec::nn {

/// The attribute that says what a function argument or result is.
inline constexpr llvm::StringLiteral kRoleAttrName = "nn.role";
/// The ONNX name of a function argument or result (a parameter, an input,
/// an output), and of the op that updates a parameter.
inline constexpr llvm::StringLiteral kNameAttrName = "nn.name";
/// On the module: the model file it was imported from (as the importer was
/// given it; the job writer reads the initial weights there) and its opset.
inline constexpr llvm::StringLiteral kSourceAttrName = "nn.source";
inline constexpr llvm::StringLiteral kOpsetAttrName = "nn.opset";
/// On the module: the model's floating initializers that are not trained,
/// each with the reason (a dictionary name → string; docs/importer.md).
inline constexpr llvm::StringLiteral kFrozenAttrName = "nn.frozen";
/// On the module: what the importer noticed about the file that training
/// should know (exporter artefacts; an array of strings, docs/importer.md).
inline constexpr llvm::StringLiteral kImportNotesAttrName = "nn.import_notes";

/// The role of argument / result `index` of `function`, if it has one.
std::optional<Role> argumentRole(mlir::FunctionOpInterface function, unsigned index);
std::optional<Role> resultRole(mlir::FunctionOpInterface function, unsigned index);
void setArgumentRole(mlir::FunctionOpInterface function, unsigned index, Role role);
void setResultRole(mlir::FunctionOpInterface function, unsigned index, Role role);
/// Samples per micro-batch of a training function: dimension 0 of its inputs
/// and labels (1 for a scalar one), which every data argument shares
/// (piperun checks it); nullopt without a ranked input or label.
std::optional<int64_t> microbatchSize(mlir::FunctionOpInterface function);
/// `nn.role = #nn.role<...>`, for building an attribute dictionary.
mlir::NamedAttribute roleAttribute(mlir::MLIRContext *context, Role role);

/// The ONNX node an op comes from: the first name in its location, a
/// NameLoc or one inside a fused location (an op that took over others'
/// computation lists its own node first: docs/optimization.md); none when
/// it has none.
std::optional<llvm::StringRef> nodeName(mlir::Location location);

/// The op part of a dropout's mask key (design.md §3): its `seed`
/// attribute, or else the 64-bit FNV-1a hash of its node name (as
/// pipec::kernels::dropoutOpId, which generated code calls); none when it
/// has neither. nn.attention carries its absorbed dropout's as
/// `dropout_op_id`.
std::optional<uint64_t> dropoutOpId(mlir::Operation *dropout);

/// The work of an element-wise unary op (NN_UnaryFloatOp), from the
/// per-element FLOPs of its function in pipec/vocabulary.h's table.
OpWork unaryWork(mlir::Operation *op);

/// The work of an element-wise binary op (NN_BinaryElementwiseOp), from the
/// per-element FLOPs of its function in pipec/vocabulary.h's binary table.
OpWork binaryWork(mlir::Operation *op);

/// The result type of an element-wise binary op computing `function`: the
/// broadcast shape of lhs and rhs (same element types; i1 for the table's
/// logical functions), with the table's result element type.
mlir::LogicalResult inferBinaryElementwise(mlir::MLIRContext *context,
                                           std::optional<mlir::Location> loc, Binary function,
                                           mlir::Value lhs, mlir::Value rhs,
                                           llvm::SmallVectorImpl<mlir::Type> &types);

/// Numpy (multidirectional) broadcast of two static shapes; failure when a
/// pair of dimensions differs and neither is 1.
mlir::FailureOr<llvm::SmallVector<int64_t>>
broadcastShapes(llvm::ArrayRef<int64_t> lhs, llvm::ArrayRef<int64_t> rhs);

/// Whether `operand` reaches every element of `space` by numpy broadcasting
/// without enlarging it.
bool broadcastsTo(llvm::ArrayRef<int64_t> operand, llvm::ArrayRef<int64_t> space);

/// nn.reshape, flatten, squeeze and unsqueeze: the operand's elements, in
/// the same order, under another shape (generated code reinterprets the
/// pointer; an element-wise function commutes with them).
bool isView(mlir::Operation *op);

/// Why nn.masked_softmax(_grad) cannot take a mask of shape `mask` with an
/// input of shape `input` (the mask must broadcast to the input, whose rank
/// is at least 1); empty when it can.
std::string maskedSoftmaxShapeError(llvm::ArrayRef<int64_t> input, llvm::ArrayRef<int64_t> mask);
/// The dimensions of op(A) [m, k] · op(B) [kB, n] for 2-D A and B, op
/// transposing when its flag is set (nn.gemm, nn.gemm_activation_grad);
/// the product is defined when k == kB.
struct GemmDims {
  int64_t m, k, kB, n;
};
GemmDims gemmDims(mlir::RankedTensorType a, mlir::RankedTensorType b, bool transA, bool transB);

/// Why query, key, value (and mask, when given) of nn.attention or
/// nn.attention_grad, in the op's layout, do not fit together, or "" when
/// they do.
std::string attentionShapeError(llvm::ArrayRef<int64_t> query, llvm::ArrayRef<int64_t> key,
                                llvm::ArrayRef<int64_t> value, std::optional<llvm::ArrayRef<int64_t>> mask,
                                bool sequenceMajor = false);
/// attentionShapeError for the operands of nn.attention or its gradient,
/// their windows with `jointKvHeads` (their shapes as read into `shapes`).
std::string attentionOperandsError(mlir::Value query, mlir::Value key, mlir::Value value,
                                   std::optional<mlir::Value> mask, bool sequenceMajor, int64_t jointKvHeads,
                                   AttentionOperandShapes &shapes);
/// An nn.attention operand's shape in the head-major order ([L..., S, D]):
/// the shape itself, or with `sequenceMajor` axes -3 and -2 swapped
/// (unchanged below rank 3, which attentionShapeError refuses).
llvm::SmallVector<int64_t> headMajorShape(llvm::ArrayRef<int64_t> shape, bool sequenceMajor);

/// The floating-point operations of nn.attention_grad for a query and a
/// value of these types: the scores recomputed, then four products.
double attentionGradFlops(mlir::RankedTensorType query, mlir::RankedTensorType value, bool sequenceMajor);
/// The floating-point operations an nn.attention (or its gradient) adds for
/// a dropout of its probabilities at `ratio` (none at 0).
double attentionDropoutFlops(mlir::RankedTensorType query, mlir::RankedTensorType value, bool sequenceMajor,
                             float ratio);

/// Channels-last storage (docs/optimization.md, "Channels last"): an op with
/// `channels_last` stores its activations as [N, spatial..., C] and a
/// convolution's weight as [K, kernel..., C/group]; per-channel parameters
/// are [C] either way. The channel axis of a rank-`rank` operand.
int64_t channelAxis(int64_t rank, bool channelsLast);
/// A shape in the channels-first order the ONNX ops define ([N, C,
/// spatial...]): the shape itself, or with `channelsLast` its last axis moved
/// to position 1 (unchanged below rank 3).
llvm::SmallVector<int64_t> channelsFirstShape(llvm::ArrayRef<int64_t> shape, bool channelsLast);
/// A defaulted flag of an attribute dictionary, which may lack it: false.
inline bool isSet(mlir::BoolAttr flag) { return flag && flag.getValue(); }
/// Whether `op` (a convolution, batch norm or pool, or one of their
/// gradients) has `channels_last` set.
bool storesChannelsLast(mlir::Operation *op);
/// The inverse: how a channels-first shape is stored.
llvm::SmallVector<int64_t> storedShape(llvm::ArrayRef<int64_t> channelsFirst, bool channelsLast);
/// nn.transpose permutations between the layouts of a rank-`rank` tensor:
/// channels-first to channels-last ([0, 2, ..., rank-1, 1]) and back.
llvm::SmallVector<int64_t> toChannelsLast(int64_t rank);
llvm::SmallVector<int64_t> toChannelsFirst(int64_t rank);

/// Maps an ONNX-style axis (negative counts from the end) into [0, rank);
/// failure when out of range.
mlir::FailureOr<int64_t> normalizeAxis(int64_t axis, int64_t rank);

/// Checks the window attributes of Conv, the pools and the convolution
/// gradients (errors at `loc`, naming `opName`) and computes the spatial
/// output sizes of an (N, C, spatial...) input.
mlir::FailureOr<llvm::SmallVector<int64_t>>
inferWindowedShape(std::optional<mlir::Location> loc, llvm::StringRef opName,
                   llvm::ArrayRef<int64_t> inputShape, llvm::ArrayRef<int64_t> kernel,
                   llvm::ArrayRef<int64_t> strides, llvm::ArrayRef<int64_t> pads,
                   llvm::ArrayRef<int64_t> dilations, bool ceilMode);

} // namespace pipec::nn

#endif // PIPEC_DIALECTS_NN_NNDIALECT_H
