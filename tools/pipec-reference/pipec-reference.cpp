// pipec-reference: runs a model through pipec's reference evaluator, for
// comparisons with onnxruntime (forward) and PyTorch (loss and gradients).
//
//   pipec-reference model.onnx --input x=x.npy [--loss softmax-cross-entropy
//       --input labels=labels.npy] --output-dir DIR
//
// Forward only (no --loss): DIR/output_<name>.npy per model output.
// With --loss: @train_step is derived (pipec-append-loss, pipec-autodiff) and
// DIR/loss.npy, DIR/grad_<parameter>.npy and DIR/buffer_<buffer>.npy are
// written. With --channels-last, pipec-channels-last runs before autodiff.
// Parameters start from the model's initializers. Names are
// sanitized ('/' and other non-alphanumerics become '_'); DIR/index.txt maps
// each file to its name.
#include "compiler/Driver/Registration.h"
#include "compiler/Evaluator/Evaluator.h"
#include "compiler/Evaluator/Kernels.h"
#include "compiler/Import/BatchNormFlag.h"
#include "compiler/Import/OnnxImporter.h"
#include "compiler/Import/Npy.h"
#include "dialects/nn/NNDialect.h"
#include "passes/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Pass/PassManager.h"
#include "analysis/Settings/Declared.h"
#include "passes/OptionsBinder.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/InitLLVM.h"
#include "llvm/Support/raw_ostream.h"

#include <filesystem>
#include <fstream>
#include <map>

namespace cl = llvm::cl;
using pipec::import::HostTensor;

static std::string sanitize(llvm::StringRef name) {
  std::string text;
  for (char c : name)
    text += std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' ? c : '_';
  return text;
}

int main(int argc, char **argv) {
  llvm::InitLLVM init(argc, argv);
  cl::OptionCategory category("pipec-reference options");
  cl::opt<std::string> modelPath(cl::Positional, cl::desc("<model.onnx>"), cl::Required,
                                 cl::cat(category));
  cl::list<std::string> inputs("input", cl::desc("A model input or the labels from a .npy file"),
                               cl::value_desc("name=file.npy"), cl::cat(category));
  // --loss: append it (pipec-append-loss) and compute gradients; without it,
  // forward only.
  std::optional<pipec::Loss> loss;
  pipec::passes::OptionsBinder settings({&cl::SubCommand::getTopLevel()}, category);
  settings.choice(pipec::settings::kLoss, loss);
  uint64_t seed = 0;
  settings.unsigned64(pipec::settings::kSeed, seed);
  std::optional<int64_t> microbatchSize; // the batch dimension of a model that leaves it free
  settings.onInteger(pipec::settings::kMicrobatchSize, [&](int64_t size) { microbatchSize = size; });
  cl::opt<std::string> outputDir("output-dir", cl::desc("Where to write the .npy results"),
                                 cl::Required, cl::cat(category));
  cl::opt<bool> fp64("fp64",
                     cl::desc("Keep every floating value in double instead of rounding it to its "
                              "element type (compare with float64 references)"),
                     cl::cat(category));
  cl::opt<pipec::import::BatchNormStatistics> batchNorm(
      "batchnorm", cl::desc(pipec::import::kBatchNormFlagHelp),
      pipec::import::batchNormFlagValues(), cl::init(pipec::import::BatchNormStatistics::Batch),
      cl::cat(category));
  cl::opt<bool> channelsLast("channels-last",
                             cl::desc("Store convolutional regions channels-last first (pipec-channels-last, "
                                      "as CUDA stages do), to check that pass against the same references"),
                             cl::cat(category));
  cl::HideUnrelatedOptions(category);
  if (!cl::ParseCommandLineOptions(argc, argv, "pipec reference evaluator\n", &llvm::errs()))
    return 2;
  try {
    settings.apply();
  } catch (const pipec::settings::SettingError &error) {
    llvm::errs() << "error: " << error.what() << "\n";
    return 2;
  }

  pipec::eval::setFloatRounding(!fp64);
  auto fail = [](const std::string &message) {
    llvm::errs() << "error: " << message << "\n";
    return 1;
  };
  std::map<std::string, HostTensor> given;
  for (const std::string &spec : inputs) {
    auto equals = spec.find('=');
    if (equals == std::string::npos)
      return fail("--input expects name=file.npy, got '" + spec + "'");
    std::string error;
    auto tensor = pipec::import::readNpy(spec.substr(equals + 1), error);
    if (!tensor)
      return fail(error);
    given[spec.substr(0, equals)] = std::move(*tensor);
  }

  mlir::DialectRegistry registry;
  pipec::registerPipecDialects(registry);
  mlir::MLIRContext context(registry);
  context.loadAllAvailableDialects();
  std::vector<std::string> errors;
  // The initializers from the same parse: the importer may have added some
  // (a BatchNorm statistic's own copy, docs/importer.md).
  std::map<std::string, HostTensor> initializers;
  pipec::import::ImportOptions importOptions;
  importOptions.batchNorm = batchNorm;
  importOptions.microbatchSize = microbatchSize;
  // A model that leaves dimensions free (the batch, a sequence length) is
  // evaluated at the shapes of the arrays given.
  for (const auto &[name, tensor] : given)
    if (name != "labels")
      importOptions.inputShapes[name] = tensor.shape;
  auto module = pipec::import::importOnnxModel(context, modelPath, importOptions, errors);
  if (!module || !pipec::import::readInitializerValues(modelPath, initializers, errors)) {
    for (const auto &error : errors)
      llvm::errs() << "error: " << error << "\n";
    return 1;
  }
  const char *entry = "forward";
  if (loss || channelsLast) {
    mlir::PassManager manager(&context);
    if (loss) {
      pipec::passes::AppendLossOptions lossOptions;
      lossOptions.loss = *loss;
      manager.addPass(pipec::passes::createAppendLoss(lossOptions));
    }
    if (channelsLast)
      manager.addPass(pipec::passes::createChannelsLast());
    if (loss)
      manager.addPass(pipec::passes::createAutodiff());
    if (failed(manager.run(*module)))
      return 1;
    if (loss)
      entry = "train_step";
  }
  auto function = module->lookupSymbol<mlir::func::FuncOp>(entry);
  std::vector<HostTensor> arguments;
  for (unsigned i = 0; i < function.getNumArguments(); ++i) {
    std::string name = function.getArgAttrOfType<mlir::StringAttr>(i, pipec::nn::kNameAttrName).str();
    std::optional<pipec::nn::Role> role = pipec::nn::argumentRole(function, i);
    if (!role)
      return fail("argument '" + name + "' of @" + entry + " has no nn.role");
    bool initializer = role == pipec::nn::Role::Param || role == pipec::nn::Role::Buffer;
    auto source = initializer ? initializers.find(name) : given.find(name);
    if (source == (initializer ? initializers.end() : given.end()))
      return fail("no value for " + pipec::nn::stringifyRole(*role).str() + " '" + name +
                  "' (give --input " + name + "=file.npy)");
    arguments.push_back(source->second);
  }
  pipec::eval::EvalOptions options;
  options.seed = seed;
  auto results = pipec::eval::evaluateFunction(function, arguments, options);
  if (failed(results))
    return 1;
  std::filesystem::create_directories(outputDir.getValue());
  std::ofstream index(std::filesystem::path(outputDir.getValue()) / "index.txt");
  for (unsigned i = 0; i < function.getNumResults(); ++i) {
    std::optional<pipec::nn::Role> role = pipec::nn::resultRole(function, i);
    auto name = function.getResultAttrOfType<mlir::StringAttr>(i, pipec::nn::kNameAttrName);
    std::string file;
    if (!role)
      file = "output_" + sanitize(name ? name.getValue() : std::to_string(i)) + ".npy";
    else if (*role == pipec::nn::Role::Loss)
      file = "loss.npy";
    else if (*role == pipec::nn::Role::Grad)
      file = "grad_" + sanitize(name.getValue()) + ".npy";
    else
      file = "buffer_" + sanitize(name.getValue()) + ".npy";
    std::string error;
    if (!pipec::import::writeNpy((std::filesystem::path(outputDir.getValue()) / file).string(),
                                 (*results)[i], error))
      return fail(error);
    index << file << " " << (name ? name.str() : std::string("loss")) << "\n";
  }
  return 0;
}
