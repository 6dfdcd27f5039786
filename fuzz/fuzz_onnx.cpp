// libFuzzer target: the ONNX importer, as `pipec MODEL` runs it.
// The input is the model file's bytes: binary protobuf (fuzz_onnx) or the
// ONNX text format (fuzz_onnxtext, built with PIPEC_FUZZ_ONNX_TEXT; the
// importer picks the format by the .onnxtext extension). The same calls as
// compiler/Driver: importOnnxModel on a fresh context, then readInitializerValues (the checks of InitializerReader, which writes a job's weights), and printing the module
// (as --emit=nn does), then the import at another micro-batch size.
#include "FuzzSupport.h"

#include "compiler/Import/OnnxImporter.h"

#include "dialects/nn/NNDialect.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/DialectRegistry.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/Verifier.h"
#include "llvm/Support/raw_ostream.h"

#include <map>
#include <string>
#include <vector>

#ifdef PIPEC_FUZZ_ONNX_TEXT
static const char *const kModelName = "model.onnxtext";
#else
static const char *const kModelName = "model.onnx";
#endif

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const std::string path = pipec::fuzz::writeInput(kModelName, data, size);

  // The dialects the importer creates (pipec's registerPipecDialects adds
  // the pipe dialect, which import never uses; leaving it out keeps the fuzz
  // build from compiling every pass).
  mlir::DialectRegistry registry;
  registry.insert<pipec::nn::NNDialect, mlir::func::FuncDialect>();
  mlir::MLIRContext context(registry, mlir::MLIRContext::Threading::DISABLED);
  context.loadAllAvailableDialects();
  mlir::ScopedDiagnosticHandler quiet(&context, [](mlir::Diagnostic &) { return mlir::success(); });

  std::vector<std::string> errors;
  auto module = pipec::import::importOnnxModel(context, path, pipec::import::ImportOptions(), errors);
  if (!module) {
    if (errors.empty()) pipec::fuzz::violated("importOnnxModel failed without an error message");
    return 0;
  }
  if (!errors.empty()) pipec::fuzz::violated("importOnnxModel returned a module and errors");
  // The importer promises a verified module.
  if (mlir::failed(mlir::verify(*module))) pipec::fuzz::violated("the imported module does not verify");
  llvm::raw_null_ostream sink;
  module->print(sink);

  std::map<std::string, pipec::import::HostTensor> values;
  std::vector<std::string> valueErrors;
  if (!pipec::import::readInitializerValues(path, values, valueErrors) && valueErrors.empty())
    pipec::fuzz::violated("readInitializerValues failed without an error message");

  // Another micro-batch size (as --micro-batch-size or the planner's search
  // asks): a static export is re-specialized (compiler/Import/Respecialize.cpp)
  // or refused with a message; what it returns verifies.
  pipec::import::ImportOptions other;
  other.microbatchSize = 3;
  std::vector<std::string> otherErrors;
  auto respecialized = pipec::import::importOnnxModel(context, path, other, otherErrors);
  if (!respecialized && otherErrors.empty())
    pipec::fuzz::violated("a re-specialized import failed without an error message");
  if (respecialized && mlir::failed(mlir::verify(*respecialized)))
    pipec::fuzz::violated("the re-specialized module does not verify");
  return 0;
}
