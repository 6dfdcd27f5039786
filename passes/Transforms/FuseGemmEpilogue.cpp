// pipec-fuse-gemm-epilogue: an element-wise activation of a GEMM's result
// (directly or through views) becomes the GEMM's epilogue, the GEMM also
// returning the activation's input when something else reads it; an
// activation's gradient whose incoming gradient is a GEMM's product becomes
// one nn.gemm_activation_grad (docs/optimization.md).
#include "passes/OptionsBinder.h"
#include "passes/Passes.h"
#include "passes/Transforms/PatternRewrites.h"
#include "analysis/Settings/Declared.h"

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
/// the way read by nothing else (`soleReader`) or by anything; null if
/// there is none, or if it already has an epilogue.
nn::GemmOp gemmProducer(Value value, bool soleReader) {
  while (Operation *producer = value.getDefiningOp()) {
    if (auto gemm = llvm::dyn_cast<nn::GemmOp>(producer))
      return (!soleReader || gemm.getResult().hasOneUse()) && !gemm.getActivation() ? gemm : nn::GemmOp();
    if (!nn::isView(producer) || (soleReader && !producer->getResult(0).hasOneUse()))
      return {};
    value = producer->getOperand(0);
  }
  return {};
}

struct FuseGemmEpilogue : PassWithOptions<impl::FuseGemmEpilogueBase<FuseGemmEpilogue>, FuseGemmEpilogueOptions> {
  using PassWithOptions::PassWithOptions;

  void runOnOperation() override {
    FailureOr<FuseGemmEpilogueOptions> given = options();
    if (failed(given))
      return signalPassFailure();
    // On CUDA an activation cuBLASLt does not apply would be a kernel after
    // the GEMM anyway: left alone, element-wise fusion puts it in the loop
    // of its readers (SwiGLU's sigmoid with its products).
    const bool libraryEpiloguesOnly = given->target == Target::Cuda;
    getOperation().walk([&](func::FuncOp function) {
      if (!function->getParentOfType<pipe::StageOp>() || function.getSymName() == "step")
        return;
      SmallVector<Operation *> activations;
      function.walk([&](nn::UnaryElementwiseOpInterface unary) {
        if (!libraryEpiloguesOnly || cudaGemmEpilogueApplies(unary.getUnaryFunction()))
          activations.push_back(unary);
      });
      for (Operation *activation : activations)
        if (!fuseActivation(activation))
          fuseKeepingInput(activation);
      SmallVector<nn::UnaryGradOp> gradients;
      function.walk([&](nn::UnaryGradOp grad) {
        if (!libraryEpiloguesOnly || cudaGemmEpilogueApplies(grad.getKind()))
          gradients.push_back(grad);
      });
      for (nn::UnaryGradOp grad : gradients)
        fuseActivationGrad(grad);
    });
  }

  /// f(g), g a GEMM's result read by f alone: f is computed where g is (it
  /// reads nothing else, and the views between them read g alone).
  bool fuseActivation(Operation *activation) {
    nn::GemmOp gemm = gemmProducer(activation->getOperand(0), /*soleReader=*/true);
    if (!gemm || gemm->getBlock() != activation->getBlock())
      return false;
    auto kind = llvm::cast<nn::UnaryElementwiseOpInterface>(activation).getUnaryFunction();
    gemm.setActivationAttr(nn::UnaryFunctionAttr::get(gemm.getContext(), kind));
    // The activation's ONNX node stays named (profiles, --print-locations).
    gemm->setLoc(absorbedLocation(gemm.getLoc(), {activation}));
    activation->getResult(0).replaceAllUsesWith(activation->getOperand(0));
    activation->erase();
    ++numEpilogues;
    return true;
  }

  /// f(g), g a GEMM's result that something else reads too (f's gradient,
  /// which reads f's input): one GEMM returns f(g) and g
  /// (keeps_pre_activation), the readers of g take the second.
  void fuseKeepingInput(Operation *activation) {
    nn::GemmOp gemm = gemmProducer(activation->getOperand(0), /*soleReader=*/false);
    if (!gemm || gemm->getBlock() != activation->getBlock())
      return;
    auto kind = llvm::cast<nn::UnaryElementwiseOpInterface>(activation).getUnaryFunction();
    OpBuilder builder(gemm);
    auto fused = nn::GemmOp::create(builder, absorbedLocation(gemm.getLoc(), {activation}), gemm.getA(), gemm.getB(),
                                    gemm.getC(), gemm.getAlphaAttr(), gemm.getBetaAttr(), gemm.getTransAAttr(),
                                    gemm.getTransBAttr(), nn::UnaryFunctionAttr::get(gemm.getContext(), kind),
                                    builder.getBoolAttr(true));
    inheritPlacement(gemm, fused, /*withCost=*/true);
    gemm.getResult().replaceAllUsesWith(fused.getPreActivation());
    gemm.erase();
    // f of a view of g is the same view of f(g).
    builder.setInsertionPointAfter(fused);
    Value activated = reshapeTo(builder, fused, fused.getResult(),
                                llvm::cast<RankedTensorType>(activation->getResult(0).getType()).getShape());
    activation->getResult(0).replaceAllUsesWith(activated);
    activation->erase();
    ++numEpilogues;
  }

  /// f'(x) · dy, dy a GEMM's product (no C, no epilogue) read by the
  /// gradient alone: one nn.gemm_activation_grad.
  void fuseActivationGrad(nn::UnaryGradOp grad) {
    Value x = grad.getX();
    nn::GemmOp gemm = gemmProducer(grad.getDy(), /*soleReader=*/true);
    if (!x || grad.getY() || !gemm || gemm.getC() || gemm->getBlock() != grad->getBlock() ||
        !derivativeReadsInput(grad.getKind()))
      return;
    SmallVector<Operation *> product; // the gradient's dy back to the GEMM: each read by the next alone
    for (Value dy = grad.getDy(); dy.getDefiningOp() != gemm; dy = dy.getDefiningOp()->getOperand(0))
      product.push_back(dy.getDefiningOp());
    product.push_back(gemm);
    OpBuilder builder(grad);
    auto productType = llvm::cast<RankedTensorType>(gemm.getResult().getType());
    Value x2d = reshapeTo(builder, grad, x, productType.getShape());
    auto fused = nn::GemmActivationGradOp::create(builder, absorbedLocation(grad.getLoc(), {gemm}), gemm.getA(),
                                                  gemm.getB(), x2d, gemm.getAlphaAttr(), gemm.getTransAAttr(),
                                                  gemm.getTransBAttr(),
                                                  nn::UnaryFunctionAttr::get(grad.getContext(), grad.getKind()));
    inheritPlacement(grad, fused, /*withCost=*/true);
    Value result = reshapeTo(builder, grad, fused.getResult(), grad.getResult().getType().getShape());
    grad.getResult().replaceAllUsesWith(result);
    grad.erase();
    for (Operation *op : product) // the views, then the GEMM: now read by nothing
      op->erase();
    ++numEpilogues;
  }
};

} // namespace

void FuseGemmEpilogueOptions::bind(settings::Binder &b) { b.choice(settings::kTarget, target); }

std::unique_ptr<Pass> createFuseGemmEpilogue(const FuseGemmEpilogueOptions &options) {
  return std::make_unique<FuseGemmEpilogue>(options);
}

} // namespace pipec::passes
