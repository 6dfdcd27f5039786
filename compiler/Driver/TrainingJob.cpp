#include "compiler/Driver/TrainingJob.h"

#include "compiler/Emit/EmitStage.h"
#include "compiler/Import/OnnxImporter.h"
#include "analysis/Partition/Partitioner.h"
#include "dialects/nn/NNDialect.h"
#include "runtime/include/pipec/vocabulary.h"
#include "dialects/pipe/PipeDialect.h"
#include "passes/Pipeline.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Pass/PassManager.h"
#include "llvm/Support/raw_ostream.h"

#include "pipec/tensor_file.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>

using namespace mlir;
namespace fs = std::filesystem;

namespace pipec {

namespace {

const char *dtypeName(Type element) {
  if (element.isF32()) return "f32";
  if (element.isF64()) return "f64";
  if (element.isInteger(64)) return "i64";
  if (element.isInteger(32)) return "i32";
  return "bool";
}

int dtypeCode(Type element) {
  if (element.isF32()) return PIPEC_F32;
  if (element.isF64()) return PIPEC_F64;
  if (element.isInteger(64)) return PIPEC_I64;
  if (element.isInteger(32)) return PIPEC_I32;
  return PIPEC_BOOL;
}

/// The values of a data field for the synthetic data set: indices into an
/// embedding take its rows, labels the loss's classes.
std::pair<double, double> valueRange(func::FuncOp forward, BlockArgument field) {
  for (Operation *user : field.getUsers()) {
    if (auto gather = llvm::dyn_cast<nn::GatherOp>(user); gather && gather.getIndices() == field)
      return {0, static_cast<double>(gather.getData().getType().getDimSize(
                     *nn::normalizeAxis(gather.getAxis(), gather.getData().getType().getRank())))};
    if (auto reshape = llvm::dyn_cast<nn::ReshapeOp>(user))
      for (Operation *next : reshape.getResult().getUsers())
        if (auto loss = llvm::dyn_cast<nn::SoftmaxCrossEntropyLossOp>(next))
          return {0, static_cast<double>(loss.getScores().getType().getDimSize(1))};
    if (auto loss = llvm::dyn_cast<nn::SoftmaxCrossEntropyLossOp>(user))
      return {0, static_cast<double>(loss.getScores().getType().getDimSize(1))};
  }
  if (llvm::isa<FloatType>(llvm::cast<ShapedType>(field.getType()).getElementType()))
    return {-1, 1};
  return {0, 2};
}

bool cudaTarget(const CompileOptions &options) { return options.target == Target::Cuda; }

/// The host compiler's optimisation flags for a CPU stage (pipec --build and
/// the stages' CMakeLists.txt alike). -O3 with -fno-trapping-math lets GCC
/// vectorize the fused element-wise loops, whose selects (ReLU and its
/// gradient) it otherwise keeps as branches; neither flag, nor
/// -fno-math-errno, changes a result, and -ffp-contract=off keeps a
/// user's -march from fusing a multiply-add (docs/optimization.md,
/// "Compiling the stage").
constexpr const char *kCpuStageOptimizeFlags = "-O3 -fno-math-errno -fno-trapping-math -ffp-contract=off";

/// nvcc's -gencode for each architecture ("sm_90" -> compute_90 / sm_90).
std::string gencodeFlags(const std::vector<std::string> &archs) {
  std::string flags;
  for (const auto &arch : archs) {
    std::string number = arch.substr(3);
    flags += " -gencode arch=compute_" + number + ",code=" + arch;
  }
  return flags;
}

/// `text` as one word of a POSIX shell command: single-quoted, each `'`
/// closed, escaped and reopened, so that no byte of it reaches the shell.
std::string shellQuoted(const std::string &text) {
  std::string word = "'";
  for (char c : text)
    word += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return word + "'";
}

/// A path as one shell word (shellQuoted), never read as an option
/// (`--out -fplugin=...`).
std::string shellWord(const fs::path &path) {
  std::string text = path.string();
  return shellQuoted(!text.empty() && text[0] == '-' ? "./" + text : text);
}

/// `-DPIPEC_STAGE_DIR="<the source's folder>"`, one shell word: where the
/// source's `.incbin` finds its constants file (docs/optimization.md).
std::string stageDirDefine(const fs::path &source) {
  return shellQuoted("-DPIPEC_STAGE_DIR=\"" + fs::absolute(source).parent_path().string() + "\"");
}

/// The compiler command that turns a generated stage into a library.
std::string buildCommand(const CompileOptions &options, const fs::path &source,
                         const fs::path &library) {
  if (!cudaTarget(options))
    return std::string("c++ ") + kCpuStageOptimizeFlags +
           " -std=c++17 -fPIC -shared -I" PIPEC_RUNTIME_INCLUDE_DIR " -I" PIPEC_CPU_KERNELS_INCLUDE_DIR " " +
           stageDirDefine(source) + " " + shellWord(source) + " '" PIPEC_CPU_KERNELS_LIBRARY "' " PIPEC_BLAS_LINK_FLAGS " -fopenmp -o " +
           shellWord(library) + " 2>&1";
#ifdef PIPEC_CUDA_KERNELS_LIBRARY
  return std::string(PIPEC_NVCC " -O2 -std=c++17 --expt-relaxed-constexpr -Xcompiler -fPIC "
                     "-shared -I" PIPEC_RUNTIME_INCLUDE_DIR " -I" PIPEC_CPU_KERNELS_INCLUDE_DIR
                     " -I" PIPEC_CUDA_KERNELS_INCLUDE_DIR) +
         gencodeFlags(options.cudaArchs) + " " + stageDirDefine(source) + " " + shellWord(source) +
         " '" PIPEC_CUDA_KERNELS_LIBRARY "' -L" PIPEC_CUDA_LIBRARY_DIR
         " -Xlinker -rpath -Xlinker " PIPEC_CUDA_LIBRARY_DIR
         " -Xlinker --no-undefined -lcublasLt -lcublas -lcudart -o " + shellWord(library) + " 2>&1";
#else
  return "";
#endif
}

/// The stages' CMakeLists.txt for building them outside pipec.
std::string stagesCMakePrologue(const CompileOptions &options) {
  std::string cmake = "# Builds the stage libraries outside pipec (pipec --build does the same).\n"
                      "cmake_minimum_required(VERSION 3.20)\n";
  if (!cudaTarget(options))
    return cmake + "project(pipec_stages CXX)\nset(CMAKE_CXX_STANDARD 17)\n"
                   "find_package(OpenMP REQUIRED COMPONENTS CXX) # the kernels' parallel loops\n"
                   "set(PIPEC_RUNTIME_INCLUDE_DIR \"" PIPEC_RUNTIME_INCLUDE_DIR "\" CACHE PATH \"\")\n"
                   "set(PIPEC_CPU_KERNELS_INCLUDE_DIR \"" PIPEC_CPU_KERNELS_INCLUDE_DIR "\" CACHE PATH \"\")\n"
                   "set(PIPEC_CPU_KERNELS_LIBRARY \"" PIPEC_CPU_KERNELS_LIBRARY "\" CACHE FILEPATH \"\")\n";
  std::string archs;
  for (const auto &arch : options.cudaArchs)
    archs += (archs.empty() ? "" : ";") + arch.substr(3);
  return cmake + "project(pipec_stages CXX CUDA)\nset(CMAKE_CXX_STANDARD 17)\n"
                 "set(CMAKE_CUDA_STANDARD 17)\nset(CMAKE_CUDA_ARCHITECTURES \"" + archs + "\")\n"
                 "find_package(CUDAToolkit REQUIRED)\n"
                 "set(PIPEC_RUNTIME_INCLUDE_DIR \"" PIPEC_RUNTIME_INCLUDE_DIR "\" CACHE PATH \"\")\n"
                 "set(PIPEC_KERNELS_INCLUDE_DIRS \"" PIPEC_CPU_KERNELS_INCLUDE_DIR ";"
#ifdef PIPEC_CUDA_KERNELS_LIBRARY
                 PIPEC_CUDA_KERNELS_INCLUDE_DIR "\" CACHE STRING \"\")\n"
                 "set(PIPEC_CUDA_KERNELS_LIBRARY \"" PIPEC_CUDA_KERNELS_LIBRARY "\" CACHE FILEPATH \"\")\n";
#else
                 "\" CACHE STRING \"\")\n"
                 "set(PIPEC_CUDA_KERNELS_LIBRARY \"libpipec_cuda_kernels.a\" CACHE FILEPATH \"\")\n";
#endif
}

} // namespace

FailureOr<plan::Runtime> writeTrainingJob(ModuleOp module, const CompileOptions &options,
                                          const std::map<std::string, import::HostTensor> &initialValues,
                                          raw_ostream &outs, raw_ostream &errs) {
  plan::Runtime runtime;
  fs::path directory = options.partition().outDir;
  std::error_code error;
  fs::create_directories(directory / "stages", error);
  fs::create_directories(directory / "weights", error);
  if (error) {
    errs << "error: cannot create " << directory.string() << ": " << error.message() << "\n";
    return failure();
  }
  const std::map<std::string, import::HostTensor> &initial = initialValues;

  SmallVector<pipe::StageOp> stages(module.getOps<pipe::StageOp>());
  std::string cmake = stagesCMakePrologue(options);
  emit::StageTarget stageTarget;
  stageTarget.target = options.target;
  stageTarget.precision = options.costs.precision;
  const std::string extension = cudaTarget(options) ? ".cu" : ".cpp";
  for (pipe::StageOp stage : stages) {
    int64_t id = stage.getId();
    std::string stem = "stage_" + std::to_string(id);
    fs::path source = directory / "stages" / (stem + extension);
    stageTarget.constantsFile = stem + ".constants.bin";
    {
      std::string code, constantBytes;
      llvm::raw_string_ostream stream(code);
      if (failed(emit::emitStage(stage, static_cast<int>(stages.size()), stageTarget, stream,
                                 &constantBytes)))
        return failure();
      std::ofstream(source) << code;
      // Always written (maybe empty), so the build's dependency on it holds.
      std::ofstream(directory / "stages" / stageTarget.constantsFile, std::ios::binary)
          << constantBytes;
    }
    const bool cuda = cudaTarget(options);
    cmake += "add_library(" + stem + " SHARED " + stem + extension + ")\n"
             "set_target_properties(" + stem + " PROPERTIES OUTPUT_NAME " + stem + ")\n";
    cmake += "target_compile_options(" + stem + " PRIVATE " +
             (cuda ? std::string("--expt-relaxed-constexpr") : std::string(kCpuStageOptimizeFlags)) + ")\n";
    // The source embeds its large constants from the file beside it (.incbin).
    cmake += "target_compile_definitions(" + stem +
             " PRIVATE \"PIPEC_STAGE_DIR=\\\"${CMAKE_CURRENT_SOURCE_DIR}\\\"\")\n"
             "set_source_files_properties(" + stem + extension +
             " PROPERTIES OBJECT_DEPENDS \"${CMAKE_CURRENT_SOURCE_DIR}/" + stageTarget.constantsFile +
             "\")\n";
    cmake += "target_include_directories(" + stem + " PRIVATE ${PIPEC_RUNTIME_INCLUDE_DIR} " +
             (cuda ? "${PIPEC_KERNELS_INCLUDE_DIRS})\n" : "${PIPEC_CPU_KERNELS_INCLUDE_DIR})\n") +
             "target_link_libraries(" + stem + " PRIVATE " +
             (cuda ? "${PIPEC_CUDA_KERNELS_LIBRARY} CUDA::cublasLt CUDA::cublas CUDA::cudart)\n"
                   : "${PIPEC_CPU_KERNELS_LIBRARY} openblas OpenMP::OpenMP_CXX)\n");

    // Initial weights: every parameter and buffer the stage's functions read.
    std::vector<io::Tensor> tensors;
    std::set<std::string> seen;
    stage.walk([&](func::FuncOp function) {
      for (unsigned i = 0; i < function.getNumArguments(); ++i) {
        std::optional<nn::Role> role = nn::argumentRole(function, i);
        auto name = function.getArgAttrOfType<StringAttr>(i, "nn.name");
        if ((role != nn::Role::Param && role != nn::Role::Buffer) ||
            !seen.insert(name.str()).second)
          continue;
        auto type = llvm::cast<RankedTensorType>(function.getArgument(i).getType());
        const import::HostTensor &value = initial.at(name.str());
        io::Tensor tensor;
        tensor.name = name.str();
        tensor.dtype = dtypeCode(type.getElementType());
        tensor.shape.assign(type.getShape().begin(), type.getShape().end());
        tensor.data.resize(tensor.bytes());
        for (int64_t e = 0; e < value.numElements(); ++e) {
          float converted = static_cast<float>(value.asDouble(e));
          std::memcpy(tensor.data.data() + e * sizeof(float), &converted, sizeof(float));
        }
        tensors.push_back(std::move(tensor));
      }
    });
    fs::path weights = directory / "weights" / (stem + ".bin");
    try {
      io::writeTensorFile(weights.string(), tensors);
    } catch (const std::exception &failure) {
      errs << "error: " << failure.what() << "\n";
      return mlir::failure();
    }
    plan::StageFiles files{id, "stages/lib" + stem + ".so", "weights/" + stem + ".bin"};
    // The static memory plan, as pipec-plan-memory recorded it (-O2 only).
    stage.walk([&](func::FuncOp function) {
      if (auto size = function->getAttrOfType<IntegerAttr>(pipe::kArenaSizeAttrName)) {
        files.entryArenaBytes[function.getSymName().str()] = size.getInt();
        files.arenaBytes = std::max<int64_t>(files.arenaBytes.value_or(0), size.getInt());
        files.scratchBytes = files.scratchBytes.value_or(0);
      }
      if (auto size = function->getAttrOfType<IntegerAttr>(pipe::kThreadScratchSizeAttrName))
        files.threadScratchBytes = std::max<int64_t>(files.threadScratchBytes.value_or(0), size.getInt());
    });
    stage.walk([&](Operation *op) {
      if (auto place = op->getAttrOfType<DenseI64ArrayAttr>(pipe::kScratchAttrName); place && place.size() == 2)
        files.scratchBytes = std::max<int64_t>(files.scratchBytes.value_or(0), place[1]);
    });
    runtime.stages.push_back(std::move(files));
    if (options.build) {
      fs::path library = directory / "stages" / ("lib" + stem + ".so");
      std::string folder = fs::absolute(source).parent_path().string();
      if (folder.find_first_of("\"\\\n") != std::string::npos) {
        errs << "error: --out " << directory.string()
             << ": the path holds a double quote, a backslash or a newline, which the stage "
                "source's .incbin of its constants file cannot name\n";
        return mlir::failure();
      }
      std::string command = buildCommand(options, source, library);
      FILE *pipe = popen(command.c_str(), "r");
      std::string output;
      char buffer[512];
      while (pipe && fgets(buffer, sizeof buffer, pipe))
        output += buffer;
      int status = pipe ? pclose(pipe) : -1;
      if (status != 0) {
        // The first lines say what went wrong; the rest repeats it.
        size_t cut = 0;
        for (int line = 0; line < 12 && cut != std::string::npos; ++line)
          cut = output.find('\n', cut + 1);
        errs << "error: compiling " << source.string() << " failed (" << command << "):\n"
             << output.substr(0, cut) << "\n";
        return failure();
      }
    }
  }
  std::ofstream(directory / "stages" / "CMakeLists.txt") << cmake;

  // The data set: the model's inputs and labels, one sample each.
  auto train = module.lookupSymbol<func::FuncOp>("forward");
  int64_t microbatchSize = 0;
  for (BlockArgument argument : train.getArguments()) {
    std::optional<nn::Role> role = nn::argumentRole(train, argument.getArgNumber());
    if (role != nn::Role::Input && role != nn::Role::Label)
      continue;
    auto type = llvm::cast<RankedTensorType>(argument.getType());
    microbatchSize = type.getRank() ? type.getDimSize(0) : 1;
    auto [low, high] = valueRange(train, argument);
    std::vector<int64_t> sample(type.getShape().begin() + (type.getRank() ? 1 : 0),
                                type.getShape().end());
    runtime.dataFields.push_back(
        {train.getArgAttrOfType<StringAttr>(argument.getArgNumber(), "nn.name").str(),
         dtypeName(type.getElementType()), sample, low, high});
  }
  // Parameters held by several stages (tied weights): the runtime sums their
  // partial gradients over the holders before the step (docs/stages.md).
  std::map<std::string, std::vector<int64_t>> tied;
  module.walk([&](pipe::AllReduceOp reduce) {
    auto stagesAttr = reduce->getAttrOfType<DenseI64ArrayAttr>("stages");
    auto nameAttr = reduce->getAttrOfType<StringAttr>("name");
    if (stagesAttr && nameAttr)
      tied[nameAttr.str()] = std::vector<int64_t>(stagesAttr.asArrayRef().begin(),
                                                  stagesAttr.asArrayRef().end());
  });
  for (const auto &[name, holders] : tied)
    runtime.tied.push_back({name, holders});
  // The values pipec-optimizer was given (passes/Pipeline.h).
  const passes::OptimizerOptions &optimizer = options.optimizer;
  runtime.microbatchSize = microbatchSize;
  runtime.seed = options.seed;
  // The stage libraries run AdamW's or SGD's update; SGD's momentum is a number.
  runtime.optimizer.rule = usesAdam(optimizer.optimizer) ? Optimizer::AdamW : Optimizer::Sgd;
  runtime.optimizer.lr = optimizer.lr;
  runtime.optimizer.weightDecay = optimizer.effectiveWeightDecay();
  runtime.optimizer.momentum = optimizer.effectiveMomentum();
  runtime.target = options.target;
  runtime.precision = cudaTarget(options) ? options.costs.precision : Precision::F32;
  if (cudaTarget(options)) {
    runtime.cudaArch = options.cudaArchs;
    runtime.gpu = options.partition().device;
  }
  outs << "wrote " << directory.string() << ": plan.json, schedule/, " << stages.size()
       << " stage" << (stages.size() == 1 ? "" : "s") << " in stages/"
       << (options.build ? " (built)" : "") << ", weights/\n";
  return runtime;
}

LogicalResult checkTargetOptions(const CompileOptions &options, raw_ostream &errs) {
  if (!cudaTarget(options))
    return success();
  if (options.cudaArchs.empty()) {
    errs << "error: --cuda-arch names no architecture (e.g. sm_80,sm_90)\n";
    return failure();
  }
  static const std::regex archPattern("sm_[0-9]{2,3}");
  for (const auto &arch : options.cudaArchs)
    if (!std::regex_match(arch, archPattern)) {
      errs << "error: --cuda-arch: '" << arch << "' is not an architecture like sm_80 or sm_90\n";
      return failure();
    }
  if (!options.build)
    return success();
#ifdef PIPEC_CUDA_KERNELS_LIBRARY
  // The stages link the prebuilt kernel library: it must hold code for every
  // architecture asked for.
  std::vector<std::string> built;
  std::stringstream list(PIPEC_CUDA_KERNEL_ARCHS);
  for (std::string entry; std::getline(list, entry, ',');)
    built.push_back("sm_" + entry.substr(0, entry.find('-')));
  for (const auto &arch : options.cudaArchs)
    if (std::find(built.begin(), built.end(), arch) == built.end()) {
      errs << "error: --cuda-arch " << arch << ": the CUDA kernel library was built for "
           << PIPEC_CUDA_KERNEL_ARCHS << " only; reconfigure pipec with "
           << "-DCMAKE_CUDA_ARCHITECTURES=\"<the list>;" << arch.substr(3)
           << "\" to add it\n";
      return failure();
    }
  return success();
#else
  errs << "error: --target cuda --build: this pipec was built without the CUDA kernel library "
          "(nvcc, cuBLAS or NCCL were not found when it was configured); drop --build to write "
          "the .cu sources only, or rebuild pipec where the CUDA toolkit is installed\n";
  return failure();
#endif
}

} // namespace pipec
