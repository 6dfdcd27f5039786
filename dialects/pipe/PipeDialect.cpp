#include "dialects/pipe/PipeDialect.h"

#include "runtime/include/pipec/vocabulary.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/DialectImplementation.h"
#include "mlir/Interfaces/FunctionInterfaces.h"
#include "llvm/ADT/TypeSwitch.h"

#include <cmath>
#include <cstdio>
#include <string>
#include "mlir/IR/OpImplementation.h"

using namespace mlir;
using namespace pipec::pipe;

#include "dialects/pipe/PipeOpsDialect.cpp.inc"

#include "dialects/pipe/PipeEnums.cpp.inc"
#define GET_ATTRDEF_CLASSES
#include "dialects/pipe/PipeAttrs.cpp.inc"

void PipeDialect::initialize() {
  addOperations<
#define GET_OP_LIST
#include "dialects/pipe/PipeOps.cpp.inc"
      >();
  addAttributes<
#define GET_ATTRDEF_LIST
#include "dialects/pipe/PipeAttrs.cpp.inc"
      >();
}

std::string pipec::pipe::formatDouble(double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%.17g", value);
  std::string result = text;
  if (result.find_first_of(".eEn") == std::string::npos)
    result += ".0";
  else if (result.find('.') == std::string::npos && result.find_first_of("eE") != std::string::npos)
    result.insert(result.find_first_of("eE"), ".0"); // "1e-08" does not read back as a float
  return result;
}

LogicalResult CostAttr::verify(function_ref<InFlightDiagnostic()> emitError, StringRef name,
                               APFloat fwd, APFloat bwdInput, APFloat bwdWeight,
                               APFloat fwdFlops,
                               int64_t activationBytes, int64_t savedBytes, int64_t paramBytes,
                               int64_t optimizerBytes, StringRef source) {
  if (name.empty())
    return emitError() << "pipe.cost: name is empty";
  for (const APFloat *value : {&fwd, &bwdInput, &bwdWeight, &fwdFlops})
    if (!value->isFinite() || value->isNegative() ||
        &value->getSemantics() != &APFloat::IEEEdouble())
      return emitError() << "pipe.cost '" << name
                         << "': times and FLOPs must be finite, non-negative doubles";
  for (int64_t bytes : {activationBytes, savedBytes, paramBytes, optimizerBytes})
    if (bytes < 0)
      return emitError() << "pipe.cost '" << name << "': byte counts must be non-negative";
  if (source != "estimate" && source != "profile")
    return emitError() << "pipe.cost '" << name << "': source must be \"estimate\" or \"profile\"";
  return success();
}

LogicalResult PlanAttr::verify(function_ref<InFlightDiagnostic()> emitError, pipec::ScheduleKind,
                               int64_t chunks, pipec::Placement placement, int64_t microbatches,
                               bool asynchronous, int64_t inflight, bool verticalSync,
                               DenseI64ArrayAttr recompute) {
  if (chunks < 1 || microbatches < 1 || inflight < 1)
    return emitError() << "pipe.plan: chunks, microbatches and inflight must be at least 1";
  if (placement == pipec::Placement::VShape && chunks != 2)
    return emitError() << "pipe.plan: the v placement runs 2 chunks per rank, not " << chunks;
  if (verticalSync && !asynchronous)
    return emitError() << "pipe.plan: vertical_sync needs asynchronous updates";
  if (!recompute)
    return emitError() << "pipe.plan: recompute is missing";
  for (int64_t stage : recompute.asArrayRef())
    if (stage < 0)
      return emitError() << "pipe.plan: recompute lists a negative stage " << stage;
  return success();
}

LogicalResult OptimizerAttr::verify(function_ref<InFlightDiagnostic()> emitError,
                                    OptimizerKind kind, APFloat lr, APFloat momentum,
                                    APFloat weightDecay, APFloat beta1, APFloat beta2,
                                    APFloat epsilon, int64_t statePerParam) {
  for (const APFloat *value : {&lr, &momentum, &weightDecay, &beta1, &beta2, &epsilon})
    if (!value->isFinite() || value->isNegative() ||
        &value->getSemantics() != &APFloat::IEEEdouble())
      return emitError() << "pipe.optimizer: hyper-parameters must be finite, non-negative doubles";
  int64_t expected = kind == OptimizerKind::AdamW ? 2 : 1;
  if (statePerParam != expected)
    return emitError() << "pipe.optimizer: " << stringifyOptimizerKind(kind) << " keeps "
                       << expected << " state tensors per parameter, got " << statePerParam;
  return success();
}

std::optional<Phase> pipec::pipe::phaseOf(Operation *op) {
  if (auto phase = op->getAttrOfType<PhaseAttr>(kPhaseAttrName))
    return phase.getValue();
  return std::nullopt;
}

void pipec::pipe::setPhase(Operation *op, Phase phase) {
  op->setAttr(kPhaseAttrName, PhaseAttr::get(op->getContext(), phase));
}

std::optional<OptimizerState> pipec::pipe::argStateOf(Operation *function, unsigned index) {
  if (auto interface = llvm::dyn_cast<FunctionOpInterface>(function))
    if (auto state = interface.getArgAttrOfType<OptimizerStateAttr>(index, kStateAttrName))
      return state.getValue();
  return std::nullopt;
}

std::optional<OptimizerState> pipec::pipe::resultStateOf(Operation *function, unsigned index) {
  if (auto interface = llvm::dyn_cast<FunctionOpInterface>(function))
    if (auto state = interface.getResultAttrOfType<OptimizerStateAttr>(index, kStateAttrName))
      return state.getValue();
  return std::nullopt;
}

/// The discardable pipe attributes (PipeDialect.h's k...AttrName) have the
/// types their readers expect: `pipe.phase` a #pipe.phase<...>, `pipe.stage`
/// a non-negative integer, `pipe.plan` a #pipe.plan<...>, and so on; what
/// their values mean together the passes that read them check.
LogicalResult PipeDialect::verifyOperationAttribute(Operation *op, NamedAttribute attribute) {
  if (attribute.getName() == kPhaseAttrName && !llvm::isa<PhaseAttr>(attribute.getValue()))
    return op->emitOpError() << "pipe.phase must be a #pipe.phase<...> (fwd, bwd_input, "
                                "bwd_weight), got "
                             << attribute.getValue();
  if (attribute.getName() == kOptimizerAttrName &&
      !llvm::isa<OptimizerAttr>(attribute.getValue()))
    return op->emitOpError() << "pipe.optimizer must be a #pipe.optimizer<...>, got "
                             << attribute.getValue();
  if (attribute.getName() == kStorageAttrName) {
    auto entries = llvm::dyn_cast<ArrayAttr>(attribute.getValue());
    if (!entries || !llvm::all_of(entries, [](Attribute a) { return llvm::isa<StorageAttr>(a); }))
      return op->emitOpError() << "pipe.storage must be an array of #pipe.storage<...>, got "
                               << attribute.getValue();
    if (entries.size() != op->getNumResults())
      return op->emitOpError() << "pipe.storage lists " << entries.size() << " places for "
                               << op->getNumResults() << " results";
  }
  if (attribute.getName() == kArenaSizeAttrName || attribute.getName() == kThreadScratchSizeAttrName ||
      attribute.getName() == kFusedChainAttrName) {
    auto size = llvm::dyn_cast<IntegerAttr>(attribute.getValue());
    if (!size || size.getValue().isNegative())
      return op->emitOpError() << attribute.getName().getValue() << " must be a non-negative integer, got "
                               << attribute.getValue();
  }
  if (attribute.getName() == kStageAttrName) {
    auto stage = llvm::dyn_cast<IntegerAttr>(attribute.getValue());
    if (!stage || stage.getValue().isNegative())
      return op->emitOpError() << "pipe.stage must be a non-negative integer, got " << attribute.getValue();
  }
  if (attribute.getName() == kCostAttrName && !llvm::isa<CostAttr>(attribute.getValue()))
    return op->emitOpError() << "pipe.cost must be a #pipe.cost<...>, got " << attribute.getValue();
  if (attribute.getName() == kPlanAttrName && !llvm::isa<PlanAttr>(attribute.getValue()))
    return op->emitOpError() << "pipe.plan must be a #pipe.plan<...>, got " << attribute.getValue();
  if (attribute.getName() == kStagesAttrName) {
    auto stages = llvm::dyn_cast<ArrayAttr>(attribute.getValue());
    if (!stages || !llvm::all_of(stages, [](Attribute a) { return llvm::isa<DictionaryAttr>(a); }))
      return op->emitOpError() << "pipe.stages must be an array of dictionaries, got " << attribute.getValue();
  }
  if (attribute.getName() == kPlanFileAttrName || attribute.getName() == kScheduleAttrName) {
    auto text = llvm::dyn_cast<DenseI8ResourceElementsAttr>(attribute.getValue());
    if (!text || text.getType().getRank() != 1)
      return op->emitOpError() << attribute.getName().getValue()
                               << " must be a dense_resource of i8 (a JSON document's text), got "
                               << attribute.getValue();
  }
  if (attribute.getName() == kMemoryTargetAttrName) {
    auto spelling = llvm::dyn_cast<StringAttr>(attribute.getValue());
    Target target;
    if (!spelling || !parseChoice(spelling.getValue(), target))
      return op->emitOpError() << "pipe.memory_target must be \"" << choiceNames<Target>("\" or \"") << "\", got "
                               << attribute.getValue();
  }
  if (attribute.getName() == kScratchAttrName) {
    auto place = llvm::dyn_cast<DenseI64ArrayAttr>(attribute.getValue());
    if (!place || place.size() != 2 || place[0] < 0 || place[1] < 0 || place[0] % 64 != 0)
      return op->emitOpError() << "pipe.scratch must be array<i64: offset, bytes>, both non-negative and the "
                                  "offset 64-byte aligned, got "
                               << attribute.getValue();
  }
  return success();
}

LogicalResult StorageAttr::verify(llvm::function_ref<InFlightDiagnostic()> emitError,
                                  StorageKind kind, int64_t offset) {
  if (offset < 0)
    return emitError() << "pipe.storage: the offset must be non-negative, got " << offset;
  if (kind == StorageKind::Arena && offset % 64 != 0)
    return emitError() << "pipe.storage: arena offsets are 64-byte aligned, got " << offset;
  if (kind == StorageKind::Register && offset != 0)
    return emitError() << "pipe.storage: a register value has no offset, got " << offset;
  return success();
}

static LogicalResult verifyStateAttribute(Operation *op, StringRef what, unsigned index,
                                          NamedAttribute attribute) {
  if (attribute.getName() == kStateAttrName &&
      !llvm::isa<OptimizerStateAttr>(attribute.getValue()))
    return op->emitOpError() << what << " #" << index
                             << ": pipe.state must be a #pipe.state<...> (momentum_buffer, "
                                "exp_avg, exp_avg_sq), got "
                             << attribute.getValue();
  return success();
}

LogicalResult PipeDialect::verifyRegionArgAttribute(Operation *op, unsigned, unsigned index,
                                                    NamedAttribute attribute) {
  return verifyStateAttribute(op, "argument", index, attribute);
}

LogicalResult PipeDialect::verifyRegionResultAttribute(Operation *op, unsigned, unsigned index,
                                                       NamedAttribute attribute) {
  return verifyStateAttribute(op, "result", index, attribute);
}

LogicalResult StageOp::verify() {
  // I64Attr getters return uint64_t; compare as signed.
  int64_t id = getId(), replicas = getReplicas();
  if (id < 0)
    return emitOpError("stage id must be non-negative, got ") << id;
  if (replicas < 1)
    return emitOpError("replicas must be at least 1, got ") << replicas;
  if (auto ranks = getRanks()) {
    if (static_cast<int64_t>(ranks->size()) != replicas)
      return emitOpError("lists ") << ranks->size() << " ranks for " << replicas
                                   << " replicas";
    for (int64_t rank : *ranks)
      if (rank < 0)
        return emitOpError("rank ") << rank << " is negative";
  }
  return success();
}

/// Shared check of send/recv: a peer is another stage of the pipeline.
static LogicalResult verifyPeer(Operation *op, int64_t peer, int64_t tag) {
  if (peer < 0)
    return op->emitOpError("peer stage must be non-negative, got ") << peer;
  if (tag < 0)
    return op->emitOpError("tag must be non-negative, got ") << tag;
  if (auto stage = op->getParentOfType<StageOp>())
    if (static_cast<int64_t>(stage.getId()) == peer)
      return op->emitOpError("stage ") << peer << " cannot communicate with itself";
  return success();
}

LogicalResult SendOp::verify() { return verifyPeer(*this, getPeer(), getTag()); }
LogicalResult RecvOp::verify() { return verifyPeer(*this, getPeer(), getTag()); }

LogicalResult AllReduceOp::verify() {
  if (getReduction() != "mean" && getReduction() != "sum")
    return emitOpError("reduction must be \"mean\" or \"sum\", got \"")
           << getReduction() << "\"";
  if (auto stages = getStages()) {
    if (!getName())
      return emitOpError("over tied stages needs the parameter's name");
    if (stages->size() < 2)
      return emitOpError("over tied stages needs at least two stages, got ")
             << stages->size();
    for (size_t i = 0; i < stages->size(); ++i) {
      if ((*stages)[i] < 0 || (i > 0 && (*stages)[i] <= (*stages)[i - 1]))
        return emitOpError("tied stages must be non-negative and strictly increasing");
    }
    if (auto stage = (*this)->getParentOfType<StageOp>())
      if (!llvm::is_contained(*stages, static_cast<int64_t>(stage.getId())))
        return emitOpError("tied stages do not include the enclosing stage ")
               << static_cast<int64_t>(stage.getId());
  }
  return success();
}

LogicalResult StashOp::verify() {
  if (static_cast<int64_t>(getSlots()) < 1)
    return emitOpError("needs at least one slot, got ")
           << static_cast<int64_t>(getSlots());
  return success();
}

LogicalResult RestoreOp::verify() {
  if (static_cast<int64_t>(getSlots()) < 1)
    return emitOpError("needs at least one slot, got ")
           << static_cast<int64_t>(getSlots());
  return success();
}

/// A region op whose body takes its inputs and yields its results (pipe.recompute, pipe.fused).
/// With `bf16Storage` (pipe.fused) a float32 body argument may read a
/// bfloat16 input and a float32 yield may be stored as a bfloat16 result:
/// the loop loads and stores bfloat16 and computes in float32
/// (pipec-bf16-storage, docs/cuda-codegen.md).
static LogicalResult verifyBodySignature(Operation *op, Block &body, ValueRange inputs,
                                         ValueRange results, bool bf16Storage = false) {
  auto matches = [&](Type body, Type outside) {
    if (body == outside)
      return true;
    auto inner = llvm::dyn_cast<RankedTensorType>(body), outer = llvm::dyn_cast<RankedTensorType>(outside);
    return bf16Storage && inner && outer && inner.getShape() == outer.getShape() &&
           inner.getElementType().isF32() && outer.getElementType().isBF16();
  };
  if (body.getNumArguments() != inputs.size())
    return op->emitOpError("body takes ") << body.getNumArguments() << " arguments for "
                                          << inputs.size() << " inputs";
  for (auto [argument, input] : llvm::zip(body.getArguments(), inputs))
    if (!matches(argument.getType(), input.getType()))
      return op->emitOpError("body argument types differ from the input types");
  auto yield = llvm::cast<YieldOp>(body.getTerminator());
  if (yield.getValues().size() != results.size() ||
      !llvm::all_of(llvm::zip(yield.getValues().getTypes(), results.getTypes()),
                    [&](auto pair) { return matches(std::get<0>(pair), std::get<1>(pair)); }))
    return op->emitOpError("yields types that differ from its result types");
  return success();
}

LogicalResult RecomputeOp::verify() {
  return verifyBodySignature(*this, getBody().front(), getInputs(), getResults());
}

LogicalResult FusedOp::verify() {
  Block &body = getBody().front();
  if (failed(verifyBodySignature(*this, body, getInputs(), getResults(), /*bf16Storage=*/true)))
    return failure();
  if (getResults().empty())
    return emitOpError("computes no result");
  auto space = llvm::cast<RankedTensorType>(getResults()[0].getType()).getShape();
  for (Operation &op : body.without_terminator())
    for (Type type : op.getResultTypes())
      if (llvm::cast<RankedTensorType>(type).getShape() != space)
        return op.emitOpError("in a pipe.fused body has a result shape other than the loop's");
  return success();
}

#define GET_OP_CLASSES
#include "dialects/pipe/PipeOps.cpp.inc"
