#include "compiler/Driver/StageBuild.h"
#include "analysis/Settings/Declared.h"

#include "llvm/Support/raw_ostream.h"

#include <algorithm>
#include <cstdio>
#include <regex>
#include <sstream>

namespace fs = std::filesystem;

namespace pipec {

namespace {

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
std::string buildCommand(const JobOptions &options, const fs::path &source,
                         const fs::path &library) {
  if (!options.cudaTarget())
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

} // namespace

/// The stages' CMakeLists.txt for building them outside pipec.
std::string stagesCMakePrologue(const JobOptions &options) {
  std::string cmake = ("# Builds the stage libraries outside pipec (pipec " + settings::flag(settings::kBuild) + " does the same).\n") +
                      "cmake_minimum_required(VERSION 3.20)\n";
  if (!options.cudaTarget())
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

std::string stageCMakeTarget(const JobOptions &options, const std::string &stem, const std::string &extension,
                             const std::string &constantsFile) {
  const bool cuda = options.cudaTarget();
  std::string cmake;
  cmake += "add_library(" + stem + " SHARED " + stem + extension + ")\n"
           "set_target_properties(" + stem + " PROPERTIES OUTPUT_NAME " + stem + ")\n";
  cmake += "target_compile_options(" + stem + " PRIVATE " +
           (cuda ? std::string("--expt-relaxed-constexpr") : std::string(kCpuStageOptimizeFlags)) + ")\n";
  // The source embeds its large constants from the file beside it (.incbin).
  cmake += "target_compile_definitions(" + stem +
           " PRIVATE \"PIPEC_STAGE_DIR=\\\"${CMAKE_CURRENT_SOURCE_DIR}\\\"\")\n"
           "set_source_files_properties(" + stem + extension +
           " PROPERTIES OBJECT_DEPENDS \"${CMAKE_CURRENT_SOURCE_DIR}/" + constantsFile +
           "\")\n";
  cmake += "target_include_directories(" + stem + " PRIVATE ${PIPEC_RUNTIME_INCLUDE_DIR} " +
           (cuda ? "${PIPEC_KERNELS_INCLUDE_DIRS})\n" : "${PIPEC_CPU_KERNELS_INCLUDE_DIR})\n") +
           "target_link_libraries(" + stem + " PRIVATE " +
           (cuda ? "${PIPEC_CUDA_KERNELS_LIBRARY} CUDA::cublasLt CUDA::cublas CUDA::cudart)\n"
                 : "${PIPEC_CPU_KERNELS_LIBRARY} openblas OpenMP::OpenMP_CXX)\n");
  return cmake;
}

mlir::LogicalResult buildStage(const JobOptions &options, const fs::path &directory, const fs::path &source,
                               const fs::path &library, llvm::raw_ostream &errs) {
  std::string folder = fs::absolute(source).parent_path().string();
  if (folder.find_first_of("\"\\\n") != std::string::npos) {
    errs << ("error: " + settings::flag(settings::kOut) + " ") << directory.string()
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
    return mlir::failure();
  }
  return mlir::success();
}

mlir::LogicalResult checkTargetOptions(const JobOptions &options, llvm::raw_ostream &errs) {
  if (!options.cudaTarget())
    return mlir::success();
  if (!options.build)
    return mlir::success();
#ifdef PIPEC_CUDA_KERNELS_LIBRARY
  // The stages link the prebuilt kernel library: it must hold code for every
  // architecture asked for.
  std::vector<std::string> built;
  std::stringstream list(PIPEC_CUDA_KERNEL_ARCHS);
  for (std::string entry; std::getline(list, entry, ',');)
    built.push_back("sm_" + entry.substr(0, entry.find('-')));
  for (const auto &arch : options.cudaArchs)
    if (std::find(built.begin(), built.end(), arch) == built.end()) {
      errs << ("error: " + settings::flag(settings::kCudaArch) + " ") << arch << ": the CUDA kernel library was built for "
           << PIPEC_CUDA_KERNEL_ARCHS << " only; reconfigure pipec with "
           << "-DCMAKE_CUDA_ARCHITECTURES=\"<the list>;" << arch.substr(3)
           << "\" to add it\n";
      return mlir::failure();
    }
  return mlir::success();
#else
  errs << ("error: " + settings::flag(settings::kTarget) + " cuda " + settings::flag(settings::kBuild) + ": this pipec was built without the CUDA kernel library ")
          ("(nvcc, cuBLAS or NCCL were not found when it was configured); drop " + settings::flag(settings::kBuild) + " to write ") +
          "the .cu sources only, or rebuild pipec where the CUDA toolkit is installed\n";
  return mlir::failure();
#endif
}

} // namespace pipec
