// pipec-opt: runs any registered pass of pipec on MLIR text, for tests.
#include "compiler/Driver/Registration.h"

#include "mlir/IR/DialectRegistry.h"
#include "mlir/Tools/mlir-opt/MlirOptMain.h"

int main(int argc, char **argv) {
  mlir::DialectRegistry registry;
  pipec::registerPipecDialects(registry);
  pipec::registerPipecPasses();
  return mlir::asMainReturnCode(
      mlir::MlirOptMain(argc, argv, "pipec optimizer driver\n", registry));
}
