// pipec-opt: runs any registered pass of pipec on MLIR text, for tests, and
// writes a job from it (pipec-write-job).
#include "compiler/Driver/Registration.h"
#include "compiler/Driver/WriteJob.h"

#include "mlir/IR/DialectRegistry.h"
#include "mlir/Tools/mlir-opt/MlirOptMain.h"

int main(int argc, char **argv) {
  mlir::DialectRegistry registry;
  pipec::registerPipecDialects(registry);
  pipec::registerPipecPasses();
  pipec::registerWriteJobPass();
  return mlir::asMainReturnCode(
      mlir::MlirOptMain(argc, argv, "pipec optimizer driver\n", registry));
}
