// pipec-plan-memory: a static memory plan for every stage function, from
// liveness over the op order (docs/optimization.md).
#include "passes/Passes.h"
#include "passes/OptionsBinder.h"
#include "analysis/Settings/Declared.h"

#include "dialects/nn/NNDialect.h"
#include "dialects/pipe/NormJoins.h"
#include "dialects/pipe/PipeDialect.h"

#include "runtime/kernels/include/pipec/kernel_scratch.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/TypeSwitch.h"

#include <algorithm>

namespace pipec::passes {
#define GEN_PASS_DEF_PLANMEMORY
#include "passes/Passes.h.inc"
} // namespace pipec::passes

using namespace mlir;

namespace pipec::passes {
namespace {

constexpr int64_t kAlignment = 64;

int64_t alignedBytes(Type type) {
  auto tensor = llvm::cast<RankedTensorType>(type);
  int64_t bytes = tensor.getNumElements() *
                  std::max<int64_t>(1, tensor.getElementType().getIntOrFloatBitWidth() / 8);
  return std::max<int64_t>(kAlignment, (bytes + kAlignment - 1) / kAlignment * kAlignment);
}

/// How code generation stores an op's results (compiler/Emit agrees).
enum class Results {
  Own,      ///< each result is new storage
  Alias,    ///< each result is the storage of the operand `aliasOf` names
  External, ///< storage the call provides (received, restored) or a constant table
};

Results resultsOf(Operation *op) {
  if (llvm::isa<nn::ReshapeOp, nn::FlattenOp, nn::SqueezeOp, nn::UnsqueezeOp, pipe::AllReduceOp,
                nn::SgdUpdateOp, nn::AdamWUpdateOp, pipe::RecomputeOp>(op))
    return Results::Alias;
  if (llvm::isa<pipe::RecvOp, pipe::RestoreOp, nn::ConstantOp>(op))
    return Results::External;
  return Results::Own;
}

/// The value whose storage result `index` of an aliasing op reuses.
Value aliasOf(Operation *op, unsigned index) {
  if (auto update = llvm::dyn_cast<nn::SgdUpdateOp>(op))
    return index == 0 ? update.getParam() : update.getMomentumBuffer();
  if (auto update = llvm::dyn_cast<nn::AdamWUpdateOp>(op))
    return index == 0 ? update.getParam() : index == 1 ? update.getM() : update.getV();
  if (auto recompute = llvm::dyn_cast<pipe::RecomputeOp>(op))
    return recompute.getBody().front().getTerminator()->getOperand(index);
  return op->getOperand(0);
}

namespace pk = ::pipec::kernels;

pk::Shape shapeOf(ArrayRef<int64_t> shape) { return pk::Shape(shape.data(), static_cast<int>(shape.size())); }
pk::Shape shapeOf(Value value) { return shapeOf(llvm::cast<RankedTensorType>(value.getType()).getShape()); }
pk::Dims dimsOf(ArrayRef<int64_t> values) { return pk::Dims(values.data(), static_cast<int>(values.size())); }
pk::AttentionLayout attentionLayout(bool sequenceMajor) {
  return sequenceMajor ? pk::AttentionLayout::SequenceMajor : pk::AttentionLayout::HeadMajor;
}

/// The scratch the kernel that code generation calls for `op` needs (the
/// operands of the call compiler/Emit/EmitOps.cpp writes); none for an op
/// whose kernel takes no scratch. Throws pk::KernelError for shapes the
/// kernel would refuse.
pk::ScratchNeed kernelScratchOf(Operation *op, pk::ScratchTarget target, bool accumulates) {
  auto reduction = [](StringRef name) { return pk::reductionKind(name.str()); };
  return llvm::TypeSwitch<Operation *, pk::ScratchNeed>(op)
      .Case([&](nn::ConvOp conv) {
        return pk::convScratch(target, shapeOf(conv.getInput()), shapeOf(conv.getWeight()),
                               dimsOf(conv.getStrides()), dimsOf(conv.getPads()), dimsOf(conv.getDilations()),
                               conv.getGroup(), conv.getChannelsLast());
      })
      .Case([&](nn::ConvInputGradOp grad) {
        return pk::convInputGradScratch(target, shapeOf(grad.getResult()), shapeOf(grad.getWeight()),
                                        dimsOf(grad.getStrides()), dimsOf(grad.getPads()),
                                        dimsOf(grad.getDilations()), grad.getGroup(), grad.getChannelsLast());
      })
      .Case([&](nn::ConvWeightGradOp grad) {
        return pk::convWeightGradScratch(target, shapeOf(grad.getInput()), shapeOf(grad.getResult()),
                                         dimsOf(grad.getStrides()), dimsOf(grad.getPads()),
                                         dimsOf(grad.getDilations()), grad.getGroup(), accumulates,
                                         grad.getChannelsLast());
      })
      .Case([&](nn::LayerNormOp norm) {
        pk::Shape bias = norm.getBias() ? shapeOf(norm.getBias()) : pk::Shape{};
        return pk::layerNormScratch(target, shapeOf(norm.getInput()), shapeOf(norm.getScale()),
                                    norm.getBias() ? &bias : nullptr, static_cast<int64_t>(norm.getAxis()));
      })
      .Case([&](nn::LayerNormGradOp grad) {
        return pk::layerNormGradScratch(target, shapeOf(grad.getInput()), shapeOf(grad.getScale()),
                                        static_cast<int64_t>(grad.getAxis()));
      })
      .Case([&](nn::LayerNormParamGradOp grad) {
        return pk::layerNormParamGradScratch(target, shapeOf(grad.getInput()), shapeOf(grad.getScaleGrad()),
                                             static_cast<int64_t>(grad.getAxis()), /*withBias=*/true, accumulates);
      })
      .Case([&](nn::MaxPoolOp pool) {
        return pk::poolScratch(target, shapeOf(pool.getInput()), dimsOf(pool.getKernelShape()),
                               dimsOf(pool.getStrides()), dimsOf(pool.getPads()), dimsOf(pool.getDilations()),
                               pool.getCeilMode(), false, pool.getChannelsLast());
      })
      .Case([&](nn::MaxPoolGradOp grad) {
        return pk::poolScratch(target, shapeOf(grad.getInput()), dimsOf(grad.getKernelShape()),
                               dimsOf(grad.getStrides()), dimsOf(grad.getPads()), dimsOf(grad.getDilations()),
                               grad.getCeilMode(), true, grad.getChannelsLast());
      })
      .Case([&](nn::AveragePoolOp pool) {
        return pk::poolScratch(target, shapeOf(pool.getInput()), dimsOf(pool.getKernelShape()),
                               dimsOf(pool.getStrides()), dimsOf(pool.getPads()), pk::Dims{}, pool.getCeilMode(),
                               false, pool.getChannelsLast());
      })
      .Case([&](nn::AveragePoolGradOp grad) {
        return pk::poolScratch(target, shapeOf(grad.getResult()), dimsOf(grad.getKernelShape()),
                               dimsOf(grad.getStrides()), dimsOf(grad.getPads()), pk::Dims{}, grad.getCeilMode(),
                               false, grad.getChannelsLast());
      })
      .Case([&](nn::AttentionOp attention) {
        const nn::AttentionOperandShapes shapes = attention.operandShapes();
        return pk::attentionScratch(target, shapeOf(shapes.query), shapeOf(shapes.key), shapeOf(shapes.value),
                                    attentionLayout(attention.getSequenceMajor()));
      })
      .Case([&](nn::AttentionGradOp grad) {
        const nn::AttentionOperandShapes shapes = grad.operandShapes();
        return pk::attentionGradScratch(target, shapeOf(shapes.query), shapeOf(shapes.key), shapeOf(shapes.value),
                                        attentionLayout(grad.getSequenceMajor()));
      })
      .Case([&](nn::SoftmaxCrossEntropyLossOp loss) {
        return pk::softmaxCrossEntropyScratch(target, shapeOf(loss.getScores()), reduction(loss.getReduction()),
                                              false);
      })
      .Case([&](nn::SoftmaxCrossEntropyLossGradOp grad) {
        return pk::softmaxCrossEntropyScratch(target, shapeOf(grad.getScores()), reduction(grad.getReduction()),
                                              true);
      })
      .Case([&](nn::ReduceSumOp sum) {
        return pk::reduceScratch(target, shapeOf(sum.getInput()), dimsOf(sum.getAxes()), false);
      })
      .Case([&](nn::ReduceMeanOp mean) {
        return pk::reduceScratch(target, shapeOf(mean.getInput()), dimsOf(mean.getAxes()), true);
      })
      .Default([](Operation *) { return pk::ScratchNeed{}; });
}

/// A batch norm's new running statistic, returned as the update of the
/// buffer it reads and read by nothing else, is written in place into that
/// buffer (the kernels allow it: pipec/kernel_api.inc), so that no copy
/// returns it: such results, each with the index of the function result
/// that returns it.
llvm::DenseMap<Value, int64_t> buffersUpdatedInPlace(func::FuncOp function, func::ReturnOp ret) {
  Block &body = function.getBody().front();
  llvm::DenseMap<Value, int64_t> bufferResult;
  for (auto [i, value] : llvm::enumerate(ret.getOperands())) {
    auto norm = value.getDefiningOp<nn::BatchNormOp>();
    auto name = function.getResultAttrOfType<StringAttr>(i, nn::kNameAttrName);
    if (!norm || norm->getBlock() != &body || nn::resultRole(function, i) != nn::Role::BufferUpdate || !name ||
        !value.hasOneUse())
      continue;
    Value read = value == norm.getNewRunningMean()  ? norm.getRunningMean()
                 : value == norm.getNewRunningVar() ? norm.getRunningVar()
                                                    : Value();
    auto argument = llvm::dyn_cast_or_null<BlockArgument>(read);
    if (argument && argument.getOwner() == &body && argument.hasOneUse() &&
        function.getArgAttrOfType<StringAttr>(argument.getArgNumber(), nn::kNameAttrName) == name &&
        argument.getType() == value.getType())
      bufferResult[value] = static_cast<int64_t>(i);
  }
  return bufferResult;
}

/// A norm's parameter gradient adds into both of its results or neither:
/// drops the half-planned ones from `gradientResult`.
void keepWholeNormGradients(llvm::DenseMap<Value, int64_t> &gradientResult) {
  for (auto it = gradientResult.begin(); it != gradientResult.end();) {
    auto next = std::next(it);
    Operation *grad = it->first.getDefiningOp();
    if (llvm::isa<nn::LayerNormParamGradOp, nn::BatchNormParamGradOp>(grad) &&
        !llvm::all_of(grad->getResults(), [&](Value r) { return gradientResult.count(r); }))
      gradientResult.erase(it);
    it = next;
  }
}

/// A loop and the norm whose kernel runs it (pipe/NormJoins.h) are one
/// kernel, which the plan gives one position, so that neither's results
/// share bytes with what the other reads: the pair's first op when `op` is
/// its second, else null; failure for a mark that does not hold.
FailureOr<Operation *> earlierOfJoinedPair(Operation &op) {
  auto fused = llvm::dyn_cast<pipe::FusedOp>(op);
  if (fused && failed(pipe::checkNormJoin(fused)))
    return failure();
  if (fused && fused->hasAttr(pipe::kNormEpilogueAttrName))
    return op.getPrevNode();
  if (pipe::FusedOp loop = pipe::loopJoinedTo(&op); loop && llvm::isa<nn::LayerNormOp>(op))
    return loop.getOperation();
  return static_cast<Operation *>(nullptr);
}

struct Interval {
  Value root;                 ///< the value stored, or null for a kernel call's scratch
  Operation *scratchOf;       ///< the kernel call whose scratch this is, or null
  int64_t start, end, bytes;
  int64_t offset = -1;
};

/// Greedy by size: the largest first, each at the lowest offset where it
/// overlaps no placed value that is live at the same time. The arena's bytes.
int64_t placeGreedily(std::vector<Interval> &intervals) {
  std::vector<Interval *> bySize;
  for (Interval &interval : intervals)
    bySize.push_back(&interval);
  std::stable_sort(bySize.begin(), bySize.end(),
                   [](const Interval *a, const Interval *b) { return a->bytes > b->bytes; });
  std::vector<Interval *> placed;
  int64_t arenaBytes = 0;
  for (Interval *interval : bySize) {
    std::vector<std::pair<int64_t, int64_t>> busy; // [offset, offset + bytes) of live neighbours
    for (Interval *other : placed)
      if (other->start <= interval->end && interval->start <= other->end)
        busy.push_back({other->offset, other->offset + other->bytes});
    std::sort(busy.begin(), busy.end());
    int64_t offset = 0;
    for (auto [lo, hi] : busy) {
      if (offset + interval->bytes <= lo)
        break;
      offset = std::max(offset, hi);
    }
    interval->offset = offset;
    arenaBytes = std::max(arenaBytes, offset + interval->bytes);
    placed.push_back(interval);
  }
  return arenaBytes;
}

struct PlanMemory : PassWithOptions<impl::PlanMemoryBase<PlanMemory>, PlanMemoryOptions> {
  using PassWithOptions::PassWithOptions;


  void runOnOperation() override {
    FailureOr<PlanMemoryOptions> given = options();
    if (failed(given))
      return signalPassFailure();
    const pk::ScratchTarget scratchTarget = given->target;
    getOperation()->setAttr(pipe::kMemoryTargetAttrName,
                            StringAttr::get(&getContext(), choiceName(given->target)));
    getOperation().walk([&](func::FuncOp function) {
      if (function->getParentOfType<pipe::StageOp>() && !function.getBody().empty() &&
          failed(plan(function, scratchTarget)))
        signalPassFailure();
    });
  }

  LogicalResult plan(func::FuncOp function, pk::ScratchTarget scratchTarget) {
    MLIRContext *context = function.getContext();
    Block &body = function.getBody().front();
    auto ret = llvm::cast<func::ReturnOp>(body.getTerminator());

    // The op order code generation follows: a recompute body runs inline
    // after its op; a fused body is one loop at its op.
    llvm::DenseMap<Value, Value> rootOf; // an alias's storage root (absent: its own)
    auto root = [&](Value value) { return rootOf.lookup(value) ? rootOf.lookup(value) : value; };
    llvm::DenseMap<Operation *, int64_t> position;
    SmallVector<Operation *> order;
    std::function<bool(Block &)> number = [&](Block &block) {
      for (Operation &op : block) {
        position[&op] = static_cast<int64_t>(order.size());
        FailureOr<Operation *> firstOfKernel = earlierOfJoinedPair(op);
        if (failed(firstOfKernel))
          return false;
        if (*firstOfKernel)
          position[&op] = position.lookup(*firstOfKernel);
        order.push_back(&op);
        if (auto recompute = llvm::dyn_cast<pipe::RecomputeOp>(op)) {
          Block &inner = recompute.getBody().front();
          for (auto [argument, input] : llvm::zip(inner.getArguments(), recompute.getInputs()))
            rootOf[argument] = root(input);
          if (!number(inner))
            return false;
        }
        if (resultsOf(&op) == Results::Alias)
          for (unsigned i = 0; i < op.getNumResults(); ++i)
            rootOf[op.getResult(i)] = root(aliasOf(&op, i));
      }
      return true;
    };
    if (!number(body))
      return failure();
    const int64_t end = static_cast<int64_t>(order.size());

    // Last use of every storage root, over all values that share it.
    llvm::DenseMap<Value, int64_t> lastUse;
    for (Operation *op : order)
      for (Value operand : op->getOperands()) {
        int64_t at = op == ret.getOperation() ? end : position.lookup(op);
        int64_t &last = lastUse[root(operand)];
        last = std::max(last, at);
      }

    // The values computed straight into the workspace slot of a result the
    // function returns as pipe.saved (that result's index): the returned
    // value's storage root, so that a view (a GEMM's rows reshaped back to
    // [batch, tokens, width]) is saved without a copy too. A root an op of
    // the body computes, of the slot's size, claimed by the first such
    // result. A later saved result of the same storage (views keep the
    // bytes) shares the first one's slot (pipe.saved_slot_of).
    // Also the gradient each returned C-less GEMM can accumulate into.
    llvm::DenseMap<Value, int64_t> savedResult;
    llvm::DenseMap<Value, int64_t> gradientResult;
    llvm::DenseMap<Value, int> returnCount;
    llvm::DenseMap<Value, int64_t> firstSavedOf; // storage root -> the first saved result returning it
    for (Value value : ret.getOperands())
      ++returnCount[value];
    for (auto [i, value] : llvm::enumerate(ret.getOperands())) {
      Value storage = root(value);
      Operation *producer = storage.getDefiningOp();
      const bool saved = function.getResultAttr(i, "pipe.saved") != nullptr;
      function.removeResultAttr(i, StringAttr::get(context, pipe::kSavedSlotOfAttrName));
      if (saved && llvm::isa<RankedTensorType>(value.getType())) {
        auto [first, inserted] = firstSavedOf.try_emplace(storage, static_cast<int64_t>(i));
        if (!inserted && alignedBytes(value.getType()) == alignedBytes(ret.getOperand(first->second).getType())) {
          function.setResultAttr(i, pipe::kSavedSlotOfAttrName,
                                 IntegerAttr::get(IntegerType::get(context, 64), first->second));
          ++numSavedShared;
        }
      }
      if (saved && producer && producer->getBlock() == &body &&
          resultsOf(producer) == Results::Own && llvm::isa<RankedTensorType>(storage.getType()) &&
          alignedBytes(storage.getType()) == alignedBytes(value.getType()))
        savedResult.try_emplace(storage, static_cast<int64_t>(i));
      if (nn::resultRole(function, i) != nn::Role::Grad || returnCount[value] != 1 || !producer ||
          producer->getBlock() != &body || !llvm::cast<RankedTensorType>(value.getType()).getElementType().isF32())
        continue;
      // Every value from the producer's result to the returned one (views
      // of it) has this one use: nothing else reads the gradient buffer.
      bool onlyReturned = true;
      for (Value v = value;; v = v.getDefiningOp()->getOperand(0)) {
        onlyReturned &= v.hasOneUse();
        if (v == storage || !onlyReturned)
          break;
        onlyReturned &= nn::isView(v.getDefiningOp());
        if (!onlyReturned)
          break;
      }
      if (!onlyReturned)
        continue;
      // (A GEMM not with an epilogue: f(gradient + product) is no accumulation.)
      auto gemm = llvm::dyn_cast<nn::GemmOp>(producer);
      if ((gemm && !gemm.getC() && !gemm.getActivation()) ||
          llvm::isa<nn::ReduceSumOp, nn::LayerNormParamGradOp, nn::BatchNormParamGradOp, nn::ConvWeightGradOp>(
              producer))
        gradientResult[storage] = static_cast<int64_t>(i);
    }
    const llvm::DenseMap<Value, int64_t> bufferResult = buffersUpdatedInPlace(function, ret);

    keepWholeNormGradients(gradientResult);

    std::vector<Interval> intervals;
    llvm::DenseMap<Operation *, SmallVector<Attribute>> storage;
    for (Operation *op : order) {
      if (op->getNumResults() == 0 || resultsOf(op) != Results::Own)
        continue;
      if (op->getParentOp() && llvm::isa<pipe::FusedOp>(op->getParentOp()))
        continue; // computed in registers inside the loop
      auto &places = storage[op];
      for (Value result : op->getResults()) {
        if (!llvm::isa<RankedTensorType>(result.getType())) {
          places.push_back(pipe::StorageAttr::get(context, pipe::StorageKind::Arena, 0));
          continue;
        }
        if (pipe::FusedOp loop = pipe::loopJoinedTo(op); loop && llvm::isa<nn::LayerNormGradOp>(op)) {
          places.push_back(pipe::StorageAttr::get(context, pipe::StorageKind::Register, 0));
        } else if (auto it = savedResult.find(result); it != savedResult.end()) {
          places.push_back(pipe::StorageAttr::get(context, pipe::StorageKind::Saved, it->second));
          ++numSavedInPlace;
        } else if (auto it = gradientResult.find(result); it != gradientResult.end()) {
          places.push_back(pipe::StorageAttr::get(context, pipe::StorageKind::Gradient, it->second));
          ++numAccumulated;
        } else if (auto it = bufferResult.find(result); it != bufferResult.end()) {
          places.push_back(pipe::StorageAttr::get(context, pipe::StorageKind::Buffer, it->second));
        } else {
          places.push_back({}); // filled in below
          intervals.push_back({result, nullptr, position.lookup(op),
                                std::max(position.lookup(op), lastUse.lookup(result)),
                                alignedBytes(result.getType())});
          ++numArenaValues;
        }
      }
    }

    // Kernel scratch: live during its call only, so it overlaps the call's
    // operands and results but may share bytes with anything dead by then.
    int64_t threadScratchBytes = 0;
    for (Operation *op : order) {
      if (op->getParentOp() && llvm::isa<pipe::FusedOp>(op->getParentOp()))
        continue;
      pk::ScratchNeed need;
      try {
        need = kernelScratchOf(op, scratchTarget,
                               op->getNumResults() > 0 && gradientResult.count(op->getResult(0)) > 0);
      } catch (const pk::KernelError &error) {
        return op->emitOpError("has no kernel scratch plan: ") << error.what();
      }
      if (need.empty())
        continue;
      threadScratchBytes = std::max(threadScratchBytes, need.perThread);
      const int64_t at = position.lookup(op);
      intervals.push_back({Value(), op, at, at, need.shared});
      ++numScratchCalls;
    }

    const int64_t arenaBytes = placeGreedily(intervals);
    llvm::DenseMap<Value, int64_t> offsetOf;
    for (const Interval &interval : intervals) {
      if (interval.scratchOf)
        interval.scratchOf->setAttr(pipe::kScratchAttrName,
                                    DenseI64ArrayAttr::get(context, {interval.offset, interval.bytes}));
      else
        offsetOf[interval.root] = interval.offset;
    }
    for (auto &[op, places] : storage) {
      for (auto [i, place] : llvm::enumerate(places))
        if (!place)
          place = pipe::StorageAttr::get(context, pipe::StorageKind::Arena,
                                         offsetOf.lookup(op->getResult(i)));
      op->setAttr(pipe::kStorageAttrName, ArrayAttr::get(context, places));
    }
    function->setAttr(pipe::kArenaSizeAttrName,
                      IntegerAttr::get(IntegerType::get(context, 64), arenaBytes));
    function->setAttr(pipe::kThreadScratchSizeAttrName,
                      IntegerAttr::get(IntegerType::get(context, 64), threadScratchBytes));
    return success();
  }
};

} // namespace

void PlanMemoryOptions::bind(settings::Binder &b) { b.choice(settings::kTarget, target); }

std::unique_ptr<Pass> createPlanMemory(const PlanMemoryOptions &options) {
  return std::make_unique<PlanMemory>(options);
}

} // namespace pipec::passes
