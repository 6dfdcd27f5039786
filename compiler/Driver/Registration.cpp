#include "compiler/Driver/Registration.h"

#include "dialects/nn/NNDialect.h"
#include "dialects/pipe/PipeDialect.h"
#include "passes/Passes.h"
#include "passes/Pipeline.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/DialectRegistry.h"
#include "mlir/Transforms/Passes.h"

void pipec::registerPipecDialects(mlir::DialectRegistry &registry) {
  registry.insert<nn::NNDialect, pipe::PipeDialect, mlir::func::FuncDialect>();
}

void pipec::registerPipecPasses() {
  // Generic clean-ups that our pipelines use, then pipec's own passes.
  mlir::registerCanonicalizerPass();
  mlir::registerCSEPass();
  mlir::registerSymbolDCEPass();
  passes::registerPipecPasses();
  passes::registerPipecPipeline();
}
