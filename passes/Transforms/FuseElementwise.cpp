// pipec-fuse-elementwise: chains of element-wise ops of one shape become one
// pipe.fused loop (docs/optimization.md).
#include "passes/Passes.h"
#include "passes/Transforms/PatternRewrites.h"

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

struct Group {
  SmallVector<Operation *> ops; ///< in program order (a topological order of the body)
  ArrayRef<int64_t> space;
  Operation *anchor = nullptr; ///< the member where the group will be computed (a group merged into another has no ops)
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
    llvm::DenseMap<Operation *, int> groupOf; // op -> index + 1 (0: none)
    // Where the op in `block` that holds `op` will be computed (a grouped
    // op: at its group's anchor), or -1 outside the block.
    auto topPosition = [&](Operation *op) {
      Operation *atTop = op ? block.findAncestorOpInBlock(*op) : nullptr;
      if (!atTop)
        return -1;
      const int g = groupOf.lookup(atTop);
      return position.lookup(g ? groups[g - 1].anchor : atTop);
    };
    // Whether `members` can be computed together where `anchor` is: every
    // operand from outside defined before it, every reader outside after it.
    auto legalAt = [&](ArrayRef<Operation *> members, Operation *anchor) {
      llvm::SmallPtrSet<Operation *, 16> inside(members.begin(), members.end());
      const int at = position.lookup(anchor);
      for (Operation *member : members) {
        for (Value operand : member->getOperands()) {
          Operation *producer = operand.getDefiningOp();
          if (producer && !inside.contains(producer) && topPosition(producer) >= at)
            return false;
        }
        for (Operation *user : member->getUsers())
          if (!inside.contains(user) && topPosition(user) <= at)
            return false;
      }
      return true;
    };
    for (Operation &op : block.without_terminator()) {
      if (!computableInLoop(&op))
        continue;
      auto space = llvm::cast<RankedTensorType>(op.getResult(0).getType()).getShape();
      // The groups op could join: its operands' producers', and failing
      // those a group that reads one of its operands too (siblings: one
      // loop reads the shared operand once).
      SmallVector<int> producers, siblings;
      for (Value operand : op.getOperands()) {
        if (int g = groupOf.lookup(operand.getDefiningOp()); g && groups[g - 1].space == space &&
                                                               !llvm::is_contained(producers, g - 1))
          producers.push_back(g - 1);
        // A whole operand only: a shared broadcast scalar saves no read.
        if (llvm::cast<RankedTensorType>(operand.getType()).getShape() != space)
          continue;
        for (Operation *reader : operand.getUsers())
          if (int g = groupOf.lookup(reader); g && groups[g - 1].space == space &&
                                              !llvm::is_contained(siblings, g - 1))
            siblings.push_back(g - 1);
      }
      int chosen = -1;
      // All the producers' groups and op as one group, at op or at one of
      // their anchors (latest first), else op with one producer group.
      if (producers.size() > 1) {
        SmallVector<Operation *> members;
        for (int g : producers)
          members.append(groups[g].ops.begin(), groups[g].ops.end());
        members.push_back(&op);
        SmallVector<Operation *> anchors{&op};
        for (int g : producers)
          anchors.push_back(groups[g].anchor);
        llvm::sort(anchors, [&](Operation *a, Operation *b) { return position.lookup(a) > position.lookup(b); });
        for (Operation *anchor : anchors)
          if (legalAt(members, anchor)) {
            chosen = mergeGroups(groups, groupOf, producers, anchor, position);
            break;
          }
      }
      for (ArrayRef<int> candidates : {ArrayRef<int>(producers), ArrayRef<int>(siblings)}) {
        for (int g : candidates) {
          if (chosen >= 0)
            break;
          SmallVector<Operation *> members(groups[g].ops);
          members.push_back(&op);
          for (Operation *anchor : {&op, groups[g].anchor})
            if (legalAt(members, anchor)) {
              groups[g].anchor = anchor;
              chosen = g;
              break;
            }
        }
      }
      if (chosen < 0) {
        chosen = static_cast<int>(groups.size());
        groups.push_back({{}, space, &op});
      }
      groups[chosen].ops.push_back(&op);
      groupOf[&op] = chosen + 1;
    }
    // A group nothing outside reads is dead: its ops go, first, so that
    // none stays behind at its old place reading a value that another
    // group (which counted it as a reader at this group's anchor) now
    // computes later.
    for (Group &group : groups)
      if (group.ops.size() >= 2 && isDead(group)) {
        for (Operation *op : llvm::reverse(group.ops))
          op->erase();
        group.ops.clear();
      }
    for (Group &group : groups)
      if (group.ops.size() >= 2)
        outline(group);
  }

  static bool isDead(const Group &group) {
    llvm::SmallPtrSet<Operation *, 16> members(group.ops.begin(), group.ops.end());
    return llvm::all_of(group.ops, [&](Operation *op) {
      return llvm::all_of(op->getUsers(), [&](Operation *user) { return members.contains(user); });
    });
  }

  /// Moves the groups `which` into the first of them, computed at `anchor`;
  /// returns its index.
  static int mergeGroups(std::vector<Group> &groups, llvm::DenseMap<Operation *, int> &groupOf, ArrayRef<int> which,
                         Operation *anchor, const llvm::DenseMap<Operation *, int> &position) {
    Group &into = groups[which.front()];
    for (int g : which.drop_front()) {
      for (Operation *op : groups[g].ops) {
        into.ops.push_back(op);
        groupOf[op] = which.front() + 1;
      }
      groups[g].ops.clear();
    }
    llvm::sort(into.ops, [&](Operation *a, Operation *b) { return position.lookup(a) < position.lookup(b); });
    into.anchor = anchor;
    return which.front();
  }

  /// Replaces each op of a loop's body that computes what an earlier one
  /// does (the same op, operands and attributes) by that one: SwiGLU's
  /// backward recomputes the gate's sigmoid for silu and for its gradient.
  /// Not MLIR's CSE: two dropouts of one value with the same attributes draw
  /// different masks (their keys come from their locations).
  static void computeOnce(Block *body) {
    SmallVector<Operation *> kept;
    for (Operation &op : llvm::make_early_inc_range(body->without_terminator())) {
      if (llvm::isa<nn::DropoutOp, nn::DropoutGradOp>(op))
        continue;
      auto same = llvm::find_if(kept, [&](Operation *earlier) {
        return OperationEquivalence::isEquivalentTo(earlier, &op, OperationEquivalence::IgnoreLocations);
      });
      if (same == kept.end()) {
        kept.push_back(&op);
        continue;
      }
      op.replaceAllUsesWith(*same);
      op.erase();
    }
  }

  /// Moves the group's ops into a pipe.fused at the position of its anchor.
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
    assert(!outputs.empty() && "dead groups are erased before outlining");
    OpBuilder builder(group.anchor);
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
    computeOnce(body);
    ++numFused;
    numFusedOps += group.ops.size();
  }
};

} // namespace
} // namespace pipec::passes
