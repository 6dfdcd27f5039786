// pipec-partition: the planner's joint search on the costed graph, recorded
// on the module (pipe.stage, pipe.stages, pipe.plan, and for the job writer
// pipe.plan_file and pipe.schedule); the driver reads the full plan through
// PlanningResult to print it, and may hand its ranking back so that another
// rank is chosen without searching (--each-candidate, docs/planner.md).
#include "passes/Passes.h"
#include "passes/OptionsBinder.h"
#include "passes/Analysis/GradientRoles.h"
#include "passes/JsonResource.h"

#include "analysis/Partition/CostTable.h"
#include "analysis/Partition/Error.h"
#include "analysis/Partition/Partitioner.h"
#include "analysis/Planner/Planner.h"
#include "analysis/Partition/Topology.h"
#include "dialects/nn/NNDialect.h"
#include "dialects/pipe/PipeDialect.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "llvm/ADT/StringMap.h"

#include <nlohmann/json.hpp>

#include <map>

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
  module->setAttr(pipe::kStagesAttrName, builder.getArrayAttr(stages));
  // Constants carry no stage: every stage that reads one rematerializes it.
  module.walk([&](Operation *op) {
    auto cost = op->getAttrOfType<pipe::CostAttr>(pipe::kCostAttrName);
    if (!cost)
      return;
    auto it = stageOfOp.find(cost.getName());
    if (it != stageOfOp.end())
      op->setAttr(pipe::kStageAttrName, builder.getI64IntegerAttr(it->second));
  });
  // Values computed from parameters only (a transposed weight, a shared
  // initializer's view) are computed in each stage that uses them: their
  // gradients are weight gradients, which stay in the stage that computes
  // them; the parameter is then held by several stages and its gradient
  // parts are summed like a tied parameter's (docs/stages.md). Users are
  // visited before producers, so a chain of such ops is copied whole.
  module.walk([&](mlir::func::FuncOp function) {
    GradientRoles roles(function);
    SmallVector<Operation *> ops;
    function.walk([&](Operation *op) { ops.push_back(op); });
    for (Operation *op : llvm::reverse(ops)) {
      auto stage = op->getAttrOfType<IntegerAttr>(pipe::kStageAttrName);
      if (!stage || op->getNumResults() == 0 ||
          !llvm::all_of(op->getResults(), [&](Value v) { return roles.isWeightGradient(v); }))
        continue;
      std::map<int64_t, SmallVector<OpOperand *>> usesByStage;
      for (Value result : op->getResults())
        for (OpOperand &use : result.getUses())
          if (auto userStage = use.getOwner()->getAttrOfType<IntegerAttr>(pipe::kStageAttrName))
            usesByStage[userStage.getInt()].push_back(&use);
      if (usesByStage.empty())
        continue;
      auto first = usesByStage.begin();
      if (first->first > stage.getInt())
        op->setAttr(pipe::kStageAttrName, builder.getI64IntegerAttr(first->first));
      for (auto it = std::next(first); it != usesByStage.end(); ++it) {
        mlir::OpBuilder after(op->getContext());
        after.setInsertionPointAfter(op);
        Operation *copy = after.clone(*op);
        copy->setAttr(pipe::kStageAttrName, builder.getI64IntegerAttr(it->first));
        for (OpOperand *use : it->second)
          use->set(copy->getResult(llvm::cast<OpResult>(use->get()).getResultNumber()));
      }
    }
  });
}

namespace {

/// The planner's request is the pass's options (gpus=1x2 stages=2 ...),
/// bound to the same settings as pipec's flags (Request::bind).
struct AssignStages : PassWithOptions<impl::AssignStagesBase<AssignStages>, planner::Request> {
  AssignStages() : PassWithOptions(defaultPlanningRequest()) {}
  AssignStages(const planner::Request &request, PlanningResult *result,
               std::shared_ptr<const planner::Ranking> ranking)
      : PassWithOptions(request), result(result), ranking(std::move(ranking)) {}

  void runOnOperation() override {
    ModuleOp module = getOperation();
    FailureOr<planner::Request> given = options();
    if (failed(given))
      return signalPassFailure();
    auto table = costTableFromModule(module);
    if (failed(table))
      return signalPassFailure();
    try {
      planner::Request request = *given;
      // Asynchronous schedules keep tied parameters in one stage (Families.h).
      if (request.partition.options.asynchronous ||
          (request.schedule && schedule::scheduleFamily(*request.schedule).asynchronous))
        request.unsplittable = tiedParameterRanges(module);
      // -O2's composites stay whole in the plans the planner searches
      // (docs/cost-model.md, "At -O2"); a partition given as a file is taken
      // as it is, a chain it cuts left unfused.
      if (request.partition.partitionFile.empty())
        for (std::pair<int, int> chain : fusedChainRanges(module))
          request.unsplittable.push_back(chain);
      partition::Topology topology = request.partition.topology();
      std::shared_ptr<const planner::Ranking> searched = ranking;
      if (!searched)
        searched = std::make_shared<const planner::Ranking>(planner::search(*table, request));
      else if (!planner::sameSearch(*searched, *table, request)) {
        module.emitError() << "the ranking given to the partition pass was searched for another cost "
                              "table or planner request";
        return signalPassFailure();
      }
      planner::Plan plan = planner::choose(*searched, request.rank.value_or(1));
      numPlansEvaluated = plan.evaluated;
      annotateStages(module, *table, plan.chosen.partition);
      module->setAttr(pipe::kPlanAttrName, planAttr(plan, request));
      // plan.json without its pipeline section, which the job writer takes
      // from #pipe.plan (its one source: the two cannot disagree).
      nlohmann::json planDocument = plan::toJson(planner::planFile(*table, topology, plan));
      planDocument.erase("pipeline");
      module->setAttr(pipe::kPlanFileAttrName, jsonResource(&getContext(), "pipe_plan_file", planDocument));
      module->setAttr(pipe::kScheduleAttrName, jsonResource(&getContext(), "pipe_schedule",
                                                            nlohmann::json::parse(schedule::toJson(plan.schedule))));
      if (result)
        *result = PlanningResult{std::move(*table), std::move(topology), std::move(plan), std::move(searched)};
    } catch (const partition::MemoryShortfall &error) {
      if (result)
        result->noPlanFitsMemory = true;
      module.emitError() << error.what();
      return signalPassFailure();
    } catch (const partition::Error &error) {
      module.emitError() << error.what();
      return signalPassFailure();
    } catch (const schedule::ScheduleError &error) {
      module.emitError() << "schedule: " << error.what();
      return signalPassFailure();
    } catch (const std::bad_alloc &) {
      module.emitError() << "out of memory while planning";
      return signalPassFailure();
    }
  }

private:
  Attribute planAttr(const planner::Plan &plan, const planner::Request &request) {
    const planner::Candidate &chosen = plan.chosen;
    const partition::PartitionResult &partition = chosen.partition;
    SmallVector<int64_t> recomputed(partition.recomputedStages.begin(),
                                    partition.recomputedStages.end());
    return pipe::PlanAttr::get(
        &getContext(), chosen.schedule, chosen.chunks, chosen.placement,
        chosen.microbatches, partition.asynchronous, std::max(1, partition.inflightMicrobatches),
        partition.asynchronous && request.verticalSync,
        DenseI64ArrayAttr::get(&getContext(), recomputed));
  }

  PlanningResult *result = nullptr;
  std::shared_ptr<const planner::Ranking> ranking; ///< chosen from instead of searching
};

} // namespace
} // namespace pipec::passes

pipec::planner::Request pipec::passes::defaultPlanningRequest() {
  planner::Request request;
  request.partition.gpus = "1x1";
  return request;
}

std::unique_ptr<mlir::Pass> pipec::passes::createPlanning(const planner::Request &request,
                                                          PlanningResult *result,
                                                          std::shared_ptr<const planner::Ranking> ranking) {
  return std::make_unique<AssignStages>(request, result, std::move(ranking));
}
