// pipec-fuse-gemm-epilogue: an element-wise activation that is the only
// reader of a GEMM's result (directly or through views) becomes the GEMM's
// epilogue (docs/optimization.md).
#include "passes/Passes.h"
#include "passes/Transforms/PatternRewrites.h"

#include "dialects/nn/NNDialect.h"
#include "dialects/pipe/PipeDialect.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"

namespace pipec::passes {
#define GEN_PASS_DEF_FUSEGEMMEPILOGUE
#include "passes/Passes.h.inc"
} // namespace pipec::passes

using namespace mlir;

namespace pipec::passes {
namespace {

/// The GEMM whose result reaches `value` through views only, each value on
/// the way read by nothing else; null if there is none.
nn::GemmOp soleGemmProducer(Value value) {
  while (Operation *producer = value.getDefiningOp()) {
    if (auto gemm = llvm::dyn_cast<nn::GemmOp>(producer))
      return gemm.getResult().hasOneUse() && !gemm.getActivation() ? gemm : nn::GemmOp();
    if (!nn::isView(producer) || !producer->getResult(0).hasOneUse())
      return {};
    value = producer->getOperand(0);
  }
  return {};
}

struct FuseGemmEpilogue : impl::FuseGemmEpilogueBase<FuseGemmEpilogue> {
  using Base::Base;

  void runOnOperation() override {
    getOperation().walk([&](func::FuncOp function) {
      if (!function->getParentOfType<pipe::StageOp>() || function.getSymName() == "step")
        return;
      SmallVector<Operation *> activations;
      function.walk([&](nn::UnaryElementwiseOpInterface unary) { activations.push_back(unary); });
      for (Operation *activation : activations) {
        nn::GemmOp gemm = soleGemmProducer(activation->getOperand(0));
        if (!gemm || gemm->getBlock() != activation->getBlock())
          continue;
        // f(g) is computed where g is: it reads nothing else, and the views
        // between them read g alone.
        auto kind = llvm::cast<nn::UnaryElementwiseOpInterface>(activation).getUnaryFunction();
        gemm.setActivationAttr(nn::UnaryFunctionAttr::get(gemm.getContext(), kind));
        // The activation's ONNX node stays named (profiles, --print-locations).
        gemm->setLoc(absorbedLocation(gemm.getLoc(), {activation}));
        activation->getResult(0).replaceAllUsesWith(activation->getOperand(0));
        activation->erase();
        ++numEpilogues;
      }
    });
  }
};

} // namespace
} // namespace pipec::passes
