// How a job's stage sources become libraries (docs/codegen.md,
// docs/cuda-codegen.md): the host compiler's command `pipec --build` runs,
// and the stages' CMakeLists.txt for building them elsewhere, on the CPU and
// CUDA targets.
#ifndef PIPEC_COMPILER_DRIVER_STAGEBUILD_H
#define PIPEC_COMPILER_DRIVER_STAGEBUILD_H

#include "compiler/Driver/JobOptions.h"

#include "llvm/Support/raw_ostream.h"

#include "mlir/Support/LLVM.h"

#include <filesystem>
#include <string>

namespace pipec {

/// With build on the cuda target, checks that this pipec can build for the
/// architectures asked for (errors name the setting). Runs before anything
/// else.
mlir::LogicalResult checkTargetOptions(const JobOptions &options, llvm::raw_ostream &errs);

/// The start of DIR/stages/CMakeLists.txt: project, languages and where the
/// runtime's headers and kernel libraries are.
std::string stagesCMakePrologue(const JobOptions &options);
/// The CMake target of one stage library `lib<stem>.so` from `<stem><extension>`,
/// which embeds `constantsFile` (docs/optimization.md).
std::string stageCMakeTarget(const JobOptions &options, const std::string &stem, const std::string &extension,
                             const std::string &constantsFile);
/// Compiles `source` into `library` with the host compiler (or nvcc),
/// printing the first lines of its errors.
mlir::LogicalResult buildStage(const JobOptions &options, const std::filesystem::path &directory,
                               const std::filesystem::path &source, const std::filesystem::path &library,
                               llvm::raw_ostream &errs);

} // namespace pipec

#endif // PIPEC_COMPILER_DRIVER_STAGEBUILD_H
