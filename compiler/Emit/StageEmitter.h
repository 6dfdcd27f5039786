// The stage code generator's state and helpers, shared by EmitStage.cpp
// (the stage ABI: interface, entry points, descriptors) and EmitOps.cpp (one
// kernel call per op). Internal to compiler/Emit.
#ifndef PIPEC_COMPILER_EMIT_STAGEEMITTER_H
#define PIPEC_COMPILER_EMIT_STAGEEMITTER_H

#include "compiler/Emit/EmitStage.h"

#include "dialects/nn/NNDialect.h"
#include "dialects/pipe/PipeDialect.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/SymbolTable.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/ADT/StringSet.h"
#include "llvm/Support/raw_ostream.h"

#include <array>
#include <map>
#include <string>

namespace pipec::emit::detail {
using namespace mlir;

inline RankedTensorType tensorType(Value value) { return llvm::cast<RankedTensorType>(value.getType()); }

inline std::string cType(Type element) {
  if (element.isF32()) return "float";
  if (element.isBF16()) return "pk::bf16"; // CUDA stages only (pipec-bf16-storage)
  if (element.isF64()) return "double";
  if (element.isInteger(64)) return "int64_t";
  if (element.isInteger(32)) return "int32_t";
  if (element.isUnsignedInteger(8)) return "uint8_t";
  if (element.isInteger(8)) return "int8_t";
  if (element.isInteger(1)) return "uint8_t";
  return "";
}

inline const char *abiDtype(Type element) {
  if (element.isF32()) return "PIPEC_F32";
  if (element.isBF16()) return "PIPEC_BF16";
  if (element.isF64()) return "PIPEC_F64";
  if (element.isInteger(64)) return "PIPEC_I64";
  if (element.isInteger(32)) return "PIPEC_I32";
  return "PIPEC_BOOL";
}

inline int64_t elementBytes(Type element) {
  return std::max<int64_t>(1, element.getIntOrFloatBitWidth() / 8);
}

inline std::string list(ArrayRef<int64_t> values) {
  std::string text;
  for (auto [i, value] : llvm::enumerate(values))
    text += (i ? ", " : "") + std::to_string(value);
  return text;
}

/// A name as diagnostics show it: the literal, cut after 200 bytes.
inline std::string shownName(StringRef text) {
  return cStringLiteral(text.take_front(200)) + (text.size() > 200 ? "..." : "");
}

inline std::string floatLiteral(double value) {
  if (std::isinf(value))
    return value < 0 ? "-HUGE_VALF" : "HUGE_VALF";
  if (std::isnan(value))
    return "NAN"; // float; widens exactly to double
  // Hexadecimal floating point: exact, so generated code matches the IR bit for bit.
  char text[64];
  std::snprintf(text, sizeof text, "%a", value);
  return text;
}

/// An f32 argument: floatLiteral, with the `f` suffix where one is allowed.
inline std::string f32Literal(float value) {
  return std::isfinite(value) ? floatLiteral(value) + "f" : floatLiteral(value);
}

/// nn.layer_norm's `centered` as the kernels' RowNorm (qualified in full:
/// `pk` names the CUDA library's namespace in CUDA stages).
inline const char *rowNorm(bool centered) {
  return centered ? "pipec::kernels::RowNorm::Layer" : "pipec::kernels::RowNorm::Rms";
}

struct TensorInfo {
  std::string name;
  RankedTensorType type;
};

struct ParamInfo {
  std::string name;
  RankedTensorType type;
  bool trained;
};

class StageEmitter {
public:
  StageEmitter(pipe::StageOp stage, int numStages, const StageTarget &target, raw_ostream &os,
               std::string *constantBytes)
      : stage(stage), numStages(numStages), target(target), os(os),
        constantBytes(target.constantsFile.empty() ? nullptr : constantBytes) {}

  LogicalResult run();

private:
  func::FuncOp function(StringRef name) {
    return llvm::dyn_cast_or_null<func::FuncOp>(SymbolTable::lookupSymbolIn(stage, name));
  }
  void collectInterface();
  LogicalResult emitFunction(func::FuncOp function, StringRef cName, bool isStep);
  LogicalResult emitOp(Operation *op, bool isStep);
  // emitOp's families of ops (EmitOps.cpp): each writes the call of an op it
  // knows and says whether it knew it.
  bool emitElementwiseOp(Operation *op);
  bool emitLinalgOp(Operation *op);
  bool emitNormPoolOp(Operation *op);
  /// ", residual, activation": the trailing arguments of a batch norm's or
  /// convolution's call for its epilogue (pipec-fuse-norm-epilogue).
  std::string epilogueArguments(Value residual, std::optional<Unary> activation);
  bool emitSoftmaxAttentionLossOp(Operation *op);
  bool emitReductionMovementOp(Operation *op);
  bool emitConstantOp(Operation *op, LogicalResult &result);
  bool emitPipelineOp(Operation *op, bool isStep, LogicalResult &result);
  /// nn.attention's dropout of P as the kernels' ratio, training flag and
  /// stream key: those nn.dropout's call gets (the op id is the absorbed
  /// dropout's), so the fused kernels draw its mask. The backward runs only
  /// in training, with the forward's step and micro-batch.
  std::string attentionDropout(APFloat ratio, uint64_t dropoutOpId);
  /// nn.attention(_grad)'s trailing kernel arguments: its scratch, then
  /// (sequence-major operands) its layout, which follows the scratch, and
  /// with joint_kv_heads the heads per row of the joint operand, from the
  /// windows' shapes.
  std::string attentionTail(Operation *op, bool sequenceMajor, const nn::AttentionOperandShapes &shapes,
                            int64_t jointKvHeads);
  /// "q, qs, k, ks, v, vs" of an nn.attention(_grad) whose operands are at
  /// these pointers: with joint_kv_heads, the windows of the one joint
  /// value at `pointers[0]`.
  std::string attentionOperands(std::array<std::string, 3> pointers, const nn::AttentionOperandShapes &shapes,
                                int64_t jointKvHeads);
  /// The three pointers the windows of a joint value at `joint` start at.
  static std::array<std::string, 3> jointWindows(const std::string &joint, const nn::AttentionOperandShapes &shapes);
  /// CUDA: a causal mask constant is declared as such before nn.attention
  /// and its gradient read it (pk::declareCausalMask).
  void declareIfCausal(Value mask, bool maskedWhen);
  LogicalResult emitOps(Block &block, bool isStep);
  /// piperun --profile: the ONNX nodes `op` absorbed, reported with no time
  /// of their own (theirs is in the op's, reported as `name`).
  void reportAbsorbed(Operation &op, const std::string &name);
  /// @step's optimizer updates become one stage-wide call
  /// (pk::adamwUpdateAll / pk::sgdUpdateAll, docs/cuda-codegen.md): each
  /// nn.adamw_update / nn.sgd_update adds its tensor here, and the call is
  /// written before the first other op or at the end of the block.
  struct PendingUpdate {
    std::string param, grad, state0, state1;
    int64_t elements;
  };
  void queueOptimizerUpdate(bool adamw, PendingUpdate update);
  void flushOptimizerUpdates();
  std::vector<PendingUpdate> pendingUpdates;
  bool pendingAdamW = false;
  /// Adjacent float32 -> bf16 nn.casts (CUDA; pipec-bf16-storage puts a
  /// function's parameter conversions together at its start) become one
  /// pk::toBf16All call, one launch per 64 tensors.
  struct PendingConversion {
    std::string from, to;
    int64_t elements;
    int64_t channels = 0, inner = 1; ///< a copy moved channels-last (pk::Bf16Conversion)
    bool outsideArena = false;       ///< it reads an argument or a constant, which no planned value overlaps
  };
  /// The queued conversion a transpose to channels-last of its result, the
  /// only reader, moves instead (pipec-bf16-storage puts such a transpose of
  /// an argument's copy right after the copy): the table writes the copy
  /// in the transposed order. Null for any other op.
  PendingConversion *conversionMovedBy(Operation *op) {
    auto transpose = llvm::dyn_cast<nn::TransposeOp>(op);
    if (!cuda() || !transpose || !transpose.getInput().hasOneUse())
      return nullptr;
    auto input = tensorType(transpose.getInput());
    if (input.getRank() < 3 || input.getNumElements() == 0 || transpose.getPerm() != llvm::ArrayRef<int64_t>(nn::toChannelsLast(input.getRank())) ||
        !isBf16Conversion(transpose.getInput().getDefiningOp()))
      return nullptr;
    auto name = names.find(transpose.getInput());
    // The table writes the transpose's result when it runs, before the
    // planned positions of the entries queued ahead of it: safe when none
    // of them reads the arena (pipec-plan-memory may give the result bytes
    // that a read value frees).
    if (name == names.end() ||
        !llvm::all_of(pendingConversions, [](const PendingConversion &c) { return c.outsideArena; }))
      return nullptr;
    for (PendingConversion &conversion : pendingConversions)
      if (conversion.to == name->second && conversion.channels == 0)
        return &conversion;
    return nullptr;
  }
  static bool isBf16Conversion(Operation *op) {
    auto cast = llvm::dyn_cast_or_null<nn::CastOp>(op);
    return cast && tensorType(cast.getInput()).getElementType().isF32() &&
           tensorType(cast.getResult()).getElementType().isBF16();
  }
  void flushConversions();
  std::vector<PendingConversion> pendingConversions;
  std::string bind(Value value, std::string expression);
  std::string allocate(Value value);
  /// pipec-plan-memory's place for `value` (an op result), if it planned one.
  pipe::StorageAttr storageOf(Value value) const;
  /// Whether `value`, or the value a view of it reads, is computed by adding
  /// into a parameter's gradient buffer (pipec-plan-memory's `gradient`).
  bool accumulatesIntoGradient(Value value) const {
    while (nn::isView(value.getDefiningOp()))
      value = value.getDefiningOp()->getOperand(0);
    pipe::StorageAttr place = storageOf(value);
    return place && place.getKind() == pipe::StorageKind::Gradient;
  }
  /// The trailing Workspace argument of a kernel call whose scratch
  /// pipec-plan-memory placed (pipe.scratch), else nothing.
  std::string scratchArgument(Operation *op) const;
  /// The scratch argument followed by `trailing` (", ..."): an empty
  /// workspace where the op has no scratch, so that `trailing` lands on the
  /// kernel's parameter after it.
  std::string scratchThen(Operation *op, const std::string &trailing) const;
  /// A cross-entropy's trailing arguments: its scratch and, for a padded
  /// class axis (pipec-pad-classes), the number of classes before the padding.
  std::string lossClasses(Operation *op, std::optional<uint64_t> classes) const {
    return classes ? scratchThen(op, ", int64_t(" + std::to_string(*classes) + ")") : scratchArgument(op);
  }
  /// nn.attention's mask as the kernels' three arguments: the boolean mask,
  /// the additive one (each a pointer or nullptr) and their shape.
  std::string attentionMask(Value mask) {
    if (!mask)
      return "nullptr, nullptr, pk::Shape{}";
    const bool additive = !tensorType(mask).getElementType().isInteger(1);
    return (additive ? "nullptr, " + ptr(mask) : ptr(mask) + ", nullptr") + ", " + shapeOf(mask);
  }
  /// A value's shape, or an attribute list, as a constant of the stage
  /// (`shape_2x16x32`, `dims_1_0_2`) defined once before the functions: a
  /// brace list at each kernel call built a pk::Dims on the stack per call,
  /// and GCC's time on a stage of thousands of ops grew with them
  /// (docs/optimization.md, "Compiling the stage").
  std::string shapeOf(Value value) { return dimsConstant("shape_", "x", tensorType(value).getShape()); }
  std::string dims(ArrayRef<int64_t> values) { return dimsConstant("dims_", "_", values); }
  std::string dimsConstant(StringRef prefix, StringRef separator, ArrayRef<int64_t> values) {
    std::string name = prefix.str();
    for (auto [i, value] : llvm::enumerate(values))
      name += (i ? separator.str() : "") + (value < 0 ? "m" + std::to_string(-value) : std::to_string(value));
    if (values.empty())
      name += "none";
    if (dimsNames.insert(name).second)
      dimsDefinitions += "const pk::Dims " + name + "{" + list(values) + "};\n";
    return name;
  }
  /// The loop (CPU) or kernel (CUDA) of a pipe.fused (EmitFused.cpp).
  LogicalResult emitFused(pipe::FusedOp fused);
  struct FusedLoop; // emitFused's loop body under construction (EmitFused.cpp)
  /// One body op of a pipe.fused as a statement of the loop (EmitFused.cpp).
  LogicalResult emitFusedOp(Operation &op, FusedLoop &loop);
  std::string ptr(Value value) { return names.lookup(value); }
  int paramIndex(StringRef name) const {
    for (auto [i, param] : llvm::enumerate(params))
      if (param.name == name)
        return static_cast<int>(i);
    return -1;
  }
  int trainedIndex(StringRef name) const {
    int index = 0;
    for (const auto &param : params) {
      if (param.name == name)
        return index;
      index += param.trained;
    }
    return -1;
  }

  /// The string literal of a name bound for a `const char *` of the stage
  /// ABI (a tensor, parameter or node name); refuses a NUL byte, which the
  /// C string would silently cut (`what` says whose name, `where` the op).
  std::string literal(StringRef text, StringRef what, Operation *where = nullptr) {
    if (text.contains('\0')) {
      InFlightDiagnostic diagnostic = where ? where->emitError() : stage.emitError();
      diagnostic << "stage " << stage.getId() << ": the name of " << what << " "
                 << shownName(text)
                 << " contains a NUL byte, which the stage library's C strings cannot hold";
      nameError = true;
    }
    return cStringLiteral(text);
  }

  /// The key of a dropout's mask in this call (pk::dropoutStreamKey of the
  /// run's seed, the step, the micro-batch and the op): the op part is its
  /// `seed` attribute, else its ONNX node's name hashed as the evaluator does.
  std::string dropoutStreamKey(Operation *dropout) {
    std::string id = "0ull";
    if (auto seed = dropout->getAttrOfType<IntegerAttr>("seed"))
      id = std::to_string(seed.getValue().getZExtValue()) + "ull";
    else if (std::optional<StringRef> name = nn::nodeName(dropout->getLoc()))
      id = "pk::dropoutOpId(" + literal(*name, "node", dropout) + ")";
    return dropoutStreamKey(id);
  }
  /// The key of a dropout whose mask an op draws again (nn.attention's, a
  /// mask-less nn.dropout_grad's) from its recorded op part.
  std::string dropoutStreamKey(uint64_t opId) { return dropoutStreamKey(std::to_string(opId) + "ull"); }
  /// The key from the op part's C++ expression. CUDA: a pk::StreamKey on the
  /// call's key in device memory, which pk::CallGraphs writes before each
  /// call, so that a replayed CUDA graph draws that call's masks.
  std::string dropoutStreamKey(const std::string &opId) {
    if (cuda()) {
      drawsDropout = true;
      return "pk::StreamKey(callKey, " + opId + ")";
    }
    return "pk::dropoutStreamKey(call->seed, call->step, call->microbatch, " + opId + ")";
  }
  /// The trailing (scratch, accumulate) arguments of a kernel that adds its
  /// result into a gradient buffer: its planned scratch or an empty one.
  std::string scratchAndAccumulate(Operation *op) const {
    std::string scratch = scratchArgument(op);
    return (scratch.empty() ? ", pk::Workspace{}" : scratch) + ", true";
  }
  /// The scratch argument, a default one when none was planned: for calls
  /// that pass arguments after it.
  std::string scratchOrDefault(Operation *op) const {
    std::string scratch = scratchArgument(op);
    return scratch.empty() ? ", pk::Workspace{}" : scratch;
  }
  /// The CUDA library's trailing `channelsLast` argument of `op`'s call
  /// (docs/cuda-kernels.md, "Channels last"), after the defaulted arguments
  /// `skipped` that stand between; nothing for a channels-first op.
  static std::string channelsLastArgument(Operation *op, const std::string &skipped = "") {
    if (!nn::storesChannelsLast(op))
      return "";
    return skipped + ", true";
  }

  bool cuda() const { return target.target == Target::Cuda; }
  const char *targetName() const { return cuda() ? "CUDA" : "CPU"; }
  std::string precisionEnum() const {
    switch (target.precision) {
    case Precision::F32: return "pk::Precision::F32";
    case Precision::TF32: return "pk::Precision::TF32";
    case Precision::BF16: return "pk::Precision::BF16";
    }
    llvm_unreachable("every precision has a kernel enumerator");
  }

  pipe::StageOp stage;
  int numStages;
  StageTarget target;
  raw_ostream &os;
  std::string *constantBytes; // the constants file's bytes, if there is one
  bool drawsDropout = false; // CUDA: the function being emitted reads the call's dropout key
  std::string body;      // the function being emitted
  std::string functions; // the functions emitted so far, written after the tables
  llvm::raw_string_ostream out{body};
  llvm::DenseMap<Value, std::string> names;
  int counter = 0;
  std::string constants;
  std::string dimsDefinitions; // the shape and attribute constants (dimsConstant)
  llvm::StringSet<> dimsNames;
  std::string kernels;   // CUDA: the __global__ functions of pipe.fused ops
  func::FuncOp current;  // the function being emitted
  int64_t arenaBytes = 0; // the largest pipe.arena_size of the stage's functions
  int64_t threadScratchBytes = 0; // the largest pipe.thread_scratch_size of them

  SmallVector<ParamInfo> params;
  SmallVector<TensorInfo> data, inputs, outputs;
  std::map<int64_t, int> inputIndex, outputIndex, gradOutputIndex, gradInputIndex;
  llvm::StringMap<int64_t> savedOffsets;
  int64_t workspaceBytes = 0;
  bool computesLoss = false;
  bool interfaceError = false;
  bool nameError = false; // a name literal() refused
  int phase = 0; // of the function being emitted: 0 F, 1 B, 2 W (the profile's)
  std::string optimizer = "PIPEC_ADAMW";
  int statePerParam = 2;
};

} // namespace pipec::emit::detail

#endif // PIPEC_COMPILER_EMIT_STAGEEMITTER_H
