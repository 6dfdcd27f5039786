// pipec-partition: PipeDream's DP on the costed graph, recorded as stage
// attributes (the driver runs the same partition and also writes plan.json).
#include "passes/Passes.h"
#include "passes/Analysis/GradientRoles.h"

#include "compiler/Partition/CostTable.h"
#include "compiler/Partition/Error.h"
#include "compiler/Partition/Partitioner.h"
#include "compiler/Partition/Topology.h"
#include "dialects/nn/NNDialect.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "llvm/ADT/StringMap.h"

namespace pipec::passes {
#define GEN_PASS_DEF_ASSIGNSTAGES
#include "passes/Passes.h.inc"
} // namespace pipec::passes

using namespace mlir;

namespace pipec::passes {

void annotateStages(ModuleOp module, const partition::CostTable &table,
                    const partition::PartitionResult &result) {
  Builder builder(module.getContext());
  llvm::StringMap<int64_t> stageOfOp;
  SmallVector<Attribute> stages;
  for (auto [index, stage] : llvm::enumerate(result.stages)) {
    for (int op = stage.firstOp; op <= stage.lastOp; ++op)
      stageOfOp[table.ops[result.op(op)].name] = static_cast<int64_t>(index);
    SmallVector<int64_t> ranks(stage.ranks.begin(), stage.ranks.end());
    stages.push_back(builder.getDictionaryAttr({
        builder.getNamedAttr("id", builder.getI64IntegerAttr(index)),
        builder.getNamedAttr("first_op", builder.getStringAttr(table.ops[result.op(stage.firstOp)].name)),
        builder.getNamedAttr("last_op", builder.getStringAttr(table.ops[result.op(stage.lastOp)].name)),
        builder.getNamedAttr("replicas", builder.getI64IntegerAttr(stage.replicas)),
        builder.getNamedAttr("ranks", builder.getDenseI64ArrayAttr(ranks)),
    }));
  }
  module->setAttr("pipe.stages", builder.getArrayAttr(stages));
  // Constants carry no stage: every stage that reads one rematerializes it.
  module.walk([&](Operation *op) {
    auto cost = op->getAttrOfType<DictionaryAttr>("pipe.cost");
    if (!cost)
      return;
    auto it = stageOfOp.find(cost.getAs<StringAttr>("name").getValue());
    if (it != stageOfOp.end())
      op->setAttr("pipe.stage", builder.getI64IntegerAttr(it->second));
  });
  // Values computed from parameters only (a transposed weight) are computed
  // in the stage that uses them: their gradients are weight gradients, which
  // stay in the stage that owns the weight (docs/stages.md).
  module.walk([&](mlir::func::FuncOp function) {
    GradientRoles roles(function);
    SmallVector<Operation *> ops;
    function.walk([&](Operation *op) { ops.push_back(op); });
    for (Operation *op : llvm::reverse(ops)) {
      auto stage = op->getAttrOfType<IntegerAttr>("pipe.stage");
      if (!stage || op->getNumResults() == 0 ||
          !llvm::all_of(op->getResults(), [&](Value v) { return roles.isWeightGradient(v); }))
        continue;
      int64_t first = std::numeric_limits<int64_t>::max();
      for (Operation *user : op->getUsers())
        if (auto userStage = user->getAttrOfType<IntegerAttr>("pipe.stage"))
          first = std::min(first, userStage.getInt());
      if (first != std::numeric_limits<int64_t>::max() && first > stage.getInt())
        op->setAttr("pipe.stage", builder.getI64IntegerAttr(first));
    }
  });
}

namespace {

struct AssignStages : impl::AssignStagesBase<AssignStages> {
  using Base::Base;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    auto table = costTableFromModule(module);
    if (failed(table))
      return signalPassFailure();
    try {
      const partition::DevicePreset &preset = partition::requireDevicePreset(device, "device");
      partition::Topology topology =
          partition::makeGpusTopology(partition::parseGpusSpec(gpus), preset);
      partition::PartitionOptions options;
      options.forcedStages = stages;
      options.allowReplication = !noReplication;
      options.microbatches = microbatches;
      if (!memoryLimit.empty())
        options.memoryLimitBytes = partition::parseByteSize(memoryLimit, "memory-limit");
      partition::PartitionResult result = partition::partition(*table, topology, options);
      annotateStages(module, *table, result);
    } catch (const partition::Error &error) {
      module.emitError() << error.what();
      return signalPassFailure();
    }
  }
};

} // namespace
} // namespace pipec::passes
