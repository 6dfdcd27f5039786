// pipec-verify-pipeline: the stage modules fit together (communication pairs
// up between neighbours, saved values have producers, tied all-reduces and
// weight stashes agree). Reads only; pipec-outline-stages runs it too.
#include "passes/Passes.h"
#include "passes/Transforms/OutlineStages.h"

#include "mlir/IR/Builders.h"
#include "llvm/ADT/StringMap.h"

#include <map>
#include <tuple>

namespace pipec::passes {
#define GEN_PASS_DEF_VERIFYPIPELINE
#include "passes/Passes.h.inc"
} // namespace pipec::passes

using namespace mlir;

namespace pipec::passes::stages {
namespace {

struct Endpoint {
  Operation *op;
  int64_t stage;
  Type type;
};

/// (function, sender, receiver, tag).
using ChannelKey = std::tuple<std::string, int64_t, int64_t, int64_t>;

struct Checker {
  ModuleOp module;
  bool ok = true;
  std::map<int64_t, pipe::StageOp> stages;

  InFlightDiagnostic fail(Operation *op, int64_t stage) {
    ok = false;
    return op->emitError() << "stage " << stage << ": ";
  }

  static StringRef functionOf(Operation *op) {
    auto function = op->getParentOfType<func::FuncOp>();
    return function ? function.getSymName() : StringRef("<none>");
  }

  void checkStages() {
    for (pipe::StageOp stage : module.getOps<pipe::StageOp>()) {
      int64_t id = static_cast<int64_t>(stage.getId());
      if (!stages.emplace(id, stage).second) {
        fail(stage, id) << "stage id " << id << " is used twice";
        continue;
      }
      for (StringRef name : {kForward, kBackwardInput, kBackwardWeight, kStep})
        if (!stageFunction(stage, name))
          fail(stage, id) << "has no @" << name;
      stage.walk([&](Operation *op) {
        if (auto attr = op->getAttrOfType<IntegerAttr>(pipe::kStageAttrName))
          if (attr.getInt() != id)
            fail(op, id) << "'" << op->getName() << "' in @" << functionOf(op)
                         << " belongs to stage " << attr.getInt() << " (pipe.stage)";
      });
    }
    int64_t expected = 0;
    for (auto &[id, stage] : stages) {
      if (id != expected) {
        ok = false;
        module.emitError() << "stage ids must be 0.." << stages.size() - 1 << ": stage "
                           << expected << " is missing";
        break;
      }
      ++expected;
    }
    // Communication outside stages cannot be matched.
    for (Operation &op : module.getBody()->getOperations())
      if (!llvm::isa<pipe::StageOp>(op))
        op.walk([&](Operation *nested) {
          if (llvm::isa<pipe::SendOp, pipe::RecvOp>(nested)) {
            ok = false;
            nested->emitError() << "'" << nested->getName() << "' outside a pipe.stage";
          }
        });
  }

  void checkCommunication() {
    int64_t count = static_cast<int64_t>(stages.size());
    std::map<ChannelKey, SmallVector<Endpoint>> sends, recvs;
    for (auto &[id, stage] : stages) {
      stage.walk([&, id = id](Operation *op) {
        auto send = llvm::dyn_cast<pipe::SendOp>(op);
        auto recv = llvm::dyn_cast<pipe::RecvOp>(op);
        if (!send && !recv)
          return;
        int64_t peer = static_cast<int64_t>(send ? send.getPeer() : recv.getPeer());
        int64_t tag = static_cast<int64_t>(send ? send.getTag() : recv.getTag());
        StringRef function = functionOf(op);
        StringRef what = send ? "pipe.send to" : "pipe.recv from";
        // Activations go forward in @fwd, gradients backward in @bwd_input.
        int64_t direction = function == kForward ? 1 : function == kBackwardInput ? -1 : 0;
        if (direction == 0) {
          fail(op, id) << what << " stage " << peer << " tag " << tag << " in @" << function
                       << ": stages communicate only in @fwd and @bwd_input";
          return;
        }
        int64_t expected = send ? id + direction : id - direction;
        if (peer != expected || peer < 0 || peer >= count) {
          fail(op, id) << what << " stage " << peer << " tag " << tag << " in @" << function
                       << ": the peer must be the neighbour stage " << expected
                       << (expected < 0 || expected >= count ? " (which does not exist)" : "");
          return;
        }
        Type type = send ? send.getValue().getType() : recv.getResult().getType();
        if (send)
          sends[{function.str(), id, peer, tag}].push_back({op, id, type});
        else
          recvs[{function.str(), peer, id, tag}].push_back({op, id, type});
      });
    }
    for (auto &[key, list] : sends) {
      auto &[function, from, to, tag] = key;
      for (size_t i = 1; i < list.size(); ++i)
        fail(list[i].op, from) << "pipe.send to stage " << to << " tag " << tag << " in @"
                               << function << ": the tag is sent " << list.size()
                               << " times on this channel";
      auto it = recvs.find(key);
      if (it == recvs.end()) {
        fail(list.front().op, from) << "pipe.send to stage " << to << " tag " << tag << " in @"
                                    << function << " has no matching pipe.recv in stage " << to;
        continue;
      }
      for (size_t i = 1; i < it->second.size(); ++i)
        fail(it->second[i].op, to) << "pipe.recv from stage " << from << " tag " << tag
                                   << " in @" << function << ": the tag is received "
                                   << it->second.size() << " times on this channel";
      if (it->second.front().type != list.front().type)
        fail(it->second.front().op, to)
            << "pipe.recv from stage " << from << " tag " << tag << " in @" << function
            << " receives " << it->second.front().type << " but stage " << from << " sends "
            << list.front().type;
    }
    for (auto &[key, list] : recvs) {
      auto &[function, from, to, tag] = key;
      if (!sends.count(key))
        fail(list.front().op, to) << "pipe.recv from stage " << from << " tag " << tag << " in @"
                                  << function << " has no matching pipe.send in stage " << from;
    }
  }

  /// Every `pipe.saved` argument has exactly one producer: a result of an
  /// earlier function of the stage with that name and type.
  void checkSavedValues() {
    for (auto &[id, stage] : stages) {
      llvm::StringMap<std::pair<Type, StringRef>> produced;
      for (StringRef name : {kForward, kBackwardInput}) {
        func::FuncOp function = stageFunction(stage, name);
        if (!function)
          continue;
        // Consumers in this function read only what came before.
        if (name == kBackwardInput)
          checkConsumers(id, function, produced);
        for (unsigned i = 0; i < function.getNumResults(); ++i) {
          auto saved = function.getResultAttrOfType<StringAttr>(i, kSaved);
          if (!saved)
            continue;
          auto [it, inserted] =
              produced.try_emplace(saved.getValue(), function.getResultTypes()[i], name);
          if (!inserted)
            fail(function, id) << "saved value '" << saved.getValue() << "' is returned by both @"
                               << it->second.second << " and @" << name;
        }
      }
      if (func::FuncOp weight = stageFunction(stage, kBackwardWeight))
        checkConsumers(id, weight, produced);
      for (StringRef name : {kForward, kStep})
        if (func::FuncOp function = stageFunction(stage, name))
          for (unsigned i = 0; i < function.getNumArguments(); ++i)
            if (function.getArgAttr(i, kSaved))
              fail(function, id) << "@" << name << " cannot take saved values (argument #" << i
                                 << ")";
    }
  }

  void checkConsumers(int64_t id, func::FuncOp function,
                      const llvm::StringMap<std::pair<Type, StringRef>> &produced) {
    for (unsigned i = 0; i < function.getNumArguments(); ++i) {
      auto saved = function.getArgAttrOfType<StringAttr>(i, kSaved);
      if (!saved)
        continue;
      auto it = produced.find(saved.getValue());
      if (it == produced.end())
        fail(function, id) << "@" << function.getSymName() << " argument #" << i
                           << " takes saved value '" << saved.getValue()
                           << "', which no earlier function of the stage returns";
      else if (it->second.first != function.getArgumentTypes()[i])
        fail(function, id) << "@" << function.getSymName() << " argument #" << i
                           << " takes saved value '" << saved.getValue() << "' as "
                           << function.getArgumentTypes()[i] << " but @" << it->second.second
                           << " returns " << it->second.first;
    }
  }

  /// Tied parameters: every stage named by an all-reduce has the same one.
  void checkTiedAllReduces() {
    struct Group {
      pipe::AllReduceOp op;
      int64_t stage;
    };
    llvm::StringMap<SmallVector<Group>> groups;
    for (auto &[id, stage] : stages)
      stage.walk([&, id = id](pipe::AllReduceOp op) {
        if (op.getStages() && op.getName())
          groups[*op.getName()].push_back({op, id});
      });
    for (auto &entry : groups) {
      for (Group &group : entry.second) {
        ArrayRef<int64_t> members = *group.op.getStages();
        if (!llvm::is_contained(members, group.stage))
          fail(group.op, group.stage) << "the all-reduce of tied parameter '" << entry.getKey()
                                      << "' does not name its own stage";
        for (int64_t member : members) {
          if (member == group.stage)
            continue;
          auto match = llvm::find_if(entry.second, [&](Group &other) {
            return other.stage == member && other.op.getStages() == group.op.getStages() &&
                   other.op.getType() == group.op.getType() &&
                   other.op.getReduction() == group.op.getReduction();
          });
          if (match == entry.second.end())
            fail(group.op, group.stage)
                << "the all-reduce of tied parameter '" << entry.getKey() << "' names stage "
                << member << ", which has no matching all-reduce";
        }
      }
    }
  }

  /// Every pipe.restore reads a version its stage's @fwd stashes.
  void checkStashes() {
    for (auto &[id, stage] : stages) {
      llvm::StringMap<pipe::StashOp> stashed;
      if (func::FuncOp forward = stageFunction(stage, kForward))
        forward.walk([&](pipe::StashOp op) { stashed[op.getName()] = op; });
      stage.walk([&, id = id](pipe::StashOp op) {
        if (functionOf(op) != kForward)
          fail(op, id) << "pipe.stash of '" << op.getName() << "' outside @fwd";
      });
      stage.walk([&, id = id](pipe::RestoreOp op) {
        pipe::StashOp stash = stashed.lookup(op.getName());
        if (!stash)
          fail(op, id) << "pipe.restore of '" << op.getName() << "' in @" << functionOf(op)
                       << " has no pipe.stash in @fwd";
        else if (stash.getSlots() != op.getSlots() ||
                 stash.getWeight().getType() != op.getResult().getType())
          fail(op, id) << "pipe.restore of '" << op.getName() << "' in @" << functionOf(op)
                       << " differs from its pipe.stash in slots or type";
      });
    }
  }
};

} // namespace

LogicalResult verifyPipeline(ModuleOp module) {
  Checker checker{module, true, {}};
  checker.checkStages();
  checker.checkCommunication();
  checker.checkSavedValues();
  checker.checkTiedAllReduces();
  checker.checkStashes();
  return success(checker.ok);
}

} // namespace pipec::passes::stages

namespace pipec::passes {
namespace {

struct VerifyPipeline : impl::VerifyPipelineBase<VerifyPipeline> {
  using Base::Base;

  void runOnOperation() override {
    if (failed(stages::verifyPipeline(getOperation())))
      return signalPassFailure();
    markAllAnalysesPreserved();
  }
};

} // namespace
} // namespace pipec::passes
