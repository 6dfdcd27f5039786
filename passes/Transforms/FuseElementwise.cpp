// pipec-fuse-elementwise: chains of element-wise ops of one shape become one
// pipe.fused loop (docs/optimization.md).
#include "passes/Passes.h"

#include "dialects/nn/NNDialect.h"
#include "dialects/pipe/PipeDialect.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/SetVector.h"

namespace pipec::passes {
#define GEN_PASS_DEF_FUSEELEMENTWISE
#include "passes/Passes.h.inc"
} // namespace pipec::passes

using namespace mlir;

namespace pipec::passes {
namespace {

/// fp32 values, and the bools that comparisons give and wheres read.
bool isStaticF32OrBool(Type type) {
  auto tensor = llvm::dyn_cast<RankedTensorType>(type);
  return tensor && tensor.hasStaticShape() &&
         (tensor.getElementType().isF32() || tensor.getElementType().isInteger(1));
}


/// The ops code generation can compute one element at a time: fp32 or
/// bool in and out, operands broadcasting to the result. nn.dropout (its
/// result and its mask, both of its input's shape) and nn.dropout_grad are
/// element-wise too: element i's mask is the generator's draw i.
bool isFusible(Operation *op) {
  const bool dropout = llvm::isa<nn::DropoutOp, nn::DropoutGradOp>(op);
  if (!dropout && !llvm::isa<nn::UnaryElementwiseOpInterface, nn::BinaryElementwiseOpInterface, nn::WhereOp,
                             nn::UnaryGradOp, nn::BinaryGradOp>(op))
    return false;
  if ((!dropout && op->getNumResults() != 1) || !llvm::all_of(op->getResultTypes(), isStaticF32OrBool))
    return false;
  auto space = llvm::cast<RankedTensorType>(op->getResult(0).getType()).getShape();
  if (!llvm::all_of(op->getResultTypes(),
                    [&](Type type) { return llvm::cast<RankedTensorType>(type).getShape() == space; }))
    return false;
  return llvm::all_of(op->getOperandTypes(), [&](Type type) {
    return isStaticF32OrBool(type) && nn::broadcastsTo(llvm::cast<RankedTensorType>(type).getShape(), space);
  });
}

struct Group {
  SmallVector<Operation *> ops;
  ArrayRef<int64_t> space;
};

struct FuseElementwise : impl::FuseElementwiseBase<FuseElementwise> {
  using Base::Base;

  void runOnOperation() override {
    getOperation().walk([&](func::FuncOp function) {
      // The step's updates are in place; only the model's functions fuse.
      if (function->getParentOfType<pipe::StageOp>() && !function.getBody().empty() &&
          function.getSymName() != "step")
        fuseBlock(function.getBody().front());
    });
  }

  void fuseBlock(Block &block) {
    llvm::DenseMap<Operation *, int> position;
    int index = 0;
    for (Operation &op : block)
      position[&op] = index++;
    std::vector<Group> groups;
    llvm::DenseMap<Operation *, int> groupOf;
    // An op may join a group when no op outside it reads a group value
    // before the op: the group is computed at the position of its last op.
    auto canJoin = [&](const Group &group, Operation *candidate) {
      for (Operation *member : group.ops)
        for (Operation *user : member->getUsers()) {
          if (user == candidate || groupOf.lookup(user) == groupOf.lookup(member))
            continue;
          Operation *atTop = block.findAncestorOpInBlock(*user);
          if (!atTop || position.lookup(atTop) < position.lookup(candidate))
            return false;
        }
      return true;
    };
    for (Operation &op : block.without_terminator()) {
      if (!isFusible(&op))
        continue;
      auto space = llvm::cast<RankedTensorType>(op.getResult(0).getType()).getShape();
      int chosen = -1;
      for (Value operand : op.getOperands()) {
        Operation *producer = operand.getDefiningOp();
        if (!producer || !groupOf.count(producer))
          continue;
        int candidate = groupOf[producer] - 1;
        if (groups[candidate].space == space && canJoin(groups[candidate], &op)) {
          chosen = candidate;
          break;
        }
      }
      if (chosen < 0) {
        chosen = static_cast<int>(groups.size());
        groups.push_back({{}, space});
      }
      groups[chosen].ops.push_back(&op);
      groupOf[&op] = chosen + 1; // 0: no group
    }
    for (Group &group : groups)
      if (group.ops.size() >= 2)
        outline(group);
  }

  /// Moves the group's ops into a pipe.fused at the position of its last op.
  void outline(Group &group) {
    llvm::SmallPtrSet<Operation *, 16> members(group.ops.begin(), group.ops.end());
    llvm::SetVector<Value> inputs;
    SmallVector<Value> outputs;
    for (Operation *op : group.ops) {
      for (Value operand : op->getOperands())
        if (!members.contains(operand.getDefiningOp()))
          inputs.insert(operand);
      for (Value result : op->getResults())
        if (llvm::any_of(result.getUsers(), [&](Operation *user) { return !members.contains(user); }))
          outputs.push_back(result);
    }
    if (outputs.empty())
      return; // dead values: nothing to compute into memory
    Operation *last = group.ops.back();
    OpBuilder builder(last);
    SmallVector<Location> locations;
    for (Operation *op : group.ops)
      locations.push_back(op->getLoc());
    SmallVector<Type> resultTypes;
    for (Value output : outputs)
      resultTypes.push_back(output.getType());
    auto fused = pipe::FusedOp::create(builder, builder.getFusedLoc(locations), resultTypes,
                                       inputs.getArrayRef());
    Block *body = new Block();
    fused.getBody().push_back(body);
    for (Value input : inputs)
      body->addArgument(input.getType(), input.getLoc());
    llvm::DenseMap<Value, unsigned> argumentOf;
    for (auto [i, input] : llvm::enumerate(inputs))
      argumentOf[input] = i;
    for (Operation *op : group.ops) {
      op->moveBefore(body, body->end());
      for (OpOperand &operand : op->getOpOperands())
        if (!members.contains(operand.get().getDefiningOp()))
          operand.set(body->getArgument(argumentOf.lookup(operand.get())));
    }
    OpBuilder atEnd = OpBuilder::atBlockEnd(body);
    pipe::YieldOp::create(atEnd, fused.getLoc(), outputs);
    for (auto [output, result] : llvm::zip(outputs, fused.getResults()))
      output.replaceUsesWithIf(result, [&](OpOperand &use) {
        return !fused->isAncestor(use.getOwner());
      });
    ++numFused;
    numFusedOps += group.ops.size();
  }
};

} // namespace
} // namespace pipec::passes
