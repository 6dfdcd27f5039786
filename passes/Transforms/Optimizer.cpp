// pipec-optimizer: @optimizer_step, the parameter update of one optimizer
// step, as nn.adamw_update / nn.sgd_update ops (docs/stages.md).
#include "passes/Passes.h"
#include "passes/OptionsBinder.h"
#include "analysis/Settings/Declared.h"

#include "dialects/nn/NNDialect.h"
#include "dialects/pipe/PipeDialect.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/SymbolTable.h"

namespace pipec::passes {
#define GEN_PASS_DEF_OPTIMIZER
#include "passes/Passes.h.inc"
} // namespace pipec::passes

using namespace mlir;

namespace pipec::passes {
namespace {

struct OptimizerPass : PassWithOptions<impl::OptimizerBase<OptimizerPass>, OptimizerOptions> {
  using PassWithOptions::PassWithOptions;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    MLIRContext *context = module.getContext();
    FailureOr<OptimizerOptions> given = options();
    if (failed(given))
      return signalPassFailure();
    const OptimizerOptions &o = *given;
    const double lr = o.lr, momentum = o.effectiveMomentum(), beta1 = o.beta1, beta2 = o.beta2,
                 epsilon = o.epsilon;
    auto trainStep = module.lookupSymbol<func::FuncOp>("train_step");
    if (!trainStep) {
      module.emitError("pipec-optimizer: no @train_step; run pipec-autodiff first");
      return signalPassFailure();
    }
    if (module.lookupSymbol("optimizer_step")) {
      module.emitError("pipec-optimizer: the module already has @optimizer_step");
      return signalPassFailure();
    }
    if (lr <= 0 || momentum < 0 || beta1 < 0 || beta1 >= 1 || beta2 < 0 || beta2 >= 1 ||
        epsilon <= 0) {
      module.emitError() << "pipec-optimizer: invalid hyper-parameters (lr " << lr
                         << ", momentum " << momentum << ", beta1 " << beta1 << ", beta2 "
                         << beta2 << ", epsilon " << epsilon << ")";
      return signalPassFailure();
    }
    const bool adamw = usesAdam(o.optimizer);
    const double decay = o.effectiveWeightDecay();

    // The trained parameters, in argument order, and their gradients among
    // the results (matched by name).
    Builder builder(context);
    SmallVector<std::pair<StringAttr, Type>> params;
    for (BlockArgument argument : trainStep.getArguments()) {
      unsigned index = argument.getArgNumber();
      if (nn::argumentRole(trainStep, index) != nn::Role::Param)
        continue;
      auto name = trainStep.getArgAttrOfType<StringAttr>(index, nn::kNameAttrName);
      if (!name) {
        trainStep.emitError() << "pipec-optimizer: parameter argument #" << index
                              << " has no nn.name";
        return signalPassFailure();
      }
      bool hasGradient = false;
      for (unsigned result = 0; result < trainStep.getNumResults(); ++result) {
        auto resultName = trainStep.getResultAttrOfType<StringAttr>(result, nn::kNameAttrName);
        if (nn::resultRole(trainStep, result) == nn::Role::Grad && resultName == name) {
          hasGradient = true;
          if (trainStep.getResultTypes()[result] != argument.getType()) {
            trainStep.emitError() << "pipec-optimizer: the gradient of '" << name.getValue()
                                  << "' has type " << trainStep.getResultTypes()[result]
                                  << ", the parameter " << argument.getType();
            return signalPassFailure();
          }
        }
      }
      if (!hasGradient) {
        trainStep.emitError() << "pipec-optimizer: parameter '" << name.getValue()
                              << "' has no gradient among @train_step's results";
        return signalPassFailure();
      }
      params.push_back({name, argument.getType()});
    }

    SmallVector<pipe::OptimizerState> stateNames =
        adamw ? SmallVector<pipe::OptimizerState>{pipe::OptimizerState::ExpAvg,
                                                  pipe::OptimizerState::ExpAvgSq}
              : SmallVector<pipe::OptimizerState>{pipe::OptimizerState::MomentumBuffer};
    auto attrs = [&](StringAttr name, nn::Role role,
                     std::optional<pipe::OptimizerState> state = std::nullopt) {
      SmallVector<NamedAttribute> list{builder.getNamedAttr(nn::kNameAttrName, name),
                                       nn::roleAttribute(context, role)};
      if (state)
        list.push_back(builder.getNamedAttr(pipe::kStateAttrName,
                                            pipe::OptimizerStateAttr::get(context, *state)));
      return builder.getDictionaryAttr(list);
    };
    SmallVector<Type> argTypes, resultTypes;
    SmallVector<Attribute> argAttrs, resultAttrs;
    for (auto &[name, type] : params) {
      argTypes.push_back(type);
      argAttrs.push_back(attrs(name, nn::Role::Param));
    }
    for (auto &[name, type] : params) {
      argTypes.push_back(type);
      argAttrs.push_back(attrs(name, nn::Role::Grad));
    }
    for (auto &[name, type] : params)
      for (pipe::OptimizerState state : stateNames) {
        argTypes.push_back(type);
        argAttrs.push_back(attrs(name, nn::Role::OptimizerState, state));
      }
    argTypes.push_back(builder.getI64Type());
    argAttrs.push_back(builder.getDictionaryAttr(
        {nn::roleAttribute(context, nn::Role::Step)}));
    for (auto &[name, type] : params) {
      resultTypes.push_back(type);
      resultAttrs.push_back(attrs(name, nn::Role::Param));
    }
    for (auto &[name, type] : params)
      for (pipe::OptimizerState state : stateNames) {
        resultTypes.push_back(type);
        resultAttrs.push_back(attrs(name, nn::Role::OptimizerState, state));
      }

    OpBuilder moduleBuilder = OpBuilder::atBlockEnd(module.getBody());
    Location loc = trainStep.getLoc();
    auto function = func::FuncOp::create(moduleBuilder, loc, "optimizer_step",
                                         builder.getFunctionType(argTypes, resultTypes));
    function.setAllArgAttrs(argAttrs);
    function.setAllResultAttrs(resultAttrs);
    // SGD has no betas or epsilon and AdamW no momentum: those read 0.
    function->setAttr(
        pipe::kOptimizerAttrName,
        pipe::OptimizerAttr::get(
            context, adamw ? pipe::OptimizerKind::AdamW : pipe::OptimizerKind::Sgd,
            APFloat(static_cast<double>(lr)), APFloat(adamw ? 0.0 : static_cast<double>(momentum)),
            APFloat(decay), APFloat(adamw ? static_cast<double>(beta1) : 0.0),
            APFloat(adamw ? static_cast<double>(beta2) : 0.0),
            APFloat(adamw ? static_cast<double>(epsilon) : 0.0),
            static_cast<int64_t>(stateNames.size())));

    Block *entry = function.addEntryBlock();
    OpBuilder body = OpBuilder::atBlockEnd(entry);
    size_t count = params.size(), perParam = stateNames.size();
    Value step = entry->getArgument(entry->getNumArguments() - 1);
    SmallVector<Value> newParams, newState;
    for (size_t i = 0; i < count; ++i) {
      Value param = entry->getArgument(i), grad = entry->getArgument(count + i);
      Value state0 = entry->getArgument(2 * count + i * perParam);
      if (adamw) {
        Value state1 = entry->getArgument(2 * count + i * perParam + 1);
        auto update = nn::AdamWUpdateOp::create(
            body, loc, TypeRange{param.getType(), param.getType(), param.getType()}, param, grad,
            state0, state1, step, builder.getF32FloatAttr(lr), builder.getF32FloatAttr(beta1),
            builder.getF32FloatAttr(beta2), builder.getF32FloatAttr(epsilon),
            builder.getF32FloatAttr(decay));
        update->setAttr(nn::kNameAttrName, params[i].first);
        newParams.push_back(update.getNewParam());
        newState.push_back(update.getNewM());
        newState.push_back(update.getNewV());
      } else {
        auto update = nn::SgdUpdateOp::create(
            body, loc, TypeRange{param.getType(), param.getType()}, param, grad, state0, step,
            builder.getF32FloatAttr(lr), builder.getF32FloatAttr(momentum),
            builder.getF32FloatAttr(decay));
        update->setAttr(nn::kNameAttrName, params[i].first);
        newParams.push_back(update.getNewParam());
        newState.push_back(update.getNewMomentumBuffer());
      }
      ++numUpdates;
    }
    SmallVector<Value> results(newParams);
    results.append(newState);
    func::ReturnOp::create(body, loc, results);
  }

};

} // namespace

void OptimizerOptions::bind(settings::Binder &b) {
  b.choice(settings::kOptimizer, optimizer);
  b.real(settings::kLearningRate, lr);
  b.real(settings::kMomentum, momentum);
  b.real(settings::kWeightDecay, weightDecay);
  b.real(settings::kBeta1, beta1);
  b.real(settings::kBeta2, beta2);
  b.real(settings::kEpsilon, epsilon);
}

double OptimizerOptions::effectiveMomentum() const {
  return optimizer == ::pipec::Optimizer::SgdMomentum && momentum == 0.0 ? OptimizerDefaults::sgdMomentum : momentum;
}

double OptimizerOptions::effectiveWeightDecay() const {
  return weightDecay >= 0 ? weightDecay : OptimizerDefaults::weightDecay(usesAdam(optimizer));
}

std::unique_ptr<Pass> createOptimizer(const OptimizerOptions &options) {
  return std::make_unique<OptimizerPass>(options);
}

} // namespace pipec::passes
