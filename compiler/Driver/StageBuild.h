// How a job's stage sources become libraries (docs/codegen.md,
// docs/cuda-codegen.md): the host compiler's command `pipec --build` runs,
// and the stages' CMakeLists.txt for building them elsewhere, on the CPU and
// CUDA targets.
#ifndef PIPEC_COMPILER_DRIVER_STAGEBUILD_H
#define PIPEC_COMPILER_DRIVER_STAGEBUILD_H

#include "compiler/Driver/Compiler.h"

#include "mlir/Support/LLVM.h"

#include <filesystem>
#include <string>

namespace pipec {

/// Checks --target, --cuda-arch and, with --build, that this pipec can
/// build for them (errors name the flag). Runs before anything else.
mlir::LogicalResult checkTargetOptions(const CompileOptions &options, llvm::raw_ostream &errs);

/// The start of DIR/stages/CMakeLists.txt: project, languages and where the
/// runtime's headers and kernel libraries are.
std::string stagesCMakePrologue(const CompileOptions &options);
/// The CMake target of one stage library `lib<stem>.so` from `<stem><extension>`,
/// which embeds `constantsFile` (docs/optimization.md).
std::string stageCMakeTarget(const CompileOptions &options, const std::string &stem, const std::string &extension,
                             const std::string &constantsFile);
/// Compiles `source` into `library` with the host compiler (or nvcc),
/// printing the first lines of its errors.
mlir::LogicalResult buildStage(const CompileOptions &options, const std::filesystem::path &directory,
                               const std::filesystem::path &source, const std::filesystem::path &library,
                               llvm::raw_ostream &errs);

} // namespace pipec

#endif // PIPEC_COMPILER_DRIVER_STAGEBUILD_H
